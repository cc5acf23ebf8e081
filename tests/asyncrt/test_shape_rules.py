"""The builder's shape rules agree with the built-in kernels they describe."""

from __future__ import annotations

import numpy as np
import pytest

import asyncrt
from asyncrt.graph._shape_rules import CHECKED, expected_output
from devices import numpy_dtype

#: Inputs per kernel arity: shapes that broadcast, as graphs give them.
_SHAPES = {1: [(2, 3)], 2: [(2, 3), (3,)], 3: [(2, 3), (2, 3), (3,)]}
_SPECIAL = {
    "matmul": [(4, 2, 3), (3, 5)],
    "dense": [(2, 3), (5, 3)],
    "bias_add": [(2, 3), (3,)],
    "where": [(2, 3), (2, 3), (3,)],
}


def _dtype(name: str) -> str:
    if name.startswith("logical"):
        return "bool"
    return "int32" if name.startswith("bitwise") else "float32"


def _arity(name: str) -> int:
    for count in (1, 2, 3):
        try:
            expected_output(name, [((2, 3), "float32")] * count)
        except ValueError:
            continue
        return count
    raise AssertionError(f"no arity fits {name}")


@pytest.mark.parametrize("name", sorted(CHECKED - {"__nop"}))
def test_each_rule_is_the_output_its_kernel_writes(name: str) -> None:
    kernel = asyncrt.get_global_func(name, "cpu")
    assert kernel is not None
    shapes = _SPECIAL.get(name) or _SHAPES[_arity(name)]
    dtype = _dtype(name)
    specs = [(s, "bool" if name == "where" and k == 0 else dtype)
             for k, s in enumerate(shapes)]  # fmt: skip
    want = expected_output(name, specs)
    assert want is not None
    rng = np.random.default_rng(0)
    arrays = [
        (rng.random(s) + 0.5).astype(numpy_dtype(d)) if d != "bool"
        else rng.random(s) > 0.5
        for s, d in specs
    ]  # fmt: skip
    out = np.empty(want.shape, numpy_dtype(want.dtype or "float32"))
    with np.errstate(all="ignore"):
        kernel(*arrays, out)  # raises if the output is not what it writes
