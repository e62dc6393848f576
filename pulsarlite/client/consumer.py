"""Consumers and readers: the asyncio shell of a consumer on one topic (or one partition).

:class:`ConsumerImpl` subscribes, grants permits (FLOW), turns each MESSAGE into messages for
its :mod:`sink <.sink>` (unpacking batches, skipping the batch indexes the broker marks acked
and, for readers and seeks, what lies before the start id), joins chunked messages (the pure
:class:`~.chunking.ChunkAssembler` decides), and sends acks (grouped every 10 ms or 1,000),
cumulative acks, negative acks (redelivered after the delay), seeks and
GET_LAST_MESSAGE_ID. After a reconnection it drops what it had queued: the broker redelivers
everything unacked. A reader is a non-durable exclusive consumer (:func:`create_reader`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.client import core as k
from pulsarlite.client.chunking import Ack as ChunkAck, Chunk, ChunkAssembler, ChunkingConfig, Deliver
from pulsarlite.client.connection import ClientImpl, Connection
from pulsarlite.client.errors import AlreadyClosed, ClientError, ConnectError, InvalidConfiguration
from pulsarlite.client.handler import Handler, retry_until
from pulsarlite.client.sink import Sink
from pulsarlite.client.types import (INT64_MAX, ChunkedMessage, ChunkMessageId, ConsumerType, InitialPosition,
                                     Message, MessageId, is_earliest, is_latest)
from pulsarlite.topic_name import TopicName
from pulsarlite.wire import commands as c
from pulsarlite.wire.entry import EntryFormatError, Message as WireMessage, unpack_chunked, unpack_entry

log = logging.getLogger("pulsarlite.client")


class ConsumerConf:
    __slots__ = ("subscription", "consumer_type", "initial_position", "receiver_queue_size",
                 "nack_delay_s", "consumer_name", "durable", "start_message_id",
                 "start_inclusive", "properties", "schema", "chunking")

    def __init__(self, subscription: str, *, consumer_type=ConsumerType.Exclusive,
                 initial_position=InitialPosition.Latest, receiver_queue_size: int = 1000,
                 negative_ack_redelivery_delay_ms: int = 60_000,
                 consumer_name: str | None = None, durable: bool = True,
                 start_message_id: MessageId | None = None, start_inclusive: bool = False,
                 properties: dict[str, str] | None = None, schema=None,
                 max_pending_chunked_message: int = 10,
                 auto_ack_oldest_chunked_message_on_queue_full: bool = False,
                 expire_time_of_incomplete_chunked_message_ms: int = 60_000) -> None:
        self.schema = schema   # a pulsarlite.schema Schema, or None (bytes)
        try:
            self.chunking = ChunkingConfig(
                pending_messages_max=int(max_pending_chunked_message),
                auto_ack_oldest_on_queue_full=bool(auto_ack_oldest_chunked_message_on_queue_full),
                expire_incomplete_ms=int(expire_time_of_incomplete_chunked_message_ms))
        except (TypeError, ValueError) as exc:
            raise InvalidConfiguration(str(exc)) from None
        if not isinstance(subscription, str) or not subscription:
            raise InvalidConfiguration("subscription_name must be a non-empty string")
        try:
            self.consumer_type = ConsumerType(int(consumer_type))
            self.initial_position = InitialPosition(int(initial_position))
        except (ValueError, TypeError):
            raise InvalidConfiguration(f"unknown consumer type {consumer_type!r} or initial "
                                       f"position {initial_position!r}") from None
        if not 1 <= receiver_queue_size <= 1_000_000:
            raise InvalidConfiguration("receiver_queue_size must be in [1, 1000000]")
        if negative_ack_redelivery_delay_ms < 0:
            raise InvalidConfiguration("negative_ack_redelivery_delay_ms must be >= 0")
        self.subscription = subscription
        self.receiver_queue_size = int(receiver_queue_size)
        self.nack_delay_s = negative_ack_redelivery_delay_ms / 1000
        self.consumer_name = consumer_name
        self.durable = durable
        self.start_message_id = start_message_id
        self.start_inclusive = start_inclusive
        self.properties = properties


def _before(mid: tuple[int, int, int], start: MessageId, inclusive: bool) -> bool:
    """Whether a received message (ledger, entry, batch_index) lies before a start id."""
    entry = mid[:2]
    start_entry = (start._ledger_id, start._entry_id)
    if entry != start_entry:
        return entry < start_entry
    if start._batch_index < 0 or mid[2] < 0:
        return not inclusive
    return mid[2] < start._batch_index or (mid[2] == start._batch_index and not inclusive)


class ConsumerImpl(Handler):
    kind = "consumer"

    def __init__(self, client: ClientImpl, topic: str, conf: ConsumerConf, sink: Sink, *,
                 partition: int = -1) -> None:
        super().__init__(client, topic)
        self.conf = conf
        self.sink = sink
        self.partition = partition
        self.consumer_id = next(client._consumer_ids)
        self.epoch = 0
        self.flow_threshold = max(1, conf.receiver_queue_size // 2)
        self._permits_owed = 0
        self._batch_acks = k.BatchAckTracker()
        self._tracker_lock = threading.Lock()
        self._acks: list[pb.MessageIdData] = []
        self._ack_timer: asyncio.TimerHandle | None = None
        self._nacks: dict[tuple[int, int], float] = {}
        self._nack_timer: asyncio.TimerHandle | None = None
        self._last_dequeued_msg: Message | None = None
        # readers and seeks: drop what lies before this id
        start = conf.start_message_id
        self._start_filter: tuple[MessageId, bool] | None = None
        if start is not None and not is_earliest(start) and not is_latest(start):
            self._start_filter = (start, conf.start_inclusive)
        self._baseline: MessageId | None = None   # reader started at latest: the last id then
        self._chunks = ChunkAssembler(conf.chunking)   # chunked messages being joined
        self._chunk_timer: asyncio.TimerHandle | None = None

    @property
    def _last_dequeued(self) -> MessageId | None:
        msg = self._last_dequeued_msg
        return None if msg is None else msg.message_id()

    def _subscribe_start(self) -> pb.MessageIdData | None:
        if self.conf.durable:
            return None
        if self._last_dequeued is not None:
            self._start_filter = (self._last_dequeued, False)
            return self._last_dequeued.to_proto()
        start = self.conf.start_message_id
        if start is None:
            return None
        if is_earliest(start):
            return pb.MessageIdData(ledgerId=c.u64(-1), entryId=c.u64(-1))
        if is_latest(start):
            return pb.MessageIdData(ledgerId=INT64_MAX, entryId=INT64_MAX)
        return start.to_proto()

    async def _connect(self) -> None:
        conn = await self.client.connection_for(self.topic)
        rid = self.client.next_request_id()
        conf = self.conf
        conn.consumers[self.consumer_id] = self
        frame = c.subscribe(self.topic, conf.subscription, int(conf.consumer_type),
                            self.consumer_id, rid, consumer_name=conf.consumer_name,
                            durable=conf.durable, start_message_id=self._subscribe_start(),
                            initial_position=int(conf.initial_position),
                            schema=None if conf.schema is None
                            else conf.schema.schema_info().to_pb())
        try:
            await conn.request(frame, rid, f"subscribe {conf.subscription!r} to {self.topic}")
        except BaseException:
            if conn.consumers.get(self.consumer_id) is self:
                del conn.consumers[self.consumer_id]
            raise
        if self.closed:
            raise AlreadyClosed(f"consumer on {self.topic} is closed")
        if conn.closed or conn.consumers.get(self.consumer_id) is not self:
            # CLOSE_CONSUMER or the connection's end right behind the SUCCESS (same read):
            # this subscription is void, subscribe again (as for producers above)
            if conn.consumers.get(self.consumer_id) is self:
                del conn.consumers[self.consumer_id]
            raise ConnectError(f"consumer on {self.topic} was closed by the broker while it "
                               "subscribed; subscribing again")
        self.sink.clear_for(self)
        self._drop_partial_chunks()
        self.epoch += 1
        self._permits_owed = 0
        self.conn = conn
        conn.write(c.flow(self.consumer_id, conf.receiver_queue_size))
        self._flush_acks()

    def _disconnected(self) -> None:
        self.sink.clear_for(self)
        self._drop_partial_chunks()

    # receiving
    def _on_message(self, conn: Connection, event: k.MessageReceived) -> None:
        if conn is not self.conn:
            return
        ledger_id, entry_id = event.ledger_id, event.entry_id
        if not event.checksum_ok:
            log.error("event=checksum_mismatch topic=%s ledger=%d entry=%d", self.topic,
                      ledger_id, entry_id)
            conn.write(c.redeliver_unacknowledged(self.consumer_id,
                                                  [c.message_id(ledger_id, entry_id)]))
            return
        try:
            metadata, messages = unpack_entry(event.entry)
        except EntryFormatError as exc:
            log.error("event=bad_entry topic=%s ledger=%d entry=%d error=%r -- acknowledged and "
                      "skipped", self.topic, ledger_id, entry_id, exc)
            self._acks.append(c.message_id(ledger_id, entry_id))
            self._schedule_ack_flush()
            self.return_permits(1, self.epoch)
            return
        batched = metadata.batched
        if not batched and metadata.raw.num_chunks_from_msg > 1:
            self._on_chunk(event, metadata, messages[0])
            return
        count = len(messages)
        keep = None
        if batched:
            keep = k.unacked_indexes(event.ack_set, count)
            with self._tracker_lock:
                self._batch_acks.received(ledger_id, entry_id,
                                          range(count) if keep is None else keep)
            if keep is not None:
                keep = set(keep)
        skipped = 0
        start_filter = self._start_filter
        epoch = self.epoch
        info = (metadata.publish_time_ms, metadata.producer_name, metadata.schema_version,
                event.redelivery_count, self.topic, self.partition, ledger_id, entry_id,
                count if batched else 0)
        if keep is None and start_filter is None:   # the hot path
            out = [Message(m, info, self, epoch) for m in messages]
        else:
            out = []
            for m in messages:
                index = m.batch_index
                if keep is not None and index not in keep:
                    skipped += 1
                    continue
                if start_filter is not None:
                    if _before((ledger_id, entry_id, index), *start_filter):
                        skipped += 1
                        if batched:
                            with self._tracker_lock:
                                self._batch_acks.ack(ledger_id, entry_id, index)
                        continue
                    self._start_filter = start_filter = None
                out.append(Message(m, info, self, epoch))
        if out:
            self.sink.put_many(out)
        if skipped:
            self.return_permits(skipped, epoch)

    # chunked messages: the pure ChunkAssembler decides, these execute
    def _on_chunk(self, event: k.MessageReceived, metadata, message: WireMessage) -> None:
        raw = metadata.raw
        chunk = Chunk(raw.uuid, raw.chunk_id, raw.num_chunks_from_msg, raw.total_chunk_msg_size,
                      (event.ledger_id, event.entry_id), raw.publish_time,
                      bytes(message.payload), (metadata, event.redelivery_count))
        epoch = self.epoch
        if not self._run_chunk_actions(self._chunks.on_chunk(chunk, int(time.time() * 1000))):
            self.return_permits(1, epoch)   # a chunk that completes nothing frees its permit
        self._schedule_chunk_expiry()

    def _run_chunk_actions(self, actions) -> bool:
        """Execute the assembler's actions; True if one delivered a message."""
        delivered = False
        for action in actions:
            if type(action) is Deliver:
                delivered = self._deliver_chunked(action) or delivered
            elif type(action) is ChunkAck:
                log.warning("chunks dropped and acknowledged topic=%s uuid=%s why=%s entries=%s",
                            self.topic, action.uuid, action.why.value, list(action.positions))
                for ledger_id, entry_id in action.positions:
                    self._acks.append(c.message_id(ledger_id, entry_id))
                self._schedule_ack_flush()
            else:   # Release: left unacked, the broker sends them again after a redelivery
                log.info("chunks dropped unacknowledged topic=%s uuid=%s why=%s entries=%s",
                         self.topic, action.uuid, action.why.value, list(action.positions))
        return delivered

    def _deliver_chunked(self, action: Deliver) -> bool:
        metadata, redelivery_count = action.context
        try:
            whole, messages = unpack_chunked(metadata.raw, action.payload,
                                             uncompressed_bytes_max=self.conf.chunking.message_bytes_max)
        except EntryFormatError as exc:
            log.error("bad chunked message topic=%s uuid=%s entries=%s error=%r -- acknowledged "
                      "and skipped", self.topic, action.uuid, list(action.positions), exc)
            for ledger_id, entry_id in action.positions:
                self._acks.append(c.message_id(ledger_id, entry_id))
            self._schedule_ack_flush()
            return False
        last = action.positions[-1]
        info = (whole.publish_time_ms, whole.producer_name, whole.schema_version,
                redelivery_count, self.topic, self.partition, last[0], last[1], 0)
        msg = ChunkedMessage(messages[0], info, self, self.epoch)
        msg._mid = ChunkMessageId(action.positions, self.partition, self.topic)
        self.sink.put_many([msg])
        return True

    def _schedule_chunk_expiry(self) -> None:
        if self._chunk_timer is not None:
            self._chunk_timer.cancel()
            self._chunk_timer = None
        deadline_ms = self._chunks.deadline_ms()
        if deadline_ms is not None:
            delay_s = max(0.001, deadline_ms / 1000 - time.time())
            self._chunk_timer = self.loop.call_later(delay_s, self._expire_chunks)

    def _expire_chunks(self) -> None:
        self._chunk_timer = None
        if self.closed:
            return
        self._run_chunk_actions(self._chunks.on_time(int(time.time() * 1000)))
        self._schedule_chunk_expiry()

    def _drop_partial_chunks(self) -> None:
        """Everything unacked comes again (a reconnection, a redelivery, a seek): partial
        chunked messages start over from the chunks the broker sends."""
        self._run_chunk_actions(self._chunks.clear())
        if self._chunk_timer is not None:
            self._chunk_timer.cancel()
            self._chunk_timer = None

    def return_permits(self, n: int, epoch: int) -> None:
        if epoch != self.epoch or self.conn is None:
            return
        self._permits_owed += n
        if self._permits_owed >= self.flow_threshold:
            self.conn.write(c.flow(self.consumer_id, self._permits_owed))
            self._permits_owed = 0

    # acks
    def ack_batch_index(self, mid: MessageId) -> bool:
        """Note a batched message acked; True when its whole entry is now acked. Thread-safe
        (the blocking API calls it from application threads, sparing a hop per message)."""
        with self._tracker_lock:
            return self._batch_acks.ack(mid._ledger_id, mid._entry_id, mid._batch_index)

    def ack_message_fast(self, msg: Message) -> tuple[int, int] | None:
        """For the blocking API (any thread): the (ledger, entry) to ack on the wire once
        ``msg`` is acked, or None while the rest of its batch is unacked."""
        e = msg._e
        index = msg._m.batch_index
        if index >= 0 and e[8]:
            with self._tracker_lock:
                if not self._batch_acks.ack(e[6], e[7], index):
                    return None
        return (e[6], e[7])

    def acknowledge_entry_key(self, key: tuple[int, int]) -> None:
        """Ack the entry (ledger, entry) (on the loop)."""
        if self.closed:
            return
        self._nacks.pop(key, None)
        self._acks.append(c.message_id(key[0], key[1]))
        if len(self._acks) >= 1000:
            self._flush_acks()
        else:
            self._schedule_ack_flush()

    def acknowledge(self, mid: MessageId) -> None:
        if self.closed:
            raise AlreadyClosed(f"consumer on {self.topic} is closed")
        if mid._batch_index >= 0 and not self.ack_batch_index(mid):
            return   # the rest of the batch is not acked yet (nor a nack of it cancelled)
        self.acknowledge_entry(mid)

    def acknowledge_entry(self, mid: MessageId) -> None:
        """Ack the whole entry of ``mid`` (on the loop)."""
        if self.closed:
            return
        if type(mid) is ChunkMessageId:   # every chunk entry of the message
            for key in mid._chunks:
                self._nacks.pop(key, None)
                self._acks.append(c.message_id(*key))
        else:
            ledger_id, entry_id = mid._ledger_id, mid._entry_id
            self._nacks.pop((ledger_id, entry_id), None)
            self._acks.append(c.message_id(ledger_id, entry_id))
        if len(self._acks) >= 1000:
            self._flush_acks()
        else:
            self._schedule_ack_flush()

    def _schedule_ack_flush(self) -> None:
        if self._ack_timer is None:
            self._ack_timer = self.loop.call_later(0.01, self._flush_acks)

    def _flush_acks(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        if not self._acks or self.conn is None:
            return
        acks, self._acks = self._acks, []
        self.conn.write(c.ack(self.consumer_id, acks))

    def acknowledge_cumulative(self, mid: MessageId) -> None:
        if self.closed:
            raise AlreadyClosed(f"consumer on {self.topic} is closed")
        if self.conf.consumer_type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise InvalidConfiguration("cumulative acknowledgement is not allowed on a "
                                       f"{self.conf.consumer_type.name} subscription")
        ledger_id, entry_id = mid._ledger_id, mid._entry_id
        ack_set = None
        if mid._batch_index >= 0 and mid._batch_size and mid._batch_index < mid._batch_size - 1:
            ack_set = k.ack_set_after(mid._batch_index, mid._batch_size)
        else:
            with self._tracker_lock:
                self._batch_acks.forget_through(ledger_id, entry_id)
        for key in [key for key in self._nacks if key <= (ledger_id, entry_id)]:
            del self._nacks[key]
        self._flush_acks()
        if self.conn is None:
            return
        if ack_set is not None and entry_id > 0:
            # Inside a batch: like the official clients, ack everything before the batch's
            # entry; then the entry with the ack_set of its later messages (a broker that keeps
            # batch indexes uses it; otherwise the batch comes back whole: at-least-once).
            self.conn.write(c.ack(self.consumer_id, [c.message_id(ledger_id, entry_id - 1)],
                                  cumulative=True))
        self.conn.write(c.ack(self.consumer_id, [c.message_id(ledger_id, entry_id,
                                                              ack_set=ack_set)],
                              cumulative=True))

    def negative_acknowledge(self, mid: MessageId) -> None:
        if self.closed:
            raise AlreadyClosed(f"consumer on {self.topic} is closed")
        due = self.loop.time() + self.conf.nack_delay_s
        for key in (mid._chunks if type(mid) is ChunkMessageId else ((mid._ledger_id, mid._entry_id),)):
            self._nacks[key] = due
        if self._nack_timer is None:
            self._nack_timer = self.loop.call_later(max(self.conf.nack_delay_s, 0.001),
                                                    self._redeliver_nacked)

    def _redeliver_nacked(self) -> None:
        self._nack_timer = None
        now = self.loop.time()
        due = [key for key, at in self._nacks.items() if at <= now + 0.001]
        if due and self.conn is not None:
            for key in due:
                del self._nacks[key]
            self.conn.write(c.redeliver_unacknowledged(
                self.consumer_id, [c.message_id(l, e) for l, e in due]))
        if self._nacks:
            delay = max(0.001, min(self._nacks.values()) - now)
            self._nack_timer = self.loop.call_later(delay, self._redeliver_nacked)

    def redeliver_unacknowledged_messages(self) -> None:
        if self.conn is not None:
            self.sink.clear_for(self)
            self._drop_partial_chunks()
            self.epoch += 1
            self._permits_owed = 0
            self.conn.write(c.redeliver_unacknowledged(self.consumer_id))
            self.conn.write(c.flow(self.consumer_id, self.conf.receiver_queue_size))

    # seek and last message id
    async def seek(self, target: MessageId | int) -> None:
        conn = await self._wait_connected(self.client.operation_timeout_s)
        self._flush_acks()   # acks of messages before the seek must not land after it
        rid = self.client.next_request_id()
        if isinstance(target, MessageId):
            if is_earliest(target):
                proto = pb.MessageIdData(ledgerId=c.u64(-1), entryId=c.u64(-1))
            elif is_latest(target):
                proto = pb.MessageIdData(ledgerId=INT64_MAX, entryId=INT64_MAX)
            else:
                proto = pb.MessageIdData(ledgerId=c.u64(target._ledger_id),
                                         entryId=c.u64(target._entry_id))
            frame = c.seek(self.consumer_id, rid, message_id=proto)
        else:
            if not self.conf.durable:
                raise InvalidConfiguration("a reader seeks by message id only")
            frame = c.seek(self.consumer_id, rid, publish_time_ms=int(target))
        self._hold_reconnect = True
        try:
            await conn.request(frame, rid, f"seek on {self.topic}")
        finally:
            self._hold_reconnect = False
        if isinstance(target, MessageId):
            self._last_dequeued_msg = None
            if not self.conf.durable:
                self.conf.start_message_id = target
            if is_earliest(target) or is_latest(target):
                self._start_filter = None
            else:
                self._start_filter = (target, self.conf.start_inclusive)
        self.sink.clear_for(self)
        with self._tracker_lock:
            self._batch_acks.clear()
        if self.conn is None:
            await self._reconnect_now()
        elif self.conn is conn:
            # the broker kept us attached: drop what was queued before the seek
            self.epoch += 1
            self._permits_owed = 0
            conn.write(c.flow(self.consumer_id, self.conf.receiver_queue_size))

    async def _reconnect_now(self) -> None:
        deadline = self.loop.time() + self.client.operation_timeout_s
        try:
            await retry_until(deadline, self.loop, self._connect, f"resubscribe to {self.topic}")
        except ClientError:
            self._schedule_reconnect()
            raise

    async def get_last_message_id(self) -> MessageId:
        conn = await self._wait_connected(self.client.operation_timeout_s)
        rid = self.client.next_request_id()
        resp = await conn.request(c.get_last_message_id(self.consumer_id, rid), rid,
                                  f"last message id of {self.topic}")
        return MessageId.from_proto(resp.command.getLastMessageIdResponse.last_message_id,
                                    topic=self.topic)

    async def has_message_available(self) -> bool:
        if self.sink.has_for(self):
            return True
        last = await self.get_last_message_id()
        if last._entry_id < 0:
            return False
        last_entry = (last._ledger_id, last._entry_id)
        if self._last_dequeued is not None:
            d = self._last_dequeued
            return last_entry > (d._ledger_id, d._entry_id)
        start = self.conf.start_message_id
        if start is None or is_earliest(start):
            return True
        if is_latest(start):
            base = self._baseline
            return base is not None and last_entry > (base._ledger_id, base._entry_id)
        start_entry = (start._ledger_id, start._entry_id)
        return last_entry >= start_entry if self.conf.start_inclusive else last_entry > start_entry

    # lifecycle
    async def unsubscribe(self) -> None:
        conn = await self._wait_connected(self.client.operation_timeout_s)
        rid = self.client.next_request_id()
        await conn.request(c.unsubscribe(self.consumer_id, rid), rid,
                           f"unsubscribe {self.conf.subscription!r} from {self.topic}")
        await self._shut(send_close=False)

    async def close(self) -> None:
        await self._shut(send_close=True)

    async def _shut(self, *, send_close: bool) -> None:
        if self.closed:
            return
        self._flush_acks()
        self.closed = True
        self.client.unregister(self)
        for timer in (self._ack_timer, self._nack_timer, self._chunk_timer):
            if timer is not None:
                timer.cancel()
        self.sink.clear_for(self)
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            conn.consumers.pop(self.consumer_id, None)
            if send_close:
                rid = self.client.next_request_id()
                try:
                    await conn.request(c.close_consumer(self.consumer_id, rid), rid,
                                       f"close consumer on {self.topic}")
                except ClientError:
                    pass


async def create_reader(client: ClientImpl, topic: str, start_message_id: MessageId,
                        sink: Sink, *, start_message_id_inclusive: bool = False,
                        receiver_queue_size: int = 1000, reader_name: str | None = None,
                        subscription_role_prefix: str | None = None,
                        schema=None) -> ConsumerImpl:
    client.check_open()
    if not isinstance(start_message_id, MessageId):
        raise InvalidConfiguration("start_message_id must be a MessageId (e.g. "
                                   "MessageId.earliest)")
    name = str(TopicName.parse(topic))
    prefix = subscription_role_prefix or "reader"
    subscription = f"{prefix}-{client._random.getrandbits(40):010x}"
    conf = ConsumerConf(subscription, consumer_type=ConsumerType.Exclusive,
                        receiver_queue_size=receiver_queue_size, consumer_name=reader_name,
                        durable=False, start_message_id=start_message_id,
                        start_inclusive=start_message_id_inclusive, schema=schema)
    reader = ConsumerImpl(client, name, conf, sink,
                          partition=TopicName.parse(name).partition_index)
    await reader._start()
    if is_latest(start_message_id):
        try:
            reader._baseline = await reader.get_last_message_id()
        except ClientError:
            reader._baseline = None
    return reader
