"""Broker benchmark with the official Python client: 1 broker, 3 bookies, E3/Qw3/Qa2, fsync on.

    .venv/bin/python bench/bench_broker.py [--seconds S] [--dir D] [--profile]
                                           [--paced-rate 5000] [--e2e-rate 2000] [--no-ceiling]
                                           [--ceilings batched,unbatched,perf]
                                           [--phases unbatched,paced] [--paced-sample-every 10]
                                           [--broker-set key=value ...] [--bookie-set key=value ...]

Besides rates, each phase reports the CPU microseconds per acknowledged message of every process
(process CPU seconds over the phase / messages): far steadier than msg/s on a shared machine.
With PULSARLITE_LOOP_MONITOR_MS=10 in the environment the broker and bookies log event-loop
lags and GC pauses (pulsarlite/loop_monitor.py) into the cluster's logs.

Starts a fresh local cluster (3 bookies, 1 broker) and, with ``pulsar.Client`` (C++ core), runs
in one process, one phase after the other (each bounded by --seconds):

  ceiling     the batched and unbatched loops below against a broker that stores nothing (a
              Pulsar-protocol responder in its own process): the client's own limit, this run;
              and (when the perf phase runs) `pulsarlite perf produce` against it, the same
              command as the perf phase: our client's own limit ("ceiling perf")
  warmup      batched produce for up to 3 s (topic load, ledger creation, connections settle)
  batched     send_async, batching on (max delay 10 ms), block_if_queue_full, at most --window
              messages outstanding; msg/s and MB/s counted by ack callbacks (one per 100
              messages: receipts come in order; see Counter)
  unbatched   the same with batching off (window --unbatched-window)
  paced       unbatched at a fixed --paced-rate: publish latency = callback time - send time
  paced-batched  the same with the client's batching on, a --paced-batch-delay-ms window (1 ms:
              pulsar-perf's default), so a message's latency includes its wait in the batch
  e2e         unbatched at --e2e-rate; the payload carries the send time, a consumer on another
              thread (same process) measures receive time - send time
  catch-up    a new subscription from earliest reads the batched topic back (batch_receive,
              no acks): msg/s and MB/s
  perf        `pulsarlite perf produce` (our own client, batching on, --rate 0) in its own process
              for --seconds: msg/s from its summary, its CPU per message from the child's rusage

Also the CPU (% of one core) of the broker, each bookie and this client process over each phase:
the machine has 2 cores shared by all of them ("others" = every other process on the machine,
from /proc/stat). With --profile, the batched and the unbatched phases are repeated with py-spy
attached to the broker (``--gil``: only samples where a broker thread holds the GIL, i.e. where
its Python CPU goes) after the measured phases, and the top frames printed.
A live rate line goes to stderr once a second; the results are markdown tables on stdout.
Not a test: no assertions, figures only.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import pathlib
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import pulsar  # noqa: E402

from bench.common import work_dir  # noqa: E402
from faces.cluster import LocalCluster  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
STAMP = struct.Struct("<d")  # perf_counter at send, at the start of the payload


# -- measuring ----------------------------------------------------------------------------------
def process_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds all cores spent busy (not idle, not waiting for I/O) since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds of the broker, the bookies, this process and every other process."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids

    def snapshot(self) -> dict[str, float]:
        snap = {name: process_cpu_s(pid) for name, pid in self.pids.items()}
        snap["client"] = time.process_time()
        snap["machine"] = machine_busy_s()
        return snap

    @staticmethod
    def percent(before: dict[str, float], after: dict[str, float], elapsed: float) -> dict[str, float]:
        per = {name: (after[name] - before[name]) / elapsed * 100 for name in before}
        machine = per.pop("machine")
        per["others"] = max(0.0, machine - sum(per.values()))
        return per


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


class Counter:
    """Acknowledged messages. A callback goes with every ``every``-th message only: a producer's
    receipts arrive in order, so that callback acknowledges the ``every`` messages up to it. (A
    Python callback per message costs a GIL hand-off to the client's IO thread per message and
    caps the client near 30-40k msg/s on this machine, whatever the broker.) Callbacks come from
    the client's single IO thread."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.acked = 0
        self.failed = 0
        self.first_error = None

    def callback(self, res, _msg_id) -> None:
        if res == pulsar.Result.Ok:
            self.acked += self.every
        else:
            self.failed += self.every
            if self.first_error is None:
                self.first_error = str(res)


class Live:
    """A thread printing the rate of ``read()`` once a second on stderr."""

    def __init__(self, label: str, read, unit: str = "msg/s") -> None:
        self.label, self.read, self.unit = label, read, unit
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Live":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join()

    def _run(self) -> None:
        started = last_t = time.perf_counter()
        last = self.read()
        while not self.stop_event.wait(1.0):
            now, count = time.perf_counter(), self.read()
            print(f"  [{self.label}] {now - started:5.1f}s {(count - last) / (now - last_t):10.0f} {self.unit}"
                  f"  total {count}", file=sys.stderr, flush=True)
            last_t, last = now, count


# -- phases ------------------------------------------------------------------------------------
def produce_windowed(client, topic: str, seconds: float, size: int, window: int, batching: bool,
                     label: str, ack_every: int = 100) -> dict:
    """send_async as fast as the window allows (block_if_queue_full bounds what is outstanding);
    acknowledged messages counted by callbacks (one per ``ack_every`` messages, see Counter)."""
    producer = client.create_producer(topic, batching_enabled=batching, batching_max_publish_delay_ms=10,
                                      batching_max_messages=1000, block_if_queue_full=True,
                                      max_pending_messages=window, send_timeout_millis=60_000)
    payload = os.urandom(size)
    counter = Counter(ack_every)
    cb = counter.callback
    send = producer.send_async
    quiet = range(ack_every - 1)
    with Live(label, lambda: counter.acked):
        started = time.perf_counter()
        deadline = started + seconds
        sent = 0
        while time.perf_counter() < deadline:
            for _ in quiet:
                send(payload, None)
            send(payload, cb)
            sent += ack_every
        producer.flush()
        elapsed = time.perf_counter() - started
    producer.close()
    return {"sent": sent, "acked": counter.acked, "failed": counter.failed, "error": counter.first_error,
            "seconds": elapsed, "ack_every": ack_every,
            "msg_s": counter.acked / elapsed, "mb_s": counter.acked * size / elapsed / 1e6}


# the phases --phases chooses from, in the order they run (the ceiling and py-spy runs are not)
PHASES = ("warmup", "batched", "unbatched", "paced", "paced-batched", "e2e", "catch-up", "perf")


def perf_produce(service_url: str, admin_url: str, topic: str, seconds: float, size: int, window: int,
                 latency_every: int) -> dict:
    """`pulsarlite perf produce` (our own client, batching on, as fast as it goes) in its own
    process against the same cluster: msg/s from its summary line, its CPU from the child's
    rusage."""
    import re
    import resource
    cmd = [sys.executable, "-m", "pulsarlite", "perf", "produce", topic, "--rate", "0", "--size", str(size),
           "--time", str(seconds), "--max-pending", str(window), "--batch-max-messages", "1000",
           "--batch-delay-ms", "10", "--latency-every", str(latency_every),
           "--service-url", service_url, "--admin-url", admin_url]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=seconds + 120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    for line in done.stdout.splitlines():
        if line.startswith("[") or line.startswith("summary:"):
            print(f"  [perf produce] {line}", file=sys.stderr, flush=True)
    m = re.search(r"summary: produced (\d+) messages in ([\d.]+)s = ([\d.]+) msg/s.*failed (\d+)", done.stdout)
    if done.returncode not in (0, 1) or m is None:
        return {"acked": 0, "failed": -1, "error": done.stdout[-500:], "msg_s": 0.0, "mb_s": 0.0}
    acked, elapsed = int(m.group(1)), float(m.group(2))
    cpu_s = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"acked": acked, "failed": int(m.group(4)), "error": None, "seconds": elapsed,
            "msg_s": float(m.group(3)), "mb_s": acked * size / elapsed / 1e6,
            "client_cpu_us": cpu_s / acked * 1e6 if acked else None}


def produce_paced(client, topic: str, seconds: float, size: int, rate: float, label: str,
                  sample_every: int = 1, batch_delay_ms: int | None = None) -> dict:
    """send_async at a fixed rate; latency = ack callback time - send time, measured on every
    ``sample_every``-th message (a Python callback per message costs the client a GIL hand-off
    each: at 5k/s that is ~40% of a core of the 2, which itself delays everything). Unbatched, or
    with ``batch_delay_ms`` the client's batching on with that window (a message's latency then
    includes its wait in the open batch)."""
    batching = {"batching_enabled": False} if batch_delay_ms is None else {
        "batching_enabled": True, "batching_max_publish_delay_ms": batch_delay_ms,
        "batching_max_messages": 1000}
    producer = client.create_producer(topic, block_if_queue_full=True, max_pending_messages=100_000,
                                      send_timeout_millis=60_000, **batching)
    filler = os.urandom(max(0, size - STAMP.size))
    latencies: list[float] = []
    failed = [0]

    def done(t0: float):
        def cb(res, _msg_id) -> None:
            if res == pulsar.Result.Ok:
                latencies.append(time.perf_counter() - t0)
            else:
                failed[0] += 1
        return cb

    with Live(label, lambda: len(latencies)):
        started = time.perf_counter()
        sent = 0
        while (now := time.perf_counter()) - started < seconds:
            due = int((now - started) * rate)
            while sent < due:
                t0 = time.perf_counter()
                producer.send_async(STAMP.pack(t0) + filler, done(t0) if sent % sample_every == 0 else None)
                sent += 1
            time.sleep(max(0.0, started + (sent + 1) / rate - time.perf_counter()))
        producer.flush()
        elapsed = time.perf_counter() - started
    producer.close()
    return {"sent": sent, "acked": len(latencies) * sample_every, "sampled": len(latencies),
            "sample_every": sample_every, "failed": failed[0], "seconds": elapsed,
            "achieved": sent / elapsed, "p50_ms": pct(latencies, 50) * 1e3, "p99_ms": pct(latencies, 99) * 1e3,
            "max_ms": max(latencies, default=float("nan")) * 1e3}


def broker_publish_buckets(admin_url: str) -> dict[float, float]:
    """The broker's SEND-to-receipt histogram (``pulsarlite_publish_latency_seconds``), summed
    over its series: {bucket upper bound in s: cumulative count}."""
    return histogram_buckets(admin_url + "/metrics", "pulsarlite_publish_latency_seconds")


def histogram_buckets(*urls_then_metric: str) -> dict[float, float]:
    """A Prometheus histogram's buckets summed over its series and over the ``/metrics`` URLs
    given (the last argument is the metric's name): {bucket upper bound in s: cumulative count}."""
    import re
    import urllib.request
    *urls, metric = urls_then_metric
    out: dict[float, float] = {}
    for url in urls:
        with urllib.request.urlopen(url, timeout=30) as r:
            text = r.read().decode()
        for m in re.finditer(rf'^{metric}_bucket\{{[^}}]*le="([^"]+)"[^}}]*\}} (\S+)$', text, re.M):
            le = float(m.group(1))
            out[le] = out.get(le, 0.0) + float(m.group(2))
    return out


def bucket_quantile_ms(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The upper bound (ms) of the first bucket holding the q-quantile of what was observed
    between two scrapes: "p99 <= this". None if nothing was observed."""
    bounds = sorted(after)
    total = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)
    if total <= 0:
        return None
    for le in bounds:
        if after[le] - before.get(le, 0.0) >= q * total:
            return le * 1000
    return float("inf")


def end_to_end(client, topic: str, seconds: float, size: int, rate: float, label: str) -> dict:
    """Paced unbatched produce; a consumer thread measures receive time - send time."""
    consumer = client.subscribe(topic, "e2e", consumer_type=pulsar.ConsumerType.Exclusive,
                                initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=1000)
    latencies: list[float] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            try:
                msg = consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            except Exception:  # closed under us
                return
            latencies.append(time.perf_counter() - STAMP.unpack_from(msg.data())[0])
            consumer.acknowledge(msg)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    produced = produce_paced(client, topic, seconds, size, rate, label)
    deadline = time.perf_counter() + 10
    while len(latencies) < produced["acked"] and time.perf_counter() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join()
    consumer.close()
    return {"sent": produced["sent"], "received": len(latencies), "achieved": produced["achieved"],
            "p50_ms": pct(latencies, 50) * 1e3, "p99_ms": pct(latencies, 99) * 1e3,
            "max_ms": max(latencies, default=float("nan")) * 1e3, "publish_p99_ms": produced["p99_ms"],
            "seconds": produced["seconds"]}


def catch_up(client, topic: str, expected: int, seconds: float, size: int, label: str) -> dict:
    """A new subscription from earliest reads the topic back (batch_receive, no acks)."""
    policy = pulsar.ConsumerBatchReceivePolicy(1000, 1 << 20, 10)
    consumer = client.subscribe(topic, "catch-up", consumer_type=pulsar.ConsumerType.Exclusive,
                                initial_position=pulsar.InitialPosition.Earliest,
                                receiver_queue_size=10_000, batch_receive_policy=policy)
    got = [0]
    with Live(label, lambda: got[0]):
        started = time.perf_counter()
        deadline = started + seconds
        idle_since = None
        while got[0] < expected and time.perf_counter() < deadline:
            n = len(consumer.batch_receive())
            got[0] += n
            if n:
                idle_since = None
            elif idle_since is None:
                idle_since = time.perf_counter()
            elif time.perf_counter() - idle_since > 5:
                break
        elapsed = time.perf_counter() - started
    consumer.close()
    return {"expected": expected, "read": got[0], "seconds": elapsed, "msg_s": got[0] / elapsed,
            "mb_s": got[0] * size / elapsed / 1e6}


# -- null broker (the client's own ceiling) ---------------------------------------------------------
def serve_null_broker(port: int) -> None:
    """A Pulsar protocol server that stores nothing: it answers CONNECT, lookups and PRODUCER,
    and acknowledges each SEND at once. Run in its own process (``--serve-null-broker PORT``)."""
    import asyncio
    from pulsarlite._proto import pulsar_api_pb2 as pb
    from pulsarlite.wire import commands as cmd
    from pulsarlite.wire.frames import FrameDecoder
    T = pb.BaseCommand
    url = f"pulsar://127.0.0.1:{port}"

    class Proto(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.transport, self.decoder = transport, FrameDecoder()

        def data_received(self, data) -> None:
            out = []
            for frame in self.decoder.feed(data):
                c = frame.command
                if c.type == T.SEND:
                    s = c.send
                    out.append(cmd.send_receipt(s.producer_id, s.sequence_id, 1, s.sequence_id,
                                                highest_sequence_id=s.highest_sequence_id or None))
                else:
                    answer = stand_in_answer(c, url, "null")
                    if answer is not None:
                        out.append(answer)
            if out:
                self.transport.write(b"".join(out))

    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(Proto, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


def stand_in_answer(c, url: str, name: str) -> bytes | None:
    """What a Pulsar-protocol stand-in (the null broker, latency_floor's relay) answers to a
    command other than SEND: CONNECT, lookups, PRODUCER, CLOSE_PRODUCER and PING; None for the
    rest. ``url`` is where lookups point, ``name`` goes into the server and producer names."""
    from pulsarlite._proto import pulsar_api_pb2 as pb
    from pulsarlite.wire import commands as cmd
    T = pb.BaseCommand
    kind = c.type
    if kind == T.CONNECT:
        return cmd.connected(f"{name}-broker", cmd.negotiate_protocol_version(c.connect.protocol_version))
    if kind == T.PARTITIONED_METADATA:
        return cmd.partitioned_metadata_response(c.partitionMetadata.request_id, 0)
    if kind == T.LOOKUP:
        return cmd.lookup_response(c.lookupTopic.request_id, url, authoritative=True)
    if kind == T.PRODUCER:
        return cmd.producer_success(c.producer.request_id, f"{name}-{c.producer.producer_id}")
    if kind == T.CLOSE_PRODUCER:
        return cmd.success(c.close_producer.request_id)
    if kind == T.PING:
        return cmd.pong()
    return None


def wait_started(proc: subprocess.Popen, ready, what: str, timeout_s: float = 60.0) -> None:
    """Wait until ``ready()`` (e.g. its port accepts); a child that exits or overstays is
    killed and the wait raises."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"{what} did not start (exit {proc.returncode})")
        time.sleep(0.05)


def start_null_broker() -> tuple[subprocess.Popen, str]:
    from pulsarlite.zk_server import find_free_port, port_accepts
    port = find_free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-null-broker", str(port)],
                            stdin=subprocess.DEVNULL)
    wait_started(proc, lambda: port_accepts("127.0.0.1", port), "null broker", timeout_s=20)
    return proc, f"pulsar://127.0.0.1:{port}"


def parse_overrides(pairs: list[str]) -> dict:
    """``KEY=VALUE`` strings (VALUE a TOML value) as a dict of config overrides."""
    import tomllib
    out = {}
    for kv in pairs:
        key, _, value = kv.partition("=")
        out[key] = tomllib.loads(f"v = {value}")["v"]
    return out


# -- profile -------------------------------------------------------------------------------------
def profile_summary(raw_path: pathlib.Path, top: int = 12) -> tuple[list, list, int]:
    """From py-spy's raw (collapsed) output: (self-time leaf frames, inclusive frames, samples)."""
    leaf: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in raw_path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f for f in stack.split(";") if f]
        if frames and frames[0].startswith(("process ", "thread ")):
            frames = frames[1:]
        if frames:
            leaf[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    return leaf.most_common(top), inclusive.most_common(top * 4), total


def run_profiled(client, topic: str, seconds: float, size: int, window: int, batching: bool, pid: int,
                 out: pathlib.Path) -> dict:
    duration = max(2, int(seconds) - 2)
    result: dict = {"file": str(out)}
    label = f"{'batched' if batching else 'unbatched'} under py-spy"
    thread = threading.Thread(target=lambda: result.update(
        produce_windowed(client, topic, seconds, size, window, batching, label)), daemon=True)
    thread.start()
    time.sleep(1.0)
    spy = subprocess.run([str(ROOT / ".venv" / "bin" / "py-spy"), "record", "-r", "200", "-d", str(duration),
                          "--gil", "-f", "raw", "-o", str(out), "-p", str(pid)], capture_output=True, text=True)
    thread.join()
    result["py_spy_rc"] = spy.returncode
    result["py_spy_err"] = spy.stderr.strip()[-400:]
    return result


# -- main ------------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each phase")
    parser.add_argument("--dir", default=None, help="cluster directory (default: a temp dir)")
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--window", type=int, default=20_000, help="outstanding sends, batched")
    parser.add_argument("--unbatched-window", type=int, default=2_000, help="outstanding sends, unbatched")
    parser.add_argument("--perf-latency-every", type=int, default=16, metavar="N",
                        help="`perf produce` times 1 message in N (a callback on those only, as the "
                             "official client's phases count acks with a callback on 1 in 100); "
                             "its counts cover every message")
    parser.add_argument("--paced-rate", type=float, default=5_000)
    parser.add_argument("--paced-batch-delay-ms", type=int, default=1,
                        help="paced-batched phase: the client's batching window (default 1 ms, "
                             "pulsar-perf's default)")
    parser.add_argument("--e2e-rate", type=float, default=2_000)
    parser.add_argument("--paced-sample-every", type=int, default=1,
                        help="paced phase: measure the latency of every Nth message only (a Python "
                             "callback per message loads the client)")
    parser.add_argument("--profile", action="store_true", help="repeat the batched and unbatched phases under py-spy "
                        "(the raw stacks are written in the run's directory: only --dir keeps them)")
    parser.add_argument("--no-ceiling", action="store_true",
                        help="skip measuring the client against a broker that stores nothing")
    parser.add_argument("--ceilings", default="batched,unbatched,perf",
                        help="which ceilings to measure against the null broker (default: all three; "
                             "perf only when the perf phase runs)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--phases", default=None,
                        help=f"comma-separated subset of {','.join(PHASES)} "
                             "(default: all; catch-up needs warmup and batched)")
    parser.add_argument("--broker-set", action="append", default=[], metavar="KEY=VALUE",
                        help="broker config override (TOML value), repeatable")
    parser.add_argument("--bookie-set", action="append", default=[], metavar="KEY=VALUE",
                        help="bookie config override (TOML value), repeatable")
    parser.add_argument("--serve-null-broker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_null_broker is not None:
        serve_null_broker(args.serve_null_broker)
        return 0

    with work_dir(args.dir, "pulsarlite-bench-broker-") as base:
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        print(f"== starting 3 bookies + 1 broker in {base}", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        wanted = set(args.phases.split(",")) if args.phases else set(PHASES)
        broker_overrides, bookie_overrides = parse_overrides(args.broker_set), parse_overrides(args.bookie_set)
        cluster = LocalCluster(base / "cluster")
        with cluster:
            cluster.start_processes(bookies=3, brokers=1, broker_overrides=broker_overrides or None,
                                    bookie_overrides=bookie_overrides or None)
            print(f"   up in {time.perf_counter() - t0:.1f}s: {cluster.service_url}", file=sys.stderr, flush=True)
            pids = {name: cluster.records[name].pid for name in cluster.broker_names + cluster.bookie_names}
            broker_pid = cluster.records[cluster.broker_names[0]].pid
            meter = CpuMeter(pids)
            client = pulsar.Client(cluster.service_url, operation_timeout_seconds=60,
                                   logger=pulsar.FileLogger(pulsar.LoggerLevel.Warn, str(base / "client.log")))
            results: dict = {}
            cpu: dict = {}
            cpu_us: dict = {}     # phase -> process -> CPU microseconds per acknowledged message

            def phase(name: str, fn, *fargs):
                if name.split()[0] in PHASES and name.split()[0] not in wanted:
                    return None
                print(f"== {name}", file=sys.stderr, flush=True)
                before, started = meter.snapshot(), time.perf_counter()
                r = fn(*fargs)
                after = meter.snapshot()
                cpu[name] = meter.percent(before, after, time.perf_counter() - started)
                messages = r.get("acked", r.get("read", 0)) if isinstance(r, dict) else 0
                if messages:
                    cpu_us[name] = {n: (after[n] - before[n]) / messages * 1e6 for n in before if n != "machine"}
                results[name] = r
                return r

            s, size = args.seconds, args.size
            batched_topic = "persistent://public/default/bench-batched"
            try:
                if not args.no_ceiling:
                    null_proc, null_url = start_null_broker()
                    pids_null = dict(pids, **{"null-broker": null_proc.pid})
                    meter.pids = pids_null
                    null_client = pulsar.Client(null_url, operation_timeout_seconds=60,
                                                logger=pulsar.FileLogger(pulsar.LoggerLevel.Warn, str(base / "null-client.log")))
                    ceilings = set(args.ceilings.split(","))
                    try:
                        if "batched" in ceilings:
                            phase("ceiling batched", produce_windowed, null_client, "persistent://public/default/null-b",
                                  s, size, args.window, True, "client ceiling, batched")
                        if "unbatched" in ceilings:
                            phase("ceiling unbatched", produce_windowed, null_client,
                                  "persistent://public/default/null-u", s, size, args.unbatched_window, False,
                                  "client ceiling, unbatched")
                        if "perf" in ceilings and "perf" in wanted:
                            # our client's own ceiling: `perf produce` as in the perf phase below
                            phase("ceiling perf", perf_produce, null_url, cluster.admin_url,
                                  "persistent://public/default/null-perf", s, size, args.window,
                                  args.perf_latency_every)
                    finally:
                        null_client.close()
                        null_proc.kill()
                        null_proc.wait()
                        meter.pids = pids
                phase("warmup", produce_windowed, client, batched_topic, min(3.0, s), size, args.window, True, "warmup")
                phase("batched", produce_windowed, client, batched_topic, s, size, args.window, True, "batched")
                phase("unbatched", produce_windowed, client, "persistent://public/default/bench-unbatched", s, size,
                      args.unbatched_window, False, "unbatched")
                bookie_metrics = [f"http://127.0.0.1:{cluster.records[n].ports['metrics']}/metrics"
                                  for n in cluster.bookie_names if "metrics" in cluster.records[n].ports]
                sync_metric = "bookie_journal_JOURNAL_SYNC_seconds"
                for name, delay_ms in (("paced", None), ("paced-batched", args.paced_batch_delay_ms)):
                    buckets_before = broker_publish_buckets(cluster.admin_url)
                    sync_before = histogram_buckets(*bookie_metrics, sync_metric) if bookie_metrics else {}
                    paced = phase(name, produce_paced, client, f"persistent://public/default/bench-{name}", s,
                                  size, args.paced_rate, f"{name} {args.paced_rate:.0f}/s", args.paced_sample_every,
                                  delay_ms)
                    if paced:
                        # the same SENDs timed inside the broker (SEND read to entry confirmed): what
                        # the client's figure adds is its own time and the socket hops
                        buckets_after = broker_publish_buckets(cluster.admin_url)
                        paced["broker_p50_ms"] = bucket_quantile_ms(buckets_before, buckets_after, 0.50)
                        paced["broker_p99_ms"] = bucket_quantile_ms(buckets_before, buckets_after, 0.99)
                        # and the bookies' journal groups' fdatasync, all three bookies summed
                        if bookie_metrics:
                            sync_after = histogram_buckets(*bookie_metrics, sync_metric)
                            for q in (50, 99, 99.9):
                                paced[f"bookie_sync_p{q:g}_ms"] = bucket_quantile_ms(sync_before, sync_after, q / 100)
                phase("e2e", end_to_end, client, "persistent://public/default/bench-e2e", s, size, args.e2e_rate,
                      f"e2e {args.e2e_rate:.0f}/s")
                expected = (results.get("warmup") or {}).get("acked", 0) + (results.get("batched") or {}).get("acked", 0)
                if expected:
                    phase("catch-up", catch_up, client, batched_topic, expected, 2 * s, size, "catch-up")
                phase("perf", perf_produce, cluster.service_url, cluster.admin_url,
                      "persistent://public/default/bench-perf", s, size, args.window,
                      args.perf_latency_every)
                if args.profile:
                    phase("batched under py-spy", run_profiled, client, "persistent://public/default/bench-prof-b",
                          s, size, args.window, True, broker_pid, base / "broker-batched.py-spy.raw")
                    phase("unbatched under py-spy", run_profiled, client, "persistent://public/default/bench-prof-u",
                          s, size, args.unbatched_window, False, broker_pid, base / "broker-unbatched.py-spy.raw")
            finally:
                client.close()
        if args.json:
            print(json.dumps({"results": results, "cpu": cpu, "cpu_us": cpu_us}, indent=2, default=str))

        b, u, p, e, c = (results.get(k) for k in ("batched", "unbatched", "paced", "e2e", "catch-up"))
        for name in ("ceiling batched", "ceiling unbatched", "warmup", "batched", "unbatched"):
            if name in results and results[name]["failed"]:
                print(f"!! {name}: {results[name]['failed']} sends failed ({results[name]['error']})")

        def row(figure: str, value: str, goal: str = "", ratio: float | None = None, lower_is_better=False) -> None:
            if ratio is None:
                print(f"| {figure} | {value} | {goal} | |")
            else:
                met = ratio <= 1 if lower_is_better else ratio >= 1
                print(f"| {figure} | {value} | {goal} | {ratio:.2f} ({'met' if met else 'missed'}) |")

        every = (b or u or {}).get("ack_every", 100)
        print(f"\n{when}; {size} B payloads; {s:g} s per phase; batched/unbatched acks counted by a callback "
              f"on every {every}th message (receipts are in order)\n")
        print("| figure | value | goal | ratio to goal |")
        print("|---|---|---|---|")
        cb, cu = results.get("ceiling batched"), results.get("ceiling unbatched")
        if cb:
            row("client ceiling: batched produce against a broker that stores nothing",
                f"{cb['msg_s']:,.0f} msg/s, {cb['mb_s']:.1f} MB/s", "(machine/client limit)")
        if b:
            row(f"batched produce (window {args.window}, delay 10 ms)", f"{b['msg_s']:,.0f} msg/s, {b['mb_s']:.1f} MB/s",
                ">= 200k msg/s", b["msg_s"] / 200_000)
        if cb and b:
            row("batched produce / client ceiling", f"{b['msg_s'] / cb['msg_s']:.2f}", "~1 (broker not the limit)")
        if cu:
            row("client ceiling: unbatched produce against a broker that stores nothing",
                f"{cu['msg_s']:,.0f} msg/s", "(machine/client limit)")
        if u:
            row(f"unbatched produce (window {args.unbatched_window})", f"{u['msg_s']:,.0f} msg/s, {u['mb_s']:.1f} MB/s",
                ">= 20k msg/s", u["msg_s"] / 20_000)
        for p, how in ((p, "unbatched"),
                       (results.get("paced-batched"), f"batched, {args.paced_batch_delay_ms} ms window")):
            if not p:
                continue
            sampled = f", 1 in {p['sample_every']} timed" if p.get("sample_every", 1) > 1 else ""
            row(f"publish latency at {args.paced_rate:,.0f} msg/s {how} (achieved {p['achieved']:,.0f}/s{sampled})",
                f"p50 {p['p50_ms']:.2f} ms, p99 {p['p99_ms']:.2f} ms, max {p['max_ms']:.1f} ms",
                "p99 <= 5 ms", p["p99_ms"] / 5.0, lower_is_better=True)
            if p.get("broker_p99_ms") is not None:
                row("the same SENDs inside the broker, SEND read to entry confirmed (histogram bucket bounds)",
                    f"p50 <= {p['broker_p50_ms']:g} ms, p99 <= {p['broker_p99_ms']:g} ms")
            if p.get("bookie_sync_p99_ms") is not None:
                row("the bookies' journal fdatasync per group meanwhile (histogram bucket bounds)",
                    f"p50 <= {p['bookie_sync_p50_ms']:g} ms, p99 <= {p['bookie_sync_p99_ms']:g} ms, "
                    f"p99.9 <= {p['bookie_sync_p99.9_ms']:g} ms")
        if e:
            row(f"end-to-end latency at {args.e2e_rate:,.0f} msg/s unbatched ({e['received']}/{e['sent']} received)",
                f"p50 {e['p50_ms']:.2f} ms, p99 {e['p99_ms']:.2f} ms, max {e['max_ms']:.1f} ms")
        pp = results.get("perf")
        if pp and pp.get("acked"):
            row(f"batched produce, `pulsarlite perf produce` (our client, window {args.window}, "
                f"latency of 1 in {args.perf_latency_every})",
                f"{pp['msg_s']:,.0f} msg/s, {pp['mb_s']:.1f} MB/s, client {pp['client_cpu_us']:.1f} us CPU/msg",
                ">= 500k msg/s", pp["msg_s"] / 500_000)
        cp = results.get("ceiling perf")
        if cp and cp.get("acked"):
            row("our client's ceiling: the same `perf produce` against a broker that stores nothing",
                f"{cp['msg_s']:,.0f} msg/s, client {cp['client_cpu_us']:.1f} us CPU/msg", "(machine/client limit)")
            if pp and pp.get("acked"):
                row("`perf produce` / its ceiling", f"{pp['msg_s'] / cp['msg_s']:.2f}", ">= 0.8 (issue 29)",
                    pp["msg_s"] / cp["msg_s"] / 0.8)
        if c:
            row(f"catch-up read from earliest ({c['read']:,}/{c['expected']:,} msgs, {c['seconds']:.1f} s)",
                f"{c['msg_s']:,.0f} msg/s, {c['mb_s']:.1f} MB/s")
        broker_name = next(iter(pids))
        for ph in ("batched", "unbatched", "paced", "paced-batched", "e2e"):
            if ph in cpu_us:
                row(f"broker CPU per message, {ph}", f"{cpu_us[ph][broker_name]:.1f} us",
                    "<= ~40 us (unbatched 20k/s)" if ph == "unbatched" else "")

        names = ["client"] + list(pids) + (["null-broker"] if cb else []) + ["others"]
        print("\nCPU, % of one core (2 cores = 200%), per phase:\n")
        print("| phase | " + " | ".join(names) + " | machine total |")
        print("|---|" + "---|" * (len(names) + 1))
        for ph, per in cpu.items():
            print(f"| {ph} | " + " | ".join(f"{per[n]:.0f}%" if n in per else "-" for n in names) + f" | {sum(per.values()):.0f}% |")
        if cpu_us:
            names_us = [n for n in names if n != "others"]
            print("\nCPU microseconds per acknowledged message (process CPU delta / messages), per phase:\n")
            print("| phase | " + " | ".join(names_us) + " |")
            print("|---|" + "---|" * len(names_us))
            for ph, per in cpu_us.items():
                print(f"| {ph} | " + " | ".join(f"{per[n]:.1f}" if n in per else "-" for n in names_us) + " |")

        for ph in ("batched under py-spy", "unbatched under py-spy"):
            if ph not in results:
                continue
            pr = results[ph]
            out = pathlib.Path(pr["file"])
            print(f"\npy-spy --gil of the broker during a repeat of the {ph.split()[0]} phase "
                  f"({pr.get('msg_s', 0):,.0f} msg/s under the profiler; raw stacks: {out}"
                  + ("" if args.dir else ", removed at exit: --dir keeps them") + ")")
            if not out.exists():
                print(f"py-spy failed (rc {pr.get('py_spy_rc')}): {pr.get('py_spy_err')}")
                continue
            leaf, inclusive, total = profile_summary(out)
            print(f"\n{total} samples. Top self-time frames:\n")
            print("| % samples | frame |")
            print("|---|---|")
            for frame, n in leaf:
                print(f"| {n / total * 100:.1f}% | `{frame}` |")
            print("\nTop inclusive frames (below the event loop):\n")
            print("| % samples | frame |")
            print("|---|---|")
            shown = 0
            for frame, n in inclusive:
                if n / total > 0.9 or frame.startswith(("Thread.", "_run_", "<module>", "main (", "run (")):
                    continue  # the frames every sample shares
                print(f"| {n / total * 100:.1f}% | `{frame}` |")
                shown += 1
                if shown == 15:
                    break
        return 0


if __name__ == "__main__":
    sys.exit(main())
