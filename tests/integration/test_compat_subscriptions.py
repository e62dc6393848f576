"""[compat] issue 32 items 13, 11 and 12: subscription behaviour the official clients expect, with
the official Python client (pulsar-client 3.x, C++ core) or raw frames (our wire codec) against
real ZooKeeper, bookie and broker processes. Each test names the Pulsar behaviour it checks."""

from __future__ import annotations

import pytest

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory(3, brokers=1)


@pytest.fixture
def client(cluster):
    c = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        yield c
    finally:
        c.close()


def assert_nothing_more(consumer) -> None:
    with pytest.raises(Exception, match="(?i)timeout"):
        consumer.receive(timeout_millis=1_000)


def send_one_batch(client, topic: str, n: int) -> list[bytes]:
    """``n`` messages in one batched entry (batching_max_messages = n)."""
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=n,
                                      batching_max_publish_delay_ms=60_000)
    payloads = [f"m{i}".encode() for i in range(n)]
    for p in payloads:
        producer.send_async(p, None)
    producer.flush()
    producer.close()
    return payloads


# -- item 13 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("sub_type", ["Exclusive", "Failover"])
def test_cumulative_ack_inside_a_batch_keeps_the_rest_of_the_batch(client, sub_type):
    """Pulsar (Consumer.messageAcked, ManagedCursorImpl.asyncMarkDelete with an ack set, batch-index
    acks): a cumulative ack of message 4 of a 10-message batch, sent by a consumer with
    ``batch_index_ack_enabled`` as the entry's id with an ack_set (indexes 5..9 still set), moves
    the mark-delete to the entry before the batch and records indexes 0..4 as acked: a new
    consumer of the subscription gets messages 5..9 only (the rest of the batch, then nothing)."""
    topic = f"persistent://public/default/cumulative-in-batch-{sub_type.lower()}"
    kind = getattr(pulsar.ConsumerType, sub_type)
    consumer = client.subscribe(topic, "sub", consumer_type=kind, batch_index_ack_enabled=True,
                                initial_position=pulsar.InitialPosition.Earliest)
    payloads = send_one_batch(client, topic, 10)
    got = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(10)]
    assert [m.data() for m in got] == payloads
    assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got}) == 1   # one entry
    consumer.acknowledge_cumulative(got[4])
    consumer.close()                     # flushes the grouped ack before CLOSE_CONSUMER

    consumer = client.subscribe(topic, "sub", consumer_type=kind, batch_index_ack_enabled=True,
                                initial_position=pulsar.InitialPosition.Earliest)
    again = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(5)]
    assert [m.data() for m in again] == payloads[5:]
    assert [m.message_id().batch_index() for m in again] == [5, 6, 7, 8, 9]
    assert_nothing_more(consumer)
    # the rest acked cumulatively: the entry is consumed, nothing comes back
    consumer.acknowledge_cumulative(again[-1])
    consumer.close()
    consumer = client.subscribe(topic, "sub", consumer_type=kind, batch_index_ack_enabled=True)
    assert_nothing_more(consumer)
    consumer.close()


# -- item 11 -------------------------------------------------------------------------------------
def test_subscription_type_changes_once_no_consumer_is_connected(client):
    """Pulsar (PersistentSubscription.addConsumer): a consumer of another type is refused
    (ConsumerBusy, "Subscription is of different type") only while a consumer is connected; once
    none is, the subscription takes the new consumer's type (a new dispatcher) and keeps its
    acks: Shared -> Exclusive -> Failover -> Shared, each new consumer gets what is not acked."""
    topic = "persistent://public/default/sub-type-change"
    producer = client.create_producer(topic, batching_enabled=False)
    shared = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                              initial_position=pulsar.InitialPosition.Earliest)
    for i in range(6):
        producer.send(f"m{i}".encode())
    got = [shared.receive(timeout_millis=TIMEOUT_MS) for _ in range(6)]
    for m in got[:2]:
        shared.acknowledge(m)
    with pytest.raises(pulsar.ConsumerBusy):          # a consumer is connected: refused
        client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
    shared.close()

    exclusive = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
    got = [exclusive.receive(timeout_millis=TIMEOUT_MS) for _ in range(4)]
    assert [m.data() for m in got] == [b"m2", b"m3", b"m4", b"m5"]
    exclusive.acknowledge_cumulative(got[1])          # m3: allowed on Exclusive
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    exclusive.close()

    failover = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Failover)
    assert [failover.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(2)] == [b"m4", b"m5"]
    failover.close()
    shared = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    assert sorted(shared.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(2)) == [b"m4", b"m5"]
    assert_nothing_more(shared)
    shared.close()
    producer.close()
