"""paho callbacks that cannot stop paho's network thread.

paho calls the sink's callbacks on its network thread (`loop_start`) and, unless told to
`suppress_exceptions`, lets an exception from one end that thread: then nothing reads the
connection or answers keep-alives, commands get no answer and results stay queued, and
no callback says so (issue 39: a malformed signature did it). paho's own suppression
logs only to a logger of its own, off by default. So each callback is wrapped here: an
exception is logged at ERROR with its traceback and the sink's name, and counted, and
paho goes on. A flood (one bad message after another) is logged once a minute per
callback at most, with the count since the last line: it cannot fill the log.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("sinks.mqtt")

LOG_EVERY_S = 60.0  # at most one logged exception per callback per minute
F = TypeVar("F", bound=Callable[..., Any])


class CallbackGuard:
    """Wraps paho callbacks of the sink `sink`: `client.on_message = guard(fn)`. Called
    on paho's thread only; `errors` may be read from any."""

    def __init__(self, sink: str) -> None:
        self.sink = sink
        self.errors = 0  # exceptions caught, every callback together
        self._logged_at: dict[str, float] = {}  # callback -> monotonic time of its last line
        self._quiet: dict[str, int] = {}  # callback -> exceptions not logged since

    def __call__(self, callback: F) -> F:
        name = callback.__name__.lstrip("_")  # "_on_message" -> "on_message"

        @functools.wraps(callback)
        def guarded(*args: Any) -> Any:
            try:
                return callback(*args)
            except Exception:  # paho's thread must go on: logged (rate-limited), counted
                self._failed(name)
                return None

        return guarded  # type: ignore[return-value]

    def _failed(self, name: str) -> None:
        """Count the exception being handled; log it unless one of `name` was this minute."""
        self.errors += 1
        now = time.monotonic()
        last = self._logged_at.get(name)
        if last is not None and now - last < LOG_EVERY_S:
            self._quiet[name] = self._quiet.get(name, 0) + 1
            return
        self._logged_at[name] = now
        quiet = self._quiet.pop(name, 0)
        since = f" ({quiet} more since the last one logged)" if quiet else ""
        log.exception("mqtt sink %s: paho callback %s failed%s", self.sink, name, since)
