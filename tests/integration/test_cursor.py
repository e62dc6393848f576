"""Durable cursors on a real ZooKeeper: open/ack/flush/reopen, debounced writes (counted by the
znode version), delete, fencing by a conflicting writer, non-durable cursors."""

from __future__ import annotations

import asyncio
import json

import pytest

from broker.cursor import (CursorClosedError, CursorConfig, CursorFencedError, ManagedCursor, ManagedCursorState,
                           list_cursors)
from broker.managed_ledger import ManagedLedgerFencedError, ManagedLedgerMetadata, ManagedLedgerStore, Position
from pulsarlite.errors import MetadataNotFoundError
from pulsarlite.ledger_list import encode
from pulsarlite.metadata import MetadataStore
from pulsarlite.metadata_layout import cursor_path

pytestmark = pytest.mark.integration

ML = "public/default/persistent/topic-c"
LEDGERS = [(3, 10), (5, 0), (8, 20)]
P = Position


@pytest.fixture
async def store(zk_hosts: str):
    async with await MetadataStore.connect(zk_hosts) as s:
        await ManagedLedgerStore(s).create(ML, encode(ManagedLedgerMetadata()))
        yield s


async def open_cursor(store, name="sub", *, initial=P(3, -1), delay_ms=60_000, **kw) -> ManagedCursor:
    return await ManagedCursor.open(store, ML, name, initial=initial, ledgers=lambda: LEDGERS,
                                    config=CursorConfig(persist_delay_ms=delay_ms), **kw)


async def znode(store, name="sub") -> tuple[dict, int]:
    data, version = await store.get(cursor_path(ML, name))
    return json.loads(data), version


async def test_open_ack_flush_reopen_keeps_the_state(store):
    c = await open_cursor(store)
    assert c.mark_delete_position == P(3, -1)
    assert (await znode(store))[1] == 0
    for p in (P(3, 0), P(3, 1), P(3, 4), P(3, 5), P(8, 3)):
        c.ack_individual(p)
    c.ack_individual(P(3, 7), batch_index=2, batch_size=5)
    c.ack_individual(P(3, 7), batch_index=4, batch_size=5)
    await c.flush()
    assert not c.dirty
    expected = c.core.to_json()
    await c.close()
    assert c.state is ManagedCursorState.CLOSED
    with pytest.raises(CursorClosedError):
        c.ack_individual(P(3, 2))

    again = await open_cursor(store, initial=P(8, 19))      # initial applies only to a new cursor
    assert again.core.to_json() == expected
    assert again.mark_delete_position == P(3, 1)
    assert again.individually_acked == [(3, 4, 5), (8, 3, 3)]
    assert again.remaining_batch_indexes(P(3, 7), 5) == {0, 1, 3}
    assert again.backlog(P(8, 19)) == 28 - 3
    # continue from there: acks cross the empty ledger 5 into ledger 8
    for e in (2, 3, 6, 7, 8, 9):
        again.ack_individual(P(3, e))
    again.ack_cumulative(P(8, 1))
    again.ack_individual(P(8, 2))
    assert again.mark_delete_position == P(8, 3)
    await again.close()
    third = await open_cursor(store)
    assert third.mark_delete_position == P(8, 3) and third.individually_acked == []
    await third.close()


async def test_debounced_persistence_coalesces_acks_into_few_writes(store):
    # a long delay: nothing is written until flush, then exactly one write
    c = await open_cursor(store, delay_ms=60_000)
    for e in range(10):
        c.ack_individual(P(3, e))
        await asyncio.sleep(0)
    for e in range(20):
        c.ack_individual(P(8, e))
        await asyncio.sleep(0)
    assert (await znode(store))[1] == 0
    await c.flush()
    raw, version = await znode(store)
    assert version == 1 and c.writes == 2       # the create and one write
    assert raw["mark_delete"] == [8, 19]
    await c.flush()                              # nothing new: no write
    assert (await znode(store))[1] == 1

    # a short delay: written in the background, many acks per write, one write in flight
    d = await open_cursor(store, "sub-2", delay_ms=5)
    acks = 0
    for e in range(10):
        d.ack_individual(P(3, e))
        acks += 1
        await asyncio.sleep(0)
    for e in range(20):
        d.ack_individual(P(8, e), batch_index=0, batch_size=2)
        d.ack_individual(P(8, e), batch_index=1, batch_size=2)
        acks += 2
        await asyncio.sleep(0)
    for _ in range(500):                         # bounded wait for the background write
        if not d.dirty:
            break
        await asyncio.sleep(0.01)
    raw, version = await znode(store, "sub-2")
    assert raw["mark_delete"] == [8, 19] and not d.dirty
    assert 1 <= version < acks
    assert d.writes == version + 1
    await d.close()
    await c.close()


async def test_delete_removes_the_znode(store):
    a = await open_cursor(store, "a")
    b = await open_cursor(store, "with/slash and %")
    assert await list_cursors(store, ML) == ["a", "with/slash and %"]
    assert await list_cursors(ManagedLedgerStore(store), ML) == ["a", "with/slash and %"]
    a.ack_individual(P(3, 0))
    await b.delete()
    assert not await store.exists(cursor_path(ML, "with/slash and %"))
    await a.delete()                              # with an unwritten ack pending: no write after delete
    assert await list_cursors(store, ML) == []
    await asyncio.sleep(0.05)
    assert await list_cursors(store, ML) == []
    assert a.state is ManagedCursorState.DELETED
    await a.delete()                              # idempotent


async def test_a_conflicting_writer_fences_the_cursor(store, zk_hosts):
    old = await open_cursor(store)
    old.ack_individual(P(3, 0))
    await old.flush()
    async with await MetadataStore.connect(zk_hosts) as other_store:
        new = await open_cursor(other_store)     # the new owner loads what the old one wrote
        assert new.mark_delete_position == P(3, 0)
        new.ack_individual(P(3, 1))
        await new.flush()

        old.ack_individual(P(3, 5))
        with pytest.raises(CursorFencedError) as info:
            await old.flush()
        assert isinstance(info.value, ManagedLedgerFencedError) and not info.value.retriable
        assert old.fenced
        with pytest.raises(CursorFencedError):
            old.ack_individual(P(3, 6))
        with pytest.raises(CursorFencedError):
            await old.delete()
        raw, _ = await znode(store)
        assert raw["mark_delete"] == [3, 1] and raw["acked_ranges"] == []   # the old owner wrote nothing

        # fenced by a background write too
        bg = await open_cursor(store, "bg", delay_ms=1)
        new_bg = await open_cursor(other_store, "bg")
        new_bg.ack_individual(P(3, 0))
        await new_bg.flush()
        bg.ack_individual(P(3, 3))
        for _ in range(500):
            if bg.fenced:
                break
            await asyncio.sleep(0.01)
        assert bg.fenced
        await bg.close()                          # closes without writing
        await new_bg.close()
        await new.close()


async def test_a_cursor_deleted_by_someone_else_fences(store):
    c = await open_cursor(store)
    await store.delete(cursor_path(ML, "sub"))
    c.ack_individual(P(3, 0))
    with pytest.raises(CursorFencedError):
        await c.flush()


async def test_non_durable_cursors_never_touch_zookeeper(store):
    r = await ManagedCursor.open(None, ML, "reader-1", initial=P(8, 4), durable=False, ledgers=lambda: LEDGERS)
    r.ack_individual(P(8, 5))
    r.ack_individual(P(8, 7))
    await r.flush()
    assert r.mark_delete_position == P(8, 5) and r.individually_acked == [(8, 7, 7)]
    assert await list_cursors(store, ML) == []
    r2 = await ManagedCursor.open(store, ML, "reader-2", initial=P(3, -1), durable=False)
    r2.reset(P(3, 4))
    await r2.close()
    await r.delete()
    assert await list_cursors(store, ML) == []


async def test_open_needs_the_managed_ledger(store):
    with pytest.raises(MetadataNotFoundError):
        await ManagedCursor.open(store, "public/default/persistent/nope", "sub", initial=P(1, -1))
    assert not await store.exists("/managed-ledgers/public/default/persistent/nope")


async def test_reset_is_persisted(store):
    c = await open_cursor(store)
    c.ack_cumulative(P(8, 10))
    c.ack_individual(P(8, 15))
    c.reset(P(3, 4))
    await c.close()
    again = await open_cursor(store)
    assert again.mark_delete_position == P(3, 3) and again.individually_acked == []
    assert again.read_position == P(3, 4)
    await again.close()


async def test_stored_cursor_read_and_moved_through_the_cursor_code(store):
    """What retention does to an idle subscription: read its mark-delete, move it forward by one
    compare-and-set; never back, not once a consumer loaded it, not when absent or malformed."""
    from broker.cursor import advance_stored_cursor, stored_mark_delete

    assert await stored_mark_delete(store, ML, "idle") is None
    assert not await advance_stored_cursor(store, ML, "idle", P(3, 5), ledgers=lambda: LEDGERS)
    c = await open_cursor(store, "idle")
    c.ack_individual(P(3, 7))
    await c.close()
    _, version = await znode(store, "idle")

    assert await advance_stored_cursor(store, ML, "idle", P(3, 5), ledgers=lambda: LEDGERS)
    assert await stored_mark_delete(store, ML, "idle") == P(3, 5)
    doc, moved_version = await znode(store, "idle")
    assert moved_version == version + 1
    assert not await advance_stored_cursor(store, ML, "idle", P(3, 2), ledgers=lambda: LEDGERS)   # never back
    assert not await advance_stored_cursor(store, ML, "idle", P(3, 9), ledgers=lambda: LEDGERS,
                                           still_idle=lambda: False)                             # loaded meanwhile
    assert (await znode(store, "idle"))[1] == moved_version
    again = await open_cursor(store, "idle")          # the acks above the new mark-delete are kept
    assert again.mark_delete_position == P(3, 5) and again.is_acked(P(3, 7)) and not again.is_acked(P(3, 6))
    await again.close()

    await store.set(cursor_path(ML, "idle"), b"not a cursor", -1)
    with pytest.raises(ValueError):
        await stored_mark_delete(store, ML, "idle")
    assert not await advance_stored_cursor(store, ML, "idle", P(8, 0), ledgers=lambda: LEDGERS)
    assert (await store.get(cursor_path(ML, "idle")))[0] == b"not a cursor"


async def test_stored_cursors_of_a_managed_ledger(store):
    from broker.cursor import stored_cursors

    assert await stored_cursors(store, ML) == {}
    a = await open_cursor(store, "a")
    a.ack_cumulative(P(3, 4))
    await a.close()
    b = await open_cursor(store, "b/odd name")
    await b.close()
    await store.create(cursor_path(ML, "broken"), b"{", make_parents=False)
    got = await stored_cursors(store, ML, ledgers=lambda: LEDGERS)
    assert set(got) == {"a", "b/odd name", "broken"} and got["broken"] is None
    assert got["a"].mark_delete == P(3, 4) and got["b/odd name"].mark_delete == P(3, -1)
