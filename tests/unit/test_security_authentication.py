"""Authentication providers (broker/security/authentication.py): pure, the clock passed in."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re

import bcrypt
import jwt
import pytest
from passlib.hash import apr_md5_crypt, des_crypt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from broker.config import BrokerConfig
from broker.security.authentication import (AuthenticationData, AuthenticationError, AuthenticationService,
                                            BasicAuthenticationProvider, Identity, TlsAuthenticationProvider,
                                            hash_kind, read_key_bytes)
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
        BasicAuthenticationProvider.parse_conf(b"a:" + apr_md5_crypt.hash("pw").encode() + b"\nb:$apr1$xyz\n")
    assert "xyz" not in str(info.value)


# -- Pulsar's basicAuthConf formats: APR1-MD5 (htpasswd -m) and DES crypt (htpasswd -d), bcrypt ours
def _basic(lines: bytes) -> BasicAuthenticationProvider:
    return BasicAuthenticationProvider.parse_conf(lines)


def _identify(provider, data: bytes) -> str:
    return provider.identify(AuthenticationData("basic", data)).role


@pytest.mark.parametrize("kind", ["apr1", "des", "bcrypt"])
def test_basic_each_hash_kind(kind):
    hashed = {"apr1": lambda: apr_md5_crypt.hash("s3cret-pw"), "des": lambda: des_crypt.hash("s3cretpw"),
              "bcrypt": lambda: bcrypt.hashpw(b"s3cret-pw", bcrypt.gensalt(rounds=4)).decode()}[kind]()
    password = b"s3cretpw" if kind == "des" else b"s3cret-pw"
    assert hash_kind(hashed.encode()) == kind
    provider = _basic(b"# made at test time\nalice:" + hashed.encode() + b"\n")
    assert _identify(provider, b"alice:" + password) == "alice"
    for data in (b"alice:" + password[:-1] + b"X", b"alice:", b"bob:" + password, b"alice:" + password + b"\x00"):
        with pytest.raises(AuthenticationError, match="basic: unknown user or wrong password") as info:
            _identify(provider, data)
        assert password.decode() not in str(info.value)


def test_basic_des_crypt_takes_eight_bytes_as_pulsar():
    """DES crypt (Pulsar's Crypt.crypt with the hash's 2-character salt) looks at 8 bytes only."""
    provider = _basic(b"u:" + des_crypt.hash("abcdefgh").encode())
    assert _identify(provider, b"u:abcdefgh-and-more") == "u"


def test_basic_apr1_known_vector():
    """A line as Apache's htpasswd -m writes it (the well-known APR1 vector for 'myPassword'),
    checked without making the hash ourselves."""
    provider = _basic(b"myName:$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/\n")
    assert _identify(provider, b"myName:myPassword") == "myName"
    with pytest.raises(AuthenticationError):
        _identify(provider, b"myName:mypassword")


def test_basic_unknown_user_costs_a_check_of_the_common_kind(monkeypatch):
    """No user enumeration by timing: an unknown user runs one check of the file's most common
    kind, as a known user with a wrong password does."""
    import broker.security.authentication as authentication
    calls = []
    for kind, check in list(authentication._CHECKS.items()):
        monkeypatch.setitem(authentication._CHECKS, kind,
                            lambda pw, h, kind=kind, check=check: calls.append(kind) or check(pw, h))
    provider = _basic(b"a:" + apr_md5_crypt.hash("x").encode() + b"\nb:" + apr_md5_crypt.hash("y").encode()
                      + b"\nc:" + des_crypt.hash("z").encode())
    with pytest.raises(AuthenticationError, match="unknown user or wrong password"):
        _identify(provider, b"nobody:x")
    with pytest.raises(AuthenticationError, match="unknown user or wrong password"):
        _identify(provider, b"a:wrong")
    assert calls == ["apr1", "apr1"]


@pytest.mark.parametrize("line, reason", [
    (b"no-colon-here", "line 2 is not user:hash"),
    (b":$apr1$abc$def", "line 2 is not user:hash"),
    (b"eve:", "line 2 is not user:hash"),
    (b"eve:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=", "line 2: unsupported hash for user 'eve'"),   # htpasswd -s
    (b"eve:$1$saltsalt$qjXMvbEw8oaL.CzflDugX/", "line 2: unsupported hash for user 'eve'"),   # md5_crypt
    (b"eve:$6$rounds=5000$salt$hash", "line 2: unsupported hash for user 'eve'"),
    (b"eve:plain-text-password", "line 2: unsupported hash for user 'eve'"),
    (b"eve:$apr1$bad", "line 2: unsupported hash for user 'eve'"),
    (b"eve:$2y$04$short", "line 2: unsupported hash for user 'eve'"),
    (b"alice:" + b"ab" + b"c" * 11, "line 2: user 'alice' already on line 1"),
    (b"\xff:" + b"ab" + b"c" * 11, "line 2: the user name is not UTF-8"),
])
def test_basic_malformed_line_names_the_line(line, reason):
    first = b"alice:" + des_crypt.hash("pw").encode()
    with pytest.raises(ConfigError, match=re.escape(reason)) as info:
        _basic(first + b"\n" + line + b"\n")
    assert first.split(b":")[1].decode() not in str(info.value)
    if b"$" in line:
        assert line.split(b":", 1)[1].decode() not in str(info.value)


@pytest.mark.parametrize("form", ["path", "file-url", "data-base64", "bare-base64"])
def test_basic_conf_forms_as_pulsar(tmp_path, form):
    """basicAuthConf as Pulsar reads it: a data: or file: URL, the path of a file, or base64."""
    text = b"alice:" + apr_md5_crypt.hash("pw-a").encode() + b"\n"
    (tmp_path / "users").write_bytes(text)
    value = {"path": str(tmp_path / "users"), "file-url": f"file://{tmp_path}/users",
             "data-base64": "data:;base64," + base64.b64encode(text).decode(),
             "bare-base64": base64.b64encode(text).decode()}[form]
    svc = _service(authentication_providers="basic", basic_auth_conf=value)
    assert svc.authenticate(AuthenticationData("basic", b"alice:pw-a")) == "alice"


def test_basic_conf_missing_file_names_the_setting(tmp_path):
    with pytest.raises(ConfigError, match="basic_auth_conf: cannot read"):
        _service(authentication_providers="basic", basic_auth_conf=f"file://{tmp_path}/absent")


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


def test_unreadable_key_file_names_the_setting(tmp_path, monkeypatch):
    """A key file this process may not read (PermissionError; tests run as root, so raised here)
    is a ConfigError naming the setting, not a traceback."""
    import pathlib
    (tmp_path / "k").write_bytes(b"raw")

    def refuse(self):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(pathlib.Path, "read_bytes", refuse)
    with pytest.raises(ConfigError, match="bookie_auth_token_secret_key: cannot read .*Permission denied"):
        read_key_bytes(str(tmp_path / "k"), setting="bookie_auth_token_secret_key")


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
