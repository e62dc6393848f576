"""[lakehouse] ``scan(topic)`` / ``scan_batches(topic)``: the fresh view of a topic in Arrow --
the rows of its Iceberg table (offload/lake.py) plus the entries not in the table yet, with the
table's columns and the messages' ids, each message once. ``scan_batches`` returns a
``pyarrow.RecordBatchReader`` read ledger by ledger (bounded memory); ``scan`` is that stream
read to one table (one path).

Protocol (one consistent cut, at ledger boundaries, taken before the reader is returned):

1. the topic's managed-ledger list is read from ZooKeeper (for each partition; an open ledger's
   last entry is its LAC, or the owner broker's last confirmed entry with ``admin_url``);
2. then the table's current snapshot (``GET .../lake`` -> ``metadata_location``, read with
   pyiceberg's ``StaticTable``: no catalog credentials needed); both admin calls carry the
   options' ``adminToken`` / ``adminTokenFile`` (``Authorization: Bearer``) as the Spark
   source's do;
3. every ledger of the list is read from exactly one place: from the snapshot when its object is
   one of the snapshot's data files (that file through pyiceberg's ``ArrowScan``: the table's
   projection); else from its tier object when it is offloaded (the table commit lags the
   offload record), row group by row group; else from the bookies (entries 0..last,
   ``chunk_entries`` at a time, decoded by offload.format's ``entries_to_table_fast``, the
   encoder of the objects, and the typed columns of the schema registry by the offloader's
   ``TableTypedColumns``: the same columns).

Rows of snapshot files whose ledger is no longer in the list (retention trimmed it between 1 and
2) are left out: the list read in step 1 is the cut. Ledgers are read in (partition, ledger_id)
order and each piece is in (entry_id, batch_index) order, so the stream is sorted by
(partition, ledger_id, entry_id, batch_index). Its schema is fixed at the cut: the snapshot's
(its column order and types) plus any column only the other ledgers have (their object
footers, the bookie rows' columns: a schema version the table has not seen yet); every piece is
cast to it (a missing column null).

Publish-time push-down (``start_time_ms`` inclusive, ``end_time_ms`` exclusive: the Spark
source's ``startingTime``/``endingTime``): a closed ledger whose recorded publish-time range
misses it is not read; the snapshot's files are planned with the range as an Iceberg row filter
(day partitions and column statistics prune files); an object's row groups are pruned by their
publish_time statistics; the rows read are filtered.

Column projection (``columns``): the schema above cut to those names (unknown ones: LakeScanError
at the cut, before any row is read); snapshot files are scanned with them as pyiceberg's selected
fields, objects with them as the Parquet column projection (plus ``publish_time`` under a
window), bookie rows are cut to them (typed columns decoded only when one is asked for).

A pyarrow Table / RecordBatchReader is what Polars (``pl.from_arrow``) and DuckDB (a ``FROM
reader`` replacement scan, ``duckdb.from_arrow``) take as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from pulsarlite.errors import PulsarliteError
from pulsarlite.metadata_documents import decode_schema_history
from pulsarlite.topic_name import TopicName

log = logging.getLogger("pulsarlite.lake")

ON_TIER = ("offloaded", "bookie-deleted")


class LakeScanError(PulsarliteError):
    """The fresh view cannot be read (no such topic, the lake endpoint refused, a ledger gone)."""


class Source(enum.Enum):
    """Where the scan reads a ledger from."""

    SNAPSHOT = "snapshot"      # its object is a data file of the table's current snapshot
    OBJECT = "object"          # offloaded, not in the table yet (the commit lags the record)
    BOOKIES = "bookies"        # not offloaded (the open ledger: up to its last confirmed entry)


def plan_sources(ledgers, snapshot_files: set[str]) -> list[tuple[Any, Source]]:
    """Each non-empty ledger of a partition's list (``LedgerSegment``s: ``ledger_id``,
    ``last_entry_id``, ``offload_state``, ``offload_uri``) with the one place it is read from
    (pure). An offloaded ledger still on the bookies (deletion lag) is read from its object."""
    out = []
    for seg in ledgers:
        if seg.offload_uri is not None and seg.offload_uri in snapshot_files:
            out.append((seg, Source.SNAPSHOT))
        elif seg.last_entry_id < 0:
            continue
        elif seg.offload_state in ON_TIER and seg.offload_uri:
            out.append((seg, Source.OBJECT))
        else:
            out.append((seg, Source.BOOKIES))
    return out


@dataclasses.dataclass
class ScanReport:
    """What a scan read, filled as its stream is consumed (pass one to count)."""

    ledgers_total: int = 0                 # non-empty ledgers of the cut
    ledgers_pruned_by_time: list[int] = dataclasses.field(default_factory=list)
    snapshot_files_read: int = 0
    objects_read: int = 0                  # tier objects not in the table yet
    row_groups_read: int = 0               # of those objects
    row_groups_pruned: int = 0             # by their publish_time statistics
    bookie_ledgers_read: int = 0
    bookie_entries_read: int = 0
    rows: int = 0


def scan(topic: str, *, zookeeper: str, admin_url: str, s3_endpoint_url: str | None = None,
         options: Mapping[str, str] | None = None, chunk_entries: int = 1000, start_time_ms: int | None = None,
         end_time_ms: int | None = None, columns: Sequence[str] | None = None,
         report: ScanReport | None = None) -> pa.Table:
    """Every message of ``topic`` (a partitioned topic: all partitions) as one Arrow table: the
    stream of ``scan_batches`` (same arguments) read to its end (see the module docstring)."""
    with scan_batches(topic, zookeeper=zookeeper, admin_url=admin_url, s3_endpoint_url=s3_endpoint_url,
                      options=options, chunk_entries=chunk_entries, start_time_ms=start_time_ms,
                      end_time_ms=end_time_ms, columns=columns, report=report) as reader:
        return reader.read_all()


def scan_batches(topic: str, *, zookeeper: str, admin_url: str, s3_endpoint_url: str | None = None,
                 options: Mapping[str, str] | None = None, chunk_entries: int = 1000,
                 start_time_ms: int | None = None, end_time_ms: int | None = None,
                 columns: Sequence[str] | None = None, report: ScanReport | None = None) -> pa.RecordBatchReader:
    """Every message of ``topic`` as a ``pyarrow.RecordBatchReader``, ledger by ledger in
    (partition, ledger_id, entry_id, batch_index) order: snapshot data files and tier objects
    row group by row group, bookie ledgers ``chunk_entries`` entries at a time, so memory stays
    bounded by one such piece. The cut (ledger list, snapshot, schema) is taken here, before
    this returns; the rows are read as the reader is consumed. The reader holds a ZooKeeper
    session until it is read to its end or released (garbage-collected: pyarrow's ``close()``
    keeps the Python iterator that owns it).

    ``zookeeper``: the cluster's metadata store; ``admin_url``: a broker's admin URL (the lake
    endpoint, the open ledger's last confirmed entry); ``s3_endpoint_url`` for an s3:// tier;
    ``options``: the Spark source's connection options for a secured cluster (``adminToken`` /
    ``adminTokenFile`` for the admin calls, ``bookieAuthToken``, ``zookeeperAuthDigest``,
    ``bookieTlsTrustCertsFile``..., docs/spark.md), read and checked by the same code.
    ``start_time_ms`` (inclusive) / ``end_time_ms`` (exclusive): only messages published in
    that range, the Spark source's ``startingTime``/``endingTime`` rule; ledgers whose recorded
    publish-time range misses it, table files pruned by the table's day partitions and
    statistics, and object row groups by their statistics are not read. ``columns``: only these
    columns, in this order (None: all): table files and tier objects read only them (plus
    ``publish_time`` for a window), bookie rows are cut to them (typed columns decoded only
    when one is asked for); a name the topic's schema (at the cut) does not have is a
    LakeScanError raised here, before any row is read. ValueError / OptionError for bad
    arguments (nothing read)."""
    from spark_source.options import parse_options
    if chunk_entries <= 0:
        raise ValueError(f"chunk_entries {chunk_entries} <= 0")
    wanted = _checked_columns(columns)
    name = TopicName.parse(topic)
    times = {k: str(v) for k, v in (("startingTime", start_time_ms), ("endingTime", end_time_ms)) if v is not None}
    opts = parse_options({**(options or {}), **times, "topic": str(name), "zookeeper": zookeeper,
                          "adminUrl": admin_url, **({"s3EndpointUrl": s3_endpoint_url} if s3_endpoint_url else {})},
                         streaming=False)
    token = opts.admin_bearer()
    request = _Request(name, admin_url.rstrip("/"), token, s3_endpoint_url, chunk_entries,
                       opts.starting_time_ms, opts.ending_time_ms, report if report is not None else ScanReport(),
                       wanted)
    loop = asyncio.new_event_loop()
    stream = _stream(opts, request)
    try:
        schema = loop.run_until_complete(stream.__anext__())       # the cut and its schema
    except BaseException:
        _close(loop, stream)
        raise
    return pa.RecordBatchReader.from_batches(schema, _drive(loop, stream, schema))


@dataclasses.dataclass(frozen=True)
class _Request:
    name: TopicName
    admin_url: str
    admin_token: str
    s3_endpoint_url: str | None
    chunk_entries: int
    start_time_ms: int | None          # inclusive
    end_time_ms: int | None            # exclusive
    report: ScanReport
    columns: tuple[str, ...] | None = None    # the projection (None: every column)

    @property
    def windowed(self) -> bool:
        return self.start_time_ms is not None or self.end_time_ms is not None

    def needed(self, have: Sequence[str]) -> list[str] | None:
        """The columns to read from a piece whose columns are ``have`` (None: all): the
        projection's that it has, ``publish_time`` for the window; never none (a row count needs
        one column: ``entry_id`` then)."""
        if self.columns is None:
            return None
        want = list(self.columns) + (["publish_time"] if self.windowed and "publish_time" not in self.columns else [])
        return [c for c in want if c in have] or ["entry_id"]

    def overlaps(self, lo_ms: int | None, hi_ms: int | None) -> bool:
        """False only when a known publish-time range [lo_ms, hi_ms] misses the request's."""
        if self.start_time_ms is not None and hi_ms is not None and hi_ms < self.start_time_ms:
            return False
        return not (self.end_time_ms is not None and lo_ms is not None and lo_ms >= self.end_time_ms)

    def keep(self, table: pa.Table) -> pa.Table:
        """The rows of ``table`` published in the requested range."""
        if not self.windowed:
            return table
        ms = pc.cast(pc.cast(table.column("publish_time"), pa.timestamp("ms", tz="UTC"), safe=False), pa.int64())
        mask = None
        if self.start_time_ms is not None:
            mask = pc.greater_equal(ms, self.start_time_ms)
        if self.end_time_ms is not None:
            below = pc.less(ms, self.end_time_ms)
            mask = below if mask is None else pc.and_(mask, below)
        return table.filter(mask)


def _drive(loop, stream, schema: pa.Schema):
    """The record batches of ``stream`` (an async generator) run on ``loop``, conformed to
    ``schema``; the loop and the stream are closed when it ends or is dropped."""
    try:
        while True:
            try:
                table = loop.run_until_complete(stream.__anext__())
            except StopAsyncIteration:
                return
            yield from _conform(table, schema).to_batches()
    finally:
        _close(loop, stream)


def _close(loop, stream) -> None:
    try:
        loop.run_until_complete(stream.aclose())
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


async def _stream(opts, req: _Request):
    """Yields the schema (after taking the cut), then the rows as tables, ledger by ledger."""
    from spark_source.source import metadata_session
    async with metadata_session(opts) as (store, client):
        plan = await _plan(store, client, req)
        yield plan.schema
        report = req.report
        for p, seg, source in plan.reads:
            if source is Source.SNAPSHOT:
                report.snapshot_files_read += 1
                pieces = _snapshot_tables(plan, seg.ledger_id, seg.offload_uri, req)
            elif source is Source.OBJECT:
                report.objects_read += 1
                pieces = _object_tables(seg.ledger_id, seg.offload_uri, req)
            else:
                report.bookie_ledgers_read += 1
                async for table in _bookie_tables(client, p.topic, p.partition, seg, plan.typed, req):
                    report.rows += table.num_rows
                    yield table
                continue
            for table in pieces:
                report.rows += table.num_rows
                yield table
        log.info("lake scan topic=%s snapshot_files=%d objects=%d bookie_ledgers=%d pruned_by_time=%d rows=%d "
                 "metadata_location=%s", req.name, report.snapshot_files_read, report.objects_read,
                 report.bookie_ledgers_read, len(report.ledgers_pruned_by_time), report.rows, plan.location)


@dataclasses.dataclass(frozen=True)
class _Plan:
    reads: list            # (PartitionLedgers, LedgerSegment, Source), in output order
    schema: pa.Schema
    location: str | None
    snapshot_scan: Any     # pyiceberg DataScan of the current snapshot (time-filtered), or None
    snapshot_tasks: dict   # data file URI -> FileScanTask (those the time filter keeps)
    typed: Any


async def _plan(store, client, req: _Request) -> _Plan:
    """The cut: the ledger lists, then the snapshot; which ledger is read from where; the schema."""
    from spark_source.metadata import expand_topics, read_partition
    members = await expand_topics(store, topics=[str(req.name)], pattern=None)
    partitions = [await read_partition(store, client, t, i, must_exist=False, admin_url=req.admin_url,
                                       admin_token=req.admin_token) for t, i in members]      # 1. the cut
    if not any(p.ledgers for p in partitions):
        raise LakeScanError(f"topic {req.name}: no managed ledger in ZooKeeper (never written?)")
    parent = req.name.partitioned_parent
    location = _metadata_location(req.admin_url, parent, req.admin_token)                     # 2. the snapshot
    table, files = _snapshot(location, req.s3_endpoint_url)
    typed = await _typed_columns(store, str(parent))
    planned = [(p, seg, source) for p in sorted(partitions, key=lambda p: p.partition)
               for seg, source in plan_sources(p.ledgers, files)]                              # 3. each ledger once
    # the schema: the snapshot's (its column order and types), then any column only newer rows have
    schemas = [] if table is None else [_snapshot_schema(table)]
    for p, seg, source in planned:
        if source is Source.OBJECT:
            schemas.append(_object_schema(seg.offload_uri, req.s3_endpoint_url))
        elif source is Source.BOOKIES:
            schemas.append(_bookie_schema(seg.ledger_id, p.partition, typed))
    schema = _projected(_union(schemas), req.columns, req.name)
    snapshot_scan, tasks = None, {}
    if table is not None:
        snapshot_scan = _snapshot_scan(table, req)
        tasks = {task.file.file_path: task for task in snapshot_scan.plan_files()}
    reads = []
    for p, seg, source in planned:
        req.report.ledgers_total += 1
        pruned = not req.overlaps(seg.min_publish_time_ms, seg.max_publish_time_ms) or (
            source is Source.SNAPSHOT and seg.offload_uri not in tasks)
        if pruned:
            req.report.ledgers_pruned_by_time.append(seg.ledger_id)
        else:
            reads.append((p, seg, source))
    return _Plan(reads, schema, location, snapshot_scan, tasks, typed)


def _checked_columns(columns: Sequence[str] | None) -> tuple[str, ...] | None:
    """``columns`` as a tuple; ValueError for a non-list, an empty list, a non-string or a
    repeated name."""
    if columns is None:
        return None
    if isinstance(columns, (str, bytes)) or not isinstance(columns, Sequence):
        raise ValueError(f"columns must be a list of column names, got {columns!r}")
    if not columns:
        raise ValueError("columns is empty (None reads every column)")
    bad = [c for c in columns if not isinstance(c, str) or not c]
    if bad:
        raise ValueError(f"columns must be non-empty strings, got {bad!r}")
    twice = sorted({c for c in columns if list(columns).count(c) > 1})
    if twice:
        raise ValueError(f"columns named more than once: {twice}")
    return tuple(columns)


def _projected(schema: pa.Schema, columns: tuple[str, ...] | None, topic) -> pa.Schema:
    """``schema`` cut to ``columns``, in their order; LakeScanError naming the unknown ones and
    the topic's columns."""
    if columns is None:
        return schema
    unknown = [c for c in columns if schema.get_field_index(c) < 0]
    if unknown:
        raise LakeScanError(f"topic {topic}: no column {', '.join(map(repr, unknown))}; its columns are "
                            f"{', '.join(schema.names)}")
    return pa.schema([schema.field(c) for c in columns])


def _snapshot_scan(table, req: _Request):
    """The snapshot's scan: the window as a row filter, the projection's columns that the table
    has as the selected fields (pyiceberg reads only those columns of the data files, and the
    filter's)."""
    names = {f.name for f in table.schema().fields}
    selected = ("*",) if req.columns is None else tuple(req.needed(names) or ())
    return table.scan(row_filter=_time_filter(req), selected_fields=selected)


def _time_filter(req: _Request):
    """The request's publish-time range as an Iceberg row filter (microseconds)."""
    from pyiceberg.expressions import AlwaysTrue, And, GreaterThanOrEqual, LessThan
    out = AlwaysTrue()
    if req.start_time_ms is not None:
        out = And(out, GreaterThanOrEqual("publish_time", req.start_time_ms * 1000))
    if req.end_time_ms is not None:
        out = And(out, LessThan("publish_time", req.end_time_ms * 1000))
    return out


def _snapshot_schema(table) -> pa.Schema:
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    return schema_to_pyarrow(table.schema(), include_field_ids=False)


def _snapshot_tables(plan: _Plan, ledger_id: int, uri: str, req: _Request):
    """One ledger's rows of the snapshot (its data file), batch by batch, through pyiceberg
    (the table's projection: renamed/added columns, the row filter)."""
    from pyiceberg.expressions import And, EqualTo
    from pyiceberg.io.pyarrow import ArrowScan
    scan_ = plan.snapshot_scan
    arrow_scan = ArrowScan(scan_.table_metadata, scan_.io, scan_.projection(),
                           And(scan_.row_filter, EqualTo("ledger_id", ledger_id)), scan_.case_sensitive)
    with _gone(ledger_id, uri):
        for batch in arrow_scan.to_record_batches([plan.snapshot_tasks[uri]]):
            yield pa.Table.from_batches([batch])


@contextlib.contextmanager
def _gone(ledger_id: int, uri: str):
    """A file or object deleted since the cut (retention while the stream was read) ->
    LakeScanError."""
    from offload.store import ObjectNotFoundError
    try:
        yield
    except (FileNotFoundError, ObjectNotFoundError) as e:
        raise LakeScanError(f"ledger {ledger_id}: {uri} is gone since the scan's cut (retention meanwhile?): "
                            f"scan again ({e})") from None


def _object_schema(uri: str, s3_endpoint_url: str | None) -> pa.Schema:
    from offload.reader import TierReader
    with TierReader(uri, s3_endpoint_url=s3_endpoint_url, read_ahead_row_groups=0, whole_object_bytes_max=0) as r:
        return r.schema


def _object_tables(ledger_id: int, uri: str, req: _Request):
    """A tier object's rows, row group by row group (those whose publish_time statistics
    overlap the requested range)."""
    from offload.reader import TierReader
    with _gone(ledger_id, uri), TierReader(uri, s3_endpoint_url=req.s3_endpoint_url, read_ahead_row_groups=1) as reader:
        keep = [i for i in range(reader.num_row_groups) if req.overlaps(*_row_group_times(reader.metadata, i))]
        req.report.row_groups_pruned += reader.num_row_groups - len(keep)
        for table in reader.read_row_group_tables(keep, columns=req.needed(reader.schema.names)):
            req.report.row_groups_read += 1
            yield req.keep(table)


def _row_group_times(metadata, index: int) -> tuple[int | None, int | None]:
    """(min, max) publish time (ms) of a row group from its statistics ((None, None): unknown)."""
    rg = metadata.row_group(index)
    for c in range(rg.num_columns):
        col = rg.column(c)
        if col.path_in_schema == "publish_time":
            st = col.statistics
            if st is None or not st.has_min_max or col.physical_type != "INT64":
                return None, None
            unit = metadata.schema.to_arrow_schema().field("publish_time").type.unit
            div = {"ms": 1, "us": 1000, "ns": 1_000_000}.get(unit)
            return (None, None) if div is None else (st.min_raw // div, st.max_raw // div)
    return None, None


def _bookie_schema(ledger_id: int, partition: int, typed) -> pa.Schema:
    from offload.format import entries_to_table_fast
    return _with_typed(entries_to_table_fast(ledger_id, [], partition=partition), typed).schema


def _with_typed(table: pa.Table, typed) -> pa.Table:
    if typed is not None:
        for field, array in zip(typed.fields, typed.arrays(table)):
            table = table.append_column(field, pa.array(array, field.type) if not isinstance(
                array, (pa.Array, pa.ChunkedArray)) else array)
    return table


def _metadata_location(admin_url: str, parent: TopicName, admin_token: str = "") -> str | None:
    """The table's current metadata file (``GET .../lake``, with ``Authorization: Bearer
    admin_token`` when a token is given); None when there is no table yet."""
    url = (f"{admin_url}/admin/v2/persistent/{parent.tenant}/{parent.namespace_local_name}/"
           f"{parent.encoded_local_name}/lake")
    headers = {"Accept": "application/json", **({"Authorization": f"Bearer {admin_token}"} if admin_token else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as resp:
            return json.loads(resp.read()).get("metadata_location")
    except urllib.error.HTTPError as e:
        hint = " (give options adminToken or adminTokenFile)" if e.code in (401, 403) else ""
        raise LakeScanError(f"topic {parent}: GET {url} answered {e.code}{hint}: {e.read()[:300]!r}") from None
    except urllib.error.URLError as e:
        raise LakeScanError(f"topic {parent}: GET {url}: {e.reason}") from None


def _snapshot(location: str | None, s3_endpoint_url: str | None):
    """The table (pyiceberg ``StaticTable``) and its current snapshot's data file URIs (None,
    empty: no table or no snapshot yet). Nothing but metadata is read."""
    if not location:
        return None, set()
    from pyiceberg.table import StaticTable
    props = {"s3.endpoint": s3_endpoint_url} if s3_endpoint_url else {}
    table = StaticTable.from_metadata(location, properties=props)
    if table.current_snapshot() is None:
        return None, set()
    return table, {task.file.file_path for task in table.scan().plan_files()}


async def _typed_columns(store, parent: str):
    """The offloader's typed columns for the topic's live AVRO/JSON schema versions (or None)."""
    from spark_source.typed import live_struct_versions, schema_path
    got = await store.get_or_none(schema_path(parent))
    if got is None:
        return None
    versions = live_struct_versions(decode_schema_history(got[0]))
    if not versions:
        return None
    from offload.tier import TableTypedColumns
    return TableTypedColumns.of(tuple(versions), topic=parent)


async def _bookie_tables(client, topic: str, partition: int, seg, typed, req: _Request):
    """A ledger's entries 0..last from the bookies, ``chunk_entries`` at a time, as tables with
    the offloader's columns (typed ones included)."""
    from offload.format import ROW_SCHEMA, entries_to_table_fast
    from pulsarlite.errors import MetadataNotFoundError, NoSuchLedgerError
    try:
        reader = await client.open_ledger(seg.ledger_id, recovery=False)
    except (MetadataNotFoundError, NoSuchLedgerError):
        raise LakeScanError(f"topic {topic}: ledger {seg.ledger_id} is gone from the bookies since the list was "
                            "read (offloaded or trimmed meanwhile): scan again") from None
    if not reader.metadata.is_closed:
        reader.last_add_confirmed = max(reader.last_add_confirmed, seg.last_entry_id)
    if reader.last_readable_entry_id < seg.last_entry_id:
        raise LakeScanError(f"topic {topic}: ledger {seg.ledger_id} has entries up to "
                            f"{reader.last_readable_entry_id}, the list says {seg.last_entry_id}")
    typed_names = [f.name for f in typed.fields] if typed is not None else []
    needed = req.needed(ROW_SCHEMA.names + typed_names)
    if needed is not None and not set(needed) & set(typed_names):
        typed = None                                    # no typed column asked for: not decoded
    for first in range(0, seg.last_entry_id + 1, req.chunk_entries):
        entries = await reader.read(first, min(first + req.chunk_entries - 1, seg.last_entry_id))
        req.report.bookie_entries_read += len(entries)
        table = entries_to_table_fast(seg.ledger_id, [(e.entry_id, e.payload) for e in entries], partition=partition)
        table = _with_typed(table, typed)
        yield req.keep(table if needed is None else table.select(needed))


def _union(schemas: list[pa.Schema]) -> pa.Schema:
    """The first schema's fields (the snapshot's, when there is one), then those only later
    ones have (nullable), in order; the offloader's row schema when there is none."""
    if not schemas:
        from offload.format import ROW_SCHEMA
        return ROW_SCHEMA
    fields = list(schemas[0])
    names = {f.name for f in fields}
    for schema in schemas[1:]:
        for f in schema:
            if f.name not in names:
                fields.append(f.with_nullable(True))
                names.add(f.name)
    return pa.schema(fields)


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in ``schema``: each column cast to its type, a missing column null."""
    cols = []
    for f in schema:
        if f.name in table.column_names:
            col = table.column(f.name)
            cols.append(col if col.type == f.type else col.cast(f.type))
        else:
            cols.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


__all__ = ["LakeScanError", "ScanReport", "Source", "plan_sources", "scan", "scan_batches"]
