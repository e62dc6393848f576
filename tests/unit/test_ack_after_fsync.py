"""Invariant 2: a bookie acknowledges an add only after its journal record is fsynced.

kill -9 cannot catch a violation (the page cache survives a process crash), so this test models
a power loss: every journal write is recorded, an fdatasync makes the writes before it on that
file durable, and before reopening, whatever was written but never synced is zeroed out on disk
(as if it never reached the platter). Every acknowledged entry must survive that. The negative
control acks without syncing and checks that the same procedure does lose entries, so the test
can fail.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest


import bookie.storage.journal as journal_mod
from bookie.storage import BookieStore, Status
from test_bookie_store import config, crash, entry, started


class PowerLossModel:
    def __init__(self, monkeypatch, *, honour_fsync: bool = True) -> None:
        self.unsynced: dict[str, list[tuple[int, int]]] = {}  # path -> [(offset, length)]
        self.fd_paths: dict[int, str] = {}
        self.sync_threads: list[int] = []        # the thread of each journal fdatasync
        real_pwrite = journal_mod.pwrite_all
        real_pwritev = journal_mod.pwritev_all
        real_fdatasync = os.fdatasync

        def record(fd, offset, length):
            path = os.readlink(f"/proc/self/fd/{fd}")
            self.fd_paths[fd] = path
            self.unsynced.setdefault(path, []).append((offset, length))

        def pwrite_all(fd, data, offset):
            record(fd, offset, len(data))
            return real_pwrite(fd, data, offset)

        def pwritev_all(fd, pieces, offset):      # the journal's group writes
            record(fd, offset, sum(map(len, pieces)))
            return real_pwritev(fd, pieces, offset)

        def fdatasync(fd):
            real_fdatasync(fd)
            path = self.fd_paths.get(fd)
            if path is not None and path.endswith(".journal"):
                self.sync_threads.append(threading.get_ident())
            if path is not None and honour_fsync:
                self.unsynced[path] = []

        monkeypatch.setattr(journal_mod, "pwrite_all", pwrite_all)
        monkeypatch.setattr(journal_mod, "pwritev_all", pwritev_all)
        monkeypatch.setattr(journal_mod.os, "fdatasync", fdatasync)

    def lose_unsynced_writes(self) -> int:
        lost = 0
        for path, ranges in self.unsynced.items():
            if not os.path.exists(path):
                continue
            with open(path, "r+b") as f:
                for offset, length in ranges:
                    f.seek(offset)
                    f.write(b"\0" * length)
                    lost += length
        return lost


async def write_then_power_loss(tmp_path, model: PowerLossModel, *,
                                inline_writes: bool) -> tuple[dict, BookieStore]:
    """With ``inline_writes`` the store may write and sync a small group on the event loop
    when the journal is idle (BookieStore._write_inline); without, the journal thread does
    every write and sync."""
    cfg = config(tmp_path, group_wait_ms_max=5.0,
                 journal_write_inline_bytes_max=64 * 1024 if inline_writes else 0)
    store = await started(cfg)
    acked: dict[tuple[int, int], bytes] = {}
    groups_before = store._journal.groups_written

    async def writer(ledger: int) -> None:
        for start in range(0, 200, 20):
            batch = [entry(ledger, e) for e in range(start, start + 20)]
            statuses = await store.add_entries(batch)
            for e, s in zip(batch, statuses):
                if s == Status.OK:
                    acked[(e.ledger_id, e.entry_id)] = e.payload

    # leave some adds in flight when the power goes
    tasks = [asyncio.ensure_future(writer(ledger)) for ledger in (1, 2, 3)]
    await asyncio.gather(*tasks)
    assert store._journal.groups_written > groups_before
    extra = asyncio.ensure_future(store.add_entries([entry(9, e) for e in range(50)]))
    await asyncio.sleep(0)
    await crash(store)
    extra.cancel()
    model.lose_unsynced_writes()
    reopened = BookieStore.open(cfg)
    return acked, reopened


@pytest.mark.parametrize("inline_writes", [False, True], ids=["journal-thread", "inline-writes"])
async def test_every_acknowledged_add_survives_losing_unsynced_writes(tmp_path, monkeypatch, inline_writes):
    model = PowerLossModel(monkeypatch)
    acked, reopened = await write_then_power_loss(tmp_path, model, inline_writes=inline_writes)
    assert len(acked) == 600
    # with inline writes, small groups on an idle journal were synced by the event loop's thread
    assert (threading.get_ident() in model.sync_threads) == inline_writes
    try:
        for (ledger, entry_id), payload in acked.items():
            status, entries = reopened.read(ledger, entry_id, entry_id, 1 << 20)
            assert status == Status.OK and entries[0].payload == payload, (ledger, entry_id)
    finally:
        await reopened.close()


@pytest.mark.parametrize("inline_writes", [False, True], ids=["journal-thread", "inline-writes"])
async def test_negative_control_acking_without_fsync_loses_entries(tmp_path, monkeypatch, inline_writes):
    """If fdatasync did not make writes durable (an ack before the data is on disk), the same
    power loss loses acknowledged entries: proof that the check above can fail."""
    model = PowerLossModel(monkeypatch, honour_fsync=False)
    acked, reopened = await write_then_power_loss(tmp_path, model, inline_writes=inline_writes)
    try:
        missing = [k for k in acked if reopened.read(k[0], k[1], k[1], 1 << 20)[0] != Status.OK]
        assert missing, "the power-loss model did not lose anything: the check above could never fail"
    finally:
        await reopened.close()
