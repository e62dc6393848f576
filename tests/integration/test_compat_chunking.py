"""[compat] issue 32 item 5: chunking, with the official Python client (pulsar-client 3.x, C++
core) against real ZooKeeper, bookie and broker processes (and our client both ways).

Reference behaviour (Pulsar): a producer with ``chunking_enabled`` (batching off) splits a
payload larger than the broker's advertised ``maxMessageSize`` into chunks, each one entry
carrying ``uuid``, ``chunk_id``, ``num_chunks_from_msg`` and ``total_chunk_msg_size`` in its
metadata; the broker stores and dispatches the chunks as ordinary entries; the consumer
reassembles them and hands out one message whose id is a ChunkMessageId (first and last chunk);
acking it acks every chunk entry.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.integration.helpers import wait_for

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 30_000
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    return module_cluster_factory(3, brokers=1)


def payload(size: int, seed: int) -> bytes:
    """Incompressible (a compressing producer chunks it too)."""
    import random
    return random.Random(seed).randbytes(size)


def compressible(size: int, seed: int) -> bytes:
    block = bytes((i * 7 + seed) % 256 for i in range(4096))
    return (block * (size // len(block) + 1))[:size]


def backlog(cluster, topic: str, sub: str) -> int:
    path = topic.replace("persistent://", "persistent/")
    with urllib.request.urlopen(f"{cluster.admin_url}/admin/v2/{path}/stats", timeout=30) as r:
        return json.load(r)["subscriptions"][sub]["msgBacklog"]


def test_official_12mib_message_round_trips(cluster, client):
    """A 12 MiB message with the default 5 MiB maximum: three chunks stored as three entries,
    one message for the consumer; its ack covers every chunk entry (the backlog, in entries,
    falls to the one plain message after it, then to zero)."""
    topic = "persistent://public/default/chunk-official-12mib"
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, chunking_enabled=True, batching_enabled=False,
                                      send_timeout_millis=TIMEOUT_MS)
    big = payload(12 * MIB, 1)
    msg_id = producer.send(big)
    producer.send(b"after")
    got = consumer.receive(TIMEOUT_MS)
    assert got.data() == big
    print("sent id", msg_id, "got id", got.message_id())
    assert backlog(cluster, topic, "sub") == 4          # three chunk entries and one plain
    consumer.acknowledge(got)
    wait_for(lambda: backlog(cluster, topic, "sub") == 1, 30, "the chunked message's ack")
    nxt = consumer.receive(TIMEOUT_MS)
    assert nxt.data() == b"after"
    consumer.acknowledge(nxt)
    wait_for(lambda: backlog(cluster, topic, "sub") == 0, 30, "the plain message's ack")


# --- helpers: our client; a producer that stores only some chunks of a message ------------------

def ours(cluster):
    from pulsarlite.client.blocking import Client
    return Client(cluster.service_url, operation_timeout_seconds=30)


@pytest.fixture
def mine(cluster):
    """Our client for one test, closed after it (pass or fail)."""
    our_client = ours(cluster)
    try:
        yield our_client
    finally:
        our_client.close()


class ChunkWriter:
    """Writes chosen chunks of messages through our producer (chunking on), as a producer that
    dies between chunks would leave them: ``write(uuid_seq, payload, chunk_ids)``."""

    def __init__(self, client, topic: str, name: str) -> None:
        self.producer = client.create_producer(topic, producer_name=name, chunking_enabled=True,
                                               send_timeout_millis=TIMEOUT_MS)
        self.impl = self.producer._impl
        self.entries: dict[int, list[bytes]] = {}

    def entries_of(self, seq: int, payload: bytes) -> list[bytes]:
        import time
        from pulsarlite.wire.entry import Message, build_chunk_entries
        if seq not in self.entries:
            self.entries[seq] = build_chunk_entries(
                Message(payload), producer_name=self.impl.producer_name, sequence_id=seq,
                publish_time_ms=int(time.time() * 1000), entry_bytes_max=self.impl.max_message_size)
        return self.entries[seq]

    def write(self, seq: int, payload: bytes, chunk_ids) -> None:
        from pulsarlite.client.producer import _Op
        from pulsarlite.wire import commands as c
        entries = self.entries_of(seq, payload)
        impl = self.impl

        def enqueue():
            impl._next_seq = max(impl._next_seq, seq + 1)
            for i in chunk_ids:
                impl._enqueue(_Op(seq, seq, c.send_parts(impl.producer_id, seq, entries[i], is_chunk=True),
                                  [], 0, impl.loop.time(), False))
        self.producer._io.call(enqueue)
        self.producer.flush()


def official_consumer(client, topic, sub="sub", **kw):
    return client.subscribe(topic, sub, initial_position=pulsar.InitialPosition.Earliest, **kw)


def our_consumer(client, topic, sub="sub", **kw):
    from pulsarlite.client.types import InitialPosition
    return client.subscribe(topic, sub, initial_position=InitialPosition.Earliest, **kw)


# --- interop ------------------------------------------------------------------------------------

@pytest.mark.parametrize("compression", ["NONE", "LZ4"])
def test_official_producer_to_our_consumer(cluster, client, compression, mine):
    topic = f"persistent://public/default/chunk-off-to-ours-{compression}"
    consumer = our_consumer(mine, topic)
    producer = client.create_producer(topic, chunking_enabled=True, batching_enabled=False,
                                      compression_type=getattr(pulsar.CompressionType, compression),
                                      send_timeout_millis=TIMEOUT_MS)
    big = payload(12 * MIB, 2)
    sent = producer.send(big, properties={"p": "v"}, partition_key="key")
    got = consumer.receive(TIMEOUT_MS)
    assert got.data() == big
    assert got.properties() == {"p": "v"} and got.partition_key() == "key"
    mid = got.message_id()
    # the same id the official producer got: first chunk;last chunk
    assert str(mid).replace(",-1,-1", ",-1") == str(sent).replace(",-1,-1", ",-1") or \
        (mid.first_chunk_message_id().entry_id(), mid.entry_id()) == (0, 2)
    assert len(mid.chunk_message_ids()) == 3
    consumer.acknowledge(got)
    wait_for(lambda: backlog(cluster, topic, "sub") == 0, 30, "every chunk entry acked")


@pytest.mark.parametrize("compression", ["NONE", "ZSTD"])
def test_our_producer_to_official_consumer(cluster, client, compression, mine):
    from pulsarlite.client.types import CompressionType
    topic = f"persistent://public/default/chunk-ours-to-off-{compression}"
    consumer = official_consumer(client, topic)
    producer = mine.create_producer(topic, chunking_enabled=True,
                                    compression_type=getattr(CompressionType, compression),
                                    send_timeout_millis=TIMEOUT_MS)
    big = compressible(12 * MIB, 3)      # ZSTD: compressed far below the maximum
    sent = producer.send(big, properties={"p": "v"})
    producer.send(b"plain")
    assert sent.first_chunk_message_id() < sent.last_chunk_message_id()
    got = consumer.receive(TIMEOUT_MS)
    assert got.data() == big and got.properties() == {"p": "v"}
    assert str(got.message_id()) == "({},{},-1,-1);({},{},-1,-1)".format(
        *(sent.first_chunk_message_id().ledger_id(), sent.first_chunk_message_id().entry_id(),
          sent.ledger_id(), sent.entry_id()))
    consumer.acknowledge(got)
    assert consumer.receive(TIMEOUT_MS).data() == b"plain"
    wait_for(lambda: backlog(cluster, topic, "sub") == 1, 30, "the chunked message's ack")


@pytest.mark.parametrize("side", ["official", "ours"])
def test_chunks_of_two_producers_interleaved_with_plain_messages(cluster, client, side, mine):
    """Stored order: a0 b0 plain1 a1 b1 plain2 a2 b2: each consumer hands out plain1, plain2,
    then a and b (each when its last chunk arrives), every payload whole."""
    topic = f"persistent://public/default/chunk-interleaved-{side}"
    consumer = (official_consumer(client, topic) if side == "official" else our_consumer(mine, topic))
    a = ChunkWriter(mine, topic, "prod-a")
    b = ChunkWriter(mine, topic, "prod-b")
    plain = mine.create_producer(topic, batching_enabled=False)
    big_a, big_b = payload(11 * MIB, 4), payload(12 * MIB, 5)
    assert len(a.entries_of(0, big_a)) == len(b.entries_of(0, big_b)) == 3
    for i in range(3):
        a.write(0, big_a, [i])
        b.write(0, big_b, [i])
        if i < 2:
            plain.send(f"plain{i + 1}".encode())
    got = [consumer.receive(TIMEOUT_MS) for _ in range(4)]
    assert [m.data()[:6] for m in got[:2]] == [b"plain1", b"plain2"]
    assert got[2].data() == big_a and got[3].data() == big_b
    for m in got:
        consumer.acknowledge(m)
    wait_for(lambda: backlog(cluster, topic, "sub") == 0, 30, "every entry acked")


@pytest.mark.parametrize("side", ["official", "ours"])
def test_consumer_restart_mid_chunk_loses_nothing(cluster, client, side, mine):
    """The consumer holds two chunks of three when it closes; the last chunk is stored after;
    a new consumer gets the whole message (the held chunks were never acked)."""
    topic = f"persistent://public/default/chunk-restart-{side}"
    subscribe = (lambda: official_consumer(client, topic)) if side == "official" \
        else (lambda: our_consumer(mine, topic))
    consumer = subscribe()
    writer = ChunkWriter(mine, topic, "prod-r")
    big = payload(12 * MIB, 6)
    writer.write(0, big, [0, 1])
    with pytest.raises(Exception):
        consumer.receive(1000)          # two chunks: nothing to hand out
    consumer.close()
    writer.write(0, big, [2])
    consumer = subscribe()
    got = consumer.receive(TIMEOUT_MS)
    assert got.data() == big
    consumer.acknowledge(got)
    wait_for(lambda: backlog(cluster, topic, "sub") == 0, 30, "every chunk entry acked")


@pytest.mark.parametrize("side", ["official", "ours"])
def test_negative_ack_redelivers_the_whole_message(cluster, client, side, mine):
    topic = f"persistent://public/default/chunk-nack-{side}"
    if side == "official":
        consumer = official_consumer(client, topic, negative_ack_redelivery_delay_ms=100)
    else:
        consumer = our_consumer(mine, topic, negative_ack_redelivery_delay_ms=100)
    producer = mine.create_producer(topic, chunking_enabled=True, send_timeout_millis=TIMEOUT_MS)
    big = payload(11 * MIB, 7)
    producer.send(big)
    first = consumer.receive(TIMEOUT_MS)
    assert first.data() == big
    consumer.negative_acknowledge(first)
    again = consumer.receive(TIMEOUT_MS)
    assert again.data() == big and again.redelivery_count() >= 1
    consumer.acknowledge(again)
    wait_for(lambda: backlog(cluster, topic, "sub") == 0, 30, "every chunk entry acked")


def test_ours_redeliver_unacknowledged_sends_the_message_again(cluster, mine):
    topic = "persistent://public/default/chunk-redeliver-ours"
    consumer = our_consumer(mine, topic)
    producer = mine.create_producer(topic, chunking_enabled=True, send_timeout_millis=TIMEOUT_MS)
    big = payload(11 * MIB, 8)
    producer.send(big)
    assert consumer.receive(TIMEOUT_MS).data() == big
    consumer.redeliver_unacknowledged_messages()
    again = consumer.receive(TIMEOUT_MS)
    assert again.data() == big
    consumer.acknowledge_cumulative(again)       # the last chunk's id covers them all
    wait_for(lambda: backlog(cluster, topic, "sub") == 0, 30, "the cumulative ack")


# --- what cannot be reassembled (our consumer, Pulsar's rules) ----------------------------------

@pytest.mark.parametrize("expire_ms", [300, 0])
def test_incomplete_message_expires_and_is_acked(cluster, expire_ms, mine):
    """Two chunks of three, then a plain message: the plain one is delivered; with an expiry
    the two chunks are acked once it passes (backlog 0), without one they stay (backlog 2)."""
    import time
    topic = f"persistent://public/default/chunk-expire-{expire_ms}"
    consumer = our_consumer(mine, topic, expire_time_of_incomplete_chunked_message_ms=expire_ms)
    writer = ChunkWriter(mine, topic, "prod-e")
    writer.write(0, payload(12 * MIB, 9), [0, 1])
    mine.create_producer(topic, batching_enabled=False).send(b"plain")
    got = consumer.receive(TIMEOUT_MS)
    assert got.data() == b"plain"
    consumer.acknowledge(got)
    if expire_ms:
        wait_for(lambda: backlog(cluster, topic, "sub") == 0, 30, "the expired chunks' ack")
    else:
        wait_for(lambda: backlog(cluster, topic, "sub") == 2, 30, "the plain message's ack")
        time.sleep(1)
        assert backlog(cluster, topic, "sub") == 2


@pytest.mark.parametrize("auto_ack", [True, False])
def test_pending_queue_full_drops_the_oldest(cluster, auto_ack, mine):
    """max_pending_chunked_message=1: a second message's first chunk drops the first message
    (acked with auto_ack_oldest_chunked_message_on_queue_full, else left unacked); the second
    completes."""
    topic = f"persistent://public/default/chunk-full-{int(auto_ack)}"
    consumer = our_consumer(mine, topic, max_pending_chunked_message=1,
                            auto_ack_oldest_chunked_message_on_queue_full=auto_ack)
    a = ChunkWriter(mine, topic, "prod-fa")
    b = ChunkWriter(mine, topic, "prod-fb")
    big_a, big_b = payload(11 * MIB, 10), payload(11 * MIB, 11)
    a.write(0, big_a, [0])
    b.write(0, big_b, [0, 1, 2])
    a.write(0, big_a, [1, 2])
    got = consumer.receive(TIMEOUT_MS)
    assert got.data() == big_b
    consumer.acknowledge(got)
    # a's chunks 1 and 2 come without their first chunk (dropped unacked: just published)
    left = 2 if auto_ack else 3
    wait_for(lambda: backlog(cluster, topic, "sub") == left, 30, "the acks")


# --- deduplication: the chunks of one message share its sequence id --------------------------------

def admin(cluster, method: str, path: str, body: bytes | None = None) -> bytes:
    req = urllib.request.Request(cluster.admin_url + path, data=body, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read()


@pytest.mark.parametrize("producer_side", ["official", "ours"])
def test_chunked_messages_with_deduplication_on(cluster, client, producer_side, mine):
    """With deduplication on, every chunk is stored (Pulsar decides only the last chunk:
    apache/pulsar#20948); before, the chunks after the first were answered as duplicates of
    the first (same sequence id) and never stored: an acknowledged message lost."""
    namespace = f"public/chunk-dedup-{producer_side}"
    admin(cluster, "PUT", f"/admin/v2/namespaces/{namespace}", b"{}")
    admin(cluster, "POST", f"/admin/v2/namespaces/{namespace}/deduplication", b"true")
    topic = f"persistent://{namespace}/t"
    consumer = official_consumer(client, topic)
    if producer_side == "official":
        producer = client.create_producer(topic, producer_name="dedup-chunks", chunking_enabled=True,
                                          batching_enabled=False, send_timeout_millis=TIMEOUT_MS)
    else:
        producer = mine.create_producer(topic, producer_name="dedup-chunks", chunking_enabled=True,
                                        send_timeout_millis=TIMEOUT_MS)
    bigs = [payload(11 * MIB, 20 + i) for i in range(2)]
    for big in bigs:
        producer.send(big)
    producer.send(b"after")
    # every send acknowledged, nothing acked yet: the stored entries, counted while nothing
    # can change them (the consumer's acks are asynchronous: the official consumer groups
    # them for up to 100 ms, and the broker applies them after; a count taken after the
    # acks raced them, and was 7, 4 or 1)
    assert backlog(cluster, topic, "sub") == 7        # 2 x 3 chunk entries and one plain
    got = [consumer.receive(TIMEOUT_MS) for _ in range(len(bigs) + 1)]
    assert [m.data() for m in got] == [*bigs, b"after"]
    for m in got:
        consumer.acknowledge(m)
    wait_for(lambda: backlog(cluster, topic, "sub") == 0, 30, "every entry acked")


@pytest.mark.parametrize("side", ["official", "ours"])
def test_whole_message_resent_after_part_was_stored(cluster, client, side, mine):
    """Stored: c0 c1 (the first copy; the connection was lost before c2 and before their
    receipts), then the producer resends every pending chunk c0' c1' c2'. The broker answers
    c0' c1' with the stored copies' positions and stores c2' only (Pulsar's stores all five,
    which the official C++ consumer never hands out: "chunk id is invalid"): the topic holds
    c0 c1 c2', which both consumers join."""
    topic = f"persistent://public/default/chunk-resent-whole-{side}"
    our_consumer(mine, topic, sub="count").close()   # counts the stored entries (nothing acks there)
    consumer = official_consumer(client, topic) if side == "official" else our_consumer(mine, topic)
    writer = ChunkWriter(mine, topic, "prod-w")
    big = payload(12 * MIB, 50)
    writer.write(0, big, [0, 1])
    writer.write(0, big, [0, 1, 2])
    assert backlog(cluster, topic, "count") == 3      # c0 c1 c2': the resent c0' c1' not stored
    got = consumer.receive(TIMEOUT_MS)
    assert got.data() == big


def test_whole_message_resent_by_a_new_session_of_the_producer(cluster, client, mine):
    """The same, across a reconnect to the same broker: c0 c1 stored by one session of producer
    "prod-r", which then goes away; a new session of the same name resends the same bytes
    c0' c1' c2'. Only c2' is stored; the official consumer joins c0 c1 c2'."""
    topic = "persistent://public/default/chunk-resent-new-session"
    our_consumer(mine, topic, sub="count").close()
    consumer = official_consumer(client, topic)
    big = payload(12 * MIB, 51)
    first = ChunkWriter(mine, topic, "prod-r")
    first.write(0, big, [0, 1])
    first.producer.close()
    second = ChunkWriter(mine, topic, "prod-r")
    second.entries = first.entries              # a resend: the bytes the first session sent
    second.write(0, big, [0, 1, 2])
    assert backlog(cluster, topic, "count") == 3
    assert consumer.receive(TIMEOUT_MS).data() == big


def test_resent_chunks_with_other_bytes_are_stored(cluster, mine):
    """A resend whose chunks differ from the stored ones (here: another publish time) is never
    dropped: all five chunks are stored, as before, and our consumer hands the message out."""
    topic = "persistent://public/default/chunk-resent-other-bytes"
    our_consumer(mine, topic, sub="count").close()
    consumer = our_consumer(mine, topic)
    big = payload(12 * MIB, 52)
    writer = ChunkWriter(mine, topic, "prod-o")
    writer.write(0, big, [0, 1])
    from pulsarlite.wire.entry import Message, build_chunk_entries, peek_metadata
    stored_time_ms = peek_metadata(writer.entries[0][0]).raw.publish_time
    writer.entries[0] = build_chunk_entries(     # the same chunks, another publish time
        Message(big), producer_name=writer.impl.producer_name, sequence_id=0,
        publish_time_ms=stored_time_ms + 1, entry_bytes_max=writer.impl.max_message_size)
    writer.write(0, big, [0, 1, 2])
    assert backlog(cluster, topic, "count") == 5
    assert consumer.receive(TIMEOUT_MS).data() == big


async def test_aio_client_chunks_and_joins(cluster):
    """pulsarlite.aio: the same producer and consumer paths, as coroutines."""
    import pulsarlite.aio as pla
    from pulsarlite.client.types import ChunkMessageId, InitialPosition
    topic = "persistent://public/default/chunk-aio"
    async with pla.Client(cluster.service_url) as client:
        consumer = await client.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
        producer = await client.create_producer(topic, chunking_enabled=True)
        big = payload(11 * MIB, 30)
        sent = await producer.send(big)
        assert type(sent) is ChunkMessageId
        got = await consumer.receive(TIMEOUT_MS)
        assert got.data() == big and got.message_id() == sent
        assert got.message_id().first_chunk_message_id() == sent.first_chunk_message_id()
        await consumer.acknowledge(got)
    wait_for(lambda: backlog(cluster, topic, "sub") == 0, 30, "every chunk entry acked")


@pytest.mark.parametrize("side", ["official", "ours"])
def test_catch_up_consumer_gets_chunked_messages(cluster, client, side, mine):
    """The consumer connects after the chunks are stored (a catch-up read, not the tail)."""
    topic = f"persistent://public/default/chunk-catch-up-{side}"
    subscribe = (lambda: official_consumer(client, topic)) if side == "official" \
        else (lambda: our_consumer(mine, topic))
    subscribe().close()
    producer = client.create_producer(topic, chunking_enabled=True, batching_enabled=False,
                                      send_timeout_millis=TIMEOUT_MS)
    bigs = [payload(12 * MIB, 40 + i) for i in range(3)]
    for big in bigs:
        producer.send(big)
    consumer = subscribe()
    for big in bigs:
        got = consumer.receive(TIMEOUT_MS)
        assert got.data() == big
        consumer.acknowledge(got)
    wait_for(lambda: backlog(cluster, topic, "sub") == 0, 30, "every chunk entry acked")


def _write_buffer_closes(cluster) -> int:
    """Connections the broker closed for a full write buffer (its log; old and new wording)."""
    n = 0
    for log in (cluster.dir / "logs").glob("broker*.log"):
        text = log.read_text(errors="replace")
        n += text.count("write buffer above") + text.count("(client not reading)")
    return n


def test_catch_up_consumer_gets_large_plain_messages(cluster, client):
    """Back-pressure without chunks: 40 x 1 MiB stored, then an official consumer with a 1000
    message receiver queue connects; dispatch pauses while its connection's write buffer is above
    the high-water mark instead of piling 40 MiB into it (past the 16 MiB bound the broker closes
    the connection). All 40 arrive in order, on one connection (no close, one connectedSince)."""
    topic = "persistent://public/default/backpressure-plain-40x1mib"
    official_consumer(client, topic).close()
    producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=TIMEOUT_MS)
    bodies = [payload(1 * MIB, 100 + i) for i in range(40)]
    for body in bodies:
        producer.send(body)
    closes_before = _write_buffer_closes(cluster)
    consumer = official_consumer(client, topic, receiver_queue_size=1000)

    def connected_since():
        path = topic.replace("persistent://", "persistent/")
        with urllib.request.urlopen(f"{cluster.admin_url}/admin/v2/{path}/stats", timeout=30) as r:
            consumers = json.load(r)["subscriptions"]["sub"]["consumers"]
        return [c.get("connectedSince") for c in consumers]

    first = connected_since()
    for i, body in enumerate(bodies):
        got = consumer.receive(TIMEOUT_MS)
        assert got.data() == body, f"message {i} out of order or corrupt"
        consumer.acknowledge(got)
    wait_for(lambda: backlog(cluster, topic, "sub") == 0, 30, "every message acked")
    assert connected_since() == first and len(first) == 1
    assert _write_buffer_closes(cluster) == closes_before
    consumer.close()
