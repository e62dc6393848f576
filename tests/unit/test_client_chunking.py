"""The chunking cores: the producer's split (wire.entry.build_chunk_entries) and the consumer's
pure reassembly (client.chunking.ChunkAssembler), against Pulsar's consumer rules (Java
ConsumerImpl.processMessageChunk / removeChunkMessage / removeExpireIncompleteChunkedMessages)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from pulsarlite.client.chunking import (Ack, Chunk, ChunkAssembler, ChunkingConfig, Deliver,
                                        Release, Why, split_payload)
from pulsarlite.client.types import ChunkMessageId, MessageId
from pulsarlite.wire.entry import (Compression, EntryFormatError, Message, build_chunk_entries,
                                   check_sendable, split_entry, unpack_chunked, unpack_entry)


def chunks_of(uuid: str, payload: bytes, size: int, first_entry: int = 0, publish_ms: int = 1000,
              ledger: int = 7) -> list[Chunk]:
    ranges = split_payload(len(payload), size)
    return [Chunk(uuid, i, len(ranges), len(payload), (ledger, first_entry + i), publish_ms,
                  payload[a:b], context=("ctx", uuid)) for i, (a, b) in enumerate(ranges)]


def feed(asm: ChunkAssembler, chunks, now_ms: int = 2000) -> list:
    out = []
    for chunk in chunks:
        out.extend(asm.on_chunk(chunk, now_ms))
    return out


def test_in_order_chunks_deliver_one_message_naming_every_entry():
    asm = ChunkAssembler(ChunkingConfig())
    payload = bytes(range(256)) * 40
    parts = chunks_of("p-1", payload, 3000)
    assert len(parts) == 4
    assert feed(asm, parts[:-1]) == []
    assert len(asm) == 1
    [action] = asm.on_chunk(parts[-1], 2000)
    assert action == Deliver("p-1", tuple((7, i) for i in range(4)), payload, ("ctx", "p-1"))
    assert len(asm) == 0


def test_interleaved_messages_of_two_producers_both_complete():
    asm = ChunkAssembler(ChunkingConfig())
    a = chunks_of("a-0", b"A" * 10, 3, first_entry=0)
    b = chunks_of("b-0", b"B" * 7, 3, first_entry=100)
    mixed = [a[0], b[0], a[1], b[1], b[2], a[2], a[3]]
    out = feed(asm, mixed)
    assert [(x.uuid, x.payload) for x in out] == [("b-0", b"B" * 7), ("a-0", b"A" * 10)]


def test_missing_first_chunk_drops_the_chunk_unacked_until_it_is_old():
    asm = ChunkAssembler(ChunkingConfig(expire_incomplete_ms=1000))
    parts = chunks_of("p-1", b"x" * 9, 3, publish_ms=1000)
    assert asm.on_chunk(parts[1], 1500) == [Release("p-1", ((7, 1),), Why.OUT_OF_ORDER)]
    # published more than the expiry ago: it can never complete, acked
    assert asm.on_chunk(parts[2], 2001) == [Ack("p-1", ((7, 2),), Why.OUT_OF_ORDER)]
    assert len(asm) == 0


def test_a_gap_drops_the_partial_message_unacked():
    asm = ChunkAssembler(ChunkingConfig())
    parts = chunks_of("p-1", b"x" * 12, 3)
    assert feed(asm, parts[:2]) == []
    out = asm.on_chunk(parts[3], 2000)
    assert out == [Release("p-1", ((7, 0), (7, 1)), Why.OUT_OF_ORDER),
                   Release("p-1", ((7, 3),), Why.OUT_OF_ORDER)]
    assert len(asm) == 0


def test_a_duplicate_chunk_is_acked_and_the_message_still_completes():
    asm = ChunkAssembler(ChunkingConfig())
    parts = chunks_of("p-1", b"abcdefghi", 3)
    feed(asm, parts[:2])
    dup = Chunk("p-1", 1, 3, 9, (7, 50), 1000, b"def")
    assert asm.on_chunk(dup, 2000) == [Ack("p-1", ((7, 50),), Why.DUPLICATE)]
    [done] = asm.on_chunk(parts[2], 2000)
    assert type(done) is Deliver and done.payload == b"abcdefghi"
    assert done.positions == ((7, 0), (7, 1), (7, 2))


def test_a_resent_first_chunk_acks_the_older_copy_and_starts_over():
    asm = ChunkAssembler(ChunkingConfig())
    old = chunks_of("p-1", b"abcdefghi", 3, first_entry=0)
    new = chunks_of("p-1", b"abcdefghi", 3, first_entry=10)
    feed(asm, old[:2])
    assert asm.on_chunk(new[0], 2000) == [Ack("p-1", ((7, 0), (7, 1)), Why.SUPERSEDED)]
    out = feed(asm, new[1:])
    assert [type(x) for x in out] == [Deliver] and out[0].positions == ((7, 10), (7, 11), (7, 12))


def test_the_same_first_entry_again_is_never_acked():
    """A first chunk seen again at the same position is the same entry: acking the held copy
    would ack the entry about to be delivered (lost if the consumer then dies)."""
    asm = ChunkAssembler(ChunkingConfig())
    parts = chunks_of("p-1", b"abcdefghi", 3)
    feed(asm, parts[:2])
    assert asm.on_chunk(parts[0], 2000) == [Release("p-1", ((7, 0), (7, 1)), Why.SUPERSEDED)]


@pytest.mark.parametrize("auto_ack", [False, True])
def test_queue_full_drops_the_oldest_partial_message(auto_ack):
    asm = ChunkAssembler(ChunkingConfig(pending_messages_max=2, auto_ack_oldest_on_queue_full=auto_ack))
    a, b, c = (chunks_of(u, b"x" * 6, 3, first_entry=n) for u, n in (("a", 0), ("b", 10), ("c", 20)))
    assert feed(asm, [a[0], b[0]]) == []
    out = asm.on_chunk(c[0], 2000)
    kind = Ack if auto_ack else Release
    assert out == [kind("a", ((7, 0),), Why.QUEUE_FULL)]
    assert len(asm) == 2
    # a's later chunk now has no first chunk: dropped too
    assert [type(x) for x in asm.on_chunk(a[1], 2000)] == [Release]
    assert [type(x) for x in feed(asm, [b[1], c[1]])] == [Deliver, Deliver]


def test_expiry_acks_incomplete_messages_and_reports_its_deadline():
    asm = ChunkAssembler(ChunkingConfig(expire_incomplete_ms=500))
    assert asm.deadline_ms() is None
    parts = chunks_of("p-1", b"x" * 9, 3)
    asm.on_chunk(parts[0], 1000)
    assert asm.deadline_ms() == 1500
    assert asm.on_time(1499) == []
    assert asm.on_time(1500) == [Ack("p-1", ((7, 0),), Why.EXPIRED)]
    assert asm.deadline_ms() is None and len(asm) == 0


def test_no_expiry_when_zero():
    asm = ChunkAssembler(ChunkingConfig(expire_incomplete_ms=0))
    asm.on_chunk(chunks_of("p-1", b"x" * 9, 3)[0], 1000)
    assert asm.deadline_ms() is None and asm.on_time(10**12) == []


def test_clear_releases_everything_held_unacked():
    asm = ChunkAssembler(ChunkingConfig())
    feed(asm, chunks_of("a", b"x" * 9, 3)[:2] + chunks_of("b", b"y" * 9, 3, first_entry=9)[:1])
    assert asm.clear() == [Release("a", ((7, 0), (7, 1)), Why.OUT_OF_ORDER),
                           Release("b", ((7, 9),), Why.OUT_OF_ORDER)]
    assert len(asm) == 0


def test_chunks_that_overrun_or_disagree_are_corrupt_and_acked():
    asm = ChunkAssembler(ChunkingConfig())
    first = Chunk("p", 0, 2, 4, (1, 0), 0, b"abc")
    assert asm.on_chunk(first, 0) == []
    assert asm.on_chunk(Chunk("p", 1, 2, 4, (1, 1), 0, b"de"), 0) == [Ack("p", ((1, 0), (1, 1)), Why.CORRUPT)]
    asm.on_chunk(first, 0)
    assert asm.on_chunk(Chunk("p", 1, 3, 4, (1, 2), 0, b"d"), 0) == [Ack("p", ((1, 0), (1, 2)), Why.CORRUPT)]
    asm.on_chunk(first, 0)   # short: the last chunk leaves the message below its total
    assert Chunk("p", 1, 2, 4, (1, 3), 0, b"") and \
        asm.on_chunk(Chunk("p", 1, 2, 4, (1, 3), 0, b""), 0) == [Ack("p", ((1, 0), (1, 3)), Why.CORRUPT)]
    big = ChunkAssembler(ChunkingConfig(message_bytes_max=10))
    assert big.on_chunk(Chunk("q", 0, 2, 11, (1, 4), 0, b"a"), 0) == [Ack("q", ((1, 4),), Why.CORRUPT)]
    assert len(big) == 0


def test_config_bounds_are_checked():
    with pytest.raises(ValueError):
        ChunkingConfig(pending_messages_max=-1)
    with pytest.raises(ValueError):
        ChunkingConfig(expire_incomplete_ms=-1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=6), st.integers(1, 9),
       st.integers(0, 2**31))
def test_any_interleaving_of_complete_messages_delivers_each_whole(payloads, size, seed):
    """Chunks of several messages, each message's chunks in order but messages interleaved
    at random: every message is delivered once, whole, naming its own entries."""
    streams = [chunks_of(f"u{i}", p, size, first_entry=1000 * i) for i, p in enumerate(payloads)]
    rng = random.Random(seed)
    heads = [0] * len(streams)
    asm = ChunkAssembler(ChunkingConfig(pending_messages_max=0))
    out = []
    while any(h < len(s) for h, s in zip(heads, streams)):
        i = rng.choice([i for i, s in enumerate(streams) if heads[i] < len(s)])
        chunk = streams[i][heads[i]]
        heads[i] += 1
        if chunk.chunks == 1:
            continue          # a message that fits is not chunked
        out.extend(asm.on_chunk(chunk, 0))
    delivered = {a.uuid: a for a in out}
    assert all(type(a) is Deliver for a in out) and len(delivered) == len(out)
    for i, p in enumerate(payloads):
        if len(streams[i]) > 1:
            assert delivered[f"u{i}"].payload == p
            assert delivered[f"u{i}"].positions == tuple(c.position for c in streams[i])
    assert len(asm) == 0


@pytest.mark.parametrize("compression", [Compression.NONE, Compression.LZ4, Compression.ZSTD])
def test_build_chunk_entries_round_trips_through_the_entry_codec(compression):
    rng = random.Random(5)
    payload = bytes(rng.getrandbits(8) for _ in range(50_000)) + b"z" * 50_000
    msg = Message(payload, key="k", properties={"a": "b"}, event_time_ms=42)
    entries = build_chunk_entries(msg, producer_name="prod", sequence_id=9, publish_time_ms=1234,
                                  entry_bytes_max=16_384, compression=compression)
    assert len(entries) > 1 and all(len(e) <= 16_384 for e in entries)
    asm = ChunkAssembler(ChunkingConfig())
    out = []
    for n, entry in enumerate(entries):
        meta, [m] = unpack_entry(entry)
        check_sendable(entry, meta)          # the broker's publish check
        raw = meta.raw
        assert raw.uuid == "prod-9" and raw.sequence_id == 9 and raw.chunk_id == n
        assert raw.num_chunks_from_msg == len(entries)
        out += asm.on_chunk(Chunk(raw.uuid, raw.chunk_id, raw.num_chunks_from_msg,
                                  raw.total_chunk_msg_size, (1, n), raw.publish_time,
                                  bytes(m.payload), meta), 0)
    [done] = out
    whole, [m] = unpack_chunked(done.context.raw, done.payload)
    assert bytes(m.payload) == payload and m.key == "k" and dict(m.properties) == {"a": "b"}
    assert m.event_time_ms == 42 and whole.publish_time_ms == 1234
    assert not whole.raw.HasField("uuid")


def test_a_message_that_fits_is_one_plain_entry():
    [entry] = build_chunk_entries(Message(b"small"), producer_name="p", sequence_id=0,
                                  publish_time_ms=0, entry_bytes_max=1024)
    meta, [m] = unpack_entry(entry)
    assert meta.raw.num_chunks_from_msg == 0 and bytes(m.payload) == b"small"


def test_unpack_chunked_refuses_a_payload_that_does_not_decompress():
    entries = build_chunk_entries(Message(b"q" * 5000), producer_name="p", sequence_id=0,
                                  publish_time_ms=0, entry_bytes_max=1024, compression=Compression.NONE)
    meta, _ = split_entry(entries[0])
    meta.raw.compression = int(Compression.LZ4)
    with pytest.raises(EntryFormatError):
        unpack_chunked(meta.raw, b"\xff" * 100)


def test_chunk_message_id_names_first_and_last_chunk():
    mid = ChunkMessageId([(3, 4), (3, 9), (4, 0)], partition=2, topic="t")
    assert (mid.ledger_id(), mid.entry_id(), mid.partition()) == (4, 0, 2)
    assert mid.first_chunk_message_id() == MessageId(2, 3, 4)
    assert mid.last_chunk_message_id() == MessageId(2, 4, 0)
    assert [m.entry_id() for m in mid.chunk_message_ids()] == [4, 9, 0]
    wire = mid.to_proto()
    assert (wire.ledgerId, wire.entryId) == (4, 0)
    assert (wire.first_chunk_message_id.ledgerId, wire.first_chunk_message_id.entryId) == (3, 4)
    assert str(mid) == "(3,4,2,-1);(4,0,2,-1)"


def test_a_message_too_large_only_uncompressed_is_chunked_in_two_or_more():
    """12 KiB of zeros compress to a few bytes: still chunked (a broker may refuse a single
    message declaring more than its maximum uncompressed), and reassembles."""
    entries = build_chunk_entries(Message(b"\0" * 12_288), producer_name="p", sequence_id=3,
                                  publish_time_ms=0, entry_bytes_max=4096, compression=Compression.ZSTD)
    assert len(entries) >= 2
    asm = ChunkAssembler(ChunkingConfig())
    out = []
    for n, entry in enumerate(entries):
        meta, [m] = unpack_entry(entry)
        check_sendable(entry, meta)
        raw = meta.raw
        out += asm.on_chunk(Chunk(raw.uuid, raw.chunk_id, raw.num_chunks_from_msg, raw.total_chunk_msg_size,
                                  (1, n), 0, bytes(m.payload), meta), 0)
    [done] = out
    assert bytes(unpack_chunked(done.context.raw, done.payload)[1][0].payload) == b"\0" * 12_288


def test_the_broker_check_takes_a_compressed_chunk_of_a_message_larger_than_its_limit():
    """A compressed chunk declares the WHOLE message's uncompressed size, beyond the entry
    limit when that is why it was chunked: the publish check must not refuse it (it did:
    'declared uncompressed size 12582912 is outside [0, 5253120]', and the producer resent
    for ever); an impossible size (>= 2^31) is still refused."""
    rng = random.Random(1)
    entries = build_chunk_entries(Message(rng.randbytes(20_000)), producer_name="p", sequence_id=0,
                                  publish_time_ms=0, entry_bytes_max=8192, compression=Compression.LZ4)
    assert len(entries) >= 3
    for entry in entries:
        meta, _ = unpack_entry(entry)
        check_sendable(entry, meta, uncompressed_bytes_max=8192)
    meta, payload = split_entry(entries[0])
    meta.raw.uncompressed_size = 2**31
    from pulsarlite.wire.entry import frame_entry
    bad = frame_entry(meta.raw, bytes(payload))
    with pytest.raises(EntryFormatError, match="uncompressed size"):
        check_sendable(bad, unpack_entry(bad)[0])
