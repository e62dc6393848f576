"""The Spark source's ``readCompacted`` (pure parts): planning over a compacted view, the view
read from the managed-ledger znode, and the rows of compacted-ledger entries filtered by their
ack sets (the codec of pulsarlite/wire/compacted.py, the entry decoder of offload/format.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from spark_source.metadata import parse_compacted_view, parse_ledger_list
from spark_source.options import OptionError, parse_options
from spark_source.plan import (CompactedSegment, DataLossError, LedgerSegment, Location, PartitionLedgers,
                               PlanReport, Position, ScanRequest, plan_partition, plan_partition_compacted,
                               scan_from_dict, scan_to_dict)
from spark_source.scan import ack_set_indexes, filter_compacted_rows, rows_of_compacted
from pulsarlite.wire.compacted import encode_compacted
from pulsarlite.wire.entry import Message, build_batch_entry, build_entry

T = "persistent://public/default/t"


def seg(lid, last):
    return LedgerSegment(lid, True, last, 1000, None, None)


def plan(p, req=ScanRequest(), fail=True):
    return plan_partition_compacted(p, req, fail_on_data_loss=fail, report=PlanReport())


def ranges(scans):
    return [(s.location, s.ledger_id, s.first_entry_id, s.last_entry_id) for s in scans]


def test_view_then_the_segments_strictly_after_the_horizon():
    p = PartitionLedgers(T, -1, (seg(1, 3), seg(2, 3), seg(4, 2)), CompactedSegment(9, Position(2, 1), 5))
    scans = plan(p)
    assert ranges(scans) == [(Location.COMPACTED, 9, 0, 4), (Location.BOOKIES, 2, 2, 3),
                             (Location.BOOKIES, 4, 0, 2)]
    assert scans[0].start == Position(0, 0) and scans[0].end is None
    # the scan goes to the Python source as planned (plannedSegments)
    assert scan_from_dict(json.loads(json.dumps(scan_to_dict(scans[0])))) == scans[0]
    # horizon at the end of a ledger: the next ledger from its start
    p2 = PartitionLedgers(T, -1, p.ledgers, CompactedSegment(9, Position(2, 3), 5))
    assert ranges(plan(p2))[1:] == [(Location.BOOKIES, 4, 0, 2)]


def test_no_view_reads_the_whole_topic():
    p = PartitionLedgers(T, -1, (seg(1, 3), seg(2, 3)))
    assert plan(p) == plan_partition(p, ScanRequest(), fail_on_data_loss=True, report=PlanReport())


def test_horizon_ledger_trimmed_by_retention_is_not_data_loss():
    p = PartitionLedgers(T, -1, (seg(5, 3),), CompactedSegment(9, Position(2, 1), 3))
    assert ranges(plan(p)) == [(Location.COMPACTED, 9, 0, 2), (Location.BOOKIES, 5, 0, 3)]
    # a start after the horizon but before the first stored ledger still is
    with pytest.raises(DataLossError):
        plan(p, ScanRequest(start=Position(3, 0)))


def test_start_and_end_positions():
    p = PartitionLedgers(T, -1, (seg(1, 3), seg(2, 3)), CompactedSegment(9, Position(2, 1), 4))
    # a start inside the view: the view (filtered by position on read) and the rest
    scans = plan(p, ScanRequest(start=Position(1, 2), end=Position(2, 3)))
    assert ranges(scans) == [(Location.COMPACTED, 9, 0, 3), (Location.BOOKIES, 2, 2, 2)]
    assert scans[0].start == Position(1, 2) and scans[0].end == Position(2, 3)
    # a start after the horizon: no view
    assert ranges(plan(p, ScanRequest(start=Position(2, 3)))) == [(Location.BOOKIES, 2, 3, 3)]
    # an end within the view: nothing after the horizon
    assert ranges(plan(p, ScanRequest(end=Position(1, 1)))) == [(Location.COMPACTED, 9, 0, 3)]


def test_view_parsed_from_the_same_znode_as_the_list():
    from broker.compaction import CompactedView
    from broker.compaction.core import new_view_properties
    from broker.managed_ledger import Position as BrokerPosition
    from pulsarlite.ledger_list import ManagedLedgerMetadata, encode
    written = new_view_properties({}, CompactedView(9, BrokerPosition(2, 1), 5))     # what the broker records
    data = encode(ManagedLedgerMetadata(properties=written))
    assert parse_compacted_view(T, parse_ledger_list(T, data).properties) == CompactedSegment(9, Position(2, 1), 5)
    assert parse_compacted_view(T, parse_ledger_list(T, encode(ManagedLedgerMetadata())).properties) is None
    with pytest.raises(ValueError, match=f"topic {T}: malformed pulsarlite.compaction property .*missing key 'horizon'"):
        parse_compacted_view(T, {"pulsarlite.compaction": "{\"ledger\": 9}"})


def test_option_is_batch_only():
    assert parse_options({"topic": T, "readCompacted": "true"}, streaming=False).read_compacted
    assert not parse_options({"topic": T}, streaming=False).read_compacted
    with pytest.raises(OptionError, match="readCompacted"):
        parse_options({"topic": T, "readCompacted": "true"}, streaming=True)
    with pytest.raises(OptionError):
        parse_options({"topic": T, "readCompacted": "maybe"}, streaming=False)


def test_ack_set_words():
    assert ack_set_indexes([0b1010]) == [1, 3]
    assert ack_set_indexes([-1]) == list(range(64))          # signed words, as Java's BitSet
    assert ack_set_indexes([0, 1]) == [64]


def test_rows_of_compacted_entries_keep_original_ids_and_only_the_ack_set():
    batch = build_batch_entry([Message(b"a", key="k4"), Message(b"a", key="k5"), Message(b"b", key="k4")],
                              producer_name="p", sequence_id=10, publish_time_ms=1000)
    single = build_entry(Message(b"v2", key="k1"), producer_name="p", sequence_id=3, publish_time_ms=900)
    entries = [SimpleNamespace(entry_id=i, payload=raw) for i, raw in enumerate([
        encode_compacted(7, 2, None, single),
        encode_compacted(7, 5, [0b110], batch),                # batch indexes 1 and 2 survive
        encode_compacted(8, 0, None, single)])]
    tables = list(rows_of_compacted(entries, partition=-1))
    assert len(tables) == 2                                    # one per original ledger
    got = [(r["ledger_id"], r["entry_id"], r["batch_index"], r["key"], bytes(r["value"]))
           for t in tables for r in t.to_pylist()]
    assert got == [(7, 2, -1, "k1", b"v2"), (7, 5, 1, "k5", b"a"), (7, 5, 2, "k4", b"b"), (8, 0, -1, "k1", b"v2")]
    # the position range is over original ids
    scan = plan(PartitionLedgers(T, -1, (), CompactedSegment(9, Position(8, 0), 3)),
                ScanRequest(start=Position(7, 5, 2), end=Position(8, 0)))[0]
    kept = filter_compacted_rows(tables[0], scan)
    assert [(r["entry_id"], r["batch_index"]) for r in kept.to_pylist()] == [(5, 2)]
    assert filter_compacted_rows(tables[1], scan).num_rows == 0
