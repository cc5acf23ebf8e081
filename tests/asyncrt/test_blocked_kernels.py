"""Activations computed in SIMD passes block by block (asyncrt.ops._blocks)
and as compiled selects: equal to their float64 definitions, NaN and
infinities included, over one block, many blocks with a short tail, strided
and broadcast arrays."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from asyncrt import Bindable, ops
from asyncrt.ops._blocks import BLOCK, bind_blocks
from asyncrt.ops._kernels import global_namespace_func

F64 = np.float64


def _kernel(name: str, attrs: dict[str, Any] | None = None) -> Any:
    func = name if attrs is None else ops.register_op_kernel(name, attrs)
    kernel = global_namespace_func(func, "numpy")
    assert kernel is not None
    return kernel


def _run(kernel: Any, *arrays: np.ndarray) -> None:
    if isinstance(kernel, Bindable):
        kernel.bind(*arrays)()
    else:
        kernel(*arrays)


def _data(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).uniform(-4, 4, shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[:10] = [np.nan, np.inf, -np.inf, 0.0, -0.0, -1e-30, -100, 100, -20, 30]
    return x


def _elu(alpha: float, gamma: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda a: gamma * np.where(a > 0, a, alpha * np.expm1(a))


CASES: dict[str, tuple[str, dict[str, Any] | None, Callable[[np.ndarray], Any]]] = {
    "elu": ("elu", {"alpha": 0.7, "gamma": 1.0}, _elu(0.7, 1.0)),
    "selu": ("elu", {"alpha": 1.67, "gamma": 1.05}, _elu(1.67, 1.05)),
    "celu": (
        "celu",
        {"alpha": 1.3},
        lambda a: np.maximum(0, a) + np.minimum(0, 1.3 * np.expm1(a / 1.3)),
    ),
    "softplus": ("softplus", None, lambda a: np.logaddexp(a, 0)),
    "mish": ("mish", None, lambda a: a * np.tanh(np.logaddexp(a, 0))),
    "thresholded_relu": (
        "thresholded_relu",
        {"alpha": 0.5},
        lambda a: np.where(a > 0.5, a, 0),
    ),
    "shrink": (
        "shrink",
        {"lambd": 0.5, "bias": 0.25},
        lambda a: np.where(a < -0.5, a + 0.25, np.where(a > 0.5, a - 0.25, 0)),
    ),
}
SHAPES = [(3, 5), (1, 16, 384), (3 * BLOCK + 17,)]


def _check(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    # float32 rounding of a few passes: within 4 ulps of the float64 value
    np.testing.assert_allclose(got[finite], want[finite], rtol=5e-7, atol=1e-37)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_activation_equals_its_definition(
    case: str, shape: tuple[int, ...], compiled: bool, monkeypatch: Any
) -> None:
    # numba: compiled passes around numpy's exp/expm1/log1p; without it,
    # numpy's passes in blocks.
    from asyncrt.ops import _jit

    if compiled and not _jit.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(_jit, "enabled", compiled)
    name, attrs, definition = CASES[case]
    x = _data(shape)
    out = np.full(shape, 7.0, np.float32)  # stale values must not leak
    with np.errstate(all="ignore"):
        want = definition(x.astype(F64)).astype(np.float32)
        _run(_kernel(name, attrs), x, out)
    _check(out, want)


@pytest.mark.parametrize("case", sorted(CASES))
def test_activation_of_a_strided_view(case: str) -> None:
    name, attrs, definition = CASES[case]
    base = _data((64, 2 * 700), seed=1)
    x = base[:, ::2]  # not contiguous: one whole-array pass
    out = np.empty(x.shape, np.float32)
    with np.errstate(all="ignore"):
        want = definition(x.astype(F64)).astype(np.float32)
        _run(_kernel(name, attrs), x, out)
    _check(out, want)


@pytest.mark.parametrize(
    ("shape", "slope_shape"),
    [((2, 3, 40, 50), (3, 1, 1)), ((3 * BLOCK + 5,), (3 * BLOCK + 5,)), ((4, 9), (9,))],
    ids=str,
)
def test_prelu_per_channel_and_elementwise_slopes(
    shape: tuple[int, ...], slope_shape: tuple[int, ...]
) -> None:
    x = _data(shape, seed=2)
    slope = np.random.default_rng(3).uniform(-1, 2, slope_shape).astype(np.float32)
    out = np.empty(shape, np.float32)
    with np.errstate(all="ignore"):
        _run(_kernel("prelu"), x, slope, out)
        want = np.where(x >= 0, x, x * slope)
    # the same float32 product, exactly; zeros may differ in sign only
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("slope_shape", [(9, 300), (300,), (1,)], ids=str)
def test_compiled_prelu_is_the_block_passes_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, slope_shape: tuple[int, ...]
) -> None:
    from asyncrt.ops import _jit

    if not _jit.available():
        pytest.skip("numba not installed")
    x = _data((9, 300), seed=4)
    x[0, :6] = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan]
    slope = np.random.default_rng(5).uniform(-1, 2, slope_shape).astype(np.float32)
    slope.reshape(-1)[:2] = [np.inf, np.nan][: slope.size]
    got, want = np.empty_like(x), np.empty_like(x)
    with np.errstate(all="ignore"):
        _run(_kernel("prelu"), x, slope, got)
        monkeypatch.setattr(_jit, "enabled", False)
        _run(_kernel("prelu"), x, slope, want)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_bound_blocks_run_again_on_new_values_with_their_own_scratch() -> None:
    size = 2 * BLOCK + 3
    a = np.zeros(size, np.float32)
    out = np.zeros(size, np.float32)
    seen: list[int] = []

    def body(src: np.ndarray, dst: np.ndarray, scratch: np.ndarray) -> None:
        seen.append(src.size)
        np.multiply(src, 2, out=scratch)
        np.add(scratch, 1, out=dst)

    run = bind_blocks(np, body, (a,), out, scratch=1)
    for value in (1.0, -3.0):
        a[...] = value
        seen.clear()
        run()
        np.testing.assert_array_equal(out, 2 * value + 1)
    assert seen == [BLOCK, BLOCK, 3]


@pytest.mark.parametrize(
    ("cond", "a", "b", "dtype"),
    [
        ((8, 128, 96), (8, 128, 96), (8, 128, 96), np.float32),  # whole
        ((100, 100), (4, 8, 100, 100), (), np.float32),  # causal mask, -inf
        ((1, 1, 100, 100), (4, 8, 100, 100), (1,), np.float32),
        ((256,), (3, 256), (3, 256), np.float64),  # a row
        ((), (), (), np.float32),  # scalars
        ((5, 7), (5, 7), (), np.int64),
        ((3, 1), (3, 4), (3, 4), np.float32),  # a column: numpy's kernel
        ((4,), (3, 4), (2, 3, 4), np.float32),  # b alone makes the shape
    ],
    ids=str,
)
def test_where_selects_as_numpy_for_every_broadcast(
    cond: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...], dtype: Any
) -> None:
    rng = np.random.default_rng(4)
    c = rng.random(cond) > 0.5
    x = rng.standard_normal(a).astype(dtype)
    y = np.full(b, -np.inf if dtype == np.float32 else -7).astype(dtype)
    if dtype == np.float32 and x.size > 2:
        x.reshape(-1)[:2] = [np.nan, -0.0]
    want = np.where(c, x, y)
    out = np.full(want.shape, 3, dtype)
    _run(_kernel("where"), c, x, y, out)
    np.testing.assert_array_equal(out, want)
    assert np.array_equal(np.signbit(out), np.signbit(want))


@pytest.mark.parametrize("shape", [(3, 7), (300, 768), (2, 5, 384)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("compiled", [True, False])
def test_layer_norm_in_rows_equals_its_definition(
    shape: tuple[int, ...], bias: bool, compiled: bool, monkeypatch: Any
) -> None:
    # Compiled (one loop per row), or numpy's passes in blocks of rows:
    # both within float32 rounding of the definition, the statistics too,
    # and a NaN stays in its row.
    from asyncrt.ops import _jit

    if compiled and not _jit.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(_jit, "enabled", compiled)
    attrs = {"axis": -1, "epsilon": 1e-5, "bias": bias, "stats": 2}
    kernel = _kernel("layer_norm", attrs)
    rng = np.random.default_rng(6)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    x.reshape(-1, shape[-1])[1, 2] = np.nan
    width = shape[-1]
    scale, shift = rng.standard_normal((2, width)).astype(np.float32)
    rows = x.size // width
    y = np.empty_like(x)
    mean = np.empty((*shape[:-1], 1), np.float32)
    inv = np.empty_like(mean)
    args = (x, scale, *((shift,) if bias else ()), y, mean, inv)
    _run(kernel, *args)
    wide = x.astype(F64).reshape(rows, width)
    centre = wide.mean(axis=1, keepdims=True)
    std = np.sqrt(((wide - centre) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    want = (wide - centre) / std * scale + (shift if bias else 0)
    got = y.reshape(rows, width)
    assert np.isnan(got[1]).all() and not np.isnan(np.delete(got, 1, axis=0)).any()
    keep = np.arange(rows) != 1
    np.testing.assert_allclose(got[keep], want[keep], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        mean.reshape(-1)[keep], centre[keep, 0], rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(inv.reshape(-1)[keep], 1 / std[keep, 0], rtol=1e-5)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("axis", [0, 1, -2])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize(
    ("dtype", "shape"),
    [(np.float32, (5, 9, 70)), (np.int32, (5, 9, 70)), (np.float64, (3, 64, 2))],
)
def test_cumsum_by_slices_equals_numpys_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch,
    axis: int,
    exclusive: bool,
    reverse: bool,
    dtype: Any,
    shape: tuple[int, ...],
    compiled: bool,
) -> None:
    # Along an axis other than the last: one compiled loop, or one vector
    # add per step without numba, in numpy's order of additions, so its
    # exact values (NaN, infinities and integer wrap-around included).
    from asyncrt.ops import _jit, reduce

    if not compiled:
        monkeypatch.setattr(reduce, "_compiles_cumsum", lambda a, out: False)
        monkeypatch.setattr(reduce, "CUMSUM_MIN_SLICE", 1)
    elif not _jit.available():
        pytest.skip("numba not installed")
    rng = np.random.default_rng(7)
    a = (rng.standard_normal(shape) * 100).astype(dtype)
    if dtype == np.int32:
        a[0, 0, 0] = np.iinfo(np.int32).max  # wraps around, as numpy's
    else:
        a[1, 2, 1] = np.nan
        a[2, 1, 0] = np.inf
    attrs = {"axis": axis, "exclusive": exclusive, "reverse": reverse}
    out = np.full(a.shape, 5, dtype)
    _run(_kernel("cumsum", attrs), a, out)
    source = np.flip(a, axis) if reverse else a
    total = np.cumsum(source, axis=axis, dtype=dtype)
    if exclusive:
        total = np.concatenate(
            [
                np.zeros_like(np.take(total, [0], axis=axis)),
                np.delete(total, -1, axis=axis),
            ],
            axis=axis,
        )
    want = np.flip(total, axis) if reverse else total
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("size", [1, 4, 5, 9])
@pytest.mark.parametrize("shape", [(2, 7, 6, 5), (1, 10), (3, 16, 40)], ids=str)
def test_lrn_bound_per_image_equals_the_window_view(
    size: int, shape: tuple[int, ...]
) -> None:
    # Shifted adds per image, in the window's order: the values of the
    # sliding-window kernel bit for bit, bound once and run on new values.
    kernel = _kernel("lrn", {"alpha": 1e-3, "beta": 0.75, "bias": 2.0, "size": size})
    x = np.zeros(shape, np.float32)
    out, want = np.empty_like(x), np.empty_like(x)
    run = kernel.bind(x, out)
    for seed in (8, 9):
        x[...] = np.random.default_rng(seed).standard_normal(shape) * 10
        run()
        kernel(x, want)
        np.testing.assert_array_equal(out, want)
    channels = shape[1]
    padded = np.pad(
        x.astype(F64) ** 2,
        [(0, 0), ((size - 1) // 2, size // 2)] + [(0, 0)] * (x.ndim - 2),
    )
    sums = sum(padded[:, k : k + channels] for k in range(size))
    np.testing.assert_allclose(out, x / (2.0 + 1e-3 / size * sums) ** 0.75, rtol=2e-6)


@pytest.mark.parametrize("beta", [0.75, 0.6])
@pytest.mark.parametrize("threads", [1, 3])
def test_lrn_over_many_blocks_and_threads(
    beta: float, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2 images of 600 positions: blocks of 256 and a partial one, split
    # over threads (the compiled pass serves beta 0.75, numpy the rest)
    from asyncrt.ops import _jitlrn
    from asyncrt.runtime import _threads

    monkeypatch.setattr(_threads.limits, "compiled_threads", threads)
    monkeypatch.setattr(_jitlrn, "MIN_ELEMENTS_PER_THREAD", 1000)
    attrs = {"alpha": 2e-2, "beta": beta, "bias": 1.0, "size": 5}
    kernel = _kernel("lrn", attrs)
    x = np.random.default_rng(3).standard_normal((2, 8, 20, 30)).astype(np.float32)
    x[0, 3, 0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    out, want = np.empty_like(x), np.empty_like(x)
    kernel.bind(x, out)()
    with np.errstate(all="ignore"):
        kernel(x, want)
    np.testing.assert_array_equal(out, want)
    sums = np.pad(x.astype(F64) ** 2, [(0, 0), (2, 2), (0, 0), (0, 0)])
    sums = sum(sums[:, k : k + 8] for k in range(5))
    with np.errstate(all="ignore"):
        exact = x / (1.0 + 2e-2 / 5 * sums) ** beta
    finite = np.isfinite(exact)
    np.testing.assert_allclose(out[finite], exact[finite], rtol=2e-6)
    assert np.isnan(out[0, 3, 0, :3]).all()  # NaN and inf/inf in the window


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [2, 2], "strides": [2, 2]},
        {"kernel_shape": [3, 2], "strides": [1, 3], "pads": [0, 1, 2, 0]},
        {"kernel_shape": [5, 5], "strides": [1, 1], "pads": [2, 2, 2, 2]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "dilations": [2, 2]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    ],
    ids=lambda a: "-".join(f"{k}{v}" for k, v in a.items()),
)
@pytest.mark.parametrize("pool", ["max_pool", "avg_pool", "avg_pool_pads"])
def test_pools_on_the_planar_loop_equal_the_window_folds(
    attrs: dict[str, Any], pool: str, monkeypatch: Any
) -> None:
    # The depthwise loop with a maximum: the folds' values, NaN and
    # infinities included (pads are -inf, never a value); with unit
    # weights, the window sums (in another order: within rounding).
    from asyncrt.ops import _jit

    if not _jit.available():
        pytest.skip("numba is not installed")
    from asyncrt import ops as library
    from asyncrt.ops import _depthwise

    x = np.random.default_rng(10).standard_normal((2, 5, 33, 40)).astype(np.float32)
    x[0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
    x[1, 2] = -np.inf  # a whole plane of -inf: pads must not win
    op = library.lookup(pool.removesuffix("_pads"))
    assert op is not None
    full = {
        "auto_pad": "NOTSET",
        "indices": False,
        "storage_order": 0,
        "count_include_pad": pool.endswith("_pads"),
        "strides": [1, 1],
        "dilations": [1, 1],
        "pads": [0, 0, 0, 0],
        **{k: v for k, v in attrs.items() if k != "ceil_mode"},
    }
    kernel = op.make(np, full)
    shape = _pool_shape(x.shape, attrs)
    out, want = np.empty(shape, np.float32), np.empty(shape, np.float32)
    assert _depthwise.pools(np, x, out)  # the planar loop takes it
    kernel.bind(x, out)()
    monkeypatch.setattr(_jit, "enabled", False)
    op.make(np, full).bind(x, want)()
    if pool == "max_pool":
        np.testing.assert_array_equal(out, want)
    else:
        np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
        finite = np.isfinite(want)
        np.testing.assert_array_equal(out[~finite], want[~finite])
        np.testing.assert_allclose(out[finite], want[finite], rtol=1e-6, atol=1e-6)


def _pool_shape(shape: tuple[int, ...], attrs: dict[str, Any]) -> tuple[int, ...]:
    kernel = attrs["kernel_shape"]
    strides = attrs.get("strides", [1, 1])
    pads = attrs.get("pads", [0, 0, 0, 0])
    dilations = attrs.get("dilations", [1, 1])
    spatial = []
    for axis in range(2):
        reach = (kernel[axis] - 1) * dilations[axis] + 1
        room = shape[2 + axis] + pads[axis] + pads[axis + 2] - reach
        steps = (
            -(-room // strides[axis])
            if attrs.get("ceil_mode")
            else room // strides[axis]
        )
        spatial.append(steps + 1)
    return (*shape[:2], *spatial)


def test_softmax_in_blocks_of_rows_equals_its_definition(monkeypatch: Any) -> None:
    # Blocks of rows each choose their own path (bounded, masked, shifted):
    # every row is the definition's, whichever block it falls in.
    from asyncrt.ops import _builtin

    monkeypatch.setattr(_builtin, "SOFTMAX_BLOCK", 64)  # 4 rows of 16 a block
    a = (np.random.default_rng(11).standard_normal((3, 7, 16)) * 10).astype(np.float32)
    a[0, 1, :3] = -np.inf  # masked scores in one block
    a[1, 2, 4] = 200.0  # a row that needs the shift in another
    a[2, 5, 0] = np.nan  # a NaN row stays NaN, alone
    out = np.empty_like(a)
    _builtin.bind_softmax_last_axis(a, out)()
    wide = a.astype(F64)
    e = np.exp(wide - wide.max(axis=-1, keepdims=True))
    want = e / e.sum(axis=-1, keepdims=True)
    assert np.isnan(out[2, 5]).all()
    keep = ~np.isnan(want)
    np.testing.assert_allclose(out[keep], want[keep], rtol=1e-5, atol=1e-7)
    assert not np.isnan(np.delete(out.reshape(-1, 16), 2 * 7 + 5, axis=0)).any()


def _c_division(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C's truncating integer division, in Python integers (0 for / 0)."""
    flat = [
        0 if y == 0 else abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
        for x, y in zip(a.reshape(-1).tolist(), b.reshape(-1).tolist(), strict=True)
    ]
    return np.array(flat, np.int64).astype(np.int32).reshape(a.shape)


@pytest.mark.parametrize("name", ["trunc_divide", "floor_divide", "mod"])
@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((3, 4000), (3, 4000)), ((3, 4000), ()), ((7, 5), (5,))],
    ids=str,
)
def test_int32_division_equals_numpys(
    name: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]
) -> None:
    # The float64 quotient truncated or floored: numpy's integers exactly,
    # zero divisors (0), INT_MIN / -1 (wraps) and every sign included.
    rng = np.random.default_rng(12)
    low, high = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    a = rng.integers(low, high, a_shape, dtype=np.int32, endpoint=True)
    b = rng.integers(-50, 50, b_shape, dtype=np.int32, endpoint=True)
    a.reshape(-1)[:6] = [low, low, high, -7, 7, 0]
    if b.ndim and b.size > 6:
        b.reshape(-1)[:6] = [-1, 0, -1, 2, -2, 0]
        b.reshape(-1)[6:20] = rng.integers(low, high, 14, dtype=np.int32)
    out = np.full(np.broadcast_shapes(a_shape, b_shape), 9, np.int32)
    _run(_kernel(name), a, b, out)
    wide_a, wide_b = np.broadcast_arrays(a, b)
    with np.errstate(all="ignore"):
        if name == "trunc_divide":
            want = _c_division(wide_a, wide_b)
        elif name == "floor_divide":
            want = np.floor_divide(a, b)
        else:
            want = np.remainder(a, b)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 4, 30, 70)], ids=str)
@pytest.mark.parametrize("compiled", [True, False])
def test_instance_norm_equals_its_definition(
    shape: tuple[int, ...], compiled: bool, monkeypatch: Any
) -> None:
    # One compiled loop per plane (its channel's scale and shift) or the
    # passes: within float32 rounding, a NaN confined to its plane.
    from asyncrt.ops import _jit

    if compiled and not _jit.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(_jit, "enabled", compiled)
    rng = np.random.default_rng(13)
    x = (rng.standard_normal(shape) * 3 + 2).astype(np.float32)
    x[1, 2].reshape(-1)[0] = np.nan
    scale, shift = rng.standard_normal((2, shape[1])).astype(np.float32)
    out = np.empty_like(x)
    _run(_kernel("instance_norm", {"epsilon": 1e-5}), x, scale, shift, out)
    wide = x.astype(F64).reshape(shape[0], shape[1], -1)
    centred = wide - wide.mean(axis=2, keepdims=True)
    std = np.sqrt((centred**2).mean(axis=2, keepdims=True) + 1e-5)
    want = (centred / std * scale[:, None] + shift[:, None]).reshape(shape)
    assert np.isnan(out[1, 2]).all()
    out[1, 2] = want[1, 2] = 0
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_float32_to_float16_bits_equal_numpys() -> None:
    # numpy's software conversion, bit for bit (exhaustively checked once,
    # 2**32 values): here a sweep of every 1021st pattern, every pattern
    # around the subnormal and overflow edges, NaN payloads and signs.
    from asyncrt.ops import _jit

    if not _jit.available():
        pytest.skip("numba is not installed")
    edges = [
        np.arange(base - (1 << 16), base + (1 << 16), dtype=np.int64)
        for base in (0x33000000, 0x38800000, 0x477FF000, 0x7F800000)
    ]
    sweep = np.arange(0, 1 << 32, 1021, dtype=np.int64)
    bits = np.concatenate([sweep, *edges]).astype(np.uint32)
    bits = np.concatenate([bits, bits | np.uint32(0x80000000)])
    a = bits.view(np.float32)
    out = np.empty(a.shape, np.float16)
    run = _kernel("cast").bind(a, out)
    run()
    with np.errstate(all="ignore"):
        want = a.astype(np.float16)
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("divisor", ["whole", "scalar"])
def test_float32_fmod_equals_numpys_bit_for_bit(divisor: str) -> None:
    # The float64 quotient's remainder where it is exact, libm's fmodf for
    # the rest: numpy's bits on random bit patterns (huge quotients, NaN,
    # infinities, zeros), quotients one ulp from integers, every special pair.
    rng = np.random.default_rng(14)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    b = rng.uniform(0.1, 10, 50_000).astype(np.float32)
    multiples = (rng.integers(-(2**24), 2**24, b.size).astype(np.float32) * b).astype(
        np.float32
    )
    near = [
        multiples,
        *(np.nextafter(multiples, np.float32(d)) for d in (np.inf, -np.inf)),
    ]
    specials = np.array(
        [0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38, 1, -1], np.float32
    )
    a_special, b_special = (m.ravel() for m in np.meshgrid(specials, specials))
    a = np.concatenate([bits.view(np.float32), *near, a_special])
    if divisor == "whole":
        other = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
        d = np.concatenate([other.view(np.float32), b, b, b, b_special])
    else:
        d = np.array(0.37, np.float32)
    out = np.empty(a.shape, np.float32)
    _run(_kernel("fmod"), a, d, out)
    with np.errstate(all="ignore"):
        want = np.fmod(a, d)
    same = (out.view(np.uint32) == want.view(np.uint32)) | (
        np.isnan(out) & np.isnan(want)
    )
    assert same.all(), np.flatnonzero(~same)[:5]


@pytest.mark.parametrize("count", [10, 500])
def test_gather_checks_its_indices_once_and_copies_rows(count: int) -> None:
    # Many indices: checked here, then numpy's unbuffered copy (negative
    # ones count from the end); an index out of range raises on both paths.
    rng = np.random.default_rng(15)
    table = rng.standard_normal((50, 8)).astype(np.float32)
    ids = rng.integers(-50, 50, count)
    out = np.empty((count, 8), np.float32)
    kernel = _kernel("gather", {"axis": 0})
    _run(kernel, table, ids, out)
    np.testing.assert_array_equal(out, table[ids])
    for bad in (50, -51):
        ids[count // 2] = bad
        with pytest.raises(IndexError, match=f"index {bad} is out of bounds"):
            _run(kernel, table, ids, out)
