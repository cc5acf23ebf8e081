"""The compiled engine's exp and the activations over it
(:mod:`asyncrt.ops._jitmath`): their error against a float64 reference
over float32 values of every exponent, IEEE special values, subnormals,
and the library's float32 sigmoid and mish, which are these loops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from asyncrt import get_global_func
from asyncrt.ops import _jitmath

numba = pytest.importorskip("numba")

Array = np.ndarray[Any, Any]


def _helper(name: str) -> Callable[[Array], Array]:
    """``_jitmath``'s ``name`` as a compiled loop over a float32 array."""
    scope: dict[str, Any] = {}
    exec("\n".join(_jitmath.head()), scope)  # the helpers, as kernels get them
    scalar = scope[name]

    @numba.njit(error_model="numpy")  # type: ignore[misc]
    def loop(x: Array, out: Array) -> None:
        for i in range(x.size):
            out[i] = scalar(x[i])

    def apply(x: Array) -> Array:
        out = np.empty_like(x)
        loop(x, out)
        return out

    return apply


def _values() -> Array:
    """Float32 values spread over every exponent and sign (a stride through
    the bit patterns), with the special values."""
    bits = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-40, 1.0]
    return np.concatenate([bits.view(np.float32), np.array(special, np.float32)])


SMALLEST_NORMAL = np.finfo(np.float32).tiny


def _ulps(got: Array, want: Array) -> Array:
    """Units in the last place between float32 values of one sign, where
    the reference is finite and normal; below, results may be as far off as
    the smallest normal (the float32 formulas flush them there)."""
    tiny = np.abs(want) < SMALLEST_NORMAL
    assert np.all(np.abs(got[tiny] - want[tiny]) <= SMALLEST_NORMAL)
    keep = np.isfinite(want) & ~tiny
    a = got[keep].view(np.int32).astype(np.int64)
    b = want[keep].view(np.int32).astype(np.int64)
    return np.abs(a - b)


REFERENCES: dict[str, tuple[Callable[[Array], Array], int]] = {
    # name: (float64 reference, the most ulps allowed)
    "exp_": (np.exp, 1),
    "tanh_": (np.tanh, 2),
    "sigmoid_": (lambda x: 1 / (1 + np.exp(-x)), 2),
    "expm1_": (np.expm1, 2),
    "softplus_": (lambda x: np.logaddexp(x, 0), 3),
}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_within_a_few_ulps_of_the_exact_result(name: str) -> None:
    reference, most = REFERENCES[name]
    x = _values()
    with np.errstate(all="ignore"):
        want = reference(x.astype(np.float64)).astype(np.float32)
    got = _helper(name)(x)
    assert _ulps(got, want).max() <= most
    # NaN where the result is NaN, and the same infinities and zeros
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    edge = ~np.isnan(want) & (np.isinf(want) | (want == 0))
    np.testing.assert_array_equal(got[edge], want[edge])


def test_expm1_keeps_tiny_values_and_the_sign_of_zero() -> None:
    x = np.array([1e-30, -1e-30, 1e-8, -0.0, 0.0, -0.49999997, 0.5, -200.0], np.float32)
    got = _helper("expm1_")(x)
    want = np.expm1(x.astype(np.float64)).astype(np.float32)
    assert _ulps(got, want).max() <= 2  # both sides of the switch at 1/2
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    assert got[0] == x[0] and got[-1] == -1


def test_exp_reaches_the_subnormals_and_saturates() -> None:
    x = np.array([-87.5, -100.0, -103.9, -104.0, -200.0, 88.7, 88.8, 1e30], np.float32)
    got = _helper("exp_")(x)
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)
    # subnormal results to within one of their (wider) units
    assert np.all(np.abs(got[:3] - want[:3]) <= np.spacing(np.float32(0)))
    assert got[2] > 0 and got[3] == got[4] == 0
    assert np.isfinite(got[5]) and np.isinf(got[6]) and np.isinf(got[7])


@pytest.mark.parametrize("size", [3, 4096, 100_003])
def test_the_library_sigmoid_is_the_compiled_loop(size: int) -> None:
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(size) * 30).astype(np.float32)
    x[:1] = np.nan
    out = np.empty_like(x)
    get_global_func("sigmoid", "cpu")(x, out)
    np.testing.assert_array_equal(out, _helper("sigmoid_")(x))
    with np.errstate(over="ignore"):
        exact = 1 / (1 + np.exp(-x.astype(np.float64)))
    assert _ulps(out, exact.astype(np.float32)).max() <= 2


@pytest.mark.parametrize("size", [7, 4096, 100_003])
def test_the_library_mish_is_the_compiled_loop(size: int) -> None:
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(size) * 10).astype(np.float32)
    x[:4] = [np.nan, np.inf, -np.inf, -0.0]
    out = np.empty_like(x)
    get_global_func("mish", "cpu")(x, out)
    np.testing.assert_array_equal(out, _helper("mish_")(x))
    with np.errstate(all="ignore"):
        exact = (x * np.tanh(np.logaddexp(x.astype(np.float64), 0))).astype(np.float32)
    finite = np.isfinite(exact) & (np.abs(exact) > 1e-30)
    np.testing.assert_allclose(out[finite], exact[finite], rtol=1e-6)
    assert np.isnan(out[0]) and out[1] == np.inf and np.isnan(out[2])
    # float64 keeps numpy's passes
    wide = x.astype(np.float64)
    out64 = np.empty_like(wide)
    get_global_func("mish", "cpu")(wide, out64)
    np.testing.assert_allclose(out64[finite], exact[finite], rtol=1e-6)


@pytest.mark.parametrize("shape", [(1, 6, 16, 16), (3, 7), (1, 4096), (2, 20, 300)])
@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_softmax_rows(
    shape: tuple[int, ...], threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from asyncrt.ops import _builtin, _epijit
    from asyncrt.runtime import _threads

    # over threads; the last shape's rows take two blocks of the loop
    monkeypatch.setattr(_threads.limits, "compiled_threads", threads)
    monkeypatch.setattr(_builtin, "SOFTMAX_SPLIT_ELEMENTS", 64)
    if shape[-1] == 300:
        assert np.prod(shape) > _epijit.ROWS_BLOCK
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 8).astype(np.float32)
    rows = x.reshape(-1, shape[-1])
    special = [np.nan, np.inf, -np.inf, -3.4e38]
    for r, value in enumerate(special[: rows.shape[0] - 1]):
        rows[r + 1, 0] = value
    out = np.empty_like(x)
    _builtin.bind_softmax_last_axis(x, out)()
    wide = x.reshape(-1, shape[-1]).astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(wide - wide.max(axis=1, keepdims=True))
        exact = (e / e.sum(axis=1, keepdims=True)).reshape(shape).astype(np.float32)
    got, want = out.reshape(-1, shape[-1]), exact.reshape(-1, shape[-1])
    plain = np.isfinite(rows).all(axis=1) | (rows == np.float32(-3.4e38)).any(axis=1)
    # (tiny values carry the rounding of x - max: absolute error counts)
    np.testing.assert_allclose(got[plain], want[plain], rtol=2e-6, atol=1e-7)
    # a NaN or +inf makes its row NaN (as numpy's passes); -inf is a 0
    for r, value in enumerate(special[: rows.shape[0] - 1]):
        if value != value or value == np.inf:
            assert np.isnan(got[r + 1]).all()
        else:
            assert got[r + 1, 0] == 0 and np.isfinite(got[r + 1]).all()
    # in place, as the fused scale-and-softmax kernels bind it
    again = x.copy()
    _builtin.bind_softmax_last_axis(again, again)()
    np.testing.assert_array_equal(again, out)


@pytest.mark.parametrize("width", [7, 300])
def test_compiled_softmax_flushes_subnormal_exponentials(width: int) -> None:
    # a score 100 below its row's maximum: e^-100 is subnormal in float32
    # (3.7e-44); the shifted loops give 0 there (no subnormal products),
    # everything else within rounding
    from asyncrt.ops import _builtin

    x = np.zeros((3, width), np.float32)
    x[:, 1] = -100.0
    x[1, 2] = -87.0  # e^-87 is still normal: kept
    x[2, 0] = 200.0  # outside the unshifted loops' bound: shifted
    out = np.empty_like(x)
    _builtin.bind_softmax_last_axis(x, out)()
    assert out[0, 1] == 0 and out[1, 1] == 0 and out[2, 1] == 0
    assert out[1, 2] > 0
    with np.errstate(under="ignore"):
        e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-7)


def test_the_softmax_exponentials_are_exp_cut_to_their_range() -> None:
    # exp_'s bits where each applies: non-positive values down to the
    # flush (below it 0, not subnormal), and values within the softmax's
    # unshifted bound
    x = _values()
    low = x[(x <= 0) & (x >= -87.0)]
    np.testing.assert_array_equal(
        _helper("exp_nonpositive_")(low), _helper("exp_")(low)
    )
    below = np.array([-87.01, -100.0, -1e30, -np.inf], np.float32)
    assert (_helper("exp_nonpositive_")(below) == 0).all()
    assert np.isnan(_helper("exp_nonpositive_")(np.array([np.nan], np.float32))).all()
    bounded = x[np.abs(x) <= 64.0]
    np.testing.assert_array_equal(
        _helper("exp_bounded_")(bounded), _helper("exp_")(bounded)
    )
