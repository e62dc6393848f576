"""The admin app as broker/main.py serves it (broker/admin/serving.py), over raw sockets: malformed
requests are logged as counted single lines without traceback (aiohttp-error-log), real errors
keep theirs, and requests cut off while sending their body leave no cyclic garbage holding it
(aborted-body-memory); tests/fuzz/NOTES.md."""

from __future__ import annotations

import asyncio
import gc
import logging
import tracemalloc

import pytest
from aiohttp import web

from broker.admin.http import make_admin_app
from broker.admin.serving import AdminServerLog, make_admin_runner
from test_admin_http import DictBackend


async def serve(app: web.Application):
    runner = make_admin_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


async def exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    try:
        return await asyncio.wait_for(reader.read(65536), 5)
    finally:
        writer.close()


MALFORMED = [
    b"GET /admin/v2/tenants HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    b"GET /admin/v2/tenants HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n",
    b"PUT /admin/v2/tenants/t HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Encoding: gzip\r\n"
    b"Content-Length: 10\r\n\r\nnot-gzip!!",
]


async def test_malformed_requests_are_counted_lines_without_traceback(caplog):
    runner, port = await serve(make_admin_app(DictBackend()))
    try:
        with caplog.at_level(logging.DEBUG):
            for _ in range(20):
                for request in MALFORMED:
                    assert (await exchange(port, request)).split(b"\r\n")[0].endswith(b" 400 Bad Request")
            await asyncio.sleep(0.1)
    finally:
        await runner.cleanup()
    records = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert not [r for r in records if r.exc_info or r.levelno >= logging.ERROR], records[0].exc_info
    # 60 malformed requests of 2-3 kinds: the 1st, 2nd, 4th, 8th, 16th... of each kind
    assert 3 <= len(records) <= 3 * 6, [r.getMessage() for r in records]
    assert all("\n" not in r.getMessage() and "malformed request refused" in r.getMessage() for r in records)


async def test_other_server_errors_keep_their_traceback(caplog):
    async def broken(request):
        raise RuntimeError("a bug")
    app = web.Application()             # no middleware: the error reaches aiohttp's server
    app.router.add_get("/broken", broken)
    runner, port = await serve(app)
    try:
        with caplog.at_level(logging.WARNING):
            assert (await exchange(port, b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\n")).startswith(b"HTTP/1.1 500")
    finally:
        await runner.cleanup()
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert record.levelno == logging.ERROR and record.exc_info[0] is RuntimeError
    server_log = AdminServerLog(logging.getLogger("test.admin.server"))
    with caplog.at_level(logging.WARNING):
        server_log.exception("Unhandled exception", exc_info=ValueError("x"))
    assert caplog.records[-1].exc_info[0] is ValueError


@pytest.mark.parametrize("path", [b"/admin/v2/tenants/t", b"/admin/v2/no-such-route"])
async def test_requests_cut_off_in_their_body_leave_no_garbage_holding_it(path):
    body = b"[" + b"0," * (512 * 1024 - 2) + b"0]"             # ~1 MiB announced
    request = (b"PUT " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:600_000])
    runner, port = await serve(make_admin_app(DictBackend()))
    gc.collect()
    gc.disable()                        # what is not freed by reference counting stays
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(20):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request)
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.transport.abort()    # the client goes away mid-body
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        gc.enable()
        await runner.cleanup()
    assert held < 4 * 2**20, f"{held / 2**20:.1f} MiB held after 20 requests of 600 KB cut off"


async def test_a_body_left_unread_closes_the_connection_instead_of_being_drained():
    """A gzip body past client_max_size is answered 413, then the connection is closed: aiohttp's
    default lingering read (and gunzipped, on the event loop) the rest for up to 10 s, ~0.6 s of
    loop CPU for a 250 KB body of 256 MiB of zeros (bench/hostile_inputs.py)."""
    import gzip
    runner, port = await serve(make_admin_app(DictBackend()))
    try:
        chunk = gzip.compress(b"\0" * (4 * 1024 * 1024), 9)      # more than 1 MiB decoded
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"PUT /admin/v2/tenants/t HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Encoding: gzip\r\nContent-Length: 100000000\r\n\r\n" + chunk)
            answer = await asyncio.wait_for(reader.read(65536), 5)
            assert answer.startswith(b"HTTP/1.1 413"), answer[:80]
            # the rest of the announced 100 MB never comes: a lingering server would wait for it
            rest = await asyncio.wait_for(reader.read(65536), 3)
            assert rest == b""
        finally:
            writer.close()
    finally:
        await runner.cleanup()
