"""[security] Authentication against a real secured broker process (token + basic providers),
with the official client and at the wire level: good credentials are served, forged, expired,
malformed and garbage ones are refused with AuthenticationError (binary) or 401 (HTTP) while the
broker keeps serving others; tokens are refreshed through AUTH_CHALLENGE."""

from __future__ import annotations

import base64
import json
import os
import socket
import time
import urllib.error
import urllib.request

import bcrypt
import jwt
import pytest
from passlib.hash import apr_md5_crypt, des_crypt

from pulsarlite.wire import commands as c
from pulsarlite.wire import pb
from pulsarlite.wire.frames import FrameDecoder

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000
T = pb.BaseCommand
SECRET = os.urandom(32)
ADMIN_PASSWORD = "pw-" + base64.urlsafe_b64encode(os.urandom(9)).decode()
# Pulsar's basicAuthConf hash kinds, made here at test time (never checked in): APR1-MD5 as
# `htpasswd -m` writes it, and DES crypt (8 significant bytes)
APR1_PASSWORD = "apr-" + base64.urlsafe_b64encode(os.urandom(9)).decode()
DES_PASSWORD = base64.urlsafe_b64encode(os.urandom(6)).decode()


ISSUED: list[str] = []          # every token made here: none may show up anywhere (test_secrets_stay_secret)


def token(sub: str, *, key: bytes = SECRET, exp_s: float | None = None) -> str:
    claims = {"sub": sub}
    if exp_s is not None:
        claims["exp"] = int(exp_s)
    made = jwt.encode(claims, key, algorithm="HS256")
    ISSUED.append(made)
    return made


@pytest.fixture(scope="module")
def secured(module_cluster_factory, module_tmp_path):
    key_path = module_tmp_path / "secret.key"
    key_path.write_bytes(SECRET)
    users = module_tmp_path / "users.htpasswd"
    users.write_bytes(b"admin:" + bcrypt.hashpw(ADMIN_PASSWORD.encode(), bcrypt.gensalt(rounds=4)) + b"\n"
                      + f"apr-admin:{apr_md5_crypt.hash(APR1_PASSWORD)}\n".encode()
                      + f"des-admin:{des_crypt.hash(DES_PASSWORD)}\n".encode())
    return module_cluster_factory(3, brokers=1, broker_overrides={
        "authentication_enabled": True, "authentication_providers": "token,basic",
        "authorization_enabled": True, "superuser_roles": "admin,apr-admin,des-admin",
        "token_secret_key": f"file://{key_path}", "basic_auth_conf": str(users),
        "authentication_refresh_check_interval_ms": 1_000, "authenticate_metrics_endpoint": True})


def broker_address(cluster) -> tuple[str, int]:
    host, port = cluster.service_url.removeprefix("pulsar://").split(",")[0].split(":")
    return host, int(port)


def broker_log(cluster) -> str:
    return open(cluster.records["broker-1"].log, errors="replace").read()


def roundtrip(cluster, authentication, topic: str) -> None:
    client = pulsar.Client(cluster.service_url, authentication=authentication, operation_timeout_seconds=10)
    try:
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        producer.send(b"hello")
        assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"hello"
    finally:
        client.close()


def refused(cluster, authentication) -> str:
    # a refused client only ever times out (see below): a short timeout keeps the suite short;
    # the broker log's reason is what proves the refusal
    client = pulsar.Client(cluster.service_url, authentication=authentication, operation_timeout_seconds=2)
    try:
        with pytest.raises(Exception) as info:
            client.create_producer("persistent://public/default/refused")
        return str(info.value)
    finally:
        client.close()


def test_superuser_token_produces_and_consumes(secured):
    roundtrip(secured, pulsar.AuthenticationToken(token("admin")), "persistent://public/default/token-ok")


@pytest.mark.parametrize("case", ["forged", "expired", "malformed", "none"])
def test_bad_tokens_are_refused_and_others_still_served(secured, case):
    auth = {"forged": pulsar.AuthenticationToken(token("admin", key=os.urandom(32))),
            "expired": pulsar.AuthenticationToken(token("admin", exp_s=time.time() - 10)),
            "malformed": pulsar.AuthenticationToken("this-is-not-a-jwt"),
            "none": None}[case]
    # the C++ client drops a connection whose first frame is not CONNECTED and retries until its
    # operation timeout (it reports TimeOut); the ERROR it was sent is checked at the wire below
    refused(secured, auth)
    reason = {"forged": "signature does not verify", "expired": "token: expired",
              "malformed": "malformed", "none": "no credentials"}[case]
    assert "authentication refused method=" in broker_log(secured)
    assert reason in broker_log(secured)
    roundtrip(secured, pulsar.AuthenticationToken(token("admin")), f"persistent://public/default/after-{case}")


def test_basic_authentication(secured):
    roundtrip(secured, pulsar.AuthenticationBasic("admin", ADMIN_PASSWORD), "persistent://public/default/basic-ok")
    refused(secured, pulsar.AuthenticationBasic("admin", "wrong"))
    assert "basic: unknown user or wrong password" in broker_log(secured)


@pytest.mark.parametrize("user, password", [("apr-admin", APR1_PASSWORD), ("des-admin", DES_PASSWORD)],
                         ids=["apr1", "des"])      # the passwords are random: ids the same in every xdist worker
def test_basic_authentication_pulsar_hash_kinds(secured, user, password):
    """A Pulsar operator's basicAuthConf lines (APR1-MD5 from htpasswd -m, DES crypt) work with the
    official client's AuthenticationBasic; a wrong password and an unknown user are refused."""
    roundtrip(secured, pulsar.AuthenticationBasic(user, password), f"persistent://public/default/basic-{user}")
    before = broker_log(secured).count("basic: unknown user or wrong password")
    refused(secured, pulsar.AuthenticationBasic(user, "X" + password))
    refused(secured, pulsar.AuthenticationBasic(user + "-nobody", password))
    assert broker_log(secured).count("basic: unknown user or wrong password") >= before + 2


def _exchange(address, frame: bytes, *, wait_s: float = 10.0) -> tuple[list, bool]:
    """Send ``frame`` on a new connection; the frames answered and whether the broker closed it."""
    decoder = FrameDecoder()
    frames, closed = [], False
    with socket.create_connection(address, timeout=wait_s) as sock:
        sock.sendall(frame)
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    closed = True
                    break
                frames.extend(decoder.feed(data))
                if any(f.command.type == T.CONNECTED for f in frames):
                    break
        except (ConnectionResetError, BrokenPipeError):
            closed = True
    return frames, closed


@pytest.mark.parametrize("method, data, expected_error, reason", [
    ("token", os.urandom(2_000), pb.AuthenticationError, "token: not a JWT"),
    ("token", b"a.b.c", pb.AuthenticationError, "token: malformed"),
    ("kerberos", b"x", pb.AuthenticationError, "is not enabled"),
    ("basic", b"\xff" * 100, pb.AuthenticationError, "basic:"),
    ("token", b"x" * 200_000, pb.NotAllowedError, "frame too large"),
])
def test_garbage_auth_on_connect_is_answered_clearly(secured, method, data, expected_error, reason):
    frames, closed = _exchange(broker_address(secured), c.connect("garbage", auth_method_name=method, auth_data=data))
    assert closed
    errors = [f.command.error for f in frames if f.command.type == T.ERROR]
    assert not any(f.command.type == T.CONNECTED for f in frames)
    assert len(errors) == 1 and errors[0].error == expected_error and reason in errors[0].message, errors
    roundtrip(secured, pulsar.AuthenticationToken(token("admin")), "persistent://public/default/after-garbage")


def _http(cluster, path: str, headers: dict | None = None) -> tuple[int, dict | str]:
    request = urllib.request.Request(cluster.admin_url + path, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read().decode()
            status = response.status
    except urllib.error.HTTPError as e:
        body, status = e.read().decode(), e.code
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def test_http_bearer_basic_and_garbage(secured):
    assert _http(secured, "/admin/v2/tenants", {"Authorization": f"Bearer {token('admin')}"}) == (200, ["public"])
    basic = base64.b64encode(f"admin:{ADMIN_PASSWORD}".encode()).decode()
    assert _http(secured, "/admin/v2/tenants", {"Authorization": f"Basic {basic}"})[0] == 200
    for headers, reason in [({}, "no credentials"),
                            ({"Authorization": f"Bearer {token('admin', key=b'y' * 32)}"}, "signature"),
                            ({"Authorization": "Bearer " + "z" * 7000}, "malformed"),
                            ({"Authorization": "Basic !!!"}, "not base64"),
                            ({"Authorization": "Negotiate abc"}, "unsupported Authorization scheme")]:
        status, body = _http(secured, "/admin/v2/tenants", headers)
        assert status == 401 and reason in body["reason"], (headers.keys(), status, body)
    # with authenticate_metrics_endpoint, /metrics needs a role (any); a role that is not a superuser: 403
    status, body = _http(secured, "/metrics")
    assert status == 401 and "no credentials" in body["reason"]
    assert _http(secured, "/metrics", {"Authorization": f"Bearer {token('someone')}"})[0] == 200
    status, body = _http(secured, "/admin/v2/clusters", {"Authorization": f"Bearer {token('someone')}"})
    assert status == 403 and "not a superuser" in body["reason"]


def test_metadata_location_route_is_for_superusers(secured):
    """GET /admin/v2/pulsarlite/metadata names ZooKeeper (full access): superusers only; the
    Spark source's discovery sends the token it is given and says clearly when refused."""
    from spark_source.discovery import discover
    from spark_source.options import OptionError
    path = "/admin/v2/pulsarlite/metadata"
    assert _http(secured, path)[0] == 401
    status, body = _http(secured, path, {"Authorization": f"Bearer {token('someone')}"})
    assert status == 403 and "not a superuser" in body["reason"]
    status, body = _http(secured, path, {"Authorization": f"Bearer {token('admin')}"})
    assert status == 200 and body["zookeeper"] == secured.zookeeper
    assert discover({"admin_url": secured.admin_url, "adminToken": token("admin")})["zookeeper"] == secured.zookeeper
    with pytest.raises(OptionError, match="401.*adminToken"):
        discover({"admin_url": secured.admin_url})
    with pytest.raises(OptionError, match="403.*superuser"):
        discover({"admin_url": secured.admin_url, "adminToken": token("someone")})


def _read_until(sock, decoder, kinds, wait_s: float) -> list:
    deadline = time.monotonic() + wait_s
    got = []
    while time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            data = sock.recv(65536)
        except socket.timeout:
            break
        if not data:
            got.append(None)          # closed
            return got
        got.extend(decoder.feed(data))
        if any(f is not None and f.command.type in kinds for f in got):
            return got
    return got


def test_auth_challenge_refreshes_or_closes_at_the_wire(secured):
    address = broker_address(secured)
    for answer in (True, False):
        decoder = FrameDecoder()
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(c.connect("wire", auth_method_name="token",
                                   auth_data=token("admin", exp_s=time.time() + 2).encode(),
                                   supports_auth_refresh=True))
            got = _read_until(sock, decoder, {T.CONNECTED}, 10)
            assert got and got[0].command.type == T.CONNECTED
            assert got[0].command.connected.feature_flags.supports_auth_refresh
            got = _read_until(sock, decoder, {T.AUTH_CHALLENGE}, 15)
            challenge = [f for f in got if f is not None and f.command.type == T.AUTH_CHALLENGE]
            assert challenge and challenge[0].command.authChallenge.challenge.auth_method_name == "token"
            if answer:
                sock.sendall(c.auth_response("wire", 19, "token", token("admin", exp_s=time.time() + 600).encode()))
                # two more refresh checks pass: still served (PING answered), no error
                time.sleep(2.5)
                sock.sendall(c.ping())
                got = _read_until(sock, decoder, {T.PONG}, 10)
                assert any(f is not None and f.command.type == T.PONG for f in got), got
                assert not any(f is None or f.command.type == T.ERROR for f in got)
            else:
                got = _read_until(sock, decoder, {T.ERROR}, 15)
                errors = [f.command.error for f in got if f is not None and f.command.type == T.ERROR]
                assert errors and errors[0].error == pb.AuthenticationError
                assert "AUTH_CHALLENGE was not answered" in errors[0].message
                assert _read_until(sock, decoder, set(), 10)[-1:] == [None]      # closed
    assert "authentication refreshed role=admin method=token" in broker_log(secured)


def test_official_client_refreshes_a_token_from_its_supplier(secured):
    calls = []
    refreshed_before = broker_log(secured).count("authentication refreshed role=admin")

    def supplier() -> str:
        calls.append(time.time())
        return token("admin", exp_s=time.time() + 2)

    client = pulsar.Client(secured.service_url, authentication=pulsar.AuthenticationToken(supplier),
                           operation_timeout_seconds=10)
    try:
        producer = client.create_producer("persistent://public/default/refresh")
        for i in range(14):          # ~7 s: several expiries, each refreshed on AUTH_CHALLENGE
            producer.send(b"m%d" % i)
            time.sleep(0.5)
    finally:
        client.close()
    assert len(calls) >= 2, calls
    assert broker_log(secured).count("authentication refreshed role=admin") > refreshed_before


def test_secrets_stay_secret(secured, module_tmp_path):
    """Invariant 11: after everything above, no token, password, key or hash in the broker's
    and bookies' logs, /metrics, topic stats, or any znode."""
    from kazoo.client import KazooClient

    admin = {"Authorization": f"Bearer {token('admin')}"}
    metrics = _http(secured, "/metrics", admin)[1]
    stats = json.dumps(_http(secured, "/admin/v2/persistent/public/default/token-ok/stats", admin)[1])
    internal = json.dumps(_http(secured, "/admin/v2/persistent/public/default/token-ok/internalStats", admin)[1])
    places = {"metrics": str(metrics), "stats": stats, "internal stats": internal}
    assert "pulsar_" in places["metrics"] and "msgRateIn" in stats
    for log in (secured.dir / "logs").glob("*.log"):
        places[f"log {log.name}"] = log.read_bytes().decode("latin-1")
    zk = KazooClient(hosts=secured.zookeeper)
    zk.start(timeout=15)
    try:
        pending, znodes = ["/"], []
        while pending and len(znodes) < 100_000:
            path = pending.pop()
            data, _ = zk.get(path)
            znodes.append(path + " " + (data or b"").decode("latin-1"))
            pending.extend(path.rstrip("/") + "/" + child for child in zk.get_children(path))
    finally:
        zk.stop()
        zk.close()
    places["znodes"] = "\n".join(znodes)
    hashes = [line.split(b":", 1)[1].decode() for line in (module_tmp_path / "users.htpasswd").read_bytes().split()]
    secrets = {"password": ADMIN_PASSWORD, "apr1 password": APR1_PASSWORD, "des password": DES_PASSWORD,
               **{f"hash {i}": hashed for i, hashed in enumerate(hashes)}, "key (base64)": base64.b64encode(SECRET).decode(),
               "key (hex)": SECRET.hex(), "key": SECRET.decode("latin-1")}
    secrets.update({f"token {i}": t for i, t in enumerate(ISSUED)})
    secrets.update({f"token signature {i}": t.rsplit(".", 1)[1] for i, t in enumerate(ISSUED)})
    assert len(ISSUED) > 10 and len(places["znodes"]) > 1000 and "refused" in places["log broker-1.log"]
    leaks = [(what, where) for where, text in places.items() for what, secret in secrets.items() if secret in text]
    assert not leaks, leaks
