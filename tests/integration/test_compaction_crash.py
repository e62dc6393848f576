"""A compaction run killed midway, with real processes and the official client: the broker
is started with the test fault point PULSARLITE_TEST_FAULT_POINT (broker/compaction/shell.py,
off by default) and ends itself (``os._exit``, as kill -9) at that step of a run:

- ``compaction.id_named``: the new compacted ledger's id (reserved) is named in the list as
  ``pulsarlite.compaction.writing``, the ledger is not created yet -> the old view; the next run
  forgets the name (this was the window where a ledger leaked, as in Pulsar);
- ``compaction.writing_named``: the new compacted ledger exists and is named in the list as
  ``pulsarlite.compaction.writing``, the view is not recorded -> the restarted broker serves the
  old view; the next run deletes the leftover ledger;
- ``compaction.view_recorded``: the view is recorded (CAS), the ``__compaction`` cursor has not
  moved -> the new view; the previous compacted ledger is deleted by the next retention trim;
- ``compaction.cursor_moved``: recorded and cursor moved, the previous ledger not deleted yet ->
  the new view; the previous ledger deleted by the next trim.

Either view is whole: every key's latest value up to that view's horizon, then every message
after the horizon (nothing lost, nothing twice)."""

from __future__ import annotations

import json

import pytest
import requests

from pulsarlite.metadata_layout import ledger_path, managed_ledger_path
from tests.integration.compaction_helpers import compact_and_wait, read_messages
from tests.integration.helpers import wait_for

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

NS = "public/default"
WAIT_S = 120
FAULT_ENV = "PULSARLITE_TEST_FAULT_POINT"


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    return module_cluster_factory(3, brokers=1, broker_overrides={"retention_check_interval_ms": 300})


def admin_of(cluster) -> str:
    return cluster.admin_url + "/admin/v2/persistent/" + NS


def compact(admin: str, topic: str) -> None:
    assert compact_and_wait(f"{admin}/{topic}", f"compaction of {topic}", WAIT_S) == {"status": "SUCCESS",
                                                                                       "lastError": ""}


def properties(cluster, topic: str) -> dict[str, str]:
    data, _ = cluster._zk_client().get(managed_ledger_path(f"{NS}/persistent/{topic}"))
    return json.loads(data)["properties"]


def view_ledger(cluster, topic: str) -> int:
    return json.loads(properties(cluster, topic)["pulsarlite.compaction"])["ledger"]


def ledger_exists(cluster, ledger_id: int) -> bool:
    return cluster._zk_client().exists(ledger_path(ledger_id)) is not None


def send(client, topic: str, pairs: list[tuple[str, bytes]]) -> list[tuple[str, bytes, tuple]]:
    producer = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=False)
    try:
        out = []
        for key, value in pairs:
            mid = producer.send(value, partition_key=key)
            out.append((key, value, (mid.ledger_id(), mid.entry_id(), mid.batch_index())))
        return out
    finally:
        producer.close()


def read_compacted(service_url: str, topic: str) -> list[tuple[str, bytes, tuple]]:
    client = pulsar.Client(service_url, operation_timeout_seconds=60)
    try:
        return read_messages(client, f"persistent://{NS}/{topic}", compacted=True)
    finally:
        client.close()


def latest_per_key(messages: list[tuple[str, bytes, tuple]]) -> list[tuple[str, bytes, tuple]]:
    """The view of ``messages``: each key's last message, in log order; empty values delete."""
    last = {}
    for m in messages:
        last[m[0]] = m
    return sorted((m for m in last.values() if m[1]), key=lambda m: m[2])


@pytest.mark.parametrize("point, new_view", [("compaction.id_named", False),
                                             ("compaction.writing_named", False),
                                             ("compaction.view_recorded", True),
                                             ("compaction.cursor_moved", True)])
def test_a_run_killed_midway_leaves_the_old_or_the_new_view_and_no_leftover(cluster, monkeypatch,
                                                                           point, new_view):
    admin = admin_of(cluster)
    topic = "crash-" + point.split(".")[1].replace("_", "-")
    broker = cluster.broker_names[0]
    first = send_fresh(cluster, topic, [("a", b"a1"), ("b", b"b1"), ("a", b"a2"), ("c", b"c1")])
    compact(admin, topic)
    old_ledger = view_ledger(cluster, topic)
    second = send_fresh(cluster, topic, [("b", b"b2"), ("c", b""), ("d", b"d1")])
    old_view = latest_per_key(first) + second              # the old view, then the tail
    new_view_messages = latest_per_key(first + second)
    assert read_compacted(cluster.service_url, topic) == old_view

    monkeypatch.setenv(FAULT_ENV, point)
    cluster.restart(broker)                                 # this broker dies at the point
    monkeypatch.delenv(FAULT_ENV)
    try:
        r = requests.put(f"{admin}/{topic}/compaction", timeout=30)
        assert r.status_code == 204, r.text
    except requests.ConnectionError:
        pass                                                # it died before it answered
    wait_for(lambda: not cluster._running(broker), WAIT_S, f"{broker} to end at {point}")
    props = properties(cluster, topic)
    if new_view:
        assert view_ledger(cluster, topic) != old_ledger
        assert "pulsarlite.compaction.writing" not in props
    else:
        assert view_ledger(cluster, topic) == old_ledger
        leftover = int(props["pulsarlite.compaction.writing"])
        # named before it exists: killed before its creation, it does not exist (nothing leaks)
        assert ledger_exists(cluster, leftover) == (point == "compaction.writing_named")

    cluster.restart(broker)
    got = read_compacted(cluster.service_url, topic)
    assert got == (new_view_messages if new_view else old_view)
    if new_view:
        # the previous compacted ledger is on the trimmed record: the next retention pass deletes it
        wait_for(lambda: not ledger_exists(cluster, old_ledger), WAIT_S, f"ledger {old_ledger} deleted")
    else:
        assert ledger_exists(cluster, old_ledger)
        compact(admin, topic)                               # the next run deletes the leftover
        assert not ledger_exists(cluster, leftover)
        assert not ledger_exists(cluster, old_ledger)
        assert "pulsarlite.compaction.writing" not in properties(cluster, topic)
        assert read_compacted(cluster.service_url, topic) == new_view_messages
    # the __compaction cursor holds nothing compacted in the new view: a new message after it is read
    tail = send_fresh(cluster, topic, [("e", b"e1")])
    assert read_compacted(cluster.service_url, topic) == new_view_messages + tail


def send_fresh(cluster, topic: str, pairs):
    c = pulsar.Client(cluster.service_url, operation_timeout_seconds=60)
    try:
        return send(c, topic, pairs)
    finally:
        c.close()
