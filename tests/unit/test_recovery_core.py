"""Unit tests of the pure ledger recovery core (bookie/client/recovery_core.py)."""

from __future__ import annotations

import random

import pytest

from bookie.client.actions import (AddOutcome, EntryData, LacOutcome, ReadOutcome, RecoveryDone,
                                   RecoveryFailed, SendAdd, SendRead, SendReadLac, WriteMetadata)
from bookie.client.metadata import LedgerMetadata, LedgerState
from bookie.client.recovery_core import LedgerRecoveryCore, RecoveryPhase
from pulsarlite.errors import InvariantViolation

FOUND, NO_ENTRY, NO_LEDGER, RERR = (ReadOutcome.FOUND, ReadOutcome.NO_SUCH_ENTRY,
                                    ReadOutcome.NO_SUCH_LEDGER, ReadOutcome.ERROR)
B3 = ("b0", "b1", "b2")
NO_SPARE: tuple[str, ...] = ()          # writable bookies outside the ensemble: none


def rng() -> random.Random:
    return random.Random(7)


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
    assert core.on_metadata_written(closed, NO_SPARE, rng()) == [RecoveryDone(closed)]
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
    assert core.on_add_result("b0", 1, AddOutcome.OK, NO_SPARE, rng()) == []         # has no Qa acks yet
    actions = core.on_add_result("b2", 1, AddOutcome.OK, NO_SPARE, rng())
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
    assert core.on_add_result("b0", 0, AddOutcome.OK, NO_SPARE, rng()) == []
    actions = core.on_add_result("b1", 0, AddOutcome.OK, NO_SPARE, rng())
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
    # the error names every bookie's answer (what an operator needs when it repeats)
    assert "answers: b0=NO_SUCH_ENTRY, b1=ERROR, b2=ERROR" in str(actions[0].error)
    assert core.on_read("b2", 1, NO_ENTRY) == []


def test_rewrite_without_ack_quorum_fails():
    core = LedgerRecoveryCore(metadata(), read_ahead_max=1)
    fenced(core, {"b0": -1, "b1": -1})
    core.on_read("b0", 0, FOUND, entry(0))
    assert core.on_add_result("b0", 0, AddOutcome.ERROR, NO_SPARE, rng()) == []      # Qw - Qa = 1 may fail
    actions = core.on_add_result("b1", 0, AddOutcome.ERROR, NO_SPARE, rng())
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
    assert core.on_metadata_conflict(theirs, NO_SPARE, rng()) == [RecoveryDone(theirs)]
    assert ours != theirs


def test_conflict_still_in_recovery_retries_the_close():
    core = LedgerRecoveryCore(metadata(), metadata_attempts_max=1)
    fenced(core, {"b0": -1, "b1": -1})
    core.on_read("b0", 0, NO_ENTRY)
    core.on_read("b1", 0, NO_ENTRY)
    current = metadata()
    actions = core.on_metadata_conflict(current, NO_SPARE, rng())
    assert isinstance(actions[0], WriteMetadata) and actions[0].metadata.last_entry_id == -1
    actions = core.on_metadata_conflict(current, NO_SPARE, rng())
    assert isinstance(actions[0], RecoveryFailed)


def test_rejects_open_metadata():
    with pytest.raises(InvariantViolation):
        LedgerRecoveryCore(metadata().__class__(
            ledger_id=1, ensemble_size=3, write_quorum=3, ack_quorum=2, ensembles=((0, B3),)))


# -- ensemble change during recovery (Qw == Qa, a bookie lost for good) ------------------------

B4 = ("b0", "b1", "b2", "b3")


def adds(actions: list) -> list[tuple[str, int]]:
    return sorted((a.bookie, a.entry_id) for a in actions if isinstance(a, SendAdd))


def metadata_writes(actions: list) -> list[LedgerMetadata]:
    return [a.metadata for a in actions if isinstance(a, WriteMetadata)]


def recovering_w2a2(read_ahead_max: int = 1, **kwargs) -> LedgerRecoveryCore:
    """E3 Qw2 Qa2 on b0 b1 b2, LAC 1: reading from entry 2 (write set b2 b0)."""
    core = LedgerRecoveryCore(metadata(qw=2, qa=2), read_ahead_max=read_ahead_max, **kwargs)
    core.start()
    core.on_read_lac("b0", LacOutcome.OK, 1)
    actions = core.on_read_lac("b1", LacOutcome.OK, 1)
    assert reads(actions)[:2] == [("b2", 2, True), ("b0", 2, True)]
    return core


def test_a_rewrite_failing_on_a_lost_bookie_replaces_it_from_that_entry_and_the_close_carries_it():
    core = recovering_w2a2()
    actions = core.on_read("b0", 2, FOUND, entry(2, lac=1))          # b2 is lost: no answer
    assert adds(actions) == [("b0", 2), ("b2", 2)]
    assert reads(actions) == [("b0", 3, True), ("b1", 3, True)]
    actions = core.on_read("b1", 3, FOUND, entry(3, lac=1))           # write set b0 b1
    assert adds(actions) == [("b0", 3), ("b1", 3)]
    core.on_read("b1", 4, NO_ENTRY)                                   # 4 (b1 b2) never acknowledged
    for bookie, entry_id in (("b0", 2), ("b0", 3), ("b1", 3)):
        assert core.on_add_result(bookie, entry_id, AddOutcome.OK, ["b3"], rng()) == []
    actions = core.on_add_result("b2", 2, AddOutcome.ERROR, ["b0", "b1", "b3"], rng())
    [proposal] = metadata_writes(actions)
    assert proposal.state is LedgerState.IN_RECOVERY
    # entries 0-1 (below the lowest re-write that holds b2) keep their fragment
    assert proposal.ensembles == ((0, B3), (2, ("b0", "b1", "b3")))
    assert proposal.writer_fragment == (0, B3)
    assert core.ensemble_change == (2, {"b2": "b3"})
    actions = core.on_metadata_written(proposal, ["b0", "b1", "b3"], rng())
    assert adds(actions) == [("b3", 2)]                               # entry 3 stays on b0 b1
    assert metadata_writes(actions) == []                             # no close before b3 holds 2
    assert core.on_add_result("b2", 2, AddOutcome.OK, ["b3"], rng()) == []   # replaced: ignored
    [closed] = metadata_writes(core.on_add_result("b3", 2, AddOutcome.OK, ["b3"], rng()))
    assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 3
    assert closed.ensembles == proposal.ensembles and closed.writer_fragment is None
    assert closed.write_set(2) == ("b3", "b0") and closed.write_set(1) == ("b1", "b2")
    assert core.on_metadata_written(closed, [], rng()) == [RecoveryDone(closed)]


def test_entries_already_rewritten_above_the_change_go_to_the_new_bookie_too():
    core = recovering_w2a2(read_ahead_max=3)
    core.on_read("b1", 4, FOUND, entry(4, lac=1))                     # write set b1 b2
    core.on_read("b0", 3, FOUND, entry(3, lac=1))
    core.on_read("b0", 2, FOUND, entry(2, lac=1))
    for bookie, entry_id in (("b1", 4), ("b2", 4), ("b0", 3), ("b1", 3), ("b0", 2)):
        core.on_add_result(bookie, entry_id, AddOutcome.OK, [], rng())     # 4 done with b2's ack
    [proposal] = metadata_writes(core.on_add_result("b2", 2, AddOutcome.ERROR, ["b3"], rng()))
    assert proposal.ensembles == ((0, B3), (2, ("b0", "b1", "b3")))
    actions = core.on_metadata_written(proposal, ["b3"], rng())
    # entry 4 had its Qa acks, but its write set now names b3: b3 must hold it
    assert adds(actions) == [("b3", 2), ("b3", 4)]


def test_a_later_recovery_fences_the_writers_fragment_and_ignores_a_replacements_no_such_entry():
    md = metadata(qw=2, qa=2).with_recovery_ensemble(2, ("b0", "b1", "b3"))
    core = LedgerRecoveryCore(md, read_ahead_max=1)
    assert [a.bookie for a in core.start()] == list(B3)              # the writer's bookies
    assert core.on_read_lac("b3", LacOutcome.OK, 5) == []            # not the writer's: ignored
    core.on_read_lac("b0", LacOutcome.OK, 3)
    actions = core.on_read_lac("b1", LacOutcome.OK, 3)
    assert core.first_entry_to_read == 2                              # the recovery fragment's start
    assert reads(actions) == [("b2", 2, True), ("b0", 2, True), ("b3", 2, True)]
    assert core.on_read("b3", 2, NO_LEDGER) == []                    # b3 may just lack it: undecided
    actions = core.on_read("b0", 2, FOUND, entry(2, lac=1))
    assert adds(actions) == [("b0", 2), ("b3", 2)]


def test_no_spare_bookie_is_a_retriable_failure():
    core = recovering_w2a2()
    core.on_read("b0", 2, FOUND, entry(2, lac=1))
    actions = core.on_add_result("b2", 2, AddOutcome.ERROR, ["b0", "b1", "b2"], rng())
    [failed] = actions
    assert isinstance(failed, RecoveryFailed) and failed.error.retriable
    assert "cannot replace ['b2']" in str(failed.error)
    assert core.phase is RecoveryPhase.FAILED


def test_without_ensemble_change_a_lost_bookie_fails_the_recovery():
    core = recovering_w2a2(change_ensemble=False)
    core.on_read("b0", 2, FOUND, entry(2, lac=1))
    [failed] = core.on_add_result("b2", 2, AddOutcome.ERROR, ["b3"], rng())
    assert isinstance(failed, RecoveryFailed) and "cannot re-replicate entry 2" in str(failed.error)


def test_ensemble_changes_are_bounded():
    core = recovering_w2a2(ensemble_change_attempts_max=1)
    core.on_read("b0", 2, FOUND, entry(2, lac=1))
    [proposal] = metadata_writes(core.on_add_result("b2", 2, AddOutcome.ERROR, ["b3", "b4"], rng()))
    actions = core.on_metadata_written(proposal, ["b3", "b4"], rng())
    new = proposal.write_set(2)[0]
    [failed] = core.on_add_result(new, 2, AddOutcome.ERROR, ["b3", "b4"], rng())
    assert isinstance(failed, RecoveryFailed) and "gave up after 1 ensemble changes" in str(failed.error)
    assert failed.error.retriable and adds(actions) == [(new, 2)]


def test_two_recoveries_racing_on_the_ensemble_change_converge():
    first, second = recovering_w2a2(), recovering_w2a2()
    for core in (first, second):
        core.on_read("b0", 2, FOUND, entry(2, lac=1))
        core.on_read("b1", 3, NO_ENTRY)
        core.on_add_result("b0", 2, AddOutcome.OK, [], rng())
    [theirs] = metadata_writes(first.on_add_result("b2", 2, AddOutcome.ERROR, ["b3"], rng()))
    [ours] = metadata_writes(second.on_add_result("b2", 2, AddOutcome.ERROR, ["b4"], rng()))
    assert theirs.ensembles != ours.ensembles
    first.on_metadata_written(theirs, ["b3"], rng())                  # the first CAS wins
    actions = second.on_metadata_conflict(theirs, ["b4"], rng())      # the second takes it over
    assert adds(actions) == [("b3", 2)] and metadata_writes(actions) == []
    [closed] = metadata_writes(second.on_add_result("b3", 2, AddOutcome.OK, ["b4"], rng()))
    assert closed.ensembles == theirs.ensembles and closed.last_entry_id == 2
    # the first one's close loses to it and accepts it
    [mine] = metadata_writes(first.on_add_result("b3", 2, AddOutcome.OK, [], rng()))
    assert mine.last_entry_id == 2
    assert first.on_metadata_conflict(closed, [], rng()) == [RecoveryDone(closed)]


def test_a_close_conflicting_with_an_ensemble_change_rewrites_to_the_new_bookie_first():
    core = recovering_w2a2()
    core.on_read("b0", 2, FOUND, entry(2, lac=1))
    core.on_read("b1", 3, NO_ENTRY)
    core.on_add_result("b0", 2, AddOutcome.OK, [], rng())
    [closing] = metadata_writes(core.on_add_result("b2", 2, AddOutcome.OK, [], rng()))
    assert closing.is_closed
    current = metadata(qw=2, qa=2).with_recovery_ensemble(2, ("b0", "b1", "b3"))   # another recovery
    actions = core.on_metadata_conflict(current, [], rng())
    assert adds(actions) == [("b3", 2)] and core.phase is RecoveryPhase.READING
    [closed] = metadata_writes(core.on_add_result("b3", 2, AddOutcome.OK, [], rng()))
    assert closed.ensembles == current.ensembles and closed.last_entry_id == 2


def test_a_conflict_with_a_recovery_fragment_below_this_recoverys_start_fails_retriably():
    core = recovering_w2a2()
    core.on_read("b0", 2, FOUND, entry(2, lac=1))
    core.on_read("b1", 3, NO_ENTRY)
    core.on_add_result("b0", 2, AddOutcome.OK, [], rng())
    core.on_add_result("b2", 2, AddOutcome.OK, [], rng())
    current = metadata(qw=2, qa=2).with_recovery_ensemble(1, ("b0", "b3", "b2"))
    [failed] = core.on_metadata_conflict(current, [], rng())
    assert isinstance(failed, RecoveryFailed) and failed.error.retriable
    assert "from entry 1" in str(failed.error)


def test_the_length_entry_is_read_from_any_replica_with_a_lost_bookie_in_its_write_set():
    md = metadata(qw=2, qa=2).with_recovery_ensemble(2, ("b0", "b1", "b3"))
    core = LedgerRecoveryCore(md, read_ahead_max=1)
    core.start()
    core.on_read_lac("b0", LacOutcome.OK, 2)
    core.on_read_lac("b1", LacOutcome.OK, 2)
    assert core.first_entry_to_read == 2
    core.on_read("b2", 2, RERR)
    actions = core.on_read("b0", 2, FOUND, entry(2, lac=1))          # the LAC entry: re-written
    for bookie in ("b0", "b3"):
        actions = core.on_add_result(bookie, 2, AddOutcome.OK, [], rng())
    assert metadata_writes(actions) == []                             # entry 3 not decided yet
    core.on_read("b0", 3, NO_ENTRY)
    # without a recovery fragment: the LAC entry, first to read - 1, in the writer's fragment
    core = LedgerRecoveryCore(metadata(qw=2, qa=2), read_ahead_max=1)
    core.start()
    core.on_read_lac("b0", LacOutcome.OK, 4)
    core.on_read_lac("b1", LacOutcome.OK, 4)
    actions = core.on_read("b2", 5, NO_ENTRY)                         # 5: b2 b0
    assert core.phase is RecoveryPhase.READING_LENGTH
    assert reads(actions) == [("b1", 4, True), ("b2", 4, True)]
    assert core.on_read("b2", 4, RERR) == []                          # lost
    [closing] = metadata_writes(core.on_read("b1", 4, FOUND, entry(4, lac=3)))
    assert closing.last_entry_id == 4 and closing.length == entry(4).length


def test_with_recovery_ensemble_splits_at_an_entry_and_drops_the_fragments_above():
    md = metadata(e=3, qw=2, qa=2, ensembles=((0, B3), (5, ("b0", "b3", "b2"))))
    with pytest.raises(InvariantViolation):
        md.with_recovery_ensemble(4, ("b4", "b1", "b2"))              # below the writer's fragment
    changed = md.with_recovery_ensemble(7, ("b0", "b3", "b1"))
    assert changed.ensembles == ((0, B3), (5, ("b0", "b3", "b2")), (7, ("b0", "b3", "b1")))
    assert changed.writer_fragment == (5, ("b0", "b3", "b2"))
    assert changed.recovery_fragments_first_entry == 7
    assert changed.recovery_read_view() == md
    again = changed.with_recovery_ensemble(6, ("b0", "b4", "b2"))
    assert again.ensembles == ((0, B3), (5, ("b0", "b3", "b2")), (6, ("b0", "b4", "b2")))
    assert again.writer_fragment == changed.writer_fragment
    assert again.recovery_fragments_first_entry == 6
    assert LedgerMetadata.from_json(again.to_json()) == again
    in_place = md.with_recovery_ensemble(5, ("b0", "b3", "b1"))
    assert in_place.ensembles == ((0, B3), (5, ("b0", "b3", "b1")))
    assert in_place.recovery_fragments_first_entry == 5
    assert in_place.recovery_read_view() == md
    assert in_place.with_state(LedgerState.CLOSED, writer_fragment=None).writer_fragment is None
    with pytest.raises(InvariantViolation):
        in_place.with_new_fragment(9, B3)                             # the writer's: OPEN only
    with pytest.raises(InvariantViolation):                           # only while IN_RECOVERY
        LedgerMetadata(ledger_id=1, ensemble_size=3, write_quorum=2, ack_quorum=2,
                       ensembles=((0, B3),), writer_fragment=(0, B3))
