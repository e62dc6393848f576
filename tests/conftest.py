"""Shared fixtures: one ZooKeeper server per test session, a fresh chroot per test, and a
factory of local clusters that always cleans up. Event loops come from uvloop."""

from __future__ import annotations

import os
import shutil

import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest
import uvloop

from faces.cluster import LocalCluster
from pulsarlite.zk_server import ZooKeeperServer


def pytest_asyncio_loop_factories(config, item):
    """Run every async test and fixture on uvloop (pytest-asyncio 1.5 hook)."""
    return {"uvloop": uvloop.new_event_loop}


# The fuzz suite (tests/fuzz: seeded malformed input against a real cluster with a canary
# producer) is part of the test command with a short budget (5 s of fuzzing per target, ~70 s in
# all; `make fuzz` runs it with 20 s, PULSARLITE_FUZZ=1). PULSARLITE_FUZZ=0 leaves it out.
collect_ignore = ["fuzz"] if os.environ.get("PULSARLITE_FUZZ") == "0" else []


# The simulation sweeps (ledger, autorecovery, publish path, whole path) run beside the session in
# one background process at the lowest CPU priority; their tests, moved to the end, finish what
# the background did not (tests/sim/background_sweep.py).
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    from sim.background_sweep import order_and_start
    order_and_start(config, items)     # ended at the session's end (its plugin's sessionfinish)


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


def local_clusters(directory: Path) -> Iterator[Callable[..., LocalCluster]]:
    """What ``cluster_factory`` and ``module_cluster_factory`` yield: ``start(...)`` starts a
    LocalCluster in ``directory/name``; every cluster started is stopped when the generator
    ends, even on failure (the first error of a stop is raised once all are stopped)."""
    clusters: list[LocalCluster] = []

    def start(bookies: int = 3, *, brokers: int = 0, bookie_overrides: dict | None = None,
              broker_overrides: dict | None = None, name: str = "cluster", **kwargs) -> LocalCluster:
        cluster = LocalCluster(directory / name, **kwargs)
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


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """``start(bookies=3, *, brokers=0, bookie_overrides=None, broker_overrides=None,
    name="cluster", **kw)`` starts a
    LocalCluster in ``tmp_path/name`` (blocking: from async code, wrap it in
    ``asyncio.to_thread``); every cluster started is stopped at teardown, even on failure."""
    yield from local_clusters(tmp_path)


@pytest.fixture(scope="module")
def module_tmp_path(tmp_path_factory: pytest.TempPathFactory, request) -> Iterator[Path]:
    """A temporary directory for a whole test module (named after it), deleted at the module's end
    unless one of its tests failed (kept, like a failed test's ``tmp_path``, for its logs).

    Clusters write gigabytes over a suite run (bookie journals and entry logs; the chunking tests
    alone ~2 GB): kept until the session ends they filled a CI machine's disk, ZooKeeper stopped,
    and every later test failed. pyproject.toml's ``tmp_path_retention_policy = "failed"`` does the
    same for function-scoped ``tmp_path``."""
    failed_before = request.session.testsfailed
    path = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    yield path
    if request.session.testsfailed == failed_before:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def module_cluster_factory(module_tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """``cluster_factory`` for a whole module (e.g. one cluster shared by the checks of one
    fuzz run, tests/fuzz), in ``module_tmp_path``; every cluster is stopped at the module's end."""
    yield from local_clusters(module_tmp_path)


class S3Endpoint:
    """What the ``s3_server`` fixture gives a test: a moto server with one bucket."""

    def __init__(self, server, bucket: str) -> None:
        self.server = server
        self.bucket = bucket
        self.endpoint_url: str = server.endpoint_url
        self.env: dict[str, str] = server.env  # AWS_* credentials, region, AWS_ENDPOINT_URL

    def tier_uri(self, prefix: str | None = None) -> str:
        """``s3://<bucket>/<prefix>``; a fresh random prefix when none is given."""
        return f"s3://{self.bucket}/{prefix or 't-' + uuid.uuid4().hex[:12]}"

    def client(self):
        """A boto3 S3 client on the endpoint (path-style, the test credentials)."""
        return self.server.client()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    """One moto S3 server (child process on a free 127.0.0.1 port) for the session, with the
    bucket ``pulsarlite-test``. While it runs, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
    AWS_DEFAULT_REGION are set in os.environ (processes started by tests inherit them);
    AWS_ENDPOINT_URL is NOT set: pass ``s3_server.endpoint_url`` explicitly (or use
    ``s3_server.env``). Use ``s3_tier_uri`` for a fresh prefix per test."""
    import os

    from tests.local_s3 import LocalS3Server

    server = LocalS3Server(tmp_path_factory.mktemp("moto"))
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                             "AWS_DEFAULT_REGION")}
    try:
        server.start(timeout_s=60)
        server.create_bucket("pulsarlite-test")
        for k in saved:
            os.environ[k] = server.env[k]
        yield S3Endpoint(server, "pulsarlite-test")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture
def s3_tier_uri(s3_server: S3Endpoint) -> str:
    """``s3://pulsarlite-test/t-<hex>``: an empty prefix for this test on the session's server."""
    return s3_server.tier_uri()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator["LocalPostgresServer"]:  # noqa: F821
    """One PostgreSQL server (Debian's binaries, a child process on a free 127.0.0.1 port, its
    cluster in a fresh temporary directory, trust authentication) for the session; stopped by
    pid and its directory deleted at the end, even on failure. Give each test its own database
    (``create_database``). Fails (does not skip) when PostgreSQL or psycopg2 is missing:
    scripts/setup.sh installs both (tests/local_postgres.py)."""
    from tests.local_postgres import LocalPostgresServer

    server = LocalPostgresServer()
    try:
        server.start(timeout_s=60)
        yield server
    finally:
        server.stop()
