"""`pulsarlite produce|consume|perf` in subprocesses against a real cluster; the official client
checks what the CLI produced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from faces.cluster import LocalCluster

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(module_tmp_path):
    cl = LocalCluster(module_tmp_path / "cli-cluster")
    try:
        cl.start_processes(bookies=3, brokers=1)
        yield cl
    finally:
        cl.stop()


def run(cluster, *argv, timeout_s: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PULSARLITE_CLIENT_CONF="", PYTHONUNBUFFERED="1")
    env.pop("PULSARLITE_CLIENT_CONF")
    return subprocess.run([sys.executable, "-m", "pulsarlite", *argv,
                           "--service-url", cluster.service_url],
                          capture_output=True, text=True, timeout=timeout_s, env=env)


def topic() -> str:
    return f"persistent://public/default/cli-{uuid.uuid4().hex[:8]}"


def test_produce_then_consume(cluster):
    t = topic()
    out = run(cluster, "produce", t, "-m", "hello", "-m", "world", "-n", "3", "-k", "k1",
              "-p", "a=1", "-z", "zstd")
    assert out.returncode == 0, out.stderr
    assert "6 messages successfully produced" in out.stdout

    # the official client reads what the CLI produced
    client = pulsar.Client(cluster.service_url)
    try:
        reader = client.create_reader(t, pulsar.MessageId.earliest)
        got = [reader.read_next(15_000) for _ in range(6)]
        assert [m.data() for m in got] == [b"hello", b"world"] * 3
        assert {m.partition_key() for m in got} == {"k1"}
        assert all(m.properties() == {"a": "1"} for m in got)
    finally:
        client.close()

    out = run(cluster, "consume", t, "-s", "sub", "-n", "6", "-p", "earliest", "--json",
              "--timeout", "30")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [m["content"] for m in lines] == ["hello", "world"] * 3
    assert all(m["key"] == "k1" and m["properties"] == {"a": "1"} for m in lines)
    assert "6 messages successfully consumed" in out.stderr

    # acknowledged: the subscription has nothing left
    out = run(cluster, "consume", t, "-s", "sub", "-n", "1", "--timeout", "2")
    assert out.returncode == 1
    assert "no message within" in out.stderr


def test_consume_types_and_default_output(cluster):
    t = topic()
    assert run(cluster, "produce", t, "-m", "x", "-n", "2").returncode == 0
    out = run(cluster, "consume", t, "-s", "shared-sub", "-t", "shared", "-p", "earliest",
              "-n", "2", "--timeout", "30")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("----- got message -----") == 2
    assert "content:x" in out.stdout


def test_bad_arguments_exit_2(cluster):
    out = run(cluster, "perf", "produce", topic(), "--latency-every", "0", "-m", "1")
    assert out.returncode == 2 and "--latency-every" in out.stderr
    out = run(cluster, "consume", topic(), "-s", "s", "-t", "bogus")
    assert out.returncode == 2
    out = run(cluster, "produce", "persistent://bad tenant/x/y", "-m", "m")
    assert out.returncode == 1
    assert "invalid" in out.stderr


def test_perf_produce_and_consume(cluster):
    t = topic()
    out = run(cluster, "perf", "produce", t, "--rate", "300", "--size", "100", "--time", "3")
    assert out.returncode == 0, out.stderr
    live = [line for line in out.stdout.splitlines() if "msg/s" in line and "summary" not in line]
    assert len(live) >= 1
    assert "p99" in live[0] and "latency ms" in live[0]
    summary = [line for line in out.stdout.splitlines() if line.startswith("summary:")]
    assert len(summary) == 1 and "failed 0" in summary[0]
    assert "latency of 1 message in 16" in summary[0]
    produced = int(summary[0].split()[2])
    assert produced > 100
    # every message timed (a callback on each): the counts do not depend on it
    out = run(cluster, "perf", "produce", t, "--rate", "300", "--size", "100", "-m", "250",
              "--latency-every", "1")
    assert out.returncode == 0, out.stderr
    summary = [line for line in out.stdout.splitlines() if line.startswith("summary:")]
    assert len(summary) == 1 and "failed 0" in summary[0] and "latency of" not in summary[0]
    assert int(summary[0].split()[2]) == 250
    produced += 250

    out = run(cluster, "perf", "consume", t, "-p", "earliest", "-m", str(produced), "--time",
              "60")
    assert out.returncode == 0, out.stderr
    summary = [line for line in out.stdout.splitlines() if line.startswith("summary:")]
    assert len(summary) == 1
    assert int(summary[0].split()[2]) == produced
