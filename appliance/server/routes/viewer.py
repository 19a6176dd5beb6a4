"""The web viewer: one static page (appliance/server/static/, ES modules, no build step)
that shows every stream as a live tile, plays one large over WebRTC with its live
predictions (drawn by the workflow or by the page), shows its per-block latency and its
shadow beside the live workflow, and starts profiling windows, all through the /v1 API
with the token the user types in.

The page and its assets hold no data, so they are open without a token (`public`): a
browser cannot send a bearer token for the page itself. Assets come from a fixed
name → file table, one route each: nothing in a request ever names a file. Every answer
is marked `no-cache` (an upgraded appliance serves its new page at once) and carries a
Content-Security-Policy that allows only this origin's scripts, styles and API.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from appliance.policy.roles import Role
from appliance.server.context import in_thread
from appliance.server.errors import Handler
from appliance.server.routing import Fanout, Reply, Route

STATIC = Path(__file__).resolve().parent.parent / "static"
PAGE = "index.html"
# URL path -> (file in STATIC, content type)
MODULES = (
    "viewer",
    "api",
    "grid",
    "player",
    "overlay",
    "stats",
    "stream",
    "shadow",
    "watch",
    "profile",
    "slowest",
)
ASSETS = {
    **{f"/static/{m}.js": (f"{m}.js", "text/javascript") for m in MODULES},
    "/static/viewer.css": ("viewer.css", "text/css"),
    "/static/favicon.svg": ("favicon.svg", "image/svg+xml"),
    # Browsers ask for it by this name whatever the page says: an icon, not a 401.
    "/favicon.ico": ("favicon.svg", "image/svg+xml"),
}
CSP = (
    "default-src 'self'; connect-src 'self'; media-src 'self' blob:; "
    "img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


async def _file(name: str, content_type: str) -> web.Response:
    body = await in_thread((STATIC / name).read_bytes)
    return web.Response(body=body, content_type=content_type, charset="utf-8", headers=HEADERS)


async def viewer_page(request: web.Request) -> web.Response:
    """The web viewer: enter the token, pick a stream, watch it over WebRTC."""
    return await _file(PAGE, "text/html")


async def viewer_stream_page(request: web.Request) -> web.Response:
    """The web viewer, opening the stream named in the path (the page reads it)."""
    return await _file(PAGE, "text/html")


async def viewer_frame_page(request: web.Request) -> web.Response:
    """The web viewer, opening the stream and then the trace of the frame named in the
    path (the page reads both): where a Grafana exemplar's link lands."""
    return await _file(PAGE, "text/html")


def _asset_handler(path: str, name: str, content_type: str) -> Handler:
    async def viewer_asset(request: web.Request) -> web.Response:
        """One of the viewer page's assets."""
        return await _file(name, content_type)

    served_as = path.rsplit("/", 1)[-1]  # the operation id: viewer_viewer_js, viewer_favicon_ico
    viewer_asset.__name__ = f"viewer_{served_as.replace('.', '_')}"
    return viewer_asset


_HTML = (Reply(200, "the viewer page", {"type": "string"}, "text/html"),)


def _page(path: str, handler: Handler, summary: str) -> Route:
    """A route to the viewer's page: open (it holds no data), any worker answers it."""
    return Route(
        "GET",
        path,
        handler,
        summary,
        _HTML,
        public=True,
        tag="viewer",
        role=Role.VIEWER,
        workers=Fanout.ANY,
    )


ROUTES = (
    _page("/", viewer_page, "Web viewer"),
    _page("/streams/{id}", viewer_stream_page, "Web viewer on one stream"),
    _page("/streams/{id}/frames/{seq}", viewer_frame_page, "Web viewer on one frame's trace"),
    *(
        Route(
            "GET",
            path,
            _asset_handler(path, name, kind),
            f"Web viewer asset {name}",
            (Reply(200, name, {"type": "string"}, kind),),
            public=True,
            tag="viewer",
            role=Role.VIEWER,
            workers=Fanout.ANY,
        )
        for path, (name, kind) in ASSETS.items()
    ),
)
