"""A non-persistent topic on its owner broker (``non-persistent://tenant/ns/topic``, Pulsar's
PIP-2): in memory only, best-effort dispatch to the consumers connected now.

Protocol (as Pulsar's NonPersistentTopic):

- SEND -> the entry is checked as a persistent topic's would be (metadata readable, size
  bounds), then offered at once to every subscription of the topic; the producer gets its
  SEND_RECEIPT right away with message id ``0:0`` (what Pulsar's broker answers: nothing is
  stored, so there is no ledger position; the receipt means "accepted by the broker", not
  "stored"). No ledger, no bookie write, no cursor znode, no deduplication.
- Each subscription gives an entry to a consumer by the same :class:`DispatcherCore` policy as
  persistent subscriptions (Exclusive/Failover: the active consumer; Shared: round robin over the
  consumers with permits; Key_Shared: the key's consumer), through
  :meth:`DispatcherCore.dispatch_best_effort`: if the chosen consumer (or every consumer) has no
  permit left, the entry is dropped for that subscription and its messages counted
  (``msgDropRate`` in the stats). Delivered messages are not tracked: acks are ignored (the
  official clients do not send them for non-persistent topics), nothing is redelivered.
  Messages delivered carry the id ``0:0`` (Pulsar's), with the partition index of the topic.
- A subscription exists while it has consumers; it is removed with its last consumer. A
  consumer that subscribes after a SEND never gets that message.
- The topic lives while it is loaded on its owner (the same bundle ownership and lookup as a
  persistent topic); an ephemeral znode ``/non-persistent/<tenant>/<ns>/<encoded name>`` says it
  exists, so every broker lists it (CommandGetTopicsOfNamespace, the admin API). It goes with
  the broker (unload, restart, crash): in-flight messages are lost by design.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from broker.dispatch import ConsumerBusyError, DispatcherCore, KeySharedMode, SubType
from broker.errors import NotAllowedError, ServiceNotReadyError
from broker.latency import LatencyBuckets
from broker.managed_ledger import Position
from broker.publish_core import AccessMode, Producer
from broker.topic import _slot_of
from broker.topic_common import ExclusiveAccess, attach_consumer, check_edge, detach_consumer
from pulsarlite.metadata_layout import non_persistent_path

log = logging.getLogger("pulsarlite.broker")

MESSAGE_ID = Position(0, 0)          # Pulsar's id for every non-persistent message and receipt
NO_POSITION = Position(-1, -1)


def registration_path(name) -> str:
    """``/non-persistent/<tenant>/<ns>/<encoded local name>`` of a TopicName."""
    return non_persistent_path(name.tenant, name.namespace_local_name, name.encoded_local_name)


class _NoCursor:
    """What GET_LAST_MESSAGE_ID reads from a subscription: nothing is acked or stored."""

    mark_delete_position = NO_POSITION


class NonPersistentSubscription:
    """A subscription of a non-persistent topic: consumers and the dispatcher core, no cursor."""

    durable = False
    cursor = _NoCursor()

    def __init__(self, topic: "NonPersistentTopic", name: str, sub_type: SubType, *,
                 key_shared_mode: KeySharedMode = KeySharedMode.AUTO_SPLIT,
                 allow_out_of_order: bool = False) -> None:
        self.topic = topic
        self.name = name
        self.sub_type = sub_type
        partition = topic.name.partition_index
        self.core = DispatcherCore(sub_type, partition_index=partition if isinstance(partition, int) else -1,
                                   key_shared_mode=key_shared_mode, allow_out_of_order=allow_out_of_order)
        self.consumers: dict[int, Any] = {}       # id(handle) -> handle
        self.msg_out = 0
        self.bytes_out = 0
        self.msg_dropped = 0
        self.created_s = time.monotonic()      # the counters' first sample (stats rates)

    # -- consumers -------------------------------------------------------------------------------
    async def last_message_id(self) -> tuple[int, int, int]:
        """GET_LAST_MESSAGE_ID for this subscription's consumer: the topic's."""
        return await self.topic.last_message_id()

    def add_consumer(self, consumer, *, priority: int = 0, name: str = "", hash_ranges=None) -> None:
        attach_consumer(self.sub_type, self.core, self.consumers, consumer, priority=priority, name=name,
                        hash_ranges=hash_ranges, writable=getattr(consumer, "writable", True))

    def remove_consumer(self, consumer) -> None:
        if detach_consumer(self.sub_type, self.core, self.consumers, consumer) and not self.consumers:
            self.topic.drop_subscription(self)

    def flow(self, consumer, permits: int) -> None:
        self.core.flow(id(consumer), permits)

    def set_writable(self, consumer, writable: bool) -> None:
        """Back-pressure from the consumer's connection: while its write buffer is above the
        high-water mark it is given nothing and what it would have been given is dropped (counted),
        as Pulsar's non-persistent dispatchers drop for a consumer whose channel is not writable."""
        if id(consumer) in self.consumers:
            self.core.set_writable(id(consumer), writable)

    def ack(self, consumer, message_ids, *, cumulative: bool) -> None:
        """Nothing to ack: delivered messages are not tracked (Pulsar ignores them too)."""

    def redeliver(self, consumer, message_ids=None) -> None:
        """Nothing to redeliver: a non-persistent message is delivered at most once."""

    async def seek(self, *, message_id=None, publish_time_ms: int | None = None):
        raise NotAllowedError(f"seek is not supported on non-persistent topic {self.topic.key}")

    # -- dispatch --------------------------------------------------------------------------------
    def offer(self, entries: list[tuple[int, bytes, int]]) -> None:
        """Entries ``[(sequence, data, message count), ...]`` just published: delivered now to
        consumers with permits, the rest dropped (counted)."""
        key_shared = self.sub_type is SubType.KEY_SHARED
        offered = [(seq, count, _slot_of(data)) if key_shared else (seq, count) for seq, data, count in entries]
        deliveries, dropped = self.core.dispatch_best_effort(offered)
        self.msg_dropped += dropped
        self.topic.msg_dropped += dropped
        if not deliveries:
            return
        by_seq = {seq: data for seq, data, _ in entries}
        msgs = size = 0
        for d in deliveries:
            consumer = self.consumers.get(d.consumer)
            if consumer is None:
                continue
            data = by_seq[d.position]
            consumer.send_message(MESSAGE_ID, data, 0)
            msgs += d.message_count
            size += len(data)
        self.msg_out += msgs
        self.bytes_out += size
        self.topic.msg_out += msgs
        self.topic.bytes_out += size


class NonPersistentTopic:
    """The broker side of one non-persistent topic (see the module docstring)."""

    is_persistent = False
    quota_blocked = None           # no backlog, no quota
    terminating = False

    def __init__(self, service, name) -> None:
        self.service = service
        self.name = name                    # TopicName
        self.key = str(name)
        self.producers: dict[str, Producer] = {}
        self.subscriptions: dict[str, NonPersistentSubscription] = {}
        self._access = ExclusiveAccess(self.key)
        self._sequence = 0                  # the dispatcher's key for each entry (never on the wire)
        self.closed = False
        self.msg_in = 0
        self.bytes_in = 0
        self.msg_out = 0
        self.bytes_out = 0
        self.msg_dropped = 0
        self.publish_latency = LatencyBuckets()
        self.flushed = (0, 0, 0, 0)
        self.loaded_ms = int(time.time() * 1000)
        self.created_s = time.monotonic()      # the counters' first sample (stats rates)

    @property
    def config(self):
        return self.service.config

    # -- producers -------------------------------------------------------------------------------
    def add_producer(self, handle, name: str, connection, *, access_mode: AccessMode = AccessMode.SHARED) -> Producer:
        """As PersistentTopic.add_producer: ProducerBusyError if the name is taken or the access
        mode conflicts."""
        if self.closed:
            raise ServiceNotReadyError(f"topic {self.key} is closing")
        self._access.admit(name, access_mode, self.producers, self._fence)
        producer = Producer(handle, name, connection, producer_id=handle.producer_id,
                            address=connection.address if connection is not None else "",
                            connected_since_ms=int(time.time() * 1000), access_mode=access_mode)
        self.producers[name] = producer
        self._access.added(producer)
        return producer

    def _fence(self, other: Producer) -> None:
        other.handle.close_by_broker()
        self.remove_producer(other)

    def remove_producer(self, producer: Producer) -> None:
        if self.producers.get(producer.name) is producer:
            del self.producers[producer.name]
        producer.closed = True
        self._access.removed(producer, self.producers)

    def exclusive_available(self) -> bool:
        return self._access.available(self.producers)

    async def wait_exclusive(self) -> None:
        """WaitForExclusive (broker/topic_common.py)."""
        await self._access.wait(self.producers, lambda: self.closed)

    async def refresh_dedup(self) -> None:
        """No deduplication on non-persistent topics (nothing is stored to deduplicate against)."""

    def last_sequence_id(self, name: str) -> int:
        return -1

    def start_producer_session(self, producer: Producer, epoch: int) -> int:
        return -1

    def earliest_mark_delete(self) -> Position:
        return NO_POSITION

    async def create_stored_subscription(self, name: str, initial: Position) -> bool:
        """A producer's initial subscription: nothing to create (a subscription of a
        non-persistent topic exists only while it has consumers)."""
        return False

    # -- publish ---------------------------------------------------------------------------------
    def publish(self, producer: Producer, sends: list) -> list:
        """SENDs ``[(sequence_id, highest_sequence_id, entry), ...]`` of one producer: each
        readable one is dispatched now and answered with a receipt ``0:0`` (in order); returns
        the refused ones ``[(sequence_id, error), ...]`` (same checks as a persistent topic's)."""
        config = self.service.config
        message_bytes_max = config.message_bytes_max
        refused: list = []
        receipts: list = []
        entries: list[tuple[int, bytes, int]] = []
        for sequence_id, highest_sequence_id, entry in sends:
            data = bytes(entry)
            try:
                meta = check_edge(data, message_bytes_max, config.message_uncompressed_bytes_max)
            except Exception as e:     # noqa: BLE001 - whatever the entry is, answer it, keep serving
                refused.append((sequence_id, e))
                continue
            count = meta.raw.num_messages_in_batch or 1
            self._sequence += 1
            entries.append((self._sequence, data, count))
            receipts.append((sequence_id, highest_sequence_id, MESSAGE_ID))
            producer.msg_in += count
            producer.bytes_in += len(data)
            self.msg_in += count
            self.bytes_in += len(data)
        if receipts and not producer.closed:
            producer.handle.send_receipts(receipts)
        if entries:
            for sub in list(self.subscriptions.values()):
                sub.offer(entries)
        return refused

    # -- subscriptions ---------------------------------------------------------------------------
    async def subscribe(self, consumer, subscription: str, sub_type: SubType, *, durable: bool,
                        initial_earliest: bool = False, start_message_id=None, priority: int = 0,
                        consumer_name: str = "", key_shared_mode: KeySharedMode = KeySharedMode.AUTO_SPLIT,
                        hash_ranges=None, allow_out_of_order: bool = False,
                        read_compacted: bool = False) -> NonPersistentSubscription:
        """Join (or create) a subscription; ``durable``, the initial position, a start id and
        ``read_compacted`` have no meaning here (nothing is kept to start from or compact). SubscriptionBusy-like errors as a
        persistent topic's: ConsumerBusyError for a second Exclusive consumer or another type."""
        if self.closed:
            raise ServiceNotReadyError(f"topic {self.key} is closing")
        sub = self.subscriptions.get(subscription)
        if sub is not None and sub.sub_type is not sub_type:
            raise ConsumerBusyError(f"subscription {subscription} is of type {sub.sub_type.value}, "
                                    f"not {sub_type.value}")
        created = sub is None
        if created:
            sub = NonPersistentSubscription(self, subscription, sub_type, key_shared_mode=key_shared_mode,
                                            allow_out_of_order=allow_out_of_order)
        sub.add_consumer(consumer, priority=priority, name=consumer_name, hash_ranges=hash_ranges)
        if created:
            self.subscriptions[subscription] = sub
            log.info("subscription created topic=%s subscription=%s type=%s", self.key, subscription,
                     sub_type.value)
        return sub

    def drop_subscription(self, sub: NonPersistentSubscription) -> None:
        if self.subscriptions.get(sub.name) is sub:
            del self.subscriptions[sub.name]
            log.info("subscription removed topic=%s subscription=%s", self.key, sub.name)

    async def remove_subscription(self, sub: NonPersistentSubscription, *, delete_cursor: bool) -> None:
        for handle in list(sub.consumers.values()):
            sub.remove_consumer(handle)
        self.drop_subscription(sub)

    async def last_message_id(self) -> tuple[int, int, int]:
        return -1, -1, -1

    # -- lifecycle -------------------------------------------------------------------------------
    def client_count(self) -> int:
        return len(self.producers) + sum(len(s.consumers) for s in self.subscriptions.values())

    def disconnect_clients(self) -> None:
        for producer in list(self.producers.values()):
            producer.handle.close_by_broker()
            self.remove_producer(producer)
        for sub in list(self.subscriptions.values()):
            for handle in list(sub.consumers.values()):
                handle.close_by_broker()
                sub.remove_consumer(handle)

    async def close(self, *, disconnect_clients: bool = True) -> None:
        """Clients are told to reconnect (they look the topic up again); in-flight messages are
        gone."""
        self.closed = True
        if disconnect_clients:
            self.disconnect_clients()
        self._access.release_waiters()


__all__ = ["MESSAGE_ID", "NonPersistentSubscription", "NonPersistentTopic",
           "registration_path"]
