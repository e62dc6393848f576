"""The asyncio shell of the client: connections, lookups, producers, consumers, readers.

Everything here runs on one event loop (the caller's for ``pulsarlite.aio``, a background thread's
for the blocking API). One connection per broker address, shared by every producer and consumer
of the client. Before each producer or consumer the client asks PARTITIONED_METADATA and LOOKUP
(following redirects) as the official clients do; on a lost connection or a CLOSE_PRODUCER /
CLOSE_CONSUMER from the broker, each affected producer or consumer looks its topic up again and
re-registers, with bounded exponential backoff. A producer resends what was not yet
acknowledged, in order and with the same sequence ids (so a broker with deduplication drops
repeats); a consumer drops what it had queued (the broker redelivers everything unacked).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import random
import re
import ssl
import threading
import time
from typing import Callable
from urllib.parse import urlsplit

from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.client import core as k
from pulsarlite.client.auth import ClientSecurity
from pulsarlite.client.errors import (AlreadyClosed, AuthenticationError, BrokerError, ClientError, ConnectError,
                                      InvalidConfiguration, LookupError_, MessageTooBig,
                                      NotConnected, Timeout, broker_error)
from pulsarlite.client.chunking import Ack as ChunkAck, Chunk, ChunkAssembler, ChunkingConfig, Deliver
from pulsarlite.client.types import (INT64_MAX, ChunkedMessage, ChunkMessageId, ConsumerType, InitialPosition,
                                     Message, MessageId, RegexSubscriptionMode, is_earliest, is_latest)
from pulsarlite.topic_name import TopicName
from pulsarlite.wire import commands as c
from pulsarlite.wire.entry import (Compression, EntryFormatError, Message as WireMessage, build_chunk_entries,
                                   unpack_chunked, unpack_entry)
from pulsarlite.wire.frames import FrameError

log = logging.getLogger("pulsarlite.client")
T = pb.BaseCommand

REDIRECTS_MAX = 20
BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 30.0

Callback = Callable[[BaseException | None, MessageId | None], None]


def service_url_uses_tls(url: str) -> bool:
    return isinstance(url, str) and url.startswith("pulsar+ssl://")


def parse_service_url(url: str) -> list[tuple[str, int]]:
    """``pulsar://host:port[,host:port...]`` or ``pulsar+ssl://...`` -> addresses."""
    if not isinstance(url, str) or not url.startswith(("pulsar://", "pulsar+ssl://")):
        raise InvalidConfiguration(f"service URL {url!r} must look like pulsar://host:port or "
                                   "pulsar+ssl://host:port (http:// lookups are not supported)")
    tls = service_url_uses_tls(url)
    hosts = url[len("pulsar+ssl://" if tls else "pulsar://"):].rstrip("/").split(",")
    out = []
    for host in hosts:
        parts = urlsplit("pulsar://" + host)
        try:
            port = parts.port or (6651 if tls else 6650)
        except ValueError:
            raise InvalidConfiguration(f"service URL {url!r}: bad port in {host!r}") from None
        if not parts.hostname:
            raise InvalidConfiguration(f"service URL {url!r}: no host")
        out.append((parts.hostname, port))
    return out


def _retriable(exc: BaseException) -> bool:
    if isinstance(exc, (ConnectError, Timeout, LookupError_, OSError, asyncio.TimeoutError)):
        return True
    if isinstance(exc, BrokerError):
        return exc.retriable
    return False


# ---------------------------------------------------------------------------------------------
# Connection
# ---------------------------------------------------------------------------------------------

class Connection(asyncio.Protocol):
    """One TCP connection to a broker (asyncio shell around :class:`core.ConnectionCore`)."""

    def __init__(self, client: "ClientImpl", address: tuple[str, int]) -> None:
        self.client = client
        self.address = address
        self.loop = client.loop
        self.core = k.ConnectionCore()
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future = self.loop.create_future()
        self.pending: dict[int, asyncio.Future] = {}
        self.producers: dict[int, "ProducerImpl"] = {}
        self.consumers: dict[int, "ConsumerImpl"] = {}
        self.closed = False
        self.last_received_s = self.loop.time()
        self._keepalive: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"Connection({self.address[0]}:{self.address[1]})"

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        authentication = self.client.security.authentication
        try:
            if authentication is None:
                frame = self.core.connect_frame()
            else:
                frame = self.core.connect_frame(authentication.method, authentication.auth_data())
        except Exception as exc:     # a token supplier that failed: this connection cannot start
            self._fail(ConnectError(f"authentication data for {self.address[0]}:{self.address[1]}: {exc}"))
            return
        transport.write(frame)

    def _on_auth_challenge(self, event: k.AuthChallenge) -> None:
        """Fresh credentials for the broker (a supplier called again, a token file read again)."""
        authentication = self.client.security.authentication
        if authentication is None:
            self._fail(ConnectError(f"broker {self.address[0]}:{self.address[1]} asked for credentials "
                                    "and this client has none (authentication= not set)"))
            return
        try:
            data = authentication.auth_data()
        except Exception as exc:
            self._fail(ConnectError(f"refreshing credentials for {self.address[0]}:{self.address[1]}: {exc}"))
            return
        log.info("event=auth_refreshed broker=%s:%d method=%s", *self.address, authentication.method)
        self.write(self.core.auth_response_frame(authentication.method, data))

    def data_received(self, data: bytes) -> None:
        self.last_received_s = self.loop.time()
        try:
            events = self.core.feed(data)
        except k.AuthenticationRefused as exc:
            log.warning("event=authentication_refused broker=%s:%d error=%s", *self.address, exc)
            self._fail(AuthenticationError(f"broker {self.address[0]}:{self.address[1]}: {exc}"))
            return
        except (FrameError, k.ProtocolError) as exc:
            log.error("event=bad_frame broker=%s:%d error=%r", *self.address, exc)
            self._fail(ConnectError(f"broker {self.address[0]}:{self.address[1]} broke the "
                                    f"protocol: {exc}"))
            return
        for event in events:
            self._dispatch(event)
        out = self.core.take_output()
        if out:
            self.transport.writelines(out)

    def connection_lost(self, exc) -> None:
        self._fail(ConnectError(f"connection to {self.address[0]}:{self.address[1]} lost"
                                + (f": {exc}" if exc else "")))

    # events
    def _dispatch(self, event) -> None:
        kind = type(event)
        if kind is k.MessageReceived:
            consumer = self.consumers.get(event.consumer_id)
            if consumer is not None:
                consumer._on_message(self, event)
        elif kind is k.Receipt:
            producer = self.producers.get(event.producer_id)
            if producer is not None:
                producer._on_receipt(self, event)
        elif kind is k.Response:
            future = self.pending.pop(event.request_id, None)
            if future is not None and not future.done():
                future.set_result(event)
        elif kind is k.SendFailed:
            producer = self.producers.get(event.producer_id)
            if producer is not None:
                producer._on_send_failed(self, event)
        elif kind is k.ProducerClosed:
            producer = self.producers.pop(event.producer_id, None)
            if producer is not None:
                producer._on_disconnected(self, "closed by the broker")
        elif kind is k.ConsumerClosed:
            consumer = self.consumers.pop(event.consumer_id, None)
            if consumer is not None:
                consumer._on_disconnected(self, "closed by the broker")
        elif kind is k.AuthChallenge:
            self._on_auth_challenge(event)
        elif kind is k.Connected:
            if not self.ready.done():
                self.ready.set_result(event)
            self._schedule_keepalive()

    def _fail(self, error: ClientError) -> None:
        if self.closed:
            return
        self.closed = True
        if self._keepalive is not None:
            self._keepalive.cancel()
        self.client._forget_connection(self)
        if self.transport is not None:
            self.transport.abort()
        if not self.ready.done():
            self.ready.set_exception(error)
            self.ready.exception()   # retrieved: no "never retrieved" warning
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        producers, self.producers = self.producers, {}
        consumers, self.consumers = self.consumers, {}
        for producer in producers.values():
            producer._on_disconnected(self, str(error))
        for consumer in consumers.values():
            consumer._on_disconnected(self, str(error))

    def close(self) -> None:
        self._fail(ConnectError("connection closed by the client"))

    def _schedule_keepalive(self) -> None:
        interval = self.client.keep_alive_interval_s
        self._keepalive = self.loop.call_later(interval, self._keepalive_tick)

    def _keepalive_tick(self) -> None:
        if self.closed:
            return
        idle = self.loop.time() - self.last_received_s
        if idle > 2 * self.client.keep_alive_interval_s:
            log.warning("event=keepalive_timeout broker=%s:%d idle_s=%.1f", *self.address, idle)
            self._fail(ConnectError(f"broker {self.address[0]}:{self.address[1]} silent for "
                                    f"{idle:.0f}s"))
            return
        self.write(c.ping())
        self._schedule_keepalive()

    # requests
    def write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def writelines(self, parts) -> None:
        if not self.closed:
            self.transport.writelines(parts)

    async def request(self, frame: bytes, request_id: int, what: str,
                      timeout_s: float | None = None) -> k.Response:
        if self.closed:
            raise ConnectError(f"{what}: connection to {self.address[0]}:{self.address[1]} "
                               "is closed")
        future = self.loop.create_future()
        self.pending[request_id] = future
        self.transport.write(frame)
        timeout_s = self.client.operation_timeout_s if timeout_s is None else timeout_s
        handle = self.loop.call_later(timeout_s, _expire, future)
        try:
            event = await future
        finally:
            handle.cancel()
            self.pending.pop(request_id, None)
        if event is None:
            raise Timeout(f"{what}: no answer from {self.address[0]}:{self.address[1]} within "
                          f"{timeout_s:g}s")
        if event.error is not None:
            raise broker_error(event.error, event.message, what)
        return event


def _expire(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


# ---------------------------------------------------------------------------------------------
# Client
# ---------------------------------------------------------------------------------------------

class ClientImpl:
    def __init__(self, service_url: str, *, operation_timeout_seconds: float = 30,
                 connection_timeout_ms: int = 10_000, keep_alive_interval_seconds: float = 30,
                 loop: asyncio.AbstractEventLoop | None = None, security: ClientSecurity | None = None) -> None:
        self.service_addresses = parse_service_url(service_url)
        self.service_url = service_url
        security = security or ClientSecurity()
        if service_url_uses_tls(service_url) and not security.use_tls:
            security = dataclasses.replace(security, use_tls=True)
        self.security = security
        # pulsar+ssl://: every connection (service URL and lookup answers) is TLS
        self._ssl_context = security.ssl_context() if security.use_tls else None
        if not operation_timeout_seconds > 0 or not connection_timeout_ms > 0:
            raise InvalidConfiguration("operation_timeout_seconds and connection_timeout_ms "
                                       "must be > 0")
        if not keep_alive_interval_seconds > 0:
            raise InvalidConfiguration("keep_alive_interval_seconds must be > 0")
        self.operation_timeout_s = float(operation_timeout_seconds)
        self.connection_timeout_s = connection_timeout_ms / 1000
        self.keep_alive_interval_s = float(keep_alive_interval_seconds)
        self.loop = loop or asyncio.get_running_loop()
        self._connections: dict[tuple[str, int], Connection] = {}
        self._connecting: dict[tuple[str, int], asyncio.Future] = {}
        self._request_ids = itertools.count()
        self._producer_ids = itertools.count()
        self._consumer_ids = itertools.count()
        self._handlers: set = set()
        self._tasks: set[asyncio.Task] = set()
        self.closed = False
        self._random = random.Random()

    def next_request_id(self) -> int:
        return next(self._request_ids)

    def spawn(self, coro) -> asyncio.Task:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("event=task_failed error=%r", task.exception())

    def check_open(self) -> None:
        if self.closed:
            raise AlreadyClosed("the client is closed")

    # connections
    async def connection(self, address: tuple[str, int]) -> Connection:
        self.check_open()
        conn = self._connections.get(address)
        if conn is not None and not conn.closed:
            return conn
        waiting = self._connecting.get(address)
        if waiting is None:
            waiting = self._connecting[address] = self.loop.create_future()
            self.spawn(self._open(address, waiting))
        return await asyncio.shield(waiting)

    async def _open(self, address: tuple[str, int], waiting: asyncio.Future) -> None:
        try:
            try:
                if self._ssl_context is not None:
                    connecting = self.loop.create_connection(lambda: Connection(self, address), *address,
                                                             ssl=self._ssl_context, server_hostname=address[0],
                                                             ssl_handshake_timeout=self.connection_timeout_s)
                else:
                    connecting = self.loop.create_connection(lambda: Connection(self, address), *address)
                _, conn = await asyncio.wait_for(connecting, self.connection_timeout_s)
            except ssl.SSLError as exc:
                raise ConnectError(f"TLS with {address[0]}:{address[1]} failed: {exc.reason or exc}") from None
            except (OSError, asyncio.TimeoutError) as exc:
                raise ConnectError(f"cannot connect to {address[0]}:{address[1]}: "
                                   f"{exc or 'timed out'}") from None
            try:
                await asyncio.wait_for(asyncio.shield(conn.ready), self.connection_timeout_s)
            except asyncio.TimeoutError:
                conn.close()
                raise ConnectError(f"no CONNECTED from {address[0]}:{address[1]} within "
                                   f"{self.connection_timeout_s:g}s") from None
            self._connections[address] = conn
            log.debug("event=connected broker=%s:%d", *address)
            waiting.set_result(conn)
        except asyncio.CancelledError:
            waiting.cancel()
            raise
        except Exception as exc:
            waiting.set_exception(exc)
            waiting.exception()
        finally:
            self._connecting.pop(address, None)

    def _forget_connection(self, conn: Connection) -> None:
        if self._connections.get(conn.address) is conn:
            del self._connections[conn.address]

    async def service_connection(self) -> Connection:
        last: BaseException | None = None
        addresses = list(self.service_addresses)
        self._random.shuffle(addresses)
        for address in addresses:
            try:
                return await self.connection(address)
            except ConnectError as exc:
                last = exc
        raise last  # type: ignore[misc]

    # discovery
    async def lookup(self, topic: str) -> tuple[str, int]:
        """The address of the broker that owns ``topic`` (following redirects)."""
        conn = await self.service_connection()
        authoritative = False
        for _ in range(REDIRECTS_MAX):
            rid = self.next_request_id()
            resp = await conn.request(c.lookup(topic, rid, authoritative=authoritative), rid,
                                      f"lookup of {topic}")
            body = resp.command.lookupTopicResponse
            if body.proxy_through_service_url:
                return conn.address
            url = body.brokerServiceUrlTls if self.security.use_tls else body.brokerServiceUrl
            if not url:
                raise LookupError_(f"lookup of {topic}: the broker named no "
                                   f"{'pulsar+ssl://' if self.security.use_tls else 'pulsar://'} URL "
                                   f"(does it have a TLS listener?)")
            address = parse_service_url(url)[0]
            if body.response == pb.CommandLookupTopicResponse.Connect:
                return address
            authoritative = body.authoritative
            conn = await self.connection(address)
        raise LookupError_(f"lookup of {topic}: more than {REDIRECTS_MAX} redirects")

    async def partitions_of(self, topic: str) -> int:
        conn = await self.service_connection()
        rid = self.next_request_id()
        resp = await conn.request(c.partitioned_metadata(topic, rid), rid,
                                  f"partitioned metadata of {topic}")
        return resp.command.partitionMetadataResponse.partitions

    async def topic_partitions(self, topic: str) -> list[str]:
        name = str(TopicName.parse(topic))
        n = await self.partitions_of(name)
        return [f"{name}-partition-{i}" for i in range(n)] if n else [name]

    async def topics_of_namespace(self, namespace: str, mode: int = 0) -> list[str]:
        """``mode``: CommandGetTopicsOfNamespace.Mode (0 persistent, 1 non-persistent, 2 all)."""
        conn = await self.service_connection()
        rid = self.next_request_id()
        resp = await conn.request(c.get_topics_of_namespace(rid, namespace, mode=mode), rid,
                                  f"topics of namespace {namespace}")
        return list(resp.command.getTopicsOfNamespaceResponse.topics)

    async def connection_for(self, topic: str) -> Connection:
        return await self.connection(await self.lookup(topic))

    # lifecycle
    def register(self, handler) -> None:
        self._handlers.add(handler)

    def unregister(self, handler) -> None:
        self._handlers.discard(handler)

    async def close(self) -> None:
        if self.closed:
            return
        handlers = list(self._handlers)
        await asyncio.gather(*(h.close() for h in handlers), return_exceptions=True)
        self.closed = True
        for conn in list(self._connections.values()):
            conn.close()
        for task in list(self._tasks):
            task.cancel()


async def _retry_until(deadline_s: float, loop, attempt, what: str):
    """Run ``attempt()`` until it succeeds, a non-retriable error, or the deadline."""
    backoff = BACKOFF_INITIAL_S
    while True:
        try:
            return await attempt()
        except AlreadyClosed:
            raise
        except Exception as exc:
            if not _retriable(exc) or loop.time() + backoff >= deadline_s:
                if isinstance(exc, ClientError):
                    raise
                if isinstance(exc, asyncio.TimeoutError):
                    raise Timeout(f"{what}: timed out") from None
                raise ConnectError(f"{what}: {exc}") from None
            log.info("event=retry what=%r error=%r backoff_s=%.2f", what, exc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)


class _Handler:
    """Shared reconnect logic of producers and consumers."""

    kind = "handler"

    def __init__(self, client: ClientImpl, topic: str) -> None:
        self.client = client
        self.loop = client.loop
        self.topic = topic
        self.conn: Connection | None = None
        self.closed = False
        self._reconnecting: asyncio.Task | None = None
        self._hold_reconnect = False

    async def _connect(self) -> None:
        raise NotImplementedError

    async def _start(self) -> None:
        deadline = self.loop.time() + self.client.operation_timeout_s
        await _retry_until(deadline, self.loop, self._connect, f"{self.kind} on {self.topic}")
        self.client.register(self)

    def _on_disconnected(self, conn: Connection, reason: str) -> None:
        if conn is not self.conn:
            return
        self.conn = None
        log.info("event=%s_disconnected topic=%s reason=%r", self.kind, self.topic, reason)
        self._disconnected()
        if not self._hold_reconnect:
            self._schedule_reconnect()

    def _disconnected(self) -> None:
        pass

    def _on_reconnect_refused(self, exc: BaseException) -> None:
        pass

    def _schedule_reconnect(self) -> None:
        if self.closed or self.client.closed:
            return
        if self._reconnecting is not None and not self._reconnecting.done():
            return
        self._reconnecting = self.client.spawn(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        backoff = BACKOFF_INITIAL_S
        while not self.closed and not self.client.closed and self.conn is None:
            try:
                await self._connect()
                log.info("event=%s_reconnected topic=%s", self.kind, self.topic)
                return
            except AlreadyClosed:
                return
            except Exception as exc:
                log.warning("event=%s_reconnect_failed topic=%s error=%r backoff_s=%.2f",
                            self.kind, self.topic, exc, backoff)
                self._on_reconnect_refused(exc)
            await asyncio.sleep(backoff * (0.8 + 0.4 * self.client._random.random()))
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _wait_connected(self, timeout_s: float) -> Connection:
        deadline = self.loop.time() + timeout_s
        while self.conn is None:
            if self.closed:
                raise AlreadyClosed(f"{self.kind} on {self.topic} is closed")
            if self.loop.time() >= deadline:
                raise NotConnected(f"{self.kind} on {self.topic} is not connected")
            await asyncio.sleep(0.05)
        return self.conn


# ---------------------------------------------------------------------------------------------
# Producer
# ---------------------------------------------------------------------------------------------

class _Op:
    """One SEND in flight: an entry (a batch or one message) and the callbacks of its
    messages."""

    __slots__ = ("first_seq", "last_seq", "parts", "callbacks", "count", "created_s", "waiters",
                 "batched", "chunked")

    def __init__(self, first_seq, last_seq, parts, callbacks, count, created_s, batched,
                 chunked=None):
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.parts = parts
        self.callbacks = callbacks
        self.count = count
        self.created_s = created_s
        self.waiters: list[asyncio.Future] | None = None
        self.batched = batched
        self.chunked: _ChunkedSend | None = chunked   # one chunk of a chunked message


class _ChunkedSend:
    """The chunks of one chunked message in flight (one _Op each, same sequence id, as
    Pulsar's producers send them): their positions as receipts come, and the message's
    callbacks, run once: with the first and last chunk when the last is stored, or with the
    first error of any chunk."""

    __slots__ = ("sequence_id", "chunks", "positions", "callbacks", "done")

    def __init__(self, sequence_id: int, chunks: int, callbacks: list) -> None:
        self.sequence_id = sequence_id
        self.chunks = chunks
        self.positions: list[tuple[int, int]] = []
        self.callbacks = callbacks
        self.done = False


class ProducerConf:
    __slots__ = ("producer_name", "batching_enabled", "limits", "compression", "send_timeout_s",
                 "initial_sequence_id", "properties", "key_based_batching", "schema",
                 "chunking_enabled")

    def __init__(self, *, producer_name: str | None = None, batching_enabled: bool = True,
                 batching_max_messages: int = 1000,
                 batching_max_allowed_size_in_bytes: int = 128 * 1024,
                 batching_max_publish_delay_ms: int = 10,
                 compression_type: int = 0, send_timeout_millis: int = 30_000,
                 initial_sequence_id: int | None = None,
                 properties: dict[str, str] | None = None, batching_type: int = 0,
                 schema=None, chunking_enabled: bool = False) -> None:
        self.schema = schema   # a pulsarlite.schema Schema, or None (bytes)
        if chunking_enabled and batching_enabled:
            raise InvalidConfiguration("Batching and chunking of messages can't be enabled together.")
        self.chunking_enabled = bool(chunking_enabled)
        try:
            self.limits = k.BatchLimits(int(batching_max_messages),
                                        int(batching_max_allowed_size_in_bytes),
                                        int(batching_max_publish_delay_ms))
        except ValueError as exc:
            raise InvalidConfiguration(str(exc)) from None
        try:
            self.compression = Compression(int(compression_type))
        except ValueError:
            raise InvalidConfiguration(f"unknown compression type {compression_type!r}") from None
        if send_timeout_millis < 0:
            raise InvalidConfiguration("send_timeout_millis must be >= 0 (0: no timeout)")
        try:
            self.key_based_batching = int(batching_type) == 1
            if int(batching_type) not in (0, 1):
                raise ValueError
        except (TypeError, ValueError):
            raise InvalidConfiguration(f"unknown batching type {batching_type!r}") from None
        self.producer_name = producer_name
        self.batching_enabled = bool(batching_enabled)
        self.send_timeout_s = send_timeout_millis / 1000
        self.initial_sequence_id = initial_sequence_id
        self.properties = dict(properties or {})


class ProducerImpl(_Handler):
    kind = "producer"

    def __init__(self, client: ClientImpl, topic: str, conf: ProducerConf, *,
                 partition: int = -1) -> None:
        super().__init__(client, topic)
        self.conf = conf
        self.partition = partition
        self.producer_id = next(client._producer_ids)
        self.producer_name = conf.producer_name
        self.max_message_size = k.MESSAGE_BYTES_MAX_DEFAULT
        self._next_seq = 0 if conf.initial_sequence_id is None else conf.initial_sequence_id + 1
        self.last_sequence_id = -1 if conf.initial_sequence_id is None else conf.initial_sequence_id
        self._connected_once = False
        # ONE queue in send order; its rules (receipts, send timeout) in core.PendingSends
        self._pending = k.PendingSends(conf.send_timeout_s)
        self._batch = k.BatchBuilder(conf.limits)
        self._batch_timer: asyncio.TimerHandle | None = None
        self._timeout_timer: asyncio.TimerHandle | None = None
        self.schema_version: bytes | None = None   # from PRODUCER_SUCCESS, on every entry
        self.completer = None   # runs a SEND's callbacks in one call: see _deliver

    async def _connect(self) -> None:
        conn = await self.client.connection_for(self.topic)
        rid = self.client.next_request_id()
        conn.producers[self.producer_id] = self
        try:
            resp = await conn.request(
                c.producer(self.topic, self.producer_id, rid, producer_name=self.producer_name,
                           metadata=self.conf.properties or None,
                           schema=None if self.conf.schema is None
                           else self.conf.schema.schema_info().to_pb()),
                rid, f"create producer on {self.topic}")
        except BaseException:
            if conn.producers.get(self.producer_id) is self:
                del conn.producers[self.producer_id]
            raise
        if self.closed:
            raise AlreadyClosed(f"producer on {self.topic} is closed")
        if conn.closed or conn.producers.get(self.producer_id) is not self:
            # a CLOSE_PRODUCER (the topic unloading) or the connection's end came in the same
            # read as PRODUCER_SUCCESS, before this coroutine resumed: _on_disconnected ignored
            # it (self.conn was not set yet), so this registration is void. Taking it would
            # leave the producer writing to a producer id the broker dropped, never answered
            # (seen in a chaos run: ours-1 stuck for the rest of the run). Register again.
            if conn.producers.get(self.producer_id) is self:
                del conn.producers[self.producer_id]
            raise ConnectError(f"producer on {self.topic} was closed by the broker while it "
                               "registered; registering again")
        body = resp.command.producer_success
        self.producer_name = body.producer_name
        if body.HasField("schema_version"):
            self.schema_version = body.schema_version
        if not self._connected_once:
            self._connected_once = True
            if self.conf.initial_sequence_id is None and body.last_sequence_id >= 0:
                self._next_seq = body.last_sequence_id + 1
                self.last_sequence_id = body.last_sequence_id
        self.max_message_size = conn.core.max_message_size
        self.conn = conn
        for op in self._pending:   # resend in order, same sequence ids
            conn.writelines(op.parts)
        log.debug("event=producer_ready topic=%s producer=%s resent=%d", self.topic,
                  self.producer_name, len(self._pending))

    # sending
    def send(self, message: WireMessage | bytes, callback: Callback) -> None:
        """Queue ``message`` (a WireMessage, or plain content as ``bytes``: no key, properties
        or event time); ``callback(error, message_id)`` runs on the loop (or the producer's
        ``completer``, see _deliver)."""
        if self.closed:
            raise AlreadyClosed(f"producer on {self.topic} is closed")
        if type(message) is bytes:
            size = len(message)
            seq = self._next_seq
        else:
            size = len(message.payload)
            seq = message.sequence_id
            if seq is None:
                seq = self._next_seq
        conf = self.conf
        if size > self.max_message_size and not conf.chunking_enabled:
            raise MessageTooBig(f"message of {size} bytes exceeds the maximum message size of "
                                f"{self.max_message_size} bytes (topic {self.topic})")
        self._next_seq = seq + 1
        if conf.chunking_enabled:
            self._send_chunked(WireMessage(message) if type(message) is bytes else message, seq,
                               callback)
            return
        if not conf.batching_enabled:
            if type(message) is bytes:
                message = WireMessage(message)
            entry = k.build_single(message, producer_name=self.producer_name,
                                   sequence_id=seq, publish_time_ms=int(time.time() * 1000),
                                   compression=conf.compression,
                                   schema_version=self.schema_version)
            self._enqueue(_Op(seq, seq, c.send_parts(self.producer_id, seq, entry),
                              [callback], 1, self.loop.time(), False))
            return
        batch = self._batch
        if batch.messages and (
                batch.payload_bytes + size > conf.limits.bytes_max
                or (conf.key_based_batching and batch.first_key() != (
                    None if type(message) is bytes else message.key))):
            self._flush_batch()   # full, or (key-based batching) another key
            batch = self._batch
        if batch.add(message, callback, seq):
            self._flush_batch()
        elif len(batch.messages) == 1:
            self._batch_timer = self.loop.call_later(conf.limits.delay_ms / 1000,
                                                     self._flush_batch)

    def _send_chunked(self, message: WireMessage, seq: int, callback: Callback) -> None:
        """One message as one entry, or, larger than the broker's maximum, as chunks: one SEND
        each, all with sequence id ``seq``; ``callback`` runs once (see _ChunkedSend)."""
        entries = build_chunk_entries(message, producer_name=self.producer_name, sequence_id=seq,
                                      publish_time_ms=int(time.time() * 1000),
                                      entry_bytes_max=self.max_message_size,
                                      compression=self.conf.compression,
                                      schema_version=self.schema_version)
        now_s = self.loop.time()
        if len(entries) == 1:
            self._enqueue(_Op(seq, seq, c.send_parts(self.producer_id, seq, entries[0]),
                              [callback], 1, now_s, False))
            return
        chunked = _ChunkedSend(seq, len(entries), [callback])
        last = len(entries) - 1
        for i, entry in enumerate(entries):
            # the message counts once (pending_messages), on its last chunk
            self._enqueue(_Op(seq, seq, c.send_parts(self.producer_id, seq, entry, is_chunk=True),
                              [], int(i == last), now_s, False, chunked))

    def send_many(self, inbox: collections.deque, on_error) -> None:
        """``send(message, callback)`` for every pair in ``inbox`` (a deque, emptied, of
        message, callback, message, callback, ...: each pair put in by one ``extend``, atomic
        under the GIL; no tuple per message), oldest first; a pair that send refuses goes to
        ``on_error(callback, error)``. Plain messages (``bytes``) join the open batch inline:
        the same steps as send, without a call and the checks that cannot change between two
        messages of one drain."""
        popleft = inbox.popleft
        conf = self.conf
        if self.closed or not conf.batching_enabled or conf.key_based_batching \
                or conf.chunking_enabled:
            while inbox:
                message = popleft()
                callback = popleft()
                try:
                    self.send(message, callback)
                except BaseException as exc:
                    on_error(callback, exc)
            return
        limits = conf.limits
        messages_max = limits.messages_max
        bytes_max = limits.bytes_max
        size_max = self.max_message_size
        delay_s = limits.delay_ms / 1000
        while inbox:
            # the open batch's state in locals until something else must happen: the batch
            # fills up (flush it), or a message needs send() (not plain bytes, too big, or it
            # does not fit: send flushes first)
            batch = self._batch
            messages = batch.messages
            add_message = messages.append
            add_callback = batch.callbacks.append
            add_sequence_id = batch.sequence_ids.append
            payload_bytes = batch.payload_bytes
            seq = self._next_seq
            slow = None
            full = False
            try:
                while inbox:
                    message = popleft()
                    callback = popleft()
                    if type(message) is not bytes:
                        slow = (message, callback)
                        break
                    size = len(message)
                    if size > size_max or (messages and payload_bytes + size > bytes_max):
                        slow = (message, callback)
                        break
                    add_message(message)
                    add_callback(callback)
                    add_sequence_id(seq)
                    seq += 1
                    payload_bytes += size
                    if len(messages) >= messages_max or payload_bytes >= bytes_max:
                        full = True
                        break
                    if len(messages) == 1:
                        self._batch_timer = self.loop.call_later(delay_s, self._flush_batch)
            finally:
                batch.payload_bytes = payload_bytes
                self._next_seq = seq
            if full:
                self._flush_batch()
            elif slow is not None:
                message, callback = slow
                try:
                    self.send(message, callback)
                except BaseException as exc:
                    on_error(callback, exc)

    def _flush_batch(self) -> None:
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None
        if not len(self._batch):
            return
        entry, callbacks, count, first, last = self._batch.build(
            producer_name=self.producer_name, publish_time_ms=int(time.time() * 1000),
            compression=self.conf.compression, schema_version=self.schema_version)
        parts = c.send_parts(self.producer_id, first, entry, num_messages=count,
                             highest_sequence_id=last)
        self._enqueue(_Op(first, last, parts, callbacks, count, self.loop.time(), True))

    def _enqueue(self, op: _Op) -> None:
        self._pending.append(op)
        if self.conn is not None:
            self.conn.writelines(op.parts)
        if self._timeout_timer is None and self.conf.send_timeout_s > 0:
            self._timeout_timer = self.loop.call_later(self.conf.send_timeout_s,
                                                       self._check_timeouts)

    def _check_timeouts(self) -> None:
        self._timeout_timer = None
        expired = self._pending.expire(self.loop.time())
        if expired:
            # the oldest send timed out: every pending send fails (and the open batch), as in
            # the official clients; none of them is resent later, so nothing the broker stores
            # meanwhile can end up ahead of a resent older message (CHAOS.md finding 4)
            timeout_s = self.conf.send_timeout_s
            log.warning("event=send_timeout topic=%s producer=%s first_sequence_id=%d "
                        "messages=%d", self.topic, self.producer_name, expired[0].first_seq,
                        sum(op.count for op in expired) + len(self._batch))
            self._fail_all(expired, Timeout(f"send to {self.topic} not acknowledged within "
                                            f"{timeout_s:g}s"))
        deadline = self._pending.deadline_s()
        if deadline is not None:
            self._timeout_timer = self.loop.call_later(max(0.01, deadline - self.loop.time()),
                                                       self._check_timeouts)

    def _on_reconnect_refused(self, exc: BaseException) -> None:
        """A refusal that will not go away by retrying soon (a backlog quota, a terminated
        topic, a fenced producer) fails every pending send now, in order, as the Java client
        does; the producer keeps trying to reconnect."""
        if isinstance(exc, BrokerError) and k.refusal_fails_pending(exc.server_error) \
                and (self._pending or len(self._batch)):
            log.warning("event=pending_sends_failed topic=%s producer=%s error=%s messages=%d",
                        self.topic, self.producer_name, exc.server_error_name,
                        self.pending_messages)
            self._fail_all(self._pending.take_all(), exc)

    def _fail_all(self, ops: list, error: BaseException) -> None:
        """Fail ``ops`` (taken from the pending queue, oldest first), then the open batch."""
        for op in ops:
            self._complete(op, error, -1, -1)
        if len(self._batch):
            if self._batch_timer is not None:
                self._batch_timer.cancel()
                self._batch_timer = None
            callbacks = self._batch.callbacks
            self._batch = k.BatchBuilder(self.conf.limits)
            self._deliver(callbacks, error)

    def _complete(self, op: _Op, error, ledger_id: int, entry_id: int) -> None:
        chunked = op.chunked
        if chunked is not None:
            self._complete_chunk(chunked, error, ledger_id, entry_id)
        else:
            if error is None:
                self.last_sequence_id = op.last_seq
            self._deliver(op.callbacks, error, ledger_id, entry_id, op.batched)
        if op.waiters:
            for waiter in op.waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _complete_chunk(self, chunked: _ChunkedSend, error, ledger_id: int, entry_id: int) -> None:
        if chunked.done:
            return
        if error is not None:
            chunked.done = True
            self._deliver(chunked.callbacks, error)
            return
        chunked.positions.append((ledger_id, entry_id))
        if len(chunked.positions) < chunked.chunks:
            return
        chunked.done = True
        self.last_sequence_id = chunked.sequence_id
        self._deliver(chunked.callbacks, None, ledger_id, entry_id, False,
                      chunk_positions=tuple(chunked.positions))

    def _deliver(self, callbacks: list, error, ledger_id: int = -1, entry_id: int = -1,
                 batched: bool = False, chunk_positions: tuple | None = None) -> None:
        """Run the callbacks of one SEND (or of the open batch, failing): each gets
        ``(error, message_id)``. A ``completer`` (the blocking API's) takes the whole list in
        one call instead: ``completer(callbacks, error, ledger_id, entry_id, batched,
        partition, topic)``."""
        completer = self.completer
        if completer is not None:
            try:
                if chunk_positions is None:
                    completer(callbacks, error, ledger_id, entry_id, batched, self.partition,
                              self.topic)
                else:
                    completer(callbacks, error, ledger_id, entry_id, batched, self.partition,
                              self.topic, chunk_positions=chunk_positions)
            except Exception:
                log.exception("event=callback_failed topic=%s", self.topic)
            return
        topic = self.topic
        if error is None:
            partition = self.partition
            if chunk_positions is not None:
                try:
                    callbacks[0](None, ChunkMessageId(chunk_positions, partition, topic))
                except Exception:
                    log.exception("event=callback_failed topic=%s", topic)
            elif batched:
                count = len(callbacks)
                for i, callback in enumerate(callbacks):
                    try:
                        callback(None, MessageId(partition, ledger_id, entry_id, i, count, topic))
                    except Exception:
                        log.exception("event=callback_failed topic=%s", topic)
            else:
                try:
                    callbacks[0](None, MessageId(partition, ledger_id, entry_id, -1,
                                                 topic=topic))
                except Exception:
                    log.exception("event=callback_failed topic=%s", topic)
        else:
            for callback in callbacks:
                try:
                    callback(error, None)
                except Exception:
                    log.exception("event=callback_failed topic=%s", topic)

    def _on_receipt(self, conn: Connection, receipt: k.Receipt) -> None:
        if conn is not self.conn:
            return
        verdict, op = self._pending.on_receipt(receipt.sequence_id)
        if op is not None:
            self._complete(op, None, receipt.ledger_id, receipt.entry_id)
        elif verdict is k.ReceiptVerdict.UNEXPECTED:
            # the broker skipped a pending send: reconnect and resend, as the official clients
            log.warning("event=receipt_out_of_order topic=%s expected=%d got=%d", self.topic,
                        next(iter(self._pending)).first_seq, receipt.sequence_id)
            conn.close()
        # STALE: a receipt for a send that already failed (timed out) or a duplicate

    def _on_send_failed(self, conn: Connection, failure: k.SendFailed) -> None:
        if conn is not self.conn:
            return
        log.warning("event=send_error topic=%s sequence_id=%d error=%s message=%r", self.topic,
                    failure.sequence_id, pb.ServerError.Name(failure.error), failure.message)
        action = k.send_error_action(failure.error)
        if action is k.SendErrorAction.RECONNECT:
            # close the connection; once registered again the producer resends every pending
            # send in order (as the official clients)
            conn.close()
            return
        error = broker_error(failure.error, failure.message, f"send to {self.topic}")
        if action is k.SendErrorAction.FAIL_ALL:
            self._fail_all(self._pending.take_all(), error)
            return
        op = self._pending.remove(failure.sequence_id)   # FAIL_ONE: that send only
        if op is not None:
            self._complete(op, error, -1, -1)

    async def flush(self) -> None:
        self._flush_batch()
        if not self._pending:
            return
        waiter = self.loop.create_future()
        last = self._pending.last
        if last.waiters is None:
            last.waiters = []
        last.waiters.append(waiter)
        await waiter

    @property
    def pending_messages(self) -> int:
        return len(self._batch) + sum(op.count for op in self._pending)

    async def close(self) -> None:
        if self.closed:
            return
        try:
            if self.conn is not None:
                await asyncio.wait_for(self.flush(), self.client.operation_timeout_s)
        except (asyncio.TimeoutError, ClientError):
            pass
        self.closed = True
        self.client.unregister(self)
        if self._batch_timer is not None:
            self._batch_timer.cancel()
        if self._timeout_timer is not None:
            self._timeout_timer.cancel()
        error = AlreadyClosed(f"producer on {self.topic} closed before the message was sent")
        if len(self._batch):
            callbacks = self._batch.callbacks
            self._batch = k.BatchBuilder(self.conf.limits)
            self._deliver(callbacks, error)
        for op in self._pending.take_all():
            self._complete(op, error, -1, -1)
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            conn.producers.pop(self.producer_id, None)
            rid = self.client.next_request_id()
            try:
                await conn.request(c.close_producer(self.producer_id, rid), rid,
                                   f"close producer on {self.topic}")
            except ClientError:
                pass


class PartitionedProducerImpl:
    """A producer on a partitioned topic: one ProducerImpl per partition; messages with a key
    go to ``hash(key) % partitions`` (BoostHash by default, as the official Python client), others round robin (per batch when batching)."""

    def __init__(self, client: ClientImpl, topic: str, partitions: int, conf: ProducerConf,
                 hashing_scheme: k.HashingScheme = k.HashingScheme.BoostHash) -> None:
        self.client = client
        self.topic = topic
        self.conf = conf
        self.hashing_scheme = hashing_scheme
        self.producers = [ProducerImpl(client, f"{topic}-partition-{i}", conf, partition=i)
                          for i in range(partitions)]
        stick = conf.limits.messages_max if conf.batching_enabled else 1
        self.router = k.RoundRobin(partitions, start=client._random.randrange(partitions),
                                   stick_messages=stick)
        self.closed = False

    async def _start(self) -> None:
        results = await asyncio.gather(*(p._start() for p in self.producers),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(*(p.close() for p in self.producers), return_exceptions=True)
            raise errors[0]

    @property
    def producer_name(self) -> str | None:
        return self.producers[0].producer_name

    @property
    def last_sequence_id(self) -> int:
        return max(p.last_sequence_id for p in self.producers)

    @property
    def pending_messages(self) -> int:
        return sum(p.pending_messages for p in self.producers)

    def send(self, message: WireMessage | bytes, callback: Callback) -> None:
        if type(message) is not bytes and message.key:
            # an empty key routes like no key, as in the official client
            index = k.partition_for_key(message.key, len(self.producers), self.hashing_scheme)
        else:
            index = self.router.next()
        self.producers[index].send(message, callback)

    async def flush(self) -> None:
        await asyncio.gather(*(p.flush() for p in self.producers))

    async def close(self) -> None:
        self.closed = True
        await asyncio.gather(*(p.close() for p in self.producers), return_exceptions=True)


async def create_producer(client: ClientImpl, topic: str, conf: ProducerConf,
                          hashing_scheme: k.HashingScheme = k.HashingScheme.BoostHash):
    client.check_open()
    name = str(TopicName.parse(topic))
    deadline = client.loop.time() + client.operation_timeout_s
    partitions = await _retry_until(deadline, client.loop, lambda: client.partitions_of(name),
                                    f"partitioned metadata of {name}")
    if partitions > 0:
        producer = PartitionedProducerImpl(client, name, partitions, conf, hashing_scheme)
    else:
        producer = ProducerImpl(client, name, conf)
    await producer._start()
    return producer


# ---------------------------------------------------------------------------------------------
# Consumer: where received messages wait for the application
# ---------------------------------------------------------------------------------------------

class _SinkBase:
    """The receiver queue shared by the consumers of one application-level consumer. Counts
    dequeued messages per consumer and returns permits (FLOW) at half the receiver queue."""

    def __init__(self) -> None:
        self._q: collections.deque[Message] = collections.deque()
        self._counts: dict = {}
        self._closed = False

    def _count(self, msg: Message) -> None:
        consumer = msg._consumer
        consumer._last_dequeued_msg = msg
        n = self._counts.get(consumer, 0) + 1
        if n >= consumer.flow_threshold:
            self._counts[consumer] = 0
            self._return_permits(consumer, n, msg._epoch)
        else:
            self._counts[consumer] = n

    def _filter_out(self, consumer) -> None:
        q = self._q
        if q:
            kept = [m for m in q if m._consumer is not consumer]
            q.clear()
            q.extend(kept)
        self._counts.pop(consumer, None)

    def has_for(self, consumer) -> bool:
        return any(m._consumer is consumer for m in self._q)

    def __len__(self) -> int:
        return len(self._q)


class AsyncSink(_SinkBase):
    """For ``pulsarlite.aio``: everything on the loop."""

    def __init__(self, loop) -> None:
        super().__init__()
        self.loop = loop
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    def _return_permits(self, consumer, n: int, epoch: int) -> None:
        consumer.return_permits(n, epoch)

    def put_many(self, messages: list[Message]) -> None:
        self._q.extend(messages)
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                break

    def clear_for(self, consumer) -> None:
        self._filter_out(consumer)

    def close(self) -> None:
        self._closed = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(True)

    async def get(self, timeout_s: float | None) -> Message:
        q = self._q
        if not q:
            deadline = None if timeout_s is None else self.loop.time() + timeout_s
            while not q:
                if self._closed:
                    raise AlreadyClosed("the consumer is closed")
                waiter = self.loop.create_future()
                self._waiters.append(waiter)
                handle = None
                if deadline is not None:
                    remaining = deadline - self.loop.time()
                    if remaining <= 0:
                        raise Timeout("no message received within the timeout")
                    handle = self.loop.call_later(remaining, _expire, waiter)
                try:
                    await waiter
                finally:
                    if handle is not None:
                        handle.cancel()
                if not q and deadline is not None and self.loop.time() >= deadline:
                    raise Timeout("no message received within the timeout")
        msg = q.popleft()
        self._count(msg)
        if q and self._waiters:   # more for others waiting
            self.put_many([])
        return msg


class ThreadSink(_SinkBase):
    """For the blocking API: the loop thread puts, application threads get. The deque's own
    thread safety carries the hot path (append/popleft are atomic); an Event wakes a getter
    only when the queue was empty, and a plain lock guards the permit counts."""

    def __init__(self, loop) -> None:
        super().__init__()
        self.loop = loop
        self._count_lock = threading.Lock()
        self._nonempty = threading.Event()
        self._waiting = False

    def _return_permits(self, consumer, n: int, epoch: int) -> None:
        self.loop.call_soon_threadsafe(consumer.return_permits, n, epoch)

    def put_many(self, messages: list[Message]) -> None:
        self._q.extend(messages)
        if self._waiting:
            self._waiting = False
            self._nonempty.set()

    def clear_for(self, consumer) -> None:
        with self._count_lock:
            self._filter_out(consumer)

    def close(self) -> None:
        self._closed = True
        self._nonempty.set()

    def get(self, timeout_s: float | None) -> Message:
        q = self._q
        try:
            msg = q.popleft()
        except IndexError:
            msg = self._wait(timeout_s)
        with self._count_lock:
            self._count(msg)
        return msg

    def _wait(self, timeout_s: float | None) -> Message:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        q = self._q
        event = self._nonempty
        while True:
            event.clear()
            self._waiting = True
            try:
                return q.popleft()
            except IndexError:
                pass
            if self._closed:
                raise AlreadyClosed("the consumer is closed")
            if deadline is None:
                event.wait()
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Timeout("no message received within the timeout")
                event.wait(remaining)


# ---------------------------------------------------------------------------------------------
# Consumer
# ---------------------------------------------------------------------------------------------

class ConsumerConf:
    __slots__ = ("subscription", "consumer_type", "initial_position", "receiver_queue_size",
                 "nack_delay_s", "consumer_name", "durable", "start_message_id",
                 "start_inclusive", "properties", "schema", "chunking")

    def __init__(self, subscription: str, *, consumer_type=ConsumerType.Exclusive,
                 initial_position=InitialPosition.Latest, receiver_queue_size: int = 1000,
                 negative_ack_redelivery_delay_ms: int = 60_000,
                 consumer_name: str | None = None, durable: bool = True,
                 start_message_id: MessageId | None = None, start_inclusive: bool = False,
                 properties: dict[str, str] | None = None, schema=None,
                 max_pending_chunked_message: int = 10,
                 auto_ack_oldest_chunked_message_on_queue_full: bool = False,
                 expire_time_of_incomplete_chunked_message_ms: int = 60_000) -> None:
        self.schema = schema   # a pulsarlite.schema Schema, or None (bytes)
        try:
            self.chunking = ChunkingConfig(
                pending_messages_max=int(max_pending_chunked_message),
                auto_ack_oldest_on_queue_full=bool(auto_ack_oldest_chunked_message_on_queue_full),
                expire_incomplete_ms=int(expire_time_of_incomplete_chunked_message_ms))
        except (TypeError, ValueError) as exc:
            raise InvalidConfiguration(str(exc)) from None
        if not isinstance(subscription, str) or not subscription:
            raise InvalidConfiguration("subscription_name must be a non-empty string")
        try:
            self.consumer_type = ConsumerType(int(consumer_type))
            self.initial_position = InitialPosition(int(initial_position))
        except (ValueError, TypeError):
            raise InvalidConfiguration(f"unknown consumer type {consumer_type!r} or initial "
                                       f"position {initial_position!r}") from None
        if not 1 <= receiver_queue_size <= 1_000_000:
            raise InvalidConfiguration("receiver_queue_size must be in [1, 1000000]")
        if negative_ack_redelivery_delay_ms < 0:
            raise InvalidConfiguration("negative_ack_redelivery_delay_ms must be >= 0")
        self.subscription = subscription
        self.receiver_queue_size = int(receiver_queue_size)
        self.nack_delay_s = negative_ack_redelivery_delay_ms / 1000
        self.consumer_name = consumer_name
        self.durable = durable
        self.start_message_id = start_message_id
        self.start_inclusive = start_inclusive
        self.properties = properties


def _before(mid: tuple[int, int, int], start: MessageId, inclusive: bool) -> bool:
    """Whether a received message (ledger, entry, batch_index) lies before a start id."""
    entry = mid[:2]
    start_entry = (start._ledger_id, start._entry_id)
    if entry != start_entry:
        return entry < start_entry
    if start._batch_index < 0 or mid[2] < 0:
        return not inclusive
    return mid[2] < start._batch_index or (mid[2] == start._batch_index and not inclusive)


class ConsumerImpl(_Handler):
    kind = "consumer"

    def __init__(self, client: ClientImpl, topic: str, conf: ConsumerConf, sink: _SinkBase, *,
                 partition: int = -1) -> None:
        super().__init__(client, topic)
        self.conf = conf
        self.sink = sink
        self.partition = partition
        self.consumer_id = next(client._consumer_ids)
        self.epoch = 0
        self.flow_threshold = max(1, conf.receiver_queue_size // 2)
        self._permits_owed = 0
        self._batch_acks = k.BatchAckTracker()
        self._tracker_lock = threading.Lock()
        self._acks: list[pb.MessageIdData] = []
        self._ack_timer: asyncio.TimerHandle | None = None
        self._nacks: dict[tuple[int, int], float] = {}
        self._nack_timer: asyncio.TimerHandle | None = None
        self._last_dequeued_msg: Message | None = None
        # readers and seeks: drop what lies before this id
        start = conf.start_message_id
        self._start_filter: tuple[MessageId, bool] | None = None
        if start is not None and not is_earliest(start) and not is_latest(start):
            self._start_filter = (start, conf.start_inclusive)
        self._baseline: MessageId | None = None   # reader started at latest: the last id then
        self._chunks = ChunkAssembler(conf.chunking)   # chunked messages being joined
        self._chunk_timer: asyncio.TimerHandle | None = None

    @property
    def _last_dequeued(self) -> MessageId | None:
        msg = self._last_dequeued_msg
        return None if msg is None else msg.message_id()

    def _subscribe_start(self) -> pb.MessageIdData | None:
        if self.conf.durable:
            return None
        if self._last_dequeued is not None:
            self._start_filter = (self._last_dequeued, False)
            return self._last_dequeued.to_proto()
        start = self.conf.start_message_id
        if start is None:
            return None
        if is_earliest(start):
            return pb.MessageIdData(ledgerId=c.u64(-1), entryId=c.u64(-1))
        if is_latest(start):
            return pb.MessageIdData(ledgerId=INT64_MAX, entryId=INT64_MAX)
        return start.to_proto()

    async def _connect(self) -> None:
        conn = await self.client.connection_for(self.topic)
        rid = self.client.next_request_id()
        conf = self.conf
        conn.consumers[self.consumer_id] = self
        frame = c.subscribe(self.topic, conf.subscription, int(conf.consumer_type),
                            self.consumer_id, rid, consumer_name=conf.consumer_name,
                            durable=conf.durable, start_message_id=self._subscribe_start(),
                            initial_position=int(conf.initial_position),
                            schema=None if conf.schema is None
                            else conf.schema.schema_info().to_pb())
        try:
            await conn.request(frame, rid, f"subscribe {conf.subscription!r} to {self.topic}")
        except BaseException:
            if conn.consumers.get(self.consumer_id) is self:
                del conn.consumers[self.consumer_id]
            raise
        if self.closed:
            raise AlreadyClosed(f"consumer on {self.topic} is closed")
        if conn.closed or conn.consumers.get(self.consumer_id) is not self:
            # CLOSE_CONSUMER or the connection's end right behind the SUCCESS (same read):
            # this subscription is void, subscribe again (as for producers above)
            if conn.consumers.get(self.consumer_id) is self:
                del conn.consumers[self.consumer_id]
            raise ConnectError(f"consumer on {self.topic} was closed by the broker while it "
                               "subscribed; subscribing again")
        self.sink.clear_for(self)
        self._drop_partial_chunks()
        self.epoch += 1
        self._permits_owed = 0
        self.conn = conn
        conn.write(c.flow(self.consumer_id, conf.receiver_queue_size))
        self._flush_acks()

    def _disconnected(self) -> None:
        self.sink.clear_for(self)
        self._drop_partial_chunks()

    # receiving
    def _on_message(self, conn: Connection, event: k.MessageReceived) -> None:
        if conn is not self.conn:
            return
        ledger_id, entry_id = event.ledger_id, event.entry_id
        if not event.checksum_ok:
            log.error("event=checksum_mismatch topic=%s ledger=%d entry=%d", self.topic,
                      ledger_id, entry_id)
            conn.write(c.redeliver_unacknowledged(self.consumer_id,
                                                  [c.message_id(ledger_id, entry_id)]))
            return
        try:
            metadata, messages = unpack_entry(event.entry)
        except EntryFormatError as exc:
            log.error("event=bad_entry topic=%s ledger=%d entry=%d error=%r -- acknowledged and "
                      "skipped", self.topic, ledger_id, entry_id, exc)
            self._acks.append(c.message_id(ledger_id, entry_id))
            self._schedule_ack_flush()
            self.return_permits(1, self.epoch)
            return
        batched = metadata.batched
        if not batched and metadata.raw.num_chunks_from_msg > 1:
            self._on_chunk(event, metadata, messages[0])
            return
        count = len(messages)
        keep = None
        if batched:
            keep = k.unacked_indexes(event.ack_set, count)
            with self._tracker_lock:
                self._batch_acks.received(ledger_id, entry_id,
                                          range(count) if keep is None else keep)
            if keep is not None:
                keep = set(keep)
        skipped = 0
        start_filter = self._start_filter
        epoch = self.epoch
        info = (metadata.publish_time_ms, metadata.producer_name, metadata.schema_version,
                event.redelivery_count, self.topic, self.partition, ledger_id, entry_id,
                count if batched else 0)
        if keep is None and start_filter is None:   # the hot path
            out = [Message(m, info, self, epoch) for m in messages]
        else:
            out = []
            for m in messages:
                index = m.batch_index
                if keep is not None and index not in keep:
                    skipped += 1
                    continue
                if start_filter is not None:
                    if _before((ledger_id, entry_id, index), *start_filter):
                        skipped += 1
                        if batched:
                            with self._tracker_lock:
                                self._batch_acks.ack(ledger_id, entry_id, index)
                        continue
                    self._start_filter = start_filter = None
                out.append(Message(m, info, self, epoch))
        if out:
            self.sink.put_many(out)
        if skipped:
            self.return_permits(skipped, epoch)

    # chunked messages: the pure ChunkAssembler decides, these execute
    def _on_chunk(self, event: k.MessageReceived, metadata, message: WireMessage) -> None:
        raw = metadata.raw
        chunk = Chunk(raw.uuid, raw.chunk_id, raw.num_chunks_from_msg, raw.total_chunk_msg_size,
                      (event.ledger_id, event.entry_id), raw.publish_time,
                      bytes(message.payload), (metadata, event.redelivery_count))
        epoch = self.epoch
        if not self._run_chunk_actions(self._chunks.on_chunk(chunk, int(time.time() * 1000))):
            self.return_permits(1, epoch)   # a chunk that completes nothing frees its permit
        self._schedule_chunk_expiry()

    def _run_chunk_actions(self, actions) -> bool:
        """Execute the assembler's actions; True if one delivered a message."""
        delivered = False
        for action in actions:
            if type(action) is Deliver:
                delivered = self._deliver_chunked(action) or delivered
            elif type(action) is ChunkAck:
                log.warning("chunks dropped and acknowledged topic=%s uuid=%s why=%s entries=%s",
                            self.topic, action.uuid, action.why.value, list(action.positions))
                for ledger_id, entry_id in action.positions:
                    self._acks.append(c.message_id(ledger_id, entry_id))
                self._schedule_ack_flush()
            else:   # Release: left unacked, the broker sends them again after a redelivery
                log.info("chunks dropped unacknowledged topic=%s uuid=%s why=%s entries=%s",
                         self.topic, action.uuid, action.why.value, list(action.positions))
        return delivered

    def _deliver_chunked(self, action: Deliver) -> bool:
        metadata, redelivery_count = action.context
        try:
            whole, messages = unpack_chunked(metadata.raw, action.payload,
                                             uncompressed_bytes_max=self.conf.chunking.message_bytes_max)
        except EntryFormatError as exc:
            log.error("bad chunked message topic=%s uuid=%s entries=%s error=%r -- acknowledged "
                      "and skipped", self.topic, action.uuid, list(action.positions), exc)
            for ledger_id, entry_id in action.positions:
                self._acks.append(c.message_id(ledger_id, entry_id))
            self._schedule_ack_flush()
            return False
        last = action.positions[-1]
        info = (whole.publish_time_ms, whole.producer_name, whole.schema_version,
                redelivery_count, self.topic, self.partition, last[0], last[1], 0)
        msg = ChunkedMessage(messages[0], info, self, self.epoch)
        msg._mid = ChunkMessageId(action.positions, self.partition, self.topic)
        self.sink.put_many([msg])
        return True

    def _schedule_chunk_expiry(self) -> None:
        if self._chunk_timer is not None:
            self._chunk_timer.cancel()
            self._chunk_timer = None
        deadline_ms = self._chunks.deadline_ms()
        if deadline_ms is not None:
            delay_s = max(0.001, deadline_ms / 1000 - time.time())
            self._chunk_timer = self.loop.call_later(delay_s, self._expire_chunks)

    def _expire_chunks(self) -> None:
        self._chunk_timer = None
        if self.closed:
            return
        self._run_chunk_actions(self._chunks.on_time(int(time.time() * 1000)))
        self._schedule_chunk_expiry()

    def _drop_partial_chunks(self) -> None:
        """Everything unacked comes again (a reconnection, a redelivery, a seek): partial
        chunked messages start over from the chunks the broker sends."""
        self._run_chunk_actions(self._chunks.clear())
        if self._chunk_timer is not None:
            self._chunk_timer.cancel()
            self._chunk_timer = None

    def return_permits(self, n: int, epoch: int) -> None:
        if epoch != self.epoch or self.conn is None:
            return
        self._permits_owed += n
        if self._permits_owed >= self.flow_threshold:
            self.conn.write(c.flow(self.consumer_id, self._permits_owed))
            self._permits_owed = 0

    # acks
    def ack_batch_index(self, mid: MessageId) -> bool:
        """Note a batched message acked; True when its whole entry is now acked. Thread-safe
        (the blocking API calls it from application threads, sparing a hop per message)."""
        with self._tracker_lock:
            return self._batch_acks.ack(mid._ledger_id, mid._entry_id, mid._batch_index)

    def ack_message_fast(self, msg: Message) -> tuple[int, int] | None:
        """For the blocking API (any thread): the (ledger, entry) to ack on the wire once
        ``msg`` is acked, or None while the rest of its batch is unacked."""
        e = msg._e
        index = msg._m.batch_index
        if index >= 0 and e[8]:
            with self._tracker_lock:
                if not self._batch_acks.ack(e[6], e[7], index):
                    return None
        return (e[6], e[7])

    def acknowledge_entry_key(self, key: tuple[int, int]) -> None:
        """Ack the entry (ledger, entry) (on the loop)."""
        if self.closed:
            return
        self._nacks.pop(key, None)
        self._acks.append(c.message_id(key[0], key[1]))
        if len(self._acks) >= 1000:
            self._flush_acks()
        else:
            self._schedule_ack_flush()

    def acknowledge(self, mid: MessageId) -> None:
        if self.closed:
            raise AlreadyClosed(f"consumer on {self.topic} is closed")
        if mid._batch_index >= 0 and not self.ack_batch_index(mid):
            return   # the rest of the batch is not acked yet (nor a nack of it cancelled)
        self.acknowledge_entry(mid)

    def acknowledge_entry(self, mid: MessageId) -> None:
        """Ack the whole entry of ``mid`` (on the loop)."""
        if self.closed:
            return
        if type(mid) is ChunkMessageId:   # every chunk entry of the message
            for key in mid._chunks:
                self._nacks.pop(key, None)
                self._acks.append(c.message_id(*key))
        else:
            ledger_id, entry_id = mid._ledger_id, mid._entry_id
            self._nacks.pop((ledger_id, entry_id), None)
            self._acks.append(c.message_id(ledger_id, entry_id))
        if len(self._acks) >= 1000:
            self._flush_acks()
        else:
            self._schedule_ack_flush()

    def _schedule_ack_flush(self) -> None:
        if self._ack_timer is None:
            self._ack_timer = self.loop.call_later(0.01, self._flush_acks)

    def _flush_acks(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        if not self._acks or self.conn is None:
            return
        acks, self._acks = self._acks, []
        self.conn.write(c.ack(self.consumer_id, acks))

    def acknowledge_cumulative(self, mid: MessageId) -> None:
        if self.closed:
            raise AlreadyClosed(f"consumer on {self.topic} is closed")
        if self.conf.consumer_type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise InvalidConfiguration("cumulative acknowledgement is not allowed on a "
                                       f"{self.conf.consumer_type.name} subscription")
        ledger_id, entry_id = mid._ledger_id, mid._entry_id
        ack_set = None
        if mid._batch_index >= 0 and mid._batch_size and mid._batch_index < mid._batch_size - 1:
            ack_set = k.ack_set_after(mid._batch_index, mid._batch_size)
        else:
            with self._tracker_lock:
                self._batch_acks.forget_through(ledger_id, entry_id)
        for key in [key for key in self._nacks if key <= (ledger_id, entry_id)]:
            del self._nacks[key]
        self._flush_acks()
        if self.conn is None:
            return
        if ack_set is not None and entry_id > 0:
            # Inside a batch: like the official clients, ack everything before the batch's
            # entry; then the entry with the ack_set of its later messages (a broker that keeps
            # batch indexes uses it; otherwise the batch comes back whole: at-least-once).
            self.conn.write(c.ack(self.consumer_id, [c.message_id(ledger_id, entry_id - 1)],
                                  cumulative=True))
        self.conn.write(c.ack(self.consumer_id, [c.message_id(ledger_id, entry_id,
                                                              ack_set=ack_set)],
                              cumulative=True))

    def negative_acknowledge(self, mid: MessageId) -> None:
        if self.closed:
            raise AlreadyClosed(f"consumer on {self.topic} is closed")
        due = self.loop.time() + self.conf.nack_delay_s
        for key in (mid._chunks if type(mid) is ChunkMessageId else ((mid._ledger_id, mid._entry_id),)):
            self._nacks[key] = due
        if self._nack_timer is None:
            self._nack_timer = self.loop.call_later(max(self.conf.nack_delay_s, 0.001),
                                                    self._redeliver_nacked)

    def _redeliver_nacked(self) -> None:
        self._nack_timer = None
        now = self.loop.time()
        due = [key for key, at in self._nacks.items() if at <= now + 0.001]
        if due and self.conn is not None:
            for key in due:
                del self._nacks[key]
            self.conn.write(c.redeliver_unacknowledged(
                self.consumer_id, [c.message_id(l, e) for l, e in due]))
        if self._nacks:
            delay = max(0.001, min(self._nacks.values()) - now)
            self._nack_timer = self.loop.call_later(delay, self._redeliver_nacked)

    def redeliver_unacknowledged_messages(self) -> None:
        if self.conn is not None:
            self.sink.clear_for(self)
            self._drop_partial_chunks()
            self.epoch += 1
            self._permits_owed = 0
            self.conn.write(c.redeliver_unacknowledged(self.consumer_id))
            self.conn.write(c.flow(self.consumer_id, self.conf.receiver_queue_size))

    # seek and last message id
    async def seek(self, target: MessageId | int) -> None:
        conn = await self._wait_connected(self.client.operation_timeout_s)
        self._flush_acks()   # acks of messages before the seek must not land after it
        rid = self.client.next_request_id()
        if isinstance(target, MessageId):
            if is_earliest(target):
                proto = pb.MessageIdData(ledgerId=c.u64(-1), entryId=c.u64(-1))
            elif is_latest(target):
                proto = pb.MessageIdData(ledgerId=INT64_MAX, entryId=INT64_MAX)
            else:
                proto = pb.MessageIdData(ledgerId=c.u64(target._ledger_id),
                                         entryId=c.u64(target._entry_id))
            frame = c.seek(self.consumer_id, rid, message_id=proto)
        else:
            if not self.conf.durable:
                raise InvalidConfiguration("a reader seeks by message id only")
            frame = c.seek(self.consumer_id, rid, publish_time_ms=int(target))
        self._hold_reconnect = True
        try:
            await conn.request(frame, rid, f"seek on {self.topic}")
        finally:
            self._hold_reconnect = False
        if isinstance(target, MessageId):
            self._last_dequeued_msg = None
            if not self.conf.durable:
                self.conf.start_message_id = target
            if is_earliest(target) or is_latest(target):
                self._start_filter = None
            else:
                self._start_filter = (target, self.conf.start_inclusive)
        self.sink.clear_for(self)
        with self._tracker_lock:
            self._batch_acks.clear()
        if self.conn is None:
            await self._reconnect_now()
        elif self.conn is conn:
            # the broker kept us attached: drop what was queued before the seek
            self.epoch += 1
            self._permits_owed = 0
            conn.write(c.flow(self.consumer_id, self.conf.receiver_queue_size))

    async def _reconnect_now(self) -> None:
        deadline = self.loop.time() + self.client.operation_timeout_s
        try:
            await _retry_until(deadline, self.loop, self._connect, f"resubscribe to {self.topic}")
        except ClientError:
            self._schedule_reconnect()
            raise

    async def get_last_message_id(self) -> MessageId:
        conn = await self._wait_connected(self.client.operation_timeout_s)
        rid = self.client.next_request_id()
        resp = await conn.request(c.get_last_message_id(self.consumer_id, rid), rid,
                                  f"last message id of {self.topic}")
        return MessageId.from_proto(resp.command.getLastMessageIdResponse.last_message_id,
                                    topic=self.topic)

    async def has_message_available(self) -> bool:
        if self.sink.has_for(self):
            return True
        last = await self.get_last_message_id()
        if last._entry_id < 0:
            return False
        last_entry = (last._ledger_id, last._entry_id)
        if self._last_dequeued is not None:
            d = self._last_dequeued
            return last_entry > (d._ledger_id, d._entry_id)
        start = self.conf.start_message_id
        if start is None or is_earliest(start):
            return True
        if is_latest(start):
            base = self._baseline
            return base is not None and last_entry > (base._ledger_id, base._entry_id)
        start_entry = (start._ledger_id, start._entry_id)
        return last_entry >= start_entry if self.conf.start_inclusive else last_entry > start_entry

    # lifecycle
    async def unsubscribe(self) -> None:
        conn = await self._wait_connected(self.client.operation_timeout_s)
        rid = self.client.next_request_id()
        await conn.request(c.unsubscribe(self.consumer_id, rid), rid,
                           f"unsubscribe {self.conf.subscription!r} from {self.topic}")
        await self._shut(send_close=False)

    async def close(self) -> None:
        await self._shut(send_close=True)

    async def _shut(self, *, send_close: bool) -> None:
        if self.closed:
            return
        self._flush_acks()
        self.closed = True
        self.client.unregister(self)
        for timer in (self._ack_timer, self._nack_timer, self._chunk_timer):
            if timer is not None:
                timer.cancel()
        self.sink.clear_for(self)
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            conn.consumers.pop(self.consumer_id, None)
            if send_close:
                rid = self.client.next_request_id()
                try:
                    await conn.request(c.close_consumer(self.consumer_id, rid), rid,
                                       f"close consumer on {self.topic}")
                except ClientError:
                    pass


class MultiConsumerImpl:
    """One application-level consumer over several topics or partitions (and, with a pattern,
    the topics of a namespace matching it, rediscovered periodically). All share one sink."""

    def __init__(self, client: ClientImpl, conf: ConsumerConf, sink: _SinkBase, *,
                 pattern: re.Pattern | None = None, namespace: str | None = None,
                 discovery_period_s: float = 60.0,
                 regex_mode: RegexSubscriptionMode = RegexSubscriptionMode.PersistentOnly) -> None:
        self.client = client
        self.regex_mode = regex_mode
        self.conf = conf
        self.sink = sink
        self.pattern = pattern
        self.namespace = namespace
        self.discovery_period_s = discovery_period_s
        self.consumers: dict[str, ConsumerImpl] = {}
        self.closed = False
        self._discovery: asyncio.Task | None = None
        self.topic = pattern.pattern if pattern is not None else None

    async def add_topics(self, topics: list[str]) -> None:
        new = []
        for topic in topics:
            for name in await self.client.topic_partitions(topic):
                if name not in self.consumers:
                    partition = TopicName.parse(name).partition_index
                    consumer = ConsumerImpl(self.client, name, self.conf, self.sink,
                                            partition=partition)
                    self.consumers[name] = consumer
                    new.append(consumer)
        results = await asyncio.gather(*(c_._start() for c_ in new), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for consumer in new:
                self.consumers.pop(consumer.topic, None)
            await asyncio.gather(*(c_.close() for c_ in new), return_exceptions=True)
            raise errors[0]

    async def _matching_topics(self) -> list[str]:
        """The namespace's topics of the regex mode (persistent, non-persistent or both) whose
        name without its domain matches the pattern without its domain (as the official clients
        filter: ``persistent://t/ns/a.*`` with AllTopics matches ``non-persistent://t/ns/ab``)."""
        topics = await self.client.topics_of_namespace(self.namespace, mode=int(self.regex_mode))
        text = self.pattern.pattern
        pattern = re.compile(text.split("://", 1)[1] if "://" in text else text, self.pattern.flags)
        out = set()
        for topic in topics:
            name = TopicName.parse(topic)
            base = str(name.partitioned_parent) if name.is_partition else str(name)
            if pattern.fullmatch(base.split("://", 1)[1]) or pattern.fullmatch(str(name).split("://", 1)[1]):
                out.add(base)
        return sorted(out)

    async def start_pattern(self) -> None:
        await self.add_topics(await self._matching_topics())
        self._discovery = self.client.spawn(self._discover_loop())
        self.client.register(self)

    async def rediscover(self) -> None:
        topics = await self._matching_topics()
        await self.add_topics(topics)
        wanted = set()
        for topic in topics:
            wanted.update(await self.client.topic_partitions(topic))
        for name in [n for n in self.consumers if n not in wanted]:
            await self.consumers.pop(name).close()

    async def _discover_loop(self) -> None:
        while not self.closed:
            await asyncio.sleep(self.discovery_period_s)
            try:
                await self.rediscover()
            except Exception as exc:
                log.warning("event=pattern_discovery_failed namespace=%s error=%r",
                            self.namespace, exc)

    def _consumer_of(self, mid: MessageId) -> ConsumerImpl:
        consumer = self.consumers.get(mid._topic) if mid._topic else None
        if consumer is None:
            raise InvalidConfiguration(f"message id {mid} does not belong to this consumer")
        return consumer

    def acknowledge(self, mid: MessageId) -> None:
        self._consumer_of(mid).acknowledge(mid)

    def acknowledge_cumulative(self, mid: MessageId) -> None:
        self._consumer_of(mid).acknowledge_cumulative(mid)

    def negative_acknowledge(self, mid: MessageId) -> None:
        self._consumer_of(mid).negative_acknowledge(mid)

    def redeliver_unacknowledged_messages(self) -> None:
        for consumer in self.consumers.values():
            consumer.redeliver_unacknowledged_messages()

    async def seek(self, target) -> None:
        await asyncio.gather(*(c_.seek(target) for c_ in self.consumers.values()))

    async def unsubscribe(self) -> None:
        await asyncio.gather(*(c_.unsubscribe() for c_ in self.consumers.values()))
        await self.close()

    async def close(self) -> None:
        self.closed = True
        self.client.unregister(self)
        if self._discovery is not None:
            self._discovery.cancel()
        await asyncio.gather(*(c_.close() for c_ in self.consumers.values()),
                             return_exceptions=True)


def _pattern_namespace(pattern: re.Pattern) -> str:
    text = pattern.pattern
    if "://" in text:
        text = text.split("://", 1)[1]
    parts = text.split("/")
    if len(parts) < 3:
        return "public/default"
    return f"{parts[0]}/{parts[1]}"


async def subscribe(client: ClientImpl, topic, conf: ConsumerConf, sink: _SinkBase, *,
                    pattern_auto_discovery_period_s: float = 60.0,
                    regex_subscription_mode: RegexSubscriptionMode = RegexSubscriptionMode.PersistentOnly):
    client.check_open()
    if isinstance(topic, re.Pattern):
        pattern = topic
        if "://" not in pattern.pattern:
            pattern = re.compile("persistent://public/default/" + pattern.pattern)
        multi = MultiConsumerImpl(client, conf, sink, pattern=pattern,
                                  namespace=_pattern_namespace(pattern),
                                  discovery_period_s=pattern_auto_discovery_period_s,
                                  regex_mode=regex_subscription_mode)
        await multi.start_pattern()
        return multi
    topics = [topic] if isinstance(topic, str) else list(topic)
    if not topics:
        raise InvalidConfiguration("subscribe needs at least one topic")
    names = [str(TopicName.parse(t)) for t in topics]
    if len(names) == 1:
        deadline = client.loop.time() + client.operation_timeout_s
        partitions = await _retry_until(deadline, client.loop,
                                        lambda: client.partitions_of(names[0]),
                                        f"partitioned metadata of {names[0]}")
        if partitions == 0:
            consumer = ConsumerImpl(client, names[0], conf, sink,
                                    partition=TopicName.parse(names[0]).partition_index)
            await consumer._start()
            return consumer
    multi = MultiConsumerImpl(client, conf, sink)
    multi.topic = names[0] if len(names) == 1 else None
    await multi.add_topics(names)
    client.register(multi)
    return multi


async def create_reader(client: ClientImpl, topic: str, start_message_id: MessageId,
                        sink: _SinkBase, *, start_message_id_inclusive: bool = False,
                        receiver_queue_size: int = 1000, reader_name: str | None = None,
                        subscription_role_prefix: str | None = None,
                        schema=None) -> ConsumerImpl:
    client.check_open()
    if not isinstance(start_message_id, MessageId):
        raise InvalidConfiguration("start_message_id must be a MessageId (e.g. "
                                   "MessageId.earliest)")
    name = str(TopicName.parse(topic))
    prefix = subscription_role_prefix or "reader"
    subscription = f"{prefix}-{client._random.getrandbits(40):010x}"
    conf = ConsumerConf(subscription, consumer_type=ConsumerType.Exclusive,
                        receiver_queue_size=receiver_queue_size, consumer_name=reader_name,
                        durable=False, start_message_id=start_message_id,
                        start_inclusive=start_message_id_inclusive, schema=schema)
    reader = ConsumerImpl(client, name, conf, sink,
                          partition=TopicName.parse(name).partition_index)
    await reader._start()
    if is_latest(start_message_id):
        try:
            reader._baseline = await reader.get_last_message_id()
        except ClientError:
            reader._baseline = None
    return reader
