"""Pulsar's tenant admin paths (Tenants), answered from the policy store (ZooKeeper):

- ``GET /admin/v2/tenants``: the tenant names;
- ``GET /admin/v2/tenants/{tenant}``: its TenantInfo (``adminRoles``, ``allowedClusters``);
- ``PUT .../{tenant}`` (body optional): create (409 if it exists);
- ``POST .../{tenant}``: update its TenantInfo;
- ``DELETE .../{tenant}``: delete (409 while it has namespaces).
"""

from __future__ import annotations

from aiohttp import web

from broker.admin.api import AdminBackend
from broker.admin.http_common import json_body, json_response, no_content
from broker.admin.policies import TenantInfo, check_name

PATH = "/admin/v2/tenants"


def add_tenant_routes(app: web.Application, backend: AdminBackend) -> None:
    """Register the tenant routes (``backend.policies`` read at request time)."""
    r = app.router

    def tenant_of(request: web.Request) -> str:
        return check_name("tenant", request.match_info["tenant"])

    async def list_tenants(request: web.Request) -> web.Response:
        return json_response(await backend.policies.list_tenants())

    async def get_tenant(request: web.Request) -> web.Response:
        info = await backend.policies.get_tenant(tenant_of(request))
        return json_response(info.to_json())

    async def put_tenant(request: web.Request) -> web.Response:
        tenant = tenant_of(request)
        info = TenantInfo.from_json(await json_body(request, required=False) or {})
        await backend.policies.create_tenant(tenant, info)
        return no_content()

    async def post_tenant(request: web.Request) -> web.Response:
        tenant = tenant_of(request)
        info = TenantInfo.from_json(await json_body(request))
        await backend.policies.update_tenant(tenant, info)
        return no_content()

    async def delete_tenant(request: web.Request) -> web.Response:
        await backend.policies.delete_tenant(tenant_of(request))
        return no_content()

    r.add_get(PATH, list_tenants)
    r.add_get(PATH + "/{tenant}", get_tenant)
    r.add_put(PATH + "/{tenant}", put_tenant)
    r.add_post(PATH + "/{tenant}", post_tenant)
    r.add_delete(PATH + "/{tenant}", delete_tenant)


__all__ = ["add_tenant_routes"]
