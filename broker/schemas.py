"""Schema registry in ZooKeeper: ``/schemas/<tenant>/<ns>/<topic>`` holds every version of a
topic's schema as JSON, updated by compare-and-set (docs/protocol.md#zookeeper-layout). A partitioned topic's
partitions share their parent's schema, as in Pulsar.

The znode holds a :class:`~pulsarlite.metadata_documents.SchemaHistory` (its one codec is in
pulsarlite/metadata_documents.py, shared with the Spark source and the lake export)::

    {"versions": [{"name": "...", "type": 4, "data": "<base64>", "properties": {...},
                   "timestamp": 1700000000000, "deleted": false}, ...]}

Versions are list indexes and only grow. Deleting a topic's schema appends a tombstone
(``deleted: true``); the versions after the last tombstone are the live ones, the only ones served
(by version too, on REST and GET_SCHEMA, as Pulsar) and the only ones a new schema is checked
against (broker/schema_compat.py) under the namespace's ``schema_compatibility_strategy``. A producer or consumer that declares a schema equal to a live
version gets that version; a new one is added only if it is compatible and the namespace allows
auto-update (``is_allow_auto_update_schema``); an admin upload ignores the auto-update flag.
Versions travel on the wire as 8-byte big-endian integers, as in Pulsar.
"""

from __future__ import annotations

import base64
import logging
import struct
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from broker.schema_compat import (CompatibilityStrategy, IncompatibleSchemaError, InvalidSchemaError, SchemaDef,
                                  check_compatible, type_code, type_name, validate)
from pulsarlite.metadata_documents import SchemaHistory, SchemaRecord, decode_schema_history, encode_schema_history
from pulsarlite.metadata_layout import schema_path
from pulsarlite.topic_name import TopicName
from pulsarlite.wire import pb

log = logging.getLogger(__name__)

SCHEMA_BYTES_MAX = 1024 * 1024          # one definition
VERSIONS_MAX = 1000                     # per topic; the znode must stay well under 1 MiB
_VERSION = struct.Struct(">q")

# (namespace "tenant/ns") -> (strategy, allow auto update)
SchemaPolicyLookup = Callable[[str], Awaitable[tuple[CompatibilityStrategy, bool]]]


async def _default_policy(namespace: str) -> tuple[CompatibilityStrategy, bool]:
    return CompatibilityStrategy.UNDEFINED, True


def encode_version(version: int) -> bytes:
    return _VERSION.pack(version)


def decode_version(data: bytes) -> int | None:
    if len(data) != 8:
        return None
    return _VERSION.unpack(data)[0]


@dataclass(frozen=True)
class StoredSchema:
    version: int
    name: str
    definition: SchemaDef
    timestamp_ms: int

    def to_pb(self) -> pb.Schema:
        return pb.Schema(name=self.name, type=type_code(self.definition.type), schema_data=self.definition.data,
                         properties=[pb.KeyValue(key=k, value=v) for k, v in self.definition.properties])

    def to_admin_json(self) -> dict[str, Any]:
        """Pulsar's GetSchemaResponse: the definition as text for AVRO/JSON and friends."""
        try:
            data = self.definition.data.decode()
        except UnicodeDecodeError:
            data = base64.b64encode(self.definition.data).decode()
        return {"version": self.version, "type": self.definition.type, "timestamp": self.timestamp_ms,
                "data": data, "properties": dict(self.definition.properties)}


def schema_def_of(schema: pb.Schema) -> SchemaDef:
    """A wire schema as a SchemaDef (InvalidSchemaError for an unknown type or oversized data)."""
    if len(schema.schema_data) > SCHEMA_BYTES_MAX:
        raise InvalidSchemaError(f"schema definition of {len(schema.schema_data)} bytes exceeds "
                                 f"{SCHEMA_BYTES_MAX}")
    return SchemaDef(type_name(int(schema.type)), bytes(schema.schema_data),
                     tuple(sorted((kv.key, kv.value) for kv in schema.properties)))


def schema_def_from_admin(body: Any) -> tuple[str, SchemaDef]:
    """Pulsar's PostSchemaPayload ``{"type": "AVRO", "schema": "...", "properties": {}}``."""
    if not isinstance(body, dict):
        raise InvalidSchemaError("schema payload must be a JSON object with type, schema, properties")
    kind = body.get("type")
    data = body.get("schema", "")
    props = body.get("properties") or {}
    if not isinstance(kind, str) or not isinstance(data, str) or not isinstance(props, dict):
        raise InvalidSchemaError("schema payload: type and schema must be strings, properties an object")
    raw = data.encode()
    if len(raw) > SCHEMA_BYTES_MAX:
        raise InvalidSchemaError(f"schema definition of {len(raw)} bytes exceeds {SCHEMA_BYTES_MAX}")
    definition = SchemaDef(type_name(type_code(kind)), raw, tuple(sorted((str(k), str(v)) for k, v in props.items())))
    validate(definition)
    return str(body.get("name", "")), definition


def _record(name: str, d: SchemaDef, now_ms: int) -> SchemaRecord:
    return SchemaRecord(name=name, type_code=type_code(d.type), data=d.data, properties=tuple(sorted(d.properties)),
                        timestamp_ms=now_ms)


def _stored(version: int, r: SchemaRecord) -> StoredSchema:
    definition = SchemaDef(type_name(r.type_code), r.data, r.properties)
    return StoredSchema(version, r.name, definition, r.timestamp_ms)


class SchemaRegistry:
    def __init__(self, store, *, policy_lookup: SchemaPolicyLookup | None = None,
                 clock_ms: Callable[[], int] | None = None) -> None:
        self._store = store
        self.policy_lookup = policy_lookup or _default_policy
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))

    @staticmethod
    def path(topic: TopicName | str) -> str:
        t = TopicName.parse(topic).partitioned_parent
        return schema_path(t.tenant, t.namespace_local_name, t.encoded_local_name)

    async def _history(self, topic) -> SchemaHistory:
        got = await self._store.get_or_none(self.path(topic))
        return SchemaHistory() if got is None else decode_schema_history(got[0])

    async def add(self, topic, schema: pb.Schema) -> int:
        """The version of ``schema`` for a producer or consumer: an equal live version, or a new
        one if compatible and auto-update is allowed (IncompatibleSchemaError otherwise)."""
        definition = schema_def_of(schema)
        return await self._add(topic, schema.name, definition, from_admin=False)

    async def upload(self, topic, name: str, definition: SchemaDef) -> int:
        """An admin upload: checked for compatibility, not subject to the auto-update flag."""
        return await self._add(topic, name, definition, from_admin=True)

    async def _add(self, topic, name: str, definition: SchemaDef, *, from_admin: bool) -> int:
        topic = TopicName.parse(topic)
        strategy, allow_auto_update = await self.policy_lookup(topic.namespace)
        now_ms = self._clock_ms()
        result: dict = {}

        def transform(current: bytes | None) -> bytes:
            history = decode_schema_history(current) if current else SchemaHistory()
            live = history.live()
            for version, record in live:
                if _stored(version, record).definition.same_as(definition):
                    result["version"] = version
                    return current if current else encode_schema_history(history)
            if live and not from_admin and not allow_auto_update:
                raise IncompatibleSchemaError(
                    f"topic {topic} has a schema and its namespace does not allow producers to "
                    f"add new versions (is_allow_auto_update_schema=false)")
            check_compatible(definition, [_stored(v, r).definition for v, r in live], strategy)
            if len(history.versions) >= VERSIONS_MAX:
                raise IncompatibleSchemaError(f"topic {topic} has {VERSIONS_MAX} schema versions, the limit")
            history = history.appended(_record(name, definition, now_ms))
            result["version"] = len(history.versions) - 1
            result["added"] = True
            return encode_schema_history(history)

        await self._store.update(self.path(topic), transform)
        if result.get("added"):
            log.info("schema added topic=%s version=%d type=%s", topic, result["version"], definition.type)
        return result["version"]

    async def test_compatibility(self, topic, definition: SchemaDef) -> tuple[bool, str]:
        topic = TopicName.parse(topic)
        strategy, _ = await self.policy_lookup(topic.namespace)
        live = (await self._history(topic)).live()
        try:
            check_compatible(definition, [_stored(v, r).definition for v, r in live], strategy)
        except (IncompatibleSchemaError, InvalidSchemaError) as e:
            return False, str(e)
        return True, ""

    async def get(self, topic, version: int | None = None) -> tuple[pb.Schema, int] | None:
        found = await self.get_stored(topic, version)
        return None if found is None else (found.to_pb(), found.version)

    async def get_stored(self, topic, version: int | None = None) -> StoredSchema | None:
        """The latest live version, or ``version`` if it is live: None if absent, a tombstone,
        or deleted (before the last tombstone), as Pulsar's getSchema(id, version) looks a
        version up among those after the last delete only."""
        live = (await self._history(topic)).live()
        if version is None:
            return _stored(*live[-1]) if live else None
        if not live or not live[0][0] <= version <= live[-1][0]:
            return None
        return _stored(*live[version - live[0][0]])

    async def all_versions(self, topic) -> list[StoredSchema]:
        """Every live version, oldest first."""
        return [_stored(v, r) for v, r in (await self._history(topic)).live()]

    async def delete(self, topic) -> int | None:
        """Append a tombstone; the version it took, or None if there was nothing live."""
        topic = TopicName.parse(topic)
        now_ms = self._clock_ms()
        result: dict = {}

        def transform(current: bytes | None) -> bytes:
            history = decode_schema_history(current) if current else SchemaHistory()
            if not history.live():
                result["version"] = None
                return current if current else encode_schema_history(history)
            history = history.appended(SchemaRecord.tombstone(now_ms))
            result["version"] = len(history.versions) - 1
            return encode_schema_history(history)

        await self._store.update(self.path(topic), transform)
        return result["version"]


__all__ = ["SchemaRegistry", "StoredSchema", "decode_version", "encode_version",
           "schema_def_from_admin", "schema_def_of"]
