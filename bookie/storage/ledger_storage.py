"""Ledger storage: per-ledger state, the write cache, the entry index and checkpoints.

Synchronous and asyncio-free; the store (:mod:`bookie.storage.store`) drives it from the event
loop thread and runs the blocking parts (``write_flush``, ``persist``, file removal) in worker
threads, one at a time.

- **Write cache.** Entries applied since the last checkpoint stay in memory (per ledger,
  readable) and in a flush list, in journal order.
- **Index.** Per ledger, two dense arrays from the first entry id seen: ``pos`` (u64
  ``log_id << 40 | offset``, 0 = absent; offset 0 is a log header, never a record) and ``size``
  (u32 record bytes); entry ids far outside the dense range go to a small ``sparse`` dict.
  Each ledger also counts its live bytes per entry log (``log_bytes``), which makes deleting a
  ledger and planning GC cheap.
- **Checkpoint.** ``take_flush`` (loop thread) -> ``write_flush`` (thread: append to the entry
  log + fsync) -> ``finish_flush`` (loop thread: index the entries) -> ``serialize`` (loop
  thread) -> ``persist`` (thread: temp file + fsync + rename + fsync dir). The checkpoint file
  records the journal mark below which everything is in ledger storage.

Checkpoint file (little-endian), ``<ledger_dir>/checkpoint``::

    header  "PLCK" u32 version | u64 mark file id | u64 mark offset | u32 ledgers | u32 deleted
    ledger  u64 id | u8 fenced | i64 lac | i64 last_entry_id | i64 base | u32 n | u32 sparse |
            u32 logs, then pos[n] u64, size[n] u32, sparse (i64 entry, u64 pos, u32 size)*,
            (u64 log id, u64 live bytes)*
    deleted u64 ledger ids
    u32 crc32c of everything before
"""

from __future__ import annotations

import logging
import os
import struct
import sys
from array import array
from dataclasses import dataclass
from typing import Iterable, Mapping

from crc32c import crc32c

from bookie.storage.entry_log import (LOG_HEADER_BYTES, LOG_OFFSET_BITS, LOG_OFFSET_MASK,
                                      RECORD_OVERHEAD_BYTES, EntryLogger, Location, StoredEntry,
                                      fsync_dir)
from bookie.storage.journal import START, JournalPosition
from pulsarlite.errors import ChecksumError

log = logging.getLogger("bookie.storage.ledger_storage")

CHECKPOINT_NAME = "checkpoint"
_CK_HEAD = struct.Struct("<4sIQQII")
_CK_LEDGER = struct.Struct("<QBqqqIII")
_CK_SPARSE = struct.Struct("<qQI")
_CK_LOG = struct.Struct("<QQ")
_CK_MAGIC = b"PLCK"
_CK_VERSION = 1
_GAP_ENTRIES_MAX = 1 << 16     # a gap wider than this goes to the sparse dict
_LITTLE = sys.byteorder == "little"

# (entry, head, trailer): an applied entry waiting in the write cache, with its record pieces
CacheItem = tuple[StoredEntry, bytes, bytes]


def _le(a: array) -> bytes:
    if _LITTLE:
        return a.tobytes()
    b = array(a.typecode, a)
    b.byteswap()
    return b.tobytes()


def _from_le(typecode: str, data: bytes | memoryview) -> array:
    a = array(typecode)
    a.frombytes(data)
    if not _LITTLE:
        a.byteswap()
    return a


class LedgerState:
    """What one bookie knows about one ledger."""

    __slots__ = ("ledger_id", "fenced", "lac", "last_entry_id", "count", "base", "pos", "size",
                 "sparse", "cache", "log_bytes", "deleted")

    def __init__(self, ledger_id: int) -> None:
        self.ledger_id = ledger_id
        self.fenced = False
        self.lac = -1
        self.last_entry_id = -1
        self.count = 0                         # distinct entries stored (cache or index)
        self.base = -1                         # entry id of pos[0]
        self.pos = array("Q")
        self.size = array("I")
        self.sparse: dict[int, tuple[int, int]] = {}
        self.cache: dict[int, CacheItem] = {}
        self.log_bytes: dict[int, int] = {}    # entry log id -> live bytes of this ledger
        self.deleted = False

    def loc(self, entry_id: int) -> tuple[int, int] | None:
        i = entry_id - self.base
        if 0 <= i < len(self.pos):
            p = self.pos[i]
            if p:
                return p, self.size[i]
        if self.sparse:
            return self.sparse.get(entry_id)
        return None

    def has(self, entry_id: int) -> bool:
        return entry_id in self.cache or self.loc(entry_id) is not None

    def set_loc(self, entry_id: int, p: int, size: int) -> tuple[int, int] | None:
        """Index an entry; returns the location it replaced, if any."""
        if entry_id in self.sparse:
            old = self.sparse[entry_id]
            self.sparse[entry_id] = (p, size)
            return old
        n = len(self.pos)
        if n == 0:
            self.base = entry_id
        i = entry_id - self.base
        if 0 <= i < n:
            old_p = self.pos[i]
            old = (old_p, self.size[i]) if old_p else None
            self.pos[i] = p
            self.size[i] = size
            return old
        if n <= i <= n + _GAP_ENTRIES_MAX:
            if i > n:
                self.pos.frombytes(bytes(8 * (i - n)))
                self.size.frombytes(bytes(4 * (i - n)))
            self.pos.append(p)
            self.size.append(size)
            return None
        if i < 0 and -i <= _GAP_ENTRIES_MAX:
            pad = -i
            pos = array("Q", bytes(8 * pad))
            pos.extend(self.pos)
            sz = array("I", bytes(4 * pad))
            sz.extend(self.size)
            pos[0] = p
            sz[0] = size
            self.pos, self.size, self.base = pos, sz, entry_id
            return None
        self.sparse[entry_id] = (p, size)
        return None

    def indexed_in_log(self, log_id: int) -> list[tuple[int, int, int]]:
        """(entry_id, pos, size) of the indexed entries that live in one entry log."""
        out = []
        lo = log_id << LOG_OFFSET_BITS
        hi = (log_id + 1) << LOG_OFFSET_BITS
        base = self.base
        size = self.size
        for i, p in enumerate(self.pos):
            if lo <= p < hi:
                out.append((base + i, p, size[i]))
        for e, (p, s) in self.sparse.items():
            if lo <= p < hi:
                out.append((e, p, s))
        return out


@dataclass(frozen=True)
class LogUsage:
    file_bytes: int
    live_bytes: int


@dataclass(frozen=True)
class GcPlan:
    remove: tuple[int, ...]     # logs without a live entry: delete
    compact: tuple[int, ...]    # logs with live_bytes / data bytes < ratio: copy out, delete


def plan_gc(logs: Mapping[int, LogUsage], current_log_id: int, live_ratio_max: float) -> GcPlan:
    """Pure GC planning: which entry logs to remove outright and which to compact (least
    live first). The current log is never touched."""
    remove = []
    compact = []
    for log_id in sorted(logs):
        if log_id >= current_log_id:
            continue
        u = logs[log_id]
        if u.live_bytes <= 0:
            remove.append(log_id)
            continue
        data_bytes = max(1, u.file_bytes - LOG_HEADER_BYTES)
        if u.live_bytes / data_bytes < live_ratio_max:
            compact.append((u.live_bytes / data_bytes, log_id))
    compact.sort()
    return GcPlan(tuple(remove), tuple(log_id for _, log_id in compact))


class FlushJob:
    """The write-cache items taken by one checkpoint, and the journal mark they cover."""

    __slots__ = ("mark", "items", "locations")

    def __init__(self, mark: JournalPosition, items: list[tuple[LedgerState, int, CacheItem]]):
        self.mark = mark
        self.items = items
        self.locations: list[Location] = []


class LedgerStorage:
    def __init__(self, directory: str, entry_log_file_bytes_max: int, *,
                 drop_page_cache: bool = False) -> None:
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self.ledgers: dict[int, LedgerState] = {}
        self.deleted: set[int] = set()
        self.mark: JournalPosition = START
        self.live_bytes: dict[int, int] = {}     # entry log id -> live bytes (all ledgers)
        self.entry_total = 0
        self.cache_bytes = 0                     # bytes held by the write cache
        self.unflushed_bytes = 0                 # bytes applied since the last take_flush
        self._flush_list: list[tuple[LedgerState, int, CacheItem]] = []
        self.pending_removals: list[int] = []    # entry logs to delete after the next persist
        self._load()
        self.entry_logger = EntryLogger(directory, entry_log_file_bytes_max,
                                        min_log_id=max(self.live_bytes, default=0),
                                        drop_page_cache=drop_page_cache)

    # --- state changes (loop thread) -----------------------------------------------------
    def get_or_create(self, ledger_id: int) -> LedgerState | None:
        """The ledger's state, created if new; None if the ledger was deleted."""
        st = self.ledgers.get(ledger_id)
        if st is None:
            if ledger_id in self.deleted:
                return None
            st = self.ledgers[ledger_id] = LedgerState(ledger_id)
        return st

    def apply_adds(self, items: Iterable[CacheItem]) -> list[int] | None:
        """Put journaled entries in the write cache (they become readable).

        The first write of an entry id wins: an item whose entry this ledger already stores
        (write cache or index) changes nothing, not even the LAC. Returns the positions (in
        ``items``) of the items skipped so, or None when there were none. The same rule applies
        live and at journal replay, in journal order, so a re-write the bookie refused (two
        adds of one entry id with different bytes in flight at once: the later one is answered
        ENTRY_EXISTS, bookie.storage.store) never replaces the stored entry after a restart."""
        ledgers = self.ledgers
        flush_list = self._flush_list
        added = 0
        skipped: list[int] | None = None
        cur: LedgerState | None = None
        for position, item in enumerate(items):
            entry = item[0]
            lid = entry.ledger_id
            if cur is None or cur.ledger_id != lid:
                cur = ledgers.get(lid)
                if cur is None:
                    cur = self.get_or_create(lid)
                    if cur is None:
                        continue          # deleted after the add was accepted
            e = entry.entry_id
            cache = cur.cache
            if e <= cur.last_entry_id and (e in cache or cur.loc(e) is not None):
                if skipped is None:
                    skipped = []
                skipped.append(position)
                continue
            size = len(entry.payload) + RECORD_OVERHEAD_BYTES
            cur.count += 1
            self.entry_total += 1
            cache[e] = item
            flush_list.append((cur, e, item))
            added += size
            if entry.lac > cur.lac:
                cur.lac = entry.lac
            if e > cur.last_entry_id:
                cur.last_entry_id = e
        self.cache_bytes += added
        self.unflushed_bytes += added
        return skipped

    def apply_fence(self, ledger_id: int) -> LedgerState | None:
        st = self.get_or_create(ledger_id)
        if st is not None:
            st.fenced = True
        return st

    def apply_delete(self, ledger_id: int) -> bool:
        """Forget a ledger and remember that it was deleted; True if it held anything."""
        self.deleted.add(ledger_id)
        st = self.ledgers.pop(ledger_id, None)
        if st is None:
            return False
        st.deleted = True
        for log_id, n in st.log_bytes.items():
            self.live_bytes[log_id] = self.live_bytes.get(log_id, 0) - n
        for item in st.cache.values():
            self.cache_bytes -= len(item[0].payload) + RECORD_OVERHEAD_BYTES
        st.cache.clear()
        self.entry_total -= st.count
        log.info("ledger deleted ledger_id=%d entries=%d", ledger_id, st.count)
        return True

    # --- reads (loop thread) -------------------------------------------------------------
    def get_entry(self, st: LedgerState, entry_id: int) -> StoredEntry | None:
        item = st.cache.get(entry_id)
        if item is not None:
            return item[0]
        loc = st.loc(entry_id)
        if loc is None:
            return None
        p, size = loc
        return self.entry_logger.read(st.ledger_id, entry_id, p >> LOG_OFFSET_BITS,
                                      p & LOG_OFFSET_MASK, size)

    def read_range(self, st: LedgerState, first: int, last: int, max_bytes: int) -> list[StoredEntry]:
        """Entries first..last, stopping at the first missing one or before ``max_bytes`` of
        payload would be exceeded (at least one entry if the first exists). Contiguous entries
        of one log are read with one pread."""
        out: list[StoredEntry] = []
        total = 0
        e = first
        logger = self.entry_logger
        while e <= last:
            item = st.cache.get(e)
            if item is not None:
                entry = item[0]
                if out and total + len(entry.payload) > max_bytes:
                    break
                out.append(entry)
                total += len(entry.payload)
                e += 1
                continue
            loc = st.loc(e)
            if loc is None:
                break
            # gather a run of entries stored back to back in one log
            p0, s0 = loc
            run = [(e, p0, s0)]
            span = s0
            budget = max_bytes - total
            nxt = e + 1
            while nxt <= last and span < budget and nxt not in st.cache:
                l2 = st.loc(nxt)
                if l2 is None or l2[0] != p0 + span or (l2[0] >> LOG_OFFSET_BITS) != (p0 >> LOG_OFFSET_BITS):
                    break
                run.append((nxt, l2[0], l2[1]))
                span += l2[1]
                nxt += 1
            log_id = p0 >> LOG_OFFSET_BITS
            off0 = p0 & LOG_OFFSET_MASK
            data = logger.read_raw(log_id, off0, span)
            stop = False
            for eid, p, s in run:
                rel = (p & LOG_OFFSET_MASK) - off0
                entry = logger.decode(data, rel, st.ledger_id, eid, log_id, p & LOG_OFFSET_MASK, s)
                if out and total + len(entry.payload) > max_bytes:
                    stop = True
                    break
                out.append(entry)
                total += len(entry.payload)
            if stop:
                break
            e = nxt
        return out

    # --- checkpoint ----------------------------------------------------------------------
    def take_flush(self, mark: JournalPosition) -> FlushJob:
        """Loop thread: everything applied so far (all records before ``mark``)."""
        job = FlushJob(mark, self._flush_list)
        self._flush_list = []
        self.unflushed_bytes = 0
        return job

    def write_flush(self, job: FlushJob) -> None:
        """Worker thread: append the job's entries to the entry log and fsync it."""
        if job.items:
            job.locations = self.entry_logger.append(
                (item[1], item[0].payload, item[2]) for _, _, item in job.items)
        self.entry_logger.sync()

    def finish_flush(self, job: FlushJob) -> None:
        """Loop thread: index the flushed entries and drop them from the write cache."""
        live = self.live_bytes
        uncached = 0
        for (st, e, item), (log_id, offset, size) in zip(job.items, job.locations):
            cache = st.cache
            if st.deleted or cache.get(e) is not item:
                continue          # deleted or replaced meanwhile: its bytes are garbage
            del cache[e]
            uncached += size
            old = st.set_loc(e, (log_id << LOG_OFFSET_BITS) | offset, size)
            if old is not None:
                self._unaccount(st, old[0] >> LOG_OFFSET_BITS, old[1])
            log_bytes = st.log_bytes
            log_bytes[log_id] = log_bytes.get(log_id, 0) + size
            live[log_id] = live.get(log_id, 0) + size
        self.cache_bytes -= uncached

    def _unaccount(self, st: LedgerState, log_id: int, size: int) -> None:
        left = st.log_bytes.get(log_id, 0) - size
        if left > 0:
            st.log_bytes[log_id] = left
        else:
            st.log_bytes.pop(log_id, None)
        self.live_bytes[log_id] = self.live_bytes.get(log_id, 0) - size

    def serialize(self, mark: JournalPosition) -> tuple[bytes, list[int]]:
        """Loop thread: the checkpoint file's bytes, and the entry logs that may be removed
        once it is durable (none of its index entries point into them)."""
        ledgers = self.ledgers
        parts = [_CK_HEAD.pack(_CK_MAGIC, _CK_VERSION, mark.file_id, mark.offset,
                               len(ledgers), len(self.deleted))]
        for st in ledgers.values():
            parts.append(_CK_LEDGER.pack(st.ledger_id, st.fenced, st.lac, st.last_entry_id,
                                         st.base, len(st.pos), len(st.sparse), len(st.log_bytes)))
            parts.append(_le(st.pos))
            parts.append(_le(st.size))
            for e, (p, s) in st.sparse.items():
                parts.append(_CK_SPARSE.pack(e, p, s))
            for log_id, n in st.log_bytes.items():
                parts.append(_CK_LOG.pack(log_id, n))
        parts.append(_le(array("Q", sorted(self.deleted))))
        body = b"".join(parts)
        removals = self.pending_removals
        self.pending_removals = []
        return body + struct.pack("<I", crc32c(body)), removals

    def persist(self, blob: bytes, mark: JournalPosition) -> None:
        """Worker thread: write the checkpoint file atomically."""
        path = os.path.join(self.directory, CHECKPOINT_NAME)
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            mv = memoryview(blob)
            while mv:
                n = os.write(fd, mv)
                mv = mv[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        fsync_dir(self.directory)
        self.mark = mark

    def checkpoint_sync(self, mark: JournalPosition) -> list[int]:
        """A whole checkpoint in the calling thread (open, tests). Returns removed logs."""
        job = self.take_flush(mark)
        self.write_flush(job)
        self.finish_flush(job)
        blob, removals = self.serialize(mark)
        self.persist(blob, mark)
        self.entry_logger.remove(removals)
        return removals

    def _load(self) -> None:
        path = os.path.join(self.directory, CHECKPOINT_NAME)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            log.info("no checkpoint, starting empty dir=%s", self.directory)
            return
        if len(data) < _CK_HEAD.size + 4 or \
                struct.unpack_from("<I", data, len(data) - 4)[0] != crc32c(memoryview(data)[:-4]):
            raise ChecksumError(f"checkpoint file {path} is corrupt (crc mismatch)")
        magic, version, mfile, moff, n_ledgers, n_deleted = _CK_HEAD.unpack_from(data, 0)
        if magic != _CK_MAGIC or version != _CK_VERSION:
            raise ChecksumError(f"checkpoint file {path}: bad magic or version {version}")
        mv = memoryview(data)
        pos = _CK_HEAD.size
        for _ in range(n_ledgers):
            lid, fenced, lac, last, base, n, n_sparse, n_logs = _CK_LEDGER.unpack_from(data, pos)
            pos += _CK_LEDGER.size
            st = LedgerState(lid)
            st.fenced, st.lac, st.last_entry_id, st.base = bool(fenced), lac, last, base
            st.pos = _from_le("Q", mv[pos:pos + 8 * n])
            pos += 8 * n
            st.size = _from_le("I", mv[pos:pos + 4 * n])
            pos += 4 * n
            for _ in range(n_sparse):
                e, p, s = _CK_SPARSE.unpack_from(data, pos)
                pos += _CK_SPARSE.size
                st.sparse[e] = (p, s)
            for _ in range(n_logs):
                log_id, nbytes = _CK_LOG.unpack_from(data, pos)
                pos += _CK_LOG.size
                st.log_bytes[log_id] = nbytes
                self.live_bytes[log_id] = self.live_bytes.get(log_id, 0) + nbytes
            st.count = n - st.pos.count(0) + len(st.sparse)
            self.entry_total += st.count
            self.ledgers[lid] = st
        self.deleted = set(_from_le("Q", mv[pos:pos + 8 * n_deleted]))
        pos += 8 * n_deleted
        if pos != len(data) - 4:
            raise ChecksumError(f"checkpoint file {path}: {len(data) - 4 - pos} unexpected bytes")
        self.mark = JournalPosition(mfile, moff)
        log.info("checkpoint loaded dir=%s ledgers=%d entries=%d deleted=%d mark=%s",
                 self.directory, n_ledgers, self.entry_total, n_deleted, self.mark)

    # --- garbage collection --------------------------------------------------------------
    def log_usage(self) -> dict[int, LogUsage]:
        sizes = self.entry_logger.file_sizes()
        return {log_id: LogUsage(size, self.live_bytes.get(log_id, 0))
                for log_id, size in sizes.items()}

    def live_entries_in(self, log_id: int) -> list[tuple[LedgerState, int, int, int]]:
        """(ledger, entry_id, pos, size) of every live entry in one log, in file order."""
        out = []
        for st in self.ledgers.values():
            if st.log_bytes.get(log_id):
                out.extend((st, e, p, s) for e, p, s in st.indexed_in_log(log_id))
        out.sort(key=lambda t: t[2])
        return out

    def relocate(self, moves: Iterable[tuple[LedgerState, int, int, int]],
                 new_locations: list[Location]) -> int:
        """Point moved entries at their copies (unless deleted or rewritten meanwhile)."""
        moved = 0
        for (st, e, p, s), loc in zip(moves, new_locations):
            if st.deleted or st.loc(e) != (p, s):
                continue
            new_p = (loc.log_id << LOG_OFFSET_BITS) | loc.offset
            st.set_loc(e, new_p, loc.size)
            self._unaccount(st, p >> LOG_OFFSET_BITS, s)
            st.log_bytes[loc.log_id] = st.log_bytes.get(loc.log_id, 0) + loc.size
            self.live_bytes[loc.log_id] = self.live_bytes.get(loc.log_id, 0) + loc.size
            moved += 1
        return moved

    def close(self) -> None:
        self.entry_logger.close()

