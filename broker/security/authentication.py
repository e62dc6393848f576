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
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import bcrypt
from passlib.hash import apr_md5_crypt, des_crypt

from broker.errors import BrokerError
from broker.tls import common_name_of
from pulsarlite.errors import ConfigError
from pulsarlite.security.tokens import TokenInvalid, TokenVerifier, load_public_key, read_key_bytes
from pulsarlite.wire import pb


class AuthenticationError(BrokerError):
    """The client has not proven a role: no credentials, unknown method, bad or expired ones.
    The message says why, never what the credential was."""

    server_error = pb.AuthenticationError


# methods whose check is slow (bcrypt; APR1-MD5 and DES crypt ~0.5 ms in pure Python): the shells (binary protocol, HTTP) run it off the event loop
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


def _check_bcrypt(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:                   # a password longer than 72 bytes (bcrypt >= 5), a NUL
        return False


def _check_passlib(handler) -> Callable[[bytes, bytes], bool]:
    def check(password: bytes, hashed: bytes) -> bool:
        try:
            return bool(handler.verify(password, hashed))
        except (ValueError, TypeError):  # passlib's PasswordValueError etc.: a NUL byte, too long
            return False
    return check


# hash kind -> check(password, hash) (constant-time comparison inside the libraries)
_CHECKS: dict[str, Callable[[bytes, bytes], bool]] = {
    "apr1": _check_passlib(apr_md5_crypt),
    "des": _check_passlib(des_crypt),
    "bcrypt": _check_bcrypt,
}


def hash_kind(hashed: bytes) -> str | None:
    """The kind of a ``basicAuthConf`` hash, as Pulsar's AuthenticationProviderBasic decides it, or
    None when it is none we take: ``$apr1$salt$checksum`` is APR1-MD5 (``htpasswd -m``, htpasswd's
    default); ``$2a$``/``$2b$``/``$2y$`` is bcrypt (``htpasswd -B``; ours only: Pulsar refuses it);
    13 characters of ``[./0-9A-Za-z]`` is DES crypt (``htpasswd -d``; Pulsar's fallback for any
    other hash). Anything else (``{SHA}``, ``$1$``, ``$5$``, ``$6$``, plain text) is refused."""
    if hashed.startswith(b"$apr1$"):
        return "apr1" if apr_md5_crypt.identify(hashed) and _parses(apr_md5_crypt, hashed) else None
    if hashed.startswith(_BCRYPT_PREFIXES):
        return "bcrypt" if len(hashed) == 60 else None
    if des_crypt.identify(hashed) and len(hashed) == 13:
        return "des"
    return None


def _parses(handler, hashed: bytes) -> bool:
    """A whole hash (salt and checksum), not a bare setting string such as ``$apr1$salt``."""
    try:
        return handler.from_string(hashed).checksum is not None
    except ValueError:
        return False


class BasicAuthenticationProvider:
    """Method ``"basic"``: data ``user:password`` (the user name ends at the first ``:``), checked
    against ``users`` (user -> hash, the lines ``user:hash`` of Pulsar's ``basicAuthConf`` file).

    Hashes (see :func:`hash_kind`): APR1-MD5 and DES crypt, as Pulsar; bcrypt too. The role is the
    user name. A user not in the file costs one check against the hash of a user of the file's most
    common kind, its result ignored (no user enumeration by timing; a file that mixes kinds still
    tells a user of a cheaper kind apart: keep to one)."""

    method = "basic"
    _DUMMY_HASH = b"$2b$10$" + b"." * 53     # a file without users: any check, all refused anyway

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users: dict[str, tuple[str, bytes]] = {}
        for user, hashed in users.items():
            kind = hash_kind(hashed)
            if kind is None:
                raise ConfigError(f"basic_auth_conf: user {user!r}: unsupported hash")
            self._users[user] = (kind, hashed)
        kinds = Counter(kind for kind, _ in self._users.values())
        if kinds:
            common = kinds.most_common(1)[0][0]
            self._dummy = next(entry for entry in self._users.values() if entry[0] == common)
        else:
            self._dummy = ("bcrypt", self._DUMMY_HASH)

    @classmethod
    def parse_conf(cls, text: bytes, *, setting: str = "basic_auth_conf") -> "BasicAuthenticationProvider":
        """Lines ``user:hash``; blank lines and ``#`` comments skipped. ConfigError names the line,
        never its hash: a line without ``user:hash``, a hash of a kind we do not take, a user
        named twice (Pulsar keeps the last one; we refuse the ambiguity)."""
        users: dict[str, bytes] = {}
        lines: dict[str, int] = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith(b"#"):
                continue
            user_b, sep, hashed = line.partition(b":")
            if not sep or not user_b or not hashed:
                raise ConfigError(f"{setting}: line {number} is not user:hash")
            try:
                user = user_b.decode("utf-8")
            except UnicodeDecodeError:
                raise ConfigError(f"{setting}: line {number}: the user name is not UTF-8") from None
            if hash_kind(hashed) is None:
                raise ConfigError(f"{setting}: line {number}: unsupported hash for user {user!r}: expected "
                                  f"APR1-MD5 ($apr1$, htpasswd -m), DES crypt (htpasswd -d) or bcrypt "
                                  f"($2y$, htpasswd -B)")
            if user in lines:
                raise ConfigError(f"{setting}: line {number}: user {user!r} already on line {lines[user]}")
            users[user], lines[user] = hashed, number
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
        entry = self._users.get(user)
        kind, hashed = entry if entry is not None else self._dummy
        ok = _CHECKS[kind](password, hashed)
        if entry is None or not ok:
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
           "BasicAuthenticationProvider", "Identity", "hash_kind", "TlsAuthenticationProvider", "TokenAuthenticationProvider",
           "load_public_key", "read_key_bytes"]
