"""A stream draws its video only while someone reads it (appliance/runtime/video.py): an
MJPEG reader for as long as it stays, a snapshot for a lease, `draw: always` for good. With
nobody watching, its results carry no image and the drawing blocks do not run."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from appliance.config import ConfigError, parse_config
from appliance.runtime.runtime import Runtime
from pipelines.blocks._draw import PALETTE
from tests.server.conftest import WAIT_S, LiveFactory, config_doc, demo_stream
from tests.server.live import LiveServer, wait_for
from tests.server.test_results import reading

LINE_X = 0.5  # the drawn line, as a fraction of the frame's width
# A vertical line mid-frame, drawn whatever the frame shows: what a drawn frame has.
DRAWING = {
    "name": "line",
    "blocks": [{"id": "drawn", "type": "annotate",
                "lines": [{"name": "door", "points": [[LINE_X, 0.1], [LINE_X, 0.9]]}]}],
    "outputs": {"video": "drawn"},
}  # fmt: skip


def stream(stream_id: str, **extra: Any) -> dict[str, Any]:
    return {**demo_stream(stream_id), "workflow": DRAWING, **extra}


def newest_image(rt: Runtime, stream_id: str) -> np.ndarray | None:
    latest = rt.latest.get(stream_id)
    assert latest is not None
    return latest.result.image


def started(rt: Runtime, stream_id: str) -> bool:
    return rt.latest.get(stream_id) is not None


def undrawn(rt: Runtime, stream_id: str) -> bool:
    """The newest result of the stream has no image, and its drawing did not run."""
    latest = rt.latest.get(stream_id)
    if latest is None:
        return False
    return latest.result.image is None and list(latest.result.block_spans) == [None]


def has_the_line(image: np.ndarray) -> bool:
    """The line's colour down the middle column (JPEG moves colours a little)."""
    height, width = image.shape[:2]
    column = image[height // 4 : 3 * height // 4, round(LINE_X * width)].astype(int)
    return bool(np.abs(np.median(column, axis=0) - np.array(PALETTE[-1])).max() < 40)


def decode(jpeg: bytes) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None
    return image


def mjpeg_part(resp: Any) -> np.ndarray:
    assert resp.readline() == b"--frame\r\n"
    headers = {}
    while (line := resp.readline()) != b"\r\n":
        name, _, value = line.decode().partition(":")
        headers[name.lower()] = value.strip()
    image = decode(resp.read(int(headers["content-length"])))
    assert resp.readline() == b"\r\n"
    return image


def test_a_stream_draws_only_while_someone_reads_its_video(live_server: LiveFactory) -> None:
    server: LiveServer = live_server(config_doc(stream("cam"), stream("kept", draw="always")))
    rt = server.runtime
    for stream_id in ("cam", "kept"):  # each stream's first result: they start apart
        wait_for(partial(started, rt, stream_id), WAIT_S, f"{stream_id}'s first result")
    wait_for(lambda: undrawn(rt, "cam"), WAIT_S, "cam to run without drawing")
    kept = newest_image(rt, "kept")
    assert kept is not None and has_the_line(kept)  # draw: always

    # An MJPEG reader: every part it gets is drawn, and the stream draws while it reads.
    with reading(server, "/v1/streams/cam/video.mjpeg?max_fps=10") as resp:
        assert resp.status == 200
        for _ in range(3):
            assert has_the_line(mjpeg_part(resp))
        image = newest_image(rt, "cam")
        assert image is not None and has_the_line(image)
    # It left: the stream stops drawing (noticed at the route's next write).
    wait_for(lambda: undrawn(rt, "cam"), WAIT_S, "cam to stop drawing after the reader left")

    # A snapshot asked while nobody watched: the next drawn frame, then a lease.
    reply = server.call("GET", "/v1/streams/cam/snapshot.jpg")
    assert reply.status == 200 and has_the_line(decode(reply.body))
    image = newest_image(rt, "cam")
    assert image is not None and has_the_line(image)  # still drawing: the lease holds


def test_an_unknown_draw_setting_is_named_with_its_stream(tmp_path: Path) -> None:
    doc = config_doc(stream("cam"), stream("other", draw="sometimes"))
    with pytest.raises(ConfigError) as info:
        parse_config(doc, tmp_path)
    assert info.value.problems == [
        "streams[1].draw: Input should be 'on_demand' or 'always' (got 'sometimes')"
    ]
