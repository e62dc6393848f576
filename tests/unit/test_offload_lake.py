"""[lakehouse] offload/lake.py and the table step of offload/core.py: the pure sync plan, the
machine's CommitToTable step, and a real pyiceberg SQL catalog (SQLite) over real tier objects
written by the offloader's encoder (file:// tier in a temporary directory)."""

from __future__ import annotations

import json
import pathlib
import random

import pytest

from offload.core import (CommitToTable, DeleteFromBookies, Done, LedgerOffload, ObjectStats, ObjectVerified,
                          ObjectWritten, Offload, OffloadRecord, OffloadState, Recorded, RecordOffload,
                          StepFailed, TableCommitted, Tick, VerifyObject, WriteObject)
from offload.lake import (DAY_FIELD, Lake, TableId, default_catalog_uri, plan_table_sync, redacted_uri,
                          snapshots_to_expire, spans_days)
from test_offload_format import make_entries

STATS = ObjectStats(rows=10, size_bytes=100, checksum="0badf00d", min_publish_time_ms=1, max_publish_time_ms=9)


# -- pure ------------------------------------------------------------------------------------------
def test_plan_adds_missing_and_removes_unknown_files():
    plan = plan_table_sync({"a", "x"}, {1: "a", 2: "b", 3: "c"}, leaving=[3])
    assert plan.add == ("b",) and plan.remove == ("x",)
    assert plan_table_sync({"a", "b"}, {1: "a", 2: "b"}).empty
    # every file a trimmed ledger had goes, even with nothing to add
    assert plan_table_sync({"a", "b"}, {1: "a", 2: "b"}, leaving=[1, 2]).remove == ("a", "b")


def test_snapshots_to_expire_never_the_current_one():
    snaps = [(1, 100), (2, 200), (3, 300)]
    assert snapshots_to_expire(snaps, 3, 1000, 750) == (1, 2)
    assert snapshots_to_expire(snaps, 1, 1000, 0) == (2, 3)            # the current one stays, however old
    assert snapshots_to_expire(snaps, 3, 1000, -1) == ()
    assert snapshots_to_expire(snaps, 3, 250, 100) == (1,)


def test_catalog_passwords_are_not_shown():
    assert redacted_uri("postgresql+psycopg2://lake:s3cr:et@db:5432/cat") == "postgresql+psycopg2://lake:***@db:5432/cat"
    assert redacted_uri("sqlite:////tier/_lake/catalog.db") == "sqlite:////tier/_lake/catalog.db"
    assert redacted_uri("postgresql://lake@db/cat") == "postgresql://lake@db/cat"
    lake = Lake("file:///tier", "postgresql://u:pw@db/cat")
    assert "pw" not in json.dumps(lake.describe())


def test_table_id_of_topics_and_partitions():
    assert TableId.of_topic("t", "ns", "orders").identifier == ("t", "ns", "orders")
    assert TableId.of_topic("t", "ns", "orders-partition-3").name == "t.ns.orders"
    assert TableId.of_topic("t", "ns", "orders-partition-x").table == "orders-partition-x"
    assert default_catalog_uri("file:///data/tier/") == "sqlite:////data/tier/_lake/catalog.db"
    with pytest.raises(ValueError, match="lake_catalog_uri"):
        default_catalog_uri("s3://bucket/tier")


def _machine(table: bool) -> LedgerOffload:
    return LedgerOffload(7, OffloadRecord(), tier_uri="file:///tier", tenant="t", namespace="ns", topic="x",
                         deletion_lag_ms=0, table=table)


def _to_offloaded(m: LedgerOffload) -> list:
    (a,) = m.handle(Offload(100, "ab" * 8))
    (a,) = m.handle(Recorded(a.record))
    assert isinstance(a, WriteObject)
    (a,) = m.handle(ObjectWritten(STATS))
    (a,) = m.handle(ObjectVerified())
    assert isinstance(a, RecordOffload) and a.record.state is OffloadState.OFFLOADED
    return m.handle(Recorded(a.record))


def test_machine_commits_to_the_table_after_offloaded_is_recorded():
    m = _machine(table=True)
    (a,) = _to_offloaded(m)
    assert a == CommitToTable(7, m.record.uri) and m.record.state is OffloadState.OFFLOADED
    (a,) = m.handle(TableCommitted())
    assert a == VerifyObject(7, m.record.uri, STATS)         # lag 0: on to the bookie delete
    assert m.handle(ObjectVerified()) == [DeleteFromBookies(7)]
    # without a table: no such step
    (a,) = _to_offloaded(_machine(table=False))
    assert isinstance(a, VerifyObject)


def test_a_failed_commit_leaves_the_ledger_offloaded_for_the_repair():
    m = _machine(table=True)
    (a,) = _to_offloaded(m)
    assert isinstance(a, CommitToTable)
    (a,) = m.handle(StepFailed("catalog down"))
    assert isinstance(a, VerifyObject)                          # the tier copy is complete: goes on
    assert m.record.state is OffloadState.OFFLOADED and m.table_error == "catalog down"
    assert m.last_error is None                                 # not an offload failure


# -- a real catalog ----------------------------------------------------------------------------
V0 = {"type": "record", "name": "Order", "fields": [{"name": "item", "type": "string"},
                                                     {"name": "qty", "type": "int"}]}
V1 = {"type": "record", "name": "Order", "fields": V0["fields"] + [
    {"name": "shop", "type": ["null", "string"], "default": None}]}


def _write_object(tier_dir, ledger_id: int, versions, rows: list[dict], version_of) -> str:
    """A tier object as the offloader writes it: JSON-schema messages with typed columns."""
    from offload.tier import TableTypedColumns
    from offload.reader import encode_ledger
    from pulsarlite.wire.entry import Message, build_entry
    entries = [(i, build_entry(Message(payload=json.dumps(row).encode()), producer_name="p", sequence_id=i,
                               publish_time_ms=1_700_000_000_000 + i, schema_version=version_of(row)))
               for i, row in enumerate(rows)]
    typed = TableTypedColumns([(v, "JSON", json.dumps(s)) for v, s in versions], topic="t", ledger_id=ledger_id)
    encoded = encode_ledger(ledger_id, entries, partition=-1, columns=typed)
    path = tier_dir / "t" / "ns" / "orders" / f"ledger-{ledger_id}-{'ab' * 8}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encoded.data)
    return f"file://{path}"


def test_lake_sync_schema_evolution_retention_and_repair(tmp_path):
    pytest.importorskip("pyiceberg")
    from pyiceberg.table import StaticTable
    tier = tmp_path / "tier"
    tier.mkdir()
    v0 = (0).to_bytes(8, "big")
    v1 = (1).to_bytes(8, "big")
    a = _write_object(tier, 1, [(0, V0)], [{"item": f"a{i}", "qty": i} for i in range(5)], lambda r: v0)
    b = _write_object(tier, 2, [(0, V0), (1, V1)], [{"item": f"b{i}", "qty": i, "shop": "s"} for i in range(4)],
                      lambda r: v1)
    lake = Lake(f"file://{tier}")
    tid = TableId.of_topic("t", "ns", "orders")
    P = f"file://{tier}/t/ns/orders/"
    assert lake.info(tid)["metadata_location"] is None

    # ledger 1 offloaded, its commit lost (a crash): the repair adds it; then ledger 2
    assert lake.sync(tid, {1: a}, prefix=P).add == (a,)
    first = lake.metadata_location(tid)
    assert lake.sync(tid, {1: a}, prefix=P).empty                         # idempotent: no new snapshot
    assert lake.metadata_location(tid) == first
    lake.sync(tid, {1: a, 2: b}, prefix=P)
    info = lake.info(tid)
    assert info["table"] == "t.ns.orders" and info["dataFiles"] == 2
    table = StaticTable.from_metadata(info["metadata_location"])
    schema = table.schema()
    assert str(schema.find_field("qty").field_type) == "int" and str(schema.find_field("item").field_type) == "string"
    shop = schema.find_field("shop")
    assert not shop.required and shop.field_id > schema.find_field("qty").field_id    # added, optional
    rows = table.scan().to_arrow().to_pylist()
    assert sorted(r["item"] for r in rows) == [f"a{i}" for i in range(5)] + [f"b{i}" for i in range(4)]
    assert {r["shop"] for r in rows if r["item"].startswith("a")} == {None}
    assert {r["shop"] for r in rows if r["item"].startswith("b")} == {"s"}
    assert {r["ledger_id"] for r in rows} == {1, 2}
    # zero copy: the table's data files are the tier objects themselves
    assert {t.file.file_path for t in table.scan().plan_files()} == {a, b}

    # retention takes ledger 1 out: a new snapshot without it; the old one still has it
    assert lake.sync(tid, {1: a, 2: b}, leaving=[1], prefix=P).remove == (a,)
    after = StaticTable.from_metadata(lake.metadata_location(tid))
    assert {t.file.file_path for t in after.scan().plan_files()} == {b}
    assert len(after.scan().to_arrow()) == 4
    old = after.scan(snapshot_id=table.current_snapshot().snapshot_id)
    assert len(old.to_arrow()) == 9          # the previous snapshot still has it (a's object exists here)

    # snapshots older than the retention expire (metadata only), never the current one
    expiring = Lake(f"file://{tier}", snapshot_retention_ms=0)
    current = lake.load(tid).current_snapshot()
    assert len(lake.load(tid).metadata.snapshots) >= 3
    expiring.sync(tid, {2: b}, prefix=P, now_ms=current.timestamp_ms + 10_000)
    assert [s.snapshot_id for s in lake.load(tid).metadata.snapshots] == [current.snapshot_id]
    assert lake.table_files(tid) == {b}

    # a file in the table that no offloaded ledger names (back to offloading) goes too
    assert lake.sync(tid, {}, prefix=P).remove == (b,)
    assert lake.info(tid)["dataFiles"] == 0
    assert lake.drop(tid) and lake.info(tid)["metadata_location"] is None


def test_lake_partitions_share_one_table(tmp_path):
    pytest.importorskip("pyiceberg")
    tier = tmp_path / "tier"
    tier.mkdir()
    from offload.reader import encode_ledger
    rng = random.Random(5)
    uris = {}
    for partition, ledger_id in ((0, 10), (1, 11)):
        data = encode_ledger(ledger_id, make_entries(rng, 6, batched=False), partition=partition).data
        path = tier / "t" / "ns" / f"p-partition-{partition}" / f"ledger-{ledger_id}-{'cd' * 8}.parquet"
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        uris[partition] = f"file://{path}"
    lake = Lake(f"file://{tier}")
    tid = TableId.of_topic("t", "ns", "p-partition-0")
    assert tid == TableId.of_topic("t", "ns", "p-partition-1")
    lake.sync(tid, {10: uris[0]}, prefix=f"file://{tier}/t/ns/p-partition-0/")
    lake.sync(tid, {11: uris[1]}, prefix=f"file://{tier}/t/ns/p-partition-1/")
    assert lake.table_files(tid) == set(uris.values())
    # partition 0's sync never touches partition 1's files
    assert lake.sync(tid, {}, prefix=f"file://{tier}/t/ns/p-partition-0/").remove == (uris[0],)
    assert lake.table_files(tid) == {uris[1]}


# -- [lakehouse] day(publish_time) partitions ---------------------------------------------------
DAY_MS = 86_400_000


def test_spans_days_is_utc_days():
    assert not spans_days(0, DAY_MS - 1)
    assert spans_days(DAY_MS - 1, DAY_MS)
    assert not spans_days(5 * DAY_MS, 5 * DAY_MS)


def _object_at(tier_dir, ledger_id: int, publish_times_ms: list[int]) -> str:
    from offload.reader import encode_ledger
    from pulsarlite.wire.entry import Message, build_entry
    entries = [(i, build_entry(Message(payload=f"{ledger_id}-{i}".encode()), producer_name="p", sequence_id=i,
                               publish_time_ms=t)) for i, t in enumerate(publish_times_ms)]
    path = tier_dir / "t" / "ns" / "days" / f"ledger-{ledger_id}-{'ef' * 8}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_ledger(ledger_id, entries, partition=-1).data)
    return f"file://{path}"


def test_day_partitioned_table_falls_back_to_unpartitioned_for_a_file_across_days(tmp_path):
    pytest.importorskip("pyiceberg")
    from pyiceberg.expressions import GreaterThanOrEqual
    tier = tmp_path / "tier"
    tier.mkdir()
    d0 = 20_000 * DAY_MS
    one = _object_at(tier, 1, [d0 + 5, d0 + 6])
    two = _object_at(tier, 2, [d0 + DAY_MS + 1, d0 + DAY_MS + 2, d0 + DAY_MS + 3])
    spanning = _object_at(tier, 3, [d0 + 2 * DAY_MS - 1, d0 + 2 * DAY_MS])
    lake = Lake(f"file://{tier}", partition="day")
    tid = TableId.of_topic("t", "ns", "days")
    P = f"file://{tier}/t/ns/days/"
    lake.sync(tid, {1: one, 2: two}, prefix=P)
    table = lake.load(tid)
    assert [f.name for f in table.spec().fields] == [DAY_FIELD]
    assert sorted(t.file.partition[0] for t in table.scan().plan_files()) == [20_000, 20_001]
    # pyiceberg itself refuses the spanning file under a day spec: the premise of the fallback
    with pytest.raises(ValueError):
        table.add_files([spanning])
    lake.sync(tid, {1: one, 2: two, 3: spanning}, prefix=P)
    table = lake.load(tid)
    assert tuple(table.spec().fields) == ()
    assert lake.table_files(tid) == {one, two, spanning}
    assert len(table.scan().to_arrow()) == 7                           # no row left out
    import datetime as dt
    since = GreaterThanOrEqual("publish_time", dt.datetime.fromtimestamp((d0 + DAY_MS) / 1000, dt.timezone.utc).isoformat())
    assert {t.file.file_path for t in table.scan(row_filter=since).plan_files()} == {two, spanning}


def test_unpartitioned_by_setting(tmp_path):
    pytest.importorskip("pyiceberg")
    tier = tmp_path / "tier"
    tier.mkdir()
    one = _object_at(tier, 1, [7, 8])
    lake = Lake(f"file://{tier}")                                      # the class default: "none"
    tid = TableId.of_topic("t", "ns", "days")
    lake.sync(tid, {1: one}, prefix=f"file://{tier}/t/ns/days/")
    assert tuple(lake.load(tid).spec().fields) == ()
    with pytest.raises(ValueError, match="partition"):
        Lake(f"file://{tier}", partition="hour")


# -- [lakehouse] column metrics ------------------------------------------------------------------
def _bounds(table, uri: str) -> dict[str, tuple]:
    """Column name -> (lower, upper) bound of the data file ``uri`` in the table's manifests."""
    from pyiceberg.conversions import from_bytes
    schema = table.schema()
    [task] = [t for t in table.scan().plan_files() if t.file.file_path == uri]
    lo, hi = task.file.lower_bounds, task.file.upper_bounds
    return {schema.find_column_name(fid): (from_bytes(schema.find_field(fid).field_type, lo[fid]),
                                           from_bytes(schema.find_field(fid).field_type, hi[fid])) for fid in lo}


def test_manifests_carry_bounds_of_the_statistics_columns_and_add_files_warns_not(tmp_path, caplog):
    pytest.importorskip("pyiceberg")
    import logging
    tier = tmp_path / "tier"
    tier.mkdir()
    d0 = 20_000 * DAY_MS
    one = _object_at(tier, 7, [d0 + 5, d0 + 6, d0 + 9])
    lake = Lake(f"file://{tier}")
    caplog.set_level(logging.WARNING, logger="pyiceberg.io.pyarrow")     # whatever Lake() did to it
    tid = TableId.of_topic("t", "ns", "days")
    lake.sync(tid, {7: one}, prefix=f"file://{tier}/t/ns/days/")
    bounds = _bounds(lake.load(tid), one)
    # timestamps are microseconds in Iceberg
    assert bounds == {"ledger_id": (7, 7), "entry_id": (0, 2), "publish_time": ((d0 + 5) * 1000, (d0 + 9) * 1000)}
    assert not [r for r in caplog.records if "statistics missing" in r.getMessage()]


def test_a_table_created_without_metrics_properties_gets_them_at_the_next_commit(tmp_path, caplog):
    pytest.importorskip("pyiceberg")
    import logging
    import pyarrow.parquet as pq
    tier = tmp_path / "tier"
    tier.mkdir()
    one = _object_at(tier, 1, [5, 6])
    two = _object_at(tier, 2, [7, 8])
    lake = Lake(f"file://{tier}")
    tid = TableId.of_topic("t", "ns", "days")
    catalog = lake.catalog()
    catalog.create_namespace_if_not_exists(("t", "ns"))
    old = catalog.create_table(tid.identifier, schema=pq.read_schema(one[len("file://"):]),
                               location=tid.location(lake.warehouse))          # as the earlier code did
    assert "write.metadata.metrics.default" not in old.properties
    caplog.set_level(logging.WARNING, logger="pyiceberg.io.pyarrow")
    lake.sync(tid, {1: one, 2: two}, prefix=f"file://{tier}/t/ns/days/")
    table = lake.load(tid)
    assert table.properties["write.metadata.metrics.default"] == "none"
    assert _bounds(table, two)["entry_id"] == (0, 1)
    assert not [r for r in caplog.records if "statistics missing" in r.getMessage()]


# -- configuration ---------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, match", [
    ({"lake_enabled": True}, "needs a tier"),
    ({"lake_enabled": True, "tier_uri": "s3://bucket/tier"}, "needs lake_catalog_uri"),
    ({"lake_enabled": True, "tier_uri": "file:///tier", "lake_catalog_uri": "catalog.db"}, "SQLAlchemy URI"),
    ({"lake_enabled": "yes", "tier_uri": "file:///tier"}, "must be a bool"),
    ({"lake_snapshot_retention_ms": -2}, "lake_snapshot_retention_ms"),
    ({"lake_partition": "hour"}, "lake_partition"),
])
def test_bad_lake_settings_are_refused(overrides, match):
    from broker.config import BrokerConfig, OffloadConfig
    from pulsarlite.errors import ConfigError
    with pytest.raises(ConfigError, match=match):
        BrokerConfig(offload=OffloadConfig(**overrides)).validate()


def test_good_lake_settings():
    from broker.config import BrokerConfig, OffloadConfig
    BrokerConfig(offload=OffloadConfig(lake_enabled=True, tier_uri="file:///tier")).validate()
    day = BrokerConfig(offload=OffloadConfig(lake_enabled=True, tier_uri="file:///tier"))
    assert day.managed_ledger_config().rollover_publish_period_ms == 86_400_000       # lake_partition "day"
    assert BrokerConfig(offload=OffloadConfig(lake_enabled=True, tier_uri="file:///tier", lake_partition="none")
                        ).managed_ledger_config().rollover_publish_period_ms == 0
    assert BrokerConfig().managed_ledger_config().rollover_publish_period_ms == 0      # no lake: no day rollover
    BrokerConfig(offload=OffloadConfig(lake_enabled=True, tier_uri="s3://bucket/tier",
                                       lake_catalog_uri="sqlite:////x/c.db")).validate()


def test_an_http_catalog_uri_is_the_rest_catalog_client(tmp_path):
    """The client path only (no Iceberg REST catalog server installs here, docs/lakehouse.md):
    an http:// lake_catalog_uri makes pyiceberg's RestCatalog, which asks the server's /v1/config
    and then the table by its REST path; a server that refuses makes the sync a LakeError."""
    pytest.importorskip("pyiceberg")
    import http.server
    import threading

    from offload.lake import LakeError, catalog_kind
    seen: list[tuple[str, str]] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            seen.append((self.command, self.path))
            if self.path.startswith("/v1/config"):
                body, code = b'{"defaults": {}, "overrides": {}}', 200
            else:
                body, code = b'{"error": {"message": "unavailable", "type": "ServiceUnavailable", "code": 503}}', 503
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_HEAD = _answer

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert catalog_kind("https://cat.example/api/catalog") == "rest"
        assert catalog_kind("sqlite:////x/catalog.db") == "sql"
        lake = Lake(f"file://{tmp_path}", f"http://127.0.0.1:{server.server_port}")
        assert lake.describe()["kind"] == "rest"
        with pytest.raises(LakeError, match="table t.ns.orders"):
            lake.sync(TableId.of_topic("t", "ns", "orders"), {1: f"file://{tmp_path}/t/ns/orders/1.parquet"},
                      prefix=f"file://{tmp_path}/t/ns/orders/")
        assert seen[0][0] == "GET" and seen[0][1].startswith("/v1/config")
        assert ("GET", "/v1/namespaces/t%1Fns/tables/orders") in seen           # the table by its REST path
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_the_catalog_is_opened_once_when_threads_ask_at_the_same_time(tmp_path, monkeypatch):
    """The admin endpoint's thread and the offloader's thread asked for the catalog at once; both
    opened a SQL catalog, whose table creation is a check-then-create, and one failed with
    'table iceberg_namespace_properties already exists' (seen in a suite run)."""
    import threading
    import time

    lake = Lake(f"file://{tmp_path}")
    opened = []
    real_open = Lake._open_catalog

    def slow_open(self):
        opened.append(threading.get_ident())
        time.sleep(0.2)                              # wide window for a second opener
        return real_open(self)

    monkeypatch.setattr(Lake, "_open_catalog", slow_open)
    catalogs = []
    threads = [threading.Thread(target=lambda: catalogs.append(lake.catalog())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(opened) == 1 and len(catalogs) == 4 and all(c is catalogs[0] for c in catalogs)


def test_a_catalog_created_by_another_process_meanwhile_is_opened_again(tmp_path, monkeypatch):
    lake = Lake(f"file://{tmp_path}")
    real_open = Lake._open_catalog
    calls = []

    def racing_open(self):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("(sqlite3.OperationalError) table iceberg_tables already exists")
        return real_open(self)

    monkeypatch.setattr(Lake, "_open_catalog", racing_open)
    assert lake.catalog() is not None and len(calls) == 2
    monkeypatch.setattr(Lake, "_open_catalog", lambda self: (_ for _ in ()).throw(RuntimeError("disk I/O error")))
    with pytest.raises(RuntimeError, match="disk I/O"):
        Lake(f"file://{tmp_path}/other").catalog()


def test_old_metadata_files_are_deleted_beyond_the_versions_kept(tmp_path):
    """Iceberg's own clean-up (write.metadata.delete-after-commit.enabled): after many commits
    the table's metadata directory keeps the current file and ``metadata_versions_max`` previous
    ones; the table still reads every file it has."""
    pytest.importorskip("pyiceberg")
    tier = tmp_path / "tier"
    tier.mkdir()
    lake = Lake(f"file://{tier}", metadata_versions_max=2)
    tid = TableId.of_topic("t", "ns", "days")
    prefix = f"file://{tier}/t/ns/days/"
    offloaded = {}
    for ledger_id in range(1, 7):          # one commit per ledger (the create and property set too)
        offloaded[ledger_id] = _object_at(tier, ledger_id, [ledger_id * 10, ledger_id * 10 + 1])
        lake.sync(tid, offloaded, prefix=prefix)
    table = lake.load(tid)
    metadata_dir = pathlib.Path(table.metadata_location[len("file://"):]).parent
    kept = sorted(metadata_dir.glob("*.metadata.json"))
    assert len(kept) == 3, kept            # current + 2 previous (7+ commits made)
    assert table.properties["write.metadata.delete-after-commit.enabled"] == "true"
    assert lake.table_files(tid) == set(offloaded.values())
