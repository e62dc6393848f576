"""The broker's limits with the official client against real processes (docs/architecture.md#style):

- back-pressure: a producer faster than the bookies fills the broker's publish buffer; the broker
  pauses reading from its connection instead of buffering, every send is still acknowledged,
  nothing is lost, and the broker's memory stays bounded;
- catch-up: a backlog written over many ledgers (small rollover) and evicted from a small entry
  cache is read back from the bookies, in order, across ledger boundaries;
- oversized messages are refused to their producer only; everyone else keeps working.

No timing assertions: every wait is bounded, every client closed."""

from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
import urllib.request

import pytest

from integration.helpers import rss_bytes, wait_for

pulsar = pytest.importorskip("pulsar")

from pulsarlite.config import KiB  # noqa: E402
from pulsarlite.wire import commands as c  # noqa: E402
from pulsarlite.wire import pb  # noqa: E402
from pulsarlite.wire.entry import Message, build_entry  # noqa: E402
from pulsarlite.wire.frames import FRAME_PADDING_BYTES, FrameDecoder  # noqa: E402

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000
MiB = 1024 * KiB


# -- helpers ------------------------------------------------------------------------------------
def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def metric(cluster, name: str) -> float:
    """Sum of the samples named ``name`` on the first broker's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families
    total = 0.0
    for family in text_string_to_metric_families(http_get(cluster.admin_url + "/metrics")):
        for sample in family.samples:
            if sample.name == name:
                total += sample.value
    return total


def internal_stats(cluster, topic: str) -> dict:
    path = topic.split("://", 1)[1]
    return json.loads(http_get(f"{cluster.admin_url}/admin/v2/persistent/{path}/internalStats"))


def broker_pid(cluster) -> int:
    record = cluster.records[cluster.broker_names[0]]
    assert record.alive(), "the broker is not running"
    return record.pid


class RssSampler:
    """Peak RSS of a process, sampled from a thread until stopped."""

    def __init__(self, pid: int, interval_s: float = 0.02) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except (OSError, AssertionError):
                return
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class AsyncSends:
    """Callbacks of send_async: results and message ids by index."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.lock = threading.Lock()
        self.results: dict[int, tuple[object, object]] = {}

    def callback(self, i: int):
        def done(res, msg_id) -> None:
            with self.lock:
                self.results[i] = (res, msg_id)
        return done

    def all_done(self) -> bool:
        with self.lock:
            return len(self.results) == self.n


def start_cluster(cluster_factory, **broker_overrides):
    """Three bookies and one broker with these BrokerConfig fields."""
    return cluster_factory(3, brokers=1, broker_overrides=broker_overrides)


@pytest.fixture
def clients():
    """Official clients made with ``make(url)``; every one is closed at teardown."""
    made = []

    def make(url: str, **kwargs):
        client = pulsar.Client(url, operation_timeout_seconds=30, **kwargs)
        made.append(client)
        return client

    try:
        yield make
    finally:
        for client in made:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing the others matters more
                pass


# -- 1. back-pressure ---------------------------------------------------------------------------
BP_MESSAGE_BYTES = 32 * KiB
BP_MESSAGES = 2_500                     # ~80 MiB in total through a 512 KiB publish buffer


def bp_payload(i: int, block: bytes) -> bytes:
    return f"{i:08d}|".encode() + block


def test_publish_back_pressure(cluster_factory, clients):
    cluster = start_cluster(cluster_factory, message_bytes_max=128 * KiB,
                            publish_buffer_bytes_max=512 * KiB, entry_cache_bytes_max=1 * MiB)
    client = clients(cluster.service_url)
    topic = "persistent://public/default/limits-back-pressure"
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True,
                                      max_pending_messages=BP_MESSAGES, send_timeout_millis=60_000)
    block = hashlib.sha256(b"block").digest() * (BP_MESSAGE_BYTES // 32)
    pid = broker_pid(cluster)
    baseline = rss_bytes(pid)
    pauses_before = metric(cluster, "pulsarlite_publish_buffer_pauses_total")
    sends = AsyncSends(BP_MESSAGES)
    with RssSampler(pid) as rss:
        for i in range(BP_MESSAGES):
            producer.send_async(bp_payload(i, block), sends.callback(i))
        producer.flush()
        wait_for(sends.all_done, 60, "every send_async callback")
    total_sent = BP_MESSAGES * BP_MESSAGE_BYTES

    failed = {i: str(res) for i, (res, _) in sends.results.items() if res != pulsar.Result.Ok}
    assert not failed, f"{len(failed)} sends failed, e.g. {list(failed.items())[:3]}"
    ids = [(m.ledger_id(), m.entry_id()) for _, (_, m) in sorted(sends.results.items())]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)

    # the broker paused the producer's connection instead of buffering ...
    pauses = metric(cluster, "pulsarlite_publish_buffer_pauses_total") - pauses_before
    assert pauses > 0, "the publish buffer never paused the producer"
    assert metric(cluster, "pulsarlite_publish_buffer_size_bytes") == 0     # all released
    # ... so its memory grew by far less than what went through it (generous bound)
    grown = rss.peak - baseline
    assert grown < total_sent // 4, (
        f"broker RSS grew by {grown / MiB:.1f} MiB (baseline {baseline / MiB:.1f} MiB) while "
        f"{total_sent / MiB:.1f} MiB went through a 0.5 MiB publish buffer")
    producer.close()

    # nothing lost, in order
    consumer = client.subscribe(topic, "check", initial_position=pulsar.InitialPosition.Earliest,
                                receiver_queue_size=100)
    for i in range(BP_MESSAGES):
        m = consumer.receive(timeout_millis=TIMEOUT_MS)
        assert m.data() == bp_payload(i, block), f"message {i}: got {m.data()[:9]!r}..."
        consumer.acknowledge(m)
    with pytest.raises(Exception, match="(?i)timeout"):
        consumer.receive(timeout_millis=500)
    consumer.close()


# -- 2. catch-up across rollovers ---------------------------------------------------------------
CU_MESSAGES = 2_000
CU_ROLLOVER_ENTRIES = 100


def test_catch_up_read_across_rollovers(cluster_factory, clients):
    cluster = start_cluster(cluster_factory, rollover_entries_max=CU_ROLLOVER_ENTRIES,
                            entry_cache_bytes_max=16 * KiB)     # the backlog cannot stay cached
    client = clients(cluster.service_url)
    topic = "persistent://public/default/limits-catch-up"
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True,
                                      max_pending_messages=CU_MESSAGES)
    payloads = [f"catch-up-{i:06d}-".encode() * 8 for i in range(CU_MESSAGES)]
    sends = AsyncSends(CU_MESSAGES)
    for i, p in enumerate(payloads):
        producer.send_async(p, sends.callback(i))
    producer.flush()
    wait_for(sends.all_done, 60, "every send_async callback")
    assert all(res == pulsar.Result.Ok for res, _ in sends.results.values())
    producer.close()
    misses_before = metric(cluster, "pulsarlite_entry_cache_misses_total")

    consumer = client.subscribe(topic, "late", initial_position=pulsar.InitialPosition.Earliest,
                                receiver_queue_size=200)
    got = []
    for _ in range(CU_MESSAGES):
        m = consumer.receive(timeout_millis=TIMEOUT_MS)
        got.append((m.data(), m.message_id().ledger_id(), m.message_id().entry_id()))
        consumer.acknowledge(m)
    with pytest.raises(Exception, match="(?i)timeout"):
        consumer.receive(timeout_millis=500)
    consumer.close()

    assert [d for d, _, _ in got] == payloads
    positions = [(ledger, entry) for _, ledger, entry in got]
    assert positions == sorted(positions)
    by_ledger: dict[int, list[int]] = {}
    for ledger, entry in positions:
        by_ledger.setdefault(ledger, []).append(entry)
    assert len(by_ledger) >= CU_MESSAGES // CU_ROLLOVER_ENTRIES // 2, sorted(by_ledger)
    for ledger, entries in by_ledger.items():      # entry ids restart at 0 in every ledger
        assert entries == list(range(len(entries))), (ledger, entries[:5], len(entries))
        assert len(entries) <= CU_ROLLOVER_ENTRIES, (ledger, len(entries))
    # read from the bookies, not the cache
    assert metric(cluster, "pulsarlite_entry_cache_misses_total") - misses_before >= CU_MESSAGES // 2

    stats = internal_stats(cluster, topic)
    listed = {info["ledgerId"]: info["entries"] for info in stats["ledgers"]}
    assert set(by_ledger) <= set(listed), (sorted(by_ledger), sorted(listed))
    for ledger, entries in by_ledger.items():
        assert listed[ledger] == len(entries), (ledger, listed[ledger], len(entries))
    assert sum(listed.values()) == CU_MESSAGES
    assert stats["numberOfEntries"] == CU_MESSAGES


# -- 3. oversized messages ----------------------------------------------------------------------
MAX_MESSAGE = 64 * KiB


def recv_frames(sock: socket.socket, decoder: FrameDecoder, timeout_s: float = 10) -> list:
    """Frames until the peer closes (or the timeout)."""
    frames = []
    sock.settimeout(timeout_s)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            frames.extend(decoder.feed(data))
    except OSError:
        pass
    return frames


def test_oversized_message_refused_to_its_producer_only(cluster_factory, clients):
    cluster = start_cluster(cluster_factory, message_bytes_max=MAX_MESSAGE)
    client = clients(cluster.service_url)
    topic = "persistent://public/default/limits-oversized"
    other_topic = "persistent://public/default/limits-bystander"
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    bystander_consumer = client.subscribe(other_topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    big = client.create_producer(topic, batching_enabled=False)
    bystander = clients(cluster.service_url).create_producer(other_topic, batching_enabled=False)

    bystander.send(b"bystander-before")
    big.send(b"small-before")
    # the client learnt the max size from CONNECTED: the error is the producer's, sync and async
    with pytest.raises(pulsar.MessageTooBig):
        big.send(b"x" * (MAX_MESSAGE + 1024))
    results = []
    big.send_async(b"y" * (2 * MAX_MESSAGE), lambda res, _id: results.append(res))
    wait_for(lambda: results, 15, "the oversized send_async callback")
    assert results == [pulsar.Result.MessageTooBig]

    # a client that does not check (raw frames): the broker's own limit is on the frame (max
    # message size + padding for the command, as Pulsar's); it answers ERROR, closes only that
    # connection, and stays up
    port = int(cluster.service_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        decoder = FrameDecoder(16 * MiB)
        raw.sendall(c.connect("raw-test", 19))
        raw.sendall(c.producer(topic, 1, 1))
        entry = build_entry(Message(payload=b"z" * (MAX_MESSAGE + FRAME_PADDING_BYTES + 4 * KiB)), producer_name="raw",
                            sequence_id=0, publish_time_ms=int(time.time() * 1000))
        frames = []
        raw.settimeout(10)
        while not any(f.type == pb.BaseCommand.PRODUCER_SUCCESS for f in frames):
            data = raw.recv(65536)
            assert data, f"connection closed before PRODUCER_SUCCESS: {[f.type for f in frames]}"
            frames.extend(decoder.feed(data))
        try:
            raw.sendall(c.send(1, 0, entry))
        except OSError:
            pass        # the broker may close while we still write
        frames = recv_frames(raw, decoder)
    types = [f.type for f in frames]
    assert pb.BaseCommand.SEND_RECEIPT not in types, types
    errors = [f.command.error for f in frames if f.type == pb.BaseCommand.ERROR]
    assert errors and errors[0].error == pb.NotAllowedError, types

    # the producer that was refused, the bystanders and the broker all keep working
    big.send(b"small-after")
    bystander.send(b"bystander-after")
    got = [consumer.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(2)]
    assert got == [b"small-before", b"small-after"]
    got = [bystander_consumer.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(2)]
    assert got == [b"bystander-before", b"bystander-after"]
    with pytest.raises(Exception, match="(?i)timeout"):
        consumer.receive(timeout_millis=500)
    assert cluster.records[cluster.broker_names[0]].alive()
    for closable in (big, bystander, consumer, bystander_consumer):
        closable.close()
