"""The broker's view of ownership by topic: :class:`ManagedOwnership` puts
:class:`broker.ownership.shell.OwnershipManager` behind what the service, the connection and the
admin API call (``lookup`` answered with the owner's URLs for an advertised listener, ``owns``,
``write_guard`` on the publish path, ``ensure_owned``, ``add_lost_listener``), and
:func:`make_ownership` builds it from the broker's settings.
"""

from __future__ import annotations

from typing import Any, Callable

from broker.errors import ServiceNotReadyError
from broker.ownership.shell import OwnershipManager
from pulsarlite.metadata import SessionState


class ManagedOwnership:
    """OwnershipManager by topic (the manager also registers /loadbalance/brokers/<id>)."""

    def __init__(self, manager: OwnershipManager) -> None:
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
                   listeners: dict[str, tuple[str, str]] | None = None,
                   dead_owner_wait_s: float = 0.0) -> ManagedOwnership:
    """``lease_ms``: see OwnershipManager; the broker passes half its ZooKeeper session timeout
    (and its session timeout plus 1 s as ``dead_owner_wait_s``).
    The TLS URLs ("" without such a listener) are published beside the plain ones, and the
    advertised listeners (BrokerConfig.listeners()) beside them."""
    return ManagedOwnership(OwnershipManager(store, broker_id, pulsar_url=service_url,
                                             http_url=web_service_url, lease_ms=lease_ms,
                                             dead_owner_wait_s=dead_owner_wait_s,
                                             pulsar_url_tls=service_url_tls, http_url_tls=web_service_url_tls,
                                             listeners=tuple((name, url, url_tls) for name, (url, url_tls)
                                                             in (listeners or {}).items())))


__all__ = ["ManagedOwnership", "check_listener_name", "listener_urls", "make_ownership"]
