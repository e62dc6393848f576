"""Client authentication and TLS, with the official client's constructors:
``AuthenticationToken(token | supplier)``, ``AuthenticationBasic(username, password)``,
``AuthenticationTLS(certificate_path, private_key_path)``, and
:func:`authentication_from_plugin` for ``authPlugin`` / ``authParams`` (client.conf, the CLI's
``--auth-plugin`` / ``--auth-params``) with Pulsar's class names.

The protocol: CONNECT carries ``auth_method_name`` and ``auth_data`` (:meth:`auth_data` is asked
for fresh data every time); the broker's AUTH_CHALLENGE is answered with AUTH_RESPONSE carrying
fresh data (a token supplier is called again, a token file read again). ``tls`` sends no data:
the client certificate in the TLS handshake is the proof. Secrets never appear in ``repr`` or
error messages.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from typing import Callable

from pulsarlite.client.errors import InvalidConfiguration


class Authentication:
    """Base of the client's authentication methods."""

    method = "none"

    def auth_data(self) -> bytes:
        return b""

    def tls_certificate(self) -> tuple[str, str] | None:
        """(certificate file, private key file) for the TLS handshake, or None."""
        return None

    def __repr__(self) -> str:                 # never the secret
        return f"{type(self).__name__}(method={self.method!r})"


class AuthenticationToken(Authentication):
    """A JWT, given as a string or as a callable returning one (called for every CONNECT and
    every AUTH_CHALLENGE: a supplier that returns a fresh token keeps a connection alive past
    the first token's expiry)."""

    method = "token"

    def __init__(self, token: "str | Callable[[], str]") -> None:
        if not (isinstance(token, str) or callable(token)):
            raise InvalidConfiguration("AuthenticationToken takes a token string or a callable returning one")
        self._token = token

    def auth_data(self) -> bytes:
        token = self._token() if callable(self._token) else self._token
        if not isinstance(token, str) or not token:
            raise InvalidConfiguration("AuthenticationToken: the token supplier returned no token")
        return token.strip().encode()


class AuthenticationBasic(Authentication):
    """``username:password`` (Pulsar's basic provider); ``auth_params_string`` is the JSON
    ``{"userId": ..., "password": ...}`` of pulsar-client's form."""

    def __init__(self, username: str | None = None, password: str | None = None, method: str = "basic",
                 auth_params_string: str | None = None) -> None:
        if auth_params_string is not None:
            try:
                params = json.loads(auth_params_string)
                username, password = params["userId"], params["password"]
            except (ValueError, KeyError, TypeError):
                raise InvalidConfiguration('AuthenticationBasic: auth_params_string must be JSON '
                                           '{"userId": ..., "password": ...}') from None
        if not isinstance(username, str) or not isinstance(password, str) or not username or ":" in username:
            raise InvalidConfiguration("AuthenticationBasic needs a username (without ':') and a password")
        self.method = method
        self._data = f"{username}:{password}".encode()

    def auth_data(self) -> bytes:
        return self._data


class AuthenticationTLS(Authentication):
    """A client certificate and its key (PEM files), presented in the TLS handshake; the broker's
    TLS provider takes the certificate's CN as the role."""

    method = "tls"

    def __init__(self, certificate_path: str, private_key_path: str) -> None:
        if not certificate_path or not private_key_path:
            raise InvalidConfiguration("AuthenticationTLS needs a certificate file and a private key file")
        self._files = (str(certificate_path), str(private_key_path))

    def tls_certificate(self) -> tuple[str, str] | None:
        return self._files


_TOKEN_PLUGINS = {"token", "org.apache.pulsar.client.impl.auth.AuthenticationToken"}
_BASIC_PLUGINS = {"basic", "org.apache.pulsar.client.impl.auth.AuthenticationBasic"}
_TLS_PLUGINS = {"tls", "org.apache.pulsar.client.impl.auth.AuthenticationTls"}


def _token_file_supplier(path: str) -> Callable[[], str]:
    def read() -> str:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError as e:
            raise InvalidConfiguration(f"authParams: cannot read the token file {path}: {e.strerror}") from None
    return read


def _key_values(params: str) -> dict[str, str]:
    """``k1:v1,k2:v2`` (Pulsar's older form) or JSON."""
    params = params.strip()
    if params.startswith("{"):
        try:
            doc = json.loads(params)
        except ValueError:
            raise InvalidConfiguration("authParams: not valid JSON") from None
        return {str(k): str(v) for k, v in doc.items()}
    out = {}
    for item in params.split(","):
        key, sep, value = item.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def authentication_from_plugin(plugin: str, params: str) -> Authentication | None:
    """``authPlugin`` + ``authParams`` as client.conf and Pulsar's CLI take them: the token plugin
    with ``token:XYZ``, ``file:///path`` (read again at every use) or a bare token; the basic
    plugin with ``{"userId":..,"password":..}`` or ``userId:..,password:..``; the TLS plugin with
    ``tlsCertFile:..,tlsKeyFile:..`` or its JSON. An empty plugin: no authentication."""
    plugin = (plugin or "").strip()
    params = params or ""
    if not plugin:
        return None
    if plugin in _TOKEN_PLUGINS:
        value = params.strip()
        if value.startswith("{"):
            value = _key_values(value).get("token", "")
        if value.startswith("token:"):
            return AuthenticationToken(value[len("token:"):])
        if value.startswith("file://"):
            return AuthenticationToken(_token_file_supplier(value[len("file://"):]))
        if not value:
            raise InvalidConfiguration("authParams: the token plugin needs token:XYZ or file:///path")
        return AuthenticationToken(value)
    if plugin in _BASIC_PLUGINS:
        values = _key_values(params)
        return AuthenticationBasic(values.get("userId"), values.get("password"))
    if plugin in _TLS_PLUGINS:
        values = _key_values(params)
        return AuthenticationTLS(values.get("tlsCertFile", ""), values.get("tlsKeyFile", ""))
    raise InvalidConfiguration(f"authPlugin {plugin!r}: pulsarlite's client knows the token, basic and TLS "
                               "plugins (org.apache.pulsar.client.impl.auth.AuthenticationToken, "
                               "AuthenticationBasic, AuthenticationTls)")


@dataclass(frozen=True)
class ClientSecurity:
    """TLS and authentication settings of one client (pulsar.Client's keyword arguments)."""

    authentication: Authentication | None = None
    use_tls: bool = False                       # implied by a pulsar+ssl:// service URL
    tls_trust_certs_file_path: str | None = None   # None: the system's CAs
    tls_allow_insecure_connection: bool = False    # do not verify the broker's certificate
    tls_validate_hostname: bool = False            # check the certificate names the host
    tls_certificate_file_path: str | None = None   # client certificate (mTLS) without AuthenticationTLS
    tls_private_key_file_path: str | None = None

    def __post_init__(self) -> None:
        if self.authentication is not None and not isinstance(self.authentication, Authentication):
            raise InvalidConfiguration(
                f"authentication= takes pulsarlite.AuthenticationToken / AuthenticationBasic / AuthenticationTLS, "
                f"got {type(self.authentication).__module__}.{type(self.authentication).__name__}")
        if bool(self.tls_certificate_file_path) != bool(self.tls_private_key_file_path):
            raise InvalidConfiguration("tls_certificate_file_path and tls_private_key_file_path go together")

    def ssl_context(self) -> ssl.SSLContext:
        """The client side of a ``pulsar+ssl://`` connection."""
        try:
            context = ssl.create_default_context(cafile=self.tls_trust_certs_file_path or None)
        except (OSError, ssl.SSLError) as e:
            raise InvalidConfiguration(f"tls_trust_certs_file_path: cannot load "
                                       f"{self.tls_trust_certs_file_path}: {getattr(e, 'strerror', None) or e}") from None
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = bool(self.tls_validate_hostname) and not self.tls_allow_insecure_connection
        if self.tls_allow_insecure_connection:
            context.verify_mode = ssl.CERT_NONE
        files = (self.authentication.tls_certificate() if self.authentication is not None else None) \
            or ((self.tls_certificate_file_path, self.tls_private_key_file_path)
                if self.tls_certificate_file_path else None)
        if files:
            try:
                context.load_cert_chain(*files)
            except (OSError, ssl.SSLError) as e:
                raise InvalidConfiguration(f"client certificate {files[0]} / its key: cannot load "
                                           f"({type(e).__name__})") from None
        return context


__all__ = ["Authentication", "AuthenticationBasic", "AuthenticationTLS", "AuthenticationToken", "ClientSecurity",
           "authentication_from_plugin"]
