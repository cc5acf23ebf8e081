"""Frontends: models from other frameworks as asyncrt graphs.

:func:`from_onnx` imports an ONNX model as TVM's
``relay.frontend.from_onnx`` does, returning a graph and its parameters for
:func:`asyncrt.build`::

    graph, params = asyncrt.frontend.from_onnx("model.onnx", {"x": (1, 3, 224, 224)})
    factory = asyncrt.build(graph, params)
    with factory.create(["cpu:0", "sim:0"]) as ex:
        y = await ex.run(x=data)

A model with symbolic input dimensions (``dim_param``), or with inputs whose
values decide shapes, imports without ``shape_dict`` as a
:class:`~asyncrt.graph.SymbolicGraph`: one import for every input shape,
specialized per shape signature::

    graph, params = asyncrt.frontend.from_onnx("bert.onnx")
    shapes = {name: a.shape for name, a in feed.items()}
    key = graph.signature(shapes, feed)         # cheap: once per request
    spec = graph.specialize(shapes, feed)       # once per new signature
    ex = asyncrt.graph_executor.create(
        spec.graph, None, "cpu", params=spec.with_shared(params)
    )

:data:`SUPPORTED_OPS` lists the ONNX operators it imports; anything else is
an :class:`~asyncrt.errors.UnsupportedOpError` at import time.
"""

from . import _rules_epilogue as _rules_epilogue  # registers the rules
from . import _rules_index as _rules_index
from . import _rules_math as _rules_math
from . import _rules_nn as _rules_nn
from . import _rules_resize as _rules_resize
from . import _rules_tensor as _rules_tensor
from . import _specialize as _specialize  # registers the symbolic "onnx" format
from ._importer import MIN_OPSET as MIN_OPSET
from ._importer import ONNX_OP_ATTR as ONNX_OP_ATTR
from ._importer import from_onnx as from_onnx
from ._rules import RULES as _RULES
from ._static import static_inputs as static_inputs

#: The ONNX operators (default domain) the importer supports, sorted.
SUPPORTED_OPS: tuple[str, ...] = tuple(sorted(_RULES))

__all__ = ("MIN_OPSET", "ONNX_OP_ATTR", "SUPPORTED_OPS", "from_onnx", "static_inputs")
