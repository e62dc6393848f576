"""Runs of SENDs through a real cluster: the official client's unbatched pipelined producer
(send_async, many SENDs per read on the broker, which stores them as runs of adds), against
real bookies and ZooKeeper. Every receipt's message id is strictly greater than the one before
(send order), and a consumer gets every message once, in order, with the id its receipt gave.
With a small rollover limit, runs meet rollover points (they then go SEND by SEND) and the
topic spans several ledgers."""

from __future__ import annotations

import threading

import pytest

from integration.helpers import wait_for

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

MESSAGES = 4_000
TIMEOUT_MS = 20_000


@pytest.mark.parametrize("rollover_entries_max", [None, 700])
def test_unbatched_pipelined_receipts_increase_and_every_message_is_consumed_once_in_order(
        cluster_factory, rollover_entries_max):
    overrides = {} if rollover_entries_max is None else {"rollover_entries_max": rollover_entries_max}
    cluster = cluster_factory(3, brokers=1, broker_overrides=overrides)
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        topic = f"persistent://public/default/runs-{rollover_entries_max or 0}"
        consumer = client.subscribe(topic, "check", consumer_type=pulsar.ConsumerType.Exclusive,
                                    initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=1000)
        producer = client.create_producer(topic, batching_enabled=False, max_pending_messages=2_000,
                                          block_if_queue_full=True, send_timeout_millis=60_000)
        lock = threading.Lock()
        receipts: list[tuple[int, object, object]] = []

        def done(index):
            def callback(result, message_id):
                with lock:
                    receipts.append((index, result, message_id))
            return callback

        payloads = [f"run-{i:06d}-".encode() * (1 + i % 5) for i in range(MESSAGES)]
        for i, payload in enumerate(payloads):
            producer.send_async(payload, done(i))
        producer.flush()
        wait_for(lambda: len(receipts) == MESSAGES, 60, "every send's callback")
        with lock:
            got = list(receipts)
        assert [r[1] for r in got] == [pulsar.Result.Ok] * MESSAGES
        assert [r[0] for r in got] == list(range(MESSAGES))      # callbacks in send order
        ids = [(m.ledger_id(), m.entry_id()) for _, _, m in got]
        assert all(a < b for a, b in zip(ids, ids[1:])), "receipt ids not strictly increasing"
        ledgers = sorted({lid for lid, _ in ids})
        if rollover_entries_max is not None:
            assert len(ledgers) >= MESSAGES // rollover_entries_max
            for lid in ledgers[:-1]:                       # full ledgers: exactly the limit
                assert sum(1 for x, _ in ids if x == lid) == rollover_entries_max

        received = []
        for _ in range(MESSAGES):
            m = consumer.receive(timeout_millis=TIMEOUT_MS)
            received.append(m)
            consumer.acknowledge(m)
        assert [m.data() for m in received] == payloads          # every message once, in order
        assert [(m.message_id().ledger_id(), m.message_id().entry_id()) for m in received] == ids
        with pytest.raises(Exception, match="(?i)timeout"):
            consumer.receive(timeout_millis=1_000)
        producer.close()
        consumer.close()
    finally:
        client.close()
