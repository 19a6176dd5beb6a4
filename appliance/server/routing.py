"""The shape of the one route table: app.py registers it, openapi.py documents it, the
auth policy enforces the role each route declares (`Route.role`), the audit records the
changes it declares (`Route.audit`), and the `serve --workers` gateway
(appliance/workers/gateway.py) answers it as each route declares (`Route.workers`), so
neither the document, the roles nor the gateway can drift from the routes that answer."""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from appliance.policy.roles import Role
from appliance.server.errors import Handler, InvalidError

# A pydantic model or a dataclass (its JSON Schema is generated), or a literal JSON Schema.
Schema = type | Mapping[str, Any]

JSON = "application/json"
_PARAM = re.compile(r"{(\w+)}")


class Fanout(enum.Enum):
    """How the gateway of `serve --workers N` answers a route: which worker processes
    it asks, and how their answers become one (appliance/workers/gateway.py)."""

    OWNER = "owner"  # the worker that runs the stream the path's {id} names
    PLACE = "place"  # a new stream: the least loaded worker (the one that has the id: 409)
    HOLDER = "holder"  # each worker in turn until one answers other than 404 (a session)
    ANY = "any"  # any live worker, in turn: each would answer the same
    MERGE = "merge"  # every worker, the answers merged (a merge handler per operation)
    GATEWAY = "gateway"  # the gateway itself, from what it knows (its supervisor's health)
    PER_PROCESS = "per_process"  # 501: it runs in one process (`appliance tune --config`)


@dataclass(frozen=True, slots=True)
class Reply:
    """One documented success answer."""

    status: int
    description: str
    schema: Schema | None = None
    media_type: str = JSON


@dataclass(frozen=True, slots=True)
class Route:
    """One method on one path. The handler's docstring is the operation's description.

    `errors` lists the statuses a route answers beyond those every route of its kind has
    (401 where a token is needed; 400, 413 and 422 with a body; 404 with a path parameter).
    `workers` says how `serve --workers` answers it and `role` the least role a token
    needs for it (viewer, operator, admin; probes and the viewer's assets declare viewer,
    what they need where they are not open): both required (keyword only), so a new route
    can neither go to whichever worker nor be open to whoever holds a token by default.
    `audit` names the change a route makes (`stream.add`): each request is recorded with
    who made it and how it ended (appliance/server/audit.py); None for a route that
    changes nothing.
    """

    method: str
    path: str
    handler: Handler
    summary: str
    replies: tuple[Reply, ...]
    errors: tuple[int, ...] = ()
    body: Mapping[str, Schema] = field(default_factory=dict)  # media type -> schema
    # Optional query parameters: name -> (JSON schema, description); 422 when invalid.
    query: Mapping[str, tuple[dict[str, Any], str]] = field(default_factory=dict)
    probe: bool = False  # open without a token where the policy opens probes
    public: bool = False  # always open: the web viewer's page and assets hold no data
    streaming: bool = False  # answers for as long as the client reads (no time limit)
    tag: str = "streams"
    workers: Fanout = field(kw_only=True)
    role: Role = field(kw_only=True)
    audit: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.workers, Fanout):  # None, a string: named at import
            raise TypeError(
                f"route {self.method} {self.path}: workers={self.workers!r} is not a Fanout"
            )
        if not isinstance(self.role, Role):
            raise TypeError(f"route {self.method} {self.path}: role={self.role!r} is not a Role")
        if self.workers is Fanout.OWNER and "id" not in self.parameters:
            raise TypeError(f"route {self.method} {self.path}: OWNER needs a stream {{id}}")

    @property
    def operation_id(self) -> str:
        return self.handler.__name__

    @property
    def parameters(self) -> list[str]:
        return _PARAM.findall(self.path)

    @property
    def description(self) -> str:
        return " ".join((self.handler.__doc__ or self.summary).split())


def known_query(route: Route) -> Handler:
    """The route's handler, refusing a request with a query parameter the route does not
    declare (422, naming them): a misspelt `?limt=5` is not silently the default. Routes
    that declare none are left as they are."""
    if not route.query:
        return route.handler
    allowed, handler = frozenset(route.query), route.handler

    @functools.wraps(handler)
    async def checked(request: web.Request) -> web.StreamResponse:
        unknown = sorted(set(request.query) - allowed)
        if unknown:  # as `?dry_run`'s own check words it (routes/config.py)
            known = ", ".join(sorted(allowed))
            raise InvalidError("invalid query", [f"{unknown[0][:64]!r}: unknown (known: {known})"])
        return await handler(request)

    return checked
