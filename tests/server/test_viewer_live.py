"""The viewer as an operator keeps it open all day, in Debian's Chromium: the player comes
back by itself after the appliance is killed and started again, and after the server
drops its session; a stream whose camera is down says why in the page (not in a
tooltip); the grid plays every stream as a tile and stops the tiles out of view; the
boxes the page draws over the raw video belong to the frame they are drawn on.
Screenshots go to tests/artifacts/."""

from __future__ import annotations

import itertools
import re
import statistics
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from appliance.server.routes.webrtc import WEBRTC
from tests.server.chromium import Page, screenshot
from tests.server.conftest import WAIT_S, LiveFactory, config_doc
from tests.server.live import LiveServer, wait_for, write_yaml
from tests.support.appliance import DEMO_CLIP, detect_workflow, start_served
from tests.support.media import Image, write_clip
from tests.support.processes import free_port

COMEBACK_S = 10.0  # the bound: back by itself within 10 s of the appliance
PLAIN = {"name": "plain", "outputs": {"video": "frame"}}  # no block: the video path only
LOOPBACK = {"host_addresses": ["127.0.0.1"]}  # ../shared/TESTBED.md, WebRTC on loopback
# Records every phase the large player goes through (#media's data-phase), in order.
RECORD_PHASES = """() => {
    window.phases = [document.getElementById("media").dataset.phase];
    new MutationObserver(() => window.phases.push(document.getElementById("media").dataset.phase))
        .observe(document.getElementById("media"), {attributes: true});
}"""


def plain_stream(stream_id: str, **source: Any) -> dict[str, Any]:
    src = {"url": str(DEMO_CLIP), "loop": True, "pace": "realtime", **source}
    return {"id": stream_id, "source": src, "workflow": PLAIN}


def wait_playing(page: Page, timeout_s: float = WAIT_S) -> None:
    page.tab.locator("#media[data-phase='playing']").wait_for(timeout=timeout_s * 1000)


def session_ids(live: LiveServer) -> list[str]:
    assert live.app is not None
    sessions = live.app[WEBRTC]
    return live.call_in_loop(sessions.session_ids)


# -- coming back ------------------------------------------------------------------------------
def test_the_player_comes_back_after_the_appliance_is_killed(browser: Any, tmp_path: Path) -> None:
    doc = config_doc(plain_stream("cam"))
    doc["webrtc"] = LOOPBACK
    config = write_yaml(tmp_path, doc, "config.yaml")
    served = start_served(config, tmp_path)
    port = int(served.url.rsplit(":", 1)[1])
    try:
        page = Page(browser, token=True)
        page.tab.goto(served.url + "/streams/cam")
        wait_playing(page)
        page.tab.wait_for_function("() => document.getElementById('video-latency')"
                                   ".textContent.startsWith('p50 ')")  # fmt: skip

        served.process.kill()  # no goodbye: no session closed, no answer any more
        served.process.wait(10)
        page.tab.locator("#media:not([data-phase='playing'])").wait_for()
        # It says what it does and why, and no figure of the dead session stays.
        # Both texts read at once, when the notice first says it retries: the page sets
        # them together, and the retry (0.4 s later) changes both.
        shown = page.tab.wait_for_function(
            """() => {
                const text = (id) => document.getElementById(id).innerText;
                return text('notice').includes('Retrying in')
                    && {notice: text('notice'), status: text('video-status')};
            }"""
        ).json_value()
        assert shown["notice"].startswith("Video lost: "), shown["notice"]
        assert shown["status"] == shown["notice"]
        for figure in ("#video-latency", "#predictions-latency", "#video-fps", "#msg-fps"):
            assert page.text(figure) == "–", figure
        page.tab.wait_for_function(
            "() => document.getElementById('status').textContent.includes('does not answer')"
        )
        screenshot(page, "viewer-appliance-down.png")

        served = start_served(config, tmp_path, port=port)  # the same address again
        started = time.monotonic()
        wait_playing(page, COMEBACK_S)
        assert time.monotonic() - started <= COMEBACK_S
        assert page.text("#notice") == "" and page.text("#video-status") == "Playing."
        page.tab.wait_for_function("() => document.getElementById('status').textContent === ''")
        assert page.errors == []
    finally:
        served.stop()


@pytest.fixture(scope="module")
def grid_server(module_server: LiveFactory) -> LiveServer:
    """Four streams of the bundled clip, and one whose camera does not answer."""
    dead = f"rtsp://127.0.0.1:{free_port()}/nothing"  # refused: the stream reconnects
    streams = [*(plain_stream(f"cam{i}") for i in range(4)), plain_stream("down", url=dead)]
    doc = config_doc(*streams)
    doc["webrtc"] = LOOPBACK
    live = module_server(doc)
    running = lambda: all(live.stream(f"cam{i}")["frames_processed"] > 0 for i in range(4))  # noqa: E731
    wait_for(running, WAIT_S, "every cam processing")
    wait_for(lambda: live.stream("down")["state"] == "reconnecting", WAIT_S, "down reconnecting")
    return live


def test_a_session_the_server_drops_comes_back(grid_server: LiveServer, browser: Any) -> None:
    page = Page(browser, token=True)
    page.tab.goto(grid_server.url + "/streams/cam0")
    wait_playing(page)
    page.tab.evaluate(RECORD_PHASES)
    (old,) = session_ids(grid_server)  # the module's first page; the grid is hidden

    assert grid_server.call("DELETE", f"/v1/webrtc/{old}").status == 204
    page.tab.wait_for_function("() => window.phases.includes('retrying')")
    assert "the appliance ended the session" in page.text("#notice") or page.phase() != ("retrying")
    wait_playing(page, COMEBACK_S)
    phases = page.tab.evaluate("() => window.phases")
    assert phases[0] == "playing" and phases[-1] == "playing" and "retrying" in phases, phases
    assert old not in session_ids(grid_server) and len(session_ids(grid_server)) == 1
    assert page.errors == []


def test_a_stream_whose_camera_is_down_says_why(grid_server: LiveServer, browser: Any) -> None:
    error = grid_server.stream("down")["last_error"].split("; retrying in")[0]  # its delay moves
    assert "connection refused" in error
    page = Page(browser, token=True)
    page.tab.goto(grid_server.url + "/streams/down")
    # In the page, as text (a phone shows no tooltip): the state and the camera's error,
    # over the video instead of a black frame.
    page.tab.locator("#stream-error", has_text="The camera is reconnecting").wait_for()
    assert error in page.text("#stream-error")
    page.tab.locator("#media[data-phase='waiting']").wait_for()
    notice = page.text("#notice")
    assert notice.startswith("The camera is reconnecting: ") and error in notice, notice
    assert (
        page.tab.locator("#video").is_hidden()
        or page.tab.evaluate("() => getComputedStyle(document.getElementById('video')).visibility")
        == "hidden"
    )
    screenshot(page, "viewer-camera-down.png")
    assert page.errors == []


def test_the_grid_plays_every_stream_and_stops_tiles_out_of_view(
    grid_server: LiveServer, browser: Any
) -> None:
    # Sessions of the module's earlier tests' pages may linger until the server sees
    # their peers gone (ICE consent): only this page's are counted.
    before = set(session_ids(grid_server))

    def sessions() -> int:
        return len(set(session_ids(grid_server)) - before)

    page = Page(browser, token=True)
    page.tab.goto(grid_server.url + "/")
    tiles = page.tab.locator("article.tile")
    for i in range(4):
        tile = page.tab.locator(f"article.tile[data-stream='cam{i}']")
        tile.locator(".state", has_text="running").wait_for()
        page.tab.locator(f"article.tile[data-stream='cam{i}'][data-phase='playing']").wait_for()
        assert tile.locator(".badge").inner_text() == "healthy"
    assert tiles.count() == 5
    down = page.tab.locator("article.tile[data-stream='down']")
    down.locator(".tile-notice", has_text="The camera is reconnecting").wait_for()
    # Each tile is a small session: 320 px wide at most.
    width = page.tab.evaluate(
        "() => document.querySelector(\"article.tile[data-stream='cam0'] video\").videoWidth"
    )
    assert 0 < width <= 320
    wait_for(lambda: sessions() == 5, WAIT_S, "a session per tile")
    screenshot(page, "viewer-grid.png")

    # A window that shows one tile: the others' sessions end; bigger again, they return.
    page.tab.set_viewport_size({"width": 360, "height": 260})
    wait_for(lambda: sessions() == 1, WAIT_S, "only the tile in view")
    assert page.tab.locator("article.tile[data-phase='playing']").count() <= 1
    page.tab.set_viewport_size({"width": 1100, "height": 900})
    wait_for(lambda: sessions() == 5, WAIT_S, "every tile again")

    # Opening one stream large hides the grid and ends every tile's session.
    page.tab.locator("article.tile[data-stream='cam1'] .tile-media").click()
    wait_playing(page)
    assert page.tab.url.endswith("/streams/cam1")
    wait_for(lambda: sessions() == 1, WAIT_S, "only the large view")
    assert page.errors == []


def test_the_grid_keeps_within_the_session_limit(live_server: LiveFactory, browser: Any) -> None:
    doc = config_doc(*(plain_stream(f"cam{i}") for i in range(3)))
    doc["webrtc"] = {**LOOPBACK, "max_sessions": 2}
    live = live_server(doc)
    page = Page(browser, token=True)
    page.tab.goto(live.url + "/")
    page.tab.locator("article.tile[data-phase='playing']").nth(1).wait_for()
    # The third tile was refused (429): it says so, and waits for its turn.
    left = page.tab.locator("article.tile:not([data-phase='playing'])")
    left.locator(".tile-notice", has_text="no free video session").wait_for()
    assert "webrtc.max_sessions" in left.locator(".tile-notice").inner_text()
    assert left.count() == 1 and len(session_ids(live)) == 2
    assert page.errors == []


# -- the page's own overlay -----------------------------------------------------------------------
MOVER_W, MOVER_H, MOVER_FPS = 640, 360, 15
STEP_PX = 40  # the person moves this far each frame: a box one frame off is 40 px off
GREY = 128


def mover_frames() -> Any:
    """Frame i of a clip where a person (cut from the bundled clip) crosses a grey
    background left to right, STEP_PX per frame, again and again."""
    capture = cv2.VideoCapture(str(DEMO_CLIP))
    capture.set(cv2.CAP_PROP_POS_FRAMES, 30)  # 2 s in: the astronaut's photo at the left
    ok, picture = capture.read()
    capture.release()
    assert ok
    person = cv2.resize(picture[:540, :380], (211, 300), interpolation=cv2.INTER_AREA)
    span = MOVER_W - person.shape[1] - 16

    def draw(i: int, width: int, height: int) -> Image:
        frame = np.full((height, width, 3), GREY, np.uint8)
        x = 8 + (i * STEP_PX) % span
        frame[30 : 30 + person.shape[0], x : x + person.shape[1]] = person
        return frame

    return draw


# The test's own look at each presented frame (the same requestVideoFrameCallback the page
# uses): where the person's patch is in the pixels, by RTP timestamp; and what the page's
# overlay drew, by RTP timestamp (its "overlay" event).
WATCH_OVERLAY = """() => {
    window.patches = new Map();
    window.drawn = [];
    const video = document.getElementById("video");
    document.getElementById("overlay").addEventListener("overlay",
        (e) => window.drawn.push(e.detail));
    const canvas = document.createElement("canvas");
    const ctx = canvas.getContext("2d", {willReadFrequently: true});
    // The pixels drawImage reads are the element's frame when it runs, which is the one
    // `meta` describes only if no later frame was presented meanwhile: a callback that
    // ran late (frames went by since the last one) is not trusted with the pixels.
    let presented = -1;
    const look = (now, meta) => {
        const w = video.videoWidth, h = video.videoHeight;
        const onTime = meta.presentedFrames === presented + 1;
        presented = meta.presentedFrames;
        if (w && onTime) {
            canvas.width = w; canvas.height = h;
            ctx.drawImage(video, 0, 0, w, h);
            const px = ctx.getImageData(0, 0, w, h).data;
            const cols = [];
            for (let x = 0; x < w; x++) {
                let n = 0;
                for (let y = 0; y < h; y += 3) {
                    const i = (y * w + x) * 4;
                    if (Math.abs(px[i] - 128) + Math.abs(px[i + 1] - 128)
                        + Math.abs(px[i + 2] - 128) > 60) n++;
                }
                if (n > h / 6) cols.push(x); // the patch is 300 rows tall of 360
            }
            if (cols.length) window.patches.set(meta.rtpTimestamp, [cols[0], cols.at(-1)]);
        }
        video.requestVideoFrameCallback(look);
    };
    video.requestVideoFrameCallback(look);
}"""


def test_the_boxes_drawn_by_the_page_belong_to_their_frame(
    live_server: LiveFactory, browser: Any, tmp_path: Path
) -> None:
    clip = write_clip(tmp_path / "mover.mp4", MOVER_W, MOVER_H, MOVER_FPS, 4.0,
                      faststart=False, draw=mover_frames())  # fmt: skip
    workflow = detect_workflow()
    workflow["blocks"] += [
        {"id": "tracks", "type": "track", "detections": "people"},
        {"id": "door", "type": "line_counter", "tracks": "tracks",
         "line": [[0.5, 0.05], [0.5, 0.95]]},
    ]  # fmt: skip
    workflow["outputs"]["door"] = "door"
    stream = {"id": "mover", "workflow": workflow,
              "source": {"url": str(clip), "loop": True, "pace": "realtime"}}  # fmt: skip
    doc = config_doc(stream)
    doc["webrtc"] = LOOPBACK
    live = live_server(doc)
    page = Page(browser, token=True)
    page.tab.set_viewport_size({"width": 390, "height": 844})  # a phone's
    page.tab.goto(live.url + "/streams/mover")
    page.tab.select_option("#video-mode", "raw")  # the page draws the boxes
    wait_playing(page)
    page.tab.evaluate(WATCH_OVERLAY)
    page.tab.wait_for_function("() => window.drawn.filter((d) => d.boxes?.length).length >= 30")
    screenshot(page, "viewer-overlay-phone.png")
    # The counts, as text over the video, big enough to read on a phone.
    count = page.tab.locator("#counts .count", has_text="door")
    assert re.fullmatch(r"door in \d+ · out \d+ · total \d+", count.inner_text()), (
        count.inner_text()
    )
    size = count.evaluate("(e) => parseFloat(getComputedStyle(e).fontSize)")
    assert size >= 16
    media, chip = page.tab.locator("#media").bounding_box(), count.bounding_box()
    assert (
        media and chip and media["y"] <= chip["y"] <= media["y"] + media["height"] - chip["height"]
    )
    drawn = page.tab.evaluate("() => window.drawn")
    patches = {int(k): v for k, v in page.tab.evaluate("() => [...window.patches]")}

    # The box's centre against the patch's, in the same presented frame: the detector
    # sees the same picture each time, moved, so the offset holds still but for the
    # detector's own jitter (up to ~13 px here: its 32 px stride against the motion);
    # against the frame presented before, it moves by the person's motion. Every box is
    # nearer its own frame's person than a neighbour's would be (half a step), and
    # against the previous frame the offsets are a whole step off.
    order = sorted(patches)
    # A patch read after the next frame replaced the one described (the page was busy)
    # is that next frame's: the same as its successor's, never the person's own place.
    for rtp, after in itertools.pairwise(order):
        if patches[rtp] == patches[after]:
            del patches[rtp]
    order = sorted(patches)
    offsets, shifted = [], []
    for d in drawn:
        if not d["boxes"] or d["rtp"] not in patches:
            continue
        (x1, _, x2, _) = max(d["boxes"], key=lambda b: (b[2] - b[0]) * (b[3] - b[1]))
        box_cx = (x1 + x2) / 2
        lo, hi = patches[d["rtp"]]
        offsets.append(box_cx - (lo + hi) / 2)
        before = order.index(d["rtp"]) - 1
        if before >= 0:
            plo, phi = patches[order[before]]
            shifted.append(box_cx - (plo + phi) / 2)
    assert len(offsets) >= 20, (len(drawn), len(patches))
    centre = statistics.median(offsets)
    assert max(abs(o - centre) for o in offsets) < STEP_PX / 2, offsets
    assert statistics.median(abs(s - centre) for s in shifted) >= STEP_PX * 0.75, shifted
    assert page.errors == []
