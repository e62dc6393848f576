"""The broker offloader's pure glue: positions to ledgers, the managed-ledger list as offload.core's
views, the one offload record through the list's codec, and the managed-ledger transform of an
offload step."""

from __future__ import annotations

import pytest

from broker.managed_ledger.core import (LedgerInfo, LedgerInfoState, ManagedLedgerMetadata, OffloadRecord,
                                        OffloadState, Position, with_offload)
from broker.offloader import ledger_views, ledgers_before
from offload.core import ObjectStats, OffloadPolicy, plan_offload
from pulsarlite.errors import InvariantViolation
from pulsarlite.ledger_list import decode, encode

HOUR_MS = 3600 * 1000


def closed(ledger_id: int, size: int = 100, *, t: int = 0, state: OffloadState = OffloadState.NONE,
           offloaded_ms: int | None = None) -> LedgerInfo:
    stats = ObjectStats(10, 40, "0badf00d", t, t) if offloaded_ms is not None else None
    offload = OffloadRecord() if state is OffloadState.NONE else OffloadRecord(
        state, f"s3://b/{ledger_id}", "abcdef12", stats, offloaded_ms)
    return LedgerInfo(ledger_id, LedgerInfoState.CLOSED, entries=10, size_bytes=size, min_publish_time_ms=t,
                      max_publish_time_ms=t, created_ms=t, offload=offload)


def current(ledger_id: int, size: int = 0) -> LedgerInfo:
    return LedgerInfo(ledger_id, LedgerInfoState.OPEN, entries=1 if size else 0, size_bytes=size,
                      min_publish_time_ms=0 if size else None, max_publish_time_ms=0 if size else None)


def test_demand_before_position_takes_whole_closed_ledgers_only():
    ledgers = [closed(1), closed(2), current(3, 50)]
    assert ledgers_before(ledgers, Position(3, 0)) == [1, 2]
    assert ledgers_before(ledgers, Position(2, 5)) == [1]       # 2 still has entries at/after 2:5
    assert ledgers_before(ledgers, Position(2, 10)) == [1, 2]   # past 2's last entry
    assert ledgers_before(ledgers, Position(9, 0)) == [1, 2]    # never the open ledger


def test_views_feed_the_core_policy():
    ledgers = [closed(1, 100, t=0), closed(2, 100, t=HOUR_MS, state=OffloadState.OFFLOADED, offloaded_ms=5),
               closed(3, 100, t=2 * HOUR_MS), current(4, 50)]
    views = ledger_views(ledgers)
    assert [v.closed for v in views] == [True, True, True, False]
    assert views[1].state is OffloadState.OFFLOADED and views[1].offloaded_ms == 5
    assert views[2].closed_ms == 2 * HOUR_MS
    plan = plan_offload(views, OffloadPolicy(threshold_bytes=200, deletion_lag_ms=0), now_ms=10)
    assert plan.offload == (1,) and plan.delete_from_bookies == (2,)


def test_offload_record_round_trips_through_the_list_codec():
    stats = ObjectStats(rows=12, size_bytes=3456, checksum="0badf00d", min_publish_time_ms=1,
                        max_publish_time_ms=2)
    for record in (OffloadRecord(),
                   OffloadRecord(OffloadState.OFFLOADING, "s3://b/p/t/ledger-1-abcdef12.parquet", "abcdef12"),
                   OffloadRecord(OffloadState.OFFLOADED, "s3://b/p/t/ledger-1-abcdef12.parquet", "abcdef12",
                                 stats, offloaded_ms=99, extra={"future_key": [1, 2]})):
        assert OffloadRecord.from_json(record.to_json()) == record
    # what the managed-ledger codec stores and reads back is the same record
    md = ManagedLedgerMetadata((closed(1), current(2)))
    record = OffloadRecord(OffloadState.BOOKIE_DELETED, "file:///x/ledger-1-abcdef12.parquet", "abcdef12", stats,
                           offloaded_ms=7)
    md = with_offload(md, 1, record)
    assert decode(encode(md)).info(1).offload == record


def test_with_offload_only_on_closed_ledgers():
    md = ManagedLedgerMetadata((closed(1), current(2)))
    out = with_offload(md, 1, OffloadRecord(OffloadState.OFFLOADING, "s3://b/1.parquet", "abcdef12",
                                            extra={"started_ms": 5}))
    assert out.info(1).offload.state is OffloadState.OFFLOADING
    assert out.info(1).offload.extra == {"started_ms": 5}
    assert out.info(2) == md.info(2)
    with pytest.raises(InvariantViolation):
        with_offload(md, 2, OffloadRecord(OffloadState.OFFLOADING, "x", "abcdef12"))
    with pytest.raises(InvariantViolation):
        with_offload(md, 7, OffloadRecord(OffloadState.OFFLOADING, "x", "abcdef12"))
