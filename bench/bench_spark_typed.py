"""Typed tier scan benchmark ([schema]): the `pulsarlite` Spark source reading an Avro topic's
typed columns from offloaded segments, decoding ``value`` (what the source did before the
offloader wrote typed columns) vs taking the columns stored in the Parquet objects.

    .venv/bin/python bench/bench_spark_typed.py [--messages 200000] [--repeat 3] [--dir D]

For each of two clusters (ZooKeeper, 3 bookies, 1 broker, ``file://`` tier), one with the broker's
``offload_typed_columns`` off and one with it on: produce --messages Avro records (official
client, AvroSchema: strings, int, double, timestamp-millis, array, map, nested record) under
one schema version, scan them from the bookies, offload every closed ledger (timed), then scan
from the tier. Spark local[2]; each scan is an aggregate over every typed column, timed
--repeat times (median). Not a test: figures only.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pulsar  # noqa: E402
from pulsar.schema import Array, AvroSchema, Double, Integer, Long, Map, Record, String  # noqa: E402

from bench.common import work_dir  # noqa: E402
from faces.cluster import LocalCluster  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from bench_spark import admin, ledgers_of, timed  # noqa: E402  (the untyped scan benchmark's helpers)


class TimestampMillis(Long):
    def schema_info(self, defined_names):
        return {"type": "long", "logicalType": "timestamp-millis"}

    def schema(self):
        return self.schema_info(set())


class Ship(Record):
    city = String()
    zip = Integer()


class Sale(Record):
    item = String(required=True)
    qty = Integer(required=True)
    price = Double(required=True)
    at = TimestampMillis(required=True)
    tags = Array(String())
    attrs = Map(Long())
    ship = Ship()


def produce(service_url: str, topic: str, n: int) -> None:
    client = pulsar.Client(service_url, operation_timeout_seconds=60)
    producer = client.create_producer(topic, schema=AvroSchema(Sale), batching_enabled=True,
                                      batching_max_messages=1000, batching_max_publish_delay_ms=10,
                                      block_if_queue_full=True, max_pending_messages=20000)
    started = time.monotonic()
    for i in range(n):
        producer.send_async(Sale(item=f"item-{i % 977}", qty=i % 100, price=i * 0.25, at=1_700_000_000_000 + i,
                                 tags=["a", "b", str(i % 7)], attrs={"n": i, "m": i % 13},
                                 ship=Ship(city=f"c{i % 31}", zip=i % 99_999) if i % 2 else None), None)
        if i and i % 50_000 == 0:
            print(f"  produced {i:,} ({i / (time.monotonic() - started):,.0f} msg/s)", file=sys.stderr)
    producer.flush()
    producer.close()
    client.close()


def session():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    import spark_source
    s = (SparkSession.builder.master("local[2]").appName("bench-spark-typed").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").config("spark.driver.host", "127.0.0.1")
         .config("spark.sql.python.filterPushdown.enabled", "true").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    spark_source.register(s)
    return s


def typed_scan(df):
    """An aggregate over every typed column."""
    from pyspark.sql import functions as F
    row = df.agg(F.count(F.lit(1)).alias("n"), F.sum("qty").alias("q"), F.sum("price").alias("p"),
                 F.max("at").alias("at"), F.sum(F.size("tags")).alias("t"), F.sum(F.size("attrs")).alias("a"),
                 F.count("ship.city").alias("s"), F.countDistinct("item").alias("i")).first()
    return row.asDict()


def run(base: pathlib.Path, typed_on: bool, args, spark) -> dict:
    tier_dir = base / "tier"
    tier_dir.mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster(base / "cluster")
    out: dict = {}
    try:
        cluster.start_processes(bookies=3, brokers=1, broker_overrides={
            "managed_ledger.rollover_entries_max": args.rollover_entries, "offload.tier_uri": f"file://{tier_dir}",
            "offload.check_interval_ms": 1000, "offload.typed_columns": typed_on})
        admin(cluster.admin_url, "POST", "/admin/v2/namespaces/public/default/retention",
              {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
        local = "bench-typed"
        topic = f"persistent://public/default/{local}"
        print(f"[typed columns {'on' if typed_on else 'off'}] producing {args.messages:,} Avro records",
              file=sys.stderr)
        produce(cluster.service_url, topic, args.messages)
        admin(cluster.admin_url, "PUT", f"/admin/v2/persistent/public/default/{local}/unload")
        time.sleep(1)

        def source_df():
            return (spark.read.format("pulsarlite").option("minPartitions", 2)
                    .option("zookeeper", cluster.zookeeper).option("admin_url", cluster.admin_url)
                    .option("topic", topic).load())

        out["bookies_s"], out["bookies"] = timed(lambda: typed_scan(source_df()), args.repeat)
        last = max(lg["ledger_id"] for lg in ledgers_of(cluster, local))
        started = time.monotonic()
        admin(cluster.admin_url, "PUT", f"/admin/v2/persistent/public/default/{local}/offload",
              {"ledgerId": last + 1, "entryId": 0})
        while True:
            ls = [lg for lg in ledgers_of(cluster, local) if lg["state"] == "CLOSED" and lg["entries"] > 0]
            if all(lg["offload"]["state"] in ("offloaded", "bookie-deleted") for lg in ls):
                break
            if time.monotonic() - started > 900:
                raise SystemExit("offload did not finish in 900 s")
            time.sleep(0.5)
        out["offload_s"] = time.monotonic() - started
        files = sorted(tier_dir.rglob("*.parquet"))
        out["objects"] = len(files)
        out["object_bytes"] = sum(os.path.getsize(f) for f in files)
        out["tier_s"], out["tier"] = timed(lambda: typed_scan(source_df()), args.repeat)
        assert out["tier"] == out["bookies"], (out["tier"], out["bookies"])
        print(f"  {out}", file=sys.stderr)
    finally:
        cluster.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rollover-entries", type=int, default=50)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    with work_dir(args.dir, "bench-spark-typed-") as base:
        spark = session()
        try:
            off = run(base / "off", False, args, spark)
            on = run(base / "on", True, args, spark)
        finally:
            spark.stop()
        n = args.messages
        print(f"\n{n:,} Avro records (7 fields: string, int, double, timestamp-millis, array, map, nested record); "
              f"Spark local[2]; median of {args.repeat}\n")
        print("| offloaded objects | offload (s) | object bytes | bookie scan (s) | tier scan (s) | tier rows/s |")
        print("|---|---|---|---|---|---|")
        for what, r in (("raw (typed columns decoded from value at scan time)", off),
                        ("with typed columns (read from Parquet)", on)):
            print(f"| {what} | {r['offload_s']:.1f} | {r['object_bytes']:,} | {r['bookies_s']:.2f} | {r['tier_s']:.2f} "
                  f"| {n / r['tier_s']:,.0f} |")
        print(f"\ntier scan: decoded / stored = {off['tier_s'] / on['tier_s']:.2f}x")


if __name__ == "__main__":
    main()
