"""Every route of the admin app goes through the authentication and authorization gate
(broker/security/http.py), except the ones on an explicit public list: the routes are read from
the built app itself, so a route added to any resource module (broker/admin/*_http.py) is
checked without this file changing.

The app is built over a backend with every optional route (console data, metadata locations,
schemas) whose every call is recorded, and a secured service made of the real authentication
(basic, an APR1 password file), authorization and BrokerService's own authorize_topic /
auth_context. For each route: no credentials -> 401, a role with no rights -> 403, and in both
cases nothing reached the backend; a superuser passes the gate (no 401/403), which shows the
requests reach the routes they name."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

import pytest
from aiohttp.test_utils import TestClient, TestServer
from passlib.hash import apr_md5_crypt

from broker.admin.http import make_admin_app
from broker.admin.metrics import BrokerMetrics, MetricsConfig
from broker.admin.policies import NamespacePolicies, NotFoundError, TenantInfo
from broker.security.authentication import AuthenticationService, BasicAuthenticationProvider
from broker.security.authorization import AuthorizationService
from broker.service import BrokerService

# routes answered without credentials: the console's static files (they hold no data)
PUBLIC = frozenset({("GET", "/"), ("HEAD", "/"), ("GET", "/console/{name}"), ("HEAD", "/console/{name}")})
# /metrics: public, or with authenticate_metrics_endpoint open to any authenticated role
METRICS = frozenset({("GET", "/metrics"), ("HEAD", "/metrics")})

PASSWORD = "pw"
SUPERUSER, NOBODY, TENANT_ADMIN = "root", "nobody", "tenant-admin"

# a valid value for every path placeholder, so a request that passes the gate reaches its handler
PLACEHOLDERS = {"tenant": "public", "namespace": "default", "topic": "t1", "subscription": "s1",
                "cluster": "standalone", "role": "r1", "ledger": "1", "entry": "0", "timestamp": "0",
                "count": "1", "seconds": "1", "position": "1", "version": "0", "name": "index.html"}


class Recorder:
    """Any method: recorded in ``calls``, then NotFoundError (404)."""

    def __init__(self, calls: list, name: str) -> None:
        self._calls, self._name = calls, name

    def __getattr__(self, method: str):
        if method.startswith("__"):
            raise AttributeError(method)

        async def call(*args, **kwargs):
            self._calls.append((f"{self._name}.{method}", args))
            raise NotFoundError("in-test: nothing here")
        return call


class RecordingBackend:
    """Every AdminBackend method (and the optional console, metadata and schema ones) recorded."""

    def __init__(self, service) -> None:
        self.calls: list = []
        self.service = service
        self.metrics = BrokerMetrics(MetricsConfig(process_metrics=False))
        self.policies = Recorder(self.calls, "policies")
        self.schemas = Recorder(self.calls, "schemas")
        self._rest = Recorder(self.calls, "backend")

    async def admin_redirect_url(self, topic: str) -> str | None:
        return None                              # every topic served here

    def metadata_locations(self) -> dict:
        self.calls.append(("backend.metadata_locations", ()))
        return {}

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)
        return getattr(self._rest, method)


class InTestPolicies:
    """The tenant ``public`` (admin: TENANT_ADMIN) with default namespace policies."""

    async def get_tenant(self, tenant: str) -> TenantInfo:
        if tenant != "public":
            raise NotFoundError(f"Tenant {tenant} does not exist")
        return TenantInfo(admin_roles=(TENANT_ADMIN,))

    async def get_namespace_policies(self, namespace: str) -> NamespacePolicies:
        return NamespacePolicies()


@dataclass(frozen=True)
class SecurityConfig:
    authenticate_metrics_endpoint: bool


class SecuredService:
    """What the security middleware reads of a broker: the real services, and BrokerService's
    own authorize_topic/auth_context over in-test policies."""

    authorize_topic = BrokerService.authorize_topic
    auth_context = BrokerService.auth_context

    def __init__(self, *, authenticate_metrics_endpoint: bool) -> None:
        hashed = apr_md5_crypt.hash(PASSWORD).encode()
        users = {SUPERUSER: hashed, NOBODY: hashed, TENANT_ADMIN: hashed}
        self.authentication = AuthenticationService({"basic": BasicAuthenticationProvider(users)})
        self.authorization = AuthorizationService(enabled=True, superuser_roles=[SUPERUSER])
        self.config = SecurityConfig(authenticate_metrics_endpoint)
        self.policies = InTestPolicies()


def routes_of(app) -> list[tuple[str, str]]:
    """(method, canonical path) of every route of the app."""
    return sorted({(route.method, resource.canonical) for resource in app.router.resources() for route in resource})


def url_of(canonical: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: PLACEHOLDERS[m.group(1)], canonical)


def basic(role: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{role}:{PASSWORD}".encode()).decode()}


@pytest.fixture(params=[False, True], ids=["metrics-open", "metrics-authenticated"])
async def secured(request):
    service = SecuredService(authenticate_metrics_endpoint=request.param)
    backend = RecordingBackend(service)
    app = make_admin_app(backend)
    public, any_role = (PUBLIC, METRICS) if request.param else (PUBLIC | METRICS, frozenset())
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        yield client, backend, routes_of(app), public, any_role
    finally:
        await client.close()


def test_the_app_has_every_resource_and_the_public_list_is_current():
    """The backend above builds every optional route; the public list names only real routes."""
    app = make_admin_app(RecordingBackend(SecuredService(authenticate_metrics_endpoint=False)))
    routes = set(routes_of(app))
    assert PUBLIC | METRICS <= routes
    for path in ("/admin/v2/console/cluster", "/admin/v2/pulsarlite/metadata",
                 "/admin/v2/schemas/{tenant}/{namespace}/{topic}/schema",
                 "/admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}"):
        assert any(p == path for _, p in routes), path
    assert len(routes) > 100


async def test_every_route_without_credentials_is_refused_unless_public(secured):
    client, backend, routes, public, _ = secured
    unguarded = []
    for method, path in routes:
        resp = await client.request(method, url_of(path))
        await resp.read()
        if (method, path) in public:
            assert resp.status not in (401, 403), (method, path, resp.status)
        elif resp.status != 401:
            unguarded.append((method, path, resp.status))
    assert unguarded == []
    assert backend.calls == []


async def test_every_route_refuses_a_role_without_rights_unless_public(secured):
    client, backend, routes, public, any_role = secured
    unguarded = []
    for method, path in routes:
        if (method, path) in public:
            continue
        resp = await client.request(method, url_of(path), headers=basic(NOBODY))
        await resp.read()
        if (method, path) in any_role:
            assert resp.status not in (401, 403), (method, path, resp.status)
        elif resp.status != 403:
            unguarded.append((method, path, resp.status))
    assert unguarded == []
    assert backend.calls == []


async def test_a_superuser_passes_the_gate_on_every_route(secured):
    """The refusals above come from the gate: the same requests by a superuser reach the routes."""
    client, backend, routes, _, _ = secured
    for method, path in routes:
        resp = await client.request(method, url_of(path), headers=basic(SUPERUSER), json=None)
        await resp.read()
        assert resp.status not in (401, 403), (method, path, resp.status)
    assert backend.calls                      # the handlers ran and called the backend


async def test_a_tenant_admin_passes_the_gate_on_every_topic_route_of_its_tenant(secured):
    """Persistent and non-persistent alike (Pulsar's tenant admins manage both kinds): every
    route under a tenant's topic paths and both lookups admit the tenant's admin. The
    non-persistent ones were superuser-only before."""
    client, _, routes, _, _ = secured
    prefixes = ("/admin/v2/persistent/{tenant}", "/admin/v2/non-persistent/{tenant}", "/lookup/v2/topic/")
    checked = 0
    refused_routes = []
    for method, path in routes:
        if not path.startswith(prefixes):
            continue
        checked += 1
        resp = await client.request(method, url_of(path), headers=basic(TENANT_ADMIN), json=None)
        await resp.read()
        if resp.status in (401, 403):
            refused_routes.append((method, path, resp.status))
    assert refused_routes == []
    assert checked > 20 and any("non-persistent" in p for _, p in routes)
