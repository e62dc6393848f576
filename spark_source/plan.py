"""Scan planning (pure): which entry ranges of which segments a scan reads, where from, and how
the segments are grouped into Spark partitions.

Nothing here does I/O: the shell (:mod:`spark_source.metadata`) reads the managed-ledger lists
and the LACs of open ledgers and hands them in as :class:`PartitionLedgers`.

Positions are message ids ``(ledger_id, entry_id, batch_index)``; ``batch_index`` is -1 for a
whole entry. A scan reads from a start position (inclusive) to an end position (exclusive): the
start ``(L, E, -1)`` includes all of entry E, the end ``(L, E, -1)`` excludes all of it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace

from spark_source.errors import DataLossError

# columns of the DataFrame, in order (Spark DDL); spark_source.scan builds them
OUTPUT_DDL = ("key string, value binary, topic string, partition int, message_id string, ledger_id bigint, "
              "entry_id bigint, batch_index int, publish_time timestamp, event_time timestamp, "
              "properties map<string,string>, producer_name string, sequence_id bigint")

# a position past every entry of a ledger (entry ids are < 2**63)
ENTRY_ID_END = 2**63 - 1


class Location(str, enum.Enum):
    BOOKIES = "bookies"
    TIER = "tier"
    COMPACTED = "compacted"     # a topic's compacted ledger (option readCompacted)


@dataclass(frozen=True, order=True)
class Position:
    ledger_id: int
    entry_id: int
    batch_index: int = -1

    @classmethod
    def parse(cls, text: str) -> "Position":
        """``ledger:entry`` or ``ledger:entry:partition:batch`` (the message id string)."""
        parts = str(text).strip().split(":")
        if len(parts) not in (2, 3, 4):
            raise ValueError(f"bad message id {text!r}: expected ledger:entry[:partition[:batch]]")
        try:
            nums = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"bad message id {text!r}: parts must be integers") from None
        batch = nums[3] if len(parts) == 4 else -1
        if nums[0] < 0 or nums[1] < 0 or batch < -1:
            raise ValueError(f"bad message id {text!r}: negative ledger or entry id")
        return cls(nums[0], nums[1], batch)

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


@dataclass(frozen=True)
class LedgerSegment:
    """One ledger of a managed ledger, as planning needs it."""

    ledger_id: int
    closed: bool
    last_entry_id: int                  # last readable entry: closed -> last entry, open -> LAC
    size_bytes: int                     # 0 when unknown (open ledger)
    min_publish_time_ms: int | None
    max_publish_time_ms: int | None
    offload_state: str = "none"
    offload_uri: str | None = None

    @property
    def entries(self) -> int:
        return self.last_entry_id + 1

    @property
    def location(self) -> Location:
        if self.offload_state in ("offloaded", "bookie-deleted") and self.offload_uri:
            return Location.TIER
        return Location.BOOKIES


@dataclass(frozen=True)
class CompactedSegment:
    """A topic's compacted view (the managed-ledger property ``pulsarlite.compaction``, written
    by broker/compaction/): the compacted ledger, holding ``entries`` original entries up to
    ``horizon`` (the last original position it covers)."""

    ledger_id: int
    horizon: Position
    entries: int


@dataclass(frozen=True)
class PartitionLedgers:
    """The segments of one topic partition (or of a non-partitioned topic, partition -1), and
    its compacted view when it was read (``compacted``: None if never compacted or not asked)."""

    topic: str                          # full name of the partition, e.g. persistent://t/n/x-partition-0
    partition: int
    ledgers: tuple[LedgerSegment, ...]
    compacted: CompactedSegment | None = None


@dataclass(frozen=True)
class SegmentScan:
    """Entries ``first_entry_id..last_entry_id`` of one ledger, and the row filter to apply:
    positions in ``[start, end)`` and publish times in ``[publish_time_min_ms,
    publish_time_max_ms]`` (None: unbounded)."""

    topic: str
    partition: int
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    location: Location
    uri: str | None
    start: Position
    end: Position | None
    publish_time_min_ms: int | None
    publish_time_max_ms: int | None
    size_bytes_estimate: int

    @property
    def entries(self) -> int:
        return self.last_entry_id - self.first_entry_id + 1


@dataclass(frozen=True)
class ScanRequest:
    """What to read of one partition: start (inclusive; None: earliest) and end (exclusive;
    None: up to the last readable entry), publish time bounds (inclusive, ms)."""

    start: Position | None = None
    end: Position | None = None
    publish_time_min_ms: int | None = None
    publish_time_max_ms: int | None = None
    entries_max: int | None = None      # admission control (streaming): at most this many entries


@dataclass
class PlanReport:
    segments_total: int = 0
    segments_planned: int = 0
    pruned_by_time: list[str] = field(default_factory=list)
    pruned_by_position: int = 0
    data_loss: list[str] = field(default_factory=list)


def plan_partition(p: PartitionLedgers, req: ScanRequest, *, fail_on_data_loss: bool,
                   report: PlanReport) -> list[SegmentScan]:
    """The segment scans of one partition for ``req``, in ledger order."""
    ledgers = [lg for lg in p.ledgers if lg.last_entry_id >= 0]
    report.segments_total += len(ledgers)
    start = req.start
    if start is not None and p.ledgers and start.ledger_id < p.ledgers[0].ledger_id:
        msg = (f"topic {p.topic}: start position {start} is before the first stored ledger "
               f"{p.ledgers[0].ledger_id} (deleted by retention?)")
        if fail_on_data_loss:
            raise DataLossError(msg + "; set failOnDataLoss=false to read from the earliest")
        report.data_loss.append(msg)
        start = None
    out: list[SegmentScan] = []
    budget = req.entries_max
    tmin, tmax = req.publish_time_min_ms, req.publish_time_max_ms
    for lg in ledgers:
        if budget is not None and budget <= 0:
            break
        first, last = 0, lg.last_entry_id
        if start is not None:
            if lg.ledger_id < start.ledger_id:
                report.pruned_by_position += 1
                continue
            if lg.ledger_id == start.ledger_id:
                first = start.entry_id
        if req.end is not None:
            if lg.ledger_id > req.end.ledger_id:
                report.pruned_by_position += 1
                continue
            if lg.ledger_id == req.end.ledger_id:
                # the end entry itself is read only if the end is inside it (batch index >= 0)
                last = min(last, req.end.entry_id if req.end.batch_index >= 0 else req.end.entry_id - 1)
        if first > last:
            report.pruned_by_position += 1
            continue
        if not _overlaps(lg, tmin, tmax):
            report.pruned_by_time.append(f"{p.topic}:{lg.ledger_id}")
            continue
        if budget is not None:
            last = min(last, first + budget - 1)
            budget -= last - first + 1
        fraction = (last - first + 1) / max(1, lg.entries)
        out.append(SegmentScan(
            topic=p.topic, partition=p.partition, ledger_id=lg.ledger_id,
            first_entry_id=first, last_entry_id=last, location=lg.location,
            uri=lg.offload_uri if lg.location is Location.TIER else None,
            start=start if start is not None and start.ledger_id == lg.ledger_id else Position(lg.ledger_id, 0),
            end=req.end if req.end is not None and req.end.ledger_id == lg.ledger_id else None,
            publish_time_min_ms=tmin, publish_time_max_ms=tmax,
            size_bytes_estimate=max(1, math.ceil(lg.size_bytes * fraction)) if lg.size_bytes else 0))
    report.segments_planned += len(out)
    return out


def plan_partition_compacted(p: PartitionLedgers, req: ScanRequest, *, fail_on_data_loss: bool,
                             report: PlanReport) -> list[SegmentScan]:
    """The scans of one partition's compacted view (as a reader with ``read_compacted`` sees
    it): one scan of the compacted ledger (its rows keep their original ids; the reader filters
    them by the position range ``[start, end)``, the publish-time bounds and each entry's ack
    set), then the topic's segments strictly after the horizon. Never compacted: the whole
    topic, as :func:`plan_partition`."""
    view = p.compacted
    if view is None:
        return plan_partition(p, req, fail_on_data_loss=fail_on_data_loss, report=report)
    out: list[SegmentScan] = []
    after_horizon = Position(view.horizon.ledger_id, view.horizon.entry_id + 1)
    in_view = view.entries > 0 and (req.start is None or Position(req.start.ledger_id, req.start.entry_id)
                                     <= view.horizon)
    report.segments_total += 1
    if in_view:
        out.append(SegmentScan(
            topic=p.topic, partition=p.partition, ledger_id=view.ledger_id,
            first_entry_id=0, last_entry_id=view.entries - 1, location=Location.COMPACTED, uri=None,
            start=req.start if req.start is not None else Position(0, 0), end=req.end,
            publish_time_min_ms=req.publish_time_min_ms, publish_time_max_ms=req.publish_time_max_ms,
            size_bytes_estimate=0))
        report.segments_planned += 1
    else:
        report.pruned_by_position += 1
    start = after_horizon if req.start is None or req.start < after_horizon else req.start
    if start == after_horizon and p.ledgers and start.ledger_id < p.ledgers[0].ledger_id:
        start = None        # the horizon's ledger was trimmed (retention): every stored ledger is after it
    if req.end is not None and start is not None and req.end <= start:
        return out
    return out + plan_partition(p, replace(req, start=start),
                                fail_on_data_loss=fail_on_data_loss, report=report)


def _overlaps(lg: LedgerSegment, tmin: int | None, tmax: int | None) -> bool:
    """False only when the ledger's known publish time range misses [tmin, tmax]."""
    if tmin is not None and lg.max_publish_time_ms is not None and lg.max_publish_time_ms < tmin:
        return False
    if tmax is not None and lg.min_publish_time_ms is not None and lg.min_publish_time_ms > tmax:
        return False
    return True


def pack(scans: list[SegmentScan], *, target_bytes: int, open_size_bytes: int,
         min_partitions: int = 1, open_cost_bytes: int = 4 * 1024 * 1024) -> list[tuple[SegmentScan, ...]]:
    """Group scans into Spark partitions: one per segment, except that consecutive small ones
    share a partition while their estimated bytes stay within the target. A segment of unknown
    size (open ledger) counts as ``open_size_bytes``. As Spark's file sources do, the target
    shrinks to ``total / min_partitions`` (not below ``open_cost_bytes``) so that a small scan
    still spreads over ``min_partitions`` tasks when it has that many segments. With a target
    shrunk so, a segment joins the group it overshoots less than leaving it short would
    undershoot: 5 equal segments and a small one make 2 groups of 3, not 3 groups of 2 (one
    task less, the cores busy to the end)."""
    if target_bytes <= 0 or min_partitions <= 0:
        raise ValueError("target_bytes and min_partitions must be > 0")
    total = sum(s.size_bytes_estimate or open_size_bytes for s in scans)
    shrunk = max(open_cost_bytes, math.ceil(total / min_partitions))
    balance = shrunk < target_bytes
    limit_bytes = target_bytes          # what a group never grows past by joining (balance or not)
    target_bytes = min(target_bytes, shrunk)
    groups: list[tuple[SegmentScan, ...]] = []
    current: list[SegmentScan] = []
    current_bytes = 0
    for s in scans:
        size = s.size_bytes_estimate or open_size_bytes
        over = current_bytes + size - target_bytes
        if current and over > 0 and (not balance or over > target_bytes - current_bytes
                                     or current_bytes + size > limit_bytes):
            groups.append(tuple(current))
            current, current_bytes = [], 0
        current.append(s)
        current_bytes += size
    if current:
        groups.append(tuple(current))
    return groups


def next_position(scans: list[SegmentScan], fallback: Position | None) -> Position | None:
    """Where a stream continues after reading ``scans`` (the entry after the last one read)."""
    if not scans:
        return fallback
    last = scans[-1]
    return Position(last.ledger_id, last.last_entry_id + 1)


__all__ = ["CompactedSegment", "DataLossError", "ENTRY_ID_END", "LedgerSegment", "Location", "PartitionLedgers", "PlanReport",
           "Position", "ScanRequest", "SegmentScan", "narrow_time", "next_position", "pack", "plan_partition", "plan_partition_compacted",
           "scan_from_dict", "scan_to_dict"]


# -- a plan handed from the driver to the Python source (spark_source/hybrid.py) ------------------
def scan_to_dict(s: SegmentScan) -> dict:
    """A SegmentScan as JSON-able data (the inverse of :func:`scan_from_dict`)."""
    def pos(p: Position | None):
        return None if p is None else [p.ledger_id, p.entry_id, p.batch_index]
    return {"topic": s.topic, "partition": s.partition, "ledger_id": s.ledger_id,
            "first_entry_id": s.first_entry_id, "last_entry_id": s.last_entry_id,
            "location": s.location.value, "uri": s.uri, "start": pos(s.start), "end": pos(s.end),
            "publish_time_min_ms": s.publish_time_min_ms, "publish_time_max_ms": s.publish_time_max_ms,
            "size_bytes_estimate": s.size_bytes_estimate}


def scan_from_dict(d: dict) -> SegmentScan:
    """ValueError for anything that is not a scan :func:`scan_to_dict` made."""
    def pos(v) -> Position | None:
        if v is None:
            return None
        if not isinstance(v, list) or len(v) != 3:
            raise ValueError(f"bad position {v!r}")
        return Position(int(v[0]), int(v[1]), int(v[2]))

    def opt_int(v) -> int | None:
        return None if v is None else int(v)
    try:
        start = pos(d["start"])
        if start is None:
            raise ValueError("a scan needs a start position")
        return SegmentScan(
            topic=str(d["topic"]), partition=int(d["partition"]), ledger_id=int(d["ledger_id"]),
            first_entry_id=int(d["first_entry_id"]), last_entry_id=int(d["last_entry_id"]),
            location=Location(d["location"]), uri=None if d["uri"] is None else str(d["uri"]),
            start=start, end=pos(d["end"]), publish_time_min_ms=opt_int(d["publish_time_min_ms"]),
            publish_time_max_ms=opt_int(d["publish_time_max_ms"]),
            size_bytes_estimate=int(d["size_bytes_estimate"]))
    except (KeyError, TypeError) as e:
        raise ValueError(f"bad planned segment {d!r}: {e}") from None


def narrow_time(s: SegmentScan, tmin: int | None, tmax: int | None) -> SegmentScan:
    """``s`` with its publish-time bounds tightened to [tmin, tmax] (None: no new bound)."""
    lo, hi = s.publish_time_min_ms, s.publish_time_max_ms
    if tmin is not None:
        lo = tmin if lo is None else max(lo, tmin)
    if tmax is not None:
        hi = tmax if hi is None else min(hi, tmax)
    return replace(s, publish_time_min_ms=lo, publish_time_max_ms=hi)
