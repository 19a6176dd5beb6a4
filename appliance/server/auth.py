"""Bearer-token auth for the API, and the rule that refuses an open, exposed server.

The token comes from `APPLIANCE_API_TOKEN` (wins: secrets belong in the environment, not
in a file) or `server.token`. Every route needs it except the probes (`/health`, `/ready`,
`/metrics`) and the API description (`/openapi.json`, `/docs`), which are open on a
loopback bind and need the token otherwise (`server.open_probes` overrides), and the web
viewer's page and assets, always open (they hold no data; the page asks for the token
and sends it with each API call it makes). Paths are matched as route templates
(`/streams/{id}`), so an unknown path needs the token. With no token
at all (allowed on loopback, or with `--insecure`) nothing needs one; on an exposed
address that is `insecure`: warned about at start and reported by `/ready`.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Middleware

from appliance.config import ConfigError
from appliance.server.config import ServerConfig
from appliance.server.errors import Handler, UnauthorizedError

TOKEN_ENV = "APPLIANCE_API_TOKEN"
REALM = 'Bearer realm="appliance"'
# The policy's `insecure`, for /ready (set by the Server that applied the policy).
INSECURE = web.AppKey("insecure", bool)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (also IPv4-mapped) or `localhost`; any other name counts as exposed."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False  # a host name or "": it may resolve to anything, assume exposed
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


@dataclass(frozen=True, slots=True)
class AuthPolicy:
    """Who may call what; `open_paths` are answered without a token when `probes_open`,
    `public_paths` always. `insecure`: no token, on an address that is not loopback
    (`--insecure`)."""

    token: str | None = field(default=None, repr=False)
    probes_open: bool = True
    open_paths: frozenset[str] = frozenset()
    insecure: bool = False
    public_paths: frozenset[str] = frozenset()

    @classmethod
    def for_bind(
        cls,
        server: ServerConfig,
        host: str,
        *,
        insecure: bool = False,
        environ: Mapping[str, str],
    ) -> AuthPolicy:
        """The policy for serving on `host`; ConfigError when an exposed bind has no token."""
        token = environ.get(TOKEN_ENV) or server.token
        loopback = is_loopback(host)
        if token is None and not loopback and not insecure:
            raise ConfigError(
                [
                    f"server.token: required to serve on {host!r}, which is not a loopback "
                    f"address: set server.token or {TOKEN_ENV}, or pass --insecure on a "
                    "trusted network"
                ],
                "server",
            )
        probes_open = loopback if server.open_probes is None else server.open_probes
        return cls(token, probes_open, insecure=token is None and not loopback)

    def needs_token(self, path: str) -> bool:
        """`path`: a route's template (`/v1/streams/{id}`), or the request's path when no
        route matched it."""
        if self.token is None or path in self.public_paths:
            return False
        return not (self.probes_open and path in self.open_paths)

    def check(self, header: str | None) -> None:
        """Raise UnauthorizedError unless `header` is `Bearer <our token>`."""
        if self.token is None:
            return
        scheme, _, value = (header or "").partition(" ")
        if not header or scheme.lower() != "bearer":
            raise UnauthorizedError(
                "missing bearer token (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": REALM},
            )
        # Constant time: the comparison must not tell how much of a guess was right.
        # surrogatepass: any str aiohttp decoded from the header encodes.
        given = value.strip().encode("utf-8", "surrogatepass")
        if not hmac.compare_digest(given, self.token.encode("utf-8", "surrogatepass")):
            raise UnauthorizedError(
                "wrong bearer token",
                headers={"WWW-Authenticate": f'{REALM}, error="invalid_token"'},
            )


def auth_middleware(policy: AuthPolicy) -> Middleware:
    """Inside the error middleware, so a refusal is answered as JSON with its header."""

    @web.middleware
    async def check_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource  # None: no route matched
        if policy.needs_token(request.path if resource is None else resource.canonical):
            policy.check(request.headers.get("Authorization"))
        return await handler(request)

    return check_token
