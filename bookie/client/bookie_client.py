"""The client's connection to one bookie (shell; no protocol decisions here).

One TCP connection per bookie, speaking the framed protocol of proto/bookie_rpc.proto (codec in
bookie/transport.py), opened lazily and re-opened by the next call after it broke.

Adds are coalesced: whatever is pending for the bookie when a request slot is free goes out as
one AddRequest (bounded by entries and bytes), at most ``add_requests_in_flight_max`` requests
outstanding. Under load batches grow by themselves; when idle an add goes out at once (in the
next loop iteration, together with whatever else was queued in this one). Acks come back
coalesced too and are dispatched to per-entry callbacks. If the connection breaks, every add
waiting on it gets an UNAVAILABLE result (the ledger's write core then changes the ensemble)
and every call waiting on it raises BookieUnavailableError.

Authentication: the first frame of every connection is an AuthRequest carrying the configured
credential (``LedgerClientConfig.bookie_auth_token`` or ``bookie_auth_token_file``, read at each
connection; method "" without one); the connection is used only once the bookie answered it OK.
A refusal fails the connection attempt like an unreachable bookie, with the bookie's reason
(never the token) in the BookieUnavailableError. Once per connection: adds and reads then go as
before.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import pathlib
import socket
from itertools import chain
from typing import Callable, Sequence

from google.protobuf.message import DecodeError

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.tls import client_context
from bookie.transport import (HEADER, HEADER_BYTES, MESSAGE_TYPES, RESPONSE_TYPES, FrameDecoder,
                              FrameError, encode_add_request_tail, encode_frame, encode_header)
from pulsarlite.config import LedgerClientConfig
from pulsarlite.errors import BookieUnavailableError

log = logging.getLogger("pulsarlite.ledger_client")

# callback(bookie_id, [(entry_id, status_code), ...]): the answers to one AddRequest that
# belong to one callback (one ledger writer), in entry order
AddCallback = Callable[[str, list[tuple[int, int]]], None]

# status reported to callbacks when the bookie could not be reached (not a bookie answer)
UNREACHABLE = pb.UNAVAILABLE

_ADD_RESPONSE = pb.FRAME_ADD_RESPONSE

# pause the add pump while this many request bytes wait in the socket's write buffer
WRITE_BUFFER_HIGH_BYTES = 1024 * 1024
WRITE_BUFFER_LOW_BYTES = 256 * 1024


def parse_bookie_address(bookie_id: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) -> (host, port); raises BookieUnavailableError."""
    host, sep, port = bookie_id.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise BookieUnavailableError(f"bookie {bookie_id}: not a host:port address")
    return host.strip("[]"), int(port)


class _Connection(asyncio.Protocol):
    """The socket side of one connection; everything it receives goes to its BookieClient."""

    def __init__(self, client: "BookieClient", frame_bytes_max: int) -> None:
        self.client = client
        self.decoder = FrameDecoder(frame_bytes_max, RESPONSE_TYPES)
        self.transport: asyncio.Transport | None = None
        self.write_paused = False
        # until the bookie answered the AuthRequest: the future of its answer (frame type, body)
        self.auth_answer: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES, low=WRITE_BUFFER_LOW_BYTES)

    def data_received(self, data: bytes) -> None:
        waiter = self.auth_answer
        if waiter is None:
            self.client._on_data(self, data)
            return
        try:                 # the bookie sends nothing else before its answer to the AuthRequest
            for frame_type, _, body in self.decoder.feed(data):
                if not waiter.done():
                    waiter.set_result((frame_type, body))
        except FrameError as e:
            if not waiter.done():
                waiter.set_exception(BookieUnavailableError(f"bookie {self.client.bookie_id}: bad frame: {e}"))

    def _fail_auth(self, reason: str) -> None:
        waiter = self.auth_answer
        if waiter is not None and not waiter.done():
            waiter.set_exception(BookieUnavailableError(f"bookie {self.client.bookie_id}: {reason} "
                                                        f"before answering the AuthRequest"))

    def eof_received(self):
        self._fail_auth("connection closed by the bookie")
        self.client._drop_connection(self, "connection closed by the bookie")
        return False

    def connection_lost(self, exc) -> None:
        self._fail_auth("connection lost")
        self.client._drop_connection(self, f"connection lost: {exc!r}" if exc else "connection closed by the bookie")

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self.client._schedule_pump()


class PumpGroup:
    """One loop callback pumps every bookie client of a pool that has adds to write, instead of
    one callback per client: an entry goes to Qw bookies, so each add would otherwise schedule
    Qw callbacks. Clients pump in the order they asked to.

    With ``flush_interval_s`` > 0 the group also paces its pumps under load: a client with no
    AddRequest outstanding (idle: a lone add, a synchronous producer) is pumped on the next
    loop turn as always, but while requests are outstanding the next pump waits until
    ``flush_interval_s`` after the previous one, so the adds of that interval leave as one
    AddRequest per bookie (one socket write, one request and one journal group in each bookie)
    instead of one each. At a few thousand single-message adds per second this is what the
    bookies' CPU goes to (BENCHMARKS.md, "Pacing the pumps")."""

    __slots__ = ("_due", "_scheduled", "_timer", "_last_run_s", "_flush_interval_s", "_flush_on_idle_adds_max")

    def __init__(self, flush_interval_s: float = 0.0, flush_on_idle_adds_max: int = 0) -> None:
        if not flush_interval_s >= 0.0:
            raise ValueError(f"flush interval {flush_interval_s!r} s must be >= 0")
        if flush_on_idle_adds_max < 0:
            raise ValueError(f"flush_on_idle_adds_max {flush_on_idle_adds_max!r} must be >= 0")
        # a client whose last outstanding request was just answered, with at most this many
        # adds waiting, ends the pacing interval: at a light load the wait would only add
        # latency (the bookie is idle), while under load many adds wait and the interval still
        # gathers them into one request. 0: off.
        self._flush_on_idle_adds_max = flush_on_idle_adds_max
        self._due: list[BookieClient] = []
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None   # the pending delayed run, if any
        self._last_run_s = float("-inf")                  # loop time of the last run
        self._flush_interval_s = flush_interval_s

    def schedule(self, client: "BookieClient") -> None:
        self._due.append(client)
        interval = self._flush_interval_s
        if interval and client._inflight:
            if not self._scheduled:
                self._scheduled = True
                loop = asyncio.get_running_loop()
                wait = self._last_run_s + interval - loop.time()
                if wait > 0:
                    self._timer = loop.call_later(wait, self._run)
                else:
                    loop.call_soon(self._run)
            return
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run)
        else:                            # an idle client does not wait for the busy ones' pacing
            self._end_interval()

    def client_went_idle(self, adds_waiting: int) -> None:
        """A due client's last outstanding request was answered with ``adds_waiting`` adds
        (chunks) queued for it: with at most ``flush_on_idle_adds_max`` of them the paced pump
        runs on the next loop turn instead of at the end of its interval."""
        if adds_waiting <= self._flush_on_idle_adds_max:
            self._end_interval()

    def _end_interval(self) -> None:
        """A delayed run, if one is pending, runs on the next loop turn instead."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            asyncio.get_running_loop().call_soon(self._run)

    def _run(self) -> None:
        self._scheduled = False
        self._timer = None
        if self._flush_interval_s:
            self._last_run_s = asyncio.get_running_loop().time()
        due, self._due = self._due, []
        for client in due:
            try:
                client._pump()
            except Exception:    # as separate callbacks would: the others still pump
                log.exception("bookie=%s: add pump failed", client.bookie_id)


class BookieClient:
    def __init__(self, bookie_id: str, config: LedgerClientConfig, pump_group: PumpGroup | None = None) -> None:
        self.bookie_id = bookie_id
        self._config = config
        self._pump_group = pump_group    # None: the client schedules its own pump callback
        self._conn: _Connection | None = None           # connected and usable
        self._connect_task: asyncio.Task | None = None
        # adds waiting to be written, in chunks of consecutive adds of one caller: (entry ids,
        # encoded entries, recovery, callback); an encoded entry is an element of
        # AddRequest.entries (bookie.transport.encode_add_entry), shared by the write quorum's
        # bookies. A single add is a chunk of one; a run (send_adds) one chunk.
        self._outbound: collections.deque[tuple[Sequence[int], Sequence[bytes], bool, AddCallback]] = \
            collections.deque()
        # AddRequests written, waiting for their AddResponse: request id -> [(entry ids, callback)]
        # (the chunks the request carries, in order)
        self._inflight: dict[int, list[tuple[Sequence[int], AddCallback]]] = {}
        # unary requests written, waiting for their answer: request id -> future (frame type, body)
        self._calls: dict[int, asyncio.Future] = {}
        self._next_request_id = 1
        self._pump_scheduled = False
        self._closed = False

    # -- connection ----------------------------------------------------------------------
    def _start_connect(self) -> asyncio.Task:
        task = self._connect_task
        if task is None or task.done():
            task = self._connect_task = asyncio.ensure_future(self._connect())
            task.add_done_callback(self._connect_done)
        return task

    async def _connect(self) -> _Connection:
        host, port = parse_bookie_address(self.bookie_id)
        loop = asyncio.get_running_loop()
        method, data = bookie_credential(self._config)
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(self._config.connect_timeout_ms / 1000):
                tls = {} if not self._config.bookie_tls_enabled else {
                    "ssl": client_context(self._config.bookie_tls_trust_certs_file_path), "server_hostname": host}
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, self._config.request_bytes_max), host, port, **tls)
                await self._authenticate(conn, method, data)
        except TimeoutError:
            if conn is not None:
                conn.transport.abort()
            raise BookieUnavailableError(f"bookie {self.bookie_id}: connect timed out after "
                                         f"{self._config.connect_timeout_ms} ms") from None
        except OSError as e:
            raise BookieUnavailableError(f"bookie {self.bookie_id}: cannot connect: {e}") from None
        except BaseException:
            if conn is not None:
                conn.transport.abort()
            raise
        if self._closed:
            conn.transport.close()
            raise BookieUnavailableError(f"bookie {self.bookie_id}: client closed")
        self._conn = conn
        return conn

    async def _authenticate(self, conn: _Connection, method: str, data: bytes) -> None:
        """Send the AuthRequest and wait for the bookie's AuthResponse(OK); raises
        BookieUnavailableError with the bookie's reason."""
        conn.auth_answer = asyncio.get_running_loop().create_future()
        request = pb.AuthRequest(method=method, data=data)
        conn.transport.write(encode_frame(pb.FRAME_AUTH_REQUEST, self._new_request_id(), request.SerializeToString()))
        frame_type, body = await conn.auth_answer
        conn.auth_answer = None
        try:
            if frame_type == pb.FRAME_AUTH_RESPONSE:
                answer = pb.AuthResponse.FromString(body)
            elif frame_type == pb.FRAME_ERROR_RESPONSE:
                answer = pb.ErrorResponse.FromString(body)
            else:
                raise BookieUnavailableError(f"bookie {self.bookie_id}: answered frame type {frame_type} "
                                             f"to the AuthRequest")
        except DecodeError as e:
            raise BookieUnavailableError(f"bookie {self.bookie_id}: unparsable answer to the AuthRequest: {e}") from None
        if answer.code != pb.OK:
            log.error("bookie refused the connection bookie=%s: %s", self.bookie_id, answer.message)
            raise BookieUnavailableError(f"bookie {self.bookie_id}: authentication refused: {answer.message}")

    def _connect_done(self, task: asyncio.Task) -> None:
        if task.cancelled():
            error: BaseException | None = BookieUnavailableError(f"bookie {self.bookie_id}: connect cancelled")
        else:
            error = task.exception()
        if error is None:
            self._schedule_pump()
            return
        if self._outbound:
            log.warning("bookie=%s unreachable, failing %d adds: %s", self.bookie_id, len(self._outbound), error)
        outbound, self._outbound = self._outbound, collections.deque()
        _dispatch(self.bookie_id, [(e, cb, UNREACHABLE) for ids, _, _, cb in outbound for e in ids])

    def _usable(self) -> _Connection | None:
        """The current connection if it can still be written to."""
        conn = self._conn
        if conn is not None and conn.transport.is_closing():
            self._drop_connection(conn, "connection closing")
            return None
        return conn

    async def _connection(self) -> _Connection:
        conn = self._usable()
        if conn is not None:
            return conn
        return await asyncio.shield(self._start_connect())

    def _drop_connection(self, conn: _Connection, reason: str) -> None:
        """``conn`` is unusable: fail everything that waits on it."""
        if conn is not self._conn:
            return
        self._conn = None
        if conn.transport is not None and not conn.transport.is_closing():
            conn.transport.abort()
        if self._inflight or self._calls:
            log.warning("bookie=%s: %s; failing %d add requests and %d calls", self.bookie_id, reason,
                        len(self._inflight), len(self._calls))
        self._fail_all(reason)

    def _fail_all(self, reason: str) -> None:
        calls, self._calls = self._calls, {}
        for fut in calls.values():
            if not fut.done():
                fut.set_exception(BookieUnavailableError(f"bookie {self.bookie_id}: {reason}"))
        inflight, self._inflight = self._inflight, {}
        outbound, self._outbound = self._outbound, collections.deque()
        failed = [(e, cb, UNREACHABLE) for taken in inflight.values() for ids, cb in taken for e in ids]
        failed += [(e, cb, UNREACHABLE) for ids, _, _, cb in outbound for e in ids]
        _dispatch(self.bookie_id, failed)

    def _new_request_id(self) -> int:
        request_id = self._next_request_id
        self._next_request_id += 1
        return request_id

    # -- adds ----------------------------------------------------------------------------
    def send_add(self, entry_id: int, entry: bytes, recovery: bool, callback: AddCallback) -> None:
        """Queue one add of ``entry`` (from ``bookie.transport.encode_add_entry``); ``callback``
        runs exactly once for it with the bookie's status code."""
        if self._closed:     # answered from the loop, never from inside this call
            asyncio.get_running_loop().call_soon(callback, self.bookie_id, [(entry_id, UNREACHABLE)])
            return
        self._outbound.append(((entry_id,), (entry,), recovery, callback))
        if self._conn is None:
            self._start_connect()  # the pump runs once connected
        else:
            self._schedule_pump()

    def send_adds(self, entry_ids: Sequence[int], entries: Sequence[bytes], recovery: bool,
                  callback: AddCallback) -> None:
        """Queue adds of several entries at once (``entry_ids[i]`` is encoded in ``entries[i]``),
        as :meth:`send_add` for each in turn: ``callback`` runs exactly once per entry."""
        if len(entry_ids) != len(entries):
            raise ValueError(f"{len(entry_ids)} entry ids for {len(entries)} entries")
        if not entry_ids:
            return
        if self._closed:     # answered from the loop, never from inside this call
            asyncio.get_running_loop().call_soon(callback, self.bookie_id, [(e, UNREACHABLE) for e in entry_ids])
            return
        self._outbound.append((entry_ids, entries, recovery, callback))
        if self._conn is None:
            self._start_connect()  # the pump runs once connected
        else:
            self._schedule_pump()

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled and self._outbound:
            self._pump_scheduled = True
            group = self._pump_group
            if group is None:
                asyncio.get_running_loop().call_soon(self._pump)
            else:
                group.schedule(self)

    def _pump(self) -> None:
        """Write pending adds as AddRequests while request slots are free (one socket write)."""
        self._pump_scheduled = False
        conn = self._usable()
        if conn is None:
            if self._outbound:
                self._start_connect()
            return
        if conn.write_paused:
            return
        inflight_max = self._config.add_requests_in_flight_max
        outbound = self._outbound
        if len(outbound) == 1 and len(outbound[0][0]) == 1 and len(self._inflight) < inflight_max:
            # one add waits (the paced case): the request _take_batch would build for it
            ids, entries, recovery, callback = outbound.popleft()
            request_id = self._next_request_id
            self._next_request_id = request_id + 1
            self._inflight[request_id] = [(ids, callback)]
            entry = entries[0]
            tail = encode_add_request_tail(recovery, request_id)
            conn.transport.writelines((encode_header(pb.FRAME_ADD_REQUEST, request_id, len(entry) + len(tail)),
                                       entry, tail))
            return
        out: list[bytes] = []
        while self._outbound and len(self._inflight) < inflight_max:
            request_id = self._new_request_id()
            body, taken = self._take_batch(request_id)
            self._inflight[request_id] = taken
            out.append(encode_header(pb.FRAME_ADD_REQUEST, request_id, sum(map(len, body))))
            out += body
        if out:
            conn.transport.writelines(out)

    def _take_batch(self, request_id: int) -> tuple[list[bytes], list[tuple[Sequence[int], AddCallback]]]:
        """Up to the batch limits of pending adds that share a recovery flag: the AddRequest's
        body as pieces (the encoded entries, then its other fields) and the chunks it carries
        (a chunk that does not fit whole is split: its head goes now, the rest stays first)."""
        entries_max, bytes_max = self._config.add_batch_entries_max, self._config.add_batch_bytes_max
        outbound = self._outbound
        recovery = outbound[0][2]
        taken: list[tuple[Sequence[int], AddCallback]] = []
        body: list[bytes] = []
        count = 0
        size = 0
        while outbound and count < entries_max:
            ids, entries, rec, cb = outbound[0]
            if rec != recovery:
                break
            n = len(ids)
            chunk_bytes = sum(map(len, entries)) if n > 1 else len(entries[0])
            if count + n <= entries_max and (size + chunk_bytes <= bytes_max or (not count and n == 1)):
                outbound.popleft()
                taken.append((ids, cb))
                body += entries
                count += n
                size += chunk_bytes
                continue
            # the chunk does not fit whole: as many of its first entries as the limits allow
            # (at least one entry per request, however big)
            room = min(n, entries_max - count)
            k = 0
            while k < room:
                size += len(entries[k])
                if (count or k) and size > bytes_max:
                    break
                k += 1
            if k:
                taken.append((ids[:k], cb))
                body += entries[:k]
                outbound[0] = (ids[k:], entries[k:], rec, cb)
            break
        body.append(encode_add_request_tail(recovery, request_id))
        return body, taken

    # -- receiving -----------------------------------------------------------------------
    def _on_data(self, conn: _Connection, data: bytes) -> None:
        if conn is not self._conn:
            return
        decoder = conn.decoder
        if type(data) is bytes and len(data) > HEADER_BYTES and not decoder.buffered_bytes:
            # one whole AddResponse and nothing else (one add per request: the paced case):
            # what the decoder would yield for it, with its checks, without the generator
            frame_bytes, frame_type, request_id = HEADER.unpack_from(data, 0)
            if (frame_type == _ADD_RESPONSE and frame_bytes + 4 == len(data)
                    and frame_bytes <= decoder.frame_bytes_max and _ADD_RESPONSE in decoder.frame_types):
                try:
                    response = pb.AddResponse.FromString(data[HEADER_BYTES:])
                except DecodeError as e:
                    log.error("bookie=%s sent a bad frame, closing the connection: %r", self.bookie_id, e)
                    self._drop_connection(conn, f"bad frame from the bookie: {e}")
                    return
                taken = self._inflight.get(request_id)
                results = response.results
                if taken is not None and len(taken) == 1 and len(taken[0][0]) == 1 and len(results) == 1:
                    del self._inflight[request_id]           # _on_add_response's first case, inline
                    entry_ids, callback = taken[0]
                    callback(self.bookie_id, [(entry_ids[0], results[0].code)])
                else:
                    self._on_add_response(request_id, response)
                if self._outbound:
                    self._after_responses()
                return
        try:
            for frame_type, request_id, body in conn.decoder.feed(data):
                if frame_type == pb.FRAME_ADD_RESPONSE:
                    self._on_add_response(request_id, pb.AddResponse.FromString(body))
                elif frame_type == pb.FRAME_ERROR_RESPONSE:
                    self._on_error_response(request_id, pb.ErrorResponse.FromString(body))
                else:
                    fut = self._calls.pop(request_id, None)
                    if fut is not None and not fut.done():
                        fut.set_result((frame_type, body))
        except (FrameError, DecodeError) as e:  # the stream cannot be trusted any more
            log.error("bookie=%s sent a bad frame, closing the connection: %r", self.bookie_id, e)
            self._drop_connection(conn, f"bad frame from the bookie: {e}")
            return
        if self._outbound:
            self._after_responses()  # slots freed: what queued meanwhile goes out as one batch

    def _after_responses(self) -> None:
        if not self._pump_scheduled:
            self._schedule_pump()
            return
        if self._pump_group is not None and not self._inflight:
            self._pump_group.client_went_idle(len(self._outbound))

    def _on_add_response(self, request_id: int, response: pb.AddResponse) -> None:
        taken = self._inflight.pop(request_id, None)
        if taken is None:
            return
        results = response.results
        if len(taken) == 1:
            entry_ids, first_cb = taken[0]
            count = len(entry_ids)
            if count == 1 and len(results) == 1:     # one add per request (the paced case)
                first_cb(self.bookie_id, [(entry_ids[0], results[0].code)])
                return
        else:
            entry_ids = list(chain.from_iterable(ids for ids, _ in taken))
            count = len(entry_ids)
            first_cb = taken[0][1] if all(cb is taken[0][1] for _, cb in taken) else None
        if len(results) != count:
            log.error("bookie=%s answered %d results for %d entries: failing the request",
                      self.bookie_id, len(results), count)
            _dispatch(self.bookie_id, [(e, cb, UNREACHABLE) for ids, cb in taken for e in ids])
            return
        if first_cb is not None:     # the common case: one writer, no regrouping
            first_cb(self.bookie_id, [(e, r.code) for e, r in zip(entry_ids, results)])
            return
        callbacks = [cb for ids, cb in taken for _ in ids]
        _dispatch(self.bookie_id, [(e, cb, r.code) for e, cb, r in zip(entry_ids, callbacks, results)])

    def _on_error_response(self, request_id: int, error: pb.ErrorResponse) -> None:
        log.warning("bookie=%s refused request %d: %s %s", self.bookie_id, request_id,
                    pb.StatusCode.Name(error.code) if error.code in pb.StatusCode.values() else error.code,
                    error.message)
        taken = self._inflight.pop(request_id, None)
        if taken is not None:
            code = error.code if error.code != pb.OK else UNREACHABLE
            _dispatch(self.bookie_id, [(e, cb, code) for ids, cb in taken for e in ids])
        fut = self._calls.pop(request_id, None)
        if fut is not None and not fut.done():
            fut.set_exception(BookieUnavailableError(
                f"bookie {self.bookie_id}: request refused ({error.code}): {error.message}"))

    # -- unary calls ---------------------------------------------------------------------
    async def _unary(self, frame_type: int, request, response_type: int, timeout_ms: int):
        if self._closed:
            raise BookieUnavailableError(f"bookie {self.bookie_id}: client closed")
        request_id = 0
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                conn = await self._connection()
                request_id = self._new_request_id()
                fut = asyncio.get_running_loop().create_future()
                self._calls[request_id] = fut
                conn.transport.write(encode_frame(frame_type, request_id, request.SerializeToString()))
                got_type, body = await fut
        except TimeoutError:
            raise BookieUnavailableError(f"bookie {self.bookie_id}: no answer within {timeout_ms} ms") from None
        finally:
            if request_id:
                self._calls.pop(request_id, None)
        if got_type != response_type:
            raise BookieUnavailableError(f"bookie {self.bookie_id}: answered frame type {got_type} to "
                                         f"a request of type {frame_type}")
        try:
            return MESSAGE_TYPES[response_type].FromString(body)
        except DecodeError as e:
            raise BookieUnavailableError(f"bookie {self.bookie_id}: unparsable answer: {e}") from None

    async def read(self, ledger_id: int, first_entry_id: int, last_entry_id: int, *,
                   fence: bool = False, max_bytes: int = 0) -> pb.ReadResponse:
        return await self._unary(pb.FRAME_READ_REQUEST, pb.ReadRequest(
            ledger_id=ledger_id, first_entry_id=first_entry_id, last_entry_id=last_entry_id,
            fence=fence, max_bytes=max_bytes), pb.FRAME_READ_RESPONSE, self._config.read_timeout_ms)

    async def read_lac(self, ledger_id: int, *, fence: bool = False) -> pb.ReadLacResponse:
        return await self._unary(pb.FRAME_READ_LAC_REQUEST, pb.ReadLacRequest(ledger_id=ledger_id, fence=fence),
                                 pb.FRAME_READ_LAC_RESPONSE, self._config.rpc_timeout_ms)

    async def delete_ledger(self, ledger_id: int) -> pb.DeleteLedgerResponse:
        return await self._unary(pb.FRAME_DELETE_LEDGER_REQUEST, pb.DeleteLedgerRequest(ledger_id=ledger_id),
                                 pb.FRAME_DELETE_LEDGER_RESPONSE, self._config.rpc_timeout_ms)

    async def info(self) -> pb.BookieInfoResponse:
        return await self._unary(pb.FRAME_BOOKIE_INFO_REQUEST, pb.BookieInfoRequest(),
                                 pb.FRAME_BOOKIE_INFO_RESPONSE, self._config.rpc_timeout_ms)

    async def close(self) -> None:
        self._closed = True
        task = self._connect_task
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            conn.transport.close()
        self._fail_all("client closed")


def bookie_credential(config: LedgerClientConfig) -> tuple[str, bytes]:
    """(method, data) of the AuthRequest: ("token", the token) from ``bookie_auth_token`` or the
    file ``bookie_auth_token_file`` (read now, so a rotated file is picked up by the next
    connection), else ("", b"") (no credential)."""
    if config.bookie_auth_token:
        return "token", config.bookie_auth_token.strip().encode()
    if config.bookie_auth_token_file:
        path = config.bookie_auth_token_file
        try:
            token = pathlib.Path(path).read_bytes().strip()
        except OSError as e:
            raise BookieUnavailableError(f"bookie_auth_token_file: cannot read {path}: {e.strerror}") from None
        return "token", token
    return "", b""


def _dispatch(bookie_id: str, answers: list[tuple[int, AddCallback, int]]) -> None:
    """Group answers (entry id, callback, status) by callback (usually a single ledger writer)
    and call each once."""
    if not answers:
        return
    first_cb = answers[0][1]
    if all(cb is first_cb for _, cb, _ in answers):  # the common case: one writer
        first_cb(bookie_id, [(e, code) for e, _, code in answers])
        return
    grouped: dict[AddCallback, list[tuple[int, int]]] = {}
    for e, cb, code in answers:
        grouped.setdefault(cb, []).append((e, code))
    for cb, results in grouped.items():
        cb(bookie_id, results)


class BookieClientPool:
    """One BookieClient per bookie id, shared by every ledger of a LedgerClient."""

    def __init__(self, config: LedgerClientConfig) -> None:
        self._config = config
        self._clients: dict[str, BookieClient] = {}
        self._pump_group = PumpGroup(config.add_flush_interval_ms / 1000, config.add_flush_on_idle_adds_max)

    def get(self, bookie_id: str) -> BookieClient:
        client = self._clients.get(bookie_id)
        if client is None:
            client = self._clients[bookie_id] = BookieClient(bookie_id, self._config, self._pump_group)
        return client

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
