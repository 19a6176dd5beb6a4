"""Baselines kept beside the traces: saved whole, read back, a broken file set aside, and a
shared file's problems named (appliance/watch/baseline.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from appliance.watch.baseline import (
    Baseline,
    BaselineError,
    BaselineStore,
    Learning,
    document,
    parse,
)


def baseline(name: str = "cam1/blur", n: int = 50) -> Baseline:
    values = np.arange(1000, 1000 + n, dtype=np.int64)
    return Baseline("block", name, values, np.array([900, 950], np.int64), 1.5e9, "learned")


def test_a_store_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "watch" / "baselines.json"
    BaselineStore.open(path).put([baseline(), baseline("cam2/detect")])
    again = BaselineStore.open(path)
    assert set(again.rows) == {"cam1/blur", "cam2/detect"}
    row = again.rows["cam1/blur"]
    assert row.samples.tolist() == list(range(1000, 1050)) and row.probe.tolist() == [900, 950]
    assert row.learned_at == 1.5e9
    again.drop(["cam1/blur"])
    assert set(BaselineStore.open(path).rows) == {"cam2/detect"}


def test_own_cost_spread_and_the_probe_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    cpu = np.arange(800, 850, dtype=np.int64)
    probe = np.array([1500], np.int64)
    made = Baseline("block", "cam1/blur", cpu + 200, probe, 1.5e9, "learned", cpu=cpu,
                    spread=1.3, cpu_spread=1.2, probe_measure="onnx",
                    probe_cpu=probe - 300)  # fmt: skip
    BaselineStore.open(path).put([made])
    row = BaselineStore.open(path).rows["cam1/blur"]
    assert row.cpu.tolist() == cpu.tolist() and row.probe_cpu.tolist() == [1200]
    assert (row.spread, row.cpu_spread, row.probe_measure) == (1.3, 1.2, "onnx")
    # A document written before them: no own cost, no spread, the loop's probe.
    old = {k: v for k, v in made.document().items() if k not in ("cpu_us", "spread",
           "cpu_spread", "probe_measure", "probe_cpu_us")}  # fmt: skip
    row = parse({"version": 1, "rows": {"cam1/blur": old}}, "old.json")["cam1/blur"]
    assert row.cpu.size == 0 and row.spread == 1.0 and row.probe_measure == "loop"
    assert row.probe_cpu.size == 0


def test_a_broken_store_is_set_aside_and_learned_again(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    path.write_text('{"version": 1, "rows": {"x": {"kind": "block"')
    store = BaselineStore.open(path)
    assert store.rows == {} and store.last_error is not None and ".bad" in store.last_error
    assert (tmp_path / "baselines.json.bad").exists() and not path.exists()


def test_a_shared_baseline_wins_row_by_row(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    BaselineStore.open(path).put([baseline(), baseline("cam2/detect")])
    shared = Baseline("block", "cam1/blur", np.array([5] * 20, np.int64), np.empty(0, np.int64),
                      1.0, "fingerprint:ci.json")  # fmt: skip
    store = BaselineStore.open(path, {"cam1/blur": shared})
    assert store.rows["cam1/blur"].source == "fingerprint:ci.json"
    assert store.rows["cam2/detect"].source == "learned"


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"rows": {}}, "not a baseline document"),
        ({"version": 1, "rows": []}, "rows: expected an object"),
        ({"version": 1, "rows": {"a": {"kind": "blob", "name": "a"}}}, "rows.a: kind must be"),
        (
            {"version": 1, "rows": {"a": {"kind": "block", "name": "a", "samples_us": [1.5]}}},
            "rows.a.samples_us: expected 1 to 20000 whole µs values",
        ),
        (
            {"version": 1, "rows": {"a": {"kind": "block", "name": "a", "samples_us": [-3]}}},
            "rows.a.samples_us",
        ),
    ],
)
def test_a_bad_document_names_where(doc: object, problem: str) -> None:
    with pytest.raises(BaselineError, match=r"ci\.json") as info:
        parse(doc, "ci.json")
    assert problem in str(info.value)


def test_documents_round_trip() -> None:
    doc = json.loads(json.dumps(document([baseline()])))
    assert parse(doc, "x")["cam1/blur"].samples.tolist() == list(range(1000, 1050))
    assert parse(doc, "x")["cam1/blur"].model is None and "model" not in doc["rows"]["cam1/blur"]
    with_model = dataclasses.replace(baseline(), model="faces")
    doc = json.loads(json.dumps(document([with_model])))
    assert parse(doc, "x")["cam1/blur"].model == "faces"
    doc["rows"]["cam1/blur"]["model"] = 7
    with pytest.raises(BaselineError, match=r"rows\.cam1/blur\.model: expected a model id"):
        parse(doc, "x")


def test_learning_keeps_a_bounded_sample_of_its_whole_span() -> None:
    learning = Learning(0.0)
    for start in range(0, 10_000, 1000):  # ten intervals, each its own range of values
        learning.add(np.arange(start, start + 1000, dtype=np.int64), cap=2000)
    kept = learning.samples()
    assert kept.size <= 2000 and learning.count == 10_000
    per_interval = np.bincount(kept // 1000, minlength=10)
    assert per_interval.min() > 120 and per_interval.max() < 280  # about 200 of each
