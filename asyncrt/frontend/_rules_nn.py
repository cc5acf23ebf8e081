"""Rules for convolution, pooling, normalisation and matrix products."""

from __future__ import annotations

from typing import Any

from scheduler.dag import TensorSpec

from ._rules import Call, Lowering, NodeContext, rule

__all__ = ()

_WINDOW_ATTRS = ("auto_pad", "dilations", "kernel_shape", "pads", "strides")


def _window(ctx: NodeContext, kernel: list[int] | None = None) -> dict[str, Any]:
    """The geometry attributes of a convolution or pooling node."""
    ctx.refuse("auto_pad", ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"))
    shape = kernel if kernel is not None else ctx.attr("kernel_shape")
    if shape is None:
        raise ctx.unsupported("kernel_shape is required", attribute="kernel_shape")
    rank = len(shape)
    return {
        "kernel_shape": list(shape),
        "strides": list(ctx.attr("strides", [1] * rank)),
        "dilations": list(ctx.attr("dilations", [1] * rank)),
        "pads": list(ctx.attr("pads")) if ctx.attr("pads") is not None else None,
        "auto_pad": ctx.attr("auto_pad", "NOTSET"),
    }


@rule("Conv", attrs=(*_WINDOW_ATTRS, "group"))
def _conv(ctx: NodeContext) -> Lowering:
    weight = ctx.spec(1).shape
    kernel = ctx.attr("kernel_shape", list(weight[2:]))
    attrs = _window(ctx, list(kernel))
    attrs["group"] = int(ctx.attr("group", 1))
    attrs["bias"] = ctx.has(2)
    return Call("conv", (0, 1, 2) if ctx.has(2) else (0, 1), attrs)


def _ceil_mode_outputs(ctx: NodeContext, attrs: dict[str, Any]) -> None:
    """With ``ceil_mode``, drop a last window that would start in the right
    padding, as the specification (and ONNX Runtime) do: onnx 1.23's shape
    inference keeps it, and a pool over nothing but padding gives -inf or
    NaN. The kernels follow the output's shape, so the shape is the fix."""
    if not ctx.attr("ceil_mode", 0) or attrs["auto_pad"] != "NOTSET":
        return
    spatial = ctx.spec(0).shape[2:]
    rank = len(spatial)
    pads = attrs["pads"] or [0] * (2 * rank)
    sizes = []
    for axis, size in enumerate(spatial):
        stride = attrs["strides"][axis]
        extent = (attrs["kernel_shape"][axis] - 1) * attrs["dilations"][axis] + 1
        span = size + pads[axis] + pads[rank + axis]
        if span < extent:
            return  # no window fits: inference's verdict stands
        count = -(-(span - extent) // stride) + 1
        if (count - 1) * stride >= size + pads[axis]:
            count -= 1
        sizes.append(count)
    specs = ctx.outputs
    ctx.correct_outputs(
        [TensorSpec((*spec.shape[:2], *sizes), spec.dtype) for spec in specs]
    )


@rule("MaxPool", attrs=(*_WINDOW_ATTRS, "ceil_mode", "storage_order"))
def _max_pool(ctx: NodeContext) -> Lowering:
    attrs = _window(ctx)
    attrs["indices"] = ctx.num_outputs == 2
    attrs["storage_order"] = int(ctx.attr("storage_order", 0))
    _ceil_mode_outputs(ctx, attrs)
    return Call("max_pool", (0,), attrs)  # ceil_mode is in the output's shape


@rule("AveragePool", attrs=(*_WINDOW_ATTRS, "ceil_mode", "count_include_pad"))
def _avg_pool(ctx: NodeContext) -> Lowering:
    attrs = _window(ctx)
    attrs["count_include_pad"] = bool(ctx.attr("count_include_pad", 0))
    _ceil_mode_outputs(ctx, attrs)
    return Call("avg_pool", (0,), attrs)


@rule("GlobalAveragePool")
def _global_avg_pool(ctx: NodeContext) -> Lowering:
    return Call("global_avg_pool", (0,), {})


@rule("GlobalMaxPool")
def _global_max_pool(ctx: NodeContext) -> Lowering:
    return Call("global_max_pool", (0,), {})


@rule(
    "BatchNormalization",
    attrs=("epsilon", "momentum", "training_mode", "spatial", "is_test"),
)
def _batch_norm(ctx: NodeContext) -> Lowering:
    ctx.refuse("training_mode", (0,))
    ctx.refuse("spatial", (1,))
    if ctx.num_outputs != 1:
        raise ctx.unsupported("training outputs (running mean and variance)")
    attrs = {"epsilon": float(ctx.attr("epsilon", 1e-5))}
    return Call("batch_norm", (0, 1, 2, 3, 4), attrs)


@rule("InstanceNormalization", attrs=("epsilon",))
def _instance_norm(ctx: NodeContext) -> Lowering:
    attrs = {"epsilon": float(ctx.attr("epsilon", 1e-5))}
    return Call("instance_norm", (0, 1, 2), attrs)


@rule("LayerNormalization", attrs=("axis", "epsilon", "stash_type"))
def _layer_norm(ctx: NodeContext) -> Lowering:
    stats = ctx.outputs[1:]
    attrs = {
        "axis": int(ctx.attr("axis", -1)),
        "epsilon": float(ctx.attr("epsilon", 1e-5)),
        "bias": ctx.has(2),
        "stats": len(stats),
        # Mean and InvStdDev are computed in the stash type (float32 by
        # default); without them, in the input's own type.
        "stash_dtype": "float32" if ctx.attr("stash_type", 1) == 1 else None,
    }
    return Call("layer_norm", (0, 1, 2) if ctx.has(2) else (0, 1), attrs)


@rule("LRN", attrs=("alpha", "beta", "bias", "size"))
def _lrn(ctx: NodeContext) -> Lowering:
    attrs = {
        "alpha": float(ctx.attr("alpha", 1e-4)),
        "beta": float(ctx.attr("beta", 0.75)),
        "bias": float(ctx.attr("bias", 1.0)),
        "size": int(ctx.attr("size")),
    }
    return Call("lrn", (0,), attrs)


@rule("MatMul")
def _matmul(ctx: NodeContext) -> Lowering:
    return Call("matmul", (0, 1))


@rule("Gemm", attrs=("alpha", "beta", "transA", "transB"))
def _gemm(ctx: NodeContext) -> Lowering:
    attrs = {
        "alpha": float(ctx.attr("alpha", 1.0)),
        "beta": float(ctx.attr("beta", 1.0)),
        "trans_a": bool(ctx.attr("transA", 0)),
        "trans_b": bool(ctx.attr("transB", 0)),
        "bias": ctx.has(2),
    }
    return Call("gemm", (0, 1, 2) if ctx.has(2) else (0, 1), attrs)


@rule("Einsum", attrs=("equation",))
def _einsum(ctx: NodeContext) -> Lowering:
    equation = str(ctx.attr("equation")).replace(" ", "")
    return Call("einsum", tuple(range(len(ctx.inputs))), {"equation": equation})


@rule(
    "ConvTranspose", attrs=(*_WINDOW_ATTRS, "group", "output_padding", "output_shape")
)
def _conv_transpose(ctx: NodeContext) -> Lowering:
    ctx.refuse("auto_pad", ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"))
    spatial = ctx.spec(0).shape[2:]
    rank = len(spatial)
    kernel = list(ctx.attr("kernel_shape", ctx.spec(1).shape[2:]))
    if tuple(kernel) != ctx.spec(1).shape[2:]:
        raise ctx.unsupported(
            f"kernel_shape {kernel} differs from the weights' {ctx.spec(1).shape[2:]}",
            attribute="kernel_shape",
        )
    strides = list(ctx.attr("strides", [1] * rank))
    dilations = list(ctx.attr("dilations", [1] * rank))
    padding = list(ctx.attr("output_padding", [0] * rank))
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    out = ctx.outputs[0].shape[2:]
    if not len(kernel) == len(strides) == len(dilations) == len(padding) == rank:
        raise ctx.unsupported(
            "kernel_shape, strides, dilations and output_padding "
            f"need one value per spatial axis ({rank})"
        )
    if ctx.attr("output_shape") is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        # The pads that make the output this size, the larger half after
        # with SAME_UPPER and before otherwise (ONNX's ConvTranspose).
        total = [
            s * (i - 1) + p + (k - 1) * d + 1 - o
            for s, i, p, k, d, o in zip(
                strides, spatial, padding, kernel, dilations, out, strict=True
            )
        ]
        upper = auto_pad == "SAME_UPPER"
        begin = [t // 2 if upper else t - t // 2 for t in total]
    elif auto_pad == "VALID" or ctx.attr("pads") is None:
        begin = [0] * rank
    else:
        begin = list(ctx.attr("pads"))[:rank]
    attrs = {
        "kernel_shape": kernel,
        "strides": strides,
        "dilations": dilations,
        "pads_begin": begin,
        "group": int(ctx.attr("group", 1)),
        "bias": ctx.has(2),
    }
    return Call("conv_transpose", (0, 1, 2) if ctx.has(2) else (0, 1), attrs)
