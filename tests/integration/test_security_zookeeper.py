"""ZooKeeper digest authentication and ACLs (docs/security.md "ZooKeeper"), against a real
ZooKeeper: with a credential, pulsarlite's znodes can be changed only by that credential (and
read only by it when read_restricted); a wrong credential is refused at connect."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from pulsarlite.errors import ConfigError
from pulsarlite.metadata import MetadataAuthError, MetadataStore, ZkAuth
from pulsarlite.metadata_layout import PULSARLITE_ROOTS

pytestmark = pytest.mark.integration

GOOD = ZkAuth.parse("pulsarlite:s3cret-zk-pw", source="test")


def _kazoo(hosts: str, auth: ZkAuth | None = None) -> KazooClient:
    client = KazooClient(hosts=hosts, timeout=10, auth_data=auth.auth_data() if auth else None)
    client.start(timeout=15)
    return client


async def test_unauthenticated_client_cannot_change_pulsarlite_znodes(zk_hosts):
    store = await MetadataStore.connect(zk_hosts, auth=GOOD)
    try:
        await store.create("/managed-ledgers/t/ns/persistent/topic", b"ledgers")
        await store.create("/ledgers/available/b1", b"", ephemeral=True)
        stranger = _kazoo(zk_hosts)
        try:
            for root in PULSARLITE_ROOTS:
                assert stranger.exists(root) is not None, root     # made at connect, with the ACL
                with pytest.raises(NoAuthError):
                    stranger.create(f"{root}/planted", b"x")
            with pytest.raises(NoAuthError):
                stranger.set("/managed-ledgers/t/ns/persistent/topic", b"forged")
            with pytest.raises(NoAuthError):
                stranger.delete("/managed-ledgers/t/ns/persistent/topic")
            with pytest.raises(NoAuthError):
                stranger.delete("/ledgers/available/b1")
            with pytest.raises(NoAuthError):
                stranger.set_acls("/ledgers", list(OPEN_ACL_UNSAFE))
            # reading stays open (read_restricted is off)
            assert stranger.get("/managed-ledgers/t/ns/persistent/topic")[0] == b"ledgers"
        finally:
            stranger.stop()
            stranger.close()
        assert (await store.get("/managed-ledgers/t/ns/persistent/topic"))[0] == b"ledgers"
        assert await store.exists("/ledgers/available/b1")
        # the credential itself can do everything
        version = (await store.get("/managed-ledgers/t/ns/persistent/topic"))[1]
        await store.set("/managed-ledgers/t/ns/persistent/topic", b"v2", version)
        await store.delete("/managed-ledgers/t", recursive=True)
    finally:
        await store.close()


async def test_read_restricted_hides_the_data(zk_hosts):
    auth = ZkAuth.parse("pulsarlite:s3cret-zk-pw", read_restricted=True, source="test")
    store = await MetadataStore.connect(zk_hosts, auth=auth)
    try:
        await store.create("/admin/policies/t/ns", b"policies")
        stranger = _kazoo(zk_hosts)
        try:
            with pytest.raises(NoAuthError):
                stranger.get("/admin/policies/t/ns")
            with pytest.raises(NoAuthError):
                stranger.get_children("/admin")
        finally:
            stranger.stop()
            stranger.close()
        assert (await store.get("/admin/policies/t/ns"))[0] == b"policies"
    finally:
        await store.close()


async def test_wrong_credential_is_refused_at_connect(zk_hosts):
    store = await MetadataStore.connect(zk_hosts, auth=GOOD)
    await store.close()
    wrong = ZkAuth.parse("pulsarlite:not-the-password", source="test")
    with pytest.raises(MetadataAuthError) as info:
        await MetadataStore.connect(zk_hosts, auth=wrong)
    assert "wrong zookeeper_auth_digest" in str(info.value)
    assert "not-the-password" not in str(info.value) and "s3cret" not in str(info.value)
    # read_restricted: the wrong credential cannot even read the ACLs; refused the same way
    restricted = ZkAuth.parse("ops:pw-one", read_restricted=True, source="test")
    hosts2 = zk_hosts + "-r"
    await (await MetadataStore.connect(hosts2, auth=restricted)).close()
    with pytest.raises(MetadataAuthError):
        await MetadataStore.connect(hosts2, auth=ZkAuth.parse("ops:pw-two", read_restricted=True, source="test"))


async def test_store_without_credential_gets_a_clear_error(zk_hosts):
    store = await MetadataStore.connect(zk_hosts, auth=GOOD)
    await store.close()
    anonymous = await MetadataStore.connect(zk_hosts)
    try:
        with pytest.raises(MetadataAuthError) as info:
            await anonymous.create("/ledgers/idgen/x", b"")
        assert not info.value.retriable
        assert "zookeeper_auth_digest" in str(info.value)
    finally:
        await anonymous.close()


def test_znodes_made_before_authentication_are_named(zk_hosts, caplog):
    import asyncio

    async def go():
        await (await MetadataStore.connect(zk_hosts)).close()    # creates nothing
        plain = await MetadataStore.connect(zk_hosts)
        await plain.create("/ledgers/old", b"")
        await plain.close()
        await (await MetadataStore.connect(zk_hosts, auth=GOOD)).close()
    with caplog.at_level("WARNING", logger="pulsarlite.metadata"):
        asyncio.run(go())
    warnings = [r.getMessage() for r in caplog.records if "writable by anyone" in r.getMessage()]
    assert warnings and "/ledgers" in warnings[0] and "s3cret" not in warnings[0]


@pytest.mark.parametrize("digest", ["nocolon", ":pw", "user:", "us er:pw", "a:b\nc", "u:" + "x" * 2000])
def test_malformed_digest_is_refused_without_echoing_it(digest):
    with pytest.raises(ConfigError) as info:
        ZkAuth.parse(digest, source="broker.zookeeper_auth_digest")
    assert "broker.zookeeper_auth_digest" in str(info.value)
    if digest.partition(":")[2]:
        assert digest.split(":", 1)[1] not in str(info.value)


def test_repr_hides_the_password():
    assert "s3cret" not in repr(GOOD)
    assert GOOD.digest_id.startswith("pulsarlite:") and "s3cret" not in GOOD.digest_id


async def test_a_new_session_after_expiry_is_authenticated_again(zk_server, zk_hosts):
    """kazoo re-sends the credential on every connection: after the session expired (LOST) and a
    new one was made, the store still writes under the protected roots, with the ACL."""
    from integration.helpers import BlockableProxy
    from pulsarlite.metadata import split_chroot
    from tests.integration.test_metadata_store import StateRecorder, expire_while_cut_off
    proxy = BlockableProxy(zk_server.port)
    chroot = split_chroot(zk_hosts)[1]
    try:
        s = await MetadataStore.connect(f"127.0.0.1:{proxy.port}{chroot}", session_timeout_ms=2000, auth=GOOD)
        observer = await MetadataStore.connect(zk_hosts, auth=GOOD)
        try:
            recorder = StateRecorder()
            s.add_session_listener(recorder)
            await s.create("/loadbalance/brokers/b1", ephemeral=True)
            await expire_while_cut_off(s, proxy, recorder, observer, "/loadbalance/brokers/b1")
            await s.create("/loadbalance/brokers/b1", ephemeral=True)      # NoAuth if not re-authenticated
        finally:
            await observer.close()
            await s.close()
        stranger = _kazoo(zk_hosts)
        try:
            with pytest.raises(NoAuthError):
                stranger.create("/loadbalance/brokers/planted", b"")
        finally:
            stranger.stop()
            stranger.close()
    finally:
        proxy.close()


async def test_secure_znodes_closes_a_cluster_made_without_authentication(zk_hosts, tmp_path):
    """The upgrade path: znodes made without a credential stay open until the operator runs
    ``pulsarlite bookkeeper secure-znodes`` with it; after that nobody else changes any of them."""
    import os
    import subprocess
    import sys
    plain = await MetadataStore.connect(zk_hosts)
    try:
        await plain.create("/managed-ledgers/t/ns/persistent/old-topic", b"ledgers")
        await plain.create("/ledgers/00/0000/L0001", b"meta")
        await plain.create("/non-persistent/t/ns/old-topic", b"broker-1")
    finally:
        await plain.close()
    stranger = _kazoo(zk_hosts)
    try:
        stranger.set("/ledgers/00/0000/L0001", b"still open")       # open before
        digest = tmp_path / "zookeeper.digest"
        digest.write_text("pulsarlite:s3cret-zk-pw\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PULSARLITE_")}
        env["PYTHONPATH"] = str(__import__("pathlib").Path(__file__).resolve().parents[2])
        base = [sys.executable, "-m", "pulsarlite", "bookkeeper", "--zookeeper", zk_hosts]
        refused = subprocess.run(base + ["secure-znodes"], capture_output=True, text=True, timeout=120, env=env)
        assert refused.returncode == 2 and "--zookeeper-auth-digest-file" in refused.stderr
        proc = subprocess.run(base + ["--zookeeper-auth-digest-file", str(digest), "secure-znodes"],
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "s3cret" not in proc.stdout + proc.stderr
        for path in ("/managed-ledgers", "/managed-ledgers/t/ns/persistent/old-topic", "/ledgers/00/0000/L0001",
                     "/non-persistent", "/non-persistent/t/ns/old-topic"):
            with pytest.raises(NoAuthError):
                stranger.set(path, b"forged")
        for path in ("/managed-ledgers/t/ns/persistent/planted", "/non-persistent/t/ns/planted"):
            with pytest.raises(NoAuthError):
                stranger.create(path, b"")
        with pytest.raises(NoAuthError):
            stranger.delete("/non-persistent/t/ns/old-topic")
        assert stranger.get("/ledgers/00/0000/L0001")[0] == b"still open"
    finally:
        stranger.stop()
        stranger.close()
    store = await MetadataStore.connect(zk_hosts, auth=GOOD)
    try:
        await store.set("/ledgers/00/0000/L0001", b"v2", -1)
    finally:
        await store.close()


async def test_non_persistent_registrations_are_closed_to_strangers(cluster_factory, tmp_path):
    """``/non-persistent`` (where a broker registers each non-persistent topic it loads) is one of
    pulsarlite's roots: on a ZooKeeper without a chroot (the launcher's, like a deployment's ``/``,
    open to anyone), a stranger can neither create it first nor plant or remove a topic under it.
    Before it was in PULSARLITE_ROOTS it did not exist until the first non-persistent topic was
    loaded, and anyone could create it (open to all) and everything below it."""
    import asyncio

    import pulsar
    (tmp_path / "zookeeper.digest").write_text("pulsarlite:s3cret-zk-pw\n")
    zk = {"zookeeper_auth_digest_file": str(tmp_path / "zookeeper.digest")}
    cluster = await asyncio.to_thread(cluster_factory, 1, brokers=1, bookie_overrides=zk, broker_overrides=zk)
    stranger = _kazoo(cluster.zookeeper)
    try:
        for path in ("/non-persistent/public", "/non-persistent/planted"):
            with pytest.raises(NoAuthError):
                stranger.create(path, b"x", makepath=True)
        assert stranger.exists("/non-persistent") is not None        # made at connect, with the ACL
        client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
        try:
            topic = "non-persistent://public/default/registered"
            consumer = client.subscribe(topic, "s")
            producer = client.create_producer(topic)
            producer.send(b"m")
            assert consumer.receive(timeout_millis=30_000).data() == b"m"
            registration = "/non-persistent/public/default/registered"
            assert stranger.exists(registration) is not None
            for path in ("/non-persistent", "/non-persistent/public", "/non-persistent/public/default", registration):
                acls, _ = stranger.get_acls(path)
                assert {(a.id.scheme, a.perms) for a in acls} == {("digest", 31), ("world", 1)}, (path, acls)
            with pytest.raises(NoAuthError):
                stranger.delete(registration)
            with pytest.raises(NoAuthError):
                stranger.create("/non-persistent/public/default/planted", b"x")
        finally:
            client.close()
    finally:
        stranger.stop()
        stranger.close()
