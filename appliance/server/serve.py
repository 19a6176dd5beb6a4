"""`appliance serve`: one runtime behind its HTTP app, in the process lifecycle that
`serve --workers` shares (lifecycle.py), top to bottom (uvicorn's server.py shape).

refuse an exposed bind without a token (warn when `--insecure` allows it) → startup
(runtime, then HTTP) → main loop (periodic stats lines; SIGHUP reloads the config) →
shutdown on SIGINT or SIGTERM, with a deadline: no new connections, streams stopped at
once, in-flight requests drained for `server.drain_timeout_s` and then cancelled (each
named in the log), models stopped; the process exits within the drain + EXIT_MARGIN_S.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

from appliance.config import ConfigError
from appliance.errors import ReloadError
from appliance.models.errors import ModelLoadError
from appliance.observe.status import StreamStatus
from appliance.runtime.runtime import Runtime
from appliance.server.app import build_app
from appliance.server.auth import INSECURE
from appliance.server.connections import ConnectionGuard
from appliance.server.lifecycle import ACCESS_LOG, Listener, bind_policy, run
from appliance.server.routes.tune import TUNE
from appliance.server.shutdown import in_own_thread
from appliance.server.tls import ApiTls
from appliance.server.tls import reload_logged as reload_tls_logged
from pipelines.errors import WorkflowError

log = logging.getLogger("appliance.server")

SHUTDOWN_GRACE_S = 5.0  # stream threads joined within this (or the drain), or we say which not
MODELS_GRACE_S = 1.0  # after the drain, for a model's running batch to finish
# The process exits by drain + this: models (1 s), then Python's own exit. A thread that
# still holds it then (a request's work, a session.run) is abandoned by ExitDeadline.
EXIT_MARGIN_S = 2.0
RELOAD_REFUSED = (ConfigError, WorkflowError, ModelLoadError, ReloadError)


class Server:
    """The runtime behind its HTTP app on one address (lifecycle.Process). Building it
    applies the auth rule, so a refused bind has started nothing."""

    def __init__(
        self,
        runtime: Runtime,
        host: str,
        port: int,
        *,
        insecure: bool = False,
        environ: Mapping[str, str] = os.environ,
        unix: Path | None = None,
        stats_interval_s: float = 5.0,
    ) -> None:
        self.runtime = runtime
        self.host = host
        self.unix = unix  # a Unix socket instead of host:port (a `--workers` worker's)
        self.stats_interval_s = stats_interval_s
        bind = "localhost" if unix is not None else host  # a private socket: loopback's rule
        policy = bind_policy(runtime.config, bind, insecure=insecure, environ=environ, log=log)
        self.app = build_app(runtime, policy, host)  # a worker: the gateway's host
        self.app[INSECURE] = policy.insecure
        # server.tls read now (files that do not load stop the start), and again by each
        # reload from the runtime's config as it then is. A worker's socket is private.
        self.tls = None if unix is not None else ApiTls.of(runtime.config, lambda: runtime.config)
        self.drain_timeout_s = runtime.config.server.drain_timeout_s
        self._port = port
        # Slow and idle connections are closed, and the open ones capped (connections.py).
        limit_hits = runtime.metrics.limit_hits
        guard = ConnectionGuard(
            runtime.limits,
            local=unix is not None,
            on_hit=lambda limit: limit_hits.labels(limit).inc(),
        )
        # A `--workers` worker logs no access lines: its gateway logs each request once.
        access = ACCESS_LOG if unix is None else None
        self._listener = Listener(self.app, guard, access_log=access, tls=self.tls)

    @property
    def port(self) -> int:
        """The bound port (the real one when asked for port 0)."""
        return self._listener.port or self._port

    async def startup(self) -> None:
        """Models and streams first (fail fast, nothing served), then the HTTP site."""
        await asyncio.get_running_loop().run_in_executor(None, self.runtime.start)
        await self._listener.listen(self.host, self._port, self.unix)
        if self.unix is not None:
            log.info("serving on %s", f"unix:{self.unix}")
        else:
            url = f"{self._listener.scheme}://{self.host}:{self.port}"
            log.info("serving on %s: watch the streams at %s/, the API at %s/docs", url, url, url)

    async def main_loop(self, stop: asyncio.Event) -> None:
        """Until `stop`: a line per stream every `stats_interval_s`, its rate over the time
        since the previous line (a clip that ended shows as 0 fps on the next one)."""
        previous: dict[str, tuple[StreamStatus, float]] = {}  # id -> status, monotonic s
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), self.stats_interval_s)
            except TimeoutError:
                self.runtime.sync_metrics()
                now, seen = time.monotonic(), previous
                previous = {}
                for status in self.runtime.streams_status():
                    before, at = seen.get(status.id, (None, now))
                    log.info("%s", stream_line(status, before, now - at))
                    previous[status.id] = (status, now)

    async def shutdown(self) -> bool:
        """No new connections; streams stop at once while the requests in flight get up
        to `server.drain_timeout_s`; the rest are cancelled (and logged); then models
        stop. True when every runtime thread ended."""
        began, drain = time.monotonic(), self.drain_timeout_s
        log.info(
            "shutting down: streams stop now; %s, %.1f s to finish",
            self._listener.requests.describe(),
            drain,
        )
        # The sinks drain (runtime.SINK_DRAIN_S) as soon as the streams stopped, while
        # the requests drain: not after, when only the models' second would be left.
        streams = in_own_thread(
            self._stop_streams_and_sinks, min(SHUTDOWN_GRACE_S, drain), name="stop-streams"
        )
        await self._listener.stop_accepting()
        cut = await self._listener.drain(drain)
        await self._listener.close()
        streams_ok = await streams
        stopped = await in_own_thread(self.runtime.stop, MODELS_GRACE_S, name="stop-runtime")
        cut_note = f", {len(cut)} request(s) cut short" if cut else ""
        log.info("shut down in %.1f s%s", time.monotonic() - began, cut_note)
        return streams_ok and stopped

    def _stop_streams_and_sinks(self, grace_s: float) -> bool:
        # A tune first: it puts the starting settings back while the streams still run
        # (a source setting restarts them: once they are stopped it must not).
        tune_ok = self.app[TUNE].stop(grace_s)
        streams_ok = self.runtime.stop_streams(grace_s)
        return self.runtime.stop_outputs() and streams_ok and tune_ok

    async def reload_logged(self, why: str) -> None:
        """A reload that is not a request (SIGHUP): its outcome goes to the log, and to
        the audit as the signal's (`who` is `why`, lower case: `sighup`). Taken, it reads
        server.tls's files again too."""
        audit, who = self.runtime.audit, why.lower()
        try:
            loop = asyncio.get_running_loop()
            summary = (await loop.run_in_executor(None, self.runtime.reload)).summary()
        except RELOAD_REFUSED as exc:
            log.error("config reload (%s) refused, nothing changed: %s", why, exc)
            audit.record(who, "config.reload", None, "refused", detail=str(exc))
        except Exception as exc:  # a reload must never take the server down
            log.exception("config reload (%s) failed", why)
            audit.record(who, "config.reload", None, "failed", detail=repr(exc))
        else:
            log.info("config reloaded (%s): %s", why, summary)
            reload_tls_logged(self.tls, why)
            audit.record(who, "config.reload", None, "ok")


async def serve(
    runtime: Runtime,
    host: str,
    port: int,
    *,
    stats_interval_s: float = 5.0,
    stop: asyncio.Event | None = None,
    insecure: bool = False,
    unix: Path | None = None,
) -> bool:
    """Run until `stop` is set or a signal arrives; True when shutdown was clean.

    ConfigError (before anything starts) when `host` is not loopback and there is no
    token, unless `insecure`. This is the `appliance serve` process's lifecycle: once
    shutdown begins, an ExitDeadline ends the process by drain + EXIT_MARGIN_S even if a
    thread still holds it; embed `Server` instead."""
    server = Server(
        runtime, host, port, insecure=insecure, unix=unix, stats_interval_s=stats_interval_s
    )
    deadline_s = server.drain_timeout_s + EXIT_MARGIN_S
    return await run(server, stop or asyncio.Event(), exit_deadline_s=deadline_s)


def stream_line(s: StreamStatus, before: StreamStatus | None = None, elapsed_s: float = 0.0) -> str:
    """`cam1 running: 14.0 fps over the last 5.0 s (source 15.0); since start 237 processed,
    3 dropped; age p50 41 ms`: the rate is the frames processed since `before` (the same
    stream's status at the previous line, `elapsed_s` seconds ago) over that time; without
    it (the stream's first line), the mean since the stream started. The counts are the
    stream's totals, the age the recent window's."""
    p50 = s.latency_ms.p50
    age = "-" if p50 is None else f"{p50:.0f} ms"
    source = "-" if s.source_fps is None else f"{s.source_fps}"
    if before is None or elapsed_s <= 0:
        rate = f"{s.fps} fps on average since start"
    else:
        frames = s.frames_processed - before.frames_processed
        if frames < 0:  # replaced after a stall: its count began again within the interval
            frames = s.frames_processed
        rate = f"{frames / elapsed_s:.1f} fps over the last {elapsed_s:.1f} s"
    return (
        f"{s.id} {s.state}: {rate} (source {source}); since start {s.frames_processed} "
        f"processed, {s.frames_dropped} dropped; age p50 {age}"
    )
