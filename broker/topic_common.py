"""What persistent and non-persistent topics share (one path for both shells):

- :class:`ExclusiveAccess`: the producer access modes (Pulsar's ``ProducerAccessMode``).
  ``admit`` refuses a producer whose name is taken or whose access mode conflicts: Shared while
  an exclusive producer holds the topic -> ProducerBusyError; Exclusive/WaitForExclusive while
  one holds it or others are connected -> ProducerFencedError; ExclusiveWithFencing closes the
  others first. ``wait`` is WaitForExclusive: it returns once no producer is connected, FIFO
  among waiters; the caller then adds its producer at once (same loop turn).
- :func:`check_edge`: the checks a SEND passes before a topic takes it (metadata readable, a
  message's payload within ``message_bytes_max``, a compressed entry's declared size within
  ``message_uncompressed_bytes_max``).
- :func:`attach_consumer` / :func:`detach_consumer`: a consumer joins or leaves a subscription's
  dispatcher core, with :func:`notify_active_change` (Failover's ACTIVE_CONSUMER_CHANGE).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Callable

from broker.dispatch import SubType
from broker.errors import NotAllowedError, ProducerBusyError, ProducerFencedError, ServiceNotReadyError
from broker.publish_core import AccessMode, Producer
from pulsarlite.wire.entry import check_sendable, peek_metadata

log = logging.getLogger("pulsarlite.broker")


class ExclusiveAccess:
    """The producer holding exclusive access to one topic, and the WaitForExclusive waiters."""

    def __init__(self, topic_key: str) -> None:
        self.topic_key = topic_key
        self.holder: Producer | None = None
        self.waiters: deque[asyncio.Future] = deque()

    def admit(self, name: str, access_mode: AccessMode, producers: dict[str, Producer],
              fence: Callable[[Producer], None]) -> None:
        """Raise if a producer ``name`` with ``access_mode`` may not join ``producers``;
        ExclusiveWithFencing calls ``fence`` on each connected producer first."""
        if name in producers:
            raise ProducerBusyError(f"producer {name!r} is already connected to {self.topic_key}")
        exclusive = access_mode is not AccessMode.SHARED
        if access_mode is AccessMode.EXCLUSIVE_WITH_FENCING:
            for other in list(producers.values()):
                log.info("topic %s: producer %s fenced by exclusive producer %s", self.topic_key, other.name, name)
                fence(other)
        elif self.holder is not None:
            # as Pulsar: another exclusive one is fenced, a shared one is busy
            error = ProducerFencedError if exclusive else ProducerBusyError
            raise error(f"topic {self.topic_key} has an exclusive producer ({self.holder.name})")
        elif exclusive and producers:
            raise ProducerFencedError(f"topic {self.topic_key} has {len(producers)} producer(s): "
                                      f"{access_mode.name} access refused")

    def added(self, producer: Producer) -> None:
        """``producer`` (admitted) joined the topic."""
        if producer.access_mode is not AccessMode.SHARED:
            self.holder = producer

    def removed(self, producer: Producer, producers: dict[str, Producer]) -> None:
        """``producer`` left (``producers``: those still connected): wake the first waiter if
        the topic is free."""
        if self.holder is producer:
            self.holder = None
        if self.available(producers):
            while self.waiters:
                fut = self.waiters.popleft()
                if not fut.done():
                    fut.set_result(None)
                    return

    def available(self, producers: dict[str, Producer]) -> bool:
        return self.holder is None and not producers

    async def wait(self, producers: dict[str, Producer], closing: Callable[[], bool]) -> None:
        """WaitForExclusive (see the module docstring); ServiceNotReadyError once ``closing()``."""
        while not self.available(producers) or self.waiters:
            if closing():
                raise ServiceNotReadyError(f"topic {self.topic_key} is closing")
            fut = asyncio.get_running_loop().create_future()
            self.waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self.waiters:
                    self.waiters.remove(fut)
            if self.available(producers):
                return

    def release_waiters(self) -> None:
        """The topic closes: every waiter returns (and finds it closing)."""
        for fut in self.waiters:
            if not fut.done():
                fut.set_result(None)


def check_edge(data: bytes, message_bytes_max: int, uncompressed_bytes_max: int):
    """The entry's metadata (``peek_metadata``) if a topic may take it, else NotAllowedError /
    the wire error: the advertised maximum bounds a message's payload (the clients check it
    themselves; the frame limit leaves room for the metadata, and for a batch's framing: a batch
    is bounded by the frame only, as in Pulsar); a compressed entry's declared size is bounded by
    ``uncompressed_bytes_max`` (the official producers bound the COMPRESSED size)."""
    meta = peek_metadata(data)
    if len(data) - meta.payload_offset > message_bytes_max and not meta.batched:
        raise NotAllowedError("Exceed maximum message size")
    check_sendable(data, meta, uncompressed_bytes_max=uncompressed_bytes_max)
    return meta


def attach_consumer(sub_type: SubType, core, consumers: dict, consumer, *, priority: int, name: str,
                    hash_ranges, writable: bool | None = None) -> None:
    """A consumer joins a subscription: into its dispatcher ``core`` (ConsumerBusyError for a 2nd
    exclusive consumer, ConsumerAssignError for bad sticky ranges; ``writable`` given: its
    connection's state) and ``consumers`` (``id(handle) -> handle``), then Failover's notice."""
    before = core.active_consumer()
    core.add_consumer(id(consumer), priority=priority, name=name, hash_ranges=hash_ranges)
    if writable is not None:
        core.set_writable(id(consumer), writable)
    consumers[id(consumer)] = consumer
    notify_active_change(sub_type, core, consumers, before, consumer)


def detach_consumer(sub_type: SubType, core, consumers: dict, consumer) -> bool:
    """A consumer leaves: out of ``consumers`` and the ``core``, then Failover's notice; False
    (nothing done) if it was not there."""
    if consumers.pop(id(consumer), None) is None:
        return False
    before = core.active_consumer()
    core.remove_consumer(id(consumer))
    notify_active_change(sub_type, core, consumers, before)
    return True


def notify_active_change(sub_type: SubType, core, consumers: dict, before, new=None) -> None:
    """Failover: ACTIVE_CONSUMER_CHANGE to every consumer when the active one changed (``before``:
    the core's active consumer before the change), else to the new consumer only."""
    if sub_type is not SubType.FAILOVER:
        return
    active = core.active_consumer()
    targets = list(consumers.values()) if active != before else ([new] if new is not None else [])
    for handle in targets:
        handle.send_active_change(id(handle) == active)


__all__ = ["ExclusiveAccess", "attach_consumer", "check_edge", "detach_consumer", "notify_active_change"]
