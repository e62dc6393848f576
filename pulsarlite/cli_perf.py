"""`pulsarlite perf produce|consume`, like pulsar-perf, on pulsarlite's own client.

    pulsarlite perf produce TOPIC --rate R --size B --time S [--batch-max-messages N]
                            [--batch-delay-ms D] [-z lz4|zstd|...] [--max-pending N]
    pulsarlite perf consume TOPIC --time S [-s SUB] [-t TYPE] [-p earliest|latest]

A live line every second (rate, throughput, latency percentiles), then a final summary.
Produce latency: send to receipt. Consume latency: publish time to receipt (end to end, ms
resolution, both clocks are this machine's in tests).
"""

from __future__ import annotations

import array
import random
import sys
import threading
import time

from pulsarlite.cli_client import COMPRESSIONS, CONSUMER_TYPES

RESERVOIR_MAX = 1_000_000


class LatencyStats:
    """Latencies (ms) of one interval, and a bounded reservoir of all of them."""

    def __init__(self, seed: int = 1) -> None:
        self._lock = threading.Lock()
        self._interval = array.array("d")
        self._all = array.array("d")
        self._seen = 0
        self._random = random.Random(seed)
        self.count = 0
        self.bytes = 0

    def add(self, latency_ms: float, size: int) -> None:
        with self._lock:
            self._interval.append(latency_ms)
            self.count += 1
            self.bytes += size
            self._seen += 1
            if len(self._all) < RESERVOIR_MAX:
                self._all.append(latency_ms)
            else:
                j = self._random.randrange(self._seen)
                if j < RESERVOIR_MAX:
                    self._all[j] = latency_ms

    def take_interval(self) -> list[float]:
        with self._lock:
            out, self._interval = self._interval, array.array("d")
        return sorted(out)

    def all_sorted(self) -> list[float]:
        with self._lock:
            return sorted(self._all)


def percentile(sorted_values, q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, int(round(q / 100 * len(sorted_values))) - 1))
    return sorted_values[index]


def format_latencies(values) -> str:
    return " ".join(f"{name} {percentile(values, q):.2f}" for name, q in
                    (("p50", 50), ("p95", 95), ("p99", 99), ("p99.9", 99.9))) + \
        (f" max {values[-1]:.2f}" if values else " max nan")


def add_parser(subparsers) -> None:
    from pulsarlite.client_config import add_connection_flags

    perf = subparsers.add_parser("perf", help="load generators (like pulsar-perf)",
                                 description="Produce or consume at a rate and report "
                                             "throughput and latency percentiles.")
    sub = perf.add_subparsers(dest="perf_command", required=True)

    p = sub.add_parser("produce", help="produce at a rate, report send latency")
    p.add_argument("topic")
    p.add_argument("--rate", "-r", type=float, default=100.0,
                   help="messages per second (0: as fast as possible; default 100)")
    p.add_argument("--size", "-s", type=int, default=1024, help="payload bytes (default 1024)")
    p.add_argument("--time", "-t", type=float, default=0,
                   help="seconds to run (default 0: until interrupted)")
    p.add_argument("--num-messages", "-m", type=int, default=0,
                   help="stop after this many messages (default 0: no limit)")
    p.add_argument("--batch-max-messages", type=int, default=1000)
    p.add_argument("--batch-delay-ms", type=int, default=1)
    p.add_argument("--no-batching", action="store_true")
    p.add_argument("-z", "--compression", choices=sorted(COMPRESSIONS), default="none")
    p.add_argument("--max-pending", type=int, default=5000)
    add_connection_flags(p)
    p.set_defaults(func=run_produce)

    c = sub.add_parser("consume", help="consume, report end-to-end latency")
    c.add_argument("topic")
    c.add_argument("--subscription-name", "-s", default="perf-sub")
    c.add_argument("--subscription-type", "-t", choices=sorted(CONSUMER_TYPES),
                   default="exclusive")
    c.add_argument("--subscription-position", "-p", choices=("earliest", "latest"),
                   default="latest")
    c.add_argument("--time", type=float, default=0,
                   help="seconds to run (default 0: until interrupted)")
    c.add_argument("--num-messages", "-m", type=int, default=0,
                   help="stop after this many messages (default 0: no limit)")
    c.add_argument("--receiver-queue-size", "-q", type=int, default=1000)
    add_connection_flags(c)
    c.set_defaults(func=run_consume)


def _client(args):
    from pulsarlite.client import Client
    from pulsarlite.client_config import resolve_connection
    return Client(resolve_connection(args).service_url, operation_timeout_seconds=30)


def _live(kind: str, stats: LatencyStats, elapsed_s: float, last_count: int, interval_s: float,
          size_hint: int | None) -> int:
    values = stats.take_interval()
    count = stats.count
    rate = (count - last_count) / interval_s if interval_s > 0 else 0.0
    mbit = rate * (size_hint or 0) * 8 / 1e6
    print(f"[{elapsed_s:7.1f}s] {kind} {rate:10.1f} msg/s {mbit:8.2f} Mbit/s "
          f"latency ms: {format_latencies(values)}", flush=True)
    return count


def _summary(kind: str, stats: LatencyStats, elapsed_s: float, extra: str = "") -> None:
    values = stats.all_sorted()
    rate = stats.count / elapsed_s if elapsed_s > 0 else 0.0
    print(f"summary: {kind} {stats.count} messages in {elapsed_s:.1f}s = {rate:.1f} msg/s, "
          f"{stats.bytes / 1e6:.2f} MB; latency ms: {format_latencies(values)}{extra}",
          flush=True)


def run_produce(args) -> int:
    import pulsarlite.client as pl
    from pulsarlite.errors import PulsarliteError

    if args.size < 0 or args.rate < 0 or args.time < 0 or args.max_pending < 1:
        print("error: --size, --rate, --time must be >= 0 and --max-pending >= 1",
              file=sys.stderr)
        return 2
    payload = bytes(random.Random(7).getrandbits(8) for _ in range(min(args.size, 4096)))
    payload = (payload * (args.size // max(1, len(payload)) + 1))[:args.size]
    stats = LatencyStats()
    failures = [0]
    try:
        client = _client(args)
    except PulsarliteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        producer = client.create_producer(
            args.topic, batching_enabled=not args.no_batching,
            batching_max_messages=args.batch_max_messages,
            batching_max_publish_delay_ms=args.batch_delay_ms,
            compression_type=getattr(pl.CompressionType, COMPRESSIONS[args.compression]),
            max_pending_messages=args.max_pending, block_if_queue_full=True)
        size = len(payload)
        now = time.perf_counter
        add = stats.add
        ok = pl.Result.Ok

        def callback_for(t0):
            def done(res, mid):
                if res == ok:
                    add((now() - t0) * 1000, size)
                else:
                    failures[0] += 1
            return done

        start = now()
        end = start + args.time if args.time else float("inf")
        next_report = start + 1
        last_count = 0
        last_report = start
        sent = 0
        interval = 1 / args.rate if args.rate > 0 else 0
        next_at = start
        try:
            while True:
                t = now()
                if t >= end or (args.num_messages and sent >= args.num_messages):
                    break
                if t >= next_report:
                    last_count = _live("produced", stats, t - start, last_count, t - last_report,
                                       size)
                    last_report = t
                    next_report += 1
                if interval:
                    if next_at > t:
                        time.sleep(min(next_at - t, 0.05))
                        continue
                    next_at += interval
                producer.send_async(payload, callback_for(now()))
                sent += 1
        except KeyboardInterrupt:
            pass
        producer.flush()
        elapsed = now() - start
        producer.close()
        _summary("produced", stats, elapsed, f"; failed {failures[0]}")
        return 0 if failures[0] == 0 else 1
    except PulsarliteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()


def run_consume(args) -> int:
    import pulsarlite.client as pl
    from pulsarlite.errors import PulsarliteError

    if args.time < 0:
        print("error: --time must be >= 0", file=sys.stderr)
        return 2
    stats = LatencyStats()
    try:
        client = _client(args)
    except PulsarliteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        consumer = client.subscribe(
            args.topic, args.subscription_name,
            consumer_type=getattr(pl.ConsumerType, CONSUMER_TYPES[args.subscription_type]),
            initial_position=(pl.InitialPosition.Earliest
                              if args.subscription_position == "earliest"
                              else pl.InitialPosition.Latest),
            receiver_queue_size=args.receiver_queue_size)
        start = time.perf_counter()
        end = start + args.time if args.time else float("inf")
        next_report = start + 1
        last_report = start
        last_count = 0
        size_hint = None
        try:
            while True:
                t = time.perf_counter()
                if t >= end or (args.num_messages and stats.count >= args.num_messages):
                    break
                if t >= next_report:
                    last_count = _live("consumed", stats, t - start, last_count,
                                       t - last_report, size_hint)
                    last_report = t
                    next_report += 1
                try:
                    msg = consumer.receive(timeout_millis=200)
                except pl.Timeout:
                    continue
                data = msg.data()
                size_hint = len(data)
                stats.add(max(0.0, time.time() * 1000 - msg.publish_timestamp()), len(data))
                consumer.acknowledge(msg)
        except KeyboardInterrupt:
            pass
        elapsed = time.perf_counter() - start
        consumer.close()
        _summary("consumed", stats, elapsed)
        return 0
    except PulsarliteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
