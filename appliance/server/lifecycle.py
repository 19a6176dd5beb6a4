"""One serving process's lifecycle, shared by `appliance serve` (serve.py's `Server`) and
`appliance serve --workers N` (appliance/workers/serve.py's gateway), top to bottom as
uvicorn's server.py reads:

- `bind_policy`: an exposed bind without a token is refused before anything starts, and
  warned about when `--insecure` allows it; an exposed bind without TLS is warned about;
- `Listener`: the process's app on its one address, over TLS when given the API's TLS
  (tls.py: its files watched while it listens), its connections guarded (connections.py)
  and its requests tracked (shutdown.InFlight): listen (a ConfigError naming the address
  when it cannot), stop accepting, drain the requests in flight with a deadline, close;
- `run`: signal handlers that only set flags (SIGINT, SIGTERM: stop; SIGHUP: reload),
  then startup → main loop, a SIGHUP reloading meanwhile (one at a time: a SIGHUP during
  a reload asks for one more) → shutdown, whatever ended the loop; for `appliance serve`
  an ExitDeadline on the process once its shutdown begins.

What differs stays with each process: what it starts and stops, its main loop, how a
reload is done and logged, its log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from aiohttp import web

from appliance.config import AppConfig, ConfigError
from appliance.policy.files import FilePolicy
from appliance.server.auth import AuthPolicy, is_loopback
from appliance.server.connections import ConnectionGuard, GuardedRunner, raise_open_files_limit
from appliance.server.shutdown import ExitDeadline, InFlight
from appliance.server.tls import TLS, ApiTls

CLOSE_GRACE_S = 1.0  # aiohttp's own shutdown_timeout: only idle connections are left
LINGER_S = 0.5  # after an orderly shutdown, for idle pool threads to end on their own
# aiohttp's own default; `appliance` sets it to WARNING below DEBUG (cli/main.py), so that
# a line per request shows with `serve -v` or `--log-level DEBUG` only.
ACCESS_LOG = logging.getLogger("aiohttp.access")


class Process(Protocol):
    """What `run` drives: one serving process."""

    async def startup(self) -> None:
        """Start what serves, then listen; raise (ConfigError) to stop before serving."""

    async def main_loop(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set."""

    async def shutdown(self) -> bool:
        """Stop everything, also after a failed startup; True when it all ended cleanly."""

    async def reload_logged(self, why: str) -> None:
        """Reload the config; the outcome goes to the log only, never raised."""


def bind_policy(
    config: AppConfig,
    host: str,
    *,
    insecure: bool,
    environ: Mapping[str, str],
    log: logging.Logger,
) -> AuthPolicy:
    """The auth policy of `config`'s server for serving on `host` (AuthPolicy.for_bind:
    ConfigError for an exposed bind without a token unless `insecure`, or a token file
    that the owner's file policy cannot read); warned on `log` when it is open, and when
    an exposed bind has no TLS."""
    server, files = config.server, FilePolicy.owner(config)
    policy = AuthPolicy.for_bind(server, host, insecure=insecure, environ=environ, files=files)
    if policy.insecure:
        log.warning(
            "serving without a token on %s: anyone who can reach this port controls the appliance",
            host,
        )
    if server.tls is None and not is_loopback(host):
        log.warning(
            "serving plain HTTP on %s: tokens and answers cross the network readable by "
            "anyone on the path; set server.tls, or keep a TLS proxy in front "
            '(docs/security.md, "The API over TLS")',
            host,
        )
    return policy


class Listener:
    """`app` on one address, behind `guard`, with its requests in flight tracked (the
    innermost middleware) so that a shutdown can drain them. `access_log`: None logs no
    access lines (a `--workers` worker: its gateway logs each request once). `tls`: the
    TCP address serves TLS (its handshake held to the guard's head timeout), the app
    knows it (`tls.TLS`: /ready, the reload route) and its files are watched while it
    listens."""

    def __init__(
        self,
        app: web.Application,
        guard: ConnectionGuard,
        *,
        access_log: logging.Logger | None = ACCESS_LOG,
        tls: ApiTls | None = None,
    ) -> None:
        self.requests = InFlight()
        app.middlewares.append(self.requests.middleware())
        if tls is not None:
            app[TLS] = tls
        # The drain is InFlight's: by aiohttp's cleanup only idle connections are left.
        self._runner = GuardedRunner(
            app,
            guard,
            handle_signals=False,
            shutdown_timeout=CLOSE_GRACE_S,
            access_log=access_log,
        )
        self._guard = guard
        self._tls = tls
        self._watch: asyncio.Task[None] | None = None
        self._port = 0

    @property
    def port(self) -> int:
        """The bound TCP port (the real one when asked for port 0)."""
        for address in self._runner.addresses:
            return int(address[1])
        return self._port

    @property
    def scheme(self) -> str:
        """`https` when the TCP address serves TLS, else `http`."""
        return "http" if self._tls is None else "https"

    async def listen(self, host: str, port: int, unix: Path | None = None) -> None:
        """Listen on host:port, or on the Unix socket `unix` instead. ConfigError
        `server: cannot listen on ADDRESS: why` when the OS refuses (the CLI prints it
        and exits 1)."""
        raise_open_files_limit(self._guard.limits)
        self._port = port
        await self._runner.setup()
        site: web.BaseSite
        if unix is not None:
            site, where = web.UnixSite(self._runner, unix), f"unix:{unix}"
        elif self._tls is not None:
            handshake_s = self._guard.header_timeout_s
            site, where = (
                TlsSite(self._runner, host, port, self._tls.context, handshake_s),
                f"{host}:{port}",
            )
        else:
            site, where = web.TCPSite(self._runner, host, port), f"{host}:{port}"
        await _start(site, where)
        if self._tls is not None and unix is None:  # watched once it listens, until close
            self._watch = asyncio.create_task(self._tls.watch(), name="tls-watch")

    async def also_listen(self, unix: Path) -> None:
        """Listen on the Unix socket `unix` too, without TLS (a gateway's own workers
        reach it there: a 0700 folder only this user enters). After `listen`."""
        await _start(web.UnixSite(self._runner, unix), f"unix:{unix}")

    async def stop_accepting(self) -> None:
        """Close the listening socket; keep-alive connections close after the request
        they carry: no new requests."""
        for site in list(self._runner.sites):
            await site.stop()
        if self._runner.server is not None:
            self._runner.server.pre_shutdown()

    async def drain(self, timeout_s: float) -> list[str]:
        """The requests in flight get up to `timeout_s`; the rest are cancelled, each
        logged; their `METHOD /path (running N s)`."""
        return await self.requests.drain(timeout_s)

    async def close(self) -> None:
        """Close what is left (idle connections) and the app's cleanup."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self._runner.cleanup()


class TlsSite(web.TCPSite):
    """aiohttp's TCPSite with asyncio's TLS handshake timeout set (aiohttp passes none,
    and asyncio's default is 60 s): a connection that never completes its handshake is
    not yet the guard's (connections.py sees it once the handshake is done), so it is
    cut after `handshake_s` here, the time its request head would get."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        context: ssl.SSLContext,
        handshake_s: float,
    ) -> None:
        super().__init__(runner, host, port, ssl_context=context)
        self.handshake_s = handshake_s

    async def start(self) -> None:
        # TCPSite.start with one more argument (aiohttp 3.9 to 3.14 keep these names;
        # tests/security/test_api_tls.py fails if the handshake is no longer cut).
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            server,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            ssl_handshake_timeout=self.handshake_s,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]


async def _start(site: web.BaseSite, where: str) -> None:
    try:
        await site.start()
    except OSError as exc:  # port in use, address not ours
        why = exc.strerror or exc
        raise ConfigError([f"server: cannot listen on {where}: {why}"], "server") from exc


async def run(
    process: Process, stop: asyncio.Event, *, exit_deadline_s: float | None = None
) -> bool:
    """Run `process` until `stop` is set or SIGINT or SIGTERM arrives, SIGHUP reloading;
    True when its shutdown was clean. A failed startup is shut down too, then raised.

    `exit_deadline_s`: once shutdown begins, the process ends (os._exit) by then even if
    a thread still holds it, and LINGER_S after an orderly shutdown (ExitDeadline: only
    for the `appliance serve` process, never embedded)."""
    loop = asyncio.get_running_loop()
    reload_wanted = asyncio.Event()
    handlers = {signal.SIGINT: stop.set, signal.SIGTERM: stop.set, signal.SIGHUP: reload_wanted.set}
    for sig, flag in handlers.items():  # handlers only set flags
        loop.add_signal_handler(sig, flag)
    deadline: ExitDeadline | None = None
    try:
        await process.startup()
        reloader = asyncio.create_task(_reload_on_flag(process, reload_wanted), name="sighup")
        try:
            await process.main_loop(stop)
        finally:
            reloader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reloader
    finally:
        if exit_deadline_s is not None:
            deadline = ExitDeadline(exit_deadline_s)
        clean = await process.shutdown()
        for sig in handlers:
            loop.remove_signal_handler(sig)
    if deadline is not None:
        deadline.shorten(LINGER_S, 0 if clean else 1)
    return clean


async def _reload_on_flag(process: Process, wanted: asyncio.Event) -> None:
    while True:
        await wanted.wait()
        wanted.clear()  # a SIGHUP during the reload asks for one more
        await process.reload_logged("SIGHUP")
