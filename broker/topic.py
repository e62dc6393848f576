"""A persistent topic on its owner broker: producers, the publish path, subscriptions and their
dispatch (asyncio shell around :mod:`broker.publish_core` and :mod:`broker.dispatch`;
docs/architecture.md#data-paths).

Publish: SEND -> the entry ``[meta_size][meta][payload]`` goes verbatim to the managed ledger
(publish time from its metadata) -> on confirmation it enters the broker's entry cache, the
producer's receipts go out in order, and the subscriptions are woken. Adds beyond the managed
ledger's pending limit wait in a FIFO backlog (order kept); bytes in flight count against the
broker's publish buffer, which pauses reading from producers' connections when full. What is
stored, answered, held or refused is decided by the topic's :class:`PublishCore` (sans I/O); this
shell executes its actions (:meth:`PersistentTopic._run`).

Dispatch: each subscription has a reader task. It reads new entries from its read position --
from the cache when tailing, from the managed ledger (read-ahead) when catching up -- offers
them to its :class:`DispatcherCore` and writes the deliveries. Entries to redeliver are fetched
again (cache, else the managed ledger), so nothing but read-ahead is held per subscription.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from collections import deque
from itertools import repeat
from typing import Any, Protocol

from broker.compaction.core import COMPACTION_CURSOR, last_index_of
from broker.compaction.shell import CompactedReader, compacted_view
from broker.admin.policies import NotFoundError, PreconditionFailedError
from broker.cursor import InvalidAckError, ManagedCursor
from broker.dedup import DedupSnapshotStore, DedupState, entry_sequence
from broker.dispatch import Delivery, DispatcherCore, KeySharedMode, SubType
from broker.errors import (ConsumerAssignError, ConsumerBusyError, NotAllowedError,  # noqa: F401 - re-exported
                           ProducerBusyError, ProducerFencedError, ServiceNotReadyError, TopicTerminatedError)
from broker.key_shared import sticky_key_hash
from broker.termination import write_terminated
from broker.topic_common import ExclusiveAccess, attach_consumer, check_edge, detach_consumer
from broker.latency import LatencyBuckets
from broker.managed_ledger import ManagedLedger, ManagedLedgerState, Position, next_position
from broker.publish_core import (AccessMode, Answer, Confirmed, CountAddError, DisconnectProducer, Producer,
                                 PublishCore, Send, StoreEntries, Unload, WriteState)
from pulsarlite.checksum import crc32c_of
from pulsarlite.counted_log import CountedCause
from pulsarlite.errors import InvariantViolation, check
from pulsarlite.metadata_layout import cursor_path
from pulsarlite.wire.entry import peek_metadata

log = logging.getLogger("pulsarlite.broker")

INT64_MAX = (1 << 63) - 1
SEQUENCE_ID_MAX = INT64_MAX          # a producer's sequence ids, as the official clients count them



class ConsumerHandle(Protocol):
    """What a subscription and the admin stats need of a consumer (implemented by the
    connection's ``_ConsumerRef``)."""

    consumer_id: int
    consumer_name: str
    address: str                  # the client's "/host:port"
    connected_since_ms: int
    client_version: str           # its connection's CONNECT client_version (stats)
    metadata: dict[str, str]      # the SUBSCRIBE's metadata (stats)

    def send_message(self, position: Position, entry: bytes, redelivery_count: int,
                     ack_set: list[int] | None = None) -> None: ...

    def send_messages(self, messages: list[tuple[Position, bytes, int, list[int] | None]]) -> None:
        """send_message for each (position, entry, redelivery_count, ack_set), in order, as one write."""

    def send_active_change(self, is_active: bool) -> None: ...

    def close_by_broker(self) -> None: ...


class ProducerHandle(Protocol):
    producer_id: int
    client_version: str           # its connection's CONNECT client_version (stats)
    metadata: dict[str, str]      # the PRODUCER's metadata (stats)

    def send_receipts(self, receipts: list[tuple[int, int, Position]]) -> None:
        """Receipts, ``[(sequence_id, highest_sequence_id, position), ...]`` in order (a single
        receipt is a list of one)."""

    def send_error(self, sequence_id: int, error: BaseException) -> None: ...

    def close_by_broker(self) -> None: ...


class ProducerConnection(Protocol):
    """What a topic needs of a producer's connection (``broker.connection.ServerConnection``):
    its address for stats, and back-pressure from the publish buffer."""

    @property
    def address(self) -> str: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


# -- entry cache ---------------------------------------------------------------------------------
class _CachedLedger:
    """The cached entries of one ledger of one topic, in entry order: ``datas[i]`` is entry
    ``base + i`` (None once evicted, below ``head``); Key_Shared slots beside them; message
    counts other than 1 and deliver_at_times by entry id. One object and a few lists per
    ledger, none per entry."""

    __slots__ = ("base", "head", "datas", "slots", "counts", "delays", "dropped")

    def __init__(self, base: int) -> None:
        self.base = base
        self.head = 0
        self.datas: list[bytes | None] = []
        self.slots: list[int | None] = []
        self.counts: dict[int, int] = {}
        self.delays: dict[int, int] = {}
        self.dropped = False          # its topic was dropped: its entries no longer counted

    def evict_head(self) -> int:
        """Drop the oldest entry kept; returns its size."""
        i = self.head
        datas = self.datas
        while datas[i] is None:       # entries never put (a gap): skipped
            i += 1
        data = datas[i]
        self.datas[i] = None
        self.slots[i] = None
        if self.counts:
            self.counts.pop(self.base + i, None)
        if self.delays:
            self.delays.pop(self.base + i, None)
        self.head = i = i + 1
        if i >= 1024 and 2 * i >= len(self.datas):       # forget the evicted prefix now and then
            del self.datas[:i], self.slots[:i]
            self.base += i
            self.head = 0
        return len(data)


class EntryCache:
    """Recent confirmed entries of every topic of the broker, bounded in bytes (oldest out).

    Entries are kept per ledger in entry order (a list per ledger of each topic), so dispatch
    reads a run of them as a slice (:meth:`read_run`); eviction follows the order of puts (a
    deque holding, per entry, a reference to its ledger's object). What dispatch needs from an
    entry's metadata is kept with it when the publish path read it: the Key_Shared hash slot of
    its sticky key and its deliver_at_time, so a read of cached entries parses no metadata
    (docs/decisions.md "[perf] Entries as runs").

    Holds no object the garbage collector tracks per entry (values are bytes, slots and counts
    ints; one object and its lists per ledger): with (topic, Position) keys and (bytes, count)
    values, three tracked objects per entry lived long enough to fill every young-generation
    collection: a 100k-object collection (30-200 ms pause) every ~30k messages, the largest
    source of the publish tail (BENCHMARKS.md "[perf] hot path")."""

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.bytes = 0
        self._ledgers: dict[tuple[int, int], _CachedLedger] = {}   # (topic number, ledger id) ->
        self._order: deque[_CachedLedger] = deque()   # one reference per entry put, oldest first
        self._dropped_refs = 0                         # references in _order to dropped ledgers
        self._topic_numbers: dict[str, int] = {}
        self._next_topic_number = 0          # never reused (a dropped topic's keys must not alias)

    @property
    def entry_count(self) -> int:
        return len(self._order) - self._dropped_refs

    def _new_topic_number(self, topic: str) -> int:
        self._next_topic_number += 1
        number = self._topic_numbers[topic] = self._next_topic_number
        return number

    def put(self, topic: str, position: Position, data: bytes, message_count: int,
            slot: int | None = None, deliver_at_ms: int = 0) -> None:
        """``slot``: the entry's Key_Shared hash slot if known (None: a reader parses the
        metadata); ``deliver_at_ms``: its deliver_at_time (0: none). Entries of a ledger are put
        in entry order; one put out of that order starts the ledger's list again from it."""
        if len(data) > self.bytes_max:
            return
        number = self._topic_numbers.get(topic) or self._new_topic_number(topic)
        ledger_id, entry_id = position
        if not (0 <= ledger_id < _U64_LIMIT and 0 <= entry_id < _U64_LIMIT):
            return                       # not a stored entry's position: never cached
        ledger = self._ledgers.get((number, ledger_id))
        if ledger is None:
            ledger = self._ledgers[(number, ledger_id)] = _CachedLedger(entry_id)
        else:
            end = ledger.base + len(ledger.datas)
            if entry_id != end:
                if ledger.base + ledger.head <= entry_id < end and ledger.datas[entry_id - ledger.base] is not None:
                    return               # already cached
                if end < entry_id <= end + _CACHE_GAP_MAX:      # entries not put (too big): a hole
                    ledger.datas.extend([None] * (entry_id - end))
                    ledger.slots.extend([None] * (entry_id - end))
                else:                    # out of order: the ledger's list starts again from it
                    self._drop_ledger(number, ledger_id)
                    ledger = self._ledgers[(number, ledger_id)] = _CachedLedger(entry_id)
        ledger.datas.append(data)
        ledger.slots.append(slot)
        if message_count != 1:
            ledger.counts[entry_id] = message_count
        if deliver_at_ms:
            ledger.delays[entry_id] = deliver_at_ms
        self._order.append(ledger)
        self.bytes += len(data)
        order = self._order
        while self.bytes > self.bytes_max:
            oldest = order.popleft()
            if oldest.dropped:
                self._dropped_refs -= 1
            else:
                self.bytes -= oldest.evict_head()

    def get(self, topic: str, position: Position) -> tuple[bytes, int] | None:
        number = self._topic_numbers.get(topic)
        if number is None:
            return None
        ledger_id, entry_id = position
        ledger = self._ledgers.get((number, ledger_id))
        if ledger is None:
            return None
        i = entry_id - ledger.base
        if not ledger.head <= i < len(ledger.datas) or ledger.datas[i] is None:
            return None
        return ledger.datas[i], ledger.counts.get(entry_id, 1)

    def read_run(self, topic: str, ledger_id: int, first_entry_id: int, last_entry_id: int) -> list[tuple]:
        """The cached entries ``first_entry_id ..`` of one ledger, in order, up to
        ``last_entry_id`` or the first one not cached: ``[(entry_id, data, message_count, slot or
        None, deliver_at_ms or 0), ...]`` (the same entries and counts as :meth:`get` one by one)."""
        number = self._topic_numbers.get(topic)
        ledger = self._ledgers.get((number, ledger_id)) if number is not None else None
        if ledger is None:
            return []
        i = first_entry_id - ledger.base
        if not ledger.head <= i < len(ledger.datas) or last_entry_id < first_entry_id:
            return []
        datas = ledger.datas
        j = min(last_entry_id - ledger.base + 1, len(datas))
        try:
            j = datas.index(None, i, j)      # a hole: the run stops before it
        except ValueError:
            pass
        ids = range(first_entry_id, first_entry_id + j - i)
        counts, delays = ledger.counts, ledger.delays
        return list(zip(ids, datas[i:j],
                        [counts.get(e, 1) for e in ids] if counts else repeat(1),
                        ledger.slots[i:j],
                        [delays.get(e, 0) for e in ids] if delays else repeat(0)))

    def drop_topic(self, topic: str) -> None:
        number = self._topic_numbers.pop(topic, None)
        if number is None:
            return
        for key in [k for k in self._ledgers if k[0] == number]:
            self._drop_ledger(*key)

    def _drop_ledger(self, number: int, ledger_id: int) -> None:
        ledger = self._ledgers.pop((number, ledger_id))
        kept = [d for d in ledger.datas[ledger.head:] if d is not None]
        self.bytes -= sum(len(d) for d in kept)
        self._dropped_refs += len(kept)
        ledger.dropped = True
        ledger.datas, ledger.slots, ledger.counts, ledger.delays = [], [], {}, {}
        if self._dropped_refs > 1024 and 2 * self._dropped_refs > len(self._order):
            self._order = deque(ledger for ledger in self._order if not ledger.dropped)
            self._dropped_refs = 0


_U64_LIMIT = 1 << 64
_CACHE_GAP_MAX = 1024    # entries of a ledger not put (too big) that its list keeps as holes


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


# -- producers: broker/publish_core.py holds them and the publish path's decisions -------------
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
        # the publish path's decisions (producers, write state, dedup holds, backlog); this shell
        # executes its actions (:meth:`_run`)
        self.core = PublishCore(self.key, pending_adds_max=service.config.managed_ledger.pending_adds_max)
        self._actions: deque = deque()
        self._running = False
        ml.kept_listeners.append(self._on_kept)
        ml.kept_unread_listeners.append(self._on_kept_unread)
        ml.rollover_listeners.append(self._on_rolled_over)
        self.subscriptions: dict[str, Subscription] = {}
        self._tasks: set[asyncio.Task] = set()
        # counters for stats and metrics (plain ints on the hot path; the service samples them)
        self.msg_in = 0
        self.bytes_in = 0
        self.msg_out = 0
        self.bytes_out = 0
        self.entries_added = 0
        self.publish_latency = LatencyBuckets()   # SEND-to-confirmation latencies since the last metrics fold
        self.flushed = (0, 0, 0, 0)          # (msg_in, bytes_in, msg_out, bytes_out) given to metrics
        self.loaded_ms = int(time.time() * 1000)
        self.quota_blocked = None            # a broker.retention.QuotaVerdict while over the backlog quota
        # Pulsar's terminate (broker/termination.py): once set, no SEND or producer is taken;
        # terminated_at is the last entry's position once every accepted add is done and stored
        self.terminating = False
        self.terminated_at: Position | None = None
        # producer access modes: the producer holding exclusive access, and those waiting for it
        self._access = ExclusiveAccess(self.key)
        # deduplication (None: disabled); see broker/dedup.py
        self._dedup_store = DedupSnapshotStore(service.store, name.managed_ledger_name) \
            if service.store is not None else None
        self._dedup_lock = asyncio.Lock()
        self._dedup_snapshot_task: asyncio.Task | None = None
        self._dedup_snapshot_position: Position | None = None
        # why this owner writes no more dedup snapshots (None: it does): entries in the log that
        # deduplication could not learn (a snapshot past them would hide them from the next owner)
        self._dedup_snapshots_stopped: str | None = None
        # the compacted view for read_compacted subscriptions (broker/compaction)
        self.compacted_reader = CompactedReader(self)

    def compacted_view(self):
        """The recorded compaction view (ledger + horizon), or None."""
        return compacted_view(self)

    async def _delete_compacted_ledger(self, view) -> None:
        """After the managed ledger is deleted: its compacted ledger (outside the list)."""
        if view is not None:
            try:
                await self.ml.delete_side_ledger(view.ledger_id)
            except Exception as e:   # noqa: BLE001 - left for the bookies' orphan collector
                log.warning("topic %s: compacted ledger=%d not deleted: %r", self.key, view.ledger_id, e)

    @property
    def closing(self) -> bool:
        return self.core.closing

    @property
    def write_state(self) -> WriteState:
        return self.core.write_state

    @property
    def producers(self) -> dict[str, Producer]:
        return self.core.producers

    @property
    def dedup(self) -> DedupState | None:
        """Deduplication's state (None: off); the core decides with it."""
        return self.core.dedup

    @dedup.setter
    def dedup(self, state: DedupState | None) -> None:
        self.core.dedup = state

    @property
    def config(self):
        return self.service.config

    # -- producers -------------------------------------------------------------------------------
    def add_producer(self, handle: ProducerHandle, name: str, connection: ProducerConnection | None, *,
                     access_mode: AccessMode = AccessMode.SHARED) -> Producer:
        """ProducerBusyError if the name is taken or the access mode conflicts (an exclusive
        producer exists, or Exclusive while others exist); ExclusiveWithFencing closes the others
        first. WaitForExclusive: call :meth:`wait_exclusive` first."""
        if self.write_state is WriteState.CLOSING:
            raise ServiceNotReadyError(f"topic {self.key} is closing")
        if self.terminating:
            raise TopicTerminatedError(f"topic {self.key} was terminated")
        if self.write_state is WriteState.BLOCKED:
            self._run(self.core.producer_wants_in(owned=self._owned(), ml_state=self.ml.state))
        if self.write_state is WriteState.BLOCKED:
            raise ServiceNotReadyError(f"topic {self.key} is blocked after a failed write until its adds in "
                                       f"flight are done and its ledger rolled over; retry")
        self._access.admit(name, access_mode, self.producers, self._fence)
        producer = Producer(handle, name, connection, producer_id=handle.producer_id,
                            address=connection.address if connection is not None else "",
                            connected_since_ms=int(time.time() * 1000),
                            access_mode=access_mode)
        self.core.producer_added(producer)
        self._access.added(producer)
        return producer

    def _fence(self, other: Producer) -> None:
        other.handle.close_by_broker()
        self.remove_producer(other)

    def exclusive_available(self) -> bool:
        return self._access.available(self.producers)

    async def wait_exclusive(self) -> None:
        """WaitForExclusive (broker/topic_common.py)."""
        await self._access.wait(self.producers, lambda: self.write_state is WriteState.CLOSING)

    def remove_producer(self, producer: Producer) -> None:
        self.core.producer_removed(producer)
        self._access.removed(producer, self.producers)

    # -- deduplication ---------------------------------------------------------------------------
    async def dedup_enabled_by_policy(self) -> bool:
        default = self.config.broker_deduplication_enabled
        policies = self.service.policies
        if policies is None:
            return default
        try:
            p = await policies.get_namespace_policies(self.name.namespace)
        except NotFoundError:
            return default
        return default if p.deduplication_enabled is None else bool(p.deduplication_enabled)

    async def refresh_dedup(self) -> None:
        """Follow the namespace's deduplicationEnabled (checked when a producer connects): on
        enable, load the snapshot and replay the log after it."""
        enabled = await self.dedup_enabled_by_policy()
        async with self._dedup_lock:
            if not enabled:
                if self.dedup is not None:
                    log.info("topic %s: deduplication disabled", self.key)
                self.dedup = None
                return
            if self.dedup is None and self._dedup_store is not None:
                self.dedup = await self._load_dedup()

    async def _load_dedup(self) -> DedupState:
        producers_max = self.config.dedup_producers_max
        data = await self._dedup_store.load()
        state, start = DedupState(producers_max=producers_max), None
        known: dict[str, int] = {}
        if data is not None:
            try:
                state, (ledger, entry) = DedupState.from_snapshot(data, producers_max=producers_max)
                start = self.next_after(Position(ledger, entry))
                known = {name: state.effective(name) for name in state.persisted}
            except ValueError as e:
                log.warning("topic %s: dedup snapshot unreadable (%s): replaying the whole log", self.key, e)
                state, known = DedupState(producers_max=producers_max), {}
        if start is None:
            start = self.next_after(self.earliest_mark_delete())
        last = self.ml.last_confirmed_position
        replayed = 0
        position = start
        while position <= last:
            got = await self.ml.read_entries(position, 100)
            if not got:
                break
            for p, data in got:
                try:
                    seq = entry_sequence(peek_metadata(data))
                except Exception:
                    seq = None
                if seq is not None:
                    state.replay(seq[0], seq[2], seq[1], crc32c_of(data))
                replayed += 1
            position = self.next_after(got[-1][0])
        state.open_after_load(known)
        state.label = self.key
        if state.holes:
            log.info("topic %s: dedup holes after the load: %s", self.key,
                     {name: list(hole) for name, hole in list(state.holes.items())[:20]})
        log.info("topic %s: deduplication on: snapshot %s, %d entries replayed, %d producers",
                 self.key, "found" if data is not None else "none", replayed, len(state.persisted))
        return state

    def last_sequence_id(self, name: str) -> int:
        return self.dedup.last_sequence_id(name) if self.dedup is not None else -1

    def start_producer_session(self, producer: Producer, epoch: int) -> int:
        """The ``last_sequence_id`` for this producer's PRODUCER_SUCCESS. With deduplication on
        and ``epoch`` > 0 (the client reconnects), its sends above it are decided by content
        from now on (broker/dedup.py: the official client may reset its counter to just above
        it); epoch 0 is a new producer instance, decided by id."""
        given = self.dedup.on_session_start(producer.name, reconnect=epoch > 0) if self.dedup is not None else -1
        producer.given_last_sequence_id = given
        return given

    def _maybe_snapshot_dedup(self, position: Position) -> None:
        interval = self.config.dedup_snapshot_interval_entries
        if self.dedup is None or self.dedup.entries_since_snapshot < interval or self._dedup_snapshots_stopped:
            return
        if self._dedup_snapshot_task is not None and not self._dedup_snapshot_task.done():
            return
        data = self.dedup.snapshot((position.ledger_id, position.entry_id))
        self._dedup_snapshot_position = position
        self._dedup_snapshot_task = self._spawn(self._write_dedup_snapshot(data))

    async def _write_dedup_snapshot(self, data: bytes) -> None:
        try:
            await self._dedup_store.save(data)
        except Exception as e:    # the next owner replays more of the log; nothing is lost
            log.warning("topic %s: dedup snapshot not written: %r", self.key, e)

    async def _final_dedup_snapshot(self) -> None:
        if self.dedup is None or self._dedup_store is None or self._dedup_snapshots_stopped:
            return
        if self._dedup_snapshot_task is not None:
            await asyncio.gather(self._dedup_snapshot_task, return_exceptions=True)
        last = self.ml.last_confirmed_position
        if last.entry_id < 0 or last == self._dedup_snapshot_position:
            return
        await self._write_dedup_snapshot(self.dedup.snapshot((last.ledger_id, last.entry_id)))

    def publish(self, producer: Producer, sends: list) -> list:
        """SENDs of one producer from one read, in order, ``[(sequence_id, highest_sequence_id,
        entry), ...]`` (a single SEND is a run of one): the ones that can be stored go to the
        publish core as one event, and are answered in order once stored (receipts) or failed
        (SEND_ERROR). Returns the ones refused at the edge, ``[(sequence_id, error), ...]``: an
        entry the broker must not store (unreadable metadata, a message's payload above
        ``message_bytes_max``, a declared uncompressed size above
        ``message_uncompressed_bytes_max``, sequence ids past
        int64 with deduplication on); nothing of them was taken, the caller answers each."""
        if self.terminating:
            return [(sequence_id, TopicTerminatedError(f"topic {self.key} was terminated"))
                    for sequence_id, _, _ in sends]
        dedup = self.core.dedup is not None
        message_bytes_max = self.service.config.message_bytes_max
        # what a compressed entry may declare and decompress to: the official producers bound the
        # COMPRESSED size, so a compressible message (or batch) above message_bytes_max arrives
        # whole; Pulsar's broker takes it (it checks the frame only). Our check decompresses it,
        # so the declared size is bounded by a separate, generous setting.
        uncompressed_bytes_max = self.service.config.message_uncompressed_bytes_max
        start_s = time.monotonic()
        ops: list[Send] = []
        datas: list[bytes] = []
        times: list[int] = []
        batched: list[bool] | None = [] if dedup else None      # deduplication's only
        refused: list = []
        size = 0
        for sequence_id, highest_sequence_id, entry in sends:
            data = bytes(entry)
            try:
                meta = check_edge(data, message_bytes_max, uncompressed_bytes_max)    # this send only
                if dedup:
                    is_batch = meta.batched
                    top = max(highest_sequence_id,
                              sequence_id + meta.message_count - 1 if is_batch else sequence_id)
                    if top > SEQUENCE_ID_MAX:
                        # the official clients count in int64; deduplication keeps ids as int64 too
                        raise NotAllowedError(f"sequence id {top} beyond {SEQUENCE_ID_MAX} with deduplication on")
                    # a chunk before the last: None (deduplication decides the last chunk only)
                    batched.append(None if 1 < meta.raw.num_chunks_from_msg != meta.raw.chunk_id + 1
                                   else is_batch)
            except Exception as e:     # noqa: BLE001 - whatever the entry is, answer it, keep serving
                refused.append((sequence_id, e))
                continue
            # meta.message_count and .publish_time_ms, read from the metadata directly (a batch's
            # count is >= 1 once check_sendable passed; a single message's field is unset: 1)
            raw = meta.raw
            size += len(data)
            op = Send(sequence_id, highest_sequence_id, len(data), raw.num_messages_in_batch or 1, start_s)
            # what dispatch reads of the metadata, kept with the entry in the cache (no parse per read)
            op.slot = _slot_of_key(raw.ordering_key or raw.partition_key or None)
            if raw.HasField("deliver_at_time"):
                op.deliver_at_ms = raw.deliver_at_time
            if raw.num_chunks_from_msg > 1:      # a chunk: a resend of a stored one is answered, not stored
                op.chunk = (raw.uuid, raw.chunk_id, raw.num_chunks_from_msg, crc32c_of(data))
            ops.append(op)
            datas.append(data)
            times.append(raw.publish_time)
        if ops:
            self.service.publish_buffer.acquire(size, producer.connection)
            digests = [crc32c_of(data) for data in datas] if dedup and not self.core.closing else None
            self._run(self.core.send(producer, ops, datas, times, batched, digests, owned=self._owned(),
                                     ml_state=self.ml.state))
        return refused

    def _on_stored(self, store: StoreEntries, first: int, last: int, position: Position | None,
                   error: BaseException | None) -> None:
        """The managed ledger's answer for entries ``first..last`` of ``store``."""
        self._run(self.core.entries_stored(store, first, last, position, error, owned=self._owned(),
                                           ml_state=self.ml.state))

    def _on_rolled_over(self, ledger_id: int) -> None:
        self._run(self.core.rolled_over(owned=self._owned(), ml_state=self.ml.state))

    def _on_kept_unread(self, first: Position, last: Position) -> None:
        """Entries a rollover found beyond the confirmed ones could not be read: deduplication
        cannot learn them here. No snapshot from now on (it would claim to cover them); the next
        owner replays the log from the last snapshot and learns them (found by the whole publish
        path's simulation, seed 6911: they were stored twice after a takeover)."""
        self._dedup_snapshots_stopped = f"entries {first}..{last} kept by recovery but not read"
        log.warning("topic %s: failed adds %s..%s kept by the recovery of their ledger could not be read: "
                    "no more deduplication snapshots from this owner (the next one replays them)",
                    self.key, first, last)

    def _on_kept(self, kept: list) -> None:
        """Entries a rollover found beyond the confirmed ones: adds that failed back to us but
        that the recovery of their ledger kept (deduplication learns them)."""
        learned = self.core.kept([(data, crc32c_of(data)) for _, data in kept])
        log.warning("topic %s: %d failed adds were kept by the recovery of their ledger (%d known to "
                    "deduplication)", self.key, len(kept), learned)

    # -- executing the publish core's actions ----------------------------------------------------
    def _run(self, actions: list) -> None:
        """Execute the core's actions in order; actions of events that arrive meanwhile (an
        add refused at once) queue behind them."""
        if not actions:
            return
        self._actions.extend(actions)
        if self._running:
            return
        self._running = True
        try:
            while self._actions:
                self._execute(self._actions.popleft())
        finally:
            self._running = False

    def _execute(self, action) -> None:
        kind = type(action)
        if kind is StoreEntries:
            try:     # a callback rather than a Future: one per run on the hot path
                self.ml.add_entries(action.datas, action.publish_times_ms, self._on_stored, action)
            except Exception as e:     # refused at once (fenced, closed, failed)
                self._on_stored(action, 0, len(action.ops) - 1, None, e)
        elif kind is Answer:
            self._release_done(action.producer)
        elif kind is Confirmed:
            self._confirmed(action.store, action.first, action.last)
        elif kind is DisconnectProducer:
            action.producer.handle.close_by_broker()
            self.remove_producer(action.producer)
        elif kind is CountAddError:
            self.service.on_add_error(action.error)
        elif kind is Unload:
            self._spawn(self.service.unload_topic(self.key))
        else:
            raise InvariantViolation(f"topic {self.key}: unknown action {action!r}")

    def _confirmed(self, store: StoreEntries, first: int, last: int) -> None:
        """Entries ``first..last`` of ``store`` are stored: cache, stats, subscriptions woken
        once, and deduplication's snapshot when it is due."""
        ops, datas = store.ops, store.datas
        put = self.service.entry_cache.put
        key = self.key
        messages = size = 0
        i = first
        while i <= last:                 # (not a range: its cost is the loop's for a run of one)
            op = ops[i]
            put(key, op.position, datas[i], op.message_count, op.slot, op.deliver_at_ms)
            messages += op.message_count
            size += op.size
            i += 1
        count = last - first + 1
        self.msg_in += messages
        self.bytes_in += size
        self.entries_added += count
        producer = store.producer
        producer.msg_in += messages
        producer.bytes_in += size
        self.publish_latency.add(time.monotonic() - ops[first].start_s, count)
        if ops[last].producer_name is not None and self.core.dedup is not None:
            self._maybe_snapshot_dedup(ops[last].position)
        if self.subscriptions:
            for sub in list(self.subscriptions.values()):
                sub.wake()

    def _release_done(self, producer: Producer) -> None:
        """The producer's sends done at the head of its queue: out of the publish buffer, and
        answered in order (receipt or SEND_ERROR)."""
        pending = producer.pending
        released = 0
        receipts = []
        handle = producer.handle
        send_receipts = handle.send_receipts
        while pending and pending[0].done:
            done = pending.popleft()
            released += done.size
            if producer.closed:
                continue
            if done.error is not None:
                if receipts:
                    send_receipts(receipts)
                    receipts = []
                handle.send_error(done.sequence_id, done.error)
            else:
                receipts.append((done.sequence_id, done.highest_sequence_id, done.position))
        if receipts:
            send_receipts(receipts)
        if released:
            self.service.publish_buffer.release(released)

    # -- subscriptions ---------------------------------------------------------------------------
    async def subscribe(self, consumer, subscription: str, sub_type: SubType, *, durable: bool,
                        initial_earliest: bool, start_message_id=None, priority: int = 0,
                        consumer_name: str = "", key_shared_mode: KeySharedMode = KeySharedMode.AUTO_SPLIT,
                        hash_ranges=None, allow_out_of_order: bool = False,
                        read_compacted: bool = False) -> "Subscription":
        if self.write_state is WriteState.CLOSING:
            raise ServiceNotReadyError(f"topic {self.key} is closing")
        if subscription == COMPACTION_CURSOR:
            raise NotAllowedError(f"subscription name {COMPACTION_CURSOR} is reserved for compaction")
        if read_compacted and sub_type not in (SubType.EXCLUSIVE, SubType.FAILOVER):
            # Pulsar: "Read compacted is only allowed on exclusive and failover subscriptions"
            raise NotAllowedError("read compacted is only allowed on Exclusive and Failover subscriptions")
        sub = self.subscriptions.get(subscription)
        if sub is None:
            if durable:
                initial = self.earliest_mark_delete() if initial_earliest else self.last_position()
            else:
                initial = self._reader_start(start_message_id, initial_earliest)
            # the function, not a snapshot: mark-delete must follow the list into new ledgers
            cursor = await ManagedCursor.open(self.service.store, self.name.managed_ledger_name, subscription,
                                              initial=initial, durable=durable, ledgers=self.ml.ledgers)
            sub = self.subscriptions.get(subscription)   # someone else may have won meanwhile
            if sub is None:
                sub = Subscription(self, subscription, sub_type, cursor, durable,
                                   key_shared_mode=key_shared_mode, allow_out_of_order=allow_out_of_order,
                                   read_compacted=read_compacted)
                self.subscriptions[subscription] = sub
        if read_compacted != sub.read_compacted and not sub.consumers:
            sub.read_compacted = read_compacted      # the new consumer's choice, as for its type
            sub.read_position = sub.resume_position()
        other_mode = sub_type is SubType.KEY_SHARED and sub.core.key_shared_mode is not key_shared_mode
        if (sub.sub_type is not sub_type or other_mode) and not sub.consumers:
            # no consumer connected: the subscription takes the new consumer's type (Pulsar's
            # addConsumer makes a new dispatcher then); its acks stay
            sub.change_type(sub_type, key_shared_mode=key_shared_mode, allow_out_of_order=allow_out_of_order)
        elif sub.sub_type is not sub_type:
            raise ConsumerBusyError(f"subscription {subscription} is {sub.sub_type.value}, "
                                        f"not {sub_type.value}")
        elif other_mode:
            raise ConsumerAssignError(f"subscription {subscription} is Key_Shared "
                                      f"{sub.core.key_shared_mode.value}, not {key_shared_mode.value}")
        try:
            sub.add_consumer(consumer, priority=priority, name=consumer_name, hash_ranges=hash_ranges)
        except Exception:
            if not sub.durable and not sub.consumers:    # a reader's subscription nobody uses
                await self.remove_subscription(sub, delete_cursor=True)
            raise
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

    async def create_stored_subscription(self, name: str, initial: Position) -> bool:
        """Create the durable subscription ``name``, its cursor stored (not loaded) with the
        mark-delete position ``initial``; False, nothing changed, when the topic has it already
        (loaded or stored)."""
        store, ml_name = self.service.store, self.name.managed_ledger_name
        if name in self.subscriptions or await store.exists(cursor_path(ml_name, name)):
            return False
        cursor = await ManagedCursor.open(store, ml_name, name, initial=initial, durable=True, ledgers=self.ml.ledgers)
        await cursor.close()
        return True

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

    async def find_by_publish_time(self, publish_time_ms: int) -> Position:
        """The first entry whose publish time is >= ``publish_time_ms`` (binary search within
        the first ledger that may hold one, as Pulsar's findNewestMatching assumes publish times
        grow along the log); after the last entry if none."""
        last = self.ml.last_confirmed_position
        for info in self.ml.ledgers():
            if info.entries <= 0 or info.ledger_id > last.ledger_id:
                continue
            if info.max_publish_time_ms is not None and info.max_publish_time_ms < publish_time_ms \
                    and info.ledger_id != last.ledger_id:
                continue
            hi = info.entries - 1 if info.ledger_id != last.ledger_id else last.entry_id
            lo, found = 0, None
            while lo <= hi:
                mid = (lo + hi) // 2
                got = await self.read_entry(Position(info.ledger_id, mid))
                if got is None:
                    break
                if peek_metadata(got[0]).publish_time_ms >= publish_time_ms:
                    found, hi = mid, mid - 1
                else:
                    lo = mid + 1
            if found is not None:
                return Position(info.ledger_id, found)
        return self.next_after(last) if last.entry_id >= 0 else Position(max(last.ledger_id, 0), 0)

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
        if self.write_state is WriteState.CLOSING:
            return
        self.core.begin_closing()            # new SENDs are refused from here on (clients resend)
        self._access.release_waiters()
        if disconnect_clients:
            await self._wait_adds_in_flight()   # their receipts go out before we disconnect
            for producer in list(self.producers.values()):
                producer.handle.close_by_broker()
        try:
            await self._final_dedup_snapshot()
        except Exception as e:
            log.warning("topic %s: final dedup snapshot failed: %r", self.key, e)
        self._run(self.core.fail_backlog("closing"))
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

    async def terminate(self) -> Position:
        """Pulsar's terminate: SENDs and new producers are refused from now on; once every add
        already accepted is done, the last entry's position is stored (broker/termination.py),
        the producers are disconnected (they come back to TopicTerminated) and the position is
        returned. ServiceNotReadyError (retry) if adds are still in flight after the grace time:
        the topic stays closed to writes and a repeat answers once they are done."""
        if self.terminated_at is not None:
            return self.terminated_at
        if self.write_state is WriteState.CLOSING:
            raise ServiceNotReadyError(f"topic {self.key} is closing")
        self.terminating = True
        self._run(self.core.fail_backlog("terminated"))      # sends still waiting for room
        # settled: no add in flight, no rollover under way (its recovery may keep failed adds
        # beyond the confirmed ones: they must come before the position), not blocked
        deadline = time.monotonic() + self.config.shutdown_grace_ms / 1000
        while True:
            if self.write_state is WriteState.BLOCKED:
                self._run(self.core.producer_wants_in(owned=self._owned(), ml_state=self.ml.state))
            if (self.write_state is WriteState.OPEN and self.core.adds_in_flight == 0
                    and self.ml.state is not ManagedLedgerState.ROLLING_OVER
                    and not any(p.pending for p in self.producers.values())):
                break
            if time.monotonic() >= deadline:
                raise ServiceNotReadyError(f"topic {self.key}: adds or a rollover still under way, "
                                           f"terminate again later")
            await asyncio.sleep(0.01)
        position = await write_terminated(self.service.store, self.name.managed_ledger_name,
                                          self.ml.last_confirmed_position)
        self.terminated_at = position
        for producer in list(self.producers.values()):
            producer.handle.close_by_broker()
        log.info("topic terminated topic=%s position=%s:%s", self.key, position.ledger_id, position.entry_id)
        return position

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
        if self.write_state is not WriteState.CLOSING:
            self.core.begin_closing()
            self.disconnect_clients()
            self._run(self.core.fail_backlog("being deleted"))
            for sub in list(self.subscriptions.values()):
                await sub.close(delete_cursor=False)
            self.subscriptions.clear()
        self.service.entry_cache.drop_topic(self.key)
        view = self.compacted_view()
        await self.ml.delete()
        await self._delete_compacted_ledger(view)
        if self._dedup_store is not None:
            try:
                await self._dedup_store.delete()
            except Exception as e:
                log.warning("topic %s: dedup snapshot not deleted: %r", self.key, e)


KEY_SHARED_LOOK_AHEAD_FACTOR = 10   # Key_Shared: pending entries bound = read_ahead_entries_max * this
READER_SEEK_WAIT_S = 60.0      # a reader's subscription is kept this long after a seek without consumers


def _slot_of(data: bytes) -> int:
    """Key_Shared hash slot of a stored entry: its ordering key, else partition key, else NONE_KEY."""
    return _slot_of_metadata(peek_metadata(data).raw)


def _slot_of_metadata(raw) -> int:
    """Key_Shared hash slot of an entry's parsed MessageMetadata (see _slot_of)."""
    return _slot_of_key(raw.ordering_key or raw.partition_key or None)


# the slot of a sticky key (ordering key bytes, partition key str, or None), memoised: a topic's
# keys repeat, and the publish path computes it for every entry
_slot_of_key = functools.lru_cache(maxsize=4096)(sticky_key_hash)


# -- subscriptions -------------------------------------------------------------------------------
SKIP_READ_ENTRIES_MAX = 256      # entries read per round trip by an admin skip
SKIP_INDEXES_PER_TURN = 4096     # batch indexes an admin skip acks before it lets the loop run


async def skip_messages(topic: "PersistentTopic", cursor, count: int) -> int:
    """Acknowledge on ``cursor`` the next ``count`` unacknowledged messages of ``topic`` after its
    mark-delete position (admin skip): whole entries, and of a batch only as many indexes as are
    left to skip. Returns how many were skipped (fewer when the backlog is shorter)."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    skipped = 0
    last = topic.ml.last_confirmed_position
    position = topic.next_after(cursor.mark_delete_position)
    while skipped < count and last.entry_id >= 0 and position <= last:
        # each entry holds at least one message: never more entries than messages left to skip
        got = await topic.ml.read_entries(position, min(SKIP_READ_ENTRIES_MAX, count - skipped))
        got = [(p, data) for p, data in got if p <= last]
        if not got:
            break
        for entry_position, data in got:
            if skipped >= count:
                break
            batch_size = max(1, peek_metadata(data).message_count)
            left = cursor.remaining_batch_indexes(entry_position, batch_size)   # None: all of them
            left_count = batch_size if left is None else len(left)
            if left_count and left_count <= count - skipped:
                if cursor.ack_individual(entry_position):
                    skipped += left_count
            elif left_count:
                # part of a batch: one ack per index, never a set the size of what an entry's
                # metadata claims, and the loop yields now and then (a client chose the count)
                indexes = range(count - skipped) if left is None else sorted(left)[:count - skipped]
                for n, index in enumerate(indexes, 1):
                    try:
                        cursor.ack_individual(entry_position, batch_index=index, batch_size=batch_size)
                    except InvalidAckError as e:
                        # a batch of more messages than the cursor acks by index (its
                        # batch_size_max; a SEND may carry up to message_bytes_max / 6): the
                        # cursor refuses the first index, so nothing of this entry was skipped
                        raise PreconditionFailedError(
                            f"cannot skip part of the batch at {entry_position} ({batch_size} messages: {e}); "
                            f"{skipped} messages before it were skipped; skip all {left_count} of it or "
                            f"stop before it") from None
                    skipped += 1
                    if n % SKIP_INDEXES_PER_TURN == 0:
                        await asyncio.sleep(0)
        position = topic.next_after(got[-1][0])
    return skipped


class Subscription:
    def __init__(self, topic: PersistentTopic, name: str, sub_type: SubType, cursor, durable: bool, *,
                 key_shared_mode: KeySharedMode = KeySharedMode.AUTO_SPLIT, allow_out_of_order: bool = False,
                 read_compacted: bool = False) -> None:
        self.topic = topic
        # deliver the compacted view up to its horizon, then the log after it (broker/compaction)
        self.read_compacted = read_compacted
        self._compacted_acks: dict[Position, tuple[int, ...]] = {}   # survivors of compacted batches
        self.name = name
        self.sub_type = sub_type
        self.cursor = cursor
        self.durable = durable
        self._acks_refused = CountedCause()      # bad ack ids from clients: logged at a bounded rate
        self.core = self._new_core(sub_type, key_shared_mode, allow_out_of_order)
        self._seeking = False                 # a seek is disconnecting the consumers
        self._delayed_timer: asyncio.TimerHandle | None = None   # wakes dispatch when a delayed entry is due
        self._delayed_timer_at = 0
        self.consumers: dict[int, Any] = {}       # id(handle) -> handle
        self.read_position = self.resume_position()
        self._payloads: dict[Position, bytes] = {}
        self._payload_bytes_max = 0           # >= the size of every payload in _payloads (_round_entries_max)
        self._wake = asyncio.Event()
        self._closed = False
        self._epoch = 0                       # bumped by reset: reads begun before it are dropped
        self.msg_out = 0
        self.bytes_out = 0
        self._task = asyncio.ensure_future(self._run())
        self._ack_tasks: set[asyncio.Task] = set()

    def _new_core(self, sub_type: SubType, key_shared_mode: KeySharedMode,
                  allow_out_of_order: bool) -> DispatcherCore:
        partition = self.topic.name.partition_index
        read_ahead = self.topic.config.dispatch.read_ahead_entries_max
        if sub_type is SubType.KEY_SHARED:
            # entries of a consumer out of permits wait in the pending set while the others'
            # go ahead: a longer look-ahead (as Pulsar's) keeps the others busy meanwhile
            read_ahead *= KEY_SHARED_LOOK_AHEAD_FACTOR
        return DispatcherCore(sub_type, pending_entries_max=read_ahead,
                              partition_index=partition if isinstance(partition, int) else -1,
                              key_shared_mode=key_shared_mode, allow_out_of_order=allow_out_of_order)

    def change_type(self, sub_type: SubType, *, key_shared_mode: KeySharedMode, allow_out_of_order: bool) -> None:
        """Take another type (or Key_Shared mode) while no consumer is connected, as Pulsar's
        PersistentSubscription.addConsumer does: a new dispatcher core; the cursor (acks) is
        kept; what was read ahead is dropped and read again from the mark-delete position
        (redelivery counts start over, as with Pulsar's new dispatcher)."""
        if self.consumers:
            raise InvariantViolation(f"subscription {self.topic.key}/{self.name}: type change with consumers")
        log.info("subscription type changed topic=%s subscription=%s from=%s to=%s", self.topic.key, self.name,
                 self.sub_type.value, sub_type.value)
        self.sub_type = sub_type
        self.core = self._new_core(sub_type, key_shared_mode, allow_out_of_order)
        self._epoch += 1                      # reads begun for the old core are dropped
        self._payloads.clear()
        self.read_position = self.resume_position()

    # -- events from consumers -------------------------------------------------------------------
    def resume_position(self) -> Position:
        """Where reading resumes after the mark-delete position. With read_compacted and the
        mark-delete before the horizon, a position the compacted view is searched from: the
        cursor's "earliest" (entry -1 of the first ledger of the list) reads the whole view,
        whose messages may be in ledgers retention has trimmed since."""
        md = self.cursor.mark_delete_position
        if self.read_compacted:
            view = self.topic.compacted_view()
            if view is not None and md < view.horizon:
                ledgers = self.topic.ml.ledgers()
                if md.entry_id < 0 and (not ledgers or md.ledger_id <= ledgers[0].ledger_id):
                    return Position(0, 0)
                return Position(md.ledger_id, md.entry_id + 1)
        return self.topic.next_after(md)

    async def last_message_id(self) -> tuple[int, int, int]:
        """GET_LAST_MESSAGE_ID for this subscription's consumer. A read_compacted one, on a topic
        whose last entry is within the compacted view, gets the view's last message (Pulsar's
        ServerCnx does the same): what the topic has past it was compacted away, and a reader's
        hasMessageAvailable would otherwise wait for it forever."""
        topic = self.topic
        if self.read_compacted:
            view = topic.compacted_view()
            last = topic.last_position()
            if view is not None and last <= view.horizon:
                if view.entries == 0:
                    return last.ledger_id, -1, -1
                entry = (await topic.compacted_reader.read_from_index(view, view.entries - 1))
                if entry.ack_set is not None:
                    batch_index = last_index_of(entry.ack_set)
                else:
                    meta = peek_metadata(entry.data)
                    batch_index = meta.message_count - 1 if meta.batched else -1
                return entry.position.ledger_id, entry.position.entry_id, batch_index
        return await topic.last_message_id()

    def wake(self) -> None:
        self._wake.set()

    def forget_payloads_through(self, position: Position) -> None:
        """Drop the read-ahead entries at or before ``position`` (acked up to it: never sent)."""
        for p in [p for p in self._payloads if p <= position]:
            del self._payloads[p]

    def add_consumer(self, consumer, *, priority: int = 0, name: str = "", hash_ranges=None) -> None:
        attach_consumer(self.sub_type, self.core, self.consumers, consumer, priority=priority, name=name,
                        hash_ranges=hash_ranges, writable=getattr(consumer, "writable", True))
        self.wake()

    def remove_consumer(self, consumer) -> None:
        if not detach_consumer(self.sub_type, self.core, self.consumers, consumer):
            return
        self.wake()
        if not self.durable and not self.consumers and not self._seeking:
            self.topic._spawn(self.topic.remove_subscription(self, delete_cursor=True))

    def flow(self, consumer, permits: int) -> None:
        self.core.flow(id(consumer), permits)
        self.wake()

    def set_writable(self, consumer, writable: bool) -> None:
        """Back-pressure from the consumer's connection: dispatch to it pauses (permits kept)
        while its write buffer is above the high-water mark, and resumes when it drained."""
        if id(consumer) not in self.consumers:
            return
        self.core.set_writable(id(consumer), writable)
        if writable:
            self.wake()

    def ack(self, consumer, message_ids, *, cumulative: bool) -> None:
        """CumulativeAckNotAllowedError (nothing changed) for a cumulative ack on Shared/Key_Shared."""
        if cumulative:
            self.core.check_cumulative_allowed()
        last = self.topic.ml.last_confirmed_position
        run: list[Position] = []       # whole entries acked individually: to the cursor and core as one run
        new_tuple = tuple.__new__       # Position(...) without the named tuple's Python-level __new__
        for mid in message_ids:
            try:
                if cumulative or (mid.ack_set and any(mid.ack_set)):
                    self._ack_one(consumer, mid, cumulative=cumulative, last=last)
                else:
                    position = new_tuple(Position, (mid.ledgerId, mid.entryId))
                    if position > last or position.entry_id < 0 or position.ledger_id < 0:
                        self._valid_position(mid, last)       # raises, saying why
                    run.append(position)
            except ValueError as e:  # InvalidAckError: a bad id from the client changes nothing
                self._ack_refused(Position(mid.ledgerId, mid.entryId), e)
        if run:
            _, refused = self.cursor.ack_entries(run)
            if refused:
                for position, e in refused:
                    self._ack_refused(position, e)
                bad = {position for position, _ in refused}
                run = [p for p in run if p not in bad]
            self.core.ack(run)
            payloads = self._payloads
            if payloads:
                for position in run:
                    payloads.pop(position, None)
        if self.sub_type is SubType.KEY_SHARED and self.core.pending_count:
            self.wake()       # an ack may free a key held by another consumer (order after a join)

    def _ack_refused(self, position: Position, error: Exception) -> None:
        if self._acks_refused.due():
            log.warning("subscription %s/%s: ack of %s:%s refused: %s (%d refused so far)", self.topic.key,
                        self.name, position.ledger_id, position.entry_id, error, self._acks_refused.count)

    @staticmethod
    def _valid_position(mid, last: Position) -> Position:
        position = Position(mid.ledgerId, mid.entryId)
        if position.ledger_id < 0 or position.entry_id < 0 or position > last:
            # a message id the topic never delivered: a cumulative ack of (2^63, 2^63) would move
            # the subscription past every existing and future message
            raise ValueError(f"no such message in the topic (last entry {tuple(last)})")
        return position

    def _ack_one(self, consumer, mid, *, cumulative: bool, last: Position) -> None:
        """A cumulative ack, or an ack of batch indexes (the whole-entry individual acks are
        handled as a run by :meth:`ack`)."""
        cursor = self.cursor
        position = self._valid_position(mid, last)
        partial = bool(mid.ack_set) and any(mid.ack_set)
        if cumulative:
            if partial:
                # inside a batch (batch-index acks): everything before the entry, and the
                # indexes the ack_set clears (Pulsar's mark-delete with an ack set); the entry
                # stays outstanding until its last index is acked
                size = mid.batch_size if mid.HasField("batch_size") else None
                self._track(cursor.ack_cumulative(position, ack_set=list(mid.ack_set), batch_size=size))
                if not cursor.is_acked(position):
                    position = Position(position.ledger_id, position.entry_id - 1)
            else:
                self._track(cursor.ack_cumulative(position))
            self.core.ack_cumulative(id(consumer), position)
            self.forget_payloads_through(position)
        else:
            check(partial, "an individual whole-entry ack goes through Subscription.ack's run")
            size = mid.batch_size if mid.HasField("batch_size") else None
            self._track(cursor.ack_set(position, list(mid.ack_set), size))
            if cursor.is_acked(position):   # the last unacked index of the batch: entry done
                self.core.ack([position])
                self._payloads.pop(position, None)

    def _track(self, result) -> None:
        if result is None or result.__class__ is bool:     # the common, synchronous answer
            return
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
            if self.core.delayed_count:
                self.core.release_due(int(time.time() * 1000))
            deliveries = self.core.dispatch(self._round_entries_max())
            if deliveries:
                await self._deliver(deliveries)
                progressed = True
            want = self.core.read_wanted()
            if want > 0 and self.read_position <= self.topic.ml.last_confirmed_position:
                if await self._read(want):
                    progressed = True
            if not progressed:
                self._schedule_delayed_wake()
                return

    def _round_entries_max(self) -> int:
        """How many entries one dispatch round may give: those (lowest first, as the core gives
        them) whose read-ahead bytes fit connection_write_high_water_bytes, at least one. Between
        rounds a consumer's connection may pause (its buffer passed the mark), so a catch-up of
        multi-MiB entries never piles its permits' worth into one write buffer. An entry not read
        ahead (redelivered) counts 0 bytes here."""
        budget = self.topic.config.dispatch.connection_write_high_water_bytes
        payloads = self._payloads
        pending = self.core.pending_count
        if pending * self._payload_bytes_max <= budget:
            return max(pending, 1)       # every pending entry fits: what the walk below finds
        n = total = 0
        for p in self.core.iter_pending():
            data = payloads.get(p)
            total += len(data) if data is not None else 0
            n += 1
            if total >= budget:
                break
        return max(n, 1)

    async def _read_compacted(self, view, want: int) -> bool:
        """Read from the compacted ledger (read_position <= horizon): its entries at or after
        read_position, offered under their original positions; once none is left, reading
        continues after the horizon."""
        topic, epoch = self.topic, self._epoch
        got = await topic.compacted_reader.read_from(view, self.read_position, want)
        if self._closed or epoch != self._epoch:
            return False
        got = [e for e in got if e.position <= view.horizon]
        if not got:
            self.read_position = max(self.read_position, topic.next_after(view.horizon))
            return True
        last = got[-1].position
        self.read_position = Position(last.ledger_id, last.entry_id + 1)
        offered = []
        mark_delete = self.cursor.mark_delete_position
        for entry in got:
            p = entry.position
            # below the mark-delete only when reading the whole view (see resume_position): the
            # message is in a ledger trimmed since, and not consumed
            if p > mark_delete and self.cursor.is_acked(p):
                continue
            self._payloads[p] = entry.data
            self._payload_bytes_max = max(self._payload_bytes_max, len(entry.data))
            if entry.ack_set is not None:
                self._compacted_acks[p] = entry.ack_set
            offered.append((p, peek_metadata(entry.data).message_count))
        self.core.offer(offered)
        return True

    async def _read(self, want: int) -> bool:
        topic = self.topic
        if self.read_compacted:
            view = topic.compacted_view()
            if view is not None and self.read_position <= view.horizon:
                return await self._read_compacted(view, want)
        cache = topic.service.entry_cache
        # runs of entries, one per ledger: (ledger id, [(entry id, data, message count, slot or
        # None, deliver_at_ms or 0), ...]); from the cache the metadata's fields come with the
        # entry (kept by the publish path), from the bookies they are parsed here
        runs: list[tuple[int, list[tuple]]] = []
        n = 0
        position = self.read_position
        last = topic.ml.last_confirmed_position
        epoch = self._epoch
        # the last entry of the ledger being read: up to it, the next position is the next entry
        # of the same ledger (topic.next_after copies the ledger list: too dear once per entry)
        end_ledger, end_entry = last.ledger_id, last.entry_id
        while n < want and position <= last:
            ledger_id, first = position
            if ledger_id != end_ledger:
                end_ledger, end_entry = ledger_id, self._last_entry_of(ledger_id)
            stop = max(first, min(end_entry, first + want - n - 1))
            run = cache.read_run(topic.key, ledger_id, first, stop)
            if not run:
                break
            runs.append((ledger_id, run))
            n += len(run)
            last_read = run[-1][0]
            if 0 <= last_read < end_entry:
                position = Position(ledger_id, last_read + 1)
            else:
                position = topic.next_after(Position(ledger_id, last_read))
            if last_read < stop:
                break                    # the next entry is not cached: read it next round
        if runs:
            topic.service.cache_hits += n
        else:
            got = await topic.ml.read_entries(position, want)
            topic.service.cache_misses += len(got)
            for p, data in got:
                meta = peek_metadata(data)
                raw = meta.raw
                entry = (p.entry_id, data, meta.message_count, _slot_of_metadata(raw),
                         raw.deliver_at_time if raw.HasField("deliver_at_time") else 0)
                if runs and runs[-1][0] == p.ledger_id:
                    runs[-1][1].append(entry)
                else:
                    runs.append((p.ledger_id, [entry]))
            if got:
                position = topic.next_after(got[-1][0])
        if self._closed or epoch != self._epoch or position < self.read_position:
            return False
        self.read_position = max(self.read_position, position)
        offered = []
        append = offered.append
        payloads = self._payloads
        key_shared = self.sub_type is SubType.KEY_SHARED
        delays = key_shared or self.sub_type is SubType.SHARED
        now_ms = int(time.time() * 1000)
        if not payloads:
            self._payload_bytes_max = 0
        largest = self._payload_bytes_max
        new_tuple = tuple.__new__       # Position(...) without the named tuple's Python-level __new__
        for ledger_id, run in runs:
            acked = self.cursor.acked_in_run(ledger_id, run[0][0], run[-1][0])
            for entry_id, data, count, slot, deliver_at_ms in run:
                if acked and entry_id in acked:
                    continue
                p = new_tuple(Position, (ledger_id, entry_id))
                if slot is None and delays:      # cached without the fields (not by the publish path)
                    raw = peek_metadata(data).raw
                    slot = _slot_of_metadata(raw)
                    deliver_at_ms = raw.deliver_at_time if raw.HasField("deliver_at_time") else 0
                if delays and deliver_at_ms > now_ms:
                    # delayed delivery: held by the core until due (payload re-read then)
                    self.core.offer_delayed(p, count, deliver_at_ms, slot if key_shared else 0)
                    continue
                payloads[p] = data
                if len(data) > largest:
                    largest = len(data)
                append((p, count, slot) if key_shared else (p, count))
        self._payload_bytes_max = largest
        self.core.offer(offered)
        return bool(runs)

    def _last_entry_of(self, ledger_id: int) -> int:
        """The last entry id of a ledger of the topic (-1: not in the list, or empty)."""
        last = self.topic.ml.last_confirmed_position
        if ledger_id == last.ledger_id:
            return last.entry_id
        for info in self.topic.ml.ledgers():
            if info.ledger_id == ledger_id:
                return info.entries - 1
        return -1

    async def _deliver(self, deliveries: list[Delivery]) -> None:
        resolved = []
        payloads_pop = self._payloads.pop
        for d in deliveries:
            data = payloads_pop(d.position, None)
            if data is None and self.read_compacted:
                view = self.topic.compacted_view()
                if view is not None and d.position <= view.horizon:
                    entry = await self.topic.compacted_reader.read_at(view, d.position)
                    if entry is None:      # not in the view (compacted away): nothing to deliver
                        self.core.ack([d.position])
                        continue
                    data = entry.data
                    if entry.ack_set is not None:
                        self._compacted_acks[d.position] = entry.ack_set
            if data is None:
                got = await self.topic.read_entry(d.position)
                if got is None:     # gone from the log (trimmed): nothing to deliver
                    self.core.ack([d.position])
                    continue
                data = got[0]
            resolved.append((d, data))
        msgs = size = 0
        remaining = self.cursor.remaining_ack_set
        # a read_compacted subscription reading the whole view gets messages below its
        # mark-delete position (in ledgers trimmed since; see resume_position): not consumed
        view_floor = self.cursor.mark_delete_position if self.read_compacted else None
        compacted_acks = self._compacted_acks
        consumers = self.consumers
        out: dict[Any, tuple[Any, list]] = {}
        for (key, position, count, redelivery_count), data in resolved:
            consumer = consumers.get(key)
            if consumer is None:
                continue
            ack_set = None
            if count > 1 and (view_floor is None or position > view_floor):
                # a partly acked batch goes with the indexes still to deliver (set bits)
                ack_set = remaining(position, count)
            if compacted_acks:
                survivors = compacted_acks.pop(position, None)
                if survivors is not None:
                    ack_set = list(survivors) if ack_set is None else \
                        [a & b for a, b in zip(ack_set, survivors)]
                    while ack_set and not ack_set[-1]:
                        ack_set.pop()
            if ack_set is not None and not ack_set:
                self.core.ack([position])     # acked meanwhile: nothing to deliver
                continue
            batch = out.get(key)
            if batch is None:
                batch = out[key] = (consumer, [])
            batch[1].append((position, data, redelivery_count, ack_set or None))
            msgs += count
            size += len(data)
        for consumer, messages in out.values():     # one write per consumer, in the core's order
            consumer.send_messages(messages)
        self.msg_out += msgs
        self.bytes_out += size
        self.topic.msg_out += msgs
        self.topic.bytes_out += size

    # -- reset (seek) ------------------------------------------------------------------------------
    async def seek(self, *, message_id=None, publish_time_ms: int | None = None) -> Position:
        """SEEK by message id (earliest / latest / an entry: delivered from it on, inclusive;
        the client drops it itself unless its start is inclusive) or by publish time (the first
        entry published at or after it). Returns the position delivered next."""
        topic = self.topic
        if publish_time_ms is not None:
            position = await topic.find_by_publish_time(publish_time_ms)
        else:
            ledger, entry = message_id.ledgerId, message_id.entryId
            if ledger >= INT64_MAX and entry >= INT64_MAX:
                if ledger == INT64_MAX and entry == INT64_MAX:      # latest
                    position = topic.next_after(topic.last_position()) \
                        if topic.last_position().entry_id >= 0 else Position(max(topic.last_position().ledger_id, 0), 0)
                else:                                                # earliest (-1 as uint64)
                    position = topic.next_after(topic.earliest_mark_delete())
            else:
                position = Position(ledger, entry)
        if position.ledger_id < 0 or position.entry_id < 0:
            position = Position(max(position.ledger_id, 0), 0)
        position = self._clamp(position)
        await self.reset(position)
        log.info("subscription %s/%s: seek to %s", topic.key, self.name, position)
        return position

    def _clamp(self, position: Position) -> Position:
        """A seek position from a client, moved onto the log: past the end -> just after the last
        entry; in a ledger not (or no longer) in the list -> the next ledger's first entry."""
        topic = self.topic
        last = topic.ml.last_confirmed_position
        if last.entry_id >= 0 and position > last:
            return topic.next_after(last)
        ledgers = topic.ml.ledgers()
        ids = {info.ledger_id for info in ledgers}
        if ledgers and position.ledger_id not in ids:
            later = [i for i in sorted(ids) if i > position.ledger_id]
            return Position(later[0], 0) if later else topic.next_after(last)
        return position

    def _disconnect_for_reset(self) -> None:
        """Disconnect the consumers (they reconnect and receive from the cursor's new state, as
        Pulsar's do after a reset) and drop what was read ahead or handed out."""
        self._seeking = True
        try:
            for consumer in list(self.consumers.values()):
                consumer.close_by_broker()
            for consumer in list(self.consumers.values()):   # handles that did not remove themselves
                self.remove_consumer(consumer)
        finally:
            self._seeking = False
        if not self.durable:     # a reader's subscription waits a while for the reader to come back
            self.topic._spawn(self._drop_if_unused(READER_SEEK_WAIT_S))
        self._epoch += 1
        self.core.clear_pending()
        self._payloads.clear()

    @contextlib.asynccontextmanager
    async def _admin_cursor_move(self):
        """Around an admin move of the mark-delete position (skip, expiry): the consumers are
        disconnected first; after it, failed or not, reading resumes after the mark-delete
        position, the cursor is flushed and dispatch woken."""
        self._disconnect_for_reset()
        try:
            yield
        finally:
            self.read_position = self.resume_position()
            await _maybe_await(self.cursor.flush())
            self.wake()

    async def skip(self, count: int) -> int:
        """Admin skip: acknowledge the next ``count`` unacknowledged messages after the
        mark-delete position (whole entries; of a batch only as many indexes as are left to
        skip). Consumers are disconnected first, as for a reset. Returns how many messages were
        skipped (fewer than ``count`` when the backlog is shorter)."""
        cursor, topic = self.cursor, self.topic
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        if not self.durable:
            raise TypeError("this subscription's cursor cannot skip (not durable)")
        # resumed and flushed also when it stops at a batch it cannot skip part of (what it skipped stays)
        async with self._admin_cursor_move():
            skipped = await skip_messages(topic, cursor, count)
        log.info("subscription %s/%s: skipped %d messages (asked %d)", topic.key, self.name, skipped, count)
        return skipped

    async def mark_delete_through(self, position: Position) -> bool:
        """Admin expiry (Pulsar's expireMessages): acknowledge cumulatively every entry up to
        ``position``; messages acknowledged one by one after it stay acknowledged. Consumers
        are disconnected first, as for a skip (what they were handed is dispatched again from
        the cursor). False, and nothing disturbed, when the mark-delete position is already
        there."""
        if not self.durable:
            raise TypeError("this subscription's cursor cannot be moved by an admin (not durable)")
        cursor = self.cursor
        if position <= cursor.mark_delete_position:
            return False
        async with self._admin_cursor_move():
            changed = cursor.ack_cumulative(position)
        return bool(changed)

    async def reset(self, position: Position) -> None:
        """Move the subscription so that ``position`` is delivered next: its consumers are
        disconnected first (they reconnect and receive from there), as Pulsar does."""
        self._disconnect_for_reset()
        self.cursor.reset(position)
        self.read_position = self.resume_position() if self.read_compacted else position
        await _maybe_await(self.cursor.flush())
        self.wake()

    def _schedule_delayed_wake(self) -> None:
        due = self.core.next_due_ms()
        if due is None or self._closed:
            return
        timer = self._delayed_timer
        if timer is not None and not timer.cancelled() and self._delayed_timer_at <= due:
            return
        if timer is not None:
            timer.cancel()
        delay_s = max(0.0, (due - time.time() * 1000) / 1000) + 0.001
        self._delayed_timer_at = due
        self._delayed_timer = asyncio.get_running_loop().call_later(delay_s, self._delayed_due)

    def _delayed_due(self) -> None:
        self._delayed_timer = None
        self.wake()

    async def _drop_if_unused(self, wait_s: float) -> None:
        await asyncio.sleep(wait_s)
        if not self._closed and not self.consumers and self.topic.subscriptions.get(self.name) is self:
            await self.topic.remove_subscription(self, delete_cursor=True)

    # -- close -----------------------------------------------------------------------------------
    async def close(self, *, delete_cursor: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if self._delayed_timer is not None:
            self._delayed_timer.cancel()
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
                await _maybe_await(self.cursor.close())
        except Exception as e:
            log.warning("subscription %s/%s: cursor close failed: %s", self.topic.key, self.name, e)


__all__ = ["ConsumerHandle", "EntryCache", "PersistentTopic", "Producer", "ProducerHandle",
           "PublishBuffer", "Subscription"]
