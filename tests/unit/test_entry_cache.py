"""The broker's entry cache: bounded LRU by bytes, per-topic drop, and no GC-tracked object per
entry (long-lived tracked objects per message made every young-generation GC pass a 100k-object
pause: BENCHMARKS.md "[perf] hot path")."""

from __future__ import annotations

import gc

from hypothesis import given, settings
from hypothesis import strategies as st

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
    for i in range(100):
        cache.put("t", Position(4, i), bytes([i]) * 10, 1, i * 600, 1 + i)
    assert len(cache._ledgers) == 2 and cache.entry_count == 200      # one object per ledger, not per entry
    for ledger in cache._ledgers.values():
        assert not any(gc.is_tracked(x) for x in [*ledger.datas, *ledger.slots, *ledger.counts, *ledger.counts.values(),
                                                   *ledger.delays, *ledger.delays.values()])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(1, 3), st.integers(0, 12), st.integers(1, 40),
                          st.integers(1, 3), st.one_of(st.none(), st.integers(0, 65535)),
                          st.one_of(st.just(0), st.integers(1, 1 << 45))), max_size=40),
       st.integers(20, 400), st.sampled_from("ab"), st.integers(1, 3), st.integers(0, 12), st.integers(-1, 14))
def test_a_run_read_is_the_entries_got_one_by_one(puts, bytes_max, topic, ledger_id, first, last):
    # read_run (dispatch reads a run of entries at once) gives what get gives one by one, from
    # the first entry up to the last asked or the first one not cached, with the slot and the
    # deliver_at_time the publish path kept (even after evictions and a dropped topic)
    cache = EntryCache(bytes_max)
    fields = {}
    for t, lid, e, size, count, slot, at in puts:
        if cache.get(t, Position(lid, e)) is None:
            fields[(t, lid, e)] = (slot, at)
        cache.put(t, Position(lid, e), bytes(size), count, slot, at)
        if e == 12 and t == "b":
            cache.drop_topic("b")
    kept = [d for ledger in cache._ledgers.values() for d in ledger.datas if d is not None]
    assert cache.bytes == sum(map(len, kept)) <= bytes_max and cache.entry_count == len(kept)
    expected = []
    for e in range(first, last + 1):
        got = cache.get(topic, Position(ledger_id, e))
        if got is None:
            break
        expected.append((e, got[0], got[1], *fields[(topic, ledger_id, e)]))
    assert cache.read_run(topic, ledger_id, first, last) == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 3), st.integers(1, 30), st.integers(1, 3)),
                max_size=60), st.integers(10, 200), st.lists(st.sampled_from("abc"), max_size=2))
def test_eviction_is_oldest_put_first_by_bytes(puts, bytes_max, dropped):
    # puts in entry order per ledger (as the publish path makes them): the cache keeps what a
    # plain first-in first-out list bounded in bytes keeps, and a dropped topic frees its bytes
    cache = EntryCache(bytes_max)
    model: list[tuple[str, Position, bytes, int]] = []
    next_entry: dict[tuple[str, int], int] = {}
    for topic, ledger_id, size, count in puts:
        e = next_entry.get((topic, ledger_id), 0)
        next_entry[(topic, ledger_id)] = e + 1
        data = bytes([e % 256]) * size
        cache.put(topic, Position(ledger_id, e), data, count)
        if size <= bytes_max:
            model.append((topic, Position(ledger_id, e), data, count))
            while sum(len(m[2]) for m in model) > bytes_max:
                model.pop(0)
    for topic in dropped:
        cache.drop_topic(topic)
        model = [m for m in model if m[0] != topic]
    assert cache.bytes == sum(len(m[2]) for m in model) and cache.entry_count == len(model)
    kept = {(t, p): (d, c) for t, p, d, c in model}
    for (topic, ledger_id), n in next_entry.items():
        for e in range(n):
            assert cache.get(topic, Position(ledger_id, e)) == kept.get((topic, Position(ledger_id, e)))
