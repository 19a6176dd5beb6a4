"""Runs a compiled workflow on one frame: bound steps over a flat list of value slots.

Everything that can be decided once (block order, which slot each input reads, which
slot each output writes, which slots leave the workflow) was decided by the compiler;
the per-frame path only calls bound callables and times them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from pipelines.blocks.base import StepFn
from pipelines.types import Frame, FrameResult

IMAGE_SLOT = 0  # the frame's image, what `frame` refers to
FRAME_SLOT = 1  # the Frame itself, passed to blocks that want it (stream id, timestamps)
FIRST_FREE_SLOT = 2


@dataclass(frozen=True, slots=True)
class Step:
    """One bound block: call `fn` with the values in `args`, store into `outs`."""

    block_id: str
    block_type: str
    fn: StepFn
    args: tuple[int, ...]
    outs: tuple[int, ...]


class CompiledWorkflow:
    """A workflow ready to run: immutable, shareable by every stream that uses it."""

    def __init__(
        self,
        name: str,
        digest: str,
        steps: Sequence[Step],
        outputs: Sequence[tuple[str, int]],
        video_slot: int,
        n_slots: int,
    ) -> None:
        self.name = name
        self.digest = digest
        self.steps = tuple(steps)
        self.block_ids = tuple(s.block_id for s in steps)
        self.block_types = tuple(s.block_type for s in steps)
        self.output_names = tuple(name for name, _ in outputs)
        self._outputs = tuple(outputs)
        self._video_slot = video_slot
        self._n_slots = n_slots
        # Flattened plan: tuples unpack faster than attribute access on the hot path.
        self._plan = tuple((s.fn, s.args, s.outs[0] if len(s.outs) == 1 else s.outs) for s in steps)

    def run(self, frame: Frame) -> FrameResult:
        """Run every block in order on `frame`; each block's (start, end) is recorded."""
        vals: list[Any] = [None] * self._n_slots
        vals[IMAGE_SLOT] = frame.image
        vals[FRAME_SLOT] = frame
        spans: list[tuple[float, float]] = []
        for fn, args, out in self._plan:
            t0 = perf_counter()
            value = fn(*[vals[a] for a in args])
            if isinstance(out, int):
                vals[out] = value
            else:
                for slot, v in zip(out, value, strict=True):
                    vals[slot] = v
            spans.append((t0, perf_counter()))
        return FrameResult(
            stream_id=frame.stream_id,
            seq=frame.seq,
            pts=frame.pts,
            capture_time=frame.capture_time,
            capture_mono=frame.capture_mono,
            done_mono=perf_counter(),
            image=vals[self._video_slot],
            outputs={name: vals[slot] for name, slot in self._outputs},
            block_spans=spans,
        )

    def summary(self) -> str:
        """One line: name, blocks in order, outputs."""
        chain = " → ".join(
            f"{b}:{t}" for b, t in zip(self.block_ids, self.block_types, strict=True)
        )
        return (
            f"workflow {self.name!r}: {len(self.steps)} block(s) [{chain}], "
            f"outputs {list(self.output_names)}"
        )
