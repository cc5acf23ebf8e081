"""GEMMs of a constant matrix packed into column panels: against a float64
product at row and column counts that cut the register blocks and panels,
stacked rows, one thread, numba's pool and the crowded split; non-finite
values where a sum of products puts them; what it takes; packed once and
shared; concurrent callers; inside an executor (parameters only, the new
weights after ``set_input``); the pool left alone where it is not safe."""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from asyncrt import graph_executor
from asyncrt.frontend import from_onnx
from asyncrt.ops import _jit, _packed, _panel_gemm
from asyncrt.runtime import _native_team, _threads

pytestmark = pytest.mark.skipif(not _jit.available(), reason="numba not installed")

FLOAT = onnx.TensorProto.FLOAT
RNG = np.random.default_rng(23)


def _float(*shape: int) -> np.ndarray[Any, Any]:
    return RNG.standard_normal(shape).astype(np.float32)


def _close(out: Any, a: Any, b: Any) -> None:
    want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = max(float(np.abs(want).max()), 1.0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * scale)


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The shapes of ``b`` each binding of the panel kernel was given."""
    seen: list[tuple[int, ...]] = []
    bind = _panel_gemm.bind

    def spy(a: Any, b: Any, out: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(b.shape)
        return bind(a, b, out, *args, **kwargs)

    monkeypatch.setattr(_panel_gemm, "bind", spy)
    return seen


SHAPES = [
    # rows of a (a stack where several), depth, columns
    ((1,), 1, 1),
    ((7,), 5, 31),  # fewer rows than a block, a cut panel
    ((8,), 64, 32),  # one whole block, one whole panel
    ((9,), 3, 33),  # a block and a row; a panel and a column
    ((17,), 384, 100),
    ((2, 13), 40, 64),  # stacked rows
    ((130,), 96, 70),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("rows", "depth", "cols"), SHAPES)
def test_products_match_float64(
    monkeypatch: pytest.MonkeyPatch,
    threads: int,
    rows: tuple[int, ...],
    depth: int,
    cols: int,
) -> None:
    """Every cell written, and nothing past the output's end (its storage
    is followed by NaN that must stay), on one thread or split over numba's
    pool."""
    monkeypatch.setattr(_threads.limits, "threads", threads)
    a, b = _float(*rows, depth), _float(depth, cols)
    size = int(np.prod(rows)) * cols
    storage = np.full(size + _panel_gemm.PANEL, np.nan, np.float32)
    out = storage[:size].reshape(*rows, cols)
    assert _panel_gemm.takes(a, b, out)
    guard = storage[size:]
    call = _panel_gemm.bind(a, b, out)
    call()
    _close(out, a, b)
    a[...] = _float(*a.shape)  # new values in the same storage, as a run's
    call()
    _close(out, a, b)
    assert np.isnan(guard).all()


@pytest.mark.parametrize("parts", [2, 3])
def test_the_crowded_split_agrees(monkeypatch: pytest.MonkeyPatch, parts: int) -> None:
    """While other processes crowd the kernel threads down to one, runs of
    panels go over the part pool: the same product."""
    monkeypatch.setattr(_threads.limits, "threads", 1)
    monkeypatch.setattr(_threads.limits, "gemm_parts", parts)
    a, b = _float(50, 200), _float(200, 300)
    out = np.full((50, 300), np.nan, np.float32)
    _panel_gemm.bind(a, b, out)()
    _close(out, a, b)


def test_more_threads_than_panels_split_the_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_threads.limits, "threads", 2)
    a, b = _float(100, 64), _float(64, 10)  # one panel, 13 row blocks
    out = np.full((100, 10), np.nan, np.float32)
    _panel_gemm.bind(a, b, out)()
    _close(out, a, b)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("bias", "relu"), [(True, False), (True, True), (False, True)])
@pytest.mark.parametrize(("rows", "cols"), [(13, 70), (8, 64), (3, 5)])
def test_the_epilogue_gives_the_passes_bits(
    monkeypatch: pytest.MonkeyPatch,
    threads: int,
    bias: bool,
    relu: bool,
    rows: int,
    cols: int,
) -> None:
    """Bias and ReLU applied as blocks are stored give the bits of ``add``
    and ``maximum`` run after the same product (NaN kept), whole panels and
    cut ones alike."""
    monkeypatch.setattr(_threads.limits, "threads", threads)
    a, b = _float(rows, 96), _float(96, cols)
    a[1, 3] = np.nan  # a row of NaN, kept by ReLU
    shift = _float(cols)
    product = np.empty((rows, cols), np.float32)
    _panel_gemm.bind(a, b, product)()
    want = product + shift if bias else product.copy()
    if relu:
        np.maximum(want, 0, out=want)
    out = np.full((rows, cols), np.inf, np.float32)
    _panel_gemm.bind(a, b, out, bias=shift if bias else None, relu=relu)()
    np.testing.assert_array_equal(out, want)
    assert np.isnan(out[1]).all()


def test_what_bias_it_takes() -> None:
    out = np.empty((4, 6), np.float32)
    assert _panel_gemm.takes_bias(_float(6), out)
    assert not _panel_gemm.takes_bias(_float(6).astype(np.float64), out)
    assert not _panel_gemm.takes_bias(_float(1, 6), out)
    assert not _panel_gemm.takes_bias(_float(12)[::2], out)
    assert not _panel_gemm.takes_bias(_float(5), out)


def test_non_finite_values_land_where_a_sum_of_products_puts_them() -> None:
    a, b = _float(9, 6), _float(6, 40)
    a[2, 3] = np.inf
    a[5, 0] = np.nan
    b[1, 7] = -np.inf
    b[4, 39] = 0.0
    out = np.empty((9, 40), np.float32)
    _panel_gemm.bind(a, b, out)()
    with np.errstate(invalid="ignore"):
        want = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(out), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(out), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(out[finite], want[finite], rtol=1e-5, atol=1e-5)


def test_what_it_takes() -> None:
    a, b, out = _float(4, 8), _float(8, 6), np.empty((4, 6), np.float32)
    assert _panel_gemm.takes(a, b, out)
    assert not _panel_gemm.takes(a.astype(np.float64), b, out.astype(np.float64))
    assert not _panel_gemm.takes(_float(8, 4).T, b, out)  # rows not contiguous
    assert not _panel_gemm.takes(a, _float(8), np.empty(4, np.float32))
    assert not _panel_gemm.takes(_float(8), b, np.empty(6, np.float32))
    assert not _panel_gemm.takes(a, _float(8, 0), np.empty((4, 0), np.float32))
    deep = _panel_gemm.MAX_DEPTH + 1
    assert not _panel_gemm.takes(
        _float(2, deep), _float(deep, 3), np.empty((2, 3), np.float32)
    )


def test_panels_hold_the_columns_in_runs_and_are_shared_by_value() -> None:
    b = _float(5, 70)
    panels = _panel_gemm.pack(b)
    assert panels.shape == (3, 5, _panel_gemm.PANEL)
    np.testing.assert_array_equal(panels[1], b[:, 32:64])
    np.testing.assert_array_equal(panels[2, :, :6], b[:, 64:])
    assert not panels[2, :, 6:].any()
    # the same values: one packed array, kept while a binding holds it
    first = _packed.shared("panel_gemm", b, _panel_gemm.pack)
    assert _packed.shared("panel_gemm", b.copy(), _panel_gemm.pack) is first
    assert not first.flags.writeable


def test_concurrent_callers_each_get_their_product(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Calls from several threads at once, each launching on numba's pool."""
    monkeypatch.setattr(_threads.limits, "threads", 2)
    b = _float(96, 200)
    jobs = []
    for _ in range(6):
        a = _float(24, 96)
        out = np.full((24, 200), np.nan, np.float32)
        jobs.append((a, out, _panel_gemm.bind(a, b, out)))

    def work(job: Any) -> None:
        for _ in range(30):
            job[2]()

    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(work, jobs))
    for a, out, _ in jobs:
        _close(out, a, b)


def test_no_team_where_it_is_unsafe(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a process forked after a team ran (GNU OpenMP does not survive a
    fork), or without libgomp, the product runs on the calling thread."""
    monkeypatch.setattr(_threads.limits, "threads", 2)
    launches: list[int] = []
    parallel = _native_team._gomp_parallel()
    if parallel is None:
        pytest.skip("no libgomp here")

    def spy(*args: Any) -> None:
        launches.append(args[2])
        parallel(*args)

    monkeypatch.setattr(_native_team, "_gomp_parallel", lambda: spy)
    monkeypatch.setattr(_native_team, "_parallel", spy)  # (the launch's fast path)
    team = _native_team._spin_team()
    if team is not None:  # (the launch's fastest path: the spinning team)
        launch = team.call

        def spin_spy(*args: Any) -> int:
            launches.append(args[3])
            held: int = launch(*args)
            return held

        monkeypatch.setattr(team, "call", spin_spy)
    a, b = _float(20, 300), _float(300, 100)
    out = np.full((20, 100), np.nan, np.float32)
    call = _panel_gemm.bind(a, b, out)
    call()
    assert launches == [2]  # (large enough to split: a team of two)
    _close(out, a, b)
    monkeypatch.setattr(_native_team, "_launched_in", os.getpid() + 1)
    out[...] = np.nan
    call()
    _close(out, a, b)
    assert launches == [2]
    monkeypatch.setattr(_native_team, "_launched_in", None)
    monkeypatch.setattr(_native_team, "_gomp_parallel", lambda: None)
    out[...] = np.nan
    call()
    _close(out, a, b)
    assert launches == [2]


def _matmul_model(depth: int, cols: int, bias: bool) -> onnx.ModelProto:
    w = numpy_helper.from_array(_float(depth, cols), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y" if not bias else "p"])]
    inits = [w]
    if bias:
        inits.append(numpy_helper.from_array(_float(cols), "b"))
        nodes.append(helper.make_node("Add", ["p", "b"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", FLOAT, [2, 5, depth])],
        [helper.make_tensor_value_info("y", FLOAT, [2, 5, cols])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("bias", [False, True])
def test_an_executor_packs_its_parameters_and_sees_them_change(
    taken: list[tuple[int, ...]], bias: bool
) -> None:
    graph, params = from_onnx(_matmul_model(48, 40, bias))
    x = _float(2, 5, 48)
    w = np.asarray(params["w"])
    shift = np.asarray(params["b"]) if bias else 0.0
    with graph_executor.create(graph, None, "cpu", params=params) as executor:
        (y,) = executor.run_sync(x=x)
        assert taken == [(48, 40)]
        _close(y.numpy() - shift, x, w)
        new_w = _float(48, 40)
        executor.set_input("w", new_w)
        (y,) = executor.run_sync(x=x)
        _close(y.numpy() - shift, x, new_w)


def test_weights_fed_as_inputs_take_blas(taken: list[tuple[int, ...]]) -> None:
    model = _matmul_model(16, 8, bias=False)
    model.graph.input.append(helper.make_tensor_value_info("w", FLOAT, [16, 8]))
    del model.graph.initializer[:]
    graph, params = from_onnx(model)
    x, w = _float(2, 5, 16), _float(16, 8)
    with graph_executor.create(graph, None, "cpu", params=params) as executor:
        (y,) = executor.run_sync(x=x, w=w)
    _close(y.numpy(), x, w)
    assert taken == []
