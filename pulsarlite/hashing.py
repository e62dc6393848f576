"""Key hashes Pulsar uses, shared by the broker (Key_Shared hash ranges) and the client
(partition routing): MurmurHash3 x86 32-bit through the ``mmh3`` library."""

from __future__ import annotations

import mmh3


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86 32-bit, unsigned (Guava's ``murmur3_32``, which Pulsar uses)."""
    return mmh3.hash(data, seed, signed=False)


__all__ = ["murmur3_32"]
