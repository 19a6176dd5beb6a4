"""The `appliance` command: run cameras through workflows, and manage a running appliance.

Exit codes: 0 success; 1 bad input (config, workflow, model) with every problem printed
to stderr, or an error answer from the API; 2 usage errors (argparse); 3 `run` finished but
a stream failed, or `trace diff --fail-over` found a regression; 4 the appliance's API
could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from appliance.cli.validate import load_whole_config
from appliance.config import AppConfig, ConfigError
from appliance.policy.masking import mask_url
from appliance.runtime.checking import BAD_INPUT
from appliance.runtime.runtime import Runtime
from appliance.runtime.sharding import ENV, Shard, shard_from_env

log = logging.getLogger("appliance")

EXIT_BAD_INPUT = 1
EXIT_STREAM_FAILED = 3


LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]
# WebRTC's libraries log each ICE check and each viewer's unresolvable mDNS candidate at
# INFO, and aiohttp's access log (appliance/server/lifecycle.py's ACCESS_LOG) every request
# (a viewer polls every few seconds): chatter at `serve`'s INFO, so only their warnings
# then; all of it at DEBUG (`serve -v`, `--log-level DEBUG`).
CHATTY_LOGGERS = ("aioice", "aiortc", "aiohttp.access")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _setup_logging(_log_level(args), getattr(args, "worker", None))
    command: Callable[[argparse.Namespace], int] = args.func
    try:
        return command(args)
    except BAD_INPUT as exc:
        print(f"error: {mask_url(str(exc))}", file=sys.stderr)
        for note in getattr(exc, "__notes__", ()):  # what to do, added where it is known
            print(f"hint: {note}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # The reader left (`appliance blocks | head`): not an error. Python would report
        # the failed flush of stdout at exit; point it at /dev/null first (the Python
        # docs' recipe, "Note on SIGPIPE").
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="appliance", description=__doc__.splitlines()[0])
    _add_global_options(p, argparse.SUPPRESS)
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(required=True, metavar="COMMAND")
    _add_commands(sub)
    _everywhere(p)
    return p


def _add_global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    """--log-level, -v and -q. Given before and after the command, the last one wins:
    defaults are SUPPRESS, so a subcommand's parser does not reset what came before."""
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=default,
        help="DEBUG, INFO, WARNING or ERROR (default: INFO for serve, else WARNING)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=default,
        help="more log lines: one level lower each time (-v: INFO, -vv: DEBUG)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", default=default, help="errors only")


def _log_level(args: argparse.Namespace) -> str:
    """--log-level if given; else `serve` narrates (INFO) and a one-shot command says only
    what went wrong (WARNING), its answer being on stdout; -q and -v move from there."""
    if getattr(args, "log_level", None):
        return str(args.log_level)
    if getattr(args, "quiet", False):
        return "ERROR"
    base = LOG_LEVELS.index("INFO" if args.func is cmd_serve else "WARNING")
    return LOG_LEVELS[max(0, base - getattr(args, "verbose", 0))]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("appliance")
    except PackageNotFoundError:  # run from a checkout that was not installed
        return "unknown"


def _everywhere(parser: argparse.ArgumentParser) -> None:
    """The global options after any command too (`appliance validate X -q`)."""
    for action in parser._actions:  # argparse has no public walk of its subcommands
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _add_global_options(child, argparse.SUPPRESS)
                _everywhere(child)


def _add_commands(sub: Any) -> None:

    serve = sub.add_parser("serve", help="run the streams and the HTTP server until stopped")
    serve.add_argument("--config", required=True, type=Path)
    serve.add_argument("--host", help="overrides server.host")
    serve.add_argument("--port", type=int, help="overrides server.port")
    serve.add_argument(
        "--stats-interval", type=float, default=5.0, help="seconds between fps lines"
    )
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback bind without an API token (trusted networks only)",
    )
    serve.add_argument(
        "--shard",
        type=_shard_arg,
        metavar="INDEX/COUNT",
        help=f"run only shard INDEX (0-based) of COUNT of the config's streams; "
        f"auto/COUNT takes INDEX from the hostname's -N; default: ${ENV}",
    )
    serve.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="overrides server.state_dir: where streams added or removed over the API are "
        "kept across restarts",
    )
    serve.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        metavar="N",
        help="run the streams in N processes (each its share, by the --shard rule) behind "
        "one API and one /metrics; default 1: this process runs them",
    )
    # Set by `--workers` on the processes it starts, not by people.
    serve.add_argument("--worker", type=_shard_arg, help=argparse.SUPPRESS)
    serve.add_argument("--unix", type=Path, help=argparse.SUPPRESS)
    serve.add_argument("--gateway", help=argparse.SUPPRESS)  # its URL: MQTT commands go there
    serve.set_defaults(func=cmd_serve)

    from appliance.cli.headless import add_run_command

    add_run_command(sub)  # run: headless, with recordings

    from appliance.cli.access import add_access_commands
    from appliance.cli.client import add_client_commands
    from appliance.cli.shadow import add_shadow_commands
    from appliance.tools.model_cli import add_model_commands
    from appliance.tools.trace_cli import add_trace_commands

    add_client_commands(sub)  # streams list|add|remove|restart, status: over the HTTP API
    add_shadow_commands(sub)  # shadow start|status|promote|rollback|stop
    add_access_commands(sub)  # whoami, audit
    add_trace_commands(sub)  # trace summarize|diff
    add_model_commands(sub)  # model bench

    from appliance.tools.doctor import add_doctor_command

    add_doctor_command(sub)  # doctor: what the machine offers

    from appliance.cli.tune import add_tune_command

    add_tune_command(sub)  # tune: the best batching and threading, on the live workload

    from appliance.cli.gateway import add_gateway_command

    add_gateway_command(sub)  # gateway: one API in front of N replicas

    blocks = sub.add_parser("blocks", help="list the block types, plugins included")
    blocks.add_argument("--json", action="store_true")
    blocks.set_defaults(func=cmd_blocks)

    from appliance.cli.validate import add_validate_command

    add_validate_command(sub)  # validate: a config or a workflow file, every problem at once


def _shard_arg(text: str) -> Shard:
    try:
        return Shard.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number, at least 1")
    return int(text)


def _setup_logging(level: str, worker: Shard | None = None) -> None:
    from appliance.policy.masking import install

    who = "" if worker is None else f"[worker {worker.index}] "  # --workers: whose line
    # Times in ISO 8601, UTC, to the millisecond (`2026-12-01T05:02:29.045Z`): the same
    # as the API's `*_at` fields, comparable across machines and time zones.
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format=f"%(asctime)s.%(msecs)03dZ %(levelname)-7s {who}%(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
    )
    for handler in logging.getLogger().handlers:
        if handler.formatter is not None:
            handler.formatter.converter = time.gmtime
    for name in CHATTY_LOGGERS:  # at WARNING and ERROR, the root's level already applies
        logging.getLogger(name).setLevel(logging.WARNING if level == "INFO" else logging.NOTSET)
    # The last guard: whatever a record carries (a URL in an FFmpeg error, a traceback,
    # an access log line's query) reaches stderr with its credentials masked.
    install(logging.getLogger().handlers)


# -- serve ------------------------------------------------------------------------------
def cmd_serve(args: argparse.Namespace) -> int:
    from appliance.server.serve import serve
    from appliance.server.shutdown import exit_now

    try:
        shard = args.shard or shard_from_env(os.environ)
    except ValueError as exc:
        raise ConfigError([str(exc)], ENV) from None
    config = load_whole_config(args.config)
    if args.state_dir is not None:  # as if written in the file: relative to the working dir
        server = config.server.model_copy(update={"state_dir": args.state_dir.resolve()})
        config = config.model_copy(update={"server": server})
    host = args.host or config.server.host
    port = args.port if args.port is not None else config.server.port
    _cache_composed_models(config)
    if args.workers > 1:
        from appliance.workers.serve import WorkerOptions, serve_workers

        options = WorkerOptions(
            args.config.resolve(), args.workers, _log_level(args), args.stats_interval
        )
        return asyncio.run(serve_workers(config, options, host, port, shard, args.insecure))
    worker: Shard | None = args.worker
    on_command, take_commands = None, True
    if worker is not None:
        from appliance.workers.commands import worker_commands

        shard = _become_worker(worker, shard)
        on_command, take_commands = worker_commands(worker.index, args.gateway, config, os.environ)
    index = None if worker is None else worker.index
    runtime = Runtime(
        config,
        config_path=args.config,
        shard=shard,
        worker=index,
        on_command=on_command,
        take_commands=take_commands,
    )
    if shard is not None:
        log.info("shard %s: streams %s", shard, [s.id for s in runtime.config.streams])
    clean = asyncio.run(
        serve(
            runtime,
            host,
            port,
            stats_interval_s=args.stats_interval,
            insecure=args.insecure,
            unix=args.unix,
        )
    )
    # Everything this process started has stopped (or been abandoned, and logged):
    # nothing is left for the interpreter's finalization to wait on (shutdown.exit_now).
    exit_now(0 if clean else 1)


def _cache_composed_models(config: AppConfig) -> None:
    """Models composed with their preprocessing (appliance/models/prologue.py) are kept
    in `<state_dir>/cache`, else in the user's cache folder ($XDG_CACHE_HOME/appliance),
    so a restart does not compose them again."""
    from appliance.models.providers import user_cache_dir
    from appliance.models.session import cache_composed_models
    from appliance.runtime.statefile import state_folder

    found = state_folder(config)
    cache_composed_models(user_cache_dir() if found is None else found[0] / "cache")


def _become_worker(worker: Shard, shard: Shard | None) -> Shard:
    """This process is worker `worker` of `serve --workers`: it dies with its supervisor,
    takes its share of the cores, and runs its share of `shard`'s (or all) streams."""
    from appliance.models.session import share_cores
    from appliance.workers.procs import die_with_parent

    die_with_parent()
    log.info("worker %s: %d intra-op thread(s) per model", worker, share_cores(worker.count))
    return Shard(worker.index, worker.count, within=shard)


# -- blocks -----------------------------------------------------------------------------
def cmd_blocks(args: argparse.Namespace) -> int:
    from pipelines.catalog import describe_blocks
    from pipelines.registry import DEFAULT_REGISTRY

    broken = DEFAULT_REGISTRY.load_plugins()
    catalog = describe_blocks(DEFAULT_REGISTRY)
    if args.json:
        print(json.dumps({"blocks": catalog, "broken_plugins": broken}, indent=2))
        return 0
    for entry in catalog:
        origin = " (plugin)" if entry["plugin"] else ""
        print(f"{entry['type']}{origin}: {entry['description']}")
        if "error" in entry:
            print(f"  error: {entry['error']}")
            continue
        ins = ", ".join(f"{k}: {v}" for k, v in entry["inputs"].items()) or "-"
        outs = ", ".join(f"{k}: {v}" for k, v in entry["outputs"].items())
        print(f"  inputs: {ins}\n  outputs: {outs}")
        for name, param in entry["parameters"].items():
            print(f"  - {name}: {param['type']}{_default_text(param)}")
    for name, problem in broken.items():
        print(f"{name} (plugin, left out): {problem}")
    return 0


def _default_text(param: dict[str, Any]) -> str:
    return " (required)" if param["required"] else f" = {param['default']!r}"


__all__ = ["AppConfig", "main"]
