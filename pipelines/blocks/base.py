"""The one interface every block type implements.

A block type is a class with a pydantic `Params` model, declared `inputs` and `outputs`
(name -> value kind), and a `build` classmethod run once at compile time. `build` does the
expensive work (validation against models, decoders, lookup tables) and returns a *step
factory*; the factory is called once per stream to make that stream's step, so stateful
blocks (trackers, counters, rate limits) get fresh state per stream while a compiled
workflow is shared. A step receives the input values in declared order (and the `Frame`
last when `wants_frame` is set) and returns the single output value, a tuple in declared
output order when the block has several, or `SKIP` for "no new output this frame".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from pipelines.models import ModelHandle

Kind = Literal[
    "image", "detections", "tracks", "crops", "classes", "counts", "scalar", "text", "any"
]
LIKE = "like:"  # an output kind "like:<input>" is the kind of what that input was given
StepFn = Callable[..., Any]
OPTIONAL = ""  # an input default: may be left out; the step then receives None
StepFactory = Callable[[], StepFn]


class _Skip:
    """Returned by a step that has no new output this frame (e.g. a rate limit)."""

    _instance: _Skip | None = None

    def __new__(cls) -> _Skip:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "SKIP"


SKIP = _Skip()


def stateless(step: StepFn) -> StepFactory:
    """The factory of a block without per-stream state: every stream shares `step`."""
    return lambda: step


class BlockParams(BaseModel):
    """Base of every block's parameter model: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What the compiler gives a block at build time."""

    models: Mapping[str, ModelHandle]
    # Models declared where the workflow runs whose loading failed and was reported
    # there: a block naming one fails with ModelUnavailableError, a follow-on error.
    unavailable: frozenset[str] = frozenset()

    def model(self, model_id: str, field: str = "model") -> ModelHandle:
        """The handle of a declared model; BlockBuildError (at `field`) listing the known."""
        handle = self.models.get(model_id)
        if handle is None:
            if model_id in self.unavailable:
                raise ModelUnavailableError(f"model {model_id!r} did not load", field)
            known = ", ".join(sorted(self.models)) or "none"
            raise BlockBuildError(f"unknown model {model_id!r} (models: {known})", field)
        return handle


class BlockType:
    """Base class of block types. Subclasses set the class attributes and `build`."""

    type_name: ClassVar[str]
    description: ClassVar[str] = ""
    Params: ClassVar[type[BlockParams]] = BlockParams
    # Input name -> (kind, default): the default is a reference (e.g. "frame"), None for a
    # required input, or OPTIONAL for an input the step receives as None when not given.
    inputs: ClassVar[Mapping[str, tuple[Kind, str | None]]] = {}
    # Output name -> kind, or "like:<input>" for pass-through blocks (filter, rate_limit).
    outputs: ClassVar[Mapping[str, str]] = {}
    wants_frame: ClassVar[bool] = False
    may_skip: ClassVar[bool] = False  # its step may return SKIP (e.g. rate_limit)
    # Its step only draws: stateless, its output an image. When it feeds nothing but the
    # video, a stream nobody watches skips it (CompiledWorkflow.video_only).
    draws: ClassVar[bool] = False

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        """Prepare the block once; return the factory of per-stream steps."""
        raise NotImplementedError


class BlockBuildError(ValueError):
    """A block's parameters are valid alone but cannot be bound (e.g. unknown model).

    `field` names the parameter at fault, for the error location.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ModelUnavailableError(BlockBuildError):
    """The block names a model that was declared but did not load (BuildContext)."""
