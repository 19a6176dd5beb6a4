"""The fault table: runs the fault-injection suite (tests/faults/) and prints what each
fault cost: how long the affected streams took to recover, what the other streams' fps
did, and how many results were lost.

The tests assert the documented bounds (a camera back within backoff cap + 2 s, nothing
lost within the queue bounds); the figures they measure on the way are timings, so they
are recorded (tests/faults/figures.py), not asserted, and reported here. `--rounds N`
runs the suite N times and reports each figure's median and range.

    python bench/faults.py [--quick] [--rounds N]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, bench_parser, report
from tests.faults.figures import ENV


def run_suite(figures: Path) -> int:
    """pytest over tests/faults with figures recorded to `figures`: its exit status."""
    env = {**os.environ, ENV: str(figures)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/faults"]
    return subprocess.run(argv, cwd=ROOT, env=env, check=False).returncode


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:.2f}" if len(values) == 1 else f"{med:.2f} [{min(values):.2f}-{max(values):.2f}]"


def main() -> None:
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    rows: dict[str, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    failed = 0
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        path = Path(tmp) / "figures.jsonl"
        for _ in range(rounds):
            failed += run_suite(path) != 0
        lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        fig = json.loads(line)
        row = rows[fig["fault"]]
        row["bound"] = [fig["bound"]]
        for key in ("recovery_s", "others_fps_ratio", "lost"):
            if fig[key] is not None:
                row[key].append(float(fig[key]))
    print(f"\n{'fault':<52}{'recovery s':>22}{'others fps':>22}{'lost':>8}  bound")
    metrics: dict[str, Any] = {"rounds": rounds, "suite_failures": failed}
    for fault, row in rows.items():
        lost = row["lost"]
        print(f"{fault:<52}{spread(row['recovery_s']):>22}{spread(row['others_fps_ratio']):>22}"
              f"{int(max(lost)) if lost else '-':>8}  {row['bound'][0]}")  # fmt: skip
        metrics[f"{fault}: recovery_s"] = spread(row["recovery_s"])
        metrics[f"{fault}: others_fps_ratio"] = spread(row["others_fps_ratio"])
        metrics[f"{fault}: lost_max"] = int(max(lost)) if lost else None
    total_lost = sum(int(max(r["lost"])) for r in rows.values() if r["lost"])
    metrics["results_lost_total"] = total_lost
    targets = {"results_lost_total": "0 within the documented bounds", "suite_failures": "0"}
    met = {"results_lost_total": total_lost == 0, "suite_failures": failed == 0}
    report("faults", metrics, targets, met)


if __name__ == "__main__":
    main()
