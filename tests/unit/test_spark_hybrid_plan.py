"""The pure parts of ``spark_source.read_topic``: which segments go native, Spark paths, whole
ledgers, the plan handed to the Python source, and the admin answer saying where metadata is."""

from __future__ import annotations

import json

import pytest

from spark_source.discovery import admin_token, parse_answer
from spark_source.hybrid import (derived_columns, is_whole_ledger, position_condition, s3a_settings, spark_path,
                                  split_scans, sql_string, time_condition)
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


def test_admin_token_parsed_into_the_source_options(tmp_path):
    """The token the planner's admin calls carry (an open ledger's last confirmed entry): the
    same options as discovery; a file is read when the call is made, not when options parse."""
    base = {"topic": "persistent://t/n/x"}
    assert parse_options(base, streaming=False).admin_bearer() == ""
    opts = parse_options(dict(base, adminToken=" tok-9f3a "), streaming=False)
    assert opts.admin_bearer() == "tok-9f3a" and "tok-9f3a" not in repr(opts)
    f = tmp_path / "tok"
    missing = parse_options(dict(base, adminTokenFile=str(f)), streaming=False)      # parses: read later
    with pytest.raises(OptionError, match="cannot read"):
        missing.admin_bearer()
    f.write_text("secret\n")
    assert missing.admin_bearer() == "secret"
    with pytest.raises(OptionError, match="at most one"):
        parse_options(dict(base, adminToken="a", adminTokenFile=str(f)), streaming=False)


def test_sql_string_is_the_utf8_bytes_whatever_they_hold():
    assert sql_string("persistent://t/n/x") == "CAST(X'" + b"persistent://t/n/x".hex() + "' AS STRING)"
    for text in ("it's", "back\\slash", "ünï", "a' OR '1'='1", ""):
        got = sql_string(text)
        assert got.startswith("CAST(X'") and got.endswith("' AS STRING)")
        assert bytes.fromhex(got[len("CAST(X'"):-len("' AS STRING)")]).decode("utf-8") == text


def test_position_condition_keeps_the_planned_rows_only():
    lg = {i: LedgerSegment(ledger_id=i, closed=True, last_entry_id=9, size_bytes=1, min_publish_time_ms=None,
                           max_publish_time_ms=None, offload_state="offloaded", offload_uri="file:///x")
          for i in (1, 2, 3)}
    assert position_condition([scan(1), scan(2)], lg) is None                   # whole ledgers: no filter
    got = position_condition([scan(1), scan(2, first=3, last=7, start=Position(2, 3, 2), end=Position(2, 7, 1))],
                             lg)
    assert got == ("ledger_id IN (1) OR (ledger_id = 2 AND entry_id >= 3 AND entry_id <= 7 "
                   "AND NOT (entry_id = 3 AND batch_index < 2) AND NOT (entry_id = 7 AND batch_index >= 1))")
    # a partial ledger alone; an end in the next ledger does not cut this one
    assert position_condition([scan(3, first=4, end=Position(4, 0))], lg) == (
        "(ledger_id = 3 AND entry_id >= 4 AND entry_id <= 9)")


def test_time_condition_and_derived_columns():
    assert time_condition(scan(1)) is None
    assert time_condition(scan(1, tmin=5)) == "publish_time >= timestamp_millis(5)"
    assert time_condition(scan(1, tmin=5, tmax=9)) == ("publish_time >= timestamp_millis(5) AND "
                                                        "publish_time < timestamp_millis(10)")
    d = derived_columns("persistent://t/n/x-partition-2", 2)
    assert d == {"topic": sql_string("persistent://t/n/x-partition-2"), "partition": "CAST(2 AS INT)",
                 "message_id": "concat_ws(':', ledger_id, entry_id, '2', batch_index)"}
    assert derived_columns("persistent://t/n/x", -1)["message_id"] == (
        "concat_ws(':', ledger_id, entry_id, '-1', batch_index)")


def test_s3a_settings_are_the_keys_hadoop_aws_reads():
    """The exact S3A keys (hadoop-aws): fs.s3a.endpoint, fs.s3a.path.style.access,
    fs.s3a.connection.ssl.enabled, fs.s3a.access.key / secret.key / session.token (with the
    temporary-credentials provider, the one that reads a session token), fs.s3a.endpoint.region.
    Never run against S3A here (no hadoop-aws on this machine's Spark)."""
    assert s3a_settings(None, {}) == {"fs.s3a.path.style.access": "true"}
    env = {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_DEFAULT_REGION": "eu-west-1"}
    assert s3a_settings("http://127.0.0.1:9000", env) == {
        "fs.s3a.path.style.access": "true", "fs.s3a.endpoint": "http://127.0.0.1:9000",
        "fs.s3a.connection.ssl.enabled": "false", "fs.s3a.access.key": "AK", "fs.s3a.secret.key": "SK",
        "fs.s3a.endpoint.region": "eu-west-1"}
    got = s3a_settings("HTTPS://s3.example", dict(env, AWS_SESSION_TOKEN="ST"))
    assert got["fs.s3a.connection.ssl.enabled"] == "true"
    assert got["fs.s3a.session.token"] == "ST"
    assert got["fs.s3a.aws.credentials.provider"] == "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    # a key without its secret (or a token without both) is not passed: S3A's own chain decides
    assert s3a_settings(None, {"AWS_ACCESS_KEY_ID": "AK", "AWS_SESSION_TOKEN": "ST"}) == {
        "fs.s3a.path.style.access": "true"}


def test_s3a_options_take_the_read_options_over_the_environment(monkeypatch):
    from spark_source.hybrid import _s3a_options
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENV-AK")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENV-SK")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    base = {"topic": "persistent://t/n/x", "s3_endpoint_url": "http://s3:9000"}
    got = _s3a_options(parse_options(base, streaming=False))
    assert (got["fs.s3a.access.key"], got["fs.s3a.secret.key"], got["fs.s3a.endpoint"]) == (
        "ENV-AK", "ENV-SK", "http://s3:9000")
    got = _s3a_options(parse_options(dict(base, aws_access_key_id="OPT-AK", aws_secret_access_key="OPT-SK"),
                                     streaming=False))
    assert (got["fs.s3a.access.key"], got["fs.s3a.secret.key"]) == ("OPT-AK", "OPT-SK")
