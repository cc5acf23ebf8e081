"""Import-time rewrites of an ONNX graph, as ONNX Runtime's basic graph
optimisations do before it runs a model.

Each rewrite replaces a pattern whose parameters are all initializers by a
cheaper equivalent, and only where nothing else reads the intermediate
tensor (no other node, no graph output):

* **Conv -> BatchNormalization** becomes one Conv whose weights and bias
  carry the normalisation: with ``a = scale / sqrt(var + epsilon)``,
  ``W' = W * a`` per output channel and ``B' = (B - mean) * a + bias``,
  computed in double precision and rounded once to the weights' dtype
  (float32 or float64; other dtypes are left alone).
* **Conv -> Relu** becomes one Conv that applies the ReLU to its output in
  place (:attr:`Rewritten.relu`: the importer gives those convolutions the
  kernel's ``activation`` attribute).

A graph with subgraphs (``If``, ``Loop``, ``Scan``) is left as it is: names
read inside a subgraph are not followed. The caller's model is never
modified; a rewritten copy is returned.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

__all__ = ("Rewritten", "rewrite")

_FOLDABLE = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass
class Rewritten:
    """A model after the rewrites.

    :ivar model: the model (the caller's own if nothing was rewritten).
    :ivar relu: the output names of the Conv nodes that apply a ReLU.
    :ivar folded: how many BatchNormalization nodes were folded.
    """

    model: onnx.ModelProto
    relu: set[str] = field(default_factory=set)
    folded: int = 0


def rewrite(model: onnx.ModelProto) -> Rewritten:
    """``model`` with BatchNormalization folded into, and Relu fused with,
    the Conv before it, where that is exact up to rounding (see the module
    docstring)."""
    graph = model.graph
    if any(
        attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for node in graph.node
        for attr in node.attribute
    ):
        return Rewritten(model)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    state = _State(copy.graph)
    folded = state.fold_batch_norms()
    relu = state.fuse_relus()
    if not folded and not relu:
        return Rewritten(model)
    state.commit()
    return Rewritten(copy, relu, folded)


class _State:
    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.nodes: list[onnx.NodeProto | None] = list(graph.node)
        self.inits = {init.name: init for init in graph.initializer}
        self.arrays: dict[str, np.ndarray[Any, Any]] = {}
        self.readers = Counter(
            name for node in graph.node for name in node.input if name
        )
        self.outputs = {out.name for out in graph.output}
        self.names = {
            *self.inits,
            *(i.name for i in graph.input),
            *(o for node in graph.node for o in node.output),
        }
        self.producer = {
            out: index
            for index, node in enumerate(graph.node)
            for out in node.output
            if out
        }

    def const(self, name: str) -> np.ndarray[Any, Any] | None:
        if name not in self.inits:
            return None
        if name not in self.arrays:
            self.arrays[name] = numpy_helper.to_array(self.inits[name])
        return self.arrays[name]

    def conv_before(self, node: onnx.NodeProto) -> onnx.NodeProto | None:
        """The default-domain Conv whose only reader is ``node``."""
        if not node.input or not node.input[0]:
            return None
        tensor = node.input[0]
        index = self.producer.get(tensor)
        if index is None or self.readers[tensor] != 1 or tensor in self.outputs:
            return None
        conv = self.nodes[index]
        if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx"):
            return None
        return conv

    def fresh(self, base: str) -> str:
        name, n = base, 0
        while name in self.names:
            n += 1
            name = f"{base}_{n}"
        self.names.add(name)
        return name

    def fold_batch_norms(self) -> int:
        count = 0
        for index, bn in enumerate(self.nodes):
            if (
                bn is None
                or bn.op_type != "BatchNormalization"
                or bn.domain not in ("", "ai.onnx")
                or len([o for o in bn.output if o]) != 1
                or not bn.output[0]
                or len(bn.input) != 5
            ):
                continue
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in bn.attribute}
            if attrs.get("training_mode", 0) != 0 or attrs.get("spatial", 1) != 1:
                continue
            conv = self.conv_before(bn)
            if conv is None:
                continue
            weight = self.const(conv.input[1])
            bias = self.const(conv.input[2]) if len(conv.input) > 2 else None
            stats = [self.const(name) for name in bn.input[1:]]
            if weight is None or weight.dtype not in _FOLDABLE:
                continue
            if (len(conv.input) > 2 and conv.input[2] and bias is None) or any(
                s is None or s.shape != (weight.shape[0],) for s in stats
            ):
                continue
            scale, shift, mean, var = (
                np.asarray(s, np.float64) for s in stats if s is not None
            )
            factor = scale / np.sqrt(var + float(attrs.get("epsilon", 1e-5)))
            old_bias = (
                np.zeros(weight.shape[0]) if bias is None else bias.astype(np.float64)
            )
            new_weight = weight.astype(np.float64) * factor.reshape(
                -1, *(1,) * (weight.ndim - 1)
            )
            new_bias = (old_bias - mean) * factor + shift
            base = conv.name or conv.output[0]
            inputs = [
                conv.input[0],
                self.add_init(f"{base}_folded_w", new_weight.astype(weight.dtype)),
                self.add_init(f"{base}_folded_b", new_bias.astype(weight.dtype)),
            ]
            del conv.input[:]
            conv.input.extend(inputs)
            conv.output[0] = bn.output[0]
            self.producer[bn.output[0]] = self.producer[bn.input[0]]
            self.nodes[index] = None
            count += 1
        return count

    def fuse_relus(self) -> set[str]:
        fused: set[str] = set()
        for index, relu in enumerate(self.nodes):
            if (
                relu is None
                or relu.op_type != "Relu"
                or relu.domain not in ("", "ai.onnx")
                or len(relu.output) != 1
            ):
                continue
            conv = self.conv_before(relu)
            if conv is None or conv.output[0] in fused:
                continue
            self.producer[relu.output[0]] = self.producer[relu.input[0]]
            conv.output[0] = relu.output[0]
            fused.add(relu.output[0])
            self.nodes[index] = None
        return fused

    def add_init(self, base: str, array: np.ndarray[Any, Any]) -> str:
        name = self.fresh(base)
        init = numpy_helper.from_array(array, name)
        self.graph.initializer.append(init)
        self.inits[name] = init
        return name

    def commit(self) -> None:
        """Write the kept nodes back (the folded initializers stay, unread:
        the importer makes parameters only of what kernels read)."""
        kept = [node for node in self.nodes if node is not None]
        copies = [onnx.NodeProto() for _ in kept]
        for target, node in zip(copies, kept, strict=True):
            target.CopyFrom(node)
        del self.graph.node[:]
        self.graph.node.extend(copies)
