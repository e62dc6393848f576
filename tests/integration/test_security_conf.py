"""``pulsarlite standalone --pulsar-conf standalone.conf`` as a Pulsar operator runs it: a Pulsar
conf with TLS on (certificates made at test time), the official client over ``pulsar+ssl://``
with the CA, the unknown keys listed once in a warning; a bad value refuses to start (exit 2)
naming the key, before any process is started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_standalone import READY_TIMEOUT_S, free_port_run
from tests.integration.helpers import wait_for
from pulsarlite.zk_server import find_free_port

pulsar = pytest.importorskip("pulsar")
trustme = pytest.importorskip("trustme")

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


class Run:
    """``python -m pulsarlite standalone ...`` with its output collected."""

    def __init__(self, argv: list[str]) -> None:
        import threading
        self.popen = subprocess.Popen([sys.executable, "-m", "pulsarlite", "standalone", *argv],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_output(self, text: str) -> None:
        def seen():
            if self.popen.poll() is not None and text not in self.output:
                raise AssertionError(f"standalone exited ({self.popen.returncode}) before {text!r}:\n{self.output}")
            return text in self.output
        wait_for(seen, READY_TIMEOUT_S, f"{text!r} in standalone output")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()      # the standalone stops its children by pid
            try:
                self.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._thread.join(timeout=5)


def _pki(directory: Path) -> dict[str, str]:
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    files = {"ca": directory / "ca.pem", "cert": directory / "broker.cert.pem", "key": directory / "broker.key.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    leaf.cert_chain_pems[0].write_to_path(str(files["cert"]))
    leaf.private_key_pem.write_to_path(str(files["key"]))
    return {k: str(v) for k, v in files.items()}


def test_standalone_from_a_pulsar_conf_with_tls(tmp_path):
    pki = _pki(tmp_path)
    base = free_port_run(3)
    port, http_port, port_tls, https_port = find_free_port(), find_free_port(), find_free_port(), find_free_port()
    conf = tmp_path / "standalone.conf"
    conf.write_text(f"""# excerpt of Pulsar's standalone.conf
metadataStoreUrl=zk:localhost:2181
brokerServicePort={port}
brokerServicePortTls={port_tls}
webServicePort={http_port}
webServicePortTls={https_port}
tlsCertificateFilePath={pki['cert']}
tlsKeyFilePath={pki['key']}
tlsTrustCertsFilePath={pki['ca']}
tlsRequireTrustedClientCertOnConnect=false
clusterName=standalone
managedLedgerDefaultEnsembleSize=1
bookkeeperClientTimeoutInSeconds=30
loadBalancerEnabled=
""")
    run = Run(["--data-dir", str(tmp_path / "data"), "--pulsar-conf", str(conf), "--zookeeper-port",
               str(find_free_port()), "--bookie-port", str(base)])
    try:
        run.wait_output("pulsarlite standalone is ready")
        assert f"pulsar+ssl://127.0.0.1:{port_tls}" in run.output
        warnings = [line for line in run.lines if "not used by pulsarlite" in line]
        assert len(warnings) == 1, run.output
        assert "managedLedgerDefaultEnsembleSize" in warnings[0] and "loadBalancerEnabled" not in warnings[0]
        client = pulsar.Client(f"pulsar+ssl://127.0.0.1:{port_tls}", tls_trust_certs_file_path=pki["ca"],
                               tls_validate_hostname=True, operation_timeout_seconds=30)
        try:
            topic = "persistent://public/default/conf-tls"
            consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
            producer = client.create_producer(topic)
            for i in range(10):
                producer.send(f"m{i}".encode())
            assert [consumer.receive(timeout_millis=15_000).data() for _ in range(10)] == \
                [f"m{i}".encode() for i in range(10)]
        finally:
            client.close()
    finally:
        run.stop()


def test_standalone_refuses_a_bad_value_naming_the_key(tmp_path):
    conf = tmp_path / "standalone.conf"
    conf.write_text("brokerServicePortTls=not-a-port\n")
    data = tmp_path / "data"
    run = subprocess.run([sys.executable, "-m", "pulsarlite", "standalone", "--data-dir", str(data),
                          "--pulsar-conf", str(conf)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert run.returncode == 2
    assert "brokerServicePortTls" in run.stderr
    assert not (data / "cluster.json").exists()     # nothing was started


# -- deploy/docker-compose.secure.yml ------------------------------------------------------------
DEPLOY = REPO / "deploy"
SECURE = DEPLOY / "docker-compose.secure.yml"


def test_secure_compose_validates_and_its_brokers_are_secured():
    import shutil

    yaml = pytest.importorskip("yaml")
    from broker.config import BrokerConfig
    from pulsarlite.config import load_toml
    exe = shutil.which("docker-compose")
    if exe is not None:
        result = subprocess.run([exe, "-f", str(SECURE), "config", "-q"], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
    services = yaml.safe_load(SECURE.read_text())["services"]
    for name in ("broker-1", "broker-2"):
        service = services[name]
        mounts = dict(v.split(":")[:2] for v in service["volumes"])
        toml = next(source for source, target in mounts.items() if target.endswith(f"{name}.toml"))
        config = load_toml(BrokerConfig, DEPLOY / toml).validate()
        assert config.authentication_enabled and config.authorization_enabled and config.tls_enabled
        published = {int(p.split(":")[1]) for p in service["ports"]}
        assert published == {config.broker_service_port_tls, config.web_service_port_tls}   # no plain port
        secrets_target = mounts["./secrets"]
        for path in (config.tls_certificate_file_path, config.tls_key_file_path,
                     config.token_secret_key.removeprefix("file://")):
            assert path.startswith(secrets_target + "/")
        health = " ".join(service["healthcheck"]["test"])
        assert f"127.0.0.1:{config.http_port}/metrics" in health and not config.authenticate_metrics_endpoint
    for name in ("bookie-1", "bookie-2", "bookie-3", "zookeeper"):
        assert "ports" not in services[name]
    ignored = (REPO / ".gitignore").read_text().split()
    assert "/deploy/secrets/" in ignored and "/deploy/secrets.ca.key.pem" in ignored


def test_make_secrets_makes_what_the_secure_brokers_load(tmp_path):
    """deploy/make-secrets.sh's files load as a broker loads them (TLS context, token provider) and its
    admin token is accepted; a second run refuses to overwrite them."""
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not on PATH")
    from broker.config import BrokerConfig
    from broker.security.authentication import AuthenticationData, AuthenticationService
    from broker.tls import server_ssl_context
    out = tmp_path / "secrets"
    env = {"PATH": "/usr/bin:/bin", "PULSARLITE": str(Path(sys.executable).parent / "pulsarlite")}
    run = subprocess.run([str(DEPLOY / "make-secrets.sh"), str(out)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    config = BrokerConfig(broker_service_port_tls=6651, tls_certificate_file_path=str(out / "broker.cert.pem"),
                          tls_key_file_path=str(out / "broker.key.pem"),
                          tls_trust_certs_file_path=str(out / "ca.cert.pem"),
                          authentication_enabled=True, authentication_providers="token",
                          token_secret_key=f"file://{out / 'token-secret.key'}").validate()
    server_ssl_context(config)
    token = (out / "admin.token").read_text().strip()
    assert AuthenticationService.from_config(config).authenticate(
        AuthenticationData("token", token.encode(), None)) == "admin"
    # the bookies' certificate: loads as a bookie loads it, signed by the CA, naming every bookie
    from cryptography import x509
    from bookie.tls import client_context, server_context
    assert server_context(str(out / "bookie.cert.pem"), str(out / "bookie.key.pem")) is not None
    client_context(str(out / "ca.cert.pem"))
    cert = x509.load_pem_x509_certificate((out / "bookie.cert.pem").read_bytes())
    ca = x509.load_pem_x509_certificate((out / "ca.cert.pem").read_bytes())
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert {"bookie-1", "bookie-2", "bookie-3"} <= set(names)
    assert not (out / "ca.key.pem").exists() and (tmp_path / "secrets.ca.key.pem").exists()
    again = subprocess.run([str(DEPLOY / "make-secrets.sh"), str(out)], capture_output=True, text=True, env=env,
                           timeout=120)
    assert again.returncode != 0 and "exists" in again.stderr


def test_broker_from_a_pulsar_broker_conf_alone(cluster_factory, tmp_path):
    """``pulsarlite broker --pulsar-conf broker.conf`` without a TOML config: ZooKeeper from
    metadataStoreUrl, ports and TLS from the conf; the official client over pulsar+ssl://. A bad
    value exits 2 naming the key."""
    from tests.integration.helpers import wait_for as wait
    cluster = cluster_factory(3, brokers=0)
    pki = _pki(tmp_path)
    port, http_port, port_tls = find_free_port(), find_free_port(), find_free_port()
    conf = tmp_path / "broker.conf"
    conf.write_text(f"metadataStoreUrl=zk:{cluster.zookeeper}\nbrokerServicePort={port}\nwebServicePort={http_port}\n"
                    f"brokerServicePortTls={port_tls}\ntlsCertificateFilePath={pki['cert']}\n"
                    f"tlsKeyFilePath={pki['key']}\nclusterName=conf-cluster\nloadBalancerEnabled=true\n")
    log_path = tmp_path / "broker.log"
    with open(log_path, "w") as log:
        popen = subprocess.Popen([sys.executable, "-m", "pulsarlite", "broker", "--pulsar-conf", str(conf)],
                                 stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        wait(lambda: popen.poll() is not None or "broker ready" in log_path.read_text(), READY_TIMEOUT_S,
             "broker ready")
        assert popen.poll() is None, log_path.read_text()
        text = log_path.read_text()
        assert text.count("not used by pulsarlite") == 1 and "loadBalancerEnabled" in text
        client = pulsar.Client(f"pulsar+ssl://127.0.0.1:{port_tls}", tls_trust_certs_file_path=pki["ca"],
                               operation_timeout_seconds=30)
        try:
            consumer = client.subscribe("persistent://public/default/broker-conf", "s",
                                        initial_position=pulsar.InitialPosition.Earliest)
            client.create_producer("persistent://public/default/broker-conf").send(b"x")
            assert consumer.receive(timeout_millis=15_000).data() == b"x"
        finally:
            client.close()
    finally:
        popen.terminate()
        try:
            popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
    conf.write_text("tlsRequireTrustedClientCertOnConnect=sometimes\n")
    bad = subprocess.run([sys.executable, "-m", "pulsarlite", "broker", "--pulsar-conf", str(conf)],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert bad.returncode == 2 and "tlsRequireTrustedClientCertOnConnect" in bad.stderr
