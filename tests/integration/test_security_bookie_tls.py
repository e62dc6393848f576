"""TLS on the bookie port (bookie/tls.py, docs/security.md), on real processes: three bookies
serving TLS only (with token authentication inside the session), a broker connecting with TLS.
The official client produces and consumes through them; a plain-TCP client is served nothing (an
attacker's AddRequest in clear changes no entry); ledger clients without TLS, or trusting another
CA, cannot connect; autorecovery re-replicates a lost bookie's ledger over TLS; the operator shell
works with the trust file. Certificates from trustme."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pulsar
import pytest

from bookie.client.ledger_client import LedgerClient
from pulsarlite.config import LedgerClientConfig
from pulsarlite.errors import ConfigError, PulsarliteError
from pulsarlite.tokens import create_token
from tests.integration.helpers import wait_ledger_repaired

trustme = pytest.importorskip("trustme")

pytestmark = pytest.mark.integration

SECRET = b"k" * 32


def _pki(directory: Path) -> dict[str, str]:
    ca, other = trustme.CA(), trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    files = {"ca": directory / "ca.pem", "other_ca": directory / "other-ca.pem",
             "cert": directory / "bookie.cert.pem", "key": directory / "bookie.key.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    other.cert_pem.write_to_path(str(files["other_ca"]))
    leaf.cert_chain_pems[0].write_to_path(str(files["cert"]))
    leaf.private_key_pem.write_to_path(str(files["key"]))
    for role in ("broker", "autorecovery", "admin"):
        (directory / f"{role}.token").write_text(create_token(subject=role, now_s=time.time(), secret_key=SECRET))
    (directory / "secret.key").write_bytes(SECRET)
    return {k: str(v) for k, v in files.items()}


async def _read_all(client: LedgerClient, lid: int, last: int) -> list[bytes]:
    reader = await client.open_ledger(lid, recovery=False)
    return [e.payload for e in await reader.read(0, last)]


async def test_bookies_serve_tls_only(cluster_factory, tmp_path):
    pki = _pki(tmp_path)
    bookie = {"bookie_tls_certificate_file_path": pki["cert"], "bookie_tls_key_file_path": pki["key"],
              "bookie_tls_trust_certs_file_path": pki["ca"],
              "bookie_auth_enabled": True, "bookie_auth_roles": "broker,autorecovery,admin",
              "bookie_auth_token_secret_key": f"file://{tmp_path / 'secret.key'}",
              "bookie_auth_token_file": str(tmp_path / "autorecovery.token")}
    broker = {"bookie_tls_enabled": True, "bookie_tls_trust_certs_file_path": pki["ca"],
              "bookie_auth_token_file": str(tmp_path / "broker.token")}
    from tests.integration.test_security_bookies import FAST, name_of
    bookie.update(FAST)
    cluster = await asyncio.to_thread(cluster_factory, 4, brokers=1, bookie_overrides=bookie,
                                      broker_overrides={"broker-1": broker})

    def config(**kw) -> LedgerClientConfig:
        return LedgerClientConfig(zookeeper=cluster.zookeeper, connect_timeout_ms=5_000, add_timeout_ms=10_000,
                                  bookie_auth_token_file=str(tmp_path / "admin.token"), **kw)

    # the broker's ledger client: produce and consume through TLS bookies
    pc = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        producer = pc.create_producer("persistent://public/default/bookie-tls")
        consumer = pc.subscribe("persistent://public/default/bookie-tls", "s",
                                initial_position=pulsar.InitialPosition.Earliest)
        for i in range(10):
            producer.send(b"tls-%d" % i)
        assert [consumer.receive(timeout_millis=30_000).data() for _ in range(10)] == [b"tls-%d" % i for i in range(10)]
    finally:
        pc.close()

    client = await LedgerClient.connect(config(bookie_tls_enabled=True, bookie_tls_trust_certs_file_path=pki["ca"]))
    try:
        writer = await client.create_ledger(3, 3, 2)
        lid = writer.ledger_id
        await asyncio.gather(*(writer.add_async(b"entry-%d" % i) for i in range(5)))
        await writer.close()
        ensemble = writer.metadata.current_ensemble

        # an attacker in clear: the TLS handshake fails, no AddRequest is read
        from tests.integration.test_security_bookies import add_frame, raw_exchange
        for bookie_id in ensemble:
            got = await raw_exchange(bookie_id, [add_frame(7, lid, 0, b"forged")])
            assert got == [], got
        assert await _read_all(client, lid, 4) == [b"entry-%d" % i for i in range(5)]

        # ledger clients without TLS, or trusting another CA: refused at connect
        for kw in ({}, {"bookie_tls_enabled": True, "bookie_tls_trust_certs_file_path": pki["other_ca"]}):
            bad = await LedgerClient.connect(config(**kw))
            try:
                with pytest.raises(PulsarliteError):
                    await _read_all(bad, lid, 4)
            finally:
                await bad.close()
        with pytest.raises(ConfigError, match="bookie_tls_trust_certs_file_path"):
            bad = await LedgerClient.connect(config(bookie_tls_enabled=True,
                                                    bookie_tls_trust_certs_file_path=str(tmp_path / "missing.pem")))
            try:
                await _read_all(bad, lid, 4)
            finally:
                await bad.close()
        # autorecovery over TLS: a bookie of the ledger lost for good; the other bookies' workers
        # (their ledger clients trust the CA) copy its entries to the fourth bookie
        victim = ensemble[0]
        await asyncio.to_thread(cluster.kill, name_of(cluster, victim))
        md = await wait_ledger_repaired(client, lid, victim, 120)
        (_, repaired), = md.ensembles
        newcomer = next(b for b in repaired if b not in ensemble)
        r = await client.pool.get(newcomer).read(lid, 0, 4)
        assert [e.payload for e in r.entries] == [b"entry-%d" % i for i in range(5)]
    finally:
        await client.close()

    # the operator shell with the trust file
    cmd = [sys.executable, "-m", "pulsarlite", "bookkeeper", "--zookeeper", cluster.zookeeper,
           "--bookie-auth-token-file", str(tmp_path / "admin.token"), "--bookie-tls-trust-certs-file", pki["ca"],
           "readledger", str(lid), "--print-entries"]
    proc = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "entry-4" in proc.stdout, proc.stdout + proc.stderr
    # no token, no key in any process log
    secrets = [(tmp_path / f"{r}.token").read_text().strip() for r in ("broker", "autorecovery", "admin")]
    for path in sorted((Path(cluster.dir) / "logs").glob("*.log")):
        text = path.read_text(errors="replace")
        assert not any(t in text or t.rsplit(".", 1)[1] in text for t in secrets), path.name
        assert Path(pki["key"]).read_text().splitlines()[1] not in text, path.name


def test_bookie_tls_settings_come_in_pairs():
    from pulsarlite.config import BookieConfig
    with pytest.raises(ConfigError, match="bookie_tls_key_file_path"):
        BookieConfig(bookie_tls_certificate_file_path="/c.pem").validate()
    config = BookieConfig(bookie_tls_certificate_file_path="/c.pem", bookie_tls_key_file_path="/k.pem",
                          bookie_tls_trust_certs_file_path="/ca.pem").validate()
    client = config.ledger_client_config()
    assert client.bookie_tls_enabled and client.bookie_tls_trust_certs_file_path == "/ca.pem"
    assert not BookieConfig().ledger_client_config().bookie_tls_enabled


def test_spark_options_for_bookie_tls(monkeypatch):
    from spark_source.options import parse_options, source_client_settings
    for k in ("PULSARLITE_BOOKIE_TLS", "PULSARLITE_BOOKIE_TLS_TRUST_CERTS_FILE"):
        monkeypatch.delenv(k, raising=False)
    opts = parse_options({"zookeeper": "z:1", "topic": "t"}, streaming=False)
    assert not source_client_settings(opts)["bookie_tls_enabled"]
    opts = parse_options({"zookeeper": "z:1", "topic": "t", "bookieTlsTrustCertsFile": "/ca.pem"}, streaming=False)
    assert source_client_settings(opts)["bookie_tls_enabled"]
    assert source_client_settings(opts)["bookie_tls_trust_certs_file_path"] == "/ca.pem"
    monkeypatch.setenv("PULSARLITE_BOOKIE_TLS", "1")
    opts = parse_options({"zookeeper": "z:1", "topic": "t"}, streaming=False)
    assert source_client_settings(opts) == {**source_client_settings(opts), "bookie_tls_enabled": True}
