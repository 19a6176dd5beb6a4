"""Compiled workflows of a runtime: compile once per distinct document, and lease the
models each compilation runs to whoever uses it (a stream, a request).

Compilations are cached by digest, least recently used out past `size`, since API calls
may bring any number of inline workflows (running streams hold their own reference).
Each compilation keeps the batchers it was bound to: a model released and loaded again,
or replaced by a new definition (a reloaded workflow file), is another batcher, and a
workflow bound to the old one must compile again. A lease is on those batchers: the
release of a workflow bound to a replaced model ends a lease on the replaced one.

A workflow file's own models are declared from a place, the file and the model's key:
declared differently from there again (the file edited), the model is loaded anew
(ModelPool.ensure). An inline document's models have no place to be declared from again.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from appliance.errors import FileAccessError, LimitError
from appliance.models import ModelBatcher, ModelLoadError
from appliance.models.pool import ModelPool
from appliance.policy.files import FileKind, FilePolicy
from pipelines.blocks.base import BuildContext
from pipelines.compiler import compile_workflow, parse_workflow, workflow_digest
from pipelines.errors import TooManyBlocksError, WorkflowError
from pipelines.executor import CompiledWorkflow
from pipelines.spec import WorkflowSpec, parse_workflow_text

CACHE_SIZE = 256  # distinct compiled workflows kept for reuse
# What a workflow's own model may fail with: reported with the workflow's other problems.
MODEL_FAILURES = (ModelLoadError, FileAccessError, LimitError)

WorkflowRef = Path | Mapping[str, Any]  # a file, or an inline document
_Entry = tuple[CompiledWorkflow, dict[str, ModelBatcher]]


class WorkflowCache:
    """`compile` leases, `release` ends the lease; `forget_model` is the pool's callback."""

    def __init__(
        self, pool: ModelPool, size: int = CACHE_SIZE, max_blocks: int | None = None
    ) -> None:
        self._pool = pool
        self._size = size
        self._max_blocks = max_blocks  # limits.max_blocks: counted before anything is validated
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        # Every compilation handed out -> the batchers it runs (what its leases are on).
        self._bindings: weakref.WeakKeyDictionary[CompiledWorkflow, dict[str, ModelBatcher]]
        self._bindings = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def compile(
        self,
        workflow: WorkflowRef,
        where: str,
        files: FilePolicy,
        unavailable: frozenset[str] = frozenset(),
    ) -> CompiledWorkflow:
        """Compile (or reuse) a workflow, loading the models it declares itself, and lease
        its models to the caller. `files` is the policy its paths go through;
        `unavailable`, models whose failure to load was reported already (BuildContext).

        WorkflowError and ModelLoadError name `where` and, for files, the file;
        FileAccessError and LimitError name the rule or limit (limits.max_blocks: the
        workflow's block count, refused before any other work on it).
        """
        document, origin, base, path = read_workflow(files, workflow, where)
        # A file a request named is quoted in no problem until it is found a workflow.
        quote = path is None or not files.restricted
        try:
            spec = parse_workflow(document, self._max_blocks, quote=quote)
            digest = workflow_digest(spec)
            cached = self._cached(digest)
            if cached is not None:
                return cached
            # A file's model is declared from the file and its key, however it is named.
            place = "" if path is None else f"{path} models."
            compiled, bound = self._compile(spec, files.at(base), origin, unavailable, place)
        except TooManyBlocksError as exc:
            message = f"{origin}: workflow {exc.name!r} has {exc.count} blocks"
            raise LimitError("limits.max_blocks", exc.limit, message, status=413) from None
        except WorkflowError as exc:
            name = f"{origin}: workflow {exc.name!r}"
            raise WorkflowError(exc.problems, name, exc.follow_ons) from None
        with self._lock:
            self._entries[digest] = (compiled, bound)
            self._bindings[compiled] = bound
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return compiled

    def bound(self, workflow: CompiledWorkflow) -> list[ModelBatcher]:
        """The batchers a compilation handed out here runs (its models' now, otherwise)."""
        with self._lock:
            bound = self._bindings.get(workflow)
        if bound is None:
            handles = self._pool.handles
            return [handles[m] for m in workflow.models if m in handles]
        return list(bound.values())

    def release(self, workflow: CompiledWorkflow) -> None:
        """End the lease `compile` gave on the workflow's models: on the batchers it was
        bound to, even where a model was replaced since."""
        with self._lock:
            bound = self._bindings.get(workflow)
        if bound is None:  # not compiled here: its models' current batchers
            handles = self._pool.handles
            bound = {m: handles[m] for m in workflow.models if m in handles}
        self._pool.release(bound.values())

    def forget_model(self, model_id: str) -> None:
        """A model was released or replaced: compilations bound to a batcher that is no
        longer its current one must not be reused."""
        current = self._pool.handles.get(model_id)  # the pool calls under its lock: settled
        with self._lock:  # called inside the pool's lock: never taken the other way round
            stale = [
                digest
                for digest, (_, bound) in self._entries.items()
                if model_id in bound and bound[model_id] is not current
            ]
            for digest in stale:
                del self._entries[digest]

    def _cached(self, digest: str) -> CompiledWorkflow | None:
        """A cached compilation, leased, if its models still run the batchers it bound."""
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            self._entries.move_to_end(digest)
        return entry[0] if self._pool.acquire(entry[1]) else None

    def _compile(
        self,
        spec: WorkflowSpec,
        files: FilePolicy,
        origin: str,
        unavailable: frozenset[str],
        place: str,
    ) -> tuple[CompiledWorkflow, dict[str, ModelBatcher]]:
        """Load the workflow's own models (each leased while it compiles), compile, and
        lease the models its blocks run; returns the compilation and those batchers. A
        model that does not load does not stop the compile: the workflow's own problems
        are reported with it, in one WorkflowError, and the blocks that name it are not
        (BuildContext.unavailable). `place`: the file's, a key's prefix ("": inline)."""
        declared: dict[str, ModelBatcher] = {}
        failures: list[Exception] = []
        try:
            for model_id, model in spec.models.items():
                try:
                    where = f"{origin} models.{model_id}".lstrip()  # an inline doc: no origin
                    key = place and f"{place}{model_id}"
                    declared[model_id] = self._pool.ensure(model_id, model, files, where, place=key)
                except MODEL_FAILURES as exc:
                    failures.append(exc)
                    continue
            failed = unavailable | {m for m in spec.models if m not in declared}
            # One view of the batchers, so the blocks run the ones the leases are on.
            handles = {**self._pool.handles, **declared}
            context = BuildContext(models=handles, unavailable=failed)
            try:
                compiled = compile_workflow(spec, context)
            except WorkflowError as exc:
                if not failures:
                    raise
                raise _models_failed(failures, exc.problems, origin, spec.name) from None
            if failures:
                raise _models_failed(failures, [], origin, spec.name)
            bound = {m: handles[m] for m in compiled.models}
            if not self._pool.acquire(bound):  # a config model replaced meanwhile (reload)
                raise ModelLoadError(f"{origin}: a model it runs was replaced; try again")
            return compiled, bound
        finally:
            self._pool.release(declared.values())


def _models_failed(
    failures: list[Exception], problems: list[str], origin: str, name: str
) -> Exception:
    """The workflow's own models that did not load, with its other `problems`: one
    model's failure alone as itself; else one WorkflowError listing them all."""
    if len(failures) == 1 and not problems:
        return failures[0]
    models = [str(f).removeprefix(f"{origin} ") for f in failures]
    return WorkflowError([*models, *problems], name)


def workflow_document(
    files: FilePolicy, workflow: WorkflowRef, where: str
) -> tuple[Mapping[str, Any], str, Path]:
    """(document, origin for messages, base directory for its relative paths); a file is
    read through `files`, the policy of whoever named it. An empty `where`: the file is
    the thing checked (`appliance validate wf.yaml`), its path is the origin."""
    document, origin, base, _ = read_workflow(files, workflow, where)
    return document, origin, base


def read_workflow(
    files: FilePolicy, workflow: WorkflowRef, where: str
) -> tuple[Mapping[str, Any], str, Path, Path | None]:
    """`workflow_document`'s answer and the file's checked path (None: inline)."""
    if isinstance(workflow, Path):
        path = files.path(workflow, FileKind.WORKFLOW, where)
        text = files.read_text(workflow, FileKind.WORKFLOW, where)
        # Named as given (relative to the config, or as the request wrote it): an answer
        # names no folder of the host. `path`, the checked one, is the file's identity.
        origin = f"{where} ({workflow})" if where else str(workflow)
        return parse_workflow_text(text, origin), origin, path.parent, path
    return workflow, where, files.base, None
