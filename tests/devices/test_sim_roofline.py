"""Sim devices as rooflines: the bytes a call is passed, counted once each."""

from __future__ import annotations

import math

import numpy as np
import pytest

from devices.sim import SimConfig, _arrays_nbytes


def test_compute_seconds_is_a_roofline() -> None:
    config = SimConfig(flops=100.0, memory_bandwidth=10.0, launch_overhead=0.5)
    assert config.compute_seconds(1000.0) == 0.5 + 10.0
    assert config.compute_seconds(1000.0, 50) == 0.5 + 10.0
    assert config.compute_seconds(1000.0, 500) == 0.5 + 50.0
    assert SimConfig(flops=100.0).compute_seconds(1000.0, 10**9) == 10.0
    assert SimConfig().memory_bandwidth == math.inf
    with pytest.raises(ValueError, match="memory_bandwidth"):
        SimConfig(memory_bandwidth=0.0)


def test_a_buffer_passed_twice_is_counted_once() -> None:
    a = np.zeros(4, dtype=np.float32)
    b = np.zeros(3, dtype=np.float64)
    assert _arrays_nbytes((a, a, b, "not an array")) == 16 + 24
    assert _arrays_nbytes((a[:2], a)) == 8 + 16  # a view of part: its own size
