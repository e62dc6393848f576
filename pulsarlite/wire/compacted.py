"""The compacted-entry codec: one entry of a topic's compacted ledger (broker/compaction/) is

    [u16 magic 0x0C0A][u64 original ledger][u64 original entry][u32 n]
    [n x i64 ack-set words, big-endian][original entry bytes, verbatim]

with ``n = 0xFFFFFFFF`` when the whole original entry survives (no ack set). The ack set says
which batch indexes survive (Java BitSet words, signed, set bit = delivered), so every message
keeps its original (ledger, entry, batch index) id. Here, on floor 1, so that the broker (which
writes and serves the compacted ledger) and the Spark source (which may read it) share one codec.
"""

from __future__ import annotations

import struct
from typing import NamedTuple, Sequence

ENTRY_MAGIC = 0x0C0A
_HEADER = struct.Struct(">HQQI")                  # magic, ledger, entry, ack-set word count
_WHOLE = 0xFFFFFFFF


class RawCompactedEntry(NamedTuple):
    ledger_id: int                     # the original entry's position
    entry_id: int
    ack_set: tuple[int, ...] | None    # survivors of a batch; None: all
    data: bytes                        # the original entry, verbatim


def encode_compacted(ledger_id: int, entry_id: int, ack_set: Sequence[int] | None, data: bytes) -> bytes:
    words = tuple(ack_set) if ack_set is not None else ()
    head = _HEADER.pack(ENTRY_MAGIC, ledger_id, entry_id, len(words) if ack_set is not None else _WHOLE)
    return head + b"".join(struct.pack(">q", w) for w in words) + bytes(data)


def decode_compacted(raw: bytes) -> RawCompactedEntry:
    """ValueError if ``raw`` is not a compacted entry."""
    if len(raw) < _HEADER.size:
        raise ValueError("compacted entry too short")
    magic, ledger, entry, n = _HEADER.unpack_from(raw)
    if magic != ENTRY_MAGIC:
        raise ValueError(f"not a compacted entry (magic {magic:#x})")
    pos = _HEADER.size
    words: tuple[int, ...] | None = None
    if n != _WHOLE:
        if len(raw) < pos + 8 * n:
            raise ValueError("compacted entry: ack set truncated")
        words = tuple(struct.unpack_from(f">{n}q", raw, pos))
        pos += 8 * n
    return RawCompactedEntry(ledger, entry, words, raw[pos:])
