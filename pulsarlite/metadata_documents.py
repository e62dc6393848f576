"""The documents that more than one component reads from ZooKeeper: their types and their one
codec each, beside the paths of pulsarlite/metadata_layout.py (docs/protocol.md#zookeeper-layout).
Pure: no I/O; stdlib only (the base package imports no component).

=====================================  ==========================================  ====================
znode (path builder in metadata_layout)  document                                  written by / read by
=====================================  ==========================================  ====================
``partitioned_topic_path``             :class:`PartitionedTopicMetadata`           admin API / broker,
                                                                                   admin API, Spark
``schema_path``                        :class:`SchemaHistory`                      broker registry /
                                                                                   broker, Spark, lake
``broker_path``, ``bundle_path``       :class:`BrokerRecord`                       ownership / ownership,
                                                                                   admin console
``bookie_registration_path``           :func:`bookie_registration_data`            bookie / console
=====================================  ==========================================  ====================

The ledger list and the compacted view have theirs in pulsarlite/ledger_list.py. A document that
one component alone writes and reads (ledger metadata: bookie/client/metadata.py; a cursor:
broker/cursor/core.py; namespace and tenant policies: broker/admin/policies.py; the dedup
snapshot: broker/dedup.py) keeps its codec beside the type it serialises, in that component
(docs/decisions.md "[layout] one codec per metadata document").

Every ``decode_*`` refuses a malformed document with a ValueError naming the document and what is
wrong (``malformed <document>: <problem>``); no class of its own (callers catch ValueError, as for
the ledger list). Every ``encode_*`` gives what the readers before this module read (same keys).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

def _decoding(what: str, parse: Callable[[Any], Any], data: bytes | str) -> Any:
    """``parse(json of data)``; every failure as ``ValueError("malformed <what>: ...")``."""
    try:
        raw = json.loads(data)
        if not isinstance(raw, dict):
            raise TypeError(f"a JSON object expected, got {type(raw).__name__}")
        return parse(raw)
    except KeyError as e:
        raise ValueError(f"malformed {what}: missing key {e}") from None
    except (TypeError, ValueError, AttributeError, UnicodeDecodeError, binascii.Error) as e:
        raise ValueError(f"malformed {what}: {e}") from None


def _int(value: Any, what: str, minimum: int = 0) -> int:
    if type(value) is not int or value < minimum:
        raise ValueError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


def _or_empty(value: Any) -> Any:
    """An absent or null object reads as an empty one (anything else is checked by the caller)."""
    return {} if value is None else value


def _any_int(value: Any, what: str) -> int:
    if type(value) is not int:
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _str_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise TypeError(f"{what} must be an object, got {type(value).__name__}")
    return {_str(k, f"{what} key"): _str(v, f"{what}[{k!r}]") for k, v in value.items()}


# -- partitioned topics: /admin/partitioned-topics/<tenant>/<ns>/<domain>/<topic> -----------------
@dataclass(frozen=True)
class PartitionedTopicMetadata:
    """How many partitions a partitioned topic has (Pulsar's PartitionedTopicMetadata)::

        {"partitions": 4, "properties": {"k": "v"}}

    ``properties`` is absent when empty. Written by the admin API (create, grow), read by the
    broker (PARTITIONED_METADATA, lookups), the admin API and the Spark source."""

    partitions: int
    properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _int(self.partitions, "partitions")
        for k, v in self.properties.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise ValueError(f"properties must map strings to strings, got {k!r}: {v!r}")


def encode_partitioned_metadata(metadata: PartitionedTopicMetadata) -> bytes:
    doc: dict[str, Any] = {"partitions": metadata.partitions}
    if metadata.properties:
        doc["properties"] = dict(metadata.properties)
    return json.dumps(doc).encode()


def decode_partitioned_metadata(data: bytes) -> PartitionedTopicMetadata:
    """ValueError ("malformed partitioned-topic metadata: ...") unless ``data`` is the JSON of
    :class:`PartitionedTopicMetadata` (a null ``properties`` reads as none)."""
    return _decoding("partitioned-topic metadata", lambda raw: PartitionedTopicMetadata(
        _int(raw["partitions"], "partitions"), _str_map(_or_empty(raw.get("properties")), "properties")), data)


# -- schemas: /schemas/<tenant>/<ns>/<topic> --------------------------------------------------------
@dataclass(frozen=True)
class SchemaRecord:
    """One version of a topic's schema as the registry stores it (``type``: the wire protocol's
    Schema.Type code; ``deleted``: a tombstone, which ends the versions before it)."""

    name: str
    type_code: int
    data: bytes
    properties: tuple[tuple[str, str], ...] = ()     # sorted (key, value) pairs
    timestamp_ms: int = 0
    deleted: bool = False

    @staticmethod
    def tombstone(timestamp_ms: int) -> "SchemaRecord":
        return SchemaRecord(name="", type_code=0, data=b"", timestamp_ms=timestamp_ms, deleted=True)


@dataclass(frozen=True)
class SchemaHistory:
    """Every version of a topic's schema (a partitioned topic's partitions share their parent's)::

        {"versions": [{"name": "...", "type": 4, "data": "<base64>", "properties": {...},
                       "timestamp": 1700000000000, "deleted": false}, ...]}

    Versions are list indexes and only grow; the live ones are those after the last tombstone.
    Written by the broker's registry (broker/schemas.py, compare-and-set), read by it, by the
    Spark source's typed columns and by the lake export."""

    versions: tuple[SchemaRecord, ...] = ()

    def live(self) -> list[tuple[int, SchemaRecord]]:
        """(version, record) of the versions after the last tombstone, oldest first."""
        start = 0
        for i, record in enumerate(self.versions):
            if record.deleted:
                start = i + 1
        return [(i, self.versions[i]) for i in range(start, len(self.versions))]

    def appended(self, record: SchemaRecord) -> "SchemaHistory":
        return replace(self, versions=self.versions + (record,))


def _schema_record_json(r: SchemaRecord) -> dict[str, Any]:
    return {"name": r.name, "type": r.type_code, "data": base64.b64encode(r.data).decode(),
            "properties": dict(r.properties), "timestamp": r.timestamp_ms, "deleted": r.deleted}


def _schema_record(raw: Any) -> SchemaRecord:
    if not isinstance(raw, dict):
        raise TypeError(f"a version must be an object, got {type(raw).__name__}")
    deleted = raw.get("deleted", False)
    if not isinstance(deleted, bool):
        raise TypeError(f"deleted must be a boolean, got {deleted!r}")
    return SchemaRecord(name=_str(raw.get("name", ""), "name"), type_code=_any_int(raw.get("type", 0), "type"),
                        data=base64.b64decode(_str(raw.get("data", ""), "data"), validate=True),
                        properties=tuple(sorted(_str_map(_or_empty(raw.get("properties")), "properties").items())),
                        timestamp_ms=_int(raw.get("timestamp", 0), "timestamp"), deleted=deleted)


def encode_schema_history(history: SchemaHistory) -> bytes:
    return json.dumps({"versions": [_schema_record_json(r) for r in history.versions]}).encode()


def decode_schema_history(data: bytes) -> SchemaHistory:
    """ValueError ("malformed schema registry document: ...") unless ``data`` is the JSON of
    :class:`SchemaHistory` (base64 data, integer type and timestamp)."""
    def parse(raw: dict) -> SchemaHistory:
        versions = raw.get("versions", [])
        if not isinstance(versions, list):
            raise TypeError(f"versions must be a list, got {type(versions).__name__}")
        return SchemaHistory(tuple(_schema_record(v) for v in versions))
    return _decoding("schema registry document", parse, data)


# -- brokers: /loadbalance/brokers/<id> (registration) and /namespace/<bundle> (owner) ---------
@dataclass(frozen=True)
class BrokerRecord:
    """A broker's URLs, as its registration and the owner znodes of its bundles hold them::

        {"broker_id": "b1", "pulsar_url": "pulsar://h:6650", "http_url": "http://h:8080",
         "pulsar_url_tls": "...", "http_url_tls": "...",                  (only with TLS listeners)
         "listeners": {"<name>": {"pulsar_url": "...", "pulsar_url_tls": "..."}},  (only if any)
         "load": {"bundles": 3, "topics": 12}}                            (registration only)

    ``load_bundles``/``load_topics`` are None in an owner znode. Written by broker/ownership/
    (the only writer), read by it (lookups, broker choice) and by the admin console."""

    broker_id: str
    pulsar_url: str
    http_url: str
    pulsar_url_tls: str = ""
    http_url_tls: str = ""
    listeners: tuple[tuple[str, str, str], ...] = ()     # (name, pulsar URL, pulsar+ssl URL)
    load_bundles: int | None = None
    load_topics: int | None = None


def encode_broker_record(record: BrokerRecord) -> bytes:
    doc: dict[str, Any] = {"broker_id": record.broker_id, "pulsar_url": record.pulsar_url,
                           "http_url": record.http_url}
    if record.pulsar_url_tls:
        doc["pulsar_url_tls"] = record.pulsar_url_tls
    if record.http_url_tls:
        doc["http_url_tls"] = record.http_url_tls
    if record.listeners:
        doc["listeners"] = {name: {"pulsar_url": url, "pulsar_url_tls": url_tls}
                            for name, url, url_tls in record.listeners}
    if record.load_bundles is not None or record.load_topics is not None:
        doc["load"] = {"bundles": record.load_bundles or 0, "topics": record.load_topics or 0}
    return json.dumps(doc).encode()


def decode_broker_record(data: bytes) -> BrokerRecord:
    """ValueError ("malformed broker record: ...") unless ``data`` is the JSON of
    :class:`BrokerRecord` (``broker_id``, ``pulsar_url`` and ``http_url`` required)."""
    def parse(raw: dict) -> BrokerRecord:
        listeners = _or_empty(raw.get("listeners"))
        if not isinstance(listeners, dict):
            raise TypeError(f"listeners must be an object, got {type(listeners).__name__}")
        load = raw.get("load")
        if load is not None and not isinstance(load, dict):
            raise TypeError(f"load must be an object, got {type(load).__name__}")
        return BrokerRecord(
            broker_id=_str(raw["broker_id"], "broker_id"), pulsar_url=_str(raw["pulsar_url"], "pulsar_url"),
            http_url=_str(raw["http_url"], "http_url"),
            pulsar_url_tls=_str(raw.get("pulsar_url_tls", ""), "pulsar_url_tls"),
            http_url_tls=_str(raw.get("http_url_tls", ""), "http_url_tls"),
            listeners=tuple((_str(name, "listener name"), _str(urls.get("pulsar_url", ""), "listener pulsar_url"),
                             _str(urls.get("pulsar_url_tls", ""), "listener pulsar_url_tls"))
                            for name, urls in listeners.items()),
            load_bundles=None if load is None else _int(load.get("bundles", 0), "load.bundles"),
            load_topics=None if load is None else _int(load.get("topics", 0), "load.topics"))
    return _decoding("broker record", parse, data)


# -- bookies: /ledgers/available[/readonly]/<bookie-id> ------------------------------------------
def bookie_registration_data(bookie_id: str, metrics_address: str = "") -> bytes:
    """The data of a bookie's registration node: JSON ``{"bookieId", "metrics"?}``, where
    ``metrics`` is the ``host:port`` of its Prometheus /metrics (absent when it serves none).
    Written once per registration (never on a disk check); read by the broker's console."""
    got = {"bookieId": bookie_id}
    if metrics_address:
        got["metrics"] = metrics_address
    return json.dumps(got, sort_keys=True).encode()


def bookie_registration_metrics_address(data: bytes) -> str | None:
    """The ``host:port`` of a bookie's /metrics from its registration node's data, None if it
    records none (a bookie without ``metrics_port``, an older bookie whose node holds its id,
    anything that is not such JSON or not a ``host:port`` with a port in [1, 65535])."""
    try:
        got = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        return None
    address = got.get("metrics") if isinstance(got, dict) else None
    if not isinstance(address, str):
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535 or any(c in host for c in "/@?#\\ "):
        return None
    return address


__all__ = ["BrokerRecord", "PartitionedTopicMetadata", "SchemaHistory", "SchemaRecord",
           "bookie_registration_data", "bookie_registration_metrics_address", "decode_broker_record",
           "decode_partitioned_metadata", "decode_schema_history", "encode_broker_record",
           "encode_partitioned_metadata", "encode_schema_history"]
