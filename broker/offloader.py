"""The broker's offloader: moves closed ledgers of the topics this broker owns to the tier (Parquet
in an object store, :mod:`offload`) and reads them back (docs/architecture.md#data-paths,
#invariant-6, #invariant-7).

Only the owner writes a topic's ledger list, so every step is a compare-and-set through the
topic's :class:`ManagedLedger` (``update_offload``), serialised with its rollovers. Each ledger
is driven by :class:`offload.core.LedgerOffload` (the pure machine: events in, actions out); this
shell executes its actions one at a time and feeds the results back::

    none --(CAS offloading + the attempt's object URI)--> offloading
         --(read from bookies; encode + upload off the loop; verify; CAS stats)--> offloaded
         --(deletion lag passed; object verified again; ledger deleted from the bookies; CAS)-->
           bookie-deleted

- Every attempt records its object's URI (a fresh uuid) *before* writing, and a retry (here, or
  on a new owner after a crash) first deletes the previous attempt's object: every object the
  tier holds is named by the metadata. A periodic sweep in the topic's worker deletes objects
  under the topic's prefix that no record names (a deposed owner's late write, trimmed ledgers).
- Invariant 6: a ledger leaves the bookies only from ``offloaded``, after the object was
  downloaded again and matched the recorded size, CRC32C, rows and entry ids. A crash between
  the bookie delete and its CAS leaves ``offloaded`` without a bookie copy: reads come from the
  tier anyway, and the next pass deletes again (idempotent) and records ``bookie-deleted``.
- Reads of ``offloaded`` / ``bookie-deleted`` ledgers come from the tier (``ManagedLedger.
  tier_reader``; an ``offloaded`` one falls back to its bookie copy if the tier read fails):
  whole row groups are fetched (small objects by one GET) and rebuilt into entries in a thread
  (same ids, invariant 7), kept in a bytes-bounded cache; the next row group and the next
  ``tier_read_ahead_ledgers`` offloaded ledgers are read ahead.
- Typed columns ([schema]): when every live schema version of the topic is AVRO or JSON, the
  object also holds the record's fields as typed columns after the tier format's (``value``
  kept; values that do not decode are null, counted in ``typed_counters`` and logged), and its
  footer says which versions they were built from (offload/typed_columns.py); the Spark source
  reads them instead of decoding. Broker key ``offload_typed_columns`` (default on). Tier reads
  select only the columns that rebuild entries.
- Encoding, uploads, verification and tier reads run in a bounded thread pool
  (``offload_concurrent_max`` ledgers at once per broker); the event loop only moves entries.
  An offload streams: the loop reads the ledger one bookie reply (<= 4 MiB) at a time into a
  pipe of ``[offload] read_ahead_bytes`` (offload/pipe.py), a pool thread encodes row groups from it and
  writes them to the object as it goes (S3 multipart, file:// temp file), committed whole or
  aborted: memory is bounded whatever the ledger's size (docs/decisions.md "Streaming offload").

Lakehouse ([lakehouse], broker key ``lake_enabled``; offload/lake.py): the offloaded objects of
a topic are the data files of its Iceberg table. The object is committed to the table right after
``offloaded`` is recorded (the machine's CommitToTable step); each pass first repairs the table
from the list (``Lake.sync``: adds offloaded ledgers missing from it, removes files no offloaded
ledger names); retention takes the ledgers it trims out of the table before they leave the list
(``before_trim``); topic deletion takes the topic's files out (drops a non-partitioned topic's
table) before its objects go. After the table repair and the offloads, a pass may merge one run of the
table's small files (offload/lake_merge.py, ``lake_merge_target_bytes``); the periodic sweep
also deletes merged objects no snapshot names. Table work runs in the thread pool under one lock
per topic.

Triggers: on demand (admin ``PUT .../offload``: every closed ledger before a position), on
ledger rollover and on a timer (``offload_check_interval_ms``), by the namespace policy
(``offloadThresholdInBytes``: keep at most N bytes on the bookies; ``offloadThresholdInSeconds``;
``offloadDeletionLagMs``; the broker's ``offload_deletion_lag_ms`` when unset).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol, Sequence

from broker.managed_ledger import (LedgerInfo, LedgerInfoState, ManagedLedger, ManagedLedgerClosedError,
                                   ManagedLedgerFencedError, OffloadState, Position)
from broker.schemas import SchemaRegistry
from offload.core import (LedgerOffload, LedgerView, ListedObject, ObjectStats, Offload, OffloadPolicy, OffloadRecord,
                          Tick, orphan_objects, plan_offload)
from offload.lake import Lake, TableId
from offload.lake_merge import LedgerObject, ledger_day, merge_once, sweep_merged
from offload.shell import LedgerOffloadShell, OffloadError
from offload.pipe import EntryPipe, PipeStoppedError
from offload.tier import Tier, TierReadCache, TypedColumnsFailedError, encode_and_upload, verify_object
from pulsarlite.errors import MetadataNotFoundError, check
from pulsarlite.metadata_layout import topic_policies_path
from pulsarlite.topic_name import TopicName

log = logging.getLogger("pulsarlite.broker.offload")

class OffloadStatus(enum.Enum):
    """Pulsar's LongRunningProcessStatus for ``GET .../offload``."""

    NOT_RUN = "NOT_RUN"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    ERROR = "ERROR"


# -- per-topic policy override -------------------------------------------------------------------
# the znode: topic_policies_path (pulsarlite/metadata_layout.py), JSON ``{"offloadPolicies": {...}}``
# (Pulsar keeps topic policies in a system topic; we keep them in ZooKeeper)
_TOPIC_POLICY_FIELDS = {"managedLedgerOffloadThresholdInBytes": -1,
                        "managedLedgerOffloadThresholdInSeconds": -1,
                        "managedLedgerOffloadDeletionLagInMillis": 0}


@dataclass(frozen=True)
class TopicOffloadPolicies:
    """Pulsar's OffloadPolicies, the fields we honour (None: the namespace's value)."""

    threshold_bytes: int | None = None
    threshold_s: int | None = None
    deletion_lag_ms: int | None = None

    @classmethod
    def from_json(cls, raw: object) -> "TopicOffloadPolicies":
        """ValueError (a clear message) for anything but an object with integer fields; other
        OffloadPolicies fields (driver, bucket, ...) are ignored: the broker's tier is used."""
        if not isinstance(raw, dict):
            raise ValueError("offload policies must be a JSON object")
        values = []
        for key, minimum in _TOPIC_POLICY_FIELDS.items():
            v = raw.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < minimum
                                  or v > 2 ** 63 - 1):
                raise ValueError(f"{key} must be an integer >= {minimum}, got {v!r}")
            values.append(v)
        return cls(*values)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in zip(_TOPIC_POLICY_FIELDS, (self.threshold_bytes, self.threshold_s,
                                                             self.deletion_lag_ms)) if v is not None}

    def applied_to(self, policy: OffloadPolicy) -> OffloadPolicy:
        return OffloadPolicy(
            threshold_bytes=policy.threshold_bytes if self.threshold_bytes is None else self.threshold_bytes,
            threshold_ms=policy.threshold_ms if self.threshold_s is None else
            (-1 if self.threshold_s < 0 else self.threshold_s * 1000),
            deletion_lag_ms=policy.deletion_lag_ms if self.deletion_lag_ms is None else self.deletion_lag_ms)


async def read_topic_offload_policies(store, topic_name) -> TopicOffloadPolicies | None:
    got = await store.get_or_none(topic_policies_path(topic_name.managed_ledger_name))
    if got is None:
        return None
    try:
        raw = json.loads(got[0])
        return TopicOffloadPolicies.from_json(raw.get("offloadPolicies") or {})
    except (ValueError, AttributeError) as e:
        log.warning("ignoring malformed topic policies of %s: %s", topic_name, e)
        return None


# -- glue between the managed-ledger list and offload.core (pure) ---------------------------------
def ledger_views(ledgers: Sequence[LedgerInfo]) -> list[LedgerView]:
    return [LedgerView(ledger_id=i.ledger_id, closed=i.state is LedgerInfoState.CLOSED, entries=i.entries,
                       size_bytes=i.size_bytes, created_ms=i.created_ms, closed_ms=i.max_publish_time_ms,
                       state=i.offload.state, offloaded_ms=i.offload.offloaded_ms)
            for i in ledgers]


def ledgers_before(ledgers: Sequence[LedgerInfo], position: Position) -> list[int]:
    """Closed, non-empty ledgers all of whose entries lie before ``position``."""
    out = []
    for info in ledgers:
        if info.state is not LedgerInfoState.CLOSED or info.entries == 0:
            continue
        if info.ledger_id < position.ledger_id or (info.ledger_id == position.ledger_id
                                                   and position.entry_id >= info.entries):
            out.append(info.ledger_id)
    return out


def topic_prefix(topic_name) -> str:
    """The key prefix of a topic's objects (offload.core's layout: ``<tenant>/<ns>/<topic>/``)."""
    return f"{topic_name.tenant}/{topic_name.namespace_local_name}/{topic_name.encoded_local_name}/"


# -- per topic -----------------------------------------------------------------------------------
class OffloadHost(Protocol):
    """What a topic's offloader needs of the broker (``broker.service.BrokerService``)."""

    schemas: SchemaRegistry

    def unload_topic(self, key: str) -> Awaitable[object]: ...


class OffloadedTopic(Protocol):
    """What an offloader needs of its topic (``broker.topic.PersistentTopic``)."""

    name: TopicName
    key: str
    ml: ManagedLedger
    service: OffloadHost

    @property
    def closing(self) -> bool: ...


@dataclass
class _Demand:
    ledgers: tuple[int, ...]
    status: OffloadStatus = OffloadStatus.RUNNING
    last_error: str = ""
    first_unoffloaded: Position | None = None


class _Conflict(Exception):
    def __init__(self, record: OffloadRecord) -> None:
        super().__init__(f"recorded {record}")
        self.record = record


@dataclass(frozen=True)
class _Retry:
    """A ledger whose offload failed: when the automatic triggers may try it again."""

    failures: int
    not_before_ms: int


class _TopicSteps:
    """offload.shell's steps for one ledger of a topic (``info``: the list's entry when the run
    began; a closed ledger's entries and size do not change)."""

    def __init__(self, offloader: "TopicOffloader", info: LedgerInfo) -> None:
        self.offloader, self.info = offloader, info

    async def record(self, ledger_id: int, expected: OffloadRecord, new: OffloadRecord) -> OffloadRecord:
        return await self.offloader.record_step(ledger_id, expected, new)

    async def write_object(self, ledger_id: int, uri: str) -> ObjectStats:
        return await self.offloader.write_step(self.info, uri)

    async def verify_object(self, ledger_id: int, uri: str, stats: ObjectStats) -> None:
        await self.offloader.verify_step(self.info, uri, stats)

    async def delete_object(self, ledger_id: int, uri: str) -> None:
        await self.offloader.delete_object_step(uri)

    async def delete_from_bookies(self, ledger_id: int) -> None:
        await self.offloader.delete_from_bookies_step(ledger_id)

    async def commit_to_table(self, ledger_id: int, uri: str) -> None:
        # the record says offloaded (CAS done): the table may now hold the object
        await self.offloader.sync_table()


class TopicOffloader:
    """The offload work of one topic loaded on this broker (its owner). One worker task runs
    offload.core's per-ledger machines one step at a time (so the list's CASes are ordered and
    the orphan sweep never races an attempt of ours); ``kick()`` asks for a pass.

    A ledger whose offload failed stays on the bookies (``offloading``) and is tried again by
    the automatic triggers (timer, rollover, thresholds) only after a delay that doubles with
    each failure in a row, from ``offload_check_interval_ms`` up to ``offload_retry_delay_ms_max``
    (an offload that can never succeed -- a ledger over ``offload_ledger_bytes_max``, entries
    that do not encode -- is not redone on every rollover); an admin offload asking for it tries
    it at once. Each failure is logged with its error and the next attempt's delay, and is the
    admin status's ``lastError`` when asked for. Other ledgers go on meanwhile."""

    ORPHAN_SWEEP_EVERY_PASSES = 10

    def __init__(self, broker: "BrokerOffloader", topic: OffloadedTopic) -> None:
        self.broker = broker
        self.topic = topic
        self.ml = topic.ml
        self.ml_name = topic.name.managed_ledger_name
        self.namespace = topic.name.namespace
        self.prefix = topic_prefix(topic.name)
        self.partition = topic.name.partition_index
        self.table_id = TableId.of_topic(topic.name.tenant, topic.name.namespace_local_name,
                                         topic.name.encoded_local_name)
        self.object_prefix = f"{broker.tier.uri}/{self.prefix}"   # URI prefix of this topic's objects
        self.leaving: set[int] = set()            # ledgers retention is trimming: out of the table
        self.table_error = ""                     # the last table sync/commit failure ("" after a success)
        self._table_synced: tuple | None = None   # (offloaded, leaving) of the last successful sync
        self._table_lock = asyncio.Lock()
        self._merge_not_before_ms = 0             # after a failed merge: no attempt before this
        self.demand: _Demand | None = None
        self.last_error = ""
        self._wake = asyncio.Event()
        self._closed = False
        self._passes = 0
        self._retries: dict[int, _Retry] = {}     # ledger id -> its failures in a row (in memory)
        self._task = asyncio.ensure_future(self._run())

    def kick(self) -> None:
        self._wake.set()

    def request(self, before: Position) -> _Demand:
        """Offload every closed ledger before ``before`` (on demand)."""
        ledgers = tuple(ledgers_before(self.ml.ledgers(), before))
        self.demand = _Demand(ledgers)
        log.info("offload requested topic=%s before=%s ledgers=%s", self.ml_name, before, list(ledgers))
        self.kick()
        return self.demand

    def status(self) -> dict[str, Any]:
        d = self.demand
        if d is None:
            return {"status": OffloadStatus.NOT_RUN.value, "lastError": ""}
        out: dict[str, Any] = {"status": d.status.value, "lastError": d.last_error}
        if d.first_unoffloaded is not None:
            out["firstUnoffloadedMessage"] = {"ledgerId": d.first_unoffloaded.ledger_id,
                                              "entryId": d.first_unoffloaded.entry_id,
                                              "partitionIndex": self.partition, "batchIndex": -1}
        return out

    async def close(self) -> None:
        self._closed = True
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):
            pass

    # -- the worker --------------------------------------------------------------------------
    async def _run(self) -> None:
        self._wake.set()       # a first pass at load: resume what a previous owner left
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            demand = self.demand   # the demand this pass serves: its failure is this one's, not a later one's
            try:
                await self._pass(demand)
            except asyncio.CancelledError:
                raise
            except ManagedLedgerFencedError as e:
                log.warning("offload topic=%s stops: another owner took the topic: %s", self.ml_name, e)
                self._fail_demand(self.demand, str(e))      # no pass will run again: any demand fails
                if not self.topic.closing:
                    task = asyncio.ensure_future(self.topic.service.unload_topic(self.topic.key))
                    task.add_done_callback(lambda t: t.cancelled() or t.exception())
                return
            except ManagedLedgerClosedError as e:
                log.info("offload topic=%s stops: %s", self.ml_name, e)
                self._fail_demand(self.demand, str(e))
                return
            except Exception as e:       # noqa: BLE001 - logged, retried on the next pass
                self.last_error = f"{type(e).__name__}: {e}"
                log.warning("offload pass failed topic=%s: %s", self.ml_name, self.last_error)
                # only the demand this pass served: one requested during the pass (self.demand
                # now) has not run yet; its kick() makes the next pass run it
                self._fail_demand(demand, self.last_error)

    @staticmethod
    def _fail_demand(demand: "_Demand | None", error: str) -> None:
        if demand is not None and demand.status is OffloadStatus.RUNNING:
            demand.status = OffloadStatus.ERROR
            demand.last_error = error

    async def _pass(self, demand: "_Demand | None") -> None:
        """One pass: table repair, the due offloads (``demand``'s ledgers at once), bookie deletes."""
        broker = self.broker
        policy = await broker.policy_of(self.namespace, self.topic.name)
        demanded = demand.ledgers if demand is not None and demand.status is OffloadStatus.RUNNING else ()
        now_ms = broker.clock()
        plan = plan_offload(ledger_views(self.ml.ledgers()), policy, now_ms, demand=demanded)
        self._retries = {i: r for i, r in self._retries.items() if i in plan.offload}   # trimmed, offloaded
        due = [i for i in plan.offload if i in demanded or i not in self._retries
               or self._retries[i].not_before_ms <= now_ms]
        errors = []
        if broker.lake is not None:
            # repair before any step: a commit lost to a crash, a ledger back to offloading
            try:
                await self.sync_table()
            except (asyncio.CancelledError, ManagedLedgerFencedError, ManagedLedgerClosedError):
                raise
            except Exception as e:     # noqa: BLE001 - the offload goes on; the table is retried
                self.table_error = f"{type(e).__name__}: {e}"
                log.warning("lake sync failed topic=%s table=%s (repaired on a later pass): %s", self.ml_name,
                            self.table_id.name, e)
        # ledgers in parallel: the heavy steps take the broker's slots (offload_concurrent_max),
        # the list's CASes are serialised by the managed ledger
        results = await asyncio.gather(*(self._drive(ledger_id, Offload(broker.clock(), uuid.uuid4().hex), policy)
                                         for ledger_id in due), return_exceptions=True)
        for ledger_id, result in zip(due, results):
            if isinstance(result, BaseException):
                raise result
            if result:
                errors.append(f"ledger {ledger_id}: {result}")
                self._failed(ledger_id, result)
            else:
                self._retries.pop(ledger_id, None)
        if self._closed:
            return
        if demand is not None and demand.status is OffloadStatus.RUNNING:
            still = [i.ledger_id for i in self.ml.ledgers() if i.ledger_id in demand.ledgers
                     and i.offload.state in (OffloadState.NONE, OffloadState.OFFLOADING)]
            if errors or still:
                demand.status = OffloadStatus.ERROR
                demand.last_error = "; ".join(errors) or f"ledgers {still} not offloaded"
            else:
                demand.status = OffloadStatus.SUCCESS
                log.info("offload done topic=%s ledgers=%s", self.ml_name, list(demand.ledgers))
            demand.first_unoffloaded = self._first_unoffloaded()
        # deletion decided again: an offload just done counts from its own offloaded_ms
        plan = plan_offload(ledger_views(self.ml.ledgers()), policy, broker.clock())
        for ledger_id in plan.delete_from_bookies:
            if self._closed:
                return
            error = await self._drive(ledger_id, Tick(broker.clock()), policy)
            if error:
                errors.append(f"ledger {ledger_id}: {error}")
        if broker.lake is not None and not self._closed:
            await self._merge_table_files()
        self._passes += 1
        if self._passes % self.ORPHAN_SWEEP_EVERY_PASSES == 1:
            await self.sweep_orphans()
            if broker.lake is not None:
                await self._sweep_merged()
        if errors:
            self.last_error = "; ".join(errors)
            raise OffloadError(self.last_error)

    def _failed(self, ledger_id: int, error: str) -> None:
        """Space out the automatic retries of a ledger whose offload failed (doubling delays)."""
        config = self.broker.config
        failures = self._retries[ledger_id].failures + 1 if ledger_id in self._retries else 1
        delay_ms = min(config.offload.check_interval_ms << min(failures - 1, 32),
                       config.offload.retry_delay_ms_max)
        self._retries[ledger_id] = _Retry(failures, self.broker.clock() + delay_ms)
        log.warning("offload failed topic=%s ledger=%d failures=%d: %s; stays on the bookies, next automatic "
                    "attempt in %d s (an admin offload tries at once)", self.ml_name, ledger_id, failures, error,
                    delay_ms // 1000)

    def _first_unoffloaded(self) -> Position:
        for info in self.ml.ledgers():
            if info.entries > 0 and info.offload.state in (OffloadState.NONE, OffloadState.OFFLOADING):
                return Position(info.ledger_id, 0)
        last = self.ml.last_confirmed_position
        return Position(last.ledger_id, last.entry_id + 1)

    def _info(self, ledger_id: int) -> LedgerInfo | None:
        for info in self.ml.ledgers():
            if info.ledger_id == ledger_id:
                return info
        return None

    async def _drive(self, ledger_id: int, event, policy: OffloadPolicy) -> str | None:
        """Run one ledger's machine from ``event`` until it is Done (offload.shell, with this
        topic's steps); the machine's last error (None if the steps succeeded)."""
        info = self._info(ledger_id)
        if info is None:
            return None
        name = self.topic.name
        machine = LedgerOffload(ledger_id, info.offload, tier_uri=self.broker.tier.uri,
                                tenant=name.tenant, namespace=name.namespace_local_name,
                                topic=name.encoded_local_name, deletion_lag_ms=policy.deletion_lag_ms,
                                table=self.broker.lake is not None)
        shell = LedgerOffloadShell(machine, _TopicSteps(self, info), topic=self.ml_name,
                                   fatal=(ManagedLedgerFencedError, ManagedLedgerClosedError))
        await shell.run(event)
        if machine.table_error is not None:
            self.table_error = machine.table_error
            log.warning("lake commit failed topic=%s ledger=%d table=%s (the ledger is offloaded; the table is "
                        "repaired on a later pass): %s", self.ml_name, ledger_id, self.table_id.name,
                        machine.table_error)
        return machine.last_error

    # -- the steps of offload.shell (through _TopicSteps) ---------------------------------------
    async def record_step(self, ledger_id: int, expected: OffloadRecord, new: OffloadRecord) -> OffloadRecord:
        """CAS the ledger's offload record in the list; what is stored after (``new`` or the
        record found instead of ``expected``)."""
        def transform(current: OffloadRecord) -> OffloadRecord:
            if current != expected:
                raise _Conflict(current)
            return new
        try:
            # shielded: a worker cancelled by an unload must not cut a CAS in half (the
            # managed ledger's close waits for it on the metadata lock)
            await asyncio.shield(self.ml.update_offload(ledger_id, transform))
        except _Conflict as c:
            return c.record
        if new.state is OffloadState.BOOKIE_DELETED:
            log.info("offload: ledger deleted from bookies topic=%s ledger=%d uri=%s", self.ml_name,
                     ledger_id, new.uri)
        return new

    async def write_step(self, info: LedgerInfo, uri: str) -> ObjectStats:
        """Stream the ledger from the bookies into its object, under one of the broker's slots:
        the event loop reads it one bookie reply at a time into a pipe of at most
        ``read_ahead_bytes`` to a pool thread that encodes row groups (typed columns when the
        schema allows) and writes them to the object as it goes (multipart on S3); the object
        is committed only whole, else aborted. Memory: the pipe, a bookie reply, about a row
        group, the writer's queue and one upload part, whatever the ledger's size."""
        broker, ledger_id = self.broker, info.ledger_id
        key = broker.tier.key_of(uri)
        async with broker.slots:
            started = time.monotonic()
            log.info("offload start topic=%s ledger=%d entries=%d bytes=%d uri=%s", self.ml_name,
                     ledger_id, info.entries, info.size_bytes, uri)
            if info.size_bytes > broker.config.offload.ledger_bytes_max:
                raise OffloadError(f"ledger {ledger_id} has {info.size_bytes} bytes, more than "
                                   f"[offload] ledger_bytes_max {broker.config.offload.ledger_bytes_max}")
            typed_versions = await self._typed_versions(ledger_id)
            try:
                stats, pipe = await self._stream_to_tier(info, key, typed_versions)
            except TypedColumnsFailedError as e:
                log.warning("offload topic=%s ledger=%d: %s; read again, written without typed columns",
                            self.ml_name, ledger_id, e)
                stats, pipe = await self._stream_to_tier(info, key, None)
            elapsed = time.monotonic() - started
        broker.offloaded_bytes += info.size_bytes
        # who waited: the reads for the encoder (read_wait_s) or the encoder for the reads
        log.info("offload written topic=%s ledger=%d rows=%d object_bytes=%d seconds=%.3f MBps=%.1f "
                 "pipe_bytes_max=%d read_wait_s=%.3f encode_wait_s=%.3f", self.ml_name, ledger_id, stats.rows,
                 stats.size_bytes, elapsed, info.size_bytes / 1e6 / max(elapsed, 1e-9), pipe.bytes_held_max,
                 pipe.put_wait_s, pipe.take_wait_s)
        return stats

    async def _stream_to_tier(self, info: LedgerInfo, key: str, typed_versions) -> tuple[ObjectStats, EntryPipe]:
        """One attempt of write_step's stream: the bookie reads here, the encoder in the pool."""
        broker, ledger_id = self.broker, info.ledger_id
        pipe = EntryPipe(broker.config.offload.read_ahead_bytes)
        typed_counts: dict[str, int] = {}     # filled in the worker thread, merged here

        def encode() -> ObjectStats:
            try:
                return encode_and_upload(broker.tier, key, ledger_id, pipe, partition=self.partition,
                                         row_group_bytes=broker.config.offload.row_group_bytes,
                                         uncompressed_bytes_max=broker.config.message_bytes_max,
                                         typed_versions=typed_versions, topic=self.ml_name,
                                         counters=typed_counts, entries_expected=info.entries)
            finally:
                pipe.stop()

        encoding = asyncio.ensure_future(broker.run(encode))
        try:
            await self._read_from_bookies(info, pipe)
            pipe.close()
        except BaseException as e:
            pipe.fail(e)            # the encoder stops reading, aborts the upload and returns
            if isinstance(e, PipeStoppedError):
                await encoding          # the encoder's own failure, raised here, says why
                raise OffloadError(f"ledger {ledger_id}: the encoder finished before the last entry") from None
            encoding.add_done_callback(lambda f: f.cancelled() or f.exception())
            if not isinstance(e, asyncio.CancelledError):
                await asyncio.wait([encoding])    # its upload aborted before this step fails
            raise
        stats = await encoding
        for name, n in typed_counts.items():
            broker.typed_counters[name] = broker.typed_counters.get(name, 0) + n
        return stats, pipe

    async def verify_step(self, info: LedgerInfo, uri: str, stats: ObjectStats) -> None:
        async with self.broker.slots:
            await self.broker.run(verify_object, self.broker.tier, self.broker.tier.key_of(uri), stats,
                                  info.entries)

    async def delete_object_step(self, uri: str) -> None:
        key = self.broker.tier.key_of(uri)
        await self.broker.run(self.broker.tier.delete, key)
        self.broker.cache.forget(key)

    async def delete_from_bookies_step(self, ledger_id: int) -> None:
        # invariant 6: the machine asks only from ``offloaded``, after a fresh verification
        current = self._info(ledger_id)
        check(current is not None and current.offload.state is OffloadState.OFFLOADED,
              f"{self.ml_name}: bookie delete of ledger {ledger_id} that is not offloaded: {current}")
        try:
            await self.broker.ledger_client.delete_ledger(ledger_id)
        except MetadataNotFoundError:
            pass                  # deleted before a crash; the record had not followed

    async def _typed_versions(self, ledger_id: int) -> tuple[tuple[int, str, str], ...] | None:
        """The topic's live schema versions when every one is AVRO or JSON (typed columns), else
        None; read before the ledger's entries, so every row of this closed ledger was written
        under one of them. A registry that cannot be read fails the step (retried)."""
        if not self.broker.config.offload.typed_columns:
            return None
        stored = await self.topic.service.schemas.all_versions(self.topic.name)
        if not stored or any(s.definition.type not in ("AVRO", "JSON") for s in stored):
            return None
        try:
            versions = tuple((s.version, s.definition.type, s.definition.data.decode("utf-8")) for s in stored)
        except UnicodeDecodeError:
            log.warning("offload topic=%s ledger=%d: a schema definition is not UTF-8: no typed columns",
                        self.ml_name, ledger_id)
            return None
        log.info("offload topic=%s ledger=%d: typed columns from schema versions %s", self.ml_name, ledger_id,
                 [v for v, _, _ in versions])
        return versions

    async def _read_from_bookies(self, info: LedgerInfo, pipe: EntryPipe) -> None:
        """The closed ledger's entries, in order, into ``pipe``, one bookie reply at a time
        (``LedgerReader.read_some``: bounded in bytes by the bookie, whatever the entries'
        sizes), each read once the pipe has room (back-pressure from the encoder)."""
        ledger_id, entries = info.ledger_id, info.entries
        reader = await self.broker.ledger_client.open_ledger(ledger_id, recovery=False)
        if reader.last_readable_entry_id != entries - 1:
            raise OffloadError(f"ledger {ledger_id}: bookies have entries up to {reader.last_readable_entry_id}, "
                               f"the list says {entries}")
        first = 0
        while first < entries:
            got = [(e.entry_id, bytes(e.payload)) for e in await reader.read_some(first, entries - 1)]
            if not got or [e for e, _ in got] != list(range(first, first + len(got))):
                raise OffloadError(f"ledger {ledger_id}: read entries {got[0][0] if got else None}.."
                                   f"{got[-1][0] if got else None}, expected {first} on")
            await pipe.put(got)
            first += len(got)

    # -- the table ([lakehouse]) ---------------------------------------------------------------
    def offloaded_objects(self) -> dict[int, str]:
        """Ledger id -> object URI of the list's offloaded / bookie-deleted ledgers."""
        return {i.ledger_id: i.offload.uri for i in self.ml.ledgers()
                if i.offload.uri and i.offload.state in (OffloadState.OFFLOADED, OffloadState.BOOKIE_DELETED)}

    async def sync_table(self, leaving: Sequence[int] = ()) -> None:
        """Make the table's files of this topic (partition) exactly the offloaded objects of the
        list, minus the ledgers retention is trimming (``leaving`` added to them). Under the
        topic's table lock, so a pass's repair never re-adds what retention just took out."""
        lake = self.broker.lake
        if lake is None:
            return
        async with self._table_lock:
            in_list = {i.ledger_id for i in self.ml.ledgers()}
            self.leaving = {i for i in self.leaving if i in in_list} | set(leaving)
            offloaded = self.offloaded_objects()
            state = (frozenset(offloaded.items()), frozenset(self.leaving))
            if state == self._table_synced:
                return                    # the table was made exactly this by us: nothing to read
            await self.broker.run(lake.sync, self.table_id, offloaded, tuple(self.leaving),
                                  prefix=self.object_prefix, topic=self.ml_name, now_ms=self.broker.clock())
            self._table_synced = state
            self.table_error = ""

    async def merge_table_files(self) -> bool:
        """At most one merge of small files of the topic's table (offload/lake_merge.py:
        ``lake_merge_target_bytes``, ``lake_merge_files_min``), in the pool, under the table
        lock (retention's sync waits: no ledger leaves meanwhile). True if one was committed."""
        lake, cfg = self.broker.lake, self.broker.config.offload
        if lake is None or cfg.lake_merge_target_bytes <= 0:
            return False
        async with self._table_lock:
            offloaded = self.offloaded_objects()
            ledgers = [LedgerObject(i.ledger_id,
                                    offloaded.get(i.ledger_id) if i.ledger_id not in self.leaving else None,
                                    i.offload.stats.size_bytes if i.offload.stats is not None else 0,
                                    None if i.offload.stats is None else
                                    ledger_day(i.offload.stats.min_publish_time_ms, i.offload.stats.max_publish_time_ms))
                       for i in self.ml.ledgers() if i.entries > 0]    # empty ledgers are never offloaded
            done = await self.broker.run(merge_once, lake, self.broker.tier, self.table_id, ledgers,
                                         object_prefix=self.object_prefix, topic=self.ml_name,
                                         target_bytes=cfg.lake_merge_target_bytes, files_min=cfg.lake_merge_files_min,
                                         file_bytes_max=cfg.lake_merge_file_bytes_max,
                                         row_group_bytes=cfg.row_group_bytes, now_ms=self.broker.clock())
            return done is not None

    async def _merge_table_files(self) -> None:
        """``merge_table_files`` from a pass: a failure is logged and the next attempt waits
        ``retry_delay_ms_max`` (a merge is never urgent; files that cannot be merged, e.g. columns
        whose types do not unify, are not read again on every pass)."""
        if self.broker.clock() < self._merge_not_before_ms:
            return
        try:
            await self.merge_table_files()
        except (asyncio.CancelledError, ManagedLedgerFencedError, ManagedLedgerClosedError):
            raise
        except Exception as e:     # noqa: BLE001 - the table stays as it was; tried again later
            delay_ms = self.broker.config.offload.retry_delay_ms_max
            self._merge_not_before_ms = self.broker.clock() + delay_ms
            self.table_error = f"merge: {type(e).__name__}: {e}"
            log.warning("lake merge failed topic=%s table=%s (next attempt in %d s): %s", self.ml_name,
                        self.table_id.name, delay_ms // 1000, e)

    async def _sweep_merged(self) -> None:
        try:
            await self.broker.run(sweep_merged, self.broker.lake, self.broker.tier, self.table_id, self.prefix,
                                  now_ms=self.broker.clock(), topic=self.ml_name)
        except Exception as e:     # noqa: BLE001 - nothing deleted; tried again on a later sweep
            log.warning("lake merged-object sweep failed topic=%s: %s", self.ml_name, e)

    async def remove_from_table(self) -> None:
        """Topic deletion: this topic's files leave the table (a non-partitioned topic's table is
        dropped), before the objects are deleted."""
        lake = self.broker.lake
        if lake is None:
            return
        async with self._table_lock:
            self._table_synced = None
            if self.partition < 0:
                await self.broker.run(lake.drop, self.table_id)
            else:
                await self.broker.run(lake.sync, self.table_id, {}, prefix=self.object_prefix, topic=self.ml_name)

    # -- orphans -------------------------------------------------------------------------------
    async def sweep_orphans(self) -> list[str]:
        """Delete our objects under the topic's prefix that no record of the list names (a
        deposed owner's late write, a ledger trimmed away). Runs in the worker, so no attempt of
        ours is between its write and its record; other brokers cannot record (fenced)."""
        broker = self.broker
        keys = await broker.run(broker.tier.list, self.prefix)
        records = [i.offload for i in self.ml.ledgers()]
        objects = [ListedObject(broker.tier.uri_of(k), 0) for k in keys]
        orphans = orphan_objects(objects, records, now_ms=broker.clock(), grace_ms=0)
        for uri in orphans:
            await broker.run(broker.tier.delete, broker.tier.key_of(uri))
            log.info("offload: orphan object deleted topic=%s uri=%s", self.ml_name, uri)
        return orphans


# -- per broker ----------------------------------------------------------------------------------
class BrokerOffloader:
    """The tier of one broker: object store, thread pool, concurrency bound, read cache, and
    one TopicOffloader per loaded topic. Create with ``BrokerOffloader.create(...)`` (None when
    no tier is configured)."""

    def __init__(self, config, ledger_client, policies, tier: Tier,
                 clock: Callable[[], int] | None = None, *, store=None) -> None:
        self.config = config
        self.store = store
        self.ledger_client = ledger_client
        self.policies = policies
        self.tier = tier
        self.clock = clock or (lambda: int(time.time() * 1000))
        offload = config.offload
        self._pool = ThreadPoolExecutor(max_workers=offload.concurrent_max + offload.tier_read_ahead_ledgers + 1,
                                        thread_name_prefix="offload")
        self.slots = asyncio.Semaphore(offload.concurrent_max)
        self.cache = TierReadCache(tier, self.run, offload.tier_read_cache_bytes_max)
        self.topics: dict[str, TopicOffloader] = {}
        self.lake: Lake | None = (Lake(tier.uri, offload.lake_catalog_uri, s3_endpoint_url=offload.tier_s3_endpoint_url,
                                       snapshot_retention_ms=offload.lake_snapshot_retention_ms,
                                       partition=offload.lake_partition)
                                  if offload.lake_enabled else None)
        self._timer: asyncio.Task | None = None
        self.offloaded_bytes = 0
        # typed columns written ([schema]): values decoded, undecodable ones, unconvertible fields
        self.typed_counters: dict[str, int] = {}

    def totals(self) -> dict[str, int]:
        """Running totals for the broker's metrics (pulsarlite_offloaded_bytes, ...typed...)."""
        return {"offloaded_bytes": self.offloaded_bytes, **self.typed_counters}

    @classmethod
    def create(cls, config, ledger_client, policies, *, store=None) -> "BrokerOffloader | None":
        if not config.offload.tier_uri:
            return None
        return cls(config, ledger_client, policies, Tier(config.offload.tier_uri, config.offload.tier_s3_endpoint_url),
                   store=store)

    async def run(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` in the pool (off the event loop)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def start(self) -> None:
        if self._timer is None:
            self._timer = asyncio.ensure_future(self._timer_loop())

    async def _timer_loop(self) -> None:
        interval = self.config.offload.check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            for t in list(self.topics.values()):
                t.kick()

    async def policy_of(self, namespace: str, topic_name=None) -> OffloadPolicy:
        """The namespace's offload policy (the broker's deletion lag when unset), overridden by
        the topic's ``offloadPolicies`` fields that are set."""
        lag = self.config.offload.deletion_lag_ms
        try:
            p = await self.policies.get_namespace_policies(namespace)
        except Exception:        # noqa: BLE001 - no namespace policies: defaults
            policy = OffloadPolicy(deletion_lag_ms=lag)
        else:
            threshold_s = p.offload_threshold_s
            policy = OffloadPolicy(threshold_bytes=p.offload_threshold_bytes,
                                   threshold_ms=-1 if threshold_s < 0 else threshold_s * 1000,
                                   deletion_lag_ms=lag if p.offload_deletion_lag_ms is None
                                   else p.offload_deletion_lag_ms)
        if topic_name is not None and self.store is not None:
            own = await read_topic_offload_policies(self.store, topic_name)
            if own is not None:
                policy = own.applied_to(policy)
        return policy

    # -- topics --------------------------------------------------------------------------------
    def attach(self, topic: OffloadedTopic) -> TopicOffloader:
        """A topic was loaded here: tier reads and the offload worker (which resumes what a
        previous owner left half done)."""
        ml = topic.ml
        ml.tier_reader = functools.partial(self._tier_read, ml)
        offloader = TopicOffloader(self, topic)
        old = self.topics.pop(topic.key, None)
        if old is not None:
            asyncio.ensure_future(old.close())
        self.topics[topic.key] = offloader
        ml.rollover_listeners.append(lambda ledger_id: offloader.kick())
        prefix = offloader.prefix
        ml.before_delete.append(offloader.remove_from_table)       # the table first, then the objects
        ml.before_delete.append(lambda: self.delete_topic_objects(prefix, ml.metadata.ledgers))
        ml.before_delete.append(functools.partial(self._forget_topic_policies, topic.name))
        return offloader

    async def _tier_read(self, ml, info: LedgerInfo, first: int, last: int) -> list[tuple[int, bytes]]:
        # read ahead: the first row groups of the next offloaded ledgers (a replay goes on there),
        # started before this read so that their fetches overlap it
        ahead = self.config.offload.tier_read_ahead_ledgers
        for nxt in ml.ledgers():
            if ahead <= 0:
                break
            if nxt.ledger_id <= info.ledger_id or nxt.entries == 0:
                continue
            if nxt.offload.state not in (OffloadState.OFFLOADED, OffloadState.BOOKIE_DELETED):
                break
            self.cache.prefetch(nxt)
            ahead -= 1
        return await self.cache.read(info, first, last)

    async def detach(self, key: str) -> None:
        offloader = self.topics.pop(key, None)
        if offloader is not None:
            await offloader.close()

    def status(self, key: str) -> dict[str, Any]:
        t = self.topics.get(key)
        return t.status() if t is not None else {"status": OffloadStatus.NOT_RUN.value, "lastError": ""}

    async def delete_topic_objects(self, prefix: str, ledgers: Sequence[LedgerInfo]) -> int:
        """Before a topic's ledgers and list go (ManagedLedger.delete, after it closed as the
        owner): delete every object the list names and every object under the topic's prefix.
        A crash midway leaves the list; deleting the topic again finishes."""
        keys: set[str] = set()
        for i in ledgers:
            if i.offload.uri:
                try:
                    keys.add(self.tier.key_of(i.offload.uri))
                except OffloadError:
                    log.warning("offload: object %s is outside the tier; left alone", i.offload.uri)
        keys.update(await self.run(self.tier.list, prefix))
        for key in sorted(keys):
            await self.run(self.tier.delete, key)
        self.cache.forget(prefix)
        log.info("offload: objects of deleted topic removed prefix=%s objects=%d", prefix, len(keys))
        return len(keys)

    async def _forget_topic_policies(self, topic_name) -> None:
        if self.store is None:
            return
        try:
            await self.store.delete(topic_policies_path(topic_name.managed_ledger_name))
        except MetadataNotFoundError:
            pass

    async def before_trim(self, key: str, ledger_ids: Sequence[int]) -> None:
        """Retention is about to trim ``ledger_ids`` of the topic ``key``: their files leave the
        table first (a new snapshot). Raises if the table cannot be updated (do not trim now)."""
        offloader = self.topics.get(key)
        if self.lake is None or offloader is None or not ledger_ids:
            return
        await offloader.sync_table(leaving=ledger_ids)

    async def lake_info(self, name) -> dict[str, Any]:
        """The admin ``.../lake`` answer for a topic (or a partitioned topic's base name)."""
        check(self.lake is not None, "lake_info without a lake")
        tid = TableId.of_topic(name.tenant, name.namespace_local_name, name.encoded_local_name)
        out = await self.run(self.lake.info, tid)
        loaded = self.topics.get(str(name))
        out["lastError"] = loaded.table_error if loaded is not None else ""
        return out

    async def delete_object(self, ledger_id: int, uri: str) -> None:
        """Delete the object of a ledger leaving the list (retention: ``ManagedLedger.
        trim_ledgers(ids, delete_offloaded=offloader.delete_object)``); absent is fine."""
        key = self.tier.key_of(uri)
        await self.run(self.tier.delete, key)
        self.cache.forget(key)
        log.info("offload: object deleted ledger=%d uri=%s", ledger_id, uri)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for key in list(self.topics):
            await self.detach(key)
        self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["BrokerOffloader", "OffloadError", "OffloadStatus", "TopicOffloadPolicies", "read_topic_offload_policies",
           "TopicOffloader", "ledger_views", "ledgers_before", "topic_prefix"]
