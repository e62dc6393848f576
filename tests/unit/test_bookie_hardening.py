"""[hardening] The bookie against hostile input (a real store and server connection; only the
socket is fake, as in test_bookie_server_adds).

Re-writes: the first write of an entry id wins. An add of an entry the bookie stores, or has in
flight, is answered OK only if it is the same entry (payload and length; the LAC it carries may
differ: a client's retry, a re-send after an ensemble change, a recovery re-write), else
ENTRY_EXISTS, and the stored entry, the LAC and what the journal replay rebuilds after a crash
stay as they were; whether the add is taken at once or waits in the store for room in the
journal queue, and whether the stored entry sits in the write cache or in an entry log.
"""

from __future__ import annotations

import asyncio

import pytest

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.client.bookie_client import BookieClientPool
from bookie.server import (CLOSE_BAD_FRAME, CLOSE_NO_REQUEST, CLOSE_SLOW_FRAME, CLOSE_TOO_MANY,
                           CLOSE_WRITE_STALL, CONNECTION_REQUESTS_IN_FLIGHT_MAX, BookieServer,
                           BookieService, _Connection)
from bookie.storage import BookieStore, Status
from bookie.transport import HEADER, MESSAGE_TYPES, encode_message
from pulsarlite.config import BookieConfig, LedgerClientConfig
from pulsarlite.errors import ConfigError
from test_bookie_fencing import add as client_add
from test_bookie_fencing import free_port
from test_bookie_server_adds import THREAD, FakeTransport, GatedFsync, add_frame, connect, wait_until
from test_bookie_store import config, crash, entry, started

LEDGER = 21


def codes(answer: pb.AddResponse) -> list[tuple[int, int]]:
    return [(r.entry_id, r.code) for r in answer.results]


async def reopened(cfg) -> BookieStore:
    """The store as the journal replay rebuilds it (after ``crash``)."""
    return await started(cfg)


# -- the store's add path (awaited) ------------------------------------------------------------------
@pytest.mark.parametrize("where", ["write-cache", "entry-log"])
async def test_a_rewrite_with_other_bytes_is_refused_and_the_same_bytes_are_ok(tmp_path, where):
    cfg = config(tmp_path)
    store = await started(cfg)
    try:
        first = [entry(LEDGER, i, lac=i - 1) for i in range(3)]
        assert await store.add_entries(first) == [Status.OK] * 3
        if where == "entry-log":
            await store.checkpoint()          # indexed: the comparison reads the entry log
            assert not store._storage.ledgers[LEDGER].cache
        groups = store._journal.groups_written
        other = entry(LEDGER, 1, b"someone else's bytes", lac=5)
        assert await store.add_entries([other]) == [Status.ENTRY_EXISTS]
        # a retry and a recovery re-write of the stored bytes: OK, nothing journaled again
        assert await store.add_entries([first[1]]) == [Status.OK]
        assert await store.add_entries([first[2]], recovery=True) == [Status.OK]
        # the same entry carrying another LAC (a re-send after an ensemble change carries the
        # writer's LAC then; recovery re-writes another replica's copy): OK, changes nothing
        assert await store.add_entries([entry(LEDGER, 2, lac=9)], recovery=True) == [Status.OK]
        assert await store.add_entries([entry(LEDGER, 0, lac=8)]) == [Status.OK]
        assert store._journal.groups_written == groups
        # mixed: a new entry, a conflicting and an identical re-write, answered in order
        statuses = await store.add_entries([entry(LEDGER, 3, lac=2), other, first[0],
                                            entry(LEDGER, 2, b"x", lac=1)])
        assert statuses == [Status.OK, Status.ENTRY_EXISTS, Status.OK, Status.ENTRY_EXISTS]
        assert store.read(LEDGER, 0, 3, 0) == (Status.OK, first + [entry(LEDGER, 3, lac=2)])
        info = store.ledger_info(LEDGER)
        assert (info.lac, info.last_entry_id) == (2, 3)          # the refused lac=5 changed nothing
    finally:
        await store.close()


async def test_a_rewrite_on_a_fenced_ledger_still_needs_the_same_bytes(tmp_path):
    store = await started(config(tmp_path))
    try:
        stored = entry(LEDGER, 0)
        assert await store.add_entries([stored]) == [Status.OK]
        await store.fence(LEDGER)
        assert await store.add_entries([stored]) == [Status.FENCED]          # fencing first
        assert await store.add_entries([stored], recovery=True) == [Status.OK]
        assert await store.add_entries([entry(LEDGER, 0, b"other")], recovery=True) == \
            [Status.ENTRY_EXISTS]
        assert store.read(LEDGER, 0, 0, 0) == (Status.OK, [stored])
    finally:
        await store.close()


async def test_rewrites_in_flight_together_keep_the_first_and_so_does_the_replay(tmp_path):
    """Two adds of one entry id with different bytes, both accepted before either is applied
    (both journaled): the first wins, the second is answered ENTRY_EXISTS; after a crash the
    journal replay keeps the first too."""
    cfg = config(tmp_path)
    store = await started(cfg)
    first, second = entry(LEDGER, 0, b"first"), entry(LEDGER, 0, b"second", lac=0)
    same = entry(LEDGER, 1)
    results = await asyncio.gather(store.add_entries([first, same]), store.add_entries([second, same]),
                                   store.add_entries([entry(LEDGER, 1, b"third")]))
    assert results == [[Status.OK, Status.OK], [Status.ENTRY_EXISTS, Status.OK], [Status.ENTRY_EXISTS]]
    assert store.read(LEDGER, 0, 1, 0) == (Status.OK, [first, same])
    # one request holding two versions of one entry id
    assert await store.add_entries([entry(LEDGER, 2, b"a"), entry(LEDGER, 2, b"b")]) == \
        [Status.OK, Status.ENTRY_EXISTS]
    await crash(store)
    store = await reopened(cfg)
    try:
        assert store.read(LEDGER, 0, 2, 0) == (Status.OK, [first, same, entry(LEDGER, 2, b"a")])
        assert store.ledger_info(LEDGER).lac == -1               # the refused lac=0 never applied
    finally:
        await store.close()


# -- the server's add path ----------------------------------------------------------------------
async def test_the_server_refuses_a_rewrite_with_other_bytes(tmp_path):
    cfg = config(tmp_path)
    store, server, conn, transport = await connect(cfg)
    try:
        first = [entry(LEDGER, i, lac=i - 1) for i in range(2)]
        conn.data_received(add_frame(1, first))
        await wait_until(lambda: 1 in transport.answers)
        assert codes(transport.answers[1]) == [(0, pb.OK), (1, pb.OK)]
        other = entry(LEDGER, 1, b"overwrite")
        conn.data_received(add_frame(2, [other]))
        await wait_until(lambda: 2 in transport.answers)
        assert conn.adds_in_flight == 0 and store.journal_records_in_flight == 0  # refused, no journal
        conn.data_received(add_frame(3, [first[1], entry(LEDGER, 2, lac=1)]))
        await wait_until(lambda: {2, 3} <= set(transport.answers))
        assert codes(transport.answers[2]) == [(1, pb.ENTRY_EXISTS)]
        assert codes(transport.answers[3]) == [(1, pb.OK), (2, pb.OK)]
        # two versions in flight at once (one data_received: neither applied when the other
        # is accepted)
        conn.data_received(add_frame(4, [entry(LEDGER, 3, b"mine")]) + add_frame(5, [entry(LEDGER, 3, b"yours")]))
        await wait_until(lambda: {4, 5} <= set(transport.answers))
        assert codes(transport.answers[4]) == [(3, pb.OK)]
        assert codes(transport.answers[5]) == [(3, pb.ENTRY_EXISTS)]
        assert store.read(LEDGER, 0, 3, 0) == (Status.OK, first + [entry(LEDGER, 2, lac=1),
                                                                   entry(LEDGER, 3, b"mine")])
    finally:
        await store.close()
    await crash_free_reopen_check(cfg, [entry(LEDGER, 0, lac=-1), entry(LEDGER, 1, lac=0),
                                        entry(LEDGER, 2, lac=1), entry(LEDGER, 3, b"mine")])


async def crash_free_reopen_check(cfg, expected) -> None:
    store = await started(cfg)
    try:
        assert store.read(LEDGER, 0, len(expected) - 1, 0) == (Status.OK, expected)
    finally:
        await store.close()


async def test_an_add_waiting_for_room_refuses_a_rewrite_in_flight_and_the_replay_agrees(tmp_path, monkeypatch):
    """An add that waits in the store for room in the journal queue is validated when it is
    taken: a conflicting version queued behind the first is refused too."""
    gate = GatedFsync(monkeypatch)
    cfg = config(tmp_path, journal_queue_records_max=1, **THREAD)
    store, server, conn, transport = await connect(cfg)
    try:
        conn.data_received(add_frame(1, [entry(LEDGER, 0, b"first")]))
        conn.data_received(add_frame(2, [entry(LEDGER, 0, b"second")]))
        assert conn.adds_in_flight == 2 and not conn.tasks     # the second waits in the store
        gate.release()
        await wait_until(lambda: {1, 2} <= set(transport.answers))
        assert codes(transport.answers[1]) == [(0, pb.OK)]
        assert codes(transport.answers[2]) == [(0, pb.ENTRY_EXISTS)]
        assert store.read(LEDGER, 0, 0, 0) == (Status.OK, [entry(LEDGER, 0, b"first")])
    finally:
        gate.release()
        await crash(store)
    store = await reopened(cfg)
    try:
        assert store.read(LEDGER, 0, 0, 0) == (Status.OK, [entry(LEDGER, 0, b"first")])
    finally:
        await store.close()


# -- connection budgets -------------------------------------------------------------------------
# Real TCP to an in-process BookieServer over a real store (raw sockets play the hostile peers),
# or a fake socket where the test must drive the transport's events itself.

FAST = dict(frame_complete_timeout_ms=300, connection_first_request_timeout_ms=400,
            connection_write_stall_timeout_ms=300)


class UnreadTransport(FakeTransport):
    """FakeTransport that can be aborted (budgets close with a reset); for the write stall,
    the test calls pause_writing/resume_writing as a peer that stopped reading would cause."""

    def __init__(self) -> None:
        super().__init__()
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True
        self.closed = True


async def connect_abortable(cfg):
    """test_bookie_server_adds.connect with a transport that can be aborted."""
    store = await started(cfg)
    server = BookieServer(BookieService(store, cfg), cfg)
    conn = _Connection(server)
    transport = UnreadTransport()
    conn.connection_made(transport)
    return store, server, conn, transport


class Served:
    def __init__(self, cfg, store, server) -> None:
        self.cfg, self.store, self.server = cfg, store, server

    async def raw(self) -> "Raw":
        return Raw(*await asyncio.open_connection(self.cfg.host, self.cfg.port))


class Raw:
    """A bare connection: sends any bytes, reads frames, tells when the bookie closed it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def frame(self, timeout_s: float = 10.0):
        """(frame_type, request_id, message), or None at the end of the stream."""
        try:
            header = await asyncio.wait_for(self.reader.readexactly(HEADER.size), timeout_s)
            frame_bytes, frame_type, request_id = HEADER.unpack(header)
            body = await asyncio.wait_for(self.reader.readexactly(frame_bytes - 9), timeout_s)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        return frame_type, request_id, MESSAGE_TYPES[frame_type].FromString(body)

    async def call(self, frame_type: int, request_id: int, message):
        await self.send(encode_message(frame_type, request_id, message))
        return await self.frame()

    async def closed_within(self, timeout_s: float) -> bool:
        """True once the bookie closed (or reset) the connection, within ``timeout_s``."""
        try:
            data = await asyncio.wait_for(self.reader.read(65536), timeout_s)
        except asyncio.TimeoutError:
            return False
        except ConnectionError:           # reset, or a write of ours found it closed
            return True
        return data == b""

    def close(self) -> None:
        self.writer.close()


class served:
    """``async with served(tmp_path, **overrides) as s``: a real server on a free port."""

    def __init__(self, tmp_path, **overrides) -> None:
        self.cfg = config(tmp_path, host="127.0.0.1", port=free_port(), **overrides)

    async def __aenter__(self) -> Served:
        self.store = await started(self.cfg)
        self.server = BookieServer(BookieService(self.store, self.cfg), self.cfg)
        await self.server.start()
        return Served(self.cfg, self.store, self.server)

    async def __aexit__(self, *exc) -> None:
        await self.server.stop(1.0)
        await self.store.close()


def info_request() -> bytes:
    return encode_message(pb.FRAME_BOOKIE_INFO_REQUEST, 1, pb.BookieInfoRequest())


@pytest.mark.parametrize("name", ["connections_max", "frame_complete_timeout_ms",
                                  "connection_first_request_timeout_ms",
                                  "connection_write_stall_timeout_ms"])
def test_connection_budgets_are_validated(tmp_path, name):
    assert getattr(BookieConfig(), name) > 0
    with pytest.raises(ConfigError, match=name):
        config(tmp_path, **{name: 0}).validate()


async def test_connections_beyond_the_cap_are_told_and_closed(tmp_path, caplog):
    async with served(tmp_path, connections_max=3) as s:
        kept = [await s.raw() for _ in range(3)]
        for conn in kept:
            assert (await conn.call(pb.FRAME_BOOKIE_INFO_REQUEST, 1, pb.BookieInfoRequest()))[0] == \
                pb.FRAME_BOOKIE_INFO_RESPONSE
        caplog.clear()
        for i in range(20):
            extra = await s.raw()
            frame = await extra.frame()
            assert frame is not None and frame[0] == pb.FRAME_ERROR_RESPONSE and frame[2].code == pb.UNAVAILABLE
            assert "too many connections" in frame[2].message
            assert await extra.closed_within(5)
            extra.close()
        assert s.server.connection_count == 3 and s.server.closes_of(CLOSE_TOO_MANY) == 20
        # refusals are logged at a bounded rate: the 1st, 2nd, 4th, 8th and 16th
        lines = [r for r in caplog.records if "too many connections" in r.getMessage()]
        assert len(lines) == 5, [r.getMessage() for r in lines]
        # the connections within the cap are served as before; one closed makes room
        assert (await kept[0].call(pb.FRAME_READ_LAC_REQUEST, 2, pb.ReadLacRequest(ledger_id=1)))[0] == \
            pb.FRAME_READ_LAC_RESPONSE
        kept[0].close()
        await wait_until(lambda: s.server.connection_count == 2)
        again = await s.raw()
        assert (await again.call(pb.FRAME_BOOKIE_INFO_REQUEST, 3, pb.BookieInfoRequest()))[0] == \
            pb.FRAME_BOOKIE_INFO_RESPONSE
        for conn in kept[1:] + [again]:
            conn.close()


async def test_a_frame_not_whole_in_time_closes_the_connection(tmp_path):
    async with served(tmp_path, **FAST) as s:
        frame = info_request()
        # a frame that stops half way
        stuck = await s.raw()
        await stuck.send(frame[:7])
        # a frame trickled byte by byte: bytes keep coming, the frame never ends in time
        trickled = await s.raw()
        trickle = asyncio.ensure_future(trickle_bytes(trickled, add_frame(1, [entry(LEDGER, 0, b"x" * 200)])))
        # a connection sending whole frames slowly is kept: each frame was whole at once
        slow = await s.raw()
        for i in range(4):
            assert (await slow.call(pb.FRAME_BOOKIE_INFO_REQUEST, i + 1, pb.BookieInfoRequest()))[0] == \
                pb.FRAME_BOOKIE_INFO_RESPONSE
            await asyncio.sleep(0.2)
        assert await stuck.closed_within(5) and await trickled.closed_within(5)
        trickle.cancel()
        assert s.server.closes_of(CLOSE_SLOW_FRAME) == 2
        assert not await slow.closed_within(0.1)
        # a frame split over reads that completes in time is served
        await slow.send(frame[:7])
        await asyncio.sleep(0.1)
        await slow.send(frame[7:])
        assert (await slow.frame())[0] == pb.FRAME_BOOKIE_INFO_RESPONSE
        assert s.store.read(LEDGER, 0, 0, 0)[0] == Status.NO_SUCH_LEDGER   # the trickled add never ran
        for conn in (stuck, trickled, slow):
            conn.close()


async def trickle_bytes(conn: Raw, data: bytes) -> None:
    try:
        for i in range(len(data)):
            await conn.send(data[i:i + 1])
            await asyncio.sleep(0.02)
    except ConnectionError:
        pass


async def test_a_connection_without_a_request_is_closed_but_an_idle_client_is_not(tmp_path):
    async with served(tmp_path, **FAST) as s:
        silent = await s.raw()
        # the ledger client: one add, then silent far past the first-request timeout
        pool = BookieClientPool(LedgerClientConfig())
        client = pool.get(s.cfg.effective_bookie_id)
        try:
            assert await client_add(client, LEDGER, 0) == pb.OK
            conn = client._conn
            assert await silent.closed_within(5)
            assert s.server.closes_of(CLOSE_NO_REQUEST) == 1
            await asyncio.sleep(1.0)
            assert client._conn is conn and not conn.transport.is_closing()   # still the same connection
            assert await client_add(client, LEDGER, 1) == pb.OK
            assert client._conn is conn
        finally:
            await pool.close()
            silent.close()


async def test_the_bookies_own_back_pressure_does_not_count_against_a_frame(tmp_path, monkeypatch):
    """Adds in flight up to the per-connection bound pause reading (fsync held): the frame
    that was arriving then cannot be finished by the peer, so its clock stops until reading
    resumes; a frame left unfinished after that is still closed in time."""
    gate = GatedFsync(monkeypatch)
    cfg = config(tmp_path, **FAST, **THREAD)
    store, server, conn, transport = await connect_abortable(cfg)
    try:
        frames = b"".join(add_frame(i + 1, [entry(LEDGER, i)]) for i in range(CONNECTION_REQUESTS_IN_FLIGHT_MAX))
        last = add_frame(1000, [entry(LEDGER, 1000, b"y" * 100)])
        conn.data_received(frames + last[:20])
        assert conn._read_paused and conn._decoder.buffered_bytes == 20
        await asyncio.sleep(0.6)                                 # twice the frame timeout
        assert not transport.closed
        gate.release()
        await wait_until(lambda: len(transport.answers) == CONNECTION_REQUESTS_IN_FLIGHT_MAX)
        assert not conn._read_paused
        conn.data_received(last[20:])                            # finished after reading resumed
        await wait_until(lambda: 1000 in transport.answers)
        assert codes(transport.answers[1000]) == [(1000, pb.OK)]
        conn.data_received(last[:20])                            # another one, never finished
        await wait_until(lambda: transport.closed, timeout_s=5)
        assert server.closes_of(CLOSE_SLOW_FRAME) == 1
    finally:
        gate.release()
        await store.close()


async def test_a_peer_that_does_not_read_its_answers_is_closed(tmp_path):
    cfg = config(tmp_path, **FAST)
    store = await started(cfg)
    server = BookieServer(BookieService(store, cfg), cfg)
    try:
        readers = []
        for _ in range(2):
            conn = _Connection(server)
            transport = UnreadTransport()
            conn.connection_made(transport)
            conn.data_received(add_frame(1, [entry(LEDGER, len(readers))]))
            conn.pause_writing()                                # answers pile up unread
            readers.append((conn, transport))
        await asyncio.sleep(0.1)
        readers[1][0].resume_writing()                           # this one catches up in time
        await wait_until(lambda: readers[0][1].aborted, timeout_s=5)
        await asyncio.sleep(0.4)
        assert not readers[1][1].closed and server.closes_of(CLOSE_WRITE_STALL) == 1
    finally:
        await store.close()


async def test_closing_a_connection_loses_no_acknowledged_add(tmp_path, monkeypatch):
    """A connection closed by a budget (here a frame left unfinished) with an add in flight:
    the add acknowledged before stays, the one in flight still completes in the store (its
    answer is dropped: the client sees the connection fail and retries)."""
    gate = GatedFsync(monkeypatch)
    cfg = config(tmp_path, **FAST, **THREAD)
    store, server, conn, transport = await connect_abortable(cfg)
    try:
        gate.release()
        conn.data_received(add_frame(1, [entry(LEDGER, 0)]))
        await wait_until(lambda: 1 in transport.answers)
        assert codes(transport.answers[1]) == [(0, pb.OK)]
        gate.gate.clear()
        conn.data_received(add_frame(2, [entry(LEDGER, 1, lac=0)]) + add_frame(3, [entry(LEDGER, 2)])[:10])
        await wait_until(lambda: transport.closed, timeout_s=5)
        assert 2 not in transport.answers
        gate.release()
        await wait_until(lambda: store.read(LEDGER, 1, 1, 0)[0] == Status.OK)
        assert store.read(LEDGER, 0, 1, 0) == (Status.OK, [entry(LEDGER, 0), entry(LEDGER, 1, lac=0)])
        assert 2 not in transport.answers
    finally:
        gate.release()
        await store.close()


async def test_bad_frames_are_logged_at_a_bounded_rate(tmp_path, caplog):
    async with served(tmp_path) as s:
        caplog.clear()
        for _ in range(9):
            conn = await s.raw()
            await conn.send(b"GET / HTTP/1.1\r\n\r\n")
            frame = await conn.frame()
            assert frame is not None and frame[2].code == pb.TOO_LARGE
            conn.close()
        assert s.server.closes_of(CLOSE_BAD_FRAME) == 9
        lines = [r for r in caplog.records if "cause=bad frame" in r.getMessage()]
        assert len(lines) == 4                                  # the 1st, 2nd, 4th and 8th
