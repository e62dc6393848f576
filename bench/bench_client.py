"""pulsarlite's client vs the official client (pulsar-client 3.x), producing to and consuming from
the same broker in one run: batching on, 100 B messages, send_async + flush, then receive + ack.

    .venv/bin/python bench/bench_client.py [--messages 100000] [--rounds 3] [--service-url URL]

Without --service-url it starts a local cluster (3 bookies, 1 broker) in a temporary directory.
Rounds alternate the two clients (official first) on fresh topics; the figures are medians, and
the ratio is ours / official (the issue's goal: >= 0.5).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pulsar  # noqa: E402

import pulsarlite  # noqa: E402
from bench.common import work_dir  # noqa: E402
from faces.cluster import LocalCluster  # noqa: E402

PAYLOAD = b"x" * 100


def produce(module, client, topic: str, n: int) -> float:
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=1000,
                                      batching_max_publish_delay_ms=10,
                                      max_pending_messages=20000, block_if_queue_full=True)
    errors = []

    def done(res, mid):
        if res != module.Result.Ok:
            errors.append(res)
    send = producer.send_async
    t0 = time.perf_counter()
    for _ in range(n):
        send(PAYLOAD, done)
    producer.flush()
    elapsed = time.perf_counter() - t0
    producer.close()
    if errors:
        raise SystemExit(f"{len(errors)} sends failed: {errors[0]}")
    return n / elapsed


def create_subscription(module, client, topic: str) -> None:
    """Subscribe before producing: without a subscription (and without retention) the broker
    may delete rolled-over ledgers, as Pulsar does."""
    client.subscribe(topic, "bench", initial_position=module.InitialPosition.Earliest).close()


def consume(module, client, topic: str, n: int) -> float:
    consumer = client.subscribe(topic, "bench", initial_position=module.InitialPosition.Earliest,
                                receiver_queue_size=1000)
    receive, ack = consumer.receive, consumer.acknowledge
    t0 = time.perf_counter()
    for _ in range(n):
        ack(receive(30_000))
    elapsed = time.perf_counter() - t0
    consumer.close()
    return n / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--service-url", default=None)
    parser.add_argument("--json", action="store_true", help="also print the medians as one JSON object")
    args = parser.parse_args()

    cluster = None
    tmp = contextlib.ExitStack()          # the cluster's temporary directory, if one is started
    service_url = args.service_url
    results: dict[tuple[str, str], list[float]] = {}
    try:
        if service_url is None:
            cluster = LocalCluster(tmp.enter_context(work_dir(None, "bench-client-")))
            cluster.start_processes(bookies=3, brokers=1)
            service_url = cluster.service_url
        official = pulsar.Client(service_url, operation_timeout_seconds=30)
        ours = pulsarlite.Client(service_url, operation_timeout_seconds=30)
        # warm up both (connections, topic ownership)
        for module, client in ((pulsar, official), (pulsarlite, ours)):
            topic = f"bench-warm-{uuid.uuid4().hex[:6]}"
            create_subscription(module, client, topic)
            produce(module, client, topic, 2000)
            consume(module, client, topic, 2000)
        for rnd in range(args.rounds):
            for name, module, client in (("official", pulsar, official),
                                         ("pulsarlite", pulsarlite, ours)):
                topic = f"bench-{name}-{rnd}-{uuid.uuid4().hex[:6]}"
                create_subscription(module, client, topic)
                p = produce(module, client, topic, args.messages)
                c = consume(module, client, topic, args.messages)
                results.setdefault((name, "produce"), []).append(p)
                results.setdefault((name, "consume"), []).append(c)
                print(f"round {rnd} {name:10s} produce {p:10.0f} msg/s  consume {c:10.0f} msg/s",
                      flush=True)
        ours.close()
        official.close()
    finally:
        if cluster is not None:
            cluster.stop()
        tmp.close()

    print(f"\nmedians over {args.rounds} rounds, {args.messages} x 100 B messages, batching on:")
    for what in ("produce", "consume"):
        o = statistics.median(results[("official", what)])
        m = statistics.median(results[("pulsarlite", what)])
        print(f"  {what:8s} official {o:10.0f} msg/s  pulsarlite {m:10.0f} msg/s  "
              f"ratio {m / o:.2f}")
    if args.json:
        print(json.dumps({what: {"official_msg_s": statistics.median(results[("official", what)]),
                                 "pulsarlite_msg_s": statistics.median(results[("pulsarlite", what)])}
                          for what in ("produce", "consume")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
