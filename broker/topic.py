"""A persistent topic on its owner broker: producers, the publish path, subscriptions and their
dispatch (asyncio shell around :mod:`broker.dispatch`; DESIGN.md §2).

Publish: SEND -> the entry ``[meta_size][meta][payload]`` goes verbatim to the managed ledger
(publish time from its metadata) -> on confirmation it enters the broker's entry cache, the
producer's receipts go out in order, and the subscriptions are woken. Adds beyond the managed
ledger's pending limit wait in a FIFO backlog (order kept); bytes in flight count against the
broker's publish buffer, which pauses reading from producers' connections when full.

Dispatch: each subscription has a reader task. It reads new entries from its read position --
from the cache when tailing, from the managed ledger (read-ahead) when catching up -- offers
them to its :class:`DispatcherCore` and writes the deliveries. Entries to redeliver are fetched
again (cache, else the managed ledger), so nothing but read-ahead is held per subscription.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.adapters import open_cursor
from broker.dispatch import Delivery, DispatcherCore, SubType
from broker.managed_ledger import ManagedLedger, ManagedLedgerError, Position, next_position
from pulsarlite.errors import PulsarliteError
from pulsarlite.wire import pb
from pulsarlite.wire.entry import peek_metadata

log = logging.getLogger("pulsarlite.broker")

INT64_MAX = (1 << 63) - 1



class TopicNotOwnedError(PulsarliteError):
    """This broker may no longer own the topic; the client must look it up again."""

    retriable = True
    server_error = pb.ServiceNotReady

class ConsumerHandle(Protocol):
    """What a subscription needs of a consumer (implemented by the connection)."""

    consumer_id: int

    def send_message(self, position: Position, entry: bytes, redelivery_count: int) -> None: ...

    def close_by_broker(self) -> None: ...


class ProducerHandle(Protocol):
    producer_id: int

    def send_receipt(self, sequence_id: int, highest_sequence_id: int, position: Position) -> None: ...

    def send_error(self, sequence_id: int, error: BaseException) -> None: ...

    def close_by_broker(self) -> None: ...


# -- entry cache ---------------------------------------------------------------------------------
class EntryCache:
    """Recent confirmed entries of every topic of the broker, bounded in bytes (oldest out)."""

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.bytes = 0
        self._entries: OrderedDict[tuple[str, Position], tuple[bytes, int]] = OrderedDict()

    def put(self, topic: str, position: Position, data: bytes, message_count: int) -> None:
        if len(data) > self.bytes_max:
            return
        key = (topic, position)
        if key in self._entries:
            return
        self._entries[key] = (data, message_count)
        self.bytes += len(data)
        while self.bytes > self.bytes_max:
            _, (old, _) = self._entries.popitem(last=False)
            self.bytes -= len(old)

    def get(self, topic: str, position: Position) -> tuple[bytes, int] | None:
        return self._entries.get((topic, position))

    def drop_topic(self, topic: str) -> None:
        for key in [k for k in self._entries if k[0] == topic]:
            data, _ = self._entries.pop(key)
            self.bytes -= len(data)


# -- publish buffer ------------------------------------------------------------------------------
class PublishBuffer:
    """Bytes from SEND to receipt, per broker. Above ``bytes_max`` every connection that sends
    is paused (stops reading); all resume once below half. ``pauses`` counts the connections
    paused so far (metrics)."""

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.bytes = 0
        self.pauses = 0
        self._paused: set = set()

    def acquire(self, size: int, connection) -> None:
        self.bytes += size
        if self.bytes >= self.bytes_max and connection is not None and connection not in self._paused:
            self._paused.add(connection)
            self.pauses += 1
            connection.pause_reading()

    def release(self, size: int) -> None:
        self.bytes -= size
        if self._paused and self.bytes <= self.bytes_max // 2:
            paused, self._paused = self._paused, set()
            for connection in paused:
                connection.resume_reading()

    def forget(self, connection) -> None:
        self._paused.discard(connection)


# -- producers -----------------------------------------------------------------------------------
@dataclass
class _Send:
    sequence_id: int
    highest_sequence_id: int
    size: int
    message_count: int
    start_s: float = 0.0                 # monotonic time the SEND reached us (publish latency)
    position: Position | None = None
    error: BaseException | None = None
    done: bool = False


@dataclass
class Producer:
    handle: Any
    name: str
    connection: Any
    pending: deque = field(default_factory=deque)
    closed: bool = False
    producer_id: int = -1
    address: str = ""
    connected_since_ms: int = 0
    msg_in: int = 0                      # counters (stats); rates are derived by sampling
    bytes_in: int = 0


async def _maybe_await(value) -> None:
    if inspect.isawaitable(value):
        await value


class PersistentTopic:
    def __init__(self, service, name, ml: ManagedLedger) -> None:
        self.service = service
        self.name = name                    # TopicName
        self.key = str(name)
        self.ml = ml
        self._owned = service.ownership.write_guard(name)  # checked before every add
        self.producers: dict[str, Producer] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self._backlog: deque = deque()       # (send, producer, data, publish_time) waiting for room
        self._closing = False
        self._tasks: set[asyncio.Task] = set()
        # counters for stats and metrics (plain ints on the hot path; the service samples them)
        self.msg_in = 0
        self.bytes_in = 0
        self.msg_out = 0
        self.bytes_out = 0
        self.entries_added = 0
        self.latencies_s: list[float] = []   # publish latencies since the last metrics flush
        self.flushed = (0, 0, 0, 0)          # (msg_in, bytes_in, msg_out, bytes_out) given to metrics
        self.loaded_ms = int(time.time() * 1000)

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def config(self):
        return self.service.config

    # -- producers -------------------------------------------------------------------------------
    def add_producer(self, handle, name: str, connection) -> Producer:
        from broker.service import ProducerBusyError, ServiceNotReadyError
        if self._closing:
            raise ServiceNotReadyError(f"topic {self.key} is closing")
        if name in self.producers:
            raise ProducerBusyError(f"producer {name!r} is already connected to {self.key}")
        producer = Producer(handle, name, connection, producer_id=getattr(handle, "producer_id", -1),
                            address=_address_of(connection), connected_since_ms=int(time.time() * 1000))
        self.producers[name] = producer
        return producer

    def remove_producer(self, producer: Producer) -> None:
        producer.closed = True
        if self.producers.get(producer.name) is producer:
            del self.producers[producer.name]

    def publish(self, producer: Producer, sequence_id: int, highest_sequence_id: int, entry) -> None:
        data = bytes(entry)
        meta = peek_metadata(data)          # EntryFormatError: the caller answers SEND_ERROR
        op = _Send(sequence_id, highest_sequence_id, len(data), meta.message_count, time.monotonic())
        producer.pending.append(op)
        self.service.publish_buffer.acquire(op.size, producer.connection)
        publish_time = meta.publish_time_ms
        if self._closing:
            self._complete(producer, op, None, ManagedLedgerError(f"topic {self.key} is closing"))
        elif self._backlog or self.ml.pending_count >= self.config.pending_adds_max:
            self._backlog.append((op, producer, data, publish_time))
        else:
            self._add(op, producer, data, publish_time)

    def _add(self, op: _Send, producer: Producer, data: bytes, publish_time: int) -> None:
        if not self._owned():
            # session suspended or lost, or the bundle released: never write; the SEND_ERROR
            # makes the client reconnect through lookup to whoever owns the topic now
            self._complete(producer, op, None, TopicNotOwnedError(
                f"topic {self.key} is not owned by this broker now (ZooKeeper session not trusted)"))
            return
        try:
            fut = self.ml.add_async(data, publish_time)
        except Exception as e:     # refused at once (fenced, closed, failed)
            self._complete(producer, op, None, e)
            self._on_ml_error(e)
            return
        fut.add_done_callback(lambda f: self._on_added(producer, op, data, f))

    def _on_added(self, producer: Producer, op: _Send, data: bytes, fut: asyncio.Future) -> None:
        if fut.cancelled():
            self._complete(producer, op, None, ManagedLedgerError("add cancelled"))
        elif fut.exception() is not None:
            self._complete(producer, op, None, fut.exception())
            self._on_ml_error(fut.exception())
        else:
            position = fut.result()
            self.service.entry_cache.put(self.key, position, data, op.message_count)
            self.msg_in += op.message_count
            self.bytes_in += op.size
            self.entries_added += 1
            producer.msg_in += op.message_count
            producer.bytes_in += op.size
            if len(self.latencies_s) < LATENCY_SAMPLES_MAX:
                self.latencies_s.append(time.monotonic() - op.start_s)
            self._complete(producer, op, position, None)
            for sub in list(self.subscriptions.values()):
                sub.wake()
        self._drain_backlog()

    def _drain_backlog(self) -> None:
        while self._backlog and self.ml.pending_count < self.config.pending_adds_max:
            op, producer, data, publish_time = self._backlog.popleft()
            self._add(op, producer, data, publish_time)

    def _complete(self, producer: Producer, op: _Send, position: Position | None,
                  error: BaseException | None) -> None:
        op.position, op.error, op.done = position, error, True
        while producer.pending and producer.pending[0].done:
            done = producer.pending.popleft()
            self.service.publish_buffer.release(done.size)
            if producer.closed:
                continue
            if done.error is not None:
                producer.handle.send_error(done.sequence_id, done.error)
            else:
                producer.handle.send_receipt(done.sequence_id, done.highest_sequence_id, done.position)

    def _on_ml_error(self, error: BaseException) -> None:
        from broker.managed_ledger import ManagedLedgerFencedError
        self.service.on_add_error(error)
        if isinstance(error, ManagedLedgerFencedError) and not self._closing:
            log.warning("topic %s fenced: another broker owns it now; unloading", self.key)
            self._spawn(self.service.unload_topic(self.key))

    # -- subscriptions ---------------------------------------------------------------------------
    async def subscribe(self, consumer, subscription: str, sub_type: SubType, *, durable: bool,
                        initial_earliest: bool, start_message_id=None) -> "Subscription":
        from broker.service import ServiceNotReadyError
        if self._closing:
            raise ServiceNotReadyError(f"topic {self.key} is closing")
        sub = self.subscriptions.get(subscription)
        if sub is None:
            if durable:
                initial = self.earliest_mark_delete() if initial_earliest else self.last_position()
            else:
                initial = self._reader_start(start_message_id, initial_earliest)
            cursor = await open_cursor(self.service.store, self.name.managed_ledger_name, subscription,
                                       initial=initial, durable=durable, ledgers_of=self.ml.ledgers)
            sub = self.subscriptions.get(subscription)   # someone else may have won meanwhile
            if sub is None:
                sub = Subscription(self, subscription, sub_type, cursor, durable)
                self.subscriptions[subscription] = sub
        if sub.sub_type is not sub_type:
            from broker.service import SubscriptionBusyError
            raise SubscriptionBusyError(f"subscription {subscription} is {sub.sub_type.value}, "
                                        f"not {sub_type.value}")
        sub.add_consumer(consumer)
        return sub

    def _reader_start(self, start_message_id, earliest: bool) -> Position:
        """Mark-delete position for a non-durable cursor (a reader)."""
        if start_message_id is None:
            return self.earliest_mark_delete() if earliest else self.last_position()
        ledger, entry = start_message_id.ledgerId, start_message_id.entryId
        if ledger >= INT64_MAX and entry >= INT64_MAX:
            if ledger == INT64_MAX and entry == INT64_MAX:
                return self.last_position()
            return self.earliest_mark_delete()
        return Position(ledger, entry - 1)    # deliver from the start id on (the client filters)

    def earliest_mark_delete(self) -> Position:
        ledgers = self.ml.ledgers()
        return Position(ledgers[0].ledger_id, -1) if ledgers else Position(-1, -1)

    def last_position(self) -> Position:
        """The last entry's position; (current ledger, -1) for an empty topic."""
        for info in reversed(self.ml.ledgers()):
            if info.entries > 0:
                return Position(info.ledger_id, info.entries - 1)
        current = self.ml.current_ledger_id
        return Position(current if current is not None else -1, -1)

    def next_after(self, position: Position) -> Position:
        ledgers = self.ml.ledgers()
        try:
            return next_position(ledgers, position)
        except ValueError:   # a ledger no longer in the list: from the first that is
            for info in ledgers:
                if info.ledger_id > position.ledger_id:
                    return Position(info.ledger_id, 0)
            return Position(ledgers[-1].ledger_id, ledgers[-1].entries) if ledgers else position

    async def read_entry(self, position: Position) -> tuple[bytes, int] | None:
        cached = self.service.entry_cache.get(self.key, position)
        if cached is not None:
            self.service.cache_hits += 1
            return cached
        self.service.cache_misses += 1
        got = await self.ml.read_entries(position, 1)
        if not got or got[0][0] != position:
            return None
        data = got[0][1]
        return data, peek_metadata(data).message_count

    async def last_message_id(self) -> tuple[int, int, int]:
        """(ledger, entry, batch index) of the last message; entry -1 on an empty topic."""
        position = self.last_position()
        batch_index = -1
        if position.entry_id >= 0:
            got = await self.read_entry(position)
            if got is not None:
                meta = peek_metadata(got[0])
                if meta.batched:
                    batch_index = meta.message_count - 1
        return position.ledger_id, position.entry_id, batch_index

    async def remove_subscription(self, sub: "Subscription", *, delete_cursor: bool) -> None:
        if self.subscriptions.get(sub.name) is sub:
            del self.subscriptions[sub.name]
        await sub.close(delete_cursor=delete_cursor)

    # -- lifecycle -------------------------------------------------------------------------------
    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self, *, disconnect_clients: bool = True) -> None:
        """Stop accepting, let adds in flight finish, close subscriptions and the managed ledger."""
        if self._closing:
            return
        self._closing = True                 # new SENDs are refused from here on (clients resend)
        if disconnect_clients:
            await self._wait_adds_in_flight()   # their receipts go out before we disconnect
            for producer in list(self.producers.values()):
                producer.handle.close_by_broker()
        while self._backlog:
            op, producer, _, _ = self._backlog.popleft()
            self._complete(producer, op, None, ManagedLedgerError(f"topic {self.key} is closing"))
        for sub in list(self.subscriptions.values()):
            if disconnect_clients:
                for consumer in list(sub.consumers.values()):
                    consumer.close_by_broker()
            await sub.close(delete_cursor=False)
        self.subscriptions.clear()
        try:
            await self.ml.close()
        except Exception as e:
            log.warning("topic %s: closing the managed ledger failed: %s", self.key, e)
        self.service.entry_cache.drop_topic(self.key)

    async def _wait_adds_in_flight(self) -> None:
        """Wait (bounded by shutdown_grace_ms) until every add already accepted is confirmed or
        failed, so the producers get their receipts before they are disconnected."""
        deadline = time.monotonic() + self.config.shutdown_grace_ms / 1000
        while any(p.pending for p in self.producers.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def client_count(self) -> int:
        return len(self.producers) + sum(len(s.consumers) for s in self.subscriptions.values())

    def disconnect_clients(self) -> None:
        for producer in list(self.producers.values()):
            producer.handle.close_by_broker()
        for sub in list(self.subscriptions.values()):
            for consumer in list(sub.consumers.values()):
                consumer.close_by_broker()

    async def delete(self) -> None:
        """Close (clients disconnected) and delete the managed ledger with its cursors."""
        if not self._closing:
            self._closing = True
            self.disconnect_clients()
            while self._backlog:
                op, producer, _, _ = self._backlog.popleft()
                self._complete(producer, op, None, ManagedLedgerError(f"topic {self.key} is being deleted"))
            for sub in list(self.subscriptions.values()):
                await sub.close(delete_cursor=False)
            self.subscriptions.clear()
        self.service.entry_cache.drop_topic(self.key)
        await self.ml.delete()


LATENCY_SAMPLES_MAX = 1024     # publish latencies kept per topic between two metrics flushes


def _address_of(connection) -> str:
    peer = getattr(connection, "peer", None)
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"/{peer[0]}:{peer[1]}"
    return "" if peer is None else str(peer)


# -- subscriptions -------------------------------------------------------------------------------
class Subscription:
    def __init__(self, topic: PersistentTopic, name: str, sub_type: SubType, cursor, durable: bool) -> None:
        self.topic = topic
        self.name = name
        self.sub_type = sub_type
        self.cursor = cursor
        self.durable = durable
        self.core = DispatcherCore(sub_type, pending_entries_max=topic.config.read_ahead_entries_max)
        self.consumers: dict[int, Any] = {}       # id(handle) -> handle
        self.read_position = topic.next_after(cursor.mark_delete_position)
        self._payloads: dict[Position, bytes] = {}
        self._wake = asyncio.Event()
        self._closed = False
        self._epoch = 0                       # bumped by reset: reads begun before it are dropped
        self.msg_out = 0
        self.bytes_out = 0
        self._task = asyncio.ensure_future(self._run())
        self._ack_tasks: set[asyncio.Task] = set()

    # -- events from consumers -------------------------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    def add_consumer(self, consumer) -> None:
        self.core.add_consumer(id(consumer))      # ConsumerBusyError for a 2nd exclusive consumer
        self.consumers[id(consumer)] = consumer

    def remove_consumer(self, consumer) -> None:
        if self.consumers.pop(id(consumer), None) is None:
            return
        self.core.remove_consumer(id(consumer))
        self.wake()
        if not self.durable and not self.consumers:
            self.topic._spawn(self.topic.remove_subscription(self, delete_cursor=True))

    def flow(self, consumer, permits: int) -> None:
        self.core.flow(id(consumer), permits)
        self.wake()

    def ack(self, consumer, message_ids, *, cumulative: bool) -> None:
        for mid in message_ids:
            try:
                self._ack_one(consumer, mid, cumulative=cumulative)
            except ValueError as e:  # InvalidAckError: a bad id from the client changes nothing
                log.warning("subscription %s/%s: ack of %s:%s refused: %s", self.topic.key, self.name,
                            mid.ledgerId, mid.entryId, e)

    def _ack_one(self, consumer, mid, *, cumulative: bool) -> None:
        cursor = self.cursor
        position = Position(mid.ledgerId, mid.entryId)
        partial = bool(mid.ack_set) and any(mid.ack_set)
        if cumulative:
            if partial:
                return        # part of a batch: the entry before it is acked by a later ack
            self.core.ack_cumulative(id(consumer), position)
            self._track(cursor.ack_cumulative(position))
            for p in [p for p in self._payloads if p <= position]:
                del self._payloads[p]
        elif partial:
            ack_set = getattr(cursor, "ack_set", None)
            if ack_set is None:
                return        # the in-memory cursor of a reader does not track batch indexes
            size = mid.batch_size if mid.HasField("batch_size") else None
            self._track(ack_set(position, list(mid.ack_set), size))
            if cursor.is_acked(position):   # the last unacked index of the batch: entry done
                self.core.ack([position])
                self._payloads.pop(position, None)
        else:
            self.core.ack([position])
            self._payloads.pop(position, None)
            self._track(cursor.ack_individual(position))

    def _track(self, result) -> None:
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._ack_tasks.add(task)
            task.add_done_callback(self._ack_done)

    def _ack_done(self, task: asyncio.Task) -> None:
        self._ack_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("subscription %s/%s: ack failed: %s", self.topic.key, self.name, task.exception())

    def redeliver(self, consumer, message_ids=None) -> None:
        positions = None if not message_ids else [Position(m.ledgerId, m.entryId) for m in message_ids]
        self.core.redeliver(id(consumer), positions)
        self.wake()

    # -- the reader task -------------------------------------------------------------------------
    async def _run(self) -> None:
        backoff = 0.05
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._dispatch_round()
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("subscription %s/%s: dispatch failed (retrying in %.2fs): %r",
                            self.topic.key, self.name, backoff, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                self._wake.set()

    async def _dispatch_round(self) -> None:
        while not self._closed:
            progressed = False
            deliveries = self.core.dispatch()
            if deliveries:
                await self._deliver(deliveries)
                progressed = True
            want = self.core.read_wanted()
            if want > 0 and self.read_position <= self.topic.ml.last_confirmed_position:
                if await self._read(want):
                    progressed = True
            if not progressed:
                return

    async def _read(self, want: int) -> bool:
        topic = self.topic
        cache = topic.service.entry_cache
        entries: list[tuple[Position, bytes, int]] = []
        position = self.read_position
        last = topic.ml.last_confirmed_position
        epoch = self._epoch
        while len(entries) < want and position <= last:
            cached = cache.get(topic.key, position)
            if cached is None:
                break
            entries.append((position, cached[0], cached[1]))
            position = topic.next_after(position)
        if entries:
            topic.service.cache_hits += len(entries)
        else:
            got = await topic.ml.read_entries(position, want)
            topic.service.cache_misses += len(got)
            for p, data in got:
                entries.append((p, data, peek_metadata(data).message_count))
            if entries:
                position = topic.next_after(entries[-1][0])
        if self._closed or epoch != self._epoch or position < self.read_position:
            return False
        self.read_position = max(self.read_position, position)
        offered = []
        for p, data, count in entries:
            if self.cursor.is_acked(p):
                continue
            self._payloads[p] = data
            offered.append((p, count))
        self.core.offer(offered)
        return bool(entries)

    async def _deliver(self, deliveries: list[Delivery]) -> None:
        resolved = []
        for d in deliveries:
            data = self._payloads.pop(d.position, None)
            if data is None:
                got = await self.topic.read_entry(d.position)
                if got is None:     # gone from the log (trimmed): nothing to deliver
                    self.core.ack([d.position])
                    continue
                data = got[0]
            resolved.append((d, data))
        msgs = size = 0
        for d, data in resolved:
            consumer = self.consumers.get(d.consumer)
            if consumer is not None:
                consumer.send_message(d.position, data, d.redelivery_count)
                msgs += d.message_count
                size += len(data)
        self.msg_out += msgs
        self.bytes_out += size
        self.topic.msg_out += msgs
        self.topic.bytes_out += size

    # -- reset (seek) ------------------------------------------------------------------------------
    async def reset(self, position: Position) -> None:
        """Move the subscription so that ``position`` is delivered next: its consumers are
        disconnected first (they reconnect and receive from there), as Pulsar does."""
        for consumer in list(self.consumers.values()):
            consumer.close_by_broker()
        for consumer in list(self.consumers.values()):   # handles that did not remove themselves
            self.remove_consumer(consumer)
        self._epoch += 1
        self.core.clear_pending()
        self._payloads.clear()
        reset = getattr(self.cursor, "reset", None)
        if reset is not None:
            reset(position)
        else:      # the in-memory stand-in
            self.cursor.mark_delete_position = Position(position.ledger_id, position.entry_id - 1)
            getattr(self.cursor, "_acked", set()).clear()
        self.read_position = position
        await _maybe_await(self.cursor.flush())
        self.wake()

    # -- close -----------------------------------------------------------------------------------
    async def close(self, *, delete_cursor: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):
            pass
        if self._ack_tasks:
            await asyncio.gather(*self._ack_tasks, return_exceptions=True)
        try:
            if delete_cursor:
                await _maybe_await(self.cursor.delete())
            else:
                await _maybe_await(self.cursor.flush())
                close = getattr(self.cursor, "close", None)
                if close is not None:
                    await _maybe_await(close())
        except Exception as e:
            log.warning("subscription %s/%s: cursor close failed: %s", self.topic.key, self.name, e)


__all__ = ["ConsumerHandle", "EntryCache", "PersistentTopic", "Producer", "ProducerHandle",
           "PublishBuffer", "Subscription"]
