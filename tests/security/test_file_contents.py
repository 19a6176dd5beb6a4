"""What a file named over the API may give back: nothing of its content unless it is the
kind of file the field reads, and no path of the host (docs/security.md, "Files: one
access policy", issue 39).

The site is the issue's: a config whose workflow file, model and labels files lie in
folders of their own, which are then the file roots (none is set). Beside them lie a
`.env` and text files that are not what a request names them as: settings in
`NAME=value` and `name: value` form, a PEM key, YAML that PyYAML cannot read and would
quote, a "model" that is text, a text file that FFmpeg would draw as video. Each holds a
marker of its own, looked for in every answer and in `GET /v1/models`, where a labels
file's lines would come back.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.security.test_secret_files import VALIDATE, requests_naming
from tests.server.conftest import TOKEN, WAIT_S, demo_stream
from tests.server.live import LiveServer, Reply, wait_for, write_yaml
from tests.support.appliance import MODELS, detect_workflow, person_model

# Files that are no labels file, under names that say nothing (workflows/...): refused as
# one (line 1 or 2 is not a class name), their lines never shown.
NOT_LABELS = {
    "notes.txt": "API_TOKEN={m}\nDB_PASSWORD={m}\n",
    "export.sh": "# the deploy's keys\nexport TOKEN={m}\n",
    "app.ini": "[database]\npassword = {m}\n",
    "settings.yaml": "user: admin\npassword: {m}\n",
    "key.json": '{{\n  "private_key_id": "{m}",\n}}\n',
    "cert.txt": "-----BEGIN PRIVATE KEY-----\n{m}\n-----END PRIVATE KEY-----\n",
}
# A text file FFmpeg would read as a video: its tty demuxer draws the characters of files
# so named (.nfo, .asc, .ans, ...) into frames, which the snapshot, MJPEG and WebRTC show.
AS_VIDEO = {"readme.nfo": "API_TOKEN={m}\n"}
# Text files that PyYAML reads as something it reports, quoting what it read.
UNREADABLE = {
    "alias.yaml": "*{m}\n",
    "tag.yaml": "a: !{m} x\n",
    "anchor.yaml": "a: &{m} 1\nb: &{m} 2\n",
    "values.yaml": "name: {m}\nblocks: {m}\noutputs: {m}\n",
    "keys.yaml": "{m}: 1\n",
    "list.json": '{{"blocks": ["{m}"], "description": ["{m}"]}}',
}


@dataclass(frozen=True)
class Site:
    server: LiveServer
    folder: Path  # the config's folder
    markers: dict[str, str]  # file, as the config's folder names it -> its marker


def _plant(folder: Path) -> dict[str, str]:
    """The workflow, model and labels files the config names, and beside them what a
    request must not read back; each planted file's marker, by its name."""
    workflows, models = folder / "workflows", folder / "models"
    workflows.mkdir()
    models.mkdir()
    own = {**person_model(), "path": "../models/person.onnx"}  # the workflow's own model
    write_yaml(workflows, {**detect_workflow("own"), "models": {"own": own}}, "people.yaml")
    broken = {"name": "broken", "blocks": [{"id": "a", "type": "nosuch"}], "outputs": {"a": "a"}}
    write_yaml(workflows, broken, "broken.yaml")
    text_model = {**own, "path": "../models/text.onnx"}
    write_yaml(workflows, {**detect_workflow("tm"), "models": {"tm": text_model}}, "text.yaml")
    (models / "person.onnx").symlink_to(MODELS / "person_ssdlite.onnx")
    (models / "labels.txt").write_text("person\n")
    markers = {}
    for name, text in {".env": "API_TOKEN={m}\n", **NOT_LABELS, **UNREADABLE, **AS_VIDEO}.items():
        marker = markers[f"workflows/{name}"] = f"LEAK{uuid.uuid4().hex}"
        (workflows / name).write_text(text.format(m=marker))
    os.link(workflows / ".env", workflows / "env-copy")  # a .env under another name
    markers["workflows/env-copy"] = markers["workflows/.env"]
    marker = markers["models/text.onnx"] = f"LEAK{uuid.uuid4().hex}"
    (models / "text.onnx").write_text(f"{marker}\n")  # a "model" that is text
    return markers


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    folder = tmp_path_factory.mktemp("site")
    markers = _plant(folder)
    person = {
        **person_model(),
        "path": "models/person.onnx",
        "labels": None,
        "labels_file": "models/labels.txt",
    }
    doc = {
        "server": {"token": TOKEN},  # file_roots: the folders of the files named below
        "models": {"person": person},
        "streams": [{**demo_stream("clip"), "workflow": "workflows/people.yaml"}],
    }
    server = LiveServer(write_yaml(folder, doc, "config.yaml"), token=TOKEN).start()
    wait_for(lambda: server.stream("clip")["frames_processed"] > 0, WAIT_S, "clip processing")
    yield Site(server, folder, markers)
    assert server.stop()


def _assert_clean(site: Site, where: str, reply: Reply) -> None:
    """No planted file's marker, and no path of the site's folder, in the answer or in
    `GET /v1/models` after it."""
    models = site.server.call("GET", "/v1/models").body.decode()
    for shown, text in (("answer", reply.body.decode(errors="replace")), ("models", models)):
        for name, marker in site.markers.items():
            assert marker not in text, f"{name}'s content came back in the {shown} to {where}"
        assert str(site.folder) not in text, f"the site's folder in the {shown} to {where}"
    assert reply.status != 500, (where, reply.body)


def _model_ids(site: Site) -> list[str]:
    return [m["id"] for m in site.server.get_json("/v1/models")["models"]]


def _labelled(name: str, model_id: str = "m") -> dict[str, Any]:
    """An inline workflow whose model's labels file is `name`."""
    model = {**person_model(), "path": "models/person.onnx", "labels": None, "labels_file": name}
    return {**detect_workflow(model_id), "models": {model_id: model}}


def test_a_dotenv_beside_the_workflows_is_never_read(site: Site) -> None:
    """The issue's probe: `labels_file: .env` in the workflow files' folder."""
    for what, (method, path, body) in requests_naming("workflows/.env").items():
        reply = site.server.call(method, path, json_body=body)
        _assert_clean(site, what, reply)
        assert (reply.status, reply.error["code"]) == (403, "forbidden"), (what, reply.body)
        rule = "a hidden file or folder ('.env') is never read over the API"
        assert rule in reply.error["message"], (what, reply.error)
    assert "m" not in _model_ids(site)


@pytest.mark.parametrize("name", ["env-copy", *NOT_LABELS])
def test_a_labels_file_that_is_not_one_is_refused_unread(site: Site, name: str) -> None:
    body = {"workflow": _labelled(f"workflows/{name}")}
    reply = site.server.call("POST", VALIDATE, json_body=body)
    _assert_clean(site, f"labels_file {name}", reply)
    assert reply.status == 422, reply.body
    message = reply.error["message"]
    assert message.startswith(f"workflow models.m.labels_file: labels file 'workflows/{name}'")
    assert "not a labels file (line " in message, message
    assert "m" not in _model_ids(site)


def test_the_configs_labels_file_is_a_labels_file(site: Site) -> None:
    """The rule lets class names through: the config's labels, and a request's."""
    models = {m["id"]: m for m in site.server.get_json("/v1/models")["models"]}
    assert models["person"]["labels"] == ["person"]
    reply = site.server.call(
        "POST", VALIDATE, json_body={"workflow": _labelled("models/labels.txt", "n")}
    )
    assert reply.status == 200, reply.body


@pytest.mark.parametrize("name", [*UNREADABLE, "env-copy", "notes.txt", "settings.yaml"])
def test_a_file_that_is_no_workflow_is_not_quoted(site: Site, name: str) -> None:
    """Named as a workflow (validate, run, a stream's) or a model: what is wrong is said
    by line and column, location and rule, never with what the file holds."""
    requests = requests_naming(f"workflows/{name}")
    for what in ("workflow file", "run a workflow file", "stream workflow", "model path"):
        method, path, body = requests[what]
        reply = site.server.call(method, path, json_body=body)
        _assert_clean(site, f"{what} = {name}", reply)
        assert reply.status == 422, (what, name, reply.body)


def test_a_model_that_is_text_is_not_quoted(site: Site) -> None:
    model = {**person_model(), "path": "models/text.onnx"}
    body = {"workflow": {**detect_workflow("t"), "models": {"t": model}}}
    reply = site.server.call("POST", VALIDATE, json_body=body)
    _assert_clean(site, "a text file as a model", reply)
    assert reply.status == 422, reply.body
    assert "workflow models.t: not a valid ONNX model: models/text.onnx" in reply.error["message"]


def test_answers_name_the_paths_as_the_request_gave_them(site: Site) -> None:
    """422s for a workflow or model file name it as the request (or the config, or the
    workflow file) did: never by the site's absolute folder (checked by _assert_clean)."""
    stream = {"id": "b", "source": demo_stream("b")["source"]}
    own = {**person_model(), "path": "models/person.onnx", "input_size": [64, 64]}
    redeclared = {**detect_workflow("own"), "models": {"own": own}}
    cases = {
        "workflow (workflows/broken.yaml): workflow 'broken': 1 problem(s)": (
            VALIDATE,
            {"workflow": "workflows/broken.yaml"},
        ),
        "stream 'b'.workflow (workflows/broken.yaml): workflow 'broken'": (
            "/v1/streams",
            {**stream, "workflow": "workflows/broken.yaml"},
        ),
        "workflow (workflows/text.yaml) models.tm: not a valid ONNX model: ../models/text.onnx": (
            VALIDATE,
            {"workflow": "workflows/text.yaml"},
        ),
        "model 'own' is already declared differently at streams[0].workflow "
        "(workflows/people.yaml) models.own": (VALIDATE, {"workflow": redeclared}),
    }
    for expected, (path, body) in cases.items():
        reply = site.server.call("POST", path, json_body=body)
        _assert_clean(site, expected, reply)
        assert reply.status == 422, (expected, reply.body)
        assert expected in reply.error["message"], (expected, reply.error)


def test_a_text_file_is_no_video(site: Site) -> None:
    """A stream of a text file that FFmpeg would draw: it fails, no frame is ever made
    (so no snapshot, MJPEG or WebRTC frame shows the text), and the process goes on."""
    body = {"id": "text", "source": "workflows/readme.nfo", "workflow": detect_workflow()}
    assert site.server.call("POST", "/v1/streams", json_body=body).status == 201
    try:
        wait_for(lambda: _failed_or_ran(site.server.stream("text")), WAIT_S, "the stream")
        stream = site.server.stream("text")
        assert stream["frames_processed"] == 0, stream
        assert "not a video: FFmpeg reads it as text (tty)" in stream["last_error"], stream
        assert site.server.call("GET", "/v1/streams/text/snapshot.jpg").status == 404
    finally:
        assert site.server.call("DELETE", "/v1/streams/text").status == 200
    assert site.server.stream("clip")["state"] == "running"


def _failed_or_ran(stream: dict[str, Any]) -> bool:
    return bool(stream["last_error"]) or int(stream["frames_processed"]) > 0
