"""Token verification (Pulsar's JWTs), shared by the broker's token provider
(broker/security/authentication.py) and the bookie's authentication gate (bookie/server.py).

Pure: no I/O except reading key settings once at start (:func:`read_key_bytes`), and the clock
is passed in (``clock_s``). PyJWT verifies the signature; ``exp`` and ``nbf`` are checked here
against ``clock_s()``. Every error is a :class:`TokenInvalid` whose message names what was wrong,
never the token (invariant 11).
"""

from __future__ import annotations

import base64
import binascii
import os
import pathlib
import urllib.parse
from collections.abc import Callable

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from pulsarlite.errors import ConfigError, PulsarliteError

RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_ALGORITHMS = ("ES256", "ES384", "ES512")
HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")


class TokenInvalid(PulsarliteError):
    """A token that does not prove a role: malformed, badly signed, expired, wrong audience.
    The message says why, never what the token was."""


# -- key material (read once, at start) ------------------------------------------------------------
def read_key_bytes(value: str, *, setting: str) -> bytes:
    """The bytes a key setting names, in Pulsar's forms: ``file:///path``, ``data:[type][;base64],...``,
    a path to an existing file, or bare base64. ConfigError names the setting, never the value."""
    if value.startswith("data:"):
        header, sep, body = value[5:].partition(",")
        if not sep:
            raise ConfigError(f"{setting}: a data: URL needs a ',' before its data")
        if header.endswith(";base64"):
            try:
                return base64.b64decode(body, validate=True)
            except (binascii.Error, ValueError):
                raise ConfigError(f"{setting}: the data: URL's base64 does not decode") from None
        return urllib.parse.unquote_to_bytes(body)
    if value.startswith("file:"):
        path = urllib.parse.unquote(urllib.parse.urlparse(value).path)
        try:
            return pathlib.Path(path).read_bytes()
        except OSError as e:
            raise ConfigError(f"{setting}: cannot read {path}: {e.strerror}") from None
    if value and os.path.isfile(value):
        try:
            return pathlib.Path(value).read_bytes()
        except OSError as e:             # e.g. not readable by this process's user
            raise ConfigError(f"{setting}: cannot read {value}: {e.strerror}") from None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{setting}: neither a file:// or data: URL, an existing file, nor base64") from None


def load_public_key(raw: bytes, *, alg: str = "", setting: str = "token_public_key", alg_setting: str = ""):
    """(key, algorithms) from a DER (Pulsar's ``tokens create-key-pair``) or PEM public key;
    ``alg`` (the setting ``alg_setting``, default ``setting``'s ``..._public_alg``) narrows them."""
    alg_setting = alg_setting or setting.replace("public_key", "public_alg")
    try:
        if raw.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(raw)
        else:
            key = serialization.load_der_public_key(raw)
    except ValueError:
        raise ConfigError(f"{setting}: not a DER or PEM public key") from None
    if isinstance(key, rsa.RSAPublicKey):
        algorithms = RSA_ALGORITHMS
    elif isinstance(key, ec.EllipticCurvePublicKey):
        algorithms = EC_ALGORITHMS
    elif isinstance(key, ed25519.Ed25519PublicKey):
        algorithms = ("EdDSA",)
    else:
        raise ConfigError(f"{setting}: unsupported key type {type(key).__name__}")
    if alg:
        if alg not in algorithms:
            raise ConfigError(f"{alg_setting}: {alg} does not fit a {type(key).__name__.lstrip('_')}")
        algorithms = (alg,)
    return key, algorithms


# -- verification ----------------------------------------------------------------------------------
class TokenVerifier:
    """A JWT's claims, once its signature verifies with ``key`` under one of ``algorithms``
    (``alg: none`` and an algorithm of the other key kind are refused), ``exp`` and ``nbf``
    hold at ``clock_s()`` and, with ``audience`` set, the ``audience_claim`` claim names it.
    The data may carry an HTTP ``Bearer `` prefix. ``server`` names the verifier in refusals
    ("the broker takes HS256/...")."""

    def __init__(self, *, key, algorithms: tuple[str, ...], clock_s: Callable[[], float],
                 role_claim: str = "sub", audience_claim: str = "aud", audience: str = "",
                 token_bytes_max: int = 16 * 1024, server: str = "the broker") -> None:
        self._key = key
        self.algorithms = tuple(algorithms)
        self._clock_s = clock_s
        self.role_claim = role_claim
        self.audience_claim = audience_claim
        self.audience = audience
        self.token_bytes_max = token_bytes_max
        self.server = server

    def __repr__(self) -> str:       # never the key
        return f"TokenVerifier(algorithms={self.algorithms!r}, role_claim={self.role_claim!r})"

    @classmethod
    def from_settings(cls, *, secret_key: str, public_key: str, public_alg: str = "",
                      clock_s: Callable[[], float], setting_prefix: str = "", **kwargs) -> "TokenVerifier":
        """From key settings in Pulsar's forms (exactly one of ``secret_key`` / ``public_key``);
        ConfigError names the setting (``setting_prefix`` + token_secret_key / token_public_key)."""
        secret_name, public_name = setting_prefix + "token_secret_key", setting_prefix + "token_public_key"
        if bool(secret_key) == bool(public_key):
            raise ConfigError(f"token verification needs exactly one of {secret_name} and {public_name}")
        if secret_key:
            key = read_key_bytes(secret_key, setting=secret_name)
            if not key:
                raise ConfigError(f"{secret_name}: the key is empty")
            algorithms = HMAC_ALGORITHMS
        else:
            key, algorithms = load_public_key(read_key_bytes(public_key, setting=public_name),
                                              alg=public_alg, setting=public_name)
        return cls(key=key, algorithms=algorithms, clock_s=clock_s, **kwargs)

    def claims(self, data: bytes) -> dict:
        if len(data) > self.token_bytes_max:
            raise TokenInvalid(f"token: longer than {self.token_bytes_max} bytes")
        try:
            token = bytes(data).decode("ascii").strip()
        except UnicodeDecodeError:
            raise TokenInvalid("token: not a JWT (not ASCII)") from None
        if token[:7].lower() == "bearer ":
            token = token[7:].strip()
        if not token:
            raise TokenInvalid("token: empty")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise TokenInvalid("token: malformed (not a JWT)") from None
        alg = header.get("alg")
        if alg not in self.algorithms:
            raise TokenInvalid(f"token: signed with {str(alg)[:16]!r}, {self.server} takes "
                               f"{'/'.join(self.algorithms)}")
        try:
            claims = jwt.decode(token, self._key, algorithms=list(self.algorithms),
                                options={"verify_exp": False, "verify_nbf": False, "verify_iat": False,
                                         "verify_aud": False, "verify_iss": False})
        except jwt.InvalidSignatureError:
            raise TokenInvalid("token: signature does not verify") from None
        except jwt.PyJWTError as e:
            raise TokenInvalid(f"token: malformed ({type(e).__name__})") from None
        now_s = self._clock_s()
        for name, expired_if in (("exp", lambda v: now_s >= v), ("nbf", lambda v: now_s < v)):
            if name in claims:
                value = claims[name]
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    raise TokenInvalid(f"token: claim {name} is not a number")
                if expired_if(value):
                    raise TokenInvalid("token: expired" if name == "exp" else "token: not valid yet (nbf)")
        if self.audience:
            aud = claims.get(self.audience_claim)
            auds = aud if isinstance(aud, list) else [aud]
            if self.audience not in auds:
                raise TokenInvalid(f"token: audience ({self.audience_claim}) is not {self.server}'s")
        return claims

    def role(self, data: bytes) -> str:
        """The role the token proves (its ``role_claim``); raises TokenInvalid."""
        return self.role_of(self.claims(data))

    def role_of(self, claims: dict) -> str:
        """The role in verified ``claims`` (its ``role_claim``); raises TokenInvalid."""
        role = claims.get(self.role_claim)
        if not isinstance(role, str) or not role:
            raise TokenInvalid(f"token: no role in claim {self.role_claim!r}")
        return role


__all__ = ["EC_ALGORITHMS", "HMAC_ALGORITHMS", "RSA_ALGORITHMS", "TokenInvalid", "TokenVerifier",
           "load_public_key", "read_key_bytes"]
