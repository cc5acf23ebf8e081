"""Happens-before over a plan's streams, and the race checker.

Streams run their steps in order; a ``WaitEvent`` orders everything after it
on its stream after everything before the matching ``RecordEvent`` on the
recording stream. That is all the ordering a run guarantees: kernels on
different streams with no chain of events between them may run in any order,
or at once.

:class:`HappensBefore` computes, for every launch, a *vector clock*: for each
stream, how many of that stream's launches are guaranteed to have finished
before this launch starts (its own stream: every launch before it). Launch
``a`` happens before launch ``b`` exactly when ``b``'s clock covers ``a``'s
position on ``a``'s stream.

:func:`check_plan` proves a plan safe:

* every tensor is written by one launch, or by the parts of one split
  node (:mod:`scheduler.split`) whose row blocks are disjoint and cover
  every row;
* every launch's inputs are written by launches that happen before it (or
  are external: graph inputs and parameters) — by *every* part, for a
  tensor written in parts;
* no two tensors whose bytes overlap in an arena are ever live at once:
  for every pair, every access of one happens before every write of the
  other (heads stay live until the run ends);
* every tensor fits its arena.

A tensor written in parts counts as written by all of them: a reader waits
for each part, and its bytes are free for another tensor only once every
part and every reader is done. (No part reads another's rows: parts of one
node are never ordered among themselves.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .dag import Entry
from .errors import PlanError
from .plan import Launch, Plan, RecordEvent

__all__ = ("HappensBefore", "LaunchRef", "check_plan")


@dataclass(frozen=True, order=True)
class LaunchRef:
    """A launch's place: stream index and position among its launches."""

    stream: int
    position: int


class HappensBefore:
    """Vector clocks of every launch of a plan.

    :param plan: the plan (its ``order`` must issue records before waits).
    :raises PlanError: if a wait names an event not recorded before it.
    """

    def __init__(self, plan: Plan) -> None:
        count = len(plan.streams)
        clock = [[0] * count for _ in range(count)]  # per stream, current clock
        recorded: dict[int, list[int]] = {}
        self.clocks: dict[LaunchRef, tuple[int, ...]] = {}
        self.launch_at: dict[LaunchRef, Launch] = {}
        #: Each node's launch (its last part, for a split node).
        self.ref_of: dict[int, LaunchRef] = {}
        for s, i in plan.order:
            step = plan.streams[s].steps[i]
            if isinstance(step, Launch):
                ref = LaunchRef(s, clock[s][s])
                self.clocks[ref] = tuple(clock[s])
                self.launch_at[ref] = step
                self.ref_of[step.nid] = ref
                clock[s][s] += 1
            elif isinstance(step, RecordEvent):
                recorded[step.event] = list(clock[s])
            else:
                seen = recorded.get(step.event)
                if seen is None:
                    raise PlanError(
                        f"stream {s} waits on event {step.event} before it is recorded"
                    )
                clock[s] = [max(a, b) for a, b in zip(clock[s], seen, strict=True)]

    def before(self, a: LaunchRef, b: LaunchRef) -> bool:
        """Whether launch ``a`` is guaranteed to finish before ``b`` starts."""
        if a.stream == b.stream:
            return a.position < b.position
        return self.clocks[b][a.stream] > a.position

    def seen_by_all(self, refs: Iterable[LaunchRef]) -> tuple[int, ...]:
        """Per stream, how many of its launches are guaranteed to finish
        before every launch of ``refs`` starts (the clocks' elementwise
        minimum): launch ``a`` happens before all of them exactly when
        ``a.position < seen_by_all(refs)[a.stream]``.

        :param refs: launches, at least one.
        """
        return tuple(map(min, zip(*(self.clocks[r] for r in refs), strict=True)))

    def refs(self) -> Iterator[LaunchRef]:
        """Every launch."""
        return iter(self.clocks)


#: Per storage-owning entry: its writers (one, or the parts of a split
#: node) and its readers.
_Access = dict[Entry, tuple[list[LaunchRef], list[LaunchRef]]]


def _accesses(plan: Plan, order: HappensBefore) -> _Access:
    """Per storage-owning entry: its writers and its readers (aliases folded)."""
    table: _Access = {}
    for ref, launch in order.launch_at.items():
        for position, entry in enumerate(launch.args):
            owner = plan.resolve(entry)
            writers, readers = table.setdefault(owner, ([], []))
            if position >= launch.num_inputs:
                writers.append(ref)
            else:
                readers.append(ref)
    return table


def _check_writers(plan: Plan, order: HappensBefore, access: _Access) -> None:
    """Every tensor has one writer, or the parts of one split launch, their
    row blocks disjoint and covering the tensor's first axis."""
    for owner, (writers, _) in access.items():
        if len(writers) < 2:
            continue
        launches = [order.launch_at[w] for w in writers]
        first = launches[0]
        parts = [launch.part for launch in launches]
        names = ", ".join(launch.label for launch in launches)
        if any(
            p is None or launch.nid != first.nid
            for p, launch in zip(parts, launches, strict=True)
        ):
            raise PlanError(f"{owner} is written by {names}: more than one launch")
        blocks = sorted((p.start, p.stop) for p in parts if p is not None)
        rows = plan.tensors[owner].shape[0] if plan.tensors[owner].shape else 1
        ends = [0, *(stop for _, stop in blocks)]
        if any(start != end for (start, _), end in zip(blocks, ends, strict=False)):
            raise PlanError(
                f"{owner} is written by {names}: their rows overlap or leave a gap"
            )
        if ends[-1] != rows or any(start >= stop for start, stop in blocks):
            raise PlanError(
                f"{owner} is written by {names}: their rows do not cover 0:{rows}"
            )


def check_plan(plan: Plan) -> None:
    """Prove a plan race-free (see the module docstring).

    :raises PlanError: naming the tensors, launches and byte ranges at fault.
    """
    order = HappensBefore(plan)
    access = _accesses(plan, order)
    _check_writers(plan, order, access)
    heads = {plan.resolve(h) for h in plan.heads}
    for ref, launch in order.launch_at.items():
        for entry in launch.args[: launch.num_inputs]:
            owner = plan.resolve(entry)
            if plan.storage[owner].where == "external":
                continue
            writers = access[owner][0]
            if not writers or not all(order.before(w, ref) for w in writers):
                raise PlanError(
                    f"launch {launch.label!r} reads {entry} before it is surely written"
                )
    for device, arena in plan.arenas.items():
        placed = sorted(
            (p.offset, plan.tensors[e].nbytes, e)
            for e, p in plan.storage.items()
            if p.where == "arena" and p.device == device
        )
        for offset, size, entry in placed:
            if offset < 0 or offset + size > arena.size:
                raise PlanError(
                    f"{entry} [{offset}, {offset + size}) exceeds the {device} arena"
                )
        for i, (start_a, size_a, a) in enumerate(placed):
            for start_b, size_b, b in placed[i + 1 :]:
                if start_b >= start_a + size_a:
                    break
                if size_a == 0 or size_b == 0:
                    continue
                if not (
                    _done_before(a, b, access, order, heads)
                    or _done_before(b, a, access, order, heads)
                ):
                    raise PlanError(
                        f"{a} [{start_a}, {start_a + size_a}) and {b} "
                        f"[{start_b}, {start_b + size_b}) share bytes on {device} "
                        f"but may be live at once"
                    )


def _done_before(
    first: Entry,
    second: Entry,
    access: _Access,
    order: HappensBefore,
    heads: set[Entry],
) -> bool:
    """Whether every access of ``first`` happens before every write of
    ``second``."""
    if first in heads:
        return False  # outputs stay live until the run ends
    writers_first, readers_first = access.get(first, ([], []))
    writers_second, _ = access.get(second, ([], []))
    if not writers_second:
        return False
    return all(
        order.before(t, w)
        for t in (*writers_first, *readers_first)
        for w in writers_second
    )
