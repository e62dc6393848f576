"""The managed ledger's pure core: positions, rollover decisions, states, stats, metadata codec.
Plain tests and hypothesis properties; a tiny in-test driver plays the shell."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.managed_ledger.config import ManagedLedgerConfig
from broker.managed_ledger.core import (STATE_TRANSITIONS, CompleteAdds, FailAdd, LedgerInfo, LedgerInfoState,
                                        ManagedLedgerClosedError, ManagedLedgerCore, ManagedLedgerError,
                                        ManagedLedgerFencedError, ManagedLedgerMetadata, ManagedLedgerState,
                                        OffloadRecord, OffloadState, Position, RolloverPolicy, RolloverReason,
                                        StartRollover, WriteEntries, iter_positions, ledger_ranges, next_position,
                                        with_ledger_appended, with_ledger_closed)
from pulsarlite.errors import (ConfigError, InvariantViolation, LedgerFencedError, NotEnoughBookiesError,
                               TimeoutError_)
from pulsarlite.ledger_list import ObjectStats, decode, encode
from pulsarlite.metadata_layout import check_name, managed_ledger_name, managed_ledger_path

NAME = "t/ns/persistent/topic"


# -- strategies ------------------------------------------------------------------------------
@st.composite
def ledger_lists(draw, min_size: int = 1):
    n = draw(st.integers(min_size, 6))
    ids = sorted(draw(st.sets(st.integers(0, 10_000), min_size=n, max_size=n)))
    counts = draw(st.lists(st.integers(0, 8), min_size=n, max_size=n))
    return tuple(LedgerInfo(i, LedgerInfoState.CLOSED if k < n - 1 else LedgerInfoState.OPEN, entries=c,
                            size_bytes=c * 3) for k, (i, c) in enumerate(zip(ids, counts)))


# -- positions -------------------------------------------------------------------------------
@given(ledger_lists())
def test_positions_order_is_list_order(ledgers):
    positions = list(iter_positions(ledgers, Position(0, 0)))
    assert positions == sorted(positions)
    assert len(positions) == sum(i.entries for i in ledgers)
    assert len(set(positions)) == len(positions)
    # list order: every position of ledger k comes before every position of ledger k+1
    index = {info.ledger_id: k for k, info in enumerate(ledgers)}
    assert [index[p.ledger_id] for p in positions] == sorted(index[p.ledger_id] for p in positions)


@given(ledger_lists())
def test_next_position_walks_every_entry(ledgers):
    positions = list(iter_positions(ledgers, Position(0, 0)))
    if not positions:
        return
    walked = [positions[0]]
    while True:
        nxt = next_position(ledgers, walked[-1])
        if nxt not in positions:
            break
        walked.append(nxt)
    assert walked == positions
    # after the last entry comes the end position: in the last ledger, past its entries
    end = next_position(ledgers, positions[-1])
    assert end.ledger_id == ledgers[-1].ledger_id and end.entry_id >= ledgers[-1].entries


@given(ledger_lists(), st.integers(0, 10_001), st.integers(-1, 9), st.integers(1, 30))
def test_ledger_ranges_match_iter_positions(ledgers, start_ledger, start_entry, count):
    start = Position(start_ledger, start_entry)
    expected = list(iter_positions(ledgers, start, count))
    got = [Position(lid, e) for lid, a, b in ledger_ranges(ledgers, start, count) for e in range(a, b + 1)]
    assert got == expected
    assert all(p >= Position(start.ledger_id, max(start.entry_id, 0)) for p in got)
    assert len(got) <= count


def test_next_position_unknown_ledger():
    with pytest.raises(ValueError):
        next_position((LedgerInfo(1),), Position(2, 0))


def test_next_position_skips_empty_ledgers():
    ledgers = (LedgerInfo(1, LedgerInfoState.CLOSED, entries=2, size_bytes=2),
               LedgerInfo(3, LedgerInfoState.CLOSED), LedgerInfo(5, LedgerInfoState.CLOSED, entries=1, size_bytes=1),
               LedgerInfo(7))
    assert next_position(ledgers, Position(1, 0)) == Position(1, 1)
    assert next_position(ledgers, Position(1, 1)) == Position(5, 0)
    assert next_position(ledgers, Position(5, 0)) == Position(7, 0)
    assert str(Position(5, 0)) == "5:0"


# -- rollover policy ---------------------------------------------------------------------------
@given(st.integers(1, 100), st.integers(1, 10_000), st.integers(1, 10_000),
       st.integers(0, 200), st.integers(0, 20_000), st.integers(0, 20_000))
def test_rollover_reason(entries_max, bytes_max, age_max, entries, size, age):
    policy = RolloverPolicy(entries_max, bytes_max, age_max)
    reason = policy.reason(entries, size, 1_000, 1_000 + age)
    must = entries >= entries_max or size >= bytes_max or (entries > 0 and age >= age_max)
    assert (reason is not None) == must
    if reason is RolloverReason.AGE:
        assert entries > 0 and entries < entries_max and size < bytes_max


def test_rollover_policy_rejects_bad_limits():
    with pytest.raises(ValueError):
        RolloverPolicy(0, 1, 1)


# -- config ----------------------------------------------------------------------------------
def test_config_validation():
    assert ManagedLedgerConfig().validate().ack_quorum == 2
    for bad in (dict(ack_quorum=4), dict(ensemble_size=2), dict(rollover_entries_max=0),
                dict(pending_adds_max=-1), dict(read_entries_max=0)):
        with pytest.raises(ConfigError):
            ManagedLedgerConfig(**bad).validate()


# -- metadata and codec ------------------------------------------------------------------------
def test_metadata_invariants():
    with pytest.raises(InvariantViolation):
        ManagedLedgerMetadata((LedgerInfo(2), LedgerInfo(1)))
    with pytest.raises(InvariantViolation):
        ManagedLedgerMetadata((LedgerInfo(1), LedgerInfo(2, LedgerInfoState.CLOSED)))
    with pytest.raises(InvariantViolation):
        LedgerInfo(1, entries=0, size_bytes=5)
    with pytest.raises(InvariantViolation):
        LedgerInfo(1, entries=2, size_bytes=5, min_publish_time_ms=9, max_publish_time_ms=3)
    md = with_ledger_appended(ManagedLedgerMetadata(), 4, 100)
    with pytest.raises(InvariantViolation):
        with_ledger_appended(md, 4, 100)
    closed = with_ledger_closed(md, 4, entries=3, size_bytes=9, min_publish_time_ms=1, max_publish_time_ms=2)
    assert closed.ledgers[0].state is LedgerInfoState.CLOSED
    assert with_ledger_closed(closed, 4, entries=3, size_bytes=9, min_publish_time_ms=1,
                              max_publish_time_ms=2) == closed     # idempotent
    with pytest.raises(InvariantViolation):
        with_ledger_closed(closed, 4, entries=4, size_bytes=9, min_publish_time_ms=1, max_publish_time_ms=2)


def _record(state, uri, extra):
    """A valid offload record in ``state`` (a uri, uuid and stats where the state needs them)."""
    if state is OffloadState.NONE:
        return OffloadRecord(extra=extra)
    stats = None
    if state in (OffloadState.OFFLOADED, OffloadState.BOOKIE_DELETED):
        stats = ObjectStats(3, 40, "0badf00d", None, None)
    return OffloadRecord(state, uri or "s3://b/k", "abcdef12", stats, 7 if stats else None, extra=extra)


@given(ledger_lists(),
       st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
       st.sampled_from(list(OffloadState)), st.none() | st.text(max_size=10))
def test_codec_round_trip(ledgers, properties, offload_state, uri):
    ledgers = tuple(LedgerInfo(i.ledger_id, i.state, i.entries, i.size_bytes,
                               1_000 if i.entries else None, 2_000 if i.entries else None, created_ms=7,
                               offload=_record(offload_state, uri, {"extra": [1, 2]}))
                    for i in ledgers)
    md = ManagedLedgerMetadata(ledgers, properties)
    assert decode(encode(md)) == md


def test_codec_rejects_garbage():
    for bad in (b"", b"{}", b'{"version": 2, "ledgers": []}', b'{"version": 1, "ledgers": [{"ledger_id": 1}]}',
                b'{"version": 1, "ledgers": [{"ledger_id": 2, "state": "OPEN", "entries": 0, "size_bytes": 0},'
                b' {"ledger_id": 1, "state": "OPEN", "entries": 0, "size_bytes": 0}]}'):
        with pytest.raises(ValueError):
            decode(bad)


def test_names_and_paths():
    assert managed_ledger_name("t", "ns", "x-partition-0") == "t/ns/persistent/x-partition-0"
    assert managed_ledger_path("t/ns/persistent/x") == "/managed-ledgers/t/ns/persistent/x"
    for bad in ("t/ns/x", "t/ns/non-persistent/x", "t//persistent/x", "t/ns/persistent/..", "t/ns/persistent/a/b"):
        with pytest.raises(ValueError):
            check_name(bad)


# -- states ----------------------------------------------------------------------------------
def test_state_table_is_explicit_and_terminal_states_stay():
    assert set(STATE_TRANSITIONS) == set(ManagedLedgerState)
    assert STATE_TRANSITIONS[ManagedLedgerState.FENCED] == frozenset()
    assert STATE_TRANSITIONS[ManagedLedgerState.DELETED] == frozenset()
    core = ManagedLedgerCore(NAME, RolloverPolicy(10, 10_000, 10_000), pending_adds_max=10)
    with pytest.raises(InvariantViolation):
        core.on_deleted()     # OPENING -> DELETED is not in the table


# -- the core driven by a tiny shell ---------------------------------------------------------
class Driver:
    """Plays the shell: ledgers are lists; writes complete when ``confirm`` is called (in order
    per ledger, like LedgerWriter); rollovers complete when ``finish_rollover`` is called."""

    def __init__(self, entries_max=5, bytes_max=10_000, age_ms_max=1_000_000, pending_adds_max=1_000,
                 publish_period_ms=0):
        self.core = ManagedLedgerCore(NAME, RolloverPolicy(entries_max, bytes_max, age_ms_max, publish_period_ms),
                                      pending_adds_max=pending_adds_max)
        self.now = 0
        self.next_ledger_id = 10
        self.written: dict[int, list[int]] = {}    # ledger -> add ids, in entry order
        self.unconfirmed: list[tuple[int, int, int]] = []  # (add_id, ledger, entry) in order
        self.completed: dict[int, Position] = {}
        self.failed: dict[int, Exception] = {}
        self.rollover: StartRollover | None = None
        self.sizes: dict[int, tuple[int, int]] = {}
        md = self.core.open_metadata(ManagedLedgerMetadata(), {}, self._new_ledger(), self.now)
        self.run(self.core.on_opened(md))

    def _new_ledger(self) -> int:
        self.next_ledger_id += 1 + self.next_ledger_id % 3
        self.written[self.next_ledger_id] = []
        return self.next_ledger_id

    def run(self, actions):
        for a in actions:
            if isinstance(a, WriteEntries):
                for i in range(a.count):
                    assert len(self.written[a.ledger_id]) == a.entry_id + i
                    self.written[a.ledger_id].append(a.add_id + i)
                    self.unconfirmed.append((a.add_id + i, a.ledger_id, a.entry_id + i))
            elif isinstance(a, CompleteAdds):
                for i in range(a.count):
                    self.completed[a.add_id + i] = Position(a.ledger_id, a.entry_id + i)
            elif isinstance(a, FailAdd):
                self.failed[a.add_id] = a.error
            elif isinstance(a, StartRollover):
                assert self.rollover is None
                self.rollover = a

    def add(self, size, publish_time):
        add_id, actions = self.core.add([size], [publish_time], self.now)
        self.sizes[add_id] = (size, publish_time)
        self.run(actions)
        return add_id

    def confirm(self, n=1):
        for _ in range(min(n, len(self.unconfirmed))):
            add_id, ledger_id, entry_id = self.unconfirmed.pop(0)
            self.run(self.core.on_adds_confirmed(add_id, ledger_id, entry_id, 1))

    def fail_current(self, error):
        """The ledger fails every unconfirmed add, in order (sticky, like LedgerWriter)."""
        pending, self.unconfirmed = self.unconfirmed, []
        for add_id, ledger_id, _ in pending:
            self.run(self.core.on_add_failed(add_id, ledger_id, error))

    def finish_rollover(self):
        assert self.rollover is not None and not self.unconfirmed
        ledger_id = self.rollover.ledger_id
        self.rollover = None
        closed = self.core.closed_info(self.core.current_confirmed()[1], self.confirmed_bytes(ledger_id))
        md = self.core.rollover_metadata(closed, self._new_ledger(), self.now)
        self.run(self.core.on_rolled_over(md, self.now))

    def confirmed_bytes(self, ledger_id):
        return sum(self.sizes[a][0] for a in self.written[ledger_id] if a in self.completed)


def test_rollover_queues_adds_until_the_new_ledger_is_in_the_list():
    d = Driver(entries_max=3)
    first = d.core.current_ledger_id
    ids = [d.add(10, 100 + i) for i in range(5)]
    assert d.core.state is ManagedLedgerState.ROLLING_OVER
    assert d.rollover == StartRollover(first, RolloverReason.ENTRIES)
    assert d.written[first] == ids[:3] and d.core.queued_count == 2
    d.confirm(3)
    assert [d.completed[i] for i in ids[:3]] == [Position(first, e) for e in range(3)]
    d.finish_rollover()
    assert d.core.state is ManagedLedgerState.READY
    second = d.core.current_ledger_id
    assert d.written[second] == ids[3:]
    d.confirm(2)
    assert [d.completed[i] for i in ids[3:]] == [Position(second, 0), Position(second, 1)]
    info = d.core.metadata.info(first)
    assert (info.state, info.entries, info.size_bytes) == (LedgerInfoState.CLOSED, 3, 30)
    assert (info.min_publish_time_ms, info.max_publish_time_ms) == (100, 102)
    assert d.core.last_confirmed == Position(second, 1)
    live = d.core.ledgers()[-1]
    assert (live.entries, live.size_bytes, live.min_publish_time_ms, live.max_publish_time_ms) == (2, 20, 103, 104)


def test_rollover_by_bytes_and_age():
    d = Driver(entries_max=1000, bytes_max=100, age_ms_max=50)
    d.add(60, 1)
    assert d.rollover is None
    d.add(40, 2)
    assert d.rollover is not None and d.rollover.reason is RolloverReason.BYTES
    d.confirm(2)
    d.finish_rollover()
    assert d.core.on_tick(d.now + 1_000) == []           # empty: never by age
    d.add(1, 3)
    assert d.core.on_tick(d.now + 49) == []
    assert d.core.on_tick(d.now + 50) == [StartRollover(d.core.current_ledger_id, RolloverReason.AGE)]


# -- [lakehouse] rollover at publish-time day boundaries ---------------------------------------
DAY = 86_400_000


def _add_run(d, sizes, times):
    add_id, actions = d.core.add(sizes, times, d.now)
    for i, (size, t) in enumerate(zip(sizes, times)):
        d.sizes[add_id + i] = (size, t)
    d.run(actions)
    return list(range(add_id, add_id + len(sizes)))


def _drain(d):
    """Confirm everything and finish rollovers until nothing is queued or in flight."""
    while True:
        d.confirm(len(d.unconfirmed))
        if d.rollover is None:
            return
        d.finish_rollover()


def test_publish_day_rolls_over_before_the_first_add_of_a_later_day():
    d = Driver(entries_max=1000, publish_period_ms=DAY)
    first = d.core.current_ledger_id
    a = [d.add(1, DAY - 2), d.add(1, DAY - 1)]
    assert d.rollover is None
    b = d.add(1, DAY)                                       # midnight: next ledger
    assert d.rollover == StartRollover(first, RolloverReason.DAY)
    assert d.written[first] == a and d.core.queued_count == 1
    _drain(d)
    second = d.core.current_ledger_id
    assert d.written[second] == [b]
    info = d.core.metadata.info(first)
    assert (info.entries, info.min_publish_time_ms, info.max_publish_time_ms) == (2, DAY - 2, DAY - 1)


def test_publish_day_cuts_a_run_and_an_earlier_day_never_rolls():
    d = Driver(entries_max=1000, publish_period_ms=DAY)
    first = d.core.current_ledger_id
    # a run across midnight, with a late producer's earlier publish time inside it
    ids = _add_run(d, [1] * 5, [DAY - 5, DAY - 4, DAY + 1, DAY - 3, DAY + 2])
    assert d.rollover == StartRollover(first, RolloverReason.DAY)
    assert d.written[first] == ids[:2]
    _drain(d)
    second = d.core.current_ledger_id
    # the earlier day (DAY - 3) stays with the current ledger: no ledger per skewed entry
    assert d.written[second] == ids[2:]
    later = d.add(1, DAY - 10)
    assert d.rollover is None and d.written[second][-1] == later


def test_publish_day_off_never_rolls_by_day():
    d = Driver(entries_max=1000)
    _add_run(d, [1] * 3, [0, DAY, 5 * DAY])
    assert d.rollover is None


def test_publish_day_queued_adds_roll_again_at_the_next_day():
    d = Driver(entries_max=2, publish_period_ms=DAY)
    first = d.core.current_ledger_id
    ids = _add_run(d, [1] * 4, [1, 2, 3, DAY + 3])          # entries limit, then a day inside the queue
    assert d.rollover == StartRollover(first, RolloverReason.ENTRIES)
    d.confirm(2)
    d.finish_rollover()
    second = d.core.current_ledger_id
    assert d.written[second] == ids[2:3]
    assert d.rollover == StartRollover(second, RolloverReason.DAY)
    _drain(d)
    assert d.written[d.core.current_ledger_id] == ids[3:]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4 * DAY), min_size=1, max_size=5), min_size=1, max_size=12),
       st.integers(2, 6))
def test_publish_day_every_add_lands_once_in_order_and_monotone_times_fit_one_day(runs, entries_max):
    d = Driver(entries_max=entries_max, pending_adds_max=100, publish_period_ms=DAY)
    monotone = sorted(t for run in runs for t in run)
    added = []
    it = iter(monotone)
    for run in runs:
        added += _add_run(d, [1] * len(run), [next(it) for _ in run])
        if d.rollover is not None and len(d.unconfirmed) + d.core.queued_count > 50:
            _drain(d)
    _drain(d)
    written = [a for lid in sorted(d.written) for a in d.written[lid]]
    assert written == added                                  # every add once, in order
    for lid, add_ids in d.written.items():
        days = {d.sizes[a][1] // DAY for a in add_ids}
        assert len(days) <= 1, (lid, days)                   # one producer clock: one day per ledger


def test_fenced_fails_everything_now_and_later():
    d = Driver(entries_max=3)
    ids = [d.add(1, 1) for i in range(5)]
    d.confirm(1)
    d.fail_current(LedgerFencedError("fenced"))
    assert d.core.state is ManagedLedgerState.FENCED
    assert set(d.failed) == set(ids[1:])
    assert all(isinstance(e, ManagedLedgerFencedError) and not e.retriable for e in d.failed.values())
    with pytest.raises(ManagedLedgerFencedError):
        d.core.add([1], [1], 0)


def test_retriable_failure_fails_later_adds_and_rolls_over():
    d = Driver(entries_max=100)
    first = d.core.current_ledger_id
    ids = [d.add(1, 1) for i in range(4)]
    d.confirm(1)
    d.fail_current(TimeoutError_("slow"))
    assert set(d.failed) == set(ids[1:])
    assert all(e.retriable for e in d.failed.values())
    assert d.rollover == StartRollover(first, RolloverReason.FAILURE)
    late = d.add(1, 1)                                      # after the failure: queued
    d.finish_rollover()
    d.confirm(1)
    assert d.completed[late] == Position(d.core.current_ledger_id, 0)
    assert d.core.metadata.info(first).entries == 1


def test_failure_during_rollover_fails_queued_adds():
    d = Driver(entries_max=2)
    ids = [d.add(1, 1) for i in range(4)]                  # 2 in flight, 2 queued
    d.fail_current(NotEnoughBookiesError("gone"))
    assert set(d.failed) == set(ids)
    assert d.core.pending_count == 0


def test_pending_limit_and_close():
    d = Driver(entries_max=100, pending_adds_max=3)
    for _ in range(3):
        d.add(1, 1)
    with pytest.raises(ManagedLedgerError) as e:
        d.core.add([1], [1], 0)
    assert e.value.retriable
    d.confirm(3)
    d.core.start_close()
    with pytest.raises(ManagedLedgerClosedError):
        d.core.add([1], [1], 0)
    md = d.core.close_metadata(d.core.closed_info(2, 3))
    d.run(d.core.on_closed(md))
    assert d.core.state is ManagedLedgerState.CLOSED
    assert md.ledgers[-1].state is LedgerInfoState.CLOSED and md.ledgers[-1].entries == 3


def test_closed_info_detects_lost_acknowledged_entries():
    d = Driver(entries_max=100)
    for _ in range(3):
        d.add(5, 1)
    d.confirm(3)
    with pytest.raises(InvariantViolation):
        d.core.closed_info(1, 10)         # closed below what was confirmed
    recovered_more = d.core.closed_info(3, 20)  # a recovery kept one failed add: times unknown
    assert recovered_more.entries == 4 and recovered_more.min_publish_time_ms is None


def test_open_metadata_closes_recovered_and_drops_empty():
    core = ManagedLedgerCore(NAME, RolloverPolicy(10, 10, 10), pending_adds_max=10)
    stored = ManagedLedgerMetadata((LedgerInfo(1, LedgerInfoState.CLOSED, 5, 50, 1, 2), LedgerInfo(3), LedgerInfo(4)))
    recovered = {3: LedgerInfo(3, LedgerInfoState.CLOSED, 7, 70), 4: LedgerInfo(4, LedgerInfoState.CLOSED)}
    md = core.open_metadata(stored, recovered, 9, 1234)
    assert md.ledger_ids == [1, 3, 9]
    assert md.info(3).state is LedgerInfoState.CLOSED and md.info(3).entries == 7
    assert md.info(9) == LedgerInfo(9, created_ms=1234)
    core.on_opened(md)
    assert core.last_confirmed == Position(3, 6)
    with pytest.raises(InvariantViolation):
        ManagedLedgerCore(NAME, RolloverPolicy(10, 10, 10), pending_adds_max=10).open_metadata(stored, {3: recovered[3]}, 9, 0)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 6), st.integers(20, 150))
def test_random_schedules_keep_order_counts_and_stats(seed, entries_max, steps):
    """Random interleavings of adds, confirmations, failures, ticks and rollover completions:
    completions are in add order with strictly increasing positions; every closed ledger holds
    at most entries_max entries; the list's stats equal the confirmed adds'."""
    rng = random.Random(seed)
    d = Driver(entries_max=entries_max, bytes_max=10 ** 9, age_ms_max=500)
    issued = []
    for _ in range(steps):
        d.now += rng.randint(0, 100)
        op = rng.random()
        if op < 0.45:
            issued.append(d.add(rng.randint(0, 20), rng.randint(0, 10_000)))
        elif op < 0.8:
            d.confirm(rng.randint(1, 3))
        elif op < 0.83:
            d.fail_current(TimeoutError_("t"))
        elif op < 0.9:
            d.run(d.core.on_tick(d.now))
        elif d.rollover is not None and not d.unconfirmed:
            d.finish_rollover()
    # drain
    for _ in range(1000):
        d.confirm(len(d.unconfirmed))
        if d.rollover is None:
            break
        d.finish_rollover()
    d.confirm(len(d.unconfirmed))
    assert d.core.pending_count == 0
    assert set(d.completed) | set(d.failed) == set(issued)
    ok = [a for a in issued if a in d.completed]
    positions = [d.completed[a] for a in ok]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    ledgers = d.core.ledgers()
    assert [i.ledger_id for i in ledgers] == sorted(i.ledger_id for i in ledgers)
    for info in ledgers:
        mine = [a for a in ok if d.completed[a].ledger_id == info.ledger_id]
        assert info.entries == len(mine) <= entries_max
        assert [d.completed[a].entry_id for a in mine] == list(range(len(mine)))
        assert info.size_bytes == sum(d.sizes[a][0] for a in mine)
        times = [d.sizes[a][1] for a in mine]
        assert info.min_publish_time_ms == (min(times) if times else None)
        assert info.max_publish_time_ms == (max(times) if times else None)
    assert all(i.state is LedgerInfoState.CLOSED for i in ledgers[:-1])
    if positions:
        assert d.core.last_confirmed == positions[-1]
