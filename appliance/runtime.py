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
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from appliance.config import AppConfig, StreamConfig
from appliance.fanout import Fanout
from appliance.metrics import Metrics, StreamMetrics
from appliance.models import ModelBatcher
from appliance.models.pool import ModelPool
from appliance.streams import Stream
from pipelines.blocks.base import BuildContext
from pipelines.compiler import compile_workflow, parse_workflow, workflow_digest
from pipelines.errors import WorkflowError
from pipelines.executor import CompiledWorkflow
from pipelines.registry import DEFAULT_REGISTRY
from pipelines.spec import read_workflow_file

log = logging.getLogger("appliance.runtime")


class Runtime:
    def __init__(self, config: AppConfig, *, max_frames: int | None = None) -> None:
        self.config = config
        self.metrics = Metrics()
        self.fanout = Fanout()
        self.pool = ModelPool(self.metrics)
        self.streams: dict[str, Stream] = {}
        self._workflows: dict[str, CompiledWorkflow] = {}  # by digest: compile once
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
        """Prepare, then start every stream."""
        self.started_at = time.time()
        for cfg, workflow in self.prepare():
            self._start_stream(cfg, workflow)

    def load_models(self) -> None:
        """Load the config's models (workflows may add their own when compiled)."""
        for model_id, spec in self.config.models.items():
            self.pool.ensure(model_id, spec, self.config.resolve, f"models.{model_id}")

    def compile_stream_workflow(self, cfg: StreamConfig, where: str) -> CompiledWorkflow:
        """Compile (or reuse) a stream's workflow, loading the models it declares itself.

        WorkflowError and ModelLoadError name the stream and, for files, the file.
        """
        base = self.config.base_dir
        if isinstance(cfg.workflow, Path):
            path = self.config.resolve(cfg.workflow)
            document: Mapping[str, Any] = read_workflow_file(path)
            origin, base = f"{where}.workflow ({path})", path.parent
        else:
            document, origin = cfg.workflow, f"{where}.workflow"
        try:
            spec = parse_workflow(document)
            digest = workflow_digest(spec)
            with self._lock:
                cached = self._workflows.get(digest)
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
        return compiled

    def _start_stream(self, cfg: StreamConfig, workflow: CompiledWorkflow) -> Stream:
        blocks = list(zip(workflow.block_ids, workflow.block_types, strict=True))
        stream = Stream(
            cfg,
            workflow,
            self.fanout,
            StreamMetrics(self.metrics, cfg.id, blocks),
            self.config.resolve,
            max_frames=self._max_frames,
        )
        with self._lock:
            self.streams[cfg.id] = stream
        stream.start()
        return stream

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
        ok = models_ok and all(results.get(s.id, False) for s in streams)
        log.info("runtime stopped%s", "" if ok else " (some threads did not end in time)")
        return ok

    def _stop_models(self, timeout: float) -> bool:
        return self.pool.stop(timeout)

    @property
    def models(self) -> Mapping[str, ModelBatcher]:
        return self.pool.handles


def _resolve_against(base: Path, path: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base / p).resolve()
