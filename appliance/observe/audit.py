"""The audit: each change made to a running appliance, who asked for it, and how it ended.

A change is what a route, an MQTT command or a signal does to what runs: a stream added,
removed or restarted, a reload, a profiling window opened, a baseline reset, a tune
started, applied or cancelled. Each is recorded once, by the process that acts on it:

- as one structured log line on the `appliance.audit` logger, `audit {json}` (the keys
  of `AuditEntry`), so a log pipeline can parse it without a pattern per message;
- as an event (`type: audit`) on every sink that carries events (MQTT's `events` topic
  for the appliance as a whole; docs/outputs.md);
- in a ring of the last MAX_ENTRIES, which `GET /v1/audit` lists (admin only).

`who` is a token's name (`admin`, `alice`: never the token), `anonymous` where no token
is configured, `mqtt` for a command from the broker, `sighup` for the signal; `alice via
admin` where a gateway (`serve --workers`, `appliance gateway`) forwarded alice's
request with its own token. Refusals are recorded too (a 403 for a role too low, a 422
for a bad body: someone tried), not requests without a valid token (401), which anyone
can send and would flood the log.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from appliance.policy.masking import mask_url
from pipelines.types import iso_utc

log = logging.getLogger("appliance.audit")

MAX_ENTRIES = 1000  # the ring GET /v1/audit lists: a day of a busy operator's changes
MAX_DETAIL_CHARS = 500  # a refusal's message, shortened: the log line stays one line
Outcome = Literal["ok", "refused", "failed"]
# Outputs.publish_event: (streams or None for the appliance, event) -> None, any thread.
Publish = Callable[[list[str] | None, dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One change: when (ISO 8601, UTC), who, what, on what, and how it ended."""

    at: str
    who: str
    action: str  # stream.add, stream.remove, stream.restart, config.reload, ...
    target: str | None  # the stream's id, the window's; None for the appliance
    outcome: Outcome  # ok; refused (4xx: nothing changed); failed (5xx, an error)
    status: int | None = None  # the HTTP answer's status, where there was one
    detail: str | None = None  # why it was refused or failed, or a note (`dry run`)


def outcome_of(status: int) -> Outcome:
    if status < 400:
        return "ok"
    return "refused" if status < 500 else "failed"


class AuditLog:
    """The recent changes, logged and published as they are recorded. Thread-safe."""

    def __init__(self, publish: Publish | None = None, max_entries: int = MAX_ENTRIES) -> None:
        self._publish = publish
        self._entries: collections.deque[AuditEntry] = collections.deque(maxlen=max_entries)
        self._lock = threading.Lock()

    def record(
        self,
        who: str,
        action: str,
        target: str | None = None,
        outcome: Outcome = "ok",
        *,
        status: int | None = None,
        detail: str | None = None,
    ) -> AuditEntry:
        """Record one change (any thread); the entry as it was kept."""
        if detail is not None:
            detail = mask_url(" ".join(detail.split()))[:MAX_DETAIL_CHARS]
        entry = AuditEntry(iso_utc(time.time()), who, action, target, outcome, status, detail)
        with self._lock:
            self._entries.append(entry)
        document = asdict(entry)
        log.info("audit %s", json.dumps(document, ensure_ascii=False))
        if self._publish is not None:
            self._publish(None, {"type": "audit", **document})
        return entry

    def recent(self, limit: int = MAX_ENTRIES) -> list[AuditEntry]:
        """The last `limit` entries, newest first."""
        with self._lock:
            entries = list(self._entries)
        return entries[::-1][:limit]
