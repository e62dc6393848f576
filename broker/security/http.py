"""[security] The admin HTTP API's authentication and authorization (aiohttp middleware), and
the permission paths (Pulsar's).

Who you are (401 when not proven): ``Authorization: Bearer <token>`` (method ``token``),
``Authorization: Basic <base64 user:password>`` (method ``basic``), else the TLS client
certificate of an https connection (method ``tls``, when that provider is on), else the
anonymous role if one is configured. ``/metrics`` needs a role only with
``authenticate_metrics_endpoint``. The web console's static files (``/``, ``/console/<file>``)
need none: they hold no data; every call they make for data is one of the routes below.

What you may do (403 when not allowed), by route:

- ``/lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}``, and GET of a topic's stats,
  internal stats, segments and console page, partitions, last message id and schemas, and the
  same under ``non-persistent`` (lookup, stats, partitions): lookup permission on the topic
  (produce or consume), as Pulsar's GET_STATS / GET_METADATA;
- ``GET /admin/v2/namespaces/{tenant}/{namespace}/topics``: a role with a namespace permission;
- ``GET /admin/v2/tenants/{tenant}`` and every path under ``/admin/v2/namespaces/{tenant}``,
  ``/admin/v2/persistent/{tenant}``, ``/admin/v2/non-persistent/{tenant}``,
  ``/admin/v2/schemas/{tenant}``: the tenant's admins;
- everything else (clusters, creating/changing/deleting/listing tenants, unknown paths):
  superusers.

Permission paths (a JSON list of actions as body, 204 on writes):
``GET /admin/v2/namespaces/{t}/{ns}/permissions`` (role -> actions),
``POST|DELETE /admin/v2/namespaces/{t}/{ns}/permissions/{role}``, and the same under
``/admin/v2/persistent/{t}/{ns}/{topic}/permissions`` (GET: the namespace's merged with the
topic's). Answers never contain a credential.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from broker.security.authentication import SLOW_AUTH_METHODS, AuthenticationData, AuthenticationError
from broker.security.authorization import (AuthPolicies, PermissionError_, TopicOperation, check_actions,
                                           check_role)
from broker.tls import peer_certificate_of

log = logging.getLogger("pulsarlite.broker.security")

ROLE_KEY = "pulsarlite_role"          # request[ROLE_KEY]: the role the request proved
AUTHORIZATION_HEADER_BYTES_MAX = 16 * 1024

# the Authorization header of the request being served: an admin call this broker makes on the
# caller's behalf to a topic's owner (BrokerAdminBackend._call_owner) carries it, so the owner
# authenticates and authorizes the same role (a caller proven by its TLS certificate has no
# header to forward: such calls reach the owner without credentials)
_FORWARDED_AUTHORIZATION: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "pulsarlite_forwarded_authorization", default=None)


def forwarded_headers() -> dict[str, str]:
    """Headers for an admin call made on behalf of the request being served ({} without one)."""
    value = _FORWARDED_AUTHORIZATION.get()
    return {"Authorization": value} if value else {}


_CONSOLE_FILE_ROUTES = frozenset({"/", "/console/{name}"})
_TENANT_PREFIXES = ("/admin/v2/namespaces/{tenant}", "/admin/v2/persistent/{tenant}",
                    "/admin/v2/non-persistent/{tenant}", "/admin/v2/schemas/{tenant}")
_LOOKUP_ROUTE = "/lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}"
_NP_LOOKUP_ROUTE = "/lookup/v2/topic/non-persistent/{tenant}/{namespace}/{topic}"
_NAMESPACE_TOPICS_ROUTE = "/admin/v2/namespaces/{tenant}/{namespace}/topics"
# reads a role with lookup permission on the topic may make (Pulsar: GET_STATS, GET_METADATA ->
# canLookup): the topic's stats, partitions, last message id and schemas
_TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
_SCHEMA = "/admin/v2/schemas/{tenant}/{namespace}/{topic}"
_LOOKUP_READ_ROUTES = frozenset({
    _LOOKUP_ROUTE, _TOPIC + "/stats", _TOPIC + "/partitioned-stats", _TOPIC + "/internalStats",
    _TOPIC + "/partitions", _TOPIC + "/lastMessageId", _TOPIC + "/segments",
    _TOPIC + "/console", _SCHEMA + "/schema", _SCHEMA + "/schema/{version}", _SCHEMA + "/schemas"})
# the same reads of a non-persistent topic (its lookup, stats and partitions)
_NP_TOPIC = "/admin/v2/non-persistent/{tenant}/{namespace}/{topic}"
_NP_LOOKUP_READ_ROUTES = frozenset({_NP_LOOKUP_ROUTE, _NP_TOPIC + "/stats", _NP_TOPIC + "/partitions"})


def _reason(status: int, reason: str) -> web.Response:
    return web.json_response({"reason": reason}, status=status)


def credentials_of(request: web.Request, providers) -> AuthenticationData:
    """The AuthenticationData an HTTP request presents (see the module docstring)."""
    header = request.headers.get("Authorization", "")
    if len(header) > AUTHORIZATION_HEADER_BYTES_MAX:
        raise AuthenticationError("Authorization header too long")
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() == "bearer":
        return AuthenticationData("token", value.strip().encode("ascii", "replace"))
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise AuthenticationError("basic: the Authorization header is not base64") from None
        return AuthenticationData("basic", decoded)
    if header:
        raise AuthenticationError(f"unsupported Authorization scheme {scheme[:16]!r} (Bearer or Basic)")
    cert = peer_certificate_of(request.transport)
    if cert and "tls" in providers:
        return AuthenticationData("tls", b"", cert)
    return AuthenticationData("", b"")


def make_security_middleware(service) -> Callable:
    """The middleware for a broker ``service`` (its ``authentication``, ``authorization``,
    ``authorize_topic``, ``policies`` and ``config``)."""
    authentication = service.authentication
    authorization = service.authorization
    config = service.config

    @web.middleware
    async def security(request: web.Request, handler) -> web.StreamResponse:
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else ""
        if route == "/metrics" and not config.authenticate_metrics_endpoint:
            return await handler(request)
        if route in _CONSOLE_FILE_ROUTES and request.method in ("GET", "HEAD"):
            return await handler(request)      # the console's static files: no data in them
        try:
            auth = credentials_of(request, authentication.providers)
            if auth.method in SLOW_AUTH_METHODS:      # bcrypt: off the event loop
                role = await asyncio.to_thread(authentication.authenticate, auth)
            else:
                role = authentication.authenticate(auth)
        except AuthenticationError as e:
            log.info("http authentication refused path=%s reason=%s", request.path, e)
            return _reason(401, f"Authentication required: {e}")
        request[ROLE_KEY] = role
        refusal = await _authorize(service, authorization, role, request, route)
        if refusal is not None:
            log.info("http authorization refused role=%s method=%s path=%s", role, request.method, request.path)
            return _reason(403, refusal)
        token = _FORWARDED_AUTHORIZATION.set(request.headers.get("Authorization"))
        try:
            return await handler(request)
        finally:
            _FORWARDED_AUTHORIZATION.reset(token)

    return security


async def _authorize(service, authorization, role: str, request: web.Request, route: str) -> str | None:
    """None when ``role`` may call ``route``, else the reason (403)."""
    if not authorization.enabled or authorization.is_superuser(role) or route == "/metrics":
        return None
    info = request.match_info
    if route in _LOOKUP_READ_ROUTES | _NP_LOOKUP_READ_ROUTES and request.method in ("GET", "HEAD"):
        from broker.security.authorization import AuthorizationError
        from pulsarlite.topic_name import InvalidTopicNameError
        domain = "non-persistent" if route in _NP_LOOKUP_READ_ROUTES else "persistent"
        try:
            await service.authorize_topic(role, f"{domain}://{info['tenant']}/{info['namespace']}/{info['topic']}",
                                          TopicOperation.LOOKUP)
        except AuthorizationError as e:
            return str(e)
        except InvalidTopicNameError:      # the handler answers it (400)
            return None
        return None
    tenant = info.get("tenant")
    tenant_route = tenant is not None and (route.startswith(_TENANT_PREFIXES)
                                           or (route == "/admin/v2/tenants/{tenant}" and request.method == "GET"))
    if not tenant_route:
        return f"role {role} is not a superuser"
    namespace = info.get("namespace")
    if namespace is not None:
        admin_roles, auth = await service.auth_context(f"{tenant}/{namespace}")
    else:
        from broker.admin.policies import AdminError
        try:
            admin_roles, auth = (await service.policies.get_tenant(tenant)).admin_roles, AuthPolicies()
        except AdminError:          # a tenant that does not exist has no admins
            admin_roles, auth = (), AuthPolicies()
    if authorization.is_tenant_admin(role, admin_roles):
        return None
    if route == _NAMESPACE_TOPICS_ROUTE and request.method == "GET" and \
            authorization.allows_namespace_topics(role, auth, admin_roles):
        return None
    return f"role {role} is not an admin of tenant {tenant}"


# -- permission paths --------------------------------------------------------------------------------
def add_permission_routes(app: web.Application, policies: Callable[[], object], *,
                          json_body: Callable[[web.Request], Awaitable[object]],
                          topic_of: Callable[[web.Request], str]) -> None:
    from broker.admin.policies import BadRequestError

    def namespace_of(request: web.Request) -> str:
        return f"{request.match_info['tenant']}/{request.match_info['namespace']}"

    def role_of(request: web.Request) -> str:
        try:
            return check_role(request.match_info["role"])
        except PermissionError_ as e:
            raise BadRequestError(str(e)) from None

    async def actions_of(request: web.Request) -> frozenset[str]:
        try:
            return check_actions(await json_body(request))
        except PermissionError_ as e:
            raise BadRequestError(str(e)) from None

    async def update(namespace: str, change: Callable[[AuthPolicies], AuthPolicies]) -> None:
        from dataclasses import replace

        def transform(current):
            try:
                return replace(current, auth_policies=change(current.auth_policies))
            except PermissionError_ as e:
                raise BadRequestError(str(e)) from None

        await policies().update_namespace_policies(namespace, transform)

    def as_json(roles) -> web.Response:
        return web.json_response({r: sorted(a) for r, a in sorted(roles.items())})

    async def get_namespace(request: web.Request) -> web.Response:
        found = await policies().get_namespace_policies(namespace_of(request))
        return as_json(found.auth_policies.namespace_auth)

    async def grant_namespace(request: web.Request) -> web.Response:
        role, actions = role_of(request), await actions_of(request)
        await update(namespace_of(request), lambda a: a.grant_namespace(role, actions))
        log.info("permissions granted namespace=%s role=%s actions=%s", namespace_of(request), role, sorted(actions))
        return web.Response(status=204)

    async def revoke_namespace(request: web.Request) -> web.Response:
        role = role_of(request)
        await update(namespace_of(request), lambda a: a.revoke_namespace(role))
        log.info("permissions revoked namespace=%s role=%s", namespace_of(request), role)
        return web.Response(status=204)

    async def get_topic(request: web.Request) -> web.Response:
        topic = topic_of(request)
        found = await policies().get_namespace_policies(namespace_of(request))
        return as_json(found.auth_policies.topic_permissions(topic))

    async def grant_topic(request: web.Request) -> web.Response:
        topic, role, actions = topic_of(request), role_of(request), await actions_of(request)
        await update(namespace_of(request), lambda a: a.grant_topic(topic, role, actions))
        log.info("permissions granted topic=%s role=%s actions=%s", topic, role, sorted(actions))
        return web.Response(status=204)

    async def revoke_topic(request: web.Request) -> web.Response:
        topic, role = topic_of(request), role_of(request)
        await update(namespace_of(request), lambda a: a.revoke_topic(topic, role))
        log.info("permissions revoked topic=%s role=%s", topic, role)
        return web.Response(status=204)

    ns = "/admin/v2/namespaces/{tenant}/{namespace}/permissions"
    tp = "/admin/v2/persistent/{tenant}/{namespace}/{topic}/permissions"
    r = app.router
    r.add_get(ns, get_namespace)
    r.add_post(ns + "/{role}", grant_namespace)
    r.add_delete(ns + "/{role}", revoke_namespace)
    r.add_get(tp, get_topic)
    r.add_post(tp + "/{role}", grant_topic)
    r.add_delete(tp + "/{role}", revoke_topic)


__all__ = ["ROLE_KEY", "add_permission_routes", "credentials_of", "forwarded_headers", "make_security_middleware"]
