"""Builders of every command pulsarlite sends, as ready-to-write frames.

The broker and our client build commands only through these functions, never protobuf by hand:
each returns the encoded frame (``bytes``), or for payload commands also a ``..._parts``
variant (a list for ``transport.writelines`` that does not copy the entry).

Ids: ledger and entry ids are unsigned on the wire; pass -1 for "none" (it travels as 2^64-1)
and read them back with :func:`signed64`. ``error`` arguments are ``pb.ServerError`` values,
e.g. ``pb.ChecksumError``.
"""

from __future__ import annotations

import struct
from typing import Iterable, Mapping, Sequence

from crc32c import crc32c

from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.varint import SMALL_VARINTS, uvarint
from pulsarlite.wire.frames import MAGIC_CRC32C, encode_command, encode_payload_command_parts

T = pb.BaseCommand
_U64_MASK = (1 << 64) - 1

# The newest protocol version this codec describes. A server answers CONNECT with
# min(client's, its own) -- see negotiate_protocol_version.
PROTOCOL_VERSION_MAX = 21


def u64(value: int) -> int:
    """A signed id (-1 = none) as the uint64 the wire carries."""
    return value & _U64_MASK


def signed64(value: int) -> int:
    """A uint64 id from the wire as a signed id: 2^64-1 -> -1, INT64_MAX stays."""
    return value - (1 << 64) if value >= (1 << 63) else value


def negotiate_protocol_version(client_version: int, server_version: int = PROTOCOL_VERSION_MAX) -> int:
    return min(client_version, server_version)


def message_id(ledger_id: int, entry_id: int, *, partition: int = -1, batch_index: int = -1,
               batch_size: int | None = None, ack_set: Sequence[int] | None = None) -> pb.MessageIdData:
    """A MessageIdData; fields at their defaults (-1) are left out of the encoding."""
    mid = pb.MessageIdData(ledgerId=u64(ledger_id), entryId=u64(entry_id))
    if partition != -1:
        mid.partition = partition
    if batch_index != -1:
        mid.batch_index = batch_index
    if batch_size is not None:
        mid.batch_size = batch_size
    if ack_set:
        mid.ack_set.extend(ack_set)
    return mid


def key_values(properties: Mapping[str, str] | Iterable[tuple[str, str]] | None) -> list[pb.KeyValue]:
    if not properties:
        return []
    items = properties.items() if isinstance(properties, Mapping) else properties
    return [pb.KeyValue(key=k, value=v) for k, v in items]


def schema(name: str, schema_type: int, data: bytes,
           properties: Mapping[str, str] | None = None) -> pb.Schema:
    """A Schema (``schema_type`` is a ``pb.Schema.Type`` value, e.g. ``pb.Schema.Avro``)."""
    return pb.Schema(name=name, type=schema_type, schema_data=data, properties=key_values(properties))


def _set_error(body, error: int | None, message: str | None, *, error_field: str = "error",
               message_field: str = "message") -> None:
    if error is not None:
        setattr(body, error_field, error)
    if message is not None:
        setattr(body, message_field, message)


# ---------------------------------------------------------------------------------------------
# Connection (both directions)
# ---------------------------------------------------------------------------------------------

def connect(client_version: str, protocol_version: int = PROTOCOL_VERSION_MAX, *,
            auth_method_name: str | None = None, auth_data: bytes | None = None,
            proxy_to_broker_url: str | None = None,
            supports_auth_refresh: bool = False,
            supports_broker_entry_metadata: bool = False) -> bytes:
    body = pb.CommandConnect(client_version=client_version, protocol_version=protocol_version)
    if auth_method_name is not None:
        body.auth_method_name = auth_method_name
    if auth_data is not None:
        body.auth_data = auth_data
    if proxy_to_broker_url is not None:
        body.proxy_to_broker_url = proxy_to_broker_url
    body.feature_flags.supports_auth_refresh = supports_auth_refresh
    body.feature_flags.supports_broker_entry_metadata = supports_broker_entry_metadata
    return encode_command(T(type=T.CONNECT, connect=body))


def connected(server_version: str, protocol_version: int, *, max_message_size: int | None = None,
              supports_auth_refresh: bool = False,
              supports_broker_entry_metadata: bool = False,
              supports_partial_producer: bool = False,
              supports_topic_watchers: bool = False) -> bytes:
    """The first frame a server sends. ``protocol_version`` should be
    :func:`negotiate_protocol_version` of the client's."""
    body = pb.CommandConnected(server_version=server_version, protocol_version=protocol_version)
    if max_message_size is not None:
        body.max_message_size = max_message_size
    flags = body.feature_flags
    flags.supports_auth_refresh = supports_auth_refresh
    flags.supports_broker_entry_metadata = supports_broker_entry_metadata
    flags.supports_partial_producer = supports_partial_producer
    flags.supports_topic_watchers = supports_topic_watchers
    return encode_command(T(type=T.CONNECTED, connected=body))


def auth_challenge(server_version: str, protocol_version: int, auth_method_name: str,
                   auth_data: bytes = b"refresh") -> bytes:
    """The broker asks a connected client for fresh credentials (Pulsar's ``refresh`` challenge);
    the client answers :func:`auth_response`."""
    return encode_command(T(type=T.AUTH_CHALLENGE, authChallenge=pb.CommandAuthChallenge(
        server_version=server_version, protocol_version=protocol_version,
        challenge=pb.AuthData(auth_method_name=auth_method_name, auth_data=auth_data))))


def auth_response(client_version: str, protocol_version: int, auth_method_name: str, auth_data: bytes) -> bytes:
    return encode_command(T(type=T.AUTH_RESPONSE, authResponse=pb.CommandAuthResponse(
        client_version=client_version, protocol_version=protocol_version,
        response=pb.AuthData(auth_method_name=auth_method_name, auth_data=auth_data))))


_PING = encode_command(T(type=T.PING, ping=pb.CommandPing()))
_PONG = encode_command(T(type=T.PONG, pong=pb.CommandPong()))


def ping() -> bytes:
    return _PING


def pong() -> bytes:
    return _PONG


def success(request_id: int, *, schema: pb.Schema | None = None) -> bytes:
    body = pb.CommandSuccess(request_id=request_id)
    if schema is not None:
        body.schema.CopyFrom(schema)
    return encode_command(T(type=T.SUCCESS, success=body))


def error(request_id: int, error: int, message: str) -> bytes:
    return encode_command(T(type=T.ERROR, error=pb.CommandError(
        request_id=request_id, error=error, message=message)))


# ---------------------------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------------------------

def lookup(topic: str, request_id: int, *, authoritative: bool = False) -> bytes:
    return encode_command(T(type=T.LOOKUP, lookupTopic=pb.CommandLookupTopic(
        topic=topic, request_id=request_id, authoritative=authoritative)))


def lookup_response(request_id: int, broker_service_url: str, *,
                    broker_service_url_tls: str | None = None, redirect: bool = False,
                    authoritative: bool = False, proxy_through_service_url: bool = False) -> bytes:
    """Connect (this broker owns the topic) or Redirect (ask ``broker_service_url``)."""
    L = pb.CommandLookupTopicResponse
    body = L(request_id=request_id, brokerServiceUrl=broker_service_url,
             response=L.Redirect if redirect else L.Connect, authoritative=authoritative,
             proxy_through_service_url=proxy_through_service_url)
    if broker_service_url_tls is not None:
        body.brokerServiceUrlTls = broker_service_url_tls
    return encode_command(T(type=T.LOOKUP_RESPONSE, lookupTopicResponse=body))


def lookup_failed(request_id: int, error: int, message: str) -> bytes:
    L = pb.CommandLookupTopicResponse
    return encode_command(T(type=T.LOOKUP_RESPONSE, lookupTopicResponse=L(
        request_id=request_id, response=L.Failed, error=error, message=message)))


def partitioned_metadata(topic: str, request_id: int) -> bytes:
    return encode_command(T(type=T.PARTITIONED_METADATA, partitionMetadata=
                            pb.CommandPartitionedTopicMetadata(topic=topic, request_id=request_id)))


def partitioned_metadata_response(request_id: int, partitions: int) -> bytes:
    """``partitions`` = 0 for a non-partitioned topic."""
    P = pb.CommandPartitionedTopicMetadataResponse
    return encode_command(T(type=T.PARTITIONED_METADATA_RESPONSE, partitionMetadataResponse=P(
        request_id=request_id, partitions=partitions, response=P.Success)))


def partitioned_metadata_failed(request_id: int, error: int, message: str) -> bytes:
    P = pb.CommandPartitionedTopicMetadataResponse
    return encode_command(T(type=T.PARTITIONED_METADATA_RESPONSE, partitionMetadataResponse=P(
        request_id=request_id, response=P.Failed, error=error, message=message)))


def get_topics_of_namespace(request_id: int, namespace: str, *,
                            mode: int = pb.CommandGetTopicsOfNamespace.PERSISTENT) -> bytes:
    return encode_command(T(type=T.GET_TOPICS_OF_NAMESPACE, getTopicsOfNamespace=
                            pb.CommandGetTopicsOfNamespace(request_id=request_id,
                                                           namespace=namespace, mode=mode)))


def get_topics_of_namespace_response(request_id: int, topics: Iterable[str], *,
                                     filtered: bool = False, topics_hash: str | None = None,
                                     changed: bool = True) -> bytes:
    body = pb.CommandGetTopicsOfNamespaceResponse(request_id=request_id, topics=list(topics),
                                                  filtered=filtered, changed=changed)
    if topics_hash is not None:
        body.topics_hash = topics_hash
    return encode_command(T(type=T.GET_TOPICS_OF_NAMESPACE_RESPONSE,
                            getTopicsOfNamespaceResponse=body))


# ---------------------------------------------------------------------------------------------
# Producing
# ---------------------------------------------------------------------------------------------

def producer(topic: str, producer_id: int, request_id: int, *, producer_name: str | None = None,
             schema: pb.Schema | None = None, epoch: int = 0,
             metadata: Mapping[str, str] | None = None,
             access_mode: int = pb.Shared) -> bytes:
    body = pb.CommandProducer(topic=topic, producer_id=producer_id, request_id=request_id,
                              epoch=epoch, metadata=key_values(metadata),
                              producer_access_mode=access_mode)
    if producer_name is not None:
        body.producer_name = producer_name
        body.user_provided_producer_name = True
    else:
        body.user_provided_producer_name = False
    if schema is not None:
        body.schema.CopyFrom(schema)
    return encode_command(T(type=T.PRODUCER, producer=body))


def producer_success(request_id: int, producer_name: str, *, last_sequence_id: int = -1,
                     schema_version: bytes | None = None, topic_epoch: int | None = None,
                     producer_ready: bool = True) -> bytes:
    body = pb.CommandProducerSuccess(request_id=request_id, producer_name=producer_name,
                                     last_sequence_id=last_sequence_id,
                                     producer_ready=producer_ready)
    if schema_version is not None:
        body.schema_version = schema_version
    if topic_epoch is not None:
        body.topic_epoch = topic_epoch
    return encode_command(T(type=T.PRODUCER_SUCCESS, producer_success=body))


def send_parts(producer_id: int, sequence_id: int, entry: bytes | memoryview, *,
               num_messages: int = 1, highest_sequence_id: int | None = None,
               checksum: int | None = None, with_checksum: bool = True,
               is_chunk: bool = False) -> list[bytes | memoryview]:
    body = pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id,
                          num_messages=num_messages)
    if is_chunk:
        body.is_chunk = True
    if highest_sequence_id is not None:
        body.highest_sequence_id = highest_sequence_id
    return encode_payload_command_parts(T(type=T.SEND, send=body), entry, checksum=checksum,
                                        with_checksum=with_checksum)


def send(producer_id: int, sequence_id: int, entry: bytes | memoryview, **kwargs) -> bytes:
    """SEND with ``entry`` = ``[u32 meta_size][MessageMetadata][payload]``; see send_parts."""
    head, body = send_parts(producer_id, sequence_id, entry, **kwargs)
    return head + bytes(body)


_U32_PAIR = struct.Struct(">II")
# BaseCommand{type: SEND_RECEIPT (field 1, varint 7), send_receipt: (field 7, length-delimited)}
_RECEIPT_PREFIX = bytes([0x08, T.SEND_RECEIPT, (7 << 3) | 2])


def send_receipt(producer_id: int, sequence_id: int, ledger_id: int, entry_id: int, *,
                 highest_sequence_id: int | None = None, partition: int = -1) -> bytes:
    """SEND_RECEIPT, encoded by hand: one goes out per SEND on the broker's publish path and
    this is ~3x cheaper than building protobuf objects. Byte for byte what protobuf writes
    (tests/unit/test_wire_frames.py compares them)."""
    if not (0 <= producer_id <= _U64_MASK and 0 <= sequence_id <= _U64_MASK
            and (highest_sequence_id is None or 0 <= highest_sequence_id <= _U64_MASK)):
        raise ValueError(f"ids out of uint64 range: producer {producer_id}, sequence {sequence_id}, "
                         f"highest {highest_sequence_id}")
    # MessageIdData{ledgerId: 1, entryId: 2, partition: 3 (int32; the default -1 is left out)}
    mid = b"".join((b"\x08", uvarint(ledger_id & _U64_MASK), b"\x10", uvarint(entry_id & _U64_MASK)))
    if partition != -1:
        if not -(1 << 31) <= partition < (1 << 31):
            raise ValueError(f"partition out of int32 range: {partition}")
        mid += b"\x18" + uvarint(partition & _U64_MASK)      # a negative int32: 10-byte varint
    parts = [b"\x08", uvarint(producer_id), b"\x10", uvarint(sequence_id), b"\x1a", SMALL_VARINTS[len(mid)], mid]
    if highest_sequence_id is not None:
        parts.append(b"\x20")
        parts.append(uvarint(highest_sequence_id))
    body = b"".join(parts)                   # at most 79 bytes: every length below fits one byte
    command_bytes = len(_RECEIPT_PREFIX) + 1 + len(body)
    return b"".join((_U32_PAIR.pack(command_bytes + 4, command_bytes), _RECEIPT_PREFIX,
                     SMALL_VARINTS[len(body)], body))


def send_receipts(producer_id: int, receipts: Iterable[tuple[int, int, int, int]]) -> bytes:
    """Several SEND_RECEIPTs of one producer, ``(sequence_id, highest_sequence_id, ledger_id,
    entry_id)`` each, as the bytes of their frames in order: byte for byte ``send_receipt(...,
    highest_sequence_id=highest)`` for each (tests/unit/test_publish_runs.py), at half the cost
    (the producer's and the ledger's fields are encoded once)."""
    if not 0 <= producer_id <= _U64_MASK:
        raise ValueError(f"producer id out of uint64 range: {producer_id}")
    head = b"\x08" + uvarint(producer_id) + b"\x10"
    small = SMALL_VARINTS
    pack = _U32_PAIR.pack
    join = b"".join
    prefix = _RECEIPT_PREFIX
    ledger = None
    ledger_head = b""
    out = []
    for sequence_id, highest, ledger_id, entry_id in receipts:
        if not (0 <= sequence_id <= _U64_MASK and 0 <= highest <= _U64_MASK):
            raise ValueError(f"ids out of uint64 range: sequence {sequence_id}, highest {highest}")
        if ledger_id != ledger:
            ledger = ledger_id
            ledger_head = b"\x08" + uvarint(ledger_id & _U64_MASK) + b"\x10"
        sequence = uvarint(sequence_id)
        entry = uvarint(entry_id & _U64_MASK)
        body = join((head, sequence, b"\x1a", small[len(ledger_head) + len(entry)], ledger_head, entry, b"\x20",
                     sequence if highest == sequence_id else uvarint(highest)))
        command_bytes = len(body) + 4
        out.append(pack(command_bytes + 4, command_bytes))
        out.append(prefix)
        out.append(small[len(body)])
        out.append(body)
    return join(out)


def send_error(producer_id: int, sequence_id: int, error: int, message: str) -> bytes:
    """Only ChecksumError keeps the official clients' connection open; any other error makes
    them close it and re-send after reconnecting."""
    return encode_command(T(type=T.SEND_ERROR, send_error=pb.CommandSendError(
        producer_id=producer_id, sequence_id=sequence_id, error=error, message=message)))


def close_producer(producer_id: int, request_id: int, *, assigned_broker_url: str | None = None,
                   assigned_broker_url_tls: str | None = None) -> bytes:
    body = pb.CommandCloseProducer(producer_id=producer_id, request_id=request_id)
    if assigned_broker_url is not None:
        body.assignedBrokerServiceUrl = assigned_broker_url
    if assigned_broker_url_tls is not None:
        body.assignedBrokerServiceUrlTls = assigned_broker_url_tls
    return encode_command(T(type=T.CLOSE_PRODUCER, close_producer=body))


# ---------------------------------------------------------------------------------------------
# Consuming
# ---------------------------------------------------------------------------------------------

def subscribe(topic: str, subscription: str, sub_type: int, consumer_id: int, request_id: int, *,
              consumer_name: str | None = None, durable: bool = True,
              start_message_id: pb.MessageIdData | None = None,
              initial_position: int = pb.CommandSubscribe.Latest,
              read_compacted: bool = False, schema: pb.Schema | None = None,
              priority_level: int | None = None) -> bytes:
    """``sub_type`` is a ``pb.CommandSubscribe.SubType`` value (Exclusive, Shared, ...)."""
    body = pb.CommandSubscribe(topic=topic, subscription=subscription, subType=sub_type,
                               consumer_id=consumer_id, request_id=request_id, durable=durable,
                               initialPosition=initial_position, read_compacted=read_compacted)
    if consumer_name is not None:
        body.consumer_name = consumer_name
    if start_message_id is not None:
        body.start_message_id.CopyFrom(start_message_id)
    if schema is not None:
        body.schema.CopyFrom(schema)
    if priority_level is not None:
        body.priority_level = priority_level
    return encode_command(T(type=T.SUBSCRIBE, subscribe=body))


def flow(consumer_id: int, message_permits: int) -> bytes:
    return encode_command(T(type=T.FLOW, flow=pb.CommandFlow(
        consumer_id=consumer_id, messagePermits=message_permits)))


def message_parts(consumer_id: int, ledger_id: int, entry_id: int, entry: bytes | memoryview, *,
                  checksum: int | None = None, partition: int = -1, redelivery_count: int = 0,
                  ack_set: Sequence[int] | None = None, consumer_epoch: int | None = None,
                  broker_entry_metadata: pb.BrokerEntryMetadata | None = None,
                  with_checksum: bool = True) -> list[bytes | memoryview]:
    """MESSAGE replaying a stored entry verbatim. ``checksum``: the entry's CRC32C if known
    (e.g. the producer's, stored with it), else computed here. ``ack_set``: for a partly
    acknowledged batch, the words of the bitset of messages still to deliver.

    The common MESSAGE (no ack_set, epoch, broker entry metadata or given checksum) is encoded
    by hand, by :func:`message_run_parts` (the dispatch path's encoder for a run of entries).
    Byte for byte what protobuf writes (tests/unit/test_wire_frames.py compares them)."""
    if consumer_epoch is None and broker_entry_metadata is None and checksum is None:
        return message_run_parts(consumer_id, [((ledger_id, entry_id), entry, redelivery_count, ack_set)],
                                 partition=partition, with_checksum=with_checksum)
    body = _message_command(consumer_id, ledger_id, entry_id, partition, redelivery_count, ack_set)
    if consumer_epoch is not None:
        body.consumer_epoch = consumer_epoch
    return encode_payload_command_parts(T(type=T.MESSAGE, message=body), entry, checksum=checksum,
                                        with_checksum=with_checksum,
                                        broker_entry_metadata=broker_entry_metadata)


def _message_command(consumer_id: int, ledger_id: int, entry_id: int, partition: int, redelivery_count: int,
                     ack_set) -> "pb.CommandMessage":
    """The CommandMessage of one entry through protobuf (the MESSAGEs not encoded by hand)."""
    body = pb.CommandMessage(consumer_id=consumer_id, message_id=message_id(ledger_id, entry_id, partition=partition))
    if redelivery_count:
        body.redelivery_count = redelivery_count
    if ack_set:
        body.ack_set.extend(ack_set)
    return body


def message_run_parts(consumer_id: int, messages: Iterable[tuple], *, partition: int = -1,
                      with_checksum: bool = True) -> list[bytes | memoryview]:
    """The MESSAGE frames of a run of stored entries to one consumer, in order: ``messages`` as
    ``((ledger_id, entry_id), entry, redelivery_count, ack_set or None)``. The same bytes as
    :func:`message_parts` of each in turn; the consumer's part of the command is encoded once
    per run, the ledger id's once per ledger. A message with an ack_set (or ids out of range)
    goes through protobuf."""
    parts: list[bytes | memoryview] = []
    by_hand = 0 <= consumer_id <= _U64_MASK and -1 <= partition < (1 << 31)
    # CommandMessage{consumer_id: 1, message_id: 2 (length-delimited), redelivery_count: 3 (0 left out)}
    head = b"".join((b"\x08", uvarint(consumer_id), b"\x12")) if by_hand else b""
    # MessageIdData{ledgerId: 1, entryId: 2, partition: 3 (the default -1 left out)}
    tail = b"\x18" + uvarint(partition) if by_hand and partition != -1 else b""
    small, pack, magic = SMALL_VARINTS, _U32_PAIR.pack, _MAGIC_U32.pack
    ledger_part, ledger_of_part = b"", None
    # per ledger and length of the entry id's varint: the command's bytes before that varint
    # (BaseCommand's prefix, the CommandMessage's length, the consumer id, the MessageIdData's
    # length, the ledger id); the command is at most 52 bytes: every length fits one byte
    before_entry: dict[int, bytes] = {}
    append = parts.append
    for (ledger_id, entry_id), entry, redelivery_count, ack_set in messages:
        if not by_hand or ack_set or not 0 <= redelivery_count < (1 << 32) or len(entry) < 4:
            body = _message_command(consumer_id, ledger_id, entry_id, partition, redelivery_count, ack_set)
            parts += encode_payload_command_parts(T(type=T.MESSAGE, message=body), entry,
                                                  with_checksum=with_checksum)
            continue
        if ledger_id != ledger_of_part:
            ledger_part, ledger_of_part = b"".join((b"\x08", uvarint(ledger_id & _U64_MASK), b"\x10")), ledger_id
            before_entry = {}
        entry_varint = uvarint(entry_id & _U64_MASK)
        if redelivery_count:
            redelivery = b"\x18" + uvarint(redelivery_count)
            mid_bytes = len(ledger_part) + len(entry_varint) + len(tail)
            before = b"".join((_MESSAGE_PREFIX, small[len(head) + 1 + mid_bytes + len(redelivery)], head,
                               small[mid_bytes], ledger_part))
        else:
            redelivery = b""
            before = before_entry.get(len(entry_varint))
            if before is None:
                mid_bytes = len(ledger_part) + len(entry_varint) + len(tail)
                before = before_entry[len(entry_varint)] = b"".join((
                    _MESSAGE_PREFIX, small[len(head) + 1 + mid_bytes], head, small[mid_bytes], ledger_part))
        command_bytes = len(before) + len(entry_varint) + len(tail) + len(redelivery)
        if with_checksum:
            append(b"".join((pack(command_bytes + 10 + len(entry), command_bytes), before, entry_varint, tail,
                             redelivery, magic(MAGIC_CRC32C, crc32c(entry)))))
        else:
            append(b"".join((pack(command_bytes + 4 + len(entry), command_bytes), before, entry_varint, tail,
                             redelivery)))
        append(entry)
    return parts


# BaseCommand{type: MESSAGE (field 1, varint 9), message: (field 9, length-delimited)}
_MESSAGE_PREFIX = bytes([0x08, T.MESSAGE, (9 << 3) | 2])
_MAGIC_U32 = struct.Struct(">HI")        # magic, then the checksum


def message(consumer_id: int, ledger_id: int, entry_id: int, entry: bytes | memoryview,
            **kwargs) -> bytes:
    head, body = message_parts(consumer_id, ledger_id, entry_id, entry, **kwargs)
    return head + bytes(body)


def ack(consumer_id: int, message_ids: Iterable[pb.MessageIdData], *, cumulative: bool = False,
        request_id: int | None = None) -> bytes:
    A = pb.CommandAck
    body = A(consumer_id=consumer_id, ack_type=A.Cumulative if cumulative else A.Individual,
             message_id=list(message_ids))
    if request_id is not None:
        body.request_id = request_id
    return encode_command(T(type=T.ACK, ack=body))


def ack_response(consumer_id: int, request_id: int, *, error: int | None = None,
                 message: str | None = None) -> bytes:
    body = pb.CommandAckResponse(consumer_id=consumer_id, request_id=request_id)
    _set_error(body, error, message)
    return encode_command(T(type=T.ACK_RESPONSE, ackResponse=body))


def redeliver_unacknowledged(consumer_id: int, message_ids: Iterable[pb.MessageIdData] = (), *,
                             consumer_epoch: int | None = None) -> bytes:
    """No ids: redeliver everything unacknowledged (what Exclusive/Failover consumers send)."""
    body = pb.CommandRedeliverUnacknowledgedMessages(consumer_id=consumer_id,
                                                     message_ids=list(message_ids))
    if consumer_epoch is not None:
        body.consumer_epoch = consumer_epoch
    return encode_command(T(type=T.REDELIVER_UNACKNOWLEDGED_MESSAGES,
                            redeliverUnacknowledgedMessages=body))


def unsubscribe(consumer_id: int, request_id: int, *, force: bool = False) -> bytes:
    return encode_command(T(type=T.UNSUBSCRIBE, unsubscribe=pb.CommandUnsubscribe(
        consumer_id=consumer_id, request_id=request_id, force=force)))


def seek(consumer_id: int, request_id: int, *, message_id: pb.MessageIdData | None = None,
         publish_time_ms: int | None = None) -> bytes:
    if (message_id is None) == (publish_time_ms is None):
        raise ValueError("seek takes exactly one of message_id and publish_time_ms")
    body = pb.CommandSeek(consumer_id=consumer_id, request_id=request_id)
    if message_id is not None:
        body.message_id.CopyFrom(message_id)
    else:
        body.message_publish_time = publish_time_ms
    return encode_command(T(type=T.SEEK, seek=body))


def close_consumer(consumer_id: int, request_id: int, *, assigned_broker_url: str | None = None,
                   assigned_broker_url_tls: str | None = None) -> bytes:
    body = pb.CommandCloseConsumer(consumer_id=consumer_id, request_id=request_id)
    if assigned_broker_url is not None:
        body.assignedBrokerServiceUrl = assigned_broker_url
    if assigned_broker_url_tls is not None:
        body.assignedBrokerServiceUrlTls = assigned_broker_url_tls
    return encode_command(T(type=T.CLOSE_CONSUMER, close_consumer=body))


def active_consumer_change(consumer_id: int, is_active: bool) -> bytes:
    return encode_command(T(type=T.ACTIVE_CONSUMER_CHANGE, active_consumer_change=
                            pb.CommandActiveConsumerChange(consumer_id=consumer_id,
                                                           is_active=is_active)))


def reached_end_of_topic(consumer_id: int) -> bytes:
    """Note: the C++-based clients (pulsar-client 3.x) drop the connection on this command."""
    return encode_command(T(type=T.REACHED_END_OF_TOPIC, reachedEndOfTopic=
                            pb.CommandReachedEndOfTopic(consumer_id=consumer_id)))


def get_last_message_id(consumer_id: int, request_id: int) -> bytes:
    return encode_command(T(type=T.GET_LAST_MESSAGE_ID, getLastMessageId=
                            pb.CommandGetLastMessageId(consumer_id=consumer_id,
                                                       request_id=request_id)))


def get_last_message_id_response(request_id: int, ledger_id: int, entry_id: int, *,
                                 partition: int = -1, batch_index: int = -1,
                                 mark_delete: tuple[int, int] | None = None) -> bytes:
    """On an empty topic pass ``entry_id=-1``. ``mark_delete``: the consumer's mark-delete
    position (ledger_id, entry_id), if any."""
    body = pb.CommandGetLastMessageIdResponse(
        request_id=request_id,
        last_message_id=message_id(ledger_id, entry_id, partition=partition,
                                   batch_index=batch_index))
    if mark_delete is not None:
        body.consumer_mark_delete_position.CopyFrom(message_id(*mark_delete, partition=partition))
    return encode_command(T(type=T.GET_LAST_MESSAGE_ID_RESPONSE, getLastMessageIdResponse=body))


def consumer_stats(request_id: int, consumer_id: int) -> bytes:
    return encode_command(T(type=T.CONSUMER_STATS, consumerStats=pb.CommandConsumerStats(
        request_id=request_id, consumer_id=consumer_id)))


def consumer_stats_response(request_id: int, *, error: int | None = None,
                            error_message: str | None = None, **stats) -> bytes:
    """``stats``: fields of CommandConsumerStatsResponse (msgRateOut=..., msgBacklog=...)."""
    body = pb.CommandConsumerStatsResponse(request_id=request_id, **stats)
    _set_error(body, error, error_message, error_field="error_code",
               message_field="error_message")
    return encode_command(T(type=T.CONSUMER_STATS_RESPONSE, consumerStatsResponse=body))


# ---------------------------------------------------------------------------------------------
# Schemas
# ---------------------------------------------------------------------------------------------

def get_schema(request_id: int, topic: str, *, schema_version: bytes | None = None) -> bytes:
    body = pb.CommandGetSchema(request_id=request_id, topic=topic)
    if schema_version is not None:
        body.schema_version = schema_version
    return encode_command(T(type=T.GET_SCHEMA, getSchema=body))


def get_schema_response(request_id: int, *, schema: pb.Schema | None = None,
                        schema_version: bytes | None = None, error: int | None = None,
                        error_message: str | None = None) -> bytes:
    body = pb.CommandGetSchemaResponse(request_id=request_id)
    if schema is not None:
        body.schema.CopyFrom(schema)
    if schema_version is not None:
        body.schema_version = schema_version
    _set_error(body, error, error_message, error_field="error_code",
               message_field="error_message")
    return encode_command(T(type=T.GET_SCHEMA_RESPONSE, getSchemaResponse=body))


def get_or_create_schema(request_id: int, topic: str, schema: pb.Schema) -> bytes:
    return encode_command(T(type=T.GET_OR_CREATE_SCHEMA, getOrCreateSchema=
                            pb.CommandGetOrCreateSchema(request_id=request_id, topic=topic,
                                                        schema=schema)))


def get_or_create_schema_response(request_id: int, *, schema_version: bytes | None = None,
                                  error: int | None = None,
                                  error_message: str | None = None) -> bytes:
    body = pb.CommandGetOrCreateSchemaResponse(request_id=request_id)
    if schema_version is not None:
        body.schema_version = schema_version
    _set_error(body, error, error_message, error_field="error_code",
               message_field="error_message")
    return encode_command(T(type=T.GET_OR_CREATE_SCHEMA_RESPONSE, getOrCreateSchemaResponse=body))
