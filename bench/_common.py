"""Shared by the bench scripts: argument parsing, the printed table, the JSON result."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import psutil

from appliance.config import AppConfig, parse_config

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
if str(ROOT) not in sys.path:  # run as `python bench/NAME.py` from anywhere
    sys.path.insert(0, str(ROOT))


def parse_args(description: str) -> argparse.Namespace:
    return bench_parser(description).parse_args()


def report(
    name: str,
    metrics: dict[str, Any],
    targets: dict[str, Any],
    met: dict[str, bool],
    *,
    method: dict[str, Any] | None = None,
    verdicts: dict[str, Any] | None = None,
    **extra: Any,
) -> Path:
    """Print a table and write the results file: bench/results/NAME.json for a full run,
    bench/results/quick/NAME.json for `--quick` (a 60-s smoke run never replaces the
    figures the docs are rendered from). `method` says how the figures were taken and
    `verdicts` how each target was judged (bench/_compare.py)."""
    width = max(len(k) for k in (*metrics, *targets)) + 2
    print(f"\n{name}")
    print(f"{'metric':<{width}}{'value':>14}  {'target':<24}met")
    for key, value in metrics.items():
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        target = str(targets.get(key, ""))
        ok = met.get(key)
        verdict = "" if ok is None else ("yes" if ok else "NO")
        print(f"{key:<{width}}{shown:>14}  {target:<24}{verdict}")
    quick = "--quick" in sys.argv[1:]
    folder = RESULTS / "quick" if quick else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{name}.json"
    doc: dict[str, Any] = {"metrics": metrics, "targets": targets, "met": met}
    if method is not None:
        doc["method"] = method
    if verdicts is not None:
        doc["verdicts"] = verdicts
    doc.update(extra)
    doc["run"] = run_facts(quick)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return out


def report_judged(
    name: str, metrics: dict[str, Any], verdicts: dict[str, Any], method: dict[str, Any]
) -> Path:
    """`report` with each target's text, `met` and verdict derived from its
    bench/_compare.py Verdict, so the three cannot disagree."""
    targets = {
        key: f"{v.target} (95 % interval's {'lower' if v.at_least is not None else 'upper'} bound)"
        for key, v in verdicts.items()
    }
    return report(
        name, metrics, targets, {key: v.met for key, v in verdicts.items()},
        method=method, verdicts={key: v.as_json() for key, v in verdicts.items()},
    )  # fmt: skip


def run_facts(quick: bool) -> dict[str, Any]:
    """When and on what a results file was made."""
    import datetime
    import platform
    import subprocess

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
            check=False, timeout=10,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return {
        "quick": quick,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit or None,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
    }


def detect_stream_config(
    model_id: str, model: dict[str, Any], stream_id: str, source: dict[str, Any]
) -> AppConfig:
    """One stream running one `detect` block; the model unbatched (one stream), on the
    GPU where there is one."""
    return detect_streams_config(model_id, model, {stream_id: source})


def bench_parser(description: str) -> argparse.ArgumentParser:
    """A parser with `--quick`, for benches that take more options than `parse_args`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="finish within 60 s")
    return parser


def detect_streams_config(
    model_id: str, model: dict[str, Any], sources: dict[str, dict[str, Any]], **detect: Any
) -> AppConfig:
    """Streams (id -> source) each running one `detect` block (with `detect` parameters)
    of one shared model; the model's batching and providers as given (defaults:
    unbatched, GPU where there is one)."""
    model = {
        "providers": ["cuda", "cpu"],
        "batching": {"max_batch_size": 1, "max_queue_delay_ms": 0},
        **model,
    }
    workflow = {
        "name": model_id,
        "blocks": [{"id": model_id, "type": "detect", "model": model_id, **detect}],
        "outputs": {model_id: model_id},
    }
    streams = [{"id": sid, "source": src, "workflow": workflow} for sid, src in sources.items()]
    return parse_config({"models": {model_id: model}, "streams": streams}, ROOT)


def bench_venv(name: str, packages: list[str], timeout_s: float = 600.0) -> tuple[Path | None, str]:
    """The python of a bench-only venv bench/.work/NAME with `packages`, created on first
    use (never a dependency of the appliance); (None, why) when it cannot be made, e.g.
    without network. A marker file records what was installed, so a change reinstalls."""
    import subprocess

    venv = ROOT / "bench" / ".work" / name
    python, marker = venv / "bin" / "python", venv / ".bench-packages"
    wanted = "\n".join(packages)
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python, "ready"
    print(f"creating {venv.relative_to(ROOT)} with {' '.join(packages)} (once)", flush=True)
    steps = {
        "python -m venv": [sys.executable, "-m", "venv", "--clear", str(venv)],
        "pip install": [str(python), "-m", "pip", "install", "--quiet", *packages],
    }
    for label, command in steps.items():
        try:
            done = subprocess.run(
                command, check=False, capture_output=True, text=True, timeout=timeout_s
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"{label} failed: {exc}"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            return None, f"{label} failed: {last[-200:]}"
    marker.write_text(wanted)
    return python, "created"


def proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) a live process has used."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def proc_rss_mb(pid: int) -> float:
    """Resident memory of a live process, MiB."""
    return float(psutil.Process(pid).memory_info().rss) / (1024 * 1024)


def proc_threads(pid: int) -> int:
    """Threads of a live process."""
    return int(psutil.Process(pid).num_threads())
