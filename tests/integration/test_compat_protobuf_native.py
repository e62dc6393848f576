"""PROTOBUF_NATIVE schema compatibility as Pulsar decides it (issue 32 item 15), with the
official Python client's ProtobufNativeSchema and with REST uploads (for descriptor sets in
another order, as the Go client sends them), against real ZooKeeper, bookie and broker
processes; the namespace keeps Pulsar's default strategy (FULL)."""

from __future__ import annotations

import base64
import json

import pytest
import requests

pulsar = pytest.importorskip("pulsar")
import pulsar.schema as ps  # noqa: E402
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: E402

pytestmark = pytest.mark.integration

NS = "public/default"


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    return module_cluster_factory(3, brokers=1)



def versions(cluster, topic: str) -> list[dict]:
    r = requests.get(f"{cluster.admin_url}/admin/v2/schemas/{NS}/{topic}/schemas", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["getSchemaResponses"]


# -- item 15: PROTOBUF_NATIVE compares the root message name -------------------------------------

def _message_class(package: str, message: str, fields: list[tuple[str, int, int]], file_name: str = "order.proto"):
    """A generated-like protobuf class built in its own pool (two versions of one file)."""
    fd = descriptor_pb2.FileDescriptorProto(name=file_name, package=package, syntax="proto3")
    m = fd.message_type.add(name=message)
    for name, number, kind in fields:
        m.field.add(name=name, number=number, type=kind, label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{message}"))


STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
INT64 = descriptor_pb2.FieldDescriptorProto.TYPE_INT64


def test_protobuf_native_compares_the_root_message_name(client, cluster):
    """Pulsar's ProtobufNativeSchemaCompatibilityCheck (every strategy but ALWAYS_*) refuses only
    a change of the root message's full name ("Protobuf root message isn't allow change!"): a
    field added to ``demo.Order`` is a new version; ``demo.Invoice`` is refused."""
    topic = f"persistent://{NS}/evolve-proto"
    v1 = _message_class("demo", "Order", [("id", 1, STRING)])
    v2 = _message_class("demo", "Order", [("id", 1, STRING), ("amount", 2, INT64)])
    other = _message_class("demo", "Invoice", [("id", 1, STRING)])
    p1 = client.create_producer(topic, schema=ps.ProtobufNativeSchema(v1))
    p1.send(v1(id="a"))
    consumer = client.subscribe(topic, "s", schema=ps.ProtobufNativeSchema(v2),
                                initial_position=pulsar.InitialPosition.Earliest)
    p2 = client.create_producer(topic, schema=ps.ProtobufNativeSchema(v2))
    p2.send(v2(id="b", amount=7))
    got = [consumer.receive(timeout_millis=20_000).value() for _ in range(2)]
    assert [(m.id, m.amount) for m in got] == [("a", 0), ("b", 7)]
    assert [v["version"] for v in versions(cluster, "evolve-proto")] == [0, 1]
    with pytest.raises(pulsar.IncompatibleSchema):
        client.create_producer(topic, schema=ps.ProtobufNativeSchema(other))
    assert len(versions(cluster, "evolve-proto")) == 2
    consumer.close()
    p1.close()
    p2.close()


def test_protobuf_native_descriptor_set_in_another_order_is_compatible(cluster):
    """The Go client orders the files of its descriptor set differently from one process to
    the next; Pulsar deserializes the set and compares root names, so the same message
    declared with its files in another order is accepted (a new version, as the bytes differ),
    while a definition whose root message is not in the set is refused as invalid."""
    dep = descriptor_pb2.FileDescriptorProto(name="money.proto", package="demo", syntax="proto3")
    dep.message_type.add(name="Money").field.add(name="cents", number=1, type=INT64,
                                                 label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    root = descriptor_pb2.FileDescriptorProto(name="order.proto", package="demo", syntax="proto3",
                                              dependency=["money.proto"])
    root.message_type.add(name="Order").field.add(name="total", number=1, type_name=".demo.Money",
                                                  type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                                                  label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)

    def definition(files, root_name="demo.Order") -> dict:
        data = {"fileDescriptorSet": base64.b64encode(
                    descriptor_pb2.FileDescriptorSet(file=files).SerializeToString()).decode(),
                "rootMessageTypeName": root_name, "rootFileDescriptorName": "order.proto"}
        return {"type": "PROTOBUF_NATIVE", "schema": json.dumps(data), "properties": {}}

    url = f"{cluster.admin_url}/admin/v2/schemas/{NS}/proto-order/schema"
    r = requests.post(url, json=definition([dep, root]), timeout=30)
    assert r.status_code == 200, r.text
    r = requests.post(url, json=definition([root, dep]), timeout=30)
    assert r.status_code == 200, r.text
    assert [v["version"] for v in versions(cluster, "proto-order")] == [0, 1]
    r = requests.post(url, json=definition([dep, root], "demo.Refund"), timeout=30)
    assert r.status_code == 400, r.text
    assert len(versions(cluster, "proto-order")) == 2
