"""Compaction of a topic whose ledgers were offloaded and deleted from the bookies (issue 32 item
6, docs/decisions.md "[compat] Topic compaction"): the compactor reads through the managed
ledger, so offloaded ledgers are read from the tier (a ``file://`` tier here) with their message
ids; the compacted view then serves them like any other. Real processes, the official client."""

from __future__ import annotations

import pytest

from tests.integration.compaction_helpers import compact_and_wait, read_messages
from tests.integration.test_offload_broker import (broker_overrides, keep_everything, offload_everything_closed,
                                                   wait_bookie_deleted)

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

NS = "public/default"


def test_compaction_reads_offloaded_ledgers_from_the_tier(cluster_factory, tmp_path):
    tier_dir = tmp_path / "tier"
    tier_dir.mkdir()
    cluster = cluster_factory(3, brokers=1, broker_overrides=broker_overrides(f"file://{tier_dir}"))
    keep_everything(cluster.admin_url)
    topic = "compact-offloaded"
    admin = f"{cluster.admin_url}/admin/v2/persistent/{NS}/{topic}"
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=False)
        latest = {}
        try:
            for i in range(35):                       # several ledgers of 10 entries
                mid = producer.send(f"v{i}".encode(), partition_key=f"k{i % 5}")
                latest[f"k{i % 5}"] = (f"v{i}".encode(), (mid.ledger_id(), mid.entry_id()))
        finally:
            producer.close()
        closed = offload_everything_closed(cluster.admin_url, topic)
        wait_bookie_deleted(cluster.admin_url, topic, [i["ledgerId"] for i in closed])
        assert compact_and_wait(admin, "compaction", 120) == {"status": "SUCCESS", "lastError": ""}
        got = [(key, data, ids[:2]) for key, data, ids in read_messages(client, f"persistent://{NS}/{topic}")]
        assert got == sorted(((k, v, mid) for k, (v, mid) in latest.items()), key=lambda t: t[2])
    finally:
        client.close()
