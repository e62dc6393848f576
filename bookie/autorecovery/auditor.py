"""The auditor (shell): elected through ZooKeeper, it feeds the pure AuditorCore with the
bookie registrations, full scans of the ledger metadata and ticks, and writes the marks it
decides.

Election: each candidate creates an ephemeral sequential node under
/ledgers/underreplication/auditorelection (data: its id); the lowest is the auditor. Every
candidate watches the children; when the auditor's session ends its node goes and the next
candidate takes over (a candidate whose own node vanished, after a session loss, creates a new
one). The auditor scans every ledger at start, whenever the bookies or the decommissioning set
change, and every ``audit_interval_ms``; it ticks when a missing bookie's delay ends.

Every ``replica_check_interval_ms`` (0: never) it also probes a sample of the closed ledgers'
entries on each replica (``plan_replica_check``) and marks a ledger for a bookie that answers it
lacks an entry or returns a copy failing its checksum.
"""

from __future__ import annotations

import asyncio
import logging
import time

import random

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.autorecovery.auditor_core import (AuditorCore, BookieLost, MarkLedger, ReplicaProbe, UnmarkBookies,
                                              plan_replica_check)
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
                 audit_interval_ms: int, pool=None, replica_check_interval_ms: int = 0,
                 replica_check_entries_per_fragment: int = 3, replica_check_probes_max: int = 10_000,
                 rng: random.Random | None = None, metrics=None) -> None:
        self.metrics = metrics       # a bookie.metrics.BookieMetrics, or None
        self.pool = pool
        self.replica_check_interval_ms = replica_check_interval_ms if pool is not None else 0
        self.replica_check_entries_per_fragment = replica_check_entries_per_fragment
        self.replica_check_probes_max = replica_check_probes_max
        self.rng = rng or random.Random()
        self.replica_checks = 0
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
                        if self.metrics is not None:
                            self.metrics.under_replicated_ledgers.set(-1)
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
        last_check_ms = _now_ms()
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
                if self.replica_check_interval_ms and _now_ms() - last_check_ms >= self.replica_check_interval_ms:
                    try:
                        pending.extend(await self._check_replicas(core))
                    except PulsarliteError as e:
                        log.warning("replica check failed auditor=%s: %s", self.candidate_id, e)
                    last_check_ms = _now_ms()
                deadline = core.next_deadline_ms()
                wait_ms = self.audit_interval_ms - (_now_ms() - last_scan_ms)
                if self.replica_check_interval_ms:
                    wait_ms = min(wait_ms, self.replica_check_interval_ms - (_now_ms() - last_check_ms))
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
        listed = await self.urm.list_marks()
        marks = {m.ledger_id: m.missing_bookies for m in listed}
        lost_marks = {m.ledger_id: m.lost_bookies for m in listed if m.lost_bookies}
        decommissioning = await self.urm.decommissioning()
        self.scans += 1
        if self.metrics is not None:
            self.metrics.under_replicated_ledgers.set(len(marks))
        return core.on_scan(ledgers, marks, decommissioning, _now_ms(), lost_marks)

    async def _check_replicas(self, core: AuditorCore) -> list:
        """Probe a sample of entries on their replicas; returns MarkLedger actions for the
        bookies found lacking one (executed by the caller)."""
        from bookie.client.reader import verify_entry

        probes = plan_replica_check(core.ledgers(), self.replica_check_entries_per_fragment,
                                    self.replica_check_probes_max, self.rng)
        semaphore = asyncio.Semaphore(16)
        lacking: dict[int, set[str]] = {}

        async def probe(p: ReplicaProbe) -> None:
            async with semaphore:
                try:
                    resp = await self.pool.get(p.bookie).read(p.ledger_id, p.entry_id, p.entry_id)
                except PulsarliteError:
                    return          # unreachable: the lost-bookie delay decides
            if resp.code in (pb.NO_SUCH_ENTRY, pb.NO_SUCH_LEDGER, pb.CHECKSUM_MISMATCH):
                problem = pb.StatusCode.Name(resp.code)
            elif resp.code == pb.OK and (not resp.entries or not verify_entry(resp.entries[0], p.ledger_id, p.entry_id)):
                problem = "checksum mismatch"
            else:
                return
            log.warning("replica check: copy missing ledger=%d entry=%d bookie=%s problem=%s",
                        p.ledger_id, p.entry_id, p.bookie, problem)
            lacking.setdefault(p.ledger_id, set()).add(p.bookie)

        await asyncio.gather(*(probe(p) for p in probes))
        self.replica_checks += 1
        log.info("replica check done auditor=%s probes=%d ledgers_lacking=%d", self.candidate_id,
                 len(probes), len(lacking))
        return [MarkLedger(lid, tuple(sorted(bs))) for lid, bs in sorted(lacking.items())]

    async def _execute(self, core: AuditorCore, actions: list) -> None:
        for a in actions:
            if isinstance(a, BookieLost):
                log.warning("bookie lost for good bookie=%s reason=%s ledgers=%d delay_ms=%d",
                            a.bookie_id, a.reason, a.ledgers, self.delay_ms)
            elif isinstance(a, UnmarkBookies):
                try:
                    done = await self.urm.remove_from_mark(a.ledger_id, a.bookies)
                except PulsarliteError as e:
                    done = False
                    log.warning("taking returned bookies out of a mark failed ledger=%d bookies=%s: %s",
                                a.ledger_id, ",".join(a.bookies), e)
                core.on_unmarked_bookies(a.ledger_id, a.bookies, done)
                if done:
                    log.info("returned bookie taken out of the mark ledger=%d bookies=%s", a.ledger_id,
                             ",".join(a.bookies))
            elif isinstance(a, MarkLedger):
                try:
                    mark = await self.urm.mark(a.ledger_id, a.missing_bookies, int(time.time() * 1000),
                                               a.lost_bookies)
                    core.on_marked(a.ledger_id, mark.missing_bookies)
                    log.info("ledger marked under-replicated ledger=%d missing=%s", a.ledger_id,
                             ",".join(mark.missing_bookies))
                except PulsarliteError as e:
                    core.on_mark_failed(a.ledger_id, a.missing_bookies)
                    log.warning("marking failed ledger=%d missing=%s: %s", a.ledger_id,
                                ",".join(a.missing_bookies), e)
