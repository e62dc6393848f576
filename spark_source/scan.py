"""Reading one planned segment (shell, runs in Spark's Python workers): from the bookies with the
ledger client (no fencing, any replica, failover, CRC checks) or as Parquet from the object
store. Both paths produce ``offload.format.ROW_SCHEMA`` tables (bookie entries go through
``entries_to_table``), so the output columns are identical whatever the segment's location.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from spark_source.plan import Location, SegmentScan

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


def to_output(table: pa.Table, scan: SegmentScan, typed=None) -> pa.RecordBatch:
    """ROW_SCHEMA rows -> the DataFrame's columns (and the typed value columns, if any)."""
    n = table.num_rows
    ledger = table["ledger_id"]
    entry = table["entry_id"]
    batch = table["batch_index"]
    partition = pa.repeat(pa.scalar(scan.partition, pa.int32()), n)
    message_id = pc.binary_join_element_wise(
        pc.cast(ledger, pa.string()), pc.cast(entry, pa.string()), pc.cast(partition, pa.string()),
        pc.cast(batch, pa.string()), ":")
    columns = [
        table["key"].cast(pa.string()),
        table["value"].cast(pa.binary()),
        pa.repeat(pa.scalar(scan.topic, pa.string()), n),
        partition,
        message_id,
        ledger.cast(pa.int64()),
        entry.cast(pa.int64()),
        batch.cast(pa.int32()),
        table["publish_time"].cast(TS),
        table["event_time"].cast(TS),
        table["properties"].cast(pa.map_(pa.string(), pa.string())),
        table["producer_name"].cast(pa.string()),
        table["sequence_id"].cast(pa.int64()),
    ]
    columns = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    if typed is None:
        return pa.RecordBatch.from_arrays(columns, schema=OUTPUT_SCHEMA)
    from spark_source.typed import typed_arrays
    fields = typed.output_fields()
    schema = pa.schema(list(OUTPUT_SCHEMA) + fields)
    if all(STORED_TYPED_PREFIX + str(i) in table.column_names for i in range(len(fields))):
        # a tier object's own typed columns (``_read_parquet`` checked they are what decoding
        # gives), or a record without fields
        values = [_as_array(table[STORED_TYPED_PREFIX + str(i)]) for i in range(len(fields))]
    else:
        values = typed_arrays(table, typed)
    # to Spark's form (units, nested field names: str() shows what == ignores)
    values = [v if str(v.type) == str(f.type) else v.cast(f.type) for v, f in zip(values, fields)]
    return pa.RecordBatch.from_arrays(columns + values, schema=schema)


STORED_TYPED_PREFIX = "__pulsarlite_typed_"     # the i-th typed field, read from a tier object


def _as_array(c):
    return c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c


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
            else:
                if loop is None:
                    loop = asyncio.new_event_loop()
                    client = loop.run_until_complete(_connect(settings.zookeeper))
                tables = _read_bookies(scan, settings, loop, client)
            record(settings.metrics_dir, "opened", {"topic": scan.topic, "ledger_id": scan.ledger_id,
                                                    "location": location.value})
            log.info("segment scan started topic=%s ledger=%d entries=%d..%d location=%s", scan.topic,
                     scan.ledger_id, scan.first_entry_id, scan.last_entry_id, location.value)
            for table in tables:
                table = filter_rows(table, scan)
                if table.num_rows:
                    rows += table.num_rows
                    yield to_output(table, scan, settings.typed)
            log.info("segment scan done topic=%s ledger=%d rows=%d elapsed_ms=%d", scan.topic, scan.ledger_id,
                     rows, int((time.monotonic() - started) * 1000))
    finally:
        if loop is not None:
            if client is not None:
                loop.run_until_complete(client.close())
            loop.close()


async def _connect(zookeeper: str):
    from bookie.client.ledger_client import LedgerClient
    from pulsarlite.config import LedgerClientConfig
    return await LedgerClient.connect(LedgerClientConfig(zookeeper=zookeeper))


def _read_bookies(scan: SegmentScan, settings: ReadSettings, loop, client) -> Iterator[pa.Table]:
    from offload.format import entries_to_table
    from pulsarlite.errors import MetadataNotFoundError, NoSuchLedgerError

    try:
        reader = loop.run_until_complete(client.open_ledger(scan.ledger_id, recovery=False))
    except (MetadataNotFoundError, NoSuchLedgerError):
        # deleted from the bookies since planning: offloaded meanwhile, or gone (retention)
        uri = loop.run_until_complete(_tier_uri_now(client, scan))
        if uri is None:
            msg = f"topic {scan.topic}: ledger {scan.ledger_id} is gone from the bookies and not offloaded"
            if settings.fail_on_data_loss:
                raise DataLoss(msg + " (failOnDataLoss=true)")
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
        raise DataLoss(f"topic {scan.topic}: ledger {scan.ledger_id} has entries only up to {last}, "
                       f"planned up to {scan.last_entry_id}")
    step = settings.chunk_entries
    for first in range(scan.first_entry_id, last + 1, step):
        entries = loop.run_until_complete(reader.read(first, min(first + step - 1, last)))
        yield entries_to_table(scan.ledger_id, ((e.entry_id, e.payload) for e in entries),
                               partition=scan.partition)


class DataLoss(RuntimeError):
    pass


async def _tier_uri_now(client, scan: SegmentScan) -> str | None:
    from spark_source.metadata import read_partition
    p = await read_partition(client.store, None, scan.topic, scan.partition, must_exist=False)
    for lg in p.ledgers:
        if lg.ledger_id == scan.ledger_id and lg.location is Location.TIER:
            return lg.offload_uri
    return None


def _read_tier(scan: SegmentScan, settings: ReadSettings) -> Iterator[pa.Table]:
    if not scan.uri:
        raise DataLoss(f"topic {scan.topic}: ledger {scan.ledger_id} is offloaded without a URI")
    yield from _read_parquet(scan.uri, scan, settings)


def _stat_range(rg, column_index: int):
    st = rg.column(column_index).statistics
    if st is None or not st.has_min_max:
        return None
    return st.min, st.max


def _as_ms(v) -> int:
    if hasattr(v, "timestamp"):
        return int(v.timestamp() * 1000)
    return int(v)


READ_COLUMNS = ["ledger_id", "entry_id", "batch_index", "publish_time", "event_time", "key", "properties",
                "producer_name", "sequence_id", "value"]


def _read_parquet(uri: str, scan: SegmentScan, settings: ReadSettings) -> Iterator[pa.Table]:
    """Row groups of the segment's Parquet object that may hold wanted rows (by entry id and
    publish time statistics), pages checksum-verified."""
    from offload.format import open_parquet, read_row_groups

    with _open_input(uri, settings) as source:
        what = f"topic {scan.topic} ledger {scan.ledger_id} ({uri})"
        pf = open_parquet(source, what=what)
        names = pf.schema_arrow.names
        entry_col, time_col = names.index("entry_id"), names.index("publish_time")
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
        stored = _stored_typed(pf, scan, settings.typed)
        if settings.typed is not None:
            record(settings.metrics_dir, "typed", {"ledger_id": scan.ledger_id, "location": "tier",
                                                   "source": "decoded" if stored is None else "stored"})
        columns = READ_COLUMNS if settings.typed is None else READ_COLUMNS + ["schema_version"]
        if stored is not None:
            columns = READ_COLUMNS + sorted({c for c in stored if c is not None})
        for i in wanted:
            table = read_row_groups(pf, [i], columns=columns, what=what)
            yield table if stored is None else _with_stored_typed(table, stored, settings.typed)


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


def _with_stored_typed(table: pa.Table, stored: list[str | None], typed) -> pa.Table:
    """``table`` with the stored typed columns under the names ``to_output`` looks for."""
    for i, (column, f) in enumerate(zip(stored, typed.target)):
        array = table[column] if column is not None else pa.nulls(table.num_rows, f.type)
        table = table.append_column(STORED_TYPED_PREFIX + str(i), array)
    return table


def _open_input(uri: str, settings: ReadSettings):
    """A pyarrow-readable file for ``uri`` (s3:// through the object store, file:// directly)."""
    from offload.store import open_input_file
    return open_input_file(uri, s3_endpoint_url=settings.s3_endpoint_url)


__all__ = ["OUTPUT_DDL", "OUTPUT_SCHEMA", "ReadSettings", "DataLoss", "filter_rows", "read_scans", "record",
           "to_output"]
