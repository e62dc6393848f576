"""Connection defaults for the command line and the client: a small `key=value` file like
Pulsar's client.conf.

Precedence, highest first: command-line flag > config file > environment > built-in default.

    webServiceUrl=http://127.0.0.1:8080
    brokerServiceUrl=pulsar://127.0.0.1:6650

The file is ``--client-conf PATH``, else ``$PULSARLITE_CLIENT_CONF``, else
``~/.config/pulsarlite/client.conf``. A file named explicitly (flag or variable) must exist; the
default file may be absent. The environment variables ``PULSARLITE_SERVICE_URL`` and
``PULSARLITE_ADMIN_URL`` give the URLs when no file sets them. Security keys of Pulsar's
client.conf are read ([security]): ``authPlugin`` / ``authParams`` (token, basic, TLS plugins by
Pulsar's class names), ``tlsTrustCertsFilePath``, ``tlsAllowInsecureConnection``,
``tlsEnableHostnameVerification``, ``tlsCertificateFilePath`` / ``tlsKeyFilePath`` (``useTls`` is
implied by a ``pulsar+ssl://`` / ``https://`` URL); the flags ``--auth-plugin``, ``--auth-params``,
``--tls-trust-certs-file-path``, ``--tls-allow-insecure-connection``,
``--tls-enable-hostname-verification`` override them. Other keys are accepted and kept in
``properties``; a line that is not ``key=value`` or a URL that is malformed raises ConfigError
naming the file and line.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import pathlib
import urllib.parse
from dataclasses import dataclass, field
from typing import Mapping

from pulsarlite.errors import ConfigError

DEFAULT_SERVICE_URL = "pulsar://127.0.0.1:6650"
DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"
DEFAULT_CONF_PATH = "~/.config/pulsarlite/client.conf"
CONF_PATH_ENV = "PULSARLITE_CLIENT_CONF"
SERVICE_URL_ENV = "PULSARLITE_SERVICE_URL"
ADMIN_URL_ENV = "PULSARLITE_ADMIN_URL"

CONF_FILE_BYTES_MAX = 1024 * 1024  # a client.conf is a few lines; refuse anything huge
_SERVICE_SCHEMES = ("pulsar", "pulsar+ssl")
# client.conf key -> ClientConfig field (strings; the booleans are converted)
_SECURITY_KEYS = {"authPlugin": "auth_plugin", "authParams": "auth_params",
                  "tlsTrustCertsFilePath": "tls_trust_certs_file_path",
                  "tlsAllowInsecureConnection": "tls_allow_insecure_connection",
                  "tlsEnableHostnameVerification": "tls_enable_hostname_verification",
                  "tlsCertificateFilePath": "tls_certificate_file_path", "tlsKeyFilePath": "tls_key_file_path"}
_BOOL_FIELDS = ("tls_allow_insecure_connection", "tls_enable_hostname_verification")
_ADMIN_SCHEMES = ("http", "https")


@dataclass(frozen=True)
class ClientConfig:
    service_url: str = DEFAULT_SERVICE_URL
    admin_url: str = DEFAULT_ADMIN_URL
    source: str = "default"  # the file read, or "default" when none was
    properties: Mapping[str, str] = field(default_factory=dict)  # other client.conf keys, verbatim
    # [security] (never printed: auth_params may hold a secret)
    auth_plugin: str = ""
    auth_params: str = field(default="", repr=False)
    tls_trust_certs_file_path: str = ""
    tls_allow_insecure_connection: bool = False
    tls_enable_hostname_verification: bool = False
    tls_certificate_file_path: str = ""
    tls_key_file_path: str = ""

    def authentication(self):
        """The client's Authentication object for authPlugin/authParams (None without)."""
        from pulsarlite.client.auth import authentication_from_plugin
        return authentication_from_plugin(self.auth_plugin, self.auth_params)

    def client_kwargs(self) -> dict:
        """Keyword arguments of ``pulsarlite.Client`` for these settings."""
        kwargs: dict = {"authentication": self.authentication()}
        if self.tls_trust_certs_file_path:
            kwargs["tls_trust_certs_file_path"] = self.tls_trust_certs_file_path
        if self.tls_allow_insecure_connection:
            kwargs["tls_allow_insecure_connection"] = True
        if self.tls_enable_hostname_verification:
            kwargs["tls_validate_hostname"] = True
        if self.tls_certificate_file_path:
            kwargs["tls_certificate_file_path"] = self.tls_certificate_file_path
            kwargs["tls_private_key_file_path"] = self.tls_key_file_path
        return kwargs

    def http_authorization(self) -> str | None:
        """The ``Authorization`` header of admin calls: ``Bearer <token>`` or ``Basic ...``; None
        for no plugin or the TLS plugin (its certificate goes in the TLS handshake)."""
        authentication = self.authentication()
        if authentication is None or authentication.method == "tls":
            return None
        data = authentication.auth_data()
        if authentication.method == "token":
            return "Bearer " + data.decode()
        return "Basic " + base64.b64encode(data).decode()

    def http_ssl_context(self):
        """The context of ``https://`` admin calls (None for http://)."""
        if not self.admin_url.startswith("https://"):
            return None
        from pulsarlite.client.auth import ClientSecurity
        return ClientSecurity(use_tls=True, **self.client_kwargs()).ssl_context()


def validate_service_url(url: str, where: str = "service URL") -> str:
    """``pulsar://host:port[,host:port...]`` (or ``pulsar+ssl://``); returns it without a trailing slash."""
    url = url.strip().rstrip("/")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in _SERVICE_SCHEMES:
        raise ConfigError(f"{where}: {url!r} is not a pulsar://host:port or pulsar+ssl://host:port URL")
    for hostport in rest.split(","):
        _check_hostport(hostport, url, where)
    return url


def validate_admin_url(url: str, where: str = "admin URL") -> str:
    """``http(s)://host:port``; returns it without a trailing slash."""
    url = url.strip().rstrip("/")
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in _ADMIN_SCHEMES or not parsed.netloc:
        raise ConfigError(f"{where}: {url!r} is not an http://host:port URL")
    _check_hostport(parsed.netloc, url, where)
    return url


def _check_hostport(hostport: str, url: str, where: str) -> None:
    host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "")
    if not host:
        raise ConfigError(f"{where}: {url!r} has no host")
    if port and (not port.isdigit() or not 0 < int(port) < 65536):
        raise ConfigError(f"{where}: {url!r} has a bad port {port!r}")


def parse_client_conf(text: str, source: str = "<string>") -> dict[str, str]:
    """The ``key=value`` lines of a client.conf; ``#`` comments and blank lines skipped."""
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{source}:{lineno}: expected key=value, got {raw.strip()!r}")
        out[key] = value.strip()
    return out


def conf_path(path: str | None = None, env: Mapping[str, str] | None = None) -> tuple[pathlib.Path, bool]:
    """The config file to read and whether it was named explicitly (then it must exist)."""
    env = os.environ if env is None else env
    if path:
        return pathlib.Path(path).expanduser(), True
    if env.get(CONF_PATH_ENV):
        return pathlib.Path(env[CONF_PATH_ENV]).expanduser(), True
    home = env.get("HOME")
    default = pathlib.Path(home) / DEFAULT_CONF_PATH[2:] if home else pathlib.Path(DEFAULT_CONF_PATH).expanduser()
    return default, False


def load_client_config(path: str | None = None, *, env: Mapping[str, str] | None = None) -> ClientConfig:
    """Defaults, overridden by the environment, overridden by the config file."""
    env = os.environ if env is None else env
    service_url, admin_url = DEFAULT_SERVICE_URL, DEFAULT_ADMIN_URL
    if env.get(SERVICE_URL_ENV):
        service_url = validate_service_url(env[SERVICE_URL_ENV], f"${SERVICE_URL_ENV}")
    if env.get(ADMIN_URL_ENV):
        admin_url = validate_admin_url(env[ADMIN_URL_ENV], f"${ADMIN_URL_ENV}")
    file, explicit = conf_path(path, env)
    if not file.exists():
        if explicit:
            raise ConfigError(f"client config {str(file)!r} does not exist")
        return ClientConfig(service_url, admin_url)
    try:
        if file.stat().st_size > CONF_FILE_BYTES_MAX:
            raise ConfigError(f"client config {str(file)!r} is larger than {CONF_FILE_BYTES_MAX} bytes")
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"client config {str(file)!r} cannot be read: {e}") from None
    values = parse_client_conf(text, str(file))
    if values.get("brokerServiceUrl"):
        service_url = validate_service_url(values["brokerServiceUrl"], f"{file}: brokerServiceUrl")
    if values.get("webServiceUrl"):
        admin_url = validate_admin_url(values["webServiceUrl"], f"{file}: webServiceUrl")
    extra = {k: v for k, v in values.items()
             if k not in ("brokerServiceUrl", "webServiceUrl") and k not in _SECURITY_KEYS}
    security = {}
    for key, name in _SECURITY_KEYS.items():
        if values.get(key):
            security[name] = _bool(values[key], f"{file}: {key}") if name in _BOOL_FIELDS else values[key]
    return ClientConfig(service_url, admin_url, str(file), extra, **security)


def _bool(value: str, where: str) -> bool:
    if value.strip().lower() not in ("true", "false"):
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    return value.strip().lower() == "true"


def add_connection_flags(parser) -> None:
    """``--service-url``, ``--admin-url``, ``--client-conf`` on an argparse parser."""
    g = parser.add_argument_group("connection")
    g.add_argument("--service-url", default=None, metavar="URL",
                   help=f"broker service URL (default: client.conf, ${SERVICE_URL_ENV}, {DEFAULT_SERVICE_URL})")
    g.add_argument("--admin-url", default=None, metavar="URL",
                   help=f"broker HTTP admin URL (default: client.conf, ${ADMIN_URL_ENV}, {DEFAULT_ADMIN_URL})")
    g.add_argument("--client-conf", default=None, metavar="PATH",
                   help=f"client config file (default: ${CONF_PATH_ENV} or {DEFAULT_CONF_PATH})")
    g.add_argument("--auth-plugin", default=None, metavar="CLASS",
                   help="authentication plugin, as Pulsar's (org.apache.pulsar.client.impl.auth.AuthenticationToken, "
                        "AuthenticationBasic, AuthenticationTls; or token / basic / tls)")
    g.add_argument("--auth-params", default=None, metavar="PARAMS",
                   help="its parameters: token:XYZ or file:///path for tokens, {\"userId\":..,\"password\":..} "
                        "for basic, tlsCertFile:..,tlsKeyFile:.. for TLS")
    g.add_argument("--tls-trust-certs-file-path", default=None, metavar="PEM",
                   help="CA certificates that sign the broker's certificate (default: the system's)")
    g.add_argument("--tls-allow-insecure-connection", action="store_true", default=None,
                   help="do not verify the broker's certificate")
    g.add_argument("--tls-enable-hostname-verification", action="store_true", default=None,
                   help="check that the broker's certificate names the host connected to")


def resolve_connection(args, *, env: Mapping[str, str] | None = None) -> ClientConfig:
    """The connection for parsed ``args``: the flags over :func:`load_client_config`."""
    cfg = load_client_config(getattr(args, "client_conf", None), env=env)
    service_url, admin_url = cfg.service_url, cfg.admin_url
    if getattr(args, "service_url", None):
        service_url = validate_service_url(args.service_url, "--service-url")
    if getattr(args, "admin_url", None):
        admin_url = validate_admin_url(args.admin_url, "--admin-url")
    flags = {name: getattr(args, name) for name in ("auth_plugin", "auth_params", "tls_trust_certs_file_path",
                                                     "tls_allow_insecure_connection",
                                                     "tls_enable_hostname_verification")
             if getattr(args, name, None) is not None}
    return dataclasses.replace(cfg, service_url=service_url, admin_url=admin_url, **flags)
