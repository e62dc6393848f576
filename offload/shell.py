"""The one shell of the offload core (:mod:`offload.core`): executes a ledger's machine's actions
one at a time through a small interface, :class:`OffloadSteps`, and feeds each result back as an
event, until the machine says Done. The broker's offloader (broker/offloader.py: triggers,
policies, the managed-ledger CAS, bookie reads) implements the steps; so does the blocking test
facade (tests/offload_executor.py).

API::

    shell = LedgerOffloadShell(machine, steps, topic="t/ns/x", retried=(Exception,),
                               fatal=(), actions_max=64)
    executed = await shell.run(event)      # Offload / Tick / Remove -> the actions executed,
                                           # the last one Done (machine.last_error says why
                                           # a step failed; machine.table_error a table commit)
    event = await shell.execute(action)    # one action -> its result event

    steps (an object with these coroutines):
        record(ledger_id, expected, new) -> OffloadRecord
            CAS the ledger's record from ``expected`` to ``new``; return what is stored now
            (``new``: Recorded; anything else: CasConflict); raise on an unknown outcome
        write_object(ledger_id, uri) -> ObjectStats        read, encode, put at ``uri``
        verify_object(ledger_id, uri, stats) -> None       CorruptObjectError: bad or missing
        delete_object(ledger_id, uri) -> None              idempotent
        delete_from_bookies(ledger_id) -> None             idempotent
        commit_to_table(ledger_id, uri) -> None            idempotent

Errors: a step raising one of ``retried`` (CorruptObjectError must be one) (not one of ``fatal``, never an InvariantViolation)
becomes ``StepFailed`` (the machine goes idle with the error; the caller tries again later);
CorruptObjectError from a verification becomes ``StepFailed(corrupt=True)`` (the machine
deletes or re-offloads the object: invariant 6). Anything else propagates to the caller.

``sweep_orphans(store, prefix, records, now_ms=, grace_ms=)`` deletes objects under a topic's
prefix that no record names (a deposed owner's late write), once older than ``grace_ms``.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Protocol

from offload.core import (Action, BookiesDeleted, CasConflict, CommitToTable, DeleteFromBookies,
                          DeleteObject, Done, LedgerOffload, ListedObject, ObjectDeleted,
                          ObjectStats, ObjectVerified, ObjectWritten, OffloadRecord, Recorded,
                          RecordOffload, StepFailed, TableCommitted, VerifyObject, WriteObject,
                          orphan_objects)
from offload.errors import TierError
from offload.store import ObjectStore
from pulsarlite.errors import InvariantViolation

log = logging.getLogger("pulsarlite.offload.shell")

ACTIONS_PER_RUN_MAX = 64


class OffloadError(TierError):
    """An offload step failed (object store, bookies, verification); retried on a later pass."""

    retriable = True


class CorruptObjectError(OffloadError):
    """The object does not match what was recorded (size, CRC32C, rows, entries), or is gone."""


class OffloadSteps(Protocol):
    """What the shell needs to execute the machine's actions (see the module docstring)."""

    async def record(self, ledger_id: int, expected: OffloadRecord,
                     new: OffloadRecord) -> OffloadRecord: ...

    async def write_object(self, ledger_id: int, uri: str) -> ObjectStats: ...

    async def verify_object(self, ledger_id: int, uri: str, stats: ObjectStats) -> None: ...

    async def delete_object(self, ledger_id: int, uri: str) -> None: ...

    async def delete_from_bookies(self, ledger_id: int) -> None: ...

    async def commit_to_table(self, ledger_id: int, uri: str) -> None: ...


class LedgerOffloadShell:
    """Runs one :class:`offload.core.LedgerOffload` through ``steps`` (module docstring)."""

    def __init__(self, machine: LedgerOffload, steps: OffloadSteps, *, topic: str = "",
                 retried: tuple[type[BaseException], ...] = (Exception,),
                 fatal: tuple[type[BaseException], ...] = (),
                 actions_max: int = ACTIONS_PER_RUN_MAX) -> None:
        if actions_max <= 0:
            raise ValueError(f"actions_max {actions_max} <= 0")
        self.machine = machine
        self.steps = steps
        self.topic = topic
        self.retried = retried
        if not issubclass(CorruptObjectError, retried):
            raise ValueError(f"retried {retried} must include CorruptObjectError")
        self.fatal = (InvariantViolation, *fatal)
        self.actions_max = actions_max

    async def run(self, event: Any) -> list[Action]:
        """Feed ``event`` and execute the actions until Done; the actions executed (Done last)."""
        actions = self.machine.handle(event)
        executed: list[Action] = []
        while actions:
            (action,) = actions
            executed.append(action)
            if isinstance(action, Done):
                break
            if len(executed) > self.actions_max:
                raise OffloadError(f"topic {self.topic} ledger {self.machine.ledger_id}: offload machine "
                                   f"did not settle in {self.actions_max} actions ({self.machine.phase.value})")
            actions = self.machine.handle(await self.execute(action))
        return executed

    async def execute(self, action: Action) -> Any:
        """One action through the steps; its result as the machine's next event."""
        ledger_id = action.ledger_id
        try:
            return await self._dispatch(action)
        except self.fatal:
            raise
        except self.retried as exc:
            if isinstance(exc, CorruptObjectError) and isinstance(action, VerifyObject):
                log.warning("offload object bad topic=%s ledger=%d uri=%s error=%s", self.topic, ledger_id,
                            action.uri, exc)
                return StepFailed(str(exc), corrupt=True)
            log.warning("offload step failed topic=%s ledger=%d action=%s error=%s: %s", self.topic,
                        ledger_id, type(action).__name__, type(exc).__name__, exc)
            return StepFailed(f"{type(action).__name__}: {type(exc).__name__}: {exc}")

    async def _dispatch(self, action: Action) -> Any:
        steps, ledger_id = self.steps, action.ledger_id
        if isinstance(action, RecordOffload):
            stored = await steps.record(ledger_id, action.expected, action.record)
            return Recorded(stored) if stored == action.record else CasConflict(stored)
        if isinstance(action, WriteObject):
            return ObjectWritten(await steps.write_object(ledger_id, action.uri))
        if isinstance(action, VerifyObject):
            await steps.verify_object(ledger_id, action.uri, action.stats)
            return ObjectVerified()
        if isinstance(action, DeleteObject):
            await steps.delete_object(ledger_id, action.uri)
            log.info("offload object deleted topic=%s ledger=%d uri=%s", self.topic, ledger_id, action.uri)
            return ObjectDeleted()
        if isinstance(action, DeleteFromBookies):
            await steps.delete_from_bookies(ledger_id)
            log.info("offload ledger deleted from bookies topic=%s ledger=%d", self.topic, ledger_id)
            return BookiesDeleted()
        if isinstance(action, CommitToTable):
            await steps.commit_to_table(ledger_id, action.uri)
            return TableCommitted()
        raise InvariantViolation(f"unknown offload action {action!r}")


def sweep_orphans(store: ObjectStore, prefix: str, records: Iterable[OffloadRecord], *, now_ms: int,
                  grace_ms: int, delete: bool = True) -> list[str]:
    """Objects under ``prefix`` (a topic's ``<tenant>/<ns>/<topic>/``) of the tier ``store``
    that none of ``records`` (the topic's offload records) names and older than ``grace_ms``;
    deleted unless ``delete`` is False. Returns their URIs. Blocking."""
    listed = [ListedObject(store.object_uri(i.key), i.modified_ms if i.modified_ms is not None
                           else now_ms) for i in store.list(prefix)]
    orphans = orphan_objects(listed, records, now_ms=now_ms, grace_ms=grace_ms)
    base = store.uri.rstrip("/") + "/"
    for uri in orphans:
        if delete:
            store.delete(uri[len(base):])
            log.info("offload orphan object deleted uri=%s", uri)
    return orphans


__all__ = ["ACTIONS_PER_RUN_MAX", "CorruptObjectError", "LedgerOffloadShell", "OffloadError", "OffloadSteps",
           "sweep_orphans"]
