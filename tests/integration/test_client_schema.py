"""Typed producers and consumers of pulsarlite's client (``pulsarlite.schema``) against real
ZooKeeper, bookie and broker processes, side by side with the official client's
``pulsar.schema``: both directions, one registered version for the same record, evolution
through a compatible version with old and new readers, and refusal of incompatible producers."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import urllib.request
from typing import Optional

import pytest

import pulsarlite
import pulsarlite.aio as pla
from pulsarlite import schema as ls

pulsar = pytest.importorskip("pulsar")
import pulsar.schema as ps  # noqa: E402

pytestmark = pytest.mark.integration

TIMEOUT_MS = 20_000


def _user(m, name: str = "User"):
    """The same record declared with either client's schema module."""

    class User(m.Record):
        _sorted_fields = True
        name = m.String()
        age = m.Integer()
        tags = m.Array(m.String())
        scores = m.Map(m.Double())
    User.__name__ = name
    return User


OfficialUser = _user(ps)
OurUser = _user(ls)


class UserV1(ls.Record):
    name = ls.String()
    age = ls.Integer()


class UserV2(ls.Record):          # adds an optional field with a default: FULL compatible
    name = ls.String()
    age = ls.Integer()
    email = ls.String(default="none", required_default=True)


class UserBad(ls.Record):         # age changes type: incompatible both ways
    name = ls.String()
    age = ls.String()


for _cls in (UserV1, UserV2, UserBad):
    _cls.__name__ = "Person"


def http(method: str, url: str, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, (json.loads(raw) if raw else None)


def versions(cluster, topic: str) -> list[dict]:
    status, body = http("GET", f"{cluster.admin_url}/admin/v2/schemas/public/default/{topic}/schemas")
    assert status == 200, body
    return body["getSchemaResponses"]


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory(3, brokers=1)


def test_both_clients_share_versions_and_read_each_other(cluster):
    official = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    ours = pulsarlite.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        for kind, official_schema, our_schema in (
                ("avro", ps.AvroSchema(OfficialUser), ls.AvroSchema(OurUser)),
                ("json", ps.JsonSchema(OfficialUser), ls.JsonSchema(OurUser))):
            topic = f"persistent://public/default/both-{kind}"
            o_cons = official.subscribe(topic, "o", schema=official_schema,
                                        initial_position=pulsar.InitialPosition.Earliest)
            l_cons = ours.subscribe(topic, "l", schema=our_schema,
                                    initial_position=pulsarlite.InitialPosition.Earliest)
            o_prod = official.create_producer(topic, schema=official_schema)
            o_prod.send(OfficialUser(name="ada", age=36, tags=["x"], scores={"a": 1.5}))
            l_prod = ours.create_producer(topic, schema=our_schema)
            l_prod.send(OurUser(name="bob", age=40, tags=[], scores={}))
            l_prod.send(OurUser(name="cy"))     # optional fields left out

            assert len(versions(cluster, f"both-{kind}")) == 1, \
                f"{kind}: the same record must not register a second version"

            got = [l_cons.receive(timeout_millis=TIMEOUT_MS) for _ in range(3)]
            values = [m.value() for m in got]
            assert all(isinstance(v, OurUser) for v in values)
            assert [(v.name, v.age, v.tags, v.scores) for v in values] == [
                ("ada", 36, ["x"], {"a": 1.5}), ("bob", 40, [], {}), ("cy", None, None, None)]
            assert got[0].schema_version() == got[1].schema_version() is not None

            got = [o_cons.receive(timeout_millis=TIMEOUT_MS) for _ in range(3)]
            assert [(m.value().name, m.value().age) for m in got] == [
                ("ada", 36), ("bob", 40), ("cy", None)]
            for c in (o_cons, l_cons):
                c.close()
            o_prod.close()
            l_prod.close()

        # strings and primitives
        topic = "persistent://public/default/both-string"
        o_cons = official.subscribe(topic, "o", schema=ps.StringSchema(),
                                    initial_position=pulsar.InitialPosition.Earliest)
        l_prod = ours.create_producer(topic, schema=ls.StringSchema())
        l_prod.send("héllo")
        assert o_cons.receive(timeout_millis=TIMEOUT_MS).value() == "héllo"
        o_prod = official.create_producer(topic, schema=ps.StringSchema())
        o_prod.send("wörld")
        l_cons = ours.subscribe(topic, "l", schema=ls.StringSchema(),
                                initial_position=pulsarlite.InitialPosition.Earliest)
        assert [l_cons.receive(timeout_millis=TIMEOUT_MS).value() for _ in range(2)] == \
            ["héllo", "wörld"]

        topic = "persistent://public/default/ints"
        l_cons = ours.subscribe(topic, "l", schema=ls.Int64Schema(),
                                initial_position=pulsarlite.InitialPosition.Earliest)
        l_prod = ours.create_producer(topic, schema=ls.Int64Schema(), batching_enabled=False)
        l_prod.send(-5)
        sent = []
        l_prod.send_async(2**40, lambda result, mid: sent.append(result))
        l_prod.flush()
        assert sent == [pulsarlite.Result.Ok]
        assert [l_cons.receive(timeout_millis=TIMEOUT_MS).value() for _ in range(2)] == [-5, 2**40]
        assert versions(cluster, "ints")[0]["type"] == "INT64"
        # a bytes consumer of a typed topic gets the raw payload
        raw = ours.subscribe(topic, "raw", initial_position=pulsarlite.InitialPosition.Earliest)
        assert raw.receive(timeout_millis=TIMEOUT_MS).value() == (-5).to_bytes(8, "big", signed=True)
        # another type on the same topic is refused (FULL, the default)
        with pytest.raises(pulsarlite.IncompatibleSchema):
            ours.create_producer(topic, schema=ls.StringSchema())

        # a partitioned topic: the partitions share the parent's versions
        status, _ = http("PUT", f"{cluster.admin_url}/admin/v2/persistent/public/default/parted/partitions", 3)
        assert status in (200, 204)
        topic = "persistent://public/default/parted"
        l_cons = ours.subscribe(topic, "l", schema=ls.AvroSchema(UserV2),
                                initial_position=pulsarlite.InitialPosition.Earliest)
        l_prod = ours.create_producer(topic, schema=ls.AvroSchema(UserV1))
        for i in range(6):
            l_prod.send(UserV1(name=f"p{i}", age=i), partition_key=f"k{i}")
        got = sorted((u.name, u.email) for u in
                     (l_cons.receive(timeout_millis=TIMEOUT_MS).value() for _ in range(6)))
        assert got == [(f"p{i}", "none") for i in range(6)]
        assert len(versions(cluster, "parted")) == 2     # the consumer's V2 first, then V1

        topic = "persistent://public/default/kv"
        kv = ls.KeyValueSchema(ls.StringSchema(), ls.AvroSchema(OurUser))
        l_cons = ours.subscribe(topic, "l", schema=kv,
                                initial_position=pulsarlite.InitialPosition.Earliest)
        l_prod = ours.create_producer(topic, schema=kv)
        l_prod.send(ls.KeyValue("k1", OurUser(name="kv", age=1)))
        got = l_cons.receive(timeout_millis=TIMEOUT_MS).value()
        assert got.key == "k1" and (got.value.name, got.value.age) == ("kv", 1)
        (stored,) = versions(cluster, "kv")
        assert stored["type"] == "KEY_VALUE" and stored["properties"]["value.schema.type"] == "AVRO"
    finally:
        ours.close()
        official.close()


def test_evolution_old_and_new_readers_and_refusals(cluster):
    ns_url = f"{cluster.admin_url}/admin/v2/namespaces/public/default"
    client = pulsarlite.Client(cluster.service_url, operation_timeout_seconds=30)
    official = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        topic = "persistent://public/default/people"
        old_reader = client.subscribe(topic, "old", schema=ls.AvroSchema(UserV1),
                                      initial_position=pulsarlite.InitialPosition.Earliest)
        p1 = client.create_producer(topic, schema=ls.AvroSchema(UserV1))
        p1.send(UserV1(name="ada", age=36))
        p2 = client.create_producer(topic, schema=ls.AvroSchema(UserV2))
        p2.send(UserV2(name="bob", age=40, email="b@x"))
        p1.send(UserV1(name="cy", age=3))
        assert [v["version"] for v in versions(cluster, "people")] == [0, 1]

        new_reader = client.subscribe(topic, "new", schema=ls.AvroSchema(UserV2),
                                      initial_position=pulsarlite.InitialPosition.Earliest)
        old = [old_reader.receive(timeout_millis=TIMEOUT_MS).value() for _ in range(3)]
        assert [(u.name, u.age) for u in old] == [("ada", 36), ("bob", 40), ("cy", 3)]
        assert all(isinstance(u, UserV1) for u in old)
        new = [new_reader.receive(timeout_millis=TIMEOUT_MS).value() for _ in range(3)]
        assert [(u.name, u.age, u.email) for u in new] == [
            ("ada", 36, "none"), ("bob", 40, "b@x"), ("cy", 3, "none")]

        # the official reader of the new version reads what our old and new producers wrote
        o_cons = official.subscribe(topic, "official", schema=ps.AvroSchema(None, UserV2.schema()),
                                    initial_position=pulsar.InitialPosition.Earliest)
        got = [o_cons.receive(timeout_millis=TIMEOUT_MS).value() for _ in range(3)]
        assert [d["email"] for d in got] == ["none", "b@x", "none"]

        # incompatible under FULL (the default) and BACKWARD: refused, nothing registered
        for strategy in ("FULL", "BACKWARD"):
            assert http("PUT", ns_url + "/schemaCompatibilityStrategy", strategy)[0] == 204
            with pytest.raises(pulsarlite.IncompatibleSchema) as info:
                client.create_producer(topic, schema=ls.AvroSchema(UserBad))
            assert "IncompatibleSchema" in str(info.value)
            assert isinstance(info.value, pulsarlite.BrokerError)
        assert [v["version"] for v in versions(cluster, "people")] == [0, 1]
        # a field without a default: BACKWARD refuses it (old data lacks it), FORWARD lets it in
        no_default = {"type": "record", "name": "Person", "fields": [
            {"name": "name", "type": ["null", "string"]}, {"name": "age", "type": ["null", "int"]},
            {"name": "phone", "type": "string"}]}
        with pytest.raises(pulsarlite.IncompatibleSchema):
            client.create_producer(topic, schema=ls.AvroSchema(no_default))
        assert http("PUT", ns_url + "/schemaCompatibilityStrategy", "FORWARD")[0] == 204
        p3 = client.create_producer(topic, schema=ls.AvroSchema(no_default))
        p3.send({"name": "dee", "age": None, "phone": "555"})
        assert [v["version"] for v in versions(cluster, "people")] == [0, 1, 2]
        assert (old_reader.receive(timeout_millis=TIMEOUT_MS).value().name) == "dee"
        # values that do not fit the schema are refused before anything is sent
        with pytest.raises(ls.SchemaSerializationError):
            p3.send({"name": "eve", "age": None})
        with pytest.raises(TypeError):
            p1.send(UserV2(name="x"))
    finally:
        client.close()
        official.close()


@dataclasses.dataclass
class Reading:
    sensor: str
    value: float
    labels: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ReadingV2:
    sensor: str
    value: float
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    unit: Optional[str] = None


ReadingV2.__name__ = "Reading"


def test_aio_dataclasses_dicts_and_readers(cluster):
    async def main():
        topic = "persistent://public/default/readings"
        async with pla.Client(cluster.service_url, operation_timeout_seconds=30) as client:
            consumer = await client.subscribe(topic, "s", schema=pla_schema(Reading),
                                              initial_position=pla.InitialPosition.Earliest)
            async with await client.create_producer(topic, schema=pla_schema(Reading)) as p:
                await p.send(Reading("t1", 20.5, {"room": "a"}))
            async with await client.create_producer(topic, schema=pla_schema(ReadingV2)) as p:
                await p.send(ReadingV2("t2", 21.0, {}, "C"))
            got = [await consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(2)]
            assert [m.value() for m in got] == [Reading("t1", 20.5, {"room": "a"}),
                                                Reading("t2", 21.0, {})]
            reader = await client.create_reader(topic, pla.MessageId.earliest,
                                                schema=pla_schema(ReadingV2))
            got = [(await reader.read_next(timeout_millis=TIMEOUT_MS)).value() for _ in range(2)]
            assert got == [ReadingV2("t1", 20.5, {"room": "a"}, None), ReadingV2("t2", 21.0, {}, "C")]
            # dicts with an Avro definition read the same data
            as_dict = ls.AvroSchema(ls.dataclass_avro_schema(Reading))
            reader2 = await client.create_reader(topic, pla.MessageId.earliest, schema=as_dict)
            first = (await reader2.read_next(timeout_millis=TIMEOUT_MS)).value()
            assert first == {"sensor": "t1", "value": 20.5, "labels": {"room": "a"}}
            await reader.close()
            await reader2.close()
    asyncio.run(main())


def pla_schema(cls):
    return ls.AvroSchema(cls)


def test_admin_schemas_cli(cluster, tmp_path):
    from .test_cli_admin import fails, ok, run_admin
    home = tmp_path / "home"
    home.mkdir()

    def admin(*args: str):
        return run_admin(*args, home=home, url=cluster.admin_url)

    topic = "persistent://public/default/cli-schemas"
    assert "404" in fails(admin("schemas", "get", topic))
    v1 = tmp_path / "v1.json"        # pulsar-admin's file format
    v1.write_text(json.dumps({"type": "AVRO", "schema": json.dumps(UserV1.schema()), "properties": {}}))
    assert "version 0" in ok(admin("schemas", "upload", topic, "-f", str(v1)))
    v2 = tmp_path / "v2.json"        # a bare Avro definition
    v2.write_text(json.dumps(UserV2.schema()))
    verdict = json.loads(ok(admin("schemas", "compatibility", topic, "-f", str(v2))))
    assert verdict["isCompatible"] is True and verdict["schemaCompatibilityStrategy"] == "FULL"
    assert json.loads(ok(admin("-o", "json", "schemas", "upload", topic, "--file", str(v2)))) == {"version": 1}

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(UserBad.schema()))
    err = fails(admin("schemas", "compatibility", topic, "-f", str(bad)))
    assert "not compatible under FULL" in err
    assert "409" in fails(admin("schemas", "upload", topic, "-f", str(bad)))

    latest = json.loads(ok(admin("schemas", "get", topic)))
    assert latest["version"] == 1 and latest["type"] == "AVRO"
    assert {f["name"] for f in latest["data"]["fields"]} == {"name", "age", "email"}
    assert json.loads(ok(admin("schemas", "get", topic, "--version", "0")))["data"] == UserV1.schema()
    listed = json.loads(ok(admin("schemas", "versions", topic)))
    assert [v["version"] for v in listed] == [0, 1]
    table = ok(admin("schemas", "versions", topic, "-o", "table")).splitlines()
    assert table[0].split()[:3] == ["VERSION", "TYPE", "TIMESTAMP"]
    assert [line.split()[:2] for line in table[1:]] == [["0", "AVRO"], ["1", "AVRO"]]

    # our typed producer uses the uploaded version; an official one with the same record too
    client = pulsarlite.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        client.create_producer(topic, schema=ls.AvroSchema(UserV2)).close()
    finally:
        client.close()
    assert len(json.loads(ok(admin("schemas", "versions", topic)))) == 2

    # bad input: clear errors, nothing changed
    assert fails(admin("schemas", "upload", topic), code=2)
    missing = fails(admin("schemas", "upload", topic, "-f", str(tmp_path / "nope.json")), code=2)
    assert "cannot read" in missing
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    assert "not JSON" in fails(admin("schemas", "upload", topic, "-f", str(junk)), code=2)
    assert fails(admin("schemas", "get", topic, "--version", "-1"), code=2)
    assert "404" in fails(admin("schemas", "get", topic, "--version", "9"))
    assert len(json.loads(ok(admin("schemas", "versions", topic)))) == 2

    ok(admin("schemas", "delete", topic))
    assert "404" in fails(admin("schemas", "get", topic))
    assert json.loads(ok(admin("schemas", "versions", topic))) == []
