"""pulsarlite's own client (blocking and asyncio) against a secured broker process: TLS
(``pulsar+ssl://``, trust file, hostname validation) and authentication (token, token supplier
refreshed through AUTH_CHALLENGE, basic, TLS certificate); a token made by ``pulsarlite tokens``
is accepted from the official client too; refused credentials raise AuthenticationError at once
(not retried until the timeout)."""

from __future__ import annotations

import base64
import os
import time

import bcrypt
import pytest

import pulsarlite
import pulsarlite.aio as aio
from faces.cli import main as cli_main
from pulsarlite.tokens import create_token
from pulsarlite.zk_server import find_free_port
from tests.integration.helpers import wait_for

pulsar = pytest.importorskip("pulsar")
trustme = pytest.importorskip("trustme")

pytestmark = pytest.mark.integration

PASSWORD = "pw-" + base64.urlsafe_b64encode(os.urandom(9)).decode()
TIMEOUT_MS = 15_000


class Secured:
    def __init__(self, cluster, directory, key: bytes, port_tls: int) -> None:
        self.cluster = cluster
        self.dir = directory
        self.key = key
        self.url = f"pulsar+ssl://127.0.0.1:{port_tls}"

    def token(self, role: str, expiry_s: int | None = None) -> str:
        return create_token(subject=role, secret_key=self.key, now_s=time.time(), expiry_s=expiry_s)


@pytest.fixture(scope="module")
def secured(module_cluster_factory, module_tmp_path):
    d = module_tmp_path
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    client_leaf = ca.issue_cert("tls-role", common_name="tls-role")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    server.cert_chain_pems[0].write_to_path(str(d / "broker.pem"))
    server.private_key_pem.write_to_path(str(d / "broker.key"))
    client_leaf.cert_chain_pems[0].write_to_path(str(d / "client.pem"))
    client_leaf.private_key_pem.write_to_path(str(d / "client.key"))
    # the secret key made by our tool, in Pulsar's format (raw bytes)
    assert cli_main(["tokens", "create-secret-key", "--output", str(d / "secret.key")]) == 0
    (d / "users").write_bytes(b"alice:" + bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)) + b"\n")
    port_tls = find_free_port()
    https_port = find_free_port()
    cluster = module_cluster_factory(1, brokers=1, broker_overrides={
        "ensemble_size": 1, "write_quorum": 1, "ack_quorum": 1,
        "broker_service_port_tls": port_tls, "web_service_port_tls": https_port,
        "tls_certificate_file_path": str(d / "broker.pem"),
        "tls_key_file_path": str(d / "broker.key"), "tls_trust_certs_file_path": str(d / "ca.pem"),
        "authentication_enabled": True, "authentication_providers": "token,basic,tls",
        "token_secret_key": f"file://{d / 'secret.key'}", "basic_auth_conf": str(d / "users"),
        "authentication_refresh_check_interval_ms": 500})
    secured = Secured(cluster, d, (d / "secret.key").read_bytes(), port_tls)
    secured.https = f"https://127.0.0.1:{https_port}"
    return secured


def _round_trip(client, topic: str) -> None:
    consumer = client.subscribe(topic, "s", initial_position=pulsarlite.InitialPosition.Earliest)
    producer = client.create_producer(topic)
    producer.send(b"hello")
    assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"hello"
    producer.close()
    consumer.close()


def test_our_client_over_tls_with_a_token(secured):
    client = pulsarlite.Client(secured.url, tls_trust_certs_file_path=str(secured.dir / "ca.pem"),
                               tls_validate_hostname=True,
                               authentication=pulsarlite.AuthenticationToken(secured.token("svc")))
    try:
        _round_trip(client, "persistent://public/default/ours-token")
    finally:
        client.close()


def test_official_client_takes_a_token_made_by_our_tool(secured, capsys):
    assert cli_main(["tokens", "create", "--secret-key", f"file://{secured.dir / 'secret.key'}",
                     "--subject", "official", "--expiry-time", "1h"]) == 0
    token = capsys.readouterr().out.strip()
    client = pulsar.Client(secured.url, tls_trust_certs_file_path=str(secured.dir / "ca.pem"),
                           authentication=pulsar.AuthenticationToken(token), operation_timeout_seconds=30)
    try:
        consumer = client.subscribe("persistent://public/default/official-token", "s",
                                    initial_position=pulsar.InitialPosition.Earliest)
        client.create_producer("persistent://public/default/official-token").send(b"x")
        assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"x"
    finally:
        client.close()


def test_refused_credentials_raise_authentication_error(secured):
    other_key = os.urandom(32)
    forged = create_token(subject="svc", secret_key=other_key, now_s=time.time())
    for authentication in (pulsarlite.AuthenticationToken(forged), pulsarlite.AuthenticationBasic("alice", "wrong"),
                           None):
        client = pulsarlite.Client(secured.url, tls_trust_certs_file_path=str(secured.dir / "ca.pem"),
                                   authentication=authentication, operation_timeout_seconds=30)
        try:
            with pytest.raises(pulsarlite.AuthenticationError) as info:
                client.create_producer("persistent://public/default/refused")
            assert PASSWORD not in str(info.value) and forged not in str(info.value)
        finally:
            client.close()


def test_basic_and_tls_certificate_with_the_asyncio_client(secured):
    import asyncio

    async def run(authentication, topic):
        client = aio.Client(secured.url, tls_trust_certs_file_path=str(secured.dir / "ca.pem"),
                            authentication=authentication)
        try:
            consumer = await client.subscribe(topic, "s", initial_position=aio.InitialPosition.Earliest)
            producer = await client.create_producer(topic)
            await producer.send(b"a")
            assert (await consumer.receive()).data() == b"a"
        finally:
            await client.close()

    asyncio.run(run(aio.AuthenticationBasic("alice", PASSWORD), "persistent://public/default/aio-basic"))
    asyncio.run(run(aio.AuthenticationTLS(str(secured.dir / "client.pem"), str(secured.dir / "client.key")),
                    "persistent://public/default/aio-tls"))


def test_token_supplier_is_asked_again_on_auth_challenge(secured):
    """Tokens that expire after 2 s: the broker's AUTH_CHALLENGE gets a fresh one from the supplier,
    and the same producer keeps sending on the same connection past the first token's expiry."""
    calls: list[float] = []

    def supplier() -> str:
        calls.append(time.time())
        return secured.token("refreshing", expiry_s=2)

    client = pulsarlite.Client(secured.url, tls_trust_certs_file_path=str(secured.dir / "ca.pem"),
                               authentication=pulsarlite.AuthenticationToken(supplier))
    try:
        topic = "persistent://public/default/refresh"
        consumer = client.subscribe(topic, "s", initial_position=pulsarlite.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        producer.send(b"before")
        first = len(calls)
        wait_for(lambda: len(calls) >= first + 2, 30, "two refreshes through AUTH_CHALLENGE")
        producer.send(b"after")
        assert [consumer.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(2)] == [b"before", b"after"]
        log = open(secured.cluster.records["broker-1"].log, errors="replace").read()
        assert "authentication refreshed" in log
        for value in (PASSWORD, secured.key.hex()):
            assert value not in log
    finally:
        client.close()


def test_client_conf_style_plugins():
    from pulsarlite.client.auth import (AuthenticationBasic, AuthenticationTLS, AuthenticationToken,
                                        authentication_from_plugin)
    token = authentication_from_plugin("org.apache.pulsar.client.impl.auth.AuthenticationToken", "token:abc")
    assert isinstance(token, AuthenticationToken) and token.auth_data() == b"abc"
    basic = authentication_from_plugin("org.apache.pulsar.client.impl.auth.AuthenticationBasic",
                                       '{"userId":"u","password":"p"}')
    assert isinstance(basic, AuthenticationBasic) and basic.auth_data() == b"u:p"
    tls = authentication_from_plugin("org.apache.pulsar.client.impl.auth.AuthenticationTls",
                                     "tlsCertFile:/c.pem,tlsKeyFile:/k.pem")
    assert isinstance(tls, AuthenticationTLS) and tls.tls_certificate() == ("/c.pem", "/k.pem")
    assert authentication_from_plugin("", "") is None
    with pytest.raises(pulsarlite.InvalidConfiguration):
        authentication_from_plugin("com.example.Kerberos", "")


def test_cli_flags_and_client_conf(secured, tmp_path, capsys):
    """produce / consume / admin with --auth-plugin/--auth-params and the TLS flags, and the same
    settings from a client.conf; a wrong token exits non-zero and prints no secret."""
    token = secured.token("cli")
    ca = str(secured.dir / "ca.pem")
    flags = ["--service-url", secured.url, "--admin-url", secured.https, "--tls-trust-certs-file-path", ca,
             "--tls-enable-hostname-verification",
             "--auth-plugin", "org.apache.pulsar.client.impl.auth.AuthenticationToken", "--auth-params",
             f"token:{token}"]
    topic = "persistent://public/default/cli-secured"
    assert cli_main(["produce", topic, "-m", "one", *flags]) == 0
    assert cli_main(["consume", topic, "-s", "s", "-n", "1", "-p", "earliest", "--timeout", "30", *flags]) == 0
    assert "one" in capsys.readouterr().out
    assert cli_main(["admin", *flags, "tenants", "list"]) == 0
    assert "public" in capsys.readouterr().out
    token_file = tmp_path / "token"
    token_file.write_text(token)
    conf = tmp_path / "client.conf"
    conf.write_text(f"brokerServiceUrl={secured.url}\nwebServiceUrl={secured.https}\n"
                    f"authPlugin=org.apache.pulsar.client.impl.auth.AuthenticationToken\n"
                    f"authParams=file://{token_file}\ntlsTrustCertsFilePath={ca}\n")
    assert cli_main(["produce", topic, "-m", "two", "--client-conf", str(conf)]) == 0
    assert cli_main(["admin", "--client-conf", str(conf), "tenants", "list"]) == 0
    capsys.readouterr()
    forged = create_token(subject="cli", secret_key=os.urandom(32), now_s=time.time())
    assert cli_main(["produce", topic, "-m", "x", "--service-url", secured.url, "--tls-trust-certs-file-path", ca,
                     "--auth-plugin", "token", "--auth-params", f"token:{forged}"]) != 0
    assert cli_main(["admin", "--admin-url", secured.https, "--tls-trust-certs-file-path", ca, "--auth-plugin",
                     "token", "--auth-params", f"token:{forged}", "tenants", "list"]) != 0
    out = capsys.readouterr()
    assert forged not in out.out + out.err


def test_spark_writer_options_reach_a_secured_broker(secured):
    """The Spark sink's write path (spark_source/writer.py: parse_write_options on the driver,
    send_batches on an executor) with client.conf-style options: token over TLS; a bad plugin is
    refused on the driver, a forged token fails the write."""
    from types import SimpleNamespace

    import pyarrow as pa

    from spark_source.options import OptionError
    from spark_source.writer import parse_write_options, send_batches
    schema = SimpleNamespace(fields=[SimpleNamespace(name="value")])
    topic = "persistent://public/default/spark-secured"
    options = {"service_url": secured.url, "topic": topic, "authPlugin": "token",
               "authParams": f"token:{secured.token('spark')}",
               "tlsTrustCertsFilePath": str(secured.dir / "ca.pem"), "tlsEnableHostnameVerification": "true"}
    opts = parse_write_options(options, schema)
    assert secured.token("spark") not in repr(opts)
    batch = pa.RecordBatch.from_pydict({"value": [f"v{i}".encode() for i in range(20)]})
    assert send_batches(opts, iter([batch])).messages == 20
    client = pulsarlite.Client(secured.url, tls_trust_certs_file_path=str(secured.dir / "ca.pem"),
                               authentication=pulsarlite.AuthenticationToken(secured.token("reader")))
    try:
        consumer = client.subscribe(topic, "s", initial_position=pulsarlite.InitialPosition.Earliest)
        assert [consumer.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(20)] == \
            [f"v{i}".encode() for i in range(20)]
    finally:
        client.close()
    with pytest.raises(OptionError, match="authPlugin"):
        parse_write_options({**options, "authPlugin": "com.example.Nope"}, schema)
    forged = parse_write_options({**options, "authParams": "token:" + create_token(
        subject="spark", secret_key=os.urandom(32), now_s=time.time())}, schema)
    with pytest.raises(pulsarlite.AuthenticationError):
        send_batches(forged, iter([batch]))
