"""The ONE entry codec: pulsarlite.wire.entry."""

from __future__ import annotations

import struct
import zlib

import cramjam
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsarlite.wire import pb
from pulsarlite.wire.entry import (
    Compression,
    EntryFormatError,
    Message,
    build_batch_entry,
    build_batch_payload,
    build_entry,
    check_batch_framing,
    check_sendable,
    compress,
    decompress,
    peek_metadata,
    split_entry,
    unpack_entry,
)

HEADER = dict(producer_name="standalone-0-7", sequence_id=100, publish_time_ms=1_700_000_000_123)
CODECS = list(Compression)


def hand_entry(metadata: pb.MessageMetadata, payload: bytes) -> bytes:
    meta = metadata.SerializePartialToString()
    return struct.pack(">I", len(meta)) + meta + payload


def hand_batch(singles: list[tuple[pb.SingleMessageMetadata, bytes]]) -> bytes:
    out = b""
    for single, payload in singles:
        meta = single.SerializePartialToString()
        out += struct.pack(">I", len(meta)) + meta + payload
    return out


# --- compression -----------------------------------------------------------------------------

@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("data", [b"", b"a", b"hello world " * 1000, bytes(range(256)) * 40])
def test_compression_round_trip(codec, data):
    packed = compress(data, codec)
    assert bytes(decompress(packed, codec, len(data))) == data
    assert bytes(decompress(memoryview(packed), codec, len(data))) == data


def test_codec_formats_match_the_wire_spec():
    # hand-made vectors, decoded by our path
    assert decompress(b"\x50hello", Compression.LZ4, 5) == b"hello"       # raw LZ4 block
    assert bytes(decompress(b"\x05\x10hello", Compression.SNAPPY, 5)) == b"hello"  # raw snappy
    assert decompress(zlib.compress(b"hello"), Compression.ZLIB, 5) == b"hello"
    # our output, decoded by other libraries (as a Java or C++ peer would)
    data = b"interop " * 500
    assert bytes(cramjam.lz4.decompress_block(compress(data, Compression.LZ4),
                                              output_len=len(data))) == data
    assert bytes(cramjam.snappy.decompress_raw(compress(data, Compression.SNAPPY))) == data
    assert zlib.decompress(compress(data, Compression.ZLIB)) == data
    zstd_frame = compress(data, Compression.ZSTD)
    assert zstd_frame[:4] == b"\x28\xb5\x2f\xfd"                           # a standard frame
    assert bytes(cramjam.zstd.decompress(zstd_frame)) == data
    # other libraries' output, decoded by ours
    assert decompress(bytes(cramjam.lz4.compress_block(data, store_size=False)),
                      Compression.LZ4, len(data)) == data
    assert bytes(decompress(bytes(cramjam.snappy.compress_raw(data)), Compression.SNAPPY,
                            len(data))) == data
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    assert decompress(no_size, Compression.ZSTD, len(data)) == data
    assert decompress(bytes(cramjam.zstd.compress(data)), Compression.ZSTD, len(data)) == data


@pytest.mark.parametrize("codec", [c for c in CODECS if c is not Compression.NONE])
def test_decompress_rejects_a_wrong_size_or_garbage(codec):
    data = b"0123456789" * 100
    packed = compress(data, codec)
    for size in (len(data) - 1, len(data) + 1):
        with pytest.raises(EntryFormatError):
            decompress(packed, codec, size)
    with pytest.raises(EntryFormatError):
        decompress(b"\xff" * 40, codec, 1000)
    with pytest.raises(EntryFormatError):
        decompress(packed, codec, len(data), uncompressed_bytes_max=len(data) - 1)


def test_decompress_rejects_an_unknown_codec_and_trailing_zlib_garbage():
    with pytest.raises(EntryFormatError):
        decompress(b"abc", 9, 3)
    with pytest.raises(EntryFormatError):
        decompress(zlib.compress(b"abc") + b"junk", Compression.ZLIB, 3)


# --- single-message entries ------------------------------------------------------------------

@pytest.mark.parametrize("codec", CODECS)
def test_single_entry_round_trip(codec):
    message = Message(b"value" * 30, key="k1", ordering_key=b"ok", properties={"a": "1", "b": "2"},
                      event_time_ms=42)
    entry = build_entry(message, compression=codec, schema_version=b"\0\0\0\1",
                        highest_sequence_id=100, **HEADER)
    metadata, messages = unpack_entry(entry)
    assert messages == [message._replace(sequence_id=100)]
    assert not metadata.batched and metadata.message_count == 1
    assert (metadata.producer_name, metadata.sequence_id, metadata.publish_time_ms) == (
        "standalone-0-7", 100, 1_700_000_000_123)
    assert metadata.key == "k1" and metadata.ordering_key == b"ok"
    assert metadata.dispatch_key == b"ok"
    assert metadata.properties == {"a": "1", "b": "2"} and metadata.event_time_ms == 42
    assert metadata.schema_version == b"\0\0\0\1" and metadata.compression == codec
    assert metadata.uncompressed_size == 150 and metadata.highest_sequence_id == 100


def test_null_value_empty_value_and_defaults():
    metadata, [m] = unpack_entry(build_entry(Message(b"", null_value=True), **HEADER))
    assert m.null_value and bytes(m.payload) == b"" and metadata.null_value
    metadata, [m] = unpack_entry(build_entry(Message(b""), **HEADER))
    assert not m.null_value and bytes(m.payload) == b""
    assert m.key is None and m.ordering_key is None and m.event_time_ms is None
    assert m.properties == {} and m.batch_index == -1
    assert metadata.key is None and metadata.dispatch_key is None and metadata.event_time_ms is None
    assert metadata.schema_version is None and metadata.properties == {}
    metadata = peek_metadata(build_entry(Message(b"x", key="kk"), **HEADER))
    assert metadata.dispatch_key == b"kk"
    # a key that is not UTF-8 (python protobuf hands it out as bytes): hashed as its bytes
    metadata = peek_metadata(build_entry(Message(b"x", key="kk"), **HEADER).replace(b"kk", b"\xff\xfe"))
    assert metadata.dispatch_key == b"\xff\xfe"


def test_hand_built_entry_parses_like_a_client_built_one():
    # the reverse interop direction: bytes made straight from the spec, read by our codec
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=5, publish_time=9,
                                  partition_key="key", compression=pb.ZLIB,
                                  properties=[pb.KeyValue(key="x", value="y")])
    payload = b"raw payload"
    metadata.uncompressed_size = len(payload)
    entry = hand_entry(metadata, zlib.compress(payload))
    got, [m] = unpack_entry(entry)
    assert bytes(m.payload) == payload and m.key == "key" and m.properties == {"x": "y"}
    assert got.message_count == 1 and got.sequence_id == 5
    # and ours is byte-identical to the hand-built one for the same fields
    assert build_entry(Message(payload, key="key", properties={"x": "y"}), producer_name="p",
                       sequence_id=5, publish_time_ms=9, compression=Compression.ZLIB) == entry


# --- batches ---------------------------------------------------------------------------------

messages_strategy = st.lists(
    st.builds(
        Message,
        payload=st.binary(max_size=200),
        key=st.none() | st.text(max_size=10),
        ordering_key=st.none() | st.binary(max_size=8),
        properties=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
        event_time_ms=st.none() | st.integers(1, 2**63 - 1),
        null_value=st.booleans(),
        null_key=st.booleans(),
        key_b64_encoded=st.just(False),
        sequence_id=st.none(),
        compacted_out=st.just(False),
        batch_index=st.just(-1),
    ),
    min_size=1, max_size=20,
)


@settings(max_examples=60, deadline=None)
@given(messages=messages_strategy, codec=st.sampled_from(CODECS), entry_sequence_id=st.integers(0, 2**62))
def test_batch_round_trip(messages, codec, entry_sequence_id):
    messages = [m._replace(payload=b"") if m.null_value else m for m in messages]
    entry = build_batch_entry(messages, producer_name="p", sequence_id=entry_sequence_id,
                              publish_time_ms=77, compression=codec)
    metadata, got = unpack_entry(entry)
    assert metadata.batched and metadata.message_count == len(messages)
    assert metadata.key == messages[0].key and metadata.ordering_key == messages[0].ordering_key
    assert got == [m._replace(batch_index=i, sequence_id=entry_sequence_id + i)
                   for i, m in enumerate(messages)]
    assert peek_metadata(memoryview(entry)) == metadata
    # the same bytes come out of the hand-built path
    singles = []
    for m in messages:
        s = pb.SingleMessageMetadata(payload_size=len(m.payload),
                                     properties=[pb.KeyValue(key=k, value=v)
                                                 for k, v in m.properties.items()])
        if m.key is not None:
            s.partition_key = m.key
        if m.null_key:
            s.null_partition_key = True
        if m.ordering_key is not None:
            s.ordering_key = m.ordering_key
        if m.event_time_ms:
            s.event_time = m.event_time_ms
        if m.null_value:
            s.null_value = True
        singles.append((s, bytes(m.payload)))
    assert build_batch_payload(messages) == hand_batch(singles)


def test_batch_sequence_ids_and_compacted_out():
    messages = [Message(b"a", sequence_id=7), Message(b"b"), Message(b"c", compacted_out=True)]
    _, got = unpack_entry(build_batch_entry(messages, producer_name="p", sequence_id=40,
                                            publish_time_ms=1))
    assert [m.sequence_id for m in got] == [7, 41, 42]
    assert [m.compacted_out for m in got] == [False, False, True]
    assert [m.batch_index for m in got] == [0, 1, 2]


def test_batch_of_one_is_still_a_batch():
    metadata, [m] = unpack_entry(build_batch_entry([Message(b"x")], **HEADER))
    assert metadata.batched and metadata.message_count == 1 and m.batch_index == 0


def test_empty_batch_is_refused():
    with pytest.raises(ValueError):
        build_batch_entry([], **HEADER)


# --- peek ------------------------------------------------------------------------------------

def test_peek_never_decompresses():
    metadata = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=5,
                                  num_messages_in_batch=10, compression=pb.LZ4,
                                  uncompressed_size=1000, partition_key="k")
    entry = hand_entry(metadata, b"\xff" * 20)            # not valid LZ4
    peek = peek_metadata(entry)
    assert (peek.message_count, peek.key, peek.publish_time_ms) == (10, "k", 5)
    assert peek.payload_offset == len(entry) - 20
    assert bytes(split_entry(entry)[1]) == b"\xff" * 20
    with pytest.raises(EntryFormatError):
        unpack_entry(entry)


# --- malformed entries -----------------------------------------------------------------------

def _meta(**fields) -> pb.MessageMetadata:
    base = dict(producer_name="p", sequence_id=1, publish_time=2)
    base.update(fields)
    return pb.MessageMetadata(**base)


@pytest.mark.parametrize("entry", [
    b"",
    b"\0\0",
    struct.pack(">I", 100) + b"short",                          # meta_size overruns
    struct.pack(">I", 3) + b"\xff\xff\xff",                      # not protobuf
    hand_entry(pb.MessageMetadata(producer_name="p", sequence_id=1), b""),  # no publish_time
])
def test_malformed_metadata_raises(entry):
    with pytest.raises(EntryFormatError):
        peek_metadata(entry)
    with pytest.raises(EntryFormatError):
        unpack_entry(entry)


@pytest.mark.parametrize("entry", [
    hand_entry(_meta(num_messages_in_batch=2), hand_batch([(pb.SingleMessageMetadata(payload_size=1), b"a")])),
    hand_entry(_meta(num_messages_in_batch=1), hand_batch([(pb.SingleMessageMetadata(payload_size=5), b"a")])),
    hand_entry(_meta(num_messages_in_batch=1), struct.pack(">I", 50) + b"xx"),
    hand_entry(_meta(num_messages_in_batch=1), struct.pack(">I", 2) + b"\xff\xff"),
    hand_entry(_meta(num_messages_in_batch=1), hand_batch([(pb.SingleMessageMetadata(), b"")])),
    hand_entry(_meta(num_messages_in_batch=1),
               hand_batch([(pb.SingleMessageMetadata(payload_size=1), b"a")]) + b"extra"),
    hand_entry(_meta(num_messages_in_batch=-1), b""),
    hand_entry(_meta(compression=pb.ZSTD, uncompressed_size=10), compress(b"0123456789x", Compression.ZSTD)),
    hand_entry(_meta(compression=pb.LZ4, uncompressed_size=2**32 - 1), b"\x50hello"),
    hand_entry(_meta(encryption_keys=[pb.EncryptionKeys(key="k", value=b"v")]), b"secret"),
])
def test_malformed_payload_raises(entry):
    peek_metadata(entry)                                     # the metadata itself is fine
    with pytest.raises(EntryFormatError):
        unpack_entry(entry)


def test_unknown_compression_is_refused_on_unpack_only():
    # proto2 enums are closed: an unknown codec number parses as "unset" (reads NONE), its
    # value kept among the unknown fields. It must not be served as an uncompressed payload.
    meta = _meta().SerializeToString() + b"\x40\x09"          # field 8 (compression) = 9
    odd = struct.pack(">I", len(meta)) + meta + b"data"
    assert peek_metadata(odd).message_count == 1
    with pytest.raises(EntryFormatError, match="unknown compression type 9"):
        unpack_entry(odd)


# --- the SEND check: what the official clients can read (poison-entry, tests/fuzz/NOTES.md) ----

def _sendable(entry: bytes) -> None:
    check_sendable(entry, peek_metadata(entry))


def _bad_property_meta(**fields) -> pb.MessageMetadata:
    meta = _meta(**fields)
    meta.properties.add(key="k")                              # KeyValue.value is required
    return meta


def _batch_entry(singles, count=None, codec=Compression.NONE, **fields) -> bytes:
    raw = hand_batch(singles)
    meta = _meta(num_messages_in_batch=len(singles) if count is None else count, **fields)
    if codec:
        meta.compression = int(codec)
        meta.uncompressed_size = len(raw)
    return hand_entry(meta, compress(raw, codec))


def _unset_property_single() -> pb.SingleMessageMetadata:
    single = pb.SingleMessageMetadata(payload_size=1)
    single.properties.add(value="v")                          # KeyValue.key is required
    return single


POISON = {
    "metadata property without value": hand_entry(_bad_property_meta(), b"poison"),
    "batch metadata property without value": hand_entry(
        _bad_property_meta(num_messages_in_batch=1), hand_batch([(pb.SingleMessageMetadata(payload_size=1), b"a")])),
    "encryption key without value": hand_entry(_meta(encryption_keys=[pb.EncryptionKeys(key="k")]), b"x"),
    "payload_size past the end": _batch_entry([(pb.SingleMessageMetadata(payload_size=1000), b"hello")]),
    "no payload_size": _batch_entry([(pb.SingleMessageMetadata(sequence_id=4), b"hello")]),
    "single metadata property without key": _batch_entry([(_unset_property_single(), b"a")]),
    "metadata size past the end": hand_entry(_meta(num_messages_in_batch=1), struct.pack(">I", 50) + b"\x18\x01a" * 3),
    "single metadata does not parse": hand_entry(_meta(num_messages_in_batch=1), struct.pack(">I", 3) + b"\xff\xff\xffabcdef"),
    "fewer messages than declared": _batch_entry([(pb.SingleMessageMetadata(payload_size=20), b"a" * 20)], count=2),
    "bytes left over": hand_entry(_meta(num_messages_in_batch=1),
                                  hand_batch([(pb.SingleMessageMetadata(payload_size=1), b"a")]) + b"extra"),
    "sequence id varint cut short": hand_entry(_meta(num_messages_in_batch=1), struct.pack(">I", 4) + b"\x18\x01\x40\x80a"),
    "payload_size given twice, the last past the end": hand_entry(
        _meta(num_messages_in_batch=1), struct.pack(">I", 4) + b"\x18\x01\x18\x7fa"),
    "uniform batch, one payload_size differs": _batch_entry(
        [(pb.SingleMessageMetadata(payload_size=3, sequence_id=200 + i), b"abc") for i in range(9)]
        + [(pb.SingleMessageMetadata(payload_size=4, sequence_id=209), b"ab")]),
    "chunked batch": _batch_entry([(pb.SingleMessageMetadata(payload_size=1), b"a")], num_chunks_from_msg=2),
    **{f"{codec.name} batch, payload_size past the end": _batch_entry(
        [(pb.SingleMessageMetadata(payload_size=1000), b"hello")], codec=codec) for codec in CODECS if codec},
    "LZ4 batch that does not decompress": hand_entry(
        _meta(num_messages_in_batch=1, compression=pb.LZ4, uncompressed_size=30), b"\xff" * 20),
    # poison-lz4 (tests/fuzz/NOTES.md): the official C++ reader sometimes crashed on it
    "single LZ4 message that does not decompress": hand_entry(
        _meta(compression=pb.LZ4, uncompressed_size=127), bytes(range(75))),
    "single LZ4 message shorter than declared": hand_entry(
        _meta(compression=pb.LZ4, uncompressed_size=100), compress(b"x" * 60, Compression.LZ4)),
    # poison-codec (tests/fuzz/NOTES.md): the C++ decoders trust the declared size and crashed
    **{f"single {codec.name} message that does not decompress to its declared 0 bytes": hand_entry(
        _meta(compression=int(codec), uncompressed_size=0), compress(b"x" * 90, codec))
        for codec in CODECS if codec},
    "single SNAPPY message of random bytes": hand_entry(_meta(compression=pb.SNAPPY, uncompressed_size=0),
                                                        bytes(range(200, 216))),
    # poison-chunk: the C++ consumer sizes its reassembly buffer by these fields, copies unchecked
    "a chunk of a 0-byte message claiming 272,608,922 chunks": hand_entry(
        _meta(num_chunks_from_msg=272_608_922), b"x" * 40),
    "a chunk without uuid": hand_entry(_meta(num_chunks_from_msg=2, total_chunk_msg_size=10, chunk_id=0), b"x" * 5),
    "a chunk id past the chunks": hand_entry(
        _meta(num_chunks_from_msg=2, total_chunk_msg_size=10, chunk_id=2, uuid="p-1"), b"x" * 5),
    "a chunk larger than its message": hand_entry(
        _meta(num_chunks_from_msg=2, total_chunk_msg_size=4, chunk_id=0, uuid="p-1"), b"x" * 5),
}


@pytest.mark.parametrize("name", list(POISON))
def test_send_check_refuses_entries_the_official_clients_cannot_read(name):
    """poison-entry (tests/fuzz/NOTES.md): a nested required field missing in the metadata made
    every official consumer reconnect for ever on the entry; an inconsistent batch made the
    C++ client read out of bounds or crash. Both are refused where a SEND enters the broker."""
    entry = POISON[name]
    peek_metadata(entry)                                     # the top-level metadata parses
    with pytest.raises(EntryFormatError):
        _sendable(entry)


def test_send_check_takes_what_the_clients_build():
    _sendable(build_entry(Message(b"x", key="k", properties={"a": "b"}), **HEADER))
    for codec in CODECS:                 # single compressed messages (decompressed to check), empty ones too
        _sendable(build_entry(Message(b"hello " * 20), compression=codec, **HEADER))
        _sendable(build_entry(Message(b""), compression=codec, **HEADER))
    # the chunks of a chunked message, as the producers write them (the payload of the last
    # one shorter; compressed as a whole before chunking: fragments are not decompressed)
    whole = compress(b"chunked " * 40, Compression.ZSTD)
    for chunk_id in range(3):
        _sendable(hand_entry(_meta(num_chunks_from_msg=3, chunk_id=chunk_id, uuid="p-1-7",
                                   total_chunk_msg_size=len(whole), compression=pb.ZSTD, uncompressed_size=320),
                             whole[chunk_id * 40:(chunk_id + 1) * 40]))
    _sendable(hand_entry(_meta(encryption_keys=[pb.EncryptionKeys(key="k", value=b"v")]), b"secret"))
    # an encrypted batch is ciphertext: only its declared count is checked
    _sendable(hand_entry(_meta(num_messages_in_batch=2, encryption_keys=[pb.EncryptionKeys(key="k", value=b"v")]),
                         b"\xff" * 40))
    messages = [Message(b"a" * n, key=f"k{n}" if n % 3 else None, properties={"p": "q"} if n % 2 else {},
                        event_time_ms=n or None, sequence_id=n) for n in range(20)]
    for codec in CODECS:
        _sendable(build_batch_entry(messages, compression=codec, **HEADER))
        _sendable(build_batch_entry([b"x" * 100] * 100, compression=codec, sequence_ids=list(range(16_380, 16_480)),
                                    **HEADER))
        _sendable(build_batch_entry([b"y"] * 3, compression=codec, **HEADER))
    _sendable(build_batch_entry([b"a"], **HEADER))
    _sendable(build_batch_entry([b""] * 5, sequence_ids=[2**63 + i for i in range(5)], **HEADER))


def _reference_framing_ok(data: bytes, count: int) -> bool:
    """check_batch_framing's answer, the slow way: protobuf parses every SingleMessageMetadata."""
    pos = 0
    for _ in range(count):
        if len(data) - pos < 4:
            return False
        (size,) = struct.unpack_from(">I", data, pos)
        pos += 4
        if size > len(data) - pos:
            return False
        try:
            single = pb.SingleMessageMetadata.FromString(data[pos:pos + size])
        except Exception:  # noqa: BLE001 - protobuf's DecodeError
            return False
        if not single.IsInitialized():
            return False
        pos += size
        if not 0 <= single.payload_size <= len(data) - pos:
            return False
        pos += single.payload_size
    return pos == len(data)


_batch_message = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda payload, key, properties, sequence_id: Message(payload, key=key, properties=properties,
                                                                    sequence_id=sequence_id),
              st.binary(max_size=200), st.none() | st.text(max_size=5),
              st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
              st.none() | st.integers(0, 2**64 - 1)))


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_batch_framing_check_agrees_with_protobuf_on_batches_and_their_mutations(data):
    uniform = data.draw(st.booleans())
    if uniform:
        count = data.draw(st.integers(1, 40))
        messages = [data.draw(st.binary(min_size=3, max_size=3))] * count
        first = data.draw(st.sampled_from([0, 100, 127, 16_300, 2**21 - 20, 2**40]))
        raw = build_batch_payload(messages, data.draw(st.sampled_from([None, list(range(first, first + count))])))
    else:
        messages = data.draw(st.lists(_batch_message, min_size=1, max_size=12))
        count = len(messages)
        raw = build_batch_payload(messages)
    check_batch_framing(raw, count)                          # what the builder writes is sendable
    assert _reference_framing_ok(raw, count)
    mutated = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        kind = data.draw(st.sampled_from(["byte", "cut", "extend", "count"]))
        if kind == "byte" and mutated:
            mutated[data.draw(st.integers(0, len(mutated) - 1))] = data.draw(st.integers(0, 255))
        elif kind == "cut" and mutated:
            del mutated[data.draw(st.integers(0, len(mutated) - 1)):]
        elif kind == "extend":
            mutated += data.draw(st.binary(min_size=1, max_size=4))
        else:
            count = data.draw(st.integers(1, count + 2))
    mutated = bytes(mutated)
    try:
        check_batch_framing(mutated, count)
        ours = True
    except EntryFormatError:
        ours = False
    assert ours == _reference_framing_ok(mutated, count), (mutated, count)
