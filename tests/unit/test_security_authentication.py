"""Authentication providers (broker/security/authentication.py): pure, the clock passed in."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import bcrypt
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from broker.config import BrokerConfig
from broker.security.authentication import (AuthenticationData, AuthenticationError, AuthenticationService,
                                            BasicAuthenticationProvider, Identity, TlsAuthenticationProvider,
                                            read_key_bytes)
from pulsarlite.errors import ConfigError

SECRET = b"k" * 32
NOW_S = 1_700_000_000.0


def _service(clock_s=lambda: NOW_S, **kw) -> AuthenticationService:
    cfg = BrokerConfig(authentication_enabled=True, **kw).validate()
    return AuthenticationService.from_config(cfg, clock_s=clock_s)


def _hs_service(**kw):
    return _service(authentication_providers="token",
                    token_secret_key="data:;base64," + base64.b64encode(SECRET).decode(), **kw)


def _token(claims, key=SECRET, alg="HS256") -> bytes:
    return jwt.encode(claims, key, algorithm=alg).encode()


def _hs256_by_hand(claims, key: bytes) -> bytes:
    """An HS256 JWT built without PyJWT (which refuses an asymmetric key as an HMAC secret)."""
    def b64(raw: bytes) -> bytes:
        return base64.urlsafe_b64encode(raw).rstrip(b"=")
    signing_input = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + b"." + b64(json.dumps(claims).encode())
    return signing_input + b"." + b64(hmac.new(key, signing_input, hashlib.sha256).digest())


def test_hs256_token_gives_its_subject():
    svc = _hs_service()
    assert svc.authenticate(AuthenticationData("token", _token({"sub": "alice"}))) == "alice"
    assert svc.authenticate(AuthenticationData("token", b"Bearer " + _token({"sub": "bob"}))) == "bob"


@pytest.mark.parametrize("data, reason", [
    (_token({"sub": "alice"}, key=b"x" * 32), "signature does not verify"),       # forged
    (_token({"sub": "alice", "exp": int(NOW_S) - 1}), "expired"),
    (_token({"sub": "alice", "nbf": int(NOW_S) + 60}), "not valid yet"),
    (b"not.a.jwt", "malformed"),
    (b"\xff\xfe garbage", "not ASCII"),
    (b"", "empty"),
    (b"a" * 20_000, "longer than"),
    (_token({"name": "alice"}), "no role in claim 'sub'"),
    (jwt.encode({"sub": "alice"}, None, algorithm="none").encode(), "signed with 'none'"),
])
def test_bad_tokens_are_refused_with_a_reason(data, reason):
    svc = _hs_service()
    with pytest.raises(AuthenticationError, match=reason) as info:
        svc.authenticate(AuthenticationData("token", data))
    assert "alice" not in str(info.value) and SECRET.decode() not in str(info.value)


def test_exp_is_checked_against_the_clock_passed_in():
    now = [NOW_S]
    svc = _hs_service(clock_s=lambda: now[0])
    auth = AuthenticationData("token", _token({"sub": "alice", "exp": int(NOW_S) + 10}))
    assert svc.authenticate(auth) == "alice"
    assert svc.identify(auth) == Identity("alice", NOW_S + 10)
    now[0] = NOW_S + 10
    with pytest.raises(AuthenticationError, match="expired"):
        svc.authenticate(auth)


def test_role_claim_and_audience_are_configurable():
    svc = _hs_service(token_auth_claim="role", token_audience="brokers")
    assert svc.authenticate(AuthenticationData("token", _token({"role": "r1", "aud": ["brokers"]}))) == "r1"
    with pytest.raises(AuthenticationError, match="audience"):
        svc.authenticate(AuthenticationData("token", _token({"role": "r1", "aud": "other"})))


@pytest.mark.parametrize("make_key, alg", [
    (lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256"),
    (lambda: ec.generate_private_key(ec.SECP256R1()), "ES256"),
])
def test_public_key_tokens_der_and_pem(tmp_path, make_key, alg):
    private = make_key()
    der = private.public_key().public_bytes(serialization.Encoding.DER,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "public.key").write_bytes(der)
    svc = _service(authentication_providers="token", token_public_key=f"file://{tmp_path}/public.key")
    assert svc.authenticate(AuthenticationData("token", _token({"sub": "carol"}, private, alg))) == "carol"
    # an HS256 token "signed" with the public key's bytes (algorithm confusion) is refused
    with pytest.raises(AuthenticationError, match="signed with 'HS256'"):
        svc.authenticate(AuthenticationData("token", _hs256_by_hand({"sub": "carol"}, der)))
    other = make_key()
    with pytest.raises(AuthenticationError, match="signature"):
        svc.authenticate(AuthenticationData("token", _token({"sub": "carol"}, other, alg)))
    pem = private.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "public.pem").write_bytes(pem)
    svc = _service(authentication_providers="org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
                   token_public_key=str(tmp_path / "public.pem"), token_public_alg=alg)
    assert svc.authenticate(AuthenticationData("token", _token({"sub": "carol"}, private, alg))) == "carol"


def test_anonymous_and_unknown_methods():
    svc = _hs_service()
    with pytest.raises(AuthenticationError, match="no credentials"):
        svc.authenticate(AuthenticationData("", b""))
    with pytest.raises(AuthenticationError, match="'basic' is not enabled"):
        svc.authenticate(AuthenticationData("basic", b"u:p"))
    assert _hs_service(anonymous_user_role="anon").authenticate(AuthenticationData("none", b"")) == "anon"


def test_basic_bcrypt_file(tmp_path):
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).replace(b"$2b$", b"$2y$")
    (tmp_path / "users").write_bytes(b"# users\nsuper:" + hashed + b"\n\n")
    svc = _service(authentication_providers="basic,token", token_secret_key=base64.b64encode(SECRET).decode(),
                   basic_auth_conf=str(tmp_path / "users"))
    assert svc.authenticate(AuthenticationData("basic", b"super:s3cret")) == "super"
    for data in (b"super:wrong", b"nobody:s3cret", b"no-colon", b":x"):
        with pytest.raises(AuthenticationError, match="basic"):
            svc.authenticate(AuthenticationData("basic", data))


def test_basic_conf_errors_name_the_line_not_the_hash():
    with pytest.raises(ConfigError, match="line 2") as info:
        BasicAuthenticationProvider.parse_conf(b"a:$2y$04$abc\nb:$apr1$xyz\n")
    assert "xyz" not in str(info.value)


def test_tls_provider_takes_the_common_name():
    cert = {"subject": ((("countryName", "NL"),), (("commonName", "client-1"),))}
    assert TlsAuthenticationProvider().identify(AuthenticationData("tls", b"", cert)) == Identity("client-1")
    with pytest.raises(AuthenticationError, match="no verified client certificate"):
        TlsAuthenticationProvider().identify(AuthenticationData("tls", b"", None))
    with pytest.raises(AuthenticationError, match="no common name"):
        TlsAuthenticationProvider().identify(AuthenticationData("tls", b"", {"subject": ()}))


def test_key_forms(tmp_path):
    (tmp_path / "k").write_bytes(b"raw")
    assert read_key_bytes(f"file://{tmp_path}/k", setting="s") == b"raw"
    assert read_key_bytes(str(tmp_path / "k"), setting="s") == b"raw"
    assert read_key_bytes("data:;base64,cmF3", setting="s") == b"raw"
    assert read_key_bytes("cmF3", setting="s") == b"raw"
    with pytest.raises(ConfigError, match="token_secret_key"):
        read_key_bytes("not base64 !", setting="token_secret_key")


def test_config_errors():
    with pytest.raises(ConfigError, match="exactly one"):
        _service(authentication_providers="token")
    with pytest.raises(ConfigError, match="unknown provider"):
        _service(authentication_providers="kerberos")
    with pytest.raises(ConfigError, match="needs authentication_providers"):
        BrokerConfig(authentication_enabled=True).validate()
    assert not AuthenticationService.from_config(BrokerConfig()).enabled


def test_config_repr_never_shows_secrets():
    cfg = BrokerConfig(authentication_enabled=True, authentication_providers="token,basic",
                       token_secret_key="data:;base64,U0VDUkVUS0VZ", basic_auth_conf="data:,u:$2y$hash").validate()
    assert "U0VDUkVUS0VZ" not in repr(cfg) and "$2y$hash" not in repr(cfg)
