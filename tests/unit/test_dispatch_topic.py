"""The topic shell's producer side with fakes of the managed ledger and the service: dedup
receipts (duplicates, in-flight copies, failures) and producer access modes."""

from __future__ import annotations

import asyncio

import pytest

from broker.config import BrokerConfig
from broker.dedup import DedupState
from broker.key_shared import sticky_key_hash
from broker.managed_ledger import ManagedLedgerState, Position
from broker.topic import AccessMode, EntryCache, PersistentTopic, ProducerFencedError, PublishBuffer, _slot_of
from pulsarlite.topic_name import TopicName
from pulsarlite.wire import pb
from pulsarlite.wire.entry import Message, build_batch_entry, build_entry, frame_entry, peek_metadata



def publish(topic, producer, sequence_id: int, highest_sequence_id: int, entry) -> None:
    """One SEND through the topic's one publish path (a run of one); a refusal at the edge
    raised, as the connection would answer it."""
    refused = topic.publish(producer, [(sequence_id, highest_sequence_id, entry)])
    if refused:
        raise refused[0][1]

class FakeML:
    state = ManagedLedgerState.READY

    def __init__(self) -> None:
        self.kept_listeners = []
        self.kept_unread_listeners = []
        self.rollover_listeners = []
        self.adds: list[tuple[bytes, asyncio.Future]] = []
        self.pending_count = 0
        self.next_entry = 0

    def add_async(self, data, publish_time):
        fut = asyncio.get_running_loop().create_future()
        self.adds.append((data, fut))
        return fut

    def add_entries(self, datas, publish_times, done, context):   # ManagedLedger's one add path
        for offset, (data, publish_time) in enumerate(zip(datas, publish_times)):
            fut = self.add_async(data, publish_time)
            fut.add_done_callback(lambda f, i=offset: done(context, i, i, None, f.exception()) if f.exception()
                                  else done(context, i, i, f.result(), None))

    def confirm(self, index: int) -> Position:
        position = Position(7, self.next_entry)
        self.next_entry += 1
        self.adds[index][1].set_result(position)
        return position


class FakeOwnership:
    def write_guard(self, name):
        return lambda: True


class FakeService:
    def __init__(self) -> None:
        self.config = BrokerConfig()
        self.entry_cache = EntryCache(1 << 20)
        self.publish_buffer = PublishBuffer(1 << 24)
        self.ownership = FakeOwnership()
        self.store = None
        self.errors = []

    def on_add_error(self, e):
        self.errors.append(e)


class Handle:
    def __init__(self, producer_id=0) -> None:
        self.producer_id = producer_id
        self.out = []
        self.closed = False

    def send_receipt(self, seq, highest, position):
        self.out.append(("receipt", seq, (position.ledger_id, position.entry_id)))

    def send_receipts(self, receipts) -> None:
        for sequence_id, highest_sequence_id, position in receipts:
            self.send_receipt(sequence_id, highest_sequence_id, position)

    def send_error(self, seq, error):
        self.out.append(("error", seq))

    def close_by_broker(self):
        self.closed = True


def entry(seq: int) -> bytes:
    return build_entry(Message(f"m{seq}".encode()), producer_name="p", sequence_id=seq, publish_time_ms=1)


def make_topic():
    ml = FakeML()
    topic = PersistentTopic(FakeService(), TopicName.parse("persistent://public/default/t"), ml)
    topic.dedup = DedupState()
    return topic, ml


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


async def test_duplicates_get_receipts_in_order_without_being_stored():
    topic, ml = make_topic()
    h = Handle()
    p = topic.add_producer(h, "p", None)
    publish(topic, p, 0, 0, entry(0))
    publish(topic, p, 1, 1, entry(1))
    ml.confirm(0)
    ml.confirm(1)
    await settle()
    publish(topic, p, 2, 2, entry(2))     # new, in flight
    publish(topic, p, 1, 1, entry(1))     # duplicate of a stored one: answered after seq 2 (order)
    assert len(ml.adds) == 3
    await settle()
    assert h.out == [("receipt", 0, (7, 0)), ("receipt", 1, (7, 1))]
    ml.confirm(2)
    await settle()
    assert h.out[2:] == [("receipt", 2, (7, 2)), ("receipt", 1, (-1, -1))]
    assert p.duplicates == 1


async def test_in_flight_copy_is_decided_after_the_first_copys_outcome():
    topic, ml = make_topic()
    old, new = Handle(0), Handle(1)
    p_old = topic.add_producer(old, "p", None)
    publish(topic, p_old, 0, 0, entry(0))
    topic.remove_producer(p_old)           # the client reconnects and resends seq 0
    p_new = topic.add_producer(new, "p", None)
    publish(topic, p_new, 0, 0, entry(0))
    assert len(ml.adds) == 1              # not stored twice
    ml.confirm(0)
    await settle()
    assert new.out == [("receipt", 0, (-1, -1))]     # a duplicate once the first copy is stored
    # the first copy fails: the copy waiting for it is stored, BEFORE the send that came after
    # it (storing seq 2 first and seq 1 later would break the producer's order)
    p_new2 = topic.add_producer(Handle(2), "p2", None)
    publish(topic, p_new2, 1, 1, entry(1))
    topic.remove_producer(p_new2)
    h3 = Handle(3)
    p3 = topic.add_producer(h3, "p2", None)
    publish(topic, p3, 1, 1, entry(1))      # waits for the first copy
    publish(topic, p3, 2, 2, entry(2))      # waits behind it
    assert len(ml.adds) == 2
    ml.adds[1][1].set_exception(RuntimeError("bookies down"))
    await settle()
    assert len(ml.adds) == 2              # neither is stored after the failed first copy
    assert h3.closed and h3.out == []     # the topic blocked: the client reconnects, resends in order
    h4 = Handle(4)
    p4 = topic.add_producer(h4, "p2", None)      # nothing in flight: unblocked
    publish(topic, p4, 1, 1, entry(1))
    publish(topic, p4, 2, 2, entry(2))
    assert [d for d, _ in ml.adds[2:]] == [entry(1), entry(2)]
    ml.confirm(2)
    ml.confirm(3)
    await settle()
    assert h4.out == [("receipt", 1, (7, 1)), ("receipt", 2, (7, 2))]


async def test_a_failed_write_blocks_the_topic_until_the_adds_in_flight_are_done():
    """Pulsar's fence after a failed add: producers are disconnected (their clients reconnect
    and resend everything pending, in order) and no producer or SEND is taken until the adds
    in flight are done, so nothing sent after the failed message is stored before its resend."""
    from broker.service import ServiceNotReadyError
    topic, ml = make_topic()
    topic.dedup = None
    h = Handle()
    p = topic.add_producer(h, "p", None)
    for seq in range(3):
        publish(topic, p, seq, seq, entry(seq))
    ml.adds[0][1].set_exception(RuntimeError("bookie gone"))
    await settle()
    assert h.closed and h.out == []
    with pytest.raises(ServiceNotReadyError, match="blocked"):
        topic.add_producer(Handle(1), "p", None)
    ml.adds[1][1].set_exception(RuntimeError("bookie gone"))
    ml.adds[2][1].set_exception(RuntimeError("bookie gone"))
    await settle()
    p2 = topic.add_producer(Handle(2), "p", None)       # unblocked once nothing is in flight
    publish(topic, p2, 0, 0, entry(0))
    assert len(ml.adds) == 4


async def test_batched_entries_cover_their_sequence_range():
    topic, ml = make_topic()
    p = topic.add_producer(Handle(), "p", None)
    batch = build_batch_entry([Message(b"a"), Message(b"b"), Message(b"c")], producer_name="p",
                              sequence_id=10, publish_time_ms=1)
    publish(topic, p, 10, 10, batch)        # highest_sequence_id not given: 10..12 from the batch
    ml.confirm(0)
    await settle()
    assert topic.last_sequence_id("p") == 12


async def test_access_modes():
    topic, _ = make_topic()
    a = topic.add_producer(Handle(), "a", None, access_mode=AccessMode.EXCLUSIVE)
    from broker.service import ProducerBusyError
    with pytest.raises(ProducerBusyError):
        topic.add_producer(Handle(), "b", None)
    with pytest.raises(ProducerFencedError):
        topic.add_producer(Handle(), "b", None, access_mode=AccessMode.EXCLUSIVE)
    waiter = asyncio.ensure_future(topic.wait_exclusive())
    await settle()
    assert not waiter.done()
    topic.remove_producer(a)
    await asyncio.wait_for(waiter, 5)
    w = topic.add_producer(Handle(), "w", None, access_mode=AccessMode.WAIT_FOR_EXCLUSIVE)
    topic.remove_producer(w)
    s1 = topic.add_producer(h1 := Handle(), "s1", None)
    topic.add_producer(h2 := Handle(), "s2", None)
    topic.add_producer(Handle(), "f", None, access_mode=AccessMode.EXCLUSIVE_WITH_FENCING)
    assert h1.closed and h2.closed and set(topic.producers) == {"f"}
    assert s1.closed


class ConsumerStub:
    def __init__(self) -> None:
        self.events = []
        self.messages = []

    def send_active_change(self, is_active):
        self.events.append(is_active)

    def send_message(self, position, entry, redelivery_count, ack_set=None):
        self.messages.append((position, redelivery_count, ack_set))

    def send_messages(self, messages):
        for position, entry, redelivery_count, ack_set in messages:
            self.send_message(position, entry, redelivery_count, ack_set)

    def close_by_broker(self):
        pass


async def test_failover_sends_active_consumer_change():
    from broker.cursor import ManagedCursor
    from broker.dispatch import SubType
    from broker.topic import Subscription

    topic, ml = make_topic()
    ml.ledgers = lambda: ()
    cursor = await ManagedCursor.open(None, "t/ns/persistent/x", "sub", initial=Position(7, -1), durable=False,
                                      ledgers=lambda: ())
    sub = Subscription(topic, "sub", SubType.FAILOVER, cursor, True)
    try:
        first, second = ConsumerStub(), ConsumerStub()
        sub.add_consumer(first, name="zeta")
        assert first.events == [True]
        sub.add_consumer(second, name="alpha")     # sorts first: becomes active, everyone told
        assert first.events == [True, False] and second.events == [True]
        third = ConsumerStub()
        sub.add_consumer(third, name="omega")      # no change: only the newcomer is told
        assert third.events == [False] and first.events == [True, False]
        sub.remove_consumer(second)                 # "omega" < "zeta": third takes over
        assert third.events[-1] is True and first.events[-1] is False
    finally:
        await sub.close(delete_cursor=False)


def cpp_entry(seq: int, text: str) -> bytes:
    return build_entry(Message(text.encode()), producer_name="p", sequence_id=seq, publish_time_ms=1)


async def test_a_client_that_resets_its_sequence_ids_on_reconnect_loses_nothing():
    """The official C++ client (pulsar-client 3.x) resets its counter to PRODUCER_SUCCESS's
    last_sequence_id + 1 when it reconnects before any receipt reached it, although messages
    with higher ids are pending: after resending those it numbers new messages with used ids
    (found by the chaos suite, seed 17). Those must be stored, not answered as duplicates; true
    resends (the same bytes) still are duplicates, and so are an application's resends of ids
    outside the reused range (Pulsar's dedup by id)."""
    topic, ml = make_topic()
    h1 = Handle(0)
    p1 = topic.add_producer(h1, "p", None)
    for seq in range(4):                          # m0 stored; the receipt never reaches the client
        publish(topic, p1, seq, seq, cpp_entry(seq, f"m{seq}"))
    ml.confirm(0)
    ml.adds[1][1].set_exception(RuntimeError("session suspended"))   # m1..m3 fail: reconnect
    ml.adds[2][1].set_exception(RuntimeError("session suspended"))
    ml.adds[3][1].set_exception(RuntimeError("session suspended"))
    await settle()
    topic.remove_producer(p1)
    h2 = Handle(1)
    p2 = topic.add_producer(h2, "p", None)
    assert topic.start_producer_session(p2, epoch=1) == 0       # PRODUCER_SUCCESS's last_sequence_id
    for seq in range(0, 6):                       # the client resends m0..m5 (queued meanwhile)
        publish(topic, p2, seq, seq, cpp_entry(seq, f"m{seq}"))
    for i, seq in enumerate(range(1, 4)):         # counter reset to 1: m6, m7, m8 as ids 1, 2, 3
        publish(topic, p2, seq, seq, cpp_entry(seq, f"m{6 + i}"))
    stored_texts = [d for d, _ in ml.adds[4:]]
    assert len(stored_texts) == 5 + 3, len(stored_texts)     # m1..m5 and m6..m8; m0 a duplicate
    for i in range(4, len(ml.adds)):
        ml.confirm(i)
    await settle()
    receipts = [o for o in h2.out if o[0] == "receipt"]
    assert [r[1] for r in receipts] == [0, 1, 2, 3, 4, 5, 1, 2, 3]
    assert receipts[0][2] == (-1, -1) and all(r[2] != (-1, -1) for r in receipts[1:])
    # true resends of both m2 (id 2) and m7 (id 2) are duplicates; so is an id outside the range
    before = len(ml.adds)
    publish(topic, p2, 2, 2, cpp_entry(2, "m2"))
    publish(topic, p2, 2, 2, cpp_entry(2, "m7"))
    publish(topic, p2, 0, 0, cpp_entry(0, "an application's own resend of id 0"))
    assert len(ml.adds) == before
    publish(topic, p2, 2, 2, cpp_entry(2, "yet another message under id 2"))
    assert len(ml.adds) == before + 1


def cpp_batch(first: int, ids: list[int], texts: list[str]) -> bytes:
    """A batch as the C++ client builds it: the entry's sequence id is the first message's, no
    highest_sequence_id, each message carries its own id (which need not be contiguous)."""
    return build_batch_entry([Message(t.encode(), sequence_id=i) for i, t in zip(ids, texts)],
                             producer_name="p", sequence_id=first, publish_time_ms=1, sequence_ids=ids)


async def test_ids_reused_after_a_reset_arrive_in_a_later_session_inside_a_mixed_batch():
    """The chaos loss under load (CHAOS.md, finding 7): the C++ client's counter reset happens in
    one session, while old ids are still in its open batch; the batch sent next holds old ids
    followed by smaller new ones, and the reused ids reach the broker in a LATER session, not
    starting at last_sequence_id + 1. Deciding by id, the later batch was answered as a
    duplicate of stored ids: acknowledged, never stored. Every session now opens a content range
    above the last_sequence_id it was given."""
    topic, ml = make_topic()
    h1 = Handle(0)
    p1 = topic.add_producer(h1, "p", None)
    assert topic.start_producer_session(p1, epoch=0) == -1
    for seq in range(4):                               # ids 0..3: 0, 2, 3 stored, 1 failed (a hole)
        publish(topic, p1, seq, seq, cpp_entry(seq, f"old{seq}"))
    ml.confirm(0)
    ml.adds[1][1].set_exception(RuntimeError("bookie gone"))
    await settle()
    ml.confirm(2)
    ml.confirm(3)
    await settle()
    topic.remove_producer(p1)                          # no receipt reached the client
    # session 2: given 0 (below the hole); the client resets its counter to 1, resends 1..3, and
    # its open batch [old4, new1, new2] goes out with sequence id 4; then the connection is cut
    h2 = Handle(1)
    p2 = topic.add_producer(h2, "p", None)
    assert topic.start_producer_session(p2, epoch=1) == 0
    for seq in (1, 2, 3):
        publish(topic, p2, seq, seq, cpp_entry(seq, f"old{seq}"))
    publish(topic, p2, 4, 4, cpp_batch(4, [4, 1, 2], ["old4", "new1", "new2"]))
    for i in range(4, len(ml.adds)):
        ml.confirm(i)
    await settle()
    topic.remove_producer(p2)
    # session 3: the receipts reached the client this time (no reset); it sends new3 and new4
    # with ids 3 and 4: below the stored high (the mixed batch counted as 4..6)
    h3 = Handle(2)
    p3 = topic.add_producer(h3, "p", None)
    topic.start_producer_session(p3, epoch=1)
    before = len(ml.adds)
    publish(topic, p3, 3, 3, cpp_batch(3, [3, 4], ["new3", "new4"]))
    assert len(ml.adds) == before + 1, "a batch of new messages under reused ids was answered as a duplicate"
    ml.confirm(before)
    await settle()
    assert h3.out[-1][0] == "receipt" and h3.out[-1][2] != (-1, -1)
    # a true resend (the same bytes) is still a duplicate: the resends of session 2 that were
    # answered as duplicates refilled the hole
    publish(topic, p3, 3, 3, cpp_batch(3, [3, 4], ["new3", "new4"]))
    assert len(ml.adds) == before + 1
    assert topic.dedup.holes == {}


async def test_a_send_declaring_an_impossible_batch_count_is_refused_and_changes_nothing():
    """[hardening] finding 2: a batch count of 2^31 wrapped negative in the stats; 2^31-1
    crashed official C++ consumers. Refused at the edge (SEND_ERROR); nothing stored."""
    from pulsarlite.wire.entry import EntryFormatError, check_sendable, peek_metadata
    topic, ml = make_topic()
    topic.dedup = None
    p = topic.add_producer(Handle(), "p", None)
    good = build_batch_entry([Message(b"a"), Message(b"b")], producer_name="p", sequence_id=0, publish_time_ms=1)
    check_sendable(good, peek_metadata(good))
    for count in ((1 << 31) - 1, 0, 1000):
        meta = peek_metadata(good).raw
        meta.num_messages_in_batch = count
        body = meta.SerializeToString()
        payload = good[peek_metadata(good).payload_offset:]
        bad = len(body).to_bytes(4, "big") + body + payload
        with pytest.raises(EntryFormatError, match="batch message count"):
            publish(topic, p, 1, 1, bad)
        refused = topic.publish(p, [(1, 1, bad), (2, 2, bad)])     # a run: each refused alone
        assert [(seq, type(e)) for seq, e in refused] == [(1, EntryFormatError), (2, EntryFormatError)]
    assert ml.adds == [] and topic.msg_in == 0
    publish(topic, p, 0, 0, good)
    assert len(ml.adds) == 1


async def test_an_admin_skip_into_a_huge_batch_does_work_for_what_it_skips_only():
    """[hardening] finding 1: skip over one entry claiming 2^24 messages built a set of 2^24
    indexes (1.15 GB, 3.7 s of event loop). Now only the indexes skipped are touched."""
    import tracemalloc
    from broker.topic import skip_messages
    meta = peek_metadata(build_batch_entry([Message(b"a")], producer_name="p", sequence_id=0,
                                           publish_time_ms=1)).raw
    meta.num_messages_in_batch = 1 << 24              # stored before SENDs were checked
    body = meta.SerializeToString()
    data = len(body).to_bytes(4, "big") + body + b"x" * 16

    class OneEntryML:
        last_confirmed_position = Position(3, 0)

        async def read_entries(self, position, count):
            return [(Position(3, 0), data)] if position <= Position(3, 0) else []

    class Topic:
        ml = OneEntryML()

        def next_after(self, position):
            return Position(3, position.entry_id + 1)

    class Cursor:
        mark_delete_position = Position(3, -1)
        acked: list = []

        def remaining_batch_indexes(self, position, batch_size):
            return None

        def ack_individual(self, position, batch_index=None, batch_size=None):
            self.acked.append(batch_index)
            return True

    cursor = Cursor()
    tracemalloc.start()
    skipped = await skip_messages(Topic(), cursor, 10)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert skipped == 10 and cursor.acked == list(range(10))
    assert peak < 8 * 1024 * 1024, peak


async def test_an_admin_skip_into_a_batch_larger_than_the_cursor_tracks_is_a_412_not_a_500():
    """A SEND may carry up to message_bytes_max / 6 messages (873,813 at 5 MiB), the cursor acks
    indexes of batches of at most batch_size_max (65,536): a skip ending inside such a batch
    raised InvalidAckError out of the admin handler (HTTP 500 with a traceback; found by
    bench/hostile_inputs.py). Now: 412 saying why, the whole entries before it skipped."""
    from broker.admin.policies import PreconditionFailedError
    from broker.cursor import InvalidAckError
    from broker.topic import skip_messages
    small = build_batch_entry([Message(b"a")], producer_name="p", sequence_id=0, publish_time_ms=1)
    meta = peek_metadata(small).raw
    meta.num_messages_in_batch = 100_000
    body = meta.SerializeToString()
    big = len(body).to_bytes(4, "big") + body + b"x" * 16
    entries = {Position(3, 0): small, Position(3, 1): big}

    class TwoEntryML:
        last_confirmed_position = Position(3, 1)

        async def read_entries(self, position, count):
            return [(p, d) for p, d in sorted(entries.items()) if p >= position][:count]

    class Topic:
        ml = TwoEntryML()

        def next_after(self, position):
            return Position(3, position.entry_id + 1)

    class Cursor:
        mark_delete_position = Position(3, -1)
        acked: list = []

        def remaining_batch_indexes(self, position, batch_size):
            return None

        def ack_individual(self, position, batch_index=None, batch_size=None):
            if batch_index is not None and batch_size > 65_536:
                raise InvalidAckError(f"batch size {batch_size} > batch_size_max 65536")
            self.acked.append((position, batch_index))
            return True

    cursor = Cursor()
    with pytest.raises(PreconditionFailedError, match="cannot skip part of the batch"):
        await skip_messages(Topic(), cursor, 10)
    assert cursor.acked == [(Position(3, 0), None)]       # the whole entry before it
    assert await skip_messages(Topic(), Cursor(), 100_001) == 100_001   # all of it: fine


async def test_a_new_producer_instance_is_deduplicated_by_id_a_reconnect_by_content():
    """A retried Spark task (a new producer, epoch 0) resends its rows under the same name and
    sequence ids with new publish times: duplicates by id, as Pulsar decides. The same ids with
    new bytes from a reconnecting producer (epoch > 0) are new messages (the C++ client's reset)."""
    topic, ml = make_topic()
    first = topic.add_producer(Handle(0), "p", None)
    assert topic.start_producer_session(first, epoch=0) == -1
    for seq in range(3):
        publish(topic, first, seq, seq, cpp_entry(seq, f"attempt1-{seq}"))
        ml.confirm(seq)
    await settle()
    topic.remove_producer(first)
    retry = topic.add_producer(Handle(1), "p", None)
    assert topic.start_producer_session(retry, epoch=0) == 2
    for seq in range(3):
        publish(topic, retry, seq, seq, cpp_entry(seq, f"attempt2-{seq}"))
    assert len(ml.adds) == 3, "a retried task's rows were stored again"
    topic.remove_producer(retry)
    again = topic.add_producer(Handle(2), "p", None)
    assert topic.start_producer_session(again, epoch=3) == 2
    publish(topic, again, 3, 3, cpp_entry(3, "new-3"))       # above: new either way
    publish(topic, again, 4, 4, cpp_entry(4, "new-4"))
    ml.confirm(3)
    ml.confirm(4)
    await settle()
    topic.remove_producer(again)
    reconnect = topic.add_producer(Handle(3), "p", None)
    assert topic.start_producer_session(reconnect, epoch=4) == 4
    publish(topic, reconnect, 4, 4, cpp_entry(4, "new-4"))    # a resend: the same bytes
    assert len(ml.adds) == 5


async def test_with_dedup_a_sequence_id_beyond_int64_is_refused_and_the_producer_goes_on():
    """Found by the fuzz suite (dedup-u64): a SEND with a sequence id >= 2^63 was stored but its
    add callback failed (the dedup window packs ids as int64), so it was never answered and
    the producer's later SENDs waited behind it for ever. It is refused at the edge now."""
    from broker.errors import NotAllowedError
    topic, ml = make_topic()
    h = Handle()
    p = topic.add_producer(h, "p", None)
    topic.start_producer_session(p, epoch=0)
    for seq in (1 << 63, (1 << 64) - 1):
        with pytest.raises(NotAllowedError, match="beyond"):
            publish(topic, p, seq, seq, entry(5))
    batch = build_batch_entry([Message(b"a"), Message(b"b")], producer_name="p", sequence_id=(1 << 63) - 1,
                              publish_time_ms=1)
    with pytest.raises(NotAllowedError):
        publish(topic, p, (1 << 63) - 1, (1 << 63) - 1, batch)      # covers 2^63 - 1 and 2^63
    publish(topic, p, 6, 6, entry(6))
    ml.confirm(0)
    await settle()
    assert ml.adds and h.out == [("receipt", 6, (7, 0))]


async def test_a_readers_subscription_tracks_partial_batch_acks():
    """A reader's (non-durable) subscription runs on the real cursor (the memory stand-in of
    broker/adapters.py, deleted, raised TypeError on a cumulative ack with an ack set and kept
    no batch index acked)."""
    from broker.cursor import ManagedCursor
    from broker.dispatch import SubType
    from broker.topic import Subscription
    from pulsarlite.wire import pb

    topic, ml = make_topic()
    infos = ()
    ml.ledgers = lambda: infos
    ml.last_confirmed_position = Position(7, 3)
    cursor = await ManagedCursor.open(None, "public/default/persistent/t", "reader-1", initial=Position(7, -1),
                                      durable=False, ledgers=lambda: infos)
    sub = Subscription(topic, "reader-1", SubType.EXCLUSIVE, cursor, False)
    try:
        consumer = ConsumerStub()
        sub.add_consumer(consumer, name="r")
        # indexes 0 and 1 of the 4 in entry (7, 2) acked (their bits cleared), with everything before
        mid = pb.MessageIdData(ledgerId=7, entryId=2, ack_set=[0b1100], batch_size=4)
        sub.ack(consumer, [mid], cumulative=True)
        assert sub.cursor.mark_delete_position == Position(7, 1)
        assert sub.cursor.remaining_ack_set(Position(7, 2), 4) == [0b1100]
        assert not sub.cursor.is_acked(Position(7, 2))
    finally:
        await sub.close(delete_cursor=False)


async def test_the_cache_keeps_what_dispatch_reads_of_the_metadata_as_the_entry_says():
    # the publish path reads the Key_Shared slot and deliver_at_time once, from the metadata it
    # parses anyway; the cache gives them with the entry: the same as parsing the stored entry
    def entry_with(key=None, ordering_key=None, deliver_at_ms=None, sequence_id=0) -> bytes:
        meta = pb.MessageMetadata(producer_name="p", sequence_id=sequence_id, publish_time=1)
        if key is not None:
            meta.partition_key = key
        if ordering_key is not None:
            meta.ordering_key = ordering_key
        if deliver_at_ms is not None:
            meta.deliver_at_time = deliver_at_ms
        return frame_entry(meta, b"x")

    topic, ml = make_topic()
    p = topic.add_producer(Handle(), "p", None)
    datas = [entry_with(key="k1", sequence_id=0), entry_with(key="k2", ordering_key=b"ok", sequence_id=1),
             entry_with(sequence_id=2), entry_with(key="k1", deliver_at_ms=1 << 42, sequence_id=3),
             entry_with(deliver_at_ms=0, sequence_id=4)]
    for i, data in enumerate(datas):
        publish(topic, p, i, i, data)
        ml.confirm(i)
    await settle()
    run = topic.service.entry_cache.read_run(topic.key, 7, 0, 10)
    assert [(e, data, count) for e, data, count, _, _ in run] == [(i, d, 1) for i, d in enumerate(datas)]
    assert [slot for _, _, _, slot, _ in run] == [sticky_key_hash("k1"), sticky_key_hash(b"ok"),
                                                 sticky_key_hash(None), sticky_key_hash("k1"), sticky_key_hash(None)]
    assert [slot for _, _, _, slot, _ in run] == [_slot_of(d) for d in datas]
    assert [at for _, _, _, _, at in run] == [0, 0, 0, 1 << 42, 0]
