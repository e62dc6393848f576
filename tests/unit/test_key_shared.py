"""Key_Shared: the hash of sticky keys, AUTO_SPLIT and STICKY selectors, and the dispatcher's
per-key guarantees on seeded random schedules (hypothesis)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.dispatch import DispatcherCore, KeySharedMode, SubType
from broker.key_shared import (RANGE_SIZE, AutoSplitSelector, ConsumerAssignError, StickySelector, murmur3_32,
                               sticky_key_hash)


def test_murmur3_known_values():
    # reference values of MurmurHash3_x86_32, seed 0
    assert murmur3_32(b"") == 0
    assert murmur3_32(b"hello") == 0x248BFA47
    assert murmur3_32(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723
    assert 0 <= sticky_key_hash("k") < RANGE_SIZE
    assert sticky_key_hash(None) == sticky_key_hash(b"NONE_KEY")


def test_auto_split_halves_biggest_range_and_merges_on_leave():
    s = AutoSplitSelector()
    s.add("a")
    assert s.ranges() == {"a": [(0, RANGE_SIZE - 1)]}
    s.add("b")
    assert s.ranges() == {"b": [(0, 32767)], "a": [(32768, 65535)]}
    s.add("c")
    assert s.ranges()["c"] == [(0, 16383)]
    for slot in (0, 16383, 16384, 32767, 32768, 65535):
        assert s.select(slot) is not None
    s.remove("b")     # its range goes to the range above it (a's)
    assert s.ranges() == {"c": [(0, 16383)], "a": [(16384, 65535)]}
    s.remove("a")     # the top range: the one below grows to the top
    assert s.ranges() == {"c": [(0, 65535)]}
    s.remove("c")
    assert s.select(5) is None


def test_sticky_ranges_refuse_overlap_and_hold_uncovered():
    s = StickySelector()
    s.add("a", [(0, 99), (200, 299)])
    with pytest.raises(ConsumerAssignError):
        s.add("b", [(250, 400)])
    with pytest.raises(ConsumerAssignError):
        s.add("b", [(5, 1)])
    with pytest.raises(ConsumerAssignError):
        s.add("b", [])
    s.add("b", [(100, 199)])
    assert s.select(150) == "b" and s.select(250) == "a" and s.select(300) is None


def test_key_shared_core_sticky_uncovered_held():
    core = DispatcherCore(SubType.KEY_SHARED, key_shared_mode=KeySharedMode.STICKY)
    core.add_consumer("a", hash_ranges=[(0, 9)])
    core.flow("a", 10)
    core.offer([(1, 1, 5), (2, 1, 50), (3, 1, 6)])
    assert [d.position for d in core.dispatch()] == [1, 3]
    core.add_consumer("b", hash_ranges=[(10, 100)])
    core.flow("b", 10)
    assert [(d.consumer, d.position) for d in core.dispatch()] == [("b", 2)]


def test_key_order_kept_when_a_consumer_joins():
    """a has key slot 40000's entry 1 outstanding; b joins and takes the slot: entry 2 of the
    same slot waits until entry 1 is acked; other slots are not held up."""
    core = DispatcherCore(SubType.KEY_SHARED)
    core.add_consumer("a")
    core.flow("a", 1)
    core.offer([(1, 1, 100), (2, 1, 100), (3, 1, 60000)])
    assert [d.position for d in core.dispatch()] == [1]
    core.add_consumer("b")      # b takes 0..32767, so slot 100 moves to b
    core.flow("b", 10)
    core.flow("a", 10)
    assert [(d.consumer, d.position) for d in core.dispatch()] == [("a", 3)]
    core.ack([1])
    assert [(d.consumer, d.position) for d in core.dispatch()] == [("b", 2)]
    core.check_invariants()


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), sticky=st.booleans())
def test_key_shared_random_schedules(seed, sticky):
    """On a seeded random schedule of joins, leaves, permits, acks and redeliveries: a slot's
    outstanding entries are never with two consumers at once; every entry is first delivered only
    after every earlier entry of its slot was delivered; permits are never exceeded; at the end
    everything is delivered and acked exactly once."""
    rng = random.Random(seed)
    mode = KeySharedMode.STICKY if sticky else KeySharedMode.AUTO_SPLIT
    core = DispatcherCore(SubType.KEY_SHARED, key_shared_mode=mode, pending_entries_max=10_000)
    slots_all = [rng.randrange(RANGE_SIZE) for _ in range(6)]
    permits: dict[int, int] = {}
    holder: dict[int, int] = {}
    slot_of: dict[int, int] = {}
    delivered_once: set[int] = set()
    acked: set[int] = set()
    next_pos = 0
    free_quarters = [0, 1, 2, 3]     # STICKY: each consumer takes a quarter of the space
    quarter_of: dict[int, int] = {}

    def add(key):
        ranges = None
        if sticky:
            if not free_quarters:
                return
            q = free_quarters.pop(0)
            quarter_of[key] = q
            ranges = [(q * RANGE_SIZE // 4, (q + 1) * RANGE_SIZE // 4 - 1)]
        core.add_consumer(key, hash_ranges=ranges)
        permits[key] = 0

    def remove(key):
        core.remove_consumer(key)
        del permits[key]
        if sticky:
            free_quarters.append(quarter_of.pop(key))
        for p in [p for p, c in holder.items() if c == key]:
            del holder[p]

    def run():
        for d in core.dispatch():
            assert d.position not in holder and d.position not in acked
            assert permits[d.consumer] > 0, "delivered to a consumer without permits"
            permits[d.consumer] -= d.message_count
            slot = slot_of[d.position]
            for p, c in holder.items():
                if slot_of[p] == slot:
                    assert c == d.consumer, f"slot {slot} held by {c} and {d.consumer}"
            if d.position not in delivered_once:
                earlier = [p for p in slot_of if slot_of[p] == slot and p < d.position]
                assert all(p in delivered_once for p in earlier), "key order broken"
                delivered_once.add(d.position)
            holder[d.position] = d.consumer
        core.check_invariants()

    for _ in range(rng.randrange(10, 120)):
        op = rng.random()
        key = rng.randrange(4)
        if op < 0.15 and key not in permits:
            add(key)
        elif op < 0.22 and key in permits:
            remove(key)
        elif op < 0.45 and key in permits:
            n = rng.randrange(1, 6)
            core.flow(key, n)
            permits[key] += n
        elif op < 0.7:
            batch = []
            for _ in range(rng.randrange(1, 6)):
                slot = rng.choice(slots_all)
                slot_of[next_pos] = slot
                batch.append((next_pos, 1, slot))
                next_pos += 1
            core.offer(batch)
        elif op < 0.9:
            mine = sorted(p for p, c in holder.items() if c == key)
            if mine:
                p = rng.choice(mine)
                core.ack([p])
                del holder[p]
                acked.add(p)
        elif key in permits:
            core.redeliver(key)
            for p in [p for p, c in holder.items() if c == key]:
                del holder[p]
        run()

    # drain: everyone who is there stays; a consumer for each quarter (STICKY) or one at least
    if sticky:
        for key in range(4, 8):
            if free_quarters:
                add(key)
    elif not permits:
        add(99)
    for _ in range(4 * (next_pos + 2)):
        for key in list(permits):
            core.flow(key, 3)
            permits[key] += 3
        run()
        for p in list(holder):
            core.ack([p])
            acked.add(p)
            del holder[p]
        if len(acked) == next_pos:
            break
    assert acked == set(slot_of)
    assert core.pending_count == 0


def test_allow_out_of_order_lets_a_moved_key_go_at_once():
    core = DispatcherCore(SubType.KEY_SHARED, allow_out_of_order=True)
    core.add_consumer("a")
    core.flow("a", 1)
    core.offer([(1, 1, 100), (2, 1, 100)])
    assert [d.position for d in core.dispatch()] == [1]
    core.add_consumer("b")      # takes slot 100
    core.flow("b", 10)
    assert [(d.consumer, d.position) for d in core.dispatch()] == [("b", 2)]


def _core_state(core: DispatcherCore) -> tuple:
    return (dict(core._pending.counts), dict(core._owner), dict(core._redelivery_counts), dict(core._slots),
            {s: dict(h) for s, h in core._slot_holders.items()}, dict(core._delayed), dict(core._delayed_at),
            {k: (c.permits, dict(c.outstanding)) for k, c in core._consumers.items()})


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), sub_type=st.sampled_from([SubType.KEY_SHARED, SubType.SHARED]))
def test_an_ack_run_is_the_same_as_acking_each_in_turn(seed, sub_type):
    """DispatcherCore.ack of a run of positions (one ACK frame's ids: outstanding, pending, delayed,
    unknown, repeated) leaves the state, and returns the positions, that acking each in turn does;
    the dispatches that follow are the same too."""
    rng = random.Random(seed)
    run_core = DispatcherCore(sub_type, pending_entries_max=10_000)
    each_core = DispatcherCore(sub_type, pending_entries_max=10_000)
    cores = (run_core, each_core)
    next_pos = 0
    for step in range(60):
        kind = rng.choice(["add", "remove", "flow", "offer", "delayed", "ack", "ack", "redeliver", "release"])
        key = rng.randrange(4)
        if kind == "add" and key not in run_core.consumers:
            for core in cores:
                core.add_consumer(key)
        elif kind == "remove":
            for core in cores:
                core.remove_consumer(key)
        elif kind == "flow" and key in run_core.consumers:
            permits = rng.randrange(1, 8)
            for core in cores:
                core.flow(key, permits)
        elif kind == "offer":
            batch = [(next_pos + i, rng.randrange(1, 3), rng.randrange(5)) for i in range(rng.randrange(1, 6))]
            next_pos += len(batch)
            for core in cores:
                core.offer(batch if sub_type is SubType.KEY_SHARED else [b[:2] for b in batch])
        elif kind == "delayed":
            at, slot = rng.randrange(100), rng.randrange(5)
            for core in cores:
                core.offer_delayed(next_pos, 1, at, slot)
            next_pos += 1
        elif kind == "release":
            now = rng.randrange(100)
            for core in cores:
                core.release_due(now)
        elif kind == "redeliver" and key in run_core.consumers:
            for core in cores:
                core.redeliver(key)
        elif kind == "ack":
            positions = [rng.randrange(next_pos + 2) for _ in range(rng.randrange(8))]
            got = run_core.ack(positions)
            expected = [p for p in positions if each_core.ack([p])]
            assert got == expected
        assert run_core.dispatch() == each_core.dispatch()
        assert _core_state(run_core) == _core_state(each_core)
        run_core.check_invariants()
