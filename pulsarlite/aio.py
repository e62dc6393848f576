"""The asyncio API of pulsarlite's client: the objects of ``pulsarlite`` (Client, Producer,
Consumer, Reader), with coroutines instead of blocking calls::

    import pulsarlite.aio as pl

    async with pl.Client("pulsar://127.0.0.1:6650") as client:
        async with await client.create_producer("my-topic") as producer:
            await producer.send(b"hello")
        consumer = await client.subscribe("my-topic", "sub",
                                          initial_position=pl.InitialPosition.Earliest)
        async for msg in consumer:
            await consumer.acknowledge(msg)

Everything runs on the caller's event loop (no threads). ``send_async`` returns an
``asyncio.Future`` of the MessageId (and calls ``callback(result, message_id)`` if given).
"""

from __future__ import annotations

import asyncio

from pulsarlite.client.auth import AuthenticationBasic, AuthenticationTLS, AuthenticationToken
from pulsarlite.client.common import (result_of, check_client_kwargs, check_schema, check_topic_arg,
                                      consumer_conf, make_message, mid_of, producer_conf, regex_mode_of)
from pulsarlite.client.connection import ClientImpl, parse_service_url
from pulsarlite.client.consumer import create_reader as _create_reader
from pulsarlite.client.core import HashingScheme
from pulsarlite.client.errors import AuthenticationError
from pulsarlite.client.errors import (IncompatibleSchema, AlreadyClosed, BrokerError, ClientError, ConnectError,
                                      ConsumerBusy, InvalidConfiguration, InvalidTopicNameError,
                                      LookupError_, MessageTooBig, NotConnected, ProducerBusy,
                                      ProducerQueueIsFull, Timeout, TopicNotFound)
from pulsarlite.client.multi_consumer import subscribe as _subscribe
from pulsarlite.client.producer import create_producer as _create_producer
from pulsarlite.client.sink import AsyncSink
from pulsarlite.client.types import (BatchingType, CompressionType, ConsumerType, InitialPosition, Message,
                                     MessageId, Result)

__all__ = [
    "Client", "Producer", "Consumer", "Reader", "BatchingType", "CompressionType", "ConsumerType",
    "InitialPosition", "Message", "MessageId", "Result", "HashingScheme",
    "ClientError", "AlreadyClosed", "BrokerError", "ConnectError", "ConsumerBusy",
    "InvalidConfiguration", "InvalidTopicNameError", "LookupError_", "MessageTooBig",
    "NotConnected", "ProducerBusy", "ProducerQueueIsFull", "Timeout", "TopicNotFound",
    "IncompatibleSchema", "AuthenticationToken", "AuthenticationBasic", "AuthenticationTLS", "AuthenticationError",
]


async def _resolved(schema, msg: Message) -> Message:
    """``msg`` once its writer schema is known (an Avro consumer fetches each schema version
    once), so that ``msg.value()`` decodes without a round trip."""
    if schema is not None:
        from pulsarlite.schema.schemas import prefetch
        await prefetch(schema, msg)
    return msg



class Client:
    """Create it inside a running event loop (or call its coroutines from one)."""

    def __init__(self, service_url: str, operation_timeout_seconds: float = 30,
                 connection_timeout_ms: int = 10_000, keep_alive_interval_seconds: float = 30,
                 use_tls: bool = False, authentication=None, **ignored) -> None:
        security = check_client_kwargs(use_tls, authentication, ignored)
        parse_service_url(service_url)
        self._args = dict(operation_timeout_seconds=operation_timeout_seconds,
                          connection_timeout_ms=connection_timeout_ms,
                          keep_alive_interval_seconds=keep_alive_interval_seconds, security=security)
        self._service_url = service_url
        self._impl_: ClientImpl | None = None

    @property
    def _impl(self) -> ClientImpl:
        if self._impl_ is None:
            self._impl_ = ClientImpl(self._service_url, **self._args)
        return self._impl_

    async def create_producer(self, topic: str, producer_name: str | None = None,
                              hashing_scheme: HashingScheme = HashingScheme.BoostHash,
                              **kwargs) -> "Producer":
        conf, max_pending, block = producer_conf(producer_name=producer_name, **kwargs)
        producer = await _create_producer(self._impl, topic, conf, hashing_scheme)
        return Producer(producer, max_pending, block)

    async def subscribe(self, topic, subscription_name: str, consumer_type=None,
                        **kwargs) -> "Consumer":
        topic = check_topic_arg(topic)
        period = kwargs.pop("pattern_auto_discovery_period", 60)
        regex_mode = regex_mode_of(kwargs.pop("regex_subscription_mode", "PersistentOnly"))
        if consumer_type is not None:
            kwargs["consumer_type"] = consumer_type
        conf = consumer_conf(subscription_name, **kwargs)
        sink = AsyncSink(self._impl.loop)
        consumer = await _subscribe(self._impl, topic, conf, sink,
                                    pattern_auto_discovery_period_s=period,
                                    regex_subscription_mode=regex_mode)
        return Consumer(consumer, sink)

    async def create_reader(self, topic: str, start_message_id: MessageId, reader_name=None,
                            receiver_queue_size: int = 1000,
                            start_message_id_inclusive: bool = False,
                            subscription_role_prefix=None, schema=None, **ignored) -> "Reader":
        schema = check_schema(schema)
        sink = AsyncSink(self._impl.loop)
        reader = await _create_reader(
            self._impl, topic, start_message_id, sink,
            start_message_id_inclusive=start_message_id_inclusive,
            receiver_queue_size=receiver_queue_size, reader_name=reader_name,
            subscription_role_prefix=subscription_role_prefix, schema=schema)
        return Reader(reader, sink)

    async def get_topic_partitions(self, topic: str) -> list[str]:
        return await self._impl.topic_partitions(topic)

    async def close(self) -> None:
        if self._impl_ is not None:
            await self._impl_.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class Producer:
    def __init__(self, producer, max_pending: int, block: bool) -> None:
        self._impl = producer
        self._max_pending = max_pending
        self._block = block
        self._pending = 0
        self._space: asyncio.Event | None = None
        self._closed = False

    def topic(self) -> str:
        return self._impl.topic

    def producer_name(self) -> str:
        return self._impl.producer_name

    def last_sequence_id(self) -> int:
        return self._impl.last_sequence_id

    async def _slot(self) -> None:
        if self._closed:
            raise AlreadyClosed(f"producer on {self._impl.topic} is closed")
        while self._pending >= self._max_pending:
            if not self._block:
                raise ProducerQueueIsFull(f"{self._max_pending} messages pending on "
                                          f"{self._impl.topic}; block_if_queue_full is off")
            if self._space is None:
                self._space = asyncio.Event()
            self._space.clear()
            await self._space.wait()
        self._pending += 1

    def _release(self) -> None:
        self._pending -= 1
        if self._space is not None:
            self._space.set()

    async def send_async(self, content, callback=None, properties=None, partition_key=None,
                         ordering_key=None, sequence_id=None, event_timestamp=None,
                         **ignored) -> asyncio.Future:
        """Queue a message; returns a Future of its MessageId (await it, or don't)."""
        if self._impl.conf.schema is not None:
            content = self._impl.conf.schema.encode(content)
        message = make_message(content, properties, partition_key, ordering_key,
                               event_timestamp, sequence_id)
        await self._slot()
        future = asyncio.get_running_loop().create_future()

        def done(error, mid):
            self._release()
            if not future.done():
                if error is None:
                    future.set_result(mid)
                else:
                    future.set_exception(error)
                    future.exception()   # retrieved even when the caller ignores the future
            if callback is not None:
                callback(Result.Ok if error is None else result_of(error), mid)
        try:
            self._impl.send(message, done)
        except BaseException:
            self._release()
            raise
        return future

    async def send(self, content, properties=None, partition_key=None, ordering_key=None,
                   sequence_id=None, event_timestamp=None, **ignored) -> MessageId:
        future = await self.send_async(content, None, properties, partition_key, ordering_key,
                                       sequence_id, event_timestamp)
        return await future

    async def flush(self) -> None:
        await self._impl.flush()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._impl.close()

    async def __aenter__(self) -> "Producer":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class Consumer:
    def __init__(self, consumer, sink: AsyncSink) -> None:
        self._impl = consumer
        self._sink = sink
        self._closed = False

    def topic(self) -> str:
        return self._impl.topic

    def subscription_name(self) -> str:
        return self._impl.conf.subscription

    async def receive(self, timeout_millis: int | None = None) -> Message:
        if self._closed:
            raise AlreadyClosed("the consumer is closed")
        msg = await self._sink.get(None if timeout_millis is None else timeout_millis / 1000)
        return await _resolved(self._impl.conf.schema, msg)

    def _target(self, message):
        consumer = getattr(message, "_consumer", None)
        return consumer if consumer is not None else self._impl

    async def acknowledge(self, message) -> None:
        self._target(message).acknowledge(mid_of(message))

    async def acknowledge_cumulative(self, message) -> None:
        self._target(message).acknowledge_cumulative(mid_of(message))

    async def negative_acknowledge(self, message) -> None:
        self._target(message).negative_acknowledge(mid_of(message))

    async def redeliver_unacknowledged_messages(self) -> None:
        self._impl.redeliver_unacknowledged_messages()

    async def seek(self, target) -> None:
        await self._impl.seek(target)

    async def unsubscribe(self) -> None:
        await self._impl.unsubscribe()
        self._closed = True
        self._sink.close()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._sink.close()
            await self._impl.close()

    def __aiter__(self) -> "Consumer":
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except AlreadyClosed:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> "Consumer":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class Reader:
    def __init__(self, reader, sink: AsyncSink) -> None:
        self._impl = reader
        self._sink = sink
        self._closed = False

    def topic(self) -> str:
        return self._impl.topic

    async def read_next(self, timeout_millis: int | None = None) -> Message:
        if self._closed:
            raise AlreadyClosed("the reader is closed")
        msg = await self._sink.get(None if timeout_millis is None else timeout_millis / 1000)
        return await _resolved(self._impl.conf.schema, msg)

    async def has_message_available(self) -> bool:
        return await self._impl.has_message_available()

    async def seek(self, target) -> None:
        await self._impl.seek(target)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._sink.close()
            await self._impl.close()

    def __aiter__(self) -> "Reader":
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.read_next()
        except AlreadyClosed:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> "Reader":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
