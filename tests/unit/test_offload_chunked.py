"""The tier keeps the chunks of a chunked message as they are stored: one row per chunk entry,
rebuilt byte for byte (a compressed chunk's payload is a fragment of the compressed whole: its
row must not claim the compression was removed)."""

from __future__ import annotations

import random

import pytest

from offload.format import entries_to_table, table_to_entries
from pulsarlite.wire.entry import Compression, Message, build_chunk_entries, build_entry


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.LZ4, Compression.ZSTD])
def test_chunk_entries_round_trip_through_the_tier(compression):
    rng = random.Random(3)
    chunks = build_chunk_entries(Message(rng.randbytes(30_000) + b"\0" * 30_000, key="k"), producer_name="p",
                                 sequence_id=5, publish_time_ms=1000, entry_bytes_max=8192,
                                 compression=compression)
    assert len(chunks) > 2
    plain = build_entry(Message(b"between"), producer_name="q", sequence_id=1, publish_time_ms=1001)
    entries = [(0, chunks[0]), (1, plain)] + [(i + 1, e) for i, e in enumerate(chunks) if i]
    table = entries_to_table(9, entries, partition=-1)
    assert table.num_rows == len(entries)                 # one row per chunk entry
    assert list(table_to_entries(table)) == [(i, bytes(e)) for i, e in entries]
