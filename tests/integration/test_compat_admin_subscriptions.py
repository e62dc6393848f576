"""The subscription and message admin paths pulsar-admin uses (issue 32 item 9): expire-messages
(one subscription and all of them), reset-cursor to a message id, peek-messages,
examine-message, and their ``pulsarlite admin`` twins; against real ZooKeeper, bookie and broker
processes, messages produced and consumed with the official Python client (C++ core). Each test
names the Pulsar behaviour it checks (PersistentTopicsBase)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import requests

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 20_000
NS = "public/default"
CLI_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def cluster(module_cluster_factory):
    return module_cluster_factory(3, brokers=1)


@pytest.fixture
def admin(cluster) -> str:
    return cluster.admin_url + "/admin/v2/persistent/" + NS



def produce(client, topic: str, payloads: list[bytes]) -> list:
    producer = client.create_producer(f"persistent://{NS}/{topic}", batching_enabled=False)
    try:
        return [producer.send(p) for p in payloads]
    finally:
        producer.close()


def backlog(admin: str, topic: str, sub: str) -> int:
    r = requests.get(f"{admin}/{topic}/stats", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["subscriptions"][sub]["msgBacklog"]


def receive_all(consumer, n: int) -> list[bytes]:
    got = []
    for _ in range(n):
        m = consumer.receive(timeout_millis=TIMEOUT_MS)
        consumer.acknowledge(m)
        got.append(m.data())
    return got


def assert_nothing_more(consumer) -> None:
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=500)


def run_admin(cluster, tmp_path, *args: str) -> subprocess.CompletedProcess:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSARLITE_")}
    env["HOME"] = str(home)
    argv = [sys.executable, "-m", "pulsarlite", "admin", "--admin-url", cluster.admin_url, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env)


# -- expire-messages ----------------------------------------------------------------------------
def test_expire_messages_marks_deleted_what_is_older_than_the_ttl(client, admin):
    """Pulsar's expireMessages/{seconds}: the subscription's cursor is mark-deleted through the
    newest entry published more than ``seconds`` ago (PersistentMessageExpiryMonitor: expired
    when now > publish time + ttl); newer messages stay in the backlog; 404 for a subscription
    that does not exist."""
    topic = "expire-one"
    consumer = client.subscribe(f"persistent://{NS}/{topic}", "s", consumer_type=pulsar.ConsumerType.Shared)
    consumer.close()
    produce(client, topic, [b"old-0", b"old-1", b"old-2"])
    time.sleep(3)                          # the old ones are > 2 s old from here on
    new_from_ms = int(time.time() * 1000)
    produce(client, topic, [b"new-0", b"new-1"])
    assert backlog(admin, topic, "s") == 5

    r = requests.post(f"{admin}/{topic}/subscription/s/expireMessages/3600", timeout=30)
    assert r.status_code == 204, r.text
    assert backlog(admin, topic, "s") == 5           # nothing is an hour old

    r = requests.post(f"{admin}/{topic}/subscription/s/expireMessages/2", timeout=30)
    after_ms = int(time.time() * 1000)
    assert r.status_code == 204, r.text
    consumer = client.subscribe(f"persistent://{NS}/{topic}", "s", consumer_type=pulsar.ConsumerType.Shared)
    left = []
    while True:
        try:
            m = consumer.receive(timeout_millis=1000)
        except pulsar.Timeout:
            break
        consumer.acknowledge(m)
        left.append(m.data())
    consumer.close()
    # the old messages were published > 2 s before the request: expired, whatever the timing
    assert not any(d.startswith(b"old") for d in left), left
    if after_ms - 2000 < new_from_ms:      # the request ended < 2 s after the new ones: both kept
        assert left == [b"new-0", b"new-1"]
    else:                                  # a slow machine: some may have expired, in order
        assert left in ([b"new-0", b"new-1"], [b"new-1"], [])
    r = requests.post(f"{admin}/{topic}/subscription/nope/expireMessages/0", timeout=30)
    assert r.status_code == 404, r.text


def test_expire_messages_keeps_individual_acks_after_the_expired_range(client, admin):
    """Expiry is a mark-delete (Pulsar's cursor.asyncMarkDelete), not a reset: messages acked
    one by one after the expired range stay acked; with ttl 0 everything published before the
    request is expired, on every subscription (``all_subscription/expireMessages/0``)."""
    topic = "expire-all"
    full = f"persistent://{NS}/{topic}"
    a = client.subscribe(full, "a", consumer_type=pulsar.ConsumerType.Shared)
    b = client.subscribe(full, "b", consumer_type=pulsar.ConsumerType.Shared)
    produce(client, topic, [b"m%d" % i for i in range(6)])
    got = [a.receive(timeout_millis=TIMEOUT_MS) for _ in range(6)]
    a.acknowledge(got[4])                 # an individual ack past what will stay
    a.close()
    b.close()
    r = requests.post(f"{admin}/{topic}/subscription/a/expireMessages/3600", timeout=30)
    assert r.status_code == 204, r.text
    a = client.subscribe(full, "a", consumer_type=pulsar.ConsumerType.Shared)
    assert sorted(receive_all(a, 5)) == [b"m0", b"m1", b"m2", b"m3", b"m5"]   # m4 stayed acked
    a.close()

    produce(client, topic, [b"late"])
    r = requests.post(f"{admin}/{topic}/all_subscription/expireMessages/0", timeout=30)
    assert r.status_code == 204, r.text
    assert backlog(admin, topic, "a") == 0
    assert backlog(admin, topic, "b") == 0
    b = client.subscribe(full, "b", consumer_type=pulsar.ConsumerType.Shared)
    assert_nothing_more(b)
    produce(client, topic, [b"after"])
    assert receive_all(b, 1) == [b"after"]
    b.close()


def test_expire_messages_on_a_partitioned_topic_expires_every_partition(client, admin):
    """On a partitioned topic's parent Pulsar expires each partition (its admin calls every
    partition's owner), per subscription and for all of them."""
    topic = "expire-parted"
    assert requests.put(f"{admin}/{topic}/partitions", json=2, timeout=30).status_code == 204
    full = f"persistent://{NS}/{topic}"
    for sub in ("a", "b"):
        client.subscribe(full, sub).close()
    producer = client.create_producer(full, batching_enabled=False)
    for i in range(6):
        producer.send(b"m%d" % i, partition_key=f"k{i}")
    producer.close()

    def backlogs(sub: str) -> list[int]:
        stats = requests.get(f"{admin}/{topic}/partitioned-stats", params={"perPartition": "true"}, timeout=30).json()
        return [p["subscriptions"][sub]["msgBacklog"] for _, p in sorted(stats["partitions"].items())]

    assert sum(backlogs("a")) == sum(backlogs("b")) == 6
    assert all(n > 0 for n in backlogs("a")), "the keys should spread over both partitions"
    r = requests.post(f"{admin}/{topic}/subscription/a/expireMessages/0", timeout=30)
    assert r.status_code == 204, r.text
    assert backlogs("a") == [0, 0] and sum(backlogs("b")) == 6
    r = requests.post(f"{admin}/{topic}/all_subscription/expireMessages/0", timeout=30)
    assert r.status_code == 204, r.text
    assert backlogs("b") == [0, 0]


# -- reset-cursor to a message id -----------------------------------------------------------------
def test_reset_cursor_to_a_message_id(client, admin, cluster):
    """Pulsar's resetCursorOnPosition (``POST .../subscription/{sub}/resetcursor`` with a
    ResetCursorData body ``{"ledgerId", "entryId", "partitionIndex", "isExcluded",
    "batchIndex"}``): the subscription delivers from that message next (after it with
    ``isExcluded``), its connected consumers are disconnected and resume from there; 404 for
    an unknown subscription, 405 on a partitioned topic's parent."""
    topic = "reset-by-id"
    full = f"persistent://{NS}/{topic}"
    consumer = client.subscribe(full, "s")
    ids = produce(client, topic, [b"r%d" % i for i in range(5)])
    assert receive_all(consumer, 5) == [b"r%d" % i for i in range(5)]
    body = {"ledgerId": ids[2].ledger_id(), "entryId": ids[2].entry_id(), "partitionIndex": -1,
            "isExcluded": False, "batchIndex": -1}
    r = requests.post(f"{admin}/{topic}/subscription/s/resetcursor", json=body, timeout=30)
    assert r.status_code == 204, r.text
    assert receive_all(consumer, 3) == [b"r2", b"r3", b"r4"]      # the connected consumer resumes
    assert_nothing_more(consumer)
    consumer.close()

    r = requests.post(f"{admin}/{topic}/subscription/s/resetcursor", json=dict(body, isExcluded=True), timeout=30)
    assert r.status_code == 204, r.text
    consumer = client.subscribe(full, "s")
    assert receive_all(consumer, 2) == [b"r3", b"r4"]
    consumer.close()

    r = requests.post(f"{admin}/{topic}/subscription/nope/resetcursor", json=body, timeout=30)
    assert r.status_code == 404, r.text
    r = requests.post(f"{admin}/{topic}/subscription/s/resetcursor", json=dict(body, entryId=10 ** 6), timeout=30)
    assert r.status_code == 412, r.text          # not a message of the topic: nothing moved
    r = requests.post(f"{admin}/{topic}/subscription/s/resetcursor", json={"entryId": 1}, timeout=30)
    assert r.status_code in (400, 412), r.text
    assert requests.put(f"{admin}/reset-parted/partitions", json=2, timeout=30).status_code == 204
    r = requests.post(f"{admin}/reset-parted/subscription/s/resetcursor", json=body, timeout=30)
    assert r.status_code == 405, r.text


# -- peek-messages and examine-message ------------------------------------------------------------
def test_peek_nth_message_of_a_subscription(client, admin):
    """Pulsar's peekNthMessage (``GET .../subscription/{sub}/position/{n}``): the n-th entry
    after the subscription's mark-delete position, individually acknowledged entries skipped
    (IndividualDeletedEntries.Exclude), answered as getMessageById answers an entry (payload,
    ``X-Pulsar-Message-ID``, metadata headers); 404 "Message not found" past the backlog; 404
    for an unknown subscription; the cursor does not move."""
    topic = "peek"
    full = f"persistent://{NS}/{topic}"
    consumer = client.subscribe(full, "s", consumer_type=pulsar.ConsumerType.Shared)
    ids = produce(client, topic, [b"p0", b"p1", b"p2"])
    got = [consumer.receive(timeout_millis=TIMEOUT_MS) for _ in range(3)]
    consumer.acknowledge(got[1])          # p1 acked alone
    consumer.close()

    r = requests.get(f"{admin}/{topic}/subscription/s/position/1", timeout=30)
    assert r.status_code == 200, r.text
    assert r.content == b"p0"
    assert r.headers["X-Pulsar-Message-ID"] == f"{ids[0].ledger_id()}:{ids[0].entry_id()}"
    assert "X-Pulsar-publish-time" in r.headers
    r = requests.get(f"{admin}/{topic}/subscription/s/position/2", timeout=30)
    assert r.status_code == 200 and r.content == b"p2", r.text
    r = requests.get(f"{admin}/{topic}/subscription/s/position/3", timeout=30)
    assert r.status_code == 404, r.text
    r = requests.get(f"{admin}/{topic}/subscription/nope/position/1", timeout=30)
    assert r.status_code == 404, r.text
    assert backlog(admin, topic, "s") == 2          # peeking moved nothing


def test_examine_message_counts_entries_from_either_end(client, admin):
    """Pulsar's examineMessage (``GET .../examinemessage?initialPosition=&messagePosition=``):
    the n-th entry of the topic from the earliest or (the default) the latest end, whatever the
    subscriptions; a position below 1 is taken as 1; 405 on a partitioned topic's parent."""
    topic = "examine"
    produce(client, topic, [b"e0", b"e1", b"e2", b"e3"])
    cases = [({"initialPosition": "earliest", "messagePosition": "1"}, b"e0"),
             ({"initialPosition": "earliest", "messagePosition": "3"}, b"e2"),
             ({"initialPosition": "latest", "messagePosition": "1"}, b"e3"),
             ({"initialPosition": "latest", "messagePosition": "2"}, b"e2"),
             ({}, b"e3"),
             ({"initialPosition": "earliest", "messagePosition": "0"}, b"e0")]
    for query, expected in cases:
        r = requests.get(f"{admin}/{topic}/examinemessage", params=query, timeout=30)
        assert r.status_code == 200, (query, r.text)
        assert r.content == expected, query
    r = requests.get(f"{admin}/{topic}/examinemessage", params={"initialPosition": "middle"}, timeout=30)
    assert r.status_code in (400, 412), r.text
    assert requests.put(f"{admin}/examine-parted/partitions", json=2, timeout=30).status_code == 204
    r = requests.get(f"{admin}/examine-parted/examinemessage", timeout=30)
    assert r.status_code == 405, r.text


# -- the CLI twins --------------------------------------------------------------------------------
def test_cli_twins(client, admin, cluster, tmp_path):
    """``pulsarlite admin topics expire-messages | expire-messages-all-subscriptions |
    reset-cursor -m | peek-messages | examine-message``, shaped like pulsar-admin's."""
    topic = "cli-twins"
    full = f"persistent://{NS}/{topic}"
    client.subscribe(full, "s").close()
    ids = produce(client, topic, [b"c0", b"c1", b"c2"])

    proc = run_admin(cluster, tmp_path, "topics", "peek-messages", full, "-s", "s", "-n", "2")
    assert proc.returncode == 0, proc.stderr
    assert "c0" in proc.stdout and "c1" in proc.stdout and "c2" not in proc.stdout
    assert f"{ids[0].ledger_id()}:{ids[0].entry_id()}" in proc.stdout

    proc = run_admin(cluster, tmp_path, "topics", "examine-message", full, "-i", "earliest", "-m", "2")
    assert proc.returncode == 0, proc.stderr
    assert "c1" in proc.stdout and "c0" not in proc.stdout

    proc = run_admin(cluster, tmp_path, "topics", "expire-messages", full, "-s", "s", "-t", "0")
    assert proc.returncode == 0, proc.stderr
    assert backlog(admin, topic, "s") == 0

    proc = run_admin(cluster, tmp_path, "topics", "reset-cursor", full, "-s", "s",
                     "-m", f"{ids[1].ledger_id()}:{ids[1].entry_id()}")
    assert proc.returncode == 0, proc.stderr
    assert backlog(admin, topic, "s") == 2

    proc = run_admin(cluster, tmp_path, "topics", "expire-messages-all-subscriptions", full, "-t", "0")
    assert proc.returncode == 0, proc.stderr
    assert backlog(admin, topic, "s") == 0

    proc = run_admin(cluster, tmp_path, "topics", "peek-messages", full, "-s", "nope")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
