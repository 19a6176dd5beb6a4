"""What decoding alone holds per stream: FFmpeg's decoder, and the BGR frames made from it.

N decoder threads (1 and 9), each reading the demo clip (960x540 H.264, 15 fps) with
PyAV as the appliance's file source opens it (slice threads, FFmpeg's thread count),
paced at 15 fps and looping, each keeping its newest frame as a stream's one-frame slot
does. Arms, each a fresh child process per count: `frames`, every frame converted to a
BGR array (`to_ndarray(format="bgr24")`, as the source does); `decoder`, the decoded
frames kept as FFmpeg's own (no conversion); `trim`, as `frames` with glibc's
`malloc_trim(0)` every 2 s (what a periodic trim would give back). After SECONDS, the
child's RSS; per round, the MB per extra decoder is (RSS at 9 - RSS at 1) / 8. The
arms and counts run in a rotated order each round; the figure is the median of the
rounds' values with its bootstrap 95 % interval (bench/_compare.py). Reported, not
judged: it splits bench/memory.py's `bare` stream (source, threads and slot) into the
decoder, its frames and the rest.

    python bench/decode_memory.py [--quick] [--rounds R] [--seconds S]
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import ROOT, bench_parser, report
from bench._compare import judge, method, rotations

CLIP = ROOT / "configs" / "media" / "demo.mp4"
FPS = 15.0  # the clip's own rate: a live camera's pace
COUNTS = (1, 9)
ARMS = ("frames", "decoder", "trim")
TRIM_EVERY_S = 2.0


def decode_loop(index: int, keep: list[Any], convert: bool, stop: threading.Event) -> None:
    """Decode the clip at FPS until `stop`, keeping the newest frame in keep[index]."""
    import av

    while not stop.is_set():
        with av.open(str(CLIP)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "SLICE"  # as appliance/sources/pyav.py
            start, count = time.perf_counter(), 0
            for packet in container.demux(stream):
                for frame in stream.decode(packet):
                    keep[index] = frame.to_ndarray(format="bgr24") if convert else frame
                    count += 1
                    time.sleep(max(0.0, start + count / FPS - time.perf_counter()))
                if stop.is_set():
                    break


def child(decoders: int, arm: str, seconds: float) -> dict[str, float]:
    import psutil

    keep: list[Any] = [None] * decoders
    stop = threading.Event()
    threads = [
        threading.Thread(target=decode_loop, args=(i, keep, arm != "decoder", stop), name=f"d{i}")
        for i in range(decoders)
    ]
    for thread in threads:
        thread.start()
    end = time.monotonic() + seconds
    libc = ctypes.CDLL("libc.so.6") if arm == "trim" else None
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(TRIM_EVERY_S, left))
        if libc is not None:
            libc.malloc_trim(0)
    rss = psutil.Process().memory_info().rss / 2**20
    stop.set()
    for thread in threads:
        thread.join()
    return {"rss_mb": rss}


def run(decoders: int, arm: str, seconds: float) -> float:
    argv = [sys.executable, __file__, "--child", f"{decoders}:{arm}", "--seconds", str(seconds)]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=seconds + 60)
    if done.returncode != 0:
        raise RuntimeError(f"decode_memory child failed: {done.stderr[-1500:]}")
    got: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return got["rss_mb"]


def main() -> None:
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--child", help="N:ARM (internal)")
    args = parser.parse_args()
    if args.child:
        decoders, _, arm = args.child.partition(":")
        print(json.dumps(child(int(decoders), arm, args.seconds)), flush=True)
        return
    rounds, seconds = (1, 6.0) if args.quick else (args.rounds, args.seconds)
    rss: dict[str, list[float]] = {f"{a}.n{n}": [] for a in ARMS for n in COUNTS}
    for r, order in enumerate(rotations([f"{a}.n{n}" for a in ARMS for n in COUNTS], rounds)):
        for key in order:
            arm, _, n = key.partition(".n")
            rss[key].append(run(int(n), arm, seconds))
            print(f"round {r + 1}/{rounds} {key}: {rss[key][-1]:.0f} MB", flush=True)
    metrics: dict[str, Any] = {}
    extra = COUNTS[-1] - COUNTS[0]
    for arm in ARMS:
        per = [(hi - lo) / extra for lo, hi in zip(rss[f"{arm}.n1"], rss[f"{arm}.n9"], strict=True)]
        verdict = judge(per)
        metrics[f"{arm}.mb_per_decoder"] = round(verdict.median, 1)
        metrics[f"{arm}.mb_per_decoder.interval"] = f"{verdict.low:.1f}-{verdict.high:.1f}"
        for count in COUNTS:
            values = sorted(rss[f"{arm}.n{count}"])
            metrics[f"{arm}.n{count}.rss_mb"] = round(values[len(values) // 2], 1)
    how = method(
        "RSS per extra PyAV decoder thread on the demo clip at 15 fps, newest frame kept",
        list(rss), rounds, f"a fresh child per arm and count, its RSS after {seconds:g} s",
        figure="median of the rounds' (RSS at 9 - RSS at 1) / 8",
    )  # fmt: skip
    report("decode_memory", metrics, {}, {}, method=how)


if __name__ == "__main__":
    main()
