"""The worker's pass over one ledger (``LedgerRepair``, pure), the reads it plans from marked
bookies, and rack-aware placement (``bookie/client/placement.py``)."""

from __future__ import annotations

import collections
import random

import pytest

from bookie.autorecovery.layout import UnderReplicatedMark
from bookie.autorecovery.replication_core import (CopyFragment, FragmentRecorded, LedgerRepair, ReadLedger,
                                                  ReadMark, ReleaseLock, RepairFinished, TakeLock, Unmark,
                                                  WriteLedger, next_retry_delay_ms, plan_repairs,
                                                  still_missing)
from bookie.client.metadata import LedgerMetadata, LedgerState
from bookie.client.placement import choose_ensemble, choose_replacements
from pulsarlite.errors import InvariantViolation, NotEnoughBookiesError

B = [f"b{i}" for i in range(8)]


def closed(lid, *ensembles, last, e=3, w=2, a=2, urb=()):
    return LedgerMetadata(ledger_id=lid, ensemble_size=e, write_quorum=w, ack_quorum=a,
                          ensembles=tuple((f, tuple(bs)) for f, bs in ensembles), state=LedgerState.CLOSED,
                          last_entry_id=last, length=10, under_replicated_bookies=tuple(urb))


def mark(lid, *bookies):
    return UnderReplicatedMark.of(lid, bookies, 5)


def only(actions, kind):
    found = [a for a in actions if isinstance(a, kind)]
    assert len(found) == 1, actions
    return found[0]


def test_a_pass_locks_reads_copies_records_unmarks_and_releases():
    md = closed(1, (0, B[0:3]), last=5)
    core = LedgerRepair(1, random.Random(1))
    assert core.start() == [TakeLock(1)]
    assert core.on_lock(True) == [ReadMark(1)]
    assert core.on_mark(mark(1, B[1]), 7) == [ReadLedger(1)]
    copy = only(core.on_ledger(md, 3, B[:5]), CopyFragment)
    assert copy.repair.lost_bookie == B[1] and copy.repair.replacement in B[3:5]
    assert core.on_copied(True, 100) == [ReadLedger(1)]          # fresh metadata to apply it to
    write = only(core.on_ledger(md, 4, B[:5]), WriteLedger)
    assert write.version == 4 and B[1] not in write.metadata.all_bookies()
    out = core.on_written(True)
    assert isinstance(out[0], FragmentRecorded) and out[1:] == [ReadLedger(1)]
    assert core.on_ledger(write.metadata, 5, B[:5]) == [Unmark(1, 7)]      # the mark's version
    assert core.on_unmarked(True) == [ReleaseLock(1), RepairFinished(1, True, "repaired: mark removed", True, 5)]


def test_nothing_is_written_before_the_copy_is_done_and_a_failed_copy_keeps_the_mark():
    md = closed(1, (0, B[0:3]), last=5)
    core = LedgerRepair(1, random.Random(1))
    core.start(), core.on_lock(True), core.on_mark(mark(1, B[1]), 0)
    only(core.on_ledger(md, 0, B[:5]), CopyFragment)
    out = core.on_copied(False)                 # a source failed: no write, the check decides
    assert out == [ReadLedger(1)]
    out = core.on_ledger(md, 0, B[:5])
    assert not any(isinstance(a, (WriteLedger, Unmark)) for a in out)
    assert out[-1].done is False and "still names b1" in out[-1].reason and isinstance(out[0], ReleaseLock)


def test_a_replacement_that_refuses_is_avoided_by_a_re_plan():
    md = closed(1, (0, B[0:3]), last=5)
    core = LedgerRepair(1, random.Random(1))
    core.start(), core.on_lock(True), core.on_mark(mark(1, B[1]), 0)
    first = only(core.on_ledger(md, 0, B[:5]), CopyFragment).repair.replacement
    assert core.on_copied(False, 0, replacement_failed=True) == [ReadLedger(1)]
    again = only(core.on_ledger(md, 0, B[:5]), CopyFragment).repair.replacement
    assert again != first


def test_a_locked_ledger_is_done_for_this_pass_and_a_changed_mark_is_not():
    core = LedgerRepair(1, random.Random(1))
    core.start()
    assert core.on_lock(False) == [RepairFinished(1, True, "locked by another worker")]
    core = LedgerRepair(1, random.Random(1))
    core.start(), core.on_lock(True), core.on_mark(mark(1, B[1]), 0)
    md = closed(1, (0, (B[0], B[2], B[3])), last=5)            # already moved off
    assert core.on_ledger(md, 0, B[:5]) == [ReadLedger(1)]       # plans nothing, goes to the check
    assert core.on_ledger(md, 0, B[:5]) == [Unmark(1, 0)]
    assert core.on_unmarked(False)[-1].done is False


def test_a_deleted_ledger_loses_its_mark_and_events_out_of_phase_raise():
    core = LedgerRepair(1, random.Random(1))
    core.start(), core.on_lock(True), core.on_mark(mark(1, B[1]), 2)
    assert core.on_ledger(None, -1, B) == [Unmark(1, 2)]
    with pytest.raises(InvariantViolation):
        core.on_copied(True)


def test_still_missing_counts_only_bookies_a_fragment_names():
    # an under-replicated bookie a fragment names is still missing; one no fragment names
    # (the ledger was moved off it) lacks nothing this ledger needs, whatever the list says
    md = closed(1, (0, B[0:3]), last=5, urb=[B[2]])
    assert still_missing(md, {B[2], B[6]}) == {B[2]}
    md = closed(1, (0, B[0:3]), last=5, urb=[B[5]])
    assert still_missing(md, {B[5], B[6]}) == frozenset()
    assert next_retry_delay_ms(0, 100, 1000) == 100 and next_retry_delay_ms(800, 100, 1000) == 1000


def test_live_marked_bookies_are_read_last_the_replaced_one_at_the_very_end():
    # Qw = E = 2: b0 and b1 each hold the only good copy of an entry the other lost
    md = closed(1, (0, B[0:2]), last=3, e=2, w=2)
    repairs, _ = plan_repairs(md, {B[0], B[1]}, B[:5], random.Random(1), readable=B[:5])
    by_lost = {r.lost_bookie: r for r in repairs}
    assert by_lost[B[0]].sources[0] == (B[1], B[0])
    repairs, _ = plan_repairs(md, {B[0], B[1]}, B[:5], random.Random(1), readable=[B[1]])
    assert {r.lost_bookie: r for r in repairs}[B[0]].sources[0] == (B[1],)      # b0 not live
    repairs, _ = plan_repairs(md, {B[0]}, B[:5], random.Random(1))
    assert repairs[0].sources[0] == (B[1],)


# -- placement -------------------------------------------------------------------------------------

RACKS = {B[0]: "r1", B[1]: "r1", B[2]: "r1", B[3]: "r2", B[4]: "r2", B[5]: "r3"}


def test_ensembles_spread_over_racks_where_possible():
    for seed in range(50):
        ens = choose_ensemble(B[:6], 3, random.Random(seed), RACKS)
        assert sorted(RACKS[b] for b in ens) == ["r1", "r2", "r3"]
        ens = choose_ensemble(B[:6], 5, random.Random(seed), RACKS)       # racks repeat evenly
        counts = collections.Counter(RACKS[b] for b in ens)
        assert max(counts.values()) - min(counts.values()) <= 1 or counts["r3"] == 1


def test_without_racks_placement_is_the_plain_sample_and_too_few_bookies_fail():
    assert choose_ensemble(B[:6], 3, random.Random(4)) == tuple(random.Random(4).sample(B[:6], 3))
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(B[:2], 3, random.Random(1), RACKS)
    # a bookie without a rack is never counted with another rack
    ens = choose_ensemble([B[0], B[1], B[7]], 2, random.Random(3), RACKS)
    assert B[7] in ens


def test_replacements_prefer_the_racks_the_staying_bookies_do_not_use():
    for seed in range(30):
        got = choose_replacements(B[:6], exclude={B[0], B[3]}, count=1, rng=random.Random(seed),
                                  racks=RACKS, keep=[B[0], B[3]])
        assert got == [B[5]]
