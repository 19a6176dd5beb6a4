"""Shared by the bench scripts: argument parsing, the printed table, the JSON result."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
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


def serve_argv(config: Path, port: int, workers: int = 1) -> list[str]:
    """`appliance serve` on `config` at 127.0.0.1:`port` (`--workers` past one), quiet."""
    argv = [sys.executable, "-m", "appliance", "--log-level", "WARNING", "serve",
            "--config", str(config), "--port", str(port), "--stats-interval", "600"]  # fmt: skip
    return argv + (["--workers", str(workers)] if workers > 1 else [])


def kept(name: str, fresh: Callable[[str], bool]) -> dict[str, Any]:
    """For a bench that measures part of its figures at a time: from the kept results file
    bench/results/NAME.json, the metrics, targets, met and verdicts whose key this run does
    not measure anew (`fresh(key)` false), and that file's run facts; empty without one."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    parts = ("metrics", "targets", "met", "verdicts")
    out: dict[str, Any] = {
        p: {k: v for k, v in old.get(p, {}).items() if not fresh(k)} for p in parts
    }
    out["run"] = old.get("run")
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


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a live process and all its children."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:  # a child that ended meanwhile
            continue
    return total


def proc_rss_mb(pid: int) -> float:
    """Resident memory of a live process, MiB."""
    return float(psutil.Process(pid).memory_info().rss) / (1024 * 1024)


def proc_threads(pid: int) -> int:
    """Threads of a live process."""
    return int(psutil.Process(pid).num_threads())


def scaled_clip(width: int, height: int, fps: int, source: Path | None = None) -> Path:
    """The demo clip (or `source`) as H.264 at width x height and `fps`, made once into
    bench/.work/ (PyAV, libx264) and reused: a camera-like file for `pace: realtime`
    sources. The demo clip is 15 fps; for a higher rate each added frame is the mean of
    its two neighbours (not a copy, which the encoder would code as a skip and the decoder
    would get for free)."""
    import av
    import numpy as np

    source = source or ROOT / "configs" / "media" / "demo.mp4"
    out = ROOT / "bench" / ".work" / f"{source.stem}-{width}x{height}-{fps}fps.mp4"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"encoding {out.relative_to(ROOT)} (once)", flush=True)
    partial = out.with_suffix(".partial.mp4")
    with av.open(str(source)) as src, av.open(str(partial), "w") as dst:
        rate = src.streams.video[0].average_rate or fps
        repeat = max(1, round(fps / float(rate)))  # output frames per source frame
        stream = dst.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        # A camera-like GOP (1 s) and an encoder quick enough for a 2-core machine.
        stream.options = {"preset": "veryfast", "crf": "23", "g": str(fps)}
        previous: Any = None
        for frame in src.decode(video=0):
            image = frame.reformat(width, height, "rgb24").to_ndarray()
            for k in range(1, repeat + 1):
                if previous is None or k == repeat:
                    shown = image
                else:  # in between: a blend of the neighbours
                    shown = (previous.astype(np.uint16) * (repeat - k) + image * k) // repeat
                    shown = shown.astype(np.uint8)
                for packet in stream.encode(av.VideoFrame.from_ndarray(shown, format="rgb24")):
                    dst.mux(packet)
            previous = image
        for packet in stream.encode():
            dst.mux(packet)
    partial.rename(out)  # complete or absent: a killed run leaves no half clip behind
    return out


class FirstResults:
    """A Runtime subscriber (every stream) whose `all` is set once each of `streams` has
    produced a result: where a live window may start."""

    def __init__(self, streams: list[str]) -> None:
        import threading

        self._waiting, self._lock = set(streams), threading.Lock()
        self.all = threading.Event()

    def __call__(self, result: Any) -> None:
        with self._lock:
            self._waiting.discard(result.stream_id)
            if not self._waiting:
                self.all.set()


def bench_providers(default: str = '["cpu"]') -> list[str]:
    """The models' providers: BENCH_PROVIDERS (JSON, as bench/gpu_check.sh sets it) or
    `default`."""
    return list(json.loads(os.environ.get("BENCH_PROVIDERS", default)))


def traces_under(config: AppConfig, folder: Path) -> AppConfig:
    """`config` with profiling as configured (on by default, the product's) but its
    rolling traces written under `folder`, not the repository's traces/."""
    profiling = config.profiling.model_copy(update={"dir": folder / "traces"})
    return config.model_copy(update={"profiling": profiling})


def clock_cameras_available() -> bool:
    """GStreamer's RTSP server is installed for the system Python (what
    tests/support/clock_camera.py's ClockCamera runs on)."""
    import subprocess

    probe = "import gi; gi.require_version('GstRtspServer', '1.0')"
    try:
        done = subprocess.run(
            ["/usr/bin/python3", "-c", probe], check=False, capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@contextlib.contextmanager
def live_sources(
    rates: dict[int, int], size: tuple[int, int], workdir: Path
) -> Iterator[tuple[dict[str, dict[str, Any]], str]]:
    """Live streams, `rates` fps -> how many, of width x height `size`, up until the block
    ends: (stream id -> source, what they are). Clock cameras (live RTSP) where GStreamer's
    RTSP server is installed, else the demo clip re-encoded at that size and rate
    (`scaled_clip`) played as `pace: realtime` file sources."""
    if not clock_cameras_available():
        clips = {fps: scaled_clip(*size, fps) for fps in rates}
        yield (
            {
                f"f{fps}-{i}": {"url": str(clips[fps]), "pace": "realtime", "loop": True}
                for fps, count in rates.items()
                for i in range(count)
            },
            "pace: realtime file sources (no GStreamer RTSP server here for clock cameras)",
        )
        return
    from tests.support.clock_camera import ClockCamera

    cameras = {
        f"c{fps}-{i}": ClockCamera(*size, fps, workdir=workdir, path=f"/cam{fps}-{i}")
        for fps, count in rates.items()
        for i in range(count)
    }
    try:
        for camera in cameras.values():
            camera.start()
        yield {sid: {"url": c.url} for sid, c in cameras.items()}, "clock cameras (live RTSP)"
    finally:
        for camera in cameras.values():
            camera.stop()


@contextlib.contextmanager
def mosquitto(folder: Path) -> Iterator[int]:
    """A mosquitto on a free loopback port."""
    if shutil.which("mosquitto") is None:
        raise SystemExit("mosquitto is not installed: run `make test-deps`")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = folder / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n")
    proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(5)
