"""The bookie's gRPC service: a thin asyncio shell over bookie.storage.BookieStore.

Adds arrive coalesced (many entries per AddRequest) on a bidirectional stream; each request is
handled concurrently so that requests share group commits, and its acks go back as one
AddResponse. Bad requests get a status code and change nothing; the bookie keeps serving.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from bookie._proto import bookie_rpc_pb2 as pb
from bookie._proto import bookie_rpc_pb2_grpc as pb_grpc
from bookie.storage import BookieStore, Status, StoredEntry
from pulsarlite.config import BookieConfig
from pulsarlite.errors import ChecksumError, PulsarliteError

log = logging.getLogger("pulsarlite.bookie.server")

# Requests of one AddStream processed at once; beyond this the stream stops reading (back-pressure).
ADD_REQUESTS_IN_FLIGHT_MAX = 64
ENTRY_ID_MAX = (1 << 63) - 1


def entry_from_pb(e: pb.Entry) -> StoredEntry:
    return StoredEntry(ledger_id=e.ledger_id, entry_id=e.entry_id, lac=e.lac, length=e.length,
                       payload=e.payload, checksum=e.checksum)


def entry_to_pb(e: StoredEntry) -> pb.Entry:
    return pb.Entry(ledger_id=e.ledger_id, entry_id=e.entry_id, lac=e.lac, length=e.length,
                    payload=e.payload, checksum=e.checksum)


class BookieService(pb_grpc.BookieServicer):
    def __init__(self, store: BookieStore, config: BookieConfig) -> None:
        self._store = store
        self._config = config
        self.closing = False

    # -- adds ----------------------------------------------------------------------------
    async def _add(self, request: pb.AddRequest) -> pb.AddResponse:
        entries = request.entries
        if self.closing:
            return _add_response(request, Status.UNAVAILABLE)
        if not entries:
            return pb.AddResponse(request_id=request.request_id)
        stored = [entry_from_pb(e) for e in entries]
        try:
            statuses = await self._store.add_entries(stored, recovery=request.recovery)
        except PulsarliteError as e:  # the store failed (journal I/O error): refuse, do not crash
            log.error("add refused, store unavailable bookie=%s: %s", self._config.effective_bookie_id, e)
            return _add_response(request, Status.UNAVAILABLE)
        bad = [(e.ledger_id, e.entry_id, s.name) for e, s in zip(stored, statuses) if s != Status.OK]
        if bad:
            log.info("adds refused bookie=%s count=%d first=%s", self._config.effective_bookie_id,
                     len(bad), bad[0])
        return pb.AddResponse(request_id=request.request_id,
                              results=[pb.AddResult(ledger_id=e.ledger_id, entry_id=e.entry_id, code=int(s))
                                       for e, s in zip(stored, statuses)])

    async def Add(self, request, context):  # noqa: N802 - gRPC method name
        return await self._add(request)

    async def AddStream(self, request_iterator, context):  # noqa: N802
        responses: asyncio.Queue = asyncio.Queue()
        slots = asyncio.Semaphore(ADD_REQUESTS_IN_FLIGHT_MAX)
        tasks: set[asyncio.Task] = set()

        async def handle(request: pb.AddRequest) -> None:
            try:
                response = await self._add(request)
            except Exception:  # a bug or a dead store: answer INTERNAL, keep the stream
                log.exception("add failed bookie=%s", self._config.effective_bookie_id)
                response = _add_response(request, Status.INTERNAL)
            finally:
                slots.release()
            await responses.put(response)

        async def read_requests() -> None:
            try:
                async for request in request_iterator:
                    await slots.acquire()
                    task = asyncio.ensure_future(handle(request))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            finally:
                if tasks:
                    await asyncio.gather(*tasks, return_exceptions=True)
                await responses.put(None)

        reader = asyncio.ensure_future(read_requests())
        try:
            while True:
                response = await responses.get()
                if response is None:
                    break
                yield response
        finally:
            reader.cancel()

    # -- reads ---------------------------------------------------------------------------
    async def Read(self, request, context):  # noqa: N802
        ledger_id = request.ledger_id
        first, last = request.first_entry_id, request.last_entry_id
        if first < 0 or last < first:
            return pb.ReadResponse(code=pb.BAD_REQUEST, lac=-1)
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
        info = self._store.ledger_info(ledger_id)
        return pb.ReadResponse(code=int(status), entries=[entry_to_pb(e) for e in entries],
                               lac=info.lac, fenced=info.fenced)

    async def ReadLac(self, request, context):  # noqa: N802
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

    async def DeleteLedger(self, request, context):  # noqa: N802
        try:
            status = await self._store.delete_ledger(request.ledger_id)
        except PulsarliteError as e:
            log.error("delete failed bookie=%s ledger=%d: %s", self._config.effective_bookie_id, request.ledger_id, e)
            return pb.DeleteLedgerResponse(code=pb.UNAVAILABLE)
        log.info("ledger deleted bookie=%s ledger=%d status=%s", self._config.effective_bookie_id,
                 request.ledger_id, Status(status).name)
        return pb.DeleteLedgerResponse(code=int(status))

    async def GetBookieInfo(self, request, context):  # noqa: N802
        used_fraction, free_bytes, total_bytes = self._store.disk_usage()
        return pb.BookieInfoResponse(
            bookie_id=self._config.effective_bookie_id, free_bytes=free_bytes, total_bytes=total_bytes,
            read_only=self._store.read_only, ledger_count=len(self._store.ledger_ids()),
            entry_count=self._store.entry_count())


def _add_response(request: pb.AddRequest, status: Status) -> pb.AddResponse:
    return pb.AddResponse(request_id=request.request_id,
                          results=[pb.AddResult(ledger_id=e.ledger_id, entry_id=e.entry_id, code=int(status))
                                   for e in request.entries])


def grpc_options(request_bytes_max: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", request_bytes_max),
        ("grpc.max_send_message_length", request_bytes_max),
        ("grpc.so_reuseport", 0),
    ]
