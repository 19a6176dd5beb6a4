"""`appliance gateway --replicas HOST:PORT,...`: one API, one viewer and one profiling
entry point in front of replicas that each run `appliance serve --shard I/N`
(appliance/workers/fleet.py)."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import Any

from appliance.client_transport import CaFileError, tls_context
from appliance.config import AppConfig, ConfigError, load_config, parse_config
from appliance.workers.replicas import Address, parse_replicas


def add_gateway_command(sub: Any) -> None:
    """Register `gateway` on the `appliance` parser's subparsers."""
    p = sub.add_parser(
        "gateway",
        help="one API and viewer in front of N replicas (each `serve --shard I/N`)",
        description="Serve the appliance's API and viewer for a fleet of replicas: lists "
        "merged, each stream's routes sent to the replica that runs it, new cameras placed "
        "on their owner by the rendezvous rule and moved when the replica count changes.",
    )
    p.add_argument(
        "--replicas",
        required=True,
        type=_replicas_arg,
        metavar="HOST:PORT,...",
        help="the replicas' API addresses in shard order: replica I runs --shard I/N, N "
        "being how many are listed; https://HOST:PORT for a replica served over TLS",
    )
    p.add_argument(
        "--replica-ca",
        type=Path,
        metavar="PEM",
        help="check the https:// replicas' certificates against this CA (default: the "
        "system's CAs)",
    )
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="the replicas' config: its server settings (token, probes, body size, drain), "
        "limits, and its streams (named as unavailable before a replica was ever reached)",
    )
    p.add_argument("--host", help="overrides server.host (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="overrides server.port (default 8080)")
    p.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="where the cameras added through the gateway are kept (fleet.json), so that "
        "they move with the rule after a restart; default: in memory only",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback bind without an API token (trusted networks only)",
    )
    p.set_defaults(func=cmd_gateway)


def cmd_gateway(args: argparse.Namespace) -> int:
    from appliance.workers.fleetserve import serve_fleet

    if not any(getattr(args, k, None) for k in ("log_level", "verbose", "quiet")):
        # A server narrates, as `serve` does (INFO): its moves and replicas' states.
        logging.getLogger().setLevel(logging.INFO)
    config = _config(args.config)
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    state_dir = None if args.state_dir is None else args.state_dir.resolve()
    replicas: list[Address] = args.replicas
    try:
        replica_tls = None if args.replica_ca is None else tls_context(args.replica_ca)
    except CaFileError as exc:
        raise ConfigError([f"--replica-ca: {exc}"], "gateway") from None
    fleet = serve_fleet(
        config,
        replicas,
        host,
        port,
        state_dir,
        args.insecure,
        config_path=args.config,
        replica_tls=replica_tls,
    )
    return asyncio.run(fleet)


def _config(path: Path | None) -> AppConfig:
    """The config file (ConfigError naming every problem), or the defaults without one."""
    return parse_config({}, Path.cwd()) if path is None else load_config(path)


def _replicas_arg(text: str) -> list[Address]:
    try:
        return parse_replicas(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
