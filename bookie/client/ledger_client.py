"""The ledger client (shell): creates, writes, recovers, reads and deletes ledgers.

All protocol decisions are in the pure cores (write_core, recovery_core); this module executes
their actions (gRPC through BookieClientPool, compare-and-set through LedgerManager), feeds the
results back with the time and a random source, and turns confirmations into futures.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import time
from typing import Any, Callable, Sequence

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.client.actions import (AddOutcome, CloseDone, CloseFailed, ConfirmAdds, EntryData,
                                   FailAdds, LacOutcome, ReadOutcome, RecoveryDone, RecoveryFailed,
                                   SendAdd, SendAddRun, SendRead, SendReadLac, WriteMetadata)
from bookie.client.bookie_client import BookieClientPool
from bookie.client.ledger_manager import LedgerManager
from bookie.client.metadata import LedgerMetadata, LedgerState, validate_quorum
from bookie.client.placement import choose_ensemble
from bookie.client.reader import LedgerReader, read_lac, verify_entry
from bookie.client.recovery_core import LedgerRecoveryCore
from bookie.client.write_core import LedgerWriteCore, WriteCoreState
from bookie.transport import encode_add_entry
from pulsarlite.checksum import entry_checksum
from pulsarlite.config import LedgerClientConfig, zookeeper_auth
from pulsarlite.errors import (BookieUnavailableError, InvariantViolation, LedgerClosedError,
                               MetadataNotFoundError, MetadataVersionConflict, PulsarliteError)

log = logging.getLogger("pulsarlite.ledger_client")

TICK_INTERVAL_S = 0.1

# add_entries' callback: (context, first_entry_id, last_entry_id, None) once those entries of
# the run are confirmed, (context, first_entry_id, last_entry_id, error) if they failed; ranges
# in order, covering the run exactly once. ``context`` is what the caller gave add_entries with
# it (its own record of the run: no closure or functools.partial per run)
RunDone = Callable[[Any, int, int, "BaseException | None"], None]


# What waits for a run of entries: ``(first, last, done, context)``, ``first`` its first entry
# not completed yet (a plain tuple: one per add_entries call on the publish path)
_RunWaiter = tuple[int, int, RunDone, Any]


def _resolve(fut: asyncio.Future, first: int, last: int, error: BaseException | None) -> None:
    """add_async's RunDone: its future gets the entry id, or the error."""
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(first)

_OK = pb.OK
_ADD_OUTCOMES = {pb.OK: AddOutcome.OK, pb.FENCED: AddOutcome.FENCED, pb.READ_ONLY: AddOutcome.READ_ONLY,
                 pb.NO_SUCH_LEDGER: AddOutcome.NO_SUCH_LEDGER, pb.TOO_LARGE: AddOutcome.TOO_LARGE}


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class LedgerClient:
    def __init__(self, store, config: LedgerClientConfig, *, owns_store: bool,
                 rng: random.Random | None = None) -> None:
        self.store = store
        self.config = config
        self.ledger_manager = LedgerManager(store)
        self.pool = BookieClientPool(config)
        self.rng = rng or random.Random()
        self._owns_store = owns_store
        self.writable_bookies: list[str] = []
        self._watches: tuple = ()
        self._writers: set[LedgerWriter] = set()

    @classmethod
    async def connect(cls, config: LedgerClientConfig, *, store=None) -> "LedgerClient":
        """Connect to ZooKeeper (or share ``store``) and start watching the live bookies."""
        from pulsarlite.metadata import MetadataStore

        config.validate()
        owns = store is None
        if store is None:
            store = await MetadataStore.connect(config.zookeeper, session_timeout_ms=config.zk_session_timeout_ms,
                                                auth=zookeeper_auth(config))
        client = cls(store, config, owns_store=owns)

        def on_bookies(writable: list[str], readonly: list[str]) -> None:
            client.writable_bookies = writable

        client._watches = await client.ledger_manager.watch_bookies(on_bookies)
        client.writable_bookies = await client.ledger_manager.writable_bookies()
        return client

    async def close(self) -> None:
        for writer in list(self._writers):
            writer._stop_ticker()
        for w in self._watches:
            w.cancel()
        await self.pool.close()
        if self._owns_store:
            await self.store.close()

    # -- create / write --------------------------------------------------------------------
    async def create_ledger(self, ensemble_size: int, write_quorum: int, ack_quorum: int, *,
                            custom: dict[str, str] | None = None,
                            ledger_id: int | None = None) -> "LedgerWriter":
        """A new OPEN ledger; ``ledger_id``: one reserved before with :meth:`reserve_ledger_id`
        (so a caller can name it somewhere durable before it exists, as BookKeeper's createAdv
        with an id); MetadataExistsError if that id is taken."""
        validate_quorum(ensemble_size, write_quorum, ack_quorum)
        writable = self.writable_bookies or await self.ledger_manager.writable_bookies()
        ensemble = choose_ensemble(writable, ensemble_size, self.rng)
        if ledger_id is None:
            ledger_id = await self.ledger_manager.new_ledger_id()
        md = LedgerMetadata(ledger_id=ledger_id, ensemble_size=ensemble_size, write_quorum=write_quorum,
                            ack_quorum=ack_quorum, ensembles=((0, ensemble),),
                            ctime_ms=int(time.time() * 1000), custom=dict(custom or {}))
        version = await self.ledger_manager.create(md)
        log.info("ledger created ledger=%d ensemble=%s E=%d Qw=%d Qa=%d", ledger_id, ",".join(ensemble),
                 ensemble_size, write_quorum, ack_quorum)
        writer = LedgerWriter(self, md, version)
        self._writers.add(writer)
        return writer

    async def reserve_ledger_id(self) -> int:
        """An id never handed out before, for a later ``create_ledger(..., ledger_id=...)``."""
        return await self.ledger_manager.new_ledger_id()

    # -- open / recover / read ---------------------------------------------------------------
    async def open_ledger(self, ledger_id: int, *, recovery: bool) -> LedgerReader:
        """Open for reading. With ``recovery`` the ledger is fenced and closed at the last entry
        that could have been acknowledged (the writer, if alive, gets fenced); without, an open
        ledger is read up to its LAC and nobody is disturbed."""
        md, _ = await self.ledger_manager.read(ledger_id)
        if recovery and md.state is not LedgerState.CLOSED:
            md = await self.recover(ledger_id)
        lac = md.last_entry_id if md.is_closed else await read_lac(md, self.pool, fence=False)

        async def reload_metadata() -> LedgerMetadata:
            return (await self.ledger_manager.read(ledger_id))[0]

        return LedgerReader(md, self.pool, self.config, last_add_confirmed=lac, reload_metadata=reload_metadata)

    async def recover(self, ledger_id: int, *, fence_recovery_reads: bool = True) -> LedgerMetadata:
        """Fence and close ``ledger_id`` (idempotent; concurrent recoveries converge via CAS).
        Re-writes that fail on bookies of their write set replace those bookies with writable
        ones (the recovery core's ensemble change, up to ``ensemble_change_attempts_max`` per
        run); a run that cannot finish is retried on fresh metadata."""
        last_error: PulsarliteError | None = None
        for attempt in range(self.config.recovery_attempts_max):
            try:
                md, version = await self.ledger_manager.read(ledger_id)
                if md.is_closed:
                    return md
                if md.state is LedgerState.OPEN:
                    try:
                        target = md.with_state(LedgerState.IN_RECOVERY)
                        version = await self.ledger_manager.write(target, version)
                        md = target
                    except MetadataVersionConflict:
                        continue
                return await _RecoveryRun(self, md, version, fence_recovery_reads).run()
            except PulsarliteError as e:    # ZooKeeper trouble (outcome unknown) or bookies: read again
                if not e.retriable:
                    raise
                last_error = e
                log.warning("recovery attempt failed ledger=%d attempt=%d: %s", ledger_id, attempt + 1, e)
                await asyncio.sleep(min(0.1 * 2 ** attempt, 2.0))
        raise last_error or BookieUnavailableError(f"ledger {ledger_id}: recovery did not converge")

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete from every bookie that may hold entries, then the metadata. A bookie that is
        down keeps its copy until its garbage collector finds the metadata gone."""
        md, _ = await self.ledger_manager.read(ledger_id)
        results = await asyncio.gather(*(self.pool.get(b).delete_ledger(ledger_id) for b in md.all_bookies()),
                                       return_exceptions=True)
        failed = [b for b, r in zip(md.all_bookies(), results) if isinstance(r, BaseException)]
        if failed:
            log.warning("ledger delete: bookies unreachable ledger=%d bookies=%s", ledger_id, failed)
        await self.ledger_manager.delete(ledger_id)
        log.info("ledger deleted ledger=%d", ledger_id)


def _encode_entry(ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
    """One entry as an element of an AddRequest (with its checksum), encoded once for every
    bookie of its write set."""
    return encode_add_entry(ledger_id, entry_id, lac, length, payload,
                            entry_checksum(ledger_id, entry_id, lac, length, payload))


def _encoded_entry(ledger_id: int, a: SendAdd) -> bytes:
    """The entry of ``a`` as an element of an AddRequest."""
    return _encode_entry(ledger_id, a.entry_id, a.lac, a.length, a.payload)


class LedgerWriter:
    """An OPEN ledger this client writes. ``add`` returns once the entry is confirmed (Qa
    bookies fsynced it and every lower entry is confirmed)."""

    def __init__(self, client: LedgerClient, metadata: LedgerMetadata, version: int) -> None:
        self._client = client
        self._version = version
        self._core = LedgerWriteCore(metadata, add_timeout_ms=client.config.add_timeout_ms,
                                     ensemble_change_attempts_max=client.config.ensemble_change_attempts_max)
        self.ledger_id = metadata.ledger_id
        # what waits for the entries not completed yet, in entry order: a _RunWaiter per
        # add_entries call
        self._waiting: collections.deque = collections.deque()
        self._drained: asyncio.Future | None = None   # close(): set once nothing waits
        self._capacity = asyncio.Condition()
        self._close_future: asyncio.Future | None = None
        self._metadata_tasks: set[asyncio.Task] = set()
        self._add_callback = self._on_add_results  # one bound method: callbacks group by identity
        self._failed_bookies_logged: set[str] = set()
        self._ticker = asyncio.ensure_future(self._tick_loop())

    # -- properties ------------------------------------------------------------------------
    @property
    def metadata(self) -> LedgerMetadata:
        return self._core.metadata

    @property
    def last_add_confirmed(self) -> int:
        return self._core.lac

    @property
    def pending_count(self) -> int:
        return self._core.pending_count

    # -- API -------------------------------------------------------------------------------
    def add_entries(self, payloads: Sequence[bytes], done: "RunDone", context: Any) -> int:
        """The one add path: append ``payloads`` as consecutive entries (a single add is a run
        of one) and return the first entry id. ``done(context, first_entry_id, last_entry_id,
        error)`` runs from the loop, never from inside this call, for consecutive ranges of the
        run in entry order (together covering it once): ``error`` None once those entries are
        confirmed, else the failure. Each entry is encoded once and its bytes shared by the
        bookies that store it. Raises at once (nothing queued) if the ledger already failed or
        is closing."""
        first, actions = self._core.add(payloads, _now_ms())
        self._waiting.append((first, first + len(payloads) - 1, done, context))
        self._run(actions)
        return first

    def add_async(self, payload: bytes) -> asyncio.Future:
        """``add_entries`` of one payload, as a future of its entry id (resolved once it is
        confirmed). Raises at once like ``add_entries``."""
        fut = asyncio.get_running_loop().create_future()
        self.add_entries((payload,), _resolve, fut)
        return fut

    async def add(self, payload: bytes) -> int:
        """Add and wait for confirmation; waits first while pending_adds_max adds are in flight."""
        if self._core.pending_count >= self._client.config.pending_adds_max:
            async with self._capacity:
                await self._capacity.wait_for(lambda: self._core.pending_count < self._client.config.pending_adds_max)
        return await self.add_async(payload)

    async def close(self) -> LedgerMetadata:
        """Wait for pending adds, then close the ledger at its LAC (CLOSED in the metadata)."""
        if self._close_future is None:
            while self._waiting:              # every add confirmed or failed first
                if self._drained is None or self._drained.done():
                    self._drained = asyncio.get_running_loop().create_future()
                await asyncio.shield(self._drained)
            self._close_future = asyncio.get_running_loop().create_future()
            self._run(self._core.close())
        try:
            return await asyncio.shield(self._close_future)
        finally:
            self._stop_ticker()

    # -- action execution --------------------------------------------------------------------
    def _run(self, actions) -> None:
        client = self._client
        built: bytes | None = None  # the SendAdds of one entry share one encoding and checksum
        built_entry = built_lac = -2
        for a in actions:
            kind = type(a)
            if kind is SendAddRun:
                self._send_run(a)
            elif kind is ConfirmAdds:
                self._confirm(a.last_entry_id)
            elif kind is SendAdd:
                if built is None or a.entry_id != built_entry or a.lac != built_lac:
                    built, built_entry, built_lac = _encoded_entry(self.ledger_id, a), a.entry_id, a.lac
                client.pool.get(a.bookie).send_add(a.entry_id, built, a.recovery, self._add_callback)
            elif isinstance(a, FailAdds):
                self._fail(a.first_entry_id, a.error)
            elif isinstance(a, WriteMetadata):
                task = asyncio.ensure_future(self._write_metadata(a.metadata))
                self._metadata_tasks.add(task)
                task.add_done_callback(self._metadata_tasks.discard)
            elif isinstance(a, CloseDone):
                log.info("ledger closed ledger=%d last_entry=%d length=%d", self.ledger_id,
                         a.metadata.last_entry_id, a.metadata.length)
                if self._close_future is not None and not self._close_future.done():
                    self._close_future.set_result(a.metadata)
            elif isinstance(a, CloseFailed):
                if self._close_future is not None and not self._close_future.done():
                    self._close_future.set_exception(a.error)
            else:
                raise InvariantViolation(f"write core emitted unknown action {a!r}")

    def _send_run(self, a: SendAddRun) -> None:
        """Encode each entry of the run once; each bookie gets its share in one call (one
        AddRequest, or a few for a long run: the bookie client's chunking)."""
        ledger_id = self.ledger_id
        first, lac, lengths, payloads, sends = a
        entry_ids = range(first, first + len(payloads))
        encoded = []
        for entry_id in entry_ids:               # _encode_entry, inline: once per entry
            length, payload = lengths[entry_id - first], payloads[entry_id - first]
            encoded.append(encode_add_entry(ledger_id, entry_id, lac, length, payload,
                                            entry_checksum(ledger_id, entry_id, lac, length, payload)))
        pool = self._client.pool
        callback = self._add_callback
        for bookie, offsets in sends:
            if offsets is None:
                pool.get(bookie).send_adds(entry_ids, encoded, False, callback)
            else:
                pool.get(bookie).send_adds([first + i for i in offsets], [encoded[i] for i in offsets], False,
                                           callback)

    def _on_add_results(self, bookie: str, results: list[tuple[int, int]]) -> None:
        """A bookie's answers to a batch of this ledger's adds."""
        core = self._core
        if core.state is WriteCoreState.CLOSED:
            return  # late answers (e.g. the third replica's) after close: nothing to decide
        if len(results) == 1:            # one entry per request (the paced case)
            entry_id, code = results[0]
            if code == _OK:
                # an OK for an entry already confirmed (the third replica's, past the ack
                # quorum) changes nothing in the core: on_add_acks would find it no longer
                # pending and _advance nothing new
                if entry_id > core.lac:
                    actions = core.on_add_acks(bookie, (entry_id,))
                    if actions:
                        self._run(actions)
                return
        ok = [entry_id for entry_id, code in results if code == _OK]
        if ok and len(ok) == len(results) and max(ok) <= core.lac:
            return                       # all OK, all confirmed already: as above
        if ok:
            self._run(core.on_add_acks(bookie, ok))
        if len(ok) == len(results):
            return
        client = self._client
        for entry_id, code in results:
            if code == pb.OK:
                continue
            outcome = _ADD_OUTCOMES.get(code, AddOutcome.ERROR)
            if bookie not in self._failed_bookies_logged:
                self._failed_bookies_logged.add(bookie)
                log.warning("add failed ledger=%d entry=%d bookie=%s code=%s", self.ledger_id, entry_id, bookie,
                            pb.StatusCode.Name(code) if code in pb.StatusCode.values() else code)
            self._run(core.on_add_result(bookie, entry_id, outcome, _now_ms(), client.writable_bookies, client.rng))

    def _confirm(self, last_entry_id: int) -> None:
        waiting = self._waiting
        while waiting:
            first, last, done, context = waiting[0]
            if first > last_entry_id:
                break
            if last <= last_entry_id:
                waiting.popleft()
                self._call_run_done(done, context, first, last, None)
            else:                        # part of the run: the rest waits
                waiting[0] = (last_entry_id + 1, last, done, context)
                self._call_run_done(done, context, first, last_entry_id, None)
                break
        self._after_completions()

    def _fail(self, first_entry_id: int, error: PulsarliteError) -> None:
        """Every add from ``first_entry_id`` on failed (FailAdds), in entry order."""
        waiting = self._waiting
        kept: list = []
        failed: list = []
        for w in waiting:
            first, last, done, context = w
            if last < first_entry_id:
                kept.append(w)
            elif first >= first_entry_id:
                failed.append(w)
            else:                        # the run straddles: its head still waits
                kept.append((first, first_entry_id - 1, done, context))
                failed.append((first_entry_id, last, done, context))
        waiting.clear()
        waiting.extend(kept)
        for first, last, done, context in failed:
            self._call_run_done(done, context, first, last, error)
        log.warning("adds failed ledger=%d from_entry=%d: %s", self.ledger_id, first_entry_id, error)
        self._after_completions()

    def _call_run_done(self, done: RunDone, context: Any, first: int, last: int,
                       error: BaseException | None) -> None:
        try:
            done(context, first, last, error)
        except Exception:        # as a Future's done callback: log, go on with the others
            log.exception("add callback failed ledger=%d entries=%d..%d", self.ledger_id, first, last)

    def _after_completions(self) -> None:
        if not self._waiting and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        if self._capacity._waiters:      # only when someone waits: keep the hot path cheap
            self._wake_capacity()

    def _wake_capacity(self) -> None:
        async def notify() -> None:
            async with self._capacity:
                self._capacity.notify_all()
        asyncio.ensure_future(notify())

    async def _write_metadata(self, md: LedgerMetadata) -> None:
        """CAS ``md``; the outcome always reaches the write core (written, conflict with what
        the store holds now, or the ledger gone), so that adds and a close waiting on it end."""
        client = self._client
        try:
            self._version = await client.ledger_manager.write(md, self._version)
            log.info("ledger metadata written ledger=%d state=%s ensembles=%s under_replicated=%s",
                     self.ledger_id, md.state.value, md.ensembles, md.under_replicated_bookies)
            actions = self._core.on_metadata_written(md, _now_ms(), client.writable_bookies, client.rng)
        except MetadataVersionConflict:
            actions = await self._metadata_conflict(wait_s=0.0)
        except MetadataNotFoundError:
            actions = self._core.on_metadata_gone()
        except PulsarliteError as e:
            # ZooKeeper trouble: read what is there and treat it as a conflict (re-decide)
            log.warning("metadata write failed ledger=%d: %s", self.ledger_id, e)
            actions = await self._metadata_conflict(wait_s=0.2)
        self._run(actions)

    async def _metadata_conflict(self, wait_s: float) -> list:
        """Re-read the metadata after a CAS that did not (or may not) apply and let the core
        re-decide: a conflict with what is stored, or the ledger gone (deleted by a client that
        recovered it). If the store cannot be read either, the core re-decides on what it knows."""
        client = self._client
        if wait_s:
            await asyncio.sleep(wait_s)
        try:
            current, self._version = await client.ledger_manager.read(self.ledger_id)
        except MetadataNotFoundError:
            log.warning("ledger metadata gone ledger=%d: recovered and deleted by another client", self.ledger_id)
            return self._core.on_metadata_gone()
        except PulsarliteError as e:
            log.warning("ledger metadata not readable after a failed write ledger=%d: %s", self.ledger_id, e)
            current = self._core.metadata
        return self._core.on_metadata_conflict(current, _now_ms(), client.writable_bookies, client.rng)

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL_S)
            self._run(self._core.on_tick(_now_ms(), self._client.writable_bookies, self._client.rng))

    def _stop_ticker(self) -> None:
        self._ticker.cancel()
        self._client._writers.discard(self)


class _RecoveryRun:
    """Drives one LedgerRecoveryCore to completion."""

    def __init__(self, client: LedgerClient, md: LedgerMetadata, version: int, fence_reads: bool) -> None:
        self._client = client
        self._md = md
        self._version = version
        self._core = LedgerRecoveryCore(
            md, fence_recovery_reads=fence_reads,
            ensemble_change_attempts_max=client.config.ensemble_change_attempts_max)
        self._result: asyncio.Future = asyncio.get_running_loop().create_future()
        self._tasks: set[asyncio.Task] = set()
        self._add_callback = self._on_add_results

    async def run(self) -> LedgerMetadata:
        log.info("ledger recovery started ledger=%d ensemble=%s", self._md.ledger_id, self._md.current_ensemble)
        self._execute(self._core.start())
        try:
            md = await asyncio.wait_for(asyncio.shield(self._result), self._client.config.add_timeout_ms / 1000)
        except asyncio.TimeoutError:
            raise BookieUnavailableError(f"ledger {self._md.ledger_id}: recovery timed out") from None
        finally:
            for t in self._tasks:
                t.cancel()
        log.info("ledger recovered ledger=%d last_entry=%d length=%d", md.ledger_id, md.last_entry_id, md.length)
        return md

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _execute(self, actions) -> None:
        ledger_id = self._md.ledger_id
        for a in actions:
            if self._result.done():
                return
            if isinstance(a, SendReadLac):
                self._spawn(self._read_lac(a.bookie, a.fence))
            elif isinstance(a, SendRead):
                self._spawn(self._read(a.bookie, a.entry_id, a.fence))
            elif isinstance(a, SendAdd):
                self._client.pool.get(a.bookie).send_add(a.entry_id, _encoded_entry(ledger_id, a), True,
                                                         self._add_callback)
            elif isinstance(a, WriteMetadata):
                self._spawn(self._write_metadata(a.metadata))
            elif isinstance(a, RecoveryDone):
                self._result.set_result(a.metadata)
            elif isinstance(a, RecoveryFailed):
                self._result.set_exception(a.error)
            else:
                raise InvariantViolation(f"recovery core emitted unknown action {a!r}")

    async def _read_lac(self, bookie: str, fence: bool) -> None:
        try:
            r = await self._client.pool.get(bookie).read_lac(self._md.ledger_id, fence=fence)
            outcome = {pb.OK: LacOutcome.OK, pb.NO_SUCH_LEDGER: LacOutcome.NO_SUCH_LEDGER}.get(r.code, LacOutcome.ERROR)
            lac = r.lac
        except BookieUnavailableError:
            outcome, lac = LacOutcome.ERROR, -1
        self._execute(self._core.on_read_lac(bookie, outcome, lac))

    async def _read(self, bookie: str, entry_id: int, fence: bool) -> None:
        ledger_id = self._md.ledger_id
        entry = None
        try:
            r = await self._client.pool.get(bookie).read(ledger_id, entry_id, entry_id, fence=fence)
            if r.code == pb.OK and r.entries and verify_entry(r.entries[0], ledger_id, entry_id):
                e = r.entries[0]
                outcome, entry = ReadOutcome.FOUND, EntryData(e.entry_id, e.lac, e.length, e.payload)
            elif r.code == pb.NO_SUCH_ENTRY:
                outcome = ReadOutcome.NO_SUCH_ENTRY
            elif r.code == pb.NO_SUCH_LEDGER:
                outcome = ReadOutcome.NO_SUCH_LEDGER
            else:
                outcome = ReadOutcome.ERROR
        except BookieUnavailableError:
            outcome = ReadOutcome.ERROR
        self._execute(self._core.on_read(bookie, entry_id, outcome, entry))

    def _on_add_results(self, bookie: str, results: list[tuple[int, int]]) -> None:
        client = self._client
        for entry_id, code in results:
            self._execute(self._core.on_add_result(bookie, entry_id, _ADD_OUTCOMES.get(code, AddOutcome.ERROR),
                                                   client.writable_bookies, client.rng))

    async def _write_metadata(self, md: LedgerMetadata) -> None:
        """CAS ``md`` (the close, or an ensemble change) at the version this run holds.
        ZooKeeper trouble, where the outcome is unknown, ends this run at once with the error:
        ``recover`` reads the metadata again and retries (a close that did apply is then found
        CLOSED, an ensemble change that did is taken over by the next run), instead of waiting
        out the run's timeout."""
        client = self._client
        lm = client.ledger_manager
        change = self._core.ensemble_change if md.state is LedgerState.IN_RECOVERY else None
        try:
            try:
                self._version = await lm.write(md, self._version)
                if change is not None:
                    first, replaced = change
                    log.info("ledger recovery ensemble change ledger=%d replaced=%s by=%s from_entry=%d",
                             md.ledger_id, ",".join(replaced), ",".join(replaced.values()), first)
                actions = self._core.on_metadata_written(md, client.writable_bookies, client.rng)
            except MetadataVersionConflict:
                current, self._version = await lm.read(md.ledger_id)
                actions = self._core.on_metadata_conflict(current, client.writable_bookies, client.rng)
        except PulsarliteError as e:
            log.warning("recovery metadata write failed ledger=%d: %s", md.ledger_id, e)
            if not self._result.done():
                self._result.set_exception(e)
            return
        self._execute(actions)


__all__ = ["LedgerClient", "LedgerWriter", "LedgerReader", "LedgerClosedError"]
