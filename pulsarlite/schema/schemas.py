"""Schemas for pulsarlite's client: what a producer declares in PRODUCER (and a consumer in
SUBSCRIBE), how values become payload bytes and back. Named and encoded like the official
clients' schemas, so the two clients interoperate on one topic and register the same versions:

- ``AvroSchema`` / ``JsonSchema`` of a :class:`Record` class, a dataclass, or an Avro
  definition given as a dict (values are then dicts). The definition sent is
  ``json.dumps(definition, indent=True)``, as the official Python client sends it; Avro
  payloads are fastavro's schemaless encoding, JSON payloads ``json.dumps(fields, indent=True)``.
- ``StringSchema`` (UTF-8), ``BytesSchema`` (no schema on the wire, as without one), and the
  primitive schemas of the Java client: ``BooleanSchema`` (one byte 0/1), ``Int8Schema``,
  ``Int16Schema``, ``Int32Schema``, ``Int64Schema`` (big-endian two's complement),
  ``FloatSchema``, ``DoubleSchema`` (big-endian IEEE 754).

A consumer's Avro schema decodes each message with the writer's version of the schema
(fetched once per topic and version with GET_SCHEMA and cached) resolved to its own, so old
and new readers read data of any compatible version.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import io
import json
import logging
import struct
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

import fastavro

from pulsarlite.errors import PulsarliteError
from pulsarlite.keyvalue import join_pair, split_pair
from pulsarlite.schema.definition import (Record, _RESERVED, dataclass_avro_schema, from_avro_datum,
                                          record_fields, to_avro_datum)
from pulsarlite.wire import commands as c

log = logging.getLogger(__name__)

__all__ = ["SchemaType", "SchemaInfo", "Schema", "BytesSchema", "StringSchema", "AvroSchema",
           "JsonSchema", "BooleanSchema", "Int8Schema", "Int16Schema", "Int32Schema",
           "Int64Schema", "FloatSchema", "DoubleSchema", "SchemaSerializationError",
           "KeyValueSchema", "KeyValue"]

WRITER_SCHEMA_FETCH_TIMEOUT_S = 30.0


class SchemaSerializationError(PulsarliteError, ValueError):
    """A value that does not fit the schema, or a payload that does not decode with it."""


class SchemaType(enum.IntEnum):
    """The wire's ``Schema.Type`` codes (BYTES is sent as no schema at all)."""

    BYTES = -1
    NONE = 0
    STRING = 1
    JSON = 2
    PROTOBUF = 3
    AVRO = 4
    BOOLEAN = 5
    INT8 = 6
    INT16 = 7
    INT32 = 8
    INT64 = 9
    FLOAT = 10
    DOUBLE = 11
    KEY_VALUE = 15


@dataclass(frozen=True)
class SchemaInfo:
    type: SchemaType
    name: str
    schema: bytes
    properties: Mapping[str, str] = field(default_factory=dict)

    def schema_type(self) -> SchemaType:
        return self.type

    def to_pb(self):
        """The wire's ``Schema`` (None for BYTES: a producer without a schema)."""
        if self.type == SchemaType.BYTES:
            return None
        from pulsarlite.wire import pb
        return pb.Schema(name=self.name, type=int(self.type), schema_data=self.schema,
                         properties=[pb.KeyValue(key=k, value=v)
                                     for k, v in sorted(self.properties.items())])


class Schema:
    """Base of every schema: ``encode(value) -> bytes``, ``decode(bytes) -> value``."""

    def __init__(self, record_cls, schema_type: SchemaType, definition: bytes, name: str,
                 properties: Mapping[str, str] | None = None) -> None:
        self._record_cls = record_cls
        self._schema_info = SchemaInfo(schema_type, name, definition, dict(properties or {}))

    def schema_info(self) -> SchemaInfo:
        return self._schema_info

    def encode(self, obj) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes):
        raise NotImplementedError

    def decode_message(self, msg):
        return self.decode(msg.data())

    def _validate_object_type(self, obj) -> None:
        if not isinstance(obj, self._record_cls):
            raise TypeError(f"Invalid record obj of type {type(obj)} - expected type is "
                            f"{self._record_cls}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class BytesSchema(Schema):
    def __init__(self) -> None:
        super().__init__(bytes, SchemaType.BYTES, b"", "BYTES")

    def encode(self, data) -> bytes:
        if isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        self._validate_object_type(data)
        return data

    def decode(self, data: bytes) -> bytes:
        return data


class StringSchema(Schema):
    """UTF-8 text. The definition sent is ``null`` (what the official Python client sends, so
    both register one version; the Java client sends it empty)."""

    def __init__(self) -> None:
        super().__init__(str, SchemaType.STRING, b"null", "STRING")

    def encode(self, obj) -> bytes:
        self._validate_object_type(obj)
        return obj.encode("utf-8")

    def decode(self, data: bytes) -> str:
        return bytes(data).decode("utf-8")


class _FixedSchema(Schema):
    """A primitive schema with a fixed-size big-endian encoding (the Java client's)."""

    fmt: struct.Struct
    kind: SchemaType
    py_types: tuple = (int,)

    def __init__(self) -> None:
        super().__init__(self.py_types, self.kind, b"", self.kind.name)

    def encode(self, obj) -> bytes:
        if isinstance(obj, bool) and self.kind not in (SchemaType.BOOLEAN,):
            raise TypeError(f"{type(self).__name__} does not take a bool")
        if not isinstance(obj, self.py_types):
            raise TypeError(f"{type(self).__name__} takes {self.py_types[0].__name__}, got "
                            f"{type(obj).__name__}")
        try:
            return self.fmt.pack(obj)
        except struct.error as e:
            raise SchemaSerializationError(f"{obj!r} does not fit {self.kind.name}: {e}") from None

    def decode(self, data: bytes):
        if len(data) != self.fmt.size:
            raise SchemaSerializationError(f"{self.kind.name} payload must be {self.fmt.size} "
                                           f"bytes, got {len(data)}")
        return self.fmt.unpack(data)[0]


class BooleanSchema(_FixedSchema):
    fmt = struct.Struct(">?")
    kind = SchemaType.BOOLEAN
    py_types = (bool,)

    def decode(self, data: bytes) -> bool:
        if len(data) != 1:
            raise SchemaSerializationError(f"BOOLEAN payload must be 1 byte, got {len(data)}")
        return data[0] != 0


class Int8Schema(_FixedSchema):
    fmt = struct.Struct(">b")
    kind = SchemaType.INT8


class Int16Schema(_FixedSchema):
    fmt = struct.Struct(">h")
    kind = SchemaType.INT16


class Int32Schema(_FixedSchema):
    fmt = struct.Struct(">i")
    kind = SchemaType.INT32


class Int64Schema(_FixedSchema):
    fmt = struct.Struct(">q")
    kind = SchemaType.INT64


class FloatSchema(_FixedSchema):
    fmt = struct.Struct(">f")
    kind = SchemaType.FLOAT
    py_types = (float, int)


class DoubleSchema(_FixedSchema):
    fmt = struct.Struct(">d")
    kind = SchemaType.DOUBLE
    py_types = (float, int)


# -- struct schemas --------------------------------------------------------------------------

def _definition_and_class(record_cls, schema_definition) -> tuple[dict, Any]:
    """(Avro definition, the class values decode into: a Record class, a dataclass or None)."""
    if isinstance(record_cls, dict) and schema_definition is None:
        record_cls, schema_definition = None, record_cls
    if record_cls is None:
        if not isinstance(schema_definition, dict):
            raise TypeError("give a Record class, a dataclass, or an Avro definition (a dict)")
        return schema_definition, None
    if isinstance(record_cls, type) and issubclass(record_cls, Record):
        return record_cls.schema(), record_cls
    if isinstance(record_cls, type) and dataclasses.is_dataclass(record_cls):
        return (schema_definition if isinstance(schema_definition, dict)
                else dataclass_avro_schema(record_cls)), record_cls
    raise TypeError(f"{record_cls!r} is neither a Record class, a dataclass nor a dict")


def _check_value(schema: Schema, obj) -> None:
    cls = schema._record_cls
    if cls is None:
        if not isinstance(obj, dict):
            raise TypeError("with a schema given as a definition, values are dicts, got "
                            f"{type(obj).__name__}")
    elif not isinstance(obj, cls):
        raise TypeError(f"Invalid record obj of type {type(obj)} - expected type is {cls}")


class AvroSchema(Schema):
    """``AvroSchema(RecordClass)``, ``AvroSchema(DataClass)``, ``AvroSchema(definition_dict)``
    or, as the official client, ``AvroSchema(None, schema_definition=definition_dict)``."""

    def __init__(self, record_cls=None, schema_definition: dict | None = None) -> None:
        definition, cls = _definition_and_class(record_cls, schema_definition)
        self._schema = definition
        try:
            self._parsed = fastavro.parse_schema(definition)
        except Exception as e:
            raise SchemaSerializationError(f"not a valid Avro definition: {e}") from None
        self._writers: dict[tuple[str, bytes], Any] = {}
        self._writers_lock = threading.Lock()
        super().__init__(cls, SchemaType.AVRO, json.dumps(definition, indent=True).encode(),
                         "AVRO")

    def encode(self, obj) -> bytes:
        _check_value(self, obj)
        buffer = io.BytesIO()
        try:
            fastavro.schemaless_writer(buffer, self._parsed, to_avro_datum(obj))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise SchemaSerializationError(f"value does not fit the Avro schema "
                                           f"{self._schema.get('name')}: {e}") from None
        return buffer.getvalue()

    def decode(self, data: bytes):
        return self._decode(data, self._parsed)

    def _decode(self, data: bytes, writer) -> Any:
        try:
            d = fastavro.schemaless_reader(io.BytesIO(data), writer, self._parsed)
        except Exception as e:
            raise SchemaSerializationError(f"payload does not decode with the Avro schema "
                                           f"{self._schema.get('name')}: {e}") from None
        return from_avro_datum(self._record_cls, d)

    def decode_message(self, msg):
        version = msg.schema_version()
        consumer = getattr(msg, "_consumer", None)
        if not version or consumer is None:
            return self.decode(msg.data())
        writer = self._writer_schema(consumer.client, msg.topic_name(), version)
        return self._decode(msg.data(), writer)

    # writer schemas: one GET_SCHEMA per (topic, version), then cached
    def _cached_writer(self, topic: str, version: bytes):
        return self._writers.get((_parent(topic), bytes(version)))

    def _store_writer(self, topic: str, version: bytes, schema_pb) -> Any:
        writer = _writer_definition(schema_pb, self._schema, topic, version)
        with self._writers_lock:
            self._writers[(_parent(topic), bytes(version))] = writer
        return writer

    def _writer_schema(self, client, topic: str, version: bytes):
        cached = self._cached_writer(topic, version)
        if cached is not None:
            return cached
        schema_pb = _fetch_writer_schema_blocking(client, topic, version, WRITER_SCHEMA_FETCH_TIMEOUT_S)
        return self._store_writer(topic, version, schema_pb)

    async def _prefetch(self, msg) -> None:
        """On the client's loop (pulsarlite.aio): make sure ``msg``'s writer schema is cached,
        so that the synchronous ``value()`` needs no round trip."""
        version = msg.schema_version()
        consumer = getattr(msg, "_consumer", None)
        if not version or consumer is None:
            return
        topic = msg.topic_name()
        if self._cached_writer(topic, version) is not None:
            return
        schema_pb = await _fetch_writer_schema(consumer.client, topic, version)
        self._store_writer(topic, version, schema_pb)

    def __repr__(self) -> str:
        return f"AvroSchema({self._schema.get('name')})"


def _json_default(o):
    if isinstance(o, enum.Enum):
        return o.value
    if isinstance(o, bytes):
        return o.decode()
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}
    if isinstance(o, Record) or hasattr(o, "__dict__"):
        return {k: v for k, v in o.__dict__.items() if k not in _RESERVED}
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


class JsonSchema(Schema):
    """Pulsar's JSON schema: the definition is the Avro record definition (type JSON); the
    payload is the record's fields as JSON text, as the official client writes it."""

    def __init__(self, record_cls=None, schema_definition: dict | None = None) -> None:
        definition, cls = _definition_and_class(record_cls, schema_definition)
        self._schema = definition
        super().__init__(cls, SchemaType.JSON, json.dumps(definition, indent=True).encode(),
                         "JSON")

    def encode(self, obj) -> bytes:
        _check_value(self, obj)
        if isinstance(obj, Record):
            data = record_fields(obj)
        elif dataclasses.is_dataclass(obj):
            data = _json_default(obj)
        else:
            data = obj
        try:
            return json.dumps(data, default=_json_default, indent=True).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise SchemaSerializationError(f"value does not encode as JSON: {e}") from None

    def decode(self, data: bytes):
        try:
            d = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise SchemaSerializationError(f"payload is not JSON: {e}") from None
        if not isinstance(d, dict):
            raise SchemaSerializationError("JSON payload is not an object")
        try:
            return from_avro_datum(self._record_cls, d)
        except (TypeError, KeyError, ValueError) as e:
            raise SchemaSerializationError(f"JSON payload does not fit "
                                           f"{self._schema.get('name')}: {e}") from None

    def __repr__(self) -> str:
        return f"JsonSchema({self._schema.get('name')})"


def _parent(topic: str) -> str:
    idx = topic.rfind("-partition-")
    return topic[:idx] if idx > 0 and topic[idx + 11:].isdigit() else topic


def encode_value(schema: Schema | None, content):
    """What a producer sends for ``content``: unchanged without a schema."""
    if schema is None:
        return content
    return schema.encode(content)


async def prefetch(schema: Schema | None, msg) -> None:
    """Fetch ``msg``'s writer schema if an Avro consumer needs it. A failure is logged, not
    raised: the message stays deliverable and ``value()`` reports the error."""
    if schema is not None and isinstance(schema, AvroSchema):
        try:
            await schema._prefetch(msg)
        except Exception as e:   # noqa: BLE001 - reported again by value()
            log.warning("event=writer_schema_fetch_failed topic=%s version=%s error=%r",
                        msg.topic_name(), (msg.schema_version() or b"").hex(), e)


# -- KeyValue --------------------------------------------------------------------------------

class KeyValue(tuple):
    """A (key, value) pair, what a KeyValueSchema encodes and decodes."""

    __slots__ = ()

    def __new__(cls, key, value):
        return super().__new__(cls, (key, value))

    @property
    def key(self):
        return self[0]

    @property
    def value(self):
        return self[1]

    def __repr__(self) -> str:
        return f"KeyValue(key={self[0]!r}, value={self[1]!r})"




def _kv_join(key: bytes | None, value: bytes | None) -> bytes:
    return join_pair(key, value)


def _kv_split(data: bytes) -> tuple[bytes | None, bytes | None]:
    try:
        return split_pair(data)
    except ValueError as e:
        raise SchemaSerializationError(f"KeyValue payload {e}") from None


class KeyValueSchema(Schema):
    """A key schema and a value schema in one payload (INLINE encoding, as the Java client's
    ``Schema.KeyValue(k, v)``): values are :class:`KeyValue` pairs (or 2-tuples). The
    definition is Pulsar's KeyValue schema info: both definitions joined as
    ``[i32 n][key][i32 m][value]``, their names, types and properties in ``key.schema.*`` /
    ``value.schema.*`` properties, ``kv.encoding.type`` INLINE. SEPARATED (the key as the
    message key) is not supported."""

    def __init__(self, key_schema: Schema, value_schema: Schema) -> None:
        if not isinstance(key_schema, Schema) or not isinstance(value_schema, Schema):
            raise TypeError("KeyValueSchema(key_schema, value_schema) takes two schemas")
        if isinstance(key_schema, KeyValueSchema) or isinstance(value_schema, KeyValueSchema):
            raise TypeError("KeyValue schemas do not nest")
        self.key_schema = key_schema
        self.value_schema = value_schema
        k, v = key_schema.schema_info(), value_schema.schema_info()
        properties = {
            "key.schema.name": k.name, "key.schema.type": k.type.name,
            "key.schema.properties": json.dumps(dict(k.properties), separators=(",", ":")),
            "value.schema.name": v.name, "value.schema.type": v.type.name,
            "value.schema.properties": json.dumps(dict(v.properties), separators=(",", ":")),
            "kv.encoding.type": "INLINE"}
        super().__init__(KeyValue, SchemaType.KEY_VALUE,
                         _kv_join(k.schema or None, v.schema or None), "KeyValue", properties)

    def encode(self, obj) -> bytes:
        if not isinstance(obj, tuple) or len(obj) != 2:
            raise TypeError(f"KeyValueSchema takes a KeyValue(key, value) or a 2-tuple, got "
                            f"{type(obj).__name__}")
        key, value = obj
        return _kv_join(None if key is None else self.key_schema.encode(key),
                        None if value is None else self.value_schema.encode(value))

    def decode(self, data: bytes) -> KeyValue:
        key, value = _kv_split(data)
        return KeyValue(None if key is None else self.key_schema.decode(key),
                        None if value is None else self.value_schema.decode(value))

    def __repr__(self) -> str:
        return f"KeyValueSchema({self.key_schema!r}, {self.value_schema!r})"


# -- writer schemas of received messages: GET_SCHEMA on the client's loop, and the fastavro
# writer definition resolved against the reader's

async def _fetch_writer_schema(client, topic: str, version: bytes):
    """The wire Schema of ``topic`` at ``version`` (a ClientError when the broker has none)."""
    conn = await client.connection_for(topic)
    rid = client.next_request_id()
    resp = await conn.request(c.get_schema(rid, topic, schema_version=bytes(version)), rid,
                              f"get schema of {topic} version {bytes(version).hex()}")
    log.info("event=writer_schema_fetched topic=%s version=%s", topic, bytes(version).hex())
    return resp.command.getSchemaResponse.schema


def _fetch_writer_schema_blocking(client, topic: str, version: bytes, timeout_s: float):
    """``_fetch_writer_schema`` from any thread but the client's loop thread (pulsarlite.aio prefetches
    instead: its receive() resolves the writer schema before returning the message)."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is client.loop:
        raise SchemaSerializationError(
            f"the writer schema of {topic} version {bytes(version).hex()} is not known yet and "
            "cannot be fetched from the client's event loop: receive messages with "
            "pulsarlite.aio's receive()/read_next(), which fetch it")
    future = asyncio.run_coroutine_threadsafe(_fetch_writer_schema(client, topic, version), client.loop)
    # the request itself times out after the client's operation timeout (a ClientError)
    return future.result(max(timeout_s, client.operation_timeout_s + 5))


def _writer_definition(schema_pb, reader_definition: dict, topic: str, version: bytes):
    """The parsed writer definition for fastavro, named like the reader's record (as the
    official client does: versions of one record may carry different names)."""
    if int(schema_pb.type) not in (int(SchemaType.AVRO), int(SchemaType.JSON)):
        raise SchemaSerializationError(
            f"schema version {bytes(version).hex()} of {topic} is of type {schema_pb.type}, "
            "not AVRO")
    try:
        writer = json.loads(schema_pb.schema_data)
        if isinstance(writer, dict) and isinstance(reader_definition, dict):
            writer["name"] = reader_definition.get("name", writer.get("name"))
            if "namespace" in reader_definition:
                writer["namespace"] = reader_definition["namespace"]
            else:
                writer.pop("namespace", None)
        return fastavro.parse_schema(writer)
    except Exception as e:
        raise SchemaSerializationError(f"schema version {bytes(version).hex()} of {topic} is "
                                       f"not a usable Avro definition: {e}") from None
