"""The client's connections and lookups (asyncio shell around :class:`core.ConnectionCore`).

:class:`Connection` is one TCP (or TLS) connection to a broker: it feeds the bytes it reads to the
sans-IO core and hands each event to the producer, consumer or request it belongs to; a lost
connection fails its pending requests and tells every producer and consumer on it (each
reconnects on its own, see :mod:`.handler`). :class:`ClientImpl` keeps one connection per broker
address, shared by every producer and consumer of the client, and asks the brokers
PARTITIONED_METADATA, LOOKUP (following redirects, at most ``REDIRECTS_MAX``) and
GET_TOPICS_OF_NAMESPACE as the official clients do. Everything runs on one event loop (the
caller's for ``pulsarlite.aio``, a background thread's for the blocking API).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import random
import ssl
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.client import core as k
from pulsarlite.client.auth import ClientSecurity
from pulsarlite.client.errors import (AlreadyClosed, AuthenticationError, ClientError, ConnectError,
                                      InvalidConfiguration, LookupError_, Timeout, broker_error)
from pulsarlite.topic_name import TopicName
from pulsarlite.wire import commands as c
from pulsarlite.wire.frames import FrameError

if TYPE_CHECKING:   # the handlers a connection dispatches to (they import this module)
    from pulsarlite.client.consumer import ConsumerImpl
    from pulsarlite.client.producer import ProducerImpl

log = logging.getLogger("pulsarlite.client")

REDIRECTS_MAX = 20


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
        handle = self.loop.call_later(timeout_s, expire, future)
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


def expire(future: asyncio.Future) -> None:
    """A timer's callback: a future still pending at its deadline resolves to None (its waiter
    reads None as a timeout)."""
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
