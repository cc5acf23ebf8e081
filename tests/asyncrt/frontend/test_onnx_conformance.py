"""ONNX's own backend node tests, for every operator asyncrt supports.

Each case imports ONNX's test model, runs it on ``cpu`` and compares with
ONNX's expected outputs and tolerances. Cases asyncrt refuses on purpose
(dtypes it does not store, training mode) must fail with a clear import-time
error, never a wrong answer: their tests check exactly that.
"""

from __future__ import annotations

import pytest
from onnx.backend.test.case.test_case import TestCase

from asyncrt.errors import GraphError

from .conformance import applicable_cases, expected_failure, run_case

pytestmark = [
    # IEEE results that ONNX defines, such as log(0) = -inf, are the
    # point of some cases; numpy warns about them.
    pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning"),
]


@pytest.mark.parametrize("case", applicable_cases(), ids=lambda case: case.name)
def test_node(case: TestCase) -> None:
    reason = expected_failure(case)
    if reason is None:
        run_case(case)
        return
    # Refused on purpose: a clear import-time error, never a wrong answer.
    with pytest.raises(GraphError):
        run_case(case)
