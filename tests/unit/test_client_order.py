"""A producer's messages are stored in its order, also after failed sends (CHAOS.md finding 4).

The pure queue (:class:`pulsarlite.client.core.PendingSends`, time passed in) and the asyncio
shell against a scripted broker (127.0.0.1, real sockets) that behaves as broker/topic.py does
when a write to the bookies fails: every write in flight fails, and a SEND arriving after the
failure is queued for the next ledger and stored; the client learns of the failure by a
SEND_ERROR, closes the connection and resends what is still pending after reconnecting.

The chaos run (seed 15, 3 bookies, --no-dedup) stored ``ours-1`` 352.. after 1848: the client's
send timeout failed only the expired head (..351), the broker failed everything in flight and
stored 1848 (sent just before the client saw the SEND_ERROR), then the client resent 352..1847.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

import pulsarlite.aio as pla
from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.client import core as k
from pulsarlite.errors import InvariantViolation
from pulsarlite.wire import commands as c
from pulsarlite.wire.frames import FrameDecoder

T = pb.BaseCommand
WAIT_S = 30   # generous bound of every wait (no timed assertions)


async def wait_until(predicate, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class LogBroker:
    """One topic's log. ``hold``: SENDs are kept unanswered (writes hanging on dead bookies);
    ``fail_held()`` fails them all (not stored, no answer yet) and stores what comes next;
    ``send_error(seq)`` answers SEND_ERROR on the newest connection. ``hold_producer``: PRODUCER
    requests after the first wait until ``release_producer()``."""

    def __init__(self) -> None:
        self.hold = False
        self.held: list[int] = []
        self.stored: list[int] = []          # sequence ids in log order
        self.connections = 0
        self.producer_requests = 0
        self.hold_producer = False
        self.producer_error: int | None = None   # refuse PRODUCER requests after the first
        self.close_on_register: set[int] = set()  # PRODUCER/SUBSCRIBE request numbers answered
        #                                            with SUCCESS and at once CLOSE_* (one write)
        self.subscribe_requests = 0
        self._held_producer: list[tuple] = []
        self._writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.url

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        self.server.close()
        for w in self._writers:
            w.close()

    def fail_held(self) -> None:
        self.held.clear()
        self.hold = False

    def send_error(self, producer_id: int, sequence_id: int,
                   error: int = pb.PersistenceError) -> None:
        self._writers[-1].write(c.send_error(producer_id, sequence_id, error,
                                             "scripted: the write to the bookies failed"))

    def receipt(self, producer_id: int, sequence_id: int) -> None:
        self._writers[-1].write(c.send_receipt(producer_id, sequence_id, 7, 999))

    def release_producer(self) -> None:
        held, self._held_producer = self._held_producer, []
        for writer, rid in held:
            writer.write(c.producer_success(rid, "p"))

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        self._writers.append(writer)
        decoder = FrameDecoder()
        try:
            while data := await reader.read(65536):
                for frame in decoder.feed(data):
                    cmd = frame.command
                    kind = cmd.type
                    if kind == T.CONNECT:
                        writer.write(c.connected("log-broker", 19))
                    elif kind == T.LOOKUP:
                        writer.write(c.lookup_response(cmd.lookupTopic.request_id, self.url))
                    elif kind == T.PARTITIONED_METADATA:
                        writer.write(c.partitioned_metadata_response(
                            cmd.partitionMetadata.request_id, 0))
                    elif kind == T.PRODUCER:
                        self.producer_requests += 1
                        if self.producer_requests in self.close_on_register:
                            writer.write(c.producer_success(cmd.producer.request_id, "p")
                                         + c.close_producer(cmd.producer.producer_id, 10**6))
                        elif self.producer_error is not None and self.producer_requests > 1:
                            writer.write(c.error(cmd.producer.request_id, self.producer_error,
                                                 "scripted refusal"))
                        elif self.hold_producer and self.producer_requests > 1:
                            self._held_producer.append((writer, cmd.producer.request_id))
                        else:
                            writer.write(c.producer_success(cmd.producer.request_id, "p"))
                    elif kind == T.SEND:
                        send = cmd.send
                        if self.hold:
                            self.held.append(send.sequence_id)
                        else:
                            self.stored.append(send.sequence_id)
                            writer.write(c.send_receipt(send.producer_id, send.sequence_id, 7,
                                                        len(self.stored)))
                    elif kind == T.SUBSCRIBE:
                        self.subscribe_requests += 1
                        sub = cmd.subscribe
                        if self.subscribe_requests in self.close_on_register:
                            writer.write(c.success(sub.request_id)
                                         + c.close_consumer(sub.consumer_id, 10**6))
                        else:
                            writer.write(c.success(sub.request_id))
                    elif kind == T.CLOSE_PRODUCER:
                        writer.write(c.success(cmd.close_producer.request_id))
                    elif kind == T.CLOSE_CONSUMER:
                        writer.write(c.success(cmd.close_consumer.request_id))
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def first_occurrences(log: list[int]) -> list[int]:
    seen: set[int] = set()
    out = []
    for seq in log:
        if seq not in seen:
            seen.add(seq)
            out.append(seq)
    return out


async def _results(futures) -> list:
    out = []
    for f in futures:
        try:
            await asyncio.wait_for(f, WAIT_S)
            out.append("ok")
        except pla.Timeout:
            out.append("timeout")
    return out


# ---------------------------------------------------------------------------------------------
# the shell against the scripted broker
# ---------------------------------------------------------------------------------------------

async def test_send_timeout_fails_every_pending_send_so_no_resend_lands_after_a_newer_message():
    """The seed-15 sequence. The client's send timeout hits the oldest sends while younger ones
    are pending; the broker then fails every write in flight and stores the next SEND; then its
    SEND_ERROR arrives. A client that failed only the expired sends resends the younger ones
    after that newer message (stored order 6, 3, 4, 5). Failing every pending send on the
    timeout (as the Java and C++ clients do) leaves nothing to resend."""
    broker = LogBroker()
    url = await broker.start()
    try:
        async with pla.Client(url, operation_timeout_seconds=10) as client:
            producer = await client.create_producer("t", batching_enabled=False,
                                                    send_timeout_millis=4_000)
            broker.hold = True
            futures = [await producer.send_async(f"m{i}".encode()) for i in range(3)]
            await asyncio.sleep(2.5)     # m3..m5 are younger than m0..m2 by 2.5 s
            futures += [await producer.send_async(f"m{i}".encode()) for i in range(3, 6)]
            await wait_until(lambda: len(broker.held) == 6, "six sends held")
            with pytest.raises(pla.Timeout):
                await asyncio.wait_for(futures[0], WAIT_S)   # the send timeout hits m0
            broker.fail_held()                               # the bookie write fails them all
            futures.append(await producer.send_async(b"m6"))
            await wait_until(lambda: 6 in broker.stored, "m6 stored")
            broker.send_error(producer._impl.producer_id, 0)   # the client learns of it
            await asyncio.wait_for(producer.flush(), WAIT_S)
            results = await _results(futures)
            await producer.close()
    finally:
        await broker.stop()
    assert broker.connections >= 2, "the SEND_ERROR made the client reconnect"
    stored = first_occurrences(broker.stored)
    assert stored == sorted(stored), f"stored out of the producer's order: {broker.stored}"
    assert results == ["timeout"] * 6 + ["ok"]
    assert producer._impl.pending_messages == 0


async def test_send_error_resends_everything_pending_in_order_before_new_sends():
    """No timeout involved: the broker fails the writes in flight and answers SEND_ERROR; the
    client reconnects and resends every pending send, oldest first, and a send issued while it
    reconnects goes out behind them."""
    broker = LogBroker()
    url = await broker.start()
    try:
        async with pla.Client(url, operation_timeout_seconds=10) as client:
            producer = await client.create_producer("t", batching_enabled=False,
                                                    send_timeout_millis=0)
            broker.hold = True
            broker.hold_producer = True
            futures = [await producer.send_async(f"m{i}".encode()) for i in range(4)]
            await wait_until(lambda: len(broker.held) == 4, "four sends held")
            broker.fail_held()
            broker.send_error(producer._impl.producer_id, 0)
            await wait_until(lambda: broker.producer_requests >= 2, "the producer re-registering")
            futures.append(await producer.send_async(b"m4"))    # while reconnecting
            broker.release_producer()
            await asyncio.wait_for(producer.flush(), WAIT_S)
            results = await _results(futures)
            await producer.close()
    finally:
        await broker.stop()
    assert broker.stored == [0, 1, 2, 3, 4]
    assert results == ["ok"] * 5


async def test_unexpected_receipt_makes_the_client_reconnect_and_resend():
    """A receipt ahead of the oldest pending send (the broker skipped one) closes the connection;
    everything pending is resent in order."""
    broker = LogBroker()
    url = await broker.start()
    try:
        async with pla.Client(url, operation_timeout_seconds=10) as client:
            producer = await client.create_producer("t", batching_enabled=False,
                                                    send_timeout_millis=0)
            broker.hold = True
            futures = [await producer.send_async(f"m{i}".encode()) for i in range(3)]
            await wait_until(lambda: len(broker.held) == 3, "three sends held")
            broker.fail_held()
            broker.receipt(producer._impl.producer_id, 1)      # skips 0
            await asyncio.wait_for(producer.flush(), WAIT_S)
            results = await _results(futures)
            await producer.close()
    finally:
        await broker.stop()
    assert broker.connections >= 2
    assert broker.stored == [0, 1, 2]
    assert results == ["ok"] * 3


async def test_batched_send_timeout_fails_the_open_batch_too():
    """With batching: the timeout fails the sent batches and the batch still being filled (its
    messages were handed over before the timeout, as in the official clients)."""
    broker = LogBroker()
    url = await broker.start()
    try:
        async with pla.Client(url, operation_timeout_seconds=10) as client:
            producer = await client.create_producer("t", batching_enabled=True,
                                                    batching_max_messages=2,
                                                    batching_max_publish_delay_ms=60_000,
                                                    send_timeout_millis=1_000)
            broker.hold = True
            futures = [await producer.send_async(f"m{i}".encode()) for i in range(3)]
            await wait_until(lambda: len(broker.held) == 1, "the first batch held")
            results = await _results(futures)
            assert producer._impl.pending_messages == 0
            broker.fail_held()
            ok = await producer.send_async(b"m3")
            await asyncio.wait_for(producer.flush(), WAIT_S)
            await asyncio.wait_for(ok, WAIT_S)
            await producer.close()
    finally:
        await broker.stop()
    assert results == ["timeout"] * 3
    assert broker.stored == [3]


async def test_send_errors_that_fail_one_or_all_keep_the_connection():
    """NotAllowedError fails that send only; TopicTerminatedError fails every pending send;
    neither reconnects (as Java's ClientCnx.handleSendError)."""
    broker = LogBroker()
    url = await broker.start()
    try:
        async with pla.Client(url, operation_timeout_seconds=10) as client:
            producer = await client.create_producer("t", batching_enabled=False,
                                                    send_timeout_millis=0)
            pid = producer._impl.producer_id
            broker.hold = True
            futures = [await producer.send_async(f"m{i}".encode()) for i in range(4)]
            await wait_until(lambda: len(broker.held) == 4, "four sends held")
            broker.send_error(pid, 1, pb.NotAllowedError)
            with pytest.raises(pla.BrokerError, match="NotAllowedError"):
                await asyncio.wait_for(futures[1], WAIT_S)
            assert producer._impl.pending_messages == 3
            broker.send_error(pid, 0, pb.TopicTerminatedError)
            for i in (0, 2, 3):
                with pytest.raises(pla.BrokerError, match="TopicTerminatedError"):
                    await asyncio.wait_for(futures[i], WAIT_S)
            assert producer._impl.pending_messages == 0
            await producer.close()
    finally:
        await broker.stop()
    assert broker.connections == 1


async def test_quota_refusal_on_reconnect_fails_pending_sends_then_recovers():
    """A PRODUCER refused with ProducerBlockedQuotaExceededError while reconnecting fails what
    is pending (in order) instead of holding it until the send timeout; the producer keeps
    retrying and sends again once the broker takes it."""
    broker = LogBroker()
    url = await broker.start()
    try:
        async with pla.Client(url, operation_timeout_seconds=10) as client:
            producer = await client.create_producer("t", batching_enabled=False,
                                                    send_timeout_millis=0)
            broker.hold = True
            order: list[int] = []
            futures = [await producer.send_async(f"m{i}".encode(),
                                                 lambda res, mid, i=i: order.append(i))
                       for i in range(3)]
            await wait_until(lambda: len(broker.held) == 3, "three sends held")
            broker.fail_held()
            broker.producer_error = pb.ProducerBlockedQuotaExceededError
            broker.send_error(producer._impl.producer_id, 0)
            for f in futures:
                with pytest.raises(pla.BrokerError, match="ProducerBlockedQuotaExceededError"):
                    await asyncio.wait_for(f, WAIT_S)
            assert order == [0, 1, 2]
            broker.producer_error = None
            await asyncio.wait_for(producer.send(b"m3"), WAIT_S)
            await producer.close()
    finally:
        await broker.stop()
    assert broker.stored == [3]


async def test_close_producer_in_the_same_read_as_producer_success_registers_again():
    """The broker unloads the topic right after accepting the re-registration: PRODUCER_SUCCESS
    and CLOSE_PRODUCER arrive in one read. The registration is void; the producer registers
    again and its pending sends go out (a chaos run left ``ours-1`` writing to a producer id the
    broker had dropped, unanswered, for the rest of the run)."""
    broker = LogBroker()
    broker.close_on_register = {2}
    url = await broker.start()
    try:
        async with pla.Client(url, operation_timeout_seconds=10) as client:
            producer = await client.create_producer("t", batching_enabled=False,
                                                    send_timeout_millis=0)
            broker.hold = True
            futures = [await producer.send_async(f"m{i}".encode()) for i in range(3)]
            await wait_until(lambda: len(broker.held) == 3, "three sends held")
            broker.fail_held()
            broker.send_error(producer._impl.producer_id, 0)
            await wait_until(lambda: broker.producer_requests >= 3, "a third PRODUCER")
            results = await _results(futures)
            await producer.close()
    finally:
        await broker.stop()
    assert results == ["ok"] * 3
    assert broker.stored == [0, 1, 2]


async def test_close_consumer_in_the_same_read_as_subscribe_success_subscribes_again():
    broker = LogBroker()
    broker.close_on_register = {1}
    url = await broker.start()
    try:
        async with pla.Client(url, operation_timeout_seconds=10) as client:
            consumer = await client.subscribe("t", "sub")
            await wait_until(lambda: broker.subscribe_requests >= 2, "a second SUBSCRIBE")
            await wait_until(lambda: consumer._impl.conn is not None, "the consumer connected")
            assert consumer._impl.conn.consumers.get(consumer._impl.consumer_id) \
                is consumer._impl
            await consumer.close()
    finally:
        await broker.stop()


# ---------------------------------------------------------------------------------------------
# the pure queue (time passed in)
# ---------------------------------------------------------------------------------------------

@dataclass
class Op:
    first_seq: int
    last_seq: int
    created_s: float


def test_pending_sends_receipts_in_order_stale_and_unexpected():
    q = k.PendingSends(30)
    for seq in range(3):
        q.append(Op(seq, seq, float(seq)))
    assert q.on_receipt(0) == (k.ReceiptVerdict.ACKED, Op(0, 0, 0.0))
    assert q.on_receipt(0) == (k.ReceiptVerdict.STALE, None)     # a duplicate
    assert q.on_receipt(2) == (k.ReceiptVerdict.UNEXPECTED, None)
    assert [op.first_seq for op in q] == [1, 2]                    # unchanged: resend 1, 2
    assert q.on_receipt(1)[0] is k.ReceiptVerdict.ACKED
    assert q.on_receipt(2)[0] is k.ReceiptVerdict.ACKED
    assert q.on_receipt(5) == (k.ReceiptVerdict.STALE, None)     # nothing pending
    assert not q


def test_pending_sends_timeout_fails_everything_pending_in_order():
    q = k.PendingSends(10)
    q.append(Op(0, 4, 0.0))        # a batch of 5
    q.append(Op(5, 5, 6.0))
    q.append(Op(6, 6, 9.5))
    assert q.deadline_s() == 10.0
    assert q.expire(9.99) == []
    expired = q.expire(10.0)
    assert [op.first_seq for op in expired] == [0, 5, 6]   # the young ones too, oldest first
    assert len(q) == 0 and q.deadline_s() is None
    assert q.on_receipt(5) == (k.ReceiptVerdict.STALE, None)   # late receipt of a failed send
    q.append(Op(7, 7, 11.0))
    assert q.deadline_s() == 21.0


def test_pending_sends_without_timeout_never_expire():
    q = k.PendingSends(0)
    q.append(Op(0, 0, 0.0))
    assert q.expire(1e9) == [] and q.deadline_s() is None
    with pytest.raises(ValueError):
        k.PendingSends(-1)


def test_pending_sends_remove_one_and_order_invariant():
    q = k.PendingSends(10)
    q.append(Op(0, 0, 1.0))
    q.append(Op(1, 1, 2.0))
    assert q.remove(1) == Op(1, 1, 2.0) and q.remove(7) is None
    with pytest.raises(InvariantViolation):
        q.append(Op(2, 2, 0.5))    # created before the op queued ahead of it


def test_send_error_actions_and_refusals():
    assert k.send_error_action(pb.ChecksumError) is k.SendErrorAction.FAIL_ONE
    assert k.send_error_action(pb.NotAllowedError) is k.SendErrorAction.FAIL_ONE
    assert k.send_error_action(pb.TopicTerminatedError) is k.SendErrorAction.FAIL_ALL
    for error in (pb.PersistenceError, pb.ServiceNotReady, pb.UnknownError, pb.TopicNotFound):
        assert k.send_error_action(error) is k.SendErrorAction.RECONNECT
    assert k.refusal_fails_pending(pb.ProducerBlockedQuotaExceededError)
    assert k.refusal_fails_pending(pb.TopicTerminatedError)
    assert not k.refusal_fails_pending(pb.ProducerBusy)
    assert not k.refusal_fails_pending(pb.ServiceNotReady)


def test_simulated_failed_write_race_keeps_order():
    """A deterministic model of the seed-15 run on the pure queue: time runs in steps of 20 ms
    (50 msg/s), the broker holds every send from t=0 to t=30 s (dead bookies), then fails all
    of them and stores the next send before the client sees the SEND_ERROR. Whatever the client
    resends afterwards must not be older than what the broker stored."""
    q = k.PendingSends(30)
    stored: list[int] = []
    seq = 0
    now = 0.0
    while now < 30.0:              # every send is held by the broker
        q.append(Op(seq, seq, now))
        seq += 1
        now = round(now + 0.02, 2)
    expired = q.expire(now)        # the send timeout hits the oldest ones
    q.append(Op(seq, seq, now))    # the next send: the broker stores it (next ledger)
    stored.append(seq)
    resent = [op.first_seq for op in q]   # SEND_ERROR: reconnect, resend what is pending
    stored.extend(resent)
    assert len(expired) == seq     # everything held failed
    assert first_occurrences(stored) == sorted(first_occurrences(stored))
