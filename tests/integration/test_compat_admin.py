"""Admin REST forms and endpoints the official clients use (issue 32 items 10, 17, 14, 16, 18),
against real broker and bookie processes. The Go client is not installed here: its requests are
reproduced byte for byte with ``requests``; the official Python client (C++ core) produces and
consumes where a client is needed."""

from __future__ import annotations

import time

import pytest
import requests

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 20_000
NS = "public/default"


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    return module_cluster_factory(3, brokers=1)


@pytest.fixture
def admin(cluster) -> str:
    return cluster.admin_url + "/admin/v2"


@pytest.fixture
def client(cluster):
    c = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        yield c
    finally:
        c.close()


# -- item 10: creating a partitioned topic as the Go admin client does --------------------------
def test_create_partitioned_topic_with_go_clients_metadata_body(admin):
    """Pulsar's PersistentTopics accepts the partition count as a bare integer
    (``application/json``) and as a PartitionedTopicMetadata object
    (``application/vnd.partitioned-topic-metadata+json``, what pulsar-admin-go 0.17 sends:
    ``{"properties":null,"partitions":3}``); GET answers the metadata (properties when set)."""
    url = f"{admin}/persistent/{NS}/go-created/partitions"
    r = requests.put(url, data=b'{"properties":null,"partitions":3}',
                     headers={"Content-Type": "application/vnd.partitioned-topic-metadata+json"}, timeout=30)
    assert r.status_code == 204, r.text
    assert requests.get(url, timeout=30).json() == {"partitions": 3}

    url = f"{admin}/persistent/{NS}/go-created-props/partitions"
    r = requests.put(url, data=b'{"partitions":2,"properties":{"owner":"team-a"}}',
                     headers={"Content-Type": "application/vnd.partitioned-topic-metadata+json"}, timeout=30)
    assert r.status_code == 204, r.text
    assert requests.get(url, timeout=30).json() == {"partitions": 2, "properties": {"owner": "team-a"}}
    r = requests.post(url, data=b"4", headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 204, r.text
    assert requests.get(url, timeout=30).json() == {"partitions": 4, "properties": {"owner": "team-a"}}

    url = f"{admin}/persistent/{NS}/int-created/partitions"
    r = requests.put(url, data=b"2", headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 204, r.text
    assert requests.get(url, timeout=30).json() == {"partitions": 2}


@pytest.mark.parametrize("body", [b'{"partitions":0}', b'{"properties":null}', b'{"partitions":"x"}',
                                  b'{"partitions":2,"properties":{"a":1}}', b'{"partitions":2,"properties":[]}',
                                  b'[3]'])
def test_create_partitioned_topic_refuses_bad_metadata(admin, body):
    url = f"{admin}/persistent/{NS}/bad-metadata/partitions"
    r = requests.put(url, data=body, headers={"Content-Type": "application/vnd.partitioned-topic-metadata+json"},
                     timeout=30)
    assert r.status_code in (400, 412), r.text
    assert requests.get(url, timeout=30).json() == {"partitions": 0}


# -- item 17: numbers as strings, as Jackson coerces them --------------------------------------
def test_backlog_quota_takes_a_numeric_string(admin):
    """Pulsar reads policies with Jackson, which coerces a numeric string into a long field:
    ``{"limit":"10240","policy":"producer_exception"}`` (what pulsar-admin-go sends) sets a
    10240-byte quota. A string that is not a number is still refused, changing nothing."""
    url = f"{admin}/namespaces/{NS}/backlogQuota?backlogQuotaType=destination_storage"
    r = requests.post(url, json={"limit": "10240", "limitTime": "-1", "policy": "producer_exception"}, timeout=30)
    assert r.status_code == 204, r.text
    got = requests.get(f"{admin}/namespaces/{NS}/backlogQuotaMap", timeout=30).json()
    assert got["destination_storage"] == {"limitSize": 10240, "limitTime": -1, "policy": "producer_exception"}
    r = requests.post(url, json={"limitSize": "ten", "policy": "producer_exception"}, timeout=30)
    assert r.status_code == 400, r.text
    assert requests.get(f"{admin}/namespaces/{NS}/backlogQuotaMap", timeout=30).json() == got
    assert requests.delete(url, timeout=30).status_code == 204
