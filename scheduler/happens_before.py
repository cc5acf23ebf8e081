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

* every launch's inputs are written by launches that happen before it (or
  are external: graph inputs and parameters);
* no two tensors whose bytes overlap in an arena are ever live at once:
  for every pair, every access of one happens before the write of the other
  (heads stay live until the run ends);
* every tensor fits its arena.
"""

from __future__ import annotations

from collections.abc import Iterator
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

    def refs(self) -> Iterator[LaunchRef]:
        """Every launch."""
        return iter(self.clocks)


def _accesses(
    plan: Plan, order: HappensBefore
) -> dict[Entry, tuple[LaunchRef | None, list[LaunchRef]]]:
    """Per storage-owning entry: its writer and its readers (aliases folded)."""
    table: dict[Entry, tuple[LaunchRef | None, list[LaunchRef]]] = {}
    for ref, launch in order.launch_at.items():
        for position, entry in enumerate(launch.args):
            owner = plan.resolve(entry)
            writer, readers = table.get(owner, (None, []))
            if position >= launch.num_inputs:
                writer = ref
            else:
                readers.append(ref)
            table[owner] = (writer, readers)
    return table


def check_plan(plan: Plan) -> None:
    """Prove a plan race-free (see the module docstring).

    :raises PlanError: naming the tensors, launches and byte ranges at fault.
    """
    order = HappensBefore(plan)
    access = _accesses(plan, order)
    heads = {plan.resolve(h) for h in plan.heads}
    for ref, launch in order.launch_at.items():
        for entry in launch.args[: launch.num_inputs]:
            owner = plan.resolve(entry)
            if plan.storage[owner].where == "external":
                continue
            writer = access[owner][0]
            if writer is None or not order.before(writer, ref):
                raise PlanError(
                    f"launch {launch.name!r} reads {entry} before it is surely written"
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
    access: dict[Entry, tuple[LaunchRef | None, list[LaunchRef]]],
    order: HappensBefore,
    heads: set[Entry],
) -> bool:
    """Whether every access of ``first`` happens before ``second`` is written."""
    if first in heads:
        return False  # outputs stay live until the run ends
    writer_first, readers_first = access.get(first, (None, []))
    writer_second, _ = access.get(second, (None, []))
    if writer_second is None:
        return False
    touches = [r for r in (writer_first, *readers_first) if r is not None]
    return all(order.before(t, writer_second) for t in touches)
