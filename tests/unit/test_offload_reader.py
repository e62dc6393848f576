"""offload/reader.py on a file:// store: write, verify, read back by ranges (row groups with
read-ahead) and whole (object checksum), and refusals of damaged objects."""

from __future__ import annotations

import random

import pytest

from offload.core import ObjectStats
from offload.format import TierChecksumError, TierFormatError, entries_to_table
from offload.reader import TierReader, ledger_offload_summary, verify_object, write_ledger_object
from offload.store import ObjectNotFoundError, open_object_store
from pulsarlite.wire.entry import Compression, unpack_entry
from test_offload_format import assert_same_entries, make_entries

KEY = "t/ns/topic/ledger-7-0123456789abcdef.parquet"


@pytest.fixture
def store(tmp_path):
    return open_object_store((tmp_path / "tier").as_uri())


@pytest.fixture
def written(store):
    entries = make_entries(random.Random(11), 600, first_entry_id=0)
    w = write_ledger_object(store, KEY, 7, entries, partition=3, row_group_bytes=20_000)
    return entries, w


def test_write_records_what_metadata_needs(store, written):
    entries, w = written
    assert w.uri == store.object_uri(KEY)
    data = store.get(KEY)
    from offload.store import crc32c_hex
    assert w.stats.size_bytes == len(data) and w.stats.checksum == crc32c_hex(data)
    table = entries_to_table(7, entries, partition=3)
    assert w.stats.rows == table.num_rows and w.entries == 600 and w.row_groups > 5
    summary = ledger_offload_summary(table)
    assert summary == {"rows": table.num_rows,
                       "min_publish_time_ms": w.stats.min_publish_time_ms,
                       "max_publish_time_ms": w.stats.max_publish_time_ms}
    verify_object(store, KEY, w.stats)
    verify_object(store, KEY, w.stats, full=False)


@pytest.mark.parametrize("read_ahead", [0, 1, 3])
def test_read_ranges_and_everything(store, written, read_ahead):
    entries, w = written
    reader = TierReader(w.uri, size_bytes=w.stats.size_bytes, checksum=w.stats.checksum,
                        rows=w.stats.rows, read_ahead_row_groups=read_ahead, part_bytes=7000)
    assert reader.entry_ranges[0][0] == 0 and reader.entry_ranges[-1][1] == 599
    for first, last in [(0, 0), (5, 5), (37, 211), (598, 599), (0, 599), (590, 10_000)]:
        got = list(reader.read_entries(first, last))
        assert_same_entries(entries[first:last + 1], got)
    # a range read fetches only its row groups (plus the footer)
    fresh = TierReader(w.uri, size_bytes=w.stats.size_bytes, read_ahead_row_groups=0,
                       part_bytes=7000)
    before = fresh.bytes_fetched
    assert before < w.stats.size_bytes / 5
    list(fresh.read_entries(300, 300))
    assert 0 < fresh.bytes_fetched - before < w.stats.size_bytes / 10
    # an object no bigger than one part is fetched whole, once, at open
    small = TierReader(w.uri, part_bytes=w.stats.size_bytes)
    assert small.bytes_fetched == w.stats.size_bytes
    assert_same_entries(entries[37:212], list(small.read_entries(37, 211)))
    assert small.bytes_fetched == w.stats.size_bytes


def test_reader_without_known_size(store, written):
    entries, w = written
    assert_same_entries(entries, list(TierReader(w.uri).read_entries()))


def test_damaged_object_is_refused(store, tmp_path):
    entries = make_entries(random.Random(3), 200, codec=Compression.NONE, batched=False)
    w = write_ledger_object(store, KEY, 7, entries, partition=-1, row_group_bytes=20_000,
                            compression="none")
    data = bytearray(store.get(KEY))
    payload = bytes(unpack_entry(entries[150][1])[1][0].payload)
    where = bytes(data).find(payload)
    assert where > 0 and len(payload) > 20
    data[where + 10] ^= 0x55
    store.put(KEY, bytes(data))
    with pytest.raises(TierChecksumError):
        verify_object(store, KEY, w.stats)
    # a range read (no whole-object checksum) still fails on the page checksum
    reader = TierReader(w.uri, size_bytes=w.stats.size_bytes)
    assert_same_entries(entries[:10], list(reader.read_entries(0, 9)))
    with pytest.raises(TierChecksumError):
        list(reader.read_entries(150, 150))
    # the whole-object path fails on the object checksum
    with pytest.raises(TierChecksumError):
        TierReader(w.uri, checksum=w.stats.checksum).read_table()


def test_mismatches_with_metadata_are_refused(store, written):
    entries, w = written
    with pytest.raises(TierFormatError):
        TierReader(w.uri, rows=w.stats.rows + 1)
    bad = ObjectStats(w.stats.rows, w.stats.size_bytes, "00000000", None, None)
    with pytest.raises(TierChecksumError):
        verify_object(store, KEY, bad)
    with pytest.raises(TierChecksumError):
        verify_object(store, KEY, ObjectStats(1, w.stats.size_bytes + 1, "0", None, None),
                      full=False)
    store.put("other", b"not parquet, not at all, really not")
    with pytest.raises(TierFormatError):
        TierReader(store.object_uri("other"))
    store.delete(KEY)
    with pytest.raises(ObjectNotFoundError):
        verify_object(store, KEY, w.stats)
    with pytest.raises(ObjectNotFoundError):
        TierReader(w.uri)


def test_encode_in_a_process_pool_then_put(store):
    from concurrent.futures import ProcessPoolExecutor

    from offload.reader import encode_ledger, put_encoded
    entries = make_entries(random.Random(12), 120)
    with ProcessPoolExecutor(1) as pool:
        encoded = pool.submit(encode_ledger, 8, entries, partition=0,
                              row_group_bytes=10_000).result()
    w = put_encoded(store, KEY, 8, encoded)
    verify_object(store, KEY, w.stats)
    assert w.entries == 120 and w.row_groups == encoded.row_groups > 1
    assert_same_entries(entries, list(TierReader(w.uri, checksum=w.stats.checksum)
                                      .read_entries()))


def test_sweep_orphans(store):
    from offload.core import OffloadRecord, OffloadState, object_key
    from offload.shell import sweep_orphans
    named = object_key("t", "ns", "topic", 1, "aa" * 8)
    orphan = object_key("t", "ns", "topic", 2, "bb" * 8)
    young = object_key("t", "ns", "topic", 3, "cc" * 8)
    other_topic = object_key("t", "ns", "other", 4, "dd" * 8)
    for key in (named, orphan, young, other_topic, "t/ns/topic/notes.txt"):
        store.put(key, b"x")
    old_ms = store.head(orphan).modified_ms
    assert old_ms is not None
    records = [OffloadRecord(OffloadState.OFFLOADING, store.object_uri(named), "aa" * 8)]
    # the young one was written "later": pretend by a grace window that excludes only it
    import os
    young_path = store.root.joinpath(*young.split("/"))
    os.utime(young_path, ns=((old_ms + 10_000) * 1_000_000,) * 2)
    gone = sweep_orphans(store, "t/ns/topic/", records, now_ms=old_ms + 10_500, grace_ms=5_000)
    assert gone == [store.object_uri(orphan)]
    left = sorted(i.key for i in store.list())
    assert left == sorted([named, young, other_topic, "t/ns/topic/notes.txt"])


@pytest.mark.parametrize("whole_object_bytes_max", [0, 1 << 30])
def test_parquet_file_reads_projected_columns_like_a_plain_open(store, written, whole_object_bytes_max):
    """The Spark source's path through the one reader: column-projected row groups, the same
    rows as a plain open of the object, whether the object was fetched whole or is read by
    ranges; the file it opens is closed with the reader."""
    import pyarrow as pa

    from offload.format import open_parquet, read_row_groups
    _, w = written
    plain = open_parquet(pa.BufferReader(store.get(KEY)), read_dictionary=["producer_name"])
    columns = ["entry_id", "batch_index", "producer_name", "value"]
    with TierReader(w.uri, read_ahead_row_groups=0, whole_object_bytes_max=whole_object_bytes_max) as reader:
        pf = reader.parquet_file(read_dictionary=["producer_name"])
        assert pf.metadata.num_row_groups == plain.metadata.num_row_groups > 5
        for i in (0, 3, pf.metadata.num_row_groups - 1):
            got = read_row_groups(pf, [i], columns=columns)
            assert got.equals(read_row_groups(plain, [i], columns=columns))
        assert pa.types.is_dictionary(got.schema.field("producer_name").type)
        opened = list(reader._opened)
    assert len(opened) == (1 if whole_object_bytes_max == 0 else 0)
    assert all(f.closed for f in opened)


def test_a_recorded_size_larger_than_the_object_is_refused(store, written):
    """A short object (the store refuses the range, or returns fewer bytes) is an error, never
    a misaligned footer read (the broker then reads an offloaded ledger from its bookies)."""
    from offload.store import ObjectStoreError
    _, w = written
    with pytest.raises((TierFormatError, ObjectStoreError)):
        TierReader(w.uri, size_bytes=w.stats.size_bytes + 10)
