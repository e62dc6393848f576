"""Bookies authenticate their clients, on real processes (ZooKeeper, 4 bookies with
``bookie_auth_enabled``, one broker): an attacker on the network who sends an AddRequest or a
DeleteLedgerRequest without an AuthRequest is refused and the stored entries and the ledger are
unchanged; wrong and expired tokens are refused; the broker (produce / consume), the
autorecovery workers (a bookie lost for good is re-replicated), the operator shell and the
Spark source's ledger client settings work with the right token; no token nor the key appears in
any process log. ZooKeeper too: every process authenticates with a digest credential and the
znodes are readable and writable by it only (zookeeper_acl_read_restricted), so a client without
it can neither read nor change them; a broker with a wrong credential refuses to start; the
password appears in no log. docs/security.md states the trust model."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import pulsar
import pytest

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.client.ledger_client import LedgerClient
from bookie.transport import HEADER, RESPONSE_TYPES, FrameDecoder, encode_add_entry, encode_message
from pulsarlite.checksum import entry_checksum
from pulsarlite.config import LedgerClientConfig
from pulsarlite.errors import PulsarliteError
from pulsarlite.tokens import create_token
from spark_source.options import ledger_client_config, parse_options, source_client_settings
from tests.integration.helpers import wait_ledger_repaired

pytestmark = pytest.mark.integration

SECRET = bytes(range(32))
ZK_PASSWORD = "zk-Pw-7f3a9c2e51"
ZK = {"zookeeper_acl_read_restricted": True}     # + zookeeper_auth_digest_file, in secured_cluster
ROLES = ("broker", "autorecovery", "admin", "spark")
FAST = {"lost_bookie_recovery_delay_ms": 1_000, "replication_poll_interval_ms": 200,
        "audit_interval_ms": 5_000, "replication_retry_delay_ms_max": 1_000}
REPAIR_TIMEOUT_S = 120.0


def payload_for(ledger: int, i: int) -> bytes:
    return f"acknowledged-l{ledger}-e{i:04d}".encode()


@pytest.fixture
def secrets_dir(tmp_path) -> Path:
    d = tmp_path / "bookie-auth"
    d.mkdir()
    (d / "secret.key").write_bytes(SECRET)
    for role in ROLES:
        (d / f"{role}.token").write_text(create_token(subject=role, now_s=time.time(), secret_key=SECRET))
    (d / "wrong.token").write_text(create_token(subject="admin", now_s=time.time(), secret_key=b"x" * 32))
    (d / "expired.token").write_text(create_token(subject="admin", now_s=time.time() - 7200, secret_key=SECRET,
                                                  expiry_s=60))
    (d / "zookeeper.digest").write_text(f"pulsarlite:{ZK_PASSWORD}\n")
    return d


def zk_settings(d: Path) -> dict:
    return {**ZK, "zookeeper_auth_digest_file": str(d / "zookeeper.digest")}


def token_of(d: Path, name: str) -> str:
    return (d / f"{name}.token").read_text()


def secured_cluster(cluster_factory, d: Path, bookies: int = 4):
    bookie = {"bookie_auth_enabled": True, "bookie_auth_roles": ",".join(ROLES), "bookie_auth_read_only_roles": "spark",
              "bookie_auth_token_secret_key": f"file://{d / 'secret.key'}",
              "bookie_auth_token_file": str(d / "autorecovery.token"), **FAST, **zk_settings(d)}
    return cluster_factory(bookies, brokers=1, bookie_overrides=bookie,
                           broker_overrides={"broker-1": {"bookie_auth_token_file": str(d / "broker.token"),
                                                          **zk_settings(d)}})


async def admin_client(cluster, d: Path, token_name: str = "admin") -> LedgerClient:
    return await LedgerClient.connect(LedgerClientConfig(zookeeper=cluster.zookeeper, add_timeout_ms=10_000,
                                                         bookie_auth_token_file=str(d / f"{token_name}.token"),
                                                         **zk_settings(d)))


def add_frame(request_id: int, ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    lac = entry_id - 1
    body = encode_add_entry(ledger_id, entry_id, lac, 0, payload, entry_checksum(ledger_id, entry_id, lac, 0, payload))
    body += pb.AddRequest(request_id=request_id, recovery=True).SerializeToString()
    return HEADER.pack(9 + len(body), pb.FRAME_ADD_REQUEST, request_id) + body


async def raw_exchange(bookie_id: str, frames: list[bytes]) -> list[tuple[int, int, bytes]]:
    """What an attacker gets back for ``frames`` sent in one write: every answer until the close."""
    host, port = bookie_id.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"".join(frames))
    await writer.drain()
    decoder = FrameDecoder(1 << 24, RESPONSE_TYPES)
    got = []
    try:
        while data := await asyncio.wait_for(reader.read(65536), 30):
            got += list(decoder.feed(data))
    except ConnectionResetError:
        pass
    writer.close()
    return got


async def bookkeeper(cluster, *args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """The operator shell; the ZooKeeper credential by environment unless ``env_extra`` says otherwise."""
    import os
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSARLITE_BOOKIE_AUTH", "PULSARLITE_ZOOKEEPER"))}
    d = Path(cluster.dir).parent / "bookie-auth"
    env.update({"PULSARLITE_ZOOKEEPER_AUTH_DIGEST_FILE": str(d / "zookeeper.digest"),
                "PULSARLITE_ZOOKEEPER_ACL_READ_RESTRICTED": "1"})
    env.update(env_extra or {})
    cmd = [sys.executable, "-m", "pulsarlite", "bookkeeper", "--zookeeper", cluster.zookeeper, *args]
    return await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=180, env=env)


def name_of(cluster, bookie_id: str) -> str:
    return next(n for n in cluster.bookie_names if cluster.records[n].bookie_id == bookie_id)


def assert_no_secret_in_logs(cluster, d: Path) -> None:
    secrets = [token_of(d, n) for n in (*ROLES, "wrong", "expired")]
    secrets += [t.rsplit(".", 1)[1] for t in secrets]                       # the signatures alone
    secrets += [base64.b64encode(SECRET).decode(), SECRET.hex(), ZK_PASSWORD]
    logs = sorted((Path(cluster.dir) / "logs").glob("*.log"))
    assert any("bookie" in p.name for p in logs) and any("broker" in p.name for p in logs), logs
    for path in logs:
        text = path.read_text(errors="replace")
        for s in secrets:
            assert s not in text, f"a secret in {path.name}"
        assert SECRET not in path.read_bytes()


def assert_zookeeper_closed_to_strangers(zookeeper: str) -> None:
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError
    from pulsarlite.metadata_layout import PULSARLITE_ROOTS
    for auth_data in (None, [("digest", "pulsarlite:guessed")]):
        stranger = KazooClient(hosts=zookeeper, timeout=10, auth_data=auth_data)
        stranger.start(timeout=15)
        try:
            for root in PULSARLITE_ROOTS:
                for attempt in (lambda: stranger.create(f"{root}/planted", b"x"), lambda: stranger.get(root),
                                lambda: stranger.get_children(root), lambda: stranger.set(root, b"x"),
                                lambda: stranger.delete(root, recursive=True)):
                    with pytest.raises(NoAuthError):
                        attempt()
            available = "/ledgers/available"
            with pytest.raises(NoAuthError):
                stranger.get_children(available)
            with pytest.raises(NoAuthError):
                stranger.delete(available, recursive=True)
        finally:
            stranger.stop()
            stranger.close()


def assert_zookeeper_unchangeable_without(zookeeper: str) -> None:
    """Readable (the default ACL), but an unauthenticated client changes nothing."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError
    from pulsarlite.metadata_layout import PULSARLITE_ROOTS
    stranger = KazooClient(hosts=zookeeper, timeout=10)
    stranger.start(timeout=15)
    try:
        for root in PULSARLITE_ROOTS:
            assert stranger.exists(root) is not None, root
            with pytest.raises(NoAuthError):
                stranger.create(f"{root}/planted", b"x")
            with pytest.raises(NoAuthError):
                stranger.set(root, b"x")
        bookies = stranger.get_children("/ledgers/available")
        assert bookies
        with pytest.raises(NoAuthError):
            stranger.delete(f"/ledgers/available/{bookies[0]}")
    finally:
        stranger.stop()
        stranger.close()


def assert_wrong_zookeeper_credential_refused(cluster, d: Path) -> None:
    import os
    from broker.config import BrokerConfig
    from pulsarlite.config import LedgerClientConfig, to_toml
    from pulsarlite.zk_server import find_free_port
    (d / "wrong.digest").write_text("pulsarlite:not-the-zk-password\n")
    config = BrokerConfig(host="127.0.0.1", port=find_free_port(), http_port=find_free_port(),
                          zookeeper=cluster.zookeeper,
                          ledger_client=LedgerClientConfig(bookie_auth_token_file=str(d / "broker.token")),
                          zookeeper_auth_digest_file=str(d / "wrong.digest"), zookeeper_acl_read_restricted=True)
    path = d / "wrong-zk-broker.toml"
    path.write_text(to_toml(config))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run([sys.executable, "-m", "pulsarlite", "broker", "--config", str(path)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "wrong zookeeper_auth_digest" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert "not-the-zk-password" not in proc.stdout + proc.stderr and ZK_PASSWORD not in proc.stdout + proc.stderr


async def test_bookies_refuse_unauthenticated_clients_and_serve_the_cluster(cluster_factory, secrets_dir):
    d = secrets_dir
    cluster = await asyncio.to_thread(secured_cluster, cluster_factory, d)
    client = await admin_client(cluster, d)
    try:
        # the broker's ledger client authenticates: produce and consume through it
        pc = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
        try:
            producer = pc.create_producer("persistent://public/default/secured")
            for i in range(20):
                producer.send(b"m-%d" % i)
            consumer = pc.subscribe("persistent://public/default/secured", "s",
                                    initial_position=pulsar.InitialPosition.Earliest)
            got = [consumer.receive(timeout_millis=30_000).data() for _ in range(20)]
            assert got == [b"m-%d" % i for i in range(20)]
        finally:
            pc.close()

        # ZooKeeper: without the credential, nothing of pulsarlite's can be read or changed
        await asyncio.to_thread(assert_zookeeper_closed_to_strangers, cluster.zookeeper)
        proc = await bookkeeper(cluster, "listbookies", env_extra={"PULSARLITE_ZOOKEEPER_AUTH_DIGEST_FILE": ""})
        assert proc.returncode != 0 and "zookeeper_auth_digest" in proc.stderr, proc.stderr
        proc = await bookkeeper(cluster, "--zookeeper-auth-digest-file", str(d / "zookeeper.digest"), "listbookies")
        assert proc.returncode == 0 and all(b in proc.stdout for b in cluster.bookie_ids), proc.stdout + proc.stderr
        # a broker with a wrong credential refuses to start, saying why
        await asyncio.to_thread(assert_wrong_zookeeper_credential_refused, cluster, d)

        # a ledger written with the admin token, closed: the attacker's target
        writer = await client.create_ledger(3, 3, 2)
        lid = writer.ledger_id
        await asyncio.gather(*(writer.add_async(payload_for(lid, i)) for i in range(10)))
        await writer.close()
        ensemble = writer.metadata.current_ensemble
        for bookie_id in ensemble:
            got = await raw_exchange(bookie_id, [
                add_frame(7, lid, 0, b"forged content"),
                encode_message(pb.FRAME_DELETE_LEDGER_REQUEST, 8, pb.DeleteLedgerRequest(ledger_id=lid))])
            assert [(t, rid) for t, rid, _ in got] == [(pb.FRAME_ERROR_RESPONSE, 7)], got
            error = pb.ErrorResponse.FromString(got[0][2])
            assert error.code == pb.AUTHENTICATION_ERROR and "authentication required" in error.message
            got = await raw_exchange(bookie_id, [
                encode_message(pb.FRAME_DELETE_LEDGER_REQUEST, 9, pb.DeleteLedgerRequest(ledger_id=lid))])
            assert [pb.ErrorResponse.FromString(b).code for _, _, b in got] == [pb.AUTHENTICATION_ERROR]
        # every replica still holds every entry as acknowledged
        for bookie_id in ensemble:
            r = await client.pool.get(bookie_id).read(lid, 0, 9)
            assert r.code == pb.OK and [e.payload for e in r.entries] == [payload_for(lid, i) for i in range(10)]
        reader = await client.open_ledger(lid, recovery=False)
        assert [e.payload for e in await reader.read(0, 9)] == [payload_for(lid, i) for i in range(10)]

        # wrong and expired tokens: refused, the reason named, the token not printed
        for name, reason in (("wrong", "signature does not verify"), ("expired", "expired")):
            bad = await admin_client(cluster, d, name)
            try:
                with pytest.raises(PulsarliteError):
                    r = await bad.open_ledger(lid, recovery=False)
                    await r.read(0, 0)
            finally:
                await bad.close()
            proc = await bookkeeper(cluster, "--bookie-auth-token-file", str(d / f"{name}.token"),
                                    "readledger", str(lid))
            assert proc.returncode != 0, proc.stdout
            assert reason in proc.stderr, proc.stderr
            assert token_of(d, name) not in proc.stdout + proc.stderr
        # refusals are logged at a bounded rate per cause (the 1st, 2nd, 4th, ...)
        bookie_log = (Path(cluster.dir) / "logs" / f"{name_of(cluster, ensemble[0])}.log").read_text()
        assert "authentication required" in bookie_log and "signature does not verify" in bookie_log

        # the operator shell with the right token: by flag and by environment
        proc = await bookkeeper(cluster, "--bookie-auth-token-file", str(d / "admin.token"), "readledger", str(lid),
                                "--print-entries")
        assert proc.returncode == 0, proc.stderr
        assert payload_for(lid, 3).decode() in proc.stdout
        proc = await bookkeeper(cluster, "simpletest", "-n", "20", "--json",
                                env_extra={"PULSARLITE_BOOKIE_AUTH_TOKEN": token_of(d, "admin")})
        assert proc.returncode == 0, proc.stderr
        proc = await bookkeeper(cluster, "readledger", str(lid))                 # no token: refused
        assert proc.returncode != 0

        # the Spark source's ledger client takes the option (and the environment), and reads
        # with its read-only role; a delete with it is refused
        opts = parse_options({"zookeeper": cluster.zookeeper, "topic": "t",
                              "bookieAuthTokenFile": str(d / "spark.token"),
                              "zookeeperAuthDigestFile": str(d / "zookeeper.digest"),
                              "zookeeperAclReadRestricted": "true"}, streaming=False)
        spark_client = await LedgerClient.connect(ledger_client_config(opts.zookeeper, opts.bookie_auth_token,
                                                                       opts.bookie_auth_token_file,
                                                                       source_client_settings(opts)))
        try:
            reader = await spark_client.open_ledger(lid, recovery=False)
            assert (await reader.read(9, 9))[0].payload == payload_for(lid, 9)
            assert (await spark_client.pool.get(ensemble[1]).delete_ledger(lid)).code == pb.NOT_AUTHORIZED
        finally:
            await spark_client.close()
        opts = parse_options({"zookeeper": cluster.zookeeper, "topic": "t",
                              "bookieAuthToken": token_of(d, "spark")}, streaming=False)
        assert opts.bookie_auth_token and token_of(d, "spark") not in repr(opts)
        # the driver's planning session (spark_source.source._with_metadata): refused without the
        # ZooKeeper credential (read-restricted ACLs), served with it
        from pulsarlite.metadata import MetadataAuthError
        from spark_source.source import _with_metadata

        async def live_bookies(store, _client):
            return await store.children("/ledgers/available")
        with pytest.raises(MetadataAuthError):
            await _with_metadata(opts, live_bookies)
        opts = parse_options({"zookeeper": cluster.zookeeper, "topic": "t", "zookeeperAclReadRestricted": "true",
                              "zookeeperAuthDigest": f"pulsarlite:{ZK_PASSWORD}"}, streaming=False)
        assert opts.zookeeper_auth_digest and ZK_PASSWORD not in repr(opts)
        assert set(ensemble) <= set(await _with_metadata(opts, live_bookies))

        # autorecovery: a bookie of the ledger lost for good; the workers (their own token)
        # copy its fragments to the fourth bookie
        victim = ensemble[0]
        await asyncio.to_thread(cluster.kill, name_of(cluster, victim))
        deadline = time.monotonic() + REPAIR_TIMEOUT_S          # for the repair and the mark
        md = await wait_ledger_repaired(client, lid, victim, REPAIR_TIMEOUT_S)
        (_, replacement_ensemble), = md.ensembles
        newcomer = next(b for b in replacement_ensemble if b not in ensemble)
        r = await client.pool.get(newcomer).read(lid, 0, 9)
        assert r.code == pb.OK and [e.payload for e in r.entries] == [payload_for(lid, i) for i in range(10)]
        # the closed ledger is no longer marked (the topic's open ledger may stay marked: its last
        # fragment is repaired once the broker closes it, bookie/autorecovery/replication_core.py)
        while True:
            proc = await bookkeeper(cluster, "listunderreplicated", "--json")
            assert proc.returncode == 0, proc.stderr
            if lid not in [m["ledger_id"] for m in json.loads(proc.stdout)]:
                break
            assert time.monotonic() < deadline, f"still under-replicated: {proc.stdout}"
            await asyncio.sleep(0.5)
    finally:
        await client.close()
    assert_no_secret_in_logs(cluster, d)


# -- deploy/: bookie authentication in every compose configuration ---------------------------------
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.mark.parametrize("compose_file", ["docker-compose.yml", "docker-compose.secure.yml"])
def test_every_compose_bookie_authenticates_and_every_client_has_a_token(compose_file):
    import shutil

    yaml = pytest.importorskip("yaml")
    from broker.config import BrokerConfig
    from pulsarlite.config import BookieConfig, load_toml
    exe = shutil.which("docker-compose")
    if exe is not None:
        result = subprocess.run([exe, "-f", str(DEPLOY / compose_file), "config", "-q"], capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, result.stderr
    services = yaml.safe_load((DEPLOY / compose_file).read_text())["services"]
    init = services["bookie-auth-init"]
    assert "bookie-auth:/var/lib/pulsarlite-auth" in init["volumes"]
    checked = 0
    for name, service in services.items():
        role = name.rsplit("-", 1)[0]
        if role not in ("bookie", "broker"):
            continue
        assert "bookie-auth:/var/lib/pulsarlite-auth:ro" in service["volumes"], name
        assert service["depends_on"]["bookie-auth-init"]["condition"] == "service_completed_successfully", name
        source = next(v.split(":")[0] for v in service["volumes"] if v.split(":")[1].endswith(f"{name}.toml"))
        zk_config = load_toml(BookieConfig if role == "bookie" else BrokerConfig, DEPLOY / source)
        assert zk_config.zookeeper_auth_digest_file == "/var/lib/pulsarlite-auth/zookeeper.digest", name
        if role == "bookie":
            config = load_toml(BookieConfig, DEPLOY / source)
            assert config.bookie_auth_enabled and not config.bookie_auth_insecure_allow and config.host == "0.0.0.0"
            assert config.bookie_auth_token_secret_key == "file:///var/lib/pulsarlite-auth/secret.key"
            assert config.bookie_auth_token_file == "/var/lib/pulsarlite-auth/autorecovery.token"
            assert {"broker", "autorecovery", "admin"} <= config.bookie_auth_role_names
            # the secured compose: TLS on the bookie port, the certificate of make-secrets.sh
            secure = compose_file == "docker-compose.secure.yml"
            assert bool(config.bookie_tls_certificate_file_path) == secure, name
            if secure:
                assert "./secrets:/etc/pulsarlite/secrets:ro" in service["volumes"], name
                assert config.bookie_tls_certificate_file_path == "/etc/pulsarlite/secrets/bookie.cert.pem"
                assert config.ledger_client_config().bookie_tls_enabled
        else:
            broker_config = load_toml(BrokerConfig, DEPLOY / source)
            assert broker_config.ledger_client.bookie_auth_token_file == "/var/lib/pulsarlite-auth/broker.token"
            assert broker_config.ledger_client.bookie_tls_enabled == (compose_file == "docker-compose.secure.yml"), name
        checked += 1
    assert checked == 5


def test_bookie_auth_init_makes_tokens_the_bookies_accept(tmp_path):
    """deploy/bookie-auth-init.sh: a key and three tokens, 0600, verified as a bookie verifies them;
    a second run keeps them."""
    from pulsarlite.security.tokens import TokenVerifier
    env = {"PATH": "/usr/bin:/bin", "PULSARLITE": str(Path(sys.executable).parent / "pulsarlite")}
    run = subprocess.run(["/bin/sh", str(DEPLOY / "bookie-auth-init.sh"), str(tmp_path)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    verifier = TokenVerifier.from_settings(secret_key=f"file://{tmp_path / 'secret.key'}", public_key="",
                                           clock_s=time.time)
    before = {}
    for role in ("broker", "autorecovery", "admin"):
        path = tmp_path / f"{role}.token"
        assert path.stat().st_mode & 0o777 == 0o600
        before[role] = path.read_text()
        assert verifier.role(before[role].strip().encode()) == role
        assert before[role].strip() not in run.stdout + run.stderr
    from pulsarlite.metadata import ZkAuth
    digest = tmp_path / "zookeeper.digest"
    assert digest.stat().st_mode & 0o777 == 0o600
    zk = ZkAuth.parse(digest.read_text(), source="zookeeper.digest")
    assert zk.user == "pulsarlite" and len(zk.password) >= 32 and zk.password not in run.stdout + run.stderr
    before["zookeeper.digest"] = digest.read_text()
    again = subprocess.run(["/bin/sh", str(DEPLOY / "bookie-auth-init.sh"), str(tmp_path)], capture_output=True,
                           text=True, env=env, timeout=120)
    assert again.returncode == 0 and all((tmp_path / f"{r}.token").read_text() == t for r, t in before.items()
                                         if r != "zookeeper.digest")
    assert digest.read_text() == before["zookeeper.digest"]


# -- a secured standalone: bookie authentication comes with authentication -------------------------
def test_secured_standalone_turns_bookie_authentication_on(tmp_path):
    from tests.integration.test_security_conf import Run
    from tests.integration.test_standalone import free_port_run
    from pulsarlite.zk_server import find_free_port
    (tmp_path / "client.key").write_bytes(SECRET)
    base = free_port_run(3)
    port, http_port = find_free_port(), find_free_port()
    conf = tmp_path / "standalone.conf"
    conf.write_text(f"brokerServicePort={port}\nwebServicePort={http_port}\nauthenticationEnabled=true\n"
                    f"authenticationProviders=org.apache.pulsar.broker.authentication.AuthenticationProviderToken\n"
                    f"tokenSecretKey=file://{tmp_path / 'client.key'}\nsuperUserRoles=admin\n")
    data = tmp_path / "data"
    run = Run(["--data-dir", str(data), "--pulsar-conf", str(conf), "--zookeeper-port", str(find_free_port()),
               "--bookie-port", str(base)])
    try:
        run.wait_output("pulsarlite standalone is ready")
        admin_token = data / "bookie-auth" / "admin.token"
        assert str(admin_token) in run.output
        assert (data / "bookie-auth").stat().st_mode & 0o777 == 0o700
        assert (data / "bookie-auth" / "secret.key").stat().st_mode & 0o777 == 0o600
        client = pulsar.Client(f"pulsar://127.0.0.1:{port}", operation_timeout_seconds=30,
                               authentication=pulsar.AuthenticationToken(
                                   create_token(subject="admin", now_s=time.time(), secret_key=SECRET)))
        try:
            producer = client.create_producer("persistent://public/default/standalone-bookie-auth")
            for i in range(5):
                producer.send(b"m%d" % i)           # acknowledged: the broker's bookie token works
        finally:
            client.close()
        # a raw request to a bookie without AuthRequest is refused
        got = asyncio.run(raw_exchange(f"127.0.0.1:{base}", [
            encode_message(pb.FRAME_DELETE_LEDGER_REQUEST, 5, pb.DeleteLedgerRequest(ledger_id=0))]))
        assert [pb.ErrorResponse.FromString(b).code for _, _, b in got] == [pb.AUTHENTICATION_ERROR]
        zookeeper = next(line.split()[-1] for line in run.lines if line.strip().startswith("ZooKeeper"))
        cmd = [sys.executable, "-m", "pulsarlite", "bookkeeper", "--zookeeper", zookeeper,
               "--bookie-auth-token-file", str(admin_token), "readledger", "0", "--print-entries"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "m0" in proc.stdout, proc.stdout + proc.stderr   # up to the LAC
        # ZooKeeper's ACLs: the credential made for this standalone, named in the banner; without
        # it nothing of pulsarlite's can be changed
        digest = data / "bookie-auth" / "zookeeper.digest"
        assert digest.stat().st_mode & 0o777 == 0o600 and str(digest) in run.output
        assert_zookeeper_unchangeable_without(zookeeper)
        proc = subprocess.run(cmd[:4] + ["--zookeeper-auth-digest-file", str(digest)] + cmd[4:],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "m0" in proc.stdout, proc.stdout + proc.stderr
        logs = "".join(p.read_text(errors="replace") for p in (data / "logs").glob("*.log"))
        assert digest.read_text().strip().split(":", 1)[1] not in logs + run.output
        for role in ("broker", "autorecovery", "admin"):
            assert (data / "bookie-auth" / f"{role}.token").read_text().strip() not in logs + run.output
    finally:
        run.stop()
