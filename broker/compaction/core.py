"""The pure core of topic compaction (Pulsar's two-phase compactor). I/O-free and clock-free
(docs/architecture.md#style): the shell (shell.py) reads and writes, and feeds what it read in here.

Protocol (one run, :class:`CompactionRun`; phases in :class:`Phase`):

1. **Phase one** (READING_KEYS): the shell reads the topic from its first entry up to the end
   fixed when the run started (the *horizon*, the last entry covered). Each entry's messages go
   to :meth:`CompactionRun.on_entry`: per key, the latest message id wins; a message with an
   empty or null value (a tombstone) deletes its key; a message without a key is dropped from
   the compacted view (as Pulsar's compactor does). The key map is bounded (``keys_max``).
2. **Phase two** (WRITING): :meth:`CompactionRun.retained` says, per original entry in log order,
   which batch indexes survive (None: the whole non-batched entry). The shell re-reads those
   entries and writes each to a NEW ledger (the compacted ledger) as
   :func:`encode_compacted_entry` (original position + the survivors' ack set + the original
   entry bytes, verbatim): a compacted message keeps its original (ledger, entry, batch index)
   id, as Pulsar's compacted ledger stores the original ids (invariant 7).
3. **Recording** (RECORDING): one compare-and-set of the managed-ledger znode records the new
   :class:`CompactedView` (ledger + horizon) and, in the same write, puts the previous compacted
   ledger on the managed ledger's list of ledgers to delete. Only after that write is the
   previous compacted ledger deleted. A crash before the write leaves the old view (and an
   unreferenced new ledger, see docs/decisions.md); after it, the new view. Never a mix.

:class:`CompactionStatus` is Pulsar's LongRunningProcessStatus (NOT_RUN / RUNNING / SUCCESS /
ERROR with lastError) for ``GET .../compaction``; :func:`should_compact` is the namespace
``compactionThreshold`` check (bytes of backlog beyond the horizon).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable, Mapping, NamedTuple, Sequence

from broker.cursor.core import bits_to_words, words_to_bits
from broker.errors import BrokerError
from broker.managed_ledger.core import LedgerInfo, Position
from pulsarlite.errors import InvariantViolation, check
from pulsarlite.ledger_list import COMPACTION_PROPERTY, CompactionRecord, decode_compaction, encode_compaction
from pulsarlite.wire.compacted import decode_compacted, encode_compacted

COMPACTION_CURSOR = "__compaction"                # Pulsar's reserved subscription name
KEYS_MAX_DEFAULT = 1_000_000



# -- errors -----------------------------------------------------------------------------------
class CompactionError(BrokerError):
    """A compaction run failed (reading, writing or recording); retriable: run it again."""

    retriable = True


class CompactionRunningError(CompactionError):
    """A compaction of the topic is running already (the admin API answers 409)."""

    retriable = False


# -- the recorded view -------------------------------------------------------------------------
@dataclass(frozen=True)
class CompactedView:
    """What the managed-ledger property ``pulsarlite.compaction`` holds: the compacted ledger
    and the horizon (the last original position it covers)."""

    ledger_id: int
    horizon: Position
    entries: int = 0

    def __post_init__(self) -> None:
        check(self.ledger_id >= 0, f"compacted ledger id {self.ledger_id} < 0")
        check(self.entries >= 0, f"compacted entries {self.entries} < 0")

    def to_property(self) -> str:
        """The property value (the codec is pulsarlite.ledger_list's, shared with Spark)."""
        return encode_compaction(CompactionRecord(self.ledger_id, self.horizon.ledger_id, self.horizon.entry_id,
                                                  self.entries))

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> "CompactedView | None":
        """The recorded view (None: never compacted); ValueError if the property is malformed
        (pulsarlite.ledger_list.decode_compaction)."""
        record = decode_compaction(properties)
        if record is None:
            return None
        return cls(record.ledger_id, Position(record.horizon_ledger_id, record.horizon_entry_id), record.entries)


# -- compacted entries --------------------------------------------------------------------------
class CompactedEntry(NamedTuple):
    position: Position                 # the original entry's position
    ack_set: tuple[int, ...] | None    # survivors of a batch (signed words, set bit = delivered); None: all
    data: bytes                        # the original entry, verbatim


def encode_compacted_entry(position: Position, ack_set: Sequence[int] | None, data: bytes) -> bytes:
    """One compacted-ledger entry (the codec is pulsarlite.wire.compacted, shared with Spark)."""
    return encode_compacted(position.ledger_id, position.entry_id, ack_set, data)


def decode_compacted_entry(raw: bytes) -> CompactedEntry:
    """ValueError if ``raw`` is not a compacted entry."""
    got = decode_compacted(raw)
    return CompactedEntry(Position(got.ledger_id, got.entry_id), got.ack_set, got.data)


def ack_set_of(indexes: Iterable[int]) -> list[int]:
    """Java BitSet words (signed int64, as the wire's and the cursor's) with a bit set per
    retained batch index (the MESSAGE ack_set form)."""
    bits = 0
    for i in indexes:
        bits |= 1 << i
    return bits_to_words(bits)


def last_index_of(words: Sequence[int]) -> int:
    """The highest batch index set in ``words`` (-1: none)."""
    return words_to_bits(words).bit_length() - 1


# -- one run ----------------------------------------------------------------------------------
class Phase(enum.Enum):
    READING_KEYS = "READING_KEYS"
    WRITING = "WRITING"
    RECORDING = "RECORDING"
    DONE = "DONE"
    FAILED = "FAILED"


_TRANSITIONS = {
    Phase.READING_KEYS: {Phase.WRITING, Phase.FAILED},
    Phase.WRITING: {Phase.RECORDING, Phase.FAILED},
    Phase.RECORDING: {Phase.DONE, Phase.FAILED},
    Phase.DONE: set(),
    Phase.FAILED: set(),
}


class KeyedMessage(NamedTuple):
    """What phase one needs of one message: its batch index (-1: a non-batched entry), its key
    (None: no key) and whether it is a tombstone (empty or null value)."""

    batch_index: int
    key: str | None
    tombstone: bool


class CompactionRun:
    """One compaction of one topic, from phase one to the recorded view. ``horizon``: the last
    entry covered (fixed at the start; entries after it are not read)."""

    def __init__(self, horizon: Position, *, keys_max: int = KEYS_MAX_DEFAULT) -> None:
        if keys_max <= 0:
            raise ValueError(f"keys_max must be > 0, got {keys_max}")
        self.horizon = horizon
        self.keys_max = keys_max
        self.phase = Phase.READING_KEYS
        self._latest: dict[str, tuple[Position, int]] = {}    # key -> (position, batch index)
        self._last_read: Position | None = None
        self.messages_read = 0
        self.error: str = ""

    def _to(self, phase: Phase) -> None:
        if phase not in _TRANSITIONS[self.phase]:
            raise InvariantViolation(f"compaction: {self.phase.value} -> {phase.value}")
        self.phase = phase

    # phase one
    def on_entry(self, position: Position, messages: Sequence[KeyedMessage]) -> bool:
        """Feed one entry (in log order, each once). False once past the horizon (ignored: the
        shell stops reading). CompactionError if the key map would exceed ``keys_max``."""
        if self.phase is not Phase.READING_KEYS:
            raise InvariantViolation(f"compaction: entry {position} fed in {self.phase.value}")
        if position > self.horizon:
            return False
        if self._last_read is not None and position <= self._last_read:
            raise InvariantViolation(f"compaction: entry {position} after {self._last_read}")
        self._last_read = position
        for m in messages:
            self.messages_read += 1
            if m.key is None:
                continue                       # no key: not in the compacted view (Pulsar)
            if m.tombstone:
                self._latest.pop(m.key, None)
                continue
            if m.key not in self._latest and len(self._latest) >= self.keys_max:
                raise CompactionError(f"more than {self.keys_max} keys to compact")
            self._latest[m.key] = (position, m.batch_index)
        return True

    def keys_read(self) -> dict[str, tuple[Position, int]]:
        return dict(self._latest)

    def end_reading(self) -> list[tuple[Position, list[int] | None]]:
        """Phase one done: per original entry in log order, the surviving batch indexes (None:
        the whole non-batched entry). Moves to WRITING."""
        self._to(Phase.WRITING)
        return self.retained()

    def retained(self) -> list[tuple[Position, list[int] | None]]:
        by_entry: dict[Position, list[int] | None] = {}
        for position, index in self._latest.values():
            if index < 0:
                by_entry[position] = None
            else:
                got = by_entry.setdefault(position, [])
                check(got is not None, f"compaction: {position} both batched and not")
                got.append(index)
        return [(p, None if v is None else sorted(v)) for p, v in sorted(by_entry.items())]

    def written(self) -> None:
        """Phase two done (the compacted ledger is written and closed): RECORDING."""
        self._to(Phase.RECORDING)

    def recorded(self) -> None:
        self._to(Phase.DONE)

    def failed(self, error: str) -> None:
        if self.phase in (Phase.DONE, Phase.FAILED):
            return
        self.error = error
        self.phase = Phase.FAILED


def new_view_properties(properties: Mapping[str, str], view: CompactedView) -> dict[str, str]:
    """The list properties recording ``view`` (the RECORDING step's one write)."""
    out = dict(properties)
    out[COMPACTION_PROPERTY] = view.to_property()
    return out


# -- status (Pulsar's LongRunningProcessStatus) -------------------------------------------------
class CompactionStatus(enum.Enum):
    NOT_RUN = "NOT_RUN"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    ERROR = "ERROR"


@dataclass(frozen=True)
class StatusReport:
    status: CompactionStatus = CompactionStatus.NOT_RUN
    last_error: str = ""

    def to_json(self) -> dict[str, str]:
        return {"status": self.status.value, "lastError": self.last_error}


def combined_status(reports: Sequence[StatusReport]) -> StatusReport:
    """A partitioned topic's status from its partitions': RUNNING if any runs, else ERROR if any
    failed (first error), else SUCCESS if all succeeded, else NOT_RUN."""
    if any(r.status is CompactionStatus.RUNNING for r in reports):
        return StatusReport(CompactionStatus.RUNNING)
    errors = [r for r in reports if r.status is CompactionStatus.ERROR]
    if errors:
        return errors[0]
    if reports and all(r.status is CompactionStatus.SUCCESS for r in reports):
        return StatusReport(CompactionStatus.SUCCESS)
    return StatusReport(CompactionStatus.NOT_RUN)


# -- threshold ----------------------------------------------------------------------------------
def backlog_after_horizon_bytes(ledgers: Sequence[LedgerInfo], horizon: Position | None) -> int:
    """Estimated stored bytes after ``horizon`` (its ledger pro rata, later ledgers whole);
    everything when never compacted."""
    total = 0
    for info in ledgers:
        if horizon is None or info.ledger_id > horizon.ledger_id:
            total += info.size_bytes
        elif info.ledger_id == horizon.ledger_id and info.entries > 0:
            left = max(0, info.entries - horizon.entry_id - 1)
            total += info.size_bytes * left // info.entries
    return total


def should_compact(threshold_bytes: int | None, backlog_bytes: int, running: bool) -> bool:
    """Pulsar's compactionThreshold: compact when the backlog beyond the horizon exceeds it
    (None or 0: automatic compaction off)."""
    return bool(threshold_bytes) and threshold_bytes > 0 and not running and backlog_bytes > threshold_bytes


@dataclass
class StatusBoard:
    """Per topic: the last run's status (what GET .../compaction answers) and the running set."""

    reports: dict[str, StatusReport] = field(default_factory=dict)

    def start(self, topic: str) -> None:
        if self.reports.get(topic, StatusReport()).status is CompactionStatus.RUNNING:
            raise CompactionRunningError(f"Compaction already in progress for {topic}")
        self.reports[topic] = StatusReport(CompactionStatus.RUNNING)

    def finish(self, topic: str, error: str | None) -> None:
        self.reports[topic] = (StatusReport(CompactionStatus.SUCCESS) if error is None
                               else StatusReport(CompactionStatus.ERROR, error))

    def running(self, topic: str) -> bool:
        return self.reports.get(topic, StatusReport()).status is CompactionStatus.RUNNING

    def report(self, topic: str) -> StatusReport:
        return self.reports.get(topic, StatusReport())
