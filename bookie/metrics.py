"""The bookie's Prometheus metrics (own CollectorRegistry per process: nothing in
prometheus_client's global registry), served as text on ``http://host:metrics_port/metrics``
by a small aiohttp server (``BookieConfig.metrics_port``; 0 = off). Named after BookKeeper's
where one exists (its Prometheus provider's ``<scope>_<NAME>``); prometheus-client adds
``_total`` to counters and ``_bucket``/``_sum``/``_count`` to histograms. Latencies are in
seconds (BookKeeper's provider exports milliseconds as summaries).

| metric | kind | what |
|---|---|---|
| bookie_journal_JOURNAL_SYNC_seconds | histogram | one journal group's fdatasync |
| bookkeeper_server_ADD_ENTRY{success} | counter | entries added (acknowledged after fsync), or refused |
| bookkeeper_server_READ_ENTRY{success} | counter | read requests answered OK, or not |
| auditor_NUM_UNDER_REPLICATED_LEDGERS | gauge | marked ledgers at the auditor's last scan (only the elected auditor's bookie sets it; -1 elsewhere) |
| replication_worker_NUM_BYTES_WRITTEN | counter | payload bytes this bookie's worker re-replicated |
| replication_worker_NUM_ENTRIES_WRITTEN | counter | entries re-replicated |
| replication_worker_NUM_FRAGMENTS_REPLICATED | counter | fragments re-replicated (recorded in the metadata) |
| replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED | counter | ledgers whose mark this worker removed |
| replication_worker_UNDER_REPLICATED_seconds | histogram | from a ledger's mark to its removal (wall clock) |
| bookie_disk_free_bytes | gauge | free bytes of the fuller of the journal and ledger disks (each disk check) |
| bookie_disk_used_ratio | gauge | used fraction of that disk (read-only above disk_usage_readonly_threshold) |
| bookie_read_only | gauge | 1 while the bookie is read-only (disk full or decommissioning) |
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

log = logging.getLogger("pulsarlite.bookie")

_SYNC_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_UNDER_REPLICATED_BUCKETS_S = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)


class BookieMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.journal_sync_s = Histogram("bookie_journal_JOURNAL_SYNC_seconds",
                                        "Journal group fdatasync latency", buckets=_SYNC_BUCKETS_S, registry=r)
        self.add_entries = Counter("bookkeeper_server_ADD_ENTRY", "Entries added (success=true) or refused",
                                   ["success"], registry=r)
        self.read_requests = Counter("bookkeeper_server_READ_ENTRY", "Read requests answered OK or not",
                                     ["success"], registry=r)
        # the labelled children, resolved once: the hooks run per add and per read
        self._added_ok, self._added_refused = self.add_entries.labels("true"), self.add_entries.labels("false")
        self._read_ok, self._read_failed = self.read_requests.labels("true"), self.read_requests.labels("false")
        self.under_replicated_ledgers = Gauge("auditor_NUM_UNDER_REPLICATED_LEDGERS",
                                              "Under-replicated ledgers at the auditor's last scan "
                                              "(-1: this bookie is not the auditor)", registry=r)
        self.under_replicated_ledgers.set(-1)
        self.bytes_replicated = Counter("replication_worker_NUM_BYTES_WRITTEN",
                                        "Payload bytes re-replicated", registry=r)
        self.entries_replicated = Counter("replication_worker_NUM_ENTRIES_WRITTEN",
                                          "Entries re-replicated", registry=r)
        self.fragments_replicated = Counter("replication_worker_NUM_FRAGMENTS_REPLICATED",
                                            "Fragments re-replicated", registry=r)
        self.ledgers_replicated = Counter("replication_worker_NUM_FULL_OR_PARTIAL_LEDGERS_REPLICATED",
                                          "Ledgers whose under-replication mark was removed", registry=r)
        self.under_replicated_s = Histogram("replication_worker_UNDER_REPLICATED_seconds",
                                            "Time from a ledger's mark to its removal",
                                            buckets=_UNDER_REPLICATED_BUCKETS_S, registry=r)

        self.disk_free_bytes = Gauge("bookie_disk_free_bytes",
                                     "Free bytes of the fuller of the journal and ledger disks", registry=r)
        self.disk_used_ratio = Gauge("bookie_disk_used_ratio",
                                     "Used fraction of the fuller of the journal and ledger disks", registry=r)
        self.read_only = Gauge("bookie_read_only", "1 while the bookie is read-only (disk full, decommissioning)",
                               registry=r)

    # hooks (called from the server, the journal thread, the auditor, the worker and the disk monitor)
    def disk_checked(self, used_fraction: float, free_bytes: int, read_only: bool) -> None:
        self.disk_used_ratio.set(used_fraction)
        self.disk_free_bytes.set(free_bytes)
        self.read_only.set(1 if read_only else 0)

    def entries_added(self, ok: int, refused: int) -> None:
        if ok:
            self._added_ok.inc(ok)
        if refused:
            self._added_refused.inc(refused)

    def read_answered(self, ok: bool) -> None:
        (self._read_ok if ok else self._read_failed).inc()

    def fragment_replicated(self, entries: int, nbytes: int) -> None:
        self.fragments_replicated.inc()
        self.entries_replicated.inc(entries)
        self.bytes_replicated.inc(nbytes)

    def ledger_replicated(self, under_replicated_ms: int) -> None:
        self.ledgers_replicated.inc()
        self.under_replicated_s.observe(max(0, under_replicated_ms) / 1000)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


async def start_metrics_server(metrics: BookieMetrics, host: str, port: int):
    """Serve GET /metrics on host:port; returns the aiohttp runner (``await runner.cleanup()``)."""
    from aiohttp import web

    async def handle(_request: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("bookie metrics serving url=http://%s:%d/metrics", host, port)
    return runner
