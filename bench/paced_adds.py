"""Paced ledger adds: latency and CPU at fixed offered rates (3 local bookies, E3/Qw3/Qa2).

    .venv/bin/python bench/paced_adds.py [--rates 1000,5000,10000] [--seconds 8]
                                         [--bookie-set KEY=VALUE ...] [--slow-ms 10]

For each rate prints achieved rate, add latency p50/p99/max, the client's and each bookie's
CPU (% of one core), and when the slow adds (> --slow-ms) happened, so stalls can be matched
with bookie activity (checkpoints, journal file rolls). Figures only, no assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bookie.client.ledger_client import LedgerClient  # noqa: E402
from bench.common import work_dir  # noqa: E402
from faces.cluster import LocalCluster  # noqa: E402
from pulsarlite.config import BookieConfig, LedgerClientConfig  # noqa: E402

TICK_S = 0.001  # uvloop rounds shorter sleeps to zero: pace in whole milliseconds


def process_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))] if values else float("nan")


async def run_rate(zk: str, rate: int, seconds: float, payload_bytes: int, slow_ms: float) -> dict:
    client = await LedgerClient.connect(LedgerClientConfig(zookeeper=zk))
    try:
        writer = await client.create_ledger(3, 3, 2)
        payload = os.urandom(payload_bytes)
        samples: list[tuple[float, float]] = []  # (send time offset s, latency s)
        futures = []
        started = time.perf_counter()
        cpu_started = time.process_time()
        sent = 0
        while (now := time.perf_counter()) - started < seconds:
            due = int((now - started) * rate)
            while sent < due:
                t0 = time.perf_counter()
                fut = writer.add_async(payload)
                fut.add_done_callback(lambda f, t0=t0: samples.append((t0 - started, time.perf_counter() - t0)))
                futures.append(fut)
                sent += 1
            await asyncio.sleep(TICK_S)
        await asyncio.gather(*futures)
        elapsed = time.perf_counter() - started
        client_cpu = (time.process_time() - cpu_started) / elapsed
        await writer.close()
    finally:
        await client.close()
    latencies = [lat for _, lat in samples]
    slow = sorted(round(t, 1) for t, lat in samples if lat * 1000 > slow_ms)
    return {"rate": rate, "achieved": sent / elapsed, "p50_ms": pct(latencies, 50) * 1000,
            "p99_ms": pct(latencies, 99) * 1000, "max_ms": max(latencies) * 1000,
            "client_cpu": client_cpu, "slow_at_s": sorted(set(slow)), "elapsed": elapsed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1000,5000,10000")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--slow-ms", type=float, default=10.0)
    parser.add_argument("--dir", default=None, help="directory of the run, kept (default: a temporary one, removed)")
    parser.add_argument("--bookie-set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    overrides = {}
    for item in args.bookie_set:
        key, _, value = item.partition("=")
        overrides[key] = type(getattr(BookieConfig(), key))(value)
    import uvloop
    uvloop.install()
    with work_dir(args.dir, "pulsarlite-paced-") as base:
        with LocalCluster.start(base / "cluster", bookies=3, bookie_overrides=overrides) as cluster:
            pids = [cluster.records[n].pid for n in cluster.bookie_names]
            print(f"bookie settings: {overrides or 'defaults'}")
            print("| offered/s | achieved/s | p50 ms | p99 ms | max ms | client CPU | bookie CPU | slow adds at (s) |")
            print("|---|---|---|---|---|---|---|---|")
            for rate in (int(r) for r in args.rates.split(",")):
                before = [process_cpu_s(p) for p in pids]
                r = asyncio.run(run_rate(cluster.zookeeper, rate, args.seconds, args.payload_bytes, args.slow_ms))
                bookie_cpu = [(process_cpu_s(p) - b) / r["elapsed"] for p, b in zip(pids, before)]
                slow = ",".join(f"{t:g}" for t in r["slow_at_s"][:12]) + ("..." if len(r["slow_at_s"]) > 12 else "")
                print(f"| {rate} | {r['achieved']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.1f} | "
                      f"{r['client_cpu'] * 100:.0f}% | {'/'.join(f'{c * 100:.0f}%' for c in bookie_cpu)} | {slow} |",
                      flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main())
