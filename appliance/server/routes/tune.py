"""`appliance tune` on a running appliance: start a tune of the live workload, follow it,
cancel it. The tune runs on its own thread (appliance/tune/job.py); these handlers only
translate, off the loop. Under `serve --workers` the gateway answers 501: a tune measures
one process's streams (`tune_per_process`)."""

from __future__ import annotations

from aiohttp import web

from appliance.policy.roles import Role
from appliance.server.audit import audit_note
from appliance.server.auth import principal_of, require
from appliance.server.bodies import parse_json
from appliance.server.context import in_thread
from appliance.server.errors import ApiError, InvalidError
from appliance.server.routing import Fanout, Reply, Route
from appliance.server.schemas import TuneRequest, TuneStatus
from appliance.tune.job import TuneConflictError, TuneJob, TuneParams, TuneRequestError

TUNE = web.AppKey("tune", TuneJob)
LOCATION = {"Location": "/v1/tune"}
PER_PROCESS = (
    "tuning runs per process: run `appliance tune --config FILE` with one "
    "process (this appliance serves with --workers)"
)


class TuneConflictApiError(ApiError):
    status = 409


class NotImplementedHereError(ApiError):
    status = 501


async def start_tune(request: web.Request) -> web.Response:
    """Start a tune of the running workload and answer at once: each knob's values are
    measured live against the best so far, windows alternating, and whatever ends the
    tune the starting settings are put back (or the winner kept, with `apply`, after a
    tune that was not cancelled). One at a time: 409 names the running one. 422 for a
    knob the running models and sources do not have (a model not running is named)."""
    body = await parse_json(request, TuneRequest)
    if body.apply:  # keeping the winner changes what runs: the admin's decision
        require(principal_of(request), Role.ADMIN, "a tune with apply")
        audit_note(request, "apply")
    params = TuneParams(**body.model_dump(), by=principal_of(request).who)
    try:
        status = await in_thread(request.app[TUNE].start, params)
    except TuneConflictError as exc:
        raise TuneConflictApiError(str(exc), exc.details) from None
    except TuneRequestError as exc:
        raise InvalidError(str(exc), exc.problems) from None
    return web.json_response(status, status=202, headers=LOCATION)


async def get_tune(request: web.Request) -> web.Response:
    """The tune: `running` with its latest progress, or how the last one ended (`done`,
    `cancelled`, `interrupted`, `failed`) with its result; `idle` before the first."""
    return web.json_response(request.app[TUNE].status())


async def cancel_tune(request: web.Request) -> web.Response:
    """Cancel the running tune: it stops now and puts the starting settings back, then
    ends `cancelled` (poll GET /v1/tune). 409 when none runs."""
    try:
        status = request.app[TUNE].cancel()
    except TuneConflictError as exc:
        raise TuneConflictApiError(str(exc), exc.details) from None
    return web.json_response(status, status=202, headers=LOCATION)


async def tune_per_process(request: web.Request) -> web.Response:
    """The gateway's answer to /v1/tune (appliance/workers/gateway.py)."""
    raise NotImplementedHereError(PER_PROCESS, ["serve --workers: each worker runs its own share"])


ROUTES = (
    Route(
        "POST",
        "/v1/tune",
        start_tune,
        "Start a tune",
        (Reply(202, "started", TuneStatus),),
        errors=(409, 501),
        body={"application/json": TuneRequest},
        tag="tuning",
        role=Role.OPERATOR,
        audit="tune.start",
        workers=Fanout.PER_PROCESS,
    ),
    Route(
        "GET",
        "/v1/tune",
        get_tune,
        "Get the tune",
        (Reply(200, "the running or last tune", TuneStatus),),
        errors=(501,),
        tag="tuning",
        role=Role.OPERATOR,
        workers=Fanout.PER_PROCESS,
    ),
    Route(
        "DELETE",
        "/v1/tune",
        cancel_tune,
        "Cancel the tune",
        (Reply(202, "cancelling: the starting settings are being restored", TuneStatus),),
        errors=(409, 501),
        tag="tuning",
        role=Role.OPERATOR,
        audit="tune.cancel",
        workers=Fanout.PER_PROCESS,
    ),
)
