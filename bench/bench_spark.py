"""Spark scan benchmark: the `pulsarlite` data source reading a topic from the bookies and from
the tier (Parquet), against `spark.read.parquet` of the same tier files in the same session.

    .venv/bin/python bench/bench_spark.py [--messages 500000] [--size 100] [--repeat 3] [--dir D]

Starts a local cluster (ZooKeeper, 3 bookies, 1 broker, E3/Qw3/Qa2) with a ``file://`` tier,
produces --messages of --size bytes with the official client (batched), then, for local[1] and
local[2] (one Spark session each, one after the other):

  bookies   the topic while every segment is on the bookies
  tier      the same topic after every closed segment was offloaded (Parquet in the file tier)
  parquet   spark.read.parquet of those same Parquet files

Each scan runs one aggregate touching every row's value (count, sum of value lengths) and
is timed --repeat times (median). ``--floor`` adds a trivial Python data source yielding the
source's own output batches, pre-built: what Spark alone costs on the Python data source path. Printed: rows/s, MB/s of values, and tier/parquet ratio.
Not a test: figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pulsar  # noqa: E402

from bench.common import work_dir  # noqa: E402
from faces.cluster import LocalCluster  # noqa: E402


def admin(url: str, method: str, path: str, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        text = r.read()
    return json.loads(text) if text.strip() else None


def ledgers_of(cluster, local: str) -> list[dict]:
    from kazoo.client import KazooClient
    zk = KazooClient(hosts=cluster.zookeeper)
    zk.start(timeout=30)
    try:
        return json.loads(zk.get(f"/managed-ledgers/public/default/persistent/{local}")[0])["ledgers"]
    finally:
        zk.stop()
        zk.close()


def produce(service_url: str, topic: str, n: int, size: int) -> None:
    client = pulsar.Client(service_url, operation_timeout_seconds=60)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=1000,
                                      batching_max_publish_delay_ms=10, block_if_queue_full=True,
                                      max_pending_messages=20000)
    payload = os.urandom(size)
    started = time.monotonic()
    for i in range(n):
        producer.send_async(payload, None)
        if i and i % 100_000 == 0:
            print(f"  produced {i:,} ({i / (time.monotonic() - started):,.0f} msg/s)", file=sys.stderr)
    producer.flush()
    producer.close()
    client.close()


def timed(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t = time.monotonic()
        result = fn()
        times.append(time.monotonic() - t)
    return statistics.median(times), result


def session(master: str):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    import spark_source
    s = (SparkSession.builder.master(master).appName("bench-spark").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").config("spark.driver.host", "127.0.0.1")
         .config("spark.sql.python.filterPushdown.enabled", "true").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    spark_source.register(s)
    return s


# the columns the source outputs that the tier files hold too (a full-row scan reads them all)
ROW_COLUMNS = ["key", "value", "partition", "ledger_id", "entry_id", "batch_index", "publish_time",
               "event_time", "properties", "producer_name", "sequence_id"]


def scan(df):
    """Value-only aggregate: count and sum of value lengths."""
    from pyspark.sql import functions as F
    row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("value")).alias("b")).first()
    return row["n"], row["b"]


def full_scan(df):
    """Full-row aggregate: a hash over every shared column of every row."""
    from pyspark.sql import functions as F
    row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("value")).alias("b"),
                 F.sum(F.hash(*[F.to_json(c) if c == "properties" else F.col(c) for c in ROW_COLUMNS])
                       % 1000).alias("h")).first()
    return row["n"], row["b"]


def write_floor_batches(tier_dir: pathlib.Path, topic: str, out_dir: pathlib.Path) -> dict[str, str]:
    """The source's own output batches of every tier object (full schema, and value only),
    decoded once in this process and written as Arrow IPC files for the floor source."""
    import pyarrow as pa

    from offload.format import read_parquet
    from spark_source import scan as S
    from spark_source.plan import Location, Position, SegmentScan

    scans = []
    for f in sorted(tier_dir.rglob("*.parquet")):
        ledger_id = int(f.name.split("-")[1])
        last = read_parquet(str(f), columns=["entry_id"]).column(0)[-1].as_py()
        scans.append(SegmentScan(topic=topic, partition=-1, ledger_id=ledger_id, first_entry_id=0,
                                 last_entry_id=last, location=Location.TIER, uri=f"file://{f}",
                                 start=Position(ledger_id, 0), end=None, publish_time_min_ms=None,
                                 publish_time_max_ms=None, size_bytes_estimate=1))
    settings = S.ReadSettings(zookeeper="", s3_endpoint_url=None, metrics_dir=None)
    paths = {}
    for kind in ("full", "value"):
        path = out_dir / f"floor-{kind}.arrow"
        writer = None
        with pa.OSFile(str(path), "wb") as sink:
            for batch in S.read_scans(tuple(scans), settings):
                if kind == "value":
                    batch = batch.select(["value"])
                if writer is None:
                    writer = pa.ipc.new_file(sink, batch.schema)
                writer.write_batch(batch)
            writer.close()
        paths[kind] = str(path)
    return paths


def register_floor_source(spark) -> None:
    """``pulsarlite_floor``: a Python data source that yields pre-built Arrow batches from a
    memory-mapped IPC file (no decoding, no I/O to speak of): what Spark itself costs to take
    the source's batches through the Python data source path."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from spark_source.plan import OUTPUT_DDL

    class FloorReader(DataSourceReader):
        def __init__(self, path: str, parts: int) -> None:
            self.path, self.parts = path, parts

        def partitions(self):
            return [InputPartition(i) for i in range(self.parts)]

        def read(self, partition):
            import pyarrow as pa
            reader = pa.ipc.open_file(pa.memory_map(self.path))
            n = reader.num_record_batches
            for i in range(partition.value * n // self.parts, (partition.value + 1) * n // self.parts):
                yield reader.get_batch(i)

    class FloorSource(DataSource):
        @classmethod
        def name(cls):
            return "pulsarlite_floor"

        def schema(self):
            return OUTPUT_DDL if self.options["path"].endswith("floor-full.arrow") else "value binary"

        def reader(self, schema):
            return FloorReader(self.options["path"], int(self.options["parts"]))

    spark.dataSource.register(FloorSource)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=500_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rollover-entries", type=int, default=100)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--masters", default="local[1],local[2]", help="comma-separated Spark masters")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object first")
    ap.add_argument("--user-schema", action="store_true",
                    help="also time the tier scan with .schema('value binary') (projection) and an empty "
                         "query (every segment pruned: the fixed per-query cost)")
    ap.add_argument("--floor", action="store_true",
                    help="also time a trivial Python data source yielding the source's own output batches, "
                         "pre-built (full schema, and value only): Spark's own cost of the Python data source "
                         "path, the floor of the tier scan")
    args = ap.parse_args()
    masters = args.masters.split(",")
    with work_dir(args.dir, "bench-spark-") as base:
        tier_dir = base / "tier"
        tier_dir.mkdir(parents=True, exist_ok=True)
        cluster = LocalCluster(base / "cluster")
        results: list[tuple[str, str, float, int, int]] = []
        interleaved: dict[str, dict[str, float]] = {}
        try:
            cluster.start_processes(bookies=3, brokers=1, broker_overrides={
                "managed_ledger.rollover_entries_max": args.rollover_entries, "offload.tier_uri": f"file://{tier_dir}",
                "offload.check_interval_ms": 1000})
            admin(cluster.admin_url, "POST", "/admin/v2/namespaces/public/default/retention",
                  {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
            local = "bench-scan"
            topic = f"persistent://public/default/{local}"
            print(f"producing {args.messages:,} x {args.size} B to {topic}", file=sys.stderr)
            produce(cluster.service_url, topic, args.messages, args.size)
            admin(cluster.admin_url, "PUT", f"/admin/v2/persistent/public/default/{local}/unload")
            time.sleep(1)
            ledgers = ledgers_of(cluster, local)
            closed = [lg for lg in ledgers if lg["state"] == "CLOSED" and lg["entries"] > 0]
            print(f"{len(closed)} closed ledgers, {sum(lg['entries'] for lg in closed):,} entries", file=sys.stderr)

            opts = {"zookeeper": cluster.zookeeper, "admin_url": cluster.admin_url, "topic": topic}

            def source_df(spark, schema=None, **extra):
                r = spark.read.format("pulsarlite").option("minPartitions", spark.sparkContext.defaultParallelism)
                if schema is not None:
                    r = r.schema(schema)
                for k, v in extra.items():
                    r = r.option(k, v)
                for k, v in opts.items():
                    r = r.option(k, v)
                return r.load()

            bookie_times = {}
            for master in masters:
                spark = session(master)
                t, (n, b) = timed(lambda: scan(source_df(spark)), args.repeat)
                bookie_times[master] = (t, n, b)
                print(f"{master} bookies: {t:.2f}s rows={n:,}", file=sys.stderr)
                spark.stop()

            # offload every closed ledger
            last = max(lg["ledger_id"] for lg in ledgers_of(cluster, local))
            admin(cluster.admin_url, "PUT", f"/admin/v2/persistent/public/default/{local}/offload",
                  {"ledgerId": last + 1, "entryId": 0})
            deadline = time.monotonic() + 600
            while True:
                ls = [lg for lg in ledgers_of(cluster, local) if lg["state"] == "CLOSED" and lg["entries"] > 0]
                if all(lg["offload"]["state"] in ("offloaded", "bookie-deleted") for lg in ls):
                    break
                if time.monotonic() > deadline:
                    raise SystemExit("offload did not finish in 600 s")
                time.sleep(1)
            files = sorted(str(p) for p in tier_dir.rglob("*.parquet"))
            print(f"offloaded: {len(files)} Parquet objects, {sum(os.path.getsize(f) for f in files):,} bytes",
                  file=sys.stderr)

            for master in masters:
                spark = session(master)
                t, n, b = bookie_times[master]
                results.append((master, "bookies (pulsarlite source)", t, n, b))
                t, (n, b) = timed(lambda: scan(source_df(spark)), args.repeat)
                results.append((master, "tier (pulsarlite source)", t, n, b))
                t, (n, b) = timed(lambda: scan(spark.read.parquet(*files)), args.repeat)
                results.append((master, "spark.read.parquet, same files", t, n, b))
                floor_df = None
                floor: dict[str, str] = {}
                if args.floor:
                    floor = write_floor_batches(tier_dir, topic, base)
                    register_floor_source(spark)
                    parts = spark.sparkContext.defaultParallelism

                    def floor_df(kind):
                        return (spark.read.format("pulsarlite_floor").option("path", floor[kind])
                                .option("parts", parts).load())

                    for kind, label in (("full", "floor: pre-built batches, full schema"),
                                        ("value", "floor: pre-built batches, value only")):
                        t, (n, b) = timed(lambda: scan(floor_df(kind)), args.repeat)
                        results.append((master, label, t, n, b))
                if args.user_schema:
                    try:
                        t, (n, b) = timed(lambda: scan(source_df(spark, "value binary")), args.repeat)
                        results.append((master, "tier (pulsarlite source), .schema(value binary)", t, n, b))
                    except Exception as e:  # noqa: BLE001 - a source without projection: no figure
                        print(f"{master} .schema(value binary) failed: {str(e)[:300]}", file=sys.stderr)
                    future = str(int(time.time() * 1000) + 86_400_000)
                    t, n = timed(lambda: source_df(spark, startingTime=future).count(), args.repeat)
                    results.append((master, "empty query (every segment pruned)", t, max(n, 1), 0))
                    # the same three value-only scans back to back per round (they share the machine's
                    # load of the moment); median of the per-round ratios to parquet
                    rounds = []
                    for _ in range(args.repeat):
                        row = {}
                        scans = [("parquet", lambda: scan(spark.read.parquet(*files))),
                                 ("tier", lambda: scan(source_df(spark))),
                                 ("tier_schema", lambda: scan(source_df(spark, "value binary")))]
                        if floor_df is not None:
                            scans += [("floor", lambda: scan(floor_df("full"))),
                                      ("floor_value", lambda: scan(floor_df("value")))]
                        for label, fn in scans:
                            try:
                                row[label] = timed(fn, 1)[0]
                            except Exception:  # noqa: BLE001 - a source without projection
                                row[label] = float("nan")
                        rounds.append(row)
                    interleaved[master] = {k: statistics.median(r[k] / r["parquet"] for r in rounds)
                                           for k in rounds[0] if k != "parquet"}
                    print(f"{master} interleaved value-only rounds: {rounds}", file=sys.stderr)
                # the full-row hash, ours and parquet's back to back per round: the medians of each,
                # and the median of the per-round ratios
                pairs = []
                for _ in range(args.repeat):
                    t_tier, (n, b) = timed(lambda: full_scan(source_df(spark)), 1)
                    t_pq, (n_pq, b_pq) = timed(lambda: full_scan(spark.read.parquet(*files)), 1)
                    pairs.append((t_tier, t_pq))
                results.append((master, "tier (pulsarlite source), full-row hash",
                                statistics.median(t for t, _ in pairs), n, b))
                results.append((master, "spark.read.parquet, same files, full-row hash",
                                statistics.median(t for _, t in pairs), n_pq, b_pq))
                interleaved.setdefault(master, {})["full_hash"] = statistics.median(t / q for t, q in pairs)
                spark.stop()
                for path in floor.values():     # ~250 MB per 1M rows: not left behind
                    os.remove(path)
        finally:
            cluster.stop()

        if args.json:
            times = {f"{master} {what}": t for master, what, t, _n, _b in results}
            ratios = {}
            for master in masters:
                for suffix in ("", ", full-row hash"):
                    tier = times.get(f"{master} tier (pulsarlite source){suffix}")
                    pq_t = times.get(f"{master} spark.read.parquet, same files{suffix}")
                    if tier and pq_t:
                        ratios[f"{master}{suffix or ', value only'}"] = tier / pq_t
                narrowed = times.get(f"{master} tier (pulsarlite source), .schema(value binary)")
                pq_t = times.get(f"{master} spark.read.parquet, same files")
                if narrowed and pq_t:
                    ratios[f"{master}, value only, .schema(value binary)"] = narrowed / pq_t
            print(json.dumps({"messages": args.messages, "size": args.size, "repeat": args.repeat,
                              "seconds": times, "tier_over_parquet": ratios,
                              **({"interleaved_over_parquet": interleaved} if interleaved else {})}))
        print(f"\n{args.messages:,} messages of {args.size} B; median of {args.repeat}; "
              f"aggregates: count + sum(length(value)), and + sum(hash(every shared column))\n")
        print("| master | scan | seconds | rows/s | MB/s (values) |")
        print("|---|---|---|---|---|")
        for master, what, t, n, b in results:
            print(f"| {master} | {what} | {t:.2f} | {n / t:,.0f} | {b / t / 1e6:,.1f} |")
        for master in masters:
            for suffix in ("", ", full-row hash"):
                tier = next(r[2] for r in results if r[0] == master and r[1] == "tier (pulsarlite source)" + suffix)
                pq_t = next(r[2] for r in results if r[0] == master and r[1] == "spark.read.parquet, same files" + suffix)
                print(f"\n{master}{suffix or ', value only'}: tier / parquet = {tier / pq_t:.2f}x", end="")
            if "full_hash" in interleaved.get(master, {}):
                print(f"\n{master}, full-row hash, back to back per round (median ratio): tier / parquet = "
                      f"{interleaved[master]['full_hash']:.2f}x", end="")
            if "tier" in interleaved.get(master, {}):
                print(f"\n{master}, value only, interleaved rounds (median ratio): tier / parquet = "
                      f"{interleaved[master]['tier']:.2f}x, tier with .schema(value binary) / parquet = "
                      f"{interleaved[master]['tier_schema']:.2f}x", end="")
                if "floor" in interleaved[master]:
                    print(f"; floor (pre-built batches) / parquet = {interleaved[master]['floor']:.2f}x full schema, "
                          f"{interleaved[master]['floor_value']:.2f}x value only", end="")
        print()


if __name__ == "__main__":
    main()
