"""Avro and JSON schema evolution as Pulsar's schema registry decides it (issue 32 item 4), with
the official Python client (C++ core) against real ZooKeeper, bookie and broker processes; the
namespace keeps Pulsar's default strategy (FULL)."""

from __future__ import annotations

import json

import pytest
import requests

pulsar = pytest.importorskip("pulsar")
import pulsar.schema as ps  # noqa: E402

pytestmark = pytest.mark.integration

NS = "public/default"


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    return module_cluster_factory(3, brokers=1)



def versions(cluster, topic: str) -> list[dict]:
    r = requests.get(f"{cluster.admin_url}/admin/v2/schemas/{NS}/{topic}/schemas", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["getSchemaResponses"]


# -- item 4: Avro resolution, not record names ---------------------------------------------------

class User1(ps.Record):
    name = ps.String()
    age = ps.Integer()


class User2(ps.Record):             # another class name (the record name), one more field with a default
    name = ps.String()
    age = ps.Integer()
    email = ps.String(required=True, required_default=True, default="none")


class User3(ps.Record):             # a required int whose default the client writes as null
    name = ps.String()
    age = ps.Integer()
    email = ps.String(required=True, required_default=True, default="none")
    score = ps.Integer(required=True, required_default=True)


class UserBroken(ps.Record):        # age changes type: no Avro resolution either way
    name = ps.String()
    age = ps.String()


def test_avro_evolution_is_decided_by_resolution_rules_not_record_names(client, cluster):
    """Pulsar's AvroSchemaBasedCompatibilityCheck parses both definitions without validating
    defaults (``setValidateDefaults(false)``) and asks Avro's SchemaValidator (the resolving
    grammar: fields by name, types, defaults) whether one can read the other; the record name is
    not compared. So the official client's ``class User1`` -> ``class User2`` (one more field
    with a default) is a new version under FULL, as is a required field whose default the
    Python client writes as ``null``; a field changing type is still refused."""
    topic = f"persistent://{NS}/evolve-avro"
    p1 = client.create_producer(topic, schema=ps.AvroSchema(User1))
    p1.send(User1(name="ada", age=36))
    p2 = client.create_producer(topic, schema=ps.AvroSchema(User2))
    p2.send(User2(name="bob", age=40, email="b@x"))
    score = json.loads(ps.AvroSchema(User3).schema_info().schema())["fields"][3]
    assert score == {"name": "score", "default": None, "type": "int"}     # not a valid Avro default
    # the broker takes it (the client's own fastavro then refuses to encode with it: its problem)
    p3 = client.create_producer(topic, schema=ps.AvroSchema(User3))
    got = [(v["version"], json.loads(v["data"])["name"]) for v in versions(cluster, "evolve-avro")]
    assert got == [(0, "User1"), (1, "User2"), (2, "User3")]

    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=ps.AvroSchema(UserBroken))
    assert len(versions(cluster, "evolve-avro")) == 3

    # a consumer of the first class still subscribes and reads
    consumer = client.subscribe(topic, "old-reader", schema=ps.AvroSchema(User1))
    p1.send(User1(name="dee", age=5))
    assert consumer.receive(timeout_millis=20_000).value().name == "dee"
    consumer.close()
    for p in (p1, p2, p3):
        p.close()


def test_json_schema_evolution_follows_the_same_rules(client, cluster):
    """Pulsar's JsonSchemaCompatibilityCheck is the Avro check over the JSON schema's Avro
    definition: the renamed class is accepted the same way."""
    topic = f"persistent://{NS}/evolve-json"
    client.create_producer(topic, schema=ps.JsonSchema(User1)).close()
    client.create_producer(topic, schema=ps.JsonSchema(User2)).close()
    assert [v["version"] for v in versions(cluster, "evolve-json")] == [0, 1]
