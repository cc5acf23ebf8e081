"""Output shapes of the common operators, computed in Python.

ONNX's per-node shape inference (:mod:`._infer`) serialises every node and
its input types to call into C++: about 0.1 ms a node, most of a
specialization's time on a transformer. The operators that make up CNNs
and transformers have simple shape rules; :func:`fast_outputs` computes
theirs directly, and **gives up** (returns ``None``) wherever a case is not
plainly valid (a dtype outside the operator's usual ones, a rank or size
that does not fit, an attribute it does not model): ONNX's inference then
judges the node as always, and names what is wrong. A test checks these
rules against ONNX's on every node test of onnx that they accept.

Used by specializations (:mod:`._specialize`); the static import keeps
ONNX's inference for every node.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from scheduler.dag import TensorSpec

from ._rules import NodeContext
from ._values import Const, tvm_dtype

__all__ = ("fast_outputs",)

Specs = list[TensorSpec] | None
Shape = tuple[int, ...]

_FLOATS = frozenset({"float16", "float32", "float64"})
_INTS = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"})
_NUMERIC = _FLOATS | _INTS | {"uint64"}
_INDICES = frozenset({"int32", "int64"})


def fast_outputs(ctx: NodeContext) -> list[TensorSpec] | None:
    """The output specs of ``ctx``'s node, or ``None`` to let ONNX's
    inference decide."""
    rule = _RULES.get(ctx.op_type)
    if rule is None or ctx.node.domain not in ("", "ai.onnx"):
        return None
    return rule(ctx)


# -- helpers -------------------------------------------------------------------


def _spec(ctx: NodeContext, position: int) -> TensorSpec | None:
    value = ctx.inputs[position] if position < len(ctx.inputs) else None
    return None if value is None else value.spec


def _specs(ctx: NodeContext) -> list[TensorSpec] | None:
    """Every input's spec, or ``None`` if one is omitted."""
    out = []
    for value in ctx.inputs:
        if value is None:
            return None
        out.append(value.spec)
    return out


def _ints(ctx: NodeContext, position: int) -> list[int] | None:
    """A constant input's values, or ``None``."""
    value = ctx.inputs[position] if position < len(ctx.inputs) else None
    if not isinstance(value, Const) or value.array.dtype.kind not in "iu":
        return None
    return [int(v) for v in value.array.reshape(-1)]


def _broadcast(shapes: Sequence[Shape]) -> Shape | None:
    """numpy's broadcast of ``shapes``, or ``None`` if they do not fit."""
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(rank):
        size = 1
        for shape in shapes:
            index = axis - rank + len(shape)
            if index < 0:
                continue
            dim = shape[index]
            if dim == 1:
                continue
            if size != 1 and size != dim:
                return None
            size = dim
        # A 0 meets only 1s or 0s; the loop keeps the 0.
        out.append(size)
    return tuple(out)


def _axis(axis: int, rank: int) -> int | None:
    normal = axis + rank if axis < 0 else axis
    return normal if 0 <= normal < rank else None


def _one(ctx: NodeContext, spec: TensorSpec) -> Specs:
    return [spec] if ctx.num_outputs == 1 and len(ctx.node.output) == 1 else None


# -- elementwise ---------------------------------------------------------------

_FLOAT_UNARY = {
    "Abs",
    "Neg",
    "Exp",
    "Log",
    "Sqrt",
    "Tanh",
    "Relu",
    "Sigmoid",
    "Reciprocal",
    "Floor",
    "Ceil",
    "Round",
    "Sin",
    "Cos",
    "Erf",
    "Softplus",
    "Softsign",
    "HardSwish",
    "LeakyRelu",
    "Elu",
    "Selu",
    "Celu",
    "HardSigmoid",
    "Gelu",
    "Softmax",
    "LogSoftmax",
    "Clip",
    "BatchNormalization",
    "InstanceNormalization",
    "LayerNormalization",
    "Dropout",
}


def _float_unary(ctx: NodeContext) -> Specs:
    spec = _spec(ctx, 0)
    if spec is None or spec.dtype not in _FLOATS:
        return None
    return _one(ctx, spec)


def _identity(ctx: NodeContext) -> Specs:
    spec = _spec(ctx, 0)
    return None if spec is None else _one(ctx, spec)


def _cast(ctx: NodeContext) -> Specs:
    spec = _spec(ctx, 0)
    to = ctx.attr("to")
    if spec is None or not isinstance(to, int) or ctx.op_type != "Cast":
        return None
    dtype = tvm_dtype(to)
    if dtype is None or spec.dtype not in _NUMERIC | {"bool"}:
        return None
    return _one(ctx, TensorSpec(spec.shape, dtype))


_ARITHMETIC = {"Add", "Sub", "Mul", "Div"}
_COMPARE = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"}
_LOGIC = {"And", "Or", "Xor"}
_VARIADIC = {"Sum", "Max", "Min", "Mean"}


def _elementwise(ctx: NodeContext) -> Specs:
    specs = _specs(ctx)
    if not specs:
        return None
    op = ctx.op_type
    dtype = specs[0].dtype
    if any(s.dtype != dtype for s in specs):
        return None
    if op in _LOGIC:
        if dtype != "bool" or len(specs) != 2:
            return None
    elif op in _VARIADIC:
        if dtype not in _FLOATS and op in ("Sum", "Mean"):
            return None
        if dtype not in _NUMERIC:
            return None
    elif dtype not in _NUMERIC or len(specs) != 2:
        return None
    shape = _broadcast([s.shape for s in specs])
    if shape is None:
        return None
    out = "bool" if op in _COMPARE or op in _LOGIC else dtype
    return _one(ctx, TensorSpec(shape, out))


def _pow(ctx: NodeContext) -> Specs:
    specs = _specs(ctx)
    if not specs or len(specs) != 2 or any(s.dtype not in _FLOATS for s in specs):
        return None
    if specs[0].dtype != specs[1].dtype:
        return None
    shape = _broadcast([s.shape for s in specs])
    return None if shape is None else _one(ctx, TensorSpec(shape, specs[0].dtype))


def _where(ctx: NodeContext) -> Specs:
    specs = _specs(ctx)
    if not specs or len(specs) != 3 or specs[0].dtype != "bool":
        return None
    if specs[1].dtype != specs[2].dtype:
        return None
    shape = _broadcast([s.shape for s in specs])
    return None if shape is None else _one(ctx, TensorSpec(shape, specs[1].dtype))


def _not(ctx: NodeContext) -> Specs:
    spec = _spec(ctx, 0)
    return None if spec is None or spec.dtype != "bool" else _one(ctx, spec)


# -- matrix products -----------------------------------------------------------


def _matmul(ctx: NodeContext) -> Specs:
    specs = _specs(ctx)
    if not specs or len(specs) != 2:
        return None
    a, b = specs
    if a.dtype != b.dtype or a.dtype not in _NUMERIC:
        return None
    if not a.shape or not b.shape:
        return None
    left = (1, *a.shape) if len(a.shape) == 1 else a.shape
    right = (*b.shape, 1) if len(b.shape) == 1 else b.shape
    if left[-1] != right[-2]:
        return None
    batch = _broadcast([left[:-2], right[:-2]])
    if batch is None:
        return None
    shape = [*batch]
    if len(a.shape) > 1:
        shape.append(left[-2])
    if len(b.shape) > 1:
        shape.append(right[-1])
    return _one(ctx, TensorSpec(tuple(shape), a.dtype))


def _gemm(ctx: NodeContext) -> Specs:
    a, b = _spec(ctx, 0), _spec(ctx, 1)
    if a is None or b is None or a.dtype != b.dtype or a.dtype not in _FLOATS:
        return None
    if len(a.shape) != 2 or len(b.shape) != 2:
        return None
    m, k = a.shape[::-1] if ctx.attr("transA", 0) else a.shape
    k2, n = b.shape[::-1] if ctx.attr("transB", 0) else b.shape
    if k != k2:
        return None
    c = _spec(ctx, 2)
    if c is not None and (
        c.dtype != a.dtype or _broadcast([c.shape, (m, n)]) != (m, n)
    ):
        return None
    return _one(ctx, TensorSpec((m, n), a.dtype))


# -- shapes and data movement --------------------------------------------------


def _transpose(ctx: NodeContext) -> Specs:
    spec = _spec(ctx, 0)
    if spec is None:
        return None
    rank = len(spec.shape)
    perm = ctx.attr("perm")
    order = list(range(rank - 1, -1, -1)) if perm is None else [int(p) for p in perm]
    if sorted(order) != list(range(rank)):
        return None
    return _one(ctx, TensorSpec(tuple(spec.shape[p] for p in order), spec.dtype))


def _reshape(ctx: NodeContext) -> Specs:
    spec = _spec(ctx, 0)
    target = _ints(ctx, 1)
    if spec is None or target is None or ctx.version < 5:
        return None
    allowzero = bool(ctx.attr("allowzero", 0))
    out: list[int] = []
    unknown = None
    for index, dim in enumerate(target):
        if dim == -1 and unknown is None:
            unknown = index
            out.append(1)
        elif dim == 0 and not allowzero:
            if index >= len(spec.shape):
                return None
            out.append(spec.shape[index])
        elif dim < 0:
            return None
        else:
            out.append(dim)
    total = math.prod(spec.shape)
    known = math.prod(out)
    if unknown is not None:
        if known == 0 or total % known:
            return None
        out[unknown] = total // known
    elif known != total:
        return None
    return _one(ctx, TensorSpec(tuple(out), spec.dtype))


def _flatten(ctx: NodeContext) -> Specs:
    spec = _spec(ctx, 0)
    if spec is None:
        return None
    rank = len(spec.shape)
    axis = int(ctx.attr("axis", 1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis <= rank:
        return None
    shape = (math.prod(spec.shape[:axis]), math.prod(spec.shape[axis:]))
    return _one(ctx, TensorSpec(shape, spec.dtype))


def _squeeze_axes(ctx: NodeContext) -> tuple[bool, list[int] | None]:
    """Whether the axes could be read, and the axes input or attribute."""
    if ctx.version >= 13:
        if not ctx.has(1):
            return True, None
        axes = _ints(ctx, 1)
        return axes is not None, axes
    found = ctx.attr("axes")
    return True, None if found is None else [int(a) for a in found]


def _squeeze(ctx: NodeContext) -> Specs:
    spec = _spec(ctx, 0)
    readable, axes = _squeeze_axes(ctx)
    if spec is None or not readable:
        return None
    rank = len(spec.shape)
    if axes is None:
        drop = {i for i, d in enumerate(spec.shape) if d == 1}
    else:
        normal = [_axis(a, rank) for a in axes]
        if any(a is None or spec.shape[a] != 1 for a in normal):
            return None
        drop = {a for a in normal if a is not None}
        if len(drop) != len(axes):
            return None
    shape = tuple(d for i, d in enumerate(spec.shape) if i not in drop)
    return _one(ctx, TensorSpec(shape, spec.dtype))


def _unsqueeze(ctx: NodeContext) -> Specs:
    spec = _spec(ctx, 0)
    _, axes = _squeeze_axes(ctx)
    if spec is None or axes is None:
        return None
    rank = len(spec.shape) + len(axes)
    normal = {_axis(a, rank) for a in axes}
    if None in normal or len(normal) != len(axes):
        return None
    rest = iter(spec.shape)
    shape = tuple(1 if i in normal else next(rest) for i in range(rank))
    return _one(ctx, TensorSpec(shape, spec.dtype))


def _concat(ctx: NodeContext) -> Specs:
    specs = _specs(ctx)
    if not specs:
        return None
    first = specs[0]
    rank = len(first.shape)
    axis = _axis(int(ctx.attr("axis", 0)), rank) if rank else None
    if axis is None:
        return None
    size = 0
    for spec in specs:
        if spec.dtype != first.dtype or len(spec.shape) != rank:
            return None
        if any(spec.shape[i] != first.shape[i] for i in range(rank) if i != axis):
            return None
        size += spec.shape[axis]
    shape = (*first.shape[:axis], size, *first.shape[axis + 1 :])
    return _one(ctx, TensorSpec(shape, first.dtype))


def _gather(ctx: NodeContext) -> Specs:
    data, indices = _spec(ctx, 0), _spec(ctx, 1)
    if data is None or indices is None or indices.dtype not in _INDICES:
        return None
    axis = _axis(int(ctx.attr("axis", 0)), len(data.shape))
    if axis is None:
        return None
    shape = (*data.shape[:axis], *indices.shape, *data.shape[axis + 1 :])
    return _one(ctx, TensorSpec(shape, data.dtype))


def _slice(ctx: NodeContext) -> Specs:
    spec = _spec(ctx, 0)
    if spec is None or ctx.version < 10:
        return None
    starts, ends = _ints(ctx, 1), _ints(ctx, 2)
    rank = len(spec.shape)
    axes = _ints(ctx, 3) if ctx.has(3) else list(range(len(starts or ())))
    steps = _ints(ctx, 4) if ctx.has(4) else [1] * len(starts or ())
    if starts is None or ends is None or axes is None or steps is None:
        return None
    if not len(starts) == len(ends) == len(axes) == len(steps):
        return None
    shape = list(spec.shape)
    seen = set()
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        normal = _axis(axis, rank)
        if normal is None or normal in seen or step == 0:
            return None
        seen.add(normal)
        shape[normal] = len(range(*slice(start, end, step).indices(spec.shape[normal])))
    return _one(ctx, TensorSpec(tuple(shape), spec.dtype))


def _split(ctx: NodeContext) -> Specs:
    spec = _spec(ctx, 0)
    if spec is None or ctx.attr("num_outputs") is not None:
        return None
    axis = _axis(int(ctx.attr("axis", 0)), len(spec.shape))
    count = len(ctx.node.output)
    if axis is None or ctx.num_outputs != count:
        return None
    if ctx.version >= 13:
        sizes = _ints(ctx, 1) if ctx.has(1) else None
        if ctx.has(1) and sizes is None:
            return None
    else:
        found = ctx.attr("split")
        sizes = None if found is None else [int(s) for s in found]
    dim = spec.shape[axis]
    if sizes is None:
        if dim % count:
            return None
        sizes = [dim // count] * count
    if len(sizes) != count or sum(sizes) != dim or any(s < 0 for s in sizes):
        return None
    return [
        TensorSpec((*spec.shape[:axis], s, *spec.shape[axis + 1 :]), spec.dtype)
        for s in sizes
    ]


def _expand(ctx: NodeContext) -> Specs:
    spec = _spec(ctx, 0)
    target = _ints(ctx, 1)
    if spec is None or target is None or any(d < 0 for d in target):
        return None
    shape = _broadcast([spec.shape, tuple(target)])
    return None if shape is None else _one(ctx, TensorSpec(shape, spec.dtype))


# -- reductions ----------------------------------------------------------------

#: The opset version from which each reduction takes its axes as an input.
_AXES_INPUT = {"ReduceSum": 13}
_REDUCE = {
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
}


def _reduce(ctx: NodeContext) -> Specs:
    spec = _spec(ctx, 0)
    if spec is None or spec.dtype not in _FLOATS:
        return None
    rank = len(spec.shape)
    if ctx.version >= _AXES_INPUT.get(ctx.op_type, 18):
        axes = _ints(ctx, 1) if ctx.has(1) else []
        if axes is None or "axes" in ctx.attrs:
            return None
    else:
        if ctx.has(1):
            return None
        axes = [int(a) for a in ctx.attr("axes", [])]
    keep = bool(ctx.attr("keepdims", 1))
    if not axes:
        if ctx.attr("noop_with_empty_axes", 0):
            return _one(ctx, spec)
        chosen = set(range(rank))
    else:
        normal = [_axis(a, rank) for a in axes]
        if None in normal:
            return None
        chosen = {a for a in normal if a is not None}
    shape = tuple(
        (1 if keep else None) if i in chosen else d for i, d in enumerate(spec.shape)
    )
    out = tuple(d for d in shape if d is not None)
    return _one(ctx, TensorSpec(out, spec.dtype))


def _arg_reduce(ctx: NodeContext) -> Specs:
    spec = _spec(ctx, 0)
    if spec is None or spec.dtype not in _NUMERIC:
        return None
    axis = _axis(int(ctx.attr("axis", 0)), len(spec.shape))
    if axis is None:
        return None
    keep = bool(ctx.attr("keepdims", 1))
    shape = tuple(
        d if i != axis else 1 for i, d in enumerate(spec.shape) if i != axis or keep
    )
    return _one(ctx, TensorSpec(shape, "int64"))


_Rule = Callable[[NodeContext], Specs]
_RULES: dict[str, _Rule] = {
    **dict.fromkeys(_FLOAT_UNARY, _float_unary),
    **dict.fromkeys(_ARITHMETIC | _COMPARE | _LOGIC | _VARIADIC, _elementwise),
    **dict.fromkeys(_REDUCE, _reduce),
    "Identity": _identity,
    "Cast": _cast,
    "Pow": _pow,
    "Where": _where,
    "Not": _not,
    "MatMul": _matmul,
    "Gemm": _gemm,
    "Transpose": _transpose,
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Concat": _concat,
    "Gather": _gather,
    "Slice": _slice,
    "Split": _split,
    "Expand": _expand,
    "ArgMax": _arg_reduce,
    "ArgMin": _arg_reduce,
}
