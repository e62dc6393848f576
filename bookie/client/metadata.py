"""Ledger metadata as kept in ZooKeeper at /ledgers/<hierarchical id>, and the quorum math.

Pure: no I/O. The JSON form is what the znode holds; operators can read it with
`pulsarlite bookkeeper ledgermetadata ID`.
"""

from __future__ import annotations

import enum
import functools
import json
from dataclasses import dataclass, field, replace
from typing import Mapping

from pulsarlite.errors import InvariantViolation, check


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


# Allowed state transitions of a ledger's metadata (explicit state table).
LEDGER_STATE_TRANSITIONS: Mapping[LedgerState, frozenset[LedgerState]] = {
    LedgerState.OPEN: frozenset({LedgerState.OPEN, LedgerState.IN_RECOVERY, LedgerState.CLOSED}),
    LedgerState.IN_RECOVERY: frozenset({LedgerState.IN_RECOVERY, LedgerState.CLOSED}),
    LedgerState.CLOSED: frozenset({LedgerState.CLOSED}),
}


def validate_quorum(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    """E >= Qw >= Qa >= 1, raising ValueError (a caller's bad input, not an invariant)."""
    if not (ensemble_size >= write_quorum >= ack_quorum >= 1):
        raise ValueError(
            f"need ensemble_size >= write_quorum >= ack_quorum >= 1, got "
            f"E={ensemble_size} Qw={write_quorum} Qa={ack_quorum}")


def write_set_indices(ensemble_size: int, write_quorum: int, entry_id: int) -> tuple[int, ...]:
    """Indices into the ensemble of the bookies that store ``entry_id``: Qw of them starting at
    ``entry_id mod E`` (BookKeeper's round-robin striping)."""
    start = entry_id % ensemble_size
    return tuple((start + i) % ensemble_size for i in range(write_quorum))


def covers_every_write_set(ensemble_size: int, write_quorum: int, ack_quorum: int,
                           responded_indices: set[int] | frozenset[int]) -> bool:
    """True when, for every write set, at least (Qw - Qa) + 1 of its bookies are in
    ``responded_indices``: then no write set can still gather Qa acks from bookies that did not
    respond (the fencing and "no such entry" quorum of BookKeeper's recovery)."""
    need = write_quorum - ack_quorum + 1
    for start in range(ensemble_size):
        members = write_set_indices(ensemble_size, write_quorum, start)
        if sum(1 for i in members if i in responded_indices) < need:
            return False
    return True


@dataclass(frozen=True)
class LedgerMetadata:
    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    # fragments: (first entry id, bookie ids), ascending by first entry id
    ensembles: tuple[tuple[int, tuple[str, ...]], ...]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1          # meaningful once CLOSED
    length: int = 0                  # payload bytes, meaningful once CLOSED
    ctime_ms: int = 0
    # bookies of the current fragment that failed with no replacement available (delayed
    # ensemble change): their copies of entries written since are missing
    under_replicated_bookies: tuple[str, ...] = ()
    custom: Mapping[str, str] = field(default_factory=dict)
    # set (IN_RECOVERY only) by the first ensemble change of a recovery: the last fragment the
    # writer wrote, (first entry id, bookies). A later recovery fences that ensemble and decides
    # which entries exist from its bookies' answers only: a bookie a recovery put in holds only
    # what a recovery re-wrote, so its "no such entry" proves nothing
    writer_fragment: tuple[int, tuple[str, ...]] | None = None

    def __post_init__(self) -> None:
        validate_quorum(self.ensemble_size, self.write_quorum, self.ack_quorum)
        check(len(self.ensembles) >= 1, f"ledger {self.ledger_id}: no ensemble")
        previous = -1
        for first, bookies in self.ensembles:
            check(first > previous or (first == 0 and previous == -1),
                  f"ledger {self.ledger_id}: fragments not ascending: {self.ensembles}")
            check(len(bookies) == self.ensemble_size,
                  f"ledger {self.ledger_id}: ensemble {bookies} is not of size {self.ensemble_size}")
            check(len(set(bookies)) == len(bookies),
                  f"ledger {self.ledger_id}: ensemble {bookies} repeats a bookie")
            previous = first
        if self.writer_fragment is not None:
            check(self.state is LedgerState.IN_RECOVERY,
                  f"ledger {self.ledger_id}: writer fragment on a {self.state.value} ledger")
            check(len(self.writer_fragment[1]) == self.ensemble_size,
                  f"ledger {self.ledger_id}: writer fragment {self.writer_fragment} is not of size "
                  f"{self.ensemble_size}")
        # the write sets of the last fragment, by entry_id mod E (asked for every send and ack
        # on the hot path); not a field: derived, outside eq/hash/replace
        last_first, last_bookies = self.ensembles[-1]
        object.__setattr__(self, "_last_fragment_first", last_first)
        object.__setattr__(self, "_last_write_sets", tuple(
            _write_set(last_bookies, self.write_quorum, i) for i in range(self.ensemble_size)))

    # -- queries -------------------------------------------------------------------------
    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        """The ensemble of the fragment that holds ``entry_id``."""
        last_first, last_bookies = self.ensembles[-1]
        if entry_id >= last_first:
            return last_bookies
        chosen = self.ensembles[0][1]
        for first, bookies in self.ensembles:
            if first > entry_id:
                break
            chosen = bookies
        return chosen

    def write_set(self, entry_id: int) -> tuple[str, ...]:
        if entry_id >= self._last_fragment_first:
            return self._last_write_sets[entry_id % self.ensemble_size]
        return _write_set(self.ensemble_for(entry_id), self.write_quorum, entry_id % self.ensemble_size)

    @property
    def current_ensemble(self) -> tuple[str, ...]:
        return self.ensembles[-1][1]

    @property
    def last_fragment_first_entry(self) -> int:
        return self.ensembles[-1][0]

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    def all_bookies(self) -> frozenset[str]:
        return frozenset(b for _, bookies in self.ensembles for b in bookies)

    def lacking_bookies(self) -> frozenset[str]:
        """The bookies of ``under_replicated_bookies`` that some fragment still names: they
        may lack entries of it. One that no fragment names any more (an ensemble change moved
        the ledger off it, then a repair moved its older fragments) lacks nothing this ledger
        needs, whatever the field still says."""
        if not self.under_replicated_bookies:
            return frozenset()
        return frozenset(self.under_replicated_bookies) & self.all_bookies()

    @property
    def recovery_writer_fragment(self) -> tuple[int, tuple[str, ...]]:
        """The fragment a recovery fences and reads: the writer's last one (``writer_fragment``
        once a recovery changed the ensemble, else the last fragment)."""
        return self.writer_fragment if self.writer_fragment is not None else self.ensembles[-1]

    @property
    def recovery_fragments_first_entry(self) -> int | None:
        """The first entry of the fragments a recovery put in (None if none did): the lowest
        entry whose metadata may name a bookie that holds it only once a recovery re-wrote it."""
        if self.writer_fragment is None:
            return None
        first = self.writer_fragment[0]
        return min((f for f, bookies in self.ensembles if f >= first and (f, bookies) != self.writer_fragment),
                   default=None)

    def recovery_read_view(self) -> "LedgerMetadata":
        """The metadata as the writer last knew it (fragments below the writer's last one, then
        that one): the ensemble recovery fences and the write sets whose answers decide whether
        an entry exists."""
        if self.writer_fragment is None:
            return self
        first = self.writer_fragment[0]
        return replace(self, writer_fragment=None,
                       ensembles=tuple(f for f in self.ensembles if f[0] < first) + (self.writer_fragment,))

    # -- transforms (pure; the shell CASes the result) ------------------------------------
    def with_state(self, state: LedgerState, **changes) -> "LedgerMetadata":
        if state not in LEDGER_STATE_TRANSITIONS[self.state]:
            raise InvariantViolation(f"ledger {self.ledger_id}: {self.state.value} -> {state.value} not allowed")
        return replace(self, state=state, **changes)

    def with_new_fragment(self, first_entry_id: int, bookies: tuple[str, ...]) -> "LedgerMetadata":
        """Ensemble change: a new fragment starting at ``first_entry_id``. Replaces the last
        fragment if it starts at the same entry (nothing was written to it yet). The writer's:
        OPEN ledgers only (recovery's is ``with_recovery_ensemble``)."""
        check(self.state is LedgerState.OPEN, f"ledger {self.ledger_id}: ensemble change on {self.state.value}")
        check(first_entry_id >= self.last_fragment_first_entry,
              f"ledger {self.ledger_id}: new fragment at {first_entry_id} before the last one")
        fragments = list(self.ensembles)
        if fragments[-1][0] == first_entry_id:
            fragments[-1] = (first_entry_id, tuple(bookies))
        else:
            fragments.append((first_entry_id, tuple(bookies)))
        return replace(self, ensembles=tuple(fragments))

    def with_recovery_ensemble(self, first_entry_id: int, bookies: tuple[str, ...]) -> "LedgerMetadata":
        """Recovery's ensemble change (IN_RECOVERY only): from ``first_entry_id`` on, one fragment
        on ``bookies``. Fragments wholly below keep their bookies (the one holding
        ``first_entry_id`` is split there, replaced if it starts there); fragments above are
        dropped: the recovery re-writes every entry from ``first_entry_id`` on to its new write
        set. ``first_entry_id`` must lie in the writer's last fragment or above (recovery
        re-writes nothing below it: fix 2, docs/protocol.md#recovery-last-fragment). Records the
        writer's last fragment (``writer_fragment``) the first time."""
        check(self.state is LedgerState.IN_RECOVERY,
              f"ledger {self.ledger_id}: recovery ensemble change on {self.state.value}")
        writer = self.recovery_writer_fragment
        check(first_entry_id >= writer[0],
              f"ledger {self.ledger_id}: recovery fragment at {first_entry_id}, below the writer's "
              f"last fragment {writer}")
        fragments = tuple(f for f in self.ensembles if f[0] < first_entry_id)
        return replace(self, ensembles=fragments + ((first_entry_id, tuple(bookies)),),
                       writer_fragment=writer)

    # -- codec ---------------------------------------------------------------------------
    def to_json(self) -> bytes:
        raw = {
            "ledger_id": self.ledger_id,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "state": self.state.value,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "ctime_ms": self.ctime_ms,
            "ensembles": [[first, list(bookies)] for first, bookies in self.ensembles],
            "under_replicated_bookies": list(self.under_replicated_bookies),
            "custom": dict(self.custom),
        }
        if self.writer_fragment is not None:
            first, bookies = self.writer_fragment
            raw["writer_fragment"] = [first, list(bookies)]
        return json.dumps(raw, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "LedgerMetadata":
        try:
            raw = json.loads(data)
            return cls(
                ledger_id=int(raw["ledger_id"]),
                ensemble_size=int(raw["ensemble_size"]),
                write_quorum=int(raw["write_quorum"]),
                ack_quorum=int(raw["ack_quorum"]),
                state=LedgerState(raw["state"]),
                last_entry_id=int(raw["last_entry_id"]),
                length=int(raw["length"]),
                ctime_ms=int(raw.get("ctime_ms", 0)),
                ensembles=tuple((int(first), tuple(str(b) for b in bookies)) for first, bookies in raw["ensembles"]),
                under_replicated_bookies=tuple(raw.get("under_replicated_bookies", ())),
                custom={str(k): str(v) for k, v in raw.get("custom", {}).items()},
                writer_fragment=(None if raw.get("writer_fragment") is None else
                                 (int(raw["writer_fragment"][0]),
                                  tuple(str(b) for b in raw["writer_fragment"][1]))),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed ledger metadata: {e}") from None


@functools.lru_cache(maxsize=4096)
def _write_set(ensemble: tuple[str, ...], write_quorum: int, start: int) -> tuple[str, ...]:
    """Cached: write sets are computed for every send and every ack on the hot path."""
    return tuple(ensemble[i] for i in write_set_indices(len(ensemble), write_quorum, start))
