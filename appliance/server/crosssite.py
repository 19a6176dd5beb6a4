"""Browsers and other origins (docs/security.md): a web page the operator visits must not
change anything, with or without a token the browser holds, and a name that an attacker's
DNS server rebinds to the appliance's address must reach nothing. One middleware, just
inside the error middleware of one process (app.py), the `--workers` gateway and the
fleet gateway (appliance/workers/gateway.py), before the token is looked at:

- Host: every request names the appliance: `localhost`, the bind address, any IP address
  when the bind is a wildcard (or a loopback one on a loopback bind: an address cannot
  be rebound), or a name of `server.allowed_hosts` (exact, `.domain` for the domain and
  every name below it, `*` for any: Django's ALLOWED_HOSTS). Else 400, as Django answers
  (a 421 invites a retry on another connection, which gets the same answer). A Unix
  socket (a `--workers` worker's, behind its gateway) has no name a browser resolved.
- Origin: an unsafe method (anything but GET, HEAD, OPTIONS) from a listed origin
  (`server.allowed_origins`) is taken; otherwise it is refused (403) when the browser
  says it comes from another origin (`Sec-Fetch-Site` other than `same-origin` or
  `none`: another port of the same host is `same-site`) or when its `Origin` is not the
  appliance's own (scheme://Host as the request names it; `null` included). A request
  with neither header comes from no browser (curl, the CLI, a gateway forwarding, MQTT
  commands) and is taken: a browser sends one of them on every unsafe request.
- Bodies: a route that declares its body types (`Route.body`) takes a body of those
  types only (parameters such as charset aside): 415 otherwise, so a form cannot pass
  for JSON. A route that declares none reads no body: whatever one is sent changes
  nothing.
- CORS: listed origins only. Their preflights are answered (204) and their answers,
  errors included, carry `Access-Control-Allow-Origin` (streamed answers do not: their
  headers are sent by the handler). Every other origin gets no CORS header: the browser
  sends no JSON request for its pages (their preflight fails) and lets them read no
  answer.

The origin rule is Go's `http.CrossOriginProtection` (Sec-Fetch-Site where the browser
sends it, Origin where it does not) with one step more: an Origin must be ours also when
Sec-Fetch-Site says `same-origin` (scheme and Host included), as the issue asks.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Middleware

from appliance.server.auth import is_loopback
from appliance.server.config import ServerConfig
from appliance.server.errors import ApiError, Handler, UnsupportedMediaTypeError, error_middleware
from appliance.server.routes import ROUTES
from appliance.server.routing import Route

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # RFC 9110 9.2.1: they change nothing
# Sec-Fetch-Site of a page of this very origin, or of the user's own act (a bookmark).
OWN_SITES = frozenset({"same-origin", "none"})
WILDCARDS = frozenset({"", "0.0.0.0", "::"})  # binds that listen on every address
# What a gateway does not pass on to its members: it has judged them (the members see
# the gateway, a client that is no browser, and answer it as such).
BROWSER_HEADERS = frozenset({"origin", "sec-fetch-site"})
DEFAULT_PORTS = {"http": 80, "https": 443}
PREFLIGHT_MAX_AGE_S = 600  # a browser reuses a preflight's answer this long (Chromium: 2 h at most)
CORS_METHODS = "GET, POST, DELETE"  # every method the route table has
CORS_HEADERS = "Authorization, Content-Type"
CORS_EXPOSED = "Location, Retry-After"  # the answers' own headers a console reads
_PORT = re.compile(r"[0-9]{1,5}")
_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]{0,252})?")
SHOWN = 200  # characters of a header value shown in a refusal


class CrossSiteError(ApiError):
    """403: an unsafe request that a page of another origin sent."""

    status = 403


class UnknownHostError(ApiError):
    """400: a Host this appliance does not answer to (a rebound name, a proxy's)."""

    status = 400


Origin = tuple[str, str, int]  # scheme, host, port: an origin compared
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class CrossSite:
    """The names the appliance answers to and the origins it takes changes from, for
    one listener: its bind address and `server.allowed_hosts` / `allowed_origins`."""

    bind: str = "localhost"
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: frozenset[Origin] = frozenset()
    # Derived from the above once (__post_init__), not on every request whose Host is an
    # address: the addresses a Host may give.
    _any_address: bool = field(init=False, repr=False, compare=False)
    _bind_address: Address | None = field(init=False, repr=False, compare=False)
    _loopback_bind: bool = field(init=False, repr=False, compare=False)
    _listed_addresses: frozenset[Address] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        listed = (_address(entry) for entry in self.allowed_hosts)
        derived = {
            "_any_address": self.bind in WILDCARDS,
            "_bind_address": _address(self.bind),
            "_loopback_bind": is_loopback(self.bind),
            "_listed_addresses": frozenset(a for a in listed if a is not None),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)  # frozen: set once, here

    @classmethod
    def for_bind(cls, server: ServerConfig, bind: str | None) -> CrossSite:
        """The rules for serving `server` on `bind` (None: on loopback, as a test's)."""
        listed = (origin_of(o) for o in server.allowed_origins)
        return cls(
            _bind_name(bind),
            tuple(entry.strip("[]") for entry in server.allowed_hosts),
            frozenset(o for o in listed if o is not None),
        )

    def answers_to(self, header: str) -> bool:
        """Whether a Host header names this appliance (its port aside)."""
        host = _host_name(header)
        return host is not None and self._knows(host)

    def _knows(self, host: str) -> bool:
        if host in ("localhost", self.bind):
            return True
        address = _address(host)
        if address is not None and self._takes(address):
            return True
        return any(_matches(entry, host) for entry in self.allowed_hosts)

    def _takes(self, address: Address) -> bool:
        """Any address on a wildcard bind; the bind's own, a loopback one on a loopback
        bind (an address cannot be rebound), or one `server.allowed_hosts` lists."""
        if self._any_address or address == self._bind_address:
            return True
        return (address.is_loopback and self._loopback_bind) or address in self._listed_addresses

    def listed(self, origin: str | None) -> bool:
        return origin is not None and origin_of(origin) in self.allowed_origins

    def check_host(self, request: web.Request) -> None:
        header = request.headers.get("Host")
        if header is None or _on_unix_socket(request):
            return  # every browser sends a Host, and none reaches a Unix socket
        if not self.answers_to(header):
            raise UnknownHostError(
                f"unknown Host {header[:SHOWN]!r}: this appliance answers to its bind "
                "address, localhost and the names in server.allowed_hosts",
                [f"Host: {header[:SHOWN]}"],
            )

    def check_origin(self, request: web.Request) -> None:
        """CrossSiteError unless an unsafe `request` comes from our origin, a listed one
        or no browser."""
        origin = request.headers.get("Origin")
        site = request.headers.get("Sec-Fetch-Site")
        if self.listed(origin):
            return
        if site is not None and site.lower() not in OWN_SITES:
            raise CrossSiteError(
                "cross-site request refused: the browser sent it from a page of another "
                f"origin (Sec-Fetch-Site: {site[:SHOWN]}) that server.allowed_origins does "
                "not list",
                _shown(request),
            )
        if origin is not None and not _sent_to_own(origin, request):
            raise CrossSiteError(
                f"cross-site request refused: a page of {origin[:SHOWN]!r} sent it, which "
                "is neither this appliance's origin nor one of server.allowed_origins",
                _shown(request),
            )


def cross_site_middleware(rules: CrossSite, routes: Iterable[Route] = ROUTES) -> Middleware:
    """`rules` before anything else answers; `routes` say which bodies each takes."""
    bodies = {(r.method, r.path): frozenset(r.body) for r in routes if r.body}

    @web.middleware
    async def cross_site(request: web.Request, handler: Handler) -> web.StreamResponse:
        rules.check_host(request)
        origin = request.headers.get("Origin")
        listed = origin if rules.listed(origin) else None
        if listed is not None and _is_preflight(request):
            return web.Response(status=204, headers=_preflight_headers(listed))
        if request.method not in SAFE_METHODS:
            rules.check_origin(request)
        _check_body(request, bodies)
        if listed is None:
            return await handler(request)
        # The listed origin reads errors too: they become answers here, not outside.
        response = await error_middleware(request, handler)
        if not response.prepared:  # a streamed answer's headers are gone already
            response.headers.update(_cors_headers(listed))
        return response

    return cross_site


def origin_of(text: str) -> Origin | None:
    """`scheme://host[:port]` as compared: lower case, the default port said, no
    trailing dot; None for what is no such origin (`null`, a path, another scheme)."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").rstrip(".")
    if scheme not in DEFAULT_PORTS or not host or parts.path or parts.query:
        return None
    return scheme, _normal(host), port or DEFAULT_PORTS[scheme]


def _sent_to_own(origin: str, request: web.Request) -> bool:
    """Whether the page's `origin` is the one the request was sent to: its scheme (TLS
    or not) and Host. `null` and the like are no origin at all."""
    page, host = origin_of(origin), request.headers.get("Host")
    return page is not None and host is not None and page == origin_of(f"{request.scheme}://{host}")


def _shown(request: web.Request) -> list[str]:
    """The headers a cross-site refusal went by, as `details`."""
    named = ((name, request.headers.get(name)) for name in ("Origin", "Sec-Fetch-Site"))
    return [f"{name}: {value[:SHOWN]}" for name, value in named if value is not None]


def _check_body(request: web.Request, bodies: dict[tuple[str, str], frozenset[str]]) -> None:
    resource = request.match_info.route.resource
    if resource is None or not request.body_exists:
        return
    takes = bodies.get((request.method, resource.canonical))
    if takes and request.content_type not in takes:
        given = request.headers.get("Content-Type")
        raise UnsupportedMediaTypeError(
            f"{request.method} {resource.canonical} takes {' or '.join(sorted(takes))}, "
            f"got {given[:SHOWN] if given else 'no Content-Type'}",
            [f"Content-Type: {given[:SHOWN] if given else '(none)'}"],
        )


def _is_preflight(request: web.Request) -> bool:
    return request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers


def _cors_headers(origin: str) -> dict[str, str]:
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Expose-Headers": CORS_EXPOSED,
        "Vary": "Origin",
    }


def _preflight_headers(origin: str) -> dict[str, str]:
    return {
        **_cors_headers(origin),
        "Access-Control-Allow-Methods": CORS_METHODS,
        "Access-Control-Allow-Headers": CORS_HEADERS,
        "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
    }


def _bind_name(bind: str | None) -> str:
    """The bind address as `knows` compares it; None is a loopback bind (a test's)."""
    if bind is None:
        return "localhost"
    address = _address(bind.strip("[]"))
    return str(address) if address is not None else bind.lower().rstrip(".")


def _host_name(header: str) -> str | None:
    """A Host header's name: lower case, no port, no brackets, no trailing dot, an IPv6
    address written one way; None when it is no host name or address."""
    value = header.strip().lower()
    if value.startswith("["):
        inside, closed, rest = value[1:].partition("]")
        if not closed or (rest and not (rest[:1] == ":" and _PORT.fullmatch(rest[1:]))):
            return None
        try:
            ipaddress.IPv6Address(inside)  # brackets hold an IPv6 address, nothing else
        except ValueError:
            return None
        return _normal(inside)
    name, colon, port = value.partition(":")
    if colon and not _PORT.fullmatch(port):
        return None
    name = name.rstrip(".")
    return name if _NAME.fullmatch(name) else None


def _normal(host: str) -> str:
    address = _address(host)
    return host if address is None else str(address)


def _address(host: str) -> Address | None:
    """`host` as an IP address (an IPv4-mapped IPv6 one as its IPv4), or None."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return address if mapped is None else mapped


def _matches(entry: str, host: str) -> bool:
    """One `server.allowed_hosts` entry against a request's host name (an address entry
    is among CrossSite's listed addresses)."""
    if entry in ("*", host):
        return True
    return entry.startswith(".") and (host == entry[1:] or host.endswith(entry))


def _on_unix_socket(request: web.Request) -> bool:
    transport = request.transport
    sock = None if transport is None else transport.get_extra_info("socket")
    return sock is not None and sock.family == socket.AF_UNIX


# A loopback bind with nothing listed: what a server built without its config gets (tests).
# Last: building one uses the helpers above.
LOOPBACK = CrossSite()
