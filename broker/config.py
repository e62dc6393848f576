"""Configuration of one broker process: a frozen dataclass, loaded from TOML, validated at start
(docs/architecture.md#style). Every buffer, cache and timeout of the broker has its bound here.

The broker's own settings sit at the top of its TOML file; four sub-configs are tables:
``[managed_ledger]`` (:class:`ManagedLedgerConfig`), ``[ledger_client]``
(:class:`pulsarlite.config.LedgerClientConfig`), ``[offload]`` (:class:`OffloadConfig`) and
``[dispatch]`` (:class:`DispatchConfig`). Keys of the flat layout before the tables
(``BrokerConfig.TOML_MOVED``) are still read, with one warning line naming their new place
(docs/decisions.md "Nested broker config")."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import ClassVar

from broker.managed_ledger.config import ManagedLedgerConfig
from pulsarlite.config import (ZOOKEEPER_AUTH_FIELDS, KiB, LedgerClientConfig, MiB, validate_zookeeper_auth,
                               zookeeper_auth_settings)
from pulsarlite.errors import ConfigError
from pulsarlite.wire.frames import FRAME_BYTES_MAX_LIMIT, FRAME_PADDING_BYTES

ADD_FLUSH_INTERVAL_MS_DEFAULT = 3.0
DAY_MS = 86_400_000   # one UTC day (lake_partition "day")
ADD_FLUSH_ON_IDLE_ADDS_MAX_DEFAULT = 2


@dataclass(frozen=True)
class DispatchConfig:
    """Reading entries for subscriptions and writing them to consumers (TOML ``[dispatch]``)."""

    entry_cache_bytes_max: int = 64 * MiB    # per broker: recent entries for tailing readers
    read_ahead_entries_max: int = 100        # per subscription: entries read ahead of dispatch
    # dispatch back-pressure (Pulsar: the channel's writability, Netty's water marks): above the
    # high mark (transport buffer + frames not yet flushed) dispatch to the connection's consumers
    # pauses, permits kept; it resumes below half of it. A dispatch round writes about this much.
    # (Below BrokerConfig.connection_write_buffer_bytes_max, the last-resort bound.)
    connection_write_high_water_bytes: int = 1 * MiB

    def validate(self) -> "DispatchConfig":
        _positive_ints(self, "entry_cache_bytes_max", "read_ahead_entries_max", "connection_write_high_water_bytes")
        return self


@dataclass(frozen=True)
class OffloadConfig:
    """Tiered storage: offload of closed ledgers as Parquet (broker/offloader.py), reads of
    offloaded ledgers, and the lakehouse tables over them (TOML ``[offload]``)."""

    tier_uri: str = ""                       # s3://bucket/prefix or file:///dir; empty: no tier
    tier_s3_endpoint_url: str = ""           # S3 endpoint (MinIO, moto); empty: AWS_ENDPOINT_URL or AWS
    concurrent_max: int = 2                  # per broker: ledgers being offloaded at once
    check_interval_ms: int = 60_000          # the timer trigger (thresholds, deletion lag)
    deletion_lag_ms: int = 4 * 3600 * 1000   # default lag before offloaded ledgers leave the bookies
    row_group_bytes: int = 8 * MiB           # Parquet row-group size (message bytes) of offloaded ledgers
    ledger_bytes_max: int = 64 * 1024 * MiB  # a bigger closed ledger is not offloaded (a safety bound: memory is not)
    read_ahead_bytes: int = 16 * MiB         # per offload: entries read from the bookies, not yet encoded
    retry_delay_ms_max: int = 3600 * 1000    # a failed ledger's automatic retries: doubling delays up to this
    tier_read_cache_bytes_max: int = 64 * MiB  # per broker: rebuilt entries of offloaded ledgers
    tier_read_ahead_ledgers: int = 4         # offloaded ledgers whose first row group a replay reads ahead
    typed_columns: bool = True               # [schema] AVRO/JSON topics: the record's fields as Parquet columns
    lake_enabled: bool = False               # [lakehouse] offloaded objects = an Iceberg table per topic
    lake_catalog_uri: str = ""               # SQLAlchemy URI (SQL catalog) or http(s):// (Iceberg REST catalog); empty: sqlite in <file tier>/_lake
    lake_snapshot_retention_ms: int = 24 * 3600 * 1000   # expire older table snapshots (-1: keep all)
    lake_partition: str = "day"              # "day": tables partitioned by day(publish_time), ledgers roll at UTC midnight; "none"
    lake_merge_target_bytes: int = 128 * MiB   # small table files merged up to this size (a second copy; 0: off)
    lake_merge_files_min: int = 4            # the newest run of small files is merged from this many files
    lake_merge_file_bytes_max: int = 8 * MiB  # a table file above this is not small: never merged (0: the target)

    def validate(self) -> "OffloadConfig":
        _positive_ints(self, "concurrent_max", "check_interval_ms", "row_group_bytes", "ledger_bytes_max", "read_ahead_bytes",
                       "retry_delay_ms_max", "tier_read_cache_bytes_max", "tier_read_ahead_ledgers")
        for name in ("tier_uri", "tier_s3_endpoint_url"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"OffloadConfig.{name} must be a string")
        uri = self.tier_uri
        if uri and not ((uri.startswith("s3://") and len(uri) > len("s3://") and not uri[5:].startswith("/"))
                        or (uri.startswith("file:///") and len(uri) > len("file:///"))):
            raise ConfigError(f"OffloadConfig.tier_uri must be s3://bucket[/prefix] or file:///dir, got {uri!r}")
        endpoint = self.tier_s3_endpoint_url
        if endpoint and not endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"OffloadConfig.tier_s3_endpoint_url must be an http(s):// URL, got {endpoint!r}")
        lag = self.deletion_lag_ms
        if not isinstance(lag, int) or isinstance(lag, bool) or lag < 0:
            raise ConfigError(f"OffloadConfig.deletion_lag_ms must be an int >= 0, got {lag!r}")
        if not isinstance(self.typed_columns, bool):
            raise ConfigError("OffloadConfig.typed_columns must be a bool")
        if not isinstance(self.lake_enabled, bool) or not isinstance(self.lake_catalog_uri, str):
            raise ConfigError("OffloadConfig.lake_enabled must be a bool and lake_catalog_uri a string")
        if isinstance(self.lake_snapshot_retention_ms, bool) or not isinstance(self.lake_snapshot_retention_ms, int) \
                or self.lake_snapshot_retention_ms < -1:
            raise ConfigError("OffloadConfig.lake_snapshot_retention_ms must be an integer >= -1")
        merge = self.lake_merge_target_bytes
        if isinstance(merge, bool) or not isinstance(merge, int) or merge < 0:
            raise ConfigError(f"OffloadConfig.lake_merge_target_bytes must be an integer >= 0 (0: off), got {merge!r}")
        files_min = self.lake_merge_files_min
        if isinstance(files_min, bool) or not isinstance(files_min, int) or files_min < 2:
            raise ConfigError(f"OffloadConfig.lake_merge_files_min must be an integer >= 2, got {files_min!r}")
        small = self.lake_merge_file_bytes_max
        if isinstance(small, bool) or not isinstance(small, int) or small < 0:
            raise ConfigError(f"OffloadConfig.lake_merge_file_bytes_max must be an integer >= 0 (0: the target), "
                              f"got {small!r}")
        if self.lake_partition not in ("day", "none"):
            raise ConfigError(f"OffloadConfig.lake_partition must be 'day' or 'none', got {self.lake_partition!r}")
        if self.lake_enabled:
            if not self.tier_uri:
                raise ConfigError("OffloadConfig.lake_enabled needs a tier (tier_uri)")
            if not self.lake_catalog_uri and not self.tier_uri.startswith("file://"):
                raise ConfigError("OffloadConfig.lake_enabled with an s3:// tier needs lake_catalog_uri "
                                  "(the embedded SQLite catalog needs a local file)")
            if self.lake_catalog_uri and "://" not in self.lake_catalog_uri:
                raise ConfigError(f"OffloadConfig.lake_catalog_uri must be a SQLAlchemy URI "
                                  f"(sqlite:////path/catalog.db) or an Iceberg REST catalog's http(s):// URI, "
                                  f"got {self.lake_catalog_uri!r}")
        return self


def _positive_ints(cfg: object, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{type(cfg).__name__}.{name} must be an int > 0, got {value!r}")


# the broker's ledger client paces its adds (BENCHMARKS.md "Pacing the pumps", "[perf] Session 10"):
# while AddRequests are outstanding, adds leave for the bookies at most every add_flush_interval_ms
# (one request per bookie for all of them) unless a bookie's last outstanding request was just
# answered and at most add_flush_on_idle_adds_max adds wait for it; an idle bookie's add leaves at once
BROKER_LEDGER_CLIENT_DEFAULTS = LedgerClientConfig(add_flush_interval_ms=ADD_FLUSH_INTERVAL_MS_DEFAULT,
                                                   add_flush_on_idle_adds_max=ADD_FLUSH_ON_IDLE_ADDS_MAX_DEFAULT)


@dataclass(frozen=True)
class BrokerConfig:
    broker_id: str = ""                      # default: "<advertised host>:<port>"
    host: str = "127.0.0.1"                  # where the Pulsar protocol listens
    port: int = 6650
    http_port: int = 8080                    # admin HTTP + metrics (served by the admin module)
    advertised_host: str = ""                # host in the URLs handed to clients; default: host
    # -- TLS (Pulsar's brokerServicePortTls, webServicePortTls, tls*; broker/tls.py) --------------
    # A TLS port of 0 means no such listener. The plain ports stay open beside the TLS ones, as
    # in Pulsar; files are PEM. With tls_require_trusted_client_cert_on_connect a client must
    # present a certificate signed by tls_trust_certs_file_path (mTLS) on both TLS listeners.
    broker_service_port_tls: int = 0         # pulsar+ssl:// listener
    web_service_port_tls: int = 0            # https:// admin listener
    tls_certificate_file_path: str = ""      # the broker's certificate (chain), PEM
    tls_key_file_path: str = ""              # its private key, PEM (never logged)
    tls_trust_certs_file_path: str = ""      # CAs that sign client certificates, PEM
    tls_require_trusted_client_cert_on_connect: bool = False
    tls_allow_insecure_connection: bool = False  # accept a client certificate that does not verify
    # -- advertised listeners (Pulsar's advertisedListeners, internalListenerName) -------------
    # "name:pulsar://host:port,name:pulsar+ssl://host:port,...": the addresses clients reach this
    # broker at, per network (each name at most one pulsar:// and one pulsar+ssl:// URL). A
    # LOOKUP naming a listener (the client's listener_name) answers the owner's URLs of that
    # listener; a LOOKUP naming none, the internal listener's (default: the first named), which
    # are also this broker's service URLs. A name not advertised fails the lookup
    # (ServiceNotReady). Empty: no listeners, the URLs come from advertised_host and the ports.
    advertised_listeners: str = ""
    internal_listener_name: str = ""
    zookeeper: str = "127.0.0.1:2181"
    zk_session_timeout_ms: int = 10_000
    # limits on clients
    message_bytes_max: int = 5 * MiB         # told to clients in CONNECTED; bigger frames close
    # what a compressed SEND may declare (and the broker's check decompress) as its uncompressed
    # size: the official producers decide "too big" on the COMPRESSED size, so a compressible
    # message above message_bytes_max arrives as one entry (Pulsar's broker does not look at the
    # declared size); this bounds the broker's decompression check (docs/decisions.md "SEND checks")
    message_uncompressed_bytes_max: int = 64 * MiB
    publish_buffer_bytes_max: int = 64 * MiB  # per broker: bytes from SEND to receipt
    # last-resort bound for a client that never reads: past it the connection is closed
    connection_write_buffer_bytes_max: int = 16 * MiB
    keepalive_interval_ms: int = 30_000      # PING when idle this long; close after 2 intervals
    # commands a connection may send that we do not support before it is closed ([hardening]:
    # 200,000 of them cost 5 s of event loop in log lines); logged at a bounded rate with a count
    connection_unsupported_commands_max: int = 1_000
    # budgets against clients that hold resources without using them ([hardening])
    connect_frame_bytes_max: int = 64 * KiB  # frames before CONNECT (a CONNECT with a token is a few KiB)
    connect_timeout_ms: int = 10_000         # a connection that has not sent CONNECT by then is closed
    frame_complete_timeout_ms: int = 30_000  # a frame started must be complete by then (slow senders)
    connections_max: int = 10_000            # connections to this broker; more are closed at once
    connections_per_address_max: int = 1_000  # ... from one client address
    topic_auto_creation: bool = True
    # producer deduplication (broker/dedup.py); a namespace's deduplicationEnabled overrides the default
    broker_deduplication_enabled: bool = False
    dedup_snapshot_interval_entries: int = 1000   # entries between two snapshots (bounds the replay on load)
    dedup_producers_max: int = 10_000        # producer names remembered per topic (least recently used out)
    topic_load_timeout_ms: int = 60_000
    shutdown_grace_ms: int = 10_000
    stats_interval_ms: int = 5_000           # rates, backlog gauges and metrics are sampled this often
    cluster_name: str = "standalone"         # the cluster created at start (policies, metrics label)
    compaction_check_interval_ms: int = 60_000  # namespace compactionThreshold checks (broker/compaction)
    compaction_keys_max: int = 1_000_000     # distinct keys one compaction keeps in memory at most
    retention_check_interval_ms: int = 60_000  # retention, message TTL and backlog quota passes (broker/retention.py)
    # retention of a namespace without a retention policy (Pulsar's defaultRetentionTimeInMinutes /
    # defaultRetentionSizeInMB; -1 infinite, 0 none). pulsarlite keeps everything by default, where
    # Pulsar deletes consumed ledgers (and every ledger of a topic without subscriptions): see
    # docs/decisions.md "Retention by default".
    retention_time_default_minutes: int = -1
    retention_size_default_mb: int = -1
    # [security] authentication and authorization (broker/security/; Pulsar's keys in snake_case)
    authentication_enabled: bool = False     # authenticationEnabled: off, every client is served as before
    # authenticationProviders, comma-separated: "token", "basic", "tls" (or Pulsar's class names for them)
    authentication_providers: str = ""
    authorization_enabled: bool = False      # authorizationEnabled (needs authentication_enabled)
    superuser_roles: str = ""                # superUserRoles, comma-separated: may do everything
    anonymous_user_role: str = ""            # anonymousUserRole: the role of a client without credentials; "": refused
    # tokenSecretKey / tokenPublicKey: "file:///path", "data:;base64,...", a path, or base64 (Pulsar's
    # forms); the secret one may hold the key itself: never in a repr (nor basic_auth_conf's data:)
    token_secret_key: str = field(default="", repr=False)  # HS256 (HS384, HS512) secret key
    token_public_key: str = ""               # RS256/ES256... public key (DER or PEM)
    token_public_alg: str = ""               # tokenPublicAlg; "": every RS/PS/ES algorithm the key type allows
    token_auth_claim: str = "sub"            # tokenAuthClaim: the claim that names the role
    token_audience_claim: str = "aud"        # tokenAudienceClaim
    token_audience: str = ""                 # tokenAudience: when set, a token must name this audience
    token_bytes_max: int = 16 * KiB          # a longer token is refused before it is parsed
    basic_auth_conf: str = field(default="", repr=False)  # basicAuthConf: "user:bcrypt-hash" lines (path, file://, data:)
    authenticate_metrics_endpoint: bool = False  # authenticateMetricsEndpoint: /metrics needs a role too
    # authenticationRefreshCheckSeconds: how often a connection's credentials are checked for expiry;
    # an expired one is sent AUTH_CHALLENGE and must answer before the next check, else it is closed
    authentication_refresh_check_interval_ms: int = 60_000
    # ZooKeeper digest authentication (docs/security.md "ZooKeeper"): the credential
    # "user:password", or a file holding it; znodes this process creates get an ACL letting only
    # that credential change them (and read them, with zookeeper_acl_read_restricted). Never logged
    zookeeper_auth_digest: str = field(default="", repr=False)
    zookeeper_auth_digest_file: str = ""
    zookeeper_acl_read_restricted: bool = False

    # -- sub-tables ([managed_ledger], [ledger_client], [offload], [dispatch] in TOML) -----------
    # storage of every topic: replication, rollover, adds in flight (its pending_adds_max also
    # bounds the publish path and the ledger client: one setting for the three)
    managed_ledger: ManagedLedgerConfig = field(default_factory=ManagedLedgerConfig)
    # the broker's ledger client: pacing of adds, the credential and TLS towards the bookies. Its
    # ZooKeeper settings and pending_adds_max are the broker's own (TOML_DERIVED)
    ledger_client: LedgerClientConfig = field(default_factory=lambda: BROKER_LEDGER_CLIENT_DEFAULTS)
    # tiered storage and the lakehouse tables
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    # reading entries for subscriptions and writing them to consumers
    dispatch: DispatchConfig = field(default_factory=DispatchConfig)

    # old flat TOML keys (before the sub-tables) -> their place; still read, with a warning line
    TOML_MOVED: ClassVar[dict[str, str]] = {
        **{k: f"managed_ledger.{k}" for k in ("ensemble_size", "write_quorum", "ack_quorum", "rollover_entries_max",
                                               "rollover_bytes_max", "rollover_age_ms_max", "pending_adds_max")},
        "bookie_add_flush_interval_ms": "ledger_client.add_flush_interval_ms",
        "bookie_add_flush_on_idle_adds_max": "ledger_client.add_flush_on_idle_adds_max",
        **{k: f"ledger_client.{k}" for k in ("bookie_auth_token", "bookie_auth_token_file", "bookie_tls_enabled",
                                              "bookie_tls_trust_certs_file_path")},
        **{k: f"dispatch.{k}" for k in ("entry_cache_bytes_max", "read_ahead_entries_max",
                                        "connection_write_high_water_bytes")},
        **{k: f"offload.{k}" for k in ("tier_uri", "tier_s3_endpoint_url", "tier_read_cache_bytes_max",
                                       "tier_read_ahead_ledgers", "lake_enabled", "lake_catalog_uri",
                                       "lake_snapshot_retention_ms", "lake_partition")},
        **{f"offload_{k}": f"offload.{k}" for k in ("concurrent_max", "check_interval_ms", "deletion_lag_ms",
                                                    "row_group_bytes", "ledger_bytes_max", "retry_delay_ms_max",
                                                    "typed_columns")},
    }
    # keys of a sub-table the broker sets itself (__post_init__): table -> key -> where it is set
    TOML_DERIVED: ClassVar[dict[str, dict[str, str]]] = {
        "ledger_client": {"zookeeper": "zookeeper", "zk_session_timeout_ms": "zk_session_timeout_ms",
                          "pending_adds_max": "[managed_ledger] pending_adds_max",
                          **{k: k for k in ZOOKEEPER_AUTH_FIELDS}},
        "managed_ledger": {"rollover_publish_period_ms": "[offload] lake_partition"},
    }

    def __post_init__(self) -> None:
        """The derived settings of the sub-configs (TOML_DERIVED) set from the broker's own: the
        ledger client's ZooKeeper session and credential and its pending_adds_max, the managed
        ledgers' rollover at UTC midnight for day-partitioned lake tables."""
        if isinstance(self.ledger_client, LedgerClientConfig) and isinstance(self.managed_ledger, ManagedLedgerConfig):
            object.__setattr__(self, "ledger_client", dataclasses.replace(
                self.ledger_client, zookeeper=self.zookeeper, zk_session_timeout_ms=self.zk_session_timeout_ms,
                pending_adds_max=self.managed_ledger.pending_adds_max, **zookeeper_auth_settings(self)))
        if isinstance(self.managed_ledger, ManagedLedgerConfig) and isinstance(self.offload, OffloadConfig):
            period_ms = DAY_MS if self.offload.lake_enabled and self.offload.lake_partition == "day" else 0
            object.__setattr__(self, "managed_ledger", dataclasses.replace(
                self.managed_ledger, rollover_publish_period_ms=period_ms))

    def validate(self) -> "BrokerConfig":
        for name in ("retention_time_default_minutes", "retention_size_default_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < -1:
                raise ConfigError(f"{name} must be an int >= -1 (-1: infinite), got {value!r}")
        for name in ("port", "http_port", "zk_session_timeout_ms", "message_bytes_max", "message_uncompressed_bytes_max", "publish_buffer_bytes_max",
                     "connection_write_buffer_bytes_max",
                     "keepalive_interval_ms", "connection_unsupported_commands_max", "connect_frame_bytes_max",
                     "connect_timeout_ms", "frame_complete_timeout_ms", "connections_max",
                     "connections_per_address_max", "topic_load_timeout_ms", "shutdown_grace_ms",
                     "stats_interval_ms", "retention_check_interval_ms", "compaction_check_interval_ms", "compaction_keys_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"BrokerConfig.{name} must be an int > 0, got {value!r}")
        self._validate_sub_configs()
        if self.dispatch.connection_write_high_water_bytes >= self.connection_write_buffer_bytes_max:
            raise ConfigError("BrokerConfig.dispatch.connection_write_high_water_bytes must be below "
                              "connection_write_buffer_bytes_max")
        for name in ("port", "http_port"):
            if getattr(self, name) > 65535:
                raise ConfigError(f"BrokerConfig.{name} must be <= 65535")
        if self.port == self.http_port:
            raise ConfigError("BrokerConfig: port and http_port must differ")
        validate_zookeeper_auth(self)
        if self.message_bytes_max < 1 * KiB or self.frame_bytes_max >= FRAME_BYTES_MAX_LIMIT:
            raise ConfigError(f"BrokerConfig.message_bytes_max out of range: {self.message_bytes_max}")
        if not self.frame_bytes_max <= self.message_uncompressed_bytes_max < 2**31:
            raise ConfigError(f"BrokerConfig.message_uncompressed_bytes_max must be in [frame size "
                              f"{self.frame_bytes_max}, 2^31), got {self.message_uncompressed_bytes_max}")
        if not 16 <= self.connect_frame_bytes_max <= self.frame_bytes_max:
            raise ConfigError(f"BrokerConfig.connect_frame_bytes_max must be in [16, frame size "
                              f"{self.frame_bytes_max}], got {self.connect_frame_bytes_max}")
        if self.publish_buffer_bytes_max < self.frame_bytes_max:
            raise ConfigError("BrokerConfig.publish_buffer_bytes_max must hold at least one message")
        if not self.host or not self.zookeeper:
            raise ConfigError("BrokerConfig: host and zookeeper must be set")
        if not isinstance(self.cluster_name, str) or not self.cluster_name:
            raise ConfigError("BrokerConfig.cluster_name must be a non-empty string")
        for name in ("dedup_snapshot_interval_entries", "dedup_producers_max"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"BrokerConfig.{name} must be an int > 0, got {value!r}")
        if not isinstance(self.broker_deduplication_enabled, bool):
            raise ConfigError("BrokerConfig.broker_deduplication_enabled must be a bool")
        self._validate_security()
        self._validate_tls()
        self.listeners()           # ConfigError for a malformed advertised_listeners
        return self

    def _validate_sub_configs(self) -> None:
        """Each sub-config of its type and valid; its errors name the table."""
        for name, cls in (("managed_ledger", ManagedLedgerConfig), ("ledger_client", LedgerClientConfig),
                          ("offload", OffloadConfig), ("dispatch", DispatchConfig)):
            sub = getattr(self, name)
            if type(sub) is not cls:
                raise ConfigError(f"BrokerConfig.{name} must be a {cls.__name__}, got {type(sub).__name__}")
            try:
                sub.validate()
            except ConfigError as e:
                raise ConfigError(f"BrokerConfig [{name}]: {e}") from None

    def listeners(self) -> dict[str, tuple[str, str]]:
        """``advertised_listeners`` parsed: name -> (pulsar:// URL or "", pulsar+ssl:// URL or
        ""), in the order given; ConfigError for a malformed list (Pulsar's
        MultipleListenerValidator: names and URLs well formed, one URL per scheme and name,
        ``internal_listener_name`` among them)."""
        if not isinstance(self.advertised_listeners, str) or not isinstance(self.internal_listener_name, str):
            raise ConfigError("BrokerConfig.advertised_listeners and internal_listener_name must be strings")
        found: dict[str, dict[str, str]] = {}
        for item in (i.strip() for i in self.advertised_listeners.split(",")):
            if not item:
                continue
            name, sep, url = item.partition(":")
            name = name.strip()
            scheme, sep2, address = url.strip().partition("://")
            host, sep3, port = address.rpartition(":")
            if not (sep and sep2 and sep3 and name and host and "/" not in address) \
                    or not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"BrokerConfig.advertised_listeners: {item!r} is not name:pulsar://host:port "
                                  f"or name:pulsar+ssl://host:port")
            if scheme not in ("pulsar", "pulsar+ssl"):
                raise ConfigError(f"BrokerConfig.advertised_listeners: {item!r}: the scheme must be pulsar or "
                                  f"pulsar+ssl")
            urls = found.setdefault(name, {})
            if scheme in urls:
                raise ConfigError(f"BrokerConfig.advertised_listeners: listener {name} has more than one "
                                  f"{scheme}:// URL")
            urls[scheme] = f"{scheme}://{host}:{port}"
        if self.internal_listener_name and self.internal_listener_name not in found:
            raise ConfigError(f"BrokerConfig.internal_listener_name {self.internal_listener_name!r} is not one of "
                              f"advertised_listeners ({', '.join(found) or 'none'})")
        return {name: (urls.get("pulsar", ""), urls.get("pulsar+ssl", "")) for name, urls in found.items()}

    @property
    def effective_internal_listener_name(self) -> str:
        """The listener a LOOKUP without a name answers ("" without listeners)."""
        return self.internal_listener_name or next(iter(self.listeners()), "")

    def _validate_tls(self) -> None:
        for name in ("broker_service_port_tls", "web_service_port_tls"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= 65535:
                raise ConfigError(f"BrokerConfig.{name} must be an int in [0, 65535] (0: no listener), got {value!r}")
        for name in ("tls_certificate_file_path", "tls_key_file_path", "tls_trust_certs_file_path"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"BrokerConfig.{name} must be a string")
        for name in ("tls_require_trusted_client_cert_on_connect", "tls_allow_insecure_connection"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"BrokerConfig.{name} must be a bool")
        ports = [p for p in (self.port, self.http_port, self.broker_service_port_tls, self.web_service_port_tls) if p]
        if len(set(ports)) != len(ports):
            raise ConfigError(f"BrokerConfig: port, http_port, broker_service_port_tls and web_service_port_tls "
                              f"must differ, got {ports}")
        if not self.tls_enabled:
            return
        for name in ("tls_certificate_file_path", "tls_key_file_path"):
            if not getattr(self, name):
                raise ConfigError(f"BrokerConfig.{name} must be set when a TLS port is set")
        if self.tls_require_trusted_client_cert_on_connect and not self.tls_trust_certs_file_path:
            raise ConfigError("BrokerConfig.tls_trust_certs_file_path must be set when "
                              "tls_require_trusted_client_cert_on_connect is true")

    @property
    def tls_enabled(self) -> bool:
        """Some TLS listener is configured."""
        return bool(self.broker_service_port_tls or self.web_service_port_tls)

    def _validate_security(self) -> None:
        """[security] the authentication/authorization block; provider names and key forms are
        checked when the broker builds its providers (broker/security/authentication.py)."""
        for name in ("authentication_enabled", "authorization_enabled", "authenticate_metrics_endpoint"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"BrokerConfig.{name} must be a bool")
        for name in ("authentication_providers", "superuser_roles", "anonymous_user_role", "token_secret_key",
                     "token_public_key", "token_public_alg", "token_auth_claim", "token_audience_claim", "token_audience", "basic_auth_conf"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"BrokerConfig.{name} must be a string")
        if not self.token_auth_claim:
            raise ConfigError("BrokerConfig.token_auth_claim must name a claim")
        for name in ("token_bytes_max", "authentication_refresh_check_interval_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"BrokerConfig.{name} must be an int > 0, got {value!r}")
        if self.token_bytes_max > self.connect_frame_bytes_max:
            raise ConfigError("BrokerConfig.token_bytes_max must fit in connect_frame_bytes_max")
        if self.authorization_enabled and not self.authentication_enabled:
            raise ConfigError("BrokerConfig.authorization_enabled needs authentication_enabled")
        if self.authentication_enabled and not self.authentication_provider_names:
            raise ConfigError("BrokerConfig.authentication_enabled needs authentication_providers")

    @property
    def authentication_provider_names(self) -> tuple[str, ...]:
        """``authentication_providers`` split at commas, blanks dropped."""
        return tuple(p.strip() for p in self.authentication_providers.split(",") if p.strip())

    @property
    def superuser_role_names(self) -> frozenset[str]:
        """``superuser_roles`` split at commas, blanks dropped."""
        return frozenset(r.strip() for r in self.superuser_roles.split(",") if r.strip())

    # -- derived -------------------------------------------------------------------------------
    @property
    def frame_bytes_max(self) -> int:
        return self.message_bytes_max + FRAME_PADDING_BYTES

    @property
    def bookie_entry_bytes_min(self) -> int:
        """The smallest ``BookieConfig.entry_bytes_max`` this broker's bookies may have: an entry
        is a SEND's ``[u32 meta_size][metadata][payload]``, stored verbatim (nothing added; the
        ledger client sends ids, LAC and checksum beside it), and a SEND frame is at most
        ``frame_bytes_max`` (``message_bytes_max`` + padding for the command and metadata, as
        Pulsar's frame limit), so every entry the broker takes fits (docs/decisions.md
        "[compat] fixes")."""
        return self.frame_bytes_max

    def check_bookie_entry_bytes(self, entry_bytes_max: int, bookie: str) -> None:
        """ConfigError unless a bookie with ``entry_bytes_max`` stores every entry this broker
        takes (a smaller one would refuse entries the broker acknowledged taking)."""
        if entry_bytes_max < self.bookie_entry_bytes_min:
            raise ConfigError(
                f"BookieConfig.entry_bytes_max of {bookie} ({entry_bytes_max}) is below what the broker takes: "
                f"BrokerConfig.message_bytes_max ({self.message_bytes_max}) + {FRAME_PADDING_BYTES} bytes of "
                f"frame padding = {self.bookie_entry_bytes_min}; raise entry_bytes_max or lower message_bytes_max")

    @property
    def effective_advertised_host(self) -> str:
        return self.advertised_host or self.host

    @property
    def effective_broker_id(self) -> str:
        return self.broker_id or f"{self.effective_advertised_host}:{self.port}"

    @property
    def service_url(self) -> str:
        """The internal listener's pulsar:// URL when listeners are advertised and it has one."""
        internal = self.listeners().get(self.effective_internal_listener_name, ("", ""))[0]
        return internal or f"pulsar://{self.effective_advertised_host}:{self.port}"

    @property
    def web_service_url(self) -> str:
        return f"http://{self.effective_advertised_host}:{self.http_port}"

    @property
    def service_url_tls(self) -> str:
        """``pulsar+ssl://host:port``, or "" without a TLS listener; the internal listener's
        pulsar+ssl:// URL when listeners are advertised and it has one."""
        internal = self.listeners().get(self.effective_internal_listener_name, ("", ""))[1]
        if internal:
            return internal
        port = self.broker_service_port_tls
        return f"pulsar+ssl://{self.effective_advertised_host}:{port}" if port else ""

    @property
    def web_service_url_tls(self) -> str:
        """``https://host:port``, or "" without an HTTPS listener."""
        port = self.web_service_port_tls
        return f"https://{self.effective_advertised_host}:{port}" if port else ""

    def managed_ledger_config(self) -> ManagedLedgerConfig:
        """The config of every managed ledger of this broker (``[managed_ledger]``)."""
        return self.managed_ledger

    def ledger_client_config(self) -> LedgerClientConfig:
        """The config of this broker's ledger client (``[ledger_client]`` with the broker's
        ZooKeeper settings and pending_adds_max), validated."""
        return self.ledger_client.validate()

__all__ = ["BrokerConfig", "DispatchConfig", "OffloadConfig"]
