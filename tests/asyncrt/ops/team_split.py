"""Tests' switch for splitting a compiled kernel's work (every share
boundary exercised on the smallest arrays), and the check that a kernel's
own activation gives the library pass's bits."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _team_parts
from asyncrt.ops._conv_epilogue import add_bias_activation
from asyncrt.runtime import _threads


def split_everywhere(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> None:
    """Make ``module``'s kernels split any work into shares over three
    threads: on the native team where it runs here, else the part pool
    (``module.MIN_WORK_PER_THREAD`` is its threshold)."""
    monkeypatch.setattr(_team_parts, "MIN_TEAM_WORK", 1)
    monkeypatch.setattr(module, "MIN_WORK_PER_THREAD", 1)
    monkeypatch.setattr(_threads.limits, "compiled_threads", 3)
    monkeypatch.setattr(_threads.limits, "threads", 3)


def assert_activation_is_the_pass(
    bind: Callable[..., Callable[[], None]],
    arrays: tuple[Any, ...],
    shape: tuple[int, ...],
    geometry: tuple[tuple[int, ...], ...],
    activation: str,
) -> None:
    """``bind(*arrays, out, *geometry, activation=activation)`` writes the
    bits of ``bind`` without it then the library's pass over ``out``."""
    x, w, b = arrays
    want = np.empty(shape, np.float32)
    bind(x, w, b, want, *geometry)()
    add_bias_activation(np, want, None, want, activation)
    out = np.full(shape, np.inf, np.float32)
    bind(x, w, b, out, *geometry, activation=activation)()
    np.testing.assert_array_equal(out, want)
