"""The fleet's own store: the cameras added through `appliance gateway`, each as the spec
its owner accepted (the POST body), so that the gateway can start it again on its owner
by the rule when the replica count changes (fleet.py's reconcile).

Kept in `<state-dir>/fleet.json` (runtime/statefile.py: written whole and atomically,
0600, read through the file policy; a file that is not ours is refused and set aside,
never silently dropped). Without a state folder it lives in memory only. The specs hold
the sources' URLs with their credentials: the file is not an output, and nothing here
logs or answers them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from appliance.errors import StateSaveError
from appliance.policy.files import FilePolicy
from appliance.runtime.statefile import StateFileError, read_model, write_document
from appliance.server.context import in_thread

log = logging.getLogger("appliance.fleet")

KIND = "fleet"  # statefile's document kind
FILE_NAME = "fleet.json"


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")  # "format", "kind", ...: statefile's checks

    streams: dict[str, dict[str, Any]] = {}


class FleetStore:
    """Stream id -> the spec of a camera added through the gateway."""

    def __init__(self, folder: Path | None, files: FilePolicy) -> None:
        self.path = None if folder is None else folder / FILE_NAME
        self._files = files
        self.specs: dict[str, dict[str, Any]] = {}

    def load(self) -> None:
        """The saved specs, if any. A file that is not a fleet document is logged as an
        error and set aside (the message says where): the gateway starts with none, as a
        replica's refused state does not stop the replica either."""
        if self.path is None:
            return
        try:
            body = read_model(self.path, KIND, self._files, _Body)
        except StateFileError as exc:
            log.error("%s: starting with no cameras added through the gateway", exc)
            return
        self.specs = {} if body is None else body.streams
        if self.specs:
            log.info("%d camera(s) added through the gateway, from %s", len(self.specs), self.path)

    async def put(self, stream_id: str, spec: dict[str, Any]) -> None:
        """Keep `spec`; StateSaveError (nothing kept) when the folder refuses."""
        before = self.specs.get(stream_id)
        self.specs[stream_id] = spec
        try:
            await self._save()
        except StateSaveError:
            if before is None:
                del self.specs[stream_id]
            else:
                self.specs[stream_id] = before
            raise

    async def drop(self, stream_id: str) -> None:
        """Forget `stream_id` (nothing to do if it was not added through the gateway).
        The camera is already stopped: a folder that refuses is logged, not raised (the
        file keeps it until the next save; a restarted gateway would start it again)."""
        if self.specs.pop(stream_id, None) is None:
            return
        try:
            await self._save()
        except StateSaveError as exc:
            log.error("camera %s removed, but not from the fleet's store: %s", stream_id, exc)

    async def _save(self) -> None:
        if self.path is None:
            return
        body = {"streams": dict(self.specs)}
        try:
            await in_thread(write_document, self.path, KIND, body)
        except OSError as exc:
            raise StateSaveError(str(self.path.parent), exc) from None
