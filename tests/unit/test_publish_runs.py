"""Runs of adds on the publish path (docs/decisions.md "[perf] Runs of SENDs"): each layer has one
add path, and a single add is a run of one. The managed-ledger core's add / on_adds_confirmed,
the write core's add, the bookie client's chunked outbound queue, the broker's SEND path: the
same adds given as one run or as runs of one (or cut anywhere) give the same entries, positions,
confirmations, failures and final state."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie.client.actions import AddOutcome, ConfirmAdds, FailAdds, SendAdd, SendAddRun
from bookie.client.metadata import LedgerMetadata
from bookie.client.write_core import LedgerWriteCore
from broker.managed_ledger.core import (CompleteAdds, FailAdd, LedgerInfo, ManagedLedgerCore, ManagedLedgerError,
                                        ManagedLedgerFencedError,
                                        ManagedLedgerMetadata, ManagedLedgerState, Position, RolloverPolicy,
                                        StartRollover, WriteEntries)
from pulsarlite.errors import (InvariantViolation, LedgerClosedError, LedgerFencedError, NotEnoughBookiesError)

BIG = 1 << 40


# -- managed-ledger core ------------------------------------------------------------------------
def ml_core(entries_max=BIG, bytes_max=BIG, age_ms_max=BIG, pending_adds_max=1000, ledger_id=5):
    core = ManagedLedgerCore("t/ns/persistent/x", RolloverPolicy(entries_max, bytes_max, age_ms_max),
                             pending_adds_max=pending_adds_max)
    assert core.on_opened(ManagedLedgerMetadata((LedgerInfo(ledger_id, created_ms=0),))) == []
    return core


def expand_ml(actions):
    """Range actions as the runs of one they stand for."""
    out = []
    for a in actions:
        if isinstance(a, WriteEntries):
            out += [WriteEntries(a.add_id + i, a.ledger_id, a.entry_id + i, 1) for i in range(a.count)]
        elif isinstance(a, CompleteAdds):
            out += [CompleteAdds(a.add_id + i, a.ledger_id, a.entry_id + i, 1) for i in range(a.count)]
        else:
            out.append(a)
    return out


def ml_state(core):
    return (core.state, core.pending_count, core.queued_count, core.last_confirmed, core.ledgers(),
            core.current_confirmed(), core._next_add_id)


runs = st.lists(st.tuples(st.integers(0, 500), st.integers(0, 10_000)), min_size=1, max_size=30)


def add_one_by_one(core, sizes, times, now_ms=0):
    """The same adds as runs of one: the first add id and every action, in order."""
    first, actions = None, []
    for size, t in zip(sizes, times):
        add_id, a = core.add([size], [t], now_ms)
        first = add_id if first is None else first
        actions += a
    return first, actions


@settings(max_examples=150, deadline=None)
@given(before=st.integers(0, 5), run=runs, splits=st.lists(st.integers(1, 30), max_size=10))
def test_ml_one_run_or_runs_of_one_give_the_same_adds_and_confirmations(before, run, splits):
    batch, single = ml_core(), ml_core()
    for i in range(before):             # adds already in flight ahead of the run
        for core in (batch, single):
            core.add([10], [7], 0)
    sizes = [s for s, _ in run]
    times = [t for _, t in run]
    first, actions = batch.add(sizes, times, 0)
    assert len(actions) == 1 and isinstance(actions[0], WriteEntries)
    first_single, expected = add_one_by_one(single, sizes, times)
    assert first == first_single
    assert expand_ml(actions) == expand_ml(expected)
    assert ml_state(batch) == ml_state(single)
    # confirm: the adds before one by one, the run in the ranges ``splits`` cut it into
    for i in range(before):
        for core in (batch, single):
            assert core.on_adds_confirmed(i, 5, i, 1) == [CompleteAdds(i, 5, i, 1)]
    offset = 0
    cuts = iter(splits)
    while offset < len(run):
        count = min(next(cuts, len(run)), len(run) - offset)
        out = batch.on_adds_confirmed(first + offset, 5, before + offset, count)
        assert out == [CompleteAdds(first + offset, 5, before + offset, count)]
        per_add = []
        for i in range(offset, offset + count):
            per_add += single.on_adds_confirmed(first + i, 5, before + i, 1)
        assert expand_ml(out) == expand_ml(per_add)
        assert ml_state(batch) == ml_state(single)
        offset += count
    assert batch.pending_count == 0


@settings(max_examples=200, deadline=None)
@given(entries_max=st.integers(1, 8), bytes_max=st.integers(1, 400), age_ms_max=st.integers(1, 50),
       before=st.integers(0, 6), run=runs, now_ms=st.integers(0, 60), confirm_first=st.booleans())
def test_ml_a_rollover_inside_a_run_splits_it_as_runs_of_one_would(entries_max, bytes_max, age_ms_max, before,
                                                                    run, now_ms, confirm_first):
    """The rollover policy (entries, bytes, age) names a point inside, or at the end of, the
    run: the adds up to it go to the current ledger, the rollover starts, the rest queue; after
    the rollover the queued ones go to the next ledger. The same actions, positions and state as
    the same adds one by one."""
    batch = ml_core(entries_max=entries_max, bytes_max=bytes_max, age_ms_max=age_ms_max)
    single = ml_core(entries_max=entries_max, bytes_max=bytes_max, age_ms_max=age_ms_max)
    sizes = [s for s, _ in run]
    times = [t for _, t in run]
    outs = []
    for core, one_by_one in ((batch, False), (single, True)):
        out = []
        for i in range(before):
            if core.state is ManagedLedgerState.READY:
                out += core.add([10], [7], 0)[1]
        if one_by_one:
            out += add_one_by_one(core, sizes, times, now_ms)[1]
        else:
            out += core.add(sizes, times, now_ms)[1]
        outs.append(out)
    assert expand_ml(outs[0]) == expand_ml(outs[1])
    assert ml_state(batch) == ml_state(single)
    rolls = [a for a in outs[0] if isinstance(a, StartRollover)]
    if not rolls:
        return
    # confirm everything written, roll over, and the queued adds go out the same way
    for core, out in zip((batch, single), outs):
        for w in (a for a in out if isinstance(a, WriteEntries)):
            core.on_adds_confirmed(w.add_id, w.ledger_id, w.entry_id, w.count)
        ledger_id, last = core.current_confirmed()
        closed = core.closed_info(last, core.ledgers()[-1].size_bytes)
        md = core.rollover_metadata(closed, 6, now_ms)
        outs_after = core.on_rolled_over(md, now_ms)
        out[:] = outs_after
    assert expand_ml(outs[0]) == expand_ml(outs[1])
    assert ml_state(batch) == ml_state(single)
    assert batch.queued_count == 0 or batch.state is ManagedLedgerState.ROLLING_OVER


def test_ml_adds_refused_change_nothing():
    # no room for the whole run under pending_adds_max
    core = ml_core(pending_adds_max=10)
    before = ml_state(core)
    with pytest.raises(ManagedLedgerError, match="limit"):
        core.add([1] * 11, [1] * 11, 0)
    assert ml_state(core) == before
    core.add([1] * 10, [1] * 10, 0)
    with pytest.raises(ManagedLedgerError):
        core.add([1], [1], 0)
    # rolling over (adds queue): taken, queued
    core = ml_core(entries_max=3)
    _, actions = core.add([1, 1, 1], [1, 1, 1], 0)
    assert isinstance(actions[-1], StartRollover) and core.state is ManagedLedgerState.ROLLING_OVER
    assert core.add([1, 1], [1, 1], 0)[1] == [] and core.queued_count == 2
    # closing / fenced
    for prepare, error in ((lambda c: c.start_close(), ManagedLedgerError),
                           (lambda c: c.on_fenced(ManagedLedgerFencedError("gone")), ManagedLedgerFencedError)):
        core = ml_core()
        prepare(core)
        before = ml_state(core)
        with pytest.raises(error):
            core.add([1], [1], 0)
        assert ml_state(core) == before
    for sizes, times in (([1, 2], [1]), ([1, -1], [1, 1]), ([], [])):
        core = ml_core()
        before = ml_state(core)
        with pytest.raises(ValueError):
            core.add(sizes, times, 0)
        assert ml_state(core) == before


def test_ml_range_confirm_checks_invariants_and_changes_nothing_on_violation():
    core = ml_core()
    first, _ = core.add([10] * 5, [1] * 5, 0)
    before = ml_state(core)
    with pytest.raises(InvariantViolation):
        core.on_adds_confirmed(first + 1, 5, 1, 2)       # not the next entry to confirm
    with pytest.raises(InvariantViolation):
        core.on_adds_confirmed(first, 6, 0, 2)           # another ledger
    with pytest.raises(InvariantViolation):
        core.on_adds_confirmed(first, 5, 0, 6)           # past the adds pending
    with pytest.raises(InvariantViolation):
        core.on_adds_confirmed(first, 5, 0, 0)
    assert ml_state(core) == before
    core.on_adds_confirmed(first, 5, 0, 5)
    with pytest.raises(InvariantViolation):
        core.on_adds_confirmed(first, 5, 0, 1)           # confirmed already


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 20), data=st.data())
def test_ml_failure_in_the_middle_of_a_run_matches_runs_of_one(n, data):
    """Part of a run confirmed, then an add fails (retriable, or the ledger fenced): the same
    failures, in the same order, as with runs of one; later adds queue or fail the same way."""
    k = data.draw(st.integers(0, n - 1), label="failing offset")
    fenced = data.draw(st.booleans(), label="fenced")
    batch, single = ml_core(), ml_core()
    first, _ = batch.add([10] * n, list(range(n)), 0)
    add_one_by_one(single, [10] * n, list(range(n)))
    if k:
        batch.on_adds_confirmed(first, 5, 0, k)
        for i in range(k):
            single.on_adds_confirmed(i, 5, i, 1)
    error = LedgerFencedError("fenced") if fenced else NotEnoughBookiesError("no quorum")
    outs = []
    for core in (batch, single):
        out = []
        for i in range(k, n):       # the writer fails every add from the failed one on, in order
            out += core.on_add_failed(first + i, 5, error)
        out += expand_ml(core.add([1], [1], 0)[1]) if core.state is ManagedLedgerState.ROLLING_OVER else []
        outs.append(out)
    assert [type(a) for a in outs[0]] == [type(a) for a in outs[1]]
    assert [(a.add_id, type(a.error), str(a.error)) for a in outs[0] if isinstance(a, FailAdd)] == \
        [(a.add_id, type(a.error), str(a.error)) for a in outs[1] if isinstance(a, FailAdd)]
    assert [a.add_id for a in outs[0] if isinstance(a, FailAdd)] == list(range(first + k, first + n))
    assert batch.state is single.state
    assert batch.ledgers() == single.ledgers() and batch.last_confirmed == single.last_confirmed
    assert batch.pending_count == single.pending_count


# -- write core ---------------------------------------------------------------------------------
def md(ensemble_size=3, write_quorum=3, ack_quorum=2, bookies=None):
    bookies = bookies or tuple(f"b{i}:3181" for i in range(ensemble_size))
    return LedgerMetadata(ledger_id=9, ensemble_size=ensemble_size, write_quorum=write_quorum,
                          ack_quorum=ack_quorum, ensembles=((0, bookies),), ctime_ms=0, custom={})


def write_core(**kw):
    return LedgerWriteCore(md(**kw), add_timeout_ms=1000, ensemble_change_attempts_max=3)


def expand_sends(actions):
    """SendAddRun as the SendAdds it stands for, per bookie in order."""
    per_bookie = {}
    for a in actions:
        if isinstance(a, SendAddRun):
            n = len(a.payloads)
            for bookie, offsets in a.sends:
                for i in (range(n) if offsets is None else offsets):
                    per_bookie.setdefault(bookie, []).append(
                        SendAdd(bookie, a.first_entry_id + i, a.lac, a.lengths[i], a.payloads[i]))
        elif isinstance(a, SendAdd):
            per_bookie.setdefault(a.bookie, []).append(a)
    return per_bookie


def core_state(core):
    return (core.lac, core.lac_length, core.last_add_pushed, core.length, core.pending_count,
            {e: (a.payload, a.length, frozenset(a.acked), frozenset(a.sent)) for e, a in core._pending.items()})


def write_one_by_one(core, payloads, now_ms):
    actions = []
    for p in payloads:
        actions += core.add([p], now_ms)[1]
    return actions


quorums = st.sampled_from([(3, 3, 2), (3, 2, 2), (5, 3, 2), (4, 2, 1), (1, 1, 1)])


@settings(max_examples=150, deadline=None)
@given(q=quorums, before=st.integers(0, 4), payloads=st.lists(st.binary(max_size=40), min_size=1, max_size=25),
       seed=st.integers(0, 1000))
def test_write_core_one_run_or_runs_of_one_give_the_same_sends_and_confirmations(q, before, payloads, seed):
    e, w, a = q
    batch, single = write_core(ensemble_size=e, write_quorum=w, ack_quorum=a), \
        write_core(ensemble_size=e, write_quorum=w, ack_quorum=a)
    for core in (batch, single):
        write_one_by_one(core, [b"x" * i for i in range(before)], 0)
    first, actions = batch.add(payloads, 5)
    assert len(actions) == 1 and isinstance(actions[0], SendAddRun)
    expected = write_one_by_one(single, payloads, 5)
    assert first == before
    assert expand_sends(actions) == expand_sends(expected)
    assert core_state(batch) == core_state(single)
    # the same acks in the same (random) order give the same confirmations
    rng = random.Random(seed)
    acks = [(s.bookie, s.entry_id) for sends in expand_sends(expected).values() for s in sends]
    acks += [(b, i) for i in range(before) for b in batch.metadata.write_set(i)]
    rng.shuffle(acks)
    for bookie, entry_id in acks:
        out = [core.on_add_acks(bookie, [entry_id]) for core in (batch, single)]
        assert out[0] == out[1]
    assert core_state(batch) == core_state(single)
    assert batch.lac == before + len(payloads) - 1


@pytest.mark.parametrize("quorum", [(3, 3, 2), (3, 2, 2)])
def test_write_core_a_run_skips_an_unusable_bookie(quorum):
    """With a failed bookie that has no replacement (delayed ensemble change), a run goes to
    the others of each write set only, as runs of one do."""
    e, w, a = quorum
    batch, single = write_core(ensemble_size=e, write_quorum=w, ack_quorum=a), \
        write_core(ensemble_size=e, write_quorum=w, ack_quorum=a)
    for core in (batch, single):
        core.add([b"a"], 0)
        core.on_add_result("b1:3181", 0, AddOutcome.ERROR, 0, [], random.Random(1))   # no replacement
    first, actions = batch.add([b"x", b"yy", b"zzz"], 0)
    expected = write_one_by_one(single, [b"x", b"yy", b"zzz"], 0)
    assert first == 1
    sends = expand_sends(actions)
    assert "b1:3181" not in sends
    assert sends == expand_sends(expected)
    assert core_state(batch) == core_state(single)


def test_write_core_add_refused_changes_nothing():
    core = write_core()
    core.add([b"a"], 0)
    core.on_add_result("b0:3181", 0, AddOutcome.FENCED, 0, [], random.Random(1))
    before = core_state(core)
    with pytest.raises(LedgerFencedError):
        core.add([b"x"], 0)
    assert core_state(core) == before
    core = write_core()
    core.close()
    with pytest.raises(LedgerClosedError):
        core.add([b"x"], 0)
    with pytest.raises(ValueError):
        write_core().add([], 0)


@pytest.mark.parametrize("fenced", [True, False])
def test_write_core_failure_in_the_middle_of_a_run(fenced):
    """Entries 0..9 as one run; 0..3 get their quorum, then entry 4 fails: FailAdds from 4 on,
    as with runs of one, and nothing is confirmed after it."""
    batch, single = write_core(), write_core()
    batch.add([bytes([i]) * 3 for i in range(10)], 0)
    write_one_by_one(single, [bytes([i]) * 3 for i in range(10)], 0)
    outs = []
    for core in (batch, single):
        out = core.on_add_acks("b0:3181", list(range(10)))
        out += core.on_add_acks("b1:3181", list(range(4)))
        if fenced:
            out += core.on_add_result("b1:3181", 4, AddOutcome.FENCED, 0, [], random.Random(1))
        else:
            out += core.on_add_result("b1:3181", 4, AddOutcome.ERROR, 0, [], random.Random(1))
            out += core.on_add_result("b2:3181", 4, AddOutcome.ERROR, 0, [], random.Random(1))
            out += core.on_tick(2000, [], random.Random(1))   # entry 4 cannot reach Qa: timed out
        outs.append(out)
    assert outs[0][0] == ConfirmAdds(3)
    fails = [a for a in outs[0] if isinstance(a, FailAdds)]
    assert len(fails) == 1 and fails[0].first_entry_id == 4
    assert [type(a) for a in outs[0]] == [type(a) for a in outs[1]]
    assert [(type(a.error), str(a.error)) for a in outs[0] if isinstance(a, FailAdds)] == \
        [(type(a.error), str(a.error)) for a in outs[1] if isinstance(a, FailAdds)]
    assert core_state(batch) == core_state(single)


# -- bookie client: chunked outbound queue ----------------------------------------------------
def old_take_batch(flat, entries_max, bytes_max):
    """The per-entry algorithm the chunked one must match: (entry ids taken, the rest)."""
    taken, size = [], 0
    rest = list(flat)
    recovery = rest[0][2]
    while rest and len(taken) < entries_max:
        entry_id, entry, rec = rest[0]
        size += len(entry)
        if rec != recovery or (taken and size > bytes_max):
            break
        rest.pop(0)
        taken.append(entry_id)
    return taken, rest


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.tuples(st.lists(st.integers(1, 60), min_size=1, max_size=12), st.booleans()),
                       min_size=1, max_size=8),
       entries_max=st.integers(1, 20), bytes_max=st.integers(1, 300))
def test_bookie_client_chunks_make_the_same_requests_as_single_adds(chunks, entries_max, bytes_max):
    from bookie.client.bookie_client import BookieClient
    from pulsarlite.config import LedgerClientConfig

    config = LedgerClientConfig(add_batch_entries_max=entries_max, add_batch_bytes_max=bytes_max)
    client = BookieClient("b:1", config)
    flat = []
    entry_of = {}
    next_id = 0
    callback = object()
    for sizes, recovery in chunks:
        ids = list(range(next_id, next_id + len(sizes)))
        entries = [bytes([i % 256]) * s for i, s in zip(ids, sizes)]
        next_id += len(sizes)
        client._outbound.append((ids, entries, recovery, callback))
        flat += [(i, e, recovery) for i, e in zip(ids, entries)]
        entry_of.update(zip(ids, entries))
    request_id = 1
    while client._outbound:
        body, taken = client._take_batch(request_id)
        expected, flat = old_take_batch(flat, entries_max, bytes_max)
        got_ids = [e for ids, cb in taken for e in ids]
        assert got_ids == expected
        assert all(cb is callback for _, cb in taken)
        assert body[:-1] == [entry_of[i] for i in expected]      # then the request's tail
        request_id += 1
    assert flat == []


# -- the publish path end to end in one process (fake bookie sockets) -----------------------------
BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")


class FakeBookieSocket:
    """The transport of one BookieClient: AddRequests are answered when the test says so, from
    the client's in-flight table, with a status per entry."""

    def __init__(self, client) -> None:
        self.client = client
        self.conn = None
        self.written = []
        self.answered: set[int] = set()

    def get_extra_info(self, name, default=None):
        return default

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def write(self, data) -> None:
        self.written.append(bytes(data))

    def writelines(self, parts) -> None:
        self.written.append(b"".join(bytes(p) for p in parts))

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def answer(self, code_of, requests_max=None) -> int:
        """Answer up to ``requests_max`` outstanding requests, oldest first."""
        from bookie._proto import bookie_rpc_pb2 as bpb
        from bookie.transport import encode_frame
        done = 0
        for request_id in sorted(self.client._inflight):
            if requests_max is not None and done >= requests_max:
                break
            entry_ids = [e for ids, _ in self.client._inflight[request_id] for e in ids]
            results = [bpb.AddResult(ledger_id=1, entry_id=e, code=code_of(self.client.bookie_id, e))
                       for e in entry_ids]
            body = bpb.AddResponse(results=results, request_id=request_id).SerializeToString()
            self.conn.data_received(encode_frame(bpb.FRAME_ADD_RESPONSE, request_id, body))
            done += 1
        return done


class FakeLedgerManager:
    """Ledger metadata writes (an ensemble change) always succeed."""

    def __init__(self) -> None:
        self.written = []

    async def write(self, md, version):
        self.written.append(md)
        return version + 1


class ProducerSocket:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data) -> None:
        self.data += data

    def writelines(self, parts) -> None:
        for p in parts:
            self.data += p

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class PathService:
    def __init__(self, config) -> None:
        from broker.topic import EntryCache, PublishBuffer
        self.config = config
        self.entry_cache = EntryCache(config.dispatch.entry_cache_bytes_max)
        self.publish_buffer = PublishBuffer(config.publish_buffer_bytes_max)
        self.store = None
        self.add_errors = []
        self.unloads = []

        class Ownership:
            def write_guard(self, name):
                return lambda: True
        self.ownership = Ownership()

    def on_add_error(self, error) -> None:
        self.add_errors.append(type(error).__name__)

    async def unload_topic(self, key, **kw) -> bool:
        self.unloads.append(key)
        return True


def connect_fake_sockets(client) -> dict:
    """Each of BOOKIES' clients in ``client``'s pool connected to a FakeBookieSocket: bookie ->
    socket."""
    from bookie.client.bookie_client import _Connection
    sockets = {}
    for bookie in BOOKIES:
        bc = client.pool.get(bookie)
        sock = FakeBookieSocket(bc)
        conn = _Connection(bc, 64 << 20)
        conn.connection_made(sock)
        sock.conn = conn
        bc._conn = conn
        sockets[bookie] = sock
    return sockets


async def publish_path(*, pending_adds_max: int, add_batch_entries_max: int):
    from bookie.client.ledger_client import LedgerClient, LedgerWriter
    from broker.config import BrokerConfig
    from broker.connection import ServerConnection, _ProducerRef
    from broker.managed_ledger import ManagedLedger
    from broker.managed_ledger.config import ManagedLedgerConfig
    from broker.topic import PersistentTopic
    from pulsarlite.config import LedgerClientConfig
    from pulsarlite.topic_name import TopicName
    from pulsarlite.wire import commands as c

    client = LedgerClient(None, LedgerClientConfig(add_batch_entries_max=add_batch_entries_max), owns_store=False)
    client.writable_bookies = list(BOOKIES)
    client.ledger_manager = FakeLedgerManager()
    sockets = connect_fake_sockets(client)
    metadata = LedgerMetadata(ledger_id=1, ensemble_size=3, write_quorum=3, ack_quorum=2,
                              ensembles=((0, BOOKIES),), ctime_ms=0, custom={})
    writer = LedgerWriter(client, metadata, 0)
    ml = ManagedLedger("public/default/persistent/runs", client, None,
                       ManagedLedgerConfig(pending_adds_max=pending_adds_max).validate(), lambda: 0, None)
    ml._writer = writer
    ml._run(ml._core.on_opened(ManagedLedgerMetadata((LedgerInfo(1, created_ms=0),))))
    config = BrokerConfig(managed_ledger=ManagedLedgerConfig(pending_adds_max=pending_adds_max))
    service = PathService(config)
    topic = PersistentTopic(service, TopicName.parse("persistent://public/default/runs"), ml)
    conn = ServerConnection(service)
    sink = ProducerSocket()
    conn.connection_made(sink)
    conn.data_received(c.connect("runs", 19))
    ref = _ProducerRef(conn, 0)
    ref.topic = topic
    ref.producer = topic.add_producer(ref, "p", conn)
    conn._producers[0] = ref
    return conn, ref, topic, ml, writer, sockets, sink, service


def decode_out(data: bytes):
    from pulsarlite.wire import pb
    from pulsarlite.wire.frames import FrameDecoder
    out = []
    for frame in FrameDecoder().feed(bytes(data)):
        cmd = frame.command
        if cmd.type == pb.BaseCommand.SEND_RECEIPT:
            r = cmd.send_receipt
            out.append(("receipt", r.sequence_id, r.message_id.ledgerId, r.message_id.entryId))
        elif cmd.type == pb.BaseCommand.SEND_ERROR:
            out.append(("error", cmd.send_error.sequence_id, cmd.send_error.error))
        elif cmd.type != pb.BaseCommand.CONNECTED:
            out.append((pb.BaseCommand.Type.Name(cmd.type),))
    return out


async def drive(chunks, *, fail_at=None, pending_adds_max=10_000, add_batch_entries_max=1000,
                requests_per_turn=None):
    """Feed SEND frames in reads of ``chunks`` sizes, answering the bookies between reads (one
    request per bookie per turn with ``requests_per_turn=1``: runs get confirmed in parts).
    ``fail_at``: (bookie, entry id, status) answered instead of OK for that one entry."""
    import asyncio

    from bookie._proto import bookie_rpc_pb2 as bpb
    from pulsarlite.wire import commands as c
    from pulsarlite.wire.entry import Message, build_entry

    conn, ref, topic, ml, writer, sockets, sink, service = await publish_path(
        pending_adds_max=pending_adds_max, add_batch_entries_max=add_batch_entries_max)
    taken_runs = []
    real_add_entries = ml.add_entries

    def counting_add_entries(payloads, times, done, context):
        taken_runs.append(len(payloads))
        return real_add_entries(payloads, times, done, context)
    ml.add_entries = counting_add_entries

    def code_of(bookie, entry_id):
        if fail_at is not None and (bookie, entry_id) == fail_at[:2]:
            return fail_at[2]
        return bpb.OK
    seq = 0
    try:
        for size in chunks:
            frames = [c.send(0, s, build_entry(Message(f"m{s}".encode()), producer_name="p", sequence_id=s,
                                               publish_time_ms=1_000 + s)) for s in range(seq, seq + size)]
            seq += size
            conn.data_received(b"".join(frames))
            for _ in range(3):
                await asyncio.sleep(0)
            for sock in sockets.values():
                sock.answer(code_of, requests_per_turn)
            for _ in range(3):
                await asyncio.sleep(0)
        for _ in range(200):       # the rest answered, bounded
            if not ref.producer.pending or ref.producer.closed:
                break
            for sock in sockets.values():
                sock.answer(code_of, requests_per_turn or None)
            for _ in range(3):
                await asyncio.sleep(0)
        await asyncio.sleep(0)
        sent = {b: b"".join(s.written) for b, s in sockets.items()}
        return {"out": decode_out(sink.data), "ledgers": ml.ledgers(), "state": ml.state,
                "last": ml.last_confirmed_position, "sent": sent, "pending": len(ref.producer.pending),
                "add_errors": service.add_errors, "unloads": service.unloads,
                "cache": [service.entry_cache.get(topic.key, Position(1, e)) for e in range(seq + 1)],
                "msg_in": topic.msg_in, "bytes_in": topic.bytes_in, "entries_added": topic.entries_added,
                "publish_buffer": service.publish_buffer.bytes, "in_flight": topic.core.adds_in_flight,
                "latencies_counted": topic.publish_latency.total}, taken_runs
    finally:
        writer._stop_ticker()
        for task in list(conn._tasks) + list(topic._tasks):
            task.cancel()
        if conn._keepalive is not None:
            conn._keepalive.cancel()


async def both_paths(monkeypatch, **kw):
    """The same reads of SENDs, each read's SENDs given to the topic as one run (as the
    connection does), and cut into runs of one: (runs result, runs-of-one result, the sizes of
    the runs the managed ledger got with runs)."""
    from broker.connection import ServerConnection
    runs_result, taken = await drive(**kw)
    with monkeypatch.context() as m:
        m.setattr(ServerConnection, "_send_run_end", staticmethod(lambda frames, start: start + 1))
        single_result, single_taken = await drive(**kw)
    assert set(single_taken) <= {1}
    return runs_result, single_result, taken


@pytest.mark.parametrize("requests_per_turn", [None, 1])
async def test_runs_give_the_same_receipts_entries_and_state_as_runs_of_one(monkeypatch, requests_per_turn):
    chunks = [20, 1, 20, 7, 33, 2, 20, 20]
    got, expected, taken = await both_paths(monkeypatch, chunks=chunks, add_batch_entries_max=7,
                                             requests_per_turn=requests_per_turn)
    assert taken == chunks          # each read's SENDs reached the managed ledger as one run
    assert got == expected
    receipts = got["out"]
    assert [r[0] for r in receipts] == ["receipt"] * sum(chunks)
    assert [r[1] for r in receipts] == list(range(sum(chunks)))                 # in send order
    assert [r[3] for r in receipts] == list(range(sum(chunks)))                 # positions increasing
    assert got["pending"] == 0 and got["in_flight"] == 0 and got["publish_buffer"] == 0
    assert got["msg_in"] == sum(chunks) and got["entries_added"] == sum(chunks)
    assert got["latencies_counted"] == sum(chunks)      # one publish latency per SEND, both paths


async def test_every_send_counts_in_the_publish_latency_not_a_capped_sample(monkeypatch):
    """The histogram once kept only the first 1,024 latencies of each stats interval (the start
    of the interval, at 5k msg/s 0.2 s of 5 s): every SEND is counted now, runs and single."""
    got, expected, _ = await both_paths(monkeypatch, chunks=[700, 700], add_batch_entries_max=1000)
    assert got["latencies_counted"] == expected["latencies_counted"] == 1400


@pytest.mark.parametrize("status", ["FENCED", "UNAVAILABLE"])
async def test_a_failure_in_the_middle_of_a_run_is_handled_as_with_runs_of_one(monkeypatch, status):
    from bookie._proto import bookie_rpc_pb2 as bpb
    if status == "FENCED":
        fail_at = (BOOKIES[1], 27, bpb.FENCED)
    else:
        fail_at = (BOOKIES[1], 27, bpb.UNAVAILABLE)
    got, expected, taken = await both_paths(monkeypatch, chunks=[20, 20, 20], fail_at=fail_at,
                                             add_batch_entries_max=1000)
    if status == "UNAVAILABLE":
        # one bookie failing leaves Qa=2 of 3: everything is still confirmed, in order; once it
        # is unusable, runs go to the other two
        assert [r[0] for r in got["out"]] == ["receipt"] * 60
        assert taken == [20, 20, 20]
    else:
        kinds = [r[0] for r in got["out"]]
        assert kinds[:27] == ["receipt"] * 27 and "receipt" not in kinds[27:]
        assert got["state"] is ManagedLedgerState.FENCED and got["unloads"]
    # runs behave exactly as runs of one (entries, receipts, errors, state)
    assert got["out"] == expected["out"]
    assert got["ledgers"] == expected["ledgers"] and got["last"] == expected["last"]
    assert got["state"] is expected["state"]
    assert got["add_errors"] == expected["add_errors"]
    assert got["sent"] == expected["sent"]
    assert got["cache"] == expected["cache"]


async def test_no_room_under_pending_adds_max_splits_a_run_at_the_limit(monkeypatch):
    got, expected, taken = await both_paths(monkeypatch, chunks=[20, 20, 20], pending_adds_max=30,
                                            requests_per_turn=0)
    # the first run fits (20 of 30); of the second, 10 are added and 10 wait in the backlog,
    # and the third waits behind them, until the bookies answer (the backlog then drains as runs)
    assert taken[:2] == [20, 10] and sum(taken) == 60
    assert got == expected
    assert [r[1] for r in got["out"]] == list(range(60))


# -- receipts of a run ------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(producer_id=st.integers(0, (1 << 64) - 1),
       receipts=st.lists(st.tuples(st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1),
                                   st.integers(-1, (1 << 63) - 1), st.integers(-1, (1 << 63) - 1)),
                         max_size=8),
       same=st.booleans())
def test_send_receipts_are_byte_for_byte_single_receipts(producer_id, receipts, same):
    from pulsarlite.wire import commands as c
    if same:      # the common case: highest == sequence id, one ledger
        receipts = [(s, s, receipts[0][2], e) for s, _, _, e in receipts]
    assert c.send_receipts(producer_id, receipts) == b"".join(
        c.send_receipt(producer_id, s, lid, eid, highest_sequence_id=h) for s, h, lid, eid in receipts)


def test_send_receipts_refuse_ids_out_of_range():
    from pulsarlite.wire import commands as c
    for bad in ((-1, [(1, 1, 1, 1)]), (1, [(-1, 1, 1, 1)]), (1, [(1, 1 << 64, 1, 1)])):
        with pytest.raises(ValueError):
            c.send_receipts(*bad)


# -- the ledger writer's waiters: runs (of one or more) in entry order ---------------------------------
async def test_writer_completes_runs_in_entry_order_and_fails_from_an_entry_on():
    import asyncio

    conn, ref, topic, ml, writer, sockets, sink, service = await publish_path(
        pending_adds_max=1000, add_batch_entries_max=1000)
    try:
        calls = []
        def done(kind, f, l, err):
            calls.append((kind, f, l, err))
        writer.add_entries([b"a"], done, "single")
        first = writer.add_entries([b"b", b"c", b"d", b"e", b"f"], done, "run")
        writer.add_entries([b"g"], done, "single")
        fut = writer.add_async(b"h")
        assert first == 1
        # the run's entries are encoded once: every bookie's queue holds the same bytes objects
        chunks = [writer._client.pool.get(b)._outbound[1] for b in BOOKIES]
        assert [list(ids) for ids, _, _, _ in chunks] == [[1, 2, 3, 4, 5]] * 3
        assert all(a is b for c in chunks[1:] for a, b in zip(c[1], chunks[0][1]))
        await asyncio.sleep(0)
        assert calls == []                   # never from inside the add calls
        writer._confirm(2)                   # entries 0..2: the single, then part of the run
        assert calls == [("single", 0, 0, None), ("run", 1, 2, None)]
        error = NotEnoughBookiesError("gone")
        writer._fail(4, error)               # from entry 4 on (inside the run): its tail fails
        assert calls[2:] == [("run", 4, 5, error), ("single", 6, 6, error)]
        assert fut.done() and fut.exception() is error
        writer._confirm(3)                   # the run's entry 3 still waited
        assert calls[4:] == [("run", 3, 3, None)]
        assert not writer._waiting
    finally:
        writer._stop_ticker()
        if conn._keepalive is not None:
            conn._keepalive.cancel()
