"""Reading what a scan needs from ZooKeeper (shell): which topics and partitions, the ledger
list of each partition (``managed_ledger_path``, offload state included) and the LAC of each
open ledger (read from its bookies without fencing).

Paths come from pulsarlite/metadata_layout.py and the ledger list is decoded by the one codec
the broker writes it with (pulsarlite/ledger_list.py): the Spark source sits beside the broker,
not above it, and both stand on the base.
"""

from __future__ import annotations

import json
import logging
import re

from typing import TYPE_CHECKING, Mapping

from pulsarlite.errors import MetadataNotFoundError, NoSuchLedgerError, PulsarliteError
from pulsarlite.ledger_list import LedgerInfoState, ManagedLedgerMetadata, decode_compaction
from pulsarlite.ledger_list import decode as decode_ledger_list
from pulsarlite.metadata_documents import decode_partitioned_metadata
from pulsarlite.metadata_layout import (MANAGED_LEDGERS_ROOT, PARTITIONED_TOPICS_ROOT, managed_ledger_path,
                                        partitioned_topic_path)
from pulsarlite.topic_name import TopicName
from spark_source.errors import TopicNotFound
from spark_source.plan import CompactedSegment, LedgerSegment, PartitionLedgers, Position

if TYPE_CHECKING:      # imported lazily at run time: planning over closed segments needs neither
    from bookie.client.ledger_client import LedgerClient
    from pulsarlite.metadata import MetadataStore

log = logging.getLogger("pulsarlite.spark")

def parse_ledger_list(topic: str, data: bytes) -> ManagedLedgerMetadata:
    """The list of a managed-ledger znode (pulsarlite.ledger_list.decode); ValueError naming the
    topic if malformed."""
    try:
        return decode_ledger_list(data)
    except ValueError as e:
        raise ValueError(f"topic {topic}: {e}") from None


def parse_compacted_view(topic: str, properties: Mapping[str, str]) -> CompactedSegment | None:
    """The compacted view recorded in a ledger list's ``properties`` (decoded by the broker's
    codec, pulsarlite.ledger_list.decode_compaction); None if the topic was never compacted;
    ValueError naming the topic if malformed."""
    try:
        record = decode_compaction(properties)
    except ValueError as e:
        raise ValueError(f"topic {topic}: {e}") from None
    if record is None:
        return None
    return CompactedSegment(record.ledger_id, Position(record.horizon_ledger_id, record.horizon_entry_id),
                            record.entries)


async def partition_count(store: MetadataStore, topic: TopicName) -> int:
    got = await store.get_or_none(partitioned_topic_path(topic.managed_ledger_name))
    if got is None:
        return 0
    try:
        return decode_partitioned_metadata(got[0]).partitions
    except ValueError as e:
        raise ValueError(f"topic {topic}: {e}") from None


async def expand_topics(store: MetadataStore, *, topics: list[str], pattern: str | None) -> list[tuple[str, int]]:
    """(full partition topic name, partition index or -1) for every topic or partition named by
    ``topics`` or matching ``pattern`` (a regex over full names, whose namespace is taken from its
    ``persistent://tenant/ns/`` prefix)."""
    names = [TopicName.parse(t) for t in topics]
    if pattern:
        m = re.match(r"^(?:persistent://)?([^/]+)/([^/]+)/", pattern)
        if not m:
            raise ValueError(f"topicsPattern {pattern!r} must start with persistent://<tenant>/<namespace>/")
        tenant, ns = m.group(1), m.group(2)
        regex = re.compile(pattern if pattern.startswith("persistent://") else "persistent://" + pattern)
        found: set[str] = set()
        for root in (MANAGED_LEDGERS_ROOT, PARTITIONED_TOPICS_ROOT):
            try:
                children = await store.children(f"{root}/{tenant}/{ns}/persistent")
            except PulsarliteError:
                children = []
            for child in children:
                t = TopicName.parse(f"persistent://{tenant}/{ns}/{_decode(child)}")
                parent = t.partitioned_parent
                if regex.fullmatch(str(parent)) or regex.fullmatch(str(t)):
                    found.add(str(parent) if t.is_partition else str(t))
        names.extend(TopicName.parse(n) for n in sorted(found))
    out: list[tuple[str, int]] = []
    seen: set[str] = set()
    for t in names:
        n = await partition_count(store, t) if not t.is_partition else 0
        members = [(t.partition(i), i) for i in range(n)] if n > 0 else [(t, t.partition_index)]
        for member, index in members:
            if str(member) not in seen:
                seen.add(str(member))
                out.append((str(member), index))
    return out


def _decode(child: str) -> str:
    from urllib.parse import unquote_plus
    return unquote_plus(child)


async def read_partition(store: MetadataStore, client: LedgerClient | None, topic: str, partition: int,
                         *, must_exist: bool, admin_url: str | None = None,
                         read_compacted: bool = False, admin_token: str = "") -> PartitionLedgers:
    """The segments of one partition. An open ledger ends at the owner broker's last confirmed
    entry when ``admin_url`` is given and the broker answers for that ledger (the writer's LAC:
    the bookies learn an entry's confirmation only from the next entry, so theirs is never
    ahead; the call carries ``admin_token`` when one is given); it holds nothing confirmed when
    the broker names an earlier ledger (the writer's LAC is past none of its entries); else it
    ends at the LAC read from its bookies (without fencing). With ``read_compacted``, the compacted view comes from the same
    znode read as the list (one consistent version)."""
    t = TopicName.parse(topic)
    got = await store.get_or_none(managed_ledger_path(t.managed_ledger_name))
    if got is None:
        if must_exist:
            raise TopicNotFound(f"topic {topic}: no managed ledger in ZooKeeper (never written?)")
        return PartitionLedgers(topic, partition, ())
    segments = []
    ledger_list = parse_ledger_list(topic, got[0])
    for info in ledger_list.ledgers:
        ledger_id = info.ledger_id
        closed = info.state is LedgerInfoState.CLOSED
        last = info.entries - 1
        if not closed:
            confirmed = await _broker_last_confirmed(admin_url, topic, admin_token) if admin_url else None
            if confirmed is not None and confirmed[0] == ledger_id:
                # the writer's LAC, never behind the bookies': no bookie read (nor ledger client) needed
                last = max(last, confirmed[1])
            elif confirmed is not None and 0 <= confirmed[0] < ledger_id:
                pass     # the topic's last entry is in an earlier ledger: none of this one confirmed
            else:
                last = await _open_ledger_lac(client, topic, ledger_id, last)
        segments.append(LedgerSegment(
            ledger_id=ledger_id, closed=closed, last_entry_id=last, size_bytes=info.size_bytes,
            min_publish_time_ms=info.min_publish_time_ms if closed else None,
            max_publish_time_ms=info.max_publish_time_ms if closed else None,
            offload_state=info.offload.state.value, offload_uri=info.offload.uri))
    view = parse_compacted_view(topic, ledger_list.properties) if read_compacted else None
    return PartitionLedgers(topic, partition, tuple(segments), view)


async def _open_ledger_lac(client: LedgerClient | None, topic: str, ledger_id: int, known_last: int) -> int:
    """The last readable entry of an open ledger: its LAC read without fencing (never less than
    what the managed-ledger list already counts as confirmed)."""
    if client is None:
        return known_last
    try:
        reader = await client.open_ledger(ledger_id, recovery=False)
    except (NoSuchLedgerError, MetadataNotFoundError):
        log.info("open ledger has no metadata yet topic=%s ledger=%d", topic, ledger_id)
        return known_last
    return max(known_last, reader.last_readable_entry_id)


async def _broker_last_confirmed(admin_url: str, topic: str, admin_token: str = "") -> tuple[int, int] | None:
    """(ledger id, entry id) of the topic's last confirmed entry from the admin API (with
    ``Authorization: Bearer admin_token`` when a token is given); None if the broker cannot say
    (logged: the scan then stops at the bookies' LAC)."""
    import asyncio
    import urllib.error
    import urllib.request

    t = TopicName.parse(topic)
    url = (f"{admin_url.rstrip('/')}/admin/v2/persistent/{t.tenant}/{t.namespace_local_name}/"
           f"{t.encoded_local_name}/lastMessageId")

    headers = {"Accept": "application/json", **({"Authorization": f"Bearer {admin_token}"} if admin_token else {})}

    def fetch():
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
            return json.loads(r.read())
    try:
        got = await asyncio.to_thread(fetch)
        return int(got["ledgerId"]), int(got["entryId"])
    except (OSError, urllib.error.URLError, ValueError, KeyError, TypeError) as e:
        log.warning("last confirmed entry unknown topic=%s admin=%s: %s (reading up to the bookies' LAC)",
                    topic, admin_url, e)
        return None


__all__ = ["TopicNotFound", "parse_compacted_view", "expand_topics", "parse_ledger_list", "partition_count", "read_partition"]
