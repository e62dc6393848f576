"""[lakehouse] ``scan(topic)``: the fresh view of a topic as one Arrow table -- the rows of its
Iceberg table (offload/lake.py) plus the entries not in the table yet, with the table's columns
and the messages' ids, each message once.

Protocol (one consistent cut, at ledger boundaries):

1. the topic's managed-ledger list is read from ZooKeeper (for each partition; an open ledger's
   last entry is its LAC, or the owner broker's last confirmed entry with ``admin_url``);
2. then the table's current snapshot (``GET .../lake`` -> ``metadata_location``, read with
   pyiceberg's ``StaticTable``: no catalog credentials needed);
3. every ledger of the list is read from exactly one place: from the snapshot when its object is
   one of the snapshot's data files; else from its tier object when it is offloaded (the table
   commit lags the offload record); else from the bookies (entries 0..last, decoded by
   offload.format's ``entries_to_table_fast``, the encoder of the objects, and the typed columns
   of the schema registry by the offloader's ``TableTypedColumns``: the same columns).

Rows of snapshot files whose ledger is no longer in the list (retention trimmed it between 1 and
2) are left out: the list read in step 1 is the cut. The result is sorted by (partition,
ledger_id, entry_id, batch_index) and has the snapshot's schema (its column order and types)
plus any column only the newer rows have (a schema version the table has not seen yet).

A pyarrow Table is what Polars (``pl.from_arrow``) and DuckDB (``duckdb.arrow`` / a
``FROM tbl`` replacement scan) take without a copy.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from pulsarlite.errors import PulsarliteError
from pulsarlite.metadata_documents import decode_schema_history
from pulsarlite.topic_name import TopicName

log = logging.getLogger("pulsarlite.lake")

ON_TIER = ("offloaded", "bookie-deleted")


class LakeScanError(PulsarliteError):
    """The fresh view cannot be read (no such topic, the lake endpoint refused, a ledger gone)."""


class Source(enum.Enum):
    """Where the scan reads a ledger from."""

    SNAPSHOT = "snapshot"      # its object is a data file of the table's current snapshot
    OBJECT = "object"          # offloaded, not in the table yet (the commit lags the record)
    BOOKIES = "bookies"        # not offloaded (the open ledger: up to its last confirmed entry)


def plan_sources(ledgers, snapshot_files: set[str]) -> list[tuple[Any, Source]]:
    """Each non-empty ledger of a partition's list (``LedgerSegment``s: ``ledger_id``,
    ``last_entry_id``, ``offload_state``, ``offload_uri``) with the one place it is read from
    (pure). An offloaded ledger still on the bookies (deletion lag) is read from its object."""
    out = []
    for seg in ledgers:
        if seg.offload_uri is not None and seg.offload_uri in snapshot_files:
            out.append((seg, Source.SNAPSHOT))
        elif seg.last_entry_id < 0:
            continue
        elif seg.offload_state in ON_TIER and seg.offload_uri:
            out.append((seg, Source.OBJECT))
        else:
            out.append((seg, Source.BOOKIES))
    return out


def scan(topic: str, *, zookeeper: str, admin_url: str, s3_endpoint_url: str | None = None,
         options: Mapping[str, str] | None = None, chunk_entries: int = 1000) -> pa.Table:
    """Every message of ``topic`` (a partitioned topic: all partitions) as one Arrow table: the
    Iceberg snapshot plus the entries still on the bookies (see the module docstring).
    ``zookeeper``: the cluster's metadata store; ``admin_url``: a broker's admin URL (the lake
    endpoint, the open ledger's last confirmed entry); ``s3_endpoint_url`` for an s3:// tier;
    ``options``: the Spark source's connection options for a secured cluster
    (``bookieAuthToken``, ``zookeeperAuthDigest``, ``bookieTlsTrustCertsFile``..., docs/spark.md),
    read and checked by the same code. ValueError / OptionError for bad arguments (nothing read)."""
    from spark_source.options import parse_options
    if chunk_entries <= 0:
        raise ValueError(f"chunk_entries {chunk_entries} <= 0")
    name = TopicName.parse(topic)
    opts = parse_options({**(options or {}), "topic": str(name), "zookeeper": zookeeper, "adminUrl": admin_url,
                          **({"s3EndpointUrl": s3_endpoint_url} if s3_endpoint_url else {})}, streaming=False)
    from spark_source.source import _with_metadata

    async def run(store, client) -> list[pa.Table]:
        return await _scan(store, client, name, admin_url=admin_url.rstrip("/"), s3_endpoint_url=s3_endpoint_url,
                           chunk_entries=chunk_entries)
    # the Spark source's ZooKeeper session and ledger client (connected only if a ledger is
    # read from the bookies), with its credentials
    parts = asyncio.run(_with_metadata(opts, run))
    if not parts:
        from offload.format import ROW_SCHEMA
        return ROW_SCHEMA.empty_table()
    out = _concat(parts)
    return out.sort_by([("partition", "ascending"), ("ledger_id", "ascending"), ("entry_id", "ascending"),
                        ("batch_index", "ascending")])


async def _scan(store, client, name: TopicName, *, admin_url: str, s3_endpoint_url: str | None,
                chunk_entries: int) -> list[pa.Table]:
    from spark_source.metadata import expand_topics, read_partition
    members = await expand_topics(store, topics=[str(name)], pattern=None)
    partitions = [await read_partition(store, client, t, i, must_exist=False, admin_url=admin_url)
                  for t, i in members]                                                  # 1. the cut
    if not any(p.ledgers for p in partitions):
        raise LakeScanError(f"topic {name}: no managed ledger in ZooKeeper (never written?)")
    parent = name.partitioned_parent
    location = _metadata_location(admin_url, parent)                                    # 2. the snapshot
    snapshot, files = _snapshot(location, s3_endpoint_url)
    typed = await _typed_columns(store, str(parent))
    parts: list[pa.Table] = []
    from_snapshot: set[int] = set()
    for p in partitions:                                                                # 3. each ledger once
        for seg, source in plan_sources(p.ledgers, files):
            if source is Source.SNAPSHOT:
                from_snapshot.add(seg.ledger_id)
            elif source is Source.OBJECT:
                parts.append(_read_object(seg.offload_uri, s3_endpoint_url))
            else:
                parts.extend(await _read_bookies(client, p.topic, p.partition, seg, typed, chunk_entries))
    if snapshot is not None:
        keep = pc.is_in(snapshot.column("ledger_id"), value_set=pa.array(sorted(from_snapshot), pa.int64()))
        parts.insert(0, snapshot.filter(keep))
    log.info("lake scan topic=%s snapshot_ledgers=%d other_parts=%d metadata_location=%s", name,
             len(from_snapshot), len(parts) - (snapshot is not None), location)
    return parts


def _metadata_location(admin_url: str, parent: TopicName) -> str | None:
    url = (f"{admin_url}/admin/v2/persistent/{parent.tenant}/{parent.namespace_local_name}/"
           f"{parent.encoded_local_name}/lake")
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:
            return json.loads(resp.read()).get("metadata_location")
    except urllib.error.HTTPError as e:
        raise LakeScanError(f"topic {parent}: GET {url} answered {e.code}: {e.read()[:300]!r}") from None
    except urllib.error.URLError as e:
        raise LakeScanError(f"topic {parent}: GET {url}: {e.reason}") from None


def _snapshot(location: str | None, s3_endpoint_url: str | None) -> tuple[pa.Table | None, set[str]]:
    """The current snapshot's rows and data file URIs (None, empty: no table yet)."""
    if not location:
        return None, set()
    from pyiceberg.table import StaticTable
    props = {"s3.endpoint": s3_endpoint_url} if s3_endpoint_url else {}
    table = StaticTable.from_metadata(location, properties=props)
    if table.current_snapshot() is None:
        return None, set()
    files = {task.file.file_path for task in table.scan().plan_files()}
    return table.scan().to_arrow(), files


def _read_object(uri: str, s3_endpoint_url: str | None) -> pa.Table:
    from offload.reader import TierReader
    with TierReader(uri, s3_endpoint_url=s3_endpoint_url, read_ahead_row_groups=0) as reader:
        return reader.read_table()


async def _typed_columns(store, parent: str):
    """The offloader's typed columns for the topic's live AVRO/JSON schema versions (or None)."""
    from spark_source.typed import live_struct_versions, schema_path
    got = await store.get_or_none(schema_path(parent))
    if got is None:
        return None
    versions = live_struct_versions(decode_schema_history(got[0]))
    if not versions:
        return None
    from offload.tier import TableTypedColumns
    return TableTypedColumns.of(tuple(versions), topic=parent)


async def _read_bookies(client, topic: str, partition: int, seg, typed, chunk_entries: int) -> list[pa.Table]:
    from offload.format import entries_to_table_fast
    from pulsarlite.errors import MetadataNotFoundError, NoSuchLedgerError
    try:
        reader = await client.open_ledger(seg.ledger_id, recovery=False)
    except (MetadataNotFoundError, NoSuchLedgerError):
        raise LakeScanError(f"topic {topic}: ledger {seg.ledger_id} is gone from the bookies since the list was "
                            "read (offloaded or trimmed meanwhile): scan again") from None
    if not reader.metadata.is_closed:
        reader.last_add_confirmed = max(reader.last_add_confirmed, seg.last_entry_id)
    if reader.last_readable_entry_id < seg.last_entry_id:
        raise LakeScanError(f"topic {topic}: ledger {seg.ledger_id} has entries up to "
                            f"{reader.last_readable_entry_id}, the list says {seg.last_entry_id}")
    out = []
    for first in range(0, seg.last_entry_id + 1, chunk_entries):
        entries = await reader.read(first, min(first + chunk_entries - 1, seg.last_entry_id))
        table = entries_to_table_fast(seg.ledger_id, [(e.entry_id, e.payload) for e in entries], partition=partition)
        if typed is not None:
            for field, array in zip(typed.fields, typed.arrays(table)):
                table = table.append_column(field, pa.array(array, field.type) if not isinstance(
                    array, (pa.Array, pa.ChunkedArray)) else array)
        out.append(table)
    return out


def _concat(parts: list[pa.Table]) -> pa.Table:
    """The parts in the first one's schema (the snapshot's, when there is one): each column cast
    to its type, a missing column null; columns only later parts have are appended."""
    fields = list(parts[0].schema)
    names = {f.name for f in fields}
    for t in parts[1:]:
        for f in t.schema:
            if f.name not in names:
                fields.append(f.with_nullable(True))
                names.add(f.name)
    schema = pa.schema(fields)
    conformed = []
    for t in parts:
        cols = []
        for f in schema:
            if f.name in t.column_names:
                col = t.column(f.name)
                cols.append(col if col.type == f.type else col.cast(f.type))
            else:
                cols.append(pa.nulls(t.num_rows, f.type))
        conformed.append(pa.Table.from_arrays(cols, schema=schema))
    return pa.concat_tables(conformed)


__all__ = ["LakeScanError", "Source", "plan_sources", "scan"]
