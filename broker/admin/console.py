"""The web console's data: pure functions that shape what the broker read from ZooKeeper into
the two read-only JSON documents the console draws (``GET /admin/v2/console/cluster`` and
``GET /admin/v2/persistent/{tenant}/{namespace}/{topic}/segments``), and the static files.

Everything the console computes is here (no I/O, no clock), so it is unit-tested in Python;
the browser code (``broker/admin/console_static/console.js``) only fetches and draws.

Protocol of a segment's ``location`` (where a reader finds the ledger's entries, by the ledger
list of the managed ledger and the ledger's own metadata):

- ``open``: the topic's current ledger, still written (on the bookies of its last fragment);
- ``bookies``: closed, not offloaded (or offloading, or offloaded but still on the bookies: the
  bookie copy is read first) -> ``bookies`` lists the ensemble(s);
- ``offloaded``: offloaded and deleted from the bookies -> only ``offloadUri`` holds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Iterable, Mapping, Sequence

from pulsarlite.metadata_documents import decode_broker_record

STATIC_PACKAGE = "broker.admin.console_static"
# the console's files and their content types: served as they are, nothing else under /console/
STATIC_FILES = {"index.html": "text/html", "console.css": "text/css", "console.js": "application/javascript"}
UNDER_REPLICATED_LISTED_MAX = 100      # ledger ids the cluster page lists (the count is exact)
TOPICS_LISTED_PER_BUNDLE_MAX = 100     # topic names listed under one bundle
SEGMENTS_LISTED_MAX = 500              # a topic's newest segments drawn (each costs a metadata read)
# free disk per bookie: the cluster page reads each live bookie's /metrics (its host:port is in
# its registration node), all at once, each answer cut at this size and this time
BOOKIES_PROBED_MAX = 200               # bookies whose /metrics one page load asks (the rest: unknown)
BOOKIE_METRICS_TIMEOUT_MS = 1_000      # one bookie's whole answer; a slower bookie shows "unknown"
BOOKIE_METRICS_BYTES_MAX = 1024 * 1024  # read of one /metrics answer (a bookie's is a few KiB)
DISK_FREE_GAUGE = "bookie_disk_free_bytes"
DISK_USED_GAUGE = "bookie_disk_used_ratio"


@dataclass(frozen=True)
class BrokerEntry:
    """One live broker: its registration znode under /loadbalance/brokers."""

    broker_id: str
    pulsar_url: str
    http_url: str


def parse_broker(broker_id: str, data: bytes) -> BrokerEntry:
    """A broker registration (a BrokerRecord, pulsarlite/metadata_documents.py); a node that is
    not one still shows, with empty URLs."""
    try:
        record = decode_broker_record(data)
    except ValueError:
        return BrokerEntry(broker_id, "", "")
    return BrokerEntry(broker_id, record.pulsar_url, record.http_url)


@dataclass(frozen=True)
class BookieDisk:
    """A bookie's disk at its last disk check (bookie/metrics.py): the fuller of its journal
    and ledger disks."""

    free_bytes: int
    used_ratio: float


def parse_disk_gauges(text: str) -> BookieDisk | None:
    """The two disk gauges of a bookie's Prometheus text exposition (``bookie_disk_free_bytes``,
    ``bookie_disk_used_ratio``: unlabelled, ``name value [timestamp]``); every other line is
    skipped unparsed. None unless both are there with finite values, free >= 0 and the ratio in
    [0, 1] (before its first disk check a bookie exports 0 for both: shown as such)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("bookie_disk_"):
            continue
        parts = line.split()
        if len(parts) not in (2, 3) or parts[0] not in (DISK_FREE_GAUGE, DISK_USED_GAUGE):
            continue
        try:
            value = float(parts[1])
        except ValueError:
            return None
        if not math.isfinite(value):
            return None
        found[parts[0]] = value
    free, used = found.get(DISK_FREE_GAUGE), found.get(DISK_USED_GAUGE)
    if free is None or used is None or free < 0 or not 0 <= used <= 1:
        return None
    return BookieDisk(int(free), used)


def format_bytes(n: int) -> str:
    """Binary units, three significant figures at most: ``512 B``, ``1.5 KiB``, ``12.3 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    if unit == "B":
        return f"{int(value)} B"
    return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"


def disk_text(disk: BookieDisk | None) -> str:
    """What the cluster page shows in a bookie's disk column: ``12.3 GiB free (81% used)``, or
    ``unknown`` (no metrics port recorded, not answering in time, or no disk gauges)."""
    if disk is None:
        return "unknown"
    return f"{format_bytes(disk.free_bytes)} free ({disk.used_ratio * 100:.0f}% used)"


def topics_by_bundle(topics: Iterable[str], bundle_of: Callable[[str], str]) -> dict[str, list[str]]:
    """Group full topic names by their bundle key (``bundle_of``: the ownership's placement);
    each list sorted and cut at ``TOPICS_LISTED_PER_BUNDLE_MAX``."""
    grouped: dict[str, list[str]] = {}
    for topic in topics:
        grouped.setdefault(bundle_of(topic), []).append(topic)
    return {k: sorted(v)[:TOPICS_LISTED_PER_BUNDLE_MAX] for k, v in grouped.items()}


def cluster_view(brokers: Sequence[BrokerEntry], bundle_owners: Mapping[str, str],
                 topics_of_bundle: Mapping[str, list[str]], writable: Iterable[str], readonly: Iterable[str],
                 under_replicated: Sequence[int],
                 disks: Mapping[str, BookieDisk | None] | None = None) -> dict[str, Any]:
    """The cluster page: ``bundle_owners`` maps a bundle key (``tenant/ns/0x..._0x...``) to its
    owner's broker id; ``topics_of_bundle`` the topics placed in each bundle
    (:func:`topics_by_bundle`); ``under_replicated`` the marked ledger ids, ascending;
    ``disks`` each bookie's disk as its /metrics said (absent or None: unknown). A bundle
    whose owner is not a live broker is listed under ``orphanBundles``; a bookie registered
    both writable and read-only (a mode change in flight) shows as read-only."""
    live = {b.broker_id for b in brokers}
    owned: dict[str, list[str]] = {b.broker_id: [] for b in brokers}
    orphans = []
    for bundle, owner in sorted(bundle_owners.items()):
        (owned[owner] if owner in live else orphans).append(bundle)
    readonly_set = set(readonly)
    disks = disks or {}
    bookies = []
    for b in sorted(set(writable) | readonly_set):
        disk = disks.get(b)
        bookies.append({"id": b, "mode": "readonly" if b in readonly_set else "writable",
                        "diskFreeBytes": None if disk is None else disk.free_bytes,
                        "diskUsedRatio": None if disk is None else disk.used_ratio,
                        "disk": disk_text(disk)})
    return {
        "brokers": [{"id": b.broker_id, "pulsarUrl": b.pulsar_url, "httpUrl": b.http_url,
                     "bundles": [{"bundle": k, "topics": list(topics_of_bundle.get(k, ()))}
                                 for k in owned[b.broker_id]]}
                    for b in sorted(brokers, key=lambda b: b.broker_id)],
        "orphanBundles": orphans,
        "bookies": bookies,
        "underReplicatedLedgers": {"count": len(under_replicated),
                                   "ledgers": list(under_replicated[:UNDER_REPLICATED_LISTED_MAX])},
    }


def segment_location(is_current: bool, offload_state: str) -> str:
    """``open`` | ``bookies`` | ``offloaded`` (see the module docstring)."""
    if is_current:
        return "open"
    if offload_state == "bookie-deleted":
        return "offloaded"
    return "bookies"


def segments_view(ledgers: Sequence[Any], ensembles: Mapping[int, Sequence[tuple[int, Sequence[str]]]],
                  under_replicated: Iterable[int], *, open_current: bool) -> list[dict[str, Any]]:
    """The topic page's segments, oldest first. ``ledgers``: the managed ledger's
    :class:`~broker.managed_ledger.LedgerInfo` list; ``ensembles``: each ledger's fragments
    ``(first entry id, bookie ids)`` from its metadata (missing: the metadata is gone, as after
    an offload deleted the bookie copy); ``open_current``: the last ledger is still written
    (the topic is not terminated/closed with it)."""
    marked = set(under_replicated)
    out = []
    for index, info in enumerate(ledgers):
        state = info.offload.state.value
        is_current = open_current and index == len(ledgers) - 1 and info.state.value == "OPEN"
        location = segment_location(is_current, state)
        fragments = ensembles.get(info.ledger_id)
        out.append({
            "ledgerId": info.ledger_id,
            "entries": info.entries,
            "size": info.size_bytes,
            "minPublishTimeMs": info.min_publish_time_ms,
            "maxPublishTimeMs": info.max_publish_time_ms,
            "createdMs": info.created_ms,
            "location": location,
            "offloadState": state,
            "offloadUri": info.offload.uri,
            "ensembles": None if fragments is None or location == "offloaded"
            else [{"firstEntry": first, "bookies": list(bookies)} for first, bookies in fragments],
            "underReplicated": info.ledger_id in marked,
        })
    return out


def static_file(name: str) -> tuple[bytes, str] | None:
    """(bytes, content type) of a console file, None for any other name (no path is built from
    the request: only the names of ``STATIC_FILES`` are read)."""
    content_type = STATIC_FILES.get(name)
    if content_type is None:
        return None
    return resources.files(STATIC_PACKAGE).joinpath(name).read_bytes(), content_type


__all__ = ["BOOKIES_PROBED_MAX", "BOOKIE_METRICS_BYTES_MAX", "BOOKIE_METRICS_TIMEOUT_MS", "BookieDisk",
           "BrokerEntry", "SEGMENTS_LISTED_MAX", "STATIC_FILES", "TOPICS_LISTED_PER_BUNDLE_MAX",
           "UNDER_REPLICATED_LISTED_MAX",
           "cluster_view", "disk_text", "format_bytes", "parse_disk_gauges", "parse_broker", "segment_location", "segments_view", "static_file", "topics_by_bundle"]
