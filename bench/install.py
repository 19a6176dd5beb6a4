"""What `make run` and `make test` install: a fresh clone of this checkout's HEAD, a fresh
virtualenv, `make install` (what running needs: pyproject's dependencies) then
`make install-dev` (the dev extra on top: tests, lint, benches). For each: the seconds it
took, the virtualenv's size on disk and how many distributions it holds; and whether the
runtime install is free of the dev tools.

The downloads come through pip's cache as it is on this machine (a warm cache makes the
seconds a lower bound; the sizes do not depend on it). One run of each, in order: the
sizes are what the figures are about, and they do not vary run to run.

    python bench/install.py [--quick]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, bench_parser, report

DEV_ONLY = ("pytest", "playwright", "mypy", "ruff", "schemathesis", "hypothesis", "psutil")
RUNTIME_MB = 1000  # ONNX Runtime's GPU build, OpenCV, SciPy, PyAV and aiortc fill most of it


def folder_mb(path: Path) -> float:
    """Bytes on disk under `path`, in MB (du's view: links and sparse files as stored)."""
    out = subprocess.run(["du", "-sm", str(path)], check=True, capture_output=True, text=True)
    return float(out.stdout.split()[0])


def distributions(venv: Path) -> list[str]:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
    )
    return sorted(d["name"].lower() for d in json.loads(out.stdout))


def timed_make(clone: Path, target: str) -> float:
    t0 = time.monotonic()
    done = subprocess.run(["make", target], check=False, cwd=clone, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"make {target} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return time.monotonic() - t0


def main() -> None:
    bench_parser(__doc__.splitlines()[0]).parse_args()  # --quick: the same run (~45 s)
    with tempfile.TemporaryDirectory(prefix="bench-install-") as tmp:
        clone = Path(tmp) / "appliance"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        venv = clone / ".venv"
        run_s = timed_make(clone, "install")
        run_mb, run_dists = folder_mb(venv), distributions(venv)
        dev_s = timed_make(clone, "install-dev")
        dev_mb, dev_dists = folder_mb(venv), distributions(venv)
    leaked = sorted(set(DEV_ONLY) & set(run_dists))
    metrics = {
        "run.install_s": round(run_s, 1),
        "run.venv_mb": run_mb,
        "run.distributions": len(run_dists),
        "run.dev_tools_present": leaked,
        "test.extra_install_s": round(dev_s, 1),
        "test.venv_mb": dev_mb,
        "test.distributions": len(dev_dists),
        "test.extra_mb": dev_mb - run_mb,
    }
    targets = {
        "run.dev_tools_present": "none of " + ", ".join(DEV_ONLY),
        "run.venv_mb": f"<= {RUNTIME_MB}",
    }
    met = {"run.dev_tools_present": not leaked, "run.venv_mb": run_mb <= RUNTIME_MB}
    method = {
        "what": "a fresh clone of HEAD and a fresh virtualenv: `make install` (make run's), then "
        "`make install-dev` (make test's and make lint's) on top",
        "sizes": "du -sm of .venv; distributions: pip list",
        "seconds": "wall time of each make target, through pip's cache as it is here (a "
        "lower bound on a machine that downloads everything)",
        "rounds": 1,
    }
    report("install", metrics, targets, met, method=method)


if __name__ == "__main__":
    main()
