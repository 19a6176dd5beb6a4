"""`appliance gateway --replicas A,B,C`: the workers' gateway (gateway.py) over HTTP to
replicas, each `appliance serve --shard I/N` (replica I is the I-th address), instead of
local worker processes. One API, one viewer and one profiling entry point for the fleet.

What differs from the workers' gateway, each a named rule:

- PLACE: a new camera goes to `owner_of(id, N)` (runtime/sharding.py: plain rendezvous,
  a function of the id alone, so a restarted gateway agrees). That replica down: 503
  naming it, never placed elsewhere. An id that runs anywhere already: its replica's 409.
- The fleet's store (fleetstore.py) keeps each camera added here; DELETE here removes it
  from every replica that lists it and from the store.
- Moves (`reconcile`, at start and every RECONCILE_EVERY_S): each stored camera whose
  owner is up and does not list it is started there; once the owner lists it, it is
  removed from any other replica that lists it as added over the API (`origin: "api"`;
  never a config camera, which each replica takes by the config's rule itself). An
  owner that is down: the camera stays where it runs. So a new replica count moves
  every camera added here to its new owner, started there before it stops elsewhere.
- Lists: every replica's, each item with its `replica`; a replica that does not answer
  contributes its last-known streams (and those of the config its shard takes) marked
  `unavailable` with the reason, never failing the list.
- /metrics: the gateway's own only (Prometheus scrapes every pod); /health: the gateway
  itself (its probe of the replicas runs); /ready: ready while every replica is.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from appliance.config import AppConfig
from appliance.errors import StateSaveError
from appliance.observe.metrics import LIMIT_HITS_HELP
from appliance.policy.masking import mask_url
from appliance.runtime.sharding import assign, owner_of
from appliance.server.auth import AuthPolicy
from appliance.server.crosssite import LOOPBACK, CrossSite
from appliance.server.routing import Fanout, Route
from appliance.workers.clients import MemberClients, MemberUnavailableError
from appliance.workers.fleetstore import FleetStore
from appliance.workers.gateway import (
    FORWARD,
    OWN,
    Gateway,
    Handler,
    build_gateway,
    by_stream,
    gateway_of,
    placed,
    plan,
)
from appliance.workers.merge import merge_lists, merge_metrics
from appliance.workers.replicas import ReplicaSet

log = logging.getLogger("appliance.fleet")

RECONCILE_EVERY_S = 5.0  # between two passes of moving cameras to their owners
UNAVAILABLE = "unavailable"  # the state of a stream whose replica does not answer
LABEL = "replica"
Rule = Callable[[Route], Handler]  # a forwarding rule: a route's handler, made for it


class Fleet(Gateway):
    """The gateway over replicas: the workers' gateway with the fleet's rules."""

    def __init__(
        self,
        clients: MemberClients,
        replicas: ReplicaSet,
        policy: AuthPolicy,
        store: FleetStore,
        config: AppConfig,
        connection_hits: Mapping[str, int] | None = None,
        cross_site: CrossSite = LOOPBACK,
    ) -> None:
        ids = [s.id for s in config.streams]
        self.config_owners = assign(ids, len(replicas.replicas))  # each replica's own rule
        super().__init__(
            clients, policy, None, self.config_owners, connection_hits, cross_site=cross_site
        )
        self.replicas = replicas
        self.store = store
        self.config_urls = {s.id: mask_url(s.source.url) for s in config.streams}
        # One change to the fleet's cameras at a time: a DELETE or POST through the
        # gateway, or one camera's move (a move must not start what a DELETE just ended).
        self.changes = asyncio.Lock()
        self.moves = 0  # cameras started on their owner by `reconcile`

    def expect_stored(self) -> None:
        """Each camera of the (loaded) store is its owner's until a replica lists it: a
        call for it while that replica is down answers its 503, not 404."""
        for stream_id in self.store.specs:
            self.owners.setdefault(stream_id, owner_of(stream_id, self.clients.count))

    # -- the rules ----------------------------------------------------------------------
    def admit(self, spec: dict[str, Any]) -> None:
        """A camera whose credentials the store could keep in clear only: 422, nowhere
        started (fleetstore.py)."""
        self.store.admit(spec)

    def placement(self, stream_id: str) -> int:
        """PLACE: the owner by the rule, whatever the loads."""
        return owner_of(stream_id, self.clients.count)

    async def placed(self, stream_id: str, index: int, body: bytes) -> None:
        """Kept in the store; a store that cannot save undoes the camera (503)."""
        await super().placed(stream_id, index, body)
        try:
            await self.store.put(stream_id, json.loads(body))
        except StateSaveError:
            await self._delete(index, stream_id)
            self.owners.pop(stream_id, None)
            raise

    async def removed(self, stream_id: str, index: int) -> None:
        """Gone from the store and from every other replica that listed it."""
        await super().removed(stream_id, index)
        await self.store.drop(stream_id)
        for replica in self.replicas.replicas:
            listed = any(s.get("id") == stream_id for s in replica.streams)
            if replica.index != index and listed:
                await self._delete(replica.index, stream_id)

    async def refresh_owners(self) -> dict[int, tuple[int, Any]]:
        """The workers' rule, and each answering replica's listing remembered."""
        answers = await super().refresh_owners()
        for index, (status, body) in answers.items():
            if status == 200:
                self.replicas.remember(index, body["streams"])
        return answers

    # -- the lists ----------------------------------------------------------------------
    def unavailable_streams(self, answered: set[int]) -> list[dict[str, Any]]:
        """The streams of the replicas not in `answered`, marked `unavailable`: what each
        listed last, the config's it takes by the rule, the cameras added here it owns;
        each once, and none that an answering replica lists."""
        seen = {s["id"] for r in self.replicas.replicas if r.index in answered for s in r.streams}
        out: list[dict[str, Any]] = []
        for replica in self.replicas.replicas:
            if replica.index in answered:
                continue
            why = self.replicas.reason(replica.index) or "it did not answer the list"
            error = self.clients.unavailable(replica.index, why).message
            known = {s["id"]: dict(s) for s in replica.streams}
            for stream_id, owner in self.config_owners.items():
                if owner == replica.index:
                    known.setdefault(stream_id, _shown(stream_id, self.config_urls[stream_id]))
            for stream_id, spec in self.store.specs.items():
                if owner_of(stream_id, self.clients.count) == replica.index:
                    known.setdefault(stream_id, _shown(stream_id, _spec_url(spec)))
            for stream_id, item in known.items():
                if stream_id not in seen:
                    seen.add(stream_id)
                    out.append(
                        {**item, "state": UNAVAILABLE, "last_error": error, LABEL: replica.index}
                    )
        return out

    # -- moves --------------------------------------------------------------------------
    async def reconcile(self) -> None:
        """One pass: every camera of the store on its owner, and only there."""
        answers = await self.refresh_owners()
        listings = {
            i: {s["id"]: s for s in body["streams"]}
            for i, (status, body) in answers.items()
            if status == 200
        }
        for stream_id in list(self.store.specs):
            async with self.changes:
                spec = self.store.specs.get(stream_id)
                if spec is not None:  # not removed meanwhile
                    await self._settle(stream_id, spec, listings)

    async def _settle(
        self, stream_id: str, spec: dict[str, Any], listings: dict[int, dict[str, Any]]
    ) -> None:
        owner = owner_of(stream_id, self.clients.count)
        if owner not in listings:
            return  # its owner is down: it stays where it runs (no flapping)
        elsewhere = sorted(i for i, ls in listings.items() if stream_id in ls and i != owner)
        if stream_id not in listings[owner]:
            if not await self._start(owner, stream_id, spec, elsewhere):
                return
            listings[owner][stream_id] = spec
        for index in elsewhere:
            if not self._ours(stream_id, listings[index][stream_id]):
                continue  # the config's own: that replica's rule decides, not ours
            if await self._delete(index, stream_id):
                log.info(
                    "camera %s moved: stopped on replica %d, runs on replica %d",
                    stream_id,
                    index,
                    owner,
                )

    async def _start(
        self, owner: int, stream_id: str, spec: dict[str, Any], elsewhere: list[int]
    ) -> bool:
        """POST the camera's spec to its owner; True once it runs there (logged)."""
        try:
            status, body = await self.clients.call(owner, "POST", "/v1/streams", spec)
        except MemberUnavailableError as exc:
            status, body = 503, {"error": {"message": exc.message}}
        if status != 201:
            why = _message(body)
            log.warning(
                "camera %s not started on replica %d (%d): %s", stream_id, owner, status, why
            )
            return False
        self.owners[stream_id] = owner
        self.moves += 1
        where = f", moving from replica {elsewhere}" if elsewhere else ""
        log.info(
            "camera %s started on replica %d, its owner by the rule%s", stream_id, owner, where
        )
        return True

    def _ours(self, stream_id: str, item: Mapping[str, Any]) -> bool:
        """Whether a replica runs this camera as added over the API (`origin: "api"`),
        not as the config's: a replica without `origin` in its answers, by the config."""
        origin = item.get("origin")
        return origin == "api" or (origin is None and stream_id not in self.config_urls)

    async def _delete(self, index: int, stream_id: str) -> bool:
        """DELETE the stream on replica `index`; True when it answered 200 (logged if not)."""
        path = f"/v1/streams/{quote(stream_id, safe='')}"
        try:
            status, body = await self.clients.call(index, "DELETE", path)
        except MemberUnavailableError as exc:
            status, body = 503, {"error": {"message": exc.message}}
        if status not in (200, 404):
            log.warning(
                "camera %s not removed from replica %d (%d): %s",
                stream_id,
                index,
                status,
                _message(body),
            )
        return status == 200


def _shown(stream_id: str, url: str) -> dict[str, Any]:
    """A stream the gateway knows of but never saw listed: its id and masked source, with
    every other field of a StreamStatus empty (clients parse it as one)."""
    return {
        "id": stream_id,
        "url": url,
        "workflow": "",
        "fps": 0.0,
        "source_fps": None,
        "frames_processed": 0,
        "frames_dropped": 0,
        "frames_failed": 0,
        "latency_ms": {"p50": None, "p99": None},
        "detections": 0,
        "reconnects": 0,
        "last_error": None,
        "providers": {},
        "outputs": [],
        "sinks": {},
        "transitions": [],
    }


def _spec_url(spec: Mapping[str, Any]) -> str:
    source = spec.get("source")
    url = source.get("url") if isinstance(source, dict) else source
    return mask_url(str(url or ""))


def _message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message"))
    return str(body)[:200]


def fleet_of(request: web.Request) -> Fleet:
    gw = gateway_of(request)
    assert isinstance(gw, Fleet), "a fleet handler on the workers' gateway"
    return gw


# -- the fleet's own handlers -----------------------------------------------------------
async def list_streams(request: web.Request) -> web.Response:
    """Every replica's streams, each with its `replica`; those of a replica that does not
    answer, `unavailable` with the reason (200 all the same)."""
    fleet = fleet_of(request)
    answers = await fleet.refresh_owners()
    listed = {i: b for i, (s, b) in answers.items() if s == 200}
    merged = merge_lists("streams", listed, LABEL)
    merged["streams"] += fleet.unavailable_streams(set(listed))
    return web.json_response(merged)


async def metrics(request: web.Request) -> web.Response:
    """The gateway's own series only: each replica's are scraped from its pod."""
    fleet = fleet_of(request)
    up = GaugeMetricFamily(
        "appliance_replica_up",
        "1 while the replica answers /health (the gateway's probe).",
        labels=["replica", "address"],
    )
    for r in fleet.replicas.replicas:
        up.add_metric([str(r.index), str(r.address)], 1.0 if r.state == "up" else 0.0)
    moves = CounterMetricFamily(
        "appliance_fleet_moves", "Cameras started on their owner replica by the gateway's moves."
    )
    moves.add_metric([], float(fleet.moves))
    hits = CounterMetricFamily("appliance_limit_hits", LIMIT_HITS_HELP, labels=["limit"])
    for limit, count in sorted(fleet.connection_hits.items()):
        hits.add_metric([limit], float(count))
    body = merge_metrics({}, [up, moves, hits])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def one_change_at_a_time(rule: Rule) -> Rule:
    """A forwarding rule whose stream changes (a PLACE, a stream's DELETE) hold
    `Fleet.changes`, so that a move never races them; reads and signalling do not."""

    def make(route: Route) -> Handler:
        inner = rule(route)
        if route.method != "DELETE" and route.workers is not Fanout.PLACE:
            return inner

        async def handler(request: web.Request) -> web.StreamResponse:
            async with fleet_of(request).changes:
                return await inner(request)

        return handler

    return make


# The workers' tables with the fleet's rules: its lists and metrics, placement by the
# rule (Fleet.placement) and changes one at a time. `plan` checks them the same way.
FLEET_OWN: dict[str, Handler] = {**OWN, "list_streams": list_streams, "metrics": metrics}
FLEET_FORWARD: dict[Fanout, Rule] = {
    **FORWARD,
    Fanout.OWNER: one_change_at_a_time(by_stream),
    Fanout.PLACE: one_change_at_a_time(placed),
}


def build_fleet(fleet: Fleet, max_body: int) -> web.Application:
    """The app over `fleet`: every route, as the fleet's tables say."""
    return build_gateway(fleet, max_body, plan(own=FLEET_OWN, forwards=FLEET_FORWARD))
