"""Pulsar's topic lookup over HTTP (TopicLookup): ``GET /lookup/v2/topic/persistent/{tenant}/
{namespace}/{topic}`` and the same under ``non-persistent``, answered with LookupData
(broker/admin/api.py ``lookup_data``): the broker that owns, or will own, the topic.

``?authoritative=true``: asked because of a previous redirect (the broker chosen before
acquires); the listener name (Pulsar's advertised listeners) comes from ``?listenerName=`` or
the ``X-Pulsar-ListenerName`` header.
"""

from __future__ import annotations

from aiohttp import web

from broker.admin.api import AdminBackend
from broker.admin.http_common import bool_query, json_response, topic_of
from pulsarlite.topic_name import TopicDomain

PATH = "/lookup/v2/topic"


def listener_name_of(request: web.Request) -> str:
    """Pulsar's listener name: ``?listenerName=`` or the ``X-Pulsar-ListenerName`` header ("": none)."""
    return request.query.get("listenerName") or request.headers.get("X-Pulsar-ListenerName") or ""


def add_lookup_routes(app: web.Application, backend: AdminBackend) -> None:
    """Register the persistent and non-persistent lookups."""

    async def lookup(request: web.Request) -> web.Response:
        listener_name = listener_name_of(request)
        authoritative = bool_query(request, "authoritative")
        return json_response(await backend.lookup(topic_of(request), authoritative=authoritative,
                                                  listener_name=listener_name))

    async def lookup_np(request: web.Request) -> web.Response:
        listener_name = listener_name_of(request)
        return json_response(await backend.lookup(topic_of(request, TopicDomain.NON_PERSISTENT),
                                                  authoritative=bool_query(request, "authoritative"),
                                                  listener_name=listener_name))

    app.router.add_get(PATH + "/persistent/{tenant}/{namespace}/{topic}", lookup)
    app.router.add_get(PATH + "/non-persistent/{tenant}/{namespace}/{topic}", lookup_np)


__all__ = ["add_lookup_routes", "listener_name_of"]
