"""The managed cursor (asyncio shell): a :class:`~broker.cursor.core.CursorState` persisted in
ZooKeeper at ``/managed-ledgers/<ml name>/<cursor name>`` (a child of the managed ledger's
znode, docs/protocol.md#zookeeper-layout), as the JSON of ``CursorState.to_json``.

- **Open** creates the znode (the managed ledger's znode must exist) or loads it: an existing
  cursor keeps its stored position; ``initial`` applies only to a new one.
- **Acks** change the core at once (synchronously) and schedule a write. Writes are debounced:
  at most one is in flight, acks meanwhile coalesce into the next one, and an ack is written at
  most ``persist_delay_ms`` (plus the write time) after it. :meth:`ManagedCursor.flush` writes
  now (close, tests).
- **Only the owner writes**, always compare-and-set at the version it read or wrote last. A
  version conflict (that was not our own write whose answer was lost) or the znode gone means
  someone else owns the topic now: the cursor is FENCED, and every later ack or flush raises
  :class:`CursorFencedError` (a ManagedLedgerFencedError: the broker drops ownership).
- Connection loss is retried (bounded: ``persist_attempts_max``); if a background write still
  fails, the error is kept, raised by the next :meth:`flush`, and the write is retried on the
  next ack.
- **Non-durable** cursors (readers) never touch ZooKeeper.
- A stored cursor nobody has loaded (an idle subscription) is read by :func:`stored_mark_delete`
  and moved by :func:`advance_stored_cursor` (retention: TTL, backlog quotas), one
  compare-and-set at the version read, so an owner that loads it meanwhile fences nothing.

Cursor names are URL-encoded into the znode name (``/`` and other odd characters are allowed
in subscription names, like Pulsar's ``Codec.encode``); :func:`list_cursors` decodes them.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Callable, Iterable, Sequence

from broker.cursor.core import CursorConfig, CursorState, LedgersArg
from broker.managed_ledger.core import ManagedLedgerError, ManagedLedgerFencedError, Position
from broker.managed_ledger.store import ManagedLedgerStore
from pulsarlite.errors import MetadataError, MetadataNotFoundError, MetadataVersionConflict
from pulsarlite.metadata import MetadataExistsError, MetadataStore
from pulsarlite.metadata_layout import cursor_path, decode_cursor_name, managed_ledger_path

log = logging.getLogger("pulsarlite.cursor")


# -- errors ----------------------------------------------------------------------------------------
class CursorError(ManagedLedgerError):
    """A cursor operation failed (retriable: ZooKeeper trouble)."""

    retriable = True


class CursorFencedError(ManagedLedgerFencedError):
    """Someone else wrote or deleted the cursor: another broker owns the topic now."""

    retriable = False


class CursorClosedError(CursorError):
    """The cursor is closed or deleted."""

    retriable = False


class ManagedCursorState(enum.Enum):
    OPEN = "OPEN"
    FENCED = "FENCED"
    CLOSED = "CLOSED"
    DELETED = "DELETED"


# names and paths (encode_cursor_name, decode_cursor_name, cursor_path): pulsarlite/metadata_layout.py


def _metadata_store(store: MetadataStore | ManagedLedgerStore | None) -> MetadataStore | None:
    return store.store if isinstance(store, ManagedLedgerStore) else store


async def list_cursors(store: MetadataStore | ManagedLedgerStore, managed_ledger_name: str) -> list[str]:
    """The names of the durable cursors of a managed ledger (sorted by znode name)."""
    md_store = _metadata_store(store)
    return [decode_cursor_name(n) for n in await md_store.children(managed_ledger_path(managed_ledger_name))]


# -- stored cursors nobody has loaded (retention, admin) ---------------------------------------------
async def stored_mark_delete(store: MetadataStore | ManagedLedgerStore, managed_ledger_name: str,
                             cursor_name: str) -> Position | None:
    """The mark-delete position a stored cursor records; None if it is not stored. ValueError if
    its znode is malformed (``CursorState.from_bytes``)."""
    got = await _metadata_store(store).get_or_none(cursor_path(managed_ledger_name, cursor_name))
    return None if got is None else CursorState.from_bytes(got[0]).mark_delete


async def stored_cursors(store: MetadataStore | ManagedLedgerStore, managed_ledger_name: str, *,
                         ledgers: LedgersArg = None) -> dict[str, CursorState | None]:
    """Every stored cursor of a managed ledger as its state (None: its znode is malformed), for
    the stats of subscriptions nobody has loaded; one deleted meanwhile is left out."""
    md_store = _metadata_store(store)
    out: dict[str, CursorState | None] = {}
    for name in await list_cursors(md_store, managed_ledger_name):
        got = await md_store.get_or_none(cursor_path(managed_ledger_name, name))
        if got is None:
            continue
        try:
            out[name] = CursorState.from_bytes(got[0], ledgers=ledgers)
        except ValueError:
            out[name] = None
    return out


async def advance_stored_cursor(store: MetadataStore | ManagedLedgerStore, managed_ledger_name: str,
                                cursor_name: str, position: Position, *, ledgers: LedgersArg = None,
                                still_idle: Callable[[], bool] = lambda: True) -> bool:
    """Move a stored cursor that no subscription has loaded forward to ``position`` (a cumulative
    ack, never back), by one compare-and-set at the version read: True if moved. False, nothing
    written, when it is not stored, is malformed, is at or past ``position`` already,
    ``still_idle()`` turns False once it is read (a consumer came and loaded it), or the write
    write failed (someone changed it meanwhile, or ZooKeeper trouble: the caller tries again on
    its next pass). A MetadataError reading it is raised."""
    md_store = _metadata_store(store)
    path = cursor_path(managed_ledger_name, cursor_name)
    got = await md_store.get_or_none(path)
    if got is None or not still_idle():
        return False
    data, version = got
    try:
        state = CursorState.from_bytes(data, ledgers=ledgers)
    except ValueError:
        return False
    if state.mark_delete >= position or not state.ack_cumulative(position):
        return False
    try:
        await md_store.set(path, state.to_bytes(), version)
    except MetadataError as e:      # changed meanwhile (a consumer came), or ZooKeeper trouble
        log.info("stored cursor %s not moved to %s: %s", path, position, e)
        return False
    return True


# -- the cursor ------------------------------------------------------------------------------------
class ManagedCursor:
    """See the module docstring. Create with ``await ManagedCursor.open(...)``; use from one loop."""

    def __init__(self, store: MetadataStore | None, managed_ledger_name: str, cursor_name: str,
                 core: CursorState, version: int, *, durable: bool, config: CursorConfig) -> None:
        self._store = store
        self.managed_ledger_name = managed_ledger_name
        self.name = cursor_name
        self.durable = durable
        self._core = core
        self._config = config
        self._version = version
        self._path = cursor_path(managed_ledger_name, cursor_name)
        self._state = ManagedCursorState.OPEN
        self._changes = 0           # counts state changes; compared with _changes_written
        self._changes_written = 0
        self._write_lock = asyncio.Lock()
        self._persist_task: asyncio.Task | None = None
        self._error: BaseException | None = None   # why the last background write failed
        self.writes = 0              # znode writes done by this instance (stats, tests)

    @classmethod
    async def open(cls, store: MetadataStore | ManagedLedgerStore | None, managed_ledger_name: str,
                   cursor_name: str, *, initial: Position, durable: bool = True, ledgers: LedgersArg = None,
                   config: CursorConfig | None = None) -> "ManagedCursor":
        """Create (at ``initial``: the mark-delete position of a new cursor) or load the cursor.
        ``ledgers``: callable returning the managed ledger's list (``ManagedLedger.ledgers``).
        Raises MetadataNotFoundError if the managed ledger's znode does not exist, ValueError if
        the stored cursor is malformed, MetadataError if ZooKeeper is unreachable."""
        config = (config or CursorConfig()).validate()
        md_store = _metadata_store(store)
        path = cursor_path(managed_ledger_name, cursor_name)
        if not durable:
            core = CursorState(initial, ledgers=ledgers, config=config)
            return cls(None, managed_ledger_name, cursor_name, core, -1, durable=False, config=config)
        if md_store is None:
            raise ValueError("a durable cursor needs a metadata store")
        for _ in range(config.persist_attempts_max):
            got = await md_store.get_or_none(path)
            if got is not None:
                data, version = got
                try:
                    core = CursorState.from_bytes(data, ledgers=ledgers, config=config)
                except ValueError as e:
                    err = MetadataError(f"cursor {managed_ledger_name}/{cursor_name}: {path}: {e}")
                    err.retriable = False
                    raise err from None
                log.info("cursor %s/%s loaded at %s (version %d)", managed_ledger_name, cursor_name,
                         core.mark_delete, version)
                return cls(md_store, managed_ledger_name, cursor_name, core, version, durable=True, config=config)
            core = CursorState(initial, ledgers=ledgers, config=config)
            try:
                await md_store.create(path, core.to_bytes(), make_parents=False)
            except MetadataExistsError:
                continue   # created concurrently: load it
            except MetadataNotFoundError:
                raise MetadataNotFoundError(
                    f"cursor {cursor_name}: managed ledger {managed_ledger_name} does not exist") from None
            log.info("cursor %s/%s created at %s", managed_ledger_name, cursor_name, initial)
            cursor = cls(md_store, managed_ledger_name, cursor_name, core, 0, durable=True, config=config)
            cursor.writes = 1
            return cursor
        raise CursorError(f"cursor {managed_ledger_name}/{cursor_name}: created and deleted concurrently, gave up")

    # -- queries (delegated to the core) --------------------------------------------------------
    @property
    def state(self) -> ManagedCursorState:
        return self._state

    @property
    def fenced(self) -> bool:
        return self._state is ManagedCursorState.FENCED

    @property
    def core(self) -> CursorState:
        return self._core

    @property
    def version(self) -> int:
        """The znode version last read or written (-1 for a non-durable cursor)."""
        return self._version

    @property
    def mark_delete_position(self) -> Position:
        return self._core.mark_delete

    @property
    def read_position(self) -> Position:
        return self._core.read_position

    @property
    def individually_acked(self) -> list[tuple[int, int, int]]:
        return self._core.individually_acked

    def is_acked(self, position: Position) -> bool:
        return self._core.is_acked(position)

    def acked_in_run(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> set[int]:
        return self._core.acked_in_run(ledger_id, first_entry_id, last_entry_id)

    def unacked_in(self, positions: Iterable[Position]) -> list[Position]:
        return self._core.unacked_in(positions)

    def remaining_batch_indexes(self, position: Position, batch_size: int) -> set[int] | None:
        return self._core.remaining_batch_indexes(position, batch_size)

    def remaining_ack_set(self, position: Position, batch_size: int) -> list[int] | None:
        return self._core.remaining_ack_set(position, batch_size)

    def backlog(self, last_confirmed: Position, ledgers: Sequence | None = None) -> int:
        return self._core.backlog(last_confirmed, ledgers)

    @property
    def last_error(self) -> BaseException | None:
        """Why the last background write failed (None after a successful write)."""
        return self._error

    @property
    def dirty(self) -> bool:
        """True if some change is not written yet."""
        return self._changes != self._changes_written

    # -- changes ----------------------------------------------------------------------------
    def ack_individual(self, position: Position, *, batch_index: int | None = None,
                       batch_size: int | None = None) -> bool:
        """Ack one entry (or one batch index); persisted soon. InvalidAckError: nothing changed."""
        self._check_writable()
        return self._changed(self._core.ack_individual(position, batch_index=batch_index, batch_size=batch_size))

    def ack_entries(self, positions: Iterable[Position]) -> tuple[list[Position], list[tuple[Position, Exception]]]:
        """Individual acks of whole entries as one run (see CursorState.ack_entries): (newly
        acked, refused with their InvalidAckError); persisted soon."""
        self._check_writable()
        acked, refused = self._core.ack_entries(positions)
        self._changed(bool(acked))
        return acked, refused

    def ack_set(self, position: Position, words: Sequence[int], batch_size: int | None = None) -> bool:
        """Ack a batched entry from a wire ack_set (a set bit = not acked; batch_size optional)."""
        self._check_writable()
        return self._changed(self._core.ack_set(position, words, batch_size))

    def ack_cumulative(self, position: Position, *, batch_index: int | None = None,
                       batch_size: int | None = None, ack_set: Sequence[int] | None = None) -> bool:
        """Ack every entry up to ``position`` (see CursorState.ack_cumulative: a batch index or
        a wire ack_set stops it inside the batch); persisted soon. InvalidAckError: nothing changed."""
        self._check_writable()
        return self._changed(self._core.ack_cumulative(position, batch_index=batch_index, batch_size=batch_size,
                                                       ack_set=ack_set))

    def reset(self, position: Position) -> None:
        """Seek: ``position`` is delivered next (see CursorState.reset); persisted soon."""
        self._check_writable()
        self._core.reset(position)
        self._changed(True)

    def set_ledgers(self, ledgers: LedgersArg) -> None:
        """A new ledger list (or callable): mark_delete may advance across a ledger boundary."""
        before = (self._core.mark_delete, self._core.range_count)
        self._core.set_ledgers(ledgers)
        if self._state is ManagedCursorState.OPEN:
            self._changed((self._core.mark_delete, self._core.range_count) != before)

    def _check_writable(self) -> None:
        if self._state is ManagedCursorState.FENCED:
            raise CursorFencedError(f"cursor {self._path}: fenced (another owner wrote or deleted it)")
        if self._state is not ManagedCursorState.OPEN:
            raise CursorClosedError(f"cursor {self._path}: {self._state.value.lower()}")

    def _changed(self, changed: bool) -> bool:
        if changed:
            self._changes += 1
            if self.durable:
                self._schedule_persist()
        return changed

    # -- persistence ------------------------------------------------------------------------
    def _schedule_persist(self) -> None:
        if self._persist_task is None or self._persist_task.done():
            self._persist_task = asyncio.get_running_loop().create_task(
                self._persist_loop(), name=f"cursor-persist {self._path}")
            self._persist_task.add_done_callback(self._persist_done)

    async def _persist_loop(self) -> None:
        """Wait the debounce delay, write; again while changes arrived meanwhile."""
        while self.dirty and self._state is ManagedCursorState.OPEN:
            await asyncio.sleep(self._config.persist_delay_ms / 1000)
            try:
                await self._write()
            except CursorFencedError:
                return
            except Exception as e:   # kept for flush(); retried at the next ack
                self._error = e
                log.warning("cursor %s: write failed, will retry at the next change: %s", self._path, e)
                return

    def _persist_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._error = task.exception()
            log.error("cursor %s: persist task died", self._path, exc_info=task.exception())

    async def _write(self) -> None:
        """Write the current state (if not written yet) at our version; one write at a time."""
        async with self._write_lock:
            if self._state is ManagedCursorState.FENCED:
                raise CursorFencedError(f"cursor {self._path}: fenced")
            if self._state is not ManagedCursorState.OPEN or not self.dirty:
                return
            changes = self._changes
            data = self._core.to_bytes()
            await self._cas(data)
            self._changes_written = changes
            self._error = None
            self.writes += 1

    async def _cas(self, data: bytes) -> None:
        attempts = self._config.persist_attempts_max
        for attempt in range(attempts):
            try:
                self._version = await self._store.set(self._path, data, self._version)
                return
            except MetadataVersionConflict:
                if await self._written_by_us(data):
                    return
                raise self._fence(f"changed by someone else (expected version {self._version})") from None
            except MetadataNotFoundError:
                raise self._fence("deleted by someone else") from None
            except MetadataError as e:
                if not e.retriable or attempt + 1 >= attempts:
                    raise
                log.warning("cursor %s: write failed (attempt %d): %s", self._path, attempt + 1, e)
                await asyncio.sleep(min(0.05 * 2 ** attempt, self._config.retry_backoff_ms_max / 1000))
                try:
                    if await self._written_by_us(data):
                        return
                except MetadataError:
                    continue
        raise CursorError(f"cursor {self._path}: not written after {attempts} attempts")

    async def _written_by_us(self, data: bytes) -> bool:
        """True if the znode holds ``data`` (our write went through, its answer was lost); FENCED
        if it holds something else at another version or is gone; False if still at our version."""
        got = await self._store.get_or_none(self._path)
        if got is None:
            raise self._fence("deleted by someone else")
        raw, version = got
        if raw == data and version == self._version + 1:
            self._version = version
            return True
        if version != self._version:
            raise self._fence(f"changed by someone else (version {version}, ours {self._version})")
        return False

    def _fence(self, why: str) -> CursorFencedError:
        if self._state is ManagedCursorState.OPEN:
            self._state = ManagedCursorState.FENCED
            log.warning("cursor %s fenced: %s", self._path, why)
        return CursorFencedError(f"cursor {self._path}: {why}: another owner has the topic")

    async def flush(self) -> None:
        """Write every change now (and wait for a write in flight). Raises CursorFencedError if
        fenced, MetadataError/CursorError if ZooKeeper could not be written."""
        if self._state is ManagedCursorState.FENCED:
            raise CursorFencedError(f"cursor {self._path}: fenced (another owner wrote or deleted it)")
        if not self.durable or self._state is not ManagedCursorState.OPEN:
            return
        await self._write()

    async def close(self) -> None:
        """Flush and close (idempotent). A fenced cursor closes without writing."""
        if self._state is not ManagedCursorState.OPEN:
            await self._stop_persist()
            return
        try:
            if self.durable:
                await self.flush()
        finally:
            if self._state is ManagedCursorState.OPEN:
                self._state = ManagedCursorState.CLOSED
            await self._stop_persist()

    async def delete(self) -> None:
        """Unsubscribe: delete the znode (at our version: if someone else changed it, FENCED and
        nothing deleted). Deleting a cursor already gone is fine."""
        if self._state is ManagedCursorState.DELETED:
            return
        self._check_writable()
        self._state = ManagedCursorState.CLOSED   # no more writes from here
        if self.durable:
            async with self._write_lock:   # a write in flight finishes first: our version is known
                await self._stop_persist()
                try:
                    await self._store.delete(self._path, self._version)
                except MetadataNotFoundError:
                    pass
                except MetadataVersionConflict:
                    self._state = ManagedCursorState.FENCED
                    raise CursorFencedError(f"cursor {self._path}: changed by someone else; not deleted") from None
        await self._stop_persist()
        self._state = ManagedCursorState.DELETED
        log.info("cursor %s deleted", self._path)

    async def _stop_persist(self) -> None:
        task, self._persist_task = self._persist_task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass

    def __repr__(self) -> str:
        return (f"ManagedCursor({self.managed_ledger_name}/{self.name}, {self._state.value}, "
                f"durable={self.durable}, {self._core!r})")


__all__ = ["CursorClosedError", "CursorError", "CursorFencedError", "ManagedCursor", "ManagedCursorState",
           "advance_stored_cursor", "list_cursors", "stored_cursors", "stored_mark_delete"]
