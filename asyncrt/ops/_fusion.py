"""Fused elementwise kernels: which nodes fuse, and one kernel per fused node.

:func:`fuse_graph` runs the scheduler's pass (:mod:`scheduler.fusion`) over
the nodes whose op has a fusion template in the kernel library
(:func:`~asyncrt.ops._library.fusion_template`), then builds a kernel for
every fused node and array namespace of the devices. A fused node's kernel
follows the usual convention (``kernel(*inputs, out)``) and writes straight
into the planned storage of its output. Engines, per array namespace:

* ``numpy``, engine ``"numpy"`` (the default), where numba is installed
  (the ``jit`` extra): float32 groups whose members and inputs allow it
  become one compiled loop (:mod:`asyncrt.ops._jitfuse`): one pass over
  memory, results the unfused ones bit for bit except ``tanh`` (within 7
  ulps of numpy's). Every other group, and every group without numba:
* ``numpy``, engine ``"numpy"``: the members' own kernels
  (numpy ufuncs, destination passing) run block by block over the output: a
  block of each tensor stays in cache while the whole chain runs over it,
  interior results live in a few block-sized scratch buffers made per call
  (no full-size temporaries), and the last member writes its block of
  ``out``. Nodes with enough work split their blocks over
  :data:`asyncrt.runtime._threads.limits` threads (numpy releases the GIL).
  Results are the unfused ones, bit for bit: the same ufuncs see the same
  values. (numexpr is not the default engine; see the next item.)
* ``numpy``, engine ``"numexpr"``: the members' expression templates are
  inlined into one expression, evaluated by ``numexpr.evaluate(expr,
  local_dict=..., out=out, casting="same_kind")`` in numexpr's own thread
  pool. Its float32 ``tanh``/``exp``/``log`` are not numpy's SIMD ones:
  results may differ from the unfused ones by a few ulps (tests assert
  ``rtol=1e-5`` for float32, ``1e-12`` for float64). Measured on the AVX2
  dev machine (``bench/bench_kernels.py --ops``), numexpr 2.14 without VML
  was slower than numpy's loops for every op, one thread each (``mul``
  2.9x, ``exp`` 1.2x, ``sqrt`` 4.3x, ``tanh`` 7.4x), which is why it is not
  the default. A group numexpr cannot express (an op without a template, a
  dtype other than float32/float64) uses ``"numpy"``; without numexpr
  installed, every group does.
* ``cupy``: one ``cupy.ElementwiseKernel`` per fused node, one statement per
  member (shared interior results computed once); groups with an op that
  has no CUDA template run the members' cupy kernels in sequence.

Where a device's kernels run in no namespace of these (its workers run
their own) nothing is fused. A node fuses only if its op has a fusion template, its
kernel is the library's on every device (neither ``lib`` nor a kernel
registered for one device kind replaces it: it may mean something else)
and is not a coroutine, and it has one output. The fused node's ``flops``
is the sum of its members', so cost models and the simulated devices still
see the real work.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import networkx as nx

from devices import Device
from devices.errors import DeviceNotFoundError
from scheduler.dag import NodeSpec, TensorSpec
from scheduler.fusion import FusedNode, fuse_elementwise

from ..runtime import _threads
from . import _jitfuse
from ._kernels import (
    Kernel,
    Module,
    global_kinds,
    global_namespace_func,
    namespace_of,
    resolve,
)
from ._library import FusionTemplate, node_fusion_template

__all__ = (
    "AUTO_BLOCK_MIN_ELEMENTS",
    "FUSING_NAMESPACES",
    "Engine",
    "build_kernel",
    "compiles",
    "elementwise_predicate",
    "fuse_graph",
)

Engine = Literal["numpy", "numexpr"]
Array = Any

#: Array namespaces whose fused kernels this module can build.
FUSING_NAMESPACES = frozenset({"numpy", "cupy"})
#: Elements per block of the ``"numpy"`` engine (per tensor): 256 KiB of
#: float32, so a chain's blocks stay in L2/L3 while the per-call cost of a
#: ufunc (a microsecond or two) stays far below a block's work. Smaller
#: blocks measured slower on the dev machine: cheap ops (add, relu) stream
#: memory fast enough that per-call overhead dominates.
BLOCK_ELEMENTS = 1 << 16
#: The default fusion (``fuse="auto"``) runs a chain that does not compile
#: on the block engine from this many elements: four-op chains (mul, tanh,
#: exp, sqrt) took 0.91x their unfused time at 256Ki elements and 0.72x at
#: 1Mi, but 1.06x at 64Ki and 1.14x at 16Ki (per-block calls cost more than
#: the cache saves) on the 2-core VM.
AUTO_BLOCK_MIN_ELEMENTS = 1 << 18
#: Work (the node's ``flops`` estimate, roughly a nanosecond each with
#: numpy) one thread gets at least before a kernel splits its blocks over
#: threads: handing blocks to a pool costs tens of microseconds.
MIN_WORK_PER_THREAD = 2e5
#: Dtypes the numexpr and CUDA templates are written for.
TEMPLATE_DTYPES = frozenset({"float32", "float64"})
#: The longest expression handed to numexpr (shared interior results are
#: inlined once per use, so an expression can grow quickly).
MAX_EXPRESSION = 2000


def _namespaces(devices: Sequence[Device]) -> frozenset[str] | None:
    """The array namespaces of ``devices``' kernels, or ``None`` if one
    device's kernels run in no namespace this module can fuse for."""
    found: set[str] = set()
    for kind in {device.kind for device in devices}:
        try:
            namespace = namespace_of(kind)
        except DeviceNotFoundError:
            return None
        if namespace not in FUSING_NAMESPACES:
            return None
        found.add(namespace)
    return frozenset(found) or None


def _template(spec: NodeSpec) -> FusionTemplate:
    template = node_fusion_template(spec.func_name, spec.attrs)
    if template is None:  # the predicate let only templated ops in
        raise KeyError(f"{spec.func_name!r} has no fusion template")
    return template


def fuse_graph(
    dag: nx.DiGraph,
    lib: Module | None,
    devices: Sequence[Device],
    engine: Engine = "numpy",
    *,
    exact: bool = False,
) -> tuple[nx.DiGraph, Module | None]:
    """Fuse ``dag``'s elementwise chains and build their kernels.

    :param dag: the graph, its ``flops`` already annotated.
    :param lib: the executor's kernels (looked up before the registry).
    :param devices: the devices the graph will be planned onto.
    :param engine: the numpy engine (see the module docstring).
    :param exact: the default fusion (``fuse="auto"``): fuse only where
        it pays and the results stay the unfused ones bit for bit: chains
        that compile into one loop computing them bit for bit
        (:func:`compiles`), and chains of at least
        :data:`AUTO_BLOCK_MIN_ELEMENTS` for the block engine (the members'
        own kernels); the rest stay as built.
    :return: the fused graph and a module holding ``lib``'s kernels and the
        fused ones (``dag`` and ``lib`` unchanged if nothing fused).
    :raises ValueError: for an unknown engine.
    """
    if engine not in ("numpy", "numexpr"):
        raise ValueError(f"unknown fusion engine {engine!r}; use numpy or numexpr")
    namespaces = _namespaces(devices)
    if namespaces is None:
        return dag, lib

    def accept(recipe: FusedNode) -> bool:
        if not exact:
            return True
        size = math.prod(recipe.spec.outputs[0].shape)
        return size >= AUTO_BLOCK_MIN_ELEMENTS or all(
            compiles(recipe, ns, exact=True) for ns in namespaces
        )

    fusion = fuse_elementwise(
        dag,
        elementwise_predicate(lib, devices),
        label=lambda spec: _template(spec).label,
        accept=accept,
    )
    if not fusion.groups:
        return dag, lib
    module = Module() if lib is None else lib.copy()
    for recipe in fusion.groups.values():
        for namespace in sorted(namespaces):
            kernel = build_kernel(recipe, namespace, engine, exact=exact)
            module.add(recipe.spec.func_name, kernel, namespaces=(namespace,))
    return fusion.dag, module


def elementwise_predicate(
    lib: Module | None, devices: Sequence[Device]
) -> Callable[[NodeSpec], bool]:
    """Whether a node's kernel is a library elementwise op on every device
    of ``devices``: its op has a fusion template, the global registry has a
    kernel for each device's kind, no coroutine, and neither ``lib`` nor a
    kernel registered for one of the kinds replaces the library's (it may
    mean something else). What fusion fuses, and what the planner may split
    into row blocks (:mod:`scheduler.split`).

    :param lib: the executor's kernels (looked up before the registry).
    :param devices: the devices the graph will be planned onto.
    """
    kinds = sorted({device.kind for device in devices})

    def elementwise(spec: NodeSpec) -> bool:
        name = spec.func_name
        if node_fusion_template(name, spec.attrs) is None or not kinds:
            return False
        if not set(kinds).isdisjoint(global_kinds(name)):
            return False
        for kind in kinds:
            if lib is not None and lib.find(name, kind) is not None:
                return False
            kernel = resolve(name, kind, None)
            if kernel is None or inspect.iscoroutinefunction(kernel):
                return False
        return True

    return elementwise


def build_kernel(
    recipe: FusedNode, namespace: str, engine: Engine = "numpy", *, exact: bool = False
) -> Kernel:
    """The kernel of a fused node for one array namespace.

    :param recipe: the fused node (:func:`scheduler.fusion.fuse_elementwise`).
    :param namespace: ``"numpy"`` or ``"cupy"``.
    :param engine: the numpy engine.
    :param exact: compile only loops that compute the members' kernels bit
        for bit (see :func:`compiles`); the block engine otherwise.
    :return: ``kernel(*inputs, out)``.
    :raises ValueError: if ``namespace`` cannot fuse or a member has no
        kernel.
    """
    if namespace not in FUSING_NAMESPACES:
        raise ValueError(f"cannot build fused kernels for namespace {namespace!r}")
    members = []
    for spec in recipe.members:
        kernel = global_namespace_func(spec.func_name, namespace)
        if kernel is None:
            raise ValueError(
                f"no {namespace} kernel {spec.func_name!r} for {spec.name!r}"
            )
        members.append(kernel)
    if namespace == "cupy":
        if compiles(recipe, namespace):
            return CupyFusedKernel(recipe)
        return ProgramKernel(recipe, members, "cupy", block=None)
    if engine == "numexpr" and _numexpr_expression(recipe) is not None:
        return NumexprKernel(recipe)
    program = ProgramKernel(recipe, members, "numpy", block=BLOCK_ELEMENTS)
    if engine == "numpy" and compiles(recipe, namespace, exact=exact):
        return _jitfuse.JitFusedKernel(recipe, program)
    return program


def compiles(recipe: FusedNode, namespace: str, *, exact: bool = False) -> bool:
    """Whether the fused node becomes one compiled loop on ``namespace``: a
    ``cupy.ElementwiseKernel`` (the CUDA math functions cupy's own kernels
    call), or with numba installed a numba loop
    (:func:`asyncrt.ops._jitfuse.compilable`).

    :param exact: and, on numpy, whether that loop computes the members'
        kernels bit for bit at this size (see
        :attr:`~asyncrt.ops.FusionTemplate.jit_exact_from`)."""
    if namespace == "cupy":
        dtype = recipe.spec.outputs[0].dtype
        return dtype in TEMPLATE_DTYPES and _expressible(recipe, "cuda_c")
    if not _jitfuse.compilable(recipe):
        return False
    size = math.prod(recipe.spec.outputs[0].shape)
    for spec in recipe.members if exact else ():
        start = _template(spec).jit_exact_from
        if start is None or size < start:
            return False
    return True


def _expressible(recipe: FusedNode, engine: Literal["numexpr", "cuda_c"]) -> bool:
    for spec in recipe.members:
        op = _template(spec)
        if (
            op.variadic is None
            and (op.numexpr if engine == "numexpr" else op.cuda_c) is None
        ):
            return False
    return True


def _numexpr_expression(recipe: FusedNode) -> str | None:
    """The whole group as one numexpr expression over ``i0, i1, ...``, or
    ``None`` if numexpr is missing or cannot evaluate it."""
    if importlib.util.find_spec("numexpr") is None:
        return None
    if recipe.spec.outputs[0].dtype not in TEMPLATE_DTYPES:
        return None
    if not _expressible(recipe, "numexpr"):
        return None
    exprs: list[str] = []
    for spec, args in zip(recipe.members, recipe.args, strict=True):
        names = [f"i{a.index}" if a.source == "input" else exprs[a.index] for a in args]
        exprs.append(_template(spec).expression("numexpr", names))
        if len(exprs[-1]) > MAX_EXPRESSION:
            return None
    return exprs[-1]


def _failure(recipe: FusedNode, exc: Exception, member: int | None) -> RuntimeError:
    """An error naming the original node(s) a fused kernel failed in."""
    if member is not None:
        spec = recipe.members[member]
        where = f"node {spec.name!r} (op {spec.func_name!r})"
    else:
        where = "nodes " + ", ".join(repr(name) for name in recipe.names)
    return RuntimeError(f"{where}, fused into {recipe.spec.name!r}, failed: {exc}")


class ProgramKernel:
    """A fused node run as its members' own kernels, block by block.

    :param recipe: the fused node.
    :param members: each member's kernel, in the recipe's order.
    :param xp: the array module's name (``"numpy"`` or ``"cupy"``; imported
        on first call).
    :param block: elements per block, or ``None`` for one block.
    """

    def __init__(
        self,
        recipe: FusedNode,
        members: Sequence[Kernel],
        xp: str,
        block: int | None,
    ) -> None:
        self.recipe = recipe
        self._xp_name = xp
        self._xp: Any = None
        out = recipe.spec.outputs[0]
        self._dtype = out.dtype
        self._work = recipe.spec.flops
        self._split = _Split(out, recipe.input_specs, block)
        # Register allocation: interior results take scratch slots, freed
        # after their last reader ran (so no member writes over its inputs).
        last_use = {i: i for i in range(len(members))}
        for reader, args in enumerate(recipe.args):
            for arg in args:
                if arg.source == "member":
                    last_use[arg.index] = reader
        free: list[int] = []
        slots = 0
        slot_of: dict[int, int] = {}
        steps: list[tuple[Kernel, tuple[tuple[bool, int], ...], int]] = []
        sink = len(members) - 1
        for i, (kernel, args) in enumerate(zip(members, recipe.args, strict=True)):
            if i != sink:
                if not free:
                    free.append(slots)
                    slots += 1
                slot_of[i] = free.pop()
            refs = tuple(
                (
                    a.source == "input",
                    a.index if a.source == "input" else slot_of[a.index],
                )
                for a in args
            )
            steps.append((kernel, refs, slot_of.get(i, -1)))
            free.extend(
                slot_of[j] for j in range(i) if last_use[j] == i and j in slot_of
            )
        self._steps = steps
        self._slots = slots

    def __call__(self, *arrays: Array) -> None:
        xp = self._xp
        if xp is None:
            xp = self._xp = importlib.import_module(self._xp_name)
        *inputs, out = arrays
        blocks = self._split.blocks
        enough = self._work // MIN_WORK_PER_THREAD if MIN_WORK_PER_THREAD else 1 << 30
        parts = _threads.shares(len(blocks), int(enough))
        if len(parts) == 1:
            self._run(xp, inputs, out, blocks)
            return
        _threads.run_parts(
            [
                functools.partial(self._run, xp, inputs, out, blocks[i:j])
                for i, j in parts
            ]
        )

    def _run(
        self,
        xp: Any,
        inputs: Sequence[Array],
        out: Array,
        blocks: Sequence[tuple[int, int]],
    ) -> None:
        split = self._split
        scratch = xp.empty((self._slots, *split.block_shape), dtype=self._dtype)
        steps = self._steps
        member = 0
        try:
            if split.whole:
                regs = list(scratch)
                for member in range(len(steps)):
                    kernel, refs, slot = steps[member]
                    args = [inputs[k] if is_input else regs[k] for is_input, k in refs]
                    kernel(*args, regs[slot] if slot >= 0 else out)
                return
            for start, stop in blocks:
                ins = [
                    x if lead is None else x[split.rows(start, stop, lead)]
                    for x, lead in zip(inputs, split.lead, strict=True)
                ]
                mine = split.rows(0, stop - start, split.axis)
                regs = [scratch[s][mine] for s in range(self._slots)]
                target = out[split.rows(start, stop, split.axis)]
                for member in range(len(steps)):
                    kernel, refs, slot = steps[member]
                    args = [ins[k] if is_input else regs[k] for is_input, k in refs]
                    kernel(*args, regs[slot] if slot >= 0 else target)
        except Exception as exc:
            raise _failure(self.recipe, exc, member) from exc


class _Split:
    """How a fused kernel cuts its output into blocks of rows.

    Blocks run along the first axis longer than 1 (earlier axes have length
    1, so every block is contiguous). An input that spans that axis is cut
    along it too; one that does not (a scalar, a bias) is read whole and
    broadcast, as the unfused kernel reads it.
    """

    def __init__(
        self, out: TensorSpec, inputs: Sequence[TensorSpec], block: int | None
    ) -> None:
        shape = out.shape
        axis = next((a for a, n in enumerate(shape) if n > 1), None)
        self.whole = axis is None or block is None
        if axis is None or block is None:
            self.blocks: list[tuple[int, int]] = [(0, 1)]
            self.block_shape = shape
            self.lead: list[int | None] = [None] * len(inputs)
            self.axis = 0
            return
        row = math.prod(shape[axis + 1 :])
        rows = max(1, block // max(row, 1))
        extent = shape[axis]
        self.axis = axis
        self.blocks = [(r, min(r + rows, extent)) for r in range(0, extent, rows)]
        self.block_shape = (*shape[:axis], min(rows, extent), *shape[axis + 1 :])
        self.whole = len(self.blocks) == 1
        # per input: its axis matching ``axis``, if it spans it (else None)
        self.lead = []
        for tensor in inputs:
            own = axis - (len(shape) - len(tensor.shape))
            spans = own >= 0 and tensor.shape[own] == extent
            self.lead.append(own if spans else None)

    def rows(self, start: int, stop: int, axis: int | None) -> Any:
        """The index of rows ``start:stop`` along ``axis`` (``...`` when the
        tensor is not cut)."""
        if self.whole or axis is None:
            return ...
        return (*([slice(None)] * axis), slice(start, stop))


class NumexprKernel:
    """A fused node as one ``numexpr.evaluate`` call.

    :param recipe: the fused node; numexpr must be able to express it.
    :raises ValueError: if it cannot.
    """

    def __init__(self, recipe: FusedNode) -> None:
        expression = _numexpr_expression(recipe)
        if expression is None:
            raise ValueError(f"numexpr cannot evaluate {recipe.spec.name!r}")
        import numexpr

        self.recipe = recipe
        self.expression = expression
        self._evaluate = numexpr.evaluate
        self._names = [f"i{k}" for k in range(len(recipe.spec.inputs))]

    def __call__(self, *arrays: Array) -> None:
        *inputs, out = arrays
        try:
            self._evaluate(
                self.expression,
                local_dict=dict(zip(self._names, inputs, strict=True)),
                out=out,
                casting="same_kind",
            )
        except Exception as exc:
            raise _failure(self.recipe, exc, None) from exc


class CupyFusedKernel:
    """A fused node as one ``cupy.ElementwiseKernel`` (built on first call).

    :param recipe: the fused node; every member needs a CUDA template.
    """

    def __init__(self, recipe: FusedNode) -> None:
        self.recipe = recipe
        n_inputs = len(recipe.spec.inputs)
        statements: list[str] = []
        sink = len(recipe.members) - 1
        for i, (spec, args) in enumerate(zip(recipe.members, recipe.args, strict=True)):
            names = [
                f"i{a.index}" if a.source == "input" else f"m{a.index}" for a in args
            ]
            value = _template(spec).expression("cuda_c", names)
            statements.append(f"y = {value};" if i == sink else f"T m{i} = {value};")
        self.in_params = ", ".join(f"T i{k}" for k in range(n_inputs))
        self.operation = "\n".join(statements)
        self.name = f"asyncrt_fused_{recipe.nid}"
        self._kernel: Callable[..., Any] | None = None

    def __call__(self, *arrays: Array) -> None:
        kernel = self._kernel
        if kernel is None:
            cupy = importlib.import_module("cupy")
            kernel = self._kernel = cupy.ElementwiseKernel(
                self.in_params, "T y", self.operation, self.name
            )
        *inputs, out = arrays
        try:
            kernel(*inputs, out)
        except Exception as exc:
            raise _failure(self.recipe, exc, None) from exc
