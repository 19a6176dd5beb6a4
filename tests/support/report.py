"""`make test-report`: the slowest tests of the last run and a total per folder.

Reads the files the durations plugin (tests/support/durations.py) wrote, one per pytest
run of `make test`, and prints the 30 slowest tests (setup + call + teardown, with their
module) and each folder's total. Under xdist a folder's total is the sum of its tests'
times, i.e. worker-seconds, which can exceed the run's wall time.

    python -m tests.support.report [--top N] [--weights] [FILE ...]

`--weights` writes each file's seconds to tests/support/weights.json instead: the order
`make test` hands files to its workers in (tests/support/order.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ARTIFACTS = Path("tests/artifacts")
WEIGHTS = Path("tests/support/weights.json")


def load(paths: Sequence[Path]) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    tests: dict[str, dict[str, Any]] = {}
    runs: list[dict[str, Any]] = []
    for path in paths:
        document = json.loads(path.read_text())
        tests.update(document["tests"])
        runs.append({"file": str(path), **{k: v for k, v in document.items() if k != "tests"}})
    return tests, runs


def total(entry: dict[str, Any]) -> float:
    return float(entry["setup"] + entry["call"] + entry["teardown"])


def folder(nodeid: str) -> str:
    parts = nodeid.split("::", maxsplit=1)[0].split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def render(tests: dict[str, dict[str, Any]], runs: list[dict[str, Any]], top: int) -> str:
    lines = []
    for run in runs:
        workers = run.get("workers") or 1
        lines.append(
            f"{run['file']}: {run['wall_s']:.1f} s wall, {workers} worker(s), "
            f"exit status {run.get('exitstatus')}"
        )
    ranked = sorted(tests.items(), key=lambda item: total(item[1]), reverse=True)
    lines += ["", f"{top} slowest tests (s: total = setup + call + teardown)"]
    lines.append(f"{'total':>7} {'setup':>7} {'call':>7} {'teardown':>8}  test")
    for nodeid, entry in ranked[:top]:
        lines.append(
            f"{total(entry):7.2f} {entry['setup']:7.2f} {entry['call']:7.2f} "
            f"{entry['teardown']:8.2f}  {nodeid}"
        )
    costly = sorted(
        ((k, e) for k, e in tests.items() if "cpu_s" in e),
        key=lambda item: item[1]["cpu_s"],
        reverse=True,
    )
    if costly:
        lines += ["", f"{top} costliest in CPU (s of CPU, its children included)"]
        lines += [f"{e['cpu_s']:7.2f}  {k}" for k, e in costly[:top]]
    per_folder: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for nodeid, entry in tests.items():
        per_folder[folder(nodeid)].append((total(entry), entry.get("cpu_s", 0.0)))
    lines += [
        "",
        "per folder (s, summed over its tests)",
        f"{'total':>8} {'cpu':>8} {'tests':>6}  folder",
    ]
    rows = sorted(per_folder.items(), key=lambda item: -sum(t for t, _ in item[1]))
    for name, times in [*rows, ("all", [t for _, ts in rows for t in ts])]:
        spent, cpu = sum(t for t, _ in times), sum(c for _, c in times)
        lines.append(f"{spent:8.1f} {cpu:8.1f} {len(times):6d}  {name}")
    failed = sorted(k for k, e in tests.items() if e["outcome"] not in ("passed", "skipped"))
    if failed:
        lines += ["", "not passed:", *(f"  {tests[k]['outcome']}: {k}" for k in failed)]
    return "\n".join(lines)


def file_weights(tests: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each test file's seconds (its tests' setup, call and teardown), longest first."""
    per_file: dict[str, float] = defaultdict(float)
    for nodeid, entry in tests.items():
        per_file[nodeid.split("::", 1)[0]] += total(entry)
    return {k: round(v, 1) for k, v in sorted(per_file.items(), key=lambda kv: -kv[1])}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--weights", action="store_true", help="write " + str(WEIGHTS))
    args = parser.parse_args(argv)
    paths = args.files or sorted(ARTIFACTS.glob("durations*.json"))
    if not paths:
        print(f"no durations file under {ARTIFACTS}: run `make test` first", file=sys.stderr)
        return 1
    tests, runs = load(paths)
    if args.weights:
        WEIGHTS.write_text(json.dumps(file_weights(tests), indent=0) + "\n", encoding="utf-8")
        print(f"wrote {WEIGHTS}")
        return 0
    print(render(tests, runs, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
