"""The workflow file as pydantic models: what a user writes, before compilation.

```yaml
name: people
blocks:
  - id: people            # unique name; other blocks and outputs refer to it
    type: detect          # a registered block type (`appliance blocks` lists them)
    model: person         # block parameters, validated by the block type's Params
    confidence: 0.5
outputs:                  # what leaves the workflow: name -> reference
  people: people          # `<block>` or `<block>.<output>`; `frame` is the input frame
```
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from pipelines.errors import WorkflowError

BLOCK_ID = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
RESERVED_IDS = frozenset({"frame"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchingSpec(_Strict):
    """Triton's dynamic batching: dispatch at `max_batch_size`, or when the oldest
    request has waited `max_queue_delay_ms` (0: take whatever is waiting)."""

    max_batch_size: Annotated[int, Field(ge=1, le=256)] = 4
    max_queue_delay_ms: Annotated[float, Field(ge=0, le=1000)] = 2.0
    # When nothing can batch with a sample (one stream holds the model, or
    # max_batch_size is 1), run it on the stream's own thread instead of handing it to
    # the batcher thread and back: two thread hand-offs less per frame. The trace keeps
    # `session.run` on the model's track. False: every sample goes through the batcher.
    inline: bool = True


GraphOptimization = Literal["disable", "basic", "extended", "all"]
Provider = Literal["tensorrt", "cuda", "cpu"]


class TensorRTSpec(_Strict):
    """TensorRT execution provider options (`providers: [tensorrt, ...]` only)."""

    # Where built engines are kept, so a restart does not rebuild them (minutes for a
    # large model); None: $XDG_CACHE_HOME/appliance/tensorrt (~/.cache/...). A folder the
    # file policy allows.
    engine_cache: Path | None = None
    fp16: bool = False  # build FP16 engines where the GPU supports them
    int8: bool = False  # INT8 needs a quantized (QDQ) model: one without is refused
    workspace_mb: Annotated[int, Field(ge=16, le=1 << 20)] | None = None  # None: TensorRT's


class CUDASpec(_Strict):
    """CUDA execution provider options (`providers: [cuda, ...]`, and TensorRT's fallback)."""

    device_id: Annotated[int, Field(ge=0, le=63)] = 0
    # CUDA graphs replay a captured run: less launch overhead, fixed shapes only (the
    # model's input size fixed or configured, and one batch size: a fixed batch dim or
    # batching.max_batch_size 1).
    graphs: bool = False


class SessionSpec(_Strict):
    intra_op_threads: Annotated[int, Field(ge=0)] = 0  # 0: ONNX Runtime's default
    inter_op_threads: Annotated[int, Field(ge=0)] = 0
    graph_optimization: GraphOptimization = "all"
    # ONNX Runtime's default: between operators (and for a while after a run) its idle
    # intra-op threads spin instead of sleeping. The price is idle CPU: below saturation
    # false gives the same frames for about half the CPU per frame, and on cores shared
    # with other work it gave more frames at saturation too (bench/spinning.py; figures in
    # docs/performance.md). False suits machines shared with other work.
    allow_spinning: bool = True
    # ONNX Runtime's CPU memory arena: it keeps the largest run's buffers for the next
    # runs, so a model batching 4 frames holds 4 frames' activations for good (the RSS
    # that grows with the streams until the batches are full: bench/memory.py). false:
    # buffers go back to the allocator after each run, for less memory at some CPU.
    memory_arena: bool = True
    # Run each batch size the model will see once at load, so the first frames do not
    # pay for allocation, kernel selection or engine builds (when the input size is known).
    # auto: on a GPU provider only. On the CPU a first run costs little (no kernel search,
    # no engine build), and a warm-up at a reload takes the cores from running streams
    # (in tests/watch, a CenterFace warm-up made the watch see unrelated blocks slower).
    warmup: bool | Literal["auto"] = "auto"
    tensorrt: TensorRTSpec = TensorRTSpec()
    cuda: CUDASpec = CUDASpec()


class ModelSpec(_Strict):
    """A model as a config's `models:` or a workflow's `models:` declares it.

    `decoder` names the output format for `detect` blocks (see pipelines.decoders);
    models used by other blocks (classify, ocr) need none.
    """

    path: Path
    decoder: str | None = None
    labels: list[str] | None = None
    labels_file: Path | None = None
    input_size: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] | None = None
    batching: BatchingSpec = BatchingSpec()
    providers: list[Provider] = Field(default_factory=lambda: ["cuda", "cpu"], min_length=1)  # type: ignore[arg-type]
    session: SessionSpec = SessionSpec()
    # Where the frame becomes the model's input tensor. graph: the model is composed with
    # a small ONNX prologue (cast, scale, channel order, layout) and fed uint8 NHWC
    # frames, so ONNX Runtime does the float work in its own threads or on the GPU;
    # host: numpy does it on the stream's thread; auto: graph when the decoder has one.
    preprocess: Literal["auto", "graph", "host"] = "auto"

    @field_validator("decoder")
    @classmethod
    def _known_decoder(cls, v: str | None) -> str | None:
        from pipelines.decoders import DECODERS  # the registry of output formats

        if v is not None and v not in DECODERS:
            # Not a ValueError that quotes `v`: pydantic_message shows the value it got,
            # where it may (a file a request named: not).
            known = ", ".join(sorted(DECODERS))
            raise PydanticCustomError("unknown_decoder", f"unknown decoder (known: {known})")
        return v


class BlockSpec(BaseModel):
    """One block: its id and type; every other key is a parameter or an input reference."""

    model_config = ConfigDict(extra="allow", frozen=True)

    id: Annotated[str, Field(pattern=BLOCK_ID)]
    type: Annotated[str, Field(min_length=1)]

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class WorkflowSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=128)] = "workflow"
    description: str = ""
    models: dict[str, ModelSpec] = Field(default_factory=dict)
    blocks: list[BlockSpec] = Field(default_factory=list)
    outputs: dict[str, str] = Field(default_factory=dict)


MAX_DOCUMENT_NODES = 1_000_000  # a workflow has hundreds; this only stops alias bombs


def load_yaml(text: str) -> Any:
    """Parse YAML (or JSON) text; ValueError naming the line and column of a syntax
    error, never quoting it (the text may be a file a request has no right to see).

    Anchors and aliases are allowed, but their expansion is bounded: a few hundred bytes
    of nested aliases ("billion laughs") expand to 10^9 nodes when the document is later
    walked, hashed or validated."""
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValueError(f"invalid YAML{at}: {_unquoted(exc.problem or exc.context)}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"invalid YAML: {type(exc).__name__}") from None
    except RecursionError:  # PyYAML's composer recurses once per nesting level
        raise ValueError("invalid YAML: nested too deeply") from None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
        # PyYAML's value constructors (`!!int x`, `!!timestamp x`, `2001-02-30`) raise
        # these unwrapped and without a mark; their messages quote the text: not shown.
        raise ValueError(
            f"invalid YAML: a value its tag or form cannot make ({type(exc).__name__})"
        ) from None
    if _expanded_nodes(data) > MAX_DOCUMENT_NODES:
        raise ValueError(f"the document expands to over {MAX_DOCUMENT_NODES} values (aliases)")
    return data


# What PyYAML quotes in a problem that is not the text's: a token's kind ('<scalar>',
# '<block end>') or one punctuation mark (':', ','). Anything else it quotes is the text
# (an alias, a tag, an anchor, a character that cannot start a token).
_TOKEN_QUOTE = re.compile(r"'<[a-z ]+>'|'[^\w\s'\\]'", re.ASCII)
_QUOTE = re.compile(r"['\"]")


def _unquoted(problem: str | None) -> str:
    """PyYAML's `problem`, cut before the first thing it quotes of the text."""
    text, start = problem or "", 0
    while (quote := _QUOTE.search(text, start)) is not None:
        token = _TOKEN_QUOTE.match(text, quote.start())
        if token is None:
            return text[: quote.start()].rstrip(" ,;:") or "cannot be read"
        start = token.end()
    return text


def _expanded_nodes(data: Any) -> int:
    """How many values `data` has once aliases are expanded, in time linear in the
    distinct objects (an alias is the same object, so sizes are memoized by id)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # containers whose children are being sized: a cycle if met
    pending: list[tuple[Any, bool]] = [(data, False)]
    while pending:  # iterative: nesting may be deeper than the recursion limit
        value, children_done = pending.pop()
        if id(value) in sizes:
            continue
        children = list(value.values()) + list(value) if isinstance(value, dict) else value
        if not isinstance(value, dict | list):
            sizes[id(value)] = 1
        elif children_done:
            open_.discard(id(value))
            sizes[id(value)] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[id(value)] > MAX_DOCUMENT_NODES:
                return sizes[id(value)]
        elif id(value) in open_:  # `&a [*a]`: it contains itself, it expands forever
            raise ValueError("invalid YAML: an alias refers to its own anchor (a cycle)")
        else:
            open_.add(id(value))
            pending.append((value, True))
            pending.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(data)]


def parse_workflow_text(text: str, origin: str) -> dict[str, Any]:
    """A workflow document from YAML or JSON text; WorkflowError naming `origin` if not."""
    try:
        data = load_yaml(text)
    except ValueError as exc:
        raise WorkflowError([str(exc)], origin) from None
    if not isinstance(data, dict):
        raise WorkflowError([f"(top): expected a mapping, got {type(data).__name__}"], origin)
    return data


def read_workflow_file(path: Path) -> dict[str, Any]:
    """A workflow document from a YAML or JSON file (JSON is YAML); WorkflowError if not.
    For the owner's tools; the runtime reads files through its access policy."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkflowError([f"cannot read: {exc.strerror or exc}"], str(path)) from None
    return parse_workflow_text(text, str(path))
