"""The Spark source's ``readCompacted`` option (issue 32 item 6) against real ZooKeeper, bookie
and broker processes, a real compacted topic and real local Spark. The reference is the official
client's reader with ``is_read_compacted=True``: the same messages (keys, values, message ids
with their original (ledger, entry, batch index)), in the same order, through the format and
through ``read_topic``; without the option every message is read, as before."""

from __future__ import annotations

import uuid

import pytest

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("pyspark")

from tests.integration.helpers import wait_for  # noqa: E402
from tests.integration.test_compaction import NS, compact, produce_keyed, read_all  # noqa: E402

pytestmark = pytest.mark.integration

ROLLOVER_ENTRIES = 4            # several ledgers before and after the horizon


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    return module_cluster_factory(3, brokers=1, broker_overrides={"rollover_entries_max": ROLLOVER_ENTRIES})


@pytest.fixture(scope="module")
def client(module_client):
    """Module scope: module-scoped fixtures produce with it."""
    return module_client


@pytest.fixture
def admin(cluster) -> str:
    return cluster.admin_url + "/admin/v2/persistent/" + NS


def fmt(spark, cluster, topic, **options):
    reader = (spark.read.format("pulsarlite").option("zookeeper", cluster.zookeeper)
              .option("admin_url", cluster.admin_url).option("topic", topic))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def hybrid(spark, cluster, topic, **options):
    import spark_source
    return spark_source.read_topic(spark, topic, zookeeper=cluster.zookeeper, admin_url=cluster.admin_url,
                                   **options)


def rows(df) -> list[dict]:
    """Rows in message-id order (ledger, entry, batch index)."""
    got = [r.asDict(recursive=True) for r in df.collect()]
    return sorted(got, key=lambda r: (r["ledger_id"], r["entry_id"], r["batch_index"]))


def as_reader(r: dict) -> tuple:
    return (r["key"] or "", bytes(r["value"]), (r["ledger_id"], r["entry_id"], r["batch_index"]))


def produce_tail(client, topic: str) -> None:
    """After the horizon: a new value of a compacted key, a new key, a tombstone, a batch."""
    p = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=False)
    try:
        p.send(b"v3", partition_key="k1")
        p.send(b"t1", partition_key="k7")
        p.send(b"", partition_key="k2")
    finally:
        p.close()
    b = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=True, batching_max_messages=10,
                               batching_max_publish_delay_ms=60_000)
    try:
        for key, value in [("k8", b"x"), ("k4", b"c")]:
            b.send_async(value, lambda res, mid: None, partition_key=key)
        b.flush()
    finally:
        b.close()


def compacted_topic(client, admin) -> tuple[str, list[tuple]]:
    """A compacted topic with a tail after the horizon; the official compacted reader's view."""
    local = f"scompact-{uuid.uuid4().hex[:6]}"
    ids = produce_keyed(client, local)
    # a batch with partially surviving messages: k4 twice and k6 deleted in one batch
    assert len({(m.ledger_id(), m.entry_id()) for label, m in ids.items() if label.startswith(("k4", "k5", "k6"))}) == 1
    compact(admin, local)
    produce_tail(client, local)
    expected = read_all(client, local, compacted=True)
    return local, expected


def test_read_compacted_equals_the_official_compacted_reader(spark, cluster, client, admin):
    local, expected = compacted_topic(client, admin)
    topic = f"persistent://{NS}/{local}"
    everything = read_all(client, local, compacted=False)
    assert len(expected) < len(everything)      # the view dropped something
    # the compacted view has a batch of which only some messages are delivered
    batch_ids = [e[2] for e in expected if e[2][2] >= 0]
    assert batch_ids

    got = rows(fmt(spark, cluster, topic, readCompacted="true"))
    assert [as_reader(r) for r in got] == expected
    assert {r["message_id"] for r in got} == {f"{lg}:{e}:-1:{b}" for _, _, (lg, e, b) in expected}

    # every column of a compacted row is the one the full read has for that message id
    full = rows(fmt(spark, cluster, topic))
    assert [as_reader(r) for r in full] == everything          # the option off: every message
    by_id = {r["message_id"]: r for r in full}
    assert all(by_id[r["message_id"]] == r for r in got)

    # read_topic: the compacted segment through the Python source, the rest as before
    via_hybrid = rows(hybrid(spark, cluster, topic, readCompacted="true"))
    assert via_hybrid == got
    assert [as_reader(r) for r in rows(hybrid(spark, cluster, topic))] == everything


def test_read_compacted_on_a_topic_never_compacted_reads_it_whole(spark, cluster, client):
    local = f"snever-{uuid.uuid4().hex[:6]}"
    produce_keyed(client, local)
    topic = f"persistent://{NS}/{local}"
    expected = read_all(client, local, compacted=True)
    assert expected == read_all(client, local, compacted=False)
    assert [as_reader(r) for r in rows(fmt(spark, cluster, topic, readCompacted="true"))] == expected


def test_a_view_replaced_after_planning_fails_the_read_clearly(spark, cluster, client, admin):
    local, _ = compacted_topic(client, admin)
    topic = f"persistent://{NS}/{local}"
    df = hybrid(spark, cluster, topic, readCompacted="true")         # planned: the first view
    compact(admin, local)                                             # a new view; the old ledger deleted

    def old_ledger_deleted():
        try:
            df.collect()
        except Exception as e:        # noqa: BLE001 (Spark wraps the worker's error)
            return str(e)
        return None
    error = wait_for(old_ledger_deleted, 60, "the replaced compacted ledger deleted")
    assert "is gone since planning" in error
    # planning again reads the new view
    assert [as_reader(r) for r in rows(hybrid(spark, cluster, topic, readCompacted="true"))] == \
        read_all(client, local, compacted=True)
