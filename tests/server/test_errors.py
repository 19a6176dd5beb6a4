"""Every kind of bad request gets its precise 4xx answer in the one error shape, and
leaves the running stream alone (docs/api.md, "Errors")."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from tests.server.conftest import MAX_BODY
from tests.server.live import FORM_TYPE, LiveServer, multipart
from tests.support.appliance import DEMO_CLIP, detect_workflow

GOOD_SOURCE = {"url": str(DEMO_CLIP)}
UNKNOWN_BLOCK = {"name": "w", "blocks": [{"id": "b", "type": "nope"}], "outputs": {"b": "b"}}
STREAMS, RUN, VALIDATE = "/v1/streams", "/v1/workflows/run", "/v1/workflows/validate"
GHOST_MODEL = {"path": "ghost.onnx", "decoder": "tf_od", "providers": ["cpu"]}
JSON = "application/json"
FORM = FORM_TYPE["Content-Type"]


@dataclass(frozen=True)
class Bad:
    """A bad request and its answer: status, code, text in the message or a detail."""

    method: str
    path: str
    body: bytes | None
    status: int
    code: str
    text: str
    content_type: str = JSON


def doc(value: Any) -> bytes:
    return json.dumps(value).encode()


def new_stream(**fields: Any) -> bytes:
    return doc({"id": "x", "source": GOOD_SOURCE, "workflow": detect_workflow(), **fields})


BAD_REQUESTS = {
    "malformed JSON": Bad("POST", STREAMS, b'{"id": ', 400, "bad_request", "malformed JSON"),
    "not an object": Bad("POST", STREAMS, b"[1, 2]", 400, "bad_request", "got an array"),
    "not UTF-8": Bad("POST", STREAMS, b'{"id": "\xff"}', 400, "bad_request", "malformed JSON"),
    "wrong type": Bad(
        "POST",
        STREAMS,
        new_stream(source={"url": "a", "loop": "yes"}),
        422,
        "invalid",
        "source.loop: Input should be a valid boolean (got 'yes')",
    ),
    "a string for a number": Bad(
        "POST",
        STREAMS,
        new_stream(source={"url": "a", "stall_timeout_s": "5"}),
        422,
        "invalid",
        "source.stall_timeout_s: Input should be a valid number (got '5')",
    ),
    "missing field": Bad(
        "POST", STREAMS, b'{"id": "x", "source": "a"}', 422, "invalid", "workflow: Field required"
    ),
    "unknown field": Bad(
        "POST", STREAMS, new_stream(colour=1), 422, "invalid", "colour: unknown parameter"
    ),
    "bad id": Bad(
        "POST", STREAMS, new_stream(id="../x"), 422, "invalid", "id: String should match pattern"
    ),
    "duplicate id": Bad(
        "POST", STREAMS, new_stream(id="cam"), 409, "conflict", "stream 'cam' already exists"
    ),
    "invalid workflow": Bad(
        "POST",
        STREAMS,
        new_stream(workflow=UNKNOWN_BLOCK),
        422,
        "invalid",
        "blocks[0].type: unknown block type 'nope'",
    ),
    "missing model file": Bad(
        "POST",
        VALIDATE,
        doc({"workflow": {**detect_workflow("ghost"), "models": {"ghost": GHOST_MODEL}}}),
        422,
        "invalid",
        "model file 'ghost.onnx': file not found",
    ),
    "model file outside the roots": Bad(
        "POST",
        VALIDATE,
        doc(
            {
                "workflow": {
                    **detect_workflow("ghost"),
                    "models": {"ghost": {**GHOST_MODEL, "path": "/nonexistent/g.onnx"}},
                }
            }
        ),
        403,
        "forbidden",
        "model file '/nonexistent/g.onnx': outside the file roots",
    ),
    "missing workflow file": Bad(
        "POST",
        STREAMS,
        new_stream(workflow="missing.yaml"),
        422,
        "invalid",
        "workflow file 'missing.yaml': file not found",
    ),
    "NUL in a path": Bad(
        "POST",
        VALIDATE,
        b'{"workflow": "a\\u0000b"}',
        422,
        "invalid",
        "workflow: contains a NUL character",
    ),
    "too large": Bad(
        "POST", STREAMS, b" " * (MAX_BODY + 1), 413, "payload_too_large", "server.max_body_bytes"
    ),
    "too large form": Bad(
        "POST",
        RUN,
        multipart({"image": b"x" * (MAX_BODY + 1)}),
        413,
        "payload_too_large",
        "server.max_body_bytes",
        FORM,
    ),
    "unknown stream": Bad("GET", f"{STREAMS}/nope", None, 404, "not_found", "unknown stream"),
    "remove unknown": Bad("DELETE", f"{STREAMS}/nope", None, 404, "not_found", "unknown stream"),
    "restart unknown": Bad(
        "POST", f"{STREAMS}/nope/restart", None, 404, "not_found", "unknown stream 'nope'"
    ),
    "unknown route": Bad("GET", "/v1/nope", None, 404, "not_found", "no route GET /v1/nope"),
    "wrong method": Bad("PUT", STREAMS, b"{}", 405, "method_not_allowed", "allowed: GET, POST"),
    "run as text": Bad(
        "POST", RUN, b"hi", 415, "unsupported_media_type", "got text/plain", "text/plain"
    ),
    "bad base64": Bad(
        "POST",
        RUN,
        doc({"image": "!!", "workflow": {}}),
        400,
        "bad_request",
        "image: not valid base64",
    ),
    "not an image": Bad(
        "POST",
        RUN,
        doc({"image": "aGVsbG8=", "workflow": detect_workflow()}),
        400,
        "bad_request",
        "not an image in a known format (5 bytes)",
    ),
    "form without workflow": Bad(
        "POST",
        RUN,
        multipart({"image": b"x", "extra": b"1"}),
        422,
        "invalid",
        "workflow: required",
        FORM,
    ),
    "form with a broken part header": Bad(  # found by schemathesis: was a 500
        "POST",
        RUN,
        b"--0d37f771f3609e9baf6be26654101f5f\r\nTrue--0d37f771f3609e9baf6be26654101f5f--\r\n",
        400,
        "bad_request",
        "malformed multipart body",
        "multipart/form-data; boundary=0d37f771f3609e9baf6be26654101f5f",
    ),
    "invalid workflow to validate": Bad(
        "POST",
        VALIDATE,
        doc({"workflow": UNKNOWN_BLOCK}),
        422,
        "invalid",
        "blocks[0].type: unknown block type 'nope'",  # once: not `outputs.b` again
    ),
}


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bad_requests_are_answered_precisely_and_change_nothing(
    cam_server: LiveServer, cam_untouched: None, case: str
) -> None:
    bad = BAD_REQUESTS[case]
    headers = {"Content-Type": bad.content_type} if bad.body is not None else {}
    reply = cam_server.call(bad.method, bad.path, body=bad.body, headers=headers)
    assert reply.status == bad.status, reply.body
    error = reply.error
    assert error["code"] == bad.code
    assert any(bad.text in line for line in [error["message"], *error["details"]]), error
    if bad.status == 405:
        assert reply.headers["allow"] == "GET,POST"
    assert set(cam_server.runtime.streams) == {"cam"}
