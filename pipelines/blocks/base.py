"""The one interface every block type implements.

A block type is a class with a pydantic `Params` model, declared `inputs` and `outputs`
(name -> value kind), and a `build` classmethod run once at compile time that returns the
per-frame callable. The callable receives the input values in declared order (and the
`Frame` last when `wants_frame` is set) and returns the single output value, or a tuple in
declared output order when the block has several.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from pipelines.models import ModelHandle

Kind = Literal["image", "detections", "tracks", "counts", "scalar", "any"]
StepFn = Callable[..., Any]


class BlockParams(BaseModel):
    """Base of every block's parameter model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What the compiler gives a block at build time."""

    models: Mapping[str, ModelHandle]


class BlockType:
    """Base class of block types. Subclasses set the class attributes and `build`."""

    type_name: ClassVar[str]
    description: ClassVar[str] = ""
    Params: ClassVar[type[BlockParams]] = BlockParams
    # Input name -> (kind, default reference or None when required).
    inputs: ClassVar[Mapping[str, tuple[Kind, str | None]]] = {}
    outputs: ClassVar[Mapping[str, Kind]] = {}
    wants_frame: ClassVar[bool] = False

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFn:
        raise NotImplementedError


class BlockBuildError(ValueError):
    """A block's parameters are valid alone but cannot be bound (e.g. unknown model).

    `field` names the parameter at fault, for the error location.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
