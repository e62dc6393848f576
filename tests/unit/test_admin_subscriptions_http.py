"""The subscription admin routes of broker/admin/subscriptions_http.py (expire, reset to a message
id, peek, examine) against an in-test backend that records calls: what reaches the backend, and
what bad input is refused before it (400/412, nothing called)."""

from __future__ import annotations

import pytest
from test_admin_http import BackendBase, admin_client

from broker.admin.policies import NotFoundError
from broker.admin.subscriptions_http import SubscriptionAdminBackend
from broker.managed_ledger import Position
from pulsarlite.wire import pb

P = "/admin/v2/persistent/public/default"
T = "persistent://public/default/t1"


def entry(payload: bytes) -> bytes:
    meta = pb.MessageMetadata(producer_name="p", sequence_id=3, publish_time=1_700_000_000_000).SerializeToString()
    return len(meta).to_bytes(4, "big") + meta + payload


class RecordingBackend(BackendBase):
    async def expire_messages(self, topic, subscription, expire_s, now_ms):
        self.calls.append(("expire", topic, subscription, expire_s, type(now_ms)))
        return True

    async def expire_messages_all(self, topic, expire_s, now_ms):
        self.calls.append(("expire_all", topic, expire_s))

    async def reset_cursor_to_position(self, topic, subscription, ledger_id, entry_id, excluded):
        self.calls.append(("reset", topic, subscription, ledger_id, entry_id, excluded))

    async def peek_entry(self, topic, subscription, nth):
        self.calls.append(("peek", topic, subscription, nth))
        if nth > 2:
            raise NotFoundError("Message not found")
        return Position(5, nth - 1), entry(b"peeked-%d" % nth)

    async def examine_entry(self, topic, initial_position, nth):
        self.calls.append(("examine", topic, initial_position, nth))
        return Position(5, 0), entry(b"examined")


def _fits(b: SubscriptionAdminBackend) -> SubscriptionAdminBackend:   # static check of the Protocol
    return b


@pytest.fixture
def backend() -> RecordingBackend:
    return _fits(RecordingBackend())  # type: ignore[return-value]


@pytest.fixture
async def client(backend):
    async with admin_client(backend) as c:
        yield c


async def test_expire_routes_reach_the_backend_with_a_clock_reading(client, backend):
    assert (await client.post(f"{P}/t1/subscription/s/expireMessages/30")).status == 204
    assert (await client.post(f"{P}/t1/all_subscription/expireMessages/0")).status == 204
    assert backend.calls == [("expire", T, "s", 30, int), ("expire_all", T, 0)]
    assert (await client.post(f"{P}/t1/subscription/s/expireMessages/x")).status == 400
    assert (await client.post(f"{P}/t1/subscription/s/expireMessages/-1")).status == 412
    assert (await client.post(f"{P}/t1/subscription/bad%20name/expireMessages/1")).status == 400
    assert len(backend.calls) == 2


async def test_reset_to_a_message_id_reads_resetcursordata(client, backend):
    url = f"{P}/t1/subscription/s/resetcursor"
    body = {"ledgerId": 7, "entryId": 3, "partitionIndex": -1, "isExcluded": True, "batchIndex": -1,
            "properties": {}}
    assert (await client.post(url, json=body)).status == 204
    assert (await client.post(url, json={"ledgerId": 7, "entryId": 4})).status == 204
    assert backend.calls == [("reset", T, "s", 7, 3, True), ("reset", T, "s", 7, 4, False)]
    for bad, status in (({"entryId": 1}, 400), ({"ledgerId": "x", "entryId": 1}, 400), ([7, 3], 400),
                        ({"ledgerId": 7, "entryId": 3, "isExcluded": "yes"}, 400),
                        ({"ledgerId": -1, "entryId": 3}, 412), ({"ledgerId": 7, "entryId": 3, "batchIndex": -2}, 412)):
        assert (await client.post(url, json=bad)).status == status, bad
    assert (await client.post(url, data=b"{")).status == 400
    assert len(backend.calls) == 2


async def test_peek_and_examine_answer_the_entry_as_get_message_by_id(client, backend):
    resp = await client.get(f"{P}/t1/subscription/s/position/2")
    assert resp.status == 200 and await resp.read() == b"peeked-2"
    assert resp.headers["X-Pulsar-Message-ID"] == "5:1"
    assert resp.headers["X-Pulsar-producer-name"] == "p"
    resp = await client.get(f"{P}/t1/subscription/s/position/3")
    assert resp.status == 404 and (await resp.json())["reason"] == "Message not found"
    assert (await client.get(f"{P}/t1/subscription/s/position/0")).status == 412
    resp = await client.get(f"{P}/t1/examinemessage")
    assert resp.status == 200 and await resp.read() == b"examined"
    assert (await client.get(f"{P}/t1/examinemessage", params={"initialPosition": "EARLIEST",
                                                               "messagePosition": "-4"})).status == 200
    assert (await client.get(f"{P}/t1/examinemessage", params={"initialPosition": "middle"})).status == 400
    assert (await client.get(f"{P}/t1/examinemessage", params={"messagePosition": "x"})).status == 400
    assert [c for c in backend.calls if c[0] == "examine"] == [("examine", T, "latest", 1),
                                                               ("examine", T, "earliest", 1)]
