"""What producers and consumers share: registering with bounded retries, and reconnecting.

:func:`retry_until` runs an attempt (a lookup, a registration) until it succeeds, fails with an
error that retrying cannot fix, or the deadline passes, with exponential backoff from
``BACKOFF_INITIAL_S`` to ``BACKOFF_MAX_S``. :class:`Handler` is the base of
:class:`~.producer.ProducerImpl` and :class:`~.consumer.ConsumerImpl`: on a lost connection or a
CLOSE_PRODUCER / CLOSE_CONSUMER from the broker it looks its topic up again and re-registers,
with jittered backoff, until it is closed (as the official clients' connection handler).
"""

from __future__ import annotations

import asyncio
import logging

from pulsarlite.client.connection import ClientImpl, Connection
from pulsarlite.client.errors import (AlreadyClosed, BrokerError, ClientError, ConnectError, LookupError_,
                                      NotConnected, Timeout)

log = logging.getLogger("pulsarlite.client")

BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 30.0


def _retriable(exc: BaseException) -> bool:
    if isinstance(exc, (ConnectError, Timeout, LookupError_, OSError, asyncio.TimeoutError)):
        return True
    if isinstance(exc, BrokerError):
        return exc.retriable
    return False


async def retry_until(deadline_s: float, loop, attempt, what: str):
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


class Handler:
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
        await retry_until(deadline, self.loop, self._connect, f"{self.kind} on {self.topic}")
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
