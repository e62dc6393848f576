"""Producer deduplication (Pulsar's MessageDeduplication): a SEND whose sequence id is not above
the highest one already seen from the same producer NAME is a duplicate -- it gets a receipt
without being stored.

- :class:`DedupState` (pure): per producer name the highest sequence id *pushed* (sent to the
  managed ledger) and *persisted* (confirmed). ``check`` answers NEW (store it), DUP (persisted
  already: receipt at once) or IN_FLIGHT (an earlier copy is still being written: the receipt
  follows that copy's outcome). Bounded: at most ``producers_max`` names (the least recently
  used name is forgotten; a duplicate from it would be stored again).
- Sequence ids reused for other messages: the official C++ client (pulsar-client 3.x, C++ 4.x, so
  the Python one) resets its sequence-id counter to PRODUCER_SUCCESS's ``last_sequence_id + 1`` on
  every (re)connect until a receipt has reached it, although sends with higher ids are still
  pending, sealed while disconnected, or in its open batch (one batch may hold old ids followed
  by smaller new ones); a send timeout fails its pending sends without resetting anything, so
  the next reconnect may reset again. Deciding by id alone, Pulsar answers the new messages as
  duplicates: lost although acknowledged (our chaos suite found it: seed 17, restart_zookeeper;
  again under load, seed 14). Which ids a reset reuses cannot be seen from the broker: the
  reset may happen in one session and the reused ids arrive in a later one, inside batches that
  start with old ids. So every session of a reconnecting producer (CommandProducer.epoch > 0:
  the official clients count their reconnects there) opens a *content range*: the ids above the
  ``last_sequence_id`` it was given (:meth:`DedupState.on_session_start`), and a new owner opens
  one above what its snapshot knew for every producer (:meth:`DedupState.open_after_load`).
  Within a content range a send is a duplicate only if a stored entry has the same ids and the
  same bytes (CRC32C; clients resend the bytes they sent), else it is stored. Elsewhere
  duplicates are decided by id, as Pulsar does: below the range (an application resuming from
  ``last_sequence_id`` resends ids at or below it), and for a new producer instance (epoch 0,
  e.g. a retried Spark task resending its rows under the same ids with new publish times),
  which closes its name's range: it resends nothing of an earlier instance. Each producer's last ``digests_max`` stored
  entries ``(first id, highest id, crc)`` are kept for this, packed: a resend of an entry older
  than that window is stored again (a duplicate, never a loss).
- Persistence (survives broker failover): a snapshot ``{"version": 1, "position": [ledger,
  entry], "producers": {name: highest persisted sequence id}, "holes", "reused", "digests"}``
  (digest windows of the producers in a content range or with a hole) at
  ``/pulsarlite/dedup/<managed ledger name>``, written by the topic's owner (compare-and-set)
  every ``snapshot_interval_entries`` stored entries and when the topic closes. On load the owner
  reads it and replays the entries after ``position`` (their metadata's producer name and
  (highest) sequence id), so nothing confirmed before a crash is forgotten.
"""

from __future__ import annotations

import base64
import enum
import json
import logging
import struct
from collections import OrderedDict

from pulsarlite.errors import ConfigError, MetadataNotFoundError, MetadataVersionConflict
from pulsarlite.metadata import MetadataExistsError
from pulsarlite.metadata_layout import dedup_path

log = logging.getLogger("pulsarlite.broker.dedup")

FORMAT_VERSION = 1
DIGESTS_MAX_DEFAULT = 4096                # stored entries remembered per producer (first, highest, crc)
RANGE_OPEN = (1 << 63) - 1                # the top of a content range: every id above its low
SNAPSHOT_DIGEST_BYTES_MAX = 256 * 1024    # windows written into the snapshot znode, at most
_DIGEST = struct.Struct(">qqI")


class DupStatus(enum.Enum):
    NEW = "new"
    DUP = "dup"
    IN_FLIGHT = "in_flight"


class DigestWindow:
    """The last ``capacity`` stored entries of one producer as packed (first id, highest id,
    crc32c) records in a ring: 20 bytes each. The ring grows as records arrive (a producer with
    few entries costs few bytes). Lookups (resends in a content range) go through an index of
    the records, built on the first lookup and dropped after ``capacity`` appends without one,
    so a burst of resends costs one pass, and a producer that never resends holds no index."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ring = bytearray()
        self._next = 0          # records appended so far
        self._index: dict[tuple[int, int, int], int] | None = None    # record -> copies in the ring
        self._appends_since_lookup = 0

    def __len__(self) -> int:
        return min(self._next, self.capacity)

    def append(self, first: int, highest: int, digest: int) -> None:
        record = (first, highest, digest & 0xFFFFFFFF)
        if self._next < self.capacity:
            self._ring += _DIGEST.pack(*record)
        else:
            offset = (self._next % self.capacity) * _DIGEST.size
            if self._index is not None:
                old = _DIGEST.unpack_from(self._ring, offset)
                left = self._index[old] - 1
                if left:
                    self._index[old] = left
                else:
                    del self._index[old]
            _DIGEST.pack_into(self._ring, offset, *record)
        self._next += 1
        if self._index is not None:
            self._index[record] = self._index.get(record, 0) + 1
            self._appends_since_lookup += 1
            if self._appends_since_lookup > self.capacity:
                self._index = None

    def contains(self, first: int, highest: int, digest: int) -> bool:
        if self._index is None:
            self._index = {}
            for record in _DIGEST.iter_unpack(self._ring):
                self._index[record] = self._index.get(record, 0) + 1
        self._appends_since_lookup = 0
        return (first, highest, digest & 0xFFFFFFFF) in self._index

    def records(self):
        """(first id, highest id, crc32c) of every record, in no particular order."""
        return _DIGEST.iter_unpack(self._ring)

    def packed(self) -> bytes:
        """Oldest first."""
        if self._next <= self.capacity:
            return bytes(self._ring)
        cut = (self._next % self.capacity) * _DIGEST.size
        return bytes(self._ring[cut:] + self._ring[:cut])


class DedupState:
    def __init__(self, *, producers_max: int = 10_000, digests_max: int = DIGESTS_MAX_DEFAULT) -> None:
        if not isinstance(producers_max, int) or isinstance(producers_max, bool) or producers_max <= 0:
            raise ConfigError(f"dedup producers_max must be an int > 0, got {producers_max!r}")
        if not isinstance(digests_max, int) or isinstance(digests_max, bool) or digests_max < 0:
            raise ConfigError(f"dedup digests_max must be an int >= 0, got {digests_max!r}")
        self.producers_max = producers_max
        self.digests_max = digests_max
        # producer name -> its last stored entries (first id, highest id, crc32c)
        self.digests: OrderedDict[str, DigestWindow] = OrderedDict()
        # producer name -> [low, high]: its content range, where ids may name two messages (a
        # client reset its counter): decided by ids and bytes there (module docstring)
        self.reused: OrderedDict[str, list[int]] = OrderedDict()
        self.pushed: OrderedDict[str, int] = OrderedDict()
        self.persisted: OrderedDict[str, int] = OrderedDict()
        # producer name -> [low, until, refilled]: ids from low on may be missing from the log
        # while ids up to until may be in it; refilled: how far resends have filled it again
        self.holes: dict[str, list[int]] = {}
        self.entries_since_snapshot = 0
        self.label = ""          # what log lines name (the topic)

    def effective(self, name: str) -> int:
        """The highest sequence id below which everything is known to be stored: the persisted
        high, or, while the producer has a hole, how far the resends have refilled it."""
        hole = self.holes.get(name)
        return hole[2] if hole is not None else self.persisted.get(name, -1)

    def check(self, name: str, sequence_id: int, *, first_sequence_id: int | None = None,
              digest: int | None = None) -> DupStatus:
        """``sequence_id``: the highest id the send covers; ``first_sequence_id`` and ``digest``
        (CRC32C of the entry) tell a resend from another message inside a reused range."""
        first = sequence_id if first_sequence_id is None else first_sequence_id
        by_content = digest is not None and self.in_reused(name, first, sequence_id)
        if by_content and first <= self.persisted.get(name, -1) and self.is_stored(name, first, sequence_id, digest):
            return DupStatus.DUP       # a stored entry, byte for byte (wherever the refill point is)
        if sequence_id <= self.effective(name):
            return DupStatus.NEW if by_content else DupStatus.DUP
        hole = self.holes.get(name)
        if digest is not None and hole is not None and sequence_id <= hole[1] \
                and self.is_stored(name, first, sequence_id, digest):
            return DupStatus.DUP       # above the refill point of a hole, but stored byte for byte
        if sequence_id <= self.pushed.get(name, -1):
            return DupStatus.IN_FLIGHT
        return DupStatus.NEW

    def in_reused(self, name: str, first: int, highest: int) -> bool:
        span = self.reused.get(name)
        return span is not None and first <= span[1] and span[0] <= highest

    def is_stored(self, name: str, first: int, highest: int, digest: int) -> bool:
        """True if one of the producer's last stored entries has these ids and this CRC32C."""
        window = self.digests.get(name)
        return window is not None and window.contains(first, highest, digest)

    def on_session_start(self, name: str, *, reconnect: bool) -> int:
        """A producer session starts: the ``last_sequence_id`` to give it (PRODUCER_SUCCESS).
        ``reconnect``: the client says this producer reconnects (CommandProducer.epoch > 0; the
        official clients count their reconnects there). Such a client may reset its counter to
        just above the id given, reusing ids it has already sent: from there on this producer's
        sends are decided by content. A new producer instance (epoch 0: a process or task that
        starts again, e.g. a retried Spark task resending its rows under the same ids) resends
        nothing of an earlier instance, and is decided by id, as Pulsar does (module docstring)."""
        given = self.last_sequence_id(name)
        if reconnect:
            self.mark_reused(name, given + 1, RANGE_OPEN)
        else:
            self.reused.pop(name, None)
        return given

    def open_after_load(self, known: dict[str, int]) -> None:
        """A new owner loaded the state (``known``: each producer's effective high in the
        snapshot, before the replay). Sessions on the old owner may have opened content ranges
        that no snapshot recorded: open one above what the snapshot knew, for every producer."""
        for name in list(self.persisted):
            self.mark_reused(name, known.get(name, -1) + 1, RANGE_OPEN)

    def mark_reused(self, name: str, low: int, high: int) -> None:
        """Ids low..high of this producer may name two different messages (module docstring)."""
        if high < low:
            return
        span = self.reused.get(name)
        self.reused[name] = [low, high] if span is None else [min(span[0], low), max(span[1], high)]
        self.reused.move_to_end(name)
        while len(self.reused) > self.producers_max:
            self.reused.popitem(last=False)

    def _remember(self, name: str, first: int, highest: int, digest: int | None) -> None:
        if digest is None or self.digests_max == 0:
            return
        window = self.digests.get(name)
        if window is None:
            window = self.digests[name] = DigestWindow(self.digests_max)
        window.append(first, highest, digest)
        self.digests.move_to_end(name)
        while len(self.digests) > self.producers_max:
            self.digests.popitem(last=False)

    def on_pushed(self, name: str, highest_sequence_id: int) -> None:
        self._put(self.pushed, name, highest_sequence_id)

    def on_persisted(self, name: str, highest_sequence_id: int, first_sequence_id: int | None = None,
                     digest: int | None = None) -> None:
        self._remember(name, highest_sequence_id if first_sequence_id is None else first_sequence_id,
                       highest_sequence_id, digest)
        self._put(self.persisted, name, highest_sequence_id)
        self._refill(name, highest_sequence_id if first_sequence_id is None else first_sequence_id,
                     highest_sequence_id)
        self.entries_since_snapshot += 1

    def on_duplicate(self, name: str, first_sequence_id: int, highest_sequence_id: int) -> None:
        """A send was answered as a duplicate: its ids are in the log (by id, or a stored entry
        with its bytes), so they refill a hole as a stored resend would."""
        self._refill(name, first_sequence_id, highest_sequence_id)

    def on_failed(self, name: str, first_sequence_id: int | None = None) -> None:
        """An add failed: what was pushed but not persisted may be sent again (the client
        resends after the error). Adds pushed after the failed one may still be stored, above
        the failed ids: the producer has a *hole*. Until the resends have refilled it up to
        everything pushed or stored at the time (``until``), only sequence ids up to the refill
        point count as duplicates, so a resend of a message in the hole is stored (never a
        receipt for a message that is not in the log); resends above it may be stored twice."""
        top = max(self.pushed.get(name, -1), self.persisted.get(name, -1))
        low = first_sequence_id if first_sequence_id is not None else self.effective(name) + 1
        hole = self.holes.get(name)
        if hole is None:
            if top >= low:
                self.holes[name] = hole = [low, top, min(self.persisted.get(name, -1), low - 1)]
                self._bound(self.holes)
                log.info("dedup hole opened topic=%s producer=%s low=%d until=%d refilled=%d",
                         self.label, name, *hole)
        else:
            hole[0] = min(hole[0], low)
            hole[1] = max(hole[1], top)
            hole[2] = min(hole[2], low - 1)
        self.pushed[name] = self.effective(name)
        self.pushed.move_to_end(name)

    def on_nothing_in_flight(self) -> None:
        """Every add pushed is done (persisted or failed): ids below a hole's lowest failed id
        are in the log or were never sent here (a client skips the ids of sends that timed out
        before it could send them), so its refill point moves up to there. Without this, a
        refill point left below such ids (it stays at the persisted high when the hole opens,
        while adds below the failed one are still in flight) never moves again: the producer
        is given a stale ``last_sequence_id`` for good (the whole-path simulation, seed 6911)."""
        for name in list(self.holes):
            hole = self.holes[name]
            self._refill_up_to(name, hole, hole[0] - 1, "nothing is in flight")

    def on_session_resumed(self, name: str, first_sequence_id: int) -> None:
        """A producer session's first send starts at ``first_sequence_id``. A client resends
        what it has pending in order, from its lowest id, so the ids of a hole below that one
        that are not stored will never come again: their sends timed out in the client (the
        application got an error). The refill point moves up to just below it. Without this, a
        client giving up on the sends of a failed write (all bookies down for longer than its
        send timeout) left the hole open for good: the producer was given a stale
        ``last_sequence_id`` at every reconnect and decided by content from there on, and a
        resend older than its digest window was stored twice (chaos seed 7003 under load).
        Ids the client reuses for new messages (a reset counter) are in its content range and
        decided by content, wherever the refill point is."""
        hole = self.holes.get(name)
        if hole is not None:
            self._refill_up_to(name, hole, first_sequence_id - 1, "the producer resumes above it")

    def _refill_up_to(self, name: str, hole: list[int], highest: int, why: str) -> None:
        """Move the hole's refill point up to ``highest`` (if below it): ids up to there are
        stored or will never be sent."""
        if hole[2] < highest:
            log.info("dedup hole refill point moved topic=%s producer=%s low=%d until=%d refilled=%d -> %d: %s",
                     self.label, name, *hole, highest, why)
            self._refill(name, hole[2] + 1, highest)

    def _refill(self, name: str, first: int, highest: int) -> None:
        """Ids first..highest are in the log: move the hole's refill point over them and over
        every stored entry it now reaches (resends are decided in order, but a duplicate above
        the refill point may be answered before the resend below it is confirmed)."""
        hole = self.holes.get(name)
        if hole is None or first > hole[2] + 1:
            return
        hole[2] = max(hole[2], highest)
        window = self.digests.get(name)
        grown = window is not None
        while grown and hole[2] < hole[1]:
            grown = False
            for f, h, _ in window.records():
                if f <= hole[2] + 1 and h > hole[2]:
                    hole[2] = h
                    grown = True
        if hole[2] >= hole[1]:
            del self.holes[name]
            log.info("dedup hole refilled topic=%s producer=%s low=%d until=%d", self.label, name, hole[0], hole[1])

    def _bound(self, table) -> None:
        while len(table) > self.producers_max:
            table.pop(next(iter(table)))

    def _put(self, table: OrderedDict, name: str, value: int) -> None:
        if value > table.get(name, -1):
            table[name] = value
        table.move_to_end(name)
        while len(table) > self.producers_max:
            table.popitem(last=False)

    def last_sequence_id(self, name: str) -> int:
        """For PRODUCER_SUCCESS: where the producer's sequence ids resume (-1: unknown); below a
        hole, so the client resends what is missing."""
        return self.effective(name)

    def replay(self, name: str, highest_sequence_id: int, first_sequence_id: int | None = None,
               digest: int | None = None) -> None:
        """An entry found in the log after the snapshot (load). Sequence ids of one producer
        are contiguous; a jump means the entries between were never stored (an add failed
        while later ones succeeded): a hole, as on_failed would have recorded."""
        if first_sequence_id is not None:
            self._remember(name, first_sequence_id, highest_sequence_id, digest)
        known = self.persisted.get(name)
        if first_sequence_id is not None and known is not None and first_sequence_id <= known:
            # ids going back in the log: a client counter reset (or an application's resend
            # with its own ids, stored because it straddled a hole); either way ids up to the
            # known high may name two messages
            self.mark_reused(name, first_sequence_id, known)
        if first_sequence_id is not None and known is not None:
            hole = self.holes.get(name)
            if first_sequence_id > known + 1 and (hole is None or first_sequence_id > hole[2] + 1):
                if hole is None:
                    self.holes[name] = [known + 1, highest_sequence_id, known]
                    self._bound(self.holes)
            if name in self.holes:
                self.holes[name][1] = max(self.holes[name][1], highest_sequence_id)
                self._refill(name, first_sequence_id, highest_sequence_id)
        self._put(self.persisted, name, highest_sequence_id)
        self._put(self.pushed, name, highest_sequence_id)
        if name in self.holes:                   # nothing is in flight on a fresh load
            self.pushed[name] = self.effective(name)

    def snapshot(self, position: tuple[int, int]) -> bytes:
        self.entries_since_snapshot = 0
        digests: dict[str, str] = {}
        budget = SNAPSHOT_DIGEST_BYTES_MAX
        # only where they decide anything: in a content range, and for a producer with a hole
        # (its refill point is below its persisted high: a new owner opens a content range
        # above the refill point, where its stored entries are then known by their bytes)
        for name in reversed([*self.reused, *(n for n in self.holes if n not in self.reused)]):
            window = self.digests.get(name)
            if window is None:
                continue
            text = base64.b64encode(window.packed()).decode()
            if len(text) > budget:
                break
            budget -= len(text)
            digests[name] = text
        return json.dumps({"version": FORMAT_VERSION, "position": list(position),
                           "producers": dict(self.persisted),
                           "holes": {n: list(h) for n, h in self.holes.items()},
                           "reused": {n: list(r) for n, r in self.reused.items()},
                           "digests": digests}, separators=(",", ":")).encode()

    @classmethod
    def from_snapshot(cls, data: bytes, *, producers_max: int = 10_000,
                      digests_max: int = DIGESTS_MAX_DEFAULT) -> tuple["DedupState", tuple[int, int]]:
        """(state, position); ValueError if malformed."""
        try:
            raw = json.loads(data)
            if not isinstance(raw, dict) or raw.get("version") != FORMAT_VERSION:
                raise ValueError(f"unknown dedup snapshot version {raw.get('version') if isinstance(raw, dict) else raw!r}")
            ledger, entry = (int(x) for x in raw["position"])
            state = cls(producers_max=producers_max, digests_max=digests_max)
            for name, text in reversed(list((raw.get("digests") or {}).items())):   # oldest first
                packed = base64.b64decode(text, validate=True)
                if len(packed) % _DIGEST.size:
                    raise ValueError(f"digest window of {name!r} is {len(packed)} bytes")
                for f, h, d in _DIGEST.iter_unpack(packed):
                    state._remember(str(name), f, h, d)
            for name, seq in (raw.get("producers") or {}).items():
                state.replay(str(name), int(seq))
            for name, span in (raw.get("reused") or {}).items():
                low, high = (int(x) for x in span)
                state.mark_reused(str(name), low, high)
            for name, hole in (raw.get("holes") or {}).items():
                low, until, refilled = (int(x) for x in hole)
                # the writer may have had adds in flight below ``low`` that failed after it
                # wrote this: ids above the refill point may all be missing
                # (on_nothing_in_flight moves nothing for a hole loaded from a snapshot)
                state.holes[str(name)] = [min(low, refilled + 1), until, refilled]
                state.pushed[str(name)] = state.effective(str(name))
        except (KeyError, TypeError, ValueError, UnicodeDecodeError, struct.error) as e:
            raise ValueError(f"malformed dedup snapshot: {e}") from None
        return state, (ledger, entry)


def entry_sequence(meta) -> tuple[str, int, int] | None:
    """(producer name, first sequence id, highest sequence id) of a stored entry's metadata;
    None for a chunk before the last of a chunked message (its chunks share one sequence id:
    only the last one records it, as the publish path decides only the last one)."""
    raw = meta.raw
    if not raw.producer_name or 1 < raw.num_chunks_from_msg != raw.chunk_id + 1:
        return None
    first = raw.sequence_id
    highest = raw.highest_sequence_id if raw.HasField("highest_sequence_id") and raw.highest_sequence_id >= first \
        else first + max(meta.message_count, 1) - 1 if meta.batched else first
    return raw.producer_name, first, highest


class DedupSnapshotStore:
    """The snapshot znode of one managed ledger (compare-and-set at the version read/written)."""

    def __init__(self, store, managed_ledger_name: str) -> None:
        self._store = store
        self.path = dedup_path(managed_ledger_name)
        self._version: int | None = None     # None: not there (as far as we know)

    async def load(self) -> bytes | None:
        got = await self._store.get_or_none(self.path)
        if got is None:
            self._version = None
            return None
        data, self._version = got
        return data

    async def save(self, data: bytes) -> None:
        if self._version is None:
            try:
                await self._store.create(self.path, data, make_parents=True)
                self._version = 0
                return
            except MetadataExistsError:
                got = await self._store.get_or_none(self.path)
                self._version = got[1] if got else None
                if self._version is None:
                    raise
        try:
            self._version = await self._store.set(self.path, data, self._version)
        except MetadataVersionConflict:
            # another owner wrote it: ours is stale; the next owner replays the log anyway
            log.warning("dedup snapshot %s changed by someone else; not written", self.path)
            raise

    async def delete(self) -> None:
        try:
            await self._store.delete(self.path, -1)
        except MetadataNotFoundError:
            pass


__all__ = ["ChunkResends", "DedupSnapshotStore", "DedupState", "DigestWindow", "DupStatus", "entry_sequence"]


class ChunkResends:
    """A chunked message's chunks already stored on this topic (since it was loaded here), so
    that a producer's resend of a whole chunked message stores only the chunks it lacks (pure).

    Why: a producer that lost its connection after chunks c0 c1 were stored (receipts lost) and
    before c2 resends every pending chunk (the official producers and ours); stored as is, the
    topic holds ``c0 c1 c0' c1' c2'``, which the official C++ consumer (3.13) never hands out
    ("chunk id is invalid"): an acknowledged message lost. Pulsar's broker stores the same.

    Protocol, per ``(producer name, uuid)``: a record is the digests and positions of the
    chunks ``0..n-1`` stored one after another (:meth:`on_stored`, in store order; a chunk 0
    starts a new record, the next chunk id extends it, anything else forgets it; the last chunk
    ends it: a whole message resent after it was complete is stored again, as before).
    :meth:`check` answers a chunk SEND: the stored position of a chunk with the same id and
    the same bytes (CRC32C of the entry: producers resend the bytes they sent), else None
    (store it: a chunk resent with other content is never dropped). Only stored chunks count
    (a resend while its first copy is still being written is stored, as before). Bounded: at
    most ``records_max`` records (the oldest is forgotten: its resend is stored, as before).
    Not persisted: a new owner of the topic starts empty.
    """

    def __init__(self, *, records_max: int = 1024) -> None:
        if records_max < 1:
            raise ConfigError(f"records_max must be >= 1, got {records_max}")
        self.records_max = records_max
        self._records: OrderedDict[tuple[str, str], list[tuple[int, object]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def check(self, producer: str, uuid: str, chunk_id: int, digest: int):
        """The position of the stored copy of this chunk (same id, same bytes), or None."""
        record = self._records.get((producer, uuid))
        if record is not None and 0 <= chunk_id < len(record):
            stored_digest, position = record[chunk_id]
            if stored_digest == digest:
                return position
        return None

    def on_stored(self, producer: str, uuid: str, chunk_id: int, num_chunks: int, digest: int,
                  position) -> None:
        """Chunk ``chunk_id`` of ``num_chunks`` was stored at ``position``."""
        key = (producer, uuid)
        records = self._records
        if chunk_id + 1 >= num_chunks:            # the last chunk: the message is whole
            records.pop(key, None)
            return
        record = records.get(key)
        if chunk_id == 0:
            records.pop(key, None)
            records[key] = [(digest, position)]
            while len(records) > self.records_max:
                records.popitem(last=False)
        elif record is not None and chunk_id == len(record):
            record.append((digest, position))
        else:
            records.pop(key, None)
