"""Rules for asyncrt's own fused ops, which only the import rewrites make
(:mod:`._epilogue`; domain :data:`._names.PRIVATE_DOMAIN`):

* ``MatMulBias(X, W, B)``, attribute ``activation`` (``"none"``,
  ``"gelu"``, ``"gelu_tanh"`` or ``"relu"``): ``act(X @ W + B)`` with ``W`` 2-D and
  ``B`` its row of biases,
  the kernel library's ``matmul_bias``; with several outputs, attributes
  ``axis`` and ``splits``: the product's parts along ``axis``.
* ``AddLayerNormalization(X, R, Scale[, Bias])``, attributes ``axis`` and
  ``epsilon``: ``LayerNormalization(X + R)`` (and ``X + R`` as a second
  output, where the node names one), the library's ``add_layer_norm``.
* ``ScaleAddSoftmax(X, C[, M])``, attribute ``divide`` (1: ``X / C``, 0:
  ``X * C``): ``Softmax(X / C + M)`` (or ``Softmax(X / C)``) over the last
  axis, the library's ``scale_add_softmax``.
* ``ScaleWhereSoftmax(X, C, K, F)``, attributes ``divide`` and ``keep``:
  ``Softmax(Where(K, X / C, F))`` (``Where(K, F, X / C)`` with ``keep``
  0) over the last axis, the library's ``scale_where_softmax``.
* ``SqueezeExcite(X, W1, B1, W2, B2)``, attributes ``gate``
  (``"hard_sigmoid"`` or ``"sigmoid"``), ``alpha`` and ``beta``: ``X``
  times ``gate(W2 relu(W1 mean(X) + B1) + B2)`` per channel, ``W1`` and
  ``W2`` 1 x 1 convolutions' weights, the library's ``squeeze_excite``.
* ``SqueezeGates(X, W1, B1, W2, B2)``, attributes as ``SqueezeExcite``'s:
  its gates alone, ``(N, C)``, the library's ``squeeze_gates``;
  ``GatedPointwise(X, G, W, B[, R])``, attribute ``activation``: ``act(W
  (X * G) + B [+ R])``, ``W`` a 1 x 1 convolution's weights, ``G`` ``(N,
  C)`` gates, ``R`` a residual (broadcast as ``Add``); and
  ``PointwiseResidual(X, W, B, R)``: ``act(W X + B + R)``; the library's
  ``fused_pointwise``.
* ``PointwiseDepthwise(X, W1, B1, W2, B2)``, attributes ``kernel_shape``,
  ``strides``, ``pads``, ``dilations`` (the depthwise step's, 2-D),
  ``pointwise_activation`` and ``activation``: ``act(depthwise(pact(W1 X +
  B1)))``, ``W1`` a 1 x 1 convolution's weights and ``W2`` (C, 1, KH, KW)
  a convolution of one group a channel, the library's
  ``pointwise_depthwise``.
"""

from __future__ import annotations

import numpy as np

from scheduler.dag import TensorSpec

from ._infer import InferenceFailed
from ._rules import Call, Lowering, NodeContext, private_rule

__all__ = ()


@private_rule("MatMulBias", "MatMul", attrs=("activation", "axis", "splits"))
def _matmul_bias(ctx: NodeContext) -> Lowering:
    x, w = ctx.spec(0), ctx.spec(1)
    if len(w.shape) != 2 or not x.shape or x.shape[-1] != w.shape[0]:
        reason = f"cannot multiply {list(x.shape)} by {list(w.shape)} (2-D weights)"
        raise ctx.unsupported(reason) from InferenceFailed(reason)
    shape = (*x.shape[:-1], w.shape[1])
    activation = str(ctx.attr("activation", "none"))
    ctx.refuse("activation", ("none", "gelu", "gelu_tanh", "relu"))
    attrs: dict[str, object] = {"activation": activation}
    splits = [int(v) for v in ctx.attr("splits", [])]
    if ctx.num_outputs > 1 or splits:
        axis = int(ctx.attr("axis", -1))
        axis = axis + len(shape) if axis < 0 else axis
        if not 0 <= axis < len(shape) or len(splits) != ctx.num_outputs:
            reason = f"splits {splits} on axis {axis} for {ctx.num_outputs} outputs"
            raise ctx.unsupported(reason) from InferenceFailed(reason)
        if sum(splits) != shape[axis] or min(splits) < 1:
            reason = f"splits {splits} do not cut axis {axis} of {list(shape)}"
            raise ctx.unsupported(reason) from InferenceFailed(reason)
        ctx.correct_outputs(
            [
                TensorSpec((*shape[:axis], part, *shape[axis + 1 :]), x.dtype)
                for part in splits
            ]
        )
        attrs.update(axis=axis, splits=splits)
    else:
        ctx.correct_outputs([TensorSpec(shape, x.dtype)])
    return Call("matmul_bias", (0, 1, 2), attrs)


@private_rule("AddLayerNormalization", "LayerNormalization", attrs=("axis", "epsilon"))
def _add_layer_norm(ctx: NodeContext) -> Lowering:
    x, r = ctx.spec(0), ctx.spec(1)
    try:
        shape = tuple(int(d) for d in np.broadcast_shapes(x.shape, r.shape))
    except ValueError:
        # as ONNX's inference failing for the Add: a misfit of the inputs
        reason = f"cannot add {list(x.shape)} and {list(r.shape)}"
        raise ctx.unsupported(reason) from InferenceFailed(reason)
    ctx.correct_outputs([TensorSpec(shape, x.dtype)] * ctx.num_outputs)
    attrs = {
        "axis": int(ctx.attr("axis", -1)),
        "epsilon": float(ctx.attr("epsilon", 1e-5)),
        "bias": ctx.has(3),
        "sum": ctx.num_outputs == 2,
    }
    return Call("add_layer_norm", (0, 1, 2, 3) if ctx.has(3) else (0, 1, 2), attrs)


@private_rule("ScaleAddSoftmax", "Softmax", attrs=("divide",))
def _scale_add_softmax(ctx: NodeContext) -> Lowering:
    positions = (0, 1, 2) if ctx.has(2) else (0, 1)
    specs = [ctx.spec(i) for i in positions]
    try:
        shape = tuple(int(d) for d in np.broadcast_shapes(*(s.shape for s in specs)))
    except ValueError:
        shape = None
    # X may be the smaller operand (a one-layer BERT's mask is the scaled
    # one): the kernel's first ufunc broadcasts it into the output
    if shape is None or not shape:
        reason = "cannot scale {} by {}{}".format(
            list(specs[0].shape),
            list(specs[1].shape),
            f" and add {list(specs[2].shape)}" if len(specs) > 2 else "",
        )
        raise ctx.unsupported(reason) from InferenceFailed(reason)
    ctx.correct_outputs([TensorSpec(shape, specs[0].dtype)])
    attrs = {"divide": bool(ctx.attr("divide", 1)), "axes": [len(shape) - 1]}
    return Call("scale_add_softmax", positions, attrs)


@private_rule("ScaleWhereSoftmax", "Softmax", attrs=("divide", "keep"))
def _scale_where_softmax(ctx: NodeContext) -> Lowering:
    specs = [ctx.spec(i) for i in range(4)]
    try:
        shape = tuple(int(d) for d in np.broadcast_shapes(*(s.shape for s in specs)))
    except ValueError:
        shape = None
    if shape is None or not shape or specs[2].dtype != "bool":
        reason = "cannot mask {} scaled by {} where {} ({}) with {}".format(
            *(list(s.shape) for s in specs[:3]), specs[2].dtype, list(specs[3].shape)
        )
        raise ctx.unsupported(reason) from InferenceFailed(reason)
    ctx.correct_outputs([TensorSpec(shape, specs[0].dtype)])
    attrs = {
        "divide": bool(ctx.attr("divide", 1)),
        "keep": bool(ctx.attr("keep", 1)),
        "axes": [len(shape) - 1],
    }
    return Call("scale_where_softmax", (0, 1, 2, 3), attrs)


def _matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """numpy's ``matmul`` result shape, or ``None`` where they do not fit."""
    if not a or not b:
        return None
    left = (1, *a) if len(a) == 1 else a
    right = (*b, 1) if len(b) == 1 else b
    if left[-1] != right[-2]:
        return None
    try:
        stack = tuple(int(d) for d in np.broadcast_shapes(left[:-2], right[:-2]))
    except ValueError:
        return None
    shape = (*stack, left[-2], right[-1])
    if len(b) == 1:
        shape = shape[:-1]
    if len(a) == 1:
        shape = (*shape[:-2], shape[-1]) if len(b) > 1 else shape[:-1]
    return shape


@private_rule("TransposedMatMul", "MatMul", attrs=("perm_a", "perm_b", "perm_out"))
def _transposed_matmul(ctx: NodeContext) -> Lowering:
    shapes = []
    perms: dict[str, list[int] | None] = {}
    for position, key in ((0, "perm_a"), (1, "perm_b")):
        shape = ctx.spec(position).shape
        perm = ctx.attr(key)
        if perm is not None:
            perm = [int(v) for v in perm]
            if sorted(perm) != list(range(len(shape))):
                raise ctx.unsupported(f"{key} {perm} does not permute {list(shape)}")
            shape = tuple(shape[axis] for axis in perm)
        perms[key] = perm
        shapes.append(shape)
    result = _matmul_shape(shapes[0], shapes[1])
    if result is None:
        reason = f"cannot multiply {list(shapes[0])} by {list(shapes[1])}"
        raise ctx.unsupported(reason) from InferenceFailed(reason)
    out = ctx.attr("perm_out")
    if out is not None:
        out = [int(v) for v in out]
        if sorted(out) != list(range(len(result))):
            raise ctx.unsupported(f"perm_out {out} does not permute {list(result)}")
        result = tuple(result[axis] for axis in out)
    perms["perm_out"] = out
    ctx.correct_outputs([TensorSpec(result, ctx.spec(0).dtype)])
    return Call("matmul_views", (0, 1), perms)


def _excitation(ctx: NodeContext) -> dict[str, object]:
    """A squeeze-excitation's checked shapes and its attributes."""
    x, w1, b1, w2, b2 = (ctx.spec(i) for i in range(5))
    rank = len(x.shape)
    channels = x.shape[1] if rank >= 3 else None
    reduced = w1.shape[0] if w1.shape else None
    ones = (1,) * (rank - 2)
    if (
        channels is None
        or w1.shape != (reduced, channels, *ones)
        or b1.shape != (reduced,)
        or w2.shape != (channels, reduced, *ones)
        or b2.shape != (channels,)
        or len({s.dtype for s in (x, w1, b1, w2, b2)}) != 1
    ):
        reason = "cannot excite {} by 1 x 1 weights {}, {} and biases {}, {}".format(
            *(list(s.shape) for s in (x, w1, w2, b1, b2))
        )
        raise ctx.unsupported(reason) from InferenceFailed(reason)
    ctx.refuse("gate", ("hard_sigmoid", "sigmoid"))
    return {
        "gate": str(ctx.attr("gate", "hard_sigmoid")),
        "alpha": float(ctx.attr("alpha", 0.2)),
        "beta": float(ctx.attr("beta", 0.5)),
    }


@private_rule("SqueezeExcite", "Mul", attrs=("gate", "alpha", "beta"))
def _squeeze_excite(ctx: NodeContext) -> Lowering:
    attrs = _excitation(ctx)
    x = ctx.spec(0)
    ctx.correct_outputs([TensorSpec(x.shape, x.dtype)])
    return Call("squeeze_excite", (0, 1, 2, 3, 4), attrs)


@private_rule("SqueezeGates", "Mul", attrs=("gate", "alpha", "beta"))
def _squeeze_gates(ctx: NodeContext) -> Lowering:
    attrs = _excitation(ctx)
    x = ctx.spec(0)
    ctx.correct_outputs([TensorSpec(tuple(x.shape[:2]), x.dtype)])
    return Call("squeeze_gates", (0, 1, 2, 3, 4), attrs)


def _fused_pointwise(ctx: NodeContext, gated: bool) -> Lowering:
    """``GatedPointwise(X, G, W, B[, R])`` (``gated``) or
    ``PointwiseResidual(X, W, B, R)``: the library's ``fused_pointwise``."""
    positions = list(range(len(ctx.inputs)))
    specs = [ctx.spec(i) for i in positions]
    x, w, b = specs[0], specs[1 + gated], specs[2 + gated]
    g = specs[1] if gated else None
    r = specs[3 + gated] if len(specs) > 3 + gated else None
    rank = len(x.shape)
    ones = (1,) * (rank - 2)
    channels = x.shape[1] if rank >= 3 else None
    outputs = w.shape[0] if w.shape else None
    if (
        channels is None
        or outputs is None
        or (g is not None and g.shape != tuple(x.shape[:2]))
        or w.shape != (outputs, channels, *ones)
        or b.shape != (outputs,)
        or len({s.dtype for s in specs}) != 1
    ):
        reason = "cannot convolve {} by 1 x 1 weights {} and bias {}{}".format(
            list(x.shape),
            list(w.shape),
            list(b.shape),
            "" if g is None else f" gated by {list(g.shape)}",
        )
        raise ctx.unsupported(reason) from InferenceFailed(reason)
    shape = (x.shape[0], outputs, *x.shape[2:])
    if r is not None:
        try:
            shape = tuple(int(d) for d in np.broadcast_shapes(shape, r.shape))
        except ValueError:
            reason = f"cannot add {list(r.shape)} to a product of {list(shape)}"
            raise ctx.unsupported(reason) from InferenceFailed(reason)
    ctx.refuse("activation", _CONV_ACTIVATIONS)
    ctx.correct_outputs([TensorSpec(shape, x.dtype)])
    attrs = {
        "gated": gated,
        "residual": r is not None,
        "activation": str(ctx.attr("activation", "none")),
    }
    return Call("fused_pointwise", tuple(positions), attrs)


@private_rule("GatedPointwise", "Conv", attrs=("activation",))
def _gated_pointwise(ctx: NodeContext) -> Lowering:
    return _fused_pointwise(ctx, gated=True)


@private_rule("PointwiseResidual", "Conv", attrs=("activation",))
def _pointwise_residual(ctx: NodeContext) -> Lowering:
    return _fused_pointwise(ctx, gated=False)


_CONV_ACTIVATIONS = ("none", "relu", "hard_swish")


@private_rule(
    "PointwiseDepthwise",
    "Conv",
    attrs=(
        "kernel_shape",
        "strides",
        "pads",
        "dilations",
        "pointwise_activation",
        "activation",
    ),
)
def _pointwise_depthwise(ctx: NodeContext) -> Lowering:
    x, w1, b1, w2, b2 = (ctx.spec(i) for i in range(5))
    channels = w1.shape[0] if w1.shape else None
    kernel = [int(k) for k in ctx.attr("kernel_shape", [])]
    strides = [int(v) for v in ctx.attr("strides", [1, 1])]
    pads = [int(v) for v in ctx.attr("pads", [0, 0, 0, 0])]
    dilations = [int(v) for v in ctx.attr("dilations", [1, 1])]
    geometry_ok = (
        len(kernel) == 2
        and len(strides) == 2
        and len(dilations) == 2
        and len(pads) == 4
        and min(*kernel, *strides, *dilations) >= 1
        and min(pads) >= 0
    )
    if (
        channels is None
        or len(x.shape) != 4
        or not geometry_ok
        or w1.shape != (channels, x.shape[1], 1, 1)
        or b1.shape != (channels,)
        or w2.shape != (channels, 1, *kernel)
        or b2.shape != (channels,)
        or len({s.dtype for s in (x, w1, b1, w2, b2)}) != 1
    ):
        reason = "cannot expand {} by {} ({}) then convolve by {} ({}) over {}".format(
            *(list(s.shape) for s in (x, w1, b1, w2, b2)), kernel
        )
        raise ctx.unsupported(reason) from InferenceFailed(reason)
    sizes = []
    for axis in range(2):
        extent = (kernel[axis] - 1) * dilations[axis] + 1
        span = x.shape[2 + axis] + pads[axis] + pads[2 + axis]
        if span < extent:
            reason = f"a {kernel} window does not fit {list(x.shape)} padded by {pads}"
            raise ctx.unsupported(reason) from InferenceFailed(reason)
        sizes.append((span - extent) // strides[axis] + 1)
    ctx.refuse("pointwise_activation", _CONV_ACTIVATIONS)
    ctx.refuse("activation", _CONV_ACTIVATIONS)
    ctx.correct_outputs([TensorSpec((x.shape[0], channels, *sizes), x.dtype)])
    attrs = {
        "kernel_shape": kernel,
        "strides": strides,
        "pads": pads,
        "dilations": dilations,
        "pointwise_activation": str(ctx.attr("pointwise_activation", "none")),
        "activation": str(ctx.attr("activation", "none")),
    }
    return Call("pointwise_depthwise", (0, 1, 2, 3, 4), attrs)
