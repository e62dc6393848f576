"""The entry codec's columnar half (pulsarlite.wire.columnar) against its oracle, the per-message
decoder (pulsarlite.wire.entry.unpack_entry), and the public pieces the tier format builds rows
from; and the layout rule that nothing outside pulsarlite/wire imports a private wire name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulsarlite.wire import pb
from pulsarlite.wire.columnar import plain_batch_columns
from pulsarlite.wire.entry import (Compression, EntryFormatError, Message, batch_message_headers, build_batch_entry,
                                   build_entry, decompress, parse_metadata_unchecked,
                                   peek_metadata, split_entry, uncompressed_entry_header,
                                   unpack_entry)

ROOT = Path(__file__).resolve().parents[2]
# around the varint length steps of a sequence id, and far up
FIRST_IDS = [0, 1, 100, 127, 128, 129, 5_000, 16_383, 16_384, 2_097_151, 2**35 + 3, 2**63 - 400]


def _batch_data(entry: bytes) -> tuple[bytes, pb.MessageMetadata]:
    meta, payload = split_entry(entry)
    raw = meta.raw
    data = decompress(payload, raw.compression, raw.uncompressed_size)
    return bytes(data), raw


def _oracle(entry: bytes):
    """(values, headers, keys) as the per-message decoder reads them."""
    meta, messages = unpack_entry(entry)
    data, _ = _batch_data(entry)
    headers = batch_message_headers(data, messages)
    assert headers is not None
    return [bytes(m.payload) for m in messages], [bytes(h) for h in headers], \
        [m.key for m in messages]


@st.composite
def plain_batches(draw):
    count = draw(st.integers(1, 160))
    first = draw(st.sampled_from(FIRST_IDS))
    uniform = draw(st.booleans())
    size = draw(st.sampled_from([0, 1, 5, 127, 128, 300]))
    sizes = [size] * count if uniform else draw(
        st.lists(st.sampled_from([0, 1, 5, 127, 128, 300, 20_000]), min_size=count, max_size=count))
    with_ids = draw(st.booleans())
    keyed = draw(st.booleans())
    payloads = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    if keyed:
        keys = draw(st.lists(st.text(max_size=20), min_size=count, max_size=count))
        messages = [Message(p, key=k, sequence_id=first + i if with_ids else None)
                    for i, (p, k) in enumerate(zip(payloads, keys))]
        ids = None
    else:
        messages = payloads
        ids = list(range(first, first + count)) if with_ids else None
    codec = draw(st.sampled_from(list(Compression)))
    return build_batch_entry(messages, producer_name="p", sequence_id=first, publish_time_ms=7,
                             compression=codec, sequence_ids=ids), keyed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plain_batches())
def test_plain_batches_decode_as_the_per_message_decoder_reads_them(case):
    entry, keyed = case
    data, raw = _batch_data(entry)
    got = plain_batch_columns(data, raw.num_messages_in_batch, raw.sequence_id)
    assert got is not None                   # every batch drawn here is plain
    values, headers, keys = _oracle(entry)
    assert got.values.to_pylist() == values
    assert got.headers.to_pylist() == headers
    assert got.value_bytes == sum(map(len, values))
    assert got.header_bytes == sum(map(len, headers))
    if keyed:
        assert got.keys.to_pylist() == keys
    else:
        assert got.keys is None and keys == [None] * len(values)


def test_batches_that_are_not_plain_are_left_to_the_per_message_decoder():
    others = [
        [Message(b"a", properties={"k": "v"}, sequence_id=5), Message(b"b", sequence_id=6)],
        [Message(b"a", event_time_ms=3, sequence_id=5)],
        [Message(b"a", ordering_key=b"o", sequence_id=5)],
        [Message(b"a", sequence_id=5), Message(b"b", key="k", sequence_id=6)],   # key on some only
        [Message(b"a", sequence_id=5), Message(b"b", sequence_id=7)],            # a gap in the ids
        [Message(b"a", sequence_id=6), Message(b"b", sequence_id=7)],            # not the entry's id
    ]
    for messages in others:
        entry = build_batch_entry(messages, producer_name="p", sequence_id=5, publish_time_ms=7)
        data, raw = _batch_data(entry)
        assert plain_batch_columns(data, raw.num_messages_in_batch, raw.sequence_id) is None


@pytest.mark.parametrize("cut", [1, 3, 4, 5, 7])
def test_a_truncated_or_miscounted_batch_is_none_not_an_error(cut):
    entry = build_batch_entry([b"abc"] * 4, producer_name="p", sequence_id=200, publish_time_ms=7,
                              sequence_ids=[200, 201, 202, 203])
    data, raw = _batch_data(entry)
    assert plain_batch_columns(data[:-cut], 4, 200) is None
    assert plain_batch_columns(data, 5, 200) is None
    assert plain_batch_columns(data, 3, 200) is None


def test_batch_message_headers_refuse_messages_that_are_not_the_batch():
    entry = build_batch_entry([Message(b"x" * n, key="k") for n in (1, 2, 3)], producer_name="p",
                              sequence_id=0, publish_time_ms=7)
    _, messages = unpack_entry(entry)
    data, _ = _batch_data(entry)
    assert len(batch_message_headers(data, messages)) == 3
    assert batch_message_headers(data, messages[:2]) is None
    assert batch_message_headers(data, messages + [Message(b"")]) is None
    assert batch_message_headers(data[:2], messages) is None


@pytest.mark.parametrize("codec", list(Compression))
@pytest.mark.parametrize("batched", [False, True])
def test_uncompressed_entry_header_rebuilds_the_same_messages(codec, batched):
    if batched:
        entry = build_batch_entry([Message(b"m%d" % i, key="k", properties={"a": "b"})
                                   for i in range(5)], producer_name="p", sequence_id=9,
                                  publish_time_ms=7, compression=codec)
    else:
        entry = build_entry(Message(b"hello" * 20, key="k"), producer_name="p", sequence_id=9,
                            publish_time_ms=7, compression=codec)
    meta, payload = split_entry(entry)
    header = uncompressed_entry_header(entry, meta)
    data = decompress(payload, meta.raw.compression, meta.raw.uncompressed_size)
    rebuilt = header + bytes(data)
    if codec is Compression.NONE:
        assert rebuilt == entry                           # verbatim
    assert peek_metadata(rebuilt).compression == pb.NONE
    assert [tuple(m._replace(payload=bytes(m.payload))) for m in unpack_entry(rebuilt)[1]] == \
        [tuple(m._replace(payload=bytes(m.payload))) for m in unpack_entry(entry)[1]]


def test_parse_metadata_unchecked_skips_the_required_field_check_only():
    entry = build_entry(Message(b"v"), producer_name="p", sequence_id=1, publish_time_ms=7)
    meta = parse_metadata_unchecked(entry)
    assert meta is not None and meta.payload_offset == peek_metadata(entry).payload_offset
    meta = pb.MessageMetadata(uncompressed_size=3).SerializePartialToString()
    lacking = len(meta).to_bytes(4, "big") + meta + b"abc"
    assert parse_metadata_unchecked(lacking).uncompressed_size == 3
    with pytest.raises(EntryFormatError, match="required"):
        peek_metadata(lacking)
    for bad in (b"", b"\x00\x00", b"\x00\x00\x00\x09abc", b"\x00\x00\x00\x02\xff\xff"):
        assert parse_metadata_unchecked(bad) is None


def _private_wire_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module \
                and node.module.startswith("pulsarlite.wire"):
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {alias.name}"
                      for alias in node.names if alias.name.startswith("_")]
    return found


def test_nothing_outside_the_wire_package_imports_a_private_wire_name():
    wire = ROOT / "pulsarlite" / "wire"
    found = []
    for top in ("bookie", "broker", "faces", "offload", "pulsarlite", "spark_source", "bench", "scripts",
                "tests"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if wire not in path.parents:
                found += _private_wire_imports(path)
    assert found == []
