"""Message ids of consumed messages on partitioned topics carry the partition index (issue 32
item 2), with the official client (pulsar-client 3.x, C++ core) and pulsarlite's own client.

Reference (Pulsar): the broker's MESSAGE command sets ``message_id.partition`` to the
partition index of the topic it dispatches from (PersistentTopic's partition index, -1 for a
topic that is not a partition); the C++ client builds the consumed message's id from it, so
consumers on a partitioned topic (multi-topic consumers), consumers and readers on one
partition report it, and acknowledgements routed through the id reach the right partition."""

from __future__ import annotations

import time

import pytest

import pulsarlite.client as ours

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 20_000
PARTITIONS = 3


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    """One cluster for the module's tests (each uses its own topics; none stops a process)."""
    return module_cluster_factory(3, brokers=1)


def _create_partitioned(cluster, local: str) -> str:
    import requests
    r = requests.put(f"{cluster.admin_url}/admin/v2/persistent/public/default/{local}/partitions",
                     json=PARTITIONS, timeout=30)
    assert r.status_code == 204, r.text
    return f"persistent://public/default/{local}"


def _produce(module, cluster, topic: str, n: int) -> dict[str, int]:
    """Sends n keyed messages (spread over the partitions); their data -> receipt's partition."""
    client = module.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        sent = {f"m{i}": producer.send(f"m{i}".encode(), partition_key=f"key-{i}").partition() for i in range(n)}
        producer.close()
    finally:
        client.close()
    assert set(sent.values()) == set(range(PARTITIONS)), sent    # every partition used
    return sent


def _partition_of(topic_name: str) -> int:
    return int(topic_name.rsplit("-partition-", 1)[1])


@pytest.mark.parametrize("module", [pulsar, ours], ids=["official", "pulsarlite"])
def test_consumer_on_partitioned_topic_reports_partition_and_acks_through_it(cluster, module):
    topic = _create_partitioned(cluster, f"pid-consumer-{module.__name__.replace('.', '-')}")
    client = module.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        consumer = client.subscribe(topic, "sub", initial_position=module.InitialPosition.Earliest)
        sent = _produce(module, cluster, topic, 30)
        got = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(30)]
        for msg in got:
            assert msg.message_id().partition() == sent[msg.data().decode()]
            assert msg.message_id().partition() == _partition_of(msg.topic_name())
            consumer.acknowledge(msg.message_id())           # routed through the id's partition
        time.sleep(0.5)                                      # past the client's ack grouping window
        consumer.close()
        consumer = client.subscribe(topic, "sub", initial_position=module.InitialPosition.Earliest)
        with pytest.raises(Exception, match="(?i)timeout"):
            consumer.receive(timeout_millis=1_500)
        consumer.close()
    finally:
        client.close()


@pytest.mark.parametrize("module", [pulsar, ours], ids=["official", "pulsarlite"])
def test_consumer_and_reader_on_one_partition_report_it(cluster, module):
    topic = _create_partitioned(cluster, f"pid-one-{module.__name__.replace('.', '-')}")
    sent = _produce(module, cluster, topic, 30)
    partition = f"{topic}-partition-1"
    expected = sorted(d for d, p in sent.items() if p == 1)
    client = module.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        consumer = client.subscribe(partition, "sub", initial_position=module.InitialPosition.Earliest)
        got = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in expected]
        assert sorted(m.data().decode() for m in got) == expected
        assert {m.message_id().partition() for m in got} == {1}
        consumer.close()
        reader = client.create_reader(partition, module.MessageId.earliest)
        got = [reader.read_next(timeout_millis=TIMEOUT_MS) for _ in expected]
        assert sorted(m.data().decode() for m in got) == expected
        assert {m.message_id().partition() for m in got} == {1}
        reader.close()
    finally:
        client.close()


def test_official_reader_on_partitioned_topic_reports_partitions(cluster):
    topic = _create_partitioned(cluster, "pid-reader-all")
    sent = _produce(pulsar, cluster, topic, 30)
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        got = [reader.read_next(timeout_millis=TIMEOUT_MS) for _ in range(30)]
        assert {m.data().decode(): m.message_id().partition() for m in got} == sent
        reader.close()
    finally:
        client.close()
