"""Key_Shared consumer selection (pure): which consumer owns which sticky-key hash.

Hashes live in ``0 .. RANGE_SIZE - 1`` (Pulsar's ``DEFAULT_RANGE_SIZE`` 2^16): the hash of a
message is Murmur3-32 (seed 0) of its sticky key -- the ordering key if set, else the partition
key, else the bytes ``NONE_KEY`` -- masked to 31 bits, modulo ``RANGE_SIZE`` (as Pulsar's
``Murmur3_32Hash`` and the selectors compute it).

- :class:`AutoSplitSelector` (KeySharedMode.AUTO_SPLIT): the first consumer owns the whole
  space; each new one takes the lower half of the biggest range (Pulsar's
  HashRangeAutoSplitStickyKeyConsumerSelector); a leaving consumer's range goes to the owner of
  the range just above it (or just below, for the top range).
- :class:`StickySelector` (KeySharedMode.STICKY): every consumer brings its own ranges
  (KeySharedMeta.hashRanges, inclusive); overlaps are refused with
  :class:`ConsumerAssignError`; a hash nobody covers is not delivered (held) until someone does.
"""

from __future__ import annotations

import bisect
from typing import Hashable, Iterable

from pulsarlite.hashing import murmur3_32  # noqa: F401 - re-exported
from broker.errors import ConsumerAssignError
from pulsarlite.errors import check

RANGE_SIZE = 1 << 16
NONE_KEY = b"NONE_KEY"




def sticky_key_hash(key: bytes | str | None) -> int:
    """The hash slot (0 .. RANGE_SIZE - 1) of a sticky key (None: ``NONE_KEY``)."""
    if key is None or key == b"" or key == "":
        key = NONE_KEY
    if isinstance(key, str):
        key = key.encode()
    return (murmur3_32(key) & 0x7FFFFFFF) % RANGE_SIZE


class AutoSplitSelector:
    def __init__(self) -> None:
        self._ends: list[int] = []            # sorted inclusive range ends
        self._owners: list[Hashable] = []     # owner of the range ending at _ends[i]

    def add(self, key: Hashable, ranges=None) -> None:
        check(key not in self._owners, f"consumer {key!r} added twice")
        if not self._ends:
            self._ends, self._owners = [RANGE_SIZE - 1], [key]
            return
        # the biggest range (lowest first on ties) is split: the new consumer takes its lower half
        best, best_size = 0, -1
        for i, end in enumerate(self._ends):
            start = self._ends[i - 1] + 1 if i else 0
            if end - start + 1 > best_size:
                best, best_size = i, end - start + 1
        if best_size < 2:
            raise ConsumerAssignError("no hash range left to split for a new Key_Shared consumer")
        start = self._ends[best - 1] + 1 if best else 0
        middle = start + best_size // 2 - 1
        self._ends.insert(best, middle)
        self._owners.insert(best, key)

    def remove(self, key: Hashable) -> None:
        if key not in self._owners:
            return
        i = self._owners.index(key)
        del self._ends[i]          # the range merges into the one above (its end stays)
        del self._owners[i]
        if i == len(self._ends) and self._ends:   # it was the top range: the one below grows
            self._ends[-1] = RANGE_SIZE - 1

    def select(self, slot: int) -> Hashable | None:
        if not self._ends:
            return None
        return self._owners[bisect.bisect_left(self._ends, slot)]

    def ranges(self) -> dict[Hashable, list[tuple[int, int]]]:
        out: dict[Hashable, list[tuple[int, int]]] = {}
        for i, (end, owner) in enumerate(zip(self._ends, self._owners)):
            out.setdefault(owner, []).append((self._ends[i - 1] + 1 if i else 0, end))
        return out


class StickySelector:
    def __init__(self) -> None:
        self._ranges: list[tuple[int, int, Hashable]] = []   # sorted, disjoint (start, end, owner)

    def add(self, key: Hashable, ranges: Iterable[tuple[int, int]] | None) -> None:
        wanted = sorted(ranges or ())
        if not wanted:
            raise ConsumerAssignError("a STICKY Key_Shared consumer must give hash ranges")
        for start, end in wanted:
            if not (0 <= start <= end < RANGE_SIZE):
                raise ConsumerAssignError(f"hash range [{start}, {end}] outside 0..{RANGE_SIZE - 1}")
        for (a1, b1), (a2, b2) in zip(wanted, wanted[1:]):
            if a2 <= b1:
                raise ConsumerAssignError(f"hash ranges [{a1}, {b1}] and [{a2}, {b2}] overlap")
        for start, end in wanted:
            for a, b, owner in self._ranges:
                if start <= b and a <= end:
                    raise ConsumerAssignError(
                        f"hash range [{start}, {end}] overlaps [{a}, {b}] of another consumer")
        self._ranges = sorted(self._ranges + [(a, b, key) for a, b in wanted], key=lambda r: r[0])

    def remove(self, key: Hashable) -> None:
        self._ranges = [r for r in self._ranges if r[2] != key]

    def select(self, slot: int) -> Hashable | None:
        i = bisect.bisect_right(self._ranges, slot, key=lambda r: r[0])
        if i and self._ranges[i - 1][1] >= slot:
            return self._ranges[i - 1][2]
        return None

    def ranges(self) -> dict[Hashable, list[tuple[int, int]]]:
        out: dict[Hashable, list[tuple[int, int]]] = {}
        for a, b, owner in self._ranges:
            out.setdefault(owner, []).append((a, b))
        return out


__all__ = ["AutoSplitSelector", "ConsumerAssignError", "NONE_KEY", "RANGE_SIZE", "StickySelector",
           "murmur3_32", "sticky_key_hash"]
