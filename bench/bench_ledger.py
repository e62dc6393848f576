"""Ledger add benchmark: 3 local bookies, E3/Qw3/Qa2, fsync on, against this machine's disk.

    .venv/bin/python bench/bench_ledger.py [--seconds S] [--dir D]

Prints, in one run: the machine's raw fsync'd sequential write rate (1 MiB blocks) and 4 KiB
append+fdatasync rate; pipelined 100 B adds (adds/s, latency p50/p99); 100 B adds paced at half
that rate (latency p50/p99); 64 KiB adds (MB/s, and (MB/s x 3 replicas) / raw disk MB/s).
A live rate line shows progress. Not a test: no assertions, figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.common import work_dir  # noqa: E402
from bookie.client.ledger_client import LedgerClient  # noqa: E402
from faces.cluster import LocalCluster  # noqa: E402

from machine_limits import disk_append_fdatasync_ops_s, disk_fsync_seq_mb_s  # noqa: E402 - bench/ is on sys.path
from pulsarlite.config import BookieConfig, LedgerClientConfig  # noqa: E402

MiB = 1024 * 1024


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


class Live:
    """Prints a rate line once a second."""

    def __init__(self, label: str) -> None:
        self.label, self.count, self.bytes = label, 0, 0
        self.started = self.last_t = time.perf_counter()
        self.last_count = 0

    def tick(self, n: int, size: int) -> None:
        self.count += n
        self.bytes += n * size
        now = time.perf_counter()
        if now - self.last_t >= 1.0:
            rate = (self.count - self.last_count) / (now - self.last_t)
            print(f"  [{self.label}] {now - self.started:5.1f}s  {rate:10.0f} adds/s  total {self.count}",
                  file=sys.stderr, flush=True)
            self.last_t, self.last_count = now, self.count


async def pipelined(client: LedgerClient, size: int, seconds: float, window: int, label: str) -> dict:
    writer = await client.create_ledger(3, 3, 2)
    payload = os.urandom(size)
    inflight: collections.deque = collections.deque()
    latencies: list[float] = []
    live = Live(label)
    started = time.perf_counter()
    deadline = started + seconds

    def done(t0: float):
        return lambda fut: latencies.append(time.perf_counter() - t0)

    while time.perf_counter() < deadline:
        while len(inflight) < window:
            fut = writer.add_async(payload)
            fut.add_done_callback(done(time.perf_counter()))
            inflight.append(fut)
        await inflight.popleft()
        live.tick(1, size)
    while inflight:
        await inflight.popleft()
        live.tick(1, size)
    elapsed = time.perf_counter() - started
    await writer.close()
    n = live.count
    return {"adds": n, "seconds": elapsed, "adds_per_s": n / elapsed, "mb_per_s": n * size / elapsed / 1e6,
            "p50_ms": pct(latencies, 50) * 1000, "p99_ms": pct(latencies, 99) * 1000}


async def paced(client: LedgerClient, size: int, seconds: float, rate: float, label: str) -> dict:
    writer = await client.create_ledger(3, 3, 2)
    payload = os.urandom(size)
    latencies: list[float] = []
    futures = []
    live = Live(label)
    started = time.perf_counter()
    interval = 1.0 / rate
    i = 0
    while True:
        target = started + i * interval
        now = time.perf_counter()
        if now - started >= seconds:
            break
        if target > now:
            await asyncio.sleep(target - now)
        t0 = time.perf_counter()
        fut = writer.add_async(payload)
        fut.add_done_callback(lambda f, t0=t0: latencies.append(time.perf_counter() - t0))
        futures.append(fut)
        live.tick(1, size)
        i += 1
    await asyncio.gather(*futures)
    elapsed = time.perf_counter() - started
    await writer.close()
    return {"adds": i, "target_rate": rate, "achieved_rate": i / elapsed,
            "p50_ms": pct(latencies, 50) * 1000, "p99_ms": pct(latencies, 99) * 1000}


async def run_client(zk: str, seconds: float) -> dict:
    client = await LedgerClient.connect(LedgerClientConfig(zookeeper=zk))
    try:
        results = {}
        results["warmup"] = await pipelined(client, 100, min(3.0, seconds), 2000, "warmup 100B")
        results["small_pipelined"] = await pipelined(client, 100, seconds, 5000, "100B pipelined")
        half = max(100.0, results["small_pipelined"]["adds_per_s"] / 2)
        results["small_paced_half"] = await paced(client, 100, seconds, half, "100B at half rate")
        results["large_pipelined"] = await pipelined(client, 64 * 1024, seconds, 64, "64KiB pipelined")
        return results
    finally:
        await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--dir", default=None, help="cluster directory (default: a temp dir)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--bookie-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a BookieConfig setting for every bookie, e.g. journal_preallocate_bytes=0")
    args = parser.parse_args()
    overrides = {}
    for item in args.bookie_set:
        key, _, value = item.partition("=")
        overrides[key] = type(getattr(BookieConfig(), key))(value)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    with work_dir(args.dir, "pulsarlite-bench-") as base:
        print(f"== machine limits (in {base})", file=sys.stderr)
        disk_mb_s = disk_fsync_seq_mb_s(base)
        append_ops = disk_append_fdatasync_ops_s(base)
        print(f"  fsync'd sequential write: {disk_mb_s:.0f} MB/s; 4 KiB append+fdatasync: {append_ops:.0f} ops/s",
              file=sys.stderr)
        print("== starting 3 bookies", file=sys.stderr)
        if overrides:
            print(f"  bookie settings: {overrides}", file=sys.stderr)
        with LocalCluster.start(pathlib.Path(base) / "cluster", bookies=3, bookie_overrides=overrides) as cluster:
            results = asyncio.run(run_client(cluster.zookeeper, args.seconds))
        results["disk_fsync_seq_mb_s"] = disk_mb_s
        results["disk_append_fdatasync_ops_s"] = append_ops
        large = results["large_pipelined"]
        results["large_replicated_disk_ratio"] = large["mb_per_s"] * 3 / disk_mb_s
        if args.json:
            print(json.dumps(results, indent=2))
        s, h = results["small_pipelined"], results["small_paced_half"]
        print("\n| figure | value | goal |")
        print("|---|---|---|")
        print(f"| raw fsync'd sequential write (1 MiB blocks) | {disk_mb_s:.0f} MB/s | (machine limit) |")
        print(f"| 4 KiB append + fdatasync | {append_ops:.0f} ops/s | (machine limit) |")
        print(f"| 100 B adds, pipelined (window 5000) | {s['adds_per_s']:.0f} adds/s, p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms | >= 20k adds/s |")
        print(f"| 100 B adds at half that rate ({h['target_rate']:.0f}/s) | p50 {h['p50_ms']:.2f} ms, p99 {h['p99_ms']:.2f} ms | p99 <= 5 ms |")
        print(f"| 64 KiB adds, pipelined (window 64) | {large['mb_per_s']:.1f} MB/s payload, {large['adds_per_s']:.0f} adds/s, p99 {large['p99_ms']:.1f} ms | |")
        print(f"| (64 KiB MB/s x 3 replicas) / raw disk MB/s | {results['large_replicated_disk_ratio']:.2f} | >= 0.3 (0.5 is the ceiling) |")
        return 0


if __name__ == "__main__":
    sys.exit(main())
