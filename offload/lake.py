"""[lakehouse] A topic's offloaded ledgers as the data files of an Apache Iceberg table (zero copy).

Every ``offloaded`` / ``bookie-deleted`` ledger's tier object IS one data file of the topic's
table: it is registered as it is (pyiceberg ``add_files``, which reads only its footer: our
Parquet objects carry no field ids, so the table's name mapping resolves their columns), never
rewritten. Table identifier: (tenant, namespace, topic) -- Iceberg namespace ``tenant.namespace``,
table = the topic's local name (partitions of a partitioned topic share the table of their base
name; the rows carry a ``partition`` column). Table location: ``<tier>/_lake/<tenant>/<ns>/<topic>``
(metadata JSON, manifests; the data files stay where the offloader wrote them).

Protocol (the owner broker only, driven by ``broker.offloader``):

- **commit**: after a ledger's ``offloaded`` record is stored (the CAS succeeded), its object is
  added to the table (offload.core's ``CommitToTable`` step). A crash in between leaves an
  offloaded ledger missing from the table; the next offloader pass repairs it.
- **repair** (each offloader pass, before any ledger step): ``plan_table_sync`` compares the
  table's files with the list's offloaded objects: missing ones are added, files that no
  offloaded ledger of the list names (a ledger that went back to ``offloading``, a trimmed one)
  are removed -- one snapshot for both. Hence: never a file in the table that the ledger list does
  not know; never an offloaded ledger missing from the table after a pass.
- **retention**: the ledgers about to be trimmed leave the table (a new snapshot) before they
  leave the list and before their objects are deleted; **topic deletion** drops the table
  before the objects go.
- **schema**: each added file's Arrow schema is merged into the table's (``union_by_name``):
  metadata columns plus the typed columns offload/format.py wrote from the schema registry;
  fields added by a registry evolution become optional Iceberg fields with new, stable ids.
  Topics without a struct schema have ``value`` (bytes) only.
- **merged files** (offload/lake_merge.py): each offloader pass may replace a run of small
  files by one merged object (a second copy of those ledgers' rows; ``commit_merge``, one
  snapshot); the repair keeps a merged file while every ledger it stands for is offloaded and
  not leaving, and otherwise swaps it for the remaining ledgers' own objects (one snapshot).
- **snapshots** older than ``lake_snapshot_retention_ms`` (broker key; -1 keeps all) are expired
  after each commit, never the current one (metadata only).
- **partition spec** (``partition="day"``, the broker's ``lake_partition``): a new table is
  partitioned by ``day(publish_time)`` (field ``publish_time_day``); the managed ledger rolls its
  ledger over when publish time enters a later UTC day (``RolloverPolicy.publish_period_ms``), so
  each object lies inside one day. ``add_files`` derives a file's partition value from its
  publish_time bounds and refuses a file whose bounds fall on different days; such a file still
  exists (a ledger written before the setting, a producer whose clock runs behind another's
  near midnight: publish time is the producer's). Rows are never left out of the table: before
  adding a file that spans days the table's spec is evolved to unpartitioned (one metadata
  commit, logged, for good: later files are unpartitioned too); files added before keep their
  day partition and still prune. Files keep min/max statistics on ``publish_time`` and
  ``ledger_id``/``entry_id`` either way, so engines also prune at the file level.
  ``partition="none"``: unpartitioned tables. An existing table keeps its spec.
- **column metrics**: the manifests carry min/max bounds of ``ledger_id``, ``entry_id``,
  ``publish_time`` and ``event_time`` (the columns with Parquet statistics in our objects) and no
  metrics for the others (table properties ``write.metadata.metrics.*``, set at creation and on
  the first commit to an older table).

pyiceberg is imported lazily (about 5 s of import on this machine): only the broker's offloader
thread pool, and only when the lake is enabled, pays it. Everything here but ``plan_table_sync``
is blocking I/O: run it off the event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from offload.errors import TierError

log = logging.getLogger("pulsarlite.offload.lake")

LAKE_DIR = "_lake"
PARTITIONS = ("day", "none")
DAY_FIELD = "publish_time_day"
DAY_MS = 86_400_000
METRICS_DEFAULT_KEY = "write.metadata.metrics.default"


def metrics_properties() -> dict[str, str]:
    """Iceberg table properties that make the manifests carry exactly the column metrics our
    objects have Parquet statistics for (offload/format.py ``STATISTICS_COLUMNS``: ledger_id,
    entry_id, publish_time, event_time: full bounds) and none for the other columns (whose
    objects have no statistics: metrics mode ``none`` is also what keeps ``add_files`` from
    warning about each of them)."""
    from offload.format import STATISTICS_COLUMNS
    return {METRICS_DEFAULT_KEY: "none",
            **{f"write.metadata.metrics.column.{c}": "full" for c in STATISTICS_COLUMNS}}
METADATA_VERSIONS_MAX = 100     # previous table metadata files kept (Iceberg's default); older ones deleted


def table_properties(metadata_versions_max: int = METADATA_VERSIONS_MAX) -> dict[str, str]:
    """Every property our tables carry: the metrics ones (``metrics_properties``) and Iceberg's
    own clean-up of old metadata files: after each commit, metadata files beyond the
    ``metadata_versions_max`` previous ones are deleted (``write.metadata.delete-after-commit.enabled``,
    ``write.metadata.previous-versions-max``; a reader that loaded one of them mid-scan reads
    on: data files are never deleted by this)."""
    return {**metrics_properties(), "write.metadata.delete-after-commit.enabled": "true",
            "write.metadata.previous-versions-max": str(metadata_versions_max)}


CATALOG_NAME = "pulsarlite"
PARTITION_SUFFIX = "-partition-"


class LakeError(TierError):
    """A table operation failed (catalog, metadata files, a data file that does not fit);
    retried on the next offloader pass."""

    retriable = True


# -- pure -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TableId:
    tenant: str
    namespace: str
    table: str

    @classmethod
    def of_topic(cls, tenant: str, namespace: str, local_name: str) -> "TableId":
        """A partition ``t-partition-3`` maps to the table of ``t``."""
        base, sep, index = local_name.rpartition(PARTITION_SUFFIX)
        table = base if sep and base and index.isdigit() else local_name
        return cls(tenant, namespace, table)

    @property
    def identifier(self) -> tuple[str, str, str]:
        return (self.tenant, self.namespace, self.table)

    @property
    def name(self) -> str:
        """``tenant.namespace.table`` (how engines name it)."""
        return ".".join(self.identifier)

    def location(self, warehouse: str) -> str:
        return f"{warehouse.rstrip('/')}/{self.tenant}/{self.namespace}/{self.table}"


@dataclass(frozen=True)
class TableSync:
    add: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.add and not self.remove


def plan_table_sync(table_files: Iterable[str], offloaded: Mapping[int, str],
                    leaving: Iterable[int] = ()) -> TableSync:
    """What to add to and remove from a topic's table so that it holds exactly the rows of
    ``offloaded`` (ledger id -> object URI, the list's offloaded/bookie-deleted ledgers of
    this topic or partition) minus the ledgers ``leaving`` (being trimmed), each once;
    ``table_files``: the table's files of this topic or partition. A merged file
    (offload/lake_merge.py) stays while every ledger it stands for is still there (then their
    own objects are not in the table); once one leaves, the merged file is removed and the
    others' own objects are added back (``table_layout``)."""
    from offload.lake_merge import table_layout
    gone = set(leaving)
    live = {lid: uri for lid, uri in offloaded.items() if lid not in gone}
    have = set(table_files)
    _, keep = table_layout(have, live)
    return TableSync(tuple(sorted(keep - have)), tuple(sorted(have - keep)))


def snapshots_to_expire(snapshots: Iterable[tuple[int, int]], current_id: int | None, now_ms: int,
                        retention_ms: int) -> tuple[int, ...]:
    """Ids of the snapshots (id, timestamp ms) older than ``retention_ms`` at ``now_ms``, never the
    current one (``retention_ms`` < 0: keep every snapshot)."""
    if retention_ms < 0:
        return ()
    return tuple(sorted(sid for sid, ts in snapshots if sid != current_id and now_ms - ts > retention_ms))


def spans_days(min_publish_time_ms: int, max_publish_time_ms: int) -> bool:
    """Whether an object with these publish-time bounds lies on more than one UTC day (it does
    not fit one day(publish_time) partition)."""
    return min_publish_time_ms // DAY_MS != max_publish_time_ms // DAY_MS


def redacted_uri(uri: str) -> str:
    """The catalog URI without its password (``postgresql://u:***@host/db``): what the admin
    endpoint shows (docs/architecture.md#invariant-11: secrets never leave in answers or logs)."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    authority, slash, path = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not at or ":" not in userinfo:
        return uri
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}{slash}{path}"


# -- the catalog (blocking) -----------------------------------------------------------------------
def default_catalog_uri(tier_uri: str) -> str:
    """The embedded catalog: SQLite in ``<tier dir>/_lake/catalog.db`` for a ``file://`` tier.
    ValueError for another tier (give ``lake_catalog_uri``: SQLite needs a local file)."""
    if not tier_uri.startswith("file://"):
        raise ValueError(f"lake: tier {tier_uri} is not file://: set lake_catalog_uri "
                         "(e.g. sqlite:////var/lib/pulsarlite/catalog.db or postgresql+psycopg2://...)")
    return f"sqlite:///{tier_uri[len('file://'):].rstrip('/')}/{LAKE_DIR}/catalog.db"


def catalog_kind(catalog_uri: str) -> str:
    """``rest`` for an Iceberg REST catalog (``http(s)://...``), else ``sql`` (a SQLAlchemy URI)."""
    return "rest" if catalog_uri.startswith(("http://", "https://")) else "sql"


class Lake:
    """The Iceberg catalog of one tier: ``catalog_uri`` is the SQLAlchemy URI of pyiceberg's SQL
    catalog, or the ``http(s)://`` base URI of an Iceberg REST catalog (pyiceberg's RestCatalog;
    the tables are still created at ``<tier>/_lake/...``, their data files are the tier objects);
    warehouse ``<tier>/_lake``. Thread-safe (one lock: the owner's commits of one broker are
    serial; other brokers own other topics, and the catalog's optimistic commit catches any
    overlap)."""

    def __init__(self, tier_uri: str, catalog_uri: str = "", *, s3_endpoint_url: str | None = None,
                 snapshot_retention_ms: int = -1, partition: str = "none",
                 metadata_versions_max: int = METADATA_VERSIONS_MAX) -> None:
        if partition not in PARTITIONS:
            raise ValueError(f"lake partition must be one of {PARTITIONS}, got {partition!r}")
        self.partition = partition
        self.tier_uri = tier_uri.rstrip("/")
        self.catalog_uri = catalog_uri or default_catalog_uri(self.tier_uri)
        self.kind = catalog_kind(self.catalog_uri)
        self.warehouse = f"{self.tier_uri}/{LAKE_DIR}"
        self.snapshot_retention_ms = snapshot_retention_ms
        if metadata_versions_max < 1:
            raise ValueError(f"metadata_versions_max {metadata_versions_max} < 1")
        self.table_properties = table_properties(metadata_versions_max)
        self.properties: dict[str, str] = {}
        if s3_endpoint_url:
            self.properties["s3.endpoint"] = s3_endpoint_url
        self._catalog = None
        self._lock = threading.Lock()
        self._catalog_lock = threading.Lock()   # one opening of the catalog (admin and offloader threads)

    def describe(self) -> dict[str, str]:
        return {"kind": self.kind, "uri": redacted_uri(self.catalog_uri), "warehouse": self.warehouse}

    def catalog(self):
        """The catalog, opened once. Opening a SQL catalog creates its tables if missing, which is
        a check-then-create: two threads of this process are serialised here, and another process
        (a second broker on the same catalog) racing it is answered by opening once more."""
        if self._catalog is None:
            with self._catalog_lock:
                if self._catalog is None:
                    try:
                        self._catalog = self._open_catalog()
                    except Exception as e:    # noqa: BLE001 - sqlalchemy's OperationalError, lazily imported
                        if "already exists" not in str(e):
                            raise
                        self._catalog = self._open_catalog()
        return self._catalog

    def _open_catalog(self):
        if self.kind == "rest":
            # the server decides what a "warehouse" is (a name, a location): not sent; the
            # tables' locations are given at creation (TableId.location)
            from pyiceberg.catalog.rest import RestCatalog
            return RestCatalog(CATALOG_NAME, uri=self.catalog_uri, **self.properties)
        if self.catalog_uri.startswith("sqlite:///"):
            import os
            os.makedirs(os.path.dirname(self.catalog_uri[len("sqlite:///"):]) or ".", exist_ok=True)
        from pyiceberg.catalog.sql import SqlCatalog
        return SqlCatalog(CATALOG_NAME, uri=self.catalog_uri, warehouse=self.warehouse,
                          **self.properties)

    def load(self, tid: TableId):
        """The table, or None if it does not exist."""
        from pyiceberg.exceptions import NoSuchTableError
        try:
            return self.catalog().load_table(tid.identifier)
        except NoSuchTableError:
            return None

    def table_files(self, tid: TableId) -> set[str]:
        table = self.load(tid)
        return set() if table is None else _files(table)

    def metadata_location(self, tid: TableId) -> str | None:
        table = self.load(tid)
        return None if table is None else table.metadata_location

    def sync(self, tid: TableId, offloaded: Mapping[int, str], leaving: Iterable[int] = (), *,
             prefix: str, topic: str = "", now_ms: int | None = None) -> TableSync:
        """Make the table's files under ``prefix`` (the URI prefix of this topic's or partition's
        objects, ``<tier>/<tenant>/<ns>/<topic>/``: partitions share a table) exactly ``offloaded`` minus ``leaving`` (``plan_table_sync``), in one snapshot; creates
        the table with the first file's schema. Returns what was done. LakeError on failure
        (nothing committed). With ``now_ms`` and a ``snapshot_retention_ms`` >= 0, snapshots older
        than that are then expired (their metadata only: data files are the offloader's)."""
        with self._lock:
            try:
                plan = self._sync(tid, dict(offloaded), tuple(leaving), prefix, topic)
                if now_ms is not None and self.snapshot_retention_ms >= 0:
                    self._expire(tid, now_ms)
                return plan
            except LakeError:
                raise
            except Exception as e:    # noqa: BLE001 - pyiceberg, sqlalchemy, pyarrow, OSError
                raise LakeError(f"table {tid.name}: {type(e).__name__}: {e}") from e

    def _sync(self, tid: TableId, offloaded: dict[int, str], leaving: tuple[int, ...], prefix: str,
              topic: str) -> TableSync:
        if not prefix.endswith("/"):
            raise ValueError(f"prefix {prefix!r} must end with '/'")
        started = time.monotonic()
        table = self.load(tid)
        mine = {f for f in _files(table) if f.startswith(prefix)} if table is not None else set()
        plan = plan_table_sync(mine, offloaded, leaving)
        if plan.empty:
            return plan
        if table is None:
            if not plan.add:
                return plan
            table = self._create(tid, plan.add[0])
        import pyarrow.parquet as pq
        if plan.add and any(table.properties.get(k) != v for k, v in self.table_properties.items()):
            # a table created before these properties (metrics, metadata clean-up): set them once (own commit)
            with table.transaction() as tx:
                tx.set_properties(self.table_properties)
            table = self.load(tid)
        if plan.add and self._unpartition_if_spanning(table, tid, plan.add, pq):
            table = self.load(tid)
        with table.transaction() as tx:
            if plan.add:
                with tx.update_schema() as update:
                    for uri in plan.add:
                        update.union_by_name(_arrow_schema(table.io, uri, pq))
            _replace_files(tx, table, plan.remove, plan.add, topic)
        log.info("lake commit table=%s topic=%s added=%d removed=%d seconds=%.3f metadata=%s", tid.name, topic,
                 len(plan.add), len(plan.remove), time.monotonic() - started, table.metadata_location)
        return plan

    def table_state(self, tid: TableId, prefix: str) -> tuple[set[str], bool]:
        """(the table's current files under ``prefix``, whether it is partitioned by day)."""
        table = self.load(tid)
        if table is None:
            return set(), self.partition == "day"
        return ({f for f in _files(table) if f.startswith(prefix)},
                any(f.name == DAY_FIELD for f in table.spec().fields))

    def referenced_files(self, tid: TableId) -> set[str]:
        """The data files of every snapshot the table keeps (the current one and the older ones
        not expired yet): merged objects outside this set can be deleted."""
        table = self.load(tid)
        if table is None or table.current_snapshot() is None:
            return set()
        return set(table.inspect.all_data_files().column("file_path").to_pylist())

    def commit_merge(self, tid: TableId, sources: Iterable[str], merged_uri: str, *, topic: str = "",
                     now_ms: int | None = None) -> None:
        """Replace ``sources`` (files of the table) by ``merged_uri`` (offload/lake_merge.py) in
        one snapshot. LakeError, nothing committed, if a source is no longer in the table or the
        merged file does not fit the table's day partition."""
        sources = tuple(sources)
        with self._lock:
            try:
                import pyarrow.parquet as pq
                started = time.monotonic()
                table = self.load(tid)
                if table is None:
                    raise LakeError(f"table {tid.name}: gone before the merge's commit")
                missing = set(sources) - _files(table)
                if missing:
                    raise LakeError(f"table {tid.name}: merge sources no longer in the table: {sorted(missing)}")
                if any(f.name == DAY_FIELD for f in table.spec().fields):
                    bounds = _publish_time_bounds_ms(table.io, merged_uri, pq)
                    if bounds is None or spans_days(*bounds):
                        raise LakeError(f"table {tid.name}: merged object {merged_uri} does not lie inside one day")
                with table.transaction() as tx:
                    with tx.update_schema() as update:
                        update.union_by_name(_arrow_schema(table.io, merged_uri, pq))
                    _replace_files(tx, table, sources, (merged_uri,), topic)
                log.info("lake merge commit table=%s topic=%s removed=%d added=%s seconds=%.3f", tid.name, topic,
                         len(sources), merged_uri, time.monotonic() - started)
                if now_ms is not None and self.snapshot_retention_ms >= 0:
                    self._expire(tid, now_ms)
            except LakeError:
                raise
            except Exception as e:    # noqa: BLE001 - pyiceberg, sqlalchemy, pyarrow, OSError
                raise LakeError(f"table {tid.name}: {type(e).__name__}: {e}") from e

    def _unpartition_if_spanning(self, table, tid: TableId, uris: Iterable[str], pq) -> bool:
        """If the table is partitioned by day and one of ``uris`` spans days (its footer's
        publish_time statistics), evolve the spec to unpartitioned (own commit) so that the file
        can be added: rows are never left out. True if the spec changed."""
        if not any(f.name == DAY_FIELD for f in table.spec().fields):
            return False
        for uri in uris:
            bounds = _publish_time_bounds_ms(table.io, uri, pq)
            if bounds is None or spans_days(*bounds):
                with table.update_spec() as update:
                    update.remove_field(DAY_FIELD)
                log.warning("lake unpartitioned table=%s object=%s reason=%s", tid.name, uri,
                            "no publish_time statistics" if bounds is None
                            else f"publish_time spans days min_ms={bounds[0]} max_ms={bounds[1]}")
                return True
        return False

    def _expire(self, tid: TableId, now_ms: int) -> None:
        table = self.load(tid)
        if table is None:
            return
        current = table.current_snapshot()
        ids = snapshots_to_expire([(s.snapshot_id, s.timestamp_ms) for s in table.metadata.snapshots],
                                  None if current is None else current.snapshot_id, now_ms,
                                  self.snapshot_retention_ms)
        if ids:
            table.maintenance.expire_snapshots().by_ids(list(ids)).commit()
            log.info("lake snapshots expired table=%s snapshots=%d", tid.name, len(ids))

    def _create(self, tid: TableId, first_uri: str):
        import pyarrow.parquet as pq
        catalog = self.catalog()
        catalog.create_namespace_if_not_exists((tid.tenant, tid.namespace))
        schema = _arrow_schema(catalog._load_file_io(location=self.warehouse), first_uri, pq)
        table = catalog.create_table_if_not_exists(tid.identifier, schema=schema,
                                                   location=tid.location(self.warehouse),
                                                   properties=self.table_properties)
        if self.partition == "day" and table.current_snapshot() is None and not table.spec().fields:
            from pyiceberg.transforms import DayTransform
            with table.update_spec() as update:
                update.add_field("publish_time", DayTransform(), DAY_FIELD)
            table = catalog.load_table(tid.identifier)
        return table

    def drop(self, tid: TableId) -> bool:
        """Drop the table (topic deletion; the data files are the offloader's to delete, the
        metadata files stay under the table location until the tier's prefix is cleaned)."""
        from pyiceberg.exceptions import NoSuchTableError
        with self._lock:
            try:
                self.catalog().drop_table(tid.identifier)
            except NoSuchTableError:
                return False
            log.info("lake table dropped table=%s", tid.name)
            return True

    def info(self, tid: TableId) -> dict[str, Any]:
        """What the admin ``.../lake`` endpoint returns."""
        table = self.load(tid)
        out: dict[str, Any] = {"catalog": redacted_uri(self.catalog_uri), "catalogKind": self.kind, "warehouse": self.warehouse,
                               "table": tid.name, "metadata_location": None, "snapshotId": None, "dataFiles": 0}
        if table is not None:
            snap = table.current_snapshot()
            out.update(metadata_location=table.metadata_location, snapshotId=None if snap is None else snap.snapshot_id,
                       dataFiles=len(_files(table)), location=table.location())
        return out


def _replace_files(tx, table, remove: Iterable[str], add: Iterable[str], topic: str) -> None:
    """In ``tx``: the data files ``remove`` out of the table and the Parquet files ``add`` in,
    in ONE snapshot (an overwrite that deletes and appends; a plain append when nothing is
    removed), so no snapshot holds a row twice or misses one that stays."""
    removing, add = set(remove), list(add)
    props = {"pulsarlite.topic": topic}
    if not removing:
        if add:
            tx.add_files(add, snapshot_properties=props)
        return
    from pyiceberg.table import TableProperties, _parquet_files_to_data_files
    if add and tx.table_metadata.name_mapping() is None:
        tx.set_properties(**{TableProperties.DEFAULT_NAME_MAPPING:
                             tx.table_metadata.schema().name_mapping.model_dump_json()})
    with tx.update_snapshot(snapshot_properties=props).overwrite() as ow:
        for task in table.scan().plan_files():
            if task.file.file_path in removing:
                ow.delete_data_file(task.file)
        if add:
            for data_file in _parquet_files_to_data_files(tx.table_metadata, add, table.io):
                ow.append_data_file(data_file)


def _files(table) -> set[str]:
    if table.current_snapshot() is None:
        return set()
    return {task.file.file_path for task in table.scan().plan_files()}


def _publish_time_bounds_ms(io, uri: str, pq) -> tuple[int, int] | None:
    """(min, max) publish time in ms from the object's footer statistics (None: a row group
    without them)."""
    import datetime as dt
    with io.new_input(uri).open() as stream:
        md = pq.ParquetFile(stream).metadata
    idx = md.schema.to_arrow_schema().get_field_index("publish_time")
    lo = hi = None
    for i in range(md.num_row_groups):
        stats = md.row_group(i).column(idx).statistics
        if stats is None or not stats.has_min_max:
            return None
        a, b = (int(v.timestamp() * 1000) if isinstance(v, dt.datetime) else int(v) for v in (stats.min, stats.max))
        lo = a if lo is None else min(lo, a)
        hi = b if hi is None else max(hi, b)
    return None if lo is None else (lo, hi)


def _arrow_schema(io, uri: str, pq):
    with io.new_input(uri).open() as stream:
        return pq.read_schema(stream)


__all__ = ["DAY_FIELD", "LAKE_DIR", "METADATA_VERSIONS_MAX", "PARTITIONS", "metrics_properties", "table_properties", "spans_days", "Lake", "LakeError", "TableId", "TableSync", "catalog_kind", "default_catalog_uri", "plan_table_sync",
           "redacted_uri", "snapshots_to_expire"]
