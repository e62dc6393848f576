"""`pulsarlite bookie --config FILE`: one bookie process.

Start order: config validated -> cookies checked (ZooKeeper vs disks) -> storage opened (the
journal replayed) -> serving (bookie/server.py) -> registered under /ledgers/available/. A monitor task
watches disk usage (read-only mode above the threshold, writable again below the lower one)
and the ZooKeeper session (re-registers after a session loss); another deletes orphan ledgers
(stored here, unknown to the metadata for longer than a grace period: bookie/orphan_gc.py);
with ``autorecovery_enabled`` an auditor candidate and a replication worker run too
(bookie/autorecovery/).
SIGTERM/SIGINT stop it cleanly; kill -9 is survived by journal replay.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from bookie.autorecovery.layout import DECOMMISSIONING_ROOT
from bookie.cookie import CookieError, check_and_write_cookies
from bookie.server import BookieServer, BookieService, load_server_keys
from bookie.storage import BookieStore
from pulsarlite.config import BookieConfig, zookeeper_auth
from pulsarlite.errors import PulsarliteError
from pulsarlite.metadata_layout import cookie_path
from pulsarlite.process import run_server, start_server_process

log = logging.getLogger("pulsarlite.bookie")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bookie", help="run a bookie (ledger storage server)")
    p.add_argument("--config", required=True, help="bookie TOML config file")
    p.set_defaults(func=run_from_args)


def run_from_args(args) -> int:
    config = start_server_process("bookie", BookieConfig, args.config)
    if config is None:
        return 2
    try:
        return run_server("bookie", run_bookie(config), log)
    except CookieError as e:
        log.error("%s", e)
        print(f"pulsarlite bookie: {e}", file=sys.stderr)
        return 3


def _report_death(task: asyncio.Task) -> None:
    """A background task that should run until cancelled ended: say so (nothing waits on it)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("background task died task=%s error=%r", task.get_coro().__name__, task.exception())


class ReadOnlyPolicy:
    """Pure: read-only above ``readonly_threshold`` of disk used, writable again only below
    ``writable_threshold`` (hysteresis, so the mode does not flap at the edge)."""

    def __init__(self, readonly_threshold: float, writable_threshold: float) -> None:
        self.readonly_threshold = readonly_threshold
        self.writable_threshold = writable_threshold

    def next_read_only(self, read_only: bool, used_fraction: float) -> bool:
        if not read_only and used_fraction >= self.readonly_threshold:
            return True
        if read_only and used_fraction < self.writable_threshold:
            return False
        return read_only


async def run_bookie(config: BookieConfig, *, stop_event: asyncio.Event | None = None) -> None:
    from bookie.client.ledger_manager import LedgerManager, register_bookie, unregister_bookie
    from bookie.orphan_gc import run_orphan_gc
    from pulsarlite.metadata import MetadataStore, SessionState

    bookie_id = config.effective_bookie_id
    stop_event = stop_event or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop_event.set)
        except (NotImplementedError, RuntimeError):  # not the main thread (tests)
            pass

    # key files first: a bad key setting refuses the start (ConfigError naming it) before the
    # cookies, the journal or the registration change anything
    keys = load_server_keys(config)
    zk = await MetadataStore.connect(config.zookeeper, session_timeout_ms=config.zk_session_timeout_ms,
                                     auth=zookeeper_auth(config))
    try:
        await check_and_write_cookies(zk, bookie_id, config.journal_dir, config.ledger_dir)
        store = BookieStore.open(config)
        await store.start()
        service = BookieService(store, config)
        server = BookieServer(service, config, keys=keys)
        await server.start()
        metrics = metrics_runner = None
        if config.metrics_port:
            from bookie.metrics import BookieMetrics, start_metrics_server
            metrics = BookieMetrics()
            service.metrics = metrics
            store._journal.on_sync = metrics.journal_sync_s.observe     # runs on the journal thread
            metrics_runner = await start_metrics_server(metrics, config.host, config.metrics_port)
        from pulsarlite.loop_monitor import start_from_env
        start_from_env()      # diagnostics, off unless PULSARLITE_LOOP_MONITOR_MS is set

        policy = ReadOnlyPolicy(config.disk_usage_readonly_threshold, config.disk_usage_writable_threshold)
        reregister = asyncio.Event()
        # a bookie being decommissioned (bookkeeper decommission) is read-only: no new ledgers
        # or ensemble changes pick it while its copies are moved away
        decommissioning = {"now": False}

        def on_decommissioning(names: list[str]) -> None:
            now = bookie_id in names
            if now != decommissioning["now"]:
                decommissioning["now"] = now
                log.warning("bookie decommissioning bookie=%s decommissioning=%s", bookie_id, now)
                reregister.set()

        decommission_watch = await zk.watch_children(DECOMMISSIONING_ROOT, on_decommissioning)
        used, _, _ = store.disk_usage()
        disk_read_only = policy.next_read_only(False, used)
        store.read_only = disk_read_only or decommissioning["now"]
        from bookie.autorecovery.racks import publish_rack
        await publish_rack(zk, bookie_id, config.rack)      # before registering: placement reads it
        await register_bookie(zk, bookie_id, read_only=store.read_only, metrics_address=config.metrics_address)
        log.info("bookie ready bookie=%s rack=%s read_only=%s journal=%s ledgers=%s entries=%d", bookie_id,
                 config.rack or "-", store.read_only, config.journal_dir, config.ledger_dir, store.entry_count())

        def on_session(state) -> None:
            if state is SessionState.CONNECTED:
                reregister.set()  # after a LOST session the ephemeral node is gone: put it back
            elif state is SessionState.LOST:
                log.warning("zookeeper session lost bookie=%s", bookie_id)

        zk.add_session_listener(on_session)

        async def monitor() -> None:
            nonlocal disk_read_only
            while True:
                used_fraction, free_bytes, _ = store.disk_usage()
                disk_read_only = policy.next_read_only(disk_read_only, used_fraction)
                read_only = disk_read_only or decommissioning["now"]
                if metrics is not None:
                    metrics.disk_checked(used_fraction, free_bytes, read_only)
                if read_only != store.read_only or reregister.is_set():
                    if read_only != store.read_only:
                        log.warning("bookie mode change bookie=%s read_only=%s used=%.3f free_bytes=%d "
                                    "decommissioning=%s", bookie_id, read_only, used_fraction, free_bytes,
                                    decommissioning["now"])
                    store.read_only = read_only
                    reregister.clear()
                    try:
                        await register_bookie(zk, bookie_id, read_only=read_only,
                                             metrics_address=config.metrics_address)
                    except PulsarliteError as e:
                        log.warning("re-registration failed bookie=%s: %s", bookie_id, e)
                        reregister.set()
                try:
                    await asyncio.wait_for(reregister.wait(), config.disk_check_interval_ms / 1000)
                except asyncio.TimeoutError:
                    pass

        monitor_task = asyncio.ensure_future(monitor())
        tasks = [monitor_task]
        if config.orphan_gc_enabled:
            cookie_znode = cookie_path(bookie_id)
            orphan_task = asyncio.ensure_future(run_orphan_gc(
                store, LedgerManager(zk).exists, lambda: zk.exists(cookie_znode), bookie_id=bookie_id,
                interval_ms=config.orphan_gc_interval_ms, grace_ms=config.orphan_ledger_grace_ms,
                lookups_per_pass_max=config.orphan_ledgers_per_pass_max))
            orphan_task.add_done_callback(_report_death)
            tasks.append(orphan_task)
        autorecovery = None
        if config.autorecovery_enabled:
            from bookie.autorecovery.service import start_in_bookie
            autorecovery = await start_in_bookie(zk, config, bookie_id, _report_death, metrics)
        await stop_event.wait()
        log.info("bookie stopping bookie=%s", bookie_id)
        for task in tasks:
            task.cancel()
        decommission_watch.cancel()
        if autorecovery is not None:
            service_ar, client_ar = autorecovery
            await service_ar.stop()
            await client_ar.close()
        service.closing = True
        try:
            await unregister_bookie(zk, bookie_id)
        except PulsarliteError:
            pass
        await server.stop(grace_s=2)
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        await store.close()
    finally:
        await zk.close()
