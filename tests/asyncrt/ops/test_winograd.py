"""3 x 3 convolutions by Winograd's F(2 x 2, 3 x 3) and F(4 x 4, 3 x 3)
against a float64 reference: odd and even sizes, tiles cut by the output's
edges, rows of every vector width, uneven and missing pads, batches in
chunks, threads, bias and ReLU, weights packed once (parameters) or per
call, kept or borrowed scratch; non-finite and huge inputs take the exact
kernel; an executor whose parameters change sees the new weights."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from asyncrt import graph_executor
from asyncrt.frontend import from_onnx
from asyncrt.ops import _common, _im2col, _jit, _winograd, _winograd4
from asyncrt.runtime import _threads

from .conv_reference import conv_kernel, conv_reference
from .single_node import node_model

FLOAT = onnx.TensorProto.FLOAT
pytestmark = pytest.mark.skipif(not _jit.available(), reason="numba not installed")

CASES = [
    # x shape, k, pads (begin h, w, end h, w)
    ((1, 32, 12, 12), 32, [1, 1, 1, 1]),
    ((2, 33, 7, 9), 40, [1, 1, 1, 1]),  # odd output sizes: cut tiles
    ((3, 40, 10, 11), 33, [2, 0, 1, 2]),  # uneven pads
    ((1, 32, 9, 8), 48, [0, 0, 0, 0]),  # no pads
    ((2, 32, 5, 30), 32, [1, 1, 1, 1]),  # a wide, short plane
]


def _kernel(pads: list[int], bias: bool, relu: bool) -> Any:
    return conv_kernel([3, 3], [1, 1], pads, [1, 1], 1, bias=bias, relu=relu)


def _reference(x: Any, w: Any, b: Any, pads: list[int], relu: bool) -> Any:
    want = conv_reference(x, w, b, 1, [1, 1], pads, [1, 1])
    return np.maximum(want, 0) if relu else want


def close(out: Any, want: Any, tolerance: float = 1e-5) -> None:
    """Equal within ``tolerance`` of the largest output's magnitude."""
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(out, want, rtol=tolerance, atol=tolerance * scale)


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Records, for every binding, whether Winograd's kernel took it."""
    seen: list[bool] = []
    bind = _winograd.bind_winograd

    def spy(*args: Any, **kwargs: Any) -> Any:
        call = bind(*args, **kwargs)
        seen.append(call is not None)
        return call

    monkeypatch.setattr(_winograd, "bind_winograd", spy)
    monkeypatch.setattr(_winograd, "MIN_TILES", 1)
    monkeypatch.setattr(_winograd, "MIN_TILES_4", 1)
    monkeypatch.setattr(_winograd, "PER_CALL_MIN_TILES", 1)
    return seen


@pytest.fixture
def tiles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the tile side chosen for every binding."""
    seen: list[int] = []
    choose = _winograd._tile

    def spy(*args: Any) -> int:
        seen.append(choose(*args))
        return seen[-1]

    monkeypatch.setattr(_winograd, "_tile", spy)
    return seen


def _lay_out(monkeypatch: pytest.MonkeyPatch, layout: str) -> None:
    """``"chunks"``: one image per chunk; ``"threads"``: the transforms
    split over two threads; ``"borrowed"``: scratch borrowed from the
    thread; ``"one chunk"``: as bound by default."""
    if layout == "chunks":
        monkeypatch.setattr(_winograd, "CHUNK_BYTES", 1)
    elif layout == "threads":
        monkeypatch.setattr(_winograd, "MIN_WORK_PER_THREAD", 1)
        monkeypatch.setattr(_threads.limits, "compiled_threads", 2)
    elif layout == "borrowed":
        monkeypatch.setattr(_common, "BOUND_SCRATCH_BYTES", 0)


@pytest.mark.parametrize("layout", ["one chunk", "chunks", "threads", "borrowed"])
@pytest.mark.parametrize("constant", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("xs", "k", "pads"), CASES)
def test_winograd_matches_the_reference(
    monkeypatch: pytest.MonkeyPatch,
    taken: list[bool],
    tiles: list[int],
    xs: tuple[int, ...],
    k: int,
    pads: list[int],
    dtype: Any,
    constant: bool,
    layout: str,
) -> None:
    monkeypatch.setattr(_winograd, "MIN_TILES_4", 10**9)  # F(2 x 2) here
    _lay_out(monkeypatch, layout)
    rng = np.random.default_rng(len(xs) + k)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal((k, xs[1], 3, 3)).astype(dtype)
    b = rng.standard_normal(k).astype(dtype)
    relu = bool(k % 2)
    want = _reference(x, w, b, pads, relu)
    out = np.full(want.shape, np.nan, dtype)
    call = _kernel(pads, True, relu).bind(
        x, w, b, out, constant=frozenset({1}) if constant else frozenset()
    )
    assert taken == [True]
    assert tiles == [2]
    call()
    # Within float rounding of the outputs' magnitude (as BLAS's order).
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    close(out, want, tolerance)
    # A bound call reads its arrays' values each time: the input always,
    # the weights too where they are not constant.
    x[...] = rng.standard_normal(xs)
    if not constant:
        w[...] = rng.standard_normal(w.shape)
    out.fill(np.nan)
    call()
    close(out, _reference(x, w, b, pads, relu), tolerance)


CASES_4 = [
    # x shape, k, pads: the rows' vectors (in, out) in the comment
    ((1, 32, 16, 16), 32, [1, 1, 1, 1]),  # 4, 4: whole tiles, one block
    ((2, 33, 19, 21), 40, [1, 1, 1, 1]),  # 4, 4: cut tiles, blocks overlap
    ((1, 40, 30, 37), 33, [2, 0, 1, 2]),  # 8, 8: uneven pads
    ((1, 32, 9, 70), 32, [1, 1, 1, 1]),  # 16, 16: a wide, short plane
    ((3, 32, 16, 40), 36, [0, 0, 0, 0]),  # 8, 8 (38 wide): no pads
    # rows of fewer whole tiles than a vector: whole tiles into a plane
    ((2, 32, 14, 14), 40, [1, 1, 1, 1]),  # 4 (3 whole, 1 cut)
    ((1, 33, 13, 15), 32, [1, 0, 0, 1]),  # 4: cut in both axes
]


@pytest.mark.parametrize("layout", ["one chunk", "chunks", "threads", "borrowed"])
@pytest.mark.parametrize(("xs", "k", "pads"), CASES_4)
def test_four_by_four_tiles_match_the_reference(
    monkeypatch: pytest.MonkeyPatch,
    taken: list[bool],
    tiles: list[int],
    xs: tuple[int, ...],
    k: int,
    pads: list[int],
    layout: str,
) -> None:
    """F(4 x 4, 3 x 3): float32 with parameters for weights, rows of at
    least four tiles."""
    _lay_out(monkeypatch, layout)
    rng = np.random.default_rng(len(xs) + k)
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((k, xs[1], 3, 3)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    relu = bool(k % 2)
    want = _reference(x, w, b, pads, relu)
    out = np.full(want.shape, np.nan, np.float32)
    call = _kernel(pads, True, relu).bind(x, w, b, out, constant=frozenset({1}))
    assert taken == [True]
    assert tiles == [4]
    call()
    # G's sixths are rounded and the transforms scale by up to 8 (the
    # module's note): within 3e-5 of the outputs' magnitude.
    close(out, want, 3e-5)
    x[...] = rng.standard_normal(xs)
    out.fill(np.nan)
    call()
    close(out, _reference(x, w, b, pads, relu), 3e-5)


def test_four_by_four_tiles_need_constant_float32_weights_and_wide_rows() -> None:
    x = np.zeros((1, 32, 16, 16), np.float32)
    out = np.zeros((1, 32, 16, 16), np.float32)
    tile = _winograd._tile
    assert tile(x, None, out, True) == 2  # 16 tiles: fewer than MIN_TILES_4
    wide = np.zeros((1, 32, 32, 32), np.float32)
    assert tile(wide, None, wide, True) == 4
    assert tile(wide, None, wide, False) == 2  # weights transformed per call
    assert tile(wide.astype(np.float64), None, wide, True) == 2
    assert tile(wide, np.zeros(64, np.float32)[::2], wide, True) == 2  # strided bias
    narrow = np.zeros((1, 32, 64, 12), np.float32)  # three tiles a row
    assert tile(narrow, None, narrow, True) == 2
    cut = np.zeros((1, 32, 64, 13), np.float32)  # three whole, one cut
    assert tile(cut, None, cut, True) == 4


def test_pack_4_is_g_w_g_transposed() -> None:
    rng = np.random.default_rng(9)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    g = np.array(
        [
            [1 / 4, 0, 0],
            [-1 / 6, -1 / 6, -1 / 6],
            [-1 / 6, 1 / 6, -1 / 6],
            [1 / 24, 1 / 12, 1 / 6],
            [1 / 24, -1 / 12, 1 / 6],
            [0, 0, 1],
        ]
    )
    want = np.einsum("ai,kcij,bj->abkc", g, w.astype(np.float64), g).reshape(36, 3, 2)
    packed = _winograd4.pack(w)
    assert packed.dtype == np.float32
    np.testing.assert_array_equal(packed, want.astype(np.float32))
    assert _winograd.packed(w, 4) is _winograd.packed(w.copy(), 4)
    assert _winograd.packed(w, 4) is not _winograd.packed(w, 2)


def test_without_bias_and_relu(taken: list[bool]) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 32, 8, 8)).astype(np.float32)
    w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    out = np.empty((1, 32, 8, 8), np.float32)
    _kernel([1, 1, 1, 1], False, False).bind(x, w, out, constant=frozenset({1}))()
    assert taken == [True]
    want = _reference(x, w, None, [1, 1, 1, 1], False)
    close(out, want)


@pytest.mark.parametrize(
    "value", [np.inf, -np.inf, np.nan, 2.0**125, -1.5 * 2.0**125], ids=repr
)
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("size", [10, 16])  # tiles of 2 x 2, 4 x 4
def test_non_finite_and_huge_inputs_take_the_exact_kernel(
    taken: list[bool], tiles: list[int], value: float, relu: bool, size: int
) -> None:
    """The transforms would turn an infinity into NaN (inf - inf) and could
    overflow on huge values: such calls give what im2col gives, bit for bit."""
    _exact_for_one_value(value, relu, size)
    assert taken == [True]
    assert tiles == [2 if size < 16 else 4]


def test_four_by_four_tiles_leave_smaller_values_to_the_exact_kernel(
    taken: list[bool], tiles: list[int]
) -> None:
    """F(4 x 4)'s input transform scales by up to 100: 2**121 takes the
    exact kernel there (F(2 x 2) would keep it)."""
    _exact_for_one_value(2.0**121, True, 16)
    assert tiles == [4]


def _exact_for_one_value(value: float, relu: bool, size: int) -> None:
    """A convolution of ``size`` x ``size`` planes with one input cell set to
    ``value`` gives im2col's result, bit for bit."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 32, size, size)).astype(np.float32)
    x[0, 3, 4, 5] = value
    w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    out = np.empty((1, 32, size, size), np.float32)
    _kernel([1, 1, 1, 1], True, relu).bind(x, w, b, out, constant=frozenset({1}))()
    exact = np.empty_like(out)
    _im2col.conv_stride1(
        np, x, w, b, exact, 1, (1, 1), (1, 1), activation="relu" if relu else "none"
    )
    np.testing.assert_array_equal(out, exact)


def test_packed_weights_are_shared_by_value() -> None:
    rng = np.random.default_rng(7)
    w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    first = _winograd.packed(w)
    assert _winograd.packed(w.copy()) is first  # another context's copy
    assert not first.flags.writeable
    changed = w.copy()
    changed[0, 0, 0, 0] += 1
    assert _winograd.packed(changed) is not first


def test_pack_is_g_w_g_transposed() -> None:
    rng = np.random.default_rng(8)
    w = rng.standard_normal((3, 2, 3, 3))
    g = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
    want = np.einsum("ai,kcij,bj->abkc", g, w, g).reshape(16, 3, 2)
    np.testing.assert_allclose(_winograd.pack(w), want, rtol=1e-14, atol=1e-14)


def test_small_or_grouped_convolutions_are_not_taken() -> None:
    x = np.zeros((1, 32, 8, 8), np.float32)
    w = np.zeros((32, 32, 3, 3), np.float32)
    out = np.zeros((1, 32, 8, 8), np.float32)
    takes = _winograd.takes
    assert takes(np, x, w, out, 1, (1, 1), (1, 1))
    assert not takes(np, x, w, out, 1, (2, 2), (1, 1))
    assert not takes(np, x, w, out, 1, (1, 1), (2, 2))
    assert not takes(np, x, w[:, :16], out, 2, (1, 1), (1, 1))
    small = np.zeros((1, 16, 8, 8), np.float32)
    assert not takes(np, small, w[:, :16], out, 1, (1, 1), (1, 1))
    assert not takes(np, x.astype(np.float16), w, out, 1, (1, 1), (1, 1))
    # Too few tiles for the GEMMs to win (ResNet-18's 7 x 7 layers):
    assert _winograd.MIN_TILES > 16
    seven = np.zeros((1, 32, 7, 7), np.float32)
    call = _winograd.bind_winograd(
        seven,
        w,
        None,
        seven.copy(),
        (1, 1),
        relu=False,
        constant_weights=True,
        exact=lambda: None,
    )
    assert call is None


def _conv_model(c: int, k: int, size: int) -> onnx.ModelProto:
    rng = np.random.default_rng(11)
    w = numpy_helper.from_array(
        rng.standard_normal((k, c, 3, 3)).astype(np.float32), "w"
    )
    b = numpy_helper.from_array(rng.standard_normal(k).astype(np.float32), "b")
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    relu = helper.make_node("Relu", ["y"], ["z"])
    graph = helper.make_graph(
        [node, relu],
        "conv",
        [helper.make_tensor_value_info("x", FLOAT, [1, c, size, size])],
        [helper.make_tensor_value_info("z", FLOAT, [1, k, size, size])],
        [w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_executor_sees_parameters_that_change(taken: list[bool]) -> None:
    """Parameters are packed when bound; setting one binds again, so a run
    after it uses the new weights (never the packed old ones)."""
    graph, params = from_onnx(_conv_model(32, 32, 12))
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 32, 12, 12)).astype(np.float32)
    with graph_executor.create(graph, None, "cpu", params=params) as executor:
        (first,) = executor.run_sync(x=x)
        assert taken and all(taken)
        w, b = np.asarray(params["w"]), np.asarray(params["b"])
        want = np.maximum(conv_reference(x, w, b, 1, [1, 1], [1] * 4, [1, 1]), 0)
        close(first, want)
        new_w = rng.standard_normal(np.shape(w)).astype(np.float32)
        executor.set_input("w", new_w)
        (second,) = executor.run_sync(x=x)
        want = np.maximum(conv_reference(x, new_w, b, 1, [1, 1], [1] * 4, [1, 1]), 0)
        close(second, want)


def test_weights_fed_as_inputs_are_transformed_each_run(taken: list[bool]) -> None:
    """Weights that are graph inputs are not constant: each run packs the
    ones it was given."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 32, 10, 10)).astype(np.float32)
    w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    model = node_model("Conv", {"x": x, "w": w}, pads=[1, 1, 1, 1])
    graph, params = from_onnx(model)
    with graph_executor.create(graph, None, "cpu", params=params) as executor:
        for _ in range(2):
            w = rng.standard_normal(w.shape).astype(np.float32)
            (y,) = executor.run_sync(x=x, w=w)
            close(y, conv_reference(x, w, None, 1, [1, 1], [1] * 4, [1, 1]))
    assert taken and all(taken)


@pytest.mark.parametrize("value", [np.inf, np.nan], ids=repr)
def test_parameters_that_are_not_finite_take_im2col(
    taken: list[bool], value: float
) -> None:
    """A transformed infinity meets its own negative (inf - inf): such
    weights are bound to im2col, whose sums keep infinities as they are."""
    rng = np.random.default_rng(14)
    x = rng.standard_normal((1, 32, 16, 16)).astype(np.float32)
    w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    w[3, 4, 1, 2] = value
    out = np.empty((1, 32, 16, 16), np.float32)
    with np.errstate(invalid="ignore"):  # inf * 0 in BLAS's blocks
        _kernel([1, 1, 1, 1], False, False).bind(x, w, out, constant=frozenset({1}))()
    assert taken == [False]
    want = conv_reference(x, w, None, 1, [1, 1], [1] * 4, [1, 1])
    assert np.isnan(want).any() if value != value else np.isinf(want).any()
    np.testing.assert_array_equal(np.isinf(out), np.isinf(want))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    finite = np.isfinite(want)
    close(out[finite], want[finite])
