"""[compat] issue 32 items 13, 11 and 12: subscription behaviour the official clients expect, with
the official Python client (pulsar-client 3.x, C++ core) or raw frames (our wire codec) against
real ZooKeeper, bookie and broker processes. Each test names the Pulsar behaviour it checks."""

from __future__ import annotations

import socket

import pytest

from pulsarlite.wire import commands as c
from pulsarlite.wire import pb
from pulsarlite.wire.frames import FrameDecoder

pulsar = pytest.importorskip("pulsar")

T = pb.BaseCommand

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    """One cluster for the module's tests (each uses its own topics; none stops a process)."""
    return module_cluster_factory(3, brokers=1)



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


# -- item 12 -------------------------------------------------------------------------------------
class RawConnection:
    """A client connection of raw frames (our wire codec): CONNECT, then commands; ``until``
    reads frames until a predicate holds over all read so far."""

    def __init__(self, cluster) -> None:
        port = int(cluster.service_url.rsplit(":", 1)[1])
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.decoder = FrameDecoder(8 << 20)
        self.frames: list = []
        self.sock.sendall(c.connect("raw-compat", 19))
        self.until(lambda frames: any(f.type == T.CONNECTED for f in frames))

    def until(self, done) -> list:
        while not done(self.frames):
            data = self.sock.recv(65536)
            assert data, f"closed by the broker after {[T.Type.Name(f.type) for f in self.frames]}"
            self.frames.extend(self.decoder.feed(data))
        return self.frames

    def subscribe(self, topic: str, consumer_id: int, request_id: int, name: str) -> None:
        self.sock.sendall(c.subscribe(topic, "sub", pb.CommandSubscribe.Failover, consumer_id, request_id,
                                      consumer_name=name))

    def close(self) -> None:
        self.sock.close()


def of_consumer(frames: list, consumer_id: int) -> list[str]:
    """The SUCCESS (by request id = consumer id here) and ACTIVE_CONSUMER_CHANGE frames of one
    consumer, in arrival order."""
    out = []
    for f in frames:
        if f.type == T.SUCCESS and f.command.success.request_id == consumer_id + 100:
            out.append("SUCCESS")
        elif f.type == T.ACTIVE_CONSUMER_CHANGE and f.command.active_consumer_change.consumer_id == consumer_id:
            out.append(f"ACTIVE={f.command.active_consumer_change.is_active}")
    return out


def test_active_consumer_change_comes_after_the_subscribe_success(cluster):
    """Pulsar (ServerCnx.handleSubscribe, then the single-active dispatcher's notice): a Failover
    consumer gets its SUBSCRIBE's SUCCESS first, then ACTIVE_CONSUMER_CHANGE; the Go client
    registers the consumer on SUCCESS and drops a notice for a consumer it does not know yet, so
    its failover listeners never fired. Checked on the wire for the first consumer (active) and
    a second one (standby), whose notices follow their own SUCCESS."""
    topic = "persistent://public/default/active-change-order"
    raw = RawConnection(cluster)
    try:
        raw.subscribe(topic, 1, 101, "a")
        frames = raw.until(lambda fs: len(of_consumer(fs, 1)) >= 2)
        assert of_consumer(frames, 1) == ["SUCCESS", "ACTIVE=True"]
        raw.subscribe(topic, 2, 102, "b")         # sorts after "a": standby
        frames = raw.until(lambda fs: len(of_consumer(fs, 2)) >= 2)
        assert of_consumer(frames, 2) == ["SUCCESS", "ACTIVE=False"]
        assert "ACTIVE=False" not in of_consumer(frames, 1)
    finally:
        raw.close()
