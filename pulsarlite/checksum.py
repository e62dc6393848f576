"""CRC32C digests (invariant 8: verified on every read from disk, network and tier)."""

from __future__ import annotations

import struct

from crc32c import crc32c

_ENTRY_HEADER = struct.Struct(">Qqqq")


def crc32c_of(data: bytes | memoryview, value: int = 0) -> int:
    return crc32c(data, value)


def entry_checksum(ledger_id: int, entry_id: int, lac: int, length: int,
                   payload: bytes | memoryview) -> int:
    """CRC32C over (ledger_id u64 BE, entry_id i64 BE, lac i64 BE, length i64 BE, payload): the
    entry digest the writer computes and every reader (bookie, client) verifies. ``length`` is
    the ledger's payload bytes up to and including this entry."""
    return crc32c(payload, crc32c(_ENTRY_HEADER.pack(ledger_id, entry_id, lac, length)))
