"""The fleet's own store: the cameras added through `appliance gateway`, each as the spec
its owner accepted (the POST body), so that the gateway can start it again on its owner
by the rule when the replica count changes (fleet.py's reconcile).

Kept in `<state-dir>/fleet.json` (runtime/statefile.py: written whole and atomically,
0600, read through the file policy; a file that is not ours is refused and set aside,
never silently dropped). Without a state folder it lives in memory only. A spec's source
URL that holds credentials is kept masked, the whole URL sealed beside it under
APPLIANCE_STATE_KEY (`sealed`, runtime/sealing.py), as a replica's own state keeps it:
without a key such a camera is refused (422, `admit`) before it is forwarded; a camera
that cannot be unsealed at start is logged and kept, never started elsewhere. Nothing
here logs or answers the URLs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from appliance.errors import StateSaveError
from appliance.policy.files import FilePolicy
from appliance.runtime.sealing import CLEAR_FIX, UNSEAL_FIX, Sealer, SealError, has_credentials
from appliance.runtime.statefile import StateFileError, read_model, write_document
from appliance.server.context import in_thread

log = logging.getLogger("appliance.fleet")

KIND = "fleet"  # statefile's document kind
FILE_NAME = "fleet.json"


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")  # "format", "kind", ...: statefile's checks

    streams: dict[str, dict[str, Any]] = {}
    sealed: dict[str, str] = {}  # stream id -> its source URL, whole, sealed


class FleetStore:
    """Stream id -> the spec of a camera added through the gateway (its URL whole)."""

    def __init__(self, folder: Path | None, files: FilePolicy) -> None:
        self.path = None if folder is None else folder / FILE_NAME
        self._files = files
        self._sealer = Sealer.from_env()  # APPLIANCE_STATE_KEY, read at start
        self.specs: dict[str, dict[str, Any]] = {}
        # Cameras whose URL this key cannot unseal: (spec as kept, sealed URL), saved as
        # they are until a restart with the right key, or a DELETE.
        self._locked: dict[str, tuple[dict[str, Any], str]] = {}

    def admit(self, spec: Any) -> None:
        """Before a camera is forwarded: ConfigError (422) naming `source.url` when its
        URL holds credentials this store could keep in clear only."""
        url = _url(spec)
        if self.path is not None and url is not None:
            self._sealer.check(url, f"stream {spec.get('id')!r}")

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
        if body is None:
            return
        for stream_id, spec in body.streams.items():
            self._restore(stream_id, spec, body.sealed.get(stream_id))
        if self.specs:
            log.info("%d camera(s) added through the gateway, from %s", len(self.specs), self.path)
        clear = sorted(i for i, s in body.streams.items() if i not in body.sealed and _has(s))
        if clear and self._sealer.usable:
            self._seal_at_start()
        elif clear:
            names = ", ".join(map(repr, clear))
            log.warning(
                "%s holds the credentials of camera(s) %s in clear (%s): %s",
                self.path,
                names,
                self._sealer.problem,
                CLEAR_FIX,
            )

    def _seal_at_start(self) -> None:
        """A document an older version wrote in clear, written again sealed (at start:
        nothing serves yet); a folder that refuses leaves it as it was, said."""
        try:
            self._write()
        except OSError as exc:
            log.error("%s: not sealed, the folder refused the write (%s)", self.path, exc)

    def _restore(self, stream_id: str, spec: dict[str, Any], sealed: str | None) -> None:
        """One kept camera into `specs`, its URL unsealed; one that cannot be is logged
        and kept aside (`_locked`)."""
        if sealed is None:
            self.specs[stream_id] = spec
            return
        try:
            self.specs[stream_id] = _with_url(spec, self._sealer.unseal(sealed))
        except SealError as exc:
            log.error(
                "camera %r of %s is not moved between replicas: %s (kept there: %s)",
                stream_id,
                self.path,
                exc,
                UNSEAL_FIX,
            )
            self._locked[stream_id] = (spec, sealed)

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
        if self.specs.pop(stream_id, None) is None and self._locked.pop(stream_id, None) is None:
            return
        try:
            await self._save()
        except StateSaveError as exc:
            log.error("camera %s removed, but not from the fleet's store: %s", stream_id, exc)

    async def _save(self) -> None:
        if self.path is None:
            return
        try:
            await in_thread(self._write)
        except OSError as exc:
            raise StateSaveError(str(self.path.parent), exc) from None

    def _write(self) -> None:
        """The document: each URL with credentials masked and sealed beside (in clear
        only without a key, as an older version wrote it: `admit` lets no new one in)."""
        assert self.path is not None
        streams = {i: spec for i, (spec, _) in self._locked.items()}
        sealed = {i: token for i, (_, token) in self._locked.items()}
        for stream_id, spec in self.specs.items():
            url, token = self._sealer.kept(_url(spec) or "")
            streams[stream_id] = spec if token is None else _with_url(spec, url)
            if token is not None:
                sealed[stream_id] = token
        write_document(self.path, KIND, {"streams": streams, "sealed": sealed})


def _url(spec: Any) -> str | None:
    """A POST body's source URL (`source` may be the URL itself), or None."""
    source = spec.get("source") if isinstance(spec, dict) else None
    url = source.get("url") if isinstance(source, dict) else source
    return url if isinstance(url, str) else None


def _has(spec: dict[str, Any]) -> bool:
    url = _url(spec)
    return url is not None and has_credentials(url)


def _with_url(spec: dict[str, Any], url: str) -> dict[str, Any]:
    """A copy of `spec` with its source URL replaced."""
    source = spec.get("source")
    return {**spec, "source": {**source, "url": url} if isinstance(source, dict) else url}
