"""The runtime owns everything that runs: models and their batchers, compiled
workflows, streams, the fan-out and the metrics. `start()` then `stop()`, once each.

Start-up order is fail-fast: models load and every workflow compiles before any stream
starts, so a bad model or workflow stops the start with every problem named, and nothing
half-runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from appliance.config import AppConfig, StreamConfig, load_config
from appliance.errors import ReloadError, StreamExistsError, UnknownStreamError
from appliance.fanout import Fanout
from appliance.metrics import Metrics, StreamMetrics
from appliance.models import ModelBatcher
from appliance.models.pool import ModelPool
from appliance.profiling.hooks import StreamTrace
from appliance.profiling.rolling import RollingWriter
from appliance.profiling.tracer import Tracer
from appliance.profiling.windows import ProfilingWindows
from appliance.reload import ReloadPlan, plan_reload
from appliance.streams import Stream
from pipelines.blocks.base import BuildContext
from pipelines.compiler import compile_workflow, parse_workflow, workflow_digest
from pipelines.errors import WorkflowError
from pipelines.executor import CompiledWorkflow
from pipelines.registry import DEFAULT_REGISTRY
from pipelines.spec import read_workflow_file

log = logging.getLogger("appliance.runtime")

WORKFLOW_CACHE_SIZE = 256  # distinct compiled workflows kept for reuse


class Runtime:
    def __init__(
        self,
        config: AppConfig,
        *,
        max_frames: int | None = None,
        config_path: Path | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path  # re-read by reload()
        prof = config.profiling
        self.metrics = Metrics(*([prof.buckets] if prof.buckets else []))
        self.tracer = Tracer(enabled=prof.enabled)
        self.trace_writer = RollingWriter(
            self.tracer,
            config.resolve(prof.dir),
            rotate_s=prof.rotate_s,
            keep_files=prof.keep_files,
            keep_bytes=prof.keep_bytes,
            compress=prof.gzip,
            written=self.metrics.trace_files,
            errors=self.metrics.trace_errors,
        )
        self.fanout = Fanout()
        self.pool = ModelPool(self.metrics, self.tracer)
        self.windows = ProfilingWindows(
            self.tracer,
            self.trace_writer,
            self.pool,
            lambda: list(self.streams),
            config.resolve(prof.dir),
            prof.max_window_s,
            self.metrics.window_active,
            prof.ort_sample_every_n_batches,
        )
        self.streams: dict[str, Stream] = {}
        # By digest: compile once. Bounded (least recently used out), since API calls may
        # bring any number of inline workflows; running streams hold their own reference.
        self._workflows: OrderedDict[str, CompiledWorkflow] = OrderedDict()
        self._max_frames = max_frames
        self._lock = threading.Lock()
        self.started_at = 0.0

    # -- start-up --------------------------------------------------------------------
    def prepare(self) -> list[tuple[StreamConfig, CompiledWorkflow]]:
        """Load every model and compile every stream's workflow; start nothing yet.

        Raises ModelLoadError or WorkflowError (every problem listed); models already
        loaded are stopped again, so a failed prepare leaves no thread behind.
        """
        for name, problem in DEFAULT_REGISTRY.load_plugins().items():
            log.error("block plugin %r left out: %s", name, problem)
        try:
            self.load_models()
            return [(s, self.compile_stream_workflow(s, f"streams[{i}]"))
                    for i, s in enumerate(self.config.streams)]  # fmt: skip
        except BaseException:
            self._stop_models(1.0)
            raise

    def start(self) -> None:
        """Prepare, then start every stream (and the rolling trace writer)."""
        self.started_at = time.time()
        for cfg, workflow in self.prepare():
            self._start_stream(cfg, workflow)
        if self.tracer.enabled:
            self.trace_writer.start()

    def load_models(self) -> None:
        """Load the config's models (workflows may add their own when compiled)."""
        for model_id, spec in self.config.models.items():
            self.pool.ensure(model_id, spec, self.config.resolve, f"models.{model_id}")

    def compile_workflow(self, workflow: Path | Mapping[str, Any], where: str) -> CompiledWorkflow:
        """Compile (or reuse) a workflow, loading the models it declares itself.

        WorkflowError and ModelLoadError name `where` and, for files, the file.
        """
        document, origin, base = workflow_document(self.config, workflow, where)
        try:
            spec = parse_workflow(document)
            digest = workflow_digest(spec)
            with self._lock:
                cached = self._workflows.get(digest)
                if cached is not None:
                    self._workflows.move_to_end(digest)
            if cached is not None:
                return cached
            for model_id, model in spec.models.items():
                resolve = partial(_resolve_against, base)
                self.pool.ensure(model_id, model, resolve, f"{origin} models.{model_id}")
            compiled = compile_workflow(spec, BuildContext(models=self.pool.handles))
        except WorkflowError as exc:
            raise WorkflowError(exc.problems, f"{origin}: workflow {exc.name!r}") from None
        with self._lock:
            self._workflows[digest] = compiled
            while len(self._workflows) > WORKFLOW_CACHE_SIZE:
                self._workflows.popitem(last=False)
        return compiled

    def compile_stream_workflow(self, cfg: StreamConfig, where: str) -> CompiledWorkflow:
        return self.compile_workflow(cfg.workflow, f"{where}.workflow")

    def _start_stream(self, cfg: StreamConfig, workflow: CompiledWorkflow) -> Stream:
        blocks = list(zip(workflow.block_ids, workflow.block_types, strict=True))
        stream = Stream(
            cfg,
            workflow,
            self.fanout,
            StreamMetrics(self.metrics, cfg.id, blocks),
            self.config.resolve,
            max_frames=self._max_frames,
            trace=StreamTrace(
                self.tracer, cfg.id, workflow, self.config.profiling.sample_every_n_frames
            ),
        )
        with self._lock:  # checked again here: the id may have been taken since
            if cfg.id in self.streams:
                raise StreamExistsError(cfg.id)
            self.streams[cfg.id] = stream
        stream.start()
        return stream

    # -- managing streams at runtime ---------------------------------------------------
    def add_stream(self, cfg: StreamConfig) -> Stream:
        """Compile the stream's workflow and start it; StreamExistsError if the id runs."""
        with self._lock:
            if cfg.id in self.streams:
                raise StreamExistsError(cfg.id)
        workflow = self.compile_stream_workflow(cfg, f"stream {cfg.id!r}")
        return self._start_stream(cfg, workflow)

    def remove_stream(self, stream_id: str, timeout: float = 3.0) -> bool:
        """Stop a stream, join its threads and drop its metrics; True if they ended."""
        with self._lock:
            stream = self.streams.pop(stream_id, None)
        if stream is None:
            raise UnknownStreamError(stream_id)
        ended = stream.stop(timeout)
        stream.metrics.remove()
        log.info("stream %s removed", stream_id)
        return ended

    def restart_stream(self, stream_id: str, cfg: StreamConfig | None = None) -> Stream:
        """Stop and start a stream again (with `cfg` if given), recompiling its workflow
        if the workflow file changed; the new workflow is compiled before the old stops."""
        with self._lock:
            old = self.streams.get(stream_id)
        if old is None:
            raise UnknownStreamError(stream_id)
        cfg = cfg or old.cfg
        workflow = self.compile_stream_workflow(cfg, f"stream {stream_id!r}")
        self.remove_stream(stream_id)
        return self._start_stream(cfg, workflow)

    def reload(self) -> ReloadPlan:
        """Apply the config file as it is now: streams added, removed or changed are
        started, stopped or restarted; unchanged ones keep running untouched. Everything
        is checked (config, models, workflows) before anything changes."""
        if self.config_path is None:
            raise ReloadError("this runtime was not started from a config file")
        new = load_config(self.config_path)
        plan = plan_reload(self.config, new, self._changed_workflows(new))
        taken = [c.id for c in plan.added if c.id in self.streams]
        if taken:  # added over the API since: the file must not silently replace them
            raise ReloadError(
                f"streams {taken} were added over the API and are now also in the file: "
                "remove them over the API first; nothing was changed"
            )
        old_config, self.config = self.config, new
        try:
            self.load_models()
            compiled = {c.id: self.compile_stream_workflow(c, f"streams.{c.id}")
                        for c in [*plan.added, *plan.changed]}  # fmt: skip
        except BaseException:
            self.config = old_config
            raise
        for sid in plan.removed:
            self.remove_stream(sid)
        for cfg in plan.changed:
            self.remove_stream(cfg.id)
            self._start_stream(cfg, compiled[cfg.id])
        for cfg in plan.added:
            self._start_stream(cfg, compiled[cfg.id])
        log.info("config reloaded: %s", plan.summary())
        return plan

    def _changed_workflows(self, new: AppConfig) -> set[str]:
        """Running streams whose workflow document now has another digest."""
        changed = set()
        for cfg in new.streams:
            stream = self.streams.get(cfg.id)
            if stream is None:
                continue
            try:
                doc, _, _ = workflow_document(new, cfg.workflow, cfg.id)
                digest = workflow_digest(parse_workflow(doc))
            except WorkflowError:
                changed.add(cfg.id)  # broken now: the compile step will report it
                continue
            if digest != stream.workflow.digest:
                changed.add(cfg.id)
        return changed

    # -- running ---------------------------------------------------------------------
    def sync_metrics(self) -> None:
        for stream in list(self.streams.values()):
            stream.sync_metrics()

    def wait_done(self, timeout: float | None = None) -> bool:
        """Block until every stream's worker has ended; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for stream in list(self.streams.values()):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not stream.done.wait(left):
                return False
        return True

    # -- shutdown --------------------------------------------------------------------
    def stop(self, timeout: float = 5.0) -> bool:
        """Stop streams (in parallel), then models; True when every thread ended."""
        deadline = time.monotonic() + timeout
        self.windows.stop()
        streams = list(self.streams.values())
        results: dict[str, bool] = {}
        stoppers = [
            threading.Thread(target=lambda s=s: results.__setitem__(s.id, s.stop(timeout * 0.7)),
                             name=f"stop:{s.id}", daemon=True)
            for s in streams
        ]  # fmt: skip
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join(max(0.0, deadline - time.monotonic()))
        models_ok = self._stop_models(max(0.1, deadline - time.monotonic()))
        models_ok = self.trace_writer.stop(max(0.1, deadline - time.monotonic())) and models_ok
        ok = models_ok and all(results.get(s.id, False) for s in streams)
        log.info("runtime stopped%s", "" if ok else " (some threads did not end in time)")
        return ok

    def _stop_models(self, timeout: float) -> bool:
        return self.pool.stop(timeout)

    @property
    def models(self) -> Mapping[str, ModelBatcher]:
        return self.pool.handles


def workflow_document(
    config: AppConfig, workflow: Path | Mapping[str, Any], where: str
) -> tuple[Mapping[str, Any], str, Path]:
    """(document, origin for messages, base directory for its relative paths)."""
    if isinstance(workflow, Path):
        path = config.resolve(workflow)
        return read_workflow_file(path), f"{where} ({path})", path.parent
    return workflow, where, config.base_dir


def _resolve_against(base: Path, path: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base / p).resolve()
