"""The broker's side of the admin HTTP API: :class:`BrokerAdminBackend` implements
:class:`broker.admin.api.AdminBackend` on top of :class:`broker.service.BrokerService`.

Where things come from:

- topics are managed ledgers (``/managed-ledgers/<tenant>/<ns>/persistent/<topic>``); an admin
  "create topic" writes an empty ledger list, so the topic exists before any broker loads it;
- partitioned topics are ``/admin/partitioned-topics/<tenant>/<ns>/persistent/<topic>`` with
  a PartitionedTopicMetadata (pulsarlite/metadata_documents.py) (read by :meth:`BrokerService.partitions`, the one reader); their
  partitions are created as topics at once;
- stats of a loaded topic are live (counters, rates over the last stats interval, producers,
  consumers); for a topic not loaded here they come from the stored ledger list and cursors;
- operations that change a topic's state (subscriptions, reset, delete) load it on this broker
  first (which needs ownership of its bundle: otherwise 503, retriable);
- every topic operation checks that its namespace exists (and is not being deleted).

Unload (graceful): loads of the topic are held, its bundle is released if no other topic of
the bundle is loaded here, adds in flight are confirmed (receipts sent), then producers and
consumers are told to reconnect, cursors are flushed and the managed ledger is closed. The
clients look the topic up again and find its (possibly new) owner; nothing acknowledged is lost.
"""

from __future__ import annotations

import inspect
import json
import logging
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from broker.compaction import CompactionRunningError, CompactionStatus, StatusReport, combined_status
from broker.errors import ServiceNotReadyError
from broker.admin.api import (ConsumerStats, CursorStats, InternalStats, LedgerInfoStats, LookupData,
                              MessageIdData, PublisherStats, SubscriptionPosition, SubscriptionStats, TopicStats,
                              lookup_data)
from broker.admin.policies import (BadRequestError, ConflictError, MethodNotAllowedError, NotFoundError,
                                   PreconditionFailedError)
from broker.cursor import CursorState, ManagedCursor, list_cursors, stored_cursors
from broker.managed_ledger import LedgerInfo, ManagedLedgerMetadata, ManagedLedgerStore, OffloadState, Position
from broker.offloader import TopicOffloadPolicies, read_topic_offload_policies
from broker.ownership.topics import check_listener_name, listener_urls
from broker.service import BrokerService, TopicNotFoundError
from broker.termination import delete_terminated
from broker.topic import skip_messages
from pulsarlite.errors import MetadataNotFoundError, PulsarliteError
from pulsarlite.ledger_list import encode as encode_ledger_list
from pulsarlite.metadata import MetadataExistsError
from pulsarlite.metadata_documents import (PartitionedTopicMetadata, bookie_registration_metrics_address,
                                          decode_broker_record, decode_partitioned_metadata,
                                          encode_partitioned_metadata)
from pulsarlite.metadata_layout import (BROKERS_ROOT, MANAGED_LEDGERS_ROOT, NAMESPACE_ROOT, broker_path,
                                       bundle_path, cursor_path, partitioned_topic_path,
                                       partitioned_topics_of_namespace_path, topic_policies_path)
from pulsarlite.topic_name import InvalidTopicNameError, TopicName
from pulsarlite.wire.entry import peek_metadata

log = logging.getLogger("pulsarlite.broker.admin")

RESET_SCAN_ENTRIES = 100        # entries read per request while looking for a publish time
PEEK_READ_ENTRIES = 100         # entries read per request while peeking past acknowledged ones

_ML_STATES = {"OPENING": "None", "READY": "LedgerOpened", "ROLLING_OVER": "CreatingLedger",
              "CLOSING": "Closing", "CLOSED": "Closed", "FENCED": "Fenced", "FAILED": "Failed",
              "DELETED": "Deleted"}


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")


def _last_position(ledgers: tuple[LedgerInfo, ...] | list[LedgerInfo]) -> Position:
    for info in reversed(ledgers):
        if info.entries > 0:
            return Position(info.ledger_id, info.entries - 1)
    return Position(ledgers[-1].ledger_id, -1) if ledgers else Position(-1, -1)


def _acked_ranges(cursor: ManagedCursor | CursorState) -> str:
    ranges = cursor.individually_acked
    if not ranges:
        return "[]"
    return "[" + ", ".join(f"({lid}:{a - 1}..{lid}:{b}]" for lid, a, b in ranges) + "]"


def _owner_id(data: bytes) -> str:
    """The broker id of a bundle ownership znode (a BrokerRecord; "" if unreadable)."""
    try:
        return decode_broker_record(data).broker_id
    except ValueError:
        return ""


class BrokerAdminBackend:
    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self.policies = service.policies
        self.metrics = service.metrics
        self.schemas = service.schemas
        self.store = service.store
        self.ml_store = ManagedLedgerStore(service.store)

    # -- helpers ---------------------------------------------------------------------------------
    @staticmethod
    def _name(topic: str) -> TopicName:
        try:
            return TopicName.parse(topic)
        except InvalidTopicNameError as e:
            raise BadRequestError(str(e)) from None

    async def _check_namespace(self, name: TopicName | str) -> None:
        namespace = name if isinstance(name, str) else name.namespace
        await self.policies.get_namespace_policies(namespace)     # NotFoundError

    async def _ledger_list(self, name: TopicName) -> ManagedLedgerMetadata | None:
        got = await self.ml_store.read(name.managed_ledger_name)
        return None if got is None else got[0]

    async def _exists(self, name: TopicName) -> bool:
        if self.service.loaded_topic(str(name)) is not None:
            return True
        return await self.store.exists(f"{MANAGED_LEDGERS_ROOT}/{name.managed_ledger_name}")

    async def _require_topic(self, name: TopicName) -> None:
        await self._check_namespace(name)
        if not await self._exists(name):
            raise NotFoundError(f"Topic {name} not found")

    async def _load(self, name: TopicName):
        """The topic, loaded here (404 if it does not exist; 503 if another broker owns it)."""
        try:
            return await self.service.get_topic(str(name), create=False)
        except TopicNotFoundError as e:
            raise NotFoundError(str(e)) from None

    def _partitions_path(self, name: TopicName) -> str:
        return partitioned_topic_path(name.managed_ledger_name)

    async def _create_ledger_list(self, name: TopicName) -> bool:
        """Create the (empty) managed ledger of a topic; False if it exists."""
        try:
            await self.ml_store.create(name.managed_ledger_name, encode_ledger_list(ManagedLedgerMetadata()))
        except MetadataExistsError:
            return False
        return True

    # -- topics ----------------------------------------------------------------------------------
    async def list_topics(self, namespace: str, mode: str = "PERSISTENT") -> list[str]:
        """``mode``: PERSISTENT, NON_PERSISTENT or ALL (Pulsar's getTopics modes)."""
        await self._check_namespace(namespace)
        return sorted(await self.service.topics_of_namespace(namespace, mode))

    async def list_partitioned_topics(self, namespace: str) -> list[str]:
        await self._check_namespace(namespace)
        from urllib.parse import unquote_plus
        names = await self.store.children(partitioned_topics_of_namespace_path(namespace))
        return sorted(f"persistent://{namespace}/{unquote_plus(n)}" for n in names)

    async def create_topic(self, topic: str) -> None:
        name = self._name(topic)
        await self._check_namespace(name)
        if not name.is_partition and await self.service.partitions(str(name)) > 0:
            raise ConflictError(f"Topic {name} already exists as a partitioned topic")
        if not await self._create_ledger_list(name):
            raise ConflictError(f"Topic {name} already exists")

    async def delete_topic(self, topic: str, force: bool) -> None:
        name = self._name(topic)
        await self._require_topic(name)
        key = str(name)
        loaded = self.service.loaded_topic(key)
        if loaded is not None and loaded.client_count() and not force:
            raise PreconditionFailedError(f"Topic {name} has active producers/subscriptions")
        if loaded is None:
            loaded = await self._load(name)          # own it (fences any other writer) to delete it
            if loaded.client_count() and not force:
                raise PreconditionFailedError(f"Topic {name} has active producers/subscriptions")
        await self.service.unload_topic(key, delete=True)
        await delete_terminated(self.store, name.managed_ledger_name)   # a new topic of the name starts afresh

    async def terminate(self, topic: str) -> MessageIdData:
        name = self._name(topic)
        await self._check_namespace(name)
        if not name.is_partition and await self.service.partitions(str(name)) > 0:
            raise MethodNotAllowedError("Termination of a partitioned topic is not allowed")
        await self._require_topic(name)
        position = await (await self._load(name)).terminate()
        return {"ledgerId": position.ledger_id, "entryId": position.entry_id,
                "partitionIndex": name.partition_index}

    async def terminate_partitioned(self, topic: str) -> dict[str, MessageIdData]:
        name = self._name(topic)
        await self._check_namespace(name)
        if await self.service.partitions(str(name)) <= 0:
            raise NotFoundError(f"Partitioned topic {name} does not exist")
        return await self._each_partition(name, "/terminate", self.terminate)

    async def create_partitioned_topic(self, topic: str, partitions: int,
                                       properties: dict[str, str] | None = None) -> None:
        name = self._name(topic)
        await self._check_namespace(name)
        if await self._exists(name):
            raise ConflictError(f"Topic {name} already exists as a non-partitioned topic")
        metadata = PartitionedTopicMetadata(partitions, properties or {})
        try:
            await self.store.create(self._partitions_path(name), encode_partitioned_metadata(metadata))
        except MetadataExistsError:
            raise ConflictError(f"Partitioned topic {name} already exists") from None
        if name.is_persistent:           # a non-persistent partition is created on first use
            for i in range(partitions):
                await self._create_ledger_list(name.partition(i))

    async def update_partitioned_topic(self, topic: str, partitions: int) -> None:
        name = self._name(topic)
        await self._check_namespace(name)
        path = self._partitions_path(name)
        before: list[int] = []

        def grow(current: bytes | None) -> bytes:
            if current is None:
                raise NotFoundError(f"Partitioned topic {name} does not exist")
            try:
                metadata = decode_partitioned_metadata(current)
            except ValueError:
                metadata = PartitionedTopicMetadata(0)
            now = metadata.partitions
            if partitions <= now:
                raise PreconditionFailedError(
                    f"Number of partitions can only grow: {name} has {now}, asked {partitions}")
            before.append(now)
            return encode_partitioned_metadata(replace(metadata, partitions=partitions))   # properties kept

        await self.store.update(path, grow)
        for i in range(before[-1] if before else 0, partitions):
            await self._create_ledger_list(name.partition(i))

    async def delete_partitioned_topic(self, topic: str, force: bool) -> None:
        name = self._name(topic)
        await self._check_namespace(name)
        n = await self.service.partitions(str(name))
        if n <= 0:
            raise NotFoundError(f"Partitioned topic {name} does not exist")
        if not force:        # every partition is checked, here and on other brokers, before any goes
            for i in range(n):
                part = name.partition(i)
                loaded = self.service.loaded_topic(str(part))
                if loaded is not None and loaded.client_count():
                    raise PreconditionFailedError(f"Partitioned topic {name} has active producers/subscriptions")
                if loaded is None and await self._exists(part):
                    url = await self.admin_redirect_url(str(part))
                    if url is not None:
                        stats = await self._call_owner(url, "GET", part, "/stats") or {}
                        if stats.get("publishers") or any(sub.get("consumers")
                                                          for sub in stats.get("subscriptions", {}).values()):
                            raise PreconditionFailedError(
                                f"Partitioned topic {name} has active producers/subscriptions")
        for i in range(n):
            part = name.partition(i)
            if await self._exists(part):
                url = await self.admin_redirect_url(str(part))
                if url is None:
                    await self.delete_topic(str(part), force)
                else:        # served by another broker: it deletes it
                    await self._call_owner(url, "DELETE", part, "", {"force": "true" if force else "false"})
        try:
            await self.store.delete(self._partitions_path(name))
        except MetadataNotFoundError:
            pass

    async def partitioned_metadata(self, topic: str) -> int:
        return await self.service.partitions(str(self._name(topic)))

    async def partitioned_topic_properties(self, topic: str) -> dict[str, str] | None:
        got = await self.store.get_or_none(self._partitions_path(self._name(topic)))
        if got is None:
            return None
        try:
            properties = decode_partitioned_metadata(got[0]).properties
        except ValueError:
            return None
        return dict(properties) or None

    # -- stats -----------------------------------------------------------------------------------
    async def topic_stats(self, topic: str) -> TopicStats:
        name = self._name(topic)
        await self._require_topic(name)
        service = self.service
        key = str(name)
        live = service.loaded_topic(key)
        if live is not None:
            ledgers = live.ml.ledgers()
            last = live.ml.last_confirmed_position
        else:
            md = await self._ledger_list(name)
            ledgers = md.ledgers if md is not None else ()
            last = _last_position(ledgers)
        entries = sum(i.entries for i in ledgers)
        storage = sum(i.size_bytes for i in ledgers)
        avg = storage / entries if entries else 0
        subscriptions: dict[str, SubscriptionStats] = {}
        if live is not None:
            for sub in live.subscriptions.values():
                rate, throughput = service.rate(("s", key, sub.name))
                consumers: list[ConsumerStats] = []
                for handle in sub.consumers.values():
                    consumers.append({
                        "consumerName": handle.consumer_name,
                        "msgRateOut": 0.0, "msgThroughputOut": 0.0,
                        "availablePermits": sub.core.permits(id(handle)),
                        "unackedMessages": len(sub.core.outstanding(id(handle))),
                        "priorityLevel": sub.core.priority(id(handle)),
                        "address": handle.address,
                        "connectedSince": _iso(handle.connected_since_ms),
                        "clientVersion": handle.client_version, "metadata": dict(handle.metadata),
                    })
                ranges = sub.core.hash_ranges()      # Key_Shared: each consumer's hash ranges
                if ranges:
                    for handle, stats in zip(sub.consumers.values(), consumers):
                        stats["keyHashRanges"] = [f"[{a}, {b}]" for a, b in ranges.get(id(handle), [])]
                if len(consumers) == 1:
                    consumers[0]["msgRateOut"], consumers[0]["msgThroughputOut"] = rate, throughput
                subscriptions[sub.name] = {
                    "msgBacklog": sub.cursor.backlog(last, ledgers),
                    "type": sub.sub_type.value, "msgRateOut": rate, "msgThroughputOut": throughput,
                    "consumers": consumers, "isDurable": sub.durable,
                }
        for cursor_name, state in (await stored_cursors(self.store, name.managed_ledger_name,
                                                        ledgers=ledgers)).items():
            if cursor_name in subscriptions:
                continue
            try:
                backlog = 0 if state is None else state.backlog(last, ledgers)
            except ValueError:
                backlog = 0
            subscriptions[cursor_name] = {"msgBacklog": backlog, "type": "Exclusive", "msgRateOut": 0.0,
                                          "msgThroughputOut": 0.0, "consumers": [], "isDurable": True}
        publishers: list[PublisherStats] = []
        rate_in = rate_out = (0.0, 0.0)
        msg_in = bytes_in = msg_out = bytes_out = 0
        if live is not None:
            rate_in, rate_out = service.rate(("t", key)), service.rate(("to", key))
            msg_in, bytes_in, msg_out, bytes_out = live.msg_in, live.bytes_in, live.msg_out, live.bytes_out
            for p in live.producers.values():
                r, t = service.rate(("p", key, p.name))
                publishers.append({"producerId": p.producer_id, "producerName": p.name, "msgRateIn": r,
                                   "msgThroughputIn": t, "address": p.address,
                                   "connectedSince": _iso(p.connected_since_ms),
                                   "clientVersion": p.handle.client_version, "metadata": dict(p.handle.metadata)})
        slowest = max((s["msgBacklog"] for s in subscriptions.values()), default=0)
        return {
            "msgRateIn": rate_in[0], "msgThroughputIn": rate_in[1],
            "msgRateOut": rate_out[0], "msgThroughputOut": rate_out[1],
            "msgInCounter": msg_in, "bytesInCounter": bytes_in,
            "msgOutCounter": msg_out, "bytesOutCounter": bytes_out,
            "averageMsgSize": (bytes_in / msg_in) if msg_in else 0.0,
            "storageSize": storage, "backlogSize": int(slowest * avg),
            "publishers": publishers, "subscriptions": subscriptions,
        }

    async def nonpersistent_stats(self, topic: str) -> dict:
        """Pulsar's NonPersistentTopicStats of a topic loaded on this broker (404 otherwise: a
        non-persistent topic exists only while loaded): the persistent fields that apply, and
        ``msgDropRate`` (messages/s dropped for consumers without permits, over the last stats
        interval) for the topic, each subscription and each consumer; ``msgDropCounter`` is
        our total since load."""
        name = self._name(topic)
        await self._check_namespace(name)
        service = self.service
        key = str(name)
        live = service.nonpersistent.get(key)
        if live is None:
            raise NotFoundError(f"Topic {name} not found")
        subscriptions: dict = {}
        for sub in live.subscriptions.values():
            rate, throughput = service.rate(("s", key, sub.name))
            drop_rate = service.rate(("sd", key, sub.name))[0]
            consumers: list[ConsumerStats] = []
            for handle in sub.consumers.values():
                consumers.append({
                    "consumerName": handle.consumer_name,
                    "msgRateOut": 0.0, "msgThroughputOut": 0.0, "msgDropRate": 0.0,
                    "availablePermits": sub.core.permits(id(handle)), "unackedMessages": 0,
                    "priorityLevel": sub.core.priority(id(handle)), "address": handle.address,
                    "connectedSince": _iso(handle.connected_since_ms),
                    "clientVersion": handle.client_version, "metadata": dict(handle.metadata),
                })
            if len(consumers) == 1:
                consumers[0]["msgRateOut"], consumers[0]["msgThroughputOut"] = rate, throughput
                consumers[0]["msgDropRate"] = drop_rate
            subscriptions[sub.name] = {
                "msgBacklog": 0, "type": sub.sub_type.value, "msgRateOut": rate, "msgThroughputOut": throughput,
                "msgDropRate": drop_rate, "msgDropCounter": sub.msg_dropped, "consumers": consumers,
                "isDurable": False,
            }
        publishers: list = []
        for p in live.producers.values():
            r, t = service.rate(("p", key, p.name))
            publishers.append({"producerId": p.producer_id, "producerName": p.name, "msgRateIn": r,
                               "msgThroughputIn": t, "msgDropRate": 0.0, "address": p.address,
                               "connectedSince": _iso(p.connected_since_ms),
                               "clientVersion": p.handle.client_version, "metadata": dict(p.handle.metadata)})
        rate_in, rate_out = service.rate(("t", key)), service.rate(("to", key))
        return {
            "msgRateIn": rate_in[0], "msgThroughputIn": rate_in[1],
            "msgRateOut": rate_out[0], "msgThroughputOut": rate_out[1],
            "msgInCounter": live.msg_in, "bytesInCounter": live.bytes_in,
            "msgOutCounter": live.msg_out, "bytesOutCounter": live.bytes_out,
            "averageMsgSize": (live.bytes_in / live.msg_in) if live.msg_in else 0.0,
            "storageSize": 0, "backlogSize": 0,
            "msgDropRate": service.rate(("d", key))[0], "msgDropCounter": live.msg_dropped,
            "publishers": publishers, "subscriptions": subscriptions,
        }

    async def internal_stats(self, topic: str) -> InternalStats:
        name = self._name(topic)
        await self._require_topic(name)
        live = self.service.loaded_topic(str(name))
        if live is not None:
            ledgers = live.ml.ledgers()
            last = live.ml.last_confirmed_position
            state = _ML_STATES.get(live.ml.state.value, live.ml.state.value)
            added = live.entries_added
        else:
            md = await self._ledger_list(name)
            ledgers = md.ledgers if md is not None else ()
            last = _last_position(ledgers)
            state = "Closed"
            added = 0
        current = ledgers[-1] if ledgers else None
        cursors: dict[str, CursorStats] = {}
        if live is not None:
            for sub in live.subscriptions.values():
                if not sub.durable:
                    continue
                cursor = sub.cursor
                cursors[sub.name] = {
                    "markDeletePosition": str(cursor.mark_delete_position),
                    "readPosition": str(sub.read_position),
                    "messagesConsumedCounter": sub.msg_out,
                    "cursorLedger": -1, "state": "Open",
                    "individuallyDeletedMessages": _acked_ranges(cursor),
                }
        for cursor_name, cstate in (await stored_cursors(self.store, name.managed_ledger_name,
                                                         ledgers=ledgers)).items():
            if cursor_name in cursors or cstate is None:
                continue
            cursors[cursor_name] = {
                "markDeletePosition": str(cstate.mark_delete), "readPosition": str(cstate.read_position),
                "messagesConsumedCounter": 0, "cursorLedger": -1, "state": "NoLedger",
                "individuallyDeletedMessages": _acked_ranges(cstate),
            }
        ledger_stats: list[LedgerInfoStats] = [{
            "ledgerId": i.ledger_id, "entries": i.entries, "size": i.size_bytes,
            "offloaded": i.offload.state in (OffloadState.OFFLOADED, OffloadState.BOOKIE_DELETED),
            "offloadState": i.offload.state.value, "offloadUri": i.offload.uri,
            "underReplicated": False, "timestamp": i.created_ms,
        } for i in ledgers]
        return {
            "entriesAddedCounter": added,
            "numberOfEntries": sum(i.entries for i in ledgers),
            "totalSize": sum(i.size_bytes for i in ledgers),
            "currentLedgerEntries": current.entries if current else 0,
            "currentLedgerSize": current.size_bytes if current else 0,
            "lastLedgerCreatedTimestamp": _iso(current.created_ms) if current else "",
            "lastConfirmedEntry": str(last),
            "state": state,
            "ledgers": ledger_stats,
            "cursors": cursors,
        }

    # -- where batch readers find the data (spark_source.discovery) ---------------------------------
    def metadata_locations(self) -> dict:
        """``GET /admin/v2/pulsarlite/metadata``: the metadata store and the tier this broker
        uses, so that a Spark read needs only the admin URL. Superusers only when authorization
        is on (whoever reaches ZooKeeper can do everything: docs/security.md); no credential is
        in the answer (object store credentials stay with the reader)."""
        c = self.service.config
        return {"zookeeper": c.zookeeper, "tierUri": c.offload.tier_uri or None,
                "tierS3EndpointUrl": c.offload.tier_s3_endpoint_url or None}

    # -- console (broker/admin/console.py shapes these) -------------------------------------------
    async def console_cluster(self) -> dict:
        """The cluster page, read from ZooKeeper: live brokers and the bundles each owns (with
        the topics placed in them), live bookies and their mode, under-replicated ledgers."""
        from bookie.autorecovery.urmanager import UnderReplicationManager
        from broker.admin.console import cluster_view, parse_broker, topics_by_bundle
        from broker.ownership.core import is_bundle_key
        store = self.store
        brokers = []
        for broker_id in await store.children(BROKERS_ROOT):
            got = await store.get_or_none(broker_path(broker_id))
            if got is not None:
                brokers.append(parse_broker(broker_id, got[0]))
        owners: dict[str, str] = {}
        namespaces = []
        for tenant in await store.children(NAMESPACE_ROOT):
            for ns in await store.children(f"{NAMESPACE_ROOT}/{tenant}"):
                namespaces.append(f"{tenant}/{ns}")
                for bundle in await store.children(f"{NAMESPACE_ROOT}/{tenant}/{ns}"):
                    key = f"{tenant}/{ns}/{bundle}"
                    got = await store.get_or_none(bundle_path(key)) if is_bundle_key(key) else None
                    if got is not None:
                        owners[key] = _owner_id(got[0])
        topics = []
        for namespace in namespaces:
            topics += await self.service.topics_of_namespace(namespace)
        placement = self.service.ownership.manager.bundle_of
        lm = self.service.ledger_client.ledger_manager
        writable, readonly = await lm.writable_bookies(), await lm.readonly_bookies()
        disks = await self._bookie_disks(writable, readonly)
        return cluster_view(brokers, owners, topics_by_bundle(topics, placement), writable,
                            readonly, await UnderReplicationManager(store).list_marked(), disks)

    async def _bookie_disks(self, writable: list[str], readonly: list[str]) -> dict:
        """Each live bookie's disk (broker/admin/console.py ``BookieDisk``), read from the
        /metrics whose host:port the bookie recorded in its registration node, all bookies at
        once, each within ``BOOKIE_METRICS_TIMEOUT_MS``; a bookie that records none, does not
        answer in time or answers without the gauges is absent (the page says "unknown"). The
        bookie's metrics port takes no credentials (bookie/metrics.py): none are sent."""
        import asyncio

        import aiohttp

        from bookie.client.ledger_manager import bookie_registration_path
        from broker.admin.console import (BOOKIE_METRICS_BYTES_MAX, BOOKIE_METRICS_TIMEOUT_MS, BOOKIES_PROBED_MAX,
                                          parse_disk_gauges)
        readonly_set = set(readonly)
        ids = sorted(set(writable) | readonly_set)[:BOOKIES_PROBED_MAX]

        async def address_of(bookie_id: str) -> str | None:
            try:
                got = await self.store.get_or_none(
                    bookie_registration_path(bookie_id, read_only=bookie_id in readonly_set))
            except (PulsarliteError, ValueError):     # gone meanwhile, or an id we cannot form a path for
                return None
            return None if got is None else bookie_registration_metrics_address(got[0])

        addresses = dict(zip(ids, await asyncio.gather(*(address_of(b) for b in ids))))
        if not any(addresses.values()):
            return {}

        async def disk_of(session, bookie_id: str, address: str):
            url = f"http://{address}/metrics"
            try:
                async with session.get(url, allow_redirects=False) as resp:
                    if resp.status != 200:
                        log.debug("console bookie metrics refused bookie=%s url=%s status=%d",
                                  bookie_id, url, resp.status)
                        return None
                    body = await resp.content.read(BOOKIE_METRICS_BYTES_MAX)
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
                log.debug("console bookie metrics unreachable bookie=%s url=%s error=%r", bookie_id, url, e)
                return None
            return parse_disk_gauges(body.decode("utf-8", errors="replace"))

        timeout = aiohttp.ClientTimeout(total=BOOKIE_METRICS_TIMEOUT_MS / 1000)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            probed = [(b, a) for b, a in addresses.items() if a]
            got = await asyncio.gather(*(disk_of(session, b, a) for b, a in probed))
        return {b: disk for (b, _), disk in zip(probed, got) if disk is not None}

    async def topic_segments(self, topic: str) -> dict:
        """The topic page's segments (oldest first) with each ledger's ensembles from its
        metadata; 404 if the topic does not exist."""
        from bookie.autorecovery.urmanager import UnderReplicationManager
        from broker.admin.console import SEGMENTS_LISTED_MAX, segments_view
        name = self._name(topic)
        await self._require_topic(name)
        live = self.service.loaded_topic(str(name))
        if live is not None:
            ledgers = live.ml.ledgers()
        else:
            md = await self._ledger_list(name)
            ledgers = md.ledgers if md is not None else ()
        total = len(ledgers)
        ledgers = ledgers[-SEGMENTS_LISTED_MAX:]          # the newest; the page says how many it left out
        lm = self.service.ledger_client.ledger_manager
        ensembles = {}
        for info in ledgers:
            try:
                ensembles[info.ledger_id] = (await lm.read(info.ledger_id))[0].ensembles
            except MetadataNotFoundError:
                pass                      # deleted from the bookies (offloaded) or never created
        marked = await UnderReplicationManager(self.store).list_marked()
        return {"topic": str(name), "loadedHere": live is not None, "segmentsTotal": total,
                "segments": segments_view(ledgers, ensembles, marked, open_current=live is not None)}

    async def console_topic(self, topic: str) -> dict:
        """The console's topic page in one answer: ``{"topic", "ownerAdminUrl", "stats",
        "loadedHere", "segmentsTotal", "segments"}``. Asked of any broker: a topic another
        broker owns is read from its owner (the caller's credentials forwarded), so the browser
        stays on the broker that served the page (a 307 to another origin would lose the
        token and meet CORS)."""
        name = self._name(topic)
        url = await self.admin_redirect_url(str(name))
        if url is None:
            stats, segments = await self.topic_stats(str(name)), await self.topic_segments(str(name))
        else:
            stats = await self._call_owner(url, "GET", name, "/stats")
            segments = await self._call_owner(url, "GET", name, "/segments")
        return {"ownerAdminUrl": url, "stats": stats, **segments, "topic": str(name)}

    # -- offload ---------------------------------------------------------------------------------
    async def offload(self, topic: str, ledger_id: int, entry_id: int) -> None:
        name = self._name(topic)
        await self._require_topic(name)
        offloader = self.service.offloader
        if offloader is None:
            raise PreconditionFailedError("this broker has no tier configured (tier_uri)")
        live = await self._load(name)
        topic_offloader = offloader.topics.get(str(name))
        if topic_offloader is None:
            topic_offloader = offloader.attach(live)
        demand = topic_offloader.demand
        if demand is not None and demand.status.value == "RUNNING":
            raise ConflictError(f"Offload already running for {name}")
        topic_offloader.request(Position(ledger_id, entry_id))

    async def get_topic_offload_policies(self, topic: str) -> dict | None:
        name = self._name(topic)
        await self._require_topic(name)
        policies = await read_topic_offload_policies(self.store, name)
        return None if policies is None else policies.to_json()

    async def set_topic_offload_policies(self, topic: str, raw: dict | None) -> None:
        name = self._name(topic)
        policies = None
        if raw is not None:
            try:
                policies = TopicOffloadPolicies.from_json(raw)
            except ValueError as e:
                raise BadRequestError(str(e)) from None
        await self._require_topic(name)
        path = topic_policies_path(name.managed_ledger_name)
        if policies is None:
            try:
                await self.store.delete(path)
            except MetadataNotFoundError:
                pass
        else:
            data = json.dumps({"offloadPolicies": policies.to_json()}, sort_keys=True).encode()
            try:
                await self.store.create(path, data, make_parents=True)
            except MetadataExistsError:
                await self.store.update(path, lambda _: data)
        offloader = self.service.offloader
        if offloader is not None and str(name) in offloader.topics:
            offloader.topics[str(name)].kick()

    async def offload_status(self, topic: str) -> dict:
        name = self._name(topic)
        await self._require_topic(name)
        offloader = self.service.offloader
        if offloader is None:
            return {"status": "NOT_RUN", "lastError": ""}
        return offloader.status(str(name))

    async def lake(self, topic: str) -> dict:
        name = self._name(topic)
        offloader = self.service.offloader
        if offloader is None or offloader.lake is None:
            raise PreconditionFailedError("this broker has no lake configured (lake_enabled)")
        if not await self._exists(name) and await self.store.get_or_none(self._partitions_path(name)) is None:
            await self._check_namespace(name)
            raise NotFoundError(f"Topic {name} not found")
        return await offloader.lake_info(name)

    # -- compaction ------------------------------------------------------------------------------
    async def _partitions_of(self, name: TopicName) -> int:
        if name.is_partition:
            return 0
        return await self.service.partitions(str(name))

    async def compact(self, topic: str) -> None:
        name = self._name(topic)
        await self._check_namespace(name)
        partitions = await self._partitions_of(name)
        if partitions > 0:       # Pulsar triggers every partition
            for i in range(partitions):
                part = name.partition(i)
                url = await self.admin_redirect_url(str(part))
                if url is None:
                    await self.compact(str(part))
                else:
                    await self._call_owner(url, "PUT", part, "/compaction")
            return
        await self._require_topic(name)
        live = await self._load(name)
        try:
            self.service.compaction.trigger(live)
        except CompactionRunningError as e:
            raise ConflictError(str(e)) from None

    async def compaction_status(self, topic: str) -> dict:
        name = self._name(topic)
        await self._check_namespace(name)
        partitions = await self._partitions_of(name)
        if partitions > 0:
            reports = []
            for i in range(partitions):
                part = name.partition(i)
                url = await self.admin_redirect_url(str(part))
                got = await (self.compaction_status(str(part)) if url is None
                             else self._call_owner(url, "GET", part, "/compaction"))
                reports.append(StatusReport(CompactionStatus(got["status"]), got.get("lastError") or ""))
            return combined_status(reports).to_json()
        await self._require_topic(name)
        return self.service.compaction.board.report(str(name)).to_json()

    # -- unload ----------------------------------------------------------------------------------
    async def unload_topic(self, topic: str) -> None:
        name = self._name(topic)
        await self._check_namespace(name)
        key = str(name)
        if self.service.loaded_topic(key) is None:
            n = 0 if name.is_partition else await self.service.partitions(key)
            if n > 0:
                for i in range(n):
                    part = name.partition(i)
                    url = await self.admin_redirect_url(str(part))
                    if url is None:
                        await self.unload_topic(str(part))
                    elif await self._exists(part):       # served by another broker: it unloads it
                        await self._call_owner(url, "PUT", part, "/unload")
                return
            if not await self._exists(name):
                raise NotFoundError(f"Topic {name} not found")
            return       # exists, not served here: nothing to unload

        async def release() -> None:
            await self._release_bundle(name)

        await self.service.unload_topic(key, before_close=release)

    async def _release_bundle(self, name: TopicName) -> None:
        """Let go of the topic's bundle unless another topic of it is still served here."""
        manager = self.service.ownership.manager
        bundle = manager.bundle_of(name)
        served = list(self.service.topics) + list(self.service.nonpersistent)
        if any(manager.bundle_of(key) == bundle for key in served):
            return       # another topic of the bundle (either kind) is served (or loading) here: keep it
        try:
            await manager.release(name)
        except Exception as e:   # ownership stays; the topic is closed anyway and reloads here
            log.warning("unload %s: releasing bundle %s failed: %s", name, bundle, e)

    # -- subscriptions ---------------------------------------------------------------------------
    async def list_subscriptions(self, topic: str) -> list[str]:
        name = self._name(topic)
        await self._require_topic(name)
        names = set(await list_cursors(self.store, name.managed_ledger_name))
        live = self.service.loaded_topic(str(name))
        if live is not None:
            names.update(s.name for s in live.subscriptions.values() if s.durable)
        return sorted(names)

    async def create_subscription(self, topic: str, name: str, position: SubscriptionPosition) -> None:
        tname = self._name(topic)
        await self._require_topic(tname)
        live = await self._load(tname)
        if position == "earliest":
            initial = live.earliest_mark_delete()
        elif position == "latest":
            initial = live.last_position()
        else:
            ledger_id, entry_id = position
            initial = Position(ledger_id, entry_id - 1)
        if not await live.create_stored_subscription(name, initial):
            raise ConflictError(f"Subscription {name} already exists on {tname}")

    async def delete_subscription(self, topic: str, name: str, force: bool) -> None:
        tname = self._name(topic)
        await self._require_topic(tname)
        live = self.service.loaded_topic(str(tname))
        ml_name = tname.managed_ledger_name
        sub = live.subscriptions.get(name) if live is not None else None
        if sub is None and not await self.store.exists(cursor_path(ml_name, name)):
            raise NotFoundError(f"Subscription {name} not found on {tname}")
        if live is None:
            live = await self._load(tname)
            sub = live.subscriptions.get(name)
        if sub is not None:
            if sub.consumers and not force:
                raise PreconditionFailedError(f"Subscription {name} has active consumers")
            for consumer in list(sub.consumers.values()):
                consumer.close_by_broker()
            await live.remove_subscription(sub, delete_cursor=True)
        try:
            await self.store.delete(cursor_path(ml_name, name))
        except MetadataNotFoundError:
            pass

    async def _subscription(self, topic: str, subscription: str):
        """(topic, its live Subscription or None) for an admin change to ``subscription`` (loaded
        here or only a cursor znode); 404 if neither the topic nor the subscription exists."""
        tname = self._name(topic)
        await self._require_topic(tname)
        live = await self._load(tname)
        sub = live.subscriptions.get(subscription)
        if sub is None and not await self.store.exists(cursor_path(tname.managed_ledger_name, subscription)):
            raise NotFoundError(f"Subscription {subscription} not found on {tname}")
        return live, sub

    async def _on_stored_cursor(self, live, subscription: str, change):
        """Open the subscription's stored cursor (no consumer here has it loaded), apply
        ``change(cursor)`` (may be a coroutine function), close it: the change is persisted."""
        cursor = await ManagedCursor.open(self.store, live.ml.name, subscription, initial=live.earliest_mark_delete(),
                                          durable=True, ledgers=live.ml.ledgers)
        try:
            result = change(cursor)
            return (await result) if inspect.isawaitable(result) else result
        finally:
            await cursor.close()

    async def reset_cursor_by_time(self, topic: str, subscription: str, timestamp_ms: int) -> None:
        live, _ = await self._subscription(topic, subscription)
        position = await self._position_at_time(live, timestamp_ms)
        sub = live.subscriptions.get(subscription)
        if sub is not None:
            await sub.reset(position)
        else:
            await self._on_stored_cursor(live, subscription, lambda cursor: cursor.reset(position))

    async def skip_messages(self, topic: str, subscription: str, count: int | None) -> int | None:
        """Skip the subscription's next ``count`` unacknowledged messages (None: all of them,
        Pulsar's skip_all / clear-backlog). Returns how many were skipped (None: skip_all of a
        subscription not loaded here, whose backlog is not counted)."""
        live, sub = await self._subscription(topic, subscription)
        if sub is not None and not sub.durable:
            raise PreconditionFailedError(f"Subscription {subscription} is not durable")
        if count is None:                    # everything: the cursor moves past the last entry
            last = live.last_position()
            end = live.next_after(last) if last.entry_id >= 0 else Position(max(last.ledger_id, 0), 0)
            if sub is not None:
                before = sub.cursor.backlog(live.ml.last_confirmed_position, live.ml.ledgers())
                await sub.reset(end)
            else:
                before = None
                await self._on_stored_cursor(live, subscription, lambda cursor: cursor.reset(end))
            log.info("clear backlog topic=%s subscription=%s entries=%s", live.key, subscription, before)
            return before
        if sub is not None:
            return await sub.skip(count)
        skipped = await self._on_stored_cursor(live, subscription, lambda cursor: skip_messages(live, cursor, count))
        log.info("skip topic=%s subscription=%s skipped=%d asked=%d", live.key, subscription, skipped, count)
        return skipped

    async def clear_backlog(self, topic: str) -> None:
        """Every durable subscription of the topic skips everything (Pulsar's clearBacklog)."""
        for name in await self.list_subscriptions(topic):
            await self.skip_messages(topic, name, None)

    # -- expiry, reset to a message id, peek, examine (Pulsar's PersistentTopicsBase) ------------
    async def _not_partitioned(self, name: TopicName, what: str) -> None:
        """405 for a partitioned topic's parent, as Pulsar answers these operations there."""
        if not name.is_partition and await self.service.partitions(str(name)) > 0:
            raise MethodNotAllowedError(f"{what} on a partitioned topic is not allowed, "
                                        f"please try it on a specific topic partition")

    async def expire_messages(self, topic: str, subscription: str, expire_s: int, now_ms: int) -> bool:
        """Pulsar's expireMessages/{seconds}: mark-delete the subscription through the newest
        entry published more than ``expire_s`` before ``now_ms`` (expired when now > publish time
        + ttl, PersistentMessageExpiryMonitor); later individual acks stay. True if the cursor
        moved."""
        name = self._name(topic)
        await self._check_namespace(name)
        if not name.is_partition and await self.service.partitions(str(name)) > 0:     # each partition
            from urllib.parse import quote
            await self._each_partition(name, f"/subscription/{quote(subscription, safe='')}/expireMessages/{expire_s}",
                                       lambda part: self.expire_messages(part, subscription, expire_s, now_ms))
            return True
        live, sub = await self._subscription(topic, subscription)
        if sub is not None and not sub.durable:
            raise PreconditionFailedError(f"Subscription {subscription} is not durable")
        first_kept = await self._position_at_time(live, now_ms - expire_s * 1000)
        through = self._position_before(live, first_kept)
        if through is None:
            return False
        if sub is not None:
            moved = await sub.mark_delete_through(through)
        else:
            moved = await self._on_stored_cursor(live, subscription, lambda cursor: cursor.ack_cumulative(through))
        log.info("expire messages topic=%s subscription=%s ttl_s=%d through=%d:%d moved=%s", live.key, subscription,
                 expire_s, through.ledger_id, through.entry_id, moved)
        return bool(moved)

    async def expire_messages_all(self, topic: str, expire_s: int, now_ms: int) -> None:
        """Pulsar's all_subscription/expireMessages/{seconds}: every durable subscription."""
        name = self._name(topic)
        await self._check_namespace(name)
        if not name.is_partition and await self.service.partitions(str(name)) > 0:     # each partition
            await self._each_partition(name, f"/all_subscription/expireMessages/{expire_s}",
                                       lambda part: self.expire_messages_all(part, expire_s, now_ms))
            return
        for subscription in await self.list_subscriptions(topic):
            await self.expire_messages(topic, subscription, expire_s, now_ms)

    async def _each_partition(self, name: TopicName, suffix: str, here) -> dict[str, Any]:
        """A POST ``suffix`` on every partition of ``name``, as Pulsar fans these out: ``here(partition)``
        where this broker serves it (or nobody does), the owner's admin API elsewhere. The
        answers by partition index, ``{"0": answer, ...}``."""
        out: dict[str, Any] = {}
        for i in range(await self.service.partitions(str(name))):
            part = name.partition(i)
            url = await self.admin_redirect_url(str(part))
            out[str(i)] = await here(str(part)) if url is None else await self._call_owner(url, "POST", part, suffix)
        return out

    @staticmethod
    def _position_before(live, position: Position) -> Position | None:
        """The last existing entry before ``position`` (None: there is none)."""
        for info in reversed([i for i in live.ml.ledgers() if i.entries > 0]):
            if info.ledger_id < position.ledger_id:
                return Position(info.ledger_id, info.entries - 1)
            if info.ledger_id == position.ledger_id and position.entry_id > 0:
                return Position(info.ledger_id, min(position.entry_id, info.entries) - 1)
        return None

    async def reset_cursor_to_position(self, topic: str, subscription: str, ledger_id: int, entry_id: int,
                                       excluded: bool) -> None:
        """Pulsar's resetCursorOnPosition: the subscription delivers (ledger_id, entry_id) next,
        or the entry after it when ``excluded``; its consumers are disconnected (they resume from
        there); 405 on a partitioned topic's parent."""
        name = self._name(topic)
        await self._check_namespace(name)
        await self._not_partitioned(name, "Reset-cursor at position")
        live, sub = await self._subscription(topic, subscription)
        position = Position(ledger_id, entry_id)
        info = next((i for i in live.ml.ledgers() if i.ledger_id == ledger_id), None)
        if info is None or entry_id >= info.entries:
            raise PreconditionFailedError(f"Unable to find position for position specified: {ledger_id}:{entry_id} "
                                          f"is not a message of {name}")
        if excluded:
            position = live.next_after(position)
        if sub is not None:
            await sub.reset(position)
        else:
            await self._on_stored_cursor(live, subscription, lambda cursor: cursor.reset(position))
        log.info("reset cursor topic=%s subscription=%s position=%d:%d", live.key, subscription,
                 position.ledger_id, position.entry_id)

    async def peek_entry(self, topic: str, subscription: str, nth: int) -> tuple[Position, bytes]:
        """Pulsar's peekNthMessage: the ``nth`` (from 1) entry after the subscription's
        mark-delete position, individually acknowledged entries skipped; 404 "Message not
        found" past the last entry. Reads only: the cursor does not move."""
        name = self._name(topic)
        await self._check_namespace(name)
        await self._not_partitioned(name, "Peek messages")
        live, sub = await self._subscription(topic, subscription)
        if sub is not None:
            return await self._nth_unacked(live, sub.cursor, nth)
        return await self._on_stored_cursor(live, subscription, lambda cursor: self._nth_unacked(live, cursor, nth))

    async def _nth_unacked(self, live, cursor, nth: int) -> tuple[Position, bytes]:
        last = live.ml.last_confirmed_position
        position = live.next_after(cursor.mark_delete_position)
        seen = 0
        while last.entry_id >= 0 and position <= last:
            got = [(p, d) for p, d in await live.ml.read_entries(position, PEEK_READ_ENTRIES) if p <= last]
            if not got:
                break
            for p, data in got:
                if cursor.is_acked(p):
                    continue
                seen += 1
                if seen == nth:
                    return p, bytes(data)
            position = live.next_after(got[-1][0])
        raise NotFoundError("Message not found")

    async def examine_entry(self, topic: str, initial_position: str, nth: int) -> tuple[Position, bytes]:
        """Pulsar's examineMessage: the ``nth`` (from 1) entry of the topic counted from its
        first entry (``earliest``) or its last (``latest``), whatever the subscriptions; past
        either end, the entry at that end; 412 for a topic without entries, 405 on a
        partitioned topic's parent."""
        name = self._name(topic)
        await self._check_namespace(name)
        await self._not_partitioned(name, "Examine messages")
        await self._require_topic(name)
        live = await self._load(name)
        ledgers = [i for i in live.ml.ledgers() if i.entries > 0]
        total = sum(i.entries for i in ledgers)
        if total == 0:
            raise PreconditionFailedError("Could not examine messages due to the total message is zero")
        index = nth - 1 if initial_position == "earliest" else total - nth     # 0-based from the first
        index = min(max(index, 0), total - 1)
        for info in ledgers:
            if index < info.entries:
                position = Position(info.ledger_id, index)
                break
            index -= info.entries
        got = await live.ml.read_entries(position, 1)
        if not got or got[0][0] != position:
            raise NotFoundError(f"Message ID {position.ledger_id}:{position.entry_id} not found in {name}")
        return position, bytes(got[0][1])

    async def _position_at_time(self, live, timestamp_ms: int) -> Position:
        """The first entry whose publish time is >= ``timestamp_ms`` (publish-time bounds pick
        the ledger; its entries' metadata decide), else the position after the last entry."""
        ledgers = [i for i in live.ml.ledgers() if i.entries > 0]
        for info in ledgers:
            if info.max_publish_time_ms is not None and info.max_publish_time_ms < timestamp_ms:
                continue
            if info.min_publish_time_ms is not None and info.min_publish_time_ms >= timestamp_ms:
                return Position(info.ledger_id, 0)
            entry_id = 0
            while entry_id < info.entries:
                got = await live.ml.read_entries(Position(info.ledger_id, entry_id), RESET_SCAN_ENTRIES)
                got = [(p, d) for p, d in got if p.ledger_id == info.ledger_id]
                if not got:
                    break
                for p, data in got:
                    try:
                        publish_time = peek_metadata(data).publish_time_ms
                    except Exception:
                        continue
                    if publish_time >= timestamp_ms:
                        return p
                entry_id = got[-1][0].entry_id + 1
        last = live.last_position()
        if last.ledger_id < 0:
            return Position(max(live.ml.current_ledger_id or 0, 0), 0)
        return Position(last.ledger_id, last.entry_id + 1)

    async def read_entry(self, topic: str, ledger_id: int, entry_id: int) -> bytes:
        name = self._name(topic)
        await self._check_namespace(name)
        if not name.is_partition and await self.service.partitions(str(name)) > 0:
            # Pulsar (#19013): asked of a partitioned topic's parent, refused; ask a partition
            raise MethodNotAllowedError("GetMessageById is not allowed on a partitioned topic")
        await self._require_topic(name)
        live = await self._load(name)
        wanted = Position(ledger_id, entry_id)
        last = live.ml.last_confirmed_position
        if not any(i.ledger_id == ledger_id for i in live.ml.ledgers()) or last.ledger_id < 0 \
                or (ledger_id, entry_id) > (last.ledger_id, last.entry_id):
            raise NotFoundError(f"Message ID {ledger_id}:{entry_id} not found in {name}")
        got = await live.ml.read_entries(wanted, 1)
        if not got or (got[0][0].ledger_id, got[0][0].entry_id) != (ledger_id, entry_id):
            raise NotFoundError(f"Message ID {ledger_id}:{entry_id} not found in {name}")
        return bytes(got[0][1])

    # -- lookup ----------------------------------------------------------------------------------
    async def lookup(self, topic: str, *, authoritative: bool = False, listener_name: str = "") -> LookupData:
        """Pulsar's HTTP lookup; ``listener_name`` (``?listenerName=`` or ``X-Pulsar-ListenerName``)
        picks the owner's advertised listener for the broker URLs, as the binary LOOKUP does (an
        unknown name: ServiceNotReadyError, 503)."""
        name = self._name(topic)
        await self._check_namespace(name)
        manager = self.service.ownership.manager
        check_listener_name(manager.listeners, listener_name)
        result = await manager.lookup(name, authoritative=authoritative)
        url, url_tls = listener_urls(result, listener_name)
        return lookup_data(url, result.http_url, broker_url_tls=url_tls or None,
                           http_url_tls=result.http_url_tls or None)

    async def admin_redirect_url(self, topic: str) -> str | None:
        """The admin base URL (``http://host:port``) of the broker that owns ``topic`` when it is
        another broker (the admin call is redirected there, 307, as Pulsar does); None when this
        broker owns it or will (a lookup with nobody owning it may acquire it here)."""
        name = self._name(topic)
        manager = self.service.ownership.manager
        if manager.owns(name):
            return None
        await self._check_namespace(name)
        if not name.is_partition and await self.service.partitions(str(name)) > 0:
            return None          # a partitioned topic is its partitions: each has its own owner
        result = await manager.lookup(name)
        if result.owned_by_self or not result.http_url:
            return None
        return result.http_url.rstrip("/")

    async def partitioned_stats(self, topic: str, per_partition: bool) -> dict:
        """Pulsar's PartitionedTopicStats: the partitions' stats summed (rates, counters,
        storage, backlog; subscriptions merged by name, publishers concatenated), ``metadata``
        and, if asked, ``partitions`` by name. A partition served by another broker is asked
        there (its admin ``/stats``), so the counters are live wherever it is served."""
        name = self._name(topic)
        await self._check_namespace(name)
        n = 0 if name.is_partition else await self.service.partitions(str(name))
        if n <= 0:
            raise NotFoundError(f"Partitioned topic {name} does not exist")
        per: dict[str, dict] = {}
        for i in range(n):
            part = name.partition(i)
            per[str(part)] = await self._stats_anywhere(part)
        out: dict = {"msgRateIn": 0.0, "msgThroughputIn": 0.0, "msgRateOut": 0.0, "msgThroughputOut": 0.0,
                     "msgInCounter": 0, "bytesInCounter": 0, "msgOutCounter": 0, "bytesOutCounter": 0,
                     "averageMsgSize": 0.0, "storageSize": 0, "backlogSize": 0, "publishers": [],
                     "subscriptions": {}, "metadata": {"partitions": n}}
        for stats in per.values():
            for key in ("msgRateIn", "msgThroughputIn", "msgRateOut", "msgThroughputOut", "msgInCounter",
                        "bytesInCounter", "msgOutCounter", "bytesOutCounter", "storageSize", "backlogSize"):
                out[key] += stats.get(key, 0)
            out["publishers"].extend(stats.get("publishers", []))
            for sub_name, sub in stats.get("subscriptions", {}).items():
                merged = out["subscriptions"].setdefault(sub_name, {
                    "msgBacklog": 0, "type": sub.get("type", "Exclusive"), "msgRateOut": 0.0,
                    "msgThroughputOut": 0.0, "consumers": [], "isDurable": sub.get("isDurable", True)})
                for key in ("msgBacklog", "msgRateOut", "msgThroughputOut"):
                    merged[key] += sub.get(key, 0)
                merged["consumers"].extend(sub.get("consumers", []))
        if out["msgInCounter"]:
            out["averageMsgSize"] = out["bytesInCounter"] / out["msgInCounter"]
        out["partitions"] = per if per_partition else {}
        return out

    async def _stats_anywhere(self, name: TopicName) -> dict:
        """The stats of one topic: here if this broker owns it (or nobody does), else from its
        owner's admin API. A partition that does not exist (yet) counts as empty."""
        if not await self._exists(name):
            return {}
        url = await self.admin_redirect_url(str(name))
        if url is None:
            return dict(await self.topic_stats(str(name)))
        return await self._call_owner(url, "GET", name, "/stats")

    async def _call_owner(self, url: str, method: str, name: TopicName, suffix: str,
                          params: dict | None = None):
        """Make an admin call about ``name`` on its owner ``url`` (authoritative): its JSON
        answer (None for 204); its 4xx error as ours; 503 if it cannot be reached."""
        import aiohttp
        from urllib.parse import quote

        from broker.security.http import forwarded_headers
        path = (f"/admin/v2/persistent/{name.tenant}/{name.namespace_local_name}/"
                f"{quote(name.local_name, safe='')}{suffix}")
        timeout = aiohttp.ClientTimeout(total=60)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.request(method, url + path, params={**(params or {}), "authoritative": "true"},
                                           headers=forwarded_headers(),      # [security] the caller's role
                                           allow_redirects=False) as resp:
                    if resp.status == 204:
                        return None
                    if resp.status == 200:
                        return await resp.json()
                    try:
                        reason = (await resp.json()).get("reason", "")
                    except (ValueError, aiohttp.ContentTypeError):
                        reason = await resp.text()
                    for error in (BadRequestError, NotFoundError, ConflictError, PreconditionFailedError):
                        if resp.status == error.http_status:
                            raise error(reason)
                    raise ServiceNotReadyError(f"{method} {suffix} of {name} at {url}: HTTP {resp.status} {reason}")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ServiceNotReadyError(f"{method} {suffix} of {name} at {url}: {e}") from None

    async def last_message_id(self, topic: str) -> MessageIdData:
        name = self._name(topic)
        await self._require_topic(name)
        live = await self._load(name)
        ledger_id, entry_id, batch_index = await live.last_message_id()
        out: MessageIdData = {"ledgerId": ledger_id, "entryId": entry_id, "partitionIndex": name.partition_index}
        if batch_index >= 0:
            out["batchIndex"] = batch_index
        return out


__all__ = ["BrokerAdminBackend"]
