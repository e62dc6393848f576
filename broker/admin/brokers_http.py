"""Routes about this broker itself:

- ``GET /metrics``: Prometheus metrics (broker/admin/metrics.py; the text or OpenMetrics format
  as the ``Accept`` header asks); needs a role only with ``authenticate_metrics_endpoint``;
- ``GET /admin/v2/pulsarlite/metadata``: where the metadata store and the tier are (the Spark
  source reads with only an admin URL); superusers only (not a tenant route); present when the
  backend has ``metadata_locations``.
"""

from __future__ import annotations

from aiohttp import web

from broker.admin.api import AdminBackend
from broker.admin.http_common import json_response


def add_broker_routes(app: web.Application, backend: AdminBackend) -> None:
    """Register the metadata locations (when the backend has them) and ``/metrics``."""

    async def pulsarlite_metadata(request: web.Request) -> web.Response:
        return json_response(backend.metadata_locations())

    async def metrics(request: web.Request) -> web.Response:
        body, content_type = backend.metrics.render(request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})

    if hasattr(backend, "metadata_locations"):
        app.router.add_get("/admin/v2/pulsarlite/metadata", pulsarlite_metadata)
    app.router.add_get("/metrics", metrics)


__all__ = ["add_broker_routes"]
