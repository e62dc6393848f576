"""TLS on the broker's listeners ([security], issue 27), with the official client against real
broker and bookie processes: ``pulsar+ssl://`` on ``broker_service_port_tls`` and ``https://`` on
``web_service_port_tls`` from PEM files made at test time (trustme; no private key is checked in).

- the right CA works (and the plain port still serves), a wrong CA fails, and
  ``tls_allow_insecure_connection`` lets the wrong CA through;
- ``tls_validate_hostname`` against a certificate for 127.0.0.1 (an IP SAN): validated through
  127.0.0.1, refused through ``localhost`` (not in the certificate) unless validation is off;
- lookups over TLS answer ``pulsar+ssl://`` / ``https://`` URLs (binary and HTTP);
- mTLS (``tls_require_trusted_client_cert_on_connect``): refused without a client certificate,
  served with one signed by the trusted CA, refused with one signed by another CA.
"""

from __future__ import annotations

import json
import ssl
import urllib.request

import pytest

from pulsarlite.zk_server import find_free_port

pulsar = pytest.importorskip("pulsar")
trustme = pytest.importorskip("trustme")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000
REFUSED_TIMEOUT_S = 5


class Pki:
    """A CA, a broker certificate for 127.0.0.1 signed by it, a client certificate (CN
    ``client-role``) signed by it, and a second CA that signed nothing the broker trusts."""

    def __init__(self, directory) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.ca = trustme.CA()
        self.other_ca = trustme.CA()
        server = self.ca.issue_cert("127.0.0.1")
        client = self.ca.issue_cert("client-role", common_name="client-role")
        stranger = self.other_ca.issue_cert("stranger", common_name="stranger")
        self.ca_pem = str(directory / "ca.pem")
        self.other_ca_pem = str(directory / "other-ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_pem)
        self.other_ca.cert_pem.write_to_path(self.other_ca_pem)
        self.server_cert = str(directory / "broker.cert.pem")
        self.server_key = str(directory / "broker.key.pem")
        server.cert_chain_pems[0].write_to_path(self.server_cert)
        server.private_key_pem.write_to_path(self.server_key)
        self.client_cert, self.client_key = _write_leaf(client, directory, "client")
        self.stranger_cert, self.stranger_key = _write_leaf(stranger, directory, "stranger")


def _write_leaf(leaf, directory, name: str) -> tuple[str, str]:
    cert, key = str(directory / f"{name}.cert.pem"), str(directory / f"{name}.key.pem")
    leaf.cert_chain_pems[0].write_to_path(cert)
    leaf.private_key_pem.write_to_path(key)
    return cert, key


def _tls_overrides(pki: Pki, **extra) -> dict:
    return {"ensemble_size": 1, "write_quorum": 1, "ack_quorum": 1,
            "broker_service_port_tls": find_free_port(), "web_service_port_tls": find_free_port(),
            "tls_certificate_file_path": pki.server_cert, "tls_key_file_path": pki.server_key,
            "tls_trust_certs_file_path": pki.ca_pem, **extra}


def _config(cluster):
    from broker.config import BrokerConfig
    from pulsarlite.config import load_toml
    return load_toml(BrokerConfig, cluster.records["broker-1"].config)


@pytest.fixture(scope="module")
def pki(module_tmp_path):
    return Pki(module_tmp_path / "pki")


@pytest.fixture(scope="module")
def tls_cluster(module_cluster_factory, pki):
    return module_cluster_factory(1, brokers=1, name="tls", broker_overrides=_tls_overrides(pki))


@pytest.fixture(scope="module")
def tls_urls(tls_cluster):
    config = _config(tls_cluster)
    url = f"pulsar+ssl://127.0.0.1:{config.broker_service_port_tls}"
    assert tls_cluster.status()["service_url_tls"] == url == tls_cluster.service_url_tls   # the launcher says it
    import os
    import stat
    mode = stat.S_IMODE(os.stat(tls_cluster.records["broker-1"].config).st_mode)
    assert mode == 0o600                     # broker configs may hold secrets: owner only
    return url, f"https://127.0.0.1:{config.web_service_port_tls}"


def _round_trip(url: str, topic: str, n: int = 20, **client_kwargs) -> None:
    """A pulsar.Client(url, **client_kwargs) produces n messages to ``topic`` and consumes them."""
    client = pulsar.Client(url, operation_timeout_seconds=30, **client_kwargs)
    try:
        consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        payloads = [f"m-{i}".encode() for i in range(n)]
        for p in payloads:
            producer.send(p)
        got = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in payloads]
        assert [m.data() for m in got] == payloads
        for m in got:
            consumer.acknowledge(m)
    finally:
        client.close()


def _refused(url: str, topic: str, **kwargs) -> None:
    client = pulsar.Client(url, operation_timeout_seconds=REFUSED_TIMEOUT_S, **kwargs)
    try:
        with pytest.raises(Exception):
            client.create_producer(topic)
    finally:
        client.close()


def test_right_ca_works_and_plain_port_still_serves(tls_cluster, tls_urls, pki):
    url, _ = tls_urls
    _round_trip(url, "persistent://public/default/tls-right-ca", tls_trust_certs_file_path=pki.ca_pem,
                tls_validate_hostname=True)
    _round_trip(tls_cluster.service_url, "persistent://public/default/tls-plain-beside")


def test_wrong_ca_fails_unless_insecure_allowed(tls_urls, pki):
    url, _ = tls_urls
    _refused(url, "persistent://public/default/tls-wrong-ca", tls_trust_certs_file_path=pki.other_ca_pem)
    _round_trip(url, "persistent://public/default/tls-insecure", tls_trust_certs_file_path=pki.other_ca_pem,
                tls_allow_insecure_connection=True)


def test_hostname_validation(tls_urls, pki):
    url, _ = tls_urls
    by_name = url.replace("127.0.0.1", "localhost")   # the certificate names 127.0.0.1 only
    _refused(by_name, "persistent://public/default/tls-hostname", tls_trust_certs_file_path=pki.ca_pem,
             tls_validate_hostname=True)
    _round_trip(by_name, "persistent://public/default/tls-hostname-off", tls_trust_certs_file_path=pki.ca_pem,
                tls_validate_hostname=False)


def test_lookups_answer_tls_urls(tls_cluster, tls_urls, pki):
    url, https = tls_urls
    context = ssl.create_default_context(cafile=pki.ca_pem)
    topic_path = "persistent/public/default/tls-lookup"
    with urllib.request.urlopen(f"{https}/lookup/v2/topic/{topic_path}", context=context, timeout=30) as r:
        data = json.loads(r.read())
    assert data["brokerUrlTls"] == url
    assert data["httpUrlTls"] == https
    assert data["brokerUrl"].startswith("pulsar://")
    # the plain admin port answers the same TLS URLs
    with urllib.request.urlopen(f"{tls_cluster.admin_url}/lookup/v2/topic/{topic_path}", timeout=30) as r:
        assert json.loads(r.read())["brokerUrlTls"] == url
    # https:// with the wrong CA: refused by the client's verification
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{https}/admin/v2/clusters",
                               context=ssl.create_default_context(cafile=pki.other_ca_pem), timeout=30)
    # the official client with an https:// service URL (HTTP lookup, then pulsar+ssl://)
    _round_trip(https, "persistent://public/default/tls-http-lookup", tls_trust_certs_file_path=pki.ca_pem)


@pytest.fixture(scope="module")
def mtls_cluster(module_cluster_factory, pki):
    return module_cluster_factory(1, brokers=1, name="mtls", broker_overrides=_tls_overrides(
        pki, tls_require_trusted_client_cert_on_connect=True))


def test_mtls_requires_a_trusted_client_certificate(mtls_cluster, pki):
    config = _config(mtls_cluster)
    url = f"pulsar+ssl://127.0.0.1:{config.broker_service_port_tls}"
    topic = "persistent://public/default/mtls"
    _refused(url, topic, tls_trust_certs_file_path=pki.ca_pem)
    _refused(url, topic, tls_trust_certs_file_path=pki.ca_pem,
             authentication=pulsar.AuthenticationTLS(pki.stranger_cert, pki.stranger_key))
    _round_trip(url, topic, tls_trust_certs_file_path=pki.ca_pem,
                authentication=pulsar.AuthenticationTLS(pki.client_cert, pki.client_key))
    # HTTPS: refused without a client certificate, served with one
    https = f"https://127.0.0.1:{config.web_service_port_tls}/admin/v2/clusters"
    context = ssl.create_default_context(cafile=pki.ca_pem)
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        urllib.request.urlopen(https, context=context, timeout=30).read()
    context.load_cert_chain(pki.client_cert, pki.client_key)
    with urllib.request.urlopen(https, context=context, timeout=30) as r:
        assert r.status == 200


def test_bad_tls_files_refuse_to_start(tmp_path, pki):
    """A key that does not load: the broker refuses to start, naming the setting (and not the key)."""
    import asyncio

    from broker.config import BrokerConfig
    from broker.main import run_broker
    from pulsarlite.errors import ConfigError
    bad_key = tmp_path / "bad.key.pem"
    bad_key.write_text("-----BEGIN PRIVATE KEY-----\nnot-a-key\n-----END PRIVATE KEY-----\n")
    config = BrokerConfig(port=find_free_port(), http_port=find_free_port(), zookeeper="127.0.0.1:1",
                          broker_service_port_tls=find_free_port(), tls_certificate_file_path=pki.server_cert,
                          tls_key_file_path=str(bad_key))
    with pytest.raises(ConfigError, match="tls_key_file_path") as info:
        asyncio.run(run_broker(config))
    assert "not-a-key" not in str(info.value)
    with pytest.raises(ConfigError, match="tls_certificate_file_path"):
        BrokerConfig(broker_service_port_tls=6651).validate()


def test_our_client_over_tls(tls_urls, pki):
    """pulsarlite's client: the right CA works (hostname validated), a wrong CA fails with a TLS
    error, allow-insecure lets it through, and a name the certificate lacks fails validation."""
    import pulsarlite
    url, _ = tls_urls

    def round_trip(client, topic):
        consumer = client.subscribe(topic, "s", initial_position=pulsarlite.InitialPosition.Earliest)
        client.create_producer(topic).send(b"m")
        assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"m"

    for kwargs, topic in (({"tls_trust_certs_file_path": pki.ca_pem, "tls_validate_hostname": True}, "ours-right-ca"),
                          ({"tls_trust_certs_file_path": pki.other_ca_pem, "tls_allow_insecure_connection": True},
                           "ours-insecure")):
        client = pulsarlite.Client(url, operation_timeout_seconds=30, **kwargs)
        try:
            round_trip(client, f"persistent://public/default/{topic}")
        finally:
            client.close()
    for service_url, kwargs in ((url, {"tls_trust_certs_file_path": pki.other_ca_pem}),
                                (url.replace("127.0.0.1", "localhost"),
                                 {"tls_trust_certs_file_path": pki.ca_pem, "tls_validate_hostname": True})):
        client = pulsarlite.Client(service_url, operation_timeout_seconds=3, **kwargs)
        try:
            with pytest.raises(pulsarlite.ConnectError, match="TLS .* failed"):
                client.create_producer("persistent://public/default/ours-refused")
        finally:
            client.close()
