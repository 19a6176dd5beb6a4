"""The signatures signed MQTT commands have used, kept across restarts: a signed command
runs once, whether it is replayed at once or after the appliance restarted (a command
left retained on the broker is refused before this: mqtt_commands).

Within a process, sinks.signing's ReplayGuard holds each signature used for as long as
it verifies (its time plus `tolerance_s`). Across restarts:

- With a state folder (`server.state_dir`), the sink's document there (sinks.base.
  KeptDocument: atomic, 0600) holds them: read at start, written whole on each accepted
  command before it runs (commands are rare). A command whose signature cannot be kept
  (the disk refuses) is refused: after a restart it could run again.
- Without one, or when the document found cannot be used (it is set aside and the error
  logged), nothing tells which signatures an earlier process used: a command signed
  before the sink started (its signature's time, whole seconds, earlier than the start)
  is refused, since it may be a replay of one that ran then. Its sender signs it anew.
  The document records that time too (`since`), so the next process keeps the rule for
  what was signed before it.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from pipelines.types import iso_utc
from sinks.base import KeptDocument
from sinks.signing import ReplayGuard

log = logging.getLogger("sinks.mqtt")

# Signatures remembered within the tolerance window, the oldest forgotten first: a replay
# gets through only after this many newer signed commands in one window (5 minutes).
MAX_SEEN = 10_000
Digest = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]  # sinks.signing.digest


class Kept(BaseModel):
    """The document's body (the store adds and checks "format", "kind", "version")."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    used: Annotated[list[tuple[Digest, Annotated[int, Field(ge=0)]]], Field(max_length=MAX_SEEN)]
    # Signatures older than this (Unix seconds) are refused: no record of them was kept.
    since: float | None = None


class UsedSignatures:
    """The signatures used, and the time before which none is taken. Read when the sink
    starts (on its loop); `refusal` runs on paho's thread."""

    def __init__(
        self, sink: str, tolerance_s: float, kept: KeptDocument | None, now: float | None = None
    ) -> None:
        self._sink, self._tolerance_s, self._kept = sink, tolerance_s, kept
        self._guard = ReplayGuard(tolerance_s, MAX_SEEN)
        started = time.time() if now is None else now
        restored = self._restore(started)
        self.since = started if restored is None else restored.since

    def refusal(self, digest: str, signed_at: int, now: float | None = None) -> str | None:
        """Why the signature (its digest, its time) may not be used, or None: it is new,
        and held (and kept, with a state folder) from now on."""
        if self.since is not None and signed_at < self.since:
            return (
                f"signed before this appliance started (signature time {iso_utc(signed_at)}, "
                f"started {iso_utc(self.since)}): without the signatures an earlier run used "
                "(kept with server.state_dir) it may be a replay; sign it anew"
            )
        if not self._guard.accept(digest, signed_at, now):
            return "replayed: this signature was already used (sign each command anew)"
        try:
            self._keep(now)
        except OSError as exc:
            self._guard.forget(digest)
            log.error("mqtt sink %s: cannot keep the signatures used: %s", self._sink, exc)
            return (
                f"not run: the signatures used could not be kept ({exc.strerror or exc}): "
                "it could run again after a restart"
            )
        return None

    def _restore(self, now: float) -> Kept | None:
        """The kept document, its signatures held again; None when there is none to use."""
        if self._kept is None:
            return None
        try:
            found = self._kept.read(Kept)
        except ValueError as exc:
            log.error(
                "mqtt sink %s: %s; commands signed before this start are refused", self._sink, exc
            )
            return None
        for digest, signed_at in found.used if found is not None else ():
            self._guard.accept(digest, signed_at, now)
        return found

    def _keep(self, now: float | None) -> None:
        if self._kept is None:
            return
        # The guard holds each id until its time plus the tolerance: one time per digest.
        used = [(d, round(until - self._tolerance_s)) for d, until in self._guard.held(now)]
        self._kept.write(Kept(used=used, since=self.since))
