"""Tiered storage through the broker: real ZooKeeper, bookies and brokers (cluster_factory), moto's
S3 server (``s3_server``) or a ``file://`` tier, and the official client.

Produce across several ledgers, offload on demand, let the bookie copies go, then read everything
from earliest: the same bytes under the same message ids (invariant 7). A broker killed during an
offload: the next owner finishes it, every message stays readable and no object is orphaned
(invariant 6). Deleting a topic deletes its objects. An S3 that fails leaves the bookies alone.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.integration.helpers import wait_for

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 30_000
ENTRIES_PER_LEDGER = 10


# -- helpers -------------------------------------------------------------------------------------
def http(method: str, url: str, body=None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw) if raw else None
        except ValueError:
            return e.code, raw.decode(errors="replace")


def topic_url(admin_url: str, topic: str) -> str:
    return f"{admin_url}/admin/v2/persistent/public/default/{topic}"


def internal_stats(admin_url: str, topic: str) -> dict:
    status, stats = http("GET", topic_url(admin_url, topic) + "/internalStats")
    assert status == 200, stats
    return stats


def offload_everything_closed(admin_url: str, topic: str) -> list[dict]:
    """Trigger an offload before the current ledger; wait for SUCCESS; return the ledgers asked
    for: those before that ledger in the list (a rollover after the request adds a closed ledger
    the request did not cover; it is not returned)."""
    stats = internal_stats(admin_url, topic)
    current = stats["ledgers"][-1]["ledgerId"]
    status, body = http("PUT", topic_url(admin_url, topic) + "/offload", {"ledgerId": current, "entryId": 0})
    assert status == 204, body

    def done():
        code, got = http("GET", topic_url(admin_url, topic) + "/offload")
        assert code == 200, got
        assert got["status"] != "ERROR", got
        return got["status"] == "SUCCESS"

    wait_for(done, 120, "offload SUCCESS", interval_s=0.2)
    ledgers = internal_stats(admin_url, topic)["ledgers"]
    ids = [i["ledgerId"] for i in ledgers]
    return ledgers[:ids.index(current)]


def wait_bookie_deleted(admin_url: str, topic: str, ledger_ids: list[int]) -> list[dict]:
    def all_deleted():
        ledgers = {i["ledgerId"]: i for i in internal_stats(admin_url, topic)["ledgers"]}
        return all(ledgers[lid]["offloadState"] == "bookie-deleted" for lid in ledger_ids) and ledgers

    ledgers = wait_for(all_deleted, 120, f"ledgers {ledger_ids} deleted from the bookies", interval_s=0.2)
    return [ledgers[lid] for lid in ledger_ids]


def produce(client, topic: str, n_plain: int, n_batched: int) -> None:
    """Plain messages (one per entry) with keys and properties, then LZ4-compressed batches."""
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(n_plain):
        producer.send(f"plain-{i}-".encode() * (1 + i % 5), properties={"i": str(i)}, partition_key=f"k{i % 3}",
                      event_timestamp=1_700_000_000_000 + i)
    producer.close()
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=7,
                                      batching_max_publish_delay_ms=50,
                                      compression_type=pulsar.CompressionType.LZ4)
    for i in range(n_batched):
        producer.send_async(f"batched-{i}".encode() * 3, None, properties={"b": str(i)})
    producer.flush()
    producer.close()


def read_all(client, topic: str, n: int) -> list[tuple]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out = []
    for _ in range(n):
        m = reader.read_next(timeout_millis=TIMEOUT_MS)
        mid = m.message_id()
        out.append((m.data(), (mid.ledger_id(), mid.entry_id(), mid.batch_index()), m.properties(),
                    m.partition_key(), m.event_timestamp(), m.publish_timestamp()))
    with pytest.raises(Exception, match="(?i)timeout"):
        reader.read_next(timeout_millis=1_000)
    reader.close()
    return out


def unload(admin_url: str, topic: str) -> None:
    """Unload (drops the broker's entry cache): later reads come from storage."""
    status, body = http("PUT", topic_url(admin_url, topic) + "/unload")
    assert status == 204, body


def s3_keys(s3_server, tier_uri: str) -> set[str]:
    bucket, _, prefix = tier_uri[len("s3://"):].partition("/")
    s3 = s3_server.client()
    keys = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        keys.update(f"s3://{bucket}/{o['Key']}" for o in page.get("Contents", []))
    return keys


def keep_everything(admin_url: str) -> None:
    """Infinite retention in public/default (otherwise ledgers nobody subscribed to are trimmed)."""
    status, body = http("POST", f"{admin_url}/admin/v2/namespaces/public/default/retention",
                        {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
    assert status == 204, body


def broker_overrides(tier_uri: str, endpoint: str = "", **extra) -> dict:
    """Small ledgers offloaded at once. The lake's small-file merge is off (the lake tests assert
    the zero-copy table, one file per ledger); tests/integration/test_lake_merge.py turns it on."""
    return {"tier_uri": tier_uri, "tier_s3_endpoint_url": endpoint, "rollover_entries_max": ENTRIES_PER_LEDGER,
            "offload_deletion_lag_ms": 0, "offload_check_interval_ms": 500,
            "offload.lake_merge_target_bytes": 0, **extra}


# -- tests ---------------------------------------------------------------------------------------
def test_offload_to_s3_then_read_everything_from_the_tier(cluster_factory, s3_server, s3_tier_uri):
    cluster = cluster_factory(3, brokers=1, broker_overrides=broker_overrides(s3_tier_uri, s3_server.endpoint_url))
    topic = "tiered"
    keep_everything(cluster.admin_url)
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        produce(client, f"persistent://public/default/{topic}", 45, 60)
        before = read_all(client, topic, 105)
        assert len({m[1][:2] for m in before}) > 3 * ENTRIES_PER_LEDGER   # several ledgers' worth

        closed = offload_everything_closed(cluster.admin_url, topic)
        assert len(closed) >= 4
        ledgers = wait_bookie_deleted(cluster.admin_url, topic, [i["ledgerId"] for i in closed])
        uris = {i["offloadUri"] for i in ledgers}
        assert all(i["offloaded"] and i["offloadUri"].startswith(s3_tier_uri + "/") for i in ledgers)
        assert s3_keys(s3_server, s3_tier_uri) == uris             # one object per ledger, nothing else

        # the bookie copies are gone: their ledger metadata is deleted
        from pulsarlite.metadata_layout import ledger_path
        from kazoo.client import KazooClient
        zk = KazooClient(hosts=cluster.zookeeper)
        zk.start(timeout=30)
        try:
            assert not any(zk.exists(ledger_path(i["ledgerId"])) for i in ledgers)
        finally:
            zk.stop()
            zk.close()

        unload(cluster.admin_url, topic)
        after = read_all(client, topic, 105)
        assert after == before

        # a durable subscription from earliest over the tier, and new messages after it
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"fresh")
        got = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(106)]
        assert [m.data() for m in got] == [m[0] for m in before] + [b"fresh"]
        assert [(m.message_id().ledger_id(), m.message_id().entry_id(), m.message_id().batch_index())
                for m in got[:105]] == [m[1] for m in before]
        for m in got:
            consumer.acknowledge(m)
    finally:
        client.close()


def test_file_tier_and_topic_deletion_removes_objects(cluster_factory, tmp_path):
    tier_dir = tmp_path / "tier"
    tier_dir.mkdir()
    cluster = cluster_factory(3, brokers=1, broker_overrides=broker_overrides(f"file://{tier_dir}"))
    topic = "file-tiered"
    keep_everything(cluster.admin_url)
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        produce(client, topic, 35, 0)
        before = read_all(client, topic, 35)
        closed = offload_everything_closed(cluster.admin_url, topic)
        ledgers = wait_bookie_deleted(cluster.admin_url, topic, [i["ledgerId"] for i in closed])
        files = {p for p in tier_dir.rglob("*") if p.is_file()}
        assert {f"file://{p}" for p in files} == {i["offloadUri"] for i in ledgers}
        unload(cluster.admin_url, topic)
        assert read_all(client, topic, 35) == before
    finally:
        client.close()
    status, body = http("DELETE", topic_url(cluster.admin_url, topic) + "?force=true")
    assert status == 204, body
    assert not [p for p in tier_dir.rglob("*") if p.is_file()]


def test_s3_failure_leaves_the_bookies_alone(cluster_factory, s3_server):
    missing = "s3://no-such-bucket-pulsarlite/x"
    cluster = cluster_factory(3, brokers=1, broker_overrides=broker_overrides(missing, s3_server.endpoint_url))
    topic = "s3-broken"
    keep_everything(cluster.admin_url)
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        produce(client, topic, 25, 0)
        before = read_all(client, topic, 25)
        current = internal_stats(cluster.admin_url, topic)["ledgers"][-1]["ledgerId"]
        status, body = http("PUT", topic_url(cluster.admin_url, topic) + "/offload",
                            {"ledgerId": current, "entryId": 0})
        assert status == 204, body

        def failed():
            code, got = http("GET", topic_url(cluster.admin_url, topic) + "/offload")
            return got["status"] == "ERROR" and got

        got = wait_for(failed, 120, "offload ERROR", interval_s=0.2)
        assert got["lastError"]
        states = {i["offloadState"] for i in internal_stats(cluster.admin_url, topic)["ledgers"]}
        assert states <= {"none", "offloading"}
        unload(cluster.admin_url, topic)
        assert read_all(client, topic, 25) == before
    finally:
        client.close()


def test_bad_offload_requests_change_nothing(cluster_factory, tmp_path):
    cluster = cluster_factory(3, brokers=1, broker_overrides=broker_overrides(f"file://{tmp_path}"))
    url = topic_url(cluster.admin_url, "t")
    assert http("PUT", url)[0] == 204
    assert http("GET", url + "/offload") == (200, {"status": "NOT_RUN", "lastError": ""})
    assert http("PUT", url + "/offload", "nope")[0] == 400
    assert http("PUT", url + "/offload", {"ledgerId": "x", "entryId": 0})[0] == 400
    assert http("PUT", url + "/offload", {"ledgerId": -5, "entryId": 0})[0] == 412
    assert http("PUT", topic_url(cluster.admin_url, "missing") + "/offload", {"ledgerId": 1, "entryId": 0})[0] == 404
    assert http("GET", url + "/offload") == (200, {"status": "NOT_RUN", "lastError": ""})


def owner_broker(cluster, topic: str) -> str:
    status, body = http("GET", f"{cluster.admin_url}/lookup/v2/topic/persistent/public/default/{topic}")
    assert status == 200, body
    port = int(body["brokerUrl"].rsplit(":", 1)[1])
    return next(n for n in cluster.broker_names if cluster.records[n].ports["pulsar"] == port)


def admin_of(cluster, name: str) -> str:
    return f"http://127.0.0.1:{cluster.records[name].ports['http']}"


def test_broker_killed_during_offload_next_owner_finishes_without_orphans(cluster_factory, s3_server,
                                                                          s3_tier_uri):
    overrides = broker_overrides(s3_tier_uri, s3_server.endpoint_url, offload_concurrent_max=1,
                                 zk_session_timeout_ms=6_000)
    cluster = cluster_factory(3, brokers=2, broker_overrides=overrides)
    keep_everything(cluster.admin_url)
    topic = "failover-tiered"
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=60)
    try:
        producer = client.create_producer(f"persistent://public/default/{topic}", batching_enabled=False)
        payloads = [(b"%06d-" % i) * 8_000 for i in range(300)]          # ~48 KB each, 30 ledgers
        for p in payloads:
            producer.send_async(p, None)
        producer.flush()
        producer.close()
        before = read_all(client, topic, len(payloads))
        assert [m[0] for m in before] == payloads

        owner = owner_broker(cluster, topic)
        survivor = next(n for n in cluster.broker_names if n != owner)
        owner_admin = admin_of(cluster, owner)
        current = internal_stats(owner_admin, topic)["ledgers"][-1]["ledgerId"]
        status, body = http("PUT", topic_url(owner_admin, topic) + "/offload", {"ledgerId": current, "entryId": 0})
        assert status == 204, body

        def some_progress():
            states = [i["offloadState"] for i in internal_stats(owner_admin, topic)["ledgers"]]
            return any(s != "none" for s in states) and states

        states = wait_for(some_progress, 120, "the offload to start", interval_s=0.02)
        cluster.kill(owner)                                             # kill -9 mid-offload
        assert any(s in ("none", "offloading") for s in states[:-1]), states   # it was not finished

        # the survivor takes the topic over (after the dead broker's session expires) and is
        # asked again; the ledger left "offloading" is redone (its attempt's object deleted first)
        survivor_admin = admin_of(cluster, survivor)

        def offload_on_survivor():
            try:
                stats = internal_stats(survivor_admin, topic)
                code, _ = http("PUT", topic_url(survivor_admin, topic) + "/offload",
                               {"ledgerId": stats["ledgers"][-1]["ledgerId"], "entryId": 0})
            except (AssertionError, OSError):
                return False
            return code == 204

        wait_for(offload_on_survivor, 120, "offload accepted by the surviving broker", interval_s=0.5)

        def finished():
            code, got = http("GET", topic_url(survivor_admin, topic) + "/offload")
            return code == 200 and got["status"] == "SUCCESS"

        wait_for(finished, 180, "offload SUCCESS on the survivor", interval_s=0.2)
        ledgers = internal_stats(survivor_admin, topic)["ledgers"]
        closed = [i["ledgerId"] for i in ledgers[:-1] if i["entries"] > 0]
        done = wait_bookie_deleted(survivor_admin, topic, closed)

        # no orphans: the bucket holds exactly the objects the metadata names
        assert s3_keys(s3_server, s3_tier_uri) == {i["offloadUri"] for i in done}

        unload(survivor_admin, topic)
        assert read_all(client, topic, len(payloads)) == before
    finally:
        client.close()


def test_namespace_threshold_offloads_on_rollover_and_timer(cluster_factory, tmp_path):
    tier_dir = tmp_path / "tier"
    cluster = cluster_factory(3, brokers=1, broker_overrides=broker_overrides(
        f"file://{tier_dir}", offload_deletion_lag_ms=3_600_000))
    keep_everything(cluster.admin_url)
    ns = f"{cluster.admin_url}/admin/v2/namespaces/public/default"
    # keep at most ~2 ledgers' bytes on the bookies; the namespace's lag (0) beats the broker's 1 h
    assert http("POST", ns + "/offloadThreshold", 2_000)[0] == 204
    assert http("POST", ns + "/offloadDeletionLagMs", 0)[0] == 204
    assert http("GET", ns + "/offloadThreshold") == (200, 2_000)
    topic = "policy-tiered"
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        produce(client, topic, 60, 0)            # 6 ledgers of ~1 KB
        before = read_all(client, topic, 60)

        def offloaded_enough():
            ledgers = internal_stats(cluster.admin_url, topic)["ledgers"]
            on_bookies = sum(i["size"] for i in ledgers if i["offloadState"] in ("none", "offloading"))
            gone = [i for i in ledgers if i["offloadState"] == "bookie-deleted"]
            return on_bookies <= 2_000 and len(gone) >= 3 and ledgers

        ledgers = wait_for(offloaded_enough, 120, "the size threshold to be enforced", interval_s=0.2)
        assert ledgers[-1]["offloadState"] == "none"          # never the current ledger
        # nobody asked: the on-demand status says so
        assert http("GET", topic_url(cluster.admin_url, topic) + "/offload")[1]["status"] == "NOT_RUN"
        unload(cluster.admin_url, topic)
        assert read_all(client, topic, 60) == before
    finally:
        client.close()


def test_topic_offload_policies_override_the_namespace(cluster_factory, tmp_path):
    cluster = cluster_factory(3, brokers=1, broker_overrides=broker_overrides(
        f"file://{tmp_path / 'tier'}", offload_deletion_lag_ms=3_600_000))
    keep_everything(cluster.admin_url)
    topic = "topic-policy"
    url = topic_url(cluster.admin_url, topic) + "/offloadPolicies"
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        produce(client, topic, 40, 0)
        before = read_all(client, topic, 40)
        assert http("GET", url) == (200, None)
        assert http("POST", url, {"managedLedgerOffloadThresholdInBytes": "x"})[0] == 400
        assert http("POST", url, [1])[0] == 400
        assert http("GET", url) == (200, None)                       # a 400 changed nothing
        policies = {"managedLedgerOffloadThresholdInBytes": 0, "managedLedgerOffloadDeletionLagInMillis": 0}
        assert http("POST", url, {**policies, "managedLedgerOffloadDriver": "aws-s3"})[0] == 204
        assert http("GET", url) == (200, policies)
        # the namespace has no threshold: only the topic's own policy offloads its closed ledgers
        closed = [i["ledgerId"] for i in internal_stats(cluster.admin_url, topic)["ledgers"][:-1]]
        assert len(closed) >= 3
        wait_bookie_deleted(cluster.admin_url, topic, closed)
        unload(cluster.admin_url, topic)
        assert read_all(client, topic, 40) == before
        assert http("DELETE", url)[0] == 204
        assert http("GET", url) == (200, None)
    finally:
        client.close()


def test_partition_objects_are_plain_parquet_one_row_per_message(cluster_factory, tmp_path):
    import pyarrow.parquet as pq
    tier_dir = tmp_path / "tier"
    cluster = cluster_factory(3, brokers=1, broker_overrides=broker_overrides(f"file://{tier_dir}"))
    keep_everything(cluster.admin_url)
    assert http("PUT", topic_url(cluster.admin_url, "parted") + "/partitions", 2)[0] == 204
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer("persistent://public/default/parted", batching_enabled=True,
                                          batching_max_messages=5, batching_max_publish_delay_ms=20,
                                          compression_type=pulsar.CompressionType.ZSTD)
        for i in range(200):
            producer.send_async(f"v{i}".encode(), None, partition_key=f"key-{i % 7}", properties={"n": str(i)})
        producer.flush()
        producer.close()
        part = "parted-partition-1"
        before = read_all(client, part, count_messages(client, part))
        closed = offload_everything_closed(cluster.admin_url, part)
        ledgers = wait_bookie_deleted(cluster.admin_url, part, [i["ledgerId"] for i in closed])
        rows = []
        for info in ledgers:
            table = pq.read_table(info["offloadUri"][len("file://"):])
            assert set(table.column("partition").to_pylist()) == {1}
            assert set(table.column("ledger_id").to_pylist()) == {info["ledgerId"]}
            rows += [(v, (info["ledgerId"], e, b if b >= 0 else -1), p, k) for v, e, b, p, k in zip(
                table.column("value").to_pylist(), table.column("entry_id").to_pylist(),
                table.column("batch_index").to_pylist(), table.column("properties").to_pylist(),
                table.column("key").to_pylist())]
        offloaded = [m for m in before if m[1][0] in {i["ledgerId"] for i in ledgers}]
        assert len(rows) == len(offloaded) > 0
        assert [(r[0], r[1], dict(r[2]), r[3]) for r in rows] == [(m[0], m[1], m[2], m[3]) for m in offloaded]
        unload(cluster.admin_url, part)
        assert read_all(client, part, len(before)) == before
    finally:
        client.close()


def count_messages(client, topic: str) -> int:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    n = 0
    try:
        while True:
            reader.read_next(timeout_millis=2_000)
            n += 1
    except Exception as e:   # the first timeout ends the count
        if "timeout" not in str(e).lower():
            raise
    finally:
        reader.close()
    return n


def test_objects_lost_in_s3_are_redone_before_any_bookie_copy_goes(cluster_factory, tmp_path, monkeypatch):
    """Invariant 6 under S3 trouble: offloaded (bookie copies kept by the lag), then the S3
    endpoint dies and comes back empty. Once the lag allows deletion, the verification finds the
    objects gone: the ledgers go back to offloading, are offloaded again, and only then leave
    the bookies."""
    from tests.local_s3 import LocalS3Server
    s3 = LocalS3Server(tmp_path / "moto")
    s3.start()
    try:
        for k, v in s3.env.items():               # the brokers inherit the test credentials
            if k != "AWS_ENDPOINT_URL":
                monkeypatch.setenv(k, v)
        s3.create_bucket("own")
        tier = "s3://own/tier"
        cluster = cluster_factory(3, brokers=1, broker_overrides=broker_overrides(tier, s3.endpoint_url))
        keep_everything(cluster.admin_url)
        ns = f"{cluster.admin_url}/admin/v2/namespaces/public/default"
        assert http("POST", ns + "/offloadDeletionLagMs", 3_600_000)[0] == 204
        topic = "s3-lost"
        client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
        try:
            produce(client, topic, 30, 14)
            before = read_all(client, topic, 44)
            closed = offload_everything_closed(cluster.admin_url, topic)
            assert {i["offloadState"] for i in closed} == {"offloaded"}
            first_uris = {i["offloadUri"] for i in closed}

            port = s3.port
            s3.stop()                                       # S3 dies and comes back empty
            s3 = LocalS3Server(tmp_path / "moto2", port=port)
            s3.start()
            s3.create_bucket("own")
            # offloaded, objects gone, bookie copies still there: reads fall back to the bookies
            unload(cluster.admin_url, topic)
            assert read_all(client, topic, 44) == before
            assert http("POST", ns + "/offloadDeletionLagMs", 0)[0] == 204

            ledgers = wait_bookie_deleted(cluster.admin_url, topic, [i["ledgerId"] for i in closed])
            uris = {i["offloadUri"] for i in ledgers}
            assert not uris & first_uris                    # every object was written again
            keys = set()
            for page in s3.client().get_paginator("list_objects_v2").paginate(Bucket="own", Prefix="tier/"):
                keys.update(f"s3://own/{o['Key']}" for o in page.get("Contents", []))
            assert keys == uris
            unload(cluster.admin_url, topic)
            assert read_all(client, topic, 44) == before
        finally:
            client.close()
    finally:
        s3.stop()


def test_a_ledger_of_many_bookie_replies_streams_to_the_tier_and_reads_back(cluster_factory, tmp_path):
    """[perf] Streaming offload: the broker reads a closed ledger one bookie reply at a time
    (replies of at most 64 KiB here) into a pipe of 64 KiB to the encoder, which writes row
    groups (32 KiB) to the object as it goes; the object (many row groups, no temp file left)
    reads back through the broker exactly as the bookies did."""
    import pyarrow.parquet as pq
    tier_dir = tmp_path / "tier"
    tier_dir.mkdir()
    cluster = cluster_factory(3, brokers=1, bookie_overrides={"read_bytes_max": 64 * 1024},
                              broker_overrides=broker_overrides(
                                  f"file://{tier_dir}", rollover_entries_max=10_000,
                                  **{"offload.read_ahead_bytes": 64 * 1024, "offload.row_group_bytes": 32 * 1024}))
    topic = "streamed"
    keep_everything(cluster.admin_url)
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(300):                 # ~1.2 MB in one ledger: ~19 bookie replies
            producer.send_async(bytes([i % 251]) * 4000 + str(i).encode(), None, properties={"i": str(i)})
        producer.flush()
        producer.close()
        unload(cluster.admin_url, topic)     # closes the ledger: the next one is current
        before = read_all(client, topic, 300)
        closed = offload_everything_closed(cluster.admin_url, topic)
        assert len(closed) == 1 and closed[0]["entries"] == 300 and closed[0]["size"] > 16 * 64 * 1024
        (ledger,) = wait_bookie_deleted(cluster.admin_url, topic, [closed[0]["ledgerId"]])
        path = ledger["offloadUri"][len("file://"):]
        assert pq.ParquetFile(path).num_row_groups >= 16
        assert not [p for p in tier_dir.rglob("*") if p.name.startswith(".tmp-")]
        unload(cluster.admin_url, topic)
        assert read_all(client, topic, 300) == before      # from the tier now: the same messages
    finally:
        client.close()
