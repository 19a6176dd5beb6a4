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
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from pipelines.errors import WorkflowError

BLOCK_ID = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
RESERVED_IDS = frozenset({"frame"})


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
