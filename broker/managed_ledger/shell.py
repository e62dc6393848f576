"""The managed ledger (asyncio shell): executes the core's actions with the ledger client and
the metadata store, and feeds the results back (docs/architecture.md#style: pure core, thin shell).

Open (a new owner, docs/protocol.md#managed-ledger): read the list; fence and recover every ledger
that is not CLOSED (``LedgerClient.recover``) and record its final entries/bytes (empty ones leave
the list and are deleted); create a new ledger; CAS the list. Any other writer of those ledgers is
fenced from then on: its adds fail with LedgerFencedError and it goes FENCED.

Rollover (triggered by the core: entries, bytes, age, or a retriable add failure): adds issued
meanwhile are **queued** in the core; the old ledger drains (every add in flight is confirmed or
failed) and is closed at its LAC, while the next ledger is created in parallel; then one CAS
writes [old CLOSED with its stats, new OPEN]; then the queued adds go to the new ledger. So
confirmations are in order across ledgers and a rollover never loses or reorders adds. A crash
between "create" and "CAS" leaves an orphan ledger (never in any list; like Pulsar).

Failures:
- LedgerFencedError from an add or close, a CAS that finds the list changed by someone else
  (version conflict that was not our own retried write), or the list deleted: FENCED. Every
  pending and later add fails with ManagedLedgerFencedError (not retriable): drop ownership.
- A retriable add failure (NotEnoughBookies, timeout): that add and every later unconfirmed add
  fail with a retriable error (the producer re-sends, as with BookKeeper/Pulsar), the ledger is
  closed at its LAC (so adds reported failed are not in the log) and we roll to a new ledger.
- A rollover or close that cannot finish (ZooKeeper or bookies unavailable beyond the bounded
  retries): FAILED; adds fail with a retriable ManagedLedgerError; close and reopen (the reopen
  recovers whatever was left open).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections import OrderedDict
from typing import Any, Awaitable, Callable, Sequence

from bookie.client.ledger_client import LedgerClient, LedgerWriter
from bookie.client.metadata import LedgerMetadata
from bookie.client.reader import LedgerReader
from broker.managed_ledger.config import ManagedLedgerConfig
from broker.managed_ledger.core import (CompleteAdds, FailAdd, LedgerInfo, LedgerInfoState,
                                        ManagedLedgerClosedError, ManagedLedgerCore, ManagedLedgerError,
                                        ManagedLedgerFencedError, ManagedLedgerMetadata, ManagedLedgerState,
                                        OffloadRecord, OffloadState, Position, RolloverPolicy, StartRollover,
                                        WriteEntries, ledger_ranges)
from broker.managed_ledger.store import ManagedLedgerStore
from pulsarlite.errors import (InvariantViolation, LedgerFencedError, MetadataError, MetadataNotFoundError,
                               MetadataVersionConflict, PulsarliteError, check)
from pulsarlite.ledger_list import encode
from pulsarlite.metadata import MetadataExistsError, MetadataStore
from pulsarlite.metadata_layout import check_name

log = logging.getLogger("pulsarlite.managed_ledger")

Clock = Callable[[], int]
PublishTimeOf = Callable[[bytes], "int | None"]
TierReader = Callable[[LedgerInfo, int, int], Awaitable[list[tuple[int, bytes]]]]


OffloadDeleter = Callable[[int, str], Awaitable[None]]
WriteGuard = Callable[[], bool]


def _always_owned() -> bool:
    return True
# add_entries' callback: (context, first_offset, last_offset, first_position, None) once the
# adds at those offsets of the run are confirmed (at consecutive entries from first_position),
# or (context, first_offset, last_offset, None, error) if they failed; in order, every offset
# exactly once. ``context`` is what the caller gave add_entries with it (its own record of the
# run: no closure or functools.partial per run)
RunAddDone = Callable[[Any, int, int, "Position | None", "BaseException | None"], None]


# One add_entries call, while any of its adds is pending: ``(first_add_id, payloads, done,
# context)``: its adds (ids ``first_add_id ..``), their payloads, whom to tell and with what (a
# plain tuple: one per call on the publish path)
_AddRun = tuple[int, Sequence[bytes], RunAddDone, Any]


def _resolve(fut: asyncio.Future, first: int, last: int, position: Position | None,
             error: BaseException | None) -> None:
    """add_async's RunAddDone: its future gets the position, or the error."""
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(position)

TRIMMED_PROPERTY = "pulsarlite.trimmed"     # list property: ledgers out of the list, deletion pending


def _encode_trimmed(pending: dict[int, "str | None"]) -> str:
    return json.dumps({str(k): v for k, v in sorted(pending.items())}, sort_keys=True)


def _decode_trimmed(raw: "str | None") -> dict[int, "str | None"]:
    if not raw:
        return {}
    try:
        return {int(k): (None if v is None else str(v)) for k, v in json.loads(raw).items()}
    except (ValueError, AttributeError, TypeError):
        log.warning("ignoring a malformed %s property: %r", TRIMMED_PROPERTY, raw[:200])
        return {}


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class _OpenRaceLost(Exception):
    """The list changed between our read and our CAS while opening: read and recover again."""


class ManagedLedger:
    """A topic's storage. Create with ``await ManagedLedger.open(...)``; use from one loop."""

    def __init__(self, name: str, ledger_client: LedgerClient, store: ManagedLedgerStore,
                 config: ManagedLedgerConfig, clock: Clock, publish_time_of: PublishTimeOf | None,
                 write_guard: "WriteGuard | None" = None) -> None:
        self.name = name
        # whether this broker still owns the topic: checked before every write of the list and
        # before an open recovers anything (only the owner writes its managed ledger's metadata)
        self._owned: WriteGuard = write_guard or _always_owned
        self._client = ledger_client
        self._store = store
        self._config = config
        self._clock = clock
        self._publish_time_of = publish_time_of
        self._core = ManagedLedgerCore(
            name, RolloverPolicy(config.rollover_entries_max, config.rollover_bytes_max, config.rollover_age_ms_max,
                                 config.rollover_publish_period_ms),
            pending_adds_max=config.pending_adds_max)
        self._version = -1
        self._writer: LedgerWriter | None = None
        # add id -> the _AddRun it belongs to, until it is completed or failed
        self._runs: dict[int, _AddRun] = {}
        self._capacity_waiters: list[asyncio.Future] = []
        self._in_add = False
        self._rollover_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._ticker: asyncio.Task | None = None
        self._readers: OrderedDict[int, LedgerReader] = OrderedDict()
        self._close_lock = asyncio.Lock()
        # serialises the list writes that may run concurrently (rollover, offload updates)
        self._metadata_lock = asyncio.Lock()
        # set by the offloader: reads entries of offloaded ledgers from the tier
        # (``await tier_reader(ledger_info, first_entry, last_entry) -> [(entry_id, bytes)]``)
        self.tier_reader: TierReader | None = None
        # called with the id of the ledger just closed by a rollover (offload trigger)
        self.rollover_listeners: list[Callable[[int], None]] = []
        # called, before any queued add goes to the next ledger, with the entries a rollover
        # found in the closed ledger beyond those confirmed: adds that failed back to their
        # callers, kept by the recovery that closed the ledger (``[(Position, bytes)]``; the
        # topic's deduplication learns them, else the producers' resends are stored twice)
        self.kept_listeners: list[Callable[[list[tuple[Position, bytes]]], None]] = []
        # called instead when those entries could not be read (``(first, last)`` positions): the
        # topic's deduplication cannot learn them, so its snapshots must not claim to cover them
        self.kept_unread_listeners: list[Callable[[Position, Position], None]] = []
        # awaited by delete() once closed as the owner, before any ledger goes (tier objects)
        self.before_delete: list[Callable[[], Awaitable[object]]] = []

    # -- open ------------------------------------------------------------------------------------
    @classmethod
    async def open(cls, name: str, *, ledger_client: LedgerClient, store: MetadataStore | ManagedLedgerStore,
                   config: ManagedLedgerConfig | None = None, clock: Clock | None = None,
                   publish_time_of: PublishTimeOf | None = None,
                   write_guard: "WriteGuard | None" = None) -> "ManagedLedger":
        """Open (creating if absent) the managed ledger ``tenant/namespace/persistent/topic``,
        fencing and recovering what a previous owner left open. ``clock`` gives wall-clock ms
        (ledger creation times, age rollover). ``publish_time_of(entry bytes)``, if given, is
        used to compute the publish-time bounds of ledgers recovered here (otherwise they are
        unknown: None). ``write_guard()`` says whether this broker still owns the topic: once it
        says no, the list is never written again (the managed ledger goes FENCED). Raises
        ManagedLedgerFencedError if another owner changed the list meanwhile, or ownership was
        lost."""
        check_name(name)
        config = (config or ManagedLedgerConfig()).validate()
        if isinstance(store, MetadataStore):
            store = ManagedLedgerStore(store)
        ml = cls(name, ledger_client, store, config, clock or wall_clock_ms, publish_time_of, write_guard)
        await ml._open()
        return ml

    async def _open(self) -> None:
        """Read, recover what is open, create ours, CAS. Losing the CAS to a concurrent writer
        of the list (the previous owner rolling over, or another opener) means there may be a
        newer open ledger: read again and recover that too (bounded)."""
        attempts = self._config.metadata_attempts_max
        for attempt in range(attempts):
            try:
                md, recovered, writer = await self._open_attempt()
                break
            except _OpenRaceLost as e:
                log.info("managed ledger %s: list changed while opening (attempt %d): %s", self.name,
                         attempt + 1, e)
                await asyncio.sleep(self._backoff_s(attempt))
            except BaseException as e:
                if isinstance(e, ManagedLedgerFencedError):
                    self._core.on_fenced(e)
                elif isinstance(e, PulsarliteError):
                    self._core.on_failed(e)
                raise
        else:
            error = ManagedLedgerFencedError(f"{self.name}: list kept changing while opening ({attempts} attempts)")
            self._core.on_fenced(error)
            raise error
        self._writer = writer
        self._run(self._core.on_opened(md))
        log.info("managed ledger %s opened: ledgers=%s current=%d", self.name, md.ledger_ids, writer.ledger_id)
        for ledger_id, info in recovered.items():
            if info.entries == 0:   # left the list: nothing refers to it any more
                await self._delete_ledger_quietly(ledger_id)
        self._ticker = self._spawn(self._tick_loop(), "ticker")

    async def _check_owned(self, what: str) -> None:
        """Before a write of the list: wait (bounded, as for ZooKeeper trouble) while this broker
        does not trust its ownership of the topic (a session suspended may come back); raise
        ManagedLedgerFencedError if it does not come back."""
        attempts = self._config.metadata_attempts_max
        for attempt in range(attempts):
            if self._owned():
                return
            if attempt + 1 < attempts:
                await asyncio.sleep(self._backoff_s(attempt))
        raise ManagedLedgerFencedError(f"{self.name}: this broker no longer owns the topic: {what}")

    async def _open_attempt(self) -> tuple[ManagedLedgerMetadata, dict[int, LedgerInfo], LedgerWriter]:
        await self._check_owned("not opened (nothing recovered)")
        got = await self._store.read(self.name)
        stored, version = (got[0], got[1]) if got is not None else (ManagedLedgerMetadata(), -1)
        recovered: dict[int, LedgerInfo] = {}
        last_ledger_id = stored.ledgers[-1].ledger_id if stored.ledgers else None
        for info in stored.open_ledgers:
            try:
                md = await self._client.recover(info.ledger_id)
            except MetadataNotFoundError:
                if info.ledger_id != last_ledger_id:
                    raise
                # the last ledger, created by an opener whose list write had an unknown outcome
                # and which then gave the ledger up: nothing was ever written to it (as Pulsar,
                # drop a last ledger that does not exist)
                log.warning("managed ledger %s: last ledger=%d has no metadata: dropped from the list as empty",
                            self.name, info.ledger_id)
                recovered[info.ledger_id] = LedgerInfo(info.ledger_id, LedgerInfoState.CLOSED, entries=0,
                                                       created_ms=info.created_ms, offload=info.offload)
                continue
            recovered[info.ledger_id] = await self._recovered_info(info, md)
            log.info("managed ledger %s: recovered ledger=%d entries=%d bytes=%d", self.name, info.ledger_id,
                     recovered[info.ledger_id].entries, recovered[info.ledger_id].size_bytes)
        writer = await self._create_ledger()
        try:
            md = self._core.open_metadata(stored, recovered, writer.ledger_id, self._clock())
            data = encode(md)
            if version < 0:
                await self._create_list(data)
            else:
                self._version = version
                try:
                    await self._cas(data)
                except ManagedLedgerFencedError as e:
                    raise _OpenRaceLost(str(e)) from None
        except BaseException:
            await self._give_up_created(writer)
            raise
        return md, recovered, writer

    async def _create_list(self, data: bytes) -> None:
        """Create the list (a new managed ledger). An answer lost after the create applied is
        found by reading back (the list names our new ledger: only we wrote these bytes);
        another's list means a concurrent opener won (_OpenRaceLost). Retries only ZooKeeper
        trouble, bounded."""
        attempts = self._config.metadata_attempts_max
        for attempt in range(attempts):
            await self._check_owned("the list is not created")
            try:
                self._version = await self._store.create(self.name, data)
                return
            except MetadataExistsError:
                pass
            except MetadataError as e:
                if not e.retriable or attempt + 1 >= attempts:
                    raise
                log.warning("managed ledger %s: list create failed (attempt %d): %s", self.name, attempt + 1, e)
                await asyncio.sleep(self._backoff_s(attempt))
            try:
                got = await self._store.read(self.name)
            except MetadataError:
                continue
            if got is not None:
                if got[2] == data:
                    self._version = got[1]
                    return
                raise _OpenRaceLost("created concurrently")
        raise ManagedLedgerError(f"{self.name}: ledger list not created after {attempts} attempts")

    async def _give_up_created(self, writer: LedgerWriter) -> None:
        """The open failed after ``writer``'s ledger was created: delete it, unless the list may
        name it (a list write whose outcome is unknown): then leave it for the next open, which
        recovers it as the list's (empty) last ledger and drops it."""
        try:
            got = await self._store.read(self.name)
            named = got is not None and writer.ledger_id in got[0].ledger_ids
        except PulsarliteError as e:
            log.warning("managed ledger %s: open failed and the list is not readable (%s): ledger=%d kept "
                        "for the next open", self.name, e, writer.ledger_id)
            named = True
        if named:
            await self._close_writer_quietly(writer)
            return
        await self._discard_ledger(writer)

    async def _recovered_info(self, info: LedgerInfo, md: LedgerMetadata) -> LedgerInfo:
        entries = md.last_entry_id + 1
        lo = hi = None
        if entries > 0 and self._publish_time_of is not None:
            reader = await self._client.open_ledger(info.ledger_id, recovery=False)
            times = []
            async for e in reader.iter_entries(0, md.last_entry_id):
                times.append(self._publish_time_of(e.payload))
            if times and all(t is not None for t in times):
                lo, hi = min(times), max(times)
        return LedgerInfo(info.ledger_id, LedgerInfoState.CLOSED, entries=entries, size_bytes=md.length,
                          min_publish_time_ms=lo, max_publish_time_ms=hi, created_ms=info.created_ms,
                          offload=info.offload)

    # -- properties ------------------------------------------------------------------------------
    @property
    def state(self) -> ManagedLedgerState:
        return self._core.state

    @property
    def last_confirmed_position(self) -> Position:
        """The position of the last confirmed entry ((current ledger, -1) if there is none)."""
        return self._core.last_confirmed

    @property
    def current_ledger_id(self) -> int | None:
        return self._core.current_ledger_id

    @property
    def pending_count(self) -> int:
        return self._core.pending_count

    def ledgers(self) -> tuple[LedgerInfo, ...]:
        """The ledger list with stats (the current ledger's are live: confirmed entries)."""
        return self._core.ledgers()

    @property
    def metadata(self) -> ManagedLedgerMetadata:
        """The list as last written to ZooKeeper."""
        return self._core.metadata

    # -- adds ------------------------------------------------------------------------------------
    def add_entries(self, payloads: Sequence[bytes], publish_times_ms: Sequence[int], done: RunAddDone,
                    context: Any) -> None:
        """The one add path: append ``payloads`` (``publish_times_ms`` for the ledger stats), in
        order (a single add is a run of one). ``done(context, ...)`` runs from the loop, never
        from inside this call, for consecutive ranges of offsets into the run, in order,
        covering it once (see RunAddDone): confirmed (at consecutive positions: a rollover
        inside the run splits it into ranges) or failed. Raises at once (nothing queued) if adds
        are refused: ManagedLedgerFencedError, -ClosedError, or a retriable ManagedLedgerError
        (FAILED, or the run does not fit under pending_adds_max)."""
        first_add_id, actions = self._core.add([len(p) for p in payloads], publish_times_ms, self._clock())
        run = (first_add_id, payloads, done, context)
        runs = self._runs
        add_id, end = first_add_id, first_add_id + len(payloads)
        while add_id < end:              # (not a range: its cost is the loop's for a run of one)
            runs[add_id] = run
            add_id += 1
        # a completion or failure these actions produce is reported from the loop, never from
        # inside the caller's add (see _call_run_done)
        in_add, self._in_add = self._in_add, True
        try:
            self._run(actions)
        finally:
            self._in_add = in_add

    def add_async(self, payload: bytes, publish_time_ms: int) -> asyncio.Future:
        """``add_entries`` of one payload, as a future of its Position (resolved once it is
        confirmed, in order). Raises at once like ``add_entries``."""
        fut = asyncio.get_running_loop().create_future()
        self.add_entries((bytes(payload),), (publish_time_ms,), _resolve, fut)
        return fut

    async def add(self, payload: bytes, publish_time_ms: int) -> Position:
        """Add and wait for confirmation; waits first while pending_adds_max adds are pending."""
        while self._core.pending_count >= self._config.pending_adds_max and self._accepting():
            waiter = asyncio.get_running_loop().create_future()
            self._capacity_waiters.append(waiter)
            await waiter
        return await self.add_async(payload, publish_time_ms)

    def _accepting(self) -> bool:
        return self._core.state in (ManagedLedgerState.READY, ManagedLedgerState.ROLLING_OVER)

    # -- reads -----------------------------------------------------------------------------------
    async def read_entries(self, start: Position, count_max: int) -> list[tuple[Position, bytes]]:
        """Up to ``count_max`` (and read_entries_max) entries from ``start`` on, in order, across
        ledgers, up to the last confirmed entry. A ``start`` past the end of its ledger continues
        with the next ledger; one in a ledger no longer in the list, with the next one that is."""
        if count_max <= 0:
            raise ValueError(f"count_max must be > 0, got {count_max}")
        if self._core.state is ManagedLedgerState.DELETED:
            raise ManagedLedgerClosedError(f"{self.name}: deleted")
        count = min(count_max, self._config.read_entries_max)
        out: list[tuple[Position, bytes]] = []
        ledgers = self._core.ledgers()
        for ledger_id, first, last in ledger_ranges(ledgers, start, count):
            info = next(i for i in ledgers if i.ledger_id == ledger_id)
            if info.offload.state in (OffloadState.OFFLOADED, OffloadState.BOOKIE_DELETED):
                # invariant 7: the tier gives back the same entries under the same ids
                try:
                    if self.tier_reader is None:
                        raise ManagedLedgerError(f"{self.name}: ledger {ledger_id} is offloaded "
                                                 f"({info.offload.uri}) and no tier is configured")
                    got = await self.tier_reader(info, first, last)
                except PulsarliteError as e:
                    if info.offload.state is OffloadState.BOOKIE_DELETED:
                        raise
                    # offloaded but still on the bookies (deletion lag): read it there
                    log.warning("managed ledger %s: tier read of ledger=%d failed, reading the bookies: %s",
                                self.name, ledger_id, e)
                else:
                    check([e for e, _ in got] == list(range(first, last + 1)),
                          f"{self.name}: tier read of ledger {ledger_id} {first}..{last} gave other entries")
                    out.extend((Position(ledger_id, e), data) for e, data in got)
                    continue
            reader = await self._reader(ledger_id)
            for e in await reader.read(first, last):
                out.append((Position(ledger_id, e.entry_id), e.payload))
        return out

    async def _reader(self, ledger_id: int) -> LedgerReader:
        writer = self._writer
        if writer is not None and writer.ledger_id == ledger_id and not writer.metadata.is_closed:
            if self._core.current_ledger_id == ledger_id:
                last_confirmed = self._core.current_confirmed()[1]
            else:
                last_confirmed = writer.last_add_confirmed
            return LedgerReader(writer.metadata, self._client.pool, self._client.config,
                                last_add_confirmed=last_confirmed)
        reader = self._readers.get(ledger_id)
        if reader is not None:
            self._readers.move_to_end(ledger_id)
            return reader
        reader = await self._client.open_ledger(ledger_id, recovery=False)
        if reader.metadata.is_closed:
            self._readers[ledger_id] = reader
            while len(self._readers) > self._config.readers_cached_max:
                self._readers.popitem(last=False)
        return reader

    # -- offload ---------------------------------------------------------------------------------
    async def update_offload(self, ledger_id: int,
                             transform: Callable[[OffloadRecord], OffloadRecord]) -> OffloadRecord:
        """CAS the list with ``transform(current offload info)`` for CLOSED ledger ``ledger_id``
        (the offloader's state machine steps; only the owner writes). Serialised with rollovers.
        Raises ManagedLedgerClosedError if not READY/ROLLING_OVER, ManagedLedgerFencedError if
        someone else changed the list, KeyError if the ledger left the list."""
        async with self._metadata_lock:
            if not self._accepting():
                raise ManagedLedgerClosedError(f"{self.name}: offload update while {self._core.state.value}")
            current = self._core.metadata.info(ledger_id)
            offload = transform(current.offload)
            if offload == current.offload:
                return offload
            md = self._core.offload_metadata(ledger_id, offload)
            await self._write_list(md)
            self._core.on_offload_written(md)
            log.info("managed ledger %s: ledger=%d offload state=%s uri=%s", self.name, ledger_id,
                     offload.state.value, offload.uri)
            return offload

    # -- list properties (compaction) ----------------------------------------------------------
    async def update_properties(self, transform: Callable[[dict[str, str]], dict[str, str]], *,
                                delete_ledger_ids: Sequence[int] = ()) -> None:
        """One CAS of the list with ``transform(properties)``; ``delete_ledger_ids`` (ledgers NOT
        in the list, e.g. a compacted ledger replaced) are recorded in the same write as ledgers
        to delete, so the next :meth:`trim_ledgers` deletes them even after a crash. Only the
        owner writes (ManagedLedgerFencedError otherwise; ManagedLedgerClosedError if closed)."""
        async with self._metadata_lock:
            if not self._accepting():
                raise ManagedLedgerClosedError(f"{self.name}: properties update while {self._core.state.value}")
            properties = dict(transform(dict(self._core.metadata.properties)))
            in_list = set(self._core.metadata.ledger_ids)
            ids = [int(i) for i in delete_ledger_ids]
            check(not in_list.intersection(ids), f"{self.name}: ledgers {ids} to delete are in the list")
            if ids:
                pending = _decode_trimmed(properties.get(TRIMMED_PROPERTY))
                pending.update({lid: None for lid in ids})
                properties[TRIMMED_PROPERTY] = _encode_trimmed(pending)
            md = self._core.trim_metadata([], properties)
            await self._write_list(md)
            self._core.on_trim_written(md)

    async def reserve_side_ledger_id(self) -> int:
        """An id for a later :meth:`create_side_ledger` (the caller names it durably first, so
        a crash between the creation and the naming cannot leak the ledger)."""
        return await self._client.reserve_ledger_id()

    async def create_side_ledger(self, purpose: str, *, ledger_id: int | None = None) -> LedgerWriter:
        """A new ledger with this managed ledger's replication settings that is NOT in its list
        (the compactor's compacted ledger); the caller records or deletes it."""
        cfg = self._config
        return await self._client.create_ledger(cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum,
                                                custom={"managed-ledger": self.name, "purpose": purpose},
                                                ledger_id=ledger_id)

    async def delete_side_ledger(self, ledger_id: int) -> None:
        """Delete a ledger outside the list that was never recorded (a failed compaction's); an
        id that was reserved but never created (or is deleted already) is fine."""
        check(ledger_id not in self._core.metadata.ledger_ids, f"{self.name}: ledger {ledger_id} is in the list")
        self._readers.pop(ledger_id, None)
        try:
            await self._client.delete_ledger(ledger_id)
        except MetadataNotFoundError:
            pass

    async def open_side_ledger(self, ledger_id: int) -> LedgerReader:
        """A reader of a closed ledger outside the list (cached like the list's)."""
        reader = self._readers.get(ledger_id)
        if reader is None:
            reader = await self._client.open_ledger(ledger_id, recovery=False)
            self._readers[ledger_id] = reader
            while len(self._readers) > self._config.readers_cached_max:
                self._readers.popitem(last=False)
        return reader

    # -- trim (retention) ------------------------------------------------------------------------
    def trimmed_pending(self) -> dict[int, str | None]:
        """Ledgers already out of the list whose deletion has not been confirmed yet (a crash or
        failure after the trim's first CAS): id -> offloaded object URI (or None)."""
        return _decode_trimmed(self._core.metadata.properties.get(TRIMMED_PROPERTY))

    async def trim_ledgers(self, ledger_ids, *, delete_offloaded: OffloadDeleter | None = None) -> list[int]:
        """Retention: delete CLOSED ledgers from the front of the list. Order (never the reverse):
        one CAS takes them out of the list and records them in the list property
        ``pulsarlite.trimmed`` (id -> tier URI); then each is deleted from the tier
        (``await delete_offloaded(ledger_id, uri)``, if it was offloaded) and from the bookies and
        the ledger metadata; then a second CAS forgets the ids deleted. A crash in between leaves
        them recorded: the next trim (any call, even with no ids) deletes them. Returns the ids
        deleted now (recorded ones included). ManagedLedgerClosedError if not READY/ROLLING_OVER."""
        ids = [int(i) for i in ledger_ids]
        if ids:
            async with self._metadata_lock:
                if not self._accepting():
                    raise ManagedLedgerClosedError(f"{self.name}: trim while {self._core.state.value}")
                pending = self.trimmed_pending()
                for lid in ids:
                    pending[lid] = self._core.metadata.info(lid).offload.uri
                properties = dict(self._core.metadata.properties)
                properties[TRIMMED_PROPERTY] = _encode_trimmed(pending)
                md = self._core.trim_metadata(ids, properties)
                await self._write_list(md)
                self._core.on_trim_written(md)
            log.info("managed ledger %s: trimmed ledgers=%s (out of the list; deleting)", self.name, ids)
        pending = self.trimmed_pending()
        if not pending:
            return []
        deleted: list[int] = []
        for lid, uri in sorted(pending.items()):
            self._readers.pop(lid, None)
            try:
                if uri and delete_offloaded is not None:
                    await delete_offloaded(lid, uri)
                elif uri:
                    log.warning("managed ledger %s: ledger=%d was offloaded to %s; no tier deleter: object left",
                                self.name, lid, uri)
                try:
                    await self._client.delete_ledger(lid)
                except MetadataNotFoundError:
                    pass          # deleted before (its metadata goes last)
            except Exception as e:   # noqa: BLE001 - stays recorded; retried at the next trim
                log.warning("managed ledger %s: deleting trimmed ledger=%d failed (will retry): %s",
                            self.name, lid, e)
                continue
            deleted.append(lid)
            log.info("managed ledger %s: ledger=%d deleted (retention)", self.name, lid)
        if deleted:
            async with self._metadata_lock:
                if self._accepting():
                    left = {k: v for k, v in self.trimmed_pending().items() if k not in deleted}
                    properties = dict(self._core.metadata.properties)
                    if left:
                        properties[TRIMMED_PROPERTY] = _encode_trimmed(left)
                    else:
                        properties.pop(TRIMMED_PROPERTY, None)
                    md = self._core.trim_metadata([], properties)
                    await self._write_list(md)
                    self._core.on_trim_written(md)
        return deleted

    # -- close / delete --------------------------------------------------------------------------
    async def close(self) -> None:
        """Let the adds in flight finish, close the current ledger and mark it CLOSED in the
        list. Later adds fail with ManagedLedgerClosedError. Idempotent; a FENCED managed ledger
        is only released (it writes nothing)."""
        async with self._close_lock:
            while self._core.state is ManagedLedgerState.ROLLING_OVER and self._rollover_task is not None:
                await asyncio.wait({self._rollover_task})
            state = self._core.state
            try:
                if state in (ManagedLedgerState.CLOSED, ManagedLedgerState.DELETED):
                    return
                if state in (ManagedLedgerState.FENCED, ManagedLedgerState.FAILED):
                    if self._writer is not None:
                        await self._close_writer_quietly(self._writer)
                    if state is ManagedLedgerState.FAILED:
                        self._run(self._core.on_closed(None))
                    return
                check(state is ManagedLedgerState.READY, f"{self.name}: close in {state.value}")
                self._core.start_close()
                writer = self._writer
                try:
                    try:
                        closed_md = await writer.close()
                    except LedgerFencedError as e:
                        raise ManagedLedgerFencedError(f"{self.name}: ledger {writer.ledger_id} fenced: {e}") from None
                    async with self._metadata_lock:   # after any offload update in flight
                        md = self._core.close_metadata(self._core.closed_info(closed_md.last_entry_id,
                                                                              closed_md.length))
                        await self._cas(encode(md))
                except ManagedLedgerFencedError as e:
                    self._run(self._core.on_fenced(e))
                    raise
                except PulsarliteError as e:
                    self._run(self._core.on_failed(e))
                    raise
                self._run(self._core.on_closed(md))
                log.info("managed ledger %s closed: ledgers=%s", self.name, md.ledger_ids)
            finally:
                self._stop_background()

    async def delete(self) -> None:
        """Close, delete every ledger (bookies and metadata), then the list's znode. A crash
        midway leaves the znode listing some deleted ledgers; deleting again finishes."""
        if self._core.state is ManagedLedgerState.DELETED:
            return
        await self.close()
        if self._core.state is ManagedLedgerState.FENCED:
            raise ManagedLedgerFencedError(f"{self.name}: fenced: not the owner, cannot delete")
        for hook in list(self.before_delete):
            await hook()
        leftovers = [LedgerInfo(lid) for lid in self.trimmed_pending()]   # trims not finished
        for info in leftovers + list(self._core.metadata.ledgers):
            try:
                await self._client.delete_ledger(info.ledger_id)
            except MetadataNotFoundError:
                pass
            self._readers.pop(info.ledger_id, None)
        try:
            await self._store.delete(self.name, self._version)
        except MetadataVersionConflict:
            raise ManagedLedgerFencedError(f"{self.name}: list changed by someone else; not deleted") from None
        except MetadataNotFoundError:
            pass
        self._core.on_deleted()
        log.info("managed ledger %s deleted", self.name)

    # -- action execution ------------------------------------------------------------------------
    def _run(self, actions) -> None:
        core = self._core
        for a in actions:
            kind = type(a)
            if kind is WriteEntries:
                add_id, ledger_id, entry_id, count = a
                writer = self._writer            # the writer of the current ledger, which the action names
                if writer is None or writer.ledger_id != ledger_id:
                    raise InvariantViolation(f"{self.name}: write to ledger {ledger_id}, writer is "
                                             f"{writer.ledger_id if writer else None}")
                run_first, payloads, _, _ = self._runs[add_id]
                if add_id != run_first or count != len(payloads):    # parts of runs (queued adds)
                    payloads = self._payloads_of(add_id, count)
                try:
                    first = writer.add_entries(payloads, self._on_entries_done, a)
                except PulsarliteError as e:       # each add fails, in order, as the writer would fail them
                    for failed in range(add_id, add_id + count):
                        self._run(core.on_add_failed(failed, ledger_id, e))
                    continue
                if first != entry_id:
                    raise InvariantViolation(f"{self.name}: adds {add_id}.. got entry {first} of ledger "
                                             f"{ledger_id}, expected {entry_id}")
            elif kind is CompleteAdds:
                self._complete(a)
            elif kind is FailAdd:
                run_first, _, done, context = self._runs.pop(a.add_id)
                offset = a.add_id - run_first
                self._call_run_done(done, context, offset, offset, None, a.error)
                self._wake_capacity()
            elif kind is StartRollover:
                log.info("managed ledger %s: rollover of ledger=%d (%s)", self.name, a.ledger_id, a.reason.value)
                self._rollover_task = self._spawn(self._rollover(a), f"rollover {a.ledger_id}")
            else:
                raise InvariantViolation(f"{self.name}: unknown action {a!r}")

    def _payloads_of(self, add_id: int, count: int) -> Sequence[bytes]:
        """The payloads of adds ``add_id .. add_id + count - 1``: parts of one run or of several
        (when queued adds go out together)."""
        runs = self._runs
        out: list[bytes] = []
        while count:
            run_first, run_payloads, _, _ = runs[add_id]
            offset = add_id - run_first
            taken = min(count, len(run_payloads) - offset)
            out += run_payloads[offset:offset + taken]
            add_id += taken
            count -= taken
        return out

    def _complete(self, a: CompleteAdds) -> None:
        """Tell the runs of adds ``a.add_id ..`` they are confirmed, a range per run."""
        runs = self._runs
        add_id, ledger_id, entry_id, count = a
        while count:
            run_first, run_payloads, done, context = runs[add_id]
            offset = add_id - run_first
            taken = len(run_payloads) - offset           # the rest of the run, or as many as confirmed
            if taken > count:
                taken = count
            end = add_id + taken
            while add_id < end:
                del runs[add_id]
                add_id += 1
            self._call_run_done(done, context, offset, offset + taken - 1, Position(ledger_id, entry_id), None)
            entry_id += taken
            count -= taken
        if self._capacity_waiters:
            self._wake_capacity()

    def _call_run_done(self, done: RunAddDone, context: Any, first: int, last: int, position: Position | None,
                       error: BaseException | None) -> None:
        if self._in_add:
            asyncio.get_running_loop().call_soon(self._call_run_done, done, context, first, last, position, error)
            return
        try:
            done(context, first, last, position, error)
        except Exception:        # as a Future's done callback: log, go on with the others
            log.exception("managed ledger %s: add callback failed", self.name)

    def _on_entries_done(self, write: WriteEntries, first_entry_id: int, last_entry_id: int,
                         error: BaseException | None) -> None:
        """The ledger writer's answer for entries first..last of ``write``."""
        first_add_id, ledger_id, write_entry_id, _ = write
        add_id = first_add_id + (first_entry_id - write_entry_id)
        count = last_entry_id - first_entry_id + 1
        core = self._core
        if error is None:
            if core.state not in (ManagedLedgerState.FENCED, ManagedLedgerState.FAILED):
                self._run(core.on_adds_confirmed(add_id, ledger_id, first_entry_id, count))
                return
            # failed back already (fenced, a failed rollover): a late confirmation changes nothing
            late = [i for i in range(count) if add_id + i not in self._runs]
            if late:
                log.warning("managed ledger %s: %d adds confirmed at %d:%d.. after they were failed back",
                            self.name, len(late), ledger_id, first_entry_id + late[0])
            for i in range(count):
                if add_id + i in self._runs:
                    self._run(core.on_adds_confirmed(add_id + i, ledger_id, first_entry_id + i, 1))
            return
        if not isinstance(error, PulsarliteError):
            error = ManagedLedgerError(f"{self.name}: add to ledger {ledger_id} failed: {error!r}")
        for i in range(count):
            self._run(core.on_add_failed(add_id + i, ledger_id, error))

    def _wake_capacity(self) -> None:
        if self._capacity_waiters:
            waiters, self._capacity_waiters = self._capacity_waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    # -- rollover --------------------------------------------------------------------------------
    async def _rollover(self, action: StartRollover) -> None:
        old = self._writer
        if old is None or old.ledger_id != action.ledger_id:
            raise InvariantViolation(f"{self.name}: rollover of {action.ledger_id}, writer is {old}")
        creating = asyncio.ensure_future(self._create_ledger())
        try:
            # counted after the drain: the adds in flight when the rollover started are
            # confirmed or failed by now; only entries beyond the confirmed ones were failed back
            # (and kept by the recovery that closed the ledger). Counted before it, a rollover by
            # size reported a run's adds still in flight as kept (read back, learned twice)
            closed_md = await self._close_old_ledger(old)
            confirmed = self._core.entries_confirmed_current()
            closed = self._core.closed_info(closed_md.last_entry_id, closed_md.length)
            kept = await self._read_kept(closed.ledger_id, confirmed, closed.entries - 1)
            new = await creating
            async with self._metadata_lock:   # no await between this CAS and on_rolled_over below
                md = self._core.rollover_metadata(closed, new.ledger_id, self._clock())
                await self._cas(encode(md))
        except PulsarliteError as e:
            await self._discard_creating(creating)
            if isinstance(e, ManagedLedgerFencedError):
                log.warning("managed ledger %s fenced during rollover: %s", self.name, e)
                self._run(self._core.on_fenced(e))
            else:
                log.error("managed ledger %s: rollover failed: %s", self.name, e)
                self._run(self._core.on_failed(e))
            return
        except BaseException:
            await self._discard_creating(creating)
            raise
        self._writer = new
        log.info("managed ledger %s rolled over: closed ledger=%d entries=%d bytes=%d, current=%d",
                 self.name, closed.ledger_id, closed.entries, closed.size_bytes, new.ledger_id)
        if kept is None:
            for unread in list(self.kept_unread_listeners):
                try:
                    unread(Position(closed.ledger_id, confirmed), Position(closed.ledger_id, closed.entries - 1))
                except Exception:
                    log.exception("managed ledger %s: kept-entries listener failed", self.name)
        elif kept:
            for listener in list(self.kept_listeners):
                try:
                    listener(kept)
                except Exception:
                    log.exception("managed ledger %s: kept-entries listener failed", self.name)
        self._run(self._core.on_rolled_over(md, self._clock()))
        for listener in list(self.rollover_listeners):
            try:
                listener(closed.ledger_id)
            except Exception:
                log.exception("managed ledger %s: rollover listener failed", self.name)

    async def _read_kept(self, ledger_id: int, first: int, last: int) -> list[tuple[Position, bytes]] | None:
        """Entries first..last of a closed ledger: adds that failed back, kept by its recovery.
        Read only when someone listens; None if they could not be read (the listeners of
        ``kept_unread_listeners`` are told instead)."""
        if last < first or not self.kept_listeners:
            return []
        log.warning("managed ledger %s: ledger=%d closed with %d entries beyond the %d confirmed "
                    "(adds failed back, kept by recovery)", self.name, ledger_id, last - first + 1, first)
        try:
            reader = await self._client.open_ledger(ledger_id, recovery=False)
            return [(Position(ledger_id, e.entry_id), e.payload) for e in await reader.read(first, last)]
        except PulsarliteError as e:
            log.warning("managed ledger %s: entries %d..%d of ledger=%d not read (%s): deduplication "
                        "learns them from the log on the next load", self.name, first, last, ledger_id, e)
            return None

    async def _close_old_ledger(self, writer: LedgerWriter) -> LedgerMetadata:
        """Drain and close at the LAC. If the close itself fails (not fenced), recover the
        ledger instead (a recovery may keep an add that had failed back: a duplicate if the
        producer re-sent it, never a loss)."""
        try:
            return await writer.close()
        except LedgerFencedError as e:
            raise ManagedLedgerFencedError(f"{self.name}: ledger {writer.ledger_id} fenced: {e}") from None
        except PulsarliteError as e:
            log.warning("managed ledger %s: close of ledger=%d failed (%s); recovering it", self.name,
                        writer.ledger_id, e)
            try:
                return await self._client.recover(writer.ledger_id)
            except LedgerFencedError as e2:
                raise ManagedLedgerFencedError(f"{self.name}: ledger {writer.ledger_id} fenced: {e2}") from None

    async def _create_ledger(self) -> LedgerWriter:
        cfg = self._config
        for attempt in range(cfg.ledger_create_attempts_max):
            try:
                return await self._client.create_ledger(cfg.ensemble_size, cfg.write_quorum, cfg.ack_quorum,
                                                        custom={"managed-ledger": self.name})
            except PulsarliteError as e:
                if not e.retriable or attempt + 1 >= cfg.ledger_create_attempts_max:
                    raise
                log.warning("managed ledger %s: ledger creation failed (attempt %d): %s", self.name, attempt + 1, e)
                await asyncio.sleep(self._backoff_s(attempt))
        raise InvariantViolation("unreachable")

    async def _discard_creating(self, creating: asyncio.Future) -> None:
        try:
            writer = await creating
        except BaseException:
            return
        await self._discard_ledger(writer)

    async def _discard_ledger(self, writer: LedgerWriter) -> None:
        """A ledger we created that never made it into the list: close and delete it."""
        await self._close_writer_quietly(writer)
        await self._delete_ledger_quietly(writer.ledger_id)

    async def _close_writer_quietly(self, writer: LedgerWriter) -> None:
        try:
            await writer.close()
        except PulsarliteError as e:
            log.info("managed ledger %s: close of ledger=%d: %s", self.name, writer.ledger_id, e)

    async def _delete_ledger_quietly(self, ledger_id: int) -> None:
        try:
            await self._client.delete_ledger(ledger_id)
        except PulsarliteError as e:
            log.warning("managed ledger %s: could not delete ledger=%d: %s", self.name, ledger_id, e)

    # -- metadata CAS ----------------------------------------------------------------------------
    async def _write_list(self, md: ManagedLedgerMetadata) -> None:
        """CAS ``md``; a conflict (someone else wrote the list) fences us and is raised."""
        try:
            await self._cas(encode(md))
        except ManagedLedgerFencedError as e:
            self._run(self._core.on_fenced(e))
            raise

    async def _cas(self, data: bytes) -> None:
        """Write the list at our version. A conflict means someone else wrote it (FENCED) unless
        it was our own write whose answer was lost (same bytes): then that is success. Retries
        only ZooKeeper trouble, bounded."""
        attempts = self._config.metadata_attempts_max
        for attempt in range(attempts):
            await self._check_owned("the list is not written")
            try:
                self._version = await self._store.write(self.name, data, self._version)
                return
            except MetadataVersionConflict:
                if await self._written_by_us(data):
                    return
                raise ManagedLedgerFencedError(
                    f"{self.name}: ledger list changed by someone else (expected version {self._version})") from None
            except MetadataNotFoundError:
                raise ManagedLedgerFencedError(f"{self.name}: ledger list deleted by someone else") from None
            except MetadataError as e:
                if not e.retriable or attempt + 1 >= attempts:
                    raise
                log.warning("managed ledger %s: list write failed (attempt %d): %s", self.name, attempt + 1, e)
                await asyncio.sleep(self._backoff_s(attempt))
                try:
                    if await self._written_by_us(data):
                        return
                except MetadataError:
                    continue
        raise ManagedLedgerError(f"{self.name}: ledger list not written after {attempts} attempts")

    async def _written_by_us(self, data: bytes) -> bool:
        """True if the stored list is ``data`` (our write went through); raise FENCED if it is
        something else at another version; False if it is still at our version."""
        got = await self._store.read(self.name)
        if got is None:
            raise ManagedLedgerFencedError(f"{self.name}: ledger list deleted by someone else")
        _, version, raw = got
        if raw == data:
            self._version = version
            return True
        if version != self._version:
            raise ManagedLedgerFencedError(
                f"{self.name}: ledger list changed by someone else (version {version}, ours {self._version})")
        return False

    def _backoff_s(self, attempt: int) -> float:
        return min(0.05 * 2 ** attempt, self._config.retry_backoff_ms_max / 1000)

    # -- background ------------------------------------------------------------------------------
    async def _tick_loop(self) -> None:
        interval = self._config.tick_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self._run(self._core.on_tick(self._clock()))

    def _spawn(self, coro, what: str) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._task_done, what))
        return task

    def _task_done(self, what: str, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        log.error("managed ledger %s: %s died", self.name, what, exc_info=error)
        wrapped = error if isinstance(error, PulsarliteError) else ManagedLedgerError(f"{what} died: {error!r}")
        self._run(self._core.on_failed(wrapped))

    def _stop_background(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self._wake_capacity()


__all__ = ["ManagedLedger", "wall_clock_ms"]
