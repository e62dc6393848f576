"""Broker memory with many idle topics: N topics, one producer each (official client, one
connection), then the broker's RSS while they sit idle.

    .venv/bin/python bench/bench_idle_topics.py [--topics 1000] [--json]

Goal ([perf]): broker RSS <= 300 MB with 1,000 topics and 1,000 idle producers. Also prints the
broker's RSS before any topic (the baseline) and the cost per topic. Not a test: figures only.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import pulsar  # noqa: E402

from bench.common import work_dir  # noqa: E402
from faces.cluster import LocalCluster  # noqa: E402


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--dir", default=None, help="directory of the run, kept (default: a temporary one, removed)")
    args = parser.parse_args()
    with work_dir(args.dir, "pulsarlite-bench-idle-") as base:
        with LocalCluster.start(base / "cluster", bookies=3, brokers=1) as cluster:
            pid = cluster.records[cluster.broker_names[0]].pid
            baseline = rss_mb(pid)
            client = pulsar.Client(cluster.service_url, operation_timeout_seconds=120,
                                   logger=pulsar.FileLogger(pulsar.LoggerLevel.Warn, str(base / "client.log")))
            producers = []
            try:
                started = time.perf_counter()
                last = started
                for i in range(args.topics):
                    producers.append(client.create_producer(f"persistent://public/default/idle-{i}",
                                                            batching_enabled=False))
                    now = time.perf_counter()
                    if now - last >= 1.0:
                        print(f"  {len(producers):,} producers, broker RSS {rss_mb(pid):.0f} MB "
                              f"({len(producers) / (now - started):.0f} topics/s)", file=sys.stderr, flush=True)
                        last = now
                create_s = time.perf_counter() - started
                for p in producers[:: max(1, len(producers) // 50)]:
                    p.send(b"x" * 100)                         # a few topics have seen a message
                time.sleep(args.idle_s)
                loaded = rss_mb(pid)
            finally:
                client.close()
        result = {"topics": args.topics, "baseline_rss_mb": baseline, "rss_mb": loaded,
                  "per_topic_kb": (loaded - baseline) * 1024 / max(1, args.topics), "create_s": create_s}
        if args.json:
            print(json.dumps(result))
        else:
            print(f"| broker RSS, {args.topics:,} topics x 1 idle producer | {loaded:.0f} MB (baseline {baseline:.0f} MB, "
                  f"{result['per_topic_kb']:.0f} KB per topic; created in {create_s:.0f} s) | <= 300 MB |")
        return 0


if __name__ == "__main__":
    sys.exit(main())
