"""The appliance's own failures, named for what went wrong (aiortc's exceptions.py
practice). The HTTP layer maps these, and the config/workflow/model errors, to answers in
one place (appliance/server/errors.py)."""

from __future__ import annotations


class ApplianceError(Exception):
    """Base of the runtime's request-level failures."""


class UnknownStreamError(ApplianceError, KeyError):
    """No stream has this id."""

    def __init__(self, stream_id: str) -> None:
        super().__init__(f"unknown stream {stream_id!r}")
        self.stream_id = stream_id

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class StreamExistsError(ApplianceError):
    """A stream with this id already runs."""

    def __init__(self, stream_id: str) -> None:
        super().__init__(f"stream {stream_id!r} already exists")
        self.stream_id = stream_id


class NoShadowError(ApplianceError, KeyError):
    """The stream runs no shadow."""

    def __init__(self, stream_id: str) -> None:
        super().__init__(f"stream {stream_id!r} runs no shadow")
        self.stream_id = stream_id

    def __str__(self) -> str:
        return str(self.args[0])


class ShadowExistsError(ApplianceError):
    """The stream runs a shadow already (one at a time: stop it first)."""

    def __init__(self, stream_id: str) -> None:
        super().__init__(f"stream {stream_id!r} runs a shadow already: stop it first")
        self.stream_id = stream_id


class PromotionRefusedError(ApplianceError):
    """A shadow's promotion failed its gates (nothing was switched)."""

    def __init__(self, stream_id: str, refusals: list[str]) -> None:
        why = "; ".join(refusals)
        super().__init__(f"stream {stream_id!r}: the shadow was not promoted: {why}")
        self.refusals = refusals


class NoRollbackError(ApplianceError, KeyError):
    """The stream has no promotion to roll back (none, or its window ended)."""

    def __str__(self) -> str:
        return str(self.args[0])


class ReloadError(ApplianceError):
    """A config reload that cannot be applied while running (nothing was changed)."""


class WindowBusyError(ApplianceError):
    """A profiling window is already running (one at a time)."""

    def __init__(self, running_id: str) -> None:
        super().__init__(f"a profiling window is already running: {running_id}")
        self.running_id = running_id


class UnknownWindowError(ApplianceError, KeyError):
    """No profiling window has this id."""

    def __init__(self, window_id: str) -> None:
        super().__init__(f"unknown profiling window {window_id!r}")
        self.window_id = window_id

    def __str__(self) -> str:
        return str(self.args[0])


class UnknownSessionError(ApplianceError, KeyError):
    """No WebRTC session has this id."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"unknown WebRTC session {session_id!r}")

    def __str__(self) -> str:
        return str(self.args[0])


class WindowRequestError(ApplianceError, ValueError):
    """A profiling window request that cannot be run (duration, unknown streams)."""


class WindowNotReadyError(ApplianceError):
    """The window's trace is not there (yet): it is still running, or it failed."""


class LimitError(ApplianceError):
    """A configured limit was hit: the request is refused, nothing else is affected.

    `limit` is the config name (`limits.max_streams`), `value` its setting; `status` is
    the HTTP answer (409 for a count, 413 for a size, 429 to retry later, 408 for time).
    """

    def __init__(
        self,
        limit: str,
        value: object,
        message: str,
        *,
        status: int = 409,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{message} ({limit} = {value})")
        self.limit = limit
        self.value = value
        self.status = status
        self.retry_after_s = retry_after_s


class FileAccessError(ApplianceError):
    """A file named by a request, config or workflow that the access policy refuses.

    The message names the rule, the path as given and where it was named, never the
    file's content. `status` is 403 for a rule, 422 for a file that is not there.
    """

    def __init__(
        self, kind: str, path: str, rule: str, where: str = "", status: int = 403, fix: str = ""
    ) -> None:
        prefix = f"{where}: " if where else ""
        advice = f"; {fix}" if fix else ""  # in the message, not in `rule` (details)
        super().__init__(f"{prefix}{kind} file {path!r}: {rule}{advice}")
        self.kind = kind
        self.path = path
        self.rule = rule
        self.where = where
        self.status = status


class NoResultError(ApplianceError, KeyError):
    """The stream has not produced a result yet (or is not running)."""

    def __init__(self, stream_id: str) -> None:
        super().__init__(f"stream {stream_id!r} has no result yet")
        self.stream_id = stream_id

    def __str__(self) -> str:
        return str(self.args[0])


class FrameNotHeldError(ApplianceError, KeyError):
    """A frame in no trace still held: rotated away, not traced, or not run yet.
    `oldest`: the stream's oldest frame still held (None: none is)."""

    def __init__(self, stream_id: str, seq: int, oldest: int | None) -> None:
        held = "none is" if oldest is None else f"the oldest held is {oldest}"
        super().__init__(f"stream {stream_id!r}: frame {seq} is in no trace still held ({held})")
        self.stream_id, self.seq, self.oldest = stream_id, seq, oldest

    def __str__(self) -> str:
        return str(self.args[0])


class StateSaveError(ApplianceError):
    """A change over the API that could not be kept in `server.state_dir` (a folder not
    writable, a full disk): it was undone, and the request fails (HTTP 503)."""

    def __init__(self, folder: str, error: OSError) -> None:
        reason = error.strerror or str(error)
        super().__init__(
            f"state folder {folder}: cannot save the change ({reason}, errno {error.errno}); "
            "it was undone"
        )
        self.folder = folder
        self.reason = reason
