"""`/v1/streams/{id}/shadow` on a live server: start, read, stop, and the errors."""

from __future__ import annotations

import time
from typing import Any

from tests.server.conftest import WAIT_S, LiveFactory, config_doc, demo_stream
from tests.support.appliance import detect_workflow

PATH = "/v1/streams/cam/shadow"


def stricter() -> dict[str, Any]:
    workflow = detect_workflow()
    workflow["blocks"][0]["confidence"] = 0.85
    return workflow


def test_a_shadow_is_started_read_and_stopped(live_server: LiveFactory) -> None:
    server = live_server(config_doc(demo_stream("cam")))
    body = {"workflow": stricter(), "every": 2, "max_live_cost": 1}  # no budget: as asked
    reply = server.call("POST", PATH, json_body=body)
    assert reply.status == 201, reply.body
    assert reply.headers["location"] == PATH
    started = reply.json()
    assert (started["stream"], started["every"], started["running"]) == ("cam", 2, True)

    again = server.call("POST", PATH, json_body={"workflow": detect_workflow()})
    assert again.status == 409 and "runs a shadow already" in again.error["message"]

    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        report = server.call("GET", PATH).json()
        if report["comparison"]["frames"] >= 5:
            break
        time.sleep(0.3)
    assert report["comparison"]["frames"] >= 5 and report["source"] == "inline"
    assert set(report["comparison"]) >= {"agreement", "missed", "extra", "latency_ms"}

    metrics = server.call("GET", "/metrics").body.decode()
    series = {line.split(" ")[0]: float(line.split(" ")[1]) for line in metrics.splitlines()
              if line.startswith("appliance_shadow_")}  # fmt: skip
    assert series['appliance_shadow_compared_frames_total{stream="cam"}'] >= 5
    assert 0.0 <= series['appliance_shadow_agreement{stream="cam"}'] <= 1.0
    assert 'appliance_shadow_missed_detections_total{stream="cam"}' in series

    stopped = server.call("DELETE", PATH)
    assert stopped.status == 200 and stopped.json()["running"] is False
    assert stopped.json()["comparison"]["frames"] >= report["comparison"]["frames"]
    gone = server.call("GET", PATH)
    assert gone.status == 404 and gone.error["message"] == "stream 'cam' runs no shadow"
    assert server.call("DELETE", PATH).status == 404
    after = server.call("GET", "/metrics").body.decode()
    assert 'appliance_shadow_agreement{stream="cam"}' not in after  # gone with the shadow


def test_bad_shadows_are_refused_with_where_and_why(live_server: LiveFactory) -> None:
    server = live_server(config_doc(demo_stream("cam")))
    unknown = server.call("POST", "/v1/streams/nope/shadow", json_body={"workflow": stricter()})
    assert unknown.status == 404 and "unknown stream 'nope'" in unknown.error["message"]

    broken = {"name": "broken", "blocks": [{"id": "x", "type": "nosuch"}], "outputs": {"x": "x"}}
    reply = server.call("POST", PATH, json_body={"workflow": broken})
    assert reply.status == 422
    said = reply.error["message"] + " ".join(reply.error["details"])
    assert "shadow.workflow" in said and "nosuch" in said

    zero = server.call("POST", PATH, json_body={"workflow": stricter(), "every": 0})
    assert zero.status == 422 and "every" in " ".join(zero.error["details"])
    extra = server.call("POST", PATH, json_body={"workflow": stricter(), "colour": "red"})
    assert extra.status == 422 and "colour" in " ".join(extra.error["details"])

    outside = server.call("POST", PATH, json_body={"workflow": "/etc/passwd"})
    assert outside.status == 403
    assert server.call("GET", PATH).status == 404  # nothing was started by any of them


def test_promote_and_roll_back_over_the_api(live_server: LiveFactory) -> None:
    server = live_server(config_doc(demo_stream("cam")))
    live = server.call("GET", "/v1/streams/cam/latest")
    body = {"workflow": stricter(), "max_live_cost": 1}  # sampled as asked, however busy
    assert server.call("POST", PATH, json_body=body).status == 201
    refused = server.call("POST", PATH + "/promote", json_body={"min_agreement": 0.5,
                                                                 "min_frames": 100000})  # fmt: skip
    assert refused.status == 409 and "min_frames" in refused.error["message"]
    bad = server.call("POST", PATH + "/promote", json_body={"min_agreement": 2})
    assert bad.status == 422 and "min_agreement" in " ".join(bad.error["details"])

    promoted = server.call("POST", PATH + "/promote", json_body={"rollback_s": 30})
    assert promoted.status == 200, promoted.body
    switched = promoted.json()
    assert switched["applied"] and switched["workflow"] != switched["previous"]
    assert server.call("GET", PATH).status == 404  # the shadow is the stream now
    deadline = time.monotonic() + WAIT_S
    while (
        server.call("GET", "/v1/streams/cam/latest").json().get("workflow") != switched["workflow"]
    ):
        assert time.monotonic() < deadline, "no result of the promoted workflow"
        time.sleep(0.2)

    back = server.call("POST", PATH + "/rollback")
    assert back.status == 200 and back.json()["workflow"] == switched["previous"]
    again = server.call("POST", PATH + "/rollback")
    assert again.status == 404 and "no promotion to roll back" in again.error["message"]
    assert live.status in (200, 404)  # the stream answered throughout
