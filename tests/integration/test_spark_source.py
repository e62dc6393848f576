"""The `pulsarlite` Spark data source against a real cluster (ZooKeeper, bookies, a broker), the
official client producing, and real Spark in local mode (one session for the module)."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("pyspark")

from faces.cluster import LocalCluster  # noqa: E402
from tests.integration.helpers import wait_for  # noqa: E402

pytestmark = pytest.mark.integration

ROLLOVER_ENTRIES = 40
S3: dict[str, str] = {}


@pytest.fixture(scope="module")
def tier(s3_server):
    S3["endpoint"] = s3_server.endpoint_url
    return s3_server.tier_uri()


@contextlib.contextmanager
def tiered_cluster(path, tier: str, **extra):
    """3 bookies and a broker offloading to ``tier`` (small ledgers of ROLLOVER_ENTRIES, small row
    groups, fast offload passes), infinite retention on public/default; stopped on exit (also
    when the start fails)."""
    c = LocalCluster(path)
    try:
        c.start_processes(bookies=3, brokers=1, broker_overrides={
            "rollover_entries_max": ROLLOVER_ENTRIES, "tier_uri": tier, "offload_row_group_bytes": 2048,
            "offload_check_interval_ms": 500, "offload_deletion_lag_ms": 1, **extra})
        keep_everything(c.admin_url)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def cluster(module_tmp_path, s3_server, tier):
    with tiered_cluster(module_tmp_path / "spark-cluster", tier,
                        tier_s3_endpoint_url=s3_server.endpoint_url) as c:
        yield c


@pytest.fixture(scope="module")
def client(module_client):
    """Module scope: module-scoped fixtures produce with it."""
    return module_client


def admin(admin_url: str, method: str, path: str, body=None):
    import urllib.request
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{admin_url}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        text = r.read()
    return json.loads(text) if text.strip() else None


def keep_everything(admin_url: str, ns: str = "public/default") -> None:
    """Infinite retention: ledgers without subscriptions are kept (Pulsar's default deletes them)."""
    admin(admin_url, "POST", f"/admin/v2/namespaces/{ns}/retention",
          {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})


def produce(client, topic: str, n: int, *, batching: bool = False, tag: str = "m", delay_s: float = 0.0,
            keyed: bool = True, **kw) -> dict[str, bytes]:
    """Send n messages; message id string (as the source renders it) -> value."""
    producer = client.create_producer(topic, batching_enabled=batching, batching_max_messages=7,
                                      batching_max_publish_delay_ms=5, **kw)
    sent: dict[str, bytes] = {}
    pending = []
    for i in range(n):
        value = f"{tag}-{i}-".encode() * (1 + i % 5)
        if batching:
            holder = {}

            def done(res, msg_id, value=value, holder=holder):
                holder["id"] = msg_id
            producer.send_async(value, done, properties={"i": str(i)})
            pending.append((value, holder))
        else:
            key = {"partition_key": f"k{i % 3}"} if keyed else {}
            msg_id = producer.send(value, properties={"i": str(i)}, **key)
            sent[_mid(msg_id)] = value
        if delay_s:
            time.sleep(delay_s)
    if batching:
        producer.flush()
        deadline = time.monotonic() + 30
        while any("id" not in h for _, h in pending) and time.monotonic() < deadline:
            time.sleep(0.05)
        for value, holder in pending:
            sent[_mid(holder["id"])] = value
    producer.close()
    return sent


def _mid(msg_id) -> str:
    return f"{msg_id.ledger_id()}:{msg_id.entry_id()}:{msg_id.partition()}:{msg_id.batch_index()}"


def read(spark, cluster, metrics_dir=None, **options):
    reader = (spark.read.format("pulsarlite").option("zookeeper", cluster.zookeeper)
              .option("admin_url", cluster.admin_url).option("s3_endpoint_url", S3["endpoint"]))
    if metrics_dir is not None:
        reader = reader.option("metricsDir", str(metrics_dir))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def collected(df) -> dict[str, bytes]:
    rows = df.select("message_id", "value").collect()
    out = {r["message_id"]: bytes(r["value"]) for r in rows}
    assert len(out) == len(rows), "duplicate message ids"
    return out


def digest(d: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for k in sorted(d):
        h.update(k.encode() + b"\0" + d[k] + b"\0")
    return h.hexdigest()


def opened(metrics_dir) -> list[dict]:
    return [json.loads(Path(p).read_text()) for p in glob.glob(os.path.join(metrics_dir, "opened-*.json"))]


def ledger_list(cluster, topic_local: str, ns: str = "public/default") -> list[dict]:
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=cluster.zookeeper)
    zk.start(timeout=30)
    try:
        data, _ = zk.get(f"/managed-ledgers/{ns}/persistent/{topic_local}")
        return json.loads(data)["ledgers"]
    finally:
        zk.stop()
        zk.close()


# -- batch reads -------------------------------------------------------------------------------
def test_batch_read_matches_produced(spark, cluster, client, tmp_path):
    topic = f"persistent://public/default/scan-{uuid.uuid4().hex[:6]}"
    sent = produce(client, topic, 150)                          # 150 entries: ~4 ledgers of 40
    sent.update(produce(client, topic, 130, batching=True, tag="b"))
    ledgers = ledger_list(cluster, topic.rsplit("/", 1)[1])
    assert len(ledgers) >= 4, ledgers
    df = read(spark, cluster, tmp_path / "m", topic=topic)
    assert df.columns == ["key", "value", "topic", "partition", "message_id", "ledger_id", "entry_id",
                          "batch_index", "publish_time", "event_time", "properties", "producer_name",
                          "sequence_id"]
    got = collected(df)
    assert read(spark, cluster, topic=topic).count() == len(sent) == 280
    assert set(got) == set(sent)
    assert digest(got) == digest(sent)
    # one segment opened per ledger that has entries (the open one up to its LAC)
    assert len(opened(tmp_path / "m")) == sum(1 for lg in ledgers if lg["state"] == "CLOSED"
                                              and lg["entries"] > 0) + 1
    row = df.where("batch_index = -1").orderBy("ledger_id", "entry_id").first()
    assert row["topic"] == topic and row["partition"] == -1
    assert row["properties"]["i"] == "0" and row["key"] == "k0"
    assert row["publish_time"] is not None and row["producer_name"]


def test_partitioned_topic_and_offsets(spark, cluster, client, tmp_path):
    name = f"part-{uuid.uuid4().hex[:6]}"
    admin(cluster.admin_url, "PUT", f"/admin/v2/persistent/public/default/{name}/partitions", 3)
    topic = f"persistent://public/default/{name}"
    sent = produce(client, topic, 120, keyed=False, message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    assert {k.split(":")[2] for k in sent} == {"0", "1", "2"}
    got = collected(read(spark, cluster, topic=topic))
    assert digest(got) == digest(sent)
    # a comma list of partitions reads just those
    two = collected(read(spark, cluster, topics=f"{topic}-partition-0, {topic}-partition-2"))
    assert digest(two) == digest({k: v for k, v in sent.items() if k.split(":")[2] in ("0", "2")})
    # topicsPattern finds it too
    got = collected(read(spark, cluster, topicsPattern=f"persistent://public/default/{name}.*"))
    assert set(got) == set(sent)
    # startingOffsets / endingOffsets on one partition: [start, end)
    p0 = sorted((k for k in sent if k.split(":")[2] == "0"),
                key=lambda k: tuple(int(x) for x in k.split(":")[:2]))
    start, end = p0[5], p0[25]
    part0 = f"{topic}-partition-0"
    df = read(spark, cluster, topic=part0,
              startingOffsets=json.dumps({part0: start}), endingOffsets=json.dumps({part0: end}))
    assert sorted(collected(df), key=lambda k: tuple(int(x) for x in k.split(":")[:2])) == p0[5:25]


def test_publish_time_pruning(spark, cluster, client, tmp_path):
    topic = f"persistent://public/default/prune-{uuid.uuid4().hex[:6]}"
    first = produce(client, topic, 2 * ROLLOVER_ENTRIES, tag="old")
    time.sleep(1.5)
    boundary_ms = int(time.time() * 1000)
    time.sleep(1.5)
    second = produce(client, topic, 2 * ROLLOVER_ENTRIES + 10, tag="new")
    ledgers = [lg for lg in ledger_list(cluster, topic.rsplit("/", 1)[1]) if lg["entries"] or lg["state"] == "OPEN"]
    old_ledgers = [lg for lg in ledgers if lg["state"] == "CLOSED" and lg["max_publish_time_ms"] < boundary_ms]
    assert len(old_ledgers) == 2, ledgers
    from pyspark.sql import functions as F
    m = tmp_path / "m"
    df = read(spark, cluster, m, topic=topic).where(
        F.col("publish_time") >= F.lit(boundary_ms / 1000).cast("timestamp"))
    got = collected(df)
    assert set(got) == set(second)
    assert {o["ledger_id"] for o in opened(m)}.isdisjoint({lg["ledger_id"] for lg in old_ledgers})
    assert len(opened(m)) == len(ledgers) - 2
    # startingTime option prunes the same way
    m2 = tmp_path / "m2"
    got = collected(read(spark, cluster, m2, topic=topic, startingTime=str(boundary_ms)))
    assert set(got) == set(second) and len(opened(m2)) == len(ledgers) - 2
    # and endingTime keeps only the old ones
    got = collected(read(spark, cluster, tmp_path / "m3", topic=topic, endingTime=str(boundary_ms)))
    assert set(got) == set(first)


def test_register_makes_reads_work_whatever_the_pushdown_setting(spark, cluster, client, tmp_path):
    """Spark refuses a Python reader with pushFilters while spark.sql.python.filterPushdown.enabled
    is false, its default: a session that does not set it (the README's snippet) must still read,
    with pruning; one that set it to false reads without pruning."""
    import spark_source
    from pyspark.sql import functions as F
    conf = "spark.sql.python.filterPushdown.enabled"
    topic = f"persistent://public/default/pushconf-{uuid.uuid4().hex[:6]}"
    produce(client, topic, ROLLOVER_ENTRIES, tag="old")             # fills (and closes) one ledger
    time.sleep(1.5)
    boundary_ms = int(time.time() * 1000)
    time.sleep(1.5)
    second = produce(client, topic, 10, tag="new")
    old_ledgers = [lg["ledger_id"] for lg in ledger_list(cluster, topic.rsplit("/", 1)[1])
                   if lg["state"] == "CLOSED" and lg["entries"] and lg["max_publish_time_ms"] < boundary_ms]
    assert len(old_ledgers) == 1

    def newer(m):
        return read(spark, cluster, m, topic=topic).where(
            F.col("publish_time") >= F.lit(boundary_ms / 1000).cast("timestamp"))

    try:
        spark.conf.unset(conf)
        spark_source.register(spark)
        assert spark.conf.get(conf) == "true"
        got = collected(newer(tmp_path / "unset"))
        assert set(got) == set(second)
        assert old_ledgers[0] not in {o["ledger_id"] for o in opened(tmp_path / "unset")}   # pruned

        spark.conf.set(conf, "false")
        spark_source.register(spark)
        assert spark.conf.get(conf) == "false"                      # the session's choice is kept
        got = collected(newer(tmp_path / "off"))
        assert set(got) == set(second)                              # Spark applies the filter
        assert old_ledgers[0] in {o["ledger_id"] for o in opened(tmp_path / "off")}         # not pruned
    finally:
        spark.conf.set(conf, "true")
        spark_source.register(spark)


def test_bad_options_fail_clearly(spark, cluster):
    with pytest.raises(Exception, match="topic, topics or topicsPattern"):
        read(spark, cluster).collect()
    with pytest.raises(Exception, match="startingOffsets"):
        read(spark, cluster, topic="x", startingOffsets="{not json").collect()


def test_offloaded_segments_read_from_the_tier(spark, cluster, client, tmp_path):
    topic = f"persistent://public/default/tiered-{uuid.uuid4().hex[:6]}"
    local = topic.rsplit("/", 1)[1]
    sent = produce(client, topic, 4 * ROLLOVER_ENTRIES + 10)
    sent.update(produce(client, topic, 60, batching=True, tag="b"))
    ledgers = ledger_list(cluster, local)
    closed = [lg["ledger_id"] for lg in ledgers if lg["state"] == "CLOSED" and lg["entries"] > 0]
    assert len(closed) >= 4, ledgers
    # offload every closed ledger before the third one
    admin(cluster.admin_url, "PUT", f"/admin/v2/persistent/public/default/{local}/offload",
          {"ledgerId": closed[2], "entryId": 0})
    wait_for(lambda: all(lg["offload"]["state"] == "bookie-deleted" for lg in ledger_list(cluster, local)
                         if lg["ledger_id"] in closed[:2]), 120, "two ledgers offloaded and deleted from the bookies")
    m = tmp_path / "m"
    got = collected(read(spark, cluster, m, topic=topic))
    assert digest(got) == digest(sent)
    where = {o["ledger_id"]: o["location"] for o in opened(m)}
    assert {lid for lid, loc in where.items() if loc == "tier"} == set(closed[:2])
    assert all(where[lid] == "bookies" for lid in closed[2:])
    # publish-time pruning works on tier segments too: a bound after every message reads nothing
    m2 = tmp_path / "m2"
    assert read(spark, cluster, m2, topic=topic, startingTime=str(int(time.time() * 1000) + 60_000)).count() == 0
    assert not [o for o in opened(m2) if o["location"] == "tier"]


def first_replica(cluster, ledger_id: int) -> str:
    from kazoo.client import KazooClient

    from bookie.client.metadata import LedgerMetadata
    from pulsarlite.metadata_layout import ledger_path
    zk = KazooClient(hosts=cluster.zookeeper)
    zk.start(timeout=30)
    try:
        md = LedgerMetadata.from_json(zk.get(ledger_path(ledger_id))[0])
        return md.ensembles[0][1][0]
    finally:
        zk.stop()
        zk.close()


def test_bookie_killed_mid_scan(spark, cluster, client, tmp_path):
    """kill -9 of the bookie the scan reads first from, during the scan (as soon as a segment was
    opened) and then with it still down: both scans fail over and return everything."""
    topic = f"persistent://public/default/kill-{uuid.uuid4().hex[:6]}"
    local = topic.rsplit("/", 1)[1]
    sent = produce(client, topic, 6 * ROLLOVER_ENTRIES + 5)
    ledgers = [lg["ledger_id"] for lg in ledger_list(cluster, local)]
    victim_id = first_replica(cluster, ledgers[0])
    victim = next(n for n in cluster.bookie_names if cluster.records[n].bookie_id == victim_id)
    m = tmp_path / "m"
    killed = threading.Event()

    def killer():
        wait_for(lambda: opened(m) if m.exists() else None, 120, "a segment opened", interval_s=0.01)
        cluster.kill(victim)
        killed.set()

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        got = collected(read(spark, cluster, m, topic=topic))
        t.join(timeout=130)
        assert killed.is_set()
        assert digest(got) == digest(sent)
        # with the bookie still down: every ledger whose first replica it is fails over
        got = collected(read(spark, cluster, topic=topic))
        assert digest(got) == digest(sent)
    finally:
        t.join(timeout=130)
        cluster.restart(victim)


# -- streaming -----------------------------------------------------------------------------------
def run_available_now(spark, cluster, topic: str, out: Path, checkpoint: Path, **options) -> list:
    reader = (spark.readStream.format("pulsarlite").option("zookeeper", cluster.zookeeper)
              .option("admin_url", cluster.admin_url).option("topic", topic))
    for k, v in options.items():
        reader = reader.option(k, v)
    q = (reader.load().select("message_id", "value", "topic").writeStream.format("parquet")
         .option("path", str(out)).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    try:
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
        return [p for p in q.recentProgress if p["numInputRows"] > 0]
    finally:
        q.stop()


def stream_output(spark, out: Path) -> dict[str, bytes]:
    if not list(out.glob("*.parquet")):
        return {}
    return collected(spark.read.parquet(str(out)))


def test_stream_exactly_once_across_restart(spark, cluster, client, tmp_path):
    name = f"stream-{uuid.uuid4().hex[:6]}"
    admin(cluster.admin_url, "PUT", f"/admin/v2/persistent/public/default/{name}/partitions", 2)
    topic = f"persistent://public/default/{name}"
    sent = produce(client, topic, 90, keyed=False,
                   message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    progress = run_available_now(spark, cluster, topic, out, ckpt, startingOffsets="earliest",
                                 maxEntriesPerTrigger="20")
    assert digest(stream_output(spark, out)) == digest(sent)
    assert len(progress) >= 4, [p["numInputRows"] for p in progress]   # admission control: <= 20 entries each
    assert all(p["numInputRows"] <= 20 for p in progress)
    # more messages (new ledgers too) and a partition added; the restarted query reads only those
    more = produce(client, topic, 2 * ROLLOVER_ENTRIES + 30, batching=True, tag="late", keyed=False,
                   message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    admin(cluster.admin_url, "POST", f"/admin/v2/persistent/public/default/{name}/partitions", 3)
    # produced to the partition directly: the client's ids say partition -1, the source says 2
    direct = produce(client, f"{topic}-partition-2", 15, tag="new-partition")
    more.update({k.replace(":-1:", ":2:", 1): v for k, v in direct.items()})
    run_available_now(spark, cluster, topic, out, ckpt, startingOffsets="earliest")
    got = stream_output(spark, out)
    want = {**sent, **more}
    assert (sorted(set(want) - set(got))[:10], sorted(set(got) - set(want))[:10]) == ([], [])
    assert digest(got) == digest(want)
    # nothing new: another run adds nothing
    run_available_now(spark, cluster, topic, out, ckpt)
    assert len(stream_output(spark, out)) == len(got)


# -- writes ----------------------------------------------------------------------------------------
def test_batch_write_round_trip(spark, cluster, client, tmp_path):
    from datetime import datetime, timezone

    from pyspark.sql.types import BinaryType, MapType, StringType, StructField, StructType, TimestampType
    topic = f"persistent://public/default/written-{uuid.uuid4().hex[:6]}"
    schema = StructType([StructField("key", StringType()), StructField("value", BinaryType()),
                         StructField("properties", MapType(StringType(), StringType())),
                         StructField("event_time", TimestampType())])
    t0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    rows = [(f"k{i % 4}" if i % 5 else None, f"row-{i}".encode() * (1 + i % 3), {"n": str(i)},
             t0 if i % 2 else None) for i in range(300)]
    df = spark.createDataFrame(rows, schema).repartition(3)
    df.write.format("pulsarlite").option("service_url", cluster.service_url).option("topic", topic).mode(
        "append").save()
    back = read(spark, cluster, topic=topic).select("key", "value", "properties", "event_time").collect()
    assert len(back) == len(rows)
    by_n = {int(r["properties"]["n"]): r for r in back}
    assert sorted(by_n) == list(range(300))
    for i, (key, value, _, et) in enumerate(rows):
        r = by_n[i]
        assert bytes(r["value"]) == value and r["key"] == key
        assert (r["event_time"] is None) == (et is None)
        if et is not None:
            assert r["event_time"].replace(tzinfo=None) == spark_local(et)


def spark_local(dt):
    """A UTC datetime as Spark's collect() renders it (session-local naive time)."""
    return dt.astimezone().replace(tzinfo=None)


def test_bad_write_options_fail_clearly(spark, cluster):
    df = spark.createDataFrame([(b"x", 1)], "value binary, other int")
    with pytest.raises(Exception, match="cannot be written"):
        df.write.format("pulsarlite").option("service_url", cluster.service_url).option("topic", "t").mode(
            "append").save()


def test_stream_sink_pipeline(spark, cluster, client, tmp_path):
    """readStream from one topic, writeStream into another (AvailableNow, checkpointed)."""
    src = f"persistent://public/default/pipe-in-{uuid.uuid4().hex[:6]}"
    dst = f"persistent://public/default/pipe-out-{uuid.uuid4().hex[:6]}"
    sent = produce(client, src, 70, batching=True)
    q = (spark.readStream.format("pulsarlite").option("zookeeper", cluster.zookeeper)
         .option("admin_url", cluster.admin_url).option("topic", src).option("startingOffsets", "earliest")
         .load().selectExpr("value", "message_id AS key")
         .writeStream.format("pulsarlite").option("service_url", cluster.service_url).option("topic", dst)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    try:
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    back = read(spark, cluster, topic=dst).select("key", "value").collect()
    assert {r["key"]: bytes(r["value"]) for r in back} == sent
    assert len(back) == len(sent)


def test_retried_write_task_is_deduplicated(spark, cluster, client):
    """A batch-write task sent twice under its stable producer name and sequence ids (what a
    Spark task retry does) lands once in a namespace with deduplication; a different producer
    name (another write) lands again."""
    import pyarrow as pa

    from spark_source.writer import WriteOptions, send_batches
    admin(cluster.admin_url, "PUT", "/admin/v2/namespaces/public/dedup-spark", {})
    keep_everything(cluster.admin_url, "public/dedup-spark")
    admin(cluster.admin_url, "POST", "/admin/v2/namespaces/public/dedup-spark/deduplication", True)
    topic = f"persistent://public/dedup-spark/w-{uuid.uuid4().hex[:6]}"
    opts = WriteOptions(cluster.service_url, topic, True, 30_000, None)

    def rows():
        return iter([pa.RecordBatch.from_pydict({"value": [f"v{i}".encode() for i in range(50)]})])
    send_batches(opts, rows(), producer_name="spark-w1-0")
    send_batches(opts, rows(), producer_name="spark-w1-0")      # the retry
    assert read(spark, cluster, topic=topic).count() == 50
    send_batches(opts, rows(), producer_name="spark-w2-0")      # another write
    assert read(spark, cluster, topic=topic).count() == 100


# -- [schema]: typed value columns and topics as tables ---------------------------------------------
def test_typed_columns_from_the_topic_schema_on_bookies_and_tier(spark, cluster, client, tmp_path):
    """An Avro topic written under two schema versions (the second adds a field with a default):
    the record's fields are columns, the same for offloaded and bookie segments; rows of the first
    version have null for the new field; valueSchema=raw gives the metadata columns only."""
    from pulsar.schema import AvroSchema, Integer, Record, String

    class Sale(Record):
        _sorted_fields = True
        item = String()
        qty = Integer()

    class SaleV2(Record):
        _sorted_fields = True
        item = String()
        qty = Integer()
        shop = String(required_default=True)

    SaleV2.__name__ = "Sale"            # one record type, two versions
    topic = f"persistent://public/default/sales-{uuid.uuid4().hex[:6]}"
    local = topic.rsplit("/", 1)[1]
    p1 = client.create_producer(topic, schema=AvroSchema(Sale), batching_enabled=False)
    for i in range(2 * ROLLOVER_ENTRIES):
        p1.send(Sale(item=f"i{i}", qty=i))
    p1.close()
    p2 = client.create_producer(topic, schema=AvroSchema(SaleV2), batching_enabled=True,
                                batching_max_messages=7, batching_max_publish_delay_ms=5)
    for i in range(30):
        p2.send_async(SaleV2(item=f"j{i}", qty=1000 + i, shop="north"), None)
    p2.flush()
    p2.close()
    closed = [lg["ledger_id"] for lg in ledger_list(cluster, local) if lg["state"] == "CLOSED" and lg["entries"] > 0]
    admin(cluster.admin_url, "PUT", f"/admin/v2/persistent/public/default/{local}/offload",
          {"ledgerId": closed[1], "entryId": 0})
    wait_for(lambda: ledger_list(cluster, local)[0]["offload"]["state"] == "bookie-deleted", 120,
             "the first ledger offloaded and deleted from the bookies")

    m = tmp_path / "m"
    df = read(spark, cluster, m, topic=topic)
    assert [f.name for f in df.schema.fields][-3:] == ["item", "qty", "shop"]
    rows = {r["item"]: (r["qty"], r["shop"]) for r in df.select("item", "qty", "shop").collect()}
    assert len(rows) == 2 * ROLLOVER_ENTRIES + 30
    assert rows["i0"] == (0, None) and rows[f"i{2 * ROLLOVER_ENTRIES - 1}"] == (2 * ROLLOVER_ENTRIES - 1, None)
    assert rows["j29"] == (1029, "north")
    assert "tier" in {o["location"] for o in opened(m)}
    assert df.where("qty >= 1000").count() == 30
    raw = read(spark, cluster, topic=topic, valueSchema="raw")
    assert [f.name for f in raw.schema.fields][-1] == "sequence_id"
    with pytest.raises(Exception, match="valueSchema"):
        read(spark, cluster, topic=topic, valueSchema="fancy").count()

    # topics as tables: every topic of the namespace is a view
    import spark_source
    views = spark_source.register_namespace(spark, "public/default", zookeeper=cluster.zookeeper,
                                            admin_url=cluster.admin_url, s3_endpoint_url=S3["endpoint"])
    view = local.replace("-", "_")
    assert views[view] == topic
    got = spark.sql(f"SELECT count(*) AS n, sum(qty) AS q FROM {view} WHERE shop = 'north'").collect()[0]
    assert got["n"] == 30 and got["q"] == sum(1000 + i for i in range(30))
