"""[lakehouse] ``pulsarlite.lake.scan`` on a broker with authentication on: its admin calls (the
lake endpoint ``GET .../lake``, the open ledger's last confirmed entry) carry the token given as
option ``adminToken`` / ``adminTokenFile``, as the Spark source's do. Real ZooKeeper, bookies and
a secured broker (token provider, lake on, file:// tier), the official client."""

from __future__ import annotations

import os

import pytest

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("pyiceberg")

from integration.helpers import hs256_token, token_secured_cluster, topic_with_an_unconfirmed_last_entry  # noqa: E402

pytestmark = pytest.mark.integration

SECRET = os.urandom(32)
N = 7


def token(sub: str) -> str:
    return hs256_token(SECRET, sub)


@pytest.fixture(scope="module")
def secured(module_tmp_path):
    tier = module_tmp_path / "tier"
    tier.mkdir()
    with token_secured_cluster(module_tmp_path, SECRET, tier_uri=f"file://{tier}", lake_enabled=True) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def open_topic(secured):
    """A topic whose only ledger is open: the bookies' LAC is the entry before the last, the
    broker's is the last."""
    return topic_with_an_unconfirmed_last_entry(secured.service_url, token("admin"), "secured-lake", N)


def test_scan_with_the_admin_token_reads_to_the_brokers_last_confirmed_entry(secured, open_topic, tmp_path):
    from pulsarlite.lake import scan
    want = [f"v{i}".encode() for i in range(N)]
    got = scan(open_topic, zookeeper=secured.zookeeper, admin_url=secured.admin_url,
               options={"adminToken": token("admin")})
    assert got.column("value").to_pylist() == want          # the last entry too (the broker's LAC)
    from pulsarlite.lake import scan_batches
    path = tmp_path / "admin.token"
    path.write_text(token("admin") + "\n")
    with scan_batches(open_topic, zookeeper=secured.zookeeper, admin_url=secured.admin_url,
                      options={"adminTokenFile": str(path)}) as reader:
        assert reader.read_all().column("value").to_pylist() == want


def test_scan_without_the_admin_token_is_refused_with_a_clear_error(secured, open_topic):
    from pulsarlite.lake import LakeScanError, scan
    with pytest.raises(LakeScanError, match="401.*adminToken"):
        scan(open_topic, zookeeper=secured.zookeeper, admin_url=secured.admin_url)
    with pytest.raises(LakeScanError, match="401|403"):
        scan(open_topic, zookeeper=secured.zookeeper, admin_url=secured.admin_url,
             options={"adminToken": token("someone")})
