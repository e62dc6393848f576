"""The auditor core (pure): which ledgers it marks under-replicated, and when."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from bookie.autorecovery.auditor_core import AuditorCore, BookieLost, MarkLedger
from bookie.autorecovery.layout import (UnderReplicatedMark, ledger_id_of_mark, mark_path, merge_mark)
from bookie.client.metadata import LedgerMetadata, LedgerState

B = [f"b{i}:3181" for i in range(6)]
DELAY = 1_000


def md(ledger_id, *ensembles, state=LedgerState.CLOSED, urb=(), e=3, w=2, a=2):
    return LedgerMetadata(ledger_id=ledger_id, ensemble_size=e, write_quorum=w, ack_quorum=a,
                          ensembles=tuple((first, tuple(bs)) for first, bs in ensembles),
                          state=state, last_entry_id=99 if state is LedgerState.CLOSED else -1,
                          under_replicated_bookies=tuple(urb))


def marks(actions):
    return {a.ledger_id: a.missing_bookies for a in actions if isinstance(a, MarkLedger)}


def test_nothing_is_marked_while_every_bookie_is_live():
    core = AuditorCore(DELAY)
    core.on_bookies(B[:5], [], 0)
    assert core.on_scan([md(1, (0, B[:3])), md(2, (0, B[2:5]))], {}, [], 0) == []
    assert core.on_tick(10 * DELAY) == []


def test_a_bookie_gone_longer_than_the_delay_marks_every_ledger_naming_it():
    core = AuditorCore(DELAY)
    core.on_bookies(B[:5], [], 0)
    ledgers = [md(1, (0, B[:3])), md(2, (0, B[2:5])), md(3, (0, B[3:6]), (10, [B[0], B[1], B[4]])),
               md(4, (0, [B[3], B[4], B[1]]))]
    core.on_scan(ledgers, {}, [], 0)
    # b5 never registered: missing from the first scan; b2 goes away at t=100
    assert core.on_bookies([b for b in B[:5] if b != B[2]], [], 100) == []
    assert core.on_tick(DELAY - 1) == []
    got = core.on_tick(DELAY)        # b5 (missing since 0) is lost, b2 not yet
    assert marks(got) == {3: (B[5],)}
    assert BookieLost(B[5], "lost", 1) in got
    got = core.on_tick(100 + DELAY)
    assert marks(got) == {1: (B[2],), 2: (B[2],)}
    assert core.on_tick(5 * DELAY) == []        # already marked: not again


def test_a_bookie_back_before_the_delay_cancels_its_marks():
    core = AuditorCore(DELAY)
    core.on_bookies(B[:3], [], 0)
    core.on_scan([md(1, (0, B[:3]))], {}, [], 0)
    core.on_bookies(B[:2], [], 10)
    assert core.next_deadline_ms() == 10 + DELAY
    assert core.on_bookies(B[:2], [B[2]], 500) == []     # back, read-only: still live
    assert core.on_tick(10 * DELAY) == []
    assert core.next_deadline_ms() is None
    core.on_bookies(B[:2], [], 20 * DELAY)               # gone again: the delay starts again
    assert core.on_tick(20 * DELAY + DELAY - 1) == []
    assert marks(core.on_tick(21 * DELAY)) == {1: (B[2],)}


def test_decommissioning_marks_at_once_even_while_live():
    core = AuditorCore(DELAY)
    core.on_bookies(B[:4], [], 0)
    got = core.on_scan([md(1, (0, B[:3])), md(2, (0, B[1:4]))], {}, [B[0]], 0)
    assert marks(got) == {1: (B[0],)}
    assert BookieLost(B[0], "decommissioning", 1) in got


def test_closed_ledgers_with_under_replicated_bookies_are_marked_open_ones_not():
    core = AuditorCore(DELAY)
    core.on_bookies(B[:5], [], 0)
    got = core.on_scan([md(1, (0, B[:3]), urb=[B[1]]),
                        md(2, (0, B[:3]), state=LedgerState.OPEN, urb=[B[1]])], {}, [], 0)
    assert marks(got) == {1: (B[1],)}


def test_an_under_replicated_bookie_no_fragment_names_is_not_marked():
    """(CHAOS finding, seed 15) an ensemble change and a repair moved the ledger off the
    bookie: the delayed-ensemble-change list still naming it must not mark the ledger
    (nothing could ever clear that mark)."""
    core = AuditorCore(DELAY)
    core.on_bookies(B[:5], [], 0)
    got = core.on_scan([md(1, (0, B[:3]), (5, [B[0], B[1], B[3]]), urb=[B[2]]),
                        md(2, (0, [B[0], B[1], B[4]]), (5, [B[0], B[1], B[3]]), urb=[B[2]])], {}, [], 0)
    assert marks(got) == {1: (B[2],)}


def test_existing_marks_are_not_repeated_and_a_failed_mark_is_retried():
    core = AuditorCore(0)
    core.on_bookies(B[1:5], [], 0)
    got = core.on_scan([md(1, (0, B[:3])), md(2, (0, [B[0], B[3], B[4]]))], {1: [B[0]]}, [], 0)
    assert marks(got) == {2: (B[0],)}
    core.on_mark_failed(2, [B[0]])
    assert marks(core.on_tick(1)) == {2: (B[0],)}


def test_marks_per_step_are_bounded():
    core = AuditorCore(0, marks_per_step_max=2)
    core.on_bookies(B[1:], [], 0)
    got = core.on_scan([md(i, (0, B[:3])) for i in range(5)], {}, [], 0)
    assert len(marks(got)) == 2
    assert len(marks(core.on_tick(1))) == 2
    assert len(marks(core.on_tick(2))) == 1
    assert marks(core.on_tick(3)) == {}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=30),
       st.lists(st.lists(st.integers(0, 5), min_size=3, max_size=3, unique=True), min_size=1, max_size=6),
       st.integers(0, 3000))
def test_property_marked_exactly_when_gone_longer_than_the_delay(flips, ensembles, delay):
    """Whatever registrations come and go (one step of 100 ms each), after the last step and
    one tick far in the future: a ledger's marks name exactly the bookies it names that were
    ever not live for a full delay (they stay marked) or are not live now."""
    core = AuditorCore(delay)
    live = set(B)
    core.on_bookies(sorted(live), [], 0)
    ledgers = [md(i, (0, [B[j] for j in ens])) for i, ens in enumerate(ensembles)]
    marked: dict[int, set[str]] = {}
    for a in core.on_scan(ledgers, {}, [], 0):
        if isinstance(a, MarkLedger):
            marked.setdefault(a.ledger_id, set()).update(a.missing_bookies)
    gone_since: dict[str, int] = {}
    expected_lost: set[str] = set()
    t = 0
    for index, up in flips:
        t += 100
        for a in core.on_tick(t):
            if isinstance(a, MarkLedger):
                marked.setdefault(a.ledger_id, set()).update(a.missing_bookies)
        for b, since in gone_since.items():
            if t - since >= delay:
                expected_lost.add(b)
        b = B[index]
        (live.add if up else live.discard)(b)
        if up:
            gone_since.pop(b, None)
        else:
            gone_since.setdefault(b, t)
        for a in core.on_bookies(sorted(live), [], t):
            if isinstance(a, MarkLedger):
                marked.setdefault(a.ledger_id, set()).update(a.missing_bookies)
        if delay == 0:
            expected_lost |= set(B) - live
    far = t + delay + 1
    for a in core.on_tick(far):
        if isinstance(a, MarkLedger):
            marked.setdefault(a.ledger_id, set()).update(a.missing_bookies)
    expected_lost |= set(B) - live
    for ledger in ledgers:
        want = ledger.all_bookies() & expected_lost
        assert marked.get(ledger.ledger_id, set()) == want, (ledger.ledger_id, want, marked)


def test_mark_paths_round_trip_and_marks_merge():
    for lid in (0, 1, 4096, 2 ** 40 + 7, 2 ** 63 - 1):
        assert ledger_id_of_mark(mark_path(lid)) == lid
    assert mark_path(1) == "/ledgers/underreplication/ledgers/0000/0000/0000/0001/urL0000000000000000001"
    first = merge_mark(None, 5, [B[2]], 100)
    merged = UnderReplicatedMark.from_json(merge_mark(first, 5, [B[0], B[2]], 200))
    assert merged == UnderReplicatedMark(5, (B[0], B[2]), 100)
    assert UnderReplicatedMark.from_json(merge_mark(b"junk", 5, [B[1]], 300)) == UnderReplicatedMark(5, (B[1],), 300)


def test_replica_check_probes_closed_ledgers_fragment_ends_on_every_replica():
    import random

    from bookie.autorecovery.auditor_core import ReplicaProbe, plan_replica_check

    ledgers = [md(1, (0, B[:3]), (10, [B[0], B[3], B[2]])),             # closed at 99
               md(2, (0, B[:3]), state=LedgerState.OPEN),
               md(3, (0, B[:3]), (200, B[3:6]))]                        # last fragment empty
    probes = plan_replica_check(ledgers, 2, 1_000, random.Random(0))
    assert {p.ledger_id for p in probes} == {1, 3}
    one = {(p.entry_id, p.bookie) for p in probes if p.ledger_id == 1}
    want = {(e, b) for e in (0, 9, 10, 99) for b in ledgers[0].write_set(e)}
    assert one == want
    assert all(p.entry_id <= 99 for p in probes if p.ledger_id == 3)
    more = plan_replica_check(ledgers, 5, 1_000, random.Random(0))
    assert len({p.entry_id for p in more if p.ledger_id == 1}) == 10     # 5 per fragment
    assert len(plan_replica_check(ledgers, 5, 7, random.Random(0))) == 7
    assert all(isinstance(p, ReplicaProbe) for p in more)


def unmarks(actions):
    from bookie.autorecovery.auditor_core import UnmarkBookies
    return {a.ledger_id: a.bookies for a in actions if isinstance(a, UnmarkBookies)}


def test_a_bookie_back_after_it_was_declared_lost_is_taken_out_of_the_marks_it_was_given():
    """A chaos run (session 20): a bookie's session expired for longer than the delay after a
    ZooKeeper restart on a loaded machine; it came back with its disks, but its marks stayed,
    so workers kept trying to move copies off a live bookie and, with no bookie outside the
    ensemble left, the repair of a really lost bookie in the same ledgers waited for ever."""
    core = AuditorCore(DELAY)
    core.on_bookies(B[:4], [], 0)
    ledgers = [md(1, (0, B[:3])),                              # names b0 (comes back) and b1 (lost)
               md(2, (0, [B[0], B[2], B[3]])),                 # names b0 only
               md(3, (0, [B[0], B[2], B[3]]), urb=[B[0]]),     # the metadata says b0 lacks entries
               md(4, (0, [B[2], B[3], B[1]]))]                 # names b1 only
    assert marks(core.on_scan(ledgers, {}, [], 0)) == {3: (B[0],)}    # lacking, by its metadata
    core.on_marked(3, (B[0],))
    core.on_bookies([B[2], B[3]], [], 10)                      # b0 and b1 gone
    got = core.on_tick(10 + DELAY)
    assert marks(got) == {1: (B[0], B[1]), 2: (B[0],), 4: (B[1],)}
    for a in got:
        if isinstance(a, MarkLedger):
            core.on_marked(a.ledger_id, a.missing_bookies)
    assert unmarks(got) == {}
    got = core.on_bookies([B[0], B[2], B[3]], [], 10 + 3 * DELAY)       # b0 is back, b1 is not
    # out of the marks of 1 and 2; 3 keeps b0 (its metadata says b0 lacks entries)
    assert unmarks(got) == {1: (B[0],), 2: (B[0],)} and marks(got) == {}
    core.on_unmarked_bookies(1, (B[0],), False)               # a CAS lost: tried again
    core.on_unmarked_bookies(2, (B[0],), True)
    assert unmarks(core.on_tick(10 + 4 * DELAY)) == {1: (B[0],)}
    core.on_unmarked_bookies(1, (B[0],), True)
    assert core.on_tick(10 + 5 * DELAY) == []
    # gone again for longer than the delay: marked again
    core.on_bookies([B[2], B[3]], [], 10 + 6 * DELAY)
    got = core.on_tick(10 + 8 * DELAY)
    assert marks(got) == {1: (B[0], B[1]), 2: (B[0],)} and unmarks(got) == {}


def test_a_decommissioned_bookie_stays_in_its_marks_while_live():
    core = AuditorCore(DELAY)
    core.on_bookies(B[:4], [], 0)
    got = core.on_scan([md(1, (0, B[:3]))], {}, [B[0]], 0)
    assert marks(got) == {1: (B[0],)} and BookieLost(B[0], "decommissioning", 1) in got
    core.on_marked(1, (B[0],))
    assert unmarks(core.on_tick(2 * DELAY)) == {}


def test_marks_say_which_bookies_were_lost_so_an_auditor_elected_later_unmarks_them_too():
    core = AuditorCore(DELAY)
    core.on_bookies(B[:4], [], 0)
    core.on_scan([md(1, (0, B[:3]))], {}, [B[2]], 0)           # b2 decommissioning
    core.on_bookies([B[1], B[2], B[3]], [], 10)                # b0 gone
    got = core.on_tick(10 + DELAY)
    assert [a for a in got if isinstance(a, MarkLedger)] == [MarkLedger(1, (B[0], B[2]), (B[0],))]
    data = merge_mark(None, 1, (B[0], B[2]), 5, (B[0],))
    mark = UnderReplicatedMark.from_json(data)
    assert mark.lost_bookies == (B[0],) and mark.missing_bookies == (B[0], B[2])
    # merged with a replica-check mark (not lost): the lost part is kept
    mark = UnderReplicatedMark.from_json(merge_mark(data, 1, (B[3],), 6))
    assert mark.missing_bookies == (B[0], B[2], B[3]) and mark.lost_bookies == (B[0],) and mark.ctime_ms == 5
    # a mark written before lost_bookies existed reads as none lost
    old = UnderReplicatedMark.from_json(b'{"ledger_id": 1, "missing_bookies": ["b0:3181"], "ctime_ms": 3}')
    assert old.lost_bookies == () and b"lost_bookies" not in old.to_json()

    # the auditor changes while b0 is away; b0 comes back: the new one unmarks it from the scan
    new = AuditorCore(DELAY)
    new.on_bookies(B[:4], [], 20 * DELAY)
    got = new.on_scan([md(1, (0, B[:3]))], {1: mark.missing_bookies}, [B[2]], 20 * DELAY,
                      {1: mark.lost_bookies})
    assert unmarks(got) == {1: (B[0],)}                 # not b2 (decommissioning), not b3 (a bad copy)
