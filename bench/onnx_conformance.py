"""ONNX backend node tests through asyncrt and ONNX Runtime: passes per operator.

Runs every node test case of the installed ``onnx`` through asyncrt (the
cases whose operators it all supports, with the same comparison as
``tests/asyncrt/frontend/test_onnx_conformance.py``) and through ONNX
Runtime's CPU provider (every case), in one run, and writes a markdown
report: one row per operator under test with both pass counts, the totals,
the totals over the core operators of CNNs and transformers
(:data:`CORE_OPS`), then the cases refused on purpose and any case that
failed.

    .venv/bin/python bench/onnx_conformance.py                 # to stdout
    .venv/bin/python bench/onnx_conformance.py -o bench/results/onnx_conformance.md
    .venv/bin/python bench/onnx_conformance.py --no-ort        # asyncrt alone

Both runtimes get the same inputs and are held to the case's own
tolerances (``Runner.assert_similar_outputs``). asyncrt binds the graph
inputs that decide shapes (``static_inputs``: Reshape's shape, Resize's
scales, ...) at import time, as its test does; ONNX Runtime is fed them at
run time. Tensors numpy has no dtype of its own for (bfloat16, float8,
4-bit, ...) reach ONNX Runtime as ``OrtValue``s of their ONNX type and come
back through their raw bytes, so its Python binding's lack of those numpy
dtypes is not counted against it.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.backend.test.case.test_case import TestCase

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from asyncrt.frontend import SUPPORTED_OPS
from devices._dtype import is_extension
from tests.asyncrt.frontend.conformance import (
    applicable_cases,
    assert_outputs,
    expected_failure,
    node_cases,
    primary_op,
    run_case,
)

#: The operators a CNN or a transformer encoder/decoder is built from
#: (convolutions, pools, norms, activations, matrix products, attention's
#: masking and indexing, shape plumbing, casts, resizing); the report totals
#: their cases apart.
CORE_OPS = frozenset(
    {
        # convolutional networks
        "Conv",
        "ConvTranspose",
        "BatchNormalization",
        "InstanceNormalization",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "Resize",
        "Pad",
        "Relu",
        "LeakyRelu",
        "PRelu",
        "Sigmoid",
        "HardSigmoid",
        "HardSwish",
        "Clip",
        "DepthToSpace",
        "SpaceToDepth",
        "Flatten",
        "Gemm",
        # transformers
        "MatMul",
        "LayerNormalization",
        "Softmax",
        "LogSoftmax",
        "Erf",
        "Gelu",
        "Tanh",
        "Sqrt",
        "Pow",
        "Exp",
        "Log",
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "Einsum",
        "TopK",
        "ArgMax",
        "CumSum",
        "Trilu",
        "Where",
        "Equal",
        "Less",
        "Greater",
        "Not",
        "And",
        "Or",
        "Gather",
        "GatherElements",
        "GatherND",
        "ScatterND",
        "ScatterElements",
        "NonZero",
        # arithmetic and plumbing both use
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Neg",
        "Max",
        "Min",
        "Cast",
        "Shape",
        "Reshape",
        "Transpose",
        "Concat",
        "Split",
        "Slice",
        "Squeeze",
        "Unsqueeze",
        "Expand",
        "Tile",
        "Range",
        "ConstantOfShape",
        "Constant",
        "Identity",
        "Dropout",
    }
)


@dataclass
class Row:
    """One operator's cases."""

    cases: int = 0
    passed: int = 0
    refused: int = 0
    failed: int = 0  # an unexpected error
    wrong: int = 0  # ran, and an output differed
    not_run: int = 0
    ort_passed: int = 0
    #: the names of the cases each passes
    ours: set[str] = field(default_factory=set)
    theirs: set[str] = field(default_factory=set)
    not_ran: set[str] = field(default_factory=set)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, help="write the report here")
    parser.add_argument(
        "--no-ort", action="store_true", help="run asyncrt alone (no ONNX Runtime)"
    )
    args = parser.parse_args()
    ort = None if args.no_ort else _onnxruntime()
    started = time.perf_counter()
    applicable = {case.name: case for case in applicable_cases()}
    rows: dict[str, Row] = collections.defaultdict(Row)
    refused: dict[str, list[str]] = collections.defaultdict(list)
    failed: list[tuple[str, str, str]] = []
    for case in node_cases():
        if case.model is None:
            continue
        op = primary_op(case)
        row = rows[op]
        row.cases += 1
        if ort is not None and _ort_passes(ort, case):
            row.ort_passed += 1
            row.theirs.add(case.name)
        if case.name not in applicable:
            row.not_run += 1
            row.not_ran.add(case.name)
            continue
        reason = expected_failure(case)
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore", RuntimeWarning)
                run_case(case)
        except AssertionError as exc:
            row.wrong += 1
            failed.append((case.name, "wrong answer", _first_line(exc)))
        except Exception as exc:
            if reason:
                row.refused += 1
                refused[reason].append(case.name)
            else:
                row.failed += 1
                failed.append((case.name, type(exc).__name__, _first_line(exc)))
        else:
            if reason:
                row.failed += 1
                failed.append((case.name, "passed", f"expected a refusal: {reason}"))
            else:
                row.passed += 1
                row.ours.add(case.name)
    elapsed = time.perf_counter() - started
    version = None if ort is None else str(ort.__version__)
    report = _markdown(rows, refused, failed, version, elapsed)
    if args.output:
        args.output.write_text(report)
    else:
        sys.stdout.write(report)


def _onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError:
        sys.stderr.write("onnxruntime is not installed: asyncrt alone (--no-ort)\n")
        return None
    onnxruntime.set_default_logger_severity(4)  # its refusals are counted, not logged
    return onnxruntime


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:160] if text else ""


def _array(value: Any) -> np.ndarray[Any, Any]:
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return np.asarray(value)


def _narrow(array: np.ndarray[Any, Any]) -> bool:
    return is_extension(array.dtype.name)


def _to_ort(ort: Any, array: np.ndarray[Any, Any]) -> Any:
    """An OrtValue of ``array``'s ONNX type, from its ONNX bytes (4- and
    2-bit types packed as ONNX and ONNX Runtime both lay them out)."""
    tensor = numpy_helper.from_array(array)
    value = ort.OrtValue.ortvalue_from_shape_and_type(
        list(array.shape), tensor.data_type
    )
    raw = tensor.raw_data
    if raw:
        ctypes.memmove(value.data_ptr(), raw, len(raw))
    return value


def _from_ort(value: Any, elem_type: int) -> np.ndarray[Any, Any]:
    """An ONNX Runtime output of a narrow type, through its raw bytes."""
    size = value.tensor_size_in_bytes()
    raw = ctypes.string_at(value.data_ptr(), size) if size else b""
    tensor = helper.make_tensor("out", elem_type, value.shape(), raw, raw=True)
    return numpy_helper.to_array(tensor)


def _ort_passes(ort: Any, case: TestCase) -> bool:
    """Whether ONNX Runtime runs ``case`` and matches its outputs."""
    model = case.model
    assert model is not None and case.data_sets is not None
    inputs, expected = case.data_sets[0]
    initializers = {init.name for init in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in initializers]
    try:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        feeds = {n: _array(v) for n, v in zip(names, inputs, strict=True)}
        types = {
            o.name: o.type.tensor_type.elem_type
            for o in model.graph.output
            if o.type.HasField("tensor_type")
        }
        narrow_out = [
            n
            for n, t in types.items()
            if t and is_extension(str(helper.tensor_dtype_to_np_dtype(t)))
        ]
        if any(_narrow(a) for a in feeds.values()) or narrow_out:
            values = {
                n: _to_ort(ort, a)
                if _narrow(a)
                else ort.OrtValue.ortvalue_from_numpy(a)
                for n, a in feeds.items()
            }
            outputs = [o.name for o in model.graph.output]
            results = session.run_with_ort_values(outputs, values)
            actual = [
                _from_ort(r, types[n]) if n in narrow_out else r.numpy()
                for n, r in zip(outputs, results, strict=True)
            ]
        else:
            actual = session.run(None, feeds)
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            assert_outputs(case, expected, actual)
    except Exception:
        return False
    return True


def _totals(rows: dict[str, Row], ops: set[str] | frozenset[str]) -> Row:
    total = Row()
    for op in ops:
        row = rows.get(op)
        if row is None:
            continue
        total.cases += row.cases
        total.passed += row.passed
        total.refused += row.refused
        total.failed += row.failed
        total.wrong += row.wrong
        total.not_run += row.not_run
        total.ort_passed += row.ort_passed
    return total


def _markdown(
    rows: dict[str, Row],
    refused: dict[str, list[str]],
    failed: list[tuple[str, str, str]],
    ort_version: str | None,
    elapsed: float,
) -> str:
    everything = _totals(rows, set(rows))
    core = _totals(rows, CORE_OPS)
    supported = [op for op in rows if op in SUPPORTED_OPS]
    ort = ort_version is not None
    peer = f"ONNX Runtime {ort_version} (CPU)" if ort else "ONNX Runtime: not run"
    ran = everything.cases - everything.not_run
    lines = [
        "# ONNX backend node tests: asyncrt and ONNX Runtime",
        "",
        f"onnx {onnx.__version__}, {peer}; {len(SUPPORTED_OPS)} operators "
        f"supported by asyncrt, {len(supported)} of them with node tests. "
        f"asyncrt ran {ran} cases (every operator in the model supported): "
        f"{everything.passed} passed, {everything.refused} refused on purpose, "
        f"{everything.failed + everything.wrong} failed. ({elapsed:.0f} s)",
        "",
        "| cases | total | asyncrt passed | ONNX Runtime passed | asyncrt wrong "
        "answers | asyncrt other failures |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, total in (
        (f"core CNN/transformer operators ({len(CORE_OPS)})", core),
        ("every node test", everything),
    ):
        lines.append(
            f"| {label} | {total.cases} | {total.passed} | "
            f"{total.ort_passed if ort else '-'} | {total.wrong} | {total.failed} |"
        )
    both = sum(len(r.theirs - r.not_ran) for r in rows.values())
    lines.append(
        f"| the cases asyncrt runs | {ran} | {everything.passed} | "
        f"{both if ort else '-'} | {everything.wrong} | {everything.failed} |"
    )
    lines += [
        "",
        "Per operator under test: `passed` and `ORT` count cases that ran and "
        "matched ONNX's expected outputs within the case's tolerances. "
        "`refused`: asyncrt raises a clear import-time error by design (the "
        "reasons are listed below). `not run`: the case's model uses an "
        "operator or domain asyncrt does not support (an expanded function, "
        "an ML-domain op). Rows marked * are core operators (see "
        "`CORE_OPS` in `bench/onnx_conformance.py`); `(composite)` rows are "
        "expanded function tests of operators asyncrt does not support "
        "directly; `(unsupported)` rows are operators it does not import.",
        "",
        "| operator | cases | passed | refused | failed | not run | ORT |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for op in sorted(rows, key=lambda o: (o not in SUPPORTED_OPS, o)):
        r = rows[op]
        if op in SUPPORTED_OPS:
            label = op
        elif r.not_run < r.cases:
            label = f"{op} (composite)"
        else:
            label = f"{op} (unsupported)"
        if op in CORE_OPS:
            label += " *"
        lines.append(
            f"| {label} | {r.cases} | {r.passed} | {r.refused} | "
            f"{r.failed + r.wrong} | {r.not_run} | {r.ort_passed if ort else '-'} |"
        )
    lines += ["", "## Refused on purpose", ""]
    for reason, names in sorted(refused.items()):
        lines.append(f"* {reason} ({len(names)}): {', '.join(sorted(names))}")
    if not refused:
        lines.append("none")
    lines += ["", "## Failed", ""]
    lines += [f"* `{n}`: {kind}: {msg}" for n, kind, msg in failed] or ["none"]
    if ort:
        core_rows = [rows[op] for op in sorted(CORE_OPS) if op in rows]
        for title, names in (
            (
                "Core cases asyncrt passes and ONNX Runtime does not",
                sorted(n for r in core_rows for n in r.ours - r.theirs),
            ),
            (
                "Core cases ONNX Runtime passes and asyncrt does not",
                sorted(n for r in core_rows for n in r.theirs - r.ours),
            ),
        ):
            lines += ["", f"## {title} ({len(names)})", ""]
            lines.append(", ".join(f"`{n}`" for n in names) or "none")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
