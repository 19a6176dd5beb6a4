"""`appliance model bench`: real bundled models on the CPU, through the function and the CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from appliance.models.errors import ModelLoadError
from appliance.tools import model_bench
from appliance.tools.model_bench import BenchError, BenchResult, bench_model, default_shape
from appliance.tools.model_cli import add_model_commands
from pipelines.models import ModelInfo, TensorInfo
from tests.support.models import MODELS, tiny_model

SLACK_US = 1  # ORT's µs timestamps are rounded independently
QUICK = ["--duration", "0.2", "--warmup", "1", "--provider", "cpu"]
# Each shipped model benchmarked without --shape: the shape chosen, and the words saying why.
SHIPPED = {
    "centerface.onnx": ("[1, 3, 480, 640]", "a 640x480 frame, which the centerface decoder"),
    "person_ssdlite.onnx": ("[1, 300, 300, 3]", "the tf_od decoder's default size, 300x300"),
    "ppocr_v4_det.onnx": ("[1, 3, 544, 960]", "a 960x540 frame as the dbnet decoder sizes it"),
    "ppocr_v4_rec.onnx": ("[1, 3, 48, 320]", "the ocr block's recogniser size, 320x48"),
}


def run_cli(argv: list[str]) -> int:
    """`appliance <argv>` on a parser holding only the model commands."""
    parser = argparse.ArgumentParser(prog="appliance")
    add_model_commands(parser.add_subparsers(required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def quick(path: Path, **kwargs: Any) -> BenchResult:
    """A short CPU benchmark: 2 warm-up runs, about 0.5 s measured."""
    options: dict[str, Any] = {"duration_s": 0.5, "warmup": 2, "provider": "cpu"}
    return bench_model(path, **(options | kwargs))


def test_person_ssdlite_batch_two(person_model_path: Path) -> None:
    result = quick(person_model_path, batch=2, shape=(300, 300, 3), duration_s=0.4)
    assert result.shape == (2, 300, 300, 3)
    assert result.dtype == "uint8"
    assert result.runs > 0
    assert 0 < result.p50_ms <= result.p90_ms <= result.p99_ms
    assert result.samples_per_s == pytest.approx(2 * result.runs_per_s)
    assert result.providers == ("CPUExecutionProvider",)


def test_full_shape_gives_the_batch(person_model_path: Path) -> None:
    assert quick(person_model_path, shape=(3, 96, 96, 3)).shape == (3, 96, 96, 3)


def test_centerface_shape_without_batch(centerface_model_path: Path) -> None:
    result = quick(centerface_model_path, shape=(3, 320, 320))
    assert result.shape == (1, 3, 320, 320)
    assert result.dtype == "float32"


@pytest.fixture
def dynamic_model_path(tmp_path: Path) -> Path:
    """y = relu(x), x float32 [n, 3, h, w]: no decoder or block takes it."""
    path = tmp_path / "relu_dynamic.onnx"
    path.write_bytes(tiny_model("Relu", ["x"], {"x": ["n", 3, "h", "w"]}, ["n", 3, "h", "w"]))
    return path


def test_unknown_dims_need_a_shape(dynamic_model_path: Path) -> None:
    with pytest.raises(BenchError, match=r"'x'.*unknown dims \[h, w\] and no decoder"):
        quick(dynamic_model_path)


def test_declared_shape_is_used(doubling_model_path: Path) -> None:
    result = quick(doubling_model_path, duration_s=0.1)
    assert result.shape == (2, 3)
    assert result.shape_source == "the model's declared input"


def test_decoder_default_size(person_model_path: Path) -> None:
    result = quick(person_model_path, duration_s=0.1)
    assert result.shape == (1, 300, 300, 3)
    assert result.shape_source.startswith("the model leaves H, W unknown: the tf_od decoder")


def test_given_shape_is_named(centerface_model_path: Path) -> None:
    assert quick(centerface_model_path, shape=(3, 64, 64)).shape_source == "--shape"


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_cli_shipped_model_without_shape(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["model", "bench", str(MODELS / name), *QUICK]) == 0
    shape, why = SHIPPED[name]
    captured = capsys.readouterr()
    assert shape in captured.out
    assert f"shape from  the model leaves H, W unknown: {why}" in captured.out
    assert "bench: input " in captured.err and shape in captured.err


def test_every_shipped_model_is_covered() -> None:
    assert sorted(p.name for p in MODELS.glob("*.onnx")) == sorted(SHIPPED)


def test_progress_lines(
    person_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A line after every run: with one every 0.05 s of a 0.2 s bench, a loaded machine
    # could finish the bench before a run began past the first 0.05 s, with no line.
    monkeypatch.setattr(model_bench, "PROGRESS_EVERY_S", 0.0)
    lines: list[str] = []
    trace_file = tmp_path / "trace.json"
    quick(
        person_model_path,
        shape=(96, 96, 3),
        profile_path=trace_file,
        progress=lines.append,
        duration_s=0.2,
    )
    assert lines[0].startswith("input image_tensor:0 uint8 [1, 96, 96, 3]: --shape")
    assert any(line.endswith(" ms") and " runs, p50 " in line for line in lines)
    assert lines[-1].startswith("profile: ") and " MB written in " in lines[-1]
    assert json.loads(trace_file.read_text())["otherData"]["graph_optimization"] == "all"


def test_shape_against_fixed_dims(centerface_model_path: Path) -> None:
    with pytest.raises(BenchError, match="dim 1 is 3, --shape gives 4"):
        quick(centerface_model_path, shape=(4, 64, 64))


def test_fixed_batch_rejects_another(yolov8_fixed_batch_model: Path) -> None:
    with pytest.raises(BenchError, match="fixed batch of 1: batch 2 is not possible"):
        quick(yolov8_fixed_batch_model, batch=2)


def test_profile_nests_operators_in_runs(person_model_path: Path, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.json"
    # 0.1 s: hundreds of runs, each of its operators checked against every run's span.
    result = quick(person_model_path, shape=(1, 96, 96, 3), profile_path=trace_file, duration_s=0.1)
    trace = json.loads(trace_file.read_text())
    events = trace["traceEvents"]
    spans = [e for e in events if e["name"] == "session.run"]
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(spans) == result.runs  # warm-up runs are left out
    assert all(s["cat"] == "model" and s["args"]["batch_size"] == 1 for s in spans)
    assert nodes and all(n["name"].endswith("_kernel_time") for n in nodes)
    assert all(n["args"]["op_name"] and n["args"]["provider"] for n in nodes)
    for node in nodes:
        assert any(
            s["ts"] - SLACK_US <= node["ts"]
            and node["ts"] + node["dur"] <= s["ts"] + s["dur"] + SLACK_US
            for s in spans
        ), node["name"]
    assert trace["otherData"]["providers"] == ["CPUExecutionProvider"]
    assert trace["displayTimeUnit"] == "ms"
    assert not list(Path.cwd().glob("onnxruntime_profile_*.json"))


def test_cli_json(centerface_model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["model", "bench", str(centerface_model_path), "--shape", "3x64x64", "--json"]
    code = run_cli([*argv, "--duration", "0.3", "--warmup", "1", "--provider", "cpu"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["shape"] == [1, 3, 64, 64]
    assert report["runs"] > 0


def test_cli_text(person_model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["model", "bench", str(person_model_path), "--shape", "1,96,96,3", "--batch", "1"]
    assert run_cli([*argv, "--duration", "0.3", "--warmup", "1", "--provider", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "[1, 96, 96, 3]" in out
    assert "samples/s" in out


def test_cli_unknown_dims(dynamic_model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["model", "bench", str(dynamic_model_path), "--provider", "cpu"]) == 2
    assert "unknown dims" in capsys.readouterr().err


def test_cli_not_onnx(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bogus = tmp_path / "notes.onnx"
    bogus.write_text("not a model")
    assert run_cli(["model", "bench", str(bogus), "--provider", "cpu"]) == 1
    assert str(bogus) in capsys.readouterr().err


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="file not found"):
        quick(tmp_path / "absent.onnx")


def test_bad_shape_is_a_usage_error(person_model_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_cli(["model", "bench", str(person_model_path), "--shape", "300xHx3"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("head", [("batch", 84, "anchors"), ("batch", "anchors", 85)])
def test_dynamic_yolo_gets_640(head: tuple[int | str, ...]) -> None:
    """A `yolo export dynamic=True` model: v8/v11 head [N, 84, A] or v5 head [N, A, 85]."""
    image = TensorInfo("images", ("batch", 3, "height", "width"), "float32")
    info = ModelInfo("y", "y.onnx", (image,), (TensorInfo("output0", head, "float32"),), "")
    dims, why = default_shape(info)
    assert dims == (3, 640, 640)
    assert "the yolo decoder's default size, 640x640" in why
