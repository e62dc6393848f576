"""How the broker serves the admin app: the aiohttp runner, what its server logs, and memory of
requests cut off ([hardening]: bad input from outside gets a clear error, changes nothing, and the
process keeps serving others).

- **Malformed requests** (a bad request line or header, a duplicate Content-Length, a broken
  Content-Encoding, a body cut off...) are refused by aiohttp with 400 and logged by its server
  through :class:`AdminServerLog`: one line without traceback or request excerpt, at a bounded
  rate per kind (CountedCause: the 1st, 2nd, 4th, 8th... of each). Anything else aiohttp reports
  (an error of its own or of a handler that escaped the app's middleware) keeps its traceback.
- **Bodies cut off**: see :func:`release_request_body`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from pulsarlite.counted_log import CountedCause

log = logging.getLogger("pulsarlite.broker.admin.http")

# What a client can cause at will: logged as a refusal, never with a traceback.
CLIENT_ERRORS = (HttpProcessingError, RequestPayloadError, ConnectionError, asyncio.IncompleteReadError)


class AdminServerLog:
    """The ``logger`` aiohttp's RequestHandler logs through (it calls ``exception``, ``debug`` and
    ``warning``): client errors become one counted line, everything else goes to ``logger`` as
    aiohttp would have logged it."""

    def __init__(self, logger: logging.Logger = logging.getLogger("aiohttp.server")) -> None:
        self.logger = logger
        self.refused: dict[str, CountedCause] = {}     # by exception class: a bounded set

    def exception(self, msg: str, *args: Any, exc_info: Any = True, **kw: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else None
        if exc is None or not isinstance(exc, CLIENT_ERRORS):
            self.logger.error(msg, *args, exc_info=exc_info, **kw)
            return
        kind = type(exc).__name__
        cause = self.refused.get(kind)
        if cause is None:
            cause = self.refused[kind] = CountedCause()
        if cause.due():
            reason = (exc.message if isinstance(exc, HttpProcessingError) else None) or str(exc)
            if not isinstance(reason, str):
                reason = repr(reason)
            log.warning("admin http: malformed request refused (%s: %r; %d of this kind so far)",
                        kind, reason.splitlines()[0][:200] if reason else "", cause.count)
        release_exception(exc)

    def error(self, *args: Any, **kw: Any) -> None:
        self.logger.error(*args, **kw)

    def warning(self, *args: Any, **kw: Any) -> None:
        self.logger.warning(*args, **kw)

    def info(self, *args: Any, **kw: Any) -> None:
        self.logger.info(*args, **kw)

    def debug(self, *args: Any, **kw: Any) -> None:
        self.logger.debug(*args, **kw)


def release_exception(exc: BaseException | None) -> None:
    """Drop the traceback of ``exc`` and of the exceptions it chains to."""
    seen = 0
    while exc is not None and seen < 8:
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__
        seen += 1


def release_request_body(request: web.BaseRequest) -> None:
    """After a request is handled: if its body failed (the client went away while sending it, or
    sent a body that does not decode), drop the failure's traceback. aiohttp stores that
    exception in the request's StreamReader and raises it in whoever reads: its traceback then
    holds the reading frames, whose locals hold the request, its StreamReader -- and so the
    exception itself, and what was read of the body (up to ``client_max_size``). Without this,
    each such request stays in memory as cyclic garbage until a full collection of the cyclic GC
    (seen: 1.4 GiB of broker RSS in 10 s of 1 MiB requests cut off)."""
    payload = request.content
    release_exception(payload.exception())
    if isinstance(request, web.Request):
        # no route (404/405): the request's match info holds the HTTPException aiohttp raised,
        # whose traceback holds the request -- with the runner's no lingering (below), whatever
        # of the body was received but not read is in that cycle
        release_exception(request.match_info.http_exception)


def make_admin_runner(app: web.Application) -> web.AppRunner:
    """The runner broker/main.py serves ``app`` with: no access log, no signal handlers (the
    broker has its own), aiohttp's server logging through :class:`AdminServerLog`, and no
    lingering: a connection whose request body was not read to its end (413 past
    ``client_max_size``, a body that does not decode) is closed once the answer is written.
    aiohttp's default reads and discards the rest for up to 10 s, decoding it on the event loop:
    a ~250 KB gzip body of 256 MiB of zeros cost ~0.6 s of loop CPU after its 413
    (bench/hostile_inputs.py, admin-bad-bodies)."""
    return web.AppRunner(app, access_log=None, handle_signals=False, logger=AdminServerLog(),
                         lingering_time=0)


__all__ = ["AdminServerLog", "CLIENT_ERRORS", "make_admin_runner", "release_exception", "release_request_body"]
