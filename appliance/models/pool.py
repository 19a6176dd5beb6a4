"""Every loaded model of a process, by id: one ONNX Runtime session and batcher each.

Models come from the config's `models:` and from workflows' own `models:`; the same id
declared twice with the same file and settings is loaded once. Declared with different
ones from two places, it is an error naming both; declared anew from the same place (the
config's `models.<id>`, or one key of one workflow file, edited and reloaded), the new
definition loads as the model's successor: new leases get it, while the old batcher
serves the leases it still has and is released when the last one ends.

Models are leased: a stream holds its workflow's models for its life, a request for its
call; leases are of one batcher each (`release` names the batchers). The config's models
are pinned. A model nobody leases is idle: up to `limits.idle_models` idle models stay
loaded for reuse (least recently used released first), so models that API workflows
declare do not pile up. At most `limits.max_models` are loaded at once; beyond that idle
ones are released, and when none is idle the load is refused with LimitError (a
successor is not counted: it replaces a model).

A reload `hold`s the pool while it checks the new config: replaced batchers are not
stopped meanwhile, so a failed or dry-run reload can `restore` them as they were.

After each batch the pool records the model's metrics (inference time, batch size, queue
waits) and then calls `on_batch`, the hook the runtime injects (its trace spans): the
models do not know about profiling.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from appliance.errors import LimitError
from appliance.models.batcher import BatchRecord, ModelBatcher
from appliance.models.errors import ModelLoadError, as_declared
from appliance.models.observers import batch_observer
from appliance.models.providers import resolve_session_paths
from appliance.models.session import PROCESS, LoadedModel, load_model
from appliance.models.tuned import ModelTuning, describe_tuning, tuned
from appliance.observe.metrics import Metrics
from appliance.observe.status import Batching, ModelStatus, Tensor
from appliance.policy.files import FileKind, FilePolicy
from pipelines.models import TensorInfo
from pipelines.spec import ModelSpec, SessionSpec

log = logging.getLogger("appliance.models")

STOP_TIMEOUT_S = 2.0  # a released model's batcher has no work left: it ends at once


class ModelConflictError(ModelLoadError):
    """One model id declared with two different definitions."""


@dataclass(eq=False)  # compared by identity: two loads of one spec are two entries
class _Loaded:
    """One loaded definition of a model and its leases."""

    model_id: str
    batcher: ModelBatcher
    declared: ModelSpec  # as declared, resolved: absolute paths
    spec: ModelSpec  # what runs: `declared` with the config's `tuning:` over it
    where: str  # where it was declared, for messages
    place: str  # what declared it, to tell a redeclaration; "": cannot be redeclared
    open_model: Callable[[ModelSpec], LoadedModel]  # the file again, other options
    users: int = 0
    pinned: bool = False
    # Of `users`, the leases that submit now and then (a shadow's sampled frames): the
    # batcher does not wait for them (set_occasional).
    occasional: int = 0

    def producers(self) -> int:
        """The leases the batcher waits for: every user but the occasional ones (at least
        one while it has users, so a model only a shadow runs still runs inline)."""
        return max(min(self.users, 1), self.users - self.occasional)


class ModelPool:
    @dataclass(frozen=True, eq=False)
    class Hold:
        """The models current when `hold` was called (what `restore` goes back to)."""

        entries: Mapping[str, _Loaded]

    def __init__(
        self,
        metrics: Metrics,
        *,
        on_batch: Callable[[BatchRecord], None] | None = None,
        max_models: int = 16,
        idle_models: int = 2,
    ) -> None:
        self._metrics = metrics
        # Every model's batches, after each run: on the model's batcher thread, or
        # on a stream's for an inline run (BatchRecord.model_id).
        self._on_batch = on_batch
        self._max_models = max_models
        self._idle_models = idle_models
        # Told the id of every model released or replaced (its batcher is no longer the
        # current one), under the pool's lock (it must not call back into the pool).
        self.on_release: Callable[[str], None] | None = None
        self._current: dict[str, _Loaded] = {}
        self._batchers: dict[str, ModelBatcher] = {}  # id -> the current entry's batcher
        self._retired: list[_Loaded] = []  # replaced, still leased (or held)
        self._loaded: dict[ModelBatcher, _Loaded] = {}  # current and retired
        self._idle: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self._holds = 0  # while > 0, retired batchers nobody leases are not stopped yet
        self._tuning: Mapping[str, ModelTuning] = {}  # the config's `tuning.models`
        self._lock = threading.Lock()

    @property
    def handles(self) -> Mapping[str, ModelBatcher]:
        """Each model's current batcher, by id."""
        return self._batchers

    def ensure(
        self,
        model_id: str,
        spec: ModelSpec,
        files: FilePolicy,
        where: str,
        *,
        pin: bool = False,
        place: str | None = None,
    ) -> ModelBatcher:
        """The running batcher for this model, loading it on first use, leased once to
        the caller (`release` it); or pinned: the config's models are never released.

        `place` (default: `where`) is what declares it: declared differently from the
        same place, the new definition loads as the model's successor; from another
        place (or an empty `place`: an inline document), ModelConflictError."""
        resolved = _resolved(spec, files, where)
        shown = _names(spec, resolved)
        place = where if place is None else place
        released: list[ModelBatcher] = []
        try:
            with self._lock:
                known = self._current.get(model_id)
                if known is None:
                    released = self._make_room(where)
                    loaded = self._load(model_id, resolved, files, where, place, shown)
                    self._make_current(loaded)
                elif known.declared != resolved:
                    if not place or known.place != place:
                        raise ModelConflictError(
                            f"{where}: model {model_id!r} is already declared differently "
                            f"at {known.where}"
                        )
                    # Loaded first: a definition that fails to load replaces nothing.
                    successor = self._load(model_id, resolved, files, where, place, shown)
                    released = self._succeed(known, successor)
                self._take(model_id, pin)
                return self._batchers[model_id]
        finally:
            self._stop_released(released)

    def acquire(self, expected: Mapping[str, ModelBatcher]) -> bool:
        """Lease these models if each id still runs the batcher given; False (nothing
        leased) when one was released or replaced since, e.g. a cached workflow that
        must recompile."""
        with self._lock:
            if any(self._batchers.get(m) is not b for m, b in expected.items()):
                return False
            for model_id in expected:
                self._take(model_id, pin=False)
            return True

    def set_occasional(
        self, batchers: Iterable[ModelBatcher], delta: int, stream_id: str = ""
    ) -> None:
        """Mark leases of these batchers as occasional (+1) or not any more (-1): a
        shadow's, which samples some of `stream_id`'s frames. Counted as producers, it
        would make every batch wait out `max_queue_delay_ms` for a sample that seldom
        comes, and a lone stream's runs leave its thread for the batcher's. The shadow and
        that stream's live workflow share each frame's run of the model meanwhile."""
        with self._lock:
            for batcher in batchers:
                entry = self._loaded.get(batcher)
                if entry is not None:
                    entry.occasional = max(0, entry.occasional + delta)
                    batcher.set_producers(entry.producers())
                    batcher.shared.share(stream_id, delta)

    def release(self, batchers: Iterable[ModelBatcher]) -> None:
        """End one lease of each batcher: an unleased current model becomes idle (the
        oldest idle released), an unleased replaced one is released."""
        released: list[ModelBatcher] = []
        with self._lock:
            for batcher in batchers:
                entry = self._loaded.get(batcher)
                if entry is None:
                    continue  # released already: nothing leased it any more
                if entry.users > 0:
                    entry.users -= 1
                    batcher.set_producers(entry.producers())
                if entry.users > 0:
                    continue
                if self._current.get(entry.model_id) is entry:
                    if not entry.pinned:
                        self._idle[entry.model_id] = None
                        self._idle.move_to_end(entry.model_id)
                elif self._holds == 0:
                    released.append(self._release_retired(entry))
            released += self._evict(len(self._idle) - self._idle_models)
        self._stop_released(released)

    def hold(self) -> ModelPool.Hold:
        """Keep every replaced batcher loaded until `unhold`, leased or not, so that
        `restore` can go back to the models current now."""
        with self._lock:
            self._holds += 1
            return ModelPool.Hold(dict(self._current))

    def restore(self, hold: ModelPool.Hold) -> None:
        """Make the models current at `hold` current again where a successor replaced
        them since (the successor is retired: released once unleased and unheld)."""
        with self._lock:
            for model_id, old in hold.entries.items():
                now = self._current.get(model_id)
                if now is old or old not in self._retired:
                    continue  # not replaced (or, unheld, released since)
                self._retired.remove(old)
                self._idle.pop(model_id, None)
                if now is not None:
                    self._retired.append(now)
                self._make_current(old)
                if old.users == 0 and not old.pinned:
                    self._idle[model_id] = None
                self._notify(model_id)
                log.info("model %r: back to its definition at %s", model_id, old.where)

    def unhold(self, hold: ModelPool.Hold) -> None:
        """End `hold`: replaced batchers nobody leases any more are released."""
        with self._lock:
            self._holds -= 1
            done = [] if self._holds else [e for e in self._retired if e.users == 0]
            released = [self._release_retired(entry) for entry in done]
        self._stop_released(released)

    def retune(self, tuning: Mapping[str, ModelTuning]) -> list[str]:
        """Run every model, and those loaded later, with `tuning` over its declaration:
        batching at once, session options on the file opened again and swapped in; leases
        and waiting samples untouched. The ids changed; ModelLoadError when one does not
        open (those before it have changed: the caller retunes back)."""
        with self._lock:
            self._tuning = dict(tuning)
            entries = list(self._current.values())
        changed = []
        for entry in entries:
            spec = tuned(entry.declared, tuning.get(entry.model_id))
            if spec == entry.spec:
                continue
            opened = entry.spec.session, entry.spec.providers
            model = None if (spec.session, spec.providers) == opened else entry.open_model(spec)
            entry.batcher.retune(spec.batching, model)
            entry.spec = spec
            changed.append(entry.model_id)
            log.info("model %r: tuned (%s)", entry.model_id, describe_tuning(entry.declared, spec))
        return changed

    def specs(self) -> dict[str, tuple[ModelSpec, int | None]]:
        """Each current model's spec as it runs (tuning applied) and the batch size its
        input fixes (None: any)."""
        with self._lock:
            entries = list(self._current.values())
        return {e.model_id: (e.spec, e.batcher.info.input.fixed_batch) for e in entries}

    def session_spec(self, model_id: str) -> SessionSpec:
        """The session options a loaded model was created with."""
        return self._current[model_id].spec.session

    def describe(self) -> list[ModelStatus]:
        """What `GET /v1/models` answers: interface, providers, batching, counters."""
        with self._lock:
            entries = [(e.batcher, e.users, e.pinned) for e in self._current.values()]
        return [_describe(b, users, pinned) for b, users, pinned in entries]

    def stop(self, timeout: float) -> bool:
        with self._lock:
            batchers = list(self._loaded)
        return all([b.stop(timeout) for b in batchers])

    # -- under the lock ----------------------------------------------------------------
    def _load(
        self,
        model_id: str,
        declared: ModelSpec,
        files: FilePolicy,
        where: str,
        place: str,
        shown: Mapping[str, str],
    ) -> _Loaded:
        """`shown`: each checked path of `declared` -> the name it was declared by, which
        messages use (a request's answer names no folder of the host)."""

        def read_labels(path: Any) -> str:  # by its declared name: the same file, checked
            return files.read_labels(shown.get(str(path), path), f"{where}.labels_file")

        def open_model(spec: ModelSpec) -> LoadedModel:
            try:
                return load_model(
                    model_id,
                    spec,
                    lambda p: p,
                    read_text=read_labels,
                    cache_dir=PROCESS.model_cache,
                )
            except ModelLoadError as exc:  # located where the config declares the model
                reason = as_declared(str(exc).removeprefix(f"model {model_id!r}: "), shown)
                raise ModelLoadError(f"{where}: {reason}") from exc

        spec = tuned(declared, self._tuning.get(model_id))
        batcher = ModelBatcher(open_model(spec), spec.batching, self._observer(model_id))
        batcher.start()
        entry = _Loaded(model_id, batcher, declared, spec, where, place, open_model)
        self._loaded[batcher] = entry
        return entry

    def _make_current(self, entry: _Loaded) -> None:
        self._current[entry.model_id] = entry
        self._batchers[entry.model_id] = entry.batcher

    def _succeed(self, old: _Loaded, new: _Loaded) -> list[ModelBatcher]:
        """`new` replaces `old`: old keeps its leases and is released when they (and
        any hold) end; an idle one at once. Returns the batchers to stop."""
        self._idle.pop(old.model_id, None)
        self._make_current(new)
        self._retired.append(old)
        self._notify(old.model_id)  # compilations bound to the old batcher: stale
        log.info(
            "model %r: loaded anew (%s changed); the old one serves its %d leases",
            old.model_id,
            new.where,
            old.users,
        )
        if old.users or self._holds:
            return []
        return [self._release_retired(old)]

    def _release_retired(self, entry: _Loaded) -> ModelBatcher:
        self._retired.remove(entry)
        del self._loaded[entry.batcher]
        self._forget_metrics(entry.model_id)
        self._notify(entry.model_id)
        log.info("model %r: its replaced definition (%s) released", entry.model_id, entry.where)
        return entry.batcher

    def _take(self, model_id: str, pin: bool) -> None:
        entry = self._current[model_id]
        if pin:
            entry.pinned = True
        else:
            entry.users += 1
            # Each lease is a stream or a request that may submit: the batcher stops
            # waiting for company once all of them wait (batcher.py).
            entry.batcher.set_producers(entry.producers())
        self._idle.pop(model_id, None)

    def _make_room(self, where: str) -> list[ModelBatcher]:
        """Release idle models until one more fits under max_models; LimitError if none
        is idle (every loaded model is in use)."""
        over = len(self._loaded) + 1 - self._max_models
        if over > len(self._idle):
            raise LimitError(
                "limits.max_models",
                self._max_models,
                f"{where}: {len(self._loaded)} models are loaded and in use",
            )
        return self._evict(over)

    def _evict(self, count: int) -> list[ModelBatcher]:
        released = []
        for _ in range(max(0, count)):
            model_id, _ = self._idle.popitem(last=False)
            entry = self._current.pop(model_id)
            del self._batchers[model_id], self._loaded[entry.batcher]
            released.append(entry.batcher)
            self._forget_metrics(model_id)
            self._notify(model_id)
            log.info("model %r released (idle; limits.idle_models)", model_id)
        return released

    def _forget_metrics(self, model_id: str) -> None:
        """Drop the id's series once no batcher of it is left: they are labelled by id
        only, so a successor (or a predecessor still serving) records into them too."""
        if model_id not in self._current and all(e.model_id != model_id for e in self._retired):
            self._metrics.remove_model(model_id)

    def _notify(self, model_id: str) -> None:
        if self.on_release is not None:
            self.on_release(model_id)

    def _stop_released(self, released: list[ModelBatcher]) -> None:
        for batcher in released:  # outside the lock: stop joins the batcher's thread
            batcher.stop(STOP_TIMEOUT_S)

    def _observer(self, model_id: str) -> Callable[[BatchRecord], None]:
        return batch_observer(self._metrics, model_id, self._on_batch)


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
        preprocess="host" if info.prologue is None else "graph",
    )


def _names(declared: ModelSpec, resolved: ModelSpec) -> dict[str, str]:
    """Each checked, absolute path of `resolved` -> its name in `declared`."""
    pairs = [(resolved.path, declared.path), (resolved.labels_file, declared.labels_file)]
    return {str(path): str(name) for path, name in pairs if path is not None}


def _resolved(spec: ModelSpec, files: FilePolicy, where: str) -> ModelSpec:
    """The spec with checked, absolute paths, so equal models compare equal wherever
    declared; FileAccessError or LimitError for a path the policy refuses."""
    path = files.path(spec.path, FileKind.MODEL, f"{where}.path")
    labels_file = None
    if spec.labels_file is not None:
        labels_file = files.path(spec.labels_file, FileKind.LABELS, f"{where}.labels_file")
    resolved = spec.model_copy(update={"path": path, "labels_file": labels_file})
    return resolve_session_paths(resolved, files, where)
