"""What sinks keep across restarts (sinks.base.KeptDocument) in `server.state_dir`: one
document per sink, `sink-<name>.json` (`worker-<I>-sink-<name>.json` for worker I of
`serve --workers`), written and read as every state document is (runtime/statefile.py:
atomic and durable, 0600, one that does not validate set aside). The MQTT sink keeps the
signatures of the commands it ran there, so that a restart does not let one run twice
(docs/security.md, "MQTT commands and the broker")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from appliance.config import AppConfig
from appliance.policy.files import FilePolicy
from appliance.runtime.statefile import read_model, state_folder, write_document

KIND = "sink"  # the documents' "kind"

M = TypeVar("M", bound=BaseModel)
SinkDocuments = Callable[[str], "SinkDocument"]  # a sink's name -> its document


class SinkDocument:
    """One sink's document (sinks.base.KeptDocument). `read` raises StateFileError, a
    ValueError, when the file found is not a valid document (it is set aside first)."""

    def __init__(self, path: Path, files: FilePolicy) -> None:
        self.path, self._files = path, files

    def read(self, model: type[M]) -> M | None:
        return read_model(self.path, KIND, self._files, model)

    def write(self, body: BaseModel) -> None:
        write_document(self.path, KIND, body.model_dump(mode="json"))


def sink_documents(
    config: AppConfig, worker: int | None, files: FilePolicy
) -> SinkDocuments | None:
    """Each sink's document in `config`'s state folder (None without `server.state_dir`);
    `worker`: this process's index under `serve --workers`."""
    found = state_folder(config)
    if found is None:
        return None
    folder = found[0]
    prefix = "" if worker is None else f"worker-{worker}-"
    return lambda name: SinkDocument(folder / f"{prefix}sink-{name}.json", files)
