"""No cross-site control, no DNS rebinding (issue 39, item 4; docs/security.md, "Browsers
and other origins"). A page of another origin changes nothing, with or without a token
held by the browser: Debian's Chromium loads one from a loopback server on another port
and tries a `no-cors` fetch, form POSTs and a JSON fetch against a tokenless appliance,
whose streams and config stay as they were; a name rebound to the appliance's address is
answered nothing. Then each rule and each exemption over HTTP, and the route table through
one process, `serve --workers 2` and the fleet gateway (tests/security/origins.py).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from appliance.server.config import ServerConfig
from appliance.server.crosssite import CrossSite
from appliance.server.routes import ROUTES
from tests.security import origins
from tests.security.origins import CONSOLE, Target
from tests.security.other_origin import OtherOrigin
from tests.server.chromium import CHROMIUM, CHROMIUM_FLAGS, UI_WAIT_MS
from tests.support.media import MakeClip

EVIL = "http://evil.example"
REBOUND = "attacker.example"  # Chromium resolves it to 127.0.0.1 (--host-resolver-rules)
SAFE = ("GET", "HEAD", "OPTIONS")
PREFLIGHT = {
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "content-type",
}
# A page's own JSON POST, from whatever page the tab shows.
POST_JSON = """async ([url, body]) => {
  const headers = {"Content-Type": "application/json"};
  const resp = await fetch(url, {method: "POST", body, headers});
  return {status: resp.status, body: await resp.text()};
}"""
# Every kind of route a name is refused on: the API, a probe, the viewer's page and assets.
READS = [("GET", "/v1/streams"), ("GET", "/health"), ("GET", "/"), ("GET", "/static/viewer.css")]


# -- the appliances, the pages and the browser: one of each for the module -------------
@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cross-site")


@pytest.fixture(scope="module")
def clip(make_clip: MakeClip) -> Path:
    return make_clip(160, 120, fps=5, seconds=2.0)


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[OtherOrigin]:
    page = OtherOrigin()
    yield page
    page.close()


@pytest.fixture(scope="module")
def listed() -> Iterator[OtherOrigin]:
    """A page whose origin the appliances list in server.allowed_origins."""
    page = OtherOrigin()
    yield page
    page.close()


@pytest.fixture(scope="module")
def single(folder: Path, clip: Path, listed: OtherOrigin) -> Iterator[Target]:
    with origins.single(folder / "single", clip, [listed.origin]) as target:
        yield target


@pytest.fixture(scope="module")
def workers(folder: Path, clip: Path, listed: OtherOrigin) -> Iterator[Target]:
    with origins.workers(folder / "workers", clip, [listed.origin]) as target:
        yield target


@pytest.fixture(scope="module")
def fleet(folder: Path, clip: Path, listed: OtherOrigin) -> Iterator[Target]:
    with origins.fleet(folder / "fleet", clip, [listed.origin]) as target:
        yield target


@pytest.fixture(scope="module")
def chromium(folder: Path) -> Iterator[Any]:
    """Debian's Chromium (tests/server/chromium.py's flags), REBOUND resolving to
    127.0.0.1 as a rebinding DNS server would have it."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists() or shutil.which("chromium") is None:
        pytest.skip("chromium is not installed: run sh tests/install_deps.sh")
    flags = [*CHROMIUM_FLAGS, f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"]
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(folder / "profile"), executable_path=str(CHROMIUM), args=flags
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def tab(chromium: Any) -> Iterator[Any]:
    page = chromium.new_page()
    page.set_default_timeout(UI_WAIT_MS)
    yield page
    page.close()


def posted(url: str) -> Callable[[Any], bool]:
    return lambda response: response.url == url and response.request.method == "POST"


def form_json(doc: dict[str, Any]) -> tuple[str, str]:
    """A form field whose `text/plain` encoding (`name=value`) is `doc` as JSON: the
    workflow's name, last, takes the `=`."""
    text = json.dumps({**doc, "workflow": {**doc["workflow"], "name": "@"}})
    name, value = text.rsplit("@", 1)
    return name, value


# -- a real browser --------------------------------------------------------------------
def test_a_page_of_another_origin_changes_nothing(
    single: Target, elsewhere: OtherOrigin, tab: Any
) -> None:
    streams, reload = f"{single.origin}/v1/streams", f"{single.origin}/v1/config/reload"
    tab.goto(elsewhere.origin + "/")
    answers: dict[str, int] = {}
    with single.pending("pending"):
        with tab.expect_response(posted(streams)) as sent:
            tab.evaluate("([u, b]) => noCors(u, b)", [streams, json.dumps(single.stream("a"))])
        answers["no-cors fetch"] = sent.value.status
        field = form_json(single.stream("b"))
        for url, enctype, (name, value) in (
            (streams, "text/plain", field),
            (streams, "multipart/form-data", field),
            (reload, "text/plain", ("x", "y")),
            (reload, "multipart/form-data", ("x", "y")),
        ):
            with tab.expect_response(posted(url)) as sent:
                tab.evaluate("(a) => formPost(...a)", [url, enctype, name, value])
            answers[f"{enctype} form to {url}"] = sent.value.status
        json_fetch = tab.evaluate(
            "([u, b]) => corsJson(u, b)", [streams, json.dumps(single.stream("c"))]
        )
        assert answers == dict.fromkeys(answers, 403)
        assert json_fetch["status"] == 0, json_fetch  # the preflight was refused: never sent
        assert single.streams() == set()
        assert single.reload_plan()["added"] == ["pending"]  # no reload ran


def test_a_listed_origin_may_change_things(single: Target, listed: OtherOrigin, tab: Any) -> None:
    tab.goto(listed.origin + "/")
    answer = tab.evaluate(
        "([u, b]) => corsJson(u, b)",
        [f"{single.origin}/v1/streams", json.dumps(single.stream("console"))],
    )
    assert answer["status"] == 201, answer
    assert json.loads(answer["body"])["id"] == "console"  # the page may read the answer
    assert single.streams() == {"console"}
    single.remove("console")


def test_a_rebound_name_is_answered_nothing(single: Target, tab: Any) -> None:
    """DNS rebinding: the attacker's name now resolves to the appliance, so the attacker's
    page is the same origin as the API it calls; the appliance knows no such name."""
    rebound = f"http://{REBOUND}:{single.port}"
    assert tab.goto(rebound + "/").status == 400
    answer = tab.evaluate(POST_JSON, [rebound + "/v1/streams", json.dumps(single.stream("r"))])
    assert answer["status"] == 400, answer
    assert "server.allowed_hosts" in json.loads(answer["body"])["error"]["message"]
    assert single.streams() == set()


# -- each rule and its exemptions, over HTTP -------------------------------------------
def origin_cases(target: Target) -> list[tuple[dict[str, str], bool]]:
    own, localhost = target.origin, f"localhost:{target.port}"
    return [
        ({}, True),  # curl, the CLI, a gateway forwarding, MQTT: no browser
        ({"Origin": own}, True),
        ({"Origin": own, "Sec-Fetch-Site": "same-origin"}, True),
        ({"Sec-Fetch-Site": "none"}, True),
        ({"Host": localhost, "Origin": f"http://{localhost}"}, True),  # own, as requested
        ({"Origin": CONSOLE, "Sec-Fetch-Site": "cross-site"}, True),  # listed
        ({"Origin": EVIL}, False),
        ({"Origin": EVIL, "Sec-Fetch-Site": "same-origin"}, False),
        ({"Origin": "null"}, False),  # a sandboxed frame, a file: page
        ({"Origin": own.replace("http:", "https:")}, False),
        ({"Origin": "http://127.0.0.1:1"}, False),  # another port: another origin
        ({"Host": localhost, "Origin": own}, False),  # a page of 127.0.0.1 calls localhost
        ({"Sec-Fetch-Site": "cross-site"}, False),
        ({"Sec-Fetch-Site": "same-site"}, False),  # another port of the same host
    ]


def test_an_unsafe_request_from_another_origin_is_refused(single: Target) -> None:
    wrong = []
    for n, (headers, allowed) in enumerate(origin_cases(single)):
        reply = single.post_json("/v1/streams", single.stream(f"o{n}"), headers)
        if reply.status == 201:
            single.remove(f"o{n}")
        if (reply.status == 201) != allowed:
            wrong.append((headers, reply.status, reply.body[:200]))
        elif not allowed:
            assert reply.status == 403 and reply.error["code"] == "forbidden", reply
            assert "server.allowed_origins" in reply.error["message"]
    assert wrong == []
    assert single.streams() == set()


def test_json_routes_take_json_only(single: Target) -> None:
    body = json.dumps(single.stream("typed")).encode()
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        reply = single.call("POST", "/v1/streams", body=body, headers={"Content-Type": kind})
        assert reply.status == 415, (kind, reply.status, reply.body)
        assert reply.error["code"] == "unsupported_media_type"
        assert "application/json" in reply.error["message"]
    assert single.call("POST", "/v1/streams", body=body).status == 415  # no Content-Type
    assert single.streams() == set()
    utf8 = {"Content-Type": "application/json; charset=utf-8"}
    assert single.call("POST", "/v1/streams", body=body, headers=utf8).status == 201
    single.remove("typed")


def test_a_body_where_none_is_taken_changes_nothing(single: Target) -> None:
    """A route that takes no body ignores one, whatever its type; from another origin
    it is refused like any other."""
    plain = {"Content-Type": "text/plain"}
    path = "/v1/config/reload?dry_run=true"
    bare = single.call("POST", path)
    typed = single.call("POST", path, body=b'{"dry_run": false}', headers=plain)
    assert (typed.status, typed.body) == (bare.status, bare.body) == (200, bare.body)
    refused = single.call("POST", path, body=b"x", headers={**plain, "Origin": EVIL})
    assert refused.status == 403


def test_the_host_must_name_the_appliance(single: Target) -> None:
    port = single.port
    known = [
        f"127.0.0.1:{port}",
        f"localhost:{port}",
        f"[::1]:{port}",  # another loopback address of a loopback bind
        "appliance.example",
        "APPLIANCE.example.",
        "cams.example",
        f"cam-3.site.cams.example:{port}",
    ]
    unknown = [
        REBOUND,
        f"{REBOUND}:{port}",
        "evilcams.example",
        "appliance.example.evil",
        "127.0.0.1.evil.example",
        "localhost.evil.example",
    ]
    for host in known:
        assert single.call("GET", "/v1/streams", headers={"Host": host}).status == 200, host
    for host in unknown:
        for method, path in [*READS, ("OPTIONS", "/v1/streams")]:
            reply = single.call(method, path, headers={"Host": host})
            assert reply.status == 400, (host, method, path, reply.status)
            assert reply.error["code"] == "bad_request"
            assert "server.allowed_hosts" in reply.error["message"], reply.error
        posted_reply = single.post_json("/v1/streams", single.stream("h"), {"Host": host})
        assert posted_reply.status == 400
    assert single.streams() == set()


def test_cors_opens_to_listed_origins_only(single: Target, listed: OtherOrigin) -> None:
    evil = single.call("OPTIONS", "/v1/streams", headers={"Origin": EVIL, **PREFLIGHT})
    assert (evil.status, evil.cors()) == (405, {})  # as aiohttp answered before
    read = single.call("GET", "/v1/streams", headers={"Origin": EVIL})
    assert (read.status, read.cors()) == (200, {})  # a read: answered, unreadable to the page
    ok = single.call("OPTIONS", "/v1/streams", headers={"Origin": listed.origin, **PREFLIGHT})
    assert ok.status == 204
    assert ok.cors()["access-control-allow-origin"] == listed.origin
    assert "POST" in ok.cors()["access-control-allow-methods"]
    assert "content-type" in ok.cors()["access-control-allow-headers"].lower()
    assert "Origin" in ok.headers["vary"]
    for path, status in (("/v1/streams", 200), ("/v1/streams/nope", 404)):
        reply = single.call("GET", path, headers={"Origin": listed.origin})
        assert reply.status == status
        assert reply.cors()["access-control-allow-origin"] == listed.origin, path


# -- the route table through each server -----------------------------------------------
@pytest.fixture(params=["single", "workers", "fleet"])
def target(request: pytest.FixtureRequest) -> Target:
    served: Target = request.getfixturevalue(request.param)
    return served


def test_every_route_refuses_other_origins_and_names(target: Target) -> None:
    """With and without the token: the route's role does not matter."""
    wrong = []
    for route in ROUTES:
        path = re.sub(r"{\w+}", "nope", route.path)
        if route.method not in SAFE:
            browser = {"Origin": EVIL, "Sec-Fetch-Site": "cross-site"}
            for token in (True, False):
                reply = target.call(route.method, path, headers=browser, token=token)
                if reply.status != 403:
                    wrong.append(("Origin", route.method, path, token, reply.status))
        for token in (True, False):
            reply = target.call(route.method, path, headers={"Host": REBOUND}, token=token)
            if reply.status != 400:
                wrong.append(("Host", route.method, path, token, reply.status))
    assert wrong == []


def test_the_gateways_pass_what_one_process_would(target: Target) -> None:
    """Their own origin and a listed one reach the members (which see no browser);
    another origin does not."""
    own = {"Origin": target.origin, "Sec-Fetch-Site": "same-origin"}
    added = target.post_json("/v1/streams", target.stream("through"), own)
    assert added.status == 201, added.body
    assert "through" in target.streams()
    evil = target.call("DELETE", "/v1/streams/through", headers={"Origin": EVIL})
    assert evil.status == 403
    console = {"Origin": CONSOLE, "Sec-Fetch-Site": "cross-site"}
    removed = target.call("DELETE", "/v1/streams/through", headers=console)
    assert removed.status == 200, removed.body
    assert removed.cors()["access-control-allow-origin"] == CONSOLE
    assert "through" not in target.streams()


# -- the names each bind answers to (the rule itself: a wildcard bind is not run here) --
@pytest.mark.parametrize(
    ("bind", "host", "known"),
    [
        ("0.0.0.0", "10.244.1.7:8080", True),  # a pod IP: kubelet, Prometheus
        ("0.0.0.0", "[fd00::7]:8080", True),
        ("::", "192.168.1.20", True),
        ("0.0.0.0", "nvr.lan:8080", False),  # a name is listed or refused
        ("192.168.1.20", "192.168.1.20:8080", True),
        ("192.168.1.20", "192.168.1.21", False),
        ("192.168.1.20", "localhost:8080", True),
        ("localhost", "127.0.0.1:8080", True),  # the bind resolves to both
        ("localhost", "[::1]:8080", True),
        ("nvr.lan", "NVR.lan.:8080", True),
        ("127.0.0.1", "[::ffff:7f00:1]", True),
        ("127.0.0.1", "127.0.0.1:80:80", False),
        ("127.0.0.1", "127.0.0.1:http", False),
        ("127.0.0.1", "[::1", False),
        ("127.0.0.1", "user@127.0.0.1", False),
        ("127.0.0.1", "127.0.0.1/x", False),
        ("127.0.0.1", "", False),
    ],
)
def test_the_names_a_bind_answers_to(bind: str, host: str, known: bool) -> None:
    rules = CrossSite.for_bind(ServerConfig(), bind)
    assert rules.answers_to(host) is known


def test_listed_names_and_suffixes() -> None:
    server = ServerConfig(allowed_hosts=[".cams.example", "nvr.example", "[fd00::9]"])
    rules = CrossSite.for_bind(server, "0.0.0.0")
    for host in ("cams.example", "a.b.cams.example:8443", "nvr.example", "[fd00::9]"):
        assert rules.answers_to(host), host
    for host in ("xcams.example", "cams.example.evil", "a.nvr.example"):
        assert not rules.answers_to(host), host
    assert CrossSite.for_bind(ServerConfig(allowed_hosts=["*"]), "127.0.0.1").answers_to("x.y")


def test_listed_addresses_on_a_bind_to_one_address() -> None:
    """An address entry is taken however the Host writes it (an IPv4-mapped one too)."""
    server = ServerConfig(allowed_hosts=["10.0.0.9", "[fd00::9]"])
    rules = CrossSite.for_bind(server, "192.168.1.20")
    for host in ("10.0.0.9:8080", "[::ffff:a00:9]", "[FD00:0::9]:8443"):
        assert rules.answers_to(host), host
    for host in ("10.0.0.8", "[fd00::8]", "127.0.0.1"):
        assert not rules.answers_to(host), host
