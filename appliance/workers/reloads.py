"""Config reloads across a gateway's members (`serve --workers` or `appliance gateway`):
`POST /v1/config/reload` and SIGHUP, in two phases so that a refusal changes nothing
anywhere."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from appliance.policy.roles import Role
from appliance.server.auth import ACTOR, Principal
from appliance.server.tls import ApiTls
from appliance.server.tls import reload_logged as reload_tls_logged
from appliance.workers.clients import MemberClients, MemberUnavailableError
from appliance.workers.merge import merge_reloads


class Gateway(Protocol):
    """What a reload needs of a gateway (appliance/workers/gateway.py): its members'
    clients, and its table of who runs which stream (cleared: a reload may move them)."""

    clients: MemberClients
    owners: dict[str, int]


async def reload_all(gw: Gateway, dry_run: bool = False) -> tuple[int, Any]:
    """Two phases: every worker checks its share of the file (a dry run), and only when
    all accept does each apply it, so a refusal changes nothing anywhere. The first
    refusal is the answer (a worker not answering: 503). Also SIGHUP's path."""
    phases = ["/v1/config/reload?dry_run=true"] + ([] if dry_run else ["/v1/config/reload"])
    for path in phases:
        answers = await gw.clients.fan_out("POST", path)
        missing = [i for i in range(gw.clients.count) if i not in answers]
        if missing:
            raise gw.clients.unavailable(missing[0], "during the reload")
        refused = [answers[i] for i in sorted(answers) if answers[i][0] != 200]
        if refused:
            return refused[0]
    gw.owners.clear()  # a reload may move streams: ask the workers again
    return 200, merge_reloads([body for _, body in answers.values()])


async def reload_logged(
    gw: Gateway, why: str, log: logging.Logger, tls: ApiTls | None = None
) -> None:
    """`reload_all`, with its outcome in the log only, in the words of one process's
    (SIGHUP's path); each member's audit records it as `sighup`'s (`why`, lower case).
    Applied, the gateway's own listener reads `tls`'s files again, as one process's
    reload does (appliance/server/serve.py)."""
    ACTOR.set(Principal(why.lower(), Role.ADMIN))  # this task's: the reloader's own
    try:
        status, body = await reload_all(gw)
    except MemberUnavailableError as exc:
        log.error("config reload (%s) refused, nothing changed: %s", why, exc.message)
        return
    except Exception:  # a reload must never take the gateway down
        log.exception("config reload (%s) failed", why)
        return
    if status == 200:
        log.info("config reloaded (%s): %s", why, body)
        reload_tls_logged(tls, why, log)
        return
    error = body.get("error", {}) if isinstance(body, dict) else {}
    details = "\n  ".join(["", *error.get("details", [])])
    message = error.get("message", body)
    log.error("config reload (%s) refused, nothing changed: %s%s", why, message, details)
