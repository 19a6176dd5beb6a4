"""The runtime's shadows, wired to the rest of it (appliance/runtime/shadows.py does the
work): the API's file roots and the model pool for the candidates, the outputs for their
events and (when asked) their results, the regression watch that rolls a promotion back,
the state folder that keeps what the API changed, and their Prometheus series."""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from appliance.config import ConfigError, StreamConfig
from appliance.models.pool import ModelPool
from appliance.observe.audit import AuditLog
from appliance.observe.metrics import Metrics
from appliance.observe.shadow_metrics import ShadowCollector
from appliance.policy.files import FilePolicy
from appliance.runtime.outputs import Outputs
from appliance.runtime.running import RunningStreams
from appliance.runtime.shadows import Compile, Shadows
from appliance.runtime.state import StreamsState
from appliance.runtime.workflows import WorkflowCache
from appliance.watch.watch import Watch
from pipelines.executor import CompiledWorkflow

log = logging.getLogger("appliance.runtime")


class Host(Protocol):
    """The parts of the runtime (appliance/runtime/runtime.py) its shadows use."""

    streams: RunningStreams
    request_files: FilePolicy
    pool: ModelPool
    workflows: WorkflowCache
    outputs: Outputs
    watch: Watch
    state: StreamsState
    metrics: Metrics
    audit: AuditLog

    @property
    def compile_workflow(self) -> Compile: ...

    def release_workflow(self, workflow: CompiledWorkflow) -> None: ...


def build_shadows(rt: Host, control: threading.RLock, requested: set[str]) -> Shadows:
    """The runtime's Shadows, listening to its watch and exported on its metrics.
    `control`: the runtime's change lock; `requested`: the ids of its streams whose files
    go through the request policy."""
    shadows = Shadows(
        rt.streams,
        rt.compile_workflow,
        rt.release_workflow,
        lambda: rt.request_files,  # a shadow is a request's
        control=control,
        occasional=lambda w, s, d: rt.pool.set_occasional(rt.workflows.bound(w), d, s),
        publish=rt.outputs.publish_event,
        changed=rt.watch.changed,
        keep=lambda cfg: keep_declared(rt.state, requested, cfg),
        metrics=rt.metrics,
        publisher=lambda cfg: rt.outputs.shadow_publisher(cfg.outputs),
    )
    # A regression on a stream just promoted rolls it back (within its rollback_s).
    rt.watch.on_raised(
        lambda raised: shadows.on_regressions(raised, rt.watch.model_streams(), rt.audit)
    )
    rt.metrics.registry.register(
        ShadowCollector(lambda: [s.report(interval=False) for s in shadows.running()])
    )
    return shadows


def keep_declared(state: StreamsState, requested: set[str], cfg: StreamConfig) -> None:
    """A stream's declaration changed over the API (its shadow): kept in the state like a
    stream added there (its files checked by the request policy from now on). One whose
    credentials could be kept in clear only is not kept, with a WARNING."""
    try:
        state.check(cfg)
    except ConfigError as exc:
        log.warning("stream %s: its shadow's change is not kept in the state: %s", cfg.id, exc)
        return
    state.added(cfg)
    requested.add(cfg.id)
