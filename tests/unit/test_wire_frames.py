"""Framing of the Pulsar binary protocol: pulsarlite.wire.frames and .commands."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsarlite.errors import InvariantViolation
from pulsarlite.wire import commands as C
from pulsarlite.wire import pb
from pulsarlite.wire.entry import Message, build_entry, peek_metadata
from pulsarlite.wire.frames import (
    FRAME_BYTES_MAX_DEFAULT,
    Frame,
    FrameDecoder,
    FrameError,
    FrameTooLargeError,
    MalformedFrameError,
    decode_frame,
    encode_command,
    encode_payload_command,
)

T = pb.BaseCommand


def entry_of(payload: bytes = b"hello", sequence_id: int = 0) -> bytes:
    return build_entry(Message(payload), producer_name="p-1", sequence_id=sequence_id,
                       publish_time_ms=1_700_000_000_000)


def one(data: bytes) -> Frame:
    frames = FrameDecoder().feed(data)
    assert len(frames) == 1
    return frames[0]


# --- golden bytes, derived by hand from the protocol specification ---------------------------

def test_ping_golden_bytes():
    # BaseCommand{type(1)=PING(18), ping(18)={}}: 08 12 | tag (18<<3|2)=146 -> 92 01, len 00
    body = bytes([0x08, 0x12, 0x92, 0x01, 0x00])
    assert C.ping() == struct.pack(">II", 4 + len(body), len(body)) + body
    assert one(C.ping()).type == T.PING
    assert one(C.pong()).type == T.PONG


def test_hand_built_send_frame_with_known_crc32c_decodes():
    # Framing does not look inside the metadata, only at meta_size; the CRC covers
    # [meta_size][metadata][payload].
    entry = struct.pack(">I", 1) + b"123456789"
    cmd = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=2)).SerializeToString()
    frame = (struct.pack(">II", 4 + len(cmd) + 6 + len(entry), len(cmd)) + cmd
             + struct.pack(">HI", 0x0E01, crc32c(entry)) + entry)
    got = one(frame)
    assert got.checksum == crc32c(entry) and got.checksum_ok
    assert bytes(got.entry) == entry
    assert crc32c(b"123456789") == 0xE3069283  # the library agrees with the CRC32C standard


# --- round trips of every builder ------------------------------------------------------------

def test_server_command_builders_round_trip():
    f = one(C.connected("pulsarlite-0.1", C.negotiate_protocol_version(19), max_message_size=5 << 20,
                        supports_broker_entry_metadata=True))
    assert f.type == T.CONNECTED and f.command.connected.protocol_version == 19
    assert f.command.connected.max_message_size == 5 << 20
    assert f.command.connected.feature_flags.supports_broker_entry_metadata
    assert C.negotiate_protocol_version(30) == C.PROTOCOL_VERSION_MAX

    f = one(C.producer_success(7, "standalone-0-3", last_sequence_id=41, schema_version=b"\0\1"))
    ps = f.command.producer_success
    assert (ps.request_id, ps.producer_name, ps.last_sequence_id, ps.schema_version) == (
        7, "standalone-0-3", 41, b"\0\1")
    assert one(C.producer_success(7, "x")).command.producer_success.last_sequence_id == -1

    r = one(C.send_receipt(1, 99, 12, 34, highest_sequence_id=100)).command.send_receipt
    assert (r.producer_id, r.sequence_id, r.message_id.ledgerId, r.message_id.entryId,
            r.highest_sequence_id) == (1, 99, 12, 34, 100)
    assert r.message_id.partition == -1 and not r.message_id.HasField("partition")

    e = one(C.send_error(1, 99, pb.ChecksumError, "bad crc")).command.send_error
    assert (e.error, e.message) == (pb.ChecksumError, "bad crc")
    assert one(C.success(5)).command.success.request_id == 5
    err = one(C.error(5, pb.TopicNotFound, "no")).command.error
    assert (err.request_id, err.error, err.message) == (5, pb.TopicNotFound, "no")

    lk = one(C.lookup_response(3, "pulsar://127.0.0.1:6650")).command.lookupTopicResponse
    assert lk.HasField("response") and lk.response == pb.CommandLookupTopicResponse.Connect
    assert lk.brokerServiceUrl == "pulsar://127.0.0.1:6650" and lk.request_id == 3
    lk = one(C.lookup_response(3, "pulsar://b:6650", redirect=True)).command.lookupTopicResponse
    assert lk.response == pb.CommandLookupTopicResponse.Redirect
    lk = one(C.lookup_failed(3, pb.ServiceNotReady, "later")).command.lookupTopicResponse
    assert lk.response == pb.CommandLookupTopicResponse.Failed and lk.error == pb.ServiceNotReady

    pm = one(C.partitioned_metadata_response(4, 0)).command.partitionMetadataResponse
    assert pm.HasField("response") and pm.response == pm.Success
    assert pm.HasField("partitions") and pm.partitions == 0
    pm = one(C.partitioned_metadata_failed(4, pb.MetadataError, "zk")).command.partitionMetadataResponse
    assert pm.response == pm.Failed and pm.error == pb.MetadataError

    lm = one(C.get_last_message_id_response(8, 12, -1, mark_delete=(12, 3))).command
    assert lm.type == T.GET_LAST_MESSAGE_ID_RESPONSE
    resp = lm.getLastMessageIdResponse
    assert resp.last_message_id.entryId == 2**64 - 1
    assert C.signed64(resp.last_message_id.entryId) == -1
    assert resp.consumer_mark_delete_position.entryId == 3

    assert one(C.ack_response(2, 9)).command.ackResponse.request_id == 9
    assert one(C.active_consumer_change(2, True)).command.active_consumer_change.is_active
    assert one(C.reached_end_of_topic(2)).command.reachedEndOfTopic.consumer_id == 2
    cp = one(C.close_producer(1, 2, assigned_broker_url="pulsar://b:1")).command.close_producer
    assert cp.assignedBrokerServiceUrl == "pulsar://b:1"
    assert one(C.close_consumer(1, 2)).command.close_consumer.request_id == 2
    tn = one(C.get_topics_of_namespace_response(3, ["persistent://a/b/c"])).command
    assert list(tn.getTopicsOfNamespaceResponse.topics) == ["persistent://a/b/c"]
    sc = C.schema("s", pb.Schema.Json, b"{}", {"k": "v"})
    gs = one(C.get_schema_response(3, schema=sc, schema_version=b"\0")).command.getSchemaResponse
    assert gs.schema == sc and gs.schema_version == b"\0"
    gs = one(C.get_schema_response(3, error=pb.TopicNotFound, error_message="none")).command
    assert gs.getSchemaResponse.error_code == pb.TopicNotFound
    gc = one(C.get_or_create_schema_response(3, schema_version=b"\1")).command
    assert gc.getOrCreateSchemaResponse.schema_version == b"\1"
    cs = one(C.consumer_stats_response(3, msgBacklog=10, consumerName="c")).command
    assert cs.consumerStatsResponse.msgBacklog == 10


def test_client_command_builders_round_trip():
    f = one(C.connect("pulsarlite-client", 19, auth_method_name="token", auth_data=b"t"))
    assert f.command.connect.protocol_version == 19 and f.command.connect.auth_data == b"t"
    assert one(C.lookup("persistent://t/n/x", 1)).command.lookupTopic.topic == "persistent://t/n/x"
    assert one(C.partitioned_metadata("x", 2)).command.partitionMetadata.request_id == 2
    p = one(C.producer("x", 0, 3, producer_name="p")).command.producer
    assert p.producer_name == "p" and p.user_provided_producer_name
    s = one(C.subscribe("x", "sub", pb.CommandSubscribe.Key_Shared, 0, 4, durable=False,
                        start_message_id=C.message_id(-1, -1))).command.subscribe
    assert s.subType == pb.CommandSubscribe.Key_Shared and not s.durable
    assert s.start_message_id.ledgerId == 2**64 - 1
    assert one(C.flow(0, 1000)).command.flow.messagePermits == 1000
    a = one(C.ack(0, [C.message_id(1, 2, batch_index=3, ack_set=[-2])], request_id=7)).command.ack
    assert a.ack_type == a.Individual and a.message_id[0].batch_index == 3
    assert list(a.message_id[0].ack_set) == [-2] and a.request_id == 7
    assert one(C.ack(0, [C.message_id(1, 2)], cumulative=True)).command.ack.ack_type == 1
    rd = one(C.redeliver_unacknowledged(0)).command.redeliverUnacknowledgedMessages
    assert len(rd.message_ids) == 0
    sk = one(C.seek(0, 5, publish_time_ms=123)).command.seek
    assert sk.message_publish_time == 123 and not sk.HasField("message_id")
    with pytest.raises(ValueError):
        C.seek(0, 5)
    assert one(C.unsubscribe(0, 6)).command.unsubscribe.request_id == 6
    assert one(C.get_last_message_id(0, 7)).command.getLastMessageId.request_id == 7
    assert one(C.get_schema(1, "x")).command.getSchema.topic == "x"
    sc = C.schema("s", pb.Schema.String, b"")
    assert one(C.get_or_create_schema(1, "x", sc)).command.getOrCreateSchema.schema == sc
    assert one(C.get_topics_of_namespace(1, "t/n")).command.getTopicsOfNamespace.namespace == "t/n"
    assert one(C.consumer_stats(1, 2)).command.consumerStats.consumer_id == 2


def test_send_and_message_payload_round_trip():
    entry = entry_of(b"payload", sequence_id=4)
    f = one(C.send(1, 4, entry, num_messages=1))
    assert f.type == T.SEND and f.command.send.sequence_id == 4
    assert bytes(f.entry) == entry and f.checksum == crc32c(entry) and f.checksum_ok
    assert f.broker_entry_metadata is None
    assert peek_metadata(f.entry).sequence_id == 4

    # the broker replays the stored entry verbatim, with the producer's stored CRC
    frame = C.message(3, 10, 20, f.entry, checksum=f.checksum, redelivery_count=2, ack_set=[6])
    m = one(frame)
    assert m.type == T.MESSAGE
    assert (m.command.message.consumer_id, m.command.message.message_id.ledgerId,
            m.command.message.message_id.entryId) == (3, 10, 20)
    assert m.command.message.redelivery_count == 2 and list(m.command.message.ack_set) == [6]
    assert bytes(m.entry) == entry and m.checksum_ok and m.checksum == crc32c(entry)
    assert one(C.message(3, 10, 20, entry)).checksum == crc32c(entry)


def test_message_parts_do_not_copy_the_entry():
    entry = memoryview(entry_of(b"x" * 1000))
    head, body = C.message_parts(1, 2, 3, entry)
    assert body is entry
    assert bytes(one(head + bytes(body)).entry) == bytes(entry)


def test_payload_frame_without_checksum_and_with_broker_entry_metadata():
    entry = entry_of()
    f = one(C.send(1, 0, entry, with_checksum=False))
    assert f.checksum is None and f.checksum_ok and bytes(f.entry) == entry
    bem = pb.BrokerEntryMetadata(broker_timestamp=1234, index=56)
    f = one(C.message(1, 2, 3, entry, broker_entry_metadata=bem))
    assert f.broker_entry_metadata == bem and f.checksum_ok and bytes(f.entry) == entry
    f = one(C.message(1, 2, 3, entry, broker_entry_metadata=bem, with_checksum=False))
    assert f.broker_entry_metadata == bem and f.checksum is None and bytes(f.entry) == entry


def test_bad_checksum_is_reported_per_frame_and_decoding_goes_on():
    entry = entry_of(b"abcdef")
    good = C.send(1, 0, entry)
    bad = bytearray(good)
    bad[-1] ^= 0x01                                       # flip a payload bit
    frames = FrameDecoder().feed(bytes(bad) + good + C.ping())
    assert [f.checksum_ok for f in frames] == [False, True, True]
    assert frames[0].checksum == crc32c(entry)            # what the producer claimed
    assert frames[2].type == T.PING


# --- the decoder on arbitrary chunking --------------------------------------------------------

def _frames_strategy():
    simple = st.sampled_from([C.ping(), C.pong(), C.flow(1, 500), C.success(3),
                              C.lookup("persistent://a/b/c", 9)])
    payload = st.builds(lambda p, s: C.send(1, s, entry_of(p, s)),
                        st.binary(max_size=300), st.integers(0, 2**40))
    return st.lists(st.one_of(simple, payload), min_size=1, max_size=8)


def _key(f: Frame):
    return (f.command.SerializeToString(), None if f.entry is None else bytes(f.entry),
            f.checksum, f.checksum_ok, f.frame_bytes)


@settings(max_examples=150, deadline=None)
@given(frames=_frames_strategy(), cuts=st.lists(st.integers(0, 5000), max_size=12))
def test_any_chunking_yields_the_same_frames(frames, cuts):
    stream = b"".join(frames)
    expected = [_key(f) for f in FrameDecoder().feed(stream)]
    assert len(expected) == len(frames)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    decoder = FrameDecoder()
    got = []
    for a, b in zip(points, points[1:]):
        got += decoder.feed(stream[a:b])
    assert [_key(f) for f in got] == expected
    assert decoder.buffered_bytes == 0


def test_split_at_every_byte_boundary():
    stream = C.ping() + C.send(1, 0, entry_of(b"z" * 50)) + C.flow(1, 7)
    expected = [_key(f) for f in FrameDecoder().feed(stream)]
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder()
        got = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert [_key(f) for f in got] == expected, cut
    decoder = FrameDecoder()
    got = [f for i in range(len(stream)) for f in decoder.feed(stream[i:i + 1])]
    assert [_key(f) for f in got] == expected


def test_many_frames_in_one_chunk_and_frames_outlive_later_feeds():
    entries = [entry_of(b"m%d" % i, i) for i in range(500)]
    stream = b"".join(C.send(1, i, e) for i, e in enumerate(entries))
    decoder = FrameDecoder()
    frames = decoder.feed(bytearray(stream[:-3]))         # mutable input is copied first
    frames += decoder.feed(memoryview(stream[-3:]))
    decoder.feed(C.ping() * 10)
    assert [bytes(f.entry) for f in frames] == entries
    assert [f.command.send.sequence_id for f in frames] == list(range(500))


def test_large_frame_in_small_chunks():
    entry = entry_of(b"q" * (4 << 20))
    stream = C.send(1, 0, entry)
    decoder = FrameDecoder()
    got = []
    for i in range(0, len(stream), 65536):
        got += decoder.feed(stream[i:i + 65536])
    assert len(got) == 1 and bytes(got[0].entry) == entry and got[0].checksum_ok


# --- limits and malformed input ---------------------------------------------------------------

def test_oversized_frame_is_refused_at_its_header():
    decoder = FrameDecoder(frame_bytes_max=1024)
    with pytest.raises(FrameTooLargeError):
        decoder.feed(struct.pack(">I", 1021))             # 1025 bytes with the prefix
    with pytest.raises(FrameTooLargeError):               # the decoder stays failed
        decoder.feed(C.ping())
    assert len(FrameDecoder(frame_bytes_max=1024).feed(struct.pack(">I", 1020) + b"\0" * 8)) == 0
    with pytest.raises(FrameTooLargeError):
        FrameDecoder().feed(C.send(1, 0, entry_of(b"x" * FRAME_BYTES_MAX_DEFAULT)))
    with pytest.raises(ValueError):
        FrameDecoder(frame_bytes_max=0x0E01_0000)


def _raw_frame(cmd: bytes, rest: bytes = b"", cmd_size: int | None = None) -> bytes:
    size = len(cmd) if cmd_size is None else cmd_size
    return struct.pack(">II", 4 + len(cmd) + len(rest), size) + cmd + rest


PING = T(type=T.PING, ping=pb.CommandPing()).SerializeToString()
SEND = T(type=T.SEND, send=pb.CommandSend(producer_id=1, sequence_id=2)).SerializeToString()


@pytest.mark.parametrize("frame", [
    struct.pack(">I", 3) + b"\0\0\0",                       # too short for a command size
    _raw_frame(PING, cmd_size=0),                          # empty command
    _raw_frame(PING, cmd_size=len(PING) + 1),              # command size overruns
    _raw_frame(b"\xff\xff\xff"),                           # not protobuf
    _raw_frame(b""),                                       # nothing at all
    _raw_frame(T(type=T.SEND, send=pb.CommandSend()).SerializePartialToString()),  # required
    _raw_frame(b"\x08\x63"),                               # unknown command type 99
    _raw_frame(SEND, b"\x0e"),                             # a byte after the command
    _raw_frame(SEND, b"\x0e\x01\0\0"),                     # truncated checksum
    _raw_frame(SEND, b"\x0e\x01\0\0\0\0"),                 # checksum but no metadata size
    _raw_frame(SEND, b"\x0e\x01\0\0\0\0" + struct.pack(">I", 10) + b"abc"),  # meta overruns
    _raw_frame(SEND, b"\x0e\x01\0\0\0\0" + struct.pack(">I", 0)),             # meta_size 0
    _raw_frame(SEND, b"\x0e\x02\0\0\0\x09\x08"),           # broker metadata overruns
    _raw_frame(SEND, b"\x0e\x02\0\0"),                     # truncated broker metadata header
])
def test_malformed_frames_raise(frame):
    decoder = FrameDecoder()
    with pytest.raises(MalformedFrameError):
        decoder.feed(frame)
    with pytest.raises(FrameError):
        decoder.feed(C.ping())


def test_known_but_unimplemented_command_types_still_parse():
    frame = _raw_frame(T(type=T.TC_CLIENT_CONNECT_REQUEST).SerializeToString() + b"\xf2\x03\x04\x08\x01\x10\x00")
    f = one(frame)
    assert f.type == T.TC_CLIENT_CONNECT_REQUEST


def test_decode_frame_checks_its_length():
    with pytest.raises(MalformedFrameError):
        decode_frame(C.ping() + b"\0")
    assert decode_frame(C.ping()).type == T.PING


def test_encoding_an_incomplete_command_is_a_bug():
    with pytest.raises(InvariantViolation):
        encode_command(T(type=T.SEND, send=pb.CommandSend()))
    with pytest.raises(InvariantViolation):
        encode_payload_command(T(type=T.PING, ping=pb.CommandPing()), b"\0")


def test_id_conversions():
    assert C.u64(-1) == 2**64 - 1 and C.signed64(2**64 - 1) == -1
    assert C.signed64(2**63 - 1) == 2**63 - 1 and C.u64(5) == 5


# -- SEND_RECEIPT is encoded by hand (broker hot path): byte for byte what protobuf writes ---------
def _receipt_via_protobuf(producer_id, sequence_id, ledger_id, entry_id, highest, partition) -> bytes:
    body = pb.CommandSendReceipt(producer_id=producer_id, sequence_id=sequence_id,
                                 message_id=C.message_id(ledger_id, entry_id, partition=partition))
    if highest is not None:
        body.highest_sequence_id = highest
    return encode_command(T(type=T.SEND_RECEIPT, send_receipt=body))


_U64 = st.one_of(st.integers(0, 300), st.integers(0, (1 << 64) - 1))
_ID = st.one_of(st.just(-1), st.integers(0, 1 << 20), st.integers(0, (1 << 63) - 1))


@settings(max_examples=400, deadline=None)
@given(producer_id=_U64, sequence_id=_U64, ledger_id=_ID, entry_id=_ID,
       highest=st.one_of(st.none(), _U64),
       partition=st.one_of(st.just(-1), st.integers(-(1 << 31), (1 << 31) - 1)))
def test_send_receipt_matches_protobuf_encoding(producer_id, sequence_id, ledger_id, entry_id, highest, partition):
    got = C.send_receipt(producer_id, sequence_id, ledger_id, entry_id, highest_sequence_id=highest,
                         partition=partition)
    assert got == _receipt_via_protobuf(producer_id, sequence_id, ledger_id, entry_id, highest, partition)
    r = one(got).command.send_receipt
    assert (r.producer_id, r.sequence_id, C.signed64(r.message_id.ledgerId), C.signed64(r.message_id.entryId)) == (
        producer_id, sequence_id, ledger_id, entry_id)


@pytest.mark.parametrize("bad", [dict(producer_id=-1), dict(sequence_id=1 << 64),
                                 dict(highest_sequence_id=-2), dict(partition=1 << 31)])
def test_send_receipt_refuses_out_of_range_ids(bad):
    args = dict(producer_id=1, sequence_id=2, ledger_id=3, entry_id=4)
    kwargs = {k: bad.pop(k) for k in ("highest_sequence_id", "partition") if k in bad}
    args.update(bad)
    with pytest.raises(ValueError):
        C.send_receipt(args["producer_id"], args["sequence_id"], args["ledger_id"], args["entry_id"], **kwargs)


def _message_via_protobuf(consumer_id, ledger_id, entry_id, entry, partition, redelivery_count, with_checksum,
                          ack_set=None):
    from pulsarlite.wire.frames import encode_payload_command_parts
    body = pb.CommandMessage(consumer_id=consumer_id,
                             message_id=C.message_id(ledger_id, entry_id, partition=partition))
    if redelivery_count:
        body.redelivery_count = redelivery_count
    if ack_set:
        body.ack_set.extend(ack_set)
    return encode_payload_command_parts(T(type=T.MESSAGE, message=body), entry, with_checksum=with_checksum)


@settings(max_examples=300, deadline=None)
@given(consumer_id=_U64, partition=st.one_of(st.just(-1), st.integers(0, (1 << 31) - 1)),
       with_checksum=st.booleans(),
       run=st.lists(st.tuples(st.integers(0, 3), _ID, st.one_of(st.just(0), st.integers(0, (1 << 32) - 1)),
                              st.one_of(st.none(), st.just([]), st.lists(st.integers(-(1 << 63), (1 << 63) - 1), min_size=1, max_size=3)),
                              st.binary(max_size=16)), max_size=8))
def test_message_run_parts_equal_each_message_via_protobuf(consumer_id, partition, with_checksum, run):
    # a run of MESSAGEs encoded together (the dispatch path: one ledger id part per ledger, ack
    # sets through protobuf) is the concatenation of each message as protobuf writes it
    messages = [((ledger_id, entry_id), entry_of(payload), redelivery_count, ack_set)
                for ledger_id, entry_id, redelivery_count, ack_set, payload in run]
    got = C.message_run_parts(consumer_id, messages, partition=partition, with_checksum=with_checksum)
    expected = [part for (ledger_id, entry_id), entry, redelivery_count, ack_set in messages
                for part in _message_via_protobuf(consumer_id, ledger_id, entry_id, entry, partition,
                                                  redelivery_count, with_checksum, ack_set)]
    assert b"".join(map(bytes, got)) == b"".join(map(bytes, expected))


@settings(max_examples=400, deadline=None)
@given(consumer_id=_U64, ledger_id=_ID, entry_id=_ID,
       partition=st.one_of(st.just(-1), st.integers(0, (1 << 31) - 1)),
       redelivery_count=st.one_of(st.just(0), st.integers(0, (1 << 32) - 1)),
       payload=st.binary(max_size=64), with_checksum=st.booleans())
def test_message_parts_match_protobuf_encoding(consumer_id, ledger_id, entry_id, partition, redelivery_count,
                                               payload, with_checksum):
    # the hand-encoded MESSAGE of the dispatch path: byte for byte protobuf's, and it parses back
    entry = entry_of(payload)
    got = C.message_parts(consumer_id, ledger_id, entry_id, entry, partition=partition,
                          redelivery_count=redelivery_count, with_checksum=with_checksum)
    assert b"".join(map(bytes, got)) == b"".join(map(bytes, _message_via_protobuf(
        consumer_id, ledger_id, entry_id, entry, partition, redelivery_count, with_checksum)))
    m = one(b"".join(map(bytes, got))).command.message
    assert (m.consumer_id, C.signed64(m.message_id.ledgerId), C.signed64(m.message_id.entryId),
            m.redelivery_count) == (consumer_id, ledger_id, entry_id, redelivery_count)
