"""The kernel library: every op asyncrt runs, one record per op.

Layout:

* :mod:`~asyncrt.ops._library`: the table. One :class:`OpDef` per op: its
  kernel factory, its work estimate (``flops``) and its fusion template;
  :func:`lookup` (configured ops), :func:`lookup_builtin`, and the
  registration of the kernels a graph configures
  (:func:`register_graph_kernels`).
* :mod:`~asyncrt.ops._kernels`: kernels by name (``register_func``,
  ``get_global_func``, ``Module``: TVM's API), per array namespace or per
  device kind, and the executor's lookup.
* The ops, by family: :mod:`~asyncrt.ops._builtin` (ops without attributes:
  elementwise math, comparisons, logic, ``matmul``, ``dense``, ``softmax``,
  ``sum``, ``cast``, ``where``, ...), ``nn`` (``conv``, pools, norms,
  ``lrn``), ``reduce`` (``reduce``, ``arg_reduce``, ``softmax``,
  ``hardmax``, ``cumsum``, ``topk``), ``tensor`` (``transpose``,
  ``concat``, ``split``, ``slice``, ``gather``, ``pad``, ``einsum``, ...),
  ``activation`` (``leaky_relu``, ``elu``, ``gelu``, ``clip``, ...),
  ``linalg`` (``gemm``), ``indexing`` (``gather_nd``, ``scatter_nd``,
  ``scatter_elements``, ``nonzero``), ``resize``, ``conv_transpose`` and
  ``cast`` (the narrow formats' ``saturate_cast`` and ``cast_e8m0``); their
  shared helpers in ``_common``, ``_im2col``, ``_banded`` and ``_windows``.
* :mod:`~asyncrt.ops._fusion`: fused elementwise kernels, built from the
  ops' fusion templates; :mod:`~asyncrt.ops._work`: each node's work.

Kernels are written once against the array namespace ``xp`` they are given
(numpy or cupy, which share the numpy API) and follow TVM's
destination-passing convention: ``kernel(*inputs, *outputs)`` writes each
output in place (``out=`` wherever the array library allows) and returns
nothing. A device finds its kernels through its API's
``array_namespace``, so a new device kind whose arrays are numpy arrays
runs every op here with no change to this package.

Adding an op is one decorated factory in the module of its family (or a
new module imported below):

* without attributes, a factory of ``xp``; its kernel is named after the op::

      @builtin("softsign", fusion=FusionTemplate("softsign"))
      def _softsign(xp: ModuleType) -> Kernel:
          def softsign(a: Array, out: Array) -> None:
              xp.absolute(a, out)
              xp.add(out, 1, out)
              xp.divide(a, out, out)

          return softsign

* configured by attributes, a factory of ``xp`` and the attributes (JSON
  values, read with the checked helpers of ``_common``); a graph node names
  the op and its attributes as data, and its kernel is ``<op>.<digest>``::

      @define("leaky_relu")
      def _leaky_relu(xp: ModuleType, attrs: Attrs) -> Kernel:
          alpha = number(attrs, "alpha")

          def leaky_relu(a: Array, out: Array) -> None:
              ...

          return leaky_relu

``flops=`` gives the work from the tensors' specs where it is not one
operation per output element; ``fusion=`` (elementwise ops only) lets the
op join fused kernels. A kernel whose per-array work (views, scratch) is
worth doing once returns :class:`~asyncrt.Bindable`. The ONNX frontend maps
ONNX ops to these names (:mod:`asyncrt.frontend`).
"""

from . import _builtin as _builtin
from . import activation as activation
from . import cast as cast
from . import conv_transpose as conv_transpose
from . import epilogue as epilogue
from . import indexing as indexing
from . import linalg as linalg
from . import nn as nn
from . import reduce as reduce
from . import resize as resize
from . import tensor as tensor
from ._library import OP_ATTRS_ATTR as OP_ATTRS_ATTR
from ._library import OP_NAME_ATTR as OP_NAME_ATTR
from ._library import FusionTemplate as FusionTemplate
from ._library import OpDef as OpDef
from ._library import builtin as builtin
from ._library import builtin_names as builtin_names
from ._library import define as define
from ._library import encode_attrs as encode_attrs
from ._library import fusion_template as fusion_template
from ._library import kernel_name as kernel_name
from ._library import lookup as lookup
from ._library import lookup_builtin as lookup_builtin
from ._library import op_names as op_names
from ._library import register_graph_kernels as register_graph_kernels
from ._library import register_op_kernel as register_op_kernel

__all__ = (
    "OP_ATTRS_ATTR",
    "OP_NAME_ATTR",
    "FusionTemplate",
    "OpDef",
    "builtin",
    "builtin_names",
    "define",
    "encode_attrs",
    "fusion_template",
    "kernel_name",
    "lookup",
    "lookup_builtin",
    "op_names",
    "register_graph_kernels",
    "register_op_kernel",
)
