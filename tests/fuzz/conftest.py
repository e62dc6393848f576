"""Fixtures of the fuzz suite: a budget (seed, seconds, cases) and the module's directory. The
cluster of a module (one fuzz run per target, checked by several tests) comes from
``module_cluster_factory`` of tests/conftest.py, in the same directory (``module_tmp_path``)."""

from __future__ import annotations

from pathlib import Path

import pytest

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
def fuzz_dir(module_tmp_path: Path) -> Path:
    """The module's directory: its cluster, the cases journal, the clients' logs."""
    return module_tmp_path
