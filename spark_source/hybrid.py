"""``read_topic``: one DataFrame of a topic whose offloaded segments Spark scans with its own
Parquet reader and whose other segments the ``pulsarlite`` Python source reads from the bookies.

Protocol (docs/spark.md, docs/decisions.md "Hybrid reads"):

1. Plan once, on the driver, with the format's planner (``spark_source.source.plan_batch`` over
   the managed-ledger lists): the same options, the same segments, the same pruning by
   position and by the ledgers' recorded publish-time ranges.
2. Split (pure, :func:`split_scans`): a segment recorded offloaded at planning whose tier object
   Spark can open (``file://`` always; ``s3://`` as ``s3a://`` when the session loads the S3A
   filesystem) goes **native**; every other segment goes to the **Python** source, handed the
   planned segments as they are (option ``plannedSegments``: it does not plan again). A
   segment deleted from the bookies after planning is found in the tier by the Python reader
   (``scan._read_bookies``), so none is missing; each ledger is in exactly one part, so none
   is read twice.
3. Native part: per topic partition, one ``spark.read.parquet`` over its objects with an
   explicit schema (the stored columns the output needs; no schema inference), page checksums
   verified (``parquet.page.verify-checksum.enabled``), the rows of partly read ledgers kept by
   a position filter and publish-time bounds as plain column filters (Spark prunes row groups
   by them), then projected to the format's columns: ``topic``/``partition`` literals and
   ``message_id`` = ``ledger:entry:partition:batch`` computed by Spark, the same strings the
   Python reader builds (invariant 7). Typed value columns come from the object's stored typed
   columns when its footer says they stand for decoding ``value`` (``stored_columns``), cast to
   the format's types; an object without them is read by the Python source.
4. ``union`` of the parts (each has the format's columns in its order).

Filters a query puts on the DataFrame later (``where(publish_time > ...)``) reach both parts:
Spark pushes them into the Parquet scan (row groups) and into the Python source
(``pushFilters``: narrows its rows and row groups). Tier files are pruned at planning by the
options ``startingTime``/``endingTime``/``startingOffsets``/``endingOffsets`` (ledger ranges).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import warnings
from dataclasses import dataclass
from typing import Iterable, Mapping

from spark_source.plan import LedgerSegment, Location, PartitionLedgers, PlanReport, SegmentScan, scan_to_dict

log = logging.getLogger("pulsarlite.spark")

# the stored Parquet columns (offload.format.ROW_SCHEMA) the native part reads, as Spark DDL
STORED_DDL = {
    "ledger_id": "bigint", "entry_id": "bigint", "batch_index": "int", "publish_time": "timestamp",
    "event_time": "timestamp", "key": "string", "properties": "map<string,string>",
    "producer_name": "string", "sequence_id": "bigint", "value": "binary",
}

S3A_HINT = ("put hadoop-aws (the jar matching Spark's Hadoop, e.g. org.apache.hadoop:hadoop-aws:3.4.x, and its AWS "
            "SDK bundle) on the session's classpath (spark.jars.packages or spark.jars) to scan s3:// tier "
            "objects natively as s3a://")


class S3TierFallbackWarning(UserWarning):
    """s3:// tier objects are read by the Python source: the session cannot load S3A."""


@dataclass(frozen=True)
class SplitPlan:
    """Which planned segments Spark's Parquet reader scans (``native``) and which the Python
    source reads (``python``); ``fallback_s3`` counts tier segments that would have been native
    but for a session without S3A."""
    native: tuple[SegmentScan, ...]
    python: tuple[SegmentScan, ...]
    fallback_s3: int = 0

    def bytes_of(self, part: Iterable[SegmentScan]) -> int:
        return sum(s.size_bytes_estimate for s in part)


def split_scans(scans: Iterable[SegmentScan], *, s3a: bool, excluded: frozenset[int] = frozenset()) -> SplitPlan:
    """Pure: native = tier segments with a file:// URI, or s3:// with ``s3a``; ledgers in
    ``excluded`` (e.g. objects without usable typed columns) and everything else -> python."""
    native, python = [], []
    fallback = 0
    for s in scans:
        scheme = (s.uri or "").split("://", 1)[0].lower() if s.location is Location.TIER else ""
        ok = scheme == "file" or (scheme == "s3" and s3a)
        if ok and s.ledger_id not in excluded:
            native.append(s)
        else:
            if scheme == "s3" and not s3a:
                fallback += 1
            python.append(s)
    return SplitPlan(tuple(native), tuple(python), fallback)


def spark_path(uri: str) -> str:
    """The path Spark opens for a tier object URI: file:// as is, s3:// as s3a://."""
    scheme, _, rest = uri.partition("://")
    if scheme.lower() == "s3":
        return "s3a://" + rest
    if scheme.lower() == "file":
        return uri
    raise ValueError(f"no native Spark path for tier object {uri!r}")


def is_whole_ledger(s: SegmentScan, lg: LedgerSegment | None) -> bool:
    """True when the scan keeps every row of its ledger's object by position."""
    if lg is None or s.first_entry_id != 0 or s.last_entry_id < lg.last_entry_id:
        return False
    if s.start.ledger_id == s.ledger_id and s.start.batch_index > 0:
        return False
    return not (s.end is not None and s.end.ledger_id == s.ledger_id and s.end.batch_index >= 0)


# -- the Spark side ------------------------------------------------------------------------------
def _s3a_available(spark) -> bool:
    """Whether the session's JVM can load the S3A filesystem (hadoop-aws on its classpath)."""
    try:
        jvm = spark._jvm
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass("s3a", conf)
        return True
    except Exception:        # py4j errors, Spark Connect sessions (no JVM here): not available
        return False


S3A_TEMPORARY_PROVIDER = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"


def s3a_settings(endpoint_url: str | None, aws_env: Mapping[str, str]) -> dict[str, str]:
    """Pure: the Hadoop settings (hadoop-aws's S3A keys) that point S3A at the tier, from the
    tier's S3 endpoint and the AWS variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_SESSION_TOKEN``, ``AWS_DEFAULT_REGION``). Path-style access always (S3-compatible
    stores such as the tests' serve no virtual-host buckets); TLS as the endpoint's scheme says;
    a session token also names S3A's temporary-credentials provider (the only one that reads
    ``fs.s3a.session.token``). Keys and secrets only as a pair."""
    out = {"fs.s3a.path.style.access": "true"}
    if endpoint_url:
        out["fs.s3a.endpoint"] = endpoint_url
        out["fs.s3a.connection.ssl.enabled"] = "true" if endpoint_url.lower().startswith("https") else "false"
    key, secret = aws_env.get("AWS_ACCESS_KEY_ID"), aws_env.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        out["fs.s3a.access.key"] = key
        out["fs.s3a.secret.key"] = secret
        token = aws_env.get("AWS_SESSION_TOKEN")
        if token:
            out["fs.s3a.session.token"] = token
            out["fs.s3a.aws.credentials.provider"] = S3A_TEMPORARY_PROVIDER
    region = aws_env.get("AWS_DEFAULT_REGION")
    if region:
        out["fs.s3a.endpoint.region"] = region
    return out


def _s3a_options(opts) -> dict[str, str]:
    """``s3a_settings`` of the read's options over the driver's AWS environment (options win):
    per-read options, merged by Spark into that scan's Hadoop configuration."""
    import os
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION")
    env = {k: os.environ[k] for k in names if os.environ.get(k)}
    env.update(dict(opts.aws_env))
    return s3a_settings(opts.s3_endpoint_url, env)


def sql_string(text: str) -> str:
    """A Spark SQL expression for the string ``text``, whatever it holds (quotes, backslashes,
    non-ASCII) and whatever the session's ``spark.sql.parser.escapedStringLiterals``: its UTF-8
    bytes as a hex binary literal cast to a string (constant-folded by the optimizer)."""
    return f"CAST(X'{text.encode('utf-8').hex()}' AS STRING)"


def position_condition(scans: list[SegmentScan], ledgers: dict[int, LedgerSegment]) -> str | None:
    """Pure: a Spark SQL condition (over the stored columns) keeping the planned rows of
    ``scans`` (one topic partition), or None when every scan takes its whole ledger."""
    partial = [s for s in scans if not is_whole_ledger(s, ledgers.get(s.ledger_id))]
    if not partial:
        return None
    whole = [s.ledger_id for s in scans if s not in partial]
    terms = []
    if whole:
        terms.append(f"ledger_id IN ({', '.join(str(int(x)) for x in whole)})")
    for s in partial:
        c = (f"ledger_id = {int(s.ledger_id)} AND entry_id >= {int(s.first_entry_id)} "
             f"AND entry_id <= {int(s.last_entry_id)}")
        if s.start.ledger_id == s.ledger_id and s.start.batch_index > 0:
            c += f" AND NOT (entry_id = {int(s.start.entry_id)} AND batch_index < {int(s.start.batch_index)})"
        if s.end is not None and s.end.ledger_id == s.ledger_id and s.end.batch_index >= 0:
            c += f" AND NOT (entry_id = {int(s.end.entry_id)} AND batch_index >= {int(s.end.batch_index)})"
        terms.append(f"({c})")
    return " OR ".join(terms)


def time_condition(first: SegmentScan) -> str | None:
    """Pure: the scan's publish-time bounds as a Spark SQL condition (Spark prunes row groups by
    it), or None."""
    terms = []
    if first.publish_time_min_ms is not None:
        terms.append(f"publish_time >= timestamp_millis({int(first.publish_time_min_ms)})")
    if first.publish_time_max_ms is not None:
        terms.append(f"publish_time < timestamp_millis({int(first.publish_time_max_ms) + 1})")
    return " AND ".join(terms) or None


def derived_columns(topic: str, partition: int) -> dict[str, str]:
    """Pure: the format's columns the tier objects do not store, as Spark SQL over the stored
    ones; ``message_id`` is ``ledger:entry:partition:batch``, the string the Python reader
    builds (invariant 7)."""
    return {"topic": sql_string(topic), "partition": f"CAST({int(partition)} AS INT)",
            "message_id": f"concat_ws(':', ledger_id, entry_id, '{int(partition)}', batch_index)"}


def _native_frame(spark, scans: list[SegmentScan], ledgers: dict[int, LedgerSegment], full_schema,
                  typed_columns: dict[str, str | None], stored_types: dict[str, str], reader_options: dict):
    """The format's columns of ``scans`` (one topic partition, the same stored typed columns).
    Built from SQL text (a handful of calls into the JVM, not a few hundred: the planning cost
    of a read that is mostly on bookies)."""
    first = scans[0]
    stored = dict(STORED_DDL)
    stored.update(stored_types)
    ddl = ", ".join(f"`{n}` {t}" for n, t in stored.items())
    reader = spark.read.schema(ddl).options(**{"parquet.page.verify-checksum.enabled": "true", **reader_options})
    df = reader.parquet(*[spark_path(s.uri) for s in scans])
    conds = [c for c in (time_condition(first), position_condition(scans, ledgers)) if c]
    if conds:
        df = df.where(" AND ".join(f"({c})" for c in conds))
    derived = derived_columns(first.topic, first.partition)
    exprs: list = []
    typed_cast = False
    for f in full_schema.fields:
        n = f.name
        if n in derived:
            exprs.append(f"{derived[n]} AS `{n}`")
        elif n in STORED_DDL:
            exprs.append(f"`{n}`")
        elif typed_columns.get(n) is not None:
            exprs.append((typed_columns[n], n, f.dataType))
            typed_cast = True
        else:
            exprs.append((None, n, f.dataType))
            typed_cast = True
    if not typed_cast:
        return df.selectExpr(*exprs)
    from pyspark.sql import functions as F
    cols = []
    for e in exprs:
        if isinstance(e, str):
            cols.append(F.expr(e))
        else:
            source, n, dtype = e
            cols.append((F.col(source) if source is not None else F.lit(None)).cast(dtype).alias(n))
    return df.select(*cols)


def _typed_mapping(scans: list[SegmentScan], typed, full_schema, settings_endpoint: str | None):
    """For each tier scan: (its stored typed columns as {output name: object column or None},
    their Spark DDL types) or None when the object has no usable typed columns. Reads each
    object's footer (driver side)."""
    from pyspark.sql.pandas.types import from_arrow_type

    from offload.reader import TierReader
    from offload.typed_columns import stored_columns
    out: dict[int, tuple[dict[str, str | None], dict[str, str]] | None] = {}
    for s in scans:
        with TierReader(s.uri, s3_endpoint_url=settings_endpoint, read_ahead_row_groups=0,
                        what=f"topic {s.topic} ledger {s.ledger_id} ({s.uri})") as reader:
            stored = stored_columns(reader.metadata.metadata, reader.schema, typed.versions, typed.target)
            if stored is None:
                out[s.ledger_id] = None
                continue
            names = dict(zip(typed.names, stored))
            types = {c: from_arrow_type(reader.schema.field(c).type).simpleString() for c in stored if c}
            out[s.ledger_id] = (names, types)
    return out


def _register_once(spark) -> None:
    """``spark_source.register(spark)``, skipped when this session already has the source
    registered for its current filter-pushdown setting (registering pickles the source classes
    into the JVM: a cost per call otherwise)."""
    import spark_source
    setting = spark.conf.get(spark_source.FILTER_PUSHDOWN_CONF, None)
    if setting is not None and getattr(spark, "_pulsarlite_registered", None) == setting:
        return
    spark_source.register(spark)
    spark._pulsarlite_registered = spark.conf.get(spark_source.FILTER_PUSHDOWN_CONF, None)


def read_topic(spark, topic: str | None = None, **options):
    """One DataFrame of ``topic`` (or of the topics named by the options ``topics`` /
    ``topicsPattern``), with the same columns and rows as ``spark.read.format("pulsarlite")``
    given the same options (keyword arguments, e.g. ``zookeeper=``, ``admin_url=``,
    ``startingTime=``): offloaded segments through Spark's Parquet reader, the rest through
    the Python source. The segment list is read once, here."""
    from spark_source.metrics import record
    from spark_source.options import parse_options
    from spark_source.source import (_load_partitions, _metadata_struct, _schema_with, _time_bounds,
                                     _value_schema_mode, _with_metadata, plan_batch)

    started = time.monotonic()
    raw = {str(k): str(v) for k, v in options.items() if v is not None}
    if topic is not None:
        raw["topic"] = str(topic)
    raw = resolve_metadata_options(raw)
    opts = parse_options(raw, streaming=False)
    _register_once(spark)

    from spark_source.scan import OUTPUT_SCHEMA
    typed_wanted = _value_schema_mode(raw) != "raw"

    async def run(store, client):
        # one ZooKeeper session for the ledger lists and the schema registry (typed columns)
        parts = await _load_partitions(opts, store, client)
        typed = None
        if typed_wanted:
            from spark_source.typed import load_typed_value
            typed = await load_typed_value(store, [p.topic for p in parts], OUTPUT_SCHEMA.names)
        return parts, typed

    parts, typed = asyncio.run(_with_metadata(opts, run))
    metadata_ms = int((time.monotonic() - started) * 1000)
    parts = list(parts)
    tmin, tmax = _time_bounds(opts, (None, None))
    report = PlanReport()
    scans = plan_batch(opts, parts, tmin, tmax, report) if tmin is None or tmax is None or tmin <= tmax else []
    ledgers = {lg.ledger_id: lg for p in parts for lg in p.ledgers}
    # the format's columns, computed here (no round trip through a Python worker for schema())
    full_schema = _schema_with(typed) if typed is not None else _metadata_struct()

    py_reader = spark.read.format("pulsarlite").schema(full_schema).options(**raw)
    s3a = _s3a_available(spark) if any((s.uri or "").lower().startswith("s3://") for s in scans
                                       if s.location is Location.TIER) else False
    split = split_scans(scans, s3a=s3a)
    mapping: dict = {}
    if typed is not None and split.native:
        mapping = _typed_mapping(list(split.native), typed, full_schema, opts.s3_endpoint_url)
        no_stored = frozenset(lid for lid, m in mapping.items() if m is None)
        if no_stored:
            log.info("tier objects without stored typed columns go to the Python source ledgers=%s",
                     ",".join(map(str, sorted(no_stored))))
            split = split_scans(scans, s3a=s3a, excluded=no_stored)
    if split.fallback_s3:
        msg = (f"{split.fallback_s3} s3:// tier segment(s) are read through the Python source: this Spark "
               f"session cannot load the S3A filesystem; {S3A_HINT}")
        log.warning("native tier reads off: %s", msg)
        warnings.warn(msg, S3TierFallbackWarning, stacklevel=2)

    frames = []
    if split.python:       # the source's schema is full_schema: its columns in the format's order
        frames.append(py_reader.option("plannedSegments", json.dumps([scan_to_dict(s) for s in split.python]))
                      .load())
    reader_options = _s3a_options(opts) if s3a else {}
    groups: dict[tuple, list[SegmentScan]] = {}
    for s in split.native:
        m = mapping.get(s.ledger_id)
        key = (s.topic, s.partition, json.dumps(m, sort_keys=True) if m else "")
        groups.setdefault(key, []).append(s)
    for (_, _, _), group in groups.items():
        m = mapping.get(group[0].ledger_id)
        typed_columns, stored_types = (m if m else ({}, {}))
        frames.append(_native_frame(spark, group, ledgers, full_schema, typed_columns, stored_types,
                                    reader_options))
    if not frames:      # nothing planned: the format's (empty) read
        frames.append(py_reader.option("plannedSegments", "[]").load())
    df = frames[0]
    for f in frames[1:]:
        df = df.union(f)      # every part has the format's columns in its order (full_schema)

    native_bytes, python_bytes = split.bytes_of(split.native), split.bytes_of(split.python)
    log.info("read_topic planned topics=%s segments_total=%d native_segments=%d native_bytes=%d "
             "python_segments=%d python_bytes=%d pruned_by_time=%d pruned_by_position=%d metadata_ms=%d elapsed_ms=%d",
             ",".join(opts.topics) or opts.topics_pattern, report.segments_total, len(split.native),
             native_bytes, len(split.python), python_bytes, len(report.pruned_by_time),
             report.pruned_by_position, metadata_ms, int((time.monotonic() - started) * 1000))
    record(opts.metrics_dir, "hybrid", {
        "native": [s.ledger_id for s in split.native], "python": [s.ledger_id for s in split.python],
        "native_bytes": native_bytes, "python_bytes": python_bytes, "fallback_s3": split.fallback_s3,
        "pruned_by_time": report.pruned_by_time})
    return df


def register_topic_view(spark, view: str, topic: str | None = None, **options) -> None:
    """``read_topic(spark, topic, **options)`` as the temporary view ``view`` (planned now:
    segments offloaded or written later are not in it; register again to see them)."""
    read_topic(spark, topic, **options).createOrReplaceTempView(view)


def resolve_metadata_options(raw: dict[str, str]) -> dict[str, str]:
    """The options with ``zookeeper`` (and the tier's S3 endpoint) filled in from the broker's
    admin API when only ``admin_url`` is given (see spark_source.discovery)."""
    lower = {k.lower(): k for k in raw}
    if "zookeeper" in lower or ("admin_url" not in lower and "adminurl" not in lower):
        return raw
    from spark_source.discovery import discover
    return discover(raw)


__all__ = ["S3TierFallbackWarning", "SplitPlan", "derived_columns", "is_whole_ledger", "position_condition",
           "read_topic", "register_topic_view", "s3a_settings", "spark_path", "split_scans", "sql_string",
           "time_condition"]
