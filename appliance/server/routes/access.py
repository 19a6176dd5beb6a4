"""Who the caller is, and who changed what: the token's name and role (the web viewer
shows only what the role allows), and the audit of changes (admin only)."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from appliance.observe.audit import MAX_ENTRIES, AuditEntry
from appliance.observe.status import as_json
from appliance.policy.roles import Role
from appliance.server.auth import principal_of
from appliance.server.context import runtime_of
from appliance.server.errors import InvalidError
from appliance.server.routing import Fanout, Reply, Route

DEFAULT_LIMIT = 100


@dataclass(frozen=True, slots=True)
class Caller:
    """The caller as the appliance knows it: a token's name (never the token) and role."""

    name: str
    role: str  # viewer, operator or admin
    roles: list[str]  # the roles it holds: its own and those below it


@dataclass(frozen=True, slots=True)
class AuditList:
    """The recent changes, newest first (at most `limit`)."""

    entries: list[AuditEntry]


async def whoami(request: web.Request) -> web.Response:
    """The caller's token name and role: what the web viewer offers depends on it."""
    principal = principal_of(request)
    held = [role.label for role in Role if role <= principal.role]
    return web.json_response(as_json(Caller(principal.name, principal.role.label, held)))


def limit_of(request: web.Request) -> int:
    """`?limit=N`, 1..MAX_ENTRIES (422 otherwise), DEFAULT_LIMIT when not given."""
    given = request.query.getall("limit", [])
    if not given:
        return DEFAULT_LIMIT
    text = given[0]
    if len(given) > 1 or not (text.isascii() and text.isdigit()):
        raise InvalidError("limit: a whole number", [f"limit: expected 1..{MAX_ENTRIES}"])
    value = int(text)
    if not 1 <= value <= MAX_ENTRIES:
        raise InvalidError(f"limit: {value} is not in 1..{MAX_ENTRIES}", [f"limit: {value}"])
    return value


async def list_audit(request: web.Request) -> web.Response:
    """The most recent changes (streams added, removed or restarted, reloads, profiling
    windows, baselines, tunes), newest first: who (a token's name), what, on what, and
    how it ended. Kept in memory: the last 1000 of this process."""
    entries = runtime_of(request).audit.recent(limit_of(request))
    return web.json_response(as_json(AuditList(entries)))


_LIMIT = {"type": "integer", "minimum": 1, "maximum": MAX_ENTRIES, "default": DEFAULT_LIMIT}
ROUTES = (
    Route(
        "GET",
        "/v1/me",
        whoami,
        "Who am I",
        (Reply(200, "the caller's token name and role", Caller),),
        tag="access",
        role=Role.VIEWER,
        workers=Fanout.GATEWAY,
    ),
    Route(
        "GET",
        "/v1/audit",
        list_audit,
        "List recent changes",
        (Reply(200, "the audit, newest first", AuditList),),
        query={"limit": (_LIMIT, "how many entries, newest first")},
        tag="access",
        role=Role.ADMIN,
        workers=Fanout.MERGE,
    ),
)
