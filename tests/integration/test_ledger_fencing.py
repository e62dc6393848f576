"""Fencing on real bookie processes and a real ZooKeeper: opening a ledger WITHOUT recovery
(a Spark scan, a tailing reader) leaves its writer alone: no bookie gets the ledger fenced, the
writer keeps adding and closes it normally; opening WITH recovery fences it. The planted defect
(the non-recovery open sending the fence flag) is caught by the same check."""

from __future__ import annotations

import pytest

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.client import ledger_client as ledger_client_module
from bookie.client import reader as reader_module
from bookie.client.ledger_client import LedgerClient
from bookie.client.metadata import LedgerState
from pulsarlite.errors import LedgerFencedError

from .test_ledgers import connect, payload_for, start_cluster

pytestmark = pytest.mark.integration

_REAL_READ_LAC = reader_module.read_lac


async def fenced_bookies(client: LedgerClient, ledger_id: int, bookies) -> list[str]:
    """The bookies that say the ledger is fenced (asked without the fence flag)."""
    out = []
    for bookie in bookies:
        r = await client.pool.get(bookie).read_lac(ledger_id, fence=False)
        assert r.code == pb.OK, r
        if r.fenced:
            out.append(bookie)
    return out


async def check_tailing_leaves_the_writer_alone(cluster) -> None:
    owner = await connect(cluster)
    tailer = await connect(cluster, read_entries_per_request_max=16)
    try:
        writer = await owner.create_ledger(3, 3, 2)
        ledger_id = writer.ledger_id
        for i in range(100):
            await writer.add(payload_for(i))
        seen: list[bytes] = []
        for round_ in range(3):
            reader = await tailer.open_ledger(ledger_id, recovery=False)
            assert reader.metadata.state is LedgerState.OPEN
            last = reader.last_readable_entry_id
            assert last <= writer.last_add_confirmed
            seen += [e.payload for e in await reader.read(len(seen), last)] if last >= len(seen) else []
            await reader.refresh_lac()
            # the writer goes on: fenced here if the open (or the refresh) fenced its ledger
            for i in range(100 * (round_ + 1), 100 * (round_ + 2)):
                await writer.add(payload_for(i))
        assert seen == [payload_for(i) for i in range(len(seen))] and len(seen) >= 299
        fenced = await fenced_bookies(tailer, ledger_id, writer.metadata.current_ensemble)
        assert not fenced, f"ledger fenced on {fenced} by a non-recovery open"
        md = await writer.close()
        assert md.state is LedgerState.CLOSED and md.last_entry_id == 399
        reader = await tailer.open_ledger(ledger_id, recovery=False)
        got = [e.payload for e in await reader.read(0, 399)]
        assert got == [payload_for(i) for i in range(400)]
    finally:
        await owner.close()
        await tailer.close()


async def test_open_without_recovery_leaves_the_writer_alone(cluster_factory):
    cluster = await start_cluster(cluster_factory, 3)
    await check_tailing_leaves_the_writer_alone(cluster)
    # and the check sees a fence when there is one: an open WITH recovery fences the writer
    owner, other = await connect(cluster), await connect(cluster)
    try:
        writer = await owner.create_ledger(3, 3, 2)
        for i in range(10):
            await writer.add(payload_for(i))
        reader = await other.open_ledger(writer.ledger_id, recovery=True)
        assert reader.metadata.is_closed and reader.metadata.last_entry_id == 9
        assert sorted(await fenced_bookies(other, writer.ledger_id, writer.metadata.current_ensemble)) == \
            sorted(writer.metadata.current_ensemble)
        with pytest.raises(LedgerFencedError):
            await writer.add(b"after the takeover")
    finally:
        await owner.close()
        await other.close()


async def test_planted_a_non_recovery_open_that_fences_is_caught(cluster_factory, monkeypatch):
    """Planted defect: open_ledger(recovery=False) reads the LAC with the fence flag."""
    async def fencing_read_lac(metadata, pool, *, fence):
        return await _REAL_READ_LAC(metadata, pool, fence=True)
    monkeypatch.setattr(ledger_client_module, "read_lac", fencing_read_lac)
    cluster = await start_cluster(cluster_factory, 3)
    with pytest.raises((AssertionError, LedgerFencedError), match="fence"):
        await check_tailing_leaves_the_writer_alone(cluster)
