"""The offload state machine of one ledger (pure: events in, actions out; no I/O, no clock, no
randomness -- the shell passes ``now_ms`` and each attempt's uuid), and the offload policy.

Recorded states (the offload record, docs/protocol.md#offload-record: the ``offload`` dict of the ledger
in the managed-ledger list)::

    none --RecordOffloading(uuid, uri)--> offloading --WriteObject, VerifyObject,
         RecordOffloaded[, CommitToTable]--> offloaded --(deletion lag) VerifyObject,
         DeleteFromBookies, RecordBookieDeleted--> bookie-deleted

API::

    object_uri(tier_uri, tenant, namespace, topic, ledger_id, attempt_uuid) -> str
        ``<tier_uri>/<tenant>/<ns>/<topic>/ledger-<id>-<uuid>.parquet``
    OffloadRecord                  # frozen; .to_json() / OffloadRecord.from_json(dict)
    machine = LedgerOffload(ledger_id, record, tier_uri=..., tenant=..., namespace=...,
                            topic=..., deletion_lag_ms=..., table=False)
    actions = machine.handle(event)   # events: Offload, Tick, Remove, Recorded, CasConflict,
                                      # ObjectWritten, ObjectVerified, ObjectDeleted,
                                      # BookiesDeleted, TableCommitted, StepFailed
    machine.record, machine.phase, machine.busy, machine.last_error, machine.done
    plan_offload(ledgers, policy, now_ms) -> OffloadPlan(offload=(ids), delete_from_bookies=(ids))
    orphan_objects(objects, records, *, now_ms, grace_ms) -> list[uri]

The shell executes the actions it gets one at a time, in order, and feeds each result back as
an event (Recorded after a successful CAS, CasConflict with the record it found instead,
StepFailed on an error). A machine is cheap: after a crash or failover the new owner builds one
from the recorded state and calls ``handle(Offload(...))`` / ``handle(Tick(...))`` again.
A RecordOffload that fails with an unknown outcome (StepFailed: the CAS may or may not have
landed): re-read the record and, if it differs from ``machine.record``, feed CasConflict(it).

Crash safety (docs/architecture.md#invariant-6):
- The object's URI (with a fresh uuid per attempt) is recorded, state ``offloading``, BEFORE
  anything is written. Every object that can exist is therefore named by the metadata.
- A retry of an ``offloading`` ledger first deletes the recorded attempt's object (its own,
  complete or partial), then records a new attempt, then writes: nothing is orphaned and no
  attempt touches another's object.
- ``offloaded`` is recorded only after the object was verified (size, CRC32C, rows); the
  bookie copy is deleted only from ``offloaded``, after the deletion lag and a second
  verification (a failed one takes the ledger back to ``offloading`` with the bad object still
  named: the bookies still hold the ledger). A crash between the bookie delete and its record
  leaves ``offloaded`` without a bookie copy; the retry verifies, deletes again (idempotent)
  and records ``bookie-deleted``.
- Removing a ledger (retention, topic deletion) deletes its object first; the shell then drops
  the ledger from the list. Until that CAS, the record still names the object, so a crash
  in between is redone.
- With ``table`` ([lakehouse], offload/lake.py), the object is added to the topic's Iceberg
  table (CommitToTable) right after ``offloaded`` is recorded, never before: the table never
  holds a file that the list does not name as offloaded. A failed or crashed commit leaves the
  ledger ``offloaded`` (the tier copy is complete: the offload succeeded, ``table_error`` says
  what failed, and the ledger goes on to the bookie delete) and the shell's next pass repairs
  the table (``offload.lake.plan_table_sync``) before any other step.
- ``orphan_objects`` finds objects under a topic's prefix that no record names (e.g. written
  by a deposed owner that kept running after losing the topic) for a periodic sweep.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from pulsarlite.errors import InvariantViolation, check
from pulsarlite.ledger_list import ObjectStats, OffloadRecord, OffloadState

OBJECT_SUFFIX = ".parquet"
_UUID_RE = re.compile(r"^[0-9a-f]{8,32}$")
_NAME_RE = re.compile(r"^ledger-(\d+)-([0-9a-f]{8,32})\.parquet$")


# which recorded state may follow which (a CAS that breaks this is a bug)
TRANSITIONS: Mapping[OffloadState, frozenset[OffloadState]] = {
    OffloadState.NONE: frozenset({OffloadState.OFFLOADING}),
    OffloadState.OFFLOADING: frozenset({OffloadState.OFFLOADING, OffloadState.OFFLOADED}),
    # back to offloading only when the object failed its check before the bookie delete
    OffloadState.OFFLOADED: frozenset({OffloadState.BOOKIE_DELETED, OffloadState.OFFLOADING}),
    OffloadState.BOOKIE_DELETED: frozenset(),
}


def _check_segment(what: str, value: str) -> None:
    if not value or "/" in value or value in (".", "..") or "\x00" in value:
        raise ValueError(f"invalid {what} {value!r}")


def object_key(tenant: str, namespace: str, topic: str, ledger_id: int,
               attempt_uuid: str) -> str:
    """``<tenant>/<ns>/<topic>/ledger-<id>-<uuid>.parquet`` (relative to the tier URI)."""
    for what, value in (("tenant", tenant), ("namespace", namespace), ("topic", topic)):
        _check_segment(what, value)
    if ledger_id < 0:
        raise ValueError(f"ledger id {ledger_id} < 0")
    if not _UUID_RE.match(attempt_uuid):
        raise ValueError(f"attempt uuid {attempt_uuid!r} is not 8-32 lowercase hex digits")
    return f"{tenant}/{namespace}/{topic}/ledger-{ledger_id}-{attempt_uuid}{OBJECT_SUFFIX}"


def object_uri(tier_uri: str, tenant: str, namespace: str, topic: str, ledger_id: int,
               attempt_uuid: str) -> str:
    return f"{tier_uri.rstrip('/')}/{object_key(tenant, namespace, topic, ledger_id, attempt_uuid)}"


def parse_object_name(uri_or_key: str) -> tuple[int, str] | None:
    """(ledger id, uuid) from an object's URI or key; None if it is not one of ours."""
    m = _NAME_RE.match(uri_or_key.rsplit("/", 1)[-1])
    return (int(m.group(1)), m.group(2)) if m else None


# -- events ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Offload:
    """Offload this ledger now (policy, demand or a retry). ``attempt_uuid``: fresh, random."""
    now_ms: int
    attempt_uuid: str


@dataclass(frozen=True)
class Tick:
    """Time passed: an offloaded ledger may leave the bookies once the lag has passed."""
    now_ms: int


@dataclass(frozen=True)
class Remove:
    """The ledger is being deleted (retention, topic deletion): delete its object."""


@dataclass(frozen=True)
class Recorded:
    """The last Record* action's CAS succeeded; ``record`` is what is now stored."""
    record: OffloadRecord


@dataclass(frozen=True)
class CasConflict:
    """The CAS found another record (re-read): the machine restarts from it."""
    record: OffloadRecord


@dataclass(frozen=True)
class ObjectWritten:
    stats: ObjectStats


@dataclass(frozen=True)
class ObjectVerified:
    pass


@dataclass(frozen=True)
class ObjectDeleted:
    pass


@dataclass(frozen=True)
class BookiesDeleted:
    pass


@dataclass(frozen=True)
class TableCommitted:
    """The object is in the topic's table (CommitToTable succeeded)."""


@dataclass(frozen=True)
class StepFailed:
    """The last action failed. ``corrupt``: verification found a bad object (delete it)."""
    error: str
    corrupt: bool = False


# -- actions --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RecordOffload:
    """CAS the ledger's offload record from ``expected`` to ``record``."""
    ledger_id: int
    expected: OffloadRecord
    record: OffloadRecord


@dataclass(frozen=True)
class WriteObject:
    """Read the ledger's entries, encode them and put the object at ``uri``; answer
    ObjectWritten(stats) (stats computed while writing)."""
    ledger_id: int
    uri: str


@dataclass(frozen=True)
class VerifyObject:
    """Check the object at ``uri`` is complete: its size, CRC32C and row count match
    ``stats``; answer ObjectVerified or StepFailed(corrupt=True)."""
    ledger_id: int
    uri: str
    stats: ObjectStats


@dataclass(frozen=True)
class DeleteObject:
    """Delete the object at ``uri`` (idempotent: a missing object is success)."""
    ledger_id: int
    uri: str


@dataclass(frozen=True)
class DeleteFromBookies:
    """Delete the ledger from the bookies (idempotent)."""
    ledger_id: int


@dataclass(frozen=True)
class CommitToTable:
    """Add the (offloaded, verified) object at ``uri`` to the topic's table; answer
    TableCommitted (idempotent: already there is success)."""
    ledger_id: int
    uri: str


@dataclass(frozen=True)
class Done:
    """Nothing more to do until the next event (``removed``: the object of a ledger being
    removed is gone; the shell may now drop the ledger from the list)."""
    ledger_id: int
    removed: bool = False


Action = RecordOffload | WriteObject | VerifyObject | DeleteObject | DeleteFromBookies | CommitToTable | Done


class Phase(enum.Enum):
    IDLE = "idle"
    DELETING_PREVIOUS = "deleting-previous"       # a retry removes the last attempt's object
    RECORDING_OFFLOADING = "recording-offloading"
    WRITING = "writing"
    VERIFYING = "verifying"
    DELETING_CORRUPT = "deleting-corrupt"
    RECORDING_OFFLOADED = "recording-offloaded"
    COMMITTING_TABLE = "committing-table"
    VERIFYING_BEFORE_DELETE = "verifying-before-delete"
    DELETING_BOOKIES = "deleting-bookies"
    RECORDING_BOOKIE_DELETED = "recording-bookie-deleted"
    RECORDING_REOFFLOAD = "recording-reoffload"
    REMOVING_OBJECT = "removing-object"
    REMOVED = "removed"


class LedgerOffload:
    """The per-ledger machine (see the module docstring)."""

    def __init__(self, ledger_id: int, record: OffloadRecord, *, tier_uri: str, tenant: str,
                 namespace: str, topic: str, deletion_lag_ms: int, table: bool = False) -> None:
        check(ledger_id >= 0, f"ledger id {ledger_id} < 0")
        if deletion_lag_ms < 0:
            raise ValueError(f"deletion_lag_ms {deletion_lag_ms} < 0")
        self.ledger_id = ledger_id
        self.record = record
        self.tier_uri = tier_uri
        self.tenant, self.namespace, self.topic = tenant, namespace, topic
        self.deletion_lag_ms = deletion_lag_ms
        self.table = table
        self.phase = Phase.IDLE
        self.last_error: str | None = None
        self.table_error: str | None = None      # the last CommitToTable failure (not an offload failure)
        self.failures = 0
        self._attempt_uuid: str | None = None
        self._now_ms = 0
        self._pending: OffloadRecord | None = None
        self._written: ObjectStats | None = None
        self.removing = False       # Remove was asked: every later event works toward it

    # -- queries --
    @property
    def busy(self) -> bool:
        return self.phase not in (Phase.IDLE, Phase.REMOVED)

    @property
    def done(self) -> bool:
        """Fully offloaded and gone from the bookies (or removed)."""
        return self.phase is Phase.REMOVED or (
            self.phase is Phase.IDLE and self.record.state is OffloadState.BOOKIE_DELETED
            and not self.removing)

    # -- events --
    def handle(self, event: Any) -> list[Action]:
        if self.phase is Phase.REMOVED:
            return [Done(self.ledger_id, removed=True)]
        if isinstance(event, (Offload, Tick)):
            if self.removing:
                return [] if self.busy else self._on_remove()
            return self._on_offload(event) if isinstance(event, Offload) else self._on_tick(event)
        if isinstance(event, Remove):
            return self._on_remove()
        if isinstance(event, StepFailed):
            return self._on_failed(event)
        if isinstance(event, CasConflict):
            self.record = event.record
            self.phase = Phase.IDLE
            self.last_error = "metadata changed under us (CAS conflict); re-read"
            return [Done(self.ledger_id)]
        handler = {
            Recorded: self._on_recorded,
            ObjectWritten: self._on_written,
            ObjectVerified: self._on_verified,
            ObjectDeleted: self._on_object_deleted,
            BookiesDeleted: self._on_bookies_deleted,
            TableCommitted: self._on_table_committed,
        }.get(type(event))
        if handler is None:
            raise InvariantViolation(f"ledger {self.ledger_id}: unknown event {event!r}")
        return handler(event)

    def _expect(self, *phases: Phase, event: Any) -> None:
        if self.phase not in phases:
            raise InvariantViolation(f"ledger {self.ledger_id}: {type(event).__name__} in phase "
                                     f"{self.phase.value} (expected {[p.value for p in phases]})")

    def _record(self, new: OffloadRecord, phase: Phase) -> list[Action]:
        check(new.state in TRANSITIONS[self.record.state],
              f"ledger {self.ledger_id}: transition {self.record.state.value} -> "
              f"{new.state.value}")
        self._pending = new
        self.phase = phase
        return [RecordOffload(self.ledger_id, self.record, new)]

    def _on_offload(self, event: Offload) -> list[Action]:
        if self.busy or self.record.state in (OffloadState.OFFLOADED,
                                              OffloadState.BOOKIE_DELETED):
            return [] if self.busy else [Done(self.ledger_id)]
        self._now_ms = event.now_ms
        self._attempt_uuid = event.attempt_uuid
        if self.record.state is OffloadState.OFFLOADING:
            # a crashed or failed attempt: remove its object (complete or partial) first
            self.phase = Phase.DELETING_PREVIOUS
            return [DeleteObject(self.ledger_id, self.record.uri)]
        return self._record_attempt()

    def _record_attempt(self) -> list[Action]:
        uri = object_uri(self.tier_uri, self.tenant, self.namespace, self.topic,
                         self.ledger_id, self._attempt_uuid)
        check(uri != self.record.uri, f"ledger {self.ledger_id}: attempt uuid reused")
        new = OffloadRecord(OffloadState.OFFLOADING, uri, self._attempt_uuid,
                            extra=self.record.extra)
        return self._record(new, Phase.RECORDING_OFFLOADING)

    def _on_tick(self, event: Tick) -> list[Action]:
        self._now_ms = max(self._now_ms, event.now_ms)
        if self.busy or self.record.state is not OffloadState.OFFLOADED:
            return []
        if event.now_ms - self.record.offloaded_ms < self.deletion_lag_ms:
            return []
        self.phase = Phase.VERIFYING_BEFORE_DELETE
        return [VerifyObject(self.ledger_id, self.record.uri, self.record.stats)]

    def _on_remove(self) -> list[Action]:
        # allowed in any phase: the shell stops executing this machine's earlier actions
        self.removing = True
        if self.record.uri is None:
            self.phase = Phase.REMOVED
            return [Done(self.ledger_id, removed=True)]
        self.phase = Phase.REMOVING_OBJECT
        return [DeleteObject(self.ledger_id, self.record.uri)]

    def _on_recorded(self, event: Recorded) -> list[Action]:
        self._expect(Phase.RECORDING_OFFLOADING, Phase.RECORDING_OFFLOADED,
                     Phase.RECORDING_BOOKIE_DELETED, Phase.RECORDING_REOFFLOAD, event=event)
        check(event.record == self._pending,
              f"ledger {self.ledger_id}: recorded {event.record} is not what was asked")
        self.record, self._pending = event.record, None
        if self.phase is Phase.RECORDING_OFFLOADING:
            self.phase = Phase.WRITING
            return [WriteObject(self.ledger_id, self.record.uri)]
        if self.phase is Phase.RECORDING_OFFLOADED:
            self.failures = 0
            self.last_error = None
            if self.table:
                self.phase = Phase.COMMITTING_TABLE
                return [CommitToTable(self.ledger_id, self.record.uri)]
            return self._offloaded()
        if self.phase is Phase.RECORDING_REOFFLOAD:
            self.phase = Phase.IDLE
            return [Done(self.ledger_id)]
        self.phase = Phase.IDLE
        self.failures = 0
        self.last_error = None
        return [Done(self.ledger_id)]

    def _offloaded(self) -> list[Action]:
        self.phase = Phase.IDLE
        # the lag may be zero: go on at once
        actions = self._on_tick(Tick(self._now_ms))
        return actions or [Done(self.ledger_id)]

    def _on_table_committed(self, event: TableCommitted) -> list[Action]:
        self._expect(Phase.COMMITTING_TABLE, event=event)
        return self._offloaded()

    def _on_written(self, event: ObjectWritten) -> list[Action]:
        self._expect(Phase.WRITING, event=event)
        self._written = event.stats
        self.phase = Phase.VERIFYING
        return [VerifyObject(self.ledger_id, self.record.uri, event.stats)]

    def _on_verified(self, event: ObjectVerified) -> list[Action]:
        self._expect(Phase.VERIFYING, Phase.VERIFYING_BEFORE_DELETE, event=event)
        if self.phase is Phase.VERIFYING:
            new = replace(self.record, state=OffloadState.OFFLOADED, stats=self._written,
                          offloaded_ms=self._now_ms)
            return self._record(new, Phase.RECORDING_OFFLOADED)
        self.phase = Phase.DELETING_BOOKIES
        return [DeleteFromBookies(self.ledger_id)]

    def _on_object_deleted(self, event: ObjectDeleted) -> list[Action]:
        self._expect(Phase.DELETING_PREVIOUS, Phase.DELETING_CORRUPT, Phase.REMOVING_OBJECT,
                     event=event)
        if self.phase is Phase.REMOVING_OBJECT:
            self.phase = Phase.REMOVED
            return [Done(self.ledger_id, removed=True)]
        if self.phase is Phase.DELETING_CORRUPT:
            self.phase = Phase.IDLE       # stays offloading; the next Offload retries
            return [Done(self.ledger_id)]
        return self._record_attempt()

    def _on_bookies_deleted(self, event: BookiesDeleted) -> list[Action]:
        self._expect(Phase.DELETING_BOOKIES, event=event)
        new = replace(self.record, state=OffloadState.BOOKIE_DELETED)
        return self._record(new, Phase.RECORDING_BOOKIE_DELETED)

    def _on_failed(self, event: StepFailed) -> list[Action]:
        if self.phase is Phase.COMMITTING_TABLE:
            # the tier copy is complete and recorded: the offload succeeded; the table lags
            # until the shell's next repair (``table_error`` says why), the ledger goes on
            self.table_error = event.error
            return self._offloaded()
        self.failures += 1
        self.last_error = event.error
        self._pending = None
        if event.corrupt and self.phase is Phase.VERIFYING:
            # our fresh object is bad: delete it now (the retry would too)
            self.phase = Phase.DELETING_CORRUPT
            return [DeleteObject(self.ledger_id, self.record.uri)]
        if event.corrupt and self.phase is Phase.VERIFYING_BEFORE_DELETE:
            # an offloaded object went bad while the bookies still hold the ledger: back to
            # offloading with the same (bad) object named, so the next Offload deletes it and
            # writes a fresh one; reads come from the bookies meanwhile
            new = OffloadRecord(OffloadState.OFFLOADING, self.record.uri,
                                self.record.attempt_uuid, extra=self.record.extra)
            return self._record(new, Phase.RECORDING_REOFFLOAD)
        if self.phase is Phase.REMOVING_OBJECT:
            self.phase = Phase.IDLE      # the next Offload/Tick/Remove deletes it again
            return [Done(self.ledger_id)]
        self.phase = Phase.IDLE
        return [Done(self.ledger_id)]


# -- policy ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OffloadPolicy:
    """A namespace's (or topic's) offload policy. -1 disables a threshold."""

    threshold_bytes: int = -1          # keep at most this many bytes on bookies (0: offload all)
    threshold_ms: int = -1             # offload closed ledgers older than this
    deletion_lag_ms: int = 4 * 3600 * 1000

    def __post_init__(self) -> None:
        if self.threshold_bytes < -1 or self.threshold_ms < -1 or self.deletion_lag_ms < 0:
            raise ValueError(f"bad offload policy {self}")


@dataclass(frozen=True)
class LedgerView:
    """What the policy needs of one ledger, oldest first in the list."""

    ledger_id: int
    closed: bool
    entries: int
    size_bytes: int
    created_ms: int
    closed_ms: int | None              # when it was closed (else its last publish time)
    state: OffloadState = OffloadState.NONE
    offloaded_ms: int | None = None


@dataclass(frozen=True)
class OffloadPlan:
    offload: tuple[int, ...] = ()                  # oldest first
    delete_from_bookies: tuple[int, ...] = ()      # oldest first


def plan_offload(ledgers: Sequence[LedgerView], policy: OffloadPolicy, now_ms: int, *,
                 demand: Iterable[int] = ()) -> OffloadPlan:
    """Which closed ledgers to offload now, and which offloaded ones may leave the bookies.

    - ``offloading`` ledgers are always in ``offload`` (a crashed or failed attempt resumes).
    - size: counting from the newest ledger, the bytes of ledgers still only on the bookies
      (state none/offloading, the open ledger included); once they exceed
      ``threshold_bytes``, every older closed ledger is offloaded.
    - time: closed ledgers closed (or last written) ``threshold_ms`` ago or more.
    - ``demand``: ledger ids asked for (admin offload), if closed and not empty.
    - deletion: ``offloaded`` ledgers whose ``offloaded_ms`` is ``deletion_lag_ms`` old.
    Only closed, non-empty ledgers are ever offloaded."""
    wanted = set(demand)
    if policy.threshold_bytes >= 0:
        kept = 0
        for view in reversed(ledgers):
            if view.state not in (OffloadState.NONE, OffloadState.OFFLOADING):
                continue
            kept += view.size_bytes
            if kept > policy.threshold_bytes or policy.threshold_bytes == 0:
                wanted.add(view.ledger_id)
    if policy.threshold_ms >= 0:
        for view in ledgers:
            stamp = view.closed_ms if view.closed_ms is not None else view.created_ms
            if now_ms - stamp >= policy.threshold_ms:
                wanted.add(view.ledger_id)
    offload: list[int] = []
    delete: list[int] = []
    for view in ledgers:
        if not view.closed or view.entries == 0:
            continue
        if view.state is OffloadState.OFFLOADING or (
                view.state is OffloadState.NONE and view.ledger_id in wanted):
            offload.append(view.ledger_id)
        elif view.state is OffloadState.OFFLOADED and view.offloaded_ms is not None \
                and now_ms - view.offloaded_ms >= policy.deletion_lag_ms:
            delete.append(view.ledger_id)
    return OffloadPlan(tuple(offload), tuple(delete))


@dataclass(frozen=True)
class ListedObject:
    uri: str
    last_modified_ms: int


def orphan_objects(objects: Iterable[ListedObject], records: Iterable[OffloadRecord], *,
                   now_ms: int, grace_ms: int) -> list[str]:
    """URIs of our objects (``ledger-<id>-<uuid>.parquet``) under a topic's prefix that no
    record names and that are older than ``grace_ms`` (an attempt records its URI before it
    writes, so a young unnamed object may belong to an attempt whose CAS is in flight)."""
    named = {r.uri for r in records if r.uri is not None}
    return sorted(o.uri for o in objects
                  if o.uri not in named and parse_object_name(o.uri) is not None
                  and now_ms - o.last_modified_ms >= grace_ms)


__all__ = [
    "Action", "BookiesDeleted", "CasConflict", "CommitToTable", "TableCommitted", "DeleteFromBookies", "DeleteObject", "Done",
    "LedgerOffload", "LedgerView", "ListedObject", "ObjectDeleted", "ObjectStats",
    "ObjectVerified", "ObjectWritten", "Offload", "OffloadPlan", "OffloadPolicy",
    "OffloadRecord", "OffloadState", "Phase", "RecordOffload", "Recorded", "Remove",
    "StepFailed", "TRANSITIONS", "Tick", "VerifyObject", "WriteObject", "object_key",
    "object_uri", "orphan_objects", "parse_object_name", "plan_offload",
]
