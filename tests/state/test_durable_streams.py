"""Streams added, replaced or removed over the API survive a restart and hold until the
config file's entry for their id changes (appliance/runtime/state.py, the merge rule):
in-process runtimes, stopped and built again on the same state folder."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from appliance.config import StreamConfig
from appliance.runtime.runtime import Runtime
from appliance.runtime.sharding import Shard
from tests.state.conftest import DRAW, Boot, cam, config_doc, origins, write_config
from tests.support.appliance import DEMO_CLIP


def add(rt: Runtime, doc: dict[str, Any]) -> None:
    rt.add_stream(StreamConfig.model_validate(doc), requested=True)


def entries(folder: Path, name: str = "streams.json") -> dict[str, Any]:
    streams: dict[str, Any] = json.loads((folder / "state" / name).read_text())["streams"]
    return streams


def stall_s(rt: Runtime, stream_id: str) -> float:
    return rt.streams.declared[stream_id].source.stall_timeout_s


def test_api_changes_are_restored_and_hold_until_the_file_entry_changes(
    tmp_path: Path, boot: Boot, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_config(tmp_path / "config.yaml", config_doc(cam("a"), cam("b"), cam("c")))
    rt = boot(path)
    add(rt, cam("x"))  # an id the file does not name
    rt.remove_stream("b", requested=True)  # the file's, removed
    rt.remove_stream("c", requested=True)  # the file's, replaced
    add(rt, cam("c", stall_timeout_s=7.0))
    kept = entries(tmp_path)
    assert kept["x"]["over"] is None and kept["x"]["spec"]["id"] == "x"
    assert kept["b"]["spec"] is None and len(kept["b"]["over"]) == 64
    assert kept["c"]["spec"]["source"]["stall_timeout_s"] == 7.0

    rt = boot(path)  # restarted, the file as it was
    assert origins(rt) == {"a": "config", "c": "api", "x": "api"}
    assert stall_s(rt, "c") == 7.0
    state = rt.status().state
    assert state is not None and (state.dir, state.file, state.streams) == (
        "state",
        "streams.json",
        3,
    )

    # The operator edits b's and c's entries, and names x too: the file wins each time.
    edited = [cam("a"), cam("b", stall_timeout_s=6.0), cam("c", stall_timeout_s=8.0), cam("x")]
    write_config(path, config_doc(*edited))
    with caplog.at_level(logging.INFO, "appliance.runtime"):
        rt = boot(path)
    assert origins(rt) == {"a": "config", "b": "config", "c": "config", "x": "config"}
    assert (stall_s(rt, "b"), stall_s(rt, "c")) == (6.0, 8.0)
    assert entries(tmp_path) == {}
    said = {(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records}
    named = "stream 'x' was added over the API and the config file now names it too"
    assert ("WARNING", named) in said
    assert {("INFO", "stream 'b'"), ("INFO", "stream 'c'")} <= said


def test_a_reload_leaves_the_api_changes_until_the_file_entry_changes(
    tmp_path: Path, boot: Boot
) -> None:
    path = write_config(tmp_path / "config.yaml", config_doc(cam("a"), cam("b"), cam("c")))
    rt = boot(path)
    rt.remove_stream("b", requested=True)
    rt.remove_stream("c", requested=True)
    # Another workflow: the file's entry for c, unchanged, must not replace it either.
    thick = {**DRAW, "blocks": [{"id": "drawn", "type": "annotate", "thickness": 3}]}
    add(rt, {**cam("c", stall_timeout_s=7.0), "workflow": thick})
    assert rt.reload().summary()["unchanged"] == ["a", "b", "c"]  # b: not started again
    assert (sorted(rt.streams), stall_s(rt, "c")) == (["a", "c"], 7.0)

    write_config(path, config_doc(cam("a"), cam("b", stall_timeout_s=6.0), cam("c")))
    rt.reload()  # b's entry edited: the file's b starts; c's not: the API's c goes on
    assert origins(rt) == {"a": "config", "b": "config", "c": "api"}
    assert (stall_s(rt, "b"), stall_s(rt, "c")) == (6.0, 7.0)
    assert set(entries(tmp_path)) == {"c"}

    write_config(path, config_doc(cam("a"), cam("b", stall_timeout_s=6.0)))
    rt.reload()  # c's entry deleted from the file: the file wins, c stops
    assert sorted(rt.streams) == ["a", "b"]
    assert entries(tmp_path) == {}


def test_a_state_stream_that_cannot_start_is_logged_and_kept(
    tmp_path: Path, boot: Boot, caplog: pytest.LogCaptureFixture
) -> None:
    clip = tmp_path / "clip.mp4"
    shutil.copy(DEMO_CLIP, clip)
    path = write_config(tmp_path / "config.yaml", config_doc(cam("a")))
    rt = boot(path)
    add(rt, cam("x", url=clip))
    add(rt, cam("y"))
    clip.unlink()  # x's video is gone when the appliance starts again
    with caplog.at_level(logging.ERROR, "appliance.runtime"):
        rt = boot(path)
    assert origins(rt) == {"a": "config", "y": "api"}  # the others start
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("stream 'x' of the state file" in e and "clip.mp4" in e for e in errors), errors
    assert set(entries(tmp_path)) == {"x", "y"}  # kept: fixing the file brings it back

    assert rt.remove_stream("x", requested=True)  # over the API: forgotten
    assert set(entries(tmp_path)) == {"y"}


def test_a_state_document_with_an_invalid_entry_is_refused_and_kept_aside(
    tmp_path: Path, boot: Boot, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_config(tmp_path / "config.yaml", config_doc(cam("a")))
    rt = boot(path)
    add(rt, cam("x"))
    doc = json.loads((tmp_path / "state" / "streams.json").read_text())
    doc["streams"]["x"]["spec"]["source"]["url"] = 42  # not a URL: not ours to guess
    (tmp_path / "state" / "streams.json").write_text(json.dumps(doc))
    with caplog.at_level(logging.ERROR, "appliance.runtime"):
        rt = boot(path)
    assert origins(rt) == {"a": "config"}
    state = rt.status().state
    assert state is not None and state.problem is not None
    assert "streams.x.spec.source.url" in state.problem and "kept as" in state.problem
    assert [p.name.split("-")[0] for p in (tmp_path / "state").iterdir()] == [
        "streams.json.refused"
    ]
    assert any(state.problem in r.getMessage() for r in caplog.records)


def test_a_worker_takes_over_the_documents_of_workers_that_no_longer_run(
    tmp_path: Path, boot: Boot
) -> None:
    path = write_config(tmp_path / "config.yaml", config_doc())
    rt = boot(path, Shard(2, 3))  # worker 2 of `serve --workers 3`
    add(rt, cam("x"))
    rt = boot(path, Shard(1, 2))  # --workers 2 now: worker 1 does not take worker 2's
    assert origins(rt) == {}
    rt = boot(path, Shard(0, 2))  # 2 % 2 == 0: worker 0 does
    assert origins(rt) == {"x": "api"}
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["worker-0.json"]
    assert set(entries(tmp_path, "worker-0.json")) == {"x"}


@pytest.mark.parametrize(
    ("worker", "name"), [(None, "baselines.json"), (Shard(1, 2), "worker-1-baselines.json")]
)
def test_the_watch_keeps_its_baselines_in_the_state_folder(
    tmp_path: Path, boot: Boot, worker: Shard | None, name: str
) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / name).write_text("{not json")  # read at start: set aside
    rt = boot(write_config(tmp_path / "config.yaml", config_doc()), worker)
    assert (tmp_path / "state" / f"{name}.bad").is_file()
    assert f"set aside as {name}.bad" in str(rt.regressions().baseline_error)
