"""Bookie metrics hooks (bookie/metrics.py) and the BookieConfig fields of [autorecovery]."""

from __future__ import annotations

import dataclasses

import pytest

from bookie.metrics import BookieMetrics
from bookie.storage.group_commit import GroupCommitPolicy
from bookie.storage.journal import JournalWriter
from pulsarlite.config import BookieConfig
from pulsarlite.errors import ConfigError


def sample(metrics: BookieMetrics, name: str, labels: dict | None = None) -> float:
    value = metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def test_the_journal_reports_each_groups_fdatasync(tmp_path):
    metrics = BookieMetrics()
    writer = JournalWriter(str(tmp_path), file_bytes_max=1 << 20, preallocate_bytes=0,
                           policy=GroupCommitPolicy(1.0, 1 << 20))
    writer.write_group([b"x" * 100])                       # no hook: nothing observed
    writer.on_sync = metrics.journal_sync_s.observe
    writer.write_group([b"y" * 100])
    writer.write_group([b"z" * 100])
    writer.close_file()
    assert sample(metrics, "bookie_journal_JOURNAL_SYNC_seconds_count") == 2
    assert sample(metrics, "bookie_journal_JOURNAL_SYNC_seconds_sum") > 0


def test_counters_and_the_exposition_use_bookkeepers_names():
    m = BookieMetrics()
    m.entries_added(3, 1)
    m.read_answered(True), m.read_answered(False)
    m.fragment_replicated(entries=4, nbytes=400)
    m.ledger_replicated(under_replicated_ms=90_000)
    assert sample(m, "bookkeeper_server_ADD_ENTRY_total", {"success": "true"}) == 3
    assert sample(m, "bookkeeper_server_ADD_ENTRY_total", {"success": "false"}) == 1
    assert sample(m, "bookkeeper_server_READ_ENTRY_total", {"success": "false"}) == 1
    assert sample(m, "replication_worker_NUM_BYTES_WRITTEN_total") == 400
    assert sample(m, "replication_worker_NUM_ENTRIES_WRITTEN_total") == 4
    assert sample(m, "replication_worker_UNDER_REPLICATED_seconds_sum") == 90
    assert sample(m, "auditor_NUM_UNDER_REPLICATED_LEDGERS") == -1          # not the auditor
    text = m.exposition().decode()
    assert "replication_worker_NUM_FRAGMENTS_REPLICATED_total 1.0" in text


def test_rack_and_metrics_port_are_validated():
    base = BookieConfig()
    assert base.rack == "" and base.metrics_port == 0
    dataclasses.replace(base, rack="eu-1a", metrics_port=9100).validate()
    with pytest.raises(ConfigError):
        dataclasses.replace(base, rack="a/b").validate()
    with pytest.raises(ConfigError):
        dataclasses.replace(base, metrics_port=70_000).validate()
