"""The broker's entry cache: bounded LRU by bytes, per-topic drop, and no GC-tracked object per
entry (long-lived tracked objects per message made every young-generation GC pass a 100k-object
pause: BENCHMARKS.md "[perf] hot path")."""

from __future__ import annotations

import gc

from broker.managed_ledger import Position
from broker.topic import EntryCache


def test_put_get_counts_and_eviction_oldest_first():
    cache = EntryCache(10)
    cache.put("t", Position(1, 0), b"aaaa", 1)
    cache.put("t", Position(1, 1), b"bbbb", 5)
    assert cache.get("t", Position(1, 0)) == (b"aaaa", 1)
    assert cache.get("t", Position(1, 1)) == (b"bbbb", 5)
    assert cache.get("u", Position(1, 0)) is None and cache.get("t", Position(2, 0)) is None
    cache.put("t", Position(1, 2), b"cccc", 1)          # 12 bytes > 10: the oldest goes
    assert cache.get("t", Position(1, 0)) is None
    assert cache.get("t", Position(1, 2)) == (b"cccc", 1) and cache.bytes == 8
    cache.put("t", Position(1, 3), b"x" * 11, 1)        # larger than the cache: not kept
    assert cache.get("t", Position(1, 3)) is None and cache.bytes == 8


def test_topics_are_kept_apart_and_dropped_alone():
    cache = EntryCache(1 << 20)
    cache.put("a", Position(1, 0), b"A", 1)
    cache.put("b", Position(1, 0), b"B", 2)
    assert cache.get("a", Position(1, 0)) == (b"A", 1) and cache.get("b", Position(1, 0)) == (b"B", 2)
    cache.drop_topic("a")
    assert cache.get("a", Position(1, 0)) is None and cache.get("b", Position(1, 0)) == (b"B", 2)
    assert cache.bytes == 1
    cache.put("c", Position(1, 0), b"C", 1)              # a new topic never aliases a live one
    assert cache.get("b", Position(1, 0)) == (b"B", 2) and cache.get("c", Position(1, 0)) == (b"C", 1)
    cache.put("a", Position(1, 0), b"A2", 1)             # reloaded after a drop
    assert cache.get("a", Position(1, 0)) == (b"A2", 1)


def test_positions_outside_uint64_are_never_cached():
    cache = EntryCache(1 << 20)
    cache.put("t", Position(-1, -1), b"x", 1)
    cache.put("t", Position(1, 1 << 64), b"x", 1)
    assert cache.bytes == 0 and cache.get("t", Position(-1, -1)) is None


def test_cached_entries_hold_no_gc_tracked_objects():
    cache = EntryCache(1 << 20)
    for i in range(100):
        cache.put("t", Position(3, i), bytes([i]) * 10, 1 + i % 3)
    for key, value in cache._entries.items():
        assert not gc.is_tracked(key) and not gc.is_tracked(value)
    assert all(not gc.is_tracked(k) and not gc.is_tracked(v) for k, v in cache._counts.items())
