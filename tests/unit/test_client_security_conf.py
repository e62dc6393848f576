"""[security] client.conf keys and CLI flags for authentication and TLS (pulsarlite/client_config.py)."""

from __future__ import annotations

import argparse
import base64

import pytest

from pulsarlite.client.auth import AuthenticationBasic, AuthenticationToken
from pulsarlite.client_config import add_connection_flags, load_client_config, resolve_connection
from pulsarlite.errors import ConfigError


def _parser():
    p = argparse.ArgumentParser()
    add_connection_flags(p)
    return p


def test_client_conf_security_keys(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("tok-123\n")
    path = tmp_path / "client.conf"
    path.write_text(f"""brokerServiceUrl=pulsar+ssl://10.0.0.5:6651
webServiceUrl=https://10.0.0.5:8443
authPlugin=org.apache.pulsar.client.impl.auth.AuthenticationToken
authParams=file://{token_file}
tlsTrustCertsFilePath=/etc/ca.pem
tlsAllowInsecureConnection=false
tlsEnableHostnameVerification=true
useTls=true
""")
    cfg = load_client_config(str(path), env={})
    assert cfg.service_url == "pulsar+ssl://10.0.0.5:6651"
    assert cfg.properties == {"useTls": "true"}
    kwargs = cfg.client_kwargs()
    assert isinstance(kwargs["authentication"], AuthenticationToken)
    assert kwargs["authentication"].auth_data() == b"tok-123"
    token_file.write_text("tok-456\n")          # read again at every use (a refreshed file)
    assert kwargs["authentication"].auth_data() == b"tok-456"
    assert kwargs["tls_trust_certs_file_path"] == "/etc/ca.pem" and kwargs["tls_validate_hostname"] is True
    assert cfg.http_authorization() == "Bearer tok-456"
    assert "tok-" not in repr(cfg)


def test_flags_override_the_file_and_basic_becomes_an_http_header(tmp_path):
    path = tmp_path / "client.conf"
    path.write_text("authPlugin=token\nauthParams=token:abc\n")
    args = _parser().parse_args(["--client-conf", str(path), "--auth-plugin",
                                 "org.apache.pulsar.client.impl.auth.AuthenticationBasic",
                                 "--auth-params", '{"userId":"alice","password":"s3cret"}',
                                 "--tls-allow-insecure-connection"])
    cfg = resolve_connection(args, env={})
    assert isinstance(cfg.authentication(), AuthenticationBasic)
    assert cfg.http_authorization() == "Basic " + base64.b64encode(b"alice:s3cret").decode()
    assert cfg.client_kwargs()["tls_allow_insecure_connection"] is True


def test_bad_security_values(tmp_path):
    path = tmp_path / "client.conf"
    path.write_text("tlsAllowInsecureConnection=maybe\n")
    with pytest.raises(ConfigError, match="tlsAllowInsecureConnection"):
        load_client_config(str(path), env={})
    path.write_text("authPlugin=com.example.Kerberos\n")
    with pytest.raises(Exception, match="authPlugin"):
        load_client_config(str(path), env={}).client_kwargs()
