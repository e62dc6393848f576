"""Managed-ledger metadata in ZooKeeper: names, paths, the JSON codec, compare-and-set access.

A managed ledger is named like Pulsar's: ``<tenant>/<namespace>/persistent/<topic>``; its list
lives at ``/managed-ledgers/<name>`` (docs/protocol.md#zookeeper-layout). The znode holds::

    {"version": 1,
     "ledgers": [{"ledger_id": 7, "state": "CLOSED", "entries": 1000, "size_bytes": 123456,
                  "min_publish_time_ms": 1700000000000, "max_publish_time_ms": 1700000000500,
                  "created_ms": 1700000000000,
                  "offload": {"state": "none", "uri": null}}, ...],
     "properties": {}}

Unknown keys of ``offload`` are kept verbatim (the offloader owns them). Only the owner writes,
always at the version it read or wrote last.
"""

from __future__ import annotations

import json
from typing import Any

from broker.managed_ledger.core import (LedgerInfo, LedgerInfoState, ManagedLedgerMetadata, OffloadInfo,
                                        OffloadState)
from pulsarlite.errors import MetadataError
from pulsarlite.metadata import MetadataStore

MANAGED_LEDGERS_ROOT = "/managed-ledgers"
FORMAT_VERSION = 1


# -- names and paths ---------------------------------------------------------------------------
def _check_segment(what: str, value: str) -> None:
    if not value or "/" in value or value in (".", "..") or "\x00" in value or value.strip() != value:
        raise ValueError(f"invalid {what} {value!r}")


def managed_ledger_name(tenant: str, namespace: str, topic: str) -> str:
    """``tenant/namespace/persistent/topic`` (the local topic name, e.g. ``t-partition-0``)."""
    _check_segment("tenant", tenant)
    _check_segment("namespace", namespace)
    _check_segment("topic", topic)
    return f"{tenant}/{namespace}/persistent/{topic}"


def check_name(name: str) -> str:
    parts = name.split("/")
    if len(parts) != 4 or parts[2] != "persistent":
        raise ValueError(f"managed ledger name must be tenant/namespace/persistent/topic, got {name!r}")
    managed_ledger_name(parts[0], parts[1], parts[3])
    return name


def managed_ledger_path(name: str) -> str:
    return f"{MANAGED_LEDGERS_ROOT}/{check_name(name)}"


# -- codec -------------------------------------------------------------------------------------
def _offload_to_json(o: OffloadInfo) -> dict[str, Any]:
    out = dict(o.attributes)
    out["state"] = o.state.value
    out["uri"] = o.uri
    return out


def _offload_from_json(raw: dict[str, Any]) -> OffloadInfo:
    attributes = {k: v for k, v in raw.items() if k not in ("state", "uri")}
    uri = raw.get("uri")
    return OffloadInfo(state=OffloadState(raw.get("state", "none")), uri=None if uri is None else str(uri),
                       attributes=attributes)


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def encode(md: ManagedLedgerMetadata) -> bytes:
    return json.dumps({
        "version": FORMAT_VERSION,
        "ledgers": [{
            "ledger_id": i.ledger_id,
            "state": i.state.value,
            "entries": i.entries,
            "size_bytes": i.size_bytes,
            "min_publish_time_ms": i.min_publish_time_ms,
            "max_publish_time_ms": i.max_publish_time_ms,
            "created_ms": i.created_ms,
            "offload": _offload_to_json(i.offload),
        } for i in md.ledgers],
        "properties": dict(md.properties),
    }, sort_keys=True).encode()


def decode(data: bytes) -> ManagedLedgerMetadata:
    """ValueError if malformed (including a broken invariant of the list)."""
    try:
        raw = json.loads(data)
        if raw.get("version") != FORMAT_VERSION:
            raise ValueError(f"unknown format version {raw.get('version')!r}")
        ledgers = tuple(LedgerInfo(
            ledger_id=int(r["ledger_id"]),
            state=LedgerInfoState(r["state"]),
            entries=int(r["entries"]),
            size_bytes=int(r["size_bytes"]),
            min_publish_time_ms=_opt_int(r.get("min_publish_time_ms")),
            max_publish_time_ms=_opt_int(r.get("max_publish_time_ms")),
            created_ms=int(r.get("created_ms", 0)),
            offload=_offload_from_json(r.get("offload") or {}),
        ) for r in raw["ledgers"])
        properties = {str(k): str(v) for k, v in (raw.get("properties") or {}).items()}
        return ManagedLedgerMetadata(ledgers=ledgers, properties=properties)
    except (KeyError, TypeError, ValueError, AttributeError, AssertionError) as e:
        raise ValueError(f"malformed managed ledger metadata: {e}") from None


# -- access ------------------------------------------------------------------------------------
class ManagedLedgerStore:
    """Read / create / compare-and-set / delete of managed-ledger lists over a MetadataStore."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    async def read(self, name: str) -> tuple[ManagedLedgerMetadata, int, bytes] | None:
        """(metadata, version, raw bytes), or None if there is no such managed ledger."""
        path = managed_ledger_path(name)
        got = await self.store.get_or_none(path)
        if got is None:
            return None
        data, version = got
        try:
            return decode(data), version, data
        except ValueError as e:
            err = MetadataError(f"managed ledger {name}: {path}: {e}")
            err.retriable = False
            raise err from None

    async def create(self, name: str, data: bytes) -> int:
        """MetadataExistsError if it exists; returns the version (0)."""
        await self.store.create(managed_ledger_path(name), data, make_parents=True)
        return 0

    async def write(self, name: str, data: bytes, version: int) -> int:
        """Compare-and-set at ``version``; MetadataVersionConflict if it changed."""
        if version < 0:
            raise ValueError("write needs the version read or written last (>= 0)")
        return await self.store.set(managed_ledger_path(name), data, version)

    async def delete(self, name: str, version: int) -> None:
        """Delete the list at ``version`` (children such as cursors go with it)."""
        await self.store.delete(managed_ledger_path(name), version, recursive=True)

    async def list_names(self, tenant: str, namespace: str) -> list[str]:
        _check_segment("tenant", tenant)
        _check_segment("namespace", namespace)
        topics = await self.store.children(f"{MANAGED_LEDGERS_ROOT}/{tenant}/{namespace}/persistent")
        return [f"{tenant}/{namespace}/persistent/{t}" for t in topics]


__all__ = ["ManagedLedgerStore", "MANAGED_LEDGERS_ROOT", "check_name", "decode", "encode",
           "managed_ledger_name", "managed_ledger_path"]
