"""The dispatcher core: permits, Exclusive/Failover/Shared assignment, redelivery (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.dispatch import ConsumerBusyError, DispatcherCore, SubType


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
    core.offer([(1, 3), (2, 1), (3, 5)])
    assert core.dispatch() == []             # no permits yet
    core.flow("a", 6)
    assert [d.position for d in core.dispatch()] == [1, 2]
    assert core.permits("a") == 2
    assert core.dispatch() == []             # 5 messages > 2 permits
    core.flow("a", 3)
    assert [d.position for d in core.dispatch()] == [3]
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
    """Permits are never exceeded (entries here never exceed a grant); every entry is
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
            assert d.message_count <= permits[d.consumer], "permits exceeded"
            permits[d.consumer] -= d.message_count
            holder[d.position] = d.consumer
            if sub_type is not SubType.SHARED:
                assert d.consumer == core.consumers[0]

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
