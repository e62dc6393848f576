"""Admin REST forms and endpoints the official clients use (issue 32 items 10, 17, 14, 16, 18),
against real broker and bookie processes. The Go client is not installed here: its requests are
reproduced byte for byte with ``requests``; the official Python client (C++ core) produces and
consumes where a client is needed."""

from __future__ import annotations

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


# -- item 14: deleted schema versions are not served ---------------------------------------------
def _binary_request(cluster, request: bytes, answer_type: int):
    """Sends CONNECT then ``request`` over the binary protocol; the first command of
    ``answer_type`` (or ERROR) that comes back."""
    import socket

    from pulsarlite.wire import commands as c
    from pulsarlite.wire import pb
    from pulsarlite.wire.frames import FrameDecoder

    host, port = cluster.service_url.split("://", 1)[1].split(",")[0].rsplit(":", 1)
    decoder = FrameDecoder()
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(c.connect("compat-test"))
        s.sendall(request)
        while True:
            data = s.recv(65536)
            assert data, "connection closed before an answer"
            for frame in decoder.feed(data):
                if frame.command.type in (answer_type, pb.BaseCommand.ERROR):
                    return frame.command


def _binary_get_schema(cluster, topic: str, version: int | None):
    """One GET_SCHEMA, as the clients send it (version: 8 bytes, big-endian)."""
    from broker.schemas import encode_version
    from pulsarlite.wire import commands as c
    from pulsarlite.wire import pb
    request = c.get_schema(7, topic, schema_version=None if version is None else encode_version(version))
    return _binary_request(cluster, request, pb.BaseCommand.GET_SCHEMA_RESPONSE).getSchemaResponse


def test_deleted_schema_versions_are_not_served(cluster, admin):
    """Pulsar's SchemaRegistryServiceImpl.getSchema(id, version) looks a version up among the
    versions after the last delete (trimDeletedSchemaAndGetList): a deleted version is "not
    found", on REST (404) and on the binary GET_SCHEMA (TopicNotFound, "schema not found")."""
    import json

    from pulsarlite.wire import pb
    url = f"{admin}/schemas/{NS}/schema-deleted"
    topic = f"persistent://{NS}/schema-deleted"
    v0 = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
    r = requests.post(url + "/schema", json={"type": "AVRO", "schema": json.dumps(v0)}, timeout=30)
    assert r.status_code == 200 and r.json() == {"version": 0}, r.text
    assert requests.get(url + "/schema/0", timeout=30).status_code == 200
    got = _binary_get_schema(cluster, topic, 0)
    assert not got.HasField("error_code") and json.loads(got.schema.schema_data) == v0

    assert requests.delete(url + "/schema", timeout=30).json() == {"version": 1}
    assert requests.get(url + "/schema/0", timeout=30).status_code == 404
    assert requests.get(url + "/schema/1", timeout=30).status_code == 404       # the tombstone
    assert requests.get(url + "/schema", timeout=30).status_code == 404
    assert requests.get(url + "/schemas", timeout=30).json() == {"getSchemaResponses": []}
    for version in (0, None):
        got = _binary_get_schema(cluster, topic, version)
        assert got.HasField("error_code") and got.error_code == pb.TopicNotFound, got

    v2 = {"type": "record", "name": "R", "fields": [{"name": "b", "type": "string"}]}
    r = requests.post(url + "/schema", json={"type": "AVRO", "schema": json.dumps(v2)}, timeout=30)
    assert r.json() == {"version": 2}
    assert requests.get(url + "/schema/0", timeout=30).status_code == 404
    assert json.loads(requests.get(url + "/schema/2", timeout=30).json()["data"]) == v2
    got = _binary_get_schema(cluster, topic, 0)
    assert got.HasField("error_code"), got
    got = _binary_get_schema(cluster, topic, 2)
    assert not got.HasField("error_code") and json.loads(got.schema.schema_data) == v2


# -- item 16: per-client fields of topic stats ---------------------------------------------------
def test_topic_stats_carry_client_metadata_and_version(cluster, admin, client):
    """Pulsar's PublisherStats and ConsumerStats: ``metadata`` (the producer's / consumer's
    properties from PRODUCER / SUBSCRIBE, an empty map when none) and ``clientVersion`` (the
    CONNECT's client_version of its connection)."""
    topic = f"persistent://{NS}/stats-clients"
    producer = client.create_producer(topic, properties={"app": "billing", "zone": "eu"})
    consumer = client.subscribe(topic, "s", properties={"team": "ops"})
    bare = client.subscribe(topic, "t")
    try:
        stats = requests.get(f"{admin}/persistent/{NS}/stats-clients/stats", timeout=30).json()
        [publisher] = stats["publishers"]
        assert publisher["metadata"] == {"app": "billing", "zone": "eu"}
        version = publisher["clientVersion"]
        assert isinstance(version, str) and version
        [c1] = stats["subscriptions"]["s"]["consumers"]
        assert c1["metadata"] == {"team": "ops"} and c1["clientVersion"] == version
        [c2] = stats["subscriptions"]["t"]["consumers"]
        assert c2["metadata"] == {} and c2["clientVersion"] == version
    finally:
        producer.close()
        consumer.close()
        bare.close()


# -- item 18: endpoints and options the Go client uses -------------------------------------------
def test_producer_initial_subscription_name_creates_the_subscription(cluster, admin, client):
    """Pulsar's ServerCnx.handleProducer: a PRODUCER with ``initial_subscription_name`` creates
    that durable subscription at the earliest position if the topic lacks it (the Go client's
    dead-letter producer pre-creates its subscription this way), so what is published before any
    consumer comes is kept for it."""
    from pulsarlite.wire import commands as c
    from pulsarlite.wire import pb
    topic = f"persistent://{NS}/initial-sub"
    body = pb.CommandProducer(topic=topic, producer_id=1, request_id=3, initial_subscription_name="dlq-sub")
    answer = _binary_request(cluster, c.encode_command(pb.BaseCommand(type=pb.BaseCommand.PRODUCER, producer=body)),
                             pb.BaseCommand.PRODUCER_SUCCESS)
    assert answer.type == pb.BaseCommand.PRODUCER_SUCCESS, answer
    assert requests.get(f"{admin}/persistent/{NS}/initial-sub/subscriptions", timeout=30).json() == ["dlq-sub"]
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(3):
        producer.send(f"d{i}".encode())
    producer.close()
    consumer = client.subscribe(topic, "dlq-sub", initial_position=pulsar.InitialPosition.Latest)
    assert [consumer.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(3)] == [b"d0", b"d1", b"d2"]
    consumer.close()

    bad = pb.CommandProducer(topic=topic, producer_id=2, request_id=4, initial_subscription_name="a\nb")
    answer = _binary_request(cluster, c.encode_command(pb.BaseCommand(type=pb.BaseCommand.PRODUCER, producer=bad)),
                             pb.BaseCommand.PRODUCER_SUCCESS)
    assert answer.type == pb.BaseCommand.ERROR, answer


def test_get_message_by_id(cluster, admin, client):
    """Pulsar's getMessageById (``GET .../ledger/{l}/entry/{e}``, pulsar-admin-go's
    GetMessageByID): the payload (decompressed; a batch as its framed messages) with the
    metadata in X-Pulsar-* headers; 404 for an entry the topic does not have."""
    topic = f"persistent://{NS}/by-id"
    producer = client.create_producer(topic, batching_enabled=False, compression_type=pulsar.CompressionType.LZ4)
    mid = producer.send(b"payload-" * 50, properties={"trace": "t-1"}, partition_key="key-1",
                        event_timestamp=1_700_000_000_123)
    producer.close()
    url = f"{admin}/persistent/{NS}/by-id/ledger/{mid.ledger_id()}/entry/{mid.entry_id()}"
    r = requests.get(url, timeout=30)
    assert r.status_code == 200, r.text
    assert r.content == b"payload-" * 50
    assert r.headers["Content-Type"] == "application/octet-stream"
    assert r.headers["X-Pulsar-Message-ID"] == f"{mid.ledger_id()}:{mid.entry_id()}"
    assert r.headers["X-Pulsar-PROPERTY"] == '{"trace":"t-1"}'
    assert r.headers["X-Pulsar-partition-key"] == "key-1"
    assert r.headers["X-Pulsar-event-time"] == "2023-11-14T22:13:20.123Z"
    assert r.headers["X-Pulsar-compression"] == "LZ4" and r.headers["X-Pulsar-Is-Encrypted"] == "false"
    assert r.headers["X-Pulsar-sequence-id"] == "0" and r.headers["X-Pulsar-producer-name"]
    assert "X-Pulsar-num-batch-message" not in r.headers

    batched = client.create_producer(topic, batching_enabled=True, batching_max_messages=3,
                                     batching_max_publish_delay_ms=1000)
    ids = []
    for i in range(3):
        batched.send_async(f"b{i}".encode(), lambda res, msg_id: ids.append(msg_id))
    batched.flush()
    batched.close()
    [(ledger_id, entry_id)] = {(m.ledger_id(), m.entry_id()) for m in ids}
    r = requests.get(f"{admin}/persistent/{NS}/by-id/ledger/{ledger_id}/entry/{entry_id}", timeout=30)
    assert r.status_code == 200 and r.headers["X-Pulsar-num-batch-message"] == "3"
    from pulsarlite.wire.entry import unpack_entry
    framed = bytes(r.content)
    # the body is the batch payload: wrap it in minimal metadata to split it with our codec
    from pulsarlite.wire import pb
    meta = pb.MessageMetadata(producer_name="x", sequence_id=0, publish_time=1,
                              num_messages_in_batch=3).SerializeToString()
    entry = len(meta).to_bytes(4, "big") + meta + framed
    assert [bytes(m.payload) for m in unpack_entry(entry)[1]] == [b"b0", b"b1", b"b2"]

    for missing in (f"{ledger_id}/entry/{entry_id + 5}", f"{ledger_id + 1000}/entry/0"):
        assert requests.get(f"{admin}/persistent/{NS}/by-id/ledger/{missing}", timeout=30).status_code == 404
    assert requests.get(f"{admin}/persistent/{NS}/never/ledger/1/entry/0", timeout=30).status_code == 404
    assert requests.get(f"{admin}/persistent/{NS}/by-id/ledger/x/entry/0", timeout=30).status_code == 400
    r = requests.put(f"{admin}/persistent/{NS}/by-id-part/partitions", data=b"2",
                     headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 204
    # Pulsar (#19013): not on a partitioned topic's parent (405); a partition answers
    assert requests.get(f"{admin}/persistent/{NS}/by-id-part/ledger/1/entry/0", timeout=30).status_code == 405
    assert requests.get(f"{admin}/persistent/{NS}/by-id-part-partition-0/ledger/{10 ** 9}/entry/0",
                        timeout=30).status_code == 404


def test_terminate_topic(cluster, admin, client):
    """Pulsar's ``POST .../terminate``: the topic takes no more messages; the answer is the
    last message id (``{"ledgerId", "entryId", "partitionIndex"}``), the same on a repeat;
    existing producers' sends and new producers fail with TopicTerminated, also after the topic
    is unloaded (termination is stored); what was published stays readable; a partitioned
    topic's parent cannot be terminated (405); deleting the topic forgets it."""
    local = "to-terminate"
    topic = f"persistent://{NS}/{local}"
    url = f"{admin}/persistent/{NS}/{local}"
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"t{i}".encode()) for i in range(3)]
    r = requests.post(url + "/terminate", timeout=30)
    assert r.status_code == 200, r.text
    last = {"ledgerId": ids[-1].ledger_id(), "entryId": ids[-1].entry_id(), "partitionIndex": -1}
    assert r.json() == last
    with pytest.raises(Exception, match="(?i)terminated"):
        producer.send(b"late")
    with pytest.raises(Exception, match="(?i)terminated"):
        client.create_producer(topic)
    assert requests.post(url + "/terminate", timeout=30).json() == last
    assert requests.put(url + "/unload", timeout=30).status_code == 204
    with pytest.raises(Exception, match="(?i)terminated"):
        client.create_producer(topic)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [reader.read_next(timeout_millis=TIMEOUT_MS).data() for _ in range(3)] == [b"t0", b"t1", b"t2"]
    reader.close()

    assert requests.post(f"{admin}/persistent/{NS}/never-there/terminate", timeout=30).status_code == 404
    r = requests.put(f"{admin}/persistent/{NS}/term-part/partitions", data=b"2",
                     headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 204
    assert requests.post(f"{admin}/persistent/{NS}/term-part/terminate", timeout=30).status_code == 405

    assert requests.delete(url + "?force=true", timeout=30).status_code == 204
    again = client.create_producer(topic)          # a new topic of the same name
    again.send(b"fresh")
    again.close()


def test_cli_terminate(cluster, client, tmp_path):
    """``pulsarlite admin topics terminate TOPIC`` (pulsar-admin's twin) prints the last message id."""
    import json
    import os
    import subprocess
    import sys
    topic = f"persistent://{NS}/cli-terminate"
    producer = client.create_producer(topic, batching_enabled=False)
    mid = producer.send(b"only")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSARLITE_")} | {"HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "pulsarlite", "admin", "--admin-url", cluster.admin_url,
                           "topics", "terminate", topic], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"ledgerId": mid.ledger_id(), "entryId": mid.entry_id(), "partitionIndex": -1}
    with pytest.raises(Exception, match="(?i)terminated"):
        producer.send(b"late")


def test_terminate_partitioned_topic(cluster, admin, client):
    """Pulsar's ``POST .../terminate/partitions`` (terminatePartitionedTopic): every partition is
    terminated; the answer maps each partition index to its last message id; 404 for a topic
    that is not partitioned."""
    local = "term-all"
    topic = f"persistent://{NS}/{local}"
    r = requests.put(f"{admin}/persistent/{NS}/{local}/partitions", data=b"2",
                     headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 204
    producer = client.create_producer(topic, batching_enabled=False)
    last: dict[int, tuple[int, int]] = {}
    for i in range(10):
        mid = producer.send(f"x{i}".encode(), partition_key=f"key-{i}")
        last[mid.partition()] = (mid.ledger_id(), mid.entry_id())
    r = requests.post(f"{admin}/persistent/{NS}/{local}/terminate/partitions", timeout=30)
    assert r.status_code == 200, r.text
    got = r.json()
    assert set(got) == {"0", "1"}
    for index, (ledger_id, entry_id) in last.items():
        assert got[str(index)] == {"ledgerId": ledger_id, "entryId": entry_id, "partitionIndex": index}
    with pytest.raises(Exception, match="(?i)terminated"):
        producer.send(b"late", partition_key="key-0")
    try:
        producer.close()
    except Exception:      # noqa: BLE001 - the client may have closed a terminated producer itself
        pass
    assert requests.put(f"{admin}/persistent/{NS}/term-single", timeout=30).status_code == 204
    assert requests.post(f"{admin}/persistent/{NS}/term-single/terminate/partitions", timeout=30).status_code == 404


def test_cli_get_message_by_id(cluster, client, tmp_path):
    """``pulsarlite admin topics get-message-by-id -l L -e E TOPIC`` (pulsar-admin's twin): the
    entry's message, or a batch's messages, as JSON."""
    import json
    import os
    import subprocess
    import sys
    topic = f"persistent://{NS}/cli-by-id"
    producer = client.create_producer(topic, batching_enabled=False)
    mid = producer.send(b"plain", properties={"p": "1"})
    producer.close()
    batched = client.create_producer(topic, batching_enabled=True, batching_max_messages=2,
                                     batching_max_publish_delay_ms=1000)
    ids = []
    for i in range(2):
        batched.send_async(f"b{i}".encode(), lambda res, msg_id: ids.append(msg_id), properties={"i": str(i)})
    batched.flush()
    batched.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSARLITE_")} | {"HOME": str(tmp_path)}

    def get(ledger_id: int, entry_id: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pulsarlite", "admin", "--admin-url", cluster.admin_url,
                               "topics", "get-message-by-id", "-l", str(ledger_id), "-e", str(entry_id), topic],
                              capture_output=True, text=True, timeout=120, env=env)

    proc = get(mid.ledger_id(), mid.entry_id())
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["messageId"] == f"{mid.ledger_id()}:{mid.entry_id()}"
    assert got["payload"] == "plain" and got["properties"] == {"p": "1"}
    proc = get(ids[0].ledger_id(), ids[0].entry_id())
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert [(m["payload"], m["properties"]) for m in got["messages"]] == [("b0", {"i": "0"}), ("b1", {"i": "1"})]
    proc = get(mid.ledger_id(), mid.entry_id() + 100)
    assert proc.returncode == 1 and "404" in proc.stderr
