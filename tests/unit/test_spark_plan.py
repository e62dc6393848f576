"""The Spark source's pure planning: segment ranges, pruning, bin-packing, options, filters."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_source.options import OptionError, parse_options
from spark_source.plan import (DataLossError, LedgerSegment, Location, PartitionLedgers, PlanReport, Position,
                               ScanRequest, next_position, pack, plan_partition)

T = "persistent://public/default/t"


def seg(lid, last, *, closed=True, size=1000, tmin=None, tmax=None, state="none", uri=None):
    return LedgerSegment(lid, closed, last, size, tmin, tmax, state, uri)


def part(*ledgers):
    return PartitionLedgers(T, -1, tuple(ledgers))


def ranges(scans):
    return [(s.ledger_id, s.first_entry_id, s.last_entry_id) for s in scans]


def test_whole_topic_and_locations():
    p = part(seg(1, 9, state="bookie-deleted", uri="s3://b/1.parquet"), seg(2, -1), seg(3, 4, closed=False, size=0))
    scans = plan_partition(p, ScanRequest(), fail_on_data_loss=True, report=PlanReport())
    assert ranges(scans) == [(1, 0, 9), (3, 0, 4)]
    assert [s.location for s in scans] == [Location.TIER, Location.BOOKIES]
    assert scans[0].uri == "s3://b/1.parquet" and scans[1].uri is None
    # offloading (not done yet) is still read from the bookies
    assert seg(1, 9, state="offloading", uri="s3://x").location is Location.BOOKIES


def test_start_and_end_positions():
    p = part(seg(1, 9), seg(2, 9), seg(3, 9))
    scans = plan_partition(p, ScanRequest(start=Position(1, 5), end=Position(3, 2)), fail_on_data_loss=True,
                           report=PlanReport())
    assert ranges(scans) == [(1, 5, 9), (2, 0, 9), (3, 0, 1)]
    # an end inside a batch includes that entry (rows are cut by batch index at read time)
    scans = plan_partition(p, ScanRequest(end=Position(2, 3, 1)), fail_on_data_loss=True, report=PlanReport())
    assert ranges(scans) == [(1, 0, 9), (2, 0, 3)]
    # a start past a ledger's end moves on to the next ledger
    scans = plan_partition(p, ScanRequest(start=Position(1, 10)), fail_on_data_loss=True, report=PlanReport())
    assert ranges(scans) == [(2, 0, 9), (3, 0, 9)]


def test_data_loss():
    p = part(seg(5, 9))
    with pytest.raises(DataLossError, match="before the first stored ledger"):
        plan_partition(p, ScanRequest(start=Position(2, 0)), fail_on_data_loss=True, report=PlanReport())
    report = PlanReport()
    assert ranges(plan_partition(p, ScanRequest(start=Position(2, 0)), fail_on_data_loss=False,
                                 report=report)) == [(5, 0, 9)]
    assert report.data_loss


def test_time_pruning_keeps_unknown_ranges():
    p = part(seg(1, 9, tmin=100, tmax=200), seg(2, 9, tmin=300, tmax=400), seg(3, 9, closed=False))
    report = PlanReport()
    scans = plan_partition(p, ScanRequest(publish_time_min_ms=250), fail_on_data_loss=True, report=report)
    assert ranges(scans) == [(2, 0, 9), (3, 0, 9)]
    assert report.pruned_by_time == [f"{T}:1"]
    scans = plan_partition(p, ScanRequest(publish_time_max_ms=250), fail_on_data_loss=True, report=PlanReport())
    assert ranges(scans) == [(1, 0, 9), (3, 0, 9)]


def test_entry_budget_and_next_position():
    p = part(seg(1, 9), seg(2, 9))
    scans = plan_partition(p, ScanRequest(start=Position(1, 4), entries_max=8), fail_on_data_loss=True,
                           report=PlanReport())
    assert ranges(scans) == [(1, 4, 9), (2, 0, 1)]
    assert next_position(scans, None) == Position(2, 2)
    assert next_position([], Position(7, 0)) == Position(7, 0)


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=12),
       st.integers(min_value=0, max_value=60), st.integers(min_value=1, max_value=40))
def test_budgeted_reads_cover_everything_once(lasts, start_entry, budget):
    """Reading in budgeted steps from the start visits every entry exactly once, in order."""
    p = part(*[seg(i + 1, last - 1) for i, last in enumerate(lasts)])
    everything = [(lg.ledger_id, e) for lg in p.ledgers for e in range(lg.entries)]
    pos = None
    seen = []
    for _ in range(10_000):
        scans = plan_partition(p, ScanRequest(start=pos, entries_max=budget), fail_on_data_loss=True,
                               report=PlanReport())
        if not scans:
            break
        assert sum(s.entries for s in scans) <= budget
        seen.extend((s.ledger_id, e) for s in scans for e in range(s.first_entry_id, s.last_entry_id + 1))
        pos = next_position(scans, pos)
    assert seen == everything


def test_pack():
    p = part(*[seg(i, 9, size=s) for i, s in enumerate([10, 10, 100, 10, 10, 10], start=1)])
    scans = plan_partition(p, ScanRequest(), fail_on_data_loss=True, report=PlanReport())
    groups = pack(scans, target_bytes=30, open_size_bytes=5, open_cost_bytes=1)
    assert [[s.ledger_id for s in g] for g in groups] == [[1, 2], [3], [4, 5, 6]]
    # min_partitions shrinks the target so small scans spread
    groups = pack(scans, target_bytes=10_000, open_size_bytes=5, min_partitions=3, open_cost_bytes=1)
    assert len(groups) >= 3
    assert pack([], target_bytes=1, open_size_bytes=1) == []


def test_options():
    o = parse_options({"topic": "t", "startingOffsets": '{"t": "1:2:-1:-1"}', "endingTime": "5"},
                      streaming=False)
    assert o.topics == ("t",) and o.ending_time_ms == 5
    assert o.starting.for_partition("persistent://public/default/t") == "1:2:-1:-1"
    assert o.starting.for_partition("persistent://public/default/other") == "earliest"
    for bad, match in [({}, "topic"), ({"topic": "t", "startingOffsets": "[1]"}, "JSON must be an object"),
                       ({"topic": "t", "startingOffsets": '{"t": "x:y"}'}, "integers"),
                       ({"topic": "t", "startingTime": "soon"}, "startingTime"),
                       ({"topic": "t", "startingTime": "9", "endingTime": "3"}, "before"),
                       ({"topic": "t", "failOnDataLoss": "maybe"}, "failOnDataLoss")]:
        with pytest.raises(OptionError, match=match):
            parse_options(bad, streaming=False)
    with pytest.raises(OptionError, match="batch queries only"):
        parse_options({"topic": "t", "endingOffsets": "latest"}, streaming=True)


def test_pushed_publish_time_filters():
    from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, LessThan

    from spark_source.source import publish_time_bounds
    t = datetime(2026, 1, 1, tzinfo=timezone.utc)
    ms = int(t.timestamp() * 1000)
    (lo, hi), used = publish_time_bounds([GreaterThanOrEqual(("publish_time",), t),
                                          LessThan(("publish_time",), t + timedelta(seconds=1)),
                                          EqualTo(("key",), "x")])
    assert (lo, hi) == (ms, ms + 999) and len(used) == 2
    (lo, hi), _ = publish_time_bounds([GreaterThan(("publish_time",), t + timedelta(microseconds=1500))])
    assert (lo, hi) == (ms + 2, None)
