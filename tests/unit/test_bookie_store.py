"""BookieStore: adds, reads, fencing, deletes, crash recovery (kill -9), checksums, GC, read-only."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from bookie.storage import BookieStore, LedgerInfo, Status, StoredEntry
from bookie.storage.journal import list_journal_files
from pulsarlite.checksum import entry_checksum
from pulsarlite.config import BookieConfig
from pulsarlite.errors import ChecksumError, ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def entry(ledger: int, eid: int, payload: bytes = b"", lac: int = -1, length: int = 0) -> StoredEntry:
    payload = payload or f"payload-{ledger}-{eid}".encode() * 4
    return StoredEntry(ledger, eid, lac, length, payload, entry_checksum(ledger, eid, lac, length, payload))


def config(tmp_path, **kw) -> BookieConfig:
    args = dict(journal_dir=str(tmp_path / "journal"), ledger_dir=str(tmp_path / "ledgers"),
                journal_preallocate_bytes=64 * 1024, checkpoint_interval_ms=3_600_000,
                gc_interval_ms=3_600_000)
    args.update(kw)
    return BookieConfig(**args)


async def started(cfg: BookieConfig) -> BookieStore:
    store = BookieStore.open(cfg)
    await store.start()
    return store


async def crash(store: BookieStore) -> None:
    """Stop like kill -9 would, as far as the disk is concerned: the journal thread is stopped
    after what it holds, no checkpoint, no close."""
    for task in list(store._tasks):
        task.cancel()
    await asyncio.to_thread(store._journal.stop)
    store._storage.entry_logger.close()


async def test_add_and_read(tmp_path):
    store = await started(config(tmp_path))
    entries = [entry(1, i, lac=i - 1) for i in range(10)]
    assert await store.add_entries(entries) == [Status.OK] * 10
    status, got = store.read(1, 0, 9, 0)
    assert status == Status.OK and got == entries
    assert store.ledger_info(1) == LedgerInfo(True, False, 8, 9)
    assert store.read(2, 0, 0, 0) == (Status.NO_SUCH_LEDGER, [])
    assert store.read(1, 10, 20, 0) == (Status.NO_SUCH_ENTRY, [])
    assert store.read(1, 5, 4, 0) == (Status.BAD_REQUEST, [])
    assert store.ledger_ids() == [1] and store.entry_count() == 10
    await store.close()


async def test_validation_statuses(tmp_path):
    store = await started(config(tmp_path, entry_bytes_max=1000))
    good = entry(1, 0)
    bad_sum = StoredEntry(1, 1, -1, 0, b"abc", 12345)
    big = entry(1, 2, b"x" * 1001)
    neg = StoredEntry(1, -1, -1, 0, b"a", entry_checksum(1, 0, -1, 0, b"a"))
    statuses = await store.add_entries([good, bad_sum, big, neg, entry(1, 3)])
    assert statuses == [Status.OK, Status.CHECKSUM_MISMATCH, Status.TOO_LARGE,
                        Status.BAD_REQUEST, Status.OK]
    assert store.read(1, 1, 1, 0) == (Status.NO_SUCH_ENTRY, [])   # nothing stored for it
    assert store.entry_count() == 2
    await store.close()


async def test_bad_checksum_stores_nothing(tmp_path):
    store = await started(config(tmp_path))
    assert await store.add_entries([StoredEntry(5, 0, -1, 0, b"abc", 1)]) == [Status.CHECKSUM_MISMATCH]
    assert store.read(5, 0, 0, 0) == (Status.NO_SUCH_LEDGER, [])
    assert store.entry_count() == 0
    await store.close()


async def test_checkpoint_and_reopen(tmp_path):
    cfg = config(tmp_path)
    store = await started(cfg)
    entries = [entry(1, i, os.urandom(300)) for i in range(50)]
    await store.add_entries(entries[:25])
    await store.checkpoint()
    await store.add_entries(entries[25:])
    await store.close()
    store = await started(cfg)
    assert store.read(1, 0, 49, 0) == (Status.OK, entries)
    assert len(list_journal_files(cfg.journal_dir)) == 1     # old journal files removed
    await store.close()


async def test_crash_recovery_in_process(tmp_path):
    cfg = config(tmp_path)
    store = await started(cfg)
    a = [entry(1, i, os.urandom(100)) for i in range(30)]
    b = [entry(2, i) for i in range(5)]
    c = [entry(3, i) for i in range(5)]
    await store.add_entries(a[:10])
    await store.add_entries(b + c)
    await store.checkpoint()                    # some entries in ledger storage ...
    await store.add_entries(a[10:])             # ... and some only in the journal
    await store.fence(1)
    await store.fence(77)                       # never seen: created fenced
    assert await store.delete_ledger(3) == Status.OK
    await crash(store)
    del store

    store = await started(cfg)
    assert store.read(1, 0, 29, 0) == (Status.OK, a)
    assert store.read(2, 0, 4, 0) == (Status.OK, b)
    assert store.ledger_info(1).fenced and store.ledger_info(77) == LedgerInfo(True, True, -1, -1)
    assert store.read(3, 0, 4, 0) == (Status.NO_SUCH_LEDGER, [])
    assert await store.add_entries([entry(1, 30)]) == [Status.FENCED]     # old writer stays fenced
    assert await store.add_entries([entry(3, 9)]) == [Status.NO_SUCH_LEDGER]
    await crash(store)                          # and a second crash right after the replay
    store = await started(cfg)
    assert store.read(1, 0, 29, 0) == (Status.OK, a)
    assert store.ledger_info(1).fenced and 3 not in store.ledger_ids()
    await store.close()


CHILD = textwrap.dedent("""
    import asyncio, os, sys
    from bookie.storage import BookieStore, StoredEntry, Status
    from pulsarlite.checksum import entry_checksum
    from pulsarlite.config import BookieConfig

    async def main():
        cfg = BookieConfig(journal_dir=sys.argv[1], ledger_dir=sys.argv[2],
                           journal_preallocate_bytes=256 * 1024, write_cache_bytes_max=64 * 1024,
                           checkpoint_interval_ms=50, journal_file_bytes_max=128 * 1024)
        store = BookieStore.open(cfg)
        await store.start()
        out = sys.stdout

        async def writer(ledger):
            e = 0
            while True:
                batch = []
                for _ in range(20):
                    p = (b"%d:%d:" % (ledger, e)) * 7
                    batch.append(StoredEntry(ledger, e, e - 1, 0, p, entry_checksum(ledger, e, e - 1, 0, p)))
                    e += 1
                st = await store.add_entries(batch)
                assert all(s == Status.OK for s in st), st
                out.write("ACK %d %d\\n" % (ledger, e - 1))
                out.flush()
                if ledger == 1 and e == 200:
                    await store.fence(1)
                    out.write("FENCED 1\\n")
                    out.flush()
                    return

        await asyncio.gather(*(writer(l) for l in (1, 2, 3)))

    asyncio.run(main())
""")


async def test_kill_9_keeps_every_acknowledged_entry(tmp_path):
    cfg = config(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, cfg.journal_dir, cfg.ledger_dir],
                            stdout=subprocess.PIPE, cwd=REPO, text=True)
    acked = {}
    fenced = False
    try:
        for line in proc.stdout:
            parts = line.split()
            if parts[0] == "ACK":
                acked[int(parts[1])] = int(parts[2])
            elif parts[0] == "FENCED":
                fenced = True
            if fenced and acked.get(2, -1) >= 3000:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert fenced and acked.get(3, -1) > 0
    store = await started(cfg)
    for ledger, last in acked.items():
        status, got = store.read(ledger, 0, last, 1 << 30)
        assert status == Status.OK and len(got) == last + 1, (ledger, last, len(got))
        for e in got:
            assert e.payload == (b"%d:%d:" % (ledger, e.entry_id)) * 7
            assert e.checksum == entry_checksum(ledger, e.entry_id, e.lac, e.length, e.payload)
    assert store.ledger_info(1).fenced
    assert await store.add_entries([entry(1, 1000)]) == [Status.FENCED]
    await store.close()


async def test_flipped_byte_on_disk_raises_checksum_error(tmp_path):
    store = await started(config(tmp_path))
    await store.add_entries([entry(1, i, b"k" * 500) for i in range(3)])
    await store.checkpoint()
    st = store._storage.ledgers[1]
    p, _ = st.loc(2)
    path = os.path.join(store._config.ledger_dir, f"{p >> 40:012d}.log")
    with open(path, "r+b") as f:
        f.seek((p & ((1 << 40) - 1)) + 200)
        f.write(b"\x00\xff")
    with pytest.raises(ChecksumError, match="ledger=1 entry=2"):
        store.read(1, 0, 2, 0)
    assert store.read(1, 0, 1, 0)[0] == Status.OK
    await store.close()


async def test_fencing(tmp_path):
    store = await started(config(tmp_path))
    await store.add_entries([entry(1, 0), entry(1, 1, lac=0)])
    # fenced in memory at once: an add that arrives after fence() started is refused
    fence_task = asyncio.ensure_future(store.fence(1))
    await asyncio.sleep(0)
    assert await store.add_entries([entry(1, 2, lac=1)]) == [Status.FENCED]
    info = await fence_task
    assert info == LedgerInfo(True, True, 0, 1)
    assert await store.add_entries([entry(1, 2, lac=1)], recovery=True) == [Status.OK]
    assert store.read(1, 2, 2, 0)[1] == [entry(1, 2, lac=1)]
    assert await store.fence(42) == LedgerInfo(True, True, -1, -1)
    assert await store.add_entries([entry(42, 0)]) == [Status.FENCED]
    await store.close()


async def test_concurrent_callers_share_group_commits(tmp_path):
    store = await started(config(tmp_path))
    batches = [[entry(l, i) for i in range(50)] for l in range(20)]
    results = await asyncio.gather(*(store.add_entries(b) for b in batches))
    assert all(r == [Status.OK] * 50 for r in results)
    assert store._journal.groups_written <= 20
    assert store.entry_count() == 1000
    await store.close()


async def test_gc_reclaims_space_and_keeps_survivors(tmp_path):
    cfg = config(tmp_path, entry_log_file_bytes_max=64 * 1024)
    store = await started(cfg)
    survivors = {}
    for ledger in range(1, 9):
        batch = [entry(ledger, i, os.urandom(1000)) for i in range(40)]
        await store.add_entries(batch)
        if ledger % 3 == 0:
            survivors[ledger] = batch
    await store.checkpoint()
    for ledger in range(1, 9):
        if ledger not in survivors:
            assert await store.delete_ledger(ledger) == Status.OK
    logs_before = store._storage.entry_logger.file_sizes()
    reclaimed = await store.gc_once()
    assert reclaimed > 0
    logs_after = store._storage.entry_logger.file_sizes()
    assert sum(logs_after.values()) < sum(logs_before.values())
    assert not any(os.path.exists(os.path.join(cfg.ledger_dir, f"{i:012d}.log"))
                   for i in set(logs_before) - set(logs_after))
    for ledger, batch in survivors.items():
        assert store.read(ledger, 0, 39, 1 << 30) == (Status.OK, batch)
    await store.gc_once()                                # a second pass is harmless
    await store.close()
    store = await started(cfg)
    for ledger, batch in survivors.items():
        assert store.read(ledger, 0, 39, 1 << 30) == (Status.OK, batch)
    assert store.ledger_ids() == sorted(survivors)
    await store.close()


async def test_read_only(tmp_path):
    store = await started(config(tmp_path))
    await store.add_entries([entry(1, 0)])
    store.read_only = True
    assert await store.add_entries([entry(1, 1), entry(2, 0)]) == [Status.READ_ONLY] * 2
    assert await store.add_entries([entry(1, 1)], recovery=True) == [Status.READ_ONLY]
    assert store.read(1, 0, 0, 0) == (Status.OK, [entry(1, 0)])
    store.read_only = False
    assert await store.add_entries([entry(1, 1)]) == [Status.OK]
    await store.close()


async def test_disk_usage_override(tmp_path):
    store = BookieStore.open(config(tmp_path, disk_free_bytes_override=1000))
    used, free, total = store.disk_usage()
    assert free == 1000 and total > 1000 and 0.9 < used <= 1.0
    store2 = BookieStore.open(config(tmp_path / "other"))
    used, free, total = store2.disk_usage()
    assert 0 <= used <= 1 and 0 < free <= total
    await store.close()
    await store2.close()


async def test_full_write_cache_is_flushed_to_entry_logs(tmp_path):
    """A full write cache is written out (flush or checkpoint) before the timers would: memory
    stays bounded."""
    store = await started(config(tmp_path, write_cache_bytes_max=16 * 1024,
                                 write_cache_flush_interval_ms=3_600_000))
    for i in range(10):
        await store.add_entries([entry(1, i * 10 + j, b"c" * 1000) for j in range(10)])
    for _ in range(500):                         # bounded wait for the background flush
        if store._storage.cache_bytes < 16 * 1024:
            break
        await asyncio.sleep(0.01)
    assert store._storage.cache_bytes < 16 * 1024
    assert store.read(1, 0, 99, 1 << 30)[1] == [entry(1, i, b"c" * 1000) for i in range(100)]
    await store.close()


async def test_delete_is_durable_and_idempotent(tmp_path):
    cfg = config(tmp_path)
    store = await started(cfg)
    await store.add_entries([entry(1, 0)])
    assert await store.delete_ledger(1) == Status.OK
    assert await store.delete_ledger(1) == Status.OK
    assert await store.delete_ledger(99) == Status.OK
    assert store.ledger_info(1).exists is False
    assert store.entry_count() == 0
    await store.close()
    store = await started(cfg)
    assert store.read(1, 0, 0, 0) == (Status.NO_SUCH_LEDGER, [])
    assert await store.add_entries([entry(99, 0)]) == [Status.NO_SUCH_LEDGER]
    await store.close()


async def test_emptied_journal_dir_never_reuses_file_ids(tmp_path):
    cfg = config(tmp_path)
    for _ in range(3):                           # push the checkpoint mark's file id up
        store = await started(cfg)
        await store.close()
    mark_file = store._storage.mark.file_id
    for name in os.listdir(cfg.journal_dir):
        os.unlink(os.path.join(cfg.journal_dir, name))
    store = await started(cfg)
    assert store._journal.file_id > mark_file
    await store.add_entries([entry(1, 0)])
    await crash(store)
    store = await started(cfg)
    assert store.read(1, 0, 0, 0) == (Status.OK, [entry(1, 0)])
    await store.close()


async def test_flush_without_checkpoint_then_crash_keeps_everything(tmp_path):
    """Write-cache flushes index entries in the entry logs without moving the checkpoint mark;
    after a crash the journal replay from the old mark re-adds them: nothing lost, nothing
    doubled in what reads return."""
    cfg = config(tmp_path)
    store = await started(cfg)
    await store.add_entries([entry(4, e) for e in range(50)])
    await store._flush_write_cache()
    assert store._storage.cache_bytes == 0 and store.checkpoints_done == 0
    await store.add_entries([entry(4, e) for e in range(50, 80)])
    await crash(store)
    reopened = BookieStore.open(cfg)
    try:
        status, entries = reopened.read(4, 0, 79, 1 << 30)
        assert status == Status.OK and entries == [entry(4, e) for e in range(80)]
    finally:
        await reopened.close()


@pytest.mark.parametrize("value", [-1, 512 * 1024 + 1])
def test_journal_write_inline_bytes_max_is_validated(tmp_path, value):
    with pytest.raises(ConfigError, match="journal_write_inline_bytes_max"):
        config(tmp_path, journal_write_inline_bytes_max=value).validate()
    config(tmp_path, journal_write_inline_bytes_max=0).validate()      # 0 = never: valid
