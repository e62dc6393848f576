"""The client's asyncio shell against a scripted fake broker (127.0.0.1, real sockets): lookup
redirects, resend with the same sequence ids after a dropped connection, broker errors as typed
exceptions, keepalive PING answered."""

from __future__ import annotations

import asyncio

import pytest

import pulsarlite.aio as pla
from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.wire import commands as c
from pulsarlite.wire.entry import unpack_entry
from pulsarlite.wire.frames import FrameDecoder

T = pb.BaseCommand


class FakeBroker:
    """Answers CONNECT, LOOKUP (redirecting once to ``redirect_to`` if set), PARTITIONED_METADATA,
    PRODUCER, SUBSCRIBE; records SENDs; ``drop_after_sends`` closes the first connection after
    that many SENDs without answering them."""

    def __init__(self, *, drop_after_sends: int | None = None, subscribe_error=None,
                 answer_sends: bool = True) -> None:
        self.answer_sends = answer_sends
        self.sends: list[tuple[int, int, bytes]] = []   # (connection number, sequence id, entry)
        self.drop_after_sends = drop_after_sends
        self.subscribe_error = subscribe_error
        self.connections = 0
        self.redirect_to: str | None = None
        self.lookups = 0
        self.pongs = 0
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"pulsar://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        self.server.close()

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        number = self.connections
        decoder = FrameDecoder()
        try:
            while data := await reader.read(65536):
                for frame in decoder.feed(data):
                    cmd = frame.command
                    kind = cmd.type
                    if kind == T.CONNECT:
                        writer.write(c.connected("fake", 19))
                        writer.write(c.ping())
                    elif kind == T.PONG:
                        self.pongs += 1
                    elif kind == T.LOOKUP:
                        self.lookups += 1
                        body = cmd.lookupTopic
                        if self.redirect_to and not body.authoritative:
                            writer.write(c.lookup_response(body.request_id, self.redirect_to,
                                                           redirect=True, authoritative=True))
                        else:
                            own = f"pulsar://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
                            writer.write(c.lookup_response(body.request_id, own))
                    elif kind == T.PARTITIONED_METADATA:
                        writer.write(c.partitioned_metadata_response(
                            cmd.partitionMetadata.request_id, 0))
                    elif kind == T.PRODUCER:
                        writer.write(c.producer_success(cmd.producer.request_id, "fake-producer"))
                    elif kind == T.SUBSCRIBE:
                        rid = cmd.subscribe.request_id
                        if self.subscribe_error:
                            writer.write(c.error(rid, self.subscribe_error, "scripted"))
                        else:
                            writer.write(c.success(rid))
                    elif kind == T.SEND:
                        send = cmd.send
                        self.sends.append((number, send.sequence_id, bytes(frame.entry)))
                        if number == 1 and self.drop_after_sends is not None \
                                and len(self.sends) >= self.drop_after_sends:
                            writer.close()
                            return
                        if self.answer_sends:
                            writer.write(c.send_receipt(send.producer_id, send.sequence_id, 7,
                                                        len(self.sends)))
                    elif kind == T.CLOSE_PRODUCER:
                        writer.write(c.success(cmd.close_producer.request_id))
                    elif kind == T.CLOSE_CONSUMER:
                        writer.write(c.success(cmd.close_consumer.request_id))
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


async def test_resend_after_dropped_connection_keeps_sequence_ids():
    broker = FakeBroker(drop_after_sends=2)
    url = await broker.start()
    try:
        async with pla.Client(url, operation_timeout_seconds=10) as client:
            producer = await client.create_producer("t", batching_enabled=False)
            futures = [await producer.send_async(f"m{i}".encode()) for i in range(3)]
            ids = await asyncio.wait_for(asyncio.gather(*futures), 20)
            assert [mid.ledger_id() for mid in ids] == [7, 7, 7]
            await producer.close()
    finally:
        await broker.stop()
    first = [(seq, entry) for n, seq, entry in broker.sends if n == 1]
    later = [(seq, entry) for n, seq, entry in broker.sends if n > 1]
    assert [seq for seq, _ in first] == [0, 1]     # 0 acknowledged, then the drop
    # everything unacknowledged is resent, in order, same sequence ids, same bytes
    assert [seq for seq, _ in later] == [1, 2]
    assert later[0][1] == first[1][1]
    assert [bytes(unpack_entry(e)[1][0].payload) for _, e in later] == [b"m1", b"m2"]
    assert broker.lookups >= 2      # looked the topic up again to reconnect
    assert broker.pongs >= 1        # the client answered the broker's PING


async def test_lookup_redirect_is_followed():
    target = FakeBroker()
    target_url = await target.start()
    front = FakeBroker()
    front.redirect_to = target_url
    url = await front.start()
    try:
        async with pla.Client(url) as client:
            producer = await client.create_producer("t")
            await producer.send(b"x")
            await producer.close()
    finally:
        await front.stop()
        await target.stop()
    assert front.sends == [] and len(target.sends) == 1


async def test_broker_error_is_typed_and_not_retried():
    broker = FakeBroker(subscribe_error=pb.ConsumerBusy)
    url = await broker.start()
    try:
        async with pla.Client(url) as client:
            with pytest.raises(pla.ConsumerBusy, match="ConsumerBusy: scripted"):
                await client.subscribe("t", "sub")
    finally:
        await broker.stop()


async def test_unreachable_broker_times_out_with_connect_error():
    async with pla.Client("pulsar://127.0.0.1:1", operation_timeout_seconds=1) as client:
        with pytest.raises(pla.ConnectError):
            await client.create_producer("t")


async def test_send_timeout_and_full_queue():
    broker = FakeBroker(answer_sends=False)
    url = await broker.start()
    try:
        async with pla.Client(url) as client:
            producer = await client.create_producer("t", batching_enabled=False,
                                                    send_timeout_millis=300,
                                                    max_pending_messages=2)
            results = []
            first = await producer.send_async(b"a", lambda res, mid: results.append(res))
            await producer.send_async(b"b")
            with pytest.raises(pla.ProducerQueueIsFull):
                await producer.send_async(b"c")
            with pytest.raises(pla.Timeout, match="not acknowledged within"):
                await asyncio.wait_for(first, 10)
            assert results == [pla.Result.Timeout]
            await producer.send_async(b"d")   # the timed-out ones freed their slots
            with pytest.raises(pla.MessageTooBig):
                await producer.send(b"x" * (5 * 1024 * 1024 + 1))
    finally:
        await broker.stop()


async def test_unsupported_and_unknown_arguments_are_refused_before_any_io():
    async with pla.Client("pulsar://127.0.0.1:1") as client:
        with pytest.raises(pla.InvalidConfiguration, match="Batching and chunking"):
            await client.create_producer("t", chunking_enabled=True, batching_enabled=True)
        with pytest.raises(pla.InvalidConfiguration, match="max_pending_chunked_message"):
            await client.subscribe("t", "s", max_pending_chunked_message=-1)
        with pytest.raises(TypeError, match="bogus"):
            await client.create_producer("t", bogus=1)
        with pytest.raises(pla.InvalidConfiguration, match="dead_letter_policy"):
            await client.subscribe("t", "s", dead_letter_policy=object())
        with pytest.raises(pla.InvalidConfiguration, match="receiver_queue_size"):
            await client.subscribe("t", "s", receiver_queue_size=0)
        with pytest.raises(pla.InvalidConfiguration, match="subscription_name"):
            await client.subscribe("t", "")
        with pytest.raises(pla.InvalidTopicNameError):
            await client.create_producer("a/b/c/d")
    with pytest.raises(pla.InvalidConfiguration, match="authentication"):   # [security]: not pulsar's object
        pla.Client("pulsar://127.0.0.1:1", authentication=object())
    with pytest.raises(pla.InvalidConfiguration, match="tls_private_key_file_path"):
        pla.Client("pulsar+ssl://127.0.0.1:1", tls_certificate_file_path="/c.pem")
