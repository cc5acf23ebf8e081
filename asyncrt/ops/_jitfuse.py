"""Fused elementwise kernels compiled into one loop (numba).

The numpy engine of :mod:`asyncrt.ops._fusion` runs a chain's ufuncs block
by block: one pass over a block per member. Here a fused node becomes one
generated function: for each output element, every member's expression in
turn, in registers, and one store, so a chain reads its inputs and writes
its output once (bias add + erf-GELU: 9 passes become 1). The loop runs over
the output viewed as ``(rows, cols)``, LLVM vectorises the inner one, and
rows are split over :func:`asyncrt.runtime._threads.run_parts` where the
work is large enough (the kernel releases the GIL).

**Which groups.** float32 outputs whose members all have a ``jit``
template (arithmetic, ``relu``, ``abs``, ``sqrt``, ``reciprocal``,
``square``, ``cube``, ``maximum``/``minimum``, ``hard_swish``, ``erf``,
``exp``, ``tanh``, ``sum``, ``copy``...) and whose inputs are, against the
output, whole (same shape), scalars, rows (a vector along the last axis:
biases) or columns (one value per row: ``(..., 1)``). Anything else
(``log``, float64, other broadcasts, arrays that are not C-contiguous) runs
the numpy engine's program instead, as without numba.

**Results.** Each template is the unfused kernel's arithmetic in float32,
in the same order, so results are the unfused ones bit for bit (the
library's float32 ``exp``, ``tanh``, ``sigmoid``, GELU... are these
compiled functions themselves, see :mod:`asyncrt.ops._jitmath`). No
fast-math: LLVM neither reassociates nor contracts to FMA but where a
helper asks for it (``muladd_``), and NaN and infinities behave as in
numpy.

**Compiling.** The generated source is written once to a file named by its
hash in :func:`asyncrt.ops._jit.cache_dir` and imported, so numba's disk
cache (``cache=True``, keyed by that file) serves every later process:
equal chains (a transformer's per-layer GELUs) share one kernel. A kernel
is compiled for its arrays' types (read-only parameters are a type of
their own) when a run context binds it, off the event loop, never during
a run.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

from scheduler.fusion import FusedNode

from . import _jit, _jitmath
from ._kernels import Bindable
from ._library import FusionTemplate, node_fusion_template

__all__ = (
    "MIN_ELEMENTS_PER_THREAD",
    "JitFusedKernel",
    "compilable",
    "compiled_unary",
)

Array = Any
Role = Literal["full", "scalar", "row", "column"]
#: Elements each thread gets at least before a compiled kernel is split over
#: threads: 128Ki, 20-90 us of work. Splitting less saves little and, right
#: after a BLAS call whose threads still spin, makes the pool thread fight
#: them for the cores (W4's GELU on two threads: the next matmul 40x
#: slower in a profile).
MIN_ELEMENTS_PER_THREAD = 1 << 17
#: Columns at least, where every input is whole or a scalar and the output's
#: axes can be merged freely: short inner loops do not vectorise.
MIN_COLUMNS = 1024


def _role(shape: Sequence[int], out: Sequence[int]) -> Role | None:
    """How an input of ``shape`` is read against an output of ``out``."""
    if math.prod(shape) == 1:
        return "scalar"
    padded = (1,) * (len(out) - len(shape)) + tuple(shape)
    if padded == tuple(out):
        return "full"
    if all(d == 1 for d in padded[:-1]) and padded[-1] == out[-1]:
        return "row"
    if padded[:-1] == tuple(out[:-1]) and padded[-1] == 1:
        return "column"
    return None


def _roles(recipe: FusedNode) -> list[Role] | None:
    out = recipe.spec.outputs[0].shape
    if not out:
        return None
    roles = [_role(spec.shape, out) for spec in recipe.input_specs]
    if any(role is None for role in roles):
        return None
    return [role for role in roles if role is not None]


def compilable(recipe: FusedNode) -> bool:
    """Whether :class:`JitFusedKernel` can compile this fused node: numba is
    available, the output is float32 and non-empty, every member has a
    ``jit`` template and every input a role (see the module docstring)."""
    out = recipe.spec.outputs[0]
    if not _jit.available() or out.dtype != "float32" or not math.prod(out.shape):
        return False
    if any(spec.dtype != "float32" for spec in recipe.input_specs):
        return False
    for spec in recipe.members:
        template = node_fusion_template(spec.func_name, spec.attrs)
        if template is None or (template.jit is None and template.variadic is None):
            return False
    return _roles(recipe) is not None


def _columns(recipe: FusedNode, roles: Sequence[Role]) -> int:
    """The inner loop's length: the last axis, or (inputs whole or scalar
    only: any split of the flat arrays will do) the smallest divisor of the
    size from :data:`MIN_COLUMNS` to 16 times it, so that rows remain to
    split over the threads (W2's vectors of 2Mi: one row of 2Mi ran on one
    thread), else the trailing axes merged until at least
    :data:`MIN_COLUMNS`."""
    shape = recipe.spec.outputs[0].shape
    if any(role in ("row", "column") for role in roles):
        return shape[-1]
    size = math.prod(shape)
    for columns in range(MIN_COLUMNS, min(size, 16 * MIN_COLUMNS) + 1):
        if size % columns == 0:
            return columns
    columns = 1
    for extent in reversed(shape):
        columns *= extent
        if columns >= MIN_COLUMNS:
            break
    return columns


def source(recipe: FusedNode, roles: Sequence[Role]) -> str:
    """The Python source of the fused node's compiled function ``kernel(i0,
    ..., out, first, last)`` over rows ``first:last`` of the 2-D views."""
    count = len(roles)
    names = [f"i{k}" for k in range(count)]
    reads = {
        "full": "i{k}[r, c]",
        "row": "i{k}[c]",
        "column": "v{k}",
        "scalar": "s{k}",
    }
    lines = [
        *_jitmath.head(),
        # no signature here: bind compiles one for its arrays' types
        # (parameters are read-only arrays, a type of their own)
        "@numba.njit(cache=True, nogil=True, error_model='numpy', boundscheck=False)",
        f"def kernel({', '.join([*names, 'out', 'first', 'last'])}):",
        "    cols = out.shape[1]",
    ]
    lines += [f"    s{k} = i{k}[0]" for k, role in enumerate(roles) if role == "scalar"]
    lines.append("    for r in range(first, last):")
    lines += [
        f"        v{k} = i{k}[r]" for k, role in enumerate(roles) if role == "column"
    ]
    lines.append("        for c in range(cols):")
    for i, (spec, args) in enumerate(zip(recipe.members, recipe.args, strict=True)):
        operands = [
            reads[roles[a.index]].format(k=a.index)
            if a.source == "input"
            else f"m{a.index}"
            for a in args
        ]
        template = node_fusion_template(spec.func_name, spec.attrs)
        if template is None:
            raise ValueError(f"{spec.func_name!r} has no fusion template")
        lines.append(f"            m{i} = {template.expression('jit', operands)}")
    lines.append(f"            out[r, c] = m{len(recipe.members) - 1}")
    return "\n".join(lines) + "\n"


class JitFusedKernel(Bindable):
    """A fused node as one compiled loop (see the module docstring); the
    dispatcher binds it to its arrays once.

    :param recipe: the fused node; :func:`compilable` must say yes.
    :param fallback: the numpy engine's kernel, for arrays that are not
        C-contiguous.
    """

    def __init__(self, recipe: FusedNode, fallback: Callable[..., None]) -> None:
        super().__init__(self._call, self._bind)
        roles = _roles(recipe)
        if roles is None or not compilable(recipe):
            raise ValueError(f"cannot compile fused node {recipe.spec.name!r}")
        self.recipe = recipe
        self.roles = roles
        self.source = source(recipe, roles)
        self._fallback = fallback
        shape = recipe.spec.outputs[0].shape
        self._columns = _columns(recipe, roles)
        self._rows = math.prod(shape) // self._columns
        digest = hashlib.sha256(self.source.encode()).hexdigest()[:20]
        self._module = f"asyncrt_fused_{digest}"

    def _kernel(self) -> Callable[..., None]:
        function: Callable[..., None] = _jit.compile_source(
            self._module, self.source, "kernel"
        )
        return function

    def _views(self, arrays: Sequence[Array]) -> list[Array] | None:
        if not all(a.flags.c_contiguous for a in arrays):
            return None
        *inputs, out = arrays
        views = []
        for array, role in zip(inputs, self.roles, strict=True):
            if role == "full":
                views.append(array.reshape(self._rows, self._columns))
            elif role == "column":
                views.append(array.reshape(self._rows))
            else:
                views.append(array.reshape(-1))
        views.append(out.reshape(self._rows, self._columns))
        return views

    def _call(self, *arrays: Array) -> None:
        self._bind(*arrays)()

    def _bind(self, *arrays: Array) -> Callable[[], None]:
        """The kernel on these arrays, as a call without arguments (their
        2-D views made once)."""
        views = self._views(arrays)
        if views is None:
            return functools.partial(self._fallback, *arrays)
        return _jit.bind_rows(
            self._kernel(),
            tuple(views),
            self._rows,
            self._columns,
            MIN_ELEMENTS_PER_THREAD,
        )


def _unary_source(expression: str) -> str:
    """A compiled loop applying ``expression`` (over ``{0}``) to each
    element of a float32 vector: ``kernel(a, out, first, last)``."""
    body = expression.format("x[k]")
    return "\n".join(
        [
            *_jitmath.head(),
            _jitmath.KERNEL,
            "def kernel(a, out, first, last):",
            # slices, then indices from 0: LLVM does not vectorise a loop
            # whose index numba must check for negative values (10x)
            "    x, y = a[first:last], out[first:last]",
            "    for k in range(last - first):",
            f"        y[k] = {body}",
            "",
        ]
    )


def compiled_unary(
    template: FusionTemplate | None,
    fallback: Callable[..., None],
    min_size: int = 1,
) -> Bindable:
    """An elementwise op of one input as one compiled loop over float32
    C-contiguous arrays (its ``jit`` template, see the module docstring),
    and
    ``fallback`` for every other array or without numba.

    :param template: the op's fusion template (``None``: always
        ``fallback``).
    :param fallback: the op's numpy kernel ``fallback(a, out)`` (bound
        where it is :class:`~asyncrt.Bindable`).
    :param min_size: smaller arrays take ``fallback`` (where it computes
        them otherwise, as erf does).
    """
    expression = None if template is None else template.jit

    def plain(a: Array, out: Array) -> Callable[[], None]:
        if isinstance(fallback, Bindable):
            return fallback.bind(a, out)
        return functools.partial(fallback, a, out)

    def bind(a: Array, out: Array) -> Callable[[], None]:
        if expression is None or not _jit.takes_pair(
            a, out, "float32", "float32", min_size
        ):
            return plain(a, out)
        text = _unary_source(expression)
        module = "asyncrt_unary_" + hashlib.sha256(text.encode()).hexdigest()[:20]
        kernel = _jit.compile_source(module, text, "kernel")
        arrays = (a.reshape(-1), out.reshape(-1))
        return _jit.bind_rows(kernel, arrays, a.size, 1, MIN_ELEMENTS_PER_THREAD)

    def call(a: Array, out: Array) -> None:
        bind(a, out)()

    return Bindable(call, bind)
