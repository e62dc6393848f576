"""offload/format.py entries_to_table_fast: the same table as entries_to_table on any entries
(the fast path for batches of plain messages, the general path for everything else), and the
same errors."""

from __future__ import annotations

import random
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offload import format as fmt
from offload.format import TierFormatError, entries_to_table, entries_to_table_fast, table_to_entries
from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.wire.entry import Compression, Message, build_batch_entry, build_entry

CODECS = list(Compression)
# sequence ids around the varint length steps (1, 2, 3, 4 bytes) and far up
FIRST_IDS = [0, 1, 100, 127, 128, 129, 5_000, 16_383, 16_384, 2_097_151, 2**35 + 3, 2**63 - 400]


def assert_same(entries, ledger_id=3, partition=-1):
    expected = entries_to_table(ledger_id, entries, partition=partition)
    got = entries_to_table_fast(ledger_id, entries, partition=partition)
    assert got.schema.equals(expected.schema)
    for name in expected.column_names:       # column by column: a failure names the column
        assert got[name].equals(expected[name]), name
    assert got.equals(expected)
    return got


def fast_only(monkeypatch, entries, partition):
    """entries_to_table_fast's table for entries that must all take the fast path (no call to
    the general one), checked equal to the general path's."""
    calls = []
    real = fmt.entries_to_table
    monkeypatch.setattr(fmt, "entries_to_table", lambda *a, **k: calls.append(a) or real(*a, **k))
    got = entries_to_table_fast(7, entries, partition=partition)
    monkeypatch.undo()
    assert calls == []                    # no entry needed the general path
    assert got.equals(entries_to_table(7, entries, partition=partition))
    return got


def plain_batch(rng, first_seq, n, *, size=None, codec=Compression.NONE, with_ids=True,
                publish=1_700_000_000_000, schema_version=None, producer="prod-1"):
    size = rng.randint(0, 300) if size is None else size
    payloads = [rng.randbytes(size) for _ in range(n)]
    ids = list(range(first_seq, first_seq + n)) if with_ids else None
    return build_batch_entry(payloads, producer_name=producer, sequence_id=first_seq,
                             publish_time_ms=publish, compression=codec,
                             schema_version=schema_version, sequence_ids=ids)


def test_plain_batches_take_the_fast_path_and_match(monkeypatch):
    rng = random.Random(1)
    entries = [(i, plain_batch(rng, first, rng.randint(1, 300), codec=CODECS[i % len(CODECS)]))
               for i, first in enumerate(FIRST_IDS)]
    got = fast_only(monkeypatch, entries, 4)
    assert got.num_rows == sum(len(fmt.unpack_entry(e)[1]) for _, e in entries)


def test_batches_without_ids_in_their_messages():
    rng = random.Random(2)
    entries = [(i, plain_batch(rng, first, 50, with_ids=False)) for i, first in enumerate([0, 200, 9_999])]
    assert_same(entries)


def test_schema_version_and_producer_names_per_entry():
    rng = random.Random(3)
    entries = [(i, plain_batch(rng, 1000 * i, 20, schema_version=[None, b"\x00\x01", b""][i % 3],
                               producer=f"p{i % 2}", publish=5 + i)) for i in range(9)]
    assert_same(entries, partition=11)


def test_plain_batches_of_mixed_sizes_are_walked_not_unpacked(monkeypatch):
    rng = random.Random(8)
    entries = []
    for i, first in enumerate(FIRST_IDS):
        n = rng.randint(1, 300)
        payloads = [rng.randbytes(rng.choice([0, 1, 127, 128, 300, 20_000])) for _ in range(n)]
        ids = list(range(first, first + n)) if i % 3 else None       # ids written, or not
        entries.append((i, build_batch_entry(payloads, producer_name="p", sequence_id=first,
                                             publish_time_ms=9, compression=CODECS[i % len(CODECS)],
                                             sequence_ids=ids)))
    fast_only(monkeypatch, entries, 4)


def test_non_uniform_and_rich_batches():
    rng = random.Random(4)
    mixed_sizes = build_batch_entry([b"a", b"bb", b"ccc"], producer_name="p", sequence_id=5,
                                    publish_time_ms=9, sequence_ids=[5, 6, 7])
    gaps = build_batch_entry([b"aa", b"bb", b"cc"], producer_name="p", sequence_id=5,
                             publish_time_ms=9, sequence_ids=[5, 7, 8])
    other_first = build_batch_entry([b"aa", b"bb"], producer_name="p", sequence_id=5,
                                    publish_time_ms=9, sequence_ids=[6, 7])
    keyed_later = build_batch_entry([Message(b"aa", sequence_id=0), Message(b"bb", key="k", sequence_id=1)],
                                    producer_name="p", sequence_id=0, publish_time_ms=9)
    rich = build_batch_entry([Message(b"x" * 4, key="k", properties={"a": "b"}, event_time_ms=3,
                                      ordering_key=b"o", sequence_id=i, null_value=i == 1)
                              for i in range(3)], producer_name="p", sequence_id=0,
                             publish_time_ms=9, compression=Compression.ZSTD)
    single = build_entry(Message(b"solo", key="k"), producer_name="p", sequence_id=3, publish_time_ms=1)
    fast = plain_batch(rng, 40, 10)
    entries = list(enumerate([fast, mixed_sizes, gaps, fast, other_first, keyed_later, rich, single, fast]))
    assert_same(entries)


def test_non_canonical_varints_are_not_taken_for_plain():
    # payload_size 2 written as a 2-byte varint (0x82 0x00): valid protobuf, not what the fast
    # path predicts: it must fall back, and give what the general path gives
    single = b"\x18\x82\x00\x40\x00"
    batch = len(single).to_bytes(4, "big") + single + b"zz"
    single2 = b"\x18\x02\x40\x01"
    batch += len(single2).to_bytes(4, "big") + single2 + b"yy"
    meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=2,
                              uncompressed_size=len(batch)).SerializeToString()
    entry = len(meta).to_bytes(4, "big") + meta + batch
    got = assert_same([(0, entry)])
    assert got["value"].to_pylist() == [b"zz", b"yy"]


def test_errors_are_the_general_paths():
    rng = random.Random(5)
    good = plain_batch(rng, 0, 10, size=8)
    truncated = good[:-3]
    zero = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=0,
                              uncompressed_size=0).SerializeToString()
    empty_batch = len(zero).to_bytes(4, "big") + zero
    for bad in (b"\x00\x00", good[:9]):          # not even the metadata parses: the ledger fails
        with pytest.raises(TierFormatError) as slow:
            entries_to_table(1, [(0, good), (1, bad)], partition=-1)
        with pytest.raises(TierFormatError) as fast:
            entries_to_table_fast(1, [(0, good), (1, bad)], partition=-1)
        assert str(fast.value) == str(slow.value)
    for bad in (truncated, empty_batch):          # the metadata parses: kept opaque, alike
        table = assert_same([(0, good), (1, bad)])
        assert dict(table_to_entries(table)) == {0: good, 1: bad}
    with pytest.raises(TierFormatError, match="not increasing"):
        entries_to_table_fast(1, [(2, good), (2, good)], partition=-1)
    with pytest.raises(ValueError):
        entries_to_table_fast(-1, [], partition=-1)


def test_encrypted_and_unknown_codec_entries():
    msgs = [b"ciphertext-%d" % i for i in range(3)]
    batch = build_batch_entry(msgs, producer_name="p", sequence_id=0, publish_time_ms=5,
                              compression=Compression.LZ4, sequence_ids=[0, 1, 2])
    meta, _ = fmt.unpack_entry(batch)
    raw = pb.MessageMetadata()
    raw.CopyFrom(meta.raw)
    raw.encryption_keys.add(key="k", value=b"wrapped")
    head = raw.SerializeToString()
    encrypted = len(head).to_bytes(4, "big") + head + batch[meta.payload_offset:]
    assert_same([(0, encrypted), (1, plain_batch(random.Random(6), 3, 4))])
    # a codec newer than ours: compression = 9 lands among the unknown fields
    plain = build_batch_entry([b"aa", b"bb"], producer_name="p", sequence_id=0, publish_time_ms=5,
                              sequence_ids=[0, 1])
    meta, _ = fmt.unpack_entry(plain)
    head = meta.raw.SerializeToString() + b"\x40\x09"      # field 8 (compression), varint 9
    unknown = len(head).to_bytes(4, "big") + head + plain[meta.payload_offset:]
    table = assert_same([(0, unknown)])        # kept opaque, rebuilt byte for byte
    assert dict(table_to_entries(table)) == {0: unknown}


def test_empty():
    assert_same([])


def test_sequence_ids_past_int64_fail_alike():
    entry = plain_batch(random.Random(7), 2**63 - 2, 5)
    with pytest.raises(OverflowError):
        entries_to_table(1, [(0, entry)], partition=-1)
    with pytest.raises(OverflowError):
        entries_to_table_fast(1, [(0, entry)], partition=-1)


@st.composite
def entry_lists(draw):
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    count = draw(st.integers(1, 25))
    entries = []
    entry_id = draw(st.integers(0, 5))
    for _ in range(count):
        kind = draw(st.sampled_from(["plain", "plain", "plain-noids", "rich", "single", "sizes",
                                     "keyed", "keyed", "keyed-some"]))
        codec = draw(st.sampled_from(CODECS))
        first = draw(st.sampled_from(FIRST_IDS + [rng.randint(0, 2**40)]))
        n = draw(st.integers(1, 200))
        if kind == "plain":
            entry = plain_batch(rng, first, n, codec=codec, schema_version=rng.choice([None, b"\x01"]))
        elif kind == "plain-noids":
            entry = plain_batch(rng, first, n, codec=codec, with_ids=False)
        elif kind == "sizes":
            payloads = [rng.randbytes(rng.randint(0, 40)) for _ in range(n)]
            entry = build_batch_entry(payloads, producer_name="q", sequence_id=first, publish_time_ms=3,
                                      compression=codec, sequence_ids=list(range(first, first + n)))
        elif kind in ("keyed", "keyed-some"):
            keys = ["", "k", "key-17", "ключ", "x" * 127, "y" * 128, "\u00e9" * 70]
            msgs = [Message(rng.randbytes(rng.randint(0, 40)),
                            key=(rng.choice(keys) if kind == "keyed" or rng.random() < 0.7 else None),
                            sequence_id=rng.choice([first + j, first + j, None]))
                    for j in range(n)]
            entry = build_batch_entry(msgs, producer_name="k", sequence_id=first, publish_time_ms=6,
                                      compression=codec)
        elif kind == "rich":
            msgs = [Message(rng.randbytes(rng.randint(0, 30)), key=rng.choice([None, "k"]),
                            properties=rng.choice([{}, {"a": "1"}]), event_time_ms=rng.choice([None, 7]),
                            sequence_id=rng.choice([None, first + j]), null_value=rng.random() < 0.1)
                    for j in range(min(n, 20))]
            entry = build_batch_entry(msgs, producer_name="r", sequence_id=first, publish_time_ms=4,
                                      compression=codec)
        else:
            entry = build_entry(Message(rng.randbytes(rng.randint(0, 50)), key=rng.choice([None, "k"])),
                                producer_name="s", sequence_id=first, publish_time_ms=5, compression=codec)
        entries.append((entry_id, entry))
        entry_id += draw(st.integers(1, 3))
    return entries


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=entry_lists(), partition=st.sampled_from([-1, 0, 7]))
def test_same_table_as_entries_to_table(entries, partition):
    assert_same(entries, ledger_id=42, partition=partition)


def test_plain_batches_of_empty_payloads():
    """Empty payloads: a message's header end is the next header's start (the last one is the
    batch's end), which the strided fill must still count."""
    rng = random.Random(3)
    for first in FIRST_IDS:
        for n in (1, 2, 127, 128, 129, 300):
            for with_ids in (True, False):
                got = assert_same([(0, plain_batch(rng, first, n, size=0, with_ids=with_ids))])
                assert got.num_rows == n


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=entry_lists(), row_group_bytes=st.sampled_from([64, 4_096, 1 << 20]))
def test_offloaded_objects_are_byte_for_byte_those_of_the_general_path(entries, row_group_bytes):
    """The offloaders (offload.reader.encode_ledger, offload.tier.encode_and_upload) build
    their tables with entries_to_table_fast: the Parquet bytes must be those the general path
    writes (same pages, same statistics, same checksum), whatever the chunks of the table."""
    import io

    from offload.format import write_parquet
    from offload.reader import encode_ledger

    def parquet_of(table):
        sink = io.BytesIO()
        write_parquet(table, sink, row_group_bytes=row_group_bytes, metadata={"pulsarlite.ledger_id": "9"})
        return sink.getvalue()
    assert parquet_of(entries_to_table_fast(9, entries, partition=2)) == \
        parquet_of(entries_to_table(9, entries, partition=2))

    fast = encode_ledger(9, entries, partition=2, row_group_bytes=row_group_bytes)
    with mock.patch("offload.format.entries_to_table_fast", entries_to_table):   # what it wrote before
        general = encode_ledger(9, entries, partition=2, row_group_bytes=row_group_bytes)
    assert fast.data == general.data
    assert fast.stats == general.stats


def test_keyed_batches_are_walked_not_unpacked(monkeypatch):
    """Every message with a key (under 128 bytes, UTF-8): the walk takes the batch, keys and all;
    a key of 128 bytes or more, or a batch where some messages lack one, goes the general way."""
    rng = random.Random(5)

    def keyed(first, keys):
        msgs = [Message(rng.randbytes(rng.randint(0, 60)), key=k, sequence_id=first + j)
                for j, k in enumerate(keys)]
        return build_batch_entry(msgs, producer_name="k", sequence_id=first, publish_time_ms=9,
                                 compression=Compression.LZ4)
    walked = [(0, keyed(0, ["a", "", "ключ", "k" * 127])), (1, keyed(4, ["key-%d" % i for i in range(300)])),
              (2, plain_batch(rng, 304, 5))]
    got = fast_only(monkeypatch, walked, 0)
    assert got["key"].to_pylist()[:4] == ["a", "", "ключ", "k" * 127]
    assert got["key"].null_count == 5        # the plain batch's rows
    for entries in ([(0, keyed(0, ["a", "k" * 128]))], [(0, keyed(0, ["a", None, "b"]))]):
        assert fmt._fast_entry(entries[0][1]) is None
        assert_same(entries)



def test_a_key_that_is_not_utf8_goes_the_general_way():
    entry = build_batch_entry([Message(b"v1", key="ab", sequence_id=0), Message(b"v2", key="cd", sequence_id=1)],
                              producer_name="k", sequence_id=0, publish_time_ms=1, compression=Compression.NONE)
    bad = entry.replace(b"\x12\x02ab", b"\x12\x02a\xff")
    assert bad != entry and fmt._fast_entry(entry) is not None
    assert fmt._fast_entry(bad) is None
    # which keeps it as one opaque row, rebuilt byte for byte (was a TierFormatError: its
    # ledger's offload failed on every attempt; tests/unit/test_offload_text_fields.py)
    table = assert_same([(0, entry), (1, bad), (2, entry)])
    assert table.column("batch_size").to_pylist() == [2, 2, 0, 2, 2]
    assert list(table_to_entries(table))[1] == (1, bad)


def test_after_a_run_of_misses_the_rest_goes_straight_to_the_general_path(monkeypatch):
    """An unbatched ledger: FAST_MISSES_MAX entries tried, the rest not parsed twice; the table
    is the same."""
    rng = random.Random(6)
    entries = [(i, build_entry(Message(rng.randbytes(20)), producer_name="s", sequence_id=i, publish_time_ms=5))
               for i in range(fmt.FAST_MISSES_MAX + 10)]
    entries.append((len(entries), plain_batch(rng, 100, 4)))
    tried = []
    real = fmt._fast_entry
    monkeypatch.setattr(fmt, "_fast_entry", lambda e, *limit: tried.append(e) or real(e, *limit))
    assert_same(entries)
    assert len(tried) == fmt.FAST_MISSES_MAX
