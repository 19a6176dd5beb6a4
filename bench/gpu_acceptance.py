"""GPU acceptance (issue 31, item 7): N live 1080p30 cameras with detection and tracking.

Per camera count × hardware decoding (`source.decoder.hwaccel`): a fresh Runtime in this
process (`--workers 1`, the only value this version takes; `appliance serve --workers`
is bench/workers.py's) runs N streams, each a `detect` block on the person detector
(providers [cuda, cpu], batched across the streams) and a `track` block (ByteTrack), with
profiling on (rolling Chrome traces, under bench/.work/gpu_acceptance/). The cameras are
one 1080p30 H.264 clip, made at the start from the demo clip (scaled to 1920x1080,
re-encoded at 30 fps into bench/.work/, once), played as N file sources with
`pace: realtime`, `loop: true`: no RTSP server needed on the GPU machine.

After every stream's first result and a warm-up, over a window of `--seconds`:
- processed fps: the sum over the streams and the slowest stream's;
- frame age p99: capture to the workflow's end of every result in the window (each
  result's `age_seconds`, taken by a subscriber);
- GPU utilisation (mean of NVML samples every 0.5 s) and memory used (the highest
  sample), "n/a" without NVML (nvidia-ml-py and a driver);
- the process's CPU per processed frame.

The moonshot (>= 64 live 1080p30 cameras, frame-age p99 <= 150 ms) is an absolute check
with no baseline: a row meets it with at least 64 cameras, its slowest stream at
>= 95 % of 30 fps (live: keeping up, a few frames' slack for the window's edges) and
p99 <= 150 ms. It is judged only where a GPU ran it (NVML found one and the model got
CUDA or TensorRT); elsewhere its `met` is null: "not measured on a GPU".

    python bench/gpu_acceptance.py [--quick] [--counts 8,16,32,64] [--hwaccel none,cuda]
                                   [--seconds S] [--workers 1]
    # quick: 1 and 2 cameras, 3 s windows: shows it works on a CPU machine, no GPU figures
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

# Run as `python bench/gpu_acceptance.py`: the repo root first on the path, for `bench`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from appliance.config import AppConfig, parse_config
from appliance.runtime.runtime import Runtime
from appliance.sources.config import HWAccelName
from appliance.tools.doctor import gpu_row
from bench._common import (
    ROOT,
    FirstResults,
    bench_parser,
    bench_providers,
    report,
    scaled_clip,
    traces_under,
)
from bench._compare import method

WIDTH, HEIGHT, FPS = 1920, 1080, 30
MOONSHOT_CAMERAS, MOONSHOT_P99_MS = 64, 150.0
LIVE_SHARE = 0.95  # a live stream processes at least 95 % of its camera's frames
MAX_BATCH = 32  # samples per session.run across streams; a GPU's sweet spot, not tuned
FIRST_RESULT_TIMEOUT_S = 120.0  # 64 streams opening, CUDA sessions and their warm-up
NVML_EVERY_S = 0.5
WORK = ROOT / "bench" / ".work" / "gpu_acceptance"
NOT_ON_GPU = "not measured on a GPU"


def config(count: int, hwaccel: str, clip: Path) -> AppConfig:
    """`count` streams of `clip`, each detecting people and tracking them."""
    workflow = {
        "name": "people_tracked",
        "blocks": [
            {"id": "people", "type": "detect", "model": "person", "confidence": 0.4},
            {"id": "tracks", "type": "track", "detections": "people"},
        ],
        "outputs": {"tracks": "tracks"},
    }
    model = {
        "path": str(ROOT / "configs" / "models" / "person_ssdlite.onnx"),
        "decoder": "tf_od",
        "labels": ["person"],
        "providers": bench_providers('["cuda", "cpu"]'),
        "batching": {"max_batch_size": min(count, MAX_BATCH), "max_queue_delay_ms": 2},
    }
    source = {"url": str(clip), "pace": "realtime", "loop": True, "decoder": {"hwaccel": hwaccel}}
    streams = [{"id": f"cam{i}", "source": source, "workflow": workflow} for i in range(count)]
    raw = {"models": {"person": model}, "streams": streams}
    return traces_under(parse_config(raw, ROOT), WORK)


class Gpu:
    """NVML's view of GPU 0, or none: `why` says why (no nvidia-ml-py, no driver, no GPU)."""

    def __init__(self) -> None:
        self.name, self.why = "cpu only", ""
        self._handle: Any = None  # NVML's device handle; None: no GPU figures
        self._nvml: Any = None
        try:
            import pynvml  # type: ignore[import-untyped]
        except ImportError:
            self.why = "no NVML: nvidia-ml-py is not installed"
            return
        try:
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(self._handle)
        except pynvml.NVMLError as exc:
            self.why, self._handle = f"no GPU through NVML: {exc}", None
            return
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self._nvml = pynvml

    @property
    def present(self) -> bool:
        return self._handle is not None

    def sample(self) -> tuple[float, float]:
        """(utilisation % over NVML's last sample period, memory used MiB) now: the
        row `appliance doctor` reads (NVML initialised once here, not per sample)."""
        row = gpu_row(self._nvml, 0)
        return float(row["utilization_percent"]), float(row["memory_used_mib"])


class GpuSampler:
    """Samples the GPU every NVML_EVERY_S on its own thread while `with` lasts."""

    def __init__(self, gpu: Gpu) -> None:
        self._gpu, self._stop = gpu, threading.Event()
        self.samples: list[tuple[float, float]] = []
        self._thread = threading.Thread(target=self._run, name="bench-nvml", daemon=True)

    def __enter__(self) -> GpuSampler:
        if self._gpu.present:
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(NVML_EVERY_S):
            self.samples.append(self._gpu.sample())

    def figures(self) -> tuple[float | str, float | str]:
        """(mean utilisation %, highest memory MiB), "n/a" without samples."""
        if not self.samples:
            return "n/a", "n/a"
        util, memory = zip(*self.samples, strict=True)
        return round(float(np.mean(util)), 1), round(max(memory), 0)


@dataclass
class Ages:
    """A subscriber: each result's frame age while `recording` is set (list.append
    from the worker threads is atomic under the GIL)."""

    recording: threading.Event = field(default_factory=threading.Event)
    seconds: list[float] = field(default_factory=list)

    def __call__(self, result: Any) -> None:
        if self.recording.is_set():
            self.seconds.append(result.age_seconds)


@dataclass(frozen=True)
class Row:
    """One count × hwaccel over its window."""

    count: int
    hwaccel: str
    fps_sum: float
    fps_min_stream: float
    age_p99_ms: float
    gpu_util_pct: float | str
    gpu_mem_mib: float | str
    cpu_ms_per_frame: float
    providers: list[str]  # what the person detector got, preferred first
    decoders: dict[str, int]  # what decodes the video (e.g. "h264 cuda") -> streams
    decoder_problems: list[str]  # why NVDEC was refused, where it was (distinct)

    @property
    def on_gpu(self) -> bool:
        return self.providers[:1] in (["CUDAExecutionProvider"], ["TensorrtExecutionProvider"])

    @property
    def meets_moonshot(self) -> bool:
        live = self.fps_min_stream >= LIVE_SHARE * FPS
        return self.count >= MOONSHOT_CAMERAS and live and self.age_p99_ms <= MOONSHOT_P99_MS


def measure(count: int, hwaccel: str, clip: Path, gpu: Gpu, timing: tuple[float, float]) -> Row:
    """A fresh Runtime of `count` cameras: its figures over a window of timing[1] s that
    starts timing[0] s after every stream's first result."""
    warmup_s, seconds = timing
    ids = [f"cam{i}" for i in range(count)]
    runtime, first, ages = Runtime(config(count, hwaccel, clip)), FirstResults(ids), Ages()
    runtime.subscribe(first)
    runtime.subscribe(ages)
    runtime.start()
    try:
        if not first.all.wait(FIRST_RESULT_TIMEOUT_S):
            raise RuntimeError(f"not every stream had a result in {FIRST_RESULT_TIMEOUT_S:g} s")
        time.sleep(warmup_s)  # live cameras: the window is wall time by design
        f0, cpu0, t0 = frames(runtime, ids), time.process_time(), time.perf_counter()
        ages.recording.set()
        with GpuSampler(gpu) as sampler:
            time.sleep(seconds)
        ages.recording.clear()
        f1, cpu1, t1 = frames(runtime, ids), time.process_time(), time.perf_counter()
        statuses = [runtime.stream_status(sid) for sid in ids]
    finally:
        runtime.stop()
    done = [f1[sid] - f0[sid] for sid in ids]
    decoders = Counter(status.decoder or "not opened" for status in statuses)
    util, memory = sampler.figures()
    return Row(
        count=count,
        hwaccel=hwaccel,
        fps_sum=sum(done) / (t1 - t0),
        fps_min_stream=min(done) / (t1 - t0),
        age_p99_ms=float(np.percentile(ages.seconds, 99)) * 1000 if ages.seconds else float("nan"),
        gpu_util_pct=util,
        gpu_mem_mib=memory,
        cpu_ms_per_frame=(cpu1 - cpu0) * 1000 / max(sum(done), 1),
        providers=list(statuses[0].providers.get("person", [])),
        decoders=dict(decoders),
        decoder_problems=sorted({s.decoder_problem for s in statuses if s.decoder_problem}),
    )


def frames(runtime: Runtime, ids: list[str]) -> dict[str, int]:
    """Each stream's frames processed so far."""
    return {sid: runtime.stream_status(sid).frames_processed for sid in ids}


def describe(row: Row | str) -> str:
    """One row on a line, or why it failed."""
    if isinstance(row, str):
        return f"failed: {row}"
    return (
        f"{row.fps_sum:7.1f} fps (slowest stream {row.fps_min_stream:5.1f}), "
        f"age p99 {row.age_p99_ms:6.1f} ms, GPU {row.gpu_util_pct} % / {row.gpu_mem_mib} MiB, "
        f"CPU {row.cpu_ms_per_frame:5.2f} ms/frame; model on {', '.join(row.providers)}; "
        f"decoders {row.decoders}" + "".join(f"; {p}" for p in row.decoder_problems)
    )


def moonshot(rows: dict[str, Row | str], gpu: Gpu) -> dict[str, Any]:
    """The moonshot's verdict: judged only where a GPU ran the rows."""
    measured = [r for r in rows.values() if isinstance(r, Row)]
    verdict: dict[str, Any] = {
        "target": f">= {MOONSHOT_CAMERAS} live {HEIGHT}p{FPS} cameras, frame-age p99 "
        f"<= {MOONSHOT_P99_MS:g} ms",
        "rule": f"met when a row has >= {MOONSHOT_CAMERAS} cameras, its slowest stream at "
        f">= {LIVE_SHARE:.0%} of {FPS} fps and frame-age p99 <= {MOONSHOT_P99_MS:g} ms; "
        "judged only where a GPU ran it (NVML found one, the model got CUDA or TensorRT)",
    }
    if not (gpu.present and any(r.on_gpu for r in measured)):
        return {**verdict, "met": None, "why": NOT_ON_GPU}
    meeting = [f"{r.count}x{r.hwaccel}" for r in measured if r.on_gpu and r.meets_moonshot]
    return {**verdict, "met": bool(meeting), "rows_meeting": meeting}


def metrics_of(rows: dict[str, Row | str], verdict: dict[str, Any]) -> dict[str, Any]:
    """The results file's metrics: each row's figures keyed "<count>x<hwaccel>.<figure>"."""
    metrics: dict[str, Any] = {}
    for key, row in rows.items():
        if isinstance(row, str):
            metrics[f"{key}.failed"] = row
            continue
        metrics[f"{key}.fps_sum"] = round(row.fps_sum, 1)
        metrics[f"{key}.fps_min_stream"] = round(row.fps_min_stream, 1)
        metrics[f"{key}.age_p99_ms"] = round(row.age_p99_ms, 1)
        metrics[f"{key}.gpu_util_pct"] = row.gpu_util_pct
        metrics[f"{key}.gpu_mem_mib"] = row.gpu_mem_mib
        metrics[f"{key}.cpu_ms_per_frame"] = round(row.cpu_ms_per_frame, 2)
        metrics[f"{key}.providers"] = ",".join(row.providers)
        metrics[f"{key}.decoders"] = ", ".join(f"{n} {d}" for d, n in row.decoders.items())
        if row.decoder_problems:
            metrics[f"{key}.decoder_problems"] = "; ".join(row.decoder_problems)
    met = verdict["met"]
    metrics["moonshot"] = verdict.get("why") or ("met" if met else "not met")
    return metrics


class OutOfTime(BaseException):
    """SIGTERM (`timeout` in bench/gpu_check.sh): end the sweep, report the rows so far."""


def out_of_time(_signum: int, _frame: object) -> None:
    raise OutOfTime


def main() -> None:
    parser = bench_parser((__doc__ or "").splitlines()[0])
    parser.add_argument("--counts", help="camera counts, comma-separated (default 8,16,32,64)")
    parser.add_argument("--hwaccel", default="none,cuda", help="source.decoder.hwaccel values")
    parser.add_argument("--seconds", type=float, help="measured window, s (default 10; quick 3)")
    parser.add_argument("--workers", type=int, default=1, help="1: an in-process Runtime")
    args = parser.parse_args()
    if args.workers != 1:
        parser.error("--workers: only 1 (an in-process Runtime) in this version")
    text = args.counts or ("1,2" if args.quick else "8,16,32,64")
    counts = [int(c) for c in text.split(",") if c.strip().isdigit() and int(c) > 0]
    if len(counts) != len(text.split(",")):
        parser.error(f"--counts {text!r}: expected positive whole numbers, e.g. 8,16,32,64")
    hwaccels = args.hwaccel.split(",")
    if unknown := [h for h in hwaccels if h not in get_args(HWAccelName)]:
        parser.error(f"--hwaccel: {unknown} (known: {', '.join(get_args(HWAccelName))})")
    timing = (1.0 if args.quick else 3.0, args.seconds or (3.0 if args.quick else 10.0))
    gpu = Gpu()
    print(f"device: {gpu.name}{f' ({gpu.why})' if gpu.why else ''}", flush=True)
    clip = scaled_clip(WIDTH, HEIGHT, FPS)
    rows = sweep(counts, hwaccels, clip, gpu, timing)
    verdict = moonshot(rows, gpu)
    report(
        "gpu_acceptance",
        metrics_of(rows, verdict),
        {"moonshot": verdict["target"] + " (judged only on a GPU)"},
        {} if verdict["met"] is None else {"moonshot": verdict["met"]},
        method=how(counts, hwaccels, timing, clip),
        verdicts={"moonshot": verdict},
        device=gpu.name,
    )


def sweep(
    counts: list[int], hwaccels: list[str], clip: Path, gpu: Gpu, timing: tuple[float, float]
) -> dict[str, Row | str]:
    """Every count × hwaccel, counts ascending; a row that fails is recorded with why and
    the sweep goes on; SIGTERM ends it with the rows so far."""
    rows: dict[str, Row | str] = {}
    key = ""
    signal.signal(signal.SIGTERM, out_of_time)
    try:
        for count in counts:
            for hwaccel in hwaccels:
                key = f"{count}x{hwaccel}"
                try:
                    rows[key] = measure(count, hwaccel, clip, gpu, timing)
                except Exception as exc:
                    rows[key] = f"{type(exc).__name__}: {exc}"
                print(f"{key:>10}: {describe(rows[key])}", flush=True)
    except OutOfTime:
        print("SIGTERM: out of time, reporting the rows so far", flush=True)
        if key and key not in rows:
            rows[key] = "stopped by SIGTERM (out of time) during its window"
    return rows


def how(
    counts: list[int], hwaccels: list[str], timing: tuple[float, float], clip: Path
) -> dict[str, Any]:
    """The results file's `method`: an absolute check, one window per row, no baseline."""
    return method(
        f"N {WIDTH}x{HEIGHT} {FPS} fps cameras ({clip.name}, pace realtime, loop) through "
        "detect (person detector, providers cuda then cpu, batched across streams) + track, "
        "profiling on; an in-process Runtime per row",
        [f"hwaccel {h}" for h in hwaccels],
        1,
        f"per count in {counts} and hwaccel: a fresh Runtime, {timing[0]:g} s after every "
        f"stream's first result, a {timing[1]:g} s window",
        order="counts ascending, each count's hwaccel values in the order given",
        figure="the window's own figures: no baseline, so no ratio",
        interval="none: one window per row",
        verdict="the moonshot is an absolute check, judged only where a GPU ran it",
    )


if __name__ == "__main__":
    main()
