"""BookieStore: the asyncio facade over the journal and ledger storage that the bookie server
calls. A thin shell: validation and state live in :mod:`ledger_storage`, the fsync'ing journal
runs in its own thread (:mod:`journal`), blocking checkpoint/GC I/O runs in worker threads.

Decisions beyond the brief (see the module's report):

- Adds to a deleted ledger answer NO_SUCH_LEDGER; a deleted ledger is never recreated (a late
  write from an old writer must not resurrect a ledger the offloader removed).
- ``delete_ledger`` is idempotent: it answers OK even for a ledger this bookie never saw, and
  remembers the id as deleted.
- Fencing a deleted ledger changes nothing and answers ``LedgerInfo(exists=False,
  fenced=True, ...)``; fencing works while read-only (it only makes things safer).
- Recovery adds are refused when read-only, like any add.
- ``read`` with ``max_bytes <= 0`` uses ``read_bytes_max``; ``max_bytes`` counts payload bytes.
- The first write of an entry id wins ([hardening]): an add of an entry the bookie already
  stores (or has in flight) is answered OK only with the same entry (payload and length; the LAC
  it carries may differ, see ``_same_entry``: a client's retry, a re-send after an ensemble
  change, a recovery re-write; nothing new is journaled when it is stored already), else
  ENTRY_EXISTS, and the stored entry, the LAC and the journal replay's result stay as they were.
- A journal write/fsync error or a crashed background task fails every pending add/fence/delete
  with that error; later calls raise :class:`BookieUnavailableError` (the store must be
  reopened: after a failed fsync the page cache can no longer be trusted).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from crc32c import crc32c

from bookie.storage.entry_log import (ADD, DELETE, FENCE, HEAD, I64_MAX, LOG_OFFSET_MASK,
                                      RECORD_OVERHEAD_BYTES,
                                      TRAILER, U32_MAX, U64_MAX, BODY_FIXED_BYTES, StoredEntry,
                                      encode_add, encode_control, record_to_entry)
from bookie.storage.group_commit import GroupCommitPolicy
from bookie.storage.journal import (JournalItem, JournalPosition, JournalWriter,
                                    remove_journal_files_below, replay_journal)
from bookie.storage.ledger_storage import LedgerStorage, plan_gc
from pulsarlite.config import BookieConfig
from pulsarlite.errors import BookieUnavailableError, ChecksumError, InvariantViolation

log = logging.getLogger("bookie.storage.store")

_COMPACTION_CHUNK_BYTES = 1024 * 1024
# a group written by the event loop (submit_adds) that took this long (a slow disk, or a
# loop thread that waited for a CPU: wall time cannot tell them apart, so the bound sits above
# this VM's usual scheduling stalls): the journal thread takes every group for a while, so
# reads and other requests keep moving
_INLINE_WRITE_SLOW_S = 0.010
_INLINE_WRITE_PAUSE_S = 1.0


class Status(enum.IntEnum):
    """Mirrors proto StatusCode numbers exactly."""

    OK = 0
    NO_SUCH_LEDGER = 1
    NO_SUCH_ENTRY = 2
    FENCED = 3
    READ_ONLY = 4
    BAD_REQUEST = 5
    CHECKSUM_MISMATCH = 6
    TOO_LARGE = 7
    UNAVAILABLE = 8
    INTERNAL = 9
    ENTRY_EXISTS = 10


@dataclass(frozen=True)
class LedgerInfo:
    exists: bool
    fenced: bool
    lac: int
    last_entry_id: int        # -1 when none


_NO_LEDGER = LedgerInfo(False, False, -1, -1)
_DELETED_LEDGER = LedgerInfo(False, True, -1, -1)


class _Pending:
    """What the store attaches to a journal item: what to apply, and whom to tell once it is
    fsynced: a waiting future (fences, deletes), or (``submit_adds``) a callback; for adds, the request's
    entries and their statuses (one each, answered once the item is applied: a re-write found
    to conflict at that point turns from OK to ENTRY_EXISTS, see ``_refuse_rewrites``)."""

    __slots__ = ("future", "kind", "adds", "done", "statuses", "entries")

    def __init__(self, future: asyncio.Future | None, kind: int, adds: list | None,
                 done: "AddDone | None" = None, statuses: list | None = None,
                 entries: "Sequence[StoredEntry] | None" = None) -> None:
        self.future = future
        self.kind = kind
        self.adds = adds
        self.done = done
        self.statuses = statuses
        self.entries = entries


# submit_adds' completion: the statuses once the accepted entries are fsynced, or the
# error that failed the store (the entries may or may not be durable)
AddDone = Callable[["list[Status] | BaseException"], None]


def _call_done(done: AddDone, result: "list[Status] | BaseException") -> None:
    try:
        done(result)
    except Exception:                              # noqa: BLE001 - like a Future's callback
        log.exception("add completion callback failed")


def _same_entry(a: StoredEntry, b: StoredEntry) -> bool:
    """The same entry: payload and length (ledger and entry ids aside). Not the LAC it carries
    (nor so the checksum, which covers it): the ledger client re-sends a pending entry after an
    ensemble change with the LAC it has then (bookie/client/write_core.py ``_send_missing``), so
    the replicas of one entry may differ there, and recovery re-writes the copy it read to the
    others. Such a re-write is answered OK and changes nothing (the stored LAC stays)."""
    return a.length == b.length and a.payload == b.payload


def _accepted_positions(entries: Sequence[StoredEntry], statuses: list, adds: list) -> list[int] | None:
    """The request position of each accepted item (``adds``, in order): the OK statuses in
    order, less those of re-writes answered OK without being journaled (an entry equal to the
    next accepted one cannot be such a re-write: ``_accept`` would have found it stored too).
    None if they do not line up (a bug)."""
    out = []
    k = 0
    n = len(adds)
    ok = Status.OK
    for i, status in enumerate(statuses):
        if k < n and status == ok and entries[i] == adds[k][0]:
            out.append(i)
            k += 1
    return out if k == n else None


class BookieStore:
    def __init__(self, config: BookieConfig, storage: LedgerStorage, journal: JournalWriter) -> None:
        self._config = config
        self._storage = storage
        self._journal = journal
        self.read_only = False
        self._applied_mark: JournalPosition = journal.start_position
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        self._closed = False
        self._failed: BaseException | None = None
        self._tasks: set[asyncio.Task] = set()
        self._pending: set[asyncio.Future] = set()
        self._pending_adds: set[_Pending] = set()     # submit_adds' journaled, until done is called
        self._inflight_records = 0
        self._write_inline_bytes_max = (config.journal_write_inline_bytes_max
                                        if config.journal_flush_when_queue_empty else -1)
        self._write_inline_paused_until_s = 0.0    # monotonic; see _INLINE_WRITE_SLOW_S
        self.inline_groups_written = 0
        # submit_adds' requests waiting for room in the journal queue or the write cache
        self._adds_waiting: deque[tuple[Sequence[StoredEntry], bool, AddDone]] = deque()
        self._io_lock: asyncio.Lock | None = None
        self._checkpoint_wanted: asyncio.Event | None = None
        self.checkpoints_done = 0

    @property
    def journal_records_in_flight(self) -> int:
        """Records handed to the journal and not yet committed."""
        return self._inflight_records

    # --- lifecycle -----------------------------------------------------------------------
    @classmethod
    def open(cls, config: BookieConfig) -> "BookieStore":
        """Create the directories, load the last checkpoint, replay the journal from its mark,
        and checkpoint the result (so the replayed journal files can go)."""
        config.validate()
        started = time.monotonic()
        os.makedirs(config.journal_dir, exist_ok=True)
        os.makedirs(config.ledger_dir, exist_ok=True)
        storage = LedgerStorage(config.ledger_dir, config.entry_log_file_bytes_max,
                                drop_page_cache=config.entry_log_drop_page_cache)
        mark = storage.mark
        counts = {ADD: 0, FENCE: 0, DELETE: 0}
        adds: list = []
        rewrites_kept_out = 0     # journaled re-writes of stored entries: the first write won

        def apply(adds: list) -> int:
            skipped = storage.apply_adds(adds)
            return len(skipped) if skipped else 0

        for rec, _pos in replay_journal(config.journal_dir, mark):
            counts[rec.kind] += 1
            if rec.kind == ADD:
                entry = record_to_entry(rec)
                head, trailer = encode_add(entry)
                adds.append((entry, head, trailer))
                if len(adds) >= 4096:
                    rewrites_kept_out += apply(adds)
                    adds = []
                continue
            if adds:
                rewrites_kept_out += apply(adds)
                adds = []
            if rec.kind == FENCE:
                storage.apply_fence(rec.ledger_id)
            else:
                storage.apply_delete(rec.ledger_id)
        if adds:
            rewrites_kept_out += apply(adds)
        policy = GroupCommitPolicy(config.group_wait_ms_max, config.journal_bytes_buffered_max,
                                   config.journal_flush_when_queue_empty)
        journal = JournalWriter(config.journal_dir, file_bytes_max=config.journal_file_bytes_max,
                                preallocate_bytes=config.journal_preallocate_bytes, policy=policy,
                                queue_records_max=config.journal_queue_records_max,
                                min_file_id=mark.file_id,
                                drop_page_cache=config.journal_drop_page_cache)
        mark = journal.start_position
        removed_logs = storage.checkpoint_sync(mark)
        for log_id in removed_logs:
            storage.live_bytes.pop(log_id, None)
        remove_journal_files_below(config.journal_dir, mark.file_id)
        log.info("bookie store opened journal_dir=%s ledger_dir=%s replayed_adds=%d "
                 "replayed_rewrites_kept_out=%d replayed_fences=%d replayed_deletes=%d ledgers=%d "
                 "entries=%d seconds=%.3f",
                 config.journal_dir, config.ledger_dir, counts[ADD], rewrites_kept_out,
                 counts[FENCE], counts[DELETE], len(storage.ledgers), storage.entry_total,
                 time.monotonic() - started)
        return cls(config, storage, journal)

    async def start(self) -> None:
        """Start the journal thread and the checkpoint and GC tasks."""
        if self._running or self._closed:
            raise InvariantViolation("store already started or closed")
        self._loop = asyncio.get_running_loop()
        self._io_lock = asyncio.Lock()
        self._checkpoint_wanted = asyncio.Event()
        loop = self._loop
        self._journal.start(
            lambda items, pos: loop.call_soon_threadsafe(self._on_commit, items, pos),
            lambda err, items: loop.call_soon_threadsafe(self._on_journal_error, err, items))
        self._running = True
        self._spawn(self._checkpoint_loop(), "checkpoint")
        self._spawn(self._gc_loop(), "gc")

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"bookie-store-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        err = task.exception()
        if err is not None:
            log.error("background task died task=%s error=%r", task.get_name(), err)
            self._fail(err)

    async def close(self) -> None:
        """Stop the tasks, write what the journal holds, take a final checkpoint, close files."""
        if self._closed:
            return
        self._closed = True
        was_running = self._running
        self._running = False
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - already reported
                pass
        if was_running:
            await asyncio.to_thread(self._journal.stop)
            await asyncio.sleep(0)      # commits queued by the thread run before this resumes
        else:
            self._journal.close_file()
        if self._failed is None:
            if self._io_lock is None:
                self._io_lock = asyncio.Lock()
            await self._checkpoint_locked()
        self._fail_pending(BookieUnavailableError("bookie store closed"))
        self._storage.close()
        log.info("bookie store closed ledger_dir=%s", self._config.ledger_dir)

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise BookieUnavailableError(f"bookie store failed: {self._failed!r}") from self._failed
        if not self._running:
            raise BookieUnavailableError("bookie store is not running")

    # --- journal callbacks (loop thread) -------------------------------------------------
    def _on_commit(self, items: list[JournalItem], pos: JournalPosition) -> None:
        storage = self._storage
        records = 0
        for item in items:
            pending: _Pending = item.context
            if pending.kind == ADD:
                skipped = storage.apply_adds(pending.adds)
                if skipped is not None:
                    self._refuse_rewrites(pending, skipped)
            records += item.records
        self._applied_mark = pos
        self._inflight_records -= records
        for item in items:
            pending = item.context
            fut = pending.future
            if fut is None:
                if pending in self._pending_adds:      # not already failed (exactly once)
                    self._pending_adds.remove(pending)
                    _call_done(pending.done, pending.statuses)
                continue
            self._pending.discard(fut)
            if not fut.done():
                fut.set_result(None)
        if self._adds_waiting:
            self._take_waiting_adds()
        if storage.unflushed_bytes >= self._config.write_cache_bytes_max and self._checkpoint_wanted:
            self._checkpoint_wanted.set()

    def _on_journal_error(self, err: BaseException, items: list[JournalItem]) -> None:
        self._fail(err)

    def _fail(self, err: BaseException) -> None:
        if self._failed is None:
            self._failed = err
            log.error("bookie store failed error=%r", err)
        self._fail_pending(err)

    def _fail_pending(self, err: BaseException) -> None:
        journaled, self._pending_adds = self._pending_adds, set()
        for pending in journaled:
            _call_done(pending.done, err)
        waiting, self._adds_waiting = self._adds_waiting, deque()
        for _, _, done in waiting:
            _call_done(done, err)
        for fut in list(self._pending):
            if not fut.done():
                fut.set_exception(err)
                fut.exception()          # retrieved: no "never retrieved" noise if unawaited
        self._pending.clear()

    def _has_space(self, records: int) -> bool:
        cfg = self._config
        if self._storage.cache_bytes >= 2 * cfg.write_cache_bytes_max:
            return False
        return self._inflight_records == 0 or \
            self._inflight_records + records <= cfg.journal_queue_records_max

    def _submit(self, kind: int, pieces: list, nbytes: int, records: int,
                adds: list | None, statuses: list | None = None,
                entries: Sequence[StoredEntry] | None = None) -> asyncio.Future:
        fut = self._loop.create_future()           # type: ignore[union-attr]
        self._journal.submit(JournalItem(pieces, nbytes, records,
                                         context=_Pending(fut, kind, adds, None, statuses, entries)))
        self._pending.add(fut)
        self._inflight_records += records
        return fut

    # --- adds ----------------------------------------------------------------------------
    def submit_adds(self, entries: Sequence[StoredEntry], recovery: bool, done: AddDone) -> None:
        """The one add path (the server's, and ``add_entries``'s): validate ``entries`` and
        journal the accepted ones. ``done(statuses)`` (one per entry, in order) runs exactly
        once, from the loop, never from inside this call: after the accepted entries' group
        commit is fsynced (they are readable from then on), or at once when none was accepted;
        ``done(error)`` if the journal fails or the store closes first (the entries may or may
        not be durable). Without room in the journal queue or the write cache, the request waits
        in the store, in arrival order, and is validated when room comes: the fence and delete
        checks and the journal order always agree (an add validated before a fence is journaled
        before the FENCE). Raises BookieUnavailableError (nothing taken) if the store failed."""
        self._check_usable()
        if self._adds_waiting or not self._has_space(len(entries)):
            self._adds_waiting.append((entries, recovery, done))
            if self._storage.cache_bytes >= 2 * self._config.write_cache_bytes_max:
                self._checkpoint_wanted.set()      # type: ignore[union-attr]
            return
        self._take_adds(entries, recovery, done)

    async def add_entries(self, entries: Sequence[StoredEntry], *, recovery: bool = False) -> list[Status]:
        """``submit_adds`` awaited: the statuses, or the store's error raised."""
        fut = self._loop.create_future()           # type: ignore[union-attr]

        def done(result: "list[Status] | BaseException") -> None:
            if fut.done():
                return
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)
        self.submit_adds(entries, recovery, done)
        return await fut

    def _take_adds(self, entries: Sequence[StoredEntry], recovery: bool, done: AddDone) -> None:
        """Validate and journal a request now (room checked by the caller)."""
        n = len(entries)
        if n == 0 or self.read_only:
            self._loop.call_soon(_call_done, done, [Status.READ_ONLY] * n)  # type: ignore[union-attr]
            return
        statuses, accepted, pieces, nbytes = self._accept(entries, recovery)
        if not accepted:
            self._loop.call_soon(_call_done, done, statuses)                # type: ignore[union-attr]
            return
        pending = _Pending(None, ADD, accepted, done, statuses, entries)
        item = JournalItem(pieces, nbytes, len(accepted), 0.0, pending)
        written = self._write_inline(pieces) if nbytes <= self._write_inline_bytes_max else None
        if written is None:
            self._journal.submit(item)        # raises (nothing registered) if it is stopped
        self._pending_adds.add(pending)
        self._inflight_records += len(accepted)
        if isinstance(written, BaseException):
            self._loop.call_soon(self._on_journal_error, written, [item])  # type: ignore[union-attr]
        elif written is not None:
            self._loop.call_soon(self._on_commit, [item], written)         # type: ignore[union-attr]

    def _take_waiting_adds(self) -> None:
        """Room came (a commit, a flush): take the waiting requests, in order, while it lasts."""
        waiting = self._adds_waiting
        while waiting and self._running and self._failed is None:
            entries, recovery, done = waiting[0]
            if not self._has_space(len(entries)):
                if self._storage.cache_bytes >= 2 * self._config.write_cache_bytes_max:
                    self._checkpoint_wanted.set()  # type: ignore[union-attr]
                return
            waiting.popleft()
            try:
                self._take_adds(entries, recovery, done)
            except Exception as e:  # noqa: BLE001 - the journal stopped: fail it like its thread
                self._loop.call_soon(_call_done, done, e)  # type: ignore[union-attr]

    def _write_inline(self, pieces: list) -> "JournalPosition | BaseException | None":
        """When nothing of ours waits for the journal, write this group here instead of waking
        the journal thread (and being woken back by it), see ``write_group_now``: its position,
        the error that stopped the journal, or None (submit it instead)."""
        if self._inflight_records or (started_s := time.monotonic()) < self._write_inline_paused_until_s:
            return None
        try:
            written = self._journal.write_group_now(pieces)
        except Exception as e:  # noqa: BLE001 - the journal is stopped; fail like its thread
            return e
        if written is not None:
            self.inline_groups_written += 1
            if (elapsed_s := time.monotonic() - started_s) >= _INLINE_WRITE_SLOW_S:
                self._write_inline_paused_until_s = started_s + elapsed_s + _INLINE_WRITE_PAUSE_S
                log.info("slow journal write on the event loop: the journal thread takes "
                         "every group for %.1f s elapsed_ms=%.1f journal_dir=%s",
                         _INLINE_WRITE_PAUSE_S, elapsed_s * 1e3, self._config.journal_dir)
        return written

    def _accept(self, entries: Sequence[StoredEntry],
                recovery: bool) -> tuple[list[Status], list, list, int]:
        """Validate entries: (one status per entry, the accepted (entry, head, trailer), their
        journal record pieces, the records' bytes)."""
        ok = Status.OK
        statuses: list[Status] = []
        append_status = statuses.append
        accepted: list = []
        pieces: list = []
        nbytes = 0
        ledgers = self._storage.ledgers
        deleted = self._storage.deleted
        entry_bytes_max = self._config.entry_bytes_max
        head_pack = HEAD.pack
        trailer_pack = TRAILER.pack
        for entry in entries:
            lid = entry.ledger_id
            eid = entry.entry_id
            lac = entry.lac
            length = entry.length
            checksum = entry.checksum
            payload = entry.payload
            if not (0 <= lid <= U64_MAX and 0 <= eid <= I64_MAX and -1 <= lac <= I64_MAX
                    and 0 <= length <= I64_MAX and 0 <= checksum <= U32_MAX):
                append_status(Status.BAD_REQUEST)
                continue
            if type(payload) is not bytes:
                try:
                    payload = bytes(payload)
                except TypeError:
                    append_status(Status.BAD_REQUEST)
                    continue
                entry = StoredEntry(lid, eid, lac, length, payload, checksum)
            plen = len(payload)
            if plen > entry_bytes_max:
                append_status(Status.TOO_LARGE)
                continue
            trailer = trailer_pack(ADD, checksum)
            head = head_pack(plen + BODY_FIXED_BYTES, crc32c(trailer, checksum), lid, eid, lac, length)
            if crc32c(payload, crc32c(head[8:])) != checksum:
                append_status(Status.CHECKSUM_MISMATCH)
                continue
            if lid in deleted:
                append_status(Status.NO_SUCH_LEDGER)
                continue
            st = ledgers.get(lid)
            if st is not None:
                if st.fenced and not recovery:
                    append_status(Status.FENCED)
                    continue
                if eid <= st.last_entry_id and st.has(eid):
                    # stored already (a client's retry, a re-send, a recovery re-write, or
                    # hostile): the same entry is durable already, nothing to journal; another
                    # one is refused
                    append_status(self._rewrite_status(st, entry))
                    continue
            append_status(ok)
            accepted.append((entry, head, trailer))
            pieces.append(head)
            pieces.append(payload)
            pieces.append(trailer)
            nbytes += plen + RECORD_OVERHEAD_BYTES
        return statuses, accepted, pieces, nbytes

    def _rewrite_status(self, st, entry: StoredEntry) -> Status:
        """An add of an entry id the ledger stores (applied: durable): OK if it is the stored
        entry (``_same_entry``), else ENTRY_EXISTS (the first write of an entry id wins, see
        ``LedgerStorage.apply_adds``). Reads the stored entry (from the entry log once flushed);
        a stored copy that fails its checksum is not replaced either."""
        try:
            stored = self._storage.get_entry(st, entry.entry_id)
        except ChecksumError as e:
            log.error("re-write of a corrupt stored entry refused ledger_id=%d entry_id=%d error=%s",
                      entry.ledger_id, entry.entry_id, e)
            return Status.ENTRY_EXISTS
        if stored is not None and _same_entry(stored, entry):
            return Status.OK
        return Status.ENTRY_EXISTS

    def _refuse_rewrites(self, pending: _Pending, skipped: list[int]) -> None:
        """``apply_adds`` skipped these accepted items of ``pending``: an earlier write of their
        entry id (in flight when they were accepted) was applied first. The same entry stays OK
        (that write is durable: it was in this group or an earlier one); another one turns to
        ENTRY_EXISTS before anyone is answered, and the journal replay skips them the same way."""
        adds = pending.adds
        statuses = pending.statuses
        entries = pending.entries
        assert adds is not None
        ledgers = self._storage.ledgers
        positions: list[int] | None = None
        for k in skipped:
            entry = adds[k][0]
            st = ledgers.get(entry.ledger_id)
            if st is not None and self._rewrite_status(st, entry) == Status.OK:
                continue
            if statuses is None or entries is None:
                continue                        # nobody to answer (not an add request)
            if positions is None:
                positions = _accepted_positions(entries, statuses, adds)
                if positions is None:
                    self._fail(InvariantViolation("accepted adds do not match their request's statuses"))
                    return
            statuses[positions[k]] = Status.ENTRY_EXISTS

    # --- fence and delete ----------------------------------------------------------------
    async def fence(self, ledger_id: int) -> LedgerInfo:
        """Fence at once in memory, journal a FENCE record, return after its fsync."""
        self._check_usable()
        if not 0 <= ledger_id <= U64_MAX:
            raise ValueError(f"ledger id out of range: {ledger_id}")
        if ledger_id in self._storage.deleted:
            return _DELETED_LEDGER
        self._storage.apply_fence(ledger_id)
        rec = encode_control(FENCE, ledger_id)
        await self._submit(FENCE, [rec], len(rec), 1, None)
        log.info("ledger fenced ledger_id=%d", ledger_id)
        return self.ledger_info(ledger_id)

    async def delete_ledger(self, ledger_id: int) -> Status:
        """Forget the ledger at once, journal a DELETE record, return after its fsync. GC
        reclaims its entry-log space later."""
        self._check_usable()
        if not 0 <= ledger_id <= U64_MAX:
            return Status.BAD_REQUEST
        self._storage.apply_delete(ledger_id)
        rec = encode_control(DELETE, ledger_id)
        await self._submit(DELETE, [rec], len(rec), 1, None)
        return Status.OK

    # --- reads ---------------------------------------------------------------------------
    def read(self, ledger_id: int, first_entry_id: int, last_entry_id: int,
             max_bytes: int) -> tuple[Status, list[StoredEntry]]:
        st = self._storage.ledgers.get(ledger_id)
        if st is None:
            return Status.NO_SUCH_LEDGER, []
        if first_entry_id < 0 or last_entry_id < first_entry_id:
            return Status.BAD_REQUEST, []
        limit = self._config.read_bytes_max
        if 0 < max_bytes < limit:
            limit = max_bytes
        entries = self._storage.read_range(st, first_entry_id, last_entry_id, limit)
        return (Status.OK if entries else Status.NO_SUCH_ENTRY), entries

    def ledger_info(self, ledger_id: int) -> LedgerInfo:
        st = self._storage.ledgers.get(ledger_id)
        if st is None:
            return _DELETED_LEDGER if ledger_id in self._storage.deleted else _NO_LEDGER
        return LedgerInfo(True, st.fenced, st.lac, st.last_entry_id)

    def ledger_ids(self) -> list[int]:
        return sorted(self._storage.ledgers)

    def entry_count(self) -> int:
        return self._storage.entry_total

    def disk_usage(self) -> tuple[float, int, int]:
        """(used_fraction, free_bytes, total_bytes) of the fuller of the ledger and journal
        disks; ``disk_free_bytes_override > 0`` replaces the free bytes (test hook)."""
        worst: tuple[float, int, int] | None = None
        for path in {self._config.ledger_dir, self._config.journal_dir}:
            sv = os.statvfs(path)
            total = sv.f_blocks * sv.f_frsize
            free = sv.f_bavail * sv.f_frsize
            if self._config.disk_free_bytes_override > 0:
                free = min(self._config.disk_free_bytes_override, total)
            used = 1.0 - free / total if total > 0 else 1.0
            if worst is None or used > worst[0]:
                worst = (used, free, total)
        assert worst is not None
        return worst

    @property
    def journal_position(self) -> JournalPosition:
        """The journal position below which every record is applied in memory."""
        return self._applied_mark

    # --- checkpoint ----------------------------------------------------------------------
    async def checkpoint(self) -> None:
        """Flush the write cache to the entry log, persist index and ledger state with the
        journal mark, then drop journal files (and entry logs GC emptied) below it."""
        if self._failed is not None:
            raise BookieUnavailableError(f"bookie store failed: {self._failed!r}") from self._failed
        if self._io_lock is None:
            raise BookieUnavailableError("bookie store is not started")
        await self._checkpoint_locked()

    async def _checkpoint_locked(self) -> None:
        # Shielded: a cancelled caller must not abandon a checkpoint between taking the write
        # cache and indexing it (the entries would be dropped from the next checkpoint).
        await asyncio.shield(self._do_checkpoint())

    async def _do_checkpoint(self) -> None:
        assert self._io_lock is not None
        try:
            await self._do_checkpoint_locked()
        except BaseException as e:
            if not isinstance(e, asyncio.CancelledError):
                self._fail(e)
            raise

    async def _do_checkpoint_locked(self) -> None:
        assert self._io_lock is not None
        async with self._io_lock:
            storage = self._storage
            started = time.monotonic()
            mark = self._applied_mark
            job = storage.take_flush(mark)
            await asyncio.to_thread(storage.write_flush, job)
            storage.finish_flush(job)
            blob, removals = storage.serialize(mark)
            await asyncio.to_thread(storage.persist, blob, mark)
            if removals:
                await asyncio.to_thread(storage.entry_logger.remove, removals)
                for log_id in removals:
                    storage.live_bytes.pop(log_id, None)
            await asyncio.to_thread(remove_journal_files_below, self._config.journal_dir,
                                    mark.file_id)
            self.checkpoints_done += 1
            if self._adds_waiting:
                self._take_waiting_adds()
            log.debug("checkpoint done mark=%s entries_flushed=%d index_bytes=%d seconds=%.3f",
                      mark, len(job.items), len(blob), time.monotonic() - started)

    async def _flush_write_cache(self) -> None:
        """Write the write cache to the entry log and index it, without persisting the index or
        moving the checkpoint mark. Small, frequent flushes keep each burst of entry-log writes
        (and its fsync, which competes with the journal's fdatasync on a shared disk) short;
        after a crash the journal replay from the last mark re-adds these entries (idempotent)."""
        assert self._io_lock is not None

        async def flush() -> None:
            try:
                async with self._io_lock:
                    storage = self._storage
                    job = storage.take_flush(self._applied_mark)
                    if job.items:
                        await asyncio.to_thread(storage.write_flush, job)
                        storage.finish_flush(job)
                        if self._adds_waiting:
                            self._take_waiting_adds()
            except BaseException as e:
                if not isinstance(e, asyncio.CancelledError):
                    self._fail(e)
                raise

        # shielded for the same reason as checkpoints: never abandon a taken flush job
        await asyncio.shield(flush())

    async def _checkpoint_loop(self) -> None:
        checkpoint_s = self._config.checkpoint_interval_ms / 1000.0
        flush_s = min(self._config.write_cache_flush_interval_ms / 1000.0, checkpoint_s)
        wanted = self._checkpoint_wanted
        assert wanted is not None
        last_checkpoint = time.monotonic()
        while True:
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation
                async with asyncio.timeout(flush_s):
                    await wanted.wait()
            except TimeoutError:
                pass
            wanted.clear()
            if time.monotonic() - last_checkpoint >= checkpoint_s:
                await self._checkpoint_locked()
                last_checkpoint = time.monotonic()
            else:
                await self._flush_write_cache()

    # --- garbage collection --------------------------------------------------------------
    async def _gc_loop(self) -> None:
        interval_s = self._config.gc_interval_ms / 1000.0
        while True:
            await asyncio.sleep(interval_s)
            await self.gc_once()

    async def gc_once(self) -> int:
        """One GC pass: remove entry logs without live entries, compact those less live than
        ``compaction_live_ratio_max`` (copy out at most ``compaction_bytes_per_s_max``), then
        checkpoint so the old files can go. Returns the bytes reclaimed (net of copies)."""
        if self._io_lock is None:
            raise BookieUnavailableError("bookie store is not started")
        storage = self._storage
        cfg = self._config
        async with self._io_lock:
            usage = storage.log_usage()
            plan = plan_gc(usage, storage.entry_logger.current_id, cfg.compaction_live_ratio_max)
        if not plan.remove and not plan.compact:
            return 0
        freed = sum(usage[i].file_bytes for i in plan.remove)
        storage.pending_removals.extend(plan.remove)
        copied = 0
        for log_id in plan.compact:
            try:
                moved_bytes = await self._compact_log(log_id)
            except ChecksumError as e:
                log.error("compaction skipped a corrupt entry log log_id=%d error=%s", log_id, e)
                continue
            copied += moved_bytes
            freed += usage[log_id].file_bytes
            storage.pending_removals.append(log_id)
        await self._checkpoint_locked()
        log.info("gc done removed_logs=%s compacted_logs=%s bytes_copied=%d bytes_reclaimed=%d",
                 list(plan.remove), list(plan.compact), copied, freed - copied)
        return freed - copied

    async def _compact_log(self, log_id: int) -> int:
        storage = self._storage
        rate = self._config.compaction_bytes_per_s_max
        chunk_max = min(_COMPACTION_CHUNK_BYTES, rate)
        live = storage.live_entries_in(log_id)
        copied = 0
        i = 0
        while i < len(live):
            chunk = []
            nbytes = 0
            while i < len(live) and (not chunk or nbytes + live[i][3] <= chunk_max):
                chunk.append(live[i])
                nbytes += live[i][3]
                i += 1
            # shielded: a cancelled GC must not leave a thread appending to the entry log
            await asyncio.shield(self._copy_chunk(log_id, chunk))
            copied += nbytes
            await asyncio.sleep(nbytes / rate)
        log.info("entry log compacted log_id=%d entries=%d bytes_copied=%d", log_id, len(live), copied)
        return copied

    async def _copy_chunk(self, log_id: int, chunk: list) -> None:
        storage = self._storage
        async with self._io_lock:          # type: ignore[union-attr]
            records = await asyncio.to_thread(self._read_for_copy, log_id, chunk)
            locations = await asyncio.to_thread(storage.entry_logger.append,
                                                [(r,) for r in records])
            storage.relocate(chunk, locations)

    def _read_for_copy(self, log_id: int, chunk: list) -> list[bytes]:
        """Read and verify the raw records of a chunk (worker thread)."""
        logger = self._storage.entry_logger
        out = []
        for st, e, p, s in chunk:
            offset = p & LOG_OFFSET_MASK
            raw = logger.read_raw(log_id, offset, s)
            logger.decode(raw, 0, st.ledger_id, e, log_id, offset, s)   # raises ChecksumError
            out.append(raw)
        return out
