"""`appliance gateway --replicas A,B,C`'s process, top to bottom: the same lifecycle as
`appliance serve` and `serve --workers` (appliance/server/lifecycle.py: the bind rule,
listening, signals, the drain); its own are the replicas' probe and the moves.

Startup: the fleet's store read (`--state-dir`), listen (a port in use starts nothing),
then the `replica-probe` task and the `fleet-reconcile` task (a pass at once, then every
RECONCILE_EVERY_S). SIGINT or SIGTERM: no new connections, the requests in flight drain
within `server.drain_timeout_s`, the tasks end. SIGHUP reloads every replica, as
`POST /v1/config/reload` does (each re-reads its own config file).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import ssl
from collections.abc import Sequence
from pathlib import Path

from appliance.config import AppConfig, load_config
from appliance.policy.files import FilePolicy
from appliance.server.auth import AuthPolicy
from appliance.server.connections import ConnectionGuard
from appliance.server.crosssite import CrossSite
from appliance.server.lifecycle import Listener, bind_policy, run
from appliance.server.tls import ApiTls
from appliance.workers.clients import MemberClients
from appliance.workers.fleet import RECONCILE_EVERY_S, Fleet, build_fleet
from appliance.workers.fleetstore import FleetStore
from appliance.workers.reloads import reload_logged
from appliance.workers.replicas import Address, ReplicaSet

log = logging.getLogger("appliance.fleet")


async def serve_fleet(
    config: AppConfig,
    replicas: Sequence[Address],
    host: str,
    port: int,
    state_dir: Path | None = None,
    insecure: bool = False,
    stop: asyncio.Event | None = None,
    *,
    config_path: Path | None = None,
    replica_tls: ssl.SSLContext | None = None,
) -> int:
    """Run until `stop` is set or a signal arrives: the exit status (0 clean). ConfigError
    before anything starts for an exposed bind without a token, a port in use, or TLS
    files (server.tls) that do not load. `config_path`: where `config` was read (its
    server.tls is read there again at each reload); `replica_tls`: how `https://`
    replicas' certificates are checked (default: the system's CAs)."""
    policy = bind_policy(config, host, insecure=insecure, environ=os.environ, log=log)
    stop = stop or asyncio.Event()
    process = FleetProcess(
        config,
        replicas,
        policy,
        host,
        port,
        state_dir,
        config_path=config_path,
        replica_tls=replica_tls,
    )
    clean = await run(process, stop)
    return 0 if clean else 1


class FleetProcess:
    """The gateway's process (lifecycle.Process): the replicas' clients, the fleet, its
    tasks and the one public listener."""

    def __init__(
        self,
        config: AppConfig,
        addresses: Sequence[Address],
        policy: AuthPolicy,
        host: str,
        port: int,
        state_dir: Path | None,
        *,
        config_path: Path | None = None,
        replica_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.drain_s = config.server.drain_timeout_s
        # server.tls read now, and from the file again at each reload (tls.py).
        source = functools.partial(load_config, config_path) if config_path else lambda: config
        self.tls = ApiTls.of(config, source)
        self.replicas = ReplicaSet(addresses, replica_tls)
        # Toward the replicas, the same token (one config, one Secret for the fleet).
        self.clients = MemberClients(self.replicas, policy.token, config.limits.request_timeout_s)
        self.store = FleetStore(state_dir, FilePolicy.owner(config))
        # The public listener: slow and idle connections closed, the open ones capped.
        guard = ConnectionGuard(config.limits)
        self.fleet = Fleet(
            self.clients,
            self.replicas,
            policy,
            self.store,
            config,
            connection_hits=guard.hits,
            cross_site=CrossSite.for_bind(config.server, host),
        )
        app = build_fleet(self.fleet, config.server.max_body_bytes)
        self._listener = Listener(app, guard, tls=self.tls)
        self._reconciler: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        """The store, then listen (a port in use starts nothing), then the tasks."""
        self.store.load()
        self.fleet.expect_stored()
        await self.clients.open()
        await self._listener.listen(self.host, self.port)
        self.replicas.start(self.clients)
        self._reconciler = asyncio.create_task(self._reconcile_forever(), name="fleet-reconcile")
        url = f"{self._listener.scheme}://{self.host}:{self._listener.port}"
        shown = ", ".join(f"{r.index}: {r.address}" for r in self.replicas.replicas)
        log.info(
            "gateway on %s for %d replicas (%s): the API at %s/docs",
            url,
            len(self.replicas.replicas),
            shown,
            url,
        )

    async def main_loop(self, stop: asyncio.Event) -> None:
        """The probe and the moves do the work: wait."""
        await stop.wait()

    async def shutdown(self) -> bool:
        """No new connections; the requests in flight drain; then the tasks end."""
        listener = self._listener
        log.info("gateway shutting down: %s", listener.requests.describe())
        await listener.stop_accepting()
        await listener.drain(self.drain_s)
        await listener.close()
        if self._reconciler is not None:
            self._reconciler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconciler
        await self.replicas.stop()
        await self.clients.close()
        return True

    async def reload_logged(self, why: str) -> None:
        """Every member re-reads its config (two phases, as `POST /v1/config/reload`);
        the outcome goes to the log only (appliance/workers/reloads.py)."""
        await reload_logged(self.fleet, why, log, self.tls)

    async def _reconcile_forever(self) -> None:
        """A pass at once, then every RECONCILE_EVERY_S; a pass that fails is logged and
        the next one tries again."""
        while True:
            try:
                await self.fleet.reconcile()
            except Exception:
                log.exception("moving the cameras to their owners failed; trying again")
            await asyncio.sleep(RECONCILE_EVERY_S)
