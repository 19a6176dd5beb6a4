"""`appliance trace fingerprint`: a trace made into the regression watch's baseline, read
back with `appliance.watch.baseline.parse`. A real run's rolling trace checks the rows
against the spans it holds; traces built here (the writer's shapes, appliance/profiling)
check the reservoir, the host probe, renames, stream filters and bad inputs."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from appliance.config import parse_config
from appliance.watch.baseline import Baseline, parse
from tests.support.appliance import DEMO_CLIP, person_model
from tests.support.tracecheck import run_to_rolling_trace
from tests.tools import Event, frame_events, run_cli, span, write_trace

FRAMES = 30
PROBE_US = [400 + 7 * k for k in range(25)]  # the host probe's spans


def fingerprint(
    trace: Path, out: Path, capsys: pytest.CaptureFixture[str], *flags: str
) -> tuple[dict[str, Baseline], str, str]:
    """Run `trace fingerprint` (it must succeed): the baselines written, stdout, stderr."""
    code, stdout, stderr = run_cli(
        ["trace", "fingerprint", str(trace), "-o", str(out), *flags], capsys
    )
    assert code == 0, stderr
    return parse(json.loads(out.read_text()), str(out)), stdout, stderr


def spans_by_row(trace: Path) -> dict[str, list[int]]:
    """The trace's durations per row key, read here from the documented span shapes."""
    rows: dict[str, list[int]] = defaultdict(list)
    for e in json.loads(trace.read_text())["traceEvents"]:
        args = e.get("args", {})
        if e["ph"] != "X":
            continue
        if e["cat"] == "block":
            rows[f"{args['stream']}/{e['name']}"].append(round(e["dur"]))
        elif e["name"] == "session.run" and args.get("ok", True) and not args.get("ort_profiled"):
            rows[f"model:{args['model']}"].append(round(e["dur"]))
        elif e["name"] == "queue.wait":
            rows[f"queue:{args['model']}"].append(round(e["dur"]))
        elif e["name"] == "workflow.run":
            rows[f"frame:{args['stream']}"].append(round(e["dur"]))
            rows[f"age:{args['stream']}"].append(round(args["age_ms"] * 1000))
    return rows


def values(b: Baseline) -> list[int]:
    return [int(v) for v in b.samples]


@pytest.fixture(scope="module")
def rolling(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rolling trace of a real run: stream cam, detect (person model) then annotate."""
    folder = tmp_path_factory.mktemp("run")
    doc = {
        # No watch, so no host.probe span (its first tick comes one interval_s, 30 s, after
        # the start: a run that long on a loaded machine had one). The probe's rows are
        # tested on the traces built below.
        "profiling": {"dir": "traces", "rotate_s": 600, "watch": {"enabled": False}},
        "models": {"person": person_model()},
        "streams": [
            {
                "id": "cam",
                "source": {"url": str(DEMO_CLIP), "pace": "fast"},
                "draw": "always",  # the drawing's row too
                "workflow": {
                    "name": "people",
                    "blocks": [
                        {"id": "people", "type": "detect", "model": "person"},
                        {"id": "drawn", "type": "annotate", "detections": "people"},
                    ],
                    "outputs": {"video": "drawn"},
                },
            }
        ],
    }
    return run_to_rolling_trace(parse_config(doc, folder), FRAMES, 60)


def camera(stream: str, frames: int, tid: int = 1, seed: int = 1) -> list[Event]:
    """`frames` frames of `stream` (detect ≈ 8 ms, draw ≈ 0.5 ms, ages 20..60 ms) and
    their batches of model person: a run and a queue wait per frame."""
    rng = np.random.default_rng(seed)
    blocks = {
        "detect": rng.integers(7000, 9000, frames).tolist(),
        "draw": rng.integers(400, 600, frames).tolist(),
    }
    events = frame_events(stream, "people", blocks, tid=tid)
    ages = rng.uniform(20, 60, frames).round(3)
    for run, age in zip((e for e in events if e["name"] == "workflow.run"), ages, strict=True):
        run["args"]["age_ms"] = float(age)
    for i in range(frames):
        ts = i * 10_000
        run = span("model", "session.run", ts, 6000 + 10 * i, model="person", batch_size=1)
        run["args"] |= {"streams": [stream], "ok": True}
        events.append(run)
        events.append(span("queue", "queue.wait", ts - 50, 50 + i, model="person", stream=stream))
    return events


def probes() -> list[Event]:
    """The watch's probe spans: without `host_us`, their duration is the sample."""
    return [
        span("watch", "host.probe", 1000 * k, dur, wait_ratio=1 + k / 100)
        for k, dur in enumerate(PROBE_US)
    ]


# -- a real trace ---------------------------------------------------------------------------
def test_a_real_rolling_trace_becomes_its_rows(
    rolling: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ci" / "baseline.json"
    rows, stdout, stderr = fingerprint(rolling, out, capsys)
    expected = spans_by_row(rolling)
    keys = {"cam/people", "cam/drawn", "model:person", "queue:person", "frame:cam", "age:cam"}
    assert set(rows) == set(expected) == keys
    for key, b in rows.items():
        assert values(b) == sorted(expected[key]), key  # every span, none left out
        assert b.probe.size == 0  # no host.probe spans in this trace
        assert b.learned_at == pytest.approx(os.stat(rolling).st_mtime, abs=1e-3)
        assert b.source == f"fingerprint:{rolling.name}"
    for key in ("cam/people", "cam/drawn", "frame:cam", "age:cam", "queue:person"):
        assert len(rows[key].samples) == FRAMES
    assert (rows["cam/people"].kind, rows["age:cam"].kind) == ("block", "frame age")
    table = {tuple(line.split()[:2]): line.split()[2:] for line in stdout.splitlines()}
    people = table[("block", "cam/people")]
    assert people == [str(FRAMES), str(FRAMES), f"{np.median(expected['cam/people']) / 1000:.3f}"]
    assert table[("frame", "cam")][2] == f"{np.median(expected['frame:cam']) / 1000:.3f}"
    assert "host probe: none in the trace" in stdout
    assert f"wrote 6 rows to {out}" in stdout and stderr == ""


def test_a_gzipped_trace_gives_the_same_rows(
    rolling: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(rolling.read_text())
    gz = write_trace(tmp_path / "trace.json.gz", doc["traceEvents"], gz=True)
    plain, _, _ = fingerprint(rolling, tmp_path / "a.json", capsys)
    packed, _, _ = fingerprint(gz, tmp_path / "b.json", capsys)
    assert {k: values(b) for k, b in packed.items()} == {k: values(b) for k, b in plain.items()}


# -- traces built here ------------------------------------------------------------------------
def test_the_reservoir_caps_every_row_and_the_probe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "t.json", camera("cam", 60) + probes())
    expected = spans_by_row(trace)
    rows, stdout, _ = fingerprint(trace, tmp_path / "a.json", capsys, "--reservoir", "20")
    assert set(rows) == set(expected)
    for key, b in rows.items():
        assert len(b.samples) == 20 and len(set(values(b))) > 1
        kept = values(b)
        assert all(kept.count(v) <= expected[key].count(v) for v in kept)  # a sample of them
        assert len(b.probe) == 20 and set(b.probe.tolist()) <= set(PROBE_US)
    assert "block      cam/detect" in stdout and " 60       20 " in stdout
    again, _, _ = fingerprint(trace, tmp_path / "b.json", capsys, "--reservoir", "20")
    assert {k: values(b) for k, b in again.items()} == {k: values(b) for k, b in rows.items()}
    whole, _, _ = fingerprint(trace, tmp_path / "c.json", capsys)  # 1000 by default
    assert {k: values(b) for k, b in whole.items()} == {k: sorted(v) for k, v in expected.items()}


def test_the_host_probe_is_every_rows_probe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = span("other", "host.probe", 0, 99_999)  # not the watch's probe
    trace = write_trace(tmp_path / "t.json", camera("cam", 12) + probes() + [other])
    rows, stdout, _ = fingerprint(trace, tmp_path / "a.json", capsys)
    assert rows and all(b.probe.tolist() == PROBE_US for b in rows.values())
    waits = [1000 + 10 * k for k in range(len(PROBE_US))]  # each wait_ratio, in ‰
    assert all(b.contention.tolist() == waits for b in rows.values())
    assert f"host probe: {len(PROBE_US)} samples, median {np.median(PROBE_US) / 1000:.3f}" in stdout


def test_the_probe_models_cpu_time_is_kept_beside_its_host_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The watch's spans of a run on a machine half taken by another tenant: host_us is
    # the model's CPU µs over the half left to us, which the baseline keeps apart.
    onnx = [
        span("watch", "host.probe", 1000 * k, 2 * us, host_us=2 * us, measure="onnx",
             onnx_cpu_us=us, loop_cpu_us=us + 5, wait_ratio=1.1)
        for k, us in enumerate(PROBE_US)
    ]  # fmt: skip
    trace = write_trace(tmp_path / "t.json", camera("cam", 12) + onnx)
    rows, _, _ = fingerprint(trace, tmp_path / "a.json", capsys)
    for b in rows.values():
        assert b.probe_measure == "onnx"
        assert b.probe.tolist() == [2 * us for us in PROBE_US]
        assert b.probe_cpu.tolist() == PROBE_US
    # Spans from before the CPU µs were written: none kept (the host µs stand in).
    trace = write_trace(tmp_path / "old.json", camera("cam", 12) + probes())
    rows, _, _ = fingerprint(trace, tmp_path / "b.json", capsys)
    assert all(b.probe.size and not b.probe_cpu.size for b in rows.values())


def test_failed_and_profiled_runs_are_not_a_models_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = camera("cam", 12)
    failed = span("model", "session.run", 0, 90_000, model="person", ok=False)
    profiled = span("model", "session.run", 0, 80_000, model="person", ok=True, ort_profiled=True)
    unnamed = span("model", "session.run", 0, 70_000)  # no model arg: another tool's span
    trace = write_trace(tmp_path / "t.json", [*events, failed, profiled, unnamed])
    rows, _, _ = fingerprint(trace, tmp_path / "a.json", capsys)
    assert values(rows["model:person"]) == [6000 + 10 * i for i in range(12)]


def test_rows_of_too_few_spans_are_left_out_and_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "t.json", camera("cam", 12) + camera("door", 9, tid=2))
    rows, stdout, stderr = fingerprint(trace, tmp_path / "a.json", capsys)
    assert {"cam/detect", "frame:cam", "model:person"} <= set(rows)
    assert not any("door" in key for key in rows)
    assert "door" not in stdout
    assert stderr.startswith("left out (fewer than 10 spans): ")
    assert "block door/detect (9 spans)" in stderr and "frame door (9 spans)" in stderr
    assert len(rows["model:person"].samples) == 21  # both streams' batches


def test_renames_and_stream_filters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = camera("ci-cam", 12) + camera("ci-lobby", 12, tid=2, seed=2)
    trace = write_trace(tmp_path / "t.json", events)
    expected = spans_by_row(trace)
    renamed, stdout, _ = fingerprint(
        trace, tmp_path / "a.json", capsys, "--rename", "ci-cam=cam1", "--rename", "ci-lobby=lobby"
    )
    assert set(renamed) == {
        *(f"{s}/{b}" for s in ("cam1", "lobby") for b in ("detect", "draw")),
        *(f"{k}:{s}" for k in ("frame", "age") for s in ("cam1", "lobby")),
        "model:person",
        "queue:person",
    }
    assert values(renamed["cam1/detect"]) == sorted(expected["ci-cam/detect"])
    assert values(renamed["age:lobby"]) == sorted(expected["age:ci-lobby"])
    assert (renamed["cam1/detect"].name, renamed["frame:cam1"].name) == ("cam1/detect", "cam1")
    assert "ci-cam" not in stdout
    one, _, _ = fingerprint(
        trace, tmp_path / "b.json", capsys, "--stream", "ci-cam", "--rename", "ci-cam=cam1"
    )
    assert set(one) == {"cam1/detect", "cam1/draw", "frame:cam1", "age:cam1", "model:person",
                        "queue:person"}  # fmt: skip
    assert len(one["model:person"].samples) == len(one["queue:person"].samples) == 24


def bad(argv: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run `trace fingerprint` that must fail: exit 1, one `error:` line, nothing written."""
    code, stdout, stderr = run_cli(["trace", "fingerprint", *argv, "-o", str(out)], capsys)
    assert (code, stdout, out.exists()) == (1, "", False)
    assert stderr.startswith("error: ") and stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr
    return stderr


def test_bad_inputs_exit_1_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "baseline.json"
    missing = tmp_path / "missing.json"
    assert f"{missing}: cannot read" in bad([str(missing)], out, capsys)
    text = tmp_path / "notes.json"
    text.write_text("not json")
    assert f"{text}: not JSON" in bad([str(text)], out, capsys)
    fake_gz = tmp_path / "trace.json.gz"
    fake_gz.write_text("{}")
    assert f"{fake_gz}: named .gz but not gzip" in bad([str(fake_gz)], out, capsys)
    empty = write_trace(tmp_path / "empty.json", [span("grab", "grab", 0, 5, stream="cam")])
    err = bad([str(empty)], out, capsys)
    assert f"{empty}: no row of 10 spans or more: no block, model, queue or frame spans" in err
    few = write_trace(tmp_path / "few.json", camera("cam", 9))
    err = bad([str(few)], out, capsys)
    assert f"{few}: no row of 10 spans or more: " in err and "frame cam (9 spans)" in err
    broken = camera("cam", 12)
    broken[0]["dur"] = -5  # a workflow.run that ended before it began
    trace = write_trace(tmp_path / "broken.json", broken)
    assert f"{trace}: frame cam: a duration outside 0" in bad([str(trace)], out, capsys)


def test_options_that_do_not_fit_the_trace_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "baseline.json"
    trace = write_trace(tmp_path / "t.json", camera("cam", 12) + camera("lobby", 12, tid=2))
    err = bad([str(trace), "--stream", "cam1"], out, capsys)
    assert f"{trace}: no stream cam1 in the trace (it has cam, lobby;" in err
    err = bad([str(trace), "--rename", "door=front"], out, capsys)
    assert "no stream door in the trace" in err
    err = bad([str(trace), "--rename", "cam=lobby"], out, capsys)
    assert f"{trace}: streams cam and lobby would both be lobby" in err
    err = bad([str(trace), "--rename", "cam=a", "--rename", "cam=b"], out, capsys)
    assert "--rename: a stream renamed twice" in err
    # ... but a stream filtered out may take a name the trace had
    rows, _, _ = fingerprint(trace, out, capsys, "--stream", "cam", "--rename", "cam=lobby")
    assert {"lobby/detect", "frame:lobby"} <= set(rows) and "cam/detect" not in rows
    for usage in (["--reservoir", "5"], ["--rename", "cam"], ["--rename", "cam=a/b"]):
        with pytest.raises(SystemExit) as info:
            run_cli(["trace", "fingerprint", str(trace), "-o", str(out), *usage], capsys)
        assert info.value.code == 2


def test_an_unwritable_output_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "t.json", camera("cam", 12))
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = blocker / "baseline.json"  # under a file: no such folder can be made
    code, _, stderr = run_cli(["trace", "fingerprint", str(trace), "-o", str(out)], capsys)
    assert code == 1 and stderr.startswith(f"error: {blocker}") and "Traceback" not in stderr
