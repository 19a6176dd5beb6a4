"""Which hosts a stream's source may connect to: `server.allowed_source_hosts`.

Without the list (the default) a source may name any host. With it, whoever holds the API
token cannot make the appliance connect to other hosts of its network, nor learn from a
stream's `last_error` which of them listen on which port (issue 23: sources as a port
scanner).

An entry is a host name, an IP address or a CIDR network (`10.1.0.0/16`). A source's host
is allowed when the list names it (exactly, in any case; no wildcards), or when it is an
address in a listed network, or a name whose every address (IPv4 and IPv6) lies in them.
Files and /dev/video devices are not hosts.

Two checks: `refusal`, when a stream is configured or added over the API, reads the URL
only (it looks nothing up, so its answer says nothing of whether a name exists or where it
points); `connect_refusal`, just before a reader connects, resolves a name again, as DNS
may have changed. Both refuse with the one message `NOT_ALLOWED`.

What this does not stop (a firewall on the appliance's host is the complete answer):
FFmpeg resolves the name once more when it connects, so a DNS server that answers
differently within that moment gets through; and an allowed server may send the readers
on elsewhere (an RTSP or HTTP redirect, an HLS playlist naming other hosts).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str], Iterable[str]]  # a host name -> its addresses, as text

NOT_ALLOWED = "host not allowed (server.allowed_source_hosts)"

# RFC 1123 labels; "_" as some internal names have it. A final "." is the root.
_LABEL = r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")  # fullmatch: `$` passes "a\n"


def parse_entry(entry: str) -> str | Network:
    """One entry of the list: a host name (lower case, without a final ".") or a network
    (an address is a network of one). ValueError naming what it should be. Taken as
    written: "cam\n" is no host name (nor is " cam")."""
    text = entry
    if "/" in text:
        try:
            return _unmapped_network(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not a CIDR network (such as 10.1.0.0/16)") from None
    address = _address(text)
    if address is not None:
        return ipaddress.ip_network(address)
    if not _HOST_NAME.fullmatch(text) or text.replace(".", "").isdigit():
        raise ValueError(
            f"{entry!r} is not a host name, IP address or CIDR network"
            " (no wildcards: list each name, or the network)"
        )
    return text.rstrip(".").lower()


def _check_entry(entry: str) -> str:
    parse_entry(entry)
    return entry


HostEntry = Annotated[str, AfterValidator(_check_entry)]
"""A config entry of `server.allowed_source_hosts`, checked when the config loads."""


def url_host(url: str) -> str | None:
    """The host a source URL connects to, as the readers find it (the text after the last
    "@" before the path, without the port); "" when it has none; None for a file or a
    device (no "://"). The config refuses URLs that readers would parse otherwise."""
    if "://" not in url:
        return None
    try:
        return urlsplit(url).hostname or ""
    except ValueError:  # an unclosed "[" of an IPv6 literal
        return ""


@dataclass(frozen=True, slots=True)
class SourceHosts:
    """`server.allowed_source_hosts`, parsed: `SourceHosts.of(entries)`."""

    names: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()
    any_host: bool = True

    @classmethod
    def of(cls, entries: Iterable[str] | None) -> SourceHosts:
        """The policy of a config's list; None allows any host. ValueError for an entry
        that is no host name, address or network (the config refuses it first)."""
        if entries is None:
            return cls()
        parsed = [parse_entry(e) for e in entries]
        names = frozenset(p for p in parsed if isinstance(p, str))
        networks = tuple(p for p in parsed if not isinstance(p, str))
        return cls(names, networks, any_host=False)

    def refusal(self, url: str) -> str | None:
        """`NOT_ALLOWED` when the URL's host is surely not allowed, read from the URL alone:
        an address outside the networks, or a name not listed when no network is. A name
        that a network may hold is left to `connect_refusal`."""
        host = url_host(url)
        if host is None or self.any_host or self._named(host):
            return None
        address = _address(host)
        if address is not None:
            return None if self._holds(address) else NOT_ALLOWED
        return None if host and self.networks else NOT_ALLOWED

    def connect_refusal(self, url: str, resolve: Resolver | None = None) -> str | None:
        """`NOT_ALLOWED` unless the URL's host is listed by name, or it and every address
        it resolves to now (`resolve`, getaddrinfo by default) lie in the networks. A name
        that does not resolve is refused with the same words."""
        problem = self.refusal(url)
        host = url_host(url)
        if problem or not host or self.any_host or self._named(host) or _address(host):
            return problem
        try:
            addresses = [_address(a) for a in (resolve or _resolve)(host)]
        except (OSError, UnicodeError):
            return NOT_ALLOWED
        allowed = all(a is not None and self._holds(a) for a in addresses)
        return None if addresses and allowed else NOT_ALLOWED

    def _named(self, host: str) -> bool:
        return host.rstrip(".").lower() in self.names

    def _holds(self, address: Address) -> bool:
        return any(address in network for network in self.networks)


ANY_HOST = SourceHosts()


def _address(text: str) -> Address | None:
    """An IP address (an IPv4-mapped IPv6 address as the IPv4 one it reaches), or None."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _unmapped_network(network: Network) -> Network:
    """::ffff:10.0.0.0/104 as 10.0.0.0/8: the addresses it reaches."""
    if isinstance(network, ipaddress.IPv6Network) and network.prefixlen >= 96:
        mapped = network.network_address.ipv4_mapped
        if mapped is not None:
            return ipaddress.ip_network(f"{mapped}/{network.prefixlen - 96}")
    return network


def _resolve(host: str) -> list[str]:
    """Every address a name resolves to now, as the readers' resolver finds them."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]
