"""pulsarlite.schema's encoders against the official client's ``pulsar.schema``: the same
record class gives the same Avro definition and the same payload bytes, and each decodes the
other's; the primitive schemas' encodings; dataclasses and dict definitions; bad input."""

from __future__ import annotations

import dataclasses
import enum
import json
import struct
from typing import Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulsarlite import schema as ls
from pulsarlite.client.common import check_schema, consumer_conf, producer_conf
from pulsarlite.client.errors import InvalidConfiguration
from pulsarlite.wire import pb

ps = pytest.importorskip("pulsar.schema")


class Color(enum.Enum):
    red = 1
    green = 2


def declare(m):
    """The same classes declared with either module."""

    class Address(m.Record):
        street = m.String()
        zip = m.Integer(required=True, default=0)

    class Everything(m.Record):
        _avro_namespace = "acme.test"
        name = m.String(required=True)
        small = m.Integer()
        big = m.Long()
        ratio = m.Float()
        exact = m.Double(default=1.5, required_default=True)
        flag = m.Boolean()
        raw = m.Bytes()
        tags = m.Array(m.String())
        counts = m.Map(m.Long())
        home = Address
        color = Color
        places = m.Array(Address())
        by_name = m.Map(Address())

    class Sorted(m.Record):
        _sorted_fields = True
        zeta = m.String()
        alpha = m.Integer(default=7, required_default=True)

    return Everything, Address, Sorted


O_EVERY, O_ADDR, O_SORTED = declare(ps)
L_EVERY, L_ADDR, L_SORTED = declare(ls)


def full(Every, Addr):
    return Every(name="ada", small=-3, big=2**40, ratio=0.25, exact=2.0, flag=True, raw=b"ok",
                 tags=["a", "b"], counts={"x": 1}, home=Addr(street="main", zip=12345),
                 color=Color.green, places=[Addr(street="s", zip=1)],
                 by_name={"h": Addr(street="t", zip=2)})


def test_definitions_match_the_official_client():
    for ours, theirs in ((L_EVERY, O_EVERY), (L_ADDR, O_ADDR), (L_SORTED, O_SORTED)):
        assert ours.schema() == theirs.schema()
        assert json.dumps(ours.schema()) == json.dumps(theirs.schema())   # same field order
        assert ls.AvroSchema(ours).schema_info().schema.decode() == \
            ps.AvroSchema(theirs).schema_info().schema()
        assert ls.JsonSchema(ours).schema_info().schema.decode() == \
            ps.JsonSchema(theirs).schema_info().schema()
    assert [f["name"] for f in L_SORTED.schema()["fields"]] == ["alpha", "zeta"]
    assert L_SORTED.schema()["fields"][0] == {"name": "alpha", "default": 7, "type": ["null", "int"]}


def test_avro_and_json_bytes_match_the_official_client():
    for ours_cls, theirs_cls in ((ls.AvroSchema, ps.AvroSchema), (ls.JsonSchema, ps.JsonSchema)):
        ours, theirs = ours_cls(L_EVERY), theirs_cls(O_EVERY)
        for make in (lambda E, A: full(E, A), lambda E, A: E(name="only")):
            o_bytes = theirs.encode(make(O_EVERY, O_ADDR))
            l_bytes = ours.encode(make(L_EVERY, L_ADDR))
            assert l_bytes == o_bytes, ours_cls.__name__
            back = ours.decode(o_bytes)
            assert isinstance(back, L_EVERY) and back == make(L_EVERY, L_ADDR)
            assert theirs.decode(l_bytes) == make(O_EVERY, O_ADDR)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.text(max_size=20), small=st.none() | st.integers(-2**31, 2**31 - 1),
       big=st.none() | st.integers(-2**63, 2**63 - 1),
       exact=st.floats(allow_nan=False, allow_infinity=False, width=64),
       flag=st.booleans(), raw=st.none() | st.binary(max_size=20),
       tags=st.none() | st.lists(st.text(max_size=5), max_size=4),
       counts=st.none() | st.dictionaries(st.text(max_size=5), st.integers(-2**63, 2**63 - 1),
                                          max_size=3))
def test_random_records_encode_like_the_official_client(name, small, big, exact, flag, raw, tags,
                                                        counts):
    kw = dict(name=name, small=small, big=big, exact=exact, flag=flag, raw=raw, tags=tags,
              counts=counts)
    l_bytes = ls.AvroSchema(L_EVERY).encode(L_EVERY(**kw))
    assert l_bytes == ps.AvroSchema(O_EVERY).encode(O_EVERY(**kw))
    assert ls.AvroSchema(L_EVERY).decode(l_bytes) == L_EVERY(**kw)
    if raw is None:       # the official JSON encoder writes bytes as text: compare without them
        j = ls.JsonSchema(L_EVERY).encode(L_EVERY(**kw))
        assert j == ps.JsonSchema(O_EVERY).encode(O_EVERY(**kw))


def test_records_validate_like_the_official_ones():
    with pytest.raises(TypeError):
        L_EVERY(name="x", small="not an int")
    with pytest.raises(AttributeError):
        L_EVERY(name="x").nope = 1
    with pytest.raises(TypeError):
        ls.Array(int)
    u = L_EVERY(name=b"bytes become text", raw="text becomes bytes", color="red")
    assert u.name == "bytes become text" and u.raw == b"text becomes bytes" and u.color is Color.red
    assert L_EVERY(name="x", home={"street": "s", "zip": 3}).home == L_ADDR(street="s", zip=3)
    assert L_EVERY(name="x") != L_EVERY(name="y")


def test_primitive_encodings_are_the_java_clients():
    cases = [(ls.BooleanSchema(), True, b"\x01"), (ls.BooleanSchema(), False, b"\x00"),
             (ls.Int8Schema(), -2, b"\xfe"), (ls.Int16Schema(), 258, b"\x01\x02"),
             (ls.Int32Schema(), -1, b"\xff\xff\xff\xff"),
             (ls.Int64Schema(), 1, b"\x00" * 7 + b"\x01"),
             (ls.FloatSchema(), 1.5, struct.pack(">f", 1.5)),
             (ls.DoubleSchema(), -0.1, struct.pack(">d", -0.1)),
             (ls.StringSchema(), "héllo", "héllo".encode()), (ls.BytesSchema(), b"\x00", b"\x00")]
    for schema, value, wire in cases:
        assert schema.encode(value) == wire, schema
        assert schema.decode(wire) == value, schema
    assert ls.StringSchema().encode("x") == ps.StringSchema().encode("x")
    with pytest.raises(ls.SchemaSerializationError):
        ls.Int8Schema().encode(300)
    with pytest.raises(ls.SchemaSerializationError):
        ls.Int32Schema().decode(b"\x00")
    with pytest.raises(TypeError):
        ls.Int64Schema().encode(True)
    with pytest.raises(TypeError):
        ls.StringSchema().encode(b"bytes")
    info = ls.Int32Schema().schema_info().to_pb()
    assert (info.type, info.schema_data, info.name) == (pb.Schema.Int32, b"", "INT32")
    assert ls.BytesSchema().schema_info().to_pb() is None          # no schema on the wire
    assert ls.StringSchema().schema_info().schema == ps.StringSchema().schema_info().schema().encode()


@dataclasses.dataclass
class Inner:
    a: int


@dataclasses.dataclass
class Outer:
    name: str
    score: float
    ok: bool
    data: bytes
    inner: Inner
    items: list[Inner]
    labels: dict[str, str]
    color: Color = Color.red
    note: Optional[str] = None


def test_dataclasses_and_dict_definitions():
    definition = ls.dataclass_avro_schema(Outer)
    assert definition["name"] == "Outer"
    types = {f["name"]: f["type"] for f in definition["fields"]}
    assert types["name"] == "string" and types["score"] == "double" and types["ok"] == "boolean"
    assert types["note"] == ["null", "string"] and types["items"] == {"type": "array", "items": "Inner"}
    assert {f["name"]: f.get("default") for f in definition["fields"]}["color"] == "red"
    value = Outer("n", 1.5, True, b"\x01", Inner(1), [Inner(2)], {"k": "v"}, Color.green)
    for schema in (ls.AvroSchema(Outer), ls.JsonSchema(Outer)):
        assert schema.decode(schema.encode(value)) == value, schema
    assert json.loads(ls.JsonSchema(Outer).encode(value))["color"] == 2   # enums by value, as official
    as_dict = ls.AvroSchema(definition)
    assert as_dict.decode(ls.AvroSchema(Outer).encode(value))["inner"] == {"a": 1}
    assert ls.AvroSchema(None, schema_definition=definition).encode(
        {"name": "n", "score": 1.0, "ok": False, "data": b"", "inner": {"a": 1}, "items": [],
         "labels": {}, "color": "red", "note": None}) == \
        ps.AvroSchema(None, schema_definition=definition).encode(
        {"name": "n", "score": 1.0, "ok": False, "data": b"", "inner": {"a": 1}, "items": [],
         "labels": {}, "color": "red", "note": None})
    with pytest.raises(ls.SchemaSerializationError):
        as_dict.encode({"name": "missing the rest"})
    with pytest.raises(TypeError):
        as_dict.encode(value)                  # a dict schema takes dicts
    with pytest.raises(ls.SchemaSerializationError):
        as_dict.decode(b"\xff")
    with pytest.raises(ls.SchemaSerializationError):
        ls.JsonSchema(Outer).decode(b"[1, 2]")
    with pytest.raises(ls.SchemaSerializationError):
        ls.AvroSchema({"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]})
    with pytest.raises(TypeError):
        ls.AvroSchema(int)


def test_client_arguments():
    conf, _, _ = producer_conf(schema=ls.AvroSchema(L_ADDR))
    assert isinstance(conf.schema, ls.AvroSchema)
    assert producer_conf(schema=ls.BytesSchema())[0].schema is None
    assert consumer_conf("s", schema=ls.StringSchema()).schema is not None
    with pytest.raises(InvalidConfiguration, match="pulsarlite.schema"):
        check_schema(ps.AvroSchema(O_ADDR))      # the official client's objects are refused
    with pytest.raises(InvalidConfiguration):
        consumer_conf("s", schema="AVRO")


def test_key_value_schema():
    value_schema = ls.AvroSchema(L_ADDR)
    kv = ls.KeyValueSchema(ls.Int32Schema(), value_schema)
    info = kv.schema_info()
    assert info.type == ls.SchemaType.KEY_VALUE
    assert info.properties["key.schema.type"] == "INT32"
    assert info.properties["value.schema.type"] == "AVRO"
    assert info.properties["kv.encoding.type"] == "INLINE"
    definition = value_schema.schema_info().schema
    # key INT32 has no definition (-1), then the value's definition
    assert info.schema == b"\xff\xff\xff\xff" + struct.pack(">i", len(definition)) + definition
    payload = kv.encode((7, L_ADDR(street="s", zip=1)))
    body = value_schema.encode(L_ADDR(street="s", zip=1))
    assert payload == b"\x00\x00\x00\x04\x00\x00\x00\x07" + struct.pack(">i", len(body)) + body
    back = kv.decode(payload)
    assert back.key == 7 and back.value == L_ADDR(street="s", zip=1)
    assert kv.decode(kv.encode(ls.KeyValue(None, None))) == (None, None)
    for bad in (b"", b"\x00\x00\x00\x09ab", payload + b"x"):
        with pytest.raises(ls.SchemaSerializationError):
            kv.decode(bad)
    with pytest.raises(TypeError):
        kv.encode(7)
    with pytest.raises(TypeError):
        ls.KeyValueSchema(kv, ls.StringSchema())


def test_writer_schemas_are_not_fetched_blocking_on_the_client_loop():
    """pulsarlite.aio resolves writer schemas in receive(); value() on the client's own loop
    must not block it."""
    import asyncio

    from pulsarlite.schema import schemas

    async def main():
        class FakeClient:            # only what the blocking fetch looks at
            loop = asyncio.get_running_loop()
            operation_timeout_s = 1.0
        with pytest.raises(ls.SchemaSerializationError, match="event loop"):
            schemas._fetch_writer_schema_blocking(FakeClient(), "persistent://t/n/x", b"\0" * 8, 1.0)
    asyncio.run(main())


def test_writer_definitions_take_the_readers_record_name():
    writer = pb.Schema(type=pb.Schema.Avro, schema_data=json.dumps(
        {"type": "record", "name": "Old", "namespace": "a.b",
         "fields": [{"name": "zip", "type": "int"}]}).encode())
    reader = ls.AvroSchema({"type": "record", "name": "New", "fields": [
        {"name": "zip", "type": "int"}, {"name": "street", "type": ["null", "string"], "default": None}]})
    from pulsarlite.schema import schemas
    parsed = schemas._writer_definition(writer, reader._schema, "t", b"\0" * 8)
    payload = ls.AvroSchema({"type": "record", "name": "Old", "fields": [{"name": "zip", "type": "int"}]}).encode({"zip": 5})
    assert reader._decode(payload, parsed) == {"zip": 5, "street": None}
    with pytest.raises(ls.SchemaSerializationError):
        schemas._writer_definition(pb.Schema(type=pb.Schema.String, schema_data=b"null"), reader._schema, "t", b"\0" * 8)
    with pytest.raises(ls.SchemaSerializationError):
        schemas._writer_definition(pb.Schema(type=pb.Schema.Avro, schema_data=b"{bad"), reader._schema, "t", b"\0" * 8)
