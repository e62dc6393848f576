"""The bookie server's one add path, without a task per request (BookieService.add): an add is
answered only after its journal group is fsynced, refusals are answered at once, adds beyond a
full journal queue wait in the store, in order, a failed journal fails them, and a peer's
EOF and a stop wait for the adds in flight. A real store and server connection; only the socket is fake."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import pytest

import bookie.storage.journal as journal_mod
from bookie._proto import bookie_rpc_pb2 as pb
from bookie.server import BookieServer, BookieService, _Connection
from bookie.storage import Status
from bookie.storage.journal import replay_journal
from bookie.transport import (RESPONSE_TYPES, FrameDecoder, encode_add_entry, encode_add_request_tail,
                              encode_header)
from test_bookie_store import config, entry, started


class FakeTransport:
    def __init__(self) -> None:
        self.decoder = FrameDecoder(1 << 24, RESPONSE_TYPES)
        self.answers: dict[int, pb.AddResponse] = {}
        self.closed = False
        self.eof_written = False

    def get_extra_info(self, name, default=None):
        return default

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_written = True

    def write(self, data) -> None:
        self.writelines([data])

    def writelines(self, pieces) -> None:
        for frame_type, request_id, body in self.decoder.feed(b"".join(pieces)):
            assert frame_type == pb.FRAME_ADD_RESPONSE
            assert request_id not in self.answers, "one answer per request"
            self.answers[request_id] = pb.AddResponse.FromString(body)

    def close(self) -> None:
        self.closed = True


def add_frame(request_id: int, entries, recovery: bool = False) -> bytes:
    body = b"".join([encode_add_entry(e.ledger_id, e.entry_id, e.lac, e.length, e.payload, e.checksum)
                     for e in entries] + [encode_add_request_tail(recovery, request_id)])
    return encode_header(pb.FRAME_ADD_REQUEST, request_id, len(body)) + body


async def connect(cfg):
    store = await started(cfg)
    service = BookieService(store, cfg)
    server = BookieServer(service, cfg)
    conn = _Connection(server)
    transport = FakeTransport()
    conn.connection_made(transport)
    return store, server, conn, transport


async def wait_until(predicate, timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


# the journal thread writes every group (no group is written by the event loop, which a gated
# fsync would block): the tests of the thread's hand-off
THREAD = {"journal_write_inline_bytes_max": 0}


class GatedFsync:
    """Journal fdatasyncs wait for ``release``; ``entered`` counts the calls that started."""

    def __init__(self, monkeypatch) -> None:
        self.gate = threading.Event()
        self.entered = 0
        real = os.fdatasync

        def fdatasync(fd):
            self.entered += 1
            assert self.gate.wait(30), "fsync gate never opened"
            real(fd)

        monkeypatch.setattr(journal_mod.os, "fdatasync", fdatasync)

    def release(self) -> None:
        self.gate.set()


async def test_add_is_answered_only_after_its_fsync(tmp_path, monkeypatch):
    gate = GatedFsync(monkeypatch)
    store, server, conn, transport = await connect(config(tmp_path, **THREAD))
    try:
        entries = [entry(3, i, lac=i - 1) for i in range(3)]
        conn.data_received(add_frame(11, entries))
        assert conn.adds_in_flight == 1 and not conn.tasks      # taken without a task
        await wait_until(lambda: gate.entered >= 1)
        await asyncio.sleep(0.05)
        assert transport.answers == {}                           # the fsync has not returned
        assert store.read(3, 0, 2, 0) == (Status.NO_SUCH_LEDGER, [])
        gate.release()
        await wait_until(lambda: 11 in transport.answers)
        answer = transport.answers[11]
        assert answer.request_id == 11
        assert [(r.ledger_id, r.entry_id, r.code) for r in answer.results] == \
            [(3, 0, pb.OK), (3, 1, pb.OK), (3, 2, pb.OK)]
        assert conn.adds_in_flight == 0
        assert store.read(3, 0, 2, 0) == (Status.OK, entries)
    finally:
        gate.release()
        await store.close()


async def test_refused_entries_are_answered_without_the_journal_and_mixed_requests_keep_order(tmp_path):
    store, server, conn, transport = await connect(config(tmp_path))
    try:
        good = entry(4, 0)
        bad = good._replace(entry_id=1)                          # checksum over entry 0
        groups = store._journal.groups_written
        conn.data_received(add_frame(1, [bad]))
        assert store.journal_records_in_flight == 0               # answered without the journal
        await wait_until(lambda: 1 in transport.answers)          # (on the loop's next turn)
        assert conn.adds_in_flight == 0
        assert [r.code for r in transport.answers[1].results] == [pb.CHECKSUM_MISMATCH]
        assert store._journal.groups_written == groups           # nothing journaled
        conn.data_received(add_frame(2, [good, bad, entry(4, 2)]))
        await wait_until(lambda: 2 in transport.answers)
        assert [(r.entry_id, r.code) for r in transport.answers[2].results] == \
            [(0, pb.OK), (1, pb.CHECKSUM_MISMATCH), (2, pb.OK)]
        assert conn.adds_in_flight == 0
    finally:
        await store.close()


async def test_adds_beyond_a_full_journal_queue_wait_in_the_store(tmp_path, monkeypatch):
    gate = GatedFsync(monkeypatch)
    store, server, conn, transport = await connect(config(tmp_path, journal_queue_records_max=4, **THREAD))
    try:
        conn.data_received(add_frame(1, [entry(5, i) for i in range(4)]))
        assert conn.adds_in_flight == 1 and not conn.tasks
        conn.data_received(add_frame(2, [entry(5, i) for i in range(4, 6)]))
        assert conn.adds_in_flight == 2 and not conn.tasks  # no room: it waits in the store
        await asyncio.sleep(0.05)
        assert transport.answers == {}
        gate.release()
        await wait_until(lambda: len(transport.answers) == 2)
        assert all(r.code == pb.OK for a in transport.answers.values() for r in a.results)
        assert store.read(5, 0, 5, 0)[0] == Status.OK and store.entry_count() == 6
    finally:
        gate.release()
        await store.close()


@pytest.mark.parametrize("inline_bytes_max", [0, 64 * 1024], ids=["journal-thread", "inline"])
async def test_a_failed_journal_fails_the_adds_in_flight_and_refuses_later_ones(tmp_path, monkeypatch,
                                                                              inline_bytes_max):
    def failing_fdatasync(fd):
        raise OSError(5, "injected I/O error")

    store, server, conn, transport = await connect(
        config(tmp_path, journal_write_inline_bytes_max=inline_bytes_max))
    try:
        monkeypatch.setattr(journal_mod.os, "fdatasync", failing_fdatasync)
        conn.data_received(add_frame(7, [entry(6, 0), entry(6, 1)]))
        await wait_until(lambda: 7 in transport.answers)
        # the I/O error reaches the adds it failed as it did through a task: INTERNAL
        assert [r.code for r in transport.answers[7].results] == [pb.INTERNAL, pb.INTERNAL]
        assert conn.adds_in_flight == 0
        conn.data_received(add_frame(8, [entry(6, 2)]))      # the store is failed now
        await wait_until(lambda: 8 in transport.answers)
        assert [r.code for r in transport.answers[8].results] == [pb.UNAVAILABLE]
    finally:
        monkeypatch.undo()
        await store.close()


async def test_peer_eof_waits_for_adds_in_flight(tmp_path, monkeypatch):
    gate = GatedFsync(monkeypatch)
    store, server, conn, transport = await connect(config(tmp_path, **THREAD))
    try:
        conn.data_received(add_frame(9, [entry(7, 0)]))
        assert conn.eof_received() is True                      # half-closed: keep answering
        assert not transport.closed
        gate.release()
        await wait_until(lambda: 9 in transport.answers)
        assert [r.code for r in transport.answers[9].results] == [pb.OK]
        assert transport.closed                                  # closed after the last answer
    finally:
        gate.release()
        await store.close()


async def test_stop_waits_for_adds_in_flight(tmp_path, monkeypatch):
    gate = GatedFsync(monkeypatch)
    store, server, conn, transport = await connect(config(tmp_path, **THREAD))
    try:
        conn.data_received(add_frame(5, [entry(8, 0)]))
        stopping = asyncio.ensure_future(server.stop(grace_s=30))
        await asyncio.sleep(0.05)
        assert not stopping.done()                               # the add is still in flight
        conn.data_received(add_frame(6, [entry(8, 1)]))          # closing: refused
        await wait_until(lambda: 6 in transport.answers)
        assert [r.code for r in transport.answers[6].results] == [pb.UNAVAILABLE]
        assert not stopping.done()
        gate.release()
        await asyncio.wait_for(stopping, 30)
        assert [r.code for r in transport.answers[5].results] == [pb.OK]
        assert transport.closed
    finally:
        gate.release()
        await store.close()


async def test_an_idle_journal_is_written_by_the_loop_and_answered_after_its_fsync(tmp_path, monkeypatch):
    """The hot path's small group finding the journal idle: written and synced on the loop's
    thread (no hand-off), still answered and readable only after the fdatasync returned."""
    store, server, conn, transport = await connect(config(tmp_path))
    seen = []
    real = os.fdatasync

    def fdatasync(fd):
        seen.append((threading.get_ident(), dict(transport.answers), store.read(3, 0, 1, 0)[0]))
        real(fd)

    monkeypatch.setattr(journal_mod.os, "fdatasync", fdatasync)
    try:
        entries = [entry(3, 0), entry(3, 1, lac=0)]
        groups = store._journal.groups_written
        conn.data_received(add_frame(11, entries))
        assert store._journal.groups_written == groups + 1        # written before data_received returned
        assert seen == [(threading.get_ident(), {}, Status.NO_SUCH_LEDGER)]
        assert transport.answers == {}                            # answered from the loop, next turn
        await wait_until(lambda: 11 in transport.answers)
        assert [r.code for r in transport.answers[11].results] == [pb.OK, pb.OK]
        assert conn.adds_in_flight == 0
        assert store.read(3, 0, 1, 0) == (Status.OK, entries)
    finally:
        monkeypatch.undo()
        await store.close()


class LockGate:
    """Stands in for the journal's write lock: once armed, the journal thread waits at it
    (holding whatever group it gathered) until ``release``; other threads pass."""

    def __init__(self, lock, loop_thread: int) -> None:
        self.lock = lock
        self.loop_thread = loop_thread
        self.armed = False
        self.waiting = threading.Event()
        self.gate = threading.Event()

    def acquire(self, blocking: bool = True) -> bool:
        if self.armed and threading.get_ident() != self.loop_thread:
            self.waiting.set()
            assert self.gate.wait(30), "lock gate never opened"
        return self.lock.acquire(blocking)

    def release(self) -> None:
        self.lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


async def test_a_small_add_behind_a_group_the_thread_holds_is_not_written_ahead_of_it(tmp_path):
    """While the journal thread holds a group it has not written yet (nor locked the file for),
    a small add is queued behind it instead of being written by the loop ahead of it: the
    journal's order is the order the adds were accepted in."""
    store, server, conn, transport = await connect(config(tmp_path, journal_write_inline_bytes_max=512))
    journal = store._journal
    gate = LockGate(journal._write_lock, threading.get_ident())
    journal._write_lock = gate
    try:
        gate.armed = True
        big = [entry(4, i, payload=bytes([i]) * 400) for i in range(2)]   # over 512 bytes: the thread
        conn.data_received(add_frame(1, big))
        await asyncio.to_thread(gate.waiting.wait, 30)
        conn.data_received(add_frame(2, [entry(4, 2)]))          # small, and the file is not locked
        assert conn.adds_in_flight == 2
        gate.gate.set()
        await wait_until(lambda: len(transport.answers) == 2)
        assert all(r.code == pb.OK for a in transport.answers.values() for r in a.results)
        order = [(rec.ledger_id, rec.entry_id)
                 for rec, _pos in replay_journal(store._config.journal_dir, journal.start_position)]
        assert order == [(4, 0), (4, 1), (4, 2)]
    finally:
        gate.gate.set()
        await store.close()


async def test_a_slow_write_on_the_loop_hands_the_next_groups_to_the_journal_thread(tmp_path, monkeypatch):
    """One group written by the loop that took long (a slow disk): the following groups go to
    the journal thread for a while, so the loop keeps serving reads meanwhile."""
    store, server, conn, transport = await connect(config(tmp_path))
    threads = []
    real = os.fdatasync

    def fdatasync(fd):
        threads.append(threading.get_ident())
        if len(threads) == 1:
            time.sleep(0.03)                                    # over the 10 ms that count as slow
        real(fd)

    monkeypatch.setattr(journal_mod.os, "fdatasync", fdatasync)
    try:
        conn.data_received(add_frame(1, [entry(9, 0)]))
        await wait_until(lambda: 1 in transport.answers)
        conn.data_received(add_frame(2, [entry(9, 1)]))
        await wait_until(lambda: 2 in transport.answers)
        assert [r.code for a in transport.answers.values() for r in a.results] == [pb.OK, pb.OK]
        assert threads[0] == threading.get_ident()              # the first: written by the loop
        assert threads[1] != threading.get_ident()              # the next: by the journal thread
        assert store.inline_groups_written == 1
    finally:
        monkeypatch.undo()
        await store.close()
