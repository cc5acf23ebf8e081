"""ONNX backend node tests through asyncrt: passes and failures per operator.

Runs every node test case whose operators asyncrt supports (the same cases
and comparison as ``tests/asyncrt/frontend/test_onnx_conformance.py``) and
writes a markdown report: one row per operator under test, then the cases
refused on purpose and any case that failed.

    .venv/bin/python bench/onnx_conformance.py                 # to stdout
    .venv/bin/python bench/onnx_conformance.py -o bench/results/onnx_conformance.md
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from asyncrt.frontend import SUPPORTED_OPS
from tests.asyncrt.frontend.conformance import (
    applicable_cases,
    expected_failure,
    node_cases,
    primary_op,
    run_case,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, help="write the report here")
    args = parser.parse_args()
    started = time.perf_counter()
    cases = applicable_cases()
    ran = {case.name for case in cases}
    rows: dict[str, collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    refused: dict[str, list[str]] = collections.defaultdict(list)
    failed: list[tuple[str, str, str]] = []
    for case in cases:
        op = primary_op(case)
        reason = expected_failure(case)
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore", RuntimeWarning)
                run_case(case)
        except Exception as exc:
            if reason:
                rows[op]["refused"] += 1
                refused[reason].append(case.name)
            else:
                rows[op]["failed"] += 1
                message = (
                    str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
                )
                failed.append((case.name, type(exc).__name__, message))
        else:
            rows[op]["unexpected pass" if reason else "passed"] += 1
    # Cases of supported operators not run: their (expanded) models use an
    # operator or domain asyncrt does not support.
    for case in node_cases():
        if case.name in ran or case.model is None:
            continue
        op = primary_op(case)
        if op in SUPPORTED_OPS:
            rows[op]["not run"] += 1
    elapsed = time.perf_counter() - started
    report = _markdown(rows, refused, failed, len(cases), elapsed)
    if args.output:
        args.output.write_text(report)
    else:
        sys.stdout.write(report)


def _markdown(
    rows: dict[str, collections.Counter[str]],
    refused: dict[str, list[str]],
    failed: list[tuple[str, str, str]],
    total: int,
    elapsed: float,
) -> str:
    passed = sum(r["passed"] for r in rows.values())
    n_refused = sum(r["refused"] for r in rows.values())
    supported = [op for op in rows if op in SUPPORTED_OPS]
    lines = [
        "# ONNX backend node tests through asyncrt",
        "",
        f"onnx {onnx.__version__}; {total} cases run (every operator in the model "
        f"supported), {passed} passed, {n_refused} refused on purpose, "
        f"{len(failed)} failed; {len(SUPPORTED_OPS)} operators supported, "
        f"{len(supported)} of them with node tests. ({elapsed:.0f} s)",
        "",
        "`refused`: asyncrt raises a clear import-time error by design (the "
        "reasons are listed below). `not run`: the case's model uses an operator "
        "asyncrt does not support (an expanded function, an ML-domain op). "
        "Composite rows are expanded function tests of operators asyncrt does "
        "not support directly.",
        "",
        "| operator | passed | refused | failed | not run |",
        "|---|---:|---:|---:|---:|",
    ]
    for op in sorted(rows, key=lambda o: (o not in SUPPORTED_OPS, o)):
        r = rows[op]
        label = op if op in SUPPORTED_OPS else f"{op} (composite)"
        lines.append(
            f"| {label} | {r['passed']} | {r['refused']} | "
            f"{r['failed'] + r['unexpected pass']} | {r['not run']} |"
        )
    lines += ["", "## Refused on purpose", ""]
    for reason, names in sorted(refused.items()):
        lines.append(f"* {reason} ({len(names)}): {', '.join(sorted(names))}")
    lines += ["", "## Failed", ""]
    lines += [f"* `{n}`: {kind}: {msg}" for n, kind, msg in failed] or ["none"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
