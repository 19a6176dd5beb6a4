"""Every loaded model of a process, by id: one ONNX Runtime session and batcher each.

Models come from the config's `models:` and from workflows' own `models:`; the same id
declared twice with the same file and settings is loaded once, with different ones it is
an error naming both places.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from appliance.metrics import Metrics
from appliance.models.batcher import BatchRecord, ModelBatcher
from appliance.models.session import ModelLoadError, load_model
from appliance.profiling.hooks import trace_batch
from appliance.profiling.tracer import Tracer
from pipelines.models import TensorInfo
from pipelines.spec import ModelSpec, SessionSpec


class ModelConflictError(ModelLoadError):
    """One model id declared with two different definitions."""


class ModelPool:
    def __init__(self, metrics: Metrics, tracer: Tracer | None = None) -> None:
        self._metrics = metrics
        self._tracer = tracer
        self._batchers: dict[str, ModelBatcher] = {}
        self._specs: dict[str, tuple[ModelSpec, str]] = {}  # id -> (resolved spec, where)
        self._lock = threading.Lock()

    @property
    def handles(self) -> Mapping[str, ModelBatcher]:
        return self._batchers

    def ensure(
        self, model_id: str, spec: ModelSpec, resolve: Callable[[Path], Path], where: str
    ) -> ModelBatcher:
        """The running batcher for this model, loading it on first use."""
        resolved = _resolved(spec, resolve)
        with self._lock:
            known = self._specs.get(model_id)
            if known is not None:
                if known[0] != resolved:
                    raise ModelConflictError(
                        f"{where}: model {model_id!r} is already declared differently at {known[1]}"
                    )
                return self._batchers[model_id]
            loaded = load_model(model_id, resolved, lambda p: p)
            batcher = ModelBatcher(loaded, resolved.batching, self._observer(model_id))
            batcher.start()
            self._batchers[model_id] = batcher
            self._specs[model_id] = (resolved, where)
            return batcher

    def session_spec(self, model_id: str) -> SessionSpec:
        """The session options a loaded model was created with."""
        return self._specs[model_id][0].session

    def describe(self) -> list[dict[str, Any]]:
        """What `GET /v1/models` answers: interface, providers, batching, counters."""
        return [_describe(b) for b in list(self._batchers.values())]

    def stop(self, timeout: float) -> bool:
        with self._lock:
            batchers = list(self._batchers.values())
        return all([b.stop(timeout) for b in batchers])

    def _observer(self, model_id: str) -> Callable[[BatchRecord], None]:
        run = self._metrics.model_inference.labels(model_id)
        queue = self._metrics.model_queue.labels(model_id)
        size = self._metrics.model_batch_size.labels(model_id)
        tracer = self._tracer

        def observe(rec: BatchRecord) -> None:
            if tracer is not None:
                trace_batch(tracer, rec)
            run.observe(rec.run_s)
            size.observe(rec.batch_size)
            for wait in rec.queue_wait_s:
                queue.observe(wait)

        return observe


def _describe(batcher: ModelBatcher) -> dict[str, Any]:
    info = batcher.info

    def tensors(items: tuple[TensorInfo, ...]) -> list[dict[str, Any]]:
        return [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in items]

    return {
        "id": info.id,
        "path": info.path,
        "decoder": info.decoder or None,
        "labels": list(info.labels),
        "inputs": tensors(info.inputs),
        "outputs": tensors(info.outputs),
        "providers": list(info.providers),
        "batching": batcher.batching.model_dump(),
        "batches": batcher.batches,
        "samples": batcher.samples,
    }


def _resolved(spec: ModelSpec, resolve: Callable[[Path], Path]) -> ModelSpec:
    """The spec with absolute paths, so equal models compare equal wherever declared."""
    labels_file = None if spec.labels_file is None else resolve(spec.labels_file)
    return spec.model_copy(update={"path": resolve(spec.path), "labels_file": labels_file})
