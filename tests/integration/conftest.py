"""Fixtures shared by the integration tests (the session-wide ones are in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def client(cluster):
    """The official client on the test module's ``cluster`` fixture (each module that uses it
    defines ``cluster``), closed after the test."""
    pulsar = pytest.importorskip("pulsar")
    c = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        yield c
    finally:
        c.close()
