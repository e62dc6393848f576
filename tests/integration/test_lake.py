"""[lakehouse] Offloaded ledgers as an Iceberg table, end to end: real ZooKeeper, bookies and a
broker (cluster_factory, ``lake_enabled``, file:// tier with the embedded SQLite catalog), the
official client's AvroSchema producers, and readers that know nothing of pulsarlite: pyiceberg
(``StaticTable.from_metadata``), Polars (``scan_iceberg``) and DuckDB (``read_parquet`` of the
table's data files).

1. An Avro topic written under version 0, then version 1 (adds an optional field), over several
   ledgers; offloaded. ``GET .../lake`` names the table and its metadata file; every reader
   returns every offloaded message, once, with the record's typed columns (rows of version 0
   null in the added field) and the message ids of the ledger list.
2. Crash between the object upload and the table commit: the test holds the catalog's SQLite
   write lock (BEGIN EXCLUSIVE) so the broker's commits fail while its offloads go on; once the
   new ledgers are recorded offloaded (and missing from the table), the broker is killed with
   SIGKILL, the lock released, the broker restarted: the new owner's first offloader pass puts
   exactly the missing objects in the table.
3. Retention trims the ledgers: the next snapshot no longer has their files (the previous one
   still does), and the objects are gone. Deleting the topic drops its table.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import wait_for
from tests.integration.test_offload_broker import (broker_overrides, http, internal_stats, keep_everything,
                                                   topic_url, wait_bookie_deleted)

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("pyiceberg")
from pulsar.schema import AvroSchema  # noqa: E402

from tests.integration.test_offload_typed_columns import Order, OrderV1, fields  # noqa: E402

pytestmark = pytest.mark.integration

LOCAL = "orders"
TOPIC = f"persistent://public/default/{LOCAL}"


def lake(admin_url: str) -> dict:
    code, got = http("GET", topic_url(admin_url, LOCAL) + "/lake")
    assert code == 200, got
    return got


def offloaded_ledgers(admin_url: str) -> dict[int, dict]:
    return {i["ledgerId"]: i for i in internal_stats(admin_url, LOCAL)["ledgers"]
            if i["offloadState"] in ("offloaded", "bookie-deleted")}


def table_files(metadata_location: str, snapshot_id: int | None = None) -> set[str]:
    from pyiceberg.table import StaticTable
    table = StaticTable.from_metadata(metadata_location)
    return {t.file.file_path for t in table.scan(snapshot_id=snapshot_id).plan_files()}


def expected_rows(n0: int, n1: int) -> dict[str, dict]:
    out = {}
    for i in range(n0 + n1):
        out[f"item-{i}"] = {**fields(i), "shop": None if i < n0 else "north"}
    return out


def produce(client, first: int, n0: int, n1: int) -> None:
    p0 = client.create_producer(TOPIC, schema=AvroSchema(Order), batching_enabled=False)
    for i in range(first, first + n0):
        p0.send(Order(**fields(i)))
    p0.close()
    p1 = client.create_producer(TOPIC, schema=AvroSchema(OrderV1), batching_enabled=True,
                                batching_max_messages=4, batching_max_publish_delay_ms=20)
    for i in range(first + n0, first + n0 + n1):
        p1.send_async(OrderV1(shop="north", **fields(i)), None)
    p1.flush()
    p1.close()


def message_ids(client) -> set[tuple[int, int, int]]:
    """(ledger, entry, batch index) of every message of the topic, read from the broker."""
    reader = client.create_reader(TOPIC, pulsar.MessageId.earliest)
    out = set()
    try:
        while reader.has_message_available():
            mid = reader.read_next(timeout_millis=30_000).message_id()
            out.add((mid.ledger_id(), mid.entry_id(), mid.batch_index()))
    finally:
        reader.close()
    return out


def offload_all_closed(admin_url: str) -> list[int]:
    """Offload every ledger before the current one; wait until they left the bookies."""
    current = internal_stats(admin_url, LOCAL)["ledgers"][-1]["ledgerId"]
    code, body = http("PUT", topic_url(admin_url, LOCAL) + "/offload", {"ledgerId": current, "entryId": 0})
    assert code == 204, body
    ids = [i["ledgerId"] for i in internal_stats(admin_url, LOCAL)["ledgers"]
           if i["ledgerId"] < current and i["entries"] > 0]
    wait_bookie_deleted(admin_url, LOCAL, ids)
    return ids


def check_rows(rows: list[dict], offloaded: dict[int, dict]) -> dict[str, dict]:
    """Every row once, its typed columns equal to what was sent, its ledger one of the list's."""
    by_item = {r["item"]: r for r in rows}
    assert len(by_item) == len(rows)
    for item, r in by_item.items():
        i = int(item.split("-")[1])
        want = fields(i)
        assert r["qty"] == i and r["value_key"] == want["key"]
        at = r["at"]
        at_ms = at if isinstance(at, int) else int(at.timestamp() * 1000)
        assert at_ms == want["at"]
        assert r["ledger_id"] in offloaded
    return by_item


def test_offloaded_avro_topic_is_an_iceberg_table(cluster_factory, tmp_path, monkeypatch):
    import duckdb
    import polars as pl
    from pyiceberg.table import StaticTable

    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")      # no polars_iceberg plugin here
    tier_dir = tmp_path / "tier"
    tier_dir.mkdir()
    overrides = broker_overrides(f"file://{tier_dir}", lake_enabled=True, retention_check_interval_ms=500)
    cluster = cluster_factory(3, brokers=1, broker_overrides=overrides)
    keep_everything(cluster.admin_url)
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        produce(client, 0, 25, 60)
        offload_all_closed(cluster.admin_url)
        offloaded = offloaded_ledgers(cluster.admin_url)
        assert len(offloaded) >= 3

        # -- 1. the table, read by engines that know nothing of pulsarlite ----------------------
        info = lake(cluster.admin_url)
        assert info["table"] == f"public.default.{LOCAL}" and info["catalog"].startswith("sqlite:///")
        location = info["metadata_location"]
        assert location.startswith(f"file://{tier_dir}/_lake/public/default/{LOCAL}/metadata/")
        assert table_files(location) == {i["offloadUri"] for i in offloaded.values()}     # zero copy
        table = StaticTable.from_metadata(location)
        schema = table.schema()
        assert str(schema.find_field("qty").field_type) == "int"
        assert str(schema.find_field("at").field_type) == "timestamptz"
        assert str(schema.find_field("ship").field_type).startswith("struct<")
        assert not schema.find_field("shop").required          # added by version 1: optional
        arrow = table.scan().to_arrow()
        rows = arrow.to_pylist()
        sent = expected_rows(25, 60)
        in_table = {r["item"] for r in rows}
        assert in_table <= set(sent)
        ids = {(r["ledger_id"], r["entry_id"], r["batch_index"]) for r in rows}
        assert len(ids) == len(rows)
        # exactly the messages of the offloaded ledgers, by message id (the official client's)
        assert ids == {m for m in message_ids(client) if m[0] in offloaded}
        by_item = check_rows(rows, offloaded)
        for item, r in by_item.items():
            assert r["shop"] == sent[item]["shop"]
            assert r["ship"] == (None if sent[item]["ship"] is None else
                                 {"city": sent[item]["ship"].city, "zip": sent[item]["ship"].zip})
        polars_rows = pl.scan_iceberg(location).select("item", "qty", "at", "value_key", "ledger_id",
                                                       "shop").collect().to_dicts()
        assert {r["item"]: r["shop"] for r in check_rows(polars_rows, offloaded).values()} == \
            {item: r["shop"] for item, r in by_item.items()}

        files = sorted(table_files(location))
        con = duckdb.connect()
        duck = con.execute("SELECT item, qty, \"at\", value_key, ledger_id, shop FROM read_parquet(?, union_by_name=true)",
                           [[f[len("file://"):] for f in files]]).fetchall()
        duck_rows = [dict(zip(["item", "qty", "at", "value_key", "ledger_id", "shop"], r)) for r in duck]
        assert set(check_rows(duck_rows, offloaded)) == in_table

        # the CLI says the same
        out = subprocess.run([sys.executable, "-m", "pulsarlite", "admin", "--admin-url", cluster.admin_url,
                              "topics", "lake", LOCAL], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["metadata_location"] == location

        # -- 2. crash between the object upload and the table commit, then repair ---------------
        catalog_db = Path(info["catalog"][len("sqlite:///"):])
        lock = sqlite3.connect(catalog_db, isolation_level=None, timeout=60)
        lock.execute("BEGIN EXCLUSIVE")            # the broker's catalog reads and commits fail
        try:
            produce(client, 85, 0, 60)
            current = internal_stats(cluster.admin_url, LOCAL)["ledgers"][-1]["ledgerId"]
            code, body = http("PUT", topic_url(cluster.admin_url, LOCAL) + "/offload",
                              {"ledgerId": current, "entryId": 0})
            assert code == 204, body
            before = set(offloaded)
            newer = wait_for(lambda: set(offloaded_ledgers(cluster.admin_url)) - before or None, 120,
                             "new ledgers recorded offloaded while the catalog is locked", interval_s=0.2)
            offloaded_now = offloaded_ledgers(cluster.admin_url)
            assert table_files(location) == {i["offloadUri"] for i in offloaded.values()}   # not committed
            cluster.kill(cluster.broker_names[0])
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        cluster.restart(cluster.broker_names[0])
        # loading the topic on the new owner runs its first offloader pass (the repair)
        reader = client.create_reader(TOPIC, pulsar.MessageId.earliest)
        reader.close()
        want = {i["offloadUri"] for i in offloaded_ledgers(cluster.admin_url).values()}
        assert want >= {offloaded_now[i]["offloadUri"] for i in newer}

        def repaired():
            got = lake(cluster.admin_url)
            return got if got["metadata_location"] and table_files(got["metadata_location"]) == want else None

        info = wait_for(repaired, 120, "the table repaired after the crash", interval_s=0.5)
        rows = StaticTable.from_metadata(info["metadata_location"]).scan().to_arrow().to_pylist()
        offloaded = offloaded_ledgers(cluster.admin_url)
        check_rows(rows, offloaded)
        assert {(r["ledger_id"], r["entry_id"], r["batch_index"]) for r in rows} == \
            {m for m in message_ids(client) if m[0] in offloaded}
        assert len({r["item"] for r in rows}) == len(rows) > len(in_table)

        # -- 3. retention trims the ledgers: out of the table, then the objects go ---------------
        before_snapshot = StaticTable.from_metadata(info["metadata_location"]).current_snapshot().snapshot_id
        objects = {u[len("file://"):] for u in want}
        code, body = http("POST", f"{cluster.admin_url}/admin/v2/namespaces/public/default/retention",
                          {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})
        assert code == 204, body

        def trimmed():
            got = lake(cluster.admin_url)
            return got if not table_files(got["metadata_location"]) else None

        info = wait_for(trimmed, 120, "retention to take the files out of the table", interval_s=0.5)
        assert table_files(info["metadata_location"], before_snapshot) == want     # the old snapshot keeps them
        wait_for(lambda: not any(Path(p).exists() for p in objects), 60, "the trimmed objects deleted")
        assert not set(offloaded_ledgers(cluster.admin_url)) & set(int(i) for i in offloaded)

        # -- topic deletion drops the table ----------------------------------------------------
        from pyiceberg.catalog.sql import SqlCatalog
        catalog = SqlCatalog("pulsarlite", uri=info["catalog"], warehouse=info["warehouse"])
        assert catalog.table_exists(("public", "default", LOCAL))
        code, body = http("DELETE", topic_url(cluster.admin_url, LOCAL) + "?force=true")
        assert code == 204, body
        assert not catalog.table_exists(("public", "default", LOCAL))
        code, body = http("GET", topic_url(cluster.admin_url, LOCAL) + "/lake")
        assert code == 404, body
    finally:
        client.close()


def test_lake_endpoint_errors(cluster_factory, tmp_path):
    cluster = cluster_factory(1, brokers=1, broker_overrides={"tier_uri": f"file://{tmp_path}"})
    code, body = http("GET", topic_url(cluster.admin_url, "nothing") + "/lake")
    assert code == 412, body                          # a tier, but no lake


def test_lake_on_an_s3_tier(s3_server, s3_tier_uri, tmp_path):
    """The same commits with the objects and the table's metadata on a real S3 endpoint (moto's
    server) and the catalog in a local SQLite file (``lake_catalog_uri``)."""
    import random

    from pyiceberg.table import StaticTable

    from offload.lake import Lake, TableId
    from offload.reader import encode_ledger
    from offload.store import open_object_store
    from tests.unit.test_offload_format import make_entries

    store = open_object_store(s3_tier_uri, s3_endpoint_url=s3_server.endpoint_url)
    rng = random.Random(3)
    offloaded = {}
    for ledger_id in (4, 5):
        key = f"public/default/s3t/ledger-{ledger_id}-{'ef' * 8}.parquet"
        store.put(key, encode_ledger(ledger_id, make_entries(rng, 8, batched=False), partition=-1).data)
        offloaded[ledger_id] = store.object_uri(key)
    lake = Lake(s3_tier_uri, f"sqlite:///{tmp_path}/catalog.db", s3_endpoint_url=s3_server.endpoint_url)
    tid = TableId.of_topic("public", "default", "s3t")
    prefix = f"{s3_tier_uri}/public/default/s3t/"
    assert lake.sync(tid, offloaded, prefix=prefix).add == tuple(sorted(offloaded.values()))
    location = lake.metadata_location(tid)
    assert location.startswith(f"{s3_tier_uri}/_lake/public/default/s3t/metadata/")
    table = StaticTable.from_metadata(location, properties={"s3.endpoint": s3_server.endpoint_url})
    rows = table.scan(selected_fields=("ledger_id", "entry_id")).to_arrow().to_pylist()
    assert sorted((r["ledger_id"], r["entry_id"]) for r in rows) == [(lid, e) for lid in (4, 5) for e in range(8)]
    assert lake.sync(tid, offloaded, leaving=[4], prefix=prefix).remove == (offloaded[4],)
