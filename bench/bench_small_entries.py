"""Drain of a backlog of small entries vs the same messages in default batches (issue 29, row 1).

    .venv/bin/python bench/bench_small_entries.py [--messages 100000] [--rounds 3] [--dir D]
                                                  [--py-spy SECONDS]

One local cluster (3 bookies, 1 broker). Each round publishes, for each of three cases, N messages
of 100 B over 1,000 keys (``key-{i % 1000}``) to a fresh topic, with 4 official consumers
(``receiver_queue_size`` 1,000, one thread each, same process) subscribed before the publish and
not receiving yet; then they drain it with individual acks: msg/s from the first message received
to the last, and the broker's CPU time per message over the drain (/proc: less sensitive to the
machine's load than the rate), and this process's (the consumers') CPU time per message. The
cases, alternated in each round:

  batched-shared   default batching (the reference), Shared
  small-shared     batching off: one message per entry, Shared
  small-keyshared  batching off: one message per entry, Key_Shared

Printed: per round the three rates and the two ratios small/batched of that round; then the
median of each, and the median of the per-round ratios (the figure of the issue's goal, >= 0.5).
``--py-spy S``: record the broker with py-spy for S seconds during the first round's small
Key_Shared drain (flat profile by own time to stderr; py-spy must be installed; its raw output
is in the run's directory, which only --dir keeps).
No assertions: figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import drain_consumers, work_dir  # noqa: E402

CONSUMERS = 4
KEYS = 1000


def say(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drain(service_url: str, case: str, messages: int, broker_pid: int,
          profile: tuple[int, float, Path] | None = None) -> tuple[float, float, float]:
    """(msg/s of the drain, broker CPU microseconds per message during it, the same for this
    process: the 4 official consumers, their threads and the receive/ack loops)."""
    import pulsar
    client = pulsar.Client(service_url, operation_timeout_seconds=60,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        topic = f"persistent://public/default/bench-small-{case}-{time.time_ns()}"
        ctype = pulsar.ConsumerType.KeyShared if case.endswith("keyshared") else pulsar.ConsumerType.Shared
        consumers = [client.subscribe(topic, "bench", consumer_type=ctype, receiver_queue_size=1000,
                                      initial_position=pulsar.InitialPosition.Earliest)
                     for _ in range(CONSUMERS)]
        batched = case.startswith("batched")
        producer = client.create_producer(topic, batching_enabled=batched, block_if_queue_full=True,
                                          max_pending_messages=20000)
        payload = b"x" * 100
        for i in range(messages):
            producer.send_async(payload, None, partition_key=f"key-{i % KEYS}")
        producer.flush()
        spy = None
        if profile is not None:
            pid, seconds, out_dir = profile
            out = out_dir / "profile.txt"
            spy = subprocess.Popen([shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(pid), "-d",
                                    str(int(seconds)), "-r", "200", "-f", "raw", "-o", str(out)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cpu0, client0 = cpu_s(broker_pid), time.process_time()
        counts, rate = drain_consumers(consumers)
        cpu_us = (cpu_s(broker_pid) - cpu0) * 1e6 / max(1, sum(counts))
        client_us = (time.process_time() - client0) * 1e6 / max(1, sum(counts))
        if spy is not None:
            spy.wait()
            summarize_raw(out)
        total = sum(counts)
        say(f"{case}: {total}/{messages} received, per consumer {counts}, {rate:,.0f} msg/s, "
            f"broker CPU {cpu_us:.1f} us/msg, consumers' process CPU {client_us:.1f} us/msg")
        producer.close()
        for c in consumers:
            c.close()
        return rate, cpu_us, client_us
    finally:
        client.close()


def summarize_raw(path: Path, top: int = 40) -> None:
    """py-spy's raw (collapsed stacks) output: own samples per function, top ``top``."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        count = int(n)
        frames = stack.split(";")
        total += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + count
    say(f"py-spy: {total} samples; by own samples:")
    for f, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        say(f"  {100 * n / total:5.1f}%  {f}")
    say("by inclusive samples:")
    for f, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]:
        say(f"  {100 * n / total:5.1f}%  {f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--py-spy", type=float, default=0.0)
    ap.add_argument("--json", action="store_true", help="print a JSON object of the medians first (bench/suite.py)")
    args = ap.parse_args()
    from faces.cluster import LocalCluster
    with work_dir(args.dir, "bench-small-") as base:
        cluster = LocalCluster(base / "cluster")
        cases = ["batched-shared", "small-shared", "small-keyshared"]
        rows: list[dict[str, float]] = []
        try:
            cluster.start_processes(bookies=3, brokers=1)
            broker_pid = cluster.records["broker-1"].pid
            for r in range(args.rounds):
                order = cases if r % 2 == 0 else list(reversed(cases))
                rates = {}
                for case in order:
                    profile = (broker_pid, args.py_spy, base) if args.py_spy and r == 0 and case == "small-keyshared" else None
                    rates[case], rates[f"cpu-us-{case}"], rates[f"client-cpu-us-{case}"] = drain(
                        cluster.service_url, case, args.messages, broker_pid, profile)
                rates["ratio-shared"] = rates["small-shared"] / rates["batched-shared"]
                rates["ratio-keyshared"] = rates["small-keyshared"] / rates["batched-shared"]
                say(f"round {r + 1}: " + ", ".join(f"{k} {v:,.2f}" for k, v in rates.items()))
                rows.append(rates)
        finally:
            cluster.stop()
        med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
        if args.json:
            print(json.dumps({"messages": args.messages, "rounds": len(rows), "median": med,
                              "per_round": rows}))
        print(f"| figure | value | reference (same run) | ratio (median of rounds) | goal | goal met |\n|---|---|---|---|---|---|")
        for case, key in (("small-shared", "ratio-shared"), ("small-keyshared", "ratio-keyshared")):
            kind = "Shared" if case == "small-shared" else "Key_Shared"
            print(f"| drain of {args.messages:,} small entries (1 msg each, {KEYS:,} keys), {CONSUMERS} official "
                  f"consumers, {kind} | {med[case]:,.0f} msg/s | default batches, Shared {med['batched-shared']:,.0f} "
                  f"msg/s | {med[key]:.2f} | >= 0.5 | {'met' if med[key] >= 0.5 else '**missed**'} |")
        for case in cases:
            print(f"| broker CPU per message while draining, {case} | {med[f'cpu-us-{case}']:.1f} us | | | | |")
        say("per round: " + "; ".join(f"{row['ratio-shared']:.2f}/{row['ratio-keyshared']:.2f}" for row in rows))


if __name__ == "__main__":
    main()
