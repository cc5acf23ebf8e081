"""The executor's options: one frozen :class:`ExecutorOptions`, validated once.

Every way to make an executor (:func:`asyncrt.graph_executor.create`, a
factory's ``create``, ``load_module(...).create``,
:func:`asyncrt.debug_executor.create`, a worker process rebuilding its
parent's executor) takes the same options: an ``ExecutorOptions`` value,
keyword overrides (:class:`OptionOverrides`, typed for mypy and IDEs), or
both. A wrong name, type or value is refused where it is given, with
:class:`~asyncrt.errors.ArgumentError` naming the option and the accepted
values, never later inside a run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypedDict

from scheduler.placement import POLICY_NAMES, Policy
from scheduler.split import MIN_BYTES

from ..errors import ArgumentError

__all__ = ("KERNEL_THREAD_MODES", "ExecutorOptions", "OptionOverrides")

#: The named ``kernel_threads`` policies (:mod:`asyncrt.runtime._threads`).
KERNEL_THREAD_MODES = ("auto", "throughput", "keep")
#: The fusion engines (:mod:`asyncrt.ops._fusion`).
FUSE_ENGINES = ("auto", "numpy", "numexpr")


@dataclass(frozen=True)
class ExecutorOptions:
    """How an executor plans and runs; every field has the fast, safe default.

    :ivar max_contexts: how many runs may be in flight at once (>= 1).
    :ivar memory_budget: the most device bytes the pooled run contexts may
        hold together, or ``None`` for no limit; at least one context is
        always allowed.
    :ivar policy: how nodes are placed on several devices: one of
        :data:`scheduler.placement.POLICY_NAMES` or a callable
        (:data:`scheduler.placement.Policy`).
    :ivar max_streams: compute streams per device (>= 1).
    :ivar fuse: fuse elementwise chains: ``"auto"`` (the default: only the
        chains that compile into one loop, with numba on the host or as a
        cupy kernel; nothing without numba on the host), ``False``,
        ``True`` (every chain, the ``"numpy"`` engine) or an engine name,
        ``"numpy"`` or ``"numexpr"``.
    :ivar split: with two or more streams, let the planner cut a large
        elementwise join into row blocks, one per cpu stream.
    :ivar split_min_bytes: the smallest output (bytes) worth splitting.
    :ivar kernel_threads: threads of the kernels' pools: ``"auto"``,
        ``"throughput"``, ``"keep"`` or a count >= 1.
    :ivar processes: run each pooled context in a worker process.
    :ivar worker_imports: modules each worker process imports first.
    :ivar worker_nice: niceness added to each worker process (0..19).
    :ivar worker_env: environment variables set in each worker process.
    :ivar worker_blas: the OpenBLAS kernel set of the workers: ``"auto"``,
        ``"default"`` or a core type such as ``"Haswell"``.
    :ivar max_plans: for a graph with symbolic shapes, the most shape
        signatures whose plans are kept (least recently used evicted); 16
        covers the handful of batch sizes and sequence buckets a service
        sees without holding plans for every stray shape.
    :raises ArgumentError: if a value is of the wrong type or out of range.
    """

    max_contexts: int = 4
    memory_budget: int | None = None
    policy: str | Policy = "auto"
    max_streams: int = 1
    fuse: bool | Literal["auto", "numpy", "numexpr"] = "auto"
    split: bool = True
    split_min_bytes: int = MIN_BYTES
    kernel_threads: int | str = "auto"
    processes: bool = False
    worker_imports: tuple[str, ...] = ()
    worker_nice: int = 0
    worker_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    worker_blas: str = "auto"
    max_plans: int = 16

    def __post_init__(self) -> None:
        _count("max_contexts", self.max_contexts, minimum=1)
        if self.memory_budget is not None:
            _count("memory_budget", self.memory_budget, minimum=0, none_ok=True)
        if isinstance(self.policy, str):
            if self.policy not in POLICY_NAMES:
                raise ArgumentError(
                    f"policy must be one of {', '.join(POLICY_NAMES)} or a "
                    f"callable, got {self.policy!r}"
                )
        elif not callable(self.policy):
            raise ArgumentError(
                f"policy must be one of {', '.join(POLICY_NAMES)} or a callable, "
                f"got {type(self.policy).__name__}"
            )
        _count("max_streams", self.max_streams, minimum=1)
        if not isinstance(self.fuse, bool) and self.fuse not in FUSE_ENGINES:
            raise ArgumentError(
                f"fuse must be True, False or one of {', '.join(FUSE_ENGINES)}, "
                f"got {self.fuse!r}"
            )
        _flag("split", self.split)
        _count("split_min_bytes", self.split_min_bytes, minimum=0)
        threads = self.kernel_threads
        if isinstance(threads, str):
            if threads not in KERNEL_THREAD_MODES:
                raise ArgumentError(
                    f"kernel_threads must be one of {', '.join(KERNEL_THREAD_MODES)}"
                    f" or a count >= 1, got {threads!r}"
                )
        else:
            _count("kernel_threads", threads, minimum=1)
        _flag("processes", self.processes)
        imports = self.worker_imports
        if isinstance(imports, str) or not all(isinstance(m, str) for m in imports):
            raise ArgumentError(
                f"worker_imports must be a sequence of module names, got {imports!r}"
            )
        object.__setattr__(self, "worker_imports", tuple(imports))
        _count("worker_nice", self.worker_nice, minimum=0)
        if self.worker_nice > 19:
            raise ArgumentError(f"worker_nice must be in 0..19, got {self.worker_nice}")
        env = self.worker_env
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ArgumentError(f"worker_env must map names to strings, got {env!r}")
        object.__setattr__(self, "worker_env", MappingProxyType(dict(env)))
        _count("max_plans", self.max_plans, minimum=1)
        if not isinstance(self.worker_blas, str) or not (
            self.worker_blas in ("auto", "default") or self.worker_blas.isalnum()
        ):
            raise ArgumentError(
                "worker_blas must be 'auto', 'default' or an OpenBLAS core type "
                f"such as 'Haswell', got {self.worker_blas!r}"
            )

    def for_worker(self, kernel_threads: int | str) -> dict[str, Any]:
        """The fields a worker process plans and runs with, as JSON-able
        data; its pools get ``kernel_threads``. (A worker runs one context,
        placed as its parent's plan says: ``max_contexts`` and ``policy``
        are the worker's own.)"""
        return {
            "max_streams": self.max_streams,
            "fuse": self.fuse,
            "split": self.split,
            "split_min_bytes": self.split_min_bytes,
            "kernel_threads": kernel_threads,
        }

    @property
    def fuse_engine(self) -> Literal["numpy", "numexpr"] | None:
        """The fusion engine, or ``None`` when chains are not fused."""
        if self.fuse is False:
            return None
        return "numexpr" if self.fuse == "numexpr" else "numpy"

    def replace(self, **overrides: Any) -> ExecutorOptions:
        """These options with some changed (validated as at creation).

        :raises ArgumentError: for an unknown option name or a bad value.
        """
        unknown = sorted(set(overrides) - NAMES)
        if unknown:
            raise ArgumentError(
                f"unknown executor option{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(map(repr, unknown))}; options: {', '.join(sorted(NAMES))}"
            )
        return dataclasses.replace(self, **overrides)

    @classmethod
    def of(
        cls, options: ExecutorOptions | None = None, **overrides: Any
    ) -> ExecutorOptions:
        """``options`` (the defaults if ``None``) with ``overrides`` applied.

        :raises ArgumentError: if ``options`` is not an ``ExecutorOptions``,
            or for an unknown option name or a bad value.
        """
        if options is None:
            options = DEFAULT
        elif not isinstance(options, ExecutorOptions):
            raise ArgumentError(
                f"options must be an ExecutorOptions, got {type(options).__name__}"
            )
        return options.replace(**overrides) if overrides else options


class OptionOverrides(TypedDict, total=False):
    """The fields of :class:`ExecutorOptions` as keyword arguments (kept equal
    to them by a test), for the typed ``**overrides`` of every ``create``."""

    max_contexts: int
    memory_budget: int | None
    policy: str | Policy
    max_streams: int
    fuse: bool | Literal["auto", "numpy", "numexpr"]
    split: bool
    split_min_bytes: int
    kernel_threads: int | str
    processes: bool
    worker_imports: tuple[str, ...]
    worker_nice: int
    worker_env: Mapping[str, str]
    worker_blas: str
    max_plans: int


def _count(name: str, value: object, *, minimum: int, none_ok: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        accepted = f"an int >= {minimum}" + (" or None" if none_ok else "")
        raise ArgumentError(f"{name} must be {accepted}, got {value!r}")


def _flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ArgumentError(f"{name} must be True or False, got {value!r}")


NAMES = frozenset(f.name for f in dataclasses.fields(ExecutorOptions))
DEFAULT = ExecutorOptions()
