"""The kernels' quiet error state: IEEE results without warnings inside,
the caller's numpy error state untouched outside."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

from asyncrt.ops import _common
from asyncrt.ops._common import quiet


def _log_of_zero() -> float:
    return float(np.log(np.zeros(1, np.float32))[0])


@pytest.mark.parametrize("fast", [True, False], ids=["contextvar", "errstate"])
def test_quiet_gives_ieee_results_and_restores_the_callers_state(
    fast: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not fast:  # numpy 1.x: no error state variable
        monkeypatch.setattr(_common, "_QUIET_STATE", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(divide="raise"):
            with quiet(np):
                assert _log_of_zero() == -np.inf
                with quiet(np):  # nested, as kernels calling kernels
                    assert np.isnan(np.sqrt(np.float32(-1)))
                assert _log_of_zero() == -np.inf
            with pytest.raises(FloatingPointError):
                _log_of_zero()
        with pytest.raises(RuntimeWarning):  # the default state again
            _log_of_zero()


def test_quiet_restores_the_state_when_the_body_raises() -> None:
    with np.errstate(invalid="raise"):
        with pytest.raises(KeyError), quiet(np):
            raise KeyError("x")
        assert np.geterr()["invalid"] == "raise"


def test_quiet_state_is_per_thread() -> None:
    entered, release = threading.Event(), threading.Event()

    def hold_quiet() -> None:
        with quiet(np):
            entered.set()
            release.wait(5)

    thread = threading.Thread(target=hold_quiet)
    thread.start()
    entered.wait(5)
    try:
        with np.errstate(divide="raise"), pytest.raises(FloatingPointError):
            _log_of_zero()  # another thread's quiet state is not ours
    finally:
        release.set()
        thread.join()
