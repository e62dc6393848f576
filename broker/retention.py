"""Retention, message TTL and backlog quotas of persistent topics (Pulsar's semantics).

Pure core (no I/O, no clock: ``now_ms`` is passed in; docs/architecture.md#style):

- :func:`ledgers_to_delete`: the CLOSED ledgers at the front of a topic's list that every
  durable subscription has consumed (its mark-delete position is at or past the ledger's last
  entry; with no subscription at all, every ledger counts as consumed, as in Pulsar) **and** that
  are outside the retention window: older than ``retentionTimeInMinutes`` (the ledger's close
  time, i.e. the creation time of the ledger after it) or beyond ``retentionSizeInMB`` (the
  topic's stored size minus what is deleted so far). -1 is infinite, 0 no retention. The current
  ledger is never deleted; the scan stops at the first ledger that must stay (only a prefix
  leaves the list).
- :func:`ttl_expired_through`: with ``message_ttl_in_seconds``, the newest position whose ledger
  is wholly expired by its publish-time bounds, and the ledger (if any) that is partly expired
  and needs an entry-level search (:func:`search_last_expired`, a binary search over publish
  times read from the entries).
- :func:`check_backlog_quota`: whether a topic's backlog (bytes of the slowest subscription for
  ``destination_storage``/``limitSize``; age of its oldest unacked message for
  ``message_age``/``limitTime``) exceeds its namespace's quota, and with which policy;
  :func:`eviction_target` where ``consumer_backlog_eviction`` moves the slow cursors.

Shell (:class:`RetentionService`): one task per broker runs a pass over every loaded topic every
``retention_check_interval_ms`` and soon after a topic's rollover (bounded: one topic at a time,
at most ``TTL_SEARCH_READS_MAX`` entry reads per subscription search). A pass reads the
namespace policies, expires by TTL (moves mark-delete positions forward: live subscriptions
through their cursor, idle ones through ``broker.cursor.advance_stored_cursor``: one
compare-and-set of the stored cursor), evicts or blocks
producers by backlog quota, then trims ledgers through :meth:`ManagedLedger.trim_ledgers`
(out of the list by CAS first, then from the tier and the bookies).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Mapping, Protocol, Sequence

from broker.admin.policies import NotFoundError, PolicyStore
from broker.config import BrokerConfig
from broker.cursor import ManagedCursor, advance_stored_cursor, list_cursors, stored_mark_delete
from broker.dedup import DedupState
from broker.errors import ProducerBlockedError
from broker.managed_ledger import LedgerInfo, LedgerInfoState, ManagedLedger, Position
from broker.offloader import BrokerOffloader
from pulsarlite.errors import PulsarliteError
from pulsarlite.metadata import MetadataStore
from pulsarlite.metadata_layout import dedup_path
from pulsarlite.topic_name import TopicName
from pulsarlite.wire.entry import peek_metadata

log = logging.getLogger("pulsarlite.broker.retention")


def publish_time_of(entry: bytes) -> int | None:
    """An entry's publish time; None if its metadata does not parse."""
    try:
        return peek_metadata(entry).publish_time_ms
    except Exception:
        return None

MiB = 1024 * 1024
TTL_SEARCH_READS_MAX = 64          # entry reads per binary search (2**64 entries: plenty)
QUOTA_RECHECK_INTERVAL_S = 1.0     # a blocked topic's quota is checked again at most this often


# -- retention --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RetentionLimits:
    """-1 infinite, 0 none (the default: consumed ledgers go at once)."""

    time_ms: int = 0
    size_bytes: int = 0

    def __post_init__(self) -> None:
        if self.time_ms < -1 or self.size_bytes < -1:
            raise ValueError(f"retention limits must be >= -1: {self}")

    @classmethod
    def from_policy(cls, policy, default: "RetentionLimits | None" = None) -> "RetentionLimits":
        """From a :class:`broker.admin.policies.RetentionPolicy`; None: ``default`` (the broker's
        configured default; no retention when not given)."""
        if policy is None:
            return default if default is not None else cls()
        time_ms = -1 if policy.time_minutes < 0 else policy.time_minutes * 60_000
        size = -1 if policy.size_mb < 0 else policy.size_mb * MiB
        return cls(time_ms, size)


def closed_time_ms(ledgers: Sequence[LedgerInfo], index: int) -> int:
    """When ledger ``index`` was closed: the creation time of the ledger after it (a rollover
    creates the next one as it closes this one), else its own creation time."""
    if index + 1 < len(ledgers) and ledgers[index + 1].created_ms:
        return ledgers[index + 1].created_ms
    return ledgers[index].created_ms


def consumed_by_all(info: LedgerInfo, slowest_mark_delete: Position | None) -> bool:
    """Every entry of ``info`` is at or below the slowest durable mark-delete position (None:
    no durable subscription)."""
    if slowest_mark_delete is None:
        return True
    return slowest_mark_delete >= Position(info.ledger_id, info.entries - 1)


def ledgers_to_delete(ledgers: Sequence[LedgerInfo], slowest_mark_delete: Position | None,
                      limits: RetentionLimits, now_ms: int) -> list[int]:
    """Ids of the ledgers to delete, a prefix of ``ledgers`` (see the module docstring)."""
    if limits.time_ms < 0 and limits.size_bytes < 0:
        return []                                    # infinite retention
    total = sum(i.size_bytes for i in ledgers)
    deleted_bytes = 0
    out: list[int] = []
    for index, info in enumerate(ledgers[:-1]):      # never the last (current) ledger
        if info.state is not LedgerInfoState.CLOSED or not consumed_by_all(info, slowest_mark_delete):
            break
        expired = limits.time_ms >= 0 and now_ms - closed_time_ms(ledgers, index) > limits.time_ms
        over_size = limits.size_bytes >= 0 and total - deleted_bytes > limits.size_bytes
        if not (expired or over_size):
            break
        out.append(info.ledger_id)
        deleted_bytes += info.size_bytes
    return out


def slowest_position(marks: Mapping[str, Position]) -> Position | None:
    return min(marks.values()) if marks else None


# -- message TTL ------------------------------------------------------------------------------
def is_expired(publish_time_ms: int, ttl_ms: int, now_ms: int) -> bool:
    return publish_time_ms + ttl_ms <= now_ms


def ttl_expired_through(ledgers: Sequence[LedgerInfo], ttl_ms: int, now_ms: int
                        ) -> tuple[Position | None, LedgerInfo | None]:
    """(newest position of the wholly expired ledgers at the front, or None; the next non-empty
    ledger if some of its entries may be expired too -- its lower publish-time bound is expired
    or unknown -- else None). Ledgers are scanned from the oldest; empty ones are skipped."""
    if ttl_ms <= 0:
        return None, None
    through: Position | None = None
    for info in ledgers:
        if info.entries == 0:
            continue
        hi, lo = info.max_publish_time_ms, info.min_publish_time_ms
        if hi is not None and is_expired(hi, ttl_ms, now_ms):
            through = Position(info.ledger_id, info.entries - 1)
            continue
        if lo is None or is_expired(lo, ttl_ms, now_ms):
            return through, info
        return through, None
    return through, None


async def search_last_expired(info: LedgerInfo, publish_time_at: Callable[[int], Awaitable[int | None]],
                              ttl_ms: int, now_ms: int) -> Position | None:
    """The last entry of ``info`` whose publish time is expired, by binary search (publish times
    grow along a ledger, as Pulsar assumes); None if its first entry is not expired. An entry
    whose time cannot be read counts as not expired (nothing is skipped on a doubt)."""
    lo, hi = 0, info.entries - 1
    found = -1
    for _ in range(TTL_SEARCH_READS_MAX):
        if lo > hi:
            break
        mid = (lo + hi) // 2
        t = await publish_time_at(mid)
        if t is not None and is_expired(t, ttl_ms, now_ms):
            found, lo = mid, mid + 1
        else:
            hi = mid - 1
    return Position(info.ledger_id, found) if found >= 0 else None


# -- backlog quota ----------------------------------------------------------------------------
@dataclass(frozen=True)
class QuotaVerdict:
    exceeded: bool
    kind: str = ""                 # destination_storage | message_age
    policy: str = ""               # producer_request_hold | producer_exception | consumer_backlog_eviction
    reason: str = ""
    by_size: bool = False          # the size limit was exceeded (else the time limit)


def backlog_bytes_after(ledgers: Sequence[LedgerInfo], mark_delete: Position) -> int:
    """Estimated stored bytes after ``mark_delete`` (its ledger pro rata, later ledgers whole)."""
    total = 0
    for info in ledgers:
        if info.ledger_id > mark_delete.ledger_id:
            total += info.size_bytes
        elif info.ledger_id == mark_delete.ledger_id and info.entries > 0:
            left = max(0, info.entries - mark_delete.entry_id - 1)
            total += info.size_bytes * left // info.entries
    return total


def oldest_unacked_publish_ms(ledgers: Sequence[LedgerInfo], mark_delete: Position) -> int | None:
    """Lower bound of the publish time of the first entry after ``mark_delete``: the lower
    publish-time bound of its ledger (ledger granularity, like Pulsar's default time check)."""
    for info in ledgers:
        if info.entries == 0:
            continue
        if info.ledger_id > mark_delete.ledger_id or (
                info.ledger_id == mark_delete.ledger_id and mark_delete.entry_id + 1 < info.entries):
            return info.min_publish_time_ms
    return None


def check_backlog_quota(quotas: Mapping[str, object], ledgers: Sequence[LedgerInfo],
                        slowest_mark_delete: Position | None, now_ms: int) -> QuotaVerdict:
    """``quotas``: kind -> BacklogQuota (``limit_bytes``, ``limit_time_s``, ``policy``; -1 no
    limit). Size is checked first (Pulsar's order)."""
    if slowest_mark_delete is None:
        return QuotaVerdict(False)
    size_quota = quotas.get("destination_storage")
    if size_quota is not None and size_quota.limit_bytes >= 0:
        backlog = backlog_bytes_after(ledgers, slowest_mark_delete)
        if backlog > size_quota.limit_bytes:
            return QuotaVerdict(True, "destination_storage", size_quota.policy,
                                f"backlog {backlog} bytes > limitSize {size_quota.limit_bytes}", by_size=True)
    for kind in ("message_age", "destination_storage"):
        quota = quotas.get(kind)
        if quota is None or quota.limit_time_s < 0:
            continue
        oldest = oldest_unacked_publish_ms(ledgers, slowest_mark_delete)
        if oldest is not None and now_ms - oldest > quota.limit_time_s * 1000:
            return QuotaVerdict(True, kind, quota.policy,
                                f"oldest unacked message {(now_ms - oldest) // 1000}s old > limitTime "
                                f"{quota.limit_time_s}s")
    return QuotaVerdict(False)


def eviction_target(ledgers: Sequence[LedgerInfo], verdict: QuotaVerdict, quotas: Mapping[str, object],
                    now_ms: int) -> Position | None:
    """consumer_backlog_eviction: the mark-delete position that brings a subscription back under
    the quota, at ledger granularity (whole ledgers skipped from the oldest): for a size quota,
    the last entry of the newest ledger such that what follows it fits in ``limitSize``; for a
    time quota, the TTL rule with ``limitTime``. None: nothing to skip."""
    quota = quotas.get(verdict.kind)
    if quota is None:
        return None
    if verdict.by_size:
        after = 0
        for info in reversed(ledgers):
            if after + info.size_bytes > quota.limit_bytes and info.entries > 0:
                return Position(info.ledger_id, info.entries - 1)
            after += info.size_bytes
        return None
    if quota.limit_time_s >= 0:
        through, _ = ttl_expired_through(ledgers, quota.limit_time_s * 1000, now_ms)
        return through
    return None


# -- the shell ----------------------------------------------------------------------------------
class RetainedSubscription(Protocol):
    """What a pass needs of a live subscription (``broker.topic.Subscription``)."""

    name: str
    durable: bool
    cursor: ManagedCursor
    read_position: Position

    def forget_payloads_through(self, position: Position) -> None: ...

    def wake(self) -> None: ...


class RetainedTopic(Protocol):
    """What a pass needs of a loaded topic (``broker.topic.PersistentTopic``)."""

    name: TopicName
    key: str
    ml: ManagedLedger
    subscriptions: dict[str, RetainedSubscription]
    quota_blocked: QuotaVerdict | None      # set by the passes; producers are refused while set

    @property
    def closing(self) -> bool: ...

    @property
    def producers(self) -> Mapping[str, object]: ...

    def next_after(self, position: Position) -> Position: ...

    async def read_entry(self, position: Position) -> tuple[bytes, int] | None: ...


class RetentionHost(Protocol):
    """What the shell needs of the broker (``broker.service.BrokerService``)."""

    config: BrokerConfig
    store: MetadataStore
    policies: PolicyStore
    offloader: BrokerOffloader | None       # None: no tier

    def loaded_topics(self) -> Sequence[RetainedTopic]: ...

    def loaded_topic(self, key: str) -> RetainedTopic | None: ...


class RetentionService:
    """Runs the policy passes of a broker's loaded topics (see the module docstring)."""

    def __init__(self, service: RetentionHost, *, interval_ms: int, clock: Callable[[], int] | None = None) -> None:
        if interval_ms <= 0:
            raise ValueError("interval_ms must be > 0")
        self.service = service
        self.interval_ms = interval_ms
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._due: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.passes = 0                # completed passes over all topics (tests, stats)
        self._rechecked: dict[str, float] = {}   # topic -> monotonic s of the last quota recheck

    # -- lifecycle -------------------------------------------------------------------------------
    def _default_limits(self) -> RetentionLimits:
        """The broker's retention for namespaces without a policy (BrokerConfig)."""
        config = self.service.config
        minutes = config.retention_time_default_minutes
        size_mb = config.retention_size_default_mb
        return RetentionLimits(-1 if minutes < 0 else minutes * 60_000, -1 if size_mb < 0 else size_mb * MiB)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None

    def watch(self, topic: RetainedTopic) -> None:
        """A topic was loaded: a pass soon after each of its rollovers."""
        key = topic.key
        topic.ml.rollover_listeners.append(lambda _ledger_id: self.request(key))
        self.request(key)

    def request(self, key: str) -> None:
        self._due.add(key)
        self._wake.set()

    async def _loop(self) -> None:
        last_full = 0.0
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval_ms / 1000)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            now = time.monotonic()
            if now - last_full >= self.interval_ms / 1000:
                keys = [t.key for t in self.service.loaded_topics()]
                last_full = now
                for key in set(self._rechecked) - set(keys):     # bounded by the loaded topics
                    del self._rechecked[key]
            else:
                keys = list(self._due)
            self._due.clear()
            for key in keys:
                topic = self.service.loaded_topic(key)
                if topic is None or topic.closing:
                    continue
                try:
                    await self.run_topic(topic)
                except asyncio.CancelledError:
                    raise
                except Exception as e:     # noqa: BLE001 - next pass retries; others go on
                    log.warning("retention pass failed topic=%s: %r", key, e)
            self.passes += 1

    async def producer_refusal(self, topic: RetainedTopic) -> PulsarliteError | None:
        """For a PRODUCER: None, or the error while the topic is over its backlog quota. A topic
        found over it by the last pass is checked again first (at most once per
        QUOTA_RECHECK_INTERVAL_S), so producers are let in as soon as the backlog shrank."""
        if topic.quota_blocked is None:
            return None
        now = time.monotonic()
        if now - self._rechecked.get(topic.key, 0.0) >= QUOTA_RECHECK_INTERVAL_S:
            self._rechecked[topic.key] = now
            try:
                policies = await self.service.policies.get_namespace_policies(
                    f"{topic.name.tenant}/{topic.name.namespace_local_name}")
                await self._backlog_quota(topic, policies.backlog_quotas, self._clock())
            except NotFoundError:
                topic.quota_blocked = None
            except PulsarliteError as e:     # keep the last verdict
                log.info("backlog quota recheck failed topic=%s: %s", topic.key, e)
        return producer_refusal(topic)

    # -- one topic -------------------------------------------------------------------------------
    async def run_topic(self, topic: RetainedTopic) -> None:
        namespace = f"{topic.name.tenant}/{topic.name.namespace_local_name}"
        try:
            policies = await self.service.policies.get_namespace_policies(namespace)
        except NotFoundError:
            return
        now_ms = self._clock()
        marks = await self._marks(topic)        # read once; kept up to date by the moves below
        if policies.message_ttl_s:
            await self._expire(topic, policies.message_ttl_s * 1000, now_ms, marks)
        await self._backlog_quota(topic, policies.backlog_quotas, now_ms, marks)
        dedup = policies.deduplication_enabled
        if dedup is None:
            dedup = self.service.config.broker_deduplication_enabled
        await self._retention(topic, RetentionLimits.from_policy(policies.retention, self._default_limits()), now_ms, marks,
                              dedup_enabled=dedup)

    async def _marks(self, topic: RetainedTopic) -> dict[str, Position]:
        """Mark-delete positions of every durable subscription: live ones from their cursor,
        idle ones from their znode."""
        marks: dict[str, Position] = {}
        for sub in list(topic.subscriptions.values()):
            if sub.durable:
                marks[sub.name] = sub.cursor.mark_delete_position
        ml_name = topic.name.managed_ledger_name
        for name in await list_cursors(self.service.store, ml_name):
            if name in marks:
                continue
            try:
                mark = await stored_mark_delete(self.service.store, ml_name, name)
            except ValueError:
                log.warning("retention: unreadable cursor topic=%s cursor=%s: kept ledgers", topic.key, name)
                mark = Position(-1, -1)       # keeps everything: never delete on a doubt
            if mark is not None:
                marks[name] = mark
        return marks

    async def _retention_marks(self, topic: RetainedTopic, marks: dict[str, Position], dedup_enabled: bool) -> dict[str, Position]:
        """The subscriptions' marks plus, while deduplication is enabled, the dedup snapshot's
        position: the entries after it are replayed by the next owner to rebuild the producers'
        last sequence ids, so they stay (Pulsar keeps them with its dedup cursor). Not a
        subscription: TTL and quotas ignore it."""
        marks = dict(marks)
        if not dedup_enabled:
            return marks
        got = await self.service.store.get_or_none(dedup_path(topic.name.managed_ledger_name))
        if got is not None:
            try:
                _, (ledger_id, entry_id) = DedupState.from_snapshot(got[0])
                marks["\x00dedup"] = Position(ledger_id, entry_id)
            except ValueError:
                marks["\x00dedup"] = Position(-1, -1)
        return marks

    async def _advance(self, topic: RetainedTopic, name: str, position: Position, why: str) -> bool:
        """Move subscription ``name``'s mark-delete forward to ``position`` (never back)."""
        sub = topic.subscriptions.get(name)
        if sub is not None:
            if not sub.durable or sub.cursor.mark_delete_position >= position:
                return False
            result = sub.cursor.ack_cumulative(position)
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                await result
            if sub.read_position <= position:
                sub.read_position = topic.next_after(position)
            sub.forget_payloads_through(position)
            sub.wake()
            log.info("%s: topic=%s subscription=%s mark-delete -> %s", why, topic.key, name, position)
            return True
        # an idle subscription: its stored cursor moves through the cursor code (one
        # compare-and-set; a consumer that comes meanwhile wins, and the next pass tries again)
        if not await advance_stored_cursor(self.service.store, topic.name.managed_ledger_name, name, position,
                                           ledgers=topic.ml.ledgers,
                                           still_idle=lambda: name not in topic.subscriptions):
            return False
        log.info("%s: topic=%s idle subscription=%s mark-delete -> %s", why, topic.key, name, position)
        return True

    async def _expire(self, topic: RetainedTopic, ttl_ms: int, now_ms: int, marks: dict[str, Position]) -> None:
        ledgers = topic.ml.ledgers()
        through, partial = ttl_expired_through(ledgers, ttl_ms, now_ms)
        if partial is not None:
            async def publish_time_at(entry_id: int) -> int | None:
                got = await topic.read_entry(Position(partial.ledger_id, entry_id))
                return None if got is None else publish_time_of(got[0])
            found = await search_last_expired(partial, publish_time_at, ttl_ms, now_ms)
            if found is not None:
                through = found
        if through is None:
            return
        for name, mark in list(marks.items()):
            if mark < through and await self._advance(topic, name, through, "message TTL"):
                marks[name] = through

    async def _backlog_quota(self, topic: RetainedTopic, quotas: Mapping[str, object], now_ms: int,
                             marks: dict[str, Position] | None = None) -> None:
        ledgers = topic.ml.ledgers()
        if marks is None:
            marks = await self._marks(topic) if quotas else {}
        verdict = check_backlog_quota(quotas, ledgers, slowest_position(marks), now_ms)
        if verdict.exceeded and verdict.policy == "consumer_backlog_eviction":
            target = eviction_target(ledgers, verdict, quotas, now_ms)
            if target is not None:
                for name, mark in list(marks.items()):
                    if mark < target and await self._advance(topic, name, target, "backlog quota eviction"):
                        marks[name] = target
            verdict = QuotaVerdict(False)
        was = topic.quota_blocked
        blocked = verdict if verdict.exceeded else None
        topic.quota_blocked = blocked
        if blocked is not None and was is None:
            log.warning("backlog quota exceeded topic=%s kind=%s policy=%s: %s; producers disconnected",
                        topic.key, blocked.kind, blocked.policy, blocked.reason)
            for producer in list(topic.producers.values()):
                producer.handle.close_by_broker()
        elif blocked is None and was is not None:
            log.info("backlog quota back under the limit topic=%s", topic.key)

    async def _retention(self, topic: RetainedTopic, limits: RetentionLimits, now_ms: int, marks: dict[str, Position], *,
                         dedup_enabled: bool = False) -> None:
        ml = topic.ml
        marks = await self._retention_marks(topic, marks, dedup_enabled)
        ids = ledgers_to_delete(ml.ledgers(), slowest_position(marks), limits, now_ms)
        if not ids and not ml.trimmed_pending():
            return
        offloader = self.service.offloader
        if offloader is not None and ids:
            await offloader.before_trim(topic.key, ids)     # [lakehouse] out of the table first
        deleter = offloader.delete_object if offloader is not None else None
        deleted = await ml.trim_ledgers(ids, delete_offloaded=deleter)
        if deleted:
            log.info("retention topic=%s deleted ledgers=%s", topic.key, deleted)


def producer_refusal(topic: RetainedTopic) -> ProducerBlockedError | None:
    """The error a new producer of ``topic`` gets while its backlog quota is exceeded: retriable
    (the client holds its sends) unless the policy is producer_exception."""
    blocked = topic.quota_blocked
    if blocked is None:
        return None
    message = f"Cannot create producer on topic with backlog quota exceeded: {blocked.reason}"
    return ProducerBlockedError(message, hold=blocked.policy != "producer_exception")


__all__ = ["QuotaVerdict",
           "RetainedSubscription", "RetainedTopic", "RetentionHost", "RetentionLimits", "RetentionService", "backlog_bytes_after", "check_backlog_quota",
           "closed_time_ms", "consumed_by_all", "eviction_target", "ledgers_to_delete",
           "oldest_unacked_publish_ms", "producer_refusal", "search_last_expired", "slowest_position",
           "ttl_expired_through"]
