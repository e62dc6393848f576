"""The tier as the broker uses it (blocking pieces run in the broker's thread pool): the store
adapter with keys relative to the tier URI (:class:`Tier`), the encoder with typed columns
(:func:`encode_and_upload`), the verification before ``offloaded`` and before a bookie delete
(:func:`verify_object`), and the bytes-bounded cache of rebuilt entries that serves reads of
offloaded ledgers (:class:`TierReadCache`), which reads objects with the one tier reader,
:class:`offload.reader.TierReader`.

API::

    tier = Tier(tier_uri, s3_endpoint_url)          # .uri, .uri_of(key), .key_of(uri), .put/.get/
                                                     # .size/.delete/.list(prefix), .store
    stats = encode_and_upload(tier, key, ledger_id, entries, partition=, row_group_bytes=,
                              uncompressed_bytes_max=None, typed_versions=None, topic="",
                              counters=None, entries_expected=None) -> ObjectStats
                                                     # streamed to store.open_writer(key)
    verify_object(tier, key, stats, entries)        # CorruptObjectError: bad, short or gone
    cache = TierReadCache(tier, run, bytes_max)     # run: await run(fn, *args) in a thread pool
    await cache.read(ledger_info, first, last) -> [(entry_id, entry bytes)]
    cache.prefetch(ledger_info); cache.forget(key_prefix)
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections import OrderedDict
from typing import Callable, Iterable, Sequence

import pyarrow as pa

from offload.core import ObjectStats
from offload.format import (ENTRY_UNCOMPRESSED_BYTES_MAX, REBUILD_COLUMNS, ROW_SCHEMA, TierChecksumError,
                            TierFormatError, table_to_entries)
from offload.reader import EncodedObject, TierReader, encode_ledger_to
from offload.reader import verify_object as verify
from offload.shell import CorruptObjectError, OffloadError
from offload.store import BackgroundObjectWriter, ObjectNotFoundError, open_object_store
from offload.typed_columns import TypedColumnsBuilder, TypedColumnsError
from pulsarlite.errors import PulsarliteError
from pulsarlite.ledger_list import LedgerInfo

log = logging.getLogger("pulsarlite.offload.tier")


# -- object store work (runs in the thread pool) -------------------------------------------------
WRITE_QUEUE_BYTES = 16 * 1024 * 1024     # encoded bytes an offload queues for its object writer's thread
_COUNTERS_LOCK = threading.Lock()


class TableTypedColumns:
    """The typed columns of the topic's struct schema ``versions`` ((version, kind, definition
    text), oldest first) for the offloader's encoder (``offload.reader.ExtraColumns``), decoded
    table by table (about a row group each), with the metadata that records what they were built
    from ([schema], offload/typed_columns.py). Values that do not decode become nulls (counted,
    logged); ``value`` keeps the bytes, so entries rebuild as before."""

    def __init__(self, versions, *, topic: str, ledger_id: int) -> None:
        """TypedColumnsError for a schema that cannot be columns (recursive records)."""

        self.builder = TypedColumnsBuilder(versions, ROW_SCHEMA.names)
        self.fields = [pa.field(name, f.type) for name, f in zip(self.builder.names, self.builder.target)]
        self.topic, self.ledger_id = topic, ledger_id

    @classmethod
    def of(cls, versions, *, topic: str = "", ledger_id: int = -1) -> "TableTypedColumns | None":
        """None (the object is written without typed columns) when ``versions`` cannot be columns."""
        try:
            return cls(versions, topic=topic, ledger_id=ledger_id)
        except TypedColumnsError as e:
            log.warning("offload topic=%s ledger=%d: schema versions %s cannot be typed columns: %s", topic,
                        ledger_id, [v for v, _, _ in versions], e)
        except Exception:       # noqa: BLE001 - an offload never fails over typed columns: raw object
            log.exception("offload topic=%s ledger=%d: typed columns failed; object written without them", topic,
                          ledger_id)
        return None

    def arrays(self, table) -> list:
        null = table.column("null_value").to_pylist()
        values = [None if n else v for v, n in zip(table.column("value").to_pylist(), null)]
        return self.builder.decode(values, table.column("schema_version").to_pylist())

    def metadata(self) -> dict[str, str]:
        return self.builder.metadata()

    def report(self, counters: dict | None) -> None:
        """Log what did not decode; add the counts to ``counters`` (``typed_values``,
        ``typed_values_undecodable``, ``typed_fields_unconvertible``)."""
        st = self.builder.stats
        if st.undecodable or st.unconvertible:
            log.warning("offload topic=%s ledger=%d: typed columns: %d of %d values undecodable, %d fields "
                        "unconvertible (null in the typed columns, value kept); first: %s", self.topic,
                        self.ledger_id, st.undecodable, st.values, st.unconvertible, st.errors[:1])
        if counters is not None:
            with _COUNTERS_LOCK:                     # offloads run in several pool threads
                for name, n in (("typed_values", st.values), ("typed_values_undecodable", st.undecodable),
                                ("typed_fields_unconvertible", st.unconvertible)):
                    counters[name] = counters.get(name, 0) + n


class TypedColumnsFailedError(OffloadError):
    """Encoding with typed columns failed for a reason other than the entries, with entries
    that cannot be read again here (a stream): the upload was aborted; encode the ledger again
    without typed columns."""


def encode_and_upload(tier, key: str, ledger_id: int, entries: Iterable[tuple[int, bytes]], *, partition: int,
                      row_group_bytes: int, uncompressed_bytes_max: int | None = None, typed_versions=None,
                      topic: str = "", counters: dict | None = None,
                      entries_expected: int | None = None) -> ObjectStats:
    """Entries -> Parquet -> object store, streamed: each row group is encoded (about one row
    group of decoded rows at a time, ``offload.reader.encode_ledger_to``) and written to the
    store's object writer as it goes (a multipart upload on S3, a temp file on file://), which
    commits only once the whole object is written and its entries are counted; any failure
    aborts it (nothing under ``key``). ``entries``: a list, or a one-shot stream (e.g. an
    ``offload.pipe.EntryPipe``: memory then stays bounded whatever the ledger's size) with
    ``entries_expected`` its count. The stats to record (offload.core's ObjectStats: size and
    CRC32C of the bytes written, rows). An entry whose payload declares more than
    ``uncompressed_bytes_max`` (the broker's ``message_bytes_max``; None: the format's
    default) is kept as one opaque row. With ``typed_versions`` (the topic's live AVRO/JSON
    schema versions) the object also holds the record's fields as typed columns
    (``TableTypedColumns``); ``counters`` (if given) gets ``typed_values`` /
    ``typed_values_undecodable`` / ``typed_fields_unconvertible`` added. An offload never fails
    over typed columns: a list is encoded again without them; a stream raises
    TypedColumnsFailedError (read it again, without ``typed_versions``)."""
    expected = len(entries) if entries_expected is None else entries_expected   # type: ignore[arg-type]
    encode = functools.partial(
        encode_ledger_to, ledger_id=ledger_id, entries=entries, partition=partition, row_group_bytes=row_group_bytes,
        uncompressed_bytes_max=ENTRY_UNCOMPRESSED_BYTES_MAX if uncompressed_bytes_max is None else uncompressed_bytes_max,
        metadata={"pulsarlite.ledger_id": str(ledger_id)})
    typed = TableTypedColumns.of(typed_versions, topic=topic, ledger_id=ledger_id) if typed_versions else None
    try:
        encoded = _upload(tier, key, ledger_id, expected, functools.partial(encode, columns=typed))
    except PulsarliteError:
        raise               # the entries themselves (TierFormatError), the store, the read: the same without typed columns
    except Exception:       # noqa: BLE001 - an offload never fails over typed columns
        if typed is None:
            raise
        log.exception("offload topic=%s ledger=%d: Parquet with typed columns failed; written without them",
                      topic, ledger_id)
        if not isinstance(entries, Sequence):
            raise TypedColumnsFailedError(f"ledger {ledger_id}: typed columns failed; encode again without them") \
                from None
        typed = None
        encoded = _upload(tier, key, ledger_id, expected, encode)
    if typed is not None:
        typed.report(counters)
    return encoded.stats


def _upload(tier, key: str, ledger_id: int, expected: int, encode) -> "EncodedObject":
    """``encode(out)`` into a new object writer of ``key`` (written by a thread of its own while
    the next row groups are encoded, WRITE_QUEUE_BYTES queued at most); committed only if it
    encoded ``expected`` entries, else (or on any error) aborted."""
    out = BackgroundObjectWriter(tier.store.open_writer(key), bytes_max=WRITE_QUEUE_BYTES, name=f"offload-write-{ledger_id}")
    try:
        encoded = encode(out)
        if encoded.entries != expected:
            raise OffloadError(f"ledger {ledger_id}: {encoded.entries} entries encoded, {expected} read")
        out.commit()
    except BaseException:
        out.abort()
        raise
    return encoded


def verify_object(tier: "Tier", key: str, stats: ObjectStats, entries: int) -> None:
    """The object is complete: recorded size and CRC32C, a Parquet footer with the recorded rows,
    row groups covering entry ids 0..entries-1 (``offload.reader.verify_object``).
    CorruptObjectError otherwise (a missing object too); other errors (the store unreachable)
    pass through."""
    try:
        verify(tier.store, key, stats, entries=entries)
    except ObjectNotFoundError as e:
        raise CorruptObjectError(f"object {key} is missing: {e}") from None
    except (TierChecksumError, TierFormatError) as e:
        raise CorruptObjectError(f"object {key}: {e}") from None


# -- the tier (object store adapter) -------------------------------------------------------------
class Tier:
    """The broker's view of the object store: keys relative to ``tier_uri``; blocking calls
    (run them in the pool)."""

    def __init__(self, uri: str, s3_endpoint_url: str | None) -> None:
        self.store = open_object_store(uri, s3_endpoint_url=s3_endpoint_url or None)
        self.uri = self.store.uri.rstrip("/")

    def uri_of(self, key: str) -> str:
        return self.store.object_uri(key)

    def key_of(self, uri: str) -> str:
        prefix = self.uri + "/"
        if not uri.startswith(prefix):
            raise OffloadError(f"object {uri} is not under the tier {self.uri}")
        return uri[len(prefix):]

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.store.put(key, data)

    def get(self, key: str) -> bytes:
        return self.store.get(key)

    def size(self, key: str) -> int | None:
        info = self.store.head(key)
        return None if info is None else info.size_bytes

    def delete(self, key: str) -> None:
        self.store.delete(key)

    def list(self, prefix: str) -> list[str]:
        return [info.key for info in self.store.list(prefix)]


# -- tier reads ----------------------------------------------------------------------------------
SMALL_OBJECT_BYTES = 8 * 1024 * 1024  # objects up to this size are fetched whole (one GET)


class TierReadCache:
    """Rebuilt entries of offloaded ledgers, by row group, bounded in bytes (oldest out); open
    readers (footers; small objects whole) of recently read objects; read-ahead of the next row
    group. Objects are read by :class:`offload.reader.TierReader` (page checksums verified)."""

    def __init__(self, tier: Tier, run: Callable, bytes_max: int, objects_max: int = 64) -> None:
        self.tier = tier
        self._run = run
        self.bytes_max = bytes_max
        self.bytes = 0
        self._objects: OrderedDict[str, TierReader] = OrderedDict()
        self._objects_max = objects_max
        self._object_bytes = 0              # whole small objects held (bounded by bytes_max // 2)
        self._groups: OrderedDict[tuple[str, int], tuple[dict[int, bytes], int]] = OrderedDict()
        self._loading: dict[tuple[str, int], asyncio.Future] = {}
        self._opening: dict[str, asyncio.Future] = {}
        self.row_groups_read = 0

    async def read(self, info: LedgerInfo, first: int, last: int) -> list[tuple[int, bytes]]:
        uri = info.offload.uri
        if not uri:
            raise OffloadError(f"ledger {info.ledger_id} is {info.offload.state.value} without a URI")
        key = self.tier.key_of(uri)
        obj = await self._object(key, info)
        out: list[tuple[int, bytes]] = []
        wanted = [i for i, (a, b) in enumerate(obj.entry_ranges) if b >= first and a <= last]
        groups = await asyncio.gather(*(self._group(obj, i) for i in wanted))
        for entries in groups:
            for entry_id in range(max(first, min(entries)), min(last, max(entries)) + 1):
                out.append((entry_id, entries[entry_id]))
        if wanted and wanted[-1] + 1 < len(obj.entry_ranges):     # read ahead (not awaited)
            ahead = asyncio.ensure_future(self._group(obj, wanted[-1] + 1))
            ahead.add_done_callback(lambda f: f.cancelled() or f.exception())
        return out

    def prefetch(self, info: LedgerInfo) -> None:
        """Read ahead the first row group of an offloaded ledger (the next one of a replay)."""
        try:
            key = self.tier.key_of(info.offload.uri) if info.offload.uri else None
        except OffloadError:
            return                 # not under this tier: the read itself will say so
        if key is None or (key, 0) in self._groups or (key, 0) in self._loading or key in self._opening:
            return

        async def fetch() -> None:
            obj = await self._object(key, info)
            if obj.entry_ranges:
                await self._group(obj, 0)

        task = asyncio.ensure_future(fetch())
        task.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def _object(self, key: str, info: LedgerInfo) -> TierReader:
        obj = self._objects.get(key)
        if obj is not None:
            self._objects.move_to_end(key)
            return obj
        opening = self._opening.get(key)
        if opening is None:
            opening = asyncio.ensure_future(self._run(self._open_object, key, info))
            self._opening[key] = opening
            opening.add_done_callback(lambda f: self._opening.pop(key, None))
        obj = await asyncio.shield(opening)
        if key not in self._objects:
            self._objects[key] = obj
            self._object_bytes += obj.bytes_held
        while len(self._objects) > 1 and (len(self._objects) > self._objects_max
                                          or self._object_bytes > self.bytes_max // 2):
            _, old = self._objects.popitem(last=False)
            self._object_bytes -= old.bytes_held
        return obj

    def _open_object(self, key: str, info: LedgerInfo) -> TierReader:
        """The object's reader: its footer read (a small object fetched whole by one GET instead
        of footer + row-group GETs), its rows checked against the record's."""
        stats = info.offload.stats
        return TierReader(self.tier.uri_of(key), store=self.tier.store, key=key,
                          size_bytes=None if stats is None else stats.size_bytes,
                          rows=None if stats is None else stats.rows, read_ahead_row_groups=0,
                          whole_object_bytes_max=SMALL_OBJECT_BYTES)

    async def _group(self, obj: TierReader, index: int) -> dict[int, bytes]:
        k = (obj.key, index)
        got = self._groups.get(k)
        if got is not None:
            self._groups.move_to_end(k)
            return got[0]
        loading = self._loading.get(k)
        if loading is None:
            loading = asyncio.ensure_future(self._run(self._read_group, obj, index))
            self._loading[k] = loading
            loading.add_done_callback(functools.partial(self._loaded, k))
        entries, _ = await asyncio.shield(loading)
        return entries

    def _loaded(self, k: tuple[str, int], fut: asyncio.Future) -> None:
        self._loading.pop(k, None)
        if fut.cancelled() or fut.exception() is not None:
            return
        entries, size = fut.result()
        if k not in self._groups and size <= self.bytes_max:
            self._groups[k] = (entries, size)
            self.bytes += size
            while self.bytes > self.bytes_max:
                _, (_, old) = self._groups.popitem(last=False)
                self.bytes -= old

    def _read_group(self, obj: TierReader, index: int) -> tuple[dict[int, bytes], int]:
        (table,) = obj.read_row_group_tables([index], columns=REBUILD_COLUMNS)   # not typed columns
        entries = dict(table_to_entries(table))
        a, b = obj.entry_ranges[index]
        if sorted(entries) != list(range(a, b + 1)):
            raise OffloadError(f"object {obj.key}: row group {index} rebuilt entries "
                               f"{min(entries, default=None)}..{max(entries, default=None)}, expected {a}..{b}")
        self.row_groups_read += 1
        return entries, sum(len(v) for v in entries.values())

    def forget(self, key_prefix: str) -> None:
        for k in [k for k in self._groups if k[0].startswith(key_prefix)]:
            _, size = self._groups.pop(k)
            self.bytes -= size
        for k in [k for k in self._objects if k.startswith(key_prefix)]:
            self._object_bytes -= self._objects.pop(k).bytes_held



__all__ = ["SMALL_OBJECT_BYTES", "TableTypedColumns", "Tier", "TierReadCache", "TypedColumnsFailedError",
           "encode_and_upload", "verify_object"]
