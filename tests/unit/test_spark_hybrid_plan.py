"""The pure parts of ``spark_source.read_topic``: which segments go native, Spark paths, whole
ledgers, the plan handed to the Python source, and the admin answer saying where metadata is."""

from __future__ import annotations

import json

import pytest

from spark_source.discovery import admin_token, parse_answer
from spark_source.hybrid import is_whole_ledger, spark_path, split_scans
from spark_source.options import OptionError, parse_options
from spark_source.plan import (LedgerSegment, Location, Position, SegmentScan, narrow_time, scan_from_dict,
                               scan_to_dict)


def scan(ledger_id, location=Location.TIER, uri="file:///t/x.parquet", first=0, last=9, start=None, end=None,
         tmin=None, tmax=None):
    return SegmentScan(topic="persistent://t/n/x", partition=-1, ledger_id=ledger_id, first_entry_id=first,
                       last_entry_id=last, location=location, uri=uri if location is Location.TIER else None,
                       start=start or Position(ledger_id, 0), end=end, publish_time_min_ms=tmin,
                       publish_time_max_ms=tmax, size_bytes_estimate=100 * ledger_id)


def test_split_file_native_s3_only_with_s3a_bookies_python():
    scans = [scan(1), scan(2, uri="s3://b/p/2.parquet"), scan(3, Location.BOOKIES), scan(4)]
    without = split_scans(scans, s3a=False)
    assert [s.ledger_id for s in without.native] == [1, 4]
    assert [s.ledger_id for s in without.python] == [2, 3]
    assert without.fallback_s3 == 1
    assert without.bytes_of(without.native) == 500
    with_s3a = split_scans(scans, s3a=True)
    assert [s.ledger_id for s in with_s3a.native] == [1, 2, 4] and with_s3a.fallback_s3 == 0
    excluded = split_scans(scans, s3a=True, excluded=frozenset({4}))
    assert [s.ledger_id for s in excluded.python] == [3, 4]
    # every planned segment in exactly one part
    for split in (without, with_s3a, excluded):
        assert sorted(s.ledger_id for s in split.native + split.python) == [1, 2, 3, 4]


def test_spark_paths():
    assert spark_path("file:///tmp/t/a.parquet") == "file:///tmp/t/a.parquet"
    assert spark_path("s3://bucket/pre/a.parquet") == "s3a://bucket/pre/a.parquet"
    with pytest.raises(ValueError):
        spark_path("gs://bucket/a.parquet")


def test_whole_ledger():
    lg = LedgerSegment(ledger_id=5, closed=True, last_entry_id=9, size_bytes=1, min_publish_time_ms=None,
                       max_publish_time_ms=None, offload_state="offloaded", offload_uri="file:///x")
    assert is_whole_ledger(scan(5), lg)
    assert not is_whole_ledger(scan(5, first=1), lg)
    assert not is_whole_ledger(scan(5, last=8), lg)
    assert not is_whole_ledger(scan(5, start=Position(5, 0, 3)), lg)
    assert not is_whole_ledger(scan(5, end=Position(5, 9, 2)), lg)
    assert is_whole_ledger(scan(5, end=Position(6, 0)), lg)
    assert not is_whole_ledger(scan(5), None)


def test_planned_segments_round_trip_through_the_option():
    scans = [scan(1, start=Position(1, 2, 3), end=Position(1, 8, 1), tmin=5, tmax=9),
             scan(2, Location.BOOKIES)]
    text = json.dumps([scan_to_dict(s) for s in scans])
    opts = parse_options({"topic": "persistent://t/n/x", "plannedSegments": text}, streaming=False)
    assert opts.planned_scans == tuple(scans)
    assert parse_options({"topic": "persistent://t/n/x"}, streaming=False).planned_scans is None
    for bad in ("{}", "[1]", '[{"topic": "x"}]', "not json"):
        with pytest.raises(OptionError, match="plannedSegments"):
            parse_options({"topic": "persistent://t/n/x", "plannedSegments": bad}, streaming=False)
    with pytest.raises(ValueError):
        scan_from_dict(dict(scan_to_dict(scans[0]), location="moon"))


def test_narrow_time_only_tightens():
    s = scan(1, tmin=10, tmax=20)
    assert (narrow_time(s, 5, 30).publish_time_min_ms, narrow_time(s, 5, 30).publish_time_max_ms) == (10, 20)
    n = narrow_time(s, 12, 15)
    assert (n.publish_time_min_ms, n.publish_time_max_ms) == (12, 15)
    n = narrow_time(scan(1), None, 7)
    assert (n.publish_time_min_ms, n.publish_time_max_ms) == (None, 7)


def test_metadata_answer():
    got = parse_answer("http://b:8080", b'{"zookeeper": "zk:2181", "tierUri": "s3://b/p", '
                                        b'"tierS3EndpointUrl": "http://s3:9000"}')
    assert got == {"zookeeper": "zk:2181", "tier_uri": "s3://b/p", "tier_s3_endpoint_url": "http://s3:9000"}
    for bad in (b"[]", b"{}", b'{"zookeeper": ""}', b"nope"):
        with pytest.raises(OptionError, match="option zookeeper"):
            parse_answer("http://b:8080", bad)


def test_admin_token_options(tmp_path):
    assert admin_token({}) == ""
    assert admin_token({"adminToken": " t "}) == "t"
    f = tmp_path / "tok"
    f.write_text("secret\n")
    assert admin_token({"adminTokenFile": str(f)}) == "secret"
    with pytest.raises(OptionError, match="at most one"):
        admin_token({"adminToken": "a", "adminTokenFile": str(f)})
    with pytest.raises(OptionError, match="cannot read"):
        admin_token({"adminTokenFile": str(tmp_path / "missing")})
