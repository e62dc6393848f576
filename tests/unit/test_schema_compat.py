"""Schema compatibility (broker/schema_compat.py): Avro resolution rules and strategies."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.schema_compat import (CompatibilityStrategy, IncompatibleSchemaError, InvalidSchemaError, SchemaDef,
                                  avro_read_problems, check_compatible, split_key_value)

S = CompatibilityStrategy


def record(*fields: dict, name: str = "User") -> dict:
    return {"type": "record", "name": name, "fields": list(fields)}


def avro(schema: dict, kind: str = "AVRO") -> SchemaDef:
    return SchemaDef(kind, json.dumps(schema).encode())


V1 = record({"name": "a", "type": "int"})
V2_OPTIONAL_ADDED = record({"name": "a", "type": "int"}, {"name": "b", "type": ["null", "string"], "default": None})
V3_REQUIRED_ADDED = record({"name": "a", "type": "int"}, {"name": "c", "type": "string"})
V4_WIDENED = record({"name": "a", "type": "long"})


def test_reader_field_without_default_missing_in_writer_is_a_problem():
    assert avro_read_problems(V3_REQUIRED_ADDED, V1)          # new reader, old data: no c
    assert not avro_read_problems(V1, V3_REQUIRED_ADDED)      # old reader ignores c


def test_promotions_go_one_way():
    assert not avro_read_problems(V4_WIDENED, V1)             # long reads int
    assert avro_read_problems(V1, V4_WIDENED)                 # int cannot read long
    assert not avro_read_problems("bytes", "string") and not avro_read_problems("string", "bytes")
    assert avro_read_problems("int", "string")


@pytest.mark.parametrize("strategy,new,ok", [
    (S.BACKWARD, V2_OPTIONAL_ADDED, True), (S.FORWARD, V2_OPTIONAL_ADDED, True), (S.FULL, V2_OPTIONAL_ADDED, True),
    (S.BACKWARD, V3_REQUIRED_ADDED, False), (S.FORWARD, V3_REQUIRED_ADDED, True), (S.FULL, V3_REQUIRED_ADDED, False),
    (S.BACKWARD, V4_WIDENED, True), (S.FORWARD, V4_WIDENED, False), (S.FULL, V4_WIDENED, False),
    (S.ALWAYS_COMPATIBLE, V4_WIDENED, True), (S.ALWAYS_INCOMPATIBLE, V2_OPTIONAL_ADDED, False),
    (S.UNDEFINED, V3_REQUIRED_ADDED, False),    # the default is FULL
])
def test_strategies_against_the_latest_version(strategy, new, ok):
    if ok:
        check_compatible(avro(new), [avro(V1)], strategy)
    else:
        with pytest.raises(IncompatibleSchemaError):
            check_compatible(avro(new), [avro(V1)], strategy)


def test_transitive_checks_every_version_plain_only_the_latest():
    # v1: a int; v2: a long (backward ok vs v1); v3: a long + c with default, then drop a default...
    first = record({"name": "a", "type": "int"}, {"name": "x", "type": "string"})
    second = record({"name": "a", "type": "int"}, {"name": "x", "type": "string", "default": ""},
                    {"name": "y", "type": "string", "default": ""})
    # third reads second's data (y present) but not first's (no y, and y has no default here)
    third = record({"name": "a", "type": "int"}, {"name": "x", "type": "string", "default": ""},
                   {"name": "y", "type": "string"})
    history = [avro(first), avro(second)]
    check_compatible(avro(third), history, S.BACKWARD)
    with pytest.raises(IncompatibleSchemaError, match="version 0"):
        check_compatible(avro(third), history, S.BACKWARD_TRANSITIVE)


def test_unions_enums_fixed_arrays_maps_and_named_references():
    color = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}
    color_more = {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}
    assert not avro_read_problems(color_more, color)
    assert avro_read_problems(color, color_more)
    assert not avro_read_problems(dict(color, default="RED"), color_more)
    assert avro_read_problems({"type": "fixed", "name": "F", "size": 4}, {"type": "fixed", "name": "F", "size": 8})
    assert not avro_read_problems({"type": "array", "items": "long"}, {"type": "array", "items": "int"})
    assert avro_read_problems({"type": "map", "values": "int"}, {"type": "map", "values": "long"})
    assert not avro_read_problems(["null", "long"], "int")          # reader union takes int as long
    assert avro_read_problems("int", ["null", "int"])               # null cannot be read as int
    nested = record({"name": "c1", "type": color}, {"name": "c2", "type": "Color"})
    nested_more = record({"name": "c1", "type": color_more}, {"name": "c2", "type": "Color"})
    assert not avro_read_problems(nested_more, nested)
    assert avro_read_problems(nested, nested_more)


def test_recursive_records_terminate():
    node = {"type": "record", "name": "Node", "fields": [
        {"name": "value", "type": "int"}, {"name": "next", "type": ["null", "Node"], "default": None}]}
    assert not avro_read_problems(node, node)


def test_a_record_may_change_its_name_enums_and_fixed_may_not():
    """Pulsar asks Avro's SchemaValidator, whose resolving grammar resolves records by their
    fields whatever their names (the official Python client names the record after the class:
    User1 -> User2 is accepted), and compares the names of enums and fixed types."""
    renamed = dict(V1, name="Person")
    assert not avro_read_problems(renamed, V1)
    check_compatible(avro(dict(V2_OPTIONAL_ADDED, name="User2")), [avro(dict(V1, name="User1"))], S.FULL)
    nested = record({"name": "inner", "type": record({"name": "x", "type": "int"}, name="In1")})
    nested_renamed = record({"name": "inner", "type": record({"name": "x", "type": "int"}, name="In2")})
    assert not avro_read_problems(nested_renamed, nested)
    # renaming does not hide a real difference
    assert avro_read_problems(dict(V3_REQUIRED_ADDED, name="Person"), V1)
    color = {"type": "enum", "name": "Color", "symbols": ["RED"]}
    assert avro_read_problems(dict(color, name="Colour"), color)
    assert not avro_read_problems(dict(color, name="Colour", aliases=["Color"]), color)
    assert avro_read_problems({"type": "fixed", "name": "G", "size": 4}, {"type": "fixed", "name": "F", "size": 4})


def test_defaults_are_not_validated_and_any_default_fills_a_missing_field():
    """Pulsar parses with ``setValidateDefaults(false)``: the official Python client writes
    ``"default": null`` for ``Integer(required=True, required_default=True)``, a default Avro's
    strict parser refuses; Pulsar stores it and counts it as the field's default."""
    with_null_default = record({"name": "a", "type": "int"}, {"name": "n", "type": "int", "default": None})
    check_compatible(avro(with_null_default), [], S.FULL)
    check_compatible(avro(with_null_default), [avro(V1)], S.FULL)
    check_compatible(avro(with_null_default, "JSON"), [avro(V1, "JSON")], S.FULL)
    without = record({"name": "a", "type": "int"}, {"name": "n", "type": "int"})
    with pytest.raises(IncompatibleSchemaError, match="no default"):
        check_compatible(avro(without), [avro(V1)], S.BACKWARD)
    # the structure is still validated
    with pytest.raises(InvalidSchemaError, match="not a valid Avro schema"):
        check_compatible(avro(record({"name": "a", "type": "no-such-type", "default": 1})), [], S.FULL)


def test_invalid_definitions_are_refused_clearly():
    with pytest.raises(InvalidSchemaError, match="not valid JSON"):
        check_compatible(SchemaDef("AVRO", b"{nope"), [], S.FULL)
    with pytest.raises(InvalidSchemaError, match="not a valid Avro schema"):
        check_compatible(SchemaDef("JSON", b'{"type": "record"}'), [], S.FULL)
    with pytest.raises(InvalidSchemaError):
        SchemaDef("NOT_A_TYPE", b"")


def test_primitive_types_must_keep_their_type():
    check_compatible(SchemaDef("STRING", b""), [SchemaDef("STRING", b"")], S.FULL)
    with pytest.raises(IncompatibleSchemaError, match="differs"):
        check_compatible(SchemaDef("INT64", b""), [SchemaDef("STRING", b"")], S.FULL)
    check_compatible(SchemaDef("INT64", b""), [SchemaDef("STRING", b"")], S.ALWAYS_COMPATIBLE)
    # the definition of a primitive type carries nothing: the official Python client sends
    # "null" for STRING, the Java one sends it empty; both are the same schema
    check_compatible(SchemaDef("STRING", b"null"), [SchemaDef("STRING", b"")], S.FULL_TRANSITIVE)
    assert SchemaDef("STRING", b"null").same_as(SchemaDef("STRING", b""))
    assert not SchemaDef("PROTOBUF", b"a").same_as(SchemaDef("PROTOBUF", b"b"))


def kv(key: dict, value: dict) -> SchemaDef:
    k, v = json.dumps(key).encode(), json.dumps(value).encode()
    data = struct.pack(">i", len(k)) + k + struct.pack(">i", len(v)) + v
    return SchemaDef("KEY_VALUE", data, (("key.schema.type", "AVRO"), ("value.schema.type", "AVRO")))


def test_key_value_checks_both_parts():
    key = record({"name": "id", "type": "long"}, name="Key")
    old = kv(key, V1)
    key_part, value_part = split_key_value(old)
    assert key_part.type == "AVRO" and json.loads(value_part.data) == V1
    check_compatible(kv(key, V2_OPTIONAL_ADDED), [old], S.FULL)
    with pytest.raises(IncompatibleSchemaError, match="value: "):
        check_compatible(kv(key, V3_REQUIRED_ADDED), [old], S.FULL)
    with pytest.raises(InvalidSchemaError, match="truncated"):
        check_compatible(SchemaDef("KEY_VALUE", b"\x00\x00\x00\x09{}"), [], S.FULL)


def test_strategy_names_parse_and_refuse_unknowns():
    assert S.parse("backward_transitive") is S.BACKWARD_TRANSITIVE
    with pytest.raises(ValueError, match="unknown schema compatibility strategy"):
        S.parse("SIDEWAYS")


# -- property: a schema always reads itself; adding optional fields keeps FULL -------------------
_field_types = st.sampled_from(["int", "long", "string", "bytes", "double", "boolean"])


@st.composite
def records(draw):
    names = draw(st.lists(st.from_regex(r"[a-y][a-z0-9_]{0,6}", fullmatch=True), min_size=1, max_size=6,
                          unique=True))
    return record(*({"name": n, "type": draw(_field_types)} for n in names))


@settings(max_examples=150, deadline=None)
@given(records(), st.lists(st.from_regex(r"z[a-z0-9]{1,6}", fullmatch=True), max_size=3, unique=True))
def test_property_self_compatible_and_optional_additions_are_full(schema, extra):
    check_compatible(avro(schema), [avro(schema)], S.FULL_TRANSITIVE)
    grown = dict(schema, fields=schema["fields"] + [
        {"name": n, "type": ["null", "string"], "default": None} for n in extra])
    check_compatible(avro(grown), [avro(schema)], S.FULL)


@settings(max_examples=150, deadline=None)
@given(records(), st.data())
def test_property_changing_a_type_without_promotion_is_not_full(schema, data):
    index = data.draw(st.integers(0, len(schema["fields"]) - 1))
    old_type = schema["fields"][index]["type"]
    new_type = "boolean" if old_type != "boolean" else "string"
    changed = dict(schema, fields=[dict(f, type=new_type) if i == index else f
                                   for i, f in enumerate(schema["fields"])])
    with pytest.raises(IncompatibleSchemaError):
        check_compatible(avro(changed), [avro(schema)], S.FULL)


# -- PROTOBUF_NATIVE: the root message name, as Pulsar's ProtobufNativeSchemaCompatibilityCheck ----
def _proto_files():
    from google.protobuf import descriptor_pb2 as d
    optional = d.FieldDescriptorProto.LABEL_OPTIONAL
    dep = d.FileDescriptorProto(name="money.proto", package="demo", syntax="proto3")
    dep.message_type.add(name="Money").field.add(name="cents", number=1, type=d.FieldDescriptorProto.TYPE_INT64,
                                                 label=optional)
    root = d.FileDescriptorProto(name="order.proto", package="demo", syntax="proto3", dependency=["money.proto"])
    order = root.message_type.add(name="Order")
    order.field.add(name="total", number=1, type=d.FieldDescriptorProto.TYPE_MESSAGE, type_name=".demo.Money",
                    label=optional)
    order.nested_type.add(name="Line")
    root.message_type.add(name="Invoice")
    return dep, root


def proto_native(files, root="demo.Order", root_file="order.proto") -> SchemaDef:
    import base64

    from google.protobuf import descriptor_pb2
    data = {"fileDescriptorSet": base64.b64encode(descriptor_pb2.FileDescriptorSet(file=files)
                                                  .SerializeToString()).decode(),
            "rootMessageTypeName": root, "rootFileDescriptorName": root_file}
    return SchemaDef("PROTOBUF_NATIVE", json.dumps(data).encode())


def test_protobuf_native_compares_root_message_names_not_bytes():
    dep, root = _proto_files()
    first, reordered = proto_native([dep, root]), proto_native([root, dep])
    assert first.data != reordered.data and not first.same_as(reordered)
    for strategy in (S.BACKWARD, S.FORWARD, S.FULL, S.FULL_TRANSITIVE):
        check_compatible(reordered, [first], strategy)
    check_compatible(proto_native([dep, root], "demo.Order.Line"), [], S.FULL)
    with pytest.raises(IncompatibleSchemaError, match="root message changes from demo.Order to demo.Invoice"):
        check_compatible(proto_native([dep, root], "demo.Invoice"), [first], S.BACKWARD)
    check_compatible(proto_native([dep, root], "demo.Invoice"), [first], S.ALWAYS_COMPATIBLE)
    with pytest.raises(IncompatibleSchemaError):
        check_compatible(reordered, [first], S.ALWAYS_INCOMPATIBLE)


@pytest.mark.parametrize("bad, match", [
    (b"{nope", "not valid JSON"),
    (b'{"fileDescriptorSet": "", "rootMessageTypeName": "a.B", "rootFileDescriptorName": "b.proto"}', "non-empty"),
    (b'{"fileDescriptorSet": "!!", "rootMessageTypeName": "a.B", "rootFileDescriptorName": "b.proto"}',
     "does not decode"),
])
def test_protobuf_native_definitions_that_do_not_parse_are_refused(bad, match):
    with pytest.raises(InvalidSchemaError, match=match):
        check_compatible(SchemaDef("PROTOBUF_NATIVE", bad), [], S.FULL)


def test_protobuf_native_set_must_build_and_hold_the_root():
    dep, root = _proto_files()
    with pytest.raises(InvalidSchemaError, match="lacks dependencies"):
        check_compatible(proto_native([root]), [], S.FULL)
    with pytest.raises(InvalidSchemaError, match="not in the descriptor set"):
        check_compatible(proto_native([dep, root], "demo.Refund"), [], S.FULL)
    with pytest.raises(InvalidSchemaError, match="not in other.proto"):
        check_compatible(proto_native([dep, root], root_file="other.proto"), [], S.FULL)
