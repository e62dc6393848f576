"""Compaction and retention (issue 32 item 6), against real processes with the official client:
the ``__compaction`` cursor keeps the ledgers after the horizon from being trimmed (as a
subscription does); ledgers before the horizon may be trimmed while the compacted view, kept in
its own ledger that retention never deletes, still serves their messages under their original
ids; topic ownership moved to another broker serves the same view (from the metadata)."""

from __future__ import annotations

import pytest
import requests

from tests.integration.compaction_helpers import compact_and_wait, read_messages
from tests.integration.helpers import wait_for

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

NS = "public/default"
WAIT_S = 120
# no retention beyond the subscriptions' needs (Pulsar's defaults), small ledgers, fast passes
FAST = {"rollover_entries_max": 5, "retention_check_interval_ms": 300,
        "retention_time_default_minutes": 0, "retention_size_default_mb": 0,
        "compaction_keys_max": 20}


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    return module_cluster_factory(3, brokers=2, broker_overrides=FAST)


def admin_of(cluster) -> str:
    return cluster.admin_url + "/admin/v2/persistent/" + NS


def ledger_ids(admin: str, topic: str) -> list[int]:
    r = requests.get(f"{admin}/{topic}/internalStats", timeout=30)
    assert r.status_code == 200, r.text
    return [entry["ledgerId"] for entry in r.json()["ledgers"]]


def compact(admin: str, topic: str, *, want: str = "SUCCESS") -> dict:
    got = compact_and_wait(f"{admin}/{topic}", "compaction", WAIT_S)
    assert got["status"] == want, got
    return got


def read_compacted(client, topic: str) -> list[tuple[str, bytes, tuple[int, int]]]:
    return [(key, data, ids[:2]) for key, data, ids in read_messages(client, f"persistent://{NS}/{topic}")]


def test_compacted_view_outlives_trimmed_ledgers_and_the_cursor_keeps_the_tail(cluster, client):
    admin = admin_of(cluster)
    topic = "compact-retained"
    r = requests.put(f"{admin}/{topic}", timeout=30)
    assert r.status_code == 204, r.text
    r = requests.put(f"{admin}/{topic}/subscription/hold", json={"ledgerId": -1, "entryId": -1}, timeout=30)
    assert r.status_code == 204, r.text
    producer = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=False)
    latest = {}
    try:
        for i in range(12):
            key = f"k{i % 4}"
            mid = producer.send(f"v{i}".encode(), partition_key=key)
            latest[key] = (f"v{i}".encode(), (mid.ledger_id(), mid.entry_id()))
    finally:
        producer.close()
    compact(admin, topic)
    before = ledger_ids(admin, topic)
    r = requests.delete(f"{admin}/{topic}/subscription/hold", timeout=30)
    assert r.status_code == 204, r.text
    tail_producer = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=False)
    try:
        tail = [tail_producer.send(f"t{i}".encode(), partition_key="k0") for i in range(7)]
    finally:
        tail_producer.close()
    tail_ids = [(m.ledger_id(), m.entry_id()) for m in tail]
    # retention trims the ledgers wholly before the horizon; the tail's ledgers stay
    wait_for(lambda: before[0] not in ledger_ids(admin, topic), WAIT_S, "ledgers before the horizon trimmed")
    kept = set(ledger_ids(admin, topic))
    assert {lid for lid, _ in tail_ids} <= kept
    got = read_compacted(client, topic)
    want = sorted(((k, v, mid) for k, (v, mid) in latest.items()), key=lambda t: t[2])
    assert got == want + [("k0", f"t{i}".encode(), tail_ids[i]) for i in range(7)]
    # the compacted messages come from ledgers no longer in the list
    assert any(mid[0] not in kept for _, _, mid in want)


def test_new_owner_serves_the_compacted_view(cluster, client):
    admin = admin_of(cluster)
    topic = "compact-failover"
    producer = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=False)
    try:
        subscriber = client.subscribe(f"persistent://{NS}/{topic}", "keep")     # holds the ledgers
        for i in range(6):
            producer.send(f"v{i}".encode(), partition_key=f"k{i % 2}")
    finally:
        producer.close()
    compact(admin, topic)
    want = read_compacted(client, topic)
    assert [(k, v) for k, v, _ in want] == [("k0", b"v4"), ("k1", b"v5")]
    subscriber.close()
    owner = broker_serving(cluster, topic)
    victim = next(name for name in cluster.broker_names if cluster_broker_url(cluster, name) == owner)
    cluster.kill(victim)             # a crash: the other broker takes the topic over
    try:
        survivor = next(name for name in cluster.broker_names if name != victim)
        c2 = pulsar.Client(cluster_broker_url(cluster, survivor), operation_timeout_seconds=60)
        try:
            assert wait_for(lambda: read_compacted_or_none(c2, topic), WAIT_S, "the new owner's view") == want
        finally:
            c2.close()
    finally:
        cluster.restart(victim)


def cluster_broker_url(cluster, name: str) -> str:
    return f"pulsar://127.0.0.1:{cluster.records[name].ports['pulsar']}"


def read_compacted_or_none(client, topic: str):
    try:
        return read_compacted(client, topic) or None
    except pulsar.PulsarException:       # the old owner's session has not expired yet
        return None


def broker_serving(cluster, topic: str) -> str:
    got = requests.get(f"{cluster.admin_url}/lookup/v2/topic/persistent/{NS}/{topic}", timeout=30).json()
    return got["brokerUrl"]


def test_a_failed_compaction_reports_error_and_keeps_the_previous_view(cluster, client):
    """The broker here keeps at most 20 keys per run (compaction_keys_max): a run over more fails
    in phase one; its status is ERROR with the reason, and readers still get the previous view
    (then everything after its horizon). A new ledger of a failed run is deleted, never recorded."""
    admin = admin_of(cluster)
    topic = "compact-fails"
    producer = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=False)
    try:
        subscriber = client.subscribe(f"persistent://{NS}/{topic}", "keep")     # holds the ledgers
        for i in range(6):
            producer.send(f"v{i}".encode(), partition_key=f"k{i % 3}")
        compact(admin, topic)
        view = read_compacted(client, topic)
        assert [(k, v) for k, v, _ in view] == [("k0", b"v3"), ("k1", b"v4"), ("k2", b"v5")]
        internal = requests.get(f"{admin}/{topic}/internalStats", timeout=30).json()
        for i in range(25):
            producer.send(b"n", partition_key=f"new{i}")
    finally:
        producer.close()
    got = compact(admin, topic, want="ERROR")
    assert "more than 20 keys" in got["lastError"]
    after = read_compacted(client, topic)
    assert after[:3] == view
    assert [k for k, _, _ in after[3:]] == [f"new{i}" for i in range(25)]
    assert requests.get(f"{admin}/{topic}/internalStats", timeout=30).json()["cursors"]["__compaction"] == \
        internal["cursors"]["__compaction"]
    subscriber.close()
