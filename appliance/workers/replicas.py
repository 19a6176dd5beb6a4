"""The replicas behind `appliance gateway --replicas HOST:PORT,...`: each one's address,
its state and its last listing of streams, as the gateway's members (clients.Members).

A replica is `up` while it answers /health with 200, `down` (with the reason and since
when) once it does not: refused, timed out, or its runtime dead (503). The `replica-probe`
task asks every replica at start and every PROBE_EVERY_S after (until the first answer
a replica is `unknown`). A call to a replica whose probe timed out fails at once with a
503 naming it (`ReplicaUnavailableError`), instead of waiting out a timeout per request:
a SIGSTOPped or cut-off pod would otherwise hold every list for seconds. A replica that
refuses is still tried (a refusal costs nothing), so one that comes back is used at once,
not a probe later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from appliance.workers.clients import TIMED_OUT, MemberClients, MemberUnavailableError
from pipelines.types import iso_utc

log = logging.getLogger("appliance.fleet")

PROBE_EVERY_S = 2.0  # between two probes of every replica
PROBE_TIMEOUT_S = 3.0  # a replica slower than this to answer /health is down
CONNECTIONS_PER_REPLICA = 100  # aiohttp's default pool size, per replica


@dataclass(frozen=True, slots=True)
class Address:
    """A replica's `HOST:PORT` (an IPv6 host in brackets: `[::1]:8080`), `https://` in
    front when it serves its API over TLS (server.tls)."""

    host: str
    port: int
    https: bool = False

    def __str__(self) -> str:
        where = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        return f"https://{where}" if self.https else where

    @property
    def url(self) -> str:
        """The base URL of its API."""
        return str(self) if self.https else f"http://{self}"

    @classmethod
    def parse(cls, text: str) -> Address:
        """ValueError saying what is wrong with `text`."""
        rest = text.strip()
        https = rest.startswith("https://")
        host, sep, port = rest.removeprefix("https://").removeprefix("http://").rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            example = "10.0.0.5:8080, or https://10.0.0.5:8443 for TLS"
            raise ValueError(f"{text!r}: expected HOST:PORT (e.g. {example})")
        return cls(host, int(port), https)


def parse_replicas(text: str) -> list[Address]:
    """`HOST:PORT,HOST:PORT,...` in order (replica I is the I-th); ValueError naming
    each bad entry by its position, or a repeated address."""
    entries = [e.strip() for e in text.split(",")]
    problems, addresses = [], []
    for n, entry in enumerate(entries):
        try:
            addresses.append(Address.parse(entry))
        except ValueError as exc:
            problems.append(f"entry {n} {exc}")
    seen = [str(a) for a in addresses]
    problems += [f"{a} is listed twice" for a in sorted({a for a in seen if seen.count(a) > 1})]
    if problems:
        raise ValueError("; ".join(problems))
    return addresses


class ReplicaUnavailableError(MemberUnavailableError):
    """503: the replica that runs this (or should) is not answering."""

    def __init__(self, index: int, address: Address, why: str) -> None:
        super().__init__(f"replica {index} ({address}) is not answering: {why}")
        self.why = why


@dataclass
class Replica:
    """One replica: where it is, whether it answers, and what it last listed."""

    index: int
    address: Address
    state: str = "unknown"  # not probed yet; then `up` or `down`
    reason: str | None = None  # why it is down
    slow: bool = False  # down by a timeout: calls fail at once until a probe answers
    since: float = field(default_factory=time.time)  # wall-clock time of the last change
    streams: list[dict[str, Any]] = field(default_factory=list)  # its last listing
    listed_at: float | None = None  # wall-clock time of that listing

    def view(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "address": str(self.address),
            "state": self.state,
            "reason": self.reason,
            "since": iso_utc(self.since),
            "listed_at": None if self.listed_at is None else iso_utc(self.listed_at),
        }

    def mark(self, up: bool, reason: str | None = None) -> None:
        """Its state after a probe; a change logged (up at INFO, down at WARNING)."""
        self.slow = not up and reason == TIMED_OUT
        state = "up" if up else "down"
        if state != self.state:
            self.since = time.time()
            if up:
                log.info("replica %d (%s) is up", self.index, self.address)
            else:
                log.warning("replica %d (%s) is down: %s", self.index, self.address, reason)
        self.state, self.reason = state, None if up else reason


class ReplicaSet:
    """The fleet's replicas (clients.Members) and the task that probes them."""

    noun = "replica"
    fatal: str | None = None  # the gateway never gives up on its replicas

    def __init__(self, addresses: Sequence[Address], tls: ssl.SSLContext | None = None) -> None:
        """`tls`: how the `https://` replicas' certificates are checked (default: the
        system's CAs)."""
        self.replicas = [Replica(i, a) for i, a in enumerate(addresses)]
        self._tls = tls
        self._task: asyncio.Task[None] | None = None

    @property
    def members(self) -> Sequence[Replica]:
        return self.replicas

    @property
    def monitoring(self) -> bool:
        """True while the probe task runs."""
        return self._task is not None and not self._task.done()

    def dial(self, index: int) -> tuple[aiohttp.BaseConnector, str]:
        address = self.replicas[index].address
        checked: ssl.SSLContext | bool = True if self._tls is None else self._tls
        connector = aiohttp.TCPConnector(limit=CONNECTIONS_PER_REPLICA, ssl=checked)
        return connector, address.url

    def down(self, index: int) -> str | None:
        replica = self.replicas[index]
        return self.reason(index) if replica.slow else None

    def reason(self, index: int) -> str | None:
        """Why replica `index` is down, and since when; None unless it is."""
        replica = self.replicas[index]
        if replica.state != "down":
            return None
        return f"{replica.reason} (since {iso_utc(replica.since)})"

    def unavailable(self, index: int, why: str) -> MemberUnavailableError:
        return ReplicaUnavailableError(index, self.replicas[index].address, why)

    def remember(self, index: int, streams: list[dict[str, Any]]) -> None:
        """Replica `index` listed `streams` just now."""
        replica = self.replicas[index]
        replica.streams, replica.listed_at = streams, time.time()

    def start(self, clients: MemberClients) -> None:
        """Probe every replica at once, then every PROBE_EVERY_S, in `replica-probe`."""
        self._task = asyncio.create_task(self._probe_forever(clients), name="replica-probe")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def probe(self, clients: MemberClients) -> None:
        """/health of every replica at once; each marked up or down."""
        await asyncio.gather(*(self._probe_one(clients, r) for r in self.replicas))

    async def _probe_forever(self, clients: MemberClients) -> None:
        while True:
            try:
                await self.probe(clients)
            except Exception:  # a probe's bug must not end the probing: logged, next round
                log.exception("probing the replicas failed")
            await asyncio.sleep(PROBE_EVERY_S)

    async def _probe_one(self, clients: MemberClients, replica: Replica) -> None:
        try:
            status, body = await clients.call(
                replica.index, "GET", "/health", None, PROBE_TIMEOUT_S, even_down=True
            )
        except ReplicaUnavailableError as exc:
            replica.mark(False, exc.why)
            return
        if status == 200:
            replica.mark(True)
            return
        reason = body.get("reason") if isinstance(body, dict) else None
        replica.mark(False, f"/health answered {status}" + (f": {reason}" if reason else ""))
