"""The replication worker's copy plan for one locked ledger (pure: no I/O, no clock, rng passed
in). After BookKeeper's ReplicationWorker / LedgerFragmentReplicator.

Protocol, for a ledger whose mark names ``lost`` bookies:

1. ``plan_repairs``: the fragments to repair. A CLOSED ledger: every fragment; an OPEN one:
   only the fragments before the last (closed by an ensemble change: their entries never
   change), as BookKeeper; its last fragment waits until the ledger is closed (the mark stays).
   IN_RECOVERY: nothing yet. For each (fragment, lost bookie at ensemble index i), a
   replacement is chosen among the writable bookies not in that fragment's ensemble (and not
   lost, and not already chosen for that fragment); with ``racks`` given, one whose rack holds
   none of the fragment's surviving bookies is preferred. It takes index i, so every write set
   keeps its shape.
2. ``FragmentCopy`` (one per repair): the fragment's entries whose write set holds index i
   (fragment end: the next fragment's first entry - 1, or ``last_entry_id`` for the last
   fragment of a CLOSED ledger) are read from a surviving replica of their write set (lost
   bookies are never read; consecutive entries on the same replicas as one range), the CRC32C
   checked here (a replica that fails it is never used for that entry; the next one is
   tried), and written unchanged (entry id, lac, length, payload,
   checksum; recovery flag, so a fenced ledger cannot refuse it) to the replacement, at most
   ``entries_in_flight_max`` at a time. Only once the replacement acknowledged every one
   (acked = fsynced, invariant 2) does the copy end with ``CopyDone``.
3. ``apply_repair``: the metadata transform the shell applies by compare-and-set on freshly
   read metadata. It re-checks that the fragment still starts where it did, still holds the
   lost bookie at that index, that the replacement is not in it, and that its entries did not
   change (a CLOSED ledger still closed at the same entry); otherwise ``RepairConflict`` and the
   shell re-plans. On success the fragment's ensemble names the replacement instead of the
   lost bookie, and a repaired last fragment of a CLOSED ledger drops the bookie from
   ``under_replicated_bookies``.

Invariant 10: metadata never names a bookie that lacks the entries, because the transform is
only proposed after every entry was acknowledged by the replacement; a worker that crashes
mid-copy proposes nothing, and the ledger stays marked and is retried (entries already copied
are written again; the bookie accepts a rewrite of an identical entry).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from bookie.client.metadata import LedgerMetadata, LedgerState, write_set_indices
from pulsarlite.checksum import entry_checksum
from pulsarlite.errors import MetadataVersionConflict, check


class RepairConflict(MetadataVersionConflict):
    """The metadata changed under a planned repair in a way that makes it wrong: re-plan."""


@dataclass(frozen=True)
class FragmentRepair:
    ledger_id: int
    fragment_first: int                   # first entry id of the fragment
    fragment_last: int                    # last entry id (< fragment_first: an empty fragment)
    ensemble: tuple[str, ...]             # the fragment's ensemble when planned
    ensemble_index: int
    lost_bookie: str
    replacement: str
    entries: tuple[int, ...]              # entry ids whose write set holds the lost bookie
    sources: Mapping[int, tuple[str, ...]]  # entry id -> surviving replicas, in read order
    last_fragment_of_closed: bool

    def describe(self) -> str:
        return (f"ledger={self.ledger_id} fragment={self.fragment_first}..{self.fragment_last} "
                f"index={self.ensemble_index} lost={self.lost_bookie} replacement={self.replacement} "
                f"entries={len(self.entries)}")


@dataclass(frozen=True)
class Unrepairable:
    """A fragment that cannot be repaired now (the mark stays; retried later)."""

    ledger_id: int
    fragment_first: int
    lost_bookie: str
    reason: str


def fragment_bounds(md: LedgerMetadata) -> list[tuple[int, int, tuple[str, ...], bool]]:
    """(first, last, ensemble, is_last) of every fragment that may be repaired now."""
    if md.state is LedgerState.IN_RECOVERY:
        return []
    out = []
    for k, (first, bookies) in enumerate(md.ensembles):
        is_last = k == len(md.ensembles) - 1
        if is_last and md.state is not LedgerState.CLOSED:
            continue        # the open fragment: repaired once the ledger is closed
        last = md.last_entry_id if is_last else md.ensembles[k + 1][0] - 1
        if md.state is LedgerState.CLOSED:
            last = min(last, md.last_entry_id)   # no entry past the close exists to copy
        out.append((first, last, bookies, is_last))
    return out


def plan_repairs(md: LedgerMetadata, lost: frozenset[str] | set[str], writable: Sequence[str],
                 rng: random.Random, racks: Mapping[str, str] | None = None
                 ) -> tuple[list[FragmentRepair], list[Unrepairable]]:
    """The repairs of ``md`` for the ``lost`` bookies, and what cannot be repaired now."""
    lost = frozenset(lost)
    repairs: list[FragmentRepair] = []
    blocked: list[Unrepairable] = []
    if md.state is LedgerState.IN_RECOVERY:
        return [], [Unrepairable(md.ledger_id, -1, b, "ledger is in recovery")
                    for b in sorted(lost & md.all_bookies())]
    if md.state is LedgerState.OPEN and md.current_ensemble and lost & set(md.current_ensemble):
        blocked += [Unrepairable(md.ledger_id, md.last_fragment_first_entry, b,
                                 "last fragment of an open ledger: repaired once the ledger is closed")
                    for b in sorted(lost & set(md.current_ensemble))]
    for first, last, ensemble, is_last in fragment_bounds(md):
        chosen: list[str] = []
        for index, bookie in enumerate(ensemble):
            if bookie not in lost:
                continue
            survivors = [b for b in ensemble if b not in lost]
            candidates = sorted(set(writable) - set(ensemble) - lost - set(chosen))
            if not candidates:
                blocked.append(Unrepairable(md.ledger_id, first, bookie,
                                            "no writable bookie outside the fragment's ensemble"))
                continue
            if racks:
                used = {racks.get(b) for b in survivors + chosen} - {None}
                spread = [c for c in candidates if racks.get(c) not in used]
                candidates = spread or candidates
            replacement = rng.choice(candidates)
            chosen.append(replacement)
            entries = tuple(e for e in range(first, last + 1)
                            if index in write_set_indices(md.ensemble_size, md.write_quorum, e))
            sources = {}
            for e in entries:
                # in ensemble order, so consecutive entries on the same replicas (all of a
                # fragment when Qw = E) have equal sources and are read as one range
                ws = set(write_set_indices(md.ensemble_size, md.write_quorum, e))
                sources[e] = tuple(b for i, b in enumerate(ensemble) if i in ws and b not in lost)
            repairs.append(FragmentRepair(md.ledger_id, first, last, tuple(ensemble), index, bookie,
                                          replacement, entries, sources,
                                          is_last and md.state is LedgerState.CLOSED))
    return repairs, blocked


def apply_repair(current: LedgerMetadata, repair: FragmentRepair) -> LedgerMetadata:
    """The CAS transform: ``current`` with the repaired fragment naming the replacement.
    RepairConflict if ``current`` no longer matches what was copied."""
    lid = repair.ledger_id
    check(current.ledger_id == lid, f"repair of ledger {lid} applied to ledger {current.ledger_id}")
    fragments = list(current.ensembles)
    k = next((k for k, (first, _) in enumerate(fragments) if first == repair.fragment_first), None)
    if k is None:
        raise RepairConflict(f"ledger {lid}: no fragment starts at {repair.fragment_first} any more")
    first, bookies = fragments[k]
    is_last = k == len(fragments) - 1
    if bookies[repair.ensemble_index] != repair.lost_bookie:
        raise RepairConflict(f"ledger {lid}: fragment {first} index {repair.ensemble_index} is "
                             f"{bookies[repair.ensemble_index]}, not {repair.lost_bookie}")
    if repair.replacement in bookies:
        raise RepairConflict(f"ledger {lid}: {repair.replacement} is in fragment {first} already")
    last = (current.last_entry_id if current.state is LedgerState.CLOSED else None) if is_last \
        else fragments[k + 1][0] - 1
    if last is not None and current.state is LedgerState.CLOSED:
        last = min(last, current.last_entry_id)
    if last != repair.fragment_last:
        raise RepairConflict(f"ledger {lid}: fragment {first} now ends at {last}, "
                             f"copied through {repair.fragment_last}")
    new_bookies = tuple(repair.replacement if i == repair.ensemble_index else b for i, b in enumerate(bookies))
    fragments[k] = (first, new_bookies)
    urb = current.under_replicated_bookies
    if is_last and current.state is LedgerState.CLOSED:
        urb = tuple(b for b in urb if b != repair.lost_bookie)
    return replace(current, ensembles=tuple(fragments), under_replicated_bookies=urb)


# -- the copy of one fragment --------------------------------------------------------------

@dataclass(frozen=True)
class StoredEntry:
    """An entry as a bookie returned it (the fields its checksum covers, and the checksum)."""

    ledger_id: int
    entry_id: int
    lac: int
    length: int
    payload: bytes
    checksum: int

    def verified(self) -> bool:
        return entry_checksum(self.ledger_id, self.entry_id, self.lac, self.length, self.payload) == self.checksum


@dataclass(frozen=True)
class ReadEntry:
    entry_id: int
    bookie: str


@dataclass(frozen=True)
class ReadRange:
    """Read entries ``first``..``last`` (consecutive ids sharing their replicas) from ``bookie``;
    answered with the entries it returned (a prefix, maybe truncated) or None (it has no
    copy of the ledger, or is unreachable)."""

    first: int
    last: int
    bookie: str


@dataclass(frozen=True)
class WriteEntry:
    entry: StoredEntry
    bookie: str


@dataclass(frozen=True)
class ReplicaRejected:
    """A log line: ``bookie``'s copy of ``entry_id`` could not be used (``reason``)."""

    entry_id: int
    bookie: str
    reason: str


@dataclass(frozen=True)
class CopyDone:
    repair: FragmentRepair
    bytes_copied: int


@dataclass(frozen=True)
class CopyFailed:
    repair: FragmentRepair
    reason: str


class CopyState(enum.Enum):
    COPYING = "copying"
    DONE = "done"
    FAILED = "failed"


class FragmentCopy:
    """Copies one fragment's entries to the replacement. Events: ``start``, ``on_read``
    (entry or None: the bookie was down or lacks it), ``on_read_range``, ``on_written``
    (acknowledged or not).

    Consecutive entry ids with the same replicas (every entry of a fragment when Qw = E) are
    read as one range of at most ``run_entries_max`` from one replica; what a range answer
    lacks is read again from the same replica (a truncated answer), or, for the entry where
    the answer stopped short, from the next replica (that replica lacks it, or its copy failed
    the checksum). Entries in flight (being read or written) never exceed
    ``entries_in_flight_max``."""

    def __init__(self, repair: FragmentRepair, entries_in_flight_max: int, run_entries_max: int = 1) -> None:
        check(entries_in_flight_max > 0 and run_entries_max > 0,
              "entries_in_flight_max and run_entries_max must be > 0")
        self.repair = repair
        self.window = entries_in_flight_max
        self.run_max = run_entries_max
        self.state = CopyState.COPYING
        self._todo = list(reversed(repair.entries))       # next entry at the end
        self._tried: dict[int, int] = {}                  # entry id -> sources tried
        self._in_flight: set[int] = set()
        self._acked: set[int] = set()
        self.bytes_copied = 0

    def start(self) -> list:
        if not self.repair.entries:
            self.state = CopyState.DONE
            return [CopyDone(self.repair, 0)]
        return self._fill()

    def _fill(self) -> list:
        actions: list = []
        sources = self.repair.sources
        run_max = min(self.run_max, self.window)
        while self._todo and len(self._in_flight) < self.window and self.state is CopyState.COPYING:
            if self._in_flight and self.window - len(self._in_flight) < min(run_max, len(self._todo)):
                break           # wait for room for a whole run rather than read entry by entry
            first = last = self._todo.pop()
            self._in_flight.add(first)
            while (self._todo and last - first + 1 < run_max and len(self._in_flight) < self.window
                   and self._todo[-1] == last + 1 and sources[last + 1] == sources[first]):
                last = self._todo.pop()
                self._in_flight.add(last)
            for e in range(first, last + 1):
                self._tried[e] = 0
            actions += self._read_range_next(first, last) if last > first else self._read_next(first)
        return actions

    def _read_next(self, entry_id: int) -> list:
        sources = self.repair.sources[entry_id]
        tried = self._tried[entry_id]
        if tried >= len(sources):
            return self._fail(f"entry {entry_id}: no surviving replica of {sources} has a valid copy")
        self._tried[entry_id] = tried + 1
        return [ReadEntry(entry_id, sources[tried])]

    def _read_range_next(self, first: int, last: int) -> list:
        """first..last (same sources, same tries so far) from their next replica."""
        sources = self.repair.sources[first]
        tried = self._tried[first]
        if tried >= len(sources):
            return self._fail(f"entries {first}..{last}: no surviving replica of {sources} has valid copies")
        for e in range(first, last + 1):
            self._tried[e] = tried + 1
        return [ReadRange(first, last, sources[tried])]

    def _read_range_again(self, first: int, last: int) -> list:
        """first..last from the replica their last read went to (a truncated answer)."""
        if first == last:
            self._tried[first] -= 1
            return self._read_next(first)
        return [ReadRange(first, last, self.repair.sources[first][self._tried[first] - 1])]

    def _fail(self, reason: str) -> list:
        if self.state is not CopyState.COPYING:
            return []
        self.state = CopyState.FAILED
        return [CopyFailed(self.repair, reason)]

    def _usable(self, entry: StoredEntry, entry_id: int) -> bool:
        return entry.ledger_id == self.repair.ledger_id and entry.entry_id == entry_id and entry.verified()

    def on_read(self, entry_id: int, bookie: str, entry: StoredEntry | None, problem: str = "") -> list:
        if self.state is not CopyState.COPYING or entry_id not in self._in_flight:
            return []
        check(bookie != self.repair.lost_bookie, f"read from the lost bookie {bookie}")
        if entry is None:
            return [ReplicaRejected(entry_id, bookie, problem or "unavailable")] + self._read_next(entry_id)
        if not self._usable(entry, entry_id):
            return [ReplicaRejected(entry_id, bookie, "checksum mismatch")] + self._read_next(entry_id)
        return [WriteEntry(entry, self.repair.replacement)]

    def on_read_range(self, first: int, last: int, bookie: str, entries: Sequence[StoredEntry] | None,
                      problem: str = "") -> list:
        if self.state is not CopyState.COPYING or first not in self._in_flight:
            return []
        check(bookie != self.repair.lost_bookie, f"read from the lost bookie {bookie}")
        if entries is None:          # no copy there at all, or unreachable: the next replica
            return [ReplicaRejected(first, bookie, problem or "unavailable")] + self._read_range_next(first, last)
        actions: list = []
        expected = first
        stopped_short = False
        for entry in entries:
            if expected > last:
                break
            if not self._usable(entry, expected):
                stopped_short = True
                break
            actions.append(WriteEntry(entry, self.repair.replacement))
            expected += 1
        if expected > last:
            return actions
        if stopped_short or expected == first:
            # the replica lacks ``expected`` or its copy is bad: that one from the next replica
            actions.append(ReplicaRejected(expected, bookie, "checksum mismatch" if stopped_short
                                           else (problem or "NO_SUCH_ENTRY")))
            actions += self._read_next(expected)
            expected += 1
        if expected <= last and self.state is CopyState.COPYING:
            actions += self._read_range_again(expected, last)
        return actions

    def on_written(self, entry: StoredEntry, ok: bool, problem: str = "") -> list:
        e = entry.entry_id
        if self.state is not CopyState.COPYING or e not in self._in_flight:
            return []
        if not ok:
            return self._fail(f"entry {e}: replacement {self.repair.replacement} refused it: {problem}")
        self._in_flight.discard(e)
        self._acked.add(e)
        self.bytes_copied += len(entry.payload)
        if len(self._acked) == len(self.repair.entries):
            self.state = CopyState.DONE
            return [CopyDone(self.repair, self.bytes_copied)]
        return self._fill()


class Throttle:
    """Pure token bucket: ``delay_ms(nbytes, now_ms)`` is how long to wait before sending
    ``nbytes`` so that at most ``bytes_per_s`` leave on average (bursts up to one second's worth)."""

    def __init__(self, bytes_per_s: int) -> None:
        check(bytes_per_s > 0, "bytes_per_s must be > 0")
        self.rate = bytes_per_s
        self._tokens = float(bytes_per_s)
        self._at_ms: float | None = None

    def delay_ms(self, nbytes: int, now_ms: float) -> float:
        if self._at_ms is not None:
            self._tokens = min(float(self.rate), self._tokens + (now_ms - self._at_ms) * self.rate / 1000)
        self._at_ms = now_ms
        self._tokens -= nbytes
        return 0.0 if self._tokens >= 0 else -self._tokens * 1000 / self.rate
