"""Throughput probe for BookieStore (not a test): adds/s of 100 B entries in batches of 100
through ``BookieStore.add_entries`` with several concurrent callers, then 64 KiB entries.

    .venv/bin/python bench/probe_store.py [--callers 8] [--seconds 5] [--dir /tmp/x]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.common import work_dir  # noqa: E402
from bookie.storage import BookieStore, StoredEntry  # noqa: E402
from pulsarlite.checksum import entry_checksum  # noqa: E402
from pulsarlite.config import BookieConfig  # noqa: E402


def make_batches(ledger_id: int, first: int, batches: int, batch: int, size: int) -> list[list[StoredEntry]]:
    payload = os.urandom(size)
    out = []
    e = first
    length = 0
    for _ in range(batches):
        b = []
        for _ in range(batch):
            length += size
            b.append(StoredEntry(ledger_id, e, e - 1, length, payload,
                                 entry_checksum(ledger_id, e, e - 1, length, payload)))
            e += 1
        out.append(b)
    return out


async def run(store: BookieStore, callers: int, seconds: float, batch: int, size: int) -> tuple[float, float]:
    # precompute enough batches per caller (checksums are the writer's cost, not the bookie's)
    per_caller = max(1, int(60_000 / batch / callers * seconds)) if size <= 1024 else \
        max(1, int(2_000 / batch / callers * seconds))
    work = [make_batches(1000 + c + size, 0, per_caller, batch, size) for c in range(callers)]
    done = 0
    stop_at = time.perf_counter() + seconds

    async def caller(batches: list[list[StoredEntry]]) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < stop_at and i < len(batches):
            statuses = await store.add_entries(batches[i])
            if any(statuses):
                raise RuntimeError(f"add failed: {set(statuses)}")
            done += len(batches[i])
            i += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(caller(w) for w in work))
    dt = time.perf_counter() - t0
    return done / dt, done * size / dt / 1e6


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--callers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--no-uvloop", action="store_true")
    args = ap.parse_args()
    with work_dir(args.dir, "probe_store_") as base:
        cfg = BookieConfig(journal_dir=os.path.join(base, "journal"),
                           ledger_dir=os.path.join(base, "ledgers"))
        store = BookieStore.open(cfg)
        await store.start()
        rate, mbs = await run(store, args.callers, args.seconds, 100, 100)
        print(f"100 B entries, batches of 100, {args.callers} callers: {rate:,.0f} adds/s ({mbs:.1f} MB/s)")
        j = store._journal
        print(f"  journal groups={j.groups_written} bytes={j.bytes_written:,} "
              f"entries/group={(j.bytes_written / 145) / max(1, j.groups_written):.0f}")
        g0 = j.groups_written
        rate, mbs = await run(store, args.callers, args.seconds, 16, 64 * 1024)
        print(f"64 KiB entries, batches of 16, {args.callers} callers: {rate:,.0f} adds/s ({mbs:.1f} MB/s),"
              f" groups={j.groups_written - g0}")
        await store.close()


if __name__ == "__main__":
    if "--no-uvloop" in sys.argv:
        asyncio.run(main())
    else:
        import uvloop
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
