"""Reading ledgers (shell): from any replica of each entry's write set, verifying every entry's
CRC32C (invariant 8), failing over to the next replica when a bookie is down, answers that it
lacks the entry, or returns bytes that fail their checksum.

Open ledgers are read up to their LAC without fencing (a reader never disturbs the writer);
closed ledgers up to their last entry.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.client.bookie_client import BookieClientPool
from bookie.client.metadata import LedgerMetadata, LedgerState
from pulsarlite.checksum import entry_checksum
from pulsarlite.config import LedgerClientConfig
from pulsarlite.errors import (BookieUnavailableError, ChecksumError, NoSuchEntryError,
                               NoSuchLedgerError, PulsarliteError)

log = logging.getLogger("pulsarlite.ledger_client")


@dataclass(frozen=True)
class LedgerEntry:
    ledger_id: int
    entry_id: int
    payload: bytes
    length: int   # ledger payload bytes through this entry


def verify_entry(e: pb.Entry, ledger_id: int, entry_id: int) -> bool:
    return verified_payload(e, ledger_id, entry_id) is not None


def verified_payload(e: pb.Entry, ledger_id: int, entry_id: int) -> bytes | None:
    """The entry's payload if it is entry ``entry_id`` of ``ledger_id`` and its checksum holds,
    else None. (Each read of a protobuf bytes field copies it: read once here.)"""
    if e.ledger_id != ledger_id or e.entry_id != entry_id:
        return None
    payload = e.payload
    return payload if entry_checksum(ledger_id, entry_id, e.lac, e.length, payload) == e.checksum else None


class LedgerReader:
    def __init__(self, metadata: LedgerMetadata, pool: BookieClientPool, config: LedgerClientConfig,
                 *, last_add_confirmed: int,
                 reload_metadata: Callable[[], Awaitable[LedgerMetadata]] | None = None) -> None:
        self.metadata = metadata
        self._pool = pool
        self._config = config
        self.last_add_confirmed = last_add_confirmed
        # a closed ledger's fragments may move to other bookies after this reader was opened
        # (autorecovery): when no replica of an entry answers, the metadata is read again once
        self._reload_metadata = reload_metadata

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    @property
    def last_readable_entry_id(self) -> int:
        if self.metadata.state is LedgerState.CLOSED:
            return self.metadata.last_entry_id
        return self.last_add_confirmed

    async def refresh_lac(self) -> int:
        """Re-read the LAC of an open ledger (non-fencing); never goes backwards."""
        if self.metadata.state is not LedgerState.CLOSED:
            self.last_add_confirmed = max(self.last_add_confirmed,
                                          await read_lac(self.metadata, self._pool, fence=False))
        return self.last_readable_entry_id

    async def read(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        """Entries first..last inclusive; all of them or an error."""
        return [e async for e in self.iter_entries(first_entry_id, last_entry_id)]

    async def iter_entries(self, first_entry_id: int, last_entry_id: int) -> AsyncIterator[LedgerEntry]:
        """Entries first..last in order, read in ranges of up to read_entries_per_request_max with
        one range read ahead."""
        if first_entry_id < 0:
            raise ValueError(f"ledger {self.ledger_id}: first entry id must be >= 0")
        if last_entry_id > self.last_readable_entry_id:
            raise NoSuchEntryError(
                f"ledger {self.ledger_id}: entry {last_entry_id} is past the last readable entry "
                f"{self.last_readable_entry_id} (LAC of an open ledger, last entry of a closed one)")
        step = self._config.read_entries_per_request_max
        ranges = [(a, min(a + step - 1, last_entry_id)) for a in range(first_entry_id, last_entry_id + 1, step)]
        pending: asyncio.Task | None = None
        try:
            for i, (a, b) in enumerate(ranges):
                task = pending or asyncio.ensure_future(self._read_range(a, b))
                pending = asyncio.ensure_future(self._read_range(*ranges[i + 1])) if i + 1 < len(ranges) else None
                for entry in await task:
                    yield entry
        finally:
            if pending is not None:
                pending.cancel()

    async def _read_range(self, first: int, last: int) -> list[LedgerEntry]:
        return await self._read_adopting_moved_fragments(self._read_range_once, first, last)

    async def _read_adopting_moved_fragments(self, read_once, first: int, last: int) -> list[LedgerEntry]:
        """``read_once(first, last)``, once more if it failed because the ledger's fragments
        moved to other bookies since this reader was opened (autorecovery)."""
        try:
            return await read_once(first, last)
        except (BookieUnavailableError, NoSuchEntryError, ChecksumError):
            if not await self._adopt_moved_fragments():
                raise
            return await read_once(first, last)

    async def _adopt_moved_fragments(self) -> bool:
        """Re-read a CLOSED ledger's metadata; True if its fragments now name other bookies
        (re-replicated since this reader was opened), which this reader then uses."""
        if self._reload_metadata is None or self.metadata.state is not LedgerState.CLOSED:
            return False
        try:
            current = await self._reload_metadata()
        except PulsarliteError:
            return False
        if (current.ledger_id != self.ledger_id or current.state is not LedgerState.CLOSED
                or current.last_entry_id != self.metadata.last_entry_id
                or current.ensembles == self.metadata.ensembles):
            return False
        log.info("ledger fragments moved since the reader opened ledger=%d ensembles=%s",
                 self.ledger_id, current.ensembles)
        self.metadata = current
        return True

    async def read_some(self, first_entry_id: int, last_entry_id: int) -> list[LedgerEntry]:
        """Entries from first on, at most up to last: what one replica's reply holds (a bookie
        bounds a reply's payload bytes, its ``read_bytes_max``; one entry on a striped ledger),
        at least one; the same replicas, checksums and failover as ``read``. A caller that must
        bound its memory whatever the entries' sizes reads a ledger by these (the offloader)."""
        if first_entry_id < 0 or last_entry_id < first_entry_id:
            raise ValueError(f"ledger {self.ledger_id}: bad range {first_entry_id}..{last_entry_id}")
        if last_entry_id > self.last_readable_entry_id:
            raise NoSuchEntryError(
                f"ledger {self.ledger_id}: entry {last_entry_id} is past the last readable entry "
                f"{self.last_readable_entry_id} (LAC of an open ledger, last entry of a closed one)")
        return await self._read_adopting_moved_fragments(self._read_some_once, first_entry_id, last_entry_id)

    async def _read_range_once(self, first: int, last: int) -> list[LedgerEntry]:
        out: list[LedgerEntry] = []
        entry_id = first
        while entry_id <= last:
            out.extend(await self._read_some_once(entry_id, last))
            entry_id = out[-1].entry_id + 1
        return out

    async def _read_some_once(self, entry_id: int, last: int) -> list[LedgerEntry]:
        # stay within one fragment: its ensemble decides the replicas
        fragment_end = last
        for start, _ in self.metadata.ensembles:
            if start > entry_id:
                fragment_end = min(fragment_end, start - 1)
                break
        md = self.metadata
        if md.write_quorum == md.ensemble_size:
            # every bookie of the fragment holds every entry: read the whole range from one
            # replica, rotating the starting replica so readers spread over the ensemble
            ensemble = md.ensemble_for(entry_id)
            replicas = [ensemble[(entry_id + i) % len(ensemble)] for i in range(len(ensemble))]
            return await self._read_from_replicas(replicas, entry_id, fragment_end)
        # striped: each entry lives on its own write set; read entry by entry
        return await self._read_from_replicas(md.write_set(entry_id), entry_id, entry_id)

    async def _read_from_replicas(self, replicas, first: int, last: int) -> list[LedgerEntry]:
        """The verified prefix of first..last from the first replica that has one; the next
        replica on any failure (down, missing, bad checksum)."""
        errors = []
        for bookie in replicas:
            try:
                resp = await self._pool.get(bookie).read(self.ledger_id, first, last)
            except BookieUnavailableError as e:
                errors.append(str(e))
                continue
            entries = self._accept(resp, bookie, first)
            if entries:
                return entries
            errors.append(f"{bookie}: {_reply_problem(resp)}")
        raise self._no_replica(first, errors)

    def _accept(self, resp: pb.ReadResponse, bookie: str, first: int) -> list[LedgerEntry]:
        """The verified prefix of a reply (entries must be consecutive from ``first``)."""
        if resp.code != pb.OK:
            return []
        out = []
        expected = first
        for e in resp.entries:
            payload = verified_payload(e, self.ledger_id, expected)
            if payload is None:
                log.error("checksum mismatch ledger=%d entry=%d bookie=%s: trying another replica",
                          self.ledger_id, expected, bookie)
                break
            out.append(LedgerEntry(e.ledger_id, e.entry_id, payload, e.length))
            expected += 1
        return out

    def _no_replica(self, entry_id: int, errors: list[str]) -> PulsarliteError:
        detail = "; ".join(errors)
        if any("CHECKSUM" in e for e in errors) or not errors:
            return ChecksumError(f"ledger {self.ledger_id} entry {entry_id}: no replica with a valid copy ({detail})")
        if all("NO_SUCH" in e for e in errors):
            return NoSuchEntryError(f"ledger {self.ledger_id} entry {entry_id}: no replica has it ({detail})")
        return BookieUnavailableError(f"ledger {self.ledger_id} entry {entry_id}: no replica answered ({detail})")


def _reply_problem(resp: pb.ReadResponse) -> str:
    # OK with nothing accepted means the first entry failed its checksum
    return "CHECKSUM_MISMATCH" if resp.code == pb.OK else pb.StatusCode.Name(resp.code)


async def read_lac(metadata: LedgerMetadata, pool: BookieClientPool, *, fence: bool) -> int:
    """Max LAC reported by the bookies of the last fragment that answer (non-fencing unless asked).
    Entries up to it were confirmed to the writer, so they may be read."""
    bookies = metadata.current_ensemble
    results = await asyncio.gather(*(pool.get(b).read_lac(metadata.ledger_id, fence=fence) for b in bookies),
                                   return_exceptions=True)
    lacs = [r.lac for r in results if isinstance(r, pb.ReadLacResponse) and r.code == pb.OK]
    if not lacs and all(isinstance(r, BaseException) for r in results):
        raise BookieUnavailableError(f"ledger {metadata.ledger_id}: no bookie of {bookies} answered read-LAC")
    lac = max(lacs, default=-1)
    # an entry's LAC field is the writer's LAC when it sent the entry; the highest stored entry
    # below a fragment start cannot be used, but the fragment start - 1 is confirmed by the
    # writer's ensemble change itself (not by a recovery's: a recovery puts in a fragment at
    # any entry it re-writes, so only the writer's last fragment counts)
    return max(lac, metadata.recovery_writer_fragment[0] - 1)


__all__ = ["LedgerEntry", "LedgerReader", "read_lac", "verify_entry", "NoSuchLedgerError"]
