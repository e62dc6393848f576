"""The entry codec's columnar batch decoder: a batch of plain messages (what a producer of
plain messages writes) split into Arrow arrays -- values, the messages' verbatim
``[u32 size][SingleMessageMetadata]`` headers, and keys -- with Arrow takes over the
decompressed batch, no Python object per message. The tier format (offload/format.py) builds
its rows from it; any other batch is decoded by :func:`pulsarlite.wire.entry.unpack_entry`.

- :func:`plain_batch_columns` (data, count, first sequence id) -> :class:`PlainBatch` or None.

A batch is "plain" when each message's SingleMessageMetadata holds only ``payload_size`` and
perhaps ``sequence_id`` (= the entry's sequence id + batch index) and perhaps a
``partition_key`` (on every message or none, under 128 bytes, valid UTF-8), varints in their
shortest form, nothing left over. None means "not known here": the caller takes
``unpack_entry``, which also reports malformed batches. The decoder and ``unpack_entry`` agree
on every batch the decoder takes (tests/unit/test_offload_format_fast.py, property tests).
This module imports pyarrow; :mod:`pulsarlite.wire.entry` does not (the client never loads it).
"""

from __future__ import annotations

import struct
from array import array
from itertools import chain, repeat
from typing import NamedTuple

import pyarrow as pa

from pulsarlite.varint import SMALL_VARINTS, uvarint
from pulsarlite.wire.entry import read_varint

_U32 = struct.Struct(">I")


class PlainBatch(NamedTuple):
    """A plain batch's columns: ``values`` and ``headers`` (binary, one per message, the
    headers byte for byte as stored), their total sizes in bytes, and ``keys`` (string, one per
    message) or None when no message has a key."""

    values: pa.Array
    headers: pa.Array
    value_bytes: int
    header_bytes: int
    keys: pa.Array | None


def plain_batch_columns(data: bytes, count: int, first_sequence_id: int) -> PlainBatch | None:
    """The columns of ``data``, an uncompressed batch of ``count`` messages whose entry's
    sequence id is ``first_sequence_id``, if it is a plain batch (module docstring); else None.
    A batch of one payload size and consecutive ids is checked whole against the headers
    protobuf would write (no walk); any other is walked header by header (a few integer
    operations each)."""
    decoded = _plain_batch(data, count, first_sequence_id)
    if decoded is not None:
        return PlainBatch(*decoded, None)
    decoded = _plain_batch_walk(data, count, first_sequence_id)
    return None if decoded is None else PlainBatch(*decoded)


_PLAIN_CACHE_MAX = 256
_STRIDE_INDICES: dict[tuple[int, int], pa.Array] = {}     # (count, 0|1) -> 0/1, 2/3, 4/5, ...
_LOW_SEVEN = [bytes((low | 0x80,)) for low in range(0x80)]   # a varint's first byte, id >= 128


def _stride_indices(count: int, odd: int) -> pa.Array:
    key = (count, odd)
    indices = _STRIDE_INDICES.get(key)
    if indices is None:
        indices = pa.array(range(odd, 2 * count, 2), pa.int32())
        if len(_STRIDE_INDICES) < _PLAIN_CACHE_MAX:
            _STRIDE_INDICES[key] = indices
    return indices


def _varint_bytes(value: int) -> int:
    return (value.bit_length() + 6) // 7 or 1


def _plain_headers(payload_size: int, first_sequence_id: int | None, count: int
                   ) -> tuple[bytes, list[tuple[int, int]]]:
    """What the ``count`` messages' ``[u32 size][SingleMessageMetadata]`` are, concatenated,
    and their lengths as runs of (messages, header length), if every message is plain (only
    ``payload_size`` = ``payload_size``, and ``sequence_id`` = ``first_sequence_id + index``
    unless that is None): byte for byte what protobuf writes (fields in number order, shortest
    varints). No Python statement per message: runs of ids sharing their varint's upper bytes
    are woven in C."""
    field3 = b"\x18" + uvarint(payload_size)
    if first_sequence_id is None:
        header = _U32.pack(len(field3)) + field3
        return header * count, [(count, len(header))]
    parts: list = []
    runs: list[tuple[int, int]] = []
    seq = first_sequence_id
    end = first_sequence_id + count
    while seq < end:
        if seq < 0x80:
            take = min(0x80, end) - seq
            head = _U32.pack(len(field3) + 2) + field3 + b"\x40"
            parts.extend(chain.from_iterable(zip(repeat(head, take),
                                                 SMALL_VARINTS[seq:seq + take])))
            runs.append((take, len(head) + 1))
        else:
            low = seq & 0x7F
            take = min(0x80 - low, end - seq)
            upper = uvarint(seq >> 7)
            head = _U32.pack(len(field3) + 2 + len(upper)) + field3 + b"\x40"
            parts.extend(chain.from_iterable(zip(repeat(head, take), _LOW_SEVEN[low:low + take],
                                                 repeat(upper, take))))
            runs.append((take, len(head) + 1 + len(upper)))
        seq += take
    return b"".join(parts), runs


def _plain_batch(data: bytes, count: int, first_sequence_id: int
                 ) -> tuple[pa.Array, pa.Array, int, int] | None:
    """(values, message headers, and their sizes in bytes) of a batch whose messages are all
    plain and of one payload size, with consecutive sequence ids from the entry's (written, or
    all absent), as a producer of plain messages batches them; None for any other batch (the
    caller takes the general path, which also reports malformed batches)."""
    size = len(data)
    if count < 1 or size < 6 or data[4] != 0x18:
        return None
    meta_size = _U32.unpack_from(data, 0)[0]
    if not 2 <= meta_size <= 22 or 4 + meta_size > size:
        return None
    # the first message's metadata: payload_size, then perhaps sequence_id, nothing else
    end = 4 + meta_size
    payload_size, pos = read_varint(data, 5, end)
    if payload_size is None:
        return None
    if pos == end:
        with_sequence = None
    elif data[pos] == 0x40 and end - pos - 1 == _varint_bytes(first_sequence_id):
        with_sequence = first_sequence_id
    else:
        return None
    headers, runs = _plain_headers(payload_size, with_sequence, count)
    # (ids past int64 are refused by the general path: it decides)
    if len(headers) + count * payload_size != size or first_sequence_id + count > 2**63:
        return None
    # the batch as 2 x count pieces: header, payload, header, ...; within a run of one header
    # length the piece ends step by one stride: filled a run at a time
    offsets = array("i", bytes(4 * (2 * count + 1)))
    index = pos = 0
    for taken, length in runs:
        stride = length + payload_size     # > 0: a header is at least 6 bytes
        end = pos + taken * stride
        if index + taken > count:
            return None
        # exactly ``taken`` piece ends each (a stop at ``end`` would drop the last header end
        # when payloads are empty: then it is ``end`` itself)
        offsets[2 * index + 1:2 * (index + taken):2] = array(
            "i", range(pos + length, pos + length + taken * stride, stride))
        offsets[2 * index + 2:2 * (index + taken) + 1:2] = array(
            "i", range(pos + stride, end + stride, stride))
        index += taken
        pos = end
    pieces = pa.Array.from_buffers(pa.binary(), 2 * count,
                                   [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    actual = pieces.take(_stride_indices(count, 0))
    # the headers' bytes, back to back, must be the plain ones exactly
    data_buffer = actual.buffers()[2]
    if data_buffer is None or data_buffer.size < len(headers) \
            or not data_buffer.slice(0, len(headers)).equals(pa.py_buffer(headers)):
        return None
    return pieces.take(_stride_indices(count, 1)), actual, count * payload_size, len(headers)


def _plain_batch_walk(data: bytes, count: int, first_sequence_id: int
                      ) -> tuple[pa.Array, pa.Array, int, int, pa.Array | None] | None:
    """What :func:`_plain_batch` returns, and the keys (None: no message has one), for
    messages of any payload sizes that carry nothing but a payload, perhaps their id (still
    ``entry's + index``) and perhaps a key (every message of the batch or none, under 128
    bytes, valid UTF-8, not flagged base64); varints in their shortest form. The batch is
    walked message by message, but only to find the pieces (a few integer operations each, no
    object per message); the columns are then cut by Arrow takes. None for any other batch."""
    end = len(data)
    if count < 1 or first_sequence_id + count > 2**63:
        return None
    offsets = array("i", [0])
    append = offsets.append
    keyed = end > 4 and data[4] == 0x12      # SingleMessageMetadata.partition_key first
    key_offsets = array("i")
    key_append = key_offsets.append
    pos = header_bytes = 0
    sequence_id = first_sequence_id
    for _ in range(count):
        if pos + 6 > end or data[pos] or data[pos + 1] or data[pos + 2]:
            return None
        meta_end = pos + 4 + data[pos + 3]
        q = pos + 4
        if keyed:
            if data[q] != 0x12:
                return None
            key_end = q + 2 + data[q + 1]
            if data[q + 1] >= 0x80 or key_end + 2 > meta_end:
                return None
            key_append(q + 2)
            key_append(key_end)
            q = key_end
        if meta_end < q + 2 or meta_end > end or data[q] != 0x18:
            return None
        payload_size = data[q + 1]
        p = q + 2
        if payload_size >= 0x80:
            shift = 7
            payload_size &= 0x7F
            while True:
                if p >= meta_end or shift > 28:
                    return None
                byte = data[p]
                p += 1
                payload_size |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
            if byte == 0:           # not the shortest form
                return None
        if p != meta_end:
            if data[p] != 0x40:
                return None
            written = uvarint(sequence_id)
            if data[p + 1:meta_end] != written:
                return None
        if meta_end + payload_size > end:
            return None
        append(meta_end)
        header_bytes += meta_end - pos
        pos = meta_end + payload_size
        append(pos)
        sequence_id += 1
    if pos != end:
        return None
    pieces = pa.Array.from_buffers(pa.binary(), 2 * count,
                                   [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    headers = pieces.take(_stride_indices(count, 0))
    values = pieces.take(_stride_indices(count, 1))
    keys = None
    if keyed:
        # key, gap, key, ...: 2 x count - 1 pieces, the keys at the even ones
        key_pieces = pa.Array.from_buffers(pa.binary(), 2 * count - 1,
                                           [None, pa.py_buffer(key_offsets), pa.py_buffer(data)])
        try:
            keys = key_pieces.take(_stride_indices(count, 0)).cast(pa.string())
        except pa.ArrowInvalid:          # not UTF-8: the general path decides
            return None
    return values, headers, end - header_bytes, header_bytes, keys


__all__ = ["PlainBatch", "plain_batch_columns"]
