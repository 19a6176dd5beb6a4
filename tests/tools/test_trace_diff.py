"""`trace diff --fail-over` on this config's traces: two runs of unchanged code pass (A/A), a
block made 10 % slower is caught, a small one is not; and two real runs' rolling traces,
one with its detector made three times as slow, are diffed as the runtime wrote them.

The 10 % claims are the rule's, so they are judged on traces drawn with a seed from the
spread real runs of this config show on this shared 2-core machine: their spans' log
durations spread by 0.55-0.64 (σ; detector, model, frame and frame age alike, measured on
two runs side by side). Judged on real runs instead, the verdicts were the load's: under a
second worker and a neighbour the two runs met different loads, and their A/A failed once
in three (frame age +11.8 %, p 0.004), while the 10 % shift's p reached 0.036 against the
0.05 asked. At that spread 300 frames are too few for either claim (seeded: the 10 %
shift missed in 17 seeds of 40, the A/A failed 2 times in 80); 1000 are enough (0 of 40,
0 of 80), and cost nothing drawn.

The real runs go at the same time, unpinned (a neighbour on one core would load only a
run pinned there), so that both meet much the same load: their detectors still differed
by up to 27 % under load. Three times as slow is a shift no such difference comes near
(+228 % and +273 % measured, p < 1e-14). The slowdown is injected into a real trace: the
block's spans (and the frames around them) scaled, so the distribution stays a real one.
"""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from appliance.config import parse_config
from appliance.tools.trace_cli import EXIT_REGRESSION, add_trace_commands
from tests.support.appliance import DEMO_CLIP, person_model
from tests.support.media import retimed
from tests.support.tracecheck import run_to_rolling_trace
from tests.tools import Event, span, write_trace

FRAMES = 1000  # a drawn trace's frames (see the top)
SPREAD = 0.6  # σ of a drawn span's log duration, as real runs here (see the top)
MEDIANS_US = {"people": 50_000, "drawn": 300, "age": 70_000}  # as real runs here
LIVE_FRAMES = 60  # a real run's: every frame's spans, in each trace
SPEED = 2  # the clip played at 30 fps


def drawn_trace(path: Path, seed: int) -> Path:
    """A rolling trace of stream `cam` as the runtime writes it for `config` below: each
    frame's `workflow.run` (with its age) holds the detector, its model's run inside it,
    and the drawing; durations lognormal around MEDIANS_US, seeded."""
    rng = np.random.default_rng(seed)
    people, drawn, age = (
        rng.lognormal(np.log(MEDIANS_US[row]), SPREAD, FRAMES) for row in ("people", "drawn", "age")
    )
    events: list[Event] = []
    ts = 0.0
    for i in range(FRAMES):
        frame = people[i] + drawn[i] + 500
        age_ms = round(age[i] / 1000, 3)
        args = {"stream": "cam", "workflow": "people", "seq": i, "age_ms": age_ms}
        events.append(span("workflow", "workflow.run", ts, frame, **args))
        events.append(span("block", "people", ts + 100, people[i], stream="cam", type="detect"))
        model = {"model": "person", "batch_size": 1, "streams": ["cam"]}
        events.append(span("model", "session.run", ts + 200, people[i] * 0.95, **model))
        at = ts + 100 + people[i]
        events.append(span("block", "drawn", at, drawn[i], stream="cam", type="annotate"))
        ts += frame + 1000
    return write_trace(path, events)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Traces `a` and `b`: two draws of the same runs (seeds 1 and 2)."""
    base = tmp_path_factory.mktemp("drawn")
    return {name: drawn_trace(base / f"{name}.json", seed) for name, seed in (("a", 1), ("b", 2))}


def config(folder: Path, clip: Path) -> Any:
    model = person_model()
    model["session"] = {"intra_op_threads": 1}  # two runs side by side: a core's worth each
    doc = {
        "profiling": {"dir": "traces", "rotate_s": 600},
        "models": {"person": model},
        "streams": [
            {
                "id": "cam",
                "source": {"url": str(clip), "pace": "realtime", "loop": True},
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
    return parse_config(doc, folder)


def run(folder: Path, clip: Path, traces: dict[str, Path]) -> None:
    folder.mkdir()
    traces[folder.name] = run_to_rolling_trace(config(folder, clip), LIVE_FRAMES, 120)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Rolling traces `a` and `b` of the same config, run at the same time."""
    base = tmp_path_factory.mktemp("aa")
    clip = retimed(DEMO_CLIP, base / "demo-30fps.mp4", SPEED)
    traces: dict[str, Path] = {}
    threads = [threading.Thread(target=run, args=(base / name, clip, traces)) for name in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(traces) == {"a", "b"}
    return traces


def diff(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    parser = argparse.ArgumentParser(prog="appliance")
    add_trace_commands(parser.add_subparsers(required=True))
    args = parser.parse_args(["trace", "diff", *argv, "--json"])
    code: int = args.func(args)
    return code, json.loads(capsys.readouterr().out)


def slowed(trace: Path, out: Path, block: str, factor: float) -> Path:
    """`trace` with every span of `block` `factor` times longer, and its workflow.run
    longer by as much (each frame takes the block's extra time)."""
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    runs = [(e, e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "workflow.run"]
    for e in events:
        if e["ph"] == "X" and e.get("cat") == "block" and e["name"] == block:
            extra = round(e["dur"] * (factor - 1))
            e["dur"] += extra
            frame = next(
                r for r, start, end in runs if r["tid"] == e["tid"] and start <= e["ts"] < end
            )
            frame["dur"] += extra
    out.write_text(json.dumps(doc))
    return out


def test_two_runs_of_the_same_code_pass(
    drawn: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    for before, after in (("a", "b"), ("b", "a")):
        code, report = diff([str(drawn[before]), str(drawn[after]), "--fail-over", "10"], capsys)
        assert (code, report["regressions"]) == (0, []), report["rows"]
        detect = next(r for r in report["rows"] if r["name"] == "cam/people")
        assert detect["count_before"] == detect["count_after"] == FRAMES


def test_a_block_made_10_percent_slower_is_caught(
    drawn: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    after = slowed(drawn["a"], tmp_path / "slower.json", "people", 1.10)
    argv = [str(drawn["a"]), str(after), "--fail-over", "5", "--confidence", "0.95"]
    code, report = diff(argv, capsys)
    assert code == EXIT_REGRESSION
    flagged = [line.split(":")[0] for line in report["regressions"]]
    assert "block cam/people" in flagged and "frame cam" in flagged
    detect = next(r for r in report["rows"] if r["name"] == "cam/people")
    assert detect["low_ms"] > 0 and detect["p_value"] < 0.05
    assert 5 < detect["change_pct"] < 15


def test_a_small_block_made_10_percent_slower_is_not(
    drawn: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    after = slowed(drawn["a"], tmp_path / "slower.json", "drawn", 1.10)
    code, report = diff([str(drawn["a"]), str(after), "--fail-over", "5"], capsys)
    assert (code, report["regressions"]) == (0, [])
    small = next(r for r in report["rows"] if r["name"] == "cam/drawn")
    assert small["verdict"] == "immaterial"  # 0.03 ms: under 0.2 ms and 1 % of the frame
    assert small["share_pct"] < 5


@pytest.mark.slow
@pytest.mark.timeout(300)  # two runs side by side, each loading its model
def test_a_real_run_with_its_detector_three_times_as_slow_is_caught(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    after = slowed(runs["b"], tmp_path / "slower.json", "people", 3.0)
    code, report = diff([str(runs["a"]), str(after), "--fail-over", "10"], capsys)
    assert code == EXIT_REGRESSION
    flagged = [line.split(":")[0] for line in report["regressions"]]
    assert "block cam/people" in flagged and "frame cam" in flagged
    rows = {(r["kind"], r["name"]): r for r in report["rows"]}
    assert set(rows) == {
        ("block", "cam/people"),
        ("block", "cam/drawn"),
        ("model", "person"),
        ("frame", "cam"),
        ("frame age", "cam"),
    }  # every row the runtime's rolling traces give this workflow
    detect = rows[("block", "cam/people")]
    assert detect["count_before"] == detect["count_after"] == LIVE_FRAMES  # no frame lost
    assert detect["low_ms"] > 0
