"""The replication worker (shell): finds marked ledgers and executes, against ZooKeeper and the
real bookies (a LedgerClient's connections), the actions of the pure cores: ``LedgerRepair``
(the pass over one ledger: lock, mark, plan, record, unmark) and ``FragmentCopy`` (one
fragment's copy). The decisions are theirs (and simulated in tests/sim/autorecovery_sim.py);
this module only does I/O, throttling and timeouts.

Protocol, per marked ledger (at most ``ledgers_concurrent_max`` at once):

1. Take /ledgers/underreplication/locks/urL<id> (ephemeral; another worker holding it: skip).
2. Read the mark (and its version) and the ledger's metadata. No metadata: the ledger was
   deleted; the mark goes.
3. Plan (``plan_repairs``); copy each fragment (``FragmentCopy``: CRC-checked reads from the
   survivors, writes with the recovery flag to the replacement, throttled in bytes/s); once a
   fragment's entries are all acknowledged, CAS ``apply_repair`` on freshly read metadata (a
   version conflict re-reads and re-applies; a ``RepairConflict`` re-plans the ledger).
4. When the metadata names none of the mark's bookies any more, delete the mark at the
   version read in 2 (a mark the auditor extended meanwhile stays, and is taken again).
   Otherwise (an open ledger's last fragment, no replacement, a failed copy) the mark stays and
   the ledger is retried after a back-off that doubles up to ``retry_delay_ms_max``.
5. Release the lock (also on any error; a crashed worker's lock goes with its session).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.autorecovery.replication_core import (CopyDone, CopyFailed, CopyFragment, FragmentBlocked,
                                                  FragmentCopy, FragmentRecorded, FragmentRepair,
                                                  LedgerRepair, ReadEntry, ReadLedger, ReadMark,
                                                  ReadRange, ReleaseLock, RepairFinished,
                                                  ReplicaRejected, StoredEntry, TakeLock, Throttle,
                                                  Unmark, WriteEntry, WriteLedger, next_retry_delay_ms)
from bookie.autorecovery.racks import read_racks
from bookie.autorecovery.urmanager import UnderReplicationManager
from bookie.transport import encode_add_entry
from pulsarlite.errors import (BookieUnavailableError, MetadataNotFoundError, MetadataVersionConflict,
                               PulsarliteError)
from pulsarlite.metadata import SessionState

log = logging.getLogger("pulsarlite.autorecovery")

CAS_ATTEMPTS_MAX = 10
REPLANS_MAX = 5


def _now_ms() -> float:
    return time.monotonic() * 1000


class ReplicationWorker:
    def __init__(self, ledger_client, worker_id: str, *, poll_interval_ms: int, entries_in_flight_max: int,
                 bytes_per_s_max: int, ledgers_concurrent_max: int, retry_delay_ms_max: int,
                 copy_timeout_ms: int, read_run_entries_max: int = 16,
                 rng: random.Random | None = None, racks: dict[str, str] | None = None,
                 metrics=None) -> None:
        self.metrics = metrics       # a bookie.metrics.BookieMetrics, or None
        self.racks = racks if racks is not None else {}     # bookie id -> rack (kept current by the service)
        self.read_run_entries_max = read_run_entries_max
        self.client = ledger_client
        self.worker_id = worker_id
        self.urm = UnderReplicationManager(ledger_client.store)
        self.poll_interval_ms = poll_interval_ms
        self.window = entries_in_flight_max
        self.throttle = Throttle(bytes_per_s_max)
        self.concurrent_max = ledgers_concurrent_max
        self.retry_delay_ms_max = retry_delay_ms_max
        self.copy_timeout_s = copy_timeout_ms / 1000
        self.rng = rng or random.Random()
        self._busy: dict[int, asyncio.Task] = {}
        self._lock_sessions: dict[int, int | None] = {}           # ledger -> session its lock is on
        self._retry_at_ms: dict[int, tuple[float, float]] = {}   # ledger -> (when, last delay)
        # what this worker did (tests and `autorecovery status`)
        self.fragments_repaired = 0
        self.entries_copied = 0
        self.bytes_copied = 0
        self.ledgers_repaired = 0

    def on_session_state(self, state: SessionState) -> None:
        """LOST (the session expired): its ephemeral locks are gone and another worker may hold
        a ledger now, so every repair under way is abandoned (each is retried later under a new
        lock; a copy already acknowledged is simply done again). SUSPENDED is not enough: the
        session, and so the locks, may still be ours. Simulated: tests/sim/autorecovery_sim.py
        (worker pauses past the session timeout)."""
        if state is SessionState.LOST and self._busy:
            log.warning("zookeeper session lost: repairs abandoned worker=%s ledgers=%s", self.worker_id,
                        ",".join(str(lid) for lid in sorted(self._busy)))
            for task in list(self._busy.values()):
                task.cancel()

    async def run(self) -> None:
        """Until cancelled: poll the marks, repair what is due."""
        store = self.client.store
        store.add_session_listener(self.on_session_state)
        try:
            while True:
                try:
                    await self.poll_once()
                except PulsarliteError as e:
                    log.warning("replication poll failed worker=%s: %s", self.worker_id, e)
                except Exception:       # a bug: logged loudly, the worker keeps serving
                    log.exception("replication poll crashed worker=%s", self.worker_id)
                await asyncio.sleep(self.poll_interval_ms / 1000)
        finally:
            store.remove_session_listener(self.on_session_state)
            tasks = list(self._busy.values())
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def poll_once(self) -> list[asyncio.Task]:
        """Start repairs of the due marked ledgers (up to the concurrency bound)."""
        started = []
        now = _now_ms()
        marked = await self.urm.list_marked()
        if marked:
            self.racks = await read_racks(self.client.store)
        for lid in list(self._retry_at_ms):
            if lid not in marked:
                del self._retry_at_ms[lid]
        for lid in marked:
            if len(self._busy) >= self.concurrent_max:
                break
            if lid in self._busy or self._retry_at_ms.get(lid, (0, 0))[0] > now:
                continue
            task = asyncio.ensure_future(self._guarded(lid))
            self._busy[lid] = task
            task.add_done_callback(lambda _t, lid=lid: self._busy.pop(lid, None))
            started.append(task)
        return started

    async def _guarded(self, lid: int) -> bool:
        try:
            done = await self.repair_ledger(lid)
        except asyncio.CancelledError:
            raise
        except Exception as e:      # a failure of one ledger never ends the worker
            log.warning("ledger repair failed ledger=%d worker=%s: %r", lid, self.worker_id, e)
            done = False
        if done:
            self._retry_at_ms.pop(lid, None)
        else:
            _, last = self._retry_at_ms.get(lid, (0, 0))
            delay = next_retry_delay_ms(last, self.poll_interval_ms, self.retry_delay_ms_max)
            self._retry_at_ms[lid] = (_now_ms() + delay, delay)
        return done

    async def repair_ledger(self, lid: int) -> bool:
        """One pass over ``lid``: the pure ``LedgerRepair`` decides (lock, mark, plan, copy,
        record, unmark); this executes its actions one at a time. True: nothing left to do
        (mark deleted, or locked by another worker: done for this pass)."""
        core = LedgerRepair(lid, self.rng, replans_max=REPLANS_MAX, cas_attempts_max=CAS_ATTEMPTS_MAX)
        pending = collections.deque(core.start())
        try:
            while pending:
                a = pending.popleft()
                try:
                    pending.extend(await self._execute(core, a))
                except PulsarliteError as e:
                    pending.extend(core.on_error(f"{type(a).__name__} failed: {e}"))
                if isinstance(a, RepairFinished):
                    return a.done
            raise RuntimeError(f"ledger {lid}: repair ended without finishing")
        finally:
            if core.locked:          # an exception or cancellation mid-pass
                try:
                    await self.urm.unlock(lid, self._lock_sessions.get(lid))
                except PulsarliteError as e:
                    log.warning("could not release lock ledger=%d: %s (its session's end will)", lid, e)
            self._lock_sessions.pop(lid, None)

    async def _execute(self, core: LedgerRepair, a) -> list:
        lid = core.ledger_id
        lm = self.client.ledger_manager
        if isinstance(a, TakeLock):
            self._lock_sessions[lid] = self.client.store.session_id    # the session the lock is taken on
            taken = await self.urm.try_lock(lid, self.worker_id)
            if not taken:
                log.debug("ledger locked by another worker ledger=%d worker=%s", lid, self.worker_id)
            return core.on_lock(taken)
        if isinstance(a, ReadMark):
            got = await self.urm.read_mark(lid)
            return core.on_mark(*(got if got is not None else (None, -1)))
        if isinstance(a, ReadLedger):
            try:
                md, version = await lm.read(lid)
            except MetadataNotFoundError:
                md, version = None, -1
            writable = list(self.client.writable_bookies)
            readable = writable + await lm.readonly_bookies()
            return core.on_ledger(md, version, writable, self.racks or None, readable)
        if isinstance(a, CopyFragment):
            ok, nbytes, replacement_failed = await self._copy(a.repair)
            return core.on_copied(ok, nbytes, replacement_failed)
        if isinstance(a, WriteLedger):
            try:
                await lm.write(a.metadata, a.version)
            except MetadataVersionConflict:
                return core.on_written(False)
            return core.on_written(True)
        if isinstance(a, Unmark):
            return core.on_unmarked(await self.urm.unmark(lid, a.version))
        if isinstance(a, ReleaseLock):
            try:
                await self.urm.unlock(lid, self._lock_sessions.get(lid))
            except PulsarliteError as e:
                log.warning("could not release lock ledger=%d: %s (its session's end will)", lid, e)
            return []
        if isinstance(a, FragmentBlocked):
            b = a.blocked
            log.warning("fragment not repairable now ledger=%d fragment=%d bookie=%s reason=%s",
                        lid, b.fragment_first, b.lost_bookie, b.reason)
        elif isinstance(a, FragmentRecorded):
            self.fragments_repaired += 1
            self.entries_copied += len(a.repair.entries)
            self.bytes_copied += a.bytes_copied
            if self.metrics is not None:
                self.metrics.fragment_replicated(len(a.repair.entries), a.bytes_copied)
            log.info("fragment re-replicated %s worker=%s", a.repair.describe(), self.worker_id)
        elif isinstance(a, RepairFinished):
            if a.repaired:
                self.ledgers_repaired += 1
                under_replicated_ms = max(0, int(time.time() * 1000) - a.mark_ctime_ms)
                if self.metrics is not None:
                    self.metrics.ledger_replicated(under_replicated_ms)
                log.info("ledger fully replicated: mark removed ledger=%d worker=%s under_replicated_ms=%d",
                         lid, self.worker_id, under_replicated_ms)
            elif not a.done:
                log.info("ledger still under-replicated ledger=%d worker=%s reason=%s", lid,
                         self.worker_id, a.reason)
        return []

    async def _copy(self, repair: FragmentRepair) -> tuple[bool, int, bool]:
        core = FragmentCopy(repair, self.window, self.read_run_entries_max)
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future = loop.create_future()
        tasks: set[asyncio.Task] = set()

        def execute(actions: list) -> None:
            writes: list[WriteEntry] = []
            for a in actions:
                if isinstance(a, ReadRange):
                    spawn(self._read_range(core, a, execute))
                elif isinstance(a, ReadEntry):
                    spawn(self._read(core, a, execute))
                elif isinstance(a, WriteEntry):
                    writes.append(a)
                elif isinstance(a, ReplicaRejected):
                    log.warning("replica not used ledger=%d entry=%d bookie=%s reason=%s",
                                repair.ledger_id, a.entry_id, a.bookie, a.reason)
                elif isinstance(a, (CopyDone, CopyFailed)) and not outcome.done():
                    outcome.set_result(a)
            if writes:       # one run of adds to the replacement, one task for all of them
                spawn(self._write(core, writes, execute))

        def spawn(coro) -> None:
            t = asyncio.ensure_future(coro)
            tasks.add(t)
            t.add_done_callback(finished)

        def finished(t: asyncio.Task) -> None:
            tasks.discard(t)
            if not t.cancelled() and t.exception() is not None and not outcome.done():
                outcome.set_exception(t.exception())

        log.info("fragment copy starting %s worker=%s", repair.describe(), self.worker_id)
        try:
            execute(core.start())
            result = await outcome
        finally:
            for t in list(tasks):
                t.cancel()
        if isinstance(result, CopyFailed):
            log.warning("fragment copy failed %s reason=%s", repair.describe(), result.reason)
            return False, 0, result.replacement_failed
        return True, result.bytes_copied, False

    async def _read(self, core: FragmentCopy, a: ReadEntry, execute) -> None:
        lid = core.repair.ledger_id
        entry, problem = None, ""
        try:
            resp = await asyncio.wait_for(self.client.pool.get(a.bookie).read(lid, a.entry_id, a.entry_id),
                                          self.copy_timeout_s)
            if resp.code == pb.OK and resp.entries:
                e = resp.entries[0]
                entry = StoredEntry(e.ledger_id, e.entry_id, e.lac, e.length, bytes(e.payload), e.checksum)
            else:
                problem = pb.StatusCode.Name(resp.code) if resp.code != pb.OK else "empty reply"
        except (BookieUnavailableError, asyncio.TimeoutError) as e:
            problem = str(e) or "timeout"
        execute(core.on_read(a.entry_id, a.bookie, entry, problem))

    async def _read_range(self, core: FragmentCopy, a: ReadRange, execute) -> None:
        lid = core.repair.ledger_id
        entries, problem = None, ""
        try:
            resp = await asyncio.wait_for(self.client.pool.get(a.bookie).read(lid, a.first, a.last),
                                          self.copy_timeout_s)
            if resp.code == pb.OK:
                entries = [StoredEntry(e.ledger_id, e.entry_id, e.lac, e.length, bytes(e.payload), e.checksum)
                           for e in resp.entries]
            elif resp.code in (pb.NO_SUCH_ENTRY, pb.CHECKSUM_MISMATCH):
                entries, problem = [], pb.StatusCode.Name(resp.code)   # the first one: next replica
            else:
                problem = pb.StatusCode.Name(resp.code)                 # no ledger, unavailable, ...
        except (BookieUnavailableError, asyncio.TimeoutError) as e:
            problem = str(e) or "timeout"
        execute(core.on_read_range(a.first, a.last, a.bookie, entries, problem))

    async def _write(self, core: FragmentCopy, writes: list[WriteEntry], execute) -> None:
        """Send a run of entries to the replacement (throttled; the recovery flag), and feed
        each answer to the core as it comes; entries unanswered after the copy timeout fail."""
        delay_ms = self.throttle.delay_ms(sum(len(w.entry.payload) for w in writes), _now_ms())
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        waiting = {w.entry.entry_id: w.entry for w in writes}
        all_answered = asyncio.get_running_loop().create_future()

        def answer(entry_id: int, code: int) -> None:
            entry = waiting.pop(entry_id, None)
            if entry is None:
                return
            name = pb.StatusCode.Name(code) if code in pb.StatusCode.values() else str(code)
            execute(core.on_written(entry, code == pb.OK, name))
            if not waiting and not all_answered.done():
                all_answered.set_result(None)

        def on_results(_bookie: str, results: list[tuple[int, int]]) -> None:
            for entry_id, code in results:
                answer(entry_id, code)

        entries = [w.entry for w in writes]
        self.client.pool.get(writes[0].bookie).send_adds(
            [e.entry_id for e in entries],
            [encode_add_entry(e.ledger_id, e.entry_id, e.lac, e.length, e.payload, e.checksum) for e in entries],
            True, on_results)
        try:
            await asyncio.wait_for(all_answered, self.copy_timeout_s)
        except asyncio.TimeoutError:
            for entry_id in list(waiting):
                answer(entry_id, pb.UNAVAILABLE)
