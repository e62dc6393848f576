"""The ONE entry codec: what a stored entry holds, shared by broker, offloader, Spark source and
client.

An entry is the producer's bytes, verbatim: ``[u32 meta_size][MessageMetadata][payload]``.
``payload`` is compressed as a whole (``MessageMetadata.compression``). A batched entry
(``num_messages_in_batch`` present) holds, once decompressed, N x
``[u32 size][SingleMessageMetadata][payload_size bytes]``.

- :func:`peek_metadata` parses the metadata only (no decompression): message count, keys,
  publish time -- all the broker needs (~3 us here).
- :func:`unpack_entry` yields the messages, decompressing and splitting batches.
- :func:`build_entry` / :func:`build_batch_entry` do the reverse, byte-compatible with the
  official clients (LZ4 raw block, zlib, zstd frame, raw snappy).
- :func:`uncompressed_entry_header`, :func:`batch_message_headers`: the bytes a rebuilt,
  uncompressed entry is made of (the tier format keeps them); :func:`read_varint`,
  :func:`parse_metadata_unchecked`, :func:`has_unknown_fields`, :func:`frame_entry`: the
  pieces for readers that decode batches column-wise (:mod:`pulsarlite.wire.columnar`).
"""

from __future__ import annotations

import enum
import itertools
import operator
import struct
import threading
import zlib
from types import MappingProxyType
from typing import Iterable, Mapping, NamedTuple, Sequence

import cramjam
import lz4.block
import zstandard
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.errors import PulsarliteError
from pulsarlite.varint import SMALL_VARINTS, uvarint

_U32 = struct.Struct(">I")
_NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})
_COMPRESSION_FIELD = pb.MessageMetadata.DESCRIPTOR.fields_by_name["compression"].number

# A batch or message may not claim to decompress to more than this by default (a producer's
# uncompressed_size is input from outside: bound it before allocating).
UNCOMPRESSED_BYTES_MAX_DEFAULT = 64 * 1024 * 1024
ZSTD_LEVEL = 3          # what the official clients use
ZLIB_LEVEL = 6          # zlib's (and java.util.zip.Deflater's) default


class EntryFormatError(PulsarliteError):
    """Entry bytes that do not decode: bad sizes, metadata that does not parse, a payload that
    does not decompress to its announced size, a truncated batch, an unknown codec."""


class Compression(enum.IntEnum):
    NONE = pb.NONE
    LZ4 = pb.LZ4
    ZLIB = pb.ZLIB
    ZSTD = pb.ZSTD
    SNAPPY = pb.SNAPPY


# ---------------------------------------------------------------------------------------------
# Compression
# ---------------------------------------------------------------------------------------------

_local = threading.local()   # zstandard (de)compressors are not safe to share across threads


def _zstd_compressor() -> zstandard.ZstdCompressor:
    c = getattr(_local, "zc", None)
    if c is None:
        c = _local.zc = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return c


def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "zd", None)
    if d is None:
        d = _local.zd = zstandard.ZstdDecompressor()
    return d


def compress(data: bytes | memoryview, compression: Compression | int) -> bytes:
    """Compress ``data`` as the Pulsar clients do for ``compression``."""
    compression = Compression(compression)
    if compression is Compression.NONE:
        return bytes(data)
    if compression is Compression.LZ4:
        return lz4.block.compress(data, store_size=False)
    if compression is Compression.ZLIB:
        return zlib.compress(data, ZLIB_LEVEL)
    if compression is Compression.ZSTD:
        return _zstd_compressor().compress(data)
    return bytes(cramjam.snappy.compress_raw(data))


def decompress(data: bytes | memoryview, compression: Compression | int, uncompressed_size: int,
               *, uncompressed_bytes_max: int = UNCOMPRESSED_BYTES_MAX_DEFAULT
               ) -> bytes | memoryview:
    """Decompress to exactly ``uncompressed_size`` bytes (the metadata's), else
    EntryFormatError. NONE returns ``data`` itself (no copy)."""
    try:
        compression = Compression(compression)
    except ValueError:
        raise EntryFormatError(f"unknown compression type {compression}") from None
    if compression is Compression.NONE:
        return data
    if not 0 <= uncompressed_size <= uncompressed_bytes_max:
        raise EntryFormatError(f"uncompressed size {uncompressed_size} outside "
                               f"[0, {uncompressed_bytes_max}]")
    try:
        if compression is Compression.LZ4:
            out = lz4.block.decompress(data, uncompressed_size=uncompressed_size)
        elif compression is Compression.ZLIB:
            d = zlib.decompressobj()
            out = d.decompress(data, uncompressed_size + 1)
            if not d.eof or d.unused_data:
                raise EntryFormatError("zlib stream is truncated, longer than announced, or "
                                       "followed by garbage")
        elif compression is Compression.ZSTD:
            announced = zstandard.frame_content_size(data)
            if announced not in (-1, uncompressed_size):   # -1: the frame does not say
                raise EntryFormatError(f"zstd frame announces {announced} bytes, metadata says "
                                       f"{uncompressed_size}")
            out = _zstd_decompressor().decompress(data, max_output_size=max(1, uncompressed_size))
        else:
            if cramjam.snappy.decompress_raw_len(data) != uncompressed_size:
                raise EntryFormatError("snappy block does not announce the metadata's size")
            out = bytearray(uncompressed_size)
            cramjam.snappy.decompress_raw_into(data, out)
    except EntryFormatError:
        raise
    except Exception as exc:  # each library raises its own kinds (LZ4BlockError, ZstdError, ...)
        raise EntryFormatError(f"{compression.name} payload does not decompress: {exc}") from None
    if len(out) != uncompressed_size:
        raise EntryFormatError(f"{compression.name} payload decompressed to {len(out)} bytes, "
                               f"metadata says {uncompressed_size}")
    return out


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

class EntryMetadata(NamedTuple):
    """What a stored entry's MessageMetadata says, read lazily from the parsed protobuf ``raw``
    (an immutable view: building it costs one tuple, each property a field read). ``raw``
    serves the rare fields not exposed here (encryption, chunking, replication)."""

    raw: pb.MessageMetadata
    payload_offset: int            # 4 + meta_size: the (compressed) payload starts here

    @property
    def batched(self) -> bool:
        """num_messages_in_batch is present (even a batch of one message)."""
        return self.raw.HasField("num_messages_in_batch")

    @property
    def message_count(self) -> int:
        raw = self.raw
        return raw.num_messages_in_batch if raw.HasField("num_messages_in_batch") else 1

    @property
    def publish_time_ms(self) -> int:
        return self.raw.publish_time

    @property
    def event_time_ms(self) -> int | None:
        """None when unset (0 on the wire)."""
        return self.raw.event_time or None

    @property
    def producer_name(self) -> str:
        return self.raw.producer_name

    @property
    def sequence_id(self) -> int:
        return self.raw.sequence_id

    @property
    def highest_sequence_id(self) -> int:
        """0 when unset."""
        return self.raw.highest_sequence_id

    @property
    def key(self) -> str | None:
        """The partition key; a batch carries its first message's."""
        raw = self.raw
        return raw.partition_key if raw.HasField("partition_key") else None

    @property
    def key_b64_encoded(self) -> bool:
        return self.raw.partition_key_b64_encoded

    @property
    def ordering_key(self) -> bytes | None:
        raw = self.raw
        return raw.ordering_key if raw.HasField("ordering_key") else None

    @property
    def dispatch_key(self) -> bytes | None:
        """The key Key_Shared dispatch hashes: ordering key, else the partition key's bytes."""
        raw = self.raw
        if raw.HasField("ordering_key"):
            return raw.ordering_key
        if not raw.HasField("partition_key"):
            return None
        key = raw.partition_key      # bytes when they are not UTF-8 (python protobuf, proto2)
        return key if isinstance(key, bytes) else key.encode()

    @property
    def null_value(self) -> bool:
        return self.raw.null_value

    @property
    def properties(self) -> dict[str, str]:
        return {kv.key: kv.value for kv in self.raw.properties}

    @property
    def schema_version(self) -> bytes | None:
        raw = self.raw
        return raw.schema_version if raw.HasField("schema_version") else None

    @property
    def compression(self) -> int:
        """A Compression value (an int: it may be one we do not know)."""
        return self.raw.compression

    @property
    def uncompressed_size(self) -> int:
        return self.raw.uncompressed_size

    @property
    def encrypted(self) -> bool:
        return len(self.raw.encryption_keys) > 0


def _parse_metadata(entry: bytes | memoryview) -> tuple[pb.MessageMetadata, int]:
    size = len(entry)
    if size < 4:
        raise EntryFormatError(f"entry of {size} bytes has no metadata size")
    meta_size = _U32.unpack_from(entry, 0)[0]
    if meta_size > size - 4:
        raise EntryFormatError(f"metadata size {meta_size} overruns an entry of {size} bytes")
    try:
        # upb parses bytes about twice as fast as a memoryview; metadata is small: copy it
        meta = entry[4:4 + meta_size]
        raw = _parse_message_metadata(meta if type(meta) is bytes else bytes(meta))
    except DecodeError as exc:
        raise EntryFormatError(f"message metadata does not parse: {exc}") from None
    # the required fields (checked by hand: IsInitialized() costs more than the parse)
    if not (raw.HasField("publish_time") and raw.HasField("sequence_id")
            and raw.HasField("producer_name")):
        raise EntryFormatError("message metadata lacks required fields "
                               "(producer_name, sequence_id, publish_time)")
    return raw, 4 + meta_size


_parse_message_metadata = pb.MessageMetadata.FromString


def parse_metadata_unchecked(entry: bytes | memoryview) -> EntryMetadata | None:
    """The entry's metadata if its framing holds and it parses, required fields NOT checked
    (for estimates from what an entry declares, e.g. the tier writer's row group sizes); None
    otherwise. Anything that decodes messages uses :func:`peek_metadata` /
    :func:`split_entry`."""
    size = len(entry)
    if size < 4:
        return None
    meta_size = _U32.unpack_from(entry, 0)[0]
    if meta_size > size - 4:
        return None
    meta = entry[4:4 + meta_size]
    try:
        raw = _parse_message_metadata(meta if type(meta) is bytes else bytes(meta))
    except DecodeError:
        return None
    return EntryMetadata(raw, 4 + meta_size)


def split_entry(entry: bytes | memoryview) -> tuple[EntryMetadata, memoryview]:
    """``[u32 meta_size][MessageMetadata][payload]`` -> (metadata, view of the payload as
    stored, i.e. still compressed)."""
    raw, offset = _parse_metadata(entry)
    view = entry if isinstance(entry, memoryview) else memoryview(entry)
    return EntryMetadata(raw, offset), view[offset:]


SINGLE_MESSAGE_BYTES_MIN = 6     # in a batch: u32 size + SingleMessageMetadata's payload_size (2 bytes)
_INT32_LIMIT = 1 << 31
_HIGH_BYTES = bytes(range(0x80, 0x100))    # translate(None, _HIGH_BYTES) keeps bytes < 0x80


def check_sendable(entry: bytes | memoryview, meta: EntryMetadata, *,
                   uncompressed_bytes_max: int = UNCOMPRESSED_BYTES_MAX_DEFAULT) -> None:
    """EntryFormatError unless the official clients can read the entry a producer sends
    (checked where a SEND enters the broker; readers of stored entries bound their own work):

    - its MessageMetadata is fully initialized, nested messages included (a property without
      its value: the C++ client's parse fails on every delivery and its consumers reconnect
      for ever on that entry);
    - a batch holds 1 .. (uncompressed payload / 6) messages (a count of 2^31 wraps negative in
      counters, one of 2^31 - 1 crashes the official C++ consumer), and a compressed payload
      declares an uncompressed size within the limit;
    - a batch's framing holds: exactly ``num_messages_in_batch`` x ``[u32 size]
      [SingleMessageMetadata][payload_size bytes]``, each in bounds, each metadata parsing
      and initialized, nothing left over (the C++ client trusts it: it reads out of bounds,
      or crashes). A compressed batch is decompressed first (bounded by
      ``uncompressed_bytes_max``; docs/decisions.md "SEND checks"). An encrypted batch is
      ciphertext: only its framing's declared sizes are checked;
    - a compressed single message decompresses to its declared size (the C++ consumer's
      decoders trust it and may crash); a chunk's fields are consistent (``_check_chunk``).
    """
    raw = meta.raw
    if not raw.IsInitialized():
        raise EntryFormatError("message metadata is not fully initialized: missing "
                               + ", ".join(raw.FindInitializationErrors()))
    batched = raw.HasField("num_messages_in_batch")
    compression = raw.compression
    chunks = raw.num_chunks_from_msg
    if chunks > 1:
        # a fragment of a larger message: its fields are all there is to check here. Its
        # uncompressed_size is the whole message's (beyond the entry's limit when that is why
        # it was chunked): the consumer decompresses the joined chunks, bounded by its own
        # limits (the official consumers and ours), as Pulsar's broker leaves it to them.
        _check_chunk(raw, len(entry) - meta.payload_offset, batched)
        if compression and not raw.uncompressed_size < _INT32_LIMIT:
            raise EntryFormatError(f"declared uncompressed size {raw.uncompressed_size} of a chunked "
                                   f"message is beyond {_INT32_LIMIT - 1}")
        return
    if not compression:
        if not batched:
            return                             # one plain message: nothing declared to check
        size = len(entry) - meta.payload_offset
    else:
        size = raw.uncompressed_size
        if not 0 <= size <= uncompressed_bytes_max:
            raise EntryFormatError(f"declared uncompressed size {size} is outside [0, {uncompressed_bytes_max}]")
    if not batched:
        if not raw.encryption_keys and chunks <= 1:
            # the official C++ consumer's decoders trust the declared size (LZ4_decompress_fast,
            # snappy's unchecked sink): a payload that does not decompress to it may crash it
            # (fuzz findings poison-lz4, poison-codec): decompress it here (bounded), as for a
            # batch. A chunk is a fragment (decompressed whole once reassembled) and ciphertext
            # is opaque: neither can be checked here.
            decompress(entry[meta.payload_offset:], compression, size, uncompressed_bytes_max=uncompressed_bytes_max)
        return
    count = raw.num_messages_in_batch
    count_max = max(1, size // SINGLE_MESSAGE_BYTES_MIN)
    if not 1 <= count <= count_max:
        raise EntryFormatError(f"batch message count {count} is impossible for {size} payload bytes "
                               f"(1..{count_max})")
    if raw.num_chunks_from_msg > 1:
        raise EntryFormatError("a batch cannot be a chunk of a larger message")
    if raw.encryption_keys:
        return                                 # ciphertext: its consumers decrypt, then split
    payload = entry[meta.payload_offset:]
    if compression:
        payload = decompress(payload, compression, size, uncompressed_bytes_max=uncompressed_bytes_max)
    check_batch_framing(payload if type(payload) is bytes else bytes(payload), count)


def _check_chunk(raw, payload_bytes: int, batched: bool) -> None:
    """A chunk of a larger message (num_chunks_from_msg > 1) as the official producers write
    one: not a batch, a uuid naming the message, 0 <= chunk_id < num_chunks_from_msg, and a
    total_chunk_msg_size that holds this chunk and at least one byte per chunk. The C++
    consumer sizes its reassembly buffer by these fields and copies each chunk into it
    unchecked (fuzz finding poison-chunk: a lone chunk claiming 272,608,922 chunks of a
    0-byte message crashed it)."""
    chunks = raw.num_chunks_from_msg
    if batched:
        raise EntryFormatError("a batch cannot be a chunk of a larger message")
    if not raw.uuid:
        raise EntryFormatError("a chunk without the uuid of its message")
    if not 0 <= raw.chunk_id < chunks:
        raise EntryFormatError(f"chunk id {raw.chunk_id} outside [0, {chunks})")
    total = raw.total_chunk_msg_size
    if not (chunks <= total and payload_bytes <= total):
        raise EntryFormatError(f"a chunk of {payload_bytes} bytes, one of {chunks}, does not fit a "
                               f"message of {total} bytes")


def check_batch_framing(data: bytes, count: int) -> None:
    """EntryFormatError unless ``data`` (an uncompressed batch) is exactly ``count`` x
    ``[u32 size][SingleMessageMetadata][payload_size bytes]``, each in bounds, each metadata
    parsing and fully initialized, nothing left over. A plain message's metadata (payload_size,
    perhaps sequence_id: what producers of plain messages send) is checked by hand, byte by
    byte as protobuf would decode it; any other goes through protobuf's parse."""
    if _is_uniform_batch(data, count):
        return
    pos = 0
    end = len(data)
    unpack_u32 = _U32.unpack_from
    for index in range(count):
        p = pos + 4
        if p > end:
            raise EntryFormatError(f"batch truncated before message {index} of {count}")
        meta_end = p + unpack_u32(data, pos)[0]
        if meta_end > end:
            raise EntryFormatError(f"message {index}: metadata of {meta_end - p} bytes overruns the batch")
        if meta_end - p >= 2 and data[p] == 0x18:
            # payload_size (field 3, varint), then perhaps sequence_id (field 8, varint) ending
            # exactly at meta_end: [0x40][n - 2 bytes >= 0x80][one byte < 0x80]
            payload_size = data[p + 1]
            q = p + 2
            if payload_size >= 0x80:
                payload_size, q = read_varint(data, p + 1, meta_end)
                if payload_size is None or payload_size >= _INT32_LIMIT:
                    q = -1                     # protobuf's parse below decides
            if q != meta_end and q > 0 and data[q] == 0x40 and data[meta_end - 1] < 0x80:
                n = meta_end - q
                if n == 4:                     # ids 2^14 .. 2^21: the usual
                    if data[q + 1] >= 0x80 and data[q + 2] >= 0x80:
                        q = meta_end
                elif n == 3:
                    if data[q + 1] >= 0x80:
                        q = meta_end
                elif n == 2 or 5 <= n <= 10 and not data[q + 1:meta_end - 1].translate(None, _HIGH_BYTES):
                    q = meta_end
            if q == meta_end:
                pos = meta_end + payload_size
                if pos > end:
                    raise EntryFormatError(f"message {index}: payload of {payload_size} bytes overruns the batch")
                continue
        try:
            single = _parse_single_metadata(data[p:meta_end])
        except DecodeError as exc:
            raise EntryFormatError(f"message {index}: metadata does not parse: {exc}") from None
        if not single.IsInitialized():
            raise EntryFormatError(f"message {index}: metadata is not fully initialized: missing "
                                   + ", ".join(single.FindInitializationErrors()))
        payload_size = single.payload_size
        if not 0 <= payload_size <= end - meta_end:
            raise EntryFormatError(f"message {index}: payload of {payload_size} bytes overruns the batch")
        pos = meta_end + payload_size
    if pos != end:
        raise EntryFormatError(f"{end - pos} bytes left after the {count} messages of the batch")


def _is_uniform_batch(data: bytes, count: int) -> bool:
    """True if ``data`` is ``count`` plain messages of one shape: each ``[u32 size][0x18
    varint(payload_size)][0x40 varint(sequence_id)]`` (the sequence id optional) with the same
    size, payload size and sequence id varint length as the first, payloads in between -- what
    producers of fixed-size messages batch. Checked column by column on strided slices (C loops):
    ~2 us for 100 messages instead of ~30 us message by message. False: not known, walk it."""
    end = len(data)
    if count < 2 or end < 6 or data[4] != 0x18:
        return False
    meta_size = _U32.unpack_from(data, 0)[0]
    payload_size, q = read_varint(data, 5, min(end, 4 + meta_size))
    if payload_size is None or payload_size >= _INT32_LIMIT:
        return False
    stride = 4 + meta_size + payload_size
    if stride * count != end:
        return False
    seq_bytes = 4 + meta_size - q - 1         # sequence_id's varint after its 0x40 tag
    if seq_bytes == -1:
        constant = q                           # no sequence id: [u32][0x18 varint] only
    elif 1 <= seq_bytes <= 9 and data[q] == 0x40:
        constant = q + 1
    else:
        return False
    for k in range(constant):                  # the same size, tags and payload size in each
        if data[k::stride] != data[k:k + 1] * count:
            return False
    if seq_bytes > 0:
        last = constant + seq_bytes - 1        # continuation bits set before the last byte only
        if not data[last::stride].isascii():
            return False
        for k in range(constant, last):
            if data[k::stride].translate(None, _HIGH_BYTES):
                return False
    return True


_parse_single_metadata = pb.SingleMessageMetadata.FromString


def peek_metadata(entry: bytes | memoryview) -> EntryMetadata:
    """The entry's metadata; never touches (or decompresses) the payload."""
    raw, offset = _parse_metadata(entry)
    return EntryMetadata(raw, offset)


class Message(NamedTuple):
    """One message: read out of an entry by :func:`unpack_entry`, or given to
    :func:`build_entry` / :func:`build_batch_entry` (which ignore ``batch_index``). A named
    tuple, not a dataclass: batches unpack into many of these, and tuples build ~5x faster.

    ``batch_index`` is -1 for a message that is a whole (non-batched) entry. ``null_value``
    marks a message sent with no value at all (a tombstone), as opposed to an empty one.
    ``sequence_id`` is the producer's; when reading a batch whose messages do not carry one,
    it is the entry's sequence id plus the batch index (as the official clients compute it).
    ``properties`` is a dict when read (treat it as read-only); any mapping when building.
    """

    payload: bytes | memoryview = b""
    key: str | None = None
    key_b64_encoded: bool = False
    ordering_key: bytes | None = None
    properties: Mapping[str, str] = _NO_PROPERTIES
    event_time_ms: int | None = None
    sequence_id: int | None = None
    null_value: bool = False
    null_key: bool = False
    compacted_out: bool = False
    batch_index: int = -1


def unpack_entry(entry: bytes | memoryview, *,
                 uncompressed_bytes_max: int = UNCOMPRESSED_BYTES_MAX_DEFAULT,
                 ) -> tuple[EntryMetadata, list[Message]]:
    """Decompress the entry and split its batch: (metadata, messages in batch order).
    Payloads are views into one decompressed buffer (no per-message copy)."""
    metadata, payload = split_entry(entry)
    raw = metadata.raw
    if raw.encryption_keys:
        raise EntryFormatError("entry is encrypted; pulsarlite does not decrypt")
    compression = raw.compression
    if compression == pb.NONE and not raw.HasField("compression"):
        # proto2 enums are closed: a codec newer than ours parses as "unset" (NONE) and its
        # value lands among the unknown fields. Never hand out such a payload as plain bytes.
        for unknown in UnknownFieldSet(raw):
            if unknown.field_number == _COMPRESSION_FIELD:
                raise EntryFormatError(f"unknown compression type {unknown.data}")
    if raw.num_chunks_from_msg > 1:
        # a chunk: a fragment of the message's (compressed) payload, handed out as it is
        # stored; unpack_chunked decodes the message once its chunks are joined
        view = payload if isinstance(payload, memoryview) else memoryview(payload)
        return metadata, [Message(view, metadata.key, raw.partition_key_b64_encoded,
                                  metadata.ordering_key,
                                  metadata.properties if raw.properties else _NO_PROPERTIES,
                                  raw.event_time or None, raw.sequence_id, raw.null_value,
                                  raw.null_partition_key)]
    data = decompress(payload, compression, raw.uncompressed_size,
                      uncompressed_bytes_max=uncompressed_bytes_max)
    if not raw.HasField("num_messages_in_batch"):
        view = data if isinstance(data, memoryview) else memoryview(data)
        return metadata, [Message(
            view, metadata.key, raw.partition_key_b64_encoded, metadata.ordering_key,
            metadata.properties if raw.properties else _NO_PROPERTIES,
            raw.event_time or None, raw.sequence_id, raw.null_value, raw.null_partition_key)]
    # One copy of an uncompressed batch to bytes: upb parses bytes slices twice as fast.
    return metadata, _split_batch(data if type(data) is bytes else bytes(data), raw)


_CHUNK_FIELDS = ("uuid", "chunk_id", "num_chunks_from_msg", "total_chunk_msg_size")


def unpack_chunked(first: pb.MessageMetadata, payload: bytes, *,
                   uncompressed_bytes_max: int = UNCOMPRESSED_BYTES_MAX_DEFAULT,
                   ) -> tuple[EntryMetadata, list[Message]]:
    """A chunked message, whole: ``first`` the metadata of its first chunk, ``payload`` its
    chunks' payloads joined (compressed as the producer compressed the whole message). As
    :func:`unpack_entry` for one entry holding that message (the chunk fields cleared)."""
    raw = pb.MessageMetadata()
    raw.CopyFrom(first)
    for name in _CHUNK_FIELDS:
        raw.ClearField(name)
    if raw.HasField("num_messages_in_batch"):
        raise EntryFormatError("a batch cannot be a chunk of a larger message")
    return unpack_entry(frame_entry(raw, payload), uncompressed_bytes_max=uncompressed_bytes_max)


def has_unknown_fields(raw: pb.MessageMetadata) -> bool:
    """The metadata holds fields our protobuf does not know (e.g. a newer codec's compression
    value, which a proto2 closed enum parses as "unset" and keeps there)."""
    return len(UnknownFieldSet(raw)) > 0


def uncompressed_entry_header(entry: bytes | memoryview, metadata: EntryMetadata) -> bytes:
    """``[u32 meta_size][MessageMetadata]`` of ``entry`` as it reads once its payload is
    decompressed: the stored bytes verbatim when the entry is not compressed, else the
    metadata with ``compression`` cleared (``uncompressed_size`` then is the payload's real
    size). Followed by the uncompressed payload, it is an entry every reader decodes to the
    same messages."""
    raw = metadata.raw
    if raw.compression == pb.NONE:
        return bytes(entry[:metadata.payload_offset])
    plain = pb.MessageMetadata()
    plain.CopyFrom(raw)
    plain.ClearField("compression")
    meta = plain.SerializeToString()
    return _U32.pack(len(meta)) + meta


def batch_message_headers(data: bytes, messages: Sequence[Message]) -> list[bytes] | None:
    """Each message's ``[u32 size][SingleMessageMetadata]`` verbatim, cut from ``data``, the
    uncompressed batch :func:`unpack_entry` split into ``messages`` (their payloads give the
    lengths); None when the framing does not match the messages (then they are not that
    batch's)."""
    headers = []
    append = headers.append
    unpack_u32 = _U32.unpack_from
    pos = 0
    end = len(data)
    for message in messages:
        if pos + 4 > end:
            return None
        header_end = pos + 4 + unpack_u32(data, pos)[0]
        append(data[pos:header_end])
        pos = header_end + len(message.payload)
    return headers if pos == end else None


def read_varint(data: bytes, pos: int, end: int) -> tuple[int | None, int]:
    """A protobuf varint of at most 10 bytes at ``pos`` (before ``end``): (value, next
    position), or (None, position reached) when it does not end in time. For the batch
    framing decoded by hand (here and in :mod:`pulsarlite.wire.columnar`)."""
    result = 0
    shift = 0
    limit = min(end, pos + 10)
    while pos < limit:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    return None, pos


def _split_batch(data: bytes, raw: pb.MessageMetadata) -> list[Message]:
    count = raw.num_messages_in_batch
    if count < 0:
        raise EntryFormatError(f"batch of {count} messages")
    first_sequence_id = raw.sequence_id
    messages = []
    append = messages.append
    view = memoryview(data)
    pos = 0
    end = len(data)
    parse = pb.SingleMessageMetadata.FromString
    unpack_u32 = _U32.unpack_from
    for index in range(count):
        if end - pos < 4:
            raise EntryFormatError(f"batch truncated before message {index} of {count}")
        size = unpack_u32(data, pos)[0]
        pos += 4
        if size > end - pos:
            raise EntryFormatError(f"message {index}: metadata of {size} bytes overruns the batch")
        if 2 <= size <= 22 and data[pos] == 0x18:
            # Fast path for the common plain message, whose metadata holds only payload_size
            # (field 3) and perhaps sequence_id (field 8): decode the two varints by hand
            # (~2x faster than parsing; anything else takes the protobuf path below).
            meta_end = pos + size
            payload_size = data[pos + 1]
            if payload_size < 0x80:
                p = pos + 2
            else:
                payload_size, p = read_varint(data, pos + 1, meta_end)
            sequence_id = first_sequence_id + index
            if p < meta_end and data[p] == 0x40:
                q = p + 1
                if q + 2 < meta_end and data[q] >= 0x80 and data[q + 1] >= 0x80 \
                        and data[q + 2] < 0x80:   # 3 bytes, the usual size: inline
                    sequence_id = ((data[q] & 0x7F) | ((data[q + 1] & 0x7F) << 7)
                                   | (data[q + 2] << 14))
                    p = q + 3
                else:
                    sequence_id, p = read_varint(data, q, meta_end)
            if p == meta_end and payload_size is not None and sequence_id is not None:
                if payload_size > end - meta_end:
                    raise EntryFormatError(f"message {index}: payload of {payload_size} bytes "
                                           "overruns the batch")
                append(Message(view[meta_end:meta_end + payload_size], None, False, None,
                               _NO_PROPERTIES, None, sequence_id, False, False, False, index))
                pos = meta_end + payload_size
                continue
        try:
            single = parse(data[pos:pos + size])
        except DecodeError as exc:
            raise EntryFormatError(f"message {index}: metadata does not parse: {exc}") from None
        if not single.HasField("payload_size"):
            raise EntryFormatError(f"message {index}: metadata lacks payload_size")
        pos += size
        payload_size = single.payload_size
        if not 0 <= payload_size <= end - pos:
            raise EntryFormatError(f"message {index}: payload of {payload_size} bytes overruns "
                                   "the batch")
        append(Message(
            view[pos:pos + payload_size],
            single.partition_key if single.HasField("partition_key") else None,
            single.partition_key_b64_encoded,
            single.ordering_key if single.HasField("ordering_key") else None,
            {kv.key: kv.value for kv in single.properties} if single.properties
            else _NO_PROPERTIES,
            single.event_time or None,
            single.sequence_id if single.HasField("sequence_id") else first_sequence_id + index,
            single.null_value,
            single.null_partition_key,
            single.compacted_out,
            index,
        ))
        pos += payload_size
    if pos != end:
        raise EntryFormatError(f"{end - pos} bytes left after the {count} messages of the batch")
    return messages


# ---------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------

def _key_values(properties: Mapping[str, str] | None) -> list[pb.KeyValue]:
    return [pb.KeyValue(key=k, value=v) for k, v in properties.items()] if properties else []


def _set_message_fields(metadata, message: Message) -> None:
    """The per-message fields MessageMetadata and SingleMessageMetadata share (same names):
    key, its base64 flag, null key, ordering key, event time, null value."""
    if message.key is not None:
        metadata.partition_key = message.key
        if message.key_b64_encoded:
            metadata.partition_key_b64_encoded = True
    if message.null_key:
        metadata.null_partition_key = True
    if message.ordering_key is not None:
        metadata.ordering_key = message.ordering_key
    if message.event_time_ms:
        metadata.event_time = message.event_time_ms
    if message.null_value:
        metadata.null_value = True


def frame_entry(metadata: pb.MessageMetadata, payload: bytes) -> bytes:
    """``[u32 meta_size][metadata][payload]``: an entry of ``metadata`` (which must hold the
    required fields: protobuf's EncodeError otherwise) and ``payload`` as stored (compressed
    already if the metadata says so)."""
    meta = metadata.SerializeToString()
    return _U32.pack(len(meta)) + meta + payload


def _unbatched_metadata(message: Message, raw: bytes, *, producer_name: str, sequence_id: int,
                        publish_time_ms: int, compression: Compression | int,
                        schema_version: bytes | None) -> pb.MessageMetadata:
    """The metadata of a non-batched entry holding ``message`` (payload ``raw``, uncompressed)."""
    metadata = pb.MessageMetadata(
        producer_name=producer_name, sequence_id=sequence_id, publish_time=publish_time_ms,
        properties=_key_values(message.properties), uncompressed_size=len(raw))
    _set_message_fields(metadata, message)
    if compression:
        metadata.compression = int(compression)
    if schema_version is not None:
        metadata.schema_version = schema_version
    return metadata


def build_entry(message: Message, *, producer_name: str, sequence_id: int, publish_time_ms: int,
                compression: Compression | int = Compression.NONE,
                schema_version: bytes | None = None,
                highest_sequence_id: int | None = None) -> bytes:
    """A non-batched entry holding ``message`` (its batch_index is ignored)."""
    raw = bytes(message.payload)
    metadata = _unbatched_metadata(message, raw, producer_name=producer_name, sequence_id=sequence_id,
                                   publish_time_ms=publish_time_ms, compression=compression,
                                   schema_version=schema_version)
    if highest_sequence_id is not None:
        metadata.highest_sequence_id = highest_sequence_id
    return frame_entry(metadata, compress(raw, compression))


def build_chunk_entries(message: Message, *, producer_name: str, sequence_id: int,
                        publish_time_ms: int, entry_bytes_max: int,
                        compression: Compression | int = Compression.NONE,
                        schema_version: bytes | None = None) -> list[bytes]:
    """``message`` as Pulsar's chunking producers write it: the payload compressed whole, then
    cut into entries of at most ``entry_bytes_max`` bytes each (metadata included), every one
    with the message's metadata and sequence id plus ``uuid`` (``<producer>-<sequence id>``),
    ``chunk_id``, ``num_chunks_from_msg`` and ``total_chunk_msg_size`` (the compressed size).
    One entry, unchunked, when the message fits."""
    raw = bytes(message.payload)
    metadata = _unbatched_metadata(message, raw, producer_name=producer_name, sequence_id=sequence_id,
                                   publish_time_ms=publish_time_ms, compression=compression,
                                   schema_version=schema_version)
    payload = compress(raw, compression)
    if 4 + metadata.ByteSize() + len(payload) <= entry_bytes_max and len(raw) <= entry_bytes_max:
        return [frame_entry(metadata, payload)]
    # Chunked also when only the uncompressed size is too large (Pulsar's producers chunk by the
    # compressed size only): a broker may refuse a single message declaring more than its
    # maximum uncompressed (ours does: it decompresses single messages to check them), never
    # a chunk (docs/decisions.md, "Chunking"). Hence at least two chunks.
    metadata.uuid = f"{producer_name}-{sequence_id}"
    # the largest the chunk fields can encode to (int32 fields: 5-byte varints at most)
    metadata.chunk_id = metadata.num_chunks_from_msg = metadata.total_chunk_msg_size = _INT32_LIMIT - 1
    chunk_bytes = entry_bytes_max - 4 - metadata.ByteSize()
    if chunk_bytes < 1:
        raise ValueError(f"the metadata alone ({metadata.ByteSize()} bytes) leaves no room for a "
                         f"chunk in {entry_bytes_max} bytes")
    chunk_bytes = min(chunk_bytes, max(1, -(-len(payload) // 2)))
    chunks = -(-len(payload) // chunk_bytes)
    if len(payload) < 2:
        raise ValueError("a message compressed to under 2 bytes cannot be chunked")
    if len(payload) >= _INT32_LIMIT:
        raise ValueError(f"a chunked message holds at most {_INT32_LIMIT - 1} bytes")
    metadata.num_chunks_from_msg = chunks
    metadata.total_chunk_msg_size = len(payload)
    view = memoryview(payload)
    out = []
    for chunk_id in range(chunks):
        metadata.chunk_id = chunk_id
        out.append(frame_entry(metadata, bytes(view[chunk_id * chunk_bytes:(chunk_id + 1) * chunk_bytes])))
    return out


def _single_metadata(message: Message, payload_size: int, sequence_id: int | None) -> bytes:
    """A SingleMessageMetadata through protobuf: the general encoder (every field)."""
    single = pb.SingleMessageMetadata(payload_size=payload_size,
                                      properties=_key_values(message.properties))
    _set_message_fields(single, message)
    if sequence_id is not None:
        single.sequence_id = sequence_id
    if message.compacted_out:
        single.compacted_out = True
    return single.SerializeToString()


_U64_LIMIT = 1 << 64


def _plain_heads(size: int) -> tuple[bytes, bytes, bytes, bytes]:
    """For a plain message of ``size`` payload bytes: ``[u32 meta size][0x18 varint(size)]``
    (no sequence id), and ``[u32 meta size][0x18 varint(size)][0x40]`` for a sequence id whose
    varint takes 1, 2 or 3 bytes -- SingleMessageMetadata{payload_size: 3, sequence_id: 8},
    fields in number order, as protobuf writes them."""
    field3 = b"\x18" + uvarint(size)
    return (_U32.pack(len(field3)) + field3,
            *(_U32.pack(len(field3) + 1 + n) + field3 + b"\x40" for n in (1, 2, 3)))


_PLAIN_HEADS_CACHE: dict[int, tuple[bytes, bytes, bytes, bytes]] = {}
_PLAIN_HEADS_CACHE_MAX = 4096
_RUN_PREFIXES_CACHE: dict[tuple[int, int], list[bytes]] = {}


def _run_prefixes(size: int, varint_bytes: int) -> list[bytes]:
    """By a sequence id's low 7 bits: ``[u32 meta size][0x18 varint(size)][0x40][low|0x80]``,
    everything before the rest of the sequence id's varint (of ``varint_bytes`` >= 2 bytes)."""
    key = (size, varint_bytes)
    prefixes = _RUN_PREFIXES_CACHE.get(key)
    if prefixes is None:
        field3 = b"\x18" + uvarint(size)
        head = _U32.pack(len(field3) + 1 + varint_bytes) + field3 + b"\x40"
        prefixes = [head + bytes((low | 0x80,)) for low in range(0x80)]
        if len(_RUN_PREFIXES_CACHE) < _PLAIN_HEADS_CACHE_MAX:
            _RUN_PREFIXES_CACHE[key] = prefixes
    return prefixes


def _uniform_run(messages: Sequence[bytes], first_sequence_id: int) -> bytes:
    """The batch of plain messages of ONE payload size whose sequence ids run from
    ``first_sequence_id`` (>= 128) up by one: what a producer of plain messages batches. The
    varint of such an id is ``[low 7 bits | 0x80]`` + varint(id >> 7), and the last part is
    the same for up to 128 consecutive ids: whole slices are woven in C (zip), no Python work
    per message."""
    size = len(messages[0])
    parts: list = []
    extend = parts.extend
    chain = itertools.chain.from_iterable
    repeat = itertools.repeat
    count = len(messages)
    index = 0
    seq = first_sequence_id
    while index < count:
        low = seq & 0x7F
        take = min(0x80 - low, count - index)
        upper = uvarint(seq >> 7)
        prefixes = _run_prefixes(size, 1 + len(upper))
        extend(chain(zip(prefixes[low:low + take], repeat(upper, take),
                         messages[index:index + take])))
        index += take
        seq += take
    return b"".join(parts)


def _is_uniform_run(messages: Sequence, sequence_ids: Sequence) -> bool:
    if not isinstance(messages, (list, tuple)):
        return False
    count = len(messages)
    if count < 2 or len(sequence_ids) != count:
        return False
    first = sequence_ids[0]
    if not (type(first) is int and 0x80 <= first and first + count <= _U64_LIMIT
            and type(messages[0]) is bytes):
        return False
    try:
        # bytes.__len__ refuses anything but bytes: one pass checks types and sizes
        if len(set(map(bytes.__len__, messages))) != 1:
            return False
    except TypeError:
        return False
    if type(sequence_ids) is list:
        return sequence_ids == list(range(first, first + count))
    return all(map(operator.eq, sequence_ids, itertools.count(first)))


def build_batch_payload(messages: Iterable[Message | bytes],
                        sequence_ids: Sequence[int | None] | None = None) -> bytes:
    """The uncompressed batch: N x ``[u32 size][SingleMessageMetadata][payload]``.

    ``sequence_ids`` (optional, one per message) overrides each message's ``sequence_id``
    (the client keeps the ids it assigns beside the messages instead of copying each message).
    A message may also be given as plain ``bytes``: its content, with no key, properties or
    event time. Plain messages (the common case) have their metadata written by hand, byte for
    byte what protobuf writes (tests/unit/test_client_batch_fast.py compares them with the
    protobuf encoder on random batches); any other message goes through protobuf."""
    if sequence_ids is not None and _is_uniform_run(messages, sequence_ids):
        return _uniform_run(messages, sequence_ids[0])
    parts: list = []
    heads_cache = _PLAIN_HEADS_CACHE
    small = SMALL_VARINTS
    last_size = -1
    heads = None
    for index, message in enumerate(messages):
        seq = None if sequence_ids is None else sequence_ids[index]
        if type(message) is bytes:
            payload = message
        else:
            if seq is None:
                seq = message.sequence_id
            payload = message.payload
            if type(payload) is not bytes:
                payload = bytes(payload)
            if not (message.key is None and message.ordering_key is None
                    and not message.properties and not message.event_time_ms
                    and not message.null_value and not message.null_key
                    and not message.compacted_out):
                meta = _single_metadata(message, len(payload), seq)
                parts += (_U32.pack(len(meta)), meta, payload)
                continue
        size = len(payload)
        if size != last_size:
            heads = heads_cache.get(size)
            if heads is None:
                heads = _plain_heads(size)
                if len(heads_cache) < _PLAIN_HEADS_CACHE_MAX:
                    heads_cache[size] = heads
            last_size = size
        if seq is None:
            parts += (heads[0], payload)
        elif 0 <= seq < 0x80:
            parts += (heads[1], small[seq], payload)
        elif 0x80 <= seq < 0x4000:
            parts += (heads[2], bytes(((seq & 0x7F) | 0x80, seq >> 7)), payload)
        elif 0x4000 <= seq < 0x200000:
            parts += (heads[3], bytes(((seq & 0x7F) | 0x80, ((seq >> 7) & 0x7F) | 0x80,
                                       seq >> 14)), payload)
        elif 0x200000 <= seq < _U64_LIMIT:
            varint = uvarint(seq)
            field3 = heads[0][4:]
            parts += (_U32.pack(len(field3) + 1 + len(varint)), field3, b"\x40", varint,
                      payload)
        else:   # out of uint64 range: protobuf raises its own ValueError
            meta = _single_metadata(Message(payload), len(payload), seq)
            parts += (_U32.pack(len(meta)), meta, payload)
    return b"".join(parts)


def build_batch_entry(messages: Sequence[Message | bytes], *, producer_name: str,
                      sequence_id: int, publish_time_ms: int,
                      compression: Compression | int = Compression.NONE,
                      schema_version: bytes | None = None,
                      highest_sequence_id: int | None = None,
                      properties: Mapping[str, str] | None = None,
                      sequence_ids: Sequence[int | None] | None = None) -> bytes:
    """A batched entry, as the official clients build it: the entry's key (and ordering key)
    is the first message's; ``sequence_id`` is the first message's sequence id.
    ``sequence_ids`` and plain ``bytes`` messages: see :func:`build_batch_payload`."""
    if not messages:
        raise ValueError("a batch holds at least one message")
    raw = build_batch_payload(messages, sequence_ids)
    metadata = pb.MessageMetadata(
        producer_name=producer_name, sequence_id=sequence_id, publish_time=publish_time_ms,
        properties=_key_values(properties), num_messages_in_batch=len(messages),
        uncompressed_size=len(raw))
    first = messages[0]
    if type(first) is not bytes:
        if first.key is not None:
            metadata.partition_key = first.key
            if first.key_b64_encoded:
                metadata.partition_key_b64_encoded = True
        if first.ordering_key is not None:
            metadata.ordering_key = first.ordering_key
    if compression:
        metadata.compression = int(compression)
    if schema_version is not None:
        metadata.schema_version = schema_version
    if highest_sequence_id is not None:
        metadata.highest_sequence_id = highest_sequence_id
    return frame_entry(metadata, raw if not compression else compress(raw, compression))
