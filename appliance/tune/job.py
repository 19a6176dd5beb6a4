"""A tune on a running appliance (POST /v1/tune): one at a time, on a thread of its own
named "tune", followed while it runs (GET /v1/tune) and cancelled on request or at
shutdown. `target.tune()` puts the starting settings back whatever ends it; the job
only starts it, keeps its latest progress and its result, and says how it ended.

A request is checked before anything changes: every knob it names must be one of the
search space of the workload that runs now (a model that is not running is named), and
every value one its setting takes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ValidationError

from appliance.models.tuned import ModelTuning
from appliance.sources.config import SourceTuning
from appliance.tune.objective import Kind
from appliance.tune.results import progress_json, result_json
from appliance.tune.search import Outcome, Progress
from appliance.tune.space import SOURCES, Hardware, Knob, parse_knob
from appliance.tune.target import search_space, tune
from pipelines.types import iso_utc

if TYPE_CHECKING:
    from appliance.runtime.runtime import Runtime

log = logging.getLogger("appliance.tune")

State = Literal["idle", "running", "done", "interrupted", "failed", "cancelled"]
Only = dict[str, tuple[Any, ...] | None]
CANCELLING = "cancelling: the tune stops now and the starting settings are being restored"


class TuneConflictError(Exception):
    """The request conflicts with what runs: a tune already running (named in
    `details`), none to cancel, no stream to tune, or the appliance shutting down."""

    def __init__(self, message: str, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.details = list(details)


class TuneRequestError(ValueError):
    """Knobs the running workload does not have, or values their settings refuse: every
    problem as `knobs.<name>: message`."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("invalid tune request")
        self.problems = list(problems)


@dataclass(frozen=True)
class TuneParams:
    """What to tune and how: `tune()`'s arguments, as a request gives them (validated
    for range by the API's TuneRequest; knobs by `check_knobs`)."""

    objective: Kind = "fps"
    slo_ms: float | None = None
    budget_s: float = 600.0
    window_s: float = 5.0
    settle_s: float = 2.0
    knobs: Mapping[str, Sequence[Any] | None] | None = None
    apply: bool = False
    by: str = "anonymous"  # who asked: the audit records a kept winner as theirs

    def as_json(self) -> dict[str, Any]:
        knobs = (
            None
            if self.knobs is None
            else {
                name: None if values is None else list(values)
                for name, values in self.knobs.items()
            }
        )
        return {
            "objective": self.objective,
            "slo_ms": self.slo_ms,
            "budget_s": self.budget_s,
            "window_s": self.window_s,
            "settle_s": self.settle_s,
            "knobs": knobs,
            "apply": self.apply,
        }


class _Run:
    """One tune: its request, its stop flag and what it reported; read under its lock."""

    def __init__(self, params: TuneParams, only: Only | None) -> None:
        self.params, self.only = params, only
        self.stop = threading.Event()
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.state: State = "running"
        self.ended_by: State | None = None  # "cancelled" or "interrupted", once asked
        self.progress: dict[str, Any] | None = None
        self.result: dict[str, Any] | None = None
        self.error: str | None = None
        self.thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def on_progress(self, progress: Progress) -> None:
        shown = progress_json(progress)
        with self._lock:
            self.progress = shown

    def end_by(self, why: State) -> None:
        with self._lock:
            self.ended_by = self.ended_by or why
        self.stop.set()

    def finish(
        self, outcome: Outcome | None, result: dict[str, Any] | None, error: str | None
    ) -> None:
        with self._lock:
            self.state = _state(outcome, self.ended_by)
            self.result, self.error, self.ended_at = result, error, time.time()

    def snapshot(self, note: str | None = None) -> dict[str, Any]:
        with self._lock:
            return {
                "state": self.state,
                "request": self.params.as_json(),
                "started_at": iso_utc(self.started_at),
                "ended_at": None if self.ended_at is None else iso_utc(self.ended_at),
                "progress": self.progress,
                "result": self.result,
                "error": self.error,
                "note": note,
            }

    def describe(self) -> str:
        with self._lock:
            current = self.progress["current"] if self.progress else "starting"
        return f"the tune started at {iso_utc(self.started_at)} (measuring: {current})"


def _state(outcome: Outcome | None, ended_by: State | None) -> State:
    """How a run ended: the search's outcome (None: tune() raised), or why it was stopped."""
    if outcome in ("done", "budget"):
        return "done"
    if outcome == "interrupted":
        return ended_by or "interrupted"
    return "failed"


IDLE: dict[str, Any] = {
    "state": "idle",
    "request": None,
    "started_at": None,
    "ended_at": None,
    "progress": None,
    "result": None,
    "error": None,
    "note": None,
}


class TuneJob:
    """The runtime's one tune at a time, and the last one's outcome."""

    def __init__(self, rt: Runtime, hardware: Callable[[], Hardware] = Hardware.here) -> None:
        self.rt = rt
        self._find_hardware = hardware
        self._hardware: Hardware | None = None  # found once: it loads ONNX Runtime
        self._lock = threading.Lock()
        self._run: _Run | None = None
        self._closed = False

    def start(self, params: TuneParams) -> dict[str, Any]:
        """Check the request against the running workload and start the tune on its own
        thread; its first status. TuneConflictError while one runs, TuneRequestError for
        knobs the workload does not have."""
        self._check_free()
        if self._hardware is None:
            self._hardware = self._find_hardware()
        only = check_knobs(self.rt, params.knobs, self._hardware)
        with self._lock:
            self._check_free()  # again: another request may have started one meanwhile
            run = self._run = _Run(params, only)
            run.thread = threading.Thread(
                target=self._work, args=(run, self._hardware), name="tune", daemon=True
            )
            run.thread.start()
        return run.snapshot()

    def status(self) -> dict[str, Any]:
        """The running tune's state and latest progress, or the last one's outcome and
        result; `idle` before the first."""
        run = self._run
        return dict(IDLE) if run is None else run.snapshot()

    def cancel(self) -> dict[str, Any]:
        """Stop the running tune; it puts the starting settings back, then ends
        `cancelled`. TuneConflictError when none runs."""
        run = self._run
        if run is None or run.state != "running":
            state = "idle" if run is None else run.state
            raise TuneConflictError("no tune is running", [f"state: {state}"])
        run.end_by("cancelled")
        return run.snapshot(CANCELLING)

    def stop(self, timeout: float) -> bool:
        """Shutdown: no tune starts from now; a running one is interrupted (it restores
        the starting settings) and waited for up to `timeout` s. True when none runs."""
        with self._lock:
            self._closed = True
            run = self._run
        if run is None or run.thread is None:
            return True
        run.end_by("interrupted")
        run.thread.join(timeout)
        if run.thread.is_alive():
            log.warning("the tune did not end within %.1f s of the shutdown", timeout)
        return not run.thread.is_alive()

    def _check_free(self) -> None:
        if self._closed:
            raise TuneConflictError("the appliance is shutting down")
        run = self._run
        if run is not None and run.state == "running":
            raise TuneConflictError("a tune is already running", [run.describe()])
        if not self.rt.streams:
            raise TuneConflictError("no stream runs: there is nothing to tune")

    def _work(self, run: _Run, hardware: Hardware) -> None:
        p = run.params
        try:
            result = tune(
                self.rt,
                objective=p.objective,
                slo_ms=p.slo_ms,
                budget_s=p.budget_s,
                window_s=p.window_s,
                settle_s=p.settle_s,
                only=run.only,
                apply=p.apply,
                stop=run.stop,
                on_progress=run.on_progress,
                hardware=hardware,
            )
        except Exception as exc:  # the settings are back (tune's finally); say why it ended
            log.exception("tune failed")
            run.finish(None, None, f"{type(exc).__name__}: {exc}")
            return
        run.finish(result.outcome, result_json(result), result.problem)
        log.info("tune ended %s: %s", run.state, result.changed or "nothing changed")
        if p.apply:  # the winner kept: a change of what runs (target.tune's rule)
            kept = result.outcome in ("done", "budget") and result.changed
            note = f"kept {kept}" if kept else f"nothing kept (the tune ended {run.state})"
            self.rt.audit.record(p.by, "tune.apply", None, "ok", detail=note)


def check_knobs(
    rt: Runtime, knobs: Mapping[str, Sequence[Any] | None] | None, hardware: Hardware
) -> Only | None:
    """`knobs` as `tune()`'s `only` (values as their settings take them), or
    TuneRequestError naming each knob the running workload does not have."""
    if knobs is None:
        return None
    problems = [p for name in knobs if (p := _name_problem(name))]
    if problems:
        raise TuneRequestError(problems)
    space = search_space(rt, hardware, {name: None for name in knobs})
    running = sorted({m for s in list(rt.streams.values()) for m in s.workflow.models})
    only: Only = {}
    for name, values in knobs.items():
        matched = [k for k in space if name in (k.key, k.name)]
        if not matched:
            problems.append(_unmatched(name, running))
            continue
        checked = _values(name, matched[0], values, problems)
        only[name] = checked
    if problems:
        raise TuneRequestError(problems)
    return only


def _name_problem(name: str) -> str | None:
    """parse_knob's rule for a name: a setting it knows, alone or after a model id."""
    try:
        parsed, values = parse_knob(name, where=f"knobs.{name}")
    except ValueError as exc:
        return str(exc)
    if values is not None or parsed != name:
        return f"knobs.{name}: a knob's values go in its list, not in its name"
    return None


def _unmatched(name: str, running: list[str]) -> str:
    scope = name.rsplit(".", 1)[0] if "." in name else None
    if scope is not None and scope != SOURCES and scope not in running:
        return f"knobs.{name}: model {scope!r} is not running (running: {', '.join(running)})"
    return (
        f"knobs.{name}: not in this workload's search space (a source setting on a "
        "model, or a setting with one possible value here: threads on a GPU, the "
        "reader with no RTSP camera, a batch size the model's input fixes)"
    )


def _values(
    name: str, knob: Knob, values: Sequence[Any] | None, problems: list[str]
) -> tuple[Any, ...] | None:
    """The values as the knob's setting takes them (strictly, as JSON gives them)."""
    if values is None:
        return None
    shape: type[BaseModel] = SourceTuning if knob.scope == SOURCES else ModelTuning
    checked = []
    for i, value in enumerate(values):
        try:
            setting = shape.model_validate({knob.name: value}, strict=True)
        except ValidationError as exc:
            problems.append(f"knobs.{name}.{i}: {value!r}: {exc.errors()[0]['msg']}")
            continue
        checked.append(getattr(setting, knob.name))
    return tuple(checked)
