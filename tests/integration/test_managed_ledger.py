"""Managed ledgers on a real ZooKeeper and 3 real bookie processes: appends across rollovers,
reads back with exact positions, a second owner fencing the first, age rollover with an
injected clock, list stats, delete."""

from __future__ import annotations

import asyncio
import json

import pytest

from bookie.client.ledger_client import LedgerClient
from bookie.client.metadata import LedgerState
from broker.managed_ledger import (LedgerInfoState, ManagedLedger, ManagedLedgerClosedError, ManagedLedgerConfig,
                                   ManagedLedgerFencedError, ManagedLedgerState, Position)
from pulsarlite.config import LedgerClientConfig
from pulsarlite.errors import MetadataNotFoundError
from pulsarlite.metadata import MetadataStore
from pulsarlite.metadata_layout import managed_ledger_path

pytestmark = pytest.mark.integration

NAME = "public/default/persistent/topic-a"
BASE_TIME_MS = 1_700_000_000_000


def payload_for(i: int) -> bytes:
    return f"m-{i:06d}-".encode() + bytes([i % 251]) * (i % 53)


def publish_time_for(i: int) -> int:
    return BASE_TIME_MS + (i * 7919) % 10_000   # not monotonic on purpose


class FakeClock:
    def __init__(self, now_ms: int = BASE_TIME_MS) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


async def wait_for(condition, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached")


async def start_cluster(cluster_factory):
    return await asyncio.to_thread(cluster_factory, 3)


async def connect(cluster) -> LedgerClient:
    return await LedgerClient.connect(LedgerClientConfig(zookeeper=cluster.zookeeper))


async def append(ml: ManagedLedger, first: int, count: int, *, window: int = 300) -> dict[Position, int]:
    """Add ``count`` entries (numbers first..) with ``window`` in flight; position -> number."""
    acked: dict[Position, int] = {}
    inflight: list[tuple[int, asyncio.Future]] = []
    for i in range(first, first + count):
        inflight.append((i, ml.add_async(payload_for(i), publish_time_for(i))))
        if len(inflight) >= window:
            j, fut = inflight.pop(0)
            acked[await fut] = j
    for j, fut in inflight:
        acked[await fut] = j
    return acked


async def read_all(ml: ManagedLedger, start: Position, batch: int = 700) -> list[tuple[Position, bytes]]:
    out = []
    position = start
    while True:
        got = await ml.read_entries(position, batch)
        if not got:
            return out
        out.extend(got)
        last = got[-1][0]
        position = Position(last.ledger_id, last.entry_id + 1)


async def test_append_rollover_read_back_and_stats(cluster_factory):
    cluster = await start_cluster(cluster_factory)
    client = await connect(cluster)
    config = ManagedLedgerConfig(rollover_entries_max=500, read_entries_max=700)
    try:
        ml = await ManagedLedger.open(NAME, ledger_client=client, store=client.store, config=config)
        assert ml.state is ManagedLedgerState.READY
        acked = await append(ml, 0, 2600)
        positions = sorted(acked)
        # confirmations are in order: positions sorted == add order
        assert [acked[p] for p in positions] == list(range(2600))
        assert ml.last_confirmed_position == positions[-1]
        ledgers = ml.ledgers()
        assert len(ledgers) == 6
        assert [i.entries for i in ledgers] == [500] * 5 + [100]
        assert all(i.state is LedgerInfoState.CLOSED for i in ledgers[:5])
        assert ledgers[-1].state is LedgerInfoState.OPEN
        # exact positions: ledger k holds numbers 500k .. 500k+499 at entries 0..499
        for k, info in enumerate(ledgers):
            for e in (0, info.entries - 1):
                assert acked[Position(info.ledger_id, e)] == 500 * k + e

        got = await read_all(ml, Position(ledgers[0].ledger_id, 0))
        assert [p for p, _ in got] == positions
        assert all(payload == payload_for(acked[p]) for p, payload in got)
        # a start in the middle, crossing a ledger boundary
        mid = await ml.read_entries(Position(ledgers[1].ledger_id, 498), 4)
        assert [p for p, _ in mid] == [Position(ledgers[1].ledger_id, 498), Position(ledgers[1].ledger_id, 499),
                                       Position(ledgers[2].ledger_id, 0), Position(ledgers[2].ledger_id, 1)]

        await ml.close()
        assert ml.state is ManagedLedgerState.CLOSED
        with pytest.raises(ManagedLedgerClosedError):
            ml.add_async(b"x", BASE_TIME_MS)

        # the stored list: stats of every ledger, checked against what was written
        data, _ = await client.store.get(managed_ledger_path(NAME))
        stored = json.loads(data)
        assert [r["ledger_id"] for r in stored["ledgers"]] == [i.ledger_id for i in ledgers]
        for k, r in enumerate(stored["ledgers"]):
            numbers = range(500 * k, min(500 * k + 500, 2600))
            assert r["state"] == "CLOSED"
            assert r["entries"] == len(numbers)
            assert r["size_bytes"] == sum(len(payload_for(i)) for i in numbers)
            assert r["min_publish_time_ms"] == min(publish_time_for(i) for i in numbers)
            assert r["max_publish_time_ms"] == max(publish_time_for(i) for i in numbers)
            assert r["offload"] == {"state": "none", "uri": None}
            md, _ = await client.ledger_manager.read(r["ledger_id"])
            assert md.state is LedgerState.CLOSED and md.last_entry_id == len(numbers) - 1
            assert (md.ensemble_size, md.write_quorum, md.ack_quorum) == (3, 3, 2)

        # reopen (same owner, clean close): all entries readable, a new ledger appended
        ml2 = await ManagedLedger.open(NAME, ledger_client=client, store=client.store, config=config)
        assert ml2.last_confirmed_position == positions[-1]
        assert len(ml2.ledgers()) == 7
        got2 = await read_all(ml2, Position(0, 0))
        assert [p for p, _ in got2] == positions
        more = await append(ml2, 2600, 10)
        assert min(more).ledger_id == ml2.ledgers()[-1].ledger_id
        await ml2.close()
    finally:
        await client.close()


async def test_second_owner_fences_first(cluster_factory):
    cluster = await start_cluster(cluster_factory)
    client1 = await connect(cluster)
    client2 = await connect(cluster)
    config = ManagedLedgerConfig(rollover_entries_max=400)
    try:
        ml1 = await ManagedLedger.open(NAME, ledger_client=client1, store=client1.store, config=config)
        acked = await append(ml1, 0, 1000)
        # adds in flight while the second owner takes over
        inflight = [(i, ml1.add_async(payload_for(i), publish_time_for(i))) for i in range(1000, 1300)]
        first_owner_last_ledger = ml1.current_ledger_id

        ml2 = await ManagedLedger.open(NAME, ledger_client=client2, store=client2.store, config=config)
        results = await asyncio.gather(*(f for _, f in inflight), return_exceptions=True)
        for (i, _), r in zip(inflight, results):
            if isinstance(r, Position):
                acked[r] = i
            else:
                assert isinstance(r, ManagedLedgerFencedError), r
        # the first owner never appends again
        for _ in range(3):
            try:
                fut = ml1.add_async(b"late", BASE_TIME_MS)
            except ManagedLedgerFencedError:
                continue
            with pytest.raises(ManagedLedgerFencedError):
                await fut
        await asyncio.sleep(0.2)
        assert ml1.state is ManagedLedgerState.FENCED
        with pytest.raises(ManagedLedgerFencedError):
            ml1.add_async(b"late", BASE_TIME_MS)

        # the first owner's last ledger is CLOSED where the recovery closed it, which covers
        # every acknowledged entry; the new owner's list says the same
        md, _ = await client2.ledger_manager.read(first_owner_last_ledger)
        assert md.state is LedgerState.CLOSED
        info = next(i for i in ml2.ledgers() if i.ledger_id == first_owner_last_ledger)
        assert info.state is LedgerInfoState.CLOSED and info.entries == md.last_entry_id + 1
        assert info.size_bytes == md.length
        acked_there = [p.entry_id for p in acked if p.ledger_id == first_owner_last_ledger]
        assert max(acked_there) <= md.last_entry_id
        assert all(i.state is LedgerInfoState.CLOSED for i in ml2.ledgers()[:-1])

        # every acknowledged entry is readable from the new owner, at its position, in order
        got = await read_all(ml2, Position(0, 0))
        got_map = dict(got)
        for p, i in acked.items():
            assert got_map[p] == payload_for(i)
        # entries past the acknowledged ones (recovered, never confirmed) are earlier adds only
        assert [p for p, _ in got] == sorted(got_map)
        before = len(got)

        more = await append(ml2, 5000, 50)
        assert all(p.ledger_id == ml2.current_ledger_id for p in more)
        got_after = await read_all(ml2, Position(0, 0))
        assert len(got_after) == before + 50
        await ml1.close()           # releases; writes nothing
        assert ml1.state is ManagedLedgerState.FENCED
        await ml2.close()
    finally:
        await client1.close()
        await client2.close()


async def test_new_owner_after_first_session_is_gone(cluster_factory):
    """The first owner disappears without closing (its client closed, ledger left OPEN); the new
    owner recovers the open ledger and sees every acknowledged entry."""
    cluster = await start_cluster(cluster_factory)
    client1 = await connect(cluster)
    config = ManagedLedgerConfig(rollover_entries_max=300)
    ml1 = await ManagedLedger.open(NAME, ledger_client=client1, store=client1.store, config=config)
    acked = await append(ml1, 0, 700)
    stored_open = [i.ledger_id for i in ml1.metadata.ledgers if i.state is LedgerInfoState.OPEN]
    assert stored_open == [ml1.current_ledger_id]
    await client1.close()
    client2 = await connect(cluster)
    try:
        ml2 = await ManagedLedger.open(NAME, ledger_client=client2, store=client2.store, config=config)
        ledgers = ml2.ledgers()
        assert [i.entries for i in ledgers] == [300, 300, 100, 0]
        recovered = ledgers[2]
        # publish times of a recovered ledger are unknown without an extractor
        assert recovered.min_publish_time_ms is None and recovered.max_publish_time_ms is None
        got = await read_all(ml2, Position(0, 0))
        assert [p for p, _ in got] == sorted(acked)
        assert all(payload_for(acked[p]) == payload for p, payload in got)
        await ml2.close()
    finally:
        await client2.close()


async def test_recovery_computes_publish_times_with_extractor(cluster_factory):
    cluster = await start_cluster(cluster_factory)
    client1 = await connect(cluster)
    ml1 = await ManagedLedger.open(NAME, ledger_client=client1, store=client1.store)
    await append(ml1, 0, 50)
    await client1.close()   # gone without closing
    client2 = await connect(cluster)
    try:
        def extract(payload: bytes) -> int:
            return publish_time_for(int(payload[2:8]))

        ml2 = await ManagedLedger.open(NAME, ledger_client=client2, store=client2.store, publish_time_of=extract)
        first = ml2.ledgers()[0]
        assert first.entries == 50
        assert first.min_publish_time_ms == min(publish_time_for(i) for i in range(50))
        assert first.max_publish_time_ms == max(publish_time_for(i) for i in range(50))
        await ml2.close()
    finally:
        await client2.close()


async def test_rollover_by_age_with_injected_clock(cluster_factory):
    cluster = await start_cluster(cluster_factory)
    client = await connect(cluster)
    clock = FakeClock()
    config = ManagedLedgerConfig(rollover_age_ms_max=60_000, tick_interval_ms=20)
    try:
        ml = await ManagedLedger.open(NAME, ledger_client=client, store=client.store, config=config, clock=clock)
        first_ledger = ml.current_ledger_id
        await append(ml, 0, 10)
        clock.now_ms += 59_000
        await asyncio.sleep(0.2)
        assert ml.current_ledger_id == first_ledger
        clock.now_ms += 1_000
        await wait_for(lambda: ml.current_ledger_id != first_ledger and ml.state is ManagedLedgerState.READY)
        second_ledger = ml.current_ledger_id
        ledgers = ml.ledgers()
        assert ledgers[0].state is LedgerInfoState.CLOSED and ledgers[0].entries == 10
        assert ledgers[0].created_ms == BASE_TIME_MS
        assert ledgers[1].created_ms == clock.now_ms
        # an empty ledger never rolls by age
        clock.now_ms += 600_000
        await asyncio.sleep(0.2)
        assert ml.current_ledger_id == second_ledger
        # ... but its age counts from its creation: the first add lands in it and rolls it
        # over at once; the next ones queue for the third ledger
        more = sorted(await append(ml, 10, 5))
        assert more[0].ledger_id == second_ledger
        assert all(p.ledger_id == ml.current_ledger_id != second_ledger for p in more[1:])
        assert [i.entries for i in ml.ledgers()] == [10, 1, 4]
        await ml.close()
    finally:
        await client.close()


async def test_adds_during_rollover_keep_order(cluster_factory):
    """Many adds in flight across many rollovers (entries_max 7, window 500): no loss, no
    reorder, every closed ledger holds exactly 7 entries."""
    cluster = await start_cluster(cluster_factory)
    client = await connect(cluster)
    config = ManagedLedgerConfig(rollover_entries_max=7)
    try:
        ml = await ManagedLedger.open(NAME, ledger_client=client, store=client.store, config=config)
        acked = await append(ml, 0, 300, window=500)
        assert [acked[p] for p in sorted(acked)] == list(range(300))
        ledgers = ml.ledgers()
        assert [i.entries for i in ledgers[:-1]] == [7] * (300 // 7)
        assert ledgers[-1].entries == 300 % 7
        got = await read_all(ml, Position(0, 0))
        assert [payload for _, payload in got] == [payload_for(i) for i in range(300)]
        await ml.close()
    finally:
        await client.close()


async def test_delete_removes_ledgers_and_znode(cluster_factory):
    cluster = await start_cluster(cluster_factory)
    client = await connect(cluster)
    config = ManagedLedgerConfig(rollover_entries_max=100)
    try:
        ml = await ManagedLedger.open(NAME, ledger_client=client, store=client.store, config=config)
        await append(ml, 0, 250)
        ids = [i.ledger_id for i in ml.ledgers()]
        assert len(ids) == 3
        await ml.delete()
        assert ml.state is ManagedLedgerState.DELETED
        assert not await client.store.exists(managed_ledger_path(NAME))
        for ledger_id in ids:
            assert not await client.ledger_manager.exists(ledger_id)
            with pytest.raises(MetadataNotFoundError):
                await client.ledger_manager.read(ledger_id)
        # the name can be used again: a fresh, empty managed ledger
        ml2 = await ManagedLedger.open(NAME, ledger_client=client, store=client.store, config=config)
        assert len(ml2.ledgers()) == 1 and ml2.ledgers()[0].entries == 0
        assert await ml2.read_entries(Position(0, 0), 10) == []
        await ml2.close()
    finally:
        await client.close()


async def test_bad_name_and_config_rejected(zk_hosts):
    store = await MetadataStore.connect(zk_hosts)
    try:
        from pulsarlite.errors import ConfigError
        with pytest.raises(ValueError):
            await ManagedLedger.open("no-namespace", ledger_client=None, store=store)  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            await ManagedLedger.open(NAME, ledger_client=None, store=store,  # type: ignore[arg-type]
                                     config=ManagedLedgerConfig(write_quorum=4))
        assert not await store.exists(managed_ledger_path(NAME))
    finally:
        await store.close()


async def test_cached_readers_follow_fragments_that_autorecovery_moved(cluster_factory):
    """A broker keeps readers of closed ledgers; autorecovery moves a fragment off a bookie lost
    for good; a second bookie then dies. A read through the cached reader (metadata naming both
    dead bookies for some entries) must be retried with the metadata as it is now."""
    fast = {"lost_bookie_recovery_delay_ms": 1_000, "replication_poll_interval_ms": 200,
            "audit_interval_ms": 5_000, "replication_retry_delay_ms_max": 1_000}
    cluster = await asyncio.to_thread(cluster_factory, 5, bookie_overrides=fast)
    client = await connect(cluster)
    config = ManagedLedgerConfig(rollover_entries_max=50, read_entries_max=100,
                                 ensemble_size=3, write_quorum=2, ack_quorum=2)
    try:
        ml = await ManagedLedger.open(NAME, ledger_client=client, store=client.store, config=config)
        acked = await append(ml, 0, 120)
        first = ml.ledgers()[0]
        assert first.state is LedgerInfoState.CLOSED and first.entries == 50
        got = await ml.read_entries(Position(first.ledger_id, 0), 50)      # caches its reader
        assert [payload for _, payload in got] == [payload_for(acked[p]) for p, _ in got]
        md, _ = await client.ledger_manager.read(first.ledger_id)
        lost, second = md.current_ensemble[0], md.current_ensemble[1]   # a write set of E3 Qw2
        by_id = {cluster.records[n].bookie_id: n for n in cluster.bookie_names}
        await asyncio.to_thread(cluster.kill, by_id[lost])
        deadline = asyncio.get_running_loop().time() + 120
        while lost in md.all_bookies():
            assert asyncio.get_running_loop().time() < deadline, f"{lost} still in {md.ensembles}"
            await asyncio.sleep(0.5)
            md, _ = await client.ledger_manager.read(first.ledger_id)
        await asyncio.to_thread(cluster.kill, by_id[second])
        got = await ml.read_entries(Position(first.ledger_id, 0), 50)
        assert [p for p, _ in got] == [Position(first.ledger_id, e) for e in range(50)]
        assert [payload for _, payload in got] == [payload_for(acked[p]) for p, _ in got]
    finally:
        await client.close()
