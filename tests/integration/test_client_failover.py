"""pulsarlite's client across a broker failure: two brokers share the bookies; the broker that
owns the topic is killed (-9) mid-stream; the producer and consumer look the topic up again,
reconnect to the new owner, and every message the producer saw acknowledged is received."""

from __future__ import annotations

import threading
import time

import pytest

import pulsarlite

from .helpers import wait_for

pytestmark = pytest.mark.integration

SESSION_MS = 4_000   # a dead owner's bundle frees up quickly


@pytest.mark.timeout(240)
def test_kill_owner_broker_nothing_acked_is_lost(cluster_factory):
    cluster = cluster_factory(3, brokers=2, broker_overrides={"zk_session_timeout_ms": SESSION_MS})
    topic = "persistent://public/default/client-failover"
    client = pulsarlite.Client(cluster.service_url, operation_timeout_seconds=60)
    stop = threading.Event()
    flushed = threading.Event()     # every send answered: acked is final
    acked: set[bytes] = set()
    failed: list = []
    received: set[bytes] = set()
    try:
        consumer = client.subscribe(topic, "sub",
                                    initial_position=pulsarlite.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=20,
                                          batching_max_publish_delay_ms=5,
                                          send_timeout_millis=90_000, block_if_queue_full=True)

        def produce():
            i = 0
            while not stop.is_set():
                payload = f"m{i}".encode()

                def done(res, mid, payload=payload):
                    (acked.add(payload) if res == pulsarlite.Result.Ok else failed.append(res))
                producer.send_async(payload, done)
                i += 1
                if i % 50 == 0:
                    time.sleep(0.02)

        def consume():
            # until every send is answered and every acknowledged message is in (not a count:
            # messages can arrive before their own acknowledgement; and not from `stop`: sends
            # still pending then are acknowledged only during the flush after it)
            while not flushed.is_set() or not acked <= received:
                try:
                    m = consumer.receive(timeout_millis=500)
                except pulsarlite.Timeout:
                    if flushed.is_set() and received >= acked:
                        return
                    continue
                received.add(m.data())
                consumer.acknowledge(m)

        threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
        for t in threads:
            t.start()
        wait_for(lambda: len(acked) >= 300, 60, "300 acks before the kill")
        port = producer._impl.conn.address[1]
        owner = next(n for n in cluster.broker_names
                     if cluster.records[n].ports["pulsar"] == port)
        at_kill = len(acked)
        cluster.kill(owner)
        wait_for(lambda: len(acked) >= at_kill + 300, 120, "acks after the takeover", 0.2)
        survivor_port = producer._impl.conn.address[1]
        assert survivor_port != port
        stop.set()
        threads[0].join(30)
        producer.flush()
        flushed.set()
        try:
            wait_for(lambda: acked <= received, 60, "every acknowledged message to be received")
        except AssertionError:
            missing = sorted(acked - received, key=lambda p: int(p[1:]))
            raise AssertionError(f"{len(missing)} of {len(acked)} acknowledged messages never received "
                                 f"(first {missing[:10]}, last {missing[-3:]}; {len(received)} received, "
                                 f"{len(failed)} sends failed, kill at ack {at_kill})") from None
        threads[1].join(30)
        assert failed == []
        producer.close()
        consumer.close()
    finally:
        stop.set()
        flushed.set()
        client.close()
