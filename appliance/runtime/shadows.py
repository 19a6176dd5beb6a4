"""The runtime's shadows: at most one per stream, started and stopped over the API (or
declared in the config: `streams[].shadow`), promoted and rolled back.

A shadow's workflow is read through the file policy of whoever named it (the API's
roots for a request) and compiled like a stream's (the same checks and limits, its models
loaded or shared through the pool), and leased until the shadow stops. A shadow belongs
to the running stream: removing, restarting or reloading the stream ends it (its final
report is then gone with it); one the config declares starts again with the stream.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from appliance.config import StreamConfig
from appliance.errors import (
    NoRollbackError,
    NoShadowError,
    PromotionRefusedError,
    ShadowExistsError,
    UnknownStreamError,
)
from appliance.observe.audit import AuditLog
from appliance.observe.metrics import SHADOW, BlockLatency, Metrics
from appliance.policy.files import FilePolicy
from appliance.runtime.kept import Kept, Previous
from appliance.runtime.promotion import PromoteRequest, merged
from appliance.runtime.running import RunningStreams
from appliance.runtime.shadow import Shadow, ShadowSpec
from appliance.runtime.streams import Stream
from appliance.runtime.workflows import WorkflowRef
from appliance.watch.report import Regression
from pipelines.executor import CompiledWorkflow
from pipelines.types import FrameResult

log = logging.getLogger("appliance.shadow")

Observe = Callable[[FrameResult], None]  # a candidate result's consumer


def _nothing(_result: FrameResult) -> None:
    pass


class Compile(Protocol):
    def __call__(
        self, workflow: WorkflowRef, where: str, files: FilePolicy
    ) -> CompiledWorkflow: ...


class Shadows:
    """Stream id -> its shadow; `start` and `stop` take the runtime's change lock."""

    def __init__(
        self,
        streams: RunningStreams,
        compile_workflow: Compile,
        release: Callable[[CompiledWorkflow], None],
        files: Callable[[], FilePolicy],
        *,
        control: threading.RLock,
        occasional: Callable[[CompiledWorkflow, str, int], None],
        publish: Callable[[list[str] | None, dict[str, Any]], None] = lambda _s, _e: None,
        changed: Callable[[str, str], None] = lambda _what, _summary: None,
        keep: Callable[[StreamConfig], None] = lambda _cfg: None,
        metrics: Metrics | None = None,
        publisher: Callable[[StreamConfig], Observe] = lambda _cfg: _nothing,
    ) -> None:
        self._streams = streams
        self._find = streams.find  # UnknownStreamError when no stream runs with that id
        self._compile = compile_workflow
        self._release = release
        self._files = files  # the API's file policy, as it is now (a reload replaces it)
        # Marks a workflow's model leases occasional (+1) or not (-1), a shadow's on a
        # stream: the batchers do not wait for its samples, and it shares the stream's
        # model runs (ModelPool.set_occasional).
        self._occasional = occasional
        # The runtime's one-change-at-a-time lock (appliance/runtime/control.py): a
        # shadow's compile does not race a reload.
        self._control = control
        # An event to the stream's sinks (Outputs.publish_event), and an operator's change
        # the watch names its regressions after (Watch.changed).
        self._publish = publish
        self._changed = changed
        # Keeps a stream's new declaration in the state folder (StateSaveError when it
        # cannot): a shadow started, stopped or promoted over the API outlives a restart.
        self._keep = keep
        self._shadows: dict[str, Shadow] = {}
        self._metrics = metrics
        self._publisher = publisher  # a stream's sinks that take a shadow's results
        self._latency: dict[str, BlockLatency] = {}  # each shadow's block histograms
        self._kept = Kept(release)  # what a promotion replaced, by stream
        self._lock = threading.Lock()

    def start(self, stream_id: str, spec: ShadowSpec, files: FilePolicy | None = None) -> Shadow:
        """Compile the candidate and start it beside the stream's live workflow; its
        files go through `files` (the API's policy by default: a request's)."""
        with self._control:
            stream = self._find(stream_id)
            if stream_id in self._shadows:
                raise ShadowExistsError(stream_id)
            where = f"stream {stream_id!r} shadow"
            policy = self._files() if files is None else files
            workflow = self._compile(spec.workflow, f"{where}.workflow", policy)
            self._occasional(workflow, stream_id, 1)
            shadow = Shadow(
                stream_id, spec, workflow, self._live_frames, self._stopped, stream.cpu_clock,
                self._live_ages,
            )  # fmt: skip
            with self._lock:
                self._shadows[stream_id] = shadow
                shadow.observe = self._observer(stream, shadow)
            shadow.start()
            stream.shadow = shadow  # the live worker offers from its next frame on
            shadow.unhook = stream.on_stop(shadow.stop)
            if files is None:  # a request's: kept (one the stream declares already is)
                try:
                    self._declare(stream_id, shadow=spec)
                except BaseException:
                    self.stop(stream_id)
                    raise
            return shadow

    def check(self, cfg: StreamConfig, files: FilePolicy) -> None:
        """Refuse a stream whose declared shadow does not compile, before it starts."""
        if cfg.shadow is not None:
            where = f"stream {cfg.id!r} shadow.workflow"
            self._release(self._compile(cfg.shadow.workflow, where, files))

    def declared(self, stream: Stream, files: FilePolicy) -> Stream:
        """Start the shadow a stream's config declares (`streams[].shadow`), if any. One
        that cannot start is logged and the stream runs on without it: the config's own
        streams were checked at load (`check`), so this is a model or file gone since."""
        spec = stream.cfg.shadow
        if spec is not None:
            try:
                self.start(stream.id, spec, files)
            except Exception as exc:  # whatever the candidate's compile raises
                log.error("stream %s: its shadow did not start: %s", stream.id, exc)
        return stream

    def find(self, stream_id: str) -> Shadow:
        """The stream's shadow: UnknownStreamError without the stream, NoShadowError
        without a shadow."""
        self._find(stream_id)
        with self._lock:
            shadow = self._shadows.get(stream_id)
        if shadow is None:
            raise NoShadowError(stream_id)
        return shadow

    def stop(self, stream_id: str, timeout: float = 3.0) -> Shadow:
        """Stop the stream's shadow: the stopped shadow, for its final report."""
        with self._control:
            shadow = self.find(stream_id)
            self._declare(stream_id, shadow=None)
            stream = self._streams.get(stream_id)
            if stream is not None and stream.shadow is shadow:
                stream.shadow = None
            shadow.stop(timeout)
            return shadow

    def promote(self, stream_id: str, request: PromoteRequest) -> dict[str, Any]:
        """Switch the stream to its shadow's workflow at a frame boundary, if the gates
        pass (PromotionRefusedError naming each that fails); the workflow it ran stays
        leased for `request.rollback_s`."""
        with self._control:
            shadow = self.find(stream_id)
            comparison = shadow.report()["comparison"]
            request = merged(shadow.spec.promote, request)
            if refusals := request.refusals(comparison, shadow.latencies()):
                raise PromotionRefusedError(stream_id, refusals)
            stream = self._find(stream_id)
            # A rollback's declaration: the workflow before, without the shadow promoted.
            before = self._streams.declared[stream_id].model_copy(update={"shadow": None})
            self._declare(stream_id, workflow=shadow.spec.workflow, shadow=None)
            stream.shadow = None
            with self._lock:
                del self._shadows[stream_id]
            run = shadow.handover()  # its lease goes to the stream with the switch below
            self._drop_latency(stream_id)
            self._occasional(shadow.workflow, stream_id, -1)  # the stream's lease now
            previous, applied = self._streams.switch(stream_id, shadow.workflow, run)
            promoted = shadow.workflow.version
            forget = functools.partial(self._forget, stream_id, promoted)
            unhook = stream.on_stop(forget)
            auto = request.auto_rollback
            until = _until(request.rollback_s)
            self._kept.keep(stream_id, Previous(previous, promoted, until, unhook, before, auto))
            answer = {"stream": stream_id, "workflow": promoted, "previous": previous.version,
                      "applied": applied, "rollback_s": request.rollback_s,
                      "auto_rollback": auto}  # fmt: skip
            self._changed("promote", f"stream {stream_id!r} promoted to {promoted}")
            self._publish([stream_id], {"type": "shadow_promoted", **answer})
            return {**answer, "comparison": comparison}

    def rollback(self, stream_id: str, reason: str | None = None) -> dict[str, Any]:
        """Switch the stream back to the workflow its last promotion replaced, while that
        is kept (NoRollbackError otherwise). `reason`: why it rolls back by itself."""
        with self._control:
            self._find(stream_id)
            kept = self._kept.peek(stream_id)
            if kept is not None:  # kept in the state first: a failure there changes nothing
                self._declare(stream_id, declared=kept.declared)
                kept = self._kept.take(stream_id)
            if kept is None:
                raise NoRollbackError(f"stream {stream_id!r} has no promotion to roll back")
            current, applied = self._streams.switch(stream_id, kept.workflow)
            self._release(current)
            answer = {"stream": stream_id, "workflow": kept.workflow.version,
                      "previous": current.version, "applied": applied}  # fmt: skip
            summary = f"stream {stream_id!r} rolled back to {kept.workflow.version}"
            self._changed("rollback", summary if reason is None else f"{summary}: {reason}")
            event = {"type": "shadow_rolled_back", **answer, "automatic": reason is not None}
            self._publish([stream_id], {**event, "reason": reason or "by request"})
            return answer

    def regressed(self, stream_id: str, reason: str) -> dict[str, Any] | None:
        """The watch raised a regression on the stream: within its promotion's rollback
        window (and unless the promotion said not to), roll it back. The rollback's answer,
        or None when there was nothing to roll back."""
        if self._kept.peek(stream_id, auto=True) is None:
            return None
        try:
            answer = self.rollback(stream_id, reason)
        except (NoRollbackError, UnknownStreamError):  # rolled back or removed meanwhile
            return None
        log.warning(
            "stream %s: rolled back to %s by itself: %s", stream_id, answer["workflow"], reason
        )
        return answer

    def on_regressions(
        self, raised: list[Regression], model_streams: Mapping[str, set[str]], audit: AuditLog
    ) -> None:
        """The watch's listener: each stream a new regression is on (its own row, or a
        model it runs) rolls back within its promotion's window, audited as the watch's."""
        reasons: dict[str, str] = {}
        for r in raised:
            streams = [r.stream] if r.stream else sorted(model_streams.get(r.model or "", ()))
            for stream_id in streams:
                reasons.setdefault(stream_id, f"regression {r.name} x{r.ratio:.2f} ({r.id})")
        for stream_id, reason in reasons.items():
            if self.regressed(stream_id, reason) is not None:
                audit.record("watch", "shadow.rollback", stream_id, detail=reason)

    def _declare(
        self, stream_id: str, *, declared: StreamConfig | None = None, **changes: Any
    ) -> None:
        """The stream is declared so from now on (`declared`, or its declaration with
        `changes`): kept in the state folder first (StateSaveError: nothing changed), then
        what its restarts start."""
        current = self._streams.declared.get(stream_id)
        if current is None:
            return
        cfg = declared or current.model_copy(update=changes)
        self._keep(cfg)
        self._streams.redeclare(cfg)

    def _forget(self, stream_id: str, promoted: str, _seconds: float) -> bool:
        """The promoted stream stopped: the workflow kept for its rollback goes."""
        self._kept.forget(stream_id, promoted)
        return True

    def _live_frames(self) -> int:
        """Frames every running stream has processed: the budget's measure of the live
        work (they share the cores and batchers with every shadow)."""
        return sum(stream.rate.count for stream in self._streams.running())

    def _observer(self, stream: Stream, shadow: Shadow) -> Observe:
        """What each candidate result goes to: its block histograms (variant="shadow"),
        and the stream's MQTT `shadow` topic if the shadow asked (`publish`)."""
        observers: list[Observe] = []
        if self._metrics is not None:
            workflow = shadow.workflow
            blocks = list(zip(workflow.block_ids, workflow.block_types, strict=True))
            latency = BlockLatency(self._metrics, stream.id, blocks, SHADOW)
            self._latency[stream.id] = latency
            observers.append(latency.observe)
        if shadow.spec.publish:
            observers.append(self._publisher(stream.cfg))
        if len(observers) < 2:
            return observers[0] if observers else _nothing

        def each(result: FrameResult) -> None:
            for observe in observers:
                observe(result)

        return each

    def _live_ages(self) -> float:
        """Those frames' ages, summed (s): the budget reports their mean."""
        return sum(stream.age_total for stream in self._streams.running())

    def _drop_latency(self, stream_id: str) -> None:
        """The shadow's block histograms go with it (its series leave /metrics)."""
        latency = self._latency.pop(stream_id, None)
        if latency is not None:
            latency.remove()

    def running(self) -> list[Shadow]:
        """Every shadow now, for the metrics (a snapshot: they start and stop meanwhile)."""
        with self._lock:
            return list(self._shadows.values())

    def _stopped(self, shadow: Shadow) -> None:
        """A shadow ended (stopped here, or with its stream): its lease goes."""
        with self._lock:
            if self._shadows.get(shadow.stream_id) is shadow:
                del self._shadows[shadow.stream_id]
                self._drop_latency(shadow.stream_id)
        self._occasional(shadow.workflow, shadow.stream_id, -1)
        self._release(shadow.workflow)


def _until(seconds: float) -> float:
    return time.monotonic() + seconds
