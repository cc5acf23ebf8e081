"""Max pooling too large for a binding's own scratch borrows the thread's:
the same bits as the plain call, run after run, with the thread's scratch
left dirty by other kernels in between (the pads are filled each call)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _common, _scratch, register_op_kernel
from asyncrt.ops._kernels import global_namespace_func

CASES = [
    # x shape, kernel, strides, pads
    ((1, 4, 12, 11), [3, 3], [2, 2], [1, 1, 1, 1]),
    ((2, 3, 9, 10), [2, 3], [1, 2], [0, 1, 1, 0]),
    ((1, 2, 13), [4], [3], [2, 1]),
    ((1, 2, 6, 7, 5), [2, 2, 3], [2, 1, 2], [1, 0, 1, 0, 1, 1]),
]


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize(("shape", "kernel", "strides", "pads"), CASES)
def test_borrowed_max_pool_matches_the_plain_call(
    monkeypatch: pytest.MonkeyPatch,
    shape: tuple[int, ...],
    kernel: list[int],
    strides: list[int],
    pads: list[int],
    dtype: Any,
) -> None:
    monkeypatch.setattr(_common, "BOUND_SCRATCH_BYTES", 0)
    rank = len(kernel)
    attrs = {
        "kernel_shape": kernel,
        "strides": strides,
        "dilations": [1] * rank,
        "pads": pads,
        "auto_pad": "NOTSET",
        "indices": False,
        "storage_order": 0,
    }
    pool = global_namespace_func(register_op_kernel("max_pool", attrs), "numpy")
    assert pool is not None
    out_spatial = [
        (s + pads[a] + pads[rank + a] - kernel[a]) // strides[a] + 1
        for a, s in enumerate(shape[2:])
    ]
    rng = np.random.default_rng(0)
    x = np.zeros(shape, dtype)
    out = np.zeros((*shape[:2], *out_spatial), dtype)
    bound = pool.bind(x, out)  # type: ignore[attr-defined]
    for _ in range(3):
        # All negative: a pad left at zero by the last call would win.
        x[...] = -1 - np.abs(rng.standard_normal(shape) * 100).astype(dtype)
        want = np.zeros_like(out)
        pool(x, want)
        _scratch.borrow(((1 << 16,),), np.dtype(np.float32))[0].fill(0)
        out[...] = 0
        bound()
        np.testing.assert_array_equal(out, want)
    assert (out < 0).all()
