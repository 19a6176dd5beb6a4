"""A distinct secret planted in every kind of file the config can name for one (each path
field of every sink type's config: an MQTT password file, TLS CA, certificate and key,
signing keys), beside the config and in another folder that is a file root too. Each is
then named, as given, by its absolute path, by a symlink and by a hard link, in every
field of the API that takes a path, and looked for in every answer and in every GET
route of the table (docs/security.md, "Files: one access policy").

Secrets the config does not name are planted too, under the names such files have by
convention (`.env` beside the workflow files, `.ssh/id_ed25519`, `server.pem`,
`credentials`, ...): named as given, absolute or through a symlink of an innocent name,
they are refused by name (issue 39).

The sinks point at closed ports: they start (reading their files through the owner's
policy, as a real deployment does) and retry in the background.
"""

from __future__ import annotations

import base64
import os
import subprocess
import typing
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml
from pydantic import BaseModel

from sinks.registry import SINKS, config_model
from tests.security.test_secrets import get_routes, profiling_window
from tests.server.conftest import TOKEN, WAIT_S, demo_stream
from tests.server.live import LiveServer, wait_for, write_yaml
from tests.support.appliance import MODELS, detect_workflow, person_model
from tests.support.processes import free_port

# Every path field of the sinks' configs, by sink type (sinks/registry.py): each one names
# a secret. test_every_path_field_of_a_sink_is_planted_here keeps this list complete.
SECRET_FIELDS = {
    "mqtt": ("password_file", "tls.ca_file", "tls.cert_file", "tls.key_file",
             "commands.secret_file"),
    "webhook": ("secret_file",),
}  # fmt: skip
PEM = {"tls.ca_file": "cert", "tls.cert_file": "cert", "tls.key_file": "key"}  # the rest: text
VALIDATE, RUN = "/v1/workflows/validate", "/v1/workflows/run"


@dataclass(frozen=True)
class Planted:
    field: str  # where the config names it: sinks.bus.tls.key_file
    path: Path
    secret: str


@dataclass(frozen=True)
class Setup:
    server: LiveServer
    config_dir: Path
    planted: list[Planted]  # the secret files the config names
    named: list[Planted]  # files it does not name, named like secrets: `field` is the rule


# Secrets by their conventional names, in the roots (relative to the config's folder),
# and the rule that refuses each: a hidden file or folder, or a secret's name.
HIDDEN, SECRET_NAME = "a hidden file or folder", "a file named like a secret"
NAMED = {
    "workflows/.env": HIDDEN,
    ".env": HIDDEN,
    ".ssh/id_ed25519": HIDDEN,
    "workflows/.git/config": HIDDEN,
    "workflows/server.pem": SECRET_NAME,
    "../shared/tls.key": SECRET_NAME,
    "id_rsa": SECRET_NAME,
    "credentials": SECRET_NAME,
    "workflows/secrets.yaml": SECRET_NAME,
    "prod.env": SECRET_NAME,
    "keystore.p12": SECRET_NAME,
}


def _pem(folder: Path) -> dict[str, str]:
    """A self-signed certificate and its key, PEM (an MQTT client loads them at start)."""
    key, cert = folder / "pem.key", folder / "pem.crt"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1", "-keyout", str(key), "-out", str(cert), "-subj", "/CN=x"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return {"key": key.read_text(), "cert": cert.read_text()}


def _sink(kind: str, name: str, files: dict[str, str]) -> dict[str, Any]:
    """A sink of `kind` toward a closed port whose secret fields name `files`."""
    doc: dict[str, Any]
    if kind == "mqtt":
        doc = {"type": "mqtt", "port": free_port(), "client_id": f"secret-files-{name}",
               "username": "admin", "commands": {"enabled": True, "auth": "hmac"}}  # fmt: skip
    else:
        doc = {"type": "webhook", "url": f"http://127.0.0.1:{free_port()}/hook", "retries": 0}
    for field, value in files.items():
        *parents, last = field.split(".")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return doc


def _plant(config_dir: Path, shared: Path) -> tuple[dict[str, Any], list[Planted]]:
    """Every secret field of every sink type, once beside the config (named relative to
    it) and once in `shared` (named by its absolute path): the sinks and what they name."""
    pem = _pem(shared.parent)
    sinks: dict[str, Any] = {}
    planted = []
    for kind, fields in SECRET_FIELDS.items():
        for folder, suffix in ((config_dir, ""), (shared, "2")):
            name = f"{kind}{suffix}"
            files = {}
            for field in fields:
                secret = f"planted-{name}-{field}-{uuid.uuid4().hex}"
                path = folder / f"{name}.{field.replace('.', '-')}"
                path.write_text(f"{secret}\n{pem.get(PEM.get(field, ''), '')}")
                files[field] = path.name if folder == config_dir else str(path)
                planted.append(Planted(f"sinks.{name}.{field}", path, secret))
            sinks[name] = _sink(kind, name, files)
    return sinks, planted


def _plant_named(config_dir: Path) -> list[Planted]:
    """NAMED, each holding its own secret as a settings file would."""
    planted = []
    for name, rule in NAMED.items():
        path = config_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        secret = f"planted-named-{uuid.uuid4().hex}"
        path.write_text(f"API_TOKEN={secret}\n")
        planted.append(Planted(rule, path, secret))
    return planted


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    base = tmp_path_factory.mktemp("secret-files")
    config_dir, shared = base / "config", base / "shared"
    config_dir.mkdir()
    shared.mkdir()
    sinks, planted = _plant(config_dir, shared)
    named = _plant_named(config_dir)
    write_yaml(config_dir / "workflows", detect_workflow(), "people.yaml")
    clip = {**demo_stream("clip"), "workflow": "workflows/people.yaml", "outputs": list(sinks)}
    doc = {
        "server": {"token": TOKEN, "file_roots": [".", "../shared", str(MODELS)]},
        "models": {"person": person_model()},
        "streams": [clip],
        "sinks": sinks,
        "profiling": {"dir": "traces", "rotate_s": 0.5, "max_window_s": 5},
    }
    server = LiveServer(write_yaml(config_dir, doc, "config.yaml"), token=TOKEN).start()
    wait_for(lambda: server.stream("clip")["frames_processed"] > 0, WAIT_S, "clip processing")
    yield Setup(server, config_dir, planted, named)
    assert server.stop()


def _names(setup: Setup, planted: Planted, i: int) -> list[str]:
    """Ways a request may name the file: as the config does (relative to it, or absolute),
    absolute, through a symlink and a hard link beside the config."""
    symlink, hardlink = setup.config_dir / f"link-{i}", setup.config_dir / f"hard-{i}"
    if not symlink.exists():
        symlink.symlink_to(planted.path)
        os.link(planted.path, hardlink)
    relative = os.path.relpath(planted.path, setup.config_dir)
    return [relative, str(planted.path), symlink.name, hardlink.name]


def _image() -> str:
    ok, jpg = cv2.imencode(".jpg", np.zeros((48, 64, 3), np.uint8))
    assert ok
    return base64.b64encode(jpg.tobytes()).decode()


def requests_naming(name: str) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """Every field of the API that names a file, set to `name`."""
    inline = detect_workflow("m")
    model = {**person_model(), "path": name}
    labelled = {**person_model(), "labels": None, "labels_file": name}
    stream = {"id": "leak", "source": demo_stream("x")["source"], "workflow": detect_workflow()}
    return {
        "workflow file": ("POST", VALIDATE, {"workflow": name}),
        "run a workflow file": ("POST", RUN, {"image": _image(), "workflow": name}),
        "model path": ("POST", VALIDATE, {"workflow": {**inline, "models": {"m": model}}}),
        "labels file": ("POST", VALIDATE, {"workflow": {**inline, "models": {"m": labelled}}}),
        "run with labels file": ("POST", RUN, {"image": _image(),
                                               "workflow": {**inline, "models": {"m": labelled}}}),
        "stream workflow": ("POST", "/v1/streams", {**stream, "workflow": name}),
        "stream source": ("POST", "/v1/streams", {**stream, "source": name}),
        "stream labels file": ("POST", "/v1/streams", {**stream, "workflow": {
            **inline, "models": {"m": labelled}}}),
    }  # fmt: skip


def _assert_clean(setup: Setup, where: str, text: str) -> None:
    for planted in [*setup.planted, *setup.named]:
        assert planted.secret not in text, f"{planted.field}'s secret leaked in {where}: {text}"


def _assert_refused(setup: Setup, name: str, rules: list[str]) -> None:
    """Every field of the API naming `name` is refused (403, each of `rules` in its
    message), and no planted secret is in its answer, nor in the models' labels after it
    (where a labels file read would come back)."""
    server = setup.server
    for what, (method, path, body) in requests_naming(name).items():
        reply = server.call(method, path, json_body=body)
        _assert_clean(setup, f"{what} = {name!r}", reply.body.decode())
        models = server.call("GET", "/v1/models").body.decode()
        _assert_clean(setup, f"GET /v1/models after {what} = {name!r}", models)
        assert (reply.status, reply.error["code"]) == (403, "forbidden"), (what, name)
        for rule in rules:
            assert rule in reply.error["message"], (what, name, reply.error)


def test_no_api_call_reads_a_secret_file_the_config_names(setup: Setup) -> None:
    server = setup.server
    for i, planted in enumerate(setup.planted):
        rule = f"a secret file the config names ({planted.field}) is never read"
        for name in _names(setup, planted, i):
            _assert_refused(setup, name, [rule])
    # A workflow file inside the roots whose model names each secret as its labels file.
    for i, planted in enumerate(setup.planted):
        relative = os.path.relpath(planted.path, setup.config_dir)
        leak = {**detect_workflow("m"), "models": {"m": {**person_model(), "labels": None,
                                                         "labels_file": relative}}}  # fmt: skip
        write_yaml(setup.config_dir, leak, f"leak-{i}.yaml")
        reply = server.call("POST", VALIDATE, json_body={"workflow": f"leak-{i}.yaml"})
        _assert_clean(setup, f"leak-{i}.yaml", reply.body.decode())
        assert reply.status == 403 and planted.field in reply.error["message"], reply.body
    assert server.call("GET", "/v1/streams/leak").status == 404
    assert [m["id"] for m in server.get_json("/v1/models")["models"]] == ["person"]
    assert server.stream("clip")["state"] == "running"  # the stream went on throughout

    window = profiling_window(server)
    for _, path, reply in get_routes(server, ["clip"], window):
        _assert_clean(setup, f"GET {path}", reply.body.decode(errors="replace"))


def test_no_api_call_reads_a_file_named_like_a_secret(setup: Setup) -> None:
    """Refused by name wherever it lies in the roots, however it is named: as given,
    absolute, or through a symlink whose own name says nothing."""
    server = setup.server
    for i, planted in enumerate(setup.named):
        link = setup.config_dir / f"plain-{i}.txt"
        if not link.exists():
            link.symlink_to(planted.path)
        relative = os.path.relpath(planted.path, setup.config_dir)
        for name in (relative, str(planted.path), link.name):
            _assert_refused(setup, name, [f"{planted.field} (", "is never read over the API"])
    assert server.call("GET", "/v1/streams/leak").status == 404
    assert [m["id"] for m in server.get_json("/v1/models")["models"]] == ["person"]


def test_answers_name_the_configs_paths_relative_to_it(setup: Setup) -> None:
    """The trace folder, a webhook's dead-letter file and the file roots as the config
    names them; no answer spells out the config folder's absolute path."""
    server = setup.server
    assert server.get_json("/ready")["profiling"]["trace_dir"] == "traces"
    sinks = {s["name"]: s for s in server.get_json("/v1/sinks")["sinks"]}
    assert sinks["webhook"]["extra"]["dead_letter_file"] == "traces/dead-letters/webhook.jsonl"
    refused = server.call("POST", VALIDATE, json_body={"workflow": "/etc/passwd"})
    assert refused.status == 403
    roots = f"outside the file roots (., ../shared, {MODELS}; server.file_roots)"
    assert roots in refused.error["message"], refused.error
    window = profiling_window(server)
    for _, path, reply in get_routes(server, ["clip"], window):
        if path == "/v1/audit":  # the requests as they were sent: above, absolute paths
            continue
        text = reply.body.decode(errors="replace")
        assert str(setup.config_dir) not in text, (path, text[:2000])


def _path_fields(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """The location of every Path field of a config model, at any depth."""
    for name, info in model.model_fields.items():
        for t in _types(info.annotation):
            if t is Path:
                yield prefix + name
            elif isinstance(t, type) and issubclass(t, BaseModel):
                yield from _path_fields(t, f"{prefix}{name}.")


def _types(annotation: Any) -> Iterator[Any]:
    """The types an annotation names (inside Optional, Annotated, list, ...)."""
    yield annotation
    for arg in typing.get_args(annotation):
        yield from _types(arg)


def test_every_path_field_of_a_sink_is_planted_here() -> None:
    """A new secret field (a Path in a sink's config) must be planted above too."""
    found = {kind: set(_path_fields(config_model(kind))) for kind in SINKS}
    assert found == {kind: set(fields) for kind, fields in SECRET_FIELDS.items()}


def test_the_config_file_is_refused_by_any_name(setup: Setup) -> None:
    config = setup.config_dir / "config.yaml"
    hard = setup.config_dir / "config-hard"
    if not hard.exists():
        os.link(config, hard)
    for name in ("config.yaml", str(config), "config-hard", "./traces/../config.yaml"):
        reply = setup.server.call("POST", VALIDATE, json_body={"workflow": name})
        assert reply.status == 403, (name, reply.body)
        assert "the appliance's config file is never read" in reply.error["message"]
        assert TOKEN not in reply.body.decode()
    assert yaml.safe_load(config.read_text())["server"]["token"] == TOKEN
