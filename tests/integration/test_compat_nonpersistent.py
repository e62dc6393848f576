"""[compat] issue 32 item 7: non-persistent topics (``non-persistent://``), with the official Python
client (pulsar-client 3.x) and our own against real ZooKeeper, bookie and broker processes.

Pulsar's behaviour is the reference (NonPersistentTopic, NonPersistentDispatcher*): a message
goes at once to the consumers connected now and is never stored; the receipt's id is ``0:0``; a
consumer without permits loses the message (counted in the stats' ``msgDropRate``); the topics
are listed by CommandGetTopicsOfNamespace / ``GET .../namespaces/{t}/{ns}/topics`` by mode, so a
regex subscription with ``AllTopics`` covers both kinds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.integration.helpers import wait_for

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000
NS = "public/default"


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    return module_cluster_factory(3, brokers=1)


def receive_until_idle(consumer, idle_ms: int = 1_000) -> list[bytes]:
    """The payloads the consumer receives until none comes for ``idle_ms``."""
    received = []
    while True:
        try:
            received.append(consumer.receive(timeout_millis=idle_ms).data())
        except Exception:
            return received


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def _put_json(url: str, body) -> None:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30):
        pass


def assert_nothing_more(consumer) -> None:
    with pytest.raises(Exception, match="(?i)timeout"):
        consumer.receive(timeout_millis=1_000)


def stats(cluster, topic: str) -> dict:
    local = topic.split("://", 1)[1]
    return _get_json(f"{cluster.admin_url}/admin/v2/non-persistent/{local}/stats")


# -- produce / consume ---------------------------------------------------------------------------
def test_each_subscription_type_gets_what_is_sent_while_connected(client):
    """Exclusive and Failover: the (active) consumer gets every message, in order; Shared: the
    two consumers together get each message once; Key_Shared: each key goes to one consumer.
    Receipts carry Pulsar's id for a non-persistent message, ledger 0 entry 0."""
    for kind in ("Exclusive", "Failover", "Shared", "Key_Shared"):
        topic = f"non-persistent://{NS}/types-{kind.lower()}"
        consumer_type = getattr(pulsar.ConsumerType, kind.replace("_", ""))
        consumers = [client.subscribe(topic, "sub", consumer_type=consumer_type, consumer_name="c0")]
        if kind != "Exclusive":
            consumers.append(client.subscribe(topic, "sub", consumer_type=consumer_type, consumer_name="c1"))
        producer = client.create_producer(topic, batching_enabled=False)
        sent = []
        for i in range(20):
            payload = f"{kind}-{i}".encode()
            mid = producer.send(payload, partition_key=f"k{i % 4}")
            assert (mid.ledger_id(), mid.entry_id()) == (0, 0), kind
            sent.append(payload)
        got: dict[str, list[bytes]] = {}
        keys: dict[str, set[str]] = {}
        idle_rounds = 0
        while sum(len(v) for v in got.values()) < len(sent) and idle_rounds < 3:
            progressed = False
            for c in consumers:
                try:
                    msg = c.receive(timeout_millis=1_000)
                except Exception:
                    continue
                got.setdefault(c.consumer_name(), []).append(msg.data())
                keys.setdefault(c.consumer_name(), set()).add(msg.partition_key())
                progressed = True
            idle_rounds = 0 if progressed else idle_rounds + 1
        everything = sorted(p for v in got.values() for p in v)
        assert everything == sorted(sent), kind
        if kind in ("Exclusive", "Failover"):
            assert len(got) == 1, f"{kind}: one consumer receives, got {list(got)}"
            assert next(iter(got.values())) == sent, f"{kind}: in order"
        if kind == "Key_Shared" and len(keys) == 2:
            assert not (keys["c0"] & keys["c1"]), "a key goes to one consumer"
        for c in consumers:
            c.close()
        producer.close()


def test_a_consumer_connected_after_the_send_gets_nothing(client):
    topic = f"non-persistent://{NS}/late-consumer"
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(5):
        producer.send(f"early-{i}".encode())
    consumer = client.subscribe(topic, "late", initial_position=pulsar.InitialPosition.Earliest)
    assert_nothing_more(consumer)
    producer.send(b"now")
    assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"now"
    assert_nothing_more(consumer)
    consumer.close()
    producer.close()


def test_a_consumer_without_permits_loses_messages_counted_as_dropped(cluster, client):
    """Pulsar's NonPersistentDispatcherSingleActiveConsumer: an entry for a consumer with no
    permit left is dropped and counted (msgDropRate). A consumer with a receiver queue of 10 that
    receives nothing grants 10 permits: of 200 messages, 10 are delivered, 190 dropped."""
    topic = f"non-persistent://{NS}/slow-consumer"
    consumer = client.subscribe(topic, "slow", receiver_queue_size=10)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(200):
        producer.send(f"m{i}".encode())
    s = stats(cluster, topic)
    sub = s["subscriptions"]["slow"]
    assert s["msgInCounter"] == 200
    assert s["msgOutCounter"] + s["msgDropCounter"] == 200
    assert sub["msgDropCounter"] == s["msgDropCounter"] > 0
    received = receive_until_idle(consumer)
    assert len(received) == s["msgOutCounter"]
    assert received == [f"m{i}".encode() for i in range(len(received))]
    # the rate is sampled at the broker's stats interval: it shows once a sample saw the drops
    wait_for(lambda: stats(cluster, topic)["subscriptions"]["slow"]["msgDropRate"] > 0
             or stats(cluster, topic)["msgDropRate"] > 0, 30, "msgDropRate reported")
    consumer.close()
    producer.close()


# -- listing, regex subscriptions, admin ---------------------------------------------------------
def test_regex_subscription_sees_both_kinds(client):
    """The official client's regex subscription lists the namespace's topics with its mode
    (CommandGetTopicsOfNamespace): AllTopics covers persistent and non-persistent topics,
    PersistentOnly (the default) the persistent ones only."""
    p_topic = f"persistent://{NS}/mix-p"
    np_topic = f"non-persistent://{NS}/mix-np"
    p_producer = client.create_producer(p_topic, batching_enabled=False)
    np_producer = client.create_producer(np_topic, batching_enabled=False)     # the topic exists now
    both = client.subscribe(re.compile(f"persistent://{NS}/mix-.*"), "regex-all",
                            regex_subscription_mode=pulsar.RegexSubscriptionMode.AllTopics)
    persistent_only = client.subscribe(re.compile(f"persistent://{NS}/mix-.*"), "regex-p")
    p_producer.send(b"to-persistent")
    np_producer.send(b"to-non-persistent")
    got = sorted(both.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(2))
    assert got == [b"to-non-persistent", b"to-persistent"]
    assert persistent_only.receive(timeout_millis=TIMEOUT_MS).data() == b"to-persistent"
    assert_nothing_more(persistent_only)
    for handle in (both, persistent_only, p_producer, np_producer):
        handle.close()


def test_our_client_produces_consumes_and_subscribes_by_regex(cluster):
    from pulsarlite.client import Client, RegexSubscriptionMode
    ours = Client(cluster.service_url)
    try:
        np_topic = f"non-persistent://{NS}/ours-np"
        consumer = ours.subscribe(np_topic, "ours")
        producer = ours.create_producer(np_topic)
        producer.send(b"hello")
        assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"hello"
        regex = ours.subscribe(re.compile(f"persistent://{NS}/ours-.*"), "ours-regex",
                               regex_subscription_mode=RegexSubscriptionMode.NonPersistentOnly)
        producer.send(b"again")
        assert regex.receive(timeout_millis=TIMEOUT_MS).data() == b"again"
        assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"again"
    finally:
        ours.close()


def test_admin_listing_and_stats(cluster, client):
    topic = f"non-persistent://{NS}/admin-np"
    producer = client.create_producer(topic, batching_enabled=False, producer_name="np-producer")
    consumer = client.subscribe(topic, "admin-sub", consumer_type=pulsar.ConsumerType.Shared)
    producer.send(b"x")
    consumer.receive(timeout_millis=TIMEOUT_MS)
    base = f"{cluster.admin_url}/admin/v2"
    assert topic in _get_json(f"{base}/non-persistent/{NS}")
    assert topic in _get_json(f"{base}/namespaces/{NS}/topics?mode=NON_PERSISTENT")
    assert topic in _get_json(f"{base}/namespaces/{NS}/topics?mode=ALL")
    assert topic not in _get_json(f"{base}/namespaces/{NS}/topics")         # PERSISTENT by default
    assert topic not in _get_json(f"{base}/persistent/{NS}")
    s = stats(cluster, topic)
    for field in ("msgRateIn", "msgRateOut", "msgThroughputIn", "msgThroughputOut", "msgDropRate",
                  "averageMsgSize", "storageSize", "publishers", "subscriptions"):
        assert field in s, field
    assert s["storageSize"] == 0 and s["msgInCounter"] == 1
    assert [p["producerName"] for p in s["publishers"]] == ["np-producer"]
    sub = s["subscriptions"]["admin-sub"]
    assert sub["type"] == "Shared" and "msgDropRate" in sub and len(sub["consumers"]) == 1
    with pytest.raises(urllib.error.HTTPError) as e:
        stats(cluster, f"non-persistent://{NS}/never-used")
    assert e.value.code == 404
    # the CLI lists both kinds
    out = subprocess.run([sys.executable, "-m", "pulsarlite", "admin", "--admin-url", cluster.admin_url,
                          "topics", "list", NS], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert topic in out.stdout.split()
    consumer.close()
    producer.close()


def test_nothing_is_stored(cluster, client):
    """No managed ledger, ledger or cursor znode for a non-persistent topic; only the ephemeral
    znode that lists it while it is loaded."""
    from kazoo.client import KazooClient
    topic = f"non-persistent://{NS}/not-stored"
    consumer = client.subscribe(topic, "durable-looking")
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"x")
    consumer.receive(timeout_millis=TIMEOUT_MS)
    zk = KazooClient(hosts=cluster.zookeeper)
    zk.start(timeout=30)
    try:
        assert not zk.exists(f"/managed-ledgers/{NS}/non-persistent")
        assert zk.exists(f"/non-persistent/{NS}/not-stored")
    finally:
        zk.stop()
        zk.close()
    consumer.close()
    producer.close()


def test_partitioned_non_persistent_topic(cluster, client):
    topic = f"non-persistent://{NS}/parted"
    _put_json(f"{cluster.admin_url}/admin/v2/non-persistent/{NS}/parted/partitions", 3)
    assert _get_json(f"{cluster.admin_url}/admin/v2/non-persistent/{NS}/parted/partitions") == {"partitions": 3}
    consumer = client.subscribe(topic, "parts")
    producer = client.create_producer(topic, batching_enabled=False,
                                      message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(9):
        producer.send(f"p{i}".encode())
    got = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(9)]
    assert sorted(m.data() for m in got) == sorted(f"p{i}".encode() for i in range(9))
    assert {m.topic_name() for m in got} == {f"{topic}-partition-{i}" for i in range(3)}
    listed = _get_json(f"{cluster.admin_url}/admin/v2/namespaces/{NS}/topics?mode=NON_PERSISTENT")
    assert {f"{topic}-partition-{i}" for i in range(3)} <= set(listed)
    consumer.close()
    producer.close()


def test_broker_restart_loses_in_flight_messages_and_the_topic_works_again(cluster, client):
    topic = f"non-persistent://{NS}/restart"
    consumer = client.subscribe(topic, "r", receiver_queue_size=1)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"before-1")       # delivered (one permit)
    producer.send(b"before-2")       # dropped: no permit left
    cluster.restart(cluster.broker_names[0])
    received = receive_until_idle(consumer)
    assert b"before-2" not in received
    producer.send(b"after")          # both reconnect to the restarted broker
    wait_for(lambda: b"after" in _drain(consumer, received), 30, "a message sent after the restart")
    consumer.close()
    producer.close()


def _drain(consumer, into: list) -> list:
    try:
        into.append(consumer.receive(timeout_millis=500).data())
    except Exception:
        pass
    return into


def test_http_service_url_looks_non_persistent_topics_up(cluster):
    """The official client with an ``http://`` service URL looks topics up with
    ``GET /lookup/v2/topic/non-persistent/...`` (Pulsar's TopicLookup has both domains)."""
    local = "public/default/over-http"
    answer = _get_json(f"{cluster.admin_url}/lookup/v2/topic/non-persistent/{local}")
    assert answer["brokerUrl"] == cluster.service_url
    http_client = pulsar.Client(cluster.admin_url, operation_timeout_seconds=30)
    try:
        consumer = http_client.subscribe(f"non-persistent://{local}", "http-sub")
        producer = http_client.create_producer(f"non-persistent://{local}", batching_enabled=False)
        producer.send(b"via-http-lookup")
        assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"via-http-lookup"
    finally:
        http_client.close()


def test_two_brokers_one_owner_listed_by_both(cluster_factory):
    """Ownership through the bundles, as persistent topics: whichever broker a client first asks,
    the topics are served by their bundle's owner (a producer on one broker reaches a consumer
    connected through the other), and every broker lists the non-persistent topics loaded on
    either."""
    two = cluster_factory(3, brokers=2, name="two-brokers")
    brokers = [p for p in two.status()["processes"] if p["role"] == "broker"]
    assert len(brokers) == 2
    admin_urls = [f"http://127.0.0.1:{p['ports']['http']}" for p in brokers]
    service_urls = [f"pulsar://127.0.0.1:{p['ports']['pulsar']}" for p in brokers]
    clients = [pulsar.Client(url, operation_timeout_seconds=30) for url in service_urls]
    try:
        topics = [f"non-persistent://{NS}/two-{i}" for i in range(6)]     # spread over the bundles
        consumers = [clients[0].subscribe(t, "s") for t in topics]
        producers = [clients[1].create_producer(t, batching_enabled=False) for t in topics]
        for t, p in zip(topics, producers):
            p.send(t.encode())
        for t, c in zip(topics, consumers):
            assert c.receive(timeout_millis=TIMEOUT_MS).data() == t.encode()
        for url in admin_urls:
            assert set(topics) <= set(_get_json(f"{url}/admin/v2/non-persistent/{NS}"))
    finally:
        for c in clients:
            c.close()


def test_our_aio_client_regex_subscription_over_both_kinds(cluster):
    import asyncio

    import pulsarlite.aio as pl

    async def run() -> list[bytes]:
        async with pl.Client(cluster.service_url) as ours:
            p = await ours.create_producer(f"persistent://{NS}/aio-mix-p")
            np = await ours.create_producer(f"non-persistent://{NS}/aio-mix-np")
            consumer = await ours.subscribe(re.compile(f"persistent://{NS}/aio-mix-.*"), "aio-all",
                                            regex_subscription_mode="AllTopics")
            await p.send(b"p")
            await np.send(b"np")
            got = [(await asyncio.wait_for(consumer.receive(), TIMEOUT_MS / 1000)).data() for _ in range(2)]
            return sorted(got)

    assert asyncio.run(run()) == [b"np", b"p"]


def test_a_reader_gets_what_is_sent_while_it_is_connected(client):
    """A reader is a non-durable Exclusive subscription: on a non-persistent topic its start id
    has nothing to start from; it gets the messages sent while it is connected."""
    topic = f"non-persistent://{NS}/reader"
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"before")
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    producer.send(b"while")
    assert reader.read_next(timeout_millis=TIMEOUT_MS).data() == b"while"
    with pytest.raises(Exception, match="(?i)timeout"):
        reader.read_next(timeout_millis=1_000)
    reader.close()
    producer.close()
