"""The broker's Prometheus metrics: one :class:`BrokerMetrics` (own CollectorRegistry) per broker.

The broker calls the small ``on_*``/``set_*`` helpers on its hot paths; ``GET /metrics`` renders
:attr:`BrokerMetrics.registry`. Several brokers (or tests) in one process never share series,
because nothing is registered in prometheus_client's global registry.

Names follow Pulsar's where one exists (``pulsar_in_messages_total``, ``pulsar_msg_backlog``,
...); ours are prefixed ``pulsarlite_``. Every series carries ``cluster``; topic series carry
``namespace`` and ``topic``.

Bounded label sets (a broker may own any number of topics; Prometheus must not see unbounded
series):

- With ``topic_labels=False`` topics are aggregated per namespace (``topic="__all__"``), like
  Pulsar with ``exposeTopicLevelMetricsInPrometheus=false``.
- With ``topic_labels=True`` (default) the first ``topics_labelled_max`` topics seen get their
  own series; every further topic is counted into its namespace's ``topic="__other__"`` series.
  :meth:`BrokerMetrics.forget_topic` (call it when a topic is unloaded or deleted) removes the
  topic's series and frees its slot for the next new topic. A topic counted under ``__other__``
  stays there while it is known (its counters cannot be split afterwards).
- Namespaces are bounded likewise by ``namespaces_labelled_max`` (beyond it:
  ``namespace="__other__"``); the publish latency histogram is per namespace only.
- Bookie errors are labelled by bookie id (bounded by ``bookies_labelled_max``, then
  ``__other__``) and the error's class name (a fixed set in code).

So the number of series is at most about ``topics_labelled_max + namespaces_labelled_max`` per
topic metric, whatever the number of topics.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.utils import floatToGoString

from broker.latency import LatencyBuckets
from pulsarlite.errors import ConfigError

OTHER = "__other__"
ALL = "__all__"


@dataclass(frozen=True)
class MetricsConfig:
    cluster: str = "standalone"
    topic_labels: bool = True
    topics_labelled_max: int = 1_000
    namespaces_labelled_max: int = 100
    bookies_labelled_max: int = 100
    process_metrics: bool = True     # process_* (CPU, memory, fds), python_gc_*, python_info

    def validate(self) -> "MetricsConfig":
        for name in ("topics_labelled_max", "namespaces_labelled_max", "bookies_labelled_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"MetricsConfig.{name} must be an int >= 0, got {value!r}")
        if not isinstance(self.cluster, str) or not self.cluster:
            raise ConfigError("MetricsConfig.cluster must be a non-empty string")
        return self


def namespace_of(topic: str) -> str:
    """'persistent://t/ns/x' (or 't/ns/x') -> 't/ns'; unparsable names count as '__other__'."""
    rest = topic.split("://", 1)[-1]
    parts = rest.split("/")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        return OTHER
    return f"{parts[0]}/{parts[1]}"


class _LabelSlots:
    """At most ``slots_max`` distinct values keep their own label; the rest map to OTHER."""

    def __init__(self, slots_max: int) -> None:
        self._slots_max = slots_max
        self._labelled: set[str] = set()

    def label(self, value: str) -> str:
        if value in self._labelled:
            return value
        if len(self._labelled) < self._slots_max:
            self._labelled.add(value)
            return value
        return OTHER

    def release(self, value: str) -> bool:
        if value in self._labelled:
            self._labelled.discard(value)
            return True
        return False


class _ScrapeCollector:
    """A collector whose families are computed at scrape time from ``BrokerMetrics`` state
    (``describe`` empty: nothing to declare ahead)."""

    def __init__(self, metrics: "BrokerMetrics") -> None:
        self._metrics = metrics

    def describe(self):
        return []


class _BacklogCollector(_ScrapeCollector):
    """Backlog gauges computed at scrape time from the latest value per topic, with the same
    label bounding (the overflow series is the sum of the overflowed topics)."""

    def collect(self):
        m = self._metrics
        msgs = GaugeMetricFamily("pulsar_msg_backlog", "Messages not yet acknowledged, summed over subscriptions",
                                 labels=["cluster", "namespace", "topic"])
        size = GaugeMetricFamily("pulsar_storage_backlog_size",
                                 "Bytes not yet acknowledged by the slowest subscription",
                                 labels=["cluster", "namespace", "topic"])
        storage = GaugeMetricFamily("pulsar_storage_size", "Bytes stored for the topic (all its ledgers)",
                                    labels=["cluster", "namespace", "topic"])
        totals: dict[tuple[str, str], list[int]] = {}
        for topic, values in list(m._backlogs.items()):
            key = m._series_key(topic)
            acc = totals.setdefault(key, [0, 0, 0])
            for i, v in enumerate(values):
                acc[i] += v
        for (namespace, topic), (n_msgs, n_bytes, n_storage) in sorted(totals.items()):
            labels = [m.config.cluster, namespace, topic]
            msgs.add_metric(labels, n_msgs)
            size.add_metric(labels, n_bytes)
            storage.add_metric(labels, n_storage)
        yield msgs
        yield size
        yield storage


class _OffloadCollector(_ScrapeCollector):
    """The offloader's running totals, read at scrape time from ``metrics.offload_totals`` (a
    callable returning ``{"offloaded_bytes": n, "typed_values": n, "typed_values_undecodable": n,
    "typed_fields_unconvertible": n}``; nothing is exported while it is None: no tier)."""

    def collect(self):
        source = self._metrics.offload_totals
        if source is None:
            return
        totals = source()
        cluster = [self._metrics.config.cluster]
        offloaded = CounterMetricFamily("pulsarlite_offloaded_bytes", "Ledger bytes offloaded to the tier",
                                        labels=["cluster"])
        offloaded.add_metric(cluster, totals.get("offloaded_bytes", 0))
        yield offloaded
        values = CounterMetricFamily(
            "pulsarlite_offload_typed_values",
            "Values of AVRO/JSON topics written as typed Parquet columns by the offloader, by result "
            "(undecodable: stored as null in the typed columns; the raw value column keeps the bytes)",
            labels=["cluster", "result"])
        undecodable = totals.get("typed_values_undecodable", 0)
        values.add_metric(cluster + ["decoded"], max(0, totals.get("typed_values", 0) - undecodable))
        values.add_metric(cluster + ["undecodable"], undecodable)
        yield values
        fields = CounterMetricFamily("pulsarlite_offload_typed_fields_unconvertible",
                                     "Typed fields the offloader could not turn into a Parquet column",
                                     labels=["cluster"])
        fields.add_metric(cluster, totals.get("typed_fields_unconvertible", 0))
        yield fields


class _PublishLatencyCollector(_ScrapeCollector):
    """``pulsarlite_publish_latency_seconds``: a histogram per namespace built at scrape time
    from the counts the topics folded in (``BrokerMetrics.on_publish_latencies``)."""

    def collect(self):
        m = self._metrics
        family = HistogramMetricFamily(
            "pulsarlite_publish_latency_seconds",
            "Time from a SEND reaching the broker to its entry confirmed by the bookies (every SEND counted)",
            labels=["cluster", "namespace"])
        for namespace, buckets in sorted(m._publish_latency.items()):
            family.add_metric([m.config.cluster, namespace],
                              [(floatToGoString(bound), count) for bound, count in buckets.cumulative()],
                              buckets.sum_s)
        yield family


class BrokerMetrics:
    """The broker's metrics; call the helpers from the event loop (they are cheap and never
    block)."""

    def __init__(self, config: MetricsConfig | None = None) -> None:
        self.config = (config or MetricsConfig()).validate()
        self.registry = CollectorRegistry(auto_describe=True)
        self._topics = _LabelSlots(self.config.topics_labelled_max if self.config.topic_labels else 0)
        self._namespaces = _LabelSlots(self.config.namespaces_labelled_max)
        self._bookies = _LabelSlots(self.config.bookies_labelled_max)
        # topic -> (namespace label, topic label), so a topic keeps its series while it is known
        self._keys: dict[str, tuple[str, str]] = {}
        self._backlogs: dict[str, tuple[int, int, int]] = {}
        r = self.registry
        topic_labels = ["cluster", "namespace", "topic"]
        self.in_messages = Counter("pulsar_in_messages", "Messages published", topic_labels, registry=r)
        self.in_bytes = Counter("pulsar_in_bytes", "Bytes published (entry payloads)", topic_labels, registry=r)
        self.out_messages = Counter("pulsar_out_messages", "Messages dispatched to consumers", topic_labels,
                                    registry=r)
        self.out_bytes = Counter("pulsar_out_bytes", "Bytes dispatched to consumers", topic_labels, registry=r)
        self._publish_latency: dict[str, LatencyBuckets] = {}     # namespace label -> totals
        r.register(_PublishLatencyCollector(self))
        self.cache_size_bytes = Gauge("pulsarlite_entry_cache_size_bytes", "Bytes held by the broker's entry cache",
                                      ["cluster"], registry=r)
        self.cache_entries = Gauge("pulsarlite_entry_cache_entries", "Entries held by the broker's entry cache",
                                   ["cluster"], registry=r)
        self.cache_hits = Counter("pulsarlite_entry_cache_hits", "Entry reads served by the cache", ["cluster"],
                                  registry=r)
        self.cache_misses = Counter("pulsarlite_entry_cache_misses", "Entry reads that went to the bookies",
                                    ["cluster"], registry=r)
        self.publish_buffer_size_bytes = Gauge(
            "pulsarlite_publish_buffer_size_bytes", "Bytes of SENDs not yet answered (the broker's publish buffer)",
            ["cluster"], registry=r)
        self.publish_buffer_pauses = Counter(
            "pulsarlite_publish_buffer_pauses", "Producer connections paused because the publish buffer was full",
            ["cluster"], registry=r)
        self.bookie_errors = Counter("pulsarlite_bookie_client_errors", "Errors of requests to bookies",
                                     ["cluster", "bookie", "error"], registry=r)
        self.topics = Gauge("pulsar_topics_count", "Topics owned by this broker", ["cluster"], registry=r)
        self.producers = Gauge("pulsar_producers_count", "Producers connected", ["cluster"], registry=r)
        self.consumers = Gauge("pulsar_consumers_count", "Consumers connected", ["cluster"], registry=r)
        self.subscriptions = Gauge("pulsar_subscriptions_count", "Subscriptions of owned topics", ["cluster"],
                                   registry=r)
        r.register(_BacklogCollector(self))
        self.offload_totals = None           # set by the broker when it has a tier (_OffloadCollector)
        r.register(_OffloadCollector(self))
        if self.config.process_metrics:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        c = self.config.cluster
        for gauge in (self.cache_size_bytes, self.cache_entries, self.publish_buffer_size_bytes, self.topics,
                      self.producers, self.consumers, self.subscriptions):
            gauge.labels(c).set(0)
        self.cache_hits.labels(c)
        self.cache_misses.labels(c)
        self.publish_buffer_pauses.labels(c)

    # -- labels ------------------------------------------------------------------------------
    def _series_key(self, topic: str) -> tuple[str, str]:
        key = self._keys.get(topic)
        if key is None:
            namespace = self._namespaces.label(namespace_of(topic))
            if not self.config.topic_labels:
                key = (namespace, ALL)
            elif namespace == OTHER:
                key = (namespace, OTHER)
            else:
                key = (namespace, self._topics.label(topic))
            self._keys[topic] = key
        return key

    # -- helpers the broker calls ------------------------------------------------------------
    def on_publish(self, topic: str, n_msgs: int, n_bytes: int) -> None:
        """Entries confirmed: ``n_msgs`` messages (batch members counted), ``n_bytes`` payload
        bytes."""
        namespace, label = self._series_key(topic)
        c = self.config.cluster
        self.in_messages.labels(c, namespace, label).inc(n_msgs)
        self.in_bytes.labels(c, namespace, label).inc(n_bytes)

    def on_publish_latencies(self, topic: str, buckets: LatencyBuckets) -> None:
        """A topic's publish latencies since its last fold (counts per bucket)."""
        namespace, _ = self._series_key(topic)
        totals = self._publish_latency.get(namespace)
        if totals is None:
            totals = self._publish_latency[namespace] = LatencyBuckets()
        totals.merge(buckets)

    def on_dispatch(self, topic: str, n_msgs: int, n_bytes: int) -> None:
        """Messages sent to consumers (any subscription of ``topic``)."""
        namespace, label = self._series_key(topic)
        c = self.config.cluster
        self.out_messages.labels(c, namespace, label).inc(n_msgs)
        self.out_bytes.labels(c, namespace, label).inc(n_bytes)

    def set_backlog(self, topic: str, msg_backlog: int, backlog_bytes: int, storage_bytes: int = 0) -> None:
        """The topic's current backlog (messages summed over subscriptions; bytes of the
        slowest subscription) and stored size."""
        self._series_key(topic)
        self._backlogs[topic] = (int(msg_backlog), int(backlog_bytes), int(storage_bytes))

    def forget_topic(self, topic: str) -> None:
        """The topic is no longer served here: drop its backlog and, if it had its own series,
        remove them and free its label slot."""
        self._backlogs.pop(topic, None)
        key = self._keys.pop(topic, None)
        if key is None or key[1] in (OTHER, ALL):
            return
        self._topics.release(topic)
        labels = (self.config.cluster, key[0], key[1])
        for counter in (self.in_messages, self.in_bytes, self.out_messages, self.out_bytes):
            try:
                counter.remove(*labels)
            except KeyError:
                pass

    def set_cache(self, size_bytes: int, entries: int) -> None:
        c = self.config.cluster
        self.cache_size_bytes.labels(c).set(size_bytes)
        self.cache_entries.labels(c).set(entries)

    def set_publish_buffer(self, size_bytes: int) -> None:
        self.publish_buffer_size_bytes.labels(self.config.cluster).set(size_bytes)

    def on_publish_buffer_pause(self, n: int = 1) -> None:
        self.publish_buffer_pauses.labels(self.config.cluster).inc(n)

    def on_cache_hit(self, n: int = 1) -> None:
        self.cache_hits.labels(self.config.cluster).inc(n)

    def on_cache_miss(self, n: int = 1) -> None:
        self.cache_misses.labels(self.config.cluster).inc(n)

    def on_bookie_error(self, bookie: str, error: BaseException | str) -> None:
        """A request to ``bookie`` failed; ``error`` is the exception (its class name is the
        label) or a short fixed code."""
        kind = error if isinstance(error, str) else type(error).__name__
        self.bookie_errors.labels(self.config.cluster, self._bookies.label(bookie), kind).inc()

    def set_counts(self, *, topics: int, producers: int, consumers: int, subscriptions: int) -> None:
        c = self.config.cluster
        self.topics.labels(c).set(topics)
        self.producers.labels(c).set(producers)
        self.consumers.labels(c).set(consumers)
        self.subscriptions.labels(c).set(subscriptions)

    # -- exposition ----------------------------------------------------------------------------
    def render(self, accept: str = "") -> tuple[bytes, str]:
        """(body, content type) for a scrape with this Accept header (text format 0.0.4/1.0.0,
        or OpenMetrics when asked for)."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type


__all__ = ["BrokerMetrics", "MetricsConfig", "namespace_of", "OTHER", "ALL"]
