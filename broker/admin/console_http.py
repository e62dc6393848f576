"""The web console's routes (the pages and their data: broker/admin/console.py):

- ``GET /`` and ``GET /console/{name}``: the static files, served without authentication (they
  hold no data; broker/security/http.py lets them through); unknown names 404;
- with a backend that has the console (``console_cluster``): ``GET /admin/v2/console/cluster``,
  ``GET .../{topic}/segments`` (at the owner) and ``GET .../{topic}/console`` (this broker asks
  the owner itself). The data calls are admin routes like any other (authorization included).
"""

from __future__ import annotations

from aiohttp import web

from broker.admin.api import AdminBackend
from broker.admin.console import static_file
from broker.admin.http_common import PERSISTENT_TOPIC_PATH, json_response, owner_redirect, topic_of

FILE_ROUTES = ("/", "/console/{name}")        # public: broker/security/http.py's _CONSOLE_FILE_ROUTES
CSP = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"


def add_console_routes(app: web.Application, backend: AdminBackend) -> None:
    """Register the static files, and the data routes when the backend has the console."""

    async def console_file(request: web.Request) -> web.Response:
        found = static_file(request.match_info.get("name", "index.html"))
        if found is None:
            raise web.HTTPNotFound(text="no such console file")
        body, content_type = found
        return web.Response(body=body, content_type=content_type, headers={
            "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff", "Content-Security-Policy": CSP})

    for path in FILE_ROUTES:
        app.router.add_get(path, console_file)
    if hasattr(backend, "console_cluster"):
        _add_console_data_routes(app, backend)


def _add_console_data_routes(app: web.Application, backend: AdminBackend) -> None:
    at_owner = owner_redirect(backend)

    async def console_cluster(request: web.Request) -> web.Response:
        return json_response(await backend.console_cluster())

    async def topic_segments(request: web.Request) -> web.Response:
        return json_response(await backend.topic_segments(topic_of(request)))

    async def console_topic(request: web.Request) -> web.Response:
        return json_response(await backend.console_topic(topic_of(request)))

    app.router.add_get("/admin/v2/console/cluster", console_cluster)
    app.router.add_get(PERSISTENT_TOPIC_PATH + "/segments", at_owner(topic_segments))
    app.router.add_get(PERSISTENT_TOPIC_PATH + "/console", console_topic)      # asks the owner itself


__all__ = ["FILE_ROUTES", "add_console_routes"]
