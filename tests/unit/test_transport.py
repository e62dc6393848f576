"""The bookie protocol's frame codec (sans-IO): round trips at any split of the byte stream,
many frames per chunk, and clear errors for oversized, unknown and truncated frames."""

import pytest
from hypothesis import given, settings, strategies as st

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.transport import (HEADER, MESSAGE_TYPES, REQUEST_TYPES, RESPONSE_TYPES, FrameDecoder, FrameError,
                              encode_error, encode_frame, encode_header, encode_message, parse_body)

ALL_TYPES = REQUEST_TYPES | RESPONSE_TYPES


def decode_all(decoder: FrameDecoder, chunks) -> list[tuple[int, int, bytes]]:
    return [(t, rid, bytes(body)) for chunk in chunks for t, rid, body in decoder.feed(chunk)]


def test_header_layout_is_big_endian_length_type_id():
    frame = encode_frame(pb.FRAME_READ_REQUEST, 0x0102030405060708, b"abc")
    assert frame == b"\x00\x00\x00\x0c" + b"\x03" + bytes(range(1, 9)) + b"abc"
    assert encode_header(pb.FRAME_READ_REQUEST, 0x0102030405060708, 3) == frame[:13]


def test_every_frame_type_names_a_message_and_types_are_disjoint():
    assert set(MESSAGE_TYPES) == ALL_TYPES
    assert not REQUEST_TYPES & RESPONSE_TYPES
    assert set(pb.FrameType.values()) == ALL_TYPES | {pb.FRAME_TYPE_UNSPECIFIED}


def test_message_round_trip_and_body_is_a_view():
    request = pb.ReadRequest(ledger_id=7, first_entry_id=1, last_entry_id=9, fence=True)
    decoder = FrameDecoder(1024, REQUEST_TYPES)
    [(frame_type, request_id, body)] = list(decoder.feed(encode_message(pb.FRAME_READ_REQUEST, 42, request)))
    assert (frame_type, request_id) == (pb.FRAME_READ_REQUEST, 42)
    assert isinstance(body, memoryview)
    assert parse_body(frame_type, request_id, body) == request


def test_empty_body_is_a_valid_frame():
    decoder = FrameDecoder(1024, REQUEST_TYPES)
    frames = decode_all(decoder, [encode_message(pb.FRAME_BOOKIE_INFO_REQUEST, 1, pb.BookieInfoRequest())])
    assert frames == [(pb.FRAME_BOOKIE_INFO_REQUEST, 1, b"")]


frames_strategy = st.lists(
    st.tuples(st.sampled_from(sorted(REQUEST_TYPES)), st.integers(0, (1 << 64) - 1), st.binary(max_size=300)),
    max_size=20)


@settings(max_examples=300, deadline=None)
@given(frames=frames_strategy, data=st.data())
def test_any_split_of_the_stream_decodes_the_same_frames(frames, data):
    stream = b"".join(encode_frame(t, rid, body) for t, rid, body in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    chunks = [stream[a:b] for a, b in zip([0] + cuts, cuts + [len(stream)])]
    decoder = FrameDecoder(400, REQUEST_TYPES)
    assert decode_all(decoder, chunks) == frames
    assert decoder.buffered_bytes == 0
    decoder.close()  # ended at a frame boundary


@settings(max_examples=100, deadline=None)
@given(frames=frames_strategy)
def test_many_frames_in_one_chunk_and_byte_by_byte(frames):
    stream = b"".join(encode_frame(t, rid, body) for t, rid, body in frames)
    assert decode_all(FrameDecoder(400, REQUEST_TYPES), [stream]) == frames
    assert decode_all(FrameDecoder(400, REQUEST_TYPES), [stream[i:i + 1] for i in range(len(stream))]) == frames


@settings(max_examples=100, deadline=None)
@given(frames=frames_strategy.filter(bool), cut=st.integers(1, 10_000))
def test_stream_ending_inside_a_frame_is_an_error(frames, cut):
    stream = b"".join(encode_frame(t, rid, body) for t, rid, body in frames)
    cut = cut % len(stream)
    boundaries, pos = {0}, 0
    for t, rid, body in frames:
        pos += HEADER.size + len(body)
        boundaries.add(pos)
    decoder = FrameDecoder(400, REQUEST_TYPES)
    decode_all(decoder, [stream[:cut]])
    if cut in boundaries:
        decoder.close()
    else:
        with pytest.raises(FrameError) as err:
            decoder.close()
        assert err.value.code == pb.BAD_REQUEST


def test_frames_before_an_oversized_one_are_delivered_then_too_large():
    decoder = FrameDecoder(100, REQUEST_TYPES)
    good = encode_frame(pb.FRAME_READ_REQUEST, 1, b"x" * 10)
    big = encode_frame(pb.FRAME_ADD_REQUEST, 2, b"y" * 200)
    got = []
    with pytest.raises(FrameError) as err:
        for t, rid, body in decoder.feed(good + big):
            got.append((t, rid, bytes(body)))
    assert got == [(pb.FRAME_READ_REQUEST, 1, b"x" * 10)]
    assert err.value.code == pb.TOO_LARGE and err.value.request_id == 2


def test_oversized_frame_refused_from_its_length_alone():
    decoder = FrameDecoder(100, REQUEST_TYPES)
    with pytest.raises(FrameError) as err:
        list(decoder.feed(b"\x00\x10\x00\x00"))  # 1 MiB announced, nothing else sent yet
    assert err.value.code == pb.TOO_LARGE


def test_limit_is_inclusive():
    body = b"z" * (100 - 9)
    assert decode_all(FrameDecoder(100, REQUEST_TYPES), [encode_frame(pb.FRAME_ADD_REQUEST, 3, body)]) == [
        (pb.FRAME_ADD_REQUEST, 3, body)]
    with pytest.raises(FrameError):
        decode_all(FrameDecoder(99, REQUEST_TYPES), [encode_frame(pb.FRAME_ADD_REQUEST, 3, body)])


@pytest.mark.parametrize("frame_type", [0, 14, 200, pb.FRAME_ADD_RESPONSE, pb.FRAME_ERROR_RESPONSE,
                                        pb.FRAME_AUTH_RESPONSE])
def test_unknown_frame_type_is_bad_request(frame_type):
    decoder = FrameDecoder(1000, REQUEST_TYPES)
    with pytest.raises(FrameError) as err:
        decode_all(decoder, [encode_frame(frame_type, 5, b"")])
    assert err.value.code == pb.BAD_REQUEST and err.value.request_id == 5


def test_length_shorter_than_the_header_is_bad_request():
    with pytest.raises(FrameError) as err:
        decode_all(FrameDecoder(1000, REQUEST_TYPES), [b"\x00\x00\x00\x03" + b"\x01" * 9])
    assert err.value.code == pb.BAD_REQUEST


def test_unparsable_body_is_bad_request():
    with pytest.raises(FrameError) as err:
        parse_body(pb.FRAME_READ_REQUEST, 9, memoryview(b"\xff\xff\xff\xff\x0f not protobuf"))
    assert err.value.code == pb.BAD_REQUEST and err.value.request_id == 9


def test_error_frame():
    decoder = FrameDecoder(1000, RESPONSE_TYPES)
    [(t, rid, body)] = list(decoder.feed(encode_error(4, pb.TOO_LARGE, "too big")))
    assert (t, rid) == (pb.FRAME_ERROR_RESPONSE, 4)
    assert pb.ErrorResponse.FromString(body) == pb.ErrorResponse(code=pb.TOO_LARGE, message="too big")


def test_views_stay_valid_after_later_feeds():
    decoder = FrameDecoder(1000, REQUEST_TYPES)
    a = encode_frame(pb.FRAME_ADD_REQUEST, 1, b"first")
    b = encode_frame(pb.FRAME_ADD_REQUEST, 2, b"second")
    views = [body for chunk in (a + b[:5], b[5:]) for _, _, body in decoder.feed(chunk)]
    assert [bytes(v) for v in views] == [b"first", b"second"]


def test_frame_bytes_max_must_hold_a_header():
    with pytest.raises(ValueError):
        FrameDecoder(8, REQUEST_TYPES)


# -- AddRequests encoded by hand (the client's hot path): byte for byte what protobuf writes -------
from bookie.transport import encode_add_entry, encode_add_request_tail  # noqa: E402

_I64 = st.one_of(st.integers(-1, 300), st.integers(-(1 << 63), (1 << 63) - 1))


@settings(max_examples=300, deadline=None)
@given(entries=st.lists(st.tuples(st.integers(0, (1 << 64) - 1), _I64, _I64, _I64, st.binary(max_size=300),
                                  st.integers(0, (1 << 32) - 1)), max_size=5),
       recovery=st.booleans(), request_id=st.integers(0, (1 << 64) - 1))
def test_add_request_encoded_by_hand_matches_protobuf(entries, recovery, request_id):
    body = b"".join(encode_add_entry(*e) for e in entries) + encode_add_request_tail(recovery, request_id)
    expected = pb.AddRequest(entries=[pb.Entry(ledger_id=lid, entry_id=eid, lac=lac, length=length, payload=p,
                                               checksum=crc) for lid, eid, lac, length, p, crc in entries],
                             recovery=recovery, request_id=request_id)
    assert body == expected.SerializeToString()
    parsed = pb.AddRequest.FromString(body)
    assert [(e.ledger_id, e.entry_id, e.lac, e.length, e.payload, e.checksum) for e in parsed.entries] == entries


# -- AddResponses encoded by hand (the bookie's hot path): byte for byte what protobuf writes ------
from bookie.storage import StoredEntry  # noqa: E402
from bookie.transport import encode_add_response  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(results=st.lists(st.tuples(st.one_of(st.integers(0, 3), st.integers(0, (1 << 64) - 1)), _I64,
                                  st.sampled_from(sorted(pb.StatusCode.values()))), max_size=6),
       request_id=st.integers(0, (1 << 64) - 1))
def test_add_response_encoded_by_hand_matches_protobuf(results, request_id):
    entries = [StoredEntry(lid, eid, -1, 0, b"", 0) for lid, eid, _ in results]
    body = encode_add_response(request_id, entries, [code for _, _, code in results])
    expected = pb.AddResponse(request_id=request_id, results=[
        pb.AddResult(ledger_id=lid, entry_id=eid, code=code) for lid, eid, code in results])
    assert body == expected.SerializeToString()
    parsed = pb.AddResponse.FromString(body)
    assert [(r.ledger_id, r.entry_id, r.code) for r in parsed.results] == results
