"""The broker's admin HTTP API: a subset of Pulsar's admin v2 REST paths with the same shapes,
the lookup path, and ``GET /metrics``.

``make_admin_app(backend)`` builds an aiohttp application; the broker implements
:class:`AdminBackend`. Policy routes go to ``backend.policies`` (a :class:`PolicyStore`), topic
routes to the backend's methods, ``/metrics`` renders ``backend.metrics``.

Conventions (Pulsar's): reads answer 200 with JSON; writes answer 204 without a body; errors are
``{"reason": "..."}`` with 400 (malformed input: unparsable JSON, wrong types, bad names), 404
(not found), 409 (already exists, not empty), 412 (value out of range, state forbids it), 503
(metadata store or bookies unavailable: retry), 500 (a bug; logged). Input is validated before
anything is called, so a 400 changed nothing. Bodies are limited to ``body_bytes_max``.

Topic names in paths are local names (percent-decoded by aiohttp); the backend receives full
names (``persistent://tenant/ns/topic``) and namespaces as ``tenant/ns``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any, Awaitable, Callable, Literal, Protocol, TypedDict, Union

from aiohttp import web

from broker.admin.metrics import BrokerMetrics
from broker.admin.serving import release_request_body
from broker.admin.subscriptions_http import add_subscription_routes, entry_answer
from broker.admin.policies import (BACKLOG_QUOTA_TYPES, PARTITIONS_MAX, AdminError, AutoTopicCreation, BacklogQuota,
                                   BadRequestError, ClusterData, NamespacePolicies, PolicyStore,
                                   PreconditionFailedError, RetentionPolicy, RolloverPolicy, TenantInfo,
                                   check_name)
from broker.schema_compat import CompatibilityStrategy
from broker.schemas import SchemaRegistry
from pulsarlite.errors import PulsarliteError
from pulsarlite.topic_name import (PARTITION_SUFFIX, InvalidTopicNameError, TopicDomain, TopicName,
                                   subscription_name_problem)

log = logging.getLogger(__name__)

BODY_BYTES_MAX = 1024 * 1024
_INT64_MAX = 2 ** 63 - 1


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


# -- request helpers ---------------------------------------------------------------------------
async def _json_body(request: web.Request, *, required: bool = True) -> Any:
    """The request's JSON body; BadRequestError (400) for anything a client got wrong: an
    unreadable body (a bad Content-Encoding such as broken gzip), an unknown charset, bytes that
    are not in the charset, malformed or too deeply nested JSON."""
    try:
        raw = await request.read()
    except web.HTTPException:
        raise                              # 413: too large (client_max_size)
    except Exception as e:
        raise BadRequestError(f"request body unreadable: {type(e).__name__}: {e}") from None
    charset = request.charset or "utf-8"
    try:
        text = raw.decode(charset)
    except LookupError:
        raise BadRequestError(f"unknown charset {charset!r}") from None
    except UnicodeDecodeError as e:
        raise BadRequestError(f"request body is not valid {charset}: {e.reason} at byte {e.start}") from None
    if not text.strip():
        if required:
            raise BadRequestError("request body is empty: a JSON value is required")
        return None
    try:
        return json.loads(text)
    except RecursionError:
        raise BadRequestError("JSON body nested too deeply") from None
    except ValueError as e:
        raise BadRequestError(f"malformed JSON body: {e}") from None


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(value), content_type="application/json")


def _no_content() -> web.Response:
    return web.Response(status=204)


def _bool_query(request: web.Request, name: str, default: bool = False) -> bool:
    value = request.query.get(name)
    if value is None or value == "":
        return default
    lowered = value.lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise BadRequestError(f"query parameter {name} must be true or false, got {value!r}")


def _int_value(what: str, value: Any, *, minimum: int, maximum: int = _INT64_MAX) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise BadRequestError(f"{what} must be an integer, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequestError(f"{what} must be an integer, got {value!r}")
    if not minimum <= value <= maximum:
        raise PreconditionFailedError(f"invalid value for {what}: {value} (must be in [{minimum}, {maximum}])")
    return value


def _namespace(request: web.Request) -> str:
    tenant = check_name("tenant", request.match_info["tenant"])
    ns = check_name("namespace", request.match_info["namespace"])
    return f"{tenant}/{ns}"


def _topic(request: web.Request, domain: TopicDomain = TopicDomain.PERSISTENT) -> str:
    try:
        name = TopicName(domain, request.match_info["tenant"], request.match_info["namespace"],
                         request.match_info["topic"])
    except InvalidTopicNameError as e:
        raise BadRequestError(str(e)) from None
    return str(name)


def _subscription_name(request: web.Request) -> str:
    name = request.match_info["subscription"]
    problem = subscription_name_problem(name)
    if problem is not None:
        raise BadRequestError(f"invalid subscription name: {problem}")
    return name


def _position(body: Any) -> SubscriptionPosition:
    """Pulsar sends a MessageId (``{"ledgerId", "entryId", ...}``; latest = both Long.MAX,
    earliest = both -1); we also take "earliest"/"latest". No body: latest."""
    if body is None:
        return "latest"
    if isinstance(body, str):
        if body in ("earliest", "latest"):
            return body  # type: ignore[return-value]
        raise BadRequestError(f"subscription position must be earliest, latest or a message id, got {body!r}")
    if not isinstance(body, dict):
        raise BadRequestError("subscription position must be a message id object")
    ledger_id = _int_value("ledgerId", body.get("ledgerId"), minimum=-1)
    entry_id = _int_value("entryId", body.get("entryId"), minimum=-1)
    if ledger_id == _INT64_MAX and entry_id == _INT64_MAX:
        return "latest"
    if ledger_id < 0 or entry_id < 0:
        if ledger_id == -1 and entry_id == -1:
            return "earliest"
        raise PreconditionFailedError(f"invalid message id {ledger_id}:{entry_id}")
    return (ledger_id, entry_id)


PARTITIONED_TOPIC_METADATA_MEDIA_TYPE = "application/vnd.partitioned-topic-metadata+json"
PROPERTIES_MAX = 1024                # entries of a partitioned topic's properties


def partitioned_topic_metadata(body: Any, *, partitions_max: int) -> tuple[int, dict[str, str] | None]:
    """The body of ``PUT .../partitions`` in the forms Pulsar's PersistentTopics accepts: the
    partition count (a JSON integer, or a numeric string as Jackson coerces it), or a
    PartitionedTopicMetadata object ``{"partitions": N, "properties": {str: str} | null}``
    (content type ``application/vnd.partitioned-topic-metadata+json``, what the Go admin client
    sends; taken whatever the content type says). Returns (partitions, properties or None);
    BadRequestError (400) for a malformed body, PreconditionFailedError (412) for a count out
    of [1, partitions_max]."""
    properties: dict[str, str] | None = None
    if isinstance(body, dict):
        unknown = set(body) - {"partitions", "properties", "deleted"}
        if unknown:
            raise BadRequestError(f"partitioned topic metadata: unknown fields {sorted(unknown)}")
        if "partitions" not in body:
            raise BadRequestError("partitioned topic metadata: partitions is required")
        raw = body.get("properties")
        if raw is not None:
            if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in raw.items()):
                raise BadRequestError("partitioned topic metadata: properties must map strings to strings")
            if len(raw) > PROPERTIES_MAX:
                raise BadRequestError(f"partitioned topic metadata: more than {PROPERTIES_MAX} properties")
            properties = dict(raw) or None
        body = body["partitions"]
    return _int_value("number of partitions", body, minimum=1, maximum=partitions_max), properties


# -- the application ---------------------------------------------------------------------------
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await _answer(request, handler)
    finally:
        release_request_body(request)    # a body cut off: no cyclic garbage holding it (serving.py)


async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except AdminError as e:
        return _json({"reason": str(e)}, status=e.http_status)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        reason = e.reason if e.text is None or e.text.startswith(f"{e.status}:") else e.text
        return _json({"reason": reason}, status=e.status)
    except PulsarliteError as e:
        if e.retriable:
            return _json({"reason": f"service unavailable, retry: {e}"}, status=503)
        log.exception("admin %s %s failed", request.method, request.path)
        return _json({"reason": f"internal error: {e}"}, status=500)
    except Exception as e:  # noqa: BLE001 - a bug; answered, logged
        log.exception("admin %s %s failed", request.method, request.path)
        return _json({"reason": f"internal error: {type(e).__name__}: {e}"}, status=500)


def make_admin_app(backend: AdminBackend, *, body_bytes_max: int = BODY_BYTES_MAX,
                   partitions_max: int = PARTITIONS_MAX) -> web.Application:
    if body_bytes_max <= 0 or partitions_max <= 0:
        raise ValueError("body_bytes_max and partitions_max must be > 0")
    # [security] authentication + authorization in front of every route when the broker has it on
    service = getattr(backend, "service", None)
    secured = getattr(getattr(service, "authentication", None), "enabled", False)
    middlewares = [_errors]
    if secured:
        from broker.security.http import make_security_middleware
        middlewares.append(make_security_middleware(service))   # inside _errors: its answers for failures
    app = web.Application(middlewares=middlewares, client_max_size=body_bytes_max)
    policies = lambda: backend.policies  # noqa: E731 - read at request time
    r = app.router

    # -- clusters ---------------------------------------------------------------------------
    async def list_clusters(request: web.Request) -> web.Response:
        return _json(await policies().list_clusters())

    async def get_cluster(request: web.Request) -> web.Response:
        data = await policies().get_cluster(check_name("cluster", request.match_info["cluster"]))
        return _json(data.to_json())

    async def put_cluster(request: web.Request) -> web.Response:
        cluster = check_name("cluster", request.match_info["cluster"])
        data = ClusterData.from_json(await _json_body(request, required=False) or {})
        await policies().create_cluster(cluster, data)
        return _no_content()

    async def post_cluster(request: web.Request) -> web.Response:
        cluster = check_name("cluster", request.match_info["cluster"])
        data = ClusterData.from_json(await _json_body(request))
        if data.empty:
            raise BadRequestError("cluster data: an update must set at least one URL (it replaces them all)")
        await policies().update_cluster(cluster, data)
        return _no_content()

    async def delete_cluster(request: web.Request) -> web.Response:
        await policies().delete_cluster(check_name("cluster", request.match_info["cluster"]))
        return _no_content()

    r.add_get("/admin/v2/clusters", list_clusters)
    r.add_get("/admin/v2/clusters/{cluster}", get_cluster)
    r.add_put("/admin/v2/clusters/{cluster}", put_cluster)
    r.add_post("/admin/v2/clusters/{cluster}", post_cluster)
    r.add_delete("/admin/v2/clusters/{cluster}", delete_cluster)

    # -- tenants ----------------------------------------------------------------------------
    async def list_tenants(request: web.Request) -> web.Response:
        return _json(await policies().list_tenants())

    async def get_tenant(request: web.Request) -> web.Response:
        info = await policies().get_tenant(check_name("tenant", request.match_info["tenant"]))
        return _json(info.to_json())

    async def put_tenant(request: web.Request) -> web.Response:
        tenant = check_name("tenant", request.match_info["tenant"])
        info = TenantInfo.from_json(await _json_body(request, required=False) or {})
        await policies().create_tenant(tenant, info)
        return _no_content()

    async def post_tenant(request: web.Request) -> web.Response:
        tenant = check_name("tenant", request.match_info["tenant"])
        info = TenantInfo.from_json(await _json_body(request))
        await policies().update_tenant(tenant, info)
        return _no_content()

    async def delete_tenant(request: web.Request) -> web.Response:
        await policies().delete_tenant(check_name("tenant", request.match_info["tenant"]))
        return _no_content()

    r.add_get("/admin/v2/tenants", list_tenants)
    r.add_get("/admin/v2/tenants/{tenant}", get_tenant)
    r.add_put("/admin/v2/tenants/{tenant}", put_tenant)
    r.add_post("/admin/v2/tenants/{tenant}", post_tenant)
    r.add_delete("/admin/v2/tenants/{tenant}", delete_tenant)

    # -- namespaces -------------------------------------------------------------------------
    async def list_namespaces(request: web.Request) -> web.Response:
        return _json(await policies().list_namespaces(check_name("tenant", request.match_info["tenant"])))

    async def get_namespace(request: web.Request) -> web.Response:
        found = await policies().get_namespace_policies(_namespace(request))
        return _json(found.to_json())

    async def put_namespace(request: web.Request) -> web.Response:
        namespace = _namespace(request)
        body = await _json_body(request, required=False)
        parsed = None if body is None else NamespacePolicies.from_json(body)
        await policies().create_namespace(namespace, parsed)
        return _no_content()

    async def delete_namespace(request: web.Request) -> web.Response:
        await policies().delete_namespace(_namespace(request))
        return _no_content()

    r.add_get("/admin/v2/namespaces/{tenant}", list_namespaces)
    r.add_get("/admin/v2/namespaces/{tenant}/{namespace}", get_namespace)
    r.add_put("/admin/v2/namespaces/{tenant}/{namespace}", put_namespace)
    r.add_delete("/admin/v2/namespaces/{tenant}/{namespace}", delete_namespace)

    def policy_routes(sub: str, *, get: Callable[[NamespacePolicies], Any],
                      parse: Callable[[Any], Any], apply: Callable[[NamespacePolicies, Any], NamespacePolicies],
                      clear: Any, write_methods: tuple[str, ...] = ("POST", "PUT")) -> None:
        """GET returns ``get(policies)``; POST/PUT parse the body and CAS-apply it; DELETE
        applies ``clear`` (back to the broker default)."""

        async def read(request: web.Request) -> web.Response:
            return _json(get(await policies().get_namespace_policies(_namespace(request))))

        async def write(request: web.Request) -> web.Response:
            namespace = _namespace(request)
            value = parse(await _json_body(request))
            await policies().update_namespace_policies(namespace, lambda p: apply(p, value))
            return _no_content()

        async def remove(request: web.Request) -> web.Response:
            namespace = _namespace(request)
            await policies().update_namespace_policies(namespace, lambda p: apply(p, clear))
            return _no_content()

        path = "/admin/v2/namespaces/{tenant}/{namespace}/" + sub
        r.add_get(path, read)
        for method in write_methods:
            r.add_route(method, path, write)
        r.add_delete(path, remove)

    def opt_json(value: Any) -> Any:
        return None if value is None else value.to_json()

    policy_routes("retention", get=lambda p: opt_json(p.retention), parse=RetentionPolicy.from_json,
                  apply=lambda p, v: replace(p, retention=v), clear=None)

    def parse_bool(value: Any) -> bool:
        if not isinstance(value, bool):
            raise BadRequestError(f"body must be true or false, got {value!r}")
        return value

    policy_routes("deduplication", get=lambda p: p.deduplication_enabled, parse=parse_bool,
                  apply=lambda p, v: replace(p, deduplication_enabled=v), clear=None)
    policy_routes("messageTTL", get=lambda p: p.message_ttl_s,
                  parse=lambda v: _int_value("message TTL", v, minimum=0),
                  apply=lambda p, v: replace(p, message_ttl_s=v), clear=None)
    policy_routes("offloadThreshold", get=lambda p: p.offload_threshold_bytes,
                  parse=lambda v: _int_value("offload threshold", v, minimum=-1),
                  apply=lambda p, v: replace(p, offload_threshold_bytes=v), clear=-1)
    policy_routes("compactionThreshold", get=lambda p: p.compaction_threshold_bytes,
                  parse=lambda v: _int_value("compaction threshold", v, minimum=0),
                  apply=lambda p, v: replace(p, compaction_threshold_bytes=v), clear=None)
    policy_routes("offloadThresholdInSeconds", get=lambda p: p.offload_threshold_s,
                  parse=lambda v: _int_value("offload threshold in seconds", v, minimum=-1),
                  apply=lambda p, v: replace(p, offload_threshold_s=v), clear=-1)
    policy_routes("offloadDeletionLagMs", get=lambda p: p.offload_deletion_lag_ms,
                  parse=lambda v: _int_value("offload deletion lag", v, minimum=0),
                  apply=lambda p, v: replace(p, offload_deletion_lag_ms=v), clear=None)
    policy_routes("autoTopicCreation", get=lambda p: opt_json(p.auto_topic_creation),
                  parse=AutoTopicCreation.from_json,
                  apply=lambda p, v: replace(p, auto_topic_creation=v), clear=None)
    policy_routes("rollover", get=lambda p: opt_json(p.rollover), parse=RolloverPolicy.from_json,
                  apply=lambda p, v: replace(p, rollover=v), clear=None)

    def parse_strategy(value: Any) -> str:
        try:
            return CompatibilityStrategy.parse(value).value
        except ValueError as e:
            raise PreconditionFailedError(str(e)) from None

    policy_routes("schemaCompatibilityStrategy", get=lambda p: p.schema_compatibility_strategy,
                  parse=parse_strategy, apply=lambda p, v: replace(p, schema_compatibility_strategy=v),
                  clear="UNDEFINED")
    policy_routes("isAllowAutoUpdateSchema", get=lambda p: p.is_allow_auto_update_schema, parse=parse_bool,
                  apply=lambda p, v: replace(p, is_allow_auto_update_schema=v), clear=True)

    # backlog quotas: GET .../backlogQuotaMap; POST/DELETE .../backlogQuota?backlogQuotaType=
    async def get_backlog_quotas(request: web.Request) -> web.Response:
        found = await policies().get_namespace_policies(_namespace(request))
        return _json({k: v.to_json() for k, v in sorted(found.backlog_quotas.items())})

    def quota_type(request: web.Request) -> str:
        kind = request.query.get("backlogQuotaType") or "destination_storage"
        if kind not in BACKLOG_QUOTA_TYPES:
            raise BadRequestError(f"backlogQuotaType must be one of {BACKLOG_QUOTA_TYPES}, got {kind!r}")
        return kind

    async def set_backlog_quota(request: web.Request) -> web.Response:
        namespace, kind = _namespace(request), quota_type(request)
        quota = BacklogQuota.from_json(await _json_body(request))
        await policies().update_namespace_policies(
            namespace, lambda p: replace(p, backlog_quotas={**p.backlog_quotas, kind: quota}))
        return _no_content()

    async def remove_backlog_quota(request: web.Request) -> web.Response:
        namespace, kind = _namespace(request), quota_type(request)
        await policies().update_namespace_policies(
            namespace, lambda p: replace(p, backlog_quotas={k: v for k, v in p.backlog_quotas.items() if k != kind}))
        return _no_content()

    r.add_get("/admin/v2/namespaces/{tenant}/{namespace}/backlogQuotaMap", get_backlog_quotas)
    r.add_post("/admin/v2/namespaces/{tenant}/{namespace}/backlogQuota", set_backlog_quota)
    r.add_delete("/admin/v2/namespaces/{tenant}/{namespace}/backlogQuota", remove_backlog_quota)

    # -- topics -----------------------------------------------------------------------------
    base = "/admin/v2/persistent/{tenant}/{namespace}"
    topic_base = base + "/{topic}"

    async def list_topics(request: web.Request) -> web.Response:
        return _json(await backend.list_topics(_namespace(request)))

    async def list_partitioned(request: web.Request) -> web.Response:
        return _json(await backend.list_partitioned_topics(_namespace(request)))

    async def create_topic(request: web.Request) -> web.Response:
        await backend.create_topic(_topic(request))
        return _no_content()

    async def delete_topic(request: web.Request) -> web.Response:
        topic, force = _topic(request), _bool_query(request, "force")
        await backend.delete_topic(topic, force)
        return _no_content()

    def partitions_of(body: Any) -> int:
        return _int_value("number of partitions", body, minimum=1, maximum=partitions_max)

    async def get_partitions(request: web.Request) -> web.Response:
        topic = _topic(request)
        metadata: dict[str, Any] = {"partitions": await backend.partitioned_metadata(topic)}
        if metadata["partitions"] > 0:
            properties = await backend.partitioned_topic_properties(topic)
            if properties:
                metadata["properties"] = properties
        return _json(metadata)

    async def redirect_to_owner(request: web.Request) -> None:
        """Like Pulsar's topic-ownership check: a call about a topic another broker owns is
        answered 307 with that broker's admin URL (``authoritative=true`` added, so the owner
        serves it rather than redirecting again)."""
        if _bool_query(request, "authoritative"):
            return
        non_persistent = request.path.startswith("/admin/v2/non-persistent/")
        url = await backend.admin_redirect_url(
            _topic(request, TopicDomain.NON_PERSISTENT if non_persistent else TopicDomain.PERSISTENT))
        if url is not None:
            raise web.HTTPTemporaryRedirect(url + str(request.rel_url.update_query(authoritative="true")))

    def at_owner(handler: Handler) -> Handler:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            await redirect_to_owner(request)
            return await handler(request)
        return wrapped

    async def create_partitioned(request: web.Request) -> web.Response:
        topic = _topic(request)
        n, properties = partitioned_topic_metadata(await _json_body(request), partitions_max=partitions_max)
        if TopicName.parse(topic).is_partition or PARTITION_SUFFIX in request.match_info["topic"]:
            raise PreconditionFailedError(f"partitioned topic name should not contain '{PARTITION_SUFFIX}'")
        await backend.create_partitioned_topic(topic, n, properties)
        return _no_content()

    async def update_partitioned(request: web.Request) -> web.Response:
        topic = _topic(request)
        n = partitions_of(await _json_body(request))
        await backend.update_partitioned_topic(topic, n)
        return _no_content()

    async def delete_partitioned(request: web.Request) -> web.Response:
        topic, force = _topic(request), _bool_query(request, "force")
        await backend.delete_partitioned_topic(topic, force)
        return _no_content()

    async def stats(request: web.Request) -> web.Response:
        return _json(await backend.topic_stats(_topic(request)))

    async def internal_stats(request: web.Request) -> web.Response:
        return _json(await backend.internal_stats(_topic(request)))

    async def partitioned_stats(request: web.Request) -> web.Response:
        topic, per_partition = _topic(request), _bool_query(request, "perPartition", default=True)
        return _json(await backend.partitioned_stats(topic, per_partition))

    async def unload(request: web.Request) -> web.Response:
        await backend.unload_topic(_topic(request))
        return _no_content()

    async def subscriptions(request: web.Request) -> web.Response:
        return _json(await backend.list_subscriptions(_topic(request)))

    async def create_subscription(request: web.Request) -> web.Response:
        topic, name = _topic(request), _subscription_name(request)
        position = _position(await _json_body(request, required=False))
        await backend.create_subscription(topic, name, position)
        return _no_content()

    async def delete_subscription(request: web.Request) -> web.Response:
        topic, name, force = _topic(request), _subscription_name(request), _bool_query(request, "force")
        await backend.delete_subscription(topic, name, force)
        return _no_content()

    async def reset_cursor(request: web.Request) -> web.Response:
        topic, name = _topic(request), _subscription_name(request)
        timestamp_ms = _int_value("timestamp", request.match_info["timestamp"], minimum=0)
        await backend.reset_cursor_by_time(topic, name, timestamp_ms)
        return _no_content()

    async def skip(request: web.Request) -> web.Response:
        count = _int_value("numMessages", request.match_info["count"], minimum=0)
        await backend.skip_messages(_topic(request), _subscription_name(request), count)
        return _no_content()

    async def skip_all(request: web.Request) -> web.Response:
        await backend.skip_messages(_topic(request), _subscription_name(request), None)
        return _no_content()

    async def clear_backlog(request: web.Request) -> web.Response:
        await backend.clear_backlog(_topic(request))
        return _no_content()

    async def last_message_id(request: web.Request) -> web.Response:
        return _json(await backend.last_message_id(_topic(request)))

    async def message_by_id(request: web.Request) -> web.Response:
        """Pulsar's getMessageById: the entry's payload with its metadata in X-Pulsar-* headers
        (broker/admin/messages_http.py); 404 if the topic has no such entry."""
        topic = _topic(request)
        ledger_id = _int_value("ledgerId", request.match_info["ledger"], minimum=0)
        entry_id = _int_value("entryId", request.match_info["entry"], minimum=0)
        return entry_answer(ledger_id, entry_id, await backend.read_entry(topic, ledger_id, entry_id), topic)

    async def lookup(request: web.Request) -> web.Response:
        # Pulsar's listener name: ?listenerName= or the X-Pulsar-ListenerName header
        listener_name = request.query.get("listenerName") or request.headers.get("X-Pulsar-ListenerName") or ""
        authoritative = _bool_query(request, "authoritative")    # Pulsar's: the broker chosen before acquires
        return _json(await backend.lookup(_topic(request), authoritative=authoritative, listener_name=listener_name))

    async def namespace_topics(request: web.Request) -> web.Response:
        """Pulsar's Namespaces.getTopics: ``mode`` PERSISTENT (default), NON_PERSISTENT or ALL;
        partitions by their partition names; non-persistent topics while loaded on a broker."""
        namespace = _namespace(request)
        mode = (request.query.get("mode") or "PERSISTENT").upper()
        if mode not in ("PERSISTENT", "NON_PERSISTENT", "ALL"):
            raise BadRequestError(f"mode must be PERSISTENT, NON_PERSISTENT or ALL, got {request.query['mode']!r}")
        _bool_query(request, "includeSystemTopic")        # accepted; there are no system topics
        return _json(await backend.list_topics(namespace, mode))

    # non-persistent topics (broker/nonpersistent.py): listing, stats, partitioned metadata
    np_base = "/admin/v2/non-persistent/{tenant}/{namespace}"
    np_topic_base = np_base + "/{topic}"

    def _np(request: web.Request) -> str:
        return _topic(request, TopicDomain.NON_PERSISTENT)

    async def np_list_topics(request: web.Request) -> web.Response:
        return _json(await backend.list_topics(_namespace(request), "NON_PERSISTENT"))

    async def np_stats(request: web.Request) -> web.Response:
        return _json(await backend.nonpersistent_stats(_np(request)))

    async def np_get_partitions(request: web.Request) -> web.Response:
        return _json({"partitions": await backend.partitioned_metadata(_np(request))})

    async def np_create_partitioned(request: web.Request) -> web.Response:
        topic = _np(request)
        n, properties = partitioned_topic_metadata(await _json_body(request), partitions_max=partitions_max)
        if PARTITION_SUFFIX in request.match_info["topic"]:
            raise PreconditionFailedError(f"partitioned topic name should not contain '{PARTITION_SUFFIX}'")
        await backend.create_partitioned_topic(topic, n, properties)
        return _no_content()

    r.add_get(np_base, np_list_topics)
    r.add_get(np_topic_base + "/stats", at_owner(np_stats))
    r.add_get(np_topic_base + "/partitions", np_get_partitions)
    r.add_put(np_topic_base + "/partitions", np_create_partitioned)

    r.add_get("/admin/v2/namespaces/{tenant}/{namespace}/topics", namespace_topics)
    r.add_get(base, list_topics)
    r.add_get(base + "/partitioned", list_partitioned)
    r.add_put(topic_base, create_topic)
    r.add_delete(topic_base, at_owner(delete_topic))
    r.add_get(topic_base + "/partitions", get_partitions)
    r.add_put(topic_base + "/partitions", create_partitioned)
    r.add_post(topic_base + "/partitions", update_partitioned)
    r.add_delete(topic_base + "/partitions", delete_partitioned)
    r.add_get(topic_base + "/stats", at_owner(stats))
    r.add_get(topic_base + "/internalStats", at_owner(internal_stats))
    r.add_get(topic_base + "/partitioned-stats", partitioned_stats)
    r.add_put(topic_base + "/unload", at_owner(unload))
    r.add_get(topic_base + "/subscriptions", at_owner(subscriptions))
    r.add_put(topic_base + "/subscription/{subscription}", at_owner(create_subscription))
    r.add_delete(topic_base + "/subscription/{subscription}", at_owner(delete_subscription))
    r.add_post(topic_base + "/subscription/{subscription}/resetcursor/{timestamp}", at_owner(reset_cursor))
    r.add_post(topic_base + "/subscription/{subscription}/skip/{count}", at_owner(skip))
    r.add_post(topic_base + "/subscription/{subscription}/skip_all", at_owner(skip_all))
    r.add_post(topic_base + "/clearBacklog", at_owner(clear_backlog))
    r.add_get(topic_base + "/lastMessageId", at_owner(last_message_id))
    r.add_get(topic_base + "/ledger/{ledger}/entry/{entry}", at_owner(message_by_id))
    # expire, reset to a message id, peek, examine (broker/admin/subscriptions_http.py)
    add_subscription_routes(app, backend, topic_base=topic_base, topic_of=_topic, subscription_of=_subscription_name,
                            json_body=_json_body, int_value=_int_value, at_owner=at_owner)

    async def terminate(request: web.Request) -> web.Response:
        return _json(await backend.terminate(_topic(request)))

    r.add_post(topic_base + "/terminate", at_owner(terminate))

    async def terminate_partitioned(request: web.Request) -> web.Response:
        return _json(await backend.terminate_partitioned(_topic(request)))

    r.add_post(topic_base + "/terminate/partitions", terminate_partitioned)

    async def offload(request: web.Request) -> web.Response:
        """Pulsar's trigger: offload every closed ledger before the message id in the body."""
        topic = _topic(request)
        body = await _json_body(request)
        if not isinstance(body, dict):
            raise BadRequestError("body must be a message id: {\"ledgerId\": L, \"entryId\": E}")
        ledger_id = _int_value("ledgerId", body.get("ledgerId"), minimum=0)
        entry_id = _int_value("entryId", body.get("entryId"), minimum=-1)
        await backend.offload(topic, ledger_id, entry_id)
        return _no_content()

    async def offload_status(request: web.Request) -> web.Response:
        return _json(await backend.offload_status(_topic(request)))

    async def compact(request: web.Request) -> web.Response:
        await backend.compact(_topic(request))
        return _no_content()

    async def compaction_status(request: web.Request) -> web.Response:
        return _json(await backend.compaction_status(_topic(request)))

    r.add_put(topic_base + "/compaction", at_owner(compact))
    r.add_get(topic_base + "/compaction", at_owner(compaction_status))
    r.add_put(topic_base + "/offload", at_owner(offload))
    r.add_get(topic_base + "/offload", at_owner(offload_status))

    async def lake(request: web.Request) -> web.Response:
        return _json(await backend.lake(_topic(request)))

    # any broker of the cluster answers: it reads the shared catalog, not the owner's state
    r.add_get(topic_base + "/lake", lake)

    async def get_offload_policies(request: web.Request) -> web.Response:
        return _json(await backend.get_topic_offload_policies(_topic(request)))

    async def set_offload_policies(request: web.Request) -> web.Response:
        topic = _topic(request)
        body = await _json_body(request)
        if not isinstance(body, dict):
            raise BadRequestError("offload policies must be a JSON object")
        await backend.set_topic_offload_policies(topic, body)
        return _no_content()

    async def remove_offload_policies(request: web.Request) -> web.Response:
        await backend.set_topic_offload_policies(_topic(request), None)
        return _no_content()

    r.add_get(topic_base + "/offloadPolicies", get_offload_policies)
    r.add_post(topic_base + "/offloadPolicies", set_offload_policies)
    r.add_put(topic_base + "/offloadPolicies", set_offload_policies)
    r.add_delete(topic_base + "/offloadPolicies", remove_offload_policies)
    r.add_get("/lookup/v2/topic/persistent/{tenant}/{namespace}/{topic}", lookup)

    async def lookup_np(request: web.Request) -> web.Response:
        listener_name = request.query.get("listenerName") or request.headers.get("X-Pulsar-ListenerName") or ""
        return _json(await backend.lookup(_topic(request, TopicDomain.NON_PERSISTENT),
                                          authoritative=_bool_query(request, "authoritative"),
                                          listener_name=listener_name))

    r.add_get("/lookup/v2/topic/non-persistent/{tenant}/{namespace}/{topic}", lookup_np)

    # -- the web console (broker/admin/console.py): static files at / and /console/<file>, served
    # without authentication (they hold no data); its data calls are admin routes like any other
    from broker.admin.console import static_file

    async def console_file(request: web.Request) -> web.Response:
        found = static_file(request.match_info.get("name", "index.html"))
        if found is None:
            raise web.HTTPNotFound(text="no such console file")
        body, content_type = found
        return web.Response(body=body, content_type=content_type, headers={
            "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"})

    r.add_get("/", console_file)
    r.add_get("/console/{name}", console_file)

    async def console_cluster(request: web.Request) -> web.Response:
        return _json(await backend.console_cluster())

    async def topic_segments(request: web.Request) -> web.Response:
        return _json(await backend.topic_segments(_topic(request)))

    async def console_topic(request: web.Request) -> web.Response:
        return _json(await backend.console_topic(_topic(request)))

    if hasattr(backend, "console_cluster"):
        r.add_get("/admin/v2/console/cluster", console_cluster)
        r.add_get(topic_base + "/segments", at_owner(topic_segments))
        r.add_get(topic_base + "/console", console_topic)          # asks the owner itself

    # -- where the metadata store and the tier are (spark_source reads with only admin_url) -------
    async def pulsarlite_metadata(request: web.Request) -> web.Response:
        return _json(backend.metadata_locations())

    if hasattr(backend, "metadata_locations"):
        r.add_get("/admin/v2/pulsarlite/metadata", pulsarlite_metadata)     # superusers (not a tenant route)

    # -- metrics ----------------------------------------------------------------------------
    async def metrics(request: web.Request) -> web.Response:
        body, content_type = backend.metrics.render(request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})

    r.add_get("/metrics", metrics)
    # -- [security] permissions (routes in broker/security/http.py) -----------------------------
    from broker.security.http import add_permission_routes
    add_permission_routes(app, policies, json_body=_json_body, topic_of=_topic)
    # -- schemas (routes in schemas_http.py) -------------------------------------------------
    if backend.schemas is not None:
        from broker.admin.schemas_http import add_schema_routes
        add_schema_routes(app, lambda: backend.schemas, topic_of=_topic, json_body=_json_body,
                          json_response=_json)

    return app


__all__ = ["AdminBackend", "make_admin_app", "TopicStats", "SubscriptionStats", "ConsumerStats",
           "PublisherStats", "InternalStats", "LedgerInfoStats", "CursorStats", "LookupData", "lookup_data",
           "MessageIdData", "SubscriptionPosition", "BODY_BYTES_MAX", "PARTITIONS_MAX",
           "partitioned_topic_metadata", "PARTITIONED_TOPIC_METADATA_MEDIA_TYPE"]
