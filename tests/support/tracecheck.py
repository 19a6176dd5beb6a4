"""A strict checker of the Chrome Trace Event Format rules our traces promise: closed
JSON, every event complete, integer timestamps, small integer pid/tid, metadata names,
and complete (`X`) events properly nested per thread (what Perfetto needs)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from appliance.config import AppConfig
from appliance.runtime.runtime import Runtime

PHASES = {"X", "C", "M", "s", "f", "t", "i", "B", "E"}
MAX_ID = 2**31  # Perfetto and chrome://tracing read pid/tid as 32-bit ints


def load(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())  # closed JSON or this raises
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list), path
    assert doc.get("displayTimeUnit") == "ms"
    return doc


def check(doc: dict[str, Any]) -> None:
    events = doc["traceEvents"]
    assert events, "no events"
    named_threads = set()
    for e in events:
        assert e, "empty event"
        assert e.get("ph") in PHASES, e
        assert isinstance(e.get("name"), str) and e["name"], e
        for key in ("pid", "tid"):
            assert isinstance(e.get(key), int) and 0 <= e[key] < MAX_ID, e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name"), e
            assert isinstance(e["args"]["name"], str), e
            if e["name"] == "thread_name":
                named_threads.add(e["tid"])
            continue
        assert isinstance(e.get("ts"), int), e  # never null, never a float string
        if e["ph"] == "X":
            assert isinstance(e.get("dur"), int) and e["dur"] >= 0, e
    by_thread: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            by_thread[(e["pid"], e["tid"])].append(e)
    for (_pid, tid), spans in by_thread.items():
        assert tid in named_threads, f"thread {tid} has no thread_name"
        _check_nesting(spans)


def _check_nesting(spans: list[dict[str, Any]]) -> None:
    """On one thread, two complete events are disjoint or one contains the other."""
    stack: list[tuple[int, int, str]] = []
    for e in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
        start, end = e["ts"], e["ts"] + e["dur"]
        while stack and stack[-1][1] <= start:
            stack.pop()
        if stack:
            assert end <= stack[-1][1], f"{e['name']} [{start}, {end}] overlaps {stack[-1]}"
        stack.append((start, end, e["name"]))


def run_to_rolling_trace(config: AppConfig, frames: int, timeout_s: float) -> Path:
    """Run a runtime over `frames` frames per stream to its end and stop it; the first
    rolling trace it wrote (under its config's directory)."""
    runtime = Runtime(config, max_frames=frames)
    runtime.start()
    try:
        assert runtime.wait_done(timeout=timeout_s)
    finally:
        assert runtime.stop()
    return next((config.resolve(config.profiling.dir) / "rolling").glob("trace-*.json"))
