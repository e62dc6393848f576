"""Bookie metrics and racks on real ZooKeeper and real bookie processes: every bookie the
launcher starts serves Prometheus text on its metrics port (recorded in the process record);
adds, journal syncs and reads are counted; after a bookie is lost for good the re-replication
counters and the time-under-replicated histogram have moved; the racks the bookies were
configured with are published under /ledgers/racks."""

from __future__ import annotations

import asyncio
import re
import urllib.request

import pytest

from bookie.autorecovery.racks import read_racks

from .test_autorecovery import FAST, connect, name_of, wait_until_nothing_names, write_ledger

pytestmark = pytest.mark.integration


def scrape(cluster, name: str) -> dict[str, float]:
    """``{series: value}`` of one bookie's /metrics (series with their labels, as printed)."""
    port = cluster.records[name].ports["metrics"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z_:][\w:]*(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def total(samples: list[dict[str, float]], series: str) -> float:
    return sum(s.get(series, 0.0) for s in samples)


async def test_bookie_metrics_count_adds_syncs_reads_and_re_replication(cluster_factory):
    racks = {f"bookie-{i}": {"rack": f"rack{i % 2}"} for i in range(6)}      # names as the launcher's
    cluster = await asyncio.to_thread(cluster_factory, 4, bookie_overrides={**FAST, **racks})
    client = await connect(cluster)
    try:
        published = await read_racks(client.store)
        assert published == {cluster.records[n].bookie_id: racks[n]["rack"] for n in cluster.bookie_names}
        assert len(set(published.values())) == 2
        written: dict[int, int] = {}
        lid = await write_ledger(client, 3, 2, 2, 40, 0, written)
        md, _ = await client.ledger_manager.read(lid)
        reader = await client.open_ledger(lid, recovery=False)
        await reader.read(0, 39)

        before = [await asyncio.to_thread(scrape, cluster, n) for n in cluster.bookie_names]
        assert total(before, 'bookkeeper_server_ADD_ENTRY_total{success="true"}') >= 80     # 40 x Qw
        assert total(before, "bookie_journal_JOURNAL_SYNC_seconds_count") >= 1
        assert total(before, 'bookkeeper_server_READ_ENTRY_total{success="true"}') >= 1
        assert total(before, "replication_worker_NUM_FRAGMENTS_REPLICATED_total") == 0

        victim = md.ensembles[0][1][0]
        await asyncio.to_thread(cluster.kill, name_of(cluster, victim))
        await wait_until_nothing_names(client, cluster, victim)
        live = [n for n in cluster.bookie_names if cluster.records[n].bookie_id != victim]
        after = [await asyncio.to_thread(scrape, cluster, n) for n in live]
        assert total(after, "replication_worker_NUM_FRAGMENTS_REPLICATED_total") >= 1
        assert total(after, "replication_worker_NUM_ENTRIES_WRITTEN_total") >= 1
        assert total(after, "replication_worker_NUM_BYTES_WRITTEN_total") > 0
        assert total(after, "replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED_total") >= 1
        assert total(after, "replication_worker_UNDER_REPLICATED_seconds_count") >= 1
        # exactly one live bookie is the auditor: it reports the marks it saw (0 or more)
        gauges = [s["auditor_NUM_UNDER_REPLICATED_LEDGERS"] for s in after]
        assert sum(1 for g in gauges if g >= 0) == 1, gauges
        md, _ = await client.ledger_manager.read(lid)
        assert victim not in md.all_bookies()
    finally:
        await client.close()
