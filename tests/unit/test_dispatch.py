"""The dispatcher core: permits, Exclusive/Failover/Shared assignment, redelivery (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedDict

from broker.dispatch import ConsumerBusyError, DispatcherCore, SubType, _PendingSet


def test_exclusive_refuses_second_consumer():
    core = DispatcherCore(SubType.EXCLUSIVE)
    core.add_consumer("a")
    with pytest.raises(ConsumerBusyError):
        core.add_consumer("b")
    core.remove_consumer("a")
    core.add_consumer("b")


def test_permits_count_messages_and_lowest_first():
    core = DispatcherCore(SubType.EXCLUSIVE)
    core.add_consumer("a")
    core.offer([(1, 3), (2, 1), (3, 5), (4, 1)])
    assert core.dispatch() == []             # no permits yet
    core.flow("a", 6)
    # 3 + 1 leave 2 permits: the batch of 5 still goes (any permit left takes a whole entry,
    # as in Pulsar), driving permits to -3; nothing more until they are back above 0
    assert [d.position for d in core.dispatch()] == [1, 2, 3]
    assert core.permits("a") == -3
    core.flow("a", 3)
    assert core.dispatch() == []
    core.flow("a", 1)
    assert [d.position for d in core.dispatch()] == [4]
    assert core.permits("a") == 0


def test_batch_bigger_than_any_grant_still_goes():
    core = DispatcherCore(SubType.SHARED)
    core.add_consumer("a")
    core.flow("a", 10)
    core.offer([(1, 50)])
    assert [d.position for d in core.dispatch()] == [1]


def test_redelivery_when_consumer_leaves():
    core = DispatcherCore(SubType.SHARED)
    core.add_consumer("a")
    core.add_consumer("b")
    core.flow("a", 10)
    core.offer([(1, 1), (2, 1)])
    assert {d.consumer for d in core.dispatch()} == {"a"}
    core.ack([1])
    assert core.remove_consumer("a") == 1
    core.flow("b", 10)
    ds = core.dispatch()
    assert [(d.consumer, d.position, d.redelivery_count) for d in ds] == [("b", 2, 1)]


def test_exclusive_redeliver_all_and_cumulative_ack():
    core = DispatcherCore(SubType.EXCLUSIVE)
    core.add_consumer("a")
    core.flow("a", 100)
    core.offer([(i, 1) for i in range(5)])
    assert len(core.dispatch()) == 5
    assert core.ack_cumulative("a", 2) == [0, 1, 2]
    core.redeliver("a")
    core.flow("a", 100)
    assert [d.position for d in core.dispatch()] == [3, 4]


def test_failover_delivers_to_first_consumer_only():
    core = DispatcherCore(SubType.FAILOVER)
    core.add_consumer("a")
    core.add_consumer("b")
    core.flow("a", 10)
    core.flow("b", 10)
    core.offer([(1, 1), (2, 1)])
    assert {d.consumer for d in core.dispatch()} == {"a"}
    core.remove_consumer("a")
    assert {d.consumer for d in core.dispatch()} == {"b"}


ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 3)),
    st.tuples(st.just("remove"), st.integers(0, 3)),
    st.tuples(st.just("flow"), st.integers(0, 3), st.integers(0, 20)),
    st.tuples(st.just("offer"), st.integers(1, 8)),
    st.tuples(st.just("ack"), st.integers(0, 3)),
    st.tuples(st.just("redeliver"), st.integers(0, 3)),
), max_size=80)


@settings(max_examples=300, deadline=None)
@given(ops=ops, sub_type=st.sampled_from([SubType.SHARED, SubType.EXCLUSIVE, SubType.FAILOVER]),
       sizes=st.lists(st.integers(1, 5), min_size=1, max_size=10))
def test_properties(ops, sub_type, sizes):
    """Only consumers with permits left get entries; every entry is
    delivered to one consumer at a time and, once everyone stays, all are delivered and acked
    exactly once; Exclusive never has two consumers."""
    core = DispatcherCore(sub_type, pending_entries_max=1000)
    next_pos = 0
    permits: dict[int, int] = {}
    holder: dict[int, int] = {}          # outstanding position -> consumer
    acked: set[int] = set()
    offered: dict[int, int] = {}

    def run_dispatch():
        for d in core.dispatch():
            assert d.position not in holder and d.position not in acked
            assert permits[d.consumer] > 0, "delivered to a consumer without permits"
            permits[d.consumer] -= d.message_count
            holder[d.position] = d.consumer
            if sub_type is not SubType.SHARED:
                assert d.consumer == core.active_consumer() == core.consumers[0]

    for op in ops:
        kind = op[0]
        if kind == "add":
            if op[1] in permits:
                continue
            try:
                core.add_consumer(op[1])
            except ConsumerBusyError:
                assert sub_type is SubType.EXCLUSIVE and core.consumers
                continue
            permits[op[1]] = 0
        elif kind == "remove" and op[1] in permits:
            core.remove_consumer(op[1])
            del permits[op[1]]
            for p in [p for p, c in holder.items() if c == op[1]]:
                del holder[p]
        elif kind == "flow" and op[1] in permits:
            amount = max(op[2], 5)     # grants always cover the biggest entry in this test
            core.flow(op[1], amount)
            permits[op[1]] += amount
        elif kind == "offer":
            batch = []
            for _ in range(op[1]):
                size = sizes[next_pos % len(sizes)]
                batch.append((next_pos, size))
                offered[next_pos] = size
                next_pos += 1
            core.offer(batch)
        elif kind == "ack":
            mine = sorted(p for p, c in holder.items() if c == op[1])
            if mine:
                core.ack([mine[0]])
                del holder[mine[0]]
                acked.add(mine[0])
        elif kind == "redeliver" and op[1] in permits:
            core.redeliver(op[1])
            for p in [p for p, c in holder.items() if c == op[1]]:
                del holder[p]
        run_dispatch()
        if sub_type is SubType.EXCLUSIVE:
            assert len(core.consumers) <= 1

    # drain: one consumer stays, acks everything it gets
    if not core.consumers:
        core.add_consumer(99)
        permits[99] = 0
    last = core.consumers[0]
    for key in list(core.consumers):
        if key != last:
            core.remove_consumer(key)
            for p in [p for p, c in holder.items() if c == key]:
                del holder[p]
    for p in [p for p, c in holder.items() if c == last]:
        core.ack([p])
        acked.add(p)
        del holder[p]
    for _ in range(len(offered) + 1):
        core.flow(last, 5)
        permits[last] += 5
        run_dispatch()
        for p in list(holder):
            core.ack([p])
            acked.add(p)
            del holder[p]
    assert acked == set(offered)
    assert core.pending_count == 0


def test_failover_active_by_priority_then_name_and_takeover():
    core = DispatcherCore(SubType.FAILOVER)
    core.add_consumer("x", name="c2", priority=1)
    assert core.active_consumer() == "x"
    core.flow("x", 10)
    core.offer([(1, 1), (2, 1)])
    assert [d.consumer for d in core.dispatch()] == ["x", "x"]
    core.add_consumer("y", name="c9", priority=0)   # better priority: takes over with x's unacked
    assert core.active_consumer() == "y"
    core.flow("y", 10)
    assert [(d.consumer, d.position, d.redelivery_count) for d in core.dispatch()] == [("y", 1, 1), ("y", 2, 1)]
    core.add_consumer("z", name="c1", priority=0)   # same priority, lower name
    assert core.active_consumer() == "z"
    core.remove_consumer("z")
    assert core.active_consumer() == "y"


def test_failover_partition_index_spreads_active():
    actives = set()
    for partition in range(3):
        core = DispatcherCore(SubType.FAILOVER, partition_index=partition)
        for name in ("a", "b", "c"):
            core.add_consumer(name, name=name)
        actives.add(core.active_consumer())
    assert actives == {"a", "b", "c"}


def test_cumulative_ack_refused_on_shared():
    from broker.dispatch import CumulativeAckNotAllowedError
    for sub_type in (SubType.SHARED, SubType.KEY_SHARED):
        core = DispatcherCore(sub_type)
        core.add_consumer("a")
        with pytest.raises(CumulativeAckNotAllowedError):
            core.ack_cumulative("a", 3)


def test_redelivery_counts_grow_per_nack():
    core = DispatcherCore(SubType.SHARED)
    core.add_consumer("a")
    core.flow("a", 100)
    core.offer([(1, 1)])
    for expected in range(4):
        [d] = core.dispatch()
        assert d.redelivery_count == expected
        core.redeliver("a", [1])


def test_shared_priority_levels():
    core = DispatcherCore(SubType.SHARED)
    core.add_consumer("hi1", priority=0)
    core.add_consumer("lo", priority=1)
    core.add_consumer("hi2", priority=0)
    for key in ("hi1", "hi2", "lo"):
        core.flow(key, 2)
    core.offer([(i, 1) for i in range(6)])
    assert [d.consumer for d in core.dispatch()] == ["hi1", "hi2", "hi1", "hi2", "lo", "lo"]


def test_delayed_entries_wait_until_due_without_blocking_others():
    core = DispatcherCore(SubType.SHARED, pending_entries_max=2)
    core.add_consumer("a")
    core.flow("a", 100)
    for p in range(5):                       # delayed entries take no read-ahead room
        core.offer_delayed(p, 1, deliver_at_ms=1_000 + p)
    assert core.read_wanted() == 2 and core.next_due_ms() == 1_000
    core.offer([(10, 1)])
    assert [d.position for d in core.dispatch()] == [10]
    assert core.release_due(999) == 0 and core.dispatch() == []
    assert core.release_due(1_002) == 3
    assert [d.position for d in core.dispatch()] == [0, 1, 2]
    core.ack([3])                            # an ack of a delayed entry forgets it
    assert core.release_due(10_000) == 1 and [d.position for d in core.dispatch()] == [4]
    assert core.next_due_ms() is None


def test_delay_ignored_on_exclusive_and_bounded():
    core = DispatcherCore(SubType.EXCLUSIVE)
    core.add_consumer("a")
    core.flow("a", 10)
    core.offer_delayed(1, 1, deliver_at_ms=10**15)
    assert [d.position for d in core.dispatch()] == [1]
    core = DispatcherCore(SubType.SHARED, delayed_entries_max=2)
    core.add_consumer("a")
    core.flow("a", 10)
    core.offer_delayed(1, 1, 5)
    core.offer_delayed(2, 1, 5)
    assert core.read_wanted() == 0           # the delayed set is full: read no further


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), key_shared=st.booleans())
def test_delayed_random_schedules(seed, key_shared):
    """Seeded random mix of delayed and immediate entries, acks, redeliveries and a moving
    clock: nothing is delivered before its time, and everything is delivered and acked once."""
    import random
    rng = random.Random(seed)
    core = DispatcherCore(SubType.KEY_SHARED if key_shared else SubType.SHARED, pending_entries_max=20)
    for key in ("a", "b"):
        core.add_consumer(key)
    due: dict[int, int] = {}
    holder: dict[int, str] = {}
    acked: set[int] = set()
    now = 0
    next_pos = 0
    for _ in range(rng.randrange(20, 200)):
        op = rng.random()
        if op < 0.3 and core.read_wanted():
            at = now + rng.choice([0, 0, 5, 50])
            slot = rng.randrange(4)
            if at > now:
                core.offer_delayed(next_pos, 1, at, slot)
            else:
                core.offer([(next_pos, 1, slot)] if key_shared else [(next_pos, 1)])
            due[next_pos] = at
            next_pos += 1
        elif op < 0.5:
            now += rng.randrange(0, 20)
            core.release_due(now)
        elif op < 0.65:
            core.flow(rng.choice("ab"), rng.randrange(1, 4))
        elif op < 0.85 and holder:
            p = rng.choice(sorted(holder))
            core.ack([p])
            del holder[p]
            acked.add(p)
        elif holder:
            key = rng.choice("ab")
            core.redeliver(key)
            for p in [p for p, c in holder.items() if c == key]:
                del holder[p]
        for d in core.dispatch():
            assert due[d.position] <= now, f"{d.position} delivered at {now}, due {due[d.position]}"
            assert d.position not in holder and d.position not in acked
            holder[d.position] = d.consumer
        core.check_invariants()
    now += 1000
    for _ in range(next_pos + 5):
        core.release_due(now)
        core.flow("a", 5)
        core.flow("b", 5)
        for d in core.dispatch():
            holder[d.position] = d.consumer
        for p in list(holder):
            core.ack([p])
            acked.add(p)
            del holder[p]
    assert acked == set(due) and core.pending_count == 0 and core.delayed_count == 0


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), partition=st.integers(-1, 5))
def test_failover_random_schedules(seed, partition):
    """Seeded joins/leaves with random priorities and names: the active consumer is always the
    expected one, only it receives, and no entry is lost or held by two consumers."""
    import random
    rng = random.Random(seed)
    core = DispatcherCore(SubType.FAILOVER, partition_index=partition)
    members: dict[int, tuple[int, str, int]] = {}     # key -> (priority, name, arrival)
    arrivals = 0
    holder: dict[int, int] = {}
    acked: set[int] = set()
    next_pos = 0

    def expected():
        if not members:
            return None
        best = min(p for p, _, _ in members.values())
        cands = sorted((k for k, v in members.items() if v[0] == best),
                       key=lambda k: (members[k][1], members[k][2]))
        return cands[partition % len(cands)] if partition >= 0 else cands[0]

    for _ in range(rng.randrange(10, 120)):
        op = rng.random()
        key = rng.randrange(5)
        if op < 0.2 and key not in members:
            arrivals += 1
            members[key] = (rng.randrange(2), rng.choice("abc"), arrivals)
            core.add_consumer(key, priority=members[key][0], name=members[key][1])
        elif op < 0.3 and key in members:
            core.remove_consumer(key)
            del members[key]
        elif op < 0.5 and key in members:
            core.flow(key, rng.randrange(1, 5))
        elif op < 0.7:
            core.offer([(next_pos, 1)])
            next_pos += 1
        elif holder:
            p = rng.choice(sorted(holder))
            core.ack([p])
            acked.add(p)
            del holder[p]
        # entries held by a consumer that is no longer active were put back
        active = expected()
        assert core.active_consumer() == active
        for p in [p for p, c in holder.items() if c != active]:
            del holder[p]
        for d in core.dispatch():
            assert d.consumer == active
            assert d.position not in holder and d.position not in acked
            holder[d.position] = d.consumer
        core.check_invariants()
    if not members:
        core.add_consumer(99)
        members[99] = (0, "", arrivals + 1)
    active = core.active_consumer()
    for p in list(holder):
        if holder[p] == active:
            core.ack([p])
            acked.add(p)
    core.flow(active, next_pos + 1)
    for d in core.dispatch():
        core.ack([d.position])
        acked.add(d.position)
    assert acked == set(range(next_pos)), "entries lost"


# -- back-pressure: a consumer whose connection is not writable gets nothing, permits kept --------

@pytest.mark.parametrize("sub_type", [SubType.EXCLUSIVE, SubType.FAILOVER, SubType.SHARED, SubType.KEY_SHARED])
def test_unwritable_consumer_gets_nothing_and_keeps_permits(sub_type):
    core = DispatcherCore(sub_type)
    core.add_consumer("a")
    core.flow("a", 10)
    core.set_writable("a", False)
    entries = [(p, 1, 7) for p in range(1, 6)] if sub_type is SubType.KEY_SHARED else [(p, 1) for p in range(1, 6)]
    core.offer(entries)
    assert core.dispatch() == []
    assert core.read_wanted() == 0           # nothing to read ahead for while paused
    assert core.permits("a") == 10
    core.set_writable("a", True)
    assert [d.position for d in core.dispatch()] == [1, 2, 3, 4, 5]
    assert core.permits("a") == 5


def test_shared_unwritable_consumer_skipped_others_served():
    core = DispatcherCore(SubType.SHARED)
    core.add_consumer("a")
    core.add_consumer("b")
    core.flow("a", 10)
    core.flow("b", 10)
    core.set_writable("a", False)
    core.offer([(p, 1) for p in range(1, 5)])
    assert {d.consumer for d in core.dispatch()} == {"b"}
    assert core.permits("a") == 10


@pytest.mark.parametrize("sub_type", [SubType.EXCLUSIVE, SubType.KEY_SHARED])
def test_dispatch_entries_max_bounds_a_round_lowest_first(sub_type):
    core = DispatcherCore(sub_type)
    core.add_consumer("a")
    core.flow("a", 100)
    entries = [(p, 1, 3) for p in range(1, 11)] if sub_type is SubType.KEY_SHARED else [(p, 1) for p in range(1, 11)]
    core.offer(entries)
    assert [d.position for d in core.dispatch(3)] == [1, 2, 3]
    assert [d.position for d in core.dispatch(3)] == [4, 5, 6]
    assert [d.position for d in core.dispatch()] == [7, 8, 9, 10]
    with pytest.raises(ValueError):
        core.dispatch(0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "add", "add", "del", "pop", "upto", "iter", "clear"]),
                          st.integers(0, 60), st.integers(1, 5)), max_size=80))
def test_pending_set_is_a_sorted_dict(ops):
    # the dispatcher's pending set (a dict in insertion order, sorted again only after an entry
    # came below the highest) iterates lowest first, as a sorted dict of the same entries does
    pending, model = _PendingSet(), SortedDict()
    for kind, position, count in ops:
        if kind == "add" and position not in model:
            pending.add(position, count)
            model[position] = count
        elif kind == "del" and position in model:
            del pending[position]
            del model[position]
        elif kind == "pop":
            assert pending.pop(position) == model.pop(position, None)
        elif kind == "upto":
            assert pending.upto(position) == list(model.irange(maximum=position))
        elif kind == "clear":
            pending.clear()
            model.clear()
        assert list(pending) == list(model) and list(pending.ordered().items()) == list(model.items())
        assert len(pending) == len(model) and (position in pending) == (position in model)
        assert sorted(pending.values()) == sorted(model.values())
