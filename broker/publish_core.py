"""A topic's publish path, sans I/O (docs/architecture.md#style "pure core, thin shell"; models: h11, Dask's
worker_state_machine): producers' SENDs and the managed ledger's outcomes come in as events,
what the shell must do comes out as actions, in order. It holds

- the write state (:class:`WriteState`, a transition table drives it): OPEN; BLOCKED after a
  failed write until the adds in flight are done and the rollover the failure started has
  ended (producers disconnected, SENDs and new producers refused: nothing a producer sent after
  the failed message is stored before its resend); CLOSING for good;
- the producers' registry and each producer's sends in order (receipts go out in order);
- deduplication's decisions (:class:`broker.dedup.DedupState` and the per-producer hold of
  sends whose first copy is still being written);
- the backlog of adds waiting for room under ``pending_adds_max``.

One path per operation: SENDs come in as runs (:meth:`PublishCore.send`, the SENDs of one
producer from one read; a single SEND is a run of one), go out as runs of adds
(:class:`StoreEntries`: one managed-ledger call for consecutive stores of one producer), and
come back as ranges (:meth:`PublishCore.entries_stored`).

The shell (:class:`broker.topic.PersistentTopic`) executes the actions: :class:`StoreEntries`
(adds to the managed ledger, whose outcomes come back as :meth:`PublishCore.entries_stored`),
:class:`Answer` (the producer's finished sends at the head of its queue: receipts and
SEND_ERRORs, publish buffer released), :class:`Confirmed` (cache, stats, subscriptions woken),
:class:`DisconnectProducer`, :class:`CountAddError` and :class:`Unload`. Whether the broker
still owns the topic and the managed ledger's state are given with the events that need them.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from broker.dedup import ChunkResends, DedupState, DupStatus, entry_sequence
from broker.errors import ServiceNotReadyError, TopicNotOwnedError
from broker.managed_ledger import (ManagedLedgerError, ManagedLedgerFencedError, ManagedLedgerState,
                                   Position)
from pulsarlite.errors import InvariantViolation
from pulsarlite.wire.entry import peek_metadata

log = logging.getLogger("pulsarlite.broker")

DUP_POSITION = Position(-1, -1)          # the receipt of a duplicate (as Pulsar's -1:-1)


class WriteState(enum.Enum):
    """Whether the topic takes SENDs and producers. ("Fence" keeps its BookKeeper meaning: a
    ledger another writer can no longer add to; the topic's own temporary refusal is a block.)"""

    OPEN = "open"            # SENDs stored, producers added
    BLOCKED = "blocked"      # a write failed: producers disconnected, SENDs and producers refused
                             # until the adds in flight are done and the ledger rolled over
    CLOSING = "closing"      # close/unload/delete: refused for good (clients look the topic up again)


WRITE_STATE_TRANSITIONS = {
    WriteState.OPEN: frozenset({WriteState.BLOCKED, WriteState.CLOSING}),
    WriteState.BLOCKED: frozenset({WriteState.OPEN, WriteState.CLOSING}),
    WriteState.CLOSING: frozenset(),
}


class AccessMode(enum.Enum):
    """Producer access modes (CommandProducer.producer_access_mode)."""

    SHARED = 0
    EXCLUSIVE = 1
    WAIT_FOR_EXCLUSIVE = 2
    EXCLUSIVE_WITH_FENCING = 3


@dataclass(slots=True)
class Send:
    """One SEND, from its arrival to its answer."""

    sequence_id: int
    highest_sequence_id: int
    size: int
    message_count: int
    start_s: float = 0.0                 # monotonic time the SEND reached us (publish latency)
    position: Position | None = None
    error: BaseException | None = None
    done: bool = False
    producer_name: str | None = None     # set when deduplication tracks this add
    dedup_highest: int = -1              # the highest sequence id this add covers (dedup)
    dedup_digest: int | None = None      # CRC32C of the entry (dedup: a resend has the same bytes)
    waiters: list | None = None          # producers whose held sends wait for this add (dedup)
    held: tuple | None = None            # (data, publish time) while held (dedup)
    dedup_skip: bool = False             # a chunk before the last of a chunked message (dedup)
    chunk: tuple | None = None           # (uuid, chunk id, chunks, CRC32C) of a chunk (ChunkResends)
    slot: int | None = None              # Key_Shared hash slot of its sticky key (for the entry cache)
    deliver_at_ms: int = 0               # its deliver_at_time, 0 if none (for the entry cache)


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
    access_mode: AccessMode = AccessMode.SHARED
    duplicates: int = 0                  # SENDs answered as duplicates (dedup)
    given_last_sequence_id: int = -1     # what PRODUCER_SUCCESS told this session (dedup)
    held: deque = field(default_factory=deque)   # sends not decided yet, in order (dedup)
    resumed: bool = False                # this session's first send was seen (dedup)


# -- actions --------------------------------------------------------------------------------------
class StoreEntries(NamedTuple):
    """Add ``datas`` (the entries of ``ops``, in order) to the managed ledger in one call; each
    outcome comes back as :meth:`PublishCore.entries_stored` for a range of offsets. Consecutive
    stores of one producer join the last StoreEntries while the core builds its actions.
    (StoreEntries, Answer and Confirmed, built for every run, are NamedTuples for speed, as the
    managed ledger core's WriteEntries: docs/decisions.md "[perf] Hot-path records".)"""

    producer: Producer
    ops: list
    datas: list
    publish_times_ms: list


class Answer(NamedTuple):
    """The producer's finished sends at the head of its queue go out, in order."""

    producer: Producer


class Confirmed(NamedTuple):
    """Entries ``first..last`` of a StoreEntries are stored (each op's position is set)."""

    store: StoreEntries
    first: int
    last: int


@dataclass(frozen=True)
class DisconnectProducer:
    producer: Producer


@dataclass(frozen=True)
class CountAddError:
    error: BaseException


@dataclass(frozen=True)
class Unload:
    reason: str


def _first_copy_of(inflight: Send, op: Send, by_content: bool) -> bool:
    """Whether ``inflight`` (pushed, not done) is a copy of ``op`` (dedup): the same ids and bytes
    in a content range, else any add whose ids cover op's."""
    if by_content:
        return (inflight.sequence_id == op.sequence_id and inflight.dedup_highest == op.dedup_highest
                and inflight.dedup_digest == op.dedup_digest)
    return inflight.sequence_id <= op.sequence_id and op.dedup_highest <= inflight.dedup_highest


class PublishCore:
    def __init__(self, key: str, *, pending_adds_max: int) -> None:
        self.key = key
        self.pending_adds_max = pending_adds_max
        self.write_state = WriteState.OPEN
        self.producers: dict[str, Producer] = {}
        self.dedup: DedupState | None = None
        self.adds_in_flight = 0              # stored and not done: the managed ledger's pending adds
        self._backlog: deque = deque()       # (op, producer, data, publish time) waiting for room
        self._dedup_inflight: dict[str, deque] = {}     # producer name -> ops pushed, not done
        self.chunk_resends = ChunkResends()  # chunks stored here: a resent one is answered, not stored
        self._out: list = []
        # given with each event: whether this broker still owns the topic (ZooKeeper session
        # trusted), and the managed ledger's state
        self._owned = True
        self._ml_state = ManagedLedgerState.READY

    def _event(self, owned: bool, ml_state: ManagedLedgerState) -> None:
        self._owned = owned
        self._ml_state = ml_state

    # -- queries -----------------------------------------------------------------------------
    @property
    def closing(self) -> bool:
        return self.write_state is WriteState.CLOSING

    @property
    def backlog_count(self) -> int:
        return len(self._backlog)

    # -- events --------------------------------------------------------------------------------
    def producer_added(self, producer: Producer) -> None:
        self.producers[producer.name] = producer

    def producer_removed(self, producer: Producer) -> None:
        producer.closed = True
        if self.producers.get(producer.name) is producer:
            del self.producers[producer.name]

    def producer_wants_in(self, *, owned: bool, ml_state: ManagedLedgerState) -> list:
        """A producer asks to register while the topic is BLOCKED: the block may have ended (an
        event the shell did not see), or the managed ledger may be gone for good (unload)."""
        self._event(owned, ml_state)
        self._maybe_unblock()
        if self.write_state is WriteState.BLOCKED:
            if ml_state is ManagedLedgerState.FENCED:       # another owner: unload
                self._ml_error(ManagedLedgerFencedError(f"topic {self.key}: managed ledger fenced"))
            elif ml_state is ManagedLedgerState.FAILED:     # its rollover gave up: reopen
                self._ml_error(ServiceNotReadyError(f"topic {self.key}: managed ledger failed"))
        return self._take()

    def send(self, producer: Producer, ops: list, datas: list, publish_times_ms: list, batched: list | None,
             digests: list | None, *, owned: bool, ml_state: ManagedLedgerState) -> list:
        """SENDs of one producer, in order (their sizes in the publish buffer already): ``ops``
        with their entries and publish times. ``batched`` (whether each is a batch) and
        ``digests`` (each entry's CRC32C): when deduplication is on (else None); ``batched`` is
        None for a chunk before the last of a chunked message: its chunks share one sequence
        id, only the last is decided and recorded by deduplication, the others are stored
        (Pulsar's MessageDeduplication, apache/pulsar#20948). The lists are the core's from
        now on (a StoreEntries may take them)."""
        self._event(owned, ml_state)
        producer.pending.extend(ops)
        if self.chunk_resends and self.write_state is WriteState.OPEN and self._owned:
            ops, datas, publish_times_ms, batched, digests = self._answer_stored_chunks(
                producer, ops, datas, publish_times_ms, batched, digests)
            if not ops:
                return self._take()
        dedup = self.dedup
        if dedup is not None and self.write_state is not WriteState.CLOSING:
            was_idle = not producer.held
            for op, data, publish_time_ms, is_batch, digest in zip(ops, datas, publish_times_ms, batched,
                                                                  digests or [None] * len(ops)):
                if is_batch is None:
                    op.dedup_skip = True
                highest = op.highest_sequence_id
                if is_batch:   # a batch covers sequence_id .. + count - 1 (highest_sequence_id may be unset)
                    highest = max(highest, op.sequence_id + op.message_count - 1)
                op.dedup_highest = highest
                op.dedup_digest = digest
                # decided in order, per producer: a send whose first copy is still being written
                # waits for that copy's outcome, and the producer's later sends wait behind it,
                # so that a failed first copy is re-sent before anything sent after it (order kept)
                op.held = (data, publish_time_ms)
                producer.held.append(op)
            if was_idle:
                self._decide_held(producer)
            return self._take()
        self._store(producer, ops, datas, publish_times_ms)
        return self._take()

    def entries_stored(self, store: StoreEntries, first: int, last: int, position: Position | None,
                       error: BaseException | None, *, owned: bool, ml_state: ManagedLedgerState) -> list:
        """The outcome of entries ``first..last`` of ``store``: stored at consecutive positions
        from ``position``, or failed with ``error``."""
        self._event(owned, ml_state)
        self.adds_in_flight -= last - first + 1
        producer = store.producer
        ops = store.ops
        if error is not None:
            self._block_writes(error)
            for i in range(first, last + 1):
                self._complete(producer, ops[i], None, error)
            self._maybe_unblock()
            self._ml_error(error)      # once per range: one count, one unload, one log line
        else:
            ledger_id, entry_id = position
            dedup = self.dedup
            offsets = range(first, last + 1)
            for i in offsets:
                op = ops[i]
                op.position = Position(ledger_id, entry_id) if i != first else position
                entry_id += 1
                if op.chunk is not None:
                    uuid, chunk_id, chunks, digest = op.chunk
                    self.chunk_resends.on_stored(producer.name, uuid, chunk_id, chunks, digest, op.position)
                if op.producer_name is not None and dedup is not None:
                    dedup.on_persisted(op.producer_name, op.dedup_highest, op.sequence_id, op.dedup_digest)
            self._out.append(Confirmed(store, first, last))
            for i in offsets:
                op = ops[i]
                if op.producer_name is None and op.waiters is None:
                    op.done = True       # all _complete does for it but the answer (once, below)
                else:
                    self._complete(producer, op, op.position, None)
            self._answer(producer)
        if self._backlog:
            self._drain_backlog()
        if self.write_state is WriteState.BLOCKED:
            self._maybe_unblock()
        return self._take()

    def rolled_over(self, *, owned: bool, ml_state: ManagedLedgerState) -> list:
        self._event(owned, ml_state)
        self._maybe_unblock()
        return self._take()

    def kept(self, entries: list[tuple[bytes, int]]) -> int:
        """Entries a rollover found beyond the confirmed ones, as ``(data, crc32c)``: adds that
        failed back but that the recovery of their ledger kept. Deduplication learns them (a
        producer's resend of one is then a duplicate, not a second copy). Returns how many."""
        learned = 0
        for data, digest in entries:
            if self.dedup is None:
                break
            try:
                seq = entry_sequence(peek_metadata(data))
            except Exception:     # not a producer's entry we can read: nothing to learn
                seq = None
            if seq is not None:
                self.dedup.on_persisted(seq[0], seq[2], seq[1], digest)
                learned += 1
        return learned

    def begin_closing(self) -> None:
        """CLOSING: SENDs and producers refused for good (adds in flight still finish, and what
        waits for room may still go as they do, until :meth:`fail_backlog`)."""
        if self.write_state is not WriteState.CLOSING:
            self._to(WriteState.CLOSING)

    def fail_backlog(self, why: str) -> list:
        """What still waits for room fails (the topic is ``why``: closing, being deleted)."""
        while self._backlog:
            op, producer, _, _ = self._backlog.popleft()
            self._complete(producer, op, None, ManagedLedgerError(f"topic {self.key} is {why}"))
        return self._take()

    # -- decisions -----------------------------------------------------------------------------
    def _take(self) -> list:
        dedup = self.dedup
        if dedup is not None and dedup.holes and not self._dedup_inflight:
            dedup.on_nothing_in_flight()      # every push is done: the holes' refill points settle
        out, self._out = self._out, []
        return out

    def _answer_stored_chunks(self, producer: Producer, ops: list, datas: list, publish_times_ms: list,
                              batched: list | None, digests: list | None) -> tuple:
        """A chunk this topic already stored for this producer and chunked message (same uuid,
        chunk id and bytes: :class:`broker.dedup.ChunkResends`) is answered with the stored
        copy's position, not stored again: a whole chunked message resent after part of it was
        stored leaves ``c0 c1 c2'``, not ``c0 c1 c0' c1' c2'``. Returns the SENDs still to store."""
        resends = self.chunk_resends
        keep = None
        for i, op in enumerate(ops):
            chunk = op.chunk
            position = None if chunk is None else resends.check(producer.name, chunk[0], chunk[1], chunk[3])
            if position is None:
                if keep is not None:
                    keep.append(i)
                continue
            if keep is None:
                keep = list(range(i))
            log.info("chunk resend answered topic=%s producer=%s uuid=%s chunk_id=%d position=%s",
                     self.key, producer.name, chunk[0], chunk[1], position)
            self._complete(producer, op, position, None)
        if keep is None:
            return ops, datas, publish_times_ms, batched, digests
        return ([ops[i] for i in keep], [datas[i] for i in keep], [publish_times_ms[i] for i in keep],
                None if batched is None else [batched[i] for i in keep],
                None if digests is None else [digests[i] for i in keep])

    def _to(self, state: WriteState) -> None:
        if state not in WRITE_STATE_TRANSITIONS[self.write_state]:
            raise InvariantViolation(f"topic {self.key}: write state {self.write_state.value} -> {state.value}")
        self.write_state = state

    def _decide_held(self, producer: Producer) -> None:
        """Decide a producer's held sends in order (dedup): duplicate (receipt), new (stored),
        or, if an identical copy is still in flight, wait for it (decided again when it is done)."""
        dedup = self.dedup
        while producer.held:
            op = producer.held[0]
            data, publish_time = op.held
            if dedup is None or self.write_state is WriteState.CLOSING or producer.closed or op.dedup_skip:
                producer.held.popleft()
                op.held = None
                if producer.closed and self.write_state is not WriteState.CLOSING:
                    self._complete(producer, op, None, ManagedLedgerError(f"producer {producer.name} closed"))
                else:
                    self._store(producer, [op], [data], [publish_time])
                continue
            if not producer.resumed:
                producer.resumed = True
                dedup.on_session_resumed(producer.name, op.sequence_id)
            # a duplicate only if every id the send covers is stored (a resent batch may straddle
            # the stored high: storing it again makes duplicates, answering it would lose some)
            # and, where ids name two messages or a hole is being refilled, it is a stored entry
            # byte for byte (broker/dedup.py)
            status = dedup.check(producer.name, op.dedup_highest, first_sequence_id=op.sequence_id,
                                 digest=op.dedup_digest)
            if status is not DupStatus.DUP:
                # a copy still being written: its outcome decides this one. In a content range
                # only an identical copy counts (the same ids may name another message), and it
                # counts even below the stored high (a resend of a send in flight)
                reused = dedup.in_reused(producer.name, op.sequence_id, op.dedup_highest)
                if reused or status is DupStatus.IN_FLIGHT:
                    original = next((o for o in self._dedup_inflight.get(producer.name, ())
                                     if _first_copy_of(o, op, reused)), None)
                    if original is not None:
                        if original.waiters is None:
                            original.waiters = []
                        original.waiters.append(producer)
                        return
            producer.held.popleft()
            op.held = None
            if status is DupStatus.DUP:
                dedup.on_duplicate(producer.name, op.sequence_id, op.dedup_highest)
                producer.duplicates += 1
                if producer.duplicates & (producer.duplicates - 1) == 0:     # 1, 2, 4, 8, ... (bounded)
                    log.info("duplicate send topic=%s producer=%s sequence_id=%d highest=%d effective=%d "
                             "duplicates=%d", self.key, producer.name, op.sequence_id, op.dedup_highest,
                             dedup.effective(producer.name), producer.duplicates)
                self._complete(producer, op, DUP_POSITION, None)
                continue
            op.producer_name = producer.name
            dedup.on_pushed(producer.name, op.dedup_highest)
            self._dedup_inflight.setdefault(producer.name, deque()).append(op)
            self._store(producer, [op], [data], [publish_time])

    def _store(self, producer: Producer, ops: list, datas: list, publish_times_ms: list) -> None:
        """Store sends of one producer, in order (a single send is a run of one; the lists are
        the core's from now on): each is refused (CLOSING, BLOCKED, not owned), waits in the
        backlog (behind it, or past pending_adds_max) or is added; the sends that are added
        one after another go out together (:meth:`_add`)."""
        count = len(ops)
        start = 0
        while start < count:
            if self.write_state is WriteState.CLOSING:
                self._complete(producer, ops[start], None, ManagedLedgerError(f"topic {self.key} is closing"))
            elif self.write_state is WriteState.BLOCKED:
                self._complete(producer, ops[start], None, ServiceNotReadyError(
                    f"topic {self.key} is blocked after a failed write: reconnect and resend"))
            elif self._backlog or self.adds_in_flight >= self.pending_adds_max:
                self._backlog.append((ops[start], producer, datas[start], publish_times_ms[start]))
            elif not self._owned:
                self._refuse_not_owned(producer, ops[start])
            else:         # as many as there is room for (nothing above changes while they are added)
                end = min(count, start + self.pending_adds_max - self.adds_in_flight)
                if start or end < count:
                    self._add(producer, ops[start:end], datas[start:end], publish_times_ms[start:end])
                else:
                    self._add(producer, ops, datas, publish_times_ms)
                start = end
                continue
            start += 1

    def _refuse_not_owned(self, producer: Producer, op: Send) -> None:
        # session suspended or lost, or the bundle released: never write; the SEND_ERROR
        # makes the client reconnect through lookup to whoever owns the topic now
        error = TopicNotOwnedError(
            f"topic {self.key} is not owned by this broker now (ZooKeeper session not trusted)")
        self._block_writes(error)
        self._complete(producer, op, None, error)
        self._maybe_unblock()

    def _add(self, producer: Producer, ops: list, datas: list, publish_times_ms: list) -> None:
        """Sends that go to the managed ledger now (OPEN, owned, room for them): they join the
        last StoreEntries if it is this producer's, else start one (which takes the lists)."""
        self.adds_in_flight += len(ops)
        out = self._out
        last = out[-1] if out else None
        if type(last) is StoreEntries and last.producer is producer:
            last.ops.extend(ops)
            last.datas.extend(datas)
            last.publish_times_ms.extend(publish_times_ms)
        else:
            out.append(StoreEntries(producer, ops, datas, publish_times_ms))

    def _block_writes(self, error: BaseException) -> None:
        """A write failed: fail what waits for room, disconnect the producers (their clients
        reconnect and resend everything pending, in order) and refuse SENDs and producers until
        the adds in flight are done and the ledger rolled over (:meth:`_maybe_unblock`)."""
        if self.write_state is not WriteState.OPEN:
            return
        self._to(WriteState.BLOCKED)
        log.warning("topic %s blocked after a failed write (%s): producers disconnected, %d adds in flight",
                    self.key, error, self.adds_in_flight)
        while self._backlog:
            op, producer, _, _ = self._backlog.popleft()
            self._complete(producer, op, None, ServiceNotReadyError(
                f"topic {self.key} is blocked after a failed write: reconnect and resend"))
        for producer in list(self.producers.values()):
            del self.producers[producer.name]             # closed by the shell (DisconnectProducer)
            self._out.append(DisconnectProducer(producer))

    def _maybe_unblock(self) -> None:
        """Lift the write block once no add is in flight and the managed ledger has finished the
        rollover its failure started: that rollover reports the failed adds its recovery kept
        (:meth:`kept`), which deduplication must know before the producers' resends."""
        if self.write_state is WriteState.BLOCKED and self.adds_in_flight == 0 \
                and self._ml_state is not ManagedLedgerState.ROLLING_OVER:
            self._to(WriteState.OPEN)
            log.info("topic %s unblocked: no add in flight, ledger rolled over", self.key)

    def _drain_backlog(self) -> None:
        while self._backlog and self.adds_in_flight < self.pending_adds_max:
            op, producer, data, publish_time = self._backlog.popleft()
            if self._owned:
                self._add(producer, [op], [data], [publish_time])
            else:
                self._refuse_not_owned(producer, op)

    def _complete(self, producer: Producer, op: Send, position: Position | None,
                  error: BaseException | None) -> None:
        op.position, op.error, op.done = position, error, True
        if op.producer_name is not None:
            inflight = self._dedup_inflight.get(op.producer_name)
            if inflight is not None:
                try:
                    inflight.remove(op)
                except ValueError:
                    pass
                if not inflight:
                    del self._dedup_inflight[op.producer_name]
            if error is not None and self.dedup is not None:
                self.dedup.on_failed(op.producer_name, op.sequence_id)
        waiters = op.waiters
        if waiters is not None:
            op.waiters = None
            for waiting in waiters:      # sends that waited for this copy's outcome (dedup)
                self._decide_held(waiting)
        self._answer(producer)

    def _answer(self, producer: Producer) -> None:
        """An Answer when the producer's oldest send is done (one for sends done in a row)."""
        if producer.pending and producer.pending[0].done:
            out = self._out
            last = out[-1] if out else None
            if type(last) is not Answer or last.producer is not producer:
                out.append(Answer(producer))

    def _ml_error(self, error: BaseException) -> None:
        self._out.append(CountAddError(error))
        if self.write_state is WriteState.CLOSING:
            return
        if isinstance(error, ManagedLedgerFencedError):
            log.warning("topic %s fenced: another broker owns it now; unloading", self.key)
            self._out.append(Unload("managed ledger fenced"))
        elif self._ml_state is ManagedLedgerState.FAILED:
            # a rollover gave up (ZooKeeper or bookies gone past the retry bounds): the managed
            # ledger never writes again; unload so that the next lookup reopens it (recovering
            # its last ledger) once the cluster is back (found by the chaos suite)
            log.warning("topic %s: managed ledger failed (%s); unloading to reopen", self.key, error)
            self._out.append(Unload("managed ledger failed"))


__all__ = ["AccessMode", "Answer", "Confirmed", "CountAddError", "DUP_POSITION", "DisconnectProducer", "Producer",
           "PublishCore", "Send", "StoreEntries", "Unload", "WRITE_STATE_TRANSITIONS", "WriteState"]
