"""The data source's options, parsed and validated once (bad options fail the query at planning
with the option named)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Mapping

from pulsarlite.topic_name import TopicName
from spark_source.errors import OptionError
from spark_source.plan import Position

MiB = 1024 * 1024


@dataclass(frozen=True)
class OffsetSpec:
    """``earliest``, ``latest``, or per-topic values (full partition or topic name -> message id
    string, ``earliest`` or ``latest``)."""

    default: str                               # "earliest" | "latest"
    per_topic: tuple[tuple[str, str], ...] = ()

    def for_partition(self, topic: str) -> str:
        """The spec for one partition: its own entry, else its partitioned parent's, else the
        default (``earliest``/``latest``) for topics the JSON does not name."""
        d = dict(self.per_topic)
        if topic in d:
            return d[topic]
        parent = str(TopicName.parse(topic).partitioned_parent)
        return d.get(parent, self.default)


def parse_offsets(name: str, text: str | None, default: str) -> OffsetSpec:
    if text is None or text.strip() == "":
        return OffsetSpec(default)
    text = text.strip()
    if text in ("earliest", "latest"):
        return OffsetSpec(text)
    try:
        raw = json.loads(text)
    except ValueError:
        raise OptionError(f"option {name}: expected earliest, latest or a JSON object of topic -> message id, "
                          f"got {text[:80]!r}") from None
    if not isinstance(raw, dict):
        raise OptionError(f"option {name}: JSON must be an object of topic -> message id")
    per_topic = []
    for topic, value in raw.items():
        try:
            full = str(TopicName.parse(topic))
        except ValueError as e:
            raise OptionError(f"option {name}: {e}") from None
        value = str(value).strip()
        if value not in ("earliest", "latest"):
            try:
                Position.parse(value)
            except ValueError as e:
                raise OptionError(f"option {name}: topic {topic}: {e}") from None
        per_topic.append((full, value))
    return OffsetSpec(default, tuple(sorted(per_topic)))


def _opt_int(options: Mapping[str, str], name: str, *, minimum: int | None = None) -> int | None:
    v = options.get(name.lower())
    if v is None or str(v).strip() == "":
        return None
    try:
        n = int(str(v).strip())
    except ValueError:
        raise OptionError(f"option {name}: expected an integer, got {v!r}") from None
    if minimum is not None and n < minimum:
        raise OptionError(f"option {name}: must be >= {minimum}, got {n}")
    return n


def _opt_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    v = options.get(name.lower())
    if v is None:
        return default
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name}: expected true or false, got {v!r}")


@dataclass(frozen=True)
class SourceOptions:
    zookeeper: str | None
    service_url: str | None
    admin_url: str | None
    topics: tuple[str, ...]
    topics_pattern: str | None
    starting: OffsetSpec
    ending: OffsetSpec
    starting_time_ms: int | None
    ending_time_ms: int | None
    fail_on_data_loss: bool
    target_partition_bytes: int
    open_segment_bytes: int
    max_entries_per_trigger: int | None
    min_partitions: int
    s3_endpoint_url: str | None
    aws_env: tuple[tuple[str, str], ...]
    metrics_dir: str | None
    # the credential presented to bookies with bookie_auth_enabled (docs/security.md): options
    # bookieAuthToken / bookieAuthTokenFile, else $PULSARLITE_BOOKIE_AUTH_TOKEN(_FILE) on the driver
    bookie_auth_token: str = field(default="", repr=False)
    bookie_auth_token_file: str = ""
    # the ZooKeeper credential (docs/security.md "ZooKeeper"): options zookeeperAuthDigest /
    # zookeeperAuthDigestFile / zookeeperAclReadRestricted, else $PULSARLITE_ZOOKEEPER_AUTH_DIGEST(_FILE)
    # and $PULSARLITE_ZOOKEEPER_ACL_READ_RESTRICTED on the driver
    zookeeper_auth_digest: str = field(default="", repr=False)
    zookeeper_auth_digest_file: str = ""
    zookeeper_acl_read_restricted: bool = False
    # TLS to the bookies: options bookieTls / bookieTlsTrustCertsFile, else $PULSARLITE_BOOKIE_TLS /
    # $PULSARLITE_BOOKIE_TLS_TRUST_CERTS_FILE on the driver (a trust file implies TLS)
    bookie_tls_enabled: bool = False
    bookie_tls_trust_certs_file_path: str = ""
    # option plannedSegments (set by spark_source.hybrid.read_topic, not by users): the segments
    # the driver already planned; the reader reads exactly these (narrowed by pushed publish-time
    # filters) instead of planning again
    planned_scans: tuple | None = None
    # option readCompacted (batch only): read each topic's compacted view, then what follows its
    # horizon (spark_source.plan.plan_partition_compacted); a topic never compacted is read whole
    read_compacted: bool = False
    # the token the admin API calls carry (``Authorization: Bearer``): options adminToken /
    # adminTokenFile (at most one; the file is read when a call is made, on the driver): where the
    # metadata store is (spark_source.discovery) and an open ledger's last confirmed entry
    # (spark_source.metadata)
    admin_token: str = field(default="", repr=False)
    admin_token_file: str = ""

    def admin_bearer(self) -> str:
        """The admin token ("" when none): ``admin_token``, or the content of ``admin_token_file``
        (OptionError when it cannot be read)."""
        return read_admin_token(self.admin_token, self.admin_token_file)

    def apply_aws_env(self) -> None:
        """Credentials given as options become the standard AWS variables of this worker."""
        for k, v in self.aws_env:
            os.environ[k] = v


_AWS_OPTIONS = {"aws_access_key_id": "AWS_ACCESS_KEY_ID", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
                "aws_session_token": "AWS_SESSION_TOKEN", "aws_region": "AWS_DEFAULT_REGION"}


def parse_options(options: Mapping[str, str], *, streaming: bool, need_topics: bool = True) -> SourceOptions:
    o = {str(k).lower(): v for k, v in options.items()}
    topic = o.get("topic")
    topics = [t.strip() for t in (o.get("topics") or "").split(",") if t.strip()]
    if topic:
        topics.insert(0, topic.strip())
    pattern = (o.get("topicspattern") or "").strip() or None
    if need_topics and not topics and not pattern:
        raise OptionError("one of the options topic, topics or topicsPattern is required")
    for t in topics:
        try:
            TopicName.parse(t)
        except ValueError as e:
            raise OptionError(f"option topic(s): {e}") from None
    starting = parse_offsets("startingOffsets", o.get("startingoffsets"), "latest" if streaming else "earliest")
    ending = parse_offsets("endingOffsets", o.get("endingoffsets"), "latest")
    if streaming and o.get("endingoffsets"):
        raise OptionError("option endingOffsets is for batch queries only")
    read_compacted = _opt_bool(o, "readCompacted", False)
    if streaming and read_compacted:
        raise OptionError("option readCompacted is for batch queries only")
    t0 = _opt_int(o, "startingTime", minimum=0)
    t1 = _opt_int(o, "endingTime", minimum=0)
    if t0 is not None and t1 is not None and t1 < t0:
        raise OptionError(f"option endingTime ({t1}) is before startingTime ({t0})")
    endpoint = (o.get("s3_endpoint_url") or o.get("s3endpointurl") or os.environ.get("AWS_ENDPOINT_URL") or None)
    aws_env = tuple((env, str(o[k])) for k, env in _AWS_OPTIONS.items() if o.get(k))
    if endpoint:
        aws_env += (("AWS_ENDPOINT_URL", endpoint),)
    return SourceOptions(
        zookeeper=(o.get("zookeeper") or "").strip() or None,
        service_url=(o.get("service_url") or o.get("serviceurl") or "").strip() or None,
        admin_url=(o.get("admin_url") or o.get("adminurl") or "").strip() or None,
        topics=tuple(topics), topics_pattern=pattern,
        starting=starting, ending=ending, starting_time_ms=t0, ending_time_ms=t1,
        fail_on_data_loss=_opt_bool(o, "failOnDataLoss", True),
        target_partition_bytes=_opt_int(o, "targetPartitionBytes", minimum=1) or 128 * MiB,
        open_segment_bytes=_opt_int(o, "openSegmentBytes", minimum=1) or 64 * MiB,
        min_partitions=_opt_int(o, "minPartitions", minimum=1) or 1,
        max_entries_per_trigger=(_opt_int(o, "maxEntriesPerTrigger", minimum=1)
                                 or _opt_int(o, "maxRecordsPerTrigger", minimum=1)),
        s3_endpoint_url=endpoint, aws_env=aws_env,
        metrics_dir=(o.get("metricsdir") or "").strip() or None,
        planned_scans=_planned(o.get("plannedsegments")), read_compacted=read_compacted,
        **_bookie_auth(o), **_zookeeper_auth(o), **_bookie_tls(o), **_admin_token(o))


def _admin_token(o: Mapping[str, str]) -> dict[str, str]:
    token, path = str(o.get("admintoken") or "").strip(), str(o.get("admintokenfile") or "").strip()
    if token and path:
        raise OptionError("give at most one of the options adminToken and adminTokenFile")
    return {"admin_token": token, "admin_token_file": path}


def read_admin_token(token: str, path: str) -> str:
    """The admin token given as ``token`` or as the file ``path`` ("" when neither)."""
    if path:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError as e:
            raise OptionError(f"option adminTokenFile: cannot read {path}: {e.strerror}") from None
    return token


def _planned(text) -> tuple | None:
    if text is None or str(text).strip() == "":
        return None
    from spark_source.plan import scan_from_dict
    try:
        raw = json.loads(text)
        if not isinstance(raw, list):
            raise ValueError("expected a JSON list")
        return tuple(scan_from_dict(d) for d in raw)
    except ValueError as e:
        raise OptionError(f"option plannedSegments (internal, set by spark_source.read_topic): {e}") from None


def _secret_options(o: Mapping[str, str], option: str, env: str) -> tuple[str, str]:
    """``(value, file)`` of a credential given as option ``option`` or ``<option>File`` (at most
    one of them: OptionError), else from the environment: ``env``, or else ``<env>_FILE``."""
    value = str(o.get(option.lower()) or "").strip()
    value_file = str(o.get(option.lower() + "file") or "").strip()
    if value and value_file:
        raise OptionError(f"give at most one of the options {option} and {option}File")
    if not value and not value_file:
        value = os.environ.get(env, "").strip()
        value_file = "" if value else os.environ.get(env + "_FILE", "").strip()
    return value, value_file


def _bookie_auth(o: Mapping[str, str]) -> dict[str, str]:
    token, token_file = _secret_options(o, "bookieAuthToken", "PULSARLITE_BOOKIE_AUTH_TOKEN")
    return {"bookie_auth_token": token, "bookie_auth_token_file": token_file}


def _zookeeper_auth(o: Mapping[str, str]) -> dict:
    digest, digest_file = _secret_options(o, "zookeeperAuthDigest", "PULSARLITE_ZOOKEEPER_AUTH_DIGEST")
    if "zookeeperaclreadrestricted" in o:
        restricted = _opt_bool(o, "zookeeperAclReadRestricted", False)
    else:
        restricted = os.environ.get("PULSARLITE_ZOOKEEPER_ACL_READ_RESTRICTED", "").strip().lower() in ("1", "true")
    settings = {"zookeeper_auth_digest": digest, "zookeeper_auth_digest_file": digest_file,
                "zookeeper_acl_read_restricted": restricted}
    from pulsarlite.config import LedgerClientConfig
    from pulsarlite.errors import ConfigError
    try:
        LedgerClientConfig(**settings).validate()
    except ConfigError as e:
        raise OptionError(f"ZooKeeper credential options: {e}") from None
    return settings


def _bookie_tls(o: Mapping[str, str]) -> dict:
    trust = str(o.get("bookietlstrustcertsfile") or "").strip()
    if "bookietls" in o:
        enabled = _opt_bool(o, "bookieTls", False)
    else:
        enabled = os.environ.get("PULSARLITE_BOOKIE_TLS", "").strip().lower() in ("1", "true")
    if not trust and "bookietlstrustcertsfile" not in o:
        trust = os.environ.get("PULSARLITE_BOOKIE_TLS_TRUST_CERTS_FILE", "").strip()
    return {"bookie_tls_enabled": enabled or bool(trust), "bookie_tls_trust_certs_file_path": trust}


def ledger_client_config(zookeeper: str, bookie_auth_token: str = "", bookie_auth_token_file: str = "",
                         settings: dict | None = None):
    """The LedgerClientConfig of the source's bookie reads (its bookie credential included;
    ``settings``: more LedgerClientConfig fields: ``source_client_settings`` of the options)."""
    from pulsarlite.config import LedgerClientConfig
    return LedgerClientConfig(zookeeper=zookeeper, bookie_auth_token=bookie_auth_token,
                              bookie_auth_token_file=bookie_auth_token_file, **(settings or {})).validate()


def source_client_settings(opts) -> dict:
    """The ZooKeeper credential and bookie TLS fields of SourceOptions or ReadSettings, as
    LedgerClientConfig fields."""
    from pulsarlite.config import bookie_tls_client_settings, zookeeper_auth_settings
    return {**zookeeper_auth_settings(opts), **bookie_tls_client_settings(opts)}


__all__ = ["OffsetSpec", "OptionError", "SourceOptions", "parse_offsets", "parse_options"]
