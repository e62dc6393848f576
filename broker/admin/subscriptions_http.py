"""Pulsar's subscription and message admin paths (PersistentTopics), under
``/admin/v2/persistent/{tenant}/{namespace}/{topic}``:

- ``GET .../subscriptions``: the topic's subscriptions;
- ``PUT .../subscription/{sub}`` with an optional MessageId body (or ``"earliest"``/``"latest"``;
  none: latest): create a durable subscription there (409 if it exists);
- ``DELETE .../subscription/{sub}?force=``: delete (412 with consumers unless ``force``);
- ``POST .../subscription/{sub}/resetcursor/{timestamp}``: to the first message published at or
  after ``timestamp`` (ms);
- ``POST .../subscription/{sub}/skip/{n}``, ``.../skip_all``: acknowledge the next n (all);
- ``POST .../clearBacklog``: every subscription skips all;
- ``POST .../subscription/{sub}/expireMessages/{seconds}``: mark-delete the subscription through
  the newest entry published more than ``seconds`` ago (204; 404 unknown subscription);
- ``POST .../all_subscription/expireMessages/{seconds}``: the same for every subscription;
- ``POST .../subscription/{sub}/resetcursor`` with a ResetCursorData body ``{"ledgerId",
  "entryId", "partitionIndex", "isExcluded", "batchIndex", "properties"}``: deliver that message
  next (the one after it when ``isExcluded``) (204; 412 not a message of the topic);
- ``GET .../subscription/{sub}/position/{n}``: peek the n-th unacknowledged entry (200 with the
  entry as getMessageById answers it; 404 "Message not found");
- ``GET .../examinemessage?initialPosition=earliest|latest&messagePosition=n``: the n-th entry
  from either end of the topic.

Every one of them is answered by the topic's owner (redirect otherwise). On a partitioned
topic's parent, as Pulsar: the expiries are applied to every partition (at each partition's
owner), the others are refused with 405 (ask a partition). The cursor
changes go through the subscription or the cursor (broker/admin_backend.py), never around them.
Clock readings (the expiry's "now") are taken here, in the shell.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

from aiohttp import web

from broker.admin.api import AdminBackend, SubscriptionPosition
from broker.admin.http_common import (INT64_MAX, PERSISTENT_TOPIC_PATH, bool_query, int_value, json_body,
                                      json_response, no_content, owner_redirect, subscription_of, topic_of)
from broker.admin.messages_http import entry_response
from broker.admin.policies import BadRequestError, PreconditionFailedError
from pulsarlite.wire.entry import EntryFormatError

EXPIRE_S_MAX = 100 * 365 * 86400          # a century: beyond it every message is kept anyway
POSITION_MAX = 2 ** 31 - 1                # Pulsar's int message positions
TOPIC_PATH = PERSISTENT_TOPIC_PATH


class SubscriptionAdminBackend(Protocol):
    """What these routes need from the broker (broker/admin_backend.py implements it). Errors as
    for AdminBackend: NotFoundError 404, PreconditionFailedError 412, MethodNotAllowedError 405."""

    async def expire_messages(self, topic: str, subscription: str, expire_s: int, now_ms: int) -> bool:
        """Mark-delete through the newest entry published more than ``expire_s`` before
        ``now_ms``; True if the cursor moved (a partitioned parent: every partition)."""

    async def expire_messages_all(self, topic: str, expire_s: int, now_ms: int) -> None:
        """expire_messages on every durable subscription of the topic."""

    async def reset_cursor_to_position(self, topic: str, subscription: str, ledger_id: int, entry_id: int,
                                       excluded: bool) -> None:
        """Deliver (ledger_id, entry_id) next, or the entry after it when ``excluded``."""

    async def peek_entry(self, topic: str, subscription: str, nth: int) -> tuple[Any, bytes]:
        """(position, stored entry) of the ``nth`` unacknowledged entry after the mark-delete."""

    async def examine_entry(self, topic: str, initial_position: str, nth: int) -> tuple[Any, bytes]:
        """(position, stored entry) of the ``nth`` entry from the ``earliest``/``latest`` end."""


def entry_answer(ledger_id: int, entry_id: int, data: bytes, topic: str) -> web.Response:
    """A stored entry as getMessageById, peek and examine answer it (broker/admin/messages_http.py);
    412 if it does not parse."""
    try:
        headers, body = entry_response(ledger_id, entry_id, data)
    except EntryFormatError as e:
        raise PreconditionFailedError(f"entry {ledger_id}:{entry_id} of {topic} is not readable: {e}") from None
    return web.Response(body=body, headers=headers, content_type="application/octet-stream")


def subscription_position(body: Any) -> SubscriptionPosition:
    """Where a new subscription starts, from the body of ``PUT .../subscription/{sub}``: Pulsar
    sends a MessageId (``{"ledgerId", "entryId", ...}``; latest = both Long.MAX, earliest = both
    -1); we also take "earliest"/"latest". No body: latest."""
    if body is None:
        return "latest"
    if isinstance(body, str):
        if body in ("earliest", "latest"):
            return body  # type: ignore[return-value]
        raise BadRequestError(f"subscription position must be earliest, latest or a message id, got {body!r}")
    if not isinstance(body, dict):
        raise BadRequestError("subscription position must be a message id object")
    ledger_id = int_value("ledgerId", body.get("ledgerId"), minimum=-1)
    entry_id = int_value("entryId", body.get("entryId"), minimum=-1)
    if ledger_id == INT64_MAX and entry_id == INT64_MAX:
        return "latest"
    if ledger_id < 0 or entry_id < 0:
        if ledger_id == -1 and entry_id == -1:
            return "earliest"
        raise PreconditionFailedError(f"invalid message id {ledger_id}:{entry_id}")
    return (ledger_id, entry_id)


def add_subscription_routes(app: web.Application, backend: AdminBackend, *,
                            clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
    """Register the routes (``backend`` is an AdminBackend that is also a
    SubscriptionAdminBackend); every one is answered by the topic's owner."""
    _add_subscription_crud(app, backend)
    _add_message_routes(app, backend, clock_ms)


def _add_subscription_crud(app: web.Application, backend: AdminBackend) -> None:
    """List, create, delete, reset by time, skip, clear the backlog."""
    at_owner = owner_redirect(backend)

    async def subscriptions(request: web.Request) -> web.Response:
        return json_response(await backend.list_subscriptions(topic_of(request)))

    async def create_subscription(request: web.Request) -> web.Response:
        topic, name = topic_of(request), subscription_of(request)
        position = subscription_position(await json_body(request, required=False))
        await backend.create_subscription(topic, name, position)
        return no_content()

    async def delete_subscription(request: web.Request) -> web.Response:
        topic, name, force = topic_of(request), subscription_of(request), bool_query(request, "force")
        await backend.delete_subscription(topic, name, force)
        return no_content()

    async def reset_cursor(request: web.Request) -> web.Response:
        topic, name = topic_of(request), subscription_of(request)
        timestamp_ms = int_value("timestamp", request.match_info["timestamp"], minimum=0)
        await backend.reset_cursor_by_time(topic, name, timestamp_ms)
        return no_content()

    async def skip(request: web.Request) -> web.Response:
        count = int_value("numMessages", request.match_info["count"], minimum=0)
        await backend.skip_messages(topic_of(request), subscription_of(request), count)
        return no_content()

    async def skip_all(request: web.Request) -> web.Response:
        await backend.skip_messages(topic_of(request), subscription_of(request), None)
        return no_content()

    async def clear_backlog(request: web.Request) -> web.Response:
        await backend.clear_backlog(topic_of(request))
        return no_content()

    r = app.router
    r.add_get(TOPIC_PATH + "/subscriptions", at_owner(subscriptions))
    r.add_put(TOPIC_PATH + "/subscription/{subscription}", at_owner(create_subscription))
    r.add_delete(TOPIC_PATH + "/subscription/{subscription}", at_owner(delete_subscription))
    r.add_post(TOPIC_PATH + "/subscription/{subscription}/resetcursor/{timestamp}", at_owner(reset_cursor))
    r.add_post(TOPIC_PATH + "/subscription/{subscription}/skip/{count}", at_owner(skip))
    r.add_post(TOPIC_PATH + "/subscription/{subscription}/skip_all", at_owner(skip_all))
    r.add_post(TOPIC_PATH + "/clearBacklog", at_owner(clear_backlog))


def _add_message_routes(app: web.Application, backend: Any, clock_ms: Callable[[], int]) -> None:
    """Expire, reset to a message id, peek, examine (SubscriptionAdminBackend's methods)."""
    at_owner = owner_redirect(backend)
    r = app.router

    async def expire(request: web.Request) -> web.Response:
        topic, sub = topic_of(request), subscription_of(request)
        expire_s = int_value("expireTimeInSeconds", request.match_info["seconds"], minimum=0, maximum=EXPIRE_S_MAX)
        await backend.expire_messages(topic, sub, expire_s, clock_ms())
        return web.Response(status=204)

    async def expire_all(request: web.Request) -> web.Response:
        topic = topic_of(request)
        expire_s = int_value("expireTimeInSeconds", request.match_info["seconds"], minimum=0, maximum=EXPIRE_S_MAX)
        await backend.expire_messages_all(topic, expire_s, clock_ms())
        return web.Response(status=204)

    async def reset_to_message_id(request: web.Request) -> web.Response:
        topic, sub = topic_of(request), subscription_of(request)
        body = await json_body(request)
        if not isinstance(body, dict):
            raise BadRequestError("body must be a ResetCursorData object: {\"ledgerId\": L, \"entryId\": E, "
                                  "\"isExcluded\": false}")
        if "ledgerId" not in body or "entryId" not in body:
            raise BadRequestError("ResetCursorData needs ledgerId and entryId")
        ledger_id = int_value("ledgerId", body["ledgerId"], minimum=0)
        entry_id = int_value("entryId", body["entryId"], minimum=0)
        excluded = body.get("isExcluded", False)
        if not isinstance(excluded, bool):
            raise BadRequestError(f"isExcluded must be a boolean, got {excluded!r}")
        int_value("batchIndex", body.get("batchIndex", -1), minimum=-1)       # checked; see decisions.md
        int_value("partitionIndex", body.get("partitionIndex", -1), minimum=-1)
        await backend.reset_cursor_to_position(topic, sub, ledger_id, entry_id, excluded)
        return web.Response(status=204)

    async def peek(request: web.Request) -> web.Response:
        topic, sub = topic_of(request), subscription_of(request)
        nth = int_value("messagePosition", request.match_info["position"], minimum=1, maximum=POSITION_MAX)
        position, data = await backend.peek_entry(topic, sub, nth)
        return entry_answer(position.ledger_id, position.entry_id, data, topic)

    async def examine(request: web.Request) -> web.Response:
        topic = topic_of(request)
        initial = (request.query.get("initialPosition") or "latest").strip().lower()
        if initial not in ("latest", "earliest"):
            raise BadRequestError(f"initialPosition must be latest or earliest, got {initial!r}")
        raw = request.query.get("messagePosition") or "1"
        nth = max(1, int_value("messagePosition", raw, minimum=-POSITION_MAX, maximum=POSITION_MAX))   # < 1: 1
        position, data = await backend.examine_entry(topic, initial, nth)
        return entry_answer(position.ledger_id, position.entry_id, data, topic)

    r.add_post(TOPIC_PATH + "/subscription/{subscription}/expireMessages/{seconds}", at_owner(expire))
    r.add_post(TOPIC_PATH + "/all_subscription/expireMessages/{seconds}", at_owner(expire_all))
    r.add_post(TOPIC_PATH + "/subscription/{subscription}/resetcursor", at_owner(reset_to_message_id))
    r.add_get(TOPIC_PATH + "/subscription/{subscription}/position/{position}", at_owner(peek))
    r.add_get(TOPIC_PATH + "/examinemessage", at_owner(examine))


__all__ = ["SubscriptionAdminBackend", "TOPIC_PATH", "add_subscription_routes", "entry_answer",
           "subscription_position"]
