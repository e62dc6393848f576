"""Fixtures shared by the integration tests (the session-wide ones are in tests/conftest.py)."""

from __future__ import annotations

import contextlib

import pytest


@contextlib.contextmanager
def official_client(cluster):
    """The official client on ``cluster`` (30 s operation timeout), closed on exit."""
    pulsar = pytest.importorskip("pulsar")
    c = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def client(cluster):
    """The official client on the test module's ``cluster`` fixture (each module that uses it
    defines ``cluster``), closed after the test."""
    with official_client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def module_client(cluster):
    """The official client on the module's ``cluster``, shared by the module's tests (for
    module-scoped fixtures that produce once), closed after the module."""
    with official_client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def spark(request):
    """One local Spark session per test module (``pulsarlite-<module>``), stopped after it.
    Spark's Python workers keep the environment of the session's start (docs/decisions.md),
    so a module that needs more in the environment starts it before this fixture runs."""
    pytest.importorskip("pyspark")
    from tests.integration.helpers import spark_session
    with spark_session("pulsarlite-" + request.module.__name__.rsplit(".", 1)[-1]) as session:
        yield session
