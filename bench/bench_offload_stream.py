"""Offload of one big closed ledger vs reading that ledger from the bookies, in the same run,
and the broker's RSS growth while it offloads ([perf] issue 29, "Streaming offload").

    .venv/bin/python bench/bench_offload_stream.py [--mb 200] [--rounds 3] [--size 100000]
                                                   [--tier file|s3] [--big-mb 2000] [--json]

Starts a local cluster (3 bookies E3/Qw3/Qa2, 1 broker, fsync on) whose broker offloads to a
``file://`` directory (or moto's S3 server, ``--tier s3``), with ledgers rolled at --mb MB and
a deletion lag of an hour (ledgers stay on the bookies). Produces --rounds closed ledgers of
--mb MB of --size-byte messages (unbatched: one message an entry; random hex text, ~2x
compressible), then for each ledger in turn, alternating:

  replay   the bench process opens the ledger with the broker's ledger client
           (bookie.client, ``open_ledger(recovery=False)`` + ``read_some`` reply by reply, as
           the offloader reads; an older broker read by ``iter_entries``): the read path of
           the offloader without encoding: MB/s of the ledger's bytes
  offload  admin ``PUT .../offload`` before the next ledger; poll the status every 50 ms until
           SUCCESS: MB/s of the ledger's bytes over the wall time (read from the bookies,
           encode, upload, verification, CAS); the broker's VmRSS sampled every 50 ms from just
           before the trigger: peak growth over that baseline

Prints one JSON object: per round the MB/s of both, the ratio offload / replay, the broker's
write step seconds and loop lags over 20 ms (from its log: ``offload start`` .. ``offload
written``; the broker runs with PULSARLITE_LOOP_MONITOR_MS=20), the RSS growth; their medians / max. ``--big-mb N`` instead produces one N MB ledger
and offloads it once (RSS growth only; an old broker refuses ledgers over 1 GiB). Not a test:
figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import re
import statistics
import sys
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import pulsar  # noqa: E402

from bench.common import http, start_tier, work_dir  # noqa: E402
from faces.cluster import LocalCluster  # noqa: E402

TOPIC = "offload-stream"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class RssSampler(threading.Thread):
    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval_s = pid, interval_s
        self.baseline = rss_mb(pid)
        self.peak = self.baseline
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            time.sleep(self.interval_s)

    def stop(self) -> float:
        self._halt.set()
        self.join()
        self.peak = max(self.peak, rss_mb(self.pid))
        return self.peak - self.baseline


def produce(client, topic: str, total_bytes: int, size: int) -> int:
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True,
                                      max_pending_messages=200, send_timeout_millis=120_000)
    n = max(1, total_bytes // size)
    for _ in range(n):
        producer.send_async(os.urandom(size // 2).hex().encode(), None)
    producer.flush()
    producer.close()
    return n


async def replay_from_bookies(zookeeper: str, ledger_id: int, entries: int) -> tuple[int, float]:
    """The offloader's read path (broker/offloader.py ``_read_from_bookies``): one bookie reply
    after the other (``read_some``; ``iter_entries`` where the tree has no ``read_some``);
    bytes read and seconds."""
    from bookie.client.ledger_client import LedgerClient
    from pulsarlite.config import LedgerClientConfig
    client = await LedgerClient.connect(LedgerClientConfig(zookeeper=zookeeper))
    try:
        started = time.perf_counter()
        reader = await client.open_ledger(ledger_id, recovery=False)
        first = got = 0
        if not hasattr(reader, "read_some"):
            async for e in reader.iter_entries(0, entries - 1):
                got += len(e.payload)
            return got, time.perf_counter() - started
        while first < entries:
            batch = await reader.read_some(first, entries - 1)
            got += sum(len(e.payload) for e in batch)
            first += len(batch)
        return got, time.perf_counter() - started
    finally:
        await client.close()


def broker_log_figures(log_path: pathlib.Path, ledger_id: int) -> dict:
    """The write step's seconds and the loop lags over the monitor's threshold between the
    broker's ``offload start`` and ``offload written`` lines of ``ledger_id``."""
    seconds = None
    waits: dict[str, float] = {}      # streaming broker only: who waited for whom in the write step
    lags: list[float] = []
    inside = False
    for line in log_path.read_text(errors="replace").splitlines():
        if f"offload start topic=" in line and f" ledger={ledger_id} " in line:
            inside = True
        elif inside and "loop lag ms=" in line:
            lags.append(float(re.search(r"loop lag ms=([\d.]+)", line).group(1)))
        elif inside and "offload written" in line and f" ledger={ledger_id} " in line:
            m = re.search(r"seconds=([\d.]+)", line)
            seconds = float(m.group(1)) if m else None
            waits = {k: float(v) for k, v in re.findall(r"(read_wait_s|encode_wait_s)=([\d.]+)", line)}
            break
    return {"write_step_s": seconds, "loop_lags_over_threshold": len(lags), "loop_lag_ms_max": max(lags, default=0.0),
            **waits}


def offload(turl: str, before_ledger: int, pid: int) -> tuple[float, float, str]:
    sampler = RssSampler(pid)
    sampler.start()
    t0 = time.perf_counter()
    http("PUT", turl + "/offload", {"ledgerId": before_ledger, "entryId": 0})
    while True:
        status = http("GET", turl + "/offload")
        if status["status"] in ("SUCCESS", "ERROR"):
            break
        time.sleep(0.05)
    seconds = time.perf_counter() - t0
    growth = sampler.stop()
    return seconds, growth, status["status"] if status["status"] == "SUCCESS" else f"ERROR {status['lastError']}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=200, help="MB of each closed ledger")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=100_000, help="message (= entry) size in bytes")
    ap.add_argument("--tier", choices=["file", "s3"], default="file")
    ap.add_argument("--big-mb", type=int, default=0, help="one ledger of this many MB, offloaded once (RSS only)")
    ap.add_argument("--dir", help="cluster directory (default: a temporary one)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object first")
    args = ap.parse_args()

    ledger_mb = args.big_mb or args.mb
    rounds = 1 if args.big_mb else args.rounds
    with work_dir(args.dir, "bench-offstream-") as work:
        s3, endpoint, tier_uri = start_tier(work, args.tier)
        os.environ.setdefault("PULSARLITE_LOOP_MONITOR_MS", "20")    # the broker logs loop lags >= 20 ms
        cluster = LocalCluster(work / "cluster")
        try:
            cluster.start_processes(bookies=3, brokers=1, broker_overrides={
                "offload.tier_uri": tier_uri, "offload.tier_s3_endpoint_url": endpoint or "",
                "managed_ledger.rollover_bytes_max": ledger_mb * 1_000_000, "managed_ledger.rollover_entries_max": 10_000_000,
                "offload.deletion_lag_ms": 3_600_000, "offload.check_interval_ms": 3_600_000})
            admin = cluster.admin_url
            http("POST", f"{admin}/admin/v2/namespaces/public/default/retention",
                 {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
            topic = f"persistent://public/default/{TOPIC}"
            turl = f"{admin}/admin/v2/persistent/public/default/{TOPIC}"
            broker = cluster.records[cluster.broker_names[0]]
            client = pulsar.Client(cluster.service_url, operation_timeout_seconds=120)
            t0 = time.perf_counter()
            n = produce(client, topic, rounds * ledger_mb * 1_000_000 + 2 * args.size, args.size)
            print(f"produced {n} messages in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
            ledgers = http("GET", turl + "/internalStats")["ledgers"]
            closed = [i for i in ledgers[:-1] if i["entries"] > 0][:rounds]
            print(f"closed ledgers: {[(i['ledgerId'], i['entries'], i['size']) for i in closed]}", file=sys.stderr)
            out_rounds = []
            for i, info in enumerate(closed):
                nxt = ledgers[ledgers.index(info) + 1]["ledgerId"]
                replay_mb_s = None
                if not args.big_mb:
                    nbytes, rsec = asyncio.run(replay_from_bookies(cluster.zookeeper, info["ledgerId"], info["entries"]))
                    replay_mb_s = nbytes / rsec / 1e6
                osec, growth, status = offload(turl, nxt, broker.pid)
                figures = broker_log_figures(pathlib.Path(broker.log), info["ledgerId"])
                row = {"ledger_id": info["ledgerId"], "ledger_mb": info["size"] / 1e6, "status": status,
                       "offload_mb_s": info["size"] / osec / 1e6, "replay_bookies_mb_s": replay_mb_s,
                       "ratio_offload_replay": None if replay_mb_s is None else info["size"] / osec / 1e6 / replay_mb_s,
                       "rss_growth_mb": growth, **figures}
                print(json.dumps(row), file=sys.stderr)
                out_rounds.append(row)
            client.close()
            ok = [r for r in out_rounds if r["status"] == "SUCCESS"]
            med = lambda k: statistics.median([r[k] for r in ok if r[k] is not None]) if ok else None  # noqa: E731
            result = {"mb": ledger_mb, "size": args.size, "tier": args.tier, "rounds": out_rounds,
                      "big": bool(args.big_mb), "statuses": [r["status"] for r in out_rounds],
                      "offload_mb_s_median": med("offload_mb_s"),
                      "replay_bookies_mb_s_median": None if args.big_mb else med("replay_bookies_mb_s"),
                      "ratio_offload_replay_median": None if args.big_mb else med("ratio_offload_replay"),
                      "rss_growth_mb_max": max((r["rss_growth_mb"] for r in out_rounds), default=None),
                      "loop_lag_ms_max": max((r["loop_lag_ms_max"] for r in out_rounds), default=None)}
            if args.json:
                print(json.dumps(result))
            print(f"\n### Streaming offload ({args.tier}; ledgers of {ledger_mb} MB of {args.size}-byte messages)\n")
            print("| round | offload MB/s | replay from bookies MB/s | ratio | write step s | RSS growth MB | loop lags > threshold (max ms) | status |")
            print("|---|---|---|---|---|---|---|---|")
            for i, r in enumerate(out_rounds):
                rep = "n/a" if r["replay_bookies_mb_s"] is None else f"{r['replay_bookies_mb_s']:.1f}"
                ratio = "n/a" if r["ratio_offload_replay"] is None else f"{r['ratio_offload_replay']:.2f}"
                print(f"| {i + 1} | {r['offload_mb_s']:.1f} | {rep} | {ratio} | {r['write_step_s']} | "
                      f"{r['rss_growth_mb']:.0f} | {r['loop_lags_over_threshold']} ({r['loop_lag_ms_max']:.0f}) | {r['status']} |")
            return 0
        finally:
            cluster.stop()
            if s3 is not None:
                s3.stop()


if __name__ == "__main__":
    sys.exit(main())
