"""Which graph inputs a model needs known at import time.

Some operator inputs decide shapes (``Reshape``'s target, ``Slice``'s
starts, ``Range``'s bounds); asyncrt plans static shapes, so those inputs
must be constants when the model is imported. A model usually computes them
from initializers and ``Shape`` nodes; when one depends on a graph input, the
caller binds that input (``from_onnx(..., bind=...)``).
"""

from __future__ import annotations

import onnx

from ._rules import RULES

__all__ = ("static_inputs",)

#: Operators whose outputs depend on their input's shape, not its values.
_SHAPE_ONLY = frozenset({"Shape", "Size"})


def static_inputs(model: onnx.ModelProto) -> tuple[str, ...]:
    """The graph inputs whose values decide a shape, in input order.

    :param model: the model.
    :return: names to pass to ``from_onnx(..., bind=...)``.
    """
    producer = {out: node for node in model.graph.node for out in node.output if out}
    needed: set[str] = set()
    for node in model.graph.node:
        found = RULES.get(node.op_type)
        for position in found.static if found is not None else ():
            if position < len(node.input) and node.input[position]:
                needed.add(node.input[position])
    # Walk back from the needed values to what they are computed from.
    pending = list(needed)
    while pending:
        node = producer.get(pending.pop())
        if node is None or node.op_type in _SHAPE_ONLY:
            continue
        for name in node.input:
            if name and name not in needed:
                needed.add(name)
                pending.append(name)
    initializers = {init.name for init in model.graph.initializer}
    return tuple(
        i.name
        for i in model.graph.input
        if i.name in needed and i.name not in initializers
    )
