"""The console's server-side logic (broker/admin/console.py): where a segment lives, the cluster
page's grouping, and the static files (only the named ones, never a path from the request)."""

from __future__ import annotations

import json

import pytest

from broker.admin.console import (STATIC_FILES, TOPICS_LISTED_PER_BUNDLE_MAX, UNDER_REPLICATED_LISTED_MAX,
                                  BrokerEntry, cluster_view, parse_broker, segment_location, segments_view,
                                  static_file, topics_by_bundle)
from broker.managed_ledger.core import LedgerInfo, LedgerInfoState, OffloadInfo, OffloadState


def ledger(ledger_id: int, *, state=LedgerInfoState.CLOSED, offload=OffloadState.NONE, uri=None, entries=10):
    return LedgerInfo(ledger_id, state=state, entries=entries, size_bytes=100 * entries,
                      min_publish_time_ms=1_000 * ledger_id if entries else None,
                      max_publish_time_ms=1_000 * ledger_id + 999 if entries else None, created_ms=5,
                      offload=OffloadInfo(offload, uri))


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
    assert got["bookies"] == [{"id": "bk-1", "mode": "writable"}, {"id": "bk-2", "mode": "readonly"},
                              {"id": "bk-3", "mode": "readonly"}]
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
