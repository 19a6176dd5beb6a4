"""For bench/viewer.py: Chromium (Debian's binary driven by Playwright with the viewer
tests' flags, tests/server/chromium.py; niced; the recording script bench/_viewer_page.js
injected into every page), the CPU used by its process tree, by the appliance's threads
that serve viewers and by the whole machine (psutil), the figures made of them, and the
results file's `method`."""

from __future__ import annotations

import json
import os
import re
import stat
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from playwright.sync_api import ViewportSize, sync_playwright

from bench._compare import method
from tests.server.chromium import CHROMIUM, CHROMIUM_FLAGS
from tests.support import clock_camera
from tests.support import clock_camera_server as layout
from tests.support.clock_camera import ClockCamera

PAGE_SCRIPT = Path(__file__).with_name("_viewer_page.js")
# Niced: viewers watch from other machines; here the browser shares the two cores with
# the appliance, whose work must not wait for it (nor be charged for it).
NICE = 10
NO_RAISING = "setpriv --bounding-set=-sys_nice --inh-caps=-sys_nice"  # drop CAP_SYS_NICE
WAIT_MS = 30_000
RTP_MASK = 0xFFFFFFFF
Records = dict[str, list[list[Any]]]  # bench/_viewer_page.js's arrays
SERVER_THREAD = re.compile(r"loop|asyncio_\d+")


def tree_cpu_s(root: int) -> dict[int, float]:
    """CPU seconds (user + system, its own and its reaped children's) of `root` and each
    live descendant, by pid; ones that end meanwhile are left out."""
    try:
        top = psutil.Process(root)
        procs = [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out: dict[int, float] = {}
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        out[proc.pid] = t.user + t.system + t.children_user + t.children_system
    return out


def server_threads_cpu_s() -> dict[int, float]:
    """CPU seconds (user + system) of this process's threads that serve viewers, by
    native id: the server's event loop (LiveServer's thread "loop": HTTP, ICE, DTLS,
    RTP) and its default thread pool ("asyncio_N": frame conversion, VP8 encoding).
    The streams' threads (decoding, inference) are the rest of the process."""
    ours = {t.native_id for t in threading.enumerate() if SERVER_THREAD.fullmatch(t.name)}
    return {t.id: t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ours}


def machine_busy_s() -> float:
    """CPU seconds every core has spent busy since boot."""
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + t.irq + t.softirq + t.steal)


class OtherWork:
    """The CPU the rest of the machine uses from now on: every core's busy time less that
    of this process and its descendants (the appliance, the camera, Chromium and
    Playwright's driver), % of one core."""

    def __init__(self) -> None:
        self._busy, self._ours = machine_busy_s(), self._our_tree()

    @staticmethod
    def _our_tree() -> dict[int, float]:
        return tree_cpu_s(os.getpid())

    def pct(self, elapsed_s: float) -> float:
        ours = cpu_between(self._ours, self._our_tree())
        return 100 * (machine_busy_s() - self._busy - ours) / elapsed_s


def page_script(watch: bool) -> str:
    """The recording script, with the clock camera's stamp layout; `watch`: read the stamp
    of every frame #video presents (else only the data channels are recorded)."""
    constants = {
        "blocks": layout.BLOCKS,
        "checkBits": layout.CHECK_BITS,
        "salt": layout.check_nibble(0),  # the salt: the check of stamp 0
        "threshold": clock_camera._THRESHOLD,
        "margin": clock_camera._MARGIN,
        "watch": watch,
    }
    return f"const LAYOUT = {json.dumps(constants)};\n" + PAGE_SCRIPT.read_text()


@dataclass
class Browser:
    """A running Chromium: its Playwright context and the pid of its first process."""

    context: Any
    pid: int

    def page(self, token: str, watch: bool) -> Any:
        """A new tab that knows the token and records (see page_script); the page's
        script errors collect in its `errors` list."""
        tab = self.context.new_page()
        tab.set_default_timeout(WAIT_MS)
        tab.add_init_script(f"sessionStorage.setItem('appliance.token', {json.dumps(token)})")
        tab.add_init_script(page_script(watch))
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.errors = errors
        return tab

    def cpu_s(self) -> dict[int, float]:
        """CPU seconds (user + system, and of reaped children) of each live process of
        the browser's tree, by pid."""
        return tree_cpu_s(self.pid)


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two readings by pid (or thread id); one new since counts
    from 0 (one gone since is lost: the grid's tab and the thread pool keep theirs)."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


@contextmanager
def chromium(folder: Path, viewport: ViewportSize) -> Iterator[Browser]:
    """Chromium with a fresh profile in `folder`, niced by a wrapper script."""
    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} is missing: run sh tests/install_deps.sh")
    wrapper = folder / "chromium-niced"
    # Chromium sets its threads' priorities itself (0, -8 for its display and IO threads,
    # as root): without CAP_SYS_NICE it cannot raise them above the nice it starts with.
    keep_nice = f"{NO_RAISING} " if os.geteuid() == 0 else ""
    wrapper.write_text(f'#!/bin/sh\nexec {keep_nice}nice -n {NICE} {CHROMIUM} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(folder / "chromium-profile"),
            executable_path=str(wrapper),
            args=CHROMIUM_FLAGS,
            viewport=viewport,
        )
        try:
            yield Browser(context, _browser_pid(before))
        finally:
            context.close()


def _browser_pid(before: set[int]) -> int:
    """The browser's main process: the new Chromium descendant of ours whose parent is
    not one (Playwright's driver, a Node process, started it)."""
    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    chrome = [p for p in new if "chrom" in p.name()]
    pids = {p.pid for p in chrome}
    roots = [p.pid for p in chrome if p.ppid() not in pids]
    if len(roots) != 1:
        raise SystemExit(f"cannot tell Chromium's main process among {chrome}")
    return roots[0]


def encode_ms(width: int, height: int) -> float:
    """aiortc's VP8 encoder (the codec aiortc offers first) on one frame of this size, ms:
    the median of 50 encodes after 10 to warm up."""
    from aiortc.codecs.vpx import Vp8Encoder
    from av import VideoFrame

    encoder = Vp8Encoder()
    base = np.random.default_rng(0).integers(0, 255, (height * 3 // 2, width), dtype=np.uint8)
    times = []
    for i in range(60):
        frame = VideoFrame.from_ndarray(np.roll(base, i * 4, axis=1), format="yuv420p")
        frame.pts, frame.time_base = i * 6000, Fraction(1, 90000)
        start = time.perf_counter()
        encoder.encode(frame)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times[10:])


# -- the figures --------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 1) if values else float("nan")


def spread(values: list[float], digits: int = 2) -> str:
    return f"{min(values):.{digits}f} to {max(values):.{digits}f}"


def glass_metrics(
    camera: ClockCamera, rounds: list[Records], by_seq: dict[int, int], seconds: float
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """The figures of the recordings (bench/_viewer_page.js's arrays, one per round and
    player session), over every round's frames, in ms; and per round the p50s of
    `video` and `predictions` (glass to glass). `by_seq`: the stamp of each result, as
    the appliance read it."""
    pooled: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    per_round: dict[str, list[float]] = {"video": [], "predictions": []}
    for records in rounds:
        lists, found = _glass_lists(camera, records, by_seq)
        for key, values in lists.items():
            pooled.setdefault(key, []).extend(values)
        for key, n in found.items():
            counts[key] = counts.get(key, 0) + n
        for key, values in per_round.items():
            values.append(pct(lists[key], 50))
    presented = max(1, counts["presented"])

    def share(key: str, of: int, digits: int) -> float:
        return round(counts[key] / max(1, of), digits)

    return {
        "video.frames": len(pooled["video"]),
        "video.presented_fps": round(counts["presented"] / (seconds * len(rounds)), 2),
        "video.unreadable_stamps": counts["presented"] - len(pooled["video"]),
        "video.mapped_by_rtp": round(len(pooled["internal"]) / presented, 3),
        "video.rtp_timestamp_off_by_one": share("off_by_one", presented, 3),
        "video.same_frame_as_rtp": share("same", counts["checked"], 4),
        # The page's own overlay: the presented frames it matched to their result.
        "page.overlay_matched_frames": share("overlaid", presented, 3),
        "video.g2g_p50_ms": pct(pooled["video"], 50),
        "video.g2g_p95_ms": pct(pooled["video"], 95),
        "video.g2g_to_received_p50_ms": pct(pooled["received"], 50),
        "video.g2g_to_received_p95_ms": pct(pooled["received"], 95),
        # The browser: from the frame's last packet to its expected display.
        "video.received_to_display_p50_ms": pct(pooled["held"], 50),
        "video.received_to_display_p95_ms": pct(pooled["held"], 95),
        "video.decode_p50_ms": pct(pooled["decode"], 50),
        "video.capture_to_presented_p50_ms": pct(pooled["internal"], 50),
        "video.capture_to_presented_p95_ms": pct(pooled["internal"], 95),
        "predictions.messages": len(pooled["capture_to_message"]),
        "predictions.matched": len(pooled["predictions"]),
        "predictions.g2g_p50_ms": pct(pooled["predictions"], 50),
        "predictions.g2g_p95_ms": pct(pooled["predictions"], 95),
        "predictions.capture_to_message_p50_ms": pct(pooled["capture_to_message"], 50),
        "predictions.capture_to_message_p95_ms": pct(pooled["capture_to_message"], 95),
    }, per_round


def _glass_lists(
    camera: ClockCamera, records: Records, by_seq: dict[int, int]
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """One player session's latencies (ms) by kind, and its counts."""

    def emitted_ms(stamp: int | None) -> float | None:
        index = None if stamp is None else camera.emissions.resolve(stamp)
        at = None if index is None else camera.emitted(index)
        return None if at is None else at * 1000

    out: dict[str, list[float]] = {
        k: [] for k in ("video", "received", "held", "decode", "internal", "predictions")
    }
    out["capture_to_message"] = []
    sent = {rtp: (seq, capture * 1000) for _, rtp, seq, capture in records["frames"]}
    checked = same = off_by_one = 0
    for stamp, expected, _, receive, rtp, processing in records["presented"]:
        info = sent.get(rtp)
        if info is None and rtp is not None:
            # Chromium's rtpTimestamp is often one tick off the one sent (it converts
            # through microseconds and back); frames are thousands of ticks apart.
            info = sent.get((rtp + 1) & RTP_MASK) or sent.get((rtp - 1) & RTP_MASK)
            off_by_one += info is not None
        if info is not None:
            out["internal"].append(expected - info[1])
            if stamp is not None and info[0] in by_seq:  # the frame drawn is the one named
                checked += 1
                same += by_seq[info[0]] == stamp
        at = emitted_ms(stamp)
        if at is None:
            continue
        out["video"].append(expected - at)
        if receive is not None:
            out["received"].append(receive - at)
            out["held"].append(expected - receive)
        if processing is not None:
            out["decode"].append(processing)
    for arrival, seq, capture in records["predictions"]:
        out["capture_to_message"].append(arrival - capture * 1000)
        at = emitted_ms(by_seq.get(seq))
        if at is not None:
            out["predictions"].append(arrival - at)
    counts = {
        "presented": len(records["presented"]),
        "checked": checked,
        "same": same,
        "off_by_one": off_by_one,
        "overlaid": len({o[0] for o in records["overlaid"]}),
    }
    return out, counts


def slope(points: list[dict[str, float]], key: str) -> float:
    """The least-squares slope of `key` over the number of tiles."""
    return float(np.polyfit([p["k"] for p in points], [p[key] for p in points], 1)[0])


def mean_at(points: list[dict[str, float]], k: float, key: str) -> float:
    return statistics.mean(p[key] for p in points if p["k"] == k)


def grid_metrics(
    phases: list[list[dict[str, float]]], quiet_pct: float
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Per round (a list of phases): slopes over k and the fps ratio; their medians and
    ranges over the rounds; and the per-round values to judge: the viewer threads'
    slope (`server`) and the fps ratio of the quiet rounds (`fps_quiet`). A round is
    quiet when the rest of the machine used at most `quiet_pct` % of a core in each of
    its phases."""
    metrics: dict[str, Any] = {"grid.rounds": len(phases)}
    per_round: dict[str, list[float]] = {}
    for key, name in (("app_pct", "app"), ("server_pct", "server"), ("browser_pct", "browser")):
        slopes = [slope(points, key) for points in phases]
        per_round[name] = slopes
        metrics[f"grid.{name}_pct_per_tile"] = round(statistics.median(slopes), 2)
        metrics[f"grid.{name}_pct_per_tile.range"] = spread(slopes)
        metrics[f"grid.{name}_pct_per_tile.max"] = round(max(slopes), 2)
        for k in sorted({p["k"] for p in phases[0]}):
            shown = statistics.median(mean_at(points, k, key) for points in phases)
            metrics[f"grid.{name}_pct.{int(k)}_tiles"] = round(shown, 1)
    ratios = [mean_at(points, 4, "fps") / mean_at(points, 0, "fps") for points in phases]
    metrics["grid.fps_4_tiles_vs_none"] = round(statistics.median(ratios), 3)
    metrics["grid.fps_4_tiles_vs_none.range"] = spread(ratios, 3)
    # Judged over the rounds the rest of the machine left alone: when it takes the cores,
    # the streams lose frames to whatever else runs, tiles or not.
    quiet = [r for r, points in zip(ratios, phases, strict=True)
             if max(p["others_pct"] for p in points) <= quiet_pct]  # fmt: skip
    per_round["fps_quiet"] = quiet
    metrics["grid.quiet_rounds"] = len(quiet)
    metrics["grid.fps_4_tiles_vs_none.quiet_min"] = round(min(quiet), 3) if quiet else None
    metrics["grid.fps_none"] = round(statistics.median(mean_at(p, 0, "fps") for p in phases), 2)
    others = [p["others_pct"] for points in phases for p in points]
    metrics["grid.others_pct"] = f"{round(statistics.median(others))} (max {round(max(others))})"
    tile_fps = [p["tile_fps"] for points in phases for p in points if p["k"]]
    metrics["grid.tile_fps"] = spread(tile_fps, 1)
    return metrics, per_round


def viewer_method(
    *,
    rounds: int,
    record_s: float,
    grid_rounds: int,
    phase_s: float,
    settle_s: float,
    tile_counts: Sequence[int],
    quiet_pct: float,
    quick: bool,
) -> dict[str, Any]:
    """bench/viewer.py's `method`: the grid's alternation, and glass to glass's rounds."""
    return method(
        "the grid's cost per tile: k tiles on screen (by the viewport's height, checked by "
        "tiles playing and the server's sessions); CPU seconds per second of the "
        "appliance's process, of its threads serving viewers (event loop and its pool), "
        "of Chromium's tree (niced, unable to raise its threads' priority) and of the rest "
        "of the machine; the streams' processed fps",
        [f"{k} tiles" for k in tile_counts],
        grid_rounds,
        f"one {phase_s:g} s phase per k ({settle_s:g} s after k tiles play), in one "
        "appliance and one browser",
        order="rotated by one each round"
        + ("" if quick else ", then reversed: 0 1 2 4 4 2 1 0, 1 2 4 0 0 4 2 1, ..."),
        figure="per round: the least-squares slope over k (% of a core per tile), and the "
        "fps with 4 tiles ÷ with none (judged over the rounds in which other work took "
        f"at most {quiet_pct:g} % of a core in every phase)",
        glass_to_glass={
            "what": "the clock camera's stamp read in Chromium from each frame the page's "
            "<video> presents (requestVideoFrameCallback, expected display time) minus the "
            "camera's logged emission of that frame; a predictions message's arrival minus "
            "the emission of its frame (its seq's stamp as the appliance read it when "
            "publishing); the browser's stamp checked against the appliance's for the seq "
            "the frame's RTP timestamp names (frames channel)",
            "rounds": rounds,
            "round": f"a fresh player session (video mode switched away and back), "
            f"{record_s:g} s recorded",
            "baseline": "the same round's emission -> result p50 of the stream, on the same "
            "frames at the same time",
            "figure": "median of the per-round differences: glass-to-glass p50 minus the "
            "round's result p50 (ms)",
        },
    )
