"""Two streams on two cores: W2's eight branches on one and on two cpu
streams, beside two plain Python threads doing the same numpy work, in one
process, rounds interleaved.

    flock /tmp/asyncrt-bench.lock .venv/bin/python bench/bench_streams.py \\
        --peers-dir ../shared/bench --rounds 5

W2 (``../shared/bench/workloads.py``): eight chains Mul-const, Tanh, Exp,
Sqrt over float32[2M], joined by an 8-input Sum. Contenders, each the
median of ``--runs`` runs per round:

* ``plain-1``: one thread runs every branch then the Sum, numpy ufuncs
  into buffers made once (the floor's work);
* ``plain-2``: two threads, four branches each, then each sums half of the
  rows of the eight results (the join asyncrt's row split makes), the
  caller waiting on both: what two streams could reach;
* ``asyncrt-s1`` / ``asyncrt-s2``: ``graph_executor.create(..., "cpu",
  max_streams=1 or 2)``, default options otherwise, stateful ``run_sync``.

The figure the kernels issue asks for: asyncrt's two-stream speed-up
(s1 / s2) against the plain threads' (plain-1 / plain-2), per round and
for the best rounds; within 10 % means a ratio of at least 0.90.
``--neighbour`` runs a CPU-bound process on the same cores meanwhile.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_executor import DEFAULT_PEERS_DIR, load_harness, to_asyncrt  # noqa: E402
from bench_specialize import median_seconds  # noqa: E402


def plain(x: Any, consts: list[Any], threads: int) -> Callable[[], Any]:
    """W2 on ``threads`` plain threads (1 or 2), buffers made once."""
    import numpy as np

    branches = [np.empty_like(x) for _ in consts]
    total = np.empty_like(x)

    def branch(i: int) -> None:
        h = branches[i]
        np.multiply(x, consts[i], h)
        np.tanh(h, h)
        np.exp(h, h)
        np.sqrt(h, h)

    def join(rows: slice) -> None:
        out = total[rows]
        np.add(branches[0][rows], branches[1][rows], out)
        for b in branches[2:]:
            np.add(out, b[rows], out)

    if threads == 1:

        def one() -> Any:
            for i in range(len(consts)):
                branch(i)
            join(slice(None))
            return total

        return one
    half = len(x) // 2
    barrier = threading.Barrier(2)

    def worker(mine: range, rows: slice) -> None:
        for i in mine:
            branch(i)
        barrier.wait()  # every branch done before either half sums them
        join(rows)

    split = len(consts) // 2

    def two() -> Any:
        other = threading.Thread(
            target=worker, args=(range(split, len(consts)), slice(half, None))
        )
        other.start()
        worker(range(split), slice(0, half))
        other.join()
        return total

    return two


def busy() -> None:
    """A CPU-bound neighbour."""
    x = 0
    while True:
        x = (x * 1103515245 + 12345) % 2147483648


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers-dir", default=str(DEFAULT_PEERS_DIR))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--neighbour", action="store_true")
    a = ap.parse_args()

    import numpy as np

    from asyncrt import graph_executor

    _, workloads = load_harness(Path(a.peers_dir))
    wl = workloads.build("W2")
    graph, lib, params = to_asyncrt(wl, workloads)
    (name,) = wl.inputs
    x = wl.inputs[name]
    consts = [params[ins[1]] for op, ins, _, _ in wl.nodes if op == "Mul"]
    contenders: dict[str, Callable[[], Any]] = {
        "plain-1": plain(x, consts, 1),
        "plain-2": plain(x, consts, 2),
    }
    executors = []
    for streams in (1, 2):
        ex = graph_executor.create(
            graph, lib, "cpu", max_streams=streams, params=params
        )
        ex.set_input(**wl.inputs)
        executors.append(ex)
        contenders[f"asyncrt-s{streams}"] = ex.run_sync
    reference = wl.floor_outputs()[0]
    for label, fn in contenders.items():  # warm up, and check the answers
        fn()
        got = fn()
        got = got[0].numpy() if isinstance(got, list) else got
        error = float(np.max(np.abs(got - reference)) / np.max(np.abs(reference)))
        if error > 1e-5:
            raise SystemExit(f"{label}: relative error {error:.1e}")
    neighbour = None
    if a.neighbour:
        neighbour = multiprocessing.Process(target=busy, daemon=True)
        neighbour.start()
    rows = []
    try:
        for r in range(a.rounds):
            row = {
                label: median_seconds(fn, a.runs) for label, fn in contenders.items()
            }
            rows.append(row)
            print(
                f"round {r + 1}/{a.rounds}: "
                + ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in row.items()),
                flush=True,
            )
    finally:
        if neighbour is not None:
            neighbour.terminate()
        for ex in executors:
            ex.close()
    print("\n| round | plain 1/2 | asyncrt s1/s2 | asyncrt / plain speed-up |")
    print("|---|---|---|---|")
    for r, row in enumerate(rows, 1):
        p = row["plain-1"] / row["plain-2"]
        s = row["asyncrt-s1"] / row["asyncrt-s2"]
        print(f"| {r} | {p:.2f}x | {s:.2f}x | {s / p:.2f} |")
    best = {k: min(row[k] for row in rows) for k in contenders}
    p = best["plain-1"] / best["plain-2"]
    s = best["asyncrt-s1"] / best["asyncrt-s2"]
    print(
        f"\nbest of each: plain-1 {1e3 * best['plain-1']:.1f} ms, plain-2 "
        f"{1e3 * best['plain-2']:.1f} ms, asyncrt-s1 {1e3 * best['asyncrt-s1']:.1f} "
        f"ms, asyncrt-s2 {1e3 * best['asyncrt-s2']:.1f} ms; speed-ups: plain "
        f"{p:.2f}x, asyncrt {s:.2f}x ({s / p:.2f} of the plain threads'); "
        f"asyncrt-s2 / plain-2 {best['asyncrt-s2'] / best['plain-2']:.2f}"
        + (" (with a CPU-bound neighbour)" if a.neighbour else "")
    )


if __name__ == "__main__":
    main()
