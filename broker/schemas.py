"""Schema registry in ZooKeeper: ``/schemas/<tenant>/<ns>/<topic>`` holds every version of the
topic's schema as JSON (CAS updates). No compatibility checks yet: a schema that differs from
every stored version is appended as a new version. Versions travel on the wire as 8-byte
big-endian integers, as in Pulsar."""

from __future__ import annotations

import base64
import json
import struct

from pulsarlite.wire import pb

SCHEMAS_ROOT = "/schemas"
_VERSION = struct.Struct(">q")


def encode_version(version: int) -> bytes:
    return _VERSION.pack(version)


def decode_version(data: bytes) -> int | None:
    if len(data) != 8:
        return None
    return _VERSION.unpack(data)[0]


def _to_json(schema: pb.Schema) -> dict:
    return {"name": schema.name, "type": int(schema.type),
            "data": base64.b64encode(schema.schema_data).decode(),
            "properties": {kv.key: kv.value for kv in schema.properties}}


def _from_json(d: dict) -> pb.Schema:
    return pb.Schema(name=d["name"], type=d["type"], schema_data=base64.b64decode(d["data"]),
                     properties=[pb.KeyValue(key=k, value=v) for k, v in sorted(d["properties"].items())])


def _same(a: dict, b: dict) -> bool:
    return a["type"] == b["type"] and a["data"] == b["data"] and a["properties"] == b["properties"]


class SchemaRegistry:
    def __init__(self, store) -> None:
        self._store = store

    @staticmethod
    def path(topic) -> str:
        return f"{SCHEMAS_ROOT}/{topic.tenant}/{topic.namespace}/{topic.local_name}"

    async def add(self, topic, schema: pb.Schema) -> int:
        """The version of ``schema`` (stored if new)."""
        wanted = _to_json(schema)
        result: dict = {}

        def transform(current: bytes | None) -> bytes:
            doc = json.loads(current) if current else {"versions": []}
            for i, v in enumerate(doc["versions"]):
                if _same(v, wanted):
                    result["version"] = i
                    return current if current else json.dumps(doc).encode()
            doc["versions"].append(wanted)
            result["version"] = len(doc["versions"]) - 1
            return json.dumps(doc).encode()

        await self._store.update(self.path(topic), transform)
        return result["version"]

    async def get(self, topic, version: int | None = None) -> tuple[pb.Schema, int] | None:
        got = await self._store.get_or_none(self.path(topic))
        if got is None:
            return None
        versions = json.loads(got[0])["versions"]
        if not versions:
            return None
        if version is None:
            version = len(versions) - 1
        if not 0 <= version < len(versions):
            return None
        return _from_json(versions[version]), version


__all__ = ["SchemaRegistry", "decode_version", "encode_version"]
