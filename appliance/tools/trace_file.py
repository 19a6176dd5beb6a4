"""Read a trace file: our traces (`{"traceEvents": [...]}`, see `appliance.profiling`) and
ONNX Runtime's own profiles (a JSON array), either one optionally gzip-compressed
(recognised by its magic bytes, not its name). Durations in the files are µs.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from pathlib import Path
from typing import Any

Event = dict[str, Any]

GZIP_MAGIC = b"\x1f\x8b"


class TraceFormatError(ValueError):
    """A file that is not a trace; the message names the file and what is wrong."""


def load_events(path: Path) -> tuple[list[Event], dict[str, Any]]:
    """The events and `otherData` of a trace file; `TraceFormatError` if it is not one."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFormatError(f"{path}: not a valid gzip file: {exc}") from exc
    elif path.suffix == ".gz":
        raise TraceFormatError(f"{path}: named .gz but not gzip-compressed")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceFormatError(f"{path}: not JSON: {exc}") from exc
    except RecursionError:
        raise TraceFormatError(f"{path}: not a trace: JSON nested too deeply") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise TraceFormatError(f"{path}: not JSON: {exc}") from None
    events, other = _split(path, data)
    _check_events(path, events)
    return events, other


def event_args(event: Event) -> dict[str, Any]:
    """An event's args, {} when it has none (or something that is not an object)."""
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _split(path: Path, data: Any) -> tuple[list[Any], dict[str, Any]]:
    if isinstance(data, list):  # ONNX Runtime's profile: a bare array of events
        return data, {}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceFormatError(f"{path}: no traceEvents list (not a Chrome trace)")
    other = data.get("otherData")
    return data["traceEvents"], other if isinstance(other, dict) else {}


# Args the analysis computes with: a number where present (the appliance writes them so).
NUMERIC_ARGS = ("batch_size", "age_ms")


def _check_events(path: Path, events: list[Any]) -> None:
    for i, event in enumerate(events):
        if not isinstance(event, dict) or "ph" not in event:
            raise TraceFormatError(f"{path}: event #{i} has no ph (not a trace event)")
        # A complete event needs its dur; any other that has one, a number there too.
        timed = event["ph"] == "X" or "dur" in event
        needs = ("name", "ts", "dur") if timed else ("name", "ts")
        for field in needs if event["ph"] != "M" else ():
            value = event.get(field)
            if (field == "name" and not isinstance(value, str)) or (
                field != "name" and not _finite(value)
            ):
                raise TraceFormatError(f"{path}: event #{i} ({event.get('name')!r}) has no {field}")
        args = event_args(event)
        for key in NUMERIC_ARGS:
            if key in args and not _finite(args[key]):
                raise TraceFormatError(
                    f"{path}: event #{i} ({event.get('name')!r}): args.{key} is not a number"
                )


def _finite(value: Any) -> bool:
    """A JSON number that is neither NaN nor infinite (and not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
