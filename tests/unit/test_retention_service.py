"""The retention shell (broker/retention.py RetentionService.run_topic) over fakes of the
broker's parts: which cursors move, which ledgers are trimmed, producers blocked and released."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from broker.admin.policies import BacklogQuota, NamespacePolicies, NotFoundError, RetentionPolicy
from broker.config import BrokerConfig
from broker.cursor import CursorState
from broker.managed_ledger import LedgerInfo, LedgerInfoState, Position
from broker.retention import RetentionService, producer_refusal
from pulsarlite.errors import MetadataVersionConflict
from pulsarlite.metadata_layout import cursor_path, managed_ledger_path
from pulsarlite.topic_name import TopicName

NOW = 1_000_000
CLOSED, OPEN = LedgerInfoState.CLOSED, LedgerInfoState.OPEN


class FakeStore:
    """Enough of MetadataStore: versioned znodes, children, compare-and-set."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[bytes, int]] = {}

    async def get_or_none(self, path):
        return self.nodes.get(path)

    async def children(self, path):
        prefix = path.rstrip("/") + "/"
        return sorted({p[len(prefix):].split("/")[0] for p in self.nodes if p.startswith(prefix)})

    async def set(self, path, data, version):
        current = self.nodes.get(path)
        if current is None or (version != -1 and current[1] != version):
            raise MetadataVersionConflict(f"{path}: version {version}")
        self.nodes[path] = (data, current[1] + 1)
        return current[1] + 1


class FakePolicies:
    def __init__(self, policies: NamespacePolicies | None) -> None:
        self.value = policies

    async def get_namespace_policies(self, namespace):
        if self.value is None:
            raise NotFoundError(namespace)
        return self.value


class FakeML:
    def __init__(self, ledgers) -> None:
        self._ledgers = tuple(ledgers)
        self.trims: list[list[int]] = []
        self.rollover_listeners = []

    def ledgers(self):
        return self._ledgers

    def trimmed_pending(self):
        return {}

    async def trim_ledgers(self, ids, *, delete_offloaded=None):
        self.trims.append(list(ids))
        self._ledgers = tuple(i for i in self._ledgers if i.ledger_id not in ids)
        return list(ids)


class FakeCursor:
    def __init__(self, mark: Position) -> None:
        self.mark_delete_position = mark

    def ack_cumulative(self, position):
        if position > self.mark_delete_position:
            self.mark_delete_position = position
            return True
        return False


@dataclass
class FakeSub:
    name: str
    cursor: FakeCursor
    durable: bool = True
    read_position: Position = Position(0, 0)
    woken: int = 0

    def wake(self):
        self.woken += 1

    def forget_payloads_through(self, position):
        pass


class FakeHandle:
    def __init__(self) -> None:
        self.closed = 0

    def close_by_broker(self):
        self.closed += 1


@dataclass
class FakeProducer:
    handle: FakeHandle = field(default_factory=FakeHandle)


class FakeTopic:
    def __init__(self, ledgers) -> None:
        self.name = TopicName.parse("persistent://public/default/t")
        self.key = str(self.name)
        self.ml = FakeML(ledgers)
        self.subscriptions: dict[str, FakeSub] = {}
        self.producers: dict[str, FakeProducer] = {}
        self.closing = False
        self.quota_blocked = None

    def next_after(self, position):
        return Position(position.ledger_id, position.entry_id + 1)

    async def read_entry(self, position):
        return None


class FakeService:
    def __init__(self, policies) -> None:
        # no retention unless a namespace sets one (the broker's default keeps everything: -1)
        self.config = BrokerConfig(retention_time_default_minutes=0, retention_size_default_mb=0)
        self.store = FakeStore()
        self.policies = FakePolicies(policies)
        self.offloader = None
        self.topics: list[FakeTopic] = []

    def loaded_topics(self):
        return list(self.topics)

    def loaded_topic(self, key):
        return next((t for t in self.topics if t.key == key), None)


def ledgers(step_ms: int = 1000, base_ms: int = NOW - 100_000):
    """3 closed ledgers of 10 entries / 1000 bytes (publish times = created .. +9), one open."""
    out = [LedgerInfo(i, CLOSED, entries=10, size_bytes=1000, created_ms=base_ms + i * step_ms,
                      min_publish_time_ms=base_ms + i * step_ms, max_publish_time_ms=base_ms + i * step_ms + 9)
           for i in range(1, 4)]
    out.append(LedgerInfo(4, OPEN, entries=2, size_bytes=200, created_ms=base_ms + 4 * step_ms,
                          min_publish_time_ms=NOW - 10, max_publish_time_ms=NOW - 5))
    return out


def idle_cursor(service, topic, name: str, mark: Position) -> str:
    ml_name = topic.name.managed_ledger_name
    service.store.nodes[managed_ledger_path(ml_name)] = (b"{}", 0)
    path = cursor_path(ml_name, name)
    service.store.nodes[path] = (CursorState(mark).to_bytes(), 0)
    return path


def stored_mark(service, path) -> Position:
    return CursorState.from_bytes(service.store.nodes[path][0]).mark_delete


def make(policies):
    service = FakeService(policies)
    topic = FakeTopic(ledgers())
    service.topics.append(topic)
    return service, topic, RetentionService(service, interval_ms=1000, clock=lambda: NOW)


async def test_retention_waits_for_the_slowest_subscription_live_or_idle():
    service, topic, r = make(NamespacePolicies())
    topic.subscriptions["live"] = FakeSub("live", FakeCursor(Position(3, 9)))
    path = idle_cursor(service, topic, "idle", Position(1, 9))
    await r.run_topic(topic)
    assert topic.ml.trims == [[1]]
    service.store.nodes[path] = (CursorState(Position(4, 0)).to_bytes(), 1)
    await r.run_topic(topic)
    assert topic.ml.trims == [[1], [2, 3]]           # never the current ledger 4


async def test_infinite_retention_and_missing_namespace_trim_nothing():
    service, topic, r = make(NamespacePolicies(retention=RetentionPolicy(-1, -1)))
    await r.run_topic(topic)
    service.policies.value = None                    # namespace deleted meanwhile
    await r.run_topic(topic)
    assert topic.ml.trims == []


async def test_ttl_moves_live_and_idle_cursors_forward_only():
    service, topic, r = make(NamespacePolicies(message_ttl_s=50, retention=RetentionPolicy(-1, -1)))
    live = FakeSub("live", FakeCursor(Position(1, -1)), read_position=Position(1, 0))
    ahead = FakeSub("ahead", FakeCursor(Position(4, 0)))
    topic.subscriptions.update(live=live, ahead=ahead)
    path = idle_cursor(service, topic, "idle", Position(1, 3))
    await r.run_topic(topic)
    # every closed ledger was published > 50 s ago; the open one 5-10 ms ago
    assert live.cursor.mark_delete_position == Position(3, 9)
    assert live.read_position == Position(3, 10) and live.woken == 1
    assert ahead.cursor.mark_delete_position == Position(4, 0)      # never moved back
    assert stored_mark(service, path) == Position(3, 9)


async def test_idle_cursor_changed_meanwhile_is_left_alone():
    service, topic, r = make(NamespacePolicies(message_ttl_s=50, retention=RetentionPolicy(-1, -1)))
    path = idle_cursor(service, topic, "idle", Position(1, 3))
    real_get = service.store.get_or_none

    async def racing_get(p):      # a consumer writes the cursor between our read and our CAS
        got = await real_get(p)
        if p == path and got is not None:
            service.store.nodes[path] = (got[0], got[1] + 1)
        return got

    service.store.get_or_none = racing_get
    await r.run_topic(topic)                                   # no exception
    service.store.get_or_none = real_get
    assert stored_mark(service, path) == Position(1, 3)


@pytest.mark.parametrize("policy", ["producer_exception", "producer_request_hold"])
async def test_quota_blocks_producers_once_and_releases_them(policy):
    quota = {"destination_storage": BacklogQuota(limit_bytes=1500, policy=policy)}
    service, topic, r = make(NamespacePolicies(backlog_quotas=quota, retention=RetentionPolicy(-1, -1)))
    sub = FakeSub("s", FakeCursor(Position(1, -1)))
    topic.subscriptions["s"] = sub
    producer = FakeProducer()
    topic.producers["p"] = producer
    await r.run_topic(topic)
    assert topic.quota_blocked is not None and topic.quota_blocked.policy == policy
    assert producer.handle.closed == 1
    refusal = producer_refusal(topic)
    assert refusal is not None and refusal.retriable == (policy == "producer_request_hold")
    await r.run_topic(topic)
    assert producer.handle.closed == 1                       # disconnected once, not every pass
    sub.cursor.mark_delete_position = Position(3, 9)         # the consumer caught up
    await r.run_topic(topic)
    assert topic.quota_blocked is None and producer_refusal(topic) is None


async def test_quota_eviction_moves_the_slow_subscriptions():
    quota = {"destination_storage": BacklogQuota(limit_bytes=1500, policy="consumer_backlog_eviction")}
    service, topic, r = make(NamespacePolicies(backlog_quotas=quota, retention=RetentionPolicy(-1, -1)))
    slow = FakeSub("slow", FakeCursor(Position(1, -1)))
    topic.subscriptions["slow"] = slow
    path = idle_cursor(service, topic, "idle", Position(2, 0))
    await r.run_topic(topic)
    # what follows the target (ledger 3: 1000, open: 200) fits in 1500 bytes
    assert slow.cursor.mark_delete_position == Position(2, 9)
    assert stored_mark(service, path) == Position(2, 9)
    assert topic.quota_blocked is None


async def test_loop_runs_passes_and_survives_failures():
    import asyncio
    service, topic, r = make(NamespacePolicies())
    broken = FakeTopic(ledgers())
    broken.key = "persistent://public/default/broken"

    async def fail(*a, **k):
        raise RuntimeError("injected")

    broken.ml.trim_ledgers = fail
    service.topics.insert(0, broken)
    r.start()
    try:
        for _ in range(200):
            if topic.ml.trims:
                break
            await asyncio.sleep(0.01)
        assert topic.ml.trims == [[1, 2, 3]]
        r.request(topic.key)           # a rollover asks for a pass of one topic
        for _ in range(200):
            if r.passes >= 2:
                break
            await asyncio.sleep(0.01)
        assert r.passes >= 2
    finally:
        await r.close()


async def test_dedup_snapshot_keeps_the_entries_replayed_on_failover():
    from broker.dedup import DedupState
    from pulsarlite.metadata_layout import dedup_path
    service, topic, r = make(NamespacePolicies(deduplication_enabled=True))
    path = dedup_path(topic.name.managed_ledger_name)
    service.store.nodes[path] = (DedupState().snapshot((1, 9)), 0)
    await r.run_topic(topic)
    assert topic.ml.trims == [[1]]                  # the entries after the snapshot stay
    service.policies.value = NamespacePolicies(deduplication_enabled=False)
    await r.run_topic(topic)
    assert topic.ml.trims == [[1], [2, 3]]          # dedup off: the snapshot holds nothing


async def test_producer_refusal_rechecks_a_blocked_topic():
    quota = {"destination_storage": BacklogQuota(limit_bytes=1500, policy="producer_exception")}
    service, topic, r = make(NamespacePolicies(backlog_quotas=quota, retention=RetentionPolicy(-1, -1)))
    sub = FakeSub("s", FakeCursor(Position(1, -1)))
    topic.subscriptions["s"] = sub
    assert await r.producer_refusal(topic) is None          # not blocked: no metadata read
    await r.run_topic(topic)
    assert await r.producer_refusal(topic) is not None
    sub.cursor.mark_delete_position = Position(3, 9)        # caught up since the last pass
    r._rechecked.clear()                                    # (rechecks are at most 1/s)
    assert await r.producer_refusal(topic) is None and topic.quota_blocked is None
