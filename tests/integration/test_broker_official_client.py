"""The official Python client (pulsar-client 3.x, C++ core) against real broker and bookie
processes started by the cluster launcher. Plain sync tests: the client's calls block."""

from __future__ import annotations

import socket
import struct
import time

import pytest

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    """One cluster for the module's tests (each uses its own topics; none stops a process)."""
    return module_cluster_factory(3, brokers=1)



def receive_all(consumer, n: int) -> list:
    return [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(n)]


def assert_nothing_more(consumer) -> None:
    with pytest.raises(Exception, match="(?i)timeout"):
        consumer.receive(timeout_millis=1_000)


@pytest.mark.parametrize("compression", ["NONE", "LZ4", "ZLib", "ZSTD", "SNAPPY"])
@pytest.mark.parametrize("batching", [False, True])
def test_produce_consume_ack(client, compression, batching):
    topic = f"persistent://public/default/pc-{compression.lower()}-{int(batching)}"
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive,
                                initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=batching, batching_max_messages=10,
                                      batching_max_publish_delay_ms=5,
                                      compression_type=getattr(pulsar.CompressionType, compression))
    payloads = [f"message-{i}-".encode() * (1 + i % 7) for i in range(50)]
    if batching:
        for p in payloads:
            producer.send_async(p, None)
        producer.flush()
    else:
        ids = [producer.send(p) for p in payloads]
        assert [(m.ledger_id(), m.entry_id()) for m in ids] == sorted((m.ledger_id(), m.entry_id()) for m in ids)
    got = receive_all(consumer, len(payloads))
    assert [m.data() for m in got] == payloads
    for m in got:
        consumer.acknowledge(m)
    assert_nothing_more(consumer)
    producer.close()
    consumer.close()


def test_resubscribe_gets_only_unacked(client):
    topic = "persistent://public/default/resub"
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(10):
        producer.send(f"m{i}".encode())
    got = receive_all(consumer, 10)
    for m in got:
        if int(m.data()[1:]) % 2 == 0:
            consumer.acknowledge(m)
    consumer.close()

    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    again = receive_all(consumer, 5)
    assert sorted(m.data() for m in again) == [f"m{i}".encode() for i in range(1, 10, 2)]
    assert all(m.redelivery_count() >= 0 for m in again)
    for m in again:
        consumer.acknowledge(m)
    assert_nothing_more(consumer)
    consumer.close()


def test_batch_index_acks_ack_the_whole_batch(client):
    """With batch-index acks, acking every message of a batch one by one acks the entry: after
    resubscribing, nothing of it comes back (a partial ack must not be refused or lost)."""
    topic = "persistent://public/default/batch-index-ack"
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest,
                                batch_index_ack_enabled=True)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                                      batching_max_publish_delay_ms=50)
    for i in range(10):
        producer.send_async(f"b{i}".encode(), None)
    producer.flush()
    got = receive_all(consumer, 10)
    assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got}) < 10  # batched
    for m in got[:5]:
        consumer.acknowledge(m)
    time.sleep(0.5)  # past the client's ack grouping window: these go out as partial (ack_set) acks
    for m in got[5:]:
        consumer.acknowledge(m)
    time.sleep(0.5)
    consumer.close()
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest,
                                batch_index_ack_enabled=True)
    assert_nothing_more(consumer)
    consumer.close()
    producer.close()


def test_exclusive_refuses_second_consumer(client):
    topic = "persistent://public/default/excl"
    first = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(Exception, match="(?i)busy"):
        client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
    first.close()


def test_shared_round_robin(client):
    topic = "persistent://public/default/shared"
    a = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10)
    b = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(20):
        producer.send(f"s{i}".encode())
    seen = []
    for consumer in (a, b):
        while True:
            try:
                m = consumer.receive(timeout_millis=2_000)
            except Exception:
                break
            seen.append(m.data())
            consumer.acknowledge(m)
    assert sorted(seen) == sorted(f"s{i}".encode() for i in range(20))
    a.close()
    b.close()


def test_last_message_id_and_reader(client):
    topic = "persistent://public/default/lastid"
    producer = client.create_producer(topic, batching_enabled=False)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert not reader.has_message_available()
    sent = [producer.send(f"r{i}".encode()) for i in range(3)]
    assert reader.has_message_available()
    got = [reader.read_next(timeout_millis=TIMEOUT_MS) for _ in range(3)]
    assert [m.data() for m in got] == [b"r0", b"r1", b"r2"]
    assert str(got[-1].message_id()) == str(sent[-1])
    reader.close()


def test_bad_frame_client_does_not_disturb_good_one(client, cluster):
    topic = "persistent://public/default/badframe"
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"before")
    port = int(cluster.service_url.rsplit(":", 1)[1])
    for garbage in (b"\x00\x00\x00\x05\x00\x00\x00\x09xxxxx"[:9], b"\xff\xff\xff\xff" + b"x" * 64,
                    struct.pack(">II", 12, 8) + b"\x08\xff\x01notproto"):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(garbage)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(5)
            try:
                while s.recv(65536):
                    pass
            except OSError:
                pass
    producer.send(b"after")
    got = receive_all(consumer, 2)
    assert [m.data() for m in got] == [b"before", b"after"]
    consumer.close()


def test_schema_roundtrip(client):
    from pulsar.schema import JsonSchema, Record, String, StringSchema

    class User(Record):
        name = String()

    topic = "persistent://public/default/schema-json"
    producer = client.create_producer(topic, schema=JsonSchema(User))
    consumer = client.subscribe(topic, "sub", schema=JsonSchema(User),
                                initial_position=pulsar.InitialPosition.Earliest)
    producer.send(User(name="ada"))
    assert consumer.receive(timeout_millis=TIMEOUT_MS).value().name == "ada"
    consumer.close()
    producer.close()

    topic = "persistent://public/default/schema-string"
    producer = client.create_producer(topic, schema=StringSchema())
    consumer = client.subscribe(topic, "sub", schema=StringSchema(),
                                initial_position=pulsar.InitialPosition.Earliest)
    producer.send("hello")
    assert consumer.receive(timeout_millis=TIMEOUT_MS).value() == "hello"
    consumer.close()
    producer.close()
