"""[lakehouse] Small files merged: a background rewrite of a topic's Iceberg table that replaces
runs of small data files (each one ledger's tier object) with one merged Parquet object, keeping
``ledger_id``/``entry_id``/``batch_index`` as columns so message ids stay (docs/lakehouse.md
"File sizes", docs/decisions.md).

The tier objects themselves are never replaced (the broker reads a ledger from its own object):
a merged object is a **second copy** of its ledgers' rows, for the table only.

- **Name**: ``<tier>/<tenant>/<ns>/<topic>/merged-<first>-<last>-<count>-<uuid>.parquet``, under
  the topic's prefix (topic deletion deletes it with the rest; the orphan sweep of ledger
  objects ignores it: not a ``ledger-<id>-<uuid>.parquet`` name). It stands for the topic's
  ``count`` offloaded ledgers with an id in ``[first, last]``; its footer also lists them
  (``pulsarlite.merged_ledgers``). Which ledgers a merged file stands for is thus recoverable
  from the table alone after a crash.
- **Validity** (``merged_file_ledgers``): a merged file of the table is kept while the list's
  offloaded, not leaving ledgers in ``[first, last]`` are exactly ``count`` with ``first`` and
  ``last`` among them. Ledger ids only grow along the list and a merge only takes ledgers
  consecutive in the list, all offloaded, so the range can only lose ledgers (retention, a
  ledger back to ``offloading``, topic deletion): then the count no longer matches, and the table
  sync (offload.lake ``plan_table_sync``) removes the merged file and adds the remaining
  ledgers' own objects back, in one snapshot. A ledger re-offloaded under a new object holds
  the same rows (a closed ledger is immutable), so the merged copy stays right.
- **Plan** (``plan_merge``, pure): the table's files of the topic in list order are units (a
  ledger's object, or a valid merged file); runs of consecutive small units (less than
  ``target_bytes`` each, same UTC day when the table is day-partitioned, no ledger in between
  that is not in the table) are cut greedily into groups of at most ``target_bytes``; a group
  followed by a unit it could not take (full, or another day) is merged from 2 units, the last
  (still growing) group from ``files_min`` units. At most one merge per call: the oldest group.
- **Rewrite** (``write_merged``, blocking): the units' objects are read (page checksums
  verified), their schemas unified by name (as the table's ``union_by_name``), and written in
  ledger order as one Parquet object with the tier format's writer (zstd, row groups of about
  ``row_group_bytes``, statistics on ledger_id/entry_id/publish_time/event_time).
- **Commit** (offload.lake ``Lake.commit_merge``): one snapshot deletes the units' files and adds
  the merged one, only if every unit is still in the table. A crash between write and commit
  leaves a merged object no snapshot names: ``merged_objects_to_delete`` (run by the offloader's
  sweep) deletes merged objects that no snapshot of the table references (the expired ones are
  gone after ``lake_snapshot_retention_ms``), once older than a grace.
"""

from __future__ import annotations

import io
import logging
import re
import time
import uuid as uuid_mod
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

log = logging.getLogger("pulsarlite.offload.lake_merge")

MERGED_PREFIX = "merged-"
MERGED_SUFFIX = ".parquet"
MERGED_LEDGERS_KEY = "pulsarlite.merged_ledgers"
_MERGED_RE = re.compile(r"^merged-(\d+)-(\d+)-(\d+)-([0-9a-f]{8,32})\.parquet$")
DAY_MS = 86_400_000
MERGED_ORPHAN_GRACE_MS = 10 * 60 * 1000     # a merged object younger than this may be a merge in flight


# -- names ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MergedName:
    first: int
    last: int
    count: int
    uuid: str

    def __post_init__(self) -> None:
        if not (0 <= self.first <= self.last and 1 <= self.count <= self.last - self.first + 1):
            raise ValueError(f"bad merged range {self.first}-{self.last} of {self.count} ledgers")

    @property
    def file_name(self) -> str:
        return f"{MERGED_PREFIX}{self.first}-{self.last}-{self.count}-{self.uuid}{MERGED_SUFFIX}"


def parse_merged_name(uri_or_key: str) -> MergedName | None:
    """The merged file's range from its URI or key; None if it is not a merged object."""
    m = _MERGED_RE.match(uri_or_key.rsplit("/", 1)[-1])
    if m is None:
        return None
    try:
        return MergedName(int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4))
    except ValueError:
        return None


def merged_object_uri(object_prefix: str, ledger_ids: Sequence[int], attempt_uuid: str | None = None) -> str:
    """``<object_prefix>merged-<first>-<last>-<count>-<uuid>.parquet`` for ``ledger_ids``
    (increasing)."""
    if not object_prefix.endswith("/"):
        raise ValueError(f"prefix {object_prefix!r} must end with '/'")
    name = MergedName(ledger_ids[0], ledger_ids[-1], len(ledger_ids), attempt_uuid or uuid_mod.uuid4().hex)
    return object_prefix + name.file_name


# -- which ledgers a merged file stands for (pure) ------------------------------------------------
def merged_file_ledgers(uri: str, live: Iterable[int]) -> tuple[int, ...] | None:
    """The ledgers the merged file ``uri`` stands for, if it is valid against ``live`` (the
    list's offloaded ledgers that are not leaving); None if it is not a merged file or no longer
    valid (see the module docstring)."""
    name = parse_merged_name(uri)
    if name is None:
        return None
    ids = tuple(sorted(i for i in live if name.first <= i <= name.last))
    if len(ids) != name.count or not ids or ids[0] != name.first or ids[-1] != name.last:
        return None
    return ids


def table_layout(table_files: Iterable[str], live: Mapping[int, str]) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """(kept merged files -> their ledgers, the files the table should have) for ``live``
    (ledger id -> own object URI of the offloaded ledgers not leaving). Valid merged files of
    ``table_files`` are kept (should two overlap, which no sequence of our commits makes, the
    one with the lower first ledger, then more ledgers, wins); every live ledger that no kept
    merged file covers is there by its own object."""
    candidates = []
    for f in table_files:
        ids = merged_file_ledgers(f, live)
        if ids is not None:
            candidates.append((ids[0], -len(ids), f, ids))
    kept: dict[str, tuple[int, ...]] = {}
    covered: set[int] = set()
    for _, _, f, ids in sorted(candidates):
        if covered.isdisjoint(ids):
            kept[f] = ids
            covered.update(ids)
    desired = set(kept) | {uri for lid, uri in live.items() if lid not in covered}
    return kept, desired


# -- the plan (pure) -------------------------------------------------------------------------------
@dataclass(frozen=True)
class LedgerObject:
    """One ledger of the topic's list, in list order: ``uri`` its own object (None: not
    offloaded, or leaving), ``size_bytes`` the object's size, ``day`` the UTC day of all its
    rows' publish times (None: unknown, or they span days)."""

    ledger_id: int
    uri: str | None
    size_bytes: int = 0
    day: int | None = None


def ledger_day(min_publish_time_ms: int | None, max_publish_time_ms: int | None) -> int | None:
    """The UTC day of an object whose publish times lie in these bounds; None if unknown or
    they span days."""
    if min_publish_time_ms is None or max_publish_time_ms is None:
        return None
    lo, hi = min_publish_time_ms // DAY_MS, max_publish_time_ms // DAY_MS
    return lo if lo == hi else None


@dataclass(frozen=True)
class MergePlan:
    ledger_ids: tuple[int, ...]     # the ledgers the merged file stands for (increasing, consecutive in the list)
    sources: tuple[str, ...]        # the table's files it replaces (ledger objects, merged files), in ledger order
    size_bytes: int                 # the sources' ledger objects' bytes (about the merged object's)


@dataclass(frozen=True)
class _Unit:
    uri: str
    ledger_ids: tuple[int, ...]
    size_bytes: int
    day: int | None


def _units(ledgers: Sequence[LedgerObject], table_files: Iterable[str]) -> list[_Unit | None]:
    """The table's files in list order (None: a break, a ledger not in the table as expected)."""
    live = {o.ledger_id: o.uri for o in ledgers if o.uri is not None}
    files = set(table_files)
    kept, _ = table_layout(files, live)
    merged_of = {lid: f for f, ids in kept.items() for lid in ids}
    by_id = {o.ledger_id: o for o in ledgers}
    out: list[_Unit | None] = []
    seen: set[str] = set()
    for o in ledgers:
        if o.uri is None:
            out.append(None)
        elif o.ledger_id in merged_of:
            f = merged_of[o.ledger_id]
            if f not in seen:
                seen.add(f)
                ids = kept[f]
                days = {by_id[i].day for i in ids}
                out.append(_Unit(f, ids, sum(by_id[i].size_bytes for i in ids),
                                 days.pop() if len(days) == 1 else None))
        elif o.uri in files:
            out.append(_Unit(o.uri, (o.ledger_id,), o.size_bytes, o.day))
        else:
            out.append(None)
    return out


def plan_merge(ledgers: Sequence[LedgerObject], table_files: Iterable[str], *, target_bytes: int,
               files_min: int, by_day: bool, file_bytes_max: int = 0) -> MergePlan | None:
    """The oldest run of small files of the topic's table to merge now, or None (module
    docstring). ``ledgers``: the topic's list in order; ``table_files``: the table's files of
    this topic; ``by_day``: the table is partitioned by day (a merged file stays inside one
    day; a ledger of unknown or spanning day is not merged). ``target_bytes`` 0: never.
    ``file_bytes_max``: a unit above it is not small (never merged; 0: ``target_bytes``): a
    merge pays for files of up to ~1 MB, not for files of tens of MB (BENCHMARKS.md)."""
    if target_bytes <= 0:
        return None
    if files_min < 2:
        raise ValueError(f"files_min {files_min} < 2")
    groups: list[tuple[list[_Unit], bool]] = []      # (units, closed)
    current: list[_Unit] = []
    total = 0

    def close(closed: bool) -> None:
        nonlocal current, total
        if current:
            groups.append((current, closed))
        current, total = [], 0

    small_max = min(file_bytes_max or target_bytes, target_bytes)
    for unit in _units(ledgers, table_files):
        small = unit is not None and unit.size_bytes < target_bytes and unit.size_bytes <= small_max \
            and (not by_day or unit.day is not None)
        if not small:
            close(False)        # a break: what follows may still be offloaded later; not "closed" by it
            continue
        if current and ((by_day and unit.day != current[0].day) or total + unit.size_bytes > target_bytes):
            close(True)
        current.append(unit)
        total += unit.size_bytes
    close(False)
    for units, closed in groups:
        if len(units) >= (2 if closed else files_min):
            return MergePlan(tuple(i for u in units for i in u.ledger_ids), tuple(u.uri for u in units),
                             sum(u.size_bytes for u in units))
    return None


def merged_objects_to_delete(listed: Iterable[tuple[str, int]], referenced: Iterable[str], *, now_ms: int,
                             grace_ms: int = MERGED_ORPHAN_GRACE_MS) -> list[str]:
    """Merged objects among ``listed`` ((URI, last modified ms) under a topic's prefix) that no
    snapshot of the table references (``referenced``: the files of every snapshot the table
    keeps) and older than ``grace_ms`` (a merge between its write and its commit)."""
    ref = set(referenced)
    return sorted(uri for uri, modified_ms in listed
                  if parse_merged_name(uri) is not None and uri not in ref and now_ms - modified_ms >= grace_ms)


# -- the rewrite (blocking) ------------------------------------------------------------------------
@dataclass(frozen=True)
class MergedObject:
    uri: str
    rows: int
    size_bytes: int
    read_bytes: int
    seconds: float


def write_merged(get: Callable[[str], bytes], put: Callable[[str, bytes], None], sources: Sequence[str],
                 uri: str, ledger_ids: Sequence[int], *, row_group_bytes: int) -> MergedObject:
    """Read ``sources`` (object URIs, in ledger order) with ``get``, write them as one Parquet
    object at ``uri`` with ``put``: schemas unified by name (a column missing from a source is
    null there), rows in ledger order, the tier format's writer settings; the footer lists
    ``ledger_ids``. TierFormatError / TierChecksumError for a source that is not ours."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from offload.format import ParquetStreamWriter, read_parquet

    started = time.monotonic()
    blobs = [get(s) for s in sources]
    read_bytes = sum(len(b) for b in blobs)
    schemas = [pq.read_schema(pa.BufferReader(b)).remove_metadata() for b in blobs]
    schema = pa.unify_schemas(schemas, promote_options="permissive")
    sink = io.BytesIO()
    writer = ParquetStreamWriter(sink, schema, row_group_bytes=row_group_bytes,
                                 metadata={MERGED_LEDGERS_KEY: ",".join(str(i) for i in ledger_ids)})
    try:
        for i in range(len(blobs)):
            table = read_parquet(pa.BufferReader(blobs[i]))
            blobs[i] = b""
            writer.write(_conform(table, schema))
    finally:
        summary = writer.close()
    data = sink.getvalue()
    put(uri, data)
    return MergedObject(uri, summary.rows, len(data), read_bytes, time.monotonic() - started)


def _conform(table, schema):
    import pyarrow as pa
    columns = []
    for f in schema:
        idx = table.schema.get_field_index(f.name)
        col = table.column(idx) if idx >= 0 else pa.nulls(table.num_rows, f.type)
        columns.append(col if col.type == f.type else col.cast(f.type))
    return pa.Table.from_arrays(columns, schema=schema)


# -- one merge, one sweep (blocking: the offloader's thread pool) -----------------------------------
def merge_once(lake, tier, tid, ledgers: Sequence[LedgerObject], *, object_prefix: str, topic: str,
               target_bytes: int, files_min: int, row_group_bytes: int, file_bytes_max: int = 0,
               now_ms: int | None = None) -> tuple[MergePlan, MergedObject] | None:
    """Plan one merge of the topic's table (``plan_merge`` over ``lake.table_state``), write the
    merged object to ``tier`` and commit it (``Lake.commit_merge``); None if there is nothing
    to merge. A failed commit leaves the merged object for ``sweep_merged`` (the commit's
    outcome may be unknown: never delete an object the table might name)."""
    files, by_day = lake.table_state(tid, object_prefix)
    plan = plan_merge(ledgers, files, target_bytes=target_bytes, files_min=files_min, by_day=by_day,
                      file_bytes_max=file_bytes_max)
    if plan is None:
        return None
    uri = merged_object_uri(object_prefix, plan.ledger_ids)
    merged = write_merged(lambda u: tier.get(tier.key_of(u)), lambda u, data: tier.put(tier.key_of(u), data),
                          plan.sources, uri, plan.ledger_ids, row_group_bytes=row_group_bytes)
    lake.commit_merge(tid, plan.sources, uri, topic=topic, now_ms=now_ms)
    log.info("lake merge topic=%s table=%s ledgers=%s files=%d rows=%d read_bytes=%d object_bytes=%d seconds=%.3f "
             "MBps=%.1f uri=%s", topic, tid.name, list(plan.ledger_ids), len(plan.sources), merged.rows,
             merged.read_bytes, merged.size_bytes, merged.seconds, merged.read_bytes / 1e6 / max(merged.seconds, 1e-9),
             uri)
    return plan, merged


def sweep_merged(lake, tier, tid, prefix: str, *, now_ms: int, grace_ms: int = MERGED_ORPHAN_GRACE_MS,
                 topic: str = "") -> list[str]:
    """Delete the merged objects under ``prefix`` (the topic's key prefix) that no snapshot of
    its table references any more (``merged_objects_to_delete``). Returns their URIs."""
    listed = [(tier.uri_of(i.key), i.modified_ms if i.modified_ms is not None else now_ms)
              for i in tier.store.list(prefix) if parse_merged_name(i.key) is not None]
    if not listed:
        return []
    doomed = merged_objects_to_delete(listed, lake.referenced_files(tid), now_ms=now_ms, grace_ms=grace_ms)
    for uri in doomed:
        tier.delete(tier.key_of(uri))
        log.info("lake merged object deleted topic=%s uri=%s (no snapshot of the table references it)", topic, uri)
    return doomed


__all__ = ["LedgerObject", "MERGED_LEDGERS_KEY", "MERGED_ORPHAN_GRACE_MS", "MergePlan", "MergedName", "MergedObject",
           "ledger_day", "merged_file_ledgers", "merged_object_uri", "merged_objects_to_delete", "parse_merged_name",
           "plan_merge", "merge_once", "sweep_merged", "table_layout", "write_merged"]
