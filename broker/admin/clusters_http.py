"""Pulsar's cluster admin paths (Clusters), answered from the policy store (ZooKeeper):

- ``GET /admin/v2/clusters``: the cluster names;
- ``GET /admin/v2/clusters/{cluster}``: its ClusterData (``serviceUrl``, ``brokerServiceUrl``, ...);
- ``PUT .../{cluster}`` (body optional): create (409 if it exists);
- ``POST .../{cluster}``: replace its URLs (400 if the body sets none);
- ``DELETE .../{cluster}``: delete (412 while a tenant names it).
"""

from __future__ import annotations

from aiohttp import web

from broker.admin.api import AdminBackend
from broker.admin.http_common import json_body, json_response, no_content
from broker.admin.policies import BadRequestError, ClusterData, check_name

PATH = "/admin/v2/clusters"


def add_cluster_routes(app: web.Application, backend: AdminBackend) -> None:
    """Register the cluster routes (``backend.policies`` read at request time)."""
    r = app.router

    def cluster_of(request: web.Request) -> str:
        return check_name("cluster", request.match_info["cluster"])

    async def list_clusters(request: web.Request) -> web.Response:
        return json_response(await backend.policies.list_clusters())

    async def get_cluster(request: web.Request) -> web.Response:
        data = await backend.policies.get_cluster(cluster_of(request))
        return json_response(data.to_json())

    async def put_cluster(request: web.Request) -> web.Response:
        cluster = cluster_of(request)
        data = ClusterData.from_json(await json_body(request, required=False) or {})
        await backend.policies.create_cluster(cluster, data)
        return no_content()

    async def post_cluster(request: web.Request) -> web.Response:
        cluster = cluster_of(request)
        data = ClusterData.from_json(await json_body(request))
        if data.empty:
            raise BadRequestError("cluster data: an update must set at least one URL (it replaces them all)")
        await backend.policies.update_cluster(cluster, data)
        return no_content()

    async def delete_cluster(request: web.Request) -> web.Response:
        await backend.policies.delete_cluster(cluster_of(request))
        return no_content()

    r.add_get(PATH, list_clusters)
    r.add_get(PATH + "/{cluster}", get_cluster)
    r.add_put(PATH + "/{cluster}", put_cluster)
    r.add_post(PATH + "/{cluster}", post_cluster)
    r.add_delete(PATH + "/{cluster}", delete_cluster)


__all__ = ["add_cluster_routes"]
