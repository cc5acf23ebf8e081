"""Convolutions of few input channels along output rows (``_stemrows``):
the sums against the float64 reference (strides, pads, dilations, channel
blocks and rows cut short, every activation, split over threads or not),
the pads' zero products, non-finite inputs, a bias read on every call, and
which convolutions the library gives it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _stemrows, lookup

from .conv_reference import activated_reference
from .team_split import split_everywhere

pytest.importorskip("numba")


# Each geometry with one activation (each compiles a loop of its own).
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize(
    ("shape", "outputs", "kernel", "strides", "pads", "dilations", "activation"),
    [
        # a stride-2 stem, rows of 12 (one masked vector), 20 channels
        ((1, 3, 23, 24), 20, (3, 3), [2, 2], [1, 1, 1, 1], [1, 1], "relu"),
        # ResNet's 7 x 7 at a small size, a batch, 17 channels
        ((2, 3, 30, 36), 17, (7, 7), [2, 2], [3, 3, 3, 3], [1, 1], "none"),
        # stride 1, a dilation, asymmetric pads, two channel blocks
        ((1, 4, 19, 40), 33, (3, 3), [1, 1], [0, 2, 2, 1], [2, 1], "hard_swish"),
        # one input channel, pads wider than the input
        ((1, 1, 3, 5), 18, (5, 5), [1, 1], [4, 4, 4, 4], [1, 1], "relu"),
    ],
)
def test_the_rows_match_the_reference(
    monkeypatch: pytest.MonkeyPatch,
    split: bool,
    shape: tuple[int, ...],
    outputs: int,
    kernel: tuple[int, int],
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    activation: str,
) -> None:
    if split:  # the copy's rows and the output rows shared out
        split_everywhere(monkeypatch, _stemrows)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w = rng.standard_normal((outputs, shape[1], *kernel)).astype(np.float32)
    b = rng.standard_normal(outputs).astype(np.float32)
    want = activated_reference(x, w, b, strides, pads, dilations, activation)
    out = np.full(want.shape, np.nan, np.float32)
    call = _stemrows.bind(
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
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
    x[...] *= -1  # the input and the bias are read on every call
    b[...] += 1
    call()
    want = activated_reference(x, w, b, strides, pads, dilations, activation)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)


def test_pads_add_zero_products_and_nan_reaches_only_its_outputs() -> None:
    x = np.ones((1, 3, 20, 20), np.float32)
    x[0, 1, 10, 10] = np.nan
    w = np.zeros((17, 3, 3, 3), np.float32)
    w[:, 1, 1, 1] = 1.0  # each output copies channel 1's cell
    w[0, 0, 0, 0] = np.inf  # times the pads' zeros: NaN on the top and left
    out = np.empty((1, 17, 20, 20), np.float32)
    _stemrows.bind(x, w, None, out, (1, 1), (1, 1), (1, 1))()
    assert np.isnan(out[0, 0, 0, :]).all() and np.isnan(out[0, 0, :, 0]).all()
    # channel 1's NaN times every tap's weight, zero or not: NaN in the
    # outputs whose window holds it (as im2col's products), every channel
    assert np.isnan(out[0, :, 9:12, 9:12]).all()
    inner = out[0, 0, 1:, 1:].copy()
    inner[8:11, 8:11] = np.inf
    assert np.isposinf(inner).all()
    rest = np.ones(out.shape, bool)
    rest[0, 0] = False
    rest[0, :, 9:12, 9:12] = False
    assert np.all(out[rest] == 1.0)


def test_which_convolutions_it_takes() -> None:
    x = np.zeros((1, 3, 32, 32), np.float32)
    out = np.zeros((1, 32, 16, 16), np.float32)

    def takes(w: np.ndarray[Any, Any], group: int = 1) -> bool:
        return _stemrows.takes(x, w, out, group, (2, 2))

    assert takes(np.zeros((32, 3, 3, 3), np.float32))  # a stem
    assert not takes(np.zeros((32, 3, 1, 1), np.float32))  # a plain GEMM
    assert not takes(np.zeros((16, 3, 3, 3), np.float32))  # _stemvector's
    assert not takes(np.zeros((32, 3, 3, 3), np.float64))
    wide = np.zeros((1, 8, 32, 32), np.float32)
    assert not _stemrows.takes(
        wide, np.zeros((32, 8, 3, 3), np.float32), out, 1, (2, 2)
    )


def test_the_library_binds_a_stem_of_parameters_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken: list[bool] = []
    real = _stemrows.bind

    def spy(*args: Any, **kwargs: Any) -> Any:
        taken.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(_stemrows, "bind", spy)
    attrs = {
        "kernel_shape": [3, 3],
        "strides": [2, 2],
        "dilations": [1, 1],
        "pads": [1, 1, 1, 1],
        "auto_pad": "NOTSET",
        "group": 1,
        "bias": True,
        "activation": "relu",
    }
    conv = lookup("conv")
    assert conv is not None
    kernel = conv.make(np, attrs)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 3, 18, 18)).astype(np.float32)
    w = rng.standard_normal((24, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    out = np.empty((1, 24, 9, 9), np.float32)
    kernel.bind(x, w, b, out, constant=frozenset({1, 2}))()
    assert taken == [True]
    want = activated_reference(x, w, b, [2, 2], [1, 1, 1, 1], [1, 1], "relu")
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
    kernel.bind(x, w, b, out)()  # weights computed by the graph: elsewhere
    assert taken == [True]


def test_an_unknown_activation_is_refused() -> None:
    x = np.zeros((1, 3, 8, 8), np.float32)
    w = np.zeros((20, 3, 3, 3), np.float32)
    out = np.zeros((1, 20, 8, 8), np.float32)
    with pytest.raises(ValueError, match="swish2"):
        _stemrows.bind(x, w, None, out, (1, 1), (1, 1), (1, 1), activation="swish2")
