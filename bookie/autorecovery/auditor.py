"""The auditor (shell): elected through ZooKeeper, it feeds the pure AuditorCore with the
bookie registrations, full scans of the ledger metadata and ticks, and writes the marks it
decides.

Election: each candidate creates an ephemeral sequential node under
/ledgers/underreplication/auditorelection (data: its id); the lowest is the auditor. Every
candidate watches the children; when the auditor's session ends its node goes and the next
candidate takes over (a candidate whose own node vanished, after a session loss, creates a new
one). The auditor scans every ledger at start, whenever the bookies or the decommissioning set
change, and every ``audit_interval_ms``; it ticks when a missing bookie's delay ends.
"""

from __future__ import annotations

import asyncio
import logging
import time

from bookie.autorecovery.auditor_core import AuditorCore, BookieLost, MarkLedger
from bookie.autorecovery.layout import DECOMMISSIONING_ROOT, ELECTION_PREFIX, ELECTION_ROOT
from bookie.autorecovery.urmanager import UnderReplicationManager
from bookie.client.ledger_manager import LedgerManager
from pulsarlite.errors import MetadataNotFoundError, PulsarliteError
from pulsarlite.metadata import MetadataStore

log = logging.getLogger("pulsarlite.autorecovery")


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


async def current_auditor(store: MetadataStore) -> str | None:
    """The id of the elected auditor (lowest election node), or None."""
    names = await store.children(ELECTION_ROOT)
    for name in sorted(names, key=lambda n: n.rsplit("_", 1)[-1]):
        got = await store.get_or_none(f"{ELECTION_ROOT}/{name}")
        if got is not None:
            return got[0].decode(errors="replace")
    return None


class Auditor:
    def __init__(self, store: MetadataStore, candidate_id: str, *, lost_bookie_recovery_delay_ms: int,
                 audit_interval_ms: int) -> None:
        self.store = store
        self.candidate_id = candidate_id
        self.delay_ms = lost_bookie_recovery_delay_ms
        self.audit_interval_ms = audit_interval_ms
        self.urm = UnderReplicationManager(store)
        self.ledgers = LedgerManager(store)
        self.is_auditor = False
        self.scans = 0

    async def run(self) -> None:
        """Stand for election, audit while elected; until cancelled."""
        changed = asyncio.Event()
        watch = await self.store.watch_children(ELECTION_ROOT, lambda _: changed.set())
        my_node: str | None = None
        try:
            while True:
                try:
                    if my_node is None or not await self.store.exists(my_node):
                        my_node = await self.store.create(ELECTION_PREFIX, self.candidate_id.encode(),
                                                          ephemeral=True, sequence=True, make_parents=True)
                    names = await self.store.children(ELECTION_ROOT)
                    lowest = min(names, key=lambda n: n.rsplit("_", 1)[-1]) if names else None
                    if lowest is not None and f"{ELECTION_ROOT}/{lowest}" == my_node:
                        log.info("auditor elected auditor=%s node=%s", self.candidate_id, my_node)
                        self.is_auditor = True
                        try:
                            await self._audit_while_elected(my_node)
                        finally:
                            self.is_auditor = False
                        log.info("auditor stepped down auditor=%s", self.candidate_id)
                        continue
                except PulsarliteError as e:
                    log.warning("auditor election trouble candidate=%s: %s", self.candidate_id, e)
                    await asyncio.sleep(1.0)
                    continue
                except Exception:       # a bug: logged loudly, the candidate stands again
                    log.exception("auditor crashed candidate=%s", self.candidate_id)
                    await asyncio.sleep(1.0)
                    continue
                changed.clear()
                try:
                    await asyncio.wait_for(changed.wait(), 5.0)
                except asyncio.TimeoutError:
                    pass
        finally:
            watch.cancel()
            if my_node is not None:
                try:
                    await self.store.delete(my_node)
                except (PulsarliteError, RuntimeError):
                    pass

    async def _audit_while_elected(self, my_node: str) -> None:
        core = AuditorCore(self.delay_ms)
        wake = asyncio.Event()
        scan_needed = asyncio.Event()
        scan_needed.set()
        pending: list = []

        def on_bookies(writable: list[str], readonly: list[str]) -> None:
            pending.extend(core.on_bookies(writable, readonly, _now_ms()))
            log.info("auditor sees bookies writable=%s readonly=%s", ",".join(writable), ",".join(readonly))
            scan_needed.set()
            wake.set()

        def on_decommissioning(names: list[str]) -> None:
            scan_needed.set()
            wake.set()

        watches = list(await self.ledgers.watch_bookies(on_bookies))
        watches.append(await self.store.watch_children(DECOMMISSIONING_ROOT, on_decommissioning))
        last_scan_ms = 0
        try:
            while True:
                if not await self.store.exists(my_node):
                    return           # our session ended: stand again
                now = _now_ms()
                if scan_needed.is_set() or now - last_scan_ms >= self.audit_interval_ms:
                    scan_needed.clear()
                    try:
                        pending.extend(await self._scan(core))
                        last_scan_ms = _now_ms()
                    except PulsarliteError as e:
                        log.warning("audit scan failed auditor=%s: %s", self.candidate_id, e)
                        await asyncio.sleep(1.0)
                        scan_needed.set()
                        continue
                pending.extend(core.on_tick(_now_ms()))
                actions, pending[:] = list(pending), []
                await self._execute(core, actions)
                deadline = core.next_deadline_ms()
                wait_ms = self.audit_interval_ms - (_now_ms() - last_scan_ms)
                if deadline is not None:
                    wait_ms = min(wait_ms, deadline - _now_ms() + 1)
                wake.clear()
                if pending or scan_needed.is_set():
                    continue
                try:
                    await asyncio.wait_for(wake.wait(), max(0.01, min(wait_ms, 5_000) / 1000))
                except asyncio.TimeoutError:
                    pass
        finally:
            for w in watches:
                w.cancel()

    async def _scan(self, core: AuditorCore) -> list:
        ids = await self.ledgers.list_ledger_ids()
        ledgers = []
        for lid in ids:
            try:
                md, _ = await self.ledgers.read(lid)
            except MetadataNotFoundError:
                continue            # deleted meanwhile
            except PulsarliteError as e:
                if e.retriable:
                    raise
                log.error("audit: unreadable ledger metadata ledger=%d: %s", lid, e)
                continue
            ledgers.append(md)
        marks = {m.ledger_id: m.missing_bookies for m in await self.urm.list_marks()}
        decommissioning = await self.urm.decommissioning()
        self.scans += 1
        return core.on_scan(ledgers, marks, decommissioning, _now_ms())

    async def _execute(self, core: AuditorCore, actions: list) -> None:
        for a in actions:
            if isinstance(a, BookieLost):
                log.warning("bookie lost for good bookie=%s reason=%s ledgers=%d delay_ms=%d",
                            a.bookie_id, a.reason, a.ledgers, self.delay_ms)
            elif isinstance(a, MarkLedger):
                try:
                    mark = await self.urm.mark(a.ledger_id, a.missing_bookies, int(time.time() * 1000))
                    core.on_marked(a.ledger_id, mark.missing_bookies)
                    log.info("ledger marked under-replicated ledger=%d missing=%s", a.ledger_id,
                             ",".join(mark.missing_bookies))
                except PulsarliteError as e:
                    core.on_mark_failed(a.ledger_id, a.missing_bookies)
                    log.warning("marking failed ledger=%d missing=%s: %s", a.ledger_id,
                                ",".join(a.missing_bookies), e)
