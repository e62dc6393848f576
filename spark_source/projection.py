"""Column selection by a user-given schema (pure).

Spark's Python data source API has no column pruning: a reader returns every column of its
schema. A user narrows that schema by giving one: ``spark.read.format("pulsarlite")
.schema("value binary, publish_time timestamp")``; Spark then hands it to
``DataSource.reader(schema)`` instead of asking ``DataSource.schema()``. A given schema whose
columns are some of the source's (metadata columns and, for topics with a struct schema, typed
value columns), in any order, with the source's types, is a projection: only those columns are
read (tier objects: only the Parquet columns they are built from) and returned, in the given
order. Anything else is refused at planning, before anything is read.

Types are compared as Spark's simple strings (``binary``, ``timestamp``,
``map<string,string>``, ``struct<a:int>``): nested nullability is not part of the contract; a
column may not be declared ``NOT NULL`` (every column of the source can hold nulls)."""

from __future__ import annotations

from dataclasses import dataclass

from spark_source.errors import SCHEMA_MISMATCH_ERROR_CLASS as ERROR_CLASS
from spark_source.errors import SchemaMismatchError


@dataclass(frozen=True)
class SourceColumn:
    name: str
    type_name: str          # Spark's simple string of the column's type


def source_columns(struct) -> tuple[SourceColumn, ...]:
    """The columns of a Spark StructType (the source's full schema)."""
    return tuple(SourceColumn(f.name, f.dataType.simpleString()) for f in struct.fields)


def resolve_projection(given, columns: tuple[SourceColumn, ...], *, note: str = "") -> tuple[str, ...] | None:
    """The column names ``given`` (a Spark StructType) selects, in its order, or None when it is
    exactly the source's full schema (same names, order and types). ``note`` is appended to the
    error for an unknown column (e.g. why typed columns are absent). Raises SchemaMismatchError
    naming the column and the type the source has for it."""
    fields = list(getattr(given, "fields", None) or [])
    if not fields:
        raise SchemaMismatchError("the given schema has no columns; give at least one of the source's columns")
    by_name = {c.name: c for c in columns}
    seen: set[str] = set()
    for f in fields:
        name = f.name
        if name in seen:
            raise SchemaMismatchError(f"column `{name}` appears twice in the given schema")
        seen.add(name)
        col = by_name.get(name)
        if col is None:
            near = [c.name for c in columns if c.name.lower() == name.lower()]
            hint = f" (did you mean `{near[0]}` {by_name[near[0]].type_name}?)" if near else ""
            listing = ", ".join(f"{c.name} {c.type_name}" for c in columns)
            raise SchemaMismatchError(f"column `{name}` is not a column of the pulsarlite source{hint}; "
                                      f"its columns are: {listing}{note}")
        got = f.dataType.simpleString()
        if got != col.type_name:
            raise SchemaMismatchError(f"column `{name}` has type {col.type_name} in the pulsarlite source, "
                                      f"the given schema says {got}; declare it as `{name} {col.type_name}`")
        if not f.nullable:
            raise SchemaMismatchError(f"column `{name}` is declared NOT NULL; the pulsarlite source's columns "
                                      f"are nullable: declare it as `{name} {col.type_name}`")
    names = tuple(f.name for f in fields)
    if names == tuple(c.name for c in columns):
        return None
    return names


__all__ = ["ERROR_CLASS", "SchemaMismatchError", "SourceColumn", "resolve_projection", "source_columns"]
