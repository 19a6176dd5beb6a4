"""A model's run on one frame's image, shared between the workflows that ask for it
(pipelines/shared_runs.py): computed once however many ask at once, waited for by the
others, its outputs read-only, failures passed on, and only a few kept."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from pipelines.models import Tensor
from pipelines.shared_runs import KEPT, SharedRuns


class Model:
    """Counts its runs; each takes `seconds`, so a second asker arrives meanwhile."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.runs = 0
        self.seconds = seconds

    def __call__(self) -> tuple[Sequence[Tensor], Any]:
        self.runs += 1
        time.sleep(self.seconds)
        return [np.arange(4, dtype=np.float32)], "transform"


def test_two_asking_at_once_share_one_run() -> None:
    shared, model = SharedRuns(), Model()
    got: list[tuple[Sequence[Tensor], Any]] = []
    threads = [
        threading.Thread(target=lambda: got.append(shared.run(("cam", 7), model, 5.0)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert model.runs == 1 and shared.shared == 1
    assert got[0][0][0] is got[1][0][0] and got[0][1] == got[1][1] == "transform"
    with pytest.raises(ValueError, match="read-only"):
        got[0][0][0][0] = 1.0  # shared: nobody writes into it


def test_another_frame_or_image_runs_again_and_only_a_few_are_kept() -> None:
    shared, model = SharedRuns(), Model(0.0)
    for seq in range(KEPT + 1):
        shared.run(("cam", seq), model, 1.0)
    assert model.runs == KEPT + 1 and shared.shared == 0
    shared.run(("cam", KEPT), model, 1.0)  # kept: shared
    assert (model.runs, shared.shared) == (KEPT + 1, 1)
    shared.run(("cam", 0), model, 1.0)  # the oldest went: run again
    assert model.runs == KEPT + 2


def test_a_failed_run_fails_whoever_waited_for_it() -> None:
    shared = SharedRuns()
    started = threading.Event()

    def failing() -> tuple[Sequence[Tensor], Any]:
        started.set()
        time.sleep(0.05)
        raise RuntimeError("the model failed")

    errors: list[BaseException] = []

    def first() -> None:
        try:
            shared.run("k", failing, 1.0)
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=first)
    thread.start()
    started.wait(1.0)
    with pytest.raises(RuntimeError, match="the model failed"):
        shared.run("k", Model(0.0), 1.0)
    thread.join()
    assert [str(e) for e in errors] == ["the model failed"]


def test_it_is_on_for_the_streams_a_shadow_runs_on_and_forgets_when_none_is_left() -> None:
    shared, model = SharedRuns(), Model(0.0)
    shared.share("cam", 1)
    shared.share("cam", 1)  # two shadows' leases of the model on one stream
    shared.share("door", 1)
    assert shared.streams == {"cam", "door"} and shared.enabled
    shared.run(("cam", 1), model, 1.0)
    shared.share("door", -1)
    shared.share("cam", -1)
    assert shared.streams == {"cam"}
    shared.share("cam", -1)
    assert shared.streams == frozenset() and not shared.enabled
    shared.run(("cam", 1), model, 1.0)  # the runs kept went with the last shadow
    assert model.runs == 2
