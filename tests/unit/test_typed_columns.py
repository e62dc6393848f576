"""Typed columns from struct schemas (offload/typed_columns.py)."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json

import fastavro
import pyarrow as pa
import pytest

from offload.typed_columns import (DecodeStats, TypedColumnsError, arrow_type, column_names_beside,
                                   decode_columns, merged_schema)

V1 = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "int"},
    {"name": "item", "type": ["null", "string"], "default": None},
]}
V2 = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"},                               # widened
    {"name": "item", "type": ["null", "string"], "default": None},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
     "default": "\\u0000"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}, "default": 0},
    {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []},
    {"name": "attrs", "type": {"type": "map", "values": "int"}, "default": {}},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}, "default": "A"},
    {"name": "ship", "type": ["null", {"type": "record", "name": "Ship", "fields": [
        {"name": "city", "type": "string"}, {"name": "day", "type": {"type": "int", "logicalType": "date"}}]}],
     "default": None},
    {"name": "either", "type": ["null", "int", "string"], "default": None},
]}


def avro_bytes(schema: dict, record: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


def test_arrow_types_of_avro_types():
    t = merged_schema([V2])
    assert t.field("id").type == pa.int64()
    assert t.field("price").type == pa.decimal128(9, 2)
    assert t.field("at").type == pa.timestamp("ms", tz="UTC")
    assert t.field("tags").type == pa.list_(pa.string())
    assert t.field("attrs").type == pa.map_(pa.string(), pa.int32())
    assert t.field("kind").type == pa.string()
    assert t.field("ship").type == pa.struct([("city", pa.string()), ("day", pa.date32())])
    assert t.field("either").type == pa.struct([("member0", pa.int32()), ("member1", pa.string())])
    assert all(f.nullable for f in t)


def test_versions_merge_by_name_and_widen_numbers():
    t = merged_schema([V1, V2])
    assert t.names[:2] == ["id", "item"] and t.field("id").type == pa.int64()
    assert "price" in t.names


def test_rows_of_two_versions_land_in_one_table():
    t = merged_schema([V1, V2])
    when = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.timezone.utc)
    values = [
        avro_bytes(V1, {"id": 1, "item": "tea"}),
        avro_bytes(V2, {"id": 2 ** 40, "item": None, "price": decimal.Decimal("12.34"), "at": when,
                        "tags": ["x", "y"], "attrs": {"n": 3}, "kind": "B",
                        "ship": {"city": "Oslo", "day": dt.date(2026, 5, 17)}, "either": "s"}),
        None,
    ]
    stats = DecodeStats()
    cols = decode_columns(values, [0, 1, 1], {0: ("AVRO", V1), 1: ("AVRO", V2)}, t, stats)
    table = pa.Table.from_arrays(cols, schema=t)
    rows = table.to_pylist()
    assert rows[0]["id"] == 1 and rows[0]["item"] == "tea" and rows[0]["price"] is None   # missing field: null
    assert rows[1]["id"] == 2 ** 40 and rows[1]["price"] == decimal.Decimal("12.34") and rows[1]["at"] == when
    assert rows[1]["tags"] == ["x", "y"] and rows[1]["attrs"] == [("n", 3)] and rows[1]["kind"] == "B"
    assert rows[1]["ship"] == {"city": "Oslo", "day": dt.date(2026, 5, 17)}
    assert rows[1]["either"] == {"member0": None, "member1": "s"}
    assert all(v is None for v in rows[2].values())                                      # null value
    assert stats.values == 3 and stats.undecodable == 0


def test_undecodable_values_become_nulls_and_are_counted():
    t = merged_schema([V1])
    stats = DecodeStats()
    cols = decode_columns([b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", avro_bytes(V1, {"id": 7, "item": None})],
                          [0, 0], {0: ("AVRO", V1)}, t, stats)
    assert cols[0].to_pylist() == [None, 7]
    assert stats.undecodable == 1 and stats.errors


def test_json_values_with_the_official_clients_json_schema():
    pulsar_schema = pytest.importorskip("pulsar.schema")

    class Point(pulsar_schema.Record):
        _sorted_fields = True
        x = pulsar_schema.Integer()
        label = pulsar_schema.String()

    schema = pulsar_schema.JsonSchema(Point)
    avro = json.loads(schema.schema_info().schema())
    t = merged_schema([avro])
    values = [schema.encode(Point(x=i, label=f"p{i}")) for i in range(3)]
    cols = decode_columns(values, [0, 0, 0], {0: ("JSON", avro)}, t)
    assert pa.Table.from_arrays(cols, schema=t).to_pylist() == [{"label": f"p{i}", "x": i} for i in range(3)]


def test_avro_values_from_the_official_client():
    pulsar_schema = pytest.importorskip("pulsar.schema")

    class Reading(pulsar_schema.Record):
        _sorted_fields = True
        sensor = pulsar_schema.String()
        value = pulsar_schema.Double()
        count = pulsar_schema.Long()

    schema = pulsar_schema.AvroSchema(Reading)
    avro = json.loads(schema.schema_info().schema())
    t = merged_schema([avro])
    values = [schema.encode(Reading(sensor="s", value=0.5 * i, count=i)) for i in range(4)]
    rows = pa.Table.from_arrays(decode_columns(values, [0] * 4, {0: ("AVRO", avro)}, t), schema=t).to_pylist()
    assert rows == [{"count": i, "sensor": "s", "value": 0.5 * i} for i in range(4)]


def test_recursive_and_bad_schemas_are_refused():
    node = {"type": "record", "name": "Node", "fields": [
        {"name": "next", "type": ["null", "Node"], "default": None}]}
    with pytest.raises(TypedColumnsError, match="recursive"):
        merged_schema([node])
    with pytest.raises(TypedColumnsError, match="record"):
        merged_schema(["string"])
    with pytest.raises(TypedColumnsError):
        arrow_type("NoSuchType")


def test_names_beside_metadata_columns_do_not_collide():
    t = pa.schema([("key", pa.string()), ("x", pa.int32()), ("value_key", pa.int32())])
    assert column_names_beside(["key", "value", "topic"], t) == ["value_key", "x", "value_value_key"]
