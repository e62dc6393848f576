"""The pure core of a cursor (a subscription's position in a managed ledger): which entries are
consumed (acknowledged). I/O-free and clock-free (docs/architecture.md#style); the shell (shell.py) persists
it in ZooKeeper at ``/managed-ledgers/<ml name>/<cursor name>``.

State (:class:`CursorState`):

- ``mark_delete``: every position <= it is consumed. A new cursor at "earliest" starts at
  ``Position(first_ledger_id, -1)``, at "latest" at the last confirmed position. ``Position(L, -1)``
  means "everything before ledger L" (a valid mark-delete position for any L);
- ``individually_acked``: positions > mark_delete that are acked, as sorted disjoint ranges per
  ledger ``(ledger_id, first_entry, last_entry)``; adjacent ranges merge on insert, and when the
  first range starts right after mark_delete, mark_delete moves to its end. Across a ledger
  boundary this needs the ledger list: the core is given ``ledgers`` (a sequence, or a callable
  returning one, of ``LedgerInfo`` or ``(ledger_id, entries)``), so it knows that the last entry of
  ledger L1 is followed by entry 0 of the next non-empty ledger. The last ledger of the list is
  the open one: its successor is always the next entry of the same ledger;
- ``batch_acks``: per position, the batch indexes NOT yet acked of a batched entry that is only
  partly acked (batch-index ack), as a bitset, like Pulsar's cursor: every ack ANDs into it
  (a wire ``ack_set``, or the indexes of an index ack), so it needs no batch size; when no bit is
  left, the entry is acked as a whole.

On the wire (docs/protocol.md#ack-sets) a batch's ack state is an ``ack_set``: 64-bit words
(protobuf int64, Java ``BitSet.toLongArray``: bit i is bit ``i % 64`` of word ``i // 64``; trailing
zero words are dropped) where a SET bit means "not yet acked". :func:`ack_set_to_indexes` and
:func:`indexes_to_ack_set` convert.

Persistence bound (``CursorConfig.acked_ranges_max``, ``batch_acks_max``, ``state_bytes_max``):
:meth:`to_json` / :meth:`to_bytes` keep only the ranges (and partial batches) nearest to
mark_delete. An acked position left out is
simply unacked after a reload: it is delivered again (at-least-once). Nothing unacked is ever
stored as acked, so nothing is lost. In memory the ranges are bounded by the dispatcher's bound
on unacked messages (every range ends at an unacked position), not here.

Input from outside (client acks) is checked: a bad position or batch index raises
:class:`InvalidAckError` (a ``ValueError``) and changes nothing. A position in a ledger newer
than the last one of the list is accepted (the list may be stale; pass a callable to keep it
current); it joins mark_delete once the list shows that ledger. Broken invariants (mark_delete
going backwards other than by :meth:`reset`, overlapping ranges) raise ``InvariantViolation``.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, Union

from broker.managed_ledger.core import Position
from pulsarlite.errors import ConfigError, InvariantViolation, check

_ENTRY_MAX = 1 << 64          # above every entry id: bisects (first, last) ranges by first entry

FORMAT_VERSION = 1
_WORD_BITS = 64
_WORD_MASK = (1 << 64) - 1


class InvalidAckError(ValueError):
    """An ack (or seek) with a position or batch index that cannot exist; nothing changed."""


@dataclass(frozen=True)
class CursorConfig:
    # ranges of individually acked positions written to ZooKeeper at most (Pulsar's
    # managedLedgerMaxUnackedRangesToPersist); more are kept in memory but not persisted
    acked_ranges_max: int = 10_000
    # partly acked batches (batch-index acks) written at most
    batch_acks_max: int = 1_000
    # messages in one batch at most (the ack_set of a batch has ceil(n / 64) words)
    batch_size_max: int = 65_536
    # bytes of the persisted JSON at most (ZooKeeper's jute.maxbuffer is ~1 MiB): fewer ranges and
    # batches are kept until it fits
    state_bytes_max: int = 768 * 1024
    # debounce of durable writes: an ack is written at most this long after it (plus the write)
    persist_delay_ms: int = 100
    # attempts of one write when ZooKeeper is unreachable (connection loss), and backoff cap
    persist_attempts_max: int = 10
    retry_backoff_ms_max: int = 2_000

    def validate(self) -> "CursorConfig":
        for name in ("acked_ranges_max", "batch_acks_max", "batch_size_max", "state_bytes_max",
                     "persist_attempts_max",
                     "retry_backoff_ms_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"CursorConfig.{name} must be an int > 0, got {value!r}")
        if not isinstance(self.persist_delay_ms, int) or isinstance(self.persist_delay_ms, bool) \
                or self.persist_delay_ms < 0:
            raise ConfigError(f"CursorConfig.persist_delay_ms must be an int >= 0, got {self.persist_delay_ms!r}")
        return self


# -- ack sets (wire convention: a set bit = NOT yet acked) -----------------------------------------
def _check_batch_size(batch_size: int, batch_size_max: int | None = None) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise InvalidAckError(f"batch size must be an int > 0, got {batch_size!r}")
    if batch_size_max is not None and batch_size > batch_size_max:
        raise InvalidAckError(f"batch size {batch_size} > batch_size_max {batch_size_max}")


def words_to_bits(words: Sequence[int]) -> int:
    """An ack_set as one int (bit i = index i); words may be signed (int64) or unsigned."""
    bits = 0
    for w, word in enumerate(words):
        bits |= (int(word) & _WORD_MASK) << (_WORD_BITS * w)
    return bits


def bits_to_words(bits: int) -> list[int]:
    """One int as ack_set words: signed int64, trailing zero words dropped (Java BitSet)."""
    check(bits >= 0, "negative bitset")
    words = []
    while bits:
        w = bits & _WORD_MASK
        words.append(w - (1 << 64) if w >= 1 << 63 else w)
        bits >>= _WORD_BITS
    return words


def _all_bits(batch_size: int) -> int:
    return (1 << batch_size) - 1


def ack_set_to_indexes(words: Sequence[int], batch_size: int) -> set[int]:
    """The ACKED batch indexes of an ``ack_set`` (indexes < batch_size whose bit is clear; words
    missing at the end count as zeros, i.e. acked, as with Java's BitSet). Words may be signed
    (protobuf int64) or unsigned."""
    _check_batch_size(batch_size)
    bits = words_to_bits(words)
    return {i for i in range(batch_size) if not (bits >> i) & 1}


def indexes_to_ack_set(acked: Iterable[int], batch_size: int) -> list[int]:
    """The ``ack_set`` words (signed int64, trailing zero words dropped) of a batch whose
    ``acked`` indexes are acked: every other index < batch_size has its bit SET."""
    _check_batch_size(batch_size)
    bits = _all_bits(batch_size)
    for i in acked:
        if 0 <= i < batch_size:
            bits &= ~(1 << i)
    return bits_to_words(bits)


# -- the ledger list -------------------------------------------------------------------------------
LedgerLike = Any   # a LedgerInfo (.ledger_id, .entries) or a (ledger_id, entries) tuple
LedgersArg = Union[Sequence[LedgerLike], Callable[[], Sequence[LedgerLike]], None]


def _ledger_pairs(ledgers: Sequence[LedgerLike]) -> list[tuple[int, int]]:
    out = []
    for item in ledgers:
        if isinstance(item, tuple):
            out.append((int(item[0]), int(item[1])))
        else:
            out.append((item.ledger_id, item.entries))
    return out


def _successor(pairs: list[tuple[int, int]] | None, position: Position) -> Position:
    """The position after ``position`` in the list: the next entry of its ledger, else entry 0
    of the next non-empty ledger. The last ledger (open) and unknown ones continue in place; a
    position in a ledger no longer in the list (trimmed) continues at the next one that is."""
    if not pairs:
        return Position(position.ledger_id, position.entry_id + 1)
    for index, (ledger_id, entries) in enumerate(pairs):
        if ledger_id < position.ledger_id:
            continue
        if ledger_id == position.ledger_id:
            if index == len(pairs) - 1 or position.entry_id + 1 < entries:
                return Position(ledger_id, position.entry_id + 1)
            continue
        if entries > 0:   # a later ledger
            return Position(ledger_id, 0)
        if index == len(pairs) - 1:
            return Position(ledger_id, 0)
    return Position(position.ledger_id, position.entry_id + 1)


# -- the state -------------------------------------------------------------------------------------
class CursorState:
    """See the module docstring. ``ledgers``: the managed ledger's list (a sequence, or a callable
    returning the current one; it is read only when needed: to cross a ledger boundary or to
    check an ack); None: positions advance only within a ledger."""

    def __init__(self, mark_delete: Position, *, ledgers: LedgersArg = None,
                 config: CursorConfig | None = None) -> None:
        check(mark_delete.entry_id >= -1, f"mark_delete {mark_delete}: entry id < -1")
        self.config = (config or CursorConfig()).validate()
        self._mark_delete = mark_delete
        self._ledgers_arg: LedgersArg = ledgers
        # ledger id -> sorted disjoint non-adjacent [first, last] ranges (all > mark_delete)
        self._ranges: dict[int, list[tuple[int, int]]] = {}
        self._range_ledgers: list[int] = []      # sorted keys of _ranges
        # position -> bitset of the batch indexes NOT acked (never 0), positions > mark_delete
        # and not in a range
        self._batches: dict[Position, int] = {}
        self._checked_pairs: list[tuple[int, int]] | None = None   # the list _check_position saw last
        # of that list: ledger id -> entries it may hold (the last, open ledger: any)
        self._checked_limits: dict[int, int] = {}

    # -- the ledger list --------------------------------------------------------------------
    def set_ledgers(self, ledgers: LedgersArg) -> None:
        """Give a new ledger list (or callable); mark_delete advances if it now can."""
        self._ledgers_arg = ledgers
        self._checked_pairs = None
        self._checked_limits = {}
        self._advance()

    def _pairs(self) -> list[tuple[int, int]] | None:
        arg = self._ledgers_arg
        if arg is None:
            return None
        return _ledger_pairs(arg() if callable(arg) else arg)

    # -- queries ----------------------------------------------------------------------------
    @property
    def mark_delete(self) -> Position:
        return self._mark_delete

    @property
    def read_position(self) -> Position:
        """The first position that may not be consumed (after mark_delete)."""
        return _successor(self._pairs(), self._mark_delete)

    @property
    def individually_acked(self) -> list[tuple[int, int, int]]:
        """The acked ranges above mark_delete, sorted: [(ledger_id, first_entry, last_entry)]."""
        return [(lid, a, b) for lid in self._range_ledgers for a, b in self._ranges[lid]]

    @property
    def range_count(self) -> int:
        return sum(len(r) for r in self._ranges.values())

    @property
    def batch_acks(self) -> dict[Position, list[int]]:
        """Partly acked batches: position -> ack_set words (a set bit = not acked)."""
        return {p: bits_to_words(b) for p, b in sorted(self._batches.items())}

    def is_acked(self, position: Position) -> bool:
        """True if the entry is consumed as a whole (a partly acked batch is not)."""
        if position <= self._mark_delete:
            return True
        return self._in_ranges(position)

    def _in_ranges(self, position: Position) -> bool:
        ranges = self._ranges.get(position.ledger_id)
        if not ranges:
            return False
        e = position.entry_id
        i = bisect.bisect_right(ranges, (e, _ENTRY_MAX))     # the first range starting after e
        return i > 0 and ranges[i - 1][1] >= e

    def acked_in_run(self, ledger_id: int, first_entry_id: int, last_entry_id: int) -> set[int]:
        """The entry ids of ``ledger_id`` in ``first_entry_id .. last_entry_id`` acked as a whole
        (:meth:`is_acked` of each, for a run of entries read together: one bisect per run)."""
        if last_entry_id < first_entry_id:
            return set()
        md = self._mark_delete
        if ledger_id < md.ledger_id:
            return set(range(first_entry_id, last_entry_id + 1))
        acked: set[int] = set()
        if ledger_id == md.ledger_id and first_entry_id <= md.entry_id:
            acked.update(range(first_entry_id, min(md.entry_id, last_entry_id) + 1))
        ranges = self._ranges.get(ledger_id)
        if ranges:
            i = bisect.bisect_right(ranges, (first_entry_id, _ENTRY_MAX))
            if i > 0:
                i -= 1                   # the range starting at or before first may cover it
            while i < len(ranges) and ranges[i][0] <= last_entry_id:
                a, b = ranges[i]
                if b >= first_entry_id:
                    acked.update(range(max(a, first_entry_id), min(b, last_entry_id) + 1))
                i += 1
        return acked

    def unacked_in(self, positions: Iterable[Position]) -> list[Position]:
        """The positions (in the order given) that are not acked as a whole."""
        return [p for p in positions if not self.is_acked(p)]

    def remaining_batch_indexes(self, position: Position, batch_size: int) -> set[int] | None:
        """The batch indexes still to deliver: None if no index of this entry is acked yet
        (deliver the whole batch, no ack_set), an empty set if the entry is acked, else the
        unacked indexes (< batch_size)."""
        if self.is_acked(position):
            return set()
        bits = self._batches.get(position)
        if bits is None:
            return None
        return {i for i in range(batch_size) if (bits >> i) & 1}

    def remaining_ack_set(self, position: Position, batch_size: int) -> list[int] | None:
        """:meth:`remaining_batch_indexes` as wire ack_set words for MESSAGE (None: send no
        ack_set; [] if the entry is acked)."""
        if self.is_acked(position):
            return []
        bits = self._batches.get(position)
        if bits is None:
            return None
        return bits_to_words(bits & _all_bits(batch_size))

    def backlog(self, last_confirmed: Position, ledgers: Sequence[LedgerLike] | None = None) -> int:
        """Entries after mark_delete up to ``last_confirmed`` that are not acked (partly acked
        batches count as not acked). ``ledgers`` defaults to the cursor's list; entries of the
        ledger of ``last_confirmed`` are counted up to it, whatever the list says."""
        pairs = _ledger_pairs(ledgers) if ledgers is not None else (self._pairs() or [])
        md = self._mark_delete
        counts: dict[int, int] = {}
        for ledger_id, entries in pairs:
            if ledger_id < last_confirmed.ledger_id:
                counts[ledger_id] = entries
        counts[last_confirmed.ledger_id] = last_confirmed.entry_id + 1
        total = 0
        for ledger_id, entries in counts.items():
            if ledger_id < md.ledger_id:
                continue
            first = md.entry_id + 1 if ledger_id == md.ledger_id else 0
            if entries <= first:
                continue
            acked = 0
            for a, b in self._ranges.get(ledger_id, ()):
                lo, hi = max(a, first), min(b, entries - 1)
                if hi >= lo:
                    acked += hi - lo + 1
            total += entries - first - acked
        return total

    # -- acks -------------------------------------------------------------------------------
    def ack_individual(self, position: Position, *, batch_index: int | None = None,
                       batch_size: int | None = None) -> bool:
        """Ack one entry, or (with ``batch_index`` and ``batch_size``) one message of a batched
        entry. Returns True if the state changed. Acks at or below mark_delete are no-ops."""
        if batch_index is not None or batch_size is not None:
            if batch_index is None or batch_size is None:
                raise InvalidAckError("a batch-index ack needs both batch_index and batch_size")
            _check_batch_size(batch_size, self.config.batch_size_max)
            if not isinstance(batch_index, int) or not 0 <= batch_index < batch_size:
                raise InvalidAckError(f"batch index {batch_index!r} outside 0..{batch_size - 1}")
            return self.ack_batch_indexes(position, {batch_index}, batch_size)
        self._check_position(position)
        if self.is_acked(position):
            return False
        self._batches.pop(position, None)
        self._insert(position)
        self._advance()
        return True

    def ack_entries(self, positions: Iterable[Position]) -> tuple[list[Position],
                                                                  list[tuple[Position, InvalidAckError]]]:
        """Individual acks of whole entries as one run (the ids of one ACK frame): the same as
        :meth:`ack_individual` on each in turn, in one pass: each position is checked (a bad one
        is refused and changes nothing; the others are still acked), the new ones join the
        ranges, and mark_delete advances once at the end. Returns (the positions newly acked, in
        the order given; the refused ones with their error). As mark_delete moves only at the
        end, a bad id below where an earlier id of the run moves it is refused here (one at a time
        it would be found below mark_delete: a no-op); either way it changes nothing."""
        acked: list[Position] = []
        refused: list[tuple[Position, InvalidAckError]] = []
        batches = self._batches
        check_position, ranges_of, bisect_right = self._check_position, self._ranges, bisect.bisect_right
        mark_delete = self._mark_delete
        for position in positions:
            try:
                check_position(position)
            except InvalidAckError as e:
                refused.append((position, e))
                continue
            if position <= mark_delete:
                continue                 # acked (is_acked), as below: one bisect for both
            ledger_id, e = position
            ranges = ranges_of.get(ledger_id)
            if ranges is None:
                ranges = []
            i = bisect_right(ranges, (e, _ENTRY_MAX))     # the first range starting after e
            if i and ranges[i - 1][1] >= e:
                continue                 # in a range: acked
            if batches:
                batches.pop(position, None)
            self._insert_at(ledger_id, e, ranges, i)
            acked.append(position)
        if acked:
            self._advance()
        return acked, refused

    def ack_batch_indexes(self, position: Position, indexes: Iterable[int], batch_size: int) -> bool:
        """Ack these batch indexes of a batched entry; the entry is acked once all are."""
        _check_batch_size(batch_size, self.config.batch_size_max)
        indexes = set(indexes)
        if any(not isinstance(i, int) or not 0 <= i < batch_size for i in indexes):
            raise InvalidAckError(f"batch indexes outside 0..{batch_size - 1}: {sorted(indexes)[:8]}")
        self._check_position(position)
        if not indexes:
            return False
        unacked = _all_bits(batch_size)
        for i in indexes:
            unacked &= ~(1 << i)
        return self._ack_bits(position, unacked)

    def ack_set(self, position: Position, words: Sequence[int], batch_size: int | None = None) -> bool:
        """Ack a batched entry from a wire ack_set: every index whose bit is clear is acked (the
        entry is acked once no bit is left). ``batch_size`` (optional) masks bits beyond it."""
        unacked = self._unacked_of(words, batch_size)
        self._check_position(position)
        return self._ack_bits(position, unacked)

    def _unacked_of(self, words: Sequence[int], batch_size: int | None) -> int:
        """The unacked bits of a wire ack_set (checked: InvalidAckError, nothing changed)."""
        if batch_size is not None:
            _check_batch_size(batch_size, self.config.batch_size_max)
        words_max = (self.config.batch_size_max + _WORD_BITS - 1) // _WORD_BITS
        if len(words) > words_max:
            raise InvalidAckError(f"ack_set of {len(words)} words > {words_max} (batch_size_max)")
        try:
            unacked = words_to_bits(words)
        except (TypeError, ValueError):
            raise InvalidAckError(f"malformed ack_set {list(words)[:4]!r}") from None
        if batch_size is not None:
            unacked &= _all_bits(batch_size)
        return unacked

    def _ack_bits(self, position: Position, unacked: int) -> bool:
        """AND a batch's unacked bits into its state; a full ack when none is left."""
        if self.is_acked(position):
            return False
        current = self._batches.get(position)
        bits = unacked if current is None else current & unacked
        if bits == current:
            return False
        if bits == 0:
            self._batches.pop(position, None)
            self._insert(position)
            self._advance()
        else:
            self._batches[position] = bits
        return True

    def ack_cumulative(self, position: Position, *, batch_index: int | None = None,
                       batch_size: int | None = None, ack_set: Sequence[int] | None = None) -> bool:
        """Ack every entry <= ``position``; with ``batch_index``: every entry < position and the
        batch indexes 0..batch_index of ``position``; with ``ack_set`` (a wire ack_set, a set bit
        = not acked; ``batch_size`` optional): every entry < position and the indexes of
        ``position`` whose bit is clear (Pulsar's cumulative ack inside a batch with batch-index
        acks: the mark-delete stops before the batch, whose acked indexes are recorded; the
        entry is acked once no bit is left). Below mark_delete: a no-op. Returns True if the
        state changed."""
        if ack_set is not None:
            if batch_index is not None:
                raise InvalidAckError("a cumulative ack has a batch index or an ack_set, not both")
            unacked = self._unacked_of(ack_set, batch_size)
            self._check_position(position)
            changed = self._move_mark_delete(Position(position.ledger_id, position.entry_id - 1))
            return self._ack_bits(position, unacked) or changed
        self._check_position(position)
        if batch_index is not None or batch_size is not None:
            if batch_index is None or batch_size is None:
                raise InvalidAckError("a batch-index ack needs both batch_index and batch_size")
            _check_batch_size(batch_size, self.config.batch_size_max)
            if not isinstance(batch_index, int) or not 0 <= batch_index < batch_size:
                raise InvalidAckError(f"batch index {batch_index!r} outside 0..{batch_size - 1}")
            if batch_index < batch_size - 1:
                changed = self._move_mark_delete(Position(position.ledger_id, position.entry_id - 1))
                return self.ack_batch_indexes(position, range(batch_index + 1), batch_size) or changed
        return self._move_mark_delete(position)

    def reset(self, position: Position) -> None:
        """Seek: ``position`` is the next to deliver; mark_delete becomes the position just before
        it (``Position(L, e - 1)``, which may go backwards), acked ranges and batches are cleared."""
        if position.entry_id < 0:
            raise InvalidAckError(f"reset to {position}: entry id < 0")
        self._mark_delete = Position(position.ledger_id, position.entry_id - 1)
        self._ranges.clear()
        self._range_ledgers.clear()
        self._batches.clear()
        self._advance()

    # -- internals --------------------------------------------------------------------------
    def _check_position(self, position: Position) -> None:
        if not isinstance(position, Position) or position.entry_id < 0 or position.ledger_id < 0:
            raise InvalidAckError(f"invalid position {position!r}")
        if position <= self._mark_delete:
            return
        # the list seen last time serves while the position is in one of its ledgers: a closed
        # ledger's entry count never changes, and the last (open) ledger accepts any entry. Only
        # a ledger beyond it or missing from it asks for the list again (it costs the managed
        # ledger a copy of its list, per ack).
        ledger_id = position.ledger_id
        limit = self._checked_limits.get(ledger_id)
        if limit is None:
            pairs = self._checked_pairs = self._pairs()
            limits = self._checked_limits = dict(pairs or ())
            if not pairs:
                return
            limits[pairs[-1][0]] = _ENTRY_MAX     # the last (open) ledger accepts any entry
            if ledger_id > pairs[-1][0]:
                return   # a ledger newer than the list we were given (it may be stale): accepted
            limit = limits.get(ledger_id)
            if limit is None:
                raise InvalidAckError(f"{position}: ledger {ledger_id} is not in the list")
        if position.entry_id >= limit:
            raise InvalidAckError(f"{position}: ledger {ledger_id} has {limit} entries")

    def _move_mark_delete(self, position: Position) -> bool:
        if position <= self._mark_delete:
            return False
        self._set_mark_delete(position)
        self._drop_below_mark_delete()
        self._advance()
        return True

    def _set_mark_delete(self, position: Position) -> None:
        if position < self._mark_delete:
            raise InvariantViolation(f"mark_delete would go backwards: {self._mark_delete} -> {position}")
        self._mark_delete = position

    def _drop_below_mark_delete(self) -> None:
        md = self._mark_delete
        for ledger_id in list(self._range_ledgers):
            if ledger_id > md.ledger_id:
                break
            ranges = self._ranges[ledger_id]
            if ledger_id < md.ledger_id:
                kept = []
            else:
                kept = [(max(a, md.entry_id + 1), b) for a, b in ranges if b > md.entry_id]
            self._set_ranges(ledger_id, kept)
        for p in [p for p in self._batches if p <= md]:
            del self._batches[p]

    def _set_ranges(self, ledger_id: int, ranges: list[tuple[int, int]]) -> None:
        if ranges:
            if ledger_id not in self._ranges:
                bisect.insort(self._range_ledgers, ledger_id)
            self._ranges[ledger_id] = ranges
        elif ledger_id in self._ranges:
            del self._ranges[ledger_id]
            self._range_ledgers.remove(ledger_id)

    def _insert(self, position: Position) -> None:
        """Add a position (> mark_delete, not yet in a range) to the ranges, merging neighbours."""
        e = position.entry_id
        ranges = self._ranges.get(position.ledger_id)       # changed in place (no copy per ack)
        if ranges is None:
            ranges = []
        i = bisect.bisect_right(ranges, (e, _ENTRY_MAX))
        if not (i == 0 or ranges[i - 1][1] < e):
            check(False, f"{position} is already in a range")
        self._insert_at(position.ledger_id, e, ranges, i)

    def _insert_at(self, ledger_id: int, e: int, ranges: list[tuple[int, int]], i: int) -> None:
        """:meth:`_insert` of entry ``e`` of ``ledger_id``, whose ranges list (possibly new) and
        bisect index (the first range starting after ``e``; none covers it) are known."""
        left = i > 0 and ranges[i - 1][1] == e - 1
        right = i < len(ranges) and ranges[i][0] == e + 1
        if left and right:
            ranges[i - 1:i + 1] = [(ranges[i - 1][0], ranges[i][1])]
        elif left:
            ranges[i - 1] = (ranges[i - 1][0], e)
        elif right:
            ranges[i] = (e, ranges[i][1])
        else:
            ranges.insert(i, (e, e))
        if ledger_id not in self._ranges:        # _set_ranges (the list is not empty)
            bisect.insort(self._range_ledgers, ledger_id)
            self._ranges[ledger_id] = ranges

    def _advance(self) -> None:
        """Move mark_delete over the ranges that continue it (also across ledgers)."""
        pairs: list[tuple[int, int]] | None = None
        fetched = False
        while self._range_ledgers:
            ledger_id = self._range_ledgers[0]
            first, last = self._ranges[ledger_id][0]
            md = self._mark_delete
            if ledger_id == md.ledger_id and first > md.entry_id + 1:
                return       # a gap within mark_delete's ledger: no need to look at the list
            if not (ledger_id == md.ledger_id and first == md.entry_id + 1):
                if not fetched:
                    pairs, fetched = self._pairs(), True
                if _successor(pairs, md) != Position(ledger_id, first):
                    return
            self._set_mark_delete(Position(ledger_id, last))
            self._set_ranges(ledger_id, self._ranges[ledger_id][1:])
            for p in [p for p in self._batches if p <= self._mark_delete]:
                del self._batches[p]

    def check_invariants(self) -> None:
        """Raise InvariantViolation if the state is impossible."""
        md = self._mark_delete
        check(md.entry_id >= -1 and md.ledger_id >= 0, f"bad mark_delete {md}")
        check(self._range_ledgers == sorted(self._ranges), "range ledger index out of sync")
        for ledger_id in self._range_ledgers:
            ranges = self._ranges[ledger_id]
            check(bool(ranges), f"empty range list for ledger {ledger_id}")
            previous = None
            for a, b in ranges:
                check(0 <= a <= b, f"bad range {ledger_id}:{a}..{b}")
                check(Position(ledger_id, a) > md, f"range {ledger_id}:{a}..{b} not above mark_delete {md}")
                check(previous is None or a > previous + 1,
                      f"ranges of ledger {ledger_id} overlap, touch or are unsorted: {ranges}")
                previous = b
        for p, bits in self._batches.items():
            check(p > md and not self._in_ranges(p), f"batch state of {p} for an acked entry")
            check(0 < bits and bits.bit_length() <= self.config.batch_size_max + _WORD_BITS,
                  f"bad batch state of {p}: {bits:#x}")

    # -- persistence ------------------------------------------------------------------------
    def to_json(self, *, ranges_max: int | None = None, batches_max: int | None = None) -> dict[str, Any]:
        """The persisted form, bounded: the ``acked_ranges_max`` ranges and ``batch_acks_max``
        partly acked batches nearest to mark_delete (the rest is redelivered after a reload)::

            {"version": 1, "mark_delete": [ledger_id, entry_id],
             "acked_ranges": [[ledger_id, first_entry, last_entry], ...],
             "batch_acks": [[ledger_id, entry_id, [ack_set words]], ...]}

        ack_set words follow the wire convention (a set bit = not acked)."""
        ranges = []
        left = self.config.acked_ranges_max if ranges_max is None else min(ranges_max, self.config.acked_ranges_max)
        if batches_max is None:
            batches_max = self.config.batch_acks_max
        for ledger_id in self._range_ledgers:
            for a, b in self._ranges[ledger_id]:
                if left <= 0:
                    break
                ranges.append([ledger_id, a, b])
                left -= 1
        batches = [[p.ledger_id, p.entry_id, bits_to_words(bits)]
                   for p, bits in sorted(self._batches.items())[:min(batches_max, self.config.batch_acks_max)]]
        return {"version": FORMAT_VERSION,
                "mark_delete": [self._mark_delete.ledger_id, self._mark_delete.entry_id],
                "acked_ranges": ranges,
                "batch_acks": batches}

    def to_bytes(self) -> bytes:
        """The JSON of :meth:`to_json`, at most ``state_bytes_max`` bytes: if it is larger, the
        ranges and batches kept are halved (from the far end) until it fits."""
        ranges_max, batches_max = self.config.acked_ranges_max, self.config.batch_acks_max
        while True:
            data = json.dumps(self.to_json(ranges_max=ranges_max, batches_max=batches_max),
                              separators=(",", ":")).encode()
            if len(data) <= self.config.state_bytes_max or (ranges_max == 0 and batches_max == 0):
                return data
            ranges_max, batches_max = ranges_max // 2, batches_max // 2

    @classmethod
    def from_json(cls, raw: dict[str, Any], *, ledgers: LedgersArg = None,
                  config: CursorConfig | None = None) -> "CursorState":
        """ValueError if malformed or impossible (overlapping ranges, ranges below mark_delete)."""
        try:
            if raw.get("version") != FORMAT_VERSION:
                raise ValueError(f"unknown cursor format version {raw.get('version')!r}")
            lid, eid = raw["mark_delete"]
            state = cls(Position(int(lid), int(eid)), ledgers=ledgers, config=config)
            for ledger_id, a, b in raw.get("acked_ranges") or ():
                ledger_id, a, b = int(ledger_id), int(a), int(b)
                ranges = state._ranges.get(ledger_id, [])
                state._set_ranges(ledger_id, ranges + [(a, b)])
            for ledger_id, entry_id, words in raw.get("batch_acks") or ():
                state._batches[Position(int(ledger_id), int(entry_id))] = words_to_bits([int(w) for w in words])
            state.check_invariants()
        except (KeyError, TypeError, ValueError, AssertionError) as e:
            raise ValueError(f"malformed cursor state: {e}") from None
        state._advance()   # the ledger list may now show a range continuing mark_delete
        return state

    @classmethod
    def from_bytes(cls, data: bytes, *, ledgers: LedgersArg = None,
                   config: CursorConfig | None = None) -> "CursorState":
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"malformed cursor state: {e}") from None
        if not isinstance(raw, dict):
            raise ValueError("malformed cursor state: not a JSON object")
        return cls.from_json(raw, ledgers=ledgers, config=config)

    def __repr__(self) -> str:
        return (f"CursorState(mark_delete={self._mark_delete}, ranges={self.range_count}, "
                f"batches={len(self._batches)})")


__all__ = ["CursorConfig", "CursorState", "InvalidAckError", "ack_set_to_indexes", "bits_to_words",
           "indexes_to_ack_set", "words_to_bits"]
