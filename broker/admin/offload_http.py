"""Pulsar's offload admin paths and the lake table, under
``/admin/v2/persistent/{tenant}/{namespace}/{topic}``:

- ``PUT .../offload`` with a MessageId body ``{"ledgerId": L, "entryId": E}``: offload every
  closed ledger before it to the tier (409 while one runs, 412 without a tier), at the owner;
- ``GET .../offload``: the last offload's LongRunningProcessStatus, at the owner;
- ``GET|POST|PUT|DELETE .../offloadPolicies``: the topic's own OffloadPolicies (null: unset);
- ``GET .../lake``: [lakehouse] the topic's Iceberg table; any broker answers (it reads the
  shared catalog, not the owner's state).
"""

from __future__ import annotations

from aiohttp import web

from broker.admin.api import AdminBackend
from broker.admin.http_common import (PERSISTENT_TOPIC_PATH, int_value, json_body, json_response, no_content,
                                      owner_redirect, topic_of)
from broker.admin.policies import BadRequestError

TOPIC_PATH = PERSISTENT_TOPIC_PATH


def add_offload_routes(app: web.Application, backend: AdminBackend) -> None:
    """Register the offload trigger and status, the lake table and the topic offload policies."""
    at_owner = owner_redirect(backend)

    async def offload(request: web.Request) -> web.Response:
        """Pulsar's trigger: offload every closed ledger before the message id in the body."""
        topic = topic_of(request)
        body = await json_body(request)
        if not isinstance(body, dict):
            raise BadRequestError("body must be a message id: {\"ledgerId\": L, \"entryId\": E}")
        ledger_id = int_value("ledgerId", body.get("ledgerId"), minimum=0)
        entry_id = int_value("entryId", body.get("entryId"), minimum=-1)
        await backend.offload(topic, ledger_id, entry_id)
        return no_content()

    async def offload_status(request: web.Request) -> web.Response:
        return json_response(await backend.offload_status(topic_of(request)))

    async def lake(request: web.Request) -> web.Response:
        return json_response(await backend.lake(topic_of(request)))

    r = app.router
    r.add_put(TOPIC_PATH + "/offload", at_owner(offload))
    r.add_get(TOPIC_PATH + "/offload", at_owner(offload_status))
    r.add_get(TOPIC_PATH + "/lake", lake)
    _add_offload_policy_routes(app, backend)


def _add_offload_policy_routes(app: web.Application, backend: AdminBackend) -> None:
    async def get_offload_policies(request: web.Request) -> web.Response:
        return json_response(await backend.get_topic_offload_policies(topic_of(request)))

    async def set_offload_policies(request: web.Request) -> web.Response:
        topic = topic_of(request)
        body = await json_body(request)
        if not isinstance(body, dict):
            raise BadRequestError("offload policies must be a JSON object")
        await backend.set_topic_offload_policies(topic, body)
        return no_content()

    async def remove_offload_policies(request: web.Request) -> web.Response:
        await backend.set_topic_offload_policies(topic_of(request), None)
        return no_content()

    r = app.router
    r.add_get(TOPIC_PATH + "/offloadPolicies", get_offload_policies)
    r.add_post(TOPIC_PATH + "/offloadPolicies", set_offload_policies)
    r.add_put(TOPIC_PATH + "/offloadPolicies", set_offload_policies)
    r.add_delete(TOPIC_PATH + "/offloadPolicies", remove_offload_policies)


__all__ = ["TOPIC_PATH", "add_offload_routes"]
