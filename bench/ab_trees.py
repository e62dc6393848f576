"""A/B one benchmark command across two source trees (e.g. before and after a refactor).

    .venv/bin/python bench/ab_trees.py OLD_TREE NEW_TREE --pairs 3 \\
        --figure 'batched=json:results.batched.msg_s' \\
        -- bench/bench_broker.py --json --seconds 5 --no-ceiling --phases warmup,batched

Runs the command (after ``--``) with this interpreter, with the current directory and
PYTHONPATH set to each tree in turn so that tree's code is imported (child processes too),
alternating ABBA (old, new, new, old, old, new...) so a drift in the machine's load falls on
both sides. Each run's stdout and stderr are written under --out (default a temp dir, removed at
the end: give --out to read them afterwards), with the load average read just before it starts.
A figure is ``NAME=json:a.b.c`` (a key path into the first JSON object printed on stdout) or
``NAME=md:REGEX:COL`` (the first stdout line matching REGEX, split on ``|``, column COL, the leading number taken; e.g.
``read=md:^\\| batched \\| file \\| tier read:4`` for bench_offload.py). Prints, per figure, each
run's value, the per-pair ratios new/old and their median, as markdown; also as one JSON object
with --json. Not a test: figures only.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.common import work_dir  # noqa: E402
from suite import first_json  # noqa: E402 - bench/suite.py: the first JSON object a script prints

NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)*(?:\.\d+)?")


def extract(spec: str, stdout: str) -> float | None:
    kind, _, rest = spec.partition(":")
    if kind == "json":
        value = first_json(stdout)
        for part in rest.split("."):
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        return float(value) if isinstance(value, (int, float)) else None
    if kind == "md":
        pattern, _, col = rest.rpartition(":")
        for line in stdout.splitlines():
            if re.search(pattern, line):
                cells = line.split("|")
                if int(col) >= len(cells):
                    return None
                m = NUMBER.search(cells[int(col)])
                return float(m.group(0).replace(",", "")) if m else None
        return None
    raise SystemExit(f"bad figure spec {spec!r}: json:PATH or md:REGEX:COL")


def load_average() -> str:
    return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--figure", action="append", default=[], metavar="NAME=SPEC")
    parser.add_argument("--out", help="directory for each run's output, kept (default: a temp dir, removed "
                        "at the end)")
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--json", action="store_true")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1:]
    if not command:
        parser.error("no command after --")
    figures = [f.split("=", 1) for f in args.figure]
    with work_dir(args.out, "ab-trees-") as out:
        out.mkdir(parents=True, exist_ok=True)
        trees = {"old": pathlib.Path(args.old).resolve(), "new": pathlib.Path(args.new).resolve()}
        order = []
        for i in range(args.pairs):
            order += [("old", i), ("new", i)] if i % 2 == 0 else [("new", i), ("old", i)]
        runs: list[dict] = []
        for side, pair in order:
            load = load_average()
            started = time.monotonic()
            env = dict(os.environ, PYTHONPATH=str(trees[side]))
            try:
                done = subprocess.run([sys.executable, *command], cwd=trees[side], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=args.timeout_s)
                stdout, stderr, rc = done.stdout, done.stderr, done.returncode
            except subprocess.TimeoutExpired as e:
                stdout, stderr, rc = e.stdout or "", (e.stderr or "") + "\nTIMEOUT", -1
                stdout = stdout if isinstance(stdout, str) else stdout.decode()
                stderr = stderr if isinstance(stderr, str) else stderr.decode()
            took_s = time.monotonic() - started
            stem = out / f"{len(runs):02d}-{side}-pair{pair}"
            stem.with_suffix(".out").write_text(stdout)
            stem.with_suffix(".err").write_text(stderr)
            values = {name: extract(spec, stdout) for name, spec in figures}
            runs.append({"side": side, "pair": pair, "load": load, "took_s": round(took_s, 1), "rc": rc,
                         "values": values})
            print(f"run side={side} pair={pair} load={load} took_s={took_s:.0f} rc={rc} values={values}",
                  file=sys.stderr, flush=True)
        result = {"command": command, "old": str(trees["old"]), "new": str(trees["new"]), "out": str(out),
                  "runs": runs, "figures": {}}
        for name, _ in figures:
            ratios = []
            for i in range(args.pairs):
                old = next(r["values"][name] for r in runs if r["pair"] == i and r["side"] == "old")
                new = next(r["values"][name] for r in runs if r["pair"] == i and r["side"] == "new")
                ratios.append(new / old if old and new is not None else None)
            valid = [r for r in ratios if r is not None]
            result["figures"][name] = {"ratios": ratios, "median_ratio": statistics.median(valid) if valid else None}
        if args.json:
            print(json.dumps(result))
        print(f"command: `{' '.join(command)}`  (outputs: {out}"
              + ("" if args.out else ", removed at exit: --out keeps them") + ")\n")
        print("| figure | pair | old | new | new/old | load (old; new) |\n|---|---|---|---|---|---|")
        for name, _ in figures:
            for i in range(args.pairs):
                o = next(r for r in runs if r["pair"] == i and r["side"] == "old")
                n = next(r for r in runs if r["pair"] == i and r["side"] == "new")
                ratio = result["figures"][name]["ratios"][i]
                print(f"| {name} | {i + 1} | {o['values'][name]} | {n['values'][name]} | "
                      f"{'-' if ratio is None else f'{ratio:.3f}'} | {o['load']}; {n['load']} |")
            med = result["figures"][name]["median_ratio"]
            print(f"| {name} | median | | | {'-' if med is None else f'{med:.3f}'} | |")


if __name__ == "__main__":
    main()
