"""The local cluster launcher, with real ZooKeeper and real bookie processes
(``python -m pulsarlite bookie``), through the Python API and the CLI."""

from __future__ import annotations

import asyncio
import os
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bookie.client.ledger_manager import LedgerManager
from faces.cluster import ClusterError, LocalCluster
from pulsarlite.config import BookieConfig, load_toml
from pulsarlite.errors import ConfigError
from pulsarlite.metadata import MetadataStore
from pulsarlite.zk_server import port_accepts, process_alive, zookeeper_healthy

pytestmark = pytest.mark.integration

# a short bookie session, so that a killed bookie's registration expires quickly and its
# restart (which waits for the stale node) does not take the default 10 s
FAST_SESSION = {"zk_session_timeout_ms": 2000}
CLI_TIMEOUT_S = 120


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "pulsarlite", "cluster", *args],
                            capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    if check and result.returncode != 0:
        raise AssertionError(f"pulsarlite cluster {' '.join(args)} -> {result.returncode}\n"
                             f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return result


def all_pids(status: dict) -> list[int]:
    return [p["pid"] for p in status["processes"] if p["pid"]]


async def test_cluster_lifecycle(cluster_factory):
    cluster = await asyncio.to_thread(cluster_factory, 3, bookie_overrides=FAST_SESSION)
    status = cluster.status()
    assert status["zookeeper"] == cluster.zookeeper
    names = [(p["name"], p["role"]) for p in status["processes"]]
    assert names == [("zookeeper", "zookeeper"), ("bookie-1", "bookie"), ("bookie-2", "bookie"),
                     ("bookie-3", "bookie")]
    assert all(p["healthy"] and p["alive"] and p["pid"] for p in status["processes"])
    zk = status["processes"][0]
    assert zk["ports"] == {"client": int(cluster.zookeeper.rsplit(":", 1)[1])}
    bookie_ports = [p["ports"]["bookie"] for p in status["processes"][1:]]
    assert len(set(bookie_ports)) == 3
    assert cluster.bookie_ids == [f"127.0.0.1:{port}" for port in bookie_ports]

    # each bookie has its own config, journal and ledger dirs
    configs = [load_toml(BookieConfig, cluster.bookie_config_path(n)) for n in cluster.bookie_names]
    assert [c.effective_bookie_id for c in configs] == cluster.bookie_ids
    assert len({c.journal_dir for c in configs} | {c.ledger_dir for c in configs}) == 6
    assert all(c.zookeeper == cluster.zookeeper and c.zk_session_timeout_ms == 2000 for c in configs)

    store = await MetadataStore.connect(cluster.zookeeper)
    try:
        manager = LedgerManager(store)
        assert await manager.writable_bookies() == sorted(cluster.bookie_ids)

        # kill -9 one bookie: it is reported dead, the others stay healthy
        old_pid = cluster.records["bookie-2"].pid
        await asyncio.to_thread(cluster.kill, "bookie-2")
        assert not process_alive(old_pid)
        by_name = {p["name"]: p for p in cluster.status()["processes"]}
        assert by_name["bookie-2"] == {**by_name["bookie-2"], "pid": None, "alive": False, "healthy": False}
        assert by_name["bookie-1"]["healthy"] and by_name["bookie-3"]["healthy"]

        # restart: same config and port, new process, registered again by a new session
        await asyncio.to_thread(cluster.restart, "bookie-2")
        by_name = {p["name"]: p for p in cluster.status()["processes"]}
        assert by_name["bookie-2"]["healthy"] and by_name["bookie-2"]["pid"] != old_pid
        assert by_name["bookie-2"]["ports"]["bookie"] == bookie_ports[1]
        assert set(by_name["bookie-2"]["ports"]) == {"bookie", "metrics"}       # [autorecovery] metrics
        assert await manager.writable_bookies() == sorted(cluster.bookie_ids)

        # lost for good and replaced: a new identity on empty disks, under the same name
        old_id = cluster.records["bookie-3"].bookie_id
        old_config = load_toml(BookieConfig, cluster.bookie_config_path("bookie-3"))
        marker = Path(old_config.ledger_dir) / "marker"
        marker.write_text("from the dead disk")
        metrics_port = cluster.records["bookie-3"].ports["metrics"]
        new_id = await asyncio.to_thread(cluster.replace_bookie, "bookie-3")
        assert cluster.records["bookie-3"].ports["metrics"] == metrics_port   # still served there
        assert new_id != old_id and cluster.records["bookie-3"].bookie_id == new_id
        assert not marker.exists()
        new_config = load_toml(BookieConfig, cluster.bookie_config_path("bookie-3"))
        assert new_config.effective_bookie_id == new_id and new_config.ledger_dir == old_config.ledger_dir
        by_name = {p["name"]: p for p in cluster.status()["processes"]}
        assert by_name["bookie-3"]["healthy"] and by_name["bookie-3"]["bookie_id"] == new_id
        # the dead identity's registration goes when its ZooKeeper session expires (2 s here)
        deadline = asyncio.get_running_loop().time() + 30
        while old_id in await manager.writable_bookies() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.2)
        assert await manager.writable_bookies() == sorted(cluster.bookie_ids)
    finally:
        await store.close()

    pids = all_pids(cluster.status())
    await asyncio.to_thread(cluster.stop)
    assert not any(process_alive(pid) for pid in pids)
    assert not port_accepts("127.0.0.1", int(cluster.zookeeper.rsplit(":", 1)[1]))
    assert all(p["pid"] is None and not p["healthy"] for p in cluster.status()["processes"])


def test_cli_start_status_restart_stop_resume(tmp_path):
    directory = tmp_path / "cluster"
    try:
        out = cli("start", "--dir", str(directory), "--bookies", "2").stdout
        assert "bookie-2" in out and "zookeeper" in out

        status = json.loads(cli("status", "--dir", str(directory), "--json").stdout)
        assert set(status) >= {"zookeeper", "processes"}
        for p in status["processes"]:
            assert set(p) >= {"name", "role", "pid", "healthy", "ports"}
            assert p["healthy"] and process_alive(p["pid"])  # outlived the CLI that started them
        ports = {p["name"]: p["ports"] for p in status["processes"]}
        assert set(ports["zookeeper"]) == {"client"} and set(ports["bookie-1"]) == {"bookie", "metrics"}
        assert "HEALTHY" in cli("status", "--dir", str(directory)).stdout

        # restart a running bookie (clean stop, so no stale registration to wait for)
        old_pid = {p["name"]: p["pid"] for p in status["processes"]}["bookie-1"]
        cli("restart", "--dir", str(directory), "bookie-1")
        status = json.loads(cli("status", "--dir", str(directory), "--json").stdout)
        assert all(p["healthy"] for p in status["processes"])
        assert {p["name"]: p["pid"] for p in status["processes"]}["bookie-1"] != old_pid

        # a crashed ZooKeeper comes back on the same port; bookies reconnect to it
        cli("kill", "--dir", str(directory), "zookeeper")
        assert not zookeeper_healthy("127.0.0.1", ports["zookeeper"]["client"])
        cli("restart", "--dir", str(directory), "zookeeper")
        assert zookeeper_healthy("127.0.0.1", ports["zookeeper"]["client"])

        pids = all_pids(json.loads(cli("status", "--dir", str(directory), "--json").stdout))
        cli("stop", "--dir", str(directory))
        assert not any(process_alive(pid) for pid in pids)
        status = json.loads(cli("status", "--dir", str(directory), "--json").stdout)
        assert not any(p["healthy"] or p["pid"] for p in status["processes"])

        # start again on the same directory: same ports and configs, data kept
        configs = {n: (directory / "conf" / f"{n}.toml").read_text() for n in ("bookie-1", "bookie-2")}
        cli("start", "--dir", str(directory), "--bookies", "2")
        status = json.loads(cli("status", "--dir", str(directory), "--json").stdout)
        assert {p["name"]: p["ports"] for p in status["processes"]} == ports
        assert all(p["healthy"] for p in status["processes"])
        assert configs == {n: (directory / "conf" / f"{n}.toml").read_text() for n in configs}
        cli("start", "--dir", str(directory), "--bookies", "2")  # all running: starts nothing
        assert json.loads(cli("status", "--dir", str(directory), "--json").stdout) == status

        # bad input changes nothing
        result = cli("start", "--dir", str(directory), "--bookies", "1", check=False)
        assert result.returncode == 2 and "already has 2 bookies" in result.stderr
        result = cli("start", "--dir", str(directory), "--bookies", "2", "--brokers", "-1", check=False)
        assert result.returncode == 2 and "brokers" in result.stderr
        result = cli("kill", "--dir", str(directory), "bookie-9", check=False)
        assert result.returncode == 1 and "no process named 'bookie-9'" in result.stderr
        assert json.loads(cli("status", "--dir", str(directory), "--json").stdout) == status

        pids = all_pids(status)
        cli("stop", "--dir", str(directory))
        assert not any(process_alive(pid) for pid in pids)
    finally:
        if (directory / "cluster.json").exists():
            LocalCluster.open(directory).stop()


def test_status_of_missing_cluster_fails_clearly(tmp_path):
    result = cli("status", "--dir", str(tmp_path / "nothing"), check=False)
    assert result.returncode == 1 and "no cluster state" in result.stderr


def test_failed_start_cleans_up(tmp_path):
    def crashing_bookie(config_path: Path) -> list[str]:
        return [sys.executable, "-c", "import sys; print('bookie boom', file=sys.stderr); sys.exit(3)",
                str(config_path)]

    with pytest.raises(ClusterError, match="(?s)bookie-1 exited during start.*bookie boom"):
        LocalCluster.start(tmp_path / "c", bookies=1, bookie_command=crashing_bookie)
    cluster = LocalCluster.open(tmp_path / "c")
    status = cluster.status()
    assert not any(p["pid"] or p["alive"] for p in status["processes"])


def test_negative_brokers_rejected_and_context_manager_cleans_up(tmp_path):
    with pytest.raises(ConfigError, match="brokers"):
        LocalCluster.start(tmp_path / "b", bookies=1, brokers=-1)
    assert not (tmp_path / "b" / "cluster.json").exists()

    pids: list[int] = []
    with pytest.raises(RuntimeError, match="test failure"):
        with LocalCluster.start(tmp_path / "c", bookies=1) as cluster:
            pids = all_pids(cluster.status())
            assert len(pids) == 2
            raise RuntimeError("test failure")
    assert pids and not any(process_alive(pid) for pid in pids)


def test_cli_tier_flags_reach_broker_config_and_aws_env_reaches_brokers(tmp_path):
    """--tier / --s3-endpoint become the broker keys tier_uri / tier_s3_endpoint_url (new and
    existing brokers), the AWS_* environment reaches the broker processes, bad values change nothing."""
    from broker.config import BrokerConfig
    from pulsarlite.zk_server import process_matches

    directory = tmp_path / "cluster"
    tier_dir = tmp_path / "tier"
    tier_dir.mkdir()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "chaos-key", "AWS_SECRET_ACCESS_KEY": "chaos-secret",
           "AWS_DEFAULT_REGION": "us-east-1"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pulsarlite", "cluster", *args], capture_output=True,
                              text=True, timeout=CLI_TIMEOUT_S, env=env)

    try:
        result = run("start", "--dir", str(directory), "--bookies", "3", "--brokers", "1",
                     "--tier", tier_dir.as_uri(), "--s3-endpoint", "http://127.0.0.1:9")
        assert result.returncode == 0, result.stderr
        broker_config = directory / "conf" / "broker-1.toml"
        config = load_toml(BrokerConfig, broker_config)
        assert config.offload.tier_uri == tier_dir.as_uri() and config.offload.tier_s3_endpoint_url == "http://127.0.0.1:9"
        status = json.loads(cli("status", "--dir", str(directory), "--json").stdout)
        broker = {p["name"]: p for p in status["processes"]}["broker-1"]
        assert broker["healthy"] and process_matches(broker["pid"], str(broker_config))
        environ = Path(f"/proc/{broker['pid']}/environ").read_bytes().split(b"\0")
        assert b"AWS_ACCESS_KEY_ID=chaos-key" in environ and b"AWS_SECRET_ACCESS_KEY=chaos-secret" in environ

        before = broker_config.read_text()
        for bad in (["--tier", "ftp://x"], ["--tier", "s3://"], ["--s3-endpoint", "minio:9000"]):
            result = run("start", "--dir", str(directory), "--bookies", "3", "--brokers", "1", *bad)
            assert result.returncode == 2 and ("--tier" in result.stderr or "--s3-endpoint" in result.stderr), bad
        assert broker_config.read_text() == before

        # an existing broker's config is rewritten; it takes effect at its next restart (said so)
        result = run("start", "--dir", str(directory), "--bookies", "3", "--brokers", "1",
                     "--tier", "s3://bucket/prefix")
        assert result.returncode == 0 and "take effect when these brokers restart: broker-1" in result.stderr
        config = load_toml(BrokerConfig, broker_config)
        assert config.offload.tier_uri == "s3://bucket/prefix" and config.offload.tier_s3_endpoint_url == "http://127.0.0.1:9"
    finally:
        if (directory / "cluster.json").exists():
            LocalCluster.open(directory).stop()
