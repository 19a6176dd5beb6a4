"""`appliance serve` with a camera whose stream ends (GStreamer's RTSP server playing a
clip once per session): the API's transitions show `reconnecting` at the clip's end,
its reason naming the end of the stream, not the stall timeout 5 s later, then `running`
again as the camera plays the clip to the new session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.appliance import Served
from tests.support.media import MakeClip
from tests.support.rtsp import RtspServerFactory

pytestmark = pytest.mark.rtsp

CLIP_S = 2.0
PROMPT_S = 1.0  # the end of the stream to `reconnecting`, at most
FRAMES_ONLY = {"name": "frames", "blocks": [], "outputs": {"video": "frame"}}


def transitions(served: Served) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = served.json("/v1/streams/cam")["transitions"]
    return found


def after(found: list[dict[str, Any]], state: str, start: int = 0) -> int | None:
    """The index of the first transition into `state` at or after `start`."""
    return next((i for i, t in enumerate(found) if i >= start and t["state"] == state), None)


def test_a_camera_whose_stream_ends_reconnects_at_once_in_the_api(
    rtsp_server: RtspServerFactory,
    make_clip: MakeClip,
    write_config: Callable[[dict[str, Any]], Path],
    serve: Callable[..., Served],
) -> None:
    """The clip plays in real time from `running` (its first frame) on, so its end comes
    at most CLIP_S after that transition; `reconnecting` must follow within PROMPT_S."""
    camera = rtsp_server(make_clip(160, 120, fps=15, seconds=CLIP_S), once=True)
    source = {"url": camera.url, "stall_timeout_s": 5.0,
              "backoff": {"initial_s": 0.1, "max_s": 0.5, "jitter": 0.0}}  # fmt: skip
    config = write_config({"streams": [{"id": "cam", "source": source, "workflow": FRAMES_ONLY}]})
    served = serve(config)

    def reconnected_and_running() -> bool:
        found = transitions(served)
        ended = after(found, "reconnecting")
        return ended is not None and after(found, "running", ended) is not None

    served.wait_for(reconnected_and_running, 30.0, "reconnecting, then running again")
    found = transitions(served)
    running, ended = after(found, "running"), after(found, "reconnecting")
    assert running is not None and ended is not None
    reason = found[ended]["reason"]
    assert "end of stream" in reason and "RTCP BYE" in reason, found
    took = found[ended]["time"] - found[running]["time"]
    assert took < CLIP_S + PROMPT_S, f"reconnecting {took:.2f} s after running: {found}"
