"""What handlers share: the application's keys and the one way off the event loop.

The loop only parses requests and formats answers. Anything that compiles, loads a model,
starts or joins threads or waits on a batcher leaves it through `in_thread` (aiortc's
`run_in_executor` practice), so one slow request never stalls the others.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from aiohttp import web

from appliance.runtime.runtime import Runtime
from appliance.server.limits import Watchers, WorkSlots

P = ParamSpec("P")
T = TypeVar("T")

RUNTIME = web.AppKey("runtime", Runtime)
OPENAPI = web.AppKey("openapi", dict[str, Any])  # the document, built once with the app
MAX_BODY = web.AppKey("max_body", int)  # bytes; what client_max_size is for JSON bodies
WORK_SLOTS = web.AppKey("work_slots", WorkSlots)  # workflow requests at work (limits.py)
WATCHERS = web.AppKey("watchers", Watchers)  # event and MJPEG readers (limits.py)


def runtime_of(request: web.Request) -> Runtime:
    return request.app[RUNTIME]


async def in_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run blocking `fn` in the loop's default thread pool and await its result."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))
