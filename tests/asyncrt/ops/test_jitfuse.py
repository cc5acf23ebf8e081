"""Compiled fused loops: which groups compile, their results against the
unfused kernels (bit for bit), special values, and the
generated sources' disk cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncrt import Bindable, graph_executor
from asyncrt.graph import Graph, GraphBuilder
from asyncrt.ops import _jit, _jitfuse, register_op_kernel
from asyncrt.ops._kernels import global_namespace_func

pytest.importorskip("numba")

SHAPE = (64, 48)


def _chain(ops: list[tuple[str, int]], dtype: str = "float32") -> Graph:
    """``x`` through ``ops`` (name, arity): a binary op's second argument is
    the bias row ``b`` (``(48,)``)."""
    b = GraphBuilder()
    h = b.input("x", shape=SHAPE, dtype=dtype)
    bias = b.param("b", shape=SHAPE[-1:], dtype=dtype)
    for name, arity in ops:
        args = (h, bias) if arity == 2 else (h,)
        h = b.op(name, *args, shape=SHAPE, dtype=dtype)
    b.output(h)
    return b.build()


def _run(graph: Graph, x: np.ndarray[Any, Any], fuse: bool) -> np.ndarray[Any, Any]:
    params = {"b": np.linspace(-1, 1, SHAPE[-1]).astype(x.dtype)}
    with graph_executor.create(graph, None, "cpu", params=params, fuse=fuse) as ex:
        (y,) = ex.run_sync(x=x) or []
    return np.asarray(y.numpy())


def _special(size: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(size) * 3).astype(np.float32)
    x[:8] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -3e38, 5.0]
    return x.reshape(SHAPE)


@pytest.mark.parametrize(
    "ops",
    [
        [("add", 2), ("erf", 1), ("multiply", 2), ("relu", 1)],
        [("bias_add", 2), ("cube", 1), ("hard_swish", 1), ("sqrt", 1)],
        [("subtract", 2), ("square", 1), ("reciprocal", 1), ("abs", 1)],
        [("divide", 2), ("negative", 1), ("maximum", 2), ("minimum", 2)],
        [("multiply", 2), ("sign", 1), ("add", 2)],
        # W2's branch: the library's float32 tanh and exp are these loops
        [("multiply", 2), ("tanh", 1), ("exp", 1), ("sqrt", 1)],
    ],
)
def test_compiled_chains_equal_the_unfused_kernels_bit_for_bit(
    ops: list[tuple[str, int]],
) -> None:
    graph = _chain(ops)
    x = _special(int(np.prod(SHAPE)))
    with np.errstate(all="ignore"):
        want = _run(graph, x, fuse=False)
        got = _run(graph, x, fuse=True)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("op", ["tanh", "exp"])
def test_the_library_tanh_and_exp_are_compiled_loops_near_numpys(
    monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    """Compiled, the library's float32 ``tanh`` and ``exp`` are ``_jitmath``'s
    loops (within 2 and 1 ulps of the exact results: ``test_jitmath``);
    without numba, numpy's ufuncs. The two agree to a few ulps, with the
    same special values."""
    kernel = global_namespace_func(op, "numpy")
    assert isinstance(kernel, Bindable)
    x = _special(int(np.prod(SHAPE)))
    x[0, 8:12] = [9.5, -9.5, 88.8, -104.0]
    got, want = np.empty_like(x), np.empty_like(x)
    with np.errstate(all="ignore"):
        kernel.bind(x, got)()
        monkeypatch.setattr(_jit, "enabled", False)
        kernel.bind(x, want)()
    finite = np.isfinite(want) & (np.abs(want) >= np.finfo(np.float32).tiny)
    ulps = np.abs(
        got[finite].view(np.int32).astype(np.int64) - want[finite].view(np.int32)
    )
    assert ulps.max() <= 3
    edge = ~finite & ~np.isnan(want)
    np.testing.assert_array_equal(got[edge], want[edge])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


def test_which_groups_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    def kernels(graph: Graph, dtype: Any = np.float32) -> list[str]:
        params = {"b": np.zeros(SHAPE[-1], dtype)}
        with graph_executor.create(graph, None, "cpu", params=params, fuse=True) as ex:
            found = ex.core.compiled.kernels
            return [type(found[launch.nid]).__name__ for launch in ex.plan.launches()]

    assert kernels(_chain([("add", 2), ("tanh", 1)])) == ["JitFusedKernel"]
    # log has no compiled counterpart: the numpy engine runs the group
    assert kernels(_chain([("add", 2), ("log", 1)])) == ["ProgramKernel"]
    float64 = _chain([("add", 2), ("tanh", 1)], "float64")
    assert kernels(float64, np.float64) == ["ProgramKernel"]
    monkeypatch.setattr(_jit, "enabled", False)
    assert kernels(_chain([("add", 2), ("tanh", 1)])) == ["ProgramKernel"]


def test_strided_arrays_take_the_numpy_program() -> None:
    graph = _chain([("add", 2), ("relu", 1)])
    params = {"b": np.linspace(-1, 1, SHAPE[-1]).astype(np.float32)}
    with graph_executor.create(graph, None, "cpu", params=params, fuse=True) as ex:
        (launch,) = ex.plan.launches()
        kernel = ex.core.compiled.kernels[launch.nid]
    assert isinstance(kernel, _jitfuse.JitFusedKernel)
    wide = np.random.default_rng(1).standard_normal((64, 96)).astype(np.float32)
    x = wide[:, ::2]
    out = np.empty(SHAPE, np.float32)
    kernel(x, params["b"], out)
    np.testing.assert_array_equal(out, np.maximum(x + params["b"], 0))


def test_generated_sources_are_kept_in_the_cache_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = tmp_path / "made" / "here"
    monkeypatch.setattr(_jit, "cache_root", folder)
    graph = _chain([("multiply", 2), ("cube", 1), ("add", 2)])
    x = _special(int(np.prod(SHAPE)))
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(
            _run(graph, x, fuse=True), _run(graph, x, fuse=False)
        )
    (source,) = folder.glob("asyncrt_fused_*.py")
    assert "def kernel(i0, i1, out, first, last):" in source.read_text()
    assert global_namespace_func("cube", "numpy") is not None


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("hard_swish", None),
        ("power_half", None),
        ("erf", None),
        ("hard_sigmoid", {"alpha": 0.2, "beta": 0.5}),
        ("leaky_relu", {"alpha": 0.01}),
        ("gelu", {"approximate": "none"}),
        ("gelu", {"approximate": "tanh"}),
        ("sign", None),
        ("softsign", None),
    ],
)
def test_compiled_elementwise_ops_equal_their_numpy_kernels(
    monkeypatch: pytest.MonkeyPatch, op: str, attrs: dict[str, Any] | None
) -> None:
    name = op if attrs is None else register_op_kernel(op, attrs)
    kernel = global_namespace_func(name, "numpy")
    assert isinstance(kernel, Bindable)
    x = _special(int(np.prod(SHAPE)))
    x[0, 8:12] = [3e38, -3e38, 9.5, -9.5]
    got = np.empty_like(x)
    with np.errstate(all="ignore"):
        kernel.bind(x, got)()
        monkeypatch.setattr(_jit, "enabled", False)
        want = np.empty_like(x)
        kernel.bind(x, want)()
    if attrs == {"approximate": "tanh"}:
        # without numba, numpy's tanh: the two tanh within 2 ulps of the
        # exact one differ by up to 6e-8 near -1, where 1 + tanh cancels
        # (the absolute error of x (1 + tanh) / 2 stays below 1e-6)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(got[0, 8:12], want[0, 8:12])
    else:
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def _read_only(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    array = array.copy()
    array.flags.writeable = False
    return array


def test_read_only_inputs_compile_too() -> None:
    """Parameters reach kernels as read-only arrays (a type of their own to
    numba): fused loops, compiled elementwise ops and depthwise
    convolutions compile for them as for any array."""
    graph = _chain([("add", 2), ("tanh", 1), ("multiply", 2)])
    bias = np.linspace(-1, 1, SHAPE[-1]).astype(np.float32)
    with graph_executor.create(graph, None, "cpu", params={"b": bias}, fuse=True) as ex:
        (launch,) = ex.plan.launches()
        kernel = ex.core.compiled.kernels[launch.nid]
    assert isinstance(kernel, _jitfuse.JitFusedKernel)
    x = _special(int(np.prod(SHAPE)))
    got, want = np.empty_like(x), np.empty_like(x)
    with np.errstate(all="ignore"):
        kernel(_read_only(x), _read_only(bias), got)
        kernel(x, bias, want)
    np.testing.assert_array_equal(got, want)
    hard_swish = global_namespace_func("hard_swish", "numpy")
    assert isinstance(hard_swish, Bindable)
    hard_swish.bind(_read_only(x), got)()
    hard_swish.bind(x, want)()
    np.testing.assert_array_equal(got, want)
    attrs = {
        "kernel_shape": [3, 3],
        "strides": [1, 1],
        "dilations": [1, 1],
        "pads": [1, 1, 1, 1],
        "auto_pad": "NOTSET",
        "group": 16,
        "bias": True,
    }
    conv = global_namespace_func(register_op_kernel("conv", attrs), "numpy")
    assert isinstance(conv, Bindable)
    images = np.random.default_rng(2).standard_normal((1, 16, 6, 6))
    images = images.astype(np.float32)
    weights = np.random.default_rng(3).standard_normal((16, 1, 3, 3)).astype(np.float32)
    shift = np.linspace(-1, 1, 16).astype(np.float32)
    a, b = np.empty_like(images), np.empty_like(images)
    conv.bind(_read_only(images), _read_only(weights), _read_only(shift), a)()
    conv.bind(images, weights, shift, b)()
    np.testing.assert_array_equal(a, b)


ERF_PROGRAM = """
import sys
import numpy as np
from asyncrt import graph_executor
from asyncrt.graph import GraphBuilder

b = GraphBuilder()
x = b.input("x", shape=(1 << 16,), dtype="float32")
b.output(b.op("erf", x, shape=(1 << 16,), dtype="float32"))
with graph_executor.create(b.build(), None, "cpu") as ex:
    (y,) = ex.run_sync(x=np.linspace(-3, 3, 1 << 16, dtype=np.float32))
assert np.isfinite(y.numpy()).all()
print("numba" in sys.modules)
"""


@pytest.mark.parametrize(("setting", "imported"), [("1", "True"), ("0", "False")])
def test_asyncrt_jit_0_keeps_numba_out_of_the_process(
    setting: str, imported: str
) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "ASYNCRT_JIT": setting}
    done = subprocess.run(
        [sys.executable, "-c", ERF_PROGRAM],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[3],
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == imported


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_relu_in_place_keeps_what_maximum_keeps(dtype: Any) -> None:
    """The convolutions' ReLU (one compiled pass) against ``np.maximum``:
    NaN stays NaN, -inf becomes 0, +inf stays (zeros compare equal
    whatever their sign, as ``maximum``'s own SIMD and scalar loops
    differ there)."""
    from asyncrt.ops._common import COMPILED_RELU_MIN, relu_in_place

    rng = np.random.default_rng(5)
    x = rng.standard_normal(COMPILED_RELU_MIN * 2).astype(dtype)
    x[:4] = [np.nan, -0.0, -np.inf, np.inf]
    got, want = x.copy(), np.maximum(x, 0)
    relu_in_place(np, got)
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[0]) and got[2] == 0 and got[3] == np.inf


@pytest.mark.parametrize("size", [1 << 18, 1_000_003])
def test_long_vectors_split_into_rows_for_the_threads(size: int) -> None:
    """A fused vector whose inputs are whole or scalars is viewed as rows
    of a divisor of its size from ``MIN_COLUMNS`` on (rows the threads can
    share); a prime size stays one row. Results as unfused, bit for bit."""
    b = GraphBuilder()
    h = b.input("x", shape=(size,), dtype="float32")
    scale = b.param("s", shape=(1,), dtype="float32")
    h = b.op("multiply", h, scale, shape=(size,), dtype="float32")
    h = b.op("tanh", h, shape=(size,), dtype="float32")
    b.output(b.op("exp", h, shape=(size,), dtype="float32"))
    graph = b.build()
    params = {"s": np.array([1.3], np.float32)}
    x = np.random.default_rng(2).standard_normal(size).astype(np.float32)
    outputs = []
    for fuse in (True, False):
        with graph_executor.create(graph, None, "cpu", params=params, fuse=fuse) as ex:
            (y,) = ex.run_sync(x=x) or []
            outputs.append(y.numpy())
            if fuse:
                (launch,) = ex.plan.launches()
                kernel = ex.core.compiled.kernels[launch.nid]
    assert isinstance(kernel, _jitfuse.JitFusedKernel)
    rows = 1 if size == 1_000_003 else size // _jitfuse.MIN_COLUMNS
    assert kernel._rows == rows
    np.testing.assert_array_equal(outputs[0], outputs[1])
