"""Engine efficiency: appliance fps ÷ a bare pipeline's fps on the same work.

One stream, the bundled clip as a file source with `pace: fast` (every frame, no drops),
the person detector. The bare pipeline has the appliance's shape, written by hand: a
decode thread (PyAV, BGR) handing each frame over through a one-slot queue to the main
thread, which preprocesses, runs `session.run` and decodes the detections. So the ratio
measures what the engine adds (workflow, slot, batcher thread, metrics, tracing), not
the gain from decoding in parallel.

The two arms (`bare`, `appliance`: a fresh Runtime, or a fresh session, per run of N
frames) alternate round by round in this process, the order rotated each round
(bench/_compare.py). Per round: appliance fps ÷ the same round's bare fps; the verdict
takes the median's bootstrap 95 % interval: met when its lower bound is >= 0.95.

    python bench/pipeline_efficiency.py [--quick]   # quick: 4 rounds of 150 frames;
                                                     # full: 15 rounds of 400 frames
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

from _common import ROOT, detect_stream_config, parse_args, report_judged
from _compare import alternate, judge, method, ratios

from appliance.config import AppConfig
from appliance.models import load_model
from appliance.runtime.runtime import Runtime
from pipelines.decoders import build_decoder
from pipelines.decoders.base import DecodeOptions

CLIP = ROOT / "configs" / "media" / "demo.mp4"
MODEL = ROOT / "configs" / "models" / "person_ssdlite.onnx"
TARGET = 0.95  # the engine may cost at most 5 % of a bare pipeline's throughput


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
    frames, rounds = (150, 4) if args.quick else (400, 15)
    arms = {"bare": lambda: bare_fps(frames), "appliance": lambda: appliance_fps(frames)}

    def progress(r: int, fps: dict[str, list[float]]) -> None:
        shown = ", ".join(f"{name} {values[-1]:.1f} fps" for name, values in fps.items())
        print(f"round {r + 1}/{rounds}: {shown}", flush=True)

    fps = alternate(arms, rounds, progress)
    efficiency = judge(ratios(fps["appliance"], fps["bare"]), at_least=TARGET)
    metrics = {
        "efficiency": round(efficiency.median, 3),
        "efficiency.interval": f"{efficiency.low:.3f}-{efficiency.high:.3f}",
        "bare_fps_median": round(statistics.median(fps["bare"]), 2),
        "appliance_fps_median": round(statistics.median(fps["appliance"]), 2),
        "frames_per_run": frames,
        "rounds": rounds,
    }
    how = method(
        f"one stream of {CLIP.name} (pace: fast, every frame) through the person detector, "
        f"{frames} frames per run: `appliance` is a fresh Runtime (detect block, unbatched); "
        "`bare` a hand-written decode thread + one-slot queue + preprocess/session.run/"
        "decode on the main thread over a fresh session; fps from the first to the last "
        "frame of the run",
        list(arms), rounds, f"each arm processes {frames} frames",
        ratio="appliance fps ÷ the same round's bare fps",
    )  # fmt: skip
    report_judged("pipeline_efficiency", metrics, {"efficiency": efficiency}, how)


if __name__ == "__main__":
    main()
