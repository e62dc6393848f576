"""Ledger storage: write cache, entry logs, index, checkpoint + reopen, corruption, GC planning."""

import os

import pytest

from bookie.storage.entry_log import LOG_HEADER_BYTES, EntryLogger, StoredEntry, encode_add, log_path
from bookie.storage.journal import JournalPosition
from bookie.storage.ledger_storage import (CHECKPOINT_NAME, LedgerState, LedgerStorage, LogUsage,
                                           plan_gc)
from pulsarlite.checksum import entry_checksum
from pulsarlite.errors import ChecksumError


def entry(ledger: int, eid: int, payload: bytes = b"", lac: int = -1) -> StoredEntry:
    payload = payload or f"payload-{ledger}-{eid}".encode() * 3
    return StoredEntry(ledger, eid, lac, 0, payload, entry_checksum(ledger, eid, lac, 0, payload))


def item(e: StoredEntry):
    head, trailer = encode_add(e)
    return (e, head, trailer)


def storage(tmp_path, log_bytes_max=1 << 20) -> LedgerStorage:
    return LedgerStorage(str(tmp_path / "ledgers"), log_bytes_max)


def read_all(s: LedgerStorage, ledger: int, first: int, last: int):
    return s.read_range(s.ledgers[ledger], first, last, 1 << 30)


def test_cache_then_checkpoint_then_reopen(tmp_path):
    s = storage(tmp_path)
    entries = [entry(1, i, lac=i - 1) for i in range(20)] + [entry(2, i) for i in range(5)]
    s.apply_adds(item(e) for e in entries)
    assert read_all(s, 1, 0, 19) == entries[:20]          # readable from the write cache
    s.apply_fence(2)
    s.checkpoint_sync(JournalPosition(3, 100))
    assert all(not st.cache for st in s.ledgers.values())
    assert s.cache_bytes == 0
    assert read_all(s, 1, 0, 19) == entries[:20]          # now from the entry log
    s.close()
    s2 = storage(tmp_path)
    assert s2.mark == JournalPosition(3, 100)
    assert read_all(s2, 1, 0, 19) == entries[:20]
    assert read_all(s2, 2, 0, 4) == entries[20:]
    assert s2.ledgers[2].fenced and not s2.ledgers[1].fenced
    assert s2.ledgers[1].lac == 18 and s2.ledgers[1].last_entry_id == 19
    assert s2.entry_total == 25
    s2.close()


def test_read_range_stops_at_gap_and_max_bytes(tmp_path):
    s = storage(tmp_path)
    s.apply_adds(item(entry(1, i, b"x" * 100)) for i in (0, 1, 2, 3, 5))
    s.checkpoint_sync(JournalPosition(1, 0))
    s.apply_adds([item(entry(1, 6, b"y" * 100))])
    st = s.ledgers[1]
    assert [e.entry_id for e in s.read_range(st, 0, 10, 10_000)] == [0, 1, 2, 3]
    assert [e.entry_id for e in s.read_range(st, 0, 10, 250)] == [0, 1]
    assert [e.entry_id for e in s.read_range(st, 0, 10, 1)] == [0]   # always at least one
    assert [e.entry_id for e in s.read_range(st, 5, 10, 10_000)] == [5, 6]
    assert s.read_range(st, 4, 10, 10_000) == []
    s.close()


def test_first_write_wins_and_deleted_ledgers_survive_checkpoint(tmp_path):
    s = storage(tmp_path)
    s.apply_adds(item(entry(1, i)) for i in range(3))
    s.apply_adds(item(entry(2, i)) for i in range(3))
    s.checkpoint_sync(JournalPosition(1, 0))
    # re-writes of stored entries (indexed, then cached) change nothing, other bytes included;
    # their positions are reported so the store can refuse them
    assert s.apply_adds([item(entry(1, 1, b"rewritten", lac=0)), item(entry(1, 3)),
                         item(entry(1, 3, b"other")), item(entry(1, 0))]) == [0, 2, 3]
    assert s.ledgers[1].lac == -1 and s.entry_total == 7
    assert s.apply_adds([item(entry(1, 4))]) is None
    assert s.apply_delete(2)
    assert s.get_or_create(2) is None                     # never recreated
    s.checkpoint_sync(JournalPosition(2, 0))
    s.close()
    s2 = storage(tmp_path)
    assert read_all(s2, 1, 0, 4) == [entry(1, i) for i in range(5)]
    assert 2 not in s2.ledgers and 2 in s2.deleted
    assert s2.entry_total == 5
    assert sum(s2.live_bytes.values()) == sum(st.size[i] for st in s2.ledgers.values()
                                              for i in range(len(st.size)))
    s2.close()


def test_sparse_and_prepended_index(tmp_path):
    st = LedgerState(9)
    st.set_loc(100, 1 << 40 | 16, 50)
    st.set_loc(90, 1 << 40 | 66, 50)                      # below base: prepend
    st.set_loc(10**12, 1 << 40 | 116, 50)                 # far away: sparse
    st.set_loc(105, 1 << 40 | 166, 50)                    # small gap: extend
    assert st.base == 90 and 10**12 in st.sparse
    assert st.loc(100) == (1 << 40 | 16, 50) and st.loc(90) == (1 << 40 | 66, 50)
    assert st.loc(10**12) == (1 << 40 | 116, 50) and st.loc(105) == (1 << 40 | 166, 50)
    assert st.loc(101) is None and st.loc(5) is None
    assert st.set_loc(100, 2 << 40 | 16, 60) == (1 << 40 | 16, 50)


def test_sparse_entries_round_trip(tmp_path):
    s = storage(tmp_path)
    ids = [0, 1, 2, 10**9, 5]
    s.apply_adds(item(entry(3, i)) for i in ids)
    s.checkpoint_sync(JournalPosition(1, 0))
    s.close()
    s2 = storage(tmp_path)
    st = s2.ledgers[3]
    for i in ids:
        assert s2.get_entry(st, i) == entry(3, i)
    assert s2.entry_total == len(ids)
    s2.close()


def test_flipped_byte_in_entry_log_raises_checksum_error(tmp_path):
    s = storage(tmp_path)
    s.apply_adds(item(entry(1, i, b"z" * 200)) for i in range(3))
    s.checkpoint_sync(JournalPosition(1, 0))
    st = s.ledgers[1]
    p, size = st.loc(1)
    log_id, offset = p >> 40, p & ((1 << 40) - 1)
    path = log_path(s.directory, log_id)
    with open(path, "r+b") as f:
        f.seek(offset + 100)
        b = f.read(1)
        f.seek(offset + 100)
        f.write(bytes([b[0] ^ 0x40]))
    with pytest.raises(ChecksumError) as exc:
        s.get_entry(st, 1)
    msg = str(exc.value)
    assert "ledger=1" in msg and "entry=1" in msg and path in msg
    assert s.get_entry(st, 0) == entry(1, 0, b"z" * 200)
    with pytest.raises(ChecksumError):
        s.read_range(st, 0, 2, 1 << 20)
    s.close()


def test_corrupt_checkpoint_file_refuses_to_load(tmp_path):
    s = storage(tmp_path)
    s.apply_adds([item(entry(1, 0))])
    s.checkpoint_sync(JournalPosition(1, 0))
    s.close()
    path = tmp_path / "ledgers" / CHECKPOINT_NAME
    data = bytearray(path.read_bytes())
    data[10] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ChecksumError):
        storage(tmp_path)


def test_entry_logs_roll(tmp_path):
    s = storage(tmp_path, log_bytes_max=4096)
    s.apply_adds(item(entry(1, i, b"r" * 500)) for i in range(50))
    s.checkpoint_sync(JournalPosition(1, 0))
    sizes = s.entry_logger.file_sizes()
    assert len(sizes) > 5
    assert all(size <= 4096 for size in sizes.values())
    assert [e.entry_id for e in read_all(s, 1, 0, 49)] == list(range(50))
    s.close()


def test_plan_gc():
    logs = {1: LogUsage(1000, 0), 2: LogUsage(1016, 100), 3: LogUsage(1016, 900),
            4: LogUsage(1016, 300), 5: LogUsage(16, 0)}
    plan = plan_gc(logs, current_log_id=5, live_ratio_max=0.5)
    assert plan.remove == (1,)
    assert plan.compact == (2, 4)                         # least live first
    assert plan_gc(logs, current_log_id=2, live_ratio_max=0.5).compact == ()


def test_entry_logger_new_log_per_open(tmp_path):
    d = str(tmp_path / "l")
    a = EntryLogger(d, 1 << 20)
    a.close()
    b = EntryLogger(d, 1 << 20)
    assert b.current_id == a.current_id + 1
    assert os.path.getsize(log_path(d, b.current_id)) == LOG_HEADER_BYTES
    b.close()


class PageCacheCalls:
    """Records, in order and per file, syncs (with the end of the data written by then through
    ``pwritev_all``, the journal's groups and the entry logs' appends; zero-fill and headers
    are not counted) and POSIX_FADV_DONTNEED calls."""

    def __init__(self, monkeypatch) -> None:
        import bookie.storage.entry_log as entry_log_mod
        import bookie.storage.journal as journal_mod
        self.calls: list[tuple] = []
        self.written: dict[str, int] = {}
        real_fdatasync, real_fsync, real_fadvise = os.fdatasync, os.fsync, os.posix_fadvise
        real_pwritev = entry_log_mod.pwritev_all

        def path(fd):
            return os.readlink(f"/proc/self/fd/{fd}")

        def pwritev_all(fd, pieces, offset):
            n = real_pwritev(fd, pieces, offset)
            self.written[path(fd)] = max(self.written.get(path(fd), 0), offset + n)
            return n

        def fdatasync(fd):
            real_fdatasync(fd)
            self.calls.append(("sync", path(fd), self.written.get(path(fd), 0)))

        def fsync(fd):
            real_fsync(fd)
            self.calls.append(("sync", path(fd), self.written.get(path(fd), 0)))

        def posix_fadvise(fd, offset, length, advice):
            assert advice == os.POSIX_FADV_DONTNEED
            self.calls.append(("drop", path(fd), offset, length))
            real_fadvise(fd, offset, length, advice)

        monkeypatch.setattr(entry_log_mod, "pwritev_all", pwritev_all)
        monkeypatch.setattr(journal_mod, "pwritev_all", pwritev_all)
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "posix_fadvise", posix_fadvise)

    def check_drops_follow_syncs(self) -> dict[str, int]:
        """Every drop covers whole pages of data its file had synced, each byte once; returns
        the bytes dropped per file (all from offset 0 up, without gaps)."""
        synced: dict[str, int] = {}
        dropped: dict[str, int] = {}
        for call in self.calls:
            if call[0] == "sync":
                synced[call[1]] = call[2]
            else:
                _, path, offset, length = call
                assert offset == dropped.get(path, 0) and length > 0
                assert offset % 4096 == 0 and (offset + length) % 4096 == 0
                assert offset + length <= synced.get(path, 0), "dropped before it was synced"
                dropped[path] = offset + length
        return dropped


@pytest.mark.parametrize("drop", [False, True])
def test_entry_logs_drop_synced_pages_only_when_asked(tmp_path, monkeypatch, drop):
    calls = PageCacheCalls(monkeypatch)
    d = str(tmp_path / "l")
    logger = EntryLogger(d, 64 * 1024, drop_page_cache=drop)       # rolls every ~64 KiB
    first_log = logger.current_id
    entries = [entry(1, i, payload=bytes([i % 256]) * 3000) for i in range(60)]
    locations = []
    for chunk in range(0, 60, 10):
        locations += logger.append([(h, e.payload, t) for e, h, t in map(item, entries[chunk:chunk + 10])])
        logger.sync()
    dropped = calls.check_drops_follow_syncs()
    if drop:
        assert logger.current_id > first_log + 1                    # rolled logs dropped too
        for log_id in range(first_log, logger.current_id + 1):
            size = os.path.getsize(log_path(d, log_id))
            assert dropped[log_path(d, log_id)] == size - size % 4096
    else:
        assert dropped == {}
    for e, (log_id, offset, size) in zip(entries, locations):      # still readable, from the disk
        assert logger.read(1, e.entry_id, log_id, offset, size) == e
    logger.close()
