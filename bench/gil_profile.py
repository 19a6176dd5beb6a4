"""Where the GIL time goes: a sampling profile of the saturated process, GIL holder only.

The setting of bench/ceiling.py's `appliance` arm (N fast streams of the 640x480 clip
through a demo workflow over a near-free model, every result to a real mosquitto, one
stream watched over WebRTC), one `appliance serve` process. After the first frames and a
warm-up, py-spy samples it for the window: `py-spy record --gil --threads`, which keeps,
at each sample, only the thread that holds the GIL. By default it reads the process
without pausing it (`--nonblocking`, RATE_HZ); with `--native`, the native frames
(OpenCV, numpy, ONNX Runtime, libc) under the Python ones too, for which py-spy pauses
the process at each sample, so at a lower rate (RATE_NATIVE_HZ) and with fewer samples
than the rate asks where unwinding falls behind.

Reported: each thread kind's CPU per processed frame over the window (/proc, each
thread named by py-spy's samples), and, per function, self (the sampled stack's
innermost frame: where the holder was) and inclusive (any frame of the stack: what it
was inside) as shares of the GIL samples, and per thread kind (`work`, `grab`, `batch`,
the server's loop, ...). The GIL's busy share is the samples taken ÷ the samples a
window at the rate would hold: an estimate (py-spy falls behind under load, which
lowers it). No target: the profile says what to cut (docs/performance.md), and
bench/ceiling.py and bench/data_path.py measure each cut.

    python bench/gil_profile.py [--quick] [--workflow people|faces] [--streams N] [--seconds S]
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import bench_parser, mosquitto, report, scaled_clip
from bench.ceiling import SIZE, WORKFLOWS, Setup, processed, serve_config, serving

RATE_HZ = 250  # py-spy's samples a second, reading the process without pausing it
RATE_NATIVE_HZ = 50  # with native stacks: each sample pauses the process to unwind them
TOP = 25  # functions kept per list
_TID = re.compile(r"^thread \((?P<tid>\d+)\): (?P<name>[^;]*);", re.MULTILINE)
_FRAME = re.compile(r"^(?P<name>.*?) \((?P<where>[^()]*)\)$")  # "func (file.py:12)"


def record(pid: int, seconds: float, out: Path, native: bool) -> None:
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    argv = [spy, "record", "--gil", "--threads", "--rate", str(rate(native)),
            "--duration", str(int(seconds)), "--format", "raw", "--output", str(out),
            "--pid", str(pid)]  # fmt: skip
    # Native stacks need the process paused at each sample; Python's alone do not.
    argv += ["--native"] if native else ["--nonblocking"]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def rate(native: bool) -> int:
    return RATE_NATIVE_HZ if native else RATE_HZ


def frame_name(frame: str) -> str:
    """`func (path/to/file.py:12)` -> `func (file.py)`; a native frame keeps its library."""
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    where = Path(match["where"].split(":")[0]).name
    name = "?" if match["name"].startswith("0x") else match["name"]  # no symbol
    return f"{name} ({where})"


def thread_kind(frame: str) -> str:
    """py-spy's thread root, `thread (TID): NAME`: the name before its stream or model id
    (`work:cam3` -> `work`)."""
    _, _, name = frame.strip().partition("): ")
    return name.split(":")[0] or "unnamed"


def parse(raw: str) -> tuple[Counter[str], Counter[str], Counter[str], int]:
    """Self and inclusive samples per function, per thread kind, and the total."""
    own: Counter[str] = Counter()
    inside: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        threads[thread_kind(frames[0])] += count
        names = [frame_name(f) for f in frames[1:]] or [frame_name(frames[0])]
        own[names[-1]] += count
        for name in set(names):
            inside[name] += count
        total += count
    return own, inside, threads, total


# A worker's GIL samples by what it was doing: the first of these found in its stack,
# outermost first (the block steps of the demo's workflows), else inside or outside the
# workflow's run.
WORK_PARTS = (
    ("track", "ByteTracker.update"),
    ("line_counter", "_LineCount.step"),
    ("annotate", "AnnotateBlock.build.<locals>.factory.<locals>.annotate"),
    ("blur", "BlurBlock.build.<locals>.blur"),
    ("detect", "DetectBlock.build.<locals>.detect"),
    ("workflow_other", "WorkflowRun.run"),
)


def work_part(names: list[str]) -> str:
    """What a worker's stack was doing (WORK_PARTS), or `outside_workflow`."""
    for key, marker in WORK_PARTS:
        if any(n.startswith(marker) for n in names):
            return key
    return "outside_workflow"


def work_parts(raw: str) -> Counter[str]:
    """The `work` threads' GIL samples by WORK_PARTS."""
    parts: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        frames = stack.split(";")
        if count_text.isdigit() and thread_kind(frames[0]) == "work":
            parts[work_part([frame_name(f) for f in frames[1:]])] += int(count_text)
    return parts


def shares(counts: Counter[str], total: int, top: int = TOP) -> dict[str, float]:
    return {name: round(n / total, 4) for name, n in counts.most_common(top)} if total else {}


def main() -> None:
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument("--workflow", choices=list(WORKFLOWS), default="people")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--native", action="store_true", help="native frames too (slower)")
    args = parser.parse_args()
    seconds, warmup = (10.0, 3.0) if args.quick else (args.seconds, 5.0)
    clip = scaled_clip(*SIZE, 15)
    with tempfile.TemporaryDirectory(prefix="bench-gil-") as tmp, ExitStack() as stack:
        folder = Path(tmp)
        port = stack.enter_context(mosquitto(folder))
        setup = Setup(folder, clip, clip, port, None, warmup, seconds)
        setup.models[args.workflow] = WORKFLOWS[args.workflow][2](folder / "free.onnx")
        cfg = serve_config(setup, args.workflow, args.streams)
        with serving(cfg, 1, setup, folder / "serve.log") as (url, pid):
            time.sleep(warmup)
            cpu0, frames0 = thread_cpu_s(pid), processed(url)
            record(pid, seconds, folder / "profile.txt", args.native)
            cpu1, frames1 = thread_cpu_s(pid), processed(url)
        raw = (folder / "profile.txt").read_text()
    frames = max(frames1 - frames0, 1)
    by_kind = cpu_by_kind(cpu0, cpu1, raw)
    cpu_ms = {k: round(v * 1000 / frames, 3) for k, v in by_kind.items()}
    own, inside, threads, total = parse(raw)
    metrics = {
        "workflow": args.workflow,
        "streams": args.streams,
        "seconds": seconds,
        "frames": frames,
        "cpu_ms_per_frame": round(sum(cpu_ms.values()), 3),
        "gil_samples": total,
        "native": args.native,
        "gil_busy_share_estimate": round(total / (rate(args.native) * seconds), 3),
        "thread_cpu_ms_per_frame": dict(sorted(cpu_ms.items(), key=lambda kv: -kv[1])),
        "threads": shares(threads, total),
        "work": shares(work_parts(raw), total),
        "self": shares(own, total),
        "inclusive": shares(inside, total),
    }
    print_profile(metrics)
    report("gil_profile", {k: v for k, v in metrics.items() if not isinstance(v, dict)}, {}, {},
           method={"what": __doc__.split("\n\n")[1].replace("\n", " "),
                   "tool": f"py-spy record --gil --threads --rate {rate(args.native)}"
                           + (" --native" if args.native else " --nonblocking")},
           profile={k: metrics[k] for k in PARTS})  # fmt: skip


PARTS = ("thread_cpu_ms_per_frame", "threads", "work", "self", "inclusive")


def print_profile(metrics: dict[str, object]) -> None:
    for part in PARTS:
        table = metrics[part]
        assert isinstance(table, dict)
        if part == "thread_cpu_ms_per_frame":
            print("\nCPU ms per processed frame, by thread kind")
            for name, ms in table.items():
                print(f"  {ms:7.3f}  {name}")
            continue
        print(f"\n{part} (share of GIL samples)")
        for name, share in table.items():
            print(f"  {share:7.1%}  {name}")


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of each of the process's threads, by OS thread id (/proc)."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}


def cpu_by_kind(before: dict[int, float], after: dict[int, float], raw: str) -> dict[str, float]:
    """CPU seconds over the window by thread kind. Python does not give the OS its thread
    names; py-spy's samples do (`thread (TID): NAME`). Threads never seen holding the GIL
    (ONNX Runtime's pool, FFmpeg's decoder threads) are `native`."""
    names = {int(m["tid"]): m["name"] for m in _TID.finditer(raw)}
    out: dict[str, float] = {}
    for tid, cpu in after.items():
        kind = thread_kind(f"thread ({tid}): {names[tid]}") if tid in names else "native"
        out[kind] = out.get(kind, 0.0) + cpu - before.get(tid, 0.0)
    return out


if __name__ == "__main__":
    main()
