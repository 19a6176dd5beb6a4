"""The audit of the API's changes: each request to a route that declares a change
(`Route.audit`) is recorded with who made it and how it ended (appliance/observe/audit.py).

The outermost middleware, so it sees the answer as the client gets it, errors included
(a 403 for a role too low, a 422 for a bad body). A request the auth middleware turned
away without a principal (401, or a cross-site refusal before it) is not recorded: anyone
can send those. A handler names what it changed when the path does not (a new stream's
id) with `audit_target`, adds a note (`apply`) with `audit_note`, and says with
`audit_skip` that the request changes nothing after all (a reload's dry run).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from aiohttp import web
from aiohttp.typedefs import Middleware

from appliance.observe.audit import AuditLog, outcome_of
from appliance.server.auth import PRINCIPAL, REFUSED
from appliance.server.errors import Handler
from appliance.server.routing import Route

TARGET = web.RequestKey("audit_target", str)
NOTE = web.RequestKey("audit_note", str)
SKIP = web.RequestKey("audit_skip", bool)


def audit_target(request: web.Request, target: str) -> None:
    """What the request changed, when its path does not say (a new stream's id)."""
    request[TARGET] = target


def audit_note(request: web.Request, note: str) -> None:
    """A note for the request's audit entry (`apply`)."""
    request[NOTE] = note


def audit_skip(request: web.Request) -> None:
    """This request changes nothing after all (a reload's dry run): not recorded."""
    request[SKIP] = True


def audit_middleware(
    audit: AuditLog, routes: Iterable[Route], *, refusals_only: bool = False
) -> Middleware:
    """Records each request to an audited route of `routes` in `audit`; `refusals_only`
    (a gateway's): only those refused here for the role, which no member hears of (the
    member that acts on the others records them)."""
    actions = {r.operation_id: r.audit for r in routes if r.audit is not None}

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        action = actions.get(request.match_info.route.name or "")
        principal = request.get(PRINCIPAL)
        if action is None or principal is None or request.get(SKIP):
            return response
        if refusals_only and not request.get(REFUSED):
            return response
        info = request.match_info
        target = request.get(TARGET) or info.get("id") or info.get("session_id")
        status = response.status
        detail = _error_message(response) if status >= 400 else request.get(NOTE)
        audit.record(
            principal.who, action, target, outcome_of(status), status=status, detail=detail
        )
        return response

    return record


def _error_message(response: web.StreamResponse) -> str | None:
    """The message of an error answer (errors.py's JSON shape), if it has one."""
    body = getattr(response, "body", None)
    if not isinstance(body, bytes):
        return None
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None
    return message if isinstance(message, str) else None
