"""The fault table: runs the fault-injection suite (tests/faults/) and prints what each
fault cost: how long the affected streams took to recover, what the other streams' fps
did, and how many results were lost.

The tests assert the documented bounds (a camera back within backoff cap + 2 s, nothing
lost within the queue bounds); the figures they measure on the way are timings, so they
are recorded (tests/faults/figures.py), not asserted, and reported here. Each test
records its row however it ends, so a fault that loses results shows the loss here and
fails its test. `--rounds N` runs the suite N times and reports each figure's median and
range; the results file keeps every round's value (`rows.<key>.<figure>.runs`).

    python bench/faults.py [--quick] [--rounds N]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, bench_parser, report
from tests.faults.figures import ENV

FIGURES = ("recovery_s", "others_fps_ratio")  # timings: median and range over the rounds
LOST_RULE = "met when lost == 0 in every round of every fault (an absolute count, no interval)"
SUITE_RULE = (
    "met when every round of the suite passed (each test's documented bound held) and "
    "every fault recorded its row in every round (none skipped or broken off before it)"
)


def run_suite(figures: Path) -> int:
    """pytest over tests/faults with figures recorded to `figures`: its exit status."""
    env = {**os.environ, ENV: str(figures)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/faults"]
    return subprocess.run(argv, cwd=ROOT, env=env, check=False).returncode


def spread(values: list[float] | list[int]) -> dict[str, Any] | None:
    """A figure over the rounds: median, min, max and every round's value; None when no
    round measured it."""
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": values,
    }


def shown(figure: dict[str, Any] | None) -> str:
    if figure is None:
        return "-"
    if len(figure["runs"]) == 1:
        return f"{figure['median']:.2f}"
    return f"{figure['median']:.2f} [{figure['min']:.2f}-{figure['max']:.2f}]"


def collect(lines: list[str]) -> dict[str, dict[str, Any]]:
    """The recorded lines (one per fault per round) as one row per fault."""
    rounds: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        fig = json.loads(line)
        rounds.setdefault(fig["key"], []).append(fig)
    return {key: row(figs) for key, figs in rounds.items()}


def row(figs: list[dict[str, Any]]) -> dict[str, Any]:
    """One fault's figures over the rounds it ran in."""
    out: dict[str, Any] = {"fault": figs[-1]["fault"], "bound": figs[-1]["bound"]}
    for key in FIGURES:
        out[key] = spread([float(f[key]) for f in figs if f[key] is not None])
    lost = [int(f["lost"]) for f in figs if f["lost"] is not None]
    # None: a fault whose loss cannot be counted (a camera's own frames), not zero.
    out["lost"] = {"max": max(lost), "total": sum(lost), "runs": lost} if lost else None
    for name in sorted({n for f in figs for n in f["counts"]}):
        out[name] = spread([f["counts"][name] for f in figs if name in f["counts"]])
    out["recorded_runs"] = len(figs)
    out["failed_runs"] = sum(1 for f in figs if f["passed"] is False)
    return out


def table(rows: dict[str, dict[str, Any]]) -> None:
    print(f"\n{'fault':<24}{'recovery s':>20}{'others fps':>20}{'lost':>6}{'failed':>8}  bound")
    for key, r in rows.items():
        lost = "-" if r["lost"] is None else str(r["lost"]["max"])
        print(f"{key:<24}{shown(r['recovery_s']):>20}{shown(r['others_fps_ratio']):>20}"
              f"{lost:>6}{r['failed_runs']:>8}  {r['bound']}")  # fmt: skip


def judged(rows: dict[str, dict[str, Any]], rounds: int, failed: int) -> tuple[
    dict[str, Any], dict[str, Any], dict[str, bool], dict[str, Any]
]:  # fmt: skip
    """metrics, targets, met and verdicts: absolute counts, each over every round."""
    lossy = sorted(k for k, r in rows.items() if r["lost"] and r["lost"]["total"])
    total = sum(r["lost"]["total"] for r in rows.values() if r["lost"])
    incomplete = sorted(k for k, r in rows.items() if r["recorded_runs"] < rounds)
    failing = sorted(k for k, r in rows.items() if r["failed_runs"])
    metrics: dict[str, Any] = {
        "rounds": rounds,
        "faults": len(rows),
        "suite_failures": failed,
        "results_lost_total": total,
    }
    met = {"results_lost_total": total == 0, "suite_failures": failed == 0 and not incomplete}
    targets = {"results_lost_total": "0 in every round", "suite_failures": "0"}
    verdicts = {
        "results_lost_total": {
            "value": total, "rounds": rounds, "faults_with_loss": lossy,
            "rule": LOST_RULE, "met": met["results_lost_total"],
        },
        "suite_failures": {
            "value": failed, "rounds": rounds, "faults_failed": failing,
            "faults_not_recorded_every_round": incomplete,
            "rule": SUITE_RULE, "met": met["suite_failures"],
        },
    }  # fmt: skip
    return metrics, targets, met, verdicts


def main() -> None:
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    failed = 0
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        path = Path(tmp) / "figures.jsonl"
        for _ in range(rounds):
            failed += run_suite(path) != 0
        lines = path.read_text().splitlines() if path.exists() else []
    rows = collect(lines)
    table(rows)
    metrics, targets, met, verdicts = judged(rows, rounds, failed)
    method = {
        "what": "the fault-injection suite (pytest tests/faults) with real RTSP servers, "
        "mosquitto, webhook receivers and `appliance serve`; each test records its row "
        "(tests/faults/figures.py) however it ends",
        "rounds": rounds,
        "round": "one run of the whole suite, the faults one after another",
        "figure": "per fault: recovery_s and others_fps_ratio as median, min and max over "
        "the rounds (every round's value in `runs`); lost as the largest and the total "
        "over the rounds; frames_skipped as recorded",
        "verdict": "absolute counts over every round, no interval: " + LOST_RULE,
    }
    report("faults", metrics, targets, met, method=method, verdicts=verdicts, rows=rows)


if __name__ == "__main__":
    main()
