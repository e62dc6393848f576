"""Pulsar's ``broker.conf`` / ``standalone.conf`` (Java properties) read into BrokerConfig fields,
for ``pulsarlite broker --pulsar-conf FILE`` and ``pulsarlite standalone --pulsar-conf FILE``: a
Pulsar operator's settings carry over.

Pure: :func:`parse_properties` (text -> ordered key/values) and :func:`map_pulsar_conf`
(key/values -> BrokerConfig overrides + the keys we do not read). An empty value means "not set"
(Pulsar's files list most keys with empty values): the key is skipped. A value that does not parse
raises ConfigError naming the key (never echoing the value of a secret-bearing key). Values of
``authenticationProviders``, ``superUserRoles``, ``tokenSecretKey`` / ``tokenPublicKey``
(``file://``, ``data:`` forms) and ``basicAuthConf`` pass through as strings: the broker resolves
them when it starts (broker/security/authentication.py).

The broker's credential towards the bookies comes from Pulsar's three ``bookkeeperClientAuthentication*``
keys where their meaning matches ours (a token, docs/security.md): the plugin
``org.apache.pulsar.client.impl.auth.AuthenticationToken`` (or ``token``) with parameters
``token:<jwt>`` (-> ``[ledger_client] bookie_auth_token``) or ``file:///path`` (-> ``bookie_auth_token_file``), as
Pulsar's token plugin reads them. BookKeeper's SASL plugin (JAAS, Kerberos / DIGEST-MD5) and any
other plugin are refused with a message saying what to use instead; parameters without a plugin
too. ``bookkeeperClientAuthenticationParametersName`` (the BookKeeper property the parameters
would be stored under) has no meaning here and is accepted and ignored.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass

from pulsarlite.config import apply_settings
from pulsarlite.errors import ConfigError

PORT = "port"
BOOL = "bool"
STRING = "string"
SECRET = "secret"          # a string never echoed in an error
ZK_URL = "zk-url"
MILLIS = "millis"          # a positive integer
SECONDS = "seconds"        # a positive integer of seconds, to a field in milliseconds

# Pulsar key -> (BrokerConfig field, kind)
PULSAR_KEYS: dict[str, tuple[str, str]] = {
    "brokerServicePort": ("port", PORT),
    "brokerServicePortTls": ("broker_service_port_tls", PORT),
    "webServicePort": ("http_port", PORT),
    "webServicePortTls": ("web_service_port_tls", PORT),
    "tlsCertificateFilePath": ("tls_certificate_file_path", STRING),
    "tlsKeyFilePath": ("tls_key_file_path", STRING),
    "tlsTrustCertsFilePath": ("tls_trust_certs_file_path", STRING),
    "tlsRequireTrustedClientCertOnConnect": ("tls_require_trusted_client_cert_on_connect", BOOL),
    "tlsAllowInsecureConnection": ("tls_allow_insecure_connection", BOOL),
    "authenticationEnabled": ("authentication_enabled", BOOL),
    "authenticationProviders": ("authentication_providers", STRING),
    "authorizationEnabled": ("authorization_enabled", BOOL),
    "superUserRoles": ("superuser_roles", STRING),
    "anonymousUserRole": ("anonymous_user_role", STRING),
    "tokenSecretKey": ("token_secret_key", SECRET),
    "tokenPublicKey": ("token_public_key", SECRET),
    "tokenPublicAlg": ("token_public_alg", STRING),
    "tokenAuthClaim": ("token_auth_claim", STRING),
    "tokenAudienceClaim": ("token_audience_claim", STRING),
    "tokenAudience": ("token_audience", STRING),
    "basicAuthConf": ("basic_auth_conf", SECRET),
    "authenticateMetricsEndpoint": ("authenticate_metrics_endpoint", BOOL),
    "authenticationRefreshCheckSeconds": ("authentication_refresh_check_interval_ms", SECONDS),
    "advertisedAddress": ("advertised_host", STRING),
    "advertisedListeners": ("advertised_listeners", STRING),
    "internalListenerName": ("internal_listener_name", STRING),
    "clusterName": ("cluster_name", STRING),
    "metadataStoreUrl": ("zookeeper", ZK_URL),
    "zookeeperServers": ("zookeeper", ZK_URL),
    "metadataStoreSessionTimeoutMillis": ("zk_session_timeout_ms", MILLIS),
    "zookeeperSessionTimeoutMs": ("zk_session_timeout_ms", MILLIS),
}

# Pulsar's broker -> bookie authentication keys, mapped together (_bookkeeper_client_auth)
BK_AUTH_PLUGIN = "bookkeeperClientAuthenticationPlugin"
BK_AUTH_PARAMS_NAME = "bookkeeperClientAuthenticationParametersName"
BK_AUTH_PARAMS = "bookkeeperClientAuthenticationParameters"
BK_AUTH_KEYS = (BK_AUTH_PLUGIN, BK_AUTH_PARAMS_NAME, BK_AUTH_PARAMS)
BK_TOKEN_PLUGINS = frozenset({"org.apache.pulsar.client.impl.auth.AuthenticationToken", "token"})
BK_SASL_PLUGINS = frozenset({"org.apache.bookkeeper.sasl.SASLClientProviderFactory"})

# settings that name files (relative paths are resolved by PulsarConf.with_paths_resolved); the
# key settings may also hold bare base64
KEY_FIELDS = frozenset({"token_secret_key", "token_public_key"})
PATH_FIELDS = frozenset({"tls_certificate_file_path", "tls_key_file_path", "tls_trust_certs_file_path",
                         "basic_auth_conf", "ledger_client.bookie_auth_token_file"}) | KEY_FIELDS

# keys a standalone decides itself (it runs its own ZooKeeper): read, not applied
STANDALONE_OWNED_FIELDS = frozenset({"zookeeper"})


@dataclass(frozen=True)
class PulsarConf:
    """What a Pulsar conf file says, as BrokerConfig fields; ``unknown`` are the keys with a value
    that pulsarlite does not read (in file order, each once)."""

    overrides: dict
    unknown: tuple[str, ...]

    def warning(self, source: str) -> str | None:
        """The one warning line about the unknown keys (None if there are none)."""
        if not self.unknown:
            return None
        return (f"{source}: {len(self.unknown)} key(s) not used by pulsarlite (ignored): "
                f"{', '.join(self.unknown)}")


    def with_paths_resolved(self, base_dir: str) -> "PulsarConf":
        """File settings given as relative paths made absolute against ``base_dir``: for a
        process whose working directory is not the user's (the standalone's children run in
        its data directory). ``file:`` and ``data:`` values and bare base64 keys are kept."""
        resolved = dict(self.overrides)
        for name in PATH_FIELDS:
            value = resolved.get(name)
            if not isinstance(value, str) or not value or os.path.isabs(value) \
                    or value.startswith(("data:", "file:")):
                continue
            candidate = os.path.join(base_dir, value)
            if name in KEY_FIELDS and not os.path.exists(candidate):
                continue            # a bare base64 key, not a path
            if name == "basic_auth_conf" and not os.path.exists(candidate) and _is_base64(value):
                continue            # Pulsar's basicAuthConf may be the file's content in base64
            resolved[name] = os.path.abspath(candidate)
        return PulsarConf(resolved, self.unknown)

    def fields(self, skip_fields: frozenset = frozenset()) -> dict:
        """The overrides less ``skip_fields``."""
        return {k: v for k, v in self.overrides.items() if k not in skip_fields}

    def apply(self, config, source: str, skip_fields: frozenset = frozenset()):
        """``config`` (a BrokerConfig) with the overrides, validated; ConfigError names the Pulsar
        key(s) behind a refused value."""
        overrides = self.fields(skip_fields)
        try:
            return apply_settings(config, overrides, source=source).validate()
        except ConfigError as e:
            keys = [key for key, (name, _) in PULSAR_KEYS.items()
                    if name in overrides and name.rpartition(".")[2] in str(e)]
            text = str(e) if str(e).startswith(f"{source}: ") else f"{source}: {e}"
            raise ConfigError(text + (f" (from {', '.join(keys)})" if keys else "")) from None


def _is_base64(value: str) -> bool:
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def parse_properties(text: str, *, source: str = "pulsar conf") -> list[tuple[str, str]]:
    """Java properties, as Pulsar writes them: ``key=value`` (or ``key: value`` / ``key value``),
    ``#`` and ``!`` comments, a trailing backslash continues a line; blanks around keys and
    values are dropped. Later keys override earlier ones (as Java's Properties)."""
    pairs: list[tuple[str, str]] = []
    pending = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = (pending + raw.lstrip()) if pending else raw.strip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut < 0:
            key, _, value = line.partition(" ")
        else:
            key, value = line[:cut], line[cut + 1:]
        key, value = key.strip(), value.strip()
        if not key:
            raise ConfigError(f"{source}: line {number}: no key")
        pairs.append((key, value))
    if pending:
        pairs.append((pending.partition("=")[0].strip(), pending.partition("=")[2].strip()))
    return pairs


def _convert(key: str, kind: str, value: str):
    if kind == PORT:
        if not value.isdigit() or not 0 < int(value) <= 65535:
            raise ConfigError(f"{key}: {value!r} is not a port (1..65535)")
        return int(value)
    if kind == BOOL:
        lowered = value.lower()
        if lowered not in ("true", "false"):
            raise ConfigError(f"{key}: {value!r} is not true or false")
        return lowered == "true"
    if kind == MILLIS:
        if not value.isdigit() or int(value) <= 0:
            raise ConfigError(f"{key}: {value!r} is not a positive number of milliseconds")
        return int(value)
    if kind == SECONDS:
        if not value.isdigit() or int(value) <= 0:
            raise ConfigError(f"{key}: {value!r} is not a positive number of seconds")
        return int(value) * 1000
    if kind == ZK_URL:
        hosts = value
        for prefix in ("metadata-store:", "zk:"):
            if hosts.startswith(prefix):
                hosts = hosts[len(prefix):]
        if hosts.startswith("//"):
            hosts = hosts[2:]
        if not hosts or any(ch.isspace() for ch in hosts) or ":" not in hosts:
            raise ConfigError(f"{key}: {value!r} is not a ZooKeeper connect string (host:port[,host:port][/chroot])")
        return hosts
    return value


def map_pulsar_conf(pairs: list[tuple[str, str]]) -> PulsarConf:
    """BrokerConfig overrides from Pulsar's keys; ConfigError naming the first bad key."""
    overrides: dict = {}
    unknown: list[str] = []
    bk_auth: dict[str, str] = {}
    for key, value in pairs:
        if key in BK_AUTH_KEYS:
            bk_auth[key] = value            # the last one wins, as Java's Properties
            continue
        mapped = PULSAR_KEYS.get(key)
        if mapped is None:
            if value and key not in unknown:
                unknown.append(key)
            continue
        if not value:
            continue            # Pulsar's "not set"
        field_name, kind = mapped
        overrides[field_name] = _convert(key, kind, value)
    overrides.update(_bookkeeper_client_auth(bk_auth))
    return PulsarConf(overrides, tuple(unknown))


def _bookkeeper_client_auth(values: dict[str, str]) -> dict:
    """BrokerConfig fields from Pulsar's bookkeeperClientAuthentication* keys (module docstring);
    ConfigError naming the key, never echoing the parameters (they hold the token)."""
    plugin, params = values.get(BK_AUTH_PLUGIN, ""), values.get(BK_AUTH_PARAMS, "")
    if not plugin:
        if params:
            raise ConfigError(f"{BK_AUTH_PARAMS} is set but {BK_AUTH_PLUGIN} is not: set {BK_AUTH_PLUGIN}="
                              f"org.apache.pulsar.client.impl.auth.AuthenticationToken")
        return {}
    if plugin in BK_SASL_PLUGINS:
        raise ConfigError(f"{BK_AUTH_PLUGIN}: {plugin} (SASL: JAAS, Kerberos or DIGEST-MD5) is not supported: "
                          f"pulsarlite bookies authenticate tokens (docs/security.md); set {BK_AUTH_PLUGIN}="
                          f"org.apache.pulsar.client.impl.auth.AuthenticationToken and {BK_AUTH_PARAMS}="
                          f"file:///path/to/broker.token")
    if plugin not in BK_TOKEN_PLUGINS:
        raise ConfigError(f"{BK_AUTH_PLUGIN}: {plugin!r} is not supported: pulsarlite bookies authenticate "
                          f"tokens only; use org.apache.pulsar.client.impl.auth.AuthenticationToken")
    if params.startswith("token:") and params[len("token:"):].strip():
        return {"ledger_client.bookie_auth_token": params[len("token:"):].strip(),
                "ledger_client.bookie_auth_token_file": ""}
    if params.startswith("file:") and params[len("file:"):].strip("/ "):
        path = params[len("file:"):]
        if path.startswith("//"):
            path = path[2:]
        return {"ledger_client.bookie_auth_token": "", "ledger_client.bookie_auth_token_file": path}
    raise ConfigError(f"{BK_AUTH_PARAMS}: expected token:<jwt> or file:///path/to/token for {plugin} "
                      f"(value not shown)")


def read_pulsar_conf(path: str) -> PulsarConf:
    """The file at ``path`` read and mapped; ConfigError naming the file and the key."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"--pulsar-conf {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--pulsar-conf {path}: not UTF-8 text") from None
    try:
        return map_pulsar_conf(parse_properties(text, source=path))
    except ConfigError as e:
        raise ConfigError(f"--pulsar-conf {path}: {e}") from None


__all__ = ["PULSAR_KEYS", "PulsarConf", "STANDALONE_OWNED_FIELDS", "map_pulsar_conf", "parse_properties",
           "read_pulsar_conf"]
