"""Runs a compiled workflow on one frame: bound steps over a flat list of value slots.

Everything that can be decided once (block order, which slot each input reads, which
slot each output writes, which slots leave the workflow) was decided by the compiler;
the per-frame path only calls bound callables and times them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from pipelines.blocks.base import SKIP, StepFactory
from pipelines.geometry import Region
from pipelines.types import Frame, FrameResult

CpuClock = Callable[[], int]  # ns of the calling thread's CPU so far
Flags = tuple[bool, ...]  # one per step, in plan order
IMAGE_SLOT = 0  # the frame's image, what `frame` refers to
FRAME_SLOT = 1  # the Frame itself, passed to blocks that want it (stream id, timestamps)
NONE_SLOT = 2  # never written: what an optional input that was left out reads
FIRST_FREE_SLOT = 3


@dataclass(frozen=True, slots=True)
class Step:
    """One bound block: call its step with the values in `args`, store into `outs`.

    `deps` are the indices of the steps whose outputs it reads (for skip propagation);
    `draws`: the block only draws (BlockType.draws).
    """

    block_id: str
    block_type: str
    factory: StepFactory
    args: tuple[int, ...]
    outs: tuple[int, ...]
    deps: tuple[int, ...] = ()
    draws: bool = False


class CompiledWorkflow:
    """A workflow ready to run: immutable, shared by every stream that uses it.

    `instantiate()` makes one stream's runnable copy (its blocks' own state and its
    value slots); the plan itself was fixed at compile time.
    """

    def __init__(
        self,
        name: str,
        digest: str,
        steps: Sequence[Step],
        outputs: Sequence[tuple[str, int]],
        video_slot: int,
        n_slots: int,
        gated: bool = False,
    ) -> None:
        self.name = name
        self.digest = digest
        # What results name as the workflow that made them: the digest's first 12 hex
        # digits (48 bits: equal only for the same normalised document, in practice).
        self.version = digest[:12]
        self.steps = tuple(steps)
        self.block_ids = tuple(s.block_id for s in steps)
        self.block_types = tuple(s.block_type for s in steps)
        self.output_names = tuple(name for name, _ in outputs)
        self.outputs = tuple(outputs)
        self.video_slot = video_slot
        self.n_slots = n_slots
        self.gated = gated  # some block may return SKIP: check freshness per step
        self.models: tuple[str, ...] = ()  # model ids its blocks run, set by the compiler
        self.block_models: dict[str, str] = {}  # block id -> the model it runs (compiler)
        self.regions: tuple[Region, ...] = ()  # lines and zones its blocks count (compiler)
        # The steps a run without video leaves out: drawing whose image only the video
        # output reads. Their slots, emptied on such a run so no stale image is read.
        self.video_only = video_only(self.steps, self.outputs, video_slot)
        self.video_only_slots = tuple(
            slot for i in sorted(self.video_only) for slot in self.steps[i].outs
        )

    def instantiate(self, cpu_clock: CpuClock | None = None) -> WorkflowRun:
        """A runnable copy for one stream, with fresh per-stream block state. `cpu_clock`
        (ns of this thread's CPU, e.g. time.thread_time_ns): each block's CPU time is
        recorded too (`FrameResult.block_cpu_ns`)."""
        return WorkflowRun(self, cpu_clock)

    def summary(self) -> str:
        """One line: name, blocks in order, outputs."""
        chain = " → ".join(
            f"{b}:{t}" for b, t in zip(self.block_ids, self.block_types, strict=True)
        )
        return (
            f"workflow {self.name!r}: {len(self.steps)} block(s) [{chain}], "
            f"outputs {list(self.output_names)}"
        )


class WorkflowRun:
    """One stream's instance of a compiled workflow; `run` is the per-frame path.

    Value slots persist between frames: a block that is skipped (a rate limit upstream
    said SKIP) keeps its last outputs, which later blocks and the outputs then read.
    """

    def __init__(self, workflow: CompiledWorkflow, cpu_clock: CpuClock | None = None) -> None:
        self.workflow = workflow
        self._vals: list[Any] = [None] * workflow.n_slots
        # Flattened plan: tuples unpack faster than attribute access on the hot path.
        self._plan = tuple(
            (s.factory(), s.args, s.outs[0] if len(s.outs) == 1 else s.outs, s.deps)
            for s in workflow.steps
        )
        self._fresh = [False] * len(self._plan)
        self._outputs = workflow.outputs
        self._video_slot = workflow.video_slot
        self._version = workflow.version
        self._gated = workflow.gated
        self._lit = (False,) * len(self._plan)  # what a run with video leaves out: none
        self._dark = tuple(i in workflow.video_only for i in range(len(self._plan)))
        self._dark_slots = workflow.video_only_slots
        # A run without video has no image outputs it did not draw (not even None: the
        # predictions stay the same whoever watches).
        self._dark_outputs = tuple(o for o in self._outputs if o[1] not in self._dark_slots)
        # The first run with video after one without: its drawing steps run even if their
        # inputs are stale (a rate limit upstream), since they have no last output to keep.
        self._redraw = False
        # The regression watch's own-cost measure: the worker thread's CPU ns per block,
        # which does not grow while the thread waits for a core (a victim of contention)
        # but does when the block does more work. 0 for a block skipped on the frame.
        # A CPU clock read is a system call (about 0.7 µs here, perf_counter's 0.08 µs):
        # only when asked. The runtime's clock leaves out the model runs a block makes on
        # this thread (an inline batch): those are the model's own cost, not the block's.
        self._clock = cpu_clock
        self._cpu = [0] * len(self._plan) if cpu_clock is not None else None

    def measure_cpu(self, on: bool) -> None:
        """Record each block's CPU time from the next frame on (or stop), by the clock it
        was made with."""
        self._cpu = [0] * len(self._plan) if on and self._clock is not None else None

    def run(self, frame: Frame, video: bool = True) -> FrameResult:
        """Run every block in order on `frame`; each block's (start, end) is recorded
        (None for a block skipped this frame). `video=False` (nobody watches): the steps
        that only draw the video are left out, and the result's `image` is None when it
        was theirs to draw. Never a stale or half-drawn image (a blur left out)."""
        vals = self._vals
        vals[IMAGE_SLOT] = frame.image
        vals[FRAME_SLOT] = frame
        start = perf_counter()
        cpu = self._cpu
        skip, force, outputs = self._lit, self._lit, self._outputs
        if not video and self._dark_slots:
            skip, outputs, self._redraw = self._dark, self._dark_outputs, True
            for slot in self._dark_slots:
                vals[slot] = None
        elif self._redraw:
            force, self._redraw = self._dark, False
        if cpu is not None:
            spans = self._run_timed(vals, cpu, self._clock, skip, force)
        elif self._gated or skip is not self._lit or force is not self._lit:
            spans = self._run_gated(vals, skip, force)
        else:
            spans = self._run_plain(vals)
        return FrameResult(
            stream_id=frame.stream_id,
            seq=frame.seq,
            pts=frame.pts,
            capture_time=frame.capture_time,
            capture_mono=frame.capture_mono,
            start_mono=start,
            done_mono=perf_counter(),
            image=vals[self._video_slot],
            source_image=frame.image,
            outputs={name: vals[slot] for name, slot in outputs},
            block_spans=spans,
            block_cpu_ns=() if cpu is None else tuple(cpu),
            version=self._version,
        )

    def _run_plain(self, vals: list[Any]) -> list[tuple[float, float] | None]:
        spans: list[tuple[float, float] | None] = []
        for fn, args, out, _deps in self._plan:
            t0 = perf_counter()
            value = fn(*[vals[a] for a in args])
            if isinstance(out, int):
                vals[out] = value
            else:
                for slot, v in zip(out, value, strict=True):
                    vals[slot] = v
            spans.append((t0, perf_counter()))
        return spans

    def _run_gated(
        self, vals: list[Any], skip: Flags, force: Flags
    ) -> list[tuple[float, float] | None]:
        """Like _run_plain, but a block whose block inputs are all stale is skipped unless
        `force` names it, and so is one `skip` names."""
        spans: list[tuple[float, float] | None] = []
        fresh = self._fresh
        for i, (fn, args, out, deps) in enumerate(self._plan):
            if skip[i] or (deps and not force[i] and not any(fresh[d] for d in deps)):
                fresh[i] = False
                spans.append(None)
                continue
            t0 = perf_counter()
            value = fn(*[vals[a] for a in args])
            fresh[i] = value is not SKIP
            if value is SKIP:
                pass  # keep the last outputs
            elif isinstance(out, int):
                vals[out] = value
            else:
                for slot, v in zip(out, value, strict=True):
                    vals[slot] = v
            spans.append((t0, perf_counter()))
        return spans

    def _run_timed(
        self, vals: list[Any], cpu: list[int], clock: CpuClock | None, skip: Flags, force: Flags
    ) -> list[tuple[float, float] | None]:
        """Like _run_gated, and each block's CPU ns by `clock` into `cpu` (0 when skipped)."""
        assert clock is not None  # `cpu` is only made with a clock
        spans: list[tuple[float, float] | None] = []
        fresh = self._fresh
        for i, (fn, args, out, deps) in enumerate(self._plan):
            if skip[i] or (deps and not force[i] and not any(fresh[d] for d in deps)):
                fresh[i], cpu[i] = False, 0
                spans.append(None)
                continue
            c0, t0 = clock(), perf_counter()
            value = fn(*[vals[a] for a in args])
            fresh[i] = value is not SKIP
            if value is SKIP:
                pass  # keep the last outputs
            elif isinstance(out, int):
                vals[out] = value
            else:
                for slot, v in zip(out, value, strict=True):
                    vals[slot] = v
            spans.append((t0, perf_counter()))
            cpu[i] = clock() - c0
        return spans


def video_only(
    steps: Sequence[Step], outputs: Sequence[tuple[str, int]], video_slot: int
) -> frozenset[int]:
    """The steps that only draw the video: drawing steps (`draws`) that the video output
    needs, that no other output needs, and whose outputs only other such steps read.
    A stateful block (a tracker, a counter) is never among them: leaving it out on some
    frames would change its results on the others."""
    producer = {slot: i for i, step in enumerate(steps) for slot in step.outs}

    def needed_by(slots: list[int]) -> set[int]:
        seen: set[int] = set()
        todo = [producer[s] for s in slots if s in producer]
        while todo:
            i = todo.pop()
            if i not in seen:
                seen.add(i)
                todo.extend(producer[a] for a in steps[i].args if a in producer)
        return seen

    other = needed_by([slot for name, slot in outputs if name != "video"])
    left = {i for i in needed_by([video_slot]) - other if steps[i].draws}
    changed = True
    while changed:  # a step whose output something left running reads must run
        readers = {a for i, step in enumerate(steps) if i not in left for a in step.args}
        keep = {i for i in left if readers.intersection(steps[i].outs)}
        left -= keep
        changed = bool(keep)
    return frozenset(left)
