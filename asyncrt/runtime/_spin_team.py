"""A team of spinning native threads for launches of compiled kernels: the
fast path under :func:`asyncrt.runtime._native_team.launcher`.

GNU OpenMP's ``GOMP_parallel`` starts a team for every launch and ends it
at a barrier that waits for every thread: an empty launch took 1.6-2.6 us
on the 2-core VM, and MobileNetV3 makes 36 of them a run (tens of
microseconds of a 1.3 ms run); and a helper the machine runs late holds
the launch up even where the caller has taken every part by then.

Here ``cores - 1`` helper threads, started once, wait in a compiled loop
(a numba ``cfunc`` entered through ``ctypes``, without the GIL). A launch
is one ``ctypes`` call of another compiled function that publishes the
kernel and its data, opens ``threads - 1`` seats, bumps a ticket the
helpers watch, calls the kernel itself, then *closes the seats* and waits
only for the helpers that took one before they closed. A kernel shares its
work through a counter in its data (every part taken once, by whichever
thread claims it), so a helper that comes late finds nothing left, and is
not waited for: an empty launch costs 0.7-0.9 us.

A helper spins (``pause``) for :data:`SPIN` rounds (about half a
millisecond) after its last ticket, then sleeps on the ticket's futex; a
launch wakes sleepers (the ticket and the sleepers' count are each written
by a locked read-modify-write and then the other read, so one side always
sees the other: no wake-up is lost). One launch at a time holds the team
(a compare-and-swap on ``busy``); a launch that finds it held (another
Python thread's, or one from inside a kernel) says so, and
:mod:`._native_team` gives it an OpenMP team instead.

Linux on x86-64 only (the futex system call's number, the ``pause``
instruction); elsewhere, or without numba, :func:`team` is ``None``.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import hashlib
import importlib.util
import platform
import threading
from typing import Any

import numpy as np

__all__ = ("SPIN", "SpinTeam", "team")

#: ``pause`` rounds a helper spins after its last ticket before it sleeps
#: (about 25 ns each on the AVX-512 VM): longer than the gaps between the
#: launches of one run (microseconds of Python), shorter than a server's
#: idle time.
SPIN = 20_000

# The state's int64 slots, a cache line (8 slots) apart, so that the
# helpers' polling of one does not bounce another's line: the ticket (its
# low 32 bits are the futex word), sleeping helpers, open seats, helpers
# done, the kernel's address, its data, stop, busy, libc's syscall.
_LINE = 8
_TICKET, _SLEEPING, _SEATS, _DONE, _FUNCTION, _DATA, _STOP, _BUSY, _SYSCALL = range(
    0, 9 * _LINE, _LINE
)
_SLOTS = 9 * _LINE

_SOURCE = """
import numba
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_I64 = ir.IntType(64)
SPIN = {spin}
TICKET, SLEEPING, SEATS, DONE, FUNCTION, DATA, STOP, BUSY, SYSCALL = {slots}
SYS_FUTEX, FUTEX_WAIT, FUTEX_WAKE = 202, 128, 129  # (x86-64, private futexes)


def _slot(builder, state, index):
    base = builder.inttoptr(state, _I64.as_pointer())
    return builder.gep(base, [index])


@intrinsic
def load_(typingctx, state, index):
    def codegen(context, builder, signature, args):
        return builder.load_atomic(_slot(builder, *args), "seq_cst", 8)

    return types.int64(types.int64, types.int64), codegen


@intrinsic
def store_(typingctx, state, index, value):
    def codegen(context, builder, signature, args):
        builder.store_atomic(args[2], _slot(builder, *args[:2]), "release", 8)

    return types.void(types.int64, types.int64, types.int64), codegen


def _read_modify_write(operation):
    # an intrinsic: the slot's old value, operation (LLVM's atomicrmw: add,
    # xchg) applied to it and value, sequentially consistent
    def rmw_(typingctx, state, index, value):
        def codegen(context, builder, signature, args):
            slot = _slot(builder, *args[:2])
            return builder.atomic_rmw(operation, slot, args[2], "seq_cst")

        return types.int64(types.int64, types.int64, types.int64), codegen

    return intrinsic(rmw_)


add_ = _read_modify_write("add")
swap_ = _read_modify_write("xchg")


@intrinsic
def cas_(typingctx, state, index, expected, value):
    # whether the slot held expected (and now holds value)
    def codegen(context, builder, signature, args):
        slot = _slot(builder, *args[:2])
        pair = builder.cmpxchg(slot, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)

    return types.boolean(types.int64, types.int64, types.int64, types.int64), codegen


@intrinsic
def pause_(typingctx):
    def codegen(context, builder, signature, args):
        kind = ir.FunctionType(ir.VoidType(), [])
        pause = builder.module.declare_intrinsic("llvm.x86.sse2.pause", fnty=kind)
        builder.call(pause, [])

    return types.void(), codegen


@intrinsic
def call_(typingctx, function, data):
    # void function(void *data)
    def codegen(context, builder, signature, args):
        kind = ir.FunctionType(ir.VoidType(), [_I64])
        builder.call(builder.inttoptr(args[0], kind.as_pointer()), [args[1]])

    return types.void(types.int64, types.int64), codegen


@intrinsic
def futex_(typingctx, state, operation, value):
    # syscall(SYS_futex, &ticket, operation, value, NULL, NULL, 0) through
    # libc's syscall, whose address the state holds
    def codegen(context, builder, signature, args):
        state, operation, value = args
        kind = ir.FunctionType(_I64, [_I64], var_arg=True)
        syscall = builder.load(_slot(builder, state, ir.Constant(_I64, SYSCALL)))
        word = builder.ptrtoint(_slot(builder, state, ir.Constant(_I64, TICKET)), _I64)
        zero = ir.Constant(_I64, 0)
        number = ir.Constant(_I64, SYS_FUTEX)
        arguments = [number, word, operation, value, zero, zero, zero]
        return builder.call(builder.inttoptr(syscall, kind.as_pointer()), arguments)

    return types.int64(types.int64, types.int64, types.int64), codegen


@numba.cfunc(types.void(types.int64), nopython=True, cache=True)
def helper(state):
    # tickets count from 0 in a new state: a launch made before this thread
    # ran is seen (its seats may still be open)
    seen = 0
    while True:
        spins = 0
        while load_(state, TICKET) == seen:
            if load_(state, STOP) != 0:
                return
            pause_()
            spins += 1
            if spins >= SPIN:
                add_(state, SLEEPING, 1)
                if load_(state, TICKET) == seen and load_(state, STOP) == 0:
                    futex_(state, FUTEX_WAIT, seen & 0xFFFFFFFF)
                add_(state, SLEEPING, -1)
                spins = 0
        seen = load_(state, TICKET)
        while True:  # take a seat while one is open
            seats = load_(state, SEATS)
            if seats <= 0:
                break
            if cas_(state, SEATS, seats, seats - 1):
                call_(load_(state, FUNCTION), load_(state, DATA))
                add_(state, DONE, 1)
                break


@numba.cfunc(types.int64(types.int64, types.int64, types.int64, types.int64),
             nopython=True, cache=True)
def launch(state, function, data, threads):
    # 1 where another launch holds the team (nothing was run), else 0
    if not cas_(state, BUSY, 0, 1):
        return 1
    store_(state, DONE, 0)
    store_(state, FUNCTION, function)
    store_(state, DATA, data)
    store_(state, SEATS, threads - 1)
    add_(state, TICKET, 1)
    if load_(state, SLEEPING) > 0:
        futex_(state, FUTEX_WAKE, 1 << 30)
    call_(function, data)
    joined = threads - 1 - swap_(state, SEATS, 0)
    while load_(state, DONE) < joined:
        pause_()
    store_(state, BUSY, 0)
    return 0


@numba.cfunc(types.void(types.int64), nopython=True, cache=True)
def stop(state):
    store_(state, STOP, 1)
    add_(state, TICKET, 1)
    futex_(state, FUTEX_WAKE, 1 << 30)
"""

_HELPER = ctypes.CFUNCTYPE(None, ctypes.c_int64)
_LAUNCH = ctypes.CFUNCTYPE(
    ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64
)


class SpinTeam:
    """``helpers`` native threads that run launched kernels beside their
    caller (see the module docstring).

    :param helpers: the helper threads (>= 1), started now.
    """

    def __init__(self, helpers: int) -> None:
        if helpers < 1:
            raise ValueError(f"a team needs a helper, got {helpers}")
        from ..ops import _jit  # (compiles: only where a team is wanted)

        slots = (_TICKET, _SLEEPING, _SEATS, _DONE, _FUNCTION, _DATA, _STOP, _BUSY)
        text = _SOURCE.replace("{spin}", str(SPIN)).replace(
            "{slots}", ", ".join(map(str, (*slots, _SYSCALL)))
        )
        module = "asyncrt_spin_team_" + hashlib.sha256(text.encode()).hexdigest()[:20]
        self._state = np.zeros(_SLOTS, np.int64)
        libc_syscall = ctypes.cast(ctypes.CDLL(None).syscall, ctypes.c_void_p)
        self._state[_SYSCALL] = int(libc_syscall.value or 0)
        self.address = int(self._state.ctypes.data)
        compiled: Any = functools.partial(_jit.compile_source, module, text)
        helper = _HELPER(compiled("helper").address)
        #: ``call(address, function, data, threads)``: the launch itself
        #: (what :meth:`launch` calls; 1 where the team was held, else 0).
        self.call = _LAUNCH(compiled("launch").address)
        self._stop = _HELPER(compiled("stop").address)
        self.threads = [
            threading.Thread(
                target=helper,
                args=(self.address,),
                name=f"kernel-team-{i}",  # process-wide, as the part pool's
                daemon=True,
            )
            for i in range(helpers)
        ]
        for thread in self.threads:
            thread.start()
        self._stopped = False

    def launch(self, function: int, data: int, threads: int) -> bool:
        """Run ``function(data)`` on the caller and up to ``threads - 1``
        helpers; return when every call that started has (``False``, and
        nothing run, where another launch holds the team)."""
        return bool(self.call(self.address, function, data, threads) == 0)

    def close(self) -> None:
        """Stop the helpers (they return from their loops; not joined)."""
        if not self._stopped:
            self._stopped = True
            self._stop(self.address)


_lock = threading.Lock()
_team: SpinTeam | None = None
_tried = False


def team(helpers: int) -> SpinTeam | None:
    """This process's team (made with ``helpers`` threads on first use), or
    ``None`` where there is none (see the module docstring; or making it
    failed)."""
    global _team, _tried
    if _tried:
        return _team
    with _lock:
        if not _tried:
            _tried = True
            _team = _make(helpers)
    return _team


def _make(helpers: int) -> SpinTeam | None:
    if (
        platform.system() != "Linux"
        or platform.machine() not in ("x86_64", "AMD64")
        or importlib.util.find_spec("numba") is None
    ):
        return None
    try:
        made = SpinTeam(max(1, helpers))
    except (OSError, AttributeError, ImportError):  # no libc syscall, no numba
        return None
    atexit.register(made.close)
    return made
