"""`pulsarlite admin ...` in a subprocess against a real cluster (ZooKeeper, 3 bookies, one
broker): what it prints, what it changes on the broker, and its exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

CLI_TIMEOUT_S = 120


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory(3, brokers=1)


@pytest.fixture
def home(tmp_path):
    """A HOME without a client.conf, so a developer's own file cannot change the results."""
    d = tmp_path / "home"
    d.mkdir()
    return d


def run_admin(*args: str, home, url: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PULSARLITE_")}
    full_env.update({"HOME": str(home), **(env or {})})
    argv = [sys.executable, "-m", "pulsarlite", "admin"]
    if url is not None:
        argv += ["--admin-url", url]
    return subprocess.run(argv + list(args), capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=full_env)


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}"
    return proc.stdout


def fails(proc: subprocess.CompletedProcess, code: int = 1) -> str:
    assert proc.returncode == code, f"expected exit {code}, got {proc.returncode}: {proc.stdout} {proc.stderr}"
    err = proc.stderr.strip()
    assert err and "Traceback" not in err
    if code == 1:  # operating errors are one line; usage errors (2) may come with argparse's usage
        assert len(err.splitlines()) == 1, f"not a one-line error: {err!r}"
    return err


def test_tenants_namespaces_and_retention(cluster, home, tmp_path):
    url = cluster.admin_url

    def admin(*args: str) -> subprocess.CompletedProcess:
        return run_admin(*args, home=home, url=url)

    clusters = ok(admin("clusters", "list")).split()
    assert clusters, "the broker registers its cluster"
    assert "public" in ok(admin("tenants", "list")).split()

    ok(admin("tenants", "create", "acme"))
    assert "acme" in ok(admin("tenants", "list")).split()
    info = json.loads(ok(admin("tenants", "get", "acme")))
    assert info["allowedClusters"] == clusters  # none given: all clusters, as pulsar-admin
    assert "409" in fails(admin("tenants", "create", "acme"))

    ok(admin("namespaces", "create", "acme/ns1"))
    ok(admin("namespaces", "create", "acme/ns2"))
    assert ok(admin("namespaces", "list", "acme")).split() == ["acme/ns1", "acme/ns2"]
    assert json.loads(ok(admin("--output", "json", "namespaces", "list", "acme"))) == ["acme/ns1", "acme/ns2"]
    table = ok(admin("namespaces", "list", "acme", "-o", "table")).splitlines()
    assert table[0].strip() == "NAME" and [t.strip() for t in table[1:]] == ["acme/ns1", "acme/ns2"]

    # retention: pulsar-admin's units, stored in minutes and MB
    assert ok(admin("namespaces", "get-retention", "acme/ns1")).strip() == "null"
    ok(admin("namespaces", "set-retention", "acme/ns1", "--size", "10M", "--time", "3h"))
    assert json.loads(ok(admin("namespaces", "get-retention", "acme/ns1"))) == {
        "retentionTimeInMinutes": 180, "retentionSizeInMB": 10}
    policies = json.loads(ok(admin("namespaces", "policies", "acme/ns1")))
    assert policies["retention_policies"] == {"retentionTimeInMinutes": 180, "retentionSizeInMB": 10}
    rows = dict(line.split(None, 1) for line in ok(admin("namespaces", "policies", "acme/ns1", "-o", "table"))
                .splitlines()[1:] if len(line.split(None, 1)) == 2)
    assert rows["retention_policies.retentionTimeInMinutes"].strip() == "180"
    ok(admin("namespaces", "set-retention", "acme/ns1", "--size", "-1", "--time", "-1"))
    assert json.loads(ok(admin("namespaces", "get-retention", "acme/ns1"))) == {
        "retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
    # the broker refuses half a policy (412): its reason, exit 1, nothing changed
    err = fails(admin("namespaces", "set-retention", "acme/ns1", "--size", "10M", "--time", "0"))
    assert "both zero or both non-zero" in err and "412" in err
    assert json.loads(ok(admin("namespaces", "get-retention", "acme/ns1")))["retentionSizeInMB"] == -1
    ok(admin("namespaces", "remove-retention", "acme/ns1"))
    assert ok(admin("namespaces", "get-retention", "acme/ns1")).strip() == "null"

    # message TTL and deduplication
    ok(admin("namespaces", "set-message-ttl", "acme/ns1", "-ttl", "2h"))
    assert ok(admin("namespaces", "get-message-ttl", "acme/ns1")).strip() == "7200"
    ok(admin("namespaces", "set-deduplication", "acme/ns1", "--enable"))
    assert ok(admin("namespaces", "get-deduplication", "acme/ns1")).strip() == "true"
    fails(admin("namespaces", "set-deduplication", "acme/ns1"), code=2)

    # error paths: the broker's message, exit 1
    err = fails(admin("namespaces", "create", "nope/ns"))
    assert "Tenant nope does not exist" in err and "404" in err
    err = fails(admin("tenants", "delete", "acme"))
    assert "409" in err and "namespaces" in err
    assert "404" in fails(admin("namespaces", "get-retention", "acme/missing"))
    # bad arguments: exit 2 before any request
    fails(admin("namespaces", "set-retention", "acme/ns1", "--size", "ten", "--time", "1h"), code=2)
    fails(admin("namespaces", "create", "acme"), code=2)

    ok(admin("namespaces", "delete", "acme/ns1"))
    ok(admin("namespaces", "delete", "acme/ns2"))
    assert ok(admin("namespaces", "list", "acme")).strip() == ""
    ok(admin("tenants", "delete", "acme"))
    assert "acme" not in ok(admin("tenants", "list")).split()
    assert "404" in fails(admin("tenants", "get", "acme"))

    # connection defaults from a client.conf (named by the env variable), no --admin-url flag
    conf = tmp_path / "client.conf"
    conf.write_text(f"# test\nwebServiceUrl={url}\nbrokerServiceUrl={cluster.service_url}\n")
    proc = run_admin("tenants", "list", home=home, env={"PULSARLITE_CLIENT_CONF": str(conf)})
    assert "public" in ok(proc).split()
    proc = run_admin("tenants", "list", "--client-conf", str(conf), home=home)
    assert "public" in ok(proc).split()
    # ... and a flag beats the file
    proc = run_admin("tenants", "list", "--client-conf", str(conf), "--admin-url", "http://127.0.0.1:1", home=home)
    assert "cannot reach" in fails(proc)
    conf.write_text("webServiceUrl pulsar\n")
    assert "expected key=value" in fails(run_admin("tenants", "list", "--client-conf", str(conf), home=home), code=2)


def test_topics_and_subscriptions(cluster, home):
    pulsar = pytest.importorskip("pulsar")
    url = cluster.admin_url

    def admin(*args: str) -> subprocess.CompletedProcess:
        return run_admin(*args, home=home, url=url)

    ok(admin("tenants", "create", "acme"))
    ok(admin("namespaces", "create", "acme/ns"))
    topic = "persistent://acme/ns/orders"
    ok(admin("topics", "create", topic))
    assert "409" in fails(admin("topics", "create", topic))
    assert ok(admin("topics", "list", "acme/ns")).split() == [topic]

    # short names resolve like pulsar-admin's: "acme/ns/orders" is the same topic
    stats = json.loads(ok(admin("topics", "stats", "acme/ns/orders")))
    assert stats["msgInCounter"] == 0 and stats["subscriptions"] == {}

    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(20):
            producer.send(f"m-{i}".encode())
        producer.close()
    finally:
        client.close()

    stats = json.loads(ok(admin("topics", "stats", topic)))
    assert stats["msgInCounter"] == 20
    table = {line.split(None, 1)[0]: line.split(None, 1)[1].strip()
             for line in ok(admin("topics", "stats", topic, "-o", "table")).splitlines()[1:]}
    assert table["msgInCounter"] == "20"
    internal = json.loads(ok(admin("topics", "stats-internal", topic)))
    assert internal["entriesAddedCounter"] == 20 and internal["numberOfEntries"] == 20
    last = json.loads(ok(admin("topics", "last-message-id", topic)))
    assert last["entryId"] == 19
    assert json.loads(ok(admin("topics", "lookup", topic)))["brokerUrl"] == cluster.service_url

    # subscriptions: both command families
    ok(admin("subscriptions", "create", topic, "-s", "from-start", "-m", "earliest"))
    ok(admin("topics", "create-subscription", topic, "-s", "from-end"))
    assert sorted(ok(admin("subscriptions", "list", topic)).split()) == ["from-end", "from-start"]
    stats = json.loads(ok(admin("topics", "stats", topic)))
    assert stats["subscriptions"]["from-start"]["msgBacklog"] == 20
    assert stats["subscriptions"]["from-end"]["msgBacklog"] == 0
    assert "409" in fails(admin("subscriptions", "create", topic, "-s", "from-start"))
    ok(admin("topics", "reset-cursor", topic, "-s", "from-end", "--timestamp-ms", "0"))
    stats = json.loads(ok(admin("topics", "stats", topic)))
    assert stats["subscriptions"]["from-end"]["msgBacklog"] == 20
    ok(admin("topics", "unsubscribe", topic, "-s", "from-end"))
    assert ok(admin("subscriptions", "list", topic)).split() == ["from-start"]

    # unload: the next request loads it again, data intact
    ok(admin("topics", "unload", topic))
    assert json.loads(ok(admin("topics", "stats-internal", topic)))["numberOfEntries"] == 20

    # offload without a tier: the broker's 412, exit 1
    assert "has not been run" in ok(admin("topics", "offload-status", topic))
    err = fails(admin("topics", "offload", "-s", "0", topic))
    assert "412" in err and "tier" in err

    # errors: the broker's reason, exit 1; bad names exit 2
    err = fails(admin("topics", "stats", "persistent://acme/ns/missing"))
    assert "404" in err
    assert "404" in fails(admin("topics", "create", "persistent://acme/nons/t"))
    fails(admin("topics", "stats", "acme/orders"), code=2)
    fails(admin("topics", "stats", "non-persistent://acme/ns/x"), code=2)

    # skip N, then everything (pulsar-admin's skip / clear-backlog)
    ok(admin("subscriptions", "skip", topic, "-s", "from-start", "-n", "3"))
    stats = json.loads(ok(admin("topics", "stats", topic)))
    assert stats["subscriptions"]["from-start"]["msgBacklog"] == 17
    assert "404" in fails(admin("subscriptions", "skip", topic, "-s", "nope", "-n", "1"))
    ok(admin("topics", "clear-backlog", topic, "-s", "from-start"))
    stats = json.loads(ok(admin("topics", "stats", topic)))
    assert stats["subscriptions"]["from-start"]["msgBacklog"] == 0

    ok(admin("subscriptions", "delete", topic, "-s", "from-start"))
    ok(admin("topics", "delete", topic))
    assert ok(admin("topics", "list", "acme/ns")).strip() == ""


def test_partitioned_topics_and_namespace_policies(cluster, home):
    pulsar = pytest.importorskip("pulsar")
    url = cluster.admin_url

    def admin(*args: str) -> subprocess.CompletedProcess:
        return run_admin(*args, home=home, url=url)

    ok(admin("tenants", "create", "acme"))
    ok(admin("namespaces", "create", "acme/ns"))
    topic = "persistent://acme/ns/parts"
    ok(admin("topics", "create-partitioned-topic", topic, "-p", "3"))
    assert json.loads(ok(admin("topics", "get-partitioned-topic-metadata", topic)))["partitions"] == 3
    assert ok(admin("topics", "list-partitioned-topics", "acme/ns")).split() == [topic]
    ok(admin("topics", "update-partitioned-topic", topic, "-p", "4"))
    assert json.loads(ok(admin("topics", "get-partitioned-topic-metadata", topic)))["partitions"] == 4
    assert "412" in fails(admin("topics", "update-partitioned-topic", topic, "-p", "2"))  # cannot shrink
    assert "409" in fails(admin("topics", "create-partitioned-topic", topic, "-p", "2"))

    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, batching_enabled=False,
                                          message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution)
        for i in range(12):
            producer.send(f"m-{i}".encode())
        producer.close()
    finally:
        client.close()
    stats = json.loads(ok(admin("topics", "partitioned-stats", topic)))
    assert stats["msgInCounter"] == 12 and stats["metadata"]["partitions"] == 4
    assert not stats.get("partitions")
    per = json.loads(ok(admin("topics", "partitioned-stats", topic, "--per-partition")))
    assert sorted(per["partitions"]) == [f"{topic}-partition-{i}" for i in range(4)]
    assert sum(p["msgInCounter"] for p in per["partitions"].values()) == 12
    # one partition is a topic of its own
    one = json.loads(ok(admin("topics", "stats", f"{topic}-partition-0")))
    assert one["msgInCounter"] == per["partitions"][f"{topic}-partition-0"]["msgInCounter"]
    assert "404" in fails(admin("topics", "partitioned-stats", "persistent://acme/ns/not-partitioned"))
    ok(admin("topics", "delete-partitioned-topic", topic))
    assert ok(admin("topics", "list-partitioned-topics", "acme/ns")).strip() == ""

    # namespace policies with pulsar-admin's units
    ok(admin("namespaces", "set-message-ttl", "acme/ns", "-ttl", "90"))
    assert json.loads(ok(admin("namespaces", "get-message-ttl", "acme/ns"))) == 90
    ok(admin("namespaces", "remove-message-ttl", "acme/ns"))
    assert ok(admin("namespaces", "get-message-ttl", "acme/ns")).strip() == "null"
    ok(admin("namespaces", "set-backlog-quota", "acme/ns", "-l", "10M", "-p", "producer_exception"))
    ok(admin("namespaces", "set-backlog-quota", "acme/ns", "-lt", "1h", "-p", "consumer_backlog_eviction",
             "-t", "message_age"))
    quotas = json.loads(ok(admin("namespaces", "get-backlog-quotas", "acme/ns")))
    assert quotas["destination_storage"] == {"limitSize": 10 * 1024 * 1024, "limitTime": -1,
                                             "policy": "producer_exception"}
    assert quotas["message_age"]["limitTime"] == 3600
    ok(admin("namespaces", "remove-backlog-quota", "acme/ns", "-t", "message_age"))
    assert list(json.loads(ok(admin("namespaces", "get-backlog-quotas", "acme/ns")))) == ["destination_storage"]
    fails(admin("namespaces", "set-backlog-quota", "acme/ns", "-l", "1M", "-p", "drop_everything"), code=2)
    ok(admin("namespaces", "set-offload-threshold", "acme/ns", "--size", "1G"))
    assert json.loads(ok(admin("namespaces", "get-offload-threshold", "acme/ns"))) == 1024 ** 3
    ok(admin("namespaces", "set-offload-deletion-lag", "acme/ns", "--lag", "2h"))
    assert json.loads(ok(admin("namespaces", "get-offload-deletion-lag", "acme/ns"))) == 2 * 3600 * 1000
    ok(admin("namespaces", "clear-offload-deletion-lag", "acme/ns"))
    assert ok(admin("namespaces", "get-offload-deletion-lag", "acme/ns")).strip() == "null"
    ok(admin("namespaces", "set-offload-threshold", "acme/ns", "--size", "-1"))
    assert json.loads(ok(admin("namespaces", "get-offload-threshold", "acme/ns"))) == -1


def test_follows_redirects_to_the_owning_broker(cluster_factory, home):
    """A topic call at a broker that does not own the topic is answered 307 (as Pulsar); the
    CLI follows it with the same method and body."""
    import http.client
    import urllib.parse

    pulsar = pytest.importorskip("pulsar")
    cluster = cluster_factory(3, brokers=2)
    urls = [f"http://127.0.0.1:{cluster.records[n].ports['http']}" for n in cluster.broker_names]
    topic = "persistent://public/default/redirected"
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(5):
            producer.send(f"m-{i}".encode())
        producer.close()
    finally:
        client.close()
    owner = json.loads(ok(run_admin("topics", "lookup", topic, home=home, url=urls[0])))["httpUrl"].rstrip("/")
    assert owner in urls
    other = next(u for u in urls if u != owner)

    # the broker really redirects (so the CLI's success below went through a 307)
    parsed = urllib.parse.urlsplit(other)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    try:
        conn.request("GET", "/admin/v2/persistent/public/default/redirected/stats")
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 307 and resp.getheader("Location", "").startswith(owner)
    finally:
        conn.close()

    assert json.loads(ok(run_admin("topics", "stats", topic, home=home, url=other)))["msgInCounter"] == 5
    # a PUT with a body through the redirect: the subscription starts at the earliest message
    ok(run_admin("subscriptions", "create", topic, "-s", "s1", "-m", "earliest", home=home, url=other))
    stats = json.loads(ok(run_admin("topics", "stats", topic, home=home, url=owner)))
    assert stats["subscriptions"]["s1"]["msgBacklog"] == 5


def test_offload_by_size_and_offload_status(cluster_factory, home, tmp_path):
    """pulsar-admin's `topics offload --size-threshold`: keep at most SIZE bytes on the bookies
    (whole ledgers, newest first), offload the rest to the tier; `offload-status -w` waits."""
    pulsar = pytest.importorskip("pulsar")
    tier = tmp_path / "tier"
    tier.mkdir()
    cluster = cluster_factory(3, brokers=1, broker_overrides={
        "tier_uri": f"file://{tier}", "rollover_entries_max": 10, "offload_deletion_lag_ms": 0,
        "offload_check_interval_ms": 500})
    url = cluster.admin_url
    topic = "persistent://public/default/cold"

    def admin(*args: str) -> subprocess.CompletedProcess:
        return run_admin(*args, home=home, url=url)

    # keep consumed ledgers (no subscription here): infinite retention
    ok(admin("namespaces", "set-retention", "public/default", "--size", "-1", "--time", "-1"))
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(45):
            producer.send(b"x" * 200 + str(i).encode())
        producer.close()
    finally:
        client.close()
    assert "has not been run" in ok(admin("topics", "offload-status", topic))

    ledgers = json.loads(ok(admin("topics", "stats-internal", topic)))["ledgers"]
    assert len(ledgers) >= 4, ledgers
    keep = ledgers[-2:]                                   # the open ledger and the newest closed one
    threshold = sum(i["size"] for i in keep)              # exactly what they hold: nothing more fits
    out = ok(admin("topics", "offload", "--size-threshold", str(threshold), topic))
    assert f"before {keep[0]['ledgerId']}:0:-1" in out

    out = ok(admin("topics", "offload-status", "-w", topic))
    assert "Offload was a success" in out
    assert json.loads(ok(admin("topics", "offload-status", topic, "-o", "json")))["status"] == "SUCCESS"
    after = {i["ledgerId"]: i for i in json.loads(ok(admin("topics", "stats-internal", topic)))["ledgers"]}
    for ledger in ledgers[:-2]:
        assert after[ledger["ledgerId"]]["offloadState"] in ("offloaded", "bookie-deleted"), after
    for ledger in keep:
        assert after[ledger["ledgerId"]]["offloadState"] == "none", after
    assert {f"file://{p}" for p in tier.rglob("*") if p.is_file()} == {
        after[i["ledgerId"]]["offloadUri"] for i in ledgers[:-2]}

    # everything fits under a big threshold: nothing to do (pulsar-admin's message)
    assert "Nothing to offload" in ok(admin("topics", "offload", "-s", "1G", topic))
    fails(admin("topics", "offload", "-s", "lots", topic), code=2)
    assert "404" in fails(admin("topics", "offload", "-s", "0", "persistent://public/default/missing"))
