"""Workflow spec -> CompiledWorkflow: validate, resolve, type-check, order, bind.

Problems are collected, not first-only: one WorkflowError lists every problem with its
location and, where it helps, a hint (`blocks[1].image: unknown block 'peple' (did you
mean 'people'?)`).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from pipelines import graph
from pipelines.blocks.base import (
    LIKE,
    OPTIONAL,
    BlockBuildError,
    BlockType,
    BuildContext,
    Kind,
    ModelUnavailableError,
)
from pipelines.errors import (
    TooManyBlocksError,
    WorkflowError,
    format_location,
    pydantic_message,
)
from pipelines.executor import (
    FIRST_FREE_SLOT,
    FRAME_SLOT,
    IMAGE_SLOT,
    NONE_SLOT,
    CompiledWorkflow,
    Step,
)
from pipelines.geometry import region_of
from pipelines.registry import DEFAULT_REGISTRY, BlockImportError, BlockRegistry
from pipelines.spec import RESERVED_IDS, BlockSpec, WorkflowSpec

FRAME_REF = "frame"
# Names compared for did-you-mean hints in one compilation (a few µs each): every hint
# for a workflow of a few misspellings, a bounded ~12 ms for one of hundreds.
HINT_COMPARISONS = 2048
SUBKINDS = frozenset({("tracks", "detections")})  # (got, wanted): tracks are detections with ids


@dataclass
class _Node:
    """A block during compilation: its spec, type, params and resolved input slots."""

    index: int
    spec: BlockSpec
    cls: type[BlockType]
    params: Any = None
    refs: dict[str, str | None] = field(default_factory=dict)  # input -> reference; None: absent
    args: list[int] = field(default_factory=list)
    deps: set[str] = field(default_factory=set)
    outs: dict[str, int] = field(default_factory=dict)  # output name -> slot


class _Compilation:
    def __init__(self, registry: BlockRegistry) -> None:
        self.registry = registry
        self.problems: list[str] = []
        self.nodes: dict[str, _Node] = {}
        # Blocks already reported (unknown type, plugin that did not import): a reference
        # to one is not reported again, one root cause gives one message.
        self.broken: set[str] = set()
        self.follow_ons: list[str] = []  # blocks naming a model that did not load
        self.kinds: dict[tuple[str, str], Kind] = {}  # (block, output) -> kind, once known
        self.hint_budget = HINT_COMPARISONS

    def error(self, where: str, message: str) -> None:
        self.problems.append(f"{where}: {message}")

    def hint(self, name: str, candidates: list[str]) -> str:
        """A did-you-mean while the compilation's budget of compared names lasts: each
        costs a difflib ratio, and n misspelt references among n blocks would be n²."""
        if len(candidates) > self.hint_budget:
            return ""
        self.hint_budget -= len(candidates)
        return _hint(name, candidates)

    # -- pass 1: every block's type, parameters and input references ---------------
    def declare(self, blocks: list[BlockSpec]) -> None:
        slot = FIRST_FREE_SLOT
        first_at: dict[str, int] = {}
        for i, spec in enumerate(blocks):
            where = f"blocks[{i}]"
            if spec.id in RESERVED_IDS:
                self.error(f"{where}.id", f"{spec.id!r} is reserved (it names the input frame)")
                continue
            if spec.id in first_at:
                self.error(
                    f"{where}.id",
                    f"duplicate id {spec.id!r} (first at blocks[{first_at[spec.id]}])",
                )
                continue
            first_at[spec.id] = i
            cls = self._block_class(where, spec.type)
            if cls is None:
                self.broken.add(spec.id)
                continue
            node = _Node(i, spec, cls)
            self._split_params(node, where)
            for name in cls.outputs:
                node.outs[name] = slot
                slot += 1
            self.nodes[spec.id] = node
        self.n_slots = slot

    def _block_class(self, where: str, type_name: str) -> type[BlockType] | None:
        if type_name not in self.registry:
            names = self.registry.names()
            hint = self.hint(type_name, names) or f" (known: {', '.join(names)})"
            self.error(f"{where}.type", f"unknown block type {type_name!r}{hint}")
            return None
        try:
            return self.registry.get(type_name)
        except BlockImportError as exc:
            self.error(f"{where}.type", str(exc))
            return None

    def _split_params(self, node: _Node, where: str) -> None:
        raw = node.spec.params
        for name, (_kind, default) in node.cls.inputs.items():
            ref = raw.pop(name, default)
            if ref == OPTIONAL:
                node.refs[name] = None
            elif ref is None:
                self.error(f"{where}.{name}", "required input is missing")
            elif not isinstance(ref, str):
                got = type(ref).__name__
                self.error(
                    f"{where}.{name}", f"expected a reference like 'block.output', got {got}"
                )
            else:
                node.refs[name] = ref
        try:
            node.params = node.cls.Params.model_validate(raw)
        except ValidationError as exc:
            known = node.cls.Params.model_fields
            for e in exc.errors():
                self.error(format_location((where, *e["loc"])), pydantic_message(e, known))

    # -- pass 2: references -> slots, with kinds checked ----------------------------
    def resolve(self) -> None:
        for node in self.nodes.values():
            where = f"blocks[{node.index}]"
            for name, ref in node.refs.items():
                if ref is None:
                    node.args.append(NONE_SLOT)
                    continue
                want = node.cls.inputs[name][0]
                found = self.lookup(f"{where}.{name}", ref, want)
                if found is not None:
                    slot, dep = found
                    node.args.append(slot)
                    if dep:
                        node.deps.add(dep)
            if node.cls.wants_frame:
                node.args.append(FRAME_SLOT)

    def lookup(self, where: str, ref: str, want: Kind) -> tuple[int, str | None] | None:
        """The slot a reference names and the block it depends on, or None (error noted)."""
        if ref == FRAME_REF:
            return self._check_kind(where, ref, "image", want, (IMAGE_SLOT, None))
        block_id, _, out_name = ref.partition(".")
        node = self.nodes.get(block_id)
        if node is None:
            if block_id in self.broken:
                return None  # its own problem is reported
            self.error(
                where, f"unknown block {block_id!r}{self.hint(block_id, [*self.nodes, FRAME_REF])}"
            )
            return None
        out_name = out_name or next(iter(node.cls.outputs), "")
        if out_name not in node.outs:
            outs = ", ".join(node.cls.outputs) or "none"
            self.error(where, f"block {block_id!r} has no output {out_name!r} (outputs: {outs})")
            return None
        got = self.out_kind(node, out_name)
        return self._check_kind(where, ref, got, want, (node.outs[out_name], block_id))

    def out_kind(self, node: _Node, out_name: str) -> Kind:
        """An output's kind; `like:<input>` follows that input's reference back to a
        declared kind (`any` for a broken or circular chain). Iterative and memoized: a
        chain of n pass-through blocks costs O(n) once, not once per reference to it."""
        path: dict[tuple[str, str], None] = {}  # outputs whose kind is the chain's end
        key = (node.spec.id, out_name)
        while True:
            if key in self.kinds:
                kind = self.kinds[key]
                break
            if key in path:  # a circle of pass-throughs: order() reports it
                kind = "any"
                break
            path[key] = None
            step = self._kind_or_source(self.nodes[key[0]], key[1])
            if not isinstance(step, tuple):
                kind = step
                break
            key = step
        for waiting in path:
            self.kinds[waiting] = kind
        return kind

    def _kind_or_source(self, node: _Node, out_name: str) -> Kind | tuple[str, str]:
        """An output's kind, or for `like:<input>` the (block, output) that input reads."""
        declared = node.cls.outputs[out_name]
        if not declared.startswith(LIKE):
            return declared  # type: ignore[return-value]  # a Kind, by BlockType's contract
        ref = node.refs.get(declared.removeprefix(LIKE))
        if ref is None:
            return "any"
        if ref == FRAME_REF:
            return "image"
        source_id, _, source_out = ref.partition(".")
        source = self.nodes.get(source_id)
        if source is None:
            return "any"
        source_out = source_out or next(iter(source.cls.outputs), "")
        if source_out not in source.cls.outputs:
            return "any"
        return source_id, source_out

    def _check_kind(
        self, where: str, ref: str, got: Kind, want: Kind, found: tuple[int, str | None]
    ) -> tuple[int, str | None] | None:
        if want not in ("any", got) and got != "any" and (got, want) not in SUBKINDS:
            self.error(where, f"expected {want}, got {got} from {ref!r}")
            return None
        return found

    # -- pass 3: order and bind ------------------------------------------------------
    def order(self) -> list[_Node]:
        """Kahn's topological sort by levels, file order within a level (pipelines.graph);
        blocks left over sit on or behind a cycle: each cycle is an error."""
        ordered, left = graph.levels({bid: node.deps for bid, node in self.nodes.items()})
        for cycle in graph.cycles(left):
            first = self.nodes[cycle[0]]
            self.error(f"blocks[{first.index}]", "cycle " + " → ".join([*cycle, cycle[0]]))
        return [self.nodes[bid] for bid in ordered]

    def bind(self, ordered: list[_Node], ctx: BuildContext) -> list[Step]:
        steps = []
        position = {node.spec.id: i for i, node in enumerate(ordered)}
        for node in ordered:
            where = f"blocks[{node.index}]"
            try:
                factory = node.cls.build(node.params, ctx)
            except ModelUnavailableError as exc:
                self.follow_ons.append(f"{where}.{exc.field}: {exc}")
                continue
            except BlockBuildError as exc:
                self.error(f"{where}.{exc.field}" if exc.field else where, str(exc))
                continue
            except ValueError as exc:  # e.g. a decoder that does not fit its model
                self.error(where, str(exc))
                continue
            except Exception as exc:  # a plugin's build may raise anything: name the block
                self.error(where, f"block type {node.spec.type!r} failed to build: {exc!r}")
                continue
            deps = tuple(sorted(position[d] for d in node.deps))
            outs = tuple(node.outs.values())
            spec, args = node.spec, tuple(node.args)
            steps.append(Step(spec.id, spec.type, factory, args, outs, deps, node.cls.draws))
        return steps


def compile_workflow(
    source: WorkflowSpec | Mapping[str, Any],
    ctx: BuildContext,
    registry: BlockRegistry = DEFAULT_REGISTRY,
    *,
    max_blocks: int | None = None,
) -> CompiledWorkflow:
    """Compile a workflow; raises WorkflowError listing every problem found, or
    TooManyBlocksError past `max_blocks` (None: no cap; every pass is linear in blocks
    and references, the cap bounds the work a document can ask for)."""
    spec = parse_workflow(source, max_blocks)
    comp = _Compilation(registry)
    comp.declare(spec.blocks)
    comp.resolve()
    outputs = _resolve_outputs(comp, spec.outputs)
    if not comp.problems:  # a broken reference leaves its source unread: not a second fault
        _check_unused(comp, {slot for _, slot in outputs})
    ordered = comp.order()
    if comp.problems:
        raise WorkflowError(comp.problems, spec.name)
    steps = comp.bind(ordered, ctx)
    if comp.problems or comp.follow_ons:
        raise WorkflowError(comp.problems, spec.name, comp.follow_ons)
    video = dict(outputs).get("video", IMAGE_SLOT)
    gated = any(node.cls.may_skip for node in ordered)
    digest = workflow_digest(spec)
    compiled = CompiledWorkflow(spec.name, digest, steps, outputs, video, comp.n_slots, gated)
    # The models its blocks run (every model-running block names it `model`).
    compiled.block_models = {
        n.spec.id: m for n in ordered if isinstance(m := getattr(n.params, "model", None), str)
    }
    compiled.models = tuple(sorted(set(compiled.block_models.values())))
    regions = (region_of(n.spec.id, n.params) for n in ordered)
    compiled.regions = tuple(r for r in regions if r is not None)
    return compiled


def parse_workflow(
    source: WorkflowSpec | Mapping[str, Any],
    max_blocks: int | None = None,
    *,
    quote: bool = True,
) -> WorkflowSpec:
    """Validate the document's structure; raises WorkflowError with locations, or
    TooManyBlocksError (counted before anything else is validated) past `max_blocks`.

    `quote` False: the document is a file whose content the caller may not see (one a
    request named): until it is found to be a workflow, problems quote nothing of it (no
    value it holds, nor its name), and a mapping with keys a workflow does not have is
    said to be no workflow without naming them."""
    if isinstance(source, WorkflowSpec):
        _check_count(source.blocks, source.name, max_blocks)
        return source
    if not isinstance(source, Mapping):
        raise WorkflowError([f"(top): expected a mapping, got {type(source).__name__}"])
    name = source.get("name") if quote and isinstance(source.get("name"), str) else "workflow"
    _check_count(source.get("blocks"), name, max_blocks)
    if not quote:
        _check_fields(source)
    try:
        return WorkflowSpec.model_validate(source)
    except ValidationError as exc:
        problems = [
            f"{format_location(e['loc'])}: {pydantic_message(e, show_input=quote)}"
            for e in exc.errors()
        ]
        raise WorkflowError(problems, str(name)) from None


def _check_fields(source: Mapping[str, Any]) -> None:
    """A document with keys that are no workflow's: no workflow, its keys not named."""
    unknown = [key for key in source if key not in WorkflowSpec.model_fields]
    if unknown:
        fields = ", ".join(WorkflowSpec.model_fields)
        raise WorkflowError(
            [f"(top): not a workflow: {len(unknown)} key(s) that a workflow has not ({fields})"]
        )


def _check_count(blocks: object, name: object, max_blocks: int | None) -> None:
    if max_blocks is not None and isinstance(blocks, list) and len(blocks) > max_blocks:
        raise TooManyBlocksError(
            len(blocks), max_blocks, name if isinstance(name, str) else "workflow"
        )


def workflow_digest(spec: WorkflowSpec) -> str:
    """sha256 of the normalised document: equal workflows share one compilation."""
    text = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _resolve_outputs(comp: _Compilation, outputs: Mapping[str, str]) -> list[tuple[str, int]]:
    if not outputs:
        comp.error("outputs", "at least one output is required (e.g. `people: people`)")
    resolved = []
    for name, ref in outputs.items():
        want: Kind = "image" if name == "video" else "any"
        found = comp.lookup(f"outputs.{name}", ref, want)
        if found is not None:
            resolved.append((name, found[0]))
    return resolved


def _check_unused(comp: _Compilation, output_slots: set[int]) -> None:
    """A block whose outputs nothing reads is work for nothing: an error, with a hint."""
    read = set(output_slots)
    for node in comp.nodes.values():
        read.update(node.args)
    for node in comp.nodes.values():
        if node.outs and not read.intersection(node.outs.values()):
            comp.error(
                f"blocks[{node.index}]",
                f"the output of {node.spec.id!r} is never used "
                f"(use it in another block or in `outputs`, or remove the block)",
            )


def _hint(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
