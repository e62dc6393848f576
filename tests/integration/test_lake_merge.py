"""[lakehouse] Small table files merged (offload/lake_merge.py), end to end: a real broker with a
file:// tier and the lake on (one cluster), several small ledgers (rollover at 10 entries)
offloaded; the offloader's pass merges them (``lake_merge_files_min`` 3): the table has fewer
files, every message once with the message ids the official client sees, the tier objects of
the ledgers untouched (the broker still reads them). Then retention trims the first ledger: the
table's next snapshot has every remaining message once and none of the trimmed ledger's.
"""

from __future__ import annotations

import pytest

from tests.integration.helpers import wait_for
from tests.integration.test_offload_broker import (broker_overrides, http, internal_stats, keep_everything,
                                                   offload_everything_closed, topic_url, wait_bookie_deleted)

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("pyiceberg")

pytestmark = pytest.mark.integration

LOCAL = "quiet"
TOPIC = f"persistent://public/default/{LOCAL}"


def table_state(admin_url: str):
    """(table files, message ids (ledger, entry, batch index) of its current snapshot, as a list)."""
    from pyiceberg.table import StaticTable
    code, info = http("GET", topic_url(admin_url, LOCAL) + "/lake")
    assert code == 200, info
    if not info["metadata_location"]:
        return set(), []
    table = StaticTable.from_metadata(info["metadata_location"])
    files = {t.file.file_path for t in table.scan().plan_files()}
    rows = table.scan(selected_fields=("ledger_id", "entry_id", "batch_index")).to_arrow().to_pylist()
    return files, [(r["ledger_id"], r["entry_id"], r["batch_index"]) for r in rows]


def offloaded(admin_url: str) -> dict[int, dict]:
    return {i["ledgerId"]: i for i in internal_stats(admin_url, LOCAL)["ledgers"]
            if i["offloadState"] in ("offloaded", "bookie-deleted")}


def test_small_ledgers_are_merged_in_the_table_and_unmerged_when_one_leaves(cluster_factory, tmp_path):
    tier_dir = tmp_path / "tier"
    tier_dir.mkdir()
    overrides = broker_overrides(f"file://{tier_dir}", lake_enabled=True, retention_check_interval_ms=500,
                                 **{"offload.lake_merge_files_min": 3,
                                    "offload.lake_merge_target_bytes": 128 << 20})
    cluster = cluster_factory(3, brokers=1, broker_overrides=overrides)
    keep_everything(cluster.admin_url)
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        consumer = client.subscribe(TOPIC, "keeper", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(TOPIC, batching_enabled=False)
        ids = {}
        for i in range(55):
            mid = producer.send(f"m-{i}".encode())
            ids[(mid.ledger_id(), mid.entry_id(), mid.batch_index())] = i
        producer.close()
        ledger_ids = [i["ledgerId"] for i in offload_everything_closed(cluster.admin_url, LOCAL) if i["entries"] > 0]
        wait_bookie_deleted(cluster.admin_url, LOCAL, ledger_ids)
        assert len(ledger_ids) >= 4
        objects = {lid: i["offloadUri"] for lid, i in offloaded(cluster.admin_url).items()}
        want = sorted(m for m in ids if m[0] in objects)

        def merged():
            files, rows = table_state(cluster.admin_url)
            return (files, rows) if any("/merged-" in f for f in files) else None

        files, rows = wait_for(merged, 120, "a merge of the table's small files", interval_s=0.5)
        assert len(files) < len(objects)                          # fewer files
        assert sorted(rows) == want                               # every message once, ids intact
        assert all((tier_dir / u[len(f"file://{tier_dir}/"):]).exists() for u in objects.values())
        # the broker still reads the ledgers from their own objects (the bookie copies are gone)
        for _ in ids:
            msg = consumer.receive(timeout_millis=30_000)
            assert ids[(msg.message_id().ledger_id(), msg.message_id().entry_id(),
                        msg.message_id().batch_index())] == int(msg.data().decode().split("-")[1])
        first = min(objects)
        second = min(lid for lid in objects if lid > first)
        consumer.acknowledge_cumulative(pulsar.MessageId(-1, second, 0, -1))

        # -- retention trims the first ledger: out of the table, the others' rows stay once ---
        code, body = http("POST", f"{cluster.admin_url}/admin/v2/namespaces/public/default/retention",
                          {"retentionTimeInMinutes": 0, "retentionSizeInMB": 0})
        assert code == 204, body
        wait_for(lambda: first not in {i["ledgerId"] for i in internal_stats(cluster.admin_url, LOCAL)["ledgers"]},
                 120, f"retention to trim ledger {first}", interval_s=0.5)
        files, rows = table_state(cluster.admin_url)
        remaining = set(offloaded(cluster.admin_url))
        assert first not in remaining and second in remaining
        assert sorted(rows) == sorted(m for m in ids if m[0] in remaining)
        assert not any(r[0] == first for r in rows)
        consumer.close()
    finally:
        client.close()
