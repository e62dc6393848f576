"""[hardening] A broker under clients that hold resources without using them (real broker
process, raw sockets): connections that never send CONNECT, frames trickled byte by byte,
frames announced larger than allowed before CONNECT, and more connections from one address than
allowed. Each is closed by the broker on its own, the broker's RSS stays near its baseline, and
an official client keeps producing and consuming throughout. Every wait is bounded."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from integration.helpers import rss_bytes, wait_for

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the broker closed (or reset) the connection."""
    sock.setblocking(False)
    try:
        return sock.recv(65536) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def broker_address(cluster) -> tuple[str, int]:
    host, port = cluster.service_url.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory(3, brokers=1, broker_overrides={
        "connect_timeout_ms": 1_000, "frame_complete_timeout_ms": 1_500,
        "connections_per_address_max": 40, "connect_frame_bytes_max": 16 * 1024})


def canary_round(client, topic: str, n: int) -> None:
    producer = client.create_producer(topic)
    consumer = client.subscribe(topic, "canary", initial_position=pulsar.InitialPosition.Earliest)
    for i in range(n):
        producer.send(f"m{i}".encode())
    got = [consumer.receive(timeout_millis=15_000).data() for _ in range(n)]
    assert got == [f"m{i}".encode() for i in range(n)]
    producer.close()
    consumer.close()


def test_idle_slow_and_oversized_connections_are_closed_and_the_broker_keeps_serving(cluster):
    record = cluster.records[cluster.broker_names[0]]
    address = broker_address(cluster)
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    sockets: list[socket.socket] = []
    try:
        canary_round(client, "persistent://public/default/canary-0", 5)
        baseline = rss_bytes(record.pid)
        # 1. connections that never send CONNECT
        idle = [socket.create_connection(address, timeout=5) for _ in range(20)]
        sockets += idle
        # 2. a frame before CONNECT announced at 5 MiB: refused at once
        big = socket.create_connection(address, timeout=5)
        sockets.append(big)
        big.sendall(struct.pack(">I", 5 * 1024 * 1024) + b"\0" * 100)
        # 3. a slow sender: a frame started, one byte at a time
        slow = socket.create_connection(address, timeout=5)
        sockets.append(slow)
        slow.sendall(struct.pack(">I", 1000))
        # 4. more connections from one address than allowed (40; a few slots are the above)
        extra = [socket.create_connection(address, timeout=5) for _ in range(40)]
        sockets += extra
        wait_for(lambda: "too many connections from 127.0.0.1" in open(record.log).read(), 10,
                 "the broker refusing connections past the per-address limit")
        wait_for(lambda: closed_by_peer(big), 10, "the close of a connection announcing 5 MiB before CONNECT")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not closed_by_peer(slow):
            try:
                slow.send(b"\0")
            except OSError:
                break
            time.sleep(0.2)
        assert closed_by_peer(slow), "a frame trickled byte by byte kept its connection open"
        wait_for(lambda: all(closed_by_peer(s) for s in idle), 10, "the close of connections without CONNECT")
        wait_for(lambda: all(closed_by_peer(s) for s in extra), 10, "the close of the extra connections")
        for s in sockets:
            s.close()
        sockets.clear()
        # the broker serves as before, and holds nothing for the closed connections
        canary_round(client, "persistent://public/default/canary-1", 5)
        assert rss_bytes(record.pid) < baseline + 64 * 1024 * 1024
    finally:
        for s in sockets:
            s.close()
        client.close()
