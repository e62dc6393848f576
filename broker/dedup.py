"""Producer deduplication (Pulsar's MessageDeduplication): a SEND whose sequence id is not above
the highest one already seen from the same producer NAME is a duplicate -- it gets a receipt
without being stored.

- :class:`DedupState` (pure): per producer name the highest sequence id *pushed* (sent to the
  managed ledger) and *persisted* (confirmed). ``check`` answers NEW (store it), DUP (persisted
  already: receipt at once) or IN_FLIGHT (an earlier copy is still being written: the receipt
  follows that copy's outcome). Bounded: at most ``producers_max`` names (the least recently
  used name is forgotten; a duplicate from it would be stored again).
- Persistence (survives broker failover): a snapshot ``{"version": 1, "position": [ledger,
  entry], "producers": {name: highest persisted sequence id}}`` at
  ``/pulsarlite/dedup/<managed ledger name>``, written by the topic's owner (compare-and-set)
  every ``snapshot_interval_entries`` stored entries and when the topic closes. On load the owner
  reads it and replays the entries after ``position`` (their metadata's producer name and
  (highest) sequence id), so nothing confirmed before a crash is forgotten.
"""

from __future__ import annotations

import enum
import json
import logging
from collections import OrderedDict

from pulsarlite.errors import ConfigError, MetadataNotFoundError, MetadataVersionConflict
from pulsarlite.metadata import MetadataExistsError

log = logging.getLogger("pulsarlite.broker.dedup")

DEDUP_ROOT = "/pulsarlite/dedup"
FORMAT_VERSION = 1


class DupStatus(enum.Enum):
    NEW = "new"
    DUP = "dup"
    IN_FLIGHT = "in_flight"


def dedup_path(managed_ledger_name: str) -> str:
    return f"{DEDUP_ROOT}/{managed_ledger_name}"


class DedupState:
    def __init__(self, *, producers_max: int = 10_000) -> None:
        if not isinstance(producers_max, int) or isinstance(producers_max, bool) or producers_max <= 0:
            raise ConfigError(f"dedup producers_max must be an int > 0, got {producers_max!r}")
        self.producers_max = producers_max
        self.pushed: OrderedDict[str, int] = OrderedDict()
        self.persisted: OrderedDict[str, int] = OrderedDict()
        # producer name -> [low, until, refilled]: ids from low on may be missing from the log
        # while ids up to until may be in it; refilled: how far resends have filled it again
        self.holes: dict[str, list[int]] = {}
        self.entries_since_snapshot = 0

    def effective(self, name: str) -> int:
        """The highest sequence id below which everything is known to be stored: the persisted
        high, or, while the producer has a hole, how far the resends have refilled it."""
        hole = self.holes.get(name)
        return hole[2] if hole is not None else self.persisted.get(name, -1)

    def check(self, name: str, sequence_id: int) -> DupStatus:
        if sequence_id <= self.effective(name):
            return DupStatus.DUP
        if sequence_id <= self.pushed.get(name, -1):
            return DupStatus.IN_FLIGHT
        return DupStatus.NEW

    def on_pushed(self, name: str, highest_sequence_id: int) -> None:
        self._put(self.pushed, name, highest_sequence_id)

    def on_persisted(self, name: str, highest_sequence_id: int, first_sequence_id: int | None = None) -> None:
        self._put(self.persisted, name, highest_sequence_id)
        self._refill(name, highest_sequence_id if first_sequence_id is None else first_sequence_id,
                     highest_sequence_id)
        self.entries_since_snapshot += 1

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
                self.holes[name] = [low, top, min(self.persisted.get(name, -1), low - 1)]
                self._bound(self.holes)
        else:
            hole[1] = max(hole[1], top)
            hole[2] = min(hole[2], low - 1)
        self.pushed[name] = self.effective(name)
        self.pushed.move_to_end(name)

    def _refill(self, name: str, first: int, highest: int) -> None:
        hole = self.holes.get(name)
        if hole is not None and first <= hole[2] + 1:
            hole[2] = max(hole[2], highest)
            if hole[2] >= hole[1]:
                del self.holes[name]

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

    def replay(self, name: str, highest_sequence_id: int, first_sequence_id: int | None = None) -> None:
        """An entry found in the log after the snapshot (load). Sequence ids of one producer
        are contiguous; a jump means the entries between were never stored (an add failed
        while later ones succeeded): a hole, as on_failed would have recorded."""
        known = self.persisted.get(name)
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
        return json.dumps({"version": FORMAT_VERSION, "position": list(position),
                           "producers": dict(self.persisted),
                           "holes": {n: list(h) for n, h in self.holes.items()}}, separators=(",", ":")).encode()

    @classmethod
    def from_snapshot(cls, data: bytes, *, producers_max: int = 10_000) -> tuple["DedupState", tuple[int, int]]:
        """(state, position); ValueError if malformed."""
        try:
            raw = json.loads(data)
            if not isinstance(raw, dict) or raw.get("version") != FORMAT_VERSION:
                raise ValueError(f"unknown dedup snapshot version {raw.get('version') if isinstance(raw, dict) else raw!r}")
            ledger, entry = (int(x) for x in raw["position"])
            state = cls(producers_max=producers_max)
            for name, seq in (raw.get("producers") or {}).items():
                state.replay(str(name), int(seq))
            for name, hole in (raw.get("holes") or {}).items():
                low, until, refilled = (int(x) for x in hole)
                state.holes[str(name)] = [low, until, refilled]
                state.pushed[str(name)] = state.effective(str(name))
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"malformed dedup snapshot: {e}") from None
        return state, (ledger, entry)


def entry_sequence(meta) -> tuple[str, int, int] | None:
    """(producer name, first sequence id, highest sequence id) of a stored entry's metadata."""
    raw = meta.raw
    if not raw.producer_name:
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


__all__ = ["DEDUP_ROOT", "DedupSnapshotStore", "DedupState", "DupStatus", "dedup_path", "entry_sequence"]
