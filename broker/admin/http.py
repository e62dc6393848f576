"""The broker's admin HTTP API: a subset of Pulsar's admin v2 REST paths with the same shapes,
the lookup path, and ``GET /metrics``.

``make_admin_app(backend)`` builds an aiohttp application; the broker implements
:class:`AdminBackend` (broker/admin/api.py, with the shapes it returns). This module only
builds the app: its middlewares (errors below; authentication and authorization,
broker/security/http.py, when the broker has them on) and each resource's routes, one module
per resource:

- ``clusters_http`` (``/admin/v2/clusters``), ``tenants_http`` (``/admin/v2/tenants``),
  ``namespaces_http`` (``/admin/v2/namespaces``: CRUD, topics, policies, backlog quotas);
- ``topics_http`` (``/admin/v2/persistent``: topics, partitioned topics, stats, terminate),
  ``nonpersistent_http`` (``/admin/v2/non-persistent``), ``subscriptions_http``,
  ``offload_http`` (offload, offload policies, the lake table), ``compaction_http``;
- ``lookup_http`` (``/lookup/v2/topic``), ``console_http`` (``/``, ``/console``, the console
  data), ``brokers_http`` (``/metrics``, ``/admin/v2/pulsarlite/metadata``);
- ``schemas_http`` (``/admin/v2/schemas``), and the permission paths (broker/security/http.py).

Requests are read and answered with ``http_common``'s helpers. Policy routes go to
``backend.policies`` (a :class:`PolicyStore`), topic routes to the backend's methods.

Conventions (Pulsar's): reads answer 200 with JSON; writes answer 204 without a body; errors are
``{"reason": "..."}`` with 400 (malformed input: unparsable JSON, wrong types, bad names), 404
(not found), 409 (already exists, not empty), 412 (value out of range, state forbids it), 503
(metadata store or bookies unavailable: retry), 500 (a bug; logged). Input is validated before
anything is called, so a 400 changed nothing. Bodies are limited to ``body_bytes_max``.

Topic names in paths are local names (percent-decoded by aiohttp); the backend receives full
names (``persistent://tenant/ns/topic``) and namespaces as ``tenant/ns``.
"""

from __future__ import annotations

import logging

from aiohttp import web

from broker.admin.api import (AdminBackend, ConsumerStats, CursorStats, InternalStats, LedgerInfoStats, LookupData,
                              MessageIdData, PublisherStats, SubscriptionPosition, SubscriptionStats, TopicStats,
                              lookup_data)
from broker.admin.brokers_http import add_broker_routes
from broker.admin.clusters_http import add_cluster_routes
from broker.admin.compaction_http import add_compaction_routes
from broker.admin.console_http import add_console_routes
from broker.admin.http_common import Handler, json_body, json_response, topic_of
from broker.admin.lookup_http import add_lookup_routes
from broker.admin.namespaces_http import add_namespace_routes, add_namespace_topics_route
from broker.admin.nonpersistent_http import add_nonpersistent_routes
from broker.admin.offload_http import add_offload_routes
from broker.admin.policies import PARTITIONS_MAX, AdminError
from broker.admin.schemas_http import add_schema_routes
from broker.admin.serving import release_request_body
from broker.admin.subscriptions_http import add_subscription_routes
from broker.admin.tenants_http import add_tenant_routes
from broker.admin.topics_http import (PARTITIONED_TOPIC_METADATA_MEDIA_TYPE, add_topic_routes,
                                      partitioned_topic_metadata)
from broker.security.http import add_permission_routes, make_security_middleware
from pulsarlite.errors import PulsarliteError

log = logging.getLogger(__name__)

BODY_BYTES_MAX = 1024 * 1024


# -- the error middleware ----------------------------------------------------------------------
@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await _answer(request, handler)
    finally:
        release_request_body(request)    # a body cut off: no cyclic garbage holding it (serving.py)


async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except AdminError as e:
        return json_response({"reason": str(e)}, status=e.http_status)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        reason = e.reason if e.text is None or e.text.startswith(f"{e.status}:") else e.text
        return json_response({"reason": reason}, status=e.status)
    except PulsarliteError as e:
        if e.retriable:
            return json_response({"reason": f"service unavailable, retry: {e}"}, status=503)
        log.exception("admin %s %s failed", request.method, request.path)
        return json_response({"reason": f"internal error: {e}"}, status=500)
    except Exception as e:  # noqa: BLE001 - a bug; answered, logged
        log.exception("admin %s %s failed", request.method, request.path)
        return json_response({"reason": f"internal error: {type(e).__name__}: {e}"}, status=500)


# -- the application ---------------------------------------------------------------------------
def make_admin_app(backend: AdminBackend, *, body_bytes_max: int = BODY_BYTES_MAX,
                   partitions_max: int = PARTITIONS_MAX) -> web.Application:
    """The admin application over ``backend``: errors answered as ``{"reason"}``, every route
    behind authentication and authorization when the broker (``backend.service``) has them on,
    bodies bounded by ``body_bytes_max``, partitioned topics by ``partitions_max``."""
    if body_bytes_max <= 0 or partitions_max <= 0:
        raise ValueError("body_bytes_max and partitions_max must be > 0")
    # [security] authentication + authorization in front of every route when the broker has it on
    service = getattr(backend, "service", None)
    secured = getattr(getattr(service, "authentication", None), "enabled", False)
    middlewares = [_errors]
    if secured:
        middlewares.append(make_security_middleware(service))   # inside _errors: its answers for failures
    app = web.Application(middlewares=middlewares, client_max_size=body_bytes_max)
    add_cluster_routes(app, backend)
    add_tenant_routes(app, backend)
    add_namespace_routes(app, backend)
    add_nonpersistent_routes(app, backend, partitions_max=partitions_max)
    add_namespace_topics_route(app, backend)
    add_topic_routes(app, backend, partitions_max=partitions_max)
    add_subscription_routes(app, backend)
    add_compaction_routes(app, backend)
    add_offload_routes(app, backend)
    add_lookup_routes(app, backend)
    add_console_routes(app, backend)
    add_broker_routes(app, backend)
    add_permission_routes(app, lambda: backend.policies, json_body=json_body, topic_of=topic_of)
    if backend.schemas is not None:
        add_schema_routes(app, lambda: backend.schemas)
    return app


__all__ = ["AdminBackend", "make_admin_app", "TopicStats", "SubscriptionStats", "ConsumerStats",
           "PublisherStats", "InternalStats", "LedgerInfoStats", "CursorStats", "LookupData", "lookup_data",
           "MessageIdData", "SubscriptionPosition", "BODY_BYTES_MAX", "PARTITIONS_MAX",
           "partitioned_topic_metadata", "PARTITIONED_TOPIC_METADATA_MEDIA_TYPE"]
