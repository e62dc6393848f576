"""Where everything lives in ZooKeeper: every root of pulsarlite's layout
(docs/protocol.md#zookeeper-layout) and the small pure functions that build a path from names and
ids. The one place a znode path is spelled.

Layout (close to Pulsar's and BookKeeper's, so operators recognise it)::

    /ledgers/available/<bookie-id>              ephemeral: writable bookies
    /ledgers/available/readonly/<bookie-id>     ephemeral: read-only bookies
    /ledgers/cookies/<bookie-id>                bookie identity, checked against its disks at start
    /ledgers/idgen/ID-<seq>                     ledger id generation (sequential nodes)
    /ledgers/racks/<bookie-id>                  rack of a bookie (placement)
    /ledgers/underreplication/...               autorecovery (paths in bookie/autorecovery/layout.py)
    /ledgers/<3>/<4>/<4>/<4>/L<4>               ledger metadata (BookKeeper's long hierarchical layout)
    /managed-ledgers/<tenant>/<ns>/persistent/<topic>
                                                ledger list (document: pulsarlite/ledger_list.py)
    /managed-ledgers/.../<topic>/<cursor>       durable cursor (URL-encoded name)
    /admin/clusters/<cluster>                   cluster data
    /admin/policies/<tenant>[/<ns>]             tenant info, namespace policies
    /admin/partitioned-topics/<tenant>/<ns>/<domain>/<topic>
                                                partition count of a partitioned topic
    /admin/topic-policies/<tenant>/<ns>/persistent/<topic>   per-topic policy overrides
    /admin/terminated-topics/<tenant>/<ns>/persistent/<topic> where a terminated topic ends
    /namespace/<tenant>/<ns>/<bundle>           ephemeral: which broker owns the bundle
    /loadbalance/brokers/<broker-id>            ephemeral: live brokers and their load
    /schemas/<tenant>/<ns>/<topic>              schema versions
    /non-persistent/<tenant>/<ns>/<topic>       non-persistent topics (registration)
    /pulsarlite/dedup/<tenant>/<ns>/persistent/<topic>   deduplication snapshot

Functions here only build and split strings: they check what makes a path ambiguous (an empty
or ``/``-bearing segment, a negative id) and nothing else; a component adds its own rules
(allowed characters of a broker id, a bundle key's range) in front of them. Stdlib only: the
base package imports no component.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

# -- roots -------------------------------------------------------------------------------------
LEDGERS_ROOT = "/ledgers"
AVAILABLE_PATH = f"{LEDGERS_ROOT}/available"
READONLY_CHILD = "readonly"
READONLY_PATH = f"{AVAILABLE_PATH}/{READONLY_CHILD}"
COOKIES_PATH = f"{LEDGERS_ROOT}/cookies"
IDGEN_PATH = f"{LEDGERS_ROOT}/idgen"
IDGEN_PREFIX = f"{IDGEN_PATH}/ID-"
RACKS_ROOT = f"{LEDGERS_ROOT}/racks"
UNDERREPLICATION_ROOT = f"{LEDGERS_ROOT}/underreplication"

MANAGED_LEDGERS_ROOT = "/managed-ledgers"

ADMIN_ROOT = "/admin"
CLUSTERS_ROOT = f"{ADMIN_ROOT}/clusters"
POLICIES_ROOT = f"{ADMIN_ROOT}/policies"
PARTITIONED_TOPICS_ROOT = f"{ADMIN_ROOT}/partitioned-topics"
TOPIC_POLICIES_ROOT = f"{ADMIN_ROOT}/topic-policies"
TERMINATED_ROOT = f"{ADMIN_ROOT}/terminated-topics"

NAMESPACE_ROOT = "/namespace"
LOADBALANCE_ROOT = "/loadbalance"
BROKERS_ROOT = f"{LOADBALANCE_ROOT}/brokers"
SCHEMAS_ROOT = "/schemas"
NON_PERSISTENT_ROOT = "/non-persistent"
PULSARLITE_ROOT = "/pulsarlite"
DEDUP_ROOT = f"{PULSARLITE_ROOT}/dedup"

# every top-level znode of the layout: with a ZooKeeper credential each is created (ACL'd) at
# connect and the credential checked against it, and `pulsarlite bookkeeper secure-znodes` sets the
# ACL below each. A root left out would be open to whoever creates it first (on "/", or an open
# chroot) and never closed on an upgraded cluster.
PULSARLITE_ROOTS = (LEDGERS_ROOT, MANAGED_LEDGERS_ROOT, ADMIN_ROOT, NAMESPACE_ROOT, LOADBALANCE_ROOT,
                    SCHEMAS_ROOT, NON_PERSISTENT_ROOT, PULSARLITE_ROOT)

LEDGER_ID_MAX = 2 ** 63 - 1


# -- ledgers (BookKeeper) ----------------------------------------------------------------------
def ledger_path(ledger_id: int) -> str:
    """/ledgers/<hierarchical id>, BookKeeper's long hierarchical layout:
    id 1 -> /ledgers/000/0000/0000/0000/L0001."""
    if ledger_id < 0:
        raise ValueError(f"ledger id must be >= 0, got {ledger_id}")
    s = f"{ledger_id:019d}"
    return f"{LEDGERS_ROOT}/{s[0:3]}/{s[3:7]}/{s[7:11]}/{s[11:15]}/L{s[15:19]}"


def ledger_id_from_path(path: str) -> int:
    """The id of a ledger metadata path (inverse of :func:`ledger_path`); ValueError otherwise."""
    parts = path.rstrip("/").split("/")
    if len(parts) != 7 or f"/{parts[1]}" != LEDGERS_ROOT or not parts[6].startswith("L"):
        raise ValueError(f"not a ledger path: {path}")
    return int("".join(parts[2:6]) + parts[6][1:])


def bookie_registration_path(bookie_id: str, *, read_only: bool) -> str:
    """Where a live bookie registers (ephemeral): under ``readonly/`` when it takes no writes."""
    _check_segment("bookie id", bookie_id)
    return f"{READONLY_PATH}/{bookie_id}" if read_only else f"{AVAILABLE_PATH}/{bookie_id}"


def cookie_path(bookie_id: str) -> str:
    _check_segment("bookie id", bookie_id)
    return f"{COOKIES_PATH}/{bookie_id}"


def rack_path(bookie_id: str) -> str:
    _check_segment("bookie id", bookie_id)
    return f"{RACKS_ROOT}/{bookie_id}"


# -- managed ledgers and cursors ---------------------------------------------------------------
def _check_segment(what: str, value: str) -> None:
    if (not isinstance(value, str) or not value or "/" in value or value in (".", "..") or "\x00" in value
            or value.strip() != value):
        raise ValueError(f"invalid {what} {value!r}")


def managed_ledger_name(tenant: str, namespace: str, topic: str) -> str:
    """``tenant/namespace/persistent/topic`` (the local topic name, e.g. ``t-partition-0``)."""
    _check_segment("tenant", tenant)
    _check_segment("namespace", namespace)
    _check_segment("topic", topic)
    return f"{tenant}/{namespace}/persistent/{topic}"


def check_name(name: str) -> str:
    """``name`` if it is a managed-ledger name (``tenant/namespace/persistent/topic``)."""
    parts = name.split("/")
    if len(parts) != 4 or parts[2] != "persistent":
        raise ValueError(f"managed ledger name must be tenant/namespace/persistent/topic, got {name!r}")
    managed_ledger_name(parts[0], parts[1], parts[3])
    return name


def managed_ledger_path(name: str) -> str:
    """The znode of a managed ledger's list: ``/managed-ledgers/<name>``."""
    return f"{MANAGED_LEDGERS_ROOT}/{check_name(name)}"


def managed_ledgers_of_namespace_path(tenant: str, namespace: str) -> str:
    """The parent of a namespace's persistent managed ledgers (its children are topic names)."""
    _check_segment("tenant", tenant)
    _check_segment("namespace", namespace)
    return f"{MANAGED_LEDGERS_ROOT}/{tenant}/{namespace}/persistent"


def encode_cursor_name(cursor_name: str) -> str:
    """The znode name of a cursor (URL-encoded; never ``.``/``..``)."""
    if not isinstance(cursor_name, str) or not cursor_name or "\x00" in cursor_name:
        raise ValueError(f"invalid cursor name {cursor_name!r}")
    encoded = quote(cursor_name, safe="")
    if encoded in (".", ".."):
        encoded = encoded.replace(".", "%2E")
    return encoded


def decode_cursor_name(znode_name: str) -> str:
    return unquote(znode_name)


def cursor_path(managed_ledger_name: str, cursor_name: str) -> str:
    """A durable cursor: a child of its managed ledger's znode."""
    return f"{managed_ledger_path(managed_ledger_name)}/{encode_cursor_name(cursor_name)}"


# -- per-topic records keyed by the managed-ledger name ----------------------------------------
def partitioned_topic_path(managed_ledger_name: str) -> str:
    """``/admin/partitioned-topics/<tenant>/<ns>/<domain>/<topic>`` (any domain)."""
    return f"{PARTITIONED_TOPICS_ROOT}/{managed_ledger_name}"


def partitioned_topics_of_namespace_path(namespace: str, domain: str = "persistent") -> str:
    """The parent of a namespace's partitioned topics of a domain (``namespace`` is tenant/ns)."""
    return f"{PARTITIONED_TOPICS_ROOT}/{namespace}/{domain}"


def topic_policies_path(managed_ledger_name: str) -> str:
    return f"{TOPIC_POLICIES_ROOT}/{managed_ledger_name}"


def terminated_path(managed_ledger_name: str) -> str:
    return f"{TERMINATED_ROOT}/{managed_ledger_name}"


def dedup_path(managed_ledger_name: str) -> str:
    return f"{DEDUP_ROOT}/{managed_ledger_name}"


def schema_path(tenant: str, namespace: str, encoded_topic: str) -> str:
    """Schemas belong to the (partitioned) parent topic: callers pass its parts."""
    return f"{SCHEMAS_ROOT}/{tenant}/{namespace}/{encoded_topic}"


def non_persistent_path(tenant: str, namespace: str, encoded_topic: str) -> str:
    return f"{NON_PERSISTENT_ROOT}/{tenant}/{namespace}/{encoded_topic}"


def non_persistent_of_namespace_path(namespace: str) -> str:
    return f"{NON_PERSISTENT_ROOT}/{namespace}"


# -- admin, ownership, load ---------------------------------------------------------------------
def cluster_path(cluster: str) -> str:
    return f"{CLUSTERS_ROOT}/{cluster}"


def tenant_path(tenant: str) -> str:
    return f"{POLICIES_ROOT}/{tenant}"


def namespace_policies_path(tenant: str, namespace: str) -> str:
    return f"{POLICIES_ROOT}/{tenant}/{namespace}"


def bundle_path(key: str) -> str:
    """``/namespace/<tenant>/<ns>/<bundle range>`` for a bundle key ``tenant/ns/range``."""
    return f"{NAMESPACE_ROOT}/{key}"


def broker_path(broker_id: str) -> str:
    _check_segment("broker id", broker_id)
    return f"{BROKERS_ROOT}/{broker_id}"


__all__ = [
    "ADMIN_ROOT", "AVAILABLE_PATH", "BROKERS_ROOT", "CLUSTERS_ROOT", "COOKIES_PATH", "DEDUP_ROOT", "IDGEN_PATH",
    "IDGEN_PREFIX", "LEDGERS_ROOT", "LEDGER_ID_MAX", "LOADBALANCE_ROOT", "MANAGED_LEDGERS_ROOT", "NAMESPACE_ROOT",
    "NON_PERSISTENT_ROOT", "PARTITIONED_TOPICS_ROOT", "POLICIES_ROOT", "PULSARLITE_ROOT", "PULSARLITE_ROOTS",
    "RACKS_ROOT", "READONLY_CHILD", "READONLY_PATH", "SCHEMAS_ROOT", "TERMINATED_ROOT", "TOPIC_POLICIES_ROOT",
    "UNDERREPLICATION_ROOT", "bookie_registration_path", "broker_path", "bundle_path", "check_name", "cluster_path",
    "cookie_path", "cursor_path", "decode_cursor_name", "dedup_path", "encode_cursor_name", "ledger_id_from_path",
    "ledger_path", "managed_ledger_name", "managed_ledger_path", "managed_ledgers_of_namespace_path",
    "namespace_policies_path", "non_persistent_of_namespace_path", "non_persistent_path",
    "partitioned_topic_path", "partitioned_topics_of_namespace_path", "rack_path", "schema_path",
    "tenant_path", "terminated_path", "topic_policies_path",
]
