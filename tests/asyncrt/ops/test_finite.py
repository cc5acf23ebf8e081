"""``bind_all_finite``: the check that sends a pooling matrix's or a banded
matmul's non-finite inputs to their exact paths, compiled for float32."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrt.ops import _jit
from asyncrt.ops._common import bind_all_finite


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_it_sees_every_nan_and_infinity_after_binding(
    compiled: bool, dtype: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    if compiled:
        pytest.importorskip("numba")
    monkeypatch.setattr(_jit, "enabled", compiled)
    x = np.random.default_rng(0).standard_normal((2, 3, 17)).astype(dtype)
    finite = bind_all_finite(x)
    assert finite()
    for where in [(0, 0, 0), (1, 2, 16), (1, 0, 5)]:  # first, last, inside
        for value in (np.nan, np.inf, -np.inf):
            x[where] = value  # the values at the call count, not at bind
            assert not finite()
        x[where] = np.finfo(dtype).max
        assert finite()
    strided = np.zeros((4, 6), dtype)[:, ::2]
    strided[3, 2] = np.nan
    assert not bind_all_finite(strided)()
