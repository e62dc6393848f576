"""[lakehouse] faces.lake column projection: ``columns=`` is checked before anything is read
(bad lists, names the topic does not have), table files and tier objects are read for those
columns only (plus ``publish_time`` for a window), bookie rows are cut to them and their typed
columns decoded only when one is asked for."""

from __future__ import annotations

import asyncio
import json

import pyarrow as pa
import pytest

from faces.lake import (LakeScanError, ScanReport, _bookie_tables, _checked_columns, _object_tables, _Plan,
                        _projected, _Request, _snapshot_scan, _snapshot_tables, _union, scan_batches)
from offload.format import ROW_SCHEMA
from pulsarlite.topic_name import TopicName
from test_lake_scan_objects import T0, write_object

V0 = {"type": "record", "name": "Order", "fields": [{"name": "item", "type": "string"}, {"name": "qty", "type": "int"}]}


def request(columns, start: int | None = None, end: int | None = None) -> _Request:
    return _Request(TopicName.parse("t"), "http://unused", "", None, 3, start, end, ScanReport(),
                    _checked_columns(columns))


@pytest.mark.parametrize("columns, match", [
    ("value", "list of column names"), ([], "empty"), (["key", ""], "non-empty strings"),
    (["key", 3], "non-empty strings"), (["key", "value", "key"], r"more than once: \['key'\]")])
def test_a_bad_columns_argument_is_refused_before_anything_is_reached(columns, match):
    # the ZooKeeper and admin addresses are never contacted: the argument fails first
    with pytest.raises(ValueError, match=match):
        scan_batches("t", zookeeper="127.0.0.1:1", admin_url="http://127.0.0.1:1", columns=columns)


def test_unknown_columns_are_named_with_the_topics_columns():
    schema = _union([ROW_SCHEMA, pa.schema([pa.field("qty", pa.int32())])])
    assert _projected(schema, ("qty", "ledger_id"), "t").names == ["qty", "ledger_id"]      # the caller's order
    assert _projected(schema, None, "t") == schema
    with pytest.raises(LakeScanError, match=r"topic t: no column 'qyt', 'shop'; its columns are ledger_id, .*, qty$"):
        _projected(schema, ("qyt", "qty", "shop"), "t")


def test_an_object_is_read_for_the_projected_columns_only(tmp_path):
    uri = write_object(tmp_path)
    whole = pa.concat_tables(list(_object_tables(7, uri, request(None))))
    tables = list(_object_tables(7, uri, request(["entry_id", "value"])))
    assert {tuple(t.column_names) for t in tables} == {("entry_id", "value")}    # what was decoded
    assert pa.concat_tables(tables).equals(whole.select(["entry_id", "value"]))
    # a window also reads publish_time (to filter the rows); a column the object lacks is not asked for
    tables = list(_object_tables(7, uri, request(["value", "shop"], T0 + 20, T0 + 30)))
    assert {tuple(t.column_names) for t in tables} == {("value", "publish_time")}
    assert sum(t.num_rows for t in tables) == 10
    # only columns the object lacks: entry_id keeps the row count
    tables = list(_object_tables(7, uri, request(["shop"])))
    assert {tuple(t.column_names) for t in tables} == {("entry_id",)} and sum(t.num_rows for t in tables) == 60


def test_the_snapshot_is_read_through_pyiceberg_for_the_projected_columns_only(tmp_path):
    pytest.importorskip("pyiceberg")
    from pyiceberg.table import StaticTable

    from offload.lake import Lake, TableId
    from test_offload_lake import _write_object
    tier = tmp_path / "tier"
    tier.mkdir()
    uri = _write_object(tier, 1, [(0, V0)], [{"item": f"a{i}", "qty": i} for i in range(5)],
                        lambda r: (0).to_bytes(8, "big"))
    lake, tid = Lake(f"file://{tier}"), TableId.of_topic("t", "ns", "orders")
    lake.sync(tid, {1: uri}, prefix=f"file://{tier}/t/ns/orders/")
    table = StaticTable.from_metadata(lake.metadata_location(tid))

    def read(req):
        s = _snapshot_scan(table, req)
        plan = _Plan([], pa.schema([]), None, s, {t.file.file_path: t for t in s.plan_files()}, None)
        return list(_snapshot_tables(plan, 1, uri, req))

    got = read(request(["qty", "entry_id"]))
    assert {frozenset(t.column_names) for t in got} == {frozenset({"qty", "entry_id"})}   # pyiceberg's projection
    # (in the table's order: the stream's _conform puts them in the caller's)
    assert pa.concat_tables(got).column("qty").to_pylist() == [0, 1, 2, 3, 4]
    assert {tuple(t.column_names) for t in read(request(None))} == {tuple(f.name for f in table.schema().fields)}


class _Entry:
    def __init__(self, entry_id: int, payload: bytes) -> None:
        self.entry_id, self.payload = entry_id, payload


class _Ledger:
    """A closed ledger of a bookie client (open_ledger's reader), in memory."""

    def __init__(self, entries: list[bytes]) -> None:
        self.entries = entries
        self.last_readable_entry_id = len(entries) - 1
        self.metadata = type("M", (), {"is_closed": True})()

    async def read(self, first: int, last: int):
        return [_Entry(i, self.entries[i]) for i in range(first, last + 1)]


class _Client:
    def __init__(self, ledger: _Ledger) -> None:
        self.ledger = ledger

    async def open_ledger(self, ledger_id: int, recovery: bool):
        return self.ledger


class _CountingTyped:
    """The offloader's typed columns, counting its decodes."""

    def __init__(self) -> None:
        from offload.tier import TableTypedColumns
        self.inner = TableTypedColumns([(0, "JSON", json.dumps(V0))], topic="t", ledger_id=3)
        self.fields, self.decoded = self.inner.fields, 0

    def arrays(self, table):
        self.decoded += 1
        return self.inner.arrays(table)


def test_bookie_rows_are_cut_to_the_projection_and_typed_columns_decoded_only_when_asked(tmp_path):
    from pulsarlite.wire.entry import Message, build_entry
    from spark_source.plan import LedgerSegment
    entries = [build_entry(Message(json.dumps({"item": f"i{i}", "qty": i}).encode()), producer_name="p",
                           sequence_id=i, publish_time_ms=T0 + i, schema_version=(0).to_bytes(8, "big"))
               for i in range(7)]
    seg = LedgerSegment(ledger_id=3, closed=True, last_entry_id=6, size_bytes=0, min_publish_time_ms=None,
                        max_publish_time_ms=None, offload_state="none", offload_uri=None)

    def read(req, typed):
        async def go():
            return [t async for t in _bookie_tables(_Client(_Ledger(entries)), "t", 0, seg, typed, req)]
        return asyncio.run(go())

    typed = _CountingTyped()
    got = read(request(["qty", "entry_id"]), typed)
    assert {tuple(t.column_names) for t in got} == {("qty", "entry_id")}
    assert pa.concat_tables(got).column("qty").to_pylist() == list(range(7)) and typed.decoded == 3   # 3 chunks
    typed = _CountingTyped()
    got = read(request(["entry_id"], T0 + 2, T0 + 5), typed)
    assert {tuple(t.column_names) for t in got} == {("entry_id", "publish_time")} and typed.decoded == 0
    assert pa.concat_tables(got).column("entry_id").to_pylist() == [2, 3, 4]
    typed = _CountingTyped()
    assert set(pa.concat_tables(read(request(None), typed)).column_names) == set(ROW_SCHEMA.names) | {"item", "qty"}
    assert typed.decoded == 3
