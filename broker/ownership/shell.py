"""The ownership shell: executes the core's decisions against ZooKeeper
(docs/protocol.md#zookeeper-layout, docs/architecture.md#style).

ZooKeeper layout::

    /loadbalance/brokers/<broker-id>      ephemeral, JSON {"broker_id", "pulsar_url", "http_url",
                                          "load": {"bundles": n, "topics": n}}
    /namespace/<tenant>/<ns>/<range>      ephemeral, JSON {"broker_id", "pulsar_url", "http_url"}:
                                          the bundle's owner (created by the owner's session)

Both hold a :class:`~pulsarlite.metadata_documents.BrokerRecord` (its codec, shared with the admin
console, is in pulsarlite/metadata_documents.py).

Session handling (kazoo states through :class:`MetadataStore`):

- SUSPENDED: every OWNED bundle becomes SUSPECT at once; :meth:`OwnershipManager.owns` answers
  False; listeners get ``(bundles, SessionState.SUSPENDED)``: stop serving writes.
- CONNECTED with the same session: the ephemerals survived; SUSPECT bundles are OWNED again;
  listeners get ``(bundles, SessionState.CONNECTED)``: serve again.
- LOST (session expired): every bundle is gone for good (the znodes were deleted by ZooKeeper);
  listeners get ``(bundles, SessionState.LOST)``: close the topics. When the store reconnects with
  a new session, the broker registers again but owns nothing until a LOOKUP acquires again.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import urllib.parse
from dataclasses import dataclass, replace
from typing import Any, Callable

from broker.ownership.core import (AcquireSelf, BrokerLoad, BundleState, Connect, Fail, OwnershipError,
                                   OwnershipTable, Redirect, SessionTrust, broker_path, bundle_key,
                                   bundle_path, check_broker_id, check_bundles_per_namespace,
                                   decide_lookup, is_bundle_key)
from pulsarlite import metadata_layout as layout
from pulsarlite.errors import MetadataError, MetadataNotFoundError
from pulsarlite.metadata import MetadataExistsError, MetadataStore, SessionState
from pulsarlite.metadata_documents import BrokerRecord, decode_broker_record, encode_broker_record
from pulsarlite.topic_name import TopicName

log = logging.getLogger(__name__)

OwnershipListener = Callable[[frozenset, SessionState], Any]

DEAD_OWNER_PROBE_S = 1.0     # a TCP connect to an owner's service port: refused = its process is gone
DEAD_OWNER_POLL_S = 0.1      # how often a held LOOKUP reads the dead owner's znode again

_TRUST = {SessionState.CONNECTED: SessionTrust.CONNECTED, SessionState.SUSPENDED: SessionTrust.SUSPENDED,
          SessionState.LOST: SessionTrust.LOST}


@dataclass(frozen=True)
class LookupResult:
    """The answer to a LOOKUP: where the client should go. ``owned_by_self`` -> Connect here;
    otherwise Redirect to ``pulsar_url`` with ``authoritative`` set as given."""

    pulsar_url: str
    http_url: str
    owned_by_self: bool
    authoritative: bool
    broker_id: str
    pulsar_url_tls: str = ""      # pulsar+ssl://host:port of that broker; "" without a TLS listener
    http_url_tls: str = ""        # https://host:port; "" without one
    # that broker's advertised listeners: ((name, pulsar URL or "", pulsar+ssl URL or ""), ...)
    listeners: tuple[tuple[str, str, str], ...] = ()

    @property
    def redirect(self) -> bool:
        return not self.owned_by_self


@dataclass(frozen=True)
class BrokerInfo:
    broker_id: str
    pulsar_url: str
    http_url: str
    load: BrokerLoad
    pulsar_url_tls: str = ""
    http_url_tls: str = ""
    listeners: tuple[tuple[str, str, str], ...] = ()   # (name, pulsar URL, pulsar+ssl URL)


def _broker_info(broker_id: str, record: BrokerRecord, load: BrokerLoad) -> BrokerInfo:
    """A broker's URLs from its owner or registration znode's record."""
    return BrokerInfo(broker_id, record.pulsar_url, record.http_url, load, record.pulsar_url_tls,
                      record.http_url_tls, record.listeners)


def _redirect_to(info: BrokerInfo, *, authoritative: bool) -> LookupResult:
    """A lookup's answer naming another broker."""
    return LookupResult(info.pulsar_url, info.http_url, owned_by_self=False, authoritative=authoritative,
                        broker_id=info.broker_id, pulsar_url_tls=info.pulsar_url_tls, http_url_tls=info.http_url_tls,
                        listeners=info.listeners)


class OwnershipManager:
    """Bundle ownership and LOOKUP for one broker. Use from the loop that owns ``store``."""

    def __init__(self, store: MetadataStore, broker_id: str, *, pulsar_url: str, http_url: str,
                 pulsar_url_tls: str = "", http_url_tls: str = "",
                 listeners: tuple[tuple[str, str, str], ...] = (),
                 bundles_per_namespace: int = 4, rng: random.Random | None = None,
                 registration_stale_wait_s: float = 30.0, lookup_attempts_max: int = 5,
                 lease_ms: int | None = None, clock: Callable[[], float] = time.monotonic,
                 dead_owner_wait_s: float = 0.0) -> None:
        """``dead_owner_wait_s`` (> 0: the broker passes its session timeout plus 1 s): a LOOKUP
        whose bundle is owned by a broker that refuses connections on its service port (killed:
        its ephemeral znode lives until its session expires) is held until that znode goes, at
        most this long, and then answered (this broker or another takes the bundle), instead of
        redirecting the client to the dead broker, which sends it into its reconnect backoff
        (measured: the service came back 2.2 s after the expiry, BENCHMARKS.md "[perf] Session
        16"). Only a refused connection counts: a broker that cannot be reached (timeout) is
        redirected to as before. ``lease_ms`` (below the ZooKeeper session timeout): ownership is trusted only within
        ``lease_ms`` of the last ZooKeeper round trip known to have succeeded (timed from when it
        was sent). A broker paused or cut off longer than that (SIGSTOP, a long GC or loop stall)
        stops serving at once on waking, before kazoo has even noticed its session expired."""
        self.store = store
        self.broker_id = check_broker_id(broker_id)
        self.pulsar_url = pulsar_url
        self.http_url = http_url
        self.pulsar_url_tls = pulsar_url_tls
        self.http_url_tls = http_url_tls
        self.listeners = tuple(listeners)
        self.bundles_per_namespace = check_bundles_per_namespace(bundles_per_namespace)
        if registration_stale_wait_s < 0 or lookup_attempts_max < 1 or dead_owner_wait_s < 0:
            raise ValueError("registration_stale_wait_s and dead_owner_wait_s must be >= 0 and "
                             "lookup_attempts_max >= 1")
        self._dead_owner_wait_s = dead_owner_wait_s
        self._rng = rng if rng is not None else random.Random()
        self._registration_stale_wait_s = registration_stale_wait_s
        self._lookup_attempts_max = lookup_attempts_max
        self._table = OwnershipTable(store.session_id)
        self._topics = 0
        self._listeners: list[OwnershipListener] = []
        self._acquisitions: dict[str, asyncio.Task] = {}
        # bundle -> (broker id, expiry on self._clock): a bundle with no owner that this broker
        # redirected a client to another broker for. Counted in that broker's load until it
        # expires, so concurrent lookups (a client looking up every partition at once) spread
        # over the brokers instead of all landing on the one that looked least loaded; and a
        # second lookup of the same bundle is sent to the same broker.
        # Each promise keeps the target's published bundle count when it was made: promises
        # count only as far as that count has not grown since (the target publishes its load
        # when it acquires), so a kept promise is not counted twice.
        self._promises: dict[str, tuple[str, float, int]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._load_lock = asyncio.Lock()
        self._registered_session: int | None = None
        self._started = False
        self._closed = False
        if lease_ms is not None and lease_ms <= 0:
            raise ValueError(f"lease_ms must be > 0, got {lease_ms}")
        self._lease_s = None if lease_ms is None else lease_ms / 1000
        self._clock = clock
        self._lease_confirmed = clock()  # the session was just connected when we were built

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Register ``/loadbalance/brokers/<broker_id>`` (waiting up to
        ``registration_stale_wait_s`` for a node left by an earlier session of this id) and
        follow the session. MetadataExistsError if another live session holds the id."""
        if self._started:
            return
        self._started = True
        self._table.session = _TRUST[self.store.state]
        self.store.add_session_listener(self._on_session)
        await self._register()
        if self._lease_s is not None:
            self._lease_confirmed = self._clock()
            self._spawn_lease_heartbeat()

    async def close(self, *, timeout_s: float = 10.0) -> None:
        """Release every bundle (delete our znodes), unregister, stop. Idempotent; the store stays
        open (its owner closes it). The deletes are skipped when the session is not CONNECTED and
        bounded by ``timeout_s`` in all: nodes left behind vanish with the session."""
        if self._closed:
            return
        self._closed = True
        self.store.remove_session_listener(self._on_session)
        pending = list(self._acquisitions.values())
        if pending:  # let creates in flight finish, so their nodes are released below
            _, late = await asyncio.wait(pending, timeout=timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        connected = not self.store.closed and self.store.state is SessionState.CONNECTED
        if connected:
            try:
                async with asyncio.timeout(timeout_s):
                    for bundle in sorted(self._table.held()):
                        try:
                            await self._release_bundle(bundle, publish=False)
                        except MetadataError as e:  # keep releasing the others
                            log.warning("broker %s: releasing %s at close failed: %s", self.broker_id, bundle, e)
                    await self._delete_if_ours(broker_path(self.broker_id))
            except (TimeoutError, MetadataError) as e:
                log.warning("broker %s: close left znodes to the session's end: %s", self.broker_id,
                            e or "timed out")
        elif self._table.held():
            log.warning("broker %s: closing with session %s: bundles %s are released when the session "
                        "ends", self.broker_id, "closed" if self.store.closed else self.store.state.value,
                        sorted(self._table.held()))
        self._table.on_session(SessionTrust.LOST, None)  # whatever is left: never trusted again
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- queries -----------------------------------------------------------------------------
    def bundle_of(self, topic: "str | TopicName") -> str:
        """``tenant/ns/<range>`` of ``topic``."""
        return bundle_key(_persistent(topic), self.bundles_per_namespace)

    def owns(self, topic: "str | TopicName") -> bool:
        """True only while the topic's bundle is OWNED and the session is CONNECTED."""
        bundle = self.bundle_of(topic)
        return self._session_trusted() and self._table.owns(bundle)

    def session_guard(self) -> Callable[[], bool]:
        """True while the session trusted now is the one trusted when this was called (no
        expiry since, which bumps the epoch; not SUSPENDED): what a managed ledger checks before
        writing its list. A voluntary release of a bundle keeps it true (the unloading broker
        closes its list; a CAS conflict tells it if another owner came first)."""
        epoch = self._table.epoch
        table = self._table
        return lambda: table.epoch == epoch and self._session_trusted()

    def owns_bundle(self, bundle: str) -> bool:
        return self._session_trusted() and self._table.owns(bundle)

    def owned_bundles(self) -> frozenset[str]:
        """Bundles served now (empty while the session is SUSPENDED or LOST)."""
        return self._table.owned() if self._session_trusted() else frozenset()

    def bundle_state(self, bundle: str) -> BundleState:
        return self._table.state(bundle)

    def add_ownership_listener(self, callback: OwnershipListener) -> None:
        """``callback(bundles: frozenset[str], state: SessionState)`` runs in the loop:
        SUSPENDED -> these bundles are SUSPECT (stop serving); CONNECTED -> they are OWNED again
        (same session); LOST -> they are gone for good. Not called for an empty set; it must
        not block; exceptions are logged."""
        self._listeners.append(callback)

    def remove_ownership_listener(self, callback: OwnershipListener) -> None:
        try:
            self._listeners.remove(callback)
        except ValueError:
            pass

    # -- lookup ------------------------------------------------------------------------------
    async def lookup(self, topic: "str | TopicName", *, authoritative: bool = False) -> LookupResult:
        """Where ``topic`` is served. A known owner is answered (Connect if it is us, else a
        Redirect to it); with no owner, the least loaded live broker is chosen: if it is us we
        acquire the bundle (on a lost race the winner is answered), else an authoritative
        Redirect to it (that broker then acquires on the client's authoritative LOOKUP).
        Raises OwnershipError (retriable) when no answer can be given now (at once while the
        session is SUSPENDED or before the re-registration after LOST), MetadataError on
        ZooKeeper trouble, InvalidTopicNameError for a bad topic name."""
        self._check_open()
        bundle = self.bundle_of(topic)
        path = bundle_path(bundle)
        for _ in range(self._lookup_attempts_max):
            if not self._session_trusted():
                raise OwnershipError(f"lookup {topic}: broker {self.broker_id}: metadata session "
                                     f"{self.store.state.value}, ownership unknown; retry")
            if self.owns_bundle(bundle):
                return self._self_result()
            pending = self._acquisitions.get(bundle)
            if pending is not None:
                await asyncio.gather(asyncio.shield(pending), return_exceptions=True)
                continue
            owner = await self._read_owner(path)
            if owner is not None:
                self._promises.pop(bundle, None)
            if owner is not None and owner[0].broker_id == self.broker_id \
                    and self._table.state(bundle) is BundleState.NONE \
                    and owner[1] == self.store.session_id and self.store.session_id is not None:
                # left by an acquisition of this session that was declared void: remove, look again
                await self._delete_if_ours(path)
                continue
            brokers: dict[str, BrokerInfo] = {} if owner is not None else await self.live_brokers()
            if owner is None and not authoritative:
                promised = self._promised_to(bundle)
                if promised is not None and promised in brokers and promised != self.broker_id:
                    info = brokers[promised]
                    return _redirect_to(info, authoritative=True)
            decision = decide_lookup(
                owner=owner[0].broker_id if owner is not None else None,
                owned_by_self=self._table.owns(bundle),
                brokers=self._loads_with_promises(brokers),
                self_id=self.broker_id,
                self_trusted=self._session_trusted(),
                authoritative=authoritative, rng=self._rng)
            if isinstance(decision, Connect):
                return self._self_result()
            if isinstance(decision, Redirect):
                if owner is not None and self._dead_owner_wait_s > 0 and owner[0].broker_id != self.broker_id \
                        and await self._refuses_connections(owner[0]):
                    log.info("lookup held topic=%s bundle=%s owner=%s: the owner refuses connections; "
                             "waiting for its znode to go (at most %.1f s)", topic, bundle, owner[0].broker_id,
                             self._dead_owner_wait_s)
                    if await self._wait_owner_gone(path, owner[1]):
                        continue
                info = owner[0] if owner is not None else brokers[decision.broker_id]
                if owner is None:
                    self._promise(bundle, decision.broker_id, info.load.bundles)
                return _redirect_to(info, authoritative=decision.authoritative)
            if isinstance(decision, AcquireSelf):
                if await self._acquire_bundle(bundle):
                    return self._self_result()
                continue  # lost the race (or the session wobbled): read the winner
            if isinstance(decision, Fail):
                raise OwnershipError(f"lookup {topic}: {decision.reason}")
            raise AssertionError(f"unknown decision {decision!r}")  # pragma: no cover
        raise OwnershipError(f"lookup {topic}: no stable answer after {self._lookup_attempts_max} attempts")

    @staticmethod
    async def _refuses_connections(info: BrokerInfo) -> bool:
        """True if the broker's service port refuses a TCP connection (its process is gone)."""
        try:
            url = urllib.parse.urlsplit(info.pulsar_url or info.pulsar_url_tls)
            host, port = url.hostname, url.port
        except ValueError:
            return False
        if not host or not port:
            return False
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), DEAD_OWNER_PROBE_S)
        except ConnectionRefusedError:
            return True
        except (OSError, asyncio.TimeoutError):
            return False
        writer.close()
        return False

    async def _wait_owner_gone(self, path: str, session: int) -> bool:
        """Poll the owner znode until the given session no longer holds it (True), at most
        ``dead_owner_wait_s`` (False; also False at once when our own session is not trusted)."""
        deadline = self._clock() + self._dead_owner_wait_s
        while self._clock() < deadline:
            if not self._session_trusted():
                return False
            got = await self._read_owner(path)
            if got is None or got[1] != session:
                return True
            await asyncio.sleep(DEAD_OWNER_POLL_S)
        return False

    # -- acquire / release ---------------------------------------------------------------------
    async def acquire(self, topic: "str | TopicName") -> bool:
        """Try to own the topic's bundle (create its ephemeral znode). True if we own it now;
        False if another broker does, or our session is not trusted."""
        self._check_open()
        return await self._acquire_bundle(self.bundle_of(topic))

    async def release(self, topic_or_bundle: "str | TopicName") -> bool:
        """Graceful unload: delete our znode of the bundle (a ``tenant/ns/0x..._0x...`` bundle
        name, or any topic in it). True if released, False if we did not hold it. On a
        ZooKeeper error the bundle stays held (OWNED or SUSPECT) and the error propagates."""
        self._check_open()
        if isinstance(topic_or_bundle, str) and "://" not in topic_or_bundle and is_bundle_key(topic_or_bundle):
            bundle = topic_or_bundle
        else:
            bundle = self.bundle_of(topic_or_bundle)
        pending = self._acquisitions.get(bundle)
        if pending is not None:
            await asyncio.gather(asyncio.shield(pending), return_exceptions=True)
        return await self._release_bundle(bundle, publish=True)

    async def update_load(self, topics: int) -> None:
        """Publish how many topics this broker serves (with its bundle count)."""
        if isinstance(topics, bool) or not isinstance(topics, int) or topics < 0:
            raise ValueError(f"topics must be an int >= 0, got {topics!r}")
        self._topics = topics
        await self._publish_load()

    async def live_brokers(self) -> dict[str, BrokerInfo]:
        """Registered brokers and their loads (our own load from memory: it is fresher)."""
        names = await self.store.children(layout.BROKERS_ROOT)
        reads = await asyncio.gather(*(self.store.get_or_none(layout.broker_path(n)) for n in names))
        brokers: dict[str, BrokerInfo] = {}
        for name, read in zip(names, reads):
            if read is None:
                continue  # went away meanwhile
            try:
                record = decode_broker_record(read[0])
                info = _broker_info(name, record, BrokerLoad(record.load_bundles or 0, record.load_topics or 0))
            except ValueError as e:
                log.warning("ignoring malformed broker registration %s: %s", name, e)
                continue
            if name == self.broker_id:
                info = BrokerInfo(name, self.pulsar_url, self.http_url, self._load(),
                                  self.pulsar_url_tls, self.http_url_tls, self.listeners)
            brokers[name] = info
        return brokers

    # -- internals ---------------------------------------------------------------------------
    def _session_trusted(self) -> bool:
        """Our view of the session allows serving: not closed, store open, CONNECTED, and (with
        a lease) ZooKeeper confirmed the session less than ``lease_ms`` ago."""
        return (not self._closed and not self.store.closed and self.store.state is SessionState.CONNECTED
                and self._table.trusted
                and (self._lease_s is None or self._clock() - self._lease_confirmed < self._lease_s))

    def _spawn_lease_heartbeat(self) -> None:
        async def heartbeat() -> None:
            interval_s = self._lease_s / 4
            while not self._closed:
                sent = self._clock()
                try:
                    async with asyncio.timeout(interval_s * 2):
                        await self.store.exists("/")
                    self._lease_confirmed = max(self._lease_confirmed, sent)
                except (MetadataError, TimeoutError):
                    pass  # the lease runs out by itself; the session listener says the rest
                await asyncio.sleep(interval_s)

        task = asyncio.ensure_future(heartbeat())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _check_open(self) -> None:
        if self._closed:
            raise OwnershipError(f"broker {self.broker_id}: ownership manager is closed")
        if not self._started:
            raise OwnershipError(f"broker {self.broker_id}: ownership manager not started")

    def _self_result(self) -> LookupResult:
        return LookupResult(self.pulsar_url, self.http_url, owned_by_self=True, authoritative=False,
                            broker_id=self.broker_id, pulsar_url_tls=self.pulsar_url_tls,
                            http_url_tls=self.http_url_tls, listeners=self.listeners)

    PROMISE_S = 30.0
    PROMISES_MAX = 10_000

    def _promised_to(self, bundle: str) -> str | None:
        got = self._promises.get(bundle)
        if got is None:
            return None
        if got[1] <= self._clock():
            del self._promises[bundle]
            return None
        return got[0]

    def _promise(self, bundle: str, broker_id: str, published_bundles: int) -> None:
        now = self._clock()
        if len(self._promises) >= self.PROMISES_MAX:
            self._promises = {b: p for b, p in self._promises.items() if p[1] > now}
            if len(self._promises) >= self.PROMISES_MAX:       # still full: forget the oldest
                oldest = min(self._promises, key=lambda b: self._promises[b][1])
                del self._promises[oldest]
        self._promises[bundle] = (broker_id, now + self.PROMISE_S, published_bundles)

    def _loads_with_promises(self, brokers: "dict[str, BrokerInfo]") -> dict[str, BrokerLoad]:
        """Live brokers' published loads, ours taken fresh (with acquisitions in flight), and
        every broker's unexpired promises added to its bundle count."""
        now = self._clock()
        promised: dict[str, int] = {}
        base: dict[str, int] = {}
        for b, (broker_id, expiry, published) in self._promises.items():
            if expiry > now:
                promised[broker_id] = promised.get(broker_id, 0) + 1
                base[broker_id] = min(base.get(broker_id, published), published)
        extra = {b: max(0, n - max(0, brokers[b].load.bundles - base[b]))
                 for b, n in promised.items() if b in brokers}
        loads = {}
        for b, info in brokers.items():
            load = info.load
            if b == self.broker_id:
                own = self._load()
                load = BrokerLoad(own.bundles + len(self._acquisitions), own.topics)
            loads[b] = BrokerLoad(load.bundles + extra.get(b, 0), load.topics)
        return loads

    def _load(self) -> BrokerLoad:
        return BrokerLoad(bundles=len(self._table.held()), topics=self._topics)

    def _record(self) -> BrokerRecord:
        """What owner and registration znodes say about this broker (pulsarlite/metadata_documents.py)."""
        return BrokerRecord(self.broker_id, self.pulsar_url, self.http_url, self.pulsar_url_tls, self.http_url_tls,
                            self.listeners)

    def _owner_doc(self) -> bytes:
        return encode_broker_record(self._record())

    def _registration_doc(self) -> bytes:
        load = self._load()
        return encode_broker_record(replace(self._record(), load_bundles=load.bundles, load_topics=load.topics))

    async def _read_owner(self, path: str) -> tuple[BrokerInfo, int] | None:
        """(owner record, owning session id) or None."""
        stat = await self.store.stat(path)
        if stat is None:
            return None
        read = await self.store.get_or_none(path)
        if read is None:
            return None
        try:
            record = decode_broker_record(read[0])
            info = _broker_info(record.broker_id, record, BrokerLoad())
        except ValueError as e:
            raise OwnershipError(f"malformed owner znode {path}: {e}") from None
        return info, stat.ephemeral_owner

    async def _acquire_bundle(self, bundle: str) -> bool:
        if self._session_trusted() and self._table.owns(bundle):
            return True
        pending = self._acquisitions.get(bundle)
        if pending is None:
            if self._table.state(bundle) is not BundleState.NONE or not self._session_trusted():
                return False  # SUSPECT/RELEASING, or the session is not trusted
            pending = asyncio.get_running_loop().create_task(
                self._run_acquire(bundle), name=f"acquire {bundle}")
            self._acquisitions[bundle] = pending
            pending.add_done_callback(lambda t, b=bundle: self._acquisition_done(b, t))
        return await asyncio.shield(pending)

    def _acquisition_done(self, bundle: str, task: asyncio.Task) -> None:
        if self._acquisitions.get(bundle) is task:
            del self._acquisitions[bundle]
        if not task.cancelled() and task.exception() is not None:
            log.debug("acquire %s failed: %s", bundle, task.exception())

    async def _run_acquire(self, bundle: str) -> bool:
        path = bundle_path(bundle)
        epoch = self._table.begin_acquire(bundle)
        try:
            await self.store.create(path, self._owner_doc(), ephemeral=True, make_parents=True)
        except MetadataExistsError:
            self._table.acquire_failed(bundle, epoch)
            return False
        except BaseException:
            # the create may still have happened: a leftover node of this session is removed by
            # the next lookup (state NONE + our session); one of an expired session is gone
            self._table.acquire_failed(bundle, epoch)
            raise
        if not self._table.acquired(bundle, epoch, self.store.session_id):
            self._spawn(self._delete_if_ours(path), f"remove void {bundle}")
            return False
        log.info("broker %s acquired %s", self.broker_id, bundle)
        await self._publish_load()
        return self._session_trusted() and self._table.owns(bundle)

    async def _release_bundle(self, bundle: str, *, publish: bool) -> bool:
        if not self._table.begin_release(bundle):
            return False
        try:
            await self._delete_if_ours(bundle_path(bundle))
        except BaseException:
            self._table.release_failed(bundle)
            raise
        self._table.released(bundle)
        log.info("broker %s released %s", self.broker_id, bundle)
        if publish:
            await self._publish_load()
        return True

    async def _delete_if_ours(self, path: str) -> None:
        stat = await self.store.stat(path)
        if stat is None or stat.ephemeral_owner != self.store.session_id:
            return
        try:
            await self.store.delete(path, stat.version)
        except MetadataNotFoundError:
            pass

    async def _register(self) -> None:
        path = broker_path(self.broker_id)
        deadline = time.monotonic() + self._registration_stale_wait_s
        while True:
            session = self.store.session_id
            try:
                await self.store.create(path, self._registration_doc(), ephemeral=True, make_parents=True)
                break
            except MetadataExistsError:
                stat = await self.store.stat(path)
                if stat is not None and stat.ephemeral_owner == self.store.session_id:
                    await self.store.set(path, self._registration_doc(), -1)
                    break
                if stat is not None and time.monotonic() >= deadline:
                    raise MetadataExistsError(
                        f"broker {self.broker_id}: {path} is held by another session "
                        f"(0x{stat.ephemeral_owner:x}) for more than {self._registration_stale_wait_s}s; "
                        f"is another broker running with this id?") from None
                if stat is not None:
                    await asyncio.sleep(0.1)
        self._registered_session = session
        log.info("broker %s registered (session 0x%x)", self.broker_id, session or 0)

    async def _reregister(self) -> None:
        """After a new session: register again, retrying until it works or we close."""
        delay_s = 0.05
        while not self._closed:
            if self._registered_session == self.store.session_id and self._registered_session is not None:
                return
            try:
                await self.store.wait_connected()
                await self._register()
                return
            except MetadataError as e:
                log.warning("broker %s: re-registration failed (%s); retrying", self.broker_id, e)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 2.0)

    async def _publish_load(self) -> None:
        """Write our registration with the current load (best effort: logged on failure)."""
        async with self._load_lock:
            try:
                path = broker_path(self.broker_id)
                stat = await self.store.stat(path)
                if stat is not None and stat.ephemeral_owner == self.store.session_id:
                    await self.store.set(path, self._registration_doc(), stat.version)
            except MetadataError as e:
                log.warning("broker %s: publishing load failed: %s", self.broker_id, e)

    def _on_session(self, state: SessionState) -> None:
        if self._closed:
            return
        session_id = self.store.session_id if state is SessionState.CONNECTED else None
        changed = self._table.on_session(_TRUST[state], session_id)
        if state is SessionState.LOST:
            self._acquisitions.clear()  # those tasks are void (their epoch is gone)
        if changed:
            log.warning("broker %s: session %s: bundles %s", self.broker_id, state.value, sorted(changed))
            for callback in list(self._listeners):
                try:
                    callback(changed, state)
                except Exception:
                    log.exception("ownership listener %r failed", callback)
        if state is SessionState.CONNECTED and self.store.session_id != self._registered_session:
            self._spawn(self._reregister(), f"re-register {self.broker_id}")

    def _spawn(self, coro, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("ownership task %s died", task.get_name(), exc_info=task.exception())


def _persistent(topic: "str | TopicName") -> TopicName:
    """The parsed name; persistent and non-persistent topics share bundles and ownership (the
    bundle is chosen by the hash of the full name, domain included, as Pulsar's)."""
    return TopicName.parse(topic)


__all__ = ["BrokerInfo", "LookupResult", "OwnershipListener", "OwnershipManager"]
