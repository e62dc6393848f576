"""[lakehouse] ``pulsarlite.lake.scan``: the fresh view of a half-offloaded topic. Real
ZooKeeper, bookies and a broker (lake on, file:// tier, embedded catalog), the official client's
AvroSchema producers (one schema evolution) and reader: the scan returns every message once,
with the official reader's message ids, the table's typed columns for the rows still on the
bookies too, and reads the offloaded ledgers from the Iceberg snapshot."""

from __future__ import annotations

import pytest

from tests.integration.test_offload_broker import (broker_overrides, http, internal_stats, keep_everything,
                                                   topic_url, wait_bookie_deleted)

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("pyiceberg")

from tests.integration.test_lake import (LOCAL, TOPIC, expected_rows, lake, message_ids,  # noqa: E402
                                         offloaded_ledgers, produce, table_files)
from tests.integration.test_offload_typed_columns import fields  # noqa: E402

pytestmark = pytest.mark.integration


def half_offloaded(cluster_factory, tmp_path, client_box: list):
    """A cluster (lake on, file:// tier, deletion lag: offloaded ledgers stay on the bookies too,
    the scan must not read them twice) whose topic has its first ledgers offloaded and in the
    table, the rest (the open ledger among them) on the bookies. Returns (cluster, client,
    lake info, offloaded ledger ids); the client is put in ``client_box`` for the caller to close."""
    from pulsarlite.lake import LakeScanError, scan

    tier_dir = tmp_path / "tier"
    tier_dir.mkdir()
    cluster = cluster_factory(3, brokers=1, broker_overrides=broker_overrides(
        f"file://{tier_dir}", lake_enabled=True, offload_deletion_lag_ms=3_600_000))
    keep_everything(cluster.admin_url)
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    client_box.append(client)
    with pytest.raises(LakeScanError, match="no managed ledger"):
        scan(TOPIC, zookeeper=cluster.zookeeper, admin_url=cluster.admin_url)
    produce(client, 0, 25, 40)
    ledgers = [i for i in internal_stats(cluster.admin_url, LOCAL)["ledgers"] if i["entries"] > 0]
    assert len(ledgers) >= 4
    middle = ledgers[len(ledgers) // 2]["ledgerId"]       # offload the first half only
    code, body = http("PUT", topic_url(cluster.admin_url, LOCAL) + "/offload", {"ledgerId": middle, "entryId": 0})
    assert code == 204, body
    half = [i["ledgerId"] for i in ledgers if i["ledgerId"] < middle]

    def committed():
        code, got = http("GET", topic_url(cluster.admin_url, LOCAL) + "/offload")
        assert got["status"] != "ERROR", got
        info = lake(cluster.admin_url)
        return got["status"] == "SUCCESS" and info["metadata_location"] and \
            len(table_files(info["metadata_location"])) == len(half) and info

    from tests.integration.helpers import wait_for
    info = wait_for(committed, 120, "first half offloaded and in the table", interval_s=0.2)
    assert set(offloaded_ledgers(cluster.admin_url)) == set(half)
    produce(client, 65, 0, 15)              # more, on the bookies (the open ledger among them)
    return cluster, client, info, half


def test_scan_of_a_half_offloaded_topic_returns_every_message_once_with_the_readers_ids(cluster_factory, tmp_path):
    import duckdb
    import polars as pl

    from pulsarlite.lake import scan

    box: list = []
    try:
        cluster, client, info, half = half_offloaded(cluster_factory, tmp_path, box)
        got = scan(TOPIC, zookeeper=cluster.zookeeper, admin_url=cluster.admin_url)
        rows = got.to_pylist()
        ids = [(r["ledger_id"], r["entry_id"], r["batch_index"]) for r in rows]
        assert len(ids) == len(set(ids))                                   # each message once
        assert set(ids) == message_ids(client)                             # the official reader's ids
        assert ids == sorted(ids)
        assert {r["ledger_id"] for r in rows} > set(half)                  # both halves
        sent = expected_rows(25, 55)                                       # items 0..79, shop from 25 on
        assert {r["item"]: (r["qty"], r["shop"]) for r in rows} == \
            {item: (i, want["shop"]) for i, (item, want) in enumerate(sent.items())}
        # the table's columns, in its order (typed ones included), for the bookie rows as well
        from pyiceberg.table import StaticTable
        table_schema = StaticTable.from_metadata(info["metadata_location"]).scan().to_arrow().schema
        assert got.schema.names[:len(table_schema.names)] == table_schema.names
        for r in rows:                                                     # typed values, both halves
            want = fields(r["qty"])
            assert r["value_key"] == want["key"] and r["tags"] == want["tags"]
            assert int(r["at"].timestamp() * 1000) == want["at"]
            assert r["ship"] == (None if want["ship"] is None else {"city": want["ship"].city, "zip": want["ship"].zip})

        # Polars and DuckDB take it as it is
        assert pl.from_arrow(got).filter(pl.col("shop") == "north").height == 55
        con = duckdb.connect()
        con.register("topic", got)
        assert con.execute("SELECT count(*), count(DISTINCT item) FROM topic").fetchone() == (80, 80)
    finally:
        for client in box:
            client.close()


def test_scan_batches_streams_the_same_rows_as_scan_and_prunes_by_publish_time(cluster_factory, tmp_path):
    """The stream (small bookie chunks) holds the rows of ``scan``, in the same order and schema,
    in pieces no larger than a chunk / a table batch; Polars and DuckDB read the reader itself; a
    publish-time window returns the rows of ``scan`` in that window while ledgers whose recorded
    range misses it are not read."""
    import duckdb
    import polars as pl
    import pyarrow as pa

    from pulsarlite.lake import ScanReport, scan, scan_batches

    box: list = []
    try:
        cluster, client, info, half = half_offloaded(cluster_factory, tmp_path, box)
        where = {"zookeeper": cluster.zookeeper, "admin_url": cluster.admin_url}
        whole = scan(TOPIC, **where)
        assert whole.num_rows == 80
        report = ScanReport()
        with scan_batches(TOPIC, **where, chunk_entries=2, report=report) as reader:
            assert reader.schema == whole.schema
            batches = list(reader)
        streamed = pa.Table.from_batches(batches, whole.schema)
        assert streamed.equals(whole)                                       # same rows, order, ids, columns
        assert report.snapshot_files_read == len(half) and report.bookie_ledgers_read >= 2
        assert report.rows == 80 and report.ledgers_pruned_by_time == []
        bookie_batches = [b for b in batches if b.column("ledger_id")[0].as_py() not in half]
        assert len(bookie_batches) >= report.bookie_entries_read // 2       # chunk_entries=2 at a time
        assert max(b.num_rows for b in bookie_batches) <= 2 * 4             # 2 entries of <= 4 messages

        # Polars and DuckDB consume the reader (a stream, read once)
        with scan_batches(TOPIC, **where) as reader:
            assert pl.from_arrow(reader).filter(pl.col("shop") == "north").height == 55
        with scan_batches(TOPIC, **where) as reader:
            assert duckdb.connect().execute("SELECT count(*), count(DISTINCT item) FROM reader").fetchone() == (80, 80)

        # a window [t0, t1): from the last offloaded ledger's newest message to a bookie row's
        rows = whole.to_pylist()
        ms = [int(r["publish_time"].timestamp() * 1000) for r in rows]
        t0 = max(m for r, m in zip(rows, ms) if r["ledger_id"] == half[-1])
        t1 = ms[len(rows) - 8]
        want = [(r["ledger_id"], r["entry_id"], r["batch_index"]) for r, m in zip(rows, ms) if t0 <= m < t1]
        assert 0 < len(want) < 80
        report = ScanReport()
        got = scan(TOPIC, **where, start_time_ms=t0, end_time_ms=t1, report=report)
        assert [(r["ledger_id"], r["entry_id"], r["batch_index"]) for r in got.to_pylist()] == want
        assert got.schema == whole.schema
        # the offloaded ledgers before the last one ended before t0: neither listed nor read
        early = [lg for lg in half[:-1] if max(m for r, m in zip(rows, ms) if r["ledger_id"] == lg) < t0]
        assert early and set(early) <= set(report.ledgers_pruned_by_time)
        assert report.snapshot_files_read == len(half) - len(early)
        assert report.rows == len(want)
        from spark_source.options import OptionError
        with pytest.raises(OptionError, match="before"):
            scan(TOPIC, **where, start_time_ms=t1, end_time_ms=t0)

        # column projection: the same rows, only the columns asked for, in their order, from the
        # snapshot (typed ones included) and the bookies alike; with the window too
        cols = ["qty", "ledger_id", "entry_id", "batch_index", "item"]
        got = scan(TOPIC, **where, columns=cols)
        assert got.schema.names == cols and got.equals(whole.select(cols))
        with scan_batches(TOPIC, **where, chunk_entries=2, columns=["shop", "entry_id"]) as reader:
            assert reader.schema.names == ["shop", "entry_id"]
            assert reader.read_all().equals(whole.select(["shop", "entry_id"]))
        got = scan(TOPIC, **where, start_time_ms=t0, end_time_ms=t1, columns=["ledger_id", "entry_id", "batch_index"])
        assert [tuple(r.values()) for r in got.to_pylist()] == want
        from pulsarlite.lake import LakeScanError
        report = ScanReport()
        with pytest.raises(LakeScanError, match="no column 'quantity'; its columns are ledger_id, .*qty"):
            scan_batches(TOPIC, **where, columns=["qty", "quantity"], report=report)
        assert report.rows == 0 and report.snapshot_files_read == 0 and report.bookie_entries_read == 0
    finally:
        for client in box:
            client.close()
