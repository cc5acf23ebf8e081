"""A convolution's GEMM with the weights packed once (the constant on the
left): against a float64 product at channel counts that cut the blocks and
plane sizes that cut the vectors, batches, one thread, two and crowded;
bias and ReLU as the passes would give them; nothing written past the
output; inside an executor: 1x1 convolutions of parameters (hard-swish
after), the new weights after ``set_input``, weights fed as inputs left to
the other paths; ONNX's Gemm of a parameter."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from asyncrt import graph_executor
from asyncrt.frontend import from_onnx
from asyncrt.ops import _jit, _panel_conv, _panel_gemm
from asyncrt.ops._conv_epilogue import add_bias_activation
from asyncrt.runtime import _threads

pytestmark = pytest.mark.skipif(not _jit.available(), reason="numba not installed")
FLOAT = onnx.TensorProto.FLOAT
RNG = np.random.default_rng(41)


def _f(*shape: int) -> np.ndarray[Any, Any]:
    return RNG.standard_normal(shape).astype(np.float32)


def _want(w: Any, x: Any, bias: Any = None, relu: bool = False) -> Any:
    out = np.einsum("kd,ndp->nkp", w.astype(np.float64), x.astype(np.float64))
    if bias is not None:
        out = out + bias[None, :, None]
    return np.maximum(out, 0) if relu else out


def _threads_as(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Kernel threads as ``mode`` says ("one thread", "two threads" or
    "crowded"), every product split."""
    monkeypatch.setattr(_threads.limits, "threads", 1 if mode == "one thread" else 2)
    monkeypatch.setattr(_threads.limits, "gemm_parts", 2 if mode == "crowded" else 1)
    monkeypatch.setattr(_panel_conv, "MIN_PARALLEL_WORK", 0)


def _close(out: Any, want: Any) -> None:
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("mode", ["one thread", "two threads", "crowded"])
@pytest.mark.parametrize(
    ("depth", "positions"),
    [(37, 70), (37, 5), (37, 49), (1100, 33), (1100, 36)],  # (as the residual's)
)
def test_scaled_rows_give_the_bits_of_the_scaled_input(
    monkeypatch: pytest.MonkeyPatch, mode: str, depth: int, positions: int
) -> None:
    """Each image's rows of x times its own scale as they are loaded: the
    product of the scaled input (a squeeze-excitation's output), bit for
    bit, the scale read on every call."""
    _threads_as(monkeypatch, mode)
    w, x, bias = _f(20, depth), _f(2, depth, positions), _f(20)
    scale = _f(2, depth)
    out = np.full((2, 20, positions), np.nan, np.float32)
    call = _panel_conv.bind(w, x, out, bias=bias, activation="hard_swish", scale=scale)
    for _ in range(2):
        want = np.empty_like(out)
        scaled = x * scale[:, :, None]
        _panel_conv.bind(w, scaled, want, bias=bias, activation="hard_swish")()
        call()
        np.testing.assert_array_equal(out, want)
        scale[...] = _f(2, depth)  # new gates: read anew
    with pytest.raises(ValueError, match="scale"):
        _panel_conv.bind(w, x, out, scale=scale[:, :-1])


@pytest.mark.parametrize("mode", ["one thread", "two threads", "crowded"])
@pytest.mark.parametrize("activation", ["none", "relu", "hard_swish"])
@pytest.mark.parametrize(
    ("depth", "positions"),
    # 32 + 32 + 8; lone ones; 16 with one beside it; chunked: 16 + 16 with
    # 1 beside it, 16 + 16 with 4 beside it
    [(37, 70), (37, 5), (37, 49), (1100, 33), (1100, 36)],
)
def test_a_residual_is_added_before_the_activation_as_the_add_would(
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    activation: str,
    depth: int,
    positions: int,
) -> None:
    """``act(w @ x + bias + residual)``: the bits of the product with its
    bias, then numpy's add, then the library's activation pass; the
    residual's planes spaced apart (a view), read anew on every call."""
    _threads_as(monkeypatch, mode)
    w, x, bias = _f(20, depth), _f(2, depth, positions), _f(20)
    storage = _f(2, 20, positions + 3)
    residual = storage[:, :, :positions]
    out = np.full((2, 20, positions), np.nan, np.float32)
    call = _panel_conv.bind(
        w,
        x,
        out,
        bias=bias,
        activation=activation,
        residual=residual,
    )
    for _ in range(2):
        want = np.empty_like(out)
        _panel_conv.bind(w, x, want, bias=bias)()
        want += residual
        if activation != "none":
            add_bias_activation(np, want[..., None], None, want[..., None], activation)
        call()
        np.testing.assert_array_equal(out, want)
        storage[...] = _f(*storage.shape)
    with pytest.raises(ValueError, match="residual"):
        _panel_conv.bind(w, x, out, residual=residual[:, :-1])


@pytest.mark.parametrize("mode", ["one thread", "two threads", "crowded"])
@pytest.mark.parametrize(
    ("images", "channels", "depth", "positions"),
    [
        (1, 1, 1, 1),
        (2, 13, 7, 17),  # a cut block of channels, 16 + 1 positions
        (1, 96, 72, 49),  # 7 x 7: 32 + 16 with one beside it
        (3, 40, 24, 196),
        (1, 16, 16, 15),  # narrower than a vector: one at a time
        (1, 24, 9, 200),
    ],
)
def test_products_match_float64(
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    images: int,
    channels: int,
    depth: int,
    positions: int,
) -> None:
    _threads_as(monkeypatch, mode)
    w, x = _f(channels, depth), _f(images, depth, positions)
    size = images * channels * positions
    storage = np.full(size + 40, np.nan, np.float32)
    out = storage[:size].reshape(images, channels, positions)
    assert _panel_conv.takes(w, x, out)
    call = _panel_conv.bind(w, x, out)
    call()
    _close(out, _want(w, x))
    x[...] = _f(*x.shape)  # new values in the same storage, as a run's
    call()
    _close(out, _want(w, x))
    assert np.isnan(storage[size:]).all()


@pytest.mark.parametrize(
    ("images", "blocks", "strips", "wanted", "split"),
    [
        # 3 blocks over two threads: halves of the positions, not 1 + 2 blocks
        (1, 3, 24, 2, (1, 2)),
        (1, 120, 1, 2, (2, 1)),  # 7 x 7 planes: the blocks
        (1, 9, 3, 2, (2, 1)),  # 5 + 4 blocks of 3 strips before 9 blocks of 2
        (1, 2, 24, 2, (1, 2)),  # equal: positions (each thread reads half)
        (4, 3, 24, 2, (1, 1)),  # images enough
        (1, 3, 24, 8, (1, 8)),
    ],
)
def test_parts_are_balanced_over_the_threads(
    images: int, blocks: int, strips: int, wanted: int, split: tuple[int, int]
) -> None:
    assert _panel_conv._split(images, blocks, strips, wanted) == split


@pytest.mark.parametrize("threads", [1, 2])
def test_chunks_of_wider_rows(monkeypatch: pytest.MonkeyPatch, threads: int) -> None:
    """``x`` a chunk of a wider column matrix, ``out`` a run of each of an
    output's planes (rows longer than the chunk): only the chunk's cells
    are read and written."""
    monkeypatch.setattr(_threads.limits, "threads", threads)
    monkeypatch.setattr(_panel_conv, "MIN_PARALLEL_WORK", 0)
    w = _f(20, 30)
    cols = _f(30, 100)
    planes = np.full((2, 20, 150), np.nan, np.float32)
    x = cols[None, :, :70]  # (1, 30, 70), rows 100 apart
    out = planes[1:, :, 40:110]  # (1, 20, 70), rows 150 apart
    assert _panel_conv.takes(w, x, out)
    _panel_conv.bind(w, x, out)()
    _close(out, _want(w, x))
    assert np.isnan(planes[0]).all()
    assert np.isnan(planes[1, :, :40]).all() and np.isnan(planes[1, :, 110:]).all()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("positions", "blocks"),
    [
        (57, 56),  # 32 + 16 + 8 + a lone one
        (5, 0),  # lone ones
        (49, 49),  # 32 + 16 with one beside it
        (100, 100),  # 32 + 32 + 16 + 16 with 4 beside it
        (36, 36),  # 16 + 16 with 4 beside it
        (23, 16),  # 16 + 7 lone ones
    ],
)
def test_depth_chunks_continue_each_sum(
    monkeypatch: pytest.MonkeyPatch, threads: int, positions: int, blocks: int
) -> None:
    # the partial sums kept in out between chunks, the bias and activation
    # applied after the last one: the cells of a block (and of the columns
    # summed beside one) are the unchunked bits, a lone position's column
    # adds its partial sums in another order
    monkeypatch.setattr(_threads.limits, "threads", threads)
    monkeypatch.setattr(_panel_conv, "MIN_PARALLEL_WORK", 0)
    w, x, bias = _f(20, 37), _f(2, 37, positions), _f(20)
    whole = np.empty((2, 20, positions), np.float32)
    _panel_conv.bind(w, x, whole, bias=bias, activation="relu")()  # depth 37: whole
    monkeypatch.setattr(_panel_conv, "CHUNKED_DEPTH", 16)
    monkeypatch.setattr(_panel_conv, "DEPTH_CHUNK", 5)
    _panel_conv._kernel_address.cache_clear()
    try:
        chunked = np.full((2, 20, positions), np.nan, np.float32)
        call = _panel_conv.bind(w, x, chunked, bias=bias, activation="relu")
        call()
        call()  # (the partial sums start again on every call)
    finally:
        _panel_conv._kernel_address.cache_clear()
    _close(chunked, _want(w, x, bias, relu=True))
    np.testing.assert_array_equal(chunked[..., :blocks], whole[..., :blocks])


@pytest.mark.parametrize("chunked", [False, True])
def test_every_width_of_a_run_is_summed_once(
    monkeypatch: pytest.MonkeyPatch, chunked: bool
) -> None:
    """Runs of 1 to 104 positions inside wider rows (every mix of blocks of
    32, 16 and 8, lone columns beside a block or on their own), unchunked
    and by chunks of depth: each cell is the float64 product's, a chunk's
    sums added once, and no cell outside the run is written."""
    monkeypatch.setattr(_threads.limits, "threads", 1)
    if chunked:
        monkeypatch.setattr(_panel_conv, "CHUNKED_DEPTH", 16)
        monkeypatch.setattr(_panel_conv, "DEPTH_CHUNK", 5)
    _panel_conv._kernel_address.cache_clear()
    try:
        w, bias = _f(12, 37), _f(12)
        cols = _f(37, 120)
        for width in range(1, 105):
            planes = np.full((12, 120), np.nan, np.float32)
            x, out = cols[None, :, 3 : 3 + width], planes[None, :, 5 : 5 + width]
            _panel_conv.bind(w, x, out, bias=bias)()
            _close(out, _want(w, x, bias))
            assert (
                np.isnan(planes[:, :5]).all() and np.isnan(planes[:, 5 + width :]).all()
            )
    finally:
        _panel_conv._kernel_address.cache_clear()


# blocks of vectors; lone columns; 32 + 16 with one beside it
@pytest.mark.parametrize("positions", [70, 1, 49])
@pytest.mark.parametrize(
    ("bias", "activation"),
    [
        (True, "none"),
        (True, "relu"),
        (False, "relu"),
        (True, "hard_swish"),
        (False, "hard_swish"),
    ],
)
def test_the_epilogue_gives_the_passes_bits(
    bias: bool, activation: str, positions: int
) -> None:
    w, x = _f(20, 30), _f(2, 30, positions) * 4  # past hard-swish's clamps too
    x[1, :, [positions // 2, positions - 1]] = np.nan  # NaN positions, kept by both
    shift = _f(20)
    product = np.empty((2, 20, positions), np.float32)
    _panel_conv.bind(w, x, product)()
    want = product + shift[None, :, None] if bias else product.copy()
    if activation != "none":  # the library's pass, as a convolution applies it
        add_bias_activation(np, want[..., None], None, want[..., None], activation)
    out = np.full(product.shape, np.inf, np.float32)
    _panel_conv.bind(
        w,
        x,
        out,
        bias=shift if bias else None,
        activation=activation,
    )()
    np.testing.assert_array_equal(out, want)
    assert np.isnan(out[1, :, [positions // 2, positions - 1]]).all()
    assert (np.signbit(out) == np.signbit(want)).all()


@pytest.mark.parametrize("mode", ["one thread", "two threads", "crowded"])
@pytest.mark.parametrize(
    ("images", "channels", "depth", "positions"),
    [(16, 13, 7, 17), (36, 24, 40, 49), (2, 8, 1100, 33)],  # (the last chunked)
)
def test_a_stack_multiplies_each_image_by_its_own_weights(
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    images: int,
    channels: int,
    depth: int,
    positions: int,
) -> None:
    """Winograd's positions: ``out[n] = w[n] @ x[n]``, with ``x`` and
    ``out`` planes spaced as the Winograd kernel spaces them."""
    _threads_as(monkeypatch, mode)
    w = _f(images, channels, depth)
    x = _f(images, depth, positions + 3)[:, :, :positions]  # spaced planes
    out_storage = np.full((images, channels, positions + 5), np.nan, np.float32)
    out = out_storage[:, :, :positions]
    assert _panel_conv.takes(w, x, out)
    assert not _panel_conv.takes(w[:-1], x, out)  # a matrix for every image
    call = _panel_conv.bind(w, x, out)
    call()
    want = np.einsum("nkd,ndp->nkp", w.astype(np.float64), x.astype(np.float64))
    _close(out, want)
    assert np.isnan(out_storage[:, :, positions:]).all()
    again = np.empty_like(out)
    _panel_conv.bind_packed(_panel_conv.pack(w), channels, x, again)()
    np.testing.assert_array_equal(again, out)


def test_what_it_takes() -> None:
    w, x, out = _f(4, 8), _f(2, 8, 9), np.empty((2, 4, 9), np.float32)
    assert _panel_conv.takes(w, x, out, _f(4))
    assert not _panel_conv.takes(w, x, out, _f(5))
    assert not _panel_conv.takes(w.astype(np.float64), x, out)
    assert not _panel_conv.takes(w, _f(2, 9, 8).transpose(0, 2, 1), out)
    assert not _panel_conv.takes(_f(4, 0), _f(2, 0, 9), out)
    assert not _panel_conv.takes(w, _f(2, 8, 10), out)


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Which packed kernel each binding took."""
    seen: list[str] = []
    for module in (_panel_conv, _panel_gemm):
        bind = module.bind

        def spy(
            *args: Any, _bind: Any = bind, _name: str = module.__name__, **kw: Any
        ) -> Any:
            seen.append(_name.rsplit(".", 1)[-1])
            return _bind(*args, **kw)

        monkeypatch.setattr(module, "bind", spy)
    return seen


def _pointwise_model(activation: str | None, weights_as_input: bool = False) -> Any:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if activation else "y"])]
    if activation:
        nodes.append(helper.make_node(activation, ["c"], ["y"]))
    inputs = [helper.make_tensor_value_info("x", FLOAT, [2, 24, 7, 9])]
    inits = [numpy_helper.from_array(_f(40), "b")]
    if weights_as_input:
        inputs.append(helper.make_tensor_value_info("w", FLOAT, [40, 24, 1, 1]))
    else:
        inits.append(numpy_helper.from_array(_f(40, 24, 1, 1), "w"))
    graph = helper.make_graph(
        nodes,
        "g",
        inputs,
        [helper.make_tensor_value_info("y", FLOAT, [2, 40, 7, 9])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _reference(x: Any, w: Any, b: Any, activation: str | None) -> Any:
    y = np.einsum("kc,nchw->nkhw", w.reshape(w.shape[:2]).astype(np.float64), x)
    y = y + b[None, :, None, None]
    if activation == "Relu":
        return np.maximum(y, 0)
    if activation == "HardSwish":
        return y * np.clip(y / 6 + 0.5, 0, 1)
    return y


@pytest.mark.parametrize("activation", [None, "Relu", "HardSwish"])
def test_pointwise_convolutions_of_parameters_take_it(
    taken: list[str], activation: str | None
) -> None:
    graph, params = from_onnx(_pointwise_model(activation))
    x = _f(2, 24, 7, 9)
    w, b = np.asarray(params["w"]), np.asarray(params["b"])
    with graph_executor.create(graph, None, "cpu", params=params) as executor:
        (y,) = executor.run_sync(x=x)
        assert taken == ["_panel_conv"]
        _close(y.numpy(), _reference(x, w, b, activation))
        new_w = _f(*w.shape)
        executor.set_input("w", new_w)
        (y,) = executor.run_sync(x=x)
        _close(y.numpy(), _reference(x, new_w, b, activation))


def test_pointwise_weights_fed_as_inputs_take_another_path(taken: list[str]) -> None:
    graph, params = from_onnx(_pointwise_model("Relu", weights_as_input=True))
    x, w = _f(2, 24, 7, 9), _f(40, 24, 1, 1)
    b = np.asarray(params["b"])
    with graph_executor.create(graph, None, "cpu", params=params) as executor:
        (y,) = executor.run_sync(x=x, w=w)
    _close(y.numpy(), _reference(x, w, b, "Relu"))
    assert taken == []


@pytest.mark.parametrize(
    ("trans_b", "alpha", "beta"), [(1, 1.0, 1.0), (0, 1.0, 1.0), (1, 0.5, 2.0)]
)
def test_onnx_gemm_of_a_parameter_takes_the_panels(
    taken: list[str], trans_b: int, alpha: float, beta: float
) -> None:
    w = _f(30, 20) if trans_b else _f(20, 30)
    c = _f(30)
    node = helper.make_node(
        "Gemm", ["x", "w", "c"], ["y"], transB=trans_b, alpha=alpha, beta=beta
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", FLOAT, [6, 20])],
        [helper.make_tensor_value_info("y", FLOAT, [6, 30])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    g, params = from_onnx(model)
    x = _f(6, 20)
    with graph_executor.create(g, None, "cpu", params=params) as executor:
        (y,) = executor.run_sync(x=x)
    right = w.T if trans_b else w
    want = alpha * (x.astype(np.float64) @ right) + beta * c
    _close(y.numpy(), want)
    assert taken == ["_panel_gemm"]


@pytest.mark.parametrize(
    ("shape", "channels", "kernel", "stride", "pads", "path"),
    [
        # a stem: row chunks of a column matrix, each chunk's GEMM packed
        ((1, 3, 40, 40), 16, 7, 2, 3, "_row_chunks"),
        # small planes of many channels, 5 x 5 (no Winograd)
        ((1, 96, 7, 7), 40, 5, 1, 2, "_row_chunks"),
        ((1, 16, 14, 14), 32, 3, 2, 1, "_row_chunks"),
        # ResNet's downsampling: one strided window, the column matrix kept
        ((2, 32, 14, 14), 64, 1, 2, 0, "_strided"),
    ],
)
def test_convolutions_of_parameters_multiply_by_packed_weights(
    monkeypatch: pytest.MonkeyPatch,
    shape: tuple[int, ...],
    channels: int,
    kernel: int,
    stride: int,
    pads: int,
    path: str,
) -> None:
    """Im2col's GEMMs (row chunks, the strided column matrix) take the
    packed weights where the weights are a parameter; the new weights after
    ``set_input``."""
    from .conv_reference import conv_reference

    seen: list[str] = []
    bind = _panel_conv.bind

    def spy(*args: Any, **kw: Any) -> Any:
        seen.append(sys._getframe(1).f_globals["__name__"].rsplit(".", 1)[-1])
        return bind(*args, **kw)

    monkeypatch.setattr(_panel_conv, "bind", spy)
    w = _f(channels, shape[1], kernel, kernel)
    b = _f(channels)
    node = helper.make_node(
        "Conv", ["x", "w", "b"], ["y"], strides=[stride] * 2, pads=[pads] * 4
    )
    size = (shape[2] + 2 * pads - kernel) // stride + 1
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", FLOAT, [shape[0], channels, size, size])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    g, params = from_onnx(model)
    x = _f(*shape)
    with graph_executor.create(g, None, "cpu", params=params) as executor:
        (y,) = executor.run_sync(x=x)
        assert seen and set(seen) == {path}  # (the binder that took it)
        want = conv_reference(x, w, b, 1, [stride] * 2, [pads] * 4, [1, 1])
        _close(y.numpy(), want)
        new_w = _f(*w.shape)
        executor.set_input("w", new_w)
        (y,) = executor.run_sync(x=x)
        want = conv_reference(x, new_w, b, 1, [stride] * 2, [pads] * 4, [1, 1])
        _close(y.numpy(), want)


def test_an_unknown_activation_is_refused() -> None:
    w, x = _f(8, 4), _f(1, 4, 32)
    out = np.empty((1, 8, 32), np.float32)
    with pytest.raises(ValueError, match="gelu"):
        _panel_conv.bind(w, x, out, activation="gelu")
