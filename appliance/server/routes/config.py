"""Config reload, over HTTP and on SIGHUP (serve.py): one path for both."""

from __future__ import annotations

from aiohttp import web

from appliance.policy.roles import Role
from appliance.server.audit import audit_skip
from appliance.server.context import in_thread, runtime_of
from appliance.server.errors import InvalidError
from appliance.server.routing import Fanout, Reply, Route
from appliance.server.schemas import Reloaded
from appliance.server.tls import tls_reloaded


async def reload(request: web.Request) -> web.Response:
    """Re-read the config file: streams added, removed or changed there are started,
    stopped or restarted; unchanged ones and streams added over the API keep running.
    Everything is validated before anything changes. `?dry_run=true`: validate and
    answer what would change, change nothing. Served over TLS, the certificate files
    are read again too (`tls`: what new connections get; the old one if they fail)."""
    checking = dry_run(request)
    if checking:
        audit_skip(request)  # it changes nothing
    plan = await in_thread(runtime_of(request).reload, checking)
    # server.tls's files read again once the config is taken (tls.py): never refused.
    return web.json_response({**plan.summary(), **tls_reloaded(request.app, checking)})


def dry_run(request: web.Request) -> bool:
    """The `dry_run` query flag: `true` or `false`, given at most once; absent is false.
    Anything else is refused rather than guessed at, since a guess that reads "false"
    applies the reload: another parameter (a misspelt `dry_rn=true`), another value
    (`1`, `yes`, `True`) or the flag twice (`?dry_run=false&dry_run=true`)."""
    unknown = sorted(set(request.query) - {"dry_run"})
    if unknown:
        raise InvalidError("invalid query", [f"{unknown[0][:64]!r}: unknown (known: dry_run)"])
    values = request.query.getall("dry_run", ["false"])
    if len(values) > 1:
        raise InvalidError(
            "invalid query", [f"dry_run: given {len(values)} times (give it once: true or false)"]
        )
    if values[0] not in FLAGS:
        raise InvalidError("invalid query", ["dry_run: true or false"])
    return FLAGS[values[0]]


FLAGS = {"true": True, "false": False}


ROUTES = (
    Route(
        "POST",
        "/v1/config/reload",
        reload,
        "Reload the config file",
        (Reply(200, "applied (or, with dry_run, what would be)", Reloaded),),
        errors=(403, 409, 413, 422),
        tag="config",
        query={
            "dry_run": (
                {"type": "boolean", "default": False},
                "`true`: check and answer the plan, change nothing (`true` or `false`, given once)",
            )
        },
        role=Role.ADMIN,
        audit="config.reload",
        workers=Fanout.MERGE,
    ),
)
