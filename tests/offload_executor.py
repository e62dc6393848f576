"""A blocking facade of the one offload shell (offload/shell.py) for tests: runs a
:class:`offload.core.LedgerOffload` with blocking hooks and a tier object store (no broker).

API::

    ex = LedgerOffloadExecutor(machine, hooks, s3_endpoint_url=None, row_group_bytes=...)
    ex.offload(now_ms, attempt_uuid)   # run an offload attempt to its end (Done)
    ex.tick(now_ms)                    # maybe verify + delete from bookies + record
    ex.remove()                        # delete the object (ledger being deleted)
    -> the list of actions executed

    hooks (an object with these methods, all blocking):
        cas_record(ledger_id, expected: OffloadRecord, new: OffloadRecord) -> OffloadRecord
            store ``new`` if the current record equals ``expected`` and return it; else return
            the current record (a conflict); raise on an unknown outcome
        read_entries(ledger_id) -> Iterable[(entry_id, entry bytes)]
        delete_from_bookies(ledger_id) -> None       (idempotent)
        partition(ledger_id) -> int                  (-1: not partitioned)

Only PulsarliteErrors of a step become ``StepFailed`` (anything else, e.g. a test's simulated
crash, propagates); a verification that finds a bad object is ``StepFailed(corrupt=True)``.
Each call runs the shell in a fresh event loop (``asyncio.run``): call it from sync code only.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from offload.core import LedgerOffload, ObjectStats, Offload, OffloadRecord, Remove, Tick
from offload.format import ROW_GROUP_BYTES_DEFAULT, TierChecksumError, TierFormatError
from offload.reader import verify_object, write_ledger_object
from offload.shell import CorruptObjectError, LedgerOffloadShell
from offload.store import ObjectNotFoundError, open_object_uri
from pulsarlite.errors import PulsarliteError


class Hooks(Protocol):
    def cas_record(self, ledger_id: int, expected: OffloadRecord,
                   new: OffloadRecord) -> OffloadRecord: ...

    def read_entries(self, ledger_id: int): ...

    def delete_from_bookies(self, ledger_id: int) -> None: ...

    def partition(self, ledger_id: int) -> int: ...


class _BlockingSteps:
    """offload.shell's steps over blocking hooks and the object store named by each URI."""

    def __init__(self, hooks: Hooks, s3_endpoint_url: str | None, row_group_bytes: int) -> None:
        self.hooks, self.s3_endpoint_url, self.row_group_bytes = hooks, s3_endpoint_url, row_group_bytes

    async def record(self, ledger_id: int, expected: OffloadRecord, new: OffloadRecord) -> OffloadRecord:
        return self.hooks.cas_record(ledger_id, expected, new)

    async def write_object(self, ledger_id: int, uri: str) -> ObjectStats:
        store, key = open_object_uri(uri, s3_endpoint_url=self.s3_endpoint_url)
        written = write_ledger_object(store, key, ledger_id, self.hooks.read_entries(ledger_id),
                                      partition=self.hooks.partition(ledger_id),
                                      row_group_bytes=self.row_group_bytes)
        return written.stats

    async def verify_object(self, ledger_id: int, uri: str, stats: ObjectStats) -> None:
        store, key = open_object_uri(uri, s3_endpoint_url=self.s3_endpoint_url)
        try:
            verify_object(store, key, stats)
        except (TierChecksumError, TierFormatError, ObjectNotFoundError) as exc:
            raise CorruptObjectError(str(exc)) from exc

    async def delete_object(self, ledger_id: int, uri: str) -> None:
        store, key = open_object_uri(uri, s3_endpoint_url=self.s3_endpoint_url)
        store.delete(key)

    async def delete_from_bookies(self, ledger_id: int) -> None:
        self.hooks.delete_from_bookies(ledger_id)

    async def commit_to_table(self, ledger_id: int, uri: str) -> None:
        raise PulsarliteError("no table in the blocking executor")


class LedgerOffloadExecutor(LedgerOffloadShell):
    def __init__(self, machine: LedgerOffload, hooks: Hooks, *,
                 s3_endpoint_url: str | None = None,
                 row_group_bytes: int = ROW_GROUP_BYTES_DEFAULT) -> None:
        super().__init__(machine, _BlockingSteps(hooks, s3_endpoint_url, row_group_bytes),
                         retried=(PulsarliteError,))
        self.hooks = hooks

    def offload(self, now_ms: int, attempt_uuid: str) -> list[Any]:
        return asyncio.run(self.run(Offload(now_ms, attempt_uuid)))

    def tick(self, now_ms: int) -> list[Any]:
        return asyncio.run(self.run(Tick(now_ms)))

    def remove(self) -> list[Any]:
        return asyncio.run(self.run(Remove()))


__all__ = ["Hooks", "LedgerOffloadExecutor"]
