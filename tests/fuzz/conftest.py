"""Fixtures of the fuzz suite: a budget (seed, seconds, cases) and a local cluster per test
module (one fuzz run per target, checked by several tests), stopped at the module's end."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from pulsarlite.cluster import LocalCluster

from .harness import RUNS, Budget

# Every fuzz cluster: connections that never CONNECT or trickle a frame are closed within the
# settle window; deduplication on, so "stored at most once" is the broker's promise to check.
BROKER_OVERRIDES = {
    "connect_timeout_ms": 2_000,
    "frame_complete_timeout_ms": 3_000,
    "broker_deduplication_enabled": True,
}


# The test machine's disk is shared and often nearly full: bookies that turn read-only under the
# default thresholds (0.95) would stop the canary for reasons that are not the fuzzing's.
BOOKIE_OVERRIDES = {
    "disk_usage_readonly_threshold": 0.995,
    "disk_usage_writable_threshold": 0.99,
}


def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz: a seeded, time-bounded fuzz run against a real cluster "
                                       "(PULSARLITE_FUZZ_SEED, PULSARLITE_FUZZ_SECONDS, PULSARLITE_FUZZ_CASES)")


def pytest_terminal_summary(terminalreporter):
    if RUNS:
        terminalreporter.section("fuzz runs (seeds and replays)")
        for line in RUNS:
            terminalreporter.write_line(line)


@pytest.fixture(scope="module")
def fuzz_budget() -> Budget:
    return Budget.from_env()


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory, request) -> Path:
    return tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])


@pytest.fixture(scope="module")
def module_cluster_factory(fuzz_dir: Path) -> Iterator[Callable[..., LocalCluster]]:
    """``cluster_factory`` of tests/conftest.py for a whole module (one cluster per fuzz
    target, shared by the checks of its run); every cluster is stopped at the module's end."""
    clusters: list[LocalCluster] = []

    def start(bookies: int = 3, *, brokers: int = 0, bookie_overrides: dict | None = None,
              broker_overrides: dict | None = None, name: str = "cluster", **kwargs) -> LocalCluster:
        cluster = LocalCluster(fuzz_dir / name, **kwargs)
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
