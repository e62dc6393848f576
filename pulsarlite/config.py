"""Configuration: frozen dataclasses, loaded from TOML, validated at start (docs/architecture.md#style).

Every queue, window, frame, retry and timeout has a bound here. A bad file or value raises
ConfigError naming the key; nothing starts with a config that failed validation.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import tomllib
import typing
from dataclasses import dataclass, field

from pulsarlite.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB

# adds not yet confirmed on one ledger, at most: the one default of every layer that bounds them
# (LedgerClientConfig: LedgerHandle.add() waits beyond it; broker/managed_ledger/config.py
# ManagedLedgerConfig and broker/config.py BrokerConfig: a managed ledger's adds in flight and
# queued during a rollover, the publish path's backlog beyond it). The broker's one setting
# (TOML key pending_adds_max) is handed to its managed ledgers and its ledger client alike.
PENDING_ADDS_MAX_DEFAULT = 10_000


@dataclass(frozen=True)
class BookieConfig:
    """One bookie process. Journal and ledger directories are separate settings so they can sit
    on separate disks (write/read isolation)."""

    bookie_id: str = ""                      # default: "<host>:<port>"
    host: str = "127.0.0.1"
    port: int = 3181
    zookeeper: str = "127.0.0.1:2181"
    zk_session_timeout_ms: int = 10_000
    journal_dir: str = "data/journal"
    ledger_dir: str = "data/ledgers"
    # journal and group commit
    group_wait_ms_max: float = 1.0           # flush when the oldest waiting record is this old
    journal_bytes_buffered_max: int = 512 * KiB  # ... or when this many bytes wait
    journal_file_bytes_max: int = 256 * MiB  # roll the journal file at this size
    journal_preallocate_bytes: int = 16 * MiB  # zero-filled ahead of the writer (faster fsync)
    journal_queue_records_max: int = 100_000  # bounded queue of records waiting for a commit
    journal_flush_when_queue_empty: bool = True  # flush as soon as no record is waiting
    # a group of at most this many bytes that finds the journal idle is written and synced by
    # the event loop itself (no hand-off to the journal thread and back); 0 = never
    journal_write_inline_bytes_max: int = 64 * KiB
    # drop the journal's pages from the page cache once synced (every MiB): the journal is read
    # only at replay (BookKeeper's journalRemovePagesFromCache)
    journal_drop_page_cache: bool = True
    # ledger storage
    entry_log_file_bytes_max: int = 256 * MiB
    # drop entry-log pages from the page cache once synced: reads of flushed entries then come
    # from the disk; saves the page cache's growth (costly on VMs whose memory the host backs
    # lazily, BENCHMARKS.md "Session 9")
    entry_log_drop_page_cache: bool = False
    write_cache_bytes_max: int = 64 * MiB    # entries waiting for the next checkpoint
    checkpoint_interval_ms: int = 5_000      # persist the index, move the mark, trim the journal
    write_cache_flush_interval_ms: int = 250  # write the cache to entry logs: small bursts (BENCHMARKS.md)
    # limits on requests
    entry_bytes_max: int = 5 * MiB + 10 * KiB  # >= the brokers' frame_bytes_max (message_bytes_max + padding)
    # largest frame accepted (bookie protocol), both ways: what one unfinished frame may hold.
    # The ledger client's largest AddRequest is max(add_batch_bytes_max, one entry of at most
    # entry_bytes_max) plus framing; 16 MiB leaves room for clients configured with bigger batches
    request_bytes_max: int = 16 * MiB
    read_bytes_max: int = 4 * MiB            # per read reply
    # connection budgets (bookie protocol port) [hardening]; see bookie/server.py
    connections_max: int = 1_000             # open connections; one more is told UNAVAILABLE and closed
    frame_complete_timeout_ms: int = 30_000  # a frame started must be whole by then (slow senders);
    #                                          the time the bookie itself stops reading does not count
    # a connection that sent no valid request this long after opening is closed. Never applies
    # after its first request: ledger clients keep idle connections open without keepalives
    connection_first_request_timeout_ms: int = 120_000
    # a peer that leaves the answers above the write buffer's high mark unread this long is closed
    connection_write_stall_timeout_ms: int = 60_000
    # disk usage and garbage collection
    disk_usage_readonly_threshold: float = 0.95
    disk_usage_writable_threshold: float = 0.90
    disk_check_interval_ms: int = 2_000
    gc_interval_ms: int = 30_000
    compaction_live_ratio_max: float = 0.5   # compact entry logs less live than this
    compaction_bytes_per_s_max: int = 32 * MiB
    # orphan ledgers: stored here, unknown to the metadata (a delete this bookie missed, or a
    # client that wrote without creating the ledger); deleted after a grace period (bookie/orphan_gc.py)
    orphan_gc_enabled: bool = True
    orphan_gc_interval_ms: int = 600_000     # one pass every 10 minutes
    # a ledger is looked up in the metadata only this long after this process first saw it
    orphan_ledger_grace_ms: int = 3_600_000
    orphan_ledgers_per_pass_max: int = 1_000  # metadata lookups (so deletions) per pass
    # test hook: pretend the disk has this many bytes free (read-only mode tests); 0 = real
    disk_free_bytes_override: int = 0
    # autorecovery (bookie/autorecovery/): every bookie runs an auditor candidate (one is
    # elected) and a replication worker
    autorecovery_enabled: bool = True
    # a bookie named by ledgers and gone this long is lost: its ledgers are marked
    # under-replicated (BookKeeper's lostBookieRecoveryDelay); a decommissioned one at once
    lost_bookie_recovery_delay_ms: int = 60_000
    audit_interval_ms: int = 300_000         # the auditor's periodic full scan of the ledgers
    # the auditor's periodic check that sampled entries are on every replica (0: off); daily
    audit_replica_check_interval_ms: int = 86_400_000
    audit_replica_check_entries_per_fragment: int = 3  # first, last and random ones
    audit_replica_check_probes_max: int = 10_000  # entry reads per check
    replication_poll_interval_ms: int = 5_000  # the worker looks for marked ledgers this often
    replication_entries_in_flight_max: int = 64  # entries read or written at once per fragment
    replication_read_run_entries_max: int = 16  # consecutive entries read in one request
    replication_bytes_per_s_max: int = 32 * MiB  # copy throttle per worker
    replication_ledgers_concurrent_max: int = 2  # ledgers one worker repairs at once
    replication_retry_delay_ms_max: int = 60_000  # back-off cap for a ledger that could not be repaired
    replication_copy_timeout_ms: int = 30_000  # one entry's read or write to a bookie
    # the bookie's rack (placement spreads ensembles and re-replicated fragments over racks);
    # published at /ledgers/racks/<bookie-id> (bookie/autorecovery/racks.py). Empty: none
    rack: str = ""
    # HTTP port of the bookie's Prometheus /metrics (bookie/metrics.py); 0 = off
    metrics_port: int = 0
    # client authentication on the bookie port (bookie/server.py; docs/security.md): every
    # connection must first prove, with a token (JWT) whose role is in bookie_auth_roles, that it
    # is a ledger client of this cluster. Off only where everything listens on 127.0.0.1: a bookie
    # with it off and a non-loopback host refuses to start unless bookie_auth_insecure_allow
    bookie_auth_enabled: bool = False
    bookie_auth_insecure_allow: bool = False
    bookie_auth_roles: str = "broker,autorecovery,spark,admin"   # comma-separated
    # roles (of bookie_auth_roles) that may only read: no add, delete or fencing read (the Spark
    # source reads up to the LAC and never fences)
    bookie_auth_read_only_roles: str = "spark"
    # the key that verifies the tokens, in the broker's forms (file:///path, data:;base64,...,
    # a path, bare base64): exactly one of the secret key (HS*) and the public key (RS*/ES*)
    bookie_auth_token_secret_key: str = field(default="", repr=False)
    bookie_auth_token_public_key: str = ""
    bookie_auth_token_public_alg: str = ""
    # the credential this bookie's own ledger client (autorecovery) presents to the other
    # bookies: a token, or a file holding one (read at each connection). Never logged
    bookie_auth_token: str = field(default="", repr=False)
    bookie_auth_token_file: str = ""
    # ZooKeeper digest authentication (docs/security.md "ZooKeeper"): the credential
    # "user:password", or a file holding it; znodes this process creates get an ACL letting only
    # that credential change them (and read them, with zookeeper_acl_read_restricted). Never logged
    zookeeper_auth_digest: str = field(default="", repr=False)
    zookeeper_auth_digest_file: str = ""
    zookeeper_acl_read_restricted: bool = False
    # TLS on the bookie port (bookie/tls.py; docs/security.md): with both files the port speaks TLS
    # only, and this bookie's own ledger client (autorecovery) connects to the others with TLS,
    # trusting bookie_tls_trust_certs_file_path (empty: the system's CAs)
    bookie_tls_certificate_file_path: str = ""
    bookie_tls_key_file_path: str = ""
    bookie_tls_trust_certs_file_path: str = ""

    def validate(self) -> "BookieConfig":
        _positive(self, "port", "zk_session_timeout_ms", "journal_bytes_buffered_max",
                  "journal_file_bytes_max", "journal_queue_records_max", "entry_log_file_bytes_max",
                  "write_cache_bytes_max", "checkpoint_interval_ms", "write_cache_flush_interval_ms", "entry_bytes_max",
                  "request_bytes_max", "read_bytes_max", "disk_check_interval_ms",
                  "gc_interval_ms", "compaction_bytes_per_s_max", "connections_max",
                  "frame_complete_timeout_ms", "connection_first_request_timeout_ms",
                  "connection_write_stall_timeout_ms", "orphan_gc_interval_ms",
                  "orphan_ledger_grace_ms", "orphan_ledgers_per_pass_max", "audit_interval_ms",
                  "replication_poll_interval_ms", "replication_entries_in_flight_max",
                  "replication_read_run_entries_max",
                  "replication_bytes_per_s_max", "replication_ledgers_concurrent_max",
                  "replication_retry_delay_ms_max", "replication_copy_timeout_ms")
        if self.audit_replica_check_interval_ms < 0:
            raise ConfigError("audit_replica_check_interval_ms must be >= 0 (0: off)")
        if self.audit_replica_check_entries_per_fragment < 1 or self.audit_replica_check_probes_max < 1:
            raise ConfigError("audit_replica_check_entries_per_fragment and audit_replica_check_probes_max must be >= 1")
        if self.lost_bookie_recovery_delay_ms < 0:
            raise ConfigError("lost_bookie_recovery_delay_ms must be >= 0")
        if "/" in self.rack or len(self.rack.encode()) > 256:
            raise ConfigError("rack must have no '/' and at most 256 bytes")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be in [0, 65535] (0: off), got {self.metrics_port}")
        if self.replication_entries_in_flight_max > 10_000 or self.replication_ledgers_concurrent_max > 100:
            raise ConfigError("replication_entries_in_flight_max must be <= 10000 and "
                              "replication_ledgers_concurrent_max <= 100")
        if not 0 < self.group_wait_ms_max <= 1000:
            raise ConfigError(f"group_wait_ms_max must be in (0, 1000], got {self.group_wait_ms_max}")
        if self.port > 65535:
            raise ConfigError(f"port must be <= 65535, got {self.port}")
        if self.journal_preallocate_bytes < 0:
            raise ConfigError("journal_preallocate_bytes must be >= 0")
        if not 0 <= self.journal_write_inline_bytes_max <= self.journal_bytes_buffered_max:
            raise ConfigError("journal_write_inline_bytes_max must be in [0, journal_bytes_buffered_max]")
        if self.entry_bytes_max + 1024 > self.request_bytes_max:
            raise ConfigError("entry_bytes_max must leave room for framing within request_bytes_max")
        if not 0 < self.disk_usage_writable_threshold < self.disk_usage_readonly_threshold <= 1:
            raise ConfigError("need 0 < disk_usage_writable_threshold < disk_usage_readonly_threshold <= 1")
        if not 0 < self.compaction_live_ratio_max < 1:
            raise ConfigError("compaction_live_ratio_max must be in (0, 1)")
        if not self.journal_dir or not self.ledger_dir:
            raise ConfigError("journal_dir and ledger_dir must be set")
        self._validate_auth()
        return self

    def _validate_auth(self) -> None:
        if self.bookie_auth_enabled:
            if bool(self.bookie_auth_token_secret_key) == bool(self.bookie_auth_token_public_key):
                raise ConfigError("bookie_auth_enabled needs exactly one of bookie_auth_token_secret_key "
                                  "and bookie_auth_token_public_key")
            if not self.bookie_auth_role_names:
                raise ConfigError("bookie_auth_roles must name at least one role when bookie_auth_enabled")
        elif not is_loopback_host(self.host) and not self.bookie_auth_insecure_allow:
            raise ConfigError(f"host={self.host!r} is not a loopback address and bookie_auth_enabled is false: "
                              f"anyone who reaches this port could overwrite entries or delete ledgers. Turn "
                              f"bookie_auth_enabled on (docs/security.md), listen on 127.0.0.1, or set "
                              f"bookie_auth_insecure_allow = true if the network is private")
        if self.bookie_auth_token and self.bookie_auth_token_file:
            raise ConfigError("set at most one of bookie_auth_token and bookie_auth_token_file")
        validate_zookeeper_auth(self)
        if bool(self.bookie_tls_certificate_file_path) != bool(self.bookie_tls_key_file_path):
            raise ConfigError("set both bookie_tls_certificate_file_path and bookie_tls_key_file_path "
                              "(TLS on the bookie port), or neither")

    @property
    def bookie_auth_role_names(self) -> frozenset[str]:
        return frozenset(r.strip() for r in self.bookie_auth_roles.split(",") if r.strip())

    @property
    def bookie_auth_read_only_role_names(self) -> frozenset[str]:
        return frozenset(r.strip() for r in self.bookie_auth_read_only_roles.split(",") if r.strip())

    @property
    def effective_bookie_id(self) -> str:
        return self.bookie_id or f"{self.host}:{self.port}"

    @property
    def metrics_address(self) -> str:
        """``host:port`` where others reach this bookie's /metrics (recorded in its registration
        node for the console), "" when ``metrics_port`` is 0. The host is the listen ``host``,
        or, when that is a wildcard (0.0.0.0, ::), the host of the bookie id (the address the
        brokers reach the bookie by)."""
        if not self.metrics_port:
            return ""
        host = self.host
        if host.strip("[]") in ("", "0.0.0.0", "::"):
            bookie_host, sep, _ = self.effective_bookie_id.rpartition(":")
            host = bookie_host if sep and bookie_host else host
        host = host.strip("[]")
        return f"[{host}]:{self.metrics_port}" if ":" in host else f"{host}:{self.metrics_port}"

    def ledger_client_config(self) -> "LedgerClientConfig":
        """The config of this bookie's own ledger client (autorecovery): its credential included."""
        return LedgerClientConfig(zookeeper=self.zookeeper, zk_session_timeout_ms=self.zk_session_timeout_ms,
                                  bookie_auth_token=self.bookie_auth_token,
                                  bookie_auth_token_file=self.bookie_auth_token_file,
                                  bookie_tls_enabled=bool(self.bookie_tls_certificate_file_path),
                                  bookie_tls_trust_certs_file_path=self.bookie_tls_trust_certs_file_path,
                                  **zookeeper_auth_settings(self))


def is_loopback_host(host: str) -> bool:
    """``host`` (a listen address) is reachable from this machine only."""
    import ipaddress
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class LedgerClientConfig:
    """The ledger client library (used by brokers, the offloader, the Spark source, the shell)."""

    zookeeper: str = "127.0.0.1:2181"
    zk_session_timeout_ms: int = 10_000
    add_timeout_ms: int = 30_000             # an add waiting longer (no quorum) fails, retriable
    read_timeout_ms: int = 10_000
    rpc_timeout_ms: int = 10_000
    connect_timeout_ms: int = 5_000          # opening the TCP connection to a bookie
    add_batch_entries_max: int = 1_000       # entries coalesced into one AddRequest
    add_batch_bytes_max: int = 4 * MiB
    # AddRequests awaiting their response per bookie stream; beyond it adds queue and leave as
    # one bigger request when a response comes back (self-clocking batches: per-message cost,
    # not bytes, is what limits throughput here)
    add_requests_in_flight_max: int = 2
    # while AddRequests are outstanding, adds leave at most once per this interval per client
    # pool (one request per bookie for all of them); an idle bookie's add leaves at once.
    # 0: every loop turn (bookie/client/bookie_client.py PumpGroup)
    add_flush_interval_ms: float = 0.0
    # an answer that leaves a bookie with no request outstanding and at most this many adds
    # waiting (chunks: a run of adds counts once) ends the interval at once. 0: never.
    add_flush_on_idle_adds_max: int = 0
    pending_adds_max: int = PENDING_ADDS_MAX_DEFAULT     # adds in flight per ledger; add() waits beyond
    ensemble_change_attempts_max: int = 10
    recovery_attempts_max: int = 5
    read_entries_per_request_max: int = 1_000
    request_bytes_max: int = 16 * MiB
    # the credential presented to bookies (AuthRequest, first frame of every connection): a
    # token, or a file holding one (read at each connection, so a rotated file is picked up).
    # Neither set: the client presents none (served only by bookies with authentication off).
    # Never logged; kept out of the repr
    bookie_auth_token: str = field(default="", repr=False)
    bookie_auth_token_file: str = ""
    # ZooKeeper digest authentication (docs/security.md "ZooKeeper"): the credential
    # "user:password", or a file holding it; znodes this process creates get an ACL letting only
    # that credential change them (and read them, with zookeeper_acl_read_restricted). Never logged
    zookeeper_auth_digest: str = field(default="", repr=False)
    zookeeper_auth_digest_file: str = ""
    zookeeper_acl_read_restricted: bool = False
    # TLS to the bookies (bookie/tls.py): every bookie of the cluster serves TLS; their
    # certificates verify against this file (empty: the system's CAs) and name the bookie id's host
    bookie_tls_enabled: bool = False
    bookie_tls_trust_certs_file_path: str = ""

    def validate(self) -> "LedgerClientConfig":
        _positive(self, "zk_session_timeout_ms", "add_timeout_ms", "read_timeout_ms",
                  "rpc_timeout_ms", "connect_timeout_ms", "add_batch_entries_max", "add_batch_bytes_max",
                  "add_requests_in_flight_max",
                  "pending_adds_max", "ensemble_change_attempts_max", "recovery_attempts_max",
                  "read_entries_per_request_max", "request_bytes_max")
        if not 0.0 <= self.add_flush_interval_ms <= 1_000.0:
            raise ConfigError(f"LedgerClientConfig.add_flush_interval_ms must be in [0, 1000], "
                              f"got {self.add_flush_interval_ms!r}")
        if not (type(self.add_flush_on_idle_adds_max) is int and 0 <= self.add_flush_on_idle_adds_max <= 1_000_000):
            raise ConfigError(f"LedgerClientConfig.add_flush_on_idle_adds_max must be an integer in [0, 1000000], "
                              f"got {self.add_flush_on_idle_adds_max!r}")
        if self.bookie_auth_token and self.bookie_auth_token_file:
            raise ConfigError("LedgerClientConfig: set at most one of bookie_auth_token and bookie_auth_token_file")
        validate_zookeeper_auth(self)
        return self


ZOOKEEPER_AUTH_FIELDS = ("zookeeper_auth_digest", "zookeeper_auth_digest_file", "zookeeper_acl_read_restricted")


def zookeeper_auth_settings(cfg: object) -> dict:
    """The ZooKeeper credential fields of a config (BookieConfig, BrokerConfig,
    LedgerClientConfig), to hand to another config."""
    return {name: getattr(cfg, name) for name in ZOOKEEPER_AUTH_FIELDS}


BOOKIE_TLS_CLIENT_FIELDS = ("bookie_tls_enabled", "bookie_tls_trust_certs_file_path")


def bookie_tls_client_settings(cfg: object) -> dict:
    """The client-side bookie TLS fields of a config or options object, to hand to a LedgerClientConfig."""
    return {name: getattr(cfg, name) for name in BOOKIE_TLS_CLIENT_FIELDS}


def validate_zookeeper_auth(cfg: object) -> None:
    """At most one of the digest and its file; an inline digest well formed; read_restricted only
    with a credential. The file is read when connecting (``zookeeper_auth``)."""
    from pulsarlite.metadata import ZkAuth
    owner = type(cfg).__name__
    if getattr(cfg, "zookeeper_auth_digest_file"):
        if getattr(cfg, "zookeeper_auth_digest"):
            raise ConfigError(f"{owner}: set at most one of zookeeper_auth_digest and zookeeper_auth_digest_file")
        return
    ZkAuth.from_settings(cfg.zookeeper_auth_digest, "", cfg.zookeeper_acl_read_restricted, owner=owner)


def zookeeper_auth(cfg: object):
    """The :class:`pulsarlite.metadata.ZkAuth` of a config (its file read now), or None."""
    from pulsarlite.metadata import ZkAuth
    return ZkAuth.from_settings(cfg.zookeeper_auth_digest, cfg.zookeeper_auth_digest_file,
                                cfg.zookeeper_acl_read_restricted, owner=type(cfg).__name__)


def _positive(cfg: object, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value <= 0:
            raise ConfigError(f"{type(cfg).__name__}.{name} must be > 0, got {value!r}")


T = typing.TypeVar("T")

log = logging.getLogger("pulsarlite.config")


def _check_value(key: str, expected: type, value: typing.Any, source: str) -> typing.Any:
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError(f"{source}: {key} must be {expected.__name__}, got {value!r}")
    return value


def _settings_items(cfg: object, values: typing.Mapping[str, typing.Any],
                    source: str) -> list[tuple[str | None, str, typing.Any]]:
    """``values`` as (table or None, key, value) in the order given: a sub-table given as a
    mapping, a dotted key ``"table.key"``, or a key the config class moved into a table
    (``TOML_MOVED``: old flat name -> ``"table.key"``), which logs one warning line naming the
    new keys. ConfigError for a moved key given beside its new one."""
    cls = type(cfg)
    moved: dict[str, str] = getattr(cls, "TOML_MOVED", {})
    hints = typing.get_type_hints(cls)
    tables = {f.name for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])}  # type: ignore[arg-type]
    items: list[tuple[str | None, str, typing.Any]] = []
    migrated: list[tuple[str, str]] = []
    for key, value in values.items():
        if not isinstance(key, str):
            raise ConfigError(f"{source}: setting names are strings, got {key!r}")
        if key in moved:
            migrated.append((key, moved[key]))
            key = moved[key]
        table, dot, name = key.partition(".")
        if dot and table in tables:
            items.append((table, name, value))
        elif key in tables and isinstance(value, typing.Mapping):
            items.extend((key, k, v) for k, v in value.items())
        else:
            items.append((None, key, value))
    if migrated:
        given = [(t, k) for t, k, _ in items]
        for old, new in migrated:
            if given.count(tuple(new.split(".", 1))) > 1:
                table, name = new.split(".", 1)
                raise ConfigError(f"{source}: {old} and [{table}] {name} are the same setting: keep [{table}] {name}")
        log.warning("config keys moved source=%s %s (old keys still read; write them in their table)", source,
                    ", ".join(f"{old} -> [{new.split('.')[0]}] {new.split('.', 1)[1]}" for old, new in migrated))
    return items


def apply_settings(cfg: T, values: typing.Mapping[str, typing.Any], *, source: str = "config") -> T:
    """``cfg`` with ``values`` set (not validated), checking names and types: the one path from
    key/values (a TOML file, the launcher's overrides, ``--pulsar-conf``) to a config. A field
    whose type is a config dataclass is a sub-table: ``{"offload": {"tier_uri": ...}}`` or
    ``{"offload.tier_uri": ...}``; keys the class derives itself in a sub-table (``TOML_DERIVED``:
    table -> {key: where it is set}) are refused. Later values win. Raises ConfigError naming
    the key."""
    if not isinstance(values, typing.Mapping):
        raise ConfigError(f"{source}: expected a table of settings")
    cls = type(cfg)
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    derived: dict[str, dict[str, str]] = getattr(cls, "TOML_DERIVED", {})
    top: dict[str, typing.Any] = {}
    subs: dict[str, dict[str, typing.Any]] = {}
    for table, key, value in _settings_items(cfg, values, source):
        if table is None:
            if key not in fields:
                raise ConfigError(f"{source}: unknown setting {key!r} for {cls.__name__}")
            if dataclasses.is_dataclass(hints[key]):
                raise ConfigError(f"{source}: {key} must be a table ([{key}]), got {value!r}")
            top[key] = _check_value(key, hints[key], value, source)
            continue
        sub_cls = hints[table]
        sub_fields = {f.name for f in dataclasses.fields(sub_cls)}
        where = derived.get(table, {}).get(key)
        if where is not None:
            raise ConfigError(f"{source}: [{table}] {key} is not set here: the broker hands its {where} to it")
        if key not in sub_fields:
            raise ConfigError(f"{source}: unknown setting {key!r} in [{table}] ({sub_cls.__name__})")
        subs.setdefault(table, {})[key] = _check_value(
            f"[{table}] {key}", typing.get_type_hints(sub_cls)[key], value, source)
    changes: dict[str, typing.Any] = dict(top)
    for table, sub_values in subs.items():
        changes[table] = dataclasses.replace(getattr(cfg, table), **sub_values)
    try:
        return dataclasses.replace(cfg, **changes)  # type: ignore[type-var]
    except TypeError as e:  # pragma: no cover - fields are checked above
        raise ConfigError(f"{source}: {e}") from None


def from_mapping(cls: type[T], values: typing.Mapping[str, typing.Any], *, source: str = "config") -> T:
    """Build a config dataclass from a mapping (:func:`apply_settings` on the defaults), validated;
    raises ConfigError."""
    return apply_settings(cls(), values, source=source).validate()  # type: ignore[attr-defined]


def load_toml(cls: type[T], path: str | pathlib.Path, *, table: str | None = None) -> T:
    """Load ``cls`` from a TOML file (optionally one table of it); raises ConfigError."""
    path = pathlib.Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    if table is not None:
        data = data.get(table, {})
    return from_mapping(cls, data, source=str(path))


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_toml(cfg: object) -> str:
    """Render a config dataclass as TOML (the launcher writes bookie and broker configs with it):
    its settings, then one ``[table]`` per sub-config, less the keys the config derives itself
    (``TOML_DERIVED``). :func:`load_toml` reads it back equal."""
    derived: dict[str, dict[str, str]] = getattr(type(cfg), "TOML_DERIVED", {})
    lines, tables = [], []
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            skip = derived.get(f.name, {})
            tables.append("")
            tables.append(f"[{f.name}]")
            tables.extend(f"{g.name} = {_toml_value(getattr(value, g.name))}"
                          for g in dataclasses.fields(value) if g.name not in skip)
        else:
            lines.append(f"{f.name} = {_toml_value(value)}")
    return "\n".join(lines + tables) + "\n"


__all__ = ["BookieConfig", "LedgerClientConfig", "PENDING_ADDS_MAX_DEFAULT", "apply_settings", "from_mapping", "load_toml", "to_toml", "field"]
