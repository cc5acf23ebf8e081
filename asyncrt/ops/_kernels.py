"""Kernels: the global registry and ``Module`` (TVM's ``lib``).

A kernel follows TVM's destination-passing convention: ``kernel(*inputs,
*outputs)`` writes each output in place and returns nothing. Arguments are
the device backend's arrays (numpy on cpu and sim, cupy on cuda), already
placed in planned storage. A kernel may be a coroutine function (``async
def``) for I/O or remote calls; it then runs on the event loop.

A kernel is registered per device *kind*: one function may serve several
kinds (it is written against the array API, so numpy and cupy share it), or
each kind may have its own.

``graph_executor.create(graph, lib, devices)`` resolves every node's
``func_name`` in ``lib`` first, then in the global registry.

A kernel may also declare its work: ``flops(inputs, outputs) -> float``
over the tensors' specs (shape, dtype). Placement policies turn work into
time per device; without a declaration a node counts one operation per
output element.

A kernel may offer ``kernel.bind(*arrays)``, which returns a call without
arguments doing what ``kernel(*arrays)`` does (TVM's ``op_execs``, each
bound once to its arrays). The dispatcher binds once per run context, whose
arrays are the same views for every run, so what depends only on them
(views, layouts, small scratch buffers) is worked out once, not per call:
for a small model's convolution that is half its time. :class:`Bindable`
pairs a kernel with its binder.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, overload

from scheduler.dag import TensorSpec
from scheduler.dispatch import Bindable

from ..errors import KernelNotFoundError

__all__ = (
    "ALL_KINDS",
    "Bindable",
    "FlopsFunction",
    "Kernel",
    "Module",
    "get_global_func",
    "list_global_func_names",
    "register_func",
)

Kernel = Callable[..., Any]
#: ``flops(inputs, outputs)``: a kernel's work, from its tensors' specs.
FlopsFunction = Callable[[Sequence[TensorSpec], Sequence[TensorSpec]], float]
_K = TypeVar("_K", bound=Kernel)

#: The kinds a kernel registers for when none are named.
ALL_KINDS: tuple[str, ...] = ("cpu", "sim", "cuda")


class Module:
    """A set of kernels by name and device kind: TVM's ``lib``.

    :param kernels: ``{func_name: kernel}`` (the kernel serves every kind in
        ``kinds``) or ``{func_name: {kind: kernel}}``.
    :param kinds: the kinds a bare kernel serves.
    """

    def __init__(
        self,
        kernels: Mapping[str, Kernel | Mapping[str, Kernel]] | None = None,
        *,
        kinds: Iterable[str] = ALL_KINDS,
    ) -> None:
        self._table: dict[str, dict[str, Kernel]] = {}
        self._flops: dict[str, FlopsFunction] = {}
        default_kinds = tuple(kinds)
        for name, entry in (kernels or {}).items():
            if callable(entry):
                self.add(name, entry, kinds=default_kinds)
            else:
                for kind, kernel in entry.items():
                    self.add(name, kernel, kinds=(kind,))

    def __repr__(self) -> str:
        return f"<Module {len(self._table)} kernels>"

    def __contains__(self, name: object) -> bool:
        return name in self._table

    def __len__(self) -> int:
        return len(self._table)

    def names(self) -> tuple[str, ...]:
        """The kernel names, sorted."""
        return tuple(sorted(self._table))

    def kinds(self, name: str) -> tuple[str, ...]:
        """The device kinds ``name`` has a kernel for."""
        return tuple(sorted(self._table.get(name, {})))

    def add(
        self,
        name: str,
        kernel: Kernel,
        *,
        kinds: Iterable[str] = ALL_KINDS,
        override: bool = False,
        flops: FlopsFunction | None = None,
    ) -> None:
        """Add a kernel for some device kinds.

        :param flops: the kernel's work from its tensors' specs, if known.
        :raises ValueError: if ``name`` already has a kernel for one of the
            kinds and ``override`` is false, or ``kernel`` is not callable.
        """
        if not callable(kernel):
            raise ValueError(f"kernel {name!r} is not callable: {kernel!r}")
        per_kind = self._table.setdefault(name, {})
        for kind in kinds:
            if kind in per_kind and not override and per_kind[kind] is not kernel:
                raise ValueError(f"kernel {name!r} is already registered for {kind!r}")
            per_kind[kind] = kernel
        if flops is not None:
            self._flops[name] = flops

    def flops_function(self, name: str) -> FlopsFunction | None:
        """The work estimate declared for ``name``, if any."""
        return self._flops.get(name)

    def find(self, name: str, kind: str) -> Kernel | None:
        """The kernel for ``name`` on ``kind``, or ``None``."""
        return self._table.get(name, {}).get(kind)

    def get_function(self, name: str, kind: str = "cpu") -> Kernel:
        """The kernel for ``name`` on ``kind`` (TVM's ``get_function``).

        :raises KernelNotFoundError: if there is none.
        """
        kernel = self.find(name, kind)
        if kernel is None:
            have = self.kinds(name)
            detail = f"it has kernels for {', '.join(have)}" if have else "no kernel"
            raise KernelNotFoundError(
                f"no kernel {name!r} for device kind {kind!r} ({detail})"
            )
        return kernel

    def __getitem__(self, name: str) -> Kernel:
        return self.get_function(name)


_global = Module()
_global_lock = threading.Lock()


@overload
def register_func(
    name: str,
    *,
    kinds: Iterable[str] = ALL_KINDS,
    override: bool = False,
    flops: FlopsFunction | None = None,
) -> Callable[[_K], _K]: ...


@overload
def register_func(
    name: str,
    kernel: _K,
    *,
    kinds: Iterable[str] = ALL_KINDS,
    override: bool = False,
    flops: FlopsFunction | None = None,
) -> _K: ...


def register_func(
    name: str,
    kernel: _K | None = None,
    *,
    kinds: Iterable[str] = ALL_KINDS,
    override: bool = False,
    flops: FlopsFunction | None = None,
) -> _K | Callable[[_K], _K]:
    """Register a kernel in the global registry, as TVM's ``register_func``.

    Use as a decorator (``@register_func("add", kinds=("cpu", "sim"))``) or
    call it with the kernel.

    :param name: the ``func_name`` graphs refer to.
    :param kernel: the kernel; omit to get a decorator.
    :param kinds: the device kinds it serves.
    :param override: replace an existing registration.
    :param flops: the kernel's work from its tensors' specs, if known.
    :raises ValueError: if the name is taken for a kind and ``override`` is
        false.
    """
    chosen = tuple(kinds)

    def decorate(func: _K) -> _K:
        with _global_lock:
            _global.add(name, func, kinds=chosen, override=override, flops=flops)
        return func

    return decorate if kernel is None else decorate(kernel)


def get_global_func(
    name: str, kind: str = "cpu", allow_missing: bool = False
) -> Kernel | None:
    """A kernel from the global registry (TVM's ``get_global_func``).

    :raises KernelNotFoundError: if missing and ``allow_missing`` is false.
    """
    if allow_missing:
        return _global.find(name, kind)
    return _global.get_function(name, kind)


def list_global_func_names() -> tuple[str, ...]:
    """Every name in the global registry."""
    return _global.names()


def resolve(name: str, kind: str, lib: Module | None) -> Kernel | None:
    """``lib`` first, then the global registry (the executor's lookup).

    On ``remote`` devices a kernel runs on the worker, looked up there by
    name: the answer is a reference to it (:mod:`asyncrt.runtime._remote_worker`).
    """
    if lib is not None:
        kernel = lib.find(name, kind)
        if kernel is not None:
            return kernel
    kernel = _global.find(name, kind)
    if kernel is None and kind == "remote":
        from ..runtime._remote_worker import remote_kernel

        return remote_kernel(name, lib)
    return kernel


def resolve_flops(name: str, lib: Module | None) -> FlopsFunction | None:
    """The work estimate for ``name``: ``lib`` first, then the registry."""
    found = lib.flops_function(name) if lib is not None else None
    return found if found is not None else _global.flops_function(name)
