"""A TLS camera's certificate, checked before its credentials are sent (`source.tls`).

`https://` and `rtsps://` sources verify the server's certificate and name by default,
against `source.tls.ca_file` or the system's store, in every reader that may open them:
the HTTP probe and our RTP reader (Python's ssl, the context below) and FFmpeg's HTTP
and RTSP readers (its `tls_verify` and `ca_file` options). `verify: false` accepts any
certificate; the grabber says so once per stream start.

FFmpeg is given a CA file even for the system's store: the GnuTLS inside PyAV's wheels
has no store of its own (gnutls_certificate_set_x509_system_trust loads 0 certificates
there), so `tls_verify=1` alone would refuse every camera. The store is the file OpenSSL
and Go read: `SSL_CERT_FILE`, else the first bundle found where Linux distributions keep
one. FFmpeg checks the certificate after its handshake and before it writes a request;
Python's ssl during the handshake: either way the camera receives nothing.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from appliance.sources.base import SourceError, mask_url
from appliance.sources.config import SourceConfig
from appliance.sources.reach import origin

TLS_SCHEMES = frozenset({"https", "rtsps"})
# Where Linux distributions keep the system's CA bundle (Go's crypto/x509 root_linux.go).
SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Gentoo, Arch
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL 6
    "/etc/ssl/ca-bundle.pem",  # openSUSE
    "/etc/pki/tls/cacert.pem",  # OpenELEC
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",  # CentOS, RHEL 7
    "/etc/ssl/cert.pem",  # Alpine
)
_FIX = (
    "give the CA that signed it (or the camera's own self-signed certificate) in "
    "source.tls.ca_file, or set source.tls.verify: false to read it unchecked"
)


@dataclass(frozen=True, slots=True)
class CameraTls:
    """One open's TLS settings: Python's context (the probe, the RTP reader) and the same
    trust as FFmpeg's options."""

    context: ssl.SSLContext
    ffmpeg: dict[str, str]
    verify: bool


def uses_tls(url: str) -> bool:
    return urlsplit(url).scheme.lower() in TLS_SCHEMES


def camera_tls(cfg: SourceConfig, resolve_path: Callable[[str], Path]) -> CameraTls | None:
    """The settings for `cfg`'s camera; None when its URL is not https or rtsps.
    SourceError (the masked URL, then `source.tls.ca_file`) when that file cannot be
    used, or when no system store is found. Built at each open: a renewed CA file takes
    effect then."""
    if not uses_tls(cfg.url):
        return None
    try:
        return _checked(cfg, resolve_path)
    except SourceError as exc:
        raise SourceError(f"{mask_url(cfg.url)}: {exc}") from None


def _checked(cfg: SourceConfig, resolve_path: Callable[[str], Path]) -> CameraTls:
    if not cfg.tls.verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return CameraTls(context, {"tls_verify": "0"}, verify=False)
    named = cfg.tls.ca_file
    bundle = system_bundle() if named is None else resolve_path(str(named))
    if bundle is None:
        raise SourceError(
            "no system CA store found (SSL_CERT_FILE, or one of "
            f"{', '.join(SYSTEM_BUNDLES)}): install the ca-certificates package, or give "
            "the camera's CA in source.tls.ca_file"
        )
    shown = f"source.tls.ca_file {str(named)!r}" if named is not None else f"CA store {bundle}"
    if not bundle.is_file():
        raise SourceError(f"{shown}: file not found")
    try:
        context = ssl.create_default_context(cafile=str(bundle))
    except (ssl.SSLError, OSError) as exc:
        raise SourceError(f"{shown}: no PEM CA certificate in it ({exc})") from None
    return CameraTls(context, {"tls_verify": "1", "ca_file": str(bundle)}, verify=True)


def system_bundle() -> Path | None:
    """The system's CA bundle file, read again at each call (SSL_CERT_FILE may change)."""
    given = os.environ.get("SSL_CERT_FILE", "").strip()
    if given:
        return Path(given)
    found = ssl.get_default_verify_paths().cafile  # None when OpenSSL's file is absent
    candidates = ([found] if found else []) + list(SYSTEM_BUNDLES)
    return next((Path(c) for c in candidates if Path(c).is_file()), None)


def certificate_problem(url: str, tls: CameraTls, timeout_s: float) -> str | None:
    """Why the camera's certificate is not trusted, found by a TLS handshake of our own
    (nothing is sent after it); None when the handshake succeeds or fails otherwise.
    FFmpeg says only "Input/output error" for it."""
    if not tls.verify:
        return None
    _, host, port = origin(url)
    try:
        with (
            socket.create_connection((host, port), timeout=timeout_s) as sock,
            tls.context.wrap_socket(sock, server_hostname=host),
        ):
            return None
    except ssl.SSLCertVerificationError as exc:
        return untrusted(exc)
    except (OSError, ValueError):  # not the certificate: the caller says what it knows
        return None


def untrusted(exc: ssl.SSLCertVerificationError) -> str:
    """A certificate verification failure, with what to do about it."""
    reason = exc.verify_message or exc.reason or str(exc)
    return f"the camera's TLS certificate is not trusted ({reason}): {_FIX}"
