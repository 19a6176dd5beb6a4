"""`appliance serve --workers N`: N worker processes (procs.py) behind one gateway
(gateway.py), top to bottom.

One Python process runs out of GIL long before a many-core machine runs out of decode
and inference: N processes, each running its share of the streams by the `--shard`
rule (appliance/runtime/sharding.py; inside this replica's shard when there is one), give each
its own interpreter. The gateway refuses an exposed bind without a token (the same rule
as a single process), starts the workers, serves the one API and watches the workers'
liveness: one that stops answering /health is killed and started again. SIGHUP reloads
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
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from appliance.config import AppConfig, ConfigError
from appliance.runtime.sharding import Shard, assign
from appliance.server.auth import AuthPolicy
from appliance.server.connections import ConnectionGuard, GuardedRunner, raise_open_files_limit
from appliance.server.serve import CLOSE_GRACE_S, EXIT_MARGIN_S
from appliance.server.shutdown import InFlight, in_own_thread
from appliance.workers.clients import WorkerClients, WorkerUnavailableError
from appliance.workers.gateway import PROBE_TIMEOUT_S, Gateway, build_gateway, reload_all
from appliance.workers.procs import WorkerSet

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
        self, index: int, socket: Path, shard: Shard | None, gateway: str | None = None
    ) -> list[str]:
        """Worker `index`'s argv; worker 0 gets the `gateway` URL for MQTT commands."""
        argv = [
            sys.executable, "-m", "appliance", "--log-level", self.log_level, "serve",
            "--config", str(self.config_path), "--worker", f"{index}/{self.count}",
            "--unix", str(socket), "--stats-interval", str(self.stats_interval_s),
        ]  # fmt: skip
        if index == 0 and gateway is not None:
            argv += ["--gateway", gateway]
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
    policy = AuthPolicy.for_bind(config.server, host, insecure=insecure, environ=os.environ)
    if policy.insecure:
        log.warning("serving without a token on %s: anyone who can reach this port "
                    "controls the appliance", host)  # fmt: skip
    socket_dir = Path(tempfile.mkdtemp(prefix="appliance-"))  # 0700: only we connect
    bound: list[str] = []  # the gateway's URL once it listens (the port may be 0 till then)

    def command(i: int) -> list[str]:
        argv = options.command(i, socket_dir / f"w{i}.sock", shard, bound[0] if bound else None)
        return [*argv, "--host", host]  # where viewers reach it: its WebRTC host candidate

    workers = WorkerSet(command, options.count, socket_dir)
    clients = WorkerClients(workers, policy.token, config.limits.request_timeout_s)
    ids = [s.id for s in (config if shard is None else shard.apply(config)).streams]
    owners = assign(ids, options.count)  # the rule each worker applies to itself
    # The public listener: slow and idle connections closed, the open ones capped, as a
    # single process's (the workers' Unix sockets behind it need no per-client cap).
    guard = ConnectionGuard(config.limits)
    gateway = Gateway(
        clients, policy, None if shard is None else str(shard), owners, connection_hits=guard.hits
    )
    app = build_gateway(gateway, config.server.max_body_bytes)
    requests = InFlight()
    app.middlewares.append(requests.middleware())
    runner = GuardedRunner(app, guard, handle_signals=False, shutdown_timeout=CLOSE_GRACE_S)
    loop, stop = asyncio.get_running_loop(), stop or asyncio.Event()
    workers.on_fatal = functools.partial(loop.call_soon_threadsafe, stop.set)
    hangup: Callable[[], None] = functools.partial(_on_hangup, gateway, set())
    handlers: dict[int, Callable[[], object]] = {
        signal.SIGINT: stop.set, signal.SIGTERM: stop.set, signal.SIGHUP: hangup,
    }  # fmt: skip
    for sig, handler in handlers.items():
        loop.add_signal_handler(sig, handler)
    await clients.open()
    watchdog: asyncio.Task[None] | None = None
    try:
        raise_open_files_limit(config.limits)  # for the gateway's connections (workers: theirs)
        # First: a port in use starts no worker.
        port = await _listen(runner, host, port)
        bound.append(gateway_url(host, port))
        workers.start()
        url = f"http://{host}:{port}"
        log.info("serving on %s with %d workers: watch the streams at %s/, the API at %s/docs",
                 url, options.count, url, url)  # fmt: skip
        watchdog = asyncio.create_task(_watch(clients), name="worker-watchdog")
        await stop.wait()
    finally:
        clean = await _shutdown(runner, requests, workers, config.server.drain_timeout_s)
        if watchdog is not None:
            watchdog.cancel()
        await clients.close()
        for sig in handlers:
            loop.remove_signal_handler(sig)
        shutil.rmtree(socket_dir, ignore_errors=True)
    if workers.fatal is not None:
        return 1
    return 0 if clean else 1


def _on_hangup(gateway: Gateway, running: set[asyncio.Task[None]]) -> None:
    """SIGHUP: the two-phase reload of every worker, as `POST /v1/config/reload`."""
    task = asyncio.get_running_loop().create_task(_hangup(gateway), name="reload")
    running.add(task)  # a reference until it ends: the loop keeps only a weak one
    task.add_done_callback(running.discard)


async def _hangup(gateway: Gateway) -> None:
    """Its outcome goes to the log only, in the words of one process's SIGHUP."""
    try:
        status, body = await reload_all(gateway)
    except WorkerUnavailableError as exc:
        log.error("config reload (SIGHUP) refused, nothing changed: %s", exc.message)
        return
    except Exception:  # a reload must never take the gateway down
        log.exception("config reload (SIGHUP) failed")
        return
    if status == 200:
        log.info("config reloaded (SIGHUP): %s", body)
        return
    error = body.get("error", {}) if isinstance(body, dict) else {}
    details = "\n  ".join(["", *error.get("details", [])])
    log.error("config reload (SIGHUP) refused, nothing changed: %s%s",
              error.get("message", body), details)  # fmt: skip


async def _listen(runner: web.AppRunner, host: str, port: int) -> int:
    """Listen on host:port; the port bound (`port` 0 picks one)."""
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:  # port in use, address not ours: the CLI prints it, exit 1
        raise ConfigError([f"server: cannot listen on {host}:{port}: {exc.strerror or exc}"],
                          "server") from exc  # fmt: skip
    return int(runner.addresses[0][1])


def gateway_url(host: str, port: int) -> str:
    """How a worker on this machine reaches the gateway bound to host:port: a wildcard
    bind is reached on loopback."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def _shutdown(
    runner: web.AppRunner, requests: InFlight, workers: WorkerSet, drain_s: float
) -> bool:
    """No new connections; every worker drains its own requests (SIGTERM) while ours,
    forwarded to them, finish; then the gateway closes."""
    log.info("shutting down %d workers: %s", len(workers.workers), requests.describe())
    for site in list(runner.sites):
        await site.stop()
    if runner.server is not None:
        runner.server.pre_shutdown()
    stopped = in_own_thread(workers.stop, drain_s + EXIT_MARGIN_S, name="stop-workers")
    await requests.drain(drain_s)
    clean = await stopped
    await runner.cleanup()
    return clean


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
