"""[compat] issue 32 item 3: the maximum message size agrees along the whole path (client,
broker, bookies), with the official Python client (pulsar-client 3.x, C++ core) against real
ZooKeeper, bookie and broker processes.

Reference behaviour (Pulsar): the broker advertises ``maxMessageSize`` in CONNECTED; the
clients refuse a message whose payload is above it themselves (``MessageTooBig``) and send
anything up to it; the broker's frame limit is that maximum plus a padding for the command and
the metadata (``Commands.MESSAGE_SIZE_FRAME_PADDING``), and its bookies accept a frame of that
size (standalone's ``nettyMaxFrameSizeBytes``), so a message the client sends is stored. A
message the broker itself refuses gets SEND_ERROR(NotAllowedError, "Exceed maximum message
size") (PersistentTopic.publishMessage); the connection stays open.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

import pytest

from bookie.client.ledger_client import LedgerClient
from pulsarlite.config import LedgerClientConfig
from pulsarlite.errors import BadRequestError
from pulsarlite.wire import commands as c
from pulsarlite.wire import pb
from pulsarlite.wire.entry import Message, build_entry
from pulsarlite.wire.frames import FRAME_PADDING_BYTES, FrameDecoder

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 30_000
MESSAGE_BYTES_MAX = 5 * 1024 * 1024          # BrokerConfig.message_bytes_max (default, advertised)


def ledger_metadata(cluster, ledger_id: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "pulsarlite", "bookkeeper", "--zookeeper", cluster.zookeeper,
                           "ledgermetadata", str(ledger_id)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def default_cluster(module_cluster_factory):
    """The default configuration's cluster, shared by the tests that need nothing else (each
    uses its own topics and ledgers; none stops a process)."""
    return module_cluster_factory(3, brokers=1, name="default")


@pytest.mark.parametrize("batching", [False, True])
def test_message_at_the_advertised_max_is_stored_and_one_above_fails_clearly(default_cluster, batching):
    """A payload of exactly the advertised maximum (with properties: the metadata adds to the
    entry) is stored and consumed; one byte more fails in the client with MessageTooBig and the
    producer keeps working; no bookie of the ledger was replaced (one fragment, nothing
    under-replicated): the bookies never refused an entry."""
    cluster = default_cluster
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        topic = f"persistent://public/default/size-max-{int(batching)}"
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=batching, batching_max_publish_delay_ms=5,
                                          send_timeout_millis=TIMEOUT_MS)
        props = {"k": "v" * 2000}
        pattern = bytes(range(256)) * (MESSAGE_BYTES_MAX // 256)
        # the client counts the metadata too: the largest payload it sends is found by
        # descending from the maximum, 32 bytes a step, then one (a refusal is the client's own:
        # nothing is sent); both messages found are stored
        sent = []
        size = MESSAGE_BYTES_MAX
        for step in (32, 1):
            refused = 0
            while True:
                try:
                    sent.append((producer.send(pattern[:size], properties=props), pattern[:size]))
                    break
                except pulsar.MessageTooBig:
                    refused += 1
                    size -= step
                    assert refused < 1_000, "the client refuses every size near the maximum"
            assert refused > 0 or step == 1
            size += step - 1     # the next pass starts just below the last size refused
        big = sent[-1][1]
        with pytest.raises(pulsar.MessageTooBig):   # one byte more than the largest sent
            producer.send(big + b"x", properties=props)
        last = producer.send(b"small")
        got = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(len(sent) + 1)]
        assert [m.data() for m in got] == [data for _, data in sent] + [b"small"]
        assert all(m.properties() == props for m in got[:-1])
        for ledger_id in {msg_id.ledger_id() for msg_id, _ in sent} | {last.ledger_id()}:
            md = ledger_metadata(cluster, ledger_id)
            assert len(md["ensembles"]) == 1, md
            assert not md.get("under_replicated_bookies"), md
    finally:
        client.close()


def read_until(sock: socket.socket, decoder, want, timeout_s: float = 15) -> list:
    """Frames until one whose type is ``want`` arrived (AssertionError if the peer closes)."""
    frames: list = []
    sock.settimeout(timeout_s)
    while not any(f.type == want for f in frames):
        data = sock.recv(65536)
        assert data, f"connection closed by the broker, frames: {[pb.BaseCommand.Type.Name(f.type) for f in frames]}"
        frames.extend(decoder.feed(data))
    return frames


def test_payload_above_the_maximum_gets_send_error_and_the_connection_keeps_working(cluster_factory):
    """A client that does not check (raw frames): a SEND whose payload is one byte above the
    advertised maximum, in a frame within the broker's frame limit, is answered with
    SEND_ERROR(NotAllowedError) as Pulsar's "Exceed maximum message size"; the connection, the
    producer and the topic keep working (the next SEND gets its receipt)."""
    message_max = 64 * 1024
    cluster = cluster_factory(3, brokers=1, broker_overrides={"message_bytes_max": message_max})
    port = int(cluster.service_url.rsplit(":", 1)[1])
    topic = "persistent://public/default/size-raw"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        decoder = FrameDecoder(16 * 1024 * 1024)
        raw.sendall(c.connect("raw-test", 19))
        raw.sendall(c.producer(topic, 1, 1))
        read_until(raw, decoder, pb.BaseCommand.PRODUCER_SUCCESS)

        def entry(payload: bytes, sequence_id: int) -> bytes:
            return build_entry(Message(payload=payload), producer_name="raw", sequence_id=sequence_id,
                               publish_time_ms=int(time.time() * 1000))

        too_big = entry(b"z" * (message_max + 1), 0)
        assert len(c.send(1, 0, too_big)) < message_max + FRAME_PADDING_BYTES   # within the frame limit
        raw.sendall(c.send(1, 0, too_big))
        frames = read_until(raw, decoder, pb.BaseCommand.SEND_ERROR)
        [error] = [f.command.send_error for f in frames if f.type == pb.BaseCommand.SEND_ERROR]
        assert error.sequence_id == 0 and error.error == pb.NotAllowedError
        assert "Exceed maximum message size" in error.message
        raw.sendall(c.send(1, 1, entry(b"y" * message_max, 1)))        # exactly the maximum: stored
        frames = read_until(raw, decoder, pb.BaseCommand.SEND_RECEIPT)
        [receipt] = [f.command.send_receipt for f in frames if f.type == pb.BaseCommand.SEND_RECEIPT]
        assert receipt.sequence_id == 1 and receipt.message_id.entryId == 0
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"y" * message_max
    finally:
        client.close()


async def test_bookie_too_large_fails_the_add_and_replaces_no_bookie(cluster_factory):
    """Bookies whose entry_bytes_max is below an entry (a misconfiguration the launcher
    refuses; written here through the ledger client directly): every bookie answers TOO_LARGE,
    the add fails at once with a non-retriable BadRequestError, and no ensemble change happened
    (one fragment, no under-replicated bookie); the next ledger takes entries as before."""
    cluster = await asyncio.to_thread(cluster_factory, 3, bookie_overrides={"entry_bytes_max": 64 * 1024,
                                                                           "request_bytes_max": 1024 * 1024})
    client = await LedgerClient.connect(LedgerClientConfig(zookeeper=cluster.zookeeper))
    try:
        writer = await client.create_ledger(3, 3, 2)
        assert await writer.add(b"small") == 0
        with pytest.raises(BadRequestError) as failed:
            await writer.add(b"x" * (64 * 1024 + 1))
        assert not failed.value.retriable and "too large" in str(failed.value)
        md = (await asyncio.to_thread(ledger_metadata, cluster, writer.ledger_id))
        assert len(md["ensembles"]) == 1 and not md.get("under_replicated_bookies"), md
        closed = await writer.close()
        assert closed.last_entry_id == 0
        writer = await client.create_ledger(3, 3, 2)
        assert await writer.add(b"after") == 0
        await writer.close()
    finally:
        await client.close()


@pytest.mark.parametrize("batching,compression", [(False, "NONE"), (True, "NONE"), (True, "LZ4")])
def test_our_client_sends_a_message_of_the_advertised_max(default_cluster, batching, compression):
    """Our client counts the payload only (as the Go client): a payload of exactly the maximum
    is sent, alone or as a batch of one, compressed or not (a batch's framing adds a few bytes:
    a batch is bounded by the frame limit only, as in Pulsar), stored and consumed; one byte
    more is MessageTooBig."""
    import pulsarlite
    cluster = default_cluster
    client = pulsarlite.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        topic = f"persistent://public/default/size-ours-{int(batching)}-{compression.lower()}"
        consumer = client.subscribe(topic, "sub", initial_position=pulsarlite.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=batching, batching_max_publish_delay_ms=5,
                                          send_timeout_millis=TIMEOUT_MS,
                                          compression_type=getattr(pulsarlite.CompressionType, compression))
        big = b"q" * MESSAGE_BYTES_MAX
        msg_id = producer.send(big)
        with pytest.raises(pulsarlite.MessageTooBig):
            producer.send(big + b"x")
        producer.send(b"small")
        assert [consumer.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(2)] == [big, b"small"]
        md = ledger_metadata(cluster, msg_id.ledger_id())
        assert len(md["ensembles"]) == 1 and not md.get("under_replicated_bookies"), md
    finally:
        client.close()


@pytest.mark.parametrize("compression", ["LZ4", "ZSTD"])
def test_a_compressed_message_above_the_max_whose_compressed_size_fits_is_stored(default_cluster, compression):
    """The official producer decides "too big" on the COMPRESSED size: a compressible 6 MiB
    message (compressed far below 5 MiB) goes as one SEND declaring 6 MiB uncompressed. Pulsar's
    broker takes it (it checks the frame only); ours refused it ("declared uncompressed size ...
    is outside [0, frame size]") and the official producer, which resends on every SendError but
    ChecksumError, resent it for ever (its send timeout never fired: the test hung). Now it is stored; the official
    consumer (its check is on the compressed payload size, ConsumerImpl::uncompressMessageIfNeeded)
    and ours both deliver it."""
    import pulsarlite
    cluster = default_cluster
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    ours = pulsarlite.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        topic = f"persistent://public/default/size-compressed-above-max-{compression.lower()}"
        consumer = client.subscribe(topic, "official", initial_position=pulsar.InitialPosition.Earliest)
        our_consumer = ours.subscribe(topic, "ours", initial_position=pulsarlite.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=TIMEOUT_MS,
                                          compression_type=getattr(pulsar.CompressionType, compression))
        big = bytes(range(256)) * (6 * 1024 * 1024 // 256)
        assert len(big) > MESSAGE_BYTES_MAX
        msg_id = producer.send(big)
        producer.send(b"small")
        assert [consumer.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(2)] == [big, b"small"]
        assert [our_consumer.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(2)] == [big, b"small"]
        md = ledger_metadata(cluster, msg_id.ledger_id())
        assert len(md["ensembles"]) == 1 and not md.get("under_replicated_bookies"), md
    finally:
        ours.close()
        client.close()
