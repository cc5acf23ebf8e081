"""Local response normalisation (ONNX ``LRN``) as one compiled pass.

``out = x / (bias + alpha / size * sum of x^2 over a window of channels)
^ beta``. In numpy that is a squaring pass, ``size`` shifted adds, a scale,
a shift, a power and a division per image, each over the whole image
(6.1-6.5x its bytes floor). Compiled (:func:`bind_lrn`), each block of
a few hundred spatial positions is squared into a scratch of the channels
(zero pads around them, as the numpy kernel's), and every output of the
block is made from it at once: the window's squares summed in the numpy
kernel's order, scaled, shifted, raised and divided into, while the block
is in cache. The window's sum is unrolled (one compiled pass a window
size), so it stays in a register: 16 images of 64 x 56 x 56, one thread,
3.5 -> 3.0-3.3 ms (a sums row and ``size`` passes over it before; the
square roots and the division now bound it).

The power is ``t^0.75`` as ``sqrt(t) * sqrt(sqrt(t))``: three correctly
rounded steps, within 2 ulps of the exact power (numpy's ``power``: 1,
at 1.2 ns an element against 0.35 for a square root). Both the compiled
pass and the numpy kernel take that form for ``beta = 0.75`` (AlexNet's and
GoogLeNet's), so they agree bit for bit; other betas keep numpy's
``power`` (and the numpy kernel).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

import numpy as np

from ..runtime import _threads
from . import _jit, _jitmath
from ._common import Array

__all__ = ("BETA", "SCRATCH_FLOATS", "bind_lrn", "power_three_quarters", "takes")

#: The exponent the compiled pass (and the square-root form) serve.
BETA = 0.75
#: Floats of the scratch of a block's squares (``(C + size) x block``, the
#: block a multiple of 16 positions between :data:`MIN_BLOCK` and
#: :data:`MAX_BLOCK`): 512 KiB, in a core's L2 cache. One thread, 64
#: channels of 56 x 56 at batch 16: blocks of 128 positions 6.2 ms, 256
#: 4.4, 512 3.5, 1024 3.1, 1888 3.0-4.1 (noisy; numpy's passes: 7.3).
SCRATCH_FLOATS = 1 << 17
MIN_BLOCK, MAX_BLOCK = 256, 4096
#: Elements each thread gets at least before the pass is split.
MIN_ELEMENTS_PER_THREAD = 1 << 18


def power_three_quarters(total: Array, scratch: Array) -> None:
    """``total = total ^ 0.75`` in place, as ``sqrt(t) * sqrt(sqrt(t))``
    (numpy passes; ``scratch`` is as large as ``total``)."""
    np.sqrt(total, out=total)
    np.sqrt(total, out=scratch)
    np.multiply(total, scratch, out=total)


def takes(x: Array, out: Array, beta: float) -> bool:
    """Whether :func:`bind_lrn` computes an LRN of these arrays: float32,
    C-contiguous, at least 2-D, ``beta`` 0.75, the compiled engine
    available."""
    return bool(
        _jit.available()
        and beta == BETA
        and x.ndim >= 2
        and x.size
        and x.dtype == out.dtype == np.float32
        and x.flags.c_contiguous
        and out.flags.c_contiguous
    )


_SOURCE = """
{kernel}
def lrn_blocks(x, out, squares, first, last, channels, positions, block, per, bias):
    # Blocks first:last of flat x, out ((N, C, P) in C order), block b
    # being image b // blocks and positions block * (b % blocks) on.
    # squares is flat (C + SIZE, block): the channels' squares with
    # (SIZE - 1) // 2 zero rows before them and SIZE // 2 after. Unsigned
    # indices and one contiguous loop per row: numba wraps negative signed
    # indices around, which stops LLVM vectorising.
    u = np.uint64
    width = u(block)
    blocks = (positions + block - 1) // block
    before = u(({size} - 1) // 2)
    scale, shift = np.float32(per), np.float32(bias)
    for b in range(first, last):
        n = b // blocks
        start = (b % blocks) * block
        count = u(min(block, positions - start))
        image = u(n * channels * positions + start)
        for c in range(u(channels)):
            source = image + c * u(positions)
            row = (before + c) * width
            for q in range(count):
                v = x[source + q]
                squares[row + q] = v * v
        for c in range(u(channels)):
            row = c * width
            at = image + c * u(positions)
            for q in range(count):
                # the window's squares in the numpy kernel's order, in a
                # register (the sums row and its SIZE passes before)
                t = {window}
                r = np.sqrt(t * scale + shift)
                out[at + q] = x[at + q] / (r * np.sqrt(r))
"""


@functools.cache
def _kernel(size: int) -> Callable[..., None]:
    """The pass for windows of ``size`` channels, its sum unrolled,
    compiled (or loaded from numba's disk cache)."""
    window = " + ".join(f"squares[row + u({k}) * width + q]" for k in range(size))
    text = "\n".join(
        [
            *_jitmath.head(""),
            _SOURCE.format(kernel=_jitmath.KERNEL, size=size, window=window),
        ]
    )
    module = "asyncrt_lrn_" + hashlib.sha256(text.encode()).hexdigest()[:20]
    return _jit.compile_source(module, text, "lrn_blocks")


def bind_lrn(
    x: Array, out: Array, size: int, alpha: float, bias: float
) -> Callable[[], None]:
    """The LRN of :func:`takes`' arrays (``beta`` 0.75) as a call without
    arguments, split over the kernel threads by blocks where large
    enough."""
    batch, channels = x.shape[:2]
    positions = x.size // (batch * channels)
    block = SCRATCH_FLOATS // (channels + size) // 16 * 16
    block = min(max(block, MIN_BLOCK), MAX_BLOCK, -(-positions // 16) * 16)
    blocks = batch * -(-positions // block)
    shares = _threads.shares(blocks, x.size // MIN_ELEMENTS_PER_THREAD)
    squares = np.zeros((len(shares), (channels + size) * block), np.float32)
    kernel = _kernel(size)
    return _jit.bind_parts(
        kernel,
        (x.reshape(-1), out.reshape(-1), squares),
        shares,
        per_part=frozenset({2}),
        trailing=(
            channels,
            positions,
            block,
            np.float32(alpha / size),
            np.float32(bias),
        ),
    )
