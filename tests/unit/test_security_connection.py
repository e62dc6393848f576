"""[security] The connection core's authentication (broker/connection.py ConnectionCore): CONNECT
proves a role or is refused, slow checks go to the shell, expired credentials get AUTH_CHALLENGE.
Pure: the clock is passed in."""

from __future__ import annotations

import base64

import bcrypt
import jwt

from broker.config import BrokerConfig
from broker.connection import ConnectionCore, ConnState
from broker.security.authentication import AuthenticationError, AuthenticationService
from pulsarlite.wire import commands as c
from pulsarlite.wire import pb
from pulsarlite.wire.frames import FrameDecoder

T = pb.BaseCommand
SECRET = b"s" * 32
NOW_S = 1_800_000_000.0


def core(clock):
    users = b"u:" + bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))
    cfg = BrokerConfig(authentication_enabled=True, authentication_providers="token,basic",
                       token_secret_key=base64.b64encode(SECRET).decode(),
                       basic_auth_conf="data:;base64," + base64.b64encode(users).decode()).validate()
    service = AuthenticationService.from_config(cfg, clock_s=clock)
    return ConnectionCore(frame_bytes_max=64 * 1024, message_bytes_max=60 * 1024, authentication=service), service


def frames(out):
    return FrameDecoder().feed(b"".join(out))


def tok(sub, exp=None):
    return jwt.encode({"sub": sub, **({"exp": exp} if exp else {})}, SECRET, algorithm="HS256").encode()


def test_token_connect_and_challenge_cycle():
    now = [NOW_S]
    conn, _ = core(lambda: now[0])
    result = conn.receive(c.connect("t", auth_method_name="token", auth_data=tok("r", NOW_S + 10),
                                    supports_auth_refresh=True))
    assert [f.command.type for f in frames(result.out)] == [T.CONNECTED] and conn.role == "r"
    assert conn.check_credentials(NOW_S + 5).out == []               # not expired yet
    challenge = conn.check_credentials(NOW_S + 10)
    assert [f.command.type for f in frames(challenge.out)] == [T.AUTH_CHALLENGE] and not challenge.close
    now[0] = NOW_S + 11
    answer = conn.receive(c.auth_response("t", 19, "token", tok("r", NOW_S + 100)))
    assert not answer.close and not conn.auth_challenge_pending and conn.auth_expires_at_s == NOW_S + 100
    # another role in the answer: refused
    conn.check_credentials(NOW_S + 100)
    refused = conn.receive(c.auth_response("t", 19, "token", tok("other", NOW_S + 200)))
    assert refused.close and frames(refused.out)[0].command.error.error == pb.AuthenticationError


def test_unanswered_challenge_and_client_without_refresh_are_closed():
    conn, _ = core(lambda: NOW_S)
    conn.receive(c.connect("t", auth_method_name="token", auth_data=tok("r", NOW_S + 10), supports_auth_refresh=True))
    conn.check_credentials(NOW_S + 10)
    closed = conn.check_credentials(NOW_S + 20)
    assert closed.close and "not answered" in frames(closed.out)[0].command.error.message
    old, _ = core(lambda: NOW_S)
    old.receive(c.connect("t", auth_method_name="token", auth_data=tok("r", NOW_S + 10)))
    closed = old.check_credentials(NOW_S + 10)
    assert closed.close and "does not support" in frames(closed.out)[0].command.error.message


def test_basic_goes_to_the_shell_and_completes():
    conn, service = core(lambda: NOW_S)
    result = conn.receive(c.connect("t", auth_method_name="basic", auth_data=b"u:pw"))
    assert result.out == [] and result.authenticate is not None and conn.state is ConnState.AUTHENTICATING
    early = ConnectionCore(frame_bytes_max=64 * 1024, message_bytes_max=60 * 1024, authentication=service)
    early.receive(c.connect("t", auth_method_name="basic", auth_data=b"u:pw"))
    assert early.receive(c.ping()).close                         # nothing before CONNECTED
    done = conn.complete_authentication(result.authenticate, service.identify(result.authenticate), None)
    assert [f.command.type for f in frames(done.out)] == [T.CONNECTED] and conn.role == "u"
    bad, _ = core(lambda: NOW_S)
    pending = bad.receive(c.connect("t", auth_method_name="basic", auth_data=b"u:wrong")).authenticate
    try:
        service.authenticate(pending)
        raise AssertionError("wrong password accepted")
    except AuthenticationError as e:
        out = bad.complete_authentication(pending, None, e)
    assert out.close and frames(out.out)[0].command.error.error == pb.AuthenticationError


def test_refused_connect_says_why_and_never_the_credential():
    conn, _ = core(lambda: NOW_S)
    forged = jwt.encode({"sub": "r"}, b"x" * 32, algorithm="HS256").encode()
    result = conn.receive(c.connect("t", auth_method_name="token", auth_data=forged))
    error = frames(result.out)[0].command.error
    assert result.close and error.error == pb.AuthenticationError and "signature" in error.message
    assert forged.decode() not in error.message


def test_connect_verifies_the_token_signature_once(monkeypatch):
    """Role and expiry come from one verification (the signature check is the costly part of a
    CONNECT with a token; it ran twice, once for the role and once for the expiry)."""
    import pulsarlite.security.tokens as tokens
    decodes = []
    real_decode = tokens.jwt.decode

    def counting_decode(*args, **kwargs):
        decodes.append(1)
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(tokens.jwt, "decode", counting_decode)
    conn, _ = core(lambda: NOW_S)
    result = conn.receive(c.connect("t", auth_method_name="token", auth_data=tok("r", NOW_S + 10),
                                    supports_auth_refresh=True))
    assert [f.command.type for f in frames(result.out)] == [T.CONNECTED]
    assert (conn.role, conn.auth_expires_at_s, len(decodes)) == ("r", NOW_S + 10, 1)
    # a refresh on AUTH_CHALLENGE: one more verification
    conn.check_credentials(NOW_S + 10)
    conn.receive(c.auth_response("t", 19, "token", tok("r", NOW_S + 100)))
    assert (conn.auth_expires_at_s, len(decodes)) == (NOW_S + 100, 2)
