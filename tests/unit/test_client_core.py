"""The client's sans-IO core at the byte level: handshake, events, PING/PONG, batches, routing,
batch acks."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.client import core as k
from pulsarlite.client.types import MessageId
from pulsarlite.wire import commands as c
from pulsarlite.wire.entry import Compression, Message, unpack_entry
from pulsarlite.wire.frames import FrameDecoder, FrameTooLargeError


def ready_core() -> k.ConnectionCore:
    core = k.ConnectionCore()
    events = core.feed(c.connected("test-broker", 19, max_message_size=1234))
    assert events == [k.Connected(19, 1234, "test-broker")]
    assert core.state is k.ConnectionState.READY
    return core


def test_connect_frame_announces_client_and_protocol():
    frames = FrameDecoder().feed(k.ConnectionCore().connect_frame())
    assert len(frames) == 1
    body = frames[0].command.connect
    assert frames[0].type == pb.BaseCommand.CONNECT
    assert body.protocol_version == k.PROTOCOL_VERSION
    assert body.client_version.startswith("pulsarlite")


def test_first_frame_must_be_connected():
    core = k.ConnectionCore()
    with pytest.raises(k.ProtocolError, match="CONNECTED"):
        core.feed(c.success(1))
    core = k.ConnectionCore()
    with pytest.raises(k.ProtocolError, match="AuthenticationError"):
        core.feed(c.error(0, pb.AuthenticationError, "no"))


def test_connected_split_across_chunks_and_default_max_message_size():
    core = k.ConnectionCore()
    frame = c.connected("b", 15)
    assert core.feed(frame[:3]) == []
    assert core.feed(frame[3:]) == [k.Connected(15, k.MESSAGE_BYTES_MAX_DEFAULT, "b")]


def test_ping_is_answered_with_pong_and_pong_is_an_event():
    core = ready_core()
    assert core.feed(c.ping()) == []
    assert core.take_output() == [c.pong()]
    assert core.take_output() == []
    assert core.feed(c.pong()) == [k.Pong()]


def test_responses_carry_request_id_and_errors():
    core = ready_core()
    [ok] = core.feed(c.success(7))
    assert ok.request_id == 7 and ok.error is None
    [err] = core.feed(c.error(8, pb.ConsumerBusy, "taken"))
    assert (err.request_id, err.error, err.message) == (8, pb.ConsumerBusy, "taken")
    [lookup] = core.feed(c.lookup_response(9, "pulsar://h:1", redirect=True))
    assert lookup.error is None
    assert lookup.command.lookupTopicResponse.response == pb.CommandLookupTopicResponse.Redirect
    [failed] = core.feed(c.lookup_failed(10, pb.TopicNotFound, "nope"))
    assert failed.error == pb.TopicNotFound
    [parts] = core.feed(c.partitioned_metadata_response(11, 4))
    assert parts.command.partitionMetadataResponse.partitions == 4 and parts.error is None
    [producer] = core.feed(c.producer_success(12, "p-name", last_sequence_id=41))
    assert producer.command.producer_success.last_sequence_id == 41
    [last] = core.feed(c.get_last_message_id_response(13, 3, -1))
    mid = MessageId.from_proto(last.command.getLastMessageIdResponse.last_message_id)
    assert (mid.ledger_id(), mid.entry_id()) == (3, -1)


def test_receipt_send_error_and_close_notices():
    core = ready_core()
    [receipt] = core.feed(c.send_receipt(2, 10, 5, 6, highest_sequence_id=14))
    assert receipt == k.Receipt(2, 10, 14, 5, 6)
    [receipt] = core.feed(c.send_receipt(2, 15, 5, 7))
    assert receipt.highest_sequence_id == 15
    [failed] = core.feed(c.send_error(2, 16, pb.ChecksumError, "bad"))
    assert failed == k.SendFailed(2, 16, pb.ChecksumError, "bad")
    assert core.feed(c.close_producer(2, 1) + c.close_consumer(3, 2)) == [
        k.ProducerClosed(2), k.ConsumerClosed(3)]


def test_message_event_keeps_entry_and_checks_checksum():
    core = ready_core()
    entry = k.build_single(Message(b"payload", key="k"), producer_name="p", sequence_id=0,
                           publish_time_ms=1000, compression=Compression.LZ4)
    [event] = core.feed(c.message(4, 9, 2, entry, redelivery_count=3, ack_set=[5]))
    assert (event.consumer_id, event.ledger_id, event.entry_id) == (4, 9, 2)
    assert (event.redelivery_count, event.ack_set, event.checksum_ok) == (3, (5,), True)
    assert bytes(event.entry) == entry
    metadata, [m] = unpack_entry(event.entry)
    assert bytes(m.payload) == b"payload" and m.key == "k"
    # a flipped payload byte: the frame still decodes, the checksum says no
    frame = bytearray(c.message(4, 9, 3, entry))
    frame[-1] ^= 0xFF
    [bad] = core.feed(bytes(frame))
    assert bad.checksum_ok is False


def test_unknown_commands_are_ignored_and_bad_frames_raise():
    core = ready_core()
    assert core.feed(c.reached_end_of_topic(1)) == []
    core = k.ConnectionCore(frame_bytes_max=64)
    with pytest.raises(FrameTooLargeError):
        core.feed(b"\x00\x00\x10\x00" + b"\x00" * 8)


def test_batch_builder_limits_and_entry():
    builder = k.BatchBuilder(k.BatchLimits(messages_max=3, bytes_max=100, delay_ms=5))
    assert builder.add(Message(b"a" * 10, sequence_id=5), "cb0") is False
    assert builder.add(Message(b"b" * 10, key="k2", sequence_id=6), "cb1") is False
    assert builder.add(Message(b"c" * 10, sequence_id=7), "cb2") is True     # 3 messages
    entry, callbacks, count, first, last = builder.build(
        producer_name="p", publish_time_ms=123, compression=Compression.ZSTD)
    assert (callbacks, count, first, last) == (["cb0", "cb1", "cb2"], 3, 5, 7)
    assert len(builder) == 0 and builder.payload_bytes == 0
    metadata, messages = unpack_entry(entry)
    assert metadata.message_count == 3 and metadata.sequence_id == 5
    assert metadata.highest_sequence_id == 7 and metadata.compression == pb.ZSTD
    assert [bytes(m.payload) for m in messages] == [b"a" * 10, b"b" * 10, b"c" * 10]
    assert [m.sequence_id for m in messages] == [5, 6, 7]
    assert messages[1].key == "k2"

    by_bytes = k.BatchBuilder(k.BatchLimits(messages_max=100, bytes_max=25, delay_ms=5))
    assert by_bytes.add(Message(b"x" * 20, sequence_id=0), None) is False
    assert not by_bytes.fits(10)          # would exceed the bytes limit
    assert k.BatchBuilder(by_bytes.limits).fits(10_000)   # an empty batch takes anything
    with pytest.raises(ValueError):
        k.BatchLimits(messages_max=0)


def test_murmur3_32_reference_vectors():
    assert k.murmur3_32(b"") == 0
    assert k.murmur3_32(b"hello") == 0x248BFA47
    assert k.murmur3_32(b"The quick brown fox jumps over the lazy dog") == 0x2E4FF723
    assert k.murmur3_32(b"", seed=1) == 0x514E28B7


def test_java_string_hash():
    assert k.java_string_hash("hello") == 99162322
    assert k.java_string_hash("") == 0


def test_partition_for_key_boost_hash_matches_official_client():
    # partitions the official Python client (pulsar-client 3.x) chose on a 64-partition topic
    observed = {"key-0": 50, "key-1": 25, "key-2": 52, "key-3": 6, "key-7": 58, "a": 28,
                "ab": 54, "abc": 61, "abcd": 34, "abcdefgh": 14, "hello world 123456789": 38}
    assert {key: k.partition_for_key(key, 64) for key in observed} == observed
    assert k.partition_for_key("x", 1) == 0
    with pytest.raises(ValueError):
        k.partition_for_key("x", 0)


@given(st.text(max_size=40), st.integers(1, 100))
def test_partition_for_key_in_range(key, partitions):
    for scheme in k.HashingScheme:
        assert 0 <= k.partition_for_key(key, partitions, scheme) < partitions


def test_round_robin_sticks_per_batch():
    rr = k.RoundRobin(3, start=1, stick_messages=2)
    assert [rr.next() for _ in range(7)] == [1, 1, 2, 2, 0, 0, 1]
    rr = k.RoundRobin(2)
    assert [rr.next() for _ in range(4)] == [0, 1, 0, 1]


def test_batch_ack_tracker():
    tracker = k.BatchAckTracker()
    tracker.received(1, 2, range(3))
    assert tracker.ack(1, 2, 0) is False
    assert tracker.ack(1, 2, 2) is False
    assert tracker.ack(1, 2, 1) is True       # the batch is complete: ack the entry
    assert len(tracker) == 0
    assert tracker.ack(9, 9, 0) is True       # unknown batch: ack the entry
    tracker.received(1, 3, [0, 1])
    tracker.received(2, 0, [0, 1])
    tracker.forget_through(1, 5)
    assert len(tracker) == 1


def test_ack_sets():
    assert k.ack_set_after(1, 4) == [0b1100]
    assert k.ack_set_after(3, 4) == [0]
    words = k.ack_set_after(0, 70)
    assert len(words) == 2 and words[1] == 0b111111 and words[0] == -2   # int64 on the wire
    assert k.unacked_indexes((), 4) is None
    assert k.unacked_indexes((0b1010,), 4) == [1, 3]
    assert k.unacked_indexes(tuple(words), 70) == list(range(1, 70))


def test_message_id_order_and_serialization():
    a, b = MessageId(-1, 1, 2, 0), MessageId(-1, 1, 2, 1)
    assert a < b and a != b and a == MessageId(-1, 1, 2, 0)
    assert MessageId.deserialize(b.serialize()) == b
    assert MessageId.earliest < a
    assert MessageId.from_proto(MessageId.earliest.to_proto()) == MessageId.earliest


# The entry codec's fast path for plain batched messages (metadata = payload_size and perhaps
# sequence_id) must agree with the protobuf path; the client's consume rate depends on it.
_msg = st.builds(
    Message,
    payload=st.binary(max_size=300),
    key=st.one_of(st.none(), st.text(max_size=5)),
    properties=st.one_of(st.just({}), st.dictionaries(st.text(max_size=3), st.text(max_size=3),
                                                      max_size=2)),
    event_time_ms=st.one_of(st.none(), st.integers(1, 2**41)),
    sequence_id=st.one_of(st.none(), st.integers(0, 2**63 - 1)),
)


@given(st.lists(_msg, min_size=1, max_size=8), st.integers(0, 2**40))
def test_batch_fast_path_agrees_with_protobuf(messages, first_seq):
    from pulsarlite.wire.entry import build_batch_entry
    entry = build_batch_entry(messages, producer_name="p", sequence_id=first_seq,
                              publish_time_ms=1)
    _, got = unpack_entry(entry)
    assert [bytes(m.payload) for m in got] == [bytes(m.payload) for m in messages]
    assert [m.key for m in got] == [m.key for m in messages]
    assert [dict(m.properties) for m in got] == [dict(m.properties) for m in messages]
    assert [m.event_time_ms for m in got] == [m.event_time_ms for m in messages]
    assert [m.sequence_id for m in got] == [first_seq + i if m.sequence_id is None
                                            else m.sequence_id for i, m in enumerate(messages)]
    assert [m.batch_index for m in got] == list(range(len(messages)))


def test_batch_fast_path_bad_input_is_refused():
    import struct
    from pulsarlite.wire.entry import EntryFormatError

    def entry_of(batch: bytes, n: int) -> bytes:
        meta = pb.MessageMetadata(producer_name="p", sequence_id=0, publish_time=1,
                                  num_messages_in_batch=n, uncompressed_size=len(batch))
        raw = meta.SerializeToString()
        return struct.pack(">I", len(raw)) + raw + batch
    # payload_size 100 but 3 bytes of payload
    with pytest.raises(EntryFormatError, match="overruns"):
        unpack_entry(entry_of(struct.pack(">I", 2) + b"\x18\x64" + b"abc", 1))
    # a varint that never ends inside the metadata: falls back to protobuf, which refuses
    with pytest.raises(EntryFormatError):
        unpack_entry(entry_of(struct.pack(">I", 2) + b"\x18\xff" + b"abc", 1))
    # payload_size only: sequence ids follow the entry's
    _, [m0, m1] = unpack_entry(entry_of((struct.pack(">I", 2) + b"\x18\x01" + b"z") * 2, 2))
    assert (bytes(m0.payload), m0.sequence_id, m1.sequence_id) == (b"z", 0, 1)


@pytest.mark.parametrize("seq", [0, 127, 128, 16383, 16384, 300_000, 2_097_151, 2_097_152,
                                 2**63 - 1])
def test_batch_fast_path_sequence_id_varint_sizes(seq):
    from pulsarlite.wire.entry import build_batch_entry
    entry = build_batch_entry([Message(b"p" * 200, sequence_id=seq), Message(b"q")],
                              producer_name="p", sequence_id=seq, publish_time_ms=1)
    _, (m0, m1) = unpack_entry(entry)
    assert (m0.sequence_id, bytes(m0.payload)) == (seq, b"p" * 200)
    assert (m1.sequence_id, bytes(m1.payload)) == (seq + 1, b"q")
