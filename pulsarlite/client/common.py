"""Argument handling shared by the blocking and the asyncio APIs."""

from __future__ import annotations

import re

from pulsarlite.client.auth import ClientSecurity
from pulsarlite.client.errors import AlreadyClosed, InvalidConfiguration, MessageTooBig, Timeout
from pulsarlite.client.consumer import ConsumerConf
from pulsarlite.client.producer import ProducerConf
from pulsarlite.client.types import ConsumerType, InitialPosition, Message, MessageId, RegexSubscriptionMode, Result
from pulsarlite.wire.entry import Message as WireMessage

_NO_PROPERTIES: dict[str, str] = {}


def result_of(error: BaseException) -> Result:
    """The ``Result`` a send callback gets for a failed send (both APIs, as the official
    client's codes)."""
    if isinstance(error, Timeout):
        return Result.Timeout
    if isinstance(error, AlreadyClosed):
        return Result.AlreadyClosed
    if isinstance(error, MessageTooBig):
        return Result.MessageTooBig
    return Result.UnknownError


def make_message(content, properties=None, partition_key=None, ordering_key=None,
                 event_timestamp=None, sequence_id=None) -> WireMessage:
    if isinstance(content, (bytearray, memoryview)):
        content = bytes(content)
    elif not isinstance(content, bytes):
        raise TypeError(f"content must be bytes, got {type(content).__name__} (encode strings "
                        "first, e.g. 'text'.encode())")
    if properties:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in properties.items()):
            raise TypeError("properties must map str to str")
    if partition_key is not None and not isinstance(partition_key, str):
        raise TypeError("partition_key must be a str")
    if ordering_key is not None:
        if isinstance(ordering_key, str):
            ordering_key = ordering_key.encode()
        elif not isinstance(ordering_key, (bytes, bytearray)):
            raise TypeError("ordering_key must be str or bytes")
        ordering_key = bytes(ordering_key)
    if event_timestamp is not None and (not isinstance(event_timestamp, int)
                                        or event_timestamp < 0):
        raise InvalidConfiguration("event_timestamp must be a non-negative int (ms)")
    if sequence_id is not None and (not isinstance(sequence_id, int) or sequence_id < 0):
        raise InvalidConfiguration("sequence_id must be a non-negative int")
    return WireMessage(content, partition_key, False, ordering_key, properties or _NO_PROPERTIES,
                       event_timestamp or None, sequence_id)


def producer_conf(*, producer_name=None, initial_sequence_id=None, send_timeout_millis=30000,
                  compression_type=0, max_pending_messages=1000, block_if_queue_full=False,
                  batching_enabled=None, batching_max_messages=1000,
                  batching_max_allowed_size_in_bytes=128 * 1024,
                  batching_max_publish_delay_ms=10, properties=None, batching_type=0,
                  schema=None, chunking_enabled=False, **ignored) -> tuple[ProducerConf, int, bool]:
    _check_ignored("create_producer", ignored, _PRODUCER_IGNORED, _PRODUCER_UNSUPPORTED)
    if chunking_enabled and batching_enabled:
        # the official client's own words (a ValueError there)
        raise InvalidConfiguration("Batching and chunking of messages can't be enabled together.")
    if batching_enabled is None:
        batching_enabled = not chunking_enabled   # pulsarlite batches by default
    if not isinstance(max_pending_messages, int) or max_pending_messages < 1:
        raise InvalidConfiguration("max_pending_messages must be an int >= 1")
    conf = ProducerConf(
        producer_name=producer_name, batching_enabled=batching_enabled,
        batching_max_messages=batching_max_messages,
        batching_max_allowed_size_in_bytes=batching_max_allowed_size_in_bytes,
        batching_max_publish_delay_ms=batching_max_publish_delay_ms,
        compression_type=compression_type, send_timeout_millis=send_timeout_millis,
        initial_sequence_id=initial_sequence_id, properties=properties,
        batching_type=batching_type, schema=check_schema(schema),
        chunking_enabled=chunking_enabled)
    return conf, max_pending_messages, bool(block_if_queue_full)


def check_schema(schema):
    """A pulsarlite.schema Schema, or None (bytes); BytesSchema is the same as None."""
    if schema is None:
        return None
    from pulsarlite.schema import BytesSchema, Schema
    if not isinstance(schema, Schema):
        raise InvalidConfiguration(f"schema= takes a pulsarlite.schema schema (AvroSchema, "
                                   f"JsonSchema, StringSchema, ...), got {type(schema).__module__}."
                                   f"{type(schema).__name__}")
    return None if isinstance(schema, BytesSchema) else schema


# keyword arguments of pulsar.Client.create_producer accepted for source compatibility: the
# first set changes nothing here; the second is refused unless left at its "off" value
_PRODUCER_IGNORED = frozenset({"max_pending_messages_across_partitions", "message_routing_mode",
                               "lazy_start_partitioned_producers"})
_PRODUCER_UNSUPPORTED = frozenset({"encryption_key",
                                   "crypto_key_reader", "message_router", "access_mode"})


def _check_ignored(what: str, given: dict, ignored: frozenset, unsupported: frozenset) -> None:
    for name, value in given.items():
        if name in ignored:
            continue
        if name in unsupported:
            if value in (None, False, 0):
                continue
            raise InvalidConfiguration(f"{what}(): {name}= is not supported by pulsarlite's "
                                       "client")
        raise TypeError(f"{what}() got an unexpected keyword argument {name!r}")


def consumer_conf(subscription_name, *, consumer_type=ConsumerType.Exclusive,
                  initial_position=InitialPosition.Latest, receiver_queue_size=1000,
                  negative_ack_redelivery_delay_ms=60000, consumer_name=None, properties=None,
                  schema=None, max_pending_chunked_message=10,
                  auto_ack_oldest_chunked_message_on_queue_full=False,
                  expire_time_of_incomplete_chunked_message_ms=60000, **ignored) -> ConsumerConf:
    _check_ignored("subscribe", ignored, _CONSUMER_IGNORED, _CONSUMER_UNSUPPORTED)
    return ConsumerConf(subscription_name, consumer_type=consumer_type,
                        initial_position=initial_position,
                        receiver_queue_size=receiver_queue_size,
                        negative_ack_redelivery_delay_ms=negative_ack_redelivery_delay_ms,
                        consumer_name=consumer_name, properties=properties,
                        schema=check_schema(schema),
                        max_pending_chunked_message=max_pending_chunked_message,
                        auto_ack_oldest_chunked_message_on_queue_full=(
                            auto_ack_oldest_chunked_message_on_queue_full),
                        expire_time_of_incomplete_chunked_message_ms=(
                            expire_time_of_incomplete_chunked_message_ms))


_CONSUMER_IGNORED = frozenset({"broker_consumer_stats_cache_time_ms",
                               "max_total_receiver_queue_size_across_partitions",
                               "replicate_subscription_state_enabled", "batch_index_ack_enabled",
                               "start_message_id_inclusive",
                               "crypto_failure_action"})
_CONSUMER_UNSUPPORTED = frozenset({"unacked_messages_timeout_ms", "is_read_compacted",
                                   "crypto_key_reader", "batch_receive_policy",
                                   "key_shared_policy", "dead_letter_policy",
                                   "message_listener"})


def regex_mode_of(mode) -> RegexSubscriptionMode:
    """A pattern subscription's mode from ours or the official ``pulsar.RegexSubscriptionMode``
    (by member name); InvalidConfiguration for anything else."""
    name = getattr(mode, "name", mode)
    try:
        return RegexSubscriptionMode[name]
    except (KeyError, TypeError):
        raise InvalidConfiguration(f"regex_subscription_mode must be PersistentOnly, NonPersistentOnly or "
                                   f"AllTopics, got {mode!r}") from None


def check_topic_arg(topic):
    if isinstance(topic, (str, re.Pattern)):
        return topic
    if isinstance(topic, (list, tuple)) and topic and all(isinstance(t, str) for t in topic):
        return list(topic)
    raise InvalidConfiguration("topic must be a str, a non-empty list of str, or a compiled "
                               "re.Pattern")


def mid_of(message_or_id) -> MessageId:
    if isinstance(message_or_id, MessageId):
        return message_or_id
    if isinstance(message_or_id, Message):
        return message_or_id.message_id()
    raise TypeError(f"expected a Message or MessageId, got {type(message_or_id).__name__}")


# pulsar.Client keyword arguments accepted for source compatibility that change nothing here
_CLIENT_IGNORED = frozenset({"stats_interval_in_seconds", "listener_name", "connection_max_idle_seconds",
                             "memory_limit_bytes", "io_threads", "message_listener_threads",
                             "concurrent_lookup_requests", "log_conf_file_path", "logger"})
_CLIENT_TLS = ("tls_trust_certs_file_path", "tls_allow_insecure_connection", "tls_validate_hostname",
               "tls_certificate_file_path", "tls_private_key_file_path")


def check_client_kwargs(use_tls, authentication, others) -> ClientSecurity:
    """The client's TLS and authentication settings (pulsar.Client's keyword arguments); TypeError
    for an argument pulsar.Client does not have either."""
    unknown = set(others) - _CLIENT_IGNORED - set(_CLIENT_TLS)
    if unknown:
        raise TypeError(f"Client() got unexpected keyword arguments {sorted(unknown)}")
    tls = {name: others[name] for name in _CLIENT_TLS if others.get(name) is not None}
    return ClientSecurity(authentication=authentication, use_tls=bool(use_tls), **tls)
