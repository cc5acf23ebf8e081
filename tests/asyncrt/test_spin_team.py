"""The spinning team under native launches: helpers that slept are woken,
a launch never waits for a helper that did not take a seat, a held team
sends a launch to OpenMP's, and a closed team's helpers return."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _jit
from asyncrt.ops._vector_ir import CLAIMS, compile_vectors
from asyncrt.runtime import _native_team, _spin_team

from .test_native_team import _SOURCE as MARK

pytestmark = pytest.mark.skipif(
    not _jit.available() or _spin_team.team(1) is None,
    reason="no spinning team here (numba, Linux on x86-64)",
)

# data's slots: entered, the callers to wait for, spins before giving up,
# whether every caller was seen. Each caller counts itself in, then waits
# (a bounded while) until the others have: two callers are two threads.
_SOURCE = """
{claims}

_I64 = ir.IntType(64)


@intrinsic
def seen_(typingctx, data):
    # slot 0, read atomically (a plain load could be hoisted out of the loop)
    sig = types.int64(types.voidptr)

    def codegen(context, builder, signature, args):
        slot = builder.bitcast(args[0], _I64.as_pointer())
        return builder.load_atomic(slot, "seq_cst", 8)

    return sig, codegen


@team_kernel
def meet(data):
    d = numba.carray(slots_(data), 4)
    claim_(data)
    spins = 0
    while seen_(data) < d[1] and spins < d[2]:
        spins += 1
    if seen_(data) >= d[1]:
        d[3] = 1
"""


#: Rounds a caller waits for the other at most (seconds of them: a loaded
#: CI machine may run a thread late; a helper that never comes fails the
#: test instead of hanging it).
PATIENCE = 2 * 10**10


def _meet() -> Any:
    kernel: Any = compile_vectors("test_spin_team", _SOURCE, "meet", claims=CLAIMS)
    return kernel


def test_a_sleeping_helper_is_woken_and_takes_its_seat() -> None:
    team = _spin_team.team(1)
    assert team is not None
    kernel = _meet()
    for _ in range(3):
        # past the helpers' spin: asleep on the futex
        time.sleep(0.05)
        data = np.array([0, 2, PATIENCE, 0], np.int64)
        assert team.launch(int(kernel.address), data.ctypes.data, 2)
        assert data[3] == 1 and data[0] == 2


def test_a_launch_does_not_wait_for_a_helper_without_a_seat() -> None:
    """Three seats for one helper: the caller meets the helper and returns
    without the seat no one took."""
    team = _spin_team.team(1)
    assert team is not None
    assert len(team.threads) >= 1
    kernel = _meet()
    data = np.array([0, 2, PATIENCE, 0], np.int64)
    seats = len(team.threads) + 3
    assert team.launch(int(kernel.address), data.ctypes.data, seats)
    assert data[3] == 1 and 2 <= data[0] <= len(team.threads) + 1


def test_a_held_team_sends_the_launch_to_openmp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    team = _spin_team.team(1)
    assert team is not None
    kernel = _meet()
    run = _native_team.launcher(int(kernel.address))
    launched: list[int] = []
    monkeypatch.setattr(
        _native_team, "_parallel", lambda *args: launched.append(args[2])
    )
    busy = team._state[_spin_team._BUSY :][:1]
    busy[0] = 1  # another launch holds it
    try:
        data = np.array([0, 1, 0, 0], np.int64)
        assert not team.launch(int(kernel.address), data.ctypes.data, 2)
        assert data[0] == 0  # nothing ran
        run(data.ctypes.data, 2)
        assert launched == [2]
    finally:
        busy[0] = 0
    data = np.array([0, 1, 0, 0], np.int64)
    run(data.ctypes.data, 2)
    assert launched == [2] and data[3] == 1


def test_a_closed_teams_helpers_return() -> None:
    team = _spin_team.SpinTeam(2)
    kernel = _meet()
    data = np.array([0, 2, PATIENCE, 0], np.int64)
    assert team.launch(int(kernel.address), data.ctypes.data, 2)
    assert data[3] == 1
    time.sleep(0.05)  # one asleep, one spinning or asleep
    team.close()
    for thread in team.threads:
        thread.join(timeout=5.0)
    assert not any(thread.is_alive() for thread in team.threads)
    with pytest.raises(ValueError, match="helper"):
        _spin_team.SpinTeam(0)


def test_many_launches_take_every_part_once() -> None:
    """Launches back to back, with and without a pause between them (the
    helpers spinning, or asleep), each part taken exactly once."""
    team = _spin_team.team(1)
    assert team is not None
    kernel: Any = compile_vectors("test_native_team", MARK, "mark", claims=CLAIMS)
    rng = np.random.default_rng(5)
    cells = np.zeros(37, np.float32)
    data = np.array([0, 37, cells.ctypes.data], np.int64)
    for launch in range(400):
        data[0] = 0
        assert team.launch(int(kernel.address), data.ctypes.data, 2)
        if launch % 97 == 0:
            time.sleep(float(rng.uniform(0, 0.003)))
    np.testing.assert_array_equal(cells, 400 * np.arange(1, 38))
