"""Orphan ledgers: what this bookie stores for ledgers the metadata does not know.

Entries reach a bookie only after their ledger's metadata was created (bookie/client:
``LedgerClient.create_ledger`` creates it before any add), so a stored ledger without metadata
is one whose deletion this bookie missed (down when ``LedgerClient.delete_ledger`` ran, which
deletes the metadata last), or one a hostile or broken client wrote to without creating it.
Nothing else would ever reclaim its space. Like BookKeeper's garbage collector, the bookie
compares what it stores with the metadata (ZooKeeper, /ledgers/...) and deletes what the
metadata does not know ([hardening]).

Safety:

- A ledger is deleted only on a definite "no such node" answer, never on an error or timeout,
  and only in a pass that found this bookie's cookie (/ledgers/cookies/<bookie-id>) in the
  same metadata: metadata that was wiped, or the wrong ZooKeeper, would otherwise make every
  ledger look orphaned (the cookie check at start guards the same way).
- The grace period: a ledger is looked up only once ``orphan_ledger_grace_ms`` have passed
  since this process first saw it (the first pass that listed it); so a ledger created just
  now (its metadata written, a lagging ZooKeeper follower not showing it yet) is never touched.
  First sightings are kept in memory: after a restart every ledger waits a whole grace period
  again (later, never sooner).
- Bounded work per pass: at most ``orphan_ledgers_per_pass_max`` metadata lookups (and so
  deletions), round-robin over the candidates by ledger id; the in-memory scan of the ledger
  ids is linear in the ledgers stored.
- Deletion is the bookie's ordinary ``delete_ledger`` (journaled DELETE record; the entry-log
  GC reclaims the bytes later); each is logged with the ledger and the bookie.

``OrphanLedgerCollector`` is the pure core (time passed in, no I/O); ``run_orphan_gc`` the shell.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from typing import Awaitable, Callable, Iterable

from pulsarlite.errors import PulsarliteError, check

log = logging.getLogger("pulsarlite.bookie.orphan_gc")

# ledger ids the metadata's paths can name (/ledgers/<19 digits>): larger ones have no metadata
LEDGER_ID_WITH_METADATA_MAX = 10 ** 19 - 1


class Lookup(enum.Enum):
    """The metadata's answer about one ledger."""

    KNOWN = "known"          # its metadata exists
    UNKNOWN = "unknown"      # definitely no metadata (no such node)
    ERROR = "error"          # no definite answer (session lost, timeout): changes nothing


class OrphanLedgerCollector:
    """Pure: which stored ledgers to look up in the metadata this pass, and which to delete."""

    def __init__(self, grace_ms: int, lookups_per_pass_max: int) -> None:
        check(grace_ms > 0 and lookups_per_pass_max > 0, "grace and lookups per pass must be > 0")
        self.grace_ms = grace_ms
        self.lookups_per_pass_max = lookups_per_pass_max
        self._first_seen_ms: dict[int, int] = {}    # stored ledger id -> first pass that saw it
        self._cursor = -1                            # round-robin: last ledger id looked up
        self._asked: set[int] = set()

    @property
    def tracked(self) -> int:
        return len(self._first_seen_ms)

    def first_seen_ms(self, ledger_id: int) -> int | None:
        return self._first_seen_ms.get(ledger_id)

    def plan(self, stored_ledger_ids: Iterable[int], now_ms: int) -> list[int]:
        """Start a pass over the ledgers stored now: the ids to look up in the metadata (at
        most ``lookups_per_pass_max``, older than the grace period, in id order from after the
        last one looked up, wrapping around)."""
        stored = set(stored_ledger_ids)
        first_seen = self._first_seen_ms
        for gone in [i for i in first_seen if i not in stored]:
            del first_seen[gone]
        for ledger_id in stored:
            if ledger_id not in first_seen:
                first_seen[ledger_id] = now_ms
        due = sorted(i for i, seen in first_seen.items() if now_ms - seen >= self.grace_ms)
        if not due:
            self._asked = set()
            return []
        n = self.lookups_per_pass_max
        after = [i for i in due if i > self._cursor]
        picked = (after + [i for i in due if i <= self._cursor])[:n]
        self._cursor = picked[-1]
        self._asked = set(picked)
        return picked

    def on_lookups(self, answers: dict[int, Lookup], now_ms: int) -> list[int]:
        """The metadata's answers for this pass's lookups: the ledgers to delete (unknown to the
        metadata, first seen longer than the grace period ago)."""
        out = []
        for ledger_id, answer in answers.items():
            if ledger_id not in self._asked or answer is not Lookup.UNKNOWN:
                continue
            seen = self._first_seen_ms.get(ledger_id)
            if seen is not None and now_ms - seen >= self.grace_ms:
                out.append(ledger_id)
        self._asked = set()
        return sorted(out)

    def deleted(self, ledger_id: int) -> None:
        self._first_seen_ms.pop(ledger_id, None)


LookupFn = Callable[[int], Awaitable[bool]]      # ledger id -> its metadata exists (raises on error)
DeleteFn = Callable[[int], Awaitable[object]]
TrustFn = Callable[[], Awaitable[bool]]          # the metadata is this bookie's cluster's (its cookie)


async def collect_once(core: OrphanLedgerCollector, stored_ledger_ids: Iterable[int], exists: LookupFn,
                       delete: DeleteFn, bookie_id: str, now_ms: Callable[[], int],
                       metadata_trusted: TrustFn) -> list[int]:
    """One pass: look up the due ledgers, delete the orphans. Returns the ledgers deleted."""
    ids = core.plan(stored_ledger_ids, now_ms())
    answers: dict[int, Lookup] = {}
    for ledger_id in ids:
        if ledger_id > LEDGER_ID_WITH_METADATA_MAX:
            answers[ledger_id] = Lookup.UNKNOWN
            continue
        try:
            answers[ledger_id] = Lookup.KNOWN if await exists(ledger_id) else Lookup.UNKNOWN
        except PulsarliteError as e:
            answers[ledger_id] = Lookup.ERROR
            log.warning("orphan ledger check skipped ledger=%d bookie=%s: %s", ledger_id, bookie_id, e)
    orphans = core.on_lookups(answers, now_ms())
    if not orphans:
        return []
    try:
        trusted = await metadata_trusted()
    except PulsarliteError as e:
        log.warning("orphan ledgers kept this pass bookie=%s: cannot check the cookie: %s", bookie_id, e)
        return []
    if not trusted:
        log.error("orphan ledgers kept bookie=%s count=%d first=%d: this bookie's cookie is not in the "
                  "metadata (wiped, or the wrong ZooKeeper?)", bookie_id, len(orphans), orphans[0])
        return []
    deleted = []
    for ledger_id in orphans:
        seen = core.first_seen_ms(ledger_id)
        try:
            await delete(ledger_id)
        except PulsarliteError as e:
            log.warning("orphan ledger delete failed ledger=%d bookie=%s: %s", ledger_id, bookie_id, e)
            continue
        core.deleted(ledger_id)
        deleted.append(ledger_id)
        log.warning("orphan ledger deleted: stored here, unknown to the metadata for longer than the "
                    "grace period ledger=%d bookie=%s first_seen_s_ago=%.0f grace_ms=%d", ledger_id,
                    bookie_id, (now_ms() - seen) / 1000 if seen is not None else -1, core.grace_ms)
    return deleted


async def run_orphan_gc(store, exists: LookupFn, metadata_trusted: TrustFn, *, bookie_id: str,
                        interval_ms: int, grace_ms: int, lookups_per_pass_max: int) -> None:
    """The shell: a pass every ``interval_ms`` until cancelled (run it as a tracked task)."""
    core = OrphanLedgerCollector(grace_ms, lookups_per_pass_max)

    def now_ms() -> int:
        return int(time.monotonic() * 1000)

    while True:
        try:
            await collect_once(core, store.ledger_ids(), exists, store.delete_ledger, bookie_id, now_ms,
                               metadata_trusted)
        except PulsarliteError as e:        # the store failed: the next pass tries again
            log.warning("orphan ledger pass failed bookie=%s: %s", bookie_id, e)
        await asyncio.sleep(interval_ms / 1000)


__all__ = ["Lookup", "OrphanLedgerCollector", "collect_once", "run_orphan_gc"]
