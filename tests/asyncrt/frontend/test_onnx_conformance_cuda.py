"""ONNX's backend node tests again, on ``cuda:0`` (cupy kernels); skips
cleanly without cupy and a GPU. Every case that must pass on cpu must pass
here, with ONNX's own tolerances, but those of the narrow dtypes (bfloat16,
float8, 4-bit, ...): cupy has no dtypes for them, only host arrays store
them."""

from __future__ import annotations

import pytest
from onnx.backend.test.case.test_case import TestCase

from devices import Device

from .conformance import applicable_cases, expected_failure, host_only, run_case

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning"),
]

pytest.importorskip("cupy")
if not Device("cuda", 0).exist:
    pytest.skip("no CUDA device", allow_module_level=True)


@pytest.mark.parametrize(
    "case",
    [
        case
        for case in applicable_cases()
        if expected_failure(case) is None and not host_only(case)
    ],
    ids=lambda case: case.name,
)
def test_node_on_cuda(case: TestCase) -> None:
    run_case(case, "cuda:0")
