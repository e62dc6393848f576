"""Pulsar's non-persistent topic admin paths (NonPersistentTopics, broker/nonpersistent.py)
under ``/admin/v2/non-persistent/{tenant}/{namespace}``:

- ``GET /``: the namespace's non-persistent topics loaded on some broker now;
- ``GET /{topic}/stats``: NonPersistentTopicStats (with ``msgDropRate``), at the owner; 404 if
  not loaded;
- ``GET|PUT /{topic}/partitions``: a partitioned non-persistent topic's metadata, create it
  (the body as for a persistent one: broker/admin/topics_http.py).
"""

from __future__ import annotations

from aiohttp import web

from broker.admin.api import AdminBackend
from broker.admin.http_common import json_body, json_response, namespace_of, no_content, owner_redirect, topic_of
from broker.admin.policies import PreconditionFailedError
from broker.admin.topics_http import partitioned_topic_metadata
from pulsarlite.topic_name import PARTITION_SUFFIX, TopicDomain

NAMESPACE_PATH = "/admin/v2/non-persistent/{tenant}/{namespace}"
TOPIC_PATH = NAMESPACE_PATH + "/{topic}"


def nonpersistent_topic_of(request: web.Request) -> str:
    """``non-persistent://tenant/ns/topic`` from the path."""
    return topic_of(request, TopicDomain.NON_PERSISTENT)


def add_nonpersistent_routes(app: web.Application, backend: AdminBackend, *, partitions_max: int) -> None:
    """Register the non-persistent topic routes; ``partitions_max`` bounds a partitioned topic."""
    at_owner = owner_redirect(backend)

    async def list_topics(request: web.Request) -> web.Response:
        return json_response(await backend.list_topics(namespace_of(request), "NON_PERSISTENT"))

    async def stats(request: web.Request) -> web.Response:
        return json_response(await backend.nonpersistent_stats(nonpersistent_topic_of(request)))

    async def get_partitions(request: web.Request) -> web.Response:
        return json_response({"partitions": await backend.partitioned_metadata(nonpersistent_topic_of(request))})

    async def create_partitioned(request: web.Request) -> web.Response:
        topic = nonpersistent_topic_of(request)
        n, properties = partitioned_topic_metadata(await json_body(request), partitions_max=partitions_max)
        if PARTITION_SUFFIX in request.match_info["topic"]:
            raise PreconditionFailedError(f"partitioned topic name should not contain '{PARTITION_SUFFIX}'")
        await backend.create_partitioned_topic(topic, n, properties)
        return no_content()

    r = app.router
    r.add_get(NAMESPACE_PATH, list_topics)
    r.add_get(TOPIC_PATH + "/stats", at_owner(stats))
    r.add_get(TOPIC_PATH + "/partitions", get_partitions)
    r.add_put(TOPIC_PATH + "/partitions", create_partitioned)


__all__ = ["NAMESPACE_PATH", "TOPIC_PATH", "add_nonpersistent_routes", "nonpersistent_topic_of"]
