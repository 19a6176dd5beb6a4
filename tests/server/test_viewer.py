"""The web viewer: its page and assets over HTTP (open without a token, strict headers,
nothing served by name from the request), then the page itself in Debian's Chromium,
driven by Playwright, against a live server running the bundled clip: the token, the
stream list, the per-block latency table, a profiling window and its trace download, a
block in regression and a slower host as the regression watch reports them, and, once the
server has its WebRTC route, the video and its live predictions."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from appliance.server.routes.viewer import ASSETS as VIEWER_ASSETS
from appliance.server.routes.viewer import CSP
from tests.server.chromium import Page, screenshot
from tests.server.conftest import TOKEN, WAIT_S, LiveFactory, config_doc, demo_stream
from tests.server.live import LiveServer, wait_for
from tests.support.appliance import ROOT

PAGES = {"/": "text/html", "/streams/cam": "text/html", "/streams/no-such-cam": "text/html"}
ASSETS = {path: kind for path, (_, kind) in VIEWER_ASSETS.items()}
STATIC = ROOT / "appliance" / "server" / "static"
NOT_ASSETS = (
    "/static/index.html",
    "/static/nope.js",
    "/static/../routes/viewer.py",
    "/static/%2e%2e/routes/viewer.py",
    "/streams/cam/extra",
    "/viewer.js",
)


WALL_TOKEN = "wall-display-token"  # a viewer's: a display that shows streams only


@pytest.fixture(scope="module")
def server(module_server: LiveFactory) -> LiveServer:
    wall = {"name": "wall", "role": "viewer", "token_env": "WALL_TOKEN"}
    doc = config_doc(demo_stream("cam"), tokens=[wall])
    doc["webrtc"] = {"host_addresses": ["127.0.0.1"]}  # loopback only (TESTBED.md)
    live = module_server(doc, environ={"WALL_TOKEN": WALL_TOKEN})
    wait_for(lambda: live.stream("cam")["frames_processed"] > 0, WAIT_S, "cam processing")
    return live


# -- over HTTP ----------------------------------------------------------------------------
@pytest.mark.parametrize(("path", "kind"), [*PAGES.items(), *ASSETS.items()])
def test_the_page_and_assets_need_no_token(server: LiveServer, path: str, kind: str) -> None:
    reply = server.call("GET", path, token=False)
    assert reply.status == 200, reply.body[:300]
    assert reply.headers["content-type"] == f"{kind}; charset=utf-8"
    assert reply.headers["content-security-policy"] == CSP
    assert reply.headers["x-content-type-options"] == "nosniff"
    assert reply.headers["cache-control"] == "no-cache"
    name = "index.html" if kind == "text/html" else VIEWER_ASSETS[path][0]
    assert reply.body == (STATIC / name).read_bytes()


def test_the_policy_is_strict() -> None:
    directives = dict(d.strip().split(" ", 1) for d in CSP.split(";"))
    assert directives["default-src"] == "'self'" and directives["script-src"] == "'self'"
    assert directives["style-src"] == "'self'" and directives["connect-src"] == "'self'"
    assert "unsafe" not in CSP


def test_only_the_listed_assets_are_served(server: LiveServer) -> None:
    for path in NOT_ASSETS:
        assert server.call("GET", path, token=False).status == 401, path  # unknown: no probing
        assert server.call("GET", path).status == 404, path
    assert server.call("GET", "/v1/streams", token=False).status == 401  # the API still needs it


def test_the_viewer_stays_open_when_probes_are_closed(live_server: LiveFactory) -> None:
    live = live_server(config_doc(open_probes=False))
    assert live.call("GET", "/health", token=False).status == 401
    assert live.call("GET", "/streams/x", token=False).status == 200
    document = live.get_json("/openapi.json")
    assert document["paths"]["/"]["get"]["security"] == []
    assert document["paths"]["/v1/streams/{id}/latency"]["get"]["security"] == [{"bearer": []}]


# -- in Chromium -----------------------------------------------------------------------------
def enter_token(page: Page, token: str = TOKEN) -> None:
    form = page.tab.locator("#token-form")
    form.wait_for(state="visible")
    page.tab.get_by_label("API token").fill(token)
    page.tab.get_by_role("button", name="Use token").click()
    form.wait_for(state="hidden")


def test_the_viewer_lists_streams_shows_latency_and_profiles(
    server: LiveServer, browser: Any, tmp_path: Path
) -> None:
    page = Page(browser)
    page.tab.goto(server.url + "/")
    page.tab.locator("#token-form").wait_for(state="visible")  # on the first 401
    assert "needs its API token" in page.text("#token-reason")
    enter_token(page)

    tile = page.tab.locator("article.tile[data-stream='cam']")
    tile.locator(".state", has_text="running").wait_for()
    tile.get_by_role("link", name="Open cam").click()
    assert page.tab.url == server.url + "/streams/cam"
    assert page.text("#stream-name") == "cam"
    assert page.tab.locator("#grid").is_hidden()  # its tiles' sessions stop meanwhile

    # The per-block latency table: the whole run, then the workflow's one block.
    rows = page.tab.locator("#latency tbody tr")
    rows.nth(1).wait_for()
    cells = [rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())]
    assert [c[:2] for c in cells] == [["workflow", "(whole run)"], ["people", "detect"]]
    for _, _, p50, p99 in cells:
        assert 0 <= float(p50) <= float(p99), cells
    assert "frames" in page.text("#latency-summary")

    # A 0.5 s profiling window from the page (seven frames), followed to its trace.
    page.tab.get_by_label("Duration (s)").fill("0.5")
    page.tab.get_by_role("button", name="Profile").click()
    link = page.tab.get_by_role("link", name="Download trace")
    link.wait_for(state="visible")
    assert "ui.perfetto.dev (Open trace file)" in page.text("#profile-result")
    assert "done" in page.text("#profile-status")
    with page.tab.expect_download() as download:
        link.click()
    trace = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))
    runs = [e for e in trace["traceEvents"] if e.get("name") == "workflow.run"]
    assert runs and {e["args"]["stream"] for e in runs} == {"cam"}
    screenshot(page, "viewer.png")

    # Back to every stream: the finished profile's link does not follow.
    page.tab.get_by_role("button", name="All streams").click()
    assert page.tab.url == server.url + "/"
    tile.wait_for()
    assert page.tab.locator("#profile-result").is_hidden()
    assert page.text("#profile-status") == ""

    # A token the appliance refuses: the page asks again, says why, and nothing else.
    page.tab.evaluate("() => sessionStorage.setItem('appliance.token', 'wrong')")
    page.tab.reload()
    page.tab.locator("#token-form").wait_for(state="visible")
    assert "refused this token (401)" in page.text("#token-reason")
    assert page.text("#status") == ""
    assert page.errors == []


def test_the_viewer_offers_only_what_the_tokens_role_may_do(
    server: LiveServer, browser: Any
) -> None:
    """A viewer's token (a wall display) watches the stream and its latency, and is not
    offered a profiling window (an operator's: the API would answer 403); the admin's
    token, entered in the same tab, is."""
    page = Page(browser)
    with page.tab.expect_response(lambda r: r.url.endswith("/v1/me")) as me:
        page.tab.goto(server.url + "/streams/cam")
        enter_token(page, WALL_TOKEN)
    assert me.value.json() == {"name": "wall", "role": "viewer", "roles": ["viewer"]}
    page.tab.locator("#latency tbody tr").nth(1).wait_for()  # what a viewer may see
    assert page.tab.locator("#profile-panel").is_hidden()
    assert not page.tab.get_by_role("button", name="Profile").is_visible()
    page.tab.get_by_role("button", name="Token…").click()
    enter_token(page)
    page.tab.locator("#profile-panel").wait_for(state="visible")  # the admin's
    assert page.tab.get_by_role("button", name="Profile").is_visible()
    assert page.errors == []


def test_the_token_button_shows_only_where_a_token_is_needed(
    server: LiveServer, live_server: LiveFactory, browser: Any
) -> None:
    """Issue 30, item 8: a loopback appliance without a token never answers 401, and its
    viewer shows neither the token form nor the "Token…" button; one with a token shows
    both after its first 401, and the button stays to change the token."""
    doc = config_doc()
    del doc["server"]["token"]
    open_server = live_server(doc, token=None)
    page = Page(browser)
    with page.tab.expect_response(lambda r: r.url.endswith("/v1/streams")) as listed:
        page.tab.goto(open_server.url + "/")
    assert listed.value.status == 200  # open: the page was never asked for a token
    assert page.tab.locator("#change-token").is_hidden()
    assert page.tab.locator("#token-form").is_hidden()

    asked = Page(browser)
    asked.tab.goto(server.url + "/")
    asked.tab.locator("#token-form").wait_for(state="visible")  # the 401
    button = asked.tab.get_by_role("button", name="Token…")
    assert button.is_visible()
    enter_token(asked)
    asked.tab.locator("article.tile[data-stream='cam']").wait_for()
    button.click()  # still there, to change the token
    asked.tab.locator("#token-form").wait_for(state="visible")
    assert page.errors == [] and asked.errors == []


def test_the_viewer_plays_a_stream_over_webrtc(server: LiveServer, browser: Any) -> None:
    page = Page(browser, token=True)
    page.tab.goto(server.url + "/streams/cam")  # opened by its address, no click

    page.tab.locator("#media[data-phase='playing']").wait_for()
    assert page.text("#video-status") == "Playing."
    page.tab.wait_for_function(
        """() => {
            const v = document.getElementById("video");
            return v.videoWidth > 0 && v.getVideoPlaybackQuality().totalVideoFrames > 0;
        }"""
    )
    page.tab.locator("#predictions table caption", has_text="people").wait_for()
    # The table shows the predictions of the frame on screen (the frames channel says
    # which result each presented frame is), not merely the newest message.
    page.tab.locator("#predictions .note", has_text="on screen").wait_for()
    # Functions, not expressions: Playwright evaluates an expression with eval, which the
    # page's Content-Security-Policy forbids (as it should). Rolling p50 and p95, both
    # capture -> frame shown (the `frames` channel's capture times) and -> message.
    for figure in ("#video-latency", "#predictions-latency"):
        page.tab.wait_for_function(
            "(sel) => document.querySelector(sel).textContent.startsWith('p50 ')", arg=figure
        )
        p50, p95 = map(float, re.findall(r"p\d\d (\d+) ms", page.text(figure)))
        assert 0 <= p50 <= p95 < 5000, page.text(figure)
    page.tab.wait_for_function(
        "() => document.getElementById('video-fps').textContent.includes('fps')"
    )
    screenshot(page, "viewer-webrtc.png")

    # The way back closes the server's session (DELETE /v1/webrtc/{session_id}).
    with page.tab.expect_request(lambda r: r.method == "DELETE" and "/v1/webrtc/" in r.url):
        page.tab.get_by_role("button", name="All streams").click()
    assert page.tab.url == server.url + "/"
    assert page.tab.locator("#viewer").is_hidden()
    assert page.tab.locator("article.tile[data-stream='cam']").is_visible()
    assert page.errors == []


# -- the regression watch ---------------------------------------------------------------------
def watched_server(live_server: LiveFactory, folder: Path, probe_us: list[int]) -> LiveServer:
    """`cam` with a watch comparing every second against a shared baseline (the file
    `appliance trace fingerprint` writes for a fleet) that has its `people` block at about
    1 ms, as if from a much faster machine: no state is injected, the real watch finds the
    block (or, with `probe_us` of a faster host probe, the host) slower at its first
    comparison. Nothing else has a baseline (`learn_s` is a day), so nothing else is judged."""
    samples = [1000 + i % 100 for i in range(300)]  # µs
    row = {"kind": "block", "name": "cam/people", "samples_us": samples, "probe_us": probe_us,
           "learned_at": 0, "source": "a faster machine",
           "probe_measure": "onnx"}  # what today's probe times  # fmt: skip
    baseline = folder / "fleet-baseline.json"
    baseline.write_text(json.dumps({"version": 1, "rows": {"cam/people": row}}))
    doc = config_doc(demo_stream("cam"))
    doc["profiling"] = {"watch": {"interval_s": 1, "warmup_s": 0, "learn_s": 86400,
                                  "evidence_s": 1, "baseline": str(baseline)}}  # fmt: skip
    return live_server(doc)


def shown_ratio(text: str, before: str) -> float:
    """The `×1.62` that follows `before` in the page's text (rounded by JavaScript)."""
    match = re.match(re.escape(before) + r"×(\d+\.\d\d)\b", text)
    assert match, text
    return float(match.group(1))


def test_the_viewer_marks_a_block_in_regression(
    live_server: LiveFactory, browser: Any, tmp_path: Path
) -> None:
    live = watched_server(live_server, tmp_path, probe_us=[])
    # The page opened once the watch has raised it: it shows what it finds when it opens
    # (it looks again only every 5 s; that it follows a change is seen at the end).
    wait_for(lambda: live.get_json("/v1/regressions")["active"], WAIT_S, "the regression")
    page = Page(browser, token=True)
    page.tab.goto(live.url + "/streams/cam")

    row = page.tab.locator("#latency tbody tr", has_text="people")
    badge = row.locator(".badge")
    badge.wait_for()
    (regression,) = live.get_json("/v1/regressions")["active"]
    assert (regression["name"], regression["block"]) == ("cam/people", "people")
    assert shown_ratio(badge.inner_text(), "slower ") == pytest.approx(
        regression["ratio"], abs=0.006
    )
    title = badge.get_attribute("title") or ""
    p50s = re.match(r"p50 (\d+\.\d\d) ms in the baseline, (\d+\.\d\d) ms now ", title)
    assert p50s, title
    measured = (regression["baseline_p50_ms"], regression["current_p50_ms"])
    assert tuple(map(float, p50s.groups())) == pytest.approx(measured, abs=0.006)
    assert title.endswith(f"since {regression['started_at']}, after: the appliance started "
                          f"({regression['change']['at']})"), title  # fmt: skip
    assert page.tab.locator("#latency tbody tr").first.locator(".badge").count() == 0  # workflow
    assert page.text("#watch-host") == ""  # the host is not slower: nothing put on it
    screenshot(page, "viewer-regression.png")
    # The table is redrawn every 2 s, in place: its evidence link stays the same element,
    # so a press and its release land on it (a row replaced between them lost the click
    # and the download: a 30 s timeout in a full run). Seen redrawn before the re-baseline.
    kept = row.get_by_role("link", name="evidence trace").element_handle()
    page.tab.evaluate(  # each redraw sets the summary line below the table
        """() => { window.redrawn = false; new MutationObserver(() => { window.redrawn = true; })
            .observe(document.getElementById("latency-summary"), { childList: true }); }"""
    )

    # The evidence: the trace the watch recorded when it raised the regression.
    window = regression["evidence"]["window"]
    wait_for(
        lambda: live.get_json(f"/v1/profiling/{window}")["state"] == "done", WAIT_S, "evidence"
    )
    link = row.get_by_role("link", name="evidence trace")
    assert link.get_attribute("href") == f"/v1/profiling/{window}/trace"
    with page.tab.expect_download() as download:
        link.click()
    assert download.value.suggested_filename == f"appliance-regression-{regression['id']}.json"
    trace = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))
    runs = [e for e in trace["traceEvents"] if e.get("name") == "workflow.run"]
    assert runs and {e["args"]["stream"] for e in runs} == {"cam"}

    page.tab.wait_for_function("() => window.redrawn")
    assert kept.evaluate("(a) => a.isConnected")

    # Re-baselined (an intended change): the regression ends, the badge goes.
    assert live.call("POST", "/v1/streams/cam/baseline").status == 202
    badge.wait_for(state="detached")
    assert page.errors == []


def test_the_viewer_says_when_the_host_is_slower(
    live_server: LiveFactory, browser: Any, tmp_path: Path
) -> None:
    live = watched_server(live_server, tmp_path, probe_us=[10] * 30)  # a 100x faster host
    wait_for(lambda: live.get_json("/v1/regressions")["host"], WAIT_S, "the host's slowdown")
    page = Page(browser, token=True)
    page.tab.goto(live.url + "/streams/cam")

    line = page.tab.locator("#watch-host .watch-line")
    line.wait_for()
    host = live.get_json("/v1/regressions")["host"]
    text = line.inner_text()
    assert shown_ratio(text, "The host is ") == pytest.approx(host["ratio"], abs=0.006), text
    assert f" slower as a whole since {host['started_at']} (probe ×" in text, text
    assert "the machine, not a block" in text
    page.tab.locator("#latency tbody tr", has_text="people").wait_for()
    assert page.tab.locator("#latency .badge").count() == 0  # the block is judged net of it
    assert page.errors == []
