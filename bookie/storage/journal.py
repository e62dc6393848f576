"""The journal: the bookie's write-ahead log, written by one dedicated thread with group commit.

Files live in ``journal_dir`` as ``<file id, 12 digits>.journal``: a 16-byte header
(``b"PLJN"``, u32 version, u64 file id) then records in the codec of
:mod:`bookie.storage.entry_log` (ADD / FENCE / DELETE, each with a CRC32C). Files are
preallocated with zeros ``journal_preallocate_bytes`` ahead of the writer (an fdatasync that
does not grow the file is cheaper) and rolled at ``journal_file_bytes_max``. Every open starts
a new file, so a torn tail is never written over.

Replay reads records from a checkpoint mark (a :class:`JournalPosition`) onward and stops in
each file at the first record that is zero (the preallocated tail), truncated or fails its CRC:
everything after it in that file was never acknowledged, because acks follow the fdatasync of
the whole group.

The writer thread drains the submitted items, asks :class:`GroupCommitPolicy` whether to flush,
writes the group with one pwrite, fdatasyncs, and hands the group to ``on_commit`` (the store
hops it into the event loop with ``call_soon_threadsafe``). On an I/O error it stops and hands
every item it holds to ``on_error``.
"""

from __future__ import annotations

import logging
import mmap
import os
import queue
import re
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from bookie.storage.entry_log import (Record, drop_clean_pages, fsync_dir, parse_record, pwrite_all,
                                      pwritev_all)
from bookie.storage.group_commit import GroupCommitPolicy
from pulsarlite.errors import BookieUnavailableError, InvariantViolation

log = logging.getLogger("bookie.storage.journal")

FILE_HEADER = struct.Struct(">4sIQ")
FILE_MAGIC = b"PLJN"
FILE_VERSION = 1
FILE_HEADER_BYTES = FILE_HEADER.size
_NAME = re.compile(r"^(\d{12})\.journal$")
_ZEROS = bytes(1024 * 1024)
DROP_PAGE_CACHE_STEP_BYTES = 1024 * 1024   # synced journal bytes dropped from the page cache at once


@dataclass(frozen=True, order=True)
class JournalPosition:
    """A point in the journal: records at or after it are not yet in ledger storage."""

    file_id: int
    offset: int


START = JournalPosition(0, 0)


@dataclass(eq=False)
class JournalItem:
    """One submission: the record bytes (as pieces) of a caller, committed together."""

    pieces: list[bytes | memoryview]
    nbytes: int
    records: int
    enqueued_ms: float = 0.0
    context: Any = None               # opaque to the journal (the store's future and payload)


def journal_path(directory: str, file_id: int) -> str:
    return os.path.join(directory, f"{file_id:012d}.journal")


def list_journal_files(directory: str) -> list[int]:
    ids = []
    for name in os.listdir(directory):
        m = _NAME.match(name)
        if m:
            ids.append(int(m.group(1)))
    return sorted(ids)


def remove_journal_files_below(directory: str, file_id: int) -> list[int]:
    """Delete journal files with an id below ``file_id`` (all their records are checkpointed)."""
    removed = []
    for fid in list_journal_files(directory):
        if fid < file_id:
            os.unlink(journal_path(directory, fid))
            removed.append(fid)
    if removed:
        fsync_dir(directory)
        log.info("journal files removed ids=%s", removed)
    return removed


def read_journal_file(path: str, file_id: int, start: int = 0) -> Iterator[tuple[Record, int]]:
    """Valid records of one file from ``start`` (0 = after the header), with their end offsets."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < FILE_HEADER_BYTES:
            log.warning("journal file without header path=%s size=%d", path, size)
            return
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            magic, version, fid = FILE_HEADER.unpack_from(mm, 0)
            if magic != FILE_MAGIC or version != FILE_VERSION or fid != file_id:
                log.warning("journal file with a bad header path=%s", path)
                return
            pos = max(start, FILE_HEADER_BYTES)
            count = 0
            while True:
                parsed = parse_record(mm, pos, size)
                if isinstance(parsed, str):
                    if parsed != "end":
                        log.warning("journal replay stops path=%s offset=%d reason=%s", path, pos, parsed)
                    break
                rec, pos = parsed
                count += 1
                yield rec, pos
            log.info("journal file replayed path=%s records=%d end=%d", path, count, pos)


def replay_journal(directory: str, mark: JournalPosition) -> Iterator[tuple[Record, JournalPosition]]:
    """Every valid record at or after ``mark``, in journal order."""
    for fid in list_journal_files(directory):
        if fid < mark.file_id:
            continue
        start = mark.offset if fid == mark.file_id else 0
        for rec, end in read_journal_file(journal_path(directory, fid), fid, start):
            yield rec, JournalPosition(fid, end)


# zero-fill granularity of preallocation (bounds the stall a group can meet)
PREALLOCATE_STEP_BYTES = 1024 * 1024

class JournalWriter:
    """Appends groups of records to the journal; ``write_group`` is the synchronous core, the
    thread (``start``) wraps it with the group-commit loop."""

    def __init__(self, directory: str, *, file_bytes_max: int, preallocate_bytes: int,
                 policy: GroupCommitPolicy, queue_records_max: int = 1 << 30,
                 min_file_id: int = 0, drop_page_cache: bool = False) -> None:
        """Opens a new file with an id above every existing file and above ``min_file_id``
        (the checkpoint mark's file: replay skips files below it, so ids must never go back
        even if the journal directory was emptied)."""
        self.directory = directory
        self.file_bytes_max = file_bytes_max
        self.preallocate_bytes = preallocate_bytes
        self.policy = policy
        self.queue_records_max = queue_records_max
        self.drop_page_cache = drop_page_cache
        os.makedirs(directory, exist_ok=True)
        self.file_id = max(max(list_journal_files(directory), default=0), min_file_id)
        self._fd = -1
        self._offset = 0
        self._allocated = 0
        self._new_file()
        self.start_position = self.position
        # submitted items, then None once stopping (a SimpleQueue: put and get cost no Python
        # code, and a put wakes the writer without a Condition's per-wait lock objects)
        self._queue: queue.SimpleQueue[JournalItem | None] = queue.SimpleQueue()
        self._stopping = False
        self._thread: threading.Thread | None = None
        # held by whoever writes the file: the thread (a group, or zeros while idle) or a
        # caller of write_group_now
        self._write_lock = threading.Lock()
        self.error: BaseException | None = None
        self.groups_written = 0
        self.bytes_written = 0
        # metrics hook: called with each group's fdatasync time in seconds (any thread)
        self.on_sync: Callable[[float], None] | None = None

    @property
    def position(self) -> JournalPosition:
        return JournalPosition(self.file_id, self._offset)

    # --- synchronous core ----------------------------------------------------------------
    def _new_file(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)   # every group in it was fdatasync'ed
            self._fd = -1
        self.file_id += 1
        path = journal_path(self.directory, self.file_id)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        pwrite_all(fd, FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION, self.file_id), 0)
        self._fd = fd
        self._offset = FILE_HEADER_BYTES
        self._dropped = 0                  # the file's pages below this are out of the page cache
        self._allocated = FILE_HEADER_BYTES
        if self.preallocate_bytes > 0:
            self._zero_fill_to(self._preallocation_target(FILE_HEADER_BYTES))
        os.fsync(fd)
        fsync_dir(self.directory)
        log.info("journal file created file_id=%d", self.file_id)

    def _zero_fill_to(self, target: int) -> None:
        """Zero-fill the file from the allocated end up to ``target``."""
        pos = self._allocated
        while pos < target:
            n = min(len(_ZEROS), target - pos)
            pwrite_all(self._fd, memoryview(_ZEROS)[:n], pos)
            pos += n
        self._allocated = max(self._allocated, target)

    @property
    def _preallocate_step_bytes(self) -> int:
        return min(self.preallocate_bytes, PREALLOCATE_STEP_BYTES)

    def _preallocation_target(self, end: int) -> int:
        """On the write path, zero-fill only one step past ``end``: a group never waits for more
        than one step of zeros (16 MiB at once stalled adds ~40 ms here). The rest of the
        look-ahead is filled while the writer is idle (``preallocate_when_idle``)."""
        return max(end, min(end + self._preallocate_step_bytes, self.file_bytes_max))

    def preallocate_when_idle(self) -> bool:
        """Zero-fill one more step if less than ``preallocate_bytes`` lie ahead of the writer;
        returns whether it did (call again while the queue stays empty)."""
        if self.preallocate_bytes <= 0 or self._fd < 0:
            return False
        if self._allocated - self._offset >= self.preallocate_bytes or self._allocated >= self.file_bytes_max:
            return False
        self._zero_fill_to(min(self._allocated + self._preallocate_step_bytes, self.file_bytes_max))
        return True

    def write_group(self, pieces: list[bytes | memoryview]) -> JournalPosition:
        """Write one group and fdatasync it; returns the position after it."""
        nbytes = sum(map(len, pieces))
        if not nbytes:
            return self.position
        if self._offset > FILE_HEADER_BYTES and self._offset + nbytes > self.file_bytes_max:
            self._new_file()
        end = self._offset + nbytes
        if end > self._allocated and self.preallocate_bytes > 0:
            self._zero_fill_to(self._preallocation_target(end))
        pwritev_all(self._fd, pieces, self._offset)
        if self.on_sync is None:
            os.fdatasync(self._fd)
        else:
            started = time.perf_counter()
            os.fdatasync(self._fd)
            self.on_sync(time.perf_counter() - started)
        self._offset = end
        self.groups_written += 1
        self.bytes_written += nbytes
        if self.drop_page_cache and end - self._dropped >= DROP_PAGE_CACHE_STEP_BYTES:
            # read again only at replay; the memory goes back to the free pool, where the next
            # zero-fill finds it instead of growing the page cache
            self._dropped = drop_clean_pages(self._fd, self._dropped, end)
        return self.position

    def write_group_now(self, pieces: list[bytes | memoryview]) -> JournalPosition | None:
        """Write and fdatasync a group on the caller's thread, if the writer thread is not
        writing (else None: submit it instead). The caller guarantees that nothing it submitted
        is still uncommitted (the thread holds no group), so the journal's order is the order
        of the calls. A write error stops the writer as one in its thread does, and is raised."""
        if self._stopping or not self._write_lock.acquire(blocking=False):
            return None
        try:
            return self.write_group(pieces)
        except BaseException as e:
            self._stop_on_error(e)
            raise
        finally:
            self._write_lock.release()

    def _stop_on_error(self, error: BaseException) -> None:
        """A write failed (the thread's or write_group_now's): the writer takes no more."""
        self.error = error
        self._stopping = True
        log.error("journal write failed file_id=%d error=%r", self.file_id, error)

    def close_file(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # --- the thread ----------------------------------------------------------------------
    def start(self, on_commit: Callable[[list[JournalItem], JournalPosition], None],
              on_error: Callable[[BaseException, list[JournalItem]], None]) -> None:
        if self._thread is not None:
            raise InvariantViolation("journal writer already started")
        self._thread = threading.Thread(target=self._run, args=(on_commit, on_error),
                                        name=f"journal-{os.path.basename(self.directory)}",
                                        daemon=True)
        self._thread.start()

    def submit(self, item: JournalItem) -> None:
        """Queue an item (thread-safe). The caller bounds what it has in flight."""
        if self._stopping:
            raise BookieUnavailableError("journal writer is stopped")
        item.enqueued_ms = time.monotonic() * 1000.0
        self._queue.put(item)

    def stop(self) -> None:
        """Write what is queued, then end the thread (blocking). Items submitted while it
        stops may be left unwritten (their owner fails them: they were never acknowledged)."""
        self._stopping = True
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join()
        self.close_file()

    def _run(self, on_commit: Callable[[list[JournalItem], JournalPosition], None],
             on_error: Callable[[BaseException, list[JournalItem]], None]) -> None:
        policy = self.policy
        bytes_max = policy.bytes_buffered_max
        q = self._queue
        get = q.get
        get_nowait = q.get_nowait
        empty = q.empty
        monotonic = time.monotonic
        group: list[JournalItem] = []
        nbytes = 0
        oldest: float | None = None
        stopping = False
        while True:
            # gather a group: block for the first item (zero-filling ahead while idle), take
            # what else is queued, then obey the policy (wait for more, or flush now)
            while True:
                if not group:
                    if stopping:
                        return
                    try:
                        item = get_nowait()
                    except queue.Empty:
                        with self._write_lock:
                            zeroed = self.preallocate_when_idle()
                        if zeroed:
                            continue
                        item = get()
                else:
                    delay = policy.next_flush_delay_ms(now_ms=monotonic() * 1000.0, oldest_ms=oldest,
                                                       bytes_buffered=nbytes,
                                                       queue_empty=stopping or empty())
                    if delay == 0.0 or stopping or nbytes >= bytes_max:
                        break
                    try:
                        item = get(timeout=delay / 1000.0)
                    except queue.Empty:
                        continue
                if item is None:
                    stopping = True          # write what is gathered and queued, then end
                    continue
                group.append(item)
                nbytes += item.nbytes
                if oldest is None:
                    oldest = item.enqueued_ms
                while nbytes < bytes_max and not stopping:
                    try:
                        item = get_nowait()
                    except queue.Empty:
                        break
                    if item is None:
                        stopping = True
                        break
                    group.append(item)
                    nbytes += item.nbytes
            try:
                if len(group) == 1:
                    pieces = group[0].pieces
                else:
                    pieces = [p for item in group for p in item.pieces]
                with self._write_lock:
                    pos = self.write_group(pieces)
            except BaseException as e:  # noqa: BLE001 - handed to the owner, thread ends
                self._stop_on_error(e)
                rest = []
                while True:
                    try:
                        item = get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        rest.append(item)
                on_error(e, group + rest)
                return
            on_commit(group, pos)
            group = []
            nbytes = 0
            oldest = None
