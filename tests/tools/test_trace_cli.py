"""`appliance trace summarize|diff` through a parser built with `add_trace_commands`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from appliance.tools.trace_cli import add_trace_commands
from tests.tools import sample_events, span, write_trace


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Parse `argv` as `appliance` would and run the command: (exit code, stdout, stderr)."""
    parser = argparse.ArgumentParser(prog="appliance")
    add_trace_commands(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def before(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "before.json", sample_events())


def test_summarize_prints_tables_and_hints(
    before: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(["trace", "summarize", str(before), "--top", "2"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert any(line.split()[:3] == ["detect", "4", "10.00"] for line in lines)
    assert any(line.split() == ["ssd", "2", "8.00", "4.00", "2.00"] for line in lines)
    assert "  ... 1 more" in lines  # three op types, top 2
    assert "frame age ms: p50 50.0, p90 90.0, p99 100.0" in lines
    assert "  - block detect takes 71.4 % of block time: the hot spot of the workflow" in lines


def test_summarize_json_is_the_fingerprint(
    before: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(["trace", "summarize", str(before), "--json"], capsys)
    assert code == 0
    assert json.loads(out)["blocks"]["detect"]["p99_ms"] == 4.0


def test_bad_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("<html>")
    code, out, err = run_cli(["trace", "summarize", str(bad)], capsys)
    assert (code, out) == (1, "")
    assert err.startswith(f"error: {bad}: not JSON")


def test_diff_equal_traces_exit_0(before: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["trace", "diff", str(before), str(before), "--fail-over", "5"], capsys)
    assert code == 0
    assert "regression" not in out


def test_slowed_block_exits_2(
    before: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    after = write_trace(tmp_path / "after.json", sample_events((2000, 3000, 4000, 5000)))
    argv = ["trace", "diff", str(before), str(after)]
    assert run_cli(argv, capsys)[0] == 0  # no threshold, no failure
    code, out, _ = run_cli([*argv, "--fail-over", "10"], capsys)
    assert code == 2
    assert "regression: blocks detect: 2.5 -> 3.5 (+40.0 %)" in out.splitlines()
    assert run_cli([*argv, "--fail-over", "50"], capsys)[0] == 0  # +40 % is under 50


def test_slower_frame_age_exits_2(
    before: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = [*sample_events(), span("workflow", "workflow.run", 0, 10, age_ms=200.0)]
    after = write_trace(tmp_path / "after.json", events)
    code, out, _ = run_cli(
        ["trace", "diff", str(before), str(after), "--fail-over", "50", "--json"], capsys
    )
    assert code == 2
    report = json.loads(out)
    assert report["regressions"] == ["frame p99: 100.0 -> 200.0 (+100.0 %)"]


def test_tiny_baseline_is_not_a_regression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_trace(tmp_path / "a.json", [span("block", "tiny", 0, 50)])  # 0.05 ms in all
    b = write_trace(tmp_path / "b.json", [span("block", "tiny", 0, 500)])
    code, out, _ = run_cli(["trace", "diff", str(a), str(b), "--fail-over", "10"], capsys)
    assert code == 0
    assert out.splitlines()[-1].split() == ["tiny", "0.050", "0.500", "-"]
