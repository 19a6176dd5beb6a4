"""The OpenAPI 3.1 document, built from the route table (routes/__init__.py) and the auth
policy in force, so it always describes the server that answers: its paths, methods,
bodies, answers, and which of them need the token."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib import metadata
from typing import Any

from pydantic import TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from appliance.config import StreamConfig
from appliance.policy.roles import Role
from appliance.server.auth import AuthPolicy
from appliance.server.crosssite import SAFE_METHODS
from appliance.server.routing import JSON, Route, Schema
from appliance.server.schemas import Error

REF = "#/components/schemas/{model}"
ERRORS = {
    400: "malformed JSON, a body that is not an object, an undecodable image; a Host header "
    "that names no name of this appliance (server.allowed_hosts)",
    401: "missing or wrong bearer token",
    403: "the token's role is below the one the operation needs (`x-role`), or a file the "
    "access policy refuses (outside the file roots, the config or a secret file it names, "
    "not a regular file); a change sent by a page of another origin (Origin, Sec-Fetch-Site: "
    "server.allowed_origins)",
    404: "unknown stream or profiling window id",
    408: "the request took longer than limits.request_timeout_s and was cancelled",
    409: "conflict with the running state, or a count limit reached; nothing was changed",
    413: "body over server.max_body_bytes, or an image or file over its limit",
    415: "a body of a type the operation does not take (the types of its requestBody)",
    422: "the body parses but does not validate; `details` lists every problem",
    429: "limits.max_concurrent_runs workflow requests at work; retry after Retry-After",
    501: "`serve --workers` only: tuning runs per process (`appliance tune --config FILE`)",
    503: "the change could not be kept in server.state_dir (the folder named, the OS error); "
    "it was undone",
}
BEARER = {
    "type": "http",
    "scheme": "bearer",
    "description": "APPLIANCE_API_TOKEN or server.token (admin), or one of server.tokens",
}


def build_openapi(routes: Iterable[Route], policy: AuthPolicy) -> dict[str, Any]:
    routes = tuple(routes)
    refs, schemas = _component_schemas(routes)
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, policy, refs)
    components: dict[str, Any] = {"schemas": schemas}
    if policy.tokens:
        components["securitySchemes"] = {"bearer": BEARER}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "appliance",
            "version": _version(),
            "description": "The streaming video appliance's control API (docs/api.md).",
        },
        "paths": paths,
        "components": components,
    }


def _operation(route: Route, policy: AuthPolicy, refs: Mapping[Any, Any]) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": route.operation_id,
        "summary": route.summary,
        "description": route.description,
        "tags": [route.tag],
        "responses": _responses(route, policy, refs),
        "security": [{"bearer": []}] if policy.needs_token(route.path) else [],
        "x-role": route.role.label,  # the least role a token needs (docs/security.md)
    }
    parameters = [
        {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
        for p in route.parameters
    ]
    parameters += [
        {"name": name, "in": "query", "required": False, "schema": schema, "description": text}
        for name, (schema, text) in route.query.items()
    ]
    if parameters:
        op["parameters"] = parameters
    if route.body:
        content = {media: {"schema": _schema(s, refs)} for media, s in route.body.items()}
        op["requestBody"] = {"required": True, "content": content}
    return op


def _responses(route: Route, policy: AuthPolicy, refs: Mapping[Any, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for reply in route.replies:
        body = {"schema": _schema(reply.schema, refs)} if reply.schema is not None else {}
        out[str(reply.status)] = {
            "description": reply.description,
            "content": {reply.media_type: body},
        }
    error = {JSON: {"schema": refs[Error]}}
    for status in sorted(_error_statuses(route, policy)):
        out[str(status)] = {"description": ERRORS[status], "content": error}
    for code, header in (("401", "WWW-Authenticate"), ("429", "Retry-After")):
        if code in out:
            out[code]["headers"] = {header: {"required": True, "schema": {"type": "string"}}}
    return out


def _error_statuses(route: Route, policy: AuthPolicy) -> set[int]:
    statuses = {*route.errors, 400, 408}  # every request: its Host checked, its time limited
    if policy.needs_token(route.path):
        statuses.add(401)
        if route.role > Role.VIEWER:
            statuses.add(403)
    if route.method not in SAFE_METHODS:
        statuses.add(403)  # a page of another origin (crosssite.py)
    if route.body:
        statuses |= {413, 415, 422}
    if route.parameters:
        statuses.add(404)
    if route.query:
        statuses.add(422)
    return statuses


def _schema(schema: Schema | None, refs: Mapping[Any, Any]) -> Any:
    if isinstance(schema, type):
        return refs[schema]
    return dict(schema or {})


def _component_schemas(routes: tuple[Route, ...]) -> tuple[dict[Any, Any], dict[str, Any]]:
    """Every model and dataclass the routes name (appliance/observe/status.py's among them), as
    components; {type: {"$ref": ...}}."""
    types: list[type] = [Error]
    for route in routes:
        for s in [*(r.schema for r in route.replies), *route.body.values()]:
            if isinstance(s, type) and s not in types:
                types.append(s)
    mode: JsonSchemaMode = "validation"
    inputs: list[tuple[type, JsonSchemaMode, TypeAdapter[Any]]]
    inputs = [(t, mode, TypeAdapter(t)) for t in types]
    keys, top = TypeAdapter.json_schemas(inputs, ref_template=REF)
    schemas: dict[str, Any] = top.get("$defs", {})
    _describe_stream_config(schemas)
    return {t: ref for (t, _), ref in keys.items()}, schemas


def _describe_stream_config(schemas: dict[str, Any]) -> None:
    """StreamConfig's JSON Schema as the API reads it: `source` may be a bare URL string
    (its before-validator), URLs may not be blank, and `workflow` paths are strings."""
    if StreamConfig.__name__ not in schemas:
        return
    props = schemas[StreamConfig.__name__]["properties"]
    not_blank = r"\S"  # SourceConfig's url validator: not empty once stripped
    props["source"] = {
        "anyOf": [
            {"type": "string", "pattern": not_blank, "description": "short for {url: ...}"},
            {"$ref": REF.format(model="SourceConfig")},
        ]
    }
    schemas["SourceConfig"]["properties"]["url"]["pattern"] = not_blank
    for option in props["workflow"]["anyOf"]:
        option.pop("format", None)  # "path" is no JSON Schema format


def _version() -> str:
    try:
        return metadata.version("appliance")
    except metadata.PackageNotFoundError:
        return "0"
