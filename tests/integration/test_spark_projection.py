"""Column selection by a user-given schema (`spark.read.format("pulsarlite").schema(...)`), against
a real cluster (ZooKeeper, bookies, a broker, moto's S3 as the tier), the official client
producing and real Spark in local mode: the projected columns equal the full read's same
columns, from the bookies and from the tier; bad schemas fail at planning and read nothing."""

from __future__ import annotations

import glob
import json
import os
import uuid
from pathlib import Path

import pytest

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("pyspark")

from tests.integration.helpers import wait_for  # noqa: E402
from tests.integration.test_spark_source import (ROLLOVER_ENTRIES, admin, ledger_list, opened,  # noqa: E402
                                                  produce, tiered_cluster)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(module_tmp_path, s3_server):
    with tiered_cluster(module_tmp_path / "spark-projection", s3_server.tier_uri(),
                        tier_s3_endpoint_url=s3_server.endpoint_url) as c:
        c.s3_endpoint = s3_server.endpoint_url
        yield c


@pytest.fixture(scope="module")
def client(module_client):
    """Module scope: module-scoped fixtures produce with it."""
    return module_client


def reader(spark, cluster, metrics_dir=None, schema=None, stream=False, **options):
    r = (spark.readStream if stream else spark.read).format("pulsarlite")
    if schema is not None:
        r = r.schema(schema)
    r = (r.option("zookeeper", cluster.zookeeper).option("admin_url", cluster.admin_url)
         .option("s3_endpoint_url", cluster.s3_endpoint))
    if metrics_dir is not None:
        r = r.option("metricsDir", str(metrics_dir))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def rows_of(df, columns) -> list[tuple]:
    out = [tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else v for v in r)
           for r in df.select(*columns).collect()]
    return sorted(out, key=repr)


def read_columns(metrics_dir) -> dict[int, list[str]]:
    return {d["ledger_id"]: d["columns"] for d in
            (json.loads(Path(p).read_text()) for p in glob.glob(os.path.join(metrics_dir, "columns-*.json")))}


def offload_before(cluster, local: str, nth_closed: int) -> list[int]:
    """Offload every closed ledger before the nth; wait until they left the bookies."""
    closed = [lg["ledger_id"] for lg in ledger_list(cluster, local) if lg["state"] == "CLOSED" and lg["entries"] > 0]
    assert len(closed) > nth_closed, closed
    admin(cluster.admin_url, "PUT", f"/admin/v2/persistent/public/default/{local}/offload",
          {"ledgerId": closed[nth_closed], "entryId": 0})
    wait_for(lambda: all(lg["offload"]["state"] == "bookie-deleted" for lg in ledger_list(cluster, local)
                         if lg["ledger_id"] in closed[:nth_closed]), 120, "ledgers offloaded and deleted from bookies")
    return closed[:nth_closed]


@pytest.fixture(scope="module")
def tiered_topic(cluster, client):
    """A topic with its first two ledgers on the tier and the rest on the bookies."""
    topic = f"persistent://public/default/proj-{uuid.uuid4().hex[:6]}"
    local = topic.rsplit("/", 1)[1]
    sent = produce(client, topic, 3 * ROLLOVER_ENTRIES + 10)
    sent.update(produce(client, topic, 60, batching=True, tag="b"))
    on_tier = offload_before(cluster, local, 2)
    return topic, sent, on_tier


def test_projection_equals_the_full_reads_columns_on_tier_and_bookies(spark, cluster, tiered_topic, tmp_path):
    topic, sent, on_tier = tiered_topic
    full = reader(spark, cluster, topic=topic)
    assert full.count() == len(sent)
    m = tmp_path / "m"
    given = "publish_time timestamp, value binary, message_id string, properties map<string,string>"
    df = reader(spark, cluster, m, schema=given, topic=topic)
    assert df.columns == ["publish_time", "value", "message_id", "properties"]
    assert rows_of(df, df.columns) == rows_of(full, df.columns)
    where = {o["ledger_id"]: o["location"] for o in opened(m)}
    assert {lid for lid, loc in where.items() if loc == "tier"} == set(on_tier)
    assert "bookies" in where.values()
    # tier objects: only the Parquet columns the given ones are built from
    cols = read_columns(m)
    assert set(cols) == set(on_tier)
    assert all(c == ["ledger_id", "entry_id", "batch_index", "publish_time", "properties", "value"]
               for c in cols.values()), cols

    # value only: what a value aggregate reads
    m2 = tmp_path / "m2"
    only = reader(spark, cluster, m2, schema="value binary", topic=topic)
    assert only.columns == ["value"]
    from pyspark.sql import functions as F
    got = only.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("value")).alias("b")).first()
    assert (got["n"], got["b"]) == (len(sent), sum(len(v) for v in sent.values()))
    assert all(c == ["value"] for c in read_columns(m2).values())

    # constant columns only, and a publish-time filter on a projected column (pushed down)
    assert reader(spark, cluster, schema="topic string", topic=topic).distinct().collect()[0]["topic"] == topic
    cut = sorted(r["publish_time"] for r in full.select("publish_time").collect())[len(sent) // 2]
    filtered = reader(spark, cluster, schema="value binary, publish_time timestamp", topic=topic).where(
        F.col("publish_time") >= F.lit(cut))
    assert rows_of(filtered, ["value"]) == rows_of(full.where(F.col("publish_time") >= F.lit(cut)), ["value"])


@pytest.mark.parametrize("given, words", [
    ("valu binary", ["`valu`", "not a column of the pulsarlite source", "value binary"]),
    ("value string", ["`value`", "type binary", "says string"]),
    ("value binary, ledger_id int", ["`ledger_id`", "type bigint", "says int"]),
])
def test_bad_schema_fails_at_planning_and_reads_nothing(spark, cluster, tiered_topic, tmp_path, given, words):
    topic = tiered_topic[0]
    m = tmp_path / "m"
    with pytest.raises(Exception) as e:
        reader(spark, cluster, m, schema=given, topic=topic).collect()
    text = str(e.value)
    assert "PULSARLITE_SCHEMA_MISMATCH" in text
    for w in words:
        assert w in text, (w, text[:2000])
    assert not opened(m) and not glob.glob(os.path.join(m, "plan-*.json"))


def test_stream_with_a_given_schema(spark, cluster, tiered_topic, tmp_path):
    topic, sent, _ = tiered_topic
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    q = (reader(spark, cluster, schema="message_id string, value binary", stream=True, topic=topic,
                startingOffsets="earliest").writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    try:
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    back = spark.read.parquet(str(out))
    assert back.columns == ["message_id", "value"]
    got = {r["message_id"]: bytes(r["value"]) for r in back.collect()}
    assert got == sent


def test_typed_topic_subset_of_typed_fields(spark, cluster, client, tmp_path):
    """An Avro topic: a given schema with some typed fields (and metadata columns) gives the
    full read's same columns, from the tier's stored typed columns and from decoded bookie
    entries; a typed field with the wrong type is refused."""
    from pulsar.schema import AvroSchema, Double, Integer, Record, String

    class Trade(Record):
        _sorted_fields = True
        sym = String()
        qty = Integer()
        px = Double()

    topic = f"persistent://public/default/trades-{uuid.uuid4().hex[:6]}"
    local = topic.rsplit("/", 1)[1]
    p = client.create_producer(topic, schema=AvroSchema(Trade), batching_enabled=False)
    for i in range(2 * ROLLOVER_ENTRIES + 15):
        p.send(Trade(sym=f"s{i % 7}", qty=i, px=i / 4))
    p.close()
    offload_before(cluster, local, 1)
    full = reader(spark, cluster, topic=topic)
    assert full.columns[-3:] == ["px", "qty", "sym"]
    m = tmp_path / "m"
    df = reader(spark, cluster, m, schema="qty int, message_id string, sym string", topic=topic)
    assert df.columns == ["qty", "message_id", "sym"]
    assert rows_of(df, df.columns) == rows_of(full, df.columns)
    assert len(rows_of(df, df.columns)) == 2 * ROLLOVER_ENTRIES + 15
    assert {o["location"] for o in opened(m)} == {"tier", "bookies"}
    stored = [c for c in read_columns(m).values()]
    assert stored and all("value" not in c and "qty" in c and "px" not in c for c in stored), stored
    with pytest.raises(Exception, match="says bigint"):
        reader(spark, cluster, schema="qty bigint", topic=topic).collect()


def test_planning_closed_segments_connects_no_ledger_client(cluster, client):
    """A plan over closed ledgers needs one ZooKeeper session; the ledger client (bookie watch)
    is connected only for an open ledger's LAC, and not even then when the owner broker (admin_url)
    says where the open ledger ends."""
    import asyncio

    from spark_source.options import parse_options
    from spark_source.source import _load_partitions, _with_metadata
    topic = f"persistent://public/default/closed-{uuid.uuid4().hex[:6]}"
    local = topic.rsplit("/", 1)[1]
    produce(client, topic, ROLLOVER_ENTRIES + 5)
    opts = parse_options({"zookeeper": cluster.zookeeper, "topic": topic}, streaming=False)

    async def run(store, ledger_client):
        parts = await _load_partitions(opts, store, ledger_client)
        return parts, ledger_client._client is not None

    parts, connected = asyncio.run(_with_metadata(opts, run))
    assert connected and any(not lg.closed for lg in parts[0].ledgers)          # open ledger: LAC read
    # with admin_url the owner broker's last confirmed entry ends the open ledger: no bookie read
    with_admin = parse_options({"zookeeper": cluster.zookeeper, "admin_url": cluster.admin_url, "topic": topic},
                               streaming=False)

    async def run_admin(store, ledger_client):
        return await _load_partitions(with_admin, store, ledger_client), ledger_client._client is not None

    parts_admin, connected = asyncio.run(_with_metadata(with_admin, run_admin))
    assert not connected
    assert all(a.last_entry_id >= b.last_entry_id for a, b in zip(parts_admin[0].ledgers, parts[0].ledgers))
    assert sum(lg.last_entry_id + 1 for lg in parts_admin[0].ledgers) == ROLLOVER_ENTRIES + 5
    admin(cluster.admin_url, "PUT", f"/admin/v2/persistent/public/default/{local}/unload")
    wait_for(lambda: all(lg["state"] == "CLOSED" for lg in ledger_list(cluster, local)), 60, "ledgers closed")
    parts, connected = asyncio.run(_with_metadata(opts, run))
    assert not connected
    assert sum(lg.entries for lg in parts[0].ledgers) == ROLLOVER_ENTRIES + 5
    # the broker loads the topic again: a new, empty open ledger, the last entry in an earlier one;
    # with admin_url the broker's answer says so (nothing of the open ledger to read): no bookie read
    got = admin(cluster.admin_url, "GET", f"/admin/v2/persistent/public/default/{local}/lastMessageId")
    assert any(lg["state"] != "CLOSED" and lg["ledger_id"] > got["ledgerId"] for lg in ledger_list(cluster, local))
    parts_admin, connected = asyncio.run(_with_metadata(with_admin, run_admin))
    assert not connected
    assert parts_admin[0].ledgers[-1].last_entry_id == -1 and not parts_admin[0].ledgers[-1].closed
    assert sum(lg.last_entry_id + 1 for lg in parts_admin[0].ledgers) == ROLLOVER_ENTRIES + 5
