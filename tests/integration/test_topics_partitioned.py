"""Partitioned topics, pattern (regex) subscriptions and multi-topic consumers with the official
Python client against real broker and bookie processes (two brokers: partitions spread over
both by bundle hash)."""

from __future__ import annotations

import re
import time

import pytest
import requests

from tests.integration.helpers import wait_for

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 20_000
NS = "public/default"


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory(3, brokers=2)



def admin_urls(cluster) -> list[str]:
    return [f"http://127.0.0.1:{cluster.records[n].ports['http']}" for n in cluster.broker_names]


def topic_url(admin: str, local: str) -> str:
    return f"{admin}/admin/v2/persistent/{NS}/{local}"


def receive_n(consumer, n: int) -> list:
    return [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(n)]


def test_partitioned_topic_lifecycle_spread_and_stats(cluster, client):
    admin = admin_urls(cluster)[0]
    url = topic_url(admin, "pt")
    r = requests.put(url + "/partitions", json=4, timeout=30)
    assert r.status_code == 204, r.text
    assert requests.get(url + "/partitions", timeout=30).json() == {"partitions": 4}
    # shrinking or equal is refused; a second create conflicts; a bad count is refused
    assert requests.post(url + "/partitions", json=4, timeout=30).status_code == 412
    assert requests.put(url + "/partitions", json=4, timeout=30).status_code == 409
    assert requests.put(topic_url(admin, "pt-bad") + "/partitions", data="x", timeout=30).status_code == 400
    listed = requests.get(f"{admin}/admin/v2/persistent/{NS}/partitioned", timeout=30).json()
    assert f"persistent://{NS}/pt" in listed

    # place the partitions one at a time (a lookup, then the authoritative lookup at the broker
    # it names, which takes the bundle): each bundle goes to the least loaded broker. (The
    # client's own lookups of all partitions run concurrently and may all see the same loads.)
    for i in range(4):
        path = f"/lookup/v2/topic/persistent/{NS}/pt-partition-{i}"
        chosen = requests.get(admin + path, timeout=30).json()["httpUrl"].rstrip("/")
        r = requests.get(chosen + path, params={"authoritative": "true"}, timeout=30)
        assert r.status_code == 200 and r.json()["httpUrl"].rstrip("/") == chosen, r.text

    topic = f"persistent://{NS}/pt"
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False,
                                      message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    n = 40
    for i in range(n):
        producer.send(f"m{i}".encode(), partition_key=f"k{i}")
    got = receive_n(consumer, n)
    assert sorted(m.data() for m in got) == sorted(f"m{i}".encode() for i in range(n))
    partitions_seen = {m.topic_name() for m in got}
    assert len(partitions_seen) >= 2, partitions_seen
    assert all(re.fullmatch(rf"persistent://{NS}/pt-partition-[0-3]", t) for t in partitions_seen)
    for m in got:
        consumer.acknowledge(m)

    # the partitions are owned by both brokers (ownership is by bundle hash over 4 bundles)
    owners = set()
    for i in range(4):
        lookup = requests.get(f"{admin}/lookup/v2/topic/persistent/{NS}/pt-partition-{i}", timeout=30).json()
        owners.add(lookup["brokerUrl"])
    assert len(owners) == 2, owners

    # aggregated stats: every partition's counters summed, per-partition stats included
    def stats_complete():
        s = requests.get(url + "/partitioned-stats?perPartition=true", timeout=30)
        assert s.status_code == 200, s.text
        body = s.json()
        return body if body["msgInCounter"] == n else None

    stats = wait_for(stats_complete, 30, "partitioned stats summing every partition")
    assert stats["metadata"] == {"partitions": 4}
    assert set(stats["partitions"]) == {f"persistent://{NS}/pt-partition-{i}" for i in range(4)}
    assert sum(p["msgInCounter"] for p in stats["partitions"].values()) == n
    assert "sub" in stats["subscriptions"]

    # grow to 6: the client picks the new partitions up (it polls the metadata)
    assert requests.post(url + "/partitions", json=6, timeout=30).status_code == 204
    assert requests.get(url + "/partitions", timeout=30).json() == {"partitions": 6}
    listed = requests.get(f"{admin}/admin/v2/persistent/{NS}", timeout=30).json()
    assert {f"persistent://{NS}/pt-partition-{i}" for i in range(6)} <= set(listed)
    producer.close()
    consumer.close()
    # new clients use every partition, the new ones included
    consumer = client.subscribe(topic, "sub2", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False,
                                      message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(24):
        producer.send(f"g{i}".encode())
    got = receive_n(consumer, 24)
    assert sorted(m.data() for m in got) == sorted(f"g{i}".encode() for i in range(24))
    seen = {m.topic_name() for m in got}
    assert seen & {f"persistent://{NS}/pt-partition-4", f"persistent://{NS}/pt-partition-5"}, seen
    for m in got:
        consumer.acknowledge(m)
    producer.close()
    consumer.close()

    # delete: partitions and metadata gone
    r = requests.delete(url + "/partitions?force=true", timeout=60)
    assert r.status_code == 204, r.text
    assert requests.get(url + "/partitions", timeout=30).json() == {"partitions": 0}
    listed = requests.get(f"{admin}/admin/v2/persistent/{NS}", timeout=30).json()
    assert not [t for t in listed if "/pt-partition-" in t]


def test_partitioned_metadata_over_binary_protocol(client, cluster):
    admin = admin_urls(cluster)[0]
    assert requests.put(topic_url(admin, "meta") + "/partitions", json=3, timeout=30).status_code == 204
    assert client.get_topic_partitions(f"persistent://{NS}/meta") == [
        f"persistent://{NS}/meta-partition-{i}" for i in range(3)]
    assert client.get_topic_partitions(f"persistent://{NS}/not-partitioned") == [
        f"persistent://{NS}/not-partitioned"]


def test_multi_topic_consumer(client):
    topics = [f"persistent://{NS}/multi-{i}" for i in range(3)]
    consumer = client.subscribe(topics, "multi", initial_position=pulsar.InitialPosition.Earliest)
    for i, t in enumerate(topics):
        p = client.create_producer(t, batching_enabled=False)
        for j in range(5):
            p.send(f"{i}-{j}".encode())
        p.close()
    got = receive_n(consumer, 15)
    assert sorted(m.data() for m in got) == sorted(f"{i}-{j}".encode() for i in range(3) for j in range(5))
    assert {m.topic_name() for m in got} == set(topics)
    for m in got:
        consumer.acknowledge(m)
    with pytest.raises(Exception, match="(?i)timeout"):
        consumer.receive(timeout_millis=1_000)
    consumer.close()


def test_regex_subscription_picks_up_new_topics(client, cluster):
    for name in ("rx-a", "other-x"):
        p = client.create_producer(f"persistent://{NS}/{name}", batching_enabled=False)
        p.send(b"before-" + name.encode())
        p.close()
    consumer = client.subscribe(re.compile(f"persistent://{NS}/rx-.*"), "rx-sub",
                                initial_position=pulsar.InitialPosition.Earliest)
    first = consumer.receive(timeout_millis=TIMEOUT_MS)
    assert first.data() == b"before-rx-a"
    consumer.acknowledge(first)
    consumer.close()

    # a topic created later that matches is found by the client's re-poll of
    # GET_TOPICS_OF_NAMESPACE. The official Python client (3.13) type-checks
    # pattern_auto_discovery_period but never applies it (always 60 s), so pulsarlite's client,
    # which honours it, plays the re-polling client here
    import pulsarlite
    ours = pulsarlite.Client(cluster.service_url)
    try:
        watcher = ours.subscribe(re.compile(f"persistent://{NS}/rx-.*"), "rx-watch",
                                 initial_position=pulsarlite.InitialPosition.Earliest,
                                 pattern_auto_discovery_period=1)
        assert watcher.receive(timeout_millis=TIMEOUT_MS).data() == b"before-rx-a"
        late = client.create_producer(f"persistent://{NS}/rx-late", batching_enabled=False)
        deadline = time.monotonic() + 60
        got = None
        while got is None and time.monotonic() < deadline:
            late.send(b"late")
            try:
                got = watcher.receive(timeout_millis=2_000)
            except pulsarlite.Timeout:
                continue
        assert got is not None and got.data() == b"late"
        assert got.topic_name() == f"persistent://{NS}/rx-late"
        # the non-matching topic's message never arrives
        while True:
            try:
                m = watcher.receive(timeout_millis=2_000)
            except pulsarlite.Timeout:
                break
            assert m.data() == b"late"      # re-sends while polling for discovery
        late.close()
        watcher.close()
    finally:
        ours.close()


def test_admin_call_on_non_owner_is_redirected_to_the_owner(cluster, client):
    urls = admin_urls(cluster)
    local = "redirected"
    topic = f"persistent://{NS}/{local}"
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(5):
        producer.send(f"r{i}".encode())
    owner_http = requests.get(f"{urls[0]}/lookup/v2/topic/persistent/{NS}/{local}", timeout=30).json()["httpUrl"]
    other = next(u for u in urls if u.rstrip("/") != owner_http.rstrip("/"))
    r = requests.get(topic_url(other, local) + "/stats", allow_redirects=False, timeout=30)
    assert r.status_code == 307, r.text
    location = r.headers["Location"]
    assert location.startswith(owner_http.rstrip("/") + f"/admin/v2/persistent/{NS}/{local}/stats")
    assert "authoritative=true" in location
    # followed: the owner's live stats (its producer and counters)
    r = requests.get(topic_url(other, local) + "/stats", timeout=30)
    assert r.status_code == 200 and r.json()["msgInCounter"] == 5, r.text
    assert len(r.json()["publishers"]) == 1
    # a write is redirected too (requests repeats the method on 307)
    r = requests.put(topic_url(other, local) + "/subscription/made-elsewhere", json={"ledgerId": -1, "entryId": -1},
                     timeout=30)
    assert r.status_code == 204, r.text
    assert "made-elsewhere" in requests.get(topic_url(owner_http, local) + "/subscriptions", timeout=30).json()
    # the owner itself answers without a redirect
    r = requests.get(topic_url(owner_http, local) + "/internalStats", allow_redirects=False, timeout=30)
    assert r.status_code == 200
    producer.close()


def test_regex_subscription_modes(client):
    """GET_TOPICS_OF_NAMESPACE honours the mode: only persistent topics exist here, so
    NonPersistentOnly matches nothing and AllTopics the persistent ones."""
    p = client.create_producer(f"persistent://{NS}/mode-a", batching_enabled=False)
    p.send(b"a")
    p.close()
    for mode, expected in ((pulsar.RegexSubscriptionMode.AllTopics, b"a"),
                           (pulsar.RegexSubscriptionMode.NonPersistentOnly, None)):
        consumer = client.subscribe(re.compile(f"persistent://{NS}/mode-.*"), f"mode-{mode}",
                                    initial_position=pulsar.InitialPosition.Earliest,
                                    regex_subscription_mode=mode)
        if expected is None:
            with pytest.raises(Exception, match="(?i)timeout"):
                consumer.receive(timeout_millis=2_000)
        else:
            assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == expected
        consumer.close()


def test_partitioned_auto_creation_by_namespace_policy(cluster, client):
    admin = admin_urls(cluster)[0]
    r = requests.post(f"{admin}/admin/v2/namespaces/{NS}/autoTopicCreation",
                      json={"allowAutoTopicCreation": True, "topicType": "partitioned", "defaultNumPartitions": 3},
                      timeout=30)
    assert r.status_code == 204, r.text
    topic = f"persistent://{NS}/auto-part"
    producer = client.create_producer(topic, batching_enabled=False,
                                      message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    assert requests.get(topic_url(admin, "auto-part") + "/partitions", timeout=30).json() == {"partitions": 3}
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    for i in range(9):
        producer.send(f"a{i}".encode())
    got = receive_n(consumer, 9)
    assert {m.topic_name() for m in got} == {f"{topic}-partition-{i}" for i in range(3)}
    producer.close()
    consumer.close()


def test_unload_partitioned_topic_unloads_partitions_on_every_broker(cluster, client):
    urls = admin_urls(cluster)
    admin = urls[0]
    assert requests.put(topic_url(admin, "unl") + "/partitions", json=4, timeout=30).status_code == 204
    for i in range(4):                      # placed one at a time: over both brokers
        path = f"/lookup/v2/topic/persistent/{NS}/unl-partition-{i}"
        chosen = requests.get(admin + path, timeout=30).json()["httpUrl"].rstrip("/")
        requests.get(chosen + path, params={"authoritative": "true"}, timeout=30)
    producer = client.create_producer(f"persistent://{NS}/unl", batching_enabled=False,
                                      message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(8):
        producer.send(f"u{i}".encode())
    producer.close()

    def states():
        return [requests.get(topic_url(admin, f"unl-partition-{i}") + "/internalStats", timeout=30).json()["state"]
                for i in range(4)]

    assert states() == ["LedgerOpened"] * 4
    owners = {requests.get(f"{admin}/lookup/v2/topic/persistent/{NS}/unl-partition-{i}", timeout=30).json()["httpUrl"]
              for i in range(4)}
    assert len(owners) == 2, owners
    r = requests.put(topic_url(admin, "unl") + "/unload", timeout=60)
    assert r.status_code == 204, r.text
    assert states() == ["Closed"] * 4


def test_delete_partitioned_topic_without_force_checks_every_broker_first(cluster, client):
    admin = admin_urls(cluster)[0]
    url = topic_url(admin, "busy")
    assert requests.put(url + "/partitions", json=4, timeout=30).status_code == 204
    for i in range(4):                      # placed one at a time: over both brokers
        path = f"/lookup/v2/topic/persistent/{NS}/busy-partition-{i}"
        chosen = requests.get(admin + path, timeout=30).json()["httpUrl"].rstrip("/")
        requests.get(chosen + path, params={"authoritative": "true"}, timeout=30)
    owners = {requests.get(f"{admin}/lookup/v2/topic/persistent/{NS}/busy-partition-{i}", timeout=30).json()["httpUrl"]
              for i in range(4)}
    assert len(owners) == 2
    # a consumer on every partition: the partitions on the other broker refuse too
    consumer = client.subscribe(f"persistent://{NS}/busy", "s")
    r = requests.delete(url + "/partitions", timeout=60)
    assert r.status_code == 412, r.text
    listed = requests.get(f"{admin}/admin/v2/persistent/{NS}", timeout=30).json()
    assert {f"persistent://{NS}/busy-partition-{i}" for i in range(4)} <= set(listed)   # nothing deleted
    consumer.close()
    # a consumer only on a partition served by the other broker
    other = next(i for i in range(4)
                 if requests.get(f"{admin}/lookup/v2/topic/persistent/{NS}/busy-partition-{i}",
                                 timeout=30).json()["httpUrl"].rstrip("/") != admin)
    consumer = client.subscribe(f"persistent://{NS}/busy-partition-{other}", "s")
    r = requests.delete(url + "/partitions", timeout=60)
    assert r.status_code == 412, r.text
    listed = requests.get(f"{admin}/admin/v2/persistent/{NS}", timeout=30).json()
    assert {f"persistent://{NS}/busy-partition-{i}" for i in range(4)} <= set(listed)
    consumer.close()
    r = requests.delete(url + "/partitions", timeout=60)
    assert r.status_code == 204, r.text
    assert requests.get(url + "/partitions", timeout=30).json() == {"partitions": 0}
