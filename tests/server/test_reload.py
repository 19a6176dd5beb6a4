"""Config reload, over HTTP and on SIGHUP: streams added, removed or changed in the file
are started, stopped or restarted; unchanged ones and those added over the API keep
running untouched (the same Stream object, its frame counter going on); a reload that
cannot be applied changes nothing."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.server.conftest import LiveFactory, config_doc, demo_stream
from tests.server.live import LiveServer, wait_for, write_yaml
from tests.support.appliance import Served, detect_workflow, person_model

WAIT_S = 30.0
# Cheap streams: drawing on a copy of each frame needs no model.
DRAW = {"name": "draw", "blocks": [{"id": "drawn", "type": "annotate"}],
        "outputs": {"video": "drawn"}}  # fmt: skip


def draw_stream(stream_id: str, **source: Any) -> dict[str, Any]:
    return {**demo_stream(stream_id, **source), "workflow": DRAW}


def rewrite(server: LiveServer, doc: dict[str, Any]) -> None:
    server.config_path.write_text(yaml.safe_dump(doc), encoding="utf-8")


def running(server: LiveServer, *ids: str) -> None:
    def processing(sid: str) -> Callable[[], bool]:
        return lambda: server.stream(sid)["frames_processed"] > 0

    for sid in ids:
        wait_for(processing(sid), WAIT_S, f"{sid} processing")


def frames_go_on(server: LiveServer, sid: str) -> None:
    stream = server.runtime.streams[sid]
    count = stream.rate.count
    wait_for(lambda: stream.rate.count > count, WAIT_S, f"{sid} to keep processing")


@pytest.fixture
def server(live_server: LiveFactory, tmp_path: Path) -> LiveServer:
    write_yaml(tmp_path, detect_workflow(), "detect.yaml")
    write_yaml(tmp_path, DRAW, "draw.yaml")
    keep = {**demo_stream("keep"), "workflow": "detect.yaml"}
    edited = {**demo_stream("edited"), "workflow": "draw.yaml"}
    live = live_server(config_doc(keep, edited, draw_stream("change"), draw_stream("drop")))
    added = live.call("POST", "/v1/streams", json_body=draw_stream("api-cam"))
    assert added.status == 201, added.body
    running(live, "keep", "edited", "change", "drop", "api-cam")
    return live


def test_reload_applies_only_what_changed(server: LiveServer, tmp_path: Path) -> None:
    before = dict(server.runtime.streams)
    doc = yaml.safe_load(server.config_path.read_text())
    doc["streams"] = [s for s in doc["streams"] if s["id"] != "drop"]
    doc["streams"][2]["source"]["stall_timeout_s"] = 6.0  # "change"
    doc["streams"].append(draw_stream("new"))
    rewrite(server, doc)
    write_yaml(tmp_path, {**DRAW, "blocks": [{"id": "drawn", "type": "annotate", "thickness": 3}]},
               "draw.yaml")  # fmt: skip

    reply = server.call("POST", "/v1/config/reload")
    assert reply.status == 200, reply.body
    assert reply.json() == {"added": ["new"], "removed": ["drop"],
                            "restarted": ["edited", "change"], "unchanged": ["keep"]}  # fmt: skip
    streams = server.runtime.streams
    assert streams["keep"] is before["keep"]
    assert streams["api-cam"] is before["api-cam"]  # not in the file: left alone
    assert streams["change"] is not before["change"]
    assert streams["edited"] is not before["edited"]
    assert server.call("GET", "/v1/streams/drop").status == 404
    assert not {t.name for t in threading.enumerate()} & {"grab:drop", "work:drop"}
    frames_go_on(server, "keep")
    frames_go_on(server, "api-cam")
    running(server, "new", "change", "edited")
    assert server.stream("change")["state"] == "running"


def broken_stream() -> dict[str, Any]:
    return {**draw_stream("new"), "source": {"url": "x.mp4", "pace": "sometimes"}}


def bad_workflow() -> dict[str, Any]:
    return {**draw_stream("new"), "workflow": {**DRAW, "outputs": {"video": "ghost"}}}


# A reload that cannot be applied: (what to change in the document, status, expected text)
REFUSED: dict[str, tuple[Callable[[dict[str, Any]], None], int, str]] = {
    "invalid stream": (lambda d: d["streams"].append(broken_stream()), 422,
                       "streams[4].source.pace: Input should be 'realtime' or 'fast'"),
    "invalid workflow": (lambda d: d["streams"].append(bad_workflow()), 422,
                         "outputs.video: unknown block 'ghost'"),
    # Every problem in one answer: the second stream's too (the first's does not stop it).
    "two invalid workflows": (
        lambda d: d["streams"].extend([bad_workflow(), {**bad_workflow(), "id": "new2"}]), 422,
        "streams.new2.workflow: workflow 'draw': outputs.video: unknown block 'ghost'"),
    # A changed model loads anew (tests/test_reload_models.py); one that cannot load
    # changes nothing, the old one goes on serving.
    "changed model that does not load": (
        lambda d: d["models"].update(person={**person_model(), "path": __file__}), 422,
        "models.person"),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSED)
def test_a_refused_reload_changes_nothing(server: LiveServer, case: str) -> None:
    change, status, text = REFUSED[case]
    before = dict(server.runtime.streams)
    doc = yaml.safe_load(server.config_path.read_text())
    change(doc)
    rewrite(server, doc)
    reply = server.call("POST", "/v1/config/reload")
    assert reply.status == status, reply.body
    error = reply.error
    assert any(text in line for line in [error["message"], *error["details"]]), error
    assert server.runtime.streams == before
    assert all(server.runtime.streams[sid] is s for sid, s in before.items())
    frames_go_on(server, "keep")


def test_a_dry_run_answers_the_plan_and_changes_nothing(server: LiveServer) -> None:
    before = dict(server.runtime.streams)
    models = [m.id for m in server.runtime.models_status()]
    doc = yaml.safe_load(server.config_path.read_text())
    doc["streams"] = [s for s in doc["streams"] if s["id"] != "drop"] + [draw_stream("new")]
    rewrite(server, doc)
    reply = server.call("POST", "/v1/config/reload?dry_run=true")
    assert reply.status == 200, reply.body
    plan = reply.json()
    assert (plan["added"], plan["removed"]) == (["new"], ["drop"])
    assert server.runtime.streams == before  # nothing started or stopped
    assert all(server.runtime.streams[sid] is s for sid, s in before.items())
    assert [m.id for m in server.runtime.models_status()] == models
    bad = server.call("POST", "/v1/config/reload?dry_run=maybe")
    assert bad.status == 422 and bad.error["details"] == ["dry_run: true or false"]
    misspelt = server.call("POST", "/v1/config/reload?dry_rn=true")  # not applied either
    assert misspelt.status == 422
    assert misspelt.error["details"] == ["'dry_rn': unknown (known: dry_run)"]
    operation = server.call("GET", "/openapi.json").json()["paths"]["/v1/config/reload"]["post"]
    assert [(q["name"], q["in"]) for q in operation["parameters"]] == [("dry_run", "query")]
    applied = server.call("POST", "/v1/config/reload")  # the same plan, now applied
    assert (applied.status, applied.json()) == (200, plan)
    running(server, "new")
    assert "drop" not in server.runtime.streams


def test_a_reload_of_unreadable_yaml_is_refused(server: LiveServer) -> None:
    server.config_path.write_text("streams: [", encoding="utf-8")
    reply = server.call("POST", "/v1/config/reload")
    assert reply.status == 422
    assert "invalid YAML" in reply.error["details"][0]


def test_sighup_reloads_and_a_bad_file_does_not_stop_the_server(
    serve: Callable[..., Served], write_config: Callable[[dict[str, Any]], Path]
) -> None:
    doc = {"streams": [draw_stream("a")]}
    path = write_config(doc)
    served = serve(path)
    path.write_text(yaml.safe_dump({"streams": [draw_stream("a"), draw_stream("b")]}))
    served.process.send_signal(signal.SIGHUP)
    served.wait_for(lambda: served.json("/v1/streams/b")["state"] == "running", WAIT_S, "b")
    assert "config reloaded (SIGHUP): {'added': ['b']" in served.log()

    path.write_text("streams: [")
    served.process.send_signal(signal.SIGHUP)
    served.wait_for(lambda: "refused, nothing changed" in served.log(), WAIT_S, "a refusal")
    assert "invalid YAML" in served.log()
    ids = [s["id"] for s in served.json("/v1/streams")["streams"]]
    assert ids == ["a", "b"]
    assert served.terminate() == 0


@pytest.mark.parametrize(
    "query, detail",
    [("dry_run=false&dry_run=true", "dry_run: given 2 times (give it once: true or false)"),
     ("dry_run=true&dry_run=true", "dry_run: given 2 times (give it once: true or false)"),
     ("dry_run=1", "dry_run: true or false"),
     ("dry_run=0", "dry_run: true or false"),
     ("dry_run=True", "dry_run: true or false"),
     ("dry_run=", "dry_run: true or false")],
)  # fmt: skip
def test_dry_run_is_true_or_false_given_once(
    live_server: LiveFactory, query: str, detail: str
) -> None:
    server = live_server(config_doc())
    rewrite(server, config_doc(draw_stream("new")))
    reply = server.call("POST", f"/v1/config/reload?{query}")
    assert (reply.status, reply.error["details"]) == (422, [detail]), reply.body
    assert "new" not in server.runtime.streams  # refused: nothing applied
    applied = server.call("POST", "/v1/config/reload?dry_run=false")
    assert (applied.status, applied.json()["added"]) == (200, ["new"])
