"""A synchronous client for the appliance's HTTP API (docs/api.md).

It works from any script, with no event loop: one `urllib` request per call, nothing kept
open between calls. Statuses come back as the very dataclasses the server answers with
(appliance/observe/status.py: `StreamStatus`, `ModelStatus`, ...), parsed and checked by pydantic,
so client and server share one definition of each shape; the other answers likewise
come back as the server's own models (appliance/server/schemas.py: `RunResult`, ...).

A non-2xx answer raises `ApplianceAPIError` built from the API's
`{"error": {"code", "message", "details"}}` body; a server that cannot be reached raises
`ApplianceConnectionError` naming the URL (credentials masked).

`verify_webhook` and `ReplayGuard` (appliance/webhook_receiver.py) are for the other
direction: a program that receives the appliance's webhooks checks each delivery.
"""

from __future__ import annotations

import base64
import http
import http.client
import json
import os
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Collection, Generator, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from pydantic import TypeAdapter, ValidationError

from appliance.client_transport import CA_FILE_ENV, opener
from appliance.observe.slowest import SlowestReport
from appliance.observe.status import (
    ModelStatus,
    Readiness,
    SinkStatus,
    StreamStatus,
    WindowStatus,
)
from appliance.policy.masking import mask_url
from appliance.server.auth import ACTOR_HEADER
from appliance.server.routes.access import AuditList, Caller
from appliance.server.routes.regressions import Rebaselined
from appliance.server.schemas import Reloaded, Removed, RunResult, Validated
from appliance.sources.reach import connect_problem
from appliance.watch.report import WatchReport

# The receiving side, for a program that takes the appliance's webhooks (docs/outputs.md).
from appliance.webhook_receiver import (
    ReplayGuard,
    WebhookDelivery,
    WebhookVerificationError,
    verify_webhook,
)

__all__ = [
    "TOKEN_ENV",
    "ApplianceAPIError",
    "ApplianceClient",
    "ApplianceClientError",
    "ApplianceConnectionError",
    "ReplayGuard",
    "WebhookDelivery",
    "WebhookVerificationError",
    "verify_webhook",
]

T = TypeVar("T")

TOKEN_ENV = "APPLIANCE_API_TOKEN"
JSON_TYPE = "application/json"


class ApplianceClientError(Exception):
    """Base of the client's failures."""


class ApplianceAPIError(ApplianceClientError):
    """The appliance answered with a non-2xx status."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class ApplianceConnectionError(ApplianceClientError):
    """No HTTP answer from the appliance: refused, unresolvable, timed out, cut off.
    `url` and the message have the URL's credentials masked."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the appliance at {url}: {reason}")
        self.url = url
        self.reason = reason


class ApplianceClient:
    """Typed calls for every route of docs/api.md, one blocking request each."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 30.0,
        *,
        actor: str | None = None,
        ca_file: str | Path | None = None,
        unix_socket: Path | None = None,
    ) -> None:
        """`url`: the appliance's base URL; `token`: bearer token, by default the
        APPLIANCE_API_TOKEN environment variable; `timeout`: seconds per request.

        `user:password@` in `url` is sent as HTTP Basic auth (for a proxy in front of the
        appliance) unless there is a bearer token; `self.url` shows it masked. `actor`:
        whom an admin token acts for (the appliance's own forwarding: `mqtt`), as the
        audit records it.

        `https://` is checked against the system's CAs, or a private CA's PEM file:
        `ca_file`, by default the APPLIANCE_CA_FILE environment variable (ValueError
        naming the file when it does not load). `unix_socket`: send every request to
        that socket instead (client_transport.py)."""
        base = url.rstrip("/")
        self.url = mask_url(base)  # what messages show
        self.timeout = timeout
        self._token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._base, self._basic = _split_userinfo(base)
        self._opener = opener(ca_file, unix_socket)
        self._actor = actor

    def health(self) -> dict[str, Any]:
        """Liveness: `{"status": "ok"}` when the process and its event loop answer."""
        return cast(dict[str, Any], self._json("GET", "/health"))

    def ready(self) -> Readiness:
        """Readiness, also when not ready (a 503 answer): `ready`, `models`, `waiting`."""
        return _parse(Readiness, self._json("GET", "/ready", ok=(200, 503)))

    def metrics(self) -> str:
        """The Prometheus text exposition."""
        return self._request("GET", "/metrics").decode("utf-8")

    def streams(self) -> list[StreamStatus]:
        """Every stream's status."""
        return _parse(list[StreamStatus], self._json("GET", "/v1/streams")["streams"])

    def stream(self, stream_id: str) -> StreamStatus:
        """One stream's status with its recent state `transitions`; 404 if unknown."""
        return _parse(StreamStatus, self._json("GET", _stream_path(stream_id)))

    def add_stream(self, stream: Mapping[str, Any]) -> StreamStatus:
        """Start a stream given as in the config file (`id`, `source`, `workflow`,
        `outputs`); 409 if the id exists, 422 if it is invalid (then nothing starts)."""
        return _parse(StreamStatus, self._json("POST", "/v1/streams", dict(stream)))

    def remove_stream(self, stream_id: str) -> Removed:
        """Stop a stream and forget it; 404 if unknown."""
        return _parse(Removed, self._json("DELETE", _stream_path(stream_id)))

    def restart_stream(self, stream_id: str) -> StreamStatus:
        """Stop a stream and start it again from its config; 404 if unknown."""
        return _parse(StreamStatus, self._json("POST", _stream_path(stream_id) + "/restart"))

    def shadow(
        self, stream_id: str, action: str = "status", body: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """A stream's shadow (docs/shadow.md): `start` (body: workflow, every, max_fps),
        `status`, `stop`, `promote` (body: the gates, rollback_s) or `rollback`."""
        method, suffix = SHADOW_ACTIONS[action]
        sent = dict(body or {}) if method == "POST" else None
        return dict(self._json(method, _stream_path(stream_id) + "/shadow" + suffix, sent))

    def run_workflow(
        self,
        image: bytes | Path,
        workflow: str | Mapping[str, Any],
        profile: bool = False,
        video: bool = False,
    ) -> RunResult:
        """Run one JPEG/PNG image (bytes, or a local file) through a workflow (a path on
        the appliance, or an inline workflow); `profile` adds a Chrome `trace`, `video`
        the `video` output as a base64 JPEG."""
        data = image.read_bytes() if isinstance(image, Path) else image
        body = {
            "image": base64.b64encode(data).decode("ascii"),
            "workflow": _workflow_json(workflow),
            "profile": profile,
            "video": video,
        }
        return _parse(RunResult, self._json("POST", "/v1/workflows/run", body))

    def validate_workflow(self, workflow: str | Mapping[str, Any]) -> Validated:
        """Compile a workflow without running it; 422 with every problem in `details`."""
        body = {"workflow": _workflow_json(workflow)}
        return _parse(Validated, self._json("POST", "/v1/workflows/validate", body))

    def sinks(self) -> list[SinkStatus]:
        """The sinks results go to, with their state and counters."""
        return _parse(list[SinkStatus], self._json("GET", "/v1/sinks")["sinks"])

    def models(self) -> list[ModelStatus]:
        """The loaded models with their tensors, providers and batching figures."""
        return _parse(list[ModelStatus], self._json("GET", "/v1/models")["models"])

    def reload(self) -> Reloaded:
        """Re-read the config file and apply it; 422 or 409 when it cannot be applied."""
        return _parse(Reloaded, self._json("POST", "/v1/config/reload"))

    def start_profiling(
        self,
        duration_s: float,
        streams: Collection[str] | None = None,
        ort_operators: bool = False,
    ) -> WindowStatus:
        """Start a profiling window of `duration_s` seconds over `streams` (all by
        default), with ONNX Runtime's operator events if `ort_operators`; it runs on the
        appliance. 409 while another runs (its id in `details`), 422 for a duration out of
        range or an unknown stream."""
        body: dict[str, Any] = {"duration_s": duration_s, "ort_operators": ort_operators}
        if streams is not None:
            body["streams"] = list(streams)
        return _parse(WindowStatus, self._json("POST", "/v1/profiling", body))

    def profiling_window(self, window_id: str) -> WindowStatus:
        """A window's status: `running`, `done` or `failed` (with `error`); 404 if unknown."""
        return _parse(WindowStatus, self._json("GET", _window_path(window_id)))

    def profiling_trace(self, window_id: str) -> dict[str, Any]:
        """A finished window's Chrome trace (`traceEvents`, ...); 409 while it runs or if
        it failed, 404 if unknown."""
        return cast(dict[str, Any], self._json("GET", _window_path(window_id) + "/trace"))

    def whoami(self) -> Caller:
        """The token's name and role, as the appliance knows it (`viewer`, `operator`,
        `admin`; `anonymous` and admin where no token is configured)."""
        return _parse(Caller, self._json("GET", "/v1/me"))

    def audit(self, limit: int = 100) -> AuditList:
        """The appliance's recent changes, newest first (admin only): who, what, on what,
        how it ended."""
        return _parse(AuditList, self._json("GET", f"/v1/audit?limit={limit}"))

    def regressions(self) -> WatchReport:
        """The regression watch: the host's slowdown if any (`host`), every `active`
        regression (a block, a model's session.run or queue wait, a frame age) with its
        baseline and current p50/p99, the change before it and its `evidence` trace, and
        the ended ones (`history`), newest first."""
        return _parse(WatchReport, self._json("GET", "/v1/regressions"))

    def rebaseline(self, stream_id: str) -> Rebaselined:
        """Learn the stream's baselines (its blocks, frame age, the models it runs) again
        from now, after an intended change: their regressions end. The rows learning
        (`rows`) for `learn_s` seconds; 404 if the stream is unknown."""
        return _parse(Rebaselined, self._json("POST", _stream_path(stream_id) + "/baseline"))

    def slowest(
        self, stream_id: str, since: str | None = None, limit: int | None = None
    ) -> SlowestReport:
        """The stream's slowest frames since `since` (a time with its offset, or a span
        back: `15m`; default the last hour), slowest first: each block's time, the model
        runs it waited for and its trace's path; 404 if the stream is unknown."""
        query = {k: str(v) for k, v in (("since", since), ("limit", limit)) if v is not None}
        suffix = "?" + urllib.parse.urlencode(query) if query else ""
        return _parse(
            SlowestReport, self._json("GET", _stream_path(stream_id) + "/slowest" + suffix)
        )

    def frame_trace(self, stream_id: str, seq: int, around: int | None = None) -> dict[str, Any]:
        """Frame `seq`'s Chrome trace with `around` frames either side; 404 (naming the
        oldest frame held) once it has rotated away."""
        suffix = "" if around is None else f"?around={around}"
        path = f"{_stream_path(stream_id)}/frames/{int(seq)}/trace{suffix}"
        return cast(dict[str, Any], self._json("GET", path))

    def openapi(self) -> dict[str, Any]:
        """The OpenAPI 3.1 document of the API."""
        return cast(dict[str, Any], self._json("GET", "/openapi.json"))

    def latest(self, stream_id: str) -> dict[str, Any]:
        """The stream's newest result (docs/outputs.md); 404 before its first one."""
        return cast(dict[str, Any], self._json("GET", _stream_path(stream_id) + "/latest"))

    def snapshot(self, stream_id: str) -> bytes:
        """The newest frame of the stream's `video` output as JPEG bytes."""
        return self._request("GET", _stream_path(stream_id) + "/snapshot.jpg")

    def watch(self, stream_id: str) -> Generator[dict[str, Any], None, None]:
        """Every result the reader keeps up with, as they come (server-sent events); a
        slow reader gets the newest, its `skipped` says how many it missed. Ends when the
        appliance stops; close the iterator to leave earlier."""
        req = self._build("GET", _stream_path(stream_id) + "/events", None)
        try:
            # No read timeout: an idle stream sends a comment every 15 s.
            with self._opener.open(req, timeout=max(self.timeout, 60.0)) as resp:
                for raw in resp:
                    line = raw.decode("utf-8").rstrip("\n")
                    if line.startswith("data: "):
                        yield cast(dict[str, Any], json.loads(line[6:]))
        except urllib.error.HTTPError as err:
            with err:
                payload = err.read()
            raise _api_error(err.code, payload) from None
        except (OSError, http.client.HTTPException) as exc:
            raise ApplianceConnectionError(self.url, mask_url(_reason(self.url, exc))) from None

    def _json(self, method: str, path: str, body: Any = None, ok: Collection[int] = ()) -> Any:
        return json.loads(self._request(method, path, body, ok))

    def _request(self, method: str, path: str, body: Any = None, ok: Collection[int] = ()) -> bytes:
        """One request; the answer's body, or an error named for the failure."""
        req = self._build(method, path, body)
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                return bytes(resp.read())
        except urllib.error.HTTPError as err:
            with err:
                payload = err.read()
            if err.code in ok:
                return bytes(payload)
            raise _api_error(err.code, payload) from None
        except (OSError, http.client.HTTPException) as exc:  # URLError is an OSError
            url = self.url + path
            raise ApplianceConnectionError(url, mask_url(_reason(url, exc))) from None

    def _build(self, method: str, path: str, body: Any) -> urllib.request.Request:
        headers = self._headers(body)
        try:
            req = urllib.request.Request(self._base + path, method=method, headers=headers)
        except ValueError as exc:  # no scheme: urllib's "unknown url type" names the URL
            raise ApplianceConnectionError(self.url + path, mask_url(str(exc))) from None
        if body is not None:
            req.data = json.dumps(body).encode("utf-8")
        return req

    def _headers(self, body: Any) -> dict[str, str]:
        headers = {"Accept": JSON_TYPE}
        if body is not None:
            headers["Content-Type"] = JSON_TYPE
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        elif self._basic:
            headers["Authorization"] = f"Basic {self._basic}"
        if self._actor is not None:
            headers[ACTOR_HEADER] = self._actor
        return headers


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}  # one per answer shape: building one costs ms
# Built under a lock: pydantic reads the dataclasses' source (ast.parse) to build one, and
# CPython 3.11's parser is not safe across threads ("AST constructor recursion depth
# mismatch", python/cpython#106905): three MQTT restarts forwarded at once failed so.
_ADAPTERS_LOCK = threading.Lock()


def _parse(shape: type[T], data: Any) -> T:
    """An answer as the status dataclass(es) it is; a shape mismatch (an appliance of
    another version) raises ApplianceClientError naming the field."""
    try:
        adapter = _ADAPTERS.get(shape) or _adapter(shape)
        return cast(T, adapter.validate_python(data))
    except ValidationError as exc:
        raise ApplianceClientError(f"unexpected answer from the appliance: {exc}") from None


def _adapter(shape: type[T]) -> TypeAdapter[T]:
    with _ADAPTERS_LOCK:
        if shape not in _ADAPTERS:
            _ADAPTERS[shape] = TypeAdapter(shape)
        return _ADAPTERS[shape]


def _split_userinfo(url: str) -> tuple[str, str | None]:
    """The URL without `user:password@`, and those as a Basic credential (None without):
    urllib would take them for part of the host name."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # malformed (a bad IPv6 literal): the first request reports it
        return url, None
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
    credential = base64.b64encode(pair.encode("utf-8")).decode("ascii")
    return parts._replace(netloc=host).geturl(), credential


SHADOW_ACTIONS = {  # action -> (method, path below /v1/streams/{id}/shadow)
    "start": ("POST", ""),
    "status": ("GET", ""),
    "stop": ("DELETE", ""),
    "promote": ("POST", "/promote"),
    "rollback": ("POST", "/rollback"),
}


def _stream_path(stream_id: str) -> str:
    return "/v1/streams/" + urllib.parse.quote(stream_id, safe="")


def _window_path(window_id: str) -> str:
    return "/v1/profiling/" + urllib.parse.quote(window_id, safe="")


def _workflow_json(workflow: str | Mapping[str, Any]) -> str | dict[str, Any]:
    return workflow if isinstance(workflow, str) else dict(workflow)


def _api_error(status: int, payload: bytes) -> ApplianceAPIError:
    """From the API's error body; any other body (a proxy's page) is kept as the message."""
    text = payload.decode("utf-8", errors="replace")
    try:
        error = json.loads(text)["error"]
        return ApplianceAPIError(status, error["code"], error["message"], error.get("details"))
    except (ValueError, TypeError, KeyError, AttributeError):
        return ApplianceAPIError(status, _status_code(status), text.strip() or "(empty body)")


def _status_code(status: int) -> str:
    """`502` -> `bad_gateway`, in the style of the API's own codes."""
    try:
        return http.HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "http_error"


def _reason(url: str, exc: BaseException) -> str:
    """Why `url` did not answer: refused, unresolved, timed out (as a camera's fault is
    said), or the error's own words."""
    reason = getattr(exc, "reason", None) or exc  # URLError wraps the socket's error
    if isinstance(reason, ssl.SSLCertVerificationError):
        return (
            f"its TLS certificate is not trusted ({reason.verify_message}): give its CA "
            f"with --ca-file or ${CA_FILE_ENV}"
        )
    if isinstance(reason, OSError):
        return connect_problem(url, reason)
    return str(reason) or type(reason).__name__
