"""The bookie protocol's framing (sans-IO): pure encode functions and an incremental decoder.

A frame is ``[u32 frame_bytes][u8 frame_type][u64 request_id][protobuf body]``, big-endian;
``frame_bytes`` counts what follows it (9 + body bytes). The frame types are
``FrameType`` in proto/bookie_rpc.proto. No sockets, no asyncio: the server and the client
feed received bytes to a :class:`FrameDecoder` and write what the encode functions return.
"""

from __future__ import annotations

import struct
from typing import Iterator

from google.protobuf.message import DecodeError

from bookie._proto import bookie_rpc_pb2 as pb
from pulsarlite.errors import BookieError
from pulsarlite.varint import SMALL_VARINTS, uvarint

HEADER = struct.Struct(">IBQ")   # frame_bytes, frame_type, request_id
LENGTH = struct.Struct(">I")
TYPE_AND_ID = struct.Struct(">BQ")
HEADER_BYTES = HEADER.size       # 13
FRAME_OVERHEAD = HEADER_BYTES - LENGTH.size  # 9: counted in frame_bytes
REQUEST_ID_MAX = (1 << 64) - 1

REQUEST_TYPES = frozenset({pb.FRAME_ADD_REQUEST, pb.FRAME_READ_REQUEST, pb.FRAME_READ_LAC_REQUEST,
                           pb.FRAME_DELETE_LEDGER_REQUEST, pb.FRAME_BOOKIE_INFO_REQUEST,
                           pb.FRAME_AUTH_REQUEST})
RESPONSE_TYPES = frozenset({pb.FRAME_ADD_RESPONSE, pb.FRAME_READ_RESPONSE, pb.FRAME_READ_LAC_RESPONSE,
                            pb.FRAME_DELETE_LEDGER_RESPONSE, pb.FRAME_BOOKIE_INFO_RESPONSE,
                            pb.FRAME_ERROR_RESPONSE, pb.FRAME_AUTH_RESPONSE})

# frame type -> the message class of its body
MESSAGE_TYPES = {
    pb.FRAME_ADD_REQUEST: pb.AddRequest,
    pb.FRAME_ADD_RESPONSE: pb.AddResponse,
    pb.FRAME_READ_REQUEST: pb.ReadRequest,
    pb.FRAME_READ_RESPONSE: pb.ReadResponse,
    pb.FRAME_READ_LAC_REQUEST: pb.ReadLacRequest,
    pb.FRAME_READ_LAC_RESPONSE: pb.ReadLacResponse,
    pb.FRAME_DELETE_LEDGER_REQUEST: pb.DeleteLedgerRequest,
    pb.FRAME_DELETE_LEDGER_RESPONSE: pb.DeleteLedgerResponse,
    pb.FRAME_BOOKIE_INFO_REQUEST: pb.BookieInfoRequest,
    pb.FRAME_BOOKIE_INFO_RESPONSE: pb.BookieInfoResponse,
    pb.FRAME_ERROR_RESPONSE: pb.ErrorResponse,
    pb.FRAME_AUTH_REQUEST: pb.AuthRequest,
    pb.FRAME_AUTH_RESPONSE: pb.AuthResponse,
}


class FrameError(BookieError):
    """The byte stream broke the framing: the connection cannot be trusted any more (the bookie
    protocol's; ``pulsarlite.wire.frames.FrameError`` is the Pulsar protocol's).

    ``code`` is the StatusCode to answer with (TOO_LARGE or BAD_REQUEST); ``request_id`` is
    the offending frame's id when its header was readable, else 0."""

    def __init__(self, code: int, message: str, request_id: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id


def encode_header(frame_type: int, request_id: int, body_bytes: int) -> bytes:
    """The 13 header bytes of a frame whose body is ``body_bytes`` long (write the body after)."""
    return HEADER.pack(FRAME_OVERHEAD + body_bytes, frame_type, request_id)


def encode_frame(frame_type: int, request_id: int, body: bytes) -> bytes:
    """One whole frame (copies the body; for large bodies write the header and body apart)."""
    return HEADER.pack(FRAME_OVERHEAD + len(body), frame_type, request_id) + body


def encode_message(frame_type: int, request_id: int, message) -> bytes:
    return encode_frame(frame_type, request_id, message.SerializeToString())


# -- AddRequests from pre-encoded entries (the broker's hot path) ------------------------------
# Every entry goes to write_quorum bookies, many per AddRequest: the client encodes each entry
# once, as the bytes of one element of AddRequest.entries, and joins those per request instead
# of copying Entry messages into an AddRequest per bookie and serializing each. The result is
# byte for byte what protobuf writes for the whole AddRequest (tests/unit/test_transport.py).
_ENTRY_TAG = b"\x0a"                       # AddRequest.entries: field 1, length-delimited


def encode_add_entry(ledger_id: int, entry_id: int, lac: int, length: int, payload: bytes,
                     checksum: int) -> bytes:
    """One ``Entry`` as an element of ``AddRequest.entries`` (tag, length, message)."""
    message = pb.Entry(ledger_id=ledger_id, entry_id=entry_id, lac=lac, length=length, payload=payload,
                       checksum=checksum).SerializeToString()
    return b"".join((_ENTRY_TAG, uvarint(len(message)), message))


def encode_add_request_tail(recovery: bool, request_id: int) -> bytes:
    """The AddRequest fields after the entries: recovery (2), request_id (3)."""
    return (b"\x10\x01" if recovery else b"") + ((b"\x18" + uvarint(request_id)) if request_id else b"")


def encode_add_response(request_id: int, entries, codes) -> bytes:
    """An ``AddResponse`` body: one ``AddResult(ledger_id, entry_id, code)`` per entry (anything
    with ``ledger_id`` and ``entry_id``, ids in protobuf's ranges) with its code, then the
    request id; byte for byte what protobuf writes (tests/unit/test_transport.py). Built by
    hand: the bookie answers every AddRequest with one, and message objects per result cost
    more than the bytes."""
    parts = []
    append = parts.append
    small = SMALL_VARINTS
    prefix_lid = -1
    prefix = b""
    for entry, code in zip(entries, codes):
        lid = entry.ledger_id
        if lid != prefix_lid:
            prefix_lid = lid
            prefix = b"\x08" + uvarint(lid) if lid else b""
        eid = entry.entry_id
        if 0 < eid < 0x80:
            inner = prefix + b"\x10" + small[eid]
        elif eid:
            inner = prefix + b"\x10" + uvarint(eid)
        else:
            inner = prefix
        if code:
            inner += b"\x18" + uvarint(code)
        append(b"\x0a" + small[len(inner)] + inner)    # an AddResult is < 128 bytes
    if request_id:
        append(b"\x10" + uvarint(request_id))
    return b"".join(parts)


def encode_error(request_id: int, code: int, message: str) -> bytes:
    return encode_message(pb.FRAME_ERROR_RESPONSE, request_id, pb.ErrorResponse(code=code, message=message))


class FrameDecoder:
    """Incremental decoder: ``feed`` the bytes as they arrive, iterate what it yields.

    ``feed(data)`` yields ``(frame_type, request_id, body)`` for every frame completed by
    ``data`` (``body`` a memoryview into an immutable buffer, valid as long as it is held), then
    raises :class:`FrameError` if the stream holds a frame above ``frame_bytes_max``, shorter
    than its own header, or of a type outside ``frame_types``. Iterate each ``feed`` to its end
    before the next one. An oversized frame is refused as soon as its length is read, before its
    body arrives. ``close()`` raises FrameError if the stream ended inside a frame.
    """

    def __init__(self, frame_bytes_max: int, frame_types: frozenset[int] | set[int]) -> None:
        if frame_bytes_max < FRAME_OVERHEAD:
            raise ValueError(f"frame_bytes_max must be >= {FRAME_OVERHEAD}")
        self.frame_bytes_max = frame_bytes_max
        self.frame_types = frozenset(frame_types)
        self._parts: list[bytes] = []   # the start of an incomplete frame, in received pieces
        self._parts_bytes = 0
        self._needed = 0                # bytes the incomplete frame needs before a retry

    @property
    def buffered_bytes(self) -> int:
        return self._parts_bytes

    def feed(self, data: bytes | bytearray | memoryview) -> Iterator[tuple[int, int, memoryview]]:
        if self._parts:
            self._parts.append(bytes(data))
            self._parts_bytes += len(data)
            if self._parts_bytes < self._needed:
                return
            data = b"".join(self._parts)
            self._parts = []
            self._parts_bytes = 0
        elif type(data) is not bytes:
            data = bytes(data)  # frames are views of an immutable buffer
        view = memoryview(data)
        size = len(data)
        pos = 0
        frame_bytes_max = self.frame_bytes_max
        frame_types = self.frame_types
        unpack_length = LENGTH.unpack_from
        unpack_type_and_id = TYPE_AND_ID.unpack_from
        while size - pos >= HEADER_BYTES:
            (frame_bytes,) = unpack_length(data, pos)
            frame_type, request_id = unpack_type_and_id(data, pos + 4)
            if frame_bytes > frame_bytes_max:
                raise FrameError(pb.TOO_LARGE, f"frame of {frame_bytes} bytes is above the limit of "
                                 f"{frame_bytes_max}", request_id)
            if frame_bytes < FRAME_OVERHEAD:
                raise FrameError(pb.BAD_REQUEST, f"frame of {frame_bytes} bytes is shorter than its header",
                                 request_id)
            if frame_type not in frame_types:
                raise FrameError(pb.BAD_REQUEST, f"unknown frame type {frame_type}", request_id)
            end = pos + 4 + frame_bytes
            if end > size:
                break
            yield frame_type, request_id, view[pos + HEADER_BYTES:end]
            pos = end
        if pos < size:
            if size - pos >= 4:
                # the length is known: refuse an oversized frame before its body arrives
                (frame_bytes,) = unpack_length(data, pos)
                if frame_bytes > frame_bytes_max:
                    raise FrameError(pb.TOO_LARGE, f"frame of {frame_bytes} bytes is above the limit of "
                                     f"{frame_bytes_max}")
                self._needed = max(HEADER_BYTES, 4 + frame_bytes)
            else:
                self._needed = HEADER_BYTES
            rest = data[pos:]
            self._parts = [rest]
            self._parts_bytes = len(rest)

    def close(self) -> None:
        """The stream ended: raises FrameError if it stopped inside a frame."""
        if self._parts_bytes:
            raise FrameError(pb.BAD_REQUEST, f"stream ended inside a frame ({self._parts_bytes} bytes "
                             "of it received)")


def parse_body(frame_type: int, request_id: int, body) -> object:
    """The body's message; raises FrameError(BAD_REQUEST) when it does not parse."""
    try:
        return MESSAGE_TYPES[frame_type].FromString(body)
    except DecodeError as e:
        raise FrameError(pb.BAD_REQUEST, f"{pb.FrameType.Name(frame_type)} body does not parse: {e}",
                         request_id) from None
