"""The publish path's shortcuts for one SEND per read and one add per bookie request (PACED):
each must behave exactly as the general code it bypasses."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie._proto import bookie_rpc_pb2 as bpb
from bookie.client.actions import AddOutcome, ConfirmAdds, FailAdds
from bookie.client.metadata import LedgerMetadata
from bookie.client.write_core import LedgerWriteCore
from bookie.transport import encode_frame
from pulsarlite.config import LedgerClientConfig
from unit.test_publish_runs import BOOKIES, FakeLedgerManager, connect_fake_sockets, drive

OUTCOME = {bpb.OK: AddOutcome.OK, bpb.FENCED: AddOutcome.FENCED, bpb.READ_ONLY: AddOutcome.READ_ONLY,
           bpb.NO_SUCH_LEDGER: AddOutcome.NO_SUCH_LEDGER,
           bpb.INTERNAL: AddOutcome.ERROR}
SPARE = "127.0.0.1:3184"          # writable, outside the ensemble: an ensemble change can use it


def metadata():
    return LedgerMetadata(ledger_id=1, ensemble_size=3, write_quorum=3, ack_quorum=2,
                          ensembles=((0, BOOKIES),), ctime_ms=0, custom={})


def core_state(core: LedgerWriteCore):
    return (core.lac, core.last_add_pushed, {e: (sorted(a.acked), sorted(a.sent)) for e, a in core._pending.items()},
            sorted(core._unusable), core._proposed, type(core.error).__name__, core.is_fenced)


def connected_client(config: LedgerClientConfig | None = None):
    from bookie.client.ledger_client import LedgerClient

    client = LedgerClient(None, config or LedgerClientConfig(), owns_store=False)
    client.writable_bookies = list(BOOKIES) + [SPARE]
    client.ledger_manager = FakeLedgerManager()
    return client, connect_fake_sockets(client)


answers = st.lists(st.tuples(st.integers(0, 3),                      # bookie (3: not in the ensemble)
                             st.lists(st.tuples(st.integers(0, 5),    # entry id
                                                st.sampled_from([bpb.OK] * 6 + [bpb.READ_ONLY, bpb.INTERNAL, bpb.NO_SUCH_LEDGER,
                                                                                bpb.FENCED])),
                                      min_size=1, max_size=3)),
                   max_size=30)


@settings(max_examples=300, deadline=None)
@given(entries=st.integers(1, 5), answers=answers)
def test_writer_answers_change_the_core_as_the_general_code_did(entries, answers):
    """LedgerWriter._on_add_results (with its shortcuts: an OK for an entry already confirmed,
    the third replica's, is skipped; one answer goes straight to on_add_acks) against the code it
    replaces, run on a second core: every OK of an answer to on_add_acks, then each failure to
    on_add_result. The same confirmations, failures and core state after every answer
    (a failure from a bookie after the confirmation included)."""
    asyncio.run(_compare(entries, answers))


async def _compare(entries, answers):
    from bookie.client.ledger_client import LedgerWriter

    client, _ = connected_client()
    client.rng = random.Random(7)
    writer = LedgerWriter(client, metadata(), 0)
    ref = LedgerWriteCore(metadata(), add_timeout_ms=60_000, ensemble_change_attempts_max=3)
    ref_rng = random.Random(7)
    got: list[tuple[int, bool]] = []
    expected: list[tuple[int, bool]] = []
    try:
        for _ in range(entries):
            writer.add_entries([b"x"], lambda _, e, last, err: got.append((e, err is None)), None)
            ref.add([b"x"], 0)
        for bookie_index, results in answers:
            bookie = (BOOKIES + (SPARE,))[bookie_index]
            writer._on_add_results(bookie, list(results))
            # the reference: what _on_add_results did before the shortcuts
            actions = []
            ok = [e for e, code in results if code == bpb.OK]
            if ok:
                actions += ref.on_add_acks(bookie, ok)
            for e, code in results:
                if code != bpb.OK:
                    actions += ref.on_add_result(bookie, e, OUTCOME[code], 0, client.writable_bookies, ref_rng)
            for a in actions:
                if isinstance(a, ConfirmAdds):
                    first = expected[-1][0] + 1 if expected else 0
                    expected += [(e, True) for e in range(first, a.last_entry_id + 1)]
                elif isinstance(a, FailAdds):
                    expected += [(e, False) for e in range(a.first_entry_id, ref.last_add_pushed + 1)]
            assert got == expected
            assert core_state(writer._core) == core_state(ref)
    finally:
        writer._stop_ticker()
        for task in list(writer._metadata_tasks):
            task.cancel()


def writer_with_an_add_acked_once():
    """A ledger writer with entry 0 added and acknowledged by the first bookie only: (writer,
    the add's completions)."""
    from bookie.client.ledger_client import LedgerWriter

    client, _ = connected_client()
    writer = LedgerWriter(client, metadata(), 0)
    done = []
    writer.add_entries([b"x"], lambda _, e, last, err: done.append((e, err)), None)
    writer._on_add_results(BOOKIES[0], [(0, bpb.OK)])
    return writer, done


async def test_the_third_replicas_ok_after_the_confirmation_changes_nothing(monkeypatch):
    """The shortcut is taken (the core is not called) and nothing is confirmed twice."""
    writer, done = writer_with_an_add_acked_once()
    try:
        writer._on_add_results(BOOKIES[1], [(0, bpb.OK)])
        assert done == [(0, None)] and writer.last_add_confirmed == 0
        calls = []
        monkeypatch.setattr(writer._core, "on_add_acks", lambda *a: calls.append(a) or [])
        writer._on_add_results(BOOKIES[2], [(0, bpb.OK)])
        assert calls == [] and done == [(0, None)]
        # a failure from the third bookie still reaches the core (as before: a stale answer)
        seen = []
        real = writer._core.on_add_result
        monkeypatch.setattr(writer._core, "on_add_result", lambda *a: seen.append(a[:3]) or real(*a))
        writer._on_add_results(BOOKIES[2], [(0, bpb.READ_ONLY)])
        assert seen == [(BOOKIES[2], 0, AddOutcome.READ_ONLY)]
    finally:
        writer._stop_ticker()


async def test_a_failure_from_the_second_bookie_still_changes_the_ensemble():
    writer, done = writer_with_an_add_acked_once()
    try:
        writer._on_add_results(BOOKIES[1], [(0, bpb.READ_ONLY)])
        assert done == []
        assert BOOKIES[1] in writer._core._unusable
        assert writer._core._proposed is not None and SPARE in writer._core._proposed.current_ensemble
        for _ in range(5):
            await asyncio.sleep(0)
        assert writer._client.ledger_manager.written, "the ensemble change was written"
    finally:
        writer._stop_ticker()


# -- bookie clients: one pump callback per loop turn for all of them --------------------------------
async def test_one_loop_callback_pumps_every_bookie_client(monkeypatch):
    client, sockets = connected_client()
    loop = asyncio.get_running_loop()
    scheduled = []
    real_call_soon = loop.call_soon

    def counting(callback, *args, **kw):
        scheduled.append(callback)
        return real_call_soon(callback, *args, **kw)
    monkeypatch.setattr(loop, "call_soon", counting)
    results = []
    for bookie in BOOKIES:
        client.pool.get(bookie).send_add(0, b"entry", False, lambda b, r: results.append((b, r)))
    monkeypatch.setattr(loop, "call_soon", real_call_soon)
    assert len(scheduled) == 1
    await asyncio.sleep(0)
    assert [len(sockets[b].written) for b in BOOKIES] == [1, 1, 1]
    # each request is what the general path writes for one add
    for bookie in BOOKIES:
        bc = client.pool.get(bookie)
        assert list(bc._inflight) == [1]
        assert sockets[bookie].written[0].endswith(b"entry\x18\x01")
    await client.pool.close()


async def test_a_failing_pump_does_not_stop_the_others(caplog):
    client, sockets = connected_client()

    def broken(parts):
        raise RuntimeError("socket bug")
    sockets[BOOKIES[0]].writelines = broken
    for bookie in BOOKIES:
        client.pool.get(bookie).send_add(0, b"entry", False, lambda b, r: None)
    with caplog.at_level(logging.ERROR, logger="pulsarlite.ledger_client"):
        await asyncio.sleep(0)
    assert [len(sockets[b].written) for b in BOOKIES] == [0, 1, 1]
    assert "add pump failed" in caplog.text
    # the group is usable again
    client.pool.get(BOOKIES[1]).send_add(1, b"entry", False, lambda b, r: None)
    await asyncio.sleep(0)
    assert len(sockets[BOOKIES[1]].written) == 2
    await client.pool.close()


# -- bookie clients: pumps paced by add_flush_interval_ms --------------------------------------------
def _capture_call_later(monkeypatch, loop):
    captured = []
    real = loop.call_later

    def capturing(delay, callback, *args, **kw):
        handle = real(3600, callback, *args, **kw)    # never fires by itself in the test
        captured.append((delay, callback, handle))
        return handle
    monkeypatch.setattr(loop, "call_later", capturing)
    return captured


async def test_paced_pump_idle_bookies_go_at_once_busy_ones_wait_for_the_interval(monkeypatch):
    client, sockets = connected_client(LedgerClientConfig(add_flush_interval_ms=1000.0).validate())
    loop = asyncio.get_running_loop()
    captured = _capture_call_later(monkeypatch, loop)
    results = []
    callback = lambda b, r: results.append((b, r))        # noqa: E731
    for bookie in BOOKIES:            # idle bookies: on the next loop turn, as without pacing
        client.pool.get(bookie).send_add(0, b"entry0", False, callback)
    await asyncio.sleep(0)
    assert [len(sockets[b].written) for b in BOOKIES] == [1, 1, 1]
    assert captured == []
    # request 1 is outstanding at every bookie: the next adds wait for the interval, together
    for entry_id in (1, 2, 3):
        for bookie in BOOKIES:
            client.pool.get(bookie).send_add(entry_id, b"entry%d" % entry_id, False, callback)
        await asyncio.sleep(0)
    assert [len(sockets[b].written) for b in BOOKIES] == [1, 1, 1]
    assert len(captured) == 1
    delay, run, handle = captured[0]
    assert 0 < delay <= 1.0           # the interval counted from the first pump
    handle.cancel()
    run()
    # one AddRequest per bookie carrying entries 1-3
    for bookie in BOOKIES:
        assert len(sockets[bookie].written) == 2
        (request_id, chunks), = [(r, c) for r, c in client.pool.get(bookie)._inflight.items() if r != 1]
        assert [e for ids, _ in chunks for e in ids] == [1, 2, 3]
    await client.pool.close()


async def _entry0_out_at_every_bookie(monkeypatch, config: LedgerClientConfig):
    """A paced client whose three bookies each have entry 0's request outstanding: (client,
    fake sockets, the captured call_later timers, an add callback)."""
    client, sockets = connected_client(config)
    captured = _capture_call_later(monkeypatch, asyncio.get_running_loop())
    callback = lambda b, r: None       # noqa: E731
    for bookie in BOOKIES:
        client.pool.get(bookie).send_add(0, b"entry0", False, callback)
    await asyncio.sleep(0)
    return client, sockets, captured, callback


async def test_paced_pump_an_idle_bookie_does_not_wait_for_a_busy_ones_interval(monkeypatch):
    client, sockets, captured, callback = await _entry0_out_at_every_bookie(
        monkeypatch, LedgerClientConfig(add_flush_interval_ms=1000.0).validate())
    sockets[BOOKIES[1]].answer(lambda b, e: bpb.OK)   # bookie 1 is idle again, 0 and 2 are not
    client.pool.get(BOOKIES[0]).send_add(1, b"entry1", False, callback)   # busy: waits
    assert len(captured) == 1
    client.pool.get(BOOKIES[1]).send_add(1, b"entry1", False, callback)   # idle: next turn, for all
    client.pool.get(BOOKIES[2]).send_add(1, b"entry1", False, callback)
    await asyncio.sleep(0)
    assert [len(sockets[b].written) for b in BOOKIES] == [2, 2, 2]
    assert captured[0][2].cancelled()
    await client.pool.close()


async def test_paced_pump_after_a_quiet_interval_goes_at_once(monkeypatch):
    client, sockets = connected_client(LedgerClientConfig(add_flush_interval_ms=1000.0).validate())
    loop = asyncio.get_running_loop()
    captured = _capture_call_later(monkeypatch, loop)
    for bookie in BOOKIES:
        client.pool.get(bookie).send_add(0, b"entry0", False, lambda b, r: None)
    await asyncio.sleep(0)
    group = client.pool._pump_group
    group._last_run_s -= 2.0          # the last pump was longer ago than the interval
    client.pool.get(BOOKIES[0]).send_add(1, b"entry1", False, lambda b, r: None)   # busy, but due
    await asyncio.sleep(0)
    assert len(sockets[BOOKIES[0]].written) == 2
    assert captured == []
    await client.pool.close()


@pytest.mark.parametrize("adds_max, waiting, released", [(0, 1, False), (2, 1, True), (2, 2, True), (2, 3, False)])
async def test_paced_pump_a_bookie_gone_idle_with_few_adds_waiting_ends_the_interval(
        monkeypatch, adds_max, waiting, released):
    """Adds wait for the interval while every bookie has a request outstanding. The answer that
    leaves a bookie with none outstanding pumps the group on the next loop turn (every bookie's
    waiting adds go) when at most add_flush_on_idle_adds_max adds wait there; with more (a load
    the interval gathers into one request) or with the option off, they wait for the timer."""
    config = LedgerClientConfig(add_flush_interval_ms=1000.0, add_flush_on_idle_adds_max=adds_max).validate()
    client, sockets, captured, callback = await _entry0_out_at_every_bookie(monkeypatch, config)
    for entry_id in range(1, 1 + waiting):    # busy everywhere: these wait for the interval
        for bookie in BOOKIES:
            client.pool.get(bookie).send_add(entry_id, b"entry%d" % entry_id, False, callback)
    await asyncio.sleep(0)
    assert [len(sockets[b].written) for b in BOOKIES] == [1, 1, 1]
    assert len(captured) == 1
    sockets[BOOKIES[2]].answer(lambda b, e: bpb.OK)   # bookie 2 answers entry 0: idle again
    await asyncio.sleep(0)
    assert captured[0][2].cancelled() is released
    assert [len(sockets[b].written) for b in BOOKIES] == ([2, 2, 2] if released else [1, 1, 1])
    if released:      # one request per bookie with every waiting add
        for bookie in BOOKIES:
            (chunks,) = [c for r, c in client.pool.get(bookie)._inflight.items() if r != 1]
            assert [e for ids, _ in chunks for e in ids] == list(range(1, 1 + waiting))
    await client.pool.close()


async def test_paced_pump_an_answer_that_leaves_a_request_outstanding_does_not_end_the_interval(monkeypatch):
    config = LedgerClientConfig(add_flush_interval_ms=1000.0, add_flush_on_idle_adds_max=2,
                                add_requests_in_flight_max=2).validate()
    client, sockets = connected_client(config)
    loop = asyncio.get_running_loop()
    captured = _capture_call_later(monkeypatch, loop)
    callback = lambda b, r: None       # noqa: E731
    bc = client.pool.get(BOOKIES[0])
    bc.send_add(0, b"entry0", False, callback)
    await asyncio.sleep(0)
    group = client.pool._pump_group
    group._last_run_s -= 2.0                     # due at once: request 2 leaves
    bc.send_add(1, b"entry1", False, callback)
    await asyncio.sleep(0)
    assert len(bc._inflight) == 2
    bc.send_add(2, b"entry2", False, callback)   # waits for the interval
    await asyncio.sleep(0)
    assert len(captured) == 1
    sockets[BOOKIES[0]].answer(lambda b, e: bpb.OK, requests_max=1)   # request 2 still out
    await asyncio.sleep(0)
    assert not captured[0][2].cancelled() and len(sockets[BOOKIES[0]].written) == 2
    await client.pool.close()


def test_add_flush_interval_is_checked():
    from broker.config import BrokerConfig
    from pulsarlite.config import from_mapping
    from pulsarlite.errors import ConfigError
    for bad in (-1.0, float("nan"), 1000.5):
        with pytest.raises(ConfigError, match="add_flush_interval_ms"):
            LedgerClientConfig(add_flush_interval_ms=bad).validate()
        with pytest.raises(ConfigError, match=r"\[ledger_client\].*add_flush_interval_ms"):
            from_mapping(BrokerConfig, {"ledger_client": {"add_flush_interval_ms": bad}})
    assert from_mapping(BrokerConfig, {"ledger_client": {"add_flush_interval_ms": 2.5}}) \
        .ledger_client_config().add_flush_interval_ms == 2.5
    for bad in (-1, 1.5, True, 1_000_001):
        with pytest.raises(ConfigError, match="add_flush_on_idle_adds_max"):
            LedgerClientConfig(add_flush_on_idle_adds_max=bad).validate()
        with pytest.raises(ConfigError, match=r"\[ledger_client\].*add_flush_on_idle_adds_max"):
            from_mapping(BrokerConfig, {"ledger_client": {"add_flush_on_idle_adds_max": bad}})
    assert from_mapping(BrokerConfig, {"ledger_client": {"add_flush_on_idle_adds_max": 3}}) \
        .ledger_client_config().add_flush_on_idle_adds_max == 3


# -- bookie clients: a read of exactly one AddResponse ------------------------------------------------
def _response(request_id, entry_ids, code=bpb.OK):
    body = bpb.AddResponse(results=[bpb.AddResult(ledger_id=1, entry_id=e, code=code) for e in entry_ids],
                           request_id=request_id).SerializeToString()
    return encode_frame(bpb.FRAME_ADD_RESPONSE, request_id, body)


@pytest.mark.parametrize("split", [None, 1, 5, 13, 14])
async def test_one_add_response_whole_or_split_gives_the_same_results(split):
    client, sockets = connected_client()
    bc = client.pool.get(BOOKIES[0])
    results = []
    bc.send_add(4, b"entry", False, lambda b, r: results.append((b, r)))
    await asyncio.sleep(0)
    data = _response(1, [4], bpb.READ_ONLY)
    conn = sockets[BOOKIES[0]].conn
    if split is None:
        conn.data_received(data)
    else:
        conn.data_received(data[:split])
        assert results == []
        conn.data_received(data[split:])
    assert results == [(BOOKIES[0], [(4, bpb.READ_ONLY)])]
    assert bc._inflight == {} and bc._conn is conn
    await client.pool.close()


async def test_a_garbled_add_response_drops_the_connection_and_fails_the_adds():
    client, sockets = connected_client()
    bc = client.pool.get(BOOKIES[0])
    results = []

    def callback(b, r):
        results.append((b, r))
    bc.send_add(4, b"entry", False, callback)
    bc.send_add(5, b"entry", False, callback)
    await asyncio.sleep(0)
    conn = sockets[BOOKIES[0]].conn
    conn.data_received(encode_frame(bpb.FRAME_ADD_RESPONSE, 1, b"\x0a\xff\xff\xff"))
    assert bc._conn is None
    assert results == [(BOOKIES[0], [(4, bpb.UNAVAILABLE), (5, bpb.UNAVAILABLE)])]
    await client.pool.close()


async def test_an_oversized_add_response_is_refused_whole_or_not():
    from bookie.client.bookie_client import _Connection

    client, sockets = connected_client()
    bc = client.pool.get(BOOKIES[0])
    conn = _Connection(bc, 64)        # frames above 64 bytes are refused
    conn.connection_made(sockets[BOOKIES[0]])
    bc._conn = conn
    results = []
    bc.send_add(4, b"entry", False, lambda b, r: results.append((b, r)))
    await asyncio.sleep(0)
    data = _response(1, [4] * 12)
    assert len(data) > 64
    conn.data_received(data)
    assert bc._conn is None and results == [(BOOKIES[0], [(4, bpb.UNAVAILABLE)])]
    await client.pool.close()


# -- the broker's frame decoder: a read of exactly one frame ------------------------------------------
def test_one_whole_frame_decodes_as_when_split():
    from pulsarlite.wire import commands as c
    from pulsarlite.wire.entry import Message, build_entry
    from pulsarlite.wire.frames import FrameDecoder

    frame = c.send(3, 9, build_entry(Message(b"payload"), producer_name="p", sequence_id=9, publish_time_ms=5))
    whole = FrameDecoder().feed(frame)
    split = FrameDecoder()
    parts = split.feed(frame[:7]) + split.feed(frame[7:])
    assert len(whole) == len(parts) == 1
    a, b = whole[0], parts[0]
    assert (a.command, bytes(a.entry), a.checksum, a.checksum_ok, a.frame_bytes) == \
           (b.command, bytes(b.entry), b.checksum, b.checksum_ok, b.frame_bytes)
    assert a.command.send.sequence_id == 9
    # a frame after a whole one: the decoder holds nothing
    decoder = FrameDecoder()
    assert len(decoder.feed(frame)) == 1 and decoder.buffered_bytes == 0
    assert len(decoder.feed(frame + frame)) == 2


def test_one_whole_bad_frame_is_refused_and_the_decoder_stays_failed():
    import struct

    from pulsarlite.wire.frames import FrameDecoder, FrameError, FrameTooLargeError, MalformedFrameError

    bad = struct.pack(">II", 12, 200) + b"\x00" * 8       # command size beyond the frame
    decoder = FrameDecoder()
    with pytest.raises(MalformedFrameError):
        decoder.feed(bad)
    with pytest.raises(FrameError):
        decoder.feed(bad)
    big = struct.pack(">II", 100, 4) + b"\x00" * 96
    decoder = FrameDecoder(frame_bytes_max=64)
    with pytest.raises(FrameTooLargeError):
        decoder.feed(big)


# -- end to end: one SEND per read, bookies answering one at a time ------------------------------------
@pytest.mark.parametrize("fail_at", [None, (BOOKIES[2], 3, bpb.READ_ONLY), (BOOKIES[0], 2, bpb.INTERNAL)])
async def test_one_send_per_read_gives_receipts_in_order(fail_at):
    result, taken = await drive([1] * 8, fail_at=fail_at, requests_per_turn=1)
    assert taken == [1] * 8                  # each read a run of one
    receipts = [o for o in result["out"] if o[0] == "receipt"]
    assert [r[1] for r in receipts] == list(range(8))
    assert [r[3] for r in receipts] == list(range(8))      # positions strictly increasing
    assert result["pending"] == 0 and result["in_flight"] == 0
