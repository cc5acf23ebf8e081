"""Every benchmark once, at a quick size, one after another (``make bench``).

    .venv/bin/python bench/run_all.py            # the peer-free ones
    PEER_PY=/path/to/peers-venv/bin/python .venv/bin/python bench/run_all.py

Without ``$PEER_PY`` only the benchmarks that need no peer virtualenv run
(ONNX Runtime itself is a dev dependency of asyncrt, so ``bench_models.py``
runs either way); with it, the peer comparisons run too, through the shared
harness in ``--peers-dir`` (default ``../shared/bench``). Each benchmark runs
in its own process; a failing one is reported and the rest still run. The
figures recorded in ``bench/results/`` come from the longer commands in
``bench/README.md``; this is the smoke run that shows every benchmark works.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: (script, its quick arguments, needs the peers' virtualenv, reads the
#: shared harness's workloads from ``--peers-dir``).
BENCHMARKS: tuple[tuple[str, tuple[str, ...], bool, bool], ...] = (
    ("bench_devices.py", ("-n", "5000", "--repeats", "3"), False, False),
    ("bench_storage.py", (), False, False),
    ("bench_models.py", ("--rounds", "1", "--min-time", "0.2"), False, False),
    (
        "bench_specialize.py",
        ("--shapes", "1x16,2x64", "--repeats", "2", "--runs", "3", "--no-today"),
        False,
        False,
    ),
    ("bench_new_ops.py", ("--rounds", "1", "--min-time", "0.1"), False, False),
    (
        "bench_serving.py",
        ("--rounds", "1", "--callers", "16", "--requests", "2"),
        False,
        False,
    ),
    ("bench_placement.py", ("-n", "30"), False, False),
    ("bench_row_split.py", ("--workload", "W2", "--runs", "10"), False, True),
    ("bench_executor.py", ("--workload", "W1,W3,W4", "--rounds", "1"), True, True),
    ("bench_kernels.py", ("--rounds", "1"), True, True),
    ("bench_split.py", ("--runs", "5"), True, True),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers-dir", help="the shared harness (bench_*.py default)")
    ap.add_argument("--only", help="comma-separated script names to run")
    a = ap.parse_args()
    have_peers = bool(os.environ.get("PEER_PY"))
    only = set(a.only.split(",")) if a.only else None
    failed: list[str] = []
    for script, args, needs_peers, reads_harness in BENCHMARKS:
        if only is not None and script not in only:
            continue
        if needs_peers and not have_peers:
            print(f"== {script}: skipped (set PEER_PY to run the peers)", flush=True)
            continue
        cmd = [sys.executable, str(HERE / script), *args]
        if reads_harness and a.peers_dir:
            cmd += ["--peers-dir", a.peers_dir]
        print(f"== {script} {' '.join(args)}", flush=True)
        start = time.perf_counter()
        code = subprocess.call(cmd)
        print(f"== {script}: exit {code}, {time.perf_counter() - start:.0f} s\n")
        if code:
            failed.append(script)
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
