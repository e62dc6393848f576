"""[hardening] Orphan ledgers (bookie/orphan_gc.py): a ledger this bookie stores that the
metadata does not know is deleted, but only on a definite "unknown" answer, only once the grace
period has passed since the bookie first saw it, with a bounded number of metadata lookups per
pass (round-robin, so every ledger gets its turn), and with a log line naming the ledger and
the bookie. The pure core, then one pass over a real store."""

from __future__ import annotations

import logging

import pytest

from bookie.orphan_gc import LEDGER_ID_WITH_METADATA_MAX, Lookup, OrphanLedgerCollector, collect_once
from bookie.storage import Status
from pulsarlite.config import BookieConfig
from pulsarlite.errors import ConfigError, MetadataError
from test_bookie_store import config, entry, started

GRACE_MS = 60_000


def test_a_ledger_is_looked_up_only_after_the_grace_period_since_first_seen():
    core = OrphanLedgerCollector(GRACE_MS, 100)
    assert core.plan([1, 2], now_ms=0) == []
    assert core.plan([1, 2, 3], now_ms=GRACE_MS - 1) == []           # 3 first seen now
    assert core.plan([1, 2, 3], now_ms=GRACE_MS) == [1, 2]
    assert core.on_lookups({1: Lookup.UNKNOWN, 2: Lookup.KNOWN}, now_ms=GRACE_MS) == [1]
    core.deleted(1)
    assert core.plan([2, 3], now_ms=2 * GRACE_MS - 2) == [2]
    assert core.on_lookups({2: Lookup.KNOWN}, now_ms=2 * GRACE_MS - 2) == []
    assert core.plan([2, 3], now_ms=2 * GRACE_MS) == [3, 2]         # round-robin: after 2


def test_only_a_definite_unknown_for_a_ledger_asked_this_pass_deletes():
    core = OrphanLedgerCollector(GRACE_MS, 100)
    core.plan([1, 2, 3], now_ms=0)
    assert core.plan([1, 2, 3], now_ms=GRACE_MS) == [1, 2, 3]
    assert core.on_lookups({1: Lookup.ERROR, 2: Lookup.KNOWN, 3: Lookup.UNKNOWN, 9: Lookup.UNKNOWN},
                           now_ms=GRACE_MS) == [3]
    assert core.on_lookups({1: Lookup.UNKNOWN}, now_ms=GRACE_MS) == []   # not asked (pass over)


def test_a_ledger_gone_and_back_waits_a_whole_grace_period_again():
    core = OrphanLedgerCollector(GRACE_MS, 100)
    core.plan([1], now_ms=0)
    core.plan([], now_ms=GRACE_MS)                      # deleted meanwhile: forgotten
    assert core.tracked == 0
    assert core.plan([1], now_ms=GRACE_MS + 1) == []
    assert core.plan([1], now_ms=2 * GRACE_MS) == []
    assert core.plan([1], now_ms=2 * GRACE_MS + 1) == [1]


def test_lookups_per_pass_are_bounded_and_every_ledger_gets_its_turn():
    core = OrphanLedgerCollector(GRACE_MS, 3)
    ids = list(range(10, 20))
    core.plan(ids, now_ms=0)
    seen = []
    for p in range(4):
        picked = core.plan(ids, now_ms=GRACE_MS + p)
        assert len(picked) == 3
        seen.append(picked)
        core.on_lookups({i: Lookup.KNOWN for i in picked}, now_ms=GRACE_MS + p)
    assert seen == [[10, 11, 12], [13, 14, 15], [16, 17, 18], [19, 10, 11]]


@pytest.mark.parametrize("name", ["orphan_gc_interval_ms", "orphan_ledger_grace_ms",
                                  "orphan_ledgers_per_pass_max"])
def test_orphan_gc_limits_are_validated(tmp_path, name):
    assert getattr(BookieConfig(), name) > 0
    with pytest.raises(ConfigError, match=name):
        config(tmp_path, **{name: 0}).validate()


async def test_a_pass_over_a_real_store_deletes_the_orphans_only(tmp_path, caplog):
    store = await started(config(tmp_path))
    try:
        known, orphan, unreachable, huge = 5, 6, 7, LEDGER_ID_WITH_METADATA_MAX + 1
        for lid in (known, orphan, unreachable, huge):
            assert await store.add_entries([entry(lid, 0)]) == [Status.OK]
        asked = []

        async def exists(ledger_id: int) -> bool:
            asked.append(ledger_id)
            if ledger_id == unreachable:
                raise MetadataError("zookeeper session suspended")
            return ledger_id == known

        now = [0]
        cookie_found = [False]

        async def trusted() -> bool:
            return cookie_found[0]

        async def one_pass() -> list[int]:
            return await collect_once(core, store.ledger_ids(), exists, store.delete_ledger, "bookie-1",
                                      lambda: now[0], trusted)

        core = OrphanLedgerCollector(GRACE_MS, 100)
        assert await one_pass() == []
        assert asked == []                                  # nothing is old enough
        now[0] = GRACE_MS
        caplog.set_level(logging.WARNING, logger="pulsarlite.bookie.orphan_gc")
        # metadata without this bookie's cookie (wiped, or the wrong ZooKeeper): nothing deleted
        assert await one_pass() == []
        assert [store.ledger_info(lid).exists for lid in (known, orphan, unreachable, huge)] == [True] * 4
        cookie_found[0] = True
        asked.clear()
        deleted = await one_pass()
        assert deleted == [orphan, huge] and sorted(asked) == [known, orphan, unreachable]
        assert store.read(orphan, 0, 0, 0)[0] == Status.NO_SUCH_LEDGER
        assert store.read(huge, 0, 0, 0)[0] == Status.NO_SUCH_LEDGER
        for lid in (known, unreachable):
            assert store.read(lid, 0, 0, 0) == (Status.OK, [entry(lid, 0)])
        lines = [r.getMessage() for r in caplog.records if "orphan ledger deleted" in r.getMessage()]
        assert len(lines) == 2 and all("bookie=bookie-1" in line for line in lines)
        assert f"ledger={orphan} " in lines[0]
        # deleted for good: a late add to it is refused, and the next pass has nothing to do
        assert await store.add_entries([entry(orphan, 1)]) == [Status.NO_SUCH_LEDGER]
        asked.clear()
        now[0] = 2 * GRACE_MS
        assert await one_pass() == []
        assert sorted(asked) == [known, unreachable]
    finally:
        await store.close()
