"""Applying a reload of the config file to a running runtime: everything checked first
(config, models, workflows), then streams stopped, restarted and started. A model declared
anew loads beside the old one (appliance/models/pool.py, `hold`), so a refused or dry run
goes back to the old one untouched. `Runtime.reload` calls it under its control lock, with
itself as the `Reloadable`. A change made over the API holds against the file's entry it was
made over until that entry changes (appliance/runtime/state.py): the plan leaves it alone;
a tuning a tune applied holds until the file's `tuning:` changes (runtime/tuningstate.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from appliance.config import AppConfig, StreamConfig
from appliance.errors import ReloadError
from appliance.models import ModelBatcher
from appliance.models.pool import ModelPool
from appliance.policy.files import FilePolicy
from appliance.policy.request_files import request_policy
from appliance.runtime.checking import Problems
from appliance.runtime.reload import ReloadPlan, plan_file_reload
from appliance.runtime.retuning import Tunable, retune_running
from appliance.runtime.sharding import Shard
from appliance.runtime.state import StreamsState
from appliance.runtime.tuningstate import TuningState
from appliance.watch.watch import Watch
from pipelines.executor import CompiledWorkflow

log = logging.getLogger("appliance.runtime")


class Reloadable(Tunable, Protocol):
    """What a reload reads and changes of a runtime, besides what a retune does: the file
    it came from, its models and workflows, the streams it stops and starts, and the API's
    file roots."""

    request_files: FilePolicy  # derived from the file: a reload derives it anew

    @property
    def config_path(self) -> Path | None: ...

    @property
    def files(self) -> FilePolicy: ...

    @property
    def shard(self) -> Shard | None: ...

    @property
    def watch(self) -> Watch: ...

    @property
    def state(self) -> StreamsState: ...

    @property
    def tuned(self) -> TuningState: ...

    def load_models(self, problems: Problems, pin: bool = True) -> frozenset[str]: ...

    def compile_stream_workflow(
        self,
        cfg: StreamConfig,
        where: str,
        files: FilePolicy | None = None,
        unavailable: frozenset[str] = frozenset(),
    ) -> CompiledWorkflow: ...

    def release_workflow(self, workflow: CompiledWorkflow) -> None: ...

    def remove_stream(self, stream_id: str, timeout: float = 3.0) -> bool: ...


def apply_reload(rt: Reloadable, dry_run: bool) -> ReloadPlan:
    """Runtime.reload's work, under its control lock (its docstring says what it does)."""
    if rt.config_path is None:
        raise ReloadError("this runtime was not started from a config file")
    running = list(rt.streams.items())
    digests = {i: s.workflow.digest for i, s in running}
    uses = {i: s.workflow.models for i, s in running}  # a changed config model restarts them
    new, plan = plan_file_reload(rt.config_path, rt.config, rt.files, digests, rt.shard, uses)
    rt.state.hold(plan, plan.source or new)  # the API's changes the file has not overruled
    file_tuning = new.tuning
    new = rt.tuned.over(new)  # a tune's kept tuning, while the file's `tuning:` is unchanged
    old_config, rt.config = rt.config, new
    compiled: dict[str, CompiledWorkflow] = {}
    problems = Problems(str(rt.config_path))  # every problem of the new config at once
    leased: list[ModelBatcher] = []  # a dry run's models: leased for the check, not pinned
    # Until the reload is applied, a model it replaces is kept: the undo goes back to it.
    hold = rt.pool.hold()
    try:
        failed = rt.load_models(problems, pin=not dry_run)
        if dry_run:
            leased = [rt.pool.handles[m] for m in new.models if m not in failed]
        for c in [*plan.added, *plan.changed]:
            with problems.check():
                where = f"streams.{c.id}"
                compiled[c.id] = rt.compile_stream_workflow(c, where, unavailable=failed)
        problems.raise_any()
    except BaseException:
        _undo(rt, old_config, compiled, leased, hold)
        raise
    if dry_run:
        _undo(rt, old_config, compiled, leased, hold)
        return plan
    try:
        for sid in plan.removed:
            if sid in rt.streams:  # else removed over the API: nothing runs
                rt.remove_stream(sid)
        for cfg in plan.changed:
            if cfg.id in rt.streams:
                rt.remove_stream(cfg.id)
            rt.streams.start(cfg, compiled[cfg.id])
        for cfg in plan.added:
            rt.streams.start(cfg, compiled[cfg.id])
    finally:  # the replaced models nothing runs any more are released
        rt.pool.unhold(hold)
    if new.tuning != old_config.tuning:  # live: models swap sessions, streams keep running
        started = frozenset(c.id for c in [*plan.added, *plan.changed])
        retune_running(rt, old_config.tuning, skip=started)
    # The API's roots follow the new file's models, workflows and videos.
    rt.request_files = request_policy(plan.source or new, rt.config_path)
    rt.state.reloaded(plan.source or new)  # the API's changes the file now overrules: gone
    rt.tuned.reloaded(file_tuning)  # the kept tuning too, when the file's section changed
    log.info("config reloaded: %s", plan.summary())
    done = (f"{k} {', '.join(v)}" for k, v in plan.summary().items() if v and k != "unchanged")
    rt.watch.changed("reload", "; ".join(done) or "nothing changed")
    return plan


def _undo(
    rt: Reloadable,
    config: AppConfig,
    compiled: Mapping[str, CompiledWorkflow],
    leased: list[ModelBatcher],
    hold: ModelPool.Hold,
) -> None:
    """The old config and models current again; what the reload loaded anew in their
    place is released (the old ones were never stopped: `hold`)."""
    rt.config = config
    rt.pool.restore(hold)  # first: a replacing model is never idle, nor evicted
    for workflow in compiled.values():
        rt.release_workflow(workflow)
    rt.pool.release(leased)
    rt.pool.unhold(hold)
