"""pulsarlite/tokens.py and `pulsarlite tokens` (Pulsar's token format): keys, signing, expiry,
and the broker's token provider taking what the tool makes."""

from __future__ import annotations

import base64
import random

import pytest
from cryptography.hazmat.primitives import serialization

from broker.security.authentication import (AuthenticationData, AuthenticationError, TokenAuthenticationProvider,
                                            load_public_key, read_key_bytes)
from faces.cli import main
from pulsarlite.tokens import (TokenError, create_key_pair, create_secret_key, create_token, parse_relative_time_s,
                               show_token, validate_token)

NOW_S = 1_800_000_000


def _rng_bytes(seed: int):
    rng = random.Random(seed)
    return lambda n: bytes(rng.getrandbits(8) for _ in range(n))


@pytest.mark.parametrize("text, seconds", [("30s", 30), ("10m", 600), ("3h", 10_800), ("2d", 172_800),
                                           ("1w", 604_800), ("1y", 31_536_000), ("45", 45), (" 5M ", 300)])
def test_relative_times(text, seconds):
    assert parse_relative_time_s(text) == seconds


@pytest.mark.parametrize("text", ["", "0s", "-1h", "1x", "h", "1.5h"])
def test_bad_relative_times(text):
    with pytest.raises(TokenError, match="--expiry-time"):
        parse_relative_time_s(text)


def test_secret_key_sizes_and_algorithms():
    assert len(create_secret_key("HS256", _rng_bytes(1))) == 32
    assert len(create_secret_key("HS512", _rng_bytes(1))) == 64
    with pytest.raises(TokenError):
        create_secret_key("RS256", _rng_bytes(1))


def test_hs256_token_round_trip_and_the_broker_provider_takes_it():
    key = create_secret_key("HS256", _rng_bytes(2))
    token = create_token(subject="alice", secret_key=key, now_s=NOW_S, expiry_s=3600)
    assert show_token(token) == {"header": {"alg": "HS256", "typ": "JWT"}, "body": {"sub": "alice", "exp": NOW_S + 3600}}
    assert validate_token(token, secret_key=key, now_s=NOW_S)["sub"] == "alice"
    with pytest.raises(TokenError, match="expired"):
        validate_token(token, secret_key=key, now_s=NOW_S + 3600)
    with pytest.raises(TokenError, match="signature"):
        validate_token(token, secret_key=create_secret_key("HS256", _rng_bytes(3)), now_s=NOW_S)
    # the broker reads Pulsar's key forms: data: URL of the raw bytes
    raw = read_key_bytes("data:;base64," + base64.b64encode(key).decode(), setting="token_secret_key")
    provider = TokenAuthenticationProvider(key=raw, algorithms=("HS256",), clock_s=lambda: NOW_S)
    assert provider.identify(AuthenticationData("token", token.encode(), None)).role == "alice"
    late = TokenAuthenticationProvider(key=raw, algorithms=("HS256",), clock_s=lambda: NOW_S + 7200)
    with pytest.raises(AuthenticationError):
        late.identify(AuthenticationData("token", token.encode(), None))


@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
def test_key_pairs_are_der_and_sign_tokens_the_broker_verifies(algorithm):
    private_der, public_der = create_key_pair(algorithm)
    serialization.load_der_private_key(private_der, password=None)       # Pulsar's formats: DER
    serialization.load_der_public_key(public_der)
    token = create_token(subject="svc", private_key=private_der, now_s=NOW_S)
    assert show_token(token)["header"]["alg"] == algorithm
    assert validate_token(token, public_key=public_der, now_s=NOW_S) == {"sub": "svc"}
    key, algorithms = load_public_key(public_der)
    provider = TokenAuthenticationProvider(key=key, algorithms=algorithms, clock_s=lambda: NOW_S)
    assert provider.identify(AuthenticationData("token", token.encode(), None)).role == "svc"
    other_private, _ = create_key_pair(algorithm)
    forged = create_token(subject="svc", private_key=other_private, now_s=NOW_S)
    with pytest.raises(TokenError, match="signature"):
        validate_token(forged, public_key=public_der, now_s=NOW_S)


def test_create_refuses_bad_combinations():
    key = create_secret_key("HS256", _rng_bytes(4))
    private_der, _ = create_key_pair("ES256")
    with pytest.raises(TokenError, match="exactly one"):
        create_token(subject="a", now_s=NOW_S)
    with pytest.raises(TokenError, match="subject"):
        create_token(subject="", secret_key=key, now_s=NOW_S)
    with pytest.raises(TokenError, match="does not fit"):
        create_token(subject="a", secret_key=key, algorithm="RS256", now_s=NOW_S)
    with pytest.raises(TokenError, match="does not fit"):
        create_token(subject="a", private_key=private_der, algorithm="RS256", now_s=NOW_S)
    with pytest.raises(TokenError, match="not a JWT"):
        show_token("not-a-token")


def test_cli_end_to_end(tmp_path, capsys):
    key_file = tmp_path / "secret.key"
    assert main(["tokens", "create-secret-key", "--output", str(key_file)]) == 0
    assert len(key_file.read_bytes()) == 32 and (key_file.stat().st_mode & 0o777) == 0o600
    assert main(["tokens", "create", "--secret-key", f"file://{key_file}", "--subject", "bob",
                 "--expiry-time", "1h", "--headers", "kid=k1"]) == 0
    token = capsys.readouterr().out.strip()
    assert main(["tokens", "show", "-i", token]) == 0
    shown = capsys.readouterr().out
    assert '"kid": "k1"' in shown and '"sub": "bob"' in shown
    assert main(["tokens", "validate", "-i", token, "-sk", f"file://{key_file}"]) == 0
    capsys.readouterr()
    other = tmp_path / "other.key"
    main(["tokens", "create-secret-key", "-o", str(other)])
    assert main(["tokens", "validate", "-i", token, "-sk", str(other)]) == 1
    err = capsys.readouterr().err
    assert "signature" in err and key_file.read_bytes().hex() not in err
    assert main(["tokens", "create-secret-key", "--base64"]) == 0
    assert len(base64.b64decode(capsys.readouterr().out, validate=True)) == 32
    priv, pub = tmp_path / "p.key", tmp_path / "p.pub"
    assert main(["tokens", "create-key-pair", "-a", "RS256", "--output-private-key", str(priv),
                 "--output-public-key", str(pub)]) == 0
    assert main(["tokens", "create", "-pk", str(priv), "-s", "carol"]) == 0
    token = capsys.readouterr().out.strip()
    assert main(["tokens", "validate", "-i", token, "-pk", f"file://{pub}"]) == 0
    assert '"sub": "carol"' in capsys.readouterr().out
