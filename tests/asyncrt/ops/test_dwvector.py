"""The depthwise convolution in explicit vectors (``_dwvector``): its
layout copy (tiles transposed in registers, the pads zeroed, the channel
tail), its sums against the float64 reference at both vector widths and
every activation, and its scratch buffers shared with other kernels."""

from __future__ import annotations

import numpy as np
import pytest

from asyncrt.ops import _dwvector, _scratch

from .conv_reference import activated_reference
from .team_split import assert_activation_is_the_pass, split_everywhere

pytest.importorskip("numba")


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize(
    ("shape", "top", "left"),
    [
        ((1, 24, 14, 14), 2, 2),  # cells past the last whole tile
        ((2, 17, 7, 7), 1, 2),  # a batch, a channel tail
        ((1, 16, 4, 4), 0, 0),  # no pads, whole tiles
        ((1, 3, 3, 5), 2, 0),  # fewer cells than a tile
    ],
)
def test_the_layout_copy_is_exact_and_zeroes_the_pads(
    lanes: int, shape: tuple[int, ...], top: int, left: int
) -> None:
    # the kernel copies each block of channels into the share's plane
    # before its sums (a 1 x 1 kernel here: the copy is what is checked);
    # the plane holds the last image's block after the call
    n, c, h, w = shape
    blocks = -(-c // lanes) * lanes
    kernel = _dwvector._kernel((1, 1, 1, 1, 1, 1, lanes), "none")
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    taps, bias = np.ones((1, blocks), np.float32), np.zeros(blocks, np.float32)
    out = np.empty((n, c, top + h + 2, left + w + 1), np.float32)
    padded = np.pad(x, ((0, 0), (0, blocks - c), (0, 0), (0, 0)), mode="edge")
    for block in range(blocks // lanes):
        pixels = np.full((top + h + 2, left + w + 1, lanes), np.nan, np.float32)
        kernel(x, pixels, taps, bias, out, block, block + 1, top, left)
        interior = pixels[top : top + h, left : left + w]
        # the channels up to the blocks repeat the last (finite, sums dropped)
        want = padded[-1, block * lanes : (block + 1) * lanes].transpose(1, 2, 0)
        np.testing.assert_array_equal(interior, want)
        border = np.ones(pixels.shape[:2], bool)
        border[top : top + h, left : left + w] = False
        assert np.all(pixels[border] == 0)
    want_out = np.zeros_like(out)
    want_out[:, :, top : top + h, left : left + w] = x
    np.testing.assert_array_equal(out, want_out)


# Each geometry with one activation (every activation and geometry
# compiles a loop of its own: about half a second each on a cold cache).
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize(
    ("shape", "kernel", "strides", "pads", "dilations", "activation"),
    [
        ((1, 40, 7, 7), (5, 5), [1, 1], [2, 2, 2, 2], [1, 1], "hard_swish"),
        ((2, 20, 11, 9), (3, 3), [2, 1], [1, 0, 2, 1], [1, 1], "relu"),
        ((1, 33, 10, 10), (3, 5), [1, 2], [2, 2, 2, 2], [2, 1], "none"),
        ((1, 16, 3, 3), (5, 5), [1, 1], [3, 3, 3, 3], [1, 1], "relu"),  # pads > x
    ],
)
def test_the_vector_sums_match_the_reference_at_both_widths(
    monkeypatch: pytest.MonkeyPatch,
    split: bool,
    lanes: int,
    activation: str,
    shape: tuple[int, ...],
    kernel: tuple[int, int],
    strides: list[int],
    pads: list[int],
    dilations: list[int],
) -> None:
    if split and lanes != 16:
        pytest.skip("split at one width: each width's team wrapper compiles anew")
    monkeypatch.setattr(_dwvector, "lanes", lambda: lanes)
    if split:  # blocks of channels shared out, on the native team where it runs
        split_everywhere(monkeypatch, _dwvector)
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    w = rng.standard_normal((shape[1], 1, *kernel)).astype(np.float32)
    b = rng.standard_normal(shape[1]).astype(np.float32)
    want = activated_reference(
        x, w, b, strides, pads, dilations, activation, depthwise=True
    )
    out = np.full(want.shape, np.nan, np.float32)
    call = _dwvector.bind(
        x,
        w,
        b,
        out,
        tuple(strides),
        tuple(pads[:2]),
        tuple(dilations),
        activation=activation,
    )
    call()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    w[...] *= -1  # weights that are inputs are read anew on every call
    call()
    want = activated_reference(
        x, w, b, strides, pads, dilations, activation, depthwise=True
    )
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("split", [False, True])
def test_hard_swish_in_the_registers_is_the_pass_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, split: bool
) -> None:
    if split:  # blocks of channels shared out
        split_everywhere(monkeypatch, _dwvector)
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((2, 40, 9, 9)) * 3).astype(np.float32)
    x[0, 7, 4, 4] = np.nan
    w = rng.standard_normal((40, 1, 5, 5)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    geometry = ((1, 1), (2, 2), (1, 1))
    shape = (2, 40, 9, 9)
    assert_activation_is_the_pass(
        _dwvector.bind, (x, w, b), shape, geometry, "hard_swish"
    )


def test_a_call_after_other_kernels_wrote_the_scratch_is_still_right() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 24, 7, 7)).astype(np.float32)
    w = rng.standard_normal((24, 1, 5, 5)).astype(np.float32)
    want = activated_reference(
        x, w, None, [1, 1], [2, 2, 2, 2], [1, 1], "none", depthwise=True
    )
    out = np.empty(want.shape, np.float32)
    call = _dwvector.bind(
        x, w, None, out, (1, 1), (2, 2), (1, 1), constant_weights=True
    )
    call()
    # another kernel on this thread borrows the scratch, and leaves NaN in it
    (other,) = _scratch.borrow(((1 << 16,),), np.dtype(np.float32))
    other.fill(np.nan)
    out.fill(0)
    call()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_non_finite_inputs_reach_only_the_outputs_they_feed() -> None:
    x = np.zeros((1, 16, 7, 7), np.float32)
    x[0, 3, 3, 3] = np.inf
    x[0, 9, 0, 0] = np.nan
    w = np.ones((16, 1, 3, 3), np.float32)
    out = np.empty((1, 16, 7, 7), np.float32)
    _dwvector.bind(x, w, None, out, (1, 1), (1, 1), (1, 1))()
    assert np.isposinf(out[0, 3, 2:5, 2:5]).all()
    assert np.isnan(out[0, 9, :2, :2]).all()
    finite = np.ones(out.shape, bool)
    finite[0, 3, 2:5, 2:5] = finite[0, 9, :2, :2] = False
    assert np.all(out[finite] == 0)


def test_an_unknown_activation_is_refused() -> None:
    x = np.zeros((1, 16, 4, 4), np.float32)
    w = np.zeros((16, 1, 3, 3), np.float32)
    with pytest.raises(ValueError, match="swish2"):
        _dwvector.bind(
            x, w, None, x.copy(), (1, 1), (1, 1), (1, 1), activation="swish2"
        )
