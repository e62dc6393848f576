"""[schema] Typed columns in tier objects, without a cluster: the offloader's encode step
(broker/offloader.py ``encode_and_upload``) against a real file:// store, read back with plain
pyarrow; entries still rebuild byte for byte; ``stored_columns`` decides when a reader may take
the stored columns instead of decoding ``value`` (offload/typed_columns.py)."""

from __future__ import annotations

import datetime as dt
import io
import json

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from offload.tier import Tier, encode_and_upload, verify_object
from offload.format import ROW_SCHEMA, read_parquet, table_to_entries
from offload.typed_columns import (TIER_METADATA_KEY, DecodeStats, decode_columns, merged_schema, stored_columns,
                                   typed_columns_for)
from pulsarlite.wire.entry import Message, build_batch_entry, build_entry

KEY = "public/default/t/ledger-7-0123456789abcdef.parquet"

V0 = {"type": "record", "name": "Sale", "namespace": "shop", "fields": [
    {"name": "item", "type": "string"},
    {"name": "qty", "type": "int"},
    {"name": "key", "type": ["null", "string"], "default": None},         # collides with a metadata column
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "attrs", "type": {"type": "map", "values": "long"}},
    {"name": "ship", "type": ["null", {"type": "record", "name": "Ship", "fields": [
        {"name": "city", "type": "string"}, {"name": "zip", "type": "int"}]}], "default": None},
]}
V1 = {**V0, "fields": V0["fields"] + [{"name": "shop", "type": ["null", "string"], "default": None}]}
VERSIONS = ((0, "AVRO", json.dumps(V0)), (1, "AVRO", json.dumps(V1)))
AT = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.timezone.utc)


def avro(schema: dict, record: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


def record(i: int, v: int) -> dict:
    r = {"item": f"i{i}", "qty": i, "key": None if i % 3 else f"k{i}", "at": AT, "tags": ["a", str(i)],
         "attrs": {"n": i}, "ship": {"city": "c", "zip": i} if i % 2 else None}
    if v == 1:
        r["shop"] = "north"
    return r


def ledger_entries(garbage_at: int = 5) -> list[tuple[int, bytes]]:
    """Entries 0..9 plain under version 0 (entry ``garbage_at`` holds bytes that do not decode),
    10..14 batches of 4 under version 1, entry 15 a null value."""
    out = []
    for e in range(10):
        payload = b"\xff\xff\xff" if e == garbage_at else avro(V0, record(e, 0))
        out.append((e, build_entry(Message(payload), producer_name="p", sequence_id=e,
                                   publish_time_ms=1_700_000_000_000 + e, schema_version=(0).to_bytes(8, "big"))))
    for e in range(10, 15):
        msgs = [Message(avro(V1, record(e * 10 + j, 1)), batch_index=j) for j in range(4)]
        out.append((e, build_batch_entry(msgs, producer_name="p", sequence_id=e * 10,
                                         publish_time_ms=1_700_000_000_000 + e,
                                         schema_version=(1).to_bytes(8, "big"))))
    out.append((15, build_entry(Message(b"", null_value=True), producer_name="p", sequence_id=150,
                                publish_time_ms=1_700_000_000_015, schema_version=(1).to_bytes(8, "big"))))
    return out


@pytest.fixture
def tier(tmp_path):
    return Tier(f"file://{tmp_path}", None)


def test_offloaded_object_has_typed_columns_and_still_rebuilds_entries(tier, tmp_path):
    original = ledger_entries()
    counters: dict = {}
    stats = encode_and_upload(tier, KEY, 7, original, partition=-1, row_group_bytes=600,
                              typed_versions=VERSIONS, topic="public/default/persistent/t", counters=counters)
    verify_object(tier, KEY, stats, len(original))
    assert counters == {"typed_values": 10 + 20 + 1, "typed_values_undecodable": 1, "typed_fields_unconvertible": 0}

    pf = pq.ParquetFile(tmp_path / KEY)                       # plain pyarrow, nothing of ours
    assert pf.metadata.num_row_groups > 1
    table = pf.read()
    schema = table.schema
    assert schema.names[:len(ROW_SCHEMA)] == ROW_SCHEMA.names
    assert schema.names[len(ROW_SCHEMA):] == ["item", "qty", "value_key", "at", "tags", "attrs", "ship", "shop"]
    assert schema.field("qty").type == pa.int32()
    assert schema.field("at").type == pa.timestamp("ms", tz="UTC")
    assert schema.field("tags").type == pa.list_(pa.string())
    assert schema.field("attrs").type == pa.map_(pa.string(), pa.int64())
    assert schema.field("ship").type == pa.struct([("city", pa.string()), ("zip", pa.int32())])
    rows = table.to_pylist()
    assert rows[0]["item"] == "i0" and rows[0]["value_key"] == "k0" and rows[0]["at"] == AT
    assert rows[1]["ship"] == {"city": "c", "zip": 1} and rows[1]["attrs"] == [("n", 1)]
    assert rows[0]["shop"] is None                                 # version 0 has no shop
    assert rows[5]["item"] is None and rows[5]["value"] == b"\xff\xff\xff"   # undecodable: null, bytes kept
    assert rows[10]["item"] == "i100" and rows[10]["shop"] == "north" and rows[10]["batch_index"] == 0
    assert rows[-1]["null_value"] and rows[-1]["item"] is None

    doc = json.loads(pf.schema_arrow.metadata[TIER_METADATA_KEY.encode()])
    assert [v[:2] for v in doc["versions"]] == [[0, "AVRO"], [1, "AVRO"]]
    assert doc["fields"][2] == ["key", "value_key"] and doc["undecodable"] == 1
    assert doc["rows_of_other_versions"] == 0

    # the tier reader ignores the extra columns: the same entries, byte for byte
    assert list(table_to_entries(read_parquet(tmp_path / KEY))) == original    # uncompressed: byte-exact


def test_without_versions_the_object_is_as_before(tier, tmp_path):
    encode_and_upload(tier, KEY, 7, ledger_entries(), partition=-1, row_group_bytes=600)
    pf = pq.ParquetFile(tmp_path / KEY)
    assert pf.schema_arrow.names == ROW_SCHEMA.names
    assert TIER_METADATA_KEY.encode() not in (pf.schema_arrow.metadata or {})


def test_a_schema_that_cannot_be_columns_leaves_the_object_raw(tier, tmp_path):
    recursive = {"type": "record", "name": "Node", "fields": [
        {"name": "next", "type": ["null", "Node"], "default": None}]}
    encode_and_upload(tier, KEY, 7, ledger_entries(), partition=-1, row_group_bytes=600,
                      typed_versions=((0, "AVRO", json.dumps(recursive)),))
    assert pq.ParquetFile(tmp_path / KEY).schema_arrow.names == ROW_SCHEMA.names


def _object(tmp_path, versions):
    tier = Tier(f"file://{tmp_path}", None)
    encode_and_upload(tier, KEY, 7, ledger_entries(), partition=-1, row_group_bytes=600, typed_versions=versions)
    return pq.ParquetFile(tmp_path / KEY)


def test_stored_columns_match_only_what_decoding_would_give(tmp_path):
    pf = _object(tmp_path, VERSIONS)
    kv, file_schema = pf.schema_arrow.metadata, pf.schema_arrow
    target = merged_schema([V0, V1])
    assert stored_columns(kv, file_schema, VERSIONS, target) == \
        ["item", "qty", "value_key", "at", "tags", "attrs", "ship", "shop"]

    # a version added since the offload: the new field is null in every stored row
    v2 = {**V1, "fields": V1["fields"] + [{"name": "note", "type": ["null", "string"], "default": None}]}
    later = VERSIONS + ((2, "AVRO", json.dumps(v2)),)
    assert stored_columns(kv, file_schema, later, merged_schema([V0, V1, v2]))[-1] is None
    # ... unless it changed a stored field's type: decode
    v2b = {**V1, "fields": [{"name": "qty", "type": "long"}] + V1["fields"][2:] + [V1["fields"][0]]}
    assert stored_columns(kv, file_schema, VERSIONS + ((2, "AVRO", json.dumps(v2b)),),
                          merged_schema([V0, V1, v2b])) is None
    # a recorded version whose definition differs now (deleted and re-created): decode
    other = ((0, "AVRO", json.dumps(V0)), (1, "AVRO", json.dumps({**V1, "name": "Other"})))
    assert stored_columns(kv, file_schema, other, target) is None
    # no typed columns, or metadata that is not ours
    assert stored_columns(None, file_schema, VERSIONS, target) is None
    assert stored_columns({TIER_METADATA_KEY.encode(): b"{nonsense"}, file_schema, VERSIONS, target) is None
    # key order and spacing of a definition do not matter
    respaced = tuple((v, k, json.dumps(json.loads(d), indent=2, sort_keys=True)) for v, k, d in VERSIONS)
    assert stored_columns(kv, file_schema, respaced, target) is not None


def test_rows_of_unrecorded_versions_only_match_the_same_versions(tmp_path):
    only_v0 = VERSIONS[:1]        # rows of version 1 were decoded with "the latest", version 0
    pf = _object(tmp_path, only_v0)
    doc = json.loads(pf.schema_arrow.metadata[TIER_METADATA_KEY.encode()])
    assert doc["rows_of_other_versions"] == 20
    kv, file_schema = pf.schema_arrow.metadata, pf.schema_arrow
    assert stored_columns(kv, file_schema, only_v0, merged_schema([V0])) is not None
    assert stored_columns(kv, file_schema, VERSIONS, merged_schema([V0, V1])) is None


def test_typed_columns_equal_the_decoders_columns(monkeypatch):
    """The stored columns are what the Spark source decodes from ``value`` (one function), also
    when decoded in several chunks."""
    import offload.typed_columns as tc
    monkeypatch.setattr(tc, "TYPED_CHUNK_ROWS", 5)
    values = [avro(V0, record(i, 0)) for i in range(6)] + [avro(V1, record(i, 1)) for i in range(6)] + [b"\x01"]
    versions = [(0).to_bytes(8, "big")] * 6 + [(1).to_bytes(8, "big")] * 7
    typed = typed_columns_for(values, versions, VERSIONS, ROW_SCHEMA.names)
    parsed = {v: (k, json.loads(d)) for v, k, d in VERSIONS}
    stats = DecodeStats()
    again = decode_columns(values, [0] * 6 + [1] * 7, parsed, merged_schema([V0, V1]), stats)
    assert all(a.equals(b) for a, b in zip(typed.arrays, again))
    assert stats.undecodable == typed.stats.undecodable == 1


def test_fast_and_field_by_field_conversion_agree():
    """A multi-branch union needs the field-by-field path; the result is the same shape."""
    schema = {"type": "record", "name": "U", "fields": [
        {"name": "either", "type": ["null", "int", "string"], "default": None},
        {"name": "n", "type": "long"}]}
    values = [avro(schema, {"either": 3, "n": 1}), avro(schema, {"either": "x", "n": 2}),
              avro(schema, {"either": None, "n": 3})]
    cols = decode_columns(values, [0, 0, 0], {0: ("AVRO", schema)}, merged_schema([schema]))
    assert cols[0].to_pylist() == [{"member0": 3, "member1": None}, {"member0": None, "member1": "x"}, None]
    assert cols[1].to_pylist() == [1, 2, 3]


# -- the Spark source's tier scan (spark_source/scan.py, no Spark session needed) ----------------
def _scan_output(tmp_path, typed, metrics_dir=None) -> pa.Table:
    from spark_source.plan import Location, Position, SegmentScan
    from spark_source.scan import ReadSettings, read_scans
    scan = SegmentScan(topic="persistent://public/default/t", partition=-1, ledger_id=7, first_entry_id=0,
                       last_entry_id=1_000, location=Location.TIER, uri=f"file://{tmp_path / KEY}",
                       start=Position(7, 0), end=None, publish_time_min_ms=None, publish_time_max_ms=None,
                       size_bytes_estimate=1)
    settings = ReadSettings(zookeeper="", s3_endpoint_url=None, metrics_dir=metrics_dir, typed=typed)
    return pa.Table.from_batches(list(read_scans((scan,), settings)))


def _typed_value(versions):
    from spark_source.scan import OUTPUT_SCHEMA
    from spark_source.typed import TypedValue
    from offload.typed_columns import column_names_beside
    target = merged_schema([json.loads(d) for _, _, d in versions])
    return TypedValue(tuple(versions), target, tuple(column_names_beside(OUTPUT_SCHEMA.names, target)))


@pytest.mark.parametrize("now", ["same", "added"])
def test_spark_tier_scan_reads_stored_columns_with_the_same_result(tmp_path, now):
    """Stored typed columns (object written with VERSIONS) vs decoding ``value`` (an object
    without typed columns): the same batches, the same schema; with a version added since the
    offload, the new field is null in the stored rows."""
    versions = VERSIONS
    if now == "added":
        v2 = {**V1, "fields": V1["fields"] + [{"name": "note", "type": ["null", "string"], "default": None}]}
        versions = VERSIONS + ((2, "AVRO", json.dumps(v2)),)
    typed = _typed_value(versions)
    stored_dir, raw_dir = tmp_path / "stored", tmp_path / "raw"
    _object(stored_dir, VERSIONS)
    encode_and_upload(Tier(f"file://{raw_dir}", None), KEY, 7, ledger_entries(), partition=-1, row_group_bytes=600)

    from_stored = _scan_output(stored_dir, typed, metrics_dir=str(tmp_path / "m"))
    decoded = _scan_output(raw_dir, typed, metrics_dir=str(tmp_path / "m2"))
    assert from_stored.schema.equals(decoded.schema)
    assert from_stored.num_rows == 31
    assert from_stored.equals(decoded)
    assert from_stored.column("value_key").to_pylist()[0] == "k0"  # beside Spark's metadata columns ("key")
    sources = [json.loads(p.read_text())["source"] for p in (tmp_path / "m").glob("typed-*.json")]
    assert sources == ["stored"]
    assert [json.loads(p.read_text())["source"] for p in (tmp_path / "m2").glob("typed-*.json")] == ["decoded"]


def test_spark_tier_scan_decodes_when_a_stored_type_changed(tmp_path):
    v2 = {**V1, "fields": [{"name": "qty", "type": "long"}] + [f for f in V1["fields"] if f["name"] != "qty"]}
    typed = _typed_value(VERSIONS + ((2, "AVRO", json.dumps(v2)),))
    _object(tmp_path, VERSIONS)
    out = _scan_output(tmp_path, typed, metrics_dir=str(tmp_path / "m"))
    assert out.schema.field("qty").type == pa.int64()
    assert out.column("qty").to_pylist()[:3] == [0, 1, 2]
    assert [json.loads(p.read_text())["source"] for p in (tmp_path / "m").glob("typed-*.json")] == ["decoded"]


def test_output_fields_are_in_sparks_arrow_form():
    """What the reader returns must equal pyspark's Arrow form of the DataFrame schema."""
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
    schema = {"type": "record", "name": "T", "fields": [
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "t", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "d", "type": {"type": "int", "logicalType": "date"}},
        {"name": "n", "type": {"type": "array", "items": {"type": "map", "values": {
            "type": "long", "logicalType": "timestamp-millis"}}}},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}}]}
    typed = _typed_value(((0, "AVRO", json.dumps(schema)),))
    fields = typed.output_fields()
    spark_form = to_arrow_schema(from_arrow_schema(pa.schema(fields)), timezone="UTC")
    assert pa.schema(fields).equals(spark_form)
    assert fields[0].type == pa.timestamp("us", tz="UTC") and fields[1].type == pa.timestamp("us")
    # and a scan's batches carry exactly these types
    values = [avro(schema, {"at": AT, "local": dt.datetime(2024, 1, 1), "t": dt.time(1, 2, 3),
                            "d": dt.date(2024, 1, 2), "n": [{"x": AT}], "dec": __import__("decimal").Decimal("1.25")})]
    from spark_source.scan import OUTPUT_SCHEMA, to_output
    from offload.format import entries_to_table
    from spark_source.plan import Location, Position, SegmentScan
    entry = build_entry(Message(values[0]), producer_name="p", sequence_id=0, publish_time_ms=1,
                        schema_version=(0).to_bytes(8, "big"))
    table = entries_to_table(7, [(0, entry)], partition=-1)
    scan = SegmentScan("persistent://public/default/t", -1, 7, 0, 0, Location.BOOKIES, None, Position(7, 0), None,
                       None, None, 1)
    batch = to_output(table, scan, typed)
    assert batch.schema.equals(pa.schema(list(OUTPUT_SCHEMA) + fields))
    row = batch.to_pylist()[0]
    assert row["at"] == AT and row["n"] == [[("x", AT)]] and row["t"] == dt.time(1, 2, 3)


def test_json_schema_topic_gets_typed_columns_too(tier, tmp_path):
    """Pulsar's JSON schema is an Avro record definition; the values are JSON text."""
    schema = {"type": "record", "name": "J", "fields": [
        {"name": "name", "type": ["null", "string"]}, {"name": "n", "type": ["null", "long"]},
        {"name": "inner", "type": ["null", {"type": "record", "name": "In", "fields": [
            {"name": "x", "type": "double"}]}]}]}
    values = [json.dumps({"name": f"a{i}", "n": i, "inner": {"x": i / 2} if i % 2 else None}).encode()
              for i in range(5)] + [b"not json"]
    out = [(e, build_entry(Message(v), producer_name="p", sequence_id=e, publish_time_ms=1 + e,
                           schema_version=(0).to_bytes(8, "big"))) for e, v in enumerate(values)]
    counters: dict = {}
    encode_and_upload(tier, KEY, 7, out, partition=-1, row_group_bytes=600,
                      typed_versions=((0, "JSON", json.dumps(schema)),), counters=counters)
    table = pq.read_table(tmp_path / KEY)
    assert table.column("name").to_pylist() == ["a0", "a1", "a2", "a3", "a4", None]
    assert table.column("n").type == pa.int64()
    assert table.column("inner").to_pylist()[:2] == [None, {"x": 0.5}]
    assert counters["typed_values_undecodable"] == 1
    assert list(table_to_entries(read_parquet(tmp_path / KEY))) == out


ODD = {"type": "record", "name": "Odd", "fields": [
    {"name": "nothing", "type": "null"},
    {"name": "either", "type": ["null", "int", "string"]},
    {"name": "fx", "type": {"type": "fixed", "name": "F", "size": 4}},
    {"name": "en", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
    {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2}},
    {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "tu", "type": {"type": "long", "logicalType": "time-micros"}},
    {"name": "d", "type": {"type": "int", "logicalType": "date"}}]}


def test_every_avro_kind_reads_the_same_stored_or_decoded(tmp_path):
    """Unions of several branches, fixed, enum, a decimal wider than Spark's, uuid, times, dates,
    a null-typed field: stored columns and decoding give the same Spark batches."""
    import decimal
    import uuid
    values = [avro(ODD, {"nothing": None, "either": i if i % 2 else "s", "fx": b"abcd", "en": "B",
                         "dec": decimal.Decimal("1.25"), "u": str(uuid.UUID(int=i)), "tm": dt.time(1, 2, 3),
                         "tu": dt.time(1, 2, 3, 4), "d": dt.date(2024, 1, 1)}) for i in range(4)]
    ents = [(e, build_entry(Message(v), producer_name="p", sequence_id=e, publish_time_ms=1 + e,
                            schema_version=(0).to_bytes(8, "big"))) for e, v in enumerate(values)]
    versions = ((0, "AVRO", json.dumps(ODD)),)
    counters: dict = {}
    encode_and_upload(Tier(f"file://{tmp_path / 'stored'}", None), KEY, 7, ents, partition=-1,
                      row_group_bytes=600, typed_versions=versions, counters=counters)
    encode_and_upload(Tier(f"file://{tmp_path / 'raw'}", None), KEY, 7, ents, partition=-1, row_group_bytes=600)
    assert counters["typed_fields_unconvertible"] == 0
    stored = pq.read_table(tmp_path / "stored" / KEY)
    assert stored.column("u").to_pylist()[1] == str(uuid.UUID(int=1))
    assert stored.column("dec").type == pa.decimal256(40, 2)
    typed = _typed_value(versions)
    m = tmp_path / "m"
    a = _scan_output(tmp_path / "stored", typed, metrics_dir=str(m))
    b = _scan_output(tmp_path / "raw", typed)
    assert [json.loads(p.read_text())["source"] for p in m.glob("typed-*.json")] == ["stored"]
    assert a.num_rows == 4 and a.equals(b)
    row = a.to_pylist()[1]
    assert row["either"] == {"member0": 1, "member1": None} and row["dec"] == "1.25" and row["en"] == "B"


def test_offloader_takes_struct_versions_from_the_registry():
    """TopicOffloader._typed_versions: every live version AVRO/JSON -> (version, kind, text);
    a primitive or KeyValue version among them, no schema, or the broker key off -> None."""
    import asyncio
    from types import SimpleNamespace

    from broker.offloader import TopicOffloader
    from broker.schema_compat import SchemaDef
    from broker.schemas import StoredSchema

    def offloader(stored, typed_on=True):
        class Registry:
            async def all_versions(self, topic):
                return stored
        service = SimpleNamespace(schemas=Registry())
        return SimpleNamespace(broker=SimpleNamespace(config=SimpleNamespace(offload=SimpleNamespace(typed_columns=typed_on)),
                                                      store=None),
                               topic=SimpleNamespace(service=service, name="persistent://public/default/t"),
                               ml_name="public/default/persistent/t")

    def stored(*kinds):
        return [StoredSchema(i, "", SchemaDef(k, json.dumps(V0).encode() if k in ("AVRO", "JSON") else b"",
                                              ()), 0) for i, k in enumerate(kinds)]

    def run(o):
        return asyncio.run(TopicOffloader._typed_versions(o, 7))

    assert run(offloader(stored("AVRO", "JSON"))) == ((0, "AVRO", json.dumps(V0)), (1, "JSON", json.dumps(V0)))
    assert run(offloader(stored("AVRO", "STRING"))) is None
    assert run(offloader(stored())) is None
    assert run(offloader(stored("AVRO"), typed_on=False)) is None


def test_names_compare_without_case_as_spark_does():
    from offload.typed_columns import column_names_beside
    t = pa.schema([("Value", pa.string()), ("a", pa.int32()), ("A", pa.int32())])
    assert column_names_beside(["key", "value"], t) == ["value_Value", "a", "value_A"]
