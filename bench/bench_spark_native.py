"""``spark_source.read_topic`` (offloaded segments through Spark's own Parquet reader) against
``spark.read.parquet`` over the same tier objects, and a half-tier/half-bookies topic against
the ``pulsarlite`` format.

    .venv/bin/python bench/bench_spark_native.py [--messages 1000000] [--size 100] [--ledgers 4]
        [--rounds 5] [--master local[2]] [--json]

Starts a local cluster (ZooKeeper, 3 bookies, 1 broker) with a ``file://`` tier, produces
--messages of --size bytes (official client, batched) in --ledgers ledgers (the topic is
unloaded between parts: each unload closes a ledger), offloads them all, then in one Spark
session, per round, alternating the two sides of each pair:

  (a) count + sum(length(value))          full schema
  (b) max(publish_time)                    one column
  (c) count + hash of every shared column  (the columns the objects hold too)

read_topic's time includes its planning (the call itself); parquet's includes
``spark.read.parquet(*files)``. Printed: the median of the per-round ratios read_topic /
parquet, per query. Then a second topic, half offloaded, half on bookies: read_topic vs
``spark.read.format("pulsarlite")`` for (a). Not a test: figures only (noisy on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_spark import ROW_COLUMNS, admin, ledgers_of, produce, session  # noqa: E402
from bench.common import work_dir  # noqa: E402
from faces.cluster import LocalCluster  # noqa: E402


def q_count(df):
    from pyspark.sql import functions as F
    r = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("value")).alias("b")).first()
    return r["n"], r["b"]


def q_max_time(df):
    from pyspark.sql import functions as F
    return df.agg(F.max("publish_time").alias("t")).first()["t"]


def q_hash(df):
    from pyspark.sql import functions as F
    cols = [F.to_json(c) if c == "properties" else F.col(c) for c in ROW_COLUMNS]
    r = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.hash(*cols) % 1000).alias("h")).first()
    return r["n"], r["h"]


QUERIES = {"a_count_sum_length": q_count, "b_max_publish_time": q_max_time, "c_hash_every_column": q_hash}


def produce_in_ledgers(cluster, local: str, messages: int, size: int, ledgers: int) -> None:
    topic = f"persistent://public/default/{local}"
    per = messages // ledgers
    for i in range(ledgers):
        produce(cluster.service_url, topic, per if i < ledgers - 1 else messages - per * (ledgers - 1), size)
        admin(cluster.admin_url, "PUT", f"/admin/v2/persistent/public/default/{local}/unload")
        time.sleep(0.5)


def offload_all(cluster, local: str, keep_last: int = 0) -> list[dict]:
    closed = [lg for lg in ledgers_of(cluster, local) if lg["state"] == "CLOSED" and lg["entries"] > 0]
    target = closed[len(closed) - keep_last] if keep_last else {"ledger_id": max(
        lg["ledger_id"] for lg in ledgers_of(cluster, local)) + 1}
    want = closed[:len(closed) - keep_last]
    admin(cluster.admin_url, "PUT", f"/admin/v2/persistent/public/default/{local}/offload",
          {"ledgerId": target["ledger_id"], "entryId": 0})
    deadline = time.monotonic() + 900
    ids = {lg["ledger_id"] for lg in want}
    while True:
        now = [lg for lg in ledgers_of(cluster, local) if lg["ledger_id"] in ids]
        if all(lg["offload"]["state"] in ("offloaded", "bookie-deleted") for lg in now):
            return now
        if time.monotonic() > deadline:
            raise SystemExit("offload did not finish in 900 s")
        time.sleep(1)


def load_average() -> str:
    """The 1-minute load average (the machine is shared: figures are read with it)."""
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


def timed(fn) -> tuple[float, object]:
    t = time.monotonic()
    r = fn()
    return time.monotonic() - t, r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--ledgers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6, help="even: each side goes first in half the rounds")
    ap.add_argument("--half-messages", type=int, default=200_000, help="messages of the half-tier topic")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import spark_source
    with work_dir(args.dir, "bench-spark-native-") as base:
        tier_dir = base / "tier"
        tier_dir.mkdir(parents=True, exist_ok=True)
        cluster = LocalCluster(base / "cluster")
        out: dict = {"messages": args.messages, "size": args.size, "ledgers": args.ledgers, "master": args.master,
                     "rounds": args.rounds}
        spark = None
        try:
            cluster.start_processes(bookies=3, brokers=1, broker_overrides={
                "managed_ledger.rollover_entries_max": 1_000_000, "offload.tier_uri": tier_dir.as_uri(),
                "offload.check_interval_ms": 1000})
            admin(cluster.admin_url, "POST", "/admin/v2/namespaces/public/default/retention",
                  {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
            local, half = "bench-native", "bench-half"
            topic, half_topic = (f"persistent://public/default/{n}" for n in (local, half))
            print(f"producing {args.messages:,} x {args.size} B in {args.ledgers} ledgers", file=sys.stderr)
            produce_in_ledgers(cluster, local, args.messages, args.size, args.ledgers)
            done = offload_all(cluster, local)
            files = sorted(str(p) for p in tier_dir.rglob("*.parquet"))
            print(f"offloaded {len(done)} ledgers: {len(files)} objects, "
                  f"{sum(os.path.getsize(f) for f in files):,} bytes", file=sys.stderr)
            produce_in_ledgers(cluster, half, args.half_messages, args.size, 4)
            offload_all(cluster, half, keep_last=2)
            half_files = {str(p) for p in tier_dir.rglob("*.parquet")} - set(files)
            print(f"half topic: {len(half_files)} objects on the tier, 2 ledgers on the bookies", file=sys.stderr)

            spark = session(args.master)
            opts = {"zookeeper": cluster.zookeeper, "admin_url": cluster.admin_url}
            uris = [pathlib.Path(f).as_uri() for f in files]
            ratios: dict[str, list[float]] = {q: [] for q in QUERIES}
            seconds: dict[str, list[float]] = {f"{q} {s}": [] for q in QUERIES for s in ("read_topic", "parquet")}
            for q, fn in QUERIES.items():          # warm-up, and both sides must agree
                a = fn(spark_source.read_topic(spark, topic, **opts))
                b = fn(spark.read.parquet(*uris))
                if a != b:
                    raise SystemExit(f"{q}: read_topic gave {a}, parquet {b}")
            for r in range(args.rounds):
                for q, fn in QUERIES.items():
                    sides = [("read_topic", lambda: fn(spark_source.read_topic(spark, topic, **opts))),
                             ("parquet", lambda: fn(spark.read.parquet(*uris)))]
                    if r % 2:
                        sides.reverse()
                    t = {}
                    for name, run in sides:
                        t[name], _ = timed(run)
                        seconds[f"{q} {name}"].append(t[name])
                    ratios[q].append(t["read_topic"] / t["parquet"])
                print(f"round {r + 1}: " + ", ".join(f"{q} {ratios[q][-1]:.2f}x" for q in QUERIES)
                      + f" load {load_average()}", file=sys.stderr)
            out["read_topic_over_parquet_median"] = {q: statistics.median(v) for q, v in ratios.items()}
            out["per_round"] = ratios
            out["seconds_median"] = {k: statistics.median(v) for k, v in seconds.items()}

            fmt_df = lambda: (spark.read.format("pulsarlite").option("zookeeper", cluster.zookeeper)  # noqa: E731
                              .option("admin_url", cluster.admin_url).option("topic", half_topic).load())
            if q_count(spark_source.read_topic(spark, half_topic, **opts)) != q_count(fmt_df()):
                raise SystemExit("half topic: read_topic and the format disagree")
            half_ratios, half_s = [], {"read_topic": [], "format": []}
            for r in range(args.rounds):
                sides = [("read_topic", lambda: q_count(spark_source.read_topic(spark, half_topic, **opts))),
                         ("format", lambda: q_count(fmt_df()))]
                if r % 2:
                    sides.reverse()
                t = {}
                for name, run in sides:
                    t[name], _ = timed(run)
                    half_s[name].append(t[name])
                half_ratios.append(t["read_topic"] / t["format"])
                print(f"half round {r + 1}: read_topic / format {half_ratios[-1]:.2f}x "
                      f"({t['read_topic']:.2f}s vs {t['format']:.2f}s) load {load_average()}", file=sys.stderr)
            out["half_topic"] = {"messages": args.half_messages, "read_topic_over_format_median": statistics.median(
                half_ratios), "per_round": half_ratios,
                "seconds_median": {k: statistics.median(v) for k, v in half_s.items()}}
        finally:
            if spark is not None:
                spark.stop()
            cluster.stop()
        if args.json:
            print(json.dumps(out))
        print(f"\n{args.messages:,} msgs x {args.size} B, {args.ledgers} offloaded ledgers, {args.master}, "
              f"{args.rounds} rounds alternated (median of per-round ratios):")
        for q, v in out["read_topic_over_parquet_median"].items():
            s = out["seconds_median"]
            print(f"  {q}: read_topic / spark.read.parquet = {v:.2f}x  "
                  f"({s[f'{q} read_topic']:.2f}s vs {s[f'{q} parquet']:.2f}s)")
        h = out["half_topic"]
        print(f"  half tier / half bookies ({h['messages']:,} msgs), count+sum(length): read_topic / format = "
              f"{h['read_topic_over_format_median']:.2f}x ({h['seconds_median']['read_topic']:.2f}s vs "
              f"{h['seconds_median']['format']:.2f}s); per round "
              + " ".join(f"{x:.2f}" for x in h["per_round"]))


if __name__ == "__main__":
    main()
