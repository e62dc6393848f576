"""Run (or replay) one chaos run from the command line:

    .venv/bin/python -m tests.chaos.run --seed N --duration-s S [--bookies 4] [--brokers 2]
        [--topics 3] [--rate 50] [--load N] [--kinds kill_bookie,kill_broker,...] [--spark] [--dir D] [--results FILE.jsonl]

Prints progress, the fault log and the verdict; exit status 0 when every acknowledged message
was read back in producer order (duplicates are reported, not failed), 1 otherwise. The same
seed and arguments give the same fault schedule.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos.runner import ChaosConfig, run_chaos
from tests.chaos.schedule import FAULT_KINDS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--duration-s", type=float, required=True, help="faults start within this many seconds")
    p.add_argument("--bookies", type=int, default=4)
    p.add_argument("--brokers", type=int, default=2)
    p.add_argument("--topics", type=int, default=3)
    p.add_argument("--rate", type=float, default=50.0, help="messages per second per producer")
    p.add_argument("--kinds", default=",".join(FAULT_KINDS), help="fault kinds (comma-separated)")
    p.add_argument("--no-ours", action="store_true", help="only the official client produces")
    p.add_argument("--spark", action="store_true", help="also read everything back with a Spark scan")
    p.add_argument("--no-dedup", action="store_true", help="broker deduplication off (duplicates then only counted)")
    p.add_argument("--load", type=int, default=0, metavar="N",
                   help="load the machine with N CPU-bound busy processes for the whole run (ended with it)")
    p.add_argument("--dir", default=None, help="run directory (default: a new temporary one, removed if OK)")
    p.add_argument("--results", default=None, help="append the run's JSON summary to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = set(kinds) - set(FAULT_KINDS)
    if unknown:
        print(f"unknown fault kinds: {sorted(unknown)} (known: {', '.join(FAULT_KINDS)})", file=sys.stderr)
        return 2
    directory = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix=f"chaos-{args.seed}-"))
    config = ChaosConfig(seed=args.seed, duration_s=args.duration_s, directory=directory, bookies=args.bookies,
                         brokers=args.brokers, topics=args.topics, rate_per_producer=args.rate, kinds=kinds,
                         ours=not args.no_ours, spark=args.spark,
                         dedup=not args.no_dedup, load_procs=args.load)
    report = run_chaos(config, out=lambda line: print(line, flush=True))
    print(report.text(), flush=True)
    if args.results:
        with open(args.results, "a") as f:
            f.write(json.dumps({**report.row(), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
    if report.ok and not args.dir:
        shutil.rmtree(directory, ignore_errors=True)
    elif not report.ok:
        print(f"run directory kept for inspection (logs in {directory}/cluster/logs)", flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
