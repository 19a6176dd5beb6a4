"""The streams part of the durable state: streams added, replaced or removed over the API,
kept in `server.state_dir` (documents written and read by appliance/runtime/statefile.py)
and merged with the config file at start and at each reload.

The merge rule: **a change made over the API holds for an id until the config file's
entry for that id changes.** Each entry is the stream as the API left it (`spec`: the
StreamConfig, or null for a removal), `over`: the sha256 of the file's entry for that id
when the change was made (its `model_dump_json`; null when the file did not name the id),
and `at`, when (seconds since the epoch). A spec whose source URL holds credentials keeps
it masked, the whole URL sealed beside it (`sealed_url`, appliance/runtime/sealing.py);
without APPLIANCE_STATE_KEY such a stream is refused over the API (422), and a document an
older version wrote in clear is sealed at the next start with a key (else kept, WARNING).

- an id the file does not name (`over` null): the API's stream is restored, its files
  checked by the request policy, as when it was added;
- an id the file names, changed or removed over the API: while the file's entry still has
  the digest `over`, the API's version holds (removed: not started; removed then added:
  the API's spec runs); once an operator edits or deletes that entry in the file, the
  file wins and the state's entry is dropped (an INFO line says so), at start or reload;
- an id added over the API that the file now also names: the file wins, and the entry is
  dropped with a WARNING.

A stream of the state that cannot start (its workflow file gone, its host no longer
allowed, a limit, its URL sealed under another key) is logged as an ERROR and kept: fixing
the cause and restarting brings it back; a DELETE of its id forgets it.

Files: `<state_dir>/streams.json` for one process, `worker-<I>.json` for worker I of
`serve --workers N`. Worker I adopts the documents of workers that no longer exist
(`worker-J.json`, J >= N and J % N == I; worker 0 also a single process's `streams.json`,
and a single process every `worker-J.json`): their entries join its own (the later change
of an id wins), its document is saved, then theirs are removed. Changing the worker count
loses nothing.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from appliance.config import AppConfig, StreamConfig
from appliance.errors import StateSaveError, UnknownStreamError
from appliance.observe.status import StateStatus
from appliance.policy.files import FilePolicy
from appliance.runtime.reload import ReloadPlan
from appliance.runtime.sealing import (
    CLEAR_FIX,
    MAKE_KEY,
    UNSEAL_FIX,
    Sealer,
    SealError,
    has_credentials,
)
from appliance.runtime.sharding import Shard
from appliance.runtime.statefile import (
    StateFileError,
    digest,
    read_model,
    set_aside,
    state_folder,
    write_document,
)

__all__ = ["KIND", "Entry", "Restore", "StreamsState"]

log = logging.getLogger("appliance.runtime")

KIND = "streams"  # the documents' "kind"
SINGLE = "streams.json"  # a single process's document
_WORKER = re.compile(r"worker-(\d+)\.json")  # worker I's document


class Entry(BaseModel):
    """One id's change over the API (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: StreamConfig | None
    over: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None
    at: float
    # The spec's source URL, whole, sealed (Fernet); the spec holds it masked. None: the
    # URL holds no credentials, or an older version wrote it in clear.
    sealed_url: str | None = None

    @property
    def in_clear(self) -> bool:
        """Credentials written in clear (by an older version, or with no key since)."""
        spec = self.spec
        return self.sealed_url is None and spec is not None and has_credentials(spec.source.url)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")  # "format", "kind", ...: statefile's checks

    streams: dict[str, Entry]


@dataclass(frozen=True, slots=True)
class Restore:
    """What a start takes from the state: the config's streams it must not start from the
    file (the API's version holds), and the API's streams, started after the config's."""

    skip: frozenset[str]
    start: list[StreamConfig]

    def start_each(self, start: Callable[[StreamConfig], object], where: str) -> None:
        """Start each of the API's streams; one that fails is logged and stays in the
        state (`where`), and the others start."""
        for cfg in self.start:
            try:
                start(cfg)
            except Exception as exc:  # logged, kept in the state; nothing else stops
                log.error(
                    "stream %r of the state file %s not started: %s (kept there: fix the "
                    "cause and restart, or DELETE it)",
                    cfg.id,
                    where,
                    exc,
                )


class StreamsState:
    """This process's streams document: read and merged at `open`, saved on each change
    over the API, pruned after a reload. Changed only under the runtime's control lock;
    `status` may be read from any thread. Without `server.state_dir`, it keeps nothing."""

    def __init__(
        self, folder: Path | None, shown: str, worker: Shard | None, files: FilePolicy
    ) -> None:
        self.folder, self._shown, self._worker, self._files = folder, shown, worker, files
        self._sealer = Sealer.from_env()  # APPLIANCE_STATE_KEY, read at start
        name = SINGLE if worker is None else f"worker-{worker.index}.json"
        self.path = None if folder is None else folder / name
        self._file: dict[str, str] = {}  # the config file's entries (every shard's): digests
        self._entries: dict[str, Entry] = {}
        self._problem: str | None = None  # why the document found at start was refused

    @classmethod
    def of(cls, config: AppConfig, worker: Shard | None, files: FilePolicy) -> StreamsState:
        """`config`'s state folder (none without `server.state_dir`); `config` is the whole
        file, before any shard took its share; `worker`: this worker of `serve --workers`."""
        folder, shown = state_folder(config) or (None, "")
        state = cls(folder, shown, worker, files)
        state._file = {s.id: digest(s) for s in config.streams}
        return state

    def baselines(self) -> Path | None:
        """Where the regression watch keeps its baselines, when there is a folder."""
        if self.folder is None:
            return None
        prefix = "" if self._worker is None else f"worker-{self._worker.index}-"
        return self.folder / f"{prefix}baselines.json"

    def status(self) -> StateStatus | None:
        if self.path is None:
            return None
        return StateStatus(self._shown, self.path.name, self._problem, len(self._entries))

    # -- start ------------------------------------------------------------------------
    def open(self, share: Collection[str]) -> Restore:
        """Read this process's document (and adopt departed workers'), merge it with the
        file by the rule; `share`: the ids of the config's streams this process runs."""
        if self.path is None:
            return Restore(frozenset(), [])
        if self._sealer.given and not self._sealer.usable:
            log.error(
                "%s: streams with credentials are not kept (make one with %s)",
                self._sealer.problem,
                MAKE_KEY,
            )
        try:
            found = self._read(self.path)
        except StateFileError as exc:
            log.error("%s; started from the config alone", exc)
            self._problem, found = str(exc), {}
        adopted = self._adopt(found)
        self._entries = self._sealed_at_start(self._current(found))
        if adopted or self._entries != found:
            self._save_at_start(adopted)
        # The file's ids the API changed: the file's entry is not started. One another
        # process runs now (a new shard count) is kept, not applied: its owner runs the file's.
        held = frozenset(sid for sid, e in self._entries.items() if e.over is not None)
        for sid in sorted(held - set(share)):
            log.info("stream %r: changed over the API, now another process's: kept", sid)
        ours = [
            self._unsealed(sid, e)
            for sid, e in self._entries.items()
            if sid in share or sid not in held
        ]
        return Restore(held, [spec for spec in ours if spec is not None])

    def _read(self, path: Path) -> dict[str, Entry]:
        """The document's entries; StateFileError (the file set aside) if one is not valid."""
        body = read_model(path, KIND, self._files, _Body)
        entries = {} if body is None else body.streams
        for sid, entry in entries.items():
            if entry.spec is not None and entry.spec.id != sid:
                problem = f"streams.{sid}: its spec's id is {entry.spec.id!r}"
                raise StateFileError(path, problem, set_aside(path))
        return entries

    def _adopt(self, entries: dict[str, Entry]) -> list[Path]:
        """Departed workers' entries into `entries` (the later change of an id wins)."""
        taken = []
        for path in self._departed():
            try:
                theirs = self._read(path)
            except StateFileError as exc:
                log.error("%s", exc)
                continue
            for sid, entry in theirs.items():
                if sid not in entries or entry.at > entries[sid].at:
                    entries[sid] = entry
            log.info("state: %d stream change(s) taken over from %s", len(theirs), path.name)
            taken.append(path)
        return taken

    def _departed(self) -> list[Path]:
        """The documents of processes that no longer run, which this one takes over."""
        assert self.folder is not None
        if not self.folder.is_dir():
            return []
        return [p for p in sorted(self.folder.iterdir()) if p != self.path and self._takes(p)]

    def _takes(self, path: Path) -> bool:
        """Whether this process takes the document at `path` over (the module docstring)."""
        match = _WORKER.fullmatch(path.name)
        if self._worker is None:
            return match is not None
        index, count = self._worker.index, self._worker.count
        if match is None:
            return path.name == SINGLE and index == 0
        return int(match[1]) >= count and int(match[1]) % count == index

    def _save_at_start(self, adopted: list[Path]) -> None:
        try:
            self._save(self._entries)
        except StateSaveError as exc:
            log.error("%s", exc)  # the adopted files stay: the next start takes them again
            return
        for path in adopted:
            path.unlink(missing_ok=True)

    def _sealed_at_start(self, entries: dict[str, Entry]) -> dict[str, Entry]:
        """The entries an older version wrote in clear, sealed now with a key; without
        one, kept as they are and said (WARNING)."""
        clear = sorted(sid for sid, e in entries.items() if e.in_clear)
        if clear and not self._sealer.usable:
            log.warning(
                "state file %s holds the credentials of stream(s) %s in clear (%s): %s",
                self.path,
                ", ".join(map(repr, clear)),
                self._sealer.problem,
                CLEAR_FIX,
            )
            return entries
        return {sid: self._sealed(e) if e.in_clear else e for sid, e in entries.items()}

    def _sealed(self, entry: Entry) -> Entry:
        """`entry` as the document keeps it: a URL with credentials masked in its spec and
        sealed beside it (its spec as it is when the URL holds none)."""
        if entry.spec is None:
            return entry
        url, sealed = self._sealer.kept(entry.spec.source.url)
        if sealed is None:
            return entry
        source = entry.spec.source.model_copy(update={"url": url})
        spec = entry.spec.model_copy(update={"source": source})
        return entry.model_copy(update={"spec": spec, "sealed_url": sealed})

    def _unsealed(self, stream_id: str, entry: Entry) -> StreamConfig | None:
        """The spec to start, its URL unsealed; None (an ERROR said) when it cannot be."""
        if entry.spec is None or entry.sealed_url is None:
            return entry.spec
        try:
            url = self._sealer.unseal(entry.sealed_url)
        except SealError as exc:
            log.error(
                "stream %r of the state file %s not started: %s (kept there: %s)",
                stream_id,
                self.path,
                exc,
                UNSEAL_FIX,
            )
            return None
        source = entry.spec.source.model_copy(update={"url": url})
        return entry.spec.model_copy(update={"source": source})

    def _current(self, entries: Mapping[str, Entry]) -> dict[str, Entry]:
        """The entries the rule keeps against the file as it is now; the others logged."""
        kept = {}
        for sid, entry in entries.items():
            named = self._file.get(sid)
            if entry.over is None and named is not None:
                log.warning(
                    "stream %r was added over the API and the config file now names it too: "
                    "the file's stream runs, the API's is forgotten",
                    sid,
                )
            elif entry.over is not None and entry.over != named:
                how = "removed" if entry.spec is None else "changed"
                log.info(
                    "stream %r: its entry in the config file changed since it was %s over the "
                    "API: the file's version holds now",
                    sid,
                    how,
                )
            else:
                kept[sid] = entry
        return kept

    # -- changes over the API ------------------------------------------------------------
    def check(self, cfg: StreamConfig) -> None:
        """Before a stream is added over the API: ConfigError (422) naming `source.url`
        when it holds credentials that this state folder could keep in clear only."""
        if self.path is not None:
            self._sealer.check(cfg.source.url, f"stream {cfg.id!r}")

    def added(self, cfg: StreamConfig) -> None:
        """A stream started over the API (`check`ed first); StateSaveError if it cannot
        be kept."""
        entry = Entry(spec=cfg, over=self._file.get(cfg.id), at=time.time())
        self._change(cfg.id, self._sealed(entry))

    def removed(self, stream_id: str, running: bool) -> bool:
        """A stream removed over the API, kept before it stops; True when there is a
        running stream to stop (False: a stream of the state that could not start,
        forgotten now). UnknownStreamError for neither; StateSaveError if not kept."""
        entry = self._entries.get(stream_id)
        if not running and (entry is None or entry.spec is None):
            raise UnknownStreamError(stream_id)
        over = self._file.get(stream_id)
        self._change(
            stream_id, None if over is None else Entry(spec=None, over=over, at=time.time())
        )
        return running

    def _change(self, stream_id: str, entry: Entry | None) -> None:
        if self.path is None:
            return
        entries = dict(self._entries)
        if entry is None:
            entries.pop(stream_id, None)
        else:
            entries[stream_id] = entry
        self._save(entries)
        self._entries = entries

    def _save(self, entries: Mapping[str, Entry]) -> None:
        assert self.path is not None
        body = {"streams": {sid: e.model_dump(mode="json") for sid, e in entries.items()}}
        try:
            write_document(self.path, KIND, body)
        except OSError as exc:
            raise StateSaveError(self._shown, exc) from None

    # -- reloads -------------------------------------------------------------------------
    def hold(self, plan: ReloadPlan, source: AppConfig) -> None:
        """Take out of a reload's `plan` the ids whose API version still holds over the
        new file (`source`, every shard's streams): the file's entry is not applied."""
        file = {s.id: digest(s) for s in source.streams}
        held = {sid for sid, e in self._entries.items() if e.over and file.get(sid) == e.over}
        plan.added = [c for c in plan.added if c.id not in held]
        plan.unchanged += [c.id for c in plan.changed if c.id in held]
        plan.changed = [c for c in plan.changed if c.id not in held]

    def reloaded(self, source: AppConfig) -> None:
        """After a reload applied `source`: the entries its edits overrule are dropped."""
        self._file = {s.id: digest(s) for s in source.streams}
        kept = self._current(self._entries)
        if kept == self._entries or self.path is None:
            return
        self._entries = kept
        try:
            self._save(kept)
        except StateSaveError as exc:  # the next start drops them by the same rule
            log.error("%s", exc)
