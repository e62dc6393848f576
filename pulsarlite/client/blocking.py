"""The blocking API, shaped like the official ``pulsar`` module: ``Client``, ``Producer``,
``Consumer``, ``Reader``. Each Client runs the asyncio client on one background event-loop thread
(as the official client runs its I/O thread); calls from application threads hand work to it.

Hot paths avoid a thread hop per message: ``send_async`` appends to an inbox that the loop
drains in bulk, ``receive`` takes from a thread-safe receiver queue, and acks are handed over in
bulk the same way. ``send_async`` callbacks run on the loop thread, like the official client's.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import logging
import threading

from pulsarlite.client.common import (result_of, check_client_kwargs, check_schema, check_topic_arg,
                                      consumer_conf, make_message, mid_of, producer_conf, regex_mode_of)
from pulsarlite.client.connection import ClientImpl, parse_service_url
from pulsarlite.client.consumer import ConsumerImpl, create_reader as _create_reader
from pulsarlite.client.core import HashingScheme
from pulsarlite.client.errors import (AlreadyClosed, MessageTooBig,
                                      ProducerQueueIsFull, Timeout)
from pulsarlite.client.multi_consumer import subscribe as _subscribe
from pulsarlite.client.producer import create_producer as _create_producer
from pulsarlite.client.sink import ThreadSink
from pulsarlite.client.types import ChunkMessageId, Message, MessageId, RegexSubscriptionMode, Result

log = logging.getLogger("pulsarlite.client")


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()


class _LoopThread:
    def __init__(self) -> None:
        self.loop = _new_loop()
        self.thread = threading.Thread(target=self._run, name="pulsarlite-client-io",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        self.loop.close()

    def run(self, coro, timeout_s: float | None = None):
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("blocking pulsarlite calls cannot run on the client's I/O "
                               "thread (e.g. inside a send_async callback)")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise Timeout(f"operation did not finish within {timeout_s:g}s") from None

    def call(self, fn, *args) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self.thread:
            self.thread.join(10)



class Client:
    """``pulsarlite.Client("pulsar://127.0.0.1:6650")``, as ``pulsar.Client``."""

    def __init__(self, service_url: str, operation_timeout_seconds: float = 30,
                 connection_timeout_ms: int = 10_000, keep_alive_interval_seconds: float = 30,
                 io_threads: int = 1, message_listener_threads: int = 1,
                 concurrent_lookup_requests: int = 50000, log_conf_file_path=None, logger=None,
                 use_tls: bool = False, authentication=None, **ignored) -> None:
        security = check_client_kwargs(use_tls, authentication, ignored)
        parse_service_url(service_url)   # validate before starting a thread
        self._io = _LoopThread()
        self._timeout_s = float(operation_timeout_seconds)

        async def make():
            return ClientImpl(service_url,
                                   operation_timeout_seconds=operation_timeout_seconds,
                                   connection_timeout_ms=connection_timeout_ms,
                                   keep_alive_interval_seconds=keep_alive_interval_seconds,
                                   security=security)
        try:
            self._impl = self._io.run(make())
        except BaseException:
            self._io.stop()
            raise
        self._closed = False

    def _run(self, coro, extra_s: float = 5.0):
        if self._closed:
            coro.close()
            raise AlreadyClosed("the client is closed")
        return self._io.run(coro, self._timeout_s + extra_s)

    def create_producer(self, topic: str, producer_name: str | None = None,
                        hashing_scheme: HashingScheme = HashingScheme.BoostHash,
                        **kwargs) -> "Producer":
        conf, max_pending, block = producer_conf(producer_name=producer_name, **kwargs)
        producer = self._run(_create_producer(self._impl, topic, conf, hashing_scheme),
                             extra_s=10)
        return Producer(self, producer, max_pending, block)

    def subscribe(self, topic, subscription_name: str, consumer_type=None, **kwargs) -> "Consumer":
        topic = check_topic_arg(topic)
        pattern_period = kwargs.pop("pattern_auto_discovery_period", 60)
        regex_mode = regex_mode_of(kwargs.pop("regex_subscription_mode", RegexSubscriptionMode.PersistentOnly))
        if consumer_type is not None:
            kwargs["consumer_type"] = consumer_type
        conf = consumer_conf(subscription_name, **kwargs)
        sink = ThreadSink(self._io.loop)
        consumer = self._run(_subscribe(self._impl, topic, conf, sink,
                                        pattern_auto_discovery_period_s=pattern_period,
                                        regex_subscription_mode=regex_mode),
                             extra_s=10)
        return Consumer(self, consumer, sink)

    def create_reader(self, topic: str, start_message_id: MessageId, reader_name=None,
                      receiver_queue_size: int = 1000, start_message_id_inclusive: bool = False,
                      subscription_role_prefix=None, schema=None, **ignored) -> "Reader":
        schema = check_schema(schema)
        sink = ThreadSink(self._io.loop)
        reader = self._run(_create_reader(
            self._impl, topic, start_message_id, sink,
            start_message_id_inclusive=start_message_id_inclusive,
            receiver_queue_size=receiver_queue_size, reader_name=reader_name,
            subscription_role_prefix=subscription_role_prefix, schema=schema), extra_s=10)
        return Reader(self, reader, sink)

    def get_topic_partitions(self, topic: str) -> list[str]:
        return self._run(self._impl.topic_partitions(topic))

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._io.run(self._impl.close(), self._timeout_s + 10)
        finally:
            self._closed = True
            self._io.stop()

    def shutdown(self) -> None:
        self.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _SyncSend(concurrent.futures.Future):
    """The callback of a blocking ``send``: a future of the MessageId (or of the error)."""

    def __call__(self, result, mid) -> None:   # success: see Producer._completer
        self.set_result(mid)


class Producer:
    def __init__(self, client: Client, producer, max_pending: int, block: bool) -> None:
        self._client = client
        self._impl = producer
        self._io = client._io
        # pending = submitted - completed. ``_submitted`` comes from an itertools counter
        # (atomic under the GIL: several application threads may send); ``_completed`` is
        # written by the loop thread only, once per SEND (a whole batch), in _completer.
        self._max_pending = max_pending
        self._submitted_counter = itertools.count(1)
        self._submitted = 0
        self._completed = 0
        self._failed = 0     # of the completed: refused or failed (loop thread only)
        self._space = threading.Event()
        self._space_wanted = False
        self._block = block
        self._inbox: collections.deque = collections.deque()
        self._drain_scheduled = False
        self._closed = False
        self._schema = producer.conf.schema
        producers = getattr(producer, "producers", [producer])
        self._first = producers[0]   # its max_message_size (the broker's) bounds a message
        for p in producers:
            p.completer = self._completer

    def topic(self) -> str:
        return self._impl.topic

    def producer_name(self) -> str:
        return self._impl.producer_name

    def last_sequence_id(self) -> int:
        return self._impl.last_sequence_id

    def acked_and_failed(self) -> tuple[int, int]:
        """(messages the broker acknowledged, messages that failed) so far, whether or not
        they were sent with a callback. An extension: the official client has no such call.
        Any thread may read it; the counts of a batch in completion may lag by that batch."""
        completed = self._completed   # first: _completer raises _failed before _completed,
        failed = self._failed         # so a failed message is never counted as acked
        return completed - failed, failed

    def is_connected(self) -> bool:
        producers = getattr(self._impl, "producers", [self._impl])
        return all(p.conn is not None for p in producers)

    def _submit(self, message, callback) -> None:
        if self._closed:
            raise AlreadyClosed(f"producer on {self._impl.topic} is closed")
        if self._submitted - self._completed >= self._max_pending:
            self._wait_for_space()
        self._submitted = next(self._submitted_counter)
        # one extend per pair: atomic under the GIL (other threads may send too), and no
        # tuple per message that lives on (fewer objects for the garbage collector)
        self._inbox.extend((message, callback))
        if not self._drain_scheduled:
            self._drain_scheduled = True
            self._io.call(self._drain)

    def _wait_for_space(self) -> None:
        if not self._block:
            raise ProducerQueueIsFull(f"{self._max_pending} messages pending on "
                                      f"{self._impl.topic}; block_if_queue_full is off")
        while self._submitted - self._completed >= self._max_pending:
            if self._closed:
                raise AlreadyClosed(f"producer on {self._impl.topic} is closed")
            self._space.clear()
            self._space_wanted = True
            if self._submitted - self._completed < self._max_pending:
                break
            self._space.wait(0.1)

    def _completer(self, callbacks, error, ledger_id, entry_id, batched, partition,
                   topic, chunk_positions=None) -> None:
        """On the loop, once per SEND (a batch, or one message): release the messages'
        pending slots, then call each message's callback with (Result, MessageId)."""
        if error is not None:
            self._failed += len(callbacks)   # before _completed: never counted as acked
        self._completed += len(callbacks)
        if self._space_wanted:
            self._space_wanted = False
            self._space.set()
        if error is None:
            ok = Result.Ok
            if chunk_positions is not None:   # one chunked message
                try:
                    callbacks[0](ok, ChunkMessageId(chunk_positions, partition, topic))
                except Exception:
                    log.exception("event=callback_failed topic=%s", topic)
                return
            # a batch's messages are its indexes 0..count-1; a lone message has index -1, count 0
            count = len(callbacks) if batched else 0
            index = 0 if batched else -1
            for callback in callbacks:
                if callback is not None:
                    try:
                        callback(ok, MessageId(partition, ledger_id, entry_id, index, count, topic))
                    except Exception:
                        log.exception("event=callback_failed topic=%s", topic)
                if batched:
                    index += 1
            return
        result = result_of(error)
        for callback in callbacks:
            if callback is None:
                continue
            try:
                if type(callback) is _SyncSend:
                    callback.set_exception(error)
                else:
                    callback(result, None)
            except Exception:
                log.exception("event=callback_failed topic=%s", topic)

    def _drain(self) -> None:   # on the loop
        self._drain_scheduled = False
        inbox = self._inbox
        if not inbox:
            return
        send_many = getattr(self._impl, "send_many", None)
        if send_many is not None:
            send_many(inbox, self._refused)
            return
        popleft = inbox.popleft
        send = self._impl.send
        while inbox:
            message = popleft()
            callback = popleft()
            try:
                send(message, callback)
            except BaseException as exc:
                self._refused(callback, exc)

    def _refused(self, callback, error: BaseException) -> None:
        self._completer([callback], error, -1, -1, False, -1, self._impl.topic)

    def _message(self, content, properties, partition_key, ordering_key, event_timestamp,
                 sequence_id):
        """What goes to the producer: the content itself (bytes) for a plain message, else a
        WireMessage."""
        if self._schema is not None:
            content = self._schema.encode(content)
        if type(content) is bytes and properties is None and partition_key is None \
                and ordering_key is None and event_timestamp is None and sequence_id is None:
            message = content
            size = len(content)
        else:
            message = make_message(content, properties, partition_key, ordering_key,
                                   event_timestamp, sequence_id)
            size = len(message.payload)
        limit = self._first.max_message_size
        if size > limit and not self._impl.conf.chunking_enabled:
            raise MessageTooBig(f"message of {size} bytes exceeds the maximum message size of "
                                f"{limit} bytes (topic {self._impl.topic})")
        return message

    def send_async(self, content, callback, properties=None, partition_key=None,
                   ordering_key=None, sequence_id=None, replication_clusters=None,
                   disable_replication=False, event_timestamp=None, deliver_at=None,
                   deliver_after=None) -> None:
        """``callback(result, message_id)`` runs on the client's I/O thread; ``result`` is
        ``Result.Ok`` on success."""
        if (type(content) is bytes and properties is None and partition_key is None
                and ordering_key is None and event_timestamp is None and sequence_id is None
                and self._schema is None and not self._closed
                and len(content) <= self._first.max_message_size
                and self._submitted - self._completed < self._max_pending):
            # the plain message with room to spare: _message and _submit, inlined
            self._submitted = next(self._submitted_counter)
            self._inbox.extend((content, callback))
            if not self._drain_scheduled:
                self._drain_scheduled = True
                self._io.call(self._drain)
            return
        self._submit(self._message(content, properties, partition_key, ordering_key,
                                   event_timestamp, sequence_id), callback)

    def send(self, content, properties=None, partition_key=None, ordering_key=None,
             sequence_id=None, replication_clusters=None, disable_replication=False,
             event_timestamp=None, deliver_at=None, deliver_after=None) -> MessageId:
        message = self._message(content, properties, partition_key, ordering_key,
                                event_timestamp, sequence_id)
        future = _SyncSend()
        self._submit(message, future)
        return future.result()

    def flush(self) -> None:
        async def flush():
            self._drain()
            await self._impl.flush()
        self._client._run(flush(), extra_s=3600)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def close():
            self._drain()
            await self._impl.close()
        if not self._client._closed:
            self._client._run(close(), extra_s=30)


class _AckInbox:
    """Acks from application threads reach the loop in bulk."""

    def __init__(self, io: _LoopThread) -> None:
        self._io = io
        self._inbox: collections.deque = collections.deque()
        self._scheduled = False

    def put(self, fn, arg) -> None:
        self._inbox.append((fn, arg))
        if not self._scheduled:
            self._scheduled = True
            self._io.call(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        inbox = self._inbox
        while inbox:
            fn, arg = inbox.popleft()
            try:
                fn(arg)
            except Exception:
                log.exception("event=ack_failed")


class Consumer:
    def __init__(self, client: Client, consumer, sink: ThreadSink) -> None:
        self._client = client
        self._impl = consumer
        self._sink = sink
        self._acks = _AckInbox(client._io)
        self._closed = False

    def topic(self) -> str:
        return self._impl.topic

    def subscription_name(self) -> str:
        return self._impl.conf.subscription

    def receive(self, timeout_millis: int | None = None) -> Message:
        if self._closed:
            raise AlreadyClosed("the consumer is closed")
        return self._sink.get(None if timeout_millis is None else timeout_millis / 1000)

    def _check(self) -> None:
        if self._closed:
            raise AlreadyClosed("the consumer is closed")

    def acknowledge(self, message) -> None:
        self._check()
        if type(message) is Message and message._consumer is not None:
            consumer = message._consumer
            key = consumer.ack_message_fast(message)
            if key is not None:
                self._acks.put(consumer.acknowledge_entry_key, key)
            return
        mid = mid_of(message)
        target = self._target(message)
        if isinstance(target, ConsumerImpl):
            # batch bookkeeping here; only a completed entry's ack crosses to the loop
            if mid._batch_index >= 0 and not target.ack_batch_index(mid):
                return
            self._acks.put(target.acknowledge_entry, mid)
        else:
            self._acks.put(target.acknowledge, mid)

    def acknowledge_cumulative(self, message) -> None:
        self._check()
        self._acks.put(self._target(message).acknowledge_cumulative, mid_of(message))

    def negative_acknowledge(self, message) -> None:
        self._check()
        self._acks.put(self._target(message).negative_acknowledge, mid_of(message))

    def _target(self, message):
        consumer = getattr(message, "_consumer", None)
        return consumer if consumer is not None else self._impl

    def redeliver_unacknowledged_messages(self) -> None:
        self._check()
        self._client._io.call(self._impl.redeliver_unacknowledged_messages)

    def seek(self, target) -> None:
        """``target``: a MessageId, or a publish time in ms since the epoch."""
        self._check()

        async def seek():
            self._acks._drain()
            await self._impl.seek(target)
        self._client._run(seek())

    def unsubscribe(self) -> None:
        self._check()
        self._client._run(self._impl.unsubscribe())
        self._closed = True
        self._sink.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sink.close()
        if not self._client._closed:
            self._client._run(self._close())

    async def _close(self) -> None:
        self._acks._drain()
        await self._impl.close()


class Reader:
    def __init__(self, client: Client, reader, sink: ThreadSink) -> None:
        self._client = client
        self._impl = reader
        self._sink = sink
        self._closed = False

    def topic(self) -> str:
        return self._impl.topic

    def read_next(self, timeout_millis: int | None = None) -> Message:
        if self._closed:
            raise AlreadyClosed("the reader is closed")
        return self._sink.get(None if timeout_millis is None else timeout_millis / 1000)

    def has_message_available(self) -> bool:
        if self._closed:
            raise AlreadyClosed("the reader is closed")
        return self._client._run(self._impl.has_message_available())

    def seek(self, target) -> None:
        if self._closed:
            raise AlreadyClosed("the reader is closed")
        self._client._run(self._impl.seek(target))

    def is_connected(self) -> bool:
        return self._impl.conn is not None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sink.close()
        if not self._client._closed:
            self._client._run(self._impl.close())
