"""What the camera fault tests share: a damaged clip, the appliance in-process with every
result it delivers timed, and the few readings they take from its API and metrics.

    seen = Arrivals()                      # subscribed before the runtime starts
    live = start_appliance(folder, doc, seen)
    seen.wait("door", after=time.perf_counter())   # the next result of stream `door`
    seen.fps("yard", start, end)           # results per second of `yard` in a window

Times are `time.perf_counter()` seconds (a result's `done_mono`), except a transition's
and a frame's wall-clock dates, compared only with each other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
from prometheus_client.parser import text_string_to_metric_families

from pipelines.types import FrameResult
from tests.server.live import LiveServer, wait_for, write_yaml
from tests.support.media import frame_index

WAIT_S = 20.0  # for a stream to deliver or change state: generous for a busy 2-core box
TOKEN = "faults-token-7c1e"
# The workflow is the frame itself: the fault is in the camera, and on 2 cores a model
# would make the figures measure the model's contention instead of the source's.
FRAMES_WORKFLOW: dict[str, Any] = {"name": "frames", "blocks": [], "outputs": {"video": "frame"}}
_NAL_KEEP = 5  # bytes of each sample left intact: the 4-byte NAL length and the NAL header
# Every slice's payload becomes 00 01 00 01 ...: its first field (first_mb_in_slice, an
# Exp-Golomb code) then starts with 15 zero bits, far past the frame's 300 macroblocks,
# so the decoder refuses each damaged frame ("Invalid data found") instead of showing
# noise, on every run alike; and 00 01 contains no start code (00 00 01) to re-split on.
_FILL = b"\x00\x01"


def corrupt_clip(clip: Path, out: Path, start_s: float, end_s: float) -> Path:
    """A copy of an H.264 MP4 whose frames in [start_s, end_s) carry corrupt slice data.

    The container, the sample sizes and the NAL headers stay valid, so the camera serves
    and packetizes them as usual: what reaches the appliance is a well-formed RTP stream
    of H.264 that does not decode, as from a camera with a failing encoder or memory.
    """
    data = bytearray(clip.read_bytes())
    with av.open(str(clip)) as container:
        video = container.streams.video[0]
        time_base = video.time_base
        assert time_base is not None, f"{clip}: no time base"
        for packet in container.demux(video):
            if packet.pts is None or packet.pos is None or packet.size <= _NAL_KEEP:
                continue
            if start_s <= float(packet.pts * time_base) < end_s:
                n = packet.size - _NAL_KEEP
                begin = packet.pos + _NAL_KEEP
                data[begin : begin + n] = (_FILL * (n // 2 + 1))[:n]
    out.write_bytes(bytes(data))
    return out


def camera_stream(stream_id: str, url: str, **source: Any) -> dict[str, Any]:
    """A stream of one RTSP camera with the frames workflow."""
    return {"id": stream_id, "source": {"url": url, **source}, "workflow": FRAMES_WORKFLOW}


@dataclass(frozen=True, slots=True)
class Arrival:
    """One result a stream delivered."""

    stream: str
    done: float
    """perf_counter() when its workflow finished: the stream was processing then."""
    captured: float
    """Wall clock when its frame arrived from the camera."""
    index: int
    """The clip frame number drawn into its picture (tests.support.media)."""


class Arrivals:
    """A runtime subscriber that keeps every result's arrival; waits are thread-safe."""

    def __init__(self) -> None:
        self._items: list[Arrival] = []
        self._cond = threading.Condition()

    def __call__(self, result: FrameResult) -> None:
        arrival = Arrival(
            result.stream_id, result.done_mono, result.capture_time, frame_index(result.captured())
        )
        with self._cond:
            self._items.append(arrival)
            self._cond.notify_all()

    def of(self, stream: str, after: float = 0.0, before: float = float("inf")) -> list[Arrival]:
        """`stream`'s results done in (after, before), oldest first."""
        with self._cond:
            return [a for a in self._items if a.stream == stream and after < a.done < before]

    def wait(
        self, stream: str, count: int = 1, after: float = 0.0, timeout: float = WAIT_S
    ) -> list[Arrival]:
        """The first `count` results of `stream` done after `after`; fails on timeout."""
        with self._cond:
            ok = self._cond.wait_for(lambda: len(self.of(stream, after)) >= count, timeout)
        got = self.of(stream, after)
        assert ok, f"{stream}: {len(got)} of {count} results within {timeout} s"
        return got[:count]

    def wait_first(
        self, stream: str, matches: Callable[[Arrival], bool], timeout: float = WAIT_S
    ) -> Arrival:
        """The first result of `stream` that `matches`; fails on timeout."""

        def first() -> Arrival | None:
            return next((a for a in self.of(stream) if matches(a)), None)

        with self._cond:
            self._cond.wait_for(lambda: first() is not None, timeout)
        found = first()
        assert found is not None, f"{stream}: no such result within {timeout} s"
        return found

    def fps(self, stream: str, start: float, end: float) -> float:
        """`stream`'s results per second in the window [start, end]."""
        return len(self.of(stream, start, end)) / (end - start)


def measure_fps(seen: Arrivals, stream: str, frames: int) -> float:
    """`stream`'s fps from now over its next `frames` results (a window, not a sleep)."""
    start = time.perf_counter()
    seen.wait(stream, frames, after=start)
    return seen.fps(stream, start, time.perf_counter())


def start_appliance(folder: Path, doc: dict[str, Any], seen: Arrivals) -> LiveServer:
    """The HTTP server and runtime of `doc`, in-process; `seen` gets every result."""
    doc = {"server": {"token": TOKEN}, **doc}
    live = LiveServer(write_yaml(folder, doc, "config.yaml"), token=TOKEN)
    live.runtime.subscribe(seen)
    return live.start()


def states(live: LiveServer, stream: str) -> list[str]:
    """The stream's recent states, oldest first, as `GET /v1/streams/{id}` lists them."""
    return [t["state"] for t in live.stream(stream)["transitions"]]


def wait_state(live: LiveServer, stream: str, state: str) -> dict[str, Any]:
    """`GET /v1/streams/{id}` once the stream is in `state`."""
    wait_for(lambda: live.stream(stream)["state"] == state, WAIT_S, f"{stream} {state}")
    return live.stream(stream)


def transition(live: LiveServer, stream: str, text: str) -> dict[str, Any]:
    """The stream's first listed transition whose reason contains `text`, once there is one
    (the history, not the current state: a short state is not missed between polls)."""

    def find() -> dict[str, Any] | None:
        listed = live.stream(stream)["transitions"]
        return next((dict(t) for t in listed if text in t["reason"]), None)

    wait_for(lambda: find() is not None, WAIT_S, f"{stream}: a transition saying {text!r}")
    found = find()
    assert found is not None
    return found


def metric(live: LiveServer, name: str, **labels: str) -> float | None:
    """One sample of `GET /metrics` (a real scrape); None when absent."""
    reply = live.call("GET", "/metrics")
    assert reply.status == 200, reply.body[:300]
    for family in text_string_to_metric_families(reply.body.decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


def in_order(wanted: Sequence[str], got: Sequence[str]) -> bool:
    """`wanted` appears in `got` in that order (other items may come between)."""
    rest = iter(got)
    return all(any(item == w for item in rest) for w in wanted)
