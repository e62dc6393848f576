"""Unit and property tests of the pure ledger write core (bookie/client/write_core.py)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie.client.actions import (AddOutcome, CloseDone, CloseFailed, ConfirmAdds, FailAdds,
                                   SendAdd, SendAddRun, WriteMetadata)
from bookie.client.metadata import LedgerMetadata, LedgerState
from bookie.client.write_core import LedgerWriteCore, WriteCoreState
from pulsarlite.errors import (InvariantViolation, LedgerClosedError, LedgerFencedError,
                               MetadataError, NotEnoughBookiesError)

OK, ERROR, FENCED = AddOutcome.OK, AddOutcome.ERROR, AddOutcome.FENCED


def metadata(e: int = 3, qw: int = 3, qa: int = 2, bookies: tuple[str, ...] | None = None) -> LedgerMetadata:
    bookies = bookies or tuple(f"b{i}" for i in range(e))
    return LedgerMetadata(ledger_id=1, ensemble_size=e, write_quorum=qw, ack_quorum=qa,
                          ensembles=((0, bookies),))


def core(md: LedgerMetadata | None = None, **kwargs) -> LedgerWriteCore:
    kwargs.setdefault("add_timeout_ms", 1000)
    kwargs.setdefault("ensemble_change_attempts_max", 3)
    return LedgerWriteCore(md or metadata(), **kwargs)


RNG = random.Random(0)


def ack(c: LedgerWriteCore, bookie: str, entry_id: int, outcome: AddOutcome = OK,
        writable: tuple[str, ...] = ("b0", "b1", "b2")) -> list:
    return c.on_add_result(bookie, entry_id, outcome, 0, writable, RNG)



def expand(actions: list) -> list:
    """A SendAddRun as the SendAdds it stands for: entry by entry, the bookies in ensemble order."""
    out = []
    for a in actions:
        if type(a) is SendAddRun:
            per_entry: dict[int, list[str]] = {}
            for bookie, offsets in a.sends:
                for i in (range(len(a.payloads)) if offsets is None else offsets):
                    per_entry.setdefault(i, []).append(bookie)
            for i in sorted(per_entry):
                out += [SendAdd(b, a.first_entry_id + i, a.lac, a.lengths[i], a.payloads[i]) for b in per_entry[i]]
        else:
            out.append(a)
    return out


def add(c: LedgerWriteCore, payload: bytes, now_ms: int) -> tuple[int, list]:
    """One add (a run of one): its entry id and actions, sends expanded."""
    entry_id, actions = c.add([payload], now_ms)
    return entry_id, expand(actions)

def sends(actions: list) -> list[tuple[str, int]]:
    return [(a.bookie, a.entry_id) for a in actions if isinstance(a, SendAdd)]


def test_striping_and_running_length():
    c = core(metadata(e=3, qw=2, qa=2))
    e0, a0 = add(c, b"aaa", 0)
    e1, a1 = add(c, b"bb", 0)
    e2, a2 = add(c, b"c", 0)
    assert (e0, e1, e2) == (0, 1, 2)
    assert sends(a0) == [("b0", 0), ("b1", 0)]
    assert sends(a1) == [("b1", 1), ("b2", 1)]
    assert sends(a2) == [("b0", 2), ("b2", 2)]       # write set (b2, b0), sent in ensemble order
    assert [a.length for a in a0 + a1 + a2] == [3, 3, 5, 5, 6, 6]
    assert all(a.lac == -1 and not a.recovery for a in a0 + a1 + a2)
    assert c.last_add_pushed == 2 and c.pending_count == 3 and c.length == 6 and c.lac == -1


def test_confirm_needs_ack_quorum_and_every_lower_entry():
    c = core()
    add(c, b"x", 0)
    add(c, b"y", 0)
    assert ack(c, "b0", 1) == [] and ack(c, "b1", 1) == []      # entry 1 has Qa, entry 0 not
    assert ack(c, "b0", 0) == []
    assert c.lac == -1
    assert ack(c, "b2", 0) == [ConfirmAdds(1)]                   # both complete, in order
    assert c.lac == 1 and c.pending_count == 0 and c.lac_length == 2
    assert ack(c, "b1", 0) == []                                 # late ack: nothing
    _, actions = add(c, b"z", 0)
    assert {a.lac for a in actions} == {1}                       # LAC rides on the next entry


def test_duplicate_acks_do_not_count_twice():
    c = core()
    add(c, b"x", 0)
    assert ack(c, "b0", 0) == [] and ack(c, "b0", 0) == []
    assert c.lac == -1


def test_fenced_fails_every_pending_add_and_refuses_more():
    c = core()
    add(c, b"x", 0)
    add(c, b"y", 0)
    ack(c, "b0", 0)
    ack(c, "b1", 0)                                              # entry 0 confirmed
    actions = ack(c, "b2", 1, FENCED)
    assert len(actions) == 1 and isinstance(actions[0], FailAdds)
    assert actions[0].first_entry_id == 1 and isinstance(actions[0].error, LedgerFencedError)
    assert c.is_fenced and c.pending_count == 0 and c.lac == 0
    with pytest.raises(LedgerFencedError):
        add(c, b"z", 0)
    assert ack(c, "b0", 1) == []
    closed = c.close()
    assert len(closed) == 1 and isinstance(closed[0], CloseFailed)
    assert isinstance(closed[0].error, LedgerFencedError)


def test_ensemble_change_replaces_failed_bookie_from_lac_plus_one():
    c = core()
    writable = ("b0", "b1", "b2", "b3")
    add(c, b"x", 0)
    add(c, b"y", 0)
    ack(c, "b0", 0)
    ack(c, "b1", 0)                                              # LAC 0
    ack(c, "b0", 1)                                              # kept: b0 stays in the write set
    actions = ack(c, "b2", 1, ERROR, writable)
    assert len(actions) == 1 and isinstance(actions[0], WriteMetadata)
    proposed = actions[0].metadata
    assert proposed.ensembles == ((0, ("b0", "b1", "b2")), (1, ("b0", "b1", "b3")))
    assert proposed.state is LedgerState.OPEN
    # while the CAS is in flight, nothing goes to the new bookie
    _, actions = add(c, b"z", 0)
    assert sends(actions) == [("b0", 2), ("b1", 2)]
    actions = c.on_metadata_written(proposed, 0, writable, RNG)
    assert sorted(sends(actions)) == [("b3", 1), ("b3", 2)]      # b1 still has entry 1 in flight
    assert c.metadata == proposed
    assert ack(c, "b3", 1) == [ConfirmAdds(1)]                   # b0's earlier ack still counts



def test_an_ensemble_change_whose_cas_answer_was_lost_is_taken_as_written():
    """The CAS applied but its answer was lost: the shell reads the metadata back and reports a
    conflict with what is stored, which is our proposal. As written: the new bookie gets the
    entries it misses, the replaced one is usable again (it may be chosen later), and the
    attempt does not count toward ensemble_change_attempts_max."""
    lost, written = core(), core()
    writable = ("b0", "b1", "b2", "b3")
    for c in (lost, written):
        add(c, b"x", 0)
        add(c, b"y", 0)
        ack(c, "b0", 0)
        ack(c, "b1", 0)
        ack(c, "b0", 1)
    proposed = ack(lost, "b2", 1, ERROR, writable)[0].metadata
    assert ack(written, "b2", 1, ERROR, writable)[0].metadata == proposed
    got = lost.on_metadata_conflict(proposed, 0, writable, RNG)
    expected = written.on_metadata_written(proposed, 0, writable, RNG)
    assert got == expected and sorted(sends(got)) == [("b3", 1)]
    assert lost.metadata == proposed
    assert lost._unusable == written._unusable and "b2" not in lost._unusable
    assert lost._attempts == 0

def test_ack_of_replaced_bookie_is_dropped():
    c = core()
    writable = ("b0", "b1", "b2", "b3")
    add(c, b"x", 0)
    add(c, b"y", 0)
    ack(c, "b2", 0)                                              # b2 acked entry 0 ...
    actions = ack(c, "b2", 1, ERROR, writable)                   # ... then failed
    proposed = actions[0].metadata
    assert proposed.ensembles == ((0, ("b0", "b1", "b3")),)      # replaces the only fragment
    c.on_metadata_written(proposed, 0, writable, RNG)
    assert ack(c, "b0", 0) == []                                 # b2's ack is not in the write set
    assert ack(c, "b3", 0) == [ConfirmAdds(0)]


def test_delayed_ensemble_change_records_under_replication():
    c = core()                                                   # 3 bookies, E=3: no spare
    add(c, b"x", 0)
    actions = ack(c, "b2", 0, ERROR)
    assert len(actions) == 1 and isinstance(actions[0], WriteMetadata)
    proposed = actions[0].metadata
    assert proposed.ensembles == c.metadata.ensembles
    assert proposed.under_replicated_bookies == ("b2",)
    assert ack(c, "b0", 0) == []
    assert ack(c, "b1", 0) == [ConfirmAdds(0)]                   # Qa of the write set suffices
    assert c.on_metadata_written(proposed, 0, ("b0", "b1"), RNG) == []
    _, actions = add(c, b"y", 0)
    assert sorted(sends(actions)) == [("b0", 1), ("b1", 1)]      # not to the failed bookie
    # a new bookie shows up: the tick replaces b2
    actions = c.on_tick(1, ("b0", "b1", "b3"), RNG)
    assert len(actions) == 1 and isinstance(actions[0], WriteMetadata)
    assert actions[0].metadata.ensembles[-1] == (1, ("b0", "b1", "b3"))
    assert actions[0].metadata.under_replicated_bookies == ("b2",)


def test_adds_wait_then_time_out_with_not_enough_bookies():
    c = core(add_timeout_ms=100)
    add(c, b"x", 0)
    ack(c, "b2", 0, ERROR)
    ack(c, "b1", 0, ERROR)                                       # one usable bookie left
    ack(c, "b0", 0)
    assert c.lac == -1
    assert c.on_tick(50, ("b0",), RNG) == []
    actions = c.on_tick(100, ("b0",), RNG)
    assert len(actions) == 1 and isinstance(actions[0], FailAdds)
    assert isinstance(actions[0].error, NotEnoughBookiesError) and actions[0].error.retriable
    with pytest.raises(NotEnoughBookiesError):                   # a ledger is an ordered log
        add(c, b"y", 200)


def test_conflict_with_a_recovered_ledger_fails_adds_fenced():
    c = core()
    writable = ("b0", "b1", "b2", "b3")
    add(c, b"x", 0)
    proposed = ack(c, "b2", 0, ERROR, writable)[0].metadata
    current = c.metadata.with_state(LedgerState.IN_RECOVERY)
    actions = c.on_metadata_conflict(current, 0, writable, RNG)
    assert len(actions) == 1 and isinstance(actions[0].error, LedgerFencedError)
    assert proposed != current and c.is_fenced


def test_conflict_with_an_open_ledger_rebases_then_gives_up():
    c = core(ensemble_change_attempts_max=2)
    writable = ("b0", "b1", "b2", "b3")
    add(c, b"x", 0)
    ack(c, "b2", 0, ERROR, writable)
    current = replace(c.metadata, custom={"owner": "someone"})
    for _ in range(2):
        actions = c.on_metadata_conflict(current, 0, writable, RNG)
        assert isinstance(actions[0], WriteMetadata)
        assert actions[0].metadata.custom == {"owner": "someone"}
        assert actions[0].metadata.ensembles[-1][1] == ("b0", "b1", "b3")
    actions = c.on_metadata_conflict(current, 0, writable, RNG)
    assert len(actions) == 1 and isinstance(actions[0].error, MetadataError)


def test_close_at_lac():
    c = core()
    add(c, b"abc", 0)
    ack(c, "b0", 0)
    ack(c, "b1", 0)
    actions = c.close()
    assert len(actions) == 1 and isinstance(actions[0], WriteMetadata)
    closed = actions[0].metadata
    assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 0 and closed.length == 3
    assert c.on_metadata_written(closed, 0, (), RNG) == [CloseDone(closed)]
    assert c.state is WriteCoreState.CLOSED
    with pytest.raises(LedgerClosedError):
        add(c, b"more", 0)


def test_close_fails_pending_adds_first():
    c = core()
    add(c, b"abc", 0)
    ack(c, "b0", 0)
    ack(c, "b1", 0)
    add(c, b"de", 0)
    actions = c.close()
    assert isinstance(actions[0], FailAdds) and actions[0].first_entry_id == 1
    assert isinstance(actions[0].error, LedgerClosedError)
    assert actions[1].metadata.last_entry_id == 0 and actions[1].metadata.length == 3


def test_close_conflict_with_same_close_is_accepted():
    c = core()
    add(c, b"abc", 0)
    ack(c, "b0", 0)
    ack(c, "b1", 0)
    closed = c.close()[0].metadata
    assert c.on_metadata_conflict(closed, 0, (), RNG) == [CloseDone(closed)]


def test_close_waits_for_ensemble_change_in_flight():
    c = core()
    writable = ("b0", "b1", "b2", "b3")
    add(c, b"abc", 0)
    ack(c, "b0", 0)
    ack(c, "b1", 0)
    add(c, b"de", 0)
    proposed = ack(c, "b2", 1, ERROR, writable)[0].metadata
    actions = c.close()
    assert [type(a) for a in actions] == [FailAdds]
    actions = c.on_metadata_written(proposed, 0, writable, RNG)
    assert len(actions) == 1 and isinstance(actions[0], WriteMetadata)
    assert actions[0].metadata.state is LedgerState.CLOSED
    assert actions[0].metadata.ensembles == proposed.ensembles


def test_rejects_non_open_metadata():
    with pytest.raises(InvariantViolation):
        core(metadata().with_state(LedgerState.IN_RECOVERY))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_confirms_are_in_order_and_only_with_quorum(data):
    e = data.draw(st.integers(1, 5), label="E")
    qw = data.draw(st.integers(1, e), label="Qw")
    qa = data.draw(st.integers(1, qw), label="Qa")
    md = metadata(e=e, qw=qw, qa=qa)
    c = core(md)
    count = data.draw(st.integers(1, 12), label="entries")
    for _ in range(count):
        add(c, b"p", 0)
    acks = [(b, i) for i in range(count) for b in md.write_set(i)]
    order = data.draw(st.permutations(acks), label="ack order")
    order = order[:data.draw(st.integers(0, len(order)), label="acks delivered")]
    acked: dict[int, set[str]] = {i: set() for i in range(count)}
    lac = -1
    for bookie, entry_id in order:
        acked[entry_id].add(bookie)
        for action in ack(c, bookie, entry_id, OK, md.ensembles[0][1]):
            assert isinstance(action, ConfirmAdds)
            assert action.last_entry_id > lac                    # LAC never goes backwards
            assert all(len(acked[i]) >= qa for i in range(action.last_entry_id + 1))
            lac = action.last_entry_id
    expected = -1
    while expected + 1 < count and len(acked[expected + 1]) >= qa:
        expected += 1
    assert lac == expected == c.lac
    assert c.pending_count == count - 1 - expected



def test_metadata_gone_fails_pending_adds_and_refuses_more():
    """A CAS found the ledger deleted (a new owner recovered it empty and removed it): as a
    fence, pending adds fail and no add is taken again."""
    c = core()
    add(c, b"x", 0)
    actions = c.on_metadata_gone()
    assert [type(a) for a in actions] == [FailAdds]
    assert actions[0].first_entry_id == 0 and isinstance(actions[0].error, LedgerFencedError)
    with pytest.raises(LedgerFencedError):
        add(c, b"y", 0)


def test_metadata_gone_during_close_ends_the_close():
    """The close's CAS finds the ledger deleted: CloseFailed, the core finished (found by the
    whole publish path's simulation: the writer's close never returned)."""
    c = core()
    add(c, b"x", 0)
    assert any(isinstance(a, WriteMetadata) for a in c.close())
    assert c.state is WriteCoreState.CLOSING
    actions = c.on_metadata_gone()
    assert [type(a) for a in actions] == [CloseFailed]
    assert isinstance(actions[0].error, LedgerFencedError)
    assert c.state is WriteCoreState.CLOSED
    assert c.on_metadata_gone() == []
