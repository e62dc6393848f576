"""[lakehouse] The table commit through a real broker (ZooKeeper, 3 bookies, 1 broker: LocalCluster
processes; file:// tier; embedded SQLite catalog), the official client producing:

1. offload MB/s with and without the table commit: LEDGERS ledgers of ENTRIES entries each are
   written with automatic offload off, then one admin offload of all of them is timed from the
   PUT to its SUCCESS (lake on: and until the table has all of them), after a warm-up offload of
   one ledger (pyiceberg's import and the table's creation are not in the figure). MB = the ledgers'
   ``size`` in the list (stored entry bytes). A fresh cluster for each of the two runs.
2. (lake on) produce to queryable: with the namespace's offload threshold 0 (every closed ledger
   is offloaded), ledgers are written one at a time; for each, the seconds from the moment the
   ledger is seen closed (a newer ledger appears in internal stats, polled every 20 ms) to the
   moment its object is a data file of the table's current snapshot (GET .../lake ``dataFiles``,
   same polling). Resolution: the polling interval plus one admin call.

    .venv/bin/python bench/bench_lake_broker.py [--ledgers 8] [--entries 1000] [--payload-bytes 1000] [--fresh 6]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import http, work_dir  # noqa: E402

TOPIC_LOCAL = "bench-lake"
TOPIC = f"persistent://public/default/{TOPIC_LOCAL}"


def topic_url(admin: str) -> str:
    return f"{admin}/admin/v2/persistent/public/default/{TOPIC_LOCAL}"


def ledgers(admin: str) -> list[dict]:
    return http("GET", topic_url(admin) + "/internalStats")["ledgers"]


def data_files(admin: str) -> int:
    return int(http("GET", topic_url(admin) + "/lake").get("dataFiles") or 0)


def produce(producer, n: int, payload: bytes) -> None:
    for _ in range(n):
        producer.send_async(payload, None)
    producer.flush()


def wait(pred, timeout_s: float = 600.0, interval_s: float = 0.02):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(interval_s)
    raise TimeoutError("timed out")


def run(lake: bool, args) -> dict:
    import pulsar

    from faces.cluster import LocalCluster
    with work_dir(None, "bench-lake-") as tmp:
        tier = Path(tmp) / "tier"
        tier.mkdir()
        cluster = LocalCluster(Path(tmp) / "cluster")
        try:
            cluster.start_processes(bookies=3, brokers=1, broker_overrides={
                "offload.tier_uri": f"file://{tier}", "managed_ledger.rollover_entries_max": args.entries,
                "offload.deletion_lag_ms": 3_600_000, "offload.check_interval_ms": 200, "offload.lake_enabled": lake})
            admin = cluster.admin_url
            http("POST", f"{admin}/admin/v2/namespaces/public/default/retention",
                 {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
            client = pulsar.Client(cluster.service_url, operation_timeout_seconds=60)
            payload = b"x" * args.payload_bytes
            producer = client.create_producer(TOPIC, batching_enabled=False, max_pending_messages=5000,
                                              block_if_queue_full=True)

            def offload_all() -> list[dict]:
                current = ledgers(admin)[-1]["ledgerId"]
                http("PUT", topic_url(admin) + "/offload", {"ledgerId": current, "entryId": 0})
                asked = [i for i in ledgers(admin) if i["ledgerId"] < current and i["entries"] > 0]

                def done():
                    st = http("GET", topic_url(admin) + "/offload")
                    if st["status"] == "ERROR":
                        raise RuntimeError(st)
                    return st["status"] == "SUCCESS" and (not lake or data_files(admin) >= len(asked))
                wait(done)
                return asked

            # warm-up, not timed: one ledger offloaded (the lake run pays pyiceberg's import and
            # the table's creation here, once per broker process)
            produce(producer, args.entries + 1, payload)
            warm = len(offload_all())
            produce(producer, args.ledgers * args.entries, payload)
            started = time.monotonic()
            closed = offload_all()[warm:]
            seconds = time.monotonic() - started
            size = sum(i["size"] for i in closed)
            out = {"lake": lake, "ledgers": len(closed), "mb": size / 1e6, "offload_s": seconds,
                   "mb_per_s": size / 1e6 / seconds, "fresh_s": []}
            if lake and args.fresh:
                http("PUT", "{}/admin/v2/namespaces/public/default/offloadThreshold".format(admin), 0)
                for _ in range(args.fresh):
                    files_before = data_files(admin)
                    ids_before = {i["ledgerId"] for i in ledgers(admin)}
                    produce(producer, args.entries, payload)       # closes the open ledger, opens the next
                    closed_at = wait(lambda: {i["ledgerId"] for i in ledgers(admin)} - ids_before and time.monotonic())
                    in_table_at = wait(lambda: data_files(admin) > files_before and time.monotonic())
                    out["fresh_s"].append(in_table_at - closed_at)
            producer.close()
            client.close()
            return out
        finally:
            cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ledgers", type=int, default=8)
    ap.add_argument("--entries", type=int, default=1000)
    ap.add_argument("--payload-bytes", type=int, default=1000)
    ap.add_argument("--fresh", type=int, default=6, help="ledgers timed from close to rows in the table")
    args = ap.parse_args()
    results = [run(False, args), run(True, args)]
    print("| lake | ledgers | MB | offload s | MB/s | close -> in table s (min / median / max) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        f = r["fresh_s"]
        fresh = f"{min(f):.2f} / {statistics.median(f):.2f} / {max(f):.2f} (n={len(f)})" if f else "-"
        print(f"| {'on' if r['lake'] else 'off'} | {r['ledgers']} | {r['mb']:.1f} | {r['offload_s']:.2f} | "
              f"{r['mb_per_s']:.2f} | {fresh} |")


if __name__ == "__main__":
    main()
