"""Scaling across processes: `appliance serve` (one process) vs `serve --workers 2`.

The same config in both: STREAMS live cameras (the demo clip played in real time, 15
fps each, more than this machine's detector keeps up with), each running the person
detector, batched across its process's streams. Each arm is a real `appliance serve`
child; after warm-up, the total processed fps over a window is the sum of every
stream's `frames_processed` delta (read through the API: the gateway's merged answer
for the workers) over the window's wall time. CPU use of the whole process tree is
read from /proc over the same window.

The arms alternate in one run, the order rotating each round (1 process first, then
the workers first: bench/_compare.py), each arm a fresh `serve` child, so alternation is
across processes; the machine's fast and slow spells fall on both. Per round the ratio
workers ÷ one process; the figure is the median of the rounds' ratios with a bootstrap
95 % interval, the target met only by the interval's lower bound (min and max beside it).
On a 2-core machine one process already keeps both cores busy (ONNX Runtime's intra-op
threads and FFmpeg's decode run outside the GIL), so the gain is expected where cores
outnumber what one interpreter can feed: run it on a big machine (bench/gpu_check.sh).

    python bench/workers.py [--quick] [--rounds N] [--seconds S] [--streams K] [--workers N]
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from bench._common import ROOT, bench_parser, report, serve_argv, tree_cpu_s
from bench._compare import judge, method, ratios, rotations
from tests.support.clock_camera import DEMO_CLIP
from tests.support.processes import free_port

# 2 workers / 1 process on this 2-core machine: more, even here. Each worker's models take
# its share of the cores (models.session.share_cores): with one ORT thread per core in
# each process they fought over the cores and 2 workers ran at 0.73x.
TARGET = 1.05


def config(streams: int, tmp: Path) -> dict[str, Any]:
    providers = json.loads(os.environ.get("BENCH_PROVIDERS", '["cpu"]'))
    workflow = {
        "name": "people",
        "blocks": [{"id": "people", "type": "detect", "model": "person", "confidence": 0.4}],
        "outputs": {"people": "people"},
    }
    return {
        "profiling": {"dir": str(tmp / "traces")},
        "models": {
            "person": {
                "path": str(ROOT / "configs/models/person_ssdlite.onnx"),
                "decoder": "tf_od", "labels": ["person"], "providers": providers,
                "batching": {"max_batch_size": 8, "max_queue_delay_ms": 2},
            }
        },
        "streams": [
            {"id": f"cam{i}", "source": {"url": str(DEMO_CLIP), "pace": "realtime"},
             "workflow": workflow}
            for i in range(streams)
        ],
    }  # fmt: skip


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def processed(url: str) -> int:
    return sum(s["frames_processed"] for s in get(url + "/v1/streams")["streams"])


def run_arm(
    cfg_path: Path, workers: int, warmup: float, seconds: float, log: Path
) -> dict[str, float]:
    port = free_port()
    argv = serve_argv(cfg_path, port, workers)
    url = f"http://127.0.0.1:{port}"
    with log.open("a") as out:
        child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if get(url + "/ready")["ready"]:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or child.poll() is not None:
                raise RuntimeError(f"appliance did not get ready: {log.read_text()[-1500:]}")
            time.sleep(0.2)
        time.sleep(warmup)
        f0, c0, t0 = processed(url), tree_cpu_s(child.pid), time.monotonic()
        time.sleep(seconds)
        f1, c1, t1 = processed(url), tree_cpu_s(child.pid), time.monotonic()
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    wall = t1 - t0
    return {"fps": (f1 - f0) / wall, "cores": (c1 - c0) / wall}


def main() -> None:
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rounds, seconds, warmup = (2, 4.0, 2.0) if args.quick else (args.rounds, args.seconds, 4.0)
    n = args.workers
    arms = {"1 process": 1, f"{n} workers": n}
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp_name:
        tmp = Path(tmp_name)
        cfg_path = tmp / "config.yaml"
        cfg_path.write_text(json.dumps(config(args.streams, tmp)))
        log = tmp / "serve.log"
        got: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
        for r, order in enumerate(rotations(list(arms), rounds)):
            for arm in order:
                got[arm].append(run_arm(cfg_path, arms[arm], warmup, seconds, log))
                print(f"round {r + 1}: {arm}: {got[arm][-1]['fps']:.1f} fps, "
                      f"{got[arm][-1]['cores']:.2f} cores", flush=True)  # fmt: skip
    one, many = got["1 process"], got[f"{n} workers"]
    per_round = ratios([b["fps"] for b in many], [a["fps"] for a in one])
    verdict = judge(per_round, at_least=TARGET)
    metrics: dict[str, Any] = {
        "streams": args.streams, "workers": n, "rounds": rounds, "cores": os.cpu_count(),
        "fps_1_process_median": statistics.median(a["fps"] for a in one),
        f"fps_{n}_workers_median": statistics.median(b["fps"] for b in many),
        "cores_busy_1_process": statistics.median(a["cores"] for a in one),
        f"cores_busy_{n}_workers": statistics.median(b["cores"] for b in many),
        "fps_ratio_median": statistics.median(per_round),
        "fps_ratio_min": min(per_round), "fps_ratio_max": max(per_round),
        "round_ratios": [round(r, 3) for r in per_round],
    }  # fmt: skip
    targets = {
        "fps_ratio_median": f">= {TARGET} (95 % interval's lower bound; 2 cores, overloaded)"
    }
    how = method(
        f"total processed fps of `appliance serve --workers {n}` against one `serve` "
        f"process, {args.streams} realtime cameras on the person detector",
        list(arms),
        rounds,
        f"one `serve` child per arm: ready, {warmup:g} s warm-up, then {seconds:g} s in "
        "which every stream's frames_processed delta (the API's merged answer) is summed; "
        "each arm a fresh process, so alternation is across processes",
        baseline="1 process",
    )
    report(
        "workers",
        metrics,
        targets,
        {"fps_ratio_median": verdict.met},
        method=how,
        verdicts={"fps_ratio_median": verdict.as_json()},
    )


if __name__ == "__main__":
    main()
