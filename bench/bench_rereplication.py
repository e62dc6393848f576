"""Re-replication benchmark ([autorecovery]): how fast a lost bookie's copies are moved.

    .venv/bin/python bench/bench_rereplication.py [--mb 256] [--entry-kb 64] [--workers 1] [--run 16]
        [--write-quorum 2] [--dir D]

One run: the machine's raw fsync'd sequential write rate (1 MiB blocks, bench/machine_limits.py),
then 4 local bookies (autorecovery off inside them), ledgers of E3/Qw2/Qa2 holding --mb MB of
payload in --entry-kb KiB entries, one bookie killed -9, every ledger naming it marked
(`bookkeeper recover`), and --workers in-process replication workers (no throttle) timed until
nothing is marked. Prints the MB/s re-replicated (payload bytes written to replacements per
second) and its ratio to the raw fsync'd write rate; the time from the marks to full
replication (the loss-to-repair time adds lost_bookie_recovery_delay_ms to it). Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import random
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.common import work_dir  # noqa: E402
from bookie.autorecovery.urmanager import UnderReplicationManager  # noqa: E402
from bookie.autorecovery.worker import ReplicationWorker  # noqa: E402
from bookie.client.ledger_client import LedgerClient  # noqa: E402
from faces.cluster import LocalCluster  # noqa: E402
from pulsarlite.config import LedgerClientConfig  # noqa: E402

from machine_limits import disk_fsync_seq_mb_s  # noqa: E402

MB = 1_000_000
LEDGER_MB = 32


async def run(args, directory: pathlib.Path) -> dict:
    raw = disk_fsync_seq_mb_s(str(directory))
    print(f"raw fsync'd sequential write: {raw:.0f} MB/s", file=sys.stderr, flush=True)
    cluster = await asyncio.to_thread(LocalCluster.start, directory / "cluster", 4,
                                      bookie_overrides={"autorecovery_enabled": False})
    try:
        client = await LedgerClient.connect(LedgerClientConfig(zookeeper=cluster.zookeeper))
        workers_clients = [await LedgerClient.connect(LedgerClientConfig(zookeeper=cluster.zookeeper))
                           for _ in range(args.workers)]
        try:
            entry = random.Random(1).randbytes(args.entry_kb * 1024)
            total = args.mb * MB
            written = 0
            t0 = time.perf_counter()
            while written < total:
                writer = await client.create_ledger(3, args.write_quorum, 2)
                in_ledger = 0
                futs = []
                while in_ledger < LEDGER_MB * MB and written < total:
                    futs.append(writer.add_async(entry))
                    in_ledger += len(entry)
                    written += len(entry)
                    if len(futs) >= 256:
                        await asyncio.gather(*futs)
                        futs = []
                await asyncio.gather(*futs)
                await writer.close()
            print(f"wrote {written / MB:.0f} MB in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
            mds = [(await client.ledger_manager.read(lid))[0] for lid in await client.ledger_manager.list_ledger_ids()]
            counts: dict[str, int] = {}
            for md in mds:
                for b in md.all_bookies():
                    counts[b] = counts.get(b, 0) + 1
            victim = max(sorted(counts), key=counts.get)
            name = next(n for n in cluster.bookie_names if cluster.records[n].bookie_id == victim)
            await asyncio.to_thread(cluster.kill, name)
            urm = UnderReplicationManager(client.store)
            for md in mds:                  # closed, autorecovery off: the kill changes no metadata
                if victim in md.all_bookies():
                    await urm.mark(md.ledger_id, [victim], 0)
            marked = len(await urm.list_marked())
            workers = [ReplicationWorker(c, f"bench-{i}", poll_interval_ms=50, entries_in_flight_max=args.window,
                                         bytes_per_s_max=10 ** 12, ledgers_concurrent_max=2,
                                         retry_delay_ms_max=1000, copy_timeout_ms=30_000,
                                         read_run_entries_max=args.run)
                       for i, c in enumerate(workers_clients)]
            t0 = time.perf_counter()
            tasks = [asyncio.ensure_future(w.run()) for w in workers]
            while await urm.list_marked():
                await asyncio.sleep(0.05)
            elapsed = time.perf_counter() - t0
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            copied = sum(w.bytes_copied for w in workers)
            rate = copied / MB / elapsed
            return {"raw_fsync_mb_s": round(raw, 1), "payload_mb": round(written / MB), "ledgers_marked": marked,
                    "copied_mb": round(copied / MB, 1), "seconds": round(elapsed, 2),
                    "rereplication_mb_s": round(rate, 1), "ratio_to_raw": round(rate / raw, 3),
                    "workers": args.workers, "entry_kb": args.entry_kb, "window": args.window,
                    "run": args.run, "write_quorum": args.write_quorum}
        finally:
            for c in workers_clients:
                await c.close()
            await client.close()
    finally:
        await asyncio.to_thread(cluster.stop)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=256)
    p.add_argument("--entry-kb", type=int, default=64)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--window", type=int, default=64, help="entries in flight per fragment")
    p.add_argument("--run", type=int, default=16, help="consecutive entries read per request")
    p.add_argument("--write-quorum", type=int, default=2, help="Qw of the E3 ledgers written (Qa 2)")
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    with work_dir(None, "bench-rereplication-", parent=args.dir) as d:
        print(json.dumps(asyncio.run(run(args, d))))


if __name__ == "__main__":
    main()
