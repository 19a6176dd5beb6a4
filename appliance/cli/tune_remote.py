"""A tune on a running appliance from the client's side (`appliance tune --url`): start
it, show its progress while it runs, cancel it when asked (Ctrl-C), and return how it
ended: the same JSON a local tune reports (appliance/tune/results.py).

The requests go through `ApplianceClient` (appliance/client.py): the same auth headers,
and an HTTP error raises `ApplianceAPIError` with the appliance's own message (a 409
naming the tune that runs, a 422 naming the knob, a 501 under `serve --workers`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

from appliance.client import ApplianceAPIError, ApplianceClient

POLL_S = 1.0
TUNE_PATH = "/v1/tune"
RUNNING = "running"


class TuneClient(ApplianceClient):
    """The appliance's /v1/tune routes."""

    def start_tune(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """POST /v1/tune: the tune's first status (`state: running`). 409 while one
        runs, 422 for a knob or value the running workload does not have."""
        return cast(dict[str, Any], self._json("POST", TUNE_PATH, dict(request)))

    def tune_status(self) -> dict[str, Any]:
        """GET /v1/tune: `state`, `progress` while running, `result` once ended."""
        return cast(dict[str, Any], self._json("GET", TUNE_PATH))

    def cancel_tune(self) -> dict[str, Any]:
        """DELETE /v1/tune: the tune stops and restores the starting settings; 409 when
        none runs."""
        return cast(dict[str, Any], self._json("DELETE", TUNE_PATH))


def run_remote(
    base_url: str,
    token: str | None,
    request: dict[str, Any],
    show: Callable[[dict[str, Any]], None],
    stop: threading.Event,
    poll_s: float = POLL_S,
) -> dict[str, Any]:
    """Start a tune on the appliance at `base_url` and follow it to its end: `show`
    gets each progress seen while it runs (polled every `poll_s`); once `stop` is set
    the tune is cancelled (its starting settings restored) and followed until it has
    ended. Returns the final GET /v1/tune answer (`state`, `result`, `error`)."""
    client = TuneClient(base_url, token=token)
    client.start_tune(request)
    cancelled = False
    while True:
        status = client.tune_status()
        if status["state"] != RUNNING:
            return status
        if status.get("progress") is not None:
            show(status["progress"])
        if not stop.is_set():
            stop.wait(poll_s)  # woken by `stop`: a Ctrl-C is acted on at once
        elif not cancelled:
            cancelled = _cancel(client)  # then its state at once: it may have ended
        else:
            time.sleep(poll_s)


def _cancel(client: TuneClient) -> bool:
    """DELETE the tune; True also when it had just ended (a 409: nothing runs)."""
    try:
        client.cancel_tune()
    except ApplianceAPIError as exc:
        if exc.status != 409:
            raise
    return True
