"""[lakehouse] Small files merged (offload/lake_merge.py), in one process on a file:// tier: the
scan time of a topic's table over N small files (one per ledger, as offloaded) vs the same rows
after the merge, and the merge's MB/s.

Two topics get the same LEDGERS small ledger objects (ENTRIES entries of PAYLOAD bytes each, half random,
encoded by the offloader's encoder) and their tables (``Lake.sync``); the second topic's table
is then merged (``merge_once`` until it has nothing left to merge: ``--target-mib``,
``--files-min``). Then, alternated for ``--rounds`` rounds, each table is read by

- pyiceberg: ``StaticTable.from_metadata(...).scan().to_arrow()`` (every column), and
- DuckDB: ``read_parquet`` of the current snapshot's data files (``union_by_name``),
  ``SELECT count(*), max(publish_time), sum(octet_length(value))``;

and the ratio merged/small of each round is printed with the median. The merge's MB/s is the
source objects' bytes read / the seconds of read + write (``MergedObject``) and of the whole
``merge_once`` (plan, write, commit).

    .venv/bin/python bench/bench_lake_merge.py [--ledgers 48] [--entries 300] [--payload-bytes 200] [--rounds 7]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import work_dir  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ledgers", type=int, default=48)
    ap.add_argument("--entries", type=int, default=300)
    ap.add_argument("--payload-bytes", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--target-mib", type=int, default=128)
    ap.add_argument("--files-min", type=int, default=4)
    args = ap.parse_args()

    import duckdb
    from pyiceberg.table import StaticTable

    from offload.lake import Lake, TableId
    from offload.lake_merge import LedgerObject, merge_once
    from offload.reader import encode_ledger
    from offload.tier import Tier
    from pulsarlite.wire.entry import Message, build_entry

    with work_dir(None, "bench-lake-merge-") as d:
        tier = Tier(f"file://{d}/tier", None)
        lake = Lake(tier.uri, partition="none")
        topics = {"small": TableId.of_topic("bench", "ns", "small"), "merged": TableId.of_topic("bench", "ns", "merged")}
        ledgers: dict[str, list[LedgerObject]] = {k: [] for k in topics}
        for lid in range(args.ledgers):
            rng = random.Random(lid)     # half random bytes, half text: compresses about 2:1 like JSON-ish payloads
            entries = [(i, build_entry(Message(payload=(rng.randbytes(args.payload_bytes // 2)
                                                        + f"{lid}-{i}-".encode() * args.payload_bytes)[:args.payload_bytes]),
                                       producer_name="bench", sequence_id=i,
                                       publish_time_ms=1_700_000_000_000 + lid * 10_000 + i))
                       for i in range(args.entries)]
            data = encode_ledger(lid, entries, partition=-1).data
            for name in topics:
                key = f"bench/ns/{name}/ledger-{lid}-{'ab' * 8}.parquet"
                tier.put(key, data)
                ledgers[name].append(LedgerObject(lid, tier.uri_of(key), len(data), None))
        for name, tid in topics.items():
            lake.sync(tid, {o.ledger_id: o.uri for o in ledgers[name]}, prefix=f"{tier.uri}/bench/ns/{name}/")
        object_bytes = sum(o.size_bytes for o in ledgers["small"])

        merges = []
        while True:
            started = time.perf_counter()
            done = merge_once(lake, tier, topics["merged"], ledgers["merged"], object_prefix=f"{tier.uri}/bench/ns/merged/",
                              topic="bench/ns/merged", target_bytes=args.target_mib << 20, files_min=args.files_min,
                              row_group_bytes=8 << 20)
            if done is None:
                break
            merges.append((done[1], time.perf_counter() - started))

        locations = {k: lake.metadata_location(t) for k, t in topics.items()}
        files = {k: sorted(lake.table_files(t)) for k, t in topics.items()}

        def pyiceberg_scan(name: str) -> float:
            started = time.perf_counter()
            rows = StaticTable.from_metadata(locations[name]).scan().to_arrow().num_rows
            elapsed = time.perf_counter() - started
            assert rows == args.ledgers * args.entries
            return elapsed

        def duckdb_scan(name: str) -> float:
            con = duckdb.connect()
            paths = [f[len("file://"):] for f in files[name]]
            started = time.perf_counter()
            n, _, _ = con.execute("SELECT count(*), max(publish_time), sum(octet_length(value)) "
                                  "FROM read_parquet(?, union_by_name=true)", [paths]).fetchone()
            elapsed = time.perf_counter() - started
            con.close()
            assert n == args.ledgers * args.entries
            return elapsed

        for fn in (pyiceberg_scan, duckdb_scan):      # warm-up (imports, page cache)
            fn("small"), fn("merged")
        results = {}
        for fn in (pyiceberg_scan, duckdb_scan):
            ratios, small_s, merged_s = [], [], []
            for r in range(args.rounds):
                order = ("small", "merged") if r % 2 == 0 else ("merged", "small")
                got = {name: fn(name) for name in order}
                small_s.append(got["small"])
                merged_s.append(got["merged"])
                ratios.append(got["merged"] / got["small"])
            results[fn.__name__] = (statistics.median(small_s), statistics.median(merged_s), ratios)

    print(f"ledgers={args.ledgers} entries={args.entries} payload_bytes={args.payload_bytes} "
          f"objects={object_bytes / 1e6:.2f} MB (mean {object_bytes / args.ledgers / 1e3:.1f} kB)")
    print(f"files: small table {len(files['small'])}, merged table {len(files['merged'])}")
    for obj, total_s in merges:
        print(f"merge: read {obj.read_bytes / 1e6:.2f} MB -> {obj.size_bytes / 1e6:.2f} MB rows={obj.rows} "
              f"rewrite {obj.seconds:.3f} s ({obj.read_bytes / 1e6 / obj.seconds:.1f} MB/s), "
              f"with plan+commit {total_s:.3f} s ({obj.read_bytes / 1e6 / total_s:.1f} MB/s)")
    for name, (s, m, ratios) in results.items():
        print(f"{name}: small {s * 1000:.1f} ms, merged {m * 1000:.1f} ms (medians); ratio merged/small per round "
              f"{' '.join(f'{x:.2f}' for x in ratios)}, median {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
