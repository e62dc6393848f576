"""The pure recovery core: fence a ledger, find its last entry, re-replicate, close it.

Runs on metadata the shell already CAS'd to IN_RECOVERY. Protocol (docs/protocol.md#recovery,
with both fixes of the TLA+ defects: #recovery-fence-flag, #recovery-last-fragment):

1. Fence: ReadLac(fence=True) to every bookie of the writer's last fragment (the last fragment,
   or ``writer_fragment`` once a recovery changed the ensemble); wait until every write set has
   (Qw - Qa) + 1 answers (OK or NO_SUCH_LEDGER; ERROR does not count). LAC = max answered.
2. Read forward from max(LAC, first entry of the writer's last fragment - 1) + 1 (fix 2: only
   that fragment is recovered), or from the first entry of the fragments an earlier recovery
   put in, if lower (their new bookies hold only what a recovery re-wrote). Every read goes to
   the entry's write set in the writer's fragment and in the current metadata, WITH the fence
   flag (fix 1: a bookie that answers "no such entry" is fenced, so the answer stays true; the
   old writer cannot complete that entry later through a bookie whose fence message was lost).
   Only the writer's bookies' "no such entry" count: a bookie a recovery put in may simply not
   have been re-written yet.
3. An entry found anywhere is re-written (recovery add, same id, lac, length, payload) to its
   whole write set in the current metadata and needs Qa acks there. Once (Qw - Qa) + 1 of the
   writer's bookies of an entry's write set answered NO_SUCH_ENTRY / NO_SUCH_LEDGER it can
   never have been acknowledged: the ledger ends just before it, once every lower re-write has
   its Qa acks. Up to ``read_ahead_max`` entries are read at once; decisions and re-writes are
   taken in entry order (nothing beyond the first missing entry is ever written).
4. Ensemble change (as BookKeeper's recovery adds go through the ledger's add path): when a
   re-write can no longer get Qa acks because bookies of its write set failed (ERROR, read-only
   or no such ledger on an add; a bookie that answered the fencing may fail later too), those
   bookies are replaced (``placement.choose_replacements`` over the writable bookies, with the
   rng passed in) from F on, F the lowest entry still being re-written whose write set holds
   one of them: entries below F kept their Qa acks in their old write sets and keep their
   fragment; from F on, one fragment (F's ensemble with the replacements; fragments above are
   dropped), and every entry from F on that was re-written (done or not) must again have Qa
   acks in its new write set, and be held by every bookie a recovery put in its write set.
   The change is a CAS (WriteMetadata of ``LedgerMetadata.with_recovery_ensemble``, which
   records the writer's last fragment and refuses a fragment below it), one in flight at a
   time, at most ``ensemble_change_attempts_max`` per recovery. No spare bookie:
   RecoveryFailed(NotEnoughBookiesError), retriable.
5. CAS CLOSED(last_entry_id, length) with the ensembles as changed. A conflict (on the close or
   on an ensemble change) means another recovery or close got there first: CLOSED is accepted
   (recoveries converge via the CAS); IN_RECOVERY with other ensembles is taken over (every
   re-written entry again needs Qa acks in its new write set before the close), unless it put
   in fragments below the entries this recovery re-writes: then RecoveryFailed (retriable), and
   a new recovery reads from there.

Too many unreachable bookies to decide gives RecoveryFailed with a retriable error: re-read the
metadata and run a new core later. ``change_ensemble`` and ``recover_from_last_fragment`` are
switches for tests only (the mutation study: with them off the simulation finds the old
liveness limit, resp. a recovery fragment below the writer's last one).
"""

from __future__ import annotations

import enum
import random
from typing import Sequence

from bookie.client.actions import (Action, AddOutcome, EntryData, LacOutcome, ReadOutcome,
                                   RecoveryDone, RecoveryFailed, SendAdd, SendRead, SendReadLac,
                                   WriteMetadata)
from bookie.client.metadata import LedgerMetadata, LedgerState, covers_every_write_set
from bookie.client.placement import choose_replacements
from pulsarlite.errors import (BookieUnavailableError, MetadataError, NotEnoughBookiesError,
                               PulsarliteError, check)


class RecoveryPhase(enum.Enum):
    NEW = "NEW"
    FENCING = "FENCING"                  # ReadLac(fence) sent, waiting for a covering quorum
    READING = "READING"                  # reading forward and re-writing found entries
    READING_LENGTH = "READING_LENGTH"    # nothing recovered: reading entry start-1 for its length
    CLOSING = "CLOSING"                  # CLOSED metadata CAS in flight
    DONE = "DONE"
    FAILED = "FAILED"


_MISSING = (ReadOutcome.NO_SUCH_ENTRY, ReadOutcome.NO_SUCH_LEDGER)


class LedgerRecoveryCore:
    """Recovery of one ledger; see the module docstring. Events are ignored once they no
    longer matter (late answers, answers for entries already decided, duplicates).
    ``writable_bookies`` and ``rng`` (given with every event that may change the ensemble) are
    the replacement candidates and the random source of the placement."""

    def __init__(self, metadata: LedgerMetadata, *, fence_recovery_reads: bool = True,
                 read_ahead_max: int = 4, metadata_attempts_max: int = 10,
                 ensemble_change_attempts_max: int = 10, change_ensemble: bool = True,
                 recover_from_last_fragment: bool = True) -> None:
        check(metadata.state is LedgerState.IN_RECOVERY,
              f"ledger {metadata.ledger_id}: recovery on a {metadata.state.value} ledger")
        if metadata_attempts_max < 1 or read_ahead_max < 1 or ensemble_change_attempts_max < 1:
            raise ValueError(f"need metadata_attempts_max, read_ahead_max and ensemble_change_attempts_max "
                             f">= 1, got {metadata_attempts_max}, {read_ahead_max}, "
                             f"{ensemble_change_attempts_max}")
        self._md = metadata
        # the writer's view: what is fenced, and whose "no such entry" answers decide
        self._read_md = metadata.recovery_read_view()
        self._writer_fragment = metadata.recovery_writer_fragment
        self._fence_reads = fence_recovery_reads
        self._from_last_fragment = recover_from_last_fragment
        self._change_enabled = change_ensemble
        self._read_ahead_max = read_ahead_max
        self._attempts_max = metadata_attempts_max
        self._attempts = 0
        self._changes_max = ensemble_change_attempts_max
        self._changes = 0
        self._phase = RecoveryPhase.NEW
        self._index_of = {b: i for i, b in enumerate(self._read_md.current_ensemble)}
        self._lac_answers: dict[str, int] = {}
        self._lac_errors: set[str] = set()
        self._lac = -1
        self._first_to_read = -1
        # forward reading: entries [_decided_upto, _next_read) have reads in flight or decided
        self._next_read = -1
        self._decided_upto = -1                    # every entry below is found, re-write started
        self._read_answers: dict[int, dict[str, ReadOutcome]] = {}
        self._read_targets: dict[int, tuple[str, ...]] = {}
        self._found: dict[int, EntryData] = {}
        self._missing: set[int] = set()
        self._undecidable: dict[int, str] = {}     # entry -> the answers (for the error)
        # re-writes, per entry whose re-write started: bookies that acked / have an add in
        # flight / failed it (members of its current write set only); _pending: not done yet
        self._acks: dict[int, set[str]] = {}
        self._sent: dict[int, set[str]] = {}
        self._errors: dict[int, set[str]] = {}
        self._pending: set[int] = set()
        self._proposed: LedgerMetadata | None = None       # ensemble change CAS in flight
        self._change: tuple[int, dict[str, str]] | None = None
        self._end: int | None = None               # first entry known not to exist
        self._length_entry = -1                    # READING_LENGTH: the entry read
        self._length_targets: tuple[str, ...] = ()
        self._length_answers: dict[str, ReadOutcome] = {}
        # result
        self._last_entry_id = -1
        self._length = 0
        self._closing_md: LedgerMetadata | None = None

    # -- properties ----------------------------------------------------------------------
    @property
    def phase(self) -> RecoveryPhase:
        return self._phase

    @property
    def metadata(self) -> LedgerMetadata:
        """The metadata as this recovery last knew it in the store (with its ensemble changes)."""
        return self._md

    @property
    def lac(self) -> int:
        """Max LAC of the fencing quorum (valid once past FENCING)."""
        return self._lac

    @property
    def first_entry_to_read(self) -> int:
        return self._first_to_read

    @property
    def last_entry_id(self) -> int:
        """The close point (valid once CLOSING)."""
        return self._last_entry_id

    @property
    def length(self) -> int:
        return self._length

    @property
    def ensemble_changes(self) -> int:
        """Ensemble changes proposed so far (at most ``ensemble_change_attempts_max``)."""
        return self._changes

    @property
    def ensemble_change(self) -> tuple[int, dict[str, str]] | None:
        """The ensemble change whose CAS is in flight: (from entry, {replaced: by}), for logs."""
        return self._change

    # -- events --------------------------------------------------------------------------
    def start(self) -> list[Action]:
        check(self._phase is RecoveryPhase.NEW, "recovery started twice")
        self._phase = RecoveryPhase.FENCING
        return [SendReadLac(b, fence=True) for b in self._read_md.current_ensemble]

    def on_read_lac(self, bookie: str, outcome: LacOutcome, lac: int = -1) -> list[Action]:
        if (self._phase is not RecoveryPhase.FENCING or bookie not in self._index_of
                or bookie in self._lac_answers or bookie in self._lac_errors):
            return []
        if outcome is LacOutcome.ERROR:
            self._lac_errors.add(bookie)
        else:
            self._lac_answers[bookie] = lac if outcome is LacOutcome.OK else -1
        md = self._read_md
        answered = frozenset(self._index_of[b] for b in self._lac_answers)
        if covers_every_write_set(md.ensemble_size, md.write_quorum, md.ack_quorum, answered):
            self._lac = max(self._lac_answers.values())
            if self._from_last_fragment:       # fix 2: only the writer's last fragment
                first = max(self._lac, self._writer_fragment[0] - 1) + 1
            else:                              # test-only: the defect, from the LAC
                first = self._lac + 1
            recovered_from = self._md.recovery_fragments_first_entry
            if recovered_from is not None:     # bookies put in there hold only re-written entries
                first = min(first, recovered_from)
            self._first_to_read = first
            self._next_read = self._decided_upto = first
            self._phase = RecoveryPhase.READING
            return self._progress()
        if len(self._lac_answers) + len(self._lac_errors) == md.ensemble_size:
            return self._fail(BookieUnavailableError(
                f"ledger {md.ledger_id}: cannot fence, unreachable: {sorted(self._lac_errors)}"))
        return []

    def on_read(self, bookie: str, entry_id: int, outcome: ReadOutcome,
                entry: EntryData | None = None) -> list[Action]:
        if entry_id < 0:
            return []
        if outcome is ReadOutcome.FOUND and (entry is None or entry.entry_id != entry_id):
            outcome = ReadOutcome.ERROR               # a malformed answer counts as an error
        if self._phase is RecoveryPhase.READING_LENGTH:
            return self._on_length_read(bookie, entry_id, outcome, entry)
        answers = self._read_answers.get(entry_id)
        if (self._phase is not RecoveryPhase.READING or answers is None or bookie in answers
                or bookie not in self._read_targets[entry_id]):
            return []
        answers[bookie] = outcome
        md = self._read_md
        writer_set = md.write_set(entry_id)
        if outcome is ReadOutcome.FOUND:
            assert entry is not None
            self._found[entry_id] = entry
        elif (sum(1 for b, o in answers.items() if o in _MISSING and b in writer_set)
              >= md.write_quorum - md.ack_quorum + 1):
            self._missing.add(entry_id)
        elif len(answers) == len(self._read_targets[entry_id]):
            self._undecidable[entry_id] = ", ".join(f"{b}={o.name}" for b, o in sorted(answers.items()))
        else:
            return []
        del self._read_answers[entry_id]
        del self._read_targets[entry_id]
        return self._progress()

    def on_add_result(self, bookie: str, entry_id: int, outcome: AddOutcome,
                      writable_bookies: Sequence[str], rng: random.Random) -> list[Action]:
        sent = self._sent.get(entry_id)
        if self._phase is not RecoveryPhase.READING or sent is None or bookie not in sent:
            return []                                  # late, stale (replaced since) or duplicate
        sent.discard(bookie)
        if outcome is AddOutcome.OK:
            self._acks[entry_id].add(bookie)
            if entry_id in self._pending and self._satisfied(entry_id):
                self._pending.discard(entry_id)
                return self._progress()
            return []
        self._errors[entry_id].add(bookie)             # ERROR, READ_ONLY, NO_SUCH_LEDGER, FENCED
        return self._change_ensemble(writable_bookies, rng)

    def on_metadata_written(self, metadata: LedgerMetadata, writable_bookies: Sequence[str],
                            rng: random.Random) -> list[Action]:
        """The CAS of our WriteMetadata applied (the close, or an ensemble change)."""
        if self._phase is RecoveryPhase.CLOSING:
            check(metadata == self._closing_md,
                  f"ledger {self._md.ledger_id}: metadata written that recovery did not propose")
            self._phase = RecoveryPhase.DONE
            return [RecoveryDone(metadata)]
        check(self._phase is RecoveryPhase.READING and metadata == self._proposed,
              f"ledger {self._md.ledger_id}: metadata written that recovery did not propose")
        self._md = metadata
        self._proposed = None
        self._change = None
        return self._rebase() + self._change_ensemble(writable_bookies, rng) + self._progress()

    def on_metadata_conflict(self, current: LedgerMetadata, writable_bookies: Sequence[str],
                             rng: random.Random) -> list[Action]:
        """Our CAS lost: ``current`` is what the store holds now (remember its version)."""
        if not (self._phase is RecoveryPhase.CLOSING
                or (self._phase is RecoveryPhase.READING and self._proposed is not None)):
            return []
        check(current.state is not LedgerState.OPEN,
              f"ledger {current.ledger_id} went back from IN_RECOVERY to OPEN")
        if current.is_closed:
            self._phase = RecoveryPhase.DONE
            return [RecoveryDone(current)]
        check(current.recovery_writer_fragment == self._writer_fragment,
              f"ledger {current.ledger_id}: recoveries disagree on the writer's last fragment: "
              f"{current.recovery_writer_fragment} != {self._writer_fragment}")
        if self._attempts >= self._attempts_max:
            return self._fail(MetadataError(
                f"ledger {current.ledger_id}: metadata changed under recovery {self._attempts + 1} times: "
                f"{current.ensembles}"))
        recovered_from = current.recovery_fragments_first_entry
        if recovered_from is not None and recovered_from < self._first_to_read:
            return self._fail(MetadataError(
                f"ledger {current.ledger_id}: another recovery put in bookies from entry {recovered_from}, "
                f"below this one's first entry {self._first_to_read}: recover again from there"))
        self._attempts += 1
        self._md = current
        self._proposed = None
        self._change = None
        closing = self._phase is RecoveryPhase.CLOSING
        self._phase = RecoveryPhase.READING
        actions = self._rebase() + self._change_ensemble(writable_bookies, rng)
        if self._phase is RecoveryPhase.READING and closing and not self._pending and self._proposed is None:
            return actions + self._close()         # every re-written entry stays where it was
        return actions + self._progress()

    # -- internals -----------------------------------------------------------------------
    def _must_hold(self, entry_id: int) -> set[str]:
        """Bookies a recovery put in the entry's write set: each must hold the entry itself."""
        return set(self._md.write_set(entry_id)) - set(self._read_md.write_set(entry_id))

    def _satisfied(self, entry_id: int) -> bool:
        acks = self._acks[entry_id]
        return len(acks) >= self._md.ack_quorum and self._must_hold(entry_id) <= acks

    def _stuck(self, entry_id: int) -> bool:
        """The entry can no longer get its acks from its write set (bookies failed)."""
        errors = self._errors[entry_id]
        if not errors:
            return False
        members = set(self._md.write_set(entry_id))
        return (len(members - errors) < self._md.ack_quorum
                or bool(self._must_hold(entry_id) & errors))

    def _send_rewrite(self, entry_id: int) -> list[Action]:
        found = self._found[entry_id]
        acks, sent, errors = self._acks[entry_id], self._sent[entry_id], self._errors[entry_id]
        actions: list[Action] = []
        for b in self._md.write_set(entry_id):
            if b not in acks and b not in sent and b not in errors:
                sent.add(b)
                actions.append(SendAdd(b, entry_id, found.lac, found.length, found.payload, recovery=True))
        return actions

    def _rebase(self) -> list[Action]:
        """The metadata changed: every re-written entry needs its acks in its write set as now
        (a bookie put in for it gets it)."""
        actions: list[Action] = []
        for entry_id in sorted(self._acks):
            members = set(self._md.write_set(entry_id))
            self._acks[entry_id] &= members
            self._sent[entry_id] &= members
            self._errors[entry_id] &= members
            if self._satisfied(entry_id):
                self._pending.discard(entry_id)
            else:
                self._pending.add(entry_id)
                actions += self._send_rewrite(entry_id)
        return actions

    def _change_ensemble(self, writable_bookies: Sequence[str], rng: random.Random) -> list[Action]:
        """Replace the failed bookies of the re-writes that cannot finish (one CAS at a time)."""
        if self._phase is not RecoveryPhase.READING or self._proposed is not None:
            return []
        md = self._md
        stuck = [e for e in sorted(self._pending) if self._stuck(e)]
        if not stuck:
            return []
        if not self._change_enabled:           # test-only: the liveness limit of old
            return self._fail(BookieUnavailableError(
                f"ledger {md.ledger_id}: cannot re-replicate entry {stuck[0]}: bookies "
                f"{sorted(self._errors[stuck[0]])} failed"))
        failed = sorted(set().union(*(self._errors[e] & set(md.write_set(e)) for e in stuck)))
        first = min(e for e in self._pending if set(failed) & set(md.write_set(e)))
        if self._changes >= self._changes_max:
            return self._fail(BookieUnavailableError(
                f"ledger {md.ledger_id}: recovery gave up after {self._changes} ensemble changes "
                f"(failed: {failed})"))
        ensemble = md.ensemble_for(first)
        # failed bookies only in fragments above ``first`` go with those fragments
        replaced = [b for b in failed if b in ensemble]
        known_failed = set().union(*self._errors.values())
        chosen = choose_replacements(writable_bookies, set(ensemble) | known_failed, len(replaced), rng)
        if len(chosen) < len(replaced):
            return self._fail(NotEnoughBookiesError(
                f"ledger {md.ledger_id}: recovery cannot replace {replaced} from entry {first}: "
                f"{len(chosen)} writable bookies outside the ensemble"))
        replacements = dict(zip(replaced, chosen))
        self._proposed = md.with_recovery_ensemble(first, tuple(replacements.get(b, b) for b in ensemble))
        self._change = (first, replacements)
        self._changes += 1
        return [WriteMetadata(self._proposed)]

    def _read_targets_of(self, entry_id: int) -> tuple[str, ...]:
        """The writer's write set (whose answers decide), then bookies a recovery put in."""
        writer_set = self._read_md.write_set(entry_id)
        return writer_set + tuple(b for b in self._md.write_set(entry_id) if b not in writer_set)

    def _progress(self) -> list[Action]:
        """Take decisions in entry order, keep the read window full, close when done."""
        if self._phase is not RecoveryPhase.READING:
            return []                              # failed meanwhile
        md = self._md
        actions: list[Action] = []
        while self._end is None:
            entry_id = self._decided_upto
            if entry_id in self._found:
                self._acks[entry_id], self._sent[entry_id], self._errors[entry_id] = set(), set(), set()
                self._pending.add(entry_id)
                actions += self._send_rewrite(entry_id)
                self._decided_upto += 1
            elif entry_id in self._missing:
                self._end = entry_id
            elif entry_id in self._undecidable:
                return self._fail(BookieUnavailableError(
                    f"ledger {md.ledger_id}: cannot decide whether entry {entry_id} exists "
                    f"(answers: {self._undecidable[entry_id]})"))
            else:
                break
        if self._end is None:
            while self._next_read < self._decided_upto + self._read_ahead_max:
                entry_id = self._next_read
                self._next_read += 1
                targets = self._read_targets_of(entry_id)
                self._read_answers[entry_id] = {}
                self._read_targets[entry_id] = targets
                actions += [SendRead(b, entry_id, fence=self._fence_reads) for b in targets]
            return actions
        if self._pending or self._proposed is not None:
            return actions                         # wait for the re-writes' acks
        self._read_answers.clear()
        self._read_targets.clear()
        last = self._end - 1
        self._last_entry_id = last
        if last == -1:
            self._length = 0
        elif last in self._found:
            self._length = self._found[last].length
        else:                                      # nothing recovered: read start-1's length
            check(last == self._first_to_read - 1, f"no length for entry {last}")
            self._phase = RecoveryPhase.READING_LENGTH
            self._length_entry = last
            self._length_targets = self._read_targets_of(last)
            return actions + [SendRead(b, last, fence=self._fence_reads) for b in self._length_targets]
        return actions + self._close()

    def _on_length_read(self, bookie: str, entry_id: int, outcome: ReadOutcome,
                        entry: EntryData | None) -> list[Action]:
        """Any replica's copy gives the length; only when every bookie asked answered without
        it (lost ones: ERROR) does this recovery fail."""
        if (entry_id != self._length_entry or bookie not in self._length_targets
                or bookie in self._length_answers):
            return []
        self._length_answers[bookie] = outcome
        if outcome is ReadOutcome.FOUND:
            assert entry is not None
            self._length = entry.length
            return self._close()
        if len(self._length_answers) == len(self._length_targets):
            return self._fail(BookieUnavailableError(
                f"ledger {self._md.ledger_id}: entry {entry_id} (for the ledger length) unreadable"))
        return []

    def _close(self) -> list[Action]:
        check(self._length >= 0, "closing without a length")
        self._phase = RecoveryPhase.CLOSING
        self._closing_md = self._md.with_state(LedgerState.CLOSED, last_entry_id=self._last_entry_id,
                                               length=self._length, writer_fragment=None)
        return [WriteMetadata(self._closing_md)]

    def _fail(self, error: PulsarliteError) -> list[Action]:
        self._phase = RecoveryPhase.FAILED
        return [RecoveryFailed(error)]
