"""The tuning part of the durable state: a tuning a tune applied live (`POST /v1/tune` with
`apply`, `appliance tune --url ... --apply`), kept in `server.state_dir` (a document of
appliance/runtime/statefile.py) and run again after a restart.

The rule, as for the streams (appliance/runtime/state.py): **a tuning a tune applied holds
until the config file's `tuning:` section changes.** The document holds the tuning as the
tune left it (`tuning`, the whole section) and `over`: the sha256 of the file's section
when it was applied (its `model_dump_json`). At start and at each reload, while the file's
section still has that digest the kept tuning runs; once an operator edits the section
(`appliance tune --config F --apply` does too), the file's runs and the document is
dropped (an INFO line says so). A document that is not ours or does not validate is set
aside (statefile), logged as an ERROR, and the file's section runs.

Files: `<state_dir>/tuning.json` for one process, `worker-<I>-tuning.json` for worker I of
`serve --workers N` (whose gateway answers /v1/tune with 501: a tune runs in one process).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from appliance.config import AppConfig, TuningConfig
from appliance.observe.status import StateStatus
from appliance.policy.files import FilePolicy
from appliance.runtime.statefile import (
    StateFileError,
    digest,
    read_model,
    state_folder,
    write_document,
)

__all__ = ["KIND", "Kept", "TuningState"]

log = logging.getLogger("appliance.runtime")

KIND = "tuning"  # the document's "kind"
SINGLE = "tuning.json"  # a single process's document


class Kept(BaseModel):
    """The document's body: the tuning a tune applied, over the file's section `over`."""

    model_config = ConfigDict(extra="ignore")  # "format", "kind", ...: statefile's checks

    tuning: TuningConfig
    over: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class TuningState:
    """This process's tuning document: read at `open` (the start), written by `keep` (a tune
    that applied its winner), dropped when a reload's file overrules it. Without
    `server.state_dir`, it keeps nothing. Changed under the runtime's control lock; read
    from any thread."""

    def __init__(self, path: Path | None, shown: str, files: FilePolicy) -> None:
        self.path, self._shown, self._files = path, shown, files
        self._file = ""  # the digest of the config file's `tuning:` section now
        self._kept: Kept | None = None
        self._problem: str | None = None  # why the document found at start was refused

    @classmethod
    def of(cls, config: AppConfig, worker: int | None, files: FilePolicy) -> TuningState:
        """`config`'s state folder (none without `server.state_dir`); `worker`: the index of
        this worker of `serve --workers`."""
        found = state_folder(config)
        if found is None:
            return cls(None, "", files)
        folder, shown = found
        name = SINGLE if worker is None else f"worker-{worker}-{SINGLE}"
        return cls(folder / name, shown, files)

    def status(self, streams: StateStatus | None) -> StateStatus | None:
        """The state folder's status (the streams' document's) with this document's."""
        if streams is None or self.path is None:
            return streams
        held = None if self._kept is None else self.path.name
        return dataclasses.replace(streams, tuning=held, tuning_problem=self._problem)

    # -- start and reloads ---------------------------------------------------------------
    def open(self, config: AppConfig) -> AppConfig:
        """`config` as it runs: with the kept tuning while the file's section is the one it
        was applied over; else the file's (the document dropped, or refused and set aside)."""
        self._file = digest(config.tuning)
        if self.path is None:
            return config
        try:
            found = read_model(self.path, KIND, self._files, Kept)
        except StateFileError as exc:
            log.error("%s; the config file's tuning: runs", exc)
            self._problem, found = str(exc), None
        self._kept = self._current(found)
        return self.over(config)

    def over(self, config: AppConfig) -> AppConfig:
        """`config` (a reload's file, before it applies) with the kept tuning, when its
        `tuning:` section is still the one the tune applied over; else as it is."""
        kept = self._kept
        if kept is None or kept.over != digest(config.tuning):
            return config
        return config.model_copy(update={"tuning": kept.tuning})

    def reloaded(self, file: TuningConfig) -> None:
        """After a reload applied the file's section `file`: dropped if it changed."""
        self._file = digest(file)
        self._kept = self._current(self._kept)

    def _current(self, kept: Kept | None) -> Kept | None:
        """`kept` while the file's section is the one it was applied over; else dropped."""
        if kept is None or kept.over == self._file:
            return kept
        assert self.path is not None
        log.info(
            "the config file's tuning: section changed since a tune applied its winner live: "
            "the file's holds now (%s dropped)",
            self.path.name,
        )
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:  # the next start drops it by the same rule
            log.error("state file %s: cannot drop it (%s)", self.path, exc.strerror or exc)
        return None

    # -- a tune --------------------------------------------------------------------------
    def keep(self, tuning: TuningConfig) -> str | None:
        """A tune applied `tuning` live: kept until the file's section changes. None, or
        why it could not be kept (logged as an ERROR: it runs until the process stops)."""
        if self.path is None:
            return None
        kept = Kept(tuning=tuning, over=self._file)
        try:
            write_document(self.path, KIND, kept.model_dump(mode="json"))
        except OSError as exc:
            problem = (
                f"state folder {self._shown}: cannot keep the tuning applied "
                f"({exc.strerror or exc}, errno {exc.errno}); it runs until the appliance "
                "restarts, then the config file's tuning: does"
            )
            log.error("%s", problem)
            return problem
        self._kept = kept
        return None
