"""BrokerService: what one broker process holds -- the topics it has loaded, the factories of
their managed ledgers and cursors, the shared entry cache and publish buffer, schemas, names.

Topics load on first use (PRODUCER, SUBSCRIBE, ...) if this broker owns them; loading opens
the managed ledger (fencing any previous owner). Concurrent loads of one topic share one task.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import logging
import re
import time
from urllib.parse import unquote_plus

from broker.admin.metrics import BrokerMetrics, MetricsConfig
from broker.admin.policies import AdminError, NotFoundError, PolicyStore, split_namespace
from broker.config import BrokerConfig
from broker.errors import (BrokerError, NotAllowedError, ProducerBusyError, ServiceNotReadyError,  # noqa: F401
                           TopicNotFoundError, server_error_of)
from broker.latency import LatencyBuckets
from broker.managed_ledger import ManagedLedger, ManagedLedgerClosedError
from broker.nonpersistent import NonPersistentTopic, registration_path
from broker.offloader import BrokerOffloader
from broker.ownership.topics import ManagedOwnership
from broker.compaction.shell import CompactionService
from broker.retention import RetentionService, publish_time_of
from broker.schema_compat import CompatibilityStrategy
from broker.schemas import SchemaRegistry
from broker.security.authentication import AuthenticationService
from broker.security.authorization import AuthorizationError, AuthorizationService, AuthPolicies, TopicOperation
from broker.termination import read_terminated
from broker.topic import EntryCache, PersistentTopic, PublishBuffer
from pulsarlite.metadata_layout import (MANAGED_LEDGERS_ROOT, managed_ledger_path, non_persistent_of_namespace_path,
                                       partitioned_topic_path, partitioned_topics_of_namespace_path)
from pulsarlite.metadata_documents import PartitionedTopicMetadata, decode_partitioned_metadata, encode_partitioned_metadata
from pulsarlite.topic_name import TopicName

log = logging.getLogger("pulsarlite.broker")



class ServiceMetrics(BrokerMetrics):
    """BrokerMetrics that first folds the broker's plain counters in (at each scrape)."""

    def __init__(self, config: MetricsConfig, before_render) -> None:
        super().__init__(config)
        self._before_render = before_render

    def render(self, accept: str = "") -> tuple[bytes, str]:
        try:
            self._before_render()
        except Exception:   # a scrape never fails because of a counter
            log.exception("metrics flush failed")
        return super().render(accept)


_BOOKIE_IN_MESSAGE = re.compile(r"bookie ([^\s:]+:\d+)")


class BrokerService:
    def __init__(self, config: BrokerConfig, *, store, ledger_client, ownership: ManagedOwnership) -> None:
        self.config = config
        self.store = store
        self.ledger_client = ledger_client
        self.ownership = ownership
        self.broker_id = config.effective_broker_id
        self.service_url = config.service_url
        self.entry_cache = EntryCache(config.dispatch.entry_cache_bytes_max)
        self.publish_buffer = PublishBuffer(config.publish_buffer_bytes_max)
        self.schemas = SchemaRegistry(store, policy_lookup=self._schema_policy)
        self.topics: dict[str, asyncio.Task] = {}
        # non-persistent topics (broker/nonpersistent.py): in memory, loaded at once on first use
        self.nonpersistent: dict[str, NonPersistentTopic] = {}
        self._producer_names = itertools.count()
        self._producer_name_token = secrets.token_hex(4)
        self.closing = False
        self._unloading: dict[str, asyncio.Future] = {}
        self.metrics = ServiceMetrics(MetricsConfig(cluster=config.cluster_name), self.flush_metrics)
        self.policies = PolicyStore(store, list_topics=self.namespace_topics_and_partitioned)
        self.offloader = BrokerOffloader.create(config, ledger_client, self.policies, store=store)  # None: no tier
        if self.offloader is not None:
            self.metrics.offload_totals = self.offloader.totals
        self.retention = RetentionService(self, interval_ms=config.retention_check_interval_ms)
        self.compaction = CompactionService(self, interval_ms=config.compaction_check_interval_ms,
                                            keys_max=config.compaction_keys_max)
        self.cache_hits = 0
        self.cache_misses = 0
        self._cache_flushed = (0, 0)
        self._pauses_flushed = 0
        # rate samples: key -> (monotonic s, messages, bytes) at the last two stats ticks
        self._samples_prev: dict[tuple, tuple[float, int, int]] = {}
        self._samples: dict[tuple, tuple[float, int, int]] = {}
        self._stats_task: asyncio.Task | None = None
        ownership.add_lost_listener(self._on_ownership_lost)
        # [security] key and password files are read here, at start (a bad one: ConfigError)
        self.authentication = AuthenticationService.from_config(config)
        self.authorization = AuthorizationService.from_config(config)

    def _on_ownership_lost(self, is_lost) -> None:
        """Unload every loaded topic (persistent or not) whose bundle this broker lost (or whose
        name no longer parses)."""
        for loaded, unload in ((self.topics, self.unload_topic), (self.nonpersistent, self.unload_nonpersistent)):
            for key in list(loaded):
                try:
                    lost = is_lost(TopicName.parse(key))
                except Exception:
                    lost = True
                if lost:
                    log.warning("ownership of %s lost: unloading", key)
                    task = asyncio.ensure_future(unload(key))
                    task.add_done_callback(lambda t: t.cancelled() or t.exception())

    # -- names -----------------------------------------------------------------------------------
    def next_producer_name(self) -> str:
        """Unique across restarts of this broker (a token per start): a name given to a new
        producer must never be one an earlier producer used, or deduplication would answer the
        new producer's sequence ids with the old one's (found by the chaos suite: a broker
        restarted on the same port handed out the same names again)."""
        host = self.broker_id.replace(":", "-")
        return f"pulsarlite-{host}-{self._producer_name_token}-{next(self._producer_names)}"

    # -- [security] authorization ----------------------------------------------------------------
    async def authorize_topic(self, role: str | None, topic_name: str, operation: TopicOperation) -> None:
        """AuthorizationError unless ``role`` may do ``operation`` on the topic (superuser, the
        tenant's admin, or a namespace/topic permission: broker/security/authorization.py).
        Nothing to check with authorization off."""
        authz = self.authorization
        if not authz.enabled or authz.is_superuser(role):
            return
        topic = TopicName.parse(topic_name)
        admin_roles, auth = await self.auth_context(topic.namespace)
        if not authz.allows_topic(role, operation, str(topic), auth, admin_roles):
            log.info("authorization refused role=%s operation=%s topic=%s", role, operation.value, topic)
            raise AuthorizationError(f"role {role} may not {operation.value} on {topic}")

    async def authorize_namespace_topics(self, role: str | None, namespace: str) -> None:
        authz = self.authorization
        if not authz.enabled or authz.is_superuser(role):
            return
        admin_roles, auth = await self.auth_context(namespace)
        if not authz.allows_namespace_topics(role, auth, admin_roles):
            log.info("authorization refused role=%s operation=list-topics namespace=%s", role, namespace)
            raise AuthorizationError(f"role {role} may not list the topics of {namespace}")

    async def auth_context(self, namespace: str) -> tuple[tuple[str, ...], AuthPolicies]:
        """(the tenant's admin roles, the namespace's permissions); a missing tenant or namespace
        grants nothing (only superusers go on, to be told it does not exist)."""
        try:
            tenant, _ = split_namespace(namespace)
            info = await self.policies.get_tenant(tenant)
        except AdminError:
            return (), AuthPolicies()
        try:
            policies = await self.policies.get_namespace_policies(namespace)
        except AdminError:
            return info.admin_roles, AuthPolicies()
        return info.admin_roles, policies.auth_policies

    # -- discovery -------------------------------------------------------------------------------
    async def lookup(self, topic_name: str, *, authoritative: bool = False,
                     listener_name: str = "") -> tuple[str, bool, bool, str]:
        """(service URL of the owner, whether it is this broker, authoritative, the owner's TLS
        service URL or "" when it has no TLS listener); with ``listener_name``, the URLs of that
        advertised listener of the owner (BrokerConfig.advertised_listeners)."""
        topic = TopicName.parse(topic_name)
        return await self.ownership.lookup(topic, authoritative=authoritative, listener_name=listener_name)

    async def partitions(self, topic_name: str) -> int:
        """Partition count from ``/admin/partitioned-topics/<tenant>/<ns>/persistent/<topic>``
        (:class:`PartitionedTopicMetadata`, written by the admin API); 0: not partitioned."""
        topic = TopicName.parse(topic_name)
        if topic.partition_index >= 0:
            return 0
        got = await self.store.get_or_none(partitioned_topic_path(topic.managed_ledger_name))
        if got is None:
            return 0
        try:
            return decode_partitioned_metadata(got[0]).partitions
        except ValueError as e:
            log.warning("bad partitioned-topic metadata topic=%s: %s", topic, e)
            return 0

    async def partitions_or_create(self, topic_name: str) -> int:
        """PARTITIONED_METADATA: the partition count. A topic that does not exist yet, in a
        namespace whose auto-creation policy says ``partitioned``, is created partitioned with
        ``defaultNumPartitions`` (its partitions are created on first use), as Pulsar does on
        the client's first metadata request."""
        n = await self.partitions(topic_name)
        topic = TopicName.parse(topic_name)
        if n > 0 or topic.partition_index >= 0 or not _is_persistent(topic):
            return n
        if await self.store.exists(managed_ledger_path(topic.managed_ledger_name)):
            return 0
        try:
            policies = await self.policies.get_namespace_policies(
                f"{topic.tenant}/{topic.namespace_local_name}")
        except NotFoundError:
            return 0
        auto = policies.auto_topic_creation
        if auto is None or not auto.allow or auto.topic_type != "partitioned" or not auto.default_partitions:
            return 0
        from pulsarlite.metadata import MetadataExistsError
        try:
            await self.store.create(partitioned_topic_path(topic.managed_ledger_name),
                                    encode_partitioned_metadata(PartitionedTopicMetadata(auto.default_partitions)),
                                    make_parents=True)
            log.info("partitioned topic auto-created %s partitions=%d", topic, auto.default_partitions)
        except MetadataExistsError:
            pass
        return await self.partitions(topic_name)

    async def topics_of_namespace(self, namespace: str, mode: str = "PERSISTENT") -> list[str]:
        """The namespace's topics as Pulsar's getTopicsOfNamespace lists them, by ``mode``
        PERSISTENT (managed ledgers), NON_PERSISTENT (the non-persistent topics loaded on any
        broker now: their ephemeral znodes) or ALL; the partitions of partitioned topics of
        that kind, also those not created yet (they are on first use): pattern consumers
        subscribe to them."""
        parts = namespace.split("/")
        if len(parts) != 2:
            raise NotAllowedError(f"invalid namespace {namespace!r}")
        if mode not in ("PERSISTENT", "NON_PERSISTENT", "ALL"):
            raise NotAllowedError(f"mode must be PERSISTENT, NON_PERSISTENT or ALL, got {mode!r}")
        topics: list[str] = []
        domains = {"PERSISTENT": ("persistent",), "NON_PERSISTENT": ("non-persistent",),
                   "ALL": ("persistent", "non-persistent")}[mode]
        for domain in domains:
            root = f"{MANAGED_LEDGERS_ROOT}/{namespace}/persistent" if domain == "persistent" else \
                non_persistent_of_namespace_path(namespace)
            names = await self.store.children(root)
            listed = [f"{domain}://{namespace}/{unquote_plus(n)}" for n in names]
            seen = set(listed)
            for parent in await self.store.children(partitioned_topics_of_namespace_path(namespace, domain)):
                full = f"{domain}://{namespace}/{unquote_plus(parent)}"
                for i in range(await self.partitions(full)):
                    name = f"{full}-partition-{i}"
                    if name not in seen:
                        seen.add(name)
                        listed.append(name)
            topics.extend(listed)
        return topics

    async def namespace_topics_and_partitioned(self, namespace: str) -> list[str]:
        """Every topic of the namespace: managed ledgers and partitioned-topic metadata (what
        keeps a namespace from being deleted)."""
        topics = await self.topics_of_namespace(namespace)
        parents = await self.store.children(partitioned_topics_of_namespace_path(namespace))
        return topics + [f"persistent://{namespace}/{unquote_plus(n)}" for n in parents]

    # -- topics ----------------------------------------------------------------------------------
    async def _schema_policy(self, namespace: str):
        """(compatibility strategy, allow auto update) of a namespace, for the schema registry;
        a namespace without policies gets the defaults."""
        try:
            p = await self.policies.get_namespace_policies(namespace)
        except NotFoundError:
            return CompatibilityStrategy.UNDEFINED, True
        return CompatibilityStrategy.parse(p.schema_compatibility_strategy), p.is_allow_auto_update_schema

    async def get_topic(self, topic_name: str, *, create: bool = True) -> PersistentTopic:
        if self.closing:
            raise ServiceNotReadyError("broker is shutting down")
        topic = TopicName.parse(topic_name)
        if not self.ownership.owns(topic) and not await self.ownership.ensure_owned(topic):
            raise ServiceNotReadyError(f"topic {topic} is not owned by this broker")
        if not _is_persistent(topic):
            return await self._get_nonpersistent(topic, create)
        key = str(topic)
        unloading = self._unloading.get(key)
        if unloading is not None:     # a close in progress finishes before the topic loads again
            try:
                await asyncio.wait_for(asyncio.shield(unloading), self.config.topic_load_timeout_ms / 1000)
            except asyncio.TimeoutError:
                raise ServiceNotReadyError(f"topic {topic} is still unloading") from None
        task = self.topics.get(key)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.ensure_future(self._load(topic, create))
            self.topics[key] = task
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.config.topic_load_timeout_ms / 1000)
        except asyncio.TimeoutError:
            raise ServiceNotReadyError(f"topic {topic} is still loading") from None
        except BaseException:
            if self.topics.get(key) is task and task.done():
                del self.topics[key]
            raise

    async def _get_nonpersistent(self, topic: TopicName, create: bool) -> NonPersistentTopic:
        """The loaded non-persistent topic, or a new one (``create``: auto-creation rules as
        for persistent topics; registered by an ephemeral znode so every broker lists it)."""
        key = str(topic)
        loaded = self.nonpersistent.get(key)
        if loaded is not None:
            return loaded
        if not create:
            raise TopicNotFoundError(f"topic {topic} does not exist")
        await self.check_auto_creation(topic)
        loaded = self.nonpersistent.get(key)       # another load won meanwhile
        if loaded is not None:
            return loaded
        created = NonPersistentTopic(self, topic)
        self.nonpersistent[key] = created
        from pulsarlite.metadata import MetadataExistsError
        try:
            await self.store.create(registration_path(topic), self.broker_id.encode(), ephemeral=True)
        except MetadataExistsError:
            pass             # a previous owner's znode, gone with its session
        except Exception:
            self.nonpersistent.pop(key, None)
            raise
        log.info("topic loaded %s", topic)
        return created

    async def unload_nonpersistent(self, key: str) -> bool:
        """Close a non-persistent topic: clients are disconnected (they look it up again), its
        in-flight messages are gone, its znode removed. False if it was not loaded."""
        topic = self.nonpersistent.pop(key, None)
        if topic is None:
            return False
        self._flush_topic(topic)
        await topic.close()
        try:
            got = await self.store.get_or_none(registration_path(topic.name))
            if got is not None and got[0] == self.broker_id.encode():
                await self.store.delete(registration_path(topic.name), got[1])
        except Exception as e:    # noqa: BLE001 - the ephemeral znode goes with the session anyway
            log.info("topic znode not removed topic=%s error=%r", key, e)
        self.metrics.forget_topic(key)
        log.info("topic unloaded %s", key)
        return True

    async def _load(self, topic, create: bool) -> PersistentTopic:
        name = topic.managed_ledger_name
        if not await self.store.exists(managed_ledger_path(name)):
            if not create:
                raise TopicNotFoundError(f"topic {topic} does not exist")
            await self.check_auto_creation(topic)
        terminated_at = await read_terminated(self.store, name)
        ml = await ManagedLedger.open(name, ledger_client=self.ledger_client, store=self.store,
                                      config=self.config.managed_ledger_config(),
                                      publish_time_of=publish_time_of,
                                      write_guard=self.ownership.list_guard())
        log.info("topic loaded %s", topic)
        persistent = PersistentTopic(self, topic, ml)
        persistent.terminated_at = terminated_at          # Pulsar's terminate survives reloads
        persistent.terminating = terminated_at is not None
        if self.offloader is not None:
            self.offloader.attach(persistent)
        self.retention.watch(persistent)      # retention / TTL / backlog quota passes
        return persistent

    async def check_auto_creation(self, topic: TopicName) -> None:
        """A topic may be created on first use only in a namespace that exists (and is not being
        deleted) and whose policies (else the broker's config) allow auto-creation."""
        namespace = topic.namespace
        try:
            policies = await self.policies.get_namespace_policies(namespace)
        except NotFoundError as e:
            raise TopicNotFoundError(f"topic {topic} cannot be created: {e}") from None
        allowed = self.config.topic_auto_creation
        if policies.auto_topic_creation is not None:
            allowed = policies.auto_topic_creation.allow
        if not allowed:
            raise TopicNotFoundError(f"topic {topic} does not exist and auto-creation is disabled "
                                     f"in namespace {namespace}")

    def loaded_topic(self, key: str) -> PersistentTopic | None:
        task = self.topics.get(key)
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    def loaded_topics(self) -> list[PersistentTopic]:
        return [t for t in (self.loaded_topic(k) for k in list(self.topics)) if t is not None]

    async def unload_topic(self, key: str, *, delete: bool = False, before_close=None) -> bool:
        """Close (or, with ``delete``, delete) a loaded topic. Loads of the same topic wait until
        it is done, so a reconnecting client never races the close. ``before_close()`` (async)
        runs once the topic is out of the registry, before it closes (e.g. to release its
        bundle). False if it was not loaded."""
        task = self.topics.pop(key, None)
        if task is None:
            return False
        done = asyncio.get_running_loop().create_future()
        self._unloading[key] = done
        try:
            try:
                topic = await task
            except BaseException:
                return False
            if before_close is not None:
                await before_close()
            self._flush_topic(topic)
            if self.offloader is not None:
                await self.offloader.detach(key)
            if delete:
                await topic.delete()
                log.info("topic deleted %s", key)
            else:
                await topic.close()
                log.info("topic unloaded %s", key)
            return True
        finally:
            if self._unloading.get(key) is done:
                del self._unloading[key]
            done.set_result(None)
            self.metrics.forget_topic(key)

    # -- stats and metrics -----------------------------------------------------------------------
    def start(self) -> None:
        if self._stats_task is None:
            self._stats_task = asyncio.ensure_future(self._stats_loop())
        if self.offloader is not None:
            self.offloader.start()
        self.retention.start()
        self.compaction.start()

    async def _stats_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.stats_interval_ms / 1000)
            try:
                self.stats_tick()
            except Exception:
                log.exception("stats update failed")

    def stats_tick(self) -> None:
        """Sample counters for the rates, update backlog gauges, fold counters into metrics.
        Work is bounded by the number of loaded topics, producers and subscriptions."""
        now = time.monotonic()
        samples: dict[tuple, tuple[float, int, int]] = {}
        for topic in self.loaded_topics():
            samples[("t", topic.key)] = (now, topic.msg_in, topic.bytes_in)
            samples[("to", topic.key)] = (now, topic.msg_out, topic.bytes_out)
            for p in topic.producers.values():
                samples[("p", topic.key, p.name)] = (now, p.msg_in, p.bytes_in)
            for sub in topic.subscriptions.values():
                samples[("s", topic.key, sub.name)] = (now, sub.msg_out, sub.bytes_out)
            backlog, backlog_bytes, storage = self.topic_backlog(topic)
            self.metrics.set_backlog(topic.key, backlog, backlog_bytes, storage)
        # non-persistent counters start at 0 when their topic or subscription is created: that
        # is their first sample, so what happened before the first tick shows in the rates
        # (drops come in bursts, often right after a subscription appears)
        baselines: dict[tuple, tuple[float, int, int]] = {}
        for topic in list(self.nonpersistent.values()):
            for key in (("t", topic.key), ("to", topic.key), ("d", topic.key)):
                baselines[key] = (topic.created_s, 0, 0)
            for sub in topic.subscriptions.values():
                baselines[("s", topic.key, sub.name)] = (sub.created_s, 0, 0)
                baselines[("sd", topic.key, sub.name)] = (sub.created_s, 0, 0)
            samples[("t", topic.key)] = (now, topic.msg_in, topic.bytes_in)
            samples[("to", topic.key)] = (now, topic.msg_out, topic.bytes_out)
            samples[("d", topic.key)] = (now, topic.msg_dropped, 0)
            for p in topic.producers.values():
                samples[("p", topic.key, p.name)] = (now, p.msg_in, p.bytes_in)
            for sub in topic.subscriptions.values():
                samples[("s", topic.key, sub.name)] = (now, sub.msg_out, sub.bytes_out)
                samples[("sd", topic.key, sub.name)] = (now, sub.msg_dropped, 0)
        self._samples_prev, self._samples = self._samples, samples
        for key, baseline in baselines.items():
            self._samples_prev.setdefault(key, baseline)
        self.flush_metrics()

    def rate(self, key: tuple) -> tuple[float, float]:
        """(messages/s, bytes/s) over the last complete stats interval."""
        prev, cur = self._samples_prev.get(key), self._samples.get(key)
        if prev is None or cur is None or cur[0] <= prev[0]:
            return 0.0, 0.0
        dt = cur[0] - prev[0]
        return (cur[1] - prev[1]) / dt, (cur[2] - prev[2]) / dt

    def topic_backlog(self, topic: PersistentTopic) -> tuple[int, int, int]:
        """(entries not acked summed over subscriptions, bytes of the slowest, stored bytes)."""
        ledgers = topic.ml.ledgers()
        entries = sum(i.entries for i in ledgers)
        storage = sum(i.size_bytes for i in ledgers)
        avg = storage / entries if entries else 0
        total = slowest = 0
        last = topic.ml.last_confirmed_position
        for sub in topic.subscriptions.values():
            n = sub.cursor.backlog(last, ledgers)
            total += n
            slowest = max(slowest, n)
        return total, int(slowest * avg), storage

    def _flush_topic(self, topic: PersistentTopic) -> None:
        mi, bi, mo, bo = topic.flushed
        latencies = topic.publish_latency
        if topic.msg_in != mi or topic.bytes_in != bi:
            self.metrics.on_publish(topic.key, topic.msg_in - mi, topic.bytes_in - bi)
        if latencies.total:
            topic.publish_latency = LatencyBuckets()
            self.metrics.on_publish_latencies(topic.key, latencies)
        if topic.msg_out != mo or topic.bytes_out != bo:
            self.metrics.on_dispatch(topic.key, topic.msg_out - mo, topic.bytes_out - bo)
        topic.flushed = (topic.msg_in, topic.bytes_in, topic.msg_out, topic.bytes_out)

    def flush_metrics(self) -> None:
        topics = self.loaded_topics()
        for topic in topics:
            self._flush_topic(topic)
        for np_topic in list(self.nonpersistent.values()):
            self._flush_topic(np_topic)
        hits, misses = self._cache_flushed
        if self.cache_hits > hits:
            self.metrics.on_cache_hit(self.cache_hits - hits)
        if self.cache_misses > misses:
            self.metrics.on_cache_miss(self.cache_misses - misses)
        self._cache_flushed = (self.cache_hits, self.cache_misses)
        pauses = self.publish_buffer.pauses
        if pauses > self._pauses_flushed:
            self.metrics.on_publish_buffer_pause(pauses - self._pauses_flushed)
        self._pauses_flushed = pauses
        self.metrics.set_publish_buffer(self.publish_buffer.bytes)
        cache = self.entry_cache
        self.metrics.set_cache(cache.bytes, cache.entry_count)
        served = [*topics, *self.nonpersistent.values()]
        self.metrics.set_counts(
            topics=len(served), producers=sum(len(t.producers) for t in served),
            consumers=sum(len(s.consumers) for t in served for s in t.subscriptions.values()),
            subscriptions=sum(len(t.subscriptions) for t in served))

    def on_add_error(self, error: BaseException) -> None:
        """An add to the bookies failed (counted per bookie when the error names one)."""
        if isinstance(error, ManagedLedgerClosedError):
            return
        found = _BOOKIE_IN_MESSAGE.search(str(error))
        self.metrics.on_bookie_error(found.group(1) if found else "unknown", error)

    async def close(self) -> None:
        """Close every topic (adds in flight finish, managed ledgers closed cleanly)."""
        self.closing = True
        if self._stats_task is not None:
            self._stats_task.cancel()
        await self.retention.close()
        await self.compaction.close()
        keys = list(self.topics)
        await asyncio.gather(*(self.unload_topic(k) for k in keys), return_exceptions=True)
        await asyncio.gather(*(self.unload_nonpersistent(k) for k in list(self.nonpersistent)),
                             return_exceptions=True)
        if self.offloader is not None:
            await self.offloader.close()


def _is_persistent(topic) -> bool:
    return not str(topic).startswith("non-persistent")


__all__ = ["BrokerError", "BrokerService", "NotAllowedError", "ProducerBusyError",
           "ServiceNotReadyError", "TopicNotFoundError", "server_error_of"]
