"""The per-thread scratch kernels borrow: aligned, disjoint arrays, one
buffer reused on a thread, separate buffers on separate threads, and large
requests allocated afresh."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from asyncrt.ops import _scratch

F32 = np.dtype(np.float32)


def test_arrays_are_aligned_disjoint_and_shaped() -> None:
    a, b, c = _scratch.borrow(((3, 5), (7,), (2, 2, 2)), F32)
    assert (a.shape, b.shape, c.shape) == ((3, 5), (7,), (2, 2, 2))
    for array in (a, b, c):
        assert array.dtype == F32
        assert array.flags.c_contiguous
        assert array.ctypes.data % 64 == 0
    a.fill(1)
    b.fill(2)
    c.fill(3)
    assert (a == 1).all() and (b == 2).all() and (c == 3).all()


def test_one_thread_reuses_its_buffer() -> None:
    first = _scratch.borrow(((1000,),), F32)[0]
    again = _scratch.borrow(((10,), (20,)), F32)[0]
    assert np.shares_memory(first, again)


def test_threads_have_buffers_of_their_own() -> None:
    mine = _scratch.borrow(((1000,),), F32)[0]
    theirs: list[np.ndarray[Any, Any]] = []
    worker = threading.Thread(
        target=lambda: theirs.append(_scratch.borrow(((1000,),), F32)[0])
    )
    worker.start()
    worker.join()
    assert not np.shares_memory(mine, theirs[0])


def test_large_requests_are_fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_scratch, "MAX_BYTES", 1024)
    one = _scratch.borrow(((1000,),), F32)[0]
    two = _scratch.borrow(((1000,),), F32)[0]
    assert not np.shares_memory(one, two)


def test_a_binding_keeps_its_arrays_while_the_thread_keeps_its_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def in_fresh_thread() -> None:
        borrowed = _scratch.Borrowed(((4, 8), (16,)), np.dtype(np.float32))
        first = borrowed()
        assert [a.shape for a in first] == [(4, 8), (16,)]
        assert all(a is b for a, b in zip(borrowed(), first, strict=True))
        _scratch.borrow(((1 << 16,),), np.dtype(np.float32))  # grows the buffer
        again = borrowed()
        assert again[0] is not first[0]  # carved from the new buffer
        assert borrowed()[0] is again[0]
        monkeypatch.setattr(_scratch, "MAX_BYTES", 64)
        large = _scratch.Borrowed(((4, 8),), np.dtype(np.float32))  # past it
        fresh = large()
        assert large()[0] is not fresh[0]  # allocated afresh, never kept

    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            in_fresh_thread()
        except BaseException as error:  # reported on the test's thread
            errors.append(error)

    worker = threading.Thread(target=guarded)  # a thread with no buffer yet
    worker.start()
    worker.join()
    if errors:
        raise errors[0]
