"""Seams to components written beside the broker (topic names, ownership, durable cursors).

Each seam prefers the real module when it is importable and falls back to a small stand-in
otherwise, so the broker runs before those land. The lead switches a seam over by deleting its
fallback; the rest of the broker only uses the names defined here:

- :func:`parse_topic` -> object with ``tenant, namespace, local_name, partition_index,
  managed_ledger_name, __str__`` (``pulsarlite.topic_name.TopicName.parse``);
  :data:`InvalidTopicNameError`.
- :func:`make_ownership` -> object with ``async lookup(topic) -> service URL``,
  ``owns(topic) -> bool``, ``async start()``, ``async close()``, ``add_lost_listener(cb)``
  (``broker.ownership.OwnershipManager``). Fallback: this broker owns every topic.
- :func:`open_cursor` -> object with ``mark_delete_position``, ``is_acked(pos)``,
  ``ack_individual(pos, batch_index=None, batch_size=None)``, ``ack_cumulative(pos)``,
  ``async flush()``, ``async delete()``, ``async close()`` (``broker.cursor.ManagedCursor``).
  Fallback: an in-memory cursor (survives consumer reconnects, not broker restarts).
"""

from __future__ import annotations

import inspect
import logging
import re
from dataclasses import dataclass
from typing import Any, Callable

from sortedcontainers import SortedSet

from broker.managed_ledger import Position
from pulsarlite.errors import PulsarliteError

log = logging.getLogger("pulsarlite.broker")

# -- topic names --------------------------------------------------------------------------------
try:  # pragma: no cover - depends on the other helper's module
    from pulsarlite.topic_name import InvalidTopicNameError, TopicName as _RealTopicName  # type: ignore

    def parse_topic(name: str):
        return _RealTopicName.parse(name)

    HAVE_TOPIC_NAME = True
except ImportError:
    HAVE_TOPIC_NAME = False

    class InvalidTopicNameError(PulsarliteError):  # type: ignore[no-redef]
        """A topic name that does not parse."""

    _SEGMENT = re.compile(r"^[A-Za-z0-9_.=:%-]+$")
    _PARTITION = re.compile(r"^(.*)-partition-(\d+)$")

    @dataclass(frozen=True)
    class _TopicName:
        domain: str
        tenant: str
        namespace: str
        local_name: str

        @property
        def partition_index(self) -> int:
            m = _PARTITION.match(self.local_name)
            return int(m.group(2)) if m else -1

        @property
        def managed_ledger_name(self) -> str:
            return f"{self.tenant}/{self.namespace}/persistent/{self.local_name}"

        def __str__(self) -> str:
            return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local_name}"

    def parse_topic(name: str) -> _TopicName:  # type: ignore[misc]
        if not isinstance(name, str) or not name:
            raise InvalidTopicNameError(f"invalid topic name {name!r}")
        domain = "persistent"
        rest = name
        if "://" in name:
            domain, _, rest = name.partition("://")
        parts = rest.split("/")
        if len(parts) == 1 and "://" not in name:
            parts = ["public", "default", parts[0]]
        elif len(parts) == 3 and "://" not in name:
            pass
        if len(parts) != 3 or domain not in ("persistent", "non-persistent"):
            raise InvalidTopicNameError(f"invalid topic name {name!r}")
        if not all(_SEGMENT.match(p) for p in parts):
            raise InvalidTopicNameError(f"invalid topic name {name!r}")
        return _TopicName(domain, *parts)


# -- ownership ----------------------------------------------------------------------------------
class SingleBrokerOwnership:
    """Stand-in: this broker owns every topic."""

    registers_broker = False

    def __init__(self, service_url: str) -> None:
        self.service_url = service_url

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def lookup(self, topic, *, authoritative: bool = False) -> tuple[str, bool, bool]:
        """(service URL of the owner, owned by us, authoritative)."""
        return self.service_url, True, True

    def owns(self, topic) -> bool:
        return True

    def write_guard(self, topic) -> Callable[[], bool]:
        return _always

    async def ensure_owned(self, topic) -> bool:
        return True

    def add_lost_listener(self, callback: Callable[[Callable[[Any], bool]], None]) -> None:
        pass


def _always() -> bool:
    return True


class ManagedOwnership:
    """broker.ownership.OwnershipManager behind the same interface (it also registers
    /loadbalance/brokers/<id>)."""

    registers_broker = True

    def __init__(self, manager) -> None:
        self.manager = manager

    async def start(self) -> None:
        await self.manager.start()

    async def close(self) -> None:
        await self.manager.close()

    async def lookup(self, topic, *, authoritative: bool = False) -> tuple[str, bool, bool]:
        result = await self.manager.lookup(topic, authoritative=authoritative)
        return result.pulsar_url, result.owned_by_self, result.authoritative or result.owned_by_self

    def owns(self, topic) -> bool:
        return self.manager.owns(topic)

    def write_guard(self, topic) -> Callable[[], bool]:
        """A cheap check for the publish path: False as soon as the topic's bundle is not ours
        or the ZooKeeper session is not trusted (SUSPENDED or LOST), so a broker that may have
        lost its topics stops writing at once rather than relying on the bookies' fencing."""
        bundle = self.manager.bundle_of(topic)
        owns_bundle = self.manager.owns_bundle
        return lambda: owns_bundle(bundle)

    async def ensure_owned(self, topic) -> bool:
        if self.manager.owns(topic):
            return True
        url, ours, _ = await self.lookup(topic, authoritative=True)
        return ours

    def add_lost_listener(self, callback: Callable[[Callable[[Any], bool]], None]) -> None:
        """``callback(is_lost(topic) -> bool)`` when bundles are lost for good (session LOST)."""
        from pulsarlite.metadata import SessionState

        def on_change(bundles, state) -> None:
            if state is SessionState.LOST:
                callback(lambda topic: self.manager.bundle_of(topic) in bundles)

        self.manager.add_ownership_listener(on_change)


def make_ownership(store, broker_id: str, service_url: str, web_service_url: str, *,
                   lease_ms: int | None = None):
    """``lease_ms``: see OwnershipManager; the broker passes half its ZooKeeper session timeout."""
    from broker.ownership import OwnershipManager

    return ManagedOwnership(OwnershipManager(store, broker_id, pulsar_url=service_url,
                                             http_url=web_service_url, lease_ms=lease_ms))


# -- cursors ------------------------------------------------------------------------------------
class MemoryCursor:
    """In-memory durable-cursor stand-in: mark-delete position + individually acked positions
    above it (the gap between them is what is unacked)."""

    def __init__(self, initial: Position, ledgers_of: Callable[[], tuple]) -> None:
        self.mark_delete_position = initial
        self._acked: SortedSet = SortedSet()
        self._ledgers_of = ledgers_of

    def is_acked(self, position: Position) -> bool:
        return position <= self.mark_delete_position or position in self._acked

    def ack_individual(self, position: Position, batch_index: int | None = None,
                       batch_size: int | None = None) -> None:
        if batch_index is not None:
            return   # partial batch acks are not tracked by the stand-in: the entry stays unacked
        if position > self.mark_delete_position:
            self._acked.add(position)
            self._advance()

    def ack_cumulative(self, position: Position) -> None:
        if position > self.mark_delete_position:
            self.mark_delete_position = position
            while self._acked and self._acked[0] <= position:
                self._acked.pop(0)
            self._advance()

    def _advance(self) -> None:
        from broker.managed_ledger import next_position
        ledgers = self._ledgers_of()
        while self._acked:
            try:
                nxt = next_position(ledgers, self.mark_delete_position)
            except ValueError:
                return
            if self._acked[0] != nxt:
                return
            self.mark_delete_position = self._acked.pop(0)

    async def flush(self) -> None:
        pass

    async def delete(self) -> None:
        self._acked.clear()

    async def close(self) -> None:
        pass


async def open_cursor(store, ml_name: str, cursor_name: str, *, initial: Position, durable: bool,
                      ledgers_of: Callable[[], tuple]):
    """Open (or create at ``initial``, the mark-delete position) a subscription's cursor."""
    if durable:
        try:  # pragma: no cover - depends on the other helper's module
            from broker.cursor import ManagedCursor  # type: ignore
        except ImportError:
            ManagedCursor = None
        if ManagedCursor is not None:
            opened = ManagedCursor.open(store, ml_name, cursor_name, initial=initial, durable=True,
                                        ledgers=ledgers_of())
            return await opened if inspect.isawaitable(opened) else opened
    return MemoryCursor(initial, ledgers_of)


__all__ = ["InvalidTopicNameError", "MemoryCursor", "SingleBrokerOwnership", "make_ownership",
           "open_cursor", "parse_topic"]
