"""State documents: atomic writes, and files that are not ours refused and kept aside."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from appliance.config import parse_config
from appliance.policy.files import FilePolicy
from appliance.runtime.statefile import (
    FORMAT,
    VERSION,
    StateFileError,
    read_document,
    write_document,
)


@pytest.fixture
def files(tmp_path: Path) -> FilePolicy:
    return FilePolicy.owner(parse_config({"streams": []}, tmp_path))


def test_a_written_document_reads_back_owner_only(tmp_path: Path, files: FilePolicy) -> None:
    path = tmp_path / "state" / "streams.json"
    write_document(path, "streams", {"streams": {"a": {"x": 1}}})
    doc = read_document(path, "streams", files)
    assert doc is not None
    assert doc["streams"] == {"a": {"x": 1}}
    assert (doc["format"], doc["kind"], doc["version"]) == (FORMAT, "streams", VERSION)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["streams.json"]  # no temporary left


def test_no_document_yet_is_none(tmp_path: Path, files: FilePolicy) -> None:
    assert read_document(tmp_path / "absent.json", "streams", files) is None


def test_a_failed_write_leaves_the_old_document(
    tmp_path: Path, files: FilePolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "streams.json"
    write_document(path, "streams", {"n": 1})

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_document(path, "streams", {"n": 2})
    monkeypatch.undo()
    doc = read_document(path, "streams", files)
    assert doc is not None and doc["n"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["streams.json"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{not json", "not JSON"),
        (json.dumps({"streams": {}}).encode(), "not an appliance state document"),
        (
            json.dumps({"format": FORMAT, "kind": "fleet", "version": VERSION}).encode(),
            "a 'fleet' document where a 'streams' one belongs",
        ),
        (
            json.dumps({"format": FORMAT, "kind": "streams", "version": 99}).encode(),
            "version 99; this appliance reads version 1",
        ),
    ],
)
def test_a_foreign_or_corrupt_file_is_refused_and_kept_aside(
    tmp_path: Path, files: FilePolicy, content: bytes, problem: str
) -> None:
    path = tmp_path / "streams.json"
    path.write_bytes(content)
    with pytest.raises(StateFileError) as caught:
        read_document(path, "streams", files)
    error = caught.value
    assert problem in str(error) and str(path) in str(error)
    assert error.kept is not None and error.kept.read_bytes() == content
    assert error.kept.name.startswith("streams.json.refused-")
    assert not path.exists()  # the next save starts a fresh document beside the kept one


def test_an_oversized_file_is_refused_by_its_cap(tmp_path: Path) -> None:
    config = parse_config({"streams": [], "limits": {"max_state_bytes": 100}}, tmp_path)
    path = tmp_path / "streams.json"
    write_document(path, "streams", {"pad": "x" * 200})
    with pytest.raises(StateFileError, match="max_state_bytes") as caught:
        read_document(path, "streams", FilePolicy.owner(config))
    assert caught.value.kept is not None and caught.value.kept.exists()


def test_a_fifo_is_refused_where_it_is(tmp_path: Path, files: FilePolicy) -> None:
    path = tmp_path / "streams.json"
    os.mkfifo(path)
    with pytest.raises(StateFileError, match="not a regular file") as caught:
        read_document(path, "streams", files)
    assert caught.value.kept is None and path.exists()
