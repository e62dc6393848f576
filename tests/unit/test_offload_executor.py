"""The one offload shell (offload/shell.py) through its blocking test facade
(tests/offload_executor.py) on a file:// store: failures of a step leave the machine idle with the
error, and the next call converges."""

from __future__ import annotations

import random

from offload.core import LedgerOffload, OffloadRecord, OffloadState
from tests.offload_executor import LedgerOffloadExecutor
from offload.reader import TierReader
from offload.store import open_object_store
from pulsarlite.errors import BookieUnavailableError
from test_offload_format import assert_same_entries, make_entries


class Hooks:
    def __init__(self, entries):
        self.record = OffloadRecord()
        self.entries = entries
        self.bookies = True
        self.read_failures = 1
        self.delete_failures = 1

    def cas_record(self, ledger_id, expected, new):
        if self.record == expected:
            self.record = new
        return self.record

    def read_entries(self, ledger_id):
        if self.read_failures:
            self.read_failures -= 1
            raise BookieUnavailableError("bookie-1 down")
        return self.entries

    def delete_from_bookies(self, ledger_id):
        if self.delete_failures:
            self.delete_failures -= 1
            raise BookieUnavailableError("bookie-2 down")
        self.bookies = False

    def partition(self, ledger_id):
        return 1


def test_failed_steps_then_convergence(tmp_path):
    store = open_object_store((tmp_path / "tier").as_uri())
    entries = make_entries(random.Random(2), 50)
    hooks = Hooks(entries)

    def machine():
        return LedgerOffload(3, hooks.record, tier_uri=store.uri, tenant="t", namespace="ns",
                             topic="topic-partition-1", deletion_lag_ms=100)

    ex = LedgerOffloadExecutor(machine(), hooks, row_group_bytes=5_000)
    ex.offload(1000, "11" * 8)                     # reading from the bookies fails
    assert ex.machine.last_error and "bookie-1 down" in ex.machine.last_error
    assert hooks.record.state is OffloadState.OFFLOADING
    first_uri = hooks.record.uri
    ex.offload(1001, "22" * 8)                     # retry: new attempt, new object
    assert hooks.record.state is OffloadState.OFFLOADED and hooks.record.uri != first_uri
    assert [store.object_uri(i.key) for i in store.list()] == [hooks.record.uri]
    ex.tick(1050)                                  # lag not passed
    assert hooks.bookies
    ex.tick(1101)                                  # the bookie delete fails once
    assert hooks.bookies and hooks.record.state is OffloadState.OFFLOADED
    ex = LedgerOffloadExecutor(machine(), hooks)   # e.g. after a failover
    ex.tick(1200)
    assert not hooks.bookies and hooks.record.state is OffloadState.BOOKIE_DELETED
    assert ex.machine.done
    stats = hooks.record.stats
    got = list(TierReader(hooks.record.uri, checksum=stats.checksum).read_entries())
    assert_same_entries(entries, got)


def test_damaged_object_is_redone_before_the_bookie_delete(tmp_path):
    store = open_object_store((tmp_path / "tier").as_uri())
    entries = make_entries(random.Random(5), 40)
    hooks = Hooks(entries)
    hooks.read_failures = hooks.delete_failures = 0
    ex = LedgerOffloadExecutor(LedgerOffload(4, hooks.record, tier_uri=store.uri, tenant="t",
                                             namespace="ns", topic="x", deletion_lag_ms=100),
                               hooks)
    ex.offload(0, "33" * 8)
    assert hooks.record.state is OffloadState.OFFLOADED
    bad_uri = hooks.record.uri
    key = bad_uri[len(store.uri) + 1:]
    data = bytearray(store.get(key))
    data[len(data) // 2] ^= 0xFF
    store.put(key, bytes(data))                    # damaged while offloaded
    ex.tick(200)
    assert hooks.bookies                           # not deleted from the bookies
    assert hooks.record.state is OffloadState.OFFLOADING and hooks.record.uri == bad_uri
    ex.offload(300, "44" * 8)                      # redone from the bookies
    assert hooks.record.state is OffloadState.OFFLOADED and hooks.record.uri != bad_uri
    ex.tick(500)
    assert hooks.record.state is OffloadState.BOOKIE_DELETED and not hooks.bookies
    assert [store.object_uri(i.key) for i in store.list()] == [hooks.record.uri]
    got = list(TierReader(hooks.record.uri, checksum=hooks.record.stats.checksum).read_entries())
    assert_same_entries(entries, got)
