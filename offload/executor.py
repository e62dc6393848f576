"""A blocking executor of :class:`offload.core.LedgerOffload` actions: the thin shell around
the pure machine for callers that do not need their own (tools, tests, a broker thread).

API::

    ex = LedgerOffloadExecutor(machine, hooks, s3_endpoint_url=None)
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

``sweep_orphans(store, prefix, records, now_ms=, grace_ms=)`` deletes objects under a topic's
prefix that no record names (a deposed owner's late write), once older than ``grace_ms``.

Errors of any step become ``StepFailed`` events (the machine goes idle; call again later); a
verification that finds a bad object is ``StepFailed(corrupt=True)``.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from offload.core import (BookiesDeleted, CasConflict, DeleteFromBookies, DeleteObject, Done,
                          LedgerOffload, ListedObject, ObjectDeleted, ObjectVerified,
                          ObjectWritten, Offload, OffloadRecord, Recorded, RecordOffload, Remove,
                          StepFailed, Tick, VerifyObject, WriteObject, orphan_objects)
from offload.format import ROW_GROUP_BYTES_DEFAULT, TierChecksumError, TierFormatError
from offload.reader import verify_object, write_ledger_object
from offload.store import ObjectNotFoundError, ObjectStore, open_object_uri
from pulsarlite.errors import PulsarliteError

log = logging.getLogger("pulsarlite.offload.executor")

ACTIONS_PER_CALL_MAX = 32


class Hooks(Protocol):
    def cas_record(self, ledger_id: int, expected: OffloadRecord,
                   new: OffloadRecord) -> OffloadRecord: ...

    def read_entries(self, ledger_id: int): ...

    def delete_from_bookies(self, ledger_id: int) -> None: ...

    def partition(self, ledger_id: int) -> int: ...


class LedgerOffloadExecutor:
    def __init__(self, machine: LedgerOffload, hooks: Hooks, *,
                 s3_endpoint_url: str | None = None,
                 row_group_bytes: int = ROW_GROUP_BYTES_DEFAULT) -> None:
        self.machine = machine
        self.hooks = hooks
        self.s3_endpoint_url = s3_endpoint_url
        self.row_group_bytes = row_group_bytes

    def offload(self, now_ms: int, attempt_uuid: str) -> list[Any]:
        return self._run(self.machine.handle(Offload(now_ms, attempt_uuid)))

    def tick(self, now_ms: int) -> list[Any]:
        return self._run(self.machine.handle(Tick(now_ms)))

    def remove(self) -> list[Any]:
        return self._run(self.machine.handle(Remove()))

    def _run(self, actions: list[Any]) -> list[Any]:
        done: list[Any] = []
        for _ in range(ACTIONS_PER_CALL_MAX):
            if not actions:
                return done
            (action,) = actions
            done.append(action)
            if isinstance(action, Done):
                return done
            actions = self.machine.handle(self._execute(action))
        raise RuntimeError(f"ledger {self.machine.ledger_id}: more than {ACTIONS_PER_CALL_MAX} "
                           "actions in one call")

    def _execute(self, action: Any) -> Any:
        ledger = self.machine.ledger_id
        try:
            if isinstance(action, RecordOffload):
                stored = self.hooks.cas_record(ledger, action.expected, action.record)
                return Recorded(stored) if stored == action.record else CasConflict(stored)
            if isinstance(action, WriteObject):
                store, key = open_object_uri(action.uri, s3_endpoint_url=self.s3_endpoint_url)
                written = write_ledger_object(store, key, ledger, self.hooks.read_entries(ledger),
                                              partition=self.hooks.partition(ledger),
                                              row_group_bytes=self.row_group_bytes)
                return ObjectWritten(written.stats)
            if isinstance(action, VerifyObject):
                store, key = open_object_uri(action.uri, s3_endpoint_url=self.s3_endpoint_url)
                try:
                    verify_object(store, key, action.stats)
                except (TierChecksumError, TierFormatError, ObjectNotFoundError) as exc:
                    log.warning("event=tier_object_bad ledger=%d uri=%s error=%s", ledger,
                                action.uri, exc)
                    return StepFailed(str(exc), corrupt=True)
                return ObjectVerified()
            if isinstance(action, DeleteObject):
                store, key = open_object_uri(action.uri, s3_endpoint_url=self.s3_endpoint_url)
                store.delete(key)
                log.info("event=tier_object_deleted ledger=%d uri=%s", ledger, action.uri)
                return ObjectDeleted()
            if isinstance(action, DeleteFromBookies):
                self.hooks.delete_from_bookies(ledger)
                log.info("event=ledger_deleted_from_bookies ledger=%d", ledger)
                return BookiesDeleted()
        except PulsarliteError as exc:
            log.warning("event=offload_step_failed ledger=%d action=%s error=%s", ledger,
                        type(action).__name__, exc)
            return StepFailed(f"{type(action).__name__}: {exc}")
        raise RuntimeError(f"unknown action {action!r}")


def sweep_orphans(store: ObjectStore, prefix: str, records: Any, *, now_ms: int,
                  grace_ms: int, delete: bool = True) -> list[str]:
    """Objects under ``prefix`` (a topic's ``<tenant>/<ns>/<topic>/``) of the tier ``store``
    that none of ``records`` (the topic's OffloadRecords) names and older than ``grace_ms``;
    deleted unless ``delete`` is False. Returns their URIs."""
    listed = [ListedObject(store.object_uri(i.key), i.modified_ms if i.modified_ms is not None
                           else now_ms) for i in store.list(prefix)]
    orphans = orphan_objects(listed, records, now_ms=now_ms, grace_ms=grace_ms)
    base = store.uri.rstrip("/") + "/"
    for uri in orphans:
        if delete:
            store.delete(uri[len(base):])
            log.info("event=tier_orphan_deleted uri=%s", uri)
    return orphans


__all__ = ["Hooks", "LedgerOffloadExecutor", "sweep_orphans"]
