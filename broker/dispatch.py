"""The dispatcher core of one subscription (pure, no I/O; docs/architecture.md#style).

It decides which consumer gets which entry. The shell (broker/topic.py) feeds it events --
consumers coming and going, FLOW permits, entries read from the log, acks, redelivery requests --
and executes the :class:`Delivery` s it returns (fetch the entry bytes, write MESSAGE).

- **Permits count messages**: an entry holding a batch of N messages costs N. An entry goes to
  a consumer that has any permit left (its permits may then drop below zero), as in Pulsar:
  waiting for N permits stalls, because the client grants more only after consuming half its
  receiver queue (measured: a Shared subscription with batches of ~500 stopped after ~5k of 30k
  messages).
- **Exclusive**: one consumer; a second one is refused (:class:`ConsumerBusyError`).
- **Failover**: many consumers, one active: among those of the best (lowest) priority level,
  sorted by consumer name (then arrival), the first -- or, for a partition N of a partitioned
  topic, the (N mod count)-th, so partitions spread over the consumers as in Pulsar. When the
  active consumer changes, what the previous one had outstanding goes to the new one
  (:meth:`DispatcherCore.active_consumer` tells the shell whom to send ACTIVE_CONSUMER_CHANGE).
- **Shared**: round robin over the consumers with permits of the best (lowest) priority level;
  a lower level gets entries only while no consumer of a better one has permits (Pulsar's
  priorityLevel).
- **Key_Shared**: each entry has a sticky-key hash slot (:mod:`broker.key_shared`); the slot's
  consumer (AUTO_SPLIT or STICKY ranges) gets it. Per-key order: an entry is not given to a
  consumer while an earlier entry of the same slot is outstanding with another consumer (after
  a join moved the slot) or still waits before it; entries of other slots go ahead meanwhile.
- Entries are delivered lowest position first: entries to redeliver (their consumer left, or it
  asked for redelivery) go before newer ones; redelivery counts are kept per entry.
- Every delivered entry stays *outstanding* with its consumer until acked; when that consumer
  leaves, its outstanding entries go back to the pending set for the others (redelivery).
- **Back-pressure**: a consumer whose connection is not writable (the shell's write buffer
  passed its high-water mark; :meth:`DispatcherCore.set_writable`) gets nothing until it is
  writable again; its permits and outstanding entries are kept (Pulsar: ``isWritable()``).
- Cumulative acks only on Exclusive/Failover (:class:`CumulativeAckNotAllowedError` otherwise).
- **Delayed delivery** (Shared/Key_Shared, MessageMetadata.deliver_at_time): such an entry waits
  in a separate delayed set (at most ``delayed_entries_max``; it does not take read-ahead room)
  until :meth:`DispatcherCore.release_due` is called with a time at or after it; the shell asks
  :meth:`DispatcherCore.next_due_ms` when to wake. Pulsar's retry-letter topics rely on it.

Positions are opaque ordered keys (the broker uses managed-ledger Positions).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, NamedTuple

from sortedcontainers import SortedDict

from broker.errors import ConsumerAssignError, ConsumerBusyError, CumulativeAckNotAllowedError
from broker.key_shared import AutoSplitSelector, StickySelector
from pulsarlite.errors import check


_UNKNOWN = object()     # a slot whose consumer is not looked up yet (None: nobody covers it)


class SubType(enum.Enum):
    EXCLUSIVE = "Exclusive"
    SHARED = "Shared"
    FAILOVER = "Failover"
    KEY_SHARED = "Key_Shared"


class KeySharedMode(enum.Enum):
    AUTO_SPLIT = "AUTO_SPLIT"
    STICKY = "STICKY"


class Delivery(NamedTuple):
    """One entry given to one consumer. A named tuple, not a frozen dataclass: one is built per
    entry dispatched, and a frozen dataclass's __init__ (object.__setattr__ per field) cost ~4x
    a tuple's (BENCHMARKS.md "[perf] Session 19")."""

    consumer: Hashable
    position: Any
    message_count: int
    redelivery_count: int


class _PendingSet:
    """The pending entries, position -> message count, iterated lowest first. Entries mostly come
    in ascending order (each read is above everything pending), so a plain dict in insertion
    order holds them: adding, finding and removing one is a dict operation (a sorted dict cost a
    bisect insert and remove per entry). One added below the highest (a redelivery, a delayed
    entry released) marks the dict unsorted; the next walk sorts it once."""

    __slots__ = ("counts", "_highest", "_sorted")

    def __init__(self) -> None:
        self.counts: dict[Any, int] = {}
        self._highest: Any = None
        self._sorted = True

    def add(self, position: Any, count: int) -> None:
        counts = self.counts
        if not counts:
            self._highest, self._sorted = position, True
        elif position > self._highest:
            self._highest = position
        else:
            self._sorted = False
        counts[position] = count

    def ordered(self) -> dict[Any, int]:
        """The dict, in position order (sorted first if needed). Its identity may change here:
        take it again after adding."""
        if not self._sorted:
            self.counts = dict(sorted(self.counts.items()))
            self._sorted = True
        return self.counts

    def __iter__(self):
        return iter(self.ordered())

    def __len__(self) -> int:
        return len(self.counts)

    def __contains__(self, position: Any) -> bool:
        return position in self.counts

    def __delitem__(self, position: Any) -> None:
        del self.counts[position]

    def pop(self, position: Any, default: Any = None) -> Any:
        return self.counts.pop(position, default)

    def values(self):
        return self.counts.values()

    def upto(self, position: Any) -> list[Any]:
        """The pending positions <= ``position``, lowest first."""
        out = []
        for p in self.ordered():
            if p > position:
                break
            out.append(p)
        return out

    def clear(self) -> None:
        self.counts.clear()
        self._sorted = True


@dataclass
class _Consumer:
    key: Hashable
    priority: int = 0
    name: str = ""
    arrival: int = 0
    permits: int = 0
    permits_granted_max: int = 0
    writable: bool = True          # its connection can take more now (shell: write-buffer water marks)
    # position -> message count, in delivery order (a plain dict: added and removed once per
    # entry on the hot path; the few readers that need position order sort it)
    outstanding: dict = field(default_factory=dict)


class DispatcherCore:
    """``partition_index``: N for the partition N of a partitioned topic, else -1 (Failover).
    ``key_shared_mode``: for Key_Shared (AUTO_SPLIT by default; fixed by the first consumer in
    Pulsar, here by the subscription's creator); ``allow_out_of_order``: KeySharedMeta's
    allowOutOfOrderDelivery (a key moved to a joining consumer need not wait for the old one's
    unacked entries)."""

    def __init__(self, sub_type: SubType, *, pending_entries_max: int = 1000, partition_index: int = -1,
                 key_shared_mode: KeySharedMode = KeySharedMode.AUTO_SPLIT,
                 allow_out_of_order: bool = False, delayed_entries_max: int = 100_000) -> None:
        if pending_entries_max <= 0:
            raise ValueError("pending_entries_max must be > 0")
        self.sub_type = sub_type
        self.pending_entries_max = pending_entries_max
        self.partition_index = partition_index
        self.key_shared_mode = key_shared_mode
        self.allow_out_of_order = allow_out_of_order   # Key_Shared: no per-key order across joins
        self.delayed_entries_max = delayed_entries_max
        self._delayed: SortedDict = SortedDict()              # (deliver_at_ms, position) -> (count, slot)
        self._delayed_at: dict[Any, int] = {}                 # position -> deliver_at_ms
        self._consumers: dict[Hashable, _Consumer] = {}      # insertion order = arrival order
        self._arrivals = 0
        self._pending = _PendingSet()                         # position -> message count
        self._redelivery_counts: dict[Any, int] = {}          # position -> times redelivered
        self._owner: dict[Any, Hashable] = {}                 # outstanding position -> consumer key
        self._rr: dict[int, int] = {}                         # round-robin cursor per priority level (Shared)
        self._active: Hashable | None = None                  # Failover/Exclusive receiver
        # Key_Shared
        self._selector = (StickySelector() if key_shared_mode is KeySharedMode.STICKY else AutoSplitSelector()) \
            if sub_type is SubType.KEY_SHARED else None
        self._slots: dict[Any, int] = {}                      # pending/outstanding position -> hash slot
        self._slot_holders: dict[int, dict[Hashable, int]] = {}   # slot -> consumer -> outstanding entries
        self._slot_keys: dict[int, Hashable | None] = {}     # slot -> selector's consumer (cleared on joins and leaves)

    # -- consumers ------------------------------------------------------------------------------
    @property
    def consumers(self) -> list[Hashable]:
        return list(self._consumers)

    def add_consumer(self, key: Hashable, *, priority: int = 0, name: str = "",
                     hash_ranges: Iterable[tuple[int, int]] | None = None) -> None:
        """ConsumerBusyError (a 2nd Exclusive consumer), ConsumerAssignError (bad or overlapping
        STICKY ranges): nothing changed."""
        check(key not in self._consumers, f"consumer {key!r} added twice")
        if self.sub_type is SubType.EXCLUSIVE and self._consumers:
            raise ConsumerBusyError("exclusive subscription already has a consumer")
        if self._selector is not None:
            self._selector.add(key, hash_ranges)
            self._slot_keys.clear()
        self._arrivals += 1
        self._consumers[key] = _Consumer(key, priority=priority, name=name or "", arrival=self._arrivals)
        self._choose_active()

    def remove_consumer(self, key: Hashable) -> int:
        """Remove a consumer; its outstanding entries become pending again (to be redelivered
        to the others, or to the next consumer). Returns how many entries were put back."""
        consumer = self._consumers.pop(key, None)
        if consumer is None:
            return 0
        if self._selector is not None:
            self._selector.remove(key)
            self._slot_keys.clear()
        for position, count in list(consumer.outstanding.items()):
            self._requeue(position, count, key)
        n = len(consumer.outstanding)
        consumer.outstanding.clear()
        self._choose_active()
        return n

    def active_consumer(self) -> Hashable | None:
        """The consumer that receives on Exclusive/Failover (None on Shared/Key_Shared)."""
        if self.sub_type in (SubType.EXCLUSIVE, SubType.FAILOVER):
            return self._active
        return None

    def _choose_active(self) -> None:
        if self.sub_type not in (SubType.EXCLUSIVE, SubType.FAILOVER):
            return
        previous = self._active
        if not self._consumers:
            self._active = None
            return
        best = min(c.priority for c in self._consumers.values())
        candidates = sorted((c for c in self._consumers.values() if c.priority == best),
                            key=lambda c: (c.name, c.arrival))
        index = self.partition_index % len(candidates) if self.partition_index >= 0 else 0
        self._active = candidates[index].key
        old = self._consumers.get(previous) if previous is not None else None
        if old is not None and previous != self._active:
            # the standby takes over: what the old active had outstanding is redelivered
            for position, count in list(old.outstanding.items()):
                self._requeue(position, count, previous)
            old.outstanding.clear()

    def flow(self, key: Hashable, permits: int) -> None:
        if permits < 0:
            raise ValueError(f"permits must be >= 0, got {permits}")
        consumer = self._consumers.get(key)
        if consumer is None:
            return
        consumer.permits += permits
        consumer.permits_granted_max = max(consumer.permits_granted_max, consumer.permits)

    def set_writable(self, key: Hashable, writable: bool) -> None:
        """Back-pressure from the consumer's connection (Pulsar: the channel's writability).
        While not writable the consumer gets nothing, its permits and outstanding entries kept;
        once writable again it takes entries as before (the shell then calls :meth:`dispatch`)."""
        consumer = self._consumers.get(key)
        if consumer is not None:
            consumer.writable = writable

    def writable(self, key: Hashable) -> bool:
        return self._consumers[key].writable

    def permits(self, key: Hashable) -> int:
        return self._consumers[key].permits

    def outstanding(self, key: Hashable) -> list[Any]:
        return sorted(self._consumers[key].outstanding)

    def priority(self, key: Hashable) -> int:
        return self._consumers[key].priority

    def hash_ranges(self) -> dict[Hashable, list[tuple[int, int]]]:
        """Key_Shared: the hash ranges of each consumer (stats)."""
        return self._selector.ranges() if self._selector is not None else {}

    # -- entries --------------------------------------------------------------------------------
    @property
    def pending_count(self) -> int:
        return len(self._pending)

    def pending_positions(self) -> list[Any]:
        return list(self._pending)

    def iter_pending(self) -> Iterable[Any]:
        """The pending positions, lowest first (the order :meth:`dispatch` gives them in)."""
        return iter(self._pending)

    def read_wanted(self) -> int:
        """How many new entries the shell should read now: none without any consumer with
        permits, else up to the room left in the pending set."""
        if not any(self._can_take(c) for c in self._receivers()):
            return 0
        if len(self._delayed) >= self.delayed_entries_max:
            return 0
        return max(0, self.pending_entries_max - len(self._pending))

    def offer_delayed(self, position: Any, count: int, deliver_at_ms: int, slot: int = 0) -> None:
        """A new entry not to deliver before ``deliver_at_ms`` (Shared/Key_Shared only; on the
        other types it is offered at once, as Pulsar ignores the delay there)."""
        if self.sub_type not in (SubType.SHARED, SubType.KEY_SHARED):
            self.offer([(position, count, slot)] if self._selector is not None else [(position, count)])
            return
        if position in self._owner or position in self._pending or position in self._delayed_at:
            return
        self._delayed[(deliver_at_ms, position)] = (max(count, 1), slot)
        self._delayed_at[position] = deliver_at_ms

    def release_due(self, now_ms: int) -> int:
        """Move the delayed entries due at ``now_ms`` to the pending set; returns how many."""
        released = 0
        while self._delayed:
            (at, position), (count, slot) = self._delayed.peekitem(0)
            if at > now_ms:
                break
            self._delayed.popitem(0)
            del self._delayed_at[position]
            self._pending.add(position, count)
            if self._selector is not None:
                self._slots[position] = slot
            released += 1
        return released

    def next_due_ms(self) -> int | None:
        """When the first delayed entry is due (None: nothing delayed)."""
        return self._delayed.peekitem(0)[0][0] if self._delayed else None

    @property
    def delayed_count(self) -> int:
        return len(self._delayed)

    def offer(self, entries: Iterable[tuple]) -> None:
        """New entries from the log, as (position, message count) or, for Key_Shared,
        (position, message count, hash slot)."""
        for entry in entries:
            position, count = entry[0], entry[1]
            if count < 1:
                count = 1
            if position in self._owner or position in self._pending or position in self._delayed_at:
                continue
            self._pending.add(position, count)
            if self._selector is not None:
                self._slots[position] = entry[2] if len(entry) > 2 else 0

    def _requeue(self, position: Any, count: int, holder: Hashable) -> None:
        self._owner.pop(position, None)
        self._release_slot(position, holder)
        self._pending.add(position, count)
        self._redelivery_counts[position] = self._redelivery_counts.get(position, 0) + 1

    def _release_slot(self, position: Any, holder: Hashable) -> None:
        if self._selector is None:
            return
        slot = self._slots.get(position)
        holders = self._slot_holders.get(slot)
        if holders is None or holder not in holders:
            return
        holders[holder] -= 1
        if holders[holder] <= 0:
            del holders[holder]
            if not holders:
                del self._slot_holders[slot]

    def _receivers(self) -> list[_Consumer]:
        if not self._consumers:
            return []
        if self.sub_type in (SubType.SHARED, SubType.KEY_SHARED):
            return list(self._consumers.values())
        return [self._consumers[self._active]]

    @staticmethod
    def _can_take(consumer: _Consumer) -> bool:
        """May this consumer be sent an entry now: a permit left and its connection writable."""
        return consumer.permits > 0 and consumer.writable

    @classmethod
    def _fits(cls, consumer: _Consumer, count: int) -> bool:
        # any permit left takes a whole entry, as in Pulsar: a batch may drive permits below 0.
        # Waiting for ``count`` permits would stall: the client grants more only once it has
        # consumed half its queue, and an idle consumer may sit on fewer than a batch's worth.
        return cls._can_take(consumer)

    def _give(self, consumer: _Consumer, position: Any, count: int) -> Delivery:
        """``position`` goes to ``consumer`` (the caller takes it out of the pending set)."""
        consumer.permits -= count
        consumer.outstanding[position] = count
        self._owner[position] = consumer.key
        return tuple.__new__(Delivery, (consumer.key, position, count, self._redelivery_counts.get(position, 0)))

    def dispatch(self, entries_max: int | None = None) -> list[Delivery]:
        """Assign pending entries (lowest first) to consumers while permits and writability
        allow; at most ``entries_max`` of them (None: no bound; the shell bounds a round's bytes)."""
        if entries_max is not None and entries_max < 1:
            raise ValueError(f"entries_max must be >= 1, got {entries_max}")
        if self.sub_type is SubType.KEY_SHARED:
            return self._dispatch_key_shared(entries_max)
        receivers = self._receivers()
        out: list[Delivery] = []
        if not receivers or not self._pending:
            return out
        # Shared: the best (lowest) priority level with permits first, round robin within it
        levels: dict[int, list[_Consumer]] = {}
        for consumer in receivers:
            levels.setdefault(consumer.priority, []).append(consumer)
        groups = [(level, levels[level]) for level in sorted(levels)]
        pending = self._pending.ordered()
        given: list[Any] = []
        for position, count in pending.items():      # lowest first; what is given goes after the walk
            if entries_max is not None and len(out) >= entries_max:
                break
            chosen = None
            for level, group in groups:
                n = len(group)
                start = self._rr.get(level, 0)
                for i in range(n):
                    candidate = group[(start + i) % n]
                    if self._fits(candidate, count):
                        chosen = candidate
                        self._rr[level] = (start + i + 1) % n
                        break
                if chosen is not None:
                    break
            if chosen is None:
                break   # lowest first: never skip ahead of an entry nobody can take yet
            given.append(position)
            out.append(self._give(chosen, position, count))
        for position in given:
            del pending[position]
        return out

    def _dispatch_key_shared(self, entries_max: int | None) -> list[Delivery]:
        out: list[Delivery] = []
        can_take = self._can_take
        with_permits = sum(1 for c in self._consumers.values() if can_take(c))
        if not self._pending or not with_permits:
            return out
        # one walk over the pending set, lowest first; what is given is removed after the walk
        # (no copy of the set per call). A slot whose consumer is out of permits or must wait
        # for another's outstanding entries is blocked: its later entries wait too (key order).
        blocked: set[int] = set()
        pending = self._pending.ordered()
        slots = self._slots
        select = self._selector.select
        slot_keys = self._slot_keys
        consumers = self._consumers
        slot_holders = self._slot_holders
        owner = self._owner
        redeliveries = self._redelivery_counts
        strict = not self.allow_out_of_order
        given: list[Any] = []
        append = out.append
        new_tuple = tuple.__new__       # Delivery(...) without the named tuple's Python-level __new__
        for position, count in pending.items():
            slot = slots.get(position, 0)
            if slot in blocked:
                continue
            key = slot_keys.get(slot, _UNKNOWN)
            if key is _UNKNOWN:
                key = slot_keys[slot] = select(slot)
            consumer = consumers.get(key) if key is not None else None
            holders = slot_holders.get(slot)
            # _can_take (a permit left, writable), inlined
            if consumer is None or consumer.permits <= 0 or not consumer.writable or \
                    (holders and strict and (len(holders) > 1 or key not in holders)):
                blocked.add(slot)
                continue
            given.append(position)
            consumer.permits -= count
            consumer.outstanding[position] = count
            owner[position] = key
            append(new_tuple(Delivery, (key, position, count, redeliveries.get(position, 0))))
            if holders is None:
                slot_holders[slot] = {key: 1}
            else:
                holders[key] = holders.get(key, 0) + 1
            if consumer.permits <= 0:
                with_permits -= 1
                if not with_permits:
                    break
            if entries_max is not None and len(out) >= entries_max:
                break
        for position in given:
            del pending[position]
        return out

    def dispatch_best_effort(self, entries: Iterable[tuple]) -> tuple[list[Delivery], int]:
        """Non-persistent topics (Pulsar's NonPersistentDispatcher*): offer ``entries`` (as
        :meth:`offer`) and give them out at once by the same policy as :meth:`dispatch`; what no
        consumer has a permit for now is dropped, and nothing is tracked afterwards (no acks, no
        redelivery: a delivered entry is forgotten). Returns (deliveries, messages dropped).
        Only for a core used this way alone: it keeps nothing between calls."""
        check(not self._pending and not self._owner and not self._delayed,
              "dispatch_best_effort on a core that tracks entries")
        self.offer(entries)
        out = self.dispatch()
        dropped = sum(self._pending.values())
        self.clear_pending()
        for d in out:
            self._forget(d.position)
        return out, dropped

    # -- acks and redelivery --------------------------------------------------------------------
    def ack(self, positions: Iterable[Any]) -> list[Any]:
        """Individual acks (from any consumer of the subscription); returns the positions that
        were outstanding or pending and are now done."""
        done = []
        owner_pop, counts_pop, slots_pop = self._owner.pop, self._redelivery_counts.pop, self._slots.pop
        consumers = self._consumers
        slot_holders = self._slot_holders if self._selector is not None else None
        for position in positions:       # _forget of each, inlined for an outstanding entry
            owner = owner_pop(position, None)
            if owner is None:
                if self._forget_not_outstanding(position):
                    done.append(position)
                continue
            counts_pop(position, None)
            slot = slots_pop(position, None)
            if slot_holders is not None:          # _release_slot
                holders = slot_holders.get(slot)
                if holders is not None and owner in holders:
                    holders[owner] -= 1
                    if holders[owner] <= 0:
                        del holders[owner]
                        if not holders:
                            del slot_holders[slot]
            consumer = consumers.get(owner)
            if consumer is not None:
                consumer.outstanding.pop(position, None)
            done.append(position)
        return done

    def check_cumulative_allowed(self) -> None:
        if self.sub_type in (SubType.SHARED, SubType.KEY_SHARED):
            raise CumulativeAckNotAllowedError(
                f"cumulative ack is not allowed on a {self.sub_type.value} subscription")

    def ack_cumulative(self, key: Hashable, position: Any) -> list[Any]:
        """Everything up to and including ``position`` is acked (Exclusive/Failover only)."""
        self.check_cumulative_allowed()
        done = []
        for p in self._pending.upto(position):
            self._forget(p)
            done.append(p)
        for consumer in self._consumers.values():
            for p in sorted(p for p in consumer.outstanding if p <= position):
                self._forget(p)
                done.append(p)
        return done

    def _forget(self, position: Any) -> bool:
        return bool(self.ack((position,)))

    def _forget_not_outstanding(self, position: Any) -> bool:
        """The end of :meth:`ack` for a position no consumer holds: pending or delayed."""
        self._redelivery_counts.pop(position, None)
        self._slots.pop(position, None)
        at = self._delayed_at.pop(position, None)
        if at is not None:
            del self._delayed[(at, position)]
            return True
        return self._pending.pop(position, None) is not None

    def redeliver(self, key: Hashable, positions: Iterable[Any] | None = None) -> int:
        """Put a consumer's outstanding entries (all, or the given ones) back to pending."""
        consumer = self._consumers.get(key)
        if consumer is None:
            return 0
        chosen = sorted(consumer.outstanding) if positions is None else \
            [p for p in positions if p in consumer.outstanding]
        for position in chosen:
            self._requeue(position, consumer.outstanding.pop(position), key)
        return len(chosen)

    def redelivery_count(self, position: Any) -> int:
        return self._redelivery_counts.get(position, 0)

    def clear_pending(self) -> None:
        """Drop every pending entry (e.g. after a seek: the shell reads again from elsewhere)."""
        for position in list(self._pending):
            self._redelivery_counts.pop(position, None)
            self._slots.pop(position, None)
        self._pending.clear()
        self._delayed.clear()
        self._delayed_at.clear()

    def check_invariants(self) -> None:
        """Raise InvariantViolation if the state is impossible (tests, debugging)."""
        seen = set()
        for consumer in self._consumers.values():
            for p in consumer.outstanding:
                check(self._owner.get(p) == consumer.key, f"{p} outstanding with {consumer.key} but owned "
                                                          f"by {self._owner.get(p)!r}")
                check(p not in self._pending, f"{p} both pending and outstanding")
                check(p not in seen, f"{p} outstanding twice")
                seen.add(p)
        check(len(seen) == len(self._owner), "owner map out of sync")
        if self._selector is not None:
            counts: dict[tuple[int, Hashable], int] = {}
            for p, owner in self._owner.items():
                slot = self._slots[p]
                counts[(slot, owner)] = counts.get((slot, owner), 0) + 1
            flat = {(s, h): n for s, hs in self._slot_holders.items() for h, n in hs.items()}
            check(counts == flat, "slot holders out of sync")


__all__ = ["ConsumerAssignError", "ConsumerBusyError", "CumulativeAckNotAllowedError", "Delivery",
           "DispatcherCore", "KeySharedMode", "SubType"]
