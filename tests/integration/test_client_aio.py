"""``pulsarlite.aio`` (the asyncio API), seek, and pattern subscriptions against a real cluster;
the official client on the other side where it makes a difference."""

from __future__ import annotations

import asyncio
import re
import time
import uuid

import pytest

import pulsarlite
import pulsarlite.aio as pla
from faces.cluster import LocalCluster

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def cluster(module_tmp_path):
    cl = LocalCluster(module_tmp_path / "aio-cluster")
    try:
        cl.start_processes(bookies=3, brokers=1)
        yield cl
    finally:
        cl.stop()


def new_topic(prefix: str) -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:8]}"


async def test_aio_produce_consume_async_for(cluster):
    topic = new_topic("aio")
    async with pla.Client(cluster.service_url) as client:
        consumer = await client.subscribe(topic, "sub",
                                          initial_position=pla.InitialPosition.Earliest)
        async with await client.create_producer(
                topic, compression_type=pla.CompressionType.SNAPPY,
                batching_max_publish_delay_ms=2) as producer:
            futures = [await producer.send_async(f"m{i}".encode(), properties={"i": str(i)})
                       for i in range(50)]
            ids = await asyncio.gather(*futures)
            assert all(isinstance(mid, pla.MessageId) for mid in ids)
            single = await producer.send(b"last", partition_key="k", event_timestamp=42)
            assert single.entry_id() >= ids[-1].entry_id()
        got = []
        async for msg in consumer:
            got.append(msg)
            await consumer.acknowledge(msg)
            if len(got) == 51:
                break
        assert [m.data() for m in got] == [f"m{i}".encode() for i in range(50)] + [b"last"]
        assert got[7].properties() == {"i": "7"}
        assert (got[-1].key(), got[-1].event_timestamp()) == ("k", 42)
        with pytest.raises(pla.Timeout):
            await consumer.receive(timeout_millis=300)
        await consumer.close()
        with pytest.raises(pla.AlreadyClosed):
            await consumer.receive(timeout_millis=10)

        reader = await client.create_reader(topic, pla.MessageId.earliest)
        count = 0
        while await reader.has_message_available():
            await reader.read_next(TIMEOUT_MS)
            count += 1
        assert count == 51
        await reader.close()


async def test_aio_official_producer_to_our_async_consumer(cluster):
    topic = new_topic("aio-interop")
    official = pulsar.Client(cluster.service_url)
    try:
        async with pla.Client(cluster.service_url) as client:
            consumer = await client.subscribe(topic, "sub",
                                              consumer_type=pla.ConsumerType.Shared,
                                              initial_position=pla.InitialPosition.Earliest)
            producer = official.create_producer(topic, batching_max_publish_delay_ms=5,
                                                compression_type=pulsar.CompressionType.ZSTD)
            for i in range(30):
                producer.send_async(f"p{i}".encode(), None, partition_key=f"k{i % 3}")
            await asyncio.to_thread(producer.flush)
            got = [await consumer.receive(TIMEOUT_MS) for _ in range(30)]
            assert sorted(m.data() for m in got) == sorted(f"p{i}".encode() for i in range(30))
            for m in got:
                await consumer.acknowledge(m)
            producer.close()
    finally:
        official.close()


def test_seek_consumer_and_reader(cluster):
    topic = new_topic("seek")
    client = pulsarlite.Client(cluster.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        ids = [producer.send(f"m{i}".encode()) for i in range(10)]
        consumer = client.subscribe(topic, "sub",
                                    initial_position=pulsarlite.InitialPosition.Earliest)
        got = [consumer.receive(TIMEOUT_MS) for _ in range(10)]
        for m in got:
            consumer.acknowledge(m)
        consumer.seek(pulsarlite.MessageId.earliest)
        again = [consumer.receive(TIMEOUT_MS).data() for _ in range(10)]
        assert again == [f"m{i}".encode() for i in range(10)]
        consumer.seek(ids[4])            # exclusive: m5 comes next
        assert consumer.receive(TIMEOUT_MS).data() == b"m5"
        # by publish time: the first message published at or after it
        time.sleep(0.05)
        t_ms = int(time.time() * 1000)
        time.sleep(0.05)
        producer.send(b"later")
        consumer.seek(t_ms)
        assert consumer.receive(TIMEOUT_MS).data() == b"later"
        consumer.close()

        reader = client.create_reader(topic, pulsarlite.MessageId.earliest)
        assert reader.read_next(TIMEOUT_MS).data() == b"m0"
        reader.seek(ids[6])
        assert reader.read_next(TIMEOUT_MS).data() == b"m7"
        reader.close()
        producer.close()
    finally:
        client.close()


def test_pattern_subscription_finds_new_topics(cluster):
    prefix = f"pat-{uuid.uuid4().hex[:6]}"
    client = pulsarlite.Client(cluster.service_url)
    try:
        p1 = client.create_producer(f"persistent://public/default/{prefix}-a")
        p1.send(b"before")
        other = client.create_producer(f"persistent://public/default/other-{prefix}")
        consumer = client.subscribe(re.compile(f"persistent://public/default/{prefix}-.*"),
                                    "sub", initial_position=pulsarlite.InitialPosition.Earliest,
                                    pattern_auto_discovery_period=1)
        assert consumer.receive(TIMEOUT_MS).data() == b"before"
        p2 = client.create_producer(f"persistent://public/default/{prefix}-b")
        p2.send(b"new topic")
        other.send(b"not matching")
        msg = consumer.receive(TIMEOUT_MS)     # found by rediscovery (every second here)
        assert msg.data() == b"new topic"
        assert msg.topic_name().endswith(f"{prefix}-b")
        with pytest.raises(pulsarlite.Timeout):
            consumer.receive(timeout_millis=1_500)
        consumer.close()
    finally:
        client.close()
