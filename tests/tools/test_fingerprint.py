"""The fingerprint of built traces (exact numbers) and of a real ONNX Runtime profile."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from appliance.tools.fingerprint import fingerprint, fingerprint_file, percentile
from appliance.tools.trace_file import TraceFormatError, load_events
from tests.tools import node, sample_events, span, two_workflow_events, write_trace

MODEL = Path(__file__).resolve().parents[2] / "configs" / "models" / "person_ssdlite.onnx"
CUDA_FIRST = {"requested_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}


@pytest.fixture(scope="module")
def ort_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real profile: person_ssdlite run three times on CPU with profiling on."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path_factory.mktemp("ort") / "ssdlite")
    session = ort.InferenceSession(str(MODEL), options, providers=["CPUExecutionProvider"])
    image = np.random.default_rng(0).integers(0, 256, (1, 300, 300, 3), dtype=np.uint8)
    for _ in range(3):
        session.run(None, {"image_tensor:0": image})
    return Path(session.end_profiling())


def test_percentile_is_nearest_rank() -> None:
    assert percentile([4, 1, 3, 2], 50) == 2
    assert percentile([4, 1, 3, 2], 99) == 4
    assert percentile([7], 1) == 7


def test_blocks_models_ages_and_batches(tmp_path: Path) -> None:
    fp = fingerprint_file(write_trace(tmp_path / "t.json", sample_events()))
    assert fp["total_ms"] == 36.0
    assert fp["blocks"]["s/detect"] == {
        "stream": "s",
        "workflow": None,  # the trace has no workflow.run of stream s
        "block": "detect",
        "count": 4,
        "total_ms": 10.0,
        "mean_ms": 2.5,
        "p50_ms": 2.0,
        "p99_ms": 4.0,
        "share": 71.43,
        "frame_share": None,
    }
    assert fp["blocks"]["s/draw"]["share"] == 28.57
    assert fp["models"] == {"ssd": {"runs": 2, "total_ms": 8.0, "mean_ms": 4.0, "mean_batch": 2.0}}
    assert fp["batch_sizes"] == {"1": 1, "3": 1}
    assert fp["frame_age_ms"] == {"p50": 50.0, "p90": 90.0, "p99": 100.0}


def test_ops_nodes_and_providers() -> None:
    fp = fingerprint(sample_events())
    assert list(fp["ops"]) == ["Conv", "Relu", "MemcpyToHost"]  # by total time
    assert fp["ops"]["Conv"] == {"total_us": 600, "count": 2, "share": 60.0}
    assert fp["nodes"]["ssd/conv1"] == {
        "model": "ssd",
        "op": "Conv",
        "total_us": 400,
        "count": 1,
        "share": 40.0,
    }
    assert fp["providers"] == {
        "Conv": ["CPUExecutionProvider"],
        "MemcpyToHost": ["CUDAExecutionProvider"],
        "Relu": ["CUDAExecutionProvider"],
    }


def test_hints_name_the_hot_spots() -> None:
    hints = fingerprint(sample_events(), CUDA_FIRST)["hints"]
    assert hints == [
        "op type Conv takes 60.0 % of operator time: the hot spot to optimise",
        "Memcpy nodes take 20.0 % of operator time: the graph is partitioned between "
        "providers; keep it on one provider",
        "model ssd: CUDAExecutionProvider requested but ops ran on CPUExecutionProvider: Conv",
        "block detect takes 71.4 % of the block time of stream s: its hot spot",
    ]


def test_no_fallback_hint_when_cpu_was_asked_for() -> None:
    hints = fingerprint(sample_events(), {"requested_providers": ["CPUExecutionProvider"]})
    assert not any("requested" in h for h in hints["hints"])


@pytest.mark.parametrize(("ops", "hinted"), [(250, True), (150, False)])
def test_many_tiny_operators(ops: int, hinted: bool) -> None:
    events = [span("model", "session.run", 0, 2000, model="m", batch_size=1)]
    events += [node(f"n{i}", f"Op{i % 5}", 5) for i in range(ops)]
    hints = fingerprint(events)["hints"]
    tiny = f"many tiny operators: {ops} ops per run, median 5 µs"
    assert any(h.startswith(tiny) for h in hints) is hinted


def test_gzip_trace_reads_the_same(tmp_path: Path) -> None:
    plain = fingerprint_file(write_trace(tmp_path / "t.json", sample_events()))
    packed = write_trace(tmp_path / "t.trace", sample_events(), gz=True)  # magic, not the name
    assert fingerprint_file(packed) == plain


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("a.json", b"{not json", "not JSON"),
        ("b.json.gz", b'{"traceEvents": []}', "not gzip"),
        ("c.json", gzip.compress(b"{}", mtime=0)[:12], "not a valid gzip file"),
        ("d.json", b'{"events": []}', "no traceEvents"),
        ("e.json", b"42", "no traceEvents"),
        ("f.json", b'{"traceEvents": [{"name": "x", "ts": 1}]}', "event #0 has no ph"),
        ("g.json", b'[{"ph": "M", "name": "m"}, {"ph": "X", "name": "x", "dur": 1}]', "#1"),
        ("h.json", b'{"traceEvents": [{"ph": "X", "name": "x", "ts": 1}]}', "has no dur"),
    ],
)
def test_bad_files_are_named_with_the_problem(
    tmp_path: Path, name: str, content: bytes, problem: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=problem) as info:
        load_events(path)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="cannot read"):
        load_events(tmp_path / "nope.json")


def test_real_onnxruntime_profile(ort_profile: Path) -> None:
    fp = fingerprint_file(ort_profile)
    raw = json.loads(ort_profile.read_text())
    per_op: Counter[str] = Counter()
    for e in raw:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] += e["dur"]
    top_op, top_us = per_op.most_common(1)[0]
    assert set(fp["ops"]) == set(per_op) and per_op
    assert next(iter(fp["ops"])) == top_op
    assert fp["ops"][top_op]["share"] == pytest.approx(100 * top_us / per_op.total(), abs=0.01)
    assert sum(s["share"] for s in fp["ops"].values()) == pytest.approx(100, abs=0.5)
    assert set(fp["providers"][top_op]) == {"CPUExecutionProvider"}
    assert sum(n["count"] for n in fp["nodes"].values()) == sum(
        s["count"] for s in fp["ops"].values()
    )


def test_blocks_are_rows_per_stream_hottest_first() -> None:
    blocks = fingerprint(two_workflow_events())["blocks"]
    assert list(blocks) == [
        "cam/detect",
        "lobby/detect",
        "door/faces",
        "door/drawn",
        "cam/drawn",
        "lobby/drawn",
    ]
    cam = blocks["cam/detect"]
    assert (cam["stream"], cam["workflow"], cam["block"], cam["count"]) == (
        "cam",
        "people",
        "detect",
        3,
    )
    assert cam["share"] == 38.1  # 24 of 63 ms of block time
    assert cam["frame_share"] == 88.79  # 24 of cam's 27.03 ms of workflow.run
    # One block id in two workflows stays two rows, each counting its own stream's runs.
    assert blocks["door/drawn"]["count"] == blocks["cam/drawn"]["count"] == 3


def test_one_hot_spot_per_workflow() -> None:
    hints = fingerprint(two_workflow_events())["hints"]
    assert hints == [
        "block detect takes 87.5 % of the block time of workflow people (streams cam, lobby): "
        "its hot spot",
        "block faces takes 60.0 % of the block time of workflow privacy (streams door): "
        "its hot spot",
    ]


def test_models_hottest_first() -> None:
    events = [span("model", "session.run", 0, 1000, model="small", batch_size=1)]
    events += [span("model", "session.run", 0, 3000, model="big", batch_size=2)]
    assert list(fingerprint(events)["models"]) == ["big", "small"]
