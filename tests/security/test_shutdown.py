"""Shutdown has a deadline, on the real `appliance serve` process: on SIGTERM the streams
stop at once, a request that finishes within `server.drain_timeout_s` gets its answer, one
that does not is cut short and named in the log, and the process exits by the drain plus
a small margin although the thread of the cut request still sleeps."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from appliance.server.serve import EXIT_MARGIN_S
from tests.security.hanging_blocks import write_distribution
from tests.support.appliance import DEMO_CLIP, ROOT, Served, clean_env, start_served

DRAIN_S = 3.0  # server.drain_timeout_s here: long enough to tell "at once" from "after it"
SLACK_S = 1.5  # the interpreter's own exit and a busy CI machine
PLUGIN_GROUP = "appliance.blocks"  # the standard group: the child finds the test blocks
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) ")  # ISO 8601, UTC


def nap_workflow(name: str, seconds: float) -> dict[str, Any]:
    return {
        "name": name,
        "blocks": [{"id": "nap", "type": "test_nap", "seconds": seconds}],
        "outputs": {"video": "nap"},
    }


@dataclass
class Request:
    """A POST /v1/workflows/run sent from a thread of its own; `done` once it ended."""

    served: Served
    workflow: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    status: int | None = None
    error: BaseException | None = None

    def start(self) -> Request:
        threading.Thread(target=self._send, name="client", daemon=True).start()
        return self

    def _send(self) -> None:
        image = cv2.imencode(".png", np.zeros((32, 32, 3), np.uint8))[1].tobytes()
        body = {"image": base64.b64encode(image).decode(), "workflow": self.workflow}
        req = urllib.request.Request(
            f"{self.served.url}/v1/workflows/run",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                self.status = int(resp.status)
        except urllib.error.HTTPError as exc:
            self.status = exc.code
        except OSError as exc:  # the connection closed under it
            self.error = exc
        finally:
            self.done.set()


def stamp(lines: list[str], text: str) -> float:
    """The log time (s) of the first line containing `text`."""
    line = next(line for line in lines if text in line)
    match = STAMP.match(line)
    assert match, line
    return datetime.fromisoformat(match[1]).timestamp()


def test_sigterm_drains_then_cuts_requests_and_exits_by_the_deadline(
    tmp_path: Path, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    plugins = write_distribution(tmp_path / "plugins", PLUGIN_GROUP)
    env = clean_env(PYTHONPATH=os.pathsep.join([str(plugins), str(ROOT)]))
    cam = {
        "id": "cam",
        "source": {"url": str(DEMO_CLIP), "loop": True, "pace": "realtime"},
        "workflow": nap_workflow("passthrough", 0.0),
    }
    config = write_config({"server": {"drain_timeout_s": DRAIN_S}, "streams": [cam]})
    served = start_served(config, tmp_path, env=env)
    try:
        served.wait_for(
            lambda: served.json("/v1/streams/cam")["frames_processed"] > 0, 30, "cam processing"
        )
        quick = Request(served, nap_workflow("quick", 1.0)).start()
        slow = Request(served, nap_workflow("slow", 60.0)).start()
        served.wait_for(lambda: "nap started: 60.0 s" in served.log(), 30, "the slow request")
        served.wait_for(lambda: "nap started: 1.0 s" in served.log(), 30, "the quick request")

        began = time.monotonic()
        served.process.send_signal(signal.SIGTERM)
        code = served.process.wait(DRAIN_S + EXIT_MARGIN_S + 30)
        took = time.monotonic() - began
    finally:
        served.stop()

    log = served.log_path.read_text(encoding="utf-8")
    assert code == 0, log[-3000:]
    assert took < DRAIN_S + EXIT_MARGIN_S + SLACK_S, (took, log[-3000:])
    assert took > DRAIN_S - 0.5, took  # the slow request did get its drain

    assert quick.done.wait(10) and slow.done.wait(10)
    assert quick.status == 200, quick.error  # finished within the drain: answered
    assert slow.status is None and slow.error is not None  # cut: its connection closed

    lines = log.splitlines()
    assert any(re.search(r"cut short POST /v1/workflows/run \(running \d", li) for li in lines)
    assert "1 request(s) cut short" in log
    assert "abandoning threads still at work" in log  # the slow nap's thread
    # The streams stopped at once, well before the drain ran out.
    assert stamp(lines, "streams stopped") - stamp(lines, "shutting down") < 1.0, log[-3000:]
    assert stamp(lines, "streams stopped") < stamp(lines, "cut short")
    assert "shutting down: streams stop now; 2 request(s) in flight" in log


def test_a_finalizer_that_blocks_does_not_hold_the_process_after_its_shutdown(
    tmp_path: Path, write_config: Callable[[dict[str, Any]], Path]
) -> None:
    """Once its shutdown is over, `appliance serve` ends without the interpreter's
    finalization, where a blocking destructor (here a block's object whose `__del__`
    sleeps 120 s) would hold it with nothing left to end it: Python's daemon threads, the
    exit deadline's included, cannot run once finalization has begun. A worker of
    `serve --workers` stayed alive so after logging "shut down in 0.5 s"."""
    plugins = write_distribution(tmp_path / "plugins", PLUGIN_GROUP)
    env = clean_env(PYTHONPATH=os.pathsep.join([str(plugins), str(ROOT)]))
    cam = {
        "id": "cam",
        "source": {"url": str(DEMO_CLIP), "loop": True, "pace": "realtime"},
        "workflow": {
            "name": "lingers",
            "blocks": [{"id": "linger", "type": "test_linger"}],
            "outputs": {"video": "linger"},
        },
    }
    config = write_config({"server": {"drain_timeout_s": DRAIN_S}, "streams": [cam]})
    served = start_served(config, tmp_path, env=env)
    try:
        served.wait_for(
            lambda: served.json("/v1/streams/cam")["frames_processed"] > 0, 30, "cam processing"
        )
        served.process.send_signal(signal.SIGTERM)
        # Far less than the finalizer's 120 s, far more than a shutdown takes here.
        code = served.process.wait(DRAIN_S + EXIT_MARGIN_S + 30)
    finally:
        served.stop()
    log = served.log_path.read_text(encoding="utf-8")
    assert code == 0, log[-3000:]
    assert "shut down in" in log
    assert "abandoning threads" not in log, log[-3000:]  # nothing was at work
