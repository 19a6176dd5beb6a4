"""The ceiling: how many frames one process carries when the model costs almost nothing.

On a GPU the model is fast, and what decides how many cameras one process carries is the
appliance's own work per frame in Python. A near-free model exposes that ceiling on any
machine: N streams (1, 4, 8, 16) of the bundled clip as 640x480 H.264 at `pace: fast`
(every frame, as fast as it goes) through one of the demo's workflows (`people`: the
people counter, `faces`: the privacy blur) with its model replaced by a near-free stand-in
of the same inputs and outputs (bench/_free_models.py: the real decoders run on
real-shaped outputs), every result to a real mosquitto (the MQTT sink), and one stream
watched by a WebRTC viewer (bench/_webrtc_viewer.py `count`: the appliance encodes its
annotated video as for any viewer). Arms, each a fresh child process per round:

- `bare`: the limit. The appliance's own grabbers and one-slot hand-offs, with worker
  threads that only take each frame (bench/_bare_decode.py). Nothing processes more.
- `appliance`: `appliance serve`, one process.
- `workers 2`: `appliance serve --workers 2` on the same config.
- `reference`: Roboflow's InferencePipeline (streamvision 0.1.3, bench/_reference.py
  `ref-count`, in bench/.work/reference-venv) on the same clip, one file per stream, with
  the same near-free model and our decoder in its custom logic: detection only (no
  tracking, counting, blur, annotation or sink), what a user would write. Its file
  sources are read whole, so the clip is looped into one long file for it.

Per arm: after the first frames and a warm-up, the processed frames/s over a window (the
API's `frames_processed` for serve; the children's result counts for the others) and the
busy cores (CPU seconds of the process tree over the window's wall time, psutil). Per
round, per N, the ratios appliance ÷ bare, appliance ÷ reference and workers 2 ÷
appliance; each figure is the median of the rounds' ratios with its bootstrap 95 %
interval (bench/_compare.py). Targets at 8 streams: appliance ÷ bare >= 0.8 and appliance
÷ reference >= 2 by the interval's lower bound; workers 2 ÷ appliance <= 1.10 by its
upper bound.

    python bench/ceiling.py [--quick] [--rounds R] [--counts 1,4,8,16] [--workflows people,faces]
    # quick: 8 streams, people, 1 round, short windows (under 60 s once the clip is made)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
import yaml

from bench._common import (
    ROOT,
    bench_parser,
    bench_venv,
    kept,
    mosquitto,
    report,
    scaled_clip,
    serve_argv,
    tree_cpu_s,
)
from bench._compare import Verdict, judge, method, ratios, rotations
from bench._free_models import free_centerface, free_tf_od
from bench._reference import REFERENCE_PACKAGES, Spec
from tests.support.processes import end_process, free_port

SIZE = (640, 480)
TOKEN = "bench-token"
ARMS = ("bare", "appliance", "workers 2", "reference")
# `--ablate`: the appliance arm less one part each, to say what each part costs it.
ABLATIONS = ("no viewer", "no sinks", "no profiling", "detect only")
WORKFLOWS = {  # demo workflow, its model id, the stand-in, decoder, labels
    "people": ("people_counter.yaml", "person", free_tf_od, "tf_od", ["person"]),
    "faces": ("privacy_blur.yaml", "faces", free_centerface, "centerface", ["face"]),
}
TARGETS = {"vs_bare": (0.8, None), "vs_reference": (2.0, None), "workers_ratio": (None, 1.10)}
JUDGED_AT = 8  # streams
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0  # a child's clean exit before it is killed
LOOPS = 60  # the reference's long clip: 60 x 16 s, more than any arm reads at 16 streams
VIEWER = ROOT / "bench" / "_webrtc_viewer.py"


@dataclass
class Setup:
    """What every round shares: the folder, the clips, the models, the broker."""

    folder: Path
    clip: Path
    long_clip: Path
    mqtt_port: int | None  # None: no mosquitto here (a lent GPU machine), no sink
    reference: Path | None  # the reference venv's python; None: its arm is left out
    warmup_s: float
    window_s: float
    models: dict[str, Path] = field(default_factory=dict)


# -- the children -----------------------------------------------------------------------
class Counts:
    """`C MONOTONIC COUNT` lines of a counting child, collected by a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.samples: list[tuple[float, int]] = []
        self.reader = threading.Thread(target=self._read, name="counts", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "C":
                self.samples.append((float(parts[1]), int(parts[2])))

    def now(self) -> tuple[float, int]:
        return self.samples[-1] if self.samples else (time.monotonic(), 0)

    def wait_started(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.now()[1] == 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("a counting child produced no result")
            time.sleep(0.1)


def counting_arm(argv: list[str], setup: Setup, log: Path) -> dict[str, float]:
    with log.open("a") as err:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
        )
    counts = Counts(proc)
    try:
        counts.wait_started(READY_TIMEOUT_S)
        time.sleep(setup.warmup_s)
        (t0, n0), c0 = counts.now(), tree_cpu_s(proc.pid)
        time.sleep(setup.window_s)
        (t1, n1), c1 = counts.now(), tree_cpu_s(proc.pid)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # the child's signal to stop
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_TIMEOUT_S)
        counts.reader.join(STOP_TIMEOUT_S)  # its last lines read before stdout closes
        end_process(proc, timeout_s=STOP_TIMEOUT_S)
    wall = t1 - t0
    return {"fps": (n1 - n0) / wall, "cores": (c1 - c0) / wall}


def serve_arm(
    cfg: Path, workers: int, setup: Setup, log: Path, viewer: bool = True
) -> dict[str, float]:
    with serving(cfg, workers, setup, log, viewer) as (url, pid):
        time.sleep(setup.warmup_s)
        f0, c0, t0 = processed(url), tree_cpu_s(pid), time.monotonic()
        time.sleep(setup.window_s)
        f1, c1, t1 = processed(url), tree_cpu_s(pid), time.monotonic()
    wall = t1 - t0
    return {"fps": (f1 - f0) / wall, "cores": (c1 - c0) / wall}


@contextmanager
def serving(
    cfg: Path, workers: int, setup: Setup, log: Path, viewer: bool = True
) -> Iterator[tuple[str, int]]:
    """`appliance serve` on `cfg`, ready, its first frames out and (`viewer`) stream cam0
    watched over WebRTC: (its URL, its pid). Stopped on the way out."""
    port = free_port()
    argv = serve_argv(cfg, port, workers)
    url = f"http://127.0.0.1:{port}"
    with ExitStack() as stack:
        out = stack.enter_context(log.open("a"))
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        stack.callback(end_process, proc, timeout_s=STOP_TIMEOUT_S)
        wait_ready(url, proc, log)
        if not viewer:
            yield url, proc.pid
            return
        seconds = 600  # the viewer outlives any window: it is ended with the arm
        viewer = [sys.executable, str(VIEWER), url, TOKEN, "cam0", "1", str(seconds),
                  str(setup.folder / "viewer.json"), "count"]  # fmt: skip
        peer = subprocess.Popen(viewer, stdout=subprocess.PIPE, stderr=out, text=True)
        stack.callback(end_process, peer, timeout_s=STOP_TIMEOUT_S)
        assert peer.stdout is not None
        if not peer.stdout.readline().startswith("READY"):
            raise RuntimeError("the WebRTC viewer did not get its first frame")
        # Niced once connected, as bench/webrtc.py: the viewer's own CPU is not the
        # appliance's (every thread: Linux nices threads one by one).
        for thread in psutil.Process(peer.pid).threads():
            os.setpriority(os.PRIO_PROCESS, thread.id, 19)
        yield url, proc.pid


def wait_ready(url: str, proc: subprocess.Popen[Any], log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            if api(url + "/ready")["ready"] and processed(url) > 0:
                return
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"appliance did not get ready: {log.read_text()[-1500:]}")
        time.sleep(0.2)


def api(url: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read())


def processed(url: str) -> int:
    return sum(s["frames_processed"] for s in api(url + "/v1/streams")["streams"])


# -- configs ----------------------------------------------------------------------------
def serve_config(setup: Setup, workflow: str, streams: int, arm: str = "appliance") -> Path:
    """The demo's workflow over the stand-in model; `streams` fast cameras, all to MQTT;
    less one part for an ablation `arm`."""
    file, model_id, _, _, _ = WORKFLOWS[workflow]
    doc = yaml.safe_load((ROOT / "configs" / "workflows" / file).read_text())
    if arm == "detect only":  # the workflow's first block, its detector, alone
        doc["blocks"] = doc["blocks"][:1]
        doc["outputs"] = {doc["blocks"][0]["id"]: doc["blocks"][0]["id"]}
    model = doc["models"][model_id]
    model["path"] = str(setup.models[workflow])
    if "BENCH_PROVIDERS" in os.environ:  # a GPU run (bench/gpu_check.sh)
        model["providers"] = json.loads(os.environ["BENCH_PROVIDERS"])
    wf_path = setup.folder / f"{workflow}-{arm.replace(' ', '-')}.yaml"
    wf_path.write_text(yaml.safe_dump(doc))
    bus = {"type": "mqtt", "host": "127.0.0.1", "port": setup.mqtt_port, "topic_prefix": "ceiling"}
    outputs = [] if setup.mqtt_port is None or arm == "no sinks" else [{"sink": "bus"}]
    profiling: dict[str, Any] = {"dir": str(setup.folder / "traces")}
    if arm == "no profiling":  # no traces, histograms' hooks or regression watch
        profiling |= {"enabled": False, "watch": {"enabled": False}}
    cfg = {
        "server": {"token": TOKEN},
        "profiling": profiling,
        "sinks": {} if setup.mqtt_port is None else {"bus": bus},
        "streams": [
            {"id": f"cam{i}", "source": {"url": str(setup.clip), "pace": "fast", "loop": True},
             "workflow": str(wf_path), "outputs": outputs}
            for i in range(streams)
        ],
    }  # fmt: skip
    path = setup.folder / f"{workflow}-{streams}-{arm.replace(' ', '-')}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def spec(setup: Setup, workflow: str, streams: int, clip: Path) -> str:
    file, model_id, _, decoder, labels = WORKFLOWS[workflow]
    doc = yaml.safe_load((ROOT / "configs" / "workflows" / file).read_text())
    model = doc["models"][model_id]
    return Spec(
        urls=[str(clip)] * streams,
        model=str(setup.models[workflow]),
        decoder=decoder,
        input_size=model.get("input_size"),
        labels=labels,
        confidence=0.4,
        max_batch=model.get("batching", {}).get("max_batch_size", 1),
    ).to_json()


def model_file(workflow: str, models: str, folder: Path) -> Path:
    """The near-free stand-in, made now, or (`real`) the demo workflow's own model."""
    file, model_id, make_free, _, _ = WORKFLOWS[workflow]
    if models == "free":
        return make_free(folder / f"free-{workflow}.onnx")
    doc = yaml.safe_load((ROOT / "configs" / "workflows" / file).read_text())
    return (ROOT / "configs" / "workflows" / doc["models"][model_id]["path"]).resolve()


def looped(clip: Path, times: int) -> Path:
    """`clip` played `times` over in one file (ffmpeg's stream copy: no re-encoding)."""
    out = clip.with_name(f"{clip.stem}-x{times}.mp4")
    if not out.exists():
        partial = out.with_suffix(".partial.mp4")
        subprocess.run(
            ["ffmpeg", "-v", "error", "-y", "-stream_loop", str(times - 1), "-i", str(clip),
             "-c", "copy", str(partial)],
            check=True,
        )  # fmt: skip
        partial.rename(out)
    return out


# -- a round ----------------------------------------------------------------------------
def run_arm(arm: str, setup: Setup, workflow: str, streams: int) -> dict[str, float]:
    log = setup.folder / "children.log"
    if arm == "bare":
        argv = [sys.executable, str(ROOT / "bench" / "_bare_decode.py"),
                spec(setup, workflow, streams, setup.clip)]  # fmt: skip
        return counting_arm(argv, setup, log)
    if arm == "reference":
        assert setup.reference is not None
        argv = [str(setup.reference), str(ROOT / "bench" / "_reference.py"), "ref-count",
                spec(setup, workflow, streams, setup.long_clip)]  # fmt: skip
        return counting_arm(argv, setup, log)
    cfg = serve_config(setup, workflow, streams, arm)
    return serve_arm(cfg, 2 if arm == "workers 2" else 1, setup, log, arm != "no viewer")


Got = dict[str, dict[int, dict[str, list[dict[str, float]]]]]  # workflow -> N -> arm -> runs


def measure(
    setup: Setup, workflows: list[str], counts: list[int], rounds: int, arms: list[str]
) -> Got:
    got: Got = {w: {n: {a: [] for a in arms} for n in counts} for w in workflows}
    for r, order in enumerate(rotations(arms, rounds)):
        for workflow in workflows:
            for n in counts:
                for arm in order:
                    figures = run_arm(arm, setup, workflow, n)
                    got[workflow][n][arm].append(figures)
                    print(f"round {r + 1}/{rounds} {workflow} x{n} {arm}: "
                          f"{figures['fps']:.1f} fps, {figures['cores']:.2f} cores",
                          flush=True)  # fmt: skip
    return got


# -- figures ----------------------------------------------------------------------------
def arm_figures(key: str, runs: list[dict[str, float]]) -> dict[str, float]:
    """An arm's medians: processed fps, busy cores and fps per busy core."""
    return {
        f"{key}.fps": round(statistics.median(r["fps"] for r in runs), 1),
        f"{key}.cores": round(statistics.median(r["cores"] for r in runs), 2),
        f"{key}.fps_per_core": round(
            statistics.median(r["fps"] / r["cores"] for r in runs if r["cores"] > 0), 1
        ),
    }


def figures(got: Got) -> tuple[dict[str, Any], dict[str, Verdict]]:
    metrics: dict[str, Any] = {}
    verdicts: dict[str, Verdict] = {}
    for workflow, by_n in got.items():
        for n, arms in by_n.items():
            key = f"{workflow}.n{n}"
            for arm, runs in arms.items():
                metrics.update(arm_figures(f"{key}.{arm.replace(' ', '')}", runs))
            pairs = {"vs_bare": ("appliance", "bare"), "vs_reference": ("appliance", "reference"),
                     "workers_ratio": ("workers 2", "appliance")}  # fmt: skip
            pairs |= {f"{a.replace(' ', '_')}_ratio": (a, "appliance") for a in ABLATIONS}
            for ratio, (num, den) in pairs.items():
                if num not in arms or den not in arms:
                    continue
                per_round = ratios([r["fps"] for r in arms[num]], [r["fps"] for r in arms[den]])
                low, high = TARGETS.get(ratio, (None, None)) if n == JUDGED_AT else (None, None)
                verdict = judge(per_round, at_least=low, at_most=high)
                metrics[f"{key}.{ratio}"] = round(verdict.median, 3)
                metrics[f"{key}.{ratio}.interval"] = f"{verdict.low:.3f}-{verdict.high:.3f}"
                if n == JUDGED_AT and ratio in TARGETS:
                    verdicts[f"{key}.{ratio}"] = verdict
    return metrics, verdicts


def main() -> None:
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--counts", default="1,4,8,16")
    parser.add_argument("--workflows", default="people,faces")
    parser.add_argument(
        "--models", choices=("free", "real"), default="free", help="real: the demo's own models"
    )
    parser.add_argument("--ablate", action="store_true", help="the appliance less one part each")
    parser.add_argument("--keep", action="store_true", help="keep the results file's other counts")
    args = parser.parse_args()
    if args.quick:
        counts, workflows, rounds, warmup, window = [8], ["people"], 1, 2.0, 3.0
    else:
        counts = [int(c) for c in args.counts.split(",")]
        workflows = args.workflows.split(",")
        rounds, warmup, window = args.rounds, 3.0, 8.0
    clip = scaled_clip(*SIZE, 15)
    reference, status = bench_venv("reference-venv", list(REFERENCE_PACKAGES))
    if reference is None:
        print(f"the reference arm is left out: {status}", flush=True)
    arms = [a for a in ARMS if a != "reference" or reference is not None]
    arms += list(ABLATIONS) if args.ablate else []
    with tempfile.TemporaryDirectory(prefix="bench-ceiling-") as tmp, ExitStack() as stack:
        folder = Path(tmp)
        port = stack.enter_context(mosquitto(folder)) if shutil.which("mosquitto") else None
        setup = Setup(folder, clip, looped(clip, LOOPS), port, reference, warmup, window)
        for w in workflows:
            setup.models[w] = model_file(w, args.models, folder)
        got = measure(setup, workflows, counts, rounds, arms)
    metrics, verdicts = figures(got)
    metrics |= {f"{w}.n{n}.rounds": rounds for w in workflows for n in counts}
    metrics.update({"rounds": rounds, "cores": os.cpu_count(), "reference": status,
                    "models": args.models, "mqtt": port is not None})  # fmt: skip
    name = "ceiling" if args.models == "free" else "ceiling_real_models"
    ran = {f"{w}.n{n}" for w in workflows for n in counts}
    old = kept(name, lambda k: ".".join(k.split(".")[:2]) in ran) if args.keep else {}
    if old:  # a file from before per-count rounds: its counts had its `rounds`
        pairs = {".".join(k.split(".")[:2]) for k in old["metrics"] if "." in k}
        per_count = {f"{p}.rounds": old["metrics"].get("rounds") for p in pairs}
        old["metrics"], old["counts"] = per_count | old["metrics"], sorted(pairs)
    targets = {
        k: f"{v.target} (95 % interval's {'lower' if v.at_least is not None else 'upper'} bound)"
        for k, v in verdicts.items()
    }
    how = method(
        f"N streams of the bundled clip as {SIZE[0]}x{SIZE[1]} H.264, pace fast, through the "
        "demo's workflows over near-free stand-in models (bench/_free_models.py), every "
        "result to a real mosquitto, one stream watched over WebRTC; processed frames/s",
        arms,
        rounds,
        f"each arm a fresh child: first frames, {warmup:g} s warm-up, a {window:g} s window",
        ratio="appliance ÷ bare, appliance ÷ reference, workers 2 ÷ appliance, per round",
    )
    met = {k: v.met for k, v in verdicts.items()}
    judged = {k: v.as_json() for k, v in verdicts.items()}
    if old and not args.quick:  # the counts this run did not measure, as the file had them
        metrics, targets = old["metrics"] | metrics, old["targets"] | targets
        met, judged = old["met"] | met, old["verdicts"] | judged
        how["kept"] = {"from": old["run"], "counts": old["counts"]}
    report(name, metrics, targets, met, method=how, verdicts=judged)


if __name__ == "__main__":
    main()
