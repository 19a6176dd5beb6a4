"""The one API in front of `serve --workers N`: the same routes as a single process
(routes/), each answered as the route declares (`Route.workers`, a `Fanout`):

- OWNER, `/v1/streams/{id}...`: the stream's worker (found by listing the workers,
  remembered);
- PLACE, `POST /v1/streams`: the least loaded worker, unless the id is taken;
- HOLDER, `DELETE /v1/webrtc/{session_id}`: the worker that holds the session;
- ANY (viewer, docs, one-image workflow runs): any live worker, in turn;
- MERGE: every worker, merged by the route's own handler here (`OWN`, by operation id):
  `/metrics`, `/ready`, the lists, `POST /v1/config/reload` (merge.py), the profiling
  windows (windows.py: a window in every worker, one merged trace), `/v1/regressions`;
- GATEWAY, `/health`: the gateway itself (its supervisor is alive);
- PER_PROCESS, `/v1/tune`: 501, a tune runs in one process (`appliance tune --config`).

`appliance gateway --replicas` (fleet.py) is this gateway over replicas: its rules are
`Gateway`'s hooks overridden and its own tables, which `plan` checks against the
declarations as it checks these: a route the gateway cannot answer, or a handler that no
route asks for, fails the build, named. Auth is checked here, by the same policy as a
single process's, before anything is forwarded; errors leave in the same JSON shape.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from appliance.errors import UnknownStreamError
from appliance.observe.audit import AuditLog
from appliance.observe.metrics import LIMIT_HITS_HELP
from appliance.observe.openmetrics import CONTENT_TYPE as OPENMETRICS_CONTENT_TYPE
from appliance.observe.status import as_json
from appliance.runtime.sharding import weight
from appliance.server.audit import audit_middleware
from appliance.server.auth import AuthPolicy, auth_middleware
from appliance.server.context import in_thread
from appliance.server.crosssite import LOOPBACK, CrossSite, cross_site_middleware
from appliance.server.errors import error_middleware
from appliance.server.routes import ROUTES
from appliance.server.routes.access import AuditList, limit_of, whoami
from appliance.server.routes.config import dry_run
from appliance.server.routes.probes import wants_openmetrics
from appliance.server.routes.tune import tune_per_process
from appliance.server.routing import Fanout, Route
from appliance.server.tls import TLS, tls_reloaded
from appliance.workers.clients import MemberClients, MemberUnavailableError
from appliance.workers.merge import (
    merge_audit,
    merge_lists,
    merge_metrics,
    merge_readiness,
    merge_regressions,
)
from appliance.workers.reloads import reload_all
from appliance.workers.windows import WindowFanOut

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
GATEWAY: web.AppKey[Gateway] = web.AppKey("gateway")
PROBE_TIMEOUT_S = 5.0  # a worker slower than this to say it is alive is left out


class Gateway:
    """What the handlers share: the member clients, who runs which stream, the windows.
    Its hooks (`placement`, `placed`, `removed`) are the rules a fleet changes."""

    def __init__(
        self,
        clients: MemberClients,
        policy: AuthPolicy,
        shard: str | None,
        owners: dict[str, int] | None = None,
        connection_hits: Mapping[str, int] | None = None,
        cross_site: CrossSite = LOOPBACK,
    ) -> None:
        self.clients = clients
        self.policy = policy
        self.cross_site = cross_site  # the names and origins its listener takes
        self.shard = shard
        # Stream id -> worker index: the config's rule at first (so a worker that is
        # still starting owns its streams: 503, not 404), then what the workers list.
        self.owners: dict[str, int] = dict(owners or {})
        self.windows = WindowFanOut(clients, self.listed_owners)
        # Limit -> connections the gateway's own listener closed (server/connections.py).
        self.connection_hits: Mapping[str, int] = {} if connection_hits is None else connection_hits
        # What the gateway refused itself (a role too low): its members record the rest.
        self.audit = AuditLog()
        self._turn = itertools.count()

    def members_view(self) -> list[dict[str, Any]]:
        return [member.view() for member in self.clients.members]

    async def refresh_owners(self) -> dict[int, tuple[int, Any]]:
        answers = await self.clients.fan_out("GET", "/v1/streams", timeout_s=PROBE_TIMEOUT_S)
        owners = {}
        for index, (status, body) in answers.items():
            if status == 200:
                owners.update({s["id"]: index for s in body["streams"]})
        # A worker that did not answer keeps its streams here: it is restarting.
        missing = set(range(self.clients.count)) - set(answers)
        owners.update({k: v for k, v in self.owners.items() if v in missing})
        self.owners = owners
        return answers

    async def listed_owners(self) -> dict[str, int]:
        """Stream id -> worker index, as the workers list their streams now."""
        await self.refresh_owners()
        return self.owners

    async def owner(self, stream_id: str, refresh: bool = False) -> int:
        if refresh or stream_id not in self.owners:
            await self.refresh_owners()
        if stream_id not in self.owners:
            raise UnknownStreamError(stream_id)
        return self.owners[stream_id]

    def any_worker(self) -> int:
        """The next member that is up, in turn (member 0 when none is: its 503 says so)."""
        members = self.clients.members
        for _ in range(len(members)):
            member = members[next(self._turn) % len(members)]
            if member.state == "up":
                return member.index
        return 0

    def admit(self, spec: dict[str, Any]) -> None:
        """Before a new stream `spec` (the POST body) is forwarded: raise to refuse it
        here (a fleet's store that could not keep it). The workers check for themselves."""

    def placement(self, stream_id: str) -> int:
        """A new stream's worker: the least loaded; ties by the sharding rule's weight."""
        loads = [0] * self.clients.count
        for index in self.owners.values():
            loads[index] += 1
        return min(range(self.clients.count), key=lambda i: (loads[i], -weight(i, stream_id)))

    async def placed(self, stream_id: str, index: int, body: bytes) -> None:
        """Member `index` accepted the new stream `body` (201)."""
        self.owners[stream_id] = index

    async def removed(self, stream_id: str, index: int) -> None:
        """Member `index` removed the stream (DELETE answered 200)."""
        self.owners.pop(stream_id, None)


def gateway_of(request: web.Request) -> Gateway:
    return request.app[GATEWAY]


# -- handlers ---------------------------------------------------------------------------
async def health(request: web.Request) -> web.Response:
    """Alive while the supervisor watches its workers (a dead worker is restarted); a
    fleet's gateway, while its probe of the replicas runs."""
    gw = gateway_of(request)
    group, body = gw.clients.group, {f"{gw.clients.noun}s": gw.members_view()}
    problem = group.fatal
    if problem is None and not group.monitoring:
        problem = f"the {gw.clients.noun} supervisor stopped"
    if problem is None:
        return web.json_response({"status": "ok", **body})
    return web.json_response({"status": "down", "reason": problem, **body}, status=503)


async def ready(request: web.Request) -> web.Response:
    gw = gateway_of(request)
    answers = await gw.clients.fan_out("GET", "/ready", timeout_s=PROBE_TIMEOUT_S)
    bodies = {i: body for i, (_, body) in answers.items() if isinstance(body, dict)}
    merged = merge_readiness(
        bodies,
        gw.members_view(),
        insecure=gw.policy.insecure,
        tls=TLS in request.app,
        shard=gw.shard,
        noun=gw.clients.noun,
    )
    return web.json_response(merged, status=200 if merged["ready"] else 503)


async def metrics(request: web.Request) -> web.Response:
    gw = gateway_of(request)
    # OpenMetrics from the workers always: the one format that carries their exemplars,
    # which the merge keeps (their links name the stream, which this gateway routes).
    answers = await gw.clients.fan_out(
        "GET", "/metrics", timeout_s=PROBE_TIMEOUT_S, accept=OPENMETRICS_CONTENT_TYPE
    )
    texts = {i: body for i, (status, body) in answers.items() if status == 200}
    up = GaugeMetricFamily(
        "appliance_worker_up", "1 while the worker process answers.", labels=["worker"]
    )
    restarts = CounterMetricFamily(
        "appliance_worker_restarts",
        "Worker processes started again after they died.",
        labels=["worker"],
    )
    for w in gw.members_view():
        up.add_metric([str(w["index"])], 1.0 if w["index"] in texts else 0.0)
        restarts.add_metric([str(w["index"])], float(w["restarts"]))
    # The gateway's own connection refusals, beside the workers' request refusals.
    hits = CounterMetricFamily("appliance_limit_hits", LIMIT_HITS_HELP, labels=["limit", "worker"])
    for limit, count in sorted(gw.connection_hits.items()):
        hits.add_metric([limit, "gateway"], float(count))
    openmetrics = wants_openmetrics(request.headers.get("Accept", ""))
    body = await in_thread(merge_metrics, texts, [up, restarts, hits], openmetrics)
    kind = OPENMETRICS_CONTENT_TYPE if openmetrics else CONTENT_TYPE_LATEST
    return web.Response(body=body, headers={"Content-Type": kind})


def merged_list(key: str, path: str) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        gw = gateway_of(request)
        answers = await (
            gw.refresh_owners() if key == "streams" else gw.clients.fan_out("GET", path)
        )
        listed = {i: b for i, (s, b) in answers.items() if s == 200}
        return web.json_response(merge_lists(key, listed, gw.clients.noun))

    return handler


def placed(route: Route) -> Handler:
    """PLACE: a new stream, where `Gateway.placement` says (the least loaded worker; a
    fleet's rule); one rule for every such route, never a streaming answer."""
    return add_stream


async def add_stream(request: web.Request) -> web.StreamResponse:
    gw = gateway_of(request)
    body = await request.read()
    try:
        spec = json.loads(body)
        stream_id = spec.get("id")
    except (ValueError, AttributeError):
        stream_id = None  # not a stream: a worker answers what is wrong with it
    if not isinstance(stream_id, str):
        return await gw.clients.forward(gw.any_worker(), request, streaming=False, body=body)
    gw.admit(spec)
    await gw.refresh_owners()
    index = gw.owners.get(stream_id)  # taken: its worker answers 409
    index = gw.placement(stream_id) if index is None else index
    response = await gw.clients.forward(index, request, streaming=False, body=body)
    if response.status == 201:
        await gw.placed(stream_id, index, body)
    return response


def by_stream(route: Route) -> Handler:
    """OWNER: the stream's worker; once more after a fresh look if that worker no longer
    has it (moved by a reload, or the worker restarted)."""
    streaming = route.streaming

    async def handler(request: web.Request) -> web.StreamResponse:
        gw = gateway_of(request)
        stream_id = request.match_info["id"]
        body = await request.read()
        index = await gw.owner(stream_id)
        response = await gw.clients.forward(index, request, streaming=streaming, body=body)
        if response.status == 404 and (await gw.owner(stream_id, refresh=True)) != index:
            index = gw.owners[stream_id]
            response = await gw.clients.forward(index, request, streaming=streaming, body=body)
        if request.method == "DELETE" and response.status == 200:
            await gw.removed(stream_id, index)
        return response

    return handler


def by_holder(route: Route) -> Handler:
    """HOLDER: what the path names lives in one worker; the others answer 404."""
    streaming = route.streaming

    async def handler(request: web.Request) -> web.StreamResponse:
        gw = gateway_of(request)
        response: web.StreamResponse | None = None
        for index in range(gw.clients.count):
            try:
                response = await gw.clients.forward(index, request, streaming=streaming)
            except MemberUnavailableError:
                continue
            if response.status != 404:
                return response
        if response is None:
            raise gw.clients.unavailable(0, f"no {gw.clients.noun} answers")
        return response

    return handler


def any_worker(route: Route) -> Handler:
    """ANY: the next live worker, in turn."""
    streaming = route.streaming

    async def handler(request: web.Request) -> web.StreamResponse:
        gw = gateway_of(request)
        return await gw.clients.forward(gw.any_worker(), request, streaming=streaming)

    return handler


async def reload(request: web.Request) -> web.Response:
    """Every worker re-reads the file; see `reload_all`."""
    checking = dry_run(request)
    status, body = await reload_all(gateway_of(request), checking)
    if status == 200:  # the gateway's own listener: its certificate files read again
        body = {**body, **tls_reloaded(request.app, checking)}
    return web.json_response(body, status=status)


async def start_window(request: web.Request) -> web.Response:
    status, body, headers = await gateway_of(request).windows.start(await request.read())
    return web.json_response(body, status=status, headers=headers)


async def get_window(request: web.Request) -> web.Response:
    return web.json_response(await gateway_of(request).windows.status(request.match_info["id"]))


async def get_window_trace(request: web.Request) -> web.Response:
    trace = await gateway_of(request).windows.trace(request.match_info["id"])
    return web.Response(body=trace, content_type="application/json")


async def regressions(request: web.Request) -> web.Response:
    clients = gateway_of(request).clients
    answers = await clients.fan_out("GET", "/v1/regressions")
    listed = {i: b for i, (s, b) in answers.items() if s == 200}
    return web.json_response(merge_regressions(listed, clients.noun))


async def audit(request: web.Request) -> web.Response:
    """Every member's audit, and the gateway's own refusals (`worker`: "gateway")."""
    gw = gateway_of(request)
    limit = limit_of(request)
    answers = await gw.clients.fan_out("GET", f"/v1/audit?limit={limit}")
    listed: dict[int | str, Any] = {i: b for i, (s, b) in answers.items() if s == 200}
    listed["gateway"] = as_json(AuditList(gw.audit.recent(limit)))
    return web.json_response(merge_audit(listed, limit, gw.clients.noun))


# The routes the gateway answers itself (MERGE, GATEWAY, PER_PROCESS), by operation id
# (the route handler's name, OpenAPI's operationId): each merge has its own rule.
OWN: dict[str, Handler] = {
    "health": health,
    "ready": ready,
    "metrics": metrics,
    "list_streams": merged_list("streams", "/v1/streams"),
    "list_models": merged_list("models", "/v1/models"),
    "list_sinks": merged_list("sinks", "/v1/sinks"),
    "reload": reload,
    "start_profiling": start_window,
    "get_profiling": get_window,
    "get_profiling_trace": get_window_trace,
    "get_regressions": regressions,
    "list_audit": audit,
    "whoami": whoami,  # the caller the gateway authenticated
    # A tune measures one process's streams: not N of them at once (501).
    "start_tune": tune_per_process,
    "get_tune": tune_per_process,
    "cancel_tune": tune_per_process,
}
# The routes forwarded as they came: one rule per kind, made for each route.
FORWARD: dict[Fanout, Callable[[Route], Handler]] = {
    Fanout.OWNER: by_stream,
    Fanout.PLACE: placed,
    Fanout.HOLDER: by_holder,
    Fanout.ANY: any_worker,
}


class GatewayPlanError(LookupError):
    """The gateway's handlers and the routes' declarations disagree: a programming
    error, found when the gateway is built (and by tests/server/test_route_fanout.py)."""


def plan(
    routes: Iterable[Route] = ROUTES,
    own: Mapping[str, Handler] = OWN,
    forwards: Mapping[Fanout, Callable[[Route], Handler]] = FORWARD,
) -> list[tuple[Route, Handler]]:
    """Each route with the gateway's handler for it, as it declares (`Route.workers`):
    a rule of `forwards` for its kind, else its own handler in `own` (a fleet passes its
    own tables). GatewayPlanError naming every route the gateway cannot answer and every
    handler in `own` that no route asks for."""
    planned: list[tuple[Route, Handler]] = []
    problems: list[str] = []
    used: set[str] = set()
    for route in routes:
        forward = forwards.get(route.workers)
        if forward is not None:
            planned.append((route, forward(route)))
        elif route.operation_id in own:
            used.add(route.operation_id)
            planned.append((route, own[route.operation_id]))
        else:
            problems.append(
                f"{route.method} {route.path} is declared {route.workers.name} but the "
                f"gateway has no handler for it: add {route.operation_id!r} to OWN ({__name__})"
            )
    problems += [f"OWN[{op!r}]: no route declared to be answered here" for op in set(own) - used]
    if problems:
        raise GatewayPlanError("\n".join(sorted(problems)))
    return planned


def build_gateway(
    gateway: Gateway, max_body: int, planned: Sequence[tuple[Route, Handler]] | None = None
) -> web.Application:
    """The app over `gateway`, behind the same error and auth middlewares as a single
    process's (server/app.py); request bodies up to `max_body` bytes; the routes as
    `planned` (default: `plan()`, the workers' tables)."""
    planned = plan() if planned is None else planned
    policy = gateway.policy.with_routes(route for route, _ in planned)
    app = web.Application(
        client_max_size=max_body,
        middlewares=[
            # The role refusals answered here: the members record what they are asked.
            audit_middleware(gateway.audit, [r for r, _ in planned], refusals_only=True),
            error_middleware,
            cross_site_middleware(gateway.cross_site),
            auth_middleware(policy),
        ],
    )
    app[GATEWAY] = gateway
    for route, handler in planned:
        app.router.add_route(route.method, route.path, handler, name=route.operation_id)
    return app
