"""[schema] Typed columns in offloaded Parquet, end to end: real ZooKeeper, bookies and a broker
(cluster_factory) with a file:// tier, the official client's AvroSchema producers, real Spark.

An Avro topic (nested record, array, map, a timestamp-millis field, optional fields, a field
named like a metadata column) written under version 0, then under a compatible version 1 that
adds a field; its closed ledgers offloaded and deleted from the bookies. The objects, read with
plain pyarrow and with ``spark.read.parquet``, hold the record's fields as typed columns (rows of
version 0 null in the new field), and the pulsarlite Spark source returns from the tier exactly
what it returned from the bookies before the offload, taking the stored columns (not decoding
``value`` again), also after a version 2 adds another field.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.request
from pathlib import Path

import pytest

from tests.integration.helpers import spark_session
from tests.integration.test_offload_broker import (broker_overrides, keep_everything, offload_everything_closed,
                                                   wait_bookie_deleted)

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("pyspark")
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from pulsar.schema import Array, AvroSchema, Integer, Long, Map, Record, String  # noqa: E402

pytestmark = pytest.mark.integration

TIMEOUT_MS = 30_000
T0_MS = 1_714_564_800_000            # 2024-05-01T12:00:00Z


class TimestampMillis(Long):
    """A long with Avro's timestamp-millis logical type (the official Record has no such field;
    its AvroSchema encodes through fastavro, which takes ints for it)."""

    def schema_info(self, defined_names):
        return {"type": "long", "logicalType": "timestamp-millis"}

    def schema(self):
        return self.schema_info(set())


class Address(Record):
    _sorted_fields = True
    city = String()
    zip = Integer()


class Order(Record):
    _sorted_fields = True
    at = TimestampMillis(required=True)
    attrs = Map(Long())
    item = String(required=True)
    key = String()                          # named like a metadata column: value_key
    qty = Integer(required=True)
    ship = Address()
    tags = Array(String())


class OrderV1(Record):
    _sorted_fields = True
    at = TimestampMillis(required=True)
    attrs = Map(Long())
    item = String(required=True)
    key = String()
    qty = Integer(required=True)
    ship = Address()
    shop = String(required_default=True)    # added (default null)
    tags = Array(String())


class OrderV2(Record):
    _sorted_fields = True
    at = TimestampMillis(required=True)
    attrs = Map(Long())
    item = String(required=True)
    key = String()
    note = String(required_default=True)    # added again, after the offload
    qty = Integer(required=True)
    ship = Address()
    shop = String(required_default=True)
    tags = Array(String())


OrderV1.__name__ = "Order"                  # one record type, three versions
OrderV2.__name__ = "Order"

TYPED = ["at", "attrs", "item", "value_key", "qty", "ship", "tags", "shop"]   # by first appearance


def fields(i: int) -> dict:
    return {"at": T0_MS + i, "attrs": {"n": i, "sq": i * i}, "item": f"item-{i}", "key": f"k{i}" if i % 4 else None,
            "qty": i, "ship": Address(city=f"c{i % 3}", zip=1000 + i) if i % 2 else None,
            "tags": [f"t{j}" for j in range(i % 3)]}


@pytest.fixture(scope="module")
def spark():
    with spark_session("pulsarlite-typed-tier", {"spark.sql.session.timeZone": "UTC"}) as session:
        yield session


def source_rows(spark, cluster, topic: str, metrics_dir: Path) -> tuple[list[str], dict[str, tuple]]:
    """The pulsarlite source's columns and rows (message id -> every column but topic)."""
    df = (spark.read.format("pulsarlite").option("zookeeper", cluster.zookeeper)
          .option("admin_url", cluster.admin_url).option("metricsDir", str(metrics_dir))
          .option("topic", topic).load())
    names = [f.name for f in df.schema.fields]
    rows = {}
    for r in df.collect():
        d = r.asDict(recursive=True)
        rows[d["message_id"]] = tuple(_plain(d[n]) for n in names)
    return [f"{f.name}:{f.dataType.simpleString()}" for f in df.schema.fields], rows


def _plain(v):
    if isinstance(v, dict):
        return tuple(sorted((k, _plain(x)) for k, x in v.items()))
    if isinstance(v, list):
        return tuple(_plain(x) for x in v)
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    return v


def typed_sources(metrics_dir: Path) -> list[str]:
    return sorted(json.loads(p.read_text())["source"] for p in metrics_dir.glob("typed-*.json"))


def test_offloaded_avro_topic_has_typed_columns_for_pyarrow_and_spark(cluster_factory, spark, tmp_path):
    tier_dir = tmp_path / "tier"
    tier_dir.mkdir()
    cluster = cluster_factory(3, brokers=1, broker_overrides=broker_overrides(f"file://{tier_dir}"))
    keep_everything(cluster.admin_url)
    local = "orders"
    topic = f"persistent://public/default/{local}"
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        p0 = client.create_producer(topic, schema=AvroSchema(Order), batching_enabled=False)
        for i in range(25):
            p0.send(Order(**fields(i)))
        p0.close()
        p1 = client.create_producer(topic, schema=AvroSchema(OrderV1), batching_enabled=True,
                                    batching_max_messages=4, batching_max_publish_delay_ms=20)
        for i in range(25, 45):
            p1.send_async(OrderV1(shop="north", **fields(i)), None)
        p1.flush()
        p1.close()

        # the pulsarlite source from the bookies, before the offload
        columns_before, before = source_rows(spark, cluster, topic, tmp_path / "m-before")
        assert len(before) == 45
        assert [c.split(":")[0] for c in columns_before][-len(TYPED):] == TYPED
        assert typed_sources(tmp_path / "m-before") == []        # nothing on the tier yet

        closed = offload_everything_closed(cluster.admin_url, local)
        ledgers = wait_bookie_deleted(cluster.admin_url, local, [i["ledgerId"] for i in closed])
        objects = [Path(i["offloadUri"][len("file://"):]) for i in ledgers]
        assert len(objects) >= 3 and all(p.is_file() for p in objects)

        # plain pyarrow: typed columns with the record's types, beside the metadata columns
        table = pa.concat_tables([pq.read_table(p) for p in objects])
        schema = table.schema
        assert schema.names[-len(TYPED):] == TYPED
        assert {"value", "key", "entry_header"} <= set(schema.names)          # value kept as raw bytes
        assert schema.field("at").type == pa.timestamp("ms", tz="UTC")
        assert schema.field("attrs").type == pa.map_(pa.string(), pa.int64())
        assert schema.field("item").type == pa.string() and schema.field("qty").type == pa.int32()
        assert schema.field("ship").type == pa.struct([("city", pa.string()), ("zip", pa.int32())])
        assert schema.field("tags").type == pa.list_(pa.string())
        assert schema.field("shop").type == pa.string()
        rows = {r["item"]: r for r in table.to_pylist()}
        assert len(rows) == table.num_rows >= 30
        for item, r in rows.items():
            i = int(item.split("-")[1])
            want = fields(i)
            assert r["qty"] == i and r["at"] == dt.datetime.fromtimestamp((T0_MS + i) / 1000, dt.timezone.utc)
            assert dict(r["attrs"]) == want["attrs"] and r["tags"] == want["tags"]
            assert r["value_key"] == want["key"] and r["key"] is None          # the message key is another thing
            assert r["ship"] == (None if want["ship"] is None else {"city": f"c{i % 3}", "zip": 1000 + i})
            assert r["shop"] == (None if i < 25 else "north")                   # version 0 rows: null
        kv = pq.ParquetFile(objects[0]).metadata.metadata
        doc = json.loads(kv[b"pulsarlite.typed_columns"])
        assert [v[:2] for v in doc["versions"]] == [[0, "AVRO"], [1, "AVRO"]]
        assert doc["undecodable"] == 0 and ["key", "value_key"] in doc["fields"]
        # the broker's metrics count what the offloader decoded (every row of every object)
        metrics = urllib.request.urlopen(cluster.admin_url + "/metrics", timeout=30).read().decode()
        found = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                 if line.startswith("pulsarlite_offload") or line.startswith("pulsarlite_offloaded_bytes")}
        decoded = next(v for k, v in found.items()
                       if k.startswith("pulsarlite_offload_typed_values_total") and 'result="decoded"' in k)
        undecodable = next(v for k, v in found.items()
                           if k.startswith("pulsarlite_offload_typed_values_total") and 'result="undecodable"' in k)
        assert decoded == table.num_rows and undecodable == 0, found
        assert next(v for k, v in found.items() if k.startswith("pulsarlite_offloaded_bytes_total")) > 0

        # Spark's own Parquet reader takes the objects as they are
        sdf = spark.read.parquet(*[str(p) for p in objects])
        assert {f.name for f in sdf.schema.fields} >= set(TYPED)
        assert sdf.count() == table.num_rows
        got = {r["item"]: r for r in sdf.select("item", "qty", "ship", "attrs", "shop").collect()}
        one = got["item-7"]
        assert one["qty"] == 7 and one["ship"]["zip"] == 1007 and one["attrs"] == {"n": 7, "sq": 49}
        assert one["shop"] is None and sdf.where("shop = 'north'").count() == len(
            [r for r in rows.values() if r["shop"] == "north"])

        # the pulsarlite source from the tier: the same rows, taken from the stored columns
        columns_after, after = source_rows(spark, cluster, topic, tmp_path / "m-after")
        assert columns_after == columns_before
        assert after == before
        assert typed_sources(tmp_path / "m-after") == ["stored"] * len(objects)

        # a version added since the offload: the tier rows still come from the stored columns,
        # null in the new field
        p2 = client.create_producer(topic, schema=AvroSchema(OrderV2), batching_enabled=False)
        p2.send(OrderV2(shop="south", note="late", **fields(45)))
        p2.close()
        columns_v2, with_v2 = source_rows(spark, cluster, topic, tmp_path / "m-v2")
        assert columns_v2[:-1] == columns_before and columns_v2[-1] == "note:string"
        names = [c.split(":")[0] for c in columns_v2]
        assert names[-len(TYPED) - 1:] == TYPED + ["note"]
        assert typed_sources(tmp_path / "m-v2") == ["stored"] * len(objects)
        note = names.index("note")
        assert len(with_v2) == 46
        for mid, row in before.items():
            assert with_v2[mid][:note] + with_v2[mid][note + 1:] == row and with_v2[mid][note] is None
        assert [r[note] for r in with_v2.values() if r[note] is not None] == ["late"]
    finally:
        client.close()
