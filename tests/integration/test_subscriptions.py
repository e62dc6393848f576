"""Subscriptions with the official Python client (pulsar-client 3.x) against real bookies and
brokers: the four subscription types with several consumers, batch-index acks with redelivery,
negative acks with redelivery counts, seek by id and by time on consumers and readers,
dead-letter topics, producer access modes, and deduplication across a broker kill -9."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections import defaultdict

import pytest

from integration.helpers import wait_for
from faces.cluster import LocalCluster

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def cluster(module_tmp_path):
    c = LocalCluster(module_tmp_path / "subs" / "cluster")
    try:
        c.start_processes(bookies=3, brokers=1)
        yield c
    finally:
        c.stop()



_n = [0]


def fresh(name: str) -> str:
    _n[0] += 1
    return f"persistent://public/default/{name}-{_n[0]}-{int(time.time() * 1000) % 100000}"


def drain(consumer, *, ack=True, timeout_ms=1_500) -> list:
    got = []
    while True:
        try:
            m = consumer.receive(timeout_millis=timeout_ms)
        except Exception:
            return got
        got.append(m)
        if ack:
            consumer.acknowledge(m)


def assert_nothing_more(consumer, timeout_ms=1_000) -> None:
    with pytest.raises(Exception, match="(?i)timeout"):
        consumer.receive(timeout_millis=timeout_ms)


# -- subscription types ---------------------------------------------------------------------------
def test_failover_standby_takes_over_with_unacked(client):
    topic = fresh("failover")
    a = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Failover, consumer_name="a",
                         initial_position=pulsar.InitialPosition.Earliest)
    b = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Failover, consumer_name="b",
                         initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(10):
        producer.send(f"f{i}".encode())
    got_a = [a.receive(timeout_millis=TIMEOUT_MS) for _ in range(10)]   # "a" sorts first: active
    assert [m.data() for m in got_a] == [f"f{i}".encode() for i in range(10)]
    assert_nothing_more(b)
    for m in got_a[:4]:
        a.acknowledge(m)
    time.sleep(0.3)      # past the client's ack grouping
    a.close()            # the standby takes over with what a left unacked
    got_b = drain(b)
    assert [m.data() for m in got_b] == [f"f{i}".encode() for i in range(4, 10)]
    assert all(m.redelivery_count() >= 1 for m in got_b)
    b.close()
    producer.close()


def test_shared_unacked_of_leaving_consumer_go_to_others(client):
    topic = fresh("shared-leave")
    a = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=5)
    b = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=5)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(20):
        producer.send(f"s{i}".encode())
    held = [a.receive(timeout_millis=TIMEOUT_MS) for _ in range(3)]   # a keeps these unacked
    a.close()
    got = drain(b)
    datas = sorted(m.data() for m in got)
    assert datas == sorted(f"s{i}".encode() for i in range(20)), (len(datas), [m.data() for m in held])
    b.close()
    producer.close()


def test_cumulative_ack_refused_on_shared(client):
    topic = fresh("shared-cumul")
    c = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"x")
    m = c.receive(timeout_millis=TIMEOUT_MS)
    with pytest.raises(Exception):
        c.acknowledge_cumulative(m)
    c.close()
    producer.close()


def test_a_cumulative_ack_of_a_message_that_does_not_exist_changes_nothing(client):
    """[hardening] finding 4: a cumulative ack of an id past the topic's end (here INT64_MAX,
    INT64_MAX) moved the subscription there, silently dropping every existing and future
    message. It is refused (logged) and the backlog stays."""
    topic = fresh("poison-ack")
    c = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(3):
        producer.send(f"m{i}".encode())
    first = c.receive(timeout_millis=TIMEOUT_MS)
    c.acknowledge_cumulative(pulsar.MessageId(-1, (1 << 63) - 1, (1 << 63) - 1, -1))
    time.sleep(0.5)                    # the client groups acks (~100 ms)
    c.close()
    c = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Exclusive)
    producer.send(b"m3")
    got = [m.data() for m in drain(c)]
    assert got == [b"m0", b"m1", b"m2", b"m3"], (first.data(), got)
    c.close()
    producer.close()


def test_a_subscription_name_the_admin_api_could_not_delete_is_refused(client):
    """[hardening] finding 6: names with a newline or of 10 KB were accepted on the wire, and
    no admin request could delete them. One rule now (pulsarlite.topic_name)."""
    topic = fresh("sub-names")
    for name in ("a\nb", "x" * 10_000, "tab\there"):
        with pytest.raises(Exception):
            client.subscribe(topic, name)
    c = client.subscribe(topic, "fine-name:1")
    c.close()


def _key_shared_consumer(client, topic, name):
    return client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name=name,
                            receiver_queue_size=50, initial_position=pulsar.InitialPosition.Earliest)


def test_key_shared_affinity_and_order_across_a_join(client):
    topic = fresh("key-shared")
    consumers = {n: _key_shared_consumer(client, topic, n) for n in ("c1", "c2", "c3")}
    producer = client.create_producer(topic, batching_enabled=True, batching_type=pulsar.BatchingType.KeyBased,
                                      batching_max_publish_delay_ms=5)
    keys = [f"key-{k}" for k in range(12)]

    def send_round(r):
        for i in range(10):
            for k in keys:
                producer.send_async(f"{k}/{r}/{i}".encode(), None, partition_key=k)
        producer.flush()

    def receive_all(expected):
        per_consumer = defaultdict(list)
        total = 0
        deadline = time.monotonic() + 60
        while total < expected and time.monotonic() < deadline:
            for name, c in consumers.items():
                try:
                    m = c.receive(timeout_millis=200)
                except Exception:
                    continue
                per_consumer[name].append((m.partition_key(), m.data().decode()))
                c.acknowledge(m)
                total += 1
        return per_consumer, total

    send_round(0)
    first, total = receive_all(10 * len(keys))
    assert total == 10 * len(keys)
    owner = {}
    for name, msgs in first.items():
        for k, _ in msgs:
            assert owner.setdefault(k, name) == name, f"{k} went to {owner[k]} and {name}"
        for k in {k for k, _ in msgs}:
            seqs = [int(d.split("/")[2]) for kk, d in msgs if kk == k]
            assert seqs == sorted(seqs) and len(seqs) == 10, (k, seqs)
    assert len(first) >= 2, "12 keys over 3 consumers all went to one"
    consumers["c4"] = _key_shared_consumer(client, topic, "c4")
    send_round(1)
    second, total = receive_all(10 * len(keys))
    assert total == 10 * len(keys)
    owner = {}
    for name, msgs in second.items():
        for k, _ in msgs:
            assert owner.setdefault(k, name) == name
        for k in {k for k, _ in msgs}:
            seqs = [int(d.split("/")[2]) for kk, d in msgs if kk == k]
            assert seqs == sorted(seqs) and len(seqs) == 10, (k, seqs)
    for c in consumers.values():
        c.close()
    producer.close()


def test_key_shared_new_consumer_waits_for_earlier_messages_of_its_keys(client):
    """c1 holds (unacked) the first message of every key; c2 joins and takes half of the keys:
    it gets nothing of those keys until c1 acks (or leaves), then everything, in order."""
    topic = fresh("key-shared-join")
    c1 = _key_shared_consumer(client, topic, "c1")
    producer = client.create_producer(topic, batching_enabled=False)
    keys = [f"k{k}" for k in range(16)]
    for k in keys:
        producer.send(f"{k}/0".encode(), partition_key=k)
    held = [c1.receive(timeout_millis=TIMEOUT_MS) for _ in keys]
    c2 = _key_shared_consumer(client, topic, "c2")
    for k in keys:
        producer.send(f"{k}/1".encode(), partition_key=k)
    got1 = drain(c1, timeout_ms=1_000)             # c1 still owns some keys: gets their second message
    assert all(m.data().endswith(b"/1") for m in got1)
    assert 0 < len(got1) < len(keys)
    assert_nothing_more(c2)                        # c2's keys wait for c1's unacked first messages
    c1.close()                                     # leaves: its unacked firsts are redelivered
    got2 = drain(c2, timeout_ms=2_000)
    by_key = defaultdict(list)
    for m in got2:
        k, n = m.data().decode().split("/")
        by_key[k].append(int(n))
    owned_by_c1 = {m.data().decode().split("/")[0] for m in got1}
    for k in keys:
        assert by_key[k] in ([0, 1], [0]) and (by_key[k] == [0]) == (k in owned_by_c1), (k, by_key[k])
    assert held
    c2.close()
    producer.close()


# -- acks and redelivery ----------------------------------------------------------------------------
def test_batch_index_acks_redeliver_only_the_rest(client):
    topic = fresh("batch-ack-set")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest,
                                batch_index_ack_enabled=True, consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=10,
                                      batching_max_publish_delay_ms=100)
    for i in range(10):
        producer.send_async(f"b{i}".encode(), None)
    producer.flush()
    got = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(10)]
    assert len({(m.message_id().ledger_id(), m.message_id().entry_id()) for m in got}) == 1
    for m in got[::2]:
        consumer.acknowledge(m)
    time.sleep(0.5)
    consumer.close()
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest,
                                batch_index_ack_enabled=True, consumer_type=pulsar.ConsumerType.Shared)
    again = drain(consumer, ack=False)
    assert sorted(m.data() for m in again) == [f"b{i}".encode() for i in range(1, 10, 2)]
    consumer.close()
    producer.close()


def test_negative_ack_redelivery_counts(client):
    topic = fresh("nack")
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                negative_ack_redelivery_delay_ms=100)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"n")
    counts = []
    for _ in range(3):
        m = consumer.receive(timeout_millis=TIMEOUT_MS)
        counts.append(m.redelivery_count())
        consumer.negative_acknowledge(m)
    assert counts == [0, 1, 2]
    m = consumer.receive(timeout_millis=TIMEOUT_MS)
    consumer.acknowledge(m)
    assert_nothing_more(consumer)
    consumer.close()
    producer.close()


def test_dead_letter_topic(client):
    topic = fresh("dlq")
    dlq = topic + "-DLQ-test"
    dlq_consumer = client.subscribe(dlq, "dlq-sub", initial_position=pulsar.InitialPosition.Earliest)
    consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                negative_ack_redelivery_delay_ms=100,
                                dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
                                    max_redeliver_count=2, dead_letter_topic=dlq))
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"poison")
    producer.send(b"fine")
    deliveries = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            m = consumer.receive(timeout_millis=2_000)
        except Exception:
            break
        if m.data() == b"fine":
            consumer.acknowledge(m)
        else:
            deliveries += 1
            consumer.negative_acknowledge(m)
    assert deliveries == 3        # the first delivery and max_redeliver_count redeliveries
    m = dlq_consumer.receive(timeout_millis=TIMEOUT_MS)
    assert m.data() == b"poison"
    dlq_consumer.acknowledge(m)
    for c in (consumer, dlq_consumer):
        c.close()
    producer.close()


# -- seek -------------------------------------------------------------------------------------------
def _produce_spaced(client, topic, n):
    producer = client.create_producer(topic, batching_enabled=False)
    ids = []
    for i in range(n):
        ids.append(producer.send(f"m{i}".encode()))
        time.sleep(0.01)      # distinct publish times
    producer.close()
    return ids


def test_seek_by_id_and_by_time_on_a_consumer(client):
    topic = fresh("seek-consumer")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    _produce_spaced(client, topic, 10)
    got = drain(consumer)
    assert [m.data() for m in got] == [f"m{i}".encode() for i in range(10)]
    consumer.seek(got[3].message_id())
    again = drain(consumer)
    # the broker delivers from m3 on; the client drops the seek message itself (not inclusive)
    assert [m.data() for m in again] == [f"m{i}".encode() for i in range(4, 10)]
    consumer.seek(got[6].publish_timestamp())
    again = drain(consumer)
    assert [m.data() for m in again] == [f"m{i}".encode() for i in range(6, 10)]
    consumer.seek(pulsar.MessageId.earliest)
    assert len(drain(consumer)) == 10
    consumer.seek(pulsar.MessageId(-1, 10**9, 5, -1))   # past the end: placed after the last entry
    assert_nothing_more(consumer)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"after")
    assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"after"
    producer.close()
    consumer.close()


def test_seek_on_a_reader(client):
    topic = fresh("seek-reader")
    _produce_spaced(client, topic, 10)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    first = [reader.read_next(timeout_millis=TIMEOUT_MS) for _ in range(10)]
    reader.seek(first[2].message_id())
    assert reader.read_next(timeout_millis=TIMEOUT_MS).data() == b"m3"     # start not inclusive
    reader.seek(first[7].publish_timestamp())
    assert [reader.read_next(timeout_millis=TIMEOUT_MS).data() for _ in range(3)] == [b"m7", b"m8", b"m9"]
    assert not reader.has_message_available()
    reader.close()
    inclusive = client.create_reader(topic, pulsar.MessageId.earliest, start_message_id_inclusive=True)
    [inclusive.read_next(timeout_millis=TIMEOUT_MS) for _ in range(10)]
    inclusive.seek(first[2].message_id())
    assert inclusive.read_next(timeout_millis=TIMEOUT_MS).data() == b"m2"
    inclusive.close()


def test_unsubscribe_deletes_the_subscription(client):
    topic = fresh("unsub")
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(topic, "gone", initial_position=pulsar.InitialPosition.Earliest)
    producer.send(b"a")
    consumer.unsubscribe()
    producer.send(b"b")
    consumer = client.subscribe(topic, "gone", initial_position=pulsar.InitialPosition.Latest)
    assert_nothing_more(consumer)     # a new subscription at latest: the old backlog is gone
    consumer.close()
    producer.close()


# -- producer access modes --------------------------------------------------------------------------
def test_producer_access_modes(client):
    topic = fresh("access")
    first = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    with pytest.raises(Exception, match="(?i)busy|fenced"):
        client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Shared)
    with pytest.raises(Exception, match="(?i)busy|fenced"):
        client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
    result = {}

    def wait_for_exclusive():
        try:
            result["producer"] = client.create_producer(
                topic, access_mode=pulsar.ProducerAccessMode.WaitForExclusive)
        except Exception as e:     # noqa: BLE001
            result["error"] = e

    t = threading.Thread(target=wait_for_exclusive, daemon=True)
    t.start()
    time.sleep(1.0)
    assert not result, "WaitForExclusive got access while the exclusive producer is connected"
    first.send(b"from-first")
    first.close()
    t.join(timeout=30)
    assert "producer" in result, result
    result["producer"].send(b"from-waiter")
    result["producer"].close()
    shared = client.create_producer(topic, send_timeout_millis=3_000)
    fencing = client.create_producer(topic, access_mode=pulsar.ProducerAccessMode.ExclusiveWithFencing)
    fencing.send(b"from-fencing")
    with pytest.raises(Exception):           # the shared producer was closed by the broker
        shared.send(b"fenced")
    fencing.close()
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(timeout_millis=TIMEOUT_MS).data())
    reader.close()
    assert got == [b"from-first", b"from-waiter", b"from-fencing"]


# -- deduplication -----------------------------------------------------------------------------------
def _enable_dedup(admin_url: str, namespace: str = "public/default") -> None:
    req = urllib.request.Request(f"{admin_url}/admin/v2/namespaces/{namespace}/deduplication",
                                 data=json.dumps(True).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status in (200, 204)


def test_dedup_drops_resent_sequence_ids(client, cluster):
    _enable_dedup(cluster.admin_url)
    topic = fresh("dedup")
    client.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest).close()
    producer = client.create_producer(topic, producer_name="dedup-p", batching_enabled=False)
    for i in range(5):
        producer.send(f"d{i}".encode(), sequence_id=i)
    producer.send(b"d2-again", sequence_id=2)        # a duplicate: receipt, not stored
    producer.close()
    producer = client.create_producer(topic, producer_name="dedup-p", batching_enabled=False)
    assert producer.last_sequence_id() == 4
    producer.close()
    # batches: the last sequence id is the batch's highest
    producer = client.create_producer(topic, producer_name="dedup-p", batching_enabled=True,
                                      batching_max_publish_delay_ms=50)
    for i in range(5, 25):
        producer.send_async(f"d{i}".encode(), None)
    producer.flush()
    producer.close()
    producer = client.create_producer(topic, producer_name="dedup-p", batching_enabled=False)
    assert producer.last_sequence_id() == 24
    producer.send(b"d10-again", sequence_id=10)
    producer.close()
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(timeout_millis=TIMEOUT_MS).data())
    assert got == [f"d{i}".encode() for i in range(25)]
    reader.close()


class RawProducer:
    """A producer speaking raw frames, to play the official C++ client's reconnect exactly."""

    def __init__(self, cluster, topic: str, name: str, epoch: int = 0) -> None:
        """``epoch``: CommandProducer.epoch, as the C++ client counts its reconnects (0: a new
        producer)."""
        import socket

        from pulsarlite.wire import commands as c
        from pulsarlite.wire.frames import FrameDecoder
        self.c, self.topic, self.name = c, topic, name
        port = int(cluster.service_url.rsplit(",", 1)[0].rsplit(":", 1)[1])
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.decoder = FrameDecoder(8 << 20)
        self.frames: list = []
        self.sock.sendall(c.connect("raw-cpp", 19))
        self.sock.sendall(c.producer(topic, 1, 1, producer_name=name, epoch=epoch))
        success = self.wait_for(lambda f: f.type == f.command.PRODUCER_SUCCESS or f.type == f.command.ERROR)
        assert success.type == success.command.PRODUCER_SUCCESS, success.command
        self.last_sequence_id = success.command.producer_success.last_sequence_id

    def wait_for(self, match):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for i, f in enumerate(self.frames):
                if match(f):
                    return self.frames.pop(i)
            data = self.sock.recv(65536)
            assert data, "the broker closed the connection"
            self.frames.extend(self.decoder.feed(data))
        raise AssertionError("no such frame within 30 s")

    def send(self, seq: int, text: str) -> None:
        from pulsarlite.wire.entry import Message, build_entry
        entry = build_entry(Message(text.encode()), producer_name=self.name, sequence_id=seq,
                            publish_time_ms=1_000 + len(text))
        self.sock.sendall(self.c.send(1, seq, entry))

    def receipt(self) -> tuple[int, int, int]:
        f = self.wait_for(lambda f: f.type in (f.command.SEND_RECEIPT, f.command.SEND_ERROR))
        assert f.type == f.command.SEND_RECEIPT, f.command
        r = f.command.send_receipt
        signed = [v - (1 << 64) if v >= 1 << 63 else v for v in (r.message_id.ledgerId, r.message_id.entryId)]
        return r.sequence_id, signed[0], signed[1]     # a duplicate's receipt is -1:-1

    def close(self) -> None:
        self.sock.close()


def test_dedup_keeps_messages_of_a_client_that_reuses_sequence_ids(client, cluster):
    """The official C++ client resets its sequence-id counter to PRODUCER_SUCCESS's
    last_sequence_id + 1 when it reconnects before any receipt reached it, while messages with
    higher ids are still pending (found by the chaos suite, seed 17, ZooKeeper restart). Played
    here with raw frames: m0 stored (its receipt lost), m1..m5 queued; on reconnect m0..m5 are
    resent, then m6..m8 go out as ids 1..3. All must be stored once, also after an unload (the
    next owner learns the reused ids from the log), and true resends stay duplicates."""
    _enable_dedup(cluster.admin_url)
    topic = fresh("dedup-reuse")
    client.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest).close()
    first = RawProducer(cluster, topic, "cpp-p")
    first.send(0, "m0")
    first.receipt()                                   # stored; the client never sees this receipt
    first.close()
    again = RawProducer(cluster, topic, "cpp-p", epoch=1)       # the same client reconnecting
    assert again.last_sequence_id == 0
    for seq in range(6):
        again.send(seq, f"m{seq}")
    for i, seq in enumerate(range(1, 4)):
        again.send(seq, f"m{6 + i}")
    receipts = [again.receipt() for _ in range(9)]
    assert [r[0] for r in receipts] == [0, 1, 2, 3, 4, 5, 1, 2, 3]
    assert receipts[0][1:] == (-1, -1) and all(r[1] >= 0 for r in receipts[1:]), receipts
    assert len({r[1:] for r in receipts[1:]}) == 8, receipts      # each stored as its own entry
    again.close()
    unload = urllib.request.Request(f"{cluster.admin_url}/admin/v2/persistent/{topic.split('://')[1]}/unload",
                                    method="PUT")
    with urllib.request.urlopen(unload, timeout=30) as resp:
        assert resp.status in (200, 204)
    third = RawProducer(cluster, topic, "cpp-p", epoch=2)
    third.send(2, "m2")                               # true resends: duplicates
    third.send(2, "m7")
    third.send(3, "m9")                               # another message under a reused id: stored
    got = [third.receipt() for _ in range(3)]
    assert [g[1:] == (-1, -1) for g in got] == [True, True, False], got
    third.close()
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    texts = []
    while reader.has_message_available():
        texts.append(reader.read_next(timeout_millis=TIMEOUT_MS).data().decode())
    reader.close()
    assert texts == [f"m{i}" for i in range(10)], texts


@pytest.mark.parametrize("batching", [False, True])
def test_dedup_survives_owner_kill_9(cluster_factory, batching):
    """Two brokers; dedup on; a named producer publishes asynchronously while the topic's owner
    is killed (-9). The client resends what had no receipt to the new owner, which rebuilt the
    producer's sequence ids from the log: every message is stored exactly once. A new producer
    of the same name resumes after the last sequence id, and explicit resends are dropped."""
    from kazoo.client import KazooClient

    from integration.test_broker_failover import broker_name, owner_of

    two = cluster_factory(3, brokers=2, broker_overrides={"zk_session_timeout_ms": 4_000}, name="dedup")
    _enable_dedup(two.admin_url)
    topic = fresh("dedup-kill")
    zk = KazooClient(hosts=two.zookeeper, timeout=10)
    zk.start(timeout=10)
    c = pulsar.Client(two.service_url, operation_timeout_seconds=60)
    try:
        # a durable subscription keeps every ledger (retention would drop unsubscribed ones)
        c.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest).close()
        producer = c.create_producer(topic, producer_name="kp", batching_enabled=batching,
                                     batching_max_messages=20, batching_max_publish_delay_ms=5,
                                     send_timeout_millis=0, max_pending_messages=1000)
        acked = []
        lock = threading.Lock()

        def callback(res, msg_id):
            with lock:
                acked.append(res)

        for i in range(200):
            producer.send_async(f"k{i}".encode(), callback)
        wait_for(lambda: len(acked) >= 50, 60, "50 receipts before the kill")
        owner = wait_for(lambda: owner_of(zk, topic), 30, "the topic's owner")
        two.kill(broker_name(two, owner))
        for i in range(200, 400):
            producer.send_async(f"k{i}".encode(), callback)
        producer.flush()
        wait_for(lambda: len(acked) >= 400, 120, "every receipt after the takeover")
        assert all(r == pulsar.Result.Ok for r in acked), set(acked)
        producer.close()
        again = c.create_producer(topic, producer_name="kp", batching_enabled=False)
        assert again.last_sequence_id() == 399
        for seq in range(390, 400):              # resent by hand: all duplicates
            again.send(b"dup", sequence_id=seq)
        again.close()
        consumer = c.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest)
        got = [m.data() for m in drain(consumer, timeout_ms=3_000)]
        consumer.close()
        assert got == [f"k{i}".encode() for i in range(400)], (len(got), len(set(got)))
    finally:
        c.close()
        zk.stop()
        zk.close()


def test_failover_spreads_partitions_over_consumers(client, cluster):
    """Failover on a partitioned topic: partition N's active consumer is the (N mod count)-th
    by name, so three consumers get one partition each; when one leaves, its partition moves."""
    topic = fresh("failover-pt")
    path = topic.replace("persistent://", "")
    req = urllib.request.Request(f"{cluster.admin_url}/admin/v2/persistent/{path}/partitions",
                                 data=b"3", method="PUT", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status in (200, 204)
    consumers = {n: client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Failover,
                                     consumer_name=n, initial_position=pulsar.InitialPosition.Earliest)
                 for n in ("a", "b", "c")}
    producer = client.create_producer(topic, batching_enabled=False,
                                      message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    for i in range(30):
        producer.send(f"p{i}".encode())
    partitions = {}
    for name, c in consumers.items():
        partitions[name] = {m.topic_name() for m in drain(c)}
    assert all(len(p) == 1 for p in partitions.values()), partitions
    assert len(set().union(*partitions.values())) == 3
    consumers.pop("b").close()
    for i in range(30, 60):
        producer.send(f"p{i}".encode())
    after = {name: {m.topic_name() for m in drain(c)} for name, c in consumers.items()}
    assert set().union(*after.values()) == set().union(*partitions.values()), after
    for c in consumers.values():
        c.close()
    producer.close()


def test_key_shared_sticky_ranges(client, cluster):
    """STICKY: each consumer owns the hash ranges it gives; keys go by Murmur3 hash mod 65536
    (as Pulsar computes it); an overlapping consumer is refused."""
    from broker.key_shared import sticky_key_hash

    topic = fresh("key-shared-sticky")

    def sticky(name, ranges):
        policy = pulsar.ConsumerKeySharedPolicy(key_shared_mode=pulsar.KeySharedMode.Sticky,
                                                sticky_ranges=ranges)
        return client.subscribe(topic, "sticky", consumer_type=pulsar.ConsumerType.KeyShared,
                                consumer_name=name, key_shared_policy=policy,
                                initial_position=pulsar.InitialPosition.Earliest)

    low = sticky("low", [(0, 32767)])
    high = sticky("high", [(32768, 65535)])
    with pytest.raises(Exception):
        sticky("overlap", [(30000, 40000)])
    producer = client.create_producer(topic, batching_enabled=False)
    keys = [f"key-{i}" for i in range(20)]
    for k in keys:
        producer.send(k.encode(), partition_key=k)
    got_low = {m.partition_key() for m in drain(low)}
    got_high = {m.partition_key() for m in drain(high)}
    assert got_low == {k for k in keys if sticky_key_hash(k) <= 32767}
    assert got_high == {k for k in keys if sticky_key_hash(k) > 32767}
    path = topic.replace("persistent://", "")
    with urllib.request.urlopen(f"{cluster.admin_url}/admin/v2/persistent/{path}/stats", timeout=30) as resp:
        stats = json.loads(resp.read())
    sub = stats["subscriptions"]["sticky"]
    assert sub["type"] == "Key_Shared"
    assert sorted(c["keyHashRanges"] for c in sub["consumers"]) == [["[0, 32767]"], ["[32768, 65535]"]]
    low.close()
    high.close()
    producer.close()


def test_delayed_delivery_on_shared(client):
    """deliver_after (what retry-letter topics build on): a delayed message comes after its
    time, later messages are not held behind it; on Exclusive the delay does not apply."""
    from datetime import timedelta

    topic = fresh("delayed")
    shared = client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared,
                              initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    sent_ms = int(time.time() * 1000)
    producer.send(b"later", deliver_after=timedelta(seconds=3))
    producer.send(b"now")
    first = shared.receive(timeout_millis=TIMEOUT_MS)
    assert first.data() == b"now"
    shared.acknowledge(first)
    second = shared.receive(timeout_millis=TIMEOUT_MS)
    assert second.data() == b"later"
    assert int(time.time() * 1000) >= sent_ms + 3_000     # not before its time
    shared.acknowledge(second)
    exclusive = client.subscribe(topic, "excl", consumer_type=pulsar.ConsumerType.Exclusive,
                                 initial_position=pulsar.InitialPosition.Earliest)
    producer.send(b"late2", deliver_after=timedelta(seconds=60))
    got = [m.data() for m in drain(exclusive)]
    assert got == [b"later", b"now", b"late2"]
    for c in (shared, exclusive):
        c.close()
    producer.close()
