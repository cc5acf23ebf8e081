"""The command line, end to end: a few real subprocesses (the console entry
and ``python -m asyncrt``), the rest through ``main()`` in this process."""

from __future__ import annotations

import csv
import io
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
    names = {e["name"] for e in trace["traceEvents"]}
    # one compiled node where numba is installed (the default fusion)
    assert {"mul", "act"} <= names or "fused_mul_relu" in names, names


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
    """With two streams and fusion off, a join of four 4 MiB branches runs in
    two parts, each named with its rows in ``--json``; ``--no-split`` keeps
    it whole (by default the whole chain fuses into one node)."""
    n = 1 << 20
    b = GraphBuilder()
    x = b.input("x", shape=(n,), dtype="float32")
    ts = [b.op("tanh", x, shape=(n,), dtype="float32", name=f"t{i}") for i in range(4)]
    b.output(b.op("sum", *ts, shape=(n,), dtype="float32", name="j"))
    path = tmp_path / "wide.json"
    path.write_text(b.build().to_json())
    code, out, _ = run_main(capsys, "plan", str(path), "--device", "cpu", "--json")
    assert code == 0
    (fused,) = [s["launch"] for st in json.loads(out)["plan"] for s in st["steps"]]
    assert fused == "fused_tanh_tanh_tanh_tanh_sum"
    common = ("plan", str(path), "--device", "cpu", "--streams", "2", "--json")
    common += ("--fuse", "off")
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
    assert code == 1 and "not a readable .npy or .npz file" in err


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


# -- exported ONNX models with symbolic dimensions, from the command line only ------


def onnx_cnn(path: Path, batch: str | int = "batch") -> Path:
    """Conv -> Relu -> GlobalAveragePool over ``x: [batch, 3, 8, 8]``, as an
    exporter writes it with a dynamic batch axis."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from .frontend.models import model_of

    weights = np.random.default_rng(5).standard_normal((4, 3, 3, 3))
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["y"], name="gap"),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 1, 1])],
        [numpy_helper.from_array(weights.astype(np.float32), "w")],
    )
    onnx.save(model_of(graph, 17), str(path))
    return path


def onnx_bert(path: Path, dims: tuple[str | int, str | int] = ("batch", "seq")) -> Path:
    """BERT's embeddings: word and token-type tables gathered by two int64
    inputs (the token-type table has 2 rows), summed, normalised, projected."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from .frontend.models import model_of

    rng = np.random.default_rng(9)
    tables = {
        "word_embeddings": rng.standard_normal((50, 8)),
        "token_type_embeddings": rng.standard_normal((2, 8)),
        "ln_scale": np.ones(8),
        "ln_bias": np.zeros(8),
        "proj": rng.standard_normal((8, 4)),
    }
    nodes = [
        helper.make_node("Gather", ["word_embeddings", "input_ids"], ["we"]),
        helper.make_node("Gather", ["token_type_embeddings", "token_type_ids"], ["te"]),
        helper.make_node("Add", ["we", "te"], ["emb"]),
        helper.make_node(
            "LayerNormalization", ["emb", "ln_scale", "ln_bias"], ["ln"], axis=-1
        ),
        helper.make_node("MatMul", ["ln", "proj"], ["y"]),
    ]
    ids = [
        helper.make_tensor_value_info(name, TensorProto.INT64, list(dims))
        for name in ("input_ids", "token_type_ids")
    ]
    graph = helper.make_graph(
        nodes,
        "bert_embeddings",
        ids,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*dims, 4])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in tables.items()],
    )
    onnx.save(model_of(graph, 17), str(path))
    return path


def test_run_an_onnx_model_with_a_symbolic_batch_from_the_command_line(
    tmp_path: Path,
) -> None:
    ort = pytest.importorskip("onnxruntime")
    model = onnx_cnn(tmp_path / "cnn.onnx")
    x = np.random.default_rng(0).standard_normal((3, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    # The batch comes from the array given.
    done = asyncrt_cli(
        "run", str(model), "--input", f"x={tmp_path / 'x.npy'}", "--device", "cpu",
        "--output", str(tmp_path / "out"), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outputs"][0]["shape"] == [3, 4, 1, 1]
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    np.testing.assert_allclose(
        np.load(tmp_path / "out" / "output_0.npy"), expected, rtol=1e-4, atol=1e-5
    )
    # From --shape, with random data; and with nothing, the symbol is 1.
    done = asyncrt_cli("run", str(model), "--shape", "x=2x3x8x8", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outputs"][0]["shape"] == [2, 4, 1, 1]
    done = asyncrt_cli("run", str(model), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    assert "'batch' taken as 1" in done.stderr and "(1, 4, 1, 1)" in done.stdout


def test_profile_a_bert_style_model_out_of_the_box(tmp_path: Path) -> None:
    # Random token types 0..9 would index past the 2-row table: they are
    # drawn within each table the input indexes instead.
    model = onnx_bert(tmp_path / "bert.onnx")
    done = asyncrt_cli(
        "profile", str(model), "--shape", "input_ids=2x16", "--runs", "2",
        "--device", "cpu", "--csv", "--by", "op",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    ops = {row["op"]: row for row in rows}
    assert ops["Gather"]["nodes"] == "2"
    # the residual Add and its LayerNormalization are one fused node
    assert {"Gather", "AddLayerNormalization", "MatMul"} <= set(ops)
    # token_type_ids shares input_ids's symbols, so it is 2x16 too.
    done = asyncrt_cli(
        "run", str(model), "--shape", "input_ids=2x16", "--device", "cpu", "--json"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outputs"][0]["shape"] == [2, 16, 4]


def test_a_bert_attention_mask_gets_ones_not_overflowing_noise(tmp_path: Path) -> None:
    # attention_mask reaches no Gather: random 0..9 made (1 - mask) * min
    # overflow (a RuntimeWarning, then -inf scores and NaN rows).
    onnx = pytest.importorskip("onnx")
    from .frontend.symbolic_models import TINY, bert_encoder

    model = tmp_path / "bert.onnx"
    onnx.save(bert_encoder(TINY), str(model))
    done = asyncrt_cli(
        "run", str(model), "--shape", "input_ids=2x5", "--device", "cpu",
        "--output", str(tmp_path / "out"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr
    hidden = np.load(tmp_path / "out" / "output_0.npy")
    assert hidden.shape[:2] == (2, 5) and np.isfinite(hidden).all()


def test_integer_inputs_that_index_get_values_within_the_table(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    model = onnx_bert(tmp_path / "bert.onnx", dims=(4, 64))  # fixed shapes
    code, out, err = run_main(capsys, "profile", str(model), "--runs", "1",
                              "--device", "cpu")  # fmt: skip
    assert code == 0, err
    assert "Gather" in out and "conv." not in out


def test_inputs_from_an_npz_archive_and_their_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    model = onnx_bert(tmp_path / "bert.onnx")
    ids = np.arange(12, dtype=np.int64).reshape(2, 6)
    np.savez(tmp_path / "in.npz", input_ids=ids, token_type_ids=ids % 2)
    code, out, err = run_main(
        capsys, "run", str(model), "--input", str(tmp_path / "in.npz"),
        "--device", "cpu", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["outputs"][0]["shape"] == [2, 6, 4]
    assert "random data" not in err
    np.savez(tmp_path / "odd.npz", input_ids=ids, token_type_ids=ids[:, :3] % 2)
    code, _, err = run_main(capsys, "run", str(model), "--input",
                            str(tmp_path / "odd.npz"))  # fmt: skip
    assert code == 1 and "dimension 1 ('seq') is 3, but input_ids gives" in err
    np.savez(tmp_path / "bad.npz", nope=ids)
    code, _, err = run_main(capsys, "run", str(model), "--input",
                            str(tmp_path / "bad.npz"))  # fmt: skip
    assert code == 1 and "(array 'nope'): the model has no such input" in err
    for args, message in [
        (("--shape", "input_ids=2x"), "expected NAME=DIMS"),
        (("--shape", "nope=2"), "--shape nope: the model has no such input"),
        (("--shape", "input_ids=2x3x4"), "3 dimension(s) (2, 3, 4)"),
    ]:
        code, _, err = run_main(capsys, "run", str(model), *args)
        assert code == 1 and message in err, err


def test_shape_for_a_fixed_model_and_a_fixed_dimension(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run_main(capsys, "run", "--shape", "x=4x256")
    assert code == 1 and "the graph's input has the fixed shape (32, 256)" in err
    model = onnx_cnn(tmp_path / "cnn.onnx")
    code, _, err = run_main(capsys, "run", str(model), "--shape", "x=1x3x224x224")
    assert code == 1 and "dimension 2 as 224, but the model fixes it at 8" in err


# -- kernel modules, TVM graph files, version and help -------------------------------

TVM_GRAPHS = sorted((ROOT / "tests" / "data" / "tvm-graphs").glob("*.json"))


def test_plan_and_run_tvm_graph_files_with_an_imported_kernel_module() -> None:
    graph = (
        ROOT
        / "tests"
        / "data"
        / "tvm-graphs"
        / "neo-ai__neo-ai-dlr__4in2out_deploy.json"
    )
    done = asyncrt_cli("run", str(graph), "--json")
    assert done.returncode == 1 and "fuse_broadcast_add" in done.stderr
    assert "--import MODULE" in done.stderr
    done = asyncrt_cli("run", str(graph), "--import", "tests.tvm_graph_kernels",
                       "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [o["shape"] for o in json.loads(done.stdout)["outputs"]] == [[2], [3]]


@pytest.mark.parametrize("path", TVM_GRAPHS, ids=lambda p: p.name[:40])
def test_every_tvm_graph_file_plans(
    capsys: pytest.CaptureFixture[str], path: Path
) -> None:
    kernels = ROOT / "tests" / "tvm_graph_kernels.py"
    code, out, err = run_main(
        capsys, "plan", str(path), "--import", str(kernels), "--json"
    )
    assert code == 0, err
    assert sum(d["nodes"] for d in json.loads(out)["devices"]) > 0


def test_import_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run_main(capsys, "plan", "--import", "no_such_module_here")
    assert code == 1 and "--import no_such_module_here: No module named" in err
    broken = tmp_path / "broken_kernels.py"
    broken.write_text("raise RuntimeError('half-written')\n")
    code, _, err = run_main(capsys, "plan", "--import", str(broken))
    assert code == 1 and "raised RuntimeError: half-written" in err
    code, _, err = run_main(capsys, "plan", "--import", str(tmp_path / "none.py"))
    assert code == 1 and "no such file" in err


def test_version_and_help_with_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"asyncrt {asyncrt.__version__}"
    with pytest.raises(SystemExit):
        main(["profile", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "measured runs (default: 10)" in text
    assert "placement policy (default: auto)" in text
    assert "compute streams per device (default: 1)" in text


def _symbolic_batch(model: Any) -> Any:
    """The model with its inputs' and outputs' first dimension made the
    symbol ``batch``, as exporters write dynamic axes."""
    for value in (*model.graph.input, *model.graph.output):
        dim = value.type.tensor_type.shape.dim[0]
        dim.Clear()
        dim.dim_param = "batch"
    return model


@pytest.mark.parametrize("name", ["small_cnn", "encoder_block"])
def test_the_test_models_exported_with_a_symbolic_batch_run_and_profile(
    tmp_path: Path, name: str
) -> None:
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from .frontend import models

    proto = _symbolic_batch(getattr(models, name)())
    path = tmp_path / f"{name}.onnx"
    onnx.save(proto, str(path))
    (declared,) = proto.graph.input
    dims = [d.dim_value for d in declared.type.tensor_type.shape.dim[1:]]
    x = np.random.default_rng(4).standard_normal((3, *dims)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    done = asyncrt_cli(
        "run", str(path), "--input", f"{declared.name}={tmp_path / 'x.npy'}",
        "--output", str(tmp_path / "out"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = session.run(None, {declared.name: x})[0]
    np.testing.assert_allclose(
        np.load(tmp_path / "out" / "output_0.npy"), expected, rtol=1e-4, atol=1e-4
    )
    done = asyncrt_cli("profile", str(path), "--runs", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert "'batch' taken as 1" in done.stderr
    assert json.loads(done.stdout)["runs"] == 2


def test_bench_sweeps_shapes_on_one_executor(tmp_path: Path) -> None:
    model = onnx_bert(tmp_path / "bert.onnx")
    done = asyncrt_cli(
        "bench", str(model), "--device", "cpu", "--sweep", "batch=1,2",
        "--sweep", "seq=3,5", "--repeat", "1", "--number", "2", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [(s["batch"], s["seq"]) for s in report["shapes"]] == [
        (1, 3), (1, 5), (2, 3), (2, 5)
    ]  # fmt: skip
    cache = report["plan_cache"]
    assert cache["builds"] == 4 and cache["misses"] == 4 and cache["hits"] >= 8
    bad = asyncrt_cli("bench", str(model), "--device", "cpu", "--sweep", "batch=1")
    assert bad.returncode != 0 and "give sizes for: seq" in bad.stderr
