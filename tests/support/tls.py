"""Certificates made in the test (trustme: a CA and the certificates it issues, in memory)
and what a TLS client sees of a server: the certificate it was served."""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import trustme
from cryptography import x509


@dataclass(frozen=True)
class Issued:
    """A certificate for 127.0.0.1 issued by the test CA, and its serial number."""

    leaf: trustme.LeafCert
    serial: int

    def write(self, cert: Path, key: Path) -> None:
        """The chain (leaf first) and the key as PEM files, replacing what was there."""
        cert.parent.mkdir(parents=True, exist_ok=True)
        cert.write_bytes(b"".join(blob.bytes() for blob in self.leaf.cert_chain_pems))
        key.write_bytes(self.leaf.private_key_pem.bytes())


class TestCA:
    """A private CA: the certificates it issues for 127.0.0.1 and the client context
    (or CA file) that trusts them."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self) -> None:
        self.ca = trustme.CA()

    def issue(self, name: str, valid: tuple[datetime, datetime] | None = None) -> Issued:
        """A certificate with common name `name` (a fresh serial each time), valid from
        now for trustme's default years, or over `valid` (from, until)."""
        since, until = valid or (None, None)
        leaf = self.ca.issue_cert(
            "127.0.0.1", "localhost", common_name=name, not_before=since, not_after=until
        )
        serial = x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()).serial_number
        return Issued(leaf, serial)

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context

    def write_ca(self, path: Path) -> Path:
        self.ca.cert_pem.write_to_path(str(path))
        return path


def served_serial(port: int, context: ssl.SSLContext, host: str = "127.0.0.1") -> int:
    """The serial number of the certificate a new connection to host:port is served
    (verified by `context`)."""
    with (
        socket.create_connection((host, port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number
