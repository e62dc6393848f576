"""[hardening] Real bookie processes under hostile input (raw sockets, a real ZooKeeper):

- an add that would replace a stored entry with another payload is refused (ENTRY_EXISTS),
  the same entry again is OK (even carrying another LAC), and after kill -9 and a restart
  (journal replay) the bookie still holds the first bytes, including for two versions of one
  entry sent in one write;
- connections that hold resources without using them (silent, a frame left unfinished, a
  frame trickled, one more than ``connections_max``) are closed by the bookie on its own,
  while a ledger client keeps writing through its own connections, which stay open although
  they are silent for longer than the first-request timeout (no ensemble change, no reconnect).
Every wait is bounded.
"""

from __future__ import annotations

import asyncio

import pytest

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.client.bookie_client import parse_bookie_address
from bookie.transport import encode_message
from integration.test_ledgers import (RawBookieConnection, _entry, connect, name_of, read_all,
                                      start_cluster, write_stream)

pytestmark = pytest.mark.integration

LEDGER = 4242


async def test_a_stored_entry_is_never_replaced_even_across_kill_9(cluster_factory):
    cluster = await start_cluster(cluster_factory, 1)
    bookie = cluster.bookie_ids[0]
    original = _entry(LEDGER, 0, -1, b"original")
    async with await RawBookieConnection.open(bookie) as conn:
        r = await conn.call(pb.AddRequest(entries=[original]))
        assert [x.code for x in r.results] == [pb.OK]
        forged = _entry(LEDGER, 0, 7, b"forged")
        r = await conn.call(pb.AddRequest(entries=[forged]))
        assert [x.code for x in r.results] == [pb.ENTRY_EXISTS]
        r = await conn.call(pb.AddRequest(entries=[forged], recovery=True))
        assert [x.code for x in r.results] == [pb.ENTRY_EXISTS]
        r = await conn.call(pb.AddRequest(entries=[original]))              # a retry
        assert [x.code for x in r.results] == [pb.OK]
        r = await conn.call(pb.AddRequest(entries=[_entry(LEDGER, 0, 3, b"original")], recovery=True))
        assert [x.code for x in r.results] == [pb.OK]                        # another LAC: the same entry
        # two versions of a new entry in one write: both reach the bookie before either is
        # stored (or not: either way the first wins)
        first, second = _entry(LEDGER, 1, 0, b"first"), _entry(LEDGER, 1, 0, b"second")
        await conn.send_bytes(encode_message(pb.FRAME_ADD_REQUEST, 50, pb.AddRequest(entries=[first]))
                              + encode_message(pb.FRAME_ADD_REQUEST, 51, pb.AddRequest(entries=[second])))
        answers = {}
        for _ in range(2):
            frame_type, request_id, message = await conn.read_frame()
            assert frame_type == pb.FRAME_ADD_RESPONSE
            answers[request_id] = [x.code for x in message.results]
        assert answers == {50: [pb.OK], 51: [pb.ENTRY_EXISTS]}
        r = await conn.call(pb.ReadRequest(ledger_id=LEDGER, first_entry_id=0, last_entry_id=1))
        assert [e.payload for e in r.entries] == [b"original", b"first"]
    name = name_of(cluster, bookie)
    await asyncio.to_thread(cluster.kill, name)
    await asyncio.to_thread(cluster.restart, name)
    async with await RawBookieConnection.open(bookie) as conn:
        r = await conn.call(pb.ReadRequest(ledger_id=LEDGER, first_entry_id=0, last_entry_id=1))
        assert r.code == pb.OK and [e.payload for e in r.entries] == [b"original", b"first"]
        assert [e.lac for e in r.entries] == [-1, 0]
        lac = await conn.call(pb.ReadLacRequest(ledger_id=LEDGER))
        assert (lac.lac, lac.last_entry_id) == (0, 1)


async def closed_within(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    """True once the bookie closed (or reset) the connection, within ``timeout_s``: what it
    sends before (an ErrorResponse) is read and dropped."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        while loop.time() < deadline:
            data = await asyncio.wait_for(reader.read(65536), deadline - loop.time())
            if not data:
                return True
    except (asyncio.TimeoutError, TimeoutError):
        return False
    except ConnectionError:
        return True
    return False


async def test_hostile_connections_are_closed_and_a_ledger_client_keeps_its_own(cluster_factory):
    cluster = await start_cluster(cluster_factory, 3, bookie_overrides={
        "connections_max": 12, "frame_complete_timeout_ms": 1_000,
        "connection_first_request_timeout_ms": 2_000})
    client = await connect(cluster)
    opened: list[asyncio.StreamWriter] = []
    try:
        writer = await client.create_ledger(3, 3, 2)
        acked: dict[int, bytes] = {}
        await write_stream(writer, 200, acked)
        ensemble = writer.metadata.current_ensemble
        connections = {b: client.pool.get(b)._conn for b in ensemble}
        assert all(c is not None for c in connections.values())
        victim = ensemble[0]
        host, port = parse_bookie_address(victim)

        # fill the victim's connections up to the cap (the ledger client holds one of them)
        silent = []
        for _ in range(11):
            reader, w = await asyncio.open_connection(host, port)
            opened.append(w)
            silent.append(reader)
        # one more is told UNAVAILABLE and closed at once
        async with await RawBookieConnection.open(victim) as extra:
            frame = await extra.read_frame()
            assert frame is not None and frame[0] == pb.FRAME_ERROR_RESPONSE and frame[2].code == pb.UNAVAILABLE
            assert await extra.read_frame() is None
        # the ledger client writes on meanwhile, through its connection within the cap
        await write_stream(writer, 100, more := {})
        # the silent connections are closed after the first-request timeout ...
        results = await asyncio.gather(*(closed_within(r, 10) for r in silent))
        assert all(results), results
        # ... which leaves room for a frame left unfinished and a trickled one, each after a
        # valid request (so that only the frame's own timeout can close them): closed in time
        info = encode_message(pb.FRAME_BOOKIE_INFO_REQUEST, 1, pb.BookieInfoRequest())
        half_reader, half = await asyncio.open_connection(host, port)
        opened.append(half)
        half.write(info + info[:7])
        trickle_reader, trickle = await asyncio.open_connection(host, port)
        opened.append(trickle)
        trickle.write(info)
        frame = encode_message(pb.FRAME_ADD_REQUEST, 2, pb.AddRequest(entries=[_entry(LEDGER, 0, -1, b"x" * 300)]))

        async def trickle_it() -> None:
            try:
                for i in range(len(frame)):
                    trickle.write(frame[i:i + 1])
                    await trickle.drain()
                    await asyncio.sleep(0.02)
            except ConnectionError:
                pass

        trickling = asyncio.ensure_future(trickle_it())
        assert await closed_within(half_reader, 10) and await closed_within(trickle_reader, 10)
        trickling.cancel()
        async with await RawBookieConnection.open(victim) as check:
            r = await check.call(pb.ReadLacRequest(ledger_id=LEDGER))
            assert r.code == pb.NO_SUCH_LEDGER                           # the trickled add never ran

        # the ledger client's connections were silent for longer than the first-request
        # timeout too, and were kept: same connections, no ensemble change
        await asyncio.sleep(2.5)
        await write_stream(writer, 100, last := {})
        assert {b: client.pool.get(b)._conn for b in ensemble} == connections
        assert len(writer.metadata.ensembles) == 1
        md = await writer.close()
        assert md.last_entry_id == 399
        _, got = await read_all(client, writer.ledger_id, recovery=False)
        assert len(got) == 400 and set(got) == set(range(400))
        assert {k: got[k] for k in acked} == acked
        assert {k: got[k] for k in more} == more and {k: got[k] for k in last} == last
    finally:
        for w in opened:
            w.close()
        await client.close()


async def test_orphan_ledgers_are_deleted_after_the_grace_period_and_live_ones_stay(cluster_factory):
    """A ledger written without being created, and one whose deletion the bookies missed (its
    metadata deleted behind their back), are deleted by the bookies once the grace period has
    passed; a ledger the metadata knows stays, readable and writable."""
    grace_ms = 3_000
    cluster = await start_cluster(cluster_factory, 3, bookie_overrides={
        "orphan_gc_interval_ms": 300, "orphan_ledger_grace_ms": grace_ms})
    client = await connect(cluster)
    try:
        live = await client.create_ledger(3, 3, 2)
        acked: dict[int, bytes] = {}
        await write_stream(live, 50, acked)
        missed = await client.create_ledger(3, 3, 2)
        await write_stream(missed, 20, {})
        await missed.close()
        await client.ledger_manager.delete(missed.ledger_id)        # the bookies were not told
        never = 987_654_321                                           # never created
        bookie = cluster.bookie_ids[0]
        async with await RawBookieConnection.open(bookie) as conn:
            r = await conn.call(pb.AddRequest(entries=[_entry(never, 0, -1, b"squatter")]))
            assert [x.code for x in r.results] == [pb.OK]
        await asyncio.sleep(1.0)                                      # within the grace period

        async def stored(bookie_id: str, ledger_id: int) -> bool:
            async with await RawBookieConnection.open(bookie_id) as conn:
                r = await conn.call(pb.ReadLacRequest(ledger_id=ledger_id))
                return r.code == pb.OK

        assert await stored(bookie, never) and await stored(bookie, missed.ledger_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while await stored(bookie, never) or any([await stored(b, missed.ledger_id) for b in cluster.bookie_ids]):
            assert loop.time() < deadline, "orphan ledgers still stored 30 s after the grace period"
            await asyncio.sleep(0.3)
        for b in cluster.bookie_ids:
            assert await stored(b, live.ledger_id)
        await write_stream(live, 10, {})
        md = await live.close()
        assert md.last_entry_id == 59
        _, got = await read_all(client, live.ledger_id, recovery=False)
        assert {k: got[k] for k in acked} == acked and len(got) == 60
        name = name_of(cluster, bookie)
        with open(cluster.records[name].log) as f:
            text = f.read()
        assert f"ledger={never} bookie={bookie}" in text and "orphan ledger deleted" in text
    finally:
        await client.close()
