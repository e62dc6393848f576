"""[lakehouse] What a table commit adds to an offload, in one process (no bookies, no broker):
for each of N ledgers, encode its entries to a tier object (offload.reader.encode_ledger, the
offloader's encoder, with typed columns from a JSON schema) and write it to a file:// tier --
the offload's own work without the bookie read -- then commit it to the topic's Iceberg table
(offload.lake.Lake.sync, the broker's CommitToTable step). Prints offload MB/s without and with
the commit, and the commit's seconds (the delay from an object written to its rows queryable)
as the table grows.

    .venv/bin/python bench/bench_lake.py [--ledgers 20] [--entries 2000] [--payload-bytes 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import work_dir  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ledgers", type=int, default=20)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--payload-bytes", type=int, default=200)
    args = ap.parse_args()

    from offload.tier import TableTypedColumns
    from offload.lake import Lake, TableId
    from offload.reader import encode_ledger
    from pulsarlite.wire.entry import Message, build_entry

    schema = {"type": "record", "name": "Order", "fields": [
        {"name": "item", "type": "string"}, {"name": "qty", "type": "int"}, {"name": "note", "type": "string"}]}
    version = (0).to_bytes(8, "big")
    note = "x" * max(0, args.payload_bytes - 40)

    started = time.perf_counter()
    import pyiceberg.catalog.sql  # noqa: F401 - the one-time import, measured apart
    import_s = time.perf_counter() - started

    with work_dir(None, "bench-lake-") as d:
        tier = Path(d) / "tier"
        lake = Lake(f"file://{tier}")
        tid = TableId.of_topic("bench", "ns", "orders")
        prefix = f"file://{tier}/bench/ns/orders/"
        offloaded: dict[int, str] = {}
        encode_s, commit_s, sizes, payload = [], [], [], 0
        for ledger in range(args.ledgers):
            entries = [(i, build_entry(Message(payload=json.dumps({"item": f"i{ledger}-{i}", "qty": i,
                                                                   "note": note}).encode()),
                                       producer_name="bench", sequence_id=i,
                                       publish_time_ms=1_700_000_000_000 + ledger * 10_000 + i,
                                       schema_version=version))
                       for i in range(args.entries)]
            payload += sum(len(e) for _, e in entries)
            t0 = time.perf_counter()
            typed = TableTypedColumns([(0, "JSON", json.dumps(schema))], topic="bench", ledger_id=ledger)
            encoded = encode_ledger(ledger, entries, partition=-1, columns=typed)
            path = tier / "bench" / "ns" / "orders" / f"ledger-{ledger}-{'ab' * 8}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(encoded.data)
            t1 = time.perf_counter()
            offloaded[ledger] = f"file://{path}"
            lake.sync(tid, offloaded, prefix=prefix, topic="bench")
            t2 = time.perf_counter()
            encode_s.append(t1 - t0)
            commit_s.append(t2 - t1)
            sizes.append(len(encoded.data))
        rows = len(lake.load(tid).scan().to_arrow())

    mb = payload / 1e6
    total_encode, total_commit = sum(encode_s), sum(commit_s)
    print(f"ledgers={args.ledgers} entries/ledger={args.entries} entry payload ~{args.payload_bytes} B "
          f"entry bytes={mb:.1f} MB object bytes={sum(sizes) / 1e6:.1f} MB rows in table={rows}")
    print(f"pyiceberg import (once per broker process): {import_s:.2f} s")
    print(f"offload without table commit: {mb / total_encode:.1f} MB/s (encode+write {total_encode:.2f} s)")
    print(f"offload with table commit:    {mb / (total_encode + total_commit):.1f} MB/s "
          f"(ratio {total_encode / (total_encode + total_commit):.2f})")
    print(f"commit seconds (object written -> rows queryable): first {commit_s[0]:.3f} (creates the table), "
          f"median {statistics.median(commit_s[1:] or commit_s):.3f}, last {commit_s[-1]:.3f}, "
          f"max {max(commit_s):.3f}")


if __name__ == "__main__":
    main()
