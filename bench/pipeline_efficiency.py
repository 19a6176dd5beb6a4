"""Engine efficiency: appliance fps ÷ a bare pipeline's fps on the same work.

One stream, the bundled clip as a file source with `pace: fast` (every frame, no drops),
the person detector. The bare pipeline has the appliance's shape, written by hand: a
decode thread (PyAV, BGR) handing each frame over through a one-slot queue to the main
thread, which preprocesses, runs `session.run` and decodes the detections. So the ratio
measures what the engine adds (workflow, slot, batcher thread, metrics, tracing), not
the gain from decoding in parallel. Both run back to back in this process, in
alternating order. The verdict is taken from the lower quartile of the per-round ratios,
so that one lucky round cannot carry it. Target ≥ 0.95.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

import numpy as np
from _common import ROOT, detect_stream_config, parse_args, report

from appliance.config import AppConfig
from appliance.models import load_model
from appliance.runtime import Runtime
from pipelines.decoders import build_decoder
from pipelines.decoders.base import DecodeOptions

CLIP = ROOT / "configs" / "media" / "demo.mp4"
MODEL = ROOT / "configs" / "models" / "person_ssdlite.onnx"


def config() -> AppConfig:
    model = {"path": str(MODEL), "decoder": "tf_od", "labels": ["person"]}
    source = {"url": str(CLIP), "pace": "fast", "loop": True}
    return detect_stream_config("person", model, "bench", source)


def appliance_fps(frames: int) -> float:
    runtime = Runtime(config(), max_frames=frames)
    runtime.start()
    try:
        if not runtime.wait_done(timeout=600):
            raise SystemExit("appliance run did not finish")
    finally:
        runtime.stop()
    return runtime.streams["bench"].rate.overall()


def bare_fps(frames: int) -> float:
    import queue
    import threading

    import av

    cfg = config()
    loaded = load_model("person", cfg.models["person"], cfg.resolve)
    decoder = build_decoder(loaded.info, DecodeOptions())
    run, names, inp = loaded.session.run, loaded.output_names, loaded.input_name
    slot: queue.Queue[Any] = queue.Queue(maxsize=1)  # the one-slot hand-off, blocking
    stop = threading.Event()

    def decode() -> None:
        while not stop.is_set():
            with av.open(str(CLIP)) as container:
                for frame in container.decode(video=0):
                    slot.put(frame.to_ndarray(format="bgr24"))
                    if stop.is_set():
                        return

    thread = threading.Thread(target=decode, name="bare-decode", daemon=True)
    thread.start()
    start = 0.0
    for done in range(frames):
        image = slot.get()
        sample, transform = decoder.preprocess(image)
        outputs = run(names, {inp: sample[None]})
        decoder.decode([o[0] for o in outputs], transform)
        if done == 0:
            start = time.perf_counter()  # same convention as RateMeter: first to last
    elapsed = time.perf_counter() - start
    stop.set()
    with contextlib.suppress(queue.Empty):
        slot.get_nowait()  # unblock a decoder waiting to put
    thread.join(10)
    return (frames - 1) / elapsed


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    frames, rounds = (150, 4) if args.quick else (400, 8)
    bare, app = [], []
    for i in range(rounds):
        runs = (bare_fps, appliance_fps) if i % 2 == 0 else (appliance_fps, bare_fps)
        got = {f: f(frames) for f in runs}
        bare.append(got[bare_fps])
        app.append(got[appliance_fps])
        print(f"round {i + 1}: bare {bare[-1]:.1f} fps, appliance {app[-1]:.1f} fps")
    ratios = sorted(a / b for a, b in zip(app, bare, strict=True))
    lower_quartile = float(np.percentile(ratios, 25))
    metrics = {
        "bare_fps_median": round(statistics.median(bare), 2),
        "appliance_fps_median": round(statistics.median(app), 2),
        "efficiency": round(statistics.median(ratios), 3),
        "efficiency_lower_quartile": round(lower_quartile, 3),
        "efficiency.range": f"{ratios[0]:.3f}-{ratios[-1]:.3f}",
        "frames_per_run": frames,
        "rounds": rounds,
    }
    met = {"efficiency_lower_quartile": lower_quartile >= 0.95}
    report("pipeline_efficiency", metrics, {"efficiency_lower_quartile": ">= 0.95"}, met)


if __name__ == "__main__":
    main()
