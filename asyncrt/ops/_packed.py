"""Constants repacked once, shared by value.

A kernel bound to a parameter (the dispatcher says which arrays are:
:class:`~scheduler.dispatch.Bindable`'s ``constant``) may lay it out anew
when it is bound: Winograd's transformed weights, a GEMM's column panels.
Every run context of an executor binds the same parameters, and a graph
with symbolic shapes binds them again per shape: :func:`shared` makes the
layout once per distinct value and hands the same read-only array to every
binding, kept while one holds it.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from ._common import Array

__all__ = ("shared",)

_made: weakref.WeakValueDictionary[tuple[Any, ...], Any] = weakref.WeakValueDictionary()
_lock = threading.Lock()


def shared(kind: Hashable, w: Array, make: Callable[[Array], Array]) -> Array:
    """``make(w)`` (``w`` C-contiguous), read-only, shared with every other
    call for the same ``kind`` and values of ``w`` (keyed by their digest).

    :param kind: names the layout ``make`` writes (and its settings).
    """
    contiguous = np.ascontiguousarray(w)
    digest = hashlib.sha256(contiguous.view(np.uint8).data).digest()
    key = (kind, w.shape, w.dtype.str, digest)
    with _lock:
        found = _made.get(key)
    if found is not None:
        return found
    made = make(contiguous)  # (outside the lock: large weights take a while)
    made.flags.writeable = False
    with _lock:
        return _made.setdefault(key, made)
