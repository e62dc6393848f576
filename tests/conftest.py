"""Shared fixtures: one ZooKeeper server per test session, a fresh chroot per test, and a
factory of local clusters that always cleans up. Event loops come from uvloop."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest
import uvloop

from pulsarlite.cluster import LocalCluster
from pulsarlite.zk_server import ZooKeeperServer


def pytest_asyncio_loop_factories(config, item):
    """Run every async test and fixture on uvloop (pytest-asyncio 1.5 hook)."""
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One ZooKeeper process for the whole test session (do not stop or kill it in a test:
    start your own ZooKeeperServer for outage tests)."""
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    try:
        server.start(timeout_s=60)
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_hosts(zk_server: ZooKeeperServer) -> str:
    """A connect string with a fresh chroot, e.g. ``127.0.0.1:PORT/t-<hex>``: each test sees
    an empty ZooKeeper."""
    return f"{zk_server.connect_string}/t-{uuid.uuid4().hex[:16]}"


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """``start(bookies=3, *, brokers=0, bookie_overrides=None, broker_overrides=None,
    name="cluster", **kw)`` starts a
    LocalCluster in ``tmp_path/name`` (blocking: from async code, wrap it in
    ``asyncio.to_thread``); every cluster started is stopped at teardown, even on failure."""
    clusters: list[LocalCluster] = []

    def start(bookies: int = 3, *, brokers: int = 0, bookie_overrides: dict | None = None,
              broker_overrides: dict | None = None, name: str = "cluster", **kwargs) -> LocalCluster:
        cluster = LocalCluster(tmp_path / name, **kwargs)
        clusters.append(cluster)
        cluster.start_processes(bookies=bookies, brokers=brokers, bookie_overrides=bookie_overrides,
                                broker_overrides=broker_overrides)
        return cluster

    try:
        yield start
    finally:
        errors = []
        for cluster in reversed(clusters):
            try:
                cluster.stop()
            except Exception as e:  # keep stopping the others
                errors.append(e)
        if errors:
            raise errors[0]
