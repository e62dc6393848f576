"""The Spark source on a broker with authentication on: the admin API calls planning makes
(an open ledger's last confirmed entry, where the metadata store is) carry the token given as
option ``adminToken`` / ``adminTokenFile``. Real ZooKeeper, bookies and a secured broker
(token provider), the official client, real Spark in local mode."""

from __future__ import annotations

import os

import pytest

pulsar = pytest.importorskip("pulsar")
pytest.importorskip("pyspark")

from integration.helpers import hs256_token, token_secured_cluster, topic_with_an_unconfirmed_last_entry  # noqa: E402

pytestmark = pytest.mark.integration

SECRET = os.urandom(32)
N = 7


def token(sub: str) -> str:
    return hs256_token(SECRET, sub)


@pytest.fixture(scope="module")
def secured(module_tmp_path):
    with token_secured_cluster(module_tmp_path, SECRET) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def open_topic(secured):
    """A topic whose only ledger is open: the bookies' LAC is the entry before the last, the
    broker's is the last."""
    return topic_with_an_unconfirmed_last_entry(secured.service_url, token("admin"), "secured", N)


def fmt(spark, secured, topic, **options):
    reader = (spark.read.format("pulsarlite").option("zookeeper", secured.zookeeper)
              .option("admin_url", secured.admin_url).option("topic", topic))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_open_ledger_read_to_the_brokers_last_confirmed_entry_with_the_admin_token(spark, secured, open_topic,
                                                                                  tmp_path):
    import spark_source
    admin_token = token("admin")
    # the format and read_topic: the last entry (confirmed by the broker, not yet by the bookies) is read
    got = sorted(r["value"] for r in fmt(spark, secured, open_topic, adminToken=admin_token).collect())
    assert got == sorted(f"v{i}".encode() for i in range(N))
    rows = spark_source.read_topic(spark, open_topic, zookeeper=secured.zookeeper, admin_url=secured.admin_url,
                                   adminToken=admin_token).collect()
    assert sorted(r["value"] for r in rows) == got
    # the same token from a file, and with only admin_url (the metadata store asked of the broker)
    path = tmp_path / "admin.token"
    path.write_text(admin_token + "\n")
    rows = spark_source.read_topic(spark, open_topic, admin_url=secured.admin_url,
                                   adminTokenFile=str(path)).collect()
    assert sorted(r["value"] for r in rows) == got


def test_without_the_token_the_read_stops_at_the_bookies_lac(spark, secured, open_topic):
    """The broker refuses the call (401): planning falls back to the bookies' LAC, one entry
    short; the test above passing where this one reads less is the token at work."""
    got = fmt(spark, secured, open_topic).collect()
    assert len(got) == N - 1
