"""`make test-flakes N=3`: the whole suite N times back to back; every test that failed.

Each run is `make test`'s own pytest command line, with its durations file kept apart
(tests/artifacts/flakes/run-K.json). The last run (when N > 1) has a CPU-bound neighbour
process pinned to one core for the whole run, as a busy machine would: a test whose
verdict moves with the machine's load shows up there. No run is retried; the list is
every test that failed, errored or was missing in any run, with the runs it failed in.

    python -m tests.support.flakes N -- PYTEST ARGS...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FOLDER = Path("tests/artifacts/flakes")
# One core of two, busy for the whole run: the neighbour a shared CI machine has.
NEIGHBOUR = ["taskset", "-c", "0", sys.executable, "-c", "while True: pass"]


def run_once(index: int, pytest_args: Sequence[str], neighbour: bool) -> Path:
    path = FOLDER / f"run-{index}.json"
    env = {**os.environ, "APPLIANCE_TEST_DURATIONS": str(path)}
    busy = subprocess.Popen(NEIGHBOUR) if neighbour else None
    try:
        subprocess.run([sys.executable, "-m", "pytest", *pytest_args], env=env, check=False)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    return path


def summarise(paths: Sequence[Path], neighbour_run: int | None) -> tuple[str, int]:
    failed: dict[str, list[int]] = defaultdict(list)
    lines = []
    every: set[str] = set()
    documents: list[dict[str, Any]] = []
    for index, path in enumerate(paths, 1):
        if not path.exists():
            lines.append(f"run {index}: no durations file (pytest did not finish)")
            failed["(the whole run)"].append(index)
            documents.append({})
            continue
        document = json.loads(path.read_text())
        documents.append(document["tests"])
        every |= set(document["tests"])
        bad = [k for k, e in document["tests"].items() if e["outcome"] not in ("passed", "skipped")]
        for nodeid in bad:
            failed[nodeid].append(index)
        note = " (with a CPU-bound neighbour on one core)" if index == neighbour_run else ""
        lines.append(
            f"run {index}{note}: {document['wall_s']:.0f} s, {len(document['tests'])} tests, "
            f"{len(bad)} not passed, exit status {document['exitstatus']}"
        )
    for index, tests in enumerate(documents, 1):
        if tests:
            for nodeid in every - set(tests):
                failed[f"{nodeid} (missing)"].append(index)
    if failed:
        lines += ["", "failed in any run:"]
        lines += [
            f"  runs {','.join(map(str, runs))}: {nodeid}"
            for nodeid, runs in sorted(failed.items())
        ]
    else:
        lines += ["", f"no test failed in any of the {len(paths)} runs"]
    return "\n".join(lines), 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=int)
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    pytest_args = [a for a in args.pytest_args if a != "--"]
    FOLDER.mkdir(parents=True, exist_ok=True)
    for stale in FOLDER.glob("run-*.json"):
        stale.unlink()
    neighbour_run = args.runs if args.runs > 1 else None
    paths = [run_once(k, pytest_args, k == neighbour_run) for k in range(1, args.runs + 1)]
    text, code = summarise(paths, neighbour_run)
    print(text)
    (FOLDER / "summary.txt").write_text(text + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
