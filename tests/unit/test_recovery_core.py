"""Unit tests of the pure ledger recovery core (bookie/client/recovery_core.py)."""

from __future__ import annotations

import pytest

from bookie.client.actions import (AddOutcome, EntryData, LacOutcome, ReadOutcome, RecoveryDone,
                                   RecoveryFailed, SendAdd, SendRead, SendReadLac, WriteMetadata)
from bookie.client.metadata import LedgerMetadata, LedgerState
from bookie.client.recovery_core import LedgerRecoveryCore, RecoveryPhase
from pulsarlite.errors import InvariantViolation

FOUND, NO_ENTRY, NO_LEDGER, RERR = (ReadOutcome.FOUND, ReadOutcome.NO_SUCH_ENTRY,
                                    ReadOutcome.NO_SUCH_LEDGER, ReadOutcome.ERROR)
B3 = ("b0", "b1", "b2")


def metadata(e: int = 3, qw: int = 3, qa: int = 2,
             ensembles: tuple = ((0, B3),)) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=9, ensemble_size=e, write_quorum=qw, ack_quorum=qa,
                          ensembles=ensembles, state=LedgerState.IN_RECOVERY)


def entry(entry_id: int, lac: int = -1) -> EntryData:
    payload = f"entry-{entry_id}".encode()
    return EntryData(entry_id, lac, 10 * (entry_id + 1), payload)


def reads(actions: list) -> list[tuple[str, int, bool]]:
    return [(a.bookie, a.entry_id, a.fence) for a in actions if isinstance(a, SendRead)]


def fenced(core: LedgerRecoveryCore, lacs: dict[str, int]) -> list:
    actions = core.start()
    out: list = []
    for bookie, lac in lacs.items():
        out = core.on_read_lac(bookie, LacOutcome.OK if lac >= 0 else LacOutcome.NO_SUCH_LEDGER, lac)
    assert core.phase is RecoveryPhase.READING, actions
    return out


def test_fences_the_last_fragment_and_waits_for_a_covering_quorum():
    core = LedgerRecoveryCore(metadata(), read_ahead_max=1)
    assert core.start() == [SendReadLac(b, fence=True) for b in B3]
    assert core.on_read_lac("b0", LacOutcome.OK, 3) == []
    assert core.on_read_lac("b1", LacOutcome.ERROR) == []           # errors do not count
    actions = core.on_read_lac("b2", LacOutcome.NO_SUCH_LEDGER)     # (Qw - Qa) + 1 = 2 answered
    assert core.lac == 3 and core.first_entry_to_read == 4
    assert sorted(reads(actions)) == [(b, 4, True) for b in B3]     # reads carry the fence flag


def test_fencing_fails_when_too_many_bookies_are_unreachable():
    core = LedgerRecoveryCore(metadata())
    core.start()
    core.on_read_lac("b0", LacOutcome.OK, 1)
    core.on_read_lac("b1", LacOutcome.ERROR)
    actions = core.on_read_lac("b2", LacOutcome.ERROR)
    assert len(actions) == 1 and isinstance(actions[0], RecoveryFailed)
    assert actions[0].error.retriable


def test_recovery_of_an_empty_ledger_closes_at_minus_one():
    core = LedgerRecoveryCore(metadata())
    actions = fenced(core, {"b0": -1, "b1": -1})
    assert {a.entry_id for a in actions} == {0, 1, 2, 3}            # read ahead 4
    assert core.on_read("b0", 0, NO_LEDGER) == []
    actions = core.on_read("b2", 0, NO_ENTRY)
    assert len(actions) == 1 and isinstance(actions[0], WriteMetadata)
    closed = actions[0].metadata
    assert closed.state is LedgerState.CLOSED and closed.last_entry_id == -1 and closed.length == 0
    assert core.on_metadata_written(closed) == [RecoveryDone(closed)]
    assert core.phase is RecoveryPhase.DONE


def test_found_entries_are_rewritten_with_quorum_before_closing():
    core = LedgerRecoveryCore(metadata(), read_ahead_max=1)
    fenced(core, {"b0": 0, "b1": 0})
    e1 = entry(1, lac=0)
    actions = core.on_read("b1", 1, FOUND, e1)
    write_set_1 = metadata().write_set(1)
    assert [a for a in actions if isinstance(a, SendAdd)] == [
        SendAdd(b, 1, 0, e1.length, e1.payload, recovery=True) for b in write_set_1]
    assert sorted(reads(actions)) == [(b, 2, True) for b in B3]    # the next entry is read meanwhile
    assert core.on_read("b0", 1, NO_ENTRY) == []                    # decided already
    core.on_read("b0", 2, NO_ENTRY)
    assert core.on_read("b2", 2, NO_ENTRY) == []                    # entry 2 missing, but entry 1
    assert core.on_add_result("b0", 1, AddOutcome.OK) == []         # has no Qa acks yet
    actions = core.on_add_result("b2", 1, AddOutcome.OK)
    closed = actions[0].metadata
    assert closed.last_entry_id == 1 and closed.length == e1.length


def test_read_ahead_decides_in_entry_order():
    core = LedgerRecoveryCore(metadata(), read_ahead_max=3)
    actions = fenced(core, {"b0": -1, "b1": -1})
    assert sorted({a.entry_id for a in actions}) == [0, 1, 2]
    # entry 1 is known missing before entry 0 is found: nothing written beyond, no close yet
    assert core.on_read("b0", 1, NO_ENTRY) == [] and core.on_read("b1", 1, NO_ENTRY) == []
    e0 = entry(0)
    actions = core.on_read("b2", 0, FOUND, e0)
    assert [type(a) for a in actions] == [SendAdd] * 3
    assert core.on_read("b0", 2, FOUND, entry(2)) == []             # beyond the end: ignored
    assert core.on_add_result("b0", 0, AddOutcome.OK) == []
    actions = core.on_add_result("b1", 0, AddOutcome.OK)
    assert len(actions) == 1 and actions[0].metadata.last_entry_id == 0
    assert actions[0].metadata.length == e0.length


def test_nothing_found_past_the_lac_reads_the_lac_entry_for_its_length():
    core = LedgerRecoveryCore(metadata(), read_ahead_max=1)
    fenced(core, {"b0": 5, "b1": 4})
    core.on_read("b0", 6, NO_ENTRY)
    actions = core.on_read("b1", 6, NO_ENTRY)
    assert core.phase is RecoveryPhase.READING_LENGTH
    assert reads(actions) == [("b2", 5, True), ("b0", 5, True), ("b1", 5, True)]
    assert core.on_read("b2", 5, NO_ENTRY) == []
    actions = core.on_read("b0", 5, FOUND, entry(5, lac=4))
    closed = actions[0].metadata
    assert closed.last_entry_id == 5 and closed.length == entry(5).length


def test_fix_2_reads_only_the_last_fragment():
    md = metadata(ensembles=((0, B3), (10, ("b0", "b3", "b2"))))
    core = LedgerRecoveryCore(md, read_ahead_max=1)
    actions = core.start()
    assert [a.bookie for a in actions] == ["b0", "b3", "b2"]
    core.on_read_lac("b3", LacOutcome.OK, 3)                        # LAC known below the fragment
    actions = core.on_read_lac("b2", LacOutcome.NO_SUCH_LEDGER)
    assert core.first_entry_to_read == 10                           # not 4
    assert reads(actions) == [("b3", 10, True), ("b2", 10, True), ("b0", 10, True)]
    core.on_read("b3", 10, NO_ENTRY)
    actions = core.on_read("b2", 10, NO_LEDGER)
    assert reads(actions) == [("b0", 9, True), ("b1", 9, True), ("b2", 9, True)]   # old fragment
    actions = core.on_read("b1", 9, FOUND, entry(9))
    assert actions[0].metadata.last_entry_id == 9


def test_fence_flag_on_reads_can_be_switched_off():
    core = LedgerRecoveryCore(metadata(), fence_recovery_reads=False, read_ahead_max=1)
    actions = fenced(core, {"b0": -1, "b1": -1})
    assert reads(actions) == [(b, 0, False) for b in B3]


def test_not_enough_missing_answers_is_undecidable():
    core = LedgerRecoveryCore(metadata(), read_ahead_max=1)
    fenced(core, {"b0": -1, "b1": -1})
    core.on_read("b0", 0, NO_ENTRY)
    core.on_read("b1", 0, RERR)
    actions = core.on_read("b2", 0, RERR)
    assert len(actions) == 1 and isinstance(actions[0], RecoveryFailed)
    assert actions[0].error.retriable and core.phase is RecoveryPhase.FAILED
    assert core.on_read("b2", 1, NO_ENTRY) == []


def test_rewrite_without_ack_quorum_fails():
    core = LedgerRecoveryCore(metadata(), read_ahead_max=1)
    fenced(core, {"b0": -1, "b1": -1})
    core.on_read("b0", 0, FOUND, entry(0))
    assert core.on_add_result("b0", 0, AddOutcome.ERROR) == []      # Qw - Qa = 1 may fail
    actions = core.on_add_result("b1", 0, AddOutcome.ERROR)
    assert isinstance(actions[0], RecoveryFailed)


def test_qw_equals_qa_needs_one_missing_answer():
    core = LedgerRecoveryCore(metadata(e=3, qw=2, qa=2), read_ahead_max=1)
    core.start()
    core.on_read_lac("b0", LacOutcome.OK, -1)
    actions = core.on_read_lac("b1", LacOutcome.OK, -1)             # covers {0,1},{1,2},{2,0}
    assert reads(actions) == [("b0", 0, True), ("b1", 0, True)]
    actions = core.on_read("b1", 0, NO_ENTRY)
    assert actions[0].metadata.last_entry_id == -1


def test_conflict_with_a_closed_ledger_accepts_its_result():
    core = LedgerRecoveryCore(metadata())
    fenced(core, {"b0": -1, "b1": -1})
    core.on_read("b0", 0, NO_ENTRY)
    ours = core.on_read("b1", 0, NO_ENTRY)[0].metadata
    theirs = metadata().with_state(LedgerState.CLOSED, last_entry_id=0, length=10)
    assert core.on_metadata_conflict(theirs) == [RecoveryDone(theirs)]
    assert ours != theirs


def test_conflict_still_in_recovery_retries_the_close():
    core = LedgerRecoveryCore(metadata(), metadata_attempts_max=1)
    fenced(core, {"b0": -1, "b1": -1})
    core.on_read("b0", 0, NO_ENTRY)
    core.on_read("b1", 0, NO_ENTRY)
    current = metadata()
    actions = core.on_metadata_conflict(current)
    assert isinstance(actions[0], WriteMetadata) and actions[0].metadata.last_entry_id == -1
    actions = core.on_metadata_conflict(current)
    assert isinstance(actions[0], RecoveryFailed)


def test_rejects_open_metadata():
    with pytest.raises(InvariantViolation):
        LedgerRecoveryCore(metadata().__class__(
            ledger_id=1, ensemble_size=3, write_quorum=3, ack_quorum=2, ensembles=((0, B3),)))
