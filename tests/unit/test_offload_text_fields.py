"""[hardening] An entry whose text field (message key, producer name, a property) is not UTF-8:
the broker accepts it (python protobuf does not validate proto2 strings; upb hands such a field
out as bytes), and its ledger's offload failed on every attempt ("a field does not convert"), so
the ledger never reached the tier. Such an entry is now one opaque row (kept as stored, rebuilt
byte for byte, its invalid text columns null), as an entry beyond the message bound is; the rest
of the ledger offloads as before."""

from __future__ import annotations

import logging
import random
import zlib

import pyarrow as pa
import pytest

from offload import format as fmt
from offload.format import entries_to_table, entries_to_table_fast, read_parquet, table_to_entries
from offload.reader import TierReader, encode_ledger, write_ledger_object
from offload.store import open_object_store
from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.wire.entry import Compression, Message, build_batch_entry, build_entry, split_entry
from tests.unit.test_offload_format_fast import plain_batch

KEY = "t/ns/topic/ledger-7-0123456789abcdef.parquet"
BAD = b"\xff\xfe"


def patched(entry: bytes, good: bytes) -> bytes:
    """``entry`` with every occurrence of ``good`` (as long as BAD) replaced by BAD."""
    assert len(good) == len(BAD) and good in entry
    return entry.replace(good, BAD)


def unbatched_bad_key(seq: int) -> bytes:
    return patched(build_entry(Message(b"value-%d" % seq, key="K1"), producer_name="p",
                               sequence_id=seq, publish_time_ms=1_000 + seq), b"K1")


def batched_bad_key(seq: int) -> bytes:
    """A batch of three (NONE): the entry's key and its messages' keys are BAD."""
    return patched(build_batch_entry([Message(b"m%d" % i, key="K1", sequence_id=seq + i) for i in range(3)],
                                     producer_name="p", sequence_id=seq, publish_time_ms=1_000 + seq), b"K1")


def batched_bad_key_zlib(seq: int) -> bytes:
    """The batch above, its payload ZLIB-compressed after the key was patched (as a producer
    that wrote those bytes would have sent it)."""
    metadata, payload = split_entry(batched_bad_key(seq))
    raw = pb.MessageMetadata()
    raw.CopyFrom(metadata.raw)
    raw.compression = pb.ZLIB
    raw.uncompressed_size = len(payload)
    meta = raw.SerializeToString()
    return len(meta).to_bytes(4, "big") + meta + zlib.compress(bytes(payload))


def bad_producer_batch(seq: int) -> bytes:
    """A plain batch (the fast path's kind) whose producer name is not UTF-8."""
    return patched(plain_batch(random.Random(seq), seq, 4, producer="P1"), b"P1")


def bad_property(seq: int) -> bytes:
    return patched(build_entry(Message(b"v", properties={"k": "V1"}), producer_name="p", sequence_id=seq,
                               publish_time_ms=1_000 + seq), b"V1")


BAD_ENTRIES = {"unbatched key": unbatched_bad_key, "batched key": batched_bad_key,
               "batched key zlib": batched_bad_key_zlib, "producer name": bad_producer_batch,
               "property value": bad_property}


def ledger(make_bad) -> tuple[list[tuple[int, bytes]], set[int]]:
    """Normal entries (plain batches for the fast path, keyed and unbatched ones) around two bad
    ones."""
    rng = random.Random(5)
    entries: list[tuple[int, bytes]] = []
    bad: set[int] = set()
    for i in range(12):
        if i in (3, 8):
            entries.append((i, make_bad(100 * i)))
            bad.add(i)
        elif i % 3 == 0:
            entries.append((i, build_entry(Message(b"u%d" % i, key="key-%d" % i, properties={"a": "b"}),
                                           producer_name="p", sequence_id=100 * i, publish_time_ms=5)))
        else:
            entries.append((i, plain_batch(rng, 100 * i, 5, codec=Compression.ZLIB if i % 2 else Compression.NONE)))
    return entries, bad


@pytest.mark.parametrize("kind", sorted(BAD_ENTRIES))
def test_a_ledger_with_non_utf8_text_fields_offloads_and_reads_back_byte_for_byte(tmp_path, kind, caplog):
    entries, bad = ledger(BAD_ENTRIES[kind])
    store = open_object_store((tmp_path / "tier").as_uri())
    with caplog.at_level(logging.WARNING, "pulsarlite.offload.format"):
        w = write_ledger_object(store, KEY, 7, entries, partition=-1, row_group_bytes=600)
    assert w.entries == len(entries) and w.row_groups > 1
    assert any("ledger 7 entry 3 kept opaque" in r.getMessage() and "not UTF-8" in r.getMessage()
               for r in caplog.records)
    # the broker's read path (TierReader: row groups -> table_to_entries)
    got = dict(TierReader(w.uri, size_bytes=w.stats.size_bytes, checksum=w.stats.checksum).read_entries())
    normal = dict(table_to_entries(entries_to_table(7, [e for e in entries if e[0] not in bad], partition=-1)))
    for entry_id, stored in entries:
        if entry_id in bad:
            assert got[entry_id] == stored                  # opaque: the stored bytes exactly
        else:
            assert got[entry_id] == normal[entry_id]        # as any other ledger's rows
    table = read_parquet(tmp_path / "tier" / KEY)
    rows = table.to_pylist()
    for entry_id in bad:
        (row,) = [r for r in rows if r["entry_id"] == entry_id]        # one row
        assert row["batch_size"] == 0 and row["batch_index"] == -1
        assert row["entry_header"] + row["value"] == dict(entries)[entry_id]
    for row in rows:       # the text columns hold valid text only (null where there was none)
        assert row["key"] is None or BAD.decode("utf-8", "replace") not in row["key"]
    assert sum(1 for r in rows if r["entry_id"] not in bad) == \
        entries_to_table(7, [e for e in entries if e[0] not in bad], partition=-1).num_rows


@pytest.mark.parametrize("kind", sorted(BAD_ENTRIES))
def test_both_paths_make_the_same_table(kind):
    entries, _ = ledger(BAD_ENTRIES[kind])
    slow = entries_to_table(7, entries, partition=2)
    fast = entries_to_table_fast(7, entries, partition=2)
    assert fast.equals(slow)
    assert list(table_to_entries(fast))[3][1] == dict(entries)[3]


def test_an_opaque_rows_invalid_text_columns_are_null_and_the_producer_name_replaced():
    entry = patched(build_entry(Message(b"v", key="K1", properties={"k": "V1", "ok": "fine"}),
                                producer_name="P1", sequence_id=1, publish_time_ms=1), b"K1")
    entry = patched(patched(entry, b"V1"), b"P1")
    (row,) = entries_to_table(7, [(0, entry)], partition=-1).to_pylist()
    assert row["key"] is None and row["properties"] is None
    assert row["producer_name"] == "\ufffd\ufffd"          # a required column: replacement characters
    assert row["value"] == b"v" and row["entry_header"] + row["value"] == entry


def test_encrypted_entries_with_a_non_utf8_key_stay_opaque():
    entry = build_entry(Message(b"sealed", key="K1"), producer_name="p", sequence_id=1, publish_time_ms=1)
    metadata, payload = split_entry(entry)
    raw = pb.MessageMetadata()
    raw.CopyFrom(metadata.raw)
    raw.encryption_keys.add(key="k", value=b"x")
    meta = raw.SerializeToString()
    entry = patched(len(meta).to_bytes(4, "big") + meta + bytes(payload), b"K1")
    assert list(table_to_entries(entries_to_table_fast(1, [(0, entry)], partition=-1))) == [(0, entry)]


def test_the_encoder_does_not_take_the_slow_check_for_valid_text(monkeypatch):
    """Valid text: the conversion succeeds at once; the entry-by-entry check runs only after an
    encoding error."""
    monkeypatch.setattr(fmt, "_text_opaque_ids", lambda *a, **k: pytest.fail("checked entry by entry"))
    entries, _ = ledger(lambda seq: build_entry(Message(b"ok", key="fine"), producer_name="p", sequence_id=seq,
                                                publish_time_ms=1))
    encode_ledger(7, entries, partition=-1, row_group_bytes=600)


def test_old_code_failed_these(monkeypatch):
    """Sanity of the fixtures: the arrays really refuse these bytes as strings."""
    with pytest.raises(pa.ArrowInvalid):
        pa.array([BAD], pa.string())
    raw = split_entry(unbatched_bad_key(1))[0].raw
    assert raw.partition_key == BAD            # upb hands the field out as bytes


def test_the_brokers_offload_of_such_a_ledger_succeeds_and_its_read_path_rebuilds_it(tmp_path):
    """offload.tier.encode_and_upload (what a broker's offload runs) and the broker's reader
    (row groups of REBUILD_COLUMNS -> table_to_entries)."""
    from offload.tier import Tier, encode_and_upload
    from offload.format import REBUILD_COLUMNS
    entries, bad = ledger(batched_bad_key_zlib)
    tier = Tier(f"file://{tmp_path}", None)
    stats = encode_and_upload(tier, KEY, 7, entries, partition=-1, row_group_bytes=600)
    got = dict(table_to_entries(read_parquet(tmp_path / KEY, columns=REBUILD_COLUMNS)))
    assert sorted(got) == list(range(12)) and stats.rows == read_parquet(tmp_path / KEY).num_rows
    assert all(got[i] == dict(entries)[i] for i in bad)
