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


def test_scan_of_a_half_offloaded_topic_returns_every_message_once_with_the_readers_ids(cluster_factory, tmp_path):
    import duckdb
    import polars as pl

    from pulsarlite.lake import LakeScanError, scan

    tier_dir = tmp_path / "tier"
    tier_dir.mkdir()
    # deletion lag: offloaded ledgers stay on the bookies too, the scan must not read them twice
    cluster = cluster_factory(3, brokers=1, broker_overrides=broker_overrides(
        f"file://{tier_dir}", lake_enabled=True, offload_deletion_lag_ms=3_600_000))
    keep_everything(cluster.admin_url)
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
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
        client.close()
