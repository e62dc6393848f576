"""A chunked message resent whole after part of it was stored (docs/decisions.md "Chunking"):
the publish core answers a chunk it already stored for the same producer and uuid (same chunk
id, same bytes) with the stored position and stores only what is missing, so the topic holds
contiguous chunk ids per uuid (``c0 c1 c2'``, not ``c0 c1 c0' c1' c2'``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.dedup import ChunkResends, DedupState
from broker.managed_ledger import ManagedLedgerState, Position
from broker.publish_core import Answer, Producer, PublishCore, Send, StoreEntries
from pulsarlite.errors import ConfigError

READY = ManagedLedgerState.READY


class Topic:
    """The publish core with a shell that stores every add at once, in order, on one ledger."""

    def __init__(self, dedup: bool = False) -> None:
        self.core = PublishCore("t", pending_adds_max=1000)
        if dedup:
            self.core.dedup = DedupState()
        self.entries: list[tuple[str, bytes]] = []      # (producer, data) in store order
        self.answered: list[tuple[int, Position]] = []  # (sequence id, receipt position)

    def producer(self, name: str) -> Producer:
        p = Producer(handle=None, name=name, connection=None)
        self.core.producer_added(p)
        return p

    def send(self, producer: Producer, entries: list[tuple[int, str, int, int, bytes]]) -> None:
        """``entries``: (sequence id, uuid, chunk id, chunks, bytes) sent in one run."""
        ops, datas = [], []
        for seq, uuid, chunk_id, chunks, data in entries:
            op = Send(seq, seq, len(data), 1)
            op.chunk = (uuid, chunk_id, chunks, hash(data) & 0xFFFFFFFF)
            ops.append(op)
            datas.append(data)
        dedup = self.core.dedup is not None
        batched = [None if c + 1 < n else False for _, _, c, n, _ in entries] if dedup else None
        digests = [op.chunk[3] for op in ops] if dedup else None
        self._run(self.core.send(producer, ops, datas, [0] * len(ops), batched, digests, owned=True,
                                 ml_state=READY))

    def _run(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, StoreEntries):
                first = len(self.entries)
                self.entries += [(action.producer.name, d) for d in action.datas]
                self._run(self.core.entries_stored(action, 0, len(action.ops) - 1, Position(1, first), None,
                                                   owned=True, ml_state=READY))
            elif isinstance(action, Answer):
                pending = action.producer.pending
                while pending and pending[0].done:
                    op = pending.popleft()
                    assert op.error is None
                    self.answered.append((op.sequence_id, op.position))


def chunks_of(seq: int, n: int, tag: str = "") -> list[tuple[int, str, int, int, bytes]]:
    uuid = f"p-{seq}"
    return [(seq, uuid, i, n, f"{uuid}/{i}/{n}{tag}".encode()) for i in range(n)]


@pytest.mark.parametrize("dedup", [False, True])
def test_whole_message_resent_after_part_stored_is_stored_once(dedup):
    topic = Topic(dedup)
    p = topic.producer("p")
    msg = chunks_of(0, 3)
    topic.send(p, msg[:2])                      # c0 c1 stored, their receipts lost
    topic.send(p, msg)                          # the producer resends every pending chunk
    assert [d for _, d in topic.entries] == [m[4] for m in msg]         # c0 c1 c2'
    # every SEND answered, in order, with the position of its chunk's stored copy
    assert topic.answered == [(0, Position(1, 0)), (0, Position(1, 1)),
                              (0, Position(1, 0)), (0, Position(1, 1)), (0, Position(1, 2))]


def test_a_new_session_of_the_same_producer_name_resends_too():
    topic = Topic()
    msg = chunks_of(0, 3)
    first = topic.producer("p")
    topic.send(first, msg[:2])
    topic.core.producer_removed(first)          # connection lost; the producer reconnects
    topic.send(topic.producer("p"), msg)
    assert len(topic.entries) == 3


def test_a_resent_chunk_with_other_bytes_is_stored():
    topic = Topic()
    p = topic.producer("p")
    topic.send(p, chunks_of(0, 3)[:2])
    other = chunks_of(0, 3, tag="-other")        # same uuid and chunk ids, other content
    topic.send(p, other)
    assert [d for _, d in topic.entries][2:] == [m[4] for m in other]   # never dropped
    assert len(topic.entries) == 5


def test_other_producers_and_completed_messages_are_not_answered():
    topic = Topic()
    a, b = topic.producer("a"), topic.producer("b")
    msg = chunks_of(0, 2)
    topic.send(a, msg[:1])
    topic.send(b, msg)                          # same uuid, another producer: stored
    assert len(topic.entries) == 3
    topic.send(a, msg[1:])                      # a's message complete: its record ends
    topic.send(a, msg)                          # a whole message resent after it was complete
    assert len(topic.entries) == 6              # stored again, as before (a consumer joins both)


# -- ChunkResends ---------------------------------------------------------------------------------
def test_chunk_resends_is_bounded():
    with pytest.raises(ConfigError):
        ChunkResends(records_max=0)
    r = ChunkResends(records_max=2)
    for u in ("u1", "u2", "u3"):
        r.on_stored("p", u, 0, 3, 7, Position(1, 0))
    assert len(r) == 2
    assert r.check("p", "u1", 0, 7) is None     # forgotten: its resend is stored, as before
    assert r.check("p", "u3", 0, 7) == Position(1, 0)


def test_chunk_resends_forgets_a_non_contiguous_record():
    r = ChunkResends()
    r.on_stored("p", "u", 0, 4, 1, Position(1, 0))
    r.on_stored("p", "u", 2, 4, 3, Position(1, 1))       # a gap: the record is not c0..cn-1
    assert r.check("p", "u", 0, 1) is None


# Property: a producer sends chunked messages; its connection may drop after any number of a
# message's chunks were stored (their receipts lost), and it then resends every chunk of the
# message from the first, possibly several times. Whatever happens, the topic holds each
# message's chunks exactly once, in chunk order, and every SEND is answered with the position of
# the stored copy of its chunk.
messages = st.lists(st.tuples(st.integers(2, 5), st.lists(st.integers(0, 5), max_size=3)),
                    min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(messages=messages, dedup=st.booleans(), records_max=st.integers(1, 4))
def test_resends_leave_contiguous_chunks_and_answer_stored_positions(messages, dedup, records_max):
    topic = Topic(dedup)
    topic.core.chunk_resends = ChunkResends(records_max=records_max)
    p = topic.producer("p")
    expected = []
    for seq, (n, drops) in enumerate(messages):
        msg = chunks_of(seq, n)
        for stored in drops:                     # a partial copy: `stored` chunks before the drop
            topic.send(p, msg[:min(stored, n - 1)])
        topic.send(p, msg)
        expected += [m[4] for m in msg]
    assert [d for _, d in topic.entries] == expected
    position_of = {d: Position(1, i) for i, (_, d) in enumerate(topic.entries)}
    sent = [m for seq, (n, drops) in enumerate(messages)
            for part in [*(chunks_of(seq, n)[:min(s, n - 1)] for s in drops), chunks_of(seq, n)] for m in part]
    assert topic.answered == [(m[0], position_of[m[4]]) for m in sent]
