"""Placement policies on random DAGs: schedule length ratio (SLR).

Random task graphs follow the generator of Topcuoglu, Hariri and Wu (IEEE
TPDS 2002, section 5.1), with its parameters drawn per instance from its grid:

* ``v`` tasks; ``alpha`` the shape: about ``sqrt(v) / alpha`` levels of about
  ``alpha * sqrt(v)`` tasks each;
* ``out_degree``: successors per task, taken among later levels;
* ``CCR``: mean communication time over mean computation time;
* ``beta``: heterogeneity. Devices here are *related* (a task's time is its
  work over the device's speed, as in :class:`scheduler.cost.AnalyticCostModel`
  and in saga), so ``beta`` sets how far apart the 3 devices' speeds are:
  each is drawn from ``[1 - beta/2, 1 + beta/2]``.

Each instance is planned by the single fastest device, HEFT, PEFT and the
``auto`` policy (guarded best of both), and, if the ``anrg-saga`` package is
installed, by saga's HEFT on the same instance, and by saga's PEFT where
``--saga-peft`` names its ``saga/schedulers/peft.py``.

saga as a reference: ``anrg-saga`` 2.1 (the first with PEFT) needs Python
3.12; on 3.11 the newest is 2.0.2, whose core API (``Network``,
``TaskGraph``, ``Schedule``) 2.1's ``peft.py`` runs on unchanged. Its
declared dependencies (pygraphviz, which compiles against graphviz headers;
z3-solver; wfcommons; gitpython; pytest and mypy at run time) are too heavy
for our ``dev`` extra, and HEFT and PEFT need none of them but pydantic and
pysmt (imported by ``saga.schedulers``)::

    pip install --no-deps anrg-saga==2.0.2 pysmt && pip install pydantic
    pip download --no-deps --python-version 3.12 --only-binary=:all: \
        anrg-saga==2.1.0 -d /tmp/saga21 && unzip -o /tmp/saga21/*.whl \
        saga/schedulers/peft.py -d /tmp/saga21
    .venv/bin/python bench/bench_placement.py \
        --saga-peft /tmp/saga21/saga/schedulers/peft.py
SLR = makespan / (sum over the critical path of each task's minimum
compute time); lower is better, 1 is the bound.

    .venv/bin/python bench/bench_placement.py            # ~10-30 s
    .venv/bin/python bench/bench_placement.py -n 100 --seed 3
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices import Device
from scheduler.cost import AnalyticCostModel, DeviceSpeed
from scheduler.dag import Entry, GraphSpec, NodeSpec, TensorSpec, make_dag
from scheduler.placement import (
    Policy,
    fastest_single,
    get_policy,
    heft,
    lookahead,
    peft,
)

V = (20, 40, 60, 80, 100)
CCR = (0.1, 0.5, 1.0, 5.0, 10.0)
ALPHA = (0.5, 1.0, 2.0)
OUT_DEGREE = (1, 2, 3, 4, 5)
BETA = (0.1, 0.25, 0.5, 0.75, 1.0)
W_DAG = 50.0  # mean work of a task
DEVICES = [Device("sim", i) for i in range(3)]


@dataclass(frozen=True)
class Instance:
    """One random task graph on 3 related devices."""

    work: list[float]
    edges: dict[tuple[int, int], int]  # bytes; links are 1 byte/s
    speeds: list[float]
    params: tuple[int, float, float, int, float]


def generate(rng: random.Random) -> Instance:
    """One instance with parameters drawn from the paper's grid."""
    v, ccr = rng.choice(V), rng.choice(CCR)
    alpha, degree, beta = rng.choice(ALPHA), rng.choice(OUT_DEGREE), rng.choice(BETA)
    mean_width = max(1.0, alpha * math.sqrt(v))
    levels: list[list[int]] = []
    placed = 0
    while placed < v:
        width = min(v - placed, rng.randint(1, max(1, round(2 * mean_width - 1))))
        levels.append(list(range(placed, placed + width)))
        placed += width
    level_of = {n: i for i, level in enumerate(levels) for n in level}
    edges: dict[tuple[int, int], int] = {}

    def data() -> int:
        return max(1, round(rng.uniform(0, 2 * ccr * W_DAG)))

    for i, level in enumerate(levels[:-1]):
        later = [n for lv in levels[i + 1 :] for n in lv]
        near = levels[i + 1]
        for n in level:
            targets = rng.sample(later, min(degree, len(later)))
            if not any(level_of[t] == i + 1 for t in targets):
                targets[0] = rng.choice(near)
            for t in targets:
                edges[n, t] = data()
    for i, level in enumerate(levels[1:], start=1):
        for n in level:
            if not any((u, n) in edges for u in levels[i - 1]):
                edges[rng.choice(levels[i - 1]), n] = data()
    work = [rng.uniform(1, 2 * W_DAG) for _ in range(v)]
    speeds = [rng.uniform(1 - beta / 2, 1 + beta / 2) for _ in DEVICES]
    return Instance(work, edges, speeds, (v, ccr, alpha, degree, beta))


def to_dag(inst: Instance) -> tuple[nx.DiGraph, AnalyticCostModel]:
    """The scheduler's DAG: one output per out-edge, sized in bytes."""
    n = len(inst.work)
    outs: dict[int, list[TensorSpec]] = {i: [] for i in range(n)}
    ins: dict[int, list[Entry]] = {i: [] for i in range(n)}
    for (u, t), nbytes in sorted(inst.edges.items()):
        outs[u].append(TensorSpec((nbytes,), "uint8"))
        ins[t].append(Entry(u, len(outs[u]) - 1))
    nodes = [
        NodeSpec(f"t{i}", "tvm_op", "k", tuple(ins[i]), tuple(outs[i]), flops=w)
        for i, w in enumerate(inst.work)
    ]
    dag = make_dag(nodes, GraphSpec((), (), ()))
    speeds = {
        d: DeviceSpeed(flops=s, bandwidth=1.0, latency=0.0)
        for d, s in zip(DEVICES, inst.speeds, strict=True)
    }
    return dag, AnalyticCostModel(dag, speeds)


def cp_min(inst: Instance) -> float:
    """Critical path with each task at its minimum compute time, no copies."""
    fastest = max(inst.speeds)
    g = nx.DiGraph(list(inst.edges))
    g.add_nodes_from(range(len(inst.work)))
    longest: dict[int, float] = {}
    for n in nx.topological_sort(g):
        before = max((longest[u] for u in g.predecessors(n)), default=0.0)
        longest[n] = before + inst.work[n] / fastest
    return max(longest.values())


def saga_heft() -> Callable[[Instance], float] | None:
    """saga's HEFT, or None if saga is not installed."""
    try:
        from saga import Network, TaskGraph  # type: ignore[import-not-found,import-untyped,unused-ignore]
        from saga.schedulers.heft import HeftScheduler  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        return None
    logging.getLogger().setLevel(logging.ERROR)
    return _saga_runner(HeftScheduler(), Network, TaskGraph)


def saga_peft(path: str) -> Callable[[Instance], float]:
    """saga 2.1's PEFT, loaded from its ``peft.py`` on the installed saga."""
    import importlib.util

    from saga import Network, TaskGraph  # type: ignore[import-not-found,import-untyped,unused-ignore]

    spec = importlib.util.spec_from_file_location("saga_peft", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return _saga_runner(module.PEFTScheduler(), Network, TaskGraph)


def _saga_runner(
    scheduler: Any, network_type: Any, graph_type: Any
) -> Callable[[Instance], float]:
    """A saga scheduler as a function from an instance to its makespan."""

    def run(inst: Instance) -> float:
        names = [str(d) for d in DEVICES]
        network = network_type.create(
            [(nm, s) for nm, s in zip(names, inst.speeds, strict=True)],
            [(a, b, 1.0) for a in names for b in names if a < b],
        )
        graph = graph_type.create(
            [(f"t{i}", w) for i, w in enumerate(inst.work)],
            [(f"t{u}", f"t{t}", float(b)) for (u, t), b in inst.edges.items()],
        )
        return float(scheduler.schedule(network, graph).makespan)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=300, help="instances (300)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--saga-peft", help="saga 2.1's saga/schedulers/peft.py (see above)"
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    policies: dict[str, Callable[[Instance], float]] = {}

    def ours(policy: Policy) -> Callable[[Instance], float]:
        def run(inst: Instance) -> float:
            dag, cost = to_dag(inst)
            return float(policy(dag, DEVICES, cost).makespan)

        return run

    policies["single-fastest"] = ours(fastest_single)
    policies["heft"] = ours(heft)
    policies["peft"] = ours(peft)
    policies["lookahead"] = ours(lookahead)
    policies["lookahead (guarded)"] = ours(get_policy("lookahead"))
    policies["auto (guarded)"] = ours(get_policy("auto"))
    saga_run = saga_heft()
    if saga_run is not None:
        policies["saga heft"] = saga_run
    else:
        print("(anrg-saga not installed: saga rows skipped)", file=sys.stderr)
    if args.saga_peft:
        policies["saga peft"] = saga_peft(args.saga_peft)

    slr: dict[str, list[float]] = {name: [] for name in policies}
    spent = dict.fromkeys(policies, 0.0)
    makespans: dict[str, list[float]] = {name: [] for name in policies}
    for _ in range(args.n):
        inst = generate(rng)
        bound = cp_min(inst)
        for name, run in policies.items():
            t0 = time.perf_counter()
            makespan = run(inst)
            spent[name] += time.perf_counter() - t0
            makespans[name].append(makespan)
            slr[name].append(makespan / bound)

    single = makespans["single-fastest"]
    base = makespans["heft"]
    eps = 1e-9
    print(
        f"{args.n} random DAGs (HEFT-paper generator), 3 related devices, "
        f"seed {args.seed}"
    )
    header = (
        f"{'policy':<19} {'mean SLR':>9} {'median':>7} {'worse than':>11} "
        f"{'better than':>12} {'worse than':>11} {'ms/graph':>9}"
    )
    print(header)
    print(f"{'':<19} {'':>9} {'':>7} {'single':>11} {'our heft':>12} {'our heft':>11}")
    summary: dict[str, dict[str, float]] = {}
    for name in policies:
        ms = makespans[name]
        worse_single = sum(m > s * (1 + eps) for m, s in zip(ms, single, strict=True))
        better = sum(m < b * (1 - eps) for m, b in zip(ms, base, strict=True))
        worse = sum(m > b * (1 + eps) for m, b in zip(ms, base, strict=True))
        print(
            f"{name:<19} {statistics.fmean(slr[name]):>9.3f} "
            f"{statistics.median(slr[name]):>7.3f} {worse_single:>11} "
            f"{better:>12} {worse:>11} {1000 * spent[name] / args.n:>9.2f}"
        )
        summary[name] = dict(
            mean_slr=statistics.fmean(slr[name]),
            median_slr=statistics.median(slr[name]),
            worse_than_single=worse_single,
            better_than_our_heft=better,
            worse_than_our_heft=worse,
            ms_per_graph=1000 * spent[name] / args.n,
        )
    if saga_run is not None:
        same = sum(
            math.isclose(a, b, rel_tol=1e-9)
            for a, b in zip(makespans["saga heft"], base, strict=True)
        )
        print(f"saga heft == our heft on {same}/{args.n} instances")
    if args.json:
        Path(args.json).write_text(
            json.dumps(dict(n=args.n, seed=args.seed, policies=summary), indent=2)
        )


if __name__ == "__main__":
    main()
