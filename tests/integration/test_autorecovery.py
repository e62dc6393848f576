"""Autorecovery on real ZooKeeper and real bookie processes: a bookie lost for good is
re-replicated away (auditor in the bookies, replication workers), two workers race for one
ledger, a live bookie is decommissioned."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time

import pytest

from bookie.autorecovery.urmanager import UnderReplicationManager
from bookie.autorecovery.worker import ReplicationWorker
from bookie.client.ledger_client import LedgerClient
from pulsarlite.config import LedgerClientConfig

pytestmark = pytest.mark.integration

# A killed bookie is seen lost when its ZooKeeper session expires: 5 s here (10 s by default);
# the tests that race a worker's session against its copy set 4 s themselves.
FAST = {"lost_bookie_recovery_delay_ms": 1_000, "replication_poll_interval_ms": 200,
        "audit_interval_ms": 5_000, "replication_retry_delay_ms_max": 1_000, "zk_session_timeout_ms": 5_000}
REPAIR_TIMEOUT_S = 120.0


def payload_for(ledger: int, i: int) -> bytes:
    return f"l{ledger}-e{i:05d}-".encode() + bytes([(i * 7 + ledger) % 251]) * (i % 113)


async def connect(cluster) -> LedgerClient:
    return await LedgerClient.connect(LedgerClientConfig(zookeeper=cluster.zookeeper, add_timeout_ms=10_000))


def name_of(cluster, bookie_id: str) -> str:
    return next(n for n in cluster.bookie_names if cluster.records[n].bookie_id == bookie_id)


async def write_ledger(client, e, w, a, entries, index, written) -> int:
    writer = await client.create_ledger(e, w, a)
    futs = [writer.add_async(payload_for(writer.ledger_id, i)) for i in range(entries)]
    await asyncio.gather(*futs)
    await writer.close()
    written[writer.ledger_id] = entries
    return writer.ledger_id


async def bookkeeper(cluster, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pulsarlite", "bookkeeper", "--zookeeper", cluster.zookeeper, *args]
    return await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=timeout_s)


async def ledgers_naming(client, bookie: str) -> list[int]:
    return [md.ledger_id for md in await client.ledger_manager.ledgers_naming([bookie])]


async def wait_until_nothing_names(client, cluster, bookie: str) -> None:
    """Poll with a deadline (no assertion on speed) until no ledger's metadata names ``bookie``
    and nothing is marked under-replicated."""
    deadline = time.monotonic() + REPAIR_TIMEOUT_S
    while True:
        naming = await ledgers_naming(client, bookie)
        marks = None
        if not naming:
            proc = await bookkeeper(cluster, "listunderreplicated", "--json")
            assert proc.returncode == 0, proc.stderr
            marks = json.loads(proc.stdout)
            if marks == []:
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"after {REPAIR_TIMEOUT_S}s ledgers {naming} still name {bookie}; marks {marks}")
        await asyncio.sleep(0.5)


async def read_everything(client, written: dict[int, int]) -> None:
    for lid, entries in written.items():
        reader = await client.open_ledger(lid, recovery=False)
        assert reader.last_readable_entry_id == entries - 1
        got = await reader.read(0, entries - 1)
        assert [e.payload for e in got] == [payload_for(lid, i) for i in range(entries)], lid


async def test_a_bookie_lost_for_good_is_re_replicated_and_a_second_loss_loses_nothing(cluster_factory):
    cluster = await asyncio.to_thread(cluster_factory, 5, bookie_overrides=FAST)
    client = await connect(cluster)
    try:
        written: dict[int, int] = {}
        for k in range(6):
            e, w, a = ((3, 2, 2), (3, 3, 2), (4, 2, 2))[k % 3]
            await write_ledger(client, e, w, a, 60 + 17 * k, k, written)
        # a ledger that changes its ensemble when the victim dies mid-write: two fragments
        writer = await client.create_ledger(3, 2, 2)
        victim = writer.metadata.current_ensemble[0]
        lid = writer.ledger_id
        await asyncio.gather(*(writer.add_async(payload_for(lid, i)) for i in range(50)))
        await asyncio.to_thread(cluster.kill, name_of(cluster, victim))
        await asyncio.gather(*(writer.add_async(payload_for(lid, i)) for i in range(50, 100)))
        await writer.close()
        written[lid] = 100
        assert victim in (await client.ledger_manager.read(lid))[0].ensembles[0][1]
        assert len(await ledgers_naming(client, victim)) >= 1

        await wait_until_nothing_names(client, cluster, victim)
        proc = await bookkeeper(cluster, "ledgermetadata", str(lid))
        assert proc.returncode == 0 and victim not in proc.stdout
        proc = await bookkeeper(cluster, "autorecovery", "status", "--json")
        status = json.loads(proc.stdout)
        assert status["under_replicated_ledgers"] == 0 and status["auditor"] is not None

        # a second bookie dies (kill -9): every entry of every ledger still reads back
        live = [b for b in client.writable_bookies if b != victim]
        second = live[0]
        await asyncio.to_thread(cluster.kill, name_of(cluster, second))
        await read_everything(client, written)
    finally:
        await client.close()


async def test_two_workers_racing_for_one_ledger_only_one_copies(cluster_factory):
    cluster = await asyncio.to_thread(cluster_factory, 4, bookie_overrides={"autorecovery_enabled": False})
    client = await connect(cluster)
    clients = [await connect(cluster), await connect(cluster)]
    try:
        written: dict[int, int] = {}
        writer = await client.create_ledger(3, 3, 2)
        lid = writer.ledger_id
        big = [payload_for(lid, i) + b"x" * 2000 for i in range(30)]
        await asyncio.gather(*(writer.add_async(p) for p in big))
        await writer.close()
        victim = writer.metadata.current_ensemble[1]
        await asyncio.to_thread(cluster.kill, name_of(cluster, victim))
        proc = await bookkeeper(cluster, "recover", victim, "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["ledgers_marked"] == [lid]
        # no worker runs yet: a bounded wait reports the ledger still naming it, exit 1
        proc = await bookkeeper(cluster, "recover", victim, "--json", "--wait-s", "0.5")
        assert proc.returncode == 1 and json.loads(proc.stdout)["ledgers_naming_it"] == [lid]

        # slow copies (throttled to ~20 KB/s after a one-second burst), so the race is a race
        workers = [ReplicationWorker(c, f"worker-{i}", poll_interval_ms=100, entries_in_flight_max=4,
                                     bytes_per_s_max=20_000, ledgers_concurrent_max=1,
                                     retry_delay_ms_max=1_000, copy_timeout_ms=10_000,
                                     rng=random.Random(i))
                   for i, c in enumerate(clients)]
        urm = UnderReplicationManager(client.store)
        results = await asyncio.gather(*(w.repair_ledger(lid) for w in workers))
        assert results == [True, True]
        assert sorted(w.fragments_repaired for w in workers) == [0, 1]
        assert sum(w.entries_copied for w in workers) == 30
        assert await urm.list_marked() == []
        md, _ = await client.ledger_manager.read(lid)
        assert victim not in md.all_bookies()
        written[lid] = 30
        got = await (await client.open_ledger(lid, recovery=False)).read(0, 29)
        assert [e.payload for e in got] == big
    finally:
        for c in clients:
            await c.close()
        await client.close()


async def test_decommission_moves_every_copy_off_a_live_bookie_under_write_load(cluster_factory):
    cluster = await asyncio.to_thread(cluster_factory, 5, bookie_overrides={**FAST, "disk_check_interval_ms": 200})
    client = await connect(cluster)
    try:
        written: dict[int, int] = {}
        for k in range(5):
            e, w, a = ((3, 2, 2), (3, 3, 2))[k % 2]
            await write_ledger(client, e, w, a, 40 + 11 * k, k, written)
        counts: dict[str, int] = {}
        for lid in written:
            for b in (await client.ledger_manager.read(lid))[0].all_bookies():
                counts[b] = counts.get(b, 0) + 1
        leaving = max(sorted(counts), key=counts.get)

        stop = asyncio.Event()

        async def load() -> None:
            """Ledgers of 50 entries, one after another, until stopped (each one closed)."""
            while not stop.is_set():
                writer = await client.create_ledger(3, 2, 2)
                for i in range(50):
                    await writer.add(payload_for(writer.ledger_id, i))
                await writer.close()
                written[writer.ledger_id] = 50

        load_task = asyncio.ensure_future(load())
        await asyncio.sleep(0.5)
        proc = await bookkeeper(cluster, "decommission", leaving, "--timeout-s", str(REPAIR_TIMEOUT_S),
                                "--poll-s", "0.5", timeout_s=REPAIR_TIMEOUT_S + 60)
        stop.set()
        await load_task
        assert proc.returncode == 0, proc.stderr
        assert "decommissioned" in proc.stdout
        assert len(written) > 5, "the load wrote nothing during the decommission"
        # ledgers the load closed after the command's last check do not name it either: the
        # bookie is read-only while decommissioning, so no new ensemble picks it
        assert await ledgers_naming(client, leaving) == []
        proc = await bookkeeper(cluster, "autorecovery", "status", "--json")
        status = json.loads(proc.stdout)
        assert status["decommissioning"] == [] and status["decommissioned"] == [leaving]
        proc = await bookkeeper(cluster, "listbookies", "--json")
        assert leaving in json.loads(proc.stdout)["readonly"]
        await asyncio.to_thread(cluster.kill, name_of(cluster, leaving))
        await read_everything(client, written)
    finally:
        await client.close()


async def auditor_of(cluster) -> str | None:
    proc = await bookkeeper(cluster, "autorecovery", "status", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["auditor"]


async def test_the_auditor_is_re_elected_when_its_bookie_dies(cluster_factory):
    cluster = await asyncio.to_thread(cluster_factory, 4, bookie_overrides={**FAST, "zk_session_timeout_ms": 4_000})
    client = await connect(cluster)
    try:
        written: dict[int, int] = {}
        for k in range(4):
            await write_ledger(client, 3, 2, 2, 30 + k, k, written)
        first = await auditor_of(cluster)
        assert first in cluster.bookie_ids
        await asyncio.to_thread(cluster.kill, name_of(cluster, first))
        deadline = time.monotonic() + REPAIR_TIMEOUT_S
        while (now := await auditor_of(cluster)) in (first, None):
            assert time.monotonic() < deadline, "no new auditor"
            await asyncio.sleep(0.5)
        assert now in cluster.bookie_ids and now != first
        # the new auditor marks the dead one's ledgers; the workers move them
        if await ledgers_naming(client, first):
            await wait_until_nothing_names(client, cluster, first)
        await read_everything(client, written)
    finally:
        await client.close()


async def test_a_repair_of_an_open_ledgers_earlier_fragment_leaves_its_writer_working(cluster_factory):
    cluster = await asyncio.to_thread(cluster_factory, 5, bookie_overrides=FAST)
    client = await connect(cluster)
    try:
        writer = await client.create_ledger(3, 2, 2)
        lid = writer.ledger_id
        victim = writer.metadata.current_ensemble[1]
        await asyncio.gather(*(writer.add_async(payload_for(lid, i)) for i in range(40)))
        await asyncio.to_thread(cluster.kill, name_of(cluster, victim))
        await asyncio.gather(*(writer.add_async(payload_for(lid, i)) for i in range(40, 60)))
        md, _ = await client.ledger_manager.read(lid)
        assert len(md.ensembles) == 2 and victim in md.ensembles[0][1] and victim not in md.current_ensemble
        # the worker repairs fragment 0 while the ledger is open and its writer alive
        await wait_until_nothing_names(client, cluster, victim)
        md, _ = await client.ledger_manager.read(lid)
        assert md.state.value == "OPEN"
        # the writer goes on: more adds, then a close whose CAS meets the repaired metadata
        await asyncio.gather(*(writer.add_async(payload_for(lid, i)) for i in range(60, 90)))
        closed = await writer.close()
        assert closed.last_entry_id == 89 and victim not in closed.all_bookies()
        await read_everything(client, {lid: 90})
    finally:
        await client.close()


async def test_a_worker_killed_mid_copy_leaves_the_ledger_marked_and_another_finishes(cluster_factory):
    slow = {**FAST, "zk_session_timeout_ms": 4_000, "replication_bytes_per_s_max": 30_000,
            "replication_ledgers_concurrent_max": 1}
    cluster = await asyncio.to_thread(cluster_factory, 5, bookie_overrides=slow)
    client = await connect(cluster)
    try:
        written: dict[int, int] = {}
        payloads = {}
        for k in range(2):
            writer = await client.create_ledger(3, 3, 2)
            lid = writer.ledger_id
            payloads[lid] = [payload_for(lid, i) + b"p" * 2000 for i in range(60)]
            await asyncio.gather(*(writer.add_async(p) for p in payloads[lid]))
            await writer.close()
            written[lid] = 60
        victim = (await client.ledger_manager.read(lid))[0].current_ensemble[0]
        await asyncio.to_thread(cluster.kill, name_of(cluster, victim))
        urm = UnderReplicationManager(client.store)
        deadline = time.monotonic() + REPAIR_TIMEOUT_S
        holder = None
        while holder is None:
            assert time.monotonic() < deadline, "no worker took a lock"
            for marked in await urm.list_marked():
                holder = await urm.lock_holder(marked)
                if holder is not None and holder != victim:
                    locked = marked
                    break
                holder = None
            await asyncio.sleep(0.05)
        await asyncio.to_thread(cluster.kill, name_of(cluster, holder))     # the worker dies mid-copy
        md, _ = await client.ledger_manager.read(locked)
        assert victim in md.all_bookies(), "a fragment was recorded although its copy cannot have finished"
        assert locked in await urm.list_marked()
        for gone in (victim, holder):
            await wait_until_nothing_names(client, cluster, gone)
        for lid, entries in written.items():
            got = await (await client.open_ledger(lid, recovery=False)).read(0, entries - 1)
            assert [e.payload for e in got] == payloads[lid]
    finally:
        await client.close()


async def test_the_standalone_autorecovery_process_repairs_when_bookies_run_none(cluster_factory, tmp_path):
    from pulsarlite.config import BookieConfig, to_toml

    cluster = await asyncio.to_thread(cluster_factory, 4, bookie_overrides={"autorecovery_enabled": False})
    client = await connect(cluster)
    config = tmp_path / "autorecovery.toml"
    config.write_text(to_toml(BookieConfig(zookeeper=cluster.zookeeper, **FAST)))
    log_path = tmp_path / "autorecovery.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "pulsarlite", "autorecovery", "--config", str(config)],
                                stdout=log_file, stderr=subprocess.STDOUT)
    try:
        written: dict[int, int] = {}
        for k in range(3):
            await write_ledger(client, 3, 2, 2, 25 + k, k, written)
        victim = (await client.ledger_manager.read(max(written)))[0].current_ensemble[2]
        await asyncio.to_thread(cluster.kill, name_of(cluster, victim))
        await wait_until_nothing_names(client, cluster, victim)
        assert (await auditor_of(cluster) or "").startswith("autorecovery-")
        await read_everything(client, written)
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait, 30)
        await client.close()
    assert proc.returncode == 0, log_path.read_text()[-3000:]


async def test_the_replica_check_finds_a_replica_that_lost_its_copies(cluster_factory):
    cluster = await asyncio.to_thread(cluster_factory, 4, bookie_overrides={
        **FAST, "audit_replica_check_interval_ms": 1_000, "audit_replica_check_entries_per_fragment": 2})
    client = await connect(cluster)
    try:
        written: dict[int, int] = {}
        lid = await write_ledger(client, 3, 3, 2, 40, 0, written)
        await write_ledger(client, 3, 2, 2, 30, 1, written)
        emptied = (await client.ledger_manager.read(lid))[0].current_ensemble[1]
        # the bookie stays up but no longer has the ledger (a disk that lost it)
        resp = await client.pool.get(emptied).delete_ledger(lid)
        assert resp.code == 0
        await wait_until_nothing_names_in(client, cluster, emptied, lid)
        await read_everything(client, written)
    finally:
        await client.close()


async def wait_until_nothing_names_in(client, cluster, bookie: str, lid: int) -> None:
    deadline = time.monotonic() + REPAIR_TIMEOUT_S
    while True:
        md, _ = await client.ledger_manager.read(lid)
        if bookie not in md.all_bookies():
            proc = await bookkeeper(cluster, "listunderreplicated", "--json")
            if json.loads(proc.stdout) == []:
                return
        assert time.monotonic() < deadline, f"ledger {lid} still names {bookie}: {md.ensembles}"
        await asyncio.sleep(0.5)


async def test_a_reader_opened_before_a_repair_reads_from_the_replacement(cluster_factory):
    """A reader kept from before a repair (the broker caches readers of closed ledgers) finds
    entries whose old replicas are all gone on the replacement the metadata now names."""
    cluster = await asyncio.to_thread(cluster_factory, 4, bookie_overrides=FAST)
    client = await connect(cluster)
    try:
        written: dict[int, int] = {}
        lid = await write_ledger(client, 3, 2, 2, 30, 0, written)
        old_reader = await client.open_ledger(lid, recovery=False)
        first, second, _ = old_reader.metadata.current_ensemble
        await asyncio.to_thread(cluster.kill, name_of(cluster, first))
        await wait_until_nothing_names(client, cluster, first)
        # the second loss: entries whose write set was (first, second) live only on the replacement
        await asyncio.to_thread(cluster.kill, name_of(cluster, second))
        got = await old_reader.read(0, 29)
        assert [e.payload for e in got] == [payload_for(lid, i) for i in range(30)]
        assert first not in old_reader.metadata.all_bookies()
    finally:
        await client.close()


async def test_returned_bookies_are_taken_out_of_a_mark_by_compare_and_set(zk_hosts):
    """UrManager.remove_from_mark (the auditor's UnmarkBookies) on a real ZooKeeper: the other
    bookies stay, the mark goes once none is left, a mark changed meanwhile is not written."""
    from pulsarlite.metadata import MetadataStore
    from bookie.autorecovery.layout import mark_path
    lid = 900_000 + random.randrange(100_000)
    async with await MetadataStore.connect(zk_hosts) as store:
        urm = UnderReplicationManager(store)
        await urm.mark(lid, ["b1:3181", "b2:3181", "b3:3181"], 1)
        assert await urm.remove_from_mark(lid, ["b1:3181", "b9:3181"])
        mark, version = await urm.read_mark(lid)
        assert mark.missing_bookies == ("b2:3181", "b3:3181") and mark.ctime_ms == 1
        assert await urm.remove_from_mark(lid, ["b9:3181"])                 # nothing to take out
        assert (await urm.read_mark(lid))[1] == version

        real_read = urm.read_mark

        async def read_then_someone_marks(ledger_id):
            got = await real_read(ledger_id)
            await urm.mark(ledger_id, ["b4:3181"], 2)                     # a concurrent mark
            return got
        urm.read_mark = read_then_someone_marks
        assert not await urm.remove_from_mark(lid, ["b2:3181"])             # refused: it changed
        urm.read_mark = real_read
        assert (await urm.read_mark(lid))[0].missing_bookies == ("b2:3181", "b3:3181", "b4:3181")
        assert await urm.remove_from_mark(lid, ["b2:3181", "b3:3181", "b4:3181"])
        assert await urm.read_mark(lid) is None and await store.get_or_none(mark_path(lid)) is None
        assert await urm.remove_from_mark(lid, ["b2:3181"])                 # no mark: nothing to do
