"""The console's server-side logic (broker/admin/console.py): where a segment lives, the cluster
page's grouping, and the static files (only the named ones, never a path from the request)."""

from __future__ import annotations

import json

import pytest

from pulsarlite.metadata_documents import bookie_registration_data as registration_data
from pulsarlite.metadata_documents import bookie_registration_metrics_address as registration_metrics_address
from bookie.metrics import BookieMetrics
from broker.admin.console import (STATIC_FILES, TOPICS_LISTED_PER_BUNDLE_MAX, UNDER_REPLICATED_LISTED_MAX,
                                  BookieDisk, BrokerEntry, cluster_view, disk_text, format_bytes, parse_broker,
                                  parse_disk_gauges, segment_location, segments_view, static_file,
                                  topics_by_bundle)
from pulsarlite.config import BookieConfig
from broker.managed_ledger.core import LedgerInfo, LedgerInfoState, OffloadRecord, OffloadState
from pulsarlite.ledger_list import ObjectStats


def ledger(ledger_id: int, *, state=LedgerInfoState.CLOSED, offload=OffloadState.NONE, uri=None, entries=10):
    return LedgerInfo(ledger_id, state=state, entries=entries, size_bytes=100 * entries,
                      min_publish_time_ms=1_000 * ledger_id if entries else None,
                      max_publish_time_ms=1_000 * ledger_id + 999 if entries else None, created_ms=5,
                      offload=offload_record(offload, uri))


def offload_record(state, uri):
    if state is OffloadState.NONE:
        return OffloadRecord()
    stats = (ObjectStats(1, 10, "0badf00d", None, None)
             if state in (OffloadState.OFFLOADED, OffloadState.BOOKIE_DELETED) else None)
    return OffloadRecord(state, uri, "abcdef12", stats, 1 if stats else None)


@pytest.mark.parametrize("current, offload, expected", [
    (True, "none", "open"),
    (False, "none", "bookies"),
    (False, "offloading", "bookies"),             # the bookie copy is still the one read
    (False, "offloaded", "bookies"),              # offloaded, bookie copy not yet deleted
    (False, "bookie-deleted", "offloaded"),
])
def test_segment_location(current, offload, expected):
    assert segment_location(current, offload) == expected


def test_segments_view_draws_each_ledger_where_it_lives():
    ledgers = [ledger(1, offload=OffloadState.BOOKIE_DELETED, uri="file:///tier/1.parquet"),
               ledger(2, offload=OffloadState.OFFLOADED, uri="file:///tier/2.parquet"),
               ledger(3), ledger(4, state=LedgerInfoState.OPEN, entries=0)]
    ensembles = {2: [(0, ("b1", "b2"))], 3: [(0, ("b1", "b2")), (5, ("b1", "b3"))], 4: [(0, ("b2", "b3"))]}
    got = segments_view(ledgers, ensembles, [3, 99], open_current=True)
    assert [s["location"] for s in got] == ["offloaded", "bookies", "bookies", "open"]
    assert got[0]["offloadUri"] == "file:///tier/1.parquet" and got[0]["ensembles"] is None
    assert got[1]["offloadUri"] == "file:///tier/2.parquet" and got[1]["offloadState"] == "offloaded"
    assert got[2]["ensembles"] == [{"firstEntry": 0, "bookies": ["b1", "b2"]},
                                   {"firstEntry": 5, "bookies": ["b1", "b3"]}]
    assert [s["underReplicated"] for s in got] == [False, False, True, False]
    assert (got[2]["minPublishTimeMs"], got[2]["maxPublishTimeMs"]) == (3000, 3999)
    assert got[3]["minPublishTimeMs"] is None and got[3]["entries"] == 0
    json.dumps(got)                                       # the answer is JSON as it is


def test_segments_view_of_a_topic_not_loaded_has_no_open_segment():
    """Read from the stored list (no owner writing): its last ledger is shown on the bookies."""
    got = segments_view([ledger(7, state=LedgerInfoState.OPEN)], {7: [(0, ("b1",))]}, [], open_current=False)
    assert got[0]["location"] == "bookies"


def test_cluster_view_groups_bundles_and_bookies():
    brokers = [BrokerEntry("b-2", "pulsar://h:2", "http://h:20"), BrokerEntry("b-1", "pulsar://h:1", "http://h:10")]
    owners = {"public/default/0x00000000_0x80000000": "b-1", "public/default/0x80000000_0xffffffff": "b-2",
              "t/ns/0x00000000_0xffffffff": "gone"}
    topics = {"public/default/0x00000000_0x80000000": ["persistent://public/default/a"]}
    got = cluster_view(brokers, owners, topics, ["bk-1", "bk-2"], ["bk-3", "bk-2"], list(range(150)))
    assert [b["id"] for b in got["brokers"]] == ["b-1", "b-2"]
    assert got["brokers"][0] == {"id": "b-1", "pulsarUrl": "pulsar://h:1", "httpUrl": "http://h:10", "bundles": [
        {"bundle": "public/default/0x00000000_0x80000000", "topics": ["persistent://public/default/a"]}]}
    assert got["brokers"][1]["bundles"] == [{"bundle": "public/default/0x80000000_0xffffffff", "topics": []}]
    assert got["orphanBundles"] == ["t/ns/0x00000000_0xffffffff"]
    assert [(b["id"], b["mode"]) for b in got["bookies"]] == [("bk-1", "writable"), ("bk-2", "readonly"),
                                                            ("bk-3", "readonly")]
    assert all(b["disk"] == "unknown" and b["diskFreeBytes"] is None for b in got["bookies"])  # no disks given
    assert got["underReplicatedLedgers"]["count"] == 150
    assert got["underReplicatedLedgers"]["ledgers"] == list(range(UNDER_REPLICATED_LISTED_MAX))


def test_topics_by_bundle_is_bounded_and_sorted():
    topics = [f"persistent://t/ns/x{i:04d}" for i in range(TOPICS_LISTED_PER_BUNDLE_MAX + 5)][::-1]
    got = topics_by_bundle(topics, lambda t: "t/ns/A" if t.endswith(("0", "2", "4", "6", "8")) else "t/ns/B")
    assert set(got) == {"t/ns/A", "t/ns/B"}
    assert all(v == sorted(v) and len(v) <= TOPICS_LISTED_PER_BUNDLE_MAX for v in got.values())


@pytest.mark.parametrize("data, expected", [
    (b'{"broker_id": "b-1", "pulsar_url": "pulsar://h:1", "http_url": "http://h:8"}',
     BrokerEntry("b-1", "pulsar://h:1", "http://h:8")),
    (b"\xff not json", BrokerEntry("b-1", "", "")),
    (b"[1, 2]", BrokerEntry("b-1", "", "")),
])
def test_parse_broker(data, expected):
    assert parse_broker("b-1", data) == expected


def test_static_files_only_by_name():
    for name, content_type in STATIC_FILES.items():
        body, got_type = static_file(name)
        assert body and got_type == content_type
    assert b"/console/console.js" in static_file("index.html")[0]
    for bad in ("../console.py", "console.py", "__init__.py", "/etc/passwd", "", "index.html/.."):
        assert static_file(bad) is None


# -- free disk per bookie: the registration's metrics address, the gauges, the text --------------
def test_disk_gauges_parsed_from_a_real_bookie_exposition():
    """The text a bookie's /metrics serves (bookie/metrics.py's registry, histograms and all)."""
    metrics = BookieMetrics()
    metrics.journal_sync_s.observe(0.001)
    metrics.entries_added(5, 1)
    metrics.disk_checked(0.8125, 123_456_789_012, read_only=False)
    assert parse_disk_gauges(metrics.exposition().decode()) == BookieDisk(123_456_789_012, 0.8125)


@pytest.mark.parametrize("text", [
    "",
    "bookie_disk_free_bytes 100\n",                                   # the ratio missing
    "bookie_disk_used_ratio 0.5\n",                                   # the free bytes missing
    "bookie_disk_free_bytes abc\nbookie_disk_used_ratio 0.5\n",       # not a number
    "bookie_disk_free_bytes NaN\nbookie_disk_used_ratio 0.5\n",
    "bookie_disk_free_bytes -1\nbookie_disk_used_ratio 0.5\n",
    "bookie_disk_free_bytes 100\nbookie_disk_used_ratio 1.5\n",       # not a fraction
    "bookie_disk_free_bytes_total 100\nbookie_disk_used_ratio_x 0.5\n",  # other names
    "<html>502 Bad Gateway</html>",
])
def test_disk_gauges_absent_or_bad_are_unknown(text):
    assert parse_disk_gauges(text) is None


def test_disk_gauges_with_timestamps_and_comments():
    text = ("# HELP bookie_disk_free_bytes Free bytes\n# TYPE bookie_disk_free_bytes gauge\n"
            "bookie_disk_free_bytes 2.5e+09 1700000000000\nbookie_disk_used_ratio 0.25\n")
    assert parse_disk_gauges(text) == BookieDisk(2_500_000_000, 0.25)


@pytest.mark.parametrize("n, expected", [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (150 * 1024 ** 2, "150 MiB"),
    (int(12.34 * 1024 ** 3), "12.3 GiB"), (3 * 1024 ** 5, "3072 TiB"),
])
def test_format_bytes(n, expected):
    assert format_bytes(n) == expected


def test_disk_text():
    assert disk_text(None) == "unknown"
    assert disk_text(BookieDisk(int(12.34 * 1024 ** 3), 0.8125)) == "12.3 GiB free (81% used)"


def test_cluster_view_shows_each_bookies_disk_or_unknown():
    disks = {"bk-1": BookieDisk(1024, 0.5), "bk-3": None, "not-live": BookieDisk(1, 0.1)}
    got = cluster_view([], {}, {}, ["bk-1", "bk-2"], ["bk-3"], [], disks)["bookies"]
    assert got == [
        {"id": "bk-1", "mode": "writable", "diskFreeBytes": 1024, "diskUsedRatio": 0.5, "disk": "1.0 KiB free (50% used)"},
        {"id": "bk-2", "mode": "writable", "diskFreeBytes": None, "diskUsedRatio": None, "disk": "unknown"},
        {"id": "bk-3", "mode": "readonly", "diskFreeBytes": None, "diskUsedRatio": None, "disk": "unknown"}]
    json.dumps(got)


def test_registration_data_records_the_metrics_address():
    assert registration_metrics_address(registration_data("127.0.0.1:3181", "127.0.0.1:8000")) == "127.0.0.1:8000"
    assert registration_metrics_address(registration_data("[::1]:3181", "[::1]:8000")) == "[::1]:8000"
    assert registration_metrics_address(registration_data("127.0.0.1:3181")) is None        # no metrics port


@pytest.mark.parametrize("data", [
    b"127.0.0.1:3181",                                  # a bookie of before: its id as the data
    b"", b"\xff", b"[1]", b'{"metrics": 8000}', b'{"metrics": "h"}', b'{"metrics": "h:0"}',
    b'{"metrics": "h:70000"}', b'{"metrics": ":8000"}', b'{"metrics": "evil.example/x?:80"}',
    b'{"metrics": "user@h:80"}',
])
def test_registration_without_a_usable_metrics_address(data):
    assert registration_metrics_address(data) is None


@pytest.mark.parametrize("host, bookie_id, port, expected", [
    ("127.0.0.1", "", 8000, "127.0.0.1:8000"),
    ("0.0.0.0", "10.0.0.5:3181", 8000, "10.0.0.5:8000"),      # a wildcard listen: the id's host
    ("::", "[fd00::5]:3181", 8000, "[fd00::5]:8000"),
    ("::1", "", 8000, "[::1]:8000"),
    ("127.0.0.1", "", 0, ""),                                 # no metrics port: nothing recorded
])
def test_bookie_metrics_address(host, bookie_id, port, expected):
    assert BookieConfig(host=host, bookie_id=bookie_id, port=3181, metrics_port=port).metrics_address == expected
