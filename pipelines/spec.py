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

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

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


GraphOptimization = Literal["disable", "basic", "extended", "all"]
Provider = Literal["tensorrt", "cuda", "cpu"]


class SessionSpec(_Strict):
    intra_op_threads: Annotated[int, Field(ge=0)] = 0  # 0: ONNX Runtime's default
    inter_op_threads: Annotated[int, Field(ge=0)] = 0
    graph_optimization: GraphOptimization = "all"
    # ONNX Runtime's default: idle intra-op threads spin briefly before sleeping (lowest
    # latency). False lets them sleep at once, for CPUs shared with other heavy work.
    allow_spinning: bool = True


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

    @field_validator("decoder")
    @classmethod
    def _known_decoder(cls, v: str | None) -> str | None:
        from pipelines.decoders import DECODERS  # the registry of output formats

        if v is not None and v not in DECODERS:
            known = ", ".join(sorted(DECODERS))
            raise ValueError(f"unknown decoder {v!r} (known: {known})")
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


def read_workflow_file(path: Path) -> dict[str, Any]:
    """A workflow document from a YAML or JSON file (JSON is YAML); WorkflowError if not."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WorkflowError([f"cannot read: {exc.strerror or exc}"], str(path)) from None
    except yaml.YAMLError as exc:
        raise WorkflowError([f"invalid YAML: {exc}"], str(path)) from None
    if not isinstance(data, dict):
        raise WorkflowError([f"(top): expected a mapping, got {type(data).__name__}"], str(path))
    return data
