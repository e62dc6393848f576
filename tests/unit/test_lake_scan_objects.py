"""[lakehouse] faces.lake: a tier object not in the table yet is read row group by row group,
and a publish-time window skips the row groups its statistics put outside it."""

from __future__ import annotations

import pyarrow as pa

import pytest

from faces.lake import LakeScanError, ScanReport, _object_schema, _object_tables, _Request
from offload.reader import encode_ledger
from pulsarlite.topic_name import TopicName
from pulsarlite.wire.entry import Message, build_entry

T0 = 1_700_000_000_000


def write_object(tmp_path, n: int = 60) -> str:
    entries = [(i, build_entry(Message(b"x" * 200), producer_name="p", sequence_id=i, publish_time_ms=T0 + i))
               for i in range(n)]
    encoded = encode_ledger(7, entries, partition=0, row_group_bytes=2_000)
    assert encoded.row_groups >= 4
    path = tmp_path / "7.parquet"
    path.write_bytes(encoded.data)
    return f"file://{path}"


def request(start: int | None, end: int | None) -> _Request:
    return _Request(TopicName.parse("t"), "http://unused", "", None, 10, start, end, ScanReport())


def test_every_row_group_in_order_without_a_window(tmp_path):
    uri = write_object(tmp_path)
    req = request(None, None)
    tables = list(_object_tables(7, uri, req))
    assert len(tables) == req.report.row_groups_read >= 4 and req.report.row_groups_pruned == 0
    got = pa.concat_tables(tables)
    assert got.column("entry_id").to_pylist() == list(range(60))
    assert got.schema == _object_schema(uri, None)


def test_a_window_reads_only_the_row_groups_it_overlaps_and_keeps_its_rows(tmp_path):
    uri = write_object(tmp_path)
    req = request(T0 + 20, T0 + 30)
    got = pa.concat_tables(list(_object_tables(7, uri, req)))
    assert got.column("entry_id").to_pylist() == list(range(20, 30))
    assert req.report.row_groups_pruned > 0
    assert req.report.row_groups_read + req.report.row_groups_pruned >= 4
    everything = request(None, None)
    list(_object_tables(7, uri, everything))
    assert req.report.row_groups_read < everything.report.row_groups_read


def test_the_window_rule_is_the_spark_sources_start_inclusive_end_exclusive():
    req = request(100, 200)
    assert req.overlaps(None, None) and req.overlaps(50, 100) and req.overlaps(199, 300)
    assert not req.overlaps(10, 99) and not req.overlaps(200, 300)


def test_an_object_deleted_since_the_cut_fails_the_read_with_scan_again(tmp_path):
    uri = write_object(tmp_path)
    (tmp_path / "7.parquet").unlink()
    with pytest.raises(LakeScanError, match="ledger 7: .* gone since the scan's cut.*scan again"):
        list(_object_tables(7, uri, request(None, None)))


def test_a_reader_dropped_before_its_end_closes_the_stream_and_its_loop():
    """scan_batches' reader drives an async generator (the ZooKeeper session's holder) on its own
    event loop: dropping the reader early runs the generator's cleanup and closes the loop
    (pyarrow's ``close()`` keeps the Python iterator: only the reader's release ends it)."""
    import asyncio
    import gc

    from faces.lake import _drive
    schema = pa.schema([pa.field("n", pa.int64())])
    cleaned = []

    async def stream():
        try:
            for i in range(5):
                await asyncio.sleep(0)
                yield pa.table({"n": [i]})
        finally:
            cleaned.append(True)

    loop = asyncio.new_event_loop()
    reader = pa.RecordBatchReader.from_batches(schema, _drive(loop, stream(), schema))
    assert reader.read_next_batch().column("n").to_pylist() == [0]
    reader.close()
    del reader
    gc.collect()
    assert cleaned == [True] and loop.is_closed()
    loop = asyncio.new_event_loop()
    with pa.RecordBatchReader.from_batches(schema, _drive(loop, stream(), schema)) as reader:
        assert reader.read_all().column("n").to_pylist() == [0, 1, 2, 3, 4]
    assert cleaned == [True, True] and loop.is_closed()
