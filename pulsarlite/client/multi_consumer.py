"""Subscribing: :func:`subscribe`, and the consumer over several topics or partitions.

:func:`subscribe` gives one :class:`~.consumer.ConsumerImpl` for one topic without partitions,
and otherwise a :class:`MultiConsumerImpl`: one ConsumerImpl per topic or partition, sharing one
sink; with a pattern, the topics of a namespace that match it, rediscovered periodically (as
the official clients' multi-topic and pattern consumers).
"""

from __future__ import annotations

import asyncio
import logging
import re

from pulsarlite.client.connection import ClientImpl
from pulsarlite.client.consumer import ConsumerConf, ConsumerImpl
from pulsarlite.client.errors import InvalidConfiguration
from pulsarlite.client.handler import retry_until
from pulsarlite.client.sink import Sink
from pulsarlite.client.types import MessageId, RegexSubscriptionMode
from pulsarlite.topic_name import TopicName

log = logging.getLogger("pulsarlite.client")


class MultiConsumerImpl:
    """One application-level consumer over several topics or partitions (and, with a pattern,
    the topics of a namespace matching it, rediscovered periodically). All share one sink."""

    def __init__(self, client: ClientImpl, conf: ConsumerConf, sink: Sink, *,
                 pattern: re.Pattern | None = None, namespace: str | None = None,
                 discovery_period_s: float = 60.0,
                 regex_mode: RegexSubscriptionMode = RegexSubscriptionMode.PersistentOnly) -> None:
        self.client = client
        self.regex_mode = regex_mode
        self.conf = conf
        self.sink = sink
        self.pattern = pattern
        self.namespace = namespace
        self.discovery_period_s = discovery_period_s
        self.consumers: dict[str, ConsumerImpl] = {}
        self.closed = False
        self._discovery: asyncio.Task | None = None
        self.topic = pattern.pattern if pattern is not None else None

    async def add_topics(self, topics: list[str]) -> None:
        new = []
        for topic in topics:
            for name in await self.client.topic_partitions(topic):
                if name not in self.consumers:
                    partition = TopicName.parse(name).partition_index
                    consumer = ConsumerImpl(self.client, name, self.conf, self.sink,
                                            partition=partition)
                    self.consumers[name] = consumer
                    new.append(consumer)
        results = await asyncio.gather(*(c_._start() for c_ in new), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for consumer in new:
                self.consumers.pop(consumer.topic, None)
            await asyncio.gather(*(c_.close() for c_ in new), return_exceptions=True)
            raise errors[0]

    async def _matching_topics(self) -> list[str]:
        """The namespace's topics of the regex mode (persistent, non-persistent or both) whose
        name without its domain matches the pattern without its domain (as the official clients
        filter: ``persistent://t/ns/a.*`` with AllTopics matches ``non-persistent://t/ns/ab``)."""
        topics = await self.client.topics_of_namespace(self.namespace, mode=int(self.regex_mode))
        text = self.pattern.pattern
        pattern = re.compile(text.split("://", 1)[1] if "://" in text else text, self.pattern.flags)
        out = set()
        for topic in topics:
            name = TopicName.parse(topic)
            base = str(name.partitioned_parent) if name.is_partition else str(name)
            if pattern.fullmatch(base.split("://", 1)[1]) or pattern.fullmatch(str(name).split("://", 1)[1]):
                out.add(base)
        return sorted(out)

    async def start_pattern(self) -> None:
        await self.add_topics(await self._matching_topics())
        self._discovery = self.client.spawn(self._discover_loop())
        self.client.register(self)

    async def rediscover(self) -> None:
        topics = await self._matching_topics()
        await self.add_topics(topics)
        wanted = set()
        for topic in topics:
            wanted.update(await self.client.topic_partitions(topic))
        for name in [n for n in self.consumers if n not in wanted]:
            await self.consumers.pop(name).close()

    async def _discover_loop(self) -> None:
        while not self.closed:
            await asyncio.sleep(self.discovery_period_s)
            try:
                await self.rediscover()
            except Exception as exc:
                log.warning("event=pattern_discovery_failed namespace=%s error=%r",
                            self.namespace, exc)

    def _consumer_of(self, mid: MessageId) -> ConsumerImpl:
        consumer = self.consumers.get(mid._topic) if mid._topic else None
        if consumer is None:
            raise InvalidConfiguration(f"message id {mid} does not belong to this consumer")
        return consumer

    def acknowledge(self, mid: MessageId) -> None:
        self._consumer_of(mid).acknowledge(mid)

    def acknowledge_cumulative(self, mid: MessageId) -> None:
        self._consumer_of(mid).acknowledge_cumulative(mid)

    def negative_acknowledge(self, mid: MessageId) -> None:
        self._consumer_of(mid).negative_acknowledge(mid)

    def redeliver_unacknowledged_messages(self) -> None:
        for consumer in self.consumers.values():
            consumer.redeliver_unacknowledged_messages()

    async def seek(self, target) -> None:
        await asyncio.gather(*(c_.seek(target) for c_ in self.consumers.values()))

    async def unsubscribe(self) -> None:
        await asyncio.gather(*(c_.unsubscribe() for c_ in self.consumers.values()))
        await self.close()

    async def close(self) -> None:
        self.closed = True
        self.client.unregister(self)
        if self._discovery is not None:
            self._discovery.cancel()
        await asyncio.gather(*(c_.close() for c_ in self.consumers.values()),
                             return_exceptions=True)


def _pattern_namespace(pattern: re.Pattern) -> str:
    text = pattern.pattern
    if "://" in text:
        text = text.split("://", 1)[1]
    parts = text.split("/")
    if len(parts) < 3:
        return "public/default"
    return f"{parts[0]}/{parts[1]}"


async def subscribe(client: ClientImpl, topic, conf: ConsumerConf, sink: Sink, *,
                    pattern_auto_discovery_period_s: float = 60.0,
                    regex_subscription_mode: RegexSubscriptionMode = RegexSubscriptionMode.PersistentOnly):
    client.check_open()
    if isinstance(topic, re.Pattern):
        pattern = topic
        if "://" not in pattern.pattern:
            pattern = re.compile("persistent://public/default/" + pattern.pattern)
        multi = MultiConsumerImpl(client, conf, sink, pattern=pattern,
                                  namespace=_pattern_namespace(pattern),
                                  discovery_period_s=pattern_auto_discovery_period_s,
                                  regex_mode=regex_subscription_mode)
        await multi.start_pattern()
        return multi
    topics = [topic] if isinstance(topic, str) else list(topic)
    if not topics:
        raise InvalidConfiguration("subscribe needs at least one topic")
    names = [str(TopicName.parse(t)) for t in topics]
    if len(names) == 1:
        deadline = client.loop.time() + client.operation_timeout_s
        partitions = await retry_until(deadline, client.loop,
                                        lambda: client.partitions_of(names[0]),
                                        f"partitioned metadata of {names[0]}")
        if partitions == 0:
            consumer = ConsumerImpl(client, names[0], conf, sink,
                                    partition=TopicName.parse(names[0]).partition_index)
            await consumer._start()
            return consumer
    multi = MultiConsumerImpl(client, conf, sink)
    multi.topic = names[0] if len(names) == 1 else None
    await multi.add_topics(names)
    client.register(multi)
    return multi
