"""[lakehouse] Peak memory of ``pulsarlite.lake.scan`` (one Arrow table) against
``pulsarlite.lake.scan_batches`` (a RecordBatchReader consumed batch by batch, nothing kept) on
a topic of about ``--ledgers x --entries x --payload-bytes`` bytes, half of its ledgers
offloaded and in the Iceberg table, the rest on the bookies. Real processes (LocalCluster:
ZooKeeper, 3 bookies, 1 broker with lake on, file:// tier), the official client producing.

Each reader runs in a fresh Python process (``--child``) that imports everything first, then
reports its peak RSS (``ru_maxrss``) before and after the read, the rows and the seconds.

    .venv/bin/python bench/bench_lake_scan.py [--ledgers 10] [--entries 20000] [--payload-bytes 1000]

BENCH_TRACE=1 prints, per batch of the stream, its ledger and the process RSS and Arrow pool bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import http, work_dir  # noqa: E402

TOPIC_LOCAL = "bench-lake-scan"
TOPIC = f"persistent://public/default/{TOPIC_LOCAL}"


def topic_url(admin: str) -> str:
    return f"{admin}/admin/v2/persistent/public/default/{TOPIC_LOCAL}"


def ledgers(admin: str) -> list[dict]:
    return http("GET", topic_url(admin) + "/internalStats")["ledgers"]


def wait(pred, timeout_s: float = 900.0, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(interval_s)
    raise TimeoutError("timed out")


def child(mode: str, zookeeper: str, admin: str) -> None:
    import resource

    import pyarrow  # noqa: F401
    import pyiceberg.table  # noqa: F401

    import faces.lake  # noqa: F401
    import spark_source.source  # noqa: F401
    from pulsarlite.lake import scan, scan_batches

    def peak_mb() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    before = peak_mb()
    started = time.monotonic()
    if mode == "scan":
        table = scan(TOPIC, zookeeper=zookeeper, admin_url=admin)
        rows, nbytes = table.num_rows, table.nbytes
        del table
    else:
        rows = nbytes = 0
        with scan_batches(TOPIC, zookeeper=zookeeper, admin_url=admin) as reader:
            for batch in reader:
                rows += batch.num_rows
                nbytes = max(nbytes, batch.nbytes)
                if os.environ.get("BENCH_TRACE"):
                    import pyarrow as pa
                    rss = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
                    print(f"ledger={batch.column('ledger_id')[0].as_py()} rows={batch.num_rows} rss_mb={rss:.0f} "
                          f"arrow_pool_mb={pa.total_allocated_bytes() / 2**20:.0f}", file=sys.stderr)
    print(json.dumps({"mode": mode, "rows": rows, "arrow_mb": nbytes / 1e6, "seconds": time.monotonic() - started,
                      "peak_rss_before_mb": before, "peak_rss_mb": peak_mb()}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ledgers", type=int, default=10)
    ap.add_argument("--entries", type=int, default=20_000)
    ap.add_argument("--payload-bytes", type=int, default=1000)
    ap.add_argument("--child", nargs=3, metavar=("MODE", "ZOOKEEPER", "ADMIN"))
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    import pulsar

    from faces.cluster import LocalCluster
    with work_dir(None, "bench-lake-scan-") as tmp:
        tier = Path(tmp) / "tier"
        tier.mkdir()
        cluster = LocalCluster(Path(tmp) / "cluster")
        try:
            cluster.start_processes(bookies=3, brokers=1, broker_overrides={
                "offload.tier_uri": f"file://{tier}", "managed_ledger.rollover_entries_max": args.entries,
                "offload.deletion_lag_ms": 0, "offload.check_interval_ms": 200, "offload.lake_enabled": True})
            admin = cluster.admin_url
            http("POST", f"{admin}/admin/v2/namespaces/public/default/retention",
                 {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
            client = pulsar.Client(cluster.service_url, operation_timeout_seconds=120)
            producer = client.create_producer(TOPIC, batching_enabled=False, max_pending_messages=5000,
                                              block_if_queue_full=True)
            payloads = [os.urandom(args.payload_bytes) for _ in range(64)]
            started = time.monotonic()
            for i in range(args.ledgers * args.entries):
                producer.send_async(payloads[i % 64], None)
            producer.flush()
            produce_s = time.monotonic() - started
            producer.close()
            client.close()
            listed = [i for i in ledgers(admin) if i["entries"] > 0]
            middle = listed[len(listed) // 2]["ledgerId"]
            http("PUT", topic_url(admin) + "/offload", {"ledgerId": middle, "entryId": 0})
            asked = [i for i in listed if i["ledgerId"] < middle]

            def done():
                st = http("GET", topic_url(admin) + "/offload")
                if st["status"] == "ERROR":
                    raise RuntimeError(st)
                return st["status"] == "SUCCESS" and int(http("GET", topic_url(admin) + "/lake").get("dataFiles") or 0) \
                    >= len(asked)
            wait(done)
            size_mb = sum(i["size"] for i in listed) / 1e6
            print(f"topic: {len(listed)} ledgers, {size_mb:.0f} MB stored, {len(asked)} ledgers offloaded and in "
                  f"the table; produced in {produce_s:.0f} s", flush=True)
            results = []
            for mode in ("scan_batches", "scan"):
                out = subprocess.run([sys.executable, __file__, "--child", mode, cluster.zookeeper, admin],
                                     check=True, capture_output=True, text=True,
                                     cwd=str(Path(__file__).resolve().parent.parent))
                results.append(json.loads(out.stdout.strip().splitlines()[-1]))
                if os.environ.get("BENCH_TRACE"):
                    print(out.stderr, file=sys.stderr)
            print("| read | rows | s | peak RSS after imports MB | peak RSS MB | Arrow MB held (the table / the largest batch) |")
            print("|---|---|---|---|---|---|")
            for r in results:
                print(f"| {r['mode']} | {r['rows']} | {r['seconds']:.1f} | {r['peak_rss_before_mb']:.0f} | "
                      f"{r['peak_rss_mb']:.0f} | {r['arrow_mb']:.1f} |")
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
