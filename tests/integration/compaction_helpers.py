"""Helpers shared by the compaction integration tests (test_compaction*.py): run a compaction
through the admin API and read a topic (compacted view or not) with the official client.

Protocol (Pulsar's PersistentTopics compaction endpoints): ``PUT <topic>/compaction`` answers 204
and starts a run; ``GET <topic>/compaction`` answers a LongRunningProcessStatus
``{"status": NOT_RUN|RUNNING|SUCCESS|ERROR, "lastError": str}``."""

from __future__ import annotations

import pytest
import requests

from tests.integration.helpers import wait_for

pulsar = pytest.importorskip("pulsar")

COMPACTION_WAIT_S = 120
READ_IDLE_MS = 2_000


def compaction_status(topic_admin_url: str) -> dict:
    """The LongRunningProcessStatus of ``topic_admin_url`` (``.../admin/v2/persistent/<ns>/<topic>``)."""
    r = requests.get(f"{topic_admin_url}/compaction", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def compact_and_wait(topic_admin_url: str, what: str = "compaction", wait_s: float = COMPACTION_WAIT_S) -> dict:
    """Start a compaction of the topic (204 expected) and wait until it ends; the final status
    (SUCCESS or ERROR) is returned for the caller to assert on."""
    r = requests.put(f"{topic_admin_url}/compaction", timeout=30)
    assert r.status_code == 204, r.text

    def done():
        got = compaction_status(topic_admin_url)
        return got if got["status"] in ("SUCCESS", "ERROR") else None
    return wait_for(done, wait_s, what)


def read_messages(client, topic: str, *, compacted: bool = True,
                  start=None) -> list[tuple[str, bytes, tuple[int, int, int]]]:
    """Every message a reader of ``topic`` (full name) gets from ``start`` (earliest by default)
    until it has been idle for READ_IDLE_MS: (key, data, (ledger, entry, batch index))."""
    reader = client.create_reader(topic, start or pulsar.MessageId.earliest, is_read_compacted=compacted)
    out = []
    try:
        while True:
            try:
                m = reader.read_next(timeout_millis=READ_IDLE_MS)
            except pulsar.Timeout:
                return out
            mid = m.message_id()
            out.append((m.partition_key(), m.data(), (mid.ledger_id(), mid.entry_id(), mid.batch_index())))
    finally:
        reader.close()
