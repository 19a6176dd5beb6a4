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


class ReloadError(ApplianceError):
    """A config reload that cannot be applied while running (nothing was changed)."""
