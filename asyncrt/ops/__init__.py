"""The kernel library: ops configured by attributes, for every device kind.

Each op is written once against the array API (``xp`` is numpy on ``cpu``
and ``sim``, cupy on ``cuda``) and follows TVM's destination-passing
convention, writing into the planned output arrays (``out=``) wherever the
array library allows. Attribute-free elementwise kernels (``add``, ``relu``,
``erf``, ...) are the built-ins of :mod:`asyncrt.ops._builtin`; the ops here take
attributes:

* ``nn``: ``conv`` (grouped and depthwise; im2col + matmul), ``max_pool``,
  ``avg_pool``, ``global_avg_pool``, ``global_max_pool``, ``batch_norm``,
  ``instance_norm``, ``layer_norm``, ``lrn``;
* ``reduce``: ``reduce`` (sum, mean, max, min, prod, l1, l2, log_sum,
  log_sum_exp, sum_square), ``arg_reduce``, ``softmax`` (and log-softmax),
  ``hardmax``, ``cumsum``, ``topk``;
* ``tensor``: ``transpose``, ``concat``, ``split``, ``slice``, ``gather``,
  ``gather_elements``, ``pad``, ``tile``, ``depth_to_space``,
  ``space_to_depth``, ``trilu``, ``broadcast``, ``einsum``;
* ``activation``: ``leaky_relu``, ``elu`` (and Selu), ``celu``,
  ``hard_sigmoid``, ``thresholded_relu``, ``shrink``, ``gelu``, ``clip``,
  ``isinf``;
* ``linalg``: ``gemm``.

A graph node names its op and attributes as data (see
:mod:`asyncrt.ops._registry`); :func:`register_graph_kernels` registers the
kernels a graph needs, so graphs loaded from files run without executing
anything from them.
"""

from . import activation as activation
from . import linalg as linalg
from . import nn as nn
from . import reduce as reduce
from . import tensor as tensor
from ._registry import OP_ATTRS_ATTR as OP_ATTRS_ATTR
from ._registry import OP_NAME_ATTR as OP_NAME_ATTR
from ._registry import OpDef as OpDef
from ._registry import encode_attrs as encode_attrs
from ._registry import kernel_name as kernel_name
from ._registry import lookup as lookup
from ._registry import op_names as op_names
from ._registry import register_graph_kernels as register_graph_kernels
from ._registry import register_op_kernel as register_op_kernel

__all__ = (
    "OP_ATTRS_ATTR",
    "OP_NAME_ATTR",
    "OpDef",
    "encode_attrs",
    "kernel_name",
    "lookup",
    "op_names",
    "register_graph_kernels",
    "register_op_kernel",
)
