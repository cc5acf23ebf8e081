"""Kernels by name: the global registry and ``Module`` (TVM's ``lib``).

A kernel follows TVM's destination-passing convention: ``kernel(*inputs,
*outputs)`` writes each output in place and returns nothing. Arguments are
the arrays of the device's *array namespace* (``DeviceAPI.array_namespace``:
``"numpy"`` or ``"cupy"``), already placed in planned storage. A kernel may
be a coroutine function (``async def``) for I/O or calls to other
machines; it then
runs on the event loop.

A kernel is registered for array namespaces or for device kinds:

* by namespace (``namespaces=("numpy",)``), as library code does: every
  device kind whose API names that namespace finds it, kinds added later
  included, so a kernel written against the array API serves them all;
* by kind (``kinds=(kind, ...)``), as TVM users do: that kind finds it, before
  any kernel registered for its namespace.

Without either, a kernel is registered for every namespace of
:data:`ALL_NAMESPACES`. A kind whose namespace is ``None`` runs no kernels
in this process (its workers run their own, looked up there by name), so no
kernel can be registered for it.

``graph_executor.create(graph, lib, devices)`` resolves every node's
``func_name`` in ``lib`` first, then in the global registry
(:func:`resolve`).

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

from devices import get_api
from devices.errors import DeviceNotFoundError
from scheduler.dag import TensorSpec
from scheduler.dispatch import Bindable

from .._devices import host
from ..errors import ArgumentError, KernelNotFoundError

__all__ = (
    "ALL_NAMESPACES",
    "Bindable",
    "FlopsFunction",
    "Kernel",
    "Module",
    "get_global_func",
    "global_kinds",
    "global_namespace_func",
    "list_global_func_names",
    "namespace_of",
    "register_func",
    "resolve",
    "resolve_flops",
)

Kernel = Callable[..., Any]
#: ``flops(inputs, outputs)``: a kernel's work, from its tensors' specs.
FlopsFunction = Callable[[Sequence[TensorSpec], Sequence[TensorSpec]], float]
_K = TypeVar("_K", bound=Kernel)

#: The array namespaces a kernel registers for when none (and no kind) is
#: named: the array libraries kernels are written against.
ALL_NAMESPACES: tuple[str, ...] = ("numpy", "cupy")


def namespace_of(kind: str) -> str | None:
    """The array namespace whose arrays kind ``kind``'s kernels receive
    (``None``: its kernels run elsewhere, on its workers).

    :raises DeviceNotFoundError: if no backend provides ``kind`` here.
    """
    return get_api(kind).array_namespace


def _runs_kernels_elsewhere(kind: str) -> bool:
    """Whether ``kind`` is a known kind whose kernels do not run here."""
    try:
        return namespace_of(kind) is None
    except DeviceNotFoundError:
        return False  # nothing here can run on it: a harmless registration


class Module:
    """A set of kernels by name, per device kind or array namespace: TVM's
    ``lib``.

    :param kernels: ``{func_name: kernel}`` (the kernel serves every kind in
        ``kinds`` and namespace in ``namespaces``) or ``{func_name: {kind:
        kernel}}``.
    :param kinds: the device kinds a bare kernel serves.
    :param namespaces: the array namespaces a bare kernel serves (with
        neither, every namespace of :data:`ALL_NAMESPACES`).
    :raises ArgumentError: as :meth:`add` does.
    """

    def __init__(
        self,
        kernels: Mapping[str, Kernel | Mapping[str, Kernel]] | None = None,
        *,
        kinds: Iterable[str] | None = None,
        namespaces: Iterable[str] | None = None,
    ) -> None:
        self._by_kind: dict[str, dict[str, Kernel]] = {}
        self._by_namespace: dict[str, dict[str, Kernel]] = {}
        self._flops: dict[str, FlopsFunction] = {}
        for name, entry in (kernels or {}).items():
            if callable(entry):
                self.add(name, entry, kinds=kinds, namespaces=namespaces)
            else:
                for kind, kernel in entry.items():
                    self.add(name, kernel, kinds=(kind,))

    def __repr__(self) -> str:
        return f"<Module {len(self)} kernels>"

    def __contains__(self, name: object) -> bool:
        return name in self._by_kind or name in self._by_namespace

    def __len__(self) -> int:
        return len(self._by_kind.keys() | self._by_namespace.keys())

    def names(self) -> tuple[str, ...]:
        """The kernel names, sorted."""
        return tuple(sorted(self._by_kind.keys() | self._by_namespace.keys()))

    def kinds(self, name: str) -> tuple[str, ...]:
        """The device kinds ``name`` has a kernel of its own for."""
        return tuple(sorted(self._by_kind.get(name, {})))

    def namespaces(self, name: str) -> tuple[str, ...]:
        """The array namespaces ``name`` has a kernel for."""
        return tuple(sorted(self._by_namespace.get(name, {})))

    def add(
        self,
        name: str,
        kernel: Kernel,
        *,
        kinds: Iterable[str] | None = None,
        namespaces: Iterable[str] | None = None,
        override: bool = False,
        flops: FlopsFunction | None = None,
    ) -> None:
        """Add a kernel for some device kinds and array namespaces.

        :param kinds: the device kinds it serves.
        :param namespaces: the array namespaces it serves (with neither
            ``kinds`` nor this, every namespace of :data:`ALL_NAMESPACES`).
        :param override: replace an existing kernel of the same name.
        :param flops: the kernel's work from its tensors' specs, if known.
        :raises ArgumentError: if ``kernel`` is not callable, a kind's
            devices run no kernels in this process (their workers run
            their own), or
            ``name`` already has a kernel for one of the kinds or namespaces
            and ``override`` is false.
        """
        if not callable(kernel):
            raise ArgumentError(f"kernel {name!r} is not callable: {kernel!r}")
        chosen_kinds = tuple(kinds or ())
        chosen_namespaces = tuple(
            namespaces or (ALL_NAMESPACES if kinds is None else ())
        )
        for kind in chosen_kinds:
            if _runs_kernels_elsewhere(kind):
                raise ArgumentError(
                    f"cannot register kernel {name!r} for device kind {kind!r}: "
                    f"{kind} devices run no kernels in this process; their "
                    "workers run their own kernels (those registered for the "
                    "workers' own host or GPU device kind), looked up by name: "
                    f"register {name!r} for that kind, in a module the workers "
                    "import"
                )
        if not override:
            # A kind already served through its namespace counts as taken.
            taken = [
                *(
                    f"device kind {k!r}"
                    for k in chosen_kinds
                    if self._other(name, k, kernel)
                ),
                *(
                    f"array namespace {n!r}"
                    for n in chosen_namespaces
                    if self.find_namespace(name, n) not in (None, kernel)
                ),
            ]
            if taken:
                raise ArgumentError(
                    f"kernel {name!r} is already registered for {taken[0]}"
                )
        for table, keys in (
            (self._by_kind, chosen_kinds),
            (self._by_namespace, chosen_namespaces),
        ):
            for key in keys:
                table.setdefault(name, {})[key] = kernel
        if flops is not None:
            self._flops[name] = flops

    def _other(self, name: str, kind: str, kernel: Kernel) -> bool:
        found = self.find(name, kind)
        return found is not None and found is not kernel

    def flops_function(self, name: str) -> FlopsFunction | None:
        """The work estimate declared for ``name``, if any."""
        return self._flops.get(name)

    def find(self, name: str, kind: str) -> Kernel | None:
        """The kernel for ``name`` on devices of ``kind``: its own, else its
        namespace's; ``None`` if there is neither."""
        kernel = self._by_kind.get(name, {}).get(kind)
        if kernel is not None:
            return kernel
        per_namespace = self._by_namespace.get(name)
        if per_namespace is None:
            return None
        try:
            namespace = namespace_of(kind)
        except DeviceNotFoundError:
            return None
        return None if namespace is None else per_namespace.get(namespace)

    def find_namespace(self, name: str, namespace: str) -> Kernel | None:
        """The kernel for ``name`` registered for ``namespace``, or ``None``."""
        return self._by_namespace.get(name, {}).get(namespace)

    def get_function(self, name: str, kind: str | None = None) -> Kernel:
        """The kernel for ``name`` on ``kind`` (TVM's ``get_function``).

        :param kind: the device kind (the host's when ``None``).
        :raises KernelNotFoundError: if there is none.
        """
        kind = host().kind if kind is None else kind
        kernel = self.find(name, kind)
        if kernel is None:
            have = [*self.kinds(name), *self.namespaces(name)]
            detail = f"it has kernels for {', '.join(have)}" if have else "no kernel"
            raise KernelNotFoundError(
                f"no kernel {name!r} for device kind {kind!r} ({detail})"
            )
        return kernel

    def __getitem__(self, name: str) -> Kernel:
        return self.get_function(name)

    def copy(self) -> Module:
        """A new module with the same kernels and work estimates."""
        module = Module()
        for table, mine in (
            (module._by_kind, self._by_kind),
            (module._by_namespace, self._by_namespace),
        ):
            table.update({name: dict(entry) for name, entry in mine.items()})
        module._flops.update(self._flops)
        return module


_global = Module()
_global_lock = threading.Lock()


@overload
def register_func(
    name: str,
    *,
    kinds: Iterable[str] | None = None,
    namespaces: Iterable[str] | None = None,
    override: bool = False,
    flops: FlopsFunction | None = None,
) -> Callable[[_K], _K]: ...


@overload
def register_func(
    name: str,
    kernel: _K,
    *,
    kinds: Iterable[str] | None = None,
    namespaces: Iterable[str] | None = None,
    override: bool = False,
    flops: FlopsFunction | None = None,
) -> _K: ...


def register_func(
    name: str,
    kernel: _K | None = None,
    *,
    kinds: Iterable[str] | None = None,
    namespaces: Iterable[str] | None = None,
    override: bool = False,
    flops: FlopsFunction | None = None,
) -> _K | Callable[[_K], _K]:
    """Register a kernel in the global registry, as TVM's ``register_func``.

    Use as a decorator (``@register_func("add")``) or call it with the
    kernel.

    :param name: the ``func_name`` graphs refer to.
    :param kernel: the kernel; omit to get a decorator.
    :param kinds: the device kinds it serves.
    :param namespaces: the array namespaces it serves (with neither
        ``kinds`` nor this, every namespace of :data:`ALL_NAMESPACES`: each
        kind finds it through its API's ``array_namespace``).
    :param override: replace an existing registration.
    :param flops: the kernel's work from its tensors' specs, if known.
    :raises ArgumentError: if the name is taken for a kind or namespace and
        ``override`` is false, or a kind's devices run no kernels in this
        process (their workers run their own kernels, by name).
    """
    chosen_kinds = None if kinds is None else tuple(kinds)
    chosen_namespaces = None if namespaces is None else tuple(namespaces)

    def decorate(func: _K) -> _K:
        with _global_lock:
            _global.add(
                name,
                func,
                kinds=chosen_kinds,
                namespaces=chosen_namespaces,
                override=override,
                flops=flops,
            )
        return func

    return decorate if kernel is None else decorate(kernel)


def get_global_func(
    name: str, kind: str | None = None, allow_missing: bool = False
) -> Kernel | None:
    """A kernel from the global registry (TVM's ``get_global_func``).

    :param kind: the device kind (the host's when ``None``).
    :raises KernelNotFoundError: if missing and ``allow_missing`` is false.
    """
    if allow_missing:
        return _global.find(name, host().kind if kind is None else kind)
    return _global.get_function(name, kind)


def global_namespace_func(name: str, namespace: str) -> Kernel | None:
    """The global registry's kernel ``name`` for ``namespace``, or ``None``."""
    return _global.find_namespace(name, namespace)


def global_kinds(name: str) -> tuple[str, ...]:
    """The device kinds the global registry has a kernel of their own for
    ``name`` (registered by kind, not by namespace)."""
    return _global.kinds(name)


def list_global_func_names() -> tuple[str, ...]:
    """Every name in the global registry."""
    return _global.names()


def resolve(name: str, kind: str, lib: Module | None) -> Kernel | None:
    """``lib`` first, then the global registry (the executor's lookup).

    A kind whose namespace is ``None`` runs each kernel on its workers,
    looked up there by name: the answer is a reference to it
    (:mod:`asyncrt.runtime._remote_worker`).
    """
    if lib is not None:
        kernel = lib.find(name, kind)
        if kernel is not None:
            return kernel
    kernel = _global.find(name, kind)
    if kernel is None and _runs_kernels_elsewhere(kind):
        from ..runtime._remote_worker import remote_kernel

        return remote_kernel(name, lib)
    return kernel


def resolve_flops(name: str, lib: Module | None) -> FlopsFunction | None:
    """The work estimate for ``name``: ``lib`` first, then the registry."""
    found = lib.flops_function(name) if lib is not None else None
    return found if found is not None else _global.flops_function(name)
