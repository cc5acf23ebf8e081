"""A stem convolution in explicit vectors (``_stemvector``) against the
float64 reference: strides, dilations, uneven pads, few inputs and
outputs, both vector widths, the activations, weights and a bias read anew
when they are an input, and which convolutions it takes."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrt.ops import _stemvector
from asyncrt.ops._conv_epilogue import ACTIVATIONS

from .conv_reference import activate, conv_reference
from .team_split import assert_activation_is_the_pass, split_everywhere

pytest.importorskip("numba")


# Both vector widths on every geometry (each compiles a loop of its own).
@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize(
    ("x_shape", "w_shape", "strides", "pads", "dilations"),
    [
        ((1, 3, 40, 42), (8, 3, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1]),
        ((1, 2, 30, 31), (7, 2, 3, 3), [2, 1], [2, 0, 1, 2], [2, 2]),
        ((1, 1, 12, 19), (8, 1, 5, 5), [1, 2], [2, 2, 2, 2], [1, 1]),
        ((1, 3, 4, 5), (6, 3, 3, 3), [1, 1], [3, 3, 3, 3], [1, 1]),  # pads > x
        # interior pixels past the last whole block: one overlapping block
        ((2, 3, 20, 60), (8, 3, 3, 3), [2, 2], [1, 1, 1, 1], [1, 1]),
    ],
)
def test_outputs_match_the_reference(
    monkeypatch: pytest.MonkeyPatch,
    lanes: int,
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    strides: list[int],
    pads: list[int],
    dilations: list[int],
) -> None:
    monkeypatch.setattr(_stemvector._dwvector, "lanes", lambda: lanes)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    want = conv_reference(x, w, b, 1, strides, pads, dilations)
    out = np.full(want.shape, np.nan, np.float32)
    call = _stemvector.bind(
        x, w, b, out, tuple(strides), tuple(pads[:2]), tuple(dilations)
    )
    call()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-5)
    w *= -1  # an input's weights: read anew by every call
    call()
    want = conv_reference(x, w, b, 1, strides, pads, dilations)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("constant_bias", [False, True])
def test_a_bias_is_read_per_call_unless_constant(constant_bias: bool) -> None:
    """Parameters (weights and bias constant) are copied once, and the call
    is the compiled loop itself; an input's bias is read by every call."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 3, 20, 20)).astype(np.float32)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    strides, pads = [2, 2], [1, 1, 1, 1]
    want = conv_reference(x, w, b, 1, strides, pads, [1, 1])
    out = np.full(want.shape, np.nan, np.float32)
    call = _stemvector.bind(
        x,
        w,
        b,
        out,
        (2, 2),
        (1, 1),
        (1, 1),
        constant_weights=True,
        constant_bias=constant_bias,
    )
    call()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-5)
    b += 1
    call()
    np.testing.assert_allclose(
        out, want if constant_bias else want + 1, rtol=1e-5, atol=2e-5
    )


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_the_activation_and_no_bias(activation: str) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((1, 3, 20, 20)) * 3).astype(np.float32)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    want = activate(conv_reference(x, w, None, 1, [1, 1], [1] * 4, [1, 1]), activation)
    out = np.empty(want.shape, np.float32)
    _stemvector.bind(x, w, None, out, (1, 1), (1, 1), (1, 1), activation=activation)()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("split", [False, True])
def test_hard_swish_over_the_rows_is_the_pass_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, split: bool
) -> None:
    if split:  # rows shared out (on the native team where it runs here)
        split_everywhere(monkeypatch, _stemvector)
    # (the loops of test_the_activation_and_no_bias: compiled once)
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((2, 3, 70, 66)) * 3).astype(np.float32)
    x[1, 0, 10, 10] = np.nan
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    geometry = ((1, 1), (1, 1), (1, 1))
    shape = (2, 8, 70, 66)
    assert_activation_is_the_pass(
        _stemvector.bind, (x, w, b), shape, geometry, "hard_swish"
    )


def test_a_nan_reaches_only_the_outputs_whose_windows_hold_it() -> None:
    x = np.zeros((1, 3, 20, 20), np.float32)
    x[0, 1, 0, 0] = np.nan  # at a corner: the checked taps
    x[0, 2, 10, 10] = np.inf
    w = np.ones((4, 3, 3, 3), np.float32)
    out = np.empty((1, 4, 20, 20), np.float32)
    _stemvector.bind(x, w, None, out, (1, 1), (1, 1), (1, 1))()
    assert np.isnan(out[:, :, :2, :2]).all()
    assert np.isposinf(out[:, :, 9:12, 9:12]).all()
    rest = np.ones(out.shape, bool)
    rest[:, :, :2, :2] = rest[:, :, 9:12, 9:12] = False
    assert np.all(out[rest] == 0)


def test_what_it_takes() -> None:
    side = int(np.ceil(np.sqrt(_stemvector.MIN_PIXELS)))
    x = np.zeros((1, 3, side, side), np.float32)
    out = np.zeros((1, 16, side, side), np.float32)
    w = np.zeros((16, 3, 3, 3), np.float32)
    assert _stemvector.takes(x, w, out, 1) == (_stemvector._dwvector.lanes() >= 16)
    small = np.zeros((1, 16, 8, 8), np.float32)
    assert not _stemvector.takes(x, w, small, 1)  # too few pixels
    assert not _stemvector.takes(x, w, out, 3)  # grouped
    many = np.zeros((16, 4, 3, 3), np.float32)  # 36 taps: past the registers
    assert not _stemvector.takes(np.zeros((1, 4, side, side), np.float32), many, out, 1)
    assert not _stemvector.takes(x.astype(np.float64), w, out, 1)
