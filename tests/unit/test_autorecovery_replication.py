"""The replication core (pure): copy plans run against a fake in-memory set of bookies."""

from __future__ import annotations

import collections
import dataclasses
import random

import pytest
from hypothesis import given, settings, strategies as st

from bookie.autorecovery.replication_core import (CopyDone, CopyFailed, FragmentCopy,
                                                  ReadEntry, ReadRange, ReplicaRejected, RepairConflict,
                                                  StoredEntry, Throttle, WriteEntry, apply_repair,
                                                  plan_repairs)
from bookie.client.metadata import LedgerMetadata, LedgerState, write_set_indices
from pulsarlite.checksum import entry_checksum

B = [f"10.0.0.{i}:3181" for i in range(8)]


def entry(lid, eid, payload=None):
    payload = payload if payload is not None else f"payload-{lid}-{eid}".encode()
    length = 100 * (eid + 1)
    return StoredEntry(lid, eid, eid - 1, length, payload, entry_checksum(lid, eid, eid - 1, length, payload))


class FakeBookies:
    """Bookies as dicts (unit tests of the pure core only; integration tests use real ones)."""

    def __init__(self, range_answer_entries_max: int = 1_000) -> None:
        self.stored: dict[str, dict[tuple[int, int], StoredEntry]] = collections.defaultdict(dict)
        self.down: set[str] = set()
        self.reads: list[tuple[int, str]] = []
        self.range_answer_entries_max = range_answer_entries_max   # truncates range answers

    def read_range(self, bookie: str, lid: int, first: int, last: int) -> list[StoredEntry] | None:
        """As a bookie: None if down or without the ledger, else the stored prefix of first..last."""
        if bookie in self.down or not any(k[0] == lid for k in self.stored[bookie]):
            return None
        out = []
        for e in range(first, last + 1):
            got = self.stored[bookie].get((lid, e))
            if got is None or len(out) >= self.range_answer_entries_max:
                break
            out.append(got)
        return out

    def write_ledger(self, md: LedgerMetadata, last: int) -> None:
        for e in range(last + 1):
            for b in md.write_set(e):
                self.stored[b][(md.ledger_id, e)] = entry(md.ledger_id, e)

    def holds(self, bookie: str, lid: int, eid: int) -> bool:
        return bookie not in self.down and (lid, eid) in self.stored[bookie]

    def rot(self, bookie: str, lid: int, eid: int) -> StoredEntry:
        """Replace ``bookie``'s copy of the entry by one failing its checksum; returns the copy
        it held."""
        held = self.stored[bookie][(lid, eid)]
        self.stored[bookie][(lid, eid)] = StoredEntry(lid, eid, held.lac, held.length, b"rotten", held.checksum)
        return held


def run_copy(copy: FragmentCopy, bookies: FakeBookies, *, steps_max: int | None = None):
    """Execute the core's actions FIFO; stops after ``steps_max`` actions (a crash). Returns
    (terminal action or None, max entries in flight seen, actions seen)."""
    queue = collections.deque(copy.start())
    seen = []
    in_flight_max = 0
    steps = 0
    while queue:
        if steps_max is not None and steps >= steps_max:
            return None, in_flight_max, seen
        steps += 1
        a = queue.popleft()
        seen.append(a)
        in_flight_max = max(in_flight_max, len(copy._in_flight))
        if isinstance(a, (CopyDone, CopyFailed)):
            return a, in_flight_max, seen
        if isinstance(a, ReadRange):
            for e in range(a.first, a.last + 1):
                bookies.reads.append((e, a.bookie))
            queue.extend(copy.on_read_range(a.first, a.last, a.bookie,
                                            bookies.read_range(a.bookie, copy.repair.ledger_id, a.first, a.last)))
        elif isinstance(a, ReadEntry):
            bookies.reads.append((a.entry_id, a.bookie))
            got = None if a.bookie in bookies.down else bookies.stored[a.bookie].get((copy.repair.ledger_id, a.entry_id))
            queue.extend(copy.on_read(a.entry_id, a.bookie, got, "" if got else "NO_SUCH_ENTRY"))
        elif isinstance(a, WriteEntry):
            if a.bookie in bookies.down:
                queue.extend(copy.on_written(a.entry, False, "UNAVAILABLE"))
            else:
                bookies.stored[a.bookie][(a.entry.ledger_id, a.entry.entry_id)] = a.entry
                queue.extend(copy.on_written(a.entry, True))
    return None, in_flight_max, seen


def check_every_named_replica_holds_its_entries(md: LedgerMetadata, bookies: FakeBookies, lost) -> None:
    """Invariant 10: every bookie the metadata names for an entry (outside the lost ones not yet
    repaired) holds that entry."""
    for e in range(md.last_entry_id + 1):
        for b in md.write_set(e):
            if b in lost:
                continue
            assert (md.ledger_id, e) in bookies.stored[b], (e, b, md.ensembles)


def closed(lid, *ensembles, last, e=3, w=2, a=2, urb=()):
    return LedgerMetadata(ledger_id=lid, ensemble_size=e, write_quorum=w, ack_quorum=a,
                          ensembles=tuple((f, tuple(bs)) for f, bs in ensembles), state=LedgerState.CLOSED,
                          last_entry_id=last, length=100 * (last + 1), under_replicated_bookies=tuple(urb))


def repair_all(md, lost, bookies, writable, rng, window=4, run=1):
    repairs, blocked = plan_repairs(md, lost, writable, rng)
    for r in repairs:
        done, in_flight_max, _ = run_copy(FragmentCopy(r, window, run), bookies)
        assert isinstance(done, CopyDone), done
        assert in_flight_max <= window
        md = apply_repair(md, r)
        check_every_named_replica_holds_its_entries(md, bookies, lost)
    return md, blocked


def test_a_closed_ledger_is_moved_off_a_lost_bookie_fragment_by_fragment():
    md = closed(1, (0, B[0:3]), (20, [B[0], B[3], B[1]]), last=39)
    bookies = FakeBookies()
    bookies.write_ledger(md, 39)
    bookies.down.add(B[1])
    repaired, blocked = repair_all(md, {B[1]}, bookies, B[:6], random.Random(1))
    assert blocked == []
    assert B[1] not in repaired.all_bookies()
    assert [f for f, _ in repaired.ensembles] == [0, 20]
    for (f, old), (_, new) in zip(md.ensembles, repaired.ensembles):
        assert [b for b in old if b != B[1]] == [b for b in new if b in old]   # same indices kept
        assert old.index(B[1]) == [i for i, b in enumerate(new) if b not in old][0]
    assert all(b != B[1] for _, b in bookies.reads)         # never read from the lost bookie


def test_only_entries_whose_write_set_holds_the_lost_bookie_are_copied():
    md = closed(2, (0, B[0:3]), last=8)        # E3 Qw2: index 1 holds entries with e%3 in {0, 1}
    repairs, _ = plan_repairs(md, {B[1]}, B[:5], random.Random(0))
    (r,) = repairs
    assert r.entries == tuple(e for e in range(9) if 1 in write_set_indices(3, 2, e)) == (0, 1, 3, 4, 6, 7)
    assert all(B[1] not in srcs and len(srcs) == 1 for srcs in r.sources.values())


def test_a_crash_mid_copy_leaves_the_metadata_unchanged_and_a_retry_finishes():
    md = closed(3, (0, B[0:3]), last=29, w=3)
    bookies = FakeBookies()
    bookies.write_ledger(md, 29)
    bookies.down.add(B[2])
    (r,), _ = plan_repairs(md, {B[2]}, B[:5], random.Random(7))
    done, _, _ = run_copy(FragmentCopy(r, 3), bookies, steps_max=17)
    assert done is None                 # crashed: nothing proposed, the metadata still names B[2]
    copied = sum(1 for k in bookies.stored[r.replacement] if k[0] == 3)
    assert 0 < copied < 30
    # the worker that retries may choose another replacement; the ledger ends whole
    repaired, _ = repair_all(md, {B[2]}, bookies, B[:5], random.Random(8))
    assert B[2] not in repaired.all_bookies()


def test_a_replica_failing_its_checksum_is_never_used():
    md = closed(4, (0, B[0:3]), last=5, w=3)
    bookies = FakeBookies()
    bookies.write_ledger(md, 5)
    bookies.down.add(B[0])
    (r,), _ = plan_repairs(md, {B[0]}, B[:5], random.Random(3))
    bad_source = r.sources[2][0]
    good = bookies.rot(bad_source, 4, 2)
    done, _, seen = run_copy(FragmentCopy(r, 2), bookies)
    assert isinstance(done, CopyDone)
    assert ReplicaRejected(2, bad_source, "checksum mismatch") in seen
    assert bookies.stored[r.replacement][(4, 2)] == good
    # every replica bad: the copy fails, nothing is proposed
    for b in r.sources[2]:
        bookies.rot(b, 4, 2)
    done, _, _ = run_copy(FragmentCopy(r, 2), bookies)
    assert isinstance(done, CopyFailed) and "entry 2" in done.reason


def test_no_replacement_available_leaves_the_fragment_blocked_with_a_reason():
    md = closed(5, (0, B[0:3]), last=9)
    repairs, blocked = plan_repairs(md, {B[1]}, B[0:3], random.Random(0))
    assert repairs == []
    assert len(blocked) == 1 and "no writable bookie" in blocked[0].reason and blocked[0].lost_bookie == B[1]


def test_a_concurrent_metadata_change_makes_the_repair_re_plan():
    md = closed(6, (0, B[0:3]), last=9)
    bookies = FakeBookies()
    bookies.write_ledger(md, 9)
    (r,), _ = plan_repairs(md, {B[1]}, B[:4], random.Random(0))
    assert r.replacement == B[3]
    run_copy(FragmentCopy(r, 4), bookies)
    # another worker (or an operator) moved the fragment meanwhile
    moved = dataclasses.replace(md, ensembles=((0, (B[0], B[4], B[2])),))
    with pytest.raises(RepairConflict):
        apply_repair(moved, r)
    assert plan_repairs(moved, {B[1]}, B[:5], random.Random(0)) == ([], [])


def test_the_replacement_refusing_an_entry_fails_the_copy():
    md = closed(7, (0, B[0:3]), last=9)
    bookies = FakeBookies()
    bookies.write_ledger(md, 9)
    (r,), _ = plan_repairs(md, {B[1]}, B[:4], random.Random(0))
    bookies.down.add(r.replacement)
    done, _, _ = run_copy(FragmentCopy(r, 4), bookies)
    assert isinstance(done, CopyFailed) and r.replacement in done.reason


def test_open_ledgers_repair_only_fragments_before_the_last():
    md = LedgerMetadata(ledger_id=8, ensemble_size=3, write_quorum=2, ack_quorum=2,
                        ensembles=((0, tuple(B[0:3])), (10, (B[0], B[1], B[3]))))
    repairs, blocked = plan_repairs(md, {B[1]}, B[:6], random.Random(0))
    assert [(r.fragment_first, r.fragment_last) for r in repairs] == [(0, 9)]
    assert [(u.fragment_first, u.lost_bookie) for u in blocked] == [(10, B[1])]
    in_recovery = md.with_state(LedgerState.IN_RECOVERY)
    none, blocked = plan_repairs(in_recovery, {B[1]}, B[:6], random.Random(0))
    assert none == [] and blocked and "recovery" in blocked[0].reason
    # closing the ledger after the copy of an earlier fragment keeps that repair valid
    closed_md = md.with_state(LedgerState.CLOSED, last_entry_id=15, length=1600)
    assert B[1] not in apply_repair(closed_md, repairs[0]).ensembles[0][1]


def test_a_closed_ledgers_delayed_ensemble_change_is_repaired_and_cleared():
    md = closed(9, (0, B[0:3]), last=11, urb=[B[2]])
    bookies = FakeBookies()
    for e in range(12):                   # B[2] missed everything after entry 4
        for b in md.write_set(e):
            if b != B[2] or e <= 4:
                bookies.stored[b][(9, e)] = entry(9, e)
    repaired, _ = repair_all(md, {B[2]}, bookies, B[:5], random.Random(2))
    assert repaired.under_replicated_bookies == ()
    assert B[2] not in repaired.all_bookies()


def test_a_bookie_an_ensemble_change_replaced_leaves_the_delayed_list_once_its_old_fragment_moves():
    """CHAOS finding (seed 15, 3 bookies, lose_bookie): the writer kept a failed bookie with no
    replacement (delayed ensemble change), then replaced it by an ensemble change; the closed
    ledger's last fragment no longer names it, but under_replicated_bookies still did. Once
    the repair moves the older fragment off it, nothing names it: the field must not either,
    or the auditor marks the ledger again forever (and no repair can ever clear it)."""
    from bookie.autorecovery.replication_core import still_missing

    md = closed(11, (0, B[0:3]), (8, [B[0], B[1], B[3]]), last=11, urb=[B[2]])
    assert md.lacking_bookies() == {B[2]}
    bookies = FakeBookies()
    for e in range(12):
        for b in md.write_set(e):
            if b != B[2] or e <= 4:
                bookies.stored[b][(11, e)] = entry(11, e)
    repaired, blocked = repair_all(md, {B[2]}, bookies, [B[0], B[1], B[3], B[4]], random.Random(3))
    assert not blocked
    assert B[2] not in repaired.all_bookies()
    assert repaired.under_replicated_bookies == () and repaired.lacking_bookies() == frozenset()
    assert still_missing(repaired, {B[2]}) == frozenset()
    # a stale entry that no fragment names (whatever wrote it) lacks nothing: not marked again
    stale = dataclasses.replace(repaired, under_replicated_bookies=(B[2],))
    assert stale.lacking_bookies() == frozenset() and still_missing(stale, {B[2]}) == frozenset()


def test_an_empty_last_fragment_is_replaced_without_copying():
    md = closed(10, (0, B[0:3]), (5, [B[0], B[1], B[3]]), last=4)
    repairs, _ = plan_repairs(md, {B[1]}, B[:6], random.Random(0))
    empty = [r for r in repairs if r.fragment_first == 5]
    assert empty and empty[0].entries == ()
    assert FragmentCopy(empty[0], 4).start() == [CopyDone(empty[0], 0)]


def test_two_lost_bookies_of_one_fragment_get_distinct_replacements():
    md = closed(11, (0, B[0:5]), last=19, e=5, w=3, a=2)
    bookies = FakeBookies()
    bookies.write_ledger(md, 19)
    bookies.down |= {B[1], B[2]}
    repaired, _ = repair_all(md, {B[1], B[2]}, bookies, B[:8], random.Random(4))
    assert not {B[1], B[2]} & repaired.all_bookies()
    assert len(set(repaired.ensembles[0][1])) == 5


def test_racks_are_spread_where_possible():
    md = closed(12, (0, B[0:3]), last=2)
    racks = {B[0]: "r1", B[1]: "r2", B[2]: "r3", B[3]: "r1", B[4]: "r2", B[5]: "r4"}
    for seed in range(20):
        (r,), _ = plan_repairs(md, {B[2]}, B[:6], random.Random(seed), racks=racks)
        assert r.replacement == B[5]


def test_throttle_spaces_bytes_to_the_rate():
    t = Throttle(1000)
    assert t.delay_ms(1000, 0) == 0          # one second's burst
    assert t.delay_ms(500, 0) == pytest.approx(500)
    assert t.delay_ms(0, 2000) == 0
    assert t.delay_ms(1000, 2000) == 0


def test_entries_sharing_replicas_are_read_as_ranges_and_short_answers_are_finished():
    md = closed(14, (0, B[0:3]), last=49, w=3)        # Qw = E: every entry on every replica
    bookies = FakeBookies(range_answer_entries_max=3)
    bookies.write_ledger(md, 49)
    bookies.down.add(B[0])
    (r,), _ = plan_repairs(md, {B[0]}, B[:5], random.Random(0))
    done, in_flight_max, seen = run_copy(FragmentCopy(r, 16, 8), bookies)
    assert isinstance(done, CopyDone) and in_flight_max <= 16
    assert sum(isinstance(a, ReadRange) for a in seen) >= 50 // 3
    assert not any(isinstance(a, ReadEntry) for a in seen[:10])
    assert {e for (_, e) in bookies.stored[r.replacement]} == set(range(50))


def test_a_range_stops_at_a_bad_or_missing_copy_and_that_entry_comes_from_the_next_replica():
    md = closed(15, (0, B[0:3]), last=19, w=3)
    bookies = FakeBookies()
    bookies.write_ledger(md, 19)
    bookies.down.add(B[2])
    (r,), _ = plan_repairs(md, {B[2]}, B[:5], random.Random(0))
    first_source = r.sources[0][0]
    good = bookies.rot(first_source, 15, 7)
    del bookies.stored[first_source][(15, 12)]
    done, _, seen = run_copy(FragmentCopy(r, 20, 20), bookies)
    assert isinstance(done, CopyDone)
    assert ReplicaRejected(7, first_source, "checksum mismatch") in seen
    assert any(isinstance(a, ReplicaRejected) and a.entry_id == 12 for a in seen)
    assert bookies.stored[r.replacement][(15, 7)] == good
    assert (15, 12) in bookies.stored[r.replacement]
    # a replica without the ledger at all: the whole range goes to the next one
    for k in [k for k in bookies.stored[first_source] if k[0] == 15]:
        del bookies.stored[first_source][k]
    bookies.stored[r.replacement].clear()
    done, _, seen = run_copy(FragmentCopy(r, 20, 20), bookies)
    assert isinstance(done, CopyDone)
    assert sum(isinstance(a, ReadRange) and a.bookie == r.sources[0][1] for a in seen) >= 1


@settings(max_examples=100, deadline=None)
@given(st.integers(3, 6), st.data())
def test_property_crashes_at_any_point_never_point_metadata_at_a_bookie_lacking_entries(ensemble_size, data):
    w = data.draw(st.integers(2, ensemble_size))
    a = data.draw(st.integers(1, w))
    last = data.draw(st.integers(-1, 40))
    ensemble = B[:ensemble_size]
    md = closed(13, (0, ensemble), last=last, e=ensemble_size, w=w, a=a)
    bookies = FakeBookies()
    bookies.write_ledger(md, last)
    lost = {data.draw(st.sampled_from(ensemble))}
    bookies.down |= lost
    bookies.range_answer_entries_max = data.draw(st.integers(1, 10))
    rng = random.Random(data.draw(st.integers(0, 1000)))
    for attempt in range(3):       # crashing workers, each partway
        repairs, _ = plan_repairs(md, lost, B, rng)
        for r in repairs:
            crash = data.draw(st.one_of(st.none(), st.integers(0, 60)))
            done, _, _ = run_copy(FragmentCopy(r, data.draw(st.integers(1, 5)), data.draw(st.integers(1, 6))),
                                  bookies, steps_max=crash)
            if isinstance(done, CopyDone):
                md = apply_repair(md, r)
            check_every_named_replica_holds_its_entries(md, bookies, lost)
    repaired, _ = repair_all(md, lost, bookies, B, rng, run=data.draw(st.integers(1, 6)))
    assert not lost & repaired.all_bookies()
    check_every_named_replica_holds_its_entries(repaired, bookies, set())
    for e in range(last + 1):           # and the copies are the entries written, byte for byte
        for b in repaired.write_set(e):
            assert bookies.stored[b][(13, e)] == entry(13, e)
