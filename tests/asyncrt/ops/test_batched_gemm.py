"""Stacks of small products over strided views (``_batched_gemm``):
attention's ``Q K^T`` and ``P V`` as the ONNX import leaves them (views of
the head splits), against float64 matmuls, split over threads or not;
NaN's reach; what it refuses; and ``matmul_views`` binding it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _batched_gemm, lookup

from .team_split import split_everywhere

pytest.importorskip("numba")


def _views(
    a: np.ndarray[Any, Any],
    b: np.ndarray[Any, Any],
    out: np.ndarray[Any, Any],
    perms: tuple[Any, Any, Any],
) -> tuple[Any, Any, Any]:
    pa, pb, po = perms
    left = a if pa is None else a.transpose(pa)
    right = b if pb is None else b.transpose(pb)
    result = out if po is None else out.transpose(np.argsort(po))
    return left, right, result


# (batch, sequence, heads, head size): widths masked (9, 5, 20) and whole
# (16, 32); rows in blocks and alone
SIZES = [(2, 9, 3, 5), (1, 16, 2, 32), (3, 20, 1, 16)]
QK = ([0, 2, 1, 3], [0, 2, 3, 1], None)  # Q K^T: K's rows strided, copied
PV = (None, [0, 2, 1, 3], [0, 2, 1, 3])  # P V: V read where it is


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("product", ["qk", "pv"])
def test_attention_products_match_float64(
    monkeypatch: pytest.MonkeyPatch,
    split: bool,
    sizes: tuple[int, int, int, int],
    product: str,
) -> None:
    if split:  # heads shared out, on the native team where it runs
        split_everywhere(monkeypatch, _batched_gemm)
    batch, seq, heads, size = sizes
    rng = np.random.default_rng(sum(sizes))
    if product == "qk":
        a = rng.standard_normal((batch, seq, heads, size)).astype(np.float32)
        b = rng.standard_normal((batch, seq, heads, size)).astype(np.float32)
        out = np.full((batch, heads, seq, seq), np.nan, np.float32)
        perms = QK
    else:
        a = rng.random((batch, heads, seq, seq)).astype(np.float32)
        b = rng.standard_normal((batch, seq, heads, size)).astype(np.float32)
        out = np.full((batch, seq, heads, size), np.nan, np.float32)
        perms = PV
    left, right, result = _views(a, b, out, perms)
    assert _batched_gemm.takes(left, right, result, (a, b, out))
    call = _batched_gemm.bind(left, right, result, (a, b, out))
    call()
    want = np.matmul(left.astype(np.float64), right.astype(np.float64))
    np.testing.assert_allclose(result, want, rtol=1e-5, atol=1e-5)
    a[...] = rng.standard_normal(a.shape)  # read anew on every call
    call()
    want = np.matmul(left.astype(np.float64), right.astype(np.float64))
    np.testing.assert_allclose(result, want, rtol=1e-5, atol=1e-5)


def test_a_stack_of_one_batch_axis() -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 7, 6)).astype(np.float32)
    b = rng.standard_normal((4, 6, 11)).astype(np.float32)
    out = np.empty((4, 7, 11), np.float32)
    assert _batched_gemm.takes(a, b, out, (a, b, out))
    _batched_gemm.bind(a, b, out, (a, b, out))()
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_nan_reaches_only_its_row_of_scores() -> None:
    q = np.ones((1, 8, 2, 4), np.float32)
    k = np.ones((1, 8, 2, 4), np.float32)
    q[0, 3, 1, 2] = np.nan  # head 1's query 3
    out = np.empty((1, 2, 8, 8), np.float32)
    left, right, result = _views(q, k, out, QK)
    _batched_gemm.bind(left, right, result, (q, k, out))()
    assert np.isnan(out[0, 1, 3]).all()
    out[0, 1, 3] = 4.0
    assert np.all(out == 4.0)


def test_what_it_refuses() -> None:
    a = np.zeros((2, 4, 8), np.float32)
    b = np.zeros((2, 8, 5), np.float32)
    out = np.zeros((2, 4, 5), np.float32)
    assert _batched_gemm.takes(a, b, out, (a, b, out))
    wide = np.zeros((2, 8, _batched_gemm.MAX_SIDE + 1), np.float32)
    wide_out = np.zeros((2, 4, _batched_gemm.MAX_SIDE + 1), np.float32)
    assert not _batched_gemm.takes(a, wide, wide_out, (a, wide, wide_out))
    doubles = [x.astype(np.float64) for x in (a, b, out)]
    assert not _batched_gemm.takes(*doubles, tuple(doubles))
    columns = np.zeros((2, 5, 4), np.float32)  # c's rows strided: refused
    view = columns.transpose(0, 2, 1)
    assert not _batched_gemm.takes(a, b, view, (a, b, columns))
    other = np.zeros_like(a)  # a view of another array than its base
    assert not _batched_gemm.takes(a, b, out, (other, b, out))


def test_matmul_views_binds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[bool] = []
    real = _batched_gemm.bind

    def spy(*args: Any) -> Any:
        taken.append(True)
        return real(*args)

    monkeypatch.setattr(_batched_gemm, "bind", spy)
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 6, 3, 4)).astype(np.float32)
    k = rng.standard_normal((2, 6, 3, 4)).astype(np.float32)
    out = np.empty((2, 3, 6, 6), np.float32)
    op = lookup("matmul_views")
    assert op is not None
    kernel = op.make(np, {"perm_a": QK[0], "perm_b": QK[1], "perm_out": None})
    call = kernel.bind(q, k, out)
    assert taken == [True]
    call()
    want = np.matmul(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 3, 1))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
