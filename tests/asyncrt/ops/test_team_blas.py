"""Stacks of GEMMs on the native team, one single-threaded BLAS call a
part: every layout BLAS reads (transposed views, broadcast stacks, heads
of attention as strided views, strided outputs) against a float64
product, on one thread, two and crowded; what it refuses; the per-call
form; the products that route through it; BLAS's own pool held to one
thread once it is in use."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import threadpoolctl

from asyncrt.ops import _builtin, _team_blas
from asyncrt.runtime import _threads

pytestmark = pytest.mark.skipif(
    not _team_blas.available(), reason="no numba or no cblas_sgemm"
)
RNG = np.random.default_rng(31)


def _f(*shape: int) -> np.ndarray[Any, Any]:
    return RNG.standard_normal(shape).astype(np.float32)


CASES = {
    "matrix": lambda: (_f(40, 30), _f(30, 50)),
    "stack": lambda: (_f(3, 40, 30), _f(3, 30, 50)),
    "stack by matrix": lambda: (_f(3, 40, 30), _f(30, 50)),
    "matrix by stack": lambda: (_f(40, 30), _f(3, 30, 50)),
    "transposed a": lambda: (_f(3, 30, 40).transpose(0, 2, 1), _f(3, 30, 50)),
    "transposed b": lambda: (_f(3, 40, 30), _f(3, 50, 30).transpose(0, 2, 1)),
    # attention: (batch, seq, heads, d) viewed as (batch, heads, ...)
    "heads": lambda: (
        _f(2, 64, 8, 16).transpose(0, 2, 1, 3),
        _f(2, 64, 8, 16).transpose(0, 2, 3, 1),
    ),
    "one row": lambda: (_f(1, 30), _f(30, 50)),
    "one column": lambda: (_f(40, 30), _f(30, 1)),
    "depth one": lambda: (_f(40, 1), _f(1, 50)),
    "tall": lambda: (_f(300, 64), _f(64, 40)),
}


def _check(out: Any, a: Any, b: Any) -> None:
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("mode", ["one thread", "two threads", "crowded"])
@pytest.mark.parametrize("strided_out", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_products_match_float64(
    monkeypatch: pytest.MonkeyPatch, mode: str, strided_out: bool, case: str
) -> None:
    monkeypatch.setattr(_threads.limits, "threads", 1 if mode == "one thread" else 2)
    monkeypatch.setattr(_threads.limits, "gemm_parts", 2 if mode == "crowded" else 1)
    monkeypatch.setattr(_team_blas, "MIN_TEAM_WORK", 0)  # (small: split anyway)
    a, b = CASES[case]()
    stack = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    shape = (*stack, a.shape[-2], b.shape[-1])
    if strided_out:  # every row of out followed by cells not its own
        wide = np.full((*shape[:-1], shape[-1] + 3), np.nan, np.float32)
        out = wide[..., : shape[-1]]
    else:
        wide = out = np.full(shape, np.nan, np.float32)
    assert _team_blas.takes(a, b, out)
    call = _team_blas.bind(a, b, out)
    call()
    _check(out, a, b)
    if strided_out:
        assert np.isnan(wide[..., shape[-1] :]).all()
    a[...] = _f(*a.shape)  # new values, the same storage: read anew
    call()
    _check(out, a, b)


def test_what_it_refuses() -> None:
    a, b, out = _f(4, 8), _f(8, 6), np.empty((4, 6), np.float32)
    assert _team_blas.takes(a, b, out)
    assert not _team_blas.takes(a.astype(np.float64), b, out)
    assert not _team_blas.takes(_f(8, 16)[::2, ::2], b, out)  # no unit stride
    assert not _team_blas.takes(a, b, np.empty((6, 4), np.float32).T)
    assert not _team_blas.takes(_f(2, 4, 8), _f(3, 8, 6), np.empty((3, 4, 6)))
    assert not _team_blas.takes(a, _f(8, 0), np.empty((4, 0), np.float32))


def test_the_per_call_form_gives_numpys_product(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_threads.limits, "threads", 2)
    for a, b in ((_f(200, 300), _f(300, 100)), (_f(3, 4), _f(4, 5))):
        out = np.full((a.shape[0], b.shape[1]), np.nan, np.float32)
        _team_blas.matmul(a, b, out=out)
        _check(out, a, b)


def test_products_of_activations_route_through_the_team(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[int, ...]] = []
    bind = _team_blas.bind

    def spy(a: Any, b: Any, out: Any) -> Any:
        seen.append(out.shape)
        return bind(a, b, out)

    monkeypatch.setattr(_team_blas, "bind", spy)
    a, b = _f(2, 5, 8), _f(2, 8, 6)
    out = np.empty((2, 5, 6), np.float32)
    _builtin.bind_matmul(np.matmul, a, b, out)()
    _check(out, a, b)
    assert seen == [(2, 5, 6)]
    seen.clear()
    _builtin.bind_matmul(np.matmul, a.astype(np.float64), b, out.astype(np.float64))
    assert seen == []  # (float64 keeps numpy)


def _blas_threads() -> int:
    info = [
        lib
        for lib in threadpoolctl.threadpool_info()
        if lib["internal_api"] == "openblas"
    ]
    return min((lib["num_threads"] for lib in info), default=0)


def test_blas_is_held_to_one_thread_while_the_team_runs_products() -> None:
    before = _blas_threads()
    if before < 2:
        pytest.skip("needs a BLAS pool of at least 2 threads")
    limits = _threads.ThreadLimits(cores=before)
    lease = limits.acquire(before, streams=1, blas=True)
    try:
        assert _blas_threads() == before and limits.threads == before
        assert limits.compiled_threads == 1  # (beside BLAS's spinning helpers)
        limits.put_blas_on_team()
        assert _blas_threads() == 1
        assert limits.threads == before  # (the team's size)
        assert limits.compiled_threads == before  # (none spins for long now)
    finally:
        lease.release()
    assert _blas_threads() == before
    lease = limits.acquire(before, streams=1)
    try:
        assert _blas_threads() == 1  # (from then on)
    finally:
        lease.release()
    assert _blas_threads() == before
