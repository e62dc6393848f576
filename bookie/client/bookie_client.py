"""The client's connection to one bookie (shell; no protocol decisions here).

Adds are coalesced: whatever is pending for the bookie when the stream is ready to write goes
out as one AddRequest (bounded by entries and bytes), on one long-lived AddStream. Under load
batches grow by themselves; when idle an add goes out at once. Acks come back coalesced too
and are dispatched to per-entry callbacks. If the stream breaks, every add waiting on it gets
an ERROR result (the ledger's write core then changes the ensemble) and the next add opens a
new stream.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Callable

import grpc

from bookie._proto import bookie_rpc_pb2 as pb
from bookie._proto import bookie_rpc_pb2_grpc as pb_grpc
from pulsarlite.config import LedgerClientConfig
from pulsarlite.errors import BookieUnavailableError

log = logging.getLogger("pulsarlite.ledger_client")

# callback(bookie_id, [(entry_id, status_code), ...]): the answers to one AddRequest that
# belong to one callback (one ledger writer), in entry order
AddCallback = Callable[[str, list[tuple[int, int]]], None]

# status reported to callbacks when the bookie could not be reached (not a bookie answer)
UNREACHABLE = pb.UNAVAILABLE


class BookieClient:
    def __init__(self, bookie_id: str, config: LedgerClientConfig) -> None:
        self.bookie_id = bookie_id
        self._config = config
        opts = [("grpc.max_receive_message_length", config.request_bytes_max),
                ("grpc.max_send_message_length", config.request_bytes_max)]
        self._channel = grpc.aio.insecure_channel(bookie_id, options=opts)
        self._stub = pb_grpc.BookieStub(self._channel)
        # adds waiting to be written: (entry, recovery, callback)
        self._outbound: collections.deque[tuple[pb.Entry, bool, AddCallback]] = collections.deque()
        # requests written, waiting for their AddResponse: request id -> [(entry, callback)]
        self._inflight: dict[int, list[tuple[pb.Entry, AddCallback]]] = {}
        self._next_request_id = 1
        self._wakeup = asyncio.Event()
        self._writer_task: asyncio.Task | None = None
        self._closed = False

    # -- adds ----------------------------------------------------------------------------
    def send_add(self, entry: pb.Entry, recovery: bool, callback: AddCallback) -> None:
        """Queue one add; ``callback`` runs exactly once for it with the bookie's status code."""
        if self._closed:
            callback(self.bookie_id, [(entry.entry_id, UNREACHABLE)])
            return
        self._outbound.append((entry, recovery, callback))
        self._wakeup.set()
        if self._writer_task is None or self._writer_task.done():
            self._writer_task = asyncio.ensure_future(self._run_stream())

    def _take_batch(self) -> tuple[pb.AddRequest, list[tuple[pb.Entry, AddCallback]]]:
        """Up to the batch limits of pending adds that share a recovery flag."""
        entries_max, bytes_max = self._config.add_batch_entries_max, self._config.add_batch_bytes_max
        outbound = self._outbound
        recovery = outbound[0][1]
        taken: list[tuple[pb.Entry, AddCallback]] = []
        size = 0
        while outbound and len(taken) < entries_max:
            entry, rec, cb = outbound[0]
            size += len(entry.payload) + 40
            if rec != recovery or (taken and size > bytes_max):
                break
            outbound.popleft()
            taken.append((entry, cb))
        request_id = self._next_request_id
        self._next_request_id += 1
        return pb.AddRequest(entries=[e for e, _ in taken], recovery=recovery, request_id=request_id), taken

    async def _run_stream(self) -> None:
        call = self._stub.AddStream()
        reader = asyncio.ensure_future(self._read_acks(call))
        try:
            while not self._closed:
                if not self._outbound or len(self._inflight) >= self._config.add_requests_in_flight_max:
                    self._wakeup.clear()
                    waiter = asyncio.ensure_future(self._wakeup.wait())
                    done, _ = await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
                    if reader in done:
                        waiter.cancel()
                        break
                    continue
                request, taken = self._take_batch()
                self._inflight[request.request_id] = taken
                await call.write(request)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as e:
            log.warning("add stream broken bookie=%s: %s", self.bookie_id, _describe(e))
        finally:
            reader.cancel()
            call.cancel()
            self._fail_all()

    async def _read_acks(self, call) -> None:
        try:
            async for response in call:
                taken = self._inflight.pop(response.request_id, None)
                if taken is None:
                    continue
                if self._outbound:
                    self._wakeup.set()  # a slot freed: what queued meanwhile goes out as one batch
                results = response.results
                if len(results) != len(taken):
                    log.error("bookie=%s answered %d results for %d entries: failing the request",
                              self.bookie_id, len(results), len(taken))
                    _dispatch(self.bookie_id, [(e, cb, UNREACHABLE) for e, cb in taken])
                    continue
                _dispatch(self.bookie_id, [(e, cb, r.code) for (e, cb), r in zip(taken, results)])
        except grpc.aio.AioRpcError as e:
            log.warning("add stream closed by bookie=%s: %s", self.bookie_id, _describe(e))
        except asyncio.CancelledError:
            pass

    def _fail_all(self) -> None:
        inflight, self._inflight = self._inflight, {}
        outbound, self._outbound = self._outbound, collections.deque()
        failed = [(e, cb, UNREACHABLE) for taken in inflight.values() for e, cb in taken]
        failed += [(e, cb, UNREACHABLE) for e, _, cb in outbound]
        _dispatch(self.bookie_id, failed)

    # -- unary calls ---------------------------------------------------------------------
    async def _unary(self, method, request, timeout_ms: int):
        if self._closed:
            raise BookieUnavailableError(f"bookie {self.bookie_id}: client closed")
        try:
            return await method(request, timeout=timeout_ms / 1000)
        except grpc.aio.AioRpcError as e:
            raise BookieUnavailableError(f"bookie {self.bookie_id}: {_describe(e)}") from None

    async def read(self, ledger_id: int, first_entry_id: int, last_entry_id: int, *,
                   fence: bool = False, max_bytes: int = 0) -> pb.ReadResponse:
        return await self._unary(self._stub.Read, pb.ReadRequest(
            ledger_id=ledger_id, first_entry_id=first_entry_id, last_entry_id=last_entry_id,
            fence=fence, max_bytes=max_bytes), self._config.read_timeout_ms)

    async def read_lac(self, ledger_id: int, *, fence: bool = False) -> pb.ReadLacResponse:
        return await self._unary(self._stub.ReadLac, pb.ReadLacRequest(ledger_id=ledger_id, fence=fence),
                                 self._config.rpc_timeout_ms)

    async def delete_ledger(self, ledger_id: int) -> pb.DeleteLedgerResponse:
        return await self._unary(self._stub.DeleteLedger, pb.DeleteLedgerRequest(ledger_id=ledger_id),
                                 self._config.rpc_timeout_ms)

    async def info(self) -> pb.BookieInfoResponse:
        return await self._unary(self._stub.GetBookieInfo, pb.BookieInfoRequest(), self._config.rpc_timeout_ms)

    async def close(self) -> None:
        self._closed = True
        self._wakeup.set()
        if self._writer_task is not None:
            self._writer_task.cancel()
            try:
                await self._writer_task
            except (asyncio.CancelledError, Exception):
                pass
        self._fail_all()
        await self._channel.close()


def _dispatch(bookie_id: str, answers: list[tuple[pb.Entry, AddCallback, int]]) -> None:
    """Group answers by callback (usually a single ledger writer) and call each once."""
    if not answers:
        return
    first_cb = answers[0][1]
    if all(cb is first_cb for _, cb, _ in answers):  # the common case: one writer
        first_cb(bookie_id, [(e.entry_id, code) for e, _, code in answers])
        return
    grouped: dict[AddCallback, list[tuple[int, int]]] = {}
    for e, cb, code in answers:
        grouped.setdefault(cb, []).append((e.entry_id, code))
    for cb, results in grouped.items():
        cb(bookie_id, results)


def _describe(e: BaseException) -> str:
    if isinstance(e, grpc.aio.AioRpcError):
        return f"{e.code().name}: {e.details()}"
    return repr(e)


class BookieClientPool:
    """One BookieClient per bookie id, shared by every ledger of a LedgerClient."""

    def __init__(self, config: LedgerClientConfig) -> None:
        self._config = config
        self._clients: dict[str, BookieClient] = {}

    def get(self, bookie_id: str) -> BookieClient:
        client = self._clients.get(bookie_id)
        if client is None:
            client = self._clients[bookie_id] = BookieClient(bookie_id, self._config)
        return client

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
