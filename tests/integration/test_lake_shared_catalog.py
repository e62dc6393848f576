"""[lakehouse] A catalog shared by several brokers: pyiceberg's SQL catalog on a real PostgreSQL
server (``postgres_server``: Debian's binaries on loopback) with an s3:// tier (moto's server),
two brokers each owning topics of ``public/default``, offloading at the same time (namespace
offload threshold 0: every closed ledger). Then, in the same cluster, the fresh view's read path
for objects offloaded but not committed to the table: PostgreSQL is made to refuse the catalog's
commits (a trigger on pyiceberg's ``iceberg_tables``), the offloads go on, and
``pulsarlite.lake.scan`` still returns every message exactly once (the uncommitted ledgers from
their tier objects); once the catalog accepts again, the owners' repair puts them in the tables.

One cluster start-up for both."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.helpers import wait_for
from tests.integration.test_offload_broker import broker_overrides, http, internal_stats, keep_everything, topic_url

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("pyiceberg")

pytestmark = pytest.mark.integration

TOPICS_PER_BROKER = 2
MESSAGES = 45                      # per topic: 4 closed ledgers of 10 entries (rollover_entries_max) and the open one
REFUSE = """
CREATE FUNCTION refuse_commit() RETURNS trigger AS $$
BEGIN RAISE EXCEPTION 'catalog commits refused by the test'; END $$ LANGUAGE plpgsql;
CREATE TRIGGER refuse_commit BEFORE UPDATE ON iceberg_tables FOR EACH ROW EXECUTE FUNCTION refuse_commit();
"""


def admin_urls(cluster) -> list[str]:
    return [f"http://127.0.0.1:{cluster.records[n].ports['http']}" for n in cluster.broker_names]


def owners(admin_url: str, names) -> dict[str, str]:
    """topic local name -> its owner's admin URL (a lookup assigns the bundle)."""
    out = {}
    for name in names:
        code, got = http("GET", f"{admin_url}/lookup/v2/topic/persistent/public/default/{name}")
        assert code == 200, got
        out[name] = got["httpUrl"].rstrip("/")
    return out


def offloaded(admin_url: str, topic: str) -> dict[int, str]:
    """ledger id -> object URI of the topic's offloaded ledgers."""
    return {i["ledgerId"]: i["offloadUri"] for i in internal_stats(admin_url, topic)["ledgers"]
            if i["offloadState"] in ("offloaded", "bookie-deleted")}


def produce(client, topics: list[str], first: int, n: int) -> None:
    """``n`` messages to each topic, round robin (both brokers write and roll at once);
    value ``<topic>-<i>``."""
    producers = {t: client.create_producer(f"persistent://public/default/{t}", batching_enabled=False)
                 for t in topics}
    for i in range(first, first + n):
        for t, p in producers.items():
            p.send(f"{t}-{i}".encode())
    for p in producers.values():
        p.close()


def test_two_brokers_share_a_postgresql_catalog_and_scan_reads_uncommitted_objects(
        cluster_factory, s3_server, s3_tier_uri, postgres_server):
    from pyiceberg.catalog.sql import SqlCatalog

    from pulsarlite.lake import ScanReport, scan

    database = f"lake_{uuid.uuid4().hex[:8]}"
    postgres_server.create_database(database)
    catalog_uri = postgres_server.uri(database)
    cluster = cluster_factory(3, brokers=2, broker_overrides=broker_overrides(
        s3_tier_uri, s3_server.endpoint_url, lake_enabled=True, lake_catalog_uri=catalog_uri))
    urls = admin_urls(cluster)
    keep_everything(cluster.admin_url)

    # topics of one namespace, owned by both brokers (the least loaded broker gets the next bundle)
    owner = owners(cluster.admin_url, [f"lk-{i}" for i in range(16)])
    mine = {u: [t for t, o in owner.items() if o == u][:TOPICS_PER_BROKER] for u in urls}
    assert all(len(ts) == TOPICS_PER_BROKER for ts in mine.values()), owner
    topics = [t for ts in mine.values() for t in ts]
    code, body = http("PUT", f"{cluster.admin_url}/admin/v2/namespaces/public/default/offloadThreshold", 0)
    assert code == 204, body                          # keep 0 bytes on the bookies: offload every closed ledger

    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    catalog = SqlCatalog("pulsarlite", uri=catalog_uri, warehouse=f"{s3_tier_uri}/_lake",
                         **{"s3.endpoint": s3_server.endpoint_url})
    try:
        produce(client, topics, 0, MESSAGES)

        def in_tables(topic: str, want_ledgers: int):
            got = offloaded(owner[topic], topic)
            if len(got) < want_ledgers:
                return False
            from pyiceberg.exceptions import NoSuchTableError
            try:
                table = catalog.load_table(("public", "default", topic))
            except NoSuchTableError:
                return False
            files = {t.file.file_path for t in table.scan().plan_files()}
            return files == set(got.values()) and (table, got)

        for topic in topics:
            table, got = wait_for(lambda: in_tables(topic, MESSAGES // 10 - 1), 180,
                                  f"{topic}'s offloaded ledgers in its table", interval_s=0.5)
            rows = table.scan(selected_fields=("ledger_id", "entry_id", "value")).to_arrow()
            assert set(rows.column("ledger_id").to_pylist()) == set(got)          # every offloaded ledger
            values = rows.column("value").to_pylist()
            assert len(values) == len(set(values)) == 10 * len(got)
            assert all(v.decode().startswith(f"{topic}-") for v in values)
            # any broker answers the lake endpoint from the shared catalog
            for url in urls:
                code, info = http("GET", topic_url(url, topic) + "/lake")
                assert code == 200, info
                assert info["catalogKind"] == "sql" and info["catalog"] == catalog_uri
                assert info["metadata_location"] == table.metadata_location and info["lastError"] in ("", None)

        # the catalog refuses commits: offloads go on, their objects stay out of the tables
        victim = mine[urls[0]][0]
        before = offloaded(owner[victim], victim)
        postgres_server.execute(database, REFUSE)
        produce(client, [victim], MESSAGES, 30)
        wait_for(lambda: len(offloaded(owner[victim], victim)) >= len(before) + 3, 180,
                 f"{victim}: three more ledgers offloaded", interval_s=0.5)

        def refused():
            code, info = http("GET", topic_url(owner[victim], victim) + "/lake")
            return code == 200 and "refused by the test" in (info["lastError"] or "") and info

        info = wait_for(refused, 60, f"{victim}: the table commit refused", interval_s=0.5)
        table = catalog.load_table(("public", "default", victim))
        committed = {t.file.file_path for t in table.scan().plan_files()}
        now = offloaded(owner[victim], victim)
        assert committed == set(before.values()) and set(now.values()) - committed   # some not in the table

        report = ScanReport()
        got = scan(f"persistent://public/default/{victim}", zookeeper=cluster.zookeeper, admin_url=owner[victim],
                   s3_endpoint_url=s3_server.endpoint_url, columns=["ledger_id", "entry_id", "value"], report=report)
        values = got.column("value").to_pylist()
        assert sorted(values) == sorted(f"{victim}-{i}".encode() for i in range(MESSAGES + 30))   # each once
        assert report.snapshot_files_read == len(before)
        assert report.objects_read == len(set(now) - set(before)) >= 3       # offloaded, not in the table
        assert report.bookie_ledgers_read >= 1                                # the open ledger
        objects = set(now) - set(before)
        assert set(got.filter(pa_in(got, "ledger_id", objects)).column("ledger_id").to_pylist()) == objects

        # the catalog accepts again: the owner's repair commits the missing objects
        postgres_server.execute(database, "DROP TRIGGER refuse_commit ON iceberg_tables")
        table, repaired = wait_for(lambda: in_tables(victim, len(now)), 120, f"{victim}: table repaired",
                                   interval_s=0.5)
        assert set(repaired) >= set(now)
        code, info = http("GET", topic_url(owner[victim], victim) + "/lake")
        assert info["lastError"] in ("", None)
    finally:
        client.close()
        try:
            postgres_server.execute(database, "DROP TRIGGER IF EXISTS refuse_commit ON iceberg_tables")
        except Exception:       # noqa: BLE001 - the server's cleanup is the fixture's
            pass


def pa_in(table, column: str, values) -> object:
    import pyarrow as pa
    import pyarrow.compute as pc
    return pc.is_in(table.column(column), value_set=pa.array(sorted(values), table.schema.field(column).type))

