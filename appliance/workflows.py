"""Compiled workflows of a runtime: compile once per distinct document, and lease the
models each compilation runs to whoever uses it (a stream, a request).

Compilations are cached by digest, least recently used out past `size`, since API calls
may bring any number of inline workflows (running streams hold their own reference).
Each entry keeps the batchers it was bound to: a model released and loaded again is
another batcher, and a workflow bound to the old one must compile again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from appliance.errors import FileAccessError, LimitError
from appliance.files import FileKind, FilePolicy
from appliance.models import ModelBatcher, ModelLoadError
from appliance.models.pool import ModelPool
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
        document, origin, base = workflow_document(files, workflow, where)
        try:
            spec = parse_workflow(document, self._max_blocks)
            digest = workflow_digest(spec)
            cached = self._cached(digest)
            if cached is not None:
                return cached
            compiled = self._compile(spec, files.at(base), origin, unavailable)
        except TooManyBlocksError as exc:
            message = f"{origin}: workflow {exc.name!r} has {exc.count} blocks"
            raise LimitError("limits.max_blocks", exc.limit, message, status=413) from None
        except WorkflowError as exc:
            name = f"{origin}: workflow {exc.name!r}"
            raise WorkflowError(exc.problems, name, exc.follow_ons) from None
        with self._lock:
            self._entries[digest] = (compiled, self._bound(compiled))
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return compiled

    def release(self, workflow: CompiledWorkflow) -> None:
        """End the lease `compile` gave on the workflow's models."""
        self._pool.release(workflow.models)

    def forget_model(self, model_id: str) -> None:
        """A model was released: compilations bound to its batcher must not be reused."""
        with self._lock:  # called inside the pool's lock: never taken the other way round
            stale = [d for d, (_, bound) in self._entries.items() if model_id in bound]
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
        self, spec: WorkflowSpec, files: FilePolicy, origin: str, unavailable: frozenset[str]
    ) -> CompiledWorkflow:
        """Load the workflow's own models (each leased while it compiles), compile, and
        lease the models its blocks run. A model that does not load does not stop the
        compile: the workflow's own problems are reported with it, in one WorkflowError,
        and the blocks that name it are not (BuildContext.unavailable)."""
        declared: list[str] = []
        failures: list[Exception] = []
        try:
            for model_id, model in spec.models.items():
                try:
                    where = f"{origin} models.{model_id}".lstrip()  # an inline doc: no origin
                    self._pool.ensure(model_id, model, files, where)
                except MODEL_FAILURES as exc:
                    failures.append(exc)
                    continue
                declared.append(model_id)
            failed = unavailable | {m for m in spec.models if m not in declared}
            context = BuildContext(models=self._pool.handles, unavailable=failed)
            try:
                compiled = compile_workflow(spec, context)
            except WorkflowError as exc:
                if not failures:
                    raise
                raise _models_failed(failures, exc.problems, origin, spec.name) from None
            if failures:
                raise _models_failed(failures, [], origin, spec.name)
            if not self._pool.acquire(self._bound(compiled)):
                raise AssertionError("unreachable: the workflow's models are leased")
            return compiled
        finally:
            self._pool.release(declared)

    def _bound(self, compiled: CompiledWorkflow) -> dict[str, ModelBatcher]:
        return {m: self._pool.handles[m] for m in compiled.models}


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
    if isinstance(workflow, Path):
        path = files.path(workflow, FileKind.WORKFLOW, where)
        text = files.read_text(path, FileKind.WORKFLOW, where)
        origin = f"{where} ({path})" if where else str(path)
        return parse_workflow_text(text, origin), origin, path.parent
    return workflow, where, files.base
