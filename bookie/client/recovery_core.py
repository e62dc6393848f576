"""The pure recovery core: fence a ledger, find its last entry, re-replicate, close it.

Runs on metadata the shell already CAS'd to IN_RECOVERY. Protocol (NOTES.md, "BookKeeper's
protocol", with both fixes of the TLA+ defects):

1. Fence: ReadLac(fence=True) to every bookie of the last fragment; wait until every write set
   has (Qw - Qa) + 1 answers (OK or NO_SUCH_LEDGER; ERROR does not count). LAC = max answered.
2. Read forward from max(LAC, first entry of the last fragment - 1) + 1 (fix 2: only the last
   fragment is recovered). Every read goes to the entry's write set WITH the fence flag (fix 1:
   a bookie that answers "no such entry" is fenced, so the answer stays true; the old writer
   cannot complete that entry later through a bookie whose fence message was lost).
3. An entry found anywhere is re-written (recovery add, same id, lac, length, payload) to its
   whole write set and needs Qa acks. Once (Qw - Qa) + 1 bookies of an entry's write set
   answered NO_SUCH_ENTRY / NO_SUCH_LEDGER it can never have been acknowledged: the ledger ends
   just before it, once every lower re-write has its Qa acks. Up to ``read_ahead_max`` entries
   are read at once; decisions and re-writes are taken in entry order (nothing beyond the
   first missing entry is ever written).
4. CAS CLOSED(last_entry_id, length). A conflict means another recovery or close got there
   first: if the store says CLOSED, that result is accepted (recoveries converge via the CAS).

Too many unreachable bookies to decide gives RecoveryFailed with a retriable error: re-read the
metadata and run a new core later.
"""

from __future__ import annotations

import enum

from bookie.client.actions import (Action, AddOutcome, EntryData, LacOutcome, ReadOutcome,
                                   RecoveryDone, RecoveryFailed, SendAdd, SendRead, SendReadLac,
                                   WriteMetadata)
from bookie.client.metadata import LedgerMetadata, LedgerState, covers_every_write_set
from pulsarlite.errors import BookieUnavailableError, MetadataError, PulsarliteError, check


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
    longer matter (late answers, answers for entries already decided, duplicates)."""

    def __init__(self, metadata: LedgerMetadata, *, fence_recovery_reads: bool = True,
                 read_ahead_max: int = 4, metadata_attempts_max: int = 10) -> None:
        check(metadata.state is LedgerState.IN_RECOVERY,
              f"ledger {metadata.ledger_id}: recovery on a {metadata.state.value} ledger")
        if metadata_attempts_max < 1 or read_ahead_max < 1:
            raise ValueError(f"need metadata_attempts_max >= 1 and read_ahead_max >= 1, got "
                             f"{metadata_attempts_max}, {read_ahead_max}")
        self._md = metadata
        self._fence_reads = fence_recovery_reads
        self._read_ahead_max = read_ahead_max
        self._attempts_max = metadata_attempts_max
        self._attempts = 0
        self._phase = RecoveryPhase.NEW
        self._index_of = {b: i for i, b in enumerate(metadata.current_ensemble)}
        self._lac_answers: dict[str, int] = {}
        self._lac_errors: set[str] = set()
        self._lac = -1
        self._first_to_read = -1
        # forward reading: entries [_decided_upto, _next_read) have reads in flight or decided
        self._next_read = -1
        self._decided_upto = -1                    # every entry below is found, re-write started
        self._read_answers: dict[int, dict[str, ReadOutcome]] = {}
        self._found: dict[int, EntryData] = {}
        self._missing: set[int] = set()
        self._undecidable: set[int] = set()
        self._rewrites: dict[int, tuple[set[str], set[str]]] = {}   # entry -> (acks, errors)
        self._end: int | None = None               # first entry known not to exist
        self._length_entry = -1                    # READING_LENGTH: the entry read
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

    # -- events --------------------------------------------------------------------------
    def start(self) -> list[Action]:
        check(self._phase is RecoveryPhase.NEW, "recovery started twice")
        self._phase = RecoveryPhase.FENCING
        return [SendReadLac(b, fence=True) for b in self._md.current_ensemble]

    def on_read_lac(self, bookie: str, outcome: LacOutcome, lac: int = -1) -> list[Action]:
        if (self._phase is not RecoveryPhase.FENCING or bookie not in self._index_of
                or bookie in self._lac_answers or bookie in self._lac_errors):
            return []
        if outcome is LacOutcome.ERROR:
            self._lac_errors.add(bookie)
        else:
            self._lac_answers[bookie] = lac if outcome is LacOutcome.OK else -1
        md = self._md
        answered = frozenset(self._index_of[b] for b in self._lac_answers)
        if covers_every_write_set(md.ensemble_size, md.write_quorum, md.ack_quorum, answered):
            self._lac = max(self._lac_answers.values())
            self._first_to_read = max(self._lac, md.last_fragment_first_entry - 1) + 1   # fix 2
            self._next_read = self._decided_upto = self._first_to_read
            self._phase = RecoveryPhase.READING
            return self._progress()
        if len(self._lac_answers) + len(self._lac_errors) == md.ensemble_size:
            return self._fail(BookieUnavailableError(
                f"ledger {md.ledger_id}: cannot fence, unreachable: {sorted(self._lac_errors)}"))
        return []

    def on_read(self, bookie: str, entry_id: int, outcome: ReadOutcome,
                entry: EntryData | None = None) -> list[Action]:
        if entry_id < 0 or bookie not in self._md.write_set(entry_id):
            return []
        if outcome is ReadOutcome.FOUND and (entry is None or entry.entry_id != entry_id):
            outcome = ReadOutcome.ERROR               # a malformed answer counts as an error
        if self._phase is RecoveryPhase.READING_LENGTH:
            return self._on_length_read(bookie, entry_id, outcome, entry)
        answers = self._read_answers.get(entry_id)
        if self._phase is not RecoveryPhase.READING or answers is None or bookie in answers:
            return []
        answers[bookie] = outcome
        md = self._md
        if outcome is ReadOutcome.FOUND:
            assert entry is not None
            self._found[entry_id] = entry
            del self._read_answers[entry_id]
        elif sum(1 for o in answers.values() if o in _MISSING) >= md.write_quorum - md.ack_quorum + 1:
            self._missing.add(entry_id)
            del self._read_answers[entry_id]
        elif len(answers) == md.write_quorum:
            self._undecidable.add(entry_id)
            del self._read_answers[entry_id]
        else:
            return []
        return self._progress()

    def on_add_result(self, bookie: str, entry_id: int, outcome: AddOutcome) -> list[Action]:
        rewrite = self._rewrites.get(entry_id)
        if (self._phase is not RecoveryPhase.READING or rewrite is None
                or bookie not in self._md.write_set(entry_id)):
            return []
        acks, errors = rewrite
        if bookie in acks or bookie in errors:
            return []
        md = self._md
        if outcome is AddOutcome.OK:
            acks.add(bookie)
            if len(acks) >= md.ack_quorum:
                del self._rewrites[entry_id]
                return self._progress()
            return []
        errors.add(bookie)
        if len(errors) > md.write_quorum - md.ack_quorum:
            return self._fail(BookieUnavailableError(
                f"ledger {md.ledger_id}: cannot re-replicate entry {entry_id}: "
                f"{len(errors)} bookies failed"))
        return []

    def on_metadata_written(self, metadata: LedgerMetadata) -> list[Action]:
        check(self._phase is RecoveryPhase.CLOSING and metadata == self._closing_md,
              f"ledger {self._md.ledger_id}: metadata written that recovery did not propose")
        self._phase = RecoveryPhase.DONE
        return [RecoveryDone(metadata)]

    def on_metadata_conflict(self, current: LedgerMetadata) -> list[Action]:
        if self._phase is not RecoveryPhase.CLOSING:
            return []
        check(current.state is not LedgerState.OPEN,
              f"ledger {current.ledger_id} went back from IN_RECOVERY to OPEN")
        if current.is_closed:
            self._phase = RecoveryPhase.DONE
            return [RecoveryDone(current)]
        if current.ensembles != self._md.ensembles or self._attempts >= self._attempts_max:
            return self._fail(MetadataError(
                f"ledger {current.ledger_id}: metadata changed under recovery: {current.ensembles}"))
        self._attempts += 1
        self._md = current
        return self._close()

    # -- internals -----------------------------------------------------------------------
    def _progress(self) -> list[Action]:
        """Take decisions in entry order, keep the read window full, close when done."""
        md = self._md
        actions: list[Action] = []
        while self._end is None:
            entry_id = self._decided_upto
            found = self._found.get(entry_id)
            if found is not None:
                self._rewrites[entry_id] = (set(), set())
                actions += [SendAdd(b, entry_id, found.lac, found.length, found.payload, recovery=True)
                            for b in md.write_set(entry_id)]
                self._decided_upto += 1
            elif entry_id in self._missing:
                self._end = entry_id
            elif entry_id in self._undecidable:
                return self._fail(BookieUnavailableError(
                    f"ledger {md.ledger_id}: cannot decide whether entry {entry_id} exists"))
            else:
                break
        if self._end is None:
            while self._next_read < self._decided_upto + self._read_ahead_max:
                entry_id = self._next_read
                self._next_read += 1
                self._read_answers[entry_id] = {}
                actions += [SendRead(b, entry_id, fence=self._fence_reads) for b in md.write_set(entry_id)]
            return actions
        if self._rewrites:
            return actions                         # wait for the lower re-writes' Qa acks
        self._read_answers.clear()
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
            return actions + [SendRead(b, last, fence=self._fence_reads) for b in md.write_set(last)]
        return actions + self._close()

    def _on_length_read(self, bookie: str, entry_id: int, outcome: ReadOutcome,
                        entry: EntryData | None) -> list[Action]:
        if entry_id != self._length_entry or bookie in self._length_answers:
            return []
        self._length_answers[bookie] = outcome
        if outcome is ReadOutcome.FOUND:
            assert entry is not None
            self._length = entry.length
            return self._close()
        if len(self._length_answers) == self._md.write_quorum:
            return self._fail(BookieUnavailableError(
                f"ledger {self._md.ledger_id}: entry {entry_id} (for the ledger length) unreadable"))
        return []

    def _close(self) -> list[Action]:
        check(self._length >= 0, "closing without a length")
        self._phase = RecoveryPhase.CLOSING
        self._closing_md = self._md.with_state(LedgerState.CLOSED, last_entry_id=self._last_entry_id,
                                               length=self._length)
        return [WriteMetadata(self._closing_md)]

    def _fail(self, error: PulsarliteError) -> list[Action]:
        self._phase = RecoveryPhase.FAILED
        return [RecoveryFailed(error)]
