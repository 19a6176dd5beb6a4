"""The API describing itself: /openapi.json, and /docs, a plain HTML page listing every
operation (no script, no CDN: the appliance may have no network). Both are treated as
probes by the auth policy: they say what the API is, not what it runs."""

from __future__ import annotations

from html import escape
from typing import Any

from aiohttp import web

from appliance.policy.roles import Role
from appliance.server.context import OPENAPI
from appliance.server.routing import Fanout, Reply, Route

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title} API</title>
<style>
body {{ font: 15px/1.45 system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; }}
code, .method {{ font-family: ui-monospace, monospace; }}
.method {{ display: inline-block; width: 4.5rem; font-weight: bold; }}
section {{ border-top: 1px solid #ccc; padding: .4rem 0; }}
.lock {{ color: #a50; font-size: .85em; }}
</style></head><body>
<h1>{title} {version}</h1>
<p>{description} Machine-readable: <a href="/openapi.json">/openapi.json</a> (OpenAPI 3.1).</p>
{operations}
</body></html>
"""
OPERATION = """<section id="{op_id}"><p><span class="method">{method}</span><code>{path}</code>
 {lock} &mdash; <b>{summary}</b></p><p>{description}</p><p>Answers: {answers}</p></section>"""


async def openapi_json(request: web.Request) -> web.Response:
    """This document: OpenAPI 3.1, generated from the server's route table."""
    return web.json_response(request.app[OPENAPI])


async def docs(request: web.Request) -> web.Response:
    """A readable page of the same document."""
    return web.Response(text=render_docs(request.app[OPENAPI]), content_type="text/html")


def render_docs(document: dict[str, Any]) -> str:
    info = document["info"]
    operations = [
        OPERATION.format(
            op_id=escape(op["operationId"]),
            method=method.upper(),
            path=escape(path),
            lock="<span class=lock>(token)</span>" if op["security"] else "",
            summary=escape(op["summary"]),
            description=escape(op["description"]),
            answers=", ".join(escape(status) for status in op["responses"]),
        )
        for path, methods in document["paths"].items()
        for method, op in methods.items()
    ]
    return PAGE.format(
        title=escape(info["title"]),
        version=escape(info["version"]),
        description=escape(info["description"]),
        operations="\n".join(operations),
    )


ROUTES = (
    Route(
        "GET",
        "/openapi.json",
        openapi_json,
        "OpenAPI document",
        (Reply(200, "OpenAPI 3.1", {"type": "object"}),),
        probe=True,
        tag="meta",
        role=Role.VIEWER,
        workers=Fanout.ANY,
    ),
    Route(
        "GET",
        "/docs",
        docs,
        "API documentation page",
        (Reply(200, "HTML", {"type": "string"}, "text/html"),),
        probe=True,
        tag="meta",
        role=Role.VIEWER,
        workers=Fanout.ANY,
    ),
)
