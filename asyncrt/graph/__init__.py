"""TVM graph-executor graphs: load, validate, save, build, convert.

:func:`load_graph` reads TVM's graph JSON (NNVM and Relay eras) into an
immutable, validated :class:`Graph`; :meth:`Graph.to_json` and
:func:`save_graph` write it back; :class:`GraphBuilder` makes one in
Python; :func:`to_dag` turns one into the scheduler's DAG. A
:class:`SymbolicGraph` (from ``from_onnx`` of a model with symbolic input
shapes) gives a static graph per input-shape signature.
"""

from ._builder import GraphBuilder as GraphBuilder
from ._builder import TensorHandle as TensorHandle
from ._dag import to_dag as to_dag
from ._json import GraphSource as GraphSource
from ._json import load_graph as load_graph
from ._json import save_graph as save_graph
from ._model import DEVICE_ATTR as DEVICE_ATTR
from ._model import Graph as Graph
from ._model import Node as Node
from ._model import NodeEntry as NodeEntry
from ._symbolic import Specialized as Specialized
from ._symbolic import Specializer as Specializer
from ._symbolic import SymbolicGraph as SymbolicGraph
from ._symbolic import SymbolicInput as SymbolicInput
from ._symbolic import register_symbolic_format as register_symbolic_format

__all__ = (
    "DEVICE_ATTR",
    "Graph",
    "GraphBuilder",
    "GraphSource",
    "Node",
    "NodeEntry",
    "Specialized",
    "Specializer",
    "SymbolicGraph",
    "SymbolicInput",
    "TensorHandle",
    "load_graph",
    "register_symbolic_format",
    "save_graph",
    "to_dag",
)
