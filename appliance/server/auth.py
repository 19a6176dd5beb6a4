"""Bearer tokens with roles, and the rule that refuses an open, exposed server.

Tokens: `APPLIANCE_API_TOKEN` (wins: secrets belong in the environment, not in a file) or
`server.token` is the admin token, named `admin`; `server.tokens` adds named tokens with
a role each (viewer < operator < admin), read from an environment variable or a file.
Every route declares the least role it needs (`Route.role`): a request without a valid
token is answered 401, one whose token's role is too low 403 naming the role needed.
The probes (`/health`, `/ready`, `/metrics`) and the API description (`/openapi.json`,
`/docs`) are open on a loopback bind and need a token otherwise (`server.open_probes`
overrides); the web viewer's page and assets are always open (they hold no data; the
page asks for the token and sends it with each API call it makes). Routes are found by
their operation id (aiohttp's route name), so an unknown path needs a token. With no
token at all (allowed on loopback, or with `--insecure`) nothing needs one and every
caller is the admin `anonymous`; on an exposed address that is `insecure`: warned about
at start and reported by `/ready`.

Who made a request (its `Principal`) is kept on the request and in `ACTOR` for the
request's task: the audit records it, and the `--workers` and fleet gateways send it on
(`ACTOR_HEADER`) with their own admin token, so the process that acts records who asked.
The header is believed from an admin token only (the gateways' own).
"""

from __future__ import annotations

import contextvars
import hmac
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from appliance.config import ConfigError
from appliance.errors import FileAccessError, LimitError
from appliance.policy.files import FileKind, FilePolicy
from appliance.policy.roles import Role
from appliance.server.config import ServerConfig
from appliance.server.errors import ForbiddenError, Handler, UnauthorizedError
from appliance.server.routing import Route

TOKEN_ENV = "APPLIANCE_API_TOKEN"
ADMIN_NAME = "admin"  # the name APPLIANCE_API_TOKEN / server.token goes by
ANONYMOUS = "anonymous"  # every caller, when no token is configured
REALM = 'Bearer realm="appliance"'
# Whom a gateway forwards for: the name of the principal it authenticated (not a secret).
ACTOR_HEADER = "X-Appliance-Actor"
MAX_ACTOR_CHARS = 128
# The policy's `insecure`, for /ready (set by the Server that applied the policy).
INSECURE = web.AppKey("insecure", bool)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request is from: a token's name (never the token) and its role; `via`, the
    gateway's token that forwarded it on the principal's behalf."""

    name: str
    role: Role
    via: str | None = None

    @property
    def who(self) -> str:
        """As the audit and the logs say it: `alice`, or `alice via admin`."""
        return self.name if self.via is None else f"{self.name} via {self.via}"


OPEN = Principal(ANONYMOUS, Role.VIEWER)  # a caller of an open route, unauthenticated
NO_TOKENS = Principal(ANONYMOUS, Role.ADMIN)  # every caller, where no token is configured
PRINCIPAL = web.RequestKey("principal", Principal)  # the request's key for it
REFUSED = web.RequestKey("refused_by_role", bool)  # the role check refused it here
# The current request's principal, for code the request's task calls (gateway clients).
ACTOR: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("actor", default=None)


@dataclass(frozen=True, slots=True)
class ApiToken:
    """One configured token: its name, role and secret value (never in a repr)."""

    name: str
    role: Role
    secret: bytes = field(repr=False)


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


def configured_tokens(
    server: ServerConfig, environ: Mapping[str, str], files: FilePolicy | None = None
) -> tuple[ApiToken, ...]:
    """The tokens `server` configures: the admin token first, then `server.tokens` in
    order. ConfigError naming each entry whose token cannot be read, is empty, or is
    another entry's too (two names for one token would make the audit lie)."""
    # Where each token was configured, for the problems: the admin's, then the entries'.
    tokens: list[tuple[str, ApiToken]] = []
    admin = environ.get(TOKEN_ENV) or server.token
    if admin is not None:
        tokens.append(("server.token", ApiToken(ADMIN_NAME, Role.ADMIN, _encoded(admin))))
    problems: list[str] = []
    for i, entry in enumerate(server.tokens):
        where = f"server.tokens[{i}]"
        try:
            value = _token_value(entry.token_env, entry.token_file, environ, files, where)
        except (FileAccessError, LimitError) as exc:
            problems.append(str(exc))
            continue
        if value is None:
            problems.append(f"{where}.token_env: {entry.token_env} is not set or empty")
            continue
        tokens.append((where, ApiToken(entry.name, Role.named(entry.role), _encoded(value))))
    problems += _clashes(tokens)
    if problems:
        raise ConfigError(problems, "server")
    return tuple(token for _, token in tokens)


def admin_token(tokens: Iterable[ApiToken]) -> str | None:
    """The first admin token of `tokens` (what the appliance forwards its own requests
    with); None when there are no tokens; ConfigError when none is an admin's."""
    listed = tuple(tokens)
    admin = next((t for t in listed if t.role is Role.ADMIN), None)
    if admin is not None:
        return admin.secret.decode("utf-8", "surrogatepass")
    if listed:
        raise ConfigError(
            [
                "server.tokens: forwarding (serve --workers, appliance gateway, their MQTT "
                f"commands) needs an admin token: set {TOKEN_ENV} or give one an admin role"
            ],
            "server",
        )
    return None


def _token_value(
    env: str | None,
    file: Path | None,
    environ: Mapping[str, str],
    files: FilePolicy | None,
    where: str,
) -> str | None:
    if env is not None:
        return environ.get(env) or None
    assert file is not None  # TokenConfig: exactly one of the two
    if files is None:
        raise FileAccessError(FileKind.SECRET, str(file), "no file policy to read it", where)
    text = files.read_text(file, FileKind.SECRET, f"{where}.token_file").strip()
    if not text:
        raise FileAccessError(FileKind.SECRET, str(file), "empty", f"{where}.token_file", 422)
    return text


def _clashes(tokens: list[tuple[str, ApiToken]]) -> list[str]:
    """A name given twice, or one token under two names: (where, token) in order."""
    problems: list[str] = []
    for i, (where, token) in enumerate(tokens):
        earlier = [t for _, t in tokens[:i]]
        if any(t.name == token.name for t in earlier):
            problems.append(f"{where}.name: {token.name!r} is taken")
        if any(hmac.compare_digest(token.secret, t.secret) for t in earlier):
            problems.append(f"server.tokens: the token of {token.name!r} is another's too")
    return problems


def _encoded(token: str) -> bytes:
    # surrogatepass: any str aiohttp decoded from a header encodes.
    return token.strip().encode("utf-8", "surrogatepass")


@dataclass(frozen=True, slots=True)
class AuthPolicy:
    """Who may call what. `tokens`: the configured tokens (none: nothing needs one);
    routes by operation id in `roles` (the least role each needs), `open_paths` answered
    without a token when `probes_open`, `public_paths` always. `insecure`: no token, on
    an address that is not loopback (`--insecure`)."""

    tokens: tuple[ApiToken, ...] = ()
    probes_open: bool = True
    open_paths: frozenset[str] = frozenset()
    insecure: bool = False
    public_paths: frozenset[str] = frozenset()
    roles: Mapping[str, Role] = field(default_factory=dict)

    @classmethod
    def for_bind(
        cls,
        server: ServerConfig,
        host: str,
        *,
        insecure: bool = False,
        environ: Mapping[str, str],
        files: FilePolicy | None = None,
    ) -> AuthPolicy:
        """The policy for serving on `host`; ConfigError when an exposed bind has no
        token, or a configured token cannot be read (`files`: the owner's policy)."""
        tokens = configured_tokens(server, environ, files)
        loopback = is_loopback(host)
        if not tokens and not loopback and not insecure:
            raise ConfigError(
                [
                    f"server.token: required to serve on {host!r}, which is not a loopback "
                    f"address: set server.token, {TOKEN_ENV} or server.tokens, or pass "
                    "--insecure on a trusted network"
                ],
                "server",
            )
        probes_open = loopback if server.open_probes is None else server.open_probes
        return cls(tokens, probes_open, insecure=not tokens and not loopback)

    @classmethod
    def admin_only(cls, token: str | None, probes_open: bool = True) -> AuthPolicy:
        """One admin token (none: nothing needs one), for an embedded server."""
        tokens = () if token is None else (ApiToken(ADMIN_NAME, Role.ADMIN, _encoded(token)),)
        return cls(tokens, probes_open)

    @property
    def token(self) -> str | None:
        """The admin token a gateway forwards with (None: no token is configured).
        ConfigError when tokens are, but none is an admin's: a gateway could forward
        nobody's requests."""
        return admin_token(self.tokens)

    def with_routes(self, routes: Iterable[Route]) -> AuthPolicy:
        """This policy over a route table: its probes, public paths and roles."""
        table = tuple(routes)
        return replace(
            self,
            open_paths=frozenset(r.path for r in table if r.probe),
            public_paths=frozenset(r.path for r in table if r.public),
            roles={r.operation_id: r.role for r in table},
        )

    def needs_token(self, path: str) -> bool:
        """`path`: a route's template (`/v1/streams/{id}`), or the request's path when no
        route matched it."""
        if not self.tokens or path in self.public_paths:
            return False
        return not (self.probes_open and path in self.open_paths)

    def authenticate(self, header: str | None, actor: str | None = None) -> Principal:
        """The principal `header` (`Bearer <token>`) names; UnauthorizedError unless it is
        one of ours. `actor`: the ACTOR_HEADER, believed from an admin token only."""
        if not self.tokens:
            return NO_TOKENS
        scheme, _, value = (header or "").partition(" ")
        if not header or scheme.lower() != "bearer":
            raise UnauthorizedError(
                "missing bearer token (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": REALM},
            )
        given = _encoded(value)
        # Constant time, every token compared: the answer must not tell how much of a
        # guess was right, nor which token it was nearest.
        found = [t for t in self.tokens if hmac.compare_digest(given, t.secret)]
        if not found:
            raise UnauthorizedError(
                "wrong bearer token",
                headers={"WWW-Authenticate": f'{REALM}, error="invalid_token"'},
            )
        token = found[0]
        if actor and token.role is Role.ADMIN and _plain(actor):
            return Principal(actor, Role.ADMIN, via=token.name)
        return Principal(token.name, token.role)

    def authorize(self, principal: Principal, operation: str | None) -> None:
        """ForbiddenError unless `principal` holds the role `operation` needs (an
        unknown route: any valid token, its answer is a 404 or 405)."""
        needed = self.roles.get(operation or "", Role.VIEWER)
        require(principal, needed)


def require(principal: Principal, needed: Role, what: str = "this") -> None:
    """ForbiddenError unless `principal` holds `needed` (a handler's own check, where the
    role depends on the body: tune's `apply`)."""
    if principal.role < needed:
        raise ForbiddenError(
            f"{what} needs the {needed.label} role; the token {principal.name!r} has "
            f"{principal.role.label}",
            [f"role: {needed.label} needed, {principal.role.label} held"],
        )


def principal_of(request: web.Request) -> Principal:
    """Who made `request` (set by the auth middleware)."""
    principal: Principal = request.get(PRINCIPAL, OPEN)
    return principal


def _plain(actor: str) -> bool:
    return len(actor) <= MAX_ACTOR_CHARS and actor.isprintable()


def auth_middleware(policy: AuthPolicy) -> Middleware:
    """Inside the error middleware, so a refusal is answered as JSON with its header."""

    @web.middleware
    async def check_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route
        resource = route.resource  # None: no route matched
        path = request.path if resource is None else resource.canonical
        guarded = policy.needs_token(path)
        if guarded:
            header = request.headers.get("Authorization")
            principal = policy.authenticate(header, request.headers.get(ACTOR_HEADER))
        else:
            principal = NO_TOKENS if not policy.tokens else OPEN
        request[PRINCIPAL] = principal  # before the role check: the audit records a 403
        ACTOR.set(principal)  # this request's task only (a copy of the context)
        if guarded:
            try:
                policy.authorize(principal, route.name)
            except ForbiddenError:
                request[REFUSED] = True  # here, by role: a gateway's audit records it
                raise
        return await handler(request)

    return check_token
