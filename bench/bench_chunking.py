"""Chunked messages end to end: pulsarlite's client vs the official client (pulsar-client 3.x),
each producing 12 MiB messages with chunking on (5 MiB maximum: 3 chunks each; blocking send,
one message at a time) and then consuming them back (subscribe, receive + ack) through the same
broker, in one run; beside them, the same bytes as
plain 4 MiB messages (no chunking) with the same client, the reference for what chunking costs.

    .venv/bin/python bench/bench_chunking.py [--messages 8] [--rounds 3] [--service-url URL]

Without --service-url it starts a local cluster (3 bookies, 1 broker) in a temporary
directory. Figures are medians in MB/s of payload; ratios are ours / official and chunked /
plain per client.
"""

from __future__ import annotations

import argparse
import contextlib
import random
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

MIB = 1024 * 1024


def run(module, client, size: int, n: int, chunked: bool) -> tuple[float, float]:
    """(produce MB/s, consume MB/s) of ``n`` messages of ``size`` bytes on a fresh topic."""
    topic = f"bench-chunk-{uuid.uuid4().hex[:8]}"
    # the subscription exists before producing; its consumer connects after (else it would
    # prefetch while the producer runs and the consume figure would time a local queue)
    client.subscribe(topic, "sub", initial_position=module.InitialPosition.Earliest).close()
    producer = client.create_producer(topic, chunking_enabled=chunked, batching_enabled=False,
                                      send_timeout_millis=120_000)
    payload = random.Random(size).randbytes(size)
    start = time.perf_counter()
    for _ in range(n):
        producer.send(payload)
    produce_s = time.perf_counter() - start
    start = time.perf_counter()
    consumer = client.subscribe(topic, "sub", initial_position=module.InitialPosition.Earliest)
    for _ in range(n):
        msg = consumer.receive(120_000)
        if len(msg.data()) != size:
            raise SystemExit(f"got {len(msg.data())} bytes, sent {size}")
        consumer.acknowledge(msg)
    consume_s = time.perf_counter() - start
    producer.close()
    consumer.close()
    mb = size * n / 1e6
    return mb / produce_s, mb / consume_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=8, help="12 MiB messages a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--service-url", default=None)
    args = parser.parse_args()
    cluster = None
    tmp = contextlib.ExitStack()          # the cluster's temporary directory, if one is started
    service_url = args.service_url
    results: dict[tuple[str, str, str], list[float]] = {}
    try:
        if service_url is None:
            cluster = LocalCluster(tmp.enter_context(work_dir(None, "bench-chunking-")))
            cluster.start_processes(bookies=3, brokers=1)
            service_url = cluster.service_url
        official = pulsar.Client(service_url, operation_timeout_seconds=60)
        ours = pulsarlite.Client(service_url, operation_timeout_seconds=60)
        for module, client in ((pulsar, official), (pulsarlite, ours)):   # warm up
            run(module, client, 12 * MIB, 1, True)
        for rnd in range(args.rounds):
            for name, module, client in (("official", pulsar, official), ("pulsarlite", pulsarlite, ours)):
                for kind, size, n, chunked in (("chunked 12MiB", 12 * MIB, args.messages, True),
                                               ("plain 4MiB", 4 * MIB, args.messages * 3, False)):
                    p, c = run(module, client, size, n, chunked)
                    results.setdefault((name, kind, "produce"), []).append(p)
                    results.setdefault((name, kind, "consume"), []).append(c)
                    print(f"round {rnd} {name:10s} {kind:14s} produce {p:7.1f} MB/s  consume {c:7.1f} MB/s",
                          flush=True)
        ours.close()
        official.close()
    finally:
        if cluster is not None:
            cluster.stop()
        tmp.close()
    med = {k: statistics.median(v) for k, v in results.items()}
    print("\nmedians (MB/s of payload):")
    for (name, kind, what), value in sorted(med.items()):
        print(f"  {name:10s} {kind:14s} {what:8s} {value:7.1f}")
    print("\nratios:")
    for what in ("produce", "consume"):
        print(f"  {what}: chunked ours/official "
              f"{med[('pulsarlite', 'chunked 12MiB', what)] / med[('official', 'chunked 12MiB', what)]:.2f}; "
              f"chunked/plain official {med[('official', 'chunked 12MiB', what)] / med[('official', 'plain 4MiB', what)]:.2f}, "
              f"ours {med[('pulsarlite', 'chunked 12MiB', what)] / med[('pulsarlite', 'plain 4MiB', what)]:.2f}")


if __name__ == "__main__":
    main()
