"""Pulsar's broker.conf / standalone.conf keys -> BrokerConfig (pulsarlite/pulsar_conf.py), and
``pulsarlite broker --pulsar-conf`` / ``pulsarlite standalone --pulsar-conf`` refusing bad values."""

from __future__ import annotations

import argparse
import base64
import logging

import pytest

from broker.config import BrokerConfig
from pulsarlite.config import apply_settings
from broker.main import apply_pulsar_conf
from pulsarlite.errors import ConfigError
from pulsarlite.pulsar_conf import map_pulsar_conf, parse_properties, read_pulsar_conf

CONF = """
# Pulsar standalone.conf excerpt
brokerServicePort=6660
brokerServicePortTls = 6661
webServicePort: 8090
webServicePortTls=8453
tlsCertificateFilePath=/etc/pulsar/broker.cert.pem
tlsKeyFilePath=/etc/pulsar/broker.key-pk8.pem
tlsTrustCertsFilePath=/etc/pulsar/ca.cert.pem
tlsRequireTrustedClientCertOnConnect=FALSE
tlsAllowInsecureConnection=false
authenticationEnabled=true
authenticationProviders=org.apache.pulsar.broker.authentication.AuthenticationProviderToken,\\
  org.apache.pulsar.broker.authentication.AuthenticationProviderTls
authorizationEnabled=true
superUserRoles=admin,proxy
anonymousUserRole=
tokenSecretKey=data:;base64,c2VjcmV0LWtleS1ieXRlcy0wMTIzNDU2Nzg5YWJjZGVm
tokenAuthClaim=sub
authenticateMetricsEndpoint=true
managedLedgerDefaultEnsembleSize=1
managedLedgerDefaultEnsembleSize=2
bookkeeperClientTimeoutInSeconds=30
loadBalancerEnabled=
! a comment of the other kind
"""


def test_properties_syntax():
    pairs = dict(parse_properties("a=1\nb : two words \n c 3\n# x=y\n\nd=\ne=x\\\n  y\n"))
    assert pairs == {"a": "1", "b": "two words", "c": "3", "d": "", "e": "xy"}


def test_mapping_of_the_issue_keys():
    conf = map_pulsar_conf(parse_properties(CONF))
    assert conf.overrides == {
        "port": 6660, "broker_service_port_tls": 6661, "http_port": 8090, "web_service_port_tls": 8453,
        "tls_certificate_file_path": "/etc/pulsar/broker.cert.pem",
        "tls_key_file_path": "/etc/pulsar/broker.key-pk8.pem",
        "tls_trust_certs_file_path": "/etc/pulsar/ca.cert.pem",
        "tls_require_trusted_client_cert_on_connect": False, "tls_allow_insecure_connection": False,
        "authentication_enabled": True,
        "authentication_providers": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken,"
                                    "org.apache.pulsar.broker.authentication.AuthenticationProviderTls",
        "authorization_enabled": True, "superuser_roles": "admin,proxy",
        "token_secret_key": "data:;base64,c2VjcmV0LWtleS1ieXRlcy0wMTIzNDU2Nzg5YWJjZGVm",
        "token_auth_claim": "sub", "authenticate_metrics_endpoint": True}
    # unknown keys with a value, each once, in file order; empty values are "not set"
    assert conf.unknown == ("managedLedgerDefaultEnsembleSize", "bookkeeperClientTimeoutInSeconds")
    warning = conf.warning("f.conf")
    assert warning.count("managedLedgerDefaultEnsembleSize") == 1 and "loadBalancerEnabled" not in warning
    assert map_pulsar_conf(parse_properties("brokerServicePort=6650\n")).warning("f") is None


@pytest.mark.parametrize("line, key", [
    ("brokerServicePort=abc", "brokerServicePort"),
    ("webServicePortTls=70000", "webServicePortTls"),
    ("tlsRequireTrustedClientCertOnConnect=yes", "tlsRequireTrustedClientCertOnConnect"),
    ("authenticationEnabled=1", "authenticationEnabled"),
    ("authenticationRefreshCheckSeconds=0", "authenticationRefreshCheckSeconds"),
    ("authenticationRefreshCheckSeconds=1.5", "authenticationRefreshCheckSeconds"),
    ("metadataStoreUrl=not a url", "metadataStoreUrl"),
])
def test_bad_values_name_the_key(tmp_path, line, key):
    path = tmp_path / "broker.conf"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError, match=key) as info:
        read_pulsar_conf(str(path))
    assert str(path) in str(info.value)


def test_secret_values_are_not_echoed(tmp_path):
    secret = "data:;base64,VERY-SECRET-KEY"
    path = tmp_path / "broker.conf"
    path.write_text(f"authenticationEnabled=true\nauthenticationProviders=org.example.Nope\ntokenSecretKey={secret}\n")
    with pytest.raises(ConfigError) as info:
        config = apply_pulsar_conf(BrokerConfig(), str(path))
        from broker.security.authentication import AuthenticationService
        AuthenticationService.from_config(config)
    assert "VERY-SECRET-KEY" not in str(info.value)


def test_broker_overlay_applies_and_validates(tmp_path, caplog):
    path = tmp_path / "broker.conf"
    path.write_text("brokerServicePort=6700\nwebServicePort=8700\nbrokerServicePortTls=6701\n"
                    "tlsCertificateFilePath=/c.pem\ntlsKeyFilePath=/k.pem\nclusterName=east\n"
                    "metadataStoreUrl=zk:10.0.0.1:2181,10.0.0.2:2181/pulsar\nfooBar=1\n")
    with caplog.at_level(logging.WARNING, logger="pulsarlite.broker"):
        config = apply_pulsar_conf(BrokerConfig(zookeeper="127.0.0.1:2181"), str(path))
    assert (config.port, config.http_port, config.broker_service_port_tls) == (6700, 8700, 6701)
    assert config.cluster_name == "east" and config.zookeeper == "10.0.0.1:2181,10.0.0.2:2181/pulsar"
    assert config.service_url_tls == "pulsar+ssl://127.0.0.1:6701"
    assert [r.getMessage().count("fooBar") for r in caplog.records] == [1]
    # a TLS port without a certificate: refused, naming the setting and the Pulsar key behind it
    path.write_text("brokerServicePortTls=6701\n")
    with pytest.raises(ConfigError, match="tls_certificate_file_path"):
        apply_pulsar_conf(BrokerConfig(), str(path))
    path.write_text("brokerServicePort=6701\nbrokerServicePortTls=6701\ntlsCertificateFilePath=/c\ntlsKeyFilePath=/k\n")
    with pytest.raises(ConfigError, match="brokerServicePortTls"):
        apply_pulsar_conf(BrokerConfig(), str(path))


def test_standalone_flags_win_and_bad_files_refuse_before_start(tmp_path):
    from faces.cli_standalone import _ports_and_broker_settings
    path = tmp_path / "standalone.conf"
    path.write_text("brokerServicePort=6800\nwebServicePort=8800\nbrokerServicePortTls=6801\n"
                    f"tlsCertificateFilePath={tmp_path}/missing.pem\ntlsKeyFilePath={tmp_path}/missing.key\n"
                    "metadataStoreUrl=zk:10.0.0.1:2181\n")
    args = argparse.Namespace(pulsar_conf=str(path), port=None, http_port=None)
    with pytest.raises(ConfigError, match="tls_certificate_file_path"):
        _ports_and_broker_settings(args)
    path.write_text("brokerServicePort=6800\nwebServicePort=8800\nclusterName=c1\nmetadataStoreUrl=zk:10.0.0.1:2181\n")
    assert _ports_and_broker_settings(args) == (6800, 8800, {"cluster_name": "c1"})   # its own ZooKeeper
    args = argparse.Namespace(pulsar_conf=str(path), port=7000, http_port=None)
    assert _ports_and_broker_settings(args)[:2] == (7000, 8800)


def test_relative_paths_resolved_for_the_standalone(tmp_path, monkeypatch):
    from faces.cli_standalone import _ports_and_broker_settings
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "secret.key").write_bytes(b"k" * 32)
    conf = map_pulsar_conf(parse_properties(
        "tlsCertificateFilePath=certs/b.pem\ntlsKeyFilePath=/abs/k.pem\ntokenSecretKey=certs/secret.key\n"
        "tokenPublicKey=data:;base64,AAAA\nbasicAuthConf=file:///etc/users\n"))
    resolved = conf.with_paths_resolved(str(tmp_path)).overrides
    assert resolved["tls_certificate_file_path"] == str(tmp_path / "certs" / "b.pem")
    assert resolved["tls_key_file_path"] == "/abs/k.pem"
    assert resolved["token_secret_key"] == str(tmp_path / "certs" / "secret.key")
    assert resolved["token_public_key"] == "data:;base64,AAAA" and resolved["basic_auth_conf"] == "file:///etc/users"
    bare = map_pulsar_conf(parse_properties("tokenSecretKey=c2VjcmV0\n")).with_paths_resolved(str(tmp_path))
    assert bare.overrides["token_secret_key"] == "c2VjcmV0"       # base64, not a file
    users_b64 = base64.b64encode(b"alice:" + b"ab" + b"c" * 11 + b"\n").decode()
    bare = map_pulsar_conf(parse_properties(f"basicAuthConf={users_b64}\n")).with_paths_resolved(str(tmp_path))
    assert bare.overrides["basic_auth_conf"] == users_b64          # Pulsar's base64 form, not a file
    # the standalone resolves against its own working directory
    monkeypatch.chdir(tmp_path)
    (tmp_path / "standalone.conf").write_text("clusterName=c\nbasicAuthConf=users.htpasswd\n")
    args = argparse.Namespace(pulsar_conf="standalone.conf", port=None, http_port=None)
    assert _ports_and_broker_settings(args)[2]["basic_auth_conf"] == str(tmp_path / "users.htpasswd")


# -- bookkeeperClientAuthentication*: the broker's credential towards the bookies -------------------
TOKEN_PLUGIN = "org.apache.pulsar.client.impl.auth.AuthenticationToken"


@pytest.mark.parametrize("params, fields", [
    ("token:eyJhbGciOiJIUzI1NiJ9.e30.sig", {"ledger_client.bookie_auth_token": "eyJhbGciOiJIUzI1NiJ9.e30.sig",
                                            "ledger_client.bookie_auth_token_file": ""}),
    ("file:///etc/pulsar/broker.token", {"ledger_client.bookie_auth_token": "",
                                         "ledger_client.bookie_auth_token_file": "/etc/pulsar/broker.token"}),
    ("file:/etc/pulsar/broker.token", {"ledger_client.bookie_auth_token": "",
                                       "ledger_client.bookie_auth_token_file": "/etc/pulsar/broker.token"}),
])
def test_bookkeeper_client_token_maps_to_the_bookie_credential(params, fields):
    conf = map_pulsar_conf(parse_properties(f"bookkeeperClientAuthenticationPlugin={TOKEN_PLUGIN}\n"
                                            f"bookkeeperClientAuthenticationParametersName=\n"
                                            f"bookkeeperClientAuthenticationParameters={params}\n"))
    assert conf.overrides == fields and conf.unknown == ()
    # over a TOML config naming the other form: the conf's form wins, the result validates
    base = apply_settings(BrokerConfig(), {"ledger_client": {"bookie_auth_token_file": "/old.token"}}
                          if fields["ledger_client.bookie_auth_token"] else {"ledger_client": {"bookie_auth_token": "old"}})
    config = conf.apply(base, "f.conf")
    assert (config.ledger_client.bookie_auth_token, config.ledger_client.bookie_auth_token_file) == \
        (fields["ledger_client.bookie_auth_token"], fields["ledger_client.bookie_auth_token_file"])
    assert "eyJhbGci" not in repr(config)


@pytest.mark.parametrize("text, words", [
    ("bookkeeperClientAuthenticationPlugin=org.apache.bookkeeper.sasl.SASLClientProviderFactory\n"
     "bookkeeperClientAuthenticationParametersName=clientAuthProviderFactoryClass\n"
     "bookkeeperClientAuthenticationParameters=token:SECRET-JWT\n", ["SASL", "not supported", TOKEN_PLUGIN]),
    ("bookkeeperClientAuthenticationPlugin=org.example.MyAuth\n"
     "bookkeeperClientAuthenticationParameters=token:SECRET-JWT\n", ["org.example.MyAuth", "tokens only"]),
    ("bookkeeperClientAuthenticationParameters=token:SECRET-JWT\n", ["bookkeeperClientAuthenticationPlugin"]),
    (f"bookkeeperClientAuthenticationPlugin={TOKEN_PLUGIN}\n"
     "bookkeeperClientAuthenticationParameters=SECRET-JWT\n", ["token:<jwt>", "file:///"]),
    (f"bookkeeperClientAuthenticationPlugin={TOKEN_PLUGIN}\n", ["bookkeeperClientAuthenticationParameters"]),
])
def test_bookkeeper_client_auth_refused_where_the_meaning_differs(tmp_path, text, words):
    path = tmp_path / "broker.conf"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_pulsar_conf(str(path))
    for word in words:
        assert word in str(info.value)
    assert "SECRET-JWT" not in str(info.value)


def test_authentication_refresh_check_seconds_to_ms():
    conf = map_pulsar_conf(parse_properties("authenticationRefreshCheckSeconds=30\n"))
    assert conf.overrides == {"authentication_refresh_check_interval_ms": 30_000} and not conf.unknown


def test_zookeeper_session_timeout_keys():
    assert map_pulsar_conf(parse_properties("zookeeperSessionTimeoutMs=15000\n")).overrides == \
        {"zk_session_timeout_ms": 15000}
    assert map_pulsar_conf(parse_properties("metadataStoreSessionTimeoutMillis=20000\n")).overrides == \
        {"zk_session_timeout_ms": 20000}
    with pytest.raises(ConfigError, match="zookeeperSessionTimeoutMs"):
        map_pulsar_conf(parse_properties("zookeeperSessionTimeoutMs=-1\n"))
