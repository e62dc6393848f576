"""Typed columns from a topic's struct schema: Avro (and Pulsar JSON, which is an Avro record
definition) -> Arrow types, and message values -> Arrow columns.

Used by the offloader (typed Parquet columns beside the metadata columns) and by the Spark
source (the same columns for segments still on bookies). Pure functions over bytes; no I/O.

- ``arrow_type(avro)``: record -> struct, array -> list, map -> map<string, T>, enum -> string,
  fixed -> binary, ``["null", T]`` -> T (nullable), other unions -> struct of ``member0..n`` (as
  Spark's Avro source does), logical types: date -> date32, time-millis -> time32[ms],
  time-micros -> time64[us], timestamp-millis -> timestamp[ms, UTC], timestamp-micros ->
  timestamp[us, UTC], decimal -> decimal128(p, s), uuid -> string.
- ``merged_schema(avro_versions)``: one table schema for rows written under several versions:
  top-level fields by name in order of first appearance; a field whose type changed between
  versions takes the widest numeric type when both are numeric, else the latest version's type
  (values that do not fit become null, counted in ``DecodeStats``).
- ``decode_columns(values, versions, ...)``: one Arrow array per top-level field; each value is
  decoded with the schema it was written with (Avro binary via fastavro, JSON via json), missing
  fields are null. A value that cannot be decoded gives nulls in every typed column and is
  counted; the raw ``value`` column always keeps the bytes.
- ``typed_columns_for(values, schema_versions, versions, metadata_names)``: what the offloader
  appends to a tier object (columns + the ``pulsarlite.typed_columns`` footer metadata saying
  which versions they were built from), all at once; ``TypedColumnsBuilder``: the same a run
  of rows at a time (the offloader's, one row group's worth per run);
  ``stored_columns(...)``: whether a reader may take an
  object's stored columns instead of decoding ``value`` (same result guaranteed), and which.
"""

from __future__ import annotations

import io
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa

_NUMERIC_RANK = {pa.int32(): 1, pa.int64(): 2, pa.float32(): 3, pa.float64(): 4}
_PRIMITIVE = {
    "null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(),
    "float": pa.float32(), "double": pa.float64(), "bytes": pa.binary(), "string": pa.string(),
}
_DEPTH_MAX = 32


class TypedColumnsError(ValueError):
    """A schema that cannot become Arrow columns (recursive records, unknown types)."""


def _named_types(root: Any) -> dict[str, Any]:
    names: dict[str, Any] = {}

    def walk(node: Any, namespace: str) -> None:
        if isinstance(node, list):
            for n in node:
                walk(n, namespace)
        elif isinstance(node, dict):
            kind = node.get("type")
            if kind in ("record", "error", "enum", "fixed"):
                name = str(node["name"])
                ns = node.get("namespace", namespace) if "." not in name else name.rsplit(".", 1)[0]
                full = name if "." in name else (f"{ns}.{name}" if ns else name)
                names[full] = node
                names.setdefault(full.rsplit(".", 1)[-1], node)
                for f in node.get("fields", []) if kind in ("record", "error") else []:
                    walk(f.get("type"), ns or "")
            elif kind == "array":
                walk(node.get("items"), namespace)
            elif kind == "map":
                walk(node.get("values"), namespace)
            elif isinstance(kind, (dict, list)):
                walk(kind, namespace)

    walk(root, "")
    return names


def arrow_type(avro: Any, _names: Mapping[str, Any] | None = None, _depth: int = 0,
               _open: frozenset[str] = frozenset()) -> pa.DataType:
    """The Arrow type of an Avro schema (parsed JSON)."""
    names = _named_types(avro) if _names is None else _names
    if _depth > _DEPTH_MAX:
        raise TypedColumnsError(f"schema nested deeper than {_DEPTH_MAX}")
    if isinstance(avro, str):
        if avro in _PRIMITIVE:
            return _PRIMITIVE[avro]
        if avro in names:
            if avro in _open:
                raise TypedColumnsError(f"recursive type {avro} cannot be a column")
            return arrow_type(names[avro], names, _depth + 1, _open)
        raise TypedColumnsError(f"unknown Avro type {avro!r}")
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        if len(branches) == 1:
            return arrow_type(branches[0], names, _depth + 1, _open)
        return pa.struct([pa.field(f"member{i}", arrow_type(b, names, _depth + 1, _open))
                          for i, b in enumerate(branches)])
    if not isinstance(avro, dict):
        raise TypedColumnsError(f"not an Avro schema: {avro!r}")
    kind = avro.get("type")
    logical = avro.get("logicalType")
    if logical == "date" and kind == "int":
        return pa.date32()
    if logical == "time-millis" and kind == "int":
        return pa.time32("ms")
    if logical == "time-micros" and kind == "long":
        return pa.time64("us")
    if logical in ("timestamp-millis", "local-timestamp-millis") and kind == "long":
        return pa.timestamp("ms", tz="UTC" if logical == "timestamp-millis" else None)
    if logical in ("timestamp-micros", "local-timestamp-micros") and kind == "long":
        return pa.timestamp("us", tz="UTC" if logical == "timestamp-micros" else None)
    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision = int(avro.get("precision", 38))
        return pa.decimal128(precision, int(avro.get("scale", 0))) if precision <= 38 else pa.decimal256(
            precision, int(avro.get("scale", 0)))
    if logical == "uuid" and kind == "string":
        return pa.string()
    if isinstance(kind, (dict, list)):
        return arrow_type(kind, names, _depth + 1, _open)
    if kind in _PRIMITIVE:
        return _PRIMITIVE[kind]
    if kind in ("record", "error"):
        name = str(avro["name"])
        short = name.rsplit(".", 1)[-1]
        inner = _open | {name, short}
        return pa.struct([pa.field(str(f["name"]), arrow_type(f["type"], names, _depth + 1, inner))
                          for f in avro.get("fields", [])])
    if kind == "enum":
        return pa.string()
    if kind == "fixed":
        return pa.binary()
    if kind == "array":
        return pa.list_(arrow_type(avro["items"], names, _depth + 1, _open))
    if kind == "map":
        return pa.map_(pa.string(), arrow_type(avro["values"], names, _depth + 1, _open))
    raise TypedColumnsError(f"unsupported Avro type {kind!r}")


def _record_of(avro: Any) -> dict:
    names = _named_types(avro)
    node = avro
    if isinstance(node, str) and node in names:
        node = names[node]
    if not isinstance(node, dict) or node.get("type") not in ("record", "error"):
        raise TypedColumnsError("a struct schema's top level must be a record")
    return node


def _wider(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    if a in _NUMERIC_RANK and b in _NUMERIC_RANK:
        return a if _NUMERIC_RANK[a] >= _NUMERIC_RANK[b] else b
    return b                                       # the later version wins


def merged_schema(avro_versions: Sequence[Any]) -> pa.Schema:
    """One Arrow schema for rows written under every version in ``avro_versions`` (oldest first)."""
    if not avro_versions:
        raise TypedColumnsError("no schema versions")
    order: list[str] = []
    types: dict[str, pa.DataType] = {}
    for avro in avro_versions:
        record = _record_of(avro)
        names = _named_types(avro)
        for f in record.get("fields", []):
            name = str(f["name"])
            t = arrow_type(f["type"], names)
            if name not in types:
                order.append(name)
                types[name] = t
            elif types[name] != t:
                types[name] = _wider(types[name], t)
    return pa.schema([pa.field(n, types[n], nullable=True) for n in order])


@dataclass
class DecodeStats:
    values: int = 0
    undecodable: int = 0           # value bytes that did not parse with their version's schema
    unconvertible: int = 0         # parsed, but a field did not fit the merged type (-> null)
    errors: list[str] = field(default_factory=list)   # the first few, for logs

    def note(self, message: str) -> None:
        if len(self.errors) < 5:
            self.errors.append(message)


def _decoder(kind: str, avro: Any):
    if kind == "JSON":
        return lambda data: json.loads(data)
    import fastavro
    parsed = fastavro.parse_schema(avro)

    def decode(data: bytes) -> Any:
        return fastavro.schemaless_reader(io.BytesIO(data), parsed, None)

    return decode


def _fits(value: Any, t: pa.DataType) -> Any:
    """``value`` adjusted to Arrow type ``t`` where Avro and Arrow differ (unions, enums)."""
    if value is None:
        return None
    if pa.types.is_struct(t):
        if not isinstance(value, dict):
            if t.num_fields and t.field(0).name == "member0":      # a multi-branch union
                return _union_member(value, t)
            raise TypeError(f"expected a record, got {type(value).__name__}")
        return {t.field(i).name: _fits(value.get(t.field(i).name), t.field(i).type) for i in range(t.num_fields)}
    if pa.types.is_list(t):
        return [_fits(v, t.value_type) for v in value]
    if pa.types.is_map(t):
        return [(k, _fits(v, t.item_type)) for k, v in value.items()]
    if pa.types.is_string(t) and isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if pa.types.is_string(t) and isinstance(value, uuid.UUID):     # fastavro reads logicalType uuid so
        return str(value)
    if pa.types.is_binary(t) and isinstance(value, str):
        return value.encode()
    return value


def _union_member(value: Any, t: pa.StructType) -> dict:
    out: dict[str, Any] = {t.field(i).name: None for i in range(t.num_fields)}
    for i in range(t.num_fields):
        try:
            pa.array([_fits(value, t.field(i).type)], type=t.field(i).type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            continue
        out[t.field(i).name] = _fits(value, t.field(i).type)
        break
    return out


def decode_columns(values: Sequence[bytes | None], version_of_row: Sequence[int | None],
                   versions: Mapping[int, tuple[str, Any]], target: pa.Schema,
                   stats: DecodeStats | None = None) -> list[pa.Array]:
    """One array per field of ``target`` for the rows' values.

    ``versions`` maps a schema version to (kind "AVRO"|"JSON", parsed Avro definition); rows whose
    version is None or unknown are decoded with the latest known version."""
    stats = stats if stats is not None else DecodeStats()
    if not versions:
        raise TypedColumnsError("no schema versions to decode with")
    latest = max(versions)
    decoders = {v: _decoder(kind, avro) for v, (kind, avro) in versions.items()}
    records: list[dict | None] = []
    for data, version in zip(values, version_of_row, strict=True):
        stats.values += 1
        record = None
        if data is not None:
            decode = decoders.get(version if version in decoders else latest)
            try:
                record = decode(bytes(data))
                if not isinstance(record, dict):
                    raise TypeError(f"decoded a {type(record).__name__}, not a record")
            except Exception as e:   # noqa: BLE001 - any parse failure means "undecodable"
                stats.undecodable += 1
                stats.note(f"undecodable value (schema version {version}): {e}")
                record = None
        records.append(record)
    fast = _columns_at_once(records, target)
    if fast is not None:
        return fast
    columns: list[list[Any]] = [[] for _ in target]
    names = target.names
    for record in records:
        for i, name in enumerate(names):
            value = None if record is None else record.get(name)
            if value is not None:
                try:
                    value = _fits(value, target.field(i).type)
                except (TypeError, ValueError, AttributeError) as e:
                    stats.unconvertible += 1
                    stats.note(f"field {name}: {e}")
                    value = None
            columns[i].append(value)
    out = []
    for i, f in enumerate(target):
        try:
            out.append(pa.array(columns[i], type=f.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            fixed = []                               # one by one: bad values become null
            for v in columns[i]:
                try:
                    pa.array([v], type=f.type)
                    fixed.append(v)
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
                    stats.unconvertible += 1
                    stats.note(f"field {f.name}: {e}")
                    fixed.append(None)
            out.append(pa.array(fixed, type=f.type))
    return out


def _columns_at_once(records: list[dict | None], target: pa.Schema) -> list[pa.Array] | None:
    """The columns of every record by one Arrow conversion (records -> struct array -> its
    fields), or None when some value needs ``_fits`` (a multi-branch union, bytes for a string,
    a value that does not fit): the caller then converts field by field. Where this succeeds it
    gives what the field-by-field path gives, in about a third of the time."""
    if not len(target):
        return []
    try:
        whole = pa.array(records, type=pa.struct(list(target)))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError,
            OverflowError, AttributeError, KeyError):
        return None
    return whole.flatten()


def column_names_beside(metadata_names: Iterable[str], typed: pa.Schema) -> list[str]:
    """Names for the typed columns next to the metadata columns: a field whose name is taken
    by a metadata column (or an earlier field) becomes ``value_<name>``. Names compare without
    case, as Spark SQL resolves them (``Value`` beside ``value`` would be ambiguous there)."""
    taken = {n.lower() for n in metadata_names}
    out = []
    for name in typed.names:
        new = name
        while new.lower() in taken:
            new = f"value_{new}"
        taken.add(new.lower())
        out.append(new)
    return out


# -- typed columns in tier objects ---------------------------------------------------------------
# A tier object (offload/format.py) written for a topic with a struct schema carries the typed
# columns after ROW_SCHEMA's, and in its key-value metadata under TIER_METADATA_KEY (JSON):
#   {"versions": [[version, kind, sha256 of the canonical definition], ...],   # oldest first
#    "fields": [[field name, column name], ...],     # the merged schema's fields, in order
#    "rows_of_other_versions": n,                    # rows whose version was none of these
#    "undecodable": n, "unconvertible": n}
# A reader whose versions include every recorded one (same definitions) can take the stored
# columns instead of decoding ``value`` again, if the stored column types are the ones it wants
# and no row was of another version (those were decoded with the then latest version); a field
# the object lacks came with a later version, so it is null in every row. See ``stored_columns``.
TIER_METADATA_KEY = "pulsarlite.typed_columns"
TYPED_CHUNK_ROWS = 16_384          # rows decoded at once (bounds the decoded Python records held)

Versions = Sequence[tuple[int, str, str]]       # (version, "AVRO"|"JSON", definition as JSON text)


def version_numbers(schema_versions: Iterable[bytes | None]) -> list[int | None]:
    """Message schema versions (8 bytes big-endian on the wire) as numbers; None when absent."""
    return [int.from_bytes(v, "big", signed=True) if v is not None and len(v) == 8 else None
            for v in schema_versions]


def definition_digest(definition: str) -> str:
    """sha256 of a definition's canonical JSON (key order and spacing do not matter)."""
    import hashlib
    try:
        text = json.dumps(json.loads(definition), sort_keys=True, separators=(",", ":"))
    except ValueError:
        text = definition
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class TypedColumns:
    """Typed columns decoded for a table of ROW_SCHEMA rows, ready to append."""
    names: list[str]
    arrays: list[pa.Array]
    metadata: dict[str, str]             # {TIER_METADATA_KEY: json}
    stats: DecodeStats


class TypedColumnsBuilder:
    """The typed columns of one tier object, decoded a run of rows at a time (an offloader
    feeds it a row group's worth, so memory holds one row group's records, not the ledger's):
    ``names`` / ``target`` (the merged schema) are known from ``versions`` alone, ``decode``
    returns the arrays of each run, ``metadata()`` says what all of them were built from.
    TypedColumnsError (at construction) only for a schema that cannot be columns."""

    def __init__(self, versions: Versions, metadata_names: Iterable[str]) -> None:
        if not versions:
            raise TypedColumnsError("no schema versions")
        self.versions = tuple(versions)
        self._parsed = {v: (kind, json.loads(d)) for v, kind, d in versions}
        self.target = merged_schema([self._parsed[v][1] for v, _, _ in versions])
        self.names = column_names_beside(metadata_names, self.target)
        self.stats = DecodeStats()
        self.rows_of_other_versions = 0

    def decode(self, values: Sequence[bytes | None],
               schema_versions: Sequence[bytes | None]) -> list[pa.Array]:
        """One array per field of ``target`` for ``values`` (None: a null value) written under
        ``schema_versions``; values that do not decode give nulls and are counted (``stats``)."""
        numbers = version_numbers(schema_versions)
        # in chunks: decoded records are Python objects many times the size of their bytes
        chunks = [decode_columns(values[i:i + TYPED_CHUNK_ROWS], numbers[i:i + TYPED_CHUNK_ROWS], self._parsed,
                                 self.target, self.stats) for i in range(0, len(values), TYPED_CHUNK_ROWS)]
        self.rows_of_other_versions += sum(1 for n, d in zip(numbers, values) if d is not None
                                           and n not in self._parsed)
        return [pa.concat_arrays([c[j] for c in chunks]) if chunks else pa.array([], f.type)
                for j, f in enumerate(self.target)]

    def metadata(self) -> dict[str, str]:
        """{TIER_METADATA_KEY: json} for every run decoded so far."""
        doc = {"versions": [[v, kind, definition_digest(d)] for v, kind, d in self.versions],
               "fields": [[f, c] for f, c in zip(self.target.names, self.names)],
               "rows_of_other_versions": self.rows_of_other_versions, "undecodable": self.stats.undecodable,
               "unconvertible": self.stats.unconvertible}
        return {TIER_METADATA_KEY: json.dumps(doc, separators=(",", ":"))}


def typed_columns_for(values: Sequence[bytes | None], schema_versions: Sequence[bytes | None],
                      versions: Versions, metadata_names: Iterable[str]) -> TypedColumns:
    """Decode ``values`` (None: a null value) written under ``schema_versions`` with the topic's
    struct schema ``versions``: the typed columns, named beside ``metadata_names``, and the
    object metadata that says what they were built from. Values that do not decode give nulls
    and are counted (stats); TypedColumnsError only for a schema that cannot be columns."""
    builder = TypedColumnsBuilder(versions, metadata_names)
    arrays = builder.decode(values, schema_versions)
    return TypedColumns(builder.names, arrays, builder.metadata(), builder.stats)


def stored_columns(kv_metadata: Mapping[bytes | str, bytes | str] | None, file_schema: pa.Schema,
                   versions: Versions, target: pa.Schema) -> list[str | None] | None:
    """Where a tier object holds the typed columns a reader wants: for each field of
    ``target`` (the reader's merged schema of ``versions``) the object's column, or None for a
    field every row of the object lacks (null); None overall when the object's columns cannot
    stand in for decoding ``value`` (no typed columns, a version missing or changed, a type that
    differs, rows of unrecorded versions while the versions differ): decode then."""
    if not kv_metadata:
        return None
    raw = kv_metadata.get(TIER_METADATA_KEY.encode()) if TIER_METADATA_KEY.encode() in kv_metadata \
        else kv_metadata.get(TIER_METADATA_KEY)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        recorded = [(int(v), str(k), str(h)) for v, k, h in doc["versions"]]
        fields = {str(f): str(c) for f, c in doc["fields"]}
        others = int(doc.get("rows_of_other_versions", 0))
    except (ValueError, TypeError, KeyError):
        return None                                   # not ours to trust: decode
    wanted = [(v, kind, definition_digest(d)) for v, kind, d in versions]
    if recorded != wanted and (others or not set(recorded) <= set(wanted)):
        return None
    out: list[str | None] = []
    for f in target:
        column = fields.get(f.name)
        if column is None:
            if recorded == wanted:
                return None                           # inconsistent metadata
            out.append(None)
            continue
        i = file_schema.get_field_index(column)
        if i < 0 or not file_schema.field(i).type.equals(f.type):
            return None
        out.append(column)
    return out


__all__ = ["DecodeStats", "TIER_METADATA_KEY", "TypedColumns", "TypedColumnsBuilder", "TypedColumnsError",
           "arrow_type",
           "column_names_beside", "decode_columns", "definition_digest", "merged_schema", "stored_columns",
           "typed_columns_for", "version_numbers"]
