"""The admin HTTP API and /metrics of a real broker (cluster launcher: ZooKeeper, 3 bookies, one
broker), driven with plain HTTP (urllib) and the official Python client. Sync tests: the
client's calls block. No timing assertions; every wait is bounded."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000
WAIT_S = 30


# -- fixtures and helpers -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(module_tmp_path):
    from faces.cluster import LocalCluster
    c = LocalCluster(module_tmp_path / "admin" / "cluster")
    try:
        c.start_processes(bookies=3, brokers=1)
        yield c
    finally:
        c.stop()



class Admin:
    def __init__(self, base: str) -> None:
        self.base = base

    def call(self, method: str, path: str, body=None, *, raw: bytes | None = None) -> tuple[int, object]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                status, text, ctype = resp.status, resp.read().decode(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            status, text, ctype = e.code, e.read().decode(), e.headers.get("Content-Type", "")
        if "json" in ctype and text:
            return status, json.loads(text)
        return status, text

    def ok(self, method: str, path: str, body=None):
        status, got = self.call(method, path, body)
        assert status in (200, 204), (method, path, status, got)
        return got

    def error(self, method: str, path: str, status: int, body=None, *, raw: bytes | None = None) -> str:
        got_status, got = self.call(method, path, body, raw=raw)
        assert got_status == status, (method, path, got_status, got)
        assert isinstance(got, dict) and isinstance(got.get("reason"), str) and got["reason"], got
        return got["reason"]


@pytest.fixture
def admin(cluster):
    assert cluster.admin_url
    return Admin(cluster.admin_url)


def topic_path(topic: str) -> str:
    return "/admin/v2/" + topic.replace("://", "/")


def wait_until(predicate, what: str, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


# -- clusters, tenants, namespaces, policies --------------------------------------------------------
def test_tenants_namespaces_and_policies(admin):
    assert "standalone" in admin.ok("GET", "/admin/v2/clusters")
    assert "public" in admin.ok("GET", "/admin/v2/tenants")
    assert "public/default" in admin.ok("GET", "/admin/v2/namespaces/public")

    admin.ok("PUT", "/admin/v2/tenants/acme", {"allowedClusters": ["standalone"], "adminRoles": ["ops"]})
    assert admin.ok("GET", "/admin/v2/tenants/acme") == {"adminRoles": ["ops"], "allowedClusters": ["standalone"]}
    admin.error("PUT", "/admin/v2/tenants/acme", 409, {"allowedClusters": ["standalone"]})
    admin.ok("PUT", "/admin/v2/namespaces/acme/orders")
    assert admin.ok("GET", "/admin/v2/namespaces/acme") == ["acme/orders"]

    admin.ok("POST", "/admin/v2/namespaces/acme/orders/retention",
             {"retentionTimeInMinutes": 60, "retentionSizeInMB": 100})
    assert admin.ok("GET", "/admin/v2/namespaces/acme/orders/retention") == {
        "retentionTimeInMinutes": 60, "retentionSizeInMB": 100}
    admin.ok("POST", "/admin/v2/namespaces/acme/orders/messageTTL", 3600)
    assert admin.ok("GET", "/admin/v2/namespaces/acme/orders/messageTTL") == 3600
    policies = admin.ok("GET", "/admin/v2/namespaces/acme/orders")
    assert policies["message_ttl_in_seconds"] == 3600 and policies["replication_clusters"] == ["standalone"]

    # a namespace with a topic cannot be deleted; without, it can; then the tenant
    admin.ok("PUT", "/admin/v2/persistent/acme/orders/t1")
    admin.error("DELETE", "/admin/v2/namespaces/acme/orders", 409)
    admin.error("DELETE", "/admin/v2/tenants/acme", 409)
    admin.ok("DELETE", "/admin/v2/persistent/acme/orders/t1")
    admin.ok("DELETE", "/admin/v2/namespaces/acme/orders")
    admin.ok("DELETE", "/admin/v2/tenants/acme")
    assert "acme" not in admin.ok("GET", "/admin/v2/tenants")


def test_auto_creation_needs_an_existing_namespace(client, admin):
    with pytest.raises(Exception):
        client.create_producer("persistent://public/no-such-ns/t", send_timeout_millis=5_000)
    admin.ok("PUT", "/admin/v2/namespaces/public/autocreate")
    admin.ok("POST", "/admin/v2/namespaces/public/autocreate/autoTopicCreation",
             {"allowAutoTopicCreation": False})
    with pytest.raises(Exception):
        client.create_producer("persistent://public/autocreate/t")
    admin.ok("PUT", "/admin/v2/persistent/public/autocreate/t")     # explicit creation still works
    producer = client.create_producer("persistent://public/autocreate/t")
    producer.send(b"x")
    producer.close()


# -- topics -----------------------------------------------------------------------------------------
def test_create_list_delete_topics(client, admin):
    topic = "persistent://public/default/admin-crud"
    base = "/admin/v2/persistent/public/default"
    admin.ok("PUT", topic_path(topic))
    assert topic in admin.ok("GET", base)
    admin.error("PUT", topic_path(topic), 409)
    assert admin.ok("GET", topic_path(topic) + "/partitions") == {"partitions": 0}

    producer = client.create_producer(topic)
    producer.send(b"hello")
    admin.error("DELETE", topic_path(topic), 412)       # a producer is connected
    producer.close()
    admin.ok("DELETE", topic_path(topic))
    assert topic not in admin.ok("GET", base)
    admin.error("DELETE", topic_path(topic), 404)
    admin.error("GET", topic_path(topic) + "/stats", 404)

    # force deletes under a connected consumer
    other = "persistent://public/default/admin-crud-force"
    consumer = client.subscribe(other, "s")
    admin.ok("DELETE", topic_path(other) + "?force=true")
    assert other not in admin.ok("GET", base)
    consumer.close()


def test_partitioned_topic(client, admin):
    topic = "persistent://public/default/admin-parted"
    admin.ok("PUT", topic_path(topic) + "/partitions", 3)
    admin.error("PUT", topic_path(topic) + "/partitions", 409, 3)
    admin.error("PUT", topic_path(topic), 409)
    assert admin.ok("GET", topic_path(topic) + "/partitions") == {"partitions": 3}
    assert topic in admin.ok("GET", "/admin/v2/persistent/public/default/partitioned")
    listed = admin.ok("GET", "/admin/v2/persistent/public/default")
    assert {f"{topic}-partition-{i}" for i in range(3)} <= set(listed)
    assert client.get_topic_partitions(topic) == [f"{topic}-partition-{i}" for i in range(3)]

    producer = client.create_producer(topic, message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
                                      batching_enabled=False)
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    for i in range(9):
        producer.send(f"p{i}".encode())
    got = sorted(consumer.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(9))
    assert got == sorted(f"p{i}".encode() for i in range(9))

    admin.error("POST", topic_path(topic) + "/partitions", 412, 2)     # cannot shrink
    admin.ok("POST", topic_path(topic) + "/partitions", 4)
    assert admin.ok("GET", topic_path(topic) + "/partitions") == {"partitions": 4}
    admin.error("DELETE", topic_path(topic) + "/partitions", 412)      # clients connected
    producer.close()
    consumer.close()
    admin.ok("DELETE", topic_path(topic) + "/partitions")
    assert admin.ok("GET", topic_path(topic) + "/partitions") == {"partitions": 0}
    assert not [t for t in admin.ok("GET", "/admin/v2/persistent/public/default") if t.startswith(topic)]


def test_stats_and_internal_stats(client, admin):
    topic = "persistent://public/default/admin-stats"
    consumer = client.subscribe(topic, "stats-sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    n = 25
    ids = [producer.send(f"m{i}".encode() * 10) for i in range(n)]

    stats = admin.ok("GET", topic_path(topic) + "/stats")
    for key in ("msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut", "storageSize", "backlogSize"):
        assert key in stats, key
    assert stats["storageSize"] > 0
    assert stats["msgInCounter"] == n
    assert len(stats["publishers"]) == 1
    publisher = stats["publishers"][0]
    assert "msgRateIn" in publisher and "msgThroughputIn" in publisher and publisher["producerName"]
    sub = stats["subscriptions"]["stats-sub"]
    assert sub["type"] == "Exclusive" and len(sub["consumers"]) == 1
    assert sub["msgBacklog"] == n

    internal = admin.ok("GET", topic_path(topic) + "/internalStats")
    assert sum(ledger["entries"] for ledger in internal["ledgers"]) == n
    assert internal["numberOfEntries"] == n and internal["totalSize"] == stats["storageSize"]
    assert all(ledger["offloaded"] is False for ledger in internal["ledgers"])
    last = ids[-1]
    assert internal["lastConfirmedEntry"] == f"{last.ledger_id()}:{last.entry_id()}"
    assert internal["state"] == "LedgerOpened"

    for _ in range(n):
        consumer.acknowledge(consumer.receive(timeout_millis=TIMEOUT_MS))
    wait_until(lambda: admin.ok("GET", topic_path(topic) + "/internalStats")["cursors"]["stats-sub"]
               ["markDeletePosition"] == f"{last.ledger_id()}:{last.entry_id()}", "the cursor to advance")
    wait_until(lambda: admin.ok("GET", topic_path(topic) + "/stats")["subscriptions"]["stats-sub"]["msgBacklog"] == 0,
               "the backlog to drain")
    mid = admin.ok("GET", topic_path(topic) + "/lastMessageId")
    assert (mid["ledgerId"], mid["entryId"]) == (last.ledger_id(), last.entry_id())
    producer.close()
    consumer.close()


def test_subscriptions_create_list_delete(client, admin):
    topic = "persistent://public/default/admin-subs"
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(5):
        producer.send(f"before-{i}".encode())
    admin.ok("PUT", topic_path(topic) + "/subscription/from-start", {"ledgerId": -1, "entryId": -1})
    admin.ok("PUT", topic_path(topic) + "/subscription/from-now")
    admin.error("PUT", topic_path(topic) + "/subscription/from-now", 409)
    assert admin.ok("GET", topic_path(topic) + "/subscriptions") == ["from-now", "from-start"]
    internal = admin.ok("GET", topic_path(topic) + "/internalStats")
    assert set(internal["cursors"]) == {"from-now", "from-start"}
    producer.send(b"after")

    early = client.subscribe(topic, "from-start")
    assert [early.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(6)] == \
        [f"before-{i}".encode() for i in range(5)] + [b"after"]
    late = client.subscribe(topic, "from-now")
    assert late.receive(timeout_millis=TIMEOUT_MS).data() == b"after"

    admin.error("DELETE", topic_path(topic) + "/subscription/from-now", 412)    # consumer connected
    late.close()
    admin.ok("DELETE", topic_path(topic) + "/subscription/from-now")
    admin.ok("DELETE", topic_path(topic) + "/subscription/from-start?force=true")
    assert admin.ok("GET", topic_path(topic) + "/subscriptions") == []
    admin.error("DELETE", topic_path(topic) + "/subscription/from-now", 404)
    admin.error("GET", "/admin/v2/persistent/public/default/no-such-topic/subscriptions", 404)
    producer.close()
    early.close()


def test_reset_cursor_by_time(client, admin):
    topic = "persistent://public/default/admin-reset"
    consumer = client.subscribe(topic, "r", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(10):
        producer.send(f"old-{i}".encode())
    old = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(10)]
    boundary = max(m.publish_timestamp() for m in old) + 1
    time.sleep(0.02)         # publish times are in ms: the next messages are later than boundary
    for i in range(10):
        producer.send(f"new-{i}".encode())
    new = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(10)]
    assert all(m.publish_timestamp() >= boundary for m in new)
    for m in old + new:
        consumer.acknowledge(m)

    admin.ok("POST", topic_path(topic) + f"/subscription/r/resetcursor/{boundary}")
    # the consumer is disconnected, reconnects and gets everything from the boundary on again
    again = [consumer.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(10)]
    assert again == [f"new-{i}".encode() for i in range(10)]
    admin.error("POST", topic_path(topic) + "/subscription/nope/resetcursor/0", 404)
    producer.close()
    consumer.close()


def test_skip_and_clear_backlog(client, admin):
    """pulsar-admin's skip / clear-backlog: skipped messages count one by one inside batches,
    messages acked out of order are not counted again, a consumer attached at the time gets
    what was not skipped, and a subscription with no consumer (its cursor not loaded) skips too."""
    topic = "persistent://public/default/admin-skip"
    sub_path = topic_path(topic) + "/subscription"
    consumer = client.subscribe(topic, "live", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    admin.ok("PUT", sub_path + "/idle", {"entryId": -1, "ledgerId": -1})   # created at the earliest
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                                      batching_max_publish_delay_ms=60_000)
    for i in range(30):                     # 3 batches of 10 (flushed when full)
        producer.send_async(f"b{i}".encode(), None)
    producer.flush()
    plain = client.create_producer(topic, batching_enabled=False)
    for i in range(5):
        plain.send(f"p{i}".encode())
    got = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(35)]
    assert [m.data() for m in got] == [f"b{i}".encode() for i in range(30)] + [f"p{i}".encode() for i in range(5)]
    consumer.acknowledge(got[31])            # p1 acked out of order: a hole the skip steps over

    def backlog(name):      # entries, as Pulsar's msgBacklog (a partly acked batch counts)
        return admin.ok("GET", topic_path(topic) + "/stats")["subscriptions"][name]["msgBacklog"]

    wait_until(lambda: backlog("live") == 7, "the out-of-order ack to reach the broker (8 entries - p1)")
    # 13 = the first batch whole + 3 of the second (batch indexes acked one by one)
    admin.ok("POST", sub_path + "/live/skip/13")
    assert backlog("live") == 6              # batches 2 (partly acked) and 3, p0, p2, p3, p4
    # the consumer was disconnected and gets the rest again: b13..b29 and the single entries but p1
    rest = []
    while len(rest) < 21:
        rest.append(consumer.receive(timeout_millis=TIMEOUT_MS))
    assert sorted(m.data() for m in rest) == sorted([f"b{i}".encode() for i in range(13, 30)]
                                                   + [b"p0", b"p2", b"p3", b"p4"])
    # skip more than is left: everything goes, nothing more is skipped
    admin.ok("POST", sub_path + "/live/skip/1000")
    wait_until(lambda: backlog("live") == 0, "the live backlog to be empty")

    # the idle subscription has no consumer here: its cursor is updated all the same
    admin.ok("POST", sub_path + "/idle/skip/30")
    wait_until(lambda: backlog("idle") == 5, "the idle subscription to have skipped 3 batches")
    admin.ok("POST", topic_path(topic) + "/clearBacklog")
    wait_until(lambda: backlog("idle") == 0, "clearBacklog to empty the idle subscription")
    plain.send(b"after")
    late = consumer.receive(timeout_millis=TIMEOUT_MS)
    assert late.data() == b"after"          # only what came after the skip
    consumer.acknowledge(late)
    assert backlog("idle") == 1

    admin.ok("POST", sub_path + "/idle/skip_all")
    assert backlog("idle") == 0
    admin.error("POST", sub_path + "/nope/skip/1", 404)
    admin.error("POST", sub_path + "/idle/skip/many", 400)
    admin.error("POST", sub_path + "/idle/skip/-1", 412)
    admin.error("POST", "/admin/v2/persistent/public/default/no-such-topic/clearBacklog", 404)
    producer.close()
    plain.close()
    consumer.close()


def test_unload_keeps_acknowledged_messages(client, admin):
    topic = "persistent://public/default/admin-unload"
    consumer = client.subscribe(topic, "u", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    sent = set()
    for i in range(50):
        producer.send(f"m{i}".encode())
        sent.add(f"m{i}".encode())
    received = set()
    acked_before = set()
    last = None
    for _ in range(25):
        m = consumer.receive(timeout_millis=TIMEOUT_MS)
        received.add(m.data())
        acked_before.add(m.data())
        consumer.acknowledge(m)
        last = m.message_id()
    assert acked_before == {f"m{i}".encode() for i in range(25)}
    # the acks reached the broker (the client groups them): the cursor is at the 25th message
    before = wait_until(lambda: (lambda s: s if s["cursors"]["u"]["markDeletePosition"] ==
                                 f"{last.ledger_id()}:{last.entry_id()}" else None)(
        admin.ok("GET", topic_path(topic) + "/internalStats")), "the acks to arrive")

    results: list = []
    for i in range(100, 300):        # in flight while the topic unloads: all must be persisted
        producer.send_async(f"m{i}".encode(), lambda res, _mid: results.append(res))
        sent.add(f"m{i}".encode())
    admin.ok("PUT", topic_path(topic) + "/unload")
    producer.flush()
    wait_until(lambda: len(results) == 200, "the async sends to complete")
    assert all(r == pulsar.Result.Ok for r in results), set(results)
    redelivered = []

    for i in range(50, 100):          # the producer reconnects (through a lookup) and goes on
        producer.send(f"m{i}".encode())
        sent.add(f"m{i}".encode())
    deadline = time.monotonic() + WAIT_S
    while received != sent and time.monotonic() < deadline:
        try:
            m = consumer.receive(timeout_millis=1_000)
        except Exception:
            continue
        received.add(m.data())
        redelivered.append(m.data())
        consumer.acknowledge(m)
    assert received == sent
    # the cursor was flushed when the topic closed: nothing acknowledged comes back
    assert not acked_before & set(redelivered)
    after = admin.ok("GET", topic_path(topic) + "/internalStats")
    # the topic was closed and reopened: its first ledger is closed, a new one was started
    assert len(after["ledgers"]) > len(before["ledgers"])
    assert sum(ledger["entries"] for ledger in after["ledgers"]) >= 300    # resends may duplicate
    stats = admin.ok("GET", topic_path(topic) + "/stats")
    assert len(stats["publishers"]) == 1 and len(stats["subscriptions"]["u"]["consumers"]) == 1
    producer.close()
    consumer.close()
    admin.error("PUT", "/admin/v2/persistent/public/default/never-created/unload", 404)


def test_lookup(cluster, admin):
    got = admin.ok("GET", "/lookup/v2/topic/persistent/public/default/admin-lookup")
    assert got == {"brokerUrl": cluster.service_url, "httpUrl": cluster.admin_url,
                   "nativeUrl": cluster.service_url, "brokerUrlSsl": ""}     # Pulsar's LookupData
    admin.error("GET", "/lookup/v2/topic/persistent/nope/ns/t", 404)


def test_metrics(client, admin):
    from prometheus_client.parser import text_string_to_metric_families

    topic = "persistent://public/default/admin-metrics"
    consumer = client.subscribe(topic, "m", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                                      batching_max_publish_delay_ms=5)
    for i in range(30):
        producer.send_async(f"x{i}".encode(), None)
    producer.flush()
    for _ in range(30):
        consumer.acknowledge(consumer.receive(timeout_millis=TIMEOUT_MS))

    def samples() -> dict:
        status, text = admin.call("GET", "/metrics")
        assert status == 200
        out: dict = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.labels.get("topic") in (topic, None):
                    out[s.name] = out.get(s.name, 0) + s.value
        return out

    got = wait_until(lambda: (lambda s: s if s.get("pulsar_out_messages_total", 0) >= 30 else None)(samples()),
                     "dispatch counters")
    assert got["pulsar_in_messages_total"] == 30
    assert got["pulsar_in_bytes_total"] > 0
    assert got["pulsarlite_publish_latency_seconds_count"] > 0
    assert got["pulsarlite_entry_cache_hits_total"] > 0
    assert "pulsarlite_bookie_client_errors_total" not in got or got["pulsarlite_bookie_client_errors_total"] == 0
    assert got["pulsar_producers_count"] >= 1
    producer.close()
    consumer.close()


def test_bad_input_gives_json_errors(admin):
    reason = admin.error("PUT", "/admin/v2/tenants/bad-json", 400, raw=b"{not json")
    assert "JSON" in reason
    assert "does not exist" in admin.error("GET", "/admin/v2/namespaces/no-such-tenant", 404)
    admin.error("PUT", "/admin/v2/namespaces/no-such-tenant/ns", 404)
    admin.error("PUT", "/admin/v2/persistent/public/no-such-ns/t", 404)
    admin.error("GET", "/admin/v2/persistent/public/no-such-ns", 404)
    admin.error("PUT", "/admin/v2/persistent/public/default/bad%20name", 400)
    admin.error("PUT", "/admin/v2/persistent/public/default/t/partitions", 400, raw=b"[")
    admin.error("PUT", "/admin/v2/persistent/public/default/t-ok/partitions", 412, 0)
    admin.error("POST", "/admin/v2/persistent/public/default/t/subscription/s/resetcursor/yesterday", 400)
    admin.error("GET", "/admin/v2/no/such/route", 404)
