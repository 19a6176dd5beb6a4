"""A runtime with a fast regression watch (1 s intervals, 4 s of learning) on the bundled
clip, its sinks a real mosquitto and a real HTTP receiver, and a real cause of slowness:
the CenterFace model's input size, changed in the workflow file and reloaded. `learned`:
one such runtime a module, its baselines learned (about 6 s), shared by the tests that
need one."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from appliance.config import load_config
from appliance.observe.status import as_json
from appliance.runtime.runtime import Runtime
from tests.sinks.conftest import Broker, Received, Subscriber
from tests.sinks.receiver import Receiver
from tests.support.appliance import DEMO_CLIP, MODELS, ROOT
from tests.support.processes import free_port

LEARNED_S = 40.0  # warm-up and learning (5 s) on a busy 2-core box, with room
BLUR = ROOT / "configs" / "workflows" / "privacy_blur.yaml"
# CenterFace input: about 8 times the pixels. Measured under load (a second pytest worker
# and a spinning neighbour on this 2-core box): the faces block 8 to 26 times slower, and
# after the host's share is taken out (judge.py) still 6.4 times the gate's widened bar.
SMALL, LARGE = [320, 192], [960, 544]
FAST_WATCH = {  # a frame every 67 ms (15 fps): up to 15 samples an interval, 60 to learn
    "interval_s": 1,
    "warmup_s": 1,
    "learn_s": 4,
    # A slowed faces block runs 0.2-0.9 s a frame under load (ORT's profiler adds half to
    # a sampled run): a window must hold a whole span of it, with room (1 s held none).
    "evidence_s": 4,
    "recover_intervals": 2,
    # 1 s intervals against 4 s of learning swing with the load: the same SMALL rows
    # moved up to 0.89 beyond the host's factor in 244 comparisons under load (one false
    # regression at the default 25 %). 200 %: never reached by load, and LARGE's shift is
    # more than three times it. The default gate is trace diff's (tests/tools, judge.py).
    "fail_over_pct": 200,
}


class WatchSetup:
    """`faces-cam` runs a copy of privacy_blur.yaml at SMALL; `faces(LARGE)` makes its
    `faces` block heavier for real (a reload loads the model anew at that size)."""

    def __init__(self, folder: Path, mqtt_port: int | None, hook: str | None) -> None:
        self.folder = folder
        self.workflow = folder / "blur.yaml"
        self.config = folder / "config.yaml"
        self.faces(SMALL, write_only=True)
        sinks: dict[str, Any] = {}
        if mqtt_port is not None:
            sinks["bus"] = {"type": "mqtt", "host": "127.0.0.1", "port": mqtt_port,
                            "topic_prefix": "t", "qos": 1}  # fmt: skip
        if hook is not None:
            sinks["hook"] = {"type": "webhook", "url": hook}
        stream = {
            "id": "faces-cam",
            "source": {"url": str(DEMO_CLIP), "loop": True, "pace": "realtime"},
            "workflow": "blur.yaml",
            "outputs": [{"sink": s} for s in sinks],
        }
        doc = {
            "profiling": {"dir": "traces", "watch": FAST_WATCH},
            "sinks": sinks,
            "streams": [stream],
        }
        self.config.write_text(yaml.safe_dump(doc), encoding="utf-8")

    def faces(self, size: list[int], write_only: bool = False) -> None:
        doc = yaml.safe_load(BLUR.read_text(encoding="utf-8"))
        faces = doc["models"]["faces"]
        faces.update(path=str(MODELS / "centerface.onnx"), providers=["cpu"], input_size=size)
        faces["session"] = {"intra_op_threads": 1}
        self.workflow.write_text(yaml.safe_dump(doc), encoding="utf-8")

    def runtime(self) -> Runtime:
        return Runtime(load_config(self.config), config_path=self.config)


STREAM_EVENTS, HOST_EVENTS = "t/faces-cam/events", "t/events"  # a stream's, every stream's
POLL_S = 0.2  # the runtime's state (learning, a window) has no event to wait on: looked at


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    """`check()`'s first true value, looked at every POLL_S until `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(POLL_S)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def watch_events(messages: list[Received], topic: str) -> list[dict[str, Any]]:
    """The watch's events among `messages` on that topic (the stream's others left out)."""
    docs = [json.loads(m.payload) for m in messages if m.topic == topic]
    return [d for d in docs if "regression" in d]


def events(sub: Subscriber, topic: str = STREAM_EVENTS) -> list[dict[str, Any]]:
    """The watch's events so far on that topic."""
    return watch_events(sub.on(topic), topic)


def await_event(
    sub: Subscriber, topic: str, since: int, match: Callable[[dict[str, Any]], bool], timeout: float
) -> dict[str, Any]:
    """The first of the watch's events on `topic` after the first `since` that matches,
    waited for as the subscriber receives them."""

    def found(messages: list[Received]) -> list[dict[str, Any]]:
        return [e for e in watch_events(messages, topic)[since:] if match(e)]

    return found(sub.wait_for(lambda messages: bool(found(messages)), timeout))[0]


def watching(rt: Runtime, stream_id: str = "faces-cam") -> bool:
    """The stream's watch has its baselines: it compares (it no longer learns)."""
    watch = as_json(rt.stream_status(stream_id)).get("watch")
    return isinstance(watch, dict) and watch["state"] == "watching"


@dataclass
class Learned:
    """A runtime whose watch has learned its baselines, its events on `sub` (since it
    started: a test reads those after the ones it found there) and `hook`."""

    setup: WatchSetup
    hook: Receiver
    sub: Subscriber
    rt: Runtime


@pytest.fixture(scope="module")
def learned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Learned]:
    """One runtime a module, learned once: each test leaves it running, as it found it
    (no regression active), except one that stops it, last."""
    if shutil.which("mosquitto") is None:
        pytest.skip("mosquitto is not installed: run sh tests/install_deps.sh")
    folder = tmp_path_factory.mktemp("watched")
    broker = Broker(free_port(), folder / "broker")
    broker.folder.mkdir()
    broker.start()
    try:
        with Receiver() as hook:
            setup = WatchSetup(folder, broker.port, hook.url)
            sub = Subscriber(broker, ["t/#"])
            rt = setup.runtime()
            try:
                rt.start()
                wait_until(lambda: watching(rt), LEARNED_S, "learning")
                yield Learned(setup, hook, sub, rt)
            finally:
                rt.stop(5.0)
                sub.close()
    finally:
        broker.stop()


@pytest.fixture
def runtimes() -> Iterator[list[Runtime]]:
    made: list[Runtime] = []
    yield made
    for rt in made:
        rt.stop(5.0)
