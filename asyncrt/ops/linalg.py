"""Matrix products configured by attributes: ONNX's Gemm."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from types import ModuleType

from scheduler.dag import TensorSpec

from . import _panel_gemm
from ._common import Array, flag, number
from ._kernels import Bindable
from ._library import Attrs, define

__all__ = ()

Kernel = Callable[..., None]


def _gemm_flops(ins: Sequence[TensorSpec], outs: Sequence[TensorSpec]) -> float:
    """A multiply-add per output element per reduced element: with A (M, K),
    B (K, N) and Y (M, N), whatever the transposes, K^2 = |A| |B| / |Y|."""
    if not outs[0].size:
        return 0.0
    return 2.0 * outs[0].size * math.sqrt(ins[0].size * ins[1].size / outs[0].size)


@define("gemm", flops=_gemm_flops, blas=True)
def _gemm(xp: ModuleType, attrs: Attrs) -> Kernel:
    alpha, beta = number(attrs, "alpha"), number(attrs, "beta")
    trans_a, trans_b = flag(attrs, "trans_a"), flag(attrs, "trans_b")
    has_c = flag(attrs, "bias")

    def bind(
        a: Array, b: Array, *rest: Array, constant: frozenset[int] = frozenset()
    ) -> Callable[[], None]:
        out = rest[-1]
        left, right = a.T if trans_a else a, b.T if trans_b else b
        c = rest[0] if has_c and beta != 0 else None
        matmul, multiply, add = xp.matmul, xp.multiply, xp.add
        if 1 in constant and _panel_gemm.takes(left, right, out):
            # B a parameter: packed once (transposed or not), the bias added
            # as the product is stored where nothing comes between them
            fused = (
                c is not None
                and alpha == 1
                and beta == 1
                and _panel_gemm.takes_bias(c, out)
            )
            packed = _panel_gemm.bind(left, right, out, bias=c if fused else None)
            if fused:
                return packed
            multiplied = packed
        else:
            multiplied = functools.partial(matmul, left, right, out=out)

        def product() -> None:
            multiplied()
            if alpha != 1:
                multiply(out, alpha, out, casting="unsafe")
            if c is not None:
                # beta * c each call: c may be an input that changes
                add(out, c if beta == 1 else beta * c, out, casting="unsafe")

        return product

    def gemm(a: Array, b: Array, *rest: Array) -> None:
        bind(a, b, *rest)()

    return Bindable(gemm, bind, takes_constant=True)
