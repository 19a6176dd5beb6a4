"""Engine efficiency: appliance fps ÷ a bare loop's fps on the same work.

One stream, the bundled clip as a file source with `pace: fast` (every frame, no drops),
the person detector. The bare loop is what a user would write by hand: PyAV decode, the
same preprocessing, `session.run`. Both run back to back in this process, alternating; the
efficiency is the median over rounds of each round's appliance/bare ratio, so that drift
of a noisy shared machine cancels within a round. Target ≥ 0.95.
"""

from __future__ import annotations

import time

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
    import av

    cfg = config()
    loaded = load_model("person", cfg.models["person"], cfg.resolve)
    decoder = build_decoder(loaded.info, DecodeOptions())
    run, names, inp = loaded.session.run, loaded.output_names, loaded.input_name
    done, start = 0, 0.0
    while done < frames:
        with av.open(str(CLIP)) as container:
            for frame in container.decode(video=0):
                image = frame.to_ndarray(format="bgr24")
                sample, _ = decoder.preprocess(image)
                run(names, {inp: sample[None]})
                if done == 0:
                    start = time.perf_counter()  # same convention as RateMeter: first to last
                done += 1
                if done >= frames:
                    break
    return (done - 1) / (time.perf_counter() - start)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    frames, rounds = (150, 3) if args.quick else (400, 5)
    bare, app = [], []
    for i in range(rounds):
        bare.append(bare_fps(frames))
        app.append(appliance_fps(frames))
        print(f"round {i + 1}: bare {bare[-1]:.1f} fps, appliance {app[-1]:.1f} fps")
    ratios = sorted(a / b for a, b in zip(app, bare, strict=True))
    ratio = ratios[len(ratios) // 2]
    metrics = {
        "bare_fps_median": round(sorted(bare)[len(bare) // 2], 2),
        "appliance_fps_median": round(sorted(app)[len(app) // 2], 2),
        "efficiency": round(ratio, 3),
        "round_ratios": [round(r, 3) for r in ratios],
        "frames_per_run": frames,
        "rounds": rounds,
    }
    met = {"efficiency": ratio >= 0.95}
    report("pipeline_efficiency", metrics, {"efficiency": ">= 0.95"}, met)


if __name__ == "__main__":
    main()
