"""The pure core of retention, message TTL and backlog quotas (broker/retention.py)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.admin.policies import BacklogQuota, RetentionPolicy
from broker.managed_ledger import LedgerInfo, LedgerInfoState, Position
from broker.errors import BrokerError, ProducerBlockedError, server_error_of
from broker.retention import (MiB, QuotaVerdict, RetentionLimits, backlog_bytes_after, check_backlog_quota,
                              closed_time_ms, consumed_by_all, eviction_target, ledgers_to_delete,
                              oldest_unacked_publish_ms, producer_refusal, search_last_expired,
                              ttl_expired_through)
from pulsarlite.wire import pb

CLOSED, OPEN = LedgerInfoState.CLOSED, LedgerInfoState.OPEN


def ledger(lid: int, entries: int, size: int, created_ms: int, *, state=CLOSED, lo=None, hi=None) -> LedgerInfo:
    if entries and lo is None:
        lo, hi = created_ms, created_ms + entries - 1
    return LedgerInfo(lid, state, entries=entries, size_bytes=size, created_ms=created_ms,
                      min_publish_time_ms=lo if entries else None, max_publish_time_ms=hi if entries else None)


def topic(n_closed: int = 4, entries: int = 10, size: int = 1000, step_ms: int = 1000) -> list[LedgerInfo]:
    """``n_closed`` closed ledgers (ids 1..n) created every ``step_ms`` from t=0, then an open one."""
    out = [ledger(i + 1, entries, size, i * step_ms) for i in range(n_closed)]
    out.append(ledger(n_closed + 1, 3, 300, n_closed * step_ms, state=OPEN))
    return out


# -- retention ---------------------------------------------------------------------------------
def test_limits_from_policy():
    assert RetentionLimits.from_policy(None) == RetentionLimits(0, 0)
    assert RetentionLimits.from_policy(RetentionPolicy(2, 3)) == RetentionLimits(120_000, 3 * MiB)
    assert RetentionLimits.from_policy(RetentionPolicy(-1, -1)) == RetentionLimits(-1, -1)
    with pytest.raises(ValueError):
        RetentionLimits(-2, 0)


def test_no_retention_deletes_every_consumed_closed_ledger_but_never_the_current():
    ledgers = topic()
    assert ledgers_to_delete(ledgers, None, RetentionLimits(), now_ms=10_000) == [1, 2, 3, 4]
    # a subscription at the end of ledger 2 keeps 3 and 4
    assert ledgers_to_delete(ledgers, Position(2, 9), RetentionLimits(), now_ms=10_000) == [1, 2]
    # in the middle of ledger 2: only 1
    assert ledgers_to_delete(ledgers, Position(2, 8), RetentionLimits(), now_ms=10_000) == [1]
    # at the very start: none
    assert ledgers_to_delete(ledgers, Position(1, -1), RetentionLimits(), now_ms=10_000) == []
    # a subscription past everything: still never the current ledger
    assert ledgers_to_delete(ledgers, Position(5, 2), RetentionLimits(), now_ms=10_000) == [1, 2, 3, 4]


def test_infinite_retention_keeps_everything():
    assert ledgers_to_delete(topic(), None, RetentionLimits(-1, -1), now_ms=10**12) == []


def test_retention_by_time_uses_the_close_time():
    ledgers = topic(step_ms=60_000)     # ledger i closed when i+1 was created: i*60s
    limits = RetentionLimits(time_ms=90_000, size_bytes=-1)
    # at t=200s: ledger 1 closed at 60s (140s ago), 2 at 120s (80s ago): only 1 is expired
    assert ledgers_to_delete(ledgers, None, limits, now_ms=200_000) == [1]
    assert ledgers_to_delete(ledgers, None, limits, now_ms=400_000) == [1, 2, 3, 4]
    assert closed_time_ms(ledgers, 0) == 60_000
    assert closed_time_ms(ledgers, len(ledgers) - 1) == ledgers[-1].created_ms


def test_retention_by_size_keeps_the_newest_within_the_limit():
    ledgers = topic()          # 4 x 1000 closed + 300 open = 4300 bytes
    limits = RetentionLimits(time_ms=-1, size_bytes=2500)
    # delete while the remaining size is above the limit: 4300 -> 3300 -> 2300 (stop)
    assert ledgers_to_delete(ledgers, None, limits, now_ms=0) == [1, 2]
    # time OR size: a ledger within the size limit goes when it is expired
    assert ledgers_to_delete(ledgers, None, RetentionLimits(time_ms=1, size_bytes=10**9), now_ms=10**6) == \
        [1, 2, 3, 4]


def test_scan_stops_at_the_first_ledger_that_stays():
    ledgers = [ledger(1, 10, 1000, 0), ledger(2, 10, 1000, 1000, state=OPEN)]
    # an OPEN ledger before the end (a crashed owner's, not recovered yet) is never deleted
    ledgers = [ledger(1, 10, 1000, 0, state=OPEN), ledger(2, 10, 1000, 1000), ledger(3, 0, 0, 2000, state=OPEN)]
    assert ledgers_to_delete(ledgers, None, RetentionLimits(), 10**6) == []
    assert consumed_by_all(ledger(7, 0, 0, 0), Position(7, -1))


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=12),
       md=st.tuples(st.integers(0, 14), st.integers(-1, 12)),
       time_ms=st.integers(-1, 20_000), size_bytes=st.integers(-1, 40_000), now_ms=st.integers(0, 30_000),
       no_subs=st.booleans())
def test_retention_properties(sizes, md, time_ms, size_bytes, now_ms, no_subs):
    ledgers = [ledger(i + 1, 10 if s else 0, s, i * 1000) for i, s in enumerate(sizes)]
    ledgers[-1] = LedgerInfo(ledgers[-1].ledger_id, OPEN, entries=ledgers[-1].entries,
                             size_bytes=ledgers[-1].size_bytes, created_ms=ledgers[-1].created_ms,
                             min_publish_time_ms=ledgers[-1].min_publish_time_ms,
                             max_publish_time_ms=ledgers[-1].max_publish_time_ms)
    slowest = None if no_subs else Position(*md)
    limits = RetentionLimits(time_ms, size_bytes)
    out = ledgers_to_delete(ledgers, slowest, limits, now_ms)
    ids = [i.ledger_id for i in ledgers]
    # a prefix, never the current ledger
    assert out == ids[:len(out)] and ledgers[-1].ledger_id not in out
    # every deleted ledger is consumed by the slowest subscription
    for info in ledgers[:len(out)]:
        assert slowest is None or slowest >= Position(info.ledger_id, info.entries - 1)
        assert info.state is CLOSED
    if time_ms < 0 and size_bytes < 0:
        assert out == []
    # what stays is within the size limit, or the next ledger had to stay for another reason
    if out != ids[:-1] and size_bytes >= 0:
        nxt = ledgers[len(out)]
        kept = sum(i.size_bytes for i in ledgers[len(out):])
        stays_anyway = (slowest is not None and slowest < Position(nxt.ledger_id, nxt.entries - 1))
        assert kept <= size_bytes or stays_anyway or nxt.state is not CLOSED
    # monotone in time: later never deletes fewer
    assert len(ledgers_to_delete(ledgers, slowest, limits, now_ms + 10_000)) >= len(out)


# -- TTL ---------------------------------------------------------------------------------------
def test_ttl_whole_ledgers_then_partial():
    ledgers = [ledger(1, 10, 100, 0, lo=0, hi=900), ledger(2, 10, 100, 1000, lo=1000, hi=1900),
               ledger(3, 10, 100, 2000, lo=2000, hi=2900, state=OPEN)]
    assert ttl_expired_through(ledgers, 500, now_ms=100) == (None, None)
    assert ttl_expired_through(ledgers, 500, now_ms=600) == (None, ledgers[0])     # 0 expired, 900 not
    assert ttl_expired_through(ledgers, 500, now_ms=1400) == (Position(1, 9), None)
    assert ttl_expired_through(ledgers, 500, now_ms=1600) == (Position(1, 9), ledgers[1])
    assert ttl_expired_through(ledgers, 500, now_ms=10_000) == (Position(3, 9), None)
    assert ttl_expired_through(ledgers, 0, now_ms=10_000) == (None, None)
    unknown = [LedgerInfo(4, CLOSED, entries=3, size_bytes=3, created_ms=0)]
    assert ttl_expired_through(unknown, 500, 10_000) == (None, unknown[0])


@settings(max_examples=200, deadline=None)
@given(times=st.lists(st.integers(0, 10_000), min_size=1, max_size=200).map(sorted),
       ttl_ms=st.integers(1, 5000), now_ms=st.integers(0, 15_000))
def test_search_last_expired_matches_a_linear_scan(times, ttl_ms, now_ms):
    info = LedgerInfo(9, CLOSED, entries=len(times), size_bytes=len(times), created_ms=0,
                      min_publish_time_ms=times[0], max_publish_time_ms=times[-1])
    reads = []

    async def at(entry_id):
        reads.append(entry_id)
        return times[entry_id]

    got = asyncio.run(search_last_expired(info, at, ttl_ms, now_ms))
    expected = [i for i, t in enumerate(times) if t + ttl_ms <= now_ms]
    assert got == (Position(9, expected[-1]) if expected else None)
    assert len(reads) <= len(times).bit_length() + 1


def test_search_treats_unreadable_entries_as_not_expired():
    info = LedgerInfo(1, CLOSED, entries=4, size_bytes=4)

    async def at(entry_id):
        return None

    assert asyncio.run(search_last_expired(info, at, 1, 10**9)) is None


# -- backlog quota -------------------------------------------------------------------------------
def test_backlog_bytes_and_age():
    ledgers = topic()          # 4 x (10 entries, 1000 bytes) + open (3, 300)
    assert backlog_bytes_after(ledgers, Position(1, -1)) == 4300
    assert backlog_bytes_after(ledgers, Position(1, 4)) == 500 + 3000 + 300
    assert backlog_bytes_after(ledgers, Position(5, 2)) == 0
    assert oldest_unacked_publish_ms(ledgers, Position(1, 9)) == ledgers[1].min_publish_time_ms
    assert oldest_unacked_publish_ms(ledgers, Position(5, 2)) is None


def test_quota_by_size_and_time():
    ledgers = topic(step_ms=10_000)
    size = {"destination_storage": BacklogQuota(limit_bytes=2000, policy="producer_exception")}
    v = check_backlog_quota(size, ledgers, Position(1, -1), now_ms=0)
    assert v.exceeded and v.by_size and v.policy == "producer_exception"
    assert not check_backlog_quota(size, ledgers, Position(3, 9), now_ms=0).exceeded
    assert not check_backlog_quota(size, ledgers, None, now_ms=0).exceeded      # no subscription
    age = {"message_age": BacklogQuota(limit_time_s=15, policy="producer_request_hold")}
    v = check_backlog_quota(age, ledgers, Position(1, -1), now_ms=20_000)
    assert v.exceeded and not v.by_size and v.kind == "message_age"
    assert not check_backlog_quota(age, ledgers, Position(2, 9), now_ms=20_000).exceeded
    assert not check_backlog_quota({}, ledgers, Position(1, -1), now_ms=10**9).exceeded


def test_eviction_targets():
    ledgers = topic(step_ms=10_000)
    quotas = {"destination_storage": BacklogQuota(limit_bytes=2000, policy="consumer_backlog_eviction")}
    v = check_backlog_quota(quotas, ledgers, Position(1, -1), now_ms=0)
    target = eviction_target(ledgers, v, quotas, now_ms=0)
    # what follows the target fits: ledgers 4 (1000) + open (300)
    assert target == Position(3, 9)
    assert backlog_bytes_after(ledgers, target) <= 2000
    assert not check_backlog_quota(quotas, ledgers, target, now_ms=0).exceeded
    quotas = {"message_age": BacklogQuota(limit_time_s=15, policy="consumer_backlog_eviction")}
    v = check_backlog_quota(quotas, ledgers, Position(1, -1), now_ms=30_000)
    assert eviction_target(ledgers, v, quotas, now_ms=30_000) == Position(2, 9)   # 2 ends at 10009 ms


def test_producer_refusal_errors():
    class T:
        quota_blocked = None

    t = T()
    assert producer_refusal(t) is None
    t.quota_blocked = QuotaVerdict(True, "destination_storage", "producer_exception", "over", True)
    e = producer_refusal(t)
    # one class, the two of Pulsar's answers by policy (the client fails vs. holds its sends)
    assert isinstance(e, ProducerBlockedError) and isinstance(e, BrokerError)
    assert server_error_of(e) == e.server_error == pb.ProducerBlockedQuotaExceededException and not e.retriable
    t.quota_blocked = QuotaVerdict(True, "destination_storage", "producer_request_hold", "over", True)
    e = producer_refusal(t)
    assert isinstance(e, ProducerBlockedError) and e.retriable
    assert server_error_of(e) == e.server_error == pb.ProducerBlockedQuotaExceededError


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=10), limit=st.integers(0, 20_000))
def test_size_eviction_brings_every_subscription_under_the_quota(sizes, limit):
    ledgers = [ledger(i + 1, 10, s, i * 1000) for i, s in enumerate(sizes)]
    quotas = {"destination_storage": BacklogQuota(limit_bytes=limit, policy="consumer_backlog_eviction")}
    start = Position(1, -1)
    verdict = check_backlog_quota(quotas, ledgers, start, now_ms=0)
    assert verdict.exceeded == (sum(sizes) > limit)
    if not verdict.exceeded:
        return
    target = eviction_target(ledgers, verdict, quotas, now_ms=0)
    assert target is not None and target.entry_id == 9          # whole ledgers
    assert backlog_bytes_after(ledgers, target) <= limit
    assert not check_backlog_quota(quotas, ledgers, target, now_ms=0).exceeded
    # minimal: keeping one more ledger would be over the quota
    assert backlog_bytes_after(ledgers, Position(target.ledger_id, -1)) > limit
