"""A bytes-bounded hand-off of a ledger's entries from the event loop (which reads them from the
bookies) to one worker thread (which encodes and uploads them): the streaming offload's
back-pressure. The loop's ``put`` waits while the pipe holds ``bytes_max``; the thread iterates
the entries, blocking while the pipe is empty. Either side can stop the other: ``fail(exc)``
(the loop: the read failed or was cancelled) makes the thread's iteration raise;
``stop()`` (the thread, when it is done or failed) makes the loop's next ``put`` raise.

API::

    pipe = EntryPipe(bytes_max)                       # created on the event loop
    await pipe.put([(entry_id, payload), ...])        # the loop; waits for room
    pipe.close()                                      # the loop: no more entries
    pipe.fail(exc)                                    # the loop: stop the thread (it raises exc)
    for entry_id, payload in pipe: ...                # the thread
    pipe.stop()                                       # the thread: done, the loop's puts fail
    pipe.bytes_held_max                               # the most bytes it ever held
    pipe.put_wait_s, pipe.take_wait_s                 # time the loop waited for room / the
                                                      # thread for entries (who is the bottleneck)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Iterator, Sequence

from offload.shell import OffloadError


class PipeStoppedError(OffloadError):
    """The consumer of an EntryPipe stopped (finished or failed) before the producer was done."""


class EntryPipe:
    def __init__(self, bytes_max: int) -> None:
        if bytes_max <= 0:
            raise ValueError(f"bytes_max {bytes_max} <= 0")
        self.bytes_max = bytes_max
        self.bytes_held = 0
        self.bytes_held_max = 0
        self._loop = asyncio.get_running_loop()
        self._cond = threading.Condition()
        self._batches: deque[tuple[Sequence[tuple[int, bytes]], int]] = deque()
        self._closed = False                       # the producer is done
        self._error: BaseException | None = None   # the producer failed
        self._stopped = False                      # the consumer is done
        self._room = asyncio.Event()
        self.put_wait_s = 0.0
        self.take_wait_s = 0.0

    # -- the event loop's side ------------------------------------------------------------------
    async def put(self, batch: Sequence[tuple[int, bytes]]) -> None:
        """Hand ``batch`` on; waits while it would take the pipe over ``bytes_max`` (a batch
        alone bigger than that goes in once the pipe is empty). PipeStoppedError when the
        consumer stopped."""
        size = sum(len(payload) for _, payload in batch)
        while True:
            with self._cond:
                if self._stopped:
                    raise PipeStoppedError("the encoder stopped before the last entry was read")
                if self.bytes_held == 0 or self.bytes_held + size <= self.bytes_max:
                    self._batches.append((batch, size))
                    self.bytes_held += size
                    self.bytes_held_max = max(self.bytes_held_max, self.bytes_held)
                    self._cond.notify_all()
                    return
                self._room.clear()       # under the lock: a take after this sets it again
            started = time.monotonic()
            await self._room.wait()
            self.put_wait_s += time.monotonic() - started

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self._cond:
            if not self._closed:
                self._error = exc
                self._closed = True
            self._cond.notify_all()

    # -- the worker thread's side ----------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        while True:
            with self._cond:
                if not self._batches and not self._closed:
                    started = time.monotonic()
                    while not self._batches and not self._closed:
                        self._cond.wait()
                    self.take_wait_s += time.monotonic() - started
                if self._error is not None:
                    raise OffloadError(f"reading the ledger failed: {type(self._error).__name__}: "
                                       f"{self._error}")
                if not self._batches:
                    return
                batch, size = self._batches.popleft()
                self.bytes_held -= size
            self._loop.call_soon_threadsafe(self._room.set)
            yield from batch
            del batch

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
        try:
            self._loop.call_soon_threadsafe(self._room.set)
        except RuntimeError:
            pass                 # the loop is closed: nobody waits


__all__ = ["EntryPipe", "PipeStoppedError"]
