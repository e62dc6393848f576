"""The admin HTTP layer (topic routes, lookup, metrics, error shapes) against an in-test backend
holding topics in dicts; policy validation as pure functions. Policy routes against the real
PolicyStore and ZooKeeper are in tests/integration/test_admin_policies.py."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from broker.admin.http import AdminBackend, make_admin_app
from broker.admin.metrics import BrokerMetrics, MetricsConfig
from broker.compaction.core import CompactionRunningError, StatusBoard
from broker.latency import LatencyBuckets
from broker.admin.policies import (AutoTopicCreation, BadRequestError, ConflictError, NamespacePolicies,
                                   NotFoundError, PreconditionFailedError, RetentionPolicy, TenantInfo)

NS = "public/default"
T = "persistent://public/default/t1"


class BackendBase:
    """What every in-test admin backend has (tests/unit/test_admin_*.py): every topic served
    here, metrics, no policy routes (tested against ZooKeeper), no schema routes (tested
    against a broker)."""

    def __init__(self) -> None:
        self.policies = None
        self.metrics = BrokerMetrics(MetricsConfig(process_metrics=False))
        self.schemas = None
        self.calls: list[tuple] = []

    async def admin_redirect_url(self, topic: str) -> str | None:
        return None


@contextlib.asynccontextmanager
async def admin_client(backend) -> AsyncIterator[TestClient]:
    """A test client of the admin app over ``backend``."""
    c = TestClient(TestServer(make_admin_app(backend, body_bytes_max=64 * 1024, partitions_max=100)))
    await c.start_server()
    try:
        yield c
    finally:
        await c.close()


class DictBackend(BackendBase):
    """AdminBackend over dicts: topic -> {"subs": {name: position}}; partitioned -> count."""

    def __init__(self) -> None:
        super().__init__()
        self.topics: dict[str, dict] = {}
        self.partitioned: dict[str, int] = {}
        self.producers: dict[str, int] = {}
        self.compaction = StatusBoard()

    async def compact(self, topic: str) -> None:
        """The real status board (broker/compaction/core.py); the run itself is the test's."""
        self._get(topic)
        try:
            self.compaction.start(topic)
        except CompactionRunningError as e:
            raise ConflictError(str(e)) from None

    async def compaction_status(self, topic: str) -> dict:
        self._get(topic)
        return self.compaction.report(topic).to_json()

    def _get(self, topic: str) -> dict:
        if topic not in self.topics:
            raise NotFoundError(f"Topic {topic} not found")
        return self.topics[topic]

    def _check_namespace(self, topic: str) -> None:
        if not topic.startswith(f"persistent://{NS}/"):
            raise NotFoundError("Namespace does not exist")

    async def list_topics(self, namespace: str) -> list[str]:
        if namespace != NS:
            raise NotFoundError(f"Namespace {namespace} does not exist")
        return sorted(self.topics)

    async def list_partitioned_topics(self, namespace: str) -> list[str]:
        return sorted(self.partitioned)

    async def create_topic(self, topic: str) -> None:
        self._check_namespace(topic)
        if topic in self.topics or topic in self.partitioned:
            raise ConflictError(f"Topic {topic} already exists")
        self.topics[topic] = {"subs": {}}

    async def delete_topic(self, topic: str, force: bool) -> None:
        self._get(topic)
        if self.producers.get(topic) and not force:
            raise PreconditionFailedError("Topic has active producers/subscriptions")
        del self.topics[topic]

    async def create_partitioned_topic(self, topic: str, partitions: int, properties=None) -> None:
        self._check_namespace(topic)
        if topic in self.topics or topic in self.partitioned:
            raise ConflictError(f"Topic {topic} already exists")
        self.partitioned[topic] = partitions
        for i in range(partitions):
            self.topics[f"{topic}-partition-{i}"] = {"subs": {}}

    async def update_partitioned_topic(self, topic: str, partitions: int) -> None:
        if topic not in self.partitioned:
            raise NotFoundError(f"Partitioned topic {topic} not found")
        if partitions <= self.partitioned[topic]:
            raise PreconditionFailedError("Number of partitions must be more than existing")
        for i in range(self.partitioned[topic], partitions):
            self.topics[f"{topic}-partition-{i}"] = {"subs": {}}
        self.partitioned[topic] = partitions

    async def delete_partitioned_topic(self, topic: str, force: bool) -> None:
        n = self.partitioned.pop(topic, None)
        if n is None:
            raise NotFoundError(f"Partitioned topic {topic} not found")
        for i in range(n):
            self.topics.pop(f"{topic}-partition-{i}", None)

    async def partitioned_metadata(self, topic: str) -> int:
        return self.partitioned.get(topic, 0)

    async def partitioned_topic_properties(self, topic: str):
        return None

    async def topic_stats(self, topic: str):
        t = self._get(topic)
        return {"msgRateIn": 1.5, "msgThroughputIn": 150.0, "msgRateOut": 0.0, "msgThroughputOut": 0.0,
                "storageSize": 1000, "backlogSize": 10, "publishers": [],
                "subscriptions": {name: {"msgBacklog": 3, "type": "Exclusive", "consumers": []}
                                  for name in t["subs"]}}

    async def internal_stats(self, topic: str):
        self._get(topic)
        return {"entriesAddedCounter": 2, "numberOfEntries": 2, "totalSize": 200, "currentLedgerEntries": 2,
                "currentLedgerSize": 200, "lastConfirmedEntry": "7:1", "state": "LedgerOpened",
                "ledgers": [{"ledgerId": 7, "entries": 0, "size": 0, "offloaded": False}], "cursors": {}}

    async def unload_topic(self, topic: str) -> None:
        self._get(topic)
        self.calls.append(("unload", topic))

    async def list_subscriptions(self, topic: str) -> list[str]:
        return sorted(self._get(topic)["subs"])

    async def create_subscription(self, topic: str, name: str, position) -> None:
        subs = self._get(topic)["subs"]
        if name in subs:
            raise ConflictError(f"Subscription {name} already exists")
        subs[name] = position

    async def delete_subscription(self, topic: str, name: str, force: bool) -> None:
        subs = self._get(topic)["subs"]
        if name not in subs:
            raise NotFoundError(f"Subscription {name} not found")
        del subs[name]

    async def reset_cursor_by_time(self, topic: str, subscription: str, timestamp_ms: int) -> None:
        if subscription not in self._get(topic)["subs"]:
            raise NotFoundError(f"Subscription {subscription} not found")
        self.calls.append(("reset", topic, subscription, timestamp_ms))

    async def lookup(self, topic: str, *, authoritative: bool = False, listener_name: str = ""):
        return {"brokerUrl": "pulsar://127.0.0.1:6650", "httpUrl": "http://127.0.0.1:8080"}

    async def last_message_id(self, topic: str):
        self._get(topic)
        return {"ledgerId": 7, "entryId": 1, "partitionIndex": -1}


def _is_backend(b: AdminBackend) -> AdminBackend:  # static check that DictBackend fits the Protocol
    return b


@pytest.fixture
def backend() -> DictBackend:
    return _is_backend(DictBackend())  # type: ignore[return-value]


@pytest.fixture
async def client(backend):
    async with admin_client(backend) as c:
        yield c


P = "/admin/v2/persistent/public/default"


async def expect_error(resp, status: int) -> str:
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    body = await resp.json()
    assert isinstance(body["reason"], str) and body["reason"]
    return body["reason"]


# -- topics ------------------------------------------------------------------------------------
async def test_create_list_delete_topic(client, backend):
    resp = await client.put(f"{P}/t1")
    assert resp.status == 204
    assert backend.topics == {T: {"subs": {}}}
    resp = await client.get(P)
    assert resp.status == 200 and await resp.json() == [T]
    await expect_error(await client.put(f"{P}/t1"), 409)
    assert (await client.delete(f"{P}/t1")).status == 204
    assert backend.topics == {}
    await expect_error(await client.delete(f"{P}/t1"), 404)


async def test_delete_topic_force_query(client, backend):
    await client.put(f"{P}/t1")
    backend.producers[T] = 1
    reason = await expect_error(await client.delete(f"{P}/t1"), 412)
    assert "active" in reason
    await expect_error(await client.delete(f"{P}/t1?force=maybe"), 400)
    assert T in backend.topics
    assert (await client.delete(f"{P}/t1?force=true")).status == 204


async def test_topic_in_missing_namespace_is_404_and_bad_names_400(client, backend):
    await expect_error(await client.put("/admin/v2/persistent/nope/ns/t1"), 404)
    await expect_error(await client.get("/admin/v2/persistent/nope/ns"), 404)
    await expect_error(await client.put("/admin/v2/persistent/bad%20tenant/ns/t1"), 400)
    await expect_error(await client.put(f"{P}/bad%20topic"), 400)
    await expect_error(await client.put(f"{P}/a%0Ab"), 400)
    assert backend.topics == {}


async def test_partitioned_topic_lifecycle(client, backend):
    assert (await client.put(f"{P}/pt/partitions", json=3)).status == 204
    resp = await client.get(f"{P}/pt/partitions")
    assert await resp.json() == {"partitions": 3}
    assert await (await client.get(f"{P}/partitioned")).json() == ["persistent://public/default/pt"]
    assert len(await (await client.get(P)).json()) == 3
    await expect_error(await client.put(f"{P}/pt/partitions", json=3), 409)
    assert (await client.post(f"{P}/pt/partitions", json=5)).status == 204
    assert await (await client.get(f"{P}/pt/partitions")).json() == {"partitions": 5}
    await expect_error(await client.post(f"{P}/pt/partitions", json=2), 412)
    await expect_error(await client.post(f"{P}/nope/partitions", json=2), 404)
    assert await (await client.get(f"{P}/nope/partitions")).json() == {"partitions": 0}
    assert (await client.delete(f"{P}/pt/partitions")).status == 204
    assert backend.topics == {} and backend.partitioned == {}


async def test_partitioned_topic_bad_input(client, backend):
    await expect_error(await client.put(f"{P}/pt/partitions", data=b"{nope"), 400)
    await expect_error(await client.put(f"{P}/pt/partitions", data=b""), 400)
    await expect_error(await client.put(f"{P}/pt/partitions", json="x"), 400)
    await expect_error(await client.put(f"{P}/pt/partitions", json=True), 400)
    await expect_error(await client.put(f"{P}/pt/partitions", json=0), 412)
    await expect_error(await client.put(f"{P}/pt/partitions", json=101), 412)  # partitions_max
    await expect_error(await client.put(f"{P}/x-partition-1/partitions", json=2), 412)
    assert backend.partitioned == {} and backend.topics == {}


async def test_stats_shapes(client, backend):
    await expect_error(await client.get(f"{P}/t1/stats"), 404)
    await client.put(f"{P}/t1")
    await client.put(f"{P}/t1/subscription/s1")
    stats = await (await client.get(f"{P}/t1/stats")).json()
    for key in ("msgRateIn", "msgThroughputIn", "msgRateOut", "storageSize", "backlogSize", "publishers"):
        assert key in stats
    assert stats["subscriptions"]["s1"] == {"msgBacklog": 3, "type": "Exclusive", "consumers": []}
    internal = await (await client.get(f"{P}/t1/internalStats")).json()
    assert internal["lastConfirmedEntry"] == "7:1"
    assert internal["ledgers"][0]["ledgerId"] == 7
    await expect_error(await client.get(f"{P}/nope/internalStats"), 404)


async def test_unload_and_last_message_id(client, backend):
    await client.put(f"{P}/t1")
    assert (await client.put(f"{P}/t1/unload")).status == 204
    assert backend.calls == [("unload", T)]
    await expect_error(await client.put(f"{P}/nope/unload"), 404)
    assert await (await client.get(f"{P}/t1/lastMessageId")).json() == \
        {"ledgerId": 7, "entryId": 1, "partitionIndex": -1}


async def test_subscriptions(client, backend):
    await client.put(f"{P}/t1")
    assert await (await client.get(f"{P}/t1/subscriptions")).json() == []
    assert (await client.put(f"{P}/t1/subscription/latest")).status == 204
    assert (await client.put(f"{P}/t1/subscription/early", json={"ledgerId": -1, "entryId": -1})).status == 204
    assert (await client.put(f"{P}/t1/subscription/late", json={"ledgerId": 2**63 - 1,
                                                                "entryId": 2**63 - 1})).status == 204
    assert (await client.put(f"{P}/t1/subscription/at", json={"ledgerId": 7, "entryId": 3,
                                                              "partitionIndex": -1})).status == 204
    assert (await client.put(f"{P}/t1/subscription/named", json="earliest")).status == 204
    assert backend.topics[T]["subs"] == {"latest": "latest", "early": "earliest", "late": "latest",
                                         "at": (7, 3), "named": "earliest"}
    assert await (await client.get(f"{P}/t1/subscriptions")).json() == ["at", "early", "late", "latest", "named"]
    await expect_error(await client.put(f"{P}/t1/subscription/at"), 409)
    await expect_error(await client.put(f"{P}/t1/subscription/bad", data=b"{"), 400)
    await expect_error(await client.put(f"{P}/t1/subscription/bad", json={"ledgerId": "x", "entryId": 1}), 400)
    await expect_error(await client.put(f"{P}/t1/subscription/bad", json="middle"), 400)
    await expect_error(await client.put(f"{P}/t1/subscription/bad%20name"), 400)
    await expect_error(await client.put(f"{P}/nope/subscription/s"), 404)
    assert "bad" not in backend.topics[T]["subs"]
    assert (await client.delete(f"{P}/t1/subscription/at")).status == 204
    await expect_error(await client.delete(f"{P}/t1/subscription/at"), 404)


async def test_reset_cursor(client, backend):
    await client.put(f"{P}/t1")
    await client.put(f"{P}/t1/subscription/s1")
    assert (await client.post(f"{P}/t1/subscription/s1/resetcursor/1700000000000")).status == 204
    assert backend.calls == [("reset", T, "s1", 1700000000000)]
    await expect_error(await client.post(f"{P}/t1/subscription/s1/resetcursor/yesterday"), 400)
    await expect_error(await client.post(f"{P}/t1/subscription/s1/resetcursor/-5"), 412)
    await expect_error(await client.post(f"{P}/t1/subscription/nope/resetcursor/1"), 404)
    assert len(backend.calls) == 1


async def test_lookup(client):
    resp = await client.get("/lookup/v2/topic/persistent/public/default/t1")
    assert resp.status == 200
    assert await resp.json() == {"brokerUrl": "pulsar://127.0.0.1:6650", "httpUrl": "http://127.0.0.1:8080"}
    await expect_error(await client.get("/lookup/v2/topic/persistent/public/bad%20ns/t1"), 400)


async def test_unknown_route_and_method_are_json(client):
    await expect_error(await client.get("/admin/v2/nothing"), 404)
    await expect_error(await client.patch(f"{P}/t1"), 405)


async def test_body_too_large_is_rejected(client, backend):
    resp = await client.put(f"{P}/pt/partitions", data=b"1" + b" " * (65 * 1024))
    await expect_error(resp, 413)
    assert backend.partitioned == {}


async def test_bodies_a_client_got_wrong_are_400s_that_change_nothing(client, backend):
    """[hardening] finding 6: these got a 500 with a traceback."""
    url = f"{P}/pt/partitions"
    bodies = [
        ({}, b"[" * 30_000 + b"]" * 30_000),                                     # nested too deeply
        ({"Content-Type": "application/json; charset=utf-8"}, b'"\xff"'),         # not UTF-8
        ({"Content-Type": "application/json; charset=no-such-charset"}, b"4"),    # unknown charset
        ({"Content-Encoding": "gzip"}, b"this is not gzip"),                       # bad gzip
    ]
    for headers, body in bodies:       # each on its own connection (aiohttp drops one after bad gzip)
        resp = await client.put(url, data=body, headers={**headers, "Connection": "close"})
        text = await expect_error(resp, 400)
        assert "Traceback" not in text
    assert backend.partitioned == {}
    await client.put(url, data=b"4", headers={"Content-Type": "application/json"})
    assert backend.partitioned


async def test_backend_errors_map_to_503_and_500(client, backend):
    from pulsarlite.errors import MetadataError

    async def unavailable(topic):
        raise MetadataError("zk down")

    async def bug(topic):
        raise RuntimeError("boom")

    backend.topic_stats = unavailable
    backend.internal_stats = bug
    await expect_error(await client.get(f"{P}/t1/stats"), 503)
    await expect_error(await client.get(f"{P}/t1/internalStats"), 500)


# -- metrics -----------------------------------------------------------------------------------
async def test_metrics_endpoint(client, backend):
    backend.metrics.on_publish(T, 5, 500)
    latency = LatencyBuckets()
    latency.add(0.003)
    backend.metrics.on_publish_latencies(T, latency)
    backend.metrics.on_dispatch(T, 2, 200)
    backend.metrics.set_backlog(T, 3, 300, 1000)
    backend.metrics.on_bookie_error("bookie-1:3181", TimeoutError())
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=")
    text = await resp.text()
    labels = 'cluster="standalone",namespace="public/default",topic="persistent://public/default/t1"'
    assert f"pulsar_in_messages_total{{{labels}}} 5.0" in text
    assert f"pulsar_in_bytes_total{{{labels}}} 500.0" in text
    assert f"pulsar_out_messages_total{{{labels}}} 2.0" in text
    assert f"pulsar_msg_backlog{{{labels}}} 3.0" in text
    assert 'pulsarlite_publish_latency_seconds_count{cluster="standalone",namespace="public/default"} 1.0' in text
    assert 'error="TimeoutError"' in text
    resp = await client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text")


def sample(metrics: BrokerMetrics, name: str, labels: dict) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_publish_latency_histogram_counts_every_send_folded_in():
    """Topics fold their per-bucket counts in (broker/latency.py); the histogram is cumulative
    per namespace, every SEND counted (the old per-interval cap of 1,024 samples kept only the
    start of each stats interval)."""
    m = BrokerMetrics(MetricsConfig())
    first = LatencyBuckets()
    first.add(0.0025, 3000)          # a run of 3,000 SENDs confirmed together at 2.5 ms
    first.add(0.012)
    m.on_publish_latencies(T, first)
    second = LatencyBuckets()
    second.add(0.0005)               # on a bound: counted in that bucket (le = <=)
    m.on_publish_latencies("persistent://public/default/t2", second)
    third = LatencyBuckets()
    third.add(20.0)                  # beyond the last bound: +Inf only
    m.on_publish_latencies(T, third)
    labels = {"cluster": "standalone", "namespace": "public/default"}
    name = "pulsarlite_publish_latency_seconds"
    assert sample(m, f"{name}_count", labels) == 3003
    assert sample(m, f"{name}_bucket", dict(labels, le="0.0005")) == 1
    assert sample(m, f"{name}_bucket", dict(labels, le="0.002")) == 1
    assert sample(m, f"{name}_bucket", dict(labels, le="0.003")) == 3001
    assert sample(m, f"{name}_bucket", dict(labels, le="0.015")) == 3002
    assert sample(m, f"{name}_bucket", dict(labels, le="10.0")) == 3002
    assert sample(m, f"{name}_bucket", dict(labels, le="+Inf")) == 3003
    assert abs(sample(m, f"{name}_sum", labels) - (7.5 + 0.012 + 0.0005 + 20.0)) < 1e-9


def test_latency_buckets_refuse_what_no_clock_gives():
    b = LatencyBuckets()
    for bad in (-0.001, float("nan")):
        with pytest.raises(ValueError):
            b.add(bad)
    with pytest.raises(ValueError):
        b.add(0.001, 0)
    assert b.total == 0 and b.sum_s == 0.0


def test_metrics_registries_are_separate():
    a, b = BrokerMetrics(MetricsConfig(process_metrics=False)), BrokerMetrics(MetricsConfig(process_metrics=False))
    a.on_publish(T, 1, 10)
    labels = {"cluster": "standalone", "namespace": NS, "topic": T}
    assert sample(a, "pulsar_in_messages_total", labels) == 1
    assert sample(b, "pulsar_in_messages_total", labels) is None


def test_metrics_topic_labels_are_bounded():
    m = BrokerMetrics(MetricsConfig(topics_labelled_max=2, namespaces_labelled_max=2, process_metrics=False))
    for i in range(10):
        m.on_publish(f"persistent://public/default/t{i}", 1, 10)
        m.set_backlog(f"persistent://public/default/t{i}", 1, 100)
    m.on_publish("persistent://other/ns/x", 1, 1)
    m.on_publish("persistent://third/ns/x", 1, 1)  # namespace slots exhausted
    series = {tuple(sorted(s.labels.items())) for metric in m.registry.collect()
              if metric.name == "pulsar_in_messages" for s in metric.samples if s.name.endswith("_total")}
    assert sorted((dict(s)["namespace"], dict(s)["topic"]) for s in series) == [
        ("__other__", "__other__"), ("other/ns", "__other__"), (NS, "__other__"),
        (NS, "persistent://public/default/t0"), (NS, "persistent://public/default/t1")]
    other = {"cluster": "standalone", "namespace": NS, "topic": "__other__"}
    assert sample(m, "pulsar_in_messages_total", other) == 8
    assert sample(m, "pulsar_msg_backlog", other) == 8
    assert sample(m, "pulsar_storage_backlog_size", other) == 800
    assert sample(m, "pulsar_in_messages_total", {"cluster": "standalone", "namespace": "__other__",
                                                  "topic": "__other__"}) == 1
    # forgetting a labelled topic removes its series and frees the slot for a new topic
    m.forget_topic("persistent://public/default/t0")
    assert sample(m, "pulsar_in_messages_total", {**other, "topic": "persistent://public/default/t0"}) is None
    m.on_publish("persistent://public/default/new", 4, 40)
    assert sample(m, "pulsar_in_messages_total", {**other, "topic": "persistent://public/default/new"}) == 4


def test_metrics_namespace_aggregation_mode():
    m = BrokerMetrics(MetricsConfig(topic_labels=False, process_metrics=False))
    m.on_publish("persistent://public/default/a", 1, 10)
    m.on_publish("persistent://public/default/b", 2, 20)
    assert sample(m, "pulsar_in_bytes_total", {"cluster": "standalone", "namespace": NS, "topic": "__all__"}) == 30


def test_metrics_cache_and_counts():
    m = BrokerMetrics(MetricsConfig(cluster="c1"))
    m.on_cache_hit(3)
    m.on_cache_miss()
    m.set_cache(4096, 4)
    m.set_counts(topics=2, producers=3, consumers=4, subscriptions=5)
    assert sample(m, "pulsarlite_entry_cache_hits_total", {"cluster": "c1"}) == 3
    assert sample(m, "pulsarlite_entry_cache_misses_total", {"cluster": "c1"}) == 1
    assert sample(m, "pulsarlite_entry_cache_size_bytes", {"cluster": "c1"}) == 4096
    assert sample(m, "pulsar_consumers_count", {"cluster": "c1"}) == 4


# -- policy validation (pure) --------------------------------------------------------------------
def test_policies_round_trip_in_pulsar_shape():
    raw = {"retention_policies": {"retentionTimeInMinutes": 60, "retentionSizeInMB": -1},
           "deduplicationEnabled": True, "message_ttl_in_seconds": 30,
           "backlog_quota_map": {"destination_storage": {"limitSize": 1000, "limitTime": -1,
                                                         "policy": "producer_exception"}},
           "offload_threshold": 1 << 30, "offload_threshold_in_seconds": 3600, "offload_deletion_lag_ms": 0,
           "rollover_policies": {"max_entries": 10, "max_bytes": None, "max_age_ms": 1000},
           "autoTopicCreationOverride": {"allowAutoTopicCreation": True, "topicType": "partitioned",
                                         "defaultNumPartitions": 4},
           "bundles": {"ignored": True}}
    p = NamespacePolicies.from_json(raw)
    assert p.retention == RetentionPolicy(60, -1)
    assert p.auto_topic_creation == AutoTopicCreation(True, "partitioned", 4)
    out = p.to_json()
    assert "bundles" not in out
    assert NamespacePolicies.from_json(out) == p
    assert NamespacePolicies().to_json()["offload_threshold"] == -1


@pytest.mark.parametrize("raw, error", [
    ({"retention_policies": {"retentionTimeInMinutes": 10, "retentionSizeInMB": 0}}, PreconditionFailedError),
    ({"retention_policies": {"retentionTimeInMinutes": -2, "retentionSizeInMB": 1}}, PreconditionFailedError),
    ({"retention_policies": {"retentionTimeInMinutes": "ten", "retentionSizeInMB": 1}}, BadRequestError),
    ({"retention_policies": [1, 2]}, BadRequestError),
    ({"message_ttl_in_seconds": -1}, PreconditionFailedError),
    ({"message_ttl_in_seconds": 1.5}, BadRequestError),
    ({"deduplicationEnabled": "yes"}, BadRequestError),
    ({"offload_threshold": -2}, PreconditionFailedError),
    ({"offload_deletion_lag_ms": -1}, PreconditionFailedError),
    ({"rollover_policies": {"max_entries": 0}}, PreconditionFailedError),
    ({"backlog_quota_map": {"nope": {}}}, PreconditionFailedError),
    ({"backlog_quota_map": {"destination_storage": {"policy": "drop_all"}}}, PreconditionFailedError),
    ({"autoTopicCreationOverride": {"allowAutoTopicCreation": True, "topicType": "partitioned"}},
     PreconditionFailedError),
    # [hardening] finding 6: one lookup would create 2^31 partitions
    ({"autoTopicCreationOverride": {"allowAutoTopicCreation": True, "topicType": "partitioned",
                                    "defaultNumPartitions": 2**31}}, PreconditionFailedError),
    ({"autoTopicCreationOverride": {"allowAutoTopicCreation": True, "topicType": "partitioned",
                                    "defaultNumPartitions": 4097}}, PreconditionFailedError),
    ({"replication_clusters": ["bad name"]}, BadRequestError),
    ([], BadRequestError),
])
def test_policies_validation(raw, error):
    with pytest.raises(error):
        NamespacePolicies.from_json(raw)


@pytest.mark.parametrize("raw", [
    {"serviceUrl": "javascript:alert(1)"}, {"serviceUrl": "h:8080"}, {"serviceUrlTls": "http://h:8443"},
    {"brokerServiceUrl": "pulsar://"}, {"brokerServiceUrl": "pulsar://h:1,,h2:2"},
    {"brokerServiceUrlTls": "pulsar://h:6651"}, {"serviceUrl": "http://<script>"},
])
def test_cluster_urls_must_have_their_scheme_and_a_host(raw):
    from broker.admin.policies import ClusterData
    with pytest.raises(BadRequestError):
        ClusterData.from_json(raw)


def test_cluster_urls_pulsar_accepts():
    from broker.admin.policies import ClusterData
    data = ClusterData.from_json({"serviceUrl": "http://h:8080", "serviceUrlTls": "https://h:8443",
                                  "brokerServiceUrl": "pulsar://h1:6650,h2:6650",
                                  "brokerServiceUrlTls": "pulsar+ssl://h:6651", "unknown": 1})
    assert data.broker_service_url == "pulsar://h1:6650,h2:6650" and not data.empty
    assert ClusterData.from_json({}).empty


def test_tenant_info_validation():
    assert TenantInfo.from_json({"adminRoles": ["a", "a"], "allowedClusters": ["c"]}).admin_roles == ("a",)
    with pytest.raises(BadRequestError):
        TenantInfo.from_json({"allowedClusters": "c"})


async def test_compaction_trigger_and_status(client, backend):
    """Pulsar's PUT/GET .../compaction: 204 and RUNNING, a second trigger while it runs is 409,
    SUCCESS or ERROR with lastError once done; 404 for a missing topic."""
    await expect_error(await client.put(f"{P}/t1/compaction"), 404)
    await expect_error(await client.get(f"{P}/t1/compaction"), 404)
    await client.put(f"{P}/t1")
    resp = await client.get(f"{P}/t1/compaction")
    assert resp.status == 200 and await resp.json() == {"status": "NOT_RUN", "lastError": ""}
    assert (await client.put(f"{P}/t1/compaction")).status == 204
    assert await (await client.get(f"{P}/t1/compaction")).json() == {"status": "RUNNING", "lastError": ""}
    reason = await expect_error(await client.put(f"{P}/t1/compaction"), 409)
    assert "already in progress" in reason
    backend.compaction.finish(T, "bookies gone")
    assert await (await client.get(f"{P}/t1/compaction")).json() == {"status": "ERROR", "lastError": "bookies gone"}
    assert (await client.put(f"{P}/t1/compaction")).status == 204
    backend.compaction.finish(T, None)
    assert await (await client.get(f"{P}/t1/compaction")).json() == {"status": "SUCCESS", "lastError": ""}
