"""Offsets for tensors in one arena: the storage planner.

The planner works on two inputs only:

* **storage requests** (:class:`StorageRequest`): one per tensor that needs
  arena memory, with a key (for graphs, an :class:`~scheduler.dag.Entry`),
  a size in bytes and an alignment;
* a **conflict relation** (:class:`Conflicts`): two requests conflict when
  both can be live at the same time under *some* execution the runtime
  allows. Conflicting requests must get disjoint byte ranges; requests that
  do not conflict may share bytes.

It does not know how the conflicts were derived. With one in-order stream
they come from lifetime intervals in a linear launch order
(:func:`interval_conflicts`, fed by :mod:`scheduler.liveness`); with several
streams they will come from the happens-before order that streams and
events guarantee. Either way the offset assignment below is the same.

Offset assignment (:func:`plan_offsets`)
----------------------------------------
Choosing offsets that minimise the arena is NP-hard (it contains interval
colouring with weights), so we use the greedy family of Pisarchyk & Lee,
"Efficient Memory Management for Deep Neural Net Inference" (2020), also
used by TFLite:

1. Put the requests in some order (see below).
2. Take them one at a time. Look at the already placed requests that
   conflict with this one, sorted by offset, and at the gaps between them
   (and before the first one). Among the gaps the request fits in, once its
   start is rounded up to its alignment, pick the *smallest* (best fit);
   ties go to the lowest offset. If no gap fits, place it just after the
   highest end among its placed conflicts.
3. The arena size is the highest end of any request, rounded up to the
   largest alignment, so that arenas laid end to end (one per concurrent
   run, say) keep every offset aligned.

The order matters. *Greedy by size* (largest first) is the classic one.
We also try a few other deterministic orders that need nothing but the
requests and the conflict relation -- by *breadth* (the bytes of the
request plus all requests it conflicts with: crowded moments first), and
by size with breadth as the tie-break -- and keep the smallest arena; the
first order wins ties. Ties inside an order fall back to the position of
the request in the input, so the output depends only on the input.

Lower bound
-----------
No plan can be smaller than the largest total size of a set of requests
that pairwise conflict (a clique: they are all live together, in some
sense, and need disjoint bytes). For interval conflicts this is exactly the
largest number of live bytes at any one step, which :func:`interval_conflicts`
computes with a sweep. For a general relation finding the largest clique is
NP-hard, so :func:`plan_offsets` then uses a greedy clique, which is still a
valid (if weaker) bound.

When all requests share one alignment ``A`` (the usual case), each size in
the bound is first rounded up to a multiple of ``A``: in a clique sorted by
offset, the next request starts at a multiple of ``A`` at or after the end
of the previous one, and the arena size is rounded up too, so the rounded
sizes add up. With mixed alignments the bound uses exact sizes.

Checking (:func:`check_no_overlap`)
-----------------------------------
Every plan can be checked independently of how it was made: all
conflicting pairs are disjoint, every offset is aligned, and every request
ends within the arena.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Generic, TypeVar

from scheduler.errors import PlanError

__all__ = (
    "ArenaPlan",
    "Conflicts",
    "Lifetime",
    "StorageRequest",
    "check_no_overlap",
    "interval_conflicts",
    "plan_offsets",
)

K = TypeVar("K", bound=Hashable)

DEFAULT_ALIGNMENT = 64


@dataclass(frozen=True)
class StorageRequest(Generic[K]):
    """One tensor that needs bytes in the arena.

    :ivar key: what the request is for, unique among the requests (for
        graphs, the :class:`~scheduler.dag.Entry` of the tensor).
    :ivar nbytes: size in bytes (``0`` is allowed and takes no space).
    :ivar alignment: the offset must be a multiple of this (a power of two
        is usual but not required).
    """

    key: K
    nbytes: int
    alignment: int = DEFAULT_ALIGNMENT

    def __post_init__(self) -> None:
        if self.nbytes < 0:
            raise PlanError(
                f"storage request {self.key!r}: negative size {self.nbytes}"
            )
        if self.alignment < 1:
            raise PlanError(
                f"storage request {self.key!r}: alignment {self.alignment} is not >= 1"
            )


@dataclass(frozen=True)
class Lifetime:
    """The steps during which a tensor is live, both ends included.

    :ivar first: the step that writes it.
    :ivar last: the last step that needs it (``>= first``).
    """

    first: int
    last: int

    def __post_init__(self) -> None:
        if self.last < self.first:
            raise PlanError(
                f"lifetime [{self.first}, {self.last}] ends before it starts"
            )

    def __str__(self) -> str:
        return f"[{self.first}, {self.last}]"


@dataclass(frozen=True)
class Conflicts(Generic[K]):
    """A symmetric conflict relation: which requests may be live together.

    Build one with :meth:`from_pairs`; keys without conflicts need not appear.

    :ivar neighbours: for each key, the keys it conflicts with (symmetric,
        never containing the key itself).
    """

    neighbours: Mapping[K, frozenset[K]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[K, K]]) -> Conflicts[K]:
        """Build the relation from unordered pairs (either order, repeats ok).

        :param pairs: the conflicting pairs.
        :return: the symmetric relation.
        :raises PlanError: if a key is paired with itself.
        """
        sets: dict[K, set[K]] = {}
        for a, b in pairs:
            if a == b:
                raise PlanError(f"storage request {a!r} conflicts with itself")
            sets.setdefault(a, set()).add(b)
            sets.setdefault(b, set()).add(a)
        return cls(MappingProxyType({k: frozenset(v) for k, v in sets.items()}))

    def of(self, key: K) -> frozenset[K]:
        """The keys that conflict with ``key`` (empty if none).

        :param key: a request key.
        :return: its neighbours in the relation.
        """
        return self.neighbours.get(key, frozenset())

    def conflict(self, a: K, b: K) -> bool:
        """Whether requests ``a`` and ``b`` conflict.

        :param a: a request key.
        :param b: another request key.
        :return: ``True`` if they may be live at the same time.
        """
        return b in self.of(a)

    def num_pairs(self) -> int:
        """The number of conflicting (unordered) pairs."""
        return sum(len(v) for v in self.neighbours.values()) // 2


@dataclass(frozen=True)
class ArenaPlan(Generic[K]):
    """Where each request lives in one arena.

    :ivar offsets: byte offset of each request, by key.
    :ivar size: arena size in bytes: the highest end of any request, rounded
        up to the largest alignment.
    :ivar lower_bound: no plan for these requests and conflicts can be
        smaller (ignoring alignment padding); ``size / lower_bound`` says how
        close to optimal the plan is.
    """

    offsets: Mapping[K, int]
    size: int
    lower_bound: int

    @property
    def ratio(self) -> float:
        """``size / lower_bound`` (``1.0`` for an empty arena)."""
        if self.lower_bound == 0:
            return 1.0 if self.size == 0 else float("inf")
        return self.size / self.lower_bound

    def __str__(self) -> str:
        lines = [
            f"ArenaPlan: {len(self.offsets)} tensors, {self.size} bytes "
            f"(lower bound {self.lower_bound}, {self.ratio:.3f}x)"
        ]
        for key, offset in sorted(self.offsets.items(), key=lambda kv: kv[1]):
            lines.append(f"  {offset:>12}  {key!r}")
        return "\n".join(lines)


def _align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def _index_requests(requests: Sequence[StorageRequest[K]]) -> dict[K, int]:
    index: dict[K, int] = {}
    for i, request in enumerate(requests):
        if request.key in index:
            raise PlanError(f"duplicate storage request {request.key!r}")
        index[request.key] = i
    return index


def _check_conflict_keys(conflicts: Conflicts[K], index: Mapping[K, int]) -> None:
    for key, others in conflicts.neighbours.items():
        for k in (key, *others):
            if k not in index:
                raise PlanError(f"conflict names {k!r}, which has no storage request")
        for other in others:
            if key not in conflicts.of(other):
                raise PlanError(
                    f"conflict relation is not symmetric: {key!r} conflicts with "
                    f"{other!r} but not the other way round"
                )


def _max_alignment(requests: Sequence[StorageRequest[K]]) -> int:
    return max((r.alignment for r in requests), default=1)


def _bound_sizes(requests: Sequence[StorageRequest[K]]) -> dict[K, int]:
    """Sizes that count towards the lower bound: padded to the alignment when
    every request has the same one (see "Lower bound"), else exact."""
    if len({r.alignment for r in requests}) > 1:
        return {r.key: r.nbytes for r in requests}
    return {r.key: _align_up(r.nbytes, r.alignment) for r in requests}


def _greedy_clique_bound(
    requests: Sequence[StorageRequest[K]], conflicts: Conflicts[K]
) -> int:
    """A valid lower bound for a general relation: the heaviest of greedy
    cliques, one grown from each request (largest neighbours first)."""
    nbytes = _bound_sizes(requests)
    best = 0
    for request in requests:
        clique = [request.key]
        total = nbytes[request.key]
        candidates = sorted(conflicts.of(request.key), key=lambda k: -nbytes[k])
        for k in candidates:
            if all(conflicts.conflict(k, c) for c in clique):
                clique.append(k)
                total += nbytes[k]
        best = max(best, total)
    return best


def _place(
    order: Sequence[StorageRequest[K]], conflicts: Conflicts[K]
) -> tuple[dict[K, int], int]:
    """Greedy best-fit placement of ``order``; returns offsets and size."""
    offsets: dict[K, int] = {}
    ends: dict[K, int] = {}
    size = 0
    for request in order:
        placed = sorted(
            (offsets[k], ends[k])
            for k in conflicts.of(request.key)
            if k in offsets and ends[k] > offsets[k]
        )
        best: int | None = None
        best_gap = 0
        prev_end = 0
        for start, end in placed:
            candidate = _align_up(prev_end, request.alignment)
            gap = start - prev_end
            if start - candidate >= request.nbytes and (best is None or gap < best_gap):
                best, best_gap = candidate, gap
            prev_end = max(prev_end, end)
        offset = best if best is not None else _align_up(prev_end, request.alignment)
        offsets[request.key] = offset
        ends[request.key] = offset + request.nbytes
        size = max(size, offset + request.nbytes)
    return offsets, size


def _orders(
    requests: Sequence[StorageRequest[K]], conflicts: Conflicts[K]
) -> list[list[StorageRequest[K]]]:
    """The deterministic orders :func:`plan_offsets` tries, best guess first."""
    nbytes = {r.key: r.nbytes for r in requests}
    breadth = {
        r.key: r.nbytes + sum(nbytes[k] for k in conflicts.of(r.key)) for r in requests
    }
    indexed = list(enumerate(requests))
    sort_keys: list[Callable[[tuple[int, StorageRequest[K]]], tuple[int, ...]]] = [
        lambda ir: (-ir[1].nbytes, ir[0]),
        lambda ir: (-ir[1].nbytes, -breadth[ir[1].key], ir[0]),
        lambda ir: (-breadth[ir[1].key], -ir[1].nbytes, ir[0]),
    ]
    return [[r for _, r in sorted(indexed, key=sort_key)] for sort_key in sort_keys]


def plan_offsets(
    requests: Sequence[StorageRequest[K]],
    conflicts: Conflicts[K],
    lower_bound: int | None = None,
) -> ArenaPlan[K]:
    """Assign each request an offset so that no two conflicting ones overlap.

    See the module docstring for the algorithm. The result depends only on
    the arguments (including the order of ``requests``, used for ties).

    :param requests: one per tensor, keys unique.
    :param conflicts: which requests may be live at the same time.
    :param lower_bound: a known lower bound on the arena (for example the
        exact one from :func:`interval_conflicts`); if ``None``, a greedy
        clique bound is computed.
    :return: the plan with the smallest arena among the orders tried.
    :raises PlanError: if two requests share a key, or the conflict relation
        names an unknown key or is not symmetric.
    """
    index = _index_requests(requests)
    _check_conflict_keys(conflicts, index)
    if lower_bound is None:
        lower_bound = _greedy_clique_bound(requests, conflicts)
    alignment = _max_alignment(requests)
    best: tuple[dict[K, int], int] | None = None
    for order in _orders(requests, conflicts):
        offsets, size = _place(order, conflicts)
        if best is None or size < best[1]:
            best = (offsets, size)
        if _align_up(size, alignment) <= lower_bound:
            break
    offsets, size = best if best is not None else ({}, 0)
    size = _align_up(size, alignment)
    ordered = {r.key: offsets[r.key] for r in requests}
    return ArenaPlan(MappingProxyType(ordered), size, lower_bound)


def interval_conflicts(
    requests: Sequence[StorageRequest[K]], lifetimes: Mapping[K, Lifetime]
) -> tuple[Conflicts[K], int]:
    """The conflict relation and exact lower bound of tensors live over intervals.

    Two requests conflict when their lifetimes share a step (ends included).
    The lower bound is the largest total size live at any one step, found by
    a sweep over the interval ends.

    :param requests: the requests, keys unique.
    :param lifetimes: the lifetime of every request, by key.
    :return: ``(conflicts, lower_bound)``.
    :raises PlanError: if a request has no lifetime or two share a key.
    """
    _index_requests(requests)
    missing = [r.key for r in requests if r.key not in lifetimes]
    if missing:
        raise PlanError(f"storage requests without a lifetime: {missing!r}")
    weight = _bound_sizes(requests)
    by_start = sorted(
        range(len(requests)), key=lambda i: (lifetimes[requests[i].key].first, i)
    )
    pairs: list[tuple[K, K]] = []
    active: list[int] = []
    live_bytes = 0
    lower_bound = 0
    for i in by_start:
        key = requests[i].key
        first = lifetimes[key].first
        kept: list[int] = []
        for j in active:
            if lifetimes[requests[j].key].last >= first:
                kept.append(j)
            else:
                live_bytes -= weight[requests[j].key]
        active = kept
        pairs.extend((requests[j].key, key) for j in active)
        active.append(i)
        live_bytes += weight[key]
        lower_bound = max(lower_bound, live_bytes)
    return Conflicts.from_pairs(pairs), lower_bound


def check_no_overlap(
    plan: ArenaPlan[K],
    requests: Sequence[StorageRequest[K]],
    conflicts: Conflicts[K],
) -> None:
    """Check a plan against its requests and conflicts, exhaustively.

    :param plan: the plan to check.
    :param requests: the requests it was made for.
    :param conflicts: which requests may be live at the same time.
    :raises PlanError: if a request has no offset, an offset is negative or
        not a multiple of the request's alignment, a request ends past
        ``plan.size``, or two conflicting requests share a byte (the message
        names both keys and their byte ranges).
    """
    index = _index_requests(requests)
    _check_conflict_keys(conflicts, index)
    for request in requests:
        key = request.key
        if key not in plan.offsets:
            raise PlanError(f"storage request {key!r} has no offset in the plan")
        offset = plan.offsets[key]
        if offset < 0 or offset % request.alignment:
            raise PlanError(
                f"{key!r} at offset {offset} is not aligned to {request.alignment}"
            )
        if offset + request.nbytes > plan.size:
            raise PlanError(
                f"{key!r} at [{offset}, {offset + request.nbytes}) extends past "
                f"the arena size {plan.size}"
            )
    for a in requests:
        a_start = plan.offsets[a.key]
        a_end = a_start + a.nbytes
        for b_key in conflicts.of(a.key):
            if index[b_key] <= index[a.key]:
                continue
            b_start = plan.offsets[b_key]
            b_end = b_start + requests[index[b_key]].nbytes
            # (half-open ranges: an empty one shares no byte, wherever it is)
            if max(a_start, b_start) < min(a_end, b_end):
                raise PlanError(
                    f"conflicting tensors overlap: {a.key!r} at [{a_start}, {a_end}) "
                    f"and {b_key!r} at [{b_start}, {b_end})"
                )
