"""The epilogue ops (``matmul_bias``, ``add_layer_norm``) against the unfused
kernels they replace, compiled (numba) and on their numpy paths, called and
bound: the numpy paths give the unfused kernels' bits, the compiled loops
agree to float32 rounding."""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _jit, _team_parts, epilogue, lookup
from asyncrt.ops._conv_epilogue import activate_in_place
from asyncrt.ops._kernels import global_namespace_func
from asyncrt.runtime import _threads
from scheduler.dispatch import Bindable

RNG = np.random.default_rng(11)
HAS_NUMBA = importlib.util.find_spec("numba") is not None
ENGINES = [
    pytest.param(
        True, id="compiled", marks=pytest.mark.skipif(not HAS_NUMBA, reason="numba")
    ),
    pytest.param(False, id="numpy"),
]


def _float(*shape: int) -> np.ndarray[Any, Any]:
    return RNG.standard_normal(shape).astype(np.float32)


def _op(name: str, **attrs: Any) -> Any:
    definition = lookup(name)
    assert definition is not None
    return definition.make(np, attrs)


def _unfused_gelu(y: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    out = np.empty_like(y)
    _op("gelu", approximate="none")(y, out)
    return out


def _run(kernel: Any, bound: bool, *arrays: np.ndarray[Any, Any]) -> None:
    if bound:
        assert isinstance(kernel, Bindable)
        kernel.bind(*arrays)()
    else:
        kernel(*arrays)


@pytest.mark.parametrize("constant", [frozenset({1}), frozenset()])
@pytest.mark.parametrize(
    ("axis", "splits", "activation"),
    [(-1, [40, 40, 48], "none"), (2, [3, 125], "relu"), (0, [1, 2], "none")],
)
def test_matmul_bias_writes_a_split_products_parts(
    constant: frozenset[int], axis: int, splits: list[int], activation: str
) -> None:
    # each part its own packed product where the weights are a float32
    # parameter (the last axis), else the whole product and a copy a part:
    # either way the parts of the unsplit kernel's output, bit for bit
    a, w, bias = _float(3, 17, 40), _float(40, 128), _float(128)
    whole = np.empty((3, 17, 128), np.float32)
    single = _op("matmul_bias", activation=activation)
    single.bind(a, w, bias, whole, constant=constant)()
    cuts = np.cumsum(splits)[:-1]
    want = np.split(whole, cuts, axis=axis)
    outs = [np.full(part.shape, np.nan, np.float32) for part in want]
    kernel = _op("matmul_bias", activation=activation, axis=axis, splits=splits)
    kernel.bind(a, w, bias, *outs, constant=constant)()
    for got, part in zip(outs, want, strict=True):
        np.testing.assert_array_equal(got, part)


def test_matmul_bias_refuses_outputs_that_do_not_match_its_splits() -> None:
    kernel = _op("matmul_bias", activation="none", axis=-1, splits=[2, 2])
    a, w, bias = _float(3, 4), _float(4, 4), _float(4)
    with pytest.raises(ValueError, match="1 outputs for splits"):
        kernel.bind(a, w, bias, np.empty((3, 4), np.float32))


@pytest.mark.parametrize("bound", [False, True])
@pytest.mark.parametrize("compiled", ENGINES)
@pytest.mark.parametrize("activation", ["none", "gelu"])
@pytest.mark.parametrize("shape", [(2, 5, 8), (7, 8), (8,)])
def test_matmul_bias_equals_matmul_then_add_then_gelu(
    shape: tuple[int, ...],
    activation: str,
    compiled: bool,
    bound: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_jit, "enabled", compiled)
    a, w, bias = _float(*shape), _float(8, 6), _float(6)
    matmul, add = (global_namespace_func(n, "numpy") for n in ("matmul", "add"))
    assert matmul is not None and add is not None
    expected = np.empty((*shape[:-1], 6), np.float32)
    matmul(a, w, expected)
    add(expected, bias, expected)
    if activation == "gelu":
        expected = _unfused_gelu(expected)
    out = np.full_like(expected, np.nan)
    _run(_op("matmul_bias", activation=activation), bound, a, w, bias, out)
    if compiled and activation == "gelu":
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("bound", [False, True])
@pytest.mark.parametrize("compiled", ENGINES)
def test_matmul_bias_with_the_tanh_gelu_equals_the_library_gelu(
    compiled: bool, bound: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_jit, "enabled", compiled)
    a, w, bias = _float(3, 4, 8) * 3, _float(8, 6), _float(6)
    summed = np.matmul(a, w) + bias
    expected = np.empty_like(summed)
    _op("gelu", approximate="tanh")(summed, expected)
    out = np.full_like(expected, np.nan)
    _run(_op("matmul_bias", activation="gelu_tanh"), bound, a, w, bias, out)
    # the compiled tanh is within 7 ulps of numpy's (docs/kernels.md)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    with np.errstate(over="ignore"):
        x = summed.astype(np.float64)
        formula = (
            0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
        )
    np.testing.assert_allclose(out, formula, rtol=1e-5, atol=1e-5)


def test_matmul_bias_refuses_an_unknown_activation() -> None:
    with pytest.raises(ValueError, match="activation"):
        _op("matmul_bias", activation="relu6")


def _unfused_layer_norm(
    x: np.ndarray[Any, Any],
    r: np.ndarray[Any, Any],
    scale: np.ndarray[Any, Any],
    bias: np.ndarray[Any, Any] | None,
    epsilon: float,
) -> np.ndarray[Any, Any]:
    total = np.add(x, r)
    out = np.empty_like(total)
    norm = _op(
        "layer_norm",
        axis=-1,
        epsilon=epsilon,
        bias=bias is not None,
        stats=0,
        stash_dtype="float32",
    )
    norm(total, scale, *(() if bias is None else (bias,)), out)
    return out


@pytest.mark.parametrize("bound", [False, True])
@pytest.mark.parametrize("compiled", ENGINES)
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("keeps_sum", [False, True])
@pytest.mark.parametrize(
    ("x_shape", "r_shape"),
    [
        ((2, 5, 384), (2, 5, 384)),  # whole lanes of eight
        ((3, 13), (3, 13)),  # a tail after the lanes
        ((4, 5), (4, 5)),  # only a tail
        ((2, 4, 12), (1, 4, 12)),  # a residual broadcast over the batch: cycled
        ((1, 4, 12), (2, 4, 12)),  # the other operand broadcast (the add commutes)
        ((2, 4, 12), (2, 1, 12)),  # broadcast inside the rows: the numpy path
    ],
)
def test_add_layer_norm_equals_add_then_layer_norm(
    x_shape: tuple[int, ...],
    r_shape: tuple[int, ...],
    with_bias: bool,
    keeps_sum: bool,
    compiled: bool,
    bound: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_jit, "enabled", compiled)
    width = x_shape[-1]
    x, r = _float(*x_shape) * 3 + 1, _float(*r_shape)
    scale, bias = _float(width), (_float(width) if with_bias else None)
    expected = _unfused_layer_norm(x, r, scale, bias, 1e-5)
    out = np.full_like(expected, np.nan)
    total = np.full_like(expected, np.nan)
    kernel = _op("add_layer_norm", axis=-1, epsilon=1e-5, bias=with_bias, sum=keeps_sum)
    outputs = (out, total) if keeps_sum else (out,)
    _run(kernel, bound, x, r, scale, *(() if bias is None else (bias,)), *outputs)
    if keeps_sum:
        np.testing.assert_array_equal(total, np.add(x, r))
    # (the loop where only the first axis broadcasts: whole rows cycle)
    takes_loop = compiled and x_shape[1:] == r_shape[1:]
    if takes_loop:
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(out, expected)


@pytest.mark.skipif(not HAS_NUMBA, reason="numba")
def test_add_layer_norm_loop_keeps_non_finite_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_jit, "enabled", True)
    x, r, scale = _float(3, 16), _float(3, 16), _float(16)
    x[1, 3] = np.nan
    x[2, 0] = np.inf
    out = np.empty_like(x)
    kernel = _op("add_layer_norm", axis=-1, epsilon=1e-5, bias=False)
    with np.errstate(invalid="ignore"):  # the library's layer norm warns
        expected = _unfused_layer_norm(x, r, scale, None, 1e-5)
        kernel(x, r, scale, out)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    np.testing.assert_allclose(out[0], expected[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bound", [False, True])
@pytest.mark.parametrize("divide", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scale_add_softmax_gives_the_unfused_kernels_bits(
    divide: bool, bound: bool, dtype: type
) -> None:
    x = (_float(2, 3, 5, 5) * 4).astype(dtype)
    c = np.array(np.sqrt(8.0), dtype)
    mask = np.zeros((2, 1, 1, 5), dtype)
    mask[0, ..., -2:] = np.finfo(dtype).min
    softmax = _op("softmax", axes=[3], log=False)
    scaled = np.divide(x, c) if divide else np.multiply(x, c)
    expected = np.empty_like(x)
    softmax(np.add(scaled, mask), expected)
    out = np.full_like(x, np.nan)
    kernel = _op("scale_add_softmax", divide=divide, axes=[3])
    _run(kernel, bound, x, c, mask, out)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("divide", [True, False])
@pytest.mark.parametrize("cond_shape", [(1, 1, 6, 6), (6, 6), (2, 1, 1, 6)])
@pytest.mark.parametrize("compiled", [*ENGINES, "split"])
def test_scale_where_softmax_gives_the_unfused_kernels_bits(
    keep: bool,
    divide: bool,
    cond_shape: tuple[int, ...],
    compiled: bool | str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # where(k, x / c, f) with keep (a causal mask as PyTorch exports it),
    # where(k, f, x / c) without: the compiled rows or the numpy passes;
    # "split": the rows shared out on the native team (its slots carry the
    # boolean mask and flags) where it runs, else the part pool
    if compiled == "split":
        if not _jit.enabled:
            pytest.skip("the compiled rows are split")
        monkeypatch.setattr(_team_parts, "MIN_TEAM_ELEMENTS", 1)
        monkeypatch.setattr(epilogue, "SOFTMAX_SPLIT_ELEMENTS", 1)
        monkeypatch.setattr(_threads.limits, "compiled_threads", 3)
        monkeypatch.setattr(_threads.limits, "threads", 3)
    else:
        monkeypatch.setattr(_jit, "enabled", compiled)
    x = _float(2, 3, 6, 6) * 4
    x[0, 0, 1, 1] = np.nan  # its row is NaN, as the unfused kernels have it
    c, f = np.array(np.sqrt(8.0), np.float32), np.array(-np.inf, np.float32)
    # a row mask with both values: one all filled would be NaN anyway (all
    # -inf), and drawn at random it depended on the tests run before
    row = np.array([True, False, True, True, False, True])
    k = np.tril(np.ones((6, 6), bool)) if cond_shape[-2] == 6 else row
    k = np.ascontiguousarray(np.broadcast_to(k, cond_shape))
    scaled = np.divide(x, c) if divide else np.multiply(x, c)
    expected = np.empty_like(x)
    _op("softmax", axes=[3], log=False)(
        np.where(k, scaled, f) if keep else np.where(k, f, scaled), expected
    )
    out = np.full_like(x, 7.0)
    kernel = _op("scale_where_softmax", divide=divide, keep=keep, axes=[3])
    kernel.bind(x, c, k, f, out)()
    np.testing.assert_array_equal(out, expected)
    kept = np.broadcast_to(k, x.shape)[0, 0, 1, 1] == keep  # the NaN not filled
    assert np.isnan(out[0, 0, 1]).all() == kept


@pytest.mark.parametrize("compiled", ENGINES)
def test_scale_softmax_without_a_mask_and_with_a_float64_scale(
    compiled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_jit, "enabled", compiled)
    x = _float(3, 4, 9)
    softmax = _op("softmax", axes=[2], log=False)
    for c in (np.array(0.125, np.float32), np.array(0.125, np.float64)):
        expected = np.empty_like(x)
        softmax(np.multiply(x, c, out=np.empty_like(x), casting="unsafe"), expected)
        out = np.empty_like(x)
        _op("scale_add_softmax", divide=False, axes=[2]).bind(x, c, out)()
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("bound", [False, True])
@pytest.mark.parametrize("seq", [5, 40])  # K^T as a view; copied first
def test_matmul_views_multiplies_the_transposed_views(bound: bool, seq: int) -> None:
    q, k = _float(2, seq, 3, 4), _float(2, seq, 3, 4)
    expected = np.matmul(
        np.ascontiguousarray(q.transpose(0, 2, 1, 3)),
        np.ascontiguousarray(k.transpose(0, 2, 3, 1)),
    ).transpose(0, 2, 1, 3)
    out = np.full(expected.shape, np.nan, np.float32)
    kernel = _op(
        "matmul_views", perm_a=[0, 2, 1, 3], perm_b=[0, 2, 3, 1], perm_out=[0, 2, 1, 3]
    )
    _run(kernel, bound, q, k, out)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


def test_matmul_views_refuses_a_permutation_that_is_none() -> None:
    with pytest.raises(ValueError, match="perm_a"):
        _op("matmul_views", perm_a=[0, 0], perm_b=None, perm_out=None)


@pytest.mark.skipif(not HAS_NUMBA, reason="numba")
def test_loops_split_over_threads_give_the_same_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from asyncrt.ops import _epijit
    from asyncrt.runtime import _threads

    monkeypatch.setattr(_jit, "enabled", True)
    monkeypatch.setattr(_epijit, "MIN_ELEMENTS_PER_THREAD", 8)
    limits = _threads.ThreadLimits(cores=2)
    monkeypatch.setattr(_threads, "limits", limits)
    lease = limits.acquire(2)
    limits.compiled_threads = 2  # (as where no BLAS pool shares the cores)
    try:
        assert limits.threads == 2
        x, r, scale = _float(7, 24), _float(7, 24), _float(24)
        expected = _unfused_layer_norm(x, r, scale, None, 1e-5)
        out = np.empty_like(x)
        _op("add_layer_norm", axis=-1, epsilon=1e-5, bias=False)(x, r, scale, out)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
        a, w, bias = _float(9, 8), _float(8, 6), _float(6)
        want = _unfused_gelu(np.add(np.matmul(a, w), bias))
        got = np.empty_like(want)
        _op("matmul_bias", activation="gelu")(a, w, bias, got)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    finally:
        lease.release()


def _unfused_squeeze_excite(
    x: np.ndarray[Any, Any],
    w1: np.ndarray[Any, Any],
    b1: np.ndarray[Any, Any],
    w2: np.ndarray[Any, Any],
    b2: np.ndarray[Any, Any],
    gate: str,
) -> np.ndarray[Any, Any]:
    """The library's unfused kernels in the graph's order: GAP, 1 x 1 conv
    with ReLU, 1 x 1 conv, the gate, the product."""
    pooled = np.empty((*x.shape[:2], 1, 1), x.dtype)
    _op("global_avg_pool")(x, pooled)
    hidden = np.empty((x.shape[0], w1.shape[0], 1, 1), x.dtype)
    conv = {"kernel_shape": [1, 1], "strides": [1, 1], "dilations": [1, 1]}
    conv |= {"pads": [0] * 4, "auto_pad": "NOTSET", "group": 1, "bias": True}
    _op("conv", **conv, activation="relu")(pooled, w1, b1, hidden)
    logits = np.empty((*x.shape[:2], 1, 1), x.dtype)
    _op("conv", **conv, activation="none")(hidden, w2, b2, logits)
    scale = np.empty_like(logits)
    if gate == "sigmoid":
        sigmoid = global_namespace_func("sigmoid", "numpy")
        assert sigmoid is not None
        sigmoid(logits, scale)
    else:
        _op("hard_sigmoid", alpha=1 / 6, beta=0.5)(logits, scale)
    return x * scale


@pytest.mark.parametrize("compiled", ENGINES)
@pytest.mark.parametrize("gate", ["hard_sigmoid", "sigmoid"])
@pytest.mark.parametrize("shape", [(1, 16, 14, 14), (3, 40, 7, 7), (2, 24, 1, 1)])
def test_squeeze_excite_equals_the_unfused_block(
    compiled: bool, gate: str, shape: tuple[int, ...], monkeypatch: Any
) -> None:
    monkeypatch.setattr(_jit, "enabled", compiled)
    channels, reduced = shape[1], max(1, shape[1] // 4)
    x = _float(*shape)
    w1, b1 = _float(reduced, channels, 1, 1) * 0.5, _float(reduced)
    w2, b2 = _float(channels, reduced, 1, 1) * 0.5, _float(channels)
    want = _unfused_squeeze_excite(x, w1, b1, w2, b2, gate)
    kernel = _op("squeeze_excite", gate=gate, alpha=1 / 6, beta=0.5)
    out = np.full_like(x, np.nan)
    kernel.bind(x, w1, b1, w2, b2, out)()
    # (the means and the products sum in another order)
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=2e-6)
    again = np.full_like(x, np.nan)
    kernel(x, w1, b1, w2, b2, again)
    np.testing.assert_array_equal(again, out)


@pytest.mark.parametrize("compiled", ENGINES)
@pytest.mark.parametrize("constant", [frozenset({2, 3}), frozenset()])
@pytest.mark.parametrize("activation", ["none", "relu", "hard_swish"])
@pytest.mark.parametrize("shape", [(1, 40, 14, 14), (3, 24, 2, 3)])
def test_the_gates_then_the_gated_convolution_equal_the_excitation_then_the_conv(
    compiled: bool,
    constant: frozenset[int],
    activation: str,
    shape: tuple[int, ...],
    monkeypatch: Any,
) -> None:
    """``squeeze_gates`` gives the gates ``squeeze_excite`` scales by, and
    ``fused_pointwise`` of them the 1 x 1 convolution of the excited
    tensor: bit for bit (the panel GEMM rounds each scaled row as the
    excitation stores it), the gates read anew on every call."""
    monkeypatch.setattr(_jit, "enabled", compiled)
    channels, reduced, outputs = shape[1], max(1, shape[1] // 4), 20
    x = _float(*shape) * 3
    w1, b1 = _float(reduced, channels, 1, 1) * 0.5, _float(reduced)
    w2, b2 = _float(channels, reduced, 1, 1) * 0.5, _float(channels)
    w, b = _float(outputs, channels, 1, 1) * 0.3, _float(outputs)
    gate_attrs = {"gate": "hard_sigmoid", "alpha": 1 / 6, "beta": 0.5}
    excited = np.empty_like(x)
    _op("squeeze_excite", **gate_attrs).bind(x, w1, b1, w2, b2, excited)()
    gates = np.full(shape[:2], np.nan, np.float32)
    _op("squeeze_gates", **gate_attrs).bind(x, w1, b1, w2, b2, gates)()
    np.testing.assert_array_equal(x * gates[:, :, None, None], excited)
    conv = {"kernel_shape": [1, 1], "strides": [1, 1], "dilations": [1, 1]}
    conv |= {"pads": [0] * 4, "auto_pad": "NOTSET", "group": 1, "bias": True}
    plain = _op("conv", **conv, activation=activation)
    gated = _op("fused_pointwise", gated=True, residual=False, activation=activation)
    out = np.full((shape[0], outputs, *shape[2:]), np.nan, np.float32)
    call = gated.bind(x, gates, w, b, out, constant=constant)
    for _ in range(2):
        want = np.empty_like(out)
        plain_constant = frozenset({1, 2}) if constant else frozenset()
        plain.bind(x * gates[:, :, None, None], w, b, want, constant=plain_constant)()
        call()
        np.testing.assert_array_equal(out, want)
        gates[...] = RNG.uniform(0, 1, gates.shape)  # the next run's gates
    unbound = np.empty_like(out)
    gated(x, gates, w, b, unbound)
    want = np.empty_like(out)
    plain(x * gates[:, :, None, None], w, b, want)
    np.testing.assert_array_equal(unbound, want)


@pytest.mark.parametrize("compiled", ENGINES)
@pytest.mark.parametrize("constant", [frozenset({1, 2}), frozenset()])
@pytest.mark.parametrize("activation", ["none", "relu", "hard_swish"])
@pytest.mark.parametrize("residual_shape", [(2, 20, 7, 9), (1, 20, 1, 9)])
def test_a_residual_is_the_convolution_then_the_add_then_the_activation(
    compiled: bool,
    constant: frozenset[int],
    activation: str,
    residual_shape: tuple[int, ...],
    monkeypatch: Any,
) -> None:
    """``fused_pointwise`` with a residual: the bits of the biased 1 x 1
    convolution, numpy's add (broadcast where the residual is smaller)
    and the activation's pass; the residual read anew on every call."""
    monkeypatch.setattr(_jit, "enabled", compiled)
    x = _float(2, 12, 7, 9) * 2
    w, b = _float(20, 12, 1, 1) * 0.3, _float(20)
    residual = _float(*residual_shape)
    conv = {"kernel_shape": [1, 1], "strides": [1, 1], "dilations": [1, 1]}
    conv |= {"pads": [0] * 4, "auto_pad": "NOTSET", "group": 1, "bias": True}
    plain = _op("conv", **conv, activation="none")
    kernel = _op("fused_pointwise", gated=False, residual=True, activation=activation)
    out = np.full((2, 20, 7, 9), np.nan, np.float32)
    call = kernel.bind(x, w, b, residual, out, constant=constant)
    for _ in range(2):
        want = np.empty_like(out)
        plain.bind(x, w, b, want, constant=constant)()
        want += residual
        activate_in_place(np, want, activation)
        call()
        np.testing.assert_array_equal(out, want)
        residual[...] = _float(*residual_shape)
    unbound = np.empty_like(out)
    kernel(x, w, b, residual, unbound)
    want = np.empty_like(out)
    plain(x, w, b, want)
    want += residual
    activate_in_place(np, want, activation)
    np.testing.assert_array_equal(unbound, want)


def test_squeeze_excite_in_place_and_in_float64() -> None:
    x = RNG.standard_normal((2, 12, 6, 6))
    w1, b1 = RNG.standard_normal((3, 12, 1, 1)), RNG.standard_normal(3)
    w2, b2 = RNG.standard_normal((12, 3, 1, 1)), RNG.standard_normal(12)
    want = _unfused_squeeze_excite(x, w1, b1, w2, b2, "sigmoid")
    kernel = _op("squeeze_excite", gate="sigmoid", alpha=1.0, beta=0.0)
    x32 = x.astype(np.float32)
    args32 = [a.astype(np.float32) for a in (w1, b1, w2, b2)]
    want32 = _unfused_squeeze_excite(x32, *args32, "sigmoid")
    kernel.bind(x32, *args32, x32)()  # the output over the input
    np.testing.assert_allclose(x32, want32, rtol=2e-6, atol=2e-6)
    out = np.empty_like(x)
    kernel.bind(x, w1, b1, w2, b2, out)()  # float64: numpy's passes
    np.testing.assert_allclose(out, want, rtol=1e-12)
