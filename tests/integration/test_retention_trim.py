"""ManagedLedger.trim_ledgers on real ZooKeeper and bookie processes: ledgers leave the list by
CAS first, then the bookies; a failure (or a crash) in between leaves them recorded in the list
property, and the next trim -- by this owner or the next one -- deletes them."""

from __future__ import annotations

import asyncio

import pytest

from bookie.client.ledger_client import LedgerClient
from broker.managed_ledger import ManagedLedger, ManagedLedgerConfig, Position
from broker.managed_ledger.shell import TRIMMED_PROPERTY
from broker.managed_ledger.store import ManagedLedgerStore
from pulsarlite.config import LedgerClientConfig
from pulsarlite.errors import BookieUnavailableError, InvariantViolation

pytestmark = pytest.mark.integration

NAME = "public/default/persistent/trim"


async def start(cluster_factory):
    cluster = await asyncio.to_thread(cluster_factory, 3)
    client = await LedgerClient.connect(LedgerClientConfig(zookeeper=cluster.zookeeper))
    return cluster, client


async def fill(ml: ManagedLedger, n: int) -> None:
    futures = [ml.add_async(f"e{i}".encode(), 1_700_000_000_000 + i) for i in range(n)]
    await asyncio.gather(*futures)
    for _ in range(500):                     # the last rollover finishes after the last add
        if ml.ledgers()[-1].entries < 10 and ml.state.value == "READY":
            return
        await asyncio.sleep(0.02)


async def test_trim_deletes_from_the_list_then_the_bookies(cluster_factory):
    cluster, client = await start(cluster_factory)
    try:
        ml = await ManagedLedger.open(NAME, ledger_client=client, store=client.store,
                                      config=ManagedLedgerConfig(rollover_entries_max=10))
        await fill(ml, 45)
        ids = [i.ledger_id for i in ml.ledgers()]
        assert len(ids) >= 5
        assert set(ids) <= set(await client.ledger_manager.list_ledger_ids())
        # only a CLOSED prefix may be trimmed
        with pytest.raises(InvariantViolation):
            await ml.trim_ledgers([ids[1]])
        with pytest.raises(InvariantViolation):
            await ml.trim_ledgers(ids)               # the current ledger never
        assert [i.ledger_id for i in ml.ledgers()] == ids

        assert await ml.trim_ledgers(ids[:2]) == ids[:2]
        assert [i.ledger_id for i in ml.ledgers()] == ids[2:]
        stored, _, _ = await ManagedLedgerStore(client.store).read(NAME)
        assert stored.ledger_ids == ids[2:] and TRIMMED_PROPERTY not in stored.properties
        left = set(await client.ledger_manager.list_ledger_ids())
        assert not (set(ids[:2]) & left) and set(ids[2:]) <= left
        # reads from a trimmed position continue at the first ledger that is left
        got = await ml.read_entries(Position(ids[0], 0), 3)
        assert [p.ledger_id for p, _ in got] == [ids[2]] * 3
        await ml.close()
    finally:
        await client.close()


async def test_failed_deletion_is_recorded_and_finished_by_the_next_owner(cluster_factory):
    cluster, client = await start(cluster_factory)
    client2 = None
    try:
        ml = await ManagedLedger.open(NAME, ledger_client=client, store=client.store,
                                      config=ManagedLedgerConfig(rollover_entries_max=10))
        await fill(ml, 35)
        ids = [i.ledger_id for i in ml.ledgers()]

        real_delete = client.delete_ledger

        async def broken(ledger_id: int) -> None:      # the bookies unreachable after the CAS
            raise BookieUnavailableError(f"injected: cannot delete ledger {ledger_id}")

        client.delete_ledger = broken
        assert await ml.trim_ledgers(ids[:2]) == []
        assert [i.ledger_id for i in ml.ledgers()] == ids[2:]          # out of the list first
        assert set(ml.trimmed_pending()) == set(ids[:2])
        assert set(ids[:2]) <= set(await client.ledger_manager.list_ledger_ids())   # not deleted yet
        client.delete_ledger = real_delete

        # "crash": this owner goes away without another trim; the next owner opens the list
        # (fencing) and its first trim, even of nothing, finishes the deletion
        client2 = await LedgerClient.connect(LedgerClientConfig(zookeeper=cluster.zookeeper))
        ml2 = await ManagedLedger.open(NAME, ledger_client=client2, store=client2.store,
                                       config=ManagedLedgerConfig(rollover_entries_max=10))
        assert set(ml2.trimmed_pending()) == set(ids[:2])
        assert sorted(await ml2.trim_ledgers([])) == sorted(ids[:2])
        assert ml2.trimmed_pending() == {}
        stored, _, _ = await ManagedLedgerStore(client2.store).read(NAME)
        assert TRIMMED_PROPERTY not in stored.properties
        assert not (set(ids[:2]) & set(await client2.ledger_manager.list_ledger_ids()))
        await ml2.close()
    finally:
        await client.close()
        if client2 is not None:
            await client2.close()
