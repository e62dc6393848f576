"""The pure core of a managed ledger: a topic's log as an ordered list of ledgers.

I/O-free and clock-free (docs/architecture.md#style): the shell (shell.py) calls the event methods with the
time and executes the returned actions (write an entry to a ledger, complete or fail an add,
start a rollover). The core decides:

- positions: ``Position(ledger_id, entry_id)``; ledger ids grow along the list (ids come from
  ZooKeeper sequential nodes and a new ledger is always appended), so the natural ordering of
  (ledger_id, entry_id) is the ledger list order; the metadata checks it;
- rollover of the current ledger by entry count, bytes or age (``RolloverPolicy``); the limits
  count adds pushed to the ledger, so a rolled ledger holds exactly ``entries_max`` entries or
  passes ``bytes_max`` by less than one entry;
- **adds during a rollover are queued** and go to the new ledger only once every add to the old
  one is confirmed or failed, the old one is closed and the new list is CASed: confirmations are
  in order across ledgers and nothing is reordered;
- failures: a fenced ledger (LedgerFencedError) or a list changed by someone else means another
  owner took the topic: state FENCED, every unconfirmed add fails with ManagedLedgerFencedError
  (not retriable), and so does every later add. A retriable add failure (no quorum, timeout)
  fails that add and (by the ledger's sticky error) every add after it on that ledger, plus every
  queued add (they were issued after it: keeps the log free of holes from the producer's view),
  then rolls over; later adds go to the new ledger. BookKeeper and Pulsar do the same: pending
  adds of a failed ledger are failed back and the producer re-sends;
- per-ledger stats of confirmed entries (entries, bytes, min/max publish time given with each
  add) and the next metadata (pure transforms below; the shell compare-and-sets them).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, replace
from typing import Iterator, Mapping, NamedTuple, Sequence, Union

from broker.errors import BrokerError
from pulsarlite.errors import InvariantViolation, LedgerFencedError, PulsarliteError, check
from pulsarlite.ledger_list import LedgerInfo, LedgerInfoState, ManagedLedgerMetadata, OffloadRecord, OffloadState
from pulsarlite.wire import pb


# -- errors ---------------------------------------------------------------------------------
class ManagedLedgerError(BrokerError):
    """An add or operation of a managed ledger failed; retriable (re-send, or reopen). A client
    is told ServiceNotReady when it is retriable, else PersistenceError."""

    retriable = True

    @property
    def server_error(self) -> int:  # type: ignore[override]
        return pb.ServiceNotReady if self.retriable else pb.PersistenceError


class ManagedLedgerFencedError(ManagedLedgerError):
    """Another owner took the managed ledger (its ledger was fenced or its list changed): this
    instance never writes again; the broker drops ownership."""

    retriable = False


class ManagedLedgerClosedError(ManagedLedgerError):
    """The managed ledger is closed (or deleted) by its owner."""

    retriable = False


# -- positions ------------------------------------------------------------------------------
class Position(NamedTuple):
    """Where an entry is: (ledger, entry). Immutable and ordered as the ledger list is (ledger
    ids grow along it). A NamedTuple rather than a frozen dataclass: built, hashed and compared
    several times per message on the broker's hot paths, at a third of the cost (C-level hash
    and ordering; docs/decisions.md "[perf]")."""

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


# -- metadata: the ledger-list document and its types live in pulsarlite/ledger_list.py -----
# -- pure transforms of the metadata (the shell CASes their result) ---------------------------
def with_ledger_appended(md: ManagedLedgerMetadata, ledger_id: int, created_ms: int) -> ManagedLedgerMetadata:
    """A new OPEN ledger at the end of the list."""
    if md.ledgers and ledger_id <= md.ledgers[-1].ledger_id:
        raise InvariantViolation(f"new ledger {ledger_id} does not follow {md.ledgers[-1].ledger_id}")
    return replace(md, ledgers=md.ledgers + (LedgerInfo(ledger_id, created_ms=created_ms),))


def with_ledger_closed(md: ManagedLedgerMetadata, ledger_id: int, *, entries: int, size_bytes: int,
                       min_publish_time_ms: int | None, max_publish_time_ms: int | None) -> ManagedLedgerMetadata:
    """The ledger marked CLOSED with its final stats (idempotent for the same stats)."""
    out = []
    found = False
    for info in md.ledgers:
        if info.ledger_id == ledger_id:
            found = True
            closed = replace(info, state=LedgerInfoState.CLOSED, entries=entries, size_bytes=size_bytes,
                             min_publish_time_ms=min_publish_time_ms, max_publish_time_ms=max_publish_time_ms)
            if info.state is LedgerInfoState.CLOSED and info != closed:
                raise InvariantViolation(f"ledger {ledger_id} is already CLOSED with other stats: {info}")
            info = closed
        out.append(info)
    if not found:
        raise InvariantViolation(f"ledger {ledger_id} is not in the list {md.ledger_ids}")
    return replace(md, ledgers=tuple(out))


def without_ledgers(md: ManagedLedgerMetadata, ledger_ids: Sequence[int]) -> ManagedLedgerMetadata:
    drop = set(ledger_ids)
    return replace(md, ledgers=tuple(i for i in md.ledgers if i.ledger_id not in drop))


def with_offload(md: ManagedLedgerMetadata, ledger_id: int, offload: OffloadRecord) -> ManagedLedgerMetadata:
    """The list with ``ledger_id``'s offload info replaced (the offloader's CAS transform). Only
    a CLOSED ledger is offloaded."""
    out = []
    found = False
    for info in md.ledgers:
        if info.ledger_id == ledger_id:
            found = True
            if info.state is not LedgerInfoState.CLOSED:
                raise InvariantViolation(f"ledger {ledger_id}: offload of a ledger that is not CLOSED")
            info = replace(info, offload=offload)
        out.append(info)
    if not found:
        raise InvariantViolation(f"ledger {ledger_id} is not in the list {md.ledger_ids}")
    return replace(md, ledgers=tuple(out))


# -- position helpers (over a ledger list with entry counts) --------------------------------
def next_position(ledgers: Sequence[LedgerInfo], position: Position) -> Position:
    """The position after ``position``: the next entry of its ledger, else the first entry of
    the next non-empty ledger, else the end position (last ledger, its entry count: where the
    next add lands). ``position.ledger_id`` must be in the list."""
    index = _index_of(ledgers, position.ledger_id)
    if position.entry_id + 1 < ledgers[index].entries:
        return Position(position.ledger_id, position.entry_id + 1)
    for info in ledgers[index + 1:]:
        if info.entries > 0:
            return Position(info.ledger_id, 0)
    if index == len(ledgers) - 1:
        return Position(position.ledger_id, position.entry_id + 1)
    return Position(ledgers[-1].ledger_id, ledgers[-1].entries)


def iter_positions(ledgers: Sequence[LedgerInfo], start: Position, count_max: int | None = None
                   ) -> Iterator[Position]:
    """Existing positions >= ``start`` in list order, at most ``count_max``. A start in a ledger
    that is not in the list (trimmed) continues at the next ledger that is."""
    left = count_max
    for info in ledgers:
        if info.ledger_id < start.ledger_id:
            continue
        first = max(start.entry_id, 0) if info.ledger_id == start.ledger_id else 0
        for entry_id in range(first, info.entries):
            if left is not None:
                if left <= 0:
                    return
                left -= 1
            yield Position(info.ledger_id, entry_id)


def ledger_ranges(ledgers: Sequence[LedgerInfo], start: Position, count_max: int) -> list[tuple[int, int, int]]:
    """The positions of ``iter_positions`` as (ledger_id, first_entry, last_entry) ranges."""
    out: list[tuple[int, int, int]] = []
    left = count_max
    for info in ledgers:
        if left <= 0:
            break
        if info.ledger_id < start.ledger_id:
            continue
        first = max(start.entry_id, 0) if info.ledger_id == start.ledger_id else 0
        last = min(info.entries - 1, first + left - 1)
        if last >= first:
            out.append((info.ledger_id, first, last))
            left -= last - first + 1
    return out


def _index_of(ledgers: Sequence[LedgerInfo], ledger_id: int) -> int:
    for i, info in enumerate(ledgers):
        if info.ledger_id == ledger_id:
            return i
    raise ValueError(f"ledger {ledger_id} is not in the list {[i.ledger_id for i in ledgers]}")


# -- rollover policy -------------------------------------------------------------------------
class RolloverReason(enum.Enum):
    ENTRIES = "entries"
    BYTES = "bytes"
    AGE = "age"
    FAILURE = "failure"   # an add to the ledger failed (retriable): write the next ledger
    DAY = "day"           # [lakehouse] an add's publish time is on a later UTC day than the ledger's


@dataclass(frozen=True)
class RolloverPolicy:
    entries_max: int
    bytes_max: int
    age_ms_max: int
    # [lakehouse] > 0: a ledger holds one period of publish time (86_400_000: one UTC day, so
    # each tier object fits a day(publish_time) partition). Only a LATER period rolls the ledger
    # over (before that add): an add of an earlier period (producers' clocks differ) stays in the
    # current ledger, so skewed producers near midnight cannot make a ledger per entry.
    publish_period_ms: int = 0

    def __post_init__(self) -> None:
        if self.entries_max <= 0 or self.bytes_max <= 0 or self.age_ms_max <= 0:
            raise ValueError(f"rollover limits must be > 0: {self}")
        if self.publish_period_ms < 0:
            raise ValueError(f"publish_period_ms must be >= 0: {self}")

    def publish_period_cut(self, period_max: int | None, publish_times_ms: Sequence[int]) -> tuple[int, int | None]:
        """Where a run of adds must start a new ledger because of publish-time periods:
        (index of the first add whose period is later than every period before it in the
        ledger, or len(run) if none; the ledger's latest period after the adds before that
        index). ``period_max``: the latest period of the adds already in the ledger (None:
        empty ledger: its first add never cuts). Off (``publish_period_ms`` 0): no cut."""
        period_ms = self.publish_period_ms
        if not period_ms:
            return len(publish_times_ms), period_max
        for i, pt in enumerate(publish_times_ms):
            period = pt // period_ms
            if period_max is None:
                period_max = period
            elif period > period_max:
                return i, period_max
        return len(publish_times_ms), period_max

    def reason(self, entries: int, size_bytes: int, created_ms: int, now_ms: int) -> RolloverReason | None:
        """Why a ledger with these stats must roll over now (None: it need not). An empty
        ledger never rolls by age."""
        if entries >= self.entries_max:
            return RolloverReason.ENTRIES
        if size_bytes >= self.bytes_max:
            return RolloverReason.BYTES
        if entries > 0 and now_ms - created_ms >= self.age_ms_max:
            return RolloverReason.AGE
        return None


# -- states ----------------------------------------------------------------------------------
class ManagedLedgerState(enum.Enum):
    OPENING = "OPENING"            # recovering the previous owner's ledgers, creating ours
    READY = "READY"                # adds go to the current ledger
    ROLLING_OVER = "ROLLING_OVER"  # adds queue; the old ledger drains and closes, the next opens
    CLOSING = "CLOSING"            # close(): adds refused, the current ledger drains and closes
    CLOSED = "CLOSED"
    FENCED = "FENCED"              # another owner took it: never writes again
    FAILED = "FAILED"              # a rollover could not finish (ZooKeeper or bookies gone beyond
                                   # the retry bounds): adds fail (retriable); close and reopen
    DELETED = "DELETED"


S = ManagedLedgerState
STATE_TRANSITIONS: Mapping[ManagedLedgerState, frozenset[ManagedLedgerState]] = {
    S.OPENING: frozenset({S.READY, S.FENCED, S.FAILED, S.CLOSED}),
    S.READY: frozenset({S.ROLLING_OVER, S.CLOSING, S.FENCED, S.FAILED}),
    S.ROLLING_OVER: frozenset({S.READY, S.FENCED, S.FAILED}),
    S.CLOSING: frozenset({S.CLOSED, S.FENCED, S.FAILED}),
    S.CLOSED: frozenset({S.DELETED}),
    S.FAILED: frozenset({S.CLOSED, S.FENCED}),  # FENCED: stronger news, the owner must let go
    S.FENCED: frozenset(),
    S.DELETED: frozenset(),
}


# -- actions ---------------------------------------------------------------------------------
class WriteEntries(NamedTuple):
    """The payloads of adds ``add_id .. add_id + count - 1`` go to ledger ``ledger_id`` as
    entries ``entry_id .. entry_id + count - 1``, in one call to its writer. (WriteEntries and
    CompleteAdds are immutable NamedTuples for speed: one each per run of adds.)"""

    add_id: int
    ledger_id: int
    entry_id: int
    count: int


class CompleteAdds(NamedTuple):
    """Adds ``add_id .. add_id + count - 1`` are confirmed at ``ledger_id:entry_id ..
    entry_id + count - 1`` (``ManagedLedgerCore.on_adds_confirmed``)."""

    add_id: int
    ledger_id: int
    entry_id: int
    count: int


@dataclass(frozen=True)
class FailAdd:
    add_id: int
    error: PulsarliteError


@dataclass(frozen=True)
class StartRollover:
    """Drain and close ``ledger_id``, create the next ledger, CAS the list, then call
    ``on_rolled_over`` (or ``on_fenced`` / ``on_failed``)."""

    ledger_id: int
    reason: RolloverReason


Action = Union[WriteEntries, CompleteAdds, FailAdd, StartRollover]


@dataclass(slots=True)
class _Add:
    size_bytes: int
    publish_time_ms: int
    ledger_id: int = -1       # -1: queued
    entry_id: int = -1


@dataclass
class _CurrentLedger:
    ledger_id: int
    created_ms: int
    entries_pushed: int = 0
    bytes_pushed: int = 0
    entries_confirmed: int = 0
    bytes_confirmed: int = 0
    min_publish_time_ms: int | None = None
    max_publish_time_ms: int | None = None
    failed: bool = False
    publish_period_max: int | None = None   # latest publish-time period pushed (RolloverPolicy.publish_period_ms)


class ManagedLedgerCore:
    """See the module docstring. One instance per open managed ledger."""

    def __init__(self, name: str, policy: RolloverPolicy, *, pending_adds_max: int) -> None:
        if pending_adds_max <= 0:
            raise ValueError("pending_adds_max must be > 0")
        self.name = name
        self.policy = policy
        self._pending_adds_max = pending_adds_max
        self._state = ManagedLedgerState.OPENING
        self._md = ManagedLedgerMetadata()
        self._current: _CurrentLedger | None = None
        self._adds: dict[int, _Add] = {}
        self._queue: deque[int] = deque()
        self._next_add_id = 0
        # the last confirmed entry: a Position, or a plain (ledger id, entry id) tuple where a
        # confirmation set it (made a Position when asked: one fewer NamedTuple per confirmation)
        self._last_confirmed: Position | tuple[int, int] | None = None
        self._error: PulsarliteError | None = None   # why adds fail in FENCED / FAILED

    # -- properties -------------------------------------------------------------------------
    @property
    def state(self) -> ManagedLedgerState:
        return self._state

    @property
    def metadata(self) -> ManagedLedgerMetadata:
        """The list as last written to the store."""
        return self._md

    @property
    def current_ledger_id(self) -> int | None:
        return self._current.ledger_id if self._current else None

    @property
    def pending_count(self) -> int:
        """Adds not yet completed or failed (in flight + queued)."""
        return len(self._adds)

    @property
    def queued_count(self) -> int:
        return len(self._queue)

    @property
    def in_flight_count(self) -> int:
        return len(self._adds) - len(self._queue)

    @property
    def last_confirmed(self) -> Position:
        last = self._last_confirmed
        if last is None:
            raise InvariantViolation(f"{self.name}: not open yet")
        if type(last) is not Position:
            last = self._last_confirmed = Position(*last)
        return last

    @property
    def error(self) -> PulsarliteError | None:
        return self._error

    def ledgers(self) -> tuple[LedgerInfo, ...]:
        """The list with the current ledger's live stats (confirmed entries)."""
        cur = self._current
        if cur is None:
            return self._md.ledgers
        return tuple(
            replace(i, entries=cur.entries_confirmed, size_bytes=cur.bytes_confirmed,
                    min_publish_time_ms=cur.min_publish_time_ms, max_publish_time_ms=cur.max_publish_time_ms)
            if i.ledger_id == cur.ledger_id and i.state is LedgerInfoState.OPEN else i
            for i in self._md.ledgers)

    def current_confirmed(self) -> tuple[int, int]:
        """(ledger id, last confirmed entry id) of the current ledger."""
        cur = self._require_current()
        return cur.ledger_id, cur.entries_confirmed - 1

    # -- state -------------------------------------------------------------------------------
    def _to(self, state: ManagedLedgerState) -> None:
        if state is not self._state and state not in STATE_TRANSITIONS[self._state]:
            raise InvariantViolation(f"{self.name}: {self._state.value} -> {state.value} not allowed")
        self._state = state

    def _require_current(self) -> _CurrentLedger:
        if self._current is None:
            raise InvariantViolation(f"{self.name}: no current ledger")
        return self._current

    # -- open --------------------------------------------------------------------------------
    def open_metadata(self, stored: ManagedLedgerMetadata, recovered: Mapping[int, LedgerInfo],
                      new_ledger_id: int, now_ms: int) -> ManagedLedgerMetadata:
        """Pure: the list after opening: every recovered ledger CLOSED with its final stats
        (``recovered`` maps each OPEN ledger of ``stored`` to its CLOSED info; empty ones are
        dropped from the list), and the new ledger appended OPEN."""
        check(self._state is ManagedLedgerState.OPENING, f"{self.name}: open_metadata in {self._state.value}")
        md = stored
        open_ids = {i.ledger_id for i in stored.open_ledgers}
        check(set(recovered) == open_ids, f"{self.name}: recovered {sorted(recovered)} but open {sorted(open_ids)}")
        empty = []
        for ledger_id, info in recovered.items():
            if info.entries == 0:
                empty.append(ledger_id)
                continue
            md = with_ledger_closed(md, ledger_id, entries=info.entries, size_bytes=info.size_bytes,
                                    min_publish_time_ms=info.min_publish_time_ms,
                                    max_publish_time_ms=info.max_publish_time_ms)
        md = without_ledgers(md, empty)
        return with_ledger_appended(md, new_ledger_id, now_ms)

    def on_opened(self, md: ManagedLedgerMetadata) -> list[Action]:
        """The list ``md`` (from open_metadata) is stored: READY on its last ledger."""
        check(self._state is ManagedLedgerState.OPENING, f"{self.name}: on_opened in {self._state.value}")
        last = md.ledgers[-1]
        check(last.state is LedgerInfoState.OPEN and last.entries == 0, f"{self.name}: last ledger not new: {last}")
        self._md = md
        self._current = _CurrentLedger(last.ledger_id, last.created_ms)
        self._last_confirmed = Position(last.ledger_id, -1)
        for info in reversed(md.ledgers[:-1]):
            if info.entries > 0:
                self._last_confirmed = Position(info.ledger_id, info.entries - 1)
                break
        self._to(ManagedLedgerState.READY)
        return self._push_queued(now_ms=None)

    # -- adds --------------------------------------------------------------------------------
    def add(self, sizes_bytes: Sequence[int], publish_times_ms: Sequence[int],
            now_ms: int) -> tuple[int, list[Action]]:
        """The one add event: a run of adds, in order (a single add is a run of one). Returns
        the first add id (the others follow it) and the actions: a WriteEntries for the adds
        that go to the current ledger now, then a StartRollover where the rollover policy finds
        the ledger full (the rest of the run queues behind it, as adds do during a rollover);
        nothing while adds queue (OPENING, ROLLING_OVER). Raises if adds are refused, or the
        whole run does not fit under pending_adds_max (nothing changes)."""
        count = len(sizes_bytes)
        if count != len(publish_times_ms):
            raise ValueError(f"{count} sizes but {len(publish_times_ms)} publish times")
        if count == 0:
            raise ValueError("an empty run of adds")
        size_bytes = 0
        for size in sizes_bytes:
            if size < 0:
                raise ValueError("size_bytes must be >= 0")
            size_bytes += size
        # refused: the error the adds fail with now (nothing changes)
        state = self._state
        if state in (ManagedLedgerState.FENCED, ManagedLedgerState.FAILED):
            raise type(self._error)(str(self._error)) if self._error else ManagedLedgerError(state.value)
        if state in (ManagedLedgerState.CLOSING, ManagedLedgerState.CLOSED, ManagedLedgerState.DELETED):
            raise ManagedLedgerClosedError(f"{self.name}: managed ledger is {state.value}")
        if len(self._adds) + count > self._pending_adds_max:
            raise ManagedLedgerError(f"{self.name}: {len(self._adds)} adds pending, {count} more would pass "
                                     f"the limit ({self._pending_adds_max})")
        first_add_id = self._next_add_id
        self._next_add_id += count
        adds = self._adds
        cur = self._current
        if state is not ManagedLedgerState.READY or self._queue or cur is None:
            for add_id, size, publish_time_ms in zip(range(first_add_id, first_add_id + count), sizes_bytes,
                                                     publish_times_ms):
                adds[add_id] = _Add(size, publish_time_ms)
                self._queue.append(add_id)
            if self._state is not ManagedLedgerState.READY:
                return first_add_id, []
            return first_add_id, self._push_queued(now_ms)
        # straight to the current ledger, up to where it is full
        policy = self.policy
        taken = count
        taken_bytes = size_bytes
        reason = policy.reason(cur.entries_pushed + count, cur.bytes_pushed + taken_bytes, cur.created_ms, now_ms)
        if reason is not None and count > 1:
            # the policy is monotone in entries and bytes (and age applies alike to every add
            # of the run): the ledger is full after the shortest prefix it names a reason for
            taken_bytes = 0
            for taken, size in enumerate(sizes_bytes, 1):
                taken_bytes += size
                reason = policy.reason(cur.entries_pushed + taken, cur.bytes_pushed + taken_bytes,
                                       cur.created_ms, now_ms)
                if reason is not None:
                    break
        if policy.publish_period_ms:
            cut, period_max = policy.publish_period_cut(cur.publish_period_max, publish_times_ms[:taken])
            if cut < taken:
                taken, reason = cut, RolloverReason.DAY
                taken_bytes = sum(sizes_bytes[:cut])
            cur.publish_period_max = period_max
        ledger_id = cur.ledger_id
        first_entry_id = cur.entries_pushed
        offset = 0
        while offset < taken:            # (not a range: its cost is the loop's for a run of one)
            adds[first_add_id + offset] = _Add(sizes_bytes[offset], publish_times_ms[offset], ledger_id,
                                               first_entry_id + offset)
            offset += 1
        cur.entries_pushed += taken
        cur.bytes_pushed += taken_bytes
        actions: list[Action] = [WriteEntries(first_add_id, ledger_id, first_entry_id, taken)] if taken else []
        if reason is not None:
            self._to(ManagedLedgerState.ROLLING_OVER)
            actions.append(StartRollover(ledger_id, reason))
            for offset in range(taken, count):
                add_id = first_add_id + offset
                adds[add_id] = _Add(sizes_bytes[offset], publish_times_ms[offset])
                self._queue.append(add_id)
        return first_add_id, actions

    def _push_queued(self, now_ms: int | None) -> list[Action]:
        """Send queued adds to the current ledger (one WriteEntries per run of consecutive add
        ids) until it is full (then roll over)."""
        actions: list[Action] = []
        cur = self._require_current()
        queue = self._queue
        adds = self._adds
        run_add_id = run_entry_id = -1
        run_count = 0
        while queue and self._state is ManagedLedgerState.READY:
            add_id = queue[0]
            add = adds[add_id]
            if self.policy.publish_period_ms:
                cut, period_max = self.policy.publish_period_cut(cur.publish_period_max, (add.publish_time_ms,))
                if cut == 0:
                    # a later period: this add opens the next ledger
                    if run_count:
                        actions.append(WriteEntries(run_add_id, cur.ledger_id, run_entry_id, run_count))
                        run_count = 0
                    self._to(ManagedLedgerState.ROLLING_OVER)
                    actions.append(StartRollover(cur.ledger_id, RolloverReason.DAY))
                    break
                cur.publish_period_max = period_max
            queue.popleft()
            add.ledger_id, add.entry_id = cur.ledger_id, cur.entries_pushed
            if run_count and add_id == run_add_id + run_count:
                run_count += 1
            else:
                if run_count:
                    actions.append(WriteEntries(run_add_id, cur.ledger_id, run_entry_id, run_count))
                run_add_id, run_entry_id, run_count = add_id, add.entry_id, 1
            cur.entries_pushed += 1
            cur.bytes_pushed += add.size_bytes
            reason = self.policy.reason(cur.entries_pushed, cur.bytes_pushed, cur.created_ms,
                                        now_ms if now_ms is not None else cur.created_ms)
            if reason is not None:
                actions.append(WriteEntries(run_add_id, cur.ledger_id, run_entry_id, run_count))
                run_count = 0
                self._to(ManagedLedgerState.ROLLING_OVER)
                actions.append(StartRollover(cur.ledger_id, reason))
        if run_count:
            actions.append(WriteEntries(run_add_id, cur.ledger_id, run_entry_id, run_count))
        return actions

    def on_adds_confirmed(self, first_add_id: int, ledger_id: int, first_entry_id: int,
                          count: int) -> list[Action]:
        """Adds ``first_add_id ..`` (``count`` of them) confirmed at consecutive entries from
        ``first_entry_id``, the next ones of the current ledger: one state change and one
        CompleteAdds. Raises InvariantViolation (nothing changes) for an add that is unknown,
        failed, sent elsewhere, or out of order."""
        if count <= 0:
            raise InvariantViolation(f"{self.name}: confirmation of {count} adds")
        cur = self._current
        if cur is None:
            raise InvariantViolation(f"{self.name}: no current ledger")
        adds = self._adds
        if ledger_id != cur.ledger_id or first_entry_id != cur.entries_confirmed:
            raise InvariantViolation(
                f"{self.name}: adds {first_add_id}.. confirmed at {ledger_id}:{first_entry_id}, expected "
                f"ledger {cur.ledger_id} entry {cur.entries_confirmed}")
        size_bytes = 0
        lo, hi = cur.min_publish_time_ms, cur.max_publish_time_ms
        entry_id = first_entry_id
        add_ids = range(first_add_id, first_add_id + count)
        for add_id in add_ids:
            add = adds.get(add_id)
            if add is None:
                raise InvariantViolation(f"{self.name}: confirmation of unknown or failed add "
                                         f"{add_id} at {ledger_id}:{entry_id}")
            if add.entry_id != entry_id or add.ledger_id != ledger_id:
                raise InvariantViolation(
                    f"{self.name}: add {add_id} confirmed at {ledger_id}:{entry_id}, "
                    f"expected {add.ledger_id}:{add.entry_id}")
            size_bytes += add.size_bytes
            pt = add.publish_time_ms
            if lo is None or pt < lo:
                lo = pt
            if hi is None or pt > hi:
                hi = pt
            entry_id += 1
        last = self._last_confirmed
        if last is not None and (ledger_id, first_entry_id) <= last:
            raise InvariantViolation(f"{self.name}: last confirmed would go backwards: {last[0]}:{last[1]} -> "
                                     f"{ledger_id}:{first_entry_id}")
        for add_id in add_ids:
            del adds[add_id]
        cur.entries_confirmed += count
        cur.bytes_confirmed += size_bytes
        cur.min_publish_time_ms, cur.max_publish_time_ms = lo, hi
        self._last_confirmed = (ledger_id, entry_id - 1)
        return [CompleteAdds(first_add_id, ledger_id, first_entry_id, count)]

    def on_add_failed(self, add_id: int, ledger_id: int, error: PulsarliteError) -> list[Action]:
        """An add to ``ledger_id`` failed. LedgerFencedError: FENCED. Otherwise the add (and the
        queued ones) fail with a retriable error and the ledger is rolled over."""
        if isinstance(error, LedgerFencedError):
            return self.on_fenced(ManagedLedgerFencedError(
                f"{self.name}: ledger {ledger_id} was fenced by another owner: {error}"))
        add = self._adds.pop(add_id, None)
        if add is None:
            return []   # already failed (fenced, failed rollover)
        check(add.ledger_id == ledger_id, f"{self.name}: add {add_id} failed on {ledger_id}, sent to {add.ledger_id}")
        err = error if error.retriable else ManagedLedgerError(f"{self.name}: add failed: {error}")
        actions: list[Action] = [FailAdd(add_id, err)]
        cur = self._require_current()
        check(ledger_id == cur.ledger_id, f"{self.name}: failure from ledger {ledger_id}, current {cur.ledger_id}")
        cur.failed = True
        actions += self._fail_queued(ManagedLedgerError(
            f"{self.name}: an earlier add to ledger {ledger_id} failed ({error}); re-send"))
        if self._state is ManagedLedgerState.READY:
            self._to(ManagedLedgerState.ROLLING_OVER)
            actions.append(StartRollover(ledger_id, RolloverReason.FAILURE))
        return actions

    def _fail_queued(self, error: PulsarliteError) -> list[Action]:
        actions: list[Action] = []
        while self._queue:
            add_id = self._queue.popleft()
            del self._adds[add_id]
            actions.append(FailAdd(add_id, error))
        return actions

    def _fail_all(self, error: PulsarliteError) -> list[Action]:
        actions: list[Action] = [FailAdd(add_id, error) for add_id in sorted(self._adds)]
        self._adds.clear()
        self._queue.clear()
        return actions

    def on_tick(self, now_ms: int) -> list[Action]:
        """Periodic: roll an old non-empty ledger over (age limit)."""
        if self._state is not ManagedLedgerState.READY:
            return []
        cur = self._require_current()
        reason = self.policy.reason(cur.entries_pushed, cur.bytes_pushed, cur.created_ms, now_ms)
        if reason is None:
            return []
        self._to(ManagedLedgerState.ROLLING_OVER)
        return [StartRollover(cur.ledger_id, reason)]

    # -- rollover ----------------------------------------------------------------------------
    def entries_confirmed_current(self) -> int:
        """Entries of the current ledger confirmed so far (a rollover compares them with where
        the ledger closed: more means a recovery kept adds that had failed)."""
        return self._require_current().entries_confirmed

    def closed_info(self, last_entry_id: int, length: int) -> LedgerInfo:
        """The current ledger's final info, given where its ledger closed. More entries than
        confirmed (a recovery kept adds that had failed) leaves publish times unknown; fewer
        would lose acknowledged entries: an invariant violation."""
        cur = self._require_current()
        entries = last_entry_id + 1
        if entries < cur.entries_confirmed or (entries == cur.entries_confirmed and length != cur.bytes_confirmed):
            raise InvariantViolation(
                f"{self.name}: ledger {cur.ledger_id} closed at {last_entry_id}/{length} bytes but "
                f"{cur.entries_confirmed} entries/{cur.bytes_confirmed} bytes were confirmed")
        exact = entries == cur.entries_confirmed
        info = self._md.info(cur.ledger_id)
        return replace(info, state=LedgerInfoState.CLOSED, entries=entries, size_bytes=length,
                       min_publish_time_ms=cur.min_publish_time_ms if exact else None,
                       max_publish_time_ms=cur.max_publish_time_ms if exact else None)

    def rollover_metadata(self, closed: LedgerInfo, new_ledger_id: int, now_ms: int) -> ManagedLedgerMetadata:
        """Pure: the list with the current ledger CLOSED (``closed_info``) and the next appended."""
        check(self._state is ManagedLedgerState.ROLLING_OVER, f"{self.name}: rollover_metadata in {self._state.value}")
        check(self.in_flight_count == 0, f"{self.name}: rollover with {self.in_flight_count} adds in flight")
        md = self._closed_metadata(closed)
        return with_ledger_appended(md, new_ledger_id, now_ms)

    def _closed_metadata(self, closed: LedgerInfo) -> ManagedLedgerMetadata:
        cur = self._require_current()
        check(closed.ledger_id == cur.ledger_id, f"{self.name}: closing {closed.ledger_id}, current {cur.ledger_id}")
        return with_ledger_closed(self._md, cur.ledger_id, entries=closed.entries, size_bytes=closed.size_bytes,
                                  min_publish_time_ms=closed.min_publish_time_ms,
                                  max_publish_time_ms=closed.max_publish_time_ms)

    def on_rolled_over(self, md: ManagedLedgerMetadata, now_ms: int) -> list[Action]:
        """The list ``md`` (from rollover_metadata) is stored: READY on the new ledger; the queued
        adds go to it."""
        check(self._state is ManagedLedgerState.ROLLING_OVER, f"{self.name}: on_rolled_over in {self._state.value}")
        last = md.ledgers[-1]
        self._md = md
        self._current = _CurrentLedger(last.ledger_id, last.created_ms)
        self._to(ManagedLedgerState.READY)
        return self._push_queued(now_ms)

    # -- close -------------------------------------------------------------------------------
    def start_close(self) -> None:
        """READY -> CLOSING: adds are refused from now on; the shell drains and closes."""
        self._to(ManagedLedgerState.CLOSING)

    def close_metadata(self, closed: LedgerInfo) -> ManagedLedgerMetadata:
        check(self._state is ManagedLedgerState.CLOSING, f"{self.name}: close_metadata in {self._state.value}")
        check(self.pending_count == 0, f"{self.name}: closing with {self.pending_count} adds pending")
        return self._closed_metadata(closed)

    def on_closed(self, md: ManagedLedgerMetadata | None) -> list[Action]:
        """Closed; ``md`` is the list written (None when closing from FAILED without a write)."""
        self._to(ManagedLedgerState.CLOSED)
        if md is not None:
            self._md = md
        self._current = None
        return self._fail_all(ManagedLedgerClosedError(f"{self.name}: managed ledger closed"))

    def on_deleted(self) -> None:
        self._to(ManagedLedgerState.DELETED)

    # -- offload -----------------------------------------------------------------------------
    def offload_metadata(self, ledger_id: int, offload: OffloadRecord) -> ManagedLedgerMetadata:
        """Pure: the stored list with ``ledger_id``'s offload info replaced (the shell CASes it,
        then calls on_offload_written)."""
        check(self._state in (ManagedLedgerState.READY, ManagedLedgerState.ROLLING_OVER),
              f"{self.name}: offload update in {self._state.value}")
        return with_offload(self._md, ledger_id, offload)

    def on_offload_written(self, md: ManagedLedgerMetadata) -> None:
        """The list ``md`` (from offload_metadata) is stored: only offload infos may differ."""
        check([replace(i, offload=OffloadRecord()) for i in md.ledgers]
              == [replace(i, offload=OffloadRecord()) for i in self._md.ledgers],
              f"{self.name}: an offload update changed more than offload infos")
        self._md = md

    # -- trim (retention) --------------------------------------------------------------------
    def trim_metadata(self, ledger_ids: Sequence[int], properties: Mapping[str, str]) -> ManagedLedgerMetadata:
        """Pure: the stored list without ``ledger_ids`` (which must be CLOSED ledgers at the
        front of the list, never the current one) and with ``properties`` (the shell CASes it,
        then calls on_trim_written)."""
        check(self._state in (ManagedLedgerState.READY, ManagedLedgerState.ROLLING_OVER),
              f"{self.name}: trim in {self._state.value}")
        ids = list(ledger_ids)
        front = self._md.ledgers[:len(ids)]
        check([i.ledger_id for i in front] == ids, f"{self.name}: trim of {ids}: not the front of {self._md.ledger_ids}")
        check(all(i.state is LedgerInfoState.CLOSED for i in front), f"{self.name}: trim of a ledger not CLOSED: {ids}")
        check(self._current is None or self._current.ledger_id not in ids,
              f"{self.name}: trim of the current ledger {ids}")
        check(len(ids) < len(self._md.ledgers) or not ids, f"{self.name}: trim of every ledger {ids}")
        return replace(without_ledgers(self._md, ids), properties=dict(properties))

    def on_trim_written(self, md: ManagedLedgerMetadata) -> None:
        """The list ``md`` (from trim_metadata) is stored: it is a suffix of ours."""
        n = len(md.ledgers)
        check(n <= len(self._md.ledgers) and md.ledgers == self._md.ledgers[len(self._md.ledgers) - n:],
              f"{self.name}: a trim changed more than the front of the list")
        self._md = md

    # -- failures ----------------------------------------------------------------------------
    def on_fenced(self, error: ManagedLedgerFencedError) -> list[Action]:
        """Another owner took the managed ledger: every pending add and every later one fails."""
        if self._state in (ManagedLedgerState.FENCED, ManagedLedgerState.CLOSED, ManagedLedgerState.DELETED):
            return []
        self._to(ManagedLedgerState.FENCED)
        self._error = error
        return self._fail_all(error)

    def on_failed(self, error: PulsarliteError) -> list[Action]:
        """A rollover (or close) could not finish: FAILED; adds fail, retriable."""
        if self._state in (ManagedLedgerState.FENCED, ManagedLedgerState.FAILED,
                           ManagedLedgerState.CLOSED, ManagedLedgerState.DELETED):
            return []
        self._to(ManagedLedgerState.FAILED)
        self._error = ManagedLedgerError(f"{self.name}: managed ledger failed, reopen it: {error}")
        return self._fail_all(self._error)


__all__ = [
    "Action", "CompleteAdds", "FailAdd", "LedgerInfo", "LedgerInfoState", "ManagedLedgerClosedError",
    "ManagedLedgerCore", "ManagedLedgerError", "ManagedLedgerFencedError", "ManagedLedgerMetadata",
    "ManagedLedgerState", "OffloadRecord", "OffloadState", "Position", "RolloverPolicy", "RolloverReason",
    "STATE_TRANSITIONS", "StartRollover", "WriteEntries", "iter_positions", "ledger_ranges",
    "next_position",
    "with_ledger_appended", "with_ledger_closed", "with_offload", "without_ledgers",
]
