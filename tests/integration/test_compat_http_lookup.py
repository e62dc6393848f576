"""The official Python client (pulsar-client 3.x, C++ core) with an ``http://`` service URL:
it looks topics up over HTTP (``GET /lookup/v2/topic/persistent/{t}/{ns}/{topic}``) and asks
partitioned metadata at ``GET /admin/v2/persistent/{t}/{ns}/{topic}/partitions``.

Reference (Pulsar): the lookup answers a ``LookupData`` serialized by Pulsar's ObjectMapper
(Jackson, ``NON_NULL``): ``brokerUrl``, ``httpUrl``, ``nativeUrl`` (= brokerUrl), the legacy
``brokerUrlSsl`` (always ``""``) and, only when TLS listeners exist, ``brokerUrlTls`` and
``httpUrlTls``. The C++ client refuses a reply with neither ``brokerUrlTls`` nor
``brokerUrlSsl`` ("malformed json") and then dereferences a null result (a segfault), so the
client runs in a subprocess here: a crash fails the test instead of killing pytest."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

CHILD_TIMEOUT_S = 120

# Produces N messages to TOPIC, consumes them back and prints one JSON line per message
# (data, partition of the receipt, partition of the consumed id).
_CHILD = r"""
import json, sys
import pulsar
url, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = pulsar.Client(url, operation_timeout_seconds=30)
consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
producer = client.create_producer(topic, batching_enabled=False)
sent = {}
for i in range(n):
    mid = producer.send(f"m{i}".encode(), partition_key=f"k{i}")
    sent[f"m{i}"] = mid.partition()
got = []
for _ in range(n):
    msg = consumer.receive(timeout_millis=20000)
    got.append({"data": msg.data().decode(), "sent_partition": sent[msg.data().decode()],
                "partition": msg.message_id().partition(), "topic": msg.topic_name()})
    consumer.acknowledge(msg)
print("RESULT " + json.dumps(got), flush=True)
producer.close(); consumer.close(); client.close()
"""


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    """One cluster for the module's tests (each uses its own topics; none stops a process)."""
    return module_cluster_factory(3, brokers=1)


def _run_child(url: str, topic: str, n: int) -> list[dict]:
    proc = subprocess.run([sys.executable, "-c", _CHILD, url, topic, str(n)], capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S)
    assert proc.returncode == 0, f"official client exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-4000:]
    return json.loads(lines[0][len("RESULT "):])


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        return json.loads(response.read())


def test_lookup_answers_pulsars_lookup_data(cluster):
    """Every field Pulsar's LookupData has without TLS listeners, as strings; nativeUrl is the
    broker URL; brokerUrlTls/httpUrlTls are absent (Jackson NON_NULL drops nulls)."""
    data = _get_json(cluster.admin_url + "/lookup/v2/topic/persistent/public/default/lk")
    assert data["brokerUrl"].startswith("pulsar://")
    assert data["nativeUrl"] == data["brokerUrl"]
    assert data["httpUrl"].startswith("http://")
    assert data["brokerUrlSsl"] == ""
    assert "brokerUrlTls" not in data and "httpUrlTls" not in data
    assert all(isinstance(v, str) for v in data.values())


def test_official_client_over_http_service_url(cluster):
    got = _run_child(cluster.admin_url, "persistent://public/default/http-lookup", 10)
    assert sorted(g["data"] for g in got) == sorted(f"m{i}" for i in range(10))


def test_official_client_over_http_service_url_partitioned(cluster):
    topic = "persistent://public/default/http-lookup-part"
    req = urllib.request.Request(cluster.admin_url + "/admin/v2/persistent/public/default/http-lookup-part/partitions",
                                 data=b"3", method="PUT", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as response:
        assert response.status == 204
    assert _get_json(cluster.admin_url + "/admin/v2/persistent/public/default/http-lookup-part/partitions") \
        == {"partitions": 3}
    got = _run_child(cluster.admin_url, topic, 30)
    assert sorted(g["data"] for g in got) == sorted(f"m{i}" for i in range(30))
    assert {g["topic"] for g in got} <= {f"{topic}-partition-{i}" for i in range(3)}
    assert len({g["topic"] for g in got}) > 1
    for g in got:     # issue 32 item 2: consumed ids name their partition, as the receipts do
        assert g["partition"] == g["sent_partition"] == int(g["topic"].rsplit("-partition-", 1)[1])


def test_namespace_topics_listing_and_pattern_subscription_over_http(cluster):
    """Pulsar's ``GET /admin/v2/namespaces/{tenant}/{ns}/topics?mode=PERSISTENT|NON_PERSISTENT|ALL``
    (Namespaces.getTopics: the namespace's topics, partitions by their partition names). The
    official client's HTTP lookup lists topics with it for pattern subscriptions."""
    import re

    import pulsar
    base = cluster.admin_url + "/admin/v2"
    req = urllib.request.Request(f"{base}/persistent/public/default/pat-part/partitions", data=b"2", method="PUT",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as response:
        assert response.status == 204
    req = urllib.request.Request(f"{base}/persistent/public/default/pat-single", method="PUT")
    with urllib.request.urlopen(req, timeout=30) as response:
        assert response.status == 204
    listed = _get_json(f"{base}/namespaces/public/default/topics")
    assert set(listed) >= {"persistent://public/default/pat-single",
                           "persistent://public/default/pat-part-partition-0",
                           "persistent://public/default/pat-part-partition-1"}
    assert "persistent://public/default/pat-part" not in listed
    assert _get_json(f"{base}/namespaces/public/default/topics?mode=PERSISTENT") == listed
    assert _get_json(f"{base}/namespaces/public/default/topics?mode=ALL") == listed
    assert _get_json(f"{base}/namespaces/public/default/topics?mode=NON_PERSISTENT") == []

    client = pulsar.Client(cluster.admin_url, operation_timeout_seconds=30)
    try:
        consumer = client.subscribe(re.compile("persistent://public/default/pat-.*"), "sub",
                                    initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer("persistent://public/default/pat-single")
        producer.send(b"hello")
        assert consumer.receive(timeout_millis=20_000).data() == b"hello"
        producer.close()
        consumer.close()
    finally:
        client.close()
