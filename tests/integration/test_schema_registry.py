"""The schema registry with the official client's Avro and JSON schemas, compatibility strategies
per namespace, and Pulsar's schema admin paths, against real broker and bookie processes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

pulsar = pytest.importorskip("pulsar")
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String  # noqa: E402

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000


class UserV1(Record):
    _sorted_fields = True
    name = String()
    age = Integer()


class UserV2(Record):                     # adds a field with a default: FULL compatible
    _sorted_fields = True
    name = String()
    age = Integer()
    email = String(required_default=True)


class UserV2NoDefault(Record):            # adds a field without a default: old data lacks it
    _sorted_fields = True
    name = String()
    age = Integer()
    email = String()


class UserBadType(Record):                # age changes type: not compatible either way
    _sorted_fields = True
    name = String()
    age = String()


def _rename(cls, name: str):
    """The official client names the Avro record after the class; versions of one record type
    must share the name, as they would across releases of a real application."""
    cls.__name__ = name
    return cls


for _cls in (UserV1, UserV2, UserV2NoDefault, UserBadType):
    _rename(_cls, "User")


@pytest.fixture
def env(cluster_factory):
    cluster = cluster_factory(3, brokers=1)
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        yield cluster, client
    finally:
        client.close()


def http(method: str, url: str, body=None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, (json.loads(raw) if raw else None)


def schema_url(cluster, topic: str) -> str:
    return f"{cluster.admin_url}/admin/v2/schemas/public/default/{topic}"


def test_avro_versions_evolve_compatibly_and_incompatible_producers_are_refused(env):
    cluster, client = env
    topic = "persistent://public/default/users-avro"
    consumer = client.subscribe(topic, "sub", schema=AvroSchema(UserV1),
                                initial_position=pulsar.InitialPosition.Earliest)
    p1 = client.create_producer(topic, schema=AvroSchema(UserV1))
    p1.send(UserV1(name="ada", age=36))
    with pytest.raises(Exception, match="(?i)incompatible"):      # old data lacks email, no default
        client.create_producer(topic, schema=AvroSchema(UserV2NoDefault))
    p2 = client.create_producer(topic, schema=AvroSchema(UserV2))    # a second version
    p2.send(UserV2(name="bob", age=40, email="b@x"))

    with pytest.raises(Exception, match="(?i)incompatible"):
        client.create_producer(topic, schema=AvroSchema(UserBadType))

    got = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(2)]
    assert [(m.value().name, m.value().age) for m in got] == [("ada", 36), ("bob", 40)]

    status, versions = http("GET", schema_url(cluster, "users-avro") + "/schemas")
    assert status == 200
    assert [v["version"] for v in versions["getSchemaResponses"]] == [0, 1]
    assert all(v["type"] == "AVRO" for v in versions["getSchemaResponses"])
    fields = {f["name"] for f in json.loads(versions["getSchemaResponses"][1]["data"])["fields"]}
    assert fields == {"name", "age", "email"}
    # the refused producer changed nothing
    status, latest = http("GET", schema_url(cluster, "users-avro") + "/schema")
    assert status == 200 and latest["version"] == 1


def test_json_schema_and_namespace_strategy(env):
    cluster, client = env
    ns_url = f"{cluster.admin_url}/admin/v2/namespaces/public/default"
    topic = "persistent://public/default/users-json"
    producer = client.create_producer(topic, schema=JsonSchema(UserV1))
    producer.send(UserV1(name="cy", age=3))

    # ALWAYS_COMPATIBLE lets the type change through; ALWAYS_INCOMPATIBLE refuses even a compatible one
    assert http("PUT", ns_url + "/schemaCompatibilityStrategy", "ALWAYS_COMPATIBLE")[0] == 204
    assert http("GET", ns_url + "/schemaCompatibilityStrategy") == (200, "ALWAYS_COMPATIBLE")
    client.create_producer(topic, schema=JsonSchema(UserBadType)).close()
    assert http("PUT", ns_url + "/schemaCompatibilityStrategy", "ALWAYS_INCOMPATIBLE")[0] == 204
    with pytest.raises(Exception, match="(?i)incompatible"):
        client.create_producer(topic, schema=JsonSchema(UserV2))
    # a known version is always accepted
    client.create_producer(topic, schema=JsonSchema(UserV1)).close()
    assert http("PUT", ns_url + "/schemaCompatibilityStrategy", "SIDEWAYS")[0] == 412

    # auto update off: producers cannot add versions, the admin can
    assert http("PUT", ns_url + "/schemaCompatibilityStrategy", "FULL")[0] == 204
    other = "persistent://public/default/users-json-2"
    client.create_producer(other, schema=JsonSchema(UserV1)).close()
    assert http("POST", ns_url + "/isAllowAutoUpdateSchema", False)[0] == 204
    with pytest.raises(Exception, match="(?i)incompatible"):
        client.create_producer(other, schema=JsonSchema(UserV2))
    status, body = http("POST", schema_url(cluster, "users-json-2") + "/schema",
                        {"type": "JSON", "schema": json.dumps(UserV2.schema()), "properties": {}})
    assert status == 200 and body == {"version": 1}, body
    client.create_producer(other, schema=JsonSchema(UserV2)).close()   # now a known version
    assert http("POST", ns_url + "/isAllowAutoUpdateSchema", True)[0] == 204


def test_admin_upload_compatibility_check_and_delete(env):
    cluster, client = env
    url = schema_url(cluster, "admin-only")
    v1 = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
    v2_bad = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}, {"name": "b", "type": "string"}]}

    assert http("GET", url + "/schema")[0] == 404
    assert http("POST", url + "/schema", {"type": "AVRO", "schema": json.dumps(v1)}) == (200, {"version": 0})
    status, verdict = http("POST", url + "/compatibility", {"type": "AVRO", "schema": json.dumps(v2_bad)})
    assert status == 200 and verdict["isCompatible"] is False and verdict["schemaCompatibilityStrategy"] == "FULL"
    assert "b" in verdict["reason"]
    assert http("POST", url + "/schema", {"type": "AVRO", "schema": json.dumps(v2_bad)})[0] == 409
    # bad input: a clear 400, nothing stored
    assert http("POST", url + "/schema", {"type": "AVRO", "schema": "{not json"})[0] == 400
    assert http("POST", url + "/schema", {"type": "NOPE", "schema": ""})[0] == 400
    status, got = http("GET", url + "/schema/0")
    assert status == 200 and json.loads(got["data"]) == v1
    assert http("GET", url + "/schema/7")[0] == 404
    assert http("GET", url + "/schema/x")[0] == 400

    assert http("DELETE", url + "/schema") == (200, {"version": 1})
    assert http("GET", url + "/schema")[0] == 404
    # after a delete, any schema starts afresh (no check against the deleted versions)
    assert http("POST", url + "/schema", {"type": "AVRO", "schema": json.dumps(v2_bad)}) == (200, {"version": 2})


def test_partitions_share_the_parent_schema(env):
    cluster, client = env
    ns = f"{cluster.admin_url}/admin/v2/persistent/public/default"
    status, _ = http("PUT", ns + "/parted/partitions", 2)
    assert status in (204, 200)
    producer = client.create_producer("persistent://public/default/parted", schema=AvroSchema(UserV1))
    for i in range(4):
        producer.send(UserV1(name=f"n{i}", age=i))
    status, got = http("GET", schema_url(cluster, "parted") + "/schemas")
    assert status == 200 and len(got["getSchemaResponses"]) == 1
