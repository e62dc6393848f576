"""The admin API's contract: what the routes need from the broker (:class:`AdminBackend`,
implemented by broker/admin_backend.py) and the shapes it returns (Pulsar's JSON field names).

Topic names the backend receives are full names (``persistent://tenant/ns/topic``), namespaces
``tenant/ns``. No aiohttp here: the routes (``broker/admin/*_http.py``) parse requests and call
these methods; the broker implements them.
"""

from __future__ import annotations

from typing import Literal, Protocol, TypedDict, Union

from broker.admin.metrics import BrokerMetrics
from broker.admin.policies import PolicyStore
from broker.schemas import SchemaRegistry

# -- shapes the backend returns (Pulsar's JSON field names) ------------------------------------
class ConsumerStats(TypedDict, total=False):
    consumerName: str
    msgRateOut: float
    msgThroughputOut: float
    availablePermits: int
    unackedMessages: int
    address: str
    connectedSince: str
    priorityLevel: int
    keyHashRanges: list[str]                # Key_Shared only: "[start, end]" each
    clientVersion: str                      # the CONNECT's client_version
    metadata: dict[str, str]                # the SUBSCRIBE's metadata ({} when none)


class SubscriptionStats(TypedDict, total=False):
    msgBacklog: int
    type: str                       # Exclusive | Shared | Failover | Key_Shared
    msgRateOut: float
    msgThroughputOut: float
    consumers: list[ConsumerStats]


class PublisherStats(TypedDict, total=False):
    producerId: int
    producerName: str
    msgRateIn: float
    msgThroughputIn: float
    address: str
    connectedSince: str
    clientVersion: str                      # the CONNECT's client_version
    metadata: dict[str, str]                # the PRODUCER's metadata ({} when none)


class TopicStats(TypedDict, total=False):
    msgRateIn: float
    msgThroughputIn: float
    msgRateOut: float
    msgThroughputOut: float
    msgInCounter: int
    bytesInCounter: int
    storageSize: int
    backlogSize: int
    publishers: list[PublisherStats]
    subscriptions: dict[str, SubscriptionStats]


class LedgerInfoStats(TypedDict, total=False):
    ledgerId: int
    entries: int
    size: int
    offloaded: bool
    offloadState: str               # none | offloading | offloaded | bookie-deleted
    offloadUri: str | None          # the Parquet object of the ledger in the tier
    underReplicated: bool
    timestamp: int


class CursorStats(TypedDict, total=False):
    markDeletePosition: str         # "L:E"
    readPosition: str               # "L:E"
    messagesConsumedCounter: int
    cursorLedger: int
    state: str
    individuallyDeletedMessages: str


class InternalStats(TypedDict, total=False):
    entriesAddedCounter: int
    numberOfEntries: int
    totalSize: int
    currentLedgerEntries: int
    currentLedgerSize: int
    lastLedgerCreatedTimestamp: str
    lastConfirmedEntry: str          # "L:E"
    state: str                       # e.g. LedgerOpened, ClosedLedger
    ledgers: list[LedgerInfoStats]
    cursors: dict[str, CursorStats]


class LookupData(TypedDict, total=False):
    brokerUrl: str                   # pulsar://host:port
    brokerUrlTls: str                # pulsar+ssl://host:port; only with a TLS listener
    httpUrl: str                     # http://host:port
    httpUrlTls: str                  # https://host:port; only with a TLS listener
    nativeUrl: str                   # legacy name of brokerUrl, still read by clients
    brokerUrlSsl: str                # legacy, always "": older C++ clients require the key


def lookup_data(broker_url: str, http_url: str, *, broker_url_tls: str | None = None,
                http_url_tls: str | None = None) -> LookupData:
    """Pulsar's ``LookupData`` as its ObjectMapper writes it (Jackson ``NON_NULL``): every
    field a string, the TLS URLs only when the broker has TLS listeners, ``nativeUrl`` equal to
    ``brokerUrl`` and ``brokerUrlSsl`` always ``""``. The C++ client (Python, Node, ...) reads
    ``brokerUrlTls`` and falls back to ``brokerUrlSsl``; without either it fails the lookup."""
    data: LookupData = {"brokerUrl": broker_url, "httpUrl": http_url, "nativeUrl": broker_url,
                        "brokerUrlSsl": ""}
    if broker_url_tls:
        data["brokerUrlTls"] = broker_url_tls
    if http_url_tls:
        data["httpUrlTls"] = http_url_tls
    return data


class MessageIdData(TypedDict, total=False):
    ledgerId: int
    entryId: int
    partitionIndex: int
    batchIndex: int


# where a new subscription starts: "earliest", "latest", or (ledger_id, entry_id)
SubscriptionPosition = Union[Literal["earliest", "latest"], tuple[int, int]]


class AdminBackend(Protocol):
    """What the admin routes need from the broker. Topics are full names
    (``persistent://tenant/ns/topic``), namespaces ``tenant/ns``. Methods raise the errors of
    :mod:`broker.admin.policies` (NotFoundError 404, ConflictError 409,
    PreconditionFailedError 412, BadRequestError 400); other PulsarliteErrors become 503 when
    retriable, else 500.

    Topic operations must check that the namespace exists and is not being deleted
    (``policies.get_namespace_policies`` raises NotFoundError otherwise)."""

    policies: PolicyStore
    metrics: BrokerMetrics
    schemas: SchemaRegistry | None           # None: no schema routes

    async def admin_redirect_url(self, topic: str) -> str | None:
        """The admin base URL (``http://host:port``) of another broker that owns ``topic``: the
        call is redirected there (307); None: served here."""

    async def list_topics(self, namespace: str, mode: str = "PERSISTENT") -> list[str]:
        """The namespace's topics of ``mode`` PERSISTENT, NON_PERSISTENT (loaded now on some
        broker) or ALL, partitions included (full names)."""

    async def nonpersistent_stats(self, topic: str) -> dict:
        """A non-persistent topic's stats (Pulsar's NonPersistentTopicStats, with msgDropRate);
        404 if it is not loaded."""

    async def list_partitioned_topics(self, namespace: str) -> list[str]:
        """The partitioned topics of the namespace (full names of the parents)."""

    async def create_topic(self, topic: str) -> None:
        """Create a non-partitioned topic; 409 if it (or a partitioned topic of that name) exists."""

    async def delete_topic(self, topic: str, force: bool) -> None:
        """Delete a non-partitioned topic (or one partition); 404 if missing; 412 if it has
        connected producers/consumers and not ``force`` (force disconnects them)."""

    async def create_partitioned_topic(self, topic: str, partitions: int,
                                       properties: dict[str, str] | None = None) -> None:
        """409 if the topic exists (partitioned or not); ``properties`` are kept with the
        partition count (Pulsar's PartitionedTopicMetadata)."""

    async def partitioned_topic_properties(self, topic: str) -> dict[str, str] | None:
        """The properties given when the partitioned topic was created (None: none)."""

    async def update_partitioned_topic(self, topic: str, partitions: int) -> None:
        """Grow to ``partitions``; 404 if not partitioned; 412 if not more than now."""

    async def delete_partitioned_topic(self, topic: str, force: bool) -> None:
        """Delete the partitioned topic and all its partitions; 404, 412 as delete_topic."""

    async def partitioned_metadata(self, topic: str) -> int:
        """The number of partitions; 0 for a non-partitioned (or unknown) topic, as Pulsar."""

    async def topic_stats(self, topic: str) -> TopicStats:
        """404 if the topic does not exist."""

    async def internal_stats(self, topic: str) -> InternalStats:
        """404 if the topic does not exist."""

    async def partitioned_stats(self, topic: str, per_partition: bool) -> dict:
        """Stats of every partition summed (Pulsar's PartitionedTopicStats: ``metadata``,
        ``partitions`` when ``per_partition``); 404 if the topic is not partitioned."""

    async def offload(self, topic: str, ledger_id: int, entry_id: int) -> None:
        """Start offloading every closed ledger before (ledger_id, entry_id) to the tier; 409 if
        an offload of the topic is running, 412 if the broker has no tier."""

    async def get_topic_offload_policies(self, topic: str) -> dict | None:
        """The topic's own offload policy fields (Pulsar's names), or null when unset."""

    async def set_topic_offload_policies(self, topic: str, policies: dict | None) -> None:
        """Set (a dict of Pulsar's OffloadPolicies fields; 400 if malformed) or remove (None)."""

    async def offload_status(self, topic: str) -> dict:
        """``{"status": "NOT_RUN|RUNNING|SUCCESS|ERROR", "lastError": str}`` of the last offload."""

    async def lake(self, topic: str) -> dict:
        """[lakehouse] The topic's Iceberg table: ``catalog`` (the catalog's URI), ``table``
        (``tenant.namespace.topic``), ``metadata_location`` (the current metadata file's URI;
        null before the first commit), ``snapshotId``, ``dataFiles``; 404 for an unknown topic,
        412 if the broker has no lake (``lake_enabled``)."""

    async def compact(self, topic: str) -> None:
        """Start a compaction of the topic (every partition of a partitioned one); 409 if one is
        running, 404 if the topic does not exist."""

    async def compaction_status(self, topic: str) -> dict:
        """Pulsar's LongRunningProcessStatus of the last compaction: ``{"status":
        "NOT_RUN|RUNNING|SUCCESS|ERROR", "lastError": str}`` (a partitioned topic: combined)."""

    async def unload_topic(self, topic: str) -> None:
        """Close the topic here (clients reconnect and look it up again); 404 if not served."""

    async def list_subscriptions(self, topic: str) -> list[str]:
        """404 if the topic does not exist."""

    async def create_subscription(self, topic: str, name: str, position: SubscriptionPosition) -> None:
        """Create a durable subscription at ``position``; 404 topic missing; 409 if it exists."""

    async def delete_subscription(self, topic: str, name: str, force: bool) -> None:
        """404 if missing; 412 if it has consumers and not ``force``."""

    async def reset_cursor_by_time(self, topic: str, subscription: str, timestamp_ms: int) -> None:
        """Move the subscription to the first message published at or after ``timestamp_ms``."""

    async def skip_messages(self, topic: str, subscription: str, count: int | None) -> int | None:
        """Acknowledge the subscription's next ``count`` unacknowledged messages (None: all)."""

    async def clear_backlog(self, topic: str) -> None:
        """Every durable subscription of the topic skips all its backlog."""

    async def lookup(self, topic: str, *, authoritative: bool = False, listener_name: str = "") -> LookupData:
        """The broker that owns (or will own) the topic (``authoritative``: asked because of a
        previous redirect; the broker may then take the topic's bundle itself); with
        ``listener_name``, that advertised listener's broker URLs (503 if unknown)."""

    async def last_message_id(self, topic: str) -> MessageIdData:
        """The id of the last confirmed entry (``{"ledgerId", "entryId", "partitionIndex"}``)."""

    async def terminate(self, topic: str) -> MessageIdData:
        """Pulsar's terminate: the topic takes no more messages, for good (until deleted); the
        last message id (``{"ledgerId", "entryId", "partitionIndex"}``), the same on a repeat;
        404 if the topic does not exist, 405 for a partitioned topic's parent, 503 while adds
        accepted before are still in flight."""

    async def terminate_partitioned(self, topic: str) -> dict[str, MessageIdData]:
        """Pulsar's terminatePartitionedTopic: terminate every partition (wherever it is served);
        ``{"<partition index>": last message id, ...}``; 404 if the topic is not partitioned."""

    async def console_cluster(self) -> dict:
        """The console's cluster page (broker/admin/console.py ``cluster_view``); optional: a
        backend without it has no console data routes."""

    async def console_topic(self, topic: str) -> dict:
        """The console's topic page: stats and segments, read from the owner by this broker."""

    async def topic_segments(self, topic: str) -> dict:
        """The console's topic segments (``{"topic", "loadedHere", "segmentsTotal", "segments"}``,
        broker/admin/console.py ``segments_view``); 404 if the topic does not exist."""

    async def read_entry(self, topic: str, ledger_id: int, entry_id: int) -> bytes:
        """The stored entry ``[u32 meta_size][MessageMetadata][payload]`` at (ledger_id,
        entry_id); 404 if the topic or the entry does not exist (never confirmed, trimmed), 405
        for a partitioned topic's parent (as Pulsar: ask a partition)."""


__all__ = ["AdminBackend", "ConsumerStats", "CursorStats", "InternalStats", "LedgerInfoStats", "LookupData",
           "MessageIdData", "PublisherStats", "SubscriptionPosition", "SubscriptionStats", "TopicStats",
           "lookup_data"]
