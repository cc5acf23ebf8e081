"""The serving package's public names."""

from __future__ import annotations

import asyncrt
import asyncrt.serving


def test_public_names() -> None:
    assert asyncrt.serving.__all__ == (
        "BatchRecord",
        "BatchStats",
        "Batcher",
        "Clock",
        "LoopClock",
        "Padding",
        "Percentiles",
    )
    for name in asyncrt.serving.__all__:
        assert getattr(asyncrt.serving, name).__module__.startswith("asyncrt.serving")
    assert asyncrt.Batcher is asyncrt.serving.Batcher
    assert asyncrt.Padding is asyncrt.serving.Padding
    assert {"Batcher", "Padding", "serving"} <= set(asyncrt.__all__)
