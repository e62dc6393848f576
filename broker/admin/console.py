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

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any, Callable, Iterable, Mapping, Sequence

STATIC_PACKAGE = "broker.admin.console_static"
# the console's files and their content types: served as they are, nothing else under /console/
STATIC_FILES = {"index.html": "text/html", "console.css": "text/css", "console.js": "application/javascript"}
UNDER_REPLICATED_LISTED_MAX = 100      # ledger ids the cluster page lists (the count is exact)
TOPICS_LISTED_PER_BUNDLE_MAX = 100     # topic names listed under one bundle
SEGMENTS_LISTED_MAX = 500              # a topic's newest segments drawn (each costs a metadata read)


@dataclass(frozen=True)
class BrokerEntry:
    """One live broker: its registration znode under /loadbalance/brokers."""

    broker_id: str
    pulsar_url: str
    http_url: str


def parse_broker(broker_id: str, data: bytes) -> BrokerEntry:
    """A broker registration's JSON (``{"broker_id", "pulsar_url", "http_url", ...}``); a node
    that is not such JSON still shows, with empty URLs."""
    try:
        got = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        got = {}
    if not isinstance(got, dict):
        got = {}
    return BrokerEntry(broker_id, str(got.get("pulsar_url") or ""), str(got.get("http_url") or ""))


def topics_by_bundle(topics: Iterable[str], bundle_of: Callable[[str], str]) -> dict[str, list[str]]:
    """Group full topic names by their bundle key (``bundle_of``: the ownership's placement);
    each list sorted and cut at ``TOPICS_LISTED_PER_BUNDLE_MAX``."""
    grouped: dict[str, list[str]] = {}
    for topic in topics:
        grouped.setdefault(bundle_of(topic), []).append(topic)
    return {k: sorted(v)[:TOPICS_LISTED_PER_BUNDLE_MAX] for k, v in grouped.items()}


def cluster_view(brokers: Sequence[BrokerEntry], bundle_owners: Mapping[str, str],
                 topics_of_bundle: Mapping[str, list[str]], writable: Iterable[str], readonly: Iterable[str],
                 under_replicated: Sequence[int]) -> dict[str, Any]:
    """The cluster page: ``bundle_owners`` maps a bundle key (``tenant/ns/0x..._0x...``) to its
    owner's broker id; ``topics_of_bundle`` the topics placed in each bundle
    (:func:`topics_by_bundle`); ``under_replicated`` the marked ledger ids, ascending. A bundle
    whose owner is not a live broker is listed under ``orphanBundles``; a bookie registered
    both writable and read-only (a mode change in flight) shows as read-only."""
    live = {b.broker_id for b in brokers}
    owned: dict[str, list[str]] = {b.broker_id: [] for b in brokers}
    orphans = []
    for bundle, owner in sorted(bundle_owners.items()):
        (owned[owner] if owner in live else orphans).append(bundle)
    readonly_set = set(readonly)
    bookies = [{"id": b, "mode": "readonly" if b in readonly_set else "writable"}
               for b in sorted(set(writable) | readonly_set)]
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


__all__ = ["BrokerEntry", "SEGMENTS_LISTED_MAX", "STATIC_FILES", "TOPICS_LISTED_PER_BUNDLE_MAX",
           "UNDER_REPLICATED_LISTED_MAX",
           "cluster_view", "parse_broker", "segment_location", "segments_view", "static_file", "topics_by_bundle"]
