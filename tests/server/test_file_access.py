"""The file-access policy against a live server: every field of a request that names a
file reads only under `server.file_roots`, only regular files, within the size caps, and
no answer quotes a file the request did not send (issue 8, part 1).

The layout each test runs in (`tree`):
    root/           the config's directory, the only file root
      config.yaml   the served config (holds the API token: never readable over the API)
      ok.yaml       a valid workflow; person.onnx (a model)
      big.yaml      over 1 MiB; notyaml.yaml: not YAML, with the marker inside
      link_out      -> ../outside/secret.yaml; dirlink -> ../outside; link_in -> ok.yaml
      fifo          a named pipe; sub/ a directory
    outside/        secret.yaml (a valid workflow), labels.txt, model.onnx, clip.mp4: the
                    first three with a marker

The generated escapes plant more of both per example: real files under outside/, and
symlinks and `..` paths inside root/ that lead to them (tests/support/path_escapes.py).
"""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from appliance.config import parse_config
from appliance.errors import LimitError
from appliance.runtime.runtime import Runtime
from tests.server.conftest import TOKEN, WAIT_S, LiveFactory, demo_stream
from tests.server.live import LiveServer, wait_for, write_yaml
from tests.support.appliance import MODELS, detect_workflow, person_model
from tests.support.path_escapes import ESCAPES, Escape, plant

MARKER = "MARKER-7c1e-outside-the-roots"
VALIDATE = "/v1/workflows/validate"
SHADOW = "/v1/streams/cam/shadow"


@dataclass(frozen=True)
class Tree:
    root: Path
    outside: Path
    server: LiveServer


def _image() -> str:
    ok, jpg = cv2.imencode(".jpg", np.zeros((48, 64, 3), np.uint8))
    assert ok
    return base64.b64encode(jpg.tobytes()).decode()


def _plant(root: Path, outside: Path) -> None:
    secret = {**detect_workflow("person"), "name": MARKER}
    (outside / "secret.yaml").write_text(yaml.safe_dump(secret))
    (outside / "labels.txt").write_text(f"{MARKER}\nroot:x:0:0\n")
    shutil.copy(MODELS / "person_ssdlite.onnx", outside / "model.onnx")
    shutil.copy(MODELS.parent / "media" / "demo.mp4", outside / "clip.mp4")
    shutil.copy(MODELS / "person_ssdlite.onnx", root / "person.onnx")
    write_yaml(root, detect_workflow("person"), "ok.yaml")
    (root / "big.yaml").write_text("# " + "x" * (1 << 20) + "\n")
    (root / "notyaml.yaml").write_text(f"blocks: [\n  {MARKER}: : ]\n")
    (root / "link_out").symlink_to(outside / "secret.yaml")
    (root / "dirlink").symlink_to(outside)
    (root / "link_in").symlink_to(root / "ok.yaml")
    (root / "sub").mkdir()
    os.mkfifo(root / "fifo")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tree]:
    base = tmp_path_factory.mktemp("files")
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    _plant(root, outside)
    doc = {
        "server": {"token": TOKEN},  # file_roots: the config's directory (the default)
        "models": {"person": person_model()},
        "streams": [{**demo_stream("cam"), "source": {"url": "demo.mp4", "loop": True}}],
    }
    shutil.copy(MODELS.parent / "media" / "demo.mp4", root / "demo.mp4")
    server = LiveServer(write_yaml(root, doc, "config.yaml"), token=TOKEN).start()
    wait_for(lambda: server.stream("cam")["frames_processed"] > 0, WAIT_S, "cam processing")
    yield Tree(root, outside, server)
    assert server.stop()


def _refusal(tree: Tree, name: str) -> str | None:
    """The rule the appliance must refuse `name` with, found by the kernel's resolution
    (symlinks followed, `..` taken after them), or None where it may be read."""
    resolved = Path(os.path.realpath(tree.root / name))
    if not resolved.is_relative_to(tree.root):
        return "outside the file roots"
    if resolved == tree.root / "config.yaml":
        return "config file is never read over the API"
    return None


def _requests(name: str) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """Every field of the API that names a file, set to `name`."""
    inline = detect_workflow("m")
    model = {**person_model(), "path": name}
    labelled = {**person_model(), "path": "person.onnx", "labels": None, "labels_file": name}
    return {
        "validate workflow": ("POST", VALIDATE, {"workflow": name}),
        "run workflow": ("POST", "/v1/workflows/run", {"image": _image(), "workflow": name}),
        "model path": ("POST", VALIDATE, {"workflow": {**inline, "models": {"m": model}}}),
        "labels file": ("POST", VALIDATE, {"workflow": {**inline, "models": {"m": labelled}}}),
        "stream workflow": ("POST", "/v1/streams", {"id": "f", "source": "demo.mp4",
                                                    "workflow": name}),
        "stream source": ("POST", "/v1/streams", {"id": "f", "source": name,
                                                  "workflow": detect_workflow()}),
        "shadow workflow": ("POST", SHADOW, {"workflow": name}),
    }  # fmt: skip


def _check(tree: Tree, name: str, field: str | None = None) -> None:
    """Every field (or only `field`) set to `name`: nothing from outside comes back, and a
    name the kernel resolves outside the root, or to the config, is refused (403) with
    that rule and no other: the roots are checked first, so even a name that does not
    exist is refused for lying outside, never answered 'file not found'."""
    for each, (method, path, body) in _requests(name).items():
        if field not in (None, each):
            continue
        reply = tree.server.call(method, path, json_body=body)
        text = reply.body.decode(errors="replace")
        assert MARKER not in text and "root:x:0:0" not in text, (each, name, text)
        assert reply.status != 500, (each, name, text)
        rule = _refusal(tree, name)
        if rule is not None:
            assert reply.status == 403, (each, name, reply.status, text)
            assert rule in reply.error["message"], (each, name, text)
        if reply.status == 201:  # a stream or shadow of an allowed file: remove it again
            assert (
                tree.server.call("DELETE", SHADOW if path == SHADOW else "/v1/streams/f").status
                == 200
            )


def test_the_reproductions_are_refused_with_the_rule(tree: Tree) -> None:
    server = tree.server
    for name, rule in [("/dev/zero", "outside the file roots"),
                       ("/etc/shadow", "outside the file roots"),
                       ("link_out", "outside the file roots"),
                       ("config.yaml", "config file is never read over the API"),
                       ("fifo", "not a regular file"),
                       ("sub", "a directory")]:  # fmt: skip
        reply = server.call("POST", VALIDATE, json_body={"workflow": name})
        assert (reply.status, reply.error["code"]) == (403, "forbidden"), (name, reply.body)
        assert rule in reply.error["message"], reply.error
    big = server.call("POST", VALIDATE, json_body={"workflow": "big.yaml"})
    assert big.status == 413, big.body
    assert "limits.max_workflow_bytes = 1048576" in big.error["message"]
    # A file under the roots that is not YAML: the line and column, never the line.
    bad = server.call("POST", VALIDATE, json_body={"workflow": "notyaml.yaml"})
    assert bad.status == 422
    assert "line 2" in " ".join(bad.error["details"]) and MARKER not in bad.body.decode()
    ok = server.call("POST", VALIDATE, json_body={"workflow": "link_in"})
    assert ok.status == 200, ok.body


def test_a_labels_file_outside_the_roots_never_reaches_the_models(tree: Tree) -> None:
    inline = detect_workflow("leak")
    labelled = {**person_model(), "path": "person.onnx", "labels": None,
                "labels_file": "/etc/shadow"}  # fmt: skip
    body = {"image": _image(), "workflow": {**inline, "models": {"leak": labelled}}}
    reply = tree.server.call("POST", "/v1/workflows/run", json_body=body)
    assert reply.status == 403, reply.body
    assert "labels_file" in reply.error["message"]
    models = tree.server.get_json("/v1/models")["models"]
    assert [m["id"] for m in models] == ["person"]
    metrics = tree.server.call("GET", "/metrics").body.decode()
    assert 'appliance_file_refusals_total{kind="labels"}' in metrics


SEGMENTS = st.sampled_from(["..", ".", "", "sub", "dirlink", "link_out", "link_in", "fifo",
                            "outside", "secret.yaml", "labels.txt", "model.onnx", "ok.yaml",
                            "config.yaml", "etc", "shadow", "dev", "zero", "proc", "self",
                            "environ", "~", "%2e%2e", "..%2f", "%00"])  # fmt: skip
WORDS = st.text(alphabet="ab./%2e~-_", min_size=1, max_size=6)


@settings(max_examples=36, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    absolute=st.booleans(),
    segments=st.lists(SEGMENTS | WORDS, min_size=1, max_size=6),
)
def test_generated_paths_never_read_outside_the_roots(
    tree: Tree, absolute: bool, segments: list[str]
) -> None:
    _check(tree, ("/" if absolute else "") + "/".join(segments))


# What each field is sent in a generated escape: a file of the kind it reads, so that a
# policy that let the path through would answer it (200 or 201), not fail on its content.
CONTENT = {"validate workflow": "secret.yaml", "run workflow": "secret.yaml",
           "model path": "model.onnx", "labels file": "labels.txt",
           "stream workflow": "secret.yaml", "stream source": "clip.mp4"}  # fmt: skip


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(plan=ESCAPES)
@example(plan=Escape("dotdot", 0, 0, False, False, False, "a"))  # each route at least once
@example(plan=Escape("overshoot", 1, 2, False, False, True, "b"))
@example(plan=Escape("link_file", 2, 0, True, True, False, "c"))
@example(plan=Escape("link_dir", 0, 0, False, False, False, "d"))
@example(plan=Escape("chain", 1, 0, False, True, False, "e"))
@example(plan=Escape("link_dotdot", 0, 0, True, False, True, "f"))
def test_generated_escapes_to_real_files_are_refused_as_outside_the_roots(
    tree: Tree, plan: Escape
) -> None:
    """Symlinks and `..` that lead from the root to a real file of the field's kind: only
    the policy's resolution stops them (a policy that checked the path as written, or
    normalised it without following links, would read the file), so only its refusal,
    403 "outside the file roots", is accepted."""
    for field, name in plant(tree.root, tree.outside, plan, CONTENT).items():
        assert _refusal(tree, name) == "outside the file roots", name
        _check(tree, name, field)


@pytest.mark.parametrize("name", ["/dev/zero", "/dev/urandom", "/proc/self/environ", "/etc/passwd",
                                  "fifo", "../outside/model.onnx", "dirlink/model.onnx",
                                  str(Path.home() / ".bashrc")])  # fmt: skip
def test_each_field_refuses_system_and_special_files(tree: Tree, name: str) -> None:
    _check(tree, name)
    assert tree.server.stream("cam")["state"] == "running"  # the other streams go on


def test_ffmpeg_options_that_widen_what_it_opens_are_refused_over_the_api(tree: Tree) -> None:
    source = {"url": "demo.mp4", "options": {"protocol_whitelist": "file,http", "safe": "0"}}
    body = {"id": "opts", "source": source, "workflow": detect_workflow()}
    reply = tree.server.call("POST", "/v1/streams", json_body=body)
    assert (reply.status, reply.error["code"]) == (422, "invalid"), reply.body
    assert reply.error["details"] == [
        "source.options.protocol_whitelist: not allowed over the API (it widens what FFmpeg "
        "may open); set it in the config file",
        "source.options.safe: not allowed over the API (it widens what FFmpeg may open); "
        "set it in the config file",
    ]
    assert tree.server.call("GET", "/v1/streams/opts").status == 404
    body["source"] = {"url": "demo.mp4", "options": {"probesize": "32768"}}  # harmless: kept
    assert tree.server.call("POST", "/v1/streams", json_body=body).status == 201
    assert tree.server.call("DELETE", "/v1/streams/opts").status == 200


def _labels_body(name: str) -> dict[str, Any]:
    labelled = {**person_model(), "path": "person.onnx", "labels": None, "labels_file": name}
    return {"workflow": {**detect_workflow("m"), "models": {"m": labelled}}}


def test_labels_files_are_capped_in_count_and_length(tree: Tree) -> None:
    """A labels file's names come back in answers: more than limits.max_labels of them,
    or one longer than limits.max_label_chars, is refused (413) naming the limit."""
    (tree.root / "many.txt").write_text("".join(f"class{i}\n" for i in range(20_001)))
    (tree.root / "long.txt").write_text(f"person\n{'x' * 257}\n")
    (tree.root / "fine.txt").write_text(f"person\n{'x' * 256}\n\n")
    for name, limit in [("many.txt", "limits.max_labels = 20000"),
                        ("long.txt", "limits.max_label_chars = 256")]:  # fmt: skip
        reply = tree.server.call("POST", VALIDATE, json_body=_labels_body(name))
        assert (reply.status, reply.error["code"]) == (413, "payload_too_large"), reply.body
        assert limit in reply.error["message"] and "m.labels_file" in reply.error["message"]
        assert "x" * 257 not in reply.body.decode()
    ok = tree.server.call("POST", VALIDATE, json_body=_labels_body("fine.txt"))
    assert ok.status == 200, ok.body
    metrics = tree.server.call("GET", "/metrics").body.decode()
    assert 'appliance_limit_hits_total{limit="limits.max_labels"} 1.0' in metrics
    assert 'appliance_limit_hits_total{limit="limits.max_label_chars"} 1.0' in metrics


def test_the_configs_own_labels_file_is_capped_too(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("".join(f"class{i}\n" for i in range(11)))
    model = {**person_model(), "labels": None, "labels_file": "labels.txt"}
    doc = {"models": {"person": model}, "limits": {"max_labels": 10}}
    runtime = Runtime(parse_config(doc, tmp_path))
    limit = r"models.person.labels_file: .*has 11 labels \(limits.max_labels = 10\)"
    try:
        with pytest.raises(LimitError, match=limit):
            runtime.prepare()
    finally:
        runtime.stop()


def _layout(folder: Path) -> None:
    """config.yaml's folder: its models, workflows and video in their own folders, and
    what else may lie beside a config (another workflow, notes, a key)."""
    for sub in ("models", "workflows", "media", "more"):
        (folder / sub).mkdir()
    shutil.copy(MODELS / "person_ssdlite.onnx", folder / "models" / "person.onnx")
    (folder / "models" / "labels.txt").write_text("person\n")
    shutil.copy(MODELS.parent / "media" / "demo.mp4", folder / "media" / "clip.mp4")
    own_model = {**person_model(), "path": "../models/person.onnx"}
    own = {**detect_workflow("own"), "models": {"own": own_model}}
    for name in ("workflows/ok.yaml", "beside.yaml", "more/later.yaml"):
        write_yaml(folder, own, name)
    (folder / "deploy.key").write_text(f"{MARKER}\n")


def _default_roots_doc() -> dict[str, Any]:
    model = {**person_model(), "path": "models/person.onnx", "labels": None,
             "labels_file": "models/labels.txt"}  # fmt: skip
    source = {"url": "media/clip.mp4", "loop": True}
    return {
        "server": {"token": TOKEN},  # no file_roots: the default
        "models": {"person": model},
        "streams": [{"id": "cam", "source": source, "workflow": "workflows/ok.yaml"}],
    }


def test_the_default_roots_are_the_folders_of_the_configs_own_files(
    tmp_path: Path, live_server: LiveFactory
) -> None:
    """Not the config's folder: what lies beside the config is no request's business;
    the folders of its models, workflows (and their models) and videos are."""
    _layout(tmp_path)
    server = live_server(_default_roots_doc())
    for name in ("workflows/ok.yaml", "media/../workflows/ok.yaml"):
        assert server.call("POST", VALIDATE, json_body={"workflow": name}).status == 200
    stream = {"id": "api", "source": "media/clip.mp4", "workflow": "workflows/ok.yaml"}
    assert server.call("POST", "/v1/streams", json_body=stream).status == 201
    roots = "outside the file roots (models, media, workflows; server.file_roots)"
    for name in ("beside.yaml", "deploy.key", "more/later.yaml", "config.yaml", str(tmp_path)):
        reply = server.call("POST", VALIDATE, json_body={"workflow": name})
        assert reply.status == 403, (name, reply.body)
        assert roots in reply.error["message"] and MARKER not in reply.body.decode()
        assert str(tmp_path) not in reply.error["message"].replace(f"'{tmp_path}'", "")
    labelled = {**_labels_body("deploy.key")}
    assert server.call("POST", VALIDATE, json_body=labelled).status == 403


def test_a_reload_moves_the_default_roots_with_the_config(
    tmp_path: Path, live_server: LiveFactory
) -> None:
    _layout(tmp_path)
    doc = _default_roots_doc()
    server = live_server(doc)
    later = {"workflow": "more/later.yaml"}
    assert server.call("POST", VALIDATE, json_body=later).status == 403
    doc["streams"].append({**doc["streams"][0], "id": "later", "workflow": "more/later.yaml"})
    write_yaml(tmp_path, doc, "config.yaml")
    assert server.call("POST", "/v1/config/reload").status == 200
    assert server.call("POST", VALIDATE, json_body=later).status == 200


def test_a_config_that_names_no_files_gives_the_api_none(
    tmp_path: Path, live_server: LiveFactory
) -> None:
    _layout(tmp_path)
    server = live_server({"server": {"token": TOKEN}})
    reply = server.call("POST", VALIDATE, json_body={"workflow": "workflows/ok.yaml"})
    assert (reply.status, reply.error["code"]) == (403, "forbidden"), reply.body
    assert "there are none" in reply.error["message"]
    assert "server.file_roots is empty, or unset" in reply.error["message"]


def test_a_root_named_relative_and_found_by_its_real_path_is_shown_once(tmp_path: Path) -> None:
    """A config in my/ naming ../flows/w.yaml: the folder is one root, named as the config
    names it (it was shown twice, as ../flows and as its absolute path)."""
    from appliance.policy.request_files import request_policy

    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "w.yaml").write_text(yaml.safe_dump(detect_workflow()))
    mine = tmp_path / "my"
    mine.mkdir()
    doc = {"models": {"person": person_model()},
           "streams": [{"id": "cam", "source": "rtsp://127.0.0.1:9/x",
                        "workflow": "../flows/w.yaml"}]}  # fmt: skip
    config = parse_config(doc, mine)
    policy = request_policy(config, mine / "config.yaml")
    assert flows.resolve() in (policy.roots or ())
    assert policy.shown_roots.count("../flows") == 1
    assert str(flows.resolve()) not in policy.shown_roots, policy.shown_roots
