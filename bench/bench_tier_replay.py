"""Tier replay benchmark: reading an offloaded topic back through the broker vs reading the same
Parquet objects directly with pyarrow, in the same run.

    .venv/bin/python bench/bench_tier_replay.py [--mb 64] [--size 1000] [--tier s3|file] [--dir D]

Starts moto's S3 server (``--tier s3``, the default) or uses a ``file://`` directory, and a local
cluster (3 bookies, 1 broker, E3/Qw3/Qa2, fsync on) whose broker offloads to it. Then, one phase
after the other:

  produce    --mb of --size-byte messages, batched (official client), ledgers rolled every
             --entries-per-ledger entries
  bookies    topic unloaded, a subscription from earliest reads it back from the bookies (the
             same replay before any offload: the broker's ceiling on this machine)
  offload    admin PUT .../offload before the current ledger; wait for SUCCESS and for every
             closed ledger to be deleted from the bookies (deletion lag 0): offload MB/s
             (message bytes / wall time of the whole offload)
  replay     topic unloaded (the broker's entry cache dropped), then a new subscription from
             earliest reads everything back (official client, batch_receive): MB/s of message
             bytes, served from the tier
  direct     pyarrow reads the same objects (the URIs from internal stats; S3FileSystem with
             the endpoint, or local files), all columns, page checksums verified: MB/s of the
             ``value`` bytes

Prints a markdown table with the ratio replay / direct (goal >= 0.5). Not a test: figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import pulsar  # noqa: E402

from bench.common import http, start_tier, work_dir  # noqa: E402
from faces.cluster import LocalCluster  # noqa: E402


def wait(predicate, timeout_s: float, what: str, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(interval_s)


def produce(client, topic: str, total_bytes: int, size: int) -> int:
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=100,
                                      batching_max_publish_delay_ms=10, block_if_queue_full=True,
                                      max_pending_messages=20_000)
    payload = os.urandom(size // 2).hex().encode()[:size]
    n = total_bytes // size
    for i in range(n):
        producer.send_async(payload, None)
    producer.flush()
    producer.close()
    return n


def replay(client, topic: str, expected: int, subscription: str = "replay") -> tuple[int, int, float]:
    policy = pulsar.ConsumerBatchReceivePolicy(1000, 1 << 22, 10)
    consumer = client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Exclusive,
                                initial_position=pulsar.InitialPosition.Earliest,
                                receiver_queue_size=10_000, batch_receive_policy=policy)
    got = nbytes = 0
    started = time.perf_counter()
    idle_since = None
    while got < expected:
        batch = consumer.batch_receive()
        got += len(batch)
        nbytes += sum(len(m.data()) for m in batch)
        if batch:
            idle_since = None
        elif idle_since is None:
            idle_since = time.perf_counter()
        elif time.perf_counter() - idle_since > 30:
            break
    elapsed = time.perf_counter() - started
    consumer.close()
    return got, nbytes, elapsed


def direct(uris: list[str], endpoint: str | None) -> tuple[int, int, float]:
    import pyarrow.parquet as pq
    from pyarrow import fs
    if uris and uris[0].startswith("s3://"):
        filesystem = fs.S3FileSystem(endpoint_override=endpoint, scheme="http", region="us-east-1",
                                     access_key=os.environ["AWS_ACCESS_KEY_ID"],
                                     secret_key=os.environ["AWS_SECRET_ACCESS_KEY"])
        paths = [u[len("s3://"):] for u in uris]
    else:
        filesystem = fs.LocalFileSystem()
        paths = [u[len("file://"):] for u in uris]
    rows = nbytes = 0
    started = time.perf_counter()
    for path in paths:
        with filesystem.open_input_file(path) as f:
            table = pq.ParquetFile(f, page_checksum_verification=True).read()
        rows += table.num_rows
        value = table.column("value")
        nbytes += sum(len(b) for b in value.chunks[0].buffers()[2:3]) if value.num_chunks == 1 else \
            sum(chunk.buffers()[2].size for chunk in value.chunks)
    elapsed = time.perf_counter() - started
    return rows, nbytes, elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=64, help="message megabytes to produce")
    ap.add_argument("--size", type=int, default=1000, help="message size in bytes")
    ap.add_argument("--entries-per-ledger", type=int, default=20)
    ap.add_argument("--tier", choices=["s3", "file"], default="s3")
    ap.add_argument("--dir", help="cluster directory (default: a temporary one)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object first")
    args = ap.parse_args()

    with work_dir(args.dir, "bench-tier-") as work:
        s3, endpoint, tier_uri = start_tier(work, args.tier)
        cluster = LocalCluster(work / "cluster")
        try:
            cluster.start_processes(bookies=3, brokers=1, broker_overrides={
                "offload.tier_uri": tier_uri, "offload.tier_s3_endpoint_url": endpoint or "",
                "managed_ledger.rollover_entries_max": args.entries_per_ledger, "offload.deletion_lag_ms": 0,
                "offload.check_interval_ms": 1000})
            admin = cluster.admin_url
            # infinite retention: nothing subscribes while producing, and the ledgers must stay
            http("POST", f"{admin}/admin/v2/namespaces/public/default/retention",
                 {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
            topic = "persistent://public/default/tier-replay"
            turl = f"{admin}/admin/v2/persistent/public/default/tier-replay"
            client = pulsar.Client(cluster.service_url, operation_timeout_seconds=60)
            t0 = time.perf_counter()
            n = produce(client, topic, args.mb * 1_000_000, args.size)
            print(f"produced {n} messages in {time.perf_counter() - t0:.1f}s", file=sys.stderr)

            http("PUT", turl + "/unload")
            bgot, bbytes, bsec = replay(client, topic, n, "from-bookies")   # the same replay, from bookies
            http("DELETE", turl + "/subscription/from-bookies")
            stats = http("GET", turl + "/internalStats")
            current = stats["ledgers"][-1]["ledgerId"]
            closed = [i for i in stats["ledgers"] if i["ledgerId"] != current and i["entries"] > 0]
            closed_bytes = sum(i["size"] for i in closed)
            if not closed:
                raise SystemExit(f"no closed ledger to offload: {stats['ledgers']}")
            t0 = time.perf_counter()
            http("PUT", turl + "/offload", {"ledgerId": current, "entryId": 0})
            wait(lambda: http("GET", turl + "/offload")["status"] in ("SUCCESS", "ERROR"), 1800, "offload")
            offload_s = time.perf_counter() - t0
            status = http("GET", turl + "/offload")
            if status["status"] != "SUCCESS":
                raise SystemExit(f"offload failed: {status}")

            def deleted():
                ledgers = http("GET", turl + "/internalStats")["ledgers"]
                done = [i for i in ledgers if i["offloadState"] == "bookie-deleted"]
                return len(done) == len(closed) and done
            ledgers = wait(deleted, 1800, "bookie deletion")
            uris = [i["offloadUri"] for i in ledgers]
            expected = sum(i["entries"] for i in closed)   # entries; messages counted below
            print(f"offloaded {len(uris)} ledgers ({closed_bytes / 1e6:.1f} MB) in {offload_s:.1f}s", file=sys.stderr)

            http("PUT", turl + "/unload")
            messages_offloaded = None
            rows, dbytes, dsec = direct(uris, endpoint)
            messages_offloaded = rows
            got, rbytes, rsec = replay(client, topic, n)
            del expected
            rows2, dbytes2, dsec2 = direct(uris, endpoint)      # again, after the replay (warm both)
            dsec_best = min(dsec, dsec2)
            client.close()

            replay_mb_s = rbytes / rsec / 1e6
            direct_mb_s = dbytes / dsec_best / 1e6
            if args.json:
                print(json.dumps({"mb": args.mb, "size": args.size, "tier": args.tier, "ledgers": len(uris),
                                  "offload_mb_s": closed_bytes / offload_s / 1e6, "replay_tier_mb_s": replay_mb_s,
                                  "replay_bookies_mb_s": bbytes / bsec / 1e6, "direct_pyarrow_mb_s": direct_mb_s,
                                  "ratio_replay_direct": replay_mb_s / direct_mb_s}))
            print(f"\n### Tier replay ({args.tier}; {args.mb} MB of {args.size}-byte messages, "
                  f"{len(uris)} ledgers of {args.entries_per_ledger} entries)\n")
            print("| figure | value |")
            print("|---|---|")
            print(f"| offload (read from bookies, encode, upload, verify, CAS) | {closed_bytes / offload_s / 1e6:.1f} MB/s "
                  f"({closed_bytes / 1e6:.1f} MB in {offload_s:.1f} s) |")
            print(f"| replay through the broker (official client, from earliest, tier only below the "
                  f"current ledger) | {replay_mb_s:.1f} MB/s ({got} msgs, {rbytes / 1e6:.1f} MB in {rsec:.1f} s) |")
            print(f"| replay through the broker from the bookies (before the offload, same run) | "
                  f"{bbytes / bsec / 1e6:.1f} MB/s ({bgot} msgs in {bsec:.1f} s) |")
            print(f"| pyarrow reading the same objects directly (best of 2) | {direct_mb_s:.1f} MB/s "
                  f"({messages_offloaded} rows, {dbytes / 1e6:.1f} MB in {dsec_best:.2f} s) |")
            print(f"| ratio replay / direct (goal >= 0.5) | {replay_mb_s / direct_mb_s:.2f} |")
            return 0
        finally:
            cluster.stop()
            if s3 is not None:
                s3.stop()


if __name__ == "__main__":
    sys.exit(main())
