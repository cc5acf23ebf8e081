"""The optional compiled engine: numba (on llvmlite), where it is installed.

Kernels that numpy can only express as many whole-array passes (a depthwise
convolution is two passes per kernel tap; hard-swish four) are written once
as plain Python loops over arrays in modules of their own, and compiled here
by numba on first use: one pass over memory, vectorised by LLVM. Without
numba (it is the ``jit`` extra, not a dependency) or with :data:`enabled`
cleared, every such kernel takes its numpy path, which computes the same
results (see each kernel for its tolerance).

What the compiled kernels promise:

* **No fast-math.** They are compiled without ``fastmath``: LLVM may not
  reassociate sums or assume no NaN or infinity, so IEEE special values
  propagate as in numpy, and a loop's result differs from numpy's passes
  only where it sums in a different order (documented per kernel).
* **numpy's error model**: a division by zero is inf or NaN, never an
  exception.
* **No GIL**: a compiled call releases it, so kernels split their work
  into parts (:func:`bind_parts`) that run truly in parallel: on the
  native team the products run on (:mod:`asyncrt.ops._team_parts`: a
  launch costs 2.1 us on 2 cores), else over :func:`asyncrt.runtime._threads.run_parts`
  (the part pool, sized by the host streams' share of the cores). Not on
  numba's own pool (``parallel=True``): its layer compiles each loop's
  callees again, and with OpenBLAS's threads spinning too (numpy's BLAS)
  MobileNetV3 took 96 ms instead of 2.8 on the 2-core VM (3.2 ms with
  ``OMP_WAIT_POLICY=passive``, where a hand-off costs 65 us against the
  part pool's 53).
* **Compiled once per machine**: ``cache=True`` keeps the machine code on
  disk (numba's cache: ``__pycache__`` beside the kernel's module, or
  ``NUMBA_CACHE_DIR``), so another process loads it instead of compiling.

Costs (AMD EPYC VM, 2 cores): ``import numba`` 0.5-0.6 s, paid on the
first compiled kernel a process makes (never by ``import asyncrt``); a
kernel's cold compilation 0.2-0.8 s, loading it from the disk cache tens of
milliseconds. The first run of W1 fused (1000 additions, one compiled
loop) took 1.31 s cold and 0.55 s with the cache (numba's import, mostly);
W4's 1.22 and 0.54 s. numba and llvmlite add about 210 MB to an
installation (35 and 173 MB), and about 140 MB to a process's RSS once
imported (109 MB by ``import numba``, the rest when LLVM first loads code):
the MiniLM-size encoder serving 64 callers peaks at 313 MB with them and
176 MB without (ONNX Runtime's process: 199 MB).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._module_files import import_file
from ..runtime import _threads

__all__ = (
    "FLOATS",
    "available",
    "bind_parts",
    "bind_rows",
    "cache_dir",
    "compile_kernel",
    "compile_source",
    "enabled",
    "specialise",
    "takes_pair",
)

#: Whether compiled kernels are used where numba is installed (tests clear
#: it to run the numpy paths). ``ASYNCRT_JIT=0`` in the environment clears
#: it for a process: numba is then never imported, which keeps its memory
#: (about 140 MB of RSS once it has loaded LLVM) out of a serving process.
enabled = os.environ.get("ASYNCRT_JIT", "1") != "0"
# (reentrant: a generated module may compile the kernels it calls as it is
# imported, see asyncrt.ops._team_parts)
_lock = threading.RLock()


@functools.cache
def _installed() -> bool:
    return importlib.util.find_spec("numba") is not None


#: The float dtypes the compiled loops are written for.
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def available() -> bool:
    """Whether kernels may compile: numba is installed and :data:`enabled`."""
    return enabled and _installed()


def takes_pair(a: Any, out: Any, dtype: str, out_dtype: str, min_size: int = 1) -> bool:
    """Whether a compiled elementwise loop from ``a`` to ``out`` applies:
    kernels may compile, ``a`` and ``out`` are numpy arrays of these
    dtypes and one shape, at least ``min_size`` elements, and are both
    C-contiguous (flat views of them are the arrays themselves)."""
    return bool(
        available()
        and isinstance(a, np.ndarray)  # cupy's arrays look alike
        and isinstance(out, np.ndarray)
        and a.dtype.name == dtype
        and out.dtype.name == out_dtype
        and a.shape == out.shape
        and a.size >= max(min_size, 1)
        and a.flags.c_contiguous
        and out.flags.c_contiguous
    )


@functools.cache
def _compiled(function: Callable[..., Any]) -> Callable[..., Any]:
    numba = importlib.import_module("numba")
    jitted: Callable[..., Any] = numba.njit(
        cache=True, nogil=True, error_model="numpy", boundscheck=False
    )(function)
    return jitted


def compile_kernel(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` compiled by numba (once per process; its machine code
    from the disk cache where another process made it).

    :param function: a module-level function numba can compile (its module
        file is the cache's key).
    :raises ModuleNotFoundError: if numba is not installed.
    """
    with _lock:  # numba's dispatcher creation is not thread-safe
        return _compiled(function)


def specialise(function: Any, args: tuple[Any, ...]) -> None:
    """Compile numba ``function`` for the types of ``args`` now (if it is
    not yet), rather than on its first call: binding happens off the event
    loop, a run should not pay the compiler."""
    numba = importlib.import_module("numba")
    function.compile(tuple(numba.typeof(arg) for arg in args))


def bind_rows(
    kernel: Callable[..., None],
    arrays: tuple[Any, ...],
    rows: int,
    row_size: int,
    min_elements: int,
) -> Callable[[], None]:
    """``kernel(*arrays, first, last)`` over rows ``0:rows`` as a call
    without arguments: compiled for these arrays now (see
    :func:`specialise`), and split over the kernel threads (see
    :func:`bind_parts`): on the native team from
    :data:`asyncrt.ops._team_parts.MIN_TEAM_ELEMENTS` elements (of ``row_size``
    a row), else where each part-pool thread gets at least ``min_elements``
    (0: a row each)."""
    from . import _team_parts

    work = rows * row_size
    if not min_elements:
        return bind_parts(kernel, arrays, _threads.shares(rows, rows), work=work)
    least = _team_parts.MIN_TEAM_ELEMENTS
    shares = _team_parts.shares(rows, work, min_elements, min_team_work=least)
    return bind_parts(kernel, arrays, shares, work=work)


def bind_parts(
    kernel: Callable[..., None],
    arrays: tuple[Any, ...],
    shares: Sequence[tuple[int, int]],
    *,
    per_part: frozenset[int] = frozenset(),
    trailing: tuple[Any, ...] = (),
    work: float = float("inf"),
) -> Callable[[], None]:
    """``kernel(*arrays, first, last, *trailing)`` for every ``(first,
    last)`` of ``shares``, at once, as a call without arguments, compiled
    for these arguments now (a run should not pay the compiler).

    :param kernel: a compiled kernel (:func:`compile_source` or
        :func:`compile_kernel`).
    :param per_part: positions in ``arrays`` of scratch arrays with one row
        per share: part ``p`` gets row ``p``.
    :param work: the call's work (multiply-adds, cells): while other
        processes crowd the cores, below
        :data:`asyncrt.runtime._native_team.CROWDED_MIN_WORK` the team's
        shares run on the calling thread (unknown: on the part pool).
    """

    def args(part: int) -> tuple[Any, ...]:
        return tuple(a[part] if i in per_part else a for i, a in enumerate(arrays))

    from . import _team_parts  # (imports numba's pieces: only once kernels compile)

    if len(shares) == 1:
        first, last = shares[0]
        # one ctypes call of the slots, not numba's dispatcher (which
        # checks every argument's type on each call)
        alone = _team_parts.bind_alone(kernel, args(0), shares[0], trailing)
        if alone is not None:
            return alone
        call = (*args(0), first, last, *trailing)
        specialise(kernel, call)
        return functools.partial(kernel, *call)

    # (the team's wrapper compiles the kernel into its own code: a
    # specialisation for these arrays would be compiled in vain)
    on_team = _team_parts.bind(kernel, arrays, shares, per_part, trailing, work)
    if on_team is not None:
        return on_team
    specialise(kernel, (*args(0), 0, 1, *trailing))
    parts = [
        functools.partial(kernel, *args(p), first, last, *trailing)
        for p, (first, last) in enumerate(shares)
    ]
    if len(parts) <= _threads.available_cores():
        return functools.partial(_threads.run_parts, parts)

    def in_shares() -> None:
        # more shares than cores (cut for the team): as many pool threads
        # as the kernel threads, taking shares in turn
        _threads.run_parts(parts, _threads.limits.compiled_threads)

    return in_shares


#: Where generated kernel sources (and, beside them, numba's cache of their
#: machine code) are kept; ``None``: ``$XDG_CACHE_HOME/asyncrt/jit`` (by
#: default ``~/.cache/asyncrt/jit``), or a temporary folder where that
#: cannot be written.
cache_root: Path | None = None


def cache_dir() -> Path:
    """The folder of generated kernel sources (see :data:`cache_root`)."""
    if cache_root is not None:
        cache_root.mkdir(parents=True, exist_ok=True)
        return cache_root
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    folder = Path(base) / "asyncrt" / "jit"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        folder = Path(tempfile.gettempdir()) / f"asyncrt-jit-{os.getuid()}"
        folder.mkdir(parents=True, exist_ok=True)
    return folder


_modules: dict[tuple[str, str], Any] = {}


def compile_source(module: str, text: str, name: str) -> Callable[..., Any]:
    """Function ``name`` of generated source ``text``, compiled: the source
    is written to ``<cache_dir>/<module>.py`` (once: ``module`` must name
    its contents, a hash) and imported, so that numba's disk cache, keyed
    by that file, serves later processes.

    :raises ModuleNotFoundError: if numba is not installed.
    """
    folder = cache_dir()
    with _lock:
        loaded = _modules.get((str(folder), module))
        if loaded is None:
            path = folder / f"{module}.py"
            if not path.exists() or path.read_text() != text:
                partial = path.with_suffix(f".{os.getpid()}.tmp")
                partial.write_text(text)
                os.replace(partial, path)  # other processes see all or nothing
            loaded = import_file(module, path)
            _modules[(str(folder), module)] = loaded
    function: Callable[..., Any] = getattr(loaded, name)
    return function
