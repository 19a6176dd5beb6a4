"""A shadow: a candidate workflow run on a stream's own frames beside its live workflow.

The live worker offers each frame it takes to the shadow (every Nth, or at most F a
second) by putting it in the shadow's own one-frame slot: an offer costs a pointer swap,
so the live workflow never waits for the candidate, and a frame the shadow has no time
for is replaced by the next offer (counted as skipped), never queued. The shadow's
worker thread (`shadow:<stream>`) runs the candidate, compiled once, on the frames it
takes; its results go to the comparison only, never to the stream's sinks, metrics or
trace. The live and the candidate result of one frame are paired by the frame's sequence
number (appliance/runtime/comparison.py): whichever comes second completes the pair, and
the shadow's worker compares it (the live worker only hands its result over).

Frames are shared read-only: no block writes into its input image (they draw and blur on
copies), so neither workflow sees the other's work.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from appliance.policy.masking import mask_url
from appliance.runtime.budget import Budget
from appliance.runtime.comparison import DEFAULT_IOU, Comparison
from appliance.runtime.promotion import PromoteRequest
from appliance.runtime.shadowframe import ComparedFrame
from appliance.sources.slot import LatestFrame
from pipelines.executor import CompiledWorkflow, CpuClock, WorkflowRun
from pipelines.types import Frame, FrameResult

log = logging.getLogger("appliance.shadow")

GET_TIMEOUT_S = 0.25  # how often an idle shadow worker re-checks its stop flag
PENDING = 64  # frames waiting for their other half: older ones are dropped unpaired


class ShadowSpec(BaseModel):
    """A shadow as a request (or the config) declares it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # A workflow file (relative to the config file, under the API's file roots) or an
    # inline workflow, checked and compiled like a stream's.
    workflow: Path | dict[str, Any]
    # Sampling: every Nth frame the live workflow takes, and/or at most F a second.
    every: Annotated[int, Field(ge=1, le=10_000)] = 1
    max_fps: Annotated[float, Field(gt=0, le=1_000)] | None = None
    # Detections match when their IoU reaches this (comparison.py).
    iou: Annotated[float, Field(gt=0, le=1)] = DEFAULT_IOU
    # What it may cost the live streams' processed fps (appliance/runtime/budget.py);
    # 1: no budget.
    max_live_cost: Annotated[float, Field(gt=0, le=1)] = 0.05
    # Send each candidate result to the stream's MQTT outputs on `<prefix>/<stream>/shadow`
    # (never on its predictions, nor to any other sink).
    publish: bool = False
    # The gates (and rollback_s) a promotion is judged by unless its request says
    # otherwise: a config's shadow carries its own bar.
    promote: PromoteRequest | None = None

    @model_validator(mode="after")
    def _workflow_named(self) -> ShadowSpec:
        if isinstance(self.workflow, Path) and not str(self.workflow).strip():
            raise ValueError("workflow: a file name or an inline workflow is required")
        return self


class Shadow:
    """One stream's shadow; `start` once, `stop` once."""

    def __init__(
        self,
        stream_id: str,
        spec: ShadowSpec,
        workflow: CompiledWorkflow,
        live_frames: Callable[[], int],
        on_stopped: Callable[[Shadow], None] | None = None,
        cpu_clock: CpuClock | None = None,
        live_ages: Callable[[], float] = lambda: 0.0,
    ) -> None:
        # What it may cost the live streams, measured by their processed frames.
        self.budget = Budget(live_frames, spec.max_live_cost, spec.every, live_ages=live_ages)
        # As the stream reads its blocks' CPU: a promoted candidate goes on with it.
        self._cpu_clock = cpu_clock
        self.stream_id = stream_id
        self._on_stopped = on_stopped  # once, after the worker ended: the lease goes
        self.spec = spec
        self.workflow = workflow
        self.started = time.time()
        self.stopped: float | None = None
        # Removes the stream's hook that stops this shadow with it (set by its owner).
        self.unhook: Callable[[], None] = lambda: None
        self.workflow_run: WorkflowRun | None = None  # the shadow thread's, once started
        # Each candidate result, on the shadow's thread (set by its owner): its per-block
        # latency histograms (variant="shadow"), and the MQTT topic when it `publish`es.
        self.observe: Callable[[FrameResult], None] = lambda _result: None
        self.comparison = Comparison(iou=spec.iou)
        self._compared: ComparedFrame | None = None  # the newest pair, for the web viewer
        self.offered = 0  # frames sampled and put in the slot
        self.ran = 0  # frames the candidate ran
        self.failed = 0  # frames the candidate failed on
        self.last_error: str | None = None
        self._slot = LatestFrame()
        self._seen = 0  # live frames offered so far (every Nth)
        self._min_gap = 0.0 if spec.max_fps is None else 1.0 / spec.max_fps
        self._last_offer = -1e9
        self._pending: OrderedDict[int, tuple[FrameResult | None, FrameResult | None]]
        self._pending = OrderedDict()
        self._ready: deque[tuple[FrameResult, FrameResult]] = deque(maxlen=PENDING)
        self._lock = threading.Lock()  # the pairing: the live and the shadow worker
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name=f"shadow:{stream_id}", daemon=True)

    # -- the live worker's side: two calls per sampled frame, one check otherwise -----
    def offer(self, frame: Frame, now: float) -> bool:
        """Called by the live worker with each frame it takes; True when sampled (then
        `live` must be told its result)."""
        self._seen += 1
        budget = self.budget
        if budget.paused or self._seen % budget.every or now - self._last_offer < self._min_gap:
            return False
        self._last_offer = now
        self.offered += 1
        self._slot.put(frame)
        return True

    def live(self, result: FrameResult) -> None:
        """The live result of a sampled frame."""
        self._pair(result.seq, result, None)

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 3.0) -> bool:
        """Stop the worker (idempotent: the stream's stop and the API's may both call);
        True when it ended within `timeout` seconds."""
        with self._lock:
            first, on_stopped, self._on_stopped = not self._stop.is_set(), self._on_stopped, None
            self._stop.set()
        self._slot.close()
        self.unhook()  # nothing to stop with the stream any more
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self.stopped = time.time() if first else self.stopped
        if on_stopped is not None:
            on_stopped(self)
        return not self._thread.is_alive()

    def latencies(self) -> list[tuple[float, float]]:
        """Each compared frame's (live, candidate) workflow run, ms (the newest kept)."""
        with self._lock:
            return list(self.comparison.latency_ms)

    @property
    def skipped(self) -> int:
        """Sampled frames replaced in the slot before the candidate could take them."""
        return self._slot.dropped

    def compared(self) -> ComparedFrame | None:
        """The newest frame pair compared, with its frame (None before the first)."""
        with self._lock:
            return self._compared

    def report(self, interval: bool = True) -> dict[str, Any]:
        """What the API answers: the shadow's spec, its counters and the comparison."""
        workflow = self.spec.workflow
        with self._lock:
            comparison = self.comparison.report(interval)
        return {
            "stream": self.stream_id,
            "workflow": self.workflow.name,
            "source": str(workflow) if isinstance(workflow, Path) else "inline",
            "every": self.spec.every,
            "max_fps": self.spec.max_fps,
            "publish": self.spec.publish,
            "started": self.started,
            "stopped": self.stopped,
            "running": self._thread.is_alive(),
            "offered": self.offered,
            "ran": self.ran,
            "skipped": self.skipped,
            "failed": self.failed,
            "last_error": self.last_error,
            "budget": self.budget.report(),
            "comparison": comparison,
        }

    # -- the shadow worker ---------------------------------------------------------------
    def handover(self, timeout: float = 3.0) -> WorkflowRun | None:
        """For a promotion: stop without ending the workflow's lease (the stream takes it)
        and give up the candidate's instance with its warm block state, once its thread
        ended (None if it did not within `timeout`)."""
        with self._lock:
            self._on_stopped = None
        ended = self.stop(timeout)
        return self.workflow_run if ended else None

    def _work(self) -> None:
        self.workflow_run = self.workflow.instantiate(self._cpu_clock)
        run = self.workflow_run.run
        while not self._stop.is_set():
            frame = self._slot.get(GET_TIMEOUT_S)
            self._compare_ready()
            self.budget.step()
            if frame is None:
                continue
            try:
                result = run(frame, False)  # nobody watches a shadow's video
            except Exception as exc:  # a candidate's failure never reaches the live stream
                self._failed(frame.seq, exc)
                continue
            self.ran += 1
            self.observe(result)
            self._pair(frame.seq, None, result)
            self._compare_ready()

    def _compare_ready(self) -> None:
        """Compare the completed pairs, on this thread: never on the live worker's."""
        while self._ready:
            live, candidate = self._ready.popleft()
            with self._lock:
                self.comparison.add(live, candidate)
                self._compared = ComparedFrame.of(live, candidate) or self._compared

    def _failed(self, seq: int, exc: Exception) -> None:
        self.failed += 1
        # An exception's text may carry a URL (a block that fetched something): masked.
        self.last_error = mask_url(f"workflow {self.workflow.name!r}: {type(exc).__name__}: {exc}")
        with self._lock:
            self._pending.pop(seq, None)  # its live half, if it came first
        if self.failed == 1:
            log.warning("stream %s: shadow: %s", self.stream_id, self.last_error)

    def _pair(self, seq: int, live: FrameResult | None, candidate: FrameResult | None) -> None:
        with self._lock:
            old_live, old_candidate = self._pending.pop(seq, (None, None))
            live, candidate = live or old_live, candidate or old_candidate
            if live is not None and candidate is not None:
                self._ready.append((live, candidate))
                return
            self._pending[seq] = (live, candidate)
            while len(self._pending) > PENDING:  # a half whose other never comes
                self._pending.popitem(last=False)
