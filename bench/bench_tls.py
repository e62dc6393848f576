"""Produce and consume with TLS on vs off, against the same broker in one run ([security]).

    .venv/bin/python bench/bench_tls.py [--messages 50000] [--rounds 5] [--size 1024]
                                        [--client official|pulsarlite] [--unbatched-messages 5000] [--json]

Starts a local cluster (3 bookies, 1 broker, E3/Qw3/Qa2, fsync on) whose broker has both a plain
listener and a TLS one (``broker_service_port_tls``; a CA and a certificate for 127.0.0.1 made at
start with trustme, nothing kept). Two clients of the same kind: ``pulsar://`` and ``pulsar+ssl://``
(trust file, hostname validated). Each round runs the pair back to back, in alternating order
(plain first in even rounds, TLS first in odd ones), on fresh topics: batched produce
(send_async + flush), unbatched produce (send, one at a time: per-message latency dominated), then
consume (receive + ack). Besides msg/s, the broker's CPU microseconds per message over each phase
(from /proc). The ratio of a round is TLS / plain of that round; the figure is the median of the
per-round ratios (the machine is shared: pairs measured together compare fairly).
Not a test: figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
import uuid

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import pulsar  # noqa: E402
import trustme  # noqa: E402

import pulsarlite  # noqa: E402
from bench.common import work_dir  # noqa: E402
from faces.cluster import LocalCluster  # noqa: E402
from pulsarlite.zk_server import find_free_port  # noqa: E402

from bench_broker import process_cpu_s  # noqa: E402


class Phase:
    """msg/s and the broker's CPU µs per message of one timed phase."""

    def __init__(self, broker_pid: int) -> None:
        self.pid = broker_pid

    def __enter__(self):
        self.cpu0, self.t0 = process_cpu_s(self.pid), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.elapsed_s = time.perf_counter() - self.t0
        self.cpu_s = process_cpu_s(self.pid) - self.cpu0

    def figures(self, n: int) -> dict:
        return {"msg_s": n / self.elapsed_s, "broker_cpu_us_per_msg": self.cpu_s / n * 1e6}


def produce_batched(module, client, topic: str, n: int, payload: bytes) -> None:
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=1000,
                                      batching_max_publish_delay_ms=10, max_pending_messages=20000,
                                      block_if_queue_full=True)
    errors = []

    def done(res, mid):
        if res != module.Result.Ok:
            errors.append(res)
    for _ in range(n):
        producer.send_async(payload, done)
    producer.flush()
    producer.close()
    if errors:
        raise SystemExit(f"{len(errors)} sends failed: {errors[0]}")


def produce_unbatched(client, topic: str, n: int, payload: bytes) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    for _ in range(n):
        producer.send(payload)
    producer.close()


def consume(module, client, topic: str, n: int) -> None:
    consumer = client.subscribe(topic, "bench", initial_position=module.InitialPosition.Earliest,
                                receiver_queue_size=1000)
    for _ in range(n):
        consumer.acknowledge(consumer.receive(30_000))
    consumer.close()


def one_side(module, client, pid: int, args, payload: bytes, tag: str) -> dict:
    out = {}
    topic = f"persistent://public/default/bench-tls-{tag}-{uuid.uuid4().hex[:6]}"
    client.subscribe(topic, "bench", initial_position=module.InitialPosition.Earliest).close()
    with Phase(pid) as p:
        produce_batched(module, client, topic, args.messages, payload)
    out["produce_batched"] = p.figures(args.messages)
    with Phase(pid) as p:
        consume(module, client, topic, args.messages)
    out["consume"] = p.figures(args.messages)
    if args.unbatched_messages:
        topic_u = topic + "-u"
        with Phase(pid) as p:
            produce_unbatched(client, topic_u, args.unbatched_messages, payload)
        out["produce_unbatched"] = p.figures(args.unbatched_messages)
    return out


def _ratio(a: float, b: float) -> float:
    """a / b; nan when b is 0 (a phase too short for the 10 ms CPU clock)."""
    return a / b if b else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--unbatched-messages", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=1024, help="payload bytes")
    parser.add_argument("--client", choices=("official", "pulsarlite"), default="official")
    parser.add_argument("--json", action="store_true", help="also print the medians as one JSON object")
    args = parser.parse_args()
    module = pulsar if args.client == "official" else pulsarlite
    payload = os.urandom(args.size)

    with work_dir(None, "bench-tls-") as d:
        ca = trustme.CA()
        leaf = ca.issue_cert("127.0.0.1")
        ca.cert_pem.write_to_path(str(d / "ca.pem"))
        leaf.cert_chain_pems[0].write_to_path(str(d / "broker.pem"))
        leaf.private_key_pem.write_to_path(str(d / "broker.key"))
        port_tls = find_free_port()
        cluster = LocalCluster(d / "cluster")
        try:
            cluster.start_processes(bookies=3, brokers=1, broker_overrides={
                "broker_service_port_tls": port_tls, "tls_certificate_file_path": str(d / "broker.pem"),
                "tls_key_file_path": str(d / "broker.key")})
            pid = cluster.records["broker-1"].pid
            quiet = {"logger": pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)} if module is pulsar else {}
            plain = module.Client(cluster.service_url, operation_timeout_seconds=30, **quiet)
            tls = module.Client(f"pulsar+ssl://127.0.0.1:{port_tls}", operation_timeout_seconds=30,
                                tls_trust_certs_file_path=str(d / "ca.pem"), tls_validate_hostname=True, **quiet)
            sides = {"plain": plain, "tls": tls}
            for name, client in sides.items():      # warm up: connections, topic loads, ledgers
                warm = argparse.Namespace(messages=2000, unbatched_messages=200)
                one_side(module, client, pid, warm, payload, f"warm-{name}")
            rounds = []
            for rnd in range(args.rounds):
                order = ("plain", "tls") if rnd % 2 == 0 else ("tls", "plain")
                result = {name: one_side(module, sides[name], pid, args, payload, f"{name}-{rnd}") for name in order}
                rounds.append(result)
                print(f"round {rnd} ({' then '.join(order)}): " + "  ".join(
                    f"{what} plain {result['plain'][what]['msg_s']:8.0f} tls {result['tls'][what]['msg_s']:8.0f} msg/s"
                    for what in result["plain"]), file=sys.stderr, flush=True)
            plain.close()
            tls.close()
        finally:
            cluster.stop()

    phases = list(rounds[0]["plain"])
    summary = {}
    print(f"\nTLS on vs off, {args.client} client, {args.size} B messages, {args.rounds} rounds "
          f"(batched {args.messages}, unbatched {args.unbatched_messages} per round), medians:\n")
    print("| phase | plain msg/s | TLS msg/s | TLS/plain (median of per-round ratios) "
          "| broker CPU µs/msg plain | TLS | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for what in phases:
        med = lambda side, key: statistics.median(r[side][what][key] for r in rounds)  # noqa: E731
        ratio = statistics.median(r["tls"][what]["msg_s"] / r["plain"][what]["msg_s"] for r in rounds)
        cpu_ratio = statistics.median(_ratio(r["tls"][what]["broker_cpu_us_per_msg"],
                                             r["plain"][what]["broker_cpu_us_per_msg"]) for r in rounds)
        summary[what] = {"plain_msg_s": med("plain", "msg_s"), "tls_msg_s": med("tls", "msg_s"),
                         "tls_over_plain": ratio,
                         "plain_broker_cpu_us_per_msg": med("plain", "broker_cpu_us_per_msg"),
                         "tls_broker_cpu_us_per_msg": med("tls", "broker_cpu_us_per_msg"),
                         "cpu_tls_over_plain": cpu_ratio}
        s = summary[what]
        print(f"| {what} | {s['plain_msg_s']:.0f} | {s['tls_msg_s']:.0f} | {ratio:.2f} "
              f"| {s['plain_broker_cpu_us_per_msg']:.1f} | {s['tls_broker_cpu_us_per_msg']:.1f} | {cpu_ratio:.2f} |")
    if args.json:
        print(json.dumps(dict(summary, settings={"client": args.client, "size": args.size, "rounds": args.rounds,
                                                 "messages": args.messages,
                                                 "unbatched_messages": args.unbatched_messages})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
