"""Autorecovery in a process: an auditor candidate and a replication worker sharing one
ZooKeeper session and one LedgerClient. Run inside every bookie (``autorecovery_enabled``) or
alone: ``pulsarlite autorecovery --config FILE`` (a bookie config file; only its zookeeper and
autorecovery settings are used)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import uuid

from bookie.autorecovery.auditor import Auditor
from bookie.autorecovery.worker import ReplicationWorker
from pulsarlite.config import BookieConfig

log = logging.getLogger("pulsarlite.autorecovery")


class AutoRecovery:
    def __init__(self, ledger_client, config: BookieConfig, node_id: str, metrics=None) -> None:
        self.auditor = Auditor(ledger_client.store, node_id,
                               lost_bookie_recovery_delay_ms=config.lost_bookie_recovery_delay_ms,
                               audit_interval_ms=config.audit_interval_ms, pool=ledger_client.pool,
                               replica_check_interval_ms=config.audit_replica_check_interval_ms,
                               replica_check_entries_per_fragment=config.audit_replica_check_entries_per_fragment,
                               replica_check_probes_max=config.audit_replica_check_probes_max,
                               metrics=metrics)
        self.worker = ReplicationWorker(
            ledger_client, node_id, poll_interval_ms=config.replication_poll_interval_ms,
            entries_in_flight_max=config.replication_entries_in_flight_max,
            bytes_per_s_max=config.replication_bytes_per_s_max,
            ledgers_concurrent_max=config.replication_ledgers_concurrent_max,
            retry_delay_ms_max=config.replication_retry_delay_ms_max,
            copy_timeout_ms=config.replication_copy_timeout_ms,
            read_run_entries_max=config.replication_read_run_entries_max, metrics=metrics)
        self._tasks: list[asyncio.Task] = []

    def start(self, on_death=None) -> list[asyncio.Task]:
        self._tasks = [asyncio.ensure_future(self.auditor.run()), asyncio.ensure_future(self.worker.run())]
        if on_death is not None:
            for t in self._tasks:
                t.add_done_callback(on_death)
        return self._tasks

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def start_in_bookie(zk, config: BookieConfig, bookie_id: str, on_death=None, metrics=None):
    """Inside a bookie: shares the bookie's ZooKeeper session. Returns (AutoRecovery, LedgerClient)."""
    from bookie.client.ledger_client import LedgerClient

    client = await LedgerClient.connect(config.ledger_client_config(), store=zk)   # its bookie credential too
    service = AutoRecovery(client, config, bookie_id, metrics)
    service.start(on_death)
    log.info("autorecovery started bookie=%s delay_ms=%d", bookie_id, config.lost_bookie_recovery_delay_ms)
    return service, client


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("autorecovery", help="run an auditor candidate and a replication worker alone")
    p.add_argument("--config", required=True, help="bookie TOML config (zookeeper and autorecovery settings)")
    p.set_defaults(func=run_from_args)


def run_from_args(args) -> int:
    from pulsarlite.process import run_server, start_server_process

    config = start_server_process("autorecovery", BookieConfig, args.config)
    if config is None:
        return 2
    return run_server("autorecovery", run_standalone(config), log)


async def run_standalone(config: BookieConfig, *, stop_event: asyncio.Event | None = None) -> None:
    from bookie.client.ledger_client import LedgerClient

    stop_event = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop_event.set)
        except (NotImplementedError, RuntimeError):
            pass
    node_id = f"autorecovery-{uuid.uuid4().hex[:8]}"
    client = await LedgerClient.connect(config.ledger_client_config())
    metrics_runner = None
    try:
        metrics = None
        if config.metrics_port:        # the same metrics as a bookie's (the autorecovery ones move)
            from bookie.metrics import BookieMetrics, start_metrics_server
            metrics = BookieMetrics()
            metrics_runner = await start_metrics_server(metrics, config.host, config.metrics_port)
        service = AutoRecovery(client, config, node_id, metrics)
        died = asyncio.Event()

        def on_death(t: asyncio.Task) -> None:
            if not t.cancelled() and t.exception() is not None:
                log.error("autorecovery task died node=%s error=%r", node_id, t.exception())
                print(f"pulsarlite autorecovery: {t.exception()!r}", file=sys.stderr)
                died.set()

        service.start(on_death)
        log.info("autorecovery ready node=%s", node_id)
        waiters = [asyncio.ensure_future(stop_event.wait()), asyncio.ensure_future(died.wait())]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        await service.stop()
    finally:
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        await client.close()
