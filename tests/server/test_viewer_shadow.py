"""A stream's shadow in the web viewer (issue 43): `GET /v1/streams/{id}/shadow/frame`
over HTTP (the newest compared frame, both results and the frame in one answer), then the
stream's page in Debian's Chromium showing it: the same frame twice, the live detections
and the candidate's as the answer has them, misses and extras marked and listed, and
both on one canvas at the press of a button. The candidate is the live detector at a
stricter confidence (0.85 against 0.4), so the clip's less certain people are its misses.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from typing import Any

import cv2
import numpy as np
import pytest

from tests.server.chromium import Page, screenshot
from tests.server.conftest import WAIT_S, LiveFactory, config_doc, demo_stream
from tests.server.live import LiveServer, wait_for
from tests.support.appliance import detect_workflow

SHADOW = "/v1/streams/cam/shadow"
FRAME = SHADOW + "/frame"
WALL_TOKEN = "wall-display-token"  # a viewer's
STRICTER = 0.85  # the candidate's confidence threshold; the live workflow's is 0.4
DATA_URL = "data:image/jpeg;base64,"


@pytest.fixture(scope="module")
def server(module_server: LiveFactory) -> LiveServer:
    wall = {"name": "wall", "role": "viewer", "token_env": "WALL_TOKEN"}
    doc = config_doc(demo_stream("cam"), tokens=[wall])
    doc["webrtc"] = {"host_addresses": ["127.0.0.1"]}  # loopback only (TESTBED.md)
    live = module_server(doc, environ={"WALL_TOKEN": WALL_TOKEN})
    wait_for(lambda: live.stream("cam")["frames_processed"] > 0, WAIT_S, "cam processing")
    return live


def stricter(**spec: Any) -> dict[str, Any]:
    """A shadow of the live detector at STRICTER; sampled as asked, however busy."""
    workflow = detect_workflow()
    workflow["blocks"][0]["confidence"] = STRICTER
    return {"workflow": workflow, "max_live_cost": 1, **spec}


@pytest.fixture
def shadow(server: LiveServer) -> Iterator[None]:
    """A stricter shadow on `cam`, once it has compared a frame with a miss; stopped after
    the test (a test may stop it itself)."""
    assert server.call("POST", SHADOW, json_body=stricter()).status == 201
    try:
        wait_for(lambda: bool(missed_rows(server.call("GET", FRAME))), WAIT_S, "a missed person")
        yield
    finally:
        assert server.call("DELETE", SHADOW).status in (200, 404)


def missed_rows(reply: Any) -> list[int]:
    return reply.json()["missed"].get("people", []) if reply.status == 200 else []


def answered(answers: list[Any], seq: str) -> dict[str, Any]:
    """The page's /shadow/frame answer for frame `seq` (a canvas's data-seq)."""
    frames: list[dict[str, Any]] = [a.json() for a in answers if a.url.endswith("/frame") and a.ok]
    (frame,) = [f for f in frames if f["seq"] == int(seq)][-1:]
    return frame


def boxes(message: dict[str, Any]) -> int:
    """Rows with a box, over every output (what the page draws)."""
    return sum(
        1
        for rows in message["outputs"].values()
        if isinstance(rows, list)
        for row in rows
        if isinstance(row, dict) and len(row.get("box", ())) == 4
    )


# -- over HTTP ----------------------------------------------------------------------------
def test_the_frame_is_404_until_a_shadow_compared_one(server: LiveServer) -> None:
    unknown = server.call("GET", "/v1/streams/nope/shadow/frame")
    assert unknown.status == 404 and unknown.error["message"] == "unknown stream 'nope'"
    none = server.call("GET", FRAME)
    assert none.status == 404 and none.error["message"] == "stream 'cam' runs no shadow"
    # Every 10,000th frame: none is sampled within the test (11 minutes at 15 fps).
    assert server.call("POST", SHADOW, json_body=stricter(every=10_000)).status == 201
    try:
        waiting = server.call("GET", FRAME)
        assert waiting.status == 404
        assert waiting.error["message"] == "stream 'cam': its shadow has compared no frame yet"
    finally:
        assert server.call("DELETE", SHADOW).status == 200


def test_the_frame_has_both_sides_of_one_frame(server: LiveServer, shadow: None) -> None:
    reply = server.call("GET", FRAME, token=WALL_TOKEN)  # a viewer may read it
    assert reply.status == 200, reply.body[:300]
    frame = reply.json()
    live, candidate = frame["live"], frame["candidate"]
    assert frame["stream"] == live["stream"] == candidate["stream"] == "cam"
    assert frame["seq"] == live["seq"] == candidate["seq"]
    assert frame["iou"] == 0.5
    assert live["workflow"] and candidate["workflow"] and live["workflow"] != candidate["workflow"]

    # The frame: a JPEG of the frame's own size, whose pixels the boxes are in.
    assert frame["image"].startswith(DATA_URL)
    jpeg = np.frombuffer(base64.b64decode(frame["image"].removeprefix(DATA_URL)), np.uint8)
    image = cv2.imdecode(jpeg, cv2.IMREAD_COLOR)
    assert image is not None and image.shape == (frame["height"], frame["width"], 3)
    for row in live["outputs"]["people"] + candidate["outputs"]["people"]:
        x1, y1, x2, y2 = row["box"]
        assert 0 <= x1 < x2 <= frame["width"] and 0 <= y1 < y2 <= frame["height"], row

    # The same detector, stricter: the live rows it missed are those under its threshold
    # (a row at the threshold itself may go either way), and it has nothing extra.
    assert set(frame["missed"]) == set(frame["extra"]) == {"people"}
    missed = set(frame["missed"]["people"])
    assert missed and frame["extra"]["people"] == []
    for i, row in enumerate(live["outputs"]["people"]):
        if abs(row["confidence"] - STRICTER) > 0.01:
            assert (i in missed) == (row["confidence"] < STRICTER), (i, row, missed)
    assert len(live["outputs"]["people"]) - len(missed) == len(candidate["outputs"]["people"])


# -- in Chromium ------------------------------------------------------------------------------
SHOWN = """() => {
    const data = (id) => ({ ...document.getElementById(id).dataset,
                            visible: document.getElementById(id).checkVisibility() });
    return { live: data("shadow-live"), candidate: data("shadow-candidate"),
             summary: document.getElementById("shadow-summary").textContent,
             items: [...document.querySelectorAll("#shadow-misses li")].map(
                 (li) => [li.className, li.textContent]),
             painted: (() => {  // the share of opaque pixels: the frame, not just boxes
                 const c = document.getElementById("shadow-live");
                 const px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
                 return px.filter((v, i) => i % 4 === 3 && v === 255).length / (px.length / 4);
             })() };
}"""


def test_the_viewer_shows_the_shadow_side_by_side(
    server: LiveServer, shadow: None, browser: Any
) -> None:
    page = Page(browser, token=True)
    answers: list[Any] = []  # the page's own /shadow and /shadow/frame answers
    page.tab.on("response", lambda r: answers.append(r) if "/shadow" in r.url else None)
    page.tab.goto(server.url + "/streams/cam")

    page.tab.locator("#shadow-panel").wait_for(state="visible")
    page.tab.locator("#shadow-misses li.missed").first.wait_for()
    # A frame with a person the candidate missed (the fixture saw one: it is in view).
    page.tab.locator("#shadow-live:not([data-marked='0'])[data-marked]").wait_for()
    shown = page.tab.evaluate(SHOWN)
    reports = [a.json()["comparison"] for a in answers if a.url.endswith("/shadow") and a.ok]

    # One frame on both canvases, each side's boxes as the answer for it has them.
    live, candidate = shown["live"], shown["candidate"]
    assert live["seq"] == candidate["seq"] and live["visible"] and candidate["visible"]
    frame = answered(answers, live["seq"])
    assert (live["mode"], int(live["boxes"])) == ("live", boxes(frame["live"]))
    assert int(live["marked"]) == sum(map(len, frame["missed"].values()))
    assert (candidate["mode"], int(candidate["boxes"])) == ("candidate", boxes(frame["candidate"]))
    assert int(candidate["marked"]) == sum(map(len, frame["extra"].values()))
    assert shown["painted"] == 1.0  # the frame fills the canvas

    # The agreement and the newest misses, as the report the page drew said.
    over = re.search(r"over (\d+) frames", shown["summary"])
    assert over and shown["summary"].startswith("Agreement "), shown["summary"]
    (report,) = [r for r in reports if r["frames"] == int(over.group(1))][-1:]
    agreement = re.match(r"Agreement (\d\.\d{3}) \(95 % interval ", shown["summary"])
    assert agreement and float(agreement.group(1)) == pytest.approx(report["agreement"], abs=6e-4)
    listed = [(e["kind"], f"{e['kind']} on frame {e['seq']}: {e['output']} {e['label']} ")
              for e in report["examples"]]  # fmt: skip
    assert len(shown["items"]) == len(listed) and any(k == "missed" for k, _ in listed)
    for (kind, text), (want_kind, starts) in zip(shown["items"], listed, strict=True):
        assert kind == want_kind and text.startswith(starts), (text, starts)
    screenshot(page, "viewer-shadow.png")

    # Both on one canvas, then side by side again.
    page.tab.get_by_role("button", name="Overlay on one frame").click()
    merged = page.tab.evaluate(SHOWN)
    assert not merged["candidate"]["visible"] and merged["live"]["mode"] == "merged"
    frame = answered(answers, merged["live"]["seq"])
    assert int(merged["live"]["boxes"]) == boxes(frame["live"]) + boxes(frame["candidate"])
    screenshot(page, "viewer-shadow-merged.png")
    page.tab.get_by_role("button", name="Side by side").click()
    assert page.tab.locator("#shadow-candidate").is_visible()

    # Without a shadow, no panel.
    assert server.call("DELETE", SHADOW).status == 200
    page.tab.locator("#shadow-panel").wait_for(state="hidden")
    assert page.errors == []
