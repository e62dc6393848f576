"""The client's fast batch path writes exactly the bytes the general protobuf builder wrote.

``_reference_batch_payload`` / ``_reference_batch_entry`` are a frozen copy of
pulsarlite.wire.entry's builders as they were before the fast path (every field through
protobuf objects): the oracle. The current builders, the client's BatchBuilder (with plain
``bytes`` messages and sequence ids kept beside the messages) and the whole ProducerImpl send
path must give the same bytes for random messages with and without properties, keys, ordering
keys, event times and sequence ids.
"""

from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import assume, given, settings, strategies as st

from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.client import core as k
from pulsarlite.client.common import make_message
from pulsarlite.wire.entry import (Compression, Message, build_batch_entry, build_batch_payload,
                                   compress, unpack_entry)

_U32 = struct.Struct(">I")


# ------------------------------------------------------------------ the oracle (frozen copy)

def _kv(properties):
    return [pb.KeyValue(key=k, value=v) for k, v in properties.items()] if properties else []


def _reference_batch_payload(messages) -> bytes:
    parts = []
    for message in messages:
        payload = bytes(message.payload)
        single = pb.SingleMessageMetadata(payload_size=len(payload),
                                          properties=_kv(message.properties))
        if message.key is not None:
            single.partition_key = message.key
            if message.key_b64_encoded:
                single.partition_key_b64_encoded = True
        if message.null_key:
            single.null_partition_key = True
        if message.ordering_key is not None:
            single.ordering_key = message.ordering_key
        if message.event_time_ms:
            single.event_time = message.event_time_ms
        if message.sequence_id is not None:
            single.sequence_id = message.sequence_id
        if message.null_value:
            single.null_value = True
        if message.compacted_out:
            single.compacted_out = True
        meta = single.SerializeToString()
        parts += (_U32.pack(len(meta)), meta, payload)
    return b"".join(parts)


def _reference_batch_entry(messages, *, producer_name, sequence_id, publish_time_ms,
                           compression=Compression.NONE, schema_version=None,
                           highest_sequence_id=None, properties=None) -> bytes:
    raw = _reference_batch_payload(messages)
    metadata = pb.MessageMetadata(
        producer_name=producer_name, sequence_id=sequence_id, publish_time=publish_time_ms,
        properties=_kv(properties), num_messages_in_batch=len(messages),
        uncompressed_size=len(raw))
    first = messages[0]
    if first.key is not None:
        metadata.partition_key = first.key
        if first.key_b64_encoded:
            metadata.partition_key_b64_encoded = True
    if first.ordering_key is not None:
        metadata.ordering_key = first.ordering_key
    if compression:
        metadata.compression = int(compression)
    if schema_version is not None:
        metadata.schema_version = schema_version
    if highest_sequence_id is not None:
        metadata.highest_sequence_id = highest_sequence_id
    meta = metadata.SerializeToString()
    return _U32.pack(len(meta)) + meta + compress(raw, compression)


# ------------------------------------------------------------------ strategies

_text = st.text(max_size=8)
_u64 = st.one_of(st.integers(0, 300), st.integers(0, 2**21), st.integers(0, 2**64 - 1))
_payload = st.one_of(st.binary(max_size=40), st.sampled_from([b"", b"x" * 127, b"y" * 128,
                                                              b"z" * 16384, b"w" * 300]))

plain_message = st.builds(lambda payload, seq: Message(payload, sequence_id=seq), _payload,
                          st.one_of(st.none(), _u64))
any_message = st.builds(
    lambda **fields: Message(**fields),
    payload=_payload,
    key=st.one_of(st.none(), _text),
    key_b64_encoded=st.booleans(),
    ordering_key=st.one_of(st.none(), st.binary(max_size=6)),
    properties=st.one_of(st.just({}), st.dictionaries(_text, _text, max_size=3)),
    event_time_ms=st.one_of(st.none(), st.just(0), _u64),
    sequence_id=st.one_of(st.none(), _u64),
    null_value=st.booleans(),
    null_key=st.booleans(),
    compacted_out=st.booleans(),
)
mixed_batch = st.lists(st.one_of(plain_message, plain_message, any_message), min_size=1,
                       max_size=25)


# ------------------------------------------------------------------ the builders themselves

@settings(max_examples=300, deadline=None)
@given(messages=mixed_batch)
def test_batch_payload_matches_the_protobuf_encoder(messages):
    assert build_batch_payload(messages) == _reference_batch_payload(messages)


@settings(max_examples=150, deadline=None)
@given(messages=mixed_batch, first_seq=_u64)
def test_sequence_ids_beside_the_messages_equal_sequence_ids_inside(messages, first_seq):
    """The client keeps the sequence ids it assigns in a list beside the messages (no
    per-message namedtuple copy); plain content may be given as bytes."""
    seqs = [m.sequence_id if m.sequence_id is not None else first_seq + i
            for i, m in enumerate(messages)]
    stamped = [m._replace(sequence_id=s) for m, s in zip(messages, seqs)]
    plain_as_bytes = [bytes(m.payload) if m == Message(m.payload, sequence_id=m.sequence_id)
                      else m for m in messages]
    try:
        expected = _reference_batch_payload(stamped)
    except ValueError:   # an id past uint64: protobuf refuses it, and so must the fast path
        for batch in (messages, plain_as_bytes):
            with pytest.raises(ValueError):
                build_batch_payload(batch, seqs)
        return
    assert build_batch_payload(messages, seqs) == expected
    assert build_batch_payload(plain_as_bytes, seqs) == expected


@settings(max_examples=100, deadline=None)
@given(messages=mixed_batch, seq=_u64, codec=st.sampled_from(list(Compression)),
       props=st.one_of(st.none(), st.dictionaries(_text, _text, max_size=2)),
       schema_version=st.one_of(st.none(), st.binary(max_size=8)))
def test_batch_entry_matches_the_protobuf_encoder(messages, seq, codec, props, schema_version):
    kwargs = dict(producer_name="prod-1", sequence_id=seq, publish_time_ms=1_700_000_000_123,
                  compression=codec, schema_version=schema_version, highest_sequence_id=seq + 5,
                  properties=props)
    try:
        expected = _reference_batch_entry(messages, **kwargs)
    except ValueError:          # ids past uint64 (seq near the top): both builders refuse them
        with pytest.raises(ValueError):
            build_batch_entry(messages, **kwargs)
        return
    assert build_batch_entry(messages, **kwargs) == expected


@pytest.mark.parametrize("seq", [-1, -200, 2**64, 2**70])
def test_sequence_ids_out_of_uint64_range_are_refused(seq):
    for batch in ([b"a", b"b"], [Message(b"a"), Message(b"b")], [b"a" * 5] * 300):
        seqs = [seq + i for i in range(len(batch))]
        with pytest.raises(ValueError):
            _reference_batch_payload([Message(bytes(m) if type(m) is bytes else m.payload,
                                              sequence_id=s) for m, s in zip(batch, seqs)])
        with pytest.raises(ValueError):
            build_batch_payload(batch, seqs)


def test_uniform_runs_across_varint_lengths():
    """Long runs of one size crossing the 1/2/3/4-byte varint boundaries of the ids."""
    for first in (0, 100, 16_000, 2**21 - 300, 2**28 - 5, 2**63 + 7, 2**64 - 600):
        batch = [b"p" * 100] * 500
        seqs = list(range(first, first + 500))
        expected = _reference_batch_payload([Message(m, sequence_id=s)
                                             for m, s in zip(batch, seqs)])
        assert build_batch_payload(batch, seqs) == expected
        assert build_batch_payload(batch, tuple(seqs)) == expected


def test_memoryview_and_bytearray_payloads():
    messages = [Message(memoryview(b"abc")), Message(bytearray(b"de"), sequence_id=9)]
    assert build_batch_payload(messages) == _reference_batch_payload(messages)


# ------------------------------------------------------------------ the client's builder

@settings(max_examples=100, deadline=None)
@given(messages=mixed_batch, next_seq=st.integers(0, 2**40))
def test_batch_builder_with_bytes_and_messages(messages, next_seq):
    """BatchBuilder.add(message_or_bytes, callback, sequence_id) builds the entry the old
    path built from messages stamped with ``_replace(sequence_id=...)``."""
    builder = k.BatchBuilder(k.BatchLimits(messages_max=1000, bytes_max=10**9, delay_ms=1))
    stamped = []
    seq = next_seq
    for i, m in enumerate(messages):
        s = m.sequence_id if m.sequence_id is not None else seq
        seq = s + 1
        plain = m == Message(m.payload, sequence_id=m.sequence_id) and m.sequence_id is None
        builder.add(bytes(m.payload) if plain else m, i, s)
        stamped.append(m._replace(sequence_id=s))
    if max(m.sequence_id for m in stamped) >= 2**64:   # past uint64: refused, as protobuf does
        with pytest.raises(ValueError):
            builder.build(producer_name="p", publish_time_ms=5, compression=Compression.NONE)
        return
    entry, callbacks, count, first, last = builder.build(
        producer_name="p", publish_time_ms=5, compression=Compression.NONE)
    assert callbacks == list(range(len(messages))) and count == len(messages)
    assert (first, last) == (stamped[0].sequence_id, stamped[-1].sequence_id)
    assert entry == _reference_batch_entry(stamped, producer_name="p", sequence_id=first,
                                           publish_time_ms=5, highest_sequence_id=last)
    assert len(builder) == 0 and builder.payload_bytes == 0


def test_batch_builder_old_signature_still_reads_the_message_sequence_id():
    builder = k.BatchBuilder(k.BatchLimits(messages_max=3, bytes_max=100, delay_ms=5))
    builder.add(Message(b"a", sequence_id=5), "cb0")
    builder.add(Message(b"b", key="k", sequence_id=6), "cb1")
    entry, callbacks, count, first, last = builder.build(
        producer_name="p", publish_time_ms=1, compression=Compression.NONE)
    assert (callbacks, count, first, last) == (["cb0", "cb1"], 2, 5, 6)
    _, got = unpack_entry(entry)
    assert [m.sequence_id for m in got] == [5, 6] and got[1].key == "k"


def test_make_message_plain_fast_path_is_the_same_message():
    assert make_message(b"abc") == Message(b"abc")
    assert make_message(bytearray(b"abc")) == Message(b"abc")
    assert make_message(memoryview(b"abc")) == Message(b"abc")
    with pytest.raises(TypeError):
        make_message("text")
    assert make_message(b"a", {"k": "v"}, "key", "ok", 7, 3) == Message(
        b"a", "key", False, b"ok", {"k": "v"}, 7, 3)


# ------------------------------------------------------------------ the whole send path

class _FakeConn:
    """Collects what the producer writes (a fake of our own connection: unit test)."""

    def __init__(self):
        self.parts = []
        self.closed = False

    def writelines(self, parts):
        self.parts.append(list(parts))


class _FakeClient:
    def __init__(self, loop):
        import itertools
        import random
        self.loop = loop
        self._producer_ids = itertools.count()
        self._random = random.Random(1)


@settings(max_examples=40, deadline=None)
@given(messages=mixed_batch, first_seq=st.integers(0, 2**30))
def test_producer_send_path_writes_the_reference_bytes(messages, first_seq):
    """ProducerImpl.send (plain content as bytes or as a Message) puts on the wire the SEND
    the old path put there: same sequence ids, same entry."""
    from pulsarlite.client.producer import ProducerConf, ProducerImpl
    from pulsarlite.wire import commands as c

    loop = asyncio.new_event_loop()
    try:
        conf = ProducerConf(producer_name="p", batching_max_messages=len(messages),
                            batching_max_allowed_size_in_bytes=10**9,
                            initial_sequence_id=first_seq - 1)
        producer = ProducerImpl(_FakeClient(loop), "persistent://public/default/t", conf)
        producer.conn = _FakeConn()
        seq = first_seq
        stamped = []
        for i, m in enumerate(messages):
            s = m.sequence_id if m.sequence_id is not None else seq
            seq = s + 1
            stamped.append(m._replace(sequence_id=s))
            assume(s < 2**64)
            plain = m == Message(m.payload)
            producer.send(bytes(m.payload) if plain else m, lambda e, mid: None)
        assert len(producer.conn.parts) == 1    # the batch filled up and went out
        [parts] = producer.conn.parts
        first, last = stamped[0].sequence_id, stamped[-1].sequence_id
        metadata, _ = unpack_entry(bytes(parts[-1]))
        entry = _reference_batch_entry(stamped, producer_name="p", sequence_id=first,
                                       publish_time_ms=metadata.publish_time_ms,
                                       highest_sequence_id=last)
        expected = c.send_parts(producer.producer_id, first, entry, num_messages=len(messages),
                                highest_sequence_id=last)
        assert b"".join(bytes(p) for p in parts) == b"".join(bytes(p) for p in expected)
    finally:
        loop.close()


# ------------------------------------------------------------------ send_many == send, one by one

def _producer(loop, **conf_kwargs):
    from pulsarlite.client.producer import ProducerConf, ProducerImpl
    conf = ProducerConf(producer_name="p", send_timeout_millis=0, **conf_kwargs)
    producer = ProducerImpl(_FakeClient(loop), "persistent://public/default/t", conf)
    producer.conn = _FakeConn()
    return producer


_inbox_item = st.one_of(
    st.binary(max_size=30).map(lambda b: ("bytes", b)),
    st.binary(max_size=30).map(lambda b: ("bytes", b)),
    st.binary(min_size=61, max_size=70).map(lambda b: ("bytes", b)),   # above the size limit
    any_message.map(lambda m: ("message", m)),
)


@settings(max_examples=60, deadline=None)
@given(items=st.lists(_inbox_item, max_size=40), messages_max=st.integers(1, 7),
       bytes_max=st.integers(1, 200), key_based=st.booleans())
def test_send_many_writes_what_send_one_by_one_writes(items, messages_max, bytes_max,
                                                      key_based):
    """ProducerImpl.send_many (the blocking API's drain) and send() called per message put
    the same SENDs on the wire, refuse the same messages, and keep the same callbacks in the
    same order."""
    import collections

    def run(use_many):
        loop = asyncio.new_event_loop()
        try:
            producer = _producer(loop, batching_max_messages=messages_max,
                                 batching_max_allowed_size_in_bytes=bytes_max,
                                 batching_type=1 if key_based else 0)
            producer.max_message_size = 60
            refused = []
            inbox = collections.deque()
            for i, (_, m) in enumerate(items):
                inbox.extend((m, i))
            if use_many:
                producer.send_many(inbox, lambda cb, exc: refused.append((cb, type(exc))))
            else:
                while inbox:
                    m = inbox.popleft()
                    cb = inbox.popleft()
                    try:
                        producer.send(m, cb)
                    except Exception as exc:
                        refused.append((cb, type(exc)))
            producer._flush_batch()
            publish_free = []
            for parts in producer.conn.parts:
                metadata, got = unpack_entry(bytes(parts[-1]))
                publish_free.append((metadata.sequence_id, metadata.message_count,
                                     [(bytes(g.payload), g.key, g.sequence_id) for g in got]))
            ops = [(op.first_seq, op.last_seq, op.callbacks, op.count) for op in producer._pending]
            return publish_free, ops, refused, producer._next_seq
        finally:
            loop.close()

    assert run(True) == run(False)


@pytest.mark.parametrize("use_many", [False, True], ids=["send", "send_many"])
def test_a_sequence_id_past_uint64_is_refused_and_its_batch_still_goes_out(use_many):
    """An explicit sequence id of 2**64-1 leaves the next message an id the wire cannot carry:
    that message is refused when it is sent (send raises, send_many answers its callback), and
    the batch already holding the first message is still encoded and sent. Before, the refusal
    came from the batch's encoding: the whole batch failed at its flush (found by the property
    above)."""
    import collections

    from pulsarlite.client.errors import InvalidConfiguration
    loop = asyncio.new_event_loop()
    try:
        producer = _producer(loop, batching_max_messages=7)
        first = Message(b"a", sequence_id=2**64 - 1)
        refused = []
        if use_many:
            inbox = collections.deque([first, "cb-first", b"b", "cb-second"])
            producer.send_many(inbox, lambda cb, exc: refused.append((cb, type(exc))))
        else:
            producer.send(first, "cb-first")
            with pytest.raises(InvalidConfiguration, match="outside 0..2[*][*]64-1"):
                producer.send(b"b", "cb-second")
            refused.append(("cb-second", InvalidConfiguration))
        assert refused == [("cb-second", InvalidConfiguration)]
        producer._flush_batch()
        [parts] = producer.conn.parts
        metadata, got = unpack_entry(bytes(parts[-1]))
        assert [(bytes(g.payload), g.sequence_id) for g in got] == [(b"a", 2**64 - 1)]
        assert [op.callbacks for op in producer._pending] == [["cb-first"]]
    finally:
        loop.close()


# ------------------------------------------------------------------ the blocking producer

class _FakeIO:
    def __init__(self):
        self.calls = []

    def call(self, fn, *args):
        self.calls.append((fn, args))


class _FakeBlockingClient:
    def __init__(self):
        self._io = _FakeIO()


def _blocking(loop, max_pending=10, block=False, **conf_kwargs):
    from pulsarlite.client import blocking
    producer = _producer(loop, **conf_kwargs)
    return blocking.Producer(_FakeBlockingClient(), producer, max_pending, block), producer


def test_blocking_callbacks_get_result_and_message_ids_once_per_message():
    from pulsarlite.client.types import Result
    loop = asyncio.new_event_loop()
    try:
        bp, producer = _blocking(loop, max_pending=100, batching_max_messages=3)
        got = []
        for i in range(5):
            bp.send_async(b"m%d" % i, lambda res, mid, i=i: got.append((i, res, mid)))
        bp.send_async(b"quiet", None)                       # no callback: fine
        bp.send_async(b"k", lambda res, mid: got.append(("k", res, mid)), partition_key="key")
        assert len(bp._io.calls) == 1                       # one wake-up for the whole chunk
        bp._drain()
        producer._flush_batch()
        assert bp._submitted - bp._completed == 7
        ops = list(producer._pending)
        assert [op.count for op in ops] == [3, 3, 1]
        assert bp.acked_and_failed() == (0, 0)
        acked = []
        for entry_id, op in enumerate(ops):
            producer._pending.on_receipt(op.first_seq)
            producer._complete(op, None, 9, entry_id)
            acked.append(bp.acked_and_failed())
        # counted per message, the one sent without a callback too
        assert acked == [(3, 0), (6, 0), (7, 0)]
        assert bp._submitted - bp._completed == 0
        assert [(g[0], g[1]) for g in got] == [(0, Result.Ok), (1, Result.Ok), (2, Result.Ok),
                                                (3, Result.Ok), (4, Result.Ok), ("k", Result.Ok)]
        mids = [g[2] for g in got]
        assert [(m.ledger_id(), m.entry_id(), m.batch_index(), m.batch_size()) for m in mids] == [
            (9, 0, 0, 3), (9, 0, 1, 3), (9, 0, 2, 3), (9, 1, 0, 3), (9, 1, 1, 3), (9, 2, 0, 1)]
        assert mids[0].topic_name() == "persistent://public/default/t"
    finally:
        loop.close()


def test_blocking_failures_map_to_results_and_sync_send_raises_the_error():
    from pulsarlite.client import blocking
    from pulsarlite.client.errors import MessageTooBig, ProducerQueueIsFull, Timeout
    from pulsarlite.client.types import Result
    loop = asyncio.new_event_loop()
    try:
        bp, producer = _blocking(loop, max_pending=3, batching_max_messages=10)
        got = []
        bp.send_async(b"a", lambda res, mid: got.append((res, mid)))
        sync = blocking._SyncSend()
        bp._submit(b"b", sync)
        bp.send_async(b"c", lambda res, mid: got.append((res, mid)))
        with pytest.raises(ProducerQueueIsFull):          # the pending limit holds
            bp.send_async(b"d", None)
        with pytest.raises(MessageTooBig):                # refused before it is queued
            bp.send_async(b"x" * (producer.max_message_size + 1), None)
        bp._drain()
        producer._fail_all([], Timeout("late"))             # the open batch fails
        assert got == [(Result.Timeout, None), (Result.Timeout, None)]
        assert bp.acked_and_failed() == (0, 3)              # the sync send's too; none acked
        with pytest.raises(Timeout):
            sync.result(0)
        assert bp._submitted - bp._completed == 0
        bp.send_async(b"e", None)                           # room again
    finally:
        loop.close()


def test_blocking_refused_in_the_drain_reaches_the_callback():
    from pulsarlite.client.types import Result
    loop = asyncio.new_event_loop()
    try:
        bp, producer = _blocking(loop, max_pending=10)
        got = []
        bp.send_async(b"x" * 50, lambda res, mid: got.append(res))
        producer.max_message_size = 10     # the broker's limit shrank after a reconnect
        bp._drain()
        assert got == [Result.MessageTooBig] and bp._submitted == bp._completed
        assert bp.acked_and_failed() == (0, 1)
    finally:
        loop.close()


# ------------------------------------------------------------------ the perf tool's stats

def test_latency_stats_count_interval_and_bounded_sample(monkeypatch):
    from faces import cli_perf
    monkeypatch.setattr(cli_perf, "RESERVOIR_MAX", 50)
    stats = cli_perf.LatencyStats()
    for i in range(30):
        stats.add(float(i), 10)
    assert stats.take_interval() == [float(i) for i in range(30)]
    assert stats.take_interval() == []
    for i in range(30, 200):
        stats.add(float(i), 10)
    assert stats.count == 200 and stats.bytes == 2000
    # 200 latencies, at most 50 kept: every 4th over the whole run
    assert stats.all_sorted() == [float(i) for i in range(0, 200, 4)]
    for i in range(200, 333):                  # folded in odd-sized pieces: the stride holds
        stats.add(float(i), 10)
        if i % 7 == 0:
            stats.take_interval()
    assert stats.all_sorted() == [float(i) for i in range(0, 333, 8)]
