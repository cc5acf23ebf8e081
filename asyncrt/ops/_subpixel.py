"""Transposed convolution as stride-1 convolutions, one per output phase.

With strides ``s``, output position ``o = i * s + k - pad`` (no dilation)
gathers input ``i`` through kernel offset ``k``. Split the output by phase
``r = o mod s`` (per axis): its positions ``o = r + s * q`` read the offsets
``k`` with ``k = r + pad (mod s)``, each from input ``q + c_k``, ``c_k = (r +
pad - k) / s``, so each phase is an ordinary stride-1 convolution of the
input with the sub-kernel of those offsets (in the order of ``c_k``: the
offsets reversed) and the pads that line ``c_k`` up. Each runs on the
im2col convolution of :mod:`asyncrt.ops._im2col`, whose GEMM adds the
offsets' contributions as it multiplies, and is copied into its strided
positions of the output: no strided read-modify-write per offset, which is
what col2im spends its time on once the column matrix is larger than the
input (``C / group <= M / group``: measured 1.1-2x faster than col2im there,
and up to 2x slower above it, where col2im stays).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from types import ModuleType

from ._common import Array
from ._im2col import conv_stride1

__all__ = ("Phase", "phases", "run_phases", "worth_it")


@dataclass(frozen=True)
class Phase:
    """One output phase: a stride-1 convolution of part of the input.

    :ivar out_key: its positions in the output (strided slices).
    :ivar shape: its spatial shape.
    :ivar taps: per axis, the kernel offsets of its sub-kernel in
        convolution order, or ``None`` where no offset reaches it.
    :ivar crop: the part of the input it reads.
    :ivar begin: its convolution's pads before each axis.
    """

    out_key: tuple[slice, ...]
    shape: tuple[int, ...]
    taps: tuple[tuple[int, ...], ...] | None
    crop: tuple[slice, ...]
    begin: tuple[int, ...]


@functools.lru_cache(maxsize=256)
def phases(
    in_spatial: tuple[int, ...],
    out_spatial: tuple[int, ...],
    kernel: tuple[int, ...],
    strides: tuple[int, ...],
    begin: tuple[int, ...],
) -> tuple[Phase, ...]:
    """The phases of a transposed convolution without dilation."""
    axes = []
    for size_in, size_out, k, s, pad in zip(
        in_spatial, out_spatial, kernel, strides, begin, strict=True
    ):
        entries = []
        for r in range(min(s, size_out)):
            count = -(-(size_out - r) // s)
            offsets = sorted(
                (o for o in range(k) if (r + pad - o) % s == 0), reverse=True
            )
            first = (r + pad - offsets[0]) // s if offsets else 0
            start = max(0, first)
            stop = min(size_in, first + count + len(offsets) - 1)
            reaches = bool(offsets) and stop > start
            entries.append(
                (
                    slice(r, None, s),
                    count,
                    tuple(offsets) if reaches else None,
                    slice(start, max(start, stop)),
                    max(0, -first),
                )
            )
        axes.append(entries)
    result = []
    for combination in itertools.product(*axes):
        taps = tuple(entry[2] for entry in combination if entry[2] is not None)
        result.append(
            Phase(
                out_key=tuple(entry[0] for entry in combination),
                shape=tuple(entry[1] for entry in combination),
                taps=taps if len(taps) == len(combination) else None,
                crop=tuple(entry[3] for entry in combination),
                begin=tuple(entry[4] for entry in combination),
            )
        )
    return tuple(result)


def run_phases(
    xp: ModuleType,
    plan: tuple[Phase, ...],
    x: Array,
    w: Array,
    bias: Array | None,
    out: Array,
    group: int,
) -> None:
    """``out = conv_transpose(x, w) + bias``, phase by phase.

    :param x: ``(N, C, *in)``.
    :param w: ``(C, M / group, *kernel)``.
    :param bias: ``(M,)`` or ``None``.
    :param out: ``(N, M, *out)``.
    """
    n, c = x.shape[:2]
    cg, mg, kernel = c // group, w.shape[1], w.shape[2:]
    rank = len(kernel)
    # As a convolution's weights: (M, C / group, *kernel).
    weights = w.reshape(group, cg, mg, *kernel).swapaxes(1, 2)
    weights = weights.reshape(group * mg, cg, *kernel)
    whole = len(plan) == 1 and out.flags.c_contiguous
    every = (slice(None), slice(None))
    for phase in plan:
        target = out[every + phase.out_key]
        if phase.taps is None:  # no kernel offset lands here
            if bias is None:
                target[...] = 0
            else:
                xp.copyto(target, bias.reshape(-1, *(1,) * rank))
            continue
        sub = weights[every + tuple(xp.ix_(*phase.taps))]
        source = x[every + phase.crop]
        if not source.flags.c_contiguous:
            source = xp.ascontiguousarray(source)
        result = (
            target if whole else xp.empty((n, out.shape[1], *phase.shape), out.dtype)
        )
        conv_stride1(
            xp,
            source,
            xp.ascontiguousarray(sub),
            bias,
            result,
            group,
            phase.begin,
            (1,) * rank,
        )
        if result is not target:
            xp.copyto(target, result)


def worth_it(
    strides: tuple[int, ...], dilations: tuple[int, ...], c_group: int, m_group: int
) -> bool:
    """Whether the phases beat col2im: no dilation, and strides of 1 (one
    phase: the transposed convolution *is* a convolution) or a column
    matrix at least as large as the input."""
    if any(d != 1 for d in dilations):
        return False
    return math.prod(strides) == 1 or c_group <= m_group
