"""The tier format: one Parquet object per ledger, one row per message (batches unpacked,
compression removed), with what it takes to rebuild every entry exactly.

API (the tier format, docs/protocol.md#tier-format)::

    ROW_SCHEMA                      # pyarrow schema, columns in this order:
        ledger_id int64, entry_id int64, batch_index int32 (-1: not a batch),
        batch_size int32 (0: not a batch), partition int32 (-1: non-partitioned topic),
        publish_time timestamp[ms, UTC], event_time timestamp[ms, UTC] (null: unset),
        key string (null), ordering_key binary (null), properties map<string,string>,
        producer_name string, sequence_id int64, schema_version binary (null), value binary,
        -- extras for the rebuild --
        null_value bool, entry_header binary, message_header binary
        -- then any further columns a writer adds (e.g. typed columns from a schema); readers
           select by name

    entries_to_table(ledger_id, entries, *, partition) -> pa.Table
        entries: iterable of (entry_id, stored entry bytes ``[u32 meta_size][MessageMetadata]
        [payload]``), in increasing entry id order.
    table_to_entries(table) -> Iterator[(entry_id, entry bytes)]
        one rebuilt, uncompressed entry per original entry id (a batch iff batch_size > 0):
        the same messages, the same ids.
    write_parquet(table, sink, *, row_group_bytes=..., compression=...) -> ParquetSummary
    ParquetStreamWriter(sink, *, row_group_bytes=...).write(table)...; .close(metadata) -> summary
    ledger_tables(ledger_id, entries, *, partition, decoded_bytes_max) -> Iterator[pa.Table]
        the entries as tables of about one row group of decoded bytes each (for the writer)
    read_parquet(source, *, row_groups=None, columns=None) -> pa.Table
    open_parquet(source) -> pq.ParquetFile            # page checksums verified
    summarize_table(table) -> TableSummary            # rows, entries, min/max publish time
    FORMAT_VERSION, TierFormatError

``sink``/``source`` are a path, a pyarrow NativeFile or a Python file object.

Rebuild columns: ``entry_header`` holds, on the first row of each entry only (null on the
others), the entry's ``[u32 meta_size][MessageMetadata]`` with ``compression`` cleared
(``uncompressed_size`` is then the payload's real size); ``message_header`` holds, for a
batched message, its ``[u32 size][SingleMessageMetadata]`` verbatim (empty when not a batch).
An entry is thus ``entry_header + (message_header + value) for each of its rows``: one
vectorized concatenation rebuilds all entries of a row group, without per-message Python.

An encrypted entry (pulsarlite does not decrypt) is kept as ONE opaque row: ``value`` is its
payload still compressed and encrypted, ``entry_header`` its metadata verbatim, batch_size 0;
it is rebuilt byte for byte and the consumer's client decrypts and splits it as before.

Footer key-value metadata: ``pulsarlite.format_version``, ``pulsarlite.rows``,
``pulsarlite.entries`` and the writer's pairs (the offloader: ``pulsarlite.ledger_id``, and
``pulsarlite.typed_columns`` when it added typed columns: offload/typed_columns.py).

Row groups hold whole entries (an entry's rows never straddle two row groups), cut at about
``row_group_bytes`` of message bytes, so the tier reader can fetch and decode row groups in
parallel. Parquet page checksums are written and verified on every read (invariant 8);
statistics are kept on ledger_id, entry_id, publish_time and event_time (pruning).
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass
from itertools import accumulate, chain
from operator import itemgetter, methodcaller
from typing import Any, BinaryIO, Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from offload.errors import TierError
from pulsarlite._proto import pulsar_api_pb2 as pb
from pulsarlite.errors import ChecksumError, PulsarliteError
from pulsarlite.wire.columnar import plain_batch_columns
from pulsarlite.wire.entry import (EntryFormatError, Message, batch_message_headers, decompress,
                                   has_unknown_fields, parse_metadata_unchecked, split_entry,
                                   uncompressed_entry_header, unpack_entry)

FORMAT_VERSION = "1"
ROW_GROUP_BYTES_DEFAULT = 8 * 1024 * 1024
ROW_GROUP_ROWS_MAX = 1_000_000
PARQUET_COMPRESSION_DEFAULT = "zstd"
PARQUET_COMPRESSION_LEVEL_DEFAULT = 1
STATISTICS_COLUMNS = ["ledger_id", "entry_id", "publish_time", "event_time"]

# fields of pulsarlite.wire.entry.Message
_PAYLOAD, _KEY, _ORDERING_KEY, _PROPERTIES, _EVENT_TIME, _SEQUENCE_ID, _NULL_VALUE, \
    _BATCH_INDEX = (itemgetter(i) for i in (0, 1, 3, 4, 5, 6, 7, 10))
_VALUES = methodcaller("values")
_TS = pa.timestamp("ms", tz="UTC")
_PROPERTIES_TYPE = pa.map_(pa.string(), pa.string())
_NO_PROPERTIES: dict[str, str] = {}

ROW_SCHEMA = pa.schema([
    pa.field("ledger_id", pa.int64(), nullable=False),
    pa.field("entry_id", pa.int64(), nullable=False),
    pa.field("batch_index", pa.int32(), nullable=False),
    pa.field("batch_size", pa.int32(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("publish_time", _TS, nullable=False),
    pa.field("event_time", _TS),
    pa.field("key", pa.string()),
    pa.field("ordering_key", pa.binary()),
    pa.field("properties", _PROPERTIES_TYPE),
    pa.field("producer_name", pa.string(), nullable=False),
    pa.field("sequence_id", pa.int64(), nullable=False),
    pa.field("schema_version", pa.binary()),
    pa.field("value", pa.binary(), nullable=False),
    # extras: what it takes to rebuild the entries exactly
    pa.field("null_value", pa.bool_(), nullable=False),
    pa.field("entry_header", pa.binary()),
    pa.field("message_header", pa.binary(), nullable=False),
])
CONTRACT_COLUMNS = ROW_SCHEMA.names[:14]
REBUILD_COLUMNS = ["entry_id", "batch_index", "batch_size", "value", "entry_header",
                   "message_header"]


log = logging.getLogger("pulsarlite.offload.format")

# an entry's payload decompresses to at most this by default (a producer's message is at most
# the broker's message_bytes_max, 5 MiB by default, and SENDs declaring more are refused; the
# broker's offloader passes its message_bytes_max as ``uncompressed_bytes_max``); larger or
# broken payloads are kept opaque (see _opaque) instead of failing their ledger's offload
ENTRY_UNCOMPRESSED_BYTES_MAX = 8 * 1024 * 1024


class TierFormatError(TierError):
    """A tier object (or a table) that does not decode as this format: not Parquet, a wrong
    schema, rows that do not form whole entries, or entry bytes that do not decode."""


class TierChecksumError(ChecksumError, TierError):
    """A Parquet page checksum (CRC32) or the object's recorded checksum does not match."""


@dataclass(frozen=True)
class TableSummary:
    rows: int
    entries: int
    min_publish_time_ms: int | None
    max_publish_time_ms: int | None


@dataclass(frozen=True)
class ParquetSummary:
    rows: int
    entries: int
    row_groups: int
    min_publish_time_ms: int | None
    max_publish_time_ms: int | None


# ---------------------------------------------------------------------------------------------
# entries -> table
# ---------------------------------------------------------------------------------------------

def _binary_from_parts(parts: list, lengths: list[int]) -> pa.Array:
    """A non-null binary array from byte-likes: one join and one offsets array (no Python
    object per row on the Arrow side)."""
    offsets = array("i", [0])
    if lengths:
        total = sum(lengths)
        if total >= 2**31:
            raise TierFormatError(f"{total} bytes in one column (split the ledger)")
        offsets.extend(accumulate(lengths))
    data = b"".join(parts)
    return pa.Array.from_buffers(pa.binary(), len(lengths),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _int_array(values: list[int], typecode: str, arrow_type: pa.DataType) -> pa.Array:
    buf = array(typecode, values)
    return pa.Array.from_buffers(arrow_type, len(buf), [None, pa.py_buffer(buf)])


def _ints(arr: pa.Array) -> memoryview:
    """A zero-copy view of a non-null int32/int64 array's values."""
    code = "q" if arr.type.bit_width == 64 else "i"
    buf = arr.buffers()[1]
    view = memoryview(buf).cast(code) if buf is not None else memoryview(array(code))
    return view[arr.offset:arr.offset + len(arr)]


def _opaque(entry: bytes | memoryview) -> tuple | None:
    """An entry whose messages we cannot read, as one opaque row: metadata and payload (still
    compressed, perhaps encrypted) verbatim, so the rebuilt entry is the original byte for byte.
    That is an encrypted entry (pulsarlite does not decrypt), or one whose payload does not
    decompress within the bound (``uncompressed_bytes_max``; [hardening]: one entry declaring
    2^31-1 bytes failed its ledger's offload on every pass, forever; ten small compressed
    entries took the broker past 1.3 GB). None when even the metadata does not parse."""
    try:
        metadata, payload = split_entry(entry)
    except EntryFormatError:
        return None
    raw = metadata.raw
    return metadata, Message(payload, metadata.key, raw.partition_key_b64_encoded,
                             metadata.ordering_key, metadata.properties,
                             raw.event_time or None, raw.sequence_id, False)


def _batch_buffer(entry: bytes | memoryview, messages: list, raw: pb.MessageMetadata,
                  uncompressed_bytes_max: int = ENTRY_UNCOMPRESSED_BYTES_MAX) -> bytes:
    """The decompressed batch the messages' payloads are views of (no second decompression);
    decompressed again through the codec if the payloads are not views of one buffer."""
    obj = getattr(messages[0].payload, "obj", None)
    if type(obj) is bytes and len(obj) == raw.uncompressed_size:
        return obj
    _, payload = split_entry(entry)
    data = decompress(payload, raw.compression, raw.uncompressed_size,
                      uncompressed_bytes_max=uncompressed_bytes_max)
    return bytes(data)


def _is_text(value: Any) -> bool:
    """A proto2 string field as a string column takes it: valid UTF-8. (upb hands a string
    field whose bytes are not UTF-8 out as ``bytes``; a ``str`` with lone surrogates does not
    encode either.)"""
    if type(value) is not str:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _text_opaque_ids(entry_ids: list[int], msgs: list, producer_names: list) -> set[int]:
    """The entries of rows with a text column (key, properties, producer name) that is not
    valid UTF-8. Asked only after a table's conversion failed: the normal path never pays it."""
    bad: set[int] = set()
    for entry_id, message, producer_name in zip(entry_ids, msgs, producer_names):
        key = message.key
        if not _is_text(producer_name) or (key is not None and not _is_text(key)) \
                or not all(_is_text(k) and _is_text(v) for k, v in message.properties.items()):
            bad.add(entry_id)
    return bad


class _InvalidText(Exception):
    """A table's text columns do not convert: ``entry_ids`` have a field that is not UTF-8."""

    def __init__(self, entry_ids: set[int]) -> None:
        super().__init__(entry_ids)
        self.entry_ids = entry_ids


def entries_to_table(ledger_id: int, entries: Iterable[tuple[int, bytes | memoryview]], *,
                     partition: int,
                     uncompressed_bytes_max: int = ENTRY_UNCOMPRESSED_BYTES_MAX) -> pa.Table:
    """Stored entries -> one row per message (see the module docstring). Entry ids must
    increase. An entry whose payload does not decompress within ``uncompressed_bytes_max``
    (or does not decode), or is encrypted, is one opaque row (``_opaque``); so is an entry with
    a text field (key, property, producer name) that is not UTF-8, its invalid text columns
    null (the producer name, required, with replacement characters): found only when the
    table's conversion fails, then entry by entry. TierFormatError for an entry whose metadata
    does not parse."""
    if ledger_id < 0:
        raise ValueError(f"ledger id {ledger_id} < 0")
    if not isinstance(entries, (list, tuple)):
        entries = list(entries)       # read again if a text field does not convert
    try:
        return _entries_table(ledger_id, entries, partition, uncompressed_bytes_max, frozenset())
    except _InvalidText as exc:
        text_opaque = frozenset(exc.entry_ids)
    first = min(text_opaque)
    log.warning("ledger %d entry %d kept opaque in the tier (a text field is not UTF-8); %d such "
                "entries in entries %d-%d", ledger_id, first, len(text_opaque), entries[0][0],
                entries[-1][0])
    try:
        return _entries_table(ledger_id, entries, partition, uncompressed_bytes_max, text_opaque)
    except _InvalidText as exc:      # not expected: those entries' text columns are checked
        raise TierFormatError(f"ledger {ledger_id} entries {sorted(exc.entry_ids)}: text fields "
                              "do not convert") from None


def _entries_table(ledger_id: int, entries: Iterable[tuple[int, bytes | memoryview]],
                   partition: int, uncompressed_bytes_max: int,
                   text_opaque: frozenset[int]) -> pa.Table:
    """entries_to_table's table, the entries ``text_opaque`` kept opaque with their invalid text
    columns null; _InvalidText when text columns do not convert."""
    # per-entry facts repeated per message, and all messages in one flat list; the columns
    # are then built with C-level map/itemgetter passes (no per-row Python statements)
    entry_ids: list[int] = []
    batch_size: list[int] = []
    publish_time: list[int] = []
    producer_names: list[str] = []
    schema_versions: list[bytes | None] = []
    entry_headers: list[bytes | None] = []
    message_headers: list = []
    message_header_lengths: list[int] = []
    msgs: list = []
    last_entry_id = -1
    undecodable: list[int] = []            # entries kept opaque because they do not decode

    for entry_id, entry in entries:
        if entry_id <= last_entry_id:
            raise TierFormatError(f"ledger {ledger_id}: entry ids not increasing "
                                  f"({last_entry_id} then {entry_id})")
        last_entry_id = entry_id
        failure = None
        verbatim = entry_id in text_opaque
        if not verbatim:
            try:
                metadata, messages = unpack_entry(entry, uncompressed_bytes_max=uncompressed_bytes_max)
                if not messages:
                    raise EntryFormatError("a batch of 0 messages")
                raw = metadata.raw
                # a compressed chunk of a chunked message is a fragment of the compressed whole:
                # kept as it is stored (an opaque row), never with its compression cleared
                verbatim = raw.num_chunks_from_msg > 1 and raw.compression != pb.NONE
            except EntryFormatError as exc:
                failure = exc
        if failure is not None or verbatim:
            opaque = _opaque(entry)
            if opaque is None:
                raise TierFormatError(f"ledger {ledger_id} entry {entry_id}: {failure}") from None
            if failure is not None and not opaque[0].encrypted:
                undecodable.append(entry_id)
                if len(undecodable) == 1:
                    log.warning("ledger %d entry %d kept opaque in the tier (its payload does not decode: %s)",
                                ledger_id, entry_id, failure)
            metadata, message = opaque
            raw = metadata.raw
            producer_name = raw.producer_name
            if entry_id in text_opaque:
                # the bytes are in entry_header; a column takes valid text only (a null, or
                # for the required producer name, replacement characters)
                if not _is_text(producer_name):
                    producer_name = (producer_name if type(producer_name) is bytes
                                     else producer_name.encode("utf-8", "surrogatepass")
                                     ).decode("utf-8", "replace")
                if message.key is not None and not _is_text(message.key):
                    message = message._replace(key=None)
                if not all(_is_text(k) and _is_text(v) for k, v in message.properties.items()):
                    message = message._replace(properties=None)
            entry_headers.append(bytes(entry[:metadata.payload_offset]))
            message_headers.append(b"")
            message_header_lengths.append(0)
            batch_size.append(0)
            entry_ids.append(entry_id)
            publish_time.append(raw.publish_time)
            producer_names.append(producer_name)
            schema_versions.append(raw.schema_version if raw.HasField("schema_version")
                                   else None)
            msgs.append(message)
            continue
        raw = metadata.raw
        header = uncompressed_entry_header(entry, metadata)
        n = len(messages)
        if n == 0:
            raise TierFormatError(f"ledger {ledger_id} entry {entry_id}: a batch of 0 messages")
        entry_headers.append(header)
        if raw.HasField("num_messages_in_batch"):
            data = _batch_buffer(entry, messages, raw, uncompressed_bytes_max)
            # each message's SingleMessageMetadata bytes verbatim (unpack_entry validated
            # the framing)
            headers = batch_message_headers(data, messages)
            if headers is None:
                raise TierFormatError(f"ledger {ledger_id} entry {entry_id}: batch framing "
                                      "does not match its messages")
            message_headers.extend(headers)
            message_header_lengths.extend(map(len, headers))
            if n > 1:
                entry_headers.extend([None] * (n - 1))
            batch_size.extend([n] * n)
            entry_ids.extend([entry_id] * n)
            publish_time.extend([raw.publish_time] * n)
            producer_names.extend([raw.producer_name] * n)
            schema_versions.extend(
                [raw.schema_version if raw.HasField("schema_version") else None] * n)
            msgs.extend(messages)
        else:
            message_headers.append(b"")
            message_header_lengths.append(0)
            batch_size.append(0)
            entry_ids.append(entry_id)
            publish_time.append(raw.publish_time)
            producer_names.append(raw.producer_name)
            schema_versions.append(raw.schema_version if raw.HasField("schema_version")
                                   else None)
            msgs.append(messages[0])

    try:
        rows = len(msgs)
        values = list(map(_PAYLOAD, msgs))
        props = list(map(_PROPERTIES, msgs))
        mask = None
        if text_opaque and None in props:         # opaque rows with invalid properties: null
            mask = pa.array([p is None for p in props], pa.bool_())
            props = [_NO_PROPERTIES if p is None else p for p in props]
        prop_offsets = [0]
        prop_offsets.extend(accumulate(map(len, props)))
        properties = pa.MapArray.from_arrays(
            _int_array(prop_offsets, "i", pa.int32()),
            pa.array(list(chain.from_iterable(props)), pa.string()),
            pa.array(list(chain.from_iterable(map(_VALUES, props))), pa.string()),
            type=_PROPERTIES_TYPE, mask=mask)
        columns = [
            pa.repeat(pa.scalar(ledger_id, pa.int64()), rows),
            _int_array(entry_ids, "q", pa.int64()),
            _int_array(list(map(_BATCH_INDEX, msgs)), "i", pa.int32()),
            _int_array(batch_size, "i", pa.int32()),
            pa.repeat(pa.scalar(partition, pa.int32()), rows),
            _int_array(publish_time, "q", pa.int64()).cast(_TS),
            pa.array(list(map(_EVENT_TIME, msgs)), pa.int64()).cast(_TS),
            pa.array(list(map(_KEY, msgs)), pa.string()),
            pa.array(list(map(_ORDERING_KEY, msgs)), pa.binary()),
            properties,
            pa.array(producer_names, pa.string()),
            _int_array(list(map(_SEQUENCE_ID, msgs)), "q", pa.int64()),
            pa.array(schema_versions, pa.binary()),
            _binary_from_parts(values, list(map(len, values))),
            pa.array(list(map(_NULL_VALUE, msgs)), pa.bool_()),
            pa.array(entry_headers, pa.binary()),
            _binary_from_parts(message_headers, message_header_lengths),
        ]
        return pa.Table.from_arrays(columns, schema=ROW_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError, UnicodeError) as exc:
        # a text field that is not UTF-8 (the broker stores what producers send): only now
        # are the entries checked one by one; they are then kept opaque
        bad = _text_opaque_ids(entry_ids, msgs, producer_names) - text_opaque
        if bad:
            raise _InvalidText(bad) from None
        raise TierFormatError(f"ledger {ledger_id} entries {entry_ids[0]}-{entry_ids[-1]}: a field "
                              f"does not convert: {exc}") from None


# ---------------------------------------------------------------------------------------------
# entries -> table, fast: batches of plain messages without a Python object per message
# ---------------------------------------------------------------------------------------------

FAST_MISSES_MAX = 16       # entries_to_table_fast: general-path entries in a row before it stops trying


def entries_to_table_fast(ledger_id: int, entries: Iterable[tuple[int, bytes | memoryview]], *,
                          partition: int,
                          uncompressed_bytes_max: int = ENTRY_UNCOMPRESSED_BYTES_MAX) -> pa.Table:
    """What :func:`entries_to_table` returns for the same entries (equal tables: same columns,
    types and values), faster: a batch of plain messages (a payload, consecutive sequence ids
    as a producer writes them, perhaps a key on every message) is decoded with Arrow takes
    over the decompressed batch, no Python object per message. Any other entry goes through
    :func:`entries_to_table` itself, as do its errors. After ``FAST_MISSES_MAX`` entries in a
    row that the fast path could not take (an unbatched topic: each would be parsed twice),
    the rest go straight to the general path."""
    if ledger_id < 0:
        raise ValueError(f"ledger id {ledger_id} < 0")
    pieces: list[pa.Table] = []
    slow: list[tuple[int, bytes | memoryview]] = []
    fast: list[tuple] = []
    last_entry_id = -1
    misses = 0
    for entry_id, entry in entries:
        if entry_id <= last_entry_id:
            raise TierFormatError(f"ledger {ledger_id}: entry ids not increasing "
                                  f"({last_entry_id} then {entry_id})")
        last_entry_id = entry_id
        decoded = _fast_entry(entry, uncompressed_bytes_max) if misses < FAST_MISSES_MAX else None
        if decoded is None:
            misses += 1
            if fast:
                pieces.append(_fast_table(ledger_id, partition, fast))
                fast = []
            slow.append((entry_id, entry))
        else:
            misses = 0
            if slow:
                pieces.append(entries_to_table(ledger_id, slow, partition=partition,
                                               uncompressed_bytes_max=uncompressed_bytes_max))
                slow = []
            fast.append((entry_id, *decoded))
    if slow:
        pieces.append(entries_to_table(ledger_id, slow, partition=partition,
                                       uncompressed_bytes_max=uncompressed_bytes_max))
    if fast:
        pieces.append(_fast_table(ledger_id, partition, fast))
    if not pieces:
        return entries_to_table(ledger_id, (), partition=partition)
    return pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces)


def _fast_entry(entry: bytes | memoryview,
                uncompressed_bytes_max: int = ENTRY_UNCOMPRESSED_BYTES_MAX):
    """(metadata, entry header, values, message headers, their sizes, keys or None) of a
    batched entry of plain messages, or None (not such an entry, or not decodable here: the general path
    decides)."""
    try:
        metadata, payload = split_entry(entry)
    except EntryFormatError:
        return None
    raw = metadata.raw
    if not raw.HasField("num_messages_in_batch") or raw.encryption_keys \
            or type(raw.producer_name) is not str:      # bytes: not UTF-8 (the general path)
        return None
    compression = raw.compression
    if compression == pb.NONE:
        if not raw.HasField("compression") and has_unknown_fields(raw):
            return None
        data = bytes(payload)
    else:
        try:
            data = decompress(payload, compression, raw.uncompressed_size,
                              uncompressed_bytes_max=uncompressed_bytes_max)
        except EntryFormatError:
            return None
        data = data if type(data) is bytes else bytes(data)
    decoded = plain_batch_columns(data, raw.num_messages_in_batch, raw.sequence_id)
    if decoded is None:
        return None
    return (raw, uncompressed_entry_header(entry, metadata)) + tuple(decoded)


_ARANGE = array("q")      # 0, 1, 2, ...: row positions, grown on demand and shared


def _arange(rows: int) -> pa.Array:
    global _ARANGE
    if len(_ARANGE) < rows:
        _ARANGE = array("q", range(max(rows, 2 * len(_ARANGE))))
    return pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(_ARANGE)])


def _per_row(run_ends: pa.Array, values: list, arrow_type: pa.DataType) -> pa.Array:
    """One value per entry, repeated over the entry's rows (run-end decoding, in C)."""
    return pc.run_end_decode(pa.RunEndEncodedArray.from_arrays(run_ends,
                                                               pa.array(values, arrow_type)))


def _fast_table(ledger_id: int, partition: int, decoded: list[tuple]) -> pa.Table:
    """ROW_SCHEMA rows of decoded plain batches: (entry id, raw metadata, entry header,
    values, message headers, values' bytes, headers' bytes, keys or None) each. Python runs once per entry;
    the per-row columns are built by Arrow (run-end decoding, arithmetic, takes)."""
    for i in (5, 6):
        total = sum(d[i] for d in decoded)
        if total >= 2**31:
            raise TierFormatError(f"{total} bytes in one column (split the ledger)")
    counts = [len(d[3]) for d in decoded]
    ends = list(accumulate(counts))
    starts = [end - n for end, n in zip(ends, counts)]
    rows = ends[-1]
    run_ends = pa.array(ends, pa.int64())
    raws = [d[1] for d in decoded]
    row = _arange(rows)
    start_of_row = _per_row(run_ends, starts, pa.int64())
    # the entry header on each entry's first row, null on the others: a take whose indices are
    # valid only at those rows
    first_rows = bytearray((rows + 7) // 8)
    header_index = array("i", bytes(4 * rows))
    for k, start in enumerate(starts):
        first_rows[start >> 3] |= 1 << (start & 7)
        header_index[start] = k
    header_rows = pa.Array.from_buffers(pa.int32(), rows, [pa.py_buffer(first_rows),
                                                            pa.py_buffer(header_index)])
    empty = pa.array([], pa.string())
    columns = [
        pa.repeat(pa.scalar(ledger_id, pa.int64()), rows),
        _per_row(run_ends, [d[0] for d in decoded], pa.int64()),
        pc.subtract(row, start_of_row).cast(pa.int32()),
        _per_row(run_ends, counts, pa.int32()),
        pa.repeat(pa.scalar(partition, pa.int32()), rows),
        _per_row(run_ends, [r.publish_time for r in raws], pa.int64()).cast(_TS),
        pa.nulls(rows, pa.int64()).cast(_TS),
        _fast_keys(decoded, counts, rows),
        pa.nulls(rows, pa.binary()),
        pa.MapArray.from_arrays(pa.repeat(pa.scalar(0, pa.int32()), rows + 1), empty, empty,
                                type=_PROPERTIES_TYPE),
        _per_row(run_ends, [r.producer_name for r in raws], pa.string()),
        pc.add(pc.subtract(row, start_of_row),
               _per_row(run_ends, [r.sequence_id for r in raws], pa.int64())),
        _per_row(run_ends, [r.schema_version if r.HasField("schema_version") else None
                            for r in raws], pa.binary()),
        pa.concat_arrays([d[3] for d in decoded]),
        pa.repeat(pa.scalar(False, pa.bool_()), rows),
        pa.array([d[2] for d in decoded], pa.binary()).take(header_rows),
        pa.concat_arrays([d[4] for d in decoded]),
    ]
    return pa.Table.from_arrays(columns, schema=ROW_SCHEMA)


def _fast_keys(decoded: list[tuple], counts: list[int], rows: int) -> pa.Array:
    """The key column of decoded batches: each batch's keys, or nulls for a batch without."""
    if all(d[7] is None for d in decoded):
        return pa.nulls(rows, pa.string())
    return pa.concat_arrays([pa.nulls(n, pa.string()) if d[7] is None else d[7]
                             for d, n in zip(decoded, counts)])


# ---------------------------------------------------------------------------------------------
# a ledger's entries -> tables of about one row group each
# ---------------------------------------------------------------------------------------------

ROW_BYTES_OVERHEAD = 16      # what a row counts for beside its value, in row group sizes


def decoded_bytes(entry: bytes | memoryview, *,
                  uncompressed_bytes_max: int = ENTRY_UNCOMPRESSED_BYTES_MAX) -> int:
    """At least what the entry's rows will count for in row group sizes, known from its
    metadata alone (nothing decompressed): its payload's declared uncompressed size, plus
    ROW_BYTES_OVERHEAD a message. A payload declaring more than ``uncompressed_bytes_max``
    (kept as one opaque row) or metadata that does not parse counts its stored bytes. (An
    encrypted entry, one opaque row too, may count more than its row: never less.)"""
    size = len(entry)
    # the metadata parsed alone (split_entry's checks of required fields cost as much again)
    metadata = parse_metadata_unchecked(entry)
    if metadata is None:
        return size + ROW_BYTES_OVERHEAD
    raw = metadata.raw
    size -= metadata.payload_offset
    if raw.compression and raw.uncompressed_size <= uncompressed_bytes_max:
        size = raw.uncompressed_size
    return size + ROW_BYTES_OVERHEAD * max(1, raw.num_messages_in_batch)


def ledger_tables(ledger_id: int, entries: Iterable[tuple[int, bytes | memoryview]], *,
                  partition: int, decoded_bytes_max: int,
                  uncompressed_bytes_max: int = ENTRY_UNCOMPRESSED_BYTES_MAX) -> Iterator[pa.Table]:
    """A ledger's entries as ROW_SCHEMA tables (``entries_to_table_fast``) of consecutive whole
    entries, each ending with the entry that takes it to ``decoded_bytes_max`` decoded bytes
    (``decoded_bytes``), as a row group ends: at most that plus one entry, so that memory holds
    about one row group's rows, never the ledger's ([hardening]: 240 entries of 5 KB stored,
    5 MiB each decoded, made one 1.3 GB table and a 3.9 GB broker). Feed them to one
    ParquetStreamWriter: its row groups are those of the whole ledger's table (and where the
    estimate is exact, plain messages, each table is one row group)."""
    if decoded_bytes_max <= 0:
        raise ValueError(f"decoded_bytes_max {decoded_bytes_max} <= 0")
    run: list[tuple[int, bytes | memoryview]] = []
    run_bytes = 0
    for entry_id, entry in entries:
        run.append((entry_id, entry))
        run_bytes += decoded_bytes(entry, uncompressed_bytes_max=uncompressed_bytes_max)
        if run_bytes >= decoded_bytes_max:
            yield entries_to_table_fast(ledger_id, run, partition=partition,
                                        uncompressed_bytes_max=uncompressed_bytes_max)
            run, run_bytes = [], 0
    if run:
        yield entries_to_table_fast(ledger_id, run, partition=partition,
                                    uncompressed_bytes_max=uncompressed_bytes_max)


# ---------------------------------------------------------------------------------------------
# table -> entries
# ---------------------------------------------------------------------------------------------

def _check_rebuild_columns(table: pa.Table | pa.RecordBatch) -> None:
    missing = [c for c in REBUILD_COLUMNS if c not in table.schema.names]
    if missing:
        raise TierFormatError(f"table lacks the columns {missing} needed to rebuild entries")


def table_to_entries(table: pa.Table | pa.RecordBatch) -> Iterator[tuple[int, bytes]]:
    """One rebuilt entry per original entry id, in row order (see the module docstring).
    Work per row is vectorized (Arrow compute); Python runs once per entry. Raises
    TierFormatError when the rows do not form whole entries in increasing id order."""
    _check_rebuild_columns(table)
    batches = table.to_batches() if isinstance(table, pa.Table) else [table]
    carry_id = -1            # the previous row's entry id / batch index / batch size
    carry_index = -2
    carry_size = -1
    pending: list[bytes] = []   # rows of an entry that continue in the next batch
    for batch in batches:
        rows = batch.num_rows
        if rows == 0:
            continue
        eid = batch.column("entry_id")
        bi = batch.column("batch_index")
        bs = batch.column("batch_size")
        headers = batch.column("entry_header")
        value = batch.column("value")
        message_header = batch.column("message_header")
        if eid.null_count or bi.null_count or bs.null_count or value.null_count \
                or message_header.null_count:
            raise TierFormatError("null entry_id, batch_index, batch_size, value or "
                                  "message_header")
        prev_eid = pa.concat_arrays([pa.array([carry_id], pa.int64()), eid.slice(0, rows - 1)])
        prev_bi = pa.concat_arrays([pa.array([carry_index], pa.int32()), bi.slice(0, rows - 1)])
        prev_bs = pa.concat_arrays([pa.array([carry_size], pa.int32()), bs.slice(0, rows - 1)])
        same = pc.equal(eid, prev_eid)
        is_start = pc.invert(same)
        starts_ok = pc.or_(same, pc.or_(
            pc.and_(pc.equal(bi, -1), pc.equal(bs, 0)),
            pc.and_(pc.equal(bi, 0), pc.greater(bs, 0))))
        continuation_ok = pc.or_(is_start, pc.and_(
            pc.equal(bi, pc.add(prev_bi, 1)), pc.equal(bs, prev_bs)))
        order_ok = pc.or_(same, pc.greater(eid, prev_eid))
        header_ok = pc.equal(headers.is_valid(), is_start)
        ok = pc.all(pc.and_(pc.and_(starts_ok, continuation_ok), pc.and_(order_ok, header_ok)))
        if not ok.as_py():
            raise TierFormatError("rows do not form whole entries in increasing entry id order "
                                  "(batch indexes, batch sizes or entry headers out of place)")
        whole = pc.binary_join_element_wise(pc.fill_null(headers, b""), message_header, value,
                                            b"")
        if whole.type != pa.binary():
            whole = whole.cast(pa.binary())
        offsets = memoryview(whole.buffers()[1]).cast("i")[whole.offset:whole.offset + rows + 1]
        data = whole.buffers()[2]
        data_view = memoryview(data) if data is not None else memoryview(b"")
        starts = pc.indices_nonzero(is_start).to_pylist()
        bi_view = _ints(bi)
        bs_view = _ints(bs)
        eid_view = _ints(eid)
        if pending:
            end = starts[0] if starts else rows
            pending.append(bytes(data_view[offsets[0]:offsets[end]]))
            if end == rows and bi_view[rows - 1] != bs_view[rows - 1] - 1:
                carry_id, carry_index, carry_size = (eid_view[rows - 1], bi_view[rows - 1],
                                                     bs_view[rows - 1])
                continue
            if bi_view[end - 1] != bs_view[end - 1] - 1:
                raise TierFormatError(f"entry {eid_view[end - 1]}: rows missing")
            yield eid_view[end - 1], b"".join(pending)
            pending = []
        ends = starts[1:] + [rows]
        for start, end in zip(starts, ends):
            last = end - 1
            if bi_view[last] != bs_view[last] - 1:
                if end == rows:
                    pending = [bytes(data_view[offsets[start]:offsets[end]])]
                    break
                raise TierFormatError(f"entry {eid_view[start]}: {end - start} rows, batch size "
                                      f"{bs_view[start]}")
            yield eid_view[start], bytes(data_view[offsets[start]:offsets[end]])
        carry_id, carry_index, carry_size = eid_view[rows - 1], bi_view[rows - 1], bs_view[rows - 1]
    if pending:
        raise TierFormatError(f"entry {carry_id}: rows missing at the end of the table")


def summarize_table(table: pa.Table) -> TableSummary:
    rows = table.num_rows
    if rows == 0:
        return TableSummary(0, 0, None, None)
    lo, hi = pc.min_max(table.column("publish_time").cast(pa.int64())).values()
    entries = pc.count_distinct(table.column("entry_id")).as_py()
    return TableSummary(rows, entries, lo.as_py(), hi.as_py())


# ---------------------------------------------------------------------------------------------
# Parquet
# ---------------------------------------------------------------------------------------------

def _row_group_cuts(table: pa.Table, row_group_bytes: int, row_group_rows_max: int, *,
                    last: bool = True) -> list[int]:
    """Row offsets where row groups end: about ``row_group_bytes`` of message bytes, at most
    ``row_group_rows_max`` rows (unless one entry has more), only at entry boundaries. With
    ``last`` False (more rows may follow) the table's end is a cut only if its group is full
    already (any next entry would start a new one)."""
    rows = table.num_rows
    if rows == 0:
        return []
    eid = table.column("entry_id").combine_chunks()
    prev = pa.concat_arrays([pa.array([-1], pa.int64()), eid.slice(0, rows - 1)])
    lid = table.column("ledger_id").combine_chunks()
    prev_lid = pa.concat_arrays([pa.array([-1], pa.int64()), lid.slice(0, rows - 1)])
    # an entry starts where the entry id or the ledger id changes (a merged object holds several ledgers)
    starts = pc.indices_nonzero(pc.or_(pc.not_equal(eid, prev), pc.not_equal(lid, prev_lid)))
    # lengths chunk by chunk, then combined (the values themselves are not copied)
    lengths = pc.binary_length(table.column("value")).combine_chunks()
    sizes = pc.add(lengths, ROW_BYTES_OVERHEAD).cast(pa.int64())
    cumulative = pc.cumulative_sum(sizes)
    before = [0] + pc.take(cumulative, pc.subtract(starts.slice(1), 1)).to_pylist()
    cuts: list[int] = []
    group_row = 0
    group_bytes = 0
    for row, row_bytes in zip(starts.to_pylist(), before):
        if row > group_row and (row_bytes - group_bytes >= row_group_bytes
                                or row - group_row >= row_group_rows_max):
            cuts.append(row)
            group_row, group_bytes = row, row_bytes
    if last or (cumulative[-1].as_py() - group_bytes >= row_group_bytes
                or rows - group_row >= row_group_rows_max):
        cuts.append(rows)
    return cuts


def _check_schema(schema: pa.Schema) -> None:
    n = len(ROW_SCHEMA)
    if len(schema) < n or any(not schema.field(i).equals(ROW_SCHEMA.field(i))
                              for i in range(n)):
        raise TierFormatError("table does not start with ROW_SCHEMA's columns")


class ParquetStreamWriter:
    """Parquet written table by table (e.g. one chunk of a ledger's entries at a time,
    ``ledger_tables``, so memory holds about one row group, not the ledger). Every table holds
    whole entries, in increasing entry id order across tables. Row groups are cut across the
    tables as ``_row_group_cuts`` cuts one table of all their rows (the rows of a row group not
    yet complete are held until the next table or ``close()``), and each is written as one
    chunk per column: the object is the one ``write_parquet`` makes of the concatenated table,
    however the rows came in. ``close(metadata)`` returns the summary and records rows/entries
    (and ``metadata``, pairs known only at the end) in the footer's key-value metadata."""

    def __init__(self, sink: str | BinaryIO | pa.NativeFile, schema: pa.Schema = ROW_SCHEMA, *,
                 row_group_bytes: int = ROW_GROUP_BYTES_DEFAULT,
                 row_group_rows_max: int = ROW_GROUP_ROWS_MAX,
                 compression: str = PARQUET_COMPRESSION_DEFAULT,
                 compression_level: int | None = PARQUET_COMPRESSION_LEVEL_DEFAULT,
                 metadata: dict[str, str] | None = None) -> None:
        _check_schema(schema)
        if row_group_bytes <= 0 or row_group_rows_max <= 0:
            raise ValueError("row group bounds must be positive")
        self.row_group_bytes = row_group_bytes
        self.row_group_rows_max = row_group_rows_max
        kv = {"pulsarlite.format_version": FORMAT_VERSION}
        if metadata:
            kv.update(metadata)
        self.schema = schema.with_metadata(kv)
        level = compression_level if compression.lower() in ("zstd", "gzip", "brotli") else None
        self._writer = pq.ParquetWriter(
            sink, self.schema, compression=compression, compression_level=level,
            write_page_checksum=True, write_statistics=STATISTICS_COLUMNS,
            use_dictionary=["producer_name", "schema_version"], store_schema=False)
        self.rows = 0
        self.entries = 0
        self.row_groups = 0
        self.min_publish_time_ms: int | None = None
        self.max_publish_time_ms: int | None = None
        self._last_entry_id = (-1, -1)     # (ledger id, entry id) of the last row written
        self._held: pa.Table | None = None      # the rows of the row group not yet complete

    def write(self, table: pa.Table) -> None:
        if not table.schema.equals(self.schema, check_metadata=False):
            raise TierFormatError("table schema differs from the writer's")
        if table.num_rows == 0:
            return
        summary = summarize_table(table)
        first = (table.column("ledger_id")[0].as_py(), table.column("entry_id")[0].as_py())
        if first <= self._last_entry_id:
            raise TierFormatError(f"entry {first} after entry {self._last_entry_id}: tables "
                                  "must hold whole entries in increasing (ledger id, entry id) order")
        self._last_entry_id = (table.column("ledger_id")[-1].as_py(), table.column("entry_id")[-1].as_py())
        rows = table if self._held is None else pa.concat_tables([self._held, table])
        start = 0
        for end in _row_group_cuts(rows, self.row_group_bytes, self.row_group_rows_max, last=False):
            self._write_group(rows.slice(start, end - start))
            start = end
        self._held = rows.slice(start) if start < rows.num_rows else None
        self.rows += summary.rows
        self.entries += summary.entries
        lo, hi = summary.min_publish_time_ms, summary.max_publish_time_ms
        self.min_publish_time_ms = lo if self.min_publish_time_ms is None \
            else min(lo, self.min_publish_time_ms)
        self.max_publish_time_ms = hi if self.max_publish_time_ms is None \
            else max(hi, self.max_publish_time_ms)

    def _write_group(self, rows: pa.Table) -> None:
        # one chunk per column: the pages are then those of one table, however the rows came
        rows = rows.combine_chunks()
        self._writer.write_table(rows, row_group_size=rows.num_rows)
        self.row_groups += 1

    def close(self, metadata: dict[str, str] | None = None) -> ParquetSummary:
        if self._held is not None and self._held.num_rows:
            self._write_group(self._held)
        self._held = None
        # the schema's metadata too: with store_schema=False pyarrow writes only these pairs
        kv = {k.decode(): v.decode() for k, v in (self.schema.metadata or {}).items()}
        self._writer.add_key_value_metadata({**kv, **(metadata or {}), "pulsarlite.rows": str(self.rows),
                                             "pulsarlite.entries": str(self.entries)})
        if self.row_groups == 0:     # an empty file still has the schema
            self._writer.write_table(self.schema.empty_table())
            self.row_groups = 1
        self._writer.close()
        return ParquetSummary(self.rows, self.entries, self.row_groups,
                              self.min_publish_time_ms, self.max_publish_time_ms)


def write_parquet(table: pa.Table, sink: str | BinaryIO | pa.NativeFile, *,
                  row_group_bytes: int = ROW_GROUP_BYTES_DEFAULT,
                  row_group_rows_max: int = ROW_GROUP_ROWS_MAX,
                  compression: str = PARQUET_COMPRESSION_DEFAULT,
                  compression_level: int | None = PARQUET_COMPRESSION_LEVEL_DEFAULT,
                  metadata: dict[str, str] | None = None) -> ParquetSummary:
    """Write ``table`` (ROW_SCHEMA's columns, then any extra columns, e.g. typed columns
    decoded from a schema) as Parquet with page checksums, statistics on the pruning columns,
    and row groups of whole entries of about ``row_group_bytes``."""
    _check_schema(table.schema)
    writer = ParquetStreamWriter(sink, table.schema, row_group_bytes=row_group_bytes,
                                 row_group_rows_max=row_group_rows_max,
                                 compression=compression, compression_level=compression_level,
                                 metadata=metadata)
    try:
        writer.write(table)
    finally:
        summary = writer.close()
    return summary


def _wrap_read_error(exc: Exception, what: str) -> PulsarliteError:
    text = str(exc)
    if "checksum" in text.lower() or "crc" in text.lower():
        return TierChecksumError(f"{what}: {text}")
    return TierFormatError(f"{what}: {text}")


def open_parquet(source: Any, *, what: str = "tier object",
                 read_dictionary: Sequence[str] | None = None) -> pq.ParquetFile:
    """A ParquetFile that verifies page checksums on every page it reads; TierFormatError if
    ``source`` is not Parquet of this format. ``read_dictionary``: columns to read as Arrow
    dictionary arrays (e.g. ``producer_name``, dictionary-encoded in the file: no per-row
    string copy; the caller decodes)."""
    try:
        pf = pq.ParquetFile(source, page_checksum_verification=True,
                            read_dictionary=list(read_dictionary) if read_dictionary else None)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise _wrap_read_error(exc, what) from None
    names = pf.schema_arrow.names
    if names[:len(ROW_SCHEMA.names)] != ROW_SCHEMA.names:
        raise TierFormatError(f"{what}: columns {names} are not the tier format's")
    return pf


def read_row_groups(pf: pq.ParquetFile, row_groups: Sequence[int], *,
                    columns: Sequence[str] | None = None,
                    what: str = "tier object") -> pa.Table:
    """Read (and checksum-verify) the given row groups; checksum or decode failures raise
    TierChecksumError / TierFormatError."""
    try:
        return pf.read_row_groups(list(row_groups), columns=list(columns) if columns else None)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise _wrap_read_error(exc, what) from None


def read_parquet(source: Any, *, row_groups: Sequence[int] | None = None,
                 columns: Sequence[str] | None = None) -> pa.Table:
    """The whole object (or some row groups) as a table, page checksums verified."""
    pf = open_parquet(source)
    groups = range(pf.num_row_groups) if row_groups is None else row_groups
    return read_row_groups(pf, groups, columns=columns)


def row_group_entry_ranges(pf: pq.ParquetFile) -> list[tuple[int, int]]:
    """(first entry id, last entry id) of each row group, from the footer statistics."""
    idx = pf.schema_arrow.get_field_index("entry_id")
    ranges = []
    md = pf.metadata
    for i in range(md.num_row_groups):
        stats = md.row_group(i).column(idx).statistics
        if stats is None or not stats.has_min_max:
            raise TierFormatError(f"row group {i} has no entry_id statistics")
        ranges.append((int(stats.min), int(stats.max)))
    return ranges


__all__ = [
    "CONTRACT_COLUMNS", "FORMAT_VERSION", "ParquetStreamWriter", "ParquetSummary", "REBUILD_COLUMNS", "ROW_SCHEMA",
    "ROW_GROUP_BYTES_DEFAULT", "TableSummary", "TierChecksumError", "TierFormatError", "decoded_bytes",
    "entries_to_table", "entries_to_table_fast", "ledger_tables", "open_parquet", "read_parquet", "read_row_groups",
    "row_group_entry_ranges", "summarize_table", "table_to_entries", "write_parquet",
]
