"""Service back after kill -9 of a topic's owner, vs the metadata session timeout (issue 29).

    .venv/bin/python bench/bench_failover.py [--session-ms 10000] [--rounds 3] [--dir D]

One local cluster (3 bookies, 2 brokers, ``zk_session_timeout_ms`` = --session-ms on both).
Each round: a fresh topic, an official-client producer (batching off, send timeout 120 s,
service URL over both brokers) sends until acked; then the topic's owner (read from its bundle
znode) is killed with SIGKILL and, at once, one more message is sent synchronously. Measured
from the kill:

  owner gone      the bundle's owner znode (ephemeral, the dead broker's session) is deleted
  new owner       the znode names the other broker
  first ack       the send after the kill is acknowledged (service back)

The killed broker is restarted between rounds (it then owns nothing). The goal: first ack <=
session timeout + 2 s. No assertions: figures only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import work_dir  # noqa: E402

BUNDLES_PER_NAMESPACE = 4


def say(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def owner_of(zk, topic: str) -> str | None:
    from broker.ownership.core import bundle_key
    from pulsarlite.topic_name import TopicName
    path = f"/namespace/{bundle_key(TopicName.parse(topic), BUNDLES_PER_NAMESPACE)}"
    try:
        data, _ = zk.get(path)
    except Exception:   # noqa: BLE001 - no owner now
        return None
    return json.loads(data)["broker_id"]


def one_round(cluster, zk, r: int) -> dict[str, float]:
    import pulsar
    topic = f"persistent://public/default/bench-failover-{r}-{time.time_ns()}"
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=120,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(topic, batching_enabled=False, send_timeout_millis=120_000)
        producer.send(b"before")
        owner_id = owner_of(zk, topic)
        name = next(n for n in cluster.broker_names if cluster.records[n].broker_id == owner_id)
        events: dict[str, float] = {}
        acked = threading.Event()

        def send_after() -> None:
            producer.send(b"after")
            events["first_ack_s"] = time.monotonic() - t0
            acked.set()

        t0 = time.monotonic()
        cluster.kill(name)
        threading.Thread(target=send_after, daemon=True).start()
        while not acked.is_set() and time.monotonic() - t0 < 120:
            now = owner_of(zk, topic)
            t = time.monotonic() - t0
            if now != owner_id and "owner_gone_s" not in events:
                events["owner_gone_s"] = t
            if now is not None and now != owner_id and "new_owner_s" not in events:
                events["new_owner_s"] = t
            time.sleep(0.02)
        acked.wait(5)
        say(f"round {r}: killed {name}; " + ", ".join(f"{k} {v:.2f}" for k, v in events.items()))
        producer.close()
        cluster.restart(name)
        return events
    finally:
        client.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--session-ms", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--json", action="store_true", help="print a JSON object of the medians first (bench/suite.py)")
    args = ap.parse_args()
    from kazoo.client import KazooClient
    from faces.cluster import LocalCluster
    with work_dir(args.dir, "bench-failover-") as base:
        cluster = LocalCluster(base / "cluster")
        rows = []
        zk = None
        try:
            cluster.start_processes(bookies=3, brokers=2, broker_overrides={"zk_session_timeout_ms": args.session_ms})
            zk = KazooClient(hosts=cluster.zookeeper, timeout=10)
            zk.start(timeout=10)
            for r in range(args.rounds):
                rows.append(one_round(cluster, zk, r + 1))
        finally:
            if zk is not None:
                zk.stop()
                zk.close()
            cluster.stop()
        timeout_s = args.session_ms / 1000
        med = {k: statistics.median(row[k] for row in rows if k in row)
               for k in ("owner_gone_s", "new_owner_s", "first_ack_s") if any(k in row for row in rows)}
        first = med.get("first_ack_s", float("inf"))
        if args.json:
            print(json.dumps({"session_timeout_s": timeout_s, "rounds": len(rows), "median": med, "per_round": rows}))
        print("| figure | value | reference (same run) | goal | goal met |\n|---|---|---|---|---|")
        print(f"| service back after kill -9 of the owner (first acknowledged send), median of {len(rows)} | "
              f"{first:.1f} s (owner znode gone {med.get('owner_gone_s', float('nan')):.1f} s, new owner "
              f"{med.get('new_owner_s', float('nan')):.1f} s) | session timeout {timeout_s:.1f} s | "
              f"<= {timeout_s + 2:.1f} s | {'met' if first <= timeout_s + 2 else '**missed**'} |")
        say("per round: " + "; ".join(", ".join(f"{k} {v:.2f}" for k, v in row.items()) for row in rows))


if __name__ == "__main__":
    main()
