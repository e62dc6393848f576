"""Framing of the Pulsar binary protocol, sans I/O.

Every frame is big-endian and length-prefixed::

    simple:   [u32 total][u32 cmd_size][BaseCommand]
    payload:  [u32 total][u32 cmd_size][BaseCommand]
              ([u16 0x0e02][u32 n][BrokerEntryMetadata])?      optional, broker to client only
              ([u16 0x0e01][u32 crc32c])?                       absent from protocol < 6 peers
              [u32 meta_size][MessageMetadata][payload]          = the "entry"

``total`` counts every byte after itself. The CRC32C covers the entry (everything after the
checksum field). The entry is what a broker stores, verbatim, and replays in MESSAGE frames.

:class:`FrameDecoder` takes arbitrary chunks of bytes and returns whole :class:`Frame` s;
:func:`encode_command` and :func:`encode_payload_command` build frames. The command builders
in :mod:`pulsarlite.wire.commands` sit on top of these.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from google.protobuf.message import DecodeError, EncodeError

from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.checksum import crc32c_of
from pulsarlite.errors import PulsarliteError, check

MAGIC_CRC32C = 0x0E01
MAGIC_BROKER_ENTRY_METADATA = 0x0E02

# A frame (length prefix included) may be at most this big by default: Pulsar's default
# maximum message size (5 MiB) plus its padding for the command and metadata (10 KiB).
MESSAGE_BYTES_MAX_DEFAULT = 5 * 1024 * 1024
FRAME_PADDING_BYTES = 10 * 1024
FRAME_BYTES_MAX_DEFAULT = MESSAGE_BYTES_MAX_DEFAULT + FRAME_PADDING_BYTES
# Above this, a meta_size field could be mistaken for the checksum magic (0x0e01....).
FRAME_BYTES_MAX_LIMIT = 0x0E01_0000

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_HEADER = struct.Struct(">II")           # total, cmd_size
_MAGIC_U32 = struct.Struct(">HI")        # magic, then a u32 (size or checksum)
_FRAME_HEADER_BYTES = 8


class FrameError(PulsarliteError):
    """The peer sent bytes that are not a valid frame. The stream cannot be trusted after it:
    close the connection."""


class FrameTooLargeError(FrameError):
    """A frame announced a size above the decoder's ``frame_bytes_max``."""


class MalformedFrameError(FrameError):
    """Sizes that do not add up, or a command that does not parse or lacks required fields."""


class Frame(NamedTuple):
    """One decoded frame (immutable; a NamedTuple rather than a frozen dataclass: one is built
    per frame on the broker's hot path and this costs a quarter of it).

    ``entry`` is ``[u32 meta_size][MessageMetadata][payload]`` for payload frames (SEND,
    MESSAGE), else None: a zero-copy view into the bytes the decoder was fed. ``checksum`` is
    the CRC32C the peer sent (None when it sent none); ``checksum_ok`` is False only when one
    was sent and does not match, so the broker can answer SEND_ERROR(ChecksumError) and go on.
    """

    command: pb.BaseCommand
    entry: memoryview | None = None
    checksum: int | None = None
    checksum_ok: bool = True
    broker_entry_metadata: pb.BrokerEntryMetadata | None = None
    frame_bytes: int = 0

    @property
    def type(self) -> int:
        """The command type, a ``pb.BaseCommand.Type`` value (e.g. ``pb.BaseCommand.SEND``)."""
        return self.command.type


def _parse(message_class, data, what: str):
    try:
        message = message_class.FromString(data)
    except DecodeError as exc:
        raise MalformedFrameError(f"{what} does not parse: {exc}") from None
    if not message.IsInitialized():
        missing = ", ".join(message.FindInitializationErrors())
        raise MalformedFrameError(f"{what} lacks required fields: {missing}")
    return message


class FrameDecoder:
    """Turns a byte stream into frames. Feed it whatever the transport delivers::

        decoder = FrameDecoder(frame_bytes_max=...)
        for frame in decoder.feed(data):
            ...

    A partial frame is kept until the rest arrives; it is copied once when complete (chunks are
    joined once, never re-joined per chunk). Frames hold views into immutable bytes, so they
    stay valid after later feeds. After a :class:`FrameError` the decoder refuses further input.
    """

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> None:
        if not 16 <= frame_bytes_max < FRAME_BYTES_MAX_LIMIT:
            raise ValueError(f"frame_bytes_max must be in [16, {FRAME_BYTES_MAX_LIMIT}), "
                             f"got {frame_bytes_max}")
        self.frame_bytes_max = frame_bytes_max
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._needed = 4           # bytes to buffer before the next parse attempt is useful
        self._failed: FrameError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an incomplete frame waiting for more input."""
        return self._buffered

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        if self._failed is not None:
            raise type(self._failed)(f"decoder failed earlier: {self._failed}")
        if not data:
            return []
        if type(data) is not bytes:
            data = bytes(data)   # frames keep views: they must be views of immutable bytes
        elif not self._chunks and len(data) >= 4 and _U32.unpack_from(data, 0)[0] + 4 == len(data) \
                and _FRAME_HEADER_BYTES < len(data) <= self.frame_bytes_max:
            # exactly one whole frame and nothing buffered (one SEND per read: the paced case):
            # what _decode_all gives for it
            try:
                return [_decode_at(data, memoryview(data), 0, len(data))]
            except FrameError as exc:
                self._failed = exc
                raise
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered < self._needed:
            return []
        buf = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        try:
            frames, consumed, needed = self._decode_all(buf)
        except FrameError as exc:
            self._failed = exc
            self._chunks.clear()
            self._buffered = 0
            raise
        rest = buf[consumed:] if consumed else buf
        self._chunks = [rest] if rest else []
        self._buffered = len(rest)
        self._needed = needed
        return frames

    def _decode_all(self, buf: bytes) -> tuple[list[Frame], int, int]:
        frames: list[Frame] = []
        view = memoryview(buf)
        size = len(buf)
        pos = 0
        frame_bytes_max = self.frame_bytes_max
        while True:
            if size - pos < 4:
                return frames, pos, 4
            frame_bytes = _U32.unpack_from(buf, pos)[0] + 4
            if frame_bytes > frame_bytes_max:
                raise FrameTooLargeError(
                    f"frame of {frame_bytes} bytes exceeds the limit of {frame_bytes_max}")
            if frame_bytes < _FRAME_HEADER_BYTES + 1:
                raise MalformedFrameError(f"frame of {frame_bytes} bytes cannot hold a command")
            if size - pos < frame_bytes:
                return frames, pos, frame_bytes
            frames.append(_decode_at(buf, view, pos, pos + frame_bytes))
            pos += frame_bytes


def decode_frame(frame: memoryview | bytes) -> Frame:
    """Decode exactly one whole frame (length prefix included). Raises MalformedFrameError."""
    buf = frame if type(frame) is bytes else bytes(frame)
    return _decode_at(buf, memoryview(buf), 0, len(buf))


_SEND = pb.BaseCommand.SEND


def _parse_command(data: bytes) -> pb.BaseCommand:
    """BaseCommand with its required fields checked. SEND (one per message) checks its own
    required fields by hand: IsInitialized() walks the whole message and costs more than the
    parse itself."""
    try:
        command = pb.BaseCommand.FromString(data)
    except DecodeError as exc:
        raise MalformedFrameError(f"command does not parse: {exc}") from None
    if command.type == _SEND and command.HasField("type") and command.HasField("send"):
        send = command.send
        if send.HasField("producer_id") and send.HasField("sequence_id") and not send.HasField("message_id"):
            return command
    if not command.IsInitialized():
        missing = ", ".join(command.FindInitializationErrors())
        raise MalformedFrameError(f"command lacks required fields: {missing}")
    return command


def _decode_at(buf: bytes, view: memoryview, start: int, end: int) -> Frame:
    """The frame in ``buf[start:end]`` (``view`` is ``memoryview(buf)``: the entry is a view of
    it). Works on offsets into the immutable buffer: no slice until something is kept."""
    frame_bytes = end - start
    if frame_bytes < _FRAME_HEADER_BYTES:
        raise MalformedFrameError(f"frame of {frame_bytes} bytes is shorter than its header")
    total, cmd_size = _HEADER.unpack_from(buf, start)
    if total + 4 != frame_bytes:
        raise MalformedFrameError(f"frame says {total + 4} bytes, has {frame_bytes}")
    if cmd_size == 0 or cmd_size > total - 4:
        raise MalformedFrameError(f"command size {cmd_size} does not fit a frame of {frame_bytes} bytes")
    pos = start + _FRAME_HEADER_BYTES + cmd_size
    # upb parses bytes about twice as fast as a memoryview; commands are small: copy
    command = _parse_command(buf[start + _FRAME_HEADER_BYTES:pos])
    if pos == end:
        return Frame(command, None, None, True, None, frame_bytes)

    broker_entry_metadata = None
    if end - pos >= 2 and _U16.unpack_from(buf, pos)[0] == MAGIC_BROKER_ENTRY_METADATA:
        if end - pos < 6:
            raise MalformedFrameError("truncated broker entry metadata header")
        size = _U32.unpack_from(buf, pos + 2)[0]
        if size > end - pos - 6:
            raise MalformedFrameError(f"broker entry metadata of {size} bytes overruns the frame")
        broker_entry_metadata = _parse(pb.BrokerEntryMetadata, buf[pos + 6:pos + 6 + size],
                                       "broker entry metadata")
        pos += 6 + size

    checksum = None
    checksum_ok = True
    entry = None
    if end - pos >= 2 and _U16.unpack_from(buf, pos)[0] == MAGIC_CRC32C:
        if end - pos < 6:
            raise MalformedFrameError("truncated checksum")
        checksum = _U32.unpack_from(buf, pos + 2)[0]
        pos += 6
        entry = view[pos:end]
        checksum_ok = crc32c_of(entry) == checksum

    if end - pos < 4:
        raise MalformedFrameError("payload frame without a metadata size")
    meta_size = _U32.unpack_from(buf, pos)[0]
    if meta_size == 0 or meta_size > end - pos - 4:
        raise MalformedFrameError(f"metadata size {meta_size} does not fit the frame")
    return Frame(command, entry if entry is not None else view[pos:end], checksum, checksum_ok,
                 broker_entry_metadata, frame_bytes)


def _serialize(command: pb.BaseCommand) -> bytes:
    try:
        return command.SerializeToString()
    except EncodeError as exc:  # a builder left a required field unset: our bug
        check(False, f"command {pb.BaseCommand.Type.Name(command.type)} incomplete: {exc}")
        raise


def encode_command(command: pb.BaseCommand) -> bytes:
    """``[u32 total][u32 cmd_size][BaseCommand]`` for a command without payload."""
    body = _serialize(command)
    return _HEADER.pack(len(body) + 4, len(body)) + body


def encode_payload_command_parts(
    command: pb.BaseCommand,
    entry: bytes | memoryview,
    *,
    checksum: int | None = None,
    with_checksum: bool = True,
    broker_entry_metadata: pb.BrokerEntryMetadata | None = None,
) -> list[bytes | memoryview]:
    """A payload frame as ``[head, entry]`` for ``transport.writelines`` (the entry is not
    copied). ``entry`` is ``[u32 meta_size][MessageMetadata][payload]``; ``checksum`` is its
    CRC32C if already known (e.g. stored with the entry), else it is computed.
    ``with_checksum=False`` leaves the checksum out (for peers below protocol 6)."""
    check(len(entry) >= 4, "an entry holds at least its metadata size")
    body = _serialize(command)
    head = [b"", body]
    extra = 0
    if broker_entry_metadata is not None:
        bem = broker_entry_metadata.SerializeToString()
        head.append(_MAGIC_U32.pack(MAGIC_BROKER_ENTRY_METADATA, len(bem)))
        head.append(bem)
        extra += 6 + len(bem)
    if with_checksum:
        if checksum is None:
            checksum = crc32c_of(entry)
        head.append(_MAGIC_U32.pack(MAGIC_CRC32C, checksum))
        extra += 6
    head[0] = _HEADER.pack(4 + len(body) + extra + len(entry), len(body))
    return [b"".join(head), entry]


def encode_payload_command(
    command: pb.BaseCommand,
    entry: bytes | memoryview,
    *,
    checksum: int | None = None,
    with_checksum: bool = True,
    broker_entry_metadata: pb.BrokerEntryMetadata | None = None,
) -> bytes:
    """Like :func:`encode_payload_command_parts`, joined into one ``bytes``."""
    head, body = encode_payload_command_parts(
        command, entry, checksum=checksum, with_checksum=with_checksum,
        broker_entry_metadata=broker_entry_metadata)
    return head + bytes(body)
