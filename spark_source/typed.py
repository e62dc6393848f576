"""Typed value columns ([schema]): when the topics a query reads share an AVRO or JSON schema
(the broker's registry, ``/schemas/<tenant>/<ns>/<topic>``), the record's fields become columns
beside the metadata columns, the same for segments on bookies and offloaded ones; ``value``
keeps the raw bytes. Every live version of the schema is merged by field name
(offload/typed_columns.py), so rows written under different versions land in one table, a
field a version lacks being null. A field whose name is taken by a metadata column is named
``value_<name>``. Option ``valueSchema``: ``typed`` (default) or ``raw`` (metadata columns only).

Topics with no schema, a primitive one, or different struct schemas are read raw (logged).

Bookie segments are decoded from ``value``. A tier object written by the offloader carries the
typed columns itself (broker/offloader.py); a tier scan takes them from Parquet when the
object's recorded schema versions are ones the query knows with the same definitions and the
stored column types are the wanted ones (offload/typed_columns.py ``stored_columns``; a field
added by a later version is null there), and decodes ``value`` otherwise. Either way the
columns and their values are the same (tests/unit/test_offload_typed_columns.py).
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass

import pyarrow as pa

from offload.typed_columns import (DecodeStats, column_names_beside, decode_columns, merged_schema,
                                   version_numbers)
from pulsarlite.errors import PulsarliteError
from pulsarlite import metadata_layout as layout
from pulsarlite.metadata_documents import SchemaHistory, decode_schema_history
from pulsarlite.topic_name import TopicName

log = logging.getLogger("pulsarlite.spark")

STRUCT_TYPE_CODES = {2: "JSON", 4: "AVRO"}     # Schema.Type in the wire protocol


@dataclass(frozen=True)
class TypedValue:
    """What a reader needs to add typed columns (picklable: it travels to the workers)."""
    versions: tuple[tuple[int, str, str], ...]     # (version, "AVRO"|"JSON", Avro definition as JSON text)
    target: pa.Schema                             # merged fields, original names
    names: tuple[str, ...]                        # their column names beside the metadata columns

    def output_fields(self) -> list[pa.Field]:
        """The typed columns as the DataFrame has them: each merged field's Arrow type in the form
        Spark's Python data source requires of the batches a reader returns (timestamps in
        microseconds, times as time64, Spark's list/map field names); values are cast to it."""
        return [pa.field(n, spark_arrow_type(f.type), nullable=True) for n, f in zip(self.names, self.target)]


def _spark_ready(t: pa.DataType) -> pa.DataType:
    """``t`` with what pyspark's type mapping does not take replaced (time32 -> time64, decimals
    wider than 38 digits -> string)."""
    if pa.types.is_time32(t):
        return pa.time64("us")
    if pa.types.is_decimal(t) and t.precision > 38:     # beyond Spark's DecimalType: as text
        return pa.string()
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _spark_ready(t.value_type), t.value_field.nullable))
    if pa.types.is_map(t):
        return pa.map_(_spark_ready(t.key_type), pa.field(t.item_field.name, _spark_ready(t.item_type),
                                                          t.item_field.nullable))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _spark_ready(f.type), f.nullable) for f in t])
    return t


@functools.lru_cache(maxsize=256)
def spark_arrow_type(t: pa.DataType) -> pa.DataType:
    """The Arrow type Spark expects back for a column of Arrow type ``t`` (through Spark's type)."""
    from pyspark.sql.pandas.types import from_arrow_type, to_arrow_type
    return to_arrow_type(from_arrow_type(_spark_ready(t)), timezone="UTC")


def schema_path(topic: str) -> str:
    t = TopicName.parse(topic).partitioned_parent
    return layout.schema_path(t.tenant, t.namespace_local_name, t.encoded_local_name)


def live_struct_versions(history: SchemaHistory) -> list[tuple[int, str, str]]:
    """(version, kind, definition) of the live AVRO/JSON versions of a registry znode (the
    versions after the last tombstone); empty when a live version is not a struct."""
    out = []
    for version, record in history.live():
        kind = STRUCT_TYPE_CODES.get(record.type_code)
        if kind is None:
            return []
        out.append((version, kind, record.data.decode("utf-8")))
    return out


async def load_typed_value(store, topics: list[str], metadata_names: list[str]) -> TypedValue | None:
    """The typed columns for a query over ``topics`` (full names), or None (read raw)."""
    parents = sorted({str(TopicName.parse(t).partitioned_parent) for t in topics})
    if not parents:
        return None
    found: dict[str, list[tuple[int, str, str]]] = {}
    for parent in parents:
        try:
            got = await store.get_or_none(schema_path(parent))
        except PulsarliteError as e:
            log.info("schema of %s unreadable (%s): reading raw values", parent, e)
            return None
        found[parent] = live_struct_versions(decode_schema_history(got[0])) if got is not None else []
    distinct = {tuple(v) for v in found.values()}
    if len(distinct) != 1 or not next(iter(distinct)):
        if any(found.values()):
            log.info("topics %s do not share one struct schema: reading raw values", parents)
        return None
    versions = next(iter(distinct))
    target = merged_schema([json.loads(d) for _, _, d in versions])
    names = tuple(column_names_beside(metadata_names, target))
    log.info("typed value columns topic(s)=%s versions=%s columns=%s", parents, [v for v, _, _ in versions],
             list(names))
    return TypedValue(tuple(versions), target, names)


def typed_arrays(table: pa.Table, typed: TypedValue) -> list[pa.Array]:
    """The typed columns of ROW_SCHEMA rows (offload.format), each value decoded with the
    schema version it was written with (the message's schema_version, 8 bytes big-endian)."""
    versions = {v: (kind, json.loads(d)) for v, kind, d in typed.versions}
    version_of_row = version_numbers(table["schema_version"].to_pylist())
    stats = DecodeStats()
    arrays = decode_columns(table["value"].to_pylist(), version_of_row, versions, typed.target, stats)
    if stats.undecodable or stats.unconvertible:
        log.warning("typed columns: %d undecodable values, %d unconvertible fields (first: %s)",
                    stats.undecodable, stats.unconvertible, stats.errors[:1])
    return arrays


__all__ = ["TypedValue", "live_struct_versions", "load_typed_value", "schema_path", "typed_arrays"]
