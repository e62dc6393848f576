"""Protobuf base-128 varints, for the few messages encoded by hand on hot paths (the broker's
SEND_RECEIPT, the bookie's AddRequest entries and AddResponses); each of those is compared
byte for byte with protobuf's own output by a property test."""

from __future__ import annotations

U64_MASK = (1 << 64) - 1
SMALL_VARINTS = [bytes([i]) for i in range(0x80)]     # the one-byte varints, prebuilt


def uvarint(value: int) -> bytes:
    """``value`` as a uint64 varint (a negative int64 takes 10 bytes, as protobuf writes it)."""
    value &= U64_MASK
    if value < 0x80:
        return SMALL_VARINTS[value]
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
