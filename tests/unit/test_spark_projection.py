"""Column selection by a user-given schema (spark_source/projection.py, spark_source/scan.py), no
Spark session: the schema check, and tier / bookie-table scans that build only the given
columns and give the same values as the full read's same columns."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyspark.sql.types import (BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType,
                               TimestampType)

from offload.tier import Tier, encode_and_upload
from offload.format import entries_to_table
from pulsarlite.wire.entry import Message, build_batch_entry, build_entry
from spark_source.plan import Location, Position, SegmentScan
from spark_source.projection import SchemaMismatchError, resolve_projection, source_columns
from spark_source.scan import OUTPUT_SCHEMA, ReadSettings, needed_row_columns, read_scans, to_output
from spark_source.source import ReadShape, _arrow_schema, _metadata_struct, read_shape

KEY = "public/default/t/ledger-7-00.parquet"
T0 = 1_700_000_000_000
OPTS = {"topic": "persistent://public/default/t", "zookeeper": ""}


def schema(*fields) -> StructType:
    """(name, type[, nullable]) tuples -> a StructType (nullable unless told)."""
    return StructType([StructField(n, t, rest[0] if rest else True) for n, t, *rest in fields])


# -- the schema check ------------------------------------------------------------------------------
def test_full_schema_is_no_projection_and_a_subset_keeps_its_order():
    meta = source_columns(_metadata_struct())
    assert resolve_projection(_metadata_struct(), meta) is None
    got = resolve_projection(schema(("publish_time", TimestampType()), ("value", BinaryType())), meta)
    assert got == ("publish_time", "value")
    # every metadata column, reordered: a projection too
    reordered = StructType(list(reversed(_metadata_struct().fields)))
    assert resolve_projection(reordered, meta) == tuple(reversed(OUTPUT_SCHEMA.names))


@pytest.mark.parametrize("given, words", [
    (schema(("valu", BinaryType())), ["`valu`", "not a column", "value binary"]),
    (schema(("Value", BinaryType())), ["`Value`", "did you mean `value` binary"]),
    (schema(("value", StringType())), ["`value`", "type binary", "says string"]),
    (schema(("partition", LongType())), ["`partition`", "type int", "says bigint"]),
    (schema(("properties", MapType(StringType(), IntegerType()))), ["map<string,string>", "map<string,int>"]),
    (schema(("value", BinaryType(), False)), ["`value`", "NOT NULL"]),
    (schema(("value", BinaryType()), ("value", BinaryType())), ["`value`", "twice"]),
    (StructType([]), ["no columns"]),
])
def test_bad_schemas_are_refused_naming_the_column_and_type(given, words):
    with pytest.raises(SchemaMismatchError) as e:
        read_shape(given, OPTS)
    text = str(e.value)
    assert text.startswith("[PULSARLITE_SCHEMA_MISMATCH]")
    for w in words:
        assert w in text, (w, text)


def test_read_shape_needs_no_metadata_for_metadata_columns():
    # zookeeper "" : a typed lookup would be skipped anyway; a metadata-only schema never asks
    shape = read_shape(schema(("value", BinaryType()), ("key", StringType())), OPTS)
    assert shape.typed is None and shape.columns == ("value", "key")
    assert shape.output_schema.names == ["value", "key"]
    assert read_shape(_metadata_struct(), OPTS) == ReadShape()
    raw = dict(OPTS, valueSchema="raw")
    with pytest.raises(SchemaMismatchError, match="valueSchema=raw"):
        read_shape(schema(("qty", IntegerType())), raw)


# -- scans ------------------------------------------------------------------------------------------
def entries() -> list[tuple[int, bytes]]:
    """Entries 0..9 plain (keyed, with properties), 10..19 batches of 3."""
    out = []
    for e in range(10):
        out.append((e, build_entry(Message(f"v{e}".encode() * (e + 1), key=f"k{e % 3}", properties={"i": str(e)},
                                           event_time_ms=T0 + 5 if e % 2 else None),
                                   producer_name="p", sequence_id=e, publish_time_ms=T0 + e)))
    for e in range(10, 20):
        msgs = [Message(f"b{e}-{j}".encode(), batch_index=j) for j in range(3)]
        out.append((e, build_batch_entry(msgs, producer_name="q", sequence_id=e * 10, publish_time_ms=T0 + e)))
    return out


@pytest.fixture(scope="module")
def tier_uri(tmp_path_factory):
    d = tmp_path_factory.mktemp("tier")
    encode_and_upload(Tier(f"file://{d}", None), KEY, 7, entries(), partition=-1, row_group_bytes=120)
    import pyarrow.parquet as pq
    assert pq.ParquetFile(d / KEY).metadata.num_row_groups > 3     # several row groups: exact and cut ones
    return f"file://{d / KEY}"


def scan_of(uri=None, *, first=0, last=19, start=None, end=None, tmin=None, tmax=None) -> SegmentScan:
    return SegmentScan(topic="persistent://public/default/t", partition=-1, ledger_id=7, first_entry_id=first,
                       last_entry_id=last, location=Location.TIER if uri else Location.BOOKIES, uri=uri,
                       start=start or Position(7, first), end=end, publish_time_min_ms=tmin,
                       publish_time_max_ms=tmax, size_bytes_estimate=1)


def settings_for(columns, metrics_dir=None) -> ReadSettings:
    if columns is None:
        return ReadSettings(zookeeper="", s3_endpoint_url=None, metrics_dir=metrics_dir)
    given = StructType([f for name in columns for f in _metadata_struct().fields if f.name == name])
    shape = read_shape(given, OPTS)
    return ReadSettings(zookeeper="", s3_endpoint_url=None, metrics_dir=metrics_dir, columns=shape.columns,
                        output_schema=shape.output_schema)


def read_table(scan, columns, metrics_dir=None) -> pa.Table:
    batches = list(read_scans((scan,), settings_for(columns, metrics_dir)))
    if not batches:
        return pa.table({})
    return pa.Table.from_batches(batches)


PROJECTIONS = [("value",), ("publish_time", "value"), ("message_id", "key", "properties", "event_time"),
               ("topic",), ("partition", "sequence_id", "producer_name", "batch_index", "entry_id", "ledger_id")]
SCANS = {
    "whole": dict(),
    "range": dict(first=3, last=15),
    "batch cuts": dict(first=11, last=17, start=Position(7, 11, 1), end=Position(7, 17, 2)),
    "publish time": dict(tmin=T0 + 4, tmax=T0 + 13),
}


@pytest.mark.parametrize("columns", PROJECTIONS, ids=lambda c: ",".join(c))
@pytest.mark.parametrize("which", list(SCANS))
def test_tier_projection_equals_the_full_reads_columns(tier_uri, columns, which):
    full = read_table(scan_of(tier_uri, **SCANS[which]), None)
    got = read_table(scan_of(tier_uri, **SCANS[which]), columns)
    assert full.num_rows > 0
    assert got.schema.names == list(columns)
    assert got.schema.equals(_arrow_schema(StructType([f for c in columns for f in _metadata_struct().fields
                                                      if f.name == c])))
    assert got.to_pylist() == full.select(list(columns)).to_pylist()


@pytest.mark.parametrize("which", list(SCANS))
def test_bookie_table_projection_equals_the_full_output(which):
    table = entries_to_table(7, entries(), partition=-1)
    s = scan_of(None, **SCANS[which])
    from spark_source.scan import filter_rows
    table = filter_rows(table, s)
    full = pa.Table.from_batches([to_output(table, s)])
    for columns in PROJECTIONS:
        got = to_output(table, s, settings=settings_for(columns))
        assert got.schema.names == list(columns)
        assert got.to_pylist() == full.select(list(columns)).to_pylist()


def test_only_the_needed_parquet_columns_are_read(tier_uri, tmp_path):
    m = tmp_path / "m"
    read_table(scan_of(tier_uri), ("value",), str(m))
    cols = [json.loads(p.read_text())["columns"] for p in m.glob("columns-*.json")]
    assert cols == [["value"]]
    assert needed_row_columns(settings_for(("topic", "partition"))) == []
    assert needed_row_columns(settings_for(("message_id",))) == ["ledger_id", "entry_id", "batch_index"]
    # a read of nothing but constant columns still has one row per message
    assert read_table(scan_of(tier_uri), ("topic",)).num_rows == 10 + 30


# -- fixed cost: the typed-columns lookup travels with the pickled data source -------------------
def test_typed_lookup_is_done_once_and_pickled_with_the_data_source(monkeypatch):
    from pyspark import cloudpickle

    import spark_source.source as source
    calls = []
    monkeypatch.setattr(source, "_typed_value", lambda options: calls.append(1) or None)
    ds = source.PulsarliteDataSource({"topic": "persistent://public/default/t", "zookeeper": "127.0.0.1:1"})
    assert ds.schema() == source.OUTPUT_DDL and calls == [1]
    again = cloudpickle.loads(cloudpickle.dumps(ds))       # what the planning workers get
    monkeypatch.setattr(source, "_typed_value", lambda options: pytest.fail("looked up again"))
    reader = again.reader(_metadata_struct())
    assert reader.typed is None and reader.shape.columns is None
    with pytest.raises(SchemaMismatchError, match="no shared AVRO/JSON schema"):
        again.reader(schema(("qty", IntegerType())))


def test_the_source_without_pushdown_has_a_reader_spark_sees_as_taking_no_filters(monkeypatch):
    """pyspark's plan_data_source_read refuses a reader whose pushFilters is not the base class's
    while filter pushdown is off: the variant ``register`` uses then must pass that same test
    (after the pickling Spark does), and the ordinary reader must not (else nothing is pruned)."""
    from pyspark import cloudpickle
    from pyspark.sql.datasource import DataSourceReader

    import spark_source.source as source
    monkeypatch.setattr(source, "_typed_value", lambda options: None)

    def takes_filters(reader) -> bool:     # the expression pyspark 4 uses
        return getattr(reader.pushFilters, "__func__", None) is not DataSourceReader.pushFilters

    options = {"topic": "persistent://public/default/t", "zookeeper": "127.0.0.1:1"}
    for cls, expected in ((source.PulsarliteDataSource, True), (source.PulsarliteDataSourceWithoutPushdown, False)):
        ds = cls(options)
        assert ds.name() == "pulsarlite" and ds.schema() == source.OUTPUT_DDL
        reader = cloudpickle.loads(cloudpickle.dumps(ds)).reader(_metadata_struct())
        assert isinstance(reader, source.PulsarliteReader)
        assert takes_filters(reader) is expected, cls


def test_publish_time_statistics_convert_to_ms_exactly():
    """Row-group pruning and the exact-row-group check compare ms bounds with the statistics:
    a float conversion is off by one for some values (and would prune a wanted row group)."""
    import datetime as dt
    import random

    from spark_source.scan import _as_ms
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    rng = random.Random(7)
    for ms in [0, 1, 999, 1_700_000_000_123] + [rng.randrange(0, 4_000_000_000_000) for _ in range(20_000)]:
        assert _as_ms(epoch + dt.timedelta(milliseconds=ms)) == ms
        assert _as_ms((epoch + dt.timedelta(milliseconds=ms)).replace(tzinfo=None)) == ms
    assert _as_ms(12) == 12
