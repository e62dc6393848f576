"""Fencing on the REAL bookie server (bookie/server.py over a real BookieStore, a real TCP
listener and the real BookieClient): a read that carries the fence flag, as recovery sends its
reads (LedgerRecoveryCore, TLA+ fix 1, docs/protocol.md#recovery-fence-flag), fences the ledger on
that bookie before it
answers, even when the answer is "no such entry"; from then on a normal add is refused with
FENCED, a recovery add is not, and the fence survives a crash (kill -9) of the bookie. ReadLac
with the fence flag does the same. A read or ReadLac without the flag fences nothing.

The simulation (tests/sim) models bookies with its own SimBookie; these tests hold the real
server to the same rule. Each planted defect (the server ignoring the flag) is caught here.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import AsyncIterator

import pytest

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.client.bookie_client import BookieClient, BookieClientPool
from bookie.server import BookieServer, BookieService
from bookie.storage import Status
from bookie.transport import encode_add_entry
from pulsarlite.checksum import entry_checksum
from pulsarlite.config import LedgerClientConfig
from test_bookie_store import config, crash, entry, started

LEDGER = 11            # entries 0..5 written to this bookie
OTHER_LEDGER = 12      # entries 0..2
UNSEEN_LEDGER = 13     # never written to this bookie


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RealBookie:
    """A BookieServer on a free local port over a real store, and a BookieClient to it."""

    def __init__(self, cfg, store, server, client) -> None:
        self.cfg, self.store, self.server, self.client = cfg, store, server, client
        self.crashed = False

    async def crash(self) -> None:
        """kill -9, as far as the disk is concerned (nothing more is answered)."""
        await self.server.stop(1.0)
        await crash(self.store)
        self.crashed = True


@contextlib.asynccontextmanager
async def real_bookie(tmp_path, name: str = "bookie") -> AsyncIterator[RealBookie]:
    cfg = config(tmp_path / name, host="127.0.0.1", port=free_port())
    store = await started(cfg)
    server = BookieServer(BookieService(store, cfg), cfg)
    await server.start()
    pool = BookieClientPool(LedgerClientConfig(rpc_timeout_ms=10_000, read_timeout_ms=10_000))
    bookie = RealBookie(cfg, store, server, pool.get(cfg.effective_bookie_id))
    try:
        yield bookie
    finally:
        await pool.close()
        if not bookie.crashed:
            await server.stop(1.0)
            await store.close()


async def add(client: BookieClient, ledger_id: int, entry_id: int, *, recovery: bool = False,
              payload: bytes | None = None) -> int:
    """One add as the ledger client sends it (send_add, answered through its callback): the
    status code the bookie answered."""
    payload = payload if payload is not None else b"entry-%d-%d" % (ledger_id, entry_id)
    lac = entry_id - 1
    encoded = encode_add_entry(ledger_id, entry_id, lac, 0, payload,
                               entry_checksum(ledger_id, entry_id, lac, 0, payload))
    answer: asyncio.Future = asyncio.get_running_loop().create_future()

    def done(bookie: str, results: list[tuple[int, int]]) -> None:
        if not answer.done():
            answer.set_result(dict(results)[entry_id])
    client.send_add(entry_id, encoded, recovery, done)
    return await asyncio.wait_for(answer, 10)


async def check_fence_flag_fences(tmp_path) -> None:
    """The rule, step by step; raises AssertionError naming the step that broke."""
    async with real_bookie(tmp_path) as bookie:
        cfg, store, client = bookie.cfg, bookie.store, bookie.client
        for i in range(6):
            assert await add(client, LEDGER, i) == pb.OK
        for i in range(3):
            assert await add(client, OTHER_LEDGER, i) == pb.OK

        # readers that do not fence (open without recovery, tailing) disturb nobody
        r = await client.read(LEDGER, 0, 5)
        assert r.code == pb.OK and len(r.entries) == 6 and not r.fenced, r
        r = await client.read_lac(LEDGER)
        assert r.code == pb.OK and not r.fenced, r
        assert not store.ledger_info(LEDGER).fenced, "a read without the fence flag fenced the ledger"
        assert await add(client, LEDGER, 6) == pb.OK

        # recovery's read of an entry this bookie does not have, with the fence flag, as
        # _RecoveryRun._read sends it: "no such entry" stays true only if the ledger is fenced
        r = await client.read(LEDGER, 7, 7, fence=True)
        assert r.code == pb.NO_SUCH_ENTRY, r
        assert r.fenced, "a read with the fence flag answered without fencing the ledger"
        assert store.ledger_info(LEDGER).fenced, "a read with the fence flag did not fence the ledger"
        # ... so the old writer can no longer complete entry 7 (or any other) on this bookie
        assert await add(client, LEDGER, 7) == pb.FENCED, "normal add accepted after a fenced read"
        # recovery re-writes what it found
        assert await add(client, LEDGER, 6, recovery=True) == pb.OK

        # a fenced read of an entry the bookie has: found, and fenced
        r = await client.read(OTHER_LEDGER, 2, 2, fence=True)
        assert r.code == pb.OK and [e.entry_id for e in r.entries] == [2] and r.fenced, r
        assert await add(client, OTHER_LEDGER, 3) == pb.FENCED, "normal add accepted after a fenced read"

        # a ledger this bookie never saw: the fenced read creates it fenced, so the old
        # writer's first add to it later is refused too
        r = await client.read(UNSEEN_LEDGER, 0, 0, fence=True)
        assert r.code in (pb.NO_SUCH_ENTRY, pb.NO_SUCH_LEDGER), r
        assert await add(client, UNSEEN_LEDGER, 0) == pb.FENCED, \
            "normal add to a never-seen ledger accepted after a fenced read of it"

        # the fence is durable before the answer: it survives kill -9
        await bookie.crash()
    store = await started(cfg)
    try:
        for ledger_id, entry_id in ((LEDGER, 9), (OTHER_LEDGER, 3), (UNSEEN_LEDGER, 0)):
            assert store.ledger_info(ledger_id).fenced, f"ledger {ledger_id}: fence lost in a crash"
            assert await store.add_entries([entry(ledger_id, entry_id, lac=entry_id - 1)]) == [Status.FENCED]
    finally:
        await store.close()


async def check_fencing_read_lac_fences(tmp_path) -> None:
    async with real_bookie(tmp_path) as bookie:
        store, client = bookie.store, bookie.client
        for i in range(3):
            assert await add(client, LEDGER, i) == pb.OK
        r = await client.read_lac(LEDGER, fence=True)
        assert r.code == pb.OK and r.lac == 1, r
        assert r.fenced, "ReadLac with the fence flag answered without fencing the ledger"
        assert store.ledger_info(LEDGER).fenced, "ReadLac with the fence flag did not fence the ledger"
        assert await add(client, LEDGER, 3) == pb.FENCED, "normal add accepted after a fencing ReadLac"
        assert await add(client, LEDGER, 3, recovery=True) == pb.OK


async def test_a_read_with_the_fence_flag_fences_the_ledger(tmp_path):
    await check_fence_flag_fences(tmp_path)


async def test_a_read_lac_with_the_fence_flag_fences_the_ledger(tmp_path):
    await check_fencing_read_lac_fences(tmp_path)


def _ignore_the_flag(monkeypatch, method: str) -> None:
    original = getattr(BookieService, method)

    async def ignoring(self, request):
        request = type(request).FromString(request.SerializeToString())
        request.fence = False
        return await original(self, request)
    monkeypatch.setattr(BookieService, method, ignoring)


async def test_planted_a_server_ignoring_the_fence_flag_on_reads_is_caught(tmp_path, monkeypatch):
    """Planted defect: BookieService.read ignores the fence flag (recovery's reads fence
    nothing; the old writer could complete an entry recovery found missing)."""
    _ignore_the_flag(monkeypatch, "read")
    with pytest.raises(AssertionError, match="read with the fence flag answered without fencing"):
        await check_fence_flag_fences(tmp_path)
    await check_fencing_read_lac_fences(tmp_path / "other")   # ReadLac still fences: only reads broke


async def test_planted_a_server_ignoring_the_fence_flag_on_read_lac_is_caught(tmp_path, monkeypatch):
    _ignore_the_flag(monkeypatch, "read_lac")
    with pytest.raises(AssertionError, match="ReadLac with the fence flag answered without fencing"):
        await check_fencing_read_lac_fences(tmp_path)
