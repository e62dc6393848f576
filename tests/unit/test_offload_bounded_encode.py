"""[hardening] The offloaders encode a ledger a row group of decoded bytes at a time
(offload.format.ledger_tables -> ParquetStreamWriter, through offload.reader.encode_ledger, which
offload.tier.encode_and_upload calls too): memory holds about one row group's rows, never the
ledger's (240 entries of 5 KB stored and 5 MiB decoded each took a broker to 3.9 GB and stalled its
loop 9 s: BENCHMARKS.md, hostile inputs), and the objects are those the whole ledger's table made."""

from __future__ import annotations

import io
import random
import tracemalloc
import zlib

import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offload.tier import Tier, encode_and_upload
from offload import format as fmt
from offload.format import (ROW_SCHEMA, entries_to_table, entries_to_table_fast, read_parquet, table_to_entries,
                            write_parquet)
from offload.reader import encode_ledger
from offload.typed_columns import typed_columns_for
from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.wire.entry import Message, build_entry
from tests.unit.test_offload_format_fast import entry_lists
from tests.unit.test_offload_typed_columns import VERSIONS, ledger_entries

KEY = "public/default/t/ledger-7-0123456789abcdef.parquet"
MiB = 1024 * 1024


def zlib_entry(sequence_id: int, plain: bytes, *, declared: int | None = None,
               packed: bytes | None = None) -> bytes:
    """One ZLIB message as a producer sends it (``declared``: another uncompressed size)."""
    meta = pb.MessageMetadata(producer_name="p", sequence_id=sequence_id,
                              publish_time=1_700_000_000_000 + sequence_id, compression=pb.ZLIB,
                              uncompressed_size=len(plain) if declared is None else declared)
    body = meta.SerializeToString()
    return len(body).to_bytes(4, "big") + body + (zlib.compress(plain, 9) if packed is None else packed)


def value_bytes_per_row_group(path) -> list[int]:
    pf = pq.ParquetFile(path)
    return [sum(len(v) for v in pf.read_row_group(i, columns=["value"]).column("value").to_pylist())
            for i in range(pf.num_row_groups)]


def test_compressible_entries_are_decoded_a_row_group_at_a_time(tmp_path, monkeypatch):
    """48 entries of ~300 B stored, 256 KiB decoded each (12 MiB), row groups of 1 MiB: no table
    the encoder builds holds more than a row group (and an entry) of decoded bytes, nor does any
    row group, and the Python heap's peak stays within a few row groups (24 MiB before: the
    ledger, twice)."""
    plain = b"\0" * (256 * 1024)
    entries = [(i, zlib_entry(i, plain)) for i in range(48)]
    tables = []
    real = fmt.entries_to_table_fast

    def recorded(*args, **kwargs):
        table = real(*args, **kwargs)
        tables.append(sum(len(v) for v in table.column("value").to_pylist()))
        return table
    monkeypatch.setattr(fmt, "entries_to_table_fast", recorded)
    tier = Tier(f"file://{tmp_path}", None)
    tracemalloc.start()
    try:
        stats = encode_and_upload(tier, KEY, 7, entries, partition=-1, row_group_bytes=MiB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sum(tables) == 48 * len(plain) and len(tables) >= 12
    assert max(tables) <= MiB + len(plain)              # was one table of 12 MiB
    groups = value_bytes_per_row_group(tmp_path / KEY)
    assert len(groups) >= 12 and max(groups) <= MiB + len(plain)
    assert peak < 6 * MiB, peak                     # 24 MiB before (the ledger, twice)
    assert stats.rows == 48
    assert list(table_to_entries(read_parquet(tmp_path / KEY))) == \
        [(i, build_entry(Message(plain), producer_name="p", sequence_id=i, publish_time_ms=1_700_000_000_000 + i))
         for i in range(48)]                            # rebuilt uncompressed, same messages


def test_entries_beyond_the_message_bound_stay_opaque_and_the_ledger_offloads(tmp_path):
    """The bound per message is the broker's message_bytes_max (``uncompressed_bytes_max``): an entry
    declaring 2^31-1 (its offload failed on every pass, for ever) or more than the bound is one
    opaque row, kept as stored (compressed) and rebuilt byte for byte; it counts its stored bytes
    in the row group bound, so nothing near its declared size is allocated. One at the bound
    decodes."""
    bound = MiB
    at_bound = zlib_entry(2, b"a" * bound)
    beyond = zlib_entry(3, b"b" * (bound + 1))
    liar = zlib_entry(1, b"", declared=2**31 - 1, packed=b"junk")
    entries = [(0, build_entry(Message(b"before"), producer_name="p", sequence_id=0, publish_time_ms=1)),
               (1, liar), (2, at_bound), (3, beyond),
               (4, build_entry(Message(b"after"), producer_name="p", sequence_id=4, publish_time_ms=1))]
    tier = Tier(f"file://{tmp_path}", None)
    tracemalloc.start()
    try:
        encode_and_upload(tier, KEY, 7, entries, partition=-1, row_group_bytes=256 * 1024,
                          uncompressed_bytes_max=bound)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * bound, peak
    table = read_parquet(tmp_path / KEY)
    values = table.column("value").to_pylist()
    assert values[0] == b"before" and values[4] == b"after"
    assert values[1] == b"junk" and values[3] == zlib.compress(b"b" * (bound + 1), 9)    # as stored
    assert values[2] == b"a" * bound                                                     # decoded
    rebuilt = dict(table_to_entries(table))
    assert rebuilt[1] == liar and rebuilt[3] == beyond           # opaque: byte for byte
    assert fmt.decoded_bytes(liar, uncompressed_bytes_max=bound) == 4 + fmt.ROW_BYTES_OVERHEAD
    assert fmt.decoded_bytes(at_bound, uncompressed_bytes_max=bound) == bound + fmt.ROW_BYTES_OVERHEAD


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=entry_lists(), row_group_bytes=st.sampled_from([64, 700, 4_096, 1 << 20]))
def test_an_object_written_in_pieces_is_the_one_the_whole_table_made(entries, row_group_bytes):
    """Byte for byte (row groups, pages, statistics, footer) the object that one table of the whole
    ledger gave before (``write_parquet(entries_to_table(...))``, which the fast path's table
    equals), however the encoder cut the ledger into tables."""
    whole = io.BytesIO()
    write_parquet(entries_to_table(9, entries, partition=2), whole, row_group_bytes=row_group_bytes,
                  metadata={"pulsarlite.ledger_id": "9", "pulsarlite.partition": "2"})
    encoded = encode_ledger(9, entries, partition=2, row_group_bytes=row_group_bytes)
    assert encoded.data == whole.getvalue()


def test_the_brokers_object_with_typed_columns_is_the_one_the_whole_table_made(tmp_path):
    """Typed columns decoded per table (a row group's worth), with their metadata counting every
    table: the object is byte for byte the one the whole-ledger path wrote (typed_columns_for
    over all rows, appended, one write), here with several tables and row groups."""
    entries = ledger_entries()
    table = entries_to_table_fast(7, entries, partition=-1)
    null = table.column("null_value").to_pylist()
    values = [None if n else v for v, n in zip(table.column("value").to_pylist(), null)]
    typed = typed_columns_for(values, table.column("schema_version").to_pylist(), VERSIONS, ROW_SCHEMA.names)
    for name, array in zip(typed.names, typed.arrays):
        table = table.append_column(name, array)
    whole = io.BytesIO()
    write_parquet(table, whole, row_group_bytes=300, metadata={"pulsarlite.ledger_id": "7", **typed.metadata})

    counters: dict = {}
    encode_and_upload(Tier(f"file://{tmp_path}", None), KEY, 7, entries, partition=-1, row_group_bytes=300,
                      typed_versions=VERSIONS, topic="public/default/persistent/t", counters=counters)
    assert pq.ParquetFile(tmp_path / KEY).num_row_groups > 3
    assert (tmp_path / KEY).read_bytes() == whole.getvalue()
    assert counters == {"typed_values": 31, "typed_values_undecodable": 1, "typed_fields_unconvertible": 0}


def test_the_writer_holds_an_incomplete_row_group_until_more_rows_or_close():
    """Tables of any size fed one by one give the row groups of one table of all of them."""
    rng = random.Random(4)
    entries = [(i, build_entry(Message(rng.randbytes(rng.randint(0, 900))), producer_name="p", sequence_id=i,
                               publish_time_ms=i)) for i in range(60)]
    whole = io.BytesIO()
    write_parquet(entries_to_table(1, entries, partition=-1), whole, row_group_bytes=3_000)
    pieces = io.BytesIO()
    writer = fmt.ParquetStreamWriter(pieces, row_group_bytes=3_000)
    start = 0
    for size in (1, 7, 2, 20, 1, 1, 28):
        writer.write(entries_to_table(1, entries[start:start + size], partition=-1))
        start += size
    summary = writer.close()
    assert start == 60 and summary.entries == 60
    assert pieces.getvalue() == whole.getvalue()
    assert summary.row_groups == pq.ParquetFile(io.BytesIO(whole.getvalue())).num_row_groups > 5
