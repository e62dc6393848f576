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
   fragment of a CLOSED ledger) are read from a replica of their write set: the unmarked ones
   first, then the live marked ones, the bookie being replaced last (a bookie marked for one
   missing or bad copy still holds good copies of other entries; consecutive entries on the
   same replicas as one range), the CRC32C
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
                 rng: random.Random, racks: Mapping[str, str] | None = None,
                 readable: Sequence[str] | None = None
                 ) -> tuple[list[FragmentRepair], list[Unrepairable]]:
    """The repairs of ``md`` for the ``lost`` bookies, and what cannot be repaired now.
    ``readable``: the live bookies (writable and read-only); a marked bookie among them is
    read last, for entries no unmarked replica has a good copy of (None: marked bookies are
    never read)."""
    lost = frozenset(lost)
    live = frozenset(readable or ())
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
        survivors = [b for b in ensemble if b not in lost]
        chosen: list[str] = []
        for index, bookie in enumerate(ensemble):
            if bookie not in lost:
                continue
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
            entries: list[int] = []
            sources = {}
            for e in range(first, last + 1):
                ws = write_set_indices(md.ensemble_size, md.write_quorum, e)
                if index not in ws:
                    continue
                entries.append(e)
                # in ensemble order, so consecutive entries on the same replicas (all of a
                # fragment when Qw = E) have equal sources and are read as one range
                # the live marked bookies last (the one replaced at the very end): a bookie
                # marked for one missing or bad copy (the replica check, a decommission) still
                # holds good copies of other entries, and with Qw = Qa two bookies each
                # marked for a different entry each hold the only good copy of the other's;
                # the checksum decides what is used
                marked = [b for i, b in enumerate(ensemble) if i in ws and b in lost and b in live]
                sources[e] = (tuple(b for i, b in enumerate(ensemble) if i in ws and b not in lost)
                              + tuple(b for b in marked if b != bookie)
                              + tuple(b for b in marked if b == bookie))
            repairs.append(FragmentRepair(md.ledger_id, first, last, tuple(ensemble), index, bookie,
                                          replacement, tuple(entries), sources,
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
    # and a bookie no fragment names any more lacks nothing (the ledger left it by an
    # ensemble change, and this repair moved the last fragment that still named it)
    named = {b for _, bs in fragments for b in bs}
    urb = tuple(b for b in urb if b in named)
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
    replacement_failed: bool = False      # the replacement refused or did not answer a write


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

    def _fail(self, reason: str, replacement_failed: bool = False) -> list:
        if self.state is not CopyState.COPYING:
            return []
        self.state = CopyState.FAILED
        return [CopyFailed(self.repair, reason, replacement_failed)]

    def _usable(self, entry: StoredEntry, entry_id: int) -> bool:
        return entry.ledger_id == self.repair.ledger_id and entry.entry_id == entry_id and entry.verified()

    def on_read(self, entry_id: int, bookie: str, entry: StoredEntry | None, problem: str = "") -> list:
        if self.state is not CopyState.COPYING or entry_id not in self._in_flight:
            return []
        if entry is None:
            return [ReplicaRejected(entry_id, bookie, problem or "unavailable")] + self._read_next(entry_id)
        if not self._usable(entry, entry_id):
            return [ReplicaRejected(entry_id, bookie, "checksum mismatch")] + self._read_next(entry_id)
        return [WriteEntry(entry, self.repair.replacement)]

    def on_read_range(self, first: int, last: int, bookie: str, entries: Sequence[StoredEntry] | None,
                      problem: str = "") -> list:
        if self.state is not CopyState.COPYING or first not in self._in_flight:
            return []
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
            return self._fail(f"entry {e}: replacement {self.repair.replacement} refused it: {problem}",
                              replacement_failed=True)
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


# -- one worker's pass over one marked ledger ----------------------------------------------------

def still_missing(md: LedgerMetadata, lost: frozenset[str] | set[str]) -> frozenset[str]:
    """The bookies of ``lost`` that ``md`` still needs repaired: those a fragment names (an
    ``under_replicated_bookies`` entry that no fragment names lacks nothing:
    ``LedgerMetadata.lacking_bookies``). A mark may go only when this is empty."""
    return frozenset(lost) & md.all_bookies()


def next_retry_delay_ms(last_delay_ms: float, poll_interval_ms: float, retry_delay_ms_max: float) -> float:
    """Back-off of a ledger whose pass did not finish: doubles from the poll interval, bounded."""
    return min(retry_delay_ms_max, max(poll_interval_ms, last_delay_ms * 2))


@dataclass(frozen=True)
class TakeLock:
    """Create the ledger's ephemeral lock; answered ``on_lock(taken)``."""

    ledger_id: int


@dataclass(frozen=True)
class ReleaseLock:
    ledger_id: int


@dataclass(frozen=True)
class ReadMark:
    """Read the mark and its version; answered ``on_mark(mark or None, version)``."""

    ledger_id: int


@dataclass(frozen=True)
class ReadLedger:
    """Read the ledger's metadata and version, and the writable bookies (and their racks);
    answered ``on_ledger(md or None, version, writable, racks)``."""

    ledger_id: int


@dataclass(frozen=True)
class CopyFragment:
    """Run a FragmentCopy of ``repair``; answered ``on_copied(ok, bytes_copied)``."""

    repair: FragmentRepair


@dataclass(frozen=True)
class WriteLedger:
    """Compare-and-set the metadata at ``version``; answered ``on_written(ok)`` (False: the
    version moved)."""

    metadata: LedgerMetadata
    version: int
    repair: FragmentRepair


@dataclass(frozen=True)
class Unmark:
    """Delete the mark if still at ``version``; answered ``on_unmarked(deleted)`` (False: the
    mark changed since it was read, e.g. the auditor added a bookie to it)."""

    ledger_id: int
    version: int


@dataclass(frozen=True)
class FragmentBlocked:
    """A log line: a fragment cannot be repaired now (the mark stays)."""

    blocked: Unrepairable


@dataclass(frozen=True)
class FragmentRecorded:
    """A log line / metric: ``repair`` is in the metadata now."""

    repair: FragmentRepair
    bytes_copied: int


@dataclass(frozen=True)
class RepairFinished:
    """The pass is over (the lock was released just before, if taken). ``done``: nothing left
    for this worker (mark deleted, ledger gone, or locked by another worker); else the ledger
    is retried after a back-off. ``mark_ctime_ms``: when the mark was made (-1: not read)."""

    ledger_id: int
    done: bool
    reason: str
    repaired: bool = False
    mark_ctime_ms: int = -1


class RepairPhase(enum.Enum):
    LOCKING = "locking"
    READING_MARK = "reading_mark"
    PLANNING = "planning"            # waiting for the metadata to plan from
    COPYING = "copying"
    RECORDING = "recording"          # waiting for fresh metadata to apply a copied repair to
    WRITING = "writing"              # the CAS of a repair is in flight
    CHECKING = "checking"            # waiting for the metadata to decide about the mark
    UNMARKING = "unmarking"
    FINISHED = "finished"


class LedgerRepair:
    """One replication worker's pass over one marked ledger (pure; the shell executes the
    actions one at a time and feeds each answer back). Protocol:

    1. ``TakeLock`` (ephemeral, one worker per ledger). Not taken: finished, done (another
       worker has it).
    2. ``ReadMark``: none: finished, done. The mark's bookies are the ``lost`` ones; its
       version is kept for step 6.
    3. ``ReadLedger``: gone: ``Unmark`` at that version. Else ``plan_repairs`` (blocked
       fragments are logged; the mark stays for them).
    4. Per repair: ``CopyFragment``. A copy the replacement failed (refused or unanswered
       writes) re-plans from fresh metadata without that bookie (counted with the re-plans);
       after another failed copy the next repair goes ahead (step 6 keeps the mark). After a
       copy that is done,
       ``ReadLedger`` and ``apply_repair`` on the fresh metadata: ``WriteLedger`` at its
       version; a version conflict reads and applies again (at most ``cas_attempts_max``); a
       ``RepairConflict`` re-plans from that metadata (at most ``replans_max`` times).
    5. Nothing is ever written for a repair before its copy is done (invariant 10).
    6. ``ReadLedger``; if it still names some of ``lost`` (``still_missing``), finished, not
       done (retried). Else ``Unmark`` at the version read in 2: deleted, finished, done;
       refused (the mark changed meanwhile), finished, not done.
    Every finish after the lock was taken is preceded by ``ReleaseLock``."""

    def __init__(self, ledger_id: int, rng: random.Random, *, replans_max: int = 5,
                 cas_attempts_max: int = 10) -> None:
        check(replans_max > 0 and cas_attempts_max > 0, "replans_max and cas_attempts_max must be > 0")
        self.ledger_id = ledger_id
        self.rng = rng
        self.replans_max = replans_max
        self.cas_attempts_max = cas_attempts_max
        self.phase = RepairPhase.LOCKING
        self.locked = False
        self.lost: frozenset[str] = frozenset()
        self.mark_version = -1
        self.mark_ctime_ms = -1
        self._queue: list[FragmentRepair] = []
        self._copied: tuple[FragmentRepair, int] | None = None
        self._replans = 0
        self._cas_attempts = 0
        self._avoid: set[str] = set()          # replacements that failed a copy in this pass

    def _expect(self, *phases: RepairPhase) -> None:
        check(self.phase in phases, f"ledger {self.ledger_id}: event in phase {self.phase.value}, "
                                    f"expected {[p.value for p in phases]}")

    def _finish(self, done: bool, reason: str, repaired: bool = False) -> list:
        self.phase = RepairPhase.FINISHED
        out: list = [ReleaseLock(self.ledger_id)] if self.locked else []
        self.locked = False
        return out + [RepairFinished(self.ledger_id, done, reason, repaired, self.mark_ctime_ms)]

    def start(self) -> list:
        self._expect(RepairPhase.LOCKING)
        return [TakeLock(self.ledger_id)]

    def on_lock(self, taken: bool) -> list:
        self._expect(RepairPhase.LOCKING)
        if not taken:
            return self._finish(True, "locked by another worker")
        self.locked = True
        self.phase = RepairPhase.READING_MARK
        return [ReadMark(self.ledger_id)]

    def on_mark(self, mark, version: int) -> list:
        """``mark``: an UnderReplicatedMark, or None (none any more)."""
        self._expect(RepairPhase.READING_MARK)
        if mark is None:
            return self._finish(True, "no mark")
        self.lost = frozenset(mark.missing_bookies)
        self.mark_version = version
        self.mark_ctime_ms = mark.ctime_ms
        self.phase = RepairPhase.PLANNING
        return [ReadLedger(self.ledger_id)]

    def on_ledger(self, md: LedgerMetadata | None, version: int, writable: Sequence[str],
                  racks: Mapping[str, str] | None = None, readable: Sequence[str] | None = None) -> list:
        self._expect(RepairPhase.PLANNING, RepairPhase.RECORDING, RepairPhase.CHECKING)
        if md is None:                      # deleted: nothing to repair, the mark goes
            self.phase = RepairPhase.UNMARKING
            return [Unmark(self.ledger_id, self.mark_version)]
        if self.phase is RepairPhase.PLANNING:
            return self._plan(md, writable, racks, readable)
        if self.phase is RepairPhase.RECORDING:
            repair, _ = self._copied
            try:
                new = apply_repair(md, repair)
            except RepairConflict:
                self._replans += 1
                if self._replans >= self.replans_max:
                    return self._check(md)
                return self._plan(md, writable, racks, readable)
            self.phase = RepairPhase.WRITING
            return [WriteLedger(new, version, repair)]
        return self._check(md)

    def _plan(self, md: LedgerMetadata, writable: Sequence[str], racks: Mapping[str, str] | None,
              readable: Sequence[str] | None) -> list:
        # only the marked bookies the ledger still needs moved off: one the mark names but
        # the ledger no longer does (moved off by an earlier pass whose unmark found the mark
        # changed) must not be kept out of the candidates, or with few bookies nothing is left
        writable = [b for b in writable if b not in self._avoid]
        repairs, blocked = plan_repairs(md, still_missing(md, self.lost), writable, self.rng, racks, readable)
        self._queue = list(repairs)
        return [FragmentBlocked(b) for b in blocked] + self._next()

    def _next(self) -> list:
        if not self._queue:
            self.phase = RepairPhase.CHECKING
            return [ReadLedger(self.ledger_id)]
        self.phase = RepairPhase.COPYING
        self._cas_attempts = 0
        return [CopyFragment(self._queue[0])]

    def on_copied(self, ok: bool, bytes_copied: int = 0, replacement_failed: bool = False) -> list:
        self._expect(RepairPhase.COPYING)
        if not ok and replacement_failed and self._replans + 1 < self.replans_max:
            # the replacement refused (it may hold a different copy of an entry: the first
            # write wins) or did not answer: plan again from fresh metadata without it, else
            # the same choice (racks make it deterministic) would fail on every pass
            self._replans += 1
            self._avoid.add(self._queue[0].replacement)
            self._queue = []
            self.phase = RepairPhase.PLANNING
            return [ReadLedger(self.ledger_id)]
        if not ok:
            # the other repairs still go ahead: a fragment whose only good copy of some entry
            # is on a marked bookie that another repair of this pass moves first is repaired
            # on the next pass, from the replacement (the mark stays: step 6)
            self._queue.pop(0)
            return self._next()
        self._copied = (self._queue.pop(0), bytes_copied)
        self.phase = RepairPhase.RECORDING
        return [ReadLedger(self.ledger_id)]

    def on_written(self, ok: bool) -> list:
        self._expect(RepairPhase.WRITING)
        if not ok:
            self._cas_attempts += 1
            if self._cas_attempts >= self.cas_attempts_max:
                return self._finish(False, f"repair lost {self.cas_attempts_max} metadata races")
            self.phase = RepairPhase.RECORDING
            return [ReadLedger(self.ledger_id)]
        repair, nbytes = self._copied
        self._copied = None
        return [FragmentRecorded(repair, nbytes)] + self._next()

    def _check(self, md: LedgerMetadata) -> list:
        remaining = still_missing(md, self.lost)
        if remaining:
            return self._finish(False, "still names " + ",".join(sorted(remaining)))
        self.phase = RepairPhase.UNMARKING
        return [Unmark(self.ledger_id, self.mark_version)]

    def on_unmarked(self, deleted: bool) -> list:
        self._expect(RepairPhase.UNMARKING)
        if deleted:
            return self._finish(True, "repaired: mark removed", repaired=True)
        return self._finish(False, "the mark changed during the repair")

    def on_error(self, reason: str) -> list:
        """An operation failed (metadata store trouble, a bug in the shell): end the pass."""
        if self.phase is RepairPhase.FINISHED:
            return []
        return self._finish(False, reason)
