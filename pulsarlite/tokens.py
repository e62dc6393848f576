"""Pulsar's token format, for ``pulsarlite tokens`` (faces/cli_tokens.py): JWTs signed with
a secret key (HS256/HS384/HS512) or a private key (RS256.. / ES256..), the role in ``sub``, an
optional ``exp``. Files are Pulsar's: ``create-secret-key`` writes the key's raw bytes (base64
with ``--base64``); ``create-key-pair`` writes DER (PKCS#8 private key, X.509
SubjectPublicKeyInfo public key), which the broker's ``token_secret_key`` /
``token_public_key`` take as ``file:///path`` (or ``data:;base64,...``).

Pure functions: randomness (``token_bytes``) and the time (``now_s``) are passed in; PyJWT and
cryptography do the signing.
"""

from __future__ import annotations

import base64
import json
import re

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from pulsarlite.errors import ConfigError, PulsarliteError
from pulsarlite.security.tokens import HMAC_ALGORITHMS, TokenInvalid, TokenVerifier, load_public_key


class TokenError(PulsarliteError):
    """A key, token or option the tokens tool cannot use (the message never holds a key)."""


HMAC_KEY_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}       # as Pulsar's Keys.secretKeyFor
RSA_ALGORITHMS = ("RS256", "RS384", "RS512")
EC_CURVES = {"ES256": ec.SECP256R1, "ES384": ec.SECP384R1, "ES512": ec.SECP521R1}
RSA_KEY_BITS = 2048

_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400, "y": 365 * 86_400}
_RELATIVE = re.compile(r"^\s*(\d+)\s*([smhdwy]?)\s*$")


def parse_relative_time_s(text: str) -> int:
    """Pulsar's relative times (``--expiry-time``): ``30s``, ``10m``, ``3h``, ``2d``, ``1w``,
    ``1y``; a bare number is seconds."""
    match = _RELATIVE.match(text.lower())
    if not match or int(match.group(1)) <= 0:
        raise TokenError(f"--expiry-time: {text!r} is not a positive relative time (e.g. 30s, 10m, 3h, 2d, 1w, 1y)")
    return int(match.group(1)) * _UNIT_S[match.group(2) or "s"]


def create_secret_key(algorithm: str, token_bytes) -> bytes:
    """A new secret key: ``token_bytes(n)`` random bytes (secrets.token_bytes in the CLI)."""
    if algorithm not in HMAC_KEY_BYTES:
        raise TokenError(f"--signature-algorithm: a secret key is for {'/'.join(HMAC_KEY_BYTES)}, not {algorithm}")
    key = token_bytes(HMAC_KEY_BYTES[algorithm])
    if len(key) != HMAC_KEY_BYTES[algorithm]:
        raise TokenError("the random source returned a key of the wrong size")
    return key


def create_key_pair(algorithm: str) -> tuple[bytes, bytes]:
    """(private key DER PKCS#8, public key DER SubjectPublicKeyInfo) for RS*/ES*."""
    if algorithm in RSA_ALGORITHMS:
        private = rsa.generate_private_key(public_exponent=65537, key_size=RSA_KEY_BITS)
    elif algorithm in EC_CURVES:
        private = ec.generate_private_key(EC_CURVES[algorithm]())
    else:
        raise TokenError(f"--signature-algorithm: a key pair is for {'/'.join(RSA_ALGORITHMS + tuple(EC_CURVES))}, "
                         f"not {algorithm}")
    private_der = private.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())
    public_der = private.public_key().public_bytes(serialization.Encoding.DER,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo)
    return private_der, public_der


def load_private_key(raw: bytes):
    """A private key from DER (Pulsar's) or PEM bytes."""
    try:
        if raw.lstrip().startswith(b"-----BEGIN"):
            return serialization.load_pem_private_key(raw, password=None)
        return serialization.load_der_private_key(raw, password=None)
    except (ValueError, TypeError):
        raise TokenError("--private-key: not an unencrypted DER or PEM private key") from None


def _algorithm_of_private_key(key, algorithm: str | None) -> str:
    if isinstance(key, rsa.RSAPrivateKey):
        allowed = RSA_ALGORITHMS
    elif isinstance(key, ec.EllipticCurvePrivateKey):
        allowed = tuple(a for a, curve in EC_CURVES.items() if isinstance(key.curve, curve))
    else:
        raise TokenError(f"--private-key: unsupported key type {type(key).__name__}")
    if algorithm is None:
        return allowed[0]
    if algorithm not in allowed:
        raise TokenError(f"--signature-algorithm {algorithm} does not fit this private key ({'/'.join(allowed)})")
    return algorithm


def create_token(*, subject: str, now_s: float, secret_key: bytes | None = None, private_key: bytes | None = None,
                 algorithm: str | None = None, expiry_s: int | None = None,
                 headers: dict[str, str] | None = None) -> str:
    """A signed JWT with ``sub`` = subject (and ``exp`` = now + expiry when given), as Pulsar's
    ``tokens create``: exactly one of ``secret_key`` (raw bytes) and ``private_key`` (DER/PEM)."""
    if not subject:
        raise TokenError("--subject must name the role")
    if (secret_key is None) == (private_key is None):
        raise TokenError("give exactly one of --secret-key and --private-key")
    claims: dict = {"sub": subject}
    if expiry_s is not None:
        claims["exp"] = int(now_s) + int(expiry_s)
    if secret_key is not None:
        alg = algorithm or "HS256"
        if alg not in HMAC_KEY_BYTES:
            raise TokenError(f"--signature-algorithm {alg} does not fit a secret key ({'/'.join(HMAC_KEY_BYTES)})")
        if not secret_key:
            raise TokenError("--secret-key: the key is empty")
        key = secret_key
    else:
        key = load_private_key(private_key)
        alg = _algorithm_of_private_key(key, algorithm)
    return jwt.encode(claims, key, algorithm=alg, headers=dict(headers or {}) or None)


def show_token(token: str) -> dict:
    """Header and claims of a token, its signature not checked (``tokens show``)."""
    token = _strip(token)
    try:
        return {"header": jwt.get_unverified_header(token),
                "body": jwt.decode(token, options={"verify_signature": False})}
    except jwt.PyJWTError as e:
        raise TokenError(f"not a JWT ({type(e).__name__})") from None


def validate_token(token: str, *, now_s: float, secret_key: bytes | None = None,
                   public_key: bytes | None = None) -> dict:
    """The claims of a token whose signature verifies with the key and that has not expired
    (``tokens validate``), checked as the broker and the bookies check them
    (pulsarlite/security/tokens.py); TokenError saying why not."""
    token = _strip(token)
    if (secret_key is None) == (public_key is None):
        raise TokenError("give exactly one of --secret-key and --public-key")
    if secret_key is not None:
        key, algorithms = secret_key, HMAC_ALGORITHMS
    else:
        try:
            key, algorithms = load_public_key(public_key, setting="--public-key")
        except ConfigError as e:
            raise TokenError(str(e)) from None
    verifier = TokenVerifier(key=key, algorithms=algorithms, clock_s=lambda: now_s, server="this key")
    try:
        return verifier.claims(token.encode("ascii", "replace"))
    except TokenInvalid as e:
        raise TokenError(f"invalid: {e}") from None


def encode_key_output(raw: bytes, as_base64: bool) -> bytes:
    """What ``create-secret-key`` writes: the raw bytes, or their base64 with ``--base64``."""
    return base64.b64encode(raw) if as_base64 else raw


def _strip(token: str) -> str:
    token = token.strip()
    if token[:7].lower() == "bearer ":
        token = token[7:].strip()
    if not token:
        raise TokenError("no token given")
    return token


def dumps(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True)


__all__ = ["TokenError", "parse_relative_time_s", "create_secret_key", "create_key_pair", "create_token",
           "show_token", "validate_token", "load_private_key", "encode_key_output"]
