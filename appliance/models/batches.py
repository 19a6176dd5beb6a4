"""What a batcher tells and asks the rest of the appliance: the record of each
`session.run` (profiling, metrics, the regression watch), the errors a sample's future
can hold, and the seam through which a profiling window picks a batch's session."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import onnxruntime as ort


class ModelStoppedError(RuntimeError):
    """The batcher was stopped before this sample ran."""


class ModelRunError(RuntimeError):
    """`session.run` failed for the batch holding this sample."""


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One `session.run`, as the `on_batch` profiling hook receives it."""

    model_id: str
    batch_size: int  # real samples, without fixed-batch padding
    stream_ids: tuple[str, ...]
    queue_wait_s: tuple[float, ...]  # per sample: submit → start of its run
    run_start: float  # perf_counter seconds
    run_s: float
    ok: bool = True  # False when session.run raised
    queue_depth: int = 0  # samples still waiting when this batch started
    # Ran on a session the chooser picked (a profiling window's profiled twin): its
    # `run_s` includes ORT's profiler, so a baseline leaves it out.
    ort_profiled: bool = False
    inline: bool = False  # ran on the submitting stream's thread; its waits are 0
    # Which batcher ran it (`ModelBatcher.serial`): a reloaded model's successor serves
    # beside its predecessor for a while, and each keeps a trace track of its own.
    batcher: int = 0
    # CPU seconds the run's work took: the calling thread's and the session's intra-op
    # pool threads'; it does not grow while they wait for a core (appliance/models/
    # threads.py), as `run_s` does. With spinning on (`allow_spinning`) it includes the
    # pool's spin between operators. 0.0 in records made before it was measured.
    cpu_s: float = 0.0


class SessionChooser(Protocol):
    """Picks, batch by batch, a session to run on instead of the model's own.

    Called once per batch under the run lock that `choose_sessions` takes (on the
    batcher's thread, or on a submitting stream's for an inline run), so an
    implementation needs no lock of its own for what only this calls."""

    def session_for_batch(self) -> ort.InferenceSession | None:
        """The session the next batch runs on; None: the model's own."""
        ...
