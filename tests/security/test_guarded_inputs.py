"""Every input a pattern guards is matched whole, in ASCII (issue 39): Python's `$` also
matches before a final newline and its `\\d` matches any script's digits, so
`"/dev/video0\\n"` passed the v4l2 device pattern and `"bus\\n"` a sink name's. pydantic's
`pattern=` runs Rust's regex, where `$` is the end of the text and `\\d` is Unicode too:
what it guards is checked here as well rather than assumed (docs/security.md, "Inputs").

Each guarded value is given as it should be, then with a newline after it, with a
non-ASCII digit (Arabic-Indic, full-width) and with a newline inside: the config, the
workflow language and the API each refuse all but the first.
"""

from __future__ import annotations

import http.client
from argparse import ArgumentTypeError
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from pydantic import TypeAdapter, ValidationError

from appliance.cli.tune import parse_duration
from appliance.config import ConfigError, parse_config
from appliance.runtime.sharding import Shard
from appliance.sources.base import source_kind
from pipelines.blocks._draw import HexColor
from pipelines.compiler import parse_workflow
from pipelines.errors import WorkflowError
from tests.server.conftest import TOKEN, WAIT_S, config_doc, demo_stream
from tests.server.live import LiveServer, wait_for, write_yaml
from tests.support.appliance import DEMO_CLIP, detect_workflow, person_model

HOOK = "http://127.0.0.1:9/hook"


def spoiled(valid: str) -> list[str]:
    """`valid` with a final newline, a non-ASCII digit (٣, ３) and an inner newline."""
    middle = len(valid) // 2
    return [f"{valid}\n", f"{valid}\u0663", f"{valid}\uff13", f"{valid[:middle]}\n{valid[middle:]}"]


def _stream(value: str) -> dict[str, Any]:
    stream = {"id": value, "source": str(DEMO_CLIP), "workflow": detect_workflow()}
    return {"models": {"person": person_model()}, "streams": [stream]}


def _token(**fields: str) -> dict[str, Any]:
    return {"server": {"tokens": [{"name": "viewer", "role": "viewer", **fields}]}}


# config field -> (a valid value, the config that sets the field to a value)
CONFIG_FIELDS: dict[str, tuple[str, Callable[[str], dict[str, Any]]]] = {
    "streams[0].id": ("cam1", _stream),
    "sinks.<name>": ("hook1", lambda v: {"sinks": {v: {"type": "webhook", "url": HOOK}}}),
    "server.tokens[0].name": ("viewer1", lambda v: _token(name=v, token_env="VIEWER_TOKEN")),
    "server.tokens[0].token_env": ("VIEWER_TOKEN1", lambda v: _token(token_env=v)),
    "server.allowed_hosts[0]": ("cam1.example", lambda v: {"server": {"allowed_hosts": [v]}}),
    "server.allowed_source_hosts[0]": (
        "cam1.example",
        lambda v: {"server": {"allowed_source_hosts": [v]}},
    ),
}
CONFIG_CASES = [
    pytest.param(field, bad, id=f"{field}={bad!r}")
    for field, (valid, _) in CONFIG_FIELDS.items()
    for bad in [valid, *spoiled(valid)]
]


@pytest.mark.parametrize(("field", "value"), CONFIG_CASES)
def test_the_config_matches_a_guarded_value_whole(field: str, value: str, tmp_path: Path) -> None:
    valid, doc = CONFIG_FIELDS[field]
    if value == valid:
        parse_config(doc(value), tmp_path)
        return
    with pytest.raises(ConfigError) as refused:
        parse_config(doc(value), tmp_path)
    where = field.replace("<name>", "")
    assert where in str(refused.value), refused.value


@pytest.mark.parametrize("value", ["people1", *spoiled("people1")])
def test_a_block_id_is_matched_whole(value: str) -> None:
    workflow = {"blocks": [{"id": value, "type": "detect", "model": "m"}]}
    if value == "people1":
        assert parse_workflow(workflow).blocks[0].id == value
        return
    with pytest.raises(WorkflowError, match=r"blocks\[0\]\.id: String should match pattern"):
        parse_workflow(workflow)


@pytest.mark.parametrize("value", ["#00ff00", *spoiled("#00ff00")])
def test_a_colour_is_matched_whole(value: str) -> None:
    """A block parameter's pattern (pydantic, Rust's regex): the blur's and annotate's."""
    adapter = TypeAdapter(HexColor)
    if value == "#00ff00":
        assert adapter.validate_python(value) == value
        return
    with pytest.raises(ValidationError, match="String should match pattern"):
        adapter.validate_python(value)


@pytest.mark.parametrize("value", ["/dev/video0", "/dev/video12", *spoiled("/dev/video0")])
def test_only_a_whole_device_path_is_a_camera(value: str) -> None:
    """Anything else is a file, and goes through the file policy (a request's: under
    the roots only)."""
    assert source_kind(value) == ("v4l2" if value in ("/dev/video0", "/dev/video12") else "file")


@pytest.mark.parametrize(
    ("text", "host"),
    [("\u0661/3", "x"), ("1/\u0663", "x"), ("auto/3", "appliance-\u0662"), ("auto/3", "a-2\n")],
)
def test_a_shard_is_ascii_digits(text: str, host: str) -> None:
    """`--shard`, APPLIANCE_SHARD and the hostname's ordinal (surrounding spaces of the
    setting are trimmed on purpose: it comes from the environment)."""
    assert Shard.parse("auto/3", lambda: "appliance-2") == Shard(2, 3)
    with pytest.raises(ValueError, match="shard"):
        Shard.parse(text, lambda: host)


@pytest.mark.parametrize("text", ["\u0669\u0660s", "9\uff10", "\u0665m"])
def test_a_duration_is_ascii_digits(text: str) -> None:
    assert parse_duration("90s") == 90.0
    with pytest.raises(ArgumentTypeError):
        parse_duration(text)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("api")
    live = LiveServer(
        write_yaml(folder, config_doc(demo_stream("clip")), "config.yaml"), token=TOKEN
    ).start()
    wait_for(lambda: live.stream("clip")["frames_processed"] > 0, WAIT_S, "clip processing")
    yield live
    assert live.stop()


def _status(api: LiveServer, path: str) -> int:
    """The status of a GET, without reading the body (an MJPEG answer never ends)."""
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=30)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.parametrize("value", spoiled("cam1"))
def test_the_api_refuses_a_spoiled_stream_id(api: LiveServer, value: str) -> None:
    body = {"id": value, "source": str(DEMO_CLIP), "workflow": detect_workflow()}
    reply = api.call("POST", "/v1/streams", json_body=body)
    assert reply.status == 422, reply.body
    assert any(d.startswith("id: String should match pattern") for d in reply.error["details"])


@pytest.mark.parametrize("value", spoiled("/dev/video0"))
def test_the_api_never_takes_a_spoiled_device_for_a_camera(api: LiveServer, value: str) -> None:
    """A file outside the roots, then: refused, and no stream is added."""
    body = {"id": "dev", "source": value, "workflow": detect_workflow()}
    reply = api.call("POST", "/v1/streams", json_body=body)
    assert (reply.status, reply.error["code"]) == (403, "forbidden"), reply.body
    message = reply.error["message"]
    assert message.startswith(f"stream 'dev' source.url: video file {value!r}: outside"), message
    assert api.call("GET", "/v1/streams/dev").status == 404


@pytest.mark.parametrize("value", spoiled("people1"))
def test_the_api_refuses_a_spoiled_block_id(api: LiveServer, value: str) -> None:
    workflow = {**detect_workflow(), "blocks": [{**detect_workflow()["blocks"][0], "id": value}]}
    reply = api.call("POST", "/v1/workflows/validate", json_body={"workflow": workflow})
    assert reply.status == 422, reply.body


@pytest.mark.parametrize("value", ["5", "2.5", *spoiled("5"), "\u0665", " 5", "1e1", "nan", "0x5"])
def test_the_mjpeg_frame_rate_is_a_plain_decimal(api: LiveServer, value: str) -> None:
    expected = 200 if value in ("5", "2.5") else 422
    assert _status(api, f"/v1/streams/clip/video.mjpeg?max_fps={quote(value)}") == expected
