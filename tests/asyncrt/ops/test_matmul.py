"""MatMul of a stack by one matrix is one GEMM over views (numpy loops over
the stack one small GEMM at a time); every other layout keeps numpy's own
broadcasting, and both give numpy's answer, called or bound."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncrt.ops._builtin import stacked_as_one_gemm
from asyncrt.ops._kernels import global_namespace_func
from asyncrt.runtime import _threads
from scheduler.dispatch import Bindable

RNG = np.random.default_rng(7)


def _matmul() -> Bindable:
    kernel = global_namespace_func("matmul", "numpy")
    assert isinstance(kernel, Bindable)
    return kernel


def _float(*shape: int) -> np.ndarray[Any, Any]:
    return RNG.standard_normal(shape).astype(np.float32)


CASES = {
    "stack by matrix": (_float(3, 5, 8), _float(8, 6)),
    "deep stack by matrix": (_float(2, 3, 4, 8), _float(8, 6)),
    "stack by stack": (_float(3, 5, 8), _float(3, 8, 6)),
    "matrix by stack": (_float(5, 8), _float(3, 8, 6)),
    "matrix by matrix": (_float(5, 8), _float(8, 6)),
    "transposed stack by matrix": (_float(3, 8, 5).transpose(0, 2, 1), _float(8, 6)),
    "vector by matrix": (_float(8), _float(8, 6)),
    "empty stack by matrix": (_float(0, 5, 8), _float(8, 6)),
}


@pytest.mark.parametrize("bound", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_matmul_gives_numpys_product(case: str, bound: bool) -> None:
    a, b = CASES[case]
    expected = np.matmul(a, b)
    out = np.full(expected.shape, np.nan, dtype=np.float32)
    kernel = _matmul()
    if bound:
        kernel.bind(a, b, out)()
    else:
        kernel(a, b, out)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_only_contiguous_stacks_by_one_matrix_become_one_gemm() -> None:
    taken = {
        case
        for case, (a, b) in CASES.items()
        if stacked_as_one_gemm(a, b, np.empty(np.matmul(a, b).shape, a.dtype))
    }
    assert taken == {"stack by matrix", "deep stack by matrix", "empty stack by matrix"}


def test_a_bound_stack_writes_through_to_the_planned_output() -> None:
    a, b = CASES["deep stack by matrix"]
    out = np.zeros((2, 3, 4, 6), dtype=np.float32)
    call = _matmul().bind(a, b, out)
    a[...] = _float(*a.shape)  # new inputs in the same storage, as a run's
    call()
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("shape", [(400, 256, 1024), (4, 100, 256, 768)])
def test_crowded_gemms_split_in_row_blocks_and_agree(
    monkeypatch: pytest.MonkeyPatch, parts: int, shape: tuple[int, ...]
) -> None:
    """While busy neighbours crowd BLAS down to one thread, a large GEMM
    runs in row blocks over the part pool: the same product, and the same
    arrays read anew each call."""
    monkeypatch.setattr(_threads.limits, "gemm_parts", parts)
    *rows, depth, cols = shape
    a, b = _float(*rows, depth), _float(depth, cols)
    out = np.full((*rows, cols), np.nan, np.float32)
    call = _matmul().bind(a, b, out)
    call()
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)
    a[...] = _float(*rows, depth)
    call()
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-4)
