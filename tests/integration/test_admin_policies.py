"""Clusters, tenants and namespace policies through the admin HTTP API, with the real
PolicyStore against a real ZooKeeper (a fresh chroot per test)."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from broker.admin.http import make_admin_app
from broker.admin.metrics import BrokerMetrics, MetricsConfig
from broker.admin.policies import (ConflictError, NamespacePolicies, PolicyStore, RetentionPolicy,
                                   namespace_path)
from pulsarlite.metadata import MetadataStore

pytestmark = pytest.mark.integration


class PolicyBackend:
    """Only what the policy routes use: the real PolicyStore (topic routes are unit-tested)."""

    def __init__(self, policies: PolicyStore) -> None:
        self.policies = policies
        self.metrics = BrokerMetrics(MetricsConfig(process_metrics=False))
        self.schemas = None

    async def admin_redirect_url(self, topic: str) -> str | None:
        return None


@pytest.fixture
async def store(zk_hosts):
    s = await MetadataStore.connect(zk_hosts)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def policies(store):
    p = PolicyStore(store)
    await p.ensure_defaults(service_url="http://127.0.0.1:8080", broker_service_url="pulsar://127.0.0.1:6650")
    return p


@pytest.fixture
async def client(policies):
    c = TestClient(TestServer(make_admin_app(PolicyBackend(policies))))
    await c.start_server()
    try:
        yield c
    finally:
        await c.close()


async def ok(resp, status: int = 204):
    assert resp.status == status, await resp.text()
    return await resp.json() if status == 200 else None


async def err(resp, status: int) -> str:
    assert resp.status == status, await resp.text()
    return (await resp.json())["reason"]


NSP = "/admin/v2/namespaces/public/default"


# -- defaults ----------------------------------------------------------------------------------
async def test_ensure_defaults_like_standalone(client, store, policies):
    assert await ok(await client.get("/admin/v2/clusters"), 200) == ["standalone"]
    assert await ok(await client.get("/admin/v2/clusters/standalone"), 200) == {
        "serviceUrl": "http://127.0.0.1:8080", "serviceUrlTls": "",
        "brokerServiceUrl": "pulsar://127.0.0.1:6650", "brokerServiceUrlTls": ""}
    assert await ok(await client.get("/admin/v2/tenants"), 200) == ["public"]
    assert await ok(await client.get("/admin/v2/tenants/public"), 200) == \
        {"adminRoles": [], "allowedClusters": ["standalone"]}
    assert await ok(await client.get("/admin/v2/namespaces/public"), 200) == ["public/default"]
    data, _ = await store.get("/admin/policies/public/default")
    assert json.loads(data)["replication_clusters"] == ["standalone"]
    # idempotent, also when several brokers start at once; never overwrites
    await policies.set_namespace_policies("public/default", NamespacePolicies(message_ttl_s=5))
    others = [PolicyStore(store) for _ in range(4)]
    await asyncio.gather(*(p.ensure_defaults() for p in others))
    assert (await policies.get_namespace_policies("public/default")).message_ttl_s == 5


# -- clusters ----------------------------------------------------------------------------------
async def test_clusters(client):
    await ok(await client.put("/admin/v2/clusters/c2", json={"serviceUrl": "http://h:8080", "unknown": 1}))
    assert await ok(await client.get("/admin/v2/clusters"), 200) == ["c2", "standalone"]
    await err(await client.put("/admin/v2/clusters/c2", json={}), 409)
    await ok(await client.post("/admin/v2/clusters/c2", json={"brokerServiceUrl": "pulsar://h:6650"}))
    got = await ok(await client.get("/admin/v2/clusters/c2"), 200)
    assert got["brokerServiceUrl"] == "pulsar://h:6650" and got["serviceUrl"] == ""
    await err(await client.post("/admin/v2/clusters/nope", json={"serviceUrl": "http://h:8080"}), 404)
    # [hardening] finding 6: an update that blanks every URL, and URLs of the wrong scheme
    await err(await client.post("/admin/v2/clusters/c2", json={}), 400)
    await err(await client.post("/admin/v2/clusters/c2", json={"serviceUrl": "javascript:alert(1)"}), 400)
    await err(await client.post("/admin/v2/clusters/c2", json={"brokerServiceUrl": "http://h:6650"}), 400)
    got = await ok(await client.get("/admin/v2/clusters/c2"), 200)
    assert got["brokerServiceUrl"] == "pulsar://h:6650"              # unchanged
    await err(await client.get("/admin/v2/clusters/nope"), 404)
    await err(await client.put("/admin/v2/clusters/c3", data=b"{not json"), 400)
    await err(await client.put("/admin/v2/clusters/c3", json={"serviceUrl": 5}), 400)
    await err(await client.put("/admin/v2/clusters/bad%20name", json={}), 400)
    assert await ok(await client.get("/admin/v2/clusters"), 200) == ["c2", "standalone"]
    # in use by a tenant: refused
    await err(await client.delete("/admin/v2/clusters/standalone"), 412)
    await ok(await client.delete("/admin/v2/clusters/c2"))
    await err(await client.delete("/admin/v2/clusters/c2"), 404)


# -- tenants -----------------------------------------------------------------------------------
async def test_tenants(client):
    await ok(await client.put("/admin/v2/tenants/acme", json={"adminRoles": ["ops"],
                                                              "allowedClusters": ["standalone"]}))
    assert await ok(await client.get("/admin/v2/tenants"), 200) == ["acme", "public"]
    assert await ok(await client.get("/admin/v2/tenants/acme"), 200) == \
        {"adminRoles": ["ops"], "allowedClusters": ["standalone"]}
    await err(await client.put("/admin/v2/tenants/acme", json={}), 409)
    reason = await err(await client.put("/admin/v2/tenants/t2", json={"allowedClusters": ["mars"]}), 412)
    assert "mars" in reason
    await err(await client.put("/admin/v2/tenants/t2", data=b"[1,"), 400)
    await err(await client.put("/admin/v2/tenants/t2", json={"adminRoles": "ops"}), 400)
    await err(await client.get("/admin/v2/tenants/t2"), 404)
    await ok(await client.post("/admin/v2/tenants/acme", json={"adminRoles": ["a", "b"],
                                                               "allowedClusters": ["standalone"]}))
    assert (await ok(await client.get("/admin/v2/tenants/acme"), 200))["adminRoles"] == ["a", "b"]
    await err(await client.post("/admin/v2/tenants/nope", json={}), 404)
    # a tenant with namespaces cannot be deleted
    await ok(await client.put("/admin/v2/namespaces/acme/ns1"))
    await err(await client.delete("/admin/v2/tenants/acme"), 409)
    await ok(await client.delete("/admin/v2/namespaces/acme/ns1"))
    await ok(await client.delete("/admin/v2/tenants/acme"))
    await err(await client.delete("/admin/v2/tenants/acme"), 404)
    await err(await client.get("/admin/v2/namespaces/acme"), 404)


# -- namespaces --------------------------------------------------------------------------------
async def test_namespaces_create_get_list_delete(client):
    await ok(await client.put("/admin/v2/namespaces/public/ns1",
                              json={"message_ttl_in_seconds": 60, "auth_policies": {"ignored": 1}}))
    await ok(await client.put("/admin/v2/namespaces/public/ns2"))
    assert await ok(await client.get("/admin/v2/namespaces/public"), 200) == \
        ["public/default", "public/ns1", "public/ns2"]
    got = await ok(await client.get("/admin/v2/namespaces/public/ns1"), 200)
    assert got["message_ttl_in_seconds"] == 60
    assert got["replication_clusters"] == ["standalone"]
    assert got["offload_threshold"] == -1 and got["offload_threshold_in_seconds"] == -1
    assert got["retention_policies"] is None and got["deduplicationEnabled"] is None
    for key in ("backlog_quota_map", "offload_deletion_lag_ms", "rollover_policies", "autoTopicCreationOverride"):
        assert key in got
    await err(await client.put("/admin/v2/namespaces/public/ns1"), 409)
    await err(await client.put("/admin/v2/namespaces/nope/ns1"), 404)
    await err(await client.get("/admin/v2/namespaces/public/nope"), 404)
    await err(await client.put("/admin/v2/namespaces/public/ns3", data=b"{x"), 400)
    await err(await client.put("/admin/v2/namespaces/public/ns3", json={"message_ttl_in_seconds": -1}), 412)
    await err(await client.put("/admin/v2/namespaces/public/ns3", json={"replication_clusters": ["c9"]}), 412)
    await err(await client.put("/admin/v2/namespaces/public/bad%20ns"), 400)
    await err(await client.get("/admin/v2/namespaces/public/ns3"), 404)
    await ok(await client.delete("/admin/v2/namespaces/public/ns2"))
    await err(await client.delete("/admin/v2/namespaces/public/ns2"), 404)


async def test_namespace_with_topics_cannot_be_deleted(client, store, policies):
    await ok(await client.put("/admin/v2/namespaces/public/busy"))
    # a topic = a managed ledger znode (the default lister reads /managed-ledgers/<t>/<ns>/persistent)
    await store.create("/managed-ledgers/public/busy/persistent/t%3A1", b"{}")
    reason = await err(await client.delete("/admin/v2/namespaces/public/busy"), 409)
    assert "non empty" in reason
    # still usable: the deleted mark was cleared
    await ok(await client.post("/admin/v2/namespaces/public/busy/messageTTL", json=7))
    assert (await ok(await client.get("/admin/v2/namespaces/public/busy"), 200))["message_ttl_in_seconds"] == 7
    await store.delete("/managed-ledgers/public/busy/persistent/t%3A1")
    await ok(await client.delete("/admin/v2/namespaces/public/busy"))
    assert not await store.exists("/admin/policies/public/busy")


async def test_custom_topic_lister_and_its_failure(store, policies):
    topics: list[str] = []

    async def lister(namespace: str) -> list[str]:
        if topics == ["fail"]:
            raise RuntimeError("lister broke")
        return list(topics)

    custom = PolicyStore(store, list_topics=lister)
    await custom.create_namespace("public/n1")
    topics.append("persistent://public/n1/x")
    with pytest.raises(ConflictError):
        await custom.delete_namespace("public/n1")
    topics[:] = ["fail"]
    with pytest.raises(RuntimeError):
        await custom.delete_namespace("public/n1")
    assert await custom.namespace_exists("public/n1")  # mark cleared after the failure
    topics.clear()
    await custom.delete_namespace("public/n1")
    assert not await custom.namespace_exists("public/n1")


async def test_delete_interrupted_after_mark_is_completed_by_retry(client, store):
    await ok(await client.put("/admin/v2/namespaces/public/half"))
    path = namespace_path("public/half")
    data, version = await store.get(path)
    raw = json.loads(data)
    raw["deleted"] = True  # as left by a broker that died between the mark and the delete
    await store.set(path, json.dumps(raw).encode(), version)
    await err(await client.get("/admin/v2/namespaces/public/half"), 404)
    await err(await client.post("/admin/v2/namespaces/public/half/messageTTL", json=1), 404)
    await ok(await client.delete("/admin/v2/namespaces/public/half"))
    assert not await store.exists(path)


# -- policy sub-paths ----------------------------------------------------------------------------
async def test_retention(client, policies):
    assert await ok(await client.get(f"{NSP}/retention"), 200) is None
    await ok(await client.post(f"{NSP}/retention", json={"retentionTimeInMinutes": 60, "retentionSizeInMB": -1}))
    assert await ok(await client.get(f"{NSP}/retention"), 200) == \
        {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1}
    assert (await policies.get_namespace_policies("public/default")).retention == RetentionPolicy(60, -1)
    # invalid values and malformed bodies change nothing
    await err(await client.post(f"{NSP}/retention", json={"retentionTimeInMinutes": 5, "retentionSizeInMB": 0}),
              412)
    # a numeric string is a number (Pulsar's Jackson coerces it); anything else is malformed
    await err(await client.post(f"{NSP}/retention", json={"retentionTimeInMinutes": "five"}), 400)
    await err(await client.post(f"{NSP}/retention", data=b"{"), 400)
    await err(await client.post(f"{NSP}/retention", data=b""), 400)
    assert await ok(await client.get(f"{NSP}/retention"), 200) == \
        {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1}
    await ok(await client.delete(f"{NSP}/retention"))
    assert await ok(await client.get(f"{NSP}/retention"), 200) is None
    await err(await client.post("/admin/v2/namespaces/public/nope/retention",
                                json={"retentionTimeInMinutes": 1, "retentionSizeInMB": 1}), 404)


async def test_deduplication_ttl_offload(client):
    await ok(await client.post(f"{NSP}/deduplication", json=True))
    assert await ok(await client.get(f"{NSP}/deduplication"), 200) is True
    await err(await client.post(f"{NSP}/deduplication", json="yes"), 400)
    await ok(await client.delete(f"{NSP}/deduplication"))
    assert await ok(await client.get(f"{NSP}/deduplication"), 200) is None

    await ok(await client.post(f"{NSP}/messageTTL", json=3600))
    assert await ok(await client.get(f"{NSP}/messageTTL"), 200) == 3600
    await err(await client.post(f"{NSP}/messageTTL", json=-5), 412)
    await err(await client.post(f"{NSP}/messageTTL", json=1.5), 400)
    assert await ok(await client.get(f"{NSP}/messageTTL"), 200) == 3600
    await ok(await client.delete(f"{NSP}/messageTTL"))
    assert await ok(await client.get(f"{NSP}/messageTTL"), 200) is None

    assert await ok(await client.get(f"{NSP}/offloadThreshold"), 200) == -1
    await ok(await client.put(f"{NSP}/offloadThreshold", json=10 * 1024 * 1024))
    assert await ok(await client.get(f"{NSP}/offloadThreshold"), 200) == 10 * 1024 * 1024
    await err(await client.put(f"{NSP}/offloadThreshold", json=-2), 412)
    await ok(await client.put(f"{NSP}/offloadThresholdInSeconds", json=600))
    assert await ok(await client.get(f"{NSP}/offloadThresholdInSeconds"), 200) == 600
    await ok(await client.put(f"{NSP}/offloadDeletionLagMs", json=4000))
    assert await ok(await client.get(f"{NSP}/offloadDeletionLagMs"), 200) == 4000
    await ok(await client.delete(f"{NSP}/offloadDeletionLagMs"))
    assert await ok(await client.get(f"{NSP}/offloadDeletionLagMs"), 200) is None
    got = await ok(await client.get(NSP), 200)
    assert got["offload_threshold"] == 10 * 1024 * 1024 and got["offload_threshold_in_seconds"] == 600


async def test_backlog_quota_auto_creation_rollover(client, policies):
    await ok(await client.post(f"{NSP}/backlogQuota?backlogQuotaType=destination_storage",
                               json={"limitSize": 1 << 20, "policy": "producer_exception"}))
    assert await ok(await client.get(f"{NSP}/backlogQuotaMap"), 200) == {
        "destination_storage": {"limitSize": 1 << 20, "limitTime": -1, "policy": "producer_exception"}}
    await err(await client.post(f"{NSP}/backlogQuota", json={"policy": "nope"}), 412)
    await err(await client.post(f"{NSP}/backlogQuota?backlogQuotaType=weird", json={}), 400)
    await ok(await client.delete(f"{NSP}/backlogQuota?backlogQuotaType=destination_storage"))
    assert await ok(await client.get(f"{NSP}/backlogQuotaMap"), 200) == {}

    await ok(await client.post(f"{NSP}/autoTopicCreation", json={"allowAutoTopicCreation": True,
                                                                  "topicType": "partitioned",
                                                                  "defaultNumPartitions": 3}))
    assert (await policies.get_namespace_policies("public/default")).auto_topic_creation.default_partitions == 3
    await err(await client.post(f"{NSP}/autoTopicCreation", json={"allowAutoTopicCreation": "y"}), 400)

    await ok(await client.post(f"{NSP}/rollover", json={"max_entries": 1000, "max_age_ms": 60000}))
    assert await ok(await client.get(f"{NSP}/rollover"), 200) == \
        {"max_entries": 1000, "max_bytes": None, "max_age_ms": 60000}
    await err(await client.post(f"{NSP}/rollover", json={"max_bytes": 0}), 412)
    await ok(await client.delete(f"{NSP}/rollover"))
    assert await ok(await client.get(f"{NSP}/rollover"), 200) is None


async def test_concurrent_policy_updates_all_apply(client, policies):
    """Each sub-path update is a CAS transform: concurrent writers of different fields never
    lose each other's change."""
    results = await asyncio.gather(
        client.post(f"{NSP}/messageTTL", json=11),
        client.post(f"{NSP}/deduplication", json=True),
        client.put(f"{NSP}/offloadThreshold", json=123),
        client.put(f"{NSP}/offloadDeletionLagMs", json=456),
        client.post(f"{NSP}/retention", json={"retentionTimeInMinutes": 1, "retentionSizeInMB": 2}),
        client.post(f"{NSP}/rollover", json={"max_entries": 9}),
        *(policies.update_namespace_policies(
            "public/default", lambda p, i=i: p) for i in range(5)),
    )
    assert [r.status for r in results[:6]] == [204] * 6
    p = await policies.get_namespace_policies("public/default")
    assert (p.message_ttl_s, p.deduplication_enabled, p.offload_threshold_bytes, p.offload_deletion_lag_ms) == \
        (11, True, 123, 456)
    assert p.retention == RetentionPolicy(1, 2) and p.rollover.entries_max == 9
