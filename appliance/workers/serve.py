"""`appliance serve --workers N`: N worker processes (procs.py) behind one gateway
(gateway.py), top to bottom.

One Python process runs out of GIL long before a many-core machine runs out of decode
and inference: N processes, each running its share of the streams by the `--shard`
rule (appliance/runtime/sharding.py; inside this replica's shard when there is one), give each
its own interpreter. The gateway runs the same process lifecycle as a single process
(appliance/server/lifecycle.py: the bind rule, listening, signals, the drain); its own
are the workers: it starts them once it listens, serves the one API and watches their
liveness (one that stops answering /health is killed and started again). SIGHUP reloads
every worker; SIGINT or SIGTERM stop the gateway taking requests and every worker
draining, within `server.drain_timeout_s` + a margin.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from appliance.config import AppConfig, load_config
from appliance.runtime.sharding import Shard, assign
from appliance.server.auth import AuthPolicy
from appliance.server.connections import ConnectionGuard
from appliance.server.crosssite import CrossSite
from appliance.server.lifecycle import Listener, bind_policy, run
from appliance.server.serve import EXIT_MARGIN_S
from appliance.server.shutdown import in_own_thread
from appliance.server.tls import ApiTls
from appliance.workers.clients import WorkerClients, WorkerUnavailableError
from appliance.workers.gateway import PROBE_TIMEOUT_S, Gateway, build_gateway
from appliance.workers.procs import WorkerSet
from appliance.workers.reloads import reload_logged

log = logging.getLogger("appliance.workers")

WATCH_S = 5.0  # between liveness checks of each worker
MISSES = 3  # liveness checks failed in a row before a worker is killed (and restarted)


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How to start each worker: the config file, how many, and the CLI's own options."""

    config_path: Path
    count: int
    log_level: str = "INFO"
    stats_interval_s: float = 5.0

    def command(
        self,
        index: int,
        socket: Path,
        shard: Shard | None,
        gateway: str | None = None,
        state_dir: Path | None = None,
    ) -> list[str]:
        """Worker `index`'s argv; worker 0 gets the `gateway` (`unix:PATH`, the gateway's
        own socket) for MQTT commands. Each gets `state_dir` (absolute): it re-reads the
        file, which may not name the folder a `--state-dir` gave the gateway."""
        # Kept as written (fmt: skip): each option beside its value, as on a command line.
        argv = [
            sys.executable, "-m", "appliance", "--log-level", self.log_level, "serve",
            "--config", str(self.config_path), "--worker", f"{index}/{self.count}",
            "--unix", str(socket), "--stats-interval", str(self.stats_interval_s),
        ]  # fmt: skip
        if index == 0 and gateway is not None:
            argv += ["--gateway", gateway]
        if state_dir is not None:
            argv += ["--state-dir", str(state_dir)]
        return argv if shard is None else [*argv, "--shard", str(shard)]


async def serve_workers(
    config: AppConfig,
    options: WorkerOptions,
    host: str,
    port: int,
    shard: Shard | None = None,
    insecure: bool = False,
    stop: asyncio.Event | None = None,
) -> int:
    """Run until `stop` is set or a signal arrives: the process's exit status (0 clean,
    1 a worker could not start or did not stop cleanly). ConfigError before anything
    starts for an exposed bind without a token."""
    policy = bind_policy(config, host, insecure=insecure, environ=os.environ, log=log)
    stop = stop or asyncio.Event()
    clean = await run(Supervisor(config, options, policy, host, port, shard, stop), stop)
    return 0 if clean else 1


class Supervisor:
    """The gateway's process (lifecycle.Process): the workers, their clients, the
    watchdog and the one public listener."""

    def __init__(
        self,
        config: AppConfig,
        options: WorkerOptions,
        policy: AuthPolicy,
        host: str,
        port: int,
        shard: Shard | None,
        stop: asyncio.Event,
    ) -> None:
        self.host, self.port = host, port
        self.drain_s = config.server.drain_timeout_s
        self.count = options.count
        self._stop = stop
        # server.tls read now (files that do not load start nothing), and again from the
        # file at each reload, as the workers read it.
        self.tls = ApiTls.of(config, functools.partial(load_config, options.config_path))
        self._socket_dir = Path(tempfile.mkdtemp(prefix="appliance-"))  # 0700: only we connect
        self._bound: str | None = None  # the gateway's own socket once it listens

        named = config.server.state_dir
        state_dir = None if named is None else config.resolve(named)

        def command(i: int) -> list[str]:
            socket = self._socket_dir / f"w{i}.sock"
            argv = options.command(i, socket, shard, self._bound, state_dir)
            return [*argv, "--host", host]  # where viewers reach it: its WebRTC host candidate

        self.workers = WorkerSet(command, options.count, self._socket_dir)
        self.clients = WorkerClients(self.workers, policy.token, config.limits.request_timeout_s)
        ids = [s.id for s in (config if shard is None else shard.apply(config)).streams]
        owners = assign(ids, options.count)  # the rule each worker applies to itself
        # The public listener: slow and idle connections closed, the open ones capped, as
        # a single process's (the workers' Unix sockets behind it need no per-client cap).
        guard = ConnectionGuard(config.limits)
        shard_name = None if shard is None else str(shard)
        cross_site = CrossSite.for_bind(config.server, host)
        self.gateway = Gateway(
            self.clients, policy, shard_name, owners, guard.hits, cross_site=cross_site
        )
        app = build_gateway(self.gateway, config.server.max_body_bytes)
        self._listener = Listener(app, guard, tls=self.tls)
        self._watchdog: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        """Listen first (a port in use starts no worker), then the workers."""
        await self.clients.open()
        await self._listener.listen(self.host, self.port)
        port = self._listener.port
        # Worker 0's MQTT commands come back on a socket of our private folder: never
        # over the network, nor through the public port's TLS.
        own = self._socket_dir / "gateway.sock"
        await self._listener.also_listen(own)
        self._bound = f"unix:{own}"
        self.workers.on_fatal = functools.partial(
            asyncio.get_running_loop().call_soon_threadsafe, self._stop.set
        )
        self.workers.start()
        url = f"{self._listener.scheme}://{self.host}:{port}"
        log.info(
            "serving on %s with %d workers: watch the streams at %s/, the API at %s/docs",
            url,
            self.count,
            url,
            url,
        )
        self._watchdog = asyncio.create_task(_watch(self.clients), name="worker-watchdog")

    async def main_loop(self, stop: asyncio.Event) -> None:
        """The workers' monitor and the watchdog do the work: wait."""
        await stop.wait()

    async def shutdown(self) -> bool:
        """No new connections; every worker drains its own requests (SIGTERM) while ours,
        forwarded to them, finish; then the gateway closes. True when every worker
        started and stopped cleanly."""
        listener = self._listener
        count = len(self.workers.workers)
        log.info("shutting down %d workers: %s", count, listener.requests.describe())
        await listener.stop_accepting()
        stopped = in_own_thread(
            self.workers.stop, self.drain_s + EXIT_MARGIN_S, name="stop-workers"
        )
        await listener.drain(self.drain_s)
        clean = await stopped
        await listener.close()
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        await self.clients.close()
        shutil.rmtree(self._socket_dir, ignore_errors=True)
        return clean and self.workers.fatal is None

    async def reload_logged(self, why: str) -> None:
        """Every member re-reads its config (two phases, as `POST /v1/config/reload`);
        the outcome goes to the log only (appliance/workers/reloads.py)."""
        await reload_logged(self.gateway, why, log, self.tls)


async def _watch(clients: WorkerClients) -> None:
    """Kill a worker whose /health fails MISSES times in a row (wedged, not dead: the
    monitor restarts the dead ones); the monitor then starts it again."""
    misses = [0] * clients.count
    while True:
        await asyncio.sleep(WATCH_S)
        for worker in clients.workers.workers:
            if worker.state != "up":
                misses[worker.index] = 0
                continue
            with contextlib.suppress(WorkerUnavailableError):
                status, _ = await clients.call(
                    worker.index, "GET", "/health", None, PROBE_TIMEOUT_S
                )
                if status == 200:
                    misses[worker.index] = 0
                    continue
            misses[worker.index] += 1
            if misses[worker.index] >= MISSES:
                misses[worker.index] = 0
                clients.workers.kill(worker.index, f"/health failed {MISSES} times in a row")
