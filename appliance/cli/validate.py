"""`appliance validate`: a config or a workflow file checked as a start would check it
(models loaded, workflows compiled), every problem reported in one run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from appliance.config import AppConfig, ConfigError, load_config, parse_config, sink_configs
from appliance.policy.masking import mask_one_url, mask_url
from appliance.runtime.checking import BAD_INPUT, Problems
from appliance.runtime.runtime import Runtime
from pipelines.executor import CompiledWorkflow
from pipelines.spec import load_yaml

EXIT_BAD_INPUT = 1  # cli.EXIT_BAD_INPUT


def add_validate_command(sub: Any) -> None:
    val = sub.add_parser("validate", help="check a config or workflow file; exit 1 if invalid")
    val.add_argument("file", type=Path)
    val.add_argument("--config", type=Path, help="a config whose models a workflow may use")
    val.set_defaults(func=cmd_validate)


def cmd_validate(args: argparse.Namespace) -> int:
    """A config (models loaded, workflows compiled) or a workflow file (has `blocks`)."""
    path: Path = args.file
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: YAML's, with line and column
        print(f"error: {mask_url(f'{path}: {exc}')}", file=sys.stderr)
        return EXIT_BAD_INPUT
    config = load_whole_config(args.config) if args.config else None
    if isinstance(data, dict) and "blocks" in data:
        return _validate_workflow(path, config)
    config = config or load_whole_config(path)
    runtime = Runtime(config, config_path=path)
    try:
        prepared = runtime.prepare()  # loads models and compiles workflows: the full check
    finally:
        runtime.stop(2.0)
    print(
        f"{path}: valid config: {len(runtime.models_status())} model(s), {len(prepared)} "
        f"stream(s), {len(config.sinks)} sink(s)"
    )
    for cfg, workflow in prepared:
        print(f"  {cfg.id}: {workflow.summary()}")
    for line in sink_lines(config):
        print(line)
    return 0


def sink_lines(config: AppConfig) -> list[str]:
    """`  sink events (mqtt): broker 127.0.0.1:1883, topics appliance/; streams: cam1`: each
    declared sink, where it sends (a URL masked: it may carry credentials) and the streams
    whose outputs name it. The sinks are valid here (the config loaded)."""
    users: dict[str, list[str]] = {name: [] for name in config.sinks}
    for stream in config.streams:
        for output in stream.outputs:
            users.setdefault(output.sink, []).append(stream.id)
    lines = []
    for name, cfg in sink_configs(config).items():
        kind = getattr(cfg, "type", "?")
        streams = ", ".join(dict.fromkeys(users[name])) or "none (no stream's outputs name it)"
        lines.append(f"  sink {name} ({kind}): {_target(cfg)}; streams: {streams}")
    return lines


def _target(cfg: BaseModel) -> str:
    """Where a sink sends: its URL (masked), or its broker's host and port and topics."""
    url = getattr(cfg, "url", None)
    if isinstance(url, str):
        return mask_one_url(url)
    host, port = getattr(cfg, "host", None), getattr(cfg, "port", None)
    if host is None:
        return "-"
    tls = " (TLS)" if getattr(cfg, "tls", None) is not None else ""
    prefix = getattr(cfg, "topic_prefix", None)
    topics = f", topics {prefix}/" if prefix else ""
    return f"broker {host}:{port}{tls}{topics}"


def _validate_workflow(path: Path, config: AppConfig | None) -> int:
    """Compile a workflow file with its own models (and a config's, with --config)."""
    try:
        return _compile_workflow(path, config)
    except BAD_INPUT as exc:
        if config is None and "unknown model" in str(exc):
            exc.add_note(
                "a model the config declares (models:) is known with it: "
                f"appliance validate {path} --config CONFIG"
            )
        raise


def _compile_workflow(path: Path, config: AppConfig | None) -> int:
    config = config or parse_config({}, path.resolve().parent)
    runtime = Runtime(config)
    problems = Problems(str(path))
    compiled: list[CompiledWorkflow] = []
    try:
        failed = runtime.load_models(problems)
        with problems.check():
            compiled.append(runtime.compile_workflow(path.resolve(), "", unavailable=failed))
        problems.raise_any()  # the config's models too: valid means all of it loads
    finally:
        runtime.stop(2.0)
    print(f"{path}: valid: {compiled[0].summary()}")
    return 0


def load_whole_config(path: Path) -> AppConfig:
    """load_config, and when the config is invalid, the models and workflows of what is
    valid in it are checked too: every problem is reported in one run, not one kind a
    run (`ConfigError.partial`)."""
    try:
        return load_config(path)
    except ConfigError as exc:
        if exc.partial is None:
            raise
        problems = Problems(exc.source)
        problems.add(exc)
        # Without sinks: theirs are among the problems, and nothing here sends.
        runtime = Runtime(exc.partial.model_copy(update={"sinks": {}}), config_path=path)
        try:
            runtime.prepare(problems)
        finally:
            runtime.stop(2.0)
        raise AssertionError("unreachable: prepare raises the config's problems") from None
