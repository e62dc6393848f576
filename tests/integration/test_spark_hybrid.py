"""``spark_source.read_topic``: offloaded segments through Spark's own Parquet reader, the rest
through the Python source, one DataFrame identical to ``spark.read.format("pulsarlite")``'s.
Real ZooKeeper, bookies and broker, a file:// tier (and, for the fallback, the moto S3
endpoint), real Spark in local mode (one session for the module)."""

from __future__ import annotations

import time
import uuid
import warnings

import pytest

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("pyspark")

from tests.integration.helpers import wait_for  # noqa: E402
from tests.integration.test_spark_source import (ROLLOVER_ENTRIES, admin, ledger_list,  # noqa: E402
                                                  produce, tiered_cluster)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(module_tmp_path):
    tier = module_tmp_path / "tier"
    tier.mkdir()
    with tiered_cluster(module_tmp_path / "hybrid-cluster", tier.as_uri()) as c:
        yield c


@pytest.fixture(scope="module")
def client(module_client):
    """Module scope: module-scoped fixtures produce with it."""
    return module_client


def fmt(spark, cluster, **options):
    reader = spark.read.format("pulsarlite").option("zookeeper", cluster.zookeeper).option("admin_url",
                                                                                          cluster.admin_url)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def hybrid(spark, cluster, topic=None, **options):
    import spark_source
    return spark_source.read_topic(spark, topic, zookeeper=cluster.zookeeper, admin_url=cluster.admin_url,
                                   **options)


def rows_by_id(df) -> dict[str, dict]:
    rows = [r.asDict(recursive=True) for r in df.collect()]
    out = {r["message_id"]: r for r in rows}
    assert len(out) == len(rows), "a message id twice"
    return out


def closed_ledgers(cluster, local: str) -> list[int]:
    return [lg["ledger_id"] for lg in ledger_list(cluster, local) if lg["state"] == "CLOSED" and lg["entries"] > 0]


def offload_before(cluster, local: str, ledger_id: int, offloaded: list[int]) -> None:
    """Offload every ledger before ``ledger_id``; wait until ``offloaded`` are gone from the bookies."""
    admin(cluster.admin_url, "PUT", f"/admin/v2/persistent/public/default/{local}/offload",
          {"ledgerId": ledger_id, "entryId": 0})
    wait_for(lambda: all(lg["offload"]["state"] == "bookie-deleted" for lg in ledger_list(cluster, local)
                         if lg["ledger_id"] in offloaded), 120, f"ledgers {offloaded} offloaded")


def plan_record(m) -> dict:
    import glob
    import json
    import os
    files = glob.glob(os.path.join(m, "hybrid-*.json"))
    assert len(files) == 1, files
    with open(files[0]) as f:
        return json.load(f)


def test_half_offloaded_topic_identical_to_the_format(spark, cluster, client, tmp_path):
    topic = f"persistent://public/default/half-{uuid.uuid4().hex[:6]}"
    local = topic.rsplit("/", 1)[1]
    sent = produce(client, topic, 4 * ROLLOVER_ENTRIES + 10)
    sent.update(produce(client, topic, 90, batching=True, tag="b"))
    closed = closed_ledgers(cluster, local)
    assert len(closed) >= 4
    half = closed[:len(closed) // 2]
    offload_before(cluster, local, closed[len(closed) // 2], half)

    m = tmp_path / "m"
    df = hybrid(spark, cluster, topic, metricsDir=str(m))
    plan = plan_record(m)
    assert sorted(plan["native"]) == sorted(half)           # the tier half natively
    assert set(plan["python"]) >= set(closed[len(half):])    # the rest from the bookies
    assert df.schema == fmt(spark, cluster, topic=topic).schema
    got, want = rows_by_id(df), rows_by_id(fmt(spark, cluster, topic=topic))
    assert set(got) == set(sent)
    assert got == want                                     # every column of every message
    assert all(bytes(got[k]["value"]) == v for k, v in sent.items())
    # positions: from inside a batch of a tier ledger to inside a batch on the bookies
    ids = sorted(got, key=lambda k: tuple(int(x) for x in k.split(":")))
    start, end = ids[5], ids[-7]
    sl, se, _, sb = start.split(":")
    el, ee, _, eb = end.split(":")
    opts = dict(startingOffsets=f'{{"{topic}": "{sl}:{se}:-1:{sb}"}}',
                endingOffsets=f'{{"{topic}": "{el}:{ee}:-1:{eb}"}}')
    part = rows_by_id(hybrid(spark, cluster, topic, **opts))
    assert part == rows_by_id(fmt(spark, cluster, topic=topic, **opts))
    assert set(part) == set(ids[5:-7])


def test_partitioned_topic_and_pattern(spark, cluster, client, tmp_path):
    """Two partitions, one with offloaded ledgers: partition and message id columns the same as
    the format's, natively or not; a topicsPattern finds the same."""
    name = f"hpart-{uuid.uuid4().hex[:6]}"
    admin(cluster.admin_url, "PUT", f"/admin/v2/persistent/public/default/{name}/partitions", 2)
    topic = f"persistent://public/default/{name}"
    sent = produce(client, topic, 6 * ROLLOVER_ENTRIES, keyed=False,
                   message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
    p0 = f"{name}-partition-0"
    closed = closed_ledgers(cluster, p0)
    assert len(closed) >= 2
    offload_before(cluster, p0, closed[-1], closed[:-1])
    m = tmp_path / "m"
    got = rows_by_id(hybrid(spark, cluster, topic, metricsDir=str(m)))
    assert sorted(plan_record(m)["native"]) == sorted(closed[:-1])
    assert {k: bytes(r["value"]) for k, r in got.items()} == sent
    assert got == rows_by_id(fmt(spark, cluster, topic=topic))
    assert {r["partition"] for r in got.values()} == {0, 1}
    pattern = f"persistent://public/default/{name}.*"
    assert rows_by_id(hybrid(spark, cluster, topicsPattern=pattern)) == got


def test_ledger_moved_to_the_tier_after_planning(spark, cluster, client, tmp_path):
    """A ledger on the bookies at planning, offloaded and deleted from them before the read:
    its rows come from its tier object, none missing, none twice."""
    topic = f"persistent://public/default/moved-{uuid.uuid4().hex[:6]}"
    local = topic.rsplit("/", 1)[1]
    sent = produce(client, topic, 2 * ROLLOVER_ENTRIES + 10)
    closed = closed_ledgers(cluster, local)
    m = tmp_path / "m"
    df = hybrid(spark, cluster, topic, metricsDir=str(m))
    assert plan_record(m)["native"] == []                  # planned: everything on the bookies
    offload_before(cluster, local, closed[1], closed[:1])
    got = rows_by_id(df)
    assert {k: bytes(r["value"]) for k, r in got.items()} == sent


def test_publish_time_prunes_tier_files(spark, cluster, client, tmp_path):
    topic = f"persistent://public/default/pruned-{uuid.uuid4().hex[:6]}"
    local = topic.rsplit("/", 1)[1]
    cut = None
    for burst in range(4):                                 # one ledger per burst
        produce(client, topic, ROLLOVER_ENTRIES, tag=f"t{burst}")
        time.sleep(1.1)
        if burst == 1:
            cut = int(time.time() * 1000)
            time.sleep(0.2)
    produce(client, topic, 1, tag="open")                  # rolls the last burst's ledger over
    closed = closed_ledgers(cluster, local)
    assert len(closed) >= 4
    offload_before(cluster, local, closed[4] if len(closed) > 4 else closed[-1] + 1, closed[:4])
    everything = hybrid(spark, cluster, topic)
    later = hybrid(spark, cluster, topic, startingTime=str(cut))
    assert len(everything.inputFiles()) == 4
    assert len(later.inputFiles()) == 2                    # the first two ledgers' objects not even listed
    assert rows_by_id(later) == rows_by_id(fmt(spark, cluster, topic=topic, startingTime=str(cut)))
    assert later.count() == 2 * ROLLOVER_ENTRIES + 1
    # a filter on the DataFrame reaches both parts (Parquet row groups, the Python source)
    f = f"publish_time >= timestamp_millis({cut})"
    assert rows_by_id(everything.where(f)) == rows_by_id(fmt(spark, cluster, topic=topic).where(f))
    # positions prune tier files too: startingOffsets at the second ledger, endingOffsets (exclusive)
    # at the fourth: the objects of the second and third only
    opts = dict(startingOffsets=f'{{"{topic}": "{closed[1]}:0"}}', endingOffsets=f'{{"{topic}": "{closed[3]}:0"}}')
    middle = hybrid(spark, cluster, topic, **opts)
    objects = {lg["ledger_id"]: lg["offload"]["uri"] for lg in ledger_list(cluster, local)
               if lg["ledger_id"] in closed[:4]}
    name = lambda uri: uri.rsplit("/", 1)[1]                                  # noqa: E731 (file:/ vs file:///)
    assert sorted(map(name, middle.inputFiles())) == sorted(name(objects[lid]) for lid in closed[1:3])
    assert rows_by_id(middle) == rows_by_id(fmt(spark, cluster, topic=topic, **opts))
    assert middle.count() == 2 * ROLLOVER_ENTRIES


def test_typed_avro_topic_whose_schema_evolved(spark, cluster, client, tmp_path):
    """Avro values under two schema versions across ledgers (the second adds a field): the tier
    objects' stored typed columns, read natively, give what the format gives."""
    from pulsar.schema import AvroSchema, Integer, Record, String

    class Sale(Record):
        _sorted_fields = True
        item = String()
        qty = Integer()

    class SaleV2(Record):
        _sorted_fields = True
        item = String()
        qty = Integer()
        shop = String(required_default=True)

    SaleV2.__name__ = "Sale"
    topic = f"persistent://public/default/sales-{uuid.uuid4().hex[:6]}"
    local = topic.rsplit("/", 1)[1]
    p1 = client.create_producer(topic, schema=AvroSchema(Sale), batching_enabled=False)
    for i in range(2 * ROLLOVER_ENTRIES):
        p1.send(Sale(item=f"i{i}", qty=i))
    p1.close()
    p2 = client.create_producer(topic, schema=AvroSchema(SaleV2), batching_enabled=False)
    for i in range(ROLLOVER_ENTRIES + 5):
        p2.send(SaleV2(item=f"j{i}", qty=1000 + i, shop="north"))
    p2.close()
    closed = closed_ledgers(cluster, local)
    assert len(closed) >= 3
    offload_before(cluster, local, closed[-1], closed[:-1])  # v1, v1, v2 ledgers on the tier; v2 tail on bookies
    m = tmp_path / "m"
    df = hybrid(spark, cluster, topic, metricsDir=str(m))
    assert sorted(plan_record(m)["native"]) == sorted(closed[:-1])
    want = fmt(spark, cluster, topic=topic)
    assert df.schema == want.schema
    assert [f.name for f in df.schema.fields][-3:] == ["item", "qty", "shop"]
    got = rows_by_id(df)
    assert got == rows_by_id(want)
    assert len(got) == 3 * ROLLOVER_ENTRIES + 5
    by_item = {r["item"]: (r["qty"], r["shop"]) for r in got.values()}
    assert by_item["i0"] == (0, None) and by_item["j0"] == (1000, "north")
    assert df.where("shop = 'north'").count() == ROLLOVER_ENTRIES + 5


def test_only_admin_url(spark, cluster, client):
    """No zookeeper option: the broker's admin API says where the metadata store is, for
    read_topic and for the format alike."""
    import spark_source
    topic = f"persistent://public/default/adm-{uuid.uuid4().hex[:6]}"
    sent = produce(client, topic, 25)
    got = rows_by_id(spark_source.read_topic(spark, topic, admin_url=cluster.admin_url))
    assert {k: bytes(r["value"]) for k, r in got.items()} == sent
    df = (spark.read.format("pulsarlite").option("service_url", cluster.service_url)
          .option("admin_url", cluster.admin_url).option("topic", topic).load())
    assert rows_by_id(df) == got
    with pytest.raises(Exception, match="zookeeper or admin_url"):
        spark_source.read_topic(spark, topic)


# -- an s3:// tier in a session without hadoop-aws ---------------------------------------------
@pytest.fixture(scope="module")
def s3_cluster(module_tmp_path, s3_server):
    with tiered_cluster(module_tmp_path / "hybrid-s3-cluster", s3_server.tier_uri(),
                        tier_s3_endpoint_url=s3_server.endpoint_url) as c:
        yield c


def test_s3_tier_without_s3a_falls_back_with_one_warning(spark, s3_cluster, s3_server, tmp_path):
    from spark_source.hybrid import S3TierFallbackWarning, _s3a_available
    if _s3a_available(spark):
        pytest.skip("this Spark session loads S3A (hadoop-aws on the classpath): no fallback to test")
    topic = f"persistent://public/default/s3-{uuid.uuid4().hex[:6]}"
    local = topic.rsplit("/", 1)[1]
    c = pulsar.Client(s3_cluster.service_url, operation_timeout_seconds=30)
    try:
        sent = produce(c, topic, 3 * ROLLOVER_ENTRIES + 5)
    finally:
        c.close()
    closed = closed_ledgers(s3_cluster, local)
    offload_before(s3_cluster, local, closed[2], closed[:2])
    m = tmp_path / "m"
    s3 = dict(s3_endpoint_url=s3_server.endpoint_url, aws_access_key_id=s3_server.env["AWS_ACCESS_KEY_ID"],
              aws_secret_access_key=s3_server.env["AWS_SECRET_ACCESS_KEY"],
              aws_region=s3_server.env["AWS_DEFAULT_REGION"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        df = hybrid(spark, s3_cluster, topic, metricsDir=str(m), **s3)
    fallback = [w for w in caught if issubclass(w.category, S3TierFallbackWarning)]
    assert len(fallback) == 1 and "hadoop-aws" in str(fallback[0].message)
    plan = plan_record(m)
    assert plan["native"] == [] and plan["fallback_s3"] == 2
    got = rows_by_id(df)
    assert {k: bytes(r["value"]) for k, r in got.items()} == sent
    assert got == rows_by_id(fmt(spark, s3_cluster, topic=topic, **s3))


def test_native_tier_read_verifies_page_checksums(spark, cluster, client, tmp_path):
    """Invariant 8 on the native path: a flipped byte in a tier object's page data fails
    the read (Parquet page CRC), it is not returned as data."""
    from urllib.parse import urlparse
    topic = f"persistent://public/default/pagesum-{uuid.uuid4().hex[:6]}"
    local = topic.rsplit("/", 1)[1]
    produce(client, topic, ROLLOVER_ENTRIES + 5)
    closed = closed_ledgers(cluster, local)
    offload_before(cluster, local, closed[-1] + 1, closed[:1])
    uri = next(lg["offload"]["uri"] for lg in ledger_list(cluster, local) if lg["ledger_id"] == closed[0])
    path = urlparse(uri).path
    assert rows_by_id(hybrid(spark, cluster, topic))      # readable before
    import pyarrow.parquet as pq
    col = pq.ParquetFile(path).metadata.row_group(0).column(0)
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    data = bytearray(open(path, "rb").read())
    data[start + col.total_compressed_size - 1] ^= 0xFF    # the last byte of the chunk's last page data
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(Exception, match="checksum verification failed"):   # parquet-mr's page CRC check
        hybrid(spark, cluster, topic).collect()
