"""[hardening] broker/offloader.py TopicOffloader: a ledger whose offload fails (for ever, e.g. one
over offload_ledger_bytes_max) is not redone on every pass: the automatic triggers try it again
after doubling delays (offload_check_interval_ms .. offload_retry_delay_ms_max), an admin offload
tries it at once and reports its error, and the topic's other ledgers are offloaded meanwhile."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from broker.config import OffloadConfig
from broker.managed_ledger import LedgerInfoState, OffloadState, Position
from broker.offloader import OffloadError, OffloadStatus, TopicOffloader, _Demand
from offload.core import OffloadPolicy

FAILING = 1


def ledger(ledger_id: int, state: OffloadState = OffloadState.NONE) -> SimpleNamespace:
    return SimpleNamespace(ledger_id=ledger_id, state=LedgerInfoState.CLOSED, entries=10, size_bytes=100,
                           created_ms=0, max_publish_time_ms=0,
                           offload=SimpleNamespace(state=state, offloaded_ms=0
                                                   if state is OffloadState.OFFLOADED else None))


def worker(now: list[int]) -> tuple[TopicOffloader, list[list[int]]]:
    """A TopicOffloader over fakes (no loop task): every ledger offloads but FAILING, whose
    WriteObject fails every time; ``passes`` gets the ledgers each pass drove."""
    ledgers = {1: ledger(1), 2: ledger(2)}
    passes: list[list[int]] = []

    async def policy_of(namespace, topic_name):
        return OffloadPolicy(threshold_bytes=0, deletion_lag_ms=10**12)     # offload everything closed

    t = TopicOffloader.__new__(TopicOffloader)
    t.broker = SimpleNamespace(config=SimpleNamespace(offload=OffloadConfig(check_interval_ms=1_000,
                                                                           retry_delay_ms_max=8_000)),
                               clock=lambda: now[0], policy_of=policy_of, lake=None)
    t.topic = SimpleNamespace(name="persistent://public/default/t")
    t.ml = SimpleNamespace(ledgers=lambda: list(ledgers.values()), last_confirmed_position=Position(9, 0))
    t.ml_name, t.namespace, t.partition = "public/default/persistent/t", "public/default", -1
    t.demand, t.last_error, t._closed, t._passes, t._retries = None, "", False, 1, {}

    async def drive(ledger_id, event, policy):
        passes[-1].append(ledger_id)
        if ledger_id == FAILING:
            ledgers[ledger_id] = ledger(ledger_id, OffloadState.OFFLOADING)     # its attempt was recorded
            return "WriteObject: OffloadError: ledger 1 has 2000000000 bytes, more than offload_ledger_bytes_max"
        ledgers[ledger_id] = ledger(ledger_id, OffloadState.OFFLOADED)
        return None

    async def sweep_orphans():
        return []
    t._drive, t.sweep_orphans = drive, sweep_orphans
    t.add = lambda i: ledgers.__setitem__(i, ledger(i))
    return t, passes


def run_pass(t: TopicOffloader, passes: list[list[int]]) -> str | None:
    passes.append([])
    try:
        asyncio.run(t._pass(t.demand))
    except OffloadError as e:
        return str(e)
    return None


def test_a_failing_ledger_is_retried_after_doubling_delays_and_does_not_hold_the_others():
    now = [0]
    t, passes = worker(now)
    tried = []
    for at in (0, 10, 999, 1_000, 2_999, 3_000, 6_999, 7_000, 14_999, 15_000, 22_999, 23_000):
        now[0] = at
        if at == 10:
            t.add(3)                 # a ledger closed later: offloaded at once
        error = run_pass(t, passes)
        tried.append((at, passes[-1]))
        assert (error is not None) == (FAILING in passes[-1])
        if error:
            assert "ledger 1: WriteObject: OffloadError" in error and "offload_ledger_bytes_max" in error
    # delays 1, 2, 4, 8, 8 s (the maximum) after each failure
    assert tried == [(0, [1, 2]), (10, [3]), (999, []), (1_000, [1]), (2_999, []), (3_000, [1]), (6_999, []),
                     (7_000, [1]), (14_999, []), (15_000, [1]), (22_999, []), (23_000, [1])]
    assert t._retries[FAILING].failures == 6


@pytest.mark.parametrize("elapsed_ms", [1, 500])
def test_an_admin_offload_tries_a_backed_off_ledger_at_once_and_reports_its_error(elapsed_ms):
    now = [0]
    t, passes = worker(now)
    run_pass(t, passes)
    now[0] = elapsed_ms
    t.demand = _Demand((FAILING, 2))
    assert run_pass(t, passes) is not None
    assert passes[-1] == [FAILING]
    assert t.demand.status is OffloadStatus.ERROR
    assert "ledger 1: WriteObject: OffloadError" in t.demand.last_error
    assert t.status()["lastError"] == t.demand.last_error
    # an error ends the demand: the automatic triggers go back to waiting
    now[0] += 1
    run_pass(t, passes)
    assert passes[-1] == []


def test_a_pass_that_fails_does_not_fail_an_admin_offload_that_arrived_during_it():
    """The failure of a pass belongs to the demand that pass served: an admin offload requested
    while a slow pass (no demand) runs is not marked ERROR by that pass's failure; the next pass
    runs it."""
    now = [0]
    t, passes = worker(now)
    slow = asyncio.Event()
    drive = t._drive
    attempts: dict[int, int] = {}

    async def slow_then_transient(ledger_id, event, policy):
        attempts[ledger_id] = attempts.get(ledger_id, 0) + 1
        if ledger_id == FAILING and attempts[ledger_id] == 1:
            await slow.wait()            # the pass is slow ...
            return await drive(ledger_id, event, policy)   # ... and fails (once: transient)
        passes[-1].append(ledger_id)
        info = next(i for i in t.ml.ledgers() if i.ledger_id == ledger_id)
        info.offload = ledger(ledger_id, OffloadState.OFFLOADED).offload
        return None                      # later attempts of ledger 1 succeed
    t._drive = slow_then_transient

    async def scenario() -> None:
        t._wake = asyncio.Event()
        passes.append([])
        task = asyncio.ensure_future(t._run())
        for _ in range(20):
            await asyncio.sleep(0)
        assert attempts.get(FAILING) == 1            # the first pass waits inside ledger 1's offload
        demand = t.request(Position(3, 0))           # an admin offload arrives meanwhile
        assert demand.ledgers == (1, 2)
        slow.set()                                   # the first pass fails
        for _ in range(200):
            await asyncio.sleep(0)
            if demand.status is not OffloadStatus.RUNNING:
                break
        t._closed = True
        t._wake.set()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        assert "ledger 1: WriteObject" in t.last_error           # the first pass did fail
        assert demand.status is OffloadStatus.SUCCESS, demand     # and the demand ran after it
        assert attempts[FAILING] == 2

    asyncio.run(scenario())
