"""One client connection speaking the Pulsar binary protocol (docs/protocol.md#pulsar-binary-protocol).

- :class:`ConnectionCore` (sans I/O): bytes in -> frames decoded, the handshake (CONNECTED is
  the first frame we send; ``protocol_version = min(client's, ours)``), PING/PONG, and the
  answers to bad input (ERROR, then close). Commands that need the service come out as frames
  for the shell; nothing here awaits.
- :class:`ServerConnection` (asyncio Protocol shell): executes those commands against the
  :class:`~broker.service.BrokerService`, holds this connection's producers and consumers,
  keeps the connection alive (PING when idle, close when silent), and pauses reading when the
  broker's publish buffer is full.

Never send a command the official clients do not know (the C++ client drops the connection on
REACHED_END_OF_TOPIC, WATCH_*, TC_*). Request ids are echoed and never used as keys.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass, field

from broker.dispatch import ConsumerBusyError, KeySharedMode, SubType
from broker.errors import CumulativeAckNotAllowedError, NotAllowedError, server_error_of
from broker.managed_ledger import Position
from broker.schemas import decode_version, encode_version
from broker.security.authentication import (SLOW_AUTH_METHODS, AuthenticationData, AuthenticationError,
                                            AuthenticationService, Identity)
from broker.security.authorization import TopicOperation
from broker.tls import peer_certificate_of
from broker.topic import AccessMode
from pulsarlite.wire import commands as c
from pulsarlite.wire import pb
from pulsarlite.counted_log import CountedCause
from pulsarlite.topic_name import TopicName, subscription_name_problem
from pulsarlite.wire.frames import Frame, FrameDecoder, FrameError, FrameTooLargeError

log = logging.getLogger("pulsarlite.broker.connection")

T = pb.BaseCommand
_SEND = T.SEND
SERVER_VERSION = "pulsarlite"
# Below 12 the client refuses last-message-id; we describe up to PROTOCOL_VERSION_MAX.
PROTOCOL_VERSION = c.PROTOCOL_VERSION_MAX

# commands the shell executes (all others, once connected, get an ERROR or are ignored)
SERVICE_COMMANDS = frozenset({
    T.LOOKUP, T.PARTITIONED_METADATA, T.PRODUCER, T.SEND, T.CLOSE_PRODUCER, T.SUBSCRIBE, T.FLOW,
    T.ACK, T.REDELIVER_UNACKNOWLEDGED_MESSAGES, T.UNSUBSCRIBE, T.CLOSE_CONSUMER, T.SEEK,
    T.GET_LAST_MESSAGE_ID, T.GET_SCHEMA, T.GET_OR_CREATE_SCHEMA, T.GET_TOPICS_OF_NAMESPACE,
    T.CONSUMER_STATS,
})
# sent by a client as answers; nothing to do
IGNORED_COMMANDS = frozenset({T.PONG, T.SUCCESS, T.ERROR, T.ACK_RESPONSE})

# the sub-message of BaseCommand for each type (to find a request_id to answer an ERROR to)
_FIELD_OF_TYPE = {}
for _f in T.DESCRIPTOR.fields:
    if _f.message_type is not None:
        _FIELD_OF_TYPE[_f.number] = _f.name


class ConnState(enum.Enum):
    AWAITING_CONNECT = "awaiting_connect"
    AUTHENTICATING = "authenticating"    # [security] a slow check (bcrypt) runs off the loop
    CONNECTED = "connected"
    CLOSED = "closed"


@dataclass
class CoreOutput:
    """What the shell must do after feeding bytes: write ``out`` (in order), handle ``frames``
    (in order), then close if ``close``."""

    out: list[bytes] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    close: bool = False
    # [security] credentials whose check is slow (basic: bcrypt): the shell runs
    # ``authentication.identify`` off the event loop and hands the outcome to
    # ConnectionCore.complete_authentication
    authenticate: AuthenticationData | None = None


def _request_id_of(command: pb.BaseCommand) -> int | None:
    for f, value in command.ListFields():
        if f.message_type is not None and "request_id" in value.DESCRIPTOR.fields_by_name:
            if value.HasField("request_id"):
                return value.request_id
    return None


UNSUPPORTED_COMMANDS_MAX_DEFAULT = 1_000


class ConnectionCore:
    def __init__(self, *, frame_bytes_max: int, message_bytes_max: int,
                 server_version: str = SERVER_VERSION, protocol_version: int = PROTOCOL_VERSION,
                 unsupported_commands_max: int = UNSUPPORTED_COMMANDS_MAX_DEFAULT,
                 connect_frame_bytes_max: int | None = None,
                 authentication: AuthenticationService | None = None) -> None:
        self.state = ConnState.AWAITING_CONNECT
        # [security] None: authentication off, every client served as before. Else CONNECT must
        # prove a role (its auth method and data, or the TLS peer certificate the shell sets on
        # ``peer_certificate``), and credentials that expire are refreshed by AUTH_CHALLENGE.
        self._authentication = authentication
        self.peer_certificate: dict | None = None
        self.role: str | None = None
        self.auth: AuthenticationData | None = None
        self.auth_expires_at_s: float | None = None
        self.supports_auth_refresh = False
        self.auth_challenge_pending = False
        self.unsupported_commands_max = unsupported_commands_max
        self.unsupported_commands = CountedCause()
        # before CONNECT only small frames: an unauthenticated peer holds little memory
        self.frame_bytes_max = frame_bytes_max
        self._decoder = FrameDecoder(min(frame_bytes_max, connect_frame_bytes_max or frame_bytes_max))
        self.message_bytes_max = message_bytes_max
        self.server_version = server_version
        self.protocol_version = protocol_version
        self.client_protocol_version: int | None = None
        self.negotiated_protocol_version: int | None = None
        self.client_version: str | None = None

    def receive(self, data: bytes) -> CoreOutput:
        result = CoreOutput()
        if self.state is ConnState.CLOSED:
            return result
        try:
            frames = self._decoder.feed(data)
        except FrameTooLargeError as e:
            return self._fail(result, pb.NotAllowedError, f"frame too large: {e}")
        except FrameError as e:
            return self._fail(result, pb.UnknownError, f"bad frame: {e}")
        if len(frames) == 1 and self.state is ConnState.CONNECTED:
            frame = frames[0]
            if frame.command.type == _SEND and frame.entry is not None:
                result.frames = frames       # one SEND (the paced case): as _on_frame gives it
                return result
        for frame in frames:
            self._on_frame(frame, result)
            if result.close:
                break
        return result

    @property
    def buffered_bytes(self) -> int:
        """Bytes of a frame started and not complete yet."""
        return self._decoder.buffered_bytes

    def _fail(self, result: CoreOutput, error: int, message: str, request_id: int = 0) -> CoreOutput:
        result.out.append(c.error(request_id, error, message))
        result.close = True
        self.state = ConnState.CLOSED
        return result

    def _connected(self, result: CoreOutput) -> None:
        result.out.append(c.connected(self.server_version, self.negotiated_protocol_version,
                                      max_message_size=self.message_bytes_max,
                                      supports_auth_refresh=self._authentication is not None))
        self.state = ConnState.CONNECTED
        self._decoder.frame_bytes_max = self.frame_bytes_max

    # -- [security] authentication ---------------------------------------------------------------
    def complete_authentication(self, auth: AuthenticationData, identity: Identity | None,
                                error: AuthenticationError | None) -> CoreOutput:
        """The outcome of a slow check the shell ran for ``CoreOutput.authenticate``: CONNECTED,
        or ERROR(AuthenticationError) and close."""
        result = CoreOutput()
        if self.state is not ConnState.AUTHENTICATING:
            return result                   # closed meanwhile
        if error is not None or identity is None:
            log.info("authentication refused method=%r reason=%s", auth.method, error)
            return self._fail(result, pb.AuthenticationError, str(error or "authentication failed"))
        self.role, self.auth, self.auth_expires_at_s = identity.role, auth, identity.expires_at_s
        self._connected(result)
        return result

    def _authenticate(self, auth: AuthenticationData, result: CoreOutput) -> bool:
        """The role ``auth`` proves becomes this connection's (its expiry remembered), or the
        client is told AuthenticationError and the connection closes. A refresh must prove the
        same role."""
        try:
            identity = self._authentication.identify(auth)     # one check: role and expiry
        except AuthenticationError as e:
            log.info("authentication refused method=%r reason=%s", auth.method[:32] or "none", e)
            self._fail(result, pb.AuthenticationError, str(e))
            return False
        if self.role is not None and identity.role != self.role:
            log.info("authentication refresh refused: role changed role=%s", self.role)
            self._fail(result, pb.AuthenticationError, "refreshed credentials name another role")
            return False
        self.role, self.auth, self.auth_expires_at_s = identity.role, auth, identity.expires_at_s
        return True

    def _on_auth_response(self, body: pb.CommandAuthResponse, result: CoreOutput) -> None:
        if self._authentication is None or self.auth is None:
            return                      # authentication off: nothing asked, nothing to check
        if not self.auth_challenge_pending:
            self._fail(result, pb.AuthenticationError, "AUTH_RESPONSE without AUTH_CHALLENGE")
            return
        auth = AuthenticationData(body.response.auth_method_name or self.auth.method, body.response.auth_data,
                                  self.peer_certificate)
        if self._authenticate(auth, result):
            self.auth_challenge_pending = False
            log.info("authentication refreshed role=%s method=%s", self.role, auth.method)

    def check_credentials(self, now_s: float) -> CoreOutput:
        """Called every ``authentication_refresh_check_interval_ms`` (Pulsar's
        authenticationRefreshCheckSeconds). Credentials that expired get AUTH_CHALLENGE; if the
        challenge is still unanswered at the next check, or the client cannot refresh (no
        supports_auth_refresh in CONNECT), the connection is closed with AuthenticationError."""
        result = CoreOutput()
        expires = self.auth_expires_at_s
        if self.state is not ConnState.CONNECTED or expires is None or now_s < expires:
            return result
        if self.auth_challenge_pending:
            log.info("closing: AUTH_CHALLENGE not answered in time role=%s", self.role)
            return self._fail(result, pb.AuthenticationError, "credentials expired and AUTH_CHALLENGE was not "
                                                              "answered with fresh ones in time")
        if not self.supports_auth_refresh:
            log.info("closing: credentials expired, the client cannot refresh them role=%s", self.role)
            return self._fail(result, pb.AuthenticationError, "credentials expired (the client does not "
                                                              "support refreshing them)")
        self.auth_challenge_pending = True
        result.out.append(c.auth_challenge(self.server_version, self.negotiated_protocol_version or 0,
                                           self.auth.method))
        return result

    def _on_frame(self, frame: Frame, result: CoreOutput) -> None:
        kind = frame.command.type
        if kind == _SEND and frame.entry is not None and self.state is ConnState.CONNECTED:
            result.frames.append(frame)      # the common case, as below
            return
        if self.state is ConnState.AWAITING_CONNECT:
            if kind != T.CONNECT:
                self._fail(result, pb.NotAllowedError,
                           f"expected CONNECT, got {T.Type.Name(kind)}", _request_id_of(frame.command) or 0)
                return
            connect = frame.command.connect
            self.client_version = connect.client_version
            self.client_protocol_version = connect.protocol_version
            self.negotiated_protocol_version = c.negotiate_protocol_version(connect.protocol_version,
                                                                           self.protocol_version)
            if self._authentication is not None:
                auth = AuthenticationData(connect.auth_method_name, connect.auth_data, self.peer_certificate)
                self.supports_auth_refresh = connect.feature_flags.supports_auth_refresh
                if auth.method in SLOW_AUTH_METHODS:
                    self.state = ConnState.AUTHENTICATING
                    result.authenticate = auth
                    return
                if not self._authenticate(auth, result):
                    return
            self._connected(result)
            return
        if self.state is ConnState.AUTHENTICATING:
            self._fail(result, pb.NotAllowedError, f"{T.Type.Name(kind)} before CONNECTED",
                       _request_id_of(frame.command) or 0)
            return
        if kind == T.CONNECT:
            self._fail(result, pb.NotAllowedError, "CONNECT sent twice")
        elif kind == T.AUTH_RESPONSE:
            self._on_auth_response(frame.command.authResponse, result)
        elif kind == T.PING:
            result.out.append(c.pong())
        elif kind in IGNORED_COMMANDS:
            pass
        elif kind in SERVICE_COMMANDS:
            if frame.entry is not None and kind != T.SEND:
                self._fail(result, pb.NotAllowedError, f"{T.Type.Name(kind)} carries no payload")
                return
            if kind == T.SEND and frame.entry is None:
                self._fail(result, pb.NotAllowedError, "SEND without payload")
                return
            result.frames.append(frame)
        else:
            request_id = _request_id_of(frame.command)
            name = T.Type.Name(kind) if kind in T.Type.values() else str(kind)
            due = self.unsupported_commands.due()
            count = self.unsupported_commands.count
            if count > self.unsupported_commands_max:
                log.warning("closing a connection after %d unsupported commands (last: %s)", count, name)
                self._fail(result, pb.NotAllowedError, f"too many unsupported commands ({count})",
                           request_id or 0)
                return
            if due:
                log.info("unsupported command %s (%d from this connection so far)", name, count)
            if request_id is not None:
                result.out.append(c.error(request_id, pb.NotAllowedError, f"{name} is not supported"))


# -- the shell ------------------------------------------------------------------------------------
def _enabled_authentication(service) -> AuthenticationService | None:
    authentication = getattr(service, "authentication", None)
    return authentication if authentication is not None and authentication.enabled else None


class _ConsumerRef:
    """This connection's side of a consumer (the subscription's ConsumerHandle)."""

    def __init__(self, connection: "ServerConnection", consumer_id: int, topic_key: str) -> None:
        self.connection = connection
        self.consumer_id = consumer_id
        self.topic_key = topic_key
        self.subscription = None
        self.closed = False
        self.consumer_name = ""
        self.connected_since_ms = int(time.time() * 1000)
        # as Pulsar's dispatch: MESSAGE ids name the partition (-1 for a topic that is not one);
        # the official clients build the consumed message's id (and route acks) from it
        self.partition = TopicName.parse(topic_key).partition_index
        self.metadata: dict[str, str] = {}       # the SUBSCRIBE's metadata (Pulsar's consumer stats)
        # ACTIVE_CONSUMER_CHANGE waits for the SUBSCRIBE's SUCCESS (as Pulsar's order: the Go
        # client drops a notice for a consumer it has not registered yet): the last one held
        self.subscribed = False
        self._active_held: bool | None = None

    @property
    def address(self) -> str:
        return self.connection.address

    @property
    def client_version(self) -> str:
        return self.connection.core.client_version or ""

    @property
    def writable(self) -> bool:
        """Its connection takes more output now (back-pressure; see ServerConnection.writable)."""
        return self.connection.writable

    def send_message(self, position: Position, entry: bytes, redelivery_count: int,
                     ack_set: list[int] | None = None) -> None:
        self.send_messages([(position, entry, redelivery_count, ack_set)])

    def send_messages(self, messages) -> None:
        """MESSAGE frames for (position, entry, redelivery_count, ack_set or None), in order, as
        one write to the connection (one back-pressure check for a dispatch round's entries)."""
        if self.closed:
            return
        parts = c.message_run_parts(self.consumer_id, messages, partition=self.partition)
        if parts:
            self.connection.write_parts(parts)

    def send_active_change(self, is_active: bool) -> None:
        if self.closed:
            return
        if not self.subscribed:
            self._active_held = is_active        # sent by subscribed_now(), after SUCCESS
            return
        self.connection.write(c.active_consumer_change(self.consumer_id, is_active))

    def subscribed_now(self) -> None:
        """The SUBSCRIBE's SUCCESS was written: the notice held meanwhile follows it."""
        self.subscribed = True
        held, self._active_held = self._active_held, None
        if held is not None:
            self.send_active_change(held)

    def close_by_broker(self) -> None:
        if not self.closed:
            self.closed = True
            self.connection.write(c.close_consumer(self.consumer_id, 0))
            self.connection.forget_consumer(self)


async def _ensure_initial_subscription(topic, name: str) -> None:
    """A PRODUCER's ``initial_subscription_name``, as Pulsar's handleProducer: the durable
    subscription is created at the earliest position if the topic lacks it (a dead-letter
    producer pre-creates its subscription so nothing published before a consumer is lost)."""
    problem = subscription_name_problem(name)
    if problem is not None:
        raise NotAllowedError(f"invalid initial subscription name: {problem}")
    if await topic.create_stored_subscription(name, topic.earliest_mark_delete()):
        log.info("initial subscription created topic=%s subscription=%s", topic.key, name)


class _ProducerRef:
    def __init__(self, connection: "ServerConnection", producer_id: int) -> None:
        self.connection = connection
        self.producer_id = producer_id
        self.producer = None       # topic.Producer
        self.topic = None
        self.closed = False
        self.metadata: dict[str, str] = {}       # the PRODUCER's metadata (Pulsar's publisher stats)

    @property
    def client_version(self) -> str:
        return self.connection.core.client_version or ""

    def send_receipts(self, receipts: list) -> None:
        """Receipts, ``[(sequence_id, highest_sequence_id, position), ...]``, in order (a single
        receipt is a list of one), encoded together."""
        self.connection.write(c.send_receipts(self.producer_id, [
            (sequence_id, highest_sequence_id, position[0], position[1])
            for sequence_id, highest_sequence_id, position in receipts]))

    def send_error(self, sequence_id: int, error: BaseException) -> None:
        self.connection.write(c.send_error(self.producer_id, sequence_id, server_error_of(error),
                                           str(error) or type(error).__name__))

    def close_by_broker(self) -> None:
        if not self.closed:
            self.closed = True
            self.connection.write(c.close_producer(self.producer_id, 0))
            self.connection.forget_producer(self)


_SUB_TYPES = {pb.CommandSubscribe.Exclusive: SubType.EXCLUSIVE, pb.CommandSubscribe.Shared: SubType.SHARED,
              pb.CommandSubscribe.Failover: SubType.FAILOVER, pb.CommandSubscribe.Key_Shared: SubType.KEY_SHARED}


class ConnectionAdmission:
    """Counts a broker's connections, in total and per client address, against their limits."""

    def __init__(self, connections_max: int, per_address_max: int) -> None:
        self.connections_max = connections_max
        self.per_address_max = per_address_max
        self.total = 0
        self.by_address: dict[str, int] = {}
        self.refused = CountedCause()

    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address``; the reason to refuse it (then not counted)."""
        refusal = None
        if self.total >= self.connections_max:
            refusal = f"too many connections ({self.total})"
        elif self.by_address.get(address, 0) >= self.per_address_max:
            refusal = f"too many connections from {address} ({self.by_address[address]})"
        if refusal is not None:
            if self.refused.due():
                log.warning("connection from %s refused: %s (%d refused so far)", address, refusal,
                            self.refused.count)
            return refusal
        self.total += 1
        self.by_address[address] = self.by_address.get(address, 0) + 1
        return None

    def release(self, address: str) -> None:
        self.total -= 1
        left = self.by_address.get(address, 0) - 1
        if left > 0:
            self.by_address[address] = left
        else:
            self.by_address.pop(address, None)


class ServerConnection(asyncio.Protocol):
    def __init__(self, service, *, clock=time.monotonic, admission: ConnectionAdmission | None = None) -> None:
        self.service = service
        cfg = service.config
        self.core = ConnectionCore(frame_bytes_max=cfg.frame_bytes_max, message_bytes_max=cfg.message_bytes_max,
                                   unsupported_commands_max=cfg.connection_unsupported_commands_max,
                                   connect_frame_bytes_max=cfg.connect_frame_bytes_max,
                                   authentication=_enabled_authentication(service))
        self._admission = admission
        self._admitted_address: str | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._frame_started_s: float | None = None
        self._acks_refused = CountedCause()
        self.transport: asyncio.Transport | None = None
        self.peer = None
        # the client's verified TLS certificate (ssl getpeercert() form), None without TLS or
        # without a verified client certificate (broker/tls.py); read by authentication
        self.peer_certificate: dict | None = None
        self._clock = clock
        self._last_received = clock()
        self._producers: dict[int, _ProducerRef] = {}
        self._producer_loading: dict[int, asyncio.Task] = {}
        self._consumers: dict[int, _ConsumerRef] = {}
        self._consumer_loading: dict[int, asyncio.Task] = {}
        self._tasks: set[asyncio.Task] = set()
        self._keepalive: asyncio.Task | None = None
        self._reading_paused = False
        self.closed = False
        # Output is coalesced: frames written while handling one data_received go out in one
        # transport write at its end; frames written from elsewhere (receipts from add
        # confirmations, deliveries) are collected until the end of the current loop turn
        # (one call_soon). One syscall per burst instead of one per frame; order is kept.
        self._out: list = []
        self._out_bytes = 0                 # bytes in _out (not yet given to the transport)
        self._flush_scheduled = False
        self._receiving = False
        # back-pressure: above the high-water mark (transport buffer + _out) dispatch to this
        # connection's consumers pauses (permits kept); below the low one it resumes
        self.writable = True
        self._transport_paused = False      # between the transport's pause_writing and resume_writing

    @property
    def address(self) -> str:
        """The client's address as Pulsar's stats show it (``/host:port``; "" before connection_made)."""
        peer = self.peer
        return f"/{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer or "")

    # -- transport events ------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        self.peer_certificate = peer_certificate_of(transport)
        cfg = self.service.config
        if self._admission is not None:
            address = self.peer[0] if isinstance(self.peer, tuple) else str(self.peer)
            refusal = self._admission.admit(address)
            if refusal is not None:           # logged by the admission, at a bounded rate
                self.closed = True
                transport.abort()
                return
            self._admitted_address = address
        try:
            high = cfg.dispatch.connection_write_high_water_bytes
            transport.set_write_buffer_limits(high=high, low=high // 2)
        except (AttributeError, NotImplementedError):
            pass
        self._keepalive = asyncio.ensure_future(self._keepalive_loop())
        self.core.peer_certificate = self.peer_certificate
        if _enabled_authentication(self.service) is not None:
            self._spawn(self._credentials_loop())
        self._deadline = asyncio.get_running_loop().call_later(cfg.connect_timeout_ms / 1000,
                                                               self._on_connect_deadline)

    def _on_connect_deadline(self) -> None:
        self._deadline = None
        if not self.closed and self.core.state is ConnState.AWAITING_CONNECT:
            log.info("closing %s: no CONNECT within %d ms", self.peer, self.service.config.connect_timeout_ms)
            self.close(abort=True)

    def _watch_partial_frame(self) -> None:
        """A frame started must be complete within frame_complete_timeout_ms: a peer that
        trickles bytes holds a buffer (up to a frame) and a connection forever otherwise."""
        if self.core.buffered_bytes == 0:
            self._frame_started_s = None
            return
        if self._frame_started_s is not None:
            return
        self._frame_started_s = started = self._clock()
        timeout_s = self.service.config.frame_complete_timeout_ms / 1000
        asyncio.get_running_loop().call_later(timeout_s, self._on_frame_deadline, started)

    def _on_frame_deadline(self, started: float) -> None:
        if not self.closed and self._frame_started_s == started:
            log.info("closing %s: a frame of which %d bytes arrived was not complete within %d ms", self.peer,
                     self.core.buffered_bytes, self.service.config.frame_complete_timeout_ms)
            self.close(abort=True)

    def data_received(self, data: bytes) -> None:
        self._last_received = self._clock()
        self._receiving = True
        result = None
        try:
            result = self.core.receive(data)
            for out in result.out:
                self.write(out)
            if result.authenticate is not None:
                self._spawn(self._authenticate_off_loop(result.authenticate))
            frames = result.frames
            count = len(frames)
            i = 0
            while i < count:
                if self.closed:
                    break
                frame = frames[i]
                if frame.command.type == _SEND:
                    end = self._send_run_end(frames, i)
                    self._on_sends(frames, i, end)
                    i = end
                    continue
                self._handle_guarded(frame)
                i += 1
        finally:
            self._receiving = False
            self._flush()
        if result is not None and result.close:
            self.close()
        elif self._frame_started_s is not None or self.core.buffered_bytes:
            self._watch_partial_frame()

    def connection_lost(self, exc) -> None:
        self._cleanup()

    def _handle_guarded(self, frame: Frame) -> None:
        try:
            self._handle(frame)
        except Exception as e:   # a bug handling one command: tell the client, keep the broker
            log.exception("error handling %s from %s", T.Type.Name(frame.type), self.peer)
            self.write(c.error(_request_id_of(frame.command) or 0, pb.UnknownError, str(e)))

    # -- back-pressure (Pulsar: channel writability) ---------------------------------------------
    def _buffered_bytes(self) -> int:
        transport = self.transport
        try:
            in_transport = transport.get_write_buffer_size() if transport is not None else 0
        except (AttributeError, NotImplementedError):
            in_transport = 0
        return in_transport + self._out_bytes

    def _check_write_pressure(self) -> None:
        """After output grew: close past the hard bound (a client that never reads: dispatch to
        it paused long before, so only such a client gets there), else re-evaluate writability."""
        cfg = self.service.config
        buffered = self._buffered_bytes()
        if buffered > cfg.connection_write_buffer_bytes_max:
            log.warning("closing connection peer=%s: write buffer %d bytes above connection_write_buffer_bytes_max=%d "
                        "(client not reading)", self.peer, buffered, cfg.connection_write_buffer_bytes_max)
            self.close(abort=True)
            return
        self._update_writable()

    def _update_writable(self) -> None:
        """Writable unless the transport said its buffer passed the high-water mark (until it
        says it fell below the low one: the transport's own hysteresis) or the transport buffer
        plus the frames not yet flushed are above the high-water mark. Every unwritable state has
        a way out: the transport's resume_writing, or the flush already scheduled for ``_out``
        (both call this again)."""
        if self.closed:
            return
        writable = not self._transport_paused and \
            self._buffered_bytes() <= self.service.config.dispatch.connection_write_high_water_bytes
        if writable != self.writable:
            self._set_writable(writable)

    def _set_writable(self, writable: bool) -> None:
        self.writable = writable
        log.debug("dispatch %s peer=%s buffered_bytes=%d", "resumed" if writable else "paused",
                  self.peer, self._buffered_bytes())
        for ref in list(self._consumers.values()):
            sub = ref.subscription
            if sub is not None and hasattr(sub, "set_writable"):
                sub.set_writable(ref, writable)

    def pause_writing(self) -> None:
        # asyncio: the transport's buffer passed the high-water mark
        self._transport_paused = True
        self._check_write_pressure()

    def resume_writing(self) -> None:
        # asyncio: the transport's buffer fell below the low-water mark
        self._transport_paused = False
        self._update_writable()

    # -- output ----------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self._out.append(data)
            self._out_bytes += len(data)
            if not self._receiving and not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)
            self._check_write_pressure()

    def write_parts(self, parts) -> None:
        if not self.closed and self.transport is not None:
            parts = list(parts)
            self._out.extend(parts)
            self._out_bytes += sum(map(len, parts))
            if not self._receiving and not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)
            self._check_write_pressure()

    def _flush(self) -> None:
        """Write what was collected, in order, in one transport call."""
        self._flush_scheduled = False
        out = self._out
        if not out:
            return
        self._out = []
        self._out_bytes = 0
        if self.closed or self.transport is None:
            return
        if len(out) == 1:
            self.transport.write(out[0])
        else:
            self.transport.writelines(out)
        self._update_writable()    # the transport may have taken it all (no resume_writing follows)

    def pause_reading(self) -> None:
        if not self._reading_paused and not self.closed and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and not self.closed and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def close(self, *, abort: bool = False) -> None:
        if self.closed:
            return
        if self.transport is not None:
            if abort:
                self._out = []
                self.transport.abort()
            else:
                self._flush()            # e.g. the ERROR that explains the close
                self.transport.close()
        self._cleanup()

    def _cleanup(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._admitted_address is not None:
            self._admission.release(self._admitted_address)
            self._admitted_address = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.service.publish_buffer.forget(self)
        if self._keepalive is not None:
            self._keepalive.cancel()
        for task in list(self._tasks):
            task.cancel()
        for ref in list(self._producers.values()):
            self.forget_producer(ref)
        for ref in list(self._consumers.values()):
            self.forget_consumer(ref)

    async def _keepalive_loop(self) -> None:
        interval = self.service.config.keepalive_interval_ms / 1000
        while not self.closed:
            await asyncio.sleep(interval)
            idle = self._clock() - self._last_received
            if idle >= 2 * interval:
                log.info("closing %s: silent for %.0fs", self.peer, idle)
                self.close()
                return
            if idle >= interval and self.core.state is ConnState.CONNECTED:
                self.write(c.ping())

    async def _authenticate_off_loop(self, auth: AuthenticationData) -> None:
        """[security] a slow credential check (bcrypt) in a worker thread: the loop serves others."""
        identity, error = None, None
        try:
            identity = await asyncio.to_thread(self.service.authentication.identify, auth)
        except AuthenticationError as e:
            error = e
        if self.closed:
            return
        result = self.core.complete_authentication(auth, identity, error)
        for out in result.out:
            self.write(out)
        if result.close:
            self.close()

    async def _credentials_loop(self) -> None:
        """[security] every authentication_refresh_check_interval_ms: expired credentials get
        AUTH_CHALLENGE, an unanswered one closes the connection (ConnectionCore.check_credentials)."""
        interval_s = self.service.config.authentication_refresh_check_interval_ms / 1000
        while not self.closed:
            await asyncio.sleep(interval_s)
            result = self.core.check_credentials(time.time())
            for out in result.out:
                self.write(out)
            if result.close:
                self.close()
                return

    @property
    def _authorization_enabled(self) -> bool:
        authorization = getattr(self.service, "authorization", None)
        return authorization is not None and authorization.enabled

    async def _authorize(self, topic: str, operation: TopicOperation) -> None:
        """[security] AuthorizationError unless this connection's role may do ``operation``."""
        if self._authorization_enabled:
            await self.service.authorize_topic(self.core.role, topic, operation)

    @property
    def role(self) -> str | None:
        """The role this connection proved (None with authentication off)."""
        return self.core.role

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("connection task failed (%s): %r", self.peer, task.exception())

    # -- producers and consumers of this connection ----------------------------------------------
    def forget_producer(self, ref: _ProducerRef) -> None:
        ref.closed = True
        if self._producers.get(ref.producer_id) is ref:
            del self._producers[ref.producer_id]
        if ref.topic is not None and ref.producer is not None:
            ref.topic.remove_producer(ref.producer)

    def forget_consumer(self, ref: _ConsumerRef) -> None:
        ref.closed = True
        if self._consumers.get(ref.consumer_id) is ref:
            del self._consumers[ref.consumer_id]
        if ref.subscription is not None:
            ref.subscription.remove_consumer(ref)

    # -- commands --------------------------------------------------------------------------------
    def _handle(self, frame: Frame) -> None:
        cmd = frame.command
        kind = cmd.type
        if kind == _SEND:
            self._on_sends([frame], 0, 1)
        elif kind == T.FLOW:
            ref = self._consumers.get(cmd.flow.consumer_id)
            if ref is not None and ref.subscription is not None:
                ref.subscription.flow(ref, cmd.flow.messagePermits)
        elif kind == T.ACK:
            self._on_ack(cmd.ack)
        elif kind == T.REDELIVER_UNACKNOWLEDGED_MESSAGES:
            body = cmd.redeliverUnacknowledgedMessages
            ref = self._consumers.get(body.consumer_id)
            if ref is not None and ref.subscription is not None:
                ref.subscription.redeliver(ref, list(body.message_ids) or None)
        elif kind == T.LOOKUP:
            self._spawn(self._on_lookup(cmd.lookupTopic))
        elif kind == T.PARTITIONED_METADATA:
            self._spawn(self._on_partitioned_metadata(cmd.partitionMetadata))
        elif kind == T.PRODUCER:
            self._spawn(self._on_producer(cmd.producer))
        elif kind == T.CLOSE_PRODUCER:
            self._spawn(self._on_close_producer(cmd.close_producer))
        elif kind == T.SUBSCRIBE:
            self._spawn(self._on_subscribe(cmd.subscribe))
        elif kind == T.CLOSE_CONSUMER:
            self._spawn(self._on_close_consumer(cmd.close_consumer))
        elif kind == T.UNSUBSCRIBE:
            self._spawn(self._on_unsubscribe(cmd.unsubscribe))
        elif kind == T.GET_LAST_MESSAGE_ID:
            self._spawn(self._on_get_last_message_id(cmd.getLastMessageId))
        elif kind == T.GET_SCHEMA:
            self._spawn(self._on_get_schema(cmd.getSchema))
        elif kind == T.GET_OR_CREATE_SCHEMA:
            self._spawn(self._on_get_or_create_schema(cmd.getOrCreateSchema))
        elif kind == T.GET_TOPICS_OF_NAMESPACE:
            self._spawn(self._on_topics_of_namespace(cmd.getTopicsOfNamespace))
        elif kind == T.SEEK:
            self._spawn(self._on_seek(cmd.seek))
        elif kind == T.CONSUMER_STATS:
            body = cmd.consumerStats
            self.write(c.consumer_stats_response(body.request_id, error=pb.NotAllowedError,
                                                 error_message="consumer stats are not supported yet"))

    # SEND ----------------------------------------------------------------------------------------
    @staticmethod
    def _send_run_end(frames: list, start: int) -> int:
        """The end of the run of SEND frames from ``start`` (a SEND): consecutive SENDs of one
        producer."""
        producer_id = frames[start].command.send.producer_id
        end = start + 1
        count = len(frames)
        while end < count:
            command = frames[end].command
            if command.type != _SEND or command.send.producer_id != producer_id:
                break
            end += 1
        return end

    def _on_sends(self, frames: list, start: int, end: int) -> None:
        """SENDs ``frames[start:end]`` of one producer (the one SEND path: a single SEND is a
        run of one): those with a checksum that matched go to the topic together
        (PersistentTopic.publish, answered in order once stored); a checksum mismatch, an
        unknown producer or an entry the topic refuses at the edge is answered with SEND_ERROR
        at once."""
        ref = self._producers.get(frames[start].command.send.producer_id)
        if ref is not None and ref.producer is None:
            ref = None
        sends: list = []
        for frame in frames[start:end]:
            send = frame.command.send
            if not frame.checksum_ok:
                self._publish(ref, sends)
                sends = []
                self.write(c.send_error(send.producer_id, send.sequence_id, pb.ChecksumError,
                                        "checksum mismatch"))
            elif ref is None:
                self.write(c.send_error(send.producer_id, send.sequence_id, pb.NotAllowedError,
                                        f"no producer {send.producer_id} on this connection"))
            else:
                sequence_id = send.sequence_id
                highest = send.highest_sequence_id      # 0 when unset: then the sequence id
                sends.append((sequence_id, highest if highest > sequence_id else sequence_id, frame.entry))
        self._publish(ref, sends)

    def _publish(self, ref: "_ProducerRef | None", sends: list) -> None:
        if not sends or ref is None or self.closed:
            return
        producer_id = ref.producer_id
        try:
            refused = ref.topic.publish(ref.producer, sends)
        except Exception as e:    # a bug handling the SENDs: tell the client, keep the broker
            log.exception("error handling %d SENDs from %s", len(sends), self.peer)
            for _ in sends:
                self.write(c.error(0, pb.UnknownError, str(e)))
            return
        for sequence_id, error in refused:
            self.write(c.send_error(producer_id, sequence_id, server_error_of(error), f"bad entry: {error}"))

    # ACK -----------------------------------------------------------------------------------------
    def _on_ack(self, ack: pb.CommandAck) -> None:
        ref = self._consumers.get(ack.consumer_id)
        error = None
        if ref is None or ref.subscription is None:
            error = (pb.ConsumerNotFound, f"no consumer {ack.consumer_id}")
        else:
            try:
                ref.subscription.ack(ref, list(ack.message_id),
                                     cumulative=ack.ack_type == pb.CommandAck.Cumulative)
            except CumulativeAckNotAllowedError as e:
                if self._acks_refused.due():
                    log.info("ack refused from %s: %s (%d refused on this connection)", self.peer, e,
                             self._acks_refused.count)
                error = (pb.NotAllowedError, str(e))
        if ack.HasField("request_id"):
            if error is None:
                self.write(c.ack_response(ack.consumer_id, ack.request_id))
            else:
                self.write(c.ack_response(ack.consumer_id, ack.request_id, error=error[0], message=error[1]))

    # discovery -----------------------------------------------------------------------------------
    async def _on_lookup(self, body: pb.CommandLookupTopic) -> None:
        try:
            await self._authorize(body.topic, TopicOperation.LOOKUP)
            url, ours, authoritative, url_tls = await self.service.lookup(
                body.topic, authoritative=body.authoritative, listener_name=body.advertised_listener_name)
        except Exception as e:
            self.write(c.lookup_failed(body.request_id, server_error_of(e), str(e)))
            return
        self.write(c.lookup_response(body.request_id, url, broker_service_url_tls=url_tls or None, redirect=not ours,
                                     authoritative=authoritative or ours, proxy_through_service_url=False))

    async def _on_partitioned_metadata(self, body) -> None:
        try:
            await self._authorize(body.topic, TopicOperation.LOOKUP)
            n = await self.service.partitions_or_create(body.topic)     # may auto-create a partitioned topic
        except Exception as e:
            self.write(c.partitioned_metadata_failed(body.request_id, server_error_of(e), str(e)))
            return
        self.write(c.partitioned_metadata_response(body.request_id, n))

    async def _on_topics_of_namespace(self, body) -> None:
        try:
            if self._authorization_enabled:
                await self.service.authorize_namespace_topics(self.core.role, body.namespace)
            mode = pb.CommandGetTopicsOfNamespace.Mode.Name(body.mode) if body.HasField("mode") else "PERSISTENT"
            topics = await self.service.topics_of_namespace(body.namespace, mode)
        except Exception as e:
            self.write(c.error(body.request_id, server_error_of(e), str(e)))
            return
        self.write(c.get_topics_of_namespace_response(body.request_id, topics))

    # producers -----------------------------------------------------------------------------------
    async def _on_producer(self, body: pb.CommandProducer) -> None:
        existing = self._producers.get(body.producer_id)
        if existing is not None and existing.producer is not None:      # a retry: same answer
            self.write(c.producer_success(
                body.request_id, existing.producer.name,
                last_sequence_id=existing.topic.last_sequence_id(existing.producer.name)))
            return
        loading = self._producer_loading.get(body.producer_id)
        if loading is not None:
            await asyncio.shield(loading)
            ref = self._producers.get(body.producer_id)
            if ref is not None and ref.producer is not None:
                self.write(c.producer_success(body.request_id, ref.producer.name,
                                              last_sequence_id=ref.topic.last_sequence_id(ref.producer.name)))
            else:
                self.write(c.error(body.request_id, pb.ServiceNotReady, "producer creation failed"))
            return
        task = asyncio.current_task()
        self._producer_loading[body.producer_id] = task
        try:
            await self._authorize(body.topic, TopicOperation.PRODUCE)
            topic = await self.service.get_topic(body.topic)
            refusal = await self.service.retention.producer_refusal(topic)
            if refusal is not None:                  # backlog quota exceeded: hold or refuse
                raise refusal
            schema_version = None
            if body.HasField("schema"):
                schema_version = encode_version(await self.service.schemas.add(topic.name, body.schema))
            if body.HasField("initial_subscription_name"):
                await _ensure_initial_subscription(topic, body.initial_subscription_name)
            if self.closed:
                return
            # a name the client sends is kept, user-chosen or not: on reconnect the official client
            # sends the name a broker assigned it earlier, and deduplication is keyed by it
            named = body.HasField("producer_name") and body.producer_name
            name = body.producer_name if named else self.service.next_producer_name()
            try:
                mode = AccessMode(body.producer_access_mode)
            except ValueError:
                mode = AccessMode.SHARED
            await topic.refresh_dedup()         # deduplicationEnabled of the namespace
            if mode is AccessMode.WAIT_FOR_EXCLUSIVE and not topic.exclusive_available():
                # told at once that it waits (producer_ready=false), then again once it has access
                self.write(c.producer_success(body.request_id, name, last_sequence_id=-1,
                                              schema_version=schema_version, producer_ready=False))
                await topic.wait_exclusive()
                if self.closed:
                    return
            ref = _ProducerRef(self, body.producer_id)
            ref.metadata = {kv.key: kv.value for kv in body.metadata}
            ref.topic = topic
            ref.producer = topic.add_producer(ref, name, self, access_mode=mode)
            self._producers[body.producer_id] = ref
            last_sequence_id = topic.start_producer_session(ref.producer, body.epoch)
            self.write(c.producer_success(body.request_id, name, last_sequence_id=last_sequence_id,
                                          schema_version=schema_version))
            log.info("producer created topic=%s producer=%s producer_id=%d last_sequence_id=%d",
                     topic.key, name, body.producer_id, last_sequence_id)
        except Exception as e:
            log.info("producer on %r refused: %r", body.topic, e)
            self.write(c.error(body.request_id, server_error_of(e), str(e) or type(e).__name__))
        finally:
            if self._producer_loading.get(body.producer_id) is task:
                del self._producer_loading[body.producer_id]

    async def _on_close_producer(self, body) -> None:
        ref = self._producers.get(body.producer_id)
        if ref is not None:
            self.forget_producer(ref)
        loading = self._producer_loading.get(body.producer_id)
        if loading is not None and loading is not asyncio.current_task():
            loading.cancel()           # e.g. still waiting for exclusive access: give up the wait
        self.write(c.success(body.request_id))

    # consumers -----------------------------------------------------------------------------------
    async def _on_subscribe(self, body: pb.CommandSubscribe) -> None:
        existing = self._consumers.get(body.consumer_id)
        if existing is not None and existing.subscription is not None:
            self.write(c.success(body.request_id))
            return
        loading = self._consumer_loading.get(body.consumer_id)
        if loading is not None:
            await asyncio.shield(loading)
            ref = self._consumers.get(body.consumer_id)
            if ref is not None and ref.subscription is not None:
                self.write(c.success(body.request_id))
            else:
                self.write(c.error(body.request_id, pb.ServiceNotReady, "subscribe failed"))
            return
        task = asyncio.current_task()
        self._consumer_loading[body.consumer_id] = task
        try:
            problem = subscription_name_problem(body.subscription)
            if problem is not None:            # the admin API could never delete it
                raise NotAllowedError(f"invalid subscription name: {problem}")
            sub_type = _SUB_TYPES.get(body.subType)
            if sub_type is None:
                raise NotAllowedError(f"subscription type {pb.CommandSubscribe.SubType.Name(body.subType)} "
                                      f"is not supported yet")
            await self._authorize(body.topic, TopicOperation.CONSUME)
            topic = await self.service.get_topic(body.topic, create=body.force_topic_creation)
            if body.HasField("schema"):
                await self.service.schemas.add(topic.name, body.schema)
            if self.closed:
                return
            ref = _ConsumerRef(self, body.consumer_id, topic.key)
            ref.consumer_name = body.consumer_name
            ref.metadata = {kv.key: kv.value for kv in body.metadata}
            start = body.start_message_id if body.HasField("start_message_id") else None
            key_mode, hash_ranges, out_of_order = KeySharedMode.AUTO_SPLIT, None, False
            if body.HasField("keySharedMeta"):
                meta = body.keySharedMeta
                out_of_order = meta.allowOutOfOrderDelivery
                if meta.keySharedMode == pb.STICKY:
                    key_mode = KeySharedMode.STICKY
                    hash_ranges = [(r.start, r.end) for r in meta.hashRanges]
            ref.subscription = await topic.subscribe(
                ref, body.subscription, sub_type, durable=body.durable,
                initial_earliest=body.initialPosition == pb.CommandSubscribe.Earliest,
                start_message_id=start, priority=body.priority_level, consumer_name=body.consumer_name,
                key_shared_mode=key_mode, hash_ranges=hash_ranges, allow_out_of_order=out_of_order,
                read_compacted=body.read_compacted)
            if self.closed:
                ref.subscription.remove_consumer(ref)
                return
            self._consumers[body.consumer_id] = ref
            self.write(c.success(body.request_id))
            ref.subscribed_now()
        except ConsumerBusyError as e:
            self.write(c.error(body.request_id, pb.ConsumerBusy, str(e)))
        except Exception as e:
            log.info("subscribe to %r refused: %r", body.topic, e)
            self.write(c.error(body.request_id, server_error_of(e), str(e) or type(e).__name__))
        finally:
            if self._consumer_loading.get(body.consumer_id) is task:
                del self._consumer_loading[body.consumer_id]

    async def _on_close_consumer(self, body) -> None:
        ref = self._consumers.get(body.consumer_id)
        if ref is not None:
            self.forget_consumer(ref)
        self.write(c.success(body.request_id))

    async def _on_unsubscribe(self, body) -> None:
        ref = self._consumers.get(body.consumer_id)
        if ref is None or ref.subscription is None:
            self.write(c.error(body.request_id, pb.ConsumerNotFound, f"no consumer {body.consumer_id}"))
            return
        sub = ref.subscription
        others = [h for h in sub.consumers.values() if h is not ref]
        if others and not body.force:
            self.write(c.error(body.request_id, pb.ConsumerBusy, "subscription has other consumers"))
            return
        for other in others:
            other.close_by_broker()
        self.forget_consumer(ref)
        try:
            await sub.topic.remove_subscription(sub, delete_cursor=True)
        except Exception as e:
            self.write(c.error(body.request_id, server_error_of(e), str(e)))
            return
        self.write(c.success(body.request_id))

    async def _on_seek(self, body) -> None:
        """SEEK: CLOSE_CONSUMER to the subscription's consumers first, then SUCCESS (what the
        official client expects); they reconnect and receive from the seek position."""
        ref = self._consumers.get(body.consumer_id)
        if ref is None or ref.subscription is None:
            self.write(c.error(body.request_id, pb.ConsumerNotFound, f"no consumer {body.consumer_id}"))
            return
        if not body.HasField("message_id") and not body.HasField("message_publish_time"):
            self.write(c.error(body.request_id, pb.NotAllowedError, "seek needs a message id or a publish time"))
            return
        try:
            if body.HasField("message_publish_time"):
                await ref.subscription.seek(publish_time_ms=body.message_publish_time)
            else:
                await ref.subscription.seek(message_id=body.message_id)
        except Exception as e:
            log.info("seek on %s refused: %r", ref.topic_key, e)
            self.write(c.error(body.request_id, server_error_of(e), str(e) or type(e).__name__))
            return
        self.write(c.success(body.request_id))

    async def _on_get_last_message_id(self, body) -> None:
        ref = self._consumers.get(body.consumer_id)
        if ref is None or ref.subscription is None:
            self.write(c.error(body.request_id, pb.ConsumerNotFound, f"no consumer {body.consumer_id}"))
            return
        try:
            ledger, entry, batch_index = await ref.subscription.last_message_id()
        except Exception as e:
            self.write(c.error(body.request_id, server_error_of(e), str(e)))
            return
        md = ref.subscription.cursor.mark_delete_position
        self.write(c.get_last_message_id_response(body.request_id, ledger, entry, batch_index=batch_index,
                                                  mark_delete=(md.ledger_id, md.entry_id)))

    # schemas -------------------------------------------------------------------------------------
    async def _on_get_schema(self, body) -> None:
        try:
            version = decode_version(body.schema_version) if body.HasField("schema_version") else None
            await self._authorize(body.topic, TopicOperation.LOOKUP)
            got = await self.service.schemas.get(TopicName.parse(body.topic), version)
        except Exception as e:
            self.write(c.get_schema_response(body.request_id, error=server_error_of(e), error_message=str(e)))
            return
        if got is None:
            self.write(c.get_schema_response(body.request_id, error=pb.TopicNotFound,
                                             error_message="topic not found or has no schema"))
            return
        schema, v = got
        self.write(c.get_schema_response(body.request_id, schema=schema, schema_version=encode_version(v)))

    async def _on_get_or_create_schema(self, body) -> None:
        try:
            await self._authorize(body.topic, TopicOperation.PRODUCE)
            v = await self.service.schemas.add(TopicName.parse(body.topic), body.schema)
        except Exception as e:
            self.write(c.get_or_create_schema_response(body.request_id, error=server_error_of(e),
                                                       error_message=str(e)))
            return
        self.write(c.get_or_create_schema_response(body.request_id, schema_version=encode_version(v)))


__all__ = ["ConnState", "ConnectionCore", "CoreOutput", "ServerConnection"]
