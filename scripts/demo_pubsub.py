"""Produce to and consume from a pulsarlite broker with the official Pulsar client.

    .venv/bin/python scripts/demo_pubsub.py pulsar://127.0.0.1:PORT [--messages N]

Used by scripts/run.sh to show the cluster working end to end; any Pulsar client works the same.
"""

from __future__ import annotations

import argparse
import sys
import time

import pulsar


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("service_url")
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--topic", default=f"persistent://public/default/demo-{int(time.time())}")
    args = parser.parse_args()
    client = pulsar.Client(args.service_url, operation_timeout_seconds=30,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        consumer = client.subscribe(args.topic, "demo", consumer_type=pulsar.ConsumerType.Exclusive,
                                    initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(args.topic, batching_enabled=True,
                                          compression_type=pulsar.CompressionType.ZSTD)
        started = time.monotonic()
        for i in range(args.messages):
            producer.send_async(f"message {i}".encode(), None)
        producer.flush()
        produced_s = time.monotonic() - started
        received = []
        for _ in range(args.messages):
            msg = consumer.receive(timeout_millis=30_000)
            received.append(msg.data().decode())
            consumer.acknowledge(msg)
        ok = received == [f"message {i}" for i in range(args.messages)]
        print(f"topic {args.topic}: produced {args.messages} messages in {produced_s:.2f}s, "
              f"consumed {len(received)} in order: {'yes' if ok else 'NO'}; last message id {msg.message_id()}")
        return 0 if ok else 1
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
