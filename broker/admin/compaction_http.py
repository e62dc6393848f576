"""Pulsar's compaction admin paths, under ``/admin/v2/persistent/{tenant}/{namespace}/{topic}``,
answered by the topic's owner:

- ``PUT .../compaction``: start a compaction (every partition of a partitioned topic; 409 while
  one runs, 404 for an unknown topic);
- ``GET .../compaction``: the last compaction's LongRunningProcessStatus (``{"status":
  "NOT_RUN|RUNNING|SUCCESS|ERROR", "lastError": str}``).
"""

from __future__ import annotations

from aiohttp import web

from broker.admin.api import AdminBackend
from broker.admin.http_common import (PERSISTENT_TOPIC_PATH, json_response, no_content, owner_redirect,
                                      topic_of)

TOPIC_PATH = PERSISTENT_TOPIC_PATH


def add_compaction_routes(app: web.Application, backend: AdminBackend) -> None:
    """Register the compaction trigger and status."""
    at_owner = owner_redirect(backend)

    async def compact(request: web.Request) -> web.Response:
        await backend.compact(topic_of(request))
        return no_content()

    async def compaction_status(request: web.Request) -> web.Response:
        return json_response(await backend.compaction_status(topic_of(request)))

    app.router.add_put(TOPIC_PATH + "/compaction", at_owner(compact))
    app.router.add_get(TOPIC_PATH + "/compaction", at_owner(compaction_status))


__all__ = ["TOPIC_PATH", "add_compaction_routes"]
