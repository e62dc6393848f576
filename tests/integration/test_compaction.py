"""Topic compaction (issue 32 item 6) with the official Python client against real ZooKeeper,
bookie and broker processes. Pulsar's behaviour is the reference: PersistentTopics compaction
endpoints (LongRunningProcessStatus), the two-phase compactor (latest message per key, an empty
value deletes the key, messages without a key are not in the compacted view, batches compacted
per message with their original ids), readers with ``is_read_compacted`` get the compacted view
then the topic after the horizon, only Exclusive/Failover subscriptions may read compacted,
the namespace ``compactionThreshold`` triggers compaction."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import requests

from tests.integration.compaction_helpers import compact_and_wait, compaction_status, read_messages
from tests.integration.helpers import wait_for

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 20_000
NS = "public/default"
WAIT_S = 120


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    return module_cluster_factory(3, brokers=1, broker_overrides={"compaction_check_interval_ms": 300})


@pytest.fixture
def admin(cluster) -> str:
    return cluster.admin_url + "/admin/v2/persistent/" + NS


def status(admin: str, topic: str) -> dict:
    return compaction_status(f"{admin}/{topic}")


def compact(admin: str, topic: str) -> None:
    assert compact_and_wait(f"{admin}/{topic}", f"compaction of {topic}", WAIT_S) == {"status": "SUCCESS",
                                                                                       "lastError": ""}


def produce_keyed(client, topic: str) -> dict[str, tuple]:
    """Keyed messages, a tombstone, a keyless one, and a batch; the message ids by label."""
    ids = {}
    plain = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=False)
    try:
        ids["k1=v1"] = plain.send(b"v1", partition_key="k1")
        ids["k2=v1"] = plain.send(b"v1", partition_key="k2")
        ids["k1=v2"] = plain.send(b"v2", partition_key="k1")
        ids["nokey"] = plain.send(b"nokey")
        ids["k3=v1"] = plain.send(b"v1", partition_key="k3")
        ids["k3=del"] = plain.send(b"", partition_key="k3")          # tombstone
    finally:
        plain.close()
    batched = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=True,
                                     batching_max_messages=10, batching_max_publish_delay_ms=60_000)
    try:
        got = {}
        for label, key, value in [("k4=a", "k4", b"a"), ("k5=a", "k5", b"a"), ("k4=b", "k4", b"b"),
                                  ("k6=a", "k6", b"a"), ("k6=del", "k6", b"")]:
            batched.send_async(value, lambda res, mid, label=label: got.__setitem__(label, mid), partition_key=key)
        batched.flush()
        wait_for(lambda: len(got) == 5, 30, "batch receipts")
        ids.update(got)
    finally:
        batched.close()
    return ids


def key_of(ids: dict, label: str) -> tuple:
    m = ids[label]
    return (m.ledger_id(), m.entry_id(), m.batch_index())


def read_all(client, topic: str, *, compacted: bool, start=None) -> list[tuple[str, bytes, tuple]]:
    return read_messages(client, f"persistent://{NS}/{topic}", compacted=compacted, start=start)


def expected_view(ids: dict) -> list[tuple[str, bytes, tuple]]:
    """Latest per key in log order; k3 and k6 deleted by tombstones; the keyless one dropped."""
    return [("k2", b"v1", key_of(ids, "k2=v1")), ("k1", b"v2", key_of(ids, "k1=v2")),
            ("k5", b"a", key_of(ids, "k5=a")), ("k4", b"b", key_of(ids, "k4=b"))]


def test_compacted_view_then_tail_and_it_survives_a_broker_restart(cluster, client, admin):
    topic = "compact-view"
    ids = produce_keyed(client, topic)
    # the batch holds the five batched messages in one entry (the test is about batches)
    assert len({key_of(ids, l)[:2] for l in ("k4=a", "k5=a", "k4=b", "k6=a", "k6=del")}) == 1
    assert status(admin, topic) == {"status": "NOT_RUN", "lastError": ""}
    compact(admin, topic)
    tail = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=False)
    try:
        tail_id = tail.send(b"v3", partition_key="k1")
    finally:
        tail.close()
    tail_key = (tail_id.ledger_id(), tail_id.entry_id(), tail_id.batch_index())
    want = expected_view(ids) + [("k1", b"v3", tail_key)]
    assert read_all(client, topic, compacted=True) == want
    # without read_compacted: every message, as before
    assert len(read_all(client, topic, compacted=False)) == 12

    cluster.restart(cluster.broker_names[0])
    c2 = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        assert read_all(c2, topic, compacted=True) == want
    finally:
        c2.close()


def test_a_second_compaction_replaces_the_view_and_drops_the_old_ledger(client, admin):
    topic = "compact-twice"
    ids = produce_keyed(client, topic)
    compact(admin, topic)
    internal = requests.get(f"{admin}/{topic}/internalStats", timeout=30).json()
    assert "__compaction" in internal["cursors"]
    producer = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=False)
    try:
        new_k2 = producer.send(b"v9", partition_key="k2")
        producer.send(b"", partition_key="k1")                        # deletes k1
    finally:
        producer.close()
    compact(admin, topic)
    got = read_all(client, topic, compacted=True)
    assert got == [("k5", b"a", key_of(ids, "k5=a")), ("k4", b"b", key_of(ids, "k4=b")),
                   ("k2", b"v9", (new_k2.ledger_id(), new_k2.entry_id(), new_k2.batch_index()))]


def test_seek_on_a_compacted_reader(client, admin):
    topic = "compact-seek"
    ids = produce_keyed(client, topic)
    compact(admin, topic)
    start = ids["k1=v2"]
    reader = client.create_reader(f"persistent://{NS}/{topic}", start, is_read_compacted=True,
                                  start_message_id_inclusive=True)
    try:
        first = reader.read_next(timeout_millis=TIMEOUT_MS)
        assert (first.partition_key(), first.data()) == ("k1", b"v2")
        reader.seek(pulsar.MessageId.earliest)
        again = reader.read_next(timeout_millis=TIMEOUT_MS)
        assert (again.partition_key(), again.data()) == ("k2", b"v1")
    finally:
        reader.close()


def test_read_compacted_only_on_exclusive_and_failover(client, admin):
    """Pulsar refuses readCompacted on Shared and Key_Shared subscriptions."""
    topic = "compact-shared"
    produce_keyed(client, topic)
    with pytest.raises(Exception):
        client.subscribe(f"persistent://{NS}/{topic}", "s", consumer_type=pulsar.ConsumerType.Shared,
                         is_read_compacted=True)
    with pytest.raises(Exception):       # the compactor's reserved cursor
        client.subscribe(f"persistent://{NS}/{topic}", "__compaction")
    consumer = client.subscribe(f"persistent://{NS}/{topic}", "f", consumer_type=pulsar.ConsumerType.Failover,
                                is_read_compacted=True, initial_position=pulsar.InitialPosition.Earliest)
    consumer.close()


def test_compaction_of_a_missing_topic_is_404_and_partitioned_topics_compact_each_partition(client, admin):
    assert requests.put(f"{admin}/compact-missing/compaction", timeout=30).status_code == 404
    assert requests.get(f"{admin}/compact-missing/compaction", timeout=30).status_code == 404
    topic = "compact-parts"
    r = requests.put(f"{admin}/{topic}/partitions", json=2, timeout=30)
    assert r.status_code == 204, r.text
    producer = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=False)
    try:
        for key in ("a", "b", "c", "d"):
            producer.send(b"old", partition_key=key)
            producer.send(b"new", partition_key=key)
    finally:
        producer.close()
    compact(admin, topic)
    for i in range(2):
        assert status(admin, f"{topic}-partition-{i}")["status"] == "SUCCESS"
    reader_msgs = []
    for i in range(2):
        reader_msgs += read_all(client, f"{topic}-partition-{i}", compacted=True)
    assert sorted((k, v) for k, v, _ in reader_msgs) == [(k, b"new") for k in ("a", "b", "c", "d")]


def test_compaction_threshold_policy_triggers_compaction(cluster, client):
    ns_url = f"{cluster.admin_url}/admin/v2/namespaces/public/compact-auto"
    assert requests.put(ns_url, json={}, timeout=30).status_code in (204, 200)
    assert requests.get(ns_url + "/compactionThreshold", timeout=30).json() is None
    assert requests.post(ns_url + "/compactionThreshold", json="abc", timeout=30).status_code == 400
    assert requests.post(ns_url + "/compactionThreshold", json=-5, timeout=30).status_code == 412
    topic_admin = f"{cluster.admin_url}/admin/v2/persistent/public/compact-auto"
    # everything is produced before the threshold is set: one automatic run covers it all
    producer = client.create_producer("persistent://public/compact-auto/t", batching_enabled=False)
    try:
        for i in range(40):
            producer.send(b"x" * 100, partition_key=f"k{i % 4}")
    finally:
        producer.close()
    assert status(topic_admin, "t")["status"] == "NOT_RUN"
    assert requests.post(ns_url + "/compactionThreshold", json=1000, timeout=30).status_code == 204
    assert requests.get(ns_url + "/compactionThreshold", timeout=30).json() == 1000
    wait_for(lambda: status(topic_admin, "t")["status"] == "SUCCESS", WAIT_S, "automatic compaction")
    reader = client.create_reader("persistent://public/compact-auto/t", pulsar.MessageId.earliest,
                                  is_read_compacted=True)
    try:
        keys = []
        while True:
            try:
                keys.append(reader.read_next(timeout_millis=2_000).partition_key())
            except pulsar.Timeout:
                break
    finally:
        reader.close()
    # every key once in the compacted part (plus whatever arrived after its horizon: nothing)
    assert sorted(keys) == ["k0", "k1", "k2", "k3"]
    assert requests.delete(ns_url + "/compactionThreshold", timeout=30).status_code == 204
    assert requests.get(ns_url + "/compactionThreshold", timeout=30).json() is None


def run_admin(cluster, tmp_path, *args: str) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSARLITE_")}
    env["HOME"] = str(home)
    argv = [sys.executable, "-m", "pulsarlite", "admin", "--admin-url", cluster.admin_url, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def test_cli_compact_status_and_threshold(cluster, client, tmp_path):
    topic = f"persistent://{NS}/compact-cli"
    produce_keyed(client, "compact-cli")
    got = run_admin(cluster, tmp_path, "topics", "compaction-status", topic)
    assert got.returncode == 0, got.stderr
    assert "has not been run" in got.stdout
    got = run_admin(cluster, tmp_path, "topics", "compact", topic)
    assert got.returncode == 0, got.stderr
    assert "compaction requested" in got.stdout
    got = run_admin(cluster, tmp_path, "topics", "compaction-status", "-w", topic)
    assert got.returncode == 0, got.stderr
    assert "Compaction was a success" in got.stdout
    got = run_admin(cluster, tmp_path, "namespaces", "set-compaction-threshold", "-t", "10M", "public/cli-ns")
    assert got.returncode != 0        # no such namespace: refused, nothing created
    assert run_admin(cluster, tmp_path, "namespaces", "create", "public/cli-ns").returncode == 0
    got = run_admin(cluster, tmp_path, "namespaces", "set-compaction-threshold", "-t", "10M", "public/cli-ns")
    assert got.returncode == 0, got.stderr
    got = run_admin(cluster, tmp_path, "namespaces", "get-compaction-threshold", "public/cli-ns")
    assert got.returncode == 0 and got.stdout.strip() == str(10 * 1024 * 1024), (got.stdout, got.stderr)
    got = run_admin(cluster, tmp_path, "namespaces", "remove-compaction-threshold", "public/cli-ns")
    assert got.returncode == 0, got.stderr
    got = run_admin(cluster, tmp_path, "namespaces", "get-compaction-threshold", "public/cli-ns")
    assert got.returncode == 0 and got.stdout.strip() in ("null", ""), got.stdout


def test_table_view_of_the_official_client_over_the_compacted_view(client, admin):
    """The official client's TableView (a read_compacted reader underneath): the latest value per
    key; keys deleted by tombstones and keyless messages are absent; later messages update it."""
    topic = "compact-table"
    produce_keyed(client, topic)
    compact(admin, topic)
    table = client.create_table_view(f"persistent://{NS}/{topic}")
    try:
        seen = {}
        table.for_each(lambda k, v: seen.__setitem__(k, v))
        assert seen == {"k1": b"v2", "k2": b"v1", "k4": b"b", "k5": b"a"}
        producer = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=False)
        try:
            producer.send(b"v3", partition_key="k1")
        finally:
            producer.close()
        wait_for(lambda: table.get("k1") == b"v3", 30, "the table view's update")
    finally:
        table.close()


def test_large_batches_keep_survivors_across_ack_set_words(client, admin):
    """A 130-message batch whose survivors are indexes 60..129: the ack set spans three 64-bit
    words, one of them all ones and one with bit 63 set (signed int64 on the wire)."""
    topic = "compact-big-batch"
    producer = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=True,
                                      batching_max_messages=130, batching_max_publish_delay_ms=60_000)
    got = {}
    try:
        for i in range(130):
            producer.send_async(f"v{i}".encode(), lambda res, mid, i=i: got.__setitem__(i, mid),
                                partition_key=f"b{i % 70}")
        producer.flush()
        wait_for(lambda: len(got) == 130, 30, "batch receipts")
    finally:
        producer.close()
    assert len({(m.ledger_id(), m.entry_id()) for m in got.values()}) == 1
    compact(admin, topic)
    view = read_all(client, topic, compacted=True)
    assert [(k, v, mid[2]) for k, v, mid in view] == [(f"b{i % 70}", f"v{i}".encode(), i) for i in range(60, 130)]
