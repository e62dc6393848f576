"""The backlog quota and the ``__compaction`` cursor, with the official client against real
processes. Pulsar's rule, matched here: the compaction cursor is a durable cursor like any
subscription's (ManagedLedgerImpl keeps it in the slowest-cursor heap; BacklogQuotaManager and
PersistentTopic exempt only system topics), so once a topic has been compacted, what is
produced after the horizon is backlog of ``__compaction`` until the next run: over a
``producer_exception`` quota producers are refused, and a compaction run (which moves the cursor
to its horizon) lifts the block. The compacted view is whole throughout."""

from __future__ import annotations

import functools
import time

import pytest
import requests

from tests.integration.compaction_helpers import compact_and_wait, read_messages
from tests.integration.helpers import producer_refusal, wait_for

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

NS = "public/default"
WAIT_S = 120
FAST = {"rollover_entries_max": 50, "retention_check_interval_ms": 500,
        "retention_time_default_minutes": 0, "retention_size_default_mb": 0}


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory(3, brokers=1, broker_overrides=FAST)


def compact(cluster, local: str) -> None:
    url = f"{cluster.admin_url}/admin/v2/persistent/{NS}/{local}"
    assert compact_and_wait(url, "compaction", WAIT_S) == {"status": "SUCCESS", "lastError": ""}


def read_compacted(client, topic: str) -> dict[str, bytes]:
    return {key: data for key, data, _ in read_messages(client, topic, compacted=True)}


def test_the_compaction_cursor_holds_backlog_under_the_quota_until_the_next_run(cluster, client):
    r = requests.post(f"{cluster.admin_url}/admin/v2/namespaces/{NS}/backlogQuota",
                      params={"backlogQuotaType": "destination_storage"},
                      json={"limitSize": 100_000, "limitTime": -1, "policy": "producer_exception"}, timeout=30)
    assert r.status_code == 204, r.text
    local = "quota-compaction"
    topic = f"persistent://{NS}/{local}"
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"first", partition_key="k0")
    producer.close()
    compact(cluster, local)                   # creates __compaction (no other subscription)
    internal = requests.get(f"{cluster.admin_url}/admin/v2/persistent/{NS}/{local}/internalStats", timeout=30)
    assert list(internal.json()["cursors"]) == ["__compaction"]

    # ~2 kB messages over 10 keys: past ~100 kB after the horizon the producer is refused
    producer = client.create_producer(topic, batching_enabled=False)
    sent = {}
    failed = {}
    deadline = time.monotonic() + 90
    with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
        i = 0
        while time.monotonic() < deadline:
            value = f"{i:06d}".encode().ljust(2_000, b".")
            failed = {f"k{i % 10}": value}
            producer.send(value, partition_key=f"k{i % 10}")
            sent.update(failed)
            i += 1
    assert len(sent) == 10
    producer.close()

    refused = functools.partial(producer_refusal, client, topic)

    error = wait_for(refused, 60, "producer refused: __compaction's backlog is over the quota")
    assert "Blocked" in error or "Quota" in error, error

    compact(cluster, local)                   # the cursor moves to the new horizon
    wait_for(lambda: refused() is None, 60, "producer accepted again after the compaction")
    # the send that failed was in flight when the broker closed the producer: it may have been
    # stored (its receipt never came), as in Pulsar; every acknowledged one is in the view
    assert read_compacted(client, topic) in (sent, {**sent, **failed})
