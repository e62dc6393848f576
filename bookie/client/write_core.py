"""The pure write core of a ledger: striping, quorum acks, LAC, ensemble change, close.

I/O-free and clock-free (docs/architecture.md#style): the shell calls the event methods with the time and a
``random.Random`` and executes the returned actions (bookie.client.actions). Protocol
(docs/protocol.md#bookkeeper-replication):

- entry i goes to the Qw bookies starting at index i mod E of its fragment's ensemble;
- it is confirmed once Qa bookies of its write set acked and every lower entry is confirmed;
  the LAC only moves forward and rides on every entry sent;
- a failed bookie (ERROR, READ_ONLY) is replaced by a writable bookie outside the ensemble in a
  new fragment starting at LAC + 1 (CAS of the metadata; sends to the new bookie are held until
  the CAS succeeded); with no replacement the bookie stays in the ensemble, is recorded in
  ``under_replicated_bookies`` and entries go on as long as Qa bookies of each write set can
  ack (delayed ensemble change);
- FENCED from any bookie, or a metadata CAS finding the ledger no longer OPEN, means a recovery
  took the ledger: every pending add fails with LedgerFencedError, no add is accepted again;
- TOO_LARGE (an entry above a bookie's ``entry_bytes_max``) is a refusal by design, not a
  failed bookie: no ensemble change (another bookie would refuse it too); the pending adds fail
  with BadRequestError (not retriable);
- a failure is sticky: once an add failed, every later one fails too (a ledger is an ordered
  log; the caller closes it and writes the next ledger).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field, replace
from typing import Sequence

from bookie.client.actions import (Action, AddOutcome, CloseDone, CloseFailed, ConfirmAdds,
                                   FailAdds, SendAdd, SendAddRun, WriteMetadata)
from bookie.client.metadata import LedgerMetadata, LedgerState
from bookie.client.placement import choose_replacements
from pulsarlite.errors import (BadRequestError, LedgerClosedError, LedgerFencedError, MetadataError,
                               NotEnoughBookiesError, PulsarliteError, TimeoutError_, check)


class WriteCoreState(enum.Enum):
    WRITING = "WRITING"
    CLOSING = "CLOSING"     # the CLOSED metadata is being written
    CLOSED = "CLOSED"       # closed (CloseDone) or given up (CloseFailed): the core is finished


@dataclass(slots=True)
class _PendingAdd:
    entry_id: int
    payload: bytes
    length: int                     # ledger length through this entry
    added_ms: int
    acked: set[str] = field(default_factory=set)   # bookies of the current write set that acked
    sent: set[str] = field(default_factory=set)    # sends outstanding (no answer yet)


class LedgerWriteCore:
    """Write state of one OPEN ledger owned by this client. See the module docstring."""

    def __init__(self, metadata: LedgerMetadata, *, add_timeout_ms: int,
                 ensemble_change_attempts_max: int, last_entry_id: int = -1, length: int = 0) -> None:
        check(metadata.state is LedgerState.OPEN,
              f"ledger {metadata.ledger_id}: write core on a {metadata.state.value} ledger")
        if add_timeout_ms <= 0:
            raise ValueError(f"add_timeout_ms must be > 0, got {add_timeout_ms}")
        if ensemble_change_attempts_max < 1:
            raise ValueError(f"ensemble_change_attempts_max must be >= 1, got {ensemble_change_attempts_max}")
        if last_entry_id < -1 or length < 0:
            raise ValueError(f"bad start position: last_entry_id={last_entry_id} length={length}")
        self._add_timeout_ms = add_timeout_ms
        self._attempts_max = ensemble_change_attempts_max
        self._md = metadata                      # last metadata known to be in the store
        self._proposed: LedgerMetadata | None = None   # ensemble change CAS in flight
        self._held: frozenset[str] = frozenset()       # new bookies of _proposed: no sends yet
        self._unusable: set[str] = set()         # bookies that failed (ERROR / READ_ONLY)
        self._pending: dict[int, _PendingAdd] = {}     # lac+1 .. last_pushed, in order
        self._lac = last_entry_id
        self._lac_length = length
        self._last_pushed = last_entry_id
        self._length = length
        self._error: PulsarliteError | None = None     # sticky: later adds fail with it
        self._fenced = False
        self._attempts = 0
        self._state = WriteCoreState.WRITING
        self._close_requested = False
        self._closing_md: LedgerMetadata | None = None
        # the sends of a run that goes whole to every bookie of this ensemble (built once per ensemble)
        self._whole_run_sends_of: tuple[str, ...] | None = None
        self._whole_run_sends: tuple = ()

    # -- properties ----------------------------------------------------------------------
    @property
    def lac(self) -> int:
        return self._lac

    @property
    def lac_length(self) -> int:
        """Ledger length in bytes through the LAC entry."""
        return self._lac_length

    @property
    def last_add_pushed(self) -> int:
        return self._last_pushed

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def length(self) -> int:
        """Ledger length in bytes through the last add pushed."""
        return self._length

    @property
    def metadata(self) -> LedgerMetadata:
        """The last metadata known to be in the store (not a CAS in flight)."""
        return self._md

    @property
    def error(self) -> PulsarliteError | None:
        return self._error

    @property
    def is_fenced(self) -> bool:
        return self._fenced

    @property
    def state(self) -> WriteCoreState:
        return self._state

    @property
    def _view(self) -> LedgerMetadata:
        return self._proposed if self._proposed is not None else self._md

    # -- events --------------------------------------------------------------------------
    def add(self, payloads: Sequence[bytes], now_ms: int) -> tuple[int, list[Action]]:
        """Append every payload of ``payloads`` as consecutive entries (a single add is a run of
        one): returns the first entry id (the others follow it) and one SendAddRun, which hands
        each usable bookie its share of the run (an entry goes to the bookies of its write set,
        less those failed or waiting for an ensemble change: ``_send_missing`` sends it there
        once they are replaced). Raises the sticky error if an earlier add failed (nothing
        changes), LedgerClosedError once close() was called, ValueError for an empty run."""
        if self._state is not WriteCoreState.WRITING or self._close_requested:
            raise LedgerClosedError(f"ledger {self._md.ledger_id} is closed")
        if self._error is not None:
            raise type(self._error)(str(self._error))
        count = len(payloads)
        if count == 0:
            raise ValueError("an empty run")
        if not all(type(p) is bytes for p in payloads) if count > 1 else type(payloads[0]) is not bytes:
            payloads = tuple(p if type(p) is bytes else bytes(p) for p in payloads)
        elif type(payloads) is not tuple:
            payloads = tuple(payloads)
        first = self._last_pushed + 1
        view = self._proposed if self._proposed is not None else self._md     # _view, inline
        pending = self._pending
        length = self._length
        lengths = []
        entry_id = first
        write_set = view.write_set
        skipped = self._unusable | self._held if self._unusable or self._held else None
        ensemble = view.current_ensemble
        every_bookie = view.write_quorum == view.ensemble_size   # every bookie stores every entry
        offsets: dict[str, list[int]] | None = None if every_bookie and skipped is None else \
            {bookie: [] for bookie in ensemble}
        for payload in payloads:
            length += len(payload)
            bookies = write_set(entry_id)
            if skipped is not None:
                bookies = [b for b in bookies if b not in skipped]
            if offsets is not None:
                for bookie in bookies:
                    offsets[bookie].append(entry_id - first)
            pending[entry_id] = _PendingAdd(entry_id, payload, length, now_ms, set(), set(bookies))
            lengths.append(length)
            entry_id += 1
        self._length = length
        self._last_pushed = entry_id - 1
        if offsets is None:                  # every bookie: the whole run
            if self._whole_run_sends_of is not ensemble:
                self._whole_run_sends_of = ensemble
                self._whole_run_sends = tuple((bookie, None) for bookie in ensemble)
            sends: tuple = self._whole_run_sends
        else:
            sends = tuple((bookie, tuple(got)) for bookie, got in offsets.items() if got)
        if not sends:
            return first, []
        return first, [SendAddRun(first, self._lac, tuple(lengths), payloads, sends)]

    def on_add_result(self, bookie: str, entry_id: int, outcome: AddOutcome, now_ms: int,
                      writable_bookies: Sequence[str], rng: random.Random) -> list[Action]:
        """A bookie answered an add. ``writable_bookies``: bookies currently registered writable
        (candidates for an ensemble change)."""
        if self._state is WriteCoreState.CLOSED:
            return []
        if outcome is AddOutcome.FENCED:
            self._fenced = True
            return self._fail_all(LedgerFencedError(
                f"ledger {self._md.ledger_id} fenced (bookie {bookie}, entry {entry_id})"))
        add = self._pending.get(entry_id)
        if add is None:
            return []                             # already confirmed or failed: stale answer
        if bookie not in self._view.write_set(entry_id) or bookie in self._held:
            return []                             # answer from a bookie replaced since
        add.sent.discard(bookie)
        if outcome is AddOutcome.OK:
            add.acked.add(bookie)
            return self._advance()
        if outcome is AddOutcome.TOO_LARGE:
            return self._fail_all(BadRequestError(
                f"ledger {self._md.ledger_id}: entry {entry_id} of {len(add.payload)} bytes refused as too "
                f"large by bookie {bookie} (its entry_bytes_max)"))
        # ERROR, READ_ONLY, NO_SUCH_LEDGER: the bookie failed
        if bookie in add.acked or bookie in self._unusable:
            return []
        self._unusable.add(bookie)
        for other in self._pending.values():
            other.sent.discard(bookie)
        return self._change_ensemble(writable_bookies, rng)

    def on_add_acks(self, bookie: str, entry_ids: Sequence[int]) -> list[Action]:
        """Many OK answers from one bookie at once (acks arrive coalesced): the same as
        ``on_add_result(bookie, e, AddOutcome.OK, ...)`` for each id, with one LAC advance."""
        if self._state is WriteCoreState.CLOSED or bookie in self._held:
            return []
        view = self._proposed if self._proposed is not None else self._md     # _view, inline
        pending = self._pending
        for entry_id in entry_ids:
            add = pending.get(entry_id)
            if add is None or bookie not in view.write_set(entry_id):
                continue                          # stale, or from a bookie replaced since
            add.sent.discard(bookie)
            add.acked.add(bookie)
        return self._advance()

    def on_metadata_written(self, metadata: LedgerMetadata, now_ms: int,
                            writable_bookies: Sequence[str], rng: random.Random) -> list[Action]:
        """The CAS of a WriteMetadata this core emitted succeeded."""
        if self._state is WriteCoreState.CLOSING:
            check(metadata == self._closing_md, f"ledger {self._md.ledger_id}: unexpected close written")
            self._md = metadata
            self._state = WriteCoreState.CLOSED
            return [CloseDone(metadata)]
        check(self._proposed is not None and metadata == self._proposed,
              f"ledger {self._md.ledger_id}: metadata written that this core did not propose")
        replaced = set(self._md.current_ensemble) - set(metadata.current_ensemble)
        self._md = metadata
        self._proposed = None
        self._held = frozenset()
        self._attempts = 0
        self._unusable -= replaced
        actions: list[Action] = []
        for add in self._pending.values():
            actions += self._send_missing(add)
        actions += self._change_ensemble(writable_bookies, rng)   # failures since the proposal
        if self._close_requested and self._proposed is None:
            actions += self._start_close()
        return actions

    def on_metadata_conflict(self, current: LedgerMetadata, now_ms: int,
                             writable_bookies: Sequence[str], rng: random.Random) -> list[Action]:
        """The CAS lost: ``current`` is the metadata now in the store (remember its version)."""
        check(current.ledger_id == self._md.ledger_id, "metadata of another ledger")
        if self._state is WriteCoreState.CLOSED:
            return []
        if self._state is WriteCoreState.CLOSING:
            return self._close_conflict(current)
        if self._proposed is not None and current == self._proposed:
            # our own CAS applied and its answer was lost (ZooKeeper trouble): as written, so
            # that the replaced bookie is usable again and the attempt is not counted
            return self.on_metadata_written(current, now_ms, writable_bookies, rng)
        self._proposed = None
        self._held = frozenset()
        if current.state is not LedgerState.OPEN:
            self._fenced = True
            actions = self._fail_all(LedgerFencedError(
                f"ledger {current.ledger_id} is {current.state.value}: recovered by another client"))
            if self._close_requested:
                self._state = WriteCoreState.CLOSED
                actions.append(CloseFailed(LedgerFencedError(f"ledger {current.ledger_id} fenced")))
            return actions
        self._md = current
        self._attempts += 1
        for add in self._pending.values():           # rebase: write sets as in current
            members = set(current.write_set(add.entry_id))
            add.acked &= members
            add.sent &= members
        if self._attempts > self._attempts_max:
            actions = self._fail_all(MetadataError(
                f"ledger {current.ledger_id}: ensemble change gave up after {self._attempts_max} conflicts"))
        else:
            actions = self._change_ensemble(writable_bookies, rng)
            for add in self._pending.values():
                actions += self._send_missing(add)
            actions += self._advance()
        if self._close_requested and self._proposed is None:
            actions += self._start_close()
        return actions

    def on_metadata_gone(self) -> list[Action]:
        """A CAS found the ledger's metadata gone: another client recovered the ledger (found
        it empty) and deleted it. As a conflict with a ledger no longer OPEN: every pending add
        fails with LedgerFencedError, no add is accepted again, a close in progress fails."""
        if self._state is WriteCoreState.CLOSED:
            return []
        self._proposed = None
        self._held = frozenset()
        self._fenced = True
        ledger_id = self._md.ledger_id
        actions = self._fail_all(LedgerFencedError(
            f"ledger {ledger_id} was deleted: recovered and removed by another client"))
        if self._state is WriteCoreState.CLOSING or self._close_requested:
            self._state = WriteCoreState.CLOSED
            actions.append(CloseFailed(LedgerFencedError(f"ledger {ledger_id} was deleted by another client")))
        return actions

    def on_tick(self, now_ms: int, writable_bookies: Sequence[str], rng: random.Random) -> list[Action]:
        """Periodic: fail adds older than add_timeout_ms (all pending, in order), and retry an
        ensemble change when bookies became writable."""
        if self._state is not WriteCoreState.WRITING:
            return []
        if self._pending:
            oldest = self._pending[self._lac + 1]
            if now_ms - oldest.added_ms >= self._add_timeout_ms:
                members = self._view.write_set(oldest.entry_id)
                usable = [b for b in members if b not in self._unusable and b not in self._held]
                if len(usable) < self._md.ack_quorum:
                    error: PulsarliteError = NotEnoughBookiesError(
                        f"ledger {self._md.ledger_id}: entry {oldest.entry_id} has {len(usable)} usable "
                        f"bookies of {members}, needs {self._md.ack_quorum}")
                else:
                    error = TimeoutError_(f"ledger {self._md.ledger_id}: entry {oldest.entry_id} "
                                          f"not confirmed within {self._add_timeout_ms} ms")
                return self._fail_all(error)
        return self._change_ensemble(writable_bookies, rng)

    def close(self) -> list[Action]:
        """Close at the LAC: emits WriteMetadata(CLOSED, last_entry_id=lac, length=lac_length),
        then CloseDone / CloseFailed once the CAS answered. Adds still pending fail first with
        LedgerClosedError. On a fenced ledger: CloseFailed(LedgerFencedError) at once."""
        if self._state is not WriteCoreState.WRITING or self._close_requested:
            return []
        actions = self._fail_all(LedgerClosedError(f"ledger {self._md.ledger_id} closed with adds pending"))
        if self._proposed is not None:
            self._close_requested = True         # after the ensemble change CAS answered
            return actions
        return actions + self._start_close()

    # -- internals -----------------------------------------------------------------------
    def _send_missing(self, add: _PendingAdd) -> list[Action]:
        actions: list[Action] = []
        for bookie in self._view.write_set(add.entry_id):
            if (bookie in add.acked or bookie in add.sent or bookie in self._unusable
                    or bookie in self._held):
                continue
            add.sent.add(bookie)
            actions.append(SendAdd(bookie, add.entry_id, self._lac, add.length, add.payload))
        return actions

    def _advance(self) -> list[Action]:
        quorum = self._md.ack_quorum
        view = self._proposed if self._proposed is not None else self._md     # _view, inline
        lac = self._lac
        pending = self._pending
        while True:
            add = pending.get(lac + 1)
            # fewer acks than the quorum in all: no need to intersect with the write set
            if add is None or len(add.acked) < quorum \
                    or len(add.acked.intersection(view.write_set(add.entry_id))) < quorum:
                break
            lac += 1
            del pending[lac]                 # confirmed: every lower entry is too
            self._lac_length = add.length
        if lac == self._lac:
            return []
        self._lac = lac
        return [ConfirmAdds(lac)]

    def _fail_all(self, error: PulsarliteError) -> list[Action]:
        if self._error is None or isinstance(error, LedgerFencedError):
            self._error = error
        if not self._pending:
            return []
        first = self._lac + 1
        check(min(self._pending) == first, f"pending adds do not start at LAC+1 ({first})")
        self._pending.clear()
        return [FailAdds(first, error)]

    def _change_ensemble(self, writable_bookies: Sequence[str], rng: random.Random) -> list[Action]:
        """Propose a new fragment replacing the failed bookies of the current ensemble (or, with
        no replacement, record them as under-replicated). One CAS in flight at a time."""
        if (self._state is not WriteCoreState.WRITING or self._proposed is not None
                or self._error is not None):
            return []
        base = self._md
        ensemble = list(base.current_ensemble)
        failed = [i for i, b in enumerate(ensemble) if b in self._unusable]
        if not failed:
            return []
        replacements = choose_replacements(writable_bookies, set(ensemble) | self._unusable,
                                           len(failed), rng)
        for index, bookie in zip(failed, replacements):
            ensemble[index] = bookie
        new_ensemble = tuple(ensemble)
        under = tuple(sorted(set(base.under_replicated_bookies)
                             | {b for b in new_ensemble if b in self._unusable}))
        proposal = base
        if new_ensemble != base.current_ensemble:
            proposal = proposal.with_new_fragment(self._lac + 1, new_ensemble)
        if under != base.under_replicated_bookies:
            proposal = replace(proposal, under_replicated_bookies=under)
        if proposal == base:
            return []
        self._proposed = proposal
        self._held = frozenset(new_ensemble) - frozenset(base.current_ensemble)
        for add in self._pending.values():
            members = set(proposal.write_set(add.entry_id))
            add.acked &= members
            add.sent &= members
        return [WriteMetadata(proposal)]

    def _start_close(self) -> list[Action]:
        self._close_requested = False
        if self._fenced:
            self._state = WriteCoreState.CLOSED
            return [CloseFailed(LedgerFencedError(f"ledger {self._md.ledger_id} fenced"))]
        self._closing_md = self._md.with_state(LedgerState.CLOSED, last_entry_id=self._lac,
                                               length=self._lac_length)
        self._state = WriteCoreState.CLOSING
        self._attempts = 0
        return [WriteMetadata(self._closing_md)]

    def _close_conflict(self, current: LedgerMetadata) -> list[Action]:
        if current.state is LedgerState.OPEN and self._attempts < self._attempts_max:
            self._attempts += 1
            self._md = current
            self._closing_md = current.with_state(LedgerState.CLOSED, last_entry_id=self._lac,
                                                  length=self._lac_length)
            return [WriteMetadata(self._closing_md)]
        self._state = WriteCoreState.CLOSED
        if current.is_closed and current.last_entry_id == self._lac and current.length == self._lac_length:
            self._md = current
            return [CloseDone(current)]
        if current.state is LedgerState.OPEN:
            return [CloseFailed(MetadataError(f"ledger {current.ledger_id}: close gave up after "
                                              f"{self._attempts_max} conflicts"))]
        self._fenced = True
        return [CloseFailed(LedgerFencedError(
            f"ledger {current.ledger_id} is {current.state.value} by another client"))]
