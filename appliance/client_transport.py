"""How `ApplianceClient` (client.py) reaches the appliance: one urllib opener per client.

- `https://` URLs are checked against the system's CAs, or against a private CA's file
  (`ca_file`, else `APPLIANCE_CA_FILE`): an appliance with a certificate of its own CA
  (docs/security.md, "The API over TLS").
- `unix_socket`: every request goes to that Unix socket instead of the URL's host (the
  URL still gives the Host header and the path): a `--workers` worker's way to its own
  gateway, which listens on a socket in its private folder.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import urllib.request
from pathlib import Path
from typing import Any

CA_FILE_ENV = "APPLIANCE_CA_FILE"


class CaFileError(ValueError):
    """The CA file cannot be used: the message names it and why."""


def opener(
    ca_file: str | Path | None = None, unix_socket: Path | None = None
) -> urllib.request.OpenerDirector:
    """The opener for a client: https trusting `ca_file` (default `$APPLIANCE_CA_FILE`;
    neither: the system's CAs), or every request over `unix_socket` (no proxy).
    CaFileError when the CA file does not load."""
    if unix_socket is not None:
        return urllib.request.build_opener(
            urllib.request.ProxyHandler({}), _UnixHandler(unix_socket)
        )
    named = ca_file if ca_file is not None else os.environ.get(CA_FILE_ENV) or None
    return urllib.request.build_opener(urllib.request.HTTPSHandler(context=tls_context(named)))


def tls_context(ca_file: str | Path | None) -> ssl.SSLContext:
    """A client context: the system's CAs, or only `ca_file`'s (PEM, one or more)."""
    if ca_file is None:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ValueError) as exc:  # missing, unreadable, or no certificate in it
        why = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
        raise CaFileError(f"CA file {str(ca_file)!r}: {why}") from None


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, host: str, *, path: Path, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self._path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _UnixHandler(urllib.request.HTTPHandler):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self._path = path

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        def connection(host: str, **kwargs: Any) -> _UnixConnection:
            return _UnixConnection(host, path=self._path, **kwargs)

        return self.do_open(connection, req)
