"""The pure cursor core: acks against a set model (hypothesis), mark-delete advance within and
across ledgers, cumulative acks, batch-index acks and the wire ack_set convention, the JSON form
and its bound on persisted ranges."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.cursor.core import (CursorConfig, CursorState, InvalidAckError, ack_set_to_indexes,
                                indexes_to_ack_set)
from broker.managed_ledger.core import LedgerInfo, LedgerInfoState, Position
from pulsarlite.errors import InvariantViolation

P = Position


# -- a model: a plain set of acked positions over a fixed ledger list ----------------------------
def universe(ledgers: list[tuple[int, int]]) -> list[Position]:
    return [P(lid, e) for lid, n in ledgers for e in range(n)]


def batch_size_of(p: Position) -> int:
    return 1 + (p.ledger_id * 7 + p.entry_id) % 4   # 1..4, fixed per position


class Model:
    def __init__(self, ledgers: list[tuple[int, int]]) -> None:
        self.positions = universe(ledgers)
        self.ledgers = ledgers
        self.acked: set[Position] = set()
        self.partial: dict[Position, set[int]] = {}

    def ack(self, p: Position) -> None:
        self.acked.add(p)
        self.partial.pop(p, None)

    def ack_index(self, p: Position, i: int) -> None:
        if p in self.acked:
            return
        s = self.partial.setdefault(p, set())
        s.add(i)
        if len(s) == batch_size_of(p):
            self.ack(p)

    def cumulative(self, p: Position, batch_index: int | None = None) -> None:
        for q in self.positions:
            if q < p or (q == p and batch_index is None):
                self.ack(q)
        if batch_index is not None:
            for i in range(batch_index + 1):
                self.ack_index(p, i)

    def first_unacked(self) -> Position:
        for q in self.positions:
            if q not in self.acked:
                return q
        last_id, last_n = self.ledgers[-1]
        return P(last_id, last_n)


@st.composite
def ledger_lists(draw) -> list[tuple[int, int]]:
    count = draw(st.integers(1, 4))
    ids = sorted(draw(st.sets(st.integers(0, 20), min_size=count, max_size=count)))
    return [(lid, draw(st.integers(0, 6))) for lid in ids]


@st.composite
def scenarios(draw, with_cumulative: bool = True):
    ledgers = draw(ledger_lists())
    positions = universe(ledgers)
    ops = []
    if positions:
        pos = st.sampled_from(positions)
        kinds = ["ind", "batch", "ackset"] + (["cum", "cum_batch"] if with_cumulative else [])
        for _ in range(draw(st.integers(0, 40))):
            kind = draw(st.sampled_from(kinds))
            p = draw(pos)
            if kind == "ackset":   # a bitmask of the indexes the client acked
                ops.append((kind, p, draw(st.integers(0, (1 << batch_size_of(p)) - 1))))
            else:
                ops.append((kind, p, draw(st.integers(0, batch_size_of(p) - 1))))
    return ledgers, ops


def apply(state: CursorState, model: Model | None, op) -> None:
    kind, p, i = op
    if kind == "ind":
        state.ack_individual(p)
        model and model.ack(p)
    elif kind == "batch":
        state.ack_individual(p, batch_index=i, batch_size=batch_size_of(p))
        model and model.ack_index(p, i)
    elif kind == "ackset":
        n = batch_size_of(p)
        acked = {j for j in range(n) if (i >> j) & 1}
        state.ack_set(p, indexes_to_ack_set(acked, n))   # no batch size: pure bitset AND
        if model:
            for j in acked:
                model.ack_index(p, j)
    elif kind == "cum":
        state.ack_cumulative(p)
        model and model.cumulative(p)
    else:
        state.ack_cumulative(p, batch_index=i, batch_size=batch_size_of(p))
        model and model.cumulative(p, i)


def check_against(state: CursorState, model: Model) -> None:
    state.check_invariants()
    for q in model.positions:
        assert state.is_acked(q) == (q in model.acked), q
        remaining = state.remaining_batch_indexes(q, batch_size_of(q))
        if q in model.acked:
            assert remaining == set()
        elif q in model.partial:
            assert remaining == set(range(batch_size_of(q))) - model.partial[q]
        else:   # an ack_set that acked nothing leaves an all-ones state: the same deliveries
            assert remaining is None or remaining == set(range(batch_size_of(q)))
    assert state.read_position == model.first_unacked()
    assert state.unacked_in(model.positions) == [q for q in model.positions if q not in model.acked]
    # a run of entries read together (dispatch): the same as is_acked of each, for every span
    for ledger_id, n in model.ledgers:
        for first in range(-1, n + 1):
            for last in (first - 1, first, first + 2, n):
                assert state.acked_in_run(ledger_id, max(first, 0), last) == \
                    {e for e in range(max(first, 0), last + 1) if state.is_acked(P(ledger_id, e))}, \
                    (ledger_id, first, last)
    last_id, last_n = model.ledgers[-1]
    assert state.backlog(P(last_id, last_n - 1)) == len(model.positions) - len(model.acked)


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_random_acks_match_a_set_model(scenario):
    ledgers, ops = scenario
    state = CursorState(P(ledgers[0][0], -1), ledgers=ledgers)
    model = Model(ledgers)
    for op in ops:
        apply(state, model, op)
        check_against(state, model)
    # the persisted form reloads to the same state
    again = CursorState.from_json(json.loads(state.to_bytes()), ledgers=ledgers)
    assert again.to_json() == state.to_json()
    check_against(again, model)


@settings(max_examples=200, deadline=None)
@given(scenarios(with_cumulative=True), st.randoms(use_true_random=False))
def test_ack_order_does_not_matter(scenario, rnd):
    ledgers, ops = scenario
    ops = [op for op in ops if op[0] != "cum_batch"]   # its mark_delete is Position(L, e - 1): same acks, other form
    shuffled = list(ops)
    rnd.shuffle(shuffled)
    a = CursorState(P(ledgers[0][0], -1), ledgers=ledgers)
    b = CursorState(P(ledgers[0][0], -1), ledgers=ledgers)
    for op in ops:
        apply(a, None, op)
    for op in shuffled:
        apply(b, None, op)
    assert a.to_json() == b.to_json()


# -- mark-delete advance ---------------------------------------------------------------------------
def test_mark_delete_advances_over_contiguous_acks():
    s = CursorState(P(5, -1), ledgers=[(5, 10)])
    for e in (3, 1, 2):
        s.ack_individual(P(5, e))
    assert s.mark_delete == P(5, -1)
    assert s.individually_acked == [(5, 1, 3)]
    s.ack_individual(P(5, 0))
    assert s.mark_delete == P(5, 3) and s.individually_acked == []
    s.ack_individual(P(5, 5))
    s.ack_individual(P(5, 7))
    assert s.individually_acked == [(5, 5, 5), (5, 7, 7)]
    s.ack_individual(P(5, 6))
    assert s.individually_acked == [(5, 5, 7)]
    s.ack_individual(P(5, 4))
    assert s.mark_delete == P(5, 7) and s.individually_acked == []
    assert s.read_position == P(5, 8)


def test_mark_delete_crosses_ledger_boundaries_and_skips_empty_ledgers():
    ledgers = [LedgerInfo(1, LedgerInfoState.CLOSED, entries=2, size_bytes=2),
               LedgerInfo(2, LedgerInfoState.CLOSED),                       # empty
               LedgerInfo(4, LedgerInfoState.CLOSED, entries=3, size_bytes=3),
               LedgerInfo(6, LedgerInfoState.OPEN, entries=2, size_bytes=2)]
    s = CursorState(P(1, -1), ledgers=lambda: ledgers)
    for p in (P(4, 0), P(4, 1), P(4, 2), P(6, 0), P(1, 1)):
        s.ack_individual(p)
    assert s.mark_delete == P(1, -1)
    assert s.individually_acked == [(1, 1, 1), (4, 0, 2), (6, 0, 0)]
    s.ack_individual(P(1, 0))
    assert s.mark_delete == P(6, 0) and s.individually_acked == []
    assert s.read_position == P(6, 1)
    assert s.backlog(P(6, 1)) == 1


def test_without_a_ledger_list_only_same_ledger_advances_until_told():
    s = CursorState(P(1, -1))
    s.ack_individual(P(1, 0))
    s.ack_individual(P(2, 0))
    assert s.mark_delete == P(1, 0) and s.individually_acked == [(2, 0, 0)]
    s.set_ledgers([(1, 1), (2, 5)])
    assert s.mark_delete == P(2, 0) and s.individually_acked == []


def test_a_trimmed_ledger_continues_at_the_next_one():
    s = CursorState(P(1, 4), ledgers=[(3, 2), (4, 0)])   # ledger 1 trimmed
    assert s.read_position == P(3, 0)
    s.ack_individual(P(3, 0))
    assert s.mark_delete == P(3, 0)


def test_cumulative_ack():
    s = CursorState(P(1, -1), ledgers=[(1, 5), (2, 5)])
    s.ack_individual(P(1, 4))
    s.ack_individual(P(2, 2))
    s.ack_individual(P(2, 1, ), batch_index=0, batch_size=2)
    assert s.ack_cumulative(P(1, 3))
    assert s.mark_delete == P(1, 4)               # joined the acked (1, 4)
    assert s.ack_cumulative(P(2, 1))
    assert s.mark_delete == P(2, 2) and s.individually_acked == [] and s.batch_acks == {}
    assert not s.ack_cumulative(P(1, 0))          # below mark_delete: no-op
    assert s.mark_delete == P(2, 2)


def test_cumulative_ack_to_a_batch_index():
    s = CursorState(P(1, -1), ledgers=[(1, 5)])
    s.ack_cumulative(P(1, 2), batch_index=1, batch_size=4)
    assert s.mark_delete == P(1, 1)
    assert s.remaining_batch_indexes(P(1, 2), 4) == {2, 3}
    s.ack_cumulative(P(1, 2), batch_index=3, batch_size=4)
    assert s.mark_delete == P(1, 2) and s.batch_acks == {}


def test_reset_moves_mark_delete_anywhere_and_clears_acks():
    s = CursorState(P(1, -1), ledgers=[(1, 5), (2, 5)])
    s.ack_cumulative(P(2, 1))
    s.ack_individual(P(2, 3))
    s.ack_individual(P(2, 4), batch_index=0, batch_size=2)
    s.reset(P(1, 2))
    assert s.mark_delete == P(1, 1) and s.individually_acked == [] and s.batch_acks == {}
    assert s.read_position == P(1, 2)
    s.reset(P(2, 0))
    assert s.mark_delete == P(2, -1) and s.read_position == P(2, 0)


# -- batch acks and the wire ack_set ----------------------------------------------------------------
def test_ack_set_wire_convention():
    # a set bit = NOT acked; bit i of word i // 64
    assert indexes_to_ack_set({0}, 3) == [0b110]
    assert ack_set_to_indexes([0b110], 3) == {0}
    assert indexes_to_ack_set(set(), 64) == [-1]                    # all 64 bits set, signed int64
    assert ack_set_to_indexes([-1], 64) == set()
    assert ack_set_to_indexes([(1 << 64) - 1], 64) == set()         # unsigned form accepted
    assert indexes_to_ack_set({64}, 65) == [-1]                     # trailing zero word dropped
    assert indexes_to_ack_set(set(range(65)), 65) == []             # all acked
    assert indexes_to_ack_set(set(range(64)), 65) == [0, 1]         # only index 64 left
    assert ack_set_to_indexes([0, 1], 65) == set(range(64))
    assert ack_set_to_indexes([], 10) == set(range(10))             # missing words: zeros = acked
    assert indexes_to_ack_set({63}, 64) == [(1 << 63) - 1]          # top bit clear


@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.sets(st.integers(0, n - 1)))))
def test_ack_set_round_trip(args):
    n, acked = args
    words = indexes_to_ack_set(acked, n)
    assert len(words) <= (n + 63) // 64
    assert all(-(1 << 63) <= w < (1 << 63) for w in words)
    assert ack_set_to_indexes(words, n) == acked
    for i in range(n):   # bit i set <=> not acked
        word = words[i // 64] & ((1 << 64) - 1) if i // 64 < len(words) else 0
        assert bool((word >> (i % 64)) & 1) == (i not in acked)


def test_batch_index_acks_complete_an_entry():
    s = CursorState(P(1, -1), ledgers=[(1, 3)])
    assert s.remaining_batch_indexes(P(1, 0), 3) is None
    assert s.remaining_ack_set(P(1, 0), 3) is None
    s.ack_individual(P(1, 0), batch_index=2, batch_size=3)
    assert not s.is_acked(P(1, 0))
    assert s.remaining_batch_indexes(P(1, 0), 3) == {0, 1}
    assert s.remaining_ack_set(P(1, 0), 3) == [0b011]
    s.ack_set(P(1, 0), [0b001], 3)            # the client acked index 1 too
    assert s.remaining_batch_indexes(P(1, 0), 3) == {0}
    s.ack_individual(P(1, 0), batch_index=0, batch_size=3)
    assert s.is_acked(P(1, 0)) and s.mark_delete == P(1, 0) and s.batch_acks == {}
    assert s.remaining_batch_indexes(P(1, 0), 3) == set()


def test_batch_acks_round_trip_through_json_as_ack_sets():
    s = CursorState(P(1, -1), ledgers=[(1, 10)])
    s.ack_individual(P(1, 4), batch_index=1, batch_size=100)
    s.ack_individual(P(1, 4), batch_index=70, batch_size=100)
    raw = s.to_json()
    [[lid, eid, words]] = raw["batch_acks"]
    assert (lid, eid) == (1, 4)
    assert ack_set_to_indexes(words, 100) == {1, 70}
    again = CursorState.from_json(json.loads(json.dumps(raw)), ledgers=[(1, 10)])
    assert again.remaining_batch_indexes(P(1, 4), 100) == set(range(100)) - {1, 70}


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.data())
def test_a_run_of_entry_acks_is_the_same_as_acking_each_in_turn(scenario, data):
    """ack_entries (one ACK frame's whole-entry ids: one pass, mark_delete advanced once) leaves
    the state that ack_individual on each id in turn leaves, from any prior state (partial
    batches, ranges, a cumulative mark), with bad ids (no such ledger, past a closed ledger,
    negative) refused and the rest still acked; it returns the ids newly acked. mark_delete
    moves once, at the end: a bad id below where an earlier id of the run moves it is refused
    (acking each in turn found it below mark_delete: a no-op); either way nothing changes."""
    ledgers, ops = scenario
    prior = ops[:len(ops) // 2]
    known = universe(ledgers)
    last_id, last_n = ledgers[-1]
    bad = [P(ledgers[0][0] - 1, 0) if ledgers[0][0] > 0 else P(21, 0), P(last_id, -1),
           *[P(lid, n) for lid, n in ledgers[:-1]]]
    candidates = known + [P(last_id, last_n), P(last_id + 1, 0)]
    run = data.draw(st.lists(st.sampled_from(candidates + bad), max_size=30))
    one = CursorState(P(ledgers[0][0], -1), ledgers=ledgers)
    each = CursorState(P(ledgers[0][0], -1), ledgers=ledgers)
    for op in prior:
        apply(one, None, op)
        apply(each, None, op)
    expect_acked, expect_refused = [], []
    for p in run:
        try:
            if each.ack_individual(p):
                expect_acked.append(p)
        except InvalidAckError:
            expect_refused.append(p)
    acked, refused = one.ack_entries(run)
    one.check_invariants()
    assert acked == expect_acked
    # an id the sequence refused, the run refuses; the run may also refuse a bad id that the
    # sequence found at or below a mark_delete moved by an earlier id of the run (a no-op there)
    refused_ids = [p for p, e in refused]
    assert all(p in refused_ids for p in expect_refused)
    assert all(p in expect_refused or p <= each.mark_delete for p in refused_ids)
    assert all(isinstance(e, InvalidAckError) for _, e in refused)
    assert one.to_json() == each.to_json()
    assert one.read_position == each.read_position


# -- bad input and invariants --------------------------------------------------------------------
def test_bad_acks_raise_and_change_nothing():
    s = CursorState(P(1, -1), ledgers=[(1, 3), (3, 5)])
    s.ack_individual(P(3, 1), batch_index=0, batch_size=4)
    before = s.to_json()
    for call in (lambda: s.ack_individual(P(2, 0)),                              # no such ledger
                 lambda: s.ack_individual(P(1, 3)),                              # past a closed ledger
                 lambda: s.ack_individual(P(1, -1)),
                 lambda: s.ack_individual(P(1, 0), batch_index=3, batch_size=3),
                 lambda: s.ack_individual(P(1, 0), batch_index=0),
                 lambda: s.ack_individual(P(1, 0), batch_index=0, batch_size=10**7),
                 lambda: s.ack_set(P(1, 0), [1] * 2000),
                 lambda: s.ack_cumulative(P(1, 7)),
                 lambda: s.reset(P(1, -1))):
        with pytest.raises(InvalidAckError):
            call()
        assert s.to_json() == before
    assert not s.ack_individual(P(0, 5))   # below mark_delete (a trimmed ledger): a no-op
    s.ack_individual(P(3, 9))     # the last (open) ledger: its count may lag, accepted
    s.ack_individual(P(7, 0))     # a ledger newer than the (stale) list: accepted, not advanced into
    assert s.individually_acked[-1] == (7, 0, 0)


def test_mark_delete_never_goes_backwards_except_by_reset():
    s = CursorState(P(1, 5))
    with pytest.raises(InvariantViolation):
        s._set_mark_delete(P(1, 4))
    assert s.mark_delete == P(1, 5)


@pytest.mark.parametrize("raw", [
    {"version": 1, "mark_delete": [1, 5], "acked_ranges": [[1, 3, 6]], "batch_acks": []},   # below md
    {"version": 1, "mark_delete": [1, 5], "acked_ranges": [[1, 7, 9], [1, 8, 12]], "batch_acks": []},
    {"version": 1, "mark_delete": [1, 5], "acked_ranges": [[1, 7, 9], [1, 10, 12]], "batch_acks": []},
    {"version": 1, "mark_delete": [1, 5], "acked_ranges": [], "batch_acks": [[1, 3, [1]]]},  # below md
    {"version": 1, "mark_delete": [1, 5], "acked_ranges": [[1, 9, 9]], "batch_acks": [[1, 9, [1]]]},
    {"version": 1, "mark_delete": [1, 5], "acked_ranges": [], "batch_acks": [[1, 9, []]]},  # all acked
    {"version": 2, "mark_delete": [1, 5]},
    {"version": 1},
])
def test_impossible_stored_states_are_rejected(raw):
    with pytest.raises(ValueError):
        CursorState.from_json(raw)


# -- the persistence bound ---------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 200), max_size=120), st.integers(1, 10), st.integers(1, 5),
       st.sets(st.integers(0, 200), max_size=20))
def test_range_bound_keeps_the_ranges_nearest_mark_delete(acked, ranges_max, batches_max, partial):
    config = CursorConfig(acked_ranges_max=ranges_max, batch_acks_max=batches_max)
    ledgers = [(1, 120), (2, 81)]
    def pos(i: int) -> Position:
        return P(1, i) if i < 120 else P(2, i - 120)
    s = CursorState(P(1, -1), ledgers=ledgers, config=config)
    for i in sorted(acked):
        s.ack_individual(pos(i))
    for i in sorted(partial - acked):
        s.ack_individual(pos(i), batch_index=0, batch_size=2)
    raw = s.to_json()
    assert raw["acked_ranges"] == [list(r) for r in s.individually_acked[:ranges_max]]
    assert len(raw["batch_acks"]) == min(batches_max, len(s.batch_acks))
    reloaded = CursorState.from_json(json.loads(json.dumps(raw)), ledgers=ledgers, config=config)
    assert reloaded.mark_delete == s.mark_delete
    for i in range(201):
        p = pos(i)
        if reloaded.is_acked(p):           # never acks what was not acked
            assert s.is_acked(p)
        got = reloaded.remaining_batch_indexes(p, 2)
        if got:                            # a kept partial batch is exact, a dropped one redelivers all
            assert got == s.remaining_batch_indexes(p, 2)
    if s.range_count <= ranges_max:
        assert reloaded.individually_acked == s.individually_acked


def test_config_is_validated():
    from pulsarlite.errors import ConfigError
    with pytest.raises(ConfigError):
        CursorConfig(acked_ranges_max=0).validate()
    with pytest.raises(ConfigError):
        CursorConfig(persist_delay_ms=-1).validate()


def test_ack_sets_without_batch_size_and_java_trimmed_words():
    # a batch of 100: the client acked 64..99 first; Java's BitSet drops the zero second word
    s = CursorState(P(1, -1), ledgers=[(1, 3)])
    first = indexes_to_ack_set(set(range(64, 100)), 100)
    assert len(first) == 1
    s.ack_set(P(1, 1), first)
    assert s.remaining_batch_indexes(P(1, 1), 100) == set(range(64))
    s.ack_set(P(1, 1), indexes_to_ack_set(set(range(10)), 100))      # 0..9 (and 64..99 again)
    assert s.remaining_batch_indexes(P(1, 1), 100) == set(range(10, 64))
    assert s.remaining_ack_set(P(1, 1), 100) == indexes_to_ack_set(set(range(10)) | set(range(64, 100)), 100)
    assert not s.ack_set(P(1, 1), [-1, -1])                           # acks nothing new: unchanged
    s.ack_batch_indexes(P(1, 1), range(10, 64), 100)
    assert s.is_acked(P(1, 1)) and s.batch_acks == {}
    s.ack_set(P(1, 2), [])                                            # empty ack_set: all acked
    assert s.is_acked(P(1, 2))


def test_persisted_bytes_are_bounded_and_keep_the_nearest_state():
    config = CursorConfig(state_bytes_max=2_000)
    s = CursorState(P(1, -1), ledgers=[(1, 100_000)], config=config)
    for e in range(1, 20_000, 2):                       # 10,000 ranges
        s.ack_individual(P(1, e))
    for e in range(20_000, 20_050):                     # 50 big partial batches
        s.ack_individual(P(1, e), batch_index=0, batch_size=4096)
    data = s.to_bytes()
    assert len(data) <= 2_000
    reloaded = CursorState.from_bytes(data, config=config)
    kept = reloaded.individually_acked
    assert kept and kept == s.individually_acked[:len(kept)]
    assert all(s.is_acked(P(1, e)) for e in range(25_000) if reloaded.is_acked(P(1, e)))
