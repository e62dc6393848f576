"""Offload and tier-read benchmark of the ``offload`` package alone (no broker):

    .venv/bin/python bench/bench_offload.py [--mb 32] [--repeat 3] [--stores file,s3]
                                            [--append BENCHMARKS.md]

For each workload (batched: entries of 100 messages of 100 B, LZ4, as the official client sends
with batching on; single: one 1 KiB message per entry) and each store (``file://`` in a temp
dir; ``s3://`` on moto's server started here, a child process on 127.0.0.1):

  encode     entries -> Arrow table -> Parquet bytes (offload.format), in memory
  offload    offload.reader.write_ledger_object: encode + CRC32C + put (the broker's step)
  read       offload.reader.TierReader.read_entries over the whole ledger with the recorded
             checksum: parallel ranged GETs of the object, CRC32C, decode, entries rebuilt
  read-rg    the same over every row group through the row-group path (ranged GETs per row
             group, read-ahead 2, page checksums), i.e. what a range read does
  direct     pyarrow.parquet.read_table of the same object (local file; or pyarrow's own
             S3FileSystem on the same endpoint), all columns, no rebuild

MB/s are of message payload bytes; medians of --repeat runs. Prints a markdown table and the
ratios read / direct. Not a test: figures only.
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow.parquet as pq  # noqa: E402

from bench.common import work_dir  # noqa: E402

from offload.format import entries_to_table, write_parquet  # noqa: E402
from tests.local_s3 import LocalS3Server  # noqa: E402
from offload.reader import TierReader, write_ledger_object  # noqa: E402
from offload.store import open_object_store  # noqa: E402
from pulsarlite.wire.entry import Compression, Message, build_batch_entry, build_entry  # noqa: E402


def make_workload(kind: str, mb: int) -> tuple[list[tuple[int, bytes]], int, int]:
    """(entries, payload bytes, messages)"""
    rng = random.Random(1)
    target = mb * 1024 * 1024
    entries: list[tuple[int, bytes]] = []
    total = messages = 0
    seq = 0
    publish = 1_700_000_000_000
    # half-compressible payloads (random tail): realistic for LZ4 and Parquet's zstd
    while total < target:
        if kind == "batched":
            msgs = [Message(payload=b"user-event:" + rng.randbytes(45) + b"\x00" * 44,
                            key=f"key-{seq % 1000}", sequence_id=seq + j) for j in range(100)]
            entry = build_batch_entry(msgs, producer_name="bench", sequence_id=seq,
                                      publish_time_ms=publish + len(entries),
                                      compression=Compression.LZ4)
            total += 100 * 100
            messages += 100
            seq += 100
        else:
            entry = build_entry(Message(payload=rng.randbytes(512) + b"\x00" * 512),
                                producer_name="bench", sequence_id=seq,
                                publish_time_ms=publish + len(entries))
            total += 1024
            messages += 1
            seq += 1
        entries.append((len(entries), entry))
    return entries, total, messages


def timed(fn, repeat: int) -> tuple[float, object]:
    times = []
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=32, help="payload MB per workload")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stores", default="file,s3")
    parser.add_argument("--workloads", default="batched,single")
    parser.add_argument("--row-group-mb", type=float, default=8.0)
    parser.add_argument("--append", metavar="FILE", help="append the table to this markdown file")
    args = parser.parse_args()

    rows: list[list[str]] = []
    ratios: list[str] = []
    row_group_bytes = int(args.row_group_mb * 1024 * 1024)
    with work_dir(None, "bench-offload-") as tmp:
        s3 = None
        try:
            stores = {}
            for name in args.stores.split(","):
                if name == "file":
                    stores["file"] = (open_object_store(Path(tmp, "tier").as_uri()), None)
                elif name == "s3":
                    s3 = LocalS3Server(Path(tmp, "moto"))
                    s3.start()
                    s3.create_bucket("bench")
                    os.environ.update({k: v for k, v in s3.env.items()
                                       if k != "AWS_ENDPOINT_URL"})
                    stores["s3"] = (open_object_store("s3://bench/tier",
                                                      s3_endpoint_url=s3.endpoint_url),
                                    s3.endpoint_url)
            for kind in args.workloads.split(","):
                entries, payload, messages = make_workload(kind, args.mb)
                mb = payload / 1e6
                print(f"# {kind}: {len(entries)} entries, {messages} messages, {mb:.1f} MB "
                      "payload", file=sys.stderr)

                def encode():
                    import io
                    table = entries_to_table(1, entries, partition=-1)
                    buf = io.BytesIO()
                    write_parquet(table, buf, row_group_bytes=row_group_bytes)
                    return buf.getbuffer().nbytes

                t_encode, object_bytes = timed(encode, args.repeat)
                rows.append([kind, "-", "encode (entries -> Parquet, memory)",
                             f"{mb / t_encode:.1f}", f"{messages / t_encode:,.0f}"])
                for store_name, (store, endpoint) in stores.items():
                    key = f"t/ns/topic/ledger-1-{'ab' * 8}-{kind}.parquet"
                    t_off, written = timed(lambda: write_ledger_object(
                        store, key, 1, entries, partition=-1,
                        row_group_bytes=row_group_bytes), args.repeat)
                    rows.append([kind, store_name, "offload (encode + crc + put)",
                                 f"{mb / t_off:.1f}", f"{messages / t_off:,.0f}"])

                    def read_all():
                        r = TierReader(written.uri, s3_endpoint_url=endpoint,
                                       size_bytes=written.stats.size_bytes,
                                       checksum=written.stats.checksum)
                        return sum(1 for _ in r.read_entries())

                    def read_row_groups():
                        r = TierReader(written.uri, s3_endpoint_url=endpoint,
                                       size_bytes=written.stats.size_bytes,
                                       read_ahead_row_groups=2)
                        return sum(1 for _ in r.read_entries())

                    def direct():
                        if store_name == "file":
                            path = Path(store.root, *key.split("/"))
                            return pq.read_table(path).num_rows
                        import pyarrow.fs as pafs
                        fs = pafs.S3FileSystem(
                            access_key=s3.env["AWS_ACCESS_KEY_ID"],
                            secret_key=s3.env["AWS_SECRET_ACCESS_KEY"],
                            region=s3.env["AWS_DEFAULT_REGION"],
                            endpoint_override=endpoint, scheme="http")
                        return pq.read_table(f"bench/tier/{key}", filesystem=fs).num_rows

                    t_read, n = timed(read_all, args.repeat)
                    assert n == len(entries), (n, len(entries))
                    t_rg, n = timed(read_row_groups, args.repeat)
                    assert n == len(entries)
                    t_direct, n = timed(direct, args.repeat)
                    assert n == messages
                    rows.append([kind, store_name, "tier read (whole object, rebuilt entries)",
                                 f"{mb / t_read:.1f}", f"{messages / t_read:,.0f}"])
                    rows.append([kind, store_name, "tier read (row groups, read-ahead 2)",
                                 f"{mb / t_rg:.1f}", f"{messages / t_rg:,.0f}"])
                    rows.append([kind, store_name, "direct pyarrow.parquet.read_table",
                                 f"{mb / t_direct:.1f}", f"{messages / t_direct:,.0f}"])
                    ratios.append(f"{kind}/{store_name}: read/direct {t_direct / t_read:.2f}, "
                                  f"read-rg/direct {t_direct / t_rg:.2f} "
                                  f"(object {written.stats.size_bytes / 1e6:.1f} MB, "
                                  f"{written.row_groups} row groups)")
                    store.delete(key)
        finally:
            if s3 is not None:
                s3.stop()

    table = ["| workload | store | step | MB/s (payload) | msg/s |", "|---|---|---|---|---|"]
    table += ["| " + " | ".join(r) + " |" for r in rows]
    text = "\n".join(table) + "\n\n" + "\n".join(f"- {r}" for r in ratios) + "\n"
    print(text)
    if args.append:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d ~%H:%M UTC")
        command = "`.venv/bin/python bench/bench_offload.py " + " ".join(sys.argv[1:]) + "`"
        with open(args.append, "a") as f:
            f.write(f"\n### Offload package: encode, offload, tier read vs direct pyarrow "
                    f"({stamp}, machine shared with other work: noisy)\n"
                    f"Command: {command}\n\n{text}")


if __name__ == "__main__":
    main()
