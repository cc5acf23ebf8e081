"""The command line, end to end: a few real subprocesses (the console entry
and ``python -m asyncrt``), the rest through ``main()`` in this process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asyncrt
from asyncrt.cli import main
from asyncrt.graph import GraphBuilder

ROOT = Path(__file__).resolve().parents[2]


def asyncrt_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncrt", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def model_files(folder: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """A graph JSON and its params file: y = relu(x * w)."""
    b = GraphBuilder()
    x = b.input("x", shape=(2, 3), dtype="float32")
    w = b.param("w", shape=(2, 3), dtype="float32")
    m = b.op("multiply", x, w, shape=(2, 3), dtype="float32", name="mul")
    b.output(b.op("relu", m, shape=(2, 3), dtype="float32", name="act"))
    graph_path = folder / "model.json"
    graph_path.write_text(b.build().to_json())
    w_value = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    params_path = folder / "model.params"
    params_path.write_bytes(asyncrt.save_param_dict({"w": w_value}))
    return graph_path, params_path, {"w": w_value}


def test_run_builtin_example_as_a_subprocess() -> None:
    done = asyncrt_cli("run", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["check"]["ok"] is True
    assert data["outputs"][0]["shape"] == [32, 10]
    assert set(data["devices"]) >= {"cpu:0", "sim:0", "sim:1"}
    assert "Traceback" not in done.stderr


def test_run_a_graph_with_params_inputs_outputs_and_trace(tmp_path: Path) -> None:
    graph_path, params_path, params = model_files(tmp_path)
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "x.npy", x)
    done = asyncrt_cli(
        "run", str(graph_path), "--params", str(params_path),
        "--input", f"x={tmp_path / 'x.npy'}", "--device", "cpu,sim:0",
        "--output", str(tmp_path / "out"), "--trace", str(tmp_path / "t.json"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Output" in done.stdout and "(2, 3)" in done.stdout
    saved = np.load(tmp_path / "out" / "output_0.npy")
    np.testing.assert_allclose(saved, np.maximum(x * params["w"], 0))
    trace = json.loads((tmp_path / "t.json").read_text())
    assert {"mul", "act"} <= {e["name"] for e in trace["traceEvents"]}


def test_bad_model_file_is_one_line_and_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": 1}')
    done = asyncrt_cli("plan", str(bad))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("asyncrt: error:")
    assert "bad.json" in lines[0] and "Traceback" not in done.stderr


def test_console_script_is_declared() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert 'asyncrt = "asyncrt.cli:main"' in text


# -- in process ----------------------------------------------------------------------


def test_devices(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "devices", "--json")
    assert code == 0
    found = {d["device"]: d for d in json.loads(out)}
    assert {"cpu:0", "sim:0", "sim:1"} <= set(found)
    assert found["sim:0"]["device_name"] == "asyncrt simulated accelerator"
    code, out, _ = run_main(capsys, "devices")
    assert code == 0 and "sim:1" in out and "GFLOP/s" in out


def test_plan_text_json_and_dot(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run_main(capsys, "plan", "--device", "cpu", "--device", "sim:0")
    assert code == 0
    assert "Plan on cpu:0, sim:0" in out and "dense1 = dense(" in out
    dot = tmp_path / "plan.dot"
    code, out, _err = run_main(capsys, "plan", "--json", "--dot", str(dot))
    assert code == 0
    data = json.loads(out)
    assert data["host"] == "cpu:0" and data["dot"] == str(dot)
    launches = [
        s["launch"] for st in data["plan"] for s in st["steps"] if "launch" in s
    ]
    assert "probs" in launches
    assert dot.read_text().startswith("digraph plan {")


def test_plan_shows_split_parts_unless_no_split(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With two streams, a join of four 4 MiB branches runs in two parts,
    each named with its rows in ``--json``; ``--no-split`` keeps it whole."""
    n = 1 << 20
    b = GraphBuilder()
    x = b.input("x", shape=(n,), dtype="float32")
    ts = [b.op("tanh", x, shape=(n,), dtype="float32", name=f"t{i}") for i in range(4)]
    b.output(b.op("sum", *ts, shape=(n,), dtype="float32", name="j"))
    path = tmp_path / "wide.json"
    path.write_text(b.build().to_json())
    common = ("plan", str(path), "--device", "cpu", "--streams", "2", "--json")
    code, out, _ = run_main(capsys, *common)
    assert code == 0
    steps = [s for st in json.loads(out)["plan"] for s in st["steps"]]
    parts = [s for s in steps if "part" in s]
    assert [(s["launch"], s["part"], s["rows"]) for s in parts] == [
        ("j", [0, 2], [0, n // 2]),
        ("j", [1, 2], [n // 2, n]),
    ]
    code, out, _ = run_main(capsys, *common, "--no-split")
    assert code == 0
    assert not [s for st in json.loads(out)["plan"] for s in st["steps"] if "part" in s]


def test_profile_table_csv_json_and_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run_main(capsys, "profile", "--runs", "2", "--top", "3")
    assert code == 0
    assert "Time(us)" in out and "Total" in out and "2 run(s)" in out
    code, out, _ = run_main(capsys, "profile", "--runs", "2", "--csv", "--by", "op")
    assert code == 0 and out.splitlines()[0] == "op,nodes,time_s,percent,kernels"
    trace, gantt, dump = tmp_path / "t.json", tmp_path / "g.png", tmp_path / "dump"
    code, out, err = run_main(
        capsys, "profile", "--runs", "2", "--json", "--sort", "name",
        "--trace", str(trace), "--gantt", str(gantt), "--dump", str(dump),
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    names = [n["name"] for n in data["nodes"]]
    assert names == sorted(names) and data["runs"] == 2
    assert json.loads(trace.read_text())["traceEvents"]
    assert gantt.read_bytes().startswith(b"\x89PNG")
    assert (dump / "_tvmdbg_device_CPU_0" / "_tvmdbg_graph_dump.json").exists()


def test_bench_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(
        capsys, "bench", "--device", "cpu", "--repeat", "2", "--number", "2", "--json"
    )
    assert code == 0
    data = json.loads(out)
    assert len(data["results"]) == 2 and data["mean"] > 0 and data["number"] == 2
    code, out, _ = run_main(
        capsys, "bench", "--device", "cpu", "--repeat", "2", "--end-to-end"
    )
    assert code == 0 and "Mean ms" in out and "end to end" in out


def test_onnx_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("asyncrt.frontend")
    from onnx import TensorProto, helper

    from .frontend.models import model_of

    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])],
    )
    model = model_of(graph, 17)
    path = tmp_path / "relu.onnx"
    onnx.save(model, str(path))
    code, out, err = run_main(capsys, "run", str(path), "--device", "cpu", "--json")
    assert code == 0, err
    assert json.loads(out)["outputs"][0]["min"] >= 0.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("run", "missing.json"), "missing.json: no such file"),
        (("run", "--device", "nope:0"), "not present"),
        (("run", "--input", "q=x.npy"), "no such input"),
        (("run", "--input", "broken"), "expected NAME=FILE.npy"),
        (("run", "--params", "p.bin"), "--params needs a MODEL"),
        (("profile", "--runs", "2", "--gantt", "g.txt"), ".png, .svg or .pdf"),
    ],
)
def test_user_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    code, _, err = run_main(capsys, *args)
    assert code == 1
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_bad_npy_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((3, 3), np.float32))
    code, _, err = run_main(capsys, "run", "--input", f"x={wrong}")
    assert code == 1 and "shape (3, 3), the model wants (32, 256)" in err
    junk = tmp_path / "junk.npy"
    junk.write_bytes(b"not numpy")
    code, _, err = run_main(capsys, "run", "--input", f"x={junk}")
    assert code == 1 and "not a readable .npy file" in err


def test_onnx_without_frontend_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setitem(sys.modules, "asyncrt.frontend", None)
    path = tmp_path / "m.onnx"
    path.write_bytes(b"")
    code, _, err = run_main(capsys, "run", str(path))
    assert code == 1 and "ONNX frontend" in err and "asyncrt[onnx]" in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "--repeat", "0"])
    assert info.value.code == 2
    assert "--repeat: 0 is not >= 1" in capsys.readouterr().err
