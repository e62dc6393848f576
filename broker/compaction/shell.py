"""The compaction shell: runs :class:`~broker.compaction.core.CompactionRun` against a loaded
topic (reads through its managed ledger, writes the compacted ledger, records the view), keeps
the per-topic status for the admin API, checks the namespaces' ``compactionThreshold``
periodically, and reads the compacted view for subscriptions with ``read_compacted``.

Order of one run (never another): phase one reads the topic up to the horizon fixed at the start
(through ``ManagedLedger.read_entries``: offloaded ledgers come from the tier as any reader's
do); phase two re-reads it and adds each retained entry to a new ledger, then closes it; one CAS
of the managed-ledger list records the new view and puts the previous compacted ledger on the
list of ledgers to delete; the ``__compaction`` cursor's mark-delete moves to the horizon (it
keeps every ledger after the horizon from retention, as a subscription does); the previous
compacted ledger is deleted (``trim_ledgers``: retried at the next trim after a crash). A failure
before the CAS deletes the new ledger; the old view stays.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING

from broker.compaction.core import (COMPACTION_CURSOR, CompactedEntry, CompactedView, CompactionError,
                                    CompactionRun, KeyedMessage, StatusBoard, ack_set_of,
                                    backlog_after_horizon_bytes, decode_compacted_entry,
                                    encode_compacted_entry, new_view_properties, should_compact)
from broker.cursor import ManagedCursor
from broker.managed_ledger import Position
from pulsarlite.errors import PulsarliteError
from pulsarlite.wire.entry import EntryFormatError, peek_metadata, unpack_entry

if TYPE_CHECKING:
    from broker.topic import PersistentTopic

log = logging.getLogger("pulsarlite.broker.compaction")

READ_BATCH_ENTRIES = 100
WRITING_PROPERTY = "pulsarlite.compaction.writing"    # the compacted ledger a run is writing


TEST_FAULT_POINT_ENV = "PULSARLITE_TEST_FAULT_POINT"
# the named points of a run where a test may kill the broker (see test_fault_point)
FAULT_POINTS = ("compaction.id_named", "compaction.writing_named", "compaction.view_recorded", "compaction.cursor_moved")


def test_fault_point(name: str) -> None:
    """TEST ONLY, off by default: if the environment variable PULSARLITE_TEST_FAULT_POINT names
    this point, the broker process ends at once (``os._exit(86)``: no cleanup, as kill -9), so a
    test reaches a crash between two steps of a run deterministically."""
    if os.environ.get(TEST_FAULT_POINT_ENV) == name:
        log.error("test fault point reached point=%s: the process exits", name)
        logging.shutdown()
        os._exit(86)


def _without_writing(properties: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in properties.items() if k != WRITING_PROPERTY}


def compacted_view(topic: "PersistentTopic") -> CompactedView | None:
    """The topic's recorded view (from its managed-ledger list: what any owner loads)."""
    try:
        return CompactedView.from_properties(topic.ml.metadata.properties)
    except ValueError as e:
        log.error("compaction: unreadable view topic=%s: %s", topic.key, e)
        return None


def _keyed(data: bytes) -> list[KeyedMessage]:
    meta, messages = unpack_entry(data)
    batched = meta.batched
    return [KeyedMessage(m.batch_index if batched else -1, None if m.null_key else m.key,
                         m.null_value or len(m.payload) == 0) for m in messages]


async def _entries(topic: "PersistentTopic", horizon: Position):
    """(position, data) of every entry from the first to ``horizon``, in order."""
    ml = topic.ml
    ledgers = ml.ledgers()
    if not ledgers:
        return
    position = topic.next_after(topic.earliest_mark_delete())
    while position <= horizon:
        got = await ml.read_entries(position, READ_BATCH_ENTRIES)
        if not got:
            return
        for p, data in got:
            if p > horizon:
                return
            yield p, data
        position = topic.next_after(got[-1][0])


async def compact_topic(topic: "PersistentTopic", *, keys_max: int) -> CompactedView | None:
    """One compaction of ``topic`` (see the module docstring); None if the topic is empty."""
    ml = topic.ml
    horizon = topic.last_position()
    if horizon.entry_id < 0:
        return None
    run = CompactionRun(horizon, keys_max=keys_max)
    previous = compacted_view(topic)
    # the cursor exists before anything is written: from now on it holds the ledgers
    await topic.create_stored_subscription(COMPACTION_CURSOR, topic.earliest_mark_delete())
    async for position, data in _entries(topic, horizon):            # phase one
        try:
            keyed = _keyed(data)
        except EntryFormatError as e:      # encrypted or unreadable: not in the view
            log.warning("compaction: entry skipped topic=%s position=%s: %s", topic.key, position, e)
            continue
        run.on_entry(position, keyed)
    retained = dict(run.end_reading())
    # the ledger is named in the list before it exists (a reserved id): a broker killed at any
    # point before the view is recorded leaves it named, and the next run deletes it (no orphan)
    ledger_id = await ml.reserve_side_ledger_id()
    writer = None
    written = 0
    try:
        leftover = ml.metadata.properties.get(WRITING_PROPERTY)
        stale = [int(leftover)] if leftover is not None and (previous is None or
                                                             int(leftover) != previous.ledger_id) else []
        await ml.update_properties(lambda p: {**p, WRITING_PROPERTY: str(ledger_id)},
                                   delete_ledger_ids=stale)
        test_fault_point("compaction.id_named")
        writer = await ml.create_side_ledger("compacted", ledger_id=ledger_id)
        test_fault_point("compaction.writing_named")
        if retained:                                                 # phase two
            async for position, data in _entries(topic, horizon):
                if position not in retained:
                    continue
                indexes = retained[position]
                if indexes is not None and len(indexes) == peek_metadata(data).message_count:
                    indexes = None           # the whole batch survives
                words = None if indexes is None else ack_set_of(indexes)
                await writer.add(encode_compacted_entry(position, words, data))
                written += 1
        await writer.close()
        run.written()
        view = CompactedView(ledger_id, horizon, written)
        await ml.update_properties(lambda p: _without_writing(new_view_properties(p, view)),
                                   delete_ledger_ids=[previous.ledger_id] if previous else [])
    except BaseException as e:
        run.failed(repr(e))
        log.warning("compaction: failed topic=%s ledger=%d: %r (the previous view stays)",
                    topic.key, ledger_id, e)
        if writer is not None:
            try:
                await writer.close()
            except PulsarliteError:
                pass
        try:
            await ml.delete_side_ledger(ledger_id)
            if ml.metadata.properties.get(WRITING_PROPERTY) == str(ledger_id):
                await ml.update_properties(_without_writing)
        except Exception as de:   # noqa: BLE001 - still named: the next run deletes it
            log.warning("compaction: could not delete unrecorded ledger=%d topic=%s: %s",
                        ledger_id, topic.key, de)
        raise
    test_fault_point("compaction.view_recorded")
    run.recorded()
    topic.compacted_reader.forget()
    log.info("compaction: recorded topic=%s ledger=%d horizon=%s entries=%d keys=%d messages_read=%d",
             topic.key, view.ledger_id, horizon, written, len(run.keys_read()), run.messages_read)
    await _move_cursor(topic, horizon)
    test_fault_point("compaction.cursor_moved")
    if ml.trimmed_pending():
        await ml.trim_ledgers([])          # deletes the previous compacted ledger (recorded above)
    return view


async def _move_cursor(topic: "PersistentTopic", horizon: Position) -> None:
    """The ``__compaction`` cursor's mark-delete to the horizon (retention may then trim what
    is compacted, and keeps everything after it)."""
    try:
        cursor = await ManagedCursor.open(topic.service.store, topic.name.managed_ledger_name, COMPACTION_CURSOR,
                                          initial=topic.earliest_mark_delete(), durable=True,
                                          ledgers=topic.ml.ledgers)
        try:
            if cursor.mark_delete_position < horizon:
                cursor.ack_cumulative(horizon)
                await cursor.flush()
        finally:
            await cursor.close()
    except PulsarliteError as e:     # it only holds more than needed until the next run
        log.warning("compaction: cursor not moved topic=%s horizon=%s: %s", topic.key, horizon, e)


class CompactedReader:
    """Reads a topic's compacted ledger for ``read_compacted`` subscriptions: the first compacted
    entries at or after a position (binary search over the ledger; entries are in original
    order), or the one of a position."""

    def __init__(self, topic: "PersistentTopic") -> None:
        self.topic = topic
        self._positions: dict[tuple[int, int], Position] = {}    # (ledger, index) -> original position

    def forget(self) -> None:
        self._positions.clear()

    async def _read(self, view: CompactedView, first: int, last: int) -> list[CompactedEntry]:
        reader = await self.topic.ml.open_side_ledger(view.ledger_id)
        out = []
        for e in await reader.read(first, last):
            entry = decode_compacted_entry(bytes(e.payload))
            self._positions[(view.ledger_id, e.entry_id)] = entry.position
            out.append(entry)
        return out

    async def _position_at(self, view: CompactedView, index: int) -> Position:
        got = self._positions.get((view.ledger_id, index))
        if got is None:
            got = (await self._read(view, index, index))[0].position
            if len(self._positions) > 100_000:
                self._positions.clear()
        return got

    async def _lower_bound(self, view: CompactedView, position: Position) -> int:
        lo, hi = 0, view.entries
        while lo < hi:
            mid = (lo + hi) // 2
            if await self._position_at(view, mid) < position:
                lo = mid + 1
            else:
                hi = mid
        return lo

    async def read_from(self, view: CompactedView, position: Position, count_max: int) -> list[CompactedEntry]:
        start = await self._lower_bound(view, position)
        if start >= view.entries:
            return []
        return await self._read(view, start, min(view.entries, start + count_max) - 1)

    async def read_from_index(self, view: CompactedView, index: int) -> CompactedEntry:
        return (await self._read(view, index, index))[0]

    async def read_at(self, view: CompactedView, position: Position) -> CompactedEntry | None:
        got = await self.read_from(view, position, 1)
        return got[0] if got and got[0].position == position else None


class CompactionService:
    """Per broker: runs compactions (one at a time per topic; ``trigger`` refuses a second with
    CompactionRunningError, the admin API's 409), keeps their status, and every
    ``interval_ms`` compacts the owned topics whose namespace ``compactionThreshold`` is exceeded
    by the backlog after their horizon."""

    def __init__(self, service, *, interval_ms: int, keys_max: int) -> None:
        self.service = service
        self.interval_ms = interval_ms
        self.keys_max = keys_max
        self.board = StatusBoard()
        self._tasks: dict[str, asyncio.Task] = {}
        self._loop_task: asyncio.Task | None = None

    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.ensure_future(self._loop())

    async def close(self) -> None:
        tasks = [t for t in [self._loop_task, *self._tasks.values()] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loop_task = None
        self._tasks.clear()

    def trigger(self, topic: "PersistentTopic") -> None:
        """Start a compaction of ``topic`` in the background (CompactionRunningError if one runs)."""
        self.board.start(topic.key)
        task = asyncio.ensure_future(self._run(topic))
        self._tasks[topic.key] = task

    async def _run(self, topic: "PersistentTopic") -> None:
        error: str | None = None
        started = time.monotonic()
        try:
            await compact_topic(topic, keys_max=self.keys_max)
        except asyncio.CancelledError:
            error = "cancelled (broker closing or topic unloaded)"
            raise
        except Exception as e:     # noqa: BLE001 - reported through the status
            error = str(e) or type(e).__name__
            log.warning("compaction: error topic=%s: %r", topic.key, e)
        finally:
            self.board.finish(topic.key, error)
            self._tasks.pop(topic.key, None)
            log.info("compaction: finished topic=%s status=%s elapsed_s=%.3f", topic.key,
                     self.board.report(topic.key).status.value, time.monotonic() - started)

    async def wait(self, key: str) -> None:
        task = self._tasks.get(key)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def check_thresholds(self) -> list[str]:
        """One pass: trigger compaction where the threshold is exceeded; the keys triggered."""
        triggered = []
        for topic in self.service.loaded_topics():
            try:
                policies = await self.service.policies.get_namespace_policies(topic.name.namespace)
            except Exception:   # noqa: BLE001 - namespace gone: the topic goes with it
                continue
            threshold = policies.compaction_threshold_bytes
            if not threshold or topic.closing:
                continue
            view = compacted_view(topic)
            backlog = backlog_after_horizon_bytes(topic.ml.ledgers(), view.horizon if view else None)
            if should_compact(threshold, backlog, self.board.running(topic.key)):
                log.info("compaction: threshold exceeded topic=%s backlog_bytes=%d threshold_bytes=%d",
                         topic.key, backlog, threshold)
                try:
                    self.trigger(topic)
                except CompactionError as e:      # started meanwhile by the admin API
                    log.info("compaction: not triggered topic=%s: %s", topic.key, e)
                    continue
                triggered.append(topic.key)
        return triggered

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            try:
                await self.check_thresholds()
            except asyncio.CancelledError:
                raise
            except Exception as e:   # noqa: BLE001 - next pass
                log.warning("compaction: threshold pass failed: %r", e)


__all__ = ["CompactedReader", "CompactionError", "CompactionService", "compact_topic", "compacted_view"]
