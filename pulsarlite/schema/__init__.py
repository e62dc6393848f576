"""Typed values for pulsarlite's client, shaped like the official ``pulsar.schema``::

    from pulsarlite.schema import AvroSchema, Record, String, Integer

    class User(Record):
        name = String()
        age = Integer()

    producer = client.create_producer("users", schema=AvroSchema(User))
    producer.send(User(name="ada", age=36))
    consumer = client.subscribe("users", "sub", schema=AvroSchema(User))
    consumer.receive().value()          # a User

Also dataclasses and Avro definitions as dicts (``AvroSchema(MyDataclass)``,
``JsonSchema({"type": "record", ...})``), ``StringSchema``, ``BytesSchema`` and the primitive
schemas. See docs/schema.md.
"""

from pulsarlite.schema.definition import (Array, Boolean, Bytes, CustomEnum, Double, Field, Float,
                                          Integer, Long, Map, Null, Record, String,
                                          dataclass_avro_schema)
from pulsarlite.schema.schemas import (AvroSchema, BooleanSchema, BytesSchema, DoubleSchema,
                                       FloatSchema, Int8Schema, Int16Schema, Int32Schema,
                                       Int64Schema, JsonSchema, KeyValue, KeyValueSchema, Schema,
                                       SchemaInfo,
                                       SchemaSerializationError, SchemaType, StringSchema)

__all__ = [
    "Record", "Field", "Null", "Boolean", "Integer", "Long", "Float", "Double", "Bytes", "String",
    "Array", "Map", "CustomEnum", "dataclass_avro_schema",
    "Schema", "SchemaInfo", "SchemaType", "SchemaSerializationError", "AvroSchema", "JsonSchema",
    "StringSchema", "BytesSchema", "BooleanSchema", "Int8Schema", "Int16Schema", "Int32Schema",
    "Int64Schema", "FloatSchema", "DoubleSchema", "KeyValueSchema", "KeyValue",
]
