"""The ``pulsarlite`` PySpark data source: batch reader, stream reader, batch and stream writers.

Planning (``partitions()``) reads the managed-ledger lists from ZooKeeper and the LACs of open
ledgers from the bookies; each Spark partition then reads its segments straight from where they
live (:mod:`spark_source.scan`): no broker on the read path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterator, Sequence

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader, EqualTo, GreaterThan,
                                    GreaterThanOrEqual, InputPartition, LessThan, LessThanOrEqual)

from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from spark_source.options import OptionError, SourceOptions, parse_options
from spark_source.plan import (OUTPUT_DDL, PartitionLedgers, PlanReport, Position, ScanRequest, SegmentScan,
                               narrow_time, next_position, pack, plan_partition,
                               plan_partition_compacted)

log = logging.getLogger("pulsarlite.spark")

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class ScanPartition(InputPartition):
    """The segments one Spark task reads (one, or several small ones bin-packed)."""

    def __init__(self, scans: tuple[SegmentScan, ...]) -> None:
        super().__init__(None)
        self.scans = scans


# -- metadata access (driver side) ---------------------------------------------------------------
class _LazyLedgerClient:
    """The ledger client planning hands to ``read_partition``: connected (bookie watch and all)
    only when an open ledger's LAC has to be read, so that a plan over closed and offloaded
    segments costs one ZooKeeper session and nothing more."""

    def __init__(self, store, opts: SourceOptions) -> None:
        self.store = store
        self._opts = opts
        self._client = None

    async def _get(self):
        if self._client is None:
            from bookie.client.ledger_client import LedgerClient
            from spark_source.options import ledger_client_config
            opts = self._opts
            from spark_source.options import source_client_settings
            config = ledger_client_config(opts.zookeeper, opts.bookie_auth_token, opts.bookie_auth_token_file,
                                          source_client_settings(opts))
            self._client = await LedgerClient.connect(config, store=self.store)
        return self._client

    async def open_ledger(self, ledger_id: int, **kw):
        return await (await self._get()).open_ledger(ledger_id, **kw)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


async def _with_metadata(opts: SourceOptions, fn):
    """Run ``fn(store, ledger_client)`` with a ZooKeeper session and a ledger client that
    connects on first use."""
    async with metadata_session(opts) as (store, client):
        return await fn(store, client)


@contextlib.asynccontextmanager
async def metadata_session(opts: SourceOptions):
    """``(store, ledger_client)``: a ZooKeeper session and a ledger client that connects on
    first use, with the options' credentials; both closed on exit."""
    from pulsarlite.metadata import MetadataStore

    if not opts.zookeeper:
        raise OptionError("option zookeeper or admin_url is required to read (planning reads segment metadata "
                          "from ZooKeeper; with only admin_url the broker says where it is)")
    started = time.monotonic()
    from pulsarlite.config import zookeeper_auth
    store = await MetadataStore.connect(opts.zookeeper, auth=zookeeper_auth(opts))
    log.debug("zookeeper session for planning connect_ms=%d", (time.monotonic() - started) * 1000)
    try:
        client = _LazyLedgerClient(store, opts)
        try:
            yield store, client
        finally:
            await client.close()
    finally:
        await store.close()


async def _load_partitions(opts: SourceOptions, store, client) -> list[PartitionLedgers]:
    from spark_source.metadata import expand_topics, read_partition
    members = await expand_topics(store, topics=list(opts.topics), pattern=opts.topics_pattern)
    token = opts.admin_bearer() if opts.admin_url else ""
    out = []
    for topic, index in members:
        out.append(await read_partition(store, client, topic, index, must_exist=False, admin_url=opts.admin_url,
                                        read_compacted=opts.read_compacted, admin_token=token))
    return out


def _end_of(p: PartitionLedgers) -> Position | None:
    """The position after the last readable entry (``latest``)."""
    for lg in reversed(p.ledgers):
        if lg.last_entry_id >= 0:
            return Position(lg.ledger_id, lg.last_entry_id + 1)
    if p.ledgers:
        return Position(p.ledgers[-1].ledger_id, 0)
    return None


def _resolve(spec: str, p: PartitionLedgers) -> Position | None | str:
    """A start/end spec of one partition -> Position, None (earliest) or 'latest'."""
    if spec == "earliest":
        return None
    if spec == "latest":
        return "latest"
    return Position.parse(spec)


def _time_bounds(opts: SourceOptions, pushed: tuple[int | None, int | None]) -> tuple[int | None, int | None]:
    lo, hi = opts.starting_time_ms, None if opts.ending_time_ms is None else opts.ending_time_ms - 1
    plo, phi = pushed
    if plo is not None:
        lo = plo if lo is None else max(lo, plo)
    if phi is not None:
        hi = phi if hi is None else min(hi, phi)
    return lo, hi


def plan_batch(opts: SourceOptions, partitions: list[PartitionLedgers], tmin: int | None, tmax: int | None,
               report: PlanReport) -> list[SegmentScan]:
    scans: list[SegmentScan] = []
    for p in partitions:
        start = _resolve(opts.starting.for_partition(p.topic), p)
        end = _resolve(opts.ending.for_partition(p.topic), p)
        if start == "latest":
            start = _end_of(p)
            if start is None:
                continue
        if end == "latest":
            end = None
        elif end is None:  # ending at earliest: nothing
            continue
        planner = plan_partition_compacted if opts.read_compacted else plan_partition
        scans.extend(planner(p, ScanRequest(start=start, end=end, publish_time_min_ms=tmin,
                                                   publish_time_max_ms=tmax),
                                    fail_on_data_loss=opts.fail_on_data_loss, report=report))
    return scans


def _settings(opts: SourceOptions, typed=None, columns=None, output_schema=None):
    from spark_source.options import source_client_settings
    from spark_source.scan import ReadSettings
    return ReadSettings(zookeeper=opts.zookeeper or "", s3_endpoint_url=opts.s3_endpoint_url,
                        metrics_dir=opts.metrics_dir, fail_on_data_loss=opts.fail_on_data_loss, typed=typed,
                        columns=columns, output_schema=output_schema, bookie_auth_token=opts.bookie_auth_token,
                        bookie_auth_token_file=opts.bookie_auth_token_file, **source_client_settings(opts))


def _value_schema_mode(options) -> str:
    """Option valueSchema: "typed" (the default) or "raw"; OptionError for anything else."""
    o = {str(k).lower(): v for k, v in options.items()}
    mode = str(o.get("valueschema") or "typed").strip().lower()
    if mode not in ("typed", "raw"):
        raise OptionError(f"option valueSchema: expected typed or raw, got {mode!r}")
    return mode


def _typed_value(options) -> "object | None":
    """The typed value columns of the topics ``options`` name (spark_source/typed.py), or None."""
    if _value_schema_mode(options) == "raw" or not {str(k).lower(): v for k, v in options.items()}.get("zookeeper"):
        return None
    try:
        opts = parse_options(options, streaming=False)
    except OptionError:
        return None                      # the reader reports bad options itself

    async def run(store, client):
        from spark_source.metadata import expand_topics
        from spark_source.scan import OUTPUT_SCHEMA
        from spark_source.typed import load_typed_value
        members = await expand_topics(store, topics=list(opts.topics), pattern=opts.topics_pattern)
        return await load_typed_value(store, [t for t, _ in members], OUTPUT_SCHEMA.names)

    return asyncio.run(_with_metadata(opts, run))


def _schema_with(typed):
    if typed is None:
        return OUTPUT_DDL
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema
    from spark_source.scan import OUTPUT_SCHEMA
    return from_arrow_schema(pa.schema(list(OUTPUT_SCHEMA) + typed.output_fields()))


def _metadata_struct():
    from pyspark.sql.pandas.types import from_arrow_schema
    from spark_source.scan import OUTPUT_SCHEMA
    return from_arrow_schema(OUTPUT_SCHEMA)


@dataclass(frozen=True)
class ReadShape:
    """What a reader returns: typed value columns (or None) and, for a user-given schema that
    narrows the source's (spark_source/projection.py), the columns in order and their Arrow
    schema as Spark expects it; ``columns`` None: every column."""
    typed: object | None = None
    columns: tuple[str, ...] | None = None
    output_schema: object | None = None


def read_shape(schema, options, typed_value=None) -> ReadShape:
    """The shape of a reader for ``schema`` (the source's own, or one the user gave). Typed
    columns are looked up (``typed_value()``, default: in ZooKeeper) only when the schema names a
    column that is not a metadata column. Raises SchemaMismatchError for a schema that is not a
    projection of the source's."""
    from spark_source.projection import resolve_projection, source_columns
    meta = source_columns(_metadata_struct())
    names = [f.name for f in getattr(schema, "fields", None) or []]
    meta_names = {c.name for c in meta}
    only_metadata = bool(names) and all(n in meta_names for n in names)
    typed = None
    if not only_metadata:
        typed = typed_value() if typed_value is not None else _typed_value(options)
    if typed is None:      # the metadata columns are all there is to select from
        note = "" if only_metadata else (
            "; typed value columns are off (valueSchema=raw)" if _value_schema_mode(options) == "raw" else
            "; the topic(s) have no shared AVRO/JSON schema, so there are no typed value columns")
        columns = resolve_projection(schema, meta, note=note)
        return ReadShape() if columns is None else ReadShape(None, columns, _arrow_schema(schema))
    from pyspark.sql.types import StructType
    full = _schema_with(typed)
    full = full if isinstance(full, StructType) else _metadata_struct()
    columns = resolve_projection(schema, source_columns(full))
    if columns is None:
        return ReadShape(typed)
    uses_typed = any(c in typed.names for c in columns)
    return ReadShape(typed if uses_typed else None, columns, _arrow_schema(schema))


def _arrow_schema(schema):
    """The Arrow schema Spark checks a reader's batches against (plan_data_source_read)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(schema, timezone="UTC")


def _log_plan(kind: str, opts: SourceOptions, report: PlanReport, groups, elapsed_ms: int = -1) -> None:
    if report.pruned_by_time:
        log.info("segments pruned by publish time count=%d segments=%s", len(report.pruned_by_time),
                 ",".join(report.pruned_by_time[:50]))
    for msg in report.data_loss:
        log.warning("data loss: %s (failOnDataLoss=false: reading from the earliest)", msg)
    log.info("%s planned segments_total=%d segments_planned=%d pruned_by_time=%d pruned_by_position=%d "
             "spark_partitions=%d elapsed_ms=%d", kind, report.segments_total, report.segments_planned,
             len(report.pruned_by_time), report.pruned_by_position, len(groups), elapsed_ms)
    from spark_source.metrics import record
    record(opts.metrics_dir, "plan", {"kind": kind, "segments_total": report.segments_total,
                                      "segments_planned": report.segments_planned,
                                      "pruned_by_time": report.pruned_by_time,
                                      "pruned_by_position": report.pruned_by_position,
                                      "spark_partitions": len(groups), "data_loss": report.data_loss})


# -- the data source --------------------------------------------------------------------------------
class PulsarliteDataSource(DataSource):
    """``spark.read.format("pulsarlite")`` / ``readStream`` / ``write`` / ``writeStream``."""

    _reader_class: type       # the batch reader: PulsarliteReader (set once it is defined, below)

    @classmethod
    def name(cls) -> str:
        return "pulsarlite"

    def _options(self) -> dict:
        """The options, with ``zookeeper`` asked of the broker when only ``admin_url`` is given
        (spark_source/discovery.py); resolved once and pickled with this instance."""
        cached = getattr(self, "_options_cache", None)
        if cached is None:
            from spark_source.hybrid import resolve_metadata_options
            cached = self._options_cache = resolve_metadata_options(dict(self.options))
        return cached

    def _typed(self):
        """The typed value columns, looked up once: Spark pickles this instance after
        ``schema()`` and unpickles it in the workers that call ``reader()``, which then need no
        ZooKeeper session of their own for it (and see the columns the DataFrame was given)."""
        cached = getattr(self, "_typed_cache", None)
        if cached is None:
            cached = self._typed_cache = (_typed_value(self._options()),)
        return cached[0]

    def schema(self):
        return _schema_with(self._typed())

    def reader(self, schema):
        opts = parse_options(self._options(), streaming=False)
        return self._reader_class(opts, shape=read_shape(schema, self._options(), self._typed))

    def streamReader(self, schema):
        opts = parse_options(self._options(), streaming=True)
        return PulsarliteStreamReader(opts, shape=read_shape(schema, self._options(), self._typed))

    def writer(self, schema, overwrite: bool):
        from spark_source.writer import PulsarliteWriter
        return PulsarliteWriter(self.options, schema)

    def streamWriter(self, schema, overwrite: bool):
        from spark_source.writer import PulsarliteStreamWriter
        return PulsarliteStreamWriter(self.options, schema)


def _to_us(value) -> int | None:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return (value - _EPOCH) // timedelta(microseconds=1)
    return None


def publish_time_bounds(filters) -> tuple[tuple[int | None, int | None], list]:
    """(min ms, max ms) implied by the filters on publish_time, and the filters used."""
    lo: int | None = None
    hi: int | None = None
    used = []
    for f in filters:
        if getattr(f, "attribute", None) != ("publish_time",):
            continue
        us = _to_us(getattr(f, "value", None))
        if us is None:
            continue
        floor_ms, ceil_ms = us // 1000, -((-us) // 1000)
        if isinstance(f, GreaterThan):
            cand_lo, cand_hi = floor_ms + 1, None
        elif isinstance(f, GreaterThanOrEqual):
            cand_lo, cand_hi = ceil_ms, None
        elif isinstance(f, LessThan):
            cand_lo, cand_hi = None, ceil_ms - 1
        elif isinstance(f, LessThanOrEqual):
            cand_lo, cand_hi = None, floor_ms
        elif isinstance(f, EqualTo):
            cand_lo, cand_hi = ceil_ms, floor_ms
        else:
            continue
        if cand_lo is not None:
            lo = cand_lo if lo is None else max(lo, cand_lo)
        if cand_hi is not None:
            hi = cand_hi if hi is None else min(hi, cand_hi)
        used.append(f)
    return (lo, hi), used


class PulsarliteReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, typed=None, *, shape: ReadShape | None = None) -> None:
        self.opts = opts
        self.shape = shape if shape is not None else ReadShape(typed)
        self.typed = self.shape.typed
        self.pushed_bounds: tuple[int | None, int | None] = (None, None)

    def pushFilters(self, filters):
        # publish-time filters prune segments and row groups; Spark still evaluates every filter
        # (returned), so pruning never has to be exact
        self.pushed_bounds, used = publish_time_bounds(filters)
        if used:
            log.info("publish_time filters pushed min_ms=%s max_ms=%s", *self.pushed_bounds)
        return filters

    def partitions(self) -> Sequence[InputPartition]:
        _worker_logging()
        opts = self.opts
        tmin, tmax = _time_bounds(opts, self.pushed_bounds)
        report = PlanReport()
        started = time.monotonic()

        async def run(store, client):
            return await _load_partitions(opts, store, client)

        if tmin is not None and tmax is not None and tmin > tmax:
            scans = []
        elif opts.planned_scans is not None:
            # planned once by the driver (spark_source.hybrid): the same segments, no second look
            # at the metadata; pushed publish-time filters narrow the rows read
            scans = [narrow_time(s, tmin, tmax) for s in opts.planned_scans]
            report.segments_total = report.segments_planned = len(scans)
        else:
            scans = plan_batch(opts, asyncio.run(_with_metadata(opts, run)), tmin, tmax, report)
        groups = pack(scans, target_bytes=opts.target_partition_bytes, open_size_bytes=opts.open_segment_bytes,
                      min_partitions=opts.min_partitions)
        _log_plan("batch", opts, report, groups, int((time.monotonic() - started) * 1000))
        return [ScanPartition(g) for g in groups] or [ScanPartition(())]

    def read(self, partition: ScanPartition) -> Iterator:
        self.opts.apply_aws_env()
        _worker_logging()
        from spark_source.scan import read_scans
        yield from read_scans(partition.scans, _settings(self.opts, self.typed, self.shape.columns,
                                                         self.shape.output_schema))


PulsarliteDataSource._reader_class = PulsarliteReader      # the batch reader reader() builds


class PulsarliteReaderWithoutPushdown(PulsarliteReader):
    """The batch reader for a session with ``spark.sql.python.filterPushdown.enabled`` false:
    Spark refuses a reader that implements ``pushFilters`` there, so this one inherits the
    base class's (no filter taken: every segment is planned)."""

    pushFilters = DataSourceReader.pushFilters


class PulsarliteDataSourceWithoutPushdown(PulsarliteDataSource):
    """``pulsarlite`` for a session with Python filter pushdown switched off (``register``)."""

    _reader_class = PulsarliteReaderWithoutPushdown


def _worker_logging() -> None:
    root = logging.getLogger("pulsarlite")
    if not root.handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        root.addHandler(h)
        root.setLevel(logging.INFO)


# -- streaming -----------------------------------------------------------------------------------------
EARLIEST = "earliest"


class PulsarliteStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets: ``{partition topic name: "ledger:entry" (the next entry to read) | "earliest"}``.
    A micro-batch reads every partition from its start offset up to its end offset (exclusive);
    partitions that appear later start at the earliest. Admission control
    (``maxEntriesPerTrigger``) counts entries (a batched entry holds several messages)."""

    def __init__(self, opts: SourceOptions, typed=None, *, shape: ReadShape | None = None) -> None:
        self.opts = opts
        self.shape = shape if shape is not None else ReadShape(typed)
        self.typed = self.shape.typed
        self._target: dict[str, str] | None = None   # Trigger.AvailableNow: read up to here

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {}
        for p in self._partitions():
            end = _end_of(p)
            if end is not None:
                self._target[p.topic] = _offset_str(end)
        log.info("stream AvailableNow target offsets %s", self._target)

    def _partitions(self) -> list[PartitionLedgers]:
        async def run(store, client):
            return await _load_partitions(self.opts, store, client)
        return asyncio.run(_with_metadata(self.opts, run))

    def initialOffset(self) -> dict:
        out = {}
        for p in self._partitions():
            spec = self.opts.starting.for_partition(p.topic)
            if spec == "latest":
                end = _end_of(p)
                out[p.topic] = EARLIEST if end is None else _offset_str(end)
            else:
                out[p.topic] = EARLIEST if spec == "earliest" else _offset_str(Position.parse(spec))
        log.info("stream initial offsets %s", out)
        return out

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
        n = self.opts.max_entries_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict, limit) -> dict:
        from pyspark.sql.streaming.datasource import ReadMaxRows
        parts = self._partitions()
        budget_total = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        out = dict(start)
        per_partition = None if budget_total is None else max(1, budget_total // max(1, len(parts)))
        report = PlanReport()
        for p in parts:
            pos = _offset_pos(start.get(p.topic, EARLIEST))
            end = None
            if self._target is not None:
                if p.topic not in self._target:
                    continue  # appeared after the AvailableNow target was taken
                end = Position.parse(self._target[p.topic])
            scans = plan_partition(p, ScanRequest(start=pos, end=end, entries_max=per_partition),
                                   fail_on_data_loss=self.opts.fail_on_data_loss, report=report)
            nxt = next_position(scans, pos)
            out[p.topic] = EARLIEST if nxt is None else _offset_str(nxt)
        return out

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        _worker_logging()
        parts = {p.topic: p for p in self._partitions()}
        report = PlanReport()
        scans: list[SegmentScan] = []
        for topic, end_text in sorted(end.items()):
            if end_text == start.get(topic) or end_text == EARLIEST:
                continue
            p = parts.get(topic)
            if p is None:
                continue
            scans.extend(plan_partition(p, ScanRequest(start=_offset_pos(start.get(topic, EARLIEST)),
                                                       end=_offset_pos(end_text)),
                                        fail_on_data_loss=self.opts.fail_on_data_loss, report=report))
        groups = pack(scans, target_bytes=self.opts.target_partition_bytes,
                      open_size_bytes=self.opts.open_segment_bytes, min_partitions=self.opts.min_partitions)
        _log_plan("micro-batch", self.opts, report, groups)
        return [ScanPartition(g) for g in groups]

    def read(self, partition: ScanPartition) -> Iterator:
        self.opts.apply_aws_env()
        _worker_logging()
        from spark_source.scan import read_scans
        yield from read_scans(partition.scans, _settings(self.opts, self.typed, self.shape.columns,
                                                         self.shape.output_schema))

    def commit(self, end: dict) -> None:
        pass


def _offset_str(p: Position) -> str:
    return f"{p.ledger_id}:{p.entry_id}"


def _offset_pos(text: str) -> Position | None:
    return None if text == EARLIEST else Position.parse(text)


__all__ = ["PulsarliteDataSource", "PulsarliteReader", "PulsarliteStreamReader", "ScanPartition",
           "publish_time_bounds"]
