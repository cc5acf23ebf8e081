"""The kernel library's configured kernels: names, registration, refusals."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asyncrt
from asyncrt import ops
from asyncrt.errors import GraphError, NodeFailedError
from asyncrt.graph import GraphBuilder


def _graph(
    op: str, attrs_json: str, func_name: str | None = None
) -> asyncrt.graph.Graph:
    b = GraphBuilder()
    x = b.input("x", shape=(2, 3), dtype="float32")
    name = func_name or ops.kernel_name(op, attrs_json)
    y = b.op(
        name,
        x,
        shape=(3, 2),
        dtype="float32",
        attrs={ops.OP_NAME_ATTR: op, ops.OP_ATTRS_ATTR: attrs_json},
    )
    b.output(y)
    return b.build()


def test_kernel_names_are_content_addressed() -> None:
    first = ops.register_op_kernel("transpose", {"perm": [1, 0]})
    again = ops.register_op_kernel("transpose", {"perm": (1, 0)})
    other = ops.register_op_kernel("transpose", {"perm": [0, 1]})
    assert first == again != other
    assert first.startswith("transpose.")
    kernel = asyncrt.get_global_func(first, "sim")
    assert kernel is not None
    out = np.empty((3, 2), np.float32)
    kernel(np.arange(6, dtype=np.float32).reshape(2, 3), out)
    np.testing.assert_array_equal(out, np.arange(6).reshape(2, 3).T)


def test_a_graph_registers_its_kernels_from_data() -> None:
    graph = _graph("transpose", ops.encode_attrs({"perm": [1, 0]}))
    with asyncrt.build(graph).create() as executor:
        (y,) = executor.run_sync(x=np.ones((2, 3), np.float32)) or []
    assert y.shape == (3, 2)


@pytest.mark.parametrize(
    ("op", "attrs_json", "message"),
    [
        ("no_such_op", "{}", "unknown kernel library op"),
        ("transpose", '{"perm": [1, 0]}', "canonical"),
        ("transpose", '{"perm":"ab"}', "perm"),
        ("conv", '{"kernel_shape":[3]}', "strides"),
    ],
)
def test_bad_op_attrs_are_graph_errors(op: str, attrs_json: str, message: str) -> None:
    graph = _graph(op, attrs_json)
    with pytest.raises(GraphError, match=message) as info:
        ops.register_graph_kernels(graph)
    assert info.value.node is not None


def test_non_finite_numbers_survive_json() -> None:
    encoded = ops.encode_attrs({"value": float("-inf"), "alpha": np.float32(0.5)})
    assert json.loads(encoded) == {"alpha": 0.5, "value": "-inf"}
    name = ops.register_op_kernel(
        "pad", {"pads": [1, 1], "mode": "constant", "value": float("-inf")}
    )
    kernel = asyncrt.get_global_func(name, "cpu")
    assert kernel is not None
    out = np.empty(4, np.float32)
    kernel(np.array([1.0, 2.0], np.float32), out)
    np.testing.assert_array_equal(out, [-np.inf, 1.0, 2.0, -np.inf])


def test_float32_erf_matches_scipy_within_a_few_ulp() -> None:
    special = pytest.importorskip("scipy.special")
    from asyncrt.ops._builtin import erf_float32

    x = np.concatenate(
        [
            np.linspace(-6, 6, 200_001, dtype=np.float32),
            np.array([0.0, -0.0, np.inf, -np.inf, 1e-30, -1e-30], np.float32),
        ]
    )
    out = np.empty_like(x)
    erf_float32(np, x, out)
    expected = special.erf(x.astype(np.float64))
    assert np.max(np.abs(out - expected)) < 1e-6
    assert np.isnan(erf_float32_of(np.float32(np.nan)))
    erf_float32(np, x, x)  # in place
    np.testing.assert_array_equal(x, out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_and_erf_agree_on_both_sides_of_the_small_array_path(
    dtype: type, approximate: str
) -> None:
    """Up to ``SCIPY_SMALL_FLOAT32`` elements, Erf and Gelu take scipy's
    one-call ufuncs; above it, the rational approximation (float32). Both
    sides match the double-precision definition, non-finite inputs too."""
    special = pytest.importorskip("scipy.special")
    from asyncrt.ops import lookup
    from asyncrt.ops._builtin import SCIPY_SMALL_FLOAT32

    gelu = lookup("gelu").make(np, {"approximate": approximate})
    erf = asyncrt.get_global_func("erf", "cpu")
    rng = np.random.default_rng(7)
    for size in (5, SCIPY_SMALL_FLOAT32, SCIPY_SMALL_FLOAT32 + 1, 4096):
        x = (rng.standard_normal(size) * 3).astype(dtype)
        x[:3] = (np.inf, -np.inf, 0.0)
        wide = x.astype(np.float64)
        with np.errstate(invalid="ignore"):  # -inf * 0 at -inf
            if approximate == "none":
                want = 0.5 * wide * (1 + special.erf(wide / np.sqrt(2)))
            else:
                inner = np.sqrt(2 / np.pi) * (wide + 0.044715 * wide**3)
                want = 0.5 * wide * (1 + np.tanh(inner))
        got = np.full_like(x, np.nan)
        with np.errstate(invalid="ignore", over="ignore"):
            gelu(x, got)
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6, atol=1e-6)
        assert got[0] == np.inf  # x Phi(x) at +inf
        out = np.full_like(x, np.nan)
        erf(x, out)
        np.testing.assert_allclose(out, special.erf(wide), rtol=0, atol=1e-6)


def test_layer_norm_without_vecdot_matches_with_it() -> None:
    """numpy < 2 (and cupy) lack ``vecdot``: the squares' sums fall back to
    ``einsum``, with the same result."""
    from types import SimpleNamespace

    from asyncrt.ops import lookup

    attrs = {"axis": -1, "epsilon": 1e-5, "bias": True, "stats": 2}
    rng = np.random.default_rng(8)
    x = rng.standard_normal((6, 40)).astype(np.float32) * 4 + 1
    scale, bias = rng.standard_normal((2, 40)).astype(np.float32)
    no_vecdot = SimpleNamespace(
        **{
            k: getattr(np, k)
            for k in dir(np)
            if k != "vecdot" and not k.startswith("__")
        }
    )
    results = []
    for xp in (np, no_vecdot):
        y = np.empty_like(x)
        mean, inv = np.empty((6, 1), np.float32), np.empty((6, 1), np.float32)
        lookup("layer_norm").make(xp, attrs)(x, scale, bias, y, mean, inv)  # type: ignore[arg-type]
        results.append((y, mean, inv))
    wide = x.astype(np.float64)
    centred = wide - wide.mean(axis=1, keepdims=True)
    want = centred / np.sqrt((centred**2).mean(axis=1, keepdims=True) + 1e-5)
    for y, mean, inv in results:
        np.testing.assert_allclose(y, want * scale + bias, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(mean[:, 0], wide.mean(axis=1), rtol=1e-6)
        np.testing.assert_allclose(
            inv[:, 0], 1 / np.sqrt(centred.var(axis=1) + 1e-5), rtol=1e-5
        )
    for got, other in zip(results[0], results[1], strict=True):
        np.testing.assert_allclose(got, other, rtol=1e-6, atol=1e-6)


def erf_float32_of(value: np.float32) -> np.float32:
    from asyncrt.ops._builtin import erf_float32

    out = np.empty(1, np.float32)
    erf_float32(np, np.array([value], np.float32), out)
    return out[0]


def test_last_axis_softmax_matches_the_definition() -> None:
    from asyncrt.ops import lookup

    rng = np.random.default_rng(5)
    a = (rng.standard_normal((2, 3, 7, 33)) * 30).astype(np.float32)
    a[0, 0, 0, :5] = -np.inf  # masked positions, as attention masks do
    a[0, 0, 1, 3] = 80.0  # exp would overflow without the shift
    out = np.full_like(a, np.nan)
    lookup("softmax").make(np, {"axes": [3], "log": False})(a, out)
    wide = a.astype(np.float64)
    e = np.exp(wide - wide.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=-1, keepdims=True), atol=1e-6)


@pytest.mark.parametrize(
    ("scale", "extra"),
    [
        (10.0, None),  # within NO_SHIFT_BOUND: no row shift
        (10.0, 64.0),  # at the bound
        (10.0, -64.5),  # just outside: the row maxima
        (10.0, 1e4),  # far outside: exp(x) alone would overflow
        (10.0, np.nan),
        (10.0, np.inf),
    ],
)
@pytest.mark.parametrize("threads", [1, 3])
def test_softmax_with_and_without_the_row_shift(
    scale: float, extra: float | None, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole, and with its rows in blocks over three kernel threads (each
    block decides on its own whether to shift)."""
    from asyncrt.ops import _builtin, lookup
    from asyncrt.ops._builtin import NO_SHIFT_BOUND
    from asyncrt.runtime import _threads

    monkeypatch.setattr(_threads.limits, "threads", threads)
    monkeypatch.setattr(_builtin, "SOFTMAX_SPLIT_ELEMENTS", 1)

    rng = np.random.default_rng(6)
    a = (rng.standard_normal((4, 5, 19)) * scale).astype(np.float32)
    a = np.clip(a, -NO_SHIFT_BOUND, NO_SHIFT_BOUND)
    if extra is not None:
        a[1, 2, 3] = extra
    out = np.full_like(a, -1.0)
    lookup("softmax").make(np, {"axes": [2], "log": False})(a, out)
    wide = a.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(wide - wide.max(axis=-1, keepdims=True))
        want = e / e.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-7)
    if extra is not None and not np.isfinite(extra):
        assert np.isnan(out[1, 2]).all()  # that row only, as the reference
        assert np.isfinite(out[0]).all()


@pytest.mark.parametrize("peak", [3.0, 1e3, np.inf])
def test_builtin_softmax_matches_the_definition(peak: float) -> None:
    """The built-in ``softmax`` kernel (TVM graphs) shares the library
    op's last-axis path: within the no-shift bound, outside it, and with
    an infinite row."""
    from asyncrt import get_global_func

    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 4, 9)).astype(np.float32)
    a[2, 1, 4] = peak
    out = np.full_like(a, -1.0)
    get_global_func("softmax", "cpu")(a, out)
    wide = a.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(wide - wide.max(axis=-1, keepdims=True))
        want = e / e.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-7)


# -- kernels bound to their arrays (asyncrt.Bindable) ---------------------------

_POOL = {"strides": [2, 2], "dilations": [1, 1], "auto_pad": "NOTSET"}
BOUND = [
    # (op, attrs, input shapes, output shape, scratch bytes)
    (
        "max_pool",
        {
            **_POOL,
            "kernel_shape": [3, 3],
            "pads": [1, 1, 1, 1],
            "indices": False,
            "storage_order": 0,
        },
        [(2, 3, 9, 8)],
        (2, 3, 5, 4),
    ),
    (
        "max_pool",
        {
            **_POOL,
            "kernel_shape": [2, 2],
            "pads": None,
            "indices": False,
            "storage_order": 0,
        },
        [(2, 3, 8, 8)],
        (2, 3, 4, 4),
    ),
    (
        "avg_pool",
        {
            **_POOL,
            "kernel_shape": [3, 3],
            "pads": [1, 1, 1, 1],
            "count_include_pad": False,
        },
        [(2, 3, 9, 8)],
        (2, 3, 5, 4),
    ),
    (
        "avg_pool",
        {
            **_POOL,
            "kernel_shape": [3, 3],
            "pads": [1, 1, 1, 1],
            "count_include_pad": True,
        },
        [(1, 2, 40, 40)],
        (1, 2, 20, 20),
    ),
    ("global_avg_pool", {}, [(2, 5, 4, 3)], (2, 5, 1, 1)),
    ("global_max_pool", {}, [(2, 5, 4, 3)], (2, 5, 1, 1)),
    ("softmax", {"axes": [2], "log": False}, [(2, 3, 7)], (2, 3, 7)),
    ("softmax", {"axes": [1], "log": False}, [(2, 3, 7)], (2, 3, 7)),
    (
        "layer_norm",
        {"axis": -1, "epsilon": 1e-5, "bias": True, "stats": 2},
        [(2, 3, 8), (8,), (8,)],
        (2, 3, 8),
    ),
    (
        "layer_norm",
        {"axis": 1, "epsilon": 1e-3, "bias": False, "stats": 0},
        [(2, 3, 8), (3, 8)],
        (2, 3, 8),
    ),
    ("transpose", {"perm": [2, 0, 1]}, [(2, 3, 4)], (4, 2, 3)),
    ("split", {"axis": 1}, [(2, 7, 3)], [(2, 3, 3), (2, 4, 3)]),
    (
        "gemm",
        {"alpha": 0.5, "beta": 2.0, "trans_a": True, "trans_b": False, "bias": True},
        [(4, 3), (4, 5), (5,)],
        (3, 5),
    ),
    (
        "gemm",
        {"alpha": 1.0, "beta": 1.0, "trans_a": False, "trans_b": True, "bias": True},
        [(3, 4), (5, 4), (3, 5)],
        (3, 5),
    ),
    ("gelu", {"approximate": "none"}, [(4, 8)], (4, 8)),
    ("gelu", {"approximate": "none"}, [(40, 80)], (40, 80)),
    ("gelu", {"approximate": "none"}, [(300, 300)], (300, 300)),  # 2 erf blocks
    ("gelu", {"approximate": "tanh"}, [(4, 8)], (4, 8)),
    ("reduce", {"kind": "mean", "axes": [2], "keepdims": True}, [(2, 3, 7)], (2, 3, 1)),
    ("reduce", {"kind": "sum", "axes": [0, 2], "keepdims": False}, [(2, 3, 7)], (3,)),
    ("reduce", {"kind": "max", "axes": [1], "keepdims": False}, [(2, 3, 7)], (2, 7)),
    ("reduce", {"kind": "min", "axes": None, "keepdims": True}, [(2, 3, 7)], (1, 1, 1)),
    ("reduce", {"kind": "l2", "axes": [2], "keepdims": True}, [(2, 3, 7)], (2, 3, 1)),
    ("elu", {"alpha": 0.5, "gamma": 1.0}, [(70, 1000)], (70, 1000)),  # 2 blocks
    (
        "cumsum",
        {"axis": 1, "exclusive": True, "reverse": True},
        [(3, 9, 70)],
        (3, 9, 70),
    ),
    ("instance_norm", {"epsilon": 1e-5}, [(2, 3, 40), (3,), (3,)], (2, 3, 40)),
]


@pytest.mark.parametrize("scratch_bytes", [1 << 20, 0])
@pytest.mark.parametrize(("op", "attrs", "shapes", "out_shape"), BOUND)
def test_a_bound_kernel_computes_what_the_call_does(
    monkeypatch: pytest.MonkeyPatch,
    scratch_bytes: int,
    op: str,
    attrs: dict[str, object],
    shapes: list[tuple[int, ...]],
    out_shape: tuple[int, ...] | list[tuple[int, ...]],
) -> None:
    """``kernel.bind(*arrays)()`` gives the call's bits, run after run on
    new values in the same arrays (pads filled once stay filled); also with
    no room for scratch (the plain call, bound)."""
    monkeypatch.setattr(ops._common, "BOUND_SCRATCH_BYTES", scratch_bytes)
    kernel = ops.lookup(op).make(np, attrs)
    assert isinstance(kernel, asyncrt.Bindable)
    rng = np.random.default_rng(len(shapes))
    inputs = [np.zeros(s, np.float32) for s in shapes]
    shapes_out = out_shape if isinstance(out_shape, list) else [out_shape]
    outs = [np.zeros(shape, np.float32) for shape in shapes_out]
    if op == "layer_norm" and attrs["stats"]:
        outs += [np.zeros((2, 3, 1), np.float32) for _ in range(2)]
    bound = kernel.bind(*inputs, *outs)
    for scale in (1.0, 100.0, 1.0):  # 100: softmax shifts its rows
        for array in inputs:
            array[...] = scale * rng.standard_normal(array.shape)
        want = [np.full_like(o, np.nan) for o in outs]
        kernel(*inputs, *want)
        for o in outs:
            o[...] = np.nan
        bound()
        for got, expected in zip(outs, want, strict=True):
            np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("contiguous", [True, False])
def test_a_bound_erf_runs_block_by_block_to_the_same_bits(contiguous: bool) -> None:
    """Blocks (a short last one included) give the whole-array call's
    bits, and strided arrays (one whole-array pass) erf itself, run after
    run on new values."""
    import scipy.special

    from asyncrt.ops._builtin import bind_erf_float32, erf_float32

    rng = np.random.default_rng(5)
    base = np.zeros((50, 110), np.float32)
    a = base if contiguous else base[:, ::2]
    out = np.zeros(a.shape, np.float32)
    bound = bind_erf_float32(np, a, out, block=1000)
    for scale in (1.0, 5.0):
        a[...] = scale * rng.standard_normal(a.shape)
        want = np.empty_like(out)
        erf_float32(np, a, want)  # whole arrays (blocks of the default size)
        bound()
        np.testing.assert_array_equal(out, want)
        exact = scipy.special.erf(a.astype(np.float64))
        np.testing.assert_allclose(out, exact, rtol=0, atol=1e-6)


def test_the_executor_binds_library_kernels_once_per_context() -> None:
    """A graph of bindable kernels runs them bound (the program's calls take
    no arguments) and gives the unbound kernels' results."""
    attrs = ops.encode_attrs(BOUND[0][1])
    b = GraphBuilder()
    x = b.input("x", shape=(2, 3, 9, 8), dtype="float32")
    pooled = b.op(
        ops.kernel_name("max_pool", attrs),
        x,
        shape=(2, 3, 5, 4),
        dtype="float32",
        attrs={ops.OP_NAME_ATTR: "max_pool", ops.OP_ATTRS_ATTR: attrs},
    )
    b.output(pooled)
    graph = b.build()
    x_value = np.random.default_rng(3).standard_normal((2, 3, 9, 8)).astype(np.float32)
    want = np.full((2, 3, 5, 4), np.nan, np.float32)
    ops.lookup("max_pool").make(np, BOUND[0][1])(x_value, want)
    with asyncrt.build(graph).create() as ex:
        for _ in range(2):
            (got,) = ex.run_sync(x=x_value) or []
            np.testing.assert_array_equal(got.numpy(), want)
        calls = [
            c for batch in ex.core.own_context().program._actions for c in batch.calls
        ]
    (launch,) = [(fn, args) for fn, args, work in calls if work > 0]
    assert launch[1] == () and not isinstance(launch[0], asyncrt.Bindable)


@pytest.mark.anyio
async def test_a_kernel_that_fails_to_bind_fails_its_run_naming_the_node() -> None:
    """A binder that raises fails the run (when its context is made) with
    ``NodeFailedError`` naming the node, the binder's error chained; a
    later run tries again and the executor stays open."""

    def bad_bind(a: np.ndarray, out: np.ndarray) -> Any:
        raise ValueError("cannot bind")

    lib = asyncrt.Module(
        {"twice": asyncrt.Bindable(lambda a, out: np.multiply(a, 2, out), bad_bind)}
    )
    b = GraphBuilder()
    x = b.input("x", shape=(4,), dtype="float32")
    b.output(b.op("twice", x, shape=(4,), dtype="float32", name="dbl"))
    with asyncrt.graph_executor.create(b.build(), lib, "cpu") as ex:
        for _ in range(2):
            with pytest.raises(NodeFailedError) as failed:
                await ex.run(x=np.ones(4, np.float32))
            assert failed.value.node == "dbl"
            assert isinstance(failed.value.__cause__, ValueError)
        assert not ex.closed


# -- window folds (pooling) -----------------------------------------------------


@st.composite
def _window_cases(draw: st.DrawFn) -> tuple[Any, np.ndarray[Any, Any], tuple[int, ...]]:
    from asyncrt.ops._windows import Geometry

    rank = draw(st.integers(1, 3))
    kernel = tuple(draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank)))
    strides = tuple(draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank)))
    dilations = tuple(draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank)))
    outs = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    spatial = tuple(
        (o - 1) * s + (k - 1) * d + 1 + draw(st.integers(0, 2))
        for o, s, k, d in zip(outs, strides, kernel, dilations, strict=True)
    )
    seed = draw(st.integers(0, 2**16))
    x = np.random.default_rng(seed).standard_normal((2, 3, *spatial))
    if draw(st.booleans()):
        x = (100 * x).astype(np.int32)  # max pools fold integers too
    return Geometry(kernel, strides, dilations, None, "VALID"), x, outs


@settings(max_examples=150, deadline=None)
@given(case=_window_cases(), maximum=st.booleans())
def test_a_window_fold_is_the_reduction_over_every_window(
    case: tuple[Any, np.ndarray[Any, Any], tuple[int, ...]], maximum: bool
) -> None:
    """The separable fold (one pass per spatial axis) equals reducing each
    window whole, for any kernel, strides and dilations in 1-3 dimensions:
    max exactly, sums to rounding."""
    from asyncrt.ops._windows import reduce_windows, windows

    geometry, x, outs = case
    out = np.zeros((2, 3, *outs), x.dtype)
    combine = np.maximum if maximum else np.add
    reduce_windows(np, x, geometry, combine, out)
    view = windows(np, x, geometry, outs)
    axes = tuple(range(-len(outs), 0))
    if maximum:
        np.testing.assert_array_equal(out, view.max(axis=axes))
    else:  # rounding is relative to the magnitudes summed, not to the sum
        bound = 1e-12 * float(np.abs(view).sum(axis=axes).max())
        np.testing.assert_allclose(out, view.sum(axis=axes), rtol=0, atol=bound)


@pytest.mark.parametrize("fill", [-3.4028235e38, -np.inf, -80.0, -1e4])
@pytest.mark.parametrize("whole_row", [False, True])
def test_softmax_of_masked_scores(fill: float, whole_row: bool) -> None:
    """Causal masks (a large negative fill) skip the row shift unless a row
    is masked whole (or nearly): then its sum would vanish unshifted."""
    from asyncrt.ops import lookup

    rng = np.random.default_rng(8)
    a = (rng.standard_normal((2, 3, 17, 17)) * 4).astype(np.float32)
    a = np.where(np.tril(np.ones((17, 17), bool)), a, np.float32(fill))
    if whole_row:
        a[1, 2, 5] = fill
    out = np.full_like(a, -1.0)
    lookup("softmax").make(np, {"axes": [3], "log": False})(a, out)
    wide = a.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(wide - wide.max(axis=-1, keepdims=True))
        want = e / e.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-7)
    if whole_row and np.isfinite(fill):
        np.testing.assert_allclose(out[1, 2, 5], 1 / 17, rtol=1e-6)
