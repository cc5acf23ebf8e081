"""An expansion and its depthwise convolution in one loop
(``_pointwise_depthwise``), and the library's ``pointwise_depthwise`` op
around it: against the float64 reference at both vector widths, channels
not a multiple of a vector, strides, dilations and uneven pads, split over
threads, bound with weights that are inputs (the two convolutions), and
the depthwise step's bits from a given plane."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _dwvector, _pointwise_depthwise, register_op_kernel
from asyncrt.ops._kernels import global_namespace_func

from .conv_reference import activate, conv_reference
from .team_split import split_everywhere

pytest.importorskip("numba")

Array = np.ndarray[Any, Any]


def _arrays(
    shape: tuple[int, ...], channels: int, kernel: tuple[int, int], seed: int = 0
) -> tuple[Array, ...]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    w1 = (rng.standard_normal((channels, shape[1], 1, 1)) / 2).astype(np.float32)
    b1 = rng.standard_normal(channels).astype(np.float32)
    w2 = rng.standard_normal((channels, 1, *kernel)).astype(np.float32)
    b2 = rng.standard_normal(channels).astype(np.float32)
    return x, w1, b1, w2, b2


def _reference(
    arrays: tuple[Array, ...],
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    activations: tuple[str, str],
) -> Array:
    x, w1, b1, w2, b2 = arrays
    expanded = activate(
        conv_reference(x, w1, b1, 1, [1, 1], [0] * 4, [1, 1]), activations[0]
    )
    channels = w1.shape[0]
    out = conv_reference(expanded, w2, b2, channels, strides, pads, dilations)
    return activate(out, activations[1])


# Each geometry with one pair of activations (each case compiles a loop of
# its own, at both vector widths; the other tests reuse these loops).
GEOMETRIES = [
    # shape, channels, kernel, strides, pads, dilations, activations
    ((1, 24, 14, 14), 40, (5, 5), [1, 1], [2, 2, 2, 2], [1, 1], ("hard_swish",) * 2),
    ((2, 16, 11, 9), 20, (3, 3), [2, 1], [1, 0, 2, 1], [1, 1], ("relu", "relu")),
    ((1, 7, 10, 10), 33, (3, 5), [1, 2], [2, 2, 2, 2], [2, 1], ("none", "none")),
    ((1, 3, 3, 3), 16, (5, 5), [1, 1], [3, 3, 3, 3], [1, 1], ("relu", "none")),
]


@pytest.mark.parametrize("lanes", [8, 16])
@pytest.mark.parametrize(
    ("shape", "channels", "kernel", "strides", "pads", "dilations", "activations"),
    GEOMETRIES,
)
def test_the_loop_matches_the_reference(
    monkeypatch: pytest.MonkeyPatch,
    lanes: int,
    activations: tuple[str, str],
    shape: tuple[int, ...],
    channels: int,
    kernel: tuple[int, int],
    strides: list[int],
    pads: list[int],
    dilations: list[int],
) -> None:
    monkeypatch.setattr(_dwvector, "lanes", lambda: lanes)
    arrays = _arrays(shape, channels, kernel)
    want = _reference(arrays, strides, pads, dilations, activations)
    out = np.full(want.shape, np.nan, np.float32)
    _pointwise_depthwise.bind(
        *arrays,
        out,
        tuple(strides),
        tuple(pads[:2]),
        tuple(dilations),
        expand_activation=activations[0],
        activation=activations[1],
    )()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-5)


def test_each_activation_applies_to_its_own_step() -> None:
    """ReLU on the expansion only: the depthwise sums may be negative."""
    shape, channels, kernel, strides, pads, dilations, activations = GEOMETRIES[3]
    assert activations == ("relu", "none")
    arrays = _arrays(shape, channels, kernel, seed=4)
    args = (strides, pads, dilations)
    want = _reference(arrays, *args, activations)
    assert (want < 0).any() and not np.allclose(
        want, _reference(arrays, *args, ("none", "none")), atol=1e-3
    )
    out = np.empty(want.shape, np.float32)
    geometry = (tuple(strides), tuple(pads[:2]), tuple(dilations))
    _pointwise_depthwise.bind(*arrays, out, *geometry, expand_activation="relu")()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("bands", [1, 3])
@pytest.mark.parametrize("case", GEOMETRIES[:2], ids=["5x5", "3x3-strided"])
def test_shares_and_bands_match_one_thread(
    monkeypatch: pytest.MonkeyPatch, bands: int, case: tuple[Any, ...]
) -> None:
    """Blocks shared out over threads, each cut into bands of output rows
    (each band's input rows expanded again): the one thread's bits."""
    shape, _, kernel, strides, pads, dilations, activations = case
    arrays = _arrays((2, *shape[1:]), 72, kernel, seed=1)
    geometry = (tuple(strides), tuple(pads[:2]), tuple(dilations))
    acts = {"expand_activation": activations[0], "activation": activations[1]}
    out_shape = _reference(arrays, strides, pads, dilations, activations).shape
    alone = np.empty(out_shape, np.float32)
    _pointwise_depthwise.bind(*arrays, alone, *geometry, **acts)()
    split_everywhere(monkeypatch, _dwvector)
    monkeypatch.setattr(_pointwise_depthwise, "_bands", lambda *_: bands)
    shared = np.full(out_shape, np.nan, np.float32)
    _pointwise_depthwise.bind(*arrays, shared, *geometry, **acts)()
    np.testing.assert_array_equal(shared, alone)


def test_bands_where_the_blocks_are_too_few_for_the_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_pointwise_depthwise._threads, "available_cores", lambda: 2)
    bands = _pointwise_depthwise._bands
    # MobileNetV3's 72 channels (5 blocks) at 56 x 56, stride 2: two bands
    assert bands(5, 16, (56, 56), (28, 28), (3, 3), 2, 1, 1) == 2
    # 240 channels of 14 x 14, 5 x 5: bands would expand most rows twice
    assert bands(15, 40, (14, 14), (14, 14), (5, 5), 1, 1, 2) == 1
    monkeypatch.setattr(_pointwise_depthwise._threads, "available_cores", lambda: 1)
    assert bands(5, 16, (56, 56), (28, 28), (3, 3), 2, 1, 1) == 1


def test_the_depthwise_step_is_the_depthwise_loop_bit_for_bit() -> None:
    """From the same expanded plane the sums are the depthwise kernel's:
    an expansion by an identity (ReLU of values at least 0) reproduces its
    input exactly."""
    shape, channels, kernel, strides, pads, dilations, activations = GEOMETRIES[1]
    assert activations == ("relu", "relu")
    rng = np.random.default_rng(3)
    x = np.abs(rng.standard_normal((1, channels, *shape[2:]))).astype(np.float32)
    identity = np.eye(channels, dtype=np.float32).reshape(channels, channels, 1, 1)
    w2 = rng.standard_normal((channels, 1, *kernel)).astype(np.float32)
    b2 = rng.standard_normal(channels).astype(np.float32)
    geometry = (tuple(strides), tuple(pads[:2]), tuple(dilations))
    want_shape = _reference(
        (x, identity, b2, w2, b2), strides, pads, dilations, activations
    ).shape
    want = np.empty(want_shape, np.float32)
    _dwvector.bind(x, w2, b2, want, *geometry, activation="relu")()
    out = np.empty_like(want)
    zeros = np.zeros(channels, np.float32)
    _pointwise_depthwise.bind(
        x,
        identity,
        zeros,
        w2,
        b2,
        out,
        *geometry,
        expand_activation="relu",
        activation="relu",
    )()
    np.testing.assert_array_equal(out, want)


def test_a_nan_reaches_only_the_outputs_whose_windows_hold_it() -> None:
    """Every expanded channel has it (a zero weight times NaN is NaN, as
    in the GEMM), and only the depthwise windows over its pixel."""
    x = np.zeros((1, 4, 7, 7), np.float32)
    x[0, 2, 3, 3] = np.nan
    w1 = np.ones((16, 4, 1, 1), np.float32)
    w1[:, 2] = 0.0
    w2 = np.ones((16, 1, 3, 3), np.float32)
    out = np.empty((1, 16, 7, 7), np.float32)
    zeros = np.zeros(16, np.float32)
    _pointwise_depthwise.bind(x, w1, zeros, w2, zeros, out, (1, 1), (1, 1), (1, 1))()
    want = np.zeros(out.shape, bool)
    want[0, :, 2:5, 2:5] = True
    np.testing.assert_array_equal(np.isnan(out), want)
    assert (out[~want] == 0).all()


def test_an_unknown_activation_is_refused() -> None:
    arrays = _arrays((1, 4, 4, 4), 16, (3, 3))
    out = np.empty((1, 16, 4, 4), np.float32)
    with pytest.raises(ValueError, match="swish2"):
        _pointwise_depthwise.bind(
            *arrays, out, (1, 1), (1, 1), (1, 1), expand_activation="swish2"
        )


def _op(strides: list[int], pads: list[int], activations: tuple[str, str]) -> Any:
    attrs = {
        "kernel_shape": [3, 3],
        "strides": strides,
        "pads": pads,
        "dilations": [1, 1],
        "pointwise_activation": activations[0],
        "activation": activations[1],
    }
    kernel = global_namespace_func(
        register_op_kernel("pointwise_depthwise", attrs), "numpy"
    )
    assert kernel is not None
    return kernel


@pytest.mark.parametrize("constant", [frozenset({1, 2, 3, 4}), frozenset()])
def test_the_op_bound_with_parameters_or_inputs(constant: frozenset[int]) -> None:
    """Parameters take the fused loop; weights that are inputs the two
    convolutions, which read them anew on every call; unbound, the same."""
    arrays = _arrays((2, 6, 8, 8), 24, (3, 3), seed=2)
    geometry = ([2, 2], [1, 1, 1, 1], [1, 1])
    activations = ("hard_swish", "relu")
    kernel = _op(geometry[0], geometry[1], activations)
    want = _reference(arrays, *geometry, activations)
    out = np.full(want.shape, np.nan, np.float32)
    call = kernel.bind(*arrays, out, constant=constant)
    call()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-5)
    plain = np.full(want.shape, np.nan, np.float32)
    kernel(*arrays, plain)
    np.testing.assert_allclose(plain, want, rtol=1e-5, atol=2e-5)
    if not constant:
        arrays[3][...] *= -1  # an input's new values
        call()
        want = _reference(arrays, *geometry, activations)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=2e-5)
