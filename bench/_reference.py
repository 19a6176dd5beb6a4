"""The pipeline children of bench/freshness.py: the reference, ours, and what they share.

    bench/.work/reference-venv/bin/python bench/_reference.py ref[-count] SPEC_JSON
    .venv/bin/python bench/_reference.py ours[-count] SPEC_JSON

`ref` runs Roboflow's InferencePipeline (the package `streamvision` 0.1.3: the pipeline
that `inference` 1.8.3 subclasses) in a bench-only environment with `onnxruntime`
1.31.1, never a dependency of the appliance. Its custom logic is what a user would write:
one plain `ort.InferenceSession` (ORT's defaults, CPU), and for each round of frames (one
per source) our own model pre- and post-processing (`pipelines.decoders`, which needs
only numpy and OpenCV), one batched `session.run`, then our decoder. `ours` runs the
appliance's `Runtime` with the same model, CPU provider and decoder, results taken from
`outputs.subscribe`. So both pay the same model cost; what differs is the pipeline:
reading, decoding, buffering, threads.

Both print one line per result on stdout (`Recorder`; with `-count`, a running count
instead: `Counter`, for bench/ceiling.py) and stop when stdin closes; the
bench reads them (`Child`, `Record`). Each line dates, besides the result, the moment the
frame was decoded and ready for the pipeline (post-decode): for ours the grabber's decode
end (`stamp_our_decodes`), for the reference the moment its `VideoFrame` was built, right
after `retrieve()` (`stamp_reference_decodes`). The reference's own `frame_timestamp` is
not that moment: streamvision 0.1.3 takes it *before* `grab()` (video_source.py,
`consume_frame`), which on a live source waits for the frame's data and decodes it
(OpenCV's FFmpeg backend decodes in `grab`), so it is printed too, as what it is. Only
the standard library and numpy are imported at the top: both environments import this.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np

# Run as a script (also in the reference's venv): the repo root first on the path, for
# `tests.support` and, in our child, the appliance's packages.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.clock_camera import read_stamp  # noqa: E402

REFERENCE_PACKAGES = ("streamvision==0.1.3", "onnxruntime==1.31.1")
LOGS = ROOT / "bench" / ".work" / "freshness"  # children's stderr, one file per run
UNREADABLE = -1  # the stamp printed when a result's frame carries none
MISSING = "-"  # a time a pipeline does not have
STOP_TIMEOUT_S = 10.0
COUNT_EVERY_S = 0.25  # how often a counting child prints its count (`Counter`)
_PR_SET_PDEATHSIG = 1  # prctl(2): signal this process when its parent dies
_ORT_DTYPES = {"tensor(float)": "float32", "tensor(uint8)": "uint8"}


@dataclass(frozen=True)
class Spec:
    """What a child runs: one model on every URL, the same for both pipelines."""

    urls: list[str]
    model: str  # ONNX file
    decoder: str  # pipelines.decoders kind
    input_size: list[int] | None  # (width, height) the preprocessor resizes to
    labels: list[str]
    confidence: float
    max_batch: int  # the appliance batches up to this many samples across streams

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Spec:
        return cls(**json.loads(text))


class Record(NamedTuple):
    """One result line of a child (see bench/_reference.py's Recorder); wall times, s."""

    source: int
    stamp: int
    at: float  # the result reached the sink
    start: float  # the model step began on its frame
    done: float  # ... and ended
    decoded: float | None  # the frame arrived (ours only): its capture time, before decoding
    ready: float | None = None  # the frame was decoded, ready for the pipeline (both)
    frame_ts: float | None = None  # the reference's VideoFrame.frame_timestamp (ref only)

    @classmethod
    def parse(cls, line: str) -> Record | None:
        parts = line.split()
        if len(parts) != 9 or parts[0] != "R":
            return None  # a stray line (a library printing on stdout)
        at, start, done = (float(p) for p in parts[3:6])
        decoded, ready, frame_ts = (None if p == MISSING else float(p) for p in parts[6:])
        return cls(int(parts[1]), int(parts[2]), at, start, done, decoded, ready, frame_ts)


@dataclass
class Child:
    """A pipeline child process; a thread collects its result lines."""

    process: subprocess.Popen[str]
    records: list[Record] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # lines that are no Record
    first: dict[int, threading.Event] = field(default_factory=dict)

    reader: threading.Thread | None = None

    def start_reading(self, streams: int) -> None:
        self.first = {i: threading.Event() for i in range(streams)}
        self.reader = threading.Thread(target=self._read, name="child-reader", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            record = Record.parse(line)
            if record is None:
                self.other.append(line.strip())
            else:
                self.records.append(record)
                if record.source in self.first:
                    self.first[record.source].set()

    def wait_first_results(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for event in self.first.values():
            while not event.wait(0.2):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    return False
        return True

    def stop(self) -> None:
        """Close stdin (the child's signal to stop), then kill if it lingers."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)
        if self.reader is not None:
            self.reader.join(STOP_TIMEOUT_S)  # its last lines (summaries) are read


class Recorder:
    """Prints one line per result, called from pipeline threads:

        R SOURCE STAMP RESULT_TIME START DONE DECODED READY FRAME_TS

    wall times (s): the result reached the sink, the model step started and ended on the
    frame, (ours only) the frame arrived: its capture time, the arrival of its last
    packet, before decoding; the frame was decoded and ready for the pipeline; (ref
    only) its `frame_timestamp`. `-` where a pipeline has no such time. The result time
    is taken first, so reading the stamp is not part of the latency.
    """

    def __init__(self, out: IO[str] = sys.stdout) -> None:
        self._out = out
        self._lock = threading.Lock()

    def __call__(
        self,
        source: int,
        image: Any,
        start: float,
        done: float,
        decoded: float | None = None,
        ready: float | None = None,
        frame_ts: float | None = None,
    ) -> None:
        now = time.time()
        stamp = read_stamp(image)
        line = f"R {source} {UNREADABLE if stamp is None else stamp} {now:.6f}"
        line += f" {start:.6f} {done:.6f}"
        times = (decoded, ready, frame_ts)
        line += " " + " ".join(MISSING if t is None else f"{t:.6f}" for t in times)
        with self._lock:
            self._out.write(line + "\n")
            self._out.flush()


class Counter:
    """Counts results instead of printing each (bench/ceiling.py: hundreds a second, where
    a line per result would cost the child what is being measured). A thread prints

        C MONOTONIC COUNT

    every COUNT_EVERY_S: CLOCK_MONOTONIC seconds (the same clock in every process) and the
    results so far, every source together. Called like `Recorder`."""

    def __init__(self, out: IO[str] = sys.stdout) -> None:
        self._out = out
        self.count = 0  # one writer at a time: the lock
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._print, name="counter", daemon=True)
        self._thread.start()

    def __call__(self, source: int, image: Any, *_times: float | None, **_named: Any) -> None:
        with self._lock:
            self.count += 1

    def _print(self) -> None:
        while True:  # a daemon thread: ends with the child
            self._out.write(f"C {time.monotonic():.6f} {self.count}\n")
            self._out.flush()
            time.sleep(COUNT_EVERY_S)


def die_with_parent() -> None:
    """SIGTERM this process when the bench exits, however it exits (no orphaned runs)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def wait_for_stdin_eof() -> None:
    """Block until the parent closes our stdin: its signal to stop."""
    for _ in sys.stdin:
        pass


def model_info(session: Any, spec: Spec) -> Any:
    """The `pipelines.models.ModelInfo` of a plain ORT session, as our decoders need it."""
    from pipelines.models import ModelInfo, TensorInfo

    def tensors(args: Sequence[Any]) -> tuple[TensorInfo, ...]:
        return tuple(
            TensorInfo(
                a.name,
                tuple(d if isinstance(d, int) else None for d in a.shape),
                _ORT_DTYPES.get(a.type, "float32"),
            )
            for a in args
        )

    size = (spec.input_size[0], spec.input_size[1]) if spec.input_size else None
    return ModelInfo(
        id="model",
        path=spec.model,
        inputs=tensors(session.get_inputs()),
        outputs=tensors(session.get_outputs()),
        decoder=spec.decoder,
        labels=tuple(spec.labels),
        input_size=size,
    )


def stamp_reference_decodes() -> None:
    """Date each of the reference's frames when its `VideoFrame` is built: right after
    `retrieve()`, the frame decoded and ready (`decoded_at`, wall s). Its only
    constructor is `decode_video_frame_to_buffer` in streamvision.camera.video_source,
    which looks the class up there at each call; the stamp is one time.time() more."""
    from dataclasses import dataclass as _dataclass
    from dataclasses import field as _field

    from streamvision.camera import video_source  # type: ignore[import-not-found]

    @_dataclass(frozen=True)
    class StampedVideoFrame(video_source.VideoFrame):  # type: ignore[misc]
        decoded_at: float = _field(default_factory=time.time)

    video_source.VideoFrame = StampedVideoFrame


def stamp_our_decodes() -> dict[tuple[str, int], float]:
    """(stream id, frame seq) -> perf_counter s when the grabber finished decoding that
    frame: the `end` it hands the profiler's hook (`StreamTrace.grabbed`, called for every
    frame, sampled or not, just before the frame goes to the worker's slot), the one
    place the appliance dates a decoded frame. Wrapped in this child only; call before
    the Runtime is built (its streams bind the hook then)."""
    from appliance.profiling.hooks import StreamTrace

    decoded: dict[tuple[str, int], float] = {}
    grabbed = StreamTrace.grabbed

    def stamped(trace: StreamTrace, seq: int, start: float, received: float, end: float) -> None:
        decoded[(trace.stream_id, seq)] = end  # a dict store: atomic, one grabber per key
        grabbed(trace, seq, start, received, end)

    StreamTrace.grabbed = stamped  # type: ignore[method-assign,assignment]
    return decoded


def run_reference(spec: Spec, record: Recorder | Counter) -> None:
    """InferencePipeline over `spec.urls` until stdin closes."""
    import onnxruntime as ort
    from streamvision.stream.pipeline import InferencePipeline  # type: ignore[import-not-found]

    from pipelines.decoders import DecodeOptions, build_decoder

    stamp_reference_decodes()
    session = ort.InferenceSession(spec.model, providers=["CPUExecutionProvider"])
    decoder = build_decoder(model_info(session, spec), DecodeOptions(spec.confidence))
    input_name = session.get_inputs()[0].name

    def on_video_frame(frames: list[Any]) -> list[Any]:
        start = time.time()
        prepared = [decoder.preprocess(f.image) for f in frames]
        outputs = session.run(None, {input_name: np.stack([s for s, _ in prepared])})
        found = [decoder.decode([o[i] for o in outputs], t) for i, (_, t) in enumerate(prepared)]
        done = time.time()
        return [(dets, start, done) for dets in found]

    def on_prediction(predictions: Any, frames: Any) -> None:
        # One source: called per frame; several: with lists aligned to the sources.
        if not isinstance(frames, list):
            predictions, frames = [predictions], [frames]
        for prediction, frame in zip(predictions, frames, strict=True):
            if frame is not None:
                _, start, done = prediction
                ready = getattr(frame, "decoded_at", None)
                frame_ts = frame.frame_timestamp.timestamp()  # naive local time -> epoch s
                source = frame.source_id or 0
                record(source, frame.image, start, done, ready=ready, frame_ts=frame_ts)

    pipeline = InferencePipeline.init_with_custom_logic(
        video_reference=spec.urls if len(spec.urls) > 1 else spec.urls[0],
        on_video_frame=on_video_frame,
        on_prediction=on_prediction,
    )
    pipeline.start(use_main_thread=False)
    wait_for_stdin_eof()
    pipeline.terminate()
    pipeline.join()


def run_ours(spec: Spec, record: Recorder | Counter) -> None:
    """The appliance's Runtime over `spec.urls` until stdin closes."""
    from appliance.runtime.runtime import Runtime
    from bench._common import detect_streams_config
    from pipelines.types import FrameResult

    model: dict[str, Any] = {
        "path": spec.model,
        "decoder": spec.decoder,
        "labels": spec.labels,
        "input_size": spec.input_size,
        # The reference runs ORT's CPU build: compare like with like (a GPU run sets
        # BENCH_PROVIDERS, bench/gpu_check.sh).
        "providers": json.loads(os.environ.get("BENCH_PROVIDERS", '["cpu"]')),
        "session": json.loads(os.environ.get("BENCH_SESSION", "{}")),  # experiments
        # Several streams: batch across them like the shipped workflows (2 ms wait).
        "batching": {"max_batch_size": spec.max_batch, "max_queue_delay_ms": 2}
        if spec.max_batch > 1
        else {"max_batch_size": 1, "max_queue_delay_ms": 0},
    }
    extra = json.loads(os.environ.get("BENCH_SOURCE", "{}"))  # experiments: reader, ...
    sources = {f"s{i}": {"url": url, **extra} for i, url in enumerate(spec.urls)}
    config = detect_streams_config("detect", model, sources, confidence=spec.confidence)
    # Profiling stays on (the product's default); its rolling traces go with the logs.
    traces = config.profiling.model_copy(update={"dir": LOGS / "traces"})
    config = config.model_copy(update={"profiling": traces})
    decodes = stamp_our_decodes()
    runtime = Runtime(config)

    def on_result(result: FrameResult) -> None:
        decoded = result.capture_time  # wall clock; the spans below are on perf_counter
        start = decoded + result.start_mono - result.capture_mono
        done = decoded + result.done_mono - result.capture_mono
        end = decodes.pop((result.stream_id, result.seq), None)
        ready = None if end is None else decoded + end - result.capture_mono
        record(int(result.stream_id[1:]), result.image, start, done, decoded, ready)

    runtime.subscribe(on_result)
    runtime.start()
    try:
        wait_for_stdin_eof()
        # The batcher's totals, for the mean batch size: "B BATCHES SAMPLES".
        (detect,) = runtime.models_status()
        print(f"B {detect.batches} {detect.samples}", flush=True)
    finally:
        runtime.stop()


def main(argv: list[str]) -> int:
    die_with_parent()
    mode, _, counting = argv[0].partition("-")  # "ref", "ours"; "-count": Counter
    run = {"ref": run_reference, "ours": run_ours}[mode]
    run(Spec.from_json(argv[1]), Counter() if counting == "count" else Recorder())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
