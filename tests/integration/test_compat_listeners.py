"""Advertised listeners (issue 32 item 8) with the official Python client (C++ core) against real
ZooKeeper, bookie and broker processes. The broker advertises two listeners for its one port:
``internal`` (its own address) and ``external`` (a TCP proxy in front of it, as a NAT or load
balancer would be); the client's ``listener_name`` picks which address a lookup answers. The
reference is Pulsar's ServerCnx/NamespaceService lookup: the LOOKUP's advertised_listener_name
selects the owner's listener, none selects the internal one, and a name the broker does not
advertise fails the lookup with ServiceNotReady ("the advertised listener name ... is not
found")."""

from __future__ import annotations

import socket

import pytest

from pulsarlite.wire import commands as c
from pulsarlite.wire import pb
from pulsarlite.wire.frames import FrameDecoder
from pulsarlite.zk_server import find_free_port
from tests.integration.helpers import BlockableProxy

pulsar = pytest.importorskip("pulsar")

pytestmark = pytest.mark.integration

T = pb.BaseCommand
TIMEOUT_MS = 20_000
TOPIC = "persistent://public/default/listeners"


@pytest.fixture(scope="module")
def setup(module_cluster_factory):
    port = find_free_port()
    proxy = BlockableProxy(port)
    try:
        listeners = f"internal:pulsar://127.0.0.1:{port},external:pulsar://127.0.0.1:{proxy.port}"
        cluster = module_cluster_factory(3, brokers=1, broker_overrides={
            "port": port, "advertised_listeners": listeners, "internal_listener_name": "internal"})
        yield cluster, proxy, port
    finally:
        proxy.close()


def raw_lookup(port: int, listener_name: str | None) -> pb.CommandLookupTopicResponse:
    """One LOOKUP of raw frames (our wire codec), as the C++ client sends it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=15)
    try:
        decoder = FrameDecoder(8 << 20)
        sock.sendall(c.connect("raw-listeners", 19))
        body = pb.CommandLookupTopic(topic=TOPIC, request_id=7, authoritative=False)
        if listener_name is not None:
            body.advertised_listener_name = listener_name
        sock.sendall(c.encode_command(T(type=T.LOOKUP, lookupTopic=body)))
        frames: list = []
        while not any(f.type == T.LOOKUP_RESPONSE for f in frames):
            data = sock.recv(65536)
            assert data, "closed by the broker"
            frames.extend(decoder.feed(data))
        return next(f for f in frames if f.type == T.LOOKUP_RESPONSE).command.lookupTopicResponse
    finally:
        sock.close()


def test_lookup_answers_the_named_listener(setup):
    cluster, proxy, port = setup
    internal, external = f"pulsar://127.0.0.1:{port}", f"pulsar://127.0.0.1:{proxy.port}"
    L = pb.CommandLookupTopicResponse
    for name, expected in ((None, internal), ("", internal), ("internal", internal), ("external", external)):
        got = raw_lookup(port, name)
        assert got.response in (L.Connect, L.Redirect), got
        assert got.brokerServiceUrl == expected, (name, got)
    got = raw_lookup(port, "nope")
    assert got.response == L.Failed and got.error == pb.ServiceNotReady, got
    assert "nope" in got.message and "not found" in got.message


def test_official_client_goes_where_its_listener_points(setup):
    """With ``listener_name="external"`` the client's producer and consumer connect through the
    proxy (cut the proxy and that client cannot reach the topic; the internal one still can)."""
    cluster, proxy, port = setup
    external = pulsar.Client(cluster.service_url, listener_name="external", operation_timeout_seconds=30)
    try:
        consumer = external.subscribe(TOPIC, "ext", initial_position=pulsar.InitialPosition.Earliest)
        producer = external.create_producer(TOPIC)
        producer.send(b"through-the-proxy")
        assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == b"through-the-proxy"
        producer.close()
        consumer.close()
    finally:
        external.close()

    proxy.block()
    try:
        cut = pulsar.Client(cluster.service_url, listener_name="external", operation_timeout_seconds=5)
        try:
            with pytest.raises(Exception):
                cut.create_producer(TOPIC)
        finally:
            cut.close()
        internal = pulsar.Client(cluster.service_url, listener_name="internal", operation_timeout_seconds=30)
        try:
            internal.create_producer(TOPIC).send(b"direct")
        finally:
            internal.close()
    finally:
        proxy.unblock()


def test_unknown_listener_fails_the_lookup(setup):
    cluster, _, _ = setup
    client = pulsar.Client(cluster.service_url, listener_name="nope", operation_timeout_seconds=5)
    try:
        with pytest.raises(Exception):
            client.create_producer(TOPIC)
    finally:
        client.close()


def test_http_lookup_takes_the_listener_name(setup):
    """Pulsar's HTTP lookup takes the listener as ``?listenerName=`` or the
    ``X-Pulsar-ListenerName`` header, answering that listener's broker URL."""
    import requests
    cluster, proxy, port = setup
    url = f"{cluster.admin_url}/lookup/v2/topic/persistent/public/default/listeners"
    assert requests.get(url, timeout=30).json()["brokerUrl"] == f"pulsar://127.0.0.1:{port}"
    got = requests.get(url, params={"listenerName": "external"}, timeout=30).json()
    assert got["brokerUrl"] == got["nativeUrl"] == f"pulsar://127.0.0.1:{proxy.port}"
    got = requests.get(url, headers={"X-Pulsar-ListenerName": "external"}, timeout=30).json()
    assert got["brokerUrl"] == f"pulsar://127.0.0.1:{proxy.port}"
    r = requests.get(url, params={"listenerName": "nope"}, timeout=30)
    assert r.status_code == 503 and "nope" in r.json()["reason"], r.text
