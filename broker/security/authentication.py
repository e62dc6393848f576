"""Authentication: the credentials a client presents -> its role, or :class:`AuthenticationError`.

Protocol (as Pulsar's ``AuthenticationProvider`` / ``AuthenticationService``):

- A client presents an :class:`AuthenticationData`: the method name (``"token"``, ``"basic"``,
  ``"tls"``), the method's bytes (CONNECT's ``auth_data``, the HTTP ``Authorization`` header's
  credential), and the peer certificate of its TLS connection when there is one.
- :class:`AuthenticationService` hands it to the provider configured for that method; the provider
  answers the role it proves, or raises :class:`AuthenticationError`. A method that is not
  configured is refused.
- A client that presents nothing gets ``anonymous_user_role`` when one is configured, else it is
  refused (:meth:`AuthenticationService.authenticate_anonymous`).
- With ``authentication_enabled`` off, the service is not consulted at all (everything is served
  as before: the shells check :attr:`AuthenticationService.enabled`).

Errors name the method and what was wrong, never the credential (invariant 11).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import bcrypt

from broker.errors import BrokerError
from broker.tls import common_name_of
from pulsarlite.errors import ConfigError
from pulsarlite.security.tokens import TokenInvalid, TokenVerifier, load_public_key, read_key_bytes
from pulsarlite.wire import pb


class AuthenticationError(BrokerError):
    """The client has not proven a role: no credentials, unknown method, bad or expired ones.
    The message says why, never what the credential was."""

    server_error = pb.AuthenticationError


# methods whose check is slow (bcrypt): the shells (binary protocol, HTTP) run it off the event loop
SLOW_AUTH_METHODS = frozenset({"basic"})


@dataclass(frozen=True)
class AuthenticationData:
    """What a client presented. ``peer_certificate``: the peer certificate of its TLS connection in
    ``ssl.SSLSocket.getpeercert()`` form (a dict with ``subject`` etc.), or None without TLS or
    without a verified client certificate."""

    method: str
    data: bytes
    peer_certificate: dict | None = None


@dataclass(frozen=True)
class Identity:
    """What one check of a client's credentials proved: its role, and when the credentials expire
    (a token's ``exp``; None: they do not)."""

    role: str
    expires_at_s: float | None = None


@runtime_checkable
class AuthenticationProvider(Protocol):
    """One authentication method. ``identify`` checks the data once and returns the
    :class:`Identity` it proves, or raises :class:`AuthenticationError`; it does no I/O."""

    method: str

    def identify(self, auth: AuthenticationData) -> Identity: ...


# key material (read_key_bytes, load_public_key) and the token verification itself live in
# pulsarlite/security/tokens.py: the bookies verify tokens the same way (bookie/ must not import broker/)


# -- providers -------------------------------------------------------------------------------------
class TokenAuthenticationProvider:
    """Method ``"token"``: a JWT (Pulsar's token format). The signature must verify with the
    configured key under one of its algorithms (``alg: none`` and an algorithm of the other key
    kind are refused); ``exp`` and ``nbf`` are checked against ``clock_s()``; the role is the
    ``role_claim`` claim (``sub`` by default); with ``audience`` set, the ``audience_claim``
    claim must name it. The data may carry an HTTP ``Bearer `` prefix."""

    method = "token"

    def __init__(self, verifier: TokenVerifier | None = None, /, **verifier_settings) -> None:
        """``verifier``, or one made of ``verifier_settings`` (TokenVerifier's keyword arguments:
        key, algorithms, clock_s, role_claim, ...): the verification itself is
        pulsarlite.security.tokens (the bookies verify the same way)."""
        self._verifier = verifier if verifier is not None else TokenVerifier(server="the broker",
                                                                             **verifier_settings)

    def identify(self, auth: AuthenticationData) -> Identity:
        """One verification of the token: its role and its ``exp``."""
        try:
            claims = self._verifier.claims(auth.data)
            role = self._verifier.role_of(claims)
        except TokenInvalid as e:
            raise AuthenticationError(str(e)) from None
        exp = claims.get("exp")          # a number: claims() checked it
        return Identity(role, float(exp) if exp is not None else None)


_BCRYPT_PREFIXES = (b"$2a$", b"$2b$", b"$2y$")


class BasicAuthenticationProvider:
    """Method ``"basic"``: data ``user:password``, checked against ``users`` (user -> hash, the
    lines ``user:hash`` of Pulsar's ``basicAuthConf`` file). Hashes: bcrypt (``htpasswd -B``;
    ``$2a$``/``$2b$``/``$2y$``). The role is the user name. A user not in the file costs the same
    bcrypt check as a wrong password (no user enumeration by timing)."""

    method = "basic"
    _DUMMY_HASH = b"$2b$10$" + b"." * 53

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)

    @classmethod
    def parse_conf(cls, text: bytes, *, setting: str = "basic_auth_conf") -> "BasicAuthenticationProvider":
        """Lines ``user:hash``; blank lines and ``#`` comments skipped. ConfigError names the line,
        never its hash."""
        users: dict[str, bytes] = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith(b"#"):
                continue
            user, sep, hashed = line.partition(b":")
            if not sep or not user or not hashed:
                raise ConfigError(f"{setting}: line {number} is not user:hash")
            if not hashed.startswith(_BCRYPT_PREFIXES):
                raise ConfigError(f"{setting}: line {number}: only bcrypt hashes (htpasswd -B) are supported")
            try:
                users[user.decode("utf-8")] = hashed
            except UnicodeDecodeError:
                raise ConfigError(f"{setting}: line {number}: the user name is not UTF-8") from None
        return cls(users)

    def identify(self, auth: AuthenticationData) -> Identity:
        if len(auth.data) > 1024:
            raise AuthenticationError("basic: credentials longer than 1024 bytes")
        user_b, sep, password = bytes(auth.data).partition(b":")
        if not sep or not user_b:
            raise AuthenticationError("basic: expected user:password")
        try:
            user = user_b.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationError("basic: the user name is not UTF-8") from None
        hashed = self._users.get(user)
        try:
            ok = bcrypt.checkpw(password, hashed if hashed is not None else self._DUMMY_HASH)
        except ValueError:
            ok = False
        if hashed is None or not ok:
            raise AuthenticationError("basic: unknown user or wrong password")
        return Identity(user)


class TlsAuthenticationProvider:
    """Method ``"tls"``: the role is the common name (CN) of the client certificate the TLS
    listener verified (``peer_certificate``); no certificate, no role."""

    method = "tls"

    def identify(self, auth: AuthenticationData) -> Identity:
        if not auth.peer_certificate:
            raise AuthenticationError("tls: no verified client certificate on this connection")
        role = common_name_of(auth.peer_certificate)
        if role is None:
            raise AuthenticationError("tls: the client certificate has no common name (CN)")
        return Identity(role)


# Pulsar's class names for the providers (authenticationProviders in broker.conf)
PROVIDER_NAMES = {
    "token": "token", "org.apache.pulsar.broker.authentication.AuthenticationProviderToken": "token",
    "basic": "basic", "org.apache.pulsar.broker.authentication.AuthenticationProviderBasic": "basic",
    "tls": "tls", "org.apache.pulsar.broker.authentication.AuthenticationProviderTls": "tls",
}
ANONYMOUS_METHODS = frozenset({"", "none"})


# -- the service -----------------------------------------------------------------------------------
class AuthenticationService:
    """The configured providers by method, and the anonymous role. ``enabled`` False: the shells
    serve everyone as before and never call it."""

    def __init__(self, providers: Mapping[str, AuthenticationProvider], *, enabled: bool = True,
                 anonymous_role: str = "") -> None:
        self.providers = dict(providers)
        self.enabled = enabled
        self.anonymous_role = anonymous_role

    @classmethod
    def from_config(cls, config, *, clock_s: Callable[[], float] = time.time) -> "AuthenticationService":
        """Providers built from a BrokerConfig; key and password files are read here (broker start).
        ConfigError names the setting that is wrong."""
        if not config.authentication_enabled:
            return cls({}, enabled=False)
        providers: dict[str, AuthenticationProvider] = {}
        for name in config.authentication_provider_names:
            method = PROVIDER_NAMES.get(name)
            if method is None:
                raise ConfigError(f"authentication_providers: unknown provider {name!r} "
                                  f"(token, basic, tls or Pulsar's class names for them)")
            if method == "token":
                providers[method] = _token_provider(config, clock_s)
            elif method == "basic":
                if not config.basic_auth_conf:
                    raise ConfigError("basic_auth_conf must be set for the basic provider")
                raw = read_key_bytes(config.basic_auth_conf, setting="basic_auth_conf")
                providers[method] = BasicAuthenticationProvider.parse_conf(raw)
            else:
                providers[method] = TlsAuthenticationProvider()
        return cls(providers, enabled=True, anonymous_role=config.anonymous_user_role)

    def identify(self, auth: AuthenticationData) -> Identity:
        """The identity ``auth`` proves (credentials checked once); a client that presents
        nothing gets the anonymous role, which does not expire."""
        if auth.method in ANONYMOUS_METHODS and not auth.data:
            return Identity(self.authenticate_anonymous())
        provider = self.providers.get(auth.method)
        if provider is None:
            raise AuthenticationError(f"authentication method {auth.method[:32]!r} is not enabled on this broker "
                                      f"(enabled: {', '.join(sorted(self.providers)) or 'none'})")
        return provider.identify(auth)

    def authenticate(self, auth: AuthenticationData) -> str:
        """The role ``auth`` proves (:meth:`identify` without the expiry: HTTP requests)."""
        return self.identify(auth).role

    def authenticate_anonymous(self) -> str:
        if self.anonymous_role:
            return self.anonymous_role
        raise AuthenticationError("authentication required: no credentials presented")


def _token_provider(config, clock_s) -> TokenAuthenticationProvider:
    return TokenAuthenticationProvider(TokenVerifier.from_settings(
        secret_key=config.token_secret_key, public_key=config.token_public_key, public_alg=config.token_public_alg,
        clock_s=clock_s, role_claim=config.token_auth_claim, audience_claim=config.token_audience_claim,
        audience=config.token_audience, token_bytes_max=config.token_bytes_max, server="the broker"))


__all__ = ["AuthenticationData", "AuthenticationError", "AuthenticationProvider", "AuthenticationService",
           "BasicAuthenticationProvider", "Identity", "TlsAuthenticationProvider", "TokenAuthenticationProvider",
           "load_public_key", "read_key_bytes"]
