"""`appliance trace summarize|diff` through a parser built with `add_trace_commands`, on
traces built here (exact numbers); tests/tools/test_trace_diff.py diffs real runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from appliance.tools.trace_cli import EXIT_BAD_INPUT, EXIT_REGRESSION
from tests.tools import (
    Event,
    frame_events,
    run_cli,
    sample_events,
    span,
    two_workflow_events,
    write_trace,
)


def camera(
    path: Path, *, frames: int = 60, detect: float = 1.0, draw: float = 1.0, seed: int = 1
) -> Path:
    """A trace of stream cam: detect ≈ 24 ms and draw ≈ 0.5 ms a frame (lognormal, σ
    0.1, seeded), each scaled by its factor."""
    rng = np.random.default_rng(seed)
    durs = rng.lognormal(0, 0.1, (2, frames)) * [[24_000 * detect], [500 * draw]]
    blocks = {"detect": durs[0].round().tolist(), "draw": durs[1].round().tolist()}
    return write_trace(path, frame_events("cam", "people", blocks))


def diff(before: Path, after: Path, *flags: str) -> list[str]:
    return ["trace", "diff", str(before), str(after), *flags]


@pytest.fixture
def before(tmp_path: Path) -> Path:
    return camera(tmp_path / "before.json")


def test_summarize_prints_tables_and_hints(
    before: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = write_trace(tmp_path / "sample.json", sample_events())
    code, out, _ = run_cli(["trace", "summarize", str(sample), "--top", "2"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert any(line.split()[:3] == ["s/detect", "4", "10.00"] for line in lines)
    assert any(line.split() == ["ssd", "2", "8.00", "4.00", "2.00"] for line in lines)
    assert "  ... 1 more" in lines  # three op types, top 2
    assert "frame age ms: p50 50.0, p90 90.0, p99 100.0" in lines
    assert "  - block detect takes 71.4 % of the block time of stream s: its hot spot" in lines


def test_summarize_top_applies_to_every_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = [*two_workflow_events(), *sample_events()[1:]]
    events.append(span("model", "session.run", 0, 100, model="tiny", batch_size=1))
    path = write_trace(tmp_path / "t.json", events)
    _, out, _ = run_cli(["trace", "summarize", str(path), "--top", "1"], capsys)
    tables = {s.split()[0]: s.splitlines() for s in out.split("\n\n")[1:5]}
    assert tables["blocks"][1].split()[0] == "cam/detect"  # the hottest of 8 (2 streams)
    assert tables["models"][1].split()[0] == "ssd"  # 8 ms before tiny's 0.1
    assert [t[-1] for t in tables.values()] == [
        "  ... 7 more",
        "  ... 1 more",
        "  ... 2 more",
        "  ... 3 more",
    ]
    hints = out.split("hints:")[1].splitlines()
    assert [h.split(" takes ")[0] for h in hints if "hot spot" in h and "block" in h] == [
        "  - block detect",
        "  - block detect",
        "  - block faces",
    ]  # one per workflow (people, privacy) and for stream s, whose workflow is unknown


def test_summarize_json_is_the_fingerprint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_trace(tmp_path / "t.json", sample_events())
    code, out, _ = run_cli(["trace", "summarize", str(path), "--json"], capsys)
    assert code == 0
    assert json.loads(out)["blocks"]["s/detect"]["p99_ms"] == 4.0


def test_bad_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("<html>")
    code, out, err = run_cli(["trace", "summarize", str(bad)], capsys)
    assert (code, out) == (EXIT_BAD_INPUT, "")
    assert err.startswith(f"error: {bad}: not JSON")


def test_diff_of_a_trace_with_itself(before: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(diff(before, before, "--fail-over", "5"), capsys)
    assert code == 0
    assert [line.split()[-1] for line in out.splitlines()[1:]] == ["ok"] * 4
    report = json.loads(run_cli([*diff(before, before), "--json"], capsys)[1])
    rows = [(r["kind"], r["name"], r["effect_ms"], r["p_value"]) for r in report["rows"]]
    assert rows == [
        ("block", "cam/detect", 0.0, 1.0),
        ("block", "cam/draw", 0.0, 1.0),
        ("frame", "cam", 0.0, 1.0),
        ("frame age", "cam", 0.0, 1.0),
    ]
    assert report["regressions"] == report["not_flagged"] == []


def test_a_slower_block_is_a_regression_with_its_evidence(
    before: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    after = camera(tmp_path / "after.json", detect=1.2, seed=2)
    assert run_cli(diff(before, after), capsys)[0] == 0  # no gate, no failure
    code, out, _ = run_cli(diff(before, after, "--fail-over", "10"), capsys)
    assert code == EXIT_REGRESSION != 2  # 2 is argparse's usage error
    line = next(li for li in out.splitlines() if li.startswith("regression: block cam/detect"))
    assert " ms (99 % CI +" in line and "(Mann-Whitney U)" in line
    assert "% of the frame: +" in line
    effect = float(line.split("ms, ")[1].split(" ms")[0])
    assert 4.0 < effect < 5.6  # 20 % of 24 ms, within this sample's noise
    assert run_cli(diff(before, after, "--fail-over", "30"), capsys)[0] == 0  # +20 % < 30


def test_a_wobble_of_a_small_block_is_not_a_regression(
    before: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: a block of 2 % of the frame 0.05 ms (+10.8 %) slower."""
    after = camera(tmp_path / "after.json", draw=1.108)
    code, out, _ = run_cli(diff(before, after, "--fail-over", "10"), capsys)
    assert code == 0
    line = next(li for li in out.splitlines() if li.startswith("not flagged: block cam/draw"))
    assert line.endswith(": immaterial")
    assert "2.0 % of the frame: +0.2" in line
    # It is significant all the same: the gate spared it for being small, not for noise.
    report = json.loads(run_cli([*diff(before, after, "--fail-over", "10"), "--json"], capsys)[1])
    row = next(r for r in report["rows"] if r["name"] == "cam/draw")
    assert row["p_value"] < 0.01 and row["verdict"] == "immaterial"


def test_a_noisy_shift_is_not_significant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """20 frames a side, spread ±60 %, the second 15 % slower: +33 % measured, p 0.23."""
    rng = np.random.default_rng(2)
    noisy = rng.lognormal(0, 0.6, (2, 20)) * [[24_000], [24_000 * 1.15]]
    a = write_trace(tmp_path / "a.json", frame_events("cam", "p", {"detect": list(noisy[0])}))
    b = write_trace(tmp_path / "b.json", frame_events("cam", "p", {"detect": list(noisy[1])}))
    code, out, _ = run_cli(diff(a, b, "--fail-over", "5"), capsys)
    assert code == 0
    spared = [li for li in out.splitlines() if li.startswith("not flagged: block cam/detect")]
    assert spared and spared[0].endswith(": not significant")


def test_too_few_spans_are_never_a_regression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = camera(tmp_path / "a.json", frames=5)
    b = camera(tmp_path / "b.json", frames=5, detect=2.0)
    code, out, _ = run_cli(diff(a, b, "--fail-over", "10"), capsys)
    assert code == 0
    assert "not flagged: block cam/detect: median" in out
    assert "5 / 5 spans (< 10 a side): too few spans" in out


def test_slower_frame_age(before: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = json.loads(before.read_text())["traceEvents"]
    aged: list[Event] = [
        {**e, "args": {**e["args"], "age_ms": 80.0 + i % 7}}
        for i, e in enumerate(events)
        if e["name"] == "workflow.run"
    ]
    slower = [{**e, "args": {**e["args"], "age_ms": e["args"]["age_ms"] * 1.5}} for e in aged]
    a, b = (write_trace(tmp_path / f"{n}.json", ev) for n, ev in (("a", aged), ("b", slower)))
    code, out, _ = run_cli([*diff(a, b, "--fail-over", "20"), "--json"], capsys)
    assert code == EXIT_REGRESSION
    report = json.loads(out)
    assert [r.split(":")[0] for r in report["regressions"]] == ["frame age cam"]
    assert report["gate"] == {
        "fail_over_pct": 20.0,
        "min_ms": 0.2,
        "min_frame_pct": 1.0,
        "confidence": 0.99,
    }


def test_usage_errors_exit_2(before: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run_cli(diff(before, before, "--confidence", "1.5"), capsys)
    assert info.value.code == 2 != EXIT_REGRESSION
    assert "--confidence: must be in [0.5, 1)" in capsys.readouterr().err
