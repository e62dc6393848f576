"""The benchmark suite: every figure of the project's goals, side by side with the machine's own
limits and a peer (NATS JetStream) measured in the same run.

    .venv/bin/python bench/suite.py [--runs N] [--seconds S] [--budget-s B] [--write]
    make bench                        (the same, with --write)

Each round runs, one after the other: the machine limits (bench/machine_limits.py), the broker
figures with the official client (bench/bench_broker.py), the peer (bench/peer_nats.py), and the
component scripts that exist (bench/bench_idle_topics.py, bench/bench_client.py, bench/bench_offload.py,
bench/bench_tier_replay.py, bench/bench_spark.py, bench/bench_dispatch.py), each in its own
process with a deadline. --runs rounds (default 2); the table shows medians, and each ratio is
the median of the per-round ratios (pulsarlite and peer of the same round: the machine is noisy,
pairs measured together compare fairly). The whole suite stops starting new work once
--budget-s (default 900 s) is spent. With --write, the table replaces the generated block of
BENCHMARKS.md (between the `suite:begin` / `suite:end` markers), stamped with the date and the
command. Not a test: figures only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import re
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PY = sys.executable
BEGIN, END = "<!-- suite:begin -->", "<!-- suite:end -->"


def first_json(text: str) -> dict | None:
    """The first JSON object printed on stdout (scripts print tables after it)."""
    decoder = json.JSONDecoder()
    for m in re.finditer(r"^\{", text, re.M):
        try:
            value, _ = decoder.raw_decode(text[m.start():])
            return value
        except ValueError:
            continue
    return None


def run_script(args: list[str], timeout_s: float) -> dict | None:
    print(f"== {' '.join(args)}", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        done = subprocess.run([PY, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=None, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"!! {args[0]} exceeded {timeout_s:.0f} s: skipped", file=sys.stderr, flush=True)
        return None
    print(f"   {args[0]} took {time.monotonic() - started:.0f} s (exit {done.returncode})", file=sys.stderr, flush=True)
    if done.returncode != 0:
        return None
    return first_json(done.stdout)


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and v == v]
    return statistics.median(values) if values else None


def get(d: dict | None, *path: str) -> float | None:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d if isinstance(d, (int, float)) else None


class Round:
    def __init__(self) -> None:
        self.limits: dict | None = None
        self.broker: dict | None = None
        self.nats: dict | None = None
        self.extra: dict[str, dict | None] = {}


def one_round(args, deadline: float) -> Round:
    r = Round()
    left = lambda: max(30.0, deadline - time.monotonic())  # noqa: E731
    r.limits = run_script(["bench/machine_limits.py", "--json"], min(120, left()))
    r.broker = run_script(["bench/bench_broker.py", "--json", "--seconds", str(args.seconds),
                           "--paced-rate", "5000"], min(600, left()))
    r.nats = run_script(["bench/peer_nats.py", "--json", "--seconds", str(args.seconds), "--rate", "5000"],
                        min(300, left()))
    for script in ("bench_idle_topics.py", "bench_client.py", "bench_offload.py", "bench_tier_replay.py",
                   "bench_spark.py", "bench_dispatch.py"):
        if (ROOT / "bench" / script).exists() and time.monotonic() < deadline and args.components:
            r.extra[script] = run_script([f"bench/{script}", "--json"], min(300, left()))
    return r


def table(rounds: list[Round]) -> list[tuple[str, str, str, str, str]]:
    """(figure, value, reference, ratio, goal) rows."""
    rows = []

    def med(fn) -> float | None:
        return median([fn(r) for r in rounds])

    def ratio_med(num, den) -> float | None:
        return median([(num(r) / den(r)) if num(r) and den(r) else None for r in rounds])

    def fmt(v: float | None, unit: str, digits: int = 0) -> str:
        return "n/a" if v is None else f"{v:,.{digits}f} {unit}"

    limits = lambda r, k: get(r.limits, k)  # noqa: E731
    rows.append(("machine: fsync'd sequential write (1 MiB blocks)",
                 fmt(med(lambda r: limits(r, "disk_fsync_seq_mb_s")), "MB/s"), "", "", ""))
    rows.append(("machine: 4 KiB append + fdatasync",
                 fmt(med(lambda r: limits(r, "disk_append_fdatasync_ops_s")), "ops/s"), "", "", ""))
    rows.append(("machine: loopback TCP", fmt(med(lambda r: limits(r, "loopback_mb_s")), "MB/s"), "", "", ""))

    b = lambda r, *k: get(r.broker, "results", *k)  # noqa: E731
    n = lambda r, *k: get(r.nats, *k)  # noqa: E731
    ceiling = med(lambda r: b(r, "ceiling batched", "msg_s"))
    rows.append(("produce, batched, official client", fmt(med(lambda r: b(r, "batched", "msg_s")), "msg/s"),
                 f"client ceiling {fmt(ceiling, 'msg/s')}",
                 _ratio(ratio_med(lambda r: b(r, "batched", "msg_s"), lambda r: b(r, "ceiling batched", "msg_s"))),
                 ">= 200k msg/s"))
    rows.append(("produce, unbatched, pipelined (official client)",
                 fmt(med(lambda r: b(r, "unbatched", "msg_s")), "msg/s"),
                 f"JetStream sync always {fmt(med(lambda r: n(r, 'durable', 'msg_s')), 'msg/s')}",
                 _ratio(ratio_med(lambda r: b(r, "unbatched", "msg_s"), lambda r: n(r, "durable", "msg_s"))),
                 ">= 20k msg/s and >= 3x"))
    rows.append(("produce, batched vs JetStream default",
                 fmt(med(lambda r: b(r, "batched", "msg_s")), "msg/s"),
                 f"JetStream default {fmt(med(lambda r: n(r, 'default', 'msg_s')), 'msg/s')}",
                 _ratio(ratio_med(lambda r: b(r, "batched", "msg_s"), lambda r: n(r, "default", "msg_s"))),
                 ">= 3x"))
    rows.append(("publish latency at 5k msg/s, p50 / p99",
                 f"{fmt(med(lambda r: b(r, 'paced', 'p50_ms')), 'ms', 1)} / {fmt(med(lambda r: b(r, 'paced', 'p99_ms')), 'ms', 1)}",
                 f"JetStream {fmt(med(lambda r: n(r, 'paced', 'p50_ms')), 'ms', 1)} / "
                 f"{fmt(med(lambda r: n(r, 'paced', 'p99_ms')), 'ms', 1)}", "", "p99 <= 5 ms"))
    rows.append(("end-to-end latency at 2k msg/s, p50 / p99",
                 f"{fmt(med(lambda r: b(r, 'e2e', 'p50_ms')), 'ms', 1)} / {fmt(med(lambda r: b(r, 'e2e', 'p99_ms')), 'ms', 1)}",
                 "", "", ""))
    rows.append(("catch-up read from bookies", fmt(med(lambda r: b(r, "catch-up", "msg_s")), "msg/s"), "", "", ""))
    cpu = lambda r, phase, name: get(r.broker, "cpu", phase, name)  # noqa: E731
    for phase in ("batched", "unbatched"):
        us = median([(10_000 * cpu(r, phase, "broker-1") / b(r, phase, "msg_s"))
                     if cpu(r, phase, "broker-1") and b(r, phase, "msg_s") else None for r in rounds])
        rows.append((f"broker CPU per message, {phase}", fmt(us, "us", 1), "", "", ""))
    idle = median([get(r.extra.get("bench_idle_topics.py"), "rss_mb") for r in rounds])
    if idle is not None:
        rows.append(("broker RSS, 1,000 topics x 1 idle producer", fmt(idle, "MB"), "", "", "<= 300 MB"))
    for script, label in (("bench_client.py", "component: our client"), ("bench_offload.py", "component: offload"),
                          ("bench_tier_replay.py", "component: tier replay"), ("bench_spark.py", "component: spark"),
                          ("bench_dispatch.py", "component: dispatch")):
        got = [r.extra.get(script) for r in rounds if r.extra.get(script)]
        if got:
            rows.append((label, json.dumps(got[-1], default=str)[:300], "", "", ""))
    return rows


def _ratio(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def render(rows, command: str, runs: int) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [BEGIN, f"### Suite run {when} ({runs} round(s), medians; ratios pair by pair)", "",
           f"Command: `{command}`", "", "| figure | value | reference (same run) | ratio | goal |", "|---|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows]
    out.append(END)
    return "\n".join(out)


def write_benchmarks(block: str) -> None:
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text()
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip() + "\n\n## The suite (generated by bench/suite.py)\n\n" + block + "\n"
    path.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each phase")
    parser.add_argument("--budget-s", type=float, default=900.0, help="stop starting new work after this")
    parser.add_argument("--no-components", dest="components", action="store_false",
                        help="only the broker, the peer and the machine limits")
    parser.add_argument("--write", action="store_true", help="rewrite the suite block of BENCHMARKS.md")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    rounds = []
    for i in range(args.runs):
        if time.monotonic() >= deadline:
            print(f"!! budget spent after {i} round(s)", file=sys.stderr)
            break
        print(f"==== round {i + 1}/{args.runs}", file=sys.stderr, flush=True)
        rounds.append(one_round(args, deadline))
    rows = table(rounds)
    block = render(rows, "make bench  # " + " ".join(["bench/suite.py", *sys.argv[1:]]), len(rounds))
    print(block)
    if args.write:
        write_benchmarks(block)
        print("BENCHMARKS.md updated", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
