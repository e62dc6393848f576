"""What the broker's SEND check costs: ``check_sendable`` (pulsarlite/wire/entry.py) on the entries
producers send, against the checks it made before the poison-entry fix (declared sizes and batch
count only; copied below as ``declared_only``).

    .venv/bin/python bench/bench_check_sendable.py [--rounds 15] [--seconds 0.2]

Each round times every case with both functions, alternated (old, new, old, new...), as calls per
round of ~``--seconds``; prints the median microseconds per call over the rounds. ``peek`` is
``peek_metadata`` on the same entry (what the broker pays for every SEND anyway), for scale.
Not a test: figures only.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from pulsarlite.wire.entry import (SINGLE_MESSAGE_BYTES_MIN, UNCOMPRESSED_BYTES_MAX_DEFAULT,  # noqa: E402
                                   Compression, EntryFormatError, Message, build_batch_entry, build_entry,
                                   check_sendable, peek_metadata)

HEADER = dict(producer_name="standalone-0-12", publish_time_ms=1_700_000_000_000)


def declared_only(entry, meta, *, uncompressed_bytes_max=UNCOMPRESSED_BYTES_MAX_DEFAULT) -> None:
    """check_sendable as it was before the poison-entry fix (commit 719f0c7)."""
    raw = meta.raw
    batched = raw.HasField("num_messages_in_batch")
    compression = raw.compression
    if not compression:
        if not batched:
            return
        size = len(entry) - meta.payload_offset
    else:
        size = raw.uncompressed_size
        if not 0 <= size <= uncompressed_bytes_max:
            raise EntryFormatError("declared uncompressed size")
    if batched:
        count = raw.num_messages_in_batch
        if not 1 <= count <= max(1, size // SINGLE_MESSAGE_BYTES_MIN):
            raise EntryFormatError("batch message count")


def cases() -> dict[str, bytes]:
    payloads = [bytes([i % 251]) * 100 for i in range(100)]
    seqs = list(range(12_345, 12_445))
    keyed = [Message(p, key=f"key-{i}", properties={"k": "v"}) for i, p in enumerate(payloads)]
    out = {
        "single 100 B": build_entry(Message(b"x" * 100), sequence_id=12_345, **HEADER),
        "single 100 B, 2 properties": build_entry(Message(b"x" * 100, properties={"a": "1", "b": "2"}),
                                                  sequence_id=12_345, **HEADER),
        "batch 100 x 100 B": build_batch_entry(payloads, sequence_id=12_345, sequence_ids=seqs, **HEADER),
        "batch 100 x 90-109 B": build_batch_entry([b"v" * (90 + i % 20) for i in range(100)], sequence_id=12_345,
                                                  sequence_ids=seqs, **HEADER),
        "batch 100 x 100 B, keys+props": build_batch_entry(keyed, sequence_id=12_345, sequence_ids=seqs, **HEADER),
        "batch 1000 x 10 B": build_batch_entry([b"0123456789"] * 1000, sequence_id=12_345,
                                               sequence_ids=list(range(12_345, 13_345)), **HEADER),
    }
    for codec in (Compression.LZ4, Compression.ZSTD, Compression.ZLIB, Compression.SNAPPY):
        out[f"batch 100 x 100 B, {codec.name}"] = build_batch_entry(payloads, sequence_id=12_345, sequence_ids=seqs,
                                                                    compression=codec, **HEADER)
    out["single 10 KB, LZ4"] = build_entry(Message(b"y" * 10_000), sequence_id=1, compression=Compression.LZ4,
                                           **HEADER)
    return out


def per_call_us(fn, entry: bytes, meta, seconds: float) -> float:
    n = 1
    while True:                                    # calibrate: a batch of calls of >= 10 ms
        start = time.perf_counter()
        for _ in range(n):
            fn(entry, meta)
        took = time.perf_counter() - start
        if took >= 0.01:
            break
        n *= 4
    n = max(1, int(n * seconds / took))
    start = time.perf_counter()
    for _ in range(n):
        fn(entry, meta)
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--seconds", type=float, default=0.2, help="per case, function and round")
    args = ap.parse_args()
    entries = cases()
    metas = {name: peek_metadata(entry) for name, entry in entries.items()}
    for name, entry in entries.items():
        check_sendable(entry, metas[name])         # every case is sendable
    figures: dict[str, dict[str, list[float]]] = {name: {"old": [], "new": [], "peek": []} for name in entries}
    peek = lambda entry, meta: peek_metadata(entry)  # noqa: E731
    for _ in range(args.rounds):
        for name, entry in entries.items():
            for label, fn in (("old", declared_only), ("new", check_sendable), ("peek", peek)):
                figures[name][label].append(per_call_us(fn, entry, metas[name], args.seconds))
    print(f"median of {args.rounds} rounds, microseconds per call (Python {sys.version.split()[0]})")
    print(f"{'entry':34} {'bytes':>7} {'old':>8} {'new':>8} {'new-old':>8} {'peek':>7}")
    for name, entry in entries.items():
        old, new, pk = (statistics.median(figures[name][k]) for k in ("old", "new", "peek"))
        print(f"{name:34} {len(entry):7d} {old:8.2f} {new:8.2f} {new - old:8.2f} {pk:7.2f}")


if __name__ == "__main__":
    main()
