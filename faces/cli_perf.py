"""`pulsarlite perf produce|consume`, like pulsar-perf, on pulsarlite's own client.

    pulsarlite perf produce TOPIC --rate R --size B --time S [--batch-max-messages N]
                            [--batch-delay-ms D] [-z lz4|zstd|...] [--max-pending N]
    pulsarlite perf consume TOPIC --time S [-s SUB] [-t TYPE] [-p earliest|latest]

A live line every second (rate, throughput, latency percentiles), then a final summary that
ends with this process's CPU per message over the timed window (``client cpu X us/msg``).
Produce latency: send to receipt. Consume latency: publish time to receipt (end to end, ms
resolution, both clocks are this machine's in tests).
"""

from __future__ import annotations

import array
import collections
import random
from functools import partial
import sys
import threading
import time

from faces.cli_client import COMPRESSIONS, CONSUMER_TYPES

# latencies kept for the summary's percentiles: an even sample of the whole run (p99.9 still
# rests on ~260 samples); sorting it at the end costs ~0.1 s, a million took ~0.35 s
RESERVOIR_MAX = 1 << 18


class LatencyStats:
    """Latencies (ms) of one interval, and a bounded sample of all of them: every latency
    while there are at most RESERVOIR_MAX, then every 2nd, 4th, ... (when the sample fills
    up, every other one is dropped and the stride doubles: an even sample over the whole
    run, kept by slicing arrays in C, no Python work per message).

    ``add`` / ``add_latency`` are the hot path (once per timed message) and take no lock: each
    LatencyStats has ONE writer thread (the produce callbacks all run on the client's I/O
    thread; consume adds on the main thread). The reporter swaps the interval array out (one
    reference assignment, atomic under the GIL) and folds it into the sample; an add racing
    with that swap may land in the swapped-out array after it was read, i.e. one latency may
    be missing from the percentiles (never from ``count`` or ``bytes``).
    """

    def __init__(self) -> None:
        self._fold_lock = threading.Lock()   # reporter side only (never taken by add)
        self._interval = array.array("d")
        self._all = array.array("d")
        self._seen = 0
        self._stride = 1
        self.count = 0
        self.bytes = 0

    def add(self, latency_ms: float, size: int) -> None:
        """A latency, counted as one message of ``size`` bytes."""
        self._interval.append(latency_ms)
        self.count += 1
        self.bytes += size

    def add_latency(self, latency_ms: float) -> None:
        """A latency only (the caller counts messages elsewhere)."""
        self._interval.append(latency_ms)

    def _fold(self, values: array.array) -> None:
        """Into the sample: the latencies whose index over the run is a multiple of the
        stride."""
        with self._fold_lock:
            stride = self._stride
            self._all.extend(values if stride == 1 else values[(-self._seen) % stride::stride])
            self._seen += len(values)
            while len(self._all) > RESERVOIR_MAX:
                self._all = self._all[::2]
                self._stride *= 2

    def take_interval(self) -> list[float]:
        out, self._interval = self._interval, array.array("d")
        self._fold(out)
        return sorted(out)

    def all_sorted(self) -> list[float]:
        """Every latency so far (the reservoir), the current interval's included."""
        out, self._interval = self._interval, array.array("d")
        self._fold(out)
        with self._fold_lock:
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
    p.add_argument("--latency-every", type=int, default=16, metavar="N",
                   help="time 1 message in N, sent with a callback (default 16; 1: every "
                        "message). Counts are exact for every message either way")
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
    conf = resolve_connection(args)
    return Client(conf.service_url, operation_timeout_seconds=30, **conf.client_kwargs())


def _live(kind: str, stats: LatencyStats, elapsed_s: float, last_count: int, interval_s: float,
          size_hint: int | None, count: int | None = None) -> int:
    """Print one live line; ``count`` (default: the stats' own) is the messages so far."""
    values = stats.take_interval()
    count = stats.count if count is None else count
    rate = (count - last_count) / interval_s if interval_s > 0 else 0.0
    mbit = rate * (size_hint or 0) * 8 / 1e6
    print(f"[{elapsed_s:7.1f}s] {kind} {rate:10.1f} msg/s {mbit:8.2f} Mbit/s "
          f"latency ms: {format_latencies(values)}", flush=True)
    return count


def _cpu_per_message(cpu_s: float, messages: int) -> str:
    """This process's CPU (every thread: the caller's and the client's I/O thread) over the
    timed window, per message."""
    return f"; client cpu {cpu_s / messages * 1e6:.2f} us/msg" if messages else ""


def _summary(kind: str, stats: LatencyStats, elapsed_s: float, extra: str = "",
             count: int | None = None, nbytes: int | None = None) -> None:
    values = stats.all_sorted()
    count = stats.count if count is None else count
    nbytes = stats.bytes if nbytes is None else nbytes
    rate = count / elapsed_s if elapsed_s > 0 else 0.0
    print(f"summary: {kind} {count} messages in {elapsed_s:.1f}s = {rate:.1f} msg/s, "
          f"{nbytes / 1e6:.2f} MB; latency ms: {format_latencies(values)}{extra}",
          flush=True)


def run_produce(args) -> int:
    import pulsarlite.client as pl
    from pulsarlite.errors import PulsarliteError

    if args.size < 0 or args.rate < 0 or args.time < 0 or args.max_pending < 1 \
            or args.latency_every < 1:
        print("error: --size, --rate, --time must be >= 0, --max-pending and --latency-every "
              ">= 1", file=sys.stderr)
        return 2
    payload = bytes(random.Random(7).getrandbits(8) for _ in range(min(args.size, 4096)))
    payload = (payload * (args.size // max(1, len(payload)) + 1))[:args.size]
    stats = LatencyStats()
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
        ok = pl.Result.Ok
        # Counts (acked, failed) come from the producer, for every message; latency from a
        # callback on 1 message in --latency-every (the others are sent without one). A Python
        # callback per message costs the client's I/O thread ~0.6 us of its ~1.7 us per batched
        # message (BENCHMARKS.md): timing every message slows what is measured.
        every = args.latency_every
        counts = producer.acked_and_failed
        add_latency = stats.add_latency

        def done(t0, res, mid):   # on the client's I/O thread; partial(done, t0) per timed one
            if res is ok:
                add_latency((now() - t0) * 1000)

        # One producer (a topic of one partition) completes its sends in send order: then the
        # send times wait in a FIFO of floats and ONE callback serves every timed message (no
        # object per message for the garbage collector to trace; a send refused out of order
        # -- a failure, counted as such -- would shift the times of the sends pending with it).
        # A partitioned topic's producers complete in their own orders: a partial per message.
        in_order = len(client.get_topic_partitions(args.topic)) == 1
        sent_at: collections.deque = collections.deque()
        record = sent_at.append
        take = sent_at.popleft

        def done_in_order(res, mid):
            t0 = take()
            if res is ok:
                add_latency((now() - t0) * 1000)

        start = now()
        cpu_start_s = time.process_time()
        end = start + args.time if args.time else float("inf")
        next_report = start + 1
        last_count = 0
        last_report = start
        sent = 0
        interval = 1 / args.rate if args.rate > 0 else 0
        next_at = start
        send_async = producer.send_async
        limit = args.num_messages or float("inf")
        try:
            while True:
                t = now()
                if t >= end or sent >= limit:
                    break
                if t >= next_report:
                    last_count = _live("produced", stats, t - start, last_count, t - last_report,
                                       size, counts()[0])
                    last_report = t
                    next_report += 1
                    continue   # a fresh clock reading for the next send time
                if interval:
                    if next_at > t:
                        time.sleep(min(next_at - t, 0.05))
                        continue
                    next_at += interval
                if sent % every:
                    send_async(payload, None)
                elif in_order:
                    record(t)
                    send_async(payload, done_in_order)
                else:
                    send_async(payload, partial(done, t))
                sent += 1
        except KeyboardInterrupt:
            pass
        producer.flush()
        elapsed = now() - start
        cpu_s = time.process_time() - cpu_start_s
        acked, failed = counts()
        producer.close()
        timed = f"; latency of 1 message in {every}" if every > 1 else ""
        _summary("produced", stats, elapsed, f"; failed {failed}"
                 + _cpu_per_message(cpu_s, acked + failed) + timed, acked, acked * size)
        return 0 if failed == 0 else 1
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
        cpu_start_s = time.process_time()
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
        cpu_s = time.process_time() - cpu_start_s
        consumer.close()
        _summary("consumed", stats, elapsed, _cpu_per_message(cpu_s, stats.count))
        return 0
    except PulsarliteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
