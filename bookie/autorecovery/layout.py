"""Where autorecovery keeps its state in ZooKeeper: one home for every path (close to
BookKeeper's /ledgers/underreplication, ZkLedgerUnderreplicationManager).

Layout::

    /ledgers/underreplication/ledgers/<4 hex>/<4 hex>/<4 hex>/<4 hex>/urL<19 digits>
        persistent, one per under-replicated ledger (hex path of the 64-bit id, as BookKeeper's
        getUrLedgerZnode); JSON {"ledger_id", "missing_bookies": [sorted], "ctime_ms"}.
        Marking merges the missing bookies into an existing mark by compare-and-set; a worker
        deletes the mark at the version it read (so a bookie marked meanwhile is not lost).
    /ledgers/underreplication/locks/urL<19 digits>
        ephemeral: the replication worker repairing that ledger (data: its id). One worker per
        ledger: creating the node is taking the lock; the worker's session dying releases it.
    /ledgers/underreplication/auditorelection/V_<seq>
        ephemeral sequential, data = the candidate's id; the lowest sequence is the auditor.
        Each candidate watches the children; when the auditor's session dies, the next one
        becomes auditor.
    /ledgers/underreplication/decommissioning/<bookie-id>
        persistent, JSON {"bookie", "ctime_ms", "state": "decommissioning"|"decommissioned"}:
        the operator is decommissioning that bookie (or did). The auditor treats it as lost at
        once (no grace period) while it may still be up and serve reads; the bookie itself
        registers read-only while the node exists, so no new ensemble picks it. ``bookkeeper
        decommission`` sets "decommissioned" once nothing names the bookie (the node stays);
        ``decommission --cancel`` removes it.

Nothing here matches the ledger metadata's own paths (/ledgers/NNN/...), so listing ledgers
(``LedgerManager.list_ledger_ids``) never sees these nodes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterable

from bookie.client.ledger_manager import check_bookie_id
from pulsarlite.metadata_layout import LEDGER_ID_MAX, UNDERREPLICATION_ROOT

MARKS_ROOT = f"{UNDERREPLICATION_ROOT}/ledgers"
LOCKS_ROOT = f"{UNDERREPLICATION_ROOT}/locks"
ELECTION_ROOT = f"{UNDERREPLICATION_ROOT}/auditorelection"
ELECTION_PREFIX = f"{ELECTION_ROOT}/V_"
DECOMMISSIONING_ROOT = f"{UNDERREPLICATION_ROOT}/decommissioning"

_HEX4 = re.compile(r"^[0-9a-f]{4}$")
_MARK_LEAF = re.compile(r"^urL(\d{19})$")


def _check_id(ledger_id: int) -> None:
    if not 0 <= ledger_id <= LEDGER_ID_MAX:
        raise ValueError(f"ledger id must be in [0, 2^63), got {ledger_id}")


def mark_leaf(ledger_id: int) -> str:
    _check_id(ledger_id)
    return f"urL{ledger_id:019d}"


def mark_path(ledger_id: int) -> str:
    """/ledgers/underreplication/ledgers/0000/0000/0000/0001/urL0000000000000000001 for id 1."""
    _check_id(ledger_id)
    h = f"{ledger_id:016x}"
    return f"{MARKS_ROOT}/{h[0:4]}/{h[4:8]}/{h[8:12]}/{h[12:16]}/{mark_leaf(ledger_id)}"


def ledger_id_of_mark(path: str) -> int:
    leaf = path.rstrip("/").rsplit("/", 1)[-1]
    m = _MARK_LEAF.match(leaf)
    if m is None:
        raise ValueError(f"not an under-replication mark: {path}")
    ledger_id = int(m.group(1))
    if mark_path(ledger_id) != path.rstrip("/"):
        raise ValueError(f"mark {path} is not where ledger {ledger_id}'s mark belongs")
    return ledger_id


def lock_path(ledger_id: int) -> str:
    return f"{LOCKS_ROOT}/{mark_leaf(ledger_id)}"


def decommissioning_path(bookie_id: str) -> str:
    check_bookie_id(bookie_id)
    return f"{DECOMMISSIONING_ROOT}/{bookie_id}"


def is_mark_level(name: str) -> bool:
    return _HEX4.match(name) is not None


def is_mark_leaf(name: str) -> bool:
    return _MARK_LEAF.match(name) is not None


@dataclass(frozen=True)
class UnderReplicatedMark:
    """One under-replicated ledger: which bookies' copies it lacks (sorted, no repeats), and of
    those the ones marked because they were lost (unregistered past the lost-bookie delay): any
    auditor takes those out again when they come back (a registration is cookie-checked: the
    same bookie with its disks). The others (decommissioning, a copy found missing or bad,
    a delayed ensemble change) stay until a worker moves their copies."""

    ledger_id: int
    missing_bookies: tuple[str, ...]
    ctime_ms: int = 0
    lost_bookies: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_id(self.ledger_id)
        if not self.missing_bookies:
            raise ValueError(f"ledger {self.ledger_id}: a mark needs at least one missing bookie")
        if tuple(sorted(set(self.missing_bookies))) != self.missing_bookies:
            raise ValueError(f"ledger {self.ledger_id}: missing bookies must be sorted and distinct")
        if tuple(sorted(set(self.lost_bookies))) != self.lost_bookies or \
                not set(self.lost_bookies) <= set(self.missing_bookies):
            raise ValueError(f"ledger {self.ledger_id}: lost bookies must be sorted, distinct and missing")

    @classmethod
    def of(cls, ledger_id: int, missing: Iterable[str], ctime_ms: int,
           lost: Iterable[str] = ()) -> "UnderReplicatedMark":
        missing = set(missing)
        return cls(ledger_id, tuple(sorted(missing)), ctime_ms, tuple(sorted(set(lost) & missing)))

    def to_json(self) -> bytes:
        raw = {"ledger_id": self.ledger_id, "missing_bookies": list(self.missing_bookies), "ctime_ms": self.ctime_ms}
        if self.lost_bookies:
            raw["lost_bookies"] = list(self.lost_bookies)
        return json.dumps(raw, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "UnderReplicatedMark":
        try:
            raw = json.loads(data)
            return cls.of(int(raw["ledger_id"]), [str(b) for b in raw["missing_bookies"]],
                          int(raw.get("ctime_ms", 0)), [str(b) for b in raw.get("lost_bookies", ())])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed under-replication mark: {e}") from None


def merge_mark(current: bytes | None, ledger_id: int, missing: Iterable[str], now_ms: int,
               lost: Iterable[str] = ()) -> bytes:
    """The CAS transform of marking: a new mark, or ``current`` with ``missing`` added (its
    ctime kept); ``lost``: those of ``missing`` marked because they were lost. A malformed
    current mark is replaced (its bookies are lost from it; the auditor marks them again on its
    next pass)."""
    missing, lost = set(missing), set(lost)
    if current is not None:
        try:
            old = UnderReplicatedMark.from_json(current)
        except ValueError:
            old = None
        if old is not None and old.ledger_id == ledger_id:
            return UnderReplicatedMark.of(ledger_id, missing | set(old.missing_bookies), old.ctime_ms,
                                          lost | set(old.lost_bookies)).to_json()
    return UnderReplicatedMark.of(ledger_id, missing, now_ms, lost).to_json()
