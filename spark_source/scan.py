"""Reading one planned segment (shell, runs in Spark's Python workers): from the bookies with the
ledger client (no fencing, any replica, failover, CRC checks) or as Parquet from the object
store. Both paths produce ``offload.format.ROW_SCHEMA`` tables (bookie entries go through
``entries_to_table_fast``, equal to ``entries_to_table``), so the output columns are identical
whatever the segment's location.
"""

from __future__ import annotations

import asyncio
import logging
import time
import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from spark_source.errors import CompactedViewGone, DataLossError
from spark_source.plan import Location, Position, SegmentScan

log = logging.getLogger("pulsarlite.spark")

from spark_source.plan import OUTPUT_DDL  # noqa: E402,F401  (re-exported)

TS = pa.timestamp("us", tz="UTC")
OUTPUT_SCHEMA = pa.schema([
    ("key", pa.string()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
    ("message_id", pa.string()), ("ledger_id", pa.int64()), ("entry_id", pa.int64()),
    ("batch_index", pa.int32()), ("publish_time", TS), ("event_time", TS),
    ("properties", pa.map_(pa.string(), pa.string())), ("producer_name", pa.string()),
    ("sequence_id", pa.int64()),
])


@dataclass(frozen=True)
class ReadSettings:
    zookeeper: str
    s3_endpoint_url: str | None
    metrics_dir: str | None
    chunk_entries: int = 2_000
    fail_on_data_loss: bool = True
    typed: object | None = None        # spark_source.typed.TypedValue: typed value columns
    # a user-given schema (spark_source/projection.py): the output columns in order and their
    # Arrow schema as Spark expects it back; None: every column, in the source's order
    columns: tuple[str, ...] | None = None
    output_schema: pa.Schema | None = None
    bookie_auth_token: str = dataclasses.field(default="", repr=False)   # spark_source/options.py
    bookie_auth_token_file: str = ""
    zookeeper_auth_digest: str = dataclasses.field(default="", repr=False)
    zookeeper_auth_digest_file: str = ""
    zookeeper_acl_read_restricted: bool = False
    bookie_tls_enabled: bool = False
    bookie_tls_trust_certs_file_path: str = ""


# the ROW_SCHEMA columns (offload.format) each metadata output column is built from
METADATA_SOURCES: dict[str, tuple[str, ...]] = {
    "key": ("key",), "value": ("value",), "topic": (), "partition": (),
    "message_id": ("ledger_id", "entry_id", "batch_index"), "ledger_id": ("ledger_id",),
    "entry_id": ("entry_id",), "batch_index": ("batch_index",), "publish_time": ("publish_time",),
    "event_time": ("event_time",), "properties": ("properties",), "producer_name": ("producer_name",),
    "sequence_id": ("sequence_id",),
}
FILTER_COLUMNS = ("entry_id", "batch_index", "publish_time")     # what filter_rows looks at


def output_names(settings: "ReadSettings") -> tuple[str, ...]:
    """The output column names of a read, in order."""
    if settings.columns is not None:
        return settings.columns
    typed_names = tuple(settings.typed.names) if settings.typed is not None else ()
    return tuple(OUTPUT_SCHEMA.names) + typed_names


def wanted_typed(settings: "ReadSettings") -> list[int]:
    """Indices (into ``typed.target``) of the typed fields the output has."""
    if settings.typed is None:
        return []
    names = list(settings.typed.names)
    if settings.columns is None:
        return list(range(len(names)))
    return [names.index(c) for c in settings.columns if c in names]


# -- row filtering and output ------------------------------------------------------------------
def filter_rows(table: pa.Table, scan: SegmentScan) -> pa.Table:
    """Keep rows inside the scan's position range and publish-time bounds."""
    if table.num_rows == 0:
        return table
    mask = None

    def both(m):
        nonlocal mask
        mask = m if mask is None else pc.and_(mask, m)

    entry = table["entry_id"]
    both(pc.and_(pc.greater_equal(entry, scan.first_entry_id), pc.less_equal(entry, scan.last_entry_id)))
    batch = table["batch_index"]
    if scan.start.ledger_id == scan.ledger_id and scan.start.batch_index > 0:
        both(pc.invert(pc.and_(pc.equal(entry, scan.start.entry_id), pc.less(batch, scan.start.batch_index))))
    if scan.end is not None and scan.end.ledger_id == scan.ledger_id and scan.end.batch_index >= 0:
        both(pc.invert(pc.and_(pc.equal(entry, scan.end.entry_id),
                               pc.greater_equal(batch, scan.end.batch_index))))
    publish_ms = pc.cast(table["publish_time"], pa.int64())
    if scan.publish_time_min_ms is not None:
        both(pc.greater_equal(publish_ms, scan.publish_time_min_ms))
    if scan.publish_time_max_ms is not None:
        both(pc.less_equal(publish_ms, scan.publish_time_max_ms))
    return table.filter(mask)


def _metadata_column(name: str, table: pa.Table, scan: SegmentScan, n: int):
    """One metadata output column of ROW_SCHEMA rows (only the columns it needs are read)."""
    if name == "topic":
        return pa.repeat(pa.scalar(scan.topic, pa.string()), n)
    if name == "partition":
        return pa.repeat(pa.scalar(scan.partition, pa.int32()), n)
    if name == "message_id":
        return message_ids(table["ledger_id"], table["entry_id"], table["batch_index"], scan.partition)
    if name == "producer_name":
        return _decoded(table[name])
    return table[name].cast(OUTPUT_SCHEMA.field(name).type)


def _decoded(column) -> pa.Array:
    """A string column, or a dictionary-encoded one (tier reads ask pyarrow for
    ``producer_name`` as a dictionary: one string per row group, not one copy per row),
    as a plain string array."""
    column = _as_array(column)
    if not pa.types.is_dictionary(column.type):
        return column
    if column.null_count == 0 and len(column.dictionary) == 1:
        return pa.repeat(column.dictionary[0].cast(pa.string()), len(column))
    return column.cast(pa.string())


# "-1", "0", "1", ...: the batch index part of message ids, taken per row
_BATCH_INDEX_STRINGS_MAX = 1 << 16
_batch_index_strings: pa.Array = pc.cast(pa.array(range(-1, 1024), pa.int32()), pa.string())


def _batch_index_text(max_index: int) -> pa.Array:
    global _batch_index_strings
    if len(_batch_index_strings) < max_index + 2:
        _batch_index_strings = pc.cast(pa.array(range(-1, max_index + 1), pa.int32()), pa.string())
    return _batch_index_strings


def message_ids(ledger_id, entry_id, batch_index, partition: int) -> pa.Array:
    """``ledger:entry:partition:batch`` per row. When every row has one ledger id (always, for a
    segment) the text ``ledger:entry:partition:`` is built once per run of equal entry ids and
    the batch index part is taken from a cached table: 2-3x cheaper than casting and joining
    every part of every row; the same strings."""
    ledger_id, entry_id, batch_index = _as_array(ledger_id), _as_array(entry_id), _as_array(batch_index)
    n = len(entry_id)
    if n and not (ledger_id.null_count or entry_id.null_count or batch_index.null_count):
        lo, hi = pc.min_max(ledger_id).values()
        b_lo, b_hi = pc.min_max(batch_index).values()
        if lo.as_py() == hi.as_py() and b_lo.as_py() >= -1 and b_hi.as_py() < _BATCH_INDEX_STRINGS_MAX:
            starts = pa.concat_arrays([pa.array([True]), pc.not_equal(entry_id.slice(1), entry_id.slice(0, n - 1))])
            run = pc.subtract(pc.cumulative_sum(starts.cast(pa.int32())), 1)
            prefixes = pc.binary_join_element_wise(
                pa.scalar(f"{lo.as_py()}:"), pc.cast(entry_id.filter(starts), pa.string()),
                pa.scalar(f":{partition}:"), "")
            batch_text = _batch_index_text(b_hi.as_py()).take(pc.add(batch_index.cast(pa.int32()), 1))
            return pc.binary_join_element_wise(prefixes.take(run), batch_text, "")
    return pc.binary_join_element_wise(
        pc.cast(ledger_id, pa.string()), pc.cast(entry_id, pa.string()),
        pa.scalar(str(partition)), pc.cast(batch_index, pa.string()), ":")


def output_schema(settings: "ReadSettings") -> pa.Schema:
    if settings.output_schema is not None:
        return settings.output_schema
    if settings.typed is None:
        return OUTPUT_SCHEMA
    return pa.schema(list(OUTPUT_SCHEMA) + settings.typed.output_fields())


def to_output(table: pa.Table, scan: SegmentScan, typed=None, *, settings: "ReadSettings | None" = None
              ) -> pa.RecordBatch:
    """ROW_SCHEMA rows -> the DataFrame's columns: every metadata column and the typed value
    columns, if any; or, with a user-given schema (``settings.columns``), just those, in its
    order. Only the ROW_SCHEMA columns the output needs have to be in ``table``."""
    if settings is None:
        settings = ReadSettings(zookeeper="", s3_endpoint_url=None, metrics_dir=None, typed=typed)
    typed = settings.typed
    n = table.num_rows
    names = output_names(settings)
    schema = output_schema(settings)
    values: dict[int, pa.Array] = {}
    wanted = wanted_typed(settings)
    if wanted:
        values = _typed_values(table, typed, wanted)
    typed_index = {name: i for i, name in enumerate(typed.names)} if typed is not None else {}
    columns = []
    for name, field in zip(names, schema):
        if name in METADATA_SOURCES:
            column = _as_array(_metadata_column(name, table, scan, n))
        else:
            column = values[typed_index[name]]
        # to Spark's form (units, nested field names: str() shows what == ignores)
        if not (column.type == field.type and str(column.type) == str(field.type)):
            column = column.cast(field.type)
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _typed_values(table: pa.Table, typed, wanted: list[int]) -> dict[int, pa.Array]:
    """The typed fields ``wanted`` (indices into ``typed.target``) of ROW_SCHEMA rows."""
    if all(STORED_TYPED_PREFIX + str(i) in table.column_names for i in wanted):
        # a tier object's own typed columns (``_read_parquet`` checked they are what decoding
        # gives), or a record without fields
        return {i: _as_array(table[STORED_TYPED_PREFIX + str(i)]) for i in wanted}
    from spark_source.typed import typed_arrays
    arrays = typed_arrays(table, typed)
    return {i: arrays[i] for i in wanted}


STORED_TYPED_PREFIX = "__pulsarlite_typed_"     # the i-th typed field, read from a tier object


def _as_array(c):
    if isinstance(c, pa.ChunkedArray):
        # one chunk (a row group's read): the chunk itself, not a copy of it
        return c.chunk(0) if c.num_chunks == 1 else c.combine_chunks()
    return c


from spark_source.metrics import record  # noqa: E402


# -- reading -------------------------------------------------------------------------------------
def read_scans(scans: tuple[SegmentScan, ...], settings: ReadSettings) -> Iterator[pa.RecordBatch]:
    """Output batches of every scan, in order."""
    loop = None
    client = None
    try:
        for scan in scans:
            started = time.monotonic()
            rows = 0
            location = scan.location
            if location is Location.TIER:
                tables = _read_tier(scan, settings)
            elif location is Location.COMPACTED:
                if loop is None:
                    loop = asyncio.new_event_loop()
                    client = loop.run_until_complete(_connect(settings))
                tables = _read_compacted(scan, settings, loop, client)
            else:
                if loop is None:
                    loop = asyncio.new_event_loop()
                    client = loop.run_until_complete(_connect(settings))
                tables = _read_bookies(scan, settings, loop, client)
            record(settings.metrics_dir, "opened", {"topic": scan.topic, "ledger_id": scan.ledger_id,
                                                    "location": location.value})
            log.info("segment scan started topic=%s ledger=%d entries=%d..%d location=%s", scan.topic,
                     scan.ledger_id, scan.first_entry_id, scan.last_entry_id, location.value)
            for table, exact in tables:
                if location is Location.COMPACTED:
                    table = filter_compacted_rows(table, scan)
                elif not exact:
                    table = filter_rows(table, scan)
                if table.num_rows:
                    rows += table.num_rows
                    yield to_output(table, scan, settings=settings)
            log.info("segment scan done topic=%s ledger=%d rows=%d elapsed_ms=%d", scan.topic, scan.ledger_id,
                     rows, int((time.monotonic() - started) * 1000))
    finally:
        if loop is not None:
            if client is not None:
                loop.run_until_complete(client.close())
            loop.close()


async def _connect(settings: ReadSettings):
    from bookie.client.ledger_client import LedgerClient
    from spark_source.options import ledger_client_config
    from spark_source.options import source_client_settings
    return await LedgerClient.connect(ledger_client_config(settings.zookeeper, settings.bookie_auth_token,
                                                           settings.bookie_auth_token_file,
                                                           source_client_settings(settings)))


def _read_bookies(scan: SegmentScan, settings: ReadSettings, loop, client) -> Iterator[pa.Table]:
    # the same rows as offload.format.entries_to_table; batches of plain messages decoded
    # without a Python object per message
    from offload.format import entries_to_table_fast
    from pulsarlite.errors import MetadataNotFoundError, NoSuchLedgerError

    try:
        reader = loop.run_until_complete(client.open_ledger(scan.ledger_id, recovery=False))
    except (MetadataNotFoundError, NoSuchLedgerError):
        # deleted from the bookies since planning: offloaded meanwhile, or gone (retention)
        uri = loop.run_until_complete(_tier_uri_now(client, scan))
        if uri is None:
            msg = f"topic {scan.topic}: ledger {scan.ledger_id} is gone from the bookies and not offloaded"
            if settings.fail_on_data_loss:
                raise DataLossError(msg + " (failOnDataLoss=true)")
            log.warning("%s: skipped (failOnDataLoss=false)", msg)
            return
        log.info("ledger moved to the tier since planning topic=%s ledger=%d uri=%s", scan.topic,
                 scan.ledger_id, uri)
        yield from _read_parquet(uri, scan, settings)
        return
    if not reader.metadata.is_closed:
        # planning saw these entries confirmed (bookies' LAC or the owner broker's last confirmed)
        reader.last_add_confirmed = max(reader.last_add_confirmed, scan.last_entry_id)
    last = min(scan.last_entry_id, reader.last_readable_entry_id)
    if last < scan.last_entry_id:
        raise DataLossError(f"topic {scan.topic}: ledger {scan.ledger_id} has entries only up to {last}, "
                       f"planned up to {scan.last_entry_id}")
    for entries in _read_in_chunks(loop, reader, scan.first_entry_id, last, settings.chunk_entries):
        yield entries_to_table_fast(scan.ledger_id, ((e.entry_id, e.payload) for e in entries),
                                    partition=scan.partition), False


def _read_in_chunks(loop, reader, first_entry_id: int, last_entry_id: int, chunk_entries: int):
    """Entries ``first_entry_id..last_entry_id`` of an open ledger ``reader``, read and yielded
    ``chunk_entries`` at a time (lists of entries, in order)."""
    for first in range(first_entry_id, last_entry_id + 1, chunk_entries):
        yield loop.run_until_complete(reader.read(first, min(first + chunk_entries - 1, last_entry_id)))



def _position_at_least(table: pa.Table, p: Position):
    """Rows whose (ledger, entry, batch index) >= ``p``, lexicographically."""
    ledger, entry, batch = table["ledger_id"], table["entry_id"], table["batch_index"]
    return pc.or_(pc.greater(ledger, p.ledger_id), pc.and_(pc.equal(ledger, p.ledger_id), pc.or_(
        pc.greater(entry, p.entry_id), pc.and_(pc.equal(entry, p.entry_id),
                                               pc.greater_equal(batch, p.batch_index)))))


def filter_compacted_rows(table: pa.Table, scan: SegmentScan) -> pa.Table:
    """Rows of a compacted-ledger scan (original ids) inside ``[start, end)`` and the
    publish-time bounds."""
    if table.num_rows == 0:
        return table
    mask = _position_at_least(table, scan.start)
    if scan.end is not None:
        mask = pc.and_(mask, pc.invert(_position_at_least(table, scan.end)))
    publish_ms = pc.cast(table["publish_time"], pa.int64())
    if scan.publish_time_min_ms is not None:
        mask = pc.and_(mask, pc.greater_equal(publish_ms, scan.publish_time_min_ms))
    if scan.publish_time_max_ms is not None:
        mask = pc.and_(mask, pc.less_equal(publish_ms, scan.publish_time_max_ms))
    return table.filter(mask)


def ack_set_indexes(words) -> list[int]:
    """The batch indexes an ack set delivers (Java BitSet words, signed int64, bit i of the
    whole = batch index i; the MESSAGE ack_set form the broker dispatches)."""
    bits = 0
    for k, w in enumerate(words):
        bits |= (int(w) & 0xFFFF_FFFF_FFFF_FFFF) << (64 * k)
    return [i for i in range(bits.bit_length()) if bits >> i & 1]


_BATCH_KEY_SHIFT = 20      # entry id * 2**20 + batch index: one int64 per message of a chunk


def rows_of_compacted(entries, partition: int) -> Iterator[pa.Table]:
    """ROW_SCHEMA rows of compacted-ledger entries (payloads in the codec of
    pulsarlite.wire.compacted): each original entry decoded by the shared entry decoder under its
    ORIGINAL (ledger, entry) position, then only the messages its ack set delivers (all of it
    without one), as the broker's dispatch of the compacted view delivers them to
    ``read_compacted`` readers. One table per run of entries of one original ledger."""
    from offload.format import entries_to_table_fast
    from pulsarlite.wire.compacted import decode_compacted

    def flush(ledger_id, run, whole, keep):
        table = entries_to_table_fast(ledger_id, run, partition=partition)
        if table.num_rows == 0 or len(whole) == len(run):
            return table
        mask = pc.is_in(table["entry_id"], pa.array(whole, pa.int64()))
        if keep:
            key = pc.add(pc.multiply(table["entry_id"].cast(pa.int64()), 1 << _BATCH_KEY_SHIFT),
                         table["batch_index"].cast(pa.int64()))
            mask = pc.or_(mask, pc.is_in(key, pa.array(keep, pa.int64())))
        return table.filter(mask)

    ledger_id, run, whole, keep = None, [], [], []
    for e in entries:
        got = decode_compacted(bytes(e.payload))
        if got.ledger_id != ledger_id and run:
            yield flush(ledger_id, run, whole, keep)
            run, whole, keep = [], [], []
        ledger_id = got.ledger_id
        run.append((got.entry_id, got.data))
        if got.ack_set is None:
            whole.append(got.entry_id)
        else:
            keep.extend((got.entry_id << _BATCH_KEY_SHIFT) + i for i in ack_set_indexes(got.ack_set))
    if run:
        yield flush(ledger_id, run, whole, keep)


def _read_compacted(scan: SegmentScan, settings: ReadSettings, loop, client) -> Iterator[tuple[pa.Table, bool]]:
    """The planned compacted ledger, from its bookies (it is never offloaded)."""
    from pulsarlite.errors import MetadataNotFoundError, NoSuchLedgerError
    try:
        reader = loop.run_until_complete(client.open_ledger(scan.ledger_id, recovery=False))
    except (MetadataNotFoundError, NoSuchLedgerError):
        raise CompactedViewGone(
            f"topic {scan.topic}: compacted ledger {scan.ledger_id} is gone since planning (a newer "
            f"compaction replaced the view, or the topic was deleted); read again to plan the new view"
        ) from None
    last = min(scan.last_entry_id, reader.last_readable_entry_id)
    if last < scan.last_entry_id:
        raise CompactedViewGone(f"topic {scan.topic}: compacted ledger {scan.ledger_id} has entries only up "
                                f"to {last}, planned up to {scan.last_entry_id}")
    for entries in _read_in_chunks(loop, reader, scan.first_entry_id, last, settings.chunk_entries):
        for table in rows_of_compacted(entries, scan.partition):
            yield table, False


async def _tier_uri_now(client, scan: SegmentScan) -> str | None:
    from spark_source.metadata import read_partition
    p = await read_partition(client.store, None, scan.topic, scan.partition, must_exist=False)
    for lg in p.ledgers:
        if lg.ledger_id == scan.ledger_id and lg.location is Location.TIER:
            return lg.offload_uri
    return None


def _read_tier(scan: SegmentScan, settings: ReadSettings) -> Iterator[pa.Table]:
    if not scan.uri:
        raise DataLossError(f"topic {scan.topic}: ledger {scan.ledger_id} is offloaded without a URI")
    yield from _read_parquet(scan.uri, scan, settings)


def _constant_int(rg, column_index: int) -> int | None:
    """The one value of an int column in a row group, when its statistics prove there is only
    one (min == max, no nulls), else None."""
    st = rg.column(column_index).statistics
    if st is None or not st.has_min_max or not st.has_null_count or st.null_count != 0:
        return None
    return int(st.min) if st.min == st.max else None


def _stat_range(rg, column_index: int):
    st = rg.column(column_index).statistics
    if st is None or not st.has_min_max:
        return None
    return st.min, st.max


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _as_ms(v) -> int:
    """A publish-time statistic in ms, exactly (``int(v.timestamp() * 1000)`` is off by one for
    ~1% of values: float rounding)."""
    if isinstance(v, datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=timezone.utc)
        return (v - _EPOCH) // timedelta(milliseconds=1)
    return int(v)


READ_COLUMNS = ["ledger_id", "entry_id", "batch_index", "publish_time", "event_time", "key", "properties",
                "producer_name", "sequence_id", "value"]


def needed_row_columns(settings: ReadSettings) -> list[str]:
    """The ROW_SCHEMA columns the output's metadata columns are built from, in READ_COLUMNS'
    order (typed columns come on top: stored ones, or ``value`` + ``schema_version``)."""
    needed = {c for name in output_names(settings) if name in METADATA_SOURCES for c in METADATA_SOURCES[name]}
    return [c for c in READ_COLUMNS if c in needed]


def row_group_exact(rg, entry_col: int, time_col: int, scan: SegmentScan) -> bool:
    """True when the row group's statistics prove every row of it is wanted by ``scan`` (so
    the rows need no filtering, and the filter columns need not be read)."""
    er = _stat_range(rg, entry_col)
    if er is None or er[0] < scan.first_entry_id or er[1] > scan.last_entry_id:
        return False
    if (scan.start.ledger_id == scan.ledger_id and scan.start.batch_index > 0
            and er[0] <= scan.start.entry_id <= er[1]):
        return False
    if (scan.end is not None and scan.end.ledger_id == scan.ledger_id and scan.end.batch_index >= 0
            and er[0] <= scan.end.entry_id <= er[1]):
        return False
    if scan.publish_time_min_ms is None and scan.publish_time_max_ms is None:
        return True
    tr = _stat_range(rg, time_col)
    if tr is None:
        return False
    lo, hi = _as_ms(tr[0]), _as_ms(tr[1])
    return ((scan.publish_time_min_ms is None or lo >= scan.publish_time_min_ms)
            and (scan.publish_time_max_ms is None or hi <= scan.publish_time_max_ms))


def _read_parquet(uri: str, scan: SegmentScan, settings: ReadSettings) -> Iterator[tuple[pa.Table, bool]]:
    """Row groups of the segment's Parquet object that may hold wanted rows (by entry id and
    publish time statistics), pages checksum-verified, each with whether it is exact (every
    row wanted: no filter needed). Only the columns the output needs are read (plus the filter
    columns for a row group that is not exact)."""
    from offload.format import read_row_groups
    from offload.reader import TierReader

    what = f"topic {scan.topic} ledger {scan.ledger_id} ({uri})"
    with TierReader(uri, s3_endpoint_url=settings.s3_endpoint_url, read_ahead_row_groups=0, what=what) as reader:
        pf = reader.parquet_file(read_dictionary=["producer_name"])
        names = pf.schema_arrow.names
        entry_col, time_col = names.index("entry_id"), names.index("publish_time")
        ledger_col = names.index("ledger_id")
        md = pf.metadata
        wanted = []
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            er = _stat_range(rg, entry_col)
            if er is not None and (er[1] < scan.first_entry_id or er[0] > scan.last_entry_id):
                continue
            tr = _stat_range(rg, time_col)
            if tr is not None:
                lo, hi = _as_ms(tr[0]), _as_ms(tr[1])
                if ((scan.publish_time_min_ms is not None and hi < scan.publish_time_min_ms)
                        or (scan.publish_time_max_ms is not None and lo > scan.publish_time_max_ms)):
                    continue
            wanted.append(i)
        skipped = md.num_row_groups - len(wanted)
        if skipped:
            log.info("row groups pruned topic=%s ledger=%d pruned=%d of=%d", scan.topic, scan.ledger_id,
                     skipped, md.num_row_groups)
        record(settings.metrics_dir, "rowgroups", {"ledger_id": scan.ledger_id, "total": md.num_row_groups,
                                                   "read": len(wanted)})
        typed_fields = wanted_typed(settings)
        stored = _stored_typed(pf, scan, settings.typed) if typed_fields else None
        if typed_fields:
            record(settings.metrics_dir, "typed", {"ledger_id": scan.ledger_id, "location": "tier",
                                                   "source": "decoded" if stored is None else "stored"})
        columns = needed_row_columns(settings)
        if typed_fields:
            if stored is None:
                columns += [c for c in ("value", "schema_version") if c not in columns]
            else:
                columns += sorted({stored[i] for i in typed_fields if stored[i] is not None} - set(columns))
        record(settings.metrics_dir, "columns", {"ledger_id": scan.ledger_id, "columns": columns})
        for i in wanted:
            rg = md.row_group(i)
            exact = row_group_exact(rg, entry_col, time_col, scan)
            read = columns if exact else columns + [c for c in FILTER_COLUMNS if c not in columns]
            # one ledger id in the row group (its statistics say so): a constant column, not read
            ledger_id = _constant_int(rg, ledger_col) if "ledger_id" in read else None
            if ledger_id is not None:
                read = [c for c in read if c != "ledger_id"]
            # nothing to read (e.g. only topic/partition wanted): the smallest column gives the rows
            table = read_row_groups(pf, [i], columns=read or ["batch_index"], what=what)
            if ledger_id is not None:
                table = table.append_column("ledger_id", pa.repeat(pa.scalar(ledger_id, pa.int64()),
                                                                   table.num_rows))
            if stored is not None:
                table = _with_stored_typed(table, stored, settings.typed, typed_fields)
            yield table, exact


def _stored_typed(pf, scan: SegmentScan, typed) -> list[str | None] | None:
    """The object's columns for the query's typed fields (None for a field the object's rows
    all lack), or None: decode ``value`` (no typed columns, or built from other versions)."""
    if typed is None:
        return None
    from offload.typed_columns import stored_columns
    stored = stored_columns(pf.metadata.metadata, pf.schema_arrow, typed.versions, typed.target)
    log.info("typed columns of a tier segment topic=%s ledger=%d source=%s", scan.topic, scan.ledger_id,
             "stored" if stored is not None else "decoded")
    return stored


def _with_stored_typed(table: pa.Table, stored: list[str | None], typed, fields: list[int]) -> pa.Table:
    """``table`` with the stored typed columns ``fields`` (indices into ``typed.target``) under
    the names ``to_output`` looks for."""
    for i in fields:
        column, f = stored[i], typed.target.field(i)
        array = table[column] if column is not None else pa.nulls(table.num_rows, f.type)
        table = table.append_column(STORED_TYPED_PREFIX + str(i), array)
    return table


__all__ = ["OUTPUT_DDL", "OUTPUT_SCHEMA", "ReadSettings", "DataLossError", "filter_rows", "read_scans", "record",
           "to_output"]
