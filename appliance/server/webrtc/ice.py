"""What WebRTC peers are told about the network: ICE servers from the config only, and the
host addresses the appliance offers as candidates."""

from __future__ import annotations

from collections.abc import Sequence
from ipaddress import IPv4Address, IPv6Address

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer

from appliance.config import WebRtcConfig


def rtc_configuration(config: WebRtcConfig) -> RTCConfiguration:
    """The configured STUN/TURN servers, and no other: aiortc's default (a public STUN
    server, when none is given) would tell a third party about every viewer."""
    servers = [
        RTCIceServer(urls=list(s.urls), username=s.username, credential=s.credential)
        for s in config.ice_servers
    ]
    return RTCConfiguration(iceServers=servers)


def offer_host_addresses(addresses: Sequence[IPv4Address | IPv6Address]) -> None:
    """Offer exactly `addresses` as host candidates (none given: aioice's rule, every
    interface's address but loopback). aioice reads its interfaces in one module-level
    function and has no option for this, so that function is replaced, for the process:
    the appliance runs one WebRTC configuration."""
    if not addresses:
        return
    v4 = [str(a) for a in addresses if a.version == 4]
    v6 = [str(a) for a in addresses if a.version == 6]

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return (v4 if use_ipv4 else []) + (v6 if use_ipv6 else [])

    aioice.ice.get_host_addresses = host_addresses
