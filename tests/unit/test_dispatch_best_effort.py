"""DispatcherCore.dispatch_best_effort: the non-persistent dispatch (Pulsar's
NonPersistentDispatcher*): given now or dropped, nothing tracked afterwards."""

from __future__ import annotations

import pytest

from broker.dispatch import DispatcherCore, SubType
from pulsarlite.errors import InvariantViolation


def test_exclusive_delivers_while_permits_last_then_drops():
    core = DispatcherCore(SubType.EXCLUSIVE)
    core.add_consumer("a")
    core.flow("a", 3)
    out, dropped = core.dispatch_best_effort([(1, 1), (2, 1), (3, 1), (4, 1), (5, 2)])
    assert [d.position for d in out] == [1, 2, 3]
    assert dropped == 3                       # entry 4 (1 message) and entry 5 (2 messages)
    assert core.pending_count == 0 and core.outstanding("a") == []
    out, dropped = core.dispatch_best_effort([(6, 1)])
    assert out == [] and dropped == 1         # no permit left: dropped, not kept for later
    core.flow("a", 1)
    out, dropped = core.dispatch_best_effort([(7, 1)])
    assert [d.position for d in out] == [7] and dropped == 0


def test_no_consumer_drops_everything():
    core = DispatcherCore(SubType.SHARED)
    assert core.dispatch_best_effort([(1, 5), (2, 1)]) == ([], 6)


def test_shared_round_robin_and_failover_active_only():
    shared = DispatcherCore(SubType.SHARED)
    for key in ("a", "b"):
        shared.add_consumer(key)
        shared.flow(key, 10)
    out, dropped = shared.dispatch_best_effort([(i, 1) for i in range(4)])
    assert [d.consumer for d in out] == ["a", "b", "a", "b"] and dropped == 0
    failover = DispatcherCore(SubType.FAILOVER)
    for key in ("a", "b"):
        failover.add_consumer(key, name=key)
        failover.flow(key, 10)
    out, _ = failover.dispatch_best_effort([(i, 1) for i in range(4)])
    assert {d.consumer for d in out} == {"a"}
    failover.remove_consumer("a")            # nothing outstanding to hand over
    out, _ = failover.dispatch_best_effort([(9, 1)])
    assert [d.consumer for d in out] == ["b"] and d_count(out) == 1


def d_count(out) -> int:
    return sum(d.message_count for d in out)


def test_key_shared_drops_only_for_the_key_whose_consumer_has_no_permits():
    core = DispatcherCore(SubType.KEY_SHARED)
    core.add_consumer("a")
    core.add_consumer("b")
    core.flow("a", 100)                       # b has none
    slots = {}
    for slot in range(0, 65536, 997):         # find one slot of each consumer
        out, dropped = core.dispatch_best_effort([(slot, 1, slot)])
        slots.setdefault("a" if out else "b", slot)
    assert set(slots) == {"a", "b"}
    out, dropped = core.dispatch_best_effort([(1, 1, slots["b"]), (2, 1, slots["a"])])
    assert [d.position for d in out] == [2] and dropped == 1


def test_refused_on_a_core_that_tracks_entries():
    core = DispatcherCore(SubType.SHARED)
    core.offer([(1, 1)])
    with pytest.raises(InvariantViolation):
        core.dispatch_best_effort([(2, 1)])


@pytest.mark.parametrize("sub_type", list(SubType))
def test_a_consumer_whose_connection_is_backed_up_gets_nothing_and_it_is_dropped(sub_type):
    """Pulsar's non-persistent dispatchers drop for a consumer whose channel is not writable;
    its permits are kept for when it drains."""
    core = DispatcherCore(sub_type)
    core.add_consumer("a")
    core.flow("a", 10)
    core.set_writable("a", False)
    out, dropped = core.dispatch_best_effort([(1, 1), (2, 3)])
    assert out == [] and dropped == 4
    core.set_writable("a", True)
    out, dropped = core.dispatch_best_effort([(3, 1)])
    assert [d.position for d in out] == [3] and dropped == 0
