"""The broker's seams to its components: topic names, ownership, cursors.

- :func:`parse_topic` (``pulsarlite.topic_name.TopicName.parse``) and :data:`InvalidTopicNameError`.
- :func:`make_ownership` -> :class:`ManagedOwnership` over ``broker.ownership.OwnershipManager``:
  ``lookup``, ``owns``, ``write_guard`` (the cheap check on the publish path), ``ensure_owned``,
  ``add_lost_listener``.
- :func:`open_cursor`: a durable subscription's ``broker.cursor.ManagedCursor`` (state in
  ZooKeeper), or, for non-durable subscriptions (readers), an in-memory :class:`MemoryCursor`;
  both are :class:`SubscriptionCursor`.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Protocol

from sortedcontainers import SortedSet

from broker.cursor import ManagedCursor
from broker.errors import ServiceNotReadyError
from broker.managed_ledger import Position, next_position
from pulsarlite.topic_name import InvalidTopicNameError, TopicName

log = logging.getLogger("pulsarlite.broker")

# -- topic names --------------------------------------------------------------------------------
def parse_topic(name: str) -> TopicName:
    return TopicName.parse(name)


# -- ownership ----------------------------------------------------------------------------------
def _always() -> bool:
    return True


class ManagedOwnership:
    """broker.ownership.OwnershipManager behind the same interface (it also registers
    /loadbalance/brokers/<id>)."""

    def __init__(self, manager) -> None:
        self.manager = manager

    async def start(self) -> None:
        await self.manager.start()

    async def close(self) -> None:
        await self.manager.close()

    async def lookup(self, topic, *, authoritative: bool = False,
                     listener_name: str = "") -> tuple[str, bool, bool, str]:
        """(owner's pulsar:// URL, ours, authoritative, owner's pulsar+ssl:// URL or ""); with
        ``listener_name`` (the LOOKUP's advertised_listener_name) that listener's URLs of the
        owner, as Pulsar's lookup: ServiceNotReadyError when this broker does not advertise the
        name ("the advertised listener name ... is not found") or the owner does not."""
        check_listener_name(self.manager.listeners, listener_name)
        result = await self.manager.lookup(topic, authoritative=authoritative)
        url, url_tls = listener_urls(result, listener_name)
        return url, result.owned_by_self, result.authoritative or result.owned_by_self, url_tls

    def owns(self, topic) -> bool:
        return self.manager.owns(topic)

    def write_guard(self, topic) -> Callable[[], bool]:
        """A cheap check for the publish path: False as soon as the topic's bundle is not ours
        or the ZooKeeper session is not trusted (SUSPENDED or LOST), so a broker that may have
        lost its topics stops writing at once rather than relying on the bookies' fencing."""
        bundle = self.manager.bundle_of(topic)
        owns_bundle = self.manager.owns_bundle
        return lambda: owns_bundle(bundle)

    def list_guard(self) -> Callable[[], bool]:
        """What a managed ledger checks before writing its list: this broker's ZooKeeper
        session is the one it loaded the topic under and is trusted now (see
        OwnershipManager.session_guard)."""
        return self.manager.session_guard()

    async def ensure_owned(self, topic) -> bool:
        if self.manager.owns(topic):
            return True
        _, ours, _, _ = await self.lookup(topic, authoritative=True)
        return ours

    def add_lost_listener(self, callback: Callable[[Callable[[Any], bool]], None]) -> None:
        """``callback(is_lost(topic) -> bool)`` when bundles are lost for good (session LOST)."""
        from pulsarlite.metadata import SessionState

        def on_change(bundles, state) -> None:
            if state is SessionState.LOST:
                callback(lambda topic: self.manager.bundle_of(topic) in bundles)

        self.manager.add_ownership_listener(on_change)


def check_listener_name(own_listeners, listener_name: str) -> None:
    """ServiceNotReadyError when a lookup names a listener this broker does not advertise (Pulsar
    checks its own listeners before it looks the topic up); "" names none."""
    if listener_name and listener_name not in {name for name, _, _ in own_listeners}:
        raise ServiceNotReadyError(f"the advertised listener name {listener_name} is not found")


def listener_urls(result, listener_name: str) -> tuple[str, str]:
    """(pulsar:// URL, pulsar+ssl:// URL or "") of a lookup's owner for ``listener_name`` (""
    names none: the owner's service URLs); ServiceNotReadyError if the owner lacks it."""
    if not listener_name:
        return result.pulsar_url, result.pulsar_url_tls
    for name, url, url_tls in result.listeners:
        if name == listener_name:
            return url, url_tls
    raise ServiceNotReadyError(f"the broker {result.broker_id} does not have the advertised listener {listener_name}")


def make_ownership(store, broker_id: str, service_url: str, web_service_url: str, *,
                   lease_ms: int | None = None, service_url_tls: str = "", web_service_url_tls: str = "",
                   listeners: dict[str, tuple[str, str]] | None = None, dead_owner_wait_s: float = 0.0):
    """``lease_ms``: see OwnershipManager; the broker passes half its ZooKeeper session timeout
    (and its session timeout plus 1 s as ``dead_owner_wait_s``).
    The TLS URLs ("" without such a listener) are published beside the plain ones, and the
    advertised listeners (BrokerConfig.listeners()) beside them."""
    from broker.ownership import OwnershipManager

    return ManagedOwnership(OwnershipManager(store, broker_id, pulsar_url=service_url,
                                             http_url=web_service_url, lease_ms=lease_ms,
                                             dead_owner_wait_s=dead_owner_wait_s,
                                             pulsar_url_tls=service_url_tls, http_url_tls=web_service_url_tls,
                                             listeners=tuple((name, url, url_tls) for name, (url, url_tls)
                                                             in (listeners or {}).items())))


# -- cursors ------------------------------------------------------------------------------------
class SubscriptionCursor(Protocol):
    """What subscriptions, stats and retention call on a cursor: ``broker.cursor.ManagedCursor``
    (durable) and :class:`MemoryCursor` (a reader's)."""

    @property
    def mark_delete_position(self) -> Position: ...

    def is_acked(self, position: Position) -> bool: ...

    def ack_individual(self, position: Position, *, batch_index: int | None = None,
                       batch_size: int | None = None) -> object: ...

    def ack_cumulative(self, position: Position) -> object: ...

    def ack_set(self, position: Position, words, batch_size: int | None = None) -> bool: ...

    def remaining_ack_set(self, position: Position, batch_size: int) -> list[int] | None: ...

    def backlog(self, last_confirmed: Position, ledgers) -> int:
        """Entries after mark-delete up to ``last_confirmed`` not acked (``ledgers``: the list)."""

    def reset(self, position: Position) -> None: ...

    async def flush(self) -> None: ...

    async def delete(self) -> None: ...

    async def close(self) -> None: ...


class MemoryCursor:
    """The cursor of a non-durable subscription (a reader): mark-delete position + individually
    acked positions above it, in memory only. The durable cursor's interface (what a
    subscription calls), without batch-index tracking: a partly acked batch stays unacked."""

    durable = False

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
        ledgers = self._ledgers_of()
        while self._acked:
            try:
                nxt = next_position(ledgers, self.mark_delete_position)
            except ValueError:
                return
            if self._acked[0] != nxt:
                return
            self.mark_delete_position = self._acked.pop(0)

    def ack_set(self, position: Position, words, batch_size: int | None = None) -> bool:
        """A partial batch ack: not tracked here (the entry stays unacked)."""
        return False

    def remaining_ack_set(self, position: Position, batch_size: int) -> list[int] | None:
        """The indexes still to deliver: all of them unless the entry is acked."""
        return [] if self.is_acked(position) else None

    def backlog(self, last_confirmed: Position, ledgers) -> int:
        """Entries after mark_delete by the ledger list (acks above it are not counted off)."""
        md = self.mark_delete_position
        total = 0
        for info in ledgers:
            if info.ledger_id > md.ledger_id:
                total += info.entries
            elif info.ledger_id == md.ledger_id:
                total += max(0, info.entries - md.entry_id - 1)
        return total

    def reset(self, position: Position) -> None:
        """Seek: ``position`` is delivered next."""
        self.mark_delete_position = Position(position.ledger_id, position.entry_id - 1)
        self._acked.clear()

    async def flush(self) -> None:
        pass

    async def delete(self) -> None:
        self._acked.clear()

    async def close(self) -> None:
        pass


async def open_cursor(store, ml_name: str, cursor_name: str, *, initial: Position, durable: bool,
                      ledgers_of: Callable[[], tuple]) -> SubscriptionCursor:
    """Open (or create at ``initial``, the mark-delete position) a subscription's cursor."""
    if durable:
        # the function, not a snapshot: mark-delete must follow the list into new ledgers
        return await ManagedCursor.open(store, ml_name, cursor_name, initial=initial, durable=True,
                                        ledgers=ledgers_of)
    return MemoryCursor(initial, ledgers_of)


__all__ = ["InvalidTopicNameError", "ManagedOwnership", "MemoryCursor", "SubscriptionCursor", "make_ownership",
           "open_cursor", "parse_topic"]
