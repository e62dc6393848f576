"""The bookie server: a thin asyncio shell over bookie.storage.BookieStore.

Protocol: length-prefixed protobuf frames over TCP (proto/bookie_rpc.proto; codec in
bookie/transport.py). ``BookieService`` maps each request to the store and builds its answer;
``BookieServer`` runs the connections. Requests on one connection are processed concurrently
(adds arriving together share group commits), at most ``CONNECTION_REQUESTS_IN_FLIGHT_MAX`` at
once per connection; beyond it, and while the connection's write buffer is full, the server
stops reading it (back-pressure through TCP). An add is handed to the store from
``data_received`` itself and answered from the journal's commit callback (``BookieService.add``:
no task, coroutine or future per request; without room in the journal queue it waits in the
store); every other request runs as a task. Every request gets exactly one response frame
with its request id; responses produced in one loop iteration leave in one write. Bad
requests get a status code and change nothing; bad framing gets an ErrorResponse and the
connection is closed; the bookie keeps serving the others.

Connection budgets ([hardening], BookieConfig): at most ``connections_max`` connections (one
more gets an ErrorResponse(UNAVAILABLE) and is closed); a frame is at most ``request_bytes_max``
and, once started, must be whole within ``frame_complete_timeout_ms`` (the time the bookie
itself stops reading the connection does not count); a connection that has not sent one valid
request within ``connection_first_request_timeout_ms`` of opening is closed; a peer that leaves
``WRITE_BUFFER_HIGH_BYTES`` of answers unread for ``connection_write_stall_timeout_ms`` is
closed. A connection that did send a valid request is never closed for being idle: the ledger
client (bookie/client/bookie_client.py) keeps its connection to a bookie open and silent for
as long as its broker has nothing to write, sends no keepalives, and would see an idle close
racing its next add as a failed bookie (an ensemble change). Closing a connection loses no
acknowledged add: acks leave only after the fsync, and requests in progress still complete
in the store; only their answers are dropped, and the client retries. Closes and refusals are
logged at a bounded rate per cause (CountedCause).

Authentication (``bookie_auth_enabled``; protocol in proto/bookie_rpc.proto, trust model in
docs/security.md): the first frame of a connection must be an AuthRequest whose token verifies
(pulsarlite/security/tokens.py, the broker's verification) and names a role in
``bookie_auth_roles``. It is answered AuthResponse(OK); a refused AuthRequest is answered
AuthResponse(AUTHENTICATION_ERROR), any other first frame ErrorResponse(AUTHENTICATION_ERROR),
naming the reason (never the token), and the connection is closed as after a bad frame: nothing
it sent is served. Verification happens once per connection, in ``data_received`` (a JWT check
is tens of microseconds); afterwards the connection's frames take the path they always took.
With authentication off an AuthRequest is answered OK and clients that send none are served.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import operator
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.storage import BookieStore, Status, StoredEntry
from bookie.tls import server_context
from bookie.transport import (REQUEST_TYPES, FrameDecoder, FrameError, encode_add_response,
                              encode_error, encode_header, parse_body)
from pulsarlite.config import BookieConfig
from pulsarlite.counted_log import CountedCause
from pulsarlite.errors import ChecksumError, PulsarliteError, check
from pulsarlite.security.tokens import TokenInvalid, TokenVerifier

log = logging.getLogger("pulsarlite.bookie.server")

# Requests of one connection processed at once; beyond this the connection stops being read.
CONNECTION_REQUESTS_IN_FLIGHT_MAX = 64
# Pause reading a connection while this many response bytes wait in its write buffer.
WRITE_BUFFER_HIGH_BYTES = 4 * 1024 * 1024
WRITE_BUFFER_LOW_BYTES = 1024 * 1024
# After refusing a connection's bad frame: how long it may keep sending (discarded) before closing.
REFUSED_LINGER_S = 1.0
# causes of closing (or refusing) a connection, logged at a bounded rate each
CLOSE_TOO_MANY = "too many connections"
CLOSE_NO_REQUEST = "no request"
CLOSE_SLOW_FRAME = "frame not whole in time"
CLOSE_WRITE_STALL = "answers not read"
CLOSE_BAD_FRAME = "bad frame"
CLOSE_AUTH = "authentication failed"
REFUSED_READ_ONLY = "read-only role"


# pb.Entry -> StoredEntry without Python bytecode per field (the add path's largest per-entry cost)
_entry_fields = operator.attrgetter("ledger_id", "entry_id", "lac", "length", "payload", "checksum")
_new_stored_entry = functools.partial(tuple.__new__, StoredEntry)


def entry_from_pb(e: pb.Entry) -> StoredEntry:
    return StoredEntry(e.ledger_id, e.entry_id, e.lac, e.length, e.payload, e.checksum)


def entry_to_pb(e: StoredEntry) -> pb.Entry:
    return pb.Entry(ledger_id=e.ledger_id, entry_id=e.entry_id, lac=e.lac, length=e.length,
                    payload=e.payload, checksum=e.checksum)


class BookieService:
    """Requests to the store, answers back: ``add`` without a coroutine (answered from the
    store's commit callback), one coroutine per other request kind."""

    def __init__(self, store: BookieStore, config: BookieConfig) -> None:
        self._store = store
        self._config = config
        self.closing = False
        self.metrics = None          # a bookie.metrics.BookieMetrics, or None (no metrics)
        # refused adds, per status: a client can repeat them at will, so they are logged at a
        # bounded rate (the 1st, 2nd, 4th, ... request with a refusal of that status)
        self._adds_refused: dict[Status, CountedCause] = {}

    # -- adds (no task, coroutine or future per request) ------------------------------------
    def add(self, request_id: int, request: pb.AddRequest, answer: Callable[[int, bytes], None]) -> None:
        """Take an AddRequest: its entries go to the store (``submit_adds``) now, or wait there
        for room in the journal queue or write cache, in arrival order;
        ``answer(request_id, AddResponse body)`` runs exactly once: after their journal group
        is fsynced, or, when every entry was refused, the store failed or the bookie is
        closing, with the refusals."""
        stored = list(map(_new_stored_entry, map(_entry_fields, request.entries)))
        if self.closing:
            answer(request_id, encode_add_response(request_id, stored, [Status.UNAVAILABLE] * len(stored)))
            return

        def done(result) -> None:
            if isinstance(result, BaseException):
                answer(request_id, self._add_failed(request_id, stored, result))
            else:
                answer(request_id, self.add_answer(request_id, stored, result))

        try:
            self._store.submit_adds(stored, request.recovery, done)
        except Exception as e:  # noqa: BLE001 - the store failed (or a bug): refuse, keep serving
            if not isinstance(e, PulsarliteError):
                log.exception("add failed bookie=%s", self._config.effective_bookie_id)
            answer(request_id, self._add_failed(request_id, stored, e))

    def add_answer(self, request_id: int, stored: list[StoredEntry], statuses: list[Status]) -> bytes:
        """The AddResponse body for these entries' statuses (refusals logged)."""
        if self.metrics is not None:
            ok = statuses.count(Status.OK)
            self.metrics.entries_added(ok, len(statuses) - ok)
        if any(statuses):
            self.log_refused(stored, statuses)
        return encode_add_response(request_id, stored, statuses)

    def log_refused(self, stored: Sequence[StoredEntry], statuses: Sequence[Status]) -> None:
        """Log a request's refused adds, at a bounded rate per status (CountedCause)."""
        bad = [(e.ledger_id, e.entry_id, Status(s)) for e, s in zip(stored, statuses) if s != Status.OK]
        if not bad:
            return
        status = bad[0][2]
        counted = self._adds_refused.get(status)
        if counted is None:
            counted = self._adds_refused[status] = CountedCause()
        if counted.due():
            log.info("adds refused bookie=%s status=%s count=%d first=(ledger=%d, entry=%d) "
                     "(requests with %s refusals so far: %d)", self._config.effective_bookie_id,
                     status.name, len(bad), bad[0][0], bad[0][1], status.name, counted.count)

    def _add_failed(self, request_id: int, stored: list[StoredEntry], error: BaseException) -> bytes:
        if isinstance(error, PulsarliteError):   # the store failed (journal I/O error, closed)
            log.error("add refused, store unavailable bookie=%s: %s", self._config.effective_bookie_id, error)
            status = Status.UNAVAILABLE
        else:
            log.error("add failed bookie=%s: %r", self._config.effective_bookie_id, error)
            status = Status.INTERNAL
        if self.metrics is not None:
            self.metrics.entries_added(0, len(stored))
        return encode_add_response(request_id, stored, [status] * len(stored))

    # -- reads ---------------------------------------------------------------------------
    async def read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        response = await self._read(request)
        if self.metrics is not None:
            self.metrics.read_answered(response.code == pb.OK)
        return response

    async def _read(self, request: pb.ReadRequest) -> pb.ReadResponse:
        ledger_id = request.ledger_id
        first, last = request.first_entry_id, request.last_entry_id
        if first < 0 or last < first:
            return pb.ReadResponse(code=pb.BAD_REQUEST, lac=-1)
        if self.closing:
            return pb.ReadResponse(code=pb.UNAVAILABLE, lac=-1)
        if request.fence:
            try:
                await self._store.fence(ledger_id)
            except PulsarliteError as e:
                log.error("fence failed bookie=%s ledger=%d: %s", self._config.effective_bookie_id, ledger_id, e)
                return pb.ReadResponse(code=pb.UNAVAILABLE, lac=-1)
        max_bytes = min(request.max_bytes or self._config.read_bytes_max, self._config.read_bytes_max)
        try:
            status, entries = self._store.read(ledger_id, first, last, max_bytes)
        except ChecksumError as e:
            log.error("checksum mismatch on disk bookie=%s ledger=%d entry=%d: %s",
                      self._config.effective_bookie_id, ledger_id, first, e)
            return pb.ReadResponse(code=pb.CHECKSUM_MISMATCH, lac=-1)
        except PulsarliteError as e:
            log.error("read failed bookie=%s ledger=%d: %s", self._config.effective_bookie_id, ledger_id, e)
            return pb.ReadResponse(code=pb.UNAVAILABLE, lac=-1)
        info = self._store.ledger_info(ledger_id)
        return pb.ReadResponse(code=int(status), entries=[entry_to_pb(e) for e in entries],
                               lac=info.lac, fenced=info.fenced)

    async def read_lac(self, request: pb.ReadLacRequest) -> pb.ReadLacResponse:
        if self.closing:
            return pb.ReadLacResponse(code=pb.UNAVAILABLE, lac=-1, last_entry_id=-1)
        if request.fence:
            try:
                info = await self._store.fence(request.ledger_id)
            except PulsarliteError as e:
                log.error("fence failed bookie=%s ledger=%d: %s", self._config.effective_bookie_id,
                          request.ledger_id, e)
                return pb.ReadLacResponse(code=pb.UNAVAILABLE, lac=-1, last_entry_id=-1)
        else:
            info = self._store.ledger_info(request.ledger_id)
        code = pb.OK if info.exists else pb.NO_SUCH_LEDGER
        return pb.ReadLacResponse(code=code, lac=info.lac, last_entry_id=info.last_entry_id, fenced=info.fenced)

    async def delete_ledger(self, request: pb.DeleteLedgerRequest) -> pb.DeleteLedgerResponse:
        if self.closing:
            return pb.DeleteLedgerResponse(code=pb.UNAVAILABLE)
        try:
            status = await self._store.delete_ledger(request.ledger_id)
        except PulsarliteError as e:
            log.error("delete failed bookie=%s ledger=%d: %s", self._config.effective_bookie_id, request.ledger_id, e)
            return pb.DeleteLedgerResponse(code=pb.UNAVAILABLE)
        log.info("ledger deleted bookie=%s ledger=%d status=%s", self._config.effective_bookie_id,
                 request.ledger_id, Status(status).name)
        return pb.DeleteLedgerResponse(code=int(status))

    async def info(self, request: pb.BookieInfoRequest) -> pb.BookieInfoResponse:
        used_fraction, free_bytes, total_bytes = self._store.disk_usage()
        return pb.BookieInfoResponse(
            bookie_id=self._config.effective_bookie_id, free_bytes=free_bytes, total_bytes=total_bytes,
            read_only=self._store.read_only, ledger_count=len(self._store.ledger_ids()),
            entry_count=self._store.entry_count())


def add_response(request: pb.AddRequest, status: Status) -> pb.AddResponse:
    return pb.AddResponse(request_id=request.request_id,
                          results=[pb.AddResult(ledger_id=e.ledger_id, entry_id=e.entry_id, code=int(status))
                                   for e in request.entries])


@dataclass(frozen=True)
class BookieServerKeys:
    """What a bookie's port needs from key files: the token verifier (None: authentication off)
    and the TLS server context (None: TLS off)."""

    verifier: TokenVerifier | None
    ssl_context: ssl.SSLContext | None


def load_server_keys(config: BookieConfig, *, clock_s: Callable[[], float] = time.time) -> BookieServerKeys:
    """Reads and checks the bookie's token key and TLS files; ConfigError names the setting that is
    wrong (never its value). Done first at start, so a bad setting changes nothing."""
    verifier = None
    if config.bookie_auth_enabled:
        verifier = TokenVerifier.from_settings(
            secret_key=config.bookie_auth_token_secret_key, public_key=config.bookie_auth_token_public_key,
            public_alg=config.bookie_auth_token_public_alg, clock_s=clock_s, setting_prefix="bookie_auth_",
            server="this bookie")
    return BookieServerKeys(verifier, server_context(config.bookie_tls_certificate_file_path,
                                                     config.bookie_tls_key_file_path))


class BookieServer:
    """Listens on ``config.host:config.port`` and serves BookieService over framed TCP."""

    def __init__(self, service: BookieService, config: BookieConfig, *,
                 clock_s: Callable[[], float] = time.time, keys: "BookieServerKeys | None" = None) -> None:
        """``keys``: the key material read beforehand (:func:`load_server_keys`; the bookie's main
        reads it before it touches ZooKeeper or its disks); None: read here."""
        self.service = service
        self._config = config
        keys = keys if keys is not None else load_server_keys(config, clock_s=clock_s)
        # the token verifier, or None: authentication off
        self.verifier: TokenVerifier | None = keys.verifier
        self.roles_allowed = config.bookie_auth_role_names
        self.roles_read_only = config.bookie_auth_read_only_role_names
        # TLS on the port (bookie/tls.py), or None
        self._ssl = keys.ssl_context
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[_Connection] = set()
        # connections closed or refused, per cause: logged at a bounded rate (a client can
        # repeat any of them at will)
        self._closes_counted: dict[str, CountedCause] = {}
        # frame type -> (service method, response frame type)
        self.handlers = {
            pb.FRAME_READ_REQUEST: (service.read, pb.FRAME_READ_RESPONSE),
            pb.FRAME_READ_LAC_REQUEST: (service.read_lac, pb.FRAME_READ_LAC_RESPONSE),
            pb.FRAME_DELETE_LEDGER_REQUEST: (service.delete_ledger, pb.FRAME_DELETE_LEDGER_RESPONSE),
            pb.FRAME_BOOKIE_INFO_REQUEST: (service.info, pb.FRAME_BOOKIE_INFO_RESPONSE),
            # the first AuthRequest is taken by _Connection._authenticate; a second one is refused
            pb.FRAME_AUTH_REQUEST: (self._auth_again, pb.FRAME_AUTH_RESPONSE),
        }
        # adds are taken by BookieService.add, without a task (_Connection.data_received)
        check(set(self.handlers) | {pb.FRAME_ADD_REQUEST} == REQUEST_TYPES,
              "every request frame type needs a handler")
        # the handlers of a read-only role's connection: what writes or fences is refused
        self.read_only_handlers = dict(self.handlers)
        self.read_only_handlers.update({
            pb.FRAME_READ_REQUEST: (self._read_unless_fencing, pb.FRAME_READ_RESPONSE),
            pb.FRAME_READ_LAC_REQUEST: (self._read_lac_unless_fencing, pb.FRAME_READ_LAC_RESPONSE),
            pb.FRAME_DELETE_LEDGER_REQUEST: (self._delete_refused, pb.FRAME_DELETE_LEDGER_RESPONSE),
        })

    @property
    def bookie_id(self) -> str:
        return self._config.effective_bookie_id

    def authenticate(self, request: pb.AuthRequest) -> str:
        """The role an AuthRequest proves, allowed on this bookie; raises TokenInvalid naming the
        reason (never the token). Only with authentication on."""
        if request.method != "token":
            if not request.method and not request.data:
                raise TokenInvalid("authentication required: no credential presented")
            raise TokenInvalid(f"authentication method {request.method[:32]!r} is not enabled on this bookie "
                               f"(enabled: token)")
        role = self.verifier.role(request.data)
        if role not in self.roles_allowed:
            raise TokenInvalid(f"role {role[:64]!r} is not allowed on this bookie "
                               f"(bookie_auth_roles: {', '.join(sorted(self.roles_allowed))})")
        return role

    # -- a read-only role's connection (bookie_auth_read_only_roles) ------------------------
    def refuse_read_only(self, what: str, ledger_id: int) -> None:
        """Log (at a bounded rate) that a read-only role was refused ``what``."""
        counted = self._closes_counted.get(REFUSED_READ_ONLY)
        if counted is None:
            counted = self._closes_counted[REFUSED_READ_ONLY] = CountedCause()
        if counted.due():
            log.warning("request refused bookie=%s cause=%s: %s ledger=%d, answered NOT_AUTHORIZED (%d so far)",
                        self.bookie_id, REFUSED_READ_ONLY, what, ledger_id, counted.count)

    def add_refused(self, request_id: int, request: pb.AddRequest, answer) -> None:
        entries = request.entries
        self.refuse_read_only("add", entries[0].ledger_id if entries else -1)
        answer(request_id, encode_add_response(request_id, entries, [pb.NOT_AUTHORIZED] * len(entries)))

    async def _read_unless_fencing(self, request: pb.ReadRequest) -> pb.ReadResponse:
        if request.fence:
            self.refuse_read_only("fencing read", request.ledger_id)
            return pb.ReadResponse(code=pb.NOT_AUTHORIZED, lac=-1)
        return await self.service.read(request)

    async def _read_lac_unless_fencing(self, request: pb.ReadLacRequest) -> pb.ReadLacResponse:
        if request.fence:
            self.refuse_read_only("fencing read", request.ledger_id)
            return pb.ReadLacResponse(code=pb.NOT_AUTHORIZED, lac=-1, last_entry_id=-1)
        return await self.service.read_lac(request)

    async def _delete_refused(self, request: pb.DeleteLedgerRequest) -> pb.DeleteLedgerResponse:
        self.refuse_read_only("delete", request.ledger_id)
        return pb.DeleteLedgerResponse(code=pb.NOT_AUTHORIZED)

    async def _auth_again(self, request: pb.AuthRequest) -> pb.AuthResponse:
        return pb.AuthResponse(code=pb.BAD_REQUEST, message="one AuthRequest per connection, as its first frame")

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def log_close(self, cause: str, peer: str, detail: str) -> None:
        """Log that a connection is closed (or refused) for ``cause``, at a bounded rate."""
        counted = self._closes_counted.get(cause)
        if counted is None:
            counted = self._closes_counted[cause] = CountedCause()
        if counted.due():
            log.warning("closing a connection bookie=%s peer=%s cause=%s: %s (%d so far)",
                        self.bookie_id, peer, cause, detail, counted.count)

    def closes_of(self, cause: str) -> int:
        """How many connections were closed (or refused) for ``cause`` so far."""
        counted = self._closes_counted.get(cause)
        return counted.count if counted is not None else 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            tls = {} if self._ssl is None else {
                "ssl": self._ssl, "ssl_handshake_timeout": self._config.connection_first_request_timeout_ms / 1000}
            self._server = await loop.create_server(lambda: _Connection(self), self._config.host,
                                                    self._config.port, reuse_address=True, **tls)
        except OSError as e:
            raise PulsarliteError(f"bookie {self.bookie_id}: cannot listen on "
                                  f"{self._config.host}:{self._config.port}: {e}") from None

    async def stop(self, grace_s: float) -> None:
        """Refuse new work (UNAVAILABLE), stop listening, let requests in progress answer for
        up to ``grace_s``, then close every connection."""
        self.service.closing = True
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + grace_s
        pending = [t for c in self._connections for t in c.tasks]
        if pending:
            await asyncio.wait(pending, timeout=grace_s)
        # adds (BookieService.add, no task) answer from the store's commit callback
        while any(c.adds_in_flight for c in self._connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        for conn in list(self._connections):
            conn.close()
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), timeout=grace_s)
            except asyncio.TimeoutError:
                pass


class _Connection(asyncio.Protocol):
    """One client connection: frames in, requests to the service, response frames out."""

    def __init__(self, server: BookieServer) -> None:
        self._server = server
        self._handlers = server.handlers
        config = server._config
        self._decoder = FrameDecoder(config.request_bytes_max, REQUEST_TYPES)
        self._frame_timeout_s = config.frame_complete_timeout_ms / 1000
        # loop time the unfinished frame started (None: no frame started, or the bookie paused
        # reading: the peer cannot finish it then), and the timer that checks it
        self._frame_started_s: float | None = None
        self._frame_timer: asyncio.TimerHandle | None = None
        self._first_request_timer: asyncio.TimerHandle | None = None   # until a valid request
        self._write_stall_timer: asyncio.TimerHandle | None = None     # while writing is paused
        self._transport: asyncio.Transport | None = None
        self._peer = "?"
        self.tasks: set[asyncio.Task] = set()
        self.adds_in_flight = 0          # taken by BookieService.add, not answered yet
        self._add = server.service.add
        self._out: list[bytes] = []      # response frames waiting for the next flush
        self._flush_scheduled = False
        self._read_paused = False
        self._write_paused = False
        self._discarding = False         # a bad frame was refused: input is dropped until close
        self._peer_done = False          # the peer sent EOF: close once the last answer is out
        self._closed = False
        self._gated = True               # the first frame not taken yet (it may be an AuthRequest)
        self.role = ""                   # the role the connection proved (authentication on)

    # -- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        server = self._server
        config = server._config
        if len(server._connections) >= config.connections_max:
            server.log_close(CLOSE_TOO_MANY, self._peer, f"{len(server._connections)} connections open, "
                             f"connections_max={config.connections_max}")
            self._closed = True      # not counted; told why, then closed (nothing was read)
            transport.write(encode_error(0, pb.UNAVAILABLE, f"bookie {server.bookie_id}: too many "
                                         f"connections ({config.connections_max})"))
            transport.close()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES, low=WRITE_BUFFER_LOW_BYTES)
        server._connections.add(self)
        self._first_request_timer = asyncio.get_running_loop().call_later(
            config.connection_first_request_timeout_ms / 1000, self._on_first_request_deadline)

    def connection_lost(self, exc) -> None:
        self._closed = True
        self._out.clear()
        self._server._connections.discard(self)
        self._cancel_timers()
        # requests in progress finish (their store work is not interrupted); answers are dropped

    def _cancel_timers(self) -> None:
        for timer in (self._frame_timer, self._first_request_timer, self._write_stall_timer):
            if timer is not None:
                timer.cancel()
        self._frame_timer = self._first_request_timer = self._write_stall_timer = None
        self._frame_started_s = None

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()
        if self._write_stall_timer is None:
            self._write_stall_timer = asyncio.get_running_loop().call_later(
                self._server._config.connection_write_stall_timeout_ms / 1000, self._on_write_stall)

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._write_stall_timer is not None:
            self._write_stall_timer.cancel()
            self._write_stall_timer = None
        self._update_reading()

    # -- budgets -------------------------------------------------------------------------
    def _on_first_request_deadline(self) -> None:
        self._first_request_timer = None
        if self._closed or self._discarding:
            return
        ms = self._server._config.connection_first_request_timeout_ms
        self._server.log_close(CLOSE_NO_REQUEST, self._peer, f"no valid request within {ms} ms "
                               f"({self._decoder.buffered_bytes} bytes of a frame received)")
        self.close(abort=True)

    def _watch_frame(self, completed: bool) -> None:
        """A frame started must be whole within frame_complete_timeout_ms: a peer trickling
        bytes would hold a frame buffer (up to request_bytes_max) and a connection forever.
        ``completed``: a frame ended since the last call (what is buffered started since)."""
        if not self._decoder.buffered_bytes or self._read_paused or self._closed or self._discarding:
            self._frame_started_s = None
            return
        loop = asyncio.get_running_loop()
        if completed or self._frame_started_s is None:
            self._frame_started_s = loop.time()
        if self._frame_timer is None:
            self._frame_timer = loop.call_later(self._frame_timeout_s, self._on_frame_deadline)

    def _on_frame_deadline(self) -> None:
        self._frame_timer = None
        started = self._frame_started_s
        if started is None or self._closed or self._discarding:
            return
        loop = asyncio.get_running_loop()
        left_s = started + self._frame_timeout_s - loop.time()
        if left_s > 0:       # a newer frame started since the timer was set
            self._frame_timer = loop.call_later(left_s, self._on_frame_deadline)
            return
        self._server.log_close(CLOSE_SLOW_FRAME, self._peer, f"{self._decoder.buffered_bytes} bytes of a "
                               f"frame received, not whole within {self._frame_timeout_s * 1000:.0f} ms")
        self.close(abort=True)

    def _on_write_stall(self) -> None:
        self._write_stall_timer = None
        if not self._write_paused:
            return
        ms = self._server._config.connection_write_stall_timeout_ms
        self._server.log_close(CLOSE_WRITE_STALL, self._peer, f"answers above {WRITE_BUFFER_HIGH_BYTES} "
                               f"bytes left unread for {ms} ms")
        self.close(abort=True)

    def data_received(self, data: bytes) -> None:
        if self._closed or self._discarding:
            return
        handlers = self._handlers
        add = self._add
        completed = False
        try:
            for frame_type, request_id, body in self._decoder.feed(data):
                request = parse_body(frame_type, request_id, body)
                completed = True
                if self._gated and self._authenticate(frame_type, request_id, request):
                    if self._discarding or self._closed:
                        return       # refused: nothing after it is read
                    handlers, add = self._handlers, self._add     # a read-only role's, maybe
                    continue
                if frame_type == pb.FRAME_ADD_REQUEST:
                    self.adds_in_flight += 1
                    add(request_id, request, self._add_answered)
                    continue
                method, response_type = handlers[frame_type]
                task = asyncio.ensure_future(self._serve(method, response_type, request_id, request))
                self.tasks.add(task)
                task.add_done_callback(self._request_done)
        except FrameError as e:
            self._refuse(e)
            return
        if completed and self._first_request_timer is not None:
            self._first_request_timer.cancel()
            self._first_request_timer = None
        self._update_reading()
        if completed or self._frame_started_s is not None or self._decoder.buffered_bytes:
            self._watch_frame(completed)

    def eof_received(self):
        if self._discarding:
            self.close()
            return False
        try:
            self._decoder.close()
        except FrameError as e:
            log.warning("connection ended inside a frame bookie=%s peer=%s: %s", self._server.bookie_id,
                        self._peer, e)
        if not self.tasks and not self.adds_in_flight:
            return False  # close the transport (after what is buffered is written)
        self._peer_done = True  # half-closed: answer what is in progress, then close
        return True

    # -- authentication ------------------------------------------------------------------
    def _authenticate(self, frame_type: int, request_id: int, request) -> bool:
        """The connection's first frame: True if it was taken here (an AuthRequest, or a frame
        refused for want of one), False if it is served as any request (authentication off)."""
        server = self._server
        if server.verifier is None:                  # authentication off: served as before
            self._gated = False
            if frame_type != pb.FRAME_AUTH_REQUEST:
                return False
            self._send(pb.FRAME_AUTH_RESPONSE, request_id, pb.AuthResponse(code=pb.OK).SerializeToString())
            return True
        if frame_type != pb.FRAME_AUTH_REQUEST:
            reason = (f"authentication required: the first frame must be an AuthRequest, got "
                      f"{pb.FrameType.Name(frame_type)}")
            server.log_close(CLOSE_AUTH, self._peer, reason)
            self._close_refused(encode_error(request_id, pb.AUTHENTICATION_ERROR,
                                             f"bookie {server.bookie_id}: {reason}"))
            return True
        try:
            role = server.authenticate(request)
        except TokenInvalid as e:
            server.log_close(CLOSE_AUTH, self._peer, str(e))
            body = pb.AuthResponse(code=pb.AUTHENTICATION_ERROR, message=f"bookie {server.bookie_id}: {e}")
            self._close_refused(encode_header(pb.FRAME_AUTH_RESPONSE, request_id, body.ByteSize())
                                + body.SerializeToString())
            return True
        self._gated = False
        self.role = role
        read_only = role in server.roles_read_only
        if read_only:
            self._handlers, self._add = server.read_only_handlers, server.add_refused
        log.info("client authenticated bookie=%s peer=%s role=%s%s", server.bookie_id, self._peer, role,
                 " (read-only)" if read_only else "")
        self._send(pb.FRAME_AUTH_RESPONSE, request_id, pb.AuthResponse(code=pb.OK, role=role).SerializeToString())
        return True

    # -- requests ------------------------------------------------------------------------
    async def _serve(self, method, response_type: int, request_id: int, request) -> None:
        try:
            response = await method(request)
        except Exception as e:  # a bug or a dead store: answer INTERNAL, keep the connection
            log.exception("request failed bookie=%s answer=%s", self._server.bookie_id,
                          pb.FrameType.Name(response_type))
            self._send_raw(encode_error(request_id, pb.INTERNAL, f"internal error: {e!r}"))
            return
        self._send(response_type, request_id, response.SerializeToString())

    def _request_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if self._peer_done and not self.tasks and not self.adds_in_flight:
            self.close()
        elif self._read_paused:
            self._update_reading()

    def _add_answered(self, request_id: int, body: bytes) -> None:
        """BookieService.add's answer (once per add taken)."""
        self.adds_in_flight -= 1
        self._send(pb.FRAME_ADD_RESPONSE, request_id, body)
        if self._peer_done and not self.tasks and not self.adds_in_flight:
            self.close()
        elif self._read_paused:
            self._update_reading()

    def _update_reading(self) -> None:
        if self._closed or self._discarding:
            return
        want_paused = self._write_paused or \
            len(self.tasks) + self.adds_in_flight >= CONNECTION_REQUESTS_IN_FLIGHT_MAX
        if want_paused != self._read_paused:
            self._read_paused = want_paused
            if want_paused:
                self._transport.pause_reading()
            else:
                self._transport.resume_reading()
            self._watch_frame(True)    # the frame's clock stops while the bookie does not read

    # -- output --------------------------------------------------------------------------
    def _send(self, frame_type: int, request_id: int, body: bytes) -> None:
        if self._closed or self._discarding:
            return
        self._out.append(encode_header(frame_type, request_id, len(body)))
        self._out.append(body)
        self._schedule_flush()

    def _send_raw(self, frame: bytes) -> None:
        if self._closed or self._discarding:
            return
        self._out.append(frame)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._closed or not self._out or self._transport.is_closing():
            self._out.clear()
            return
        out, self._out = self._out, []
        self._transport.writelines(out)

    def _refuse(self, error: FrameError) -> None:
        """Bad framing or body: answer an ErrorResponse, then close. The connection half-closes
        and discards what still arrives for up to REFUSED_LINGER_S before closing, so that the
        peer reads the error instead of a reset (closing with unread input sends a TCP RST)."""
        self._server.log_close(CLOSE_BAD_FRAME, self._peer, str(error))
        self._close_refused(encode_error(error.request_id, error.code, str(error)))

    def _close_refused(self, frame: bytes) -> None:
        """Answer ``frame`` (the refusal), then close as :meth:`_refuse` says."""
        self._frame_started_s = None
        if self._first_request_timer is not None:
            self._first_request_timer.cancel()
            self._first_request_timer = None
        self._out.append(frame)
        self._flush()
        self._discarding = True
        if self._read_paused:
            self._read_paused = False
            self._transport.resume_reading()
        if self._transport.can_write_eof():
            self._transport.write_eof()
            asyncio.get_running_loop().call_later(REFUSED_LINGER_S, self.close)
        else:
            self.close()

    def close(self, abort: bool = False) -> None:
        """Close after the answers already produced (``abort``: drop them and reset, for a peer
        that may not read them: a graceful close would wait for it forever)."""
        if not self._closed:
            if not abort:
                self._flush()  # answers already produced still go out
            self._closed = True
            self._out.clear()
            if abort:
                self._transport.abort()
            else:
                self._transport.close()
        elif abort:          # closing gracefully, stuck behind answers the peer does not read
            self._transport.abort()


__all__ = ["BookieServer", "BookieService", "add_response", "entry_from_pb", "entry_to_pb"]
