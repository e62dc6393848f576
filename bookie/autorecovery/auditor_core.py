"""The auditor's decisions (pure: events in, actions out; time passed in). After BookKeeper's
Auditor with ``lostBookieRecoveryDelay``.

Protocol:

- The live bookies are the writable plus the read-only registrations (a read-only bookie
  still serves reads: its copies are not lost).
- A bookie named by some ledger's metadata and not live is *missing* from the first time the
  auditor saw it so (a registration change, or its first scan: a bookie already gone when the
  auditor starts is timed from then). A bookie that is live again before the delay ends is no
  longer missing: nothing is marked for it (its pending marks are cancelled).
- A missing bookie becomes *lost* once it has been missing for ``lost_bookie_recovery_delay_ms``;
  a bookie being decommissioned is lost at once (it may still be up: its copies stay readable
  while they are moved).
- Every ledger with a fragment on a lost bookie is marked under-replicated with the lost
  bookies it names. A CLOSED ledger with ``under_replicated_bookies`` (a delayed ensemble
  change: its last fragment lacks entries on those bookies, live or not) is marked with them too.
- A ledger is marked again only for bookies its known mark lacks (marks read in a scan count);
  the shell merges marks by compare-and-set, so marking twice is harmless.
- A mark says which of its bookies were marked because they were lost (``lost_bookies``). A
  bookie marked lost that is live again (a registration is cookie-checked: the same bookie
  with its disks) is taken out of those marks (``UnmarkBookies``; a mark left empty goes),
  unless the metadata says the ledger lacks entries on it or it is being decommissioned; any
  auditor does it (the marks of a scan count), so an election between the loss and the return
  changes nothing. Without that, a bookie whose session expired for longer than the delay (a
  loaded machine after a ZooKeeper restart) stayed "lost" in its marks for good: workers kept
  trying to move copies off a live bookie and, with no bookie outside the ensemble left, the
  repair of a really lost one in the same ledgers waited for ever (a chaos run, session 20).

Bounded: at most ``marks_per_step_max`` marks per call (the rest on the next tick).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from bookie.client.metadata import LedgerMetadata, LedgerState
from pulsarlite.errors import check


@dataclass(frozen=True)
class MarkLedger:
    """Action: mark ``ledger_id`` under-replicated for ``missing_bookies`` (merged), of which
    ``lost_bookies`` because they were lost."""

    ledger_id: int
    missing_bookies: tuple[str, ...]
    lost_bookies: tuple[str, ...] = ()


@dataclass(frozen=True)
class BookieLost:
    """Action (a log line): ``bookie_id`` is now treated as lost; ``ledgers`` name it."""

    bookie_id: str
    reason: str          # "lost" | "decommissioning"
    ledgers: int


@dataclass(frozen=True)
class UnmarkBookies:
    """Action: take ``bookies`` out of ``ledger_id``'s mark (CAS; the mark goes if left empty)."""

    ledger_id: int
    bookies: tuple[str, ...]


class AuditorCore:
    def __init__(self, lost_bookie_recovery_delay_ms: int, *, marks_per_step_max: int = 10_000) -> None:
        check(lost_bookie_recovery_delay_ms >= 0, "lost_bookie_recovery_delay_ms must be >= 0")
        check(marks_per_step_max > 0, "marks_per_step_max must be > 0")
        self.delay_ms = lost_bookie_recovery_delay_ms
        self.marks_per_step_max = marks_per_step_max
        self._live: frozenset[str] | None = None           # None: not known yet
        self._ledgers: dict[int, LedgerMetadata] = {}
        self._marked: dict[int, frozenset[str]] = {}       # what the marks are known to hold
        self._decommissioning: frozenset[str] = frozenset()
        self._missing_since_ms: dict[str, int] = {}
        self._announced: set[str] = set()
        self._marked_lost: dict[str, set[int]] = {}        # bookie -> ledgers whose mark has it lost
        self._returned: dict[int, set[str]] = {}           # ledger -> returned bookies to take out of its mark

    # -- events --------------------------------------------------------------------------
    def on_bookies(self, writable: Iterable[str], readonly: Iterable[str], now_ms: int) -> list:
        self._live = frozenset(writable) | frozenset(readonly)
        return self._decide(now_ms)

    def on_scan(self, ledgers: Iterable[LedgerMetadata], marks: Mapping[int, Iterable[str]],
                decommissioning: Iterable[str], now_ms: int,
                lost_marks: Mapping[int, Iterable[str]] | None = None) -> list:
        """A full scan: every ledger's metadata, every mark (its bookies; ``lost_marks``: those
        of them marked lost), the decommissioning bookies."""
        self._ledgers = {md.ledger_id: md for md in ledgers}
        self._marked = {lid: frozenset(b) for lid, b in marks.items()}
        for ledger_id, bookies in (lost_marks or {}).items():
            for b in bookies:
                self._marked_lost.setdefault(b, set()).add(ledger_id)
        self._decommissioning = frozenset(decommissioning)
        return self._decide(now_ms)

    def on_tick(self, now_ms: int) -> list:
        return self._decide(now_ms)

    def on_marked(self, ledger_id: int, missing: Iterable[str]) -> None:
        """The shell's CAS merged a mark (what the mark holds now)."""
        self._marked[ledger_id] = self._marked.get(ledger_id, frozenset()) | frozenset(missing)

    def on_unmarked_bookies(self, ledger_id: int, bookies: Iterable[str], done: bool) -> None:
        """The shell took ``bookies`` out of the mark (``done``), or could not (tried again)."""
        if not done:
            return
        bookies = frozenset(bookies)
        left = self._returned.get(ledger_id, set()) - bookies
        if left:
            self._returned[ledger_id] = left
        else:
            self._returned.pop(ledger_id, None)
        if ledger_id in self._marked:
            self._marked[ledger_id] = self._marked[ledger_id] - bookies

    def on_mark_failed(self, ledger_id: int, missing: Iterable[str]) -> None:
        """The shell could not write a mark: forget it was decided, so it is emitted again."""
        self._marked[ledger_id] = self._marked.get(ledger_id, frozenset()) - frozenset(missing)

    # -- queries -------------------------------------------------------------------------
    def lost_bookies(self, now_ms: int) -> frozenset[str]:
        if self._live is None:
            return frozenset(self._decommissioning)
        return frozenset(b for b, since in self._missing_since_ms.items()
                         if now_ms - since >= self.delay_ms) | self._decommissioning

    def next_deadline_ms(self) -> int | None:
        """When a missing bookie becomes lost (the shell ticks then), or None."""
        pending = [since + self.delay_ms for b, since in self._missing_since_ms.items()
                   if b not in self._announced]
        return min(pending, default=None)

    def missing_bookies(self) -> frozenset[str]:
        return frozenset(self._missing_since_ms)

    def ledgers(self) -> list[LedgerMetadata]:
        """The ledgers of the last scan."""
        return list(self._ledgers.values())

    # -- decision ------------------------------------------------------------------------
    def _decide(self, now_ms: int) -> list:
        if self._live is None:
            return []
        named = {b for md in self._ledgers.values() for b in md.all_bookies()}
        for b in list(self._missing_since_ms):
            if b in self._live or b not in named:
                del self._missing_since_ms[b]       # back before the delay (or named by nothing)
                self._announced.discard(b)
        for b in [b for b in self._marked_lost if b in self._live and b not in self._decommissioning]:
            for ledger_id in self._marked_lost.pop(b):          # back after it was declared lost
                md = self._ledgers.get(ledger_id)
                if md is not None and md.state is LedgerState.CLOSED and b in md.lacking_bookies():
                    continue
                self._returned.setdefault(ledger_id, set()).add(b)
        for b in named - self._live:
            self._missing_since_ms.setdefault(b, now_ms)
        lost = self.lost_bookies(now_ms)
        actions: list = []
        counts: dict[str, int] = {}
        marks = 0
        for ledger_id in sorted(self._ledgers):
            md = self._ledgers[ledger_id]
            missing = md.all_bookies() & lost
            if md.state is LedgerState.CLOSED:
                missing |= md.lacking_bookies()
            for b in missing:
                counts[b] = counts.get(b, 0) + 1
            new = missing - self._marked.get(ledger_id, frozenset())
            if new and marks < self.marks_per_step_max:
                marks += 1
                self._marked[ledger_id] = self._marked.get(ledger_id, frozenset()) | new
                lost_here = (missing & lost) - self._decommissioning
                actions.append(MarkLedger(ledger_id, tuple(sorted(missing)), tuple(sorted(lost_here))))
                for b in lost_here:
                    self._marked_lost.setdefault(b, set()).add(ledger_id)
        for ledger_id in sorted(self._returned):
            returned = self._returned[ledger_id] - self._missing_since_ms.keys()
            if returned:
                actions.append(UnmarkBookies(ledger_id, tuple(sorted(returned))))
        for b in sorted(lost - self._announced):
            self._announced.add(b)
            actions.insert(0, BookieLost(b, "decommissioning" if b in self._decommissioning else "lost",
                                         counts.get(b, 0)))
        return actions


# -- the periodic replica check ----------------------------------------------------------------

@dataclass(frozen=True)
class ReplicaProbe:
    """Read ``entry_id`` of ``ledger_id`` from ``bookie`` (non-fencing) and check its CRC."""

    ledger_id: int
    entry_id: int
    bookie: str


def plan_replica_check(ledgers: Iterable[LedgerMetadata], entries_per_fragment: int, probes_max: int,
                       rng) -> list[ReplicaProbe]:
    """The probes of one periodic check (BookKeeper's auditorPeriodicCheck, sampled): for each
    CLOSED ledger (an open one's entries are still coming; an IN_RECOVERY one is being decided),
    each fragment with entries: its first and last entry and up to ``entries_per_fragment`` - 2
    others at random, each on every bookie of its write set. At most ``probes_max`` probes in all
    (ledgers taken in a random order, so successive checks cover different ones).

    A probe answered "no such entry/ledger" or with a copy failing its checksum means that
    bookie lacks the entry: the ledger is marked for it. A bookie that does not answer is not
    judged here (the lost-bookie delay decides about bookies that are gone)."""
    check(entries_per_fragment >= 1 and probes_max >= 1, "entries_per_fragment and probes_max must be >= 1")
    ledgers = [md for md in ledgers if md.state is LedgerState.CLOSED and md.last_entry_id >= 0]
    rng.shuffle(ledgers)
    probes: list[ReplicaProbe] = []
    for md in ledgers:
        for k, (first, bookies) in enumerate(md.ensembles):
            last = md.last_entry_id if k == len(md.ensembles) - 1 else min(md.ensembles[k + 1][0] - 1,
                                                                            md.last_entry_id)
            if last < first:
                continue
            chosen = {first, last}
            inner = range(first + 1, last)
            if len(inner) and entries_per_fragment > 2:
                chosen |= set(rng.sample(inner, min(len(inner), entries_per_fragment - 2)))
            for e in sorted(chosen)[:entries_per_fragment]:
                for b in md.write_set(e):
                    if len(probes) >= probes_max:
                        return probes
                    probes.append(ReplicaProbe(md.ledger_id, e, b))
    return probes
