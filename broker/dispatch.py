"""The dispatcher core of one subscription (pure, no I/O; DESIGN.md §5).

It decides which consumer gets which entry. The shell (broker/topic.py) feeds it events --
consumers coming and going, FLOW permits, entries read from the log, acks, redelivery requests --
and executes the :class:`Delivery` s it returns (fetch the entry bytes, write MESSAGE).

- **Permits count messages**: an entry holding a batch of N messages costs N. An entry is given
  to a consumer only if it has that many permits -- except an entry bigger than any grant the
  consumer ever made (a batch larger than its receiver queue), which goes as soon as it has any
  permits, as in Pulsar, so nothing stalls forever.
- **Exclusive**: one consumer; a second one is refused (:class:`ConsumerBusyError`).
  **Failover**: many consumers, only the first (oldest) one receives; the next takes over when it
  leaves. **Shared**: round robin over consumers with enough permits.
- Entries are delivered lowest position first: entries to redeliver (their consumer left, or it
  asked for redelivery) go before newer ones.
- Every delivered entry stays *outstanding* with its consumer until acked; when that consumer
  leaves, its outstanding entries go back to the pending set for the others (redelivery).

Positions are opaque ordered keys (the broker uses managed-ledger Positions).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable

from sortedcontainers import SortedDict

from pulsarlite.errors import PulsarliteError, check


class SubType(enum.Enum):
    EXCLUSIVE = "Exclusive"
    SHARED = "Shared"
    FAILOVER = "Failover"


class ConsumerBusyError(PulsarliteError):
    """An Exclusive subscription already has a consumer."""


@dataclass(frozen=True, slots=True)
class Delivery:
    consumer: Hashable
    position: Any
    message_count: int
    redelivery_count: int


@dataclass
class _Consumer:
    key: Hashable
    permits: int = 0
    permits_granted_max: int = 0
    outstanding: SortedDict = field(default_factory=SortedDict)   # position -> message count


class DispatcherCore:
    def __init__(self, sub_type: SubType, *, pending_entries_max: int = 1000) -> None:
        if pending_entries_max <= 0:
            raise ValueError("pending_entries_max must be > 0")
        self.sub_type = sub_type
        self.pending_entries_max = pending_entries_max
        self._consumers: dict[Hashable, _Consumer] = {}      # insertion order = arrival order
        self._pending: SortedDict = SortedDict()              # position -> message count
        self._redelivery_counts: dict[Any, int] = {}          # position -> times redelivered
        self._owner: dict[Any, Hashable] = {}                 # outstanding position -> consumer key
        self._rr = 0                                          # round-robin cursor (Shared)

    # -- consumers ------------------------------------------------------------------------------
    @property
    def consumers(self) -> list[Hashable]:
        return list(self._consumers)

    def add_consumer(self, key: Hashable) -> None:
        check(key not in self._consumers, f"consumer {key!r} added twice")
        if self.sub_type is SubType.EXCLUSIVE and self._consumers:
            raise ConsumerBusyError("exclusive subscription already has a consumer")
        self._consumers[key] = _Consumer(key)

    def remove_consumer(self, key: Hashable) -> int:
        """Remove a consumer; its outstanding entries become pending again (to be redelivered
        to the others, or to the next consumer). Returns how many entries were put back."""
        consumer = self._consumers.pop(key, None)
        if consumer is None:
            return 0
        for position, count in consumer.outstanding.items():
            self._requeue(position, count)
        return len(consumer.outstanding)

    def flow(self, key: Hashable, permits: int) -> None:
        if permits < 0:
            raise ValueError(f"permits must be >= 0, got {permits}")
        consumer = self._consumers.get(key)
        if consumer is None:
            return
        consumer.permits += permits
        consumer.permits_granted_max = max(consumer.permits_granted_max, consumer.permits)

    def permits(self, key: Hashable) -> int:
        return self._consumers[key].permits

    def outstanding(self, key: Hashable) -> list[Any]:
        return list(self._consumers[key].outstanding)

    # -- entries --------------------------------------------------------------------------------
    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def pending_positions(self) -> list[Any]:
        return list(self._pending)

    def read_wanted(self) -> int:
        """How many new entries the shell should read now: none without any consumer with
        permits, else up to the room left in the pending set."""
        if not any(c.permits > 0 for c in self._receivers()):
            return 0
        return max(0, self.pending_entries_max - len(self._pending))

    def offer(self, entries: Iterable[tuple[Any, int]]) -> None:
        """New entries from the log, as (position, message count)."""
        for position, count in entries:
            if count < 1:
                count = 1
            if position in self._owner or position in self._pending:
                continue
            self._pending[position] = count

    def _requeue(self, position: Any, count: int) -> None:
        self._owner.pop(position, None)
        self._pending[position] = count
        self._redelivery_counts[position] = self._redelivery_counts.get(position, 0) + 1

    def _receivers(self) -> list[_Consumer]:
        if not self._consumers:
            return []
        if self.sub_type is SubType.SHARED:
            return list(self._consumers.values())
        return [next(iter(self._consumers.values()))]

    @staticmethod
    def _fits(consumer: _Consumer, count: int) -> bool:
        if consumer.permits <= 0:
            return False
        return count <= consumer.permits or count > consumer.permits_granted_max

    def dispatch(self) -> list[Delivery]:
        """Assign pending entries (lowest first) to consumers while permits allow."""
        receivers = self._receivers()
        out: list[Delivery] = []
        if not receivers or not self._pending:
            return out
        while self._pending:
            position, count = self._pending.peekitem(0)
            chosen = None
            n = len(receivers)
            for i in range(n):
                candidate = receivers[(self._rr + i) % n]
                if self._fits(candidate, count):
                    chosen = candidate
                    if self.sub_type is SubType.SHARED:
                        self._rr = (self._rr + i + 1) % n
                    break
            if chosen is None:
                break   # lowest first: never skip ahead of an entry nobody can take yet
            self._pending.popitem(0)
            chosen.permits -= count
            chosen.outstanding[position] = count
            self._owner[position] = chosen.key
            out.append(Delivery(chosen.key, position, count, self._redelivery_counts.get(position, 0)))
        return out

    # -- acks and redelivery --------------------------------------------------------------------
    def ack(self, positions: Iterable[Any]) -> list[Any]:
        """Individual acks (from any consumer of the subscription); returns the positions that
        were outstanding or pending and are now done."""
        done = []
        for position in positions:
            if self._forget(position):
                done.append(position)
        return done

    def ack_cumulative(self, key: Hashable, position: Any) -> list[Any]:
        """Everything up to and including ``position`` is acked (Exclusive/Failover)."""
        done = []
        for p in list(self._pending.irange(maximum=position)):
            self._forget(p)
            done.append(p)
        for consumer in self._consumers.values():
            for p in list(consumer.outstanding.irange(maximum=position)):
                self._forget(p)
                done.append(p)
        return done

    def _forget(self, position: Any) -> bool:
        owner = self._owner.pop(position, None)
        self._redelivery_counts.pop(position, None)
        if owner is not None:
            consumer = self._consumers.get(owner)
            if consumer is not None:
                consumer.outstanding.pop(position, None)
            return True
        return self._pending.pop(position, None) is not None

    def redeliver(self, key: Hashable, positions: Iterable[Any] | None = None) -> int:
        """Put a consumer's outstanding entries (all, or the given ones) back to pending."""
        consumer = self._consumers.get(key)
        if consumer is None:
            return 0
        chosen = list(consumer.outstanding) if positions is None else \
            [p for p in positions if p in consumer.outstanding]
        for position in chosen:
            self._requeue(position, consumer.outstanding.pop(position))
        return len(chosen)

    def clear_pending(self) -> None:
        """Drop every pending entry (e.g. after a seek: the shell reads again from elsewhere)."""
        for position in list(self._pending):
            self._redelivery_counts.pop(position, None)
        self._pending.clear()


__all__ = ["ConsumerBusyError", "Delivery", "DispatcherCore", "SubType"]
