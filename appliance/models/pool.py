"""Every loaded model of a process, by id: one ONNX Runtime session and batcher each.

Models come from the config's `models:` and from workflows' own `models:`; the same id
declared twice with the same file and settings is loaded once, with different ones it is
an error naming both places.

Models are leased: a stream holds its workflow's models for its life, a request for its
call. The config's models are pinned. A model nobody leases is idle: up to
`limits.idle_models` idle models stay loaded for reuse (least recently used released
first), so models that API workflows declare do not pile up. At most
`limits.max_models` are loaded at once; beyond that idle ones are released, and when none
is idle the load is refused with LimitError.

After each batch the pool records the model's metrics (inference time, batch size, queue
waits) and then calls `on_batch`, the hook the runtime injects (its trace spans): the
models do not know about profiling.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from appliance.errors import LimitError
from appliance.files import FileKind, FilePolicy
from appliance.metrics import Metrics
from appliance.models.batcher import BatchRecord, ModelBatcher
from appliance.models.session import ModelLoadError, load_model
from appliance.status import Batching, ModelStatus, Tensor
from pipelines.models import TensorInfo
from pipelines.spec import ModelSpec, SessionSpec

log = logging.getLogger("appliance.models")

STOP_TIMEOUT_S = 2.0  # a released model's batcher has no work left: it ends at once


class ModelConflictError(ModelLoadError):
    """One model id declared with two different definitions."""


class ModelPool:
    def __init__(
        self,
        metrics: Metrics,
        *,
        on_batch: Callable[[BatchRecord], None] | None = None,
        max_models: int = 16,
        idle_models: int = 2,
    ) -> None:
        self._metrics = metrics
        # Every model's batches, on that model's batcher thread (BatchRecord.model_id).
        self._on_batch = on_batch
        self._max_models = max_models
        self._idle_models = idle_models
        # Told the id of every model released, under the pool's lock (it must not call
        # back into the pool).
        self.on_release: Callable[[str], None] | None = None
        self._batchers: dict[str, ModelBatcher] = {}
        self._specs: dict[str, tuple[ModelSpec, str]] = {}  # id -> (resolved spec, where)
        self._users: Counter[str] = Counter()
        self._pinned: set[str] = set()
        self._idle: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    @property
    def handles(self) -> Mapping[str, ModelBatcher]:
        return self._batchers

    def ensure(
        self,
        model_id: str,
        spec: ModelSpec,
        files: FilePolicy,
        where: str,
        *,
        pin: bool = False,
    ) -> ModelBatcher:
        """The running batcher for this model, loading it on first use, leased once to
        the caller (`release` it); or pinned: the config's models are never released."""
        resolved = _resolved(spec, files, where)
        released: list[ModelBatcher] = []
        try:
            with self._lock:
                known = self._specs.get(model_id)
                if known is not None and known[0] != resolved:
                    raise ModelConflictError(
                        f"{where}: model {model_id!r} is already declared differently at {known[1]}"
                    )
                if known is None:
                    released = self._make_room(where)
                    self._load(model_id, resolved, files, where)
                self._take(model_id, pin)
                return self._batchers[model_id]
        finally:
            self._stop_released(released)

    def acquire(self, expected: Mapping[str, ModelBatcher]) -> bool:
        """Lease these models if each id still runs the batcher given; False (nothing
        leased) when one was released since, e.g. a cached workflow that must recompile."""
        with self._lock:
            if any(self._batchers.get(m) is not b for m, b in expected.items()):
                return False
            for model_id in expected:
                self._take(model_id, pin=False)
            return True

    def release(self, model_ids: Iterable[str]) -> None:
        """End one lease of each; unleased models become idle, the oldest idle released."""
        with self._lock:
            for model_id in model_ids:
                if self._users[model_id] > 0:
                    self._users[model_id] -= 1
                    self._batchers[model_id].set_producers(self._users[model_id])
                if self._users[model_id] == 0 and model_id not in self._pinned:
                    self._idle[model_id] = None
                    self._idle.move_to_end(model_id)
            released = self._evict(len(self._idle) - self._idle_models)
        self._stop_released(released)

    def session_spec(self, model_id: str) -> SessionSpec:
        """The session options a loaded model was created with."""
        return self._specs[model_id][0].session

    def describe(self) -> list[ModelStatus]:
        """What `GET /v1/models` answers: interface, providers, batching, counters."""
        with self._lock:
            batchers = [(b, self._users[m], m in self._pinned) for m, b in self._batchers.items()]
        return [_describe(b, users, pinned) for b, users, pinned in batchers]

    def stop(self, timeout: float) -> bool:
        with self._lock:
            batchers = list(self._batchers.values())
        return all([b.stop(timeout) for b in batchers])

    # -- under the lock ----------------------------------------------------------------
    def _load(self, model_id: str, spec: ModelSpec, files: FilePolicy, where: str) -> None:
        def read_labels(path: Any) -> str:
            return files.read_labels(path, f"{where}.labels_file")

        try:
            loaded = load_model(model_id, spec, lambda p: p, read_text=read_labels)
        except ModelLoadError as exc:  # located where the config declares the model
            reason = str(exc).removeprefix(f"model {model_id!r}: ")
            raise ModelLoadError(f"{where}: {reason}") from exc
        batcher = ModelBatcher(loaded, spec.batching, self._observer(model_id))
        batcher.start()
        self._batchers[model_id] = batcher
        self._specs[model_id] = (spec, where)

    def _take(self, model_id: str, pin: bool) -> None:
        if pin:
            self._pinned.add(model_id)
        else:
            self._users[model_id] += 1
            # Each lease is a stream or a request that may submit: the batcher stops
            # waiting for company once all of them wait (batcher.py).
            self._batchers[model_id].set_producers(self._users[model_id])
        self._idle.pop(model_id, None)

    def _make_room(self, where: str) -> list[ModelBatcher]:
        """Release idle models until one more fits under max_models; LimitError if none
        is idle (every loaded model is in use)."""
        over = len(self._batchers) + 1 - self._max_models
        if over > len(self._idle):
            raise LimitError(
                "limits.max_models",
                self._max_models,
                f"{where}: {len(self._batchers)} models are loaded and in use",
            )
        return self._evict(over)

    def _evict(self, count: int) -> list[ModelBatcher]:
        released = []
        for _ in range(max(0, count)):
            model_id, _ = self._idle.popitem(last=False)
            released.append(self._batchers.pop(model_id))
            del self._specs[model_id], self._users[model_id]
            self._metrics.remove_model(model_id)
            if self.on_release is not None:
                self.on_release(model_id)
            log.info("model %r released (idle; limits.idle_models)", model_id)
        return released

    def _stop_released(self, released: list[ModelBatcher]) -> None:
        for batcher in released:  # outside the lock: stop joins the batcher's thread
            batcher.stop(STOP_TIMEOUT_S)

    def _observer(self, model_id: str) -> Callable[[BatchRecord], None]:
        run = self._metrics.model_inference.labels(model_id)
        queue = self._metrics.model_queue.labels(model_id)
        size = self._metrics.model_batch_size.labels(model_id)
        on_batch = self._on_batch

        def observe(rec: BatchRecord) -> None:
            run.observe(rec.run_s)
            size.observe(rec.batch_size)
            for wait in rec.queue_wait_s:
                queue.observe(wait)
            if on_batch is not None:
                on_batch(rec)

        return observe


def _describe(batcher: ModelBatcher, users: int, pinned: bool) -> ModelStatus:
    info = batcher.info

    def tensors(items: tuple[TensorInfo, ...]) -> list[Tensor]:
        return [Tensor(t.name, list(t.shape), t.dtype) for t in items]

    batching = batcher.batching
    return ModelStatus(
        id=info.id,
        path=info.path,
        decoder=info.decoder or None,
        labels=list(info.labels),
        inputs=tensors(info.inputs),
        outputs=tensors(info.outputs),
        providers=list(info.providers),
        batching=Batching(batching.max_batch_size, batching.max_queue_delay_ms),
        batches=batcher.batches,
        samples=batcher.samples,
        users=users,
        pinned=pinned,
    )


def _resolved(spec: ModelSpec, files: FilePolicy, where: str) -> ModelSpec:
    """The spec with checked, absolute paths, so equal models compare equal wherever
    declared; FileAccessError or LimitError for a path the policy refuses."""
    path = files.path(spec.path, FileKind.MODEL, f"{where}.path")
    labels_file = None
    if spec.labels_file is not None:
        labels_file = files.path(spec.labels_file, FileKind.LABELS, f"{where}.labels_file")
    return spec.model_copy(update={"path": path, "labels_file": labels_file})
