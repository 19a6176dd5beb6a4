"""Workflows on demand: one image through a workflow (the appliance as a microservice),
and validation without running anything. Compiled workflows are cached by the runtime."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from appliance.policy.roles import Role
from appliance.runtime.oneshot import RunOptions, decode_image, run_image
from appliance.runtime.runtime import Runtime
from appliance.server.bodies import json_object, parse_json, read_form, reject_nul
from appliance.server.context import MAX_BODY, WORK_SLOTS, runtime_of
from appliance.server.errors import BadRequestError, InvalidError, UnsupportedMediaTypeError
from appliance.server.routing import JSON, Fanout, Reply, Route
from appliance.server.schemas import RunRequest, RunResult, Validated, ValidateRequest

FORM = "multipart/form-data"
Workflow = Path | Mapping[str, Any]
RunInput = tuple[bytes, Workflow, RunOptions]


def workflow_ref(value: str | dict[str, Any]) -> Workflow:
    """A string is a path (relative to the config file), a mapping an inline workflow."""
    return Path(value) if isinstance(value, str) else value


async def run_workflow(request: web.Request) -> web.Response:
    """Run one image through a workflow and wait for the result: JSON with a base64 image,
    or multipart/form-data with an `image` file part. `profile` adds a Chrome trace."""
    image, workflow, options = await _run_input(request)
    slots = request.app[WORK_SLOTS]
    answer = await slots.run(_run, runtime_of(request), image, workflow, options)
    return web.json_response(answer)


def _run(rt: Runtime, data: bytes, workflow: Workflow, options: RunOptions) -> dict[str, Any]:
    if not data:  # OpenCV asserts (cv2.error) on an empty buffer instead of failing to decode
        raise BadRequestError("image: empty")
    image = decode_image(data, rt.limits.max_image_pixels)
    return run_image(rt, image, workflow, options, rt.request_files)


async def _run_input(request: web.Request) -> RunInput:
    if request.content_type == JSON:
        body = await parse_json(request, RunRequest)
        options = RunOptions(profile=body.profile, video=body.video)
        return _base64(body.image), workflow_ref(body.workflow), options
    if request.content_type == FORM:
        return _form_input(await read_form(request, request.app[MAX_BODY]))
    raise UnsupportedMediaTypeError(
        f"expected {JSON} or {FORM}, got {request.content_type or 'no Content-Type'}"
    )


def _base64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequestError(f"image: not valid base64 ({exc})") from None


def _form_input(parts: dict[str, bytes]) -> RunInput:
    """The form's parts as a run: `image` (file), `workflow` (inline JSON or a path),
    optional `profile` and `video` (`true` or `false`)."""
    problems = [f"{name}: unknown part" for name in parts if name not in _FORM_PARTS]
    problems += [f"{name}: required" for name in ("image", "workflow") if name not in parts]
    flags = {name: _text(parts, name, "false") for name in ("profile", "video")}
    problems += [
        f"{name}: expected true or false (got {value!r})"
        for name, value in flags.items()
        if value not in ("true", "false")
    ]
    if problems:
        raise InvalidError("invalid multipart form", problems)
    text = _text(parts, "workflow", "").strip()
    reject_nul({"workflow": text})
    workflow = json_object(text.encode()) if text.startswith("{") else Path(text)
    options = RunOptions(profile=flags["profile"] == "true", video=flags["video"] == "true")
    return parts["image"], workflow, options


_FORM_PARTS = ("image", "workflow", "profile", "video")


def _text(parts: dict[str, bytes], name: str, default: str) -> str:
    if name not in parts:
        return default
    try:
        return parts[name].decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequestError(f"{name}: not UTF-8 text") from None


async def validate_workflow(request: web.Request) -> web.Response:
    """Compile a workflow (loading the models it declares) without running it."""
    body = await parse_json(request, ValidateRequest)
    slots = request.app[WORK_SLOTS]
    summary = await slots.run(_validate, runtime_of(request), workflow_ref(body.workflow))
    return web.json_response({"valid": True, "summary": summary})


def _validate(rt: Runtime, workflow: Workflow) -> str:
    compiled = rt.compile_workflow(workflow, "workflow", rt.request_files)
    rt.release_workflow(compiled)
    return compiled.summary()


FORM_SCHEMA = {
    "type": "object",
    "required": ["image", "workflow"],
    "additionalProperties": False,
    "properties": {
        "image": {
            "type": "string",
            "contentMediaType": "application/octet-stream",
            "description": "the image file (JPEG, PNG, ...)",
        },
        "workflow": {
            "type": "string",
            "description": "an inline workflow as JSON text, or a workflow file path",
        },
        "profile": {"type": "string", "enum": ["true", "false"], "default": "false"},
        "video": {"type": "string", "enum": ["true", "false"], "default": "false"},
    },
}

ROUTES = (
    Route(
        "POST",
        "/v1/workflows/run",
        run_workflow,
        "Run a workflow on one image",
        (Reply(200, "the workflow's outputs", RunResult),),
        errors=(403, 409, 415, 429),
        body={JSON: RunRequest, FORM: FORM_SCHEMA},
        tag="workflows",
        role=Role.ADMIN,
        workers=Fanout.ANY,
    ),
    Route(
        "POST",
        "/v1/workflows/validate",
        validate_workflow,
        "Validate a workflow",
        (Reply(200, "the workflow compiles", Validated),),
        errors=(403, 409, 429),
        body={JSON: ValidateRequest},
        tag="workflows",
        role=Role.ADMIN,
        workers=Fanout.ANY,
    ),
)
