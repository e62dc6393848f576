"""Producers: the asyncio shell of a producer on one topic, and on a partitioned topic.

:class:`ProducerImpl` keeps ONE queue of SENDs in send order (its rules, receipts and the send
timeout, in :class:`core.PendingSends`), batches messages (:class:`core.BatchBuilder`), chunks
a message larger than the broker's maximum when chunking is on, and runs each message's
callback with its message id or error. After a reconnection it resends what was not yet
acknowledged, in order and with the same sequence ids (so a broker with deduplication drops
repeats). :class:`PartitionedProducerImpl` routes to one ProducerImpl per partition;
:func:`create_producer` picks one of the two from the topic's partitioned metadata.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Callable

from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.client import core as k
from pulsarlite.client.connection import ClientImpl, Connection
from pulsarlite.client.errors import (AlreadyClosed, BrokerError, ClientError, ConnectError,
                                      InvalidConfiguration, MessageTooBig, Timeout, broker_error)
from pulsarlite.client.handler import Handler, retry_until
from pulsarlite.client.types import ChunkMessageId, MessageId
from pulsarlite.topic_name import TopicName
from pulsarlite.wire import commands as c
from pulsarlite.wire.entry import Compression, Message as WireMessage, build_chunk_entries

log = logging.getLogger("pulsarlite.client")

SEQUENCE_ID_MAX = 2**64 - 1     # the wire field is uint64

Callback = Callable[[BaseException | None, MessageId | None], None]


class _Op:
    """One SEND in flight: an entry (a batch or one message) and the callbacks of its
    messages."""

    __slots__ = ("first_seq", "last_seq", "parts", "callbacks", "count", "created_s", "waiters",
                 "batched", "chunked")

    def __init__(self, first_seq, last_seq, parts, callbacks, count, created_s, batched,
                 chunked=None):
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.parts = parts
        self.callbacks = callbacks
        self.count = count
        self.created_s = created_s
        self.waiters: list[asyncio.Future] | None = None
        self.batched = batched
        self.chunked: _ChunkedSend | None = chunked   # one chunk of a chunked message


class _ChunkedSend:
    """The chunks of one chunked message in flight (one _Op each, same sequence id, as
    Pulsar's producers send them): their positions as receipts come, and the message's
    callbacks, run once: with the first and last chunk when the last is stored, or with the
    first error of any chunk."""

    __slots__ = ("sequence_id", "chunks", "positions", "callbacks", "done")

    def __init__(self, sequence_id: int, chunks: int, callbacks: list) -> None:
        self.sequence_id = sequence_id
        self.chunks = chunks
        self.positions: list[tuple[int, int]] = []
        self.callbacks = callbacks
        self.done = False


class ProducerConf:
    __slots__ = ("producer_name", "batching_enabled", "limits", "compression", "send_timeout_s",
                 "initial_sequence_id", "properties", "key_based_batching", "schema",
                 "chunking_enabled")

    def __init__(self, *, producer_name: str | None = None, batching_enabled: bool = True,
                 batching_max_messages: int = 1000,
                 batching_max_allowed_size_in_bytes: int = 128 * 1024,
                 batching_max_publish_delay_ms: int = 10,
                 compression_type: int = 0, send_timeout_millis: int = 30_000,
                 initial_sequence_id: int | None = None,
                 properties: dict[str, str] | None = None, batching_type: int = 0,
                 schema=None, chunking_enabled: bool = False) -> None:
        self.schema = schema   # a pulsarlite.schema Schema, or None (bytes)
        if chunking_enabled and batching_enabled:
            raise InvalidConfiguration("Batching and chunking of messages can't be enabled together.")
        self.chunking_enabled = bool(chunking_enabled)
        try:
            self.limits = k.BatchLimits(int(batching_max_messages),
                                        int(batching_max_allowed_size_in_bytes),
                                        int(batching_max_publish_delay_ms))
        except ValueError as exc:
            raise InvalidConfiguration(str(exc)) from None
        try:
            self.compression = Compression(int(compression_type))
        except ValueError:
            raise InvalidConfiguration(f"unknown compression type {compression_type!r}") from None
        if send_timeout_millis < 0:
            raise InvalidConfiguration("send_timeout_millis must be >= 0 (0: no timeout)")
        try:
            self.key_based_batching = int(batching_type) == 1
            if int(batching_type) not in (0, 1):
                raise ValueError
        except (TypeError, ValueError):
            raise InvalidConfiguration(f"unknown batching type {batching_type!r}") from None
        self.producer_name = producer_name
        self.batching_enabled = bool(batching_enabled)
        self.send_timeout_s = send_timeout_millis / 1000
        self.initial_sequence_id = initial_sequence_id
        self.properties = dict(properties or {})


class ProducerImpl(Handler):
    kind = "producer"

    def __init__(self, client: ClientImpl, topic: str, conf: ProducerConf, *,
                 partition: int = -1) -> None:
        super().__init__(client, topic)
        self.conf = conf
        self.partition = partition
        self.producer_id = next(client._producer_ids)
        self.producer_name = conf.producer_name
        self.max_message_size = k.MESSAGE_BYTES_MAX_DEFAULT
        self._next_seq = 0 if conf.initial_sequence_id is None else conf.initial_sequence_id + 1
        self.last_sequence_id = -1 if conf.initial_sequence_id is None else conf.initial_sequence_id
        self._connected_once = False
        # ONE queue in send order; its rules (receipts, send timeout) in core.PendingSends
        self._pending = k.PendingSends(conf.send_timeout_s)
        self._batch = k.BatchBuilder(conf.limits)
        self._batch_timer: asyncio.TimerHandle | None = None
        self._timeout_timer: asyncio.TimerHandle | None = None
        self.schema_version: bytes | None = None   # from PRODUCER_SUCCESS, on every entry
        self.completer = None   # runs a SEND's callbacks in one call: see _deliver

    async def _connect(self) -> None:
        conn = await self.client.connection_for(self.topic)
        rid = self.client.next_request_id()
        conn.producers[self.producer_id] = self
        try:
            resp = await conn.request(
                c.producer(self.topic, self.producer_id, rid, producer_name=self.producer_name,
                           metadata=self.conf.properties or None,
                           schema=None if self.conf.schema is None
                           else self.conf.schema.schema_info().to_pb()),
                rid, f"create producer on {self.topic}")
        except BaseException:
            if conn.producers.get(self.producer_id) is self:
                del conn.producers[self.producer_id]
            raise
        if self.closed:
            raise AlreadyClosed(f"producer on {self.topic} is closed")
        if conn.closed or conn.producers.get(self.producer_id) is not self:
            # a CLOSE_PRODUCER (the topic unloading) or the connection's end came in the same
            # read as PRODUCER_SUCCESS, before this coroutine resumed: _on_disconnected ignored
            # it (self.conn was not set yet), so this registration is void. Taking it would
            # leave the producer writing to a producer id the broker dropped, never answered
            # (seen in a chaos run: ours-1 stuck for the rest of the run). Register again.
            if conn.producers.get(self.producer_id) is self:
                del conn.producers[self.producer_id]
            raise ConnectError(f"producer on {self.topic} was closed by the broker while it "
                               "registered; registering again")
        body = resp.command.producer_success
        self.producer_name = body.producer_name
        if body.HasField("schema_version"):
            self.schema_version = body.schema_version
        if not self._connected_once:
            self._connected_once = True
            if self.conf.initial_sequence_id is None and body.last_sequence_id >= 0:
                self._next_seq = body.last_sequence_id + 1
                self.last_sequence_id = body.last_sequence_id
        self.max_message_size = conn.core.max_message_size
        self.conn = conn
        for op in self._pending:   # resend in order, same sequence ids
            conn.writelines(op.parts)
        log.debug("event=producer_ready topic=%s producer=%s resent=%d", self.topic,
                  self.producer_name, len(self._pending))

    # sending
    def send(self, message: WireMessage | bytes, callback: Callback) -> None:
        """Queue ``message`` (a WireMessage, or plain content as ``bytes``: no key, properties
        or event time); ``callback(error, message_id)`` runs on the loop (or the producer's
        ``completer``, see _deliver)."""
        if self.closed:
            raise AlreadyClosed(f"producer on {self.topic} is closed")
        if type(message) is bytes:
            size = len(message)
            seq = self._next_seq
        else:
            size = len(message.payload)
            seq = message.sequence_id
            if seq is None:
                seq = self._next_seq
        if not 0 <= seq <= SEQUENCE_ID_MAX:
            # refused here, before anything is queued: a batch holding it could not be encoded,
            # and every message batched with it would never be answered
            raise InvalidConfiguration(f"sequence id {seq} is outside 0..2**64-1 (topic {self.topic}; "
                                       "an explicit sequence id of 2**64-1 leaves no id for the next "
                                       "message)")
        conf = self.conf
        if size > self.max_message_size and not conf.chunking_enabled:
            raise MessageTooBig(f"message of {size} bytes exceeds the maximum message size of "
                                f"{self.max_message_size} bytes (topic {self.topic})")
        self._next_seq = seq + 1
        if conf.chunking_enabled:
            self._send_chunked(WireMessage(message) if type(message) is bytes else message, seq,
                               callback)
            return
        if not conf.batching_enabled:
            if type(message) is bytes:
                message = WireMessage(message)
            entry = k.build_single(message, producer_name=self.producer_name,
                                   sequence_id=seq, publish_time_ms=int(time.time() * 1000),
                                   compression=conf.compression,
                                   schema_version=self.schema_version)
            self._enqueue(_Op(seq, seq, c.send_parts(self.producer_id, seq, entry),
                              [callback], 1, self.loop.time(), False))
            return
        batch = self._batch
        if batch.messages and (
                batch.payload_bytes + size > conf.limits.bytes_max
                or (conf.key_based_batching and batch.first_key() != (
                    None if type(message) is bytes else message.key))):
            self._flush_batch()   # full, or (key-based batching) another key
            batch = self._batch
        if batch.add(message, callback, seq):
            self._flush_batch()
        elif len(batch.messages) == 1:
            self._batch_timer = self.loop.call_later(conf.limits.delay_ms / 1000,
                                                     self._flush_batch)

    def _send_chunked(self, message: WireMessage, seq: int, callback: Callback) -> None:
        """One message as one entry, or, larger than the broker's maximum, as chunks: one SEND
        each, all with sequence id ``seq``; ``callback`` runs once (see _ChunkedSend)."""
        entries = build_chunk_entries(message, producer_name=self.producer_name, sequence_id=seq,
                                      publish_time_ms=int(time.time() * 1000),
                                      entry_bytes_max=self.max_message_size,
                                      compression=self.conf.compression,
                                      schema_version=self.schema_version)
        now_s = self.loop.time()
        if len(entries) == 1:
            self._enqueue(_Op(seq, seq, c.send_parts(self.producer_id, seq, entries[0]),
                              [callback], 1, now_s, False))
            return
        chunked = _ChunkedSend(seq, len(entries), [callback])
        last = len(entries) - 1
        for i, entry in enumerate(entries):
            # the message counts once (pending_messages), on its last chunk
            self._enqueue(_Op(seq, seq, c.send_parts(self.producer_id, seq, entry, is_chunk=True),
                              [], int(i == last), now_s, False, chunked))

    def send_many(self, inbox: collections.deque, on_error) -> None:
        """``send(message, callback)`` for every pair in ``inbox`` (a deque, emptied, of
        message, callback, message, callback, ...: each pair put in by one ``extend``, atomic
        under the GIL; no tuple per message), oldest first; a pair that send refuses goes to
        ``on_error(callback, error)``. Plain messages (``bytes``) join the open batch inline:
        the same steps as send, without a call and the checks that cannot change between two
        messages of one drain."""
        popleft = inbox.popleft
        conf = self.conf
        if self.closed or not conf.batching_enabled or conf.key_based_batching \
                or conf.chunking_enabled:
            while inbox:
                message = popleft()
                callback = popleft()
                try:
                    self.send(message, callback)
                except BaseException as exc:
                    on_error(callback, exc)
            return
        limits = conf.limits
        messages_max = limits.messages_max
        bytes_max = limits.bytes_max
        size_max = self.max_message_size
        delay_s = limits.delay_ms / 1000
        while inbox:
            # the open batch's state in locals until something else must happen: the batch
            # fills up (flush it), or a message needs send() (not plain bytes, too big, or it
            # does not fit: send flushes first)
            batch = self._batch
            messages = batch.messages
            add_message = messages.append
            add_callback = batch.callbacks.append
            add_sequence_id = batch.sequence_ids.append
            payload_bytes = batch.payload_bytes
            seq = self._next_seq
            slow = None
            full = False
            try:
                while inbox:
                    message = popleft()
                    callback = popleft()
                    if type(message) is not bytes or seq > SEQUENCE_ID_MAX:
                        slow = (message, callback)      # send() answers it (or refuses it)
                        break
                    size = len(message)
                    if size > size_max or (messages and payload_bytes + size > bytes_max):
                        slow = (message, callback)
                        break
                    add_message(message)
                    add_callback(callback)
                    add_sequence_id(seq)
                    seq += 1
                    payload_bytes += size
                    if len(messages) >= messages_max or payload_bytes >= bytes_max:
                        full = True
                        break
                    if len(messages) == 1:
                        self._batch_timer = self.loop.call_later(delay_s, self._flush_batch)
            finally:
                batch.payload_bytes = payload_bytes
                self._next_seq = seq
            if full:
                self._flush_batch()
            elif slow is not None:
                message, callback = slow
                try:
                    self.send(message, callback)
                except BaseException as exc:
                    on_error(callback, exc)

    def _flush_batch(self) -> None:
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None
        if not len(self._batch):
            return
        entry, callbacks, count, first, last = self._batch.build(
            producer_name=self.producer_name, publish_time_ms=int(time.time() * 1000),
            compression=self.conf.compression, schema_version=self.schema_version)
        parts = c.send_parts(self.producer_id, first, entry, num_messages=count,
                             highest_sequence_id=last)
        self._enqueue(_Op(first, last, parts, callbacks, count, self.loop.time(), True))

    def _enqueue(self, op: _Op) -> None:
        self._pending.append(op)
        if self.conn is not None:
            self.conn.writelines(op.parts)
        if self._timeout_timer is None and self.conf.send_timeout_s > 0:
            self._timeout_timer = self.loop.call_later(self.conf.send_timeout_s,
                                                       self._check_timeouts)

    def _check_timeouts(self) -> None:
        self._timeout_timer = None
        expired = self._pending.expire(self.loop.time())
        if expired:
            # the oldest send timed out: every pending send fails (and the open batch), as in
            # the official clients; none of them is resent later, so nothing the broker stores
            # meanwhile can end up ahead of a resent older message (CHAOS.md finding 4)
            timeout_s = self.conf.send_timeout_s
            log.warning("event=send_timeout topic=%s producer=%s first_sequence_id=%d "
                        "messages=%d", self.topic, self.producer_name, expired[0].first_seq,
                        sum(op.count for op in expired) + len(self._batch))
            self._fail_all(expired, Timeout(f"send to {self.topic} not acknowledged within "
                                            f"{timeout_s:g}s"))
        deadline = self._pending.deadline_s()
        if deadline is not None:
            self._timeout_timer = self.loop.call_later(max(0.01, deadline - self.loop.time()),
                                                       self._check_timeouts)

    def _on_reconnect_refused(self, exc: BaseException) -> None:
        """A refusal that will not go away by retrying soon (a backlog quota, a terminated
        topic, a fenced producer) fails every pending send now, in order, as the Java client
        does; the producer keeps trying to reconnect."""
        if isinstance(exc, BrokerError) and k.refusal_fails_pending(exc.server_error) \
                and (self._pending or len(self._batch)):
            log.warning("event=pending_sends_failed topic=%s producer=%s error=%s messages=%d",
                        self.topic, self.producer_name, exc.server_error_name,
                        self.pending_messages)
            self._fail_all(self._pending.take_all(), exc)

    def _fail_all(self, ops: list, error: BaseException) -> None:
        """Fail ``ops`` (taken from the pending queue, oldest first), then the open batch."""
        for op in ops:
            self._complete(op, error, -1, -1)
        if len(self._batch):
            if self._batch_timer is not None:
                self._batch_timer.cancel()
                self._batch_timer = None
            callbacks = self._batch.callbacks
            self._batch = k.BatchBuilder(self.conf.limits)
            self._deliver(callbacks, error)

    def _complete(self, op: _Op, error, ledger_id: int, entry_id: int) -> None:
        chunked = op.chunked
        if chunked is not None:
            self._complete_chunk(chunked, error, ledger_id, entry_id)
        else:
            if error is None:
                self.last_sequence_id = op.last_seq
            self._deliver(op.callbacks, error, ledger_id, entry_id, op.batched)
        if op.waiters:
            for waiter in op.waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _complete_chunk(self, chunked: _ChunkedSend, error, ledger_id: int, entry_id: int) -> None:
        if chunked.done:
            return
        if error is not None:
            chunked.done = True
            self._deliver(chunked.callbacks, error)
            return
        chunked.positions.append((ledger_id, entry_id))
        if len(chunked.positions) < chunked.chunks:
            return
        chunked.done = True
        self.last_sequence_id = chunked.sequence_id
        self._deliver(chunked.callbacks, None, ledger_id, entry_id, False,
                      chunk_positions=tuple(chunked.positions))

    def _deliver(self, callbacks: list, error, ledger_id: int = -1, entry_id: int = -1,
                 batched: bool = False, chunk_positions: tuple | None = None) -> None:
        """Run the callbacks of one SEND (or of the open batch, failing): each gets
        ``(error, message_id)``. A ``completer`` (the blocking API's) takes the whole list in
        one call instead: ``completer(callbacks, error, ledger_id, entry_id, batched,
        partition, topic)``."""
        completer = self.completer
        if completer is not None:
            try:
                if chunk_positions is None:
                    completer(callbacks, error, ledger_id, entry_id, batched, self.partition,
                              self.topic)
                else:
                    completer(callbacks, error, ledger_id, entry_id, batched, self.partition,
                              self.topic, chunk_positions=chunk_positions)
            except Exception:
                log.exception("event=callback_failed topic=%s", self.topic)
            return
        topic = self.topic
        if error is None:
            partition = self.partition
            if chunk_positions is not None:
                try:
                    callbacks[0](None, ChunkMessageId(chunk_positions, partition, topic))
                except Exception:
                    log.exception("event=callback_failed topic=%s", topic)
            elif batched:
                count = len(callbacks)
                for i, callback in enumerate(callbacks):
                    try:
                        callback(None, MessageId(partition, ledger_id, entry_id, i, count, topic))
                    except Exception:
                        log.exception("event=callback_failed topic=%s", topic)
            else:
                try:
                    callbacks[0](None, MessageId(partition, ledger_id, entry_id, -1,
                                                 topic=topic))
                except Exception:
                    log.exception("event=callback_failed topic=%s", topic)
        else:
            for callback in callbacks:
                try:
                    callback(error, None)
                except Exception:
                    log.exception("event=callback_failed topic=%s", topic)

    def _on_receipt(self, conn: Connection, receipt: k.Receipt) -> None:
        if conn is not self.conn:
            return
        verdict, op = self._pending.on_receipt(receipt.sequence_id)
        if op is not None:
            self._complete(op, None, receipt.ledger_id, receipt.entry_id)
        elif verdict is k.ReceiptVerdict.UNEXPECTED:
            # the broker skipped a pending send: reconnect and resend, as the official clients
            log.warning("event=receipt_out_of_order topic=%s expected=%d got=%d", self.topic,
                        next(iter(self._pending)).first_seq, receipt.sequence_id)
            conn.close()
        # STALE: a receipt for a send that already failed (timed out) or a duplicate

    def _on_send_failed(self, conn: Connection, failure: k.SendFailed) -> None:
        if conn is not self.conn:
            return
        log.warning("event=send_error topic=%s sequence_id=%d error=%s message=%r", self.topic,
                    failure.sequence_id, pb.ServerError.Name(failure.error), failure.message)
        action = k.send_error_action(failure.error)
        if action is k.SendErrorAction.RECONNECT:
            # close the connection; once registered again the producer resends every pending
            # send in order (as the official clients)
            conn.close()
            return
        error = broker_error(failure.error, failure.message, f"send to {self.topic}")
        if action is k.SendErrorAction.FAIL_ALL:
            self._fail_all(self._pending.take_all(), error)
            return
        op = self._pending.remove(failure.sequence_id)   # FAIL_ONE: that send only
        if op is not None:
            self._complete(op, error, -1, -1)

    async def flush(self) -> None:
        self._flush_batch()
        if not self._pending:
            return
        waiter = self.loop.create_future()
        last = self._pending.last
        if last.waiters is None:
            last.waiters = []
        last.waiters.append(waiter)
        await waiter

    @property
    def pending_messages(self) -> int:
        return len(self._batch) + sum(op.count for op in self._pending)

    async def close(self) -> None:
        if self.closed:
            return
        try:
            if self.conn is not None:
                await asyncio.wait_for(self.flush(), self.client.operation_timeout_s)
        except (asyncio.TimeoutError, ClientError):
            pass
        self.closed = True
        self.client.unregister(self)
        if self._batch_timer is not None:
            self._batch_timer.cancel()
        if self._timeout_timer is not None:
            self._timeout_timer.cancel()
        error = AlreadyClosed(f"producer on {self.topic} closed before the message was sent")
        if len(self._batch):
            callbacks = self._batch.callbacks
            self._batch = k.BatchBuilder(self.conf.limits)
            self._deliver(callbacks, error)
        for op in self._pending.take_all():
            self._complete(op, error, -1, -1)
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            conn.producers.pop(self.producer_id, None)
            rid = self.client.next_request_id()
            try:
                await conn.request(c.close_producer(self.producer_id, rid), rid,
                                   f"close producer on {self.topic}")
            except ClientError:
                pass


class PartitionedProducerImpl:
    """A producer on a partitioned topic: one ProducerImpl per partition; messages with a key
    go to ``hash(key) % partitions`` (BoostHash by default, as the official Python client), others round robin (per batch when batching)."""

    def __init__(self, client: ClientImpl, topic: str, partitions: int, conf: ProducerConf,
                 hashing_scheme: k.HashingScheme = k.HashingScheme.BoostHash) -> None:
        self.client = client
        self.topic = topic
        self.conf = conf
        self.hashing_scheme = hashing_scheme
        self.producers = [ProducerImpl(client, f"{topic}-partition-{i}", conf, partition=i)
                          for i in range(partitions)]
        stick = conf.limits.messages_max if conf.batching_enabled else 1
        self.router = k.RoundRobin(partitions, start=client._random.randrange(partitions),
                                   stick_messages=stick)
        self.closed = False

    async def _start(self) -> None:
        results = await asyncio.gather(*(p._start() for p in self.producers),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(*(p.close() for p in self.producers), return_exceptions=True)
            raise errors[0]

    @property
    def producer_name(self) -> str | None:
        return self.producers[0].producer_name

    @property
    def last_sequence_id(self) -> int:
        return max(p.last_sequence_id for p in self.producers)

    @property
    def pending_messages(self) -> int:
        return sum(p.pending_messages for p in self.producers)

    def send(self, message: WireMessage | bytes, callback: Callback) -> None:
        if type(message) is not bytes and message.key:
            # an empty key routes like no key, as in the official client
            index = k.partition_for_key(message.key, len(self.producers), self.hashing_scheme)
        else:
            index = self.router.next()
        self.producers[index].send(message, callback)

    async def flush(self) -> None:
        await asyncio.gather(*(p.flush() for p in self.producers))

    async def close(self) -> None:
        self.closed = True
        await asyncio.gather(*(p.close() for p in self.producers), return_exceptions=True)


async def create_producer(client: ClientImpl, topic: str, conf: ProducerConf,
                          hashing_scheme: k.HashingScheme = k.HashingScheme.BoostHash):
    client.check_open()
    name = str(TopicName.parse(topic))
    deadline = client.loop.time() + client.operation_timeout_s
    partitions = await retry_until(deadline, client.loop, lambda: client.partitions_of(name),
                                    f"partitioned metadata of {name}")
    if partitions > 0:
        producer = PartitionedProducerImpl(client, name, partitions, conf, hashing_scheme)
    else:
        producer = ProducerImpl(client, name, conf)
    await producer._start()
    return producer
