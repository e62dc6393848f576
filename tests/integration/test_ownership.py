"""Bundle ownership and LOOKUP against a real ZooKeeper: two brokers (two managers on two
sessions), redirects, session loss, suspension, unload, load-based placement."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket

import pytest

from integration.helpers import BlockableProxy

from broker.ownership import BundleState, LookupResult, OwnershipError, OwnershipManager, bundle_of
from broker.ownership.core import bundle_path
from pulsarlite.metadata_layout import BROKERS_ROOT
from pulsarlite.metadata import MetadataExistsError, MetadataStore, SessionState, split_chroot
from pulsarlite.topic_name import InvalidTopicNameError, TopicName

pytestmark = pytest.mark.integration

WAIT_S = 20  # bound of every wait for an asynchronous event (never a timed assertion)
TOPIC = "persistent://acme/orders/new-orders"


@pytest.fixture
async def connect(zk_hosts):
    """``await connect(hosts=None, **kw)``: a MetadataStore, closed at teardown."""
    stores: list[MetadataStore] = []

    async def open_store(hosts: str | None = None, **kwargs) -> MetadataStore:
        s = await MetadataStore.connect(hosts or zk_hosts, **kwargs)
        stores.append(s)
        return s

    try:
        yield open_store
    finally:
        await asyncio.gather(*(s.close() for s in stores), return_exceptions=True)


@pytest.fixture
async def managers():
    """``await start(store, name, **kw)``: a started OwnershipManager, closed at teardown."""
    started: list[OwnershipManager] = []

    async def start(store: MetadataStore, name: str, **kwargs) -> OwnershipManager:
        kwargs.setdefault("rng", random.Random(name))
        m = OwnershipManager(store, f"broker-{name}", pulsar_url=f"pulsar://{name}:6650",
                             http_url=f"http://{name}:8080", **kwargs)
        await m.start()
        started.append(m)
        return m

    try:
        yield start
    finally:
        for m in reversed(started):
            try:
                await m.close()
            except Exception:
                pass


async def resolve(by_id: dict[str, OwnershipManager], first: OwnershipManager, topic: str,
                  hops_max: int = 4) -> OwnershipManager:
    """Follow LOOKUP redirects like a client: returns the manager that answered Connect."""
    m, authoritative = first, False
    for _ in range(hops_max):
        result = await m.lookup(topic, authoritative=authoritative)
        if result.owned_by_self:
            assert result.broker_id == m.broker_id
            return m
        m, authoritative = by_id[result.broker_id], result.authoritative
    raise AssertionError(f"no owner after {hops_max} hops")


async def wait_for(predicate, what: str, timeout_s: float = WAIT_S) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def wait_for_async(make_coro, expected, what: str, timeout_s: float = WAIT_S) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while await make_coro() != expected:
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[frozenset, SessionState]] = []

    def __call__(self, bundles: frozenset, state: SessionState) -> None:
        self.events.append((bundles, state))

    def states(self) -> list[SessionState]:
        return [s for _, s in self.events]


@pytest.fixture
def proxy(zk_server):
    p = BlockableProxy(zk_server.port)
    try:
        yield p
    finally:
        p.close()


def through(proxy: BlockableProxy, zk_hosts: str) -> str:
    return f"127.0.0.1:{proxy.port}{split_chroot(zk_hosts)[1]}"


# -- registration ----------------------------------------------------------------------------

async def test_registration_and_load(connect, managers):
    store = await connect()
    observer = await connect()
    a = await managers(store, "a")
    doc = json.loads((await observer.get(f"{BROKERS_ROOT}/broker-a"))[0])
    assert doc == {"broker_id": "broker-a", "pulsar_url": "pulsar://a:6650", "http_url": "http://a:8080",
                   "load": {"bundles": 0, "topics": 0}}
    stat = await observer.stat(f"{BROKERS_ROOT}/broker-a")
    assert stat.ephemeral_owner == store.session_id
    await a.update_load(5)
    assert (await a.lookup(TOPIC)).owned_by_self
    doc = json.loads((await observer.get(f"{BROKERS_ROOT}/broker-a"))[0])
    assert doc["load"] == {"bundles": 1, "topics": 5}
    # another live session cannot take the id
    with pytest.raises(MetadataExistsError, match="another session"):
        await managers(observer, "a", registration_stale_wait_s=0.2)
    # non-persistent topics share the bundles (their own hash, domain included, as Pulsar's)
    assert (await a.lookup("non-persistent://acme/orders/x")).owned_by_self
    with pytest.raises(InvalidTopicNameError):
        await a.lookup("a/b")


# -- lookup ----------------------------------------------------------------------------------

async def test_two_brokers_agree_on_one_owner(connect, managers):
    a = await managers(await connect(), "a")
    b = await managers(await connect(), "b")
    by_id = {m.broker_id: m for m in (a, b)}
    topics = [f"persistent://acme/orders/t-{i}" for i in range(6)]
    for topic in topics:
        from_a, from_b = await asyncio.gather(resolve(by_id, a, topic), resolve(by_id, b, topic))
        assert from_a is from_b
        owner = from_a
        other = b if owner is a else a
        assert owner.owns(topic) and not other.owns(topic)
        data, _ = await other.store.get(bundle_path(owner.bundle_of(topic)))
        assert json.loads(data)["broker_id"] == owner.broker_id


async def test_concurrent_lookups_on_one_broker(connect, managers):
    a = await managers(await connect(), "a")
    results = await asyncio.gather(*(a.lookup(TOPIC) for _ in range(8)))
    assert all(r.owned_by_self for r in results)
    assert a.owned_bundles() == {a.bundle_of(TOPIC)}


async def test_non_owner_redirects_to_owner(connect, managers):
    a = await managers(await connect(), "a")
    b = await managers(await connect(), "b")
    assert await a.acquire(TOPIC)
    assert await a.acquire(TOPIC)  # idempotent
    assert not await b.acquire(TOPIC)
    assert b.bundle_state(b.bundle_of(TOPIC)) is BundleState.NONE
    assert await a.lookup(TOPIC) == LookupResult("pulsar://a:6650", "http://a:8080", owned_by_self=True,
                                                 authoritative=False, broker_id="broker-a")
    for authoritative in (False, True):
        redirect = await b.lookup(TOPIC, authoritative=authoritative)
        assert redirect.redirect and not redirect.owned_by_self
        assert (redirect.broker_id, redirect.pulsar_url, redirect.http_url) == \
            ("broker-a", "pulsar://a:6650", "http://a:8080")
    assert a.owns(TOPIC) and not b.owns(TOPIC)
    # a partition of a partitioned topic is placed by its own name
    part = TopicName.parse(TOPIC).partition(1)
    assert a.bundle_of(part) == f"acme/orders/{bundle_of(part, 4)}"


async def test_owner_session_gone_then_other_acquires(connect, managers):
    store_a = await connect()
    a = await managers(store_a, "a")
    b = await managers(await connect(), "b")
    assert await a.acquire(TOPIC)
    assert (await b.lookup(TOPIC)).broker_id == "broker-a"
    await store_a.close()   # the broker's session ends (a crash would do the same after the timeout)
    assert not a.owns(TOPIC)
    result = await b.lookup(TOPIC)
    assert result.owned_by_self and result.broker_id == "broker-b"
    assert b.owns(TOPIC)


async def test_lookup_held_while_the_owner_refuses_connections(connect, managers, caplog):
    """A killed owner: its service port refuses connections while its znode waits for its
    session to expire. Another broker's LOOKUP is held until the znode goes and then answered by
    taking the bundle, not with a redirect to the dead broker (which sends a client into its
    reconnect backoff: BENCHMARKS.md "[perf] Session 16")."""
    caplog.set_level(logging.INFO, logger="broker.ownership.shell")
    with socket.socket() as s:          # a port nothing listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store_a = await connect()
    a = OwnershipManager(store_a, "broker-a", pulsar_url=f"pulsar://127.0.0.1:{port}", http_url="http://127.0.0.1:1")
    await a.start()
    try:
        b = await managers(await connect(), "b", dead_owner_wait_s=WAIT_S)
        assert await a.acquire(TOPIC)
        lookup = asyncio.ensure_future(b.lookup(TOPIC))
        await wait_for(lambda: lookup.done() or any("lookup held" in r.getMessage() for r in caplog.records),
                       "the lookup held (or answered)")
        assert not lookup.done(), f"answered at once: {lookup.result()}"
        await store_a.close()           # the dead owner's session ends: its znode goes
        result = await asyncio.wait_for(lookup, WAIT_S)
        assert result.owned_by_self and result.broker_id == "broker-b"
        assert b.owns(TOPIC)
    finally:
        await a.close()


async def test_release_lets_the_other_take_it(connect, managers):
    a = await managers(await connect(), "a")
    b = await managers(await connect(), "b")
    assert await a.acquire(TOPIC)
    assert await a.release(TOPIC)
    assert not a.owns(TOPIC) and a.owned_bundles() == frozenset()
    assert not await b.store.exists(bundle_path(a.bundle_of(TOPIC)))
    assert not await a.release(TOPIC)  # nothing left to release
    result = await b.lookup(TOPIC, authoritative=True)  # as after a redirect
    assert result.owned_by_self and b.owns(TOPIC)
    assert (await a.lookup(TOPIC)).broker_id == "broker-b"
    # release by bundle name
    bundle = b.bundle_of(TOPIC)
    assert await b.release(bundle)
    assert not b.owns(TOPIC)
    assert await a.acquire(TOPIC) and a.owns(TOPIC)


async def test_load_spreads_bundles_over_two_brokers(connect, managers):
    a = await managers(await connect(), "a")
    b = await managers(await connect(), "b")
    by_id = {m.broker_id: m for m in (a, b)}
    one_per_bundle: dict[str, str] = {}
    i = 0
    while len(one_per_bundle) < 4:
        topic = f"persistent://acme/orders/spread-{i}"
        one_per_bundle.setdefault(a.bundle_of(topic), topic)
        i += 1
    for topic in one_per_bundle.values():
        await resolve(by_id, a, topic)  # always asking broker a first
    assert len(a.owned_bundles()) == 2 and len(b.owned_bundles()) == 2
    assert a.owned_bundles() | b.owned_bundles() == set(one_per_bundle)


async def test_concurrent_first_lookups_spread_over_brokers(connect, managers):
    """A client looking up every partition at once (the official client does) must not land all
    of them on one broker: lookups answered before any owner exists count the bundles already
    promised to a broker, and a repeated lookup of a promised bundle goes to the same broker."""
    class FirstOfTies(random.Random):        # ties always go to the first id: the worst case
        def choice(self, seq):
            return seq[0]

    a = await managers(await connect(), "a", bundles_per_namespace=16, rng=FirstOfTies())
    b = await managers(await connect(), "b", bundles_per_namespace=16, rng=FirstOfTies())
    by_id = {m.broker_id: m for m in (a, b)}
    one_per_bundle: dict[str, str] = {}
    i = 0
    while len(one_per_bundle) < 8:
        topic = f"persistent://acme/orders/concurrent-{i}"
        one_per_bundle.setdefault(a.bundle_of(topic), topic)
        i += 1
    first_answers = await asyncio.gather(*(a.lookup(t) for t in one_per_bundle.values()))
    redirected = [r for r in first_answers if not r.owned_by_self]
    assert len(redirected) == 4, [r.broker_id for r in first_answers]   # half each way
    again = await asyncio.gather(*(a.lookup(t) for t in one_per_bundle.values()))
    assert [r.broker_id for r in again] == [r.broker_id for r in first_answers]
    await asyncio.gather(*(resolve(by_id, a, t) for t in one_per_bundle.values()))
    assert len(a.owned_bundles()) == 4 and len(b.owned_bundles()) == 4
    assert a.owned_bundles() | b.owned_bundles() == set(one_per_bundle)


async def test_close_releases_everything(connect, managers):
    store = await connect()
    observer = await connect()
    a = await managers(store, "a")
    b = await managers(await connect(), "b")
    topics = [f"persistent://acme/orders/c-{i}" for i in range(8)]
    for topic in topics:
        await a.lookup(topic, authoritative=True)
    held = a.owned_bundles()
    assert held
    await a.close()
    assert not store.closed
    for bundle in held:
        assert not await observer.exists(bundle_path(bundle))
    assert not await observer.exists(f"{BROKERS_ROOT}/broker-a")
    with pytest.raises(OwnershipError, match="closed"):
        await a.lookup(TOPIC)
    assert not a.owns(topics[0])
    assert (await b.lookup(topics[0])).owned_by_self  # b is the only live broker now


# -- session trouble -------------------------------------------------------------------------

async def test_suspended_then_reconnected_with_same_session(proxy, connect, managers, zk_hosts):
    store = await connect(through(proxy, zk_hosts), session_timeout_ms=10_000)
    a = await managers(store, "a")
    recorder = Recorder()
    a.add_ownership_listener(recorder)
    assert (await a.lookup(TOPIC)).owned_by_self
    bundle = a.bundle_of(TOPIC)
    session = store.session_id
    proxy.block()
    await wait_for(lambda: SessionState.SUSPENDED in recorder.states(), "SUSPENDED")
    assert recorder.events[0] == (frozenset({bundle}), SessionState.SUSPENDED)
    assert not a.owns(TOPIC) and a.owned_bundles() == frozenset()
    assert a.bundle_state(bundle) is BundleState.SUSPECT
    assert not await a.acquire(TOPIC)  # nothing acquired while not trusted
    with pytest.raises(OwnershipError, match="SUSPENDED") as info:
        await a.lookup(TOPIC)             # answered at once, not after the operation timeout
    assert info.value.retriable
    proxy.unblock()
    await wait_for(lambda: SessionState.CONNECTED in recorder.states(), "CONNECTED")
    assert recorder.events[1] == (frozenset({bundle}), SessionState.CONNECTED)
    assert SessionState.LOST not in recorder.states()
    assert store.session_id == session
    assert a.owns(TOPIC) and a.owned_bundles() == {bundle}
    assert (await a.lookup(TOPIC)).owned_by_self


async def test_lost_session_never_owns_again_without_reacquiring(proxy, connect, managers, zk_hosts):
    store_a = await connect(through(proxy, zk_hosts), session_timeout_ms=2000)
    a = await managers(store_a, "a")
    b = await managers(await connect(), "b")
    observer = await connect()
    recorder = Recorder()
    a.add_ownership_listener(recorder)
    assert await a.acquire(TOPIC)
    bundle = a.bundle_of(TOPIC)
    old_session = store_a.session_id
    list_guard = a.session_guard()       # what a managed ledger loaded now checks before list writes
    assert list_guard()

    proxy.block()
    await wait_for(lambda: SessionState.SUSPENDED in recorder.states(), "SUSPENDED")
    assert not a.owns(TOPIC) and not list_guard()
    # the server expires a's session: its bundle and its registration vanish, b takes over
    await wait_for_async(lambda: observer.exists(bundle_path(bundle)), False, "a's bundle znode gone")
    await wait_for_async(lambda: observer.exists(f"{BROKERS_ROOT}/broker-a"), False, "a unregistered")
    assert (await b.lookup(TOPIC)).owned_by_self
    b_guard = b.session_guard()

    proxy.unblock()
    await wait_for(lambda: SessionState.LOST in recorder.states(), "LOST")
    assert recorder.events[-1] == (frozenset({bundle}), SessionState.LOST)
    await wait_for_async(lambda: observer.exists(f"{BROKERS_ROOT}/broker-a"), True, "a registered again")
    assert store_a.session_id not in (None, old_session)
    assert not a.owns(TOPIC) and a.owned_bundles() == frozenset()
    assert a.bundle_state(bundle) is BundleState.NONE
    redirect = await a.lookup(TOPIC)
    assert redirect.broker_id == "broker-b" and not a.owns(TOPIC)
    assert not list_guard()              # the session it was taken under expired: never again

    # only a LOOKUP / acquire brings ownership back, on the new session
    assert await b.release(TOPIC)
    assert b_guard()                     # a voluntary release: the unloading broker may close its list
    assert not a.owns(TOPIC)
    assert (await a.lookup(TOPIC, authoritative=True)).owned_by_self
    stat = await observer.stat(bundle_path(bundle))
    assert stat.ephemeral_owner == store_a.session_id
    assert a.owns(TOPIC)
    assert not list_guard() and a.session_guard()()


async def test_lost_without_takeover_needs_lookup_to_own_again(proxy, connect, managers, zk_hosts):
    store_a = await connect(through(proxy, zk_hosts), session_timeout_ms=2000)
    a = await managers(store_a, "a")
    observer = await connect()
    recorder = Recorder()
    a.add_ownership_listener(recorder)
    assert await a.acquire(TOPIC)
    bundle = a.bundle_of(TOPIC)
    proxy.block()
    await wait_for_async(lambda: observer.exists(bundle_path(bundle)), False, "bundle znode gone")
    proxy.unblock()
    await wait_for(lambda: SessionState.LOST in recorder.states(), "LOST")
    await wait_for_async(lambda: observer.exists(f"{BROKERS_ROOT}/broker-a"), True, "a registered again")
    assert not a.owns(TOPIC)           # no belief survives the lost session
    assert not await observer.exists(bundle_path(bundle))
    assert (await a.lookup(TOPIC)).owned_by_self   # re-acquired through lookup
    assert a.owns(TOPIC)


async def test_close_while_suspended_does_not_wait_for_zookeeper(proxy, connect, managers, zk_hosts):
    store_a = await connect(through(proxy, zk_hosts), session_timeout_ms=2000)
    observer = await connect()
    a = await managers(store_a, "a")
    assert await a.acquire(TOPIC)
    bundle = a.bundle_of(TOPIC)
    proxy.block()
    await wait_for(lambda: store_a.state is SessionState.SUSPENDED, "SUSPENDED")
    await a.close()                      # returns without ZooKeeper; the session end cleans up
    assert not a.owns(TOPIC) and a.owned_bundles() == frozenset()
    await wait_for_async(lambda: observer.exists(bundle_path(bundle)), False, "bundle znode gone")
    proxy.unblock()
    await wait_for(lambda: store_a.state is SessionState.CONNECTED, "reconnected")
    assert not a.owns(TOPIC)
    assert not await observer.exists(f"{BROKERS_ROOT}/broker-a")  # a closed manager does not re-register


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_lease_stops_serving_when_zookeeper_has_not_confirmed_the_session_lately(connect, managers):
    """A broker that was paused (SIGSTOP, a stalled loop) longer than its lease must not serve
    its topics when it wakes, even before kazoo learns the session expired; it serves again once
    a ZooKeeper round trip confirms the session."""
    clock = ManualClock()
    store = await connect()
    m = await managers(store, "lease", lease_ms=400, clock=clock)
    topic = "persistent://public/default/leased"
    result = await m.lookup(topic, authoritative=True)
    assert result.owned_by_self and m.owns(topic)
    clock.now += 0.5                      # "woke up" after more than the lease: no await in between
    assert not m.owns(topic)
    assert m.owned_bundles() == frozenset()
    for _ in range(200):                  # the heartbeat confirms the session again (bounded)
        if m.owns(topic):
            break
        await asyncio.sleep(0.01)
    assert m.owns(topic)


async def test_no_lease_means_session_state_alone_decides(connect, managers):
    clock = ManualClock()
    store = await connect()
    m = await managers(store, "nolease", clock=clock)
    topic = "persistent://public/default/unleased"
    assert (await m.lookup(topic, authoritative=True)).owned_by_self
    clock.now += 3600
    assert m.owns(topic)
