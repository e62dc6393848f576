"""The sans-IO core of the client (no sockets, no clocks, no event loop).

- :class:`ConnectionCore`: one connection's protocol state. Bytes in -> typed events out;
  commands out as bytes. It answers PING with PONG itself and refuses traffic before
  CONNECTED.
- :class:`BatchBuilder`: a producer's open batch (by messages and bytes); the shell owns the
  delay timer.
- :func:`murmur3_32`, :func:`partition_for_key`, :class:`RoundRobin`: partition routing.
- :class:`BatchAckTracker`: individual acks of batched messages collapse into one entry ack
  once every message of the batch is acked (as the official clients do without batch-index
  acks).
"""

from __future__ import annotations

import collections
import enum
import struct
from dataclasses import dataclass
from typing import Union

from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.client.errors import ClientError
from pulsarlite.errors import InvariantViolation
from pulsarlite.hashing import murmur3_32  # noqa: F401 - re-exported
from pulsarlite.wire import commands as c
from pulsarlite.wire.entry import Compression, Message as WireMessage, build_batch_entry, build_entry
from pulsarlite.wire.frames import FRAME_BYTES_MAX_DEFAULT, MESSAGE_BYTES_MAX_DEFAULT, FrameDecoder

T = pb.BaseCommand
CLIENT_VERSION = "pulsarlite-0.1.0"
PROTOCOL_VERSION = 19   # what pulsar-client 3.x (C++ 4.x) announces


# ---------------------------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Connected:
    protocol_version: int
    max_message_size: int
    server_version: str


@dataclass(frozen=True, slots=True)
class Response:
    """The answer to a request (SUCCESS, ERROR, PRODUCER_SUCCESS, LOOKUP_RESPONSE, ...).
    ``error`` is a ServerError value when the broker refused, with ``message``."""

    request_id: int
    command: pb.BaseCommand
    error: int | None = None
    message: str = ""


@dataclass(frozen=True, slots=True)
class Receipt:
    producer_id: int
    sequence_id: int
    highest_sequence_id: int
    ledger_id: int
    entry_id: int


@dataclass(frozen=True, slots=True)
class SendFailed:
    producer_id: int
    sequence_id: int
    error: int
    message: str


@dataclass(frozen=True, slots=True)
class MessageReceived:
    consumer_id: int
    ledger_id: int
    entry_id: int
    partition: int
    redelivery_count: int
    ack_set: tuple[int, ...]
    entry: memoryview
    checksum_ok: bool


@dataclass(frozen=True, slots=True)
class ProducerClosed:
    producer_id: int


@dataclass(frozen=True, slots=True)
class ConsumerClosed:
    consumer_id: int


@dataclass(frozen=True, slots=True)
class ActiveConsumerChanged:
    consumer_id: int
    is_active: bool


@dataclass(frozen=True, slots=True)
class Pong:
    pass


Event = Union[Connected, Response, Receipt, SendFailed, MessageReceived, ProducerClosed,
              ConsumerClosed, ActiveConsumerChanged, Pong]


class ConnectionState(enum.Enum):
    CONNECTING = "connecting"
    READY = "ready"
    FAILED = "failed"


class ProtocolError(ClientError):
    """The server broke the protocol: the connection must be closed (the shell tells the
    waiters a ConnectError, or an AuthenticationError for :class:`AuthenticationRefused`)."""


class AuthenticationRefused(ProtocolError):
    """The broker answered CONNECT (or a refresh) with AuthenticationError: the credentials are
    not accepted; the connection is closed and the same credentials are not tried again."""


@dataclass(frozen=True, slots=True)
class AuthChallenge:
    """The broker asks for fresh credentials (AUTH_CHALLENGE): answer with
    :meth:`ConnectionCore.auth_response_frame` of fresh data for ``method``."""

    method: str


# commands answering a request: type -> (field name, has error fields named error/message)
_RESPONSES = {
    T.SUCCESS: "success",
    T.ERROR: "error",
    T.PRODUCER_SUCCESS: "producer_success",
    T.LOOKUP_RESPONSE: "lookupTopicResponse",
    T.PARTITIONED_METADATA_RESPONSE: "partitionMetadataResponse",
    T.GET_LAST_MESSAGE_ID_RESPONSE: "getLastMessageIdResponse",
    T.GET_TOPICS_OF_NAMESPACE_RESPONSE: "getTopicsOfNamespaceResponse",
    T.ACK_RESPONSE: "ackResponse",
    T.GET_SCHEMA_RESPONSE: "getSchemaResponse",
    T.GET_OR_CREATE_SCHEMA_RESPONSE: "getOrCreateSchemaResponse",
    T.CONSUMER_STATS_RESPONSE: "consumerStatsResponse",
}

_L = pb.CommandLookupTopicResponse
_P = pb.CommandPartitionedTopicMetadataResponse


def _error_of(kind: int, body) -> tuple[int | None, str]:
    if kind == T.ERROR:
        return body.error, body.message
    if kind == T.LOOKUP_RESPONSE:
        return (body.error if body.HasField("error") else pb.UnknownError, body.message) \
            if body.response == _L.Failed else (None, "")
    if kind == T.PARTITIONED_METADATA_RESPONSE:
        return (body.error if body.HasField("error") else pb.UnknownError, body.message) \
            if body.response == _P.Failed else (None, "")
    if kind == T.ACK_RESPONSE and body.HasField("error"):
        return body.error, body.message
    if kind in (T.GET_SCHEMA_RESPONSE, T.GET_OR_CREATE_SCHEMA_RESPONSE,
                T.CONSUMER_STATS_RESPONSE) and body.HasField("error_code"):
        return body.error_code, body.error_message
    return None, ""


class ConnectionCore:
    """Protocol state of one client connection. Use::

        core = ConnectionCore()
        transport.write(core.connect_frame())
        for event in core.feed(data): ...          # data from the socket
        transport.write(b"".join(core.take_output()))   # PONGs the core produced
    """

    def __init__(self, *, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> None:
        self.state = ConnectionState.CONNECTING
        self._decoder = FrameDecoder(frame_bytes_max)
        self._output: list[bytes] = []
        self.protocol_version = 0
        self.max_message_size = MESSAGE_BYTES_MAX_DEFAULT

    def connect_frame(self, auth_method: str | None = None, auth_data: bytes | None = None) -> bytes:
        """CONNECT, with the authentication method and data when given (a client that
        authenticates says it can refresh its credentials, as the official client does)."""
        if auth_method is None:
            return c.connect(CLIENT_VERSION, PROTOCOL_VERSION)
        return c.connect(CLIENT_VERSION, PROTOCOL_VERSION, auth_method_name=auth_method, auth_data=auth_data,
                         supports_auth_refresh=True)

    def auth_response_frame(self, auth_method: str, auth_data: bytes) -> bytes:
        return c.auth_response(CLIENT_VERSION, self.protocol_version or PROTOCOL_VERSION, auth_method, auth_data)

    def take_output(self) -> list[bytes]:
        out, self._output = self._output, []
        return out

    def feed(self, data: bytes) -> list[Event]:
        """Raises FrameError or ProtocolError: the connection cannot be trusted after that."""
        events: list[Event] = []
        for frame in self._decoder.feed(data):
            event = self._on_frame(frame)
            if event is not None:
                events.append(event)
        return events

    def _on_frame(self, frame) -> Event | None:
        cmd = frame.command
        kind = cmd.type
        if self.state is ConnectionState.CONNECTING:
            if kind == T.CONNECTED:
                body = cmd.connected
                self.state = ConnectionState.READY
                self.protocol_version = body.protocol_version
                if body.HasField("max_message_size") and body.max_message_size > 0:
                    self.max_message_size = body.max_message_size
                return Connected(body.protocol_version, self.max_message_size,
                                 body.server_version)
            if kind == T.ERROR:
                self.state = ConnectionState.FAILED
                if cmd.error.error == pb.AuthenticationError:
                    raise AuthenticationRefused(f"AuthenticationError: {cmd.error.message}")
                raise ProtocolError(f"connect refused: {pb.ServerError.Name(cmd.error.error)}: "
                                    f"{cmd.error.message}")
            self.state = ConnectionState.FAILED
            raise ProtocolError(f"expected CONNECTED first, got {T.Type.Name(kind)}")
        if kind == T.MESSAGE:
            if frame.entry is None:
                raise ProtocolError("MESSAGE without payload")
            body = cmd.message
            mid = body.message_id
            return MessageReceived(
                body.consumer_id, c.signed64(mid.ledgerId), c.signed64(mid.entryId),
                mid.partition if mid.HasField("partition") else -1, body.redelivery_count,
                tuple(body.ack_set), frame.entry, frame.checksum_ok)
        if kind == T.SEND_RECEIPT:
            body = cmd.send_receipt
            mid = body.message_id
            highest = body.highest_sequence_id if body.HasField("highest_sequence_id") \
                else body.sequence_id
            return Receipt(body.producer_id, body.sequence_id, highest,
                           c.signed64(mid.ledgerId), c.signed64(mid.entryId))
        if kind == T.SEND_ERROR:
            body = cmd.send_error
            return SendFailed(body.producer_id, body.sequence_id, body.error, body.message)
        if kind == T.ERROR and cmd.error.error == pb.AuthenticationError:
            # a refresh refused (or credentials expired): the connection is over
            self.state = ConnectionState.FAILED
            raise AuthenticationRefused(f"AuthenticationError: {cmd.error.message}")
        field = _RESPONSES.get(kind)
        if field is not None:
            body = getattr(cmd, field)
            error, message = _error_of(kind, body)
            return Response(body.request_id, cmd, error, message)
        if kind == T.PING:
            self._output.append(c.pong())
            return None
        if kind == T.AUTH_CHALLENGE:
            return AuthChallenge(cmd.authChallenge.challenge.auth_method_name)
        if kind == T.PONG:
            return Pong()
        if kind == T.CLOSE_PRODUCER:
            return ProducerClosed(cmd.close_producer.producer_id)
        if kind == T.CLOSE_CONSUMER:
            return ConsumerClosed(cmd.close_consumer.consumer_id)
        if kind == T.ACTIVE_CONSUMER_CHANGE:
            body = cmd.active_consumer_change
            return ActiveConsumerChanged(body.consumer_id, body.is_active)
        # REACHED_END_OF_TOPIC and newer commands: nothing for us to do (unlike the C++
        # client, we keep the connection).
        return None


# ---------------------------------------------------------------------------------------------
# Producer: batches
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BatchLimits:
    messages_max: int = 1000
    bytes_max: int = 128 * 1024
    delay_ms: int = 10

    def __post_init__(self) -> None:
        if self.messages_max < 1 or self.bytes_max < 1 or self.delay_ms < 0:
            raise ValueError(f"invalid batch limits {self}")


class BatchBuilder:
    """The open batch of a producer. ``add`` returns True when the batch is full and must be
    built now (the shell also builds it when the delay runs out).

    A message is a WireMessage, or plain ``bytes`` (content only: no key, properties or event
    time). The sequence ids live in ``sequence_ids`` beside the messages (the shell assigns
    them; no per-message copy of the message to stamp it)."""

    def __init__(self, limits: BatchLimits) -> None:
        self.limits = limits
        self.messages: list[WireMessage | bytes] = []
        self.callbacks: list = []
        self.sequence_ids: list[int] = []
        self.payload_bytes = 0

    def __len__(self) -> int:
        return len(self.messages)

    def fits(self, payload_bytes: int) -> bool:
        """Whether a message of this size may join (an empty batch takes anything)."""
        return not self.messages or self.payload_bytes + payload_bytes <= self.limits.bytes_max

    def first_key(self) -> str | None:
        first = self.messages[0]
        return None if type(first) is bytes else first.key

    def add(self, message: WireMessage | bytes, callback, sequence_id: int | None = None) -> bool:
        """``sequence_id``: the message's (None: the message's own ``sequence_id``)."""
        messages = self.messages
        messages.append(message)
        self.callbacks.append(callback)
        if type(message) is bytes:
            self.payload_bytes += len(message)
        else:
            self.payload_bytes += len(message.payload)
            if sequence_id is None:
                sequence_id = message.sequence_id
        self.sequence_ids.append(sequence_id)
        limits = self.limits
        return len(messages) >= limits.messages_max or self.payload_bytes >= limits.bytes_max

    def build(self, *, producer_name: str, publish_time_ms: int,
              compression: Compression | int,
              schema_version: bytes | None = None) -> tuple[bytes, list, int, int, int]:
        """(entry, callbacks, message count, first sequence id, last sequence id); the builder
        is empty afterwards. Every message has its sequence id already."""
        messages = self.messages
        callbacks = self.callbacks
        seqs = self.sequence_ids
        count = len(messages)
        first, last = seqs[0], seqs[-1]
        entry = build_batch_entry(messages, producer_name=producer_name, sequence_id=first,
                                  publish_time_ms=publish_time_ms, compression=compression,
                                  highest_sequence_id=last, schema_version=schema_version,
                                  sequence_ids=seqs)
        self.messages = []
        self.callbacks = []
        self.sequence_ids = []
        self.payload_bytes = 0
        return entry, callbacks, count, first, last


def build_single(message: WireMessage, *, producer_name: str, sequence_id: int,
                 publish_time_ms: int, compression: Compression | int,
                 schema_version: bytes | None = None) -> bytes:
    return build_entry(message, producer_name=producer_name, sequence_id=sequence_id,
                       publish_time_ms=publish_time_ms, compression=compression,
                       schema_version=schema_version)


# ---------------------------------------------------------------------------------------------
# Producer: the ordered queue of sends awaiting their receipts
# ---------------------------------------------------------------------------------------------

class ReceiptVerdict(enum.Enum):
    ACKED = "acked"              # acknowledges the oldest pending send (now removed)
    STALE = "stale"              # for a send no longer pending (failed or acked before): ignore
    UNEXPECTED = "unexpected"    # ahead of the oldest pending send: reconnect and resend


class SendErrorAction(enum.Enum):
    FAIL_ONE = "fail_one"        # only the refused send fails; the connection stays
    FAIL_ALL = "fail_all"        # every pending send fails (the topic was terminated)
    RECONNECT = "reconnect"      # close the connection; resend every pending send afterwards


def send_error_action(server_error: int) -> SendErrorAction:
    """What a SEND_ERROR means for the producer, as Java's ClientCnx.handleSendError decides:
    a checksum or not-allowed refusal fails that send only, a terminated topic fails them all,
    anything else (a failed write, an unloaded topic, ...) closes the connection and the
    producer resends everything still pending once it is registered again."""
    if server_error in (pb.ChecksumError, pb.NotAllowedError):
        return SendErrorAction.FAIL_ONE
    if server_error == pb.TopicTerminatedError:
        return SendErrorAction.FAIL_ALL
    return SendErrorAction.RECONNECT


# PRODUCER refusals after which the pending sends fail at once instead of waiting for a
# reconnect that may never succeed (Java's ProducerImpl.connectionOpened); every other refusal
# is retried with backoff and the sends stay pending (until their send timeout)
_FAIL_PENDING_ON_REFUSAL = frozenset({pb.ProducerBlockedQuotaExceededError,
                                      pb.ProducerBlockedQuotaExceededException,
                                      pb.TopicTerminatedError, pb.ProducerFenced})


def refusal_fails_pending(server_error: int) -> bool:
    return server_error in _FAIL_PENDING_ON_REFUSAL


class PendingSends:
    """A producer's sends awaiting their receipts: ONE queue in send order (Pulsar's
    ``pendingMessages``). Items are the shell's ops: anything with ``first_seq`` (the sequence
    id the receipt names), ``last_seq`` and ``created_s`` (loop time of the send).

    The rules that keep a producer's messages stored in its order, as the Java and C++ clients:

    - after a reconnect the shell writes every pending send again, oldest first (iterate the
      queue), before anything new;
    - receipts come in order: one for the oldest pending send completes it; one for an older
      sequence id is stale (a send that failed or was acknowledged already); one further ahead
      means the broker skipped a send: reconnect and resend;
    - send timeout: once the OLDEST pending send is older than the timeout, EVERY pending send
      fails, not only the expired ones (Java's and C++'s ``failPendingMessages``). Failing only
      the expired prefix and resending the younger sends later lets a newer message that the
      broker accepted meanwhile be stored before them (found by the chaos suite, seed 15).
    """

    def __init__(self, send_timeout_s: float = 0.0) -> None:
        if not send_timeout_s >= 0:
            raise ValueError(f"send_timeout_s must be >= 0 (0: no timeout), got {send_timeout_s!r}")
        self.send_timeout_s = float(send_timeout_s)
        self._q: collections.deque = collections.deque()

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:
        return bool(self._q)

    def __iter__(self):
        return iter(self._q)

    @property
    def last(self):
        return self._q[-1] if self._q else None

    def append(self, op) -> None:
        q = self._q
        if q and op.created_s < q[-1].created_s:
            raise InvariantViolation(f"send {op.first_seq} created at {op.created_s} before "
                                     f"the send queued ahead of it ({q[-1].created_s})")
        q.append(op)

    def on_receipt(self, sequence_id: int):
        """(verdict, the completed op or None)."""
        q = self._q
        if not q:
            return ReceiptVerdict.STALE, None
        head = q[0]
        if sequence_id == head.first_seq:
            return ReceiptVerdict.ACKED, q.popleft()
        if sequence_id < head.first_seq:
            return ReceiptVerdict.STALE, None
        return ReceiptVerdict.UNEXPECTED, None

    def expire(self, now_s: float) -> list:
        """Every pending op (oldest first, now removed) if the oldest one is past the send
        timeout; else nothing."""
        q = self._q
        if self.send_timeout_s <= 0 or not q or now_s - q[0].created_s < self.send_timeout_s:
            return []
        return self.take_all()

    def deadline_s(self) -> float | None:
        """When the oldest pending op times out (None: nothing pending, or no timeout)."""
        if self.send_timeout_s <= 0 or not self._q:
            return None
        return self._q[0].created_s + self.send_timeout_s

    def remove(self, sequence_id: int):
        """The op whose first sequence id this is (removed), or None."""
        for op in self._q:
            if op.first_seq == sequence_id:
                self._q.remove(op)
                return op
        return None

    def take_all(self) -> list:
        out = list(self._q)
        self._q.clear()
        return out


# ---------------------------------------------------------------------------------------------
# Routing
# ---------------------------------------------------------------------------------------------



def java_string_hash(key: str) -> int:
    """Java's String.hashCode (Pulsar's JavaStringHash), as an unsigned 32-bit value."""
    data = key.encode("utf-16-be")
    h = 0
    for (unit,) in struct.iter_unpack(">H", data):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h


_M64 = (1 << 64) - 1
_MULXP_Q = 0x9E3779B97F4A7C15
_MULXP_K = 0xDF442D22CE4859B9


def _mulx(x: int, y: int) -> int:
    r = x * y
    return (r & _M64) ^ (r >> 64)


def boost_string_hash(key: str) -> int:
    """``boost::hash<std::string>`` as the official C++-based clients (pulsar-client 3.x)
    compute it on 64-bit Linux (Boost's mulxp1 string hash, seed 0): the default hashing scheme
    (BoostHash) of the official Python client. Checked against the official client's routing in
    tests/integration/test_client_interop.py."""
    data = key.encode("utf-8")
    n = len(data)
    q, k = _MULXP_Q, _MULXP_K
    w = _mulx(q, k)
    h = w ^ n
    i = 0
    while n - i >= 8:
        v1 = int.from_bytes(data[i:i + 8], "little")
        w = (w + q) & _M64
        h ^= _mulx((v1 + w) & _M64, k)
        i += 8
    rem = n - i
    v1 = 0
    if rem >= 4:
        v1 = ((int.from_bytes(data[i + rem - 4:i + rem], "little") << ((rem - 4) * 8))
              | int.from_bytes(data[i:i + 4], "little"))
    elif rem >= 1:
        x1 = (rem - 1) & 2
        x2 = rem >> 1
        v1 = (data[i + x1] << (x1 * 8)) | (data[i + x2] << (x2 * 8)) | data[i]
    w = (w + q) & _M64
    h ^= _mulx((v1 + w) & _M64, k)
    return _mulx((h + w) & _M64, k)


class HashingScheme(enum.Enum):
    """Same names as Pulsar's HashingScheme. BoostHash is the official Python client's default
    (its C++ core's); Murmur3_32Hash and JavaStringHash are the Java client's choices."""

    BoostHash = "boost"
    Murmur3_32Hash = "murmur3_32"
    JavaStringHash = "java_string"


def partition_for_key(key: str, partitions: int,
                      scheme: HashingScheme = HashingScheme.BoostHash) -> int:
    """The partition of a keyed message, as Pulsar's routers compute it:
    ``(hash(key) & INT32_MAX) % partitions``."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    if scheme is HashingScheme.JavaStringHash:
        h = java_string_hash(key)
    elif scheme is HashingScheme.Murmur3_32Hash:
        h = murmur3_32(key.encode("utf-8"))
    else:
        h = boost_string_hash(key)
    return (h & 0x7FFFFFFF) % partitions


class RoundRobin:
    """Round robin over partitions for messages without a key; with batching, a partition is
    kept for ``stick_messages`` messages (a batch) before moving on, as the official
    RoundRobinDistribution does per batch. ``start`` comes from the shell (randomness)."""

    def __init__(self, partitions: int, *, start: int = 0, stick_messages: int = 1) -> None:
        if partitions < 1 or stick_messages < 1:
            raise ValueError("partitions and stick_messages must be >= 1")
        self.partitions = partitions
        self.stick_messages = stick_messages
        self._current = start % partitions
        self._count = 0

    def next(self) -> int:
        partition = self._current
        self._count += 1
        if self._count >= self.stick_messages:
            self._count = 0
            self._current = (self._current + 1) % self.partitions
        return partition


# ---------------------------------------------------------------------------------------------
# Consumer: acks of batched messages
# ---------------------------------------------------------------------------------------------

class BatchAckTracker:
    """Which messages of each received batch are still unacked. ``ack`` returns True when the
    acked message completes its entry (then the entry itself is acked on the wire)."""

    def __init__(self) -> None:
        self._remaining: dict[tuple[int, int], set[int]] = {}

    def received(self, ledger_id: int, entry_id: int, indexes) -> None:
        self._remaining[(ledger_id, entry_id)] = set(indexes)

    def ack(self, ledger_id: int, entry_id: int, batch_index: int) -> bool:
        key = (ledger_id, entry_id)
        remaining = self._remaining.get(key)
        if remaining is None:
            return True   # unknown batch (e.g. received before a reconnect): ack the entry
        remaining.discard(batch_index)
        if remaining:
            return False
        del self._remaining[key]
        return True

    def forget_through(self, ledger_id: int, entry_id: int) -> None:
        """A cumulative ack through (ledger, entry) settles every batch up to it."""
        for key in [k for k in self._remaining if k <= (ledger_id, entry_id)]:
            del self._remaining[key]

    def clear(self) -> None:
        self._remaining.clear()

    def __len__(self) -> int:
        return len(self._remaining)


def ack_set_after(batch_index: int, batch_size: int) -> list[int]:
    """The ``ack_set`` words of a cumulative ack through ``batch_index`` of a batch of
    ``batch_size``: a set bit means "not yet acked" (indexes above batch_index)."""
    words = [0] * ((batch_size + 63) // 64)
    for i in range(batch_index + 1, batch_size):
        words[i // 64] |= 1 << (i % 64)
    return [w - (1 << 64) if w >= (1 << 63) else w for w in words]   # int64 on the wire


def unacked_indexes(ack_set: tuple[int, ...], batch_size: int) -> list[int] | None:
    """Indexes still to deliver according to a MESSAGE's ``ack_set`` (None: all)."""
    if not ack_set:
        return None
    out = []
    for i in range(batch_size):
        word = ack_set[i // 64] if i // 64 < len(ack_set) else 0
        if (word >> (i % 64)) & 1:
            out.append(i)
    return out
