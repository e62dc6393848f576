"""The client's value types, named like the official ``pulsar`` module's: CompressionType,
ConsumerType, InitialPosition, Result, MessageId and Message."""

from __future__ import annotations

import enum
from typing import Mapping

from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.wire.entry import Compression

_U64_MASK = (1 << 64) - 1
INT64_MAX = (1 << 63) - 1


class CompressionType(enum.IntEnum):
    """Same member names as ``pulsar.CompressionType``."""

    NONE = int(Compression.NONE)
    LZ4 = int(Compression.LZ4)
    ZLib = int(Compression.ZLIB)
    ZSTD = int(Compression.ZSTD)
    SNAPPY = int(Compression.SNAPPY)


class ConsumerType(enum.IntEnum):
    """Same member names as ``pulsar.ConsumerType``; values are the wire's SubType."""

    Exclusive = pb.CommandSubscribe.Exclusive
    Shared = pb.CommandSubscribe.Shared
    Failover = pb.CommandSubscribe.Failover
    KeyShared = pb.CommandSubscribe.Key_Shared


class RegexSubscriptionMode(enum.IntEnum):
    """Which topics a pattern (regex) subscription covers; same member names as
    ``pulsar.RegexSubscriptionMode``, values as the wire's CommandGetTopicsOfNamespace.Mode."""

    PersistentOnly = 0
    NonPersistentOnly = 1
    AllTopics = 2


class InitialPosition(enum.IntEnum):
    Latest = pb.CommandSubscribe.Latest
    Earliest = pb.CommandSubscribe.Earliest


class BatchingType(enum.IntEnum):
    """Same names and values as ``pulsar.BatchingType``. KeyBased: a batch holds messages of
    one key only (what Key_Shared subscriptions need)."""

    Default = 0
    KeyBased = 1


class Result(enum.Enum):
    """What a ``send_async`` callback receives first (``Result.Ok`` on success), as in
    ``pulsar.Result``."""

    Ok = "Ok"
    Timeout = "Timeout"
    AlreadyClosed = "AlreadyClosed"
    ProducerQueueIsFull = "ProducerQueueIsFull"
    MessageTooBig = "MessageTooBig"
    ConnectError = "ConnectError"
    UnknownError = "UnknownError"


class MessageId:
    """(ledger_id, entry_id, batch_index, partition), ordered like Pulsar's message ids.
    ``MessageId.earliest`` / ``MessageId.latest`` are the special start positions."""

    __slots__ = ("_ledger_id", "_entry_id", "_batch_index", "_partition", "_batch_size",
                 "_topic")

    earliest: "MessageId"
    latest: "MessageId"

    def __init__(self, partition: int = -1, ledger_id: int = -1, entry_id: int = -1,
                 batch_index: int = -1, batch_size: int = 0, topic: str | None = None) -> None:
        self._partition = partition
        self._ledger_id = ledger_id
        self._entry_id = entry_id
        self._batch_index = batch_index
        self._batch_size = batch_size
        self._topic = topic

    def ledger_id(self) -> int:
        return self._ledger_id

    def entry_id(self) -> int:
        return self._entry_id

    def batch_index(self) -> int:
        return self._batch_index

    def partition(self) -> int:
        return self._partition

    def batch_size(self) -> int:
        return self._batch_size

    def topic_name(self) -> str | None:
        return self._topic

    def _key(self) -> tuple[int, int, int]:
        return (self._ledger_id, self._entry_id, self._batch_index)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._key() == other._key() and self._partition == other._partition

    def __lt__(self, other: "MessageId") -> bool:
        return (self._partition, *self._key()) < (other._partition, *other._key())

    def __le__(self, other: "MessageId") -> bool:
        return self == other or self < other

    def __hash__(self) -> int:
        return hash((self._partition, *self._key()))

    def __repr__(self) -> str:
        return f"({self._ledger_id},{self._entry_id},{self._partition},{self._batch_index})"

    __str__ = __repr__

    def serialize(self) -> bytes:
        """The MessageIdData encoding (as the official clients' ``serialize``)."""
        return self.to_proto().SerializeToString()

    @classmethod
    def deserialize(cls, data: bytes) -> "MessageId":
        mid = pb.MessageIdData.FromString(data)
        return cls.from_proto(mid)

    def to_proto(self) -> pb.MessageIdData:
        mid = pb.MessageIdData(ledgerId=self._ledger_id & _U64_MASK,
                               entryId=self._entry_id & _U64_MASK)
        if self._partition != -1:
            mid.partition = self._partition
        if self._batch_index != -1:
            mid.batch_index = self._batch_index
        return mid

    @classmethod
    def from_proto(cls, mid: pb.MessageIdData, *, topic: str | None = None) -> "MessageId":
        ledger, entry = mid.ledgerId, mid.entryId
        ledger = ledger - (1 << 64) if ledger >= (1 << 63) else ledger
        entry = entry - (1 << 64) if entry >= (1 << 63) else entry
        return cls(mid.partition if mid.HasField("partition") else -1, ledger, entry,
                   mid.batch_index if mid.HasField("batch_index") else -1, topic=topic)


class ChunkMessageId(MessageId):
    """The id of a chunked message (Pulsar's ChunkMessageIdImpl): its ledger and entry are
    the LAST chunk's (so ordering, seeks and cumulative acks behave as for the entry that
    completed the message); ``first_chunk_message_id()`` is the first chunk's. It also knows
    every chunk entry (``chunk_message_ids()``): acking or negatively acking the message does
    so for each of them, as the official clients do."""

    __slots__ = ("_chunks",)

    def __init__(self, positions, partition: int = -1, topic: str | None = None) -> None:
        positions = tuple((int(l), int(e)) for l, e in positions)
        if len(positions) < 2:
            raise ValueError("a chunked message has at least two chunks")
        super().__init__(partition, positions[-1][0], positions[-1][1], -1, 0, topic)
        self._chunks = positions

    def first_chunk_message_id(self) -> MessageId:
        return MessageId(self._partition, *self._chunks[0], topic=self._topic)

    def last_chunk_message_id(self) -> MessageId:
        return MessageId(self._partition, *self._chunks[-1], topic=self._topic)

    def chunk_message_ids(self) -> list[MessageId]:
        return [MessageId(self._partition, l, e, topic=self._topic) for l, e in self._chunks]

    def __repr__(self) -> str:
        first = self._chunks[0]
        return (f"({first[0]},{first[1]},{self._partition},-1);"
                f"({self._ledger_id},{self._entry_id},{self._partition},-1)")

    __str__ = __repr__

    def to_proto(self) -> pb.MessageIdData:
        """The last chunk's id with ``first_chunk_message_id`` set (the wire's form)."""
        mid = super().to_proto()
        mid.first_chunk_message_id.CopyFrom(self.first_chunk_message_id().to_proto())
        return mid


MessageId.earliest = MessageId(-1, -1, -1, -1)
MessageId.latest = MessageId(-1, INT64_MAX, INT64_MAX, -1)


def is_earliest(mid: MessageId) -> bool:
    return mid._ledger_id == -1 and mid._entry_id == -1


def is_latest(mid: MessageId) -> bool:
    return mid._ledger_id == INT64_MAX and mid._entry_id == INT64_MAX


class Message:
    """A received message, with the official client's accessors. Built cheaply (consumers
    create one per message): ``m`` is the entry codec's message, ``e`` the entry's shared
    facts ``(publish_time_ms, producer_name, schema_version, redelivery_count, topic,
    partition, ledger_id, entry_id, batch_size)``; the MessageId is made on first use."""

    __slots__ = ("_m", "_e", "_consumer", "_epoch", "_mid", "_data")

    def __init__(self, m, e, consumer=None, epoch: int = 0) -> None:
        self._m = m
        self._e = e
        self._consumer = consumer
        self._epoch = epoch
        self._mid = None
        self._data = None

    def data(self) -> bytes:
        data = self._data
        if data is None:
            data = self._data = bytes(self._m.payload)
        return data

    def value(self):
        """The payload decoded with the consumer's (or reader's) schema; bytes without one."""
        consumer = self._consumer
        schema = None if consumer is None else getattr(consumer.conf, "schema", None)
        if schema is None:
            return self.data()
        return schema.decode_message(self)

    def key(self) -> str | None:
        return self._m.key

    def partition_key(self) -> str | None:
        return self._m.key

    def ordering_key(self) -> bytes | None:
        return self._m.ordering_key

    def properties(self) -> Mapping[str, str]:
        return dict(self._m.properties)

    def message_id(self) -> MessageId:
        mid = self._mid
        if mid is None:
            e = self._e
            mid = self._mid = MessageId(e[5], e[6], e[7], self._m.batch_index, e[8], e[4])
        return mid

    def publish_timestamp(self) -> int:
        """Milliseconds since the epoch."""
        return self._e[0]

    def event_timestamp(self) -> int:
        """Milliseconds since the epoch; 0 when the producer set none."""
        return self._m.event_time_ms or 0

    def redelivery_count(self) -> int:
        return self._e[3]

    def topic_name(self) -> str:
        return self._e[4]

    def producer_name(self) -> str:
        return self._e[1]

    def sequence_id(self) -> int:
        return self._m.sequence_id

    def schema_version(self) -> bytes | None:
        return self._e[2]

    def __repr__(self) -> str:
        return f"Message(id={self.message_id()}, key={self._m.key!r}, bytes={len(self._m.payload)})"


class ChunkedMessage(Message):
    """A message reassembled from its chunks: a Message whose id is a ChunkMessageId (set
    when it is built). Its own type, so the blocking API's one-entry ack fast path (which
    acks ``(ledger, entry)`` of the message) does not apply: acking it acks every chunk."""

    __slots__ = ()
