"""ONNX Runtime's own profiler: a profiled twin of a loaded model's session, and its
profile read back on our wall-clock timeline. Used by `model bench --profile` and by
profiling windows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnxruntime as ort

from appliance.models.session import LoadedModel, session_options
from pipelines.spec import SessionSpec


def profiling_session(
    loaded: LoadedModel, spec: SessionSpec, folder: Path, *, spin: bool = True
) -> ort.InferenceSession:
    """A second session of `loaded`'s model on the providers it obtained, with ORT's
    profiler on (ORT profiles only sessions created so), writing its file into `folder`.
    `spin=False` makes its idle threads sleep at once, for a session that sits beside a
    busy one."""
    options = session_options(spec)
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / "ort")
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # `source`, not the model file: a session composed with a preprocessing prologue
    # takes uint8 NHWC images, and the twin must take the same batches.
    return ort.InferenceSession(loaded.source, options, providers=list(loaded.info.providers))


def read_profile(session: ort.InferenceSession) -> list[dict[str, Any]]:
    """End the session's profile (once per session) and return its events with `ts` in
    wall-clock µs (ORT writes µs since its profiler started, which began at
    get_profiling_start_time_ns(), epoch time); ORT's file is deleted."""
    path, start_us = _ended(session)
    events: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    path.unlink(missing_ok=True)
    return [{**e, "ts": start_us + int(e["ts"]), "dur": int(e.get("dur", 0))} for e in events]


# What a window keeps of an operator's args: ORT adds memory and thread-pool statistics
# that make up most of its 0.5 MB per run and that the trace does not need.
OPERATOR_ARGS = ("op_name", "provider", "input_type_shape", "output_type_shape")


def read_operators(session: ort.InferenceSession) -> list[dict[str, Any]]:
    """`read_profile` for a window: only the `model_run` and operator events, with the
    args in OPERATOR_ARGS. ORT writes one event per line; parsing line by line (never
    the whole file in one `json.loads`, which holds the GIL for the whole parse: over a
    second for a few hundred runs) leaves the streams' threads their turns."""
    path, start_us = _ended(session)
    events: list[dict[str, Any]] = []
    try:
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                if '"model_run"' not in line and '_kernel_time"' not in line:
                    continue  # cheap: most lines are fences and session events
                event = json.loads(line.strip().rstrip(","))
                if not (is_operator(event) or is_model_run(event)):
                    continue
                args = event.get("args") or {}
                events.append(
                    {
                        "cat": event["cat"],
                        "name": event["name"],
                        "ts": start_us + int(event["ts"]),
                        "dur": int(event.get("dur", 0)),
                        "args": {k: args[k] for k in OPERATOR_ARGS if k in args},
                    }
                )
    finally:
        path.unlink(missing_ok=True)
    return events


def _ended(session: ort.InferenceSession) -> tuple[Path, int]:
    """End the session's profile: ORT's file, and when its clock started (epoch µs)."""
    return Path(session.end_profiling()), session.get_profiling_start_time_ns() // 1000


def is_model_run(event: dict[str, Any]) -> bool:
    """One `session.run` as ORT's profiler saw it (the `Session` event `model_run`)."""
    return event.get("cat") == "Session" and event.get("name") == "model_run"


def is_operator(event: dict[str, Any]) -> bool:
    """One operator's kernel run (ORT's `Node` events named `<node>_kernel_time`)."""
    return event.get("cat") == "Node" and str(event.get("name", "")).endswith("_kernel_time")
