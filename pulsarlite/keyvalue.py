"""Pulsar's KeyValue byte layout, shared by the broker's schema registry (a KEY_VALUE schema's
definition) and the client's KeyValueSchema (INLINE payloads): ``[i32 n][key][i32 m][value]``,
big-endian, ``-1`` for an absent part (as the Java client writes it)."""

from __future__ import annotations

import struct

_I32 = struct.Struct(">i")


def join_pair(key: bytes | None, value: bytes | None) -> bytes:
    return b"".join((_I32.pack(-1 if key is None else len(key)), key or b"",
                     _I32.pack(-1 if value is None else len(value)), value or b""))


def split_pair(data: bytes) -> tuple[bytes | None, bytes | None]:
    """(key, value), None for an absent part; ValueError if truncated or with trailing bytes."""
    parts: list[bytes | None] = []
    offset = 0
    for _ in range(2):
        if offset + 4 > len(data):
            raise ValueError("truncated")
        (n,) = _I32.unpack_from(data, offset)
        offset += 4
        if n < 0:
            parts.append(None)
            continue
        if offset + n > len(data):
            raise ValueError("truncated")
        parts.append(bytes(data[offset:offset + n]))
        offset += n
    if offset != len(data):
        raise ValueError("has trailing bytes")
    return parts[0], parts[1]
