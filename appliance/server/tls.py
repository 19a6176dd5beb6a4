"""The API over TLS (`server.tls: {cert_file, key_file}`): one listener, its certificate
read through the owner's file policy at start and again on every reload (SIGHUP,
`POST /v1/config/reload`), so that a renewed certificate (cert-manager rewrites its
Secret's files) takes effect without a restart.

The files are also watched (`ApiTls.watch`, every WATCH_EVERY_S): when what their paths
lead to changes (kubelet swaps a mounted Secret's files when cert-manager renews it), the
certificate is reloaded as a SIGHUP would, with nobody to send one.

How a reload swaps the certificate: the listener's context never changes (asyncio's
server holds it); its SNI callback, which OpenSSL calls for every ClientHello (with or
without a server name), hands each new handshake the context of the certificate loaded
last (`SSLObject.context`, the documented way to choose a certificate per connection).
A reload builds a whole new context from the files and only then makes it the one new
handshakes get: connections already open keep theirs, and files that do not load (a key
that does not match, a file not there) change nothing; the answer and the log say why,
and the previous certificate goes on serving.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from appliance.config import AppConfig, ConfigError
from appliance.errors import FileAccessError, LimitError
from appliance.policy.files import FileKind, FilePolicy
from appliance.server.config import TlsConfig
from pipelines.types import iso_utc

log = logging.getLogger("appliance.server")

# Between two looks at the files: kubelet updates a mounted Secret about a minute after
# it changes (its sync period), and cert-manager renews a third of a lifetime early.
WATCH_EVERY_S = 60.0
CERT = "server.tls.cert_file"
KEY = "server.tls.key_file"


@dataclass(frozen=True, slots=True)
class Certificate:
    """The leaf certificate the API serves, as its answers and logs describe it."""

    subject: str
    """RFC 4514, as OpenSSL prints it: `CN=appliance.example.com,O=Example`."""
    issuer: str
    serial: str
    """Hexadecimal, as `openssl x509 -serial` prints it."""
    not_before: str
    """ISO 8601 UTC."""
    not_after: str
    """ISO 8601 UTC: renew before then."""
    expired: bool
    """Past `not_after` (or before `not_before`) when it was loaded: clients refuse it."""

    def describe(self) -> str:
        """`CN=appliance.example.com, serial 1F2E, expires 2027-01-01T00:00:00.000Z`."""
        late = " (EXPIRED)" if self.expired else ""
        return f"{self.subject}, serial {self.serial}, expires {self.not_after}{late}"


@dataclass(frozen=True, slots=True)
class TlsReloaded:
    """What a reload did with `server.tls`: the `tls` member of a reload's answer."""

    served: Certificate
    """The certificate new connections get now (with `dry_run`: would get)."""
    loaded: bool
    """The files were read anew and their certificate is the one served (with
    `dry_run`: they load)."""
    error: str | None
    """Why they were not (the previous certificate is still served); null when loaded."""


# Attribute docstrings become the fields' descriptions in /openapi.json (as status.py's).
for _cls in (Certificate, TlsReloaded):
    setattr(_cls, "__pydantic_config__", {"use_attribute_docstrings": True})  # noqa: B010


class ApiTls:
    """The listener's TLS: its context (`context`, given to the TCP site once) and the
    certificate served now. `source` gives the config as it is now (the runtime's after
    a reload, or the file read again: a gateway's), whose `server.tls` names the files."""

    def __init__(self, config: AppConfig, source: Callable[[], AppConfig]) -> None:
        """ConfigError naming `server.tls.cert_file` or `key_file` when they do not load."""
        assert config.server.tls is not None
        self._source = source
        self._seen = _identity(config)  # the files as last read: the watch's reference
        try:
            self._current, self.served = load(config.server.tls, FilePolicy.owner(config))
        except TlsFileError as exc:
            raise ConfigError([str(exc)], "server") from None
        # The context the site holds: its callback hands each handshake the newest one.
        self.context = self._current
        self.context.sni_callback = self._choose
        _warn_if_expired(self.served)

    @classmethod
    def of(cls, config: AppConfig, source: Callable[[], AppConfig]) -> ApiTls | None:
        """The API's TLS when `server.tls` is set, else None (plain HTTP)."""
        return None if config.server.tls is None else cls(config, source)

    def reload(self, dry_run: bool = False) -> TlsReloaded:
        """Read the files `server.tls` names now and serve their certificate to new
        connections (`dry_run`: only check that they load). Never raises: a failure
        keeps the certificate served and says why."""
        try:
            config = self._source()
            if not dry_run:  # a failure is said once per change of the files, not per look
                self._seen = _identity(config)
            tls = config.server.tls
            if tls is None:
                raise TlsFileError(
                    "server.tls: not in the config file any more; the API stays on TLS "
                    "until a restart"
                )
            context, served = load(tls, FilePolicy.owner(config))
        except (TlsFileError, ConfigError) as exc:
            return TlsReloaded(self.served, loaded=False, error=str(exc))
        if not dry_run:
            self._current, self.served = context, served
            _warn_if_expired(served)
        return TlsReloaded(served, loaded=True, error=None)

    def changed(self) -> bool:
        """Whether the files `server.tls` names now are not those last read: another
        file behind a path (a Secret's mount swaps a symlink), or one rewritten."""
        try:
            return _identity(self._source()) != self._seen
        except ConfigError:
            return False  # a config file mid-edit: its own reload says what is wrong

    async def watch(self, every_s: float = WATCH_EVERY_S) -> None:
        """Reload (and log it) when the files change, looking every `every_s` seconds;
        until cancelled (the listener's `tls-watch` task)."""
        while True:
            await asyncio.sleep(every_s)
            if await asyncio.to_thread(self.changed):
                reload_logged(self, "the files changed")

    def _choose(self, connection: ssl.SSLObject, server_name: str | None, _: object) -> None:
        # OpenSSL's servername callback, on the loop's thread: nothing here may fail.
        if connection.context is not self._current:
            connection.context = self._current


# The API's TLS, for the reload route and /ready (absent: plain HTTP).
TLS = web.AppKey("tls", ApiTls)


def tls_reloaded(app: web.Application, dry_run: bool) -> dict[str, Any]:
    """A reload answer's `tls` member for `app`'s listener: `{}` over plain HTTP."""
    tls = app.get(TLS)
    return {} if tls is None else {"tls": dataclasses.asdict(tls.reload(dry_run))}


def reload_logged(tls: ApiTls | None, why: str, log_to: logging.Logger = log) -> None:
    """`tls.reload()` as a SIGHUP does it: the outcome in the log only."""
    if tls is None:
        return
    done = tls.reload()
    if done.error is None:
        log_to.info("TLS certificate reloaded (%s): %s", why, done.served.describe())
    else:
        log_to.error(
            "TLS certificate not reloaded (%s), still serving %s: %s",
            why,
            done.served.describe(),
            done.error,
        )


class TlsFileError(Exception):
    """`server.tls`'s files do not make a certificate to serve; the message names the
    field, the path as given and the reason, never the files' content."""


def load(tls: TlsConfig, files: FilePolicy) -> tuple[ssl.SSLContext, Certificate]:
    """A server context with `tls`'s certificate chain and key, read through `files`
    (the owner's policy: any path, regular files, at most CERTIFICATE_BYTES each), and
    its leaf certificate described. TlsFileError naming the field at fault."""
    cert_pem = _read(files, tls.cert_file, CERT)
    key_pem = _read(files, tls.key_file, KEY)
    try:
        leaf = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise TlsFileError(f"{CERT}: {str(tls.cert_file)!r} holds no PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:  # encrypted: there is no one to ask for the passphrase
        raise TlsFileError(
            f"{KEY}: {str(tls.key_file)!r} is encrypted; give it unencrypted"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise TlsFileError(f"{KEY}: {str(tls.key_file)!r} holds no PEM private key") from None
    if not _same_key(key, leaf):
        raise TlsFileError(
            f"{KEY}: {str(tls.key_file)!r} does not match the certificate in {CERT} "
            f"({str(tls.cert_file)!r})"
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # TLS 1.2 and up
    try:
        # The paths again (ssl reads files only), checked by the policy again. A password
        # callback that gives none: OpenSSL would otherwise ask on the terminal.
        context.load_cert_chain(
            files.path(tls.cert_file, FileKind.CERTIFICATE, CERT),
            files.path(tls.key_file, FileKind.CERTIFICATE, KEY),
            password=_no_password,
        )
    except (FileAccessError, LimitError) as exc:
        raise TlsFileError(str(exc)) from None
    except (ssl.SSLError, OSError) as exc:  # the files changed since they were read
        raise TlsFileError(f"{CERT}, {KEY}: OpenSSL cannot load them: {_reason(exc)}") from None
    return context, _described(leaf)


def _read(files: FilePolicy, path: Path, where: str) -> bytes:
    try:
        return files.read_bytes(path, FileKind.CERTIFICATE, where)
    except (FileAccessError, LimitError) as exc:
        raise TlsFileError(str(exc)) from None


def _same_key(key: PrivateKeyTypes, leaf: x509.Certificate) -> bool:
    """The key is the certificate's: their public halves are the same bytes."""
    der, spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return key.public_key().public_bytes(der, spki) == leaf.public_key().public_bytes(der, spki)


def _described(leaf: x509.Certificate) -> Certificate:
    before, after = leaf.not_valid_before_utc, leaf.not_valid_after_utc
    now = time.time()
    return Certificate(
        subject=leaf.subject.rfc4514_string(),
        issuer=leaf.issuer.rfc4514_string(),
        serial=f"{leaf.serial_number:X}",
        not_before=_iso(before),
        not_after=_iso(after),
        expired=not before.timestamp() <= now <= after.timestamp(),
    )


def _iso(moment: datetime) -> str:
    return iso_utc(moment.timestamp())


def _no_password() -> bytes:
    raise TlsFileError(f"{KEY}: the key is encrypted; give it unencrypted")


def _reason(exc: BaseException) -> str:
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)


def _identity(config: AppConfig) -> tuple[tuple[int, ...] | None, ...] | None:
    """What the certificate and key paths lead to: (device, inode, size, mtime) each, or
    None for one that is not there."""
    tls = config.server.tls
    if tls is None:
        return None
    return tuple(_stat(config.resolve(p.expanduser())) for p in (tls.cert_file, tls.key_file))


def _stat(path: Path) -> tuple[int, ...] | None:
    try:
        info = path.stat()  # through symlinks: what a read would get
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _warn_if_expired(served: Certificate) -> None:
    if served.expired:
        log.warning(
            "%s: the certificate served is not valid now (%s): clients refuse it",
            CERT,
            served.describe(),
        )
