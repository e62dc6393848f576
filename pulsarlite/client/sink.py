"""Sinks: where received messages wait for the application (the receiver queue).

One sink per application-level consumer or reader, shared by all its :class:`~.consumer.ConsumerImpl`
(one per topic or partition). The sink counts the messages the application took, per consumer,
and returns permits (FLOW) at half the receiver queue. :class:`AsyncSink` is for
``pulsarlite.aio`` (everything on the loop); :class:`ThreadSink` for the blocking API (the loop
thread puts, application threads get).
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time

from pulsarlite.client.connection import expire
from pulsarlite.client.errors import AlreadyClosed, Timeout
from pulsarlite.client.types import Message


class Sink:
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


class AsyncSink(Sink):
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
                    handle = self.loop.call_later(remaining, expire, waiter)
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


class ThreadSink(Sink):
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
