"""A convolution's bias and activation in one compiled pass: the same bits
as the numpy passes and the library's kernels, in place or not, on every
layout the loop takes; and hard-swish fused into every convolution path,
equal bit for bit to the convolution then the library's ``hard_swish``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _conv_epilogue, _depthwise, _winograd
from asyncrt.ops._common import relu_in_place
from asyncrt.ops._library import global_namespace_func

from .conv_reference import conv_kernel

pytest.importorskip("numba")

SPECIALS = [np.nan, np.inf, -np.inf, -0.0, 0.0, 3.0, -3.0, 1e30, -1e-30]


def _values(shape: tuple[int, ...], dtype: Any, seed: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape) * 4).astype(dtype)
    flat = a.reshape(-1)
    count = min(len(SPECIALS), flat.size)
    flat[:count] = SPECIALS[:count]
    return a


def _numpy_passes(
    source: np.ndarray[Any, Any], bias: np.ndarray[Any, Any] | None, activation: str
) -> np.ndarray[Any, Any]:
    """The unfused epilogue: the bias add, then the library's activation."""
    with np.errstate(all="ignore"):  # inf * 0, as the kernels keep it
        out = source + bias if bias is not None else source.copy()
        if activation == "relu":
            relu_in_place(np, out)
        elif activation == "hard_swish":
            ramp = np.multiply(out, 1 / 6)
            np.add(ramp, 0.5, ramp)
            np.clip(ramp, 0, 1, out=ramp)
            np.multiply(out, ramp, out)
    return out


@pytest.mark.parametrize("activation", _conv_epilogue.ACTIVATIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("biased", [True, False])
@pytest.mark.parametrize("layout", ["in place", "contiguous", "4-D view", "3-D view"])
def test_the_epilogue_is_the_numpy_passes_bit_for_bit(
    activation: str, dtype: Any, biased: bool, layout: str
) -> None:
    shape = (2, 6, 40, 50) if layout != "3-D view" else (2, 6, 2000)
    whole = _values((*shape[:-1], shape[-1] + 3), dtype, seed=len(layout))
    source = whole[..., 1:-2] if "view" in layout else np.ascontiguousarray(whole)
    if "view" not in layout:
        source = source[..., : shape[-1]].copy()
    bias_shape = (1, shape[1], *(1,) * (len(shape) - 2))
    bias = _values(bias_shape, dtype, seed=3) if biased else None
    want = _numpy_passes(source, bias, activation)
    out = source if layout == "in place" else np.full(shape, 7.0, dtype)
    compiled = _conv_epilogue._compiled(np, source, bias, out, activation)
    # float64 hard-swish stays numpy's (its constants are float32's)
    assert (compiled is None) == (activation == "hard_swish" and dtype == np.float64)
    _conv_epilogue.add_bias_activation(np, source, bias, out, activation)
    np.testing.assert_array_equal(out, want)  # NaN where NaN, -0 where -0
    assert (np.signbit(out) == np.signbit(want)).all()


def test_small_odd_and_foreign_shapes_take_the_numpy_passes() -> None:
    small = _values((1, 4, 5, 5), np.float32, seed=1)
    bias = np.ones((1, 4, 1, 1), np.float32)
    assert _conv_epilogue._compiled(np, small, bias, small, "relu") is None
    grouped_bias = np.ones((2, 2, 1, 1), np.float32)  # (group, M / group)
    big = _values((1, 4, 40, 40), np.float32, seed=2)
    assert _conv_epilogue._compiled(np, big, grouped_bias, big, "relu") is None
    volume = _values((1, 4, 16, 16, 16), np.float32, seed=3)
    assert _conv_epilogue._compiled(np, volume, None, volume, "relu") is None
    for source, b in ((small, bias), (big, grouped_bias.reshape(1, 4, 1, 1))):
        want = _numpy_passes(source, b, "hard_swish")
        _conv_epilogue.add_bias_activation(np, source, b, source, "hard_swish")
        np.testing.assert_array_equal(source, want)


# x shape, weights shape, group, strides, pads: one case per path
PATHS = {
    "depthwise planes": ((1, 16, 32, 32), (16, 1, 3, 3), 16, [1, 1], [1] * 4),
    "depthwise pixels": ((1, 32, 6, 6), (32, 1, 5, 5), 32, [1, 1], [2] * 4),
    "grouped": ((1, 16, 18, 18), (16, 4, 3, 3), 4, [2, 2], [1] * 4),
    "stem": ((1, 3, 40, 40), (16, 3, 3, 3), 1, [2, 2], [1] * 4),
    "winograd": ((1, 32, 12, 12), (32, 32, 3, 3), 1, [1, 1], [1] * 4),
    "strided": ((1, 16, 17, 17), (24, 16, 3, 3), 1, [2, 2], [1] * 4),
    "1x1": ((2, 32, 9, 9), (48, 32, 1, 1), 1, [1, 1], [0] * 4),
    "im2col": ((1, 8, 30, 30), (20, 8, 3, 3), 1, [1, 1], [1] * 4),
    "grouped im2col": ((1, 64, 10, 10), (64, 16, 3, 3), 4, [1, 1], [1] * 4),
}


# float64 on two paths only: each path and dtype compiles kernels of its
# own (about a second each on a cold cache); float64's hard-swish is a
# numpy pass after any of them.
@pytest.mark.parametrize("bound", [True, False])
@pytest.mark.parametrize(
    ("path", "dtype"),
    [(path, np.float32) for path in sorted(PATHS)]
    + [("depthwise pixels", np.float64), ("1x1", np.float64)],
)
def test_hard_swish_fused_into_every_path_is_the_unfused_pair(
    path: str, bound: bool, dtype: Any
) -> None:
    xs, ws, group, strides, pads = PATHS[path]
    rng = np.random.default_rng(len(path))
    x = rng.standard_normal(xs).astype(dtype)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    if path == "winograd":
        x[0, 3, 5, 5] = np.nan  # the exact path, and its activation once
    kernels = {
        activation: conv_kernel(
            list(ws[2:]), strides, pads, [1, 1], group, bias=True, activation=activation
        )
        for activation in ("none", "hard_swish")
    }
    outs = {}
    for activation, kernel in kernels.items():
        out = np.full(_out_shape(xs, ws, strides, pads), np.nan, dtype)
        if bound:
            kernel.bind(x, w, b, out, constant=frozenset({1}))()
        else:
            kernel(x, w, b, out)
        outs[activation] = out
    want = _numpy_passes(outs["none"], None, "hard_swish")
    np.testing.assert_array_equal(outs["hard_swish"], want)


def _out_shape(
    xs: tuple[int, ...], ws: tuple[int, ...], strides: list[int], pads: list[int]
) -> tuple[int, ...]:
    spatial = [
        (size + pads[i] + pads[i + 2] - k) // s + 1
        for i, (size, k, s) in enumerate(zip(xs[2:], ws[2:], strides, strict=True))
    ]
    return (xs[0], ws[0], *spatial)


def test_the_paths_cases_take_the_paths_they_are_named_for() -> None:
    def arrays(path: str) -> tuple[Any, ...]:
        xs, ws, group, strides, pads = PATHS[path]
        out = np.zeros(_out_shape(xs, ws, strides, pads), np.float32)
        return np.zeros(xs, np.float32), np.zeros(ws, np.float32), out, group

    for path in ("depthwise planes", "depthwise pixels"):
        x, w, out, group = arrays(path)
        assert _depthwise.takes(np, x, w, out, group)
    assert arrays("depthwise pixels")[2].shape[3] < _depthwise.PLANAR_MIN_WIDTH
    planes = arrays("depthwise planes")[2].shape[3]
    assert planes > _depthwise.VECTOR_MAX_WIDTH_MANY_TAPS  # not in vectors
    for path in ("grouped", "stem"):
        x, w, out, group = arrays(path)
        assert _depthwise.groups(np, x, w, out, group)
    x, w, out, group = arrays("winograd")
    assert _winograd.takes(np, x, w, out, group, (1, 1), (1, 1))
    for path in ("strided", "1x1", "im2col", "grouped im2col"):
        x, w, out, group = arrays(path)
        assert not _depthwise.groups(np, x, w, out, group)
        assert not _winograd.takes(np, x, w, out, group, (1, 1), (1, 1))


@pytest.mark.parametrize("activation", _conv_epilogue.ACTIVATIONS)
@pytest.mark.parametrize("shape", [(1, 8, 30, 30), (1, 4, 5, 5)])  # compiled, numpy
def test_a_bound_epilogue_reads_its_arrays_anew(
    activation: str, shape: tuple[int, ...]
) -> None:
    out = _values(shape, np.float32, seed=5)
    bias = _values((1, shape[1], 1, 1), np.float32, seed=6)
    call = _conv_epilogue.bind_bias_activation(np, out, bias, out, activation)
    for seed in (7, 8):
        out[...] = _values(shape, np.float32, seed=seed)
        want = _numpy_passes(out, bias, activation)
        call()
        np.testing.assert_array_equal(out, want)


def test_a_bound_epilogue_with_nothing_to_do_leaves_the_output() -> None:
    out = _values((1, 8, 30, 30), np.float32, seed=9)
    before = out.copy()
    _conv_epilogue.bind_bias_activation(np, out, None, out, "none")()
    np.testing.assert_array_equal(out, before)
    relu = _conv_epilogue.bind_bias_activation(np, out, None, out, "relu")
    relu()
    np.testing.assert_array_equal(out, _numpy_passes(before, None, "relu"))


@pytest.mark.parametrize("activation", ["none", "relu", "hard_swish"])
def test_loops_leave_hard_swish_to_a_pass_of_the_same_bits(activation: str) -> None:
    """A compiled convolution loop applies ReLU as it stores; hard-swish
    follows it as a pass (its constants would crowd out the weights'
    registers), computing the library's hard_swish bit for bit."""
    out = np.random.default_rng(31).standard_normal((1, 16, 20, 20)).astype(np.float32)
    before = out.copy()
    inside, after = _conv_epilogue.split_activation(out, activation)
    if activation != "hard_swish":
        assert (inside, after) == (activation, None)
        return
    assert inside == "none" and after is not None
    after()
    want = before.copy()
    global_namespace_func("hard_swish", "numpy")(before, want)
    np.testing.assert_array_equal(out, want)
