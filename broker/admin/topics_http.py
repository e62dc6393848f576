"""Pulsar's persistent-topic admin paths (PersistentTopics) under
``/admin/v2/persistent/{tenant}/{namespace}``, answered by the backend:

- ``GET /``: the namespace's topics; ``GET /partitioned``: its partitioned topics;
- ``PUT|DELETE /{topic}`` (``?force=``): create, delete a non-partitioned topic;
- ``GET|PUT|POST|DELETE /{topic}/partitions``: a partitioned topic's metadata, create it (the
  count or a PartitionedTopicMetadata body, :func:`partitioned_topic_metadata`), grow it, delete it;
- ``GET /{topic}/stats``, ``/internalStats``, ``/partitioned-stats`` (``?perPartition=``);
- ``PUT /{topic}/unload``; ``GET /{topic}/lastMessageId``;
- ``GET /{topic}/ledger/{ledger}/entry/{entry}``: Pulsar's getMessageById (the entry's payload,
  its metadata in ``X-Pulsar-*`` headers: broker/admin/messages_http.py);
- ``POST /{topic}/terminate``, ``POST /{topic}/terminate/partitions``.

Calls about one topic's live state are answered by its owner (307 otherwise,
:func:`broker.admin.http_common.owner_redirect`); metadata calls by any broker. Subscription
paths are in subscriptions_http.py, offload in offload_http.py, compaction in compaction_http.py.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from broker.admin.api import AdminBackend
from broker.admin.http_common import (PERSISTENT_NAMESPACE_PATH, PERSISTENT_TOPIC_PATH, bool_query, int_value,
                                      json_body, json_response, namespace_of, no_content, owner_redirect, topic_of)
from broker.admin.policies import BadRequestError, PreconditionFailedError
from broker.admin.subscriptions_http import entry_answer
from pulsarlite.topic_name import PARTITION_SUFFIX, TopicName

NAMESPACE_PATH = PERSISTENT_NAMESPACE_PATH
TOPIC_PATH = PERSISTENT_TOPIC_PATH

PARTITIONED_TOPIC_METADATA_MEDIA_TYPE = "application/vnd.partitioned-topic-metadata+json"
PROPERTIES_MAX = 1024                # entries of a partitioned topic's properties


def partitioned_topic_metadata(body: Any, *, partitions_max: int) -> tuple[int, dict[str, str] | None]:
    """The body of ``PUT .../partitions`` in the forms Pulsar's PersistentTopics accepts: the
    partition count (a JSON integer, or a numeric string as Jackson coerces it), or a
    PartitionedTopicMetadata object ``{"partitions": N, "properties": {str: str} | null}``
    (content type ``application/vnd.partitioned-topic-metadata+json``, what the Go admin client
    sends; taken whatever the content type says). Returns (partitions, properties or None);
    BadRequestError (400) for a malformed body, PreconditionFailedError (412) for a count out
    of [1, partitions_max]."""
    properties: dict[str, str] | None = None
    if isinstance(body, dict):
        unknown = set(body) - {"partitions", "properties", "deleted"}
        if unknown:
            raise BadRequestError(f"partitioned topic metadata: unknown fields {sorted(unknown)}")
        if "partitions" not in body:
            raise BadRequestError("partitioned topic metadata: partitions is required")
        raw = body.get("properties")
        if raw is not None:
            if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in raw.items()):
                raise BadRequestError("partitioned topic metadata: properties must map strings to strings")
            if len(raw) > PROPERTIES_MAX:
                raise BadRequestError(f"partitioned topic metadata: more than {PROPERTIES_MAX} properties")
            properties = dict(raw) or None
        body = body["partitions"]
    return int_value("number of partitions", body, minimum=1, maximum=partitions_max), properties


def add_topic_routes(app: web.Application, backend: AdminBackend, *, partitions_max: int) -> None:
    """Register the persistent-topic routes; ``partitions_max`` bounds a partitioned topic."""
    _add_lifecycle_routes(app, backend, partitions_max=partitions_max)
    _add_state_routes(app, backend)


def _add_lifecycle_routes(app: web.Application, backend: AdminBackend, *, partitions_max: int) -> None:
    """Listing, creating, growing and deleting topics and partitioned topics."""
    at_owner = owner_redirect(backend)

    async def list_topics(request: web.Request) -> web.Response:
        return json_response(await backend.list_topics(namespace_of(request)))

    async def list_partitioned(request: web.Request) -> web.Response:
        return json_response(await backend.list_partitioned_topics(namespace_of(request)))

    async def create_topic(request: web.Request) -> web.Response:
        await backend.create_topic(topic_of(request))
        return no_content()

    async def delete_topic(request: web.Request) -> web.Response:
        topic, force = topic_of(request), bool_query(request, "force")
        await backend.delete_topic(topic, force)
        return no_content()

    async def get_partitions(request: web.Request) -> web.Response:
        topic = topic_of(request)
        metadata: dict[str, Any] = {"partitions": await backend.partitioned_metadata(topic)}
        if metadata["partitions"] > 0:
            properties = await backend.partitioned_topic_properties(topic)
            if properties:
                metadata["properties"] = properties
        return json_response(metadata)

    async def create_partitioned(request: web.Request) -> web.Response:
        topic = topic_of(request)
        n, properties = partitioned_topic_metadata(await json_body(request), partitions_max=partitions_max)
        if TopicName.parse(topic).is_partition or PARTITION_SUFFIX in request.match_info["topic"]:
            raise PreconditionFailedError(f"partitioned topic name should not contain '{PARTITION_SUFFIX}'")
        await backend.create_partitioned_topic(topic, n, properties)
        return no_content()

    async def update_partitioned(request: web.Request) -> web.Response:
        topic = topic_of(request)
        n = int_value("number of partitions", await json_body(request), minimum=1, maximum=partitions_max)
        await backend.update_partitioned_topic(topic, n)
        return no_content()

    async def delete_partitioned(request: web.Request) -> web.Response:
        topic, force = topic_of(request), bool_query(request, "force")
        await backend.delete_partitioned_topic(topic, force)
        return no_content()

    r = app.router
    r.add_get(NAMESPACE_PATH, list_topics)
    r.add_get(NAMESPACE_PATH + "/partitioned", list_partitioned)
    r.add_put(TOPIC_PATH, create_topic)
    r.add_delete(TOPIC_PATH, at_owner(delete_topic))
    r.add_get(TOPIC_PATH + "/partitions", get_partitions)
    r.add_put(TOPIC_PATH + "/partitions", create_partitioned)
    r.add_post(TOPIC_PATH + "/partitions", update_partitioned)
    r.add_delete(TOPIC_PATH + "/partitions", delete_partitioned)


def _add_state_routes(app: web.Application, backend: AdminBackend) -> None:
    """Stats, unload, the last message id, one message, terminate."""
    at_owner = owner_redirect(backend)

    async def stats(request: web.Request) -> web.Response:
        return json_response(await backend.topic_stats(topic_of(request)))

    async def internal_stats(request: web.Request) -> web.Response:
        return json_response(await backend.internal_stats(topic_of(request)))

    async def partitioned_stats(request: web.Request) -> web.Response:
        topic, per_partition = topic_of(request), bool_query(request, "perPartition", default=True)
        return json_response(await backend.partitioned_stats(topic, per_partition))

    async def unload(request: web.Request) -> web.Response:
        await backend.unload_topic(topic_of(request))
        return no_content()

    async def last_message_id(request: web.Request) -> web.Response:
        return json_response(await backend.last_message_id(topic_of(request)))

    async def message_by_id(request: web.Request) -> web.Response:
        """Pulsar's getMessageById: the entry's payload with its metadata in X-Pulsar-* headers
        (broker/admin/messages_http.py); 404 if the topic has no such entry."""
        topic = topic_of(request)
        ledger_id = int_value("ledgerId", request.match_info["ledger"], minimum=0)
        entry_id = int_value("entryId", request.match_info["entry"], minimum=0)
        return entry_answer(ledger_id, entry_id, await backend.read_entry(topic, ledger_id, entry_id), topic)

    async def terminate(request: web.Request) -> web.Response:
        return json_response(await backend.terminate(topic_of(request)))

    async def terminate_partitioned(request: web.Request) -> web.Response:
        return json_response(await backend.terminate_partitioned(topic_of(request)))

    r = app.router
    r.add_get(TOPIC_PATH + "/stats", at_owner(stats))
    r.add_get(TOPIC_PATH + "/internalStats", at_owner(internal_stats))
    r.add_get(TOPIC_PATH + "/partitioned-stats", partitioned_stats)
    r.add_put(TOPIC_PATH + "/unload", at_owner(unload))
    r.add_get(TOPIC_PATH + "/lastMessageId", at_owner(last_message_id))
    r.add_get(TOPIC_PATH + "/ledger/{ledger}/entry/{entry}", at_owner(message_by_id))
    r.add_post(TOPIC_PATH + "/terminate", at_owner(terminate))
    r.add_post(TOPIC_PATH + "/terminate/partitions", terminate_partitioned)


__all__ = ["NAMESPACE_PATH", "PARTITIONED_TOPIC_METADATA_MEDIA_TYPE", "PROPERTIES_MAX", "TOPIC_PATH",
           "add_topic_routes", "partitioned_topic_metadata"]
