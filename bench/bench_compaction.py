"""Compaction benchmark ([compat] item 6): how long a compaction of a topic takes against reading
that topic once with the official client (the reference beside it, same run).

    .venv/bin/python bench/bench_compaction.py [--messages 200000] [--keys 1000] [--value-bytes 100]
        [--dir D]

One run: a local cluster (3 bookies, 1 broker), --messages keyed messages (--keys distinct keys,
round robin) produced with the official client (batched), then
1. a reader without read_compacted reads the whole topic (reference: messages/s);
2. ``PUT .../compaction``, polled (20 ms) until SUCCESS: compaction time (two reads of the topic
   inside the broker, phase one and two, plus writing the survivors);
3. a reader with read_compacted reads the view (--keys messages).
Prints the figures and the ratio compaction time / plain read time. Not a test.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import pulsar  # noqa: E402
import requests  # noqa: E402

from bench.common import work_dir  # noqa: E402
from faces.cluster import LocalCluster  # noqa: E402

TOPIC = "persistent://public/default/bench-compaction"


def read_all(client, compacted: bool) -> tuple[int, float]:
    started = time.perf_counter()
    reader = client.create_reader(TOPIC, pulsar.MessageId.earliest, is_read_compacted=compacted,
                                  receiver_queue_size=5000)
    n = 0
    try:
        while reader.has_message_available():
            reader.read_next(timeout_millis=30_000)
            n += 1
    finally:
        reader.close()
    return n, time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--dir")
    args = ap.parse_args()
    with work_dir(args.dir, "bench-compaction-") as directory:
        cluster = LocalCluster.start(directory / "cluster", bookies=3, brokers=1)
        try:
            client = pulsar.Client(cluster.service_url, operation_timeout_seconds=60)
            try:
                producer = client.create_producer(TOPIC, batching_enabled=True, batching_max_messages=1000,
                                                  batching_max_publish_delay_ms=10, block_if_queue_full=True)
                value = b"v" * args.value_bytes
                t0 = time.perf_counter()
                for i in range(args.messages):
                    producer.send_async(value, None, partition_key=f"k{i % args.keys}")
                producer.flush()
                produce_s = time.perf_counter() - t0
                producer.close()
                plain_n, plain_s = read_all(client, compacted=False)
                admin = cluster.admin_url + "/admin/v2/persistent/public/default/bench-compaction/compaction"
                t0 = time.perf_counter()
                requests.put(admin, timeout=60).raise_for_status()
                while True:
                    status = requests.get(admin, timeout=60).json()
                    if status["status"] in ("SUCCESS", "ERROR"):
                        break
                    time.sleep(0.02)
                compact_s = time.perf_counter() - t0
                if status["status"] != "SUCCESS":
                    raise SystemExit(f"compaction failed: {status}")
                view_n, view_s = read_all(client, compacted=True)
            finally:
                client.close()
        finally:
            cluster.stop()
        print(json.dumps({
            "messages": args.messages, "keys": args.keys, "value_bytes": args.value_bytes,
            "produce_s": round(produce_s, 3),
            "plain_read_messages": plain_n, "plain_read_s": round(plain_s, 3),
            "plain_read_msg_per_s": round(plain_n / plain_s),
            "compaction_s": round(compact_s, 3), "compaction_msg_per_s": round(args.messages / compact_s),
            "compacted_read_messages": view_n, "compacted_read_s": round(view_s, 3),
            "ratio_compaction_to_plain_read": round(compact_s / plain_s, 2),
        }, indent=2))


if __name__ == "__main__":
    main()
