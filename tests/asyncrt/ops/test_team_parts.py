"""A compiled kernel's shares on the native team (``_team_parts``): every
share computed exactly once, per-part scratch rows and trailing integers
passed through, on the team, alone, and crowded (then on the calling
thread: a loop's shares are shorter than a pool thread's wake-up); and
the cases it leaves to the part pool."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _jit, _team_parts
from asyncrt.runtime import _native_team, _threads

pytest.importorskip("numba")

_SOURCE = """
import numba


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def kernel(x, hits, scratch, out, first, last, scale, shift):
    # rows first:last: out = x * scale + shift, through this part's scratch
    for i in range(first, last):
        for j in range(x.shape[1]):
            scratch[j] = x[i, j] * scale
        for j in range(x.shape[1]):
            out[i, j] = scratch[j] + shift
        hits[i] += 1
"""


def _kernel() -> Any:
    return _jit.compile_source("asyncrt_test_team_parts_v1", _SOURCE, "kernel")


def _arrays(rows: int, parts: int) -> tuple[Any, ...]:
    x = np.arange(rows * 5, dtype=np.float64).reshape(rows, 5)
    hits = np.zeros(rows, np.int64)
    scratch = np.full((parts, 5), np.nan)
    out = np.full((rows, 5), np.nan)
    return x, hits, scratch, out


def _shares(rows: int, parts: int) -> list[tuple[int, int]]:
    return [(rows * p // parts, rows * (p + 1) // parts) for p in range(parts)]


needs_team = pytest.mark.skipif(
    not _native_team.teams_available(), reason="no GNU OpenMP team here"
)


@needs_team
@pytest.mark.parametrize("scale", [3, 3.0])  # an int64 slot or a float64 one
@pytest.mark.parametrize(("threads", "crowding"), [(2, 1), (1, 1), (3, 1), (2, 2)])
def test_every_share_runs_once_with_its_scratch_row(
    monkeypatch: pytest.MonkeyPatch, threads: int, crowding: int, scale: float
) -> None:
    monkeypatch.setattr(_threads.limits, "threads", threads)
    monkeypatch.setattr(_threads.limits, "gemm_parts", crowding)  # >1: crowded
    rows, parts = 37, 7
    x, hits, scratch, out = _arrays(rows, parts)
    call = _team_parts.bind(
        _kernel(),
        (x, hits, scratch, out),
        _shares(rows, parts),
        frozenset({2}),
        (3, -1),
    )
    assert call is not None
    for runs in (1, 2):
        call()
        np.testing.assert_array_equal(hits, np.full(rows, runs))
        np.testing.assert_array_equal(out, x * 3 - 1)
    assert not np.isnan(scratch).any()  # each part wrote its own row


@needs_team
def test_bind_parts_takes_the_team_and_matches_the_part_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_threads.limits, "threads", 2)
    rows, parts = 20, 4
    results = []
    for team in (True, False):
        if not team:
            monkeypatch.setattr(_team_parts, "bind", lambda *args: None)
        x, hits, scratch, out = _arrays(rows, parts)
        call = _jit.bind_parts(
            _kernel(),
            (x, hits, scratch, out),
            _shares(rows, parts),
            per_part=frozenset({2}),
            trailing=(2, 5),
        )
        assert hasattr(call, "held") == team  # the team's binding holds its slots
        call()
        results.append(out)
    np.testing.assert_array_equal(results[0], results[1])


def test_what_the_slots_cannot_carry_stays_on_the_part_pool() -> None:
    rows, parts = 12, 3
    kernel, shares = _kernel(), _shares(rows, parts)
    x, hits, scratch, out = _arrays(rows, parts)
    cases = [
        ((x[:, ::2].copy(order="F"), hits, scratch, out[:, :3]), (1, 0)),  # layout
        ((x.astype(np.float16), hits, scratch, out), (1, 0)),  # dtype
        ((x, hits, scratch, out), (1, "0")),  # an argument of no slot kind
        ((x, hits, scratch[:2], out), (1, 0)),  # fewer scratch rows than shares
    ]
    for arrays, trailing in cases:
        assert (
            _team_parts.bind(kernel, arrays, shares, frozenset({2}), trailing) is None
        )
    assert (
        _team_parts.bind(
            kernel, (x, hits, scratch, out), [(0, rows)], frozenset(), (1, 0)
        )
        is None
    )


def test_shares_go_to_the_team_from_its_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_threads, "available_cores", lambda: 2)
    monkeypatch.setattr(_threads.limits, "compiled_threads", 1)
    small = _team_parts.MIN_TEAM_WORK - 1
    assert _team_parts.shares(100, small, 10**9) == [(0, 100)]
    on_team = _team_parts.shares(100, _team_parts.MIN_TEAM_WORK, 10**9)
    if _native_team.teams_available():
        # cut for every core, whatever the limits are as it binds
        assert len(on_team) == 2 * _team_parts.SHARES_PER_THREAD
        assert on_team[0][0] == 0 and on_team[-1][1] == 100
        assert all(a[1] == b[0] for a, b in itertools.pairwise(on_team))
        assert len(_team_parts.shares(100, 10**6, 10**9, per_thread=1)) == 2
        assert _team_parts.shares(3, 10**6, 10**9) == [(0, 1), (1, 2), (2, 3)]
    else:
        assert on_team == [(0, 100)]


_MASKED_SOURCE = """
import numba


@numba.njit(cache=True, nogil=True, error_model="numpy", boundscheck=False)
def masked(x, keep, out, negate, first, last, fill):
    # rows first:last: out = x where keep (or where not, with negate), else fill
    for i in range(first, last):
        for j in range(x.shape[1]):
            out[i, j] = x[i, j] if keep[i, j] != negate else fill
"""


@needs_team
@pytest.mark.parametrize("negate", [False, True])
def test_flags_and_boolean_masks_travel_in_the_slots(
    monkeypatch: pytest.MonkeyPatch, negate: bool
) -> None:
    # (attention's masked softmax takes a boolean mask and flags: on the
    # part pool it waited tens of microseconds for a pool thread to wake)
    monkeypatch.setattr(_threads.limits, "threads", 2)
    kernel = _jit.compile_source("asyncrt_test_team_masks_v1", _MASKED_SOURCE, "masked")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 6)).astype(np.float32)
    keep = rng.standard_normal((9, 6)) > 0
    out = np.full_like(x, np.nan)
    call = _team_parts.bind(
        kernel, (x, keep, out, negate), _shares(9, 3), frozenset(), (-1.5,)
    )
    assert call is not None
    call()
    np.testing.assert_array_equal(out, np.where(keep != negate, x, np.float32(-1.5)))
