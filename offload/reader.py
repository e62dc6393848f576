"""Writing and reading one ledger's tier object (Parquet, :mod:`offload.format`) through an
object store (:mod:`offload.store`). Blocking; run it in a thread pool from asyncio.

API::

    result = write_ledger_object(store, key, ledger_id, entries, *, partition,
                                 row_group_bytes=..., compression=...) -> WrittenObject
        (= put_encoded(store, key, ledger_id, encode_ledger(ledger_id, entries, ...)); run
        encode_ledger in a ProcessPoolExecutor to keep the caller's GIL free; the broker's
        offloader calls encode_ledger too, with its typed columns)
        entries -> Parquet (encoded about one row group of decoded bytes at a time: memory
        holds one row group's rows plus the compressed object) -> store.put (CRC32C computed while writing,
        stored as the object's ``crc32c`` user metadata on S3); result.uri, .stats (core.ObjectStats: rows,
        size_bytes, checksum, min/max publish time), .entries, .row_groups
    encode_ledger_to(store.open_writer(key), ledger_id, entries, ...) -> EncodedObject (data b"")
        the same object written out as it is encoded (memory: about one row group)
    verify_object(store, key, stats, *, full=True)      # size, CRC32C, footer rows, else
                                                         # TierChecksumError / TierFormatError
    ledger_offload_summary(table) -> dict                # rows, min/max_publish_time_ms

    reader = TierReader(uri, s3_endpoint_url=None, size_bytes=None, checksum=None, rows=None,
                        io_pool=None, read_ahead_row_groups=2)
    reader.entry_ranges                                  # [(first, last entry id)] per row group
    for entry_id, entry in reader.read_entries(first, last): ...   # rebuilt entries
    reader.read_table(columns=None)                      # the whole object, checksum verified
    reader.close()

Reads fetch whole row groups: each row group's byte range (from the footer) is split into
parts fetched by parallel ranged GETs on an I/O thread pool, and the next
``read_ahead_row_groups`` row groups are fetched while the current one is decoded. Page
checksums are verified on every read; the whole-object CRC32C (``checksum``, from metadata)
whenever the whole object is read (``read_table``, or ``read_entries`` over every row group of
an object of at most WHOLE_OBJECT_BYTES_MAX). ``io_pool`` must not be a pool whose threads
call the reader (the reader waits on it).
"""

from __future__ import annotations

import bisect
import io
import logging
import struct
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Protocol, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from offload.core import ObjectStats
from offload.format import (ENTRY_UNCOMPRESSED_BYTES_MAX, REBUILD_COLUMNS, ROW_GROUP_BYTES_DEFAULT, ROW_SCHEMA,
                            ParquetStreamWriter, TierChecksumError, TierFormatError, ledger_tables, open_parquet,
                            read_row_groups, row_group_entry_ranges, summarize_table, table_to_entries)
from offload.store import Crc32cHasher, ObjectNotFoundError, ObjectStore, ObjectWriter, crc32c_hex, open_object_uri

log = logging.getLogger("pulsarlite.offload.reader")

FOOTER_TAIL_BYTES = 64 * 1024
PART_BYTES_DEFAULT = 8 * 1024 * 1024     # ranged GETs of 8 MiB (AWS advises 8-16 MB)
IO_THREADS_DEFAULT = 8
WHOLE_OBJECT_BYTES_MAX = 256 * 1024 * 1024   # larger objects are read by row groups only
VERIFY_PART_BYTES = 8 * 1024 * 1024      # verify_object reads objects in parts of this size
SINK_BUFFER_BYTES = 4 * 1024 * 1024
"""The Parquet writer's output is gathered in an Arrow buffer of this size before it reaches the
hashing sink (flushed after each table too): the sink is Python, and each call from Arrow's
writer takes the GIL from the event loop; unbuffered, a 100 MB object took ~960 calls (a page
header and a page each), buffered ~50."""

_default_pool: ThreadPoolExecutor | None = None
_default_pool_lock = threading.Lock()


def default_io_pool() -> ThreadPoolExecutor:
    global _default_pool
    with _default_pool_lock:
        if _default_pool is None:
            _default_pool = ThreadPoolExecutor(IO_THREADS_DEFAULT,
                                               thread_name_prefix="tier-io")
        return _default_pool


# ---------------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------------

class _HashingSink(io.RawIOBase):
    """A write-only file computing the CRC32C of the bytes as they are written, and collecting
    them (``parts``) or handing them on to ``out`` (an object writer: nothing held here)."""

    def __init__(self, out: "ObjectWriter | None" = None) -> None:
        super().__init__()
        self.parts: list[bytes] = []
        self.hasher = Crc32cHasher()
        self.out = out
        self.error: Exception | None = None

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        b = bytes(data)
        self.hasher.update(b)
        if self.out is None:
            self.parts.append(b)
        elif self.error is None:
            # an error is kept, not raised through Arrow's C++ writer (pyarrow would wrap it
            # and format its traceback later, in a finalizer: that corrupts a concurrent
            # ast.parse on CPython 3.11); the encoder raises it after the write returns
            try:
                self.out.write(b)
            except Exception as e:      # noqa: BLE001 - raised by raise_error()
                self.error = e
        return len(b)

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def tell(self) -> int:
        return self.hasher.size_bytes


@dataclass(frozen=True)
class WrittenObject:
    uri: str
    stats: ObjectStats
    entries: int
    row_groups: int


def ledger_offload_summary(table: pa.Table) -> dict[str, Any]:
    s = summarize_table(table)
    return {"rows": s.rows, "min_publish_time_ms": s.min_publish_time_ms,
            "max_publish_time_ms": s.max_publish_time_ms}


@dataclass(frozen=True)
class EncodedObject:
    """A ledger encoded as one tier object, not yet stored (picklable: it can come back from
    a process pool)."""
    data: bytes
    stats: ObjectStats
    entries: int
    row_groups: int


class ExtraColumns(Protocol):
    """Columns a writer appends after ROW_SCHEMA's, computed table by table (e.g. the typed
    columns of a struct schema: ``offload.typed_columns.TypedColumnsBuilder``)."""

    fields: list[pa.Field]

    def arrays(self, table: pa.Table) -> list[pa.Array]:
        """One array per field for the rows of ``table`` (ROW_SCHEMA's columns)."""

    def metadata(self) -> dict[str, str]:
        """The footer's key-value pairs for them, asked once, after the last table."""


def encode_ledger(ledger_id: int, entries: Iterable[tuple[int, bytes | memoryview]], *,
                  partition: int, row_group_bytes: int = ROW_GROUP_BYTES_DEFAULT,
                  compression: str = "zstd",
                  uncompressed_bytes_max: int = ENTRY_UNCOMPRESSED_BYTES_MAX,
                  metadata: dict[str, str] | None = None,
                  columns: ExtraColumns | None = None) -> EncodedObject:
    """Entries -> Parquet bytes and their stats (CRC32C computed while writing): the object
    held in memory (``encode_ledger_to`` writes it out as it goes instead). Memory holds about
    one row group of decoded rows at a time (``offload.format.ledger_tables``: tables of at
    most ``row_group_bytes`` of decoded bytes), plus the compressed object; an entry whose
    payload declares more than ``uncompressed_bytes_max`` is kept as one opaque row.
    ``metadata``: the footer's pairs besides the format's (default: ledger id and partition);
    ``columns``: extra columns after ROW_SCHEMA's. Pure CPU work with picklable arguments and
    result (without ``columns``): run it in a ``ProcessPoolExecutor`` to keep a broker's GIL
    free (pass the entries as a list of (int, bytes))."""
    sink = _HashingSink()
    stats, entries_written, row_groups = _encode(sink, ledger_id, entries, partition=partition,
                                                 row_group_bytes=row_group_bytes, compression=compression,
                                                 uncompressed_bytes_max=uncompressed_bytes_max,
                                                 metadata=metadata, columns=columns)
    data = b"".join(sink.parts)
    return EncodedObject(data, stats, entries_written, row_groups)


def encode_ledger_to(out: "ObjectWriter", ledger_id: int, entries: Iterable[tuple[int, bytes | memoryview]], *,
                     partition: int, row_group_bytes: int = ROW_GROUP_BYTES_DEFAULT,
                     compression: str = "zstd",
                     uncompressed_bytes_max: int = ENTRY_UNCOMPRESSED_BYTES_MAX,
                     metadata: dict[str, str] | None = None,
                     columns: ExtraColumns | None = None) -> EncodedObject:
    """``encode_ledger``, the bytes written to ``out`` (``ObjectStore.open_writer``; not
    committed here) as each row group is encoded: memory holds about one row group of decoded
    rows and its encoded pages, never the object. The result's ``data`` is empty."""
    sink = _HashingSink(out)
    stats, entries_written, row_groups = _encode(sink, ledger_id, entries, partition=partition,
                                                 row_group_bytes=row_group_bytes, compression=compression,
                                                 uncompressed_bytes_max=uncompressed_bytes_max,
                                                 metadata=metadata, columns=columns)
    if out.size_bytes != stats.size_bytes:
        raise TierFormatError(f"ledger {ledger_id}: {out.size_bytes} bytes reached the object writer, "
                              f"{stats.size_bytes} encoded")
    return EncodedObject(b"", stats, entries_written, row_groups)


def _encode(sink: _HashingSink, ledger_id: int, entries: Iterable[tuple[int, bytes | memoryview]], *,
            partition: int, row_group_bytes: int, compression: str, uncompressed_bytes_max: int,
            metadata: dict[str, str] | None, columns: ExtraColumns | None) -> tuple[ObjectStats, int, int]:
    if metadata is None:
        metadata = {"pulsarlite.ledger_id": str(ledger_id), "pulsarlite.partition": str(partition)}
    schema = ROW_SCHEMA if columns is None else pa.schema(list(ROW_SCHEMA) + list(columns.fields))
    buffered = pa.BufferedOutputStream(pa.PythonFile(sink, mode="w"), buffer_size=SINK_BUFFER_BYTES)
    writer = ParquetStreamWriter(buffered, schema,
                                 row_group_bytes=row_group_bytes, compression=compression,
                                 metadata=metadata)
    try:
        for table in ledger_tables(ledger_id, entries, partition=partition, decoded_bytes_max=row_group_bytes,
                                   uncompressed_bytes_max=uncompressed_bytes_max):
            if columns is not None:
                for field, array in zip(columns.fields, columns.arrays(table)):
                    table = table.append_column(field, array)
            writer.write(table)
            buffered.flush()          # what it wrote reaches the sink now: at most a row group held
            sink.raise_error()
    except BaseException:
        writer.close()
        raise
    summary = writer.close(columns.metadata() if columns is not None else None)
    buffered.flush()
    sink.raise_error()
    if summary.rows == 0:
        raise TierFormatError(f"ledger {ledger_id}: nothing to offload (no entries)")
    stats = ObjectStats(rows=summary.rows, size_bytes=sink.hasher.size_bytes,
                        checksum=sink.hasher.hexdigest(),
                        min_publish_time_ms=summary.min_publish_time_ms,
                        max_publish_time_ms=summary.max_publish_time_ms)
    return stats, summary.entries, summary.row_groups


def put_encoded(store: ObjectStore, key: str, ledger_id: int,
                encoded: EncodedObject) -> WrittenObject:
    """Store an encoded object (its CRC32C also as the object's ``crc32c`` user metadata)."""
    store.put(key, encoded.data, metadata={"crc32c": encoded.stats.checksum,
                                           "rows": str(encoded.stats.rows),
                                           "ledger-id": str(ledger_id)})
    uri = store.object_uri(key)
    log.info("event=tier_object_written ledger=%d uri=%s rows=%d entries=%d bytes=%d "
             "row_groups=%d", ledger_id, uri, encoded.stats.rows, encoded.entries,
             encoded.stats.size_bytes, encoded.row_groups)
    return WrittenObject(uri, encoded.stats, encoded.entries, encoded.row_groups)


def write_ledger_object(store: ObjectStore, key: str, ledger_id: int,
                        entries: Iterable[tuple[int, bytes | memoryview]], *, partition: int,
                        row_group_bytes: int = ROW_GROUP_BYTES_DEFAULT,
                        compression: str = "zstd") -> WrittenObject:
    """Encode the ledger's entries and put them as one object. Returns what to record."""
    encoded = encode_ledger(ledger_id, entries, partition=partition,
                            row_group_bytes=row_group_bytes, compression=compression)
    return put_encoded(store, key, ledger_id, encoded)


def verify_object(store: ObjectStore, key: str, stats: ObjectStats, *, full: bool = True,
                  entries: int | None = None) -> None:
    """The object is complete and intact. With ``full`` (a HEAD, then the object read in ranged
    parts of VERIFY_PART_BYTES, and its footer): its size and CRC32C, the row
    count in its footer and, with ``entries``, row groups covering entry ids 0..entries-1 (page
    checksums are left to readers); without (one HEAD): its size and the ``crc32c`` user
    metadata, if the object has it. Raises TierChecksumError / TierFormatError /
    ObjectStoreError (ObjectNotFoundError when it is gone)."""
    where = store.object_uri(key)
    if not full:
        head = store.head(key)
        if head is None:
            raise ObjectNotFoundError(f"no object {where}")
        if head.size_bytes != stats.size_bytes:
            raise TierChecksumError(f"{where}: {head.size_bytes} bytes, recorded {stats.size_bytes}")
        recorded = head.metadata.get("crc32c")
        if recorded is not None and recorded != stats.checksum:
            raise TierChecksumError(f"{where}: object says crc32c {recorded}, recorded "
                                    f"{stats.checksum}")
        return
    # read in parts (memory: one part, whatever the object's size)
    head = store.head(key)
    if head is None:
        raise ObjectNotFoundError(f"no object {where}")
    if head.size_bytes != stats.size_bytes:
        raise TierChecksumError(f"{where}: {head.size_bytes} bytes, recorded {stats.size_bytes}")
    hasher = Crc32cHasher()
    for start in range(0, head.size_bytes, VERIFY_PART_BYTES):
        hasher.update(store.get_range(key, start, min(VERIFY_PART_BYTES, head.size_bytes - start)))
    if hasher.hexdigest() != stats.checksum:
        raise TierChecksumError(f"{where}: {hasher.size_bytes} bytes crc32c {hasher.hexdigest()}, "
                                f"recorded {stats.size_bytes} {stats.checksum}")
    pf = open_parquet(store.open_input_file(key, size=head.size_bytes), what=where)
    if pf.metadata.num_rows != stats.rows:
        raise TierFormatError(f"{where}: {pf.metadata.num_rows} rows, recorded {stats.rows}")
    if entries is not None:
        ranges = row_group_entry_ranges(pf)
        if not ranges or ranges[0][0] != 0 or ranges[-1][1] != entries - 1 or any(
                b[0] != a[1] + 1 for a, b in zip(ranges, ranges[1:])):
            raise TierFormatError(f"{where}: entry ranges {ranges[:3]}... do not cover 0..{entries - 1}")


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------

class _SparseFile(io.RawIOBase):
    """A read-only file of known size of which some byte ranges were fetched; reads outside
    them go to the store (counted in ``misses``)."""

    def __init__(self, size: int, segments: dict[int, bytes], fetch) -> None:
        super().__init__()
        self._size = size
        self._starts = sorted(segments)
        self._segments = segments
        self._fetch = fetch
        self._pos = 0
        self.misses = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self._size - self._pos
        n = max(0, min(n, self._size - self._pos))
        if n == 0:
            return b""
        pos = self._pos
        i = bisect.bisect_right(self._starts, pos) - 1
        if i >= 0:
            start = self._starts[i]
            seg = self._segments[start]
            if pos + n <= start + len(seg):
                self._pos += n
                return seg[pos - start:pos - start + n]
        self.misses += 1
        data = self._fetch(pos, n)
        self._pos += n
        return data


def _row_group_span(md: pq.FileMetaData, index: int) -> tuple[int, int]:
    rg = md.row_group(index)
    lo, hi = None, 0
    for j in range(rg.num_columns):
        col = rg.column(j)
        start = col.data_page_offset
        if col.has_dictionary_page and col.dictionary_page_offset is not None \
                and 0 < col.dictionary_page_offset < start:
            start = col.dictionary_page_offset
        end = start + col.total_compressed_size
        lo = start if lo is None else min(lo, start)
        hi = max(hi, end)
    if lo is None:
        raise TierFormatError(f"row group {index} has no columns")
    return lo, hi


class TierReader:
    """Reads one tier object (see the module docstring): the one tier reader of the broker
    (offload/tier.py TierReadCache), tools and tests. Each row group is decoded through its own
    file object, so threads may read different row groups at once; the I/O pool may be shared."""

    def __init__(self, uri: str, *, s3_endpoint_url: str | None = None,
                 size_bytes: int | None = None, checksum: str | None = None,
                 rows: int | None = None, io_pool: ThreadPoolExecutor | None = None,
                 read_ahead_row_groups: int = 2, part_bytes: int = PART_BYTES_DEFAULT,
                 store: ObjectStore | None = None, key: str | None = None,
                 whole_object_bytes_max: int | None = None, what: str | None = None) -> None:
        if read_ahead_row_groups < 0 or part_bytes <= 0:
            raise ValueError("read_ahead_row_groups >= 0 and part_bytes > 0")
        if whole_object_bytes_max is not None and whole_object_bytes_max < 0:
            raise ValueError("whole_object_bytes_max >= 0")
        self.uri = uri
        self.what = what or uri            # names the object in errors
        self._opened: list[Any] = []       # files opened by parquet_file (closed by close())
        if store is None:
            store, key = open_object_uri(uri, s3_endpoint_url=s3_endpoint_url)
        self.store, self.key = store, key
        self.checksum = checksum
        self.pool = io_pool or default_io_pool()
        self.read_ahead_row_groups = read_ahead_row_groups
        self.part_bytes = part_bytes
        # objects up to this size are fetched whole by the footer's GET (default: part_bytes)
        self.whole_object_bytes_max = part_bytes if whole_object_bytes_max is None else whole_object_bytes_max
        self.bytes_fetched = 0
        if size_bytes is None:
            info = self.store.head(self.key)
            if info is None:
                raise ObjectNotFoundError(f"no object {uri}")
            size_bytes = info.size_bytes
        self.size_bytes = size_bytes
        self._footer_segment = self._fetch_footer()
        pf = open_parquet(_SparseFile(size_bytes, self._footer_segment, self._get),
                          what=self.what)
        self.metadata = pf.metadata
        self.schema = pf.schema_arrow
        if rows is not None and self.metadata.num_rows != rows:
            raise TierFormatError(f"{uri}: {self.metadata.num_rows} rows, metadata says {rows}")
        self.entry_ranges = row_group_entry_ranges(pf)
        self.num_row_groups = self.metadata.num_row_groups

    @property
    def bytes_held(self) -> int:
        """Bytes of the object this reader keeps (the footer's segment: a small object whole)."""
        ((_, seg),) = self._footer_segment.items()
        return len(seg)

    # -- fetching --
    def _get(self, start: int, length: int) -> bytes:
        data = self.store.get_range(self.key, start, length)
        self.bytes_fetched += len(data)
        return data

    def _fetch_footer(self) -> dict[int, bytes]:
        size = self.size_bytes
        if size < 12:
            raise TierFormatError(f"{self.uri}: {size} bytes is not a Parquet file")
        # a small object is fetched whole by this one GET (no row-group GETs later)
        tail_len = size if size <= self.whole_object_bytes_max else min(size, FOOTER_TAIL_BYTES)
        tail = self._get(size - tail_len, tail_len)
        if len(tail) != tail_len:
            raise TierFormatError(f"{self.uri}: read {len(tail)} bytes at {size - tail_len}, expected "
                                  f"{tail_len} (the object is not {size} bytes)")
        if tail[-4:] != b"PAR1":
            raise TierFormatError(f"{self.uri}: no Parquet magic at the end")
        footer_len = struct.unpack("<I", tail[-8:-4])[0]
        if footer_len + 8 > size:
            raise TierFormatError(f"{self.uri}: footer of {footer_len} bytes overruns the file")
        if footer_len + 8 > tail_len:
            more = footer_len + 8 - tail_len
            tail = self._get(size - tail_len - more, more) + tail
            tail_len += more
        return {size - tail_len: tail}

    def _fetch_range(self, start: int, end: int) -> Future:
        """Fetch [start, end) as parallel ranged GETs; a future of the bytes."""
        parts = [(s, min(end, s + self.part_bytes)) for s in range(start, end, self.part_bytes)]
        futures = [self.pool.submit(self._get, s, e - s) for s, e in parts]
        out: Future = Future()

        def join(_f=None) -> None:
            if out.done() or not all(f.done() for f in futures):
                return
            try:
                out.set_result(b"".join(f.result() for f in futures))
            except BaseException as exc:   # noqa: BLE001 (handed to the waiter)
                if not out.done():
                    out.set_exception(exc)

        for f in futures:
            f.add_done_callback(join)
        return out

    def _fetch_row_group(self, index: int) -> Future:
        start, end = _row_group_span(self.metadata, index)
        ((seg_start, seg),) = self._footer_segment.items()
        if seg_start <= start and end <= seg_start + len(seg):    # fetched with the footer
            done: Future = Future()
            done.set_result(seg[start - seg_start:end - seg_start])
            return done
        return self._fetch_range(start, end)

    def _decode(self, index: int, data: bytes, columns: Sequence[str] | None = None) -> pa.Table:
        start, _ = _row_group_span(self.metadata, index)
        segments = dict(self._footer_segment)
        segments[start] = data
        sparse = _SparseFile(self.size_bytes, segments, self._get)
        pf = pq.ParquetFile(pa.PythonFile(sparse, mode="r"), metadata=self.metadata,
                            page_checksum_verification=True)
        return read_row_groups(pf, [index], columns=columns, what=self.what)

    # -- reading --
    def row_groups_for(self, first: int, last: int) -> list[int]:
        return [i for i, (a, b) in enumerate(self.entry_ranges) if b >= first and a <= last]

    def read_row_group_tables(self, indexes: Sequence[int], *,
                              columns: Sequence[str] | None = None) -> Iterator[pa.Table]:
        """Decoded row groups in order, fetched with read-ahead."""
        indexes = list(indexes)
        inflight: dict[int, Future] = {}
        try:
            for n, index in enumerate(indexes):
                for ahead in indexes[n:n + 1 + self.read_ahead_row_groups]:
                    if ahead not in inflight:
                        inflight[ahead] = self._fetch_row_group(ahead)
                data = inflight.pop(index).result()
                yield self._decode(index, data, columns)
        finally:
            for f in inflight.values():
                f.cancel()

    def read_entries(self, first: int = 0, last: int | None = None
                     ) -> Iterator[tuple[int, bytes]]:
        """Rebuilt entries with ids in [first, last] (all when last is None), in order."""
        if last is None:
            last = self.entry_ranges[-1][1] if self.entry_ranges else -1
        indexes = self.row_groups_for(first, last)
        if self.checksum is not None and indexes and len(indexes) == self.num_row_groups \
                and self.size_bytes <= WHOLE_OBJECT_BYTES_MAX:
            pf = self._whole_object()
            for index in indexes:
                table = read_row_groups(pf, [index], columns=REBUILD_COLUMNS, what=self.what)
                for entry_id, entry in table_to_entries(table):
                    if first <= entry_id <= last:
                        yield entry_id, entry
            return
        for table in self.read_row_group_tables(indexes, columns=REBUILD_COLUMNS):   # not typed columns
            for entry_id, entry in table_to_entries(table):
                if first <= entry_id <= last:
                    yield entry_id, entry

    def read_table(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The whole object (parallel ranged GETs), its CRC32C checked against ``checksum``
        when known, page checksums verified."""
        pf = self._whole_object()
        return read_row_groups(pf, range(pf.num_row_groups), columns=columns, what=self.what)

    def _whole_object(self) -> pq.ParquetFile:
        """The whole object fetched (parallel ranged GETs) and its CRC32C checked."""
        ((seg_start, seg),) = self._footer_segment.items()
        data = seg if seg_start == 0 else self._fetch_range(0, self.size_bytes).result()
        if self.checksum is not None and crc32c_hex(data) != self.checksum:
            raise TierChecksumError(f"{self.uri}: crc32c {crc32c_hex(data)}, recorded "
                                    f"{self.checksum}")
        return open_parquet(pa.BufferReader(data), what=self.what)

    def parquet_file(self, *, read_dictionary: Sequence[str] | None = None) -> pq.ParquetFile:
        """The object as a ParquetFile for column-projected reads (the Spark source's): the
        footer already read is reused, page checksums are verified, and reads fetch only the
        column chunks they touch through the store's seekable file (a small object fetched
        whole with the footer is read from memory). Closed with the reader."""
        ((seg_start, seg),) = self._footer_segment.items()
        if seg_start == 0:
            source: Any = pa.BufferReader(seg)
        else:
            source = self.store.open_input_file(self.key, size=self.size_bytes)
            self._opened.append(source)
        try:
            return pq.ParquetFile(source, metadata=self.metadata, page_checksum_verification=True,
                                  read_dictionary=list(read_dictionary) if read_dictionary else None)
        except (OSError, pa.ArrowException, ValueError) as exc:
            raise TierFormatError(f"{self.what}: {exc}") from None

    def close(self) -> None:
        opened, self._opened = self._opened, []
        for f in opened:
            f.close()

    def __enter__(self) -> "TierReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["EncodedObject", "TierReader", "WrittenObject", "default_io_pool", "encode_ledger", "encode_ledger_to",
           "ledger_offload_summary", "put_encoded", "verify_object", "write_ledger_object"]
