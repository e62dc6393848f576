"""The under-replication metadata over a MetadataStore (shell; paths in ``layout``): marks,
worker locks, decommissioning bookies. After BookKeeper's ZkLedgerUnderreplicationManager."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Iterable

from bookie.autorecovery.layout import (DECOMMISSIONING_ROOT, LOCKS_ROOT, MARKS_ROOT,
                                        UnderReplicatedMark, decommissioning_path, is_mark_leaf,
                                        is_mark_level, ledger_id_of_mark, lock_path, mark_path,
                                        merge_mark)
from pulsarlite.errors import MetadataNotFoundError, MetadataVersionConflict
from pulsarlite.metadata import MetadataExistsError, MetadataNotEmptyError, MetadataStore

log = logging.getLogger("pulsarlite.autorecovery")


class UnderReplicationManager:
    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    # -- marks ---------------------------------------------------------------------------
    async def mark(self, ledger_id: int, missing: Iterable[str], now_ms: int,
                   lost: Iterable[str] = ()) -> UnderReplicatedMark:
        """Mark ``ledger_id`` under-replicated for ``missing`` (merged into an existing mark by
        CAS); ``lost``: those of them marked because they were lost."""
        missing, lost = tuple(missing), tuple(lost)
        data, _ = await self.store.update(mark_path(ledger_id),
                                          lambda cur: merge_mark(cur, ledger_id, missing, now_ms, lost))
        return UnderReplicatedMark.from_json(data)

    async def read_mark(self, ledger_id: int) -> tuple[UnderReplicatedMark, int] | None:
        got = await self.store.get_or_none(mark_path(ledger_id))
        if got is None:
            return None
        try:
            return UnderReplicatedMark.from_json(got[0]), got[1]
        except ValueError:
            log.warning("malformed under-replication mark ledger=%d: dropped and re-audited", ledger_id)
            return UnderReplicatedMark(ledger_id, ("?",), 0), got[1]

    async def unmark(self, ledger_id: int, version: int) -> bool:
        """Delete the mark if it is still at ``version`` (True), else leave it (False: it changed,
        a bookie was added to it meanwhile). Empty parent levels are left in place (BookKeeper
        does the same; they are cheap and reused)."""
        try:
            await self.store.delete(mark_path(ledger_id), version)
            return True
        except MetadataNotFoundError:
            return True
        except MetadataVersionConflict:
            return False

    async def remove_from_mark(self, ledger_id: int, bookies: Iterable[str]) -> bool:
        """Take ``bookies`` out of the mark (compare-and-set; the mark is deleted if none is
        left). True when done (or nothing to do), False when the mark changed meanwhile."""
        got = await self.read_mark(ledger_id)
        if got is None:
            return True
        mark, version = got
        left = set(mark.missing_bookies) - set(bookies)
        if len(left) == len(mark.missing_bookies):
            return True
        if not left:
            return await self.unmark(ledger_id, version)
        kept = UnderReplicatedMark.of(ledger_id, left, mark.ctime_ms, set(mark.lost_bookies) - set(bookies))
        try:
            await self.store.set(mark_path(ledger_id), kept.to_json(), version)
            return True
        except MetadataNotFoundError:
            return True
        except MetadataVersionConflict:
            return False

    async def list_marked(self) -> list[int]:
        """Every marked ledger id, ascending (walks the four hex levels)."""
        paths = [MARKS_ROOT]
        for _ in range(4):
            listed = await asyncio.gather(*(self.store.children(p) for p in paths))
            paths = [f"{p}/{n}" for p, names in zip(paths, listed) for n in names if is_mark_level(n)]
        listed = await asyncio.gather(*(self.store.children(p) for p in paths))
        ids = []
        for p, names in zip(paths, listed):
            for n in names:
                if is_mark_leaf(n):
                    try:
                        ids.append(ledger_id_of_mark(f"{p}/{n}"))
                    except ValueError:
                        log.warning("stray node under the marks path=%s/%s", p, n)
        return sorted(ids)

    async def list_marks(self) -> list[UnderReplicatedMark]:
        out = []
        for ledger_id in await self.list_marked():
            got = await self.read_mark(ledger_id)
            if got is not None:
                out.append(got[0])
        return out

    # -- locks ---------------------------------------------------------------------------
    async def try_lock(self, ledger_id: int, owner: str) -> bool:
        """Take the ephemeral lock of ``ledger_id`` (False if another worker holds it)."""
        try:
            await self.store.create(lock_path(ledger_id), owner.encode(), ephemeral=True, make_parents=True)
            return True
        except MetadataExistsError:
            return False

    async def unlock(self, ledger_id: int, session_id: int | None = None) -> None:
        """Delete the lock. With ``session_id`` (the session that took it), only if that
        session still owns it: after a session loss the node went with the old session, and
        one that exists now is another worker's (or ours under a new session, taken again)."""
        path = lock_path(ledger_id)
        try:
            if session_id is None:
                await self.store.delete(path)
                return
            stat = await self.store.stat(path)
            if stat is None:
                return
            if stat.ephemeral_owner != session_id:
                log.info("lock not released: held by another session ledger=%d", ledger_id)
                return
            await self.store.delete(path, stat.version)
        except (MetadataNotFoundError, MetadataVersionConflict):
            pass

    async def lock_holder(self, ledger_id: int) -> str | None:
        got = await self.store.get_or_none(lock_path(ledger_id))
        return None if got is None else got[0].decode(errors="replace")

    async def locked(self) -> list[str]:
        return await self.store.children(LOCKS_ROOT)

    # -- decommissioning -----------------------------------------------------------------
    async def start_decommission(self, bookie_id: str, now_ms: int) -> None:
        """The bookie is being decommissioned (again, if it was done: state back to
        "decommissioning")."""
        data = json.dumps({"bookie": bookie_id, "ctime_ms": now_ms, "state": "decommissioning"}).encode()
        try:
            await self.store.create(decommissioning_path(bookie_id), data, make_parents=True)
        except MetadataExistsError:
            await self.store.set(decommissioning_path(bookie_id), data, -1)

    async def finish_decommission(self, bookie_id: str, now_ms: int) -> None:
        """Nothing names the bookie any more: the node stays (state "decommissioned"), so the
        bookie stays read-only and anything naming it again is moved; ``cancel_decommission``
        removes it."""
        path = decommissioning_path(bookie_id)
        await self.store.set(path, json.dumps({"bookie": bookie_id, "ctime_ms": now_ms,
                                               "state": "decommissioned"}).encode(), -1)

    async def cancel_decommission(self, bookie_id: str) -> bool:
        try:
            await self.store.delete(decommissioning_path(bookie_id))
            return True
        except (MetadataNotFoundError, MetadataNotEmptyError):
            return False

    async def decommissioning(self) -> list[str]:
        """Every bookie with a decommissioning node (being decommissioned or done)."""
        return await self.store.children(DECOMMISSIONING_ROOT)

    async def decommission_states(self) -> dict[str, str]:
        out = {}
        for name in await self.decommissioning():
            got = await self.store.get_or_none(decommissioning_path(name))
            if got is None:
                continue
            try:
                out[name] = str(json.loads(got[0]).get("state", "decommissioning"))
            except (ValueError, AttributeError):
                out[name] = "decommissioning"
        return out
