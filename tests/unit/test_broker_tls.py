"""broker/tls.py: the server context's client-certificate modes from BrokerConfig, errors naming the
setting (never the key), and the CN of a peer certificate."""

from __future__ import annotations

import dataclasses
import ssl

import pytest

from broker.config import BrokerConfig
from broker.tls import common_name_of, peer_certificate_of, server_ssl_context
from pulsarlite.errors import ConfigError

trustme = pytest.importorskip("trustme")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    leaf.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    leaf.private_key_pem.write_to_path(str(d / "key.pem"))
    return d


def _config(files, **kw) -> BrokerConfig:
    return BrokerConfig(broker_service_port_tls=6651, tls_certificate_file_path=str(files / "cert.pem"),
                        tls_key_file_path=str(files / "key.pem"), **kw).validate()


def test_client_certificate_modes(files):
    assert server_ssl_context(_config(files)).verify_mode is ssl.CERT_NONE      # no trust file: not asked for
    trust = {"tls_trust_certs_file_path": str(files / "ca.pem")}
    assert server_ssl_context(_config(files, **trust)).verify_mode is ssl.CERT_OPTIONAL
    required = _config(files, tls_require_trusted_client_cert_on_connect=True, **trust)
    assert server_ssl_context(required).verify_mode is ssl.CERT_REQUIRED
    insecure = _config(files, tls_allow_insecure_connection=True, **trust)
    assert server_ssl_context(insecure).verify_mode is ssl.CERT_NONE
    assert server_ssl_context(_config(files)).minimum_version >= ssl.TLSVersion.TLSv1_2


def test_errors_name_the_setting(files, tmp_path):
    bad_key = tmp_path / "bad.pem"
    bad_key.write_text("-----BEGIN PRIVATE KEY-----\nSECRET-MATERIAL\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ConfigError, match="tls_key_file_path") as info:
        server_ssl_context(dataclasses.replace(_config(files), tls_key_file_path=str(bad_key)))
    assert "SECRET-MATERIAL" not in str(info.value)
    with pytest.raises(ConfigError, match="tls_trust_certs_file_path"):
        server_ssl_context(_config(files, tls_trust_certs_file_path=str(tmp_path / "missing.pem")))
    with pytest.raises(ConfigError, match="tls_trust_certs_file_path"):
        BrokerConfig(broker_service_port_tls=6651, tls_certificate_file_path="c", tls_key_file_path="k",
                     tls_require_trusted_client_cert_on_connect=True).validate()
    with pytest.raises(ConfigError, match="must differ"):
        BrokerConfig(broker_service_port_tls=6650).validate()
    with pytest.raises(ConfigError, match="broker_service_port_tls"):
        BrokerConfig(broker_service_port_tls=70000).validate()


def test_peer_certificate_helpers():
    class Transport:
        def __init__(self, cert):
            self.cert = cert

        def get_extra_info(self, name):
            return self.cert if name == "peercert" else None

    cert = {"subject": ((("organizationName", "o"),), (("commonName", "svc-role"),))}
    assert peer_certificate_of(Transport(cert)) == cert
    assert peer_certificate_of(Transport({})) is None           # TLS without a verified client certificate
    assert peer_certificate_of(None) is None
    assert common_name_of(cert) == "svc-role" and common_name_of(None) is None
