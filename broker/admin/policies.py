"""Clusters, tenants and namespace policies in ZooKeeper (docs/protocol.md#zookeeper-layout), shaped
like Pulsar's.

Layout::

    /admin/clusters/<cluster>          ClusterData: {"serviceUrl", "serviceUrlTls",
                                                     "brokerServiceUrl", "brokerServiceUrlTls"}
    /admin/policies/<tenant>           TenantInfo:  {"adminRoles": [...], "allowedClusters": [...]}
    /admin/policies/<tenant>/<ns>      Policies (Pulsar's JSON names, see NamespacePolicies)

Every write is a create (fails if present) or a compare-and-set through
:meth:`MetadataStore.update` with a pure transform; validation happens before anything is
written, so bad input changes nothing.

Decisions (where Pulsar's behaviour is the model):

- Names (cluster, tenant, namespace) match Pulsar's ``^[-=:.\\w]+$``, are at most
  ``NAME_CHARS_MAX`` characters and never ``.``/``..``.
- A namespace is created with ``make_parents=False`` under its tenant's znode, so a namespace can
  never appear under a tenant that is missing or being deleted; a tenant's znode is deleted
  non-recursively, so a tenant with namespaces cannot be deleted (409) - both atomic in ZooKeeper.
- Deleting a namespace first sets ``"deleted": true`` in its policies (CAS), then lists its
  topics through the ``list_topics`` callback; if there are any, the flag is cleared again and
  the delete is refused (409). The broker must refuse to create topics (admin or auto-created) in
  a namespace whose policies say ``deleted`` (:meth:`PolicyStore.get_namespace_policies` then
  raises NotFoundError), which closes the race between the check and the delete. If the broker
  dies between the mark and the delete, the namespace reads as missing and a repeated DELETE
  completes the deletion.
- A cluster is refused deletion (412) while a tenant lists it in ``allowedClusters`` (this check
  is not atomic with the delete; a tenant created concurrently may name a deleted cluster).
- Unknown JSON keys in Policies/TenantInfo/ClusterData bodies are ignored (Pulsar's clients send
  whole objects with fields we do not implement); known keys with a wrong type are a 400, values
  out of range a 412 (as Pulsar answers), and nothing is written.
- ``None`` in a policy means "not set: the broker's default applies", as in Pulsar.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Iterable
from urllib.parse import unquote_plus

from broker.schema_compat import CompatibilityStrategy
from broker.errors import BrokerError
from broker.security.authorization import AuthPolicies, PermissionError_
from pulsarlite.errors import MetadataNotFoundError
from pulsarlite import metadata_layout as layout
from pulsarlite.metadata import MetadataExistsError, MetadataNotEmptyError, MetadataStore
from pulsarlite.metadata_layout import CLUSTERS_ROOT, POLICIES_ROOT, managed_ledgers_of_namespace_path

DEFAULT_CLUSTER = "standalone"
DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "public/default"

NAME_CHARS_MAX = 128
ROLES_MAX = 256
_NAME_RE = re.compile(r"^[-=:.\w]+$", re.ASCII)
_INT64_MAX = 2 ** 63 - 1


# -- errors (the HTTP layer maps ``http_status``; the broker's AdminBackend raises them too) ----
class AdminError(BrokerError):
    """An admin operation refused; ``http_status`` is Pulsar's status code for it."""

    http_status = 500


class BadRequestError(AdminError):
    """Malformed input: unparsable JSON, wrong types, invalid names."""

    http_status = 400


class NotFoundError(AdminError):
    http_status = 404


class ConflictError(AdminError):
    """Already exists, or not empty (tenant with namespaces, namespace with topics)."""

    http_status = 409


class PreconditionFailedError(AdminError):
    """A well-formed value out of its range, or an operation the current state forbids."""

    http_status = 412


class MethodNotAllowedError(AdminError):
    """An operation Pulsar refuses on this kind of resource (terminating a partitioned topic)."""

    http_status = 405


# -- names ---------------------------------------------------------------------------------
def check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequestError(f"{what} name must be a non-empty string, got {value!r}")
    if len(value) > NAME_CHARS_MAX:
        raise BadRequestError(f"{what} name longer than {NAME_CHARS_MAX} characters: {value[:40]!r}...")
    if value in (".", "..") or not _NAME_RE.match(value):
        raise BadRequestError(f"invalid {what} name {value!r}: use letters, digits, '-', '=', ':', '.', '_'")
    return value


def split_namespace(namespace: str) -> tuple[str, str]:
    """'tenant/ns' -> ('tenant', 'ns'), both names checked (BadRequestError)."""
    if not isinstance(namespace, str) or namespace.count("/") != 1:
        raise BadRequestError(f"namespace must be 'tenant/namespace', got {namespace!r}")
    tenant, ns = namespace.split("/")
    return check_name("tenant", tenant), check_name("namespace", ns)


def cluster_path(cluster: str) -> str:
    return layout.cluster_path(check_name('cluster', cluster))


def tenant_path(tenant: str) -> str:
    return layout.tenant_path(check_name('tenant', tenant))


def namespace_path(namespace: str) -> str:
    return layout.namespace_policies_path(*split_namespace(namespace))


# -- value checks --------------------------------------------------------------------------
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]{1,19}")


def _int(what: str, value: object, *, minimum: int, allow_none: bool = False,
         maximum: int = None) -> int | None:
    """An integer field; a string holding an integer is taken too, as Pulsar's Jackson
    coerces it (``{"limit": "10240"}``, what pulsar-admin-go sends)."""
    if value is None and allow_none:
        return None
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value.strip()):
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequestError(f"{what} must be an integer, got {value!r}")
    top = _INT64_MAX if maximum is None else maximum
    if value < minimum or value > top:
        raise PreconditionFailedError(f"invalid value for {what}: {value} (must be in [{minimum}, {top}])")
    return value


def _bool(what: str, value: object, *, allow_none: bool = False) -> bool | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        raise BadRequestError(f"{what} must be true or false, got {value!r}")
    return value


def _obj(what: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequestError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _str_list(what: str, value: object, *, names: bool, items_max: int = ROLES_MAX) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise BadRequestError(f"{what} must be a list of strings, got {value!r}")
    if len(value) > items_max:
        raise BadRequestError(f"{what}: at most {items_max} items")
    if names:
        for v in value:
            check_name(what, v)
    return tuple(dict.fromkeys(value))  # de-duplicated, order kept


def _load_json(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        raise AdminError(f"{what}: stored JSON is corrupt") from None
    if not isinstance(value, dict):
        raise AdminError(f"{what}: stored JSON is not an object")
    return value


def _dump(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


# -- clusters and tenants --------------------------------------------------------------------
@dataclass(frozen=True)
class ClusterData:
    service_url: str = ""
    service_url_tls: str = ""
    broker_service_url: str = ""
    broker_service_url_tls: str = ""

    _KEYS = (("serviceUrl", "service_url"), ("serviceUrlTls", "service_url_tls"),
             ("brokerServiceUrl", "broker_service_url"), ("brokerServiceUrlTls", "broker_service_url_tls"))

    @classmethod
    def from_json(cls, raw: object) -> "ClusterData":
        raw = _obj("cluster data", raw)
        kwargs = {}
        for key, attr in cls._KEYS:
            value = raw.get(key)
            if value is None:
                continue
            if not isinstance(value, str) or len(value) > 1024:
                raise BadRequestError(f"cluster data: {key} must be a string (at most 1024 characters)")
            if value:
                _check_service_url(key, value, cls._SCHEMES[key])
            kwargs[attr] = value
        return cls(**kwargs)

    _SCHEMES = {"serviceUrl": ("http",), "serviceUrlTls": ("https",),
                "brokerServiceUrl": ("pulsar",), "brokerServiceUrlTls": ("pulsar+ssl",)}

    @property
    def empty(self) -> bool:
        return not any(getattr(self, attr) for _, attr in self._KEYS)

    def to_json(self) -> dict[str, Any]:
        return {key: getattr(self, attr) for key, attr in self._KEYS}


def _check_service_url(key: str, value: str, schemes: tuple[str, ...]) -> None:
    """``scheme://host[:port][,host[:port]...]`` with the scheme Pulsar uses for that key (a
    ``javascript:`` or schemeless URL would be handed to clients and consoles)."""
    scheme, sep, rest = value.partition("://")
    hosts = rest.split("/", 1)[0]
    if not sep or scheme.lower() not in schemes or not hosts or any(
            not h or h.startswith(":") or any(ch.isspace() or ch in "<>\"'`" for ch in h) for h in hosts.split(",")):
        raise BadRequestError(f"cluster data: {key} must look like {schemes[0]}://host:port, got {value!r}")


@dataclass(frozen=True)
class TenantInfo:
    admin_roles: tuple[str, ...] = ()
    allowed_clusters: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, raw: object) -> "TenantInfo":
        raw = _obj("tenant info", raw)
        return cls(admin_roles=_str_list("adminRoles", raw.get("adminRoles"), names=False),
                   allowed_clusters=_str_list("allowedClusters", raw.get("allowedClusters"), names=True))

    def to_json(self) -> dict[str, Any]:
        return {"adminRoles": list(self.admin_roles), "allowedClusters": list(self.allowed_clusters)}


# -- namespace policies ----------------------------------------------------------------------
@dataclass(frozen=True)
class RetentionPolicy:
    """Pulsar's RetentionPolicies: -1 infinite, 0 no retention; both 0 or both non-zero."""

    time_minutes: int
    size_mb: int

    @classmethod
    def from_json(cls, raw: object) -> "RetentionPolicy":
        raw = _obj("retention policies", raw)
        time_minutes = _int("retentionTimeInMinutes", raw.get("retentionTimeInMinutes", 0), minimum=-1)
        size_mb = _int("retentionSizeInMB", raw.get("retentionSizeInMB", 0), minimum=-1)
        if (time_minutes == 0) != (size_mb == 0):
            raise PreconditionFailedError(
                "invalid retention policy: retentionTimeInMinutes and retentionSizeInMB must be "
                "both zero or both non-zero")
        return cls(time_minutes, size_mb)

    def to_json(self) -> dict[str, Any]:
        return {"retentionTimeInMinutes": self.time_minutes, "retentionSizeInMB": self.size_mb}


BACKLOG_QUOTA_TYPES = ("destination_storage", "message_age")
BACKLOG_QUOTA_POLICIES = ("producer_request_hold", "producer_exception", "consumer_backlog_eviction")


@dataclass(frozen=True)
class BacklogQuota:
    """Pulsar's BacklogQuota: limitSize bytes (-1 none), limitTime seconds (-1 none), policy."""

    limit_bytes: int = -1
    limit_time_s: int = -1
    policy: str = "producer_request_hold"

    @classmethod
    def from_json(cls, raw: object) -> "BacklogQuota":
        raw = _obj("backlog quota", raw)
        limit = raw.get("limitSize", raw.get("limit", -1))  # "limit": Pulsar's legacy name
        policy = raw.get("policy", "producer_request_hold")
        if not isinstance(policy, str):
            raise BadRequestError(f"backlog quota policy must be a string, got {policy!r}")
        if policy not in BACKLOG_QUOTA_POLICIES:
            raise PreconditionFailedError(f"invalid backlog quota policy {policy!r}: one of {BACKLOG_QUOTA_POLICIES}")
        return cls(limit_bytes=_int("limitSize", limit, minimum=-1),
                   limit_time_s=_int("limitTime", raw.get("limitTime", -1), minimum=-1), policy=policy)

    def to_json(self) -> dict[str, Any]:
        return {"limitSize": self.limit_bytes, "limitTime": self.limit_time_s, "policy": self.policy}


@dataclass(frozen=True)
class RolloverPolicy:
    """Ours: per-namespace rollover limits of the current ledger; None = the broker's default."""

    entries_max: int | None = None
    bytes_max: int | None = None
    age_ms_max: int | None = None

    @classmethod
    def from_json(cls, raw: object) -> "RolloverPolicy":
        raw = _obj("rollover policies", raw)
        return cls(entries_max=_int("max_entries", raw.get("max_entries"), minimum=1, allow_none=True),
                   bytes_max=_int("max_bytes", raw.get("max_bytes"), minimum=1, allow_none=True),
                   age_ms_max=_int("max_age_ms", raw.get("max_age_ms"), minimum=1, allow_none=True))

    def to_json(self) -> dict[str, Any]:
        return {"max_entries": self.entries_max, "max_bytes": self.bytes_max, "max_age_ms": self.age_ms_max}


TOPIC_TYPES = ("non-partitioned", "partitioned")


PARTITIONS_MAX = 4096     # partitions of a topic, explicit or auto-created


@dataclass(frozen=True)
class AutoTopicCreation:
    """Pulsar's AutoTopicCreationOverride."""

    allow: bool
    topic_type: str = "non-partitioned"
    default_partitions: int | None = None

    @classmethod
    def from_json(cls, raw: object) -> "AutoTopicCreation":
        raw = _obj("autoTopicCreationOverride", raw)
        allow = _bool("allowAutoTopicCreation", raw.get("allowAutoTopicCreation"))
        topic_type = raw.get("topicType", "non-partitioned")
        if topic_type not in TOPIC_TYPES:
            raise PreconditionFailedError(f"invalid topicType {topic_type!r}: one of {TOPIC_TYPES}")
        # as many as an explicit partitioned topic may have: one lookup creates them all
        partitions = _int("defaultNumPartitions", raw.get("defaultNumPartitions"), minimum=1, allow_none=True,
                          maximum=PARTITIONS_MAX)
        if topic_type == "partitioned" and allow and partitions is None:
            raise PreconditionFailedError("defaultNumPartitions is required when topicType is partitioned")
        return cls(allow=allow, topic_type=topic_type,
                   default_partitions=partitions if topic_type == "partitioned" else None)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"allowAutoTopicCreation": self.allow, "topicType": self.topic_type}
        if self.default_partitions is not None:
            out["defaultNumPartitions"] = self.default_partitions
        return out


@dataclass(frozen=True)
class NamespacePolicies:
    """A namespace's policies; ``to_json``/``from_json`` use Pulsar's Policies names."""

    replication_clusters: tuple[str, ...] = ()
    retention: RetentionPolicy | None = None
    deduplication_enabled: bool | None = None
    message_ttl_s: int | None = None
    backlog_quotas: dict[str, BacklogQuota] = field(default_factory=dict)  # by BACKLOG_QUOTA_TYPES
    offload_threshold_bytes: int = -1        # -1: offload by size disabled
    offload_threshold_s: int = -1            # -1: offload by age disabled
    offload_deletion_lag_ms: int | None = None
    compaction_threshold_bytes: int | None = None   # Pulsar's compactionThreshold; None/0: off
    rollover: RolloverPolicy | None = None
    auto_topic_creation: AutoTopicCreation | None = None
    schema_compatibility_strategy: str = "UNDEFINED"   # broker/schema_compat.py CompatibilityStrategy
    is_allow_auto_update_schema: bool = True           # producers may add new schema versions
    deleted: bool = False                    # set while a delete is in progress
    # [security] permissions (roles -> actions; broker/security/authorization.py), changed only
    # through the permission paths
    auth_policies: AuthPolicies = field(default_factory=AuthPolicies)

    @classmethod
    def from_json(cls, raw: object) -> "NamespacePolicies":
        raw = _obj("policies", raw)
        quotas_raw = raw.get("backlog_quota_map") or {}
        quotas_raw = _obj("backlog_quota_map", quotas_raw)
        quotas = {}
        for kind, quota in quotas_raw.items():
            if kind not in BACKLOG_QUOTA_TYPES:
                raise PreconditionFailedError(f"invalid backlog quota type {kind!r}: one of {BACKLOG_QUOTA_TYPES}")
            quotas[kind] = BacklogQuota.from_json(quota)

        def optional(key: str, parse: Callable[[object], Any]) -> Any:
            value = raw.get(key)
            return None if value is None else parse(value)

        return cls(
            replication_clusters=_str_list("replication_clusters", raw.get("replication_clusters"), names=True),
            retention=optional("retention_policies", RetentionPolicy.from_json),
            deduplication_enabled=_bool("deduplicationEnabled", raw.get("deduplicationEnabled"), allow_none=True),
            message_ttl_s=_int("message_ttl_in_seconds", raw.get("message_ttl_in_seconds"), minimum=0,
                               allow_none=True),
            backlog_quotas=quotas,
            offload_threshold_bytes=_int("offload_threshold", _default(raw, "offload_threshold", -1), minimum=-1),
            offload_threshold_s=_int("offload_threshold_in_seconds",
                                     _default(raw, "offload_threshold_in_seconds", -1), minimum=-1),
            offload_deletion_lag_ms=_int("offload_deletion_lag_ms", raw.get("offload_deletion_lag_ms"),
                                         minimum=0, allow_none=True),
            compaction_threshold_bytes=_int("compaction_threshold", raw.get("compaction_threshold"),
                                            minimum=0, allow_none=True),
            rollover=optional("rollover_policies", RolloverPolicy.from_json),
            auto_topic_creation=optional("autoTopicCreationOverride", AutoTopicCreation.from_json),
            schema_compatibility_strategy=_strategy(_default(raw, "schema_compatibility_strategy", "UNDEFINED")),
            is_allow_auto_update_schema=bool(_bool("is_allow_auto_update_schema",
                                                   _default(raw, "is_allow_auto_update_schema", True))),
            deleted=bool(_bool("deleted", raw.get("deleted", False))),
            auth_policies=_auth_policies(raw.get("auth_policies")),
        )

    def to_json(self) -> dict[str, Any]:
        def opt(value: Any) -> Any:
            return None if value is None else value.to_json()

        return {
            "replication_clusters": list(self.replication_clusters),
            "retention_policies": opt(self.retention),
            "deduplicationEnabled": self.deduplication_enabled,
            "message_ttl_in_seconds": self.message_ttl_s,
            "backlog_quota_map": {k: v.to_json() for k, v in sorted(self.backlog_quotas.items())},
            "offload_threshold": self.offload_threshold_bytes,
            "offload_threshold_in_seconds": self.offload_threshold_s,
            "offload_deletion_lag_ms": self.offload_deletion_lag_ms,
            "compaction_threshold": self.compaction_threshold_bytes,
            "rollover_policies": opt(self.rollover),
            "autoTopicCreationOverride": opt(self.auto_topic_creation),
            "schema_compatibility_strategy": self.schema_compatibility_strategy,
            "is_allow_auto_update_schema": self.is_allow_auto_update_schema,
            "deleted": self.deleted,
            "auth_policies": self.auth_policies.to_json(),
        }


def _auth_policies(raw: object) -> AuthPolicies:
    try:
        return AuthPolicies.from_json(raw)
    except PermissionError_ as e:
        raise BadRequestError(f"auth_policies: {e}") from None


def _strategy(value: object) -> str:
    try:
        return CompatibilityStrategy.parse(value).value
    except ValueError as e:
        raise PreconditionFailedError(str(e)) from None


def _default(raw: dict[str, Any], key: str, default: Any) -> Any:
    value = raw.get(key)
    return default if value is None else value


TopicLister = Callable[[str], Awaitable[list[str]]]
PolicyTransform = Callable[[NamespacePolicies], NamespacePolicies]


class PolicyStore:
    """Clusters, tenants and namespace policies over a :class:`MetadataStore`.

    ``list_topics(namespace) -> [topic names]`` tells whether a namespace may be deleted; by
    default it lists the namespace's managed ledgers (``/managed-ledgers/<t>/<ns>/persistent``).
    A broker that also keeps partitioned-topic metadata elsewhere should pass its own lister.
    """

    def __init__(self, store: MetadataStore, *, list_topics: TopicLister | None = None) -> None:
        self._store = store
        self._list_topics = list_topics or self._list_managed_ledgers

    async def _list_managed_ledgers(self, namespace: str) -> list[str]:
        tenant, ns = split_namespace(namespace)
        names = await self._store.children(managed_ledgers_of_namespace_path(tenant, ns))
        return [f"persistent://{tenant}/{ns}/{unquote_plus(name)}" for name in names]

    # -- defaults ------------------------------------------------------------------------------
    async def ensure_defaults(self, *, cluster: str = DEFAULT_CLUSTER, service_url: str = "",
                              broker_service_url: str = "") -> None:
        """Create the cluster, tenant ``public`` and namespace ``public/default`` if missing (as
        Pulsar standalone does). Idempotent and safe when several brokers start at once; never
        overwrites what exists."""
        for create in (lambda: self.create_cluster(cluster, ClusterData(service_url=service_url,
                                                                        broker_service_url=broker_service_url)),
                       lambda: self.create_tenant(DEFAULT_TENANT, TenantInfo(allowed_clusters=(cluster,))),
                       lambda: self.create_namespace(DEFAULT_NAMESPACE)):
            try:
                await create()
            except ConflictError:
                pass

    # -- clusters ------------------------------------------------------------------------------
    async def list_clusters(self) -> list[str]:
        return await self._store.children(CLUSTERS_ROOT)

    async def get_cluster(self, cluster: str) -> ClusterData:
        found = await self._store.get_or_none(cluster_path(cluster))
        if found is None:
            raise NotFoundError(f"Cluster {cluster} does not exist")
        return ClusterData.from_json(_load_json(found[0], f"cluster {cluster}"))

    async def create_cluster(self, cluster: str, data: ClusterData) -> None:
        try:
            await self._store.create(cluster_path(cluster), _dump(data.to_json()))
        except MetadataExistsError:
            raise ConflictError(f"Cluster {cluster} already exists") from None

    async def update_cluster(self, cluster: str, data: ClusterData) -> None:
        path = cluster_path(cluster)

        def transform(current: bytes | None) -> bytes:
            if current is None:
                raise NotFoundError(f"Cluster {cluster} does not exist")
            return _dump(data.to_json())

        await self._store.update(path, transform)

    async def delete_cluster(self, cluster: str) -> None:
        path = cluster_path(cluster)
        if not await self._store.exists(path):
            raise NotFoundError(f"Cluster {cluster} does not exist")
        for tenant in await self.list_tenants():
            try:
                info = await self.get_tenant(tenant)
            except NotFoundError:
                continue
            if cluster in info.allowed_clusters:
                raise PreconditionFailedError(f"Cluster {cluster} is still used by tenant {tenant}")
        try:
            await self._store.delete(path)
        except MetadataNotFoundError:
            raise NotFoundError(f"Cluster {cluster} does not exist") from None

    async def _check_clusters_exist(self, clusters: Iterable[str]) -> None:
        known = set(await self.list_clusters())
        missing = [c for c in clusters if c not in known]
        if missing:
            raise PreconditionFailedError(f"Clusters do not exist: {', '.join(missing)}")

    # -- tenants -------------------------------------------------------------------------------
    async def list_tenants(self) -> list[str]:
        return await self._store.children(POLICIES_ROOT)

    async def get_tenant(self, tenant: str) -> TenantInfo:
        found = await self._store.get_or_none(tenant_path(tenant))
        if found is None or not found[0]:
            raise NotFoundError(f"Tenant {tenant} does not exist")
        return TenantInfo.from_json(_load_json(found[0], f"tenant {tenant}"))

    async def create_tenant(self, tenant: str, info: TenantInfo) -> None:
        path = tenant_path(tenant)
        await self._check_clusters_exist(info.allowed_clusters)
        try:
            await self._store.create(path, _dump(info.to_json()))
        except MetadataExistsError:
            raise ConflictError(f"Tenant {tenant} already exists") from None

    async def update_tenant(self, tenant: str, info: TenantInfo) -> None:
        path = tenant_path(tenant)
        await self._check_clusters_exist(info.allowed_clusters)

        def transform(current: bytes | None) -> bytes:
            if not current:
                raise NotFoundError(f"Tenant {tenant} does not exist")
            return _dump(info.to_json())

        await self._store.update(path, transform)

    async def delete_tenant(self, tenant: str) -> None:
        path = tenant_path(tenant)
        try:
            await self._store.delete(path)
        except MetadataNotFoundError:
            raise NotFoundError(f"Tenant {tenant} does not exist") from None
        except MetadataNotEmptyError:
            raise ConflictError(f"The tenant {tenant} still has active namespaces") from None

    # -- namespaces ----------------------------------------------------------------------------
    async def list_namespaces(self, tenant: str) -> list[str]:
        """['tenant/ns', ...]; NotFoundError if the tenant does not exist."""
        await self.get_tenant(tenant)
        return [f"{tenant}/{ns}" for ns in await self._store.children(tenant_path(tenant))]

    async def namespace_exists(self, namespace: str) -> bool:
        try:
            await self.get_namespace_policies(namespace)
        except NotFoundError:
            return False
        return True

    async def get_namespace_policies(self, namespace: str) -> NamespacePolicies:
        """The policies; NotFoundError if the namespace is missing or being deleted."""
        found = await self._store.get_or_none(namespace_path(namespace))
        if found is None:
            raise NotFoundError(f"Namespace {namespace} does not exist")
        policies = NamespacePolicies.from_json(_load_json(found[0], f"namespace {namespace}"))
        if policies.deleted:
            raise NotFoundError(f"Namespace {namespace} is being deleted")
        return policies

    async def create_namespace(self, namespace: str, policies: NamespacePolicies | None = None) -> None:
        """Create with ``policies`` (defaults if None); replication clusters default to the
        tenant's allowed clusters and must be among them. 404 if the tenant is missing, 409 if
        the namespace exists."""
        path = namespace_path(namespace)
        tenant, _ = split_namespace(namespace)
        info = await self.get_tenant(tenant)
        policies = policies or NamespacePolicies()
        if policies.deleted:
            raise BadRequestError("a namespace cannot be created with deleted=true")
        if not policies.replication_clusters:
            policies = replace(policies, replication_clusters=info.allowed_clusters)
        not_allowed = [c for c in policies.replication_clusters if c not in info.allowed_clusters]
        if not_allowed:
            raise PreconditionFailedError(
                f"Clusters {', '.join(not_allowed)} are not in the allowed clusters of tenant {tenant}")
        try:
            await self._store.create(path, _dump(policies.to_json()), make_parents=False)
        except MetadataExistsError:
            raise ConflictError(f"Namespace {namespace} already exists") from None
        except MetadataNotFoundError:
            raise NotFoundError(f"Tenant {tenant} does not exist") from None

    async def update_namespace_policies(self, namespace: str, transform: PolicyTransform) -> NamespacePolicies:
        """CAS-update: ``transform(current) -> new`` (pure; may run several times; its errors
        abort the update and propagate). Returns the policies written."""
        path = namespace_path(namespace)
        written: list[NamespacePolicies] = []

        def update(current: bytes | None) -> bytes:
            if current is None:
                raise NotFoundError(f"Namespace {namespace} does not exist")
            policies = NamespacePolicies.from_json(_load_json(current, f"namespace {namespace}"))
            if policies.deleted:
                raise NotFoundError(f"Namespace {namespace} is being deleted")
            new = transform(policies)
            if new.deleted:
                raise BadRequestError("deleted cannot be set by a policy update")
            written.append(new)
            return _dump(new.to_json())

        await self._store.update(path, update)
        return written[-1]

    async def set_namespace_policies(self, namespace: str, policies: NamespacePolicies) -> NamespacePolicies:
        """Replace all policies (replication clusters kept when ``policies`` names none)."""
        def transform(current: NamespacePolicies) -> NamespacePolicies:
            new = replace(policies, auth_policies=current.auth_policies)   # permissions: their own paths
            if not policies.replication_clusters:
                return replace(new, replication_clusters=current.replication_clusters)
            return new

        return await self.update_namespace_policies(namespace, transform)

    async def delete_namespace(self, namespace: str) -> None:
        """Delete a namespace that has no topics: 404 if missing, 409 if it has topics."""
        path = namespace_path(namespace)

        def mark(current: bytes | None) -> bytes:
            if current is None:
                raise NotFoundError(f"Namespace {namespace} does not exist")
            raw = _load_json(current, f"namespace {namespace}")
            raw["deleted"] = True
            return _dump(raw)

        await self._store.update(path, mark)
        try:
            topics = await self._list_topics(namespace)
        except BaseException:
            await self._unmark_deleted(path, namespace)
            raise
        if topics:
            await self._unmark_deleted(path, namespace)
            raise ConflictError(f"Cannot delete non empty namespace {namespace} ({len(topics)} topics)")
        try:
            await self._store.delete(path)
        except MetadataNotFoundError:
            raise NotFoundError(f"Namespace {namespace} does not exist") from None

    async def _unmark_deleted(self, path: str, namespace: str) -> None:
        def unmark(current: bytes | None) -> bytes:
            if current is None:
                raise NotFoundError(f"Namespace {namespace} does not exist")
            raw = _load_json(current, f"namespace {namespace}")
            raw["deleted"] = False
            return _dump(raw)

        await self._store.update(path, unmark)


__all__ = [
    "AdminError", "BadRequestError", "NotFoundError", "ConflictError", "PreconditionFailedError",
    "ClusterData", "TenantInfo", "RetentionPolicy", "BacklogQuota", "RolloverPolicy", "AutoTopicCreation",
    "NamespacePolicies", "PolicyStore", "check_name", "split_namespace", "cluster_path", "tenant_path",
    "namespace_path", "DEFAULT_CLUSTER", "DEFAULT_TENANT", "DEFAULT_NAMESPACE", "BACKLOG_QUOTA_TYPES",
]
