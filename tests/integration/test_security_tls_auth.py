"""[security] TLS-certificate authentication (method "tls": the role is the client certificate's
CN) through engineer B's TLS listeners, with the official client's AuthenticationTLS and https
with a client certificate; authorization on, the role ``client-role`` a superuser, ``nobody``
authenticated but allowed nothing. Certificates made at test time (trustme)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

import pytest

from pulsarlite.zk_server import find_free_port

pulsar = pytest.importorskip("pulsar")
trustme = pytest.importorskip("trustme")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def pki(module_tmp_path):
    d = module_tmp_path / "pki"
    d.mkdir()
    ca = trustme.CA()
    files = {"ca": str(d / "ca.pem")}
    ca.cert_pem.write_to_path(files["ca"])
    for name, leaf in (("server", ca.issue_cert("127.0.0.1")),
                       ("client-role", ca.issue_cert("client-role", common_name="client-role")),
                       ("nobody", ca.issue_cert("nobody", common_name="nobody"))):
        files[name] = (str(d / f"{name}.cert.pem"), str(d / f"{name}.key.pem"))
        leaf.cert_chain_pems[0].write_to_path(files[name][0])
        leaf.private_key_pem.write_to_path(files[name][1])
    return files


@pytest.fixture(scope="module")
def cluster(module_cluster_factory, pki):
    return module_cluster_factory(1, brokers=1, broker_overrides={
        "ensemble_size": 1, "write_quorum": 1, "ack_quorum": 1,
        "broker_service_port_tls": find_free_port(), "web_service_port_tls": find_free_port(),
        "tls_certificate_file_path": pki["server"][0], "tls_key_file_path": pki["server"][1],
        "tls_trust_certs_file_path": pki["ca"],
        "authentication_enabled": True, "authentication_providers": "tls", "authorization_enabled": True,
        "superuser_roles": "client-role"})


def _config(cluster):
    from broker.config import BrokerConfig
    from pulsarlite.config import load_toml
    return load_toml(BrokerConfig, cluster.records["broker-1"].config)


def _log(cluster) -> str:
    return open(cluster.records["broker-1"].log, errors="replace").read()


def _client(cluster, pki, who: str):
    url = f"pulsar+ssl://127.0.0.1:{_config(cluster).broker_service_port_tls}"
    return pulsar.Client(url, tls_trust_certs_file_path=pki["ca"], operation_timeout_seconds=5,
                         authentication=pulsar.AuthenticationTLS(*pki[who]))


def test_certificate_cn_is_the_role(cluster, pki):
    client = _client(cluster, pki, "client-role")
    try:
        topic = "persistent://public/default/tls-auth"
        consumer = client.subscribe(topic, "s")
        client.create_producer(topic).send(b"via certificate")
        assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"via certificate"
    finally:
        client.close()
    nobody = _client(cluster, pki, "nobody")
    try:
        with pytest.raises(Exception):
            nobody.create_producer("persistent://public/default/tls-auth")
    finally:
        nobody.close()
    assert "authorization refused role=nobody operation=lookup" in _log(cluster)


def test_plain_port_has_no_certificate(cluster, pki):
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=5,
                           authentication=pulsar.AuthenticationTLS(*pki["client-role"]))
    try:
        with pytest.raises(Exception):
            client.create_producer("persistent://public/default/plain")
    finally:
        client.close()
    assert "tls: no verified client certificate on this connection" in _log(cluster)


def _https(cluster, pki, who: str | None, path: str) -> int:
    context = ssl.create_default_context(cafile=pki["ca"])
    if who is not None:
        context.load_cert_chain(*pki[who])
    url = f"https://127.0.0.1:{_config(cluster).web_service_port_tls}{path}"
    try:
        with urllib.request.urlopen(url, context=context, timeout=10) as response:
            json.loads(response.read())
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_https_client_certificate(cluster, pki):
    assert _https(cluster, pki, "client-role", "/admin/v2/tenants") == 200
    assert _https(cluster, pki, "nobody", "/admin/v2/tenants") == 403
    assert _https(cluster, pki, None, "/admin/v2/tenants") == 401
