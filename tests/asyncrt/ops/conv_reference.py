"""A float64 reference convolution for the kernel tests."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from asyncrt.ops import register_op_kernel
from asyncrt.ops._kernels import global_namespace_func

__all__ = ("activate", "conv_kernel", "conv_reference")


def conv_reference(
    x: np.ndarray[Any, Any],
    w: np.ndarray[Any, Any],
    b: np.ndarray[Any, Any] | None,
    group: int,
    strides: list[int],
    pads: list[int],
    dilations: list[int],
) -> np.ndarray[Any, Any]:
    """ONNX's Conv of ``x`` by ``w`` (+ ``b``): the sum over every kernel
    offset and input channel, in float64; ``pads`` as ONNX gives them
    (every begin, then every end)."""
    n, _, *spatial = x.shape
    m, cg, *kernel = w.shape
    rank = len(spatial)
    width = [(0, 0), (0, 0), *zip(pads[:rank], pads[rank:], strict=True)]
    padded = np.pad(x.astype(np.float64), width)
    out_sp = [
        (s + pads[a] + pads[rank + a] - (kernel[a] - 1) * dilations[a] - 1)
        // strides[a]
        + 1
        for a, s in enumerate(spatial)
    ]
    out = np.zeros((n, m, *out_sp))
    mg = m // group
    for g in range(group):
        xs = padded[:, g * cg : (g + 1) * cg]
        ws = w[g * mg : (g + 1) * mg].astype(np.float64)
        for pos in itertools.product(*(range(k) for k in kernel)):
            picks = tuple(
                slice(p * d, p * d + (o - 1) * s + 1, s)
                for p, d, o, s in zip(pos, dilations, out_sp, strides, strict=True)
            )
            patch = xs[(slice(None), slice(None), *picks)]
            out[:, g * mg : (g + 1) * mg] += np.einsum(
                "mc,nc...->nm...", ws[(slice(None), slice(None), *pos)], patch
            )
    if b is not None:
        out += b.reshape(1, m, *(1,) * rank)
    return out


def conv_kernel(
    kernel_shape: list[int],
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    group: int,
    *,
    bias: bool,
    relu: bool = False,
    activation: str | None = None,
) -> Any:
    """The library's numpy ``conv`` kernel for these attributes (ReLU or
    ``activation`` fused in, as the ONNX import fuses them); ``pads`` as
    ONNX gives them."""
    attrs: dict[str, Any] = {
        "kernel_shape": list(kernel_shape),
        "strides": strides,
        "dilations": dilations,
        "pads": pads,
        "auto_pad": "NOTSET",
        "group": group,
        "bias": bias,
    }
    if relu or activation is not None:
        attrs["activation"] = "relu" if relu else activation
    kernel = global_namespace_func(register_op_kernel("conv", attrs), "numpy")
    assert kernel is not None
    return kernel


def activate(a: np.ndarray[Any, Any], activation: str) -> np.ndarray[Any, Any]:
    """A convolution's fused activation (``"none"``, ``"relu"``,
    ``"hard_swish"``) applied to reference outputs."""
    if activation == "relu":
        return np.maximum(a, 0)
    if activation == "hard_swish":
        return a * np.clip(a / 6 + 0.5, 0, 1)
    return a


def activated_reference(
    x: np.ndarray[Any, Any],
    w: np.ndarray[Any, Any],
    b: np.ndarray[Any, Any] | None,
    strides: list[int],
    pads: list[int],
    dilations: list[int],
    activation: str,
    *,
    depthwise: bool = False,
) -> np.ndarray[Any, Any]:
    """The float64 reference through ``activation``: one group, or a group
    per channel (``depthwise``)."""
    group = x.shape[1] if depthwise else 1
    return activate(
        conv_reference(x, w, b, group, strides, pads, dilations), activation
    )
