"""Built-in ops: the kernels without attributes, named by the op alone.

Each op is one record of the library (:func:`~asyncrt.ops._library.builtin`):
its kernel factory ``make(xp)``, written once against the array namespace
``xp`` (numpy or cupy, which share the numpy API), its work estimate and,
for elementwise ops, its fusion template. Elementwise kernels *are* the
library's ufuncs: a ufunc takes its output positionally (``np.add(a, b,
out)``), which is exactly TVM's destination-passing convention, so such a
kernel costs one C call and no temporaries.

Names follow the ONNX/Relay spelling in lower case (``add``, ``relu``,
``matmul``, ...). This set covers elementwise math (arithmetic,
transcendental and activation functions, comparisons, logic), matmul, bias,
softmax, reductions and copies; ops configured by attributes (convolution,
pooling, normalisation, shape ops) are the other modules of
:mod:`asyncrt.ops`.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import math
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from scheduler.dag import TensorSpec

from ..runtime import _threads
from . import (
    _blocks,
    _epijit,
    _jit,
    _jitbroadcast,
    _jitcast,
    _jitfuse,
    _panel_gemm,
    _softvector,
    _team_blas,
    _team_parts,
)
from ._common import in_turn, quiet
from ._kernels import Bindable, FlopsFunction
from ._library import FusionTemplate, builtin

__all__ = ()

Array = Any
KernelFactory = Callable[[ModuleType], Callable[..., None]]


def _matmul_flops(ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]) -> float:
    """A multiply and an add per output element per reduced element."""
    return 2.0 * outs[0].size * (ins[0].shape[-1] if ins[0].shape else 1)


def _per_element(cost: float) -> FlopsFunction:
    """Elementwise work, weighted (transcendental functions cost more)."""
    return lambda ins, outs: cost * math.fsum(o.size for o in outs)


def _ufunc(ufunc: str) -> KernelFactory:
    return lambda xp: getattr(xp, ufunc)


def _binary(ufunc: str, operator: str) -> KernelFactory:
    """A binary ufunc, compiled on numpy where one operand is a value per
    slab (:func:`asyncrt.ops._jitbroadcast.compiled_slab_binary`)."""

    def make(xp: ModuleType) -> Callable[..., None]:
        func: Callable[..., None] = getattr(xp, ufunc)
        return _jitbroadcast.compiled_slab_binary(operator, func) if xp is np else func

    return make


# A transcendental function's work per element, in the units of the host's
# ``flops`` (float32 matmul throughput): numpy's float32 exp takes about as
# long as 150 matmul FLOPs, log 175, tanh 250 (measured on AVX2 and AVX-512
# hosts alike: both scale with the vector width). One figure for all of them
# keeps the model simple; 20, the count of a textbook polynomial, made the
# planner think them 7-12x cheaper than they run.
_TRANSCENDENTAL = _per_element(150.0)


def _infix(label: str, operator: str) -> FusionTemplate:
    """A binary operator, spelt the same in numexpr and CUDA C."""
    infix = f"({{0}} {operator} {{1}})"
    return FusionTemplate(label, infix, infix, jit=infix)


def _function(
    name: str,
    cuda_c: str | None = None,
    jit: str | None = None,
    jit_exact_from: int | None = 0,
) -> FusionTemplate:
    """A function of one argument, ``name(x)`` (``cuda_c(x)`` in CUDA C,
    ``jit(x)`` compiled, if given)."""
    return FusionTemplate(
        name,
        f"{name}({{0}})",
        f"{cuda_c or name}({{0}})",
        jit=None if jit is None else f"{jit}({{0}})",
        jit_exact_from=jit_exact_from,
    )


def _numpy_only(label: str) -> FusionTemplate:
    """Elementwise, but without templates: fused by the ``"numpy"`` engine
    only (NaN rules, rounding modes or domain handling differ elsewhere)."""
    return FusionTemplate(label)


_fusion: FusionTemplate | None
_flops: FlopsFunction | None
#: The binary ops compiled where an operand broadcasts a value per slab.
_OPERATORS = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/"}

# Ops that are a ufunc of the array namespace: name, ufunc, work, fusion.
for _name, _func, _flops, _fusion in (
    ("add", "add", None, _infix("add", "+")),
    ("subtract", "subtract", None, _infix("sub", "-")),
    ("multiply", "multiply", None, _infix("mul", "*")),
    ("divide", "divide", None, _infix("div", "/")),
    (
        "power",
        "power",
        _TRANSCENDENTAL,
        FusionTemplate("pow", "({0} ** {1})", "pow({0}, {1})"),
    ),
    (
        "negative",
        "negative",
        None,
        FusionTemplate("neg", "(-{0})", "(-{0})", jit="(-{0})"),
    ),
    ("log", "log", _TRANSCENDENTAL, _function("log")),
    ("sqrt", "sqrt", None, _function("sqrt", jit="np.sqrt")),
    ("abs", "absolute", None, _function("abs", cuda_c="fabs", jit="abs")),
    # bias broadcast over the last axis
    ("bias_add", "add", None, _infix("bias_add", "+")),
):
    operator = _OPERATORS.get(_name)
    factory = _ufunc(_func) if operator is None else _binary(_func, operator)
    builtin(_name, flops=_flops, fusion=_fusion)(factory)


# Compiled (where numba is installed), the library's float32 exp and tanh
# are one loop over _jitmath's exp_ and tanh_ (within 1 and 2 ulps of the
# exact results; numpy's SIMD ufuncs are within 2 and 1.4), split over the
# kernel threads on large arrays, so a fused chain over them compiles into
# one loop computing them bit for bit (W2's mul-tanh-exp-sqrt branches).
# One thread: exp 0.37 ns an element against numpy's 0.47, tanh 0.49
# against 0.38.
_EXP = _function("exp", jit="exp_")
_TANH = _function("tanh", "tanh", "tanh_")


def _compiled_transcendental(template: FusionTemplate) -> KernelFactory:
    def make(xp: ModuleType) -> Callable[..., None]:
        ufunc: Callable[..., None] = getattr(xp, template.label)
        return _jitfuse.compiled_unary(template, ufunc) if xp is np else ufunc

    return make


builtin("exp", flops=_TRANSCENDENTAL, fusion=_EXP)(_compiled_transcendental(_EXP))
builtin("tanh", flops=_TRANSCENDENTAL, fusion=_TANH)(_compiled_transcendental(_TANH))


def _keyword_out(ufunc: str) -> KernelFactory:
    """For ufuncs whose positional ``out`` numpy deprecates (max/min) or
    cupy refuses (its matmul gufunc takes ``out`` by keyword only)."""

    def make(xp: ModuleType) -> Callable[..., None]:
        func = getattr(xp, ufunc)

        def kernel(a: Array, b: Array, out: Array) -> None:
            func(a, b, out=out)

        return kernel

    return make


_RELU = FusionTemplate(
    "relu",
    # x < 0 is false for NaN, so NaN propagates as through np.maximum(x, 0)
    "where({0} < 0, 0, {0})",
    "({0} < (T)0 ? (T)0 : {0})",
    jit="relu_({0})",
)


@builtin("relu", fusion=_RELU)
def _relu(xp: ModuleType) -> Callable[..., None]:
    maximum = xp.maximum

    def relu(a: Array, out: Array) -> None:
        maximum(a, 0, out=out)

    # numpy's float32 maximum is 4x slower than one compiled pass
    return _jitfuse.compiled_unary(_RELU, relu) if xp is np else relu


# numpy's sign: NaN in, NaN out, +0 for either zero. numpy's float32 sign
# is a scalar loop: 4096 elements took 5.0 us, 3.4x their bytes floor.
_SIGN = FusionTemplate(
    "sign",
    jit="(_ONE if {0} > _ZERO else (-_ONE if {0} < _ZERO else ({0} + _ZERO)))",
)


@builtin("sign", fusion=_SIGN)
def _sign(xp: ModuleType) -> Callable[..., None]:
    sign = xp.sign

    def kernel(a: Array, out: Array) -> None:
        sign(a, out=out)

    return _jitfuse.compiled_unary(_SIGN, kernel) if xp is np else kernel


# Compiled (where numba is installed), the library's float32 sigmoid is one
# loop over _jitmath's exp_ (within 1 ulp of the exact exp, as numpy's is
# within 2): 0.55 ns an element against 0.81 for numpy's four passes, and
# one call instead of four on small arrays (5.0 -> 2.6 us for 4096).
_SIGMOID = FusionTemplate(
    "sigmoid",
    "(1 / (1 + exp(-{0})))",
    "((T)1 / ((T)1 + exp(-{0})))",
    jit="sigmoid_({0})",
)


@builtin("sigmoid", flops=_TRANSCENDENTAL, fusion=_SIGMOID)
def _sigmoid(xp: ModuleType) -> Callable[..., None]:
    def sigmoid(a: Array, out: Array) -> None:
        xp.negative(a, out)
        xp.exp(out, out)
        xp.add(out, 1, out)
        xp.reciprocal(out, out)

    return _jitfuse.compiled_unary(_SIGMOID, sigmoid) if xp is np else sigmoid


@builtin(
    "square",
    fusion=FusionTemplate("square", "({0} * {0})", "({0} * {0})", jit="({0} * {0})"),
)
def _square(xp: ModuleType) -> Callable[..., None]:
    square = xp.square

    def square_kernel(a: Array, out: Array) -> None:
        with quiet(xp):  # overflow to inf is the result
            square(a, out)

    return square_kernel


@builtin(
    "cube",
    fusion=FusionTemplate(
        "cube", "({0} * {0} * {0})", "(({0} * {0}) * {0})", jit="(({0} * {0}) * {0})"
    ),
)
def _cube(xp: ModuleType) -> Callable[..., None]:
    """``x * x * x``, as ONNX Runtime computes ``Pow(x, 3)``: two
    multiplications instead of numpy's ``power`` (over 100x slower)."""
    multiply = xp.multiply

    def cube(a: Array, out: Array) -> None:
        with quiet(xp):
            if out is a:  # (x * x) * x needs x after out holds x * x
                out[...] = a * a * a
                return
            multiply(a, a, out)
            multiply(out, a, out)

    return cube


_POWER_HALF = FusionTemplate("power_half", jit="sqrth_({0})")


@builtin("power_half", fusion=_POWER_HALF)
def _power_half(xp: ModuleType) -> Callable[..., None]:
    """``pow(x, 0.5)`` as a square root: ``pow`` gives +0 at -0 (``sqrt``
    -0) and +inf at -inf (``sqrt`` NaN). One compiled pass over float32
    arrays where numba is installed (three numpy passes otherwise)."""
    sqrt, add, copyto = xp.sqrt, xp.add, xp.copyto

    def power_half(a: Array, out: Array) -> None:
        with quiet(xp):
            negative_inf = a == -np.inf
            sqrt(a, out)
            add(out, 0.0, out)  # -0 + 0 is +0
            copyto(out, np.inf, where=negative_inf)

    return _jitfuse.compiled_unary(_POWER_HALF, power_half) if xp is np else power_half


@builtin("copy", fusion=FusionTemplate("copy", "{0}", "{0}", jit="{0}"))
def _copy(xp: ModuleType) -> Callable[..., None]:
    def copy(a: Array, out: Array) -> None:
        out[...] = a

    return copy


@builtin("dense", flops=_matmul_flops, blas=True)
def _dense(xp: ModuleType) -> Callable[..., None]:
    matmul = xp.matmul

    def dense(a: Array, w: Array, out: Array) -> None:
        matmul(a, w.T, out=out)  # Relay's nn.dense: weights as [units, in]

    return dense


#: Softmax skips the shift by each row's maximum where every input lies
#: within this bound: each ``exp(x)`` is then a normal float32 between
#: ``exp(-64)`` and ``exp(64)`` (nothing overflows or underflows, each term
#: keeps full relative precision, and a row of fewer than 2**60 of them
#: cannot overflow its sum), and ``exp(x) / sum(exp(x))`` is the row's
#: softmax exactly as ``exp(x - max)`` over its sum is, with one rounding
#: fewer (no subtraction). The compiled loops (:mod:`asyncrt.ops._epijit`)
#: take the same bound, a block of rows at a time.
NO_SHIFT_BOUND = _epijit.NO_SHIFT_BOUND


def softmax_last_axis(a: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> None:
    """Softmax over the last axis of non-empty float32/float64 numpy rows.

    C-contiguous float32 rows, where numba is installed, are one compiled
    loop (:mod:`asyncrt.ops._epijit`'s ``softmax_rows``: each row shifted by
    its maximum, within a few ulps of the passes below, 3x faster on small
    arrays and 4-12 % on large ones; rows of about a vector,
    :mod:`asyncrt.ops._softvector`'s groups). Otherwise numpy passes:
    the row sums are one matrix-vector product (BLAS, 3-4x numpy's
    add.reduce), the division a multiplication by their reciprocals. The
    row maxima are subtracted only where some input lies outside
    ``[-NO_SHIFT_BOUND, NO_SHIFT_BOUND]`` (two whole-array reductions
    tell; NaN and infinities compare false): numpy reduces short rows one
    at a time (58 us for 1024 rows of 128 here, plus 30 us for the
    subtraction). Masked scores (very negative or -inf, none above the
    bound) skip the shift too where no row sum falls below
    :data:`MIN_ROW_SUM` (a causal decoder's 32 x 100 rows: 500 -> 130 us).
    """
    bind_softmax_last_axis(a, out)()


#: Softmax rows are split over the kernel threads from this many elements
#: (about 300 us of work on one core): a hand-off costs about 50 us. On a
#: 16-core machine, the MiniLM-size encoder at batch 16 spent 35 % of its
#: time in one thread's softmax.
SOFTMAX_SPLIT_ELEMENTS = 1 << 18


def bind_softmax_last_axis(
    a: np.ndarray[Any, Any], out: np.ndarray[Any, Any]
) -> Callable[[], None]:
    """:func:`softmax_last_axis` bound to these arrays: the row views and
    the row sums' buffer made once, the rows in blocks over the kernel
    threads where there are enough of them."""
    width = a.shape[-1]
    flat, rows = a.reshape(-1, width), out.reshape(-1, width)
    if (
        a.dtype == out.dtype == np.float32
        and a.flags.c_contiguous
        and out.flags.c_contiguous
        and _jit.available()
    ):
        if _softvector.takes(flat, rows):  # rows of about a vector
            return _softvector.bind(flat, rows, split_elements=SOFTMAX_SPLIT_ELEMENTS)
        shares = _team_parts.shares(
            flat.shape[0],
            a.size,
            SOFTMAX_SPLIT_ELEMENTS,
            min_team_work=_team_parts.MIN_TEAM_ELEMENTS,
        )
        if flat.ctypes.data == rows.ctypes.data:  # in place (C-contiguous both)
            kernel = _epijit.loop("softmax_rows_in_place")
            return _jit.bind_parts(kernel, (rows,), shares, work=a.size)
        kernel = _epijit.loop("softmax_rows")
        return _jit.bind_parts(kernel, (flat, rows), shares, work=a.size)
    step = max(1, SOFTMAX_BLOCK // width)
    shares = _threads.shares(flat.shape[0], a.size // SOFTMAX_SPLIT_ELEMENTS)
    parts = [_softmax_row_blocks(flat[i:j], rows[i:j], step) for i, j in shares]
    if len(parts) == 1:
        return parts[0]
    return functools.partial(_threads.run_parts, parts)


#: Elements per block of rows a softmax's passes run over: its five passes
#: (two range checks, exp, row sums, scaling) read a block from cache, not
#: memory. 4 x 12 x 512 x 512 on one thread: 16.6 -> 12.0 ms (64Ki: 12.5,
#: 256Ki: 12.1); arrays of one block are unchanged (2-core AVX-512 VM).
SOFTMAX_BLOCK = 1 << 17


def _softmax_row_blocks(
    flat: np.ndarray[Any, Any], rows: np.ndarray[Any, Any], step: int
) -> Callable[[], None]:
    """:func:`_bind_softmax_rows` over blocks of ``step`` rows, in turn."""
    return in_turn(
        [
            _bind_softmax_rows(flat[i : i + step], rows[i : i + step])
            for i in range(0, max(flat.shape[0], 1), step)
        ]
    )


def _bind_softmax_rows(
    flat: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]
) -> Callable[[], None]:
    """Softmax of the rows ``flat`` into ``rows`` (both 2-D) as a call."""
    totals = np.empty(flat.shape[0], dtype=flat.dtype)
    column, ones = totals.reshape(-1, 1), ones_vector(flat.shape[1], flat.dtype.str)
    minimum, maximum, fmax = np.minimum.reduce, np.maximum.reduce, np.fmax.reduce
    # The masked path below may find that it must shift the scores after
    # all: in place, it takes their exponentials into a scratch of its own.
    trial = np.empty_like(rows) if np.may_share_memory(flat, rows) else rows
    exp, subtract, matmul = np.exp, np.subtract, np.matmul
    reciprocal, multiply = np.reciprocal, np.multiply

    def normalise() -> None:
        matmul(rows, ones, out=totals)
        reciprocal(totals, totals)
        multiply(rows, column, rows)

    def softmax() -> None:
        low, high = minimum(flat, axis=None), maximum(flat, axis=None)
        if low >= -NO_SHIFT_BOUND and high <= NO_SHIFT_BOUND:
            # Finite, bounded inputs: every exp is in (0, e^64], so no sum
            # is 0 or inf and nothing can warn (even a quiet error state costs 0.5 us).
            exp(flat, rows)
            normalise()
            return
        if high <= NO_SHIFT_BOUND and low == low:  # no NaN; no exp overflows
            # Masked scores (-inf, -3.4e38): their exp is 0, as shifted. Where
            # every row sum is at least exp(-64), each row's maximum is above
            # -64 - log(width) and the unshifted quotients are the shifted
            # ones (outputs of exp(x) < 1e-38 lose their last bits: an
            # absolute error below 1e-17). Else the rows are shifted.
            exp(flat, trial)
            matmul(trial, ones, out=totals)
            if minimum(totals, axis=None) >= MIN_ROW_SUM:
                reciprocal(totals, totals)
                multiply(trial, column, rows)
                return
        with quiet(np):  # IEEE results for inf and NaN rows
            subtract(flat, fmax(flat, axis=1, keepdims=True), rows)
            exp(rows, rows)
            normalise()

    return softmax


#: The smallest row sum of unshifted exponentials that softmax divides by
#: (exp(-NO_SHIFT_BOUND)): a normal float32 with full precision.
MIN_ROW_SUM = float(np.exp(np.float32(-NO_SHIFT_BOUND)))


@functools.lru_cache(maxsize=16)
def ones_vector(width: int, dtype: str) -> np.ndarray[Any, Any]:
    """A read-only vector of ``width`` ones (cached): row sums as one
    matrix-vector product."""
    ones = np.ones(width, dtype=dtype)
    ones.flags.writeable = False
    return ones


def exact_sums(a: Array, axis: int | tuple[int, ...]) -> Array:
    """``a.sum(axis, keepdims=True)`` rounded once to ``a``'s dtype: half
    precision is accumulated in float32, as numpy does (cupy's float16
    sums accumulate in float16 and drift by several ulps from numpy's)."""
    if a.dtype.itemsize >= 4:
        return a.sum(axis=axis, keepdims=True)
    return a.sum(axis=axis, keepdims=True, dtype=np.float32).astype(a.dtype)


@builtin("softmax", flops=_TRANSCENDENTAL)
def _softmax(xp: ModuleType) -> Callable[..., None]:
    def by_rows(a: Array) -> bool:
        return bool(
            xp is np and a.dtype in (np.float32, np.float64) and a.ndim and a.size
        )

    def softmax(a: Array, out: Array) -> None:
        if by_rows(a):
            softmax_last_axis(a, out)
            return
        xp.subtract(a, a.max(axis=-1, keepdims=True), out)  # numerically stable
        xp.exp(out, out)
        xp.divide(out, exact_sums(out, -1), out)

    def bind(a: Array, out: Array) -> Callable[[], None]:
        if by_rows(a):
            return bind_softmax_last_axis(a, out)
        return functools.partial(softmax, a, out)

    return Bindable(softmax, bind)


@builtin("sum", fusion=FusionTemplate("sum", variadic="+"))
def _sum(xp: ModuleType) -> Callable[..., None]:
    add = xp.add

    def sum_inputs(*args: Array) -> None:
        *inputs, out = args
        add(inputs[0], inputs[1], out) if len(inputs) > 1 else out.__setitem__(
            ..., inputs[0]
        )
        for other in inputs[2:]:
            add(out, other, out)

    return sum_inputs


@builtin("reduce_sum")
def _reduce_sum(xp: ModuleType) -> Callable[..., None]:
    def reduce_sum(a: Array, out: Array) -> None:
        out[...] = a.sum()

    return reduce_sum


def stacked_as_one_gemm(a: Array, b: Array, out: Array) -> bool:
    """Whether ``a @ b`` with ``a`` stacked (``(..., M, K)``) and ``b`` one
    matrix is one GEMM of ``(prod(...) * M, K) @ (K, N)`` over views: numpy
    (and cupy) loop over the stack one small GEMM at a time, which at
    (32, 16, 384) @ (384, 1536) takes 1.8x as long as the single call."""
    return bool(
        a.ndim > 2
        and b.ndim == 2
        and a.flags.c_contiguous
        and out.flags.c_contiguous
        and out.shape[:-1] == a.shape[:-1]
    )


#: GEMMs of at least this many multiply-adds split over the part pool
#: while other processes crowd the BLAS pool down to one thread
#: (:attr:`~asyncrt.runtime._threads.ThreadLimits.gemm_parts`).
CROWDED_SPLIT_MIN_WORK = 10_000_000
#: ... into this many row blocks a thread (a thread the machine does not
#: run for a while leaves only its current block to wait for), of at least
#: this many rows (BLAS is slower on fewer).
CROWDED_BLOCKS_PER_THREAD = 4
CROWDED_MIN_BLOCK_ROWS = 48


def bind_matmul(
    matmul: Callable[..., Any],
    a: Array,
    b: Array,
    out: Array,
    *,
    constant_b: bool = False,
) -> Callable[[], None]:
    """``matmul(a, b, out=out)`` as a call without arguments: one GEMM over
    views where :func:`stacked_as_one_gemm` says so (``out`` by keyword:
    cupy takes it no other way). A large numpy GEMM of rows is also split
    in row blocks, run over the part pool while busy neighbours crowd BLAS
    down to one thread: its threads take each other's blocks, where BLAS's
    wait for a thread the machine is not running.

    :param constant_b: ``b``'s values are fixed for the binding's life (a
        parameter): float32 products take :mod:`asyncrt.ops._panel_gemm`,
        ``b`` packed now, once.
    """
    if constant_b and _panel_gemm.takes(a, b, out):
        return _panel_gemm.bind(a, b, out)
    if stacked_as_one_gemm(a, b, out):
        a, out = a.reshape(-1, a.shape[-1]), out.reshape(-1, out.shape[-1])
    if _team_blas.takes(a, b, out):  # (it splits crowded products itself)
        return _team_blas.bind(a, b, out)
    whole = functools.partial(matmul, a, b, out=out)
    rows = a.shape[0] if a.ndim == 2 else 0
    if not (
        isinstance(a, np.ndarray)
        and a.ndim == b.ndim == out.ndim == 2
        and rows * a.shape[1] * b.shape[1] >= CROWDED_SPLIT_MIN_WORK
    ):
        return whole
    count = max(1, min(rows // CROWDED_MIN_BLOCK_ROWS, 2 * CROWDED_BLOCKS_PER_THREAD))
    if count < 2:
        return whole
    edges = [rows * i // count for i in range(count + 1)]
    blocks = [
        functools.partial(matmul, a[i:j], b, out=out[i:j])
        for i, j in itertools.pairwise(edges)
    ]
    limits = _threads.limits

    def product() -> None:
        parts = limits.gemm_parts
        if parts > 1:
            _threads.run_parts(blocks, parts)
        else:
            whole()

    return product


@builtin("matmul", flops=_matmul_flops, blas=True)
def _matmul(xp: ModuleType) -> Bindable:
    def bind(
        a: Array, b: Array, out: Array, constant: frozenset[int] = frozenset()
    ) -> Callable[[], None]:
        return bind_matmul(xp.matmul, a, b, out, constant_b=1 in constant)

    def product(a: Array, b: Array, out: Array) -> None:
        bind(a, b, out)()

    return Bindable(product, bind, takes_constant=True)


# Ops that are a ufunc taking ``out`` by keyword: name, ufunc, work, fusion.
for _name, _func, _flops, _fusion in (
    ("maximum", "maximum", None, FusionTemplate("max", jit="max_({0}, {1})")),
    ("minimum", "minimum", None, FusionTemplate("min", jit="min_({0}, {1})")),
):
    builtin(_name, flops=_flops, fusion=_fusion)(_keyword_out(_func))


# -- more elementwise kernels, one per ONNX elementwise op -------------------


def _quiet_ufunc(ufunc: str) -> KernelFactory:
    """A ufunc whose domain errors are IEEE results (log(0) = -inf), not
    warnings: ONNX defines them so."""

    def make(xp: ModuleType) -> Callable[..., None]:
        func = getattr(xp, ufunc)

        def kernel(*args: Array) -> None:
            with quiet(xp):
                func(*args)

        return kernel

    return make


#: float32 arrays up to this many elements take scipy's one-call ufuncs
#: (erf, ndtr): at 16 ns an element computed in double they cost less than
#: the rational approximation's 20 whole-array calls, about 1 us each.
SCIPY_SMALL_FLOAT32 = 1024


# Compiled, erf is bind_erf_float32's arithmetic (float32 only), and where
# numba is installed the library's erf of every float32 array is that loop:
# bit for bit at any size.
_ERF = FusionTemplate("erf", jit="erf_({0})")


@builtin("erf", flops=_TRANSCENDENTAL, fusion=_ERF)
def make_erf(xp: ModuleType) -> Bindable:
    """The ``erf`` kernel for ``xp`` (GELU calls it too).

    float32 on numpy: :func:`erf_float32` above
    :data:`SCIPY_SMALL_FLOAT32` elements (bound: :func:`bind_erf_float32`),
    because scipy computes float32 erf in double, one element at a time
    (16 ns each here, 4x the whole-array version). Otherwise scipy's erf
    ufunc (cupyx's for cupy), imported on first use: it is not worth its
    import time to programs that never call it.
    """
    special = "scipy.special" if xp is np else "cupyx.scipy.special"

    def by_passes(out: Array) -> bool:
        return bool(
            xp is np and out.dtype == np.float32 and out.size > SCIPY_SMALL_FLOAT32
        )

    def erf(a: Array, out: Array) -> None:
        if by_passes(out):
            erf_float32(xp, a, out)
        else:
            importlib.import_module(special).erf(a, out)

    def bind(a: Array, out: Array) -> Callable[[], None]:
        if by_passes(out):
            return bind_erf_float32(xp, a, out)
        return functools.partial(erf, a, out)

    kernel = Bindable(erf, bind)
    if xp is not np:
        return kernel
    # The same polynomial in one compiled pass, where numba is installed, at
    # every size: one call costs less than scipy's double erf from a few
    # elements on (1024: 0.8 against 6.6 us).
    return _jitfuse.compiled_unary(_ERF, kernel)


# Eigen's float32 erf (``generic_fast_erf_float``, as TensorFlow and XLA use
# it): erf(x) = x P(x^2) / Q(x^2) on x clamped to [-4, 4], where float32 erf
# is +-1 already. Largest error against scipy's double erf: 4.5e-7.
_ERF_P = (
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
)
_ERF_Q = (
    -1.45660718464996e-05,
    -2.13374055278905e-04,
    -1.68282697438203e-03,
    -7.37332916720468e-03,
    -1.42647390514189e-02,
)


_ERF_P32 = tuple(np.float32(c) for c in _ERF_P)
_ERF_Q32 = tuple(np.float32(c) for c in _ERF_Q)
_FOUR32 = np.float32(4)


def erf_float32(xp: ModuleType, a: Array, out: Array) -> None:
    """erf of float32 ``a`` into ``out`` (may be ``a``) with whole-array
    calls: Eigen's rational approximation (see ``_ERF_P``), its scratch
    made for this call (:func:`bind_erf_float32` makes it once)."""
    bind_erf_float32(xp, a, out)()


def bind_erf_float32(
    xp: ModuleType, a: Array, out: Array, block: int = _blocks.BLOCK
) -> Callable[[], None]:
    """:func:`erf_float32` bound to these arrays, block by block over
    contiguous ones (:func:`asyncrt.ops._blocks.bind_blocks`): its three
    scratch arrays (the clamped input, its square, the denominator) made
    once. The constants are float32 scalars made once, and each
    polynomial's Horner loop starts from its first product, so there is no
    fill and no ``clip`` wrapper."""
    p, q = _ERF_P32, _ERF_Q32
    minimum, maximum, multiply, add = xp.minimum, xp.maximum, xp.multiply, xp.add
    divide = xp.divide

    def erf(source: Array, target: Array, x: Array, x2: Array, den: Array) -> None:
        minimum(source, _FOUR32, out=x)
        maximum(x, -_FOUR32, out=x)
        multiply(x, x, out=x2)
        multiply(x2, q[0], out=den)
        add(den, q[1], den)
        for c in q[2:]:
            multiply(den, x2, den)
            add(den, c, den)
        multiply(x2, p[0], target)
        add(target, p[1], target)
        for c in p[2:]:
            multiply(target, x2, target)
            add(target, c, target)
        multiply(target, x, target)
        divide(target, den, target)

    return _blocks.bind_blocks(xp, erf, (a,), out, scratch=3, block=block)


def _softplus_passes(xp: ModuleType, a: Array, out: Array, scratch: Array) -> None:
    """log(1 + e^x) as max(x, 0) + log1p(e^-|x|): no overflow, and SIMD
    passes where numpy's ``logaddexp`` (the same formula) takes one scalar
    pass at 18 ns an element. Within 1 ulp of ``logaddexp``."""
    xp.absolute(a, out)
    xp.negative(out, out)
    xp.exp(out, out)
    xp.log1p(out, out)
    _blocks.positive_part(xp, a, scratch)
    xp.add(out, scratch, out)


# Compiled, float32 softplus is one loop over _jitmath's exp_ and a log1p
# series on [0, 1] (within 3 ulps of the exact result, as the numpy passes
# are, not their bits): 0.9 ns an element against about 2 for a compiled
# pass, numpy's exp and log1p and another pass (9.5 us at 4096 elements).
_SOFTPLUS = FusionTemplate("softplus", jit="softplus_({0})", jit_exact_from=None)


@builtin("softplus", flops=_TRANSCENDENTAL, fusion=_SOFTPLUS)
def _softplus(xp: ModuleType) -> Bindable:
    kernel = _blocks.blockwise(xp, functools.partial(_softplus_passes, xp), scratch=1)
    return _jitfuse.compiled_unary(_SOFTPLUS, kernel) if xp is np else kernel


# x / (1 + |x|): the numpy passes' three float32 operations in their order,
# so the compiled loop (one pass instead of three) gives their bits.
_SOFTSIGN = FusionTemplate("softsign", jit="({0} / (_ONE + abs({0})))")


@builtin("softsign", fusion=_SOFTSIGN)
def _softsign(xp: ModuleType) -> Callable[..., None]:
    def softsign(a: Array, out: Array) -> None:
        xp.absolute(a, out)
        xp.add(out, 1, out)
        xp.divide(a, out, out)

    return _jitfuse.compiled_unary(_SOFTSIGN, softsign) if xp is np else softsign


#: Past this, tanh(softplus(x)) is 1 in float32 (and e^2x would overflow).
_MISH_CLAMP = np.float32(20)


# Compiled, the library's float32 mish is one loop over _jitmath's exp_
# (mish_: the numpy passes' operations in their order).
_MISH = FusionTemplate("mish", jit="mish_({0})")


@builtin("mish", flops=_TRANSCENDENTAL, fusion=_MISH)
def _mish(xp: ModuleType) -> Bindable:
    def mish(a: Array, out: Array, n: Array) -> None:
        # x tanh(log(1 + e^x)) = x n / (n + 2), n = e^x (e^x + 2): one exp
        # instead of exp, log1p and tanh; no cancellation (every term is
        # positive), e^x clamped where the ratio is 1 anyway.
        xp.minimum(a, _MISH_CLAMP, out=out)
        xp.exp(out, out)
        xp.add(out, 2, n)
        xp.multiply(n, out, n)
        xp.add(n, 2, out)
        xp.divide(n, out, out)
        with quiet(xp):  # -inf x 0: NaN, as ONNX's formula gives
            xp.multiply(a, out, out)

    kernel = _blocks.blockwise(xp, mish, scratch=1)
    return _jitfuse.compiled_unary(_MISH, kernel) if xp is np else kernel


_HARD_SWISH = FusionTemplate("hard_swish", jit="hswish_({0})")


@builtin("hard_swish", fusion=_HARD_SWISH)
def _hard_swish(xp: ModuleType) -> Callable[..., None]:
    def hard_swish(a: Array, out: Array) -> None:
        xp.multiply(a, 1 / 6, out)
        xp.add(out, 0.5, out)
        xp.clip(out, 0, 1, out=out)
        xp.multiply(a, out, out)

    # one compiled pass instead of four, where numba is installed
    return _jitfuse.compiled_unary(_HARD_SWISH, hard_swish) if xp is np else hard_swish


@builtin("prelu", fusion=_numpy_only("prelu"))
def _prelu(xp: ModuleType) -> Bindable:
    def prelu(a: Array, slope: Array, out: Array, scratch: Array) -> None:
        # max(a, 0) + slope * min(a, 0): a where a >= 0 (a + slope * 0),
        # slope * a below, NaN for NaN; four SIMD passes where a masked
        # copy branches on every element (9x slower on random signs).
        _blocks.negative_part(xp, a, out)
        xp.multiply(out, slope, out)
        _blocks.positive_part(xp, a, scratch)
        xp.add(out, scratch, out)

    blocks = _blocks.blockwise(xp, prelu, scratch=1)
    if xp is not np:
        return blocks
    # One compiled pass of the same operations in the same order (bit for
    # bit) where the slope is whole, a scalar or a tile of trailing axes.
    return _jitbroadcast.compiled_float32("(-relu_(-{0})) * {1} + relu_({0})", blocks)


def _compiled_int32(
    name: str, xp: ModuleType, kernel: Callable[..., None]
) -> Callable[..., None]:
    """``kernel``, compiled for int32 arrays where numba is installed
    (:func:`asyncrt.ops._jitbroadcast.compiled_integer_division`)."""
    return _jitbroadcast.compiled_integer_division(name, kernel) if xp is np else kernel


@builtin("trunc_divide")
def _trunc_divide(xp: ModuleType) -> Callable[..., None]:
    def trunc_divide(a: Array, b: Array, out: Array) -> None:
        # C's integer division, as ONNX's Div: a - fmod(a, b) is an exact
        # multiple of b, so floor division of it truncates toward zero.
        with quiet(xp):
            xp.subtract(a, xp.fmod(a, b), out)
            xp.floor_divide(out, b, out)

    return _compiled_int32("trunc_divide", xp, trunc_divide)


@builtin("mod", fusion=_numpy_only("mod"))
def _floor_mod(xp: ModuleType) -> Callable[..., None]:
    """Python's ``%`` (the divisor's sign, as ONNX's Mod without fmod), the
    same on every array library: cupy's float ``remainder`` differs from
    numpy's at the edges (``0 % -2`` is ``0.0``, ``-3 % inf`` is NaN)."""

    def mod(a: Array, b: Array, out: Array) -> None:
        with quiet(xp):
            if out.dtype.kind != "f":
                xp.remainder(a, b, out)
                return
            rem = xp.fmod(a, b)
            # A nonzero remainder with the dividend's sign moves by one
            # divisor; a zero one takes the divisor's sign.
            moved = (rem != 0) & (xp.signbit(rem) != xp.signbit(b))
            rem = xp.where(moved, rem + b, rem)
            xp.copyto(out, xp.where(rem == 0, xp.copysign(rem, b), rem))

    return _compiled_int32("mod", xp, mod)


@builtin("power_cast", flops=_TRANSCENDENTAL)
def _power_cast(xp: ModuleType) -> Callable[..., None]:
    def power_cast(a: Array, b: Array, out: Array) -> None:
        # ONNX's Pow of mixed types: computed in the common type, cast to
        # the base's.
        with quiet(xp):
            xp.power(a, b, out=out, casting="unsafe")

    return power_cast


@builtin("cast")
def _cast(xp: ModuleType) -> Callable[..., None]:
    def cast(a: Array, out: Array) -> None:
        with quiet(xp):  # NaN or out-of-range to int: undefined, not an error
            out[...] = a

    def bind(a: Array, out: Array) -> Callable[[], None]:
        # float32 -> float16 compiled (numpy's is scalar software), bit for bit
        half = _jitcast.bind_float32_to_half(a, out) if xp is np else None
        return half or functools.partial(cast, a, out)

    return Bindable(cast, bind)


@builtin("where")
def _where(xp: ModuleType) -> Callable[..., None]:
    def where(cond: Array, a: Array, b: Array, out: Array) -> None:
        xp.copyto(out, b)  # broadcasts, no temporary
        xp.copyto(out, a, where=cond)

    # one compiled select where numba is installed (the masked copy
    # branches on every element)
    return _jitbroadcast.compiled_where(where) if xp is np else where


def _variadic(ufunc: str) -> KernelFactory:
    """``max``/``min``/``sum`` of any number of inputs, folded pairwise."""

    def make(xp: ModuleType) -> Callable[..., None]:
        func = getattr(xp, ufunc)

        def kernel(*args: Array) -> None:
            *inputs, out = args
            if len(inputs) == 1:
                out[...] = inputs[0]
                return
            func(inputs[0], inputs[1], out=out)
            for other in inputs[2:]:
                func(out, other, out=out)

        return kernel

    return make


@builtin("mean", fusion=_numpy_only("mean"))
def _mean(xp: ModuleType) -> Callable[..., None]:
    total = _variadic("add")(xp)

    def mean(*args: Array) -> None:
        total(*args)
        xp.divide(args[-1], len(args) - 1, args[-1])

    return mean


# Ops that are a ufunc whose domain errors are IEEE results: name, ufunc,
# work, fusion.
for _name, _func, _flops, _fusion in (
    (
        "reciprocal",
        "reciprocal",
        None,
        FusionTemplate("recip", "(1 / {0})", "((T)1 / {0})", jit="(_ONE / {0})"),
    ),
    ("floor", "floor", None, _numpy_only("floor")),
    ("ceil", "ceil", None, _numpy_only("ceil")),
    # ONNX rounds half to even, as rint does
    ("round", "rint", None, _numpy_only("round")),
    ("sin", "sin", _TRANSCENDENTAL, _function("sin")),
    ("cos", "cos", _TRANSCENDENTAL, _function("cos")),
    ("tan", "tan", _TRANSCENDENTAL, _function("tan")),
    ("asin", "arcsin", _TRANSCENDENTAL, _numpy_only("asin")),
    ("acos", "arccos", _TRANSCENDENTAL, _numpy_only("acos")),
    ("atan", "arctan", _TRANSCENDENTAL, _numpy_only("atan")),
    ("sinh", "sinh", _TRANSCENDENTAL, _function("sinh")),
    ("cosh", "cosh", _TRANSCENDENTAL, _function("cosh")),
    ("asinh", "arcsinh", _TRANSCENDENTAL, _numpy_only("asinh")),
    ("acosh", "arccosh", _TRANSCENDENTAL, _numpy_only("acosh")),
    ("atanh", "arctanh", _TRANSCENDENTAL, _numpy_only("atanh")),
    ("equal", "equal", None, None),
    ("less", "less", None, None),
    ("less_equal", "less_equal", None, None),
    ("greater", "greater", None, None),
    ("greater_equal", "greater_equal", None, None),
    ("logical_and", "logical_and", None, None),
    ("logical_or", "logical_or", None, None),
    ("logical_xor", "logical_xor", None, None),
    ("logical_not", "logical_not", None, None),
    ("isnan", "isnan", None, None),
    ("bitwise_and", "bitwise_and", None, None),
    ("bitwise_or", "bitwise_or", None, None),
    ("bitwise_xor", "bitwise_xor", None, None),
    ("bitwise_not", "invert", None, None),
):
    builtin(_name, flops=_flops, fusion=_fusion)(_quiet_ufunc(_func))


@builtin("fmod", fusion=_numpy_only("fmod"))
def _fmod(xp: ModuleType) -> Callable[..., None]:
    kernel = _quiet_ufunc("fmod")(xp)
    # float32 compiled where numba is installed, bit for bit numpy's
    return _jitbroadcast.compiled_fmod(kernel) if xp is np else kernel


@builtin("floor_divide")
def _floor_divide(xp: ModuleType) -> Callable[..., None]:
    return _compiled_int32("floor_divide", xp, _quiet_ufunc("floor_divide")(xp))


# Variadic folds of a ufunc: name, ufunc, fusion.
for _name, _func, _fusion in (
    ("max", "maximum", _numpy_only("max")),
    ("min", "minimum", _numpy_only("min")),
):
    builtin(_name, fusion=_fusion)(_variadic(_func))
