"""What WebRTC peers are told about the network: ICE servers from the config only, and the
host addresses the appliance offers as candidates (the configured ones, else the server's
bind address when it is a single one)."""

from __future__ import annotations

from collections.abc import Sequence
from ipaddress import IPv4Address, IPv6Address, ip_address

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer

from appliance.server.webrtc.config import WebRtcConfig

IPAddress = IPv4Address | IPv6Address
AIOICE_HOST_ADDRESSES = aioice.ice.get_host_addresses  # aioice's own rule, kept to restore


def rtc_configuration(config: WebRtcConfig) -> RTCConfiguration:
    """The configured STUN/TURN servers, and no other: aiortc's default (a public STUN
    server, when none is given) would tell a third party about every viewer."""
    servers = [
        RTCIceServer(urls=list(s.urls), username=s.username, credential=s.credential)
        for s in config.ice_servers
    ]
    return RTCConfiguration(iceServers=servers)


def host_addresses_for(configured: Sequence[IPAddress], bind_host: str | None) -> list[IPAddress]:
    """The host candidates to offer: `webrtc.host_addresses` when set; else the address
    the server is bound to, when it is one (a viewer that reached the API there can reach
    the media there too, and a loopback-only appliance offers only loopback; `localhost`
    is loopback's name); else none given, i.e. aioice's rule, for a wildcard bind
    (0.0.0.0, ::) or another host name."""
    if configured:
        return list(configured)
    if (bind_host or "").lower().rstrip(".") == "localhost":  # RFC 6761: always loopback
        return [ip_address("127.0.0.1")]
    try:
        address = ip_address(bind_host or "")
    except ValueError:  # a host name: it may stand for any of the interfaces
        return []
    return [] if address.is_unspecified else [address]


def offer_host_addresses(addresses: Sequence[IPAddress]) -> None:
    """Offer exactly `addresses` as host candidates (none given: aioice's rule, every
    interface's address but loopback). aioice reads its interfaces in one module-level
    function and has no option for this, so that function is replaced, for the process:
    the appliance runs one WebRTC configuration."""
    if not addresses:
        aioice.ice.get_host_addresses = AIOICE_HOST_ADDRESSES
        return
    v4 = [str(a) for a in addresses if a.version == 4]
    v6 = [str(a) for a in addresses if a.version == 6]

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return (v4 if use_ipv4 else []) + (v6 if use_ipv6 else [])

    aioice.ice.get_host_addresses = host_addresses
