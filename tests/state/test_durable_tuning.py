"""A tuning a tune applied live survives a restart and holds until the config file's
`tuning:` section changes (appliance/runtime/tuningstate.py): in-process runtimes with the
config's `person` model, the winner applied by the tune's own `_finish`, stopped and
built again on the same state folder."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from appliance.observe.status import Readiness, as_json
from appliance.runtime.runtime import Runtime
from appliance.runtime.sharding import Shard
from appliance.tune.objective import Objective
from appliance.tune.search import TuneResult
from appliance.tune.space import BATCH_SIZES, Knob
from appliance.tune.target import LiveTarget, _finish
from tests.state.conftest import Boot, cam, config_doc, write_config
from tests.support.appliance import person_model

DECLARED = (4, 2.0)  # person_model()'s batching: max_batch_size, max_queue_delay_ms
EDITED = {"models": {"person": {"max_queue_delay_ms": 5.0}}}  # an operator's `tuning:`


def config(folder: Path, *streams: dict[str, Any], tuning: Any = None, **server: Any) -> Path:
    """The `person` model (no stream needs to run it: the config's models load at start)."""
    doc = {**config_doc(*streams, **server), "models": {"person": person_model()}}
    if tuning is not None:
        doc["tuning"] = tuning
    return write_config(folder / "config.yaml", doc)


def applied_by_tune(rt: Runtime, batch: int) -> TuneResult:
    """What `tune(..., apply=True)` does with a winner that set the batch size: `_finish`."""
    start = rt.pool.specs()["person"][0].batching.max_batch_size
    knob = Knob("person.max_batch_size", "person", "max_batch_size", BATCH_SIZES, start)
    result = TuneResult(
        objective=Objective("fps", 100.0),
        knobs=[knob],
        start={knob.key: start},
        best={knob.key: batch},
        candidates=[],
        reference=[],
        reasons={},
        outcome="done",
        problem=None,
        elapsed_s=1.0,
        windows=2,
    )
    _finish(rt, LiveTarget(rt, [knob], rt.config.tuning), result)
    return result


def batching(rt: Runtime) -> tuple[int, float]:
    """The person model's batching as the pool's spec and its batcher both have it."""
    spec = rt.pool.specs()["person"][0].batching
    running = rt.pool.handles["person"].batching
    assert (running.max_batch_size, running.max_queue_delay_ms) == (
        spec.max_batch_size,
        spec.max_queue_delay_ms,
    )
    return spec.max_batch_size, spec.max_queue_delay_ms


def kept_batch(rt: Runtime) -> int | None:
    tuning = rt.config.tuning.models.get("person")
    return None if tuning is None else tuning.max_batch_size


@pytest.mark.parametrize(
    ("worker", "name"), [(None, "tuning.json"), (Shard(1, 2), "worker-1-tuning.json")]
)
def test_a_tuning_a_tune_applied_runs_again_after_a_restart(
    tmp_path: Path, boot: Boot, worker: Shard | None, name: str
) -> None:
    path = config(tmp_path)
    rt = boot(path, worker)
    assert batching(rt) == DECLARED
    assert applied_by_tune(rt, 1).problem is None
    assert batching(rt) == (1, DECLARED[1])
    doc = json.loads((tmp_path / "state" / name).read_text())
    assert (doc["kind"], doc["tuning"]["models"]["person"]["max_batch_size"]) == ("tuning", 1)

    rt = boot(path, worker)  # restarted, the file as it was
    assert kept_batch(rt) == 1 and batching(rt) == (1, DECLARED[1])
    state = rt.status().state
    assert state is not None and (state.tuning, state.tuning_problem) == (name, None)


def test_the_file_wins_once_its_tuning_section_changes(
    tmp_path: Path, boot: Boot, caplog: pytest.LogCaptureFixture
) -> None:
    path = config(tmp_path)
    applied_by_tune(boot(path), 1)
    config(tmp_path, tuning=EDITED)  # the operator edits `tuning:`
    with caplog.at_level(logging.INFO, "appliance.runtime"):
        rt = boot(path)
    assert kept_batch(rt) is None and batching(rt) == (DECLARED[0], 5.0)
    assert not (tmp_path / "state" / "tuning.json").exists()
    assert any("tuning: section changed" in r.getMessage() for r in caplog.records)
    state = rt.status().state
    assert state is not None and state.tuning is None


def test_a_reload_keeps_the_tuning_until_the_file_section_changes(
    tmp_path: Path, boot: Boot
) -> None:
    path = config(tmp_path)
    rt = boot(path)
    applied_by_tune(rt, 1)
    config(tmp_path, cam("a"))  # another change, `tuning:` as it was
    assert rt.reload().summary()["added"] == ["a"]
    assert kept_batch(rt) == 1 and batching(rt) == (1, DECLARED[1])
    assert (tmp_path / "state" / "tuning.json").is_file()

    config(tmp_path, cam("a"), tuning=EDITED)
    rt.reload()
    assert kept_batch(rt) is None and batching(rt) == (DECLARED[0], 5.0)  # live
    assert not (tmp_path / "state" / "tuning.json").exists()


def test_a_refused_tuning_document_is_set_aside_and_the_file_runs(
    tmp_path: Path, boot: Boot, caplog: pytest.LogCaptureFixture
) -> None:
    path = config(tmp_path)
    applied_by_tune(boot(path), 1)
    kept = tmp_path / "state" / "tuning.json"
    doc = json.loads(kept.read_text())
    doc["tuning"]["models"]["person"]["max_batch_size"] = 0  # not a batch size
    kept.write_text(json.dumps(doc))
    with caplog.at_level(logging.ERROR, "appliance.runtime"):
        rt = boot(path)
    assert kept_batch(rt) is None and batching(rt) == DECLARED
    aside = [p.name for p in (tmp_path / "state").iterdir() if p.name.startswith("tuning")]
    assert len(aside) == 1 and aside[0].startswith("tuning.json.refused-"), aside
    state = as_json(Readiness.of(rt.status(), insecure=False))["state"]  # as /ready says it
    problem = state["tuning_problem"]
    assert "tuning.models.person.max_batch_size" in problem and aside[0] in problem
    assert state["tuning"] is None and state["problem"] is None  # the streams' was fine
    assert any(problem in r.getMessage() for r in caplog.records if r.levelname == "ERROR")


def test_a_tuning_that_cannot_be_kept_runs_on_and_the_result_says_so(
    tmp_path: Path, boot: Boot, caplog: pytest.LogCaptureFixture
) -> None:
    # The folder's parent is a regular file: no process can create it, root included.
    (tmp_path / "blocker").write_text("not a folder")
    rt = boot(config(tmp_path, state_dir="blocker/state"))
    with caplog.at_level(logging.ERROR, "appliance.runtime"):
        result = applied_by_tune(rt, 1)
    assert result.problem is not None
    assert "state folder blocker/state" in result.problem and "Not a directory" in result.problem
    assert batching(rt) == (1, DECLARED[1])  # the winner runs all the same
    assert any(result.problem in r.getMessage() for r in caplog.records)
