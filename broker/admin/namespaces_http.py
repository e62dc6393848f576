"""Pulsar's namespace admin paths (Namespaces), answered from the policy store (ZooKeeper), under
``/admin/v2/namespaces``:

- ``GET /{tenant}``: the tenant's namespaces; ``GET|PUT|DELETE /{tenant}/{namespace}``: its
  policies (Pulsar's Policies JSON), create (body optional: initial policies), delete;
- ``GET /{tenant}/{namespace}/topics?mode=PERSISTENT|NON_PERSISTENT|ALL``: its topics (the
  backend's ``list_topics``);
- one policy per path (:data:`POLICY_ROUTES`): GET reads it, POST/PUT set it (compare-and-set
  of the namespace's policies), DELETE clears it back to the broker default;
- backlog quotas: ``GET .../backlogQuotaMap``, ``POST|DELETE .../backlogQuota?backlogQuotaType=``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from aiohttp import web

from broker.admin.api import AdminBackend
from broker.admin.http_common import bool_query, int_value, json_body, json_response, namespace_of, no_content
from broker.admin.policies import (BACKLOG_QUOTA_TYPES, AutoTopicCreation, BacklogQuota, BadRequestError,
                                   NamespacePolicies, PreconditionFailedError, RetentionPolicy, RolloverPolicy,
                                   check_name)
from broker.schema_compat import CompatibilityStrategy

PATH = "/admin/v2/namespaces"
NAMESPACE_PATH = PATH + "/{tenant}/{namespace}"


# -- the one-value policies, as data -----------------------------------------------------------
@dataclass(frozen=True)
class PolicyRoute:
    """``{NAMESPACE_PATH}/{sub}``: GET answers ``get(policies)``; POST/PUT apply
    ``parse(body)``; DELETE applies ``clear`` (back to the broker default)."""
    sub: str
    get: Callable[[NamespacePolicies], Any]
    parse: Callable[[Any], Any]
    apply: Callable[[NamespacePolicies, Any], NamespacePolicies]
    clear: Any
    write_methods: tuple[str, ...] = ("POST", "PUT")


def _opt_json(value: Any) -> Any:
    return None if value is None else value.to_json()


def _parse_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadRequestError(f"body must be true or false, got {value!r}")
    return value


def _parse_strategy(value: Any) -> str:
    try:
        return CompatibilityStrategy.parse(value).value
    except ValueError as e:
        raise PreconditionFailedError(str(e)) from None


POLICY_ROUTES: tuple[PolicyRoute, ...] = (
    PolicyRoute("retention", get=lambda p: _opt_json(p.retention), parse=RetentionPolicy.from_json,
                apply=lambda p, v: replace(p, retention=v), clear=None),
    PolicyRoute("deduplication", get=lambda p: p.deduplication_enabled, parse=_parse_bool,
                apply=lambda p, v: replace(p, deduplication_enabled=v), clear=None),
    PolicyRoute("messageTTL", get=lambda p: p.message_ttl_s,
                parse=lambda v: int_value("message TTL", v, minimum=0),
                apply=lambda p, v: replace(p, message_ttl_s=v), clear=None),
    PolicyRoute("offloadThreshold", get=lambda p: p.offload_threshold_bytes,
                parse=lambda v: int_value("offload threshold", v, minimum=-1),
                apply=lambda p, v: replace(p, offload_threshold_bytes=v), clear=-1),
    PolicyRoute("compactionThreshold", get=lambda p: p.compaction_threshold_bytes,
                parse=lambda v: int_value("compaction threshold", v, minimum=0),
                apply=lambda p, v: replace(p, compaction_threshold_bytes=v), clear=None),
    PolicyRoute("offloadThresholdInSeconds", get=lambda p: p.offload_threshold_s,
                parse=lambda v: int_value("offload threshold in seconds", v, minimum=-1),
                apply=lambda p, v: replace(p, offload_threshold_s=v), clear=-1),
    PolicyRoute("offloadDeletionLagMs", get=lambda p: p.offload_deletion_lag_ms,
                parse=lambda v: int_value("offload deletion lag", v, minimum=0),
                apply=lambda p, v: replace(p, offload_deletion_lag_ms=v), clear=None),
    PolicyRoute("autoTopicCreation", get=lambda p: _opt_json(p.auto_topic_creation),
                parse=AutoTopicCreation.from_json,
                apply=lambda p, v: replace(p, auto_topic_creation=v), clear=None),
    PolicyRoute("rollover", get=lambda p: _opt_json(p.rollover), parse=RolloverPolicy.from_json,
                apply=lambda p, v: replace(p, rollover=v), clear=None),
    PolicyRoute("schemaCompatibilityStrategy", get=lambda p: p.schema_compatibility_strategy,
                parse=_parse_strategy, apply=lambda p, v: replace(p, schema_compatibility_strategy=v),
                clear="UNDEFINED"),
    PolicyRoute("isAllowAutoUpdateSchema", get=lambda p: p.is_allow_auto_update_schema, parse=_parse_bool,
                apply=lambda p, v: replace(p, is_allow_auto_update_schema=v), clear=True),
)


# -- registration --------------------------------------------------------------------------------
def add_namespace_routes(app: web.Application, backend: AdminBackend) -> None:
    """Register the namespace routes (``backend.policies`` read at request time)."""
    _add_namespace_crud(app, backend)
    for route in POLICY_ROUTES:
        _add_policy_route(app, backend, route)
    _add_backlog_quota_routes(app, backend)


def add_namespace_topics_route(app: web.Application, backend: AdminBackend) -> None:
    """``GET {NAMESPACE_PATH}/topics``: Pulsar's Namespaces.getTopics; ``mode`` PERSISTENT
    (default), NON_PERSISTENT or ALL; partitions by their partition names; non-persistent
    topics while loaded on a broker."""

    async def namespace_topics(request: web.Request) -> web.Response:
        namespace = namespace_of(request)
        mode = (request.query.get("mode") or "PERSISTENT").upper()
        if mode not in ("PERSISTENT", "NON_PERSISTENT", "ALL"):
            raise BadRequestError(f"mode must be PERSISTENT, NON_PERSISTENT or ALL, got {request.query['mode']!r}")
        bool_query(request, "includeSystemTopic")        # accepted; there are no system topics
        return json_response(await backend.list_topics(namespace, mode))

    app.router.add_get(NAMESPACE_PATH + "/topics", namespace_topics)


def _add_namespace_crud(app: web.Application, backend: AdminBackend) -> None:
    async def list_namespaces(request: web.Request) -> web.Response:
        policies = backend.policies
        return json_response(await policies.list_namespaces(check_name("tenant", request.match_info["tenant"])))

    async def get_namespace(request: web.Request) -> web.Response:
        found = await backend.policies.get_namespace_policies(namespace_of(request))
        return json_response(found.to_json())

    async def put_namespace(request: web.Request) -> web.Response:
        namespace = namespace_of(request)
        body = await json_body(request, required=False)
        parsed = None if body is None else NamespacePolicies.from_json(body)
        await backend.policies.create_namespace(namespace, parsed)
        return no_content()

    async def delete_namespace(request: web.Request) -> web.Response:
        await backend.policies.delete_namespace(namespace_of(request))
        return no_content()

    r = app.router
    r.add_get(PATH + "/{tenant}", list_namespaces)
    r.add_get(NAMESPACE_PATH, get_namespace)
    r.add_put(NAMESPACE_PATH, put_namespace)
    r.add_delete(NAMESPACE_PATH, delete_namespace)


def _add_policy_route(app: web.Application, backend: AdminBackend, route: PolicyRoute) -> None:
    async def read(request: web.Request) -> web.Response:
        return json_response(route.get(await backend.policies.get_namespace_policies(namespace_of(request))))

    async def write(request: web.Request) -> web.Response:
        namespace = namespace_of(request)
        value = route.parse(await json_body(request))
        await backend.policies.update_namespace_policies(namespace, lambda p: route.apply(p, value))
        return no_content()

    async def remove(request: web.Request) -> web.Response:
        namespace = namespace_of(request)
        await backend.policies.update_namespace_policies(namespace, lambda p: route.apply(p, route.clear))
        return no_content()

    path = NAMESPACE_PATH + "/" + route.sub
    app.router.add_get(path, read)
    for method in route.write_methods:
        app.router.add_route(method, path, write)
    app.router.add_delete(path, remove)


def _add_backlog_quota_routes(app: web.Application, backend: AdminBackend) -> None:
    """``GET .../backlogQuotaMap``; ``POST|DELETE .../backlogQuota?backlogQuotaType=`` (default
    ``destination_storage``)."""

    def quota_type(request: web.Request) -> str:
        kind = request.query.get("backlogQuotaType") or "destination_storage"
        if kind not in BACKLOG_QUOTA_TYPES:
            raise BadRequestError(f"backlogQuotaType must be one of {BACKLOG_QUOTA_TYPES}, got {kind!r}")
        return kind

    async def get_backlog_quotas(request: web.Request) -> web.Response:
        found = await backend.policies.get_namespace_policies(namespace_of(request))
        return json_response({k: v.to_json() for k, v in sorted(found.backlog_quotas.items())})

    async def set_backlog_quota(request: web.Request) -> web.Response:
        namespace, kind = namespace_of(request), quota_type(request)
        quota = BacklogQuota.from_json(await json_body(request))
        await backend.policies.update_namespace_policies(
            namespace, lambda p: replace(p, backlog_quotas={**p.backlog_quotas, kind: quota}))
        return no_content()

    async def remove_backlog_quota(request: web.Request) -> web.Response:
        namespace, kind = namespace_of(request), quota_type(request)
        await backend.policies.update_namespace_policies(
            namespace, lambda p: replace(p, backlog_quotas={k: v for k, v in p.backlog_quotas.items() if k != kind}))
        return no_content()

    r = app.router
    r.add_get(NAMESPACE_PATH + "/backlogQuotaMap", get_backlog_quotas)
    r.add_post(NAMESPACE_PATH + "/backlogQuota", set_backlog_quota)
    r.add_delete(NAMESPACE_PATH + "/backlogQuota", remove_backlog_quota)


__all__ = ["NAMESPACE_PATH", "POLICY_ROUTES", "PolicyRoute", "add_namespace_routes", "add_namespace_topics_route"]
