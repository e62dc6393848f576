"""The ledger-list document (pulsarlite/ledger_list.py): one codec for the broker, which writes
it, and the Spark source, which reads it. The expected bytes below were produced by the codec the
broker had before it moved to the base (broker/managed_ledger/store.py): the move changes no byte."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pulsarlite.ledger_list import (COMPACTION_PROPERTY, COMPACTION_PROPERTY_CHARS_MAX, CompactionRecord, LedgerInfo,
                                    LedgerInfoState, ManagedLedgerMetadata, ObjectStats, OffloadRecord, OffloadState,
                                    decode,
                                    decode_compaction, encode, encode_compaction)
from spark_source.metadata import parse_ledger_list

DOC = ManagedLedgerMetadata(
    (LedgerInfo(3, LedgerInfoState.CLOSED, 2, 10, 1700000000000, 1700000000500, 1699999999000,
                OffloadRecord(OffloadState.OFFLOADED, "s3://b/k", "abcdef12",
                              ObjectStats(2, 9, "0badf00d", 1700000000000, 1700000000500),
                              offloaded_ms=1700000000600, extra={"extra": [1]})),
     LedgerInfo(7, created_ms=1700000001000)),
    {"pulsarlite.compaction": '{"ledger": 9}'})

DOC_BYTES = (
    b'{"ledgers": [{"created_ms": 1699999999000, "entries": 2, "ledger_id": 3, "max_publish_time_ms": 1700000000500,'
    b' "min_publish_time_ms": 1700000000000, "offload": {"checksum": "0badf00d", "extra": [1],'
    b' "max_publish_time_ms": 1700000000500, "min_publish_time_ms": 1700000000000, "offloaded_ms": 1700000000600,'
    b' "rows": 2, "size_bytes": 9, "state": "offloaded", "uri": "s3://b/k", "uuid": "abcdef12"},'
    b' "size_bytes": 10, "state": "CLOSED"}, {"created_ms": 1700000001000, "entries": 0,'
    b' "ledger_id": 7, "max_publish_time_ms": null, "min_publish_time_ms": null, "offload": {"state": "none",'
    b' "uri": null}, "size_bytes": 0, "state": "OPEN"}], "properties": {"pulsarlite.compaction":'
    b' "{\\"ledger\\": 9}"}, "version": 1}')


def test_encode_gives_the_bytes_the_broker_always_wrote():
    assert encode(DOC) == DOC_BYTES
    assert decode(DOC_BYTES) == DOC


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 1000), st.integers(0, 10**6)), max_size=6),
       st.booleans(), st.sampled_from(list(OffloadState)), st.none() | st.text(max_size=8),
       st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3))
def test_round_trip(gaps, last_open, offload_state, uri, properties):
    ledgers, ledger_id = [], 0
    for i, (gap, entries, size) in enumerate(gaps):
        ledger_id += gap + 1
        is_open = last_open and i == len(gaps) - 1
        ledgers.append(LedgerInfo(
            ledger_id, LedgerInfoState.OPEN if is_open else LedgerInfoState.CLOSED, entries,
            size if entries else 0, 5 if entries else None, 9 if entries else None, created_ms=ledger_id,
            offload=_record(offload_state, uri, {"k": [ledger_id]})))
    md = ManagedLedgerMetadata(tuple(ledgers), properties)
    data = encode(md)
    assert decode(data) == md
    assert encode(decode(data)) == data          # equal lists, equal bytes


def _record(state, uri, extra):
    """A valid offload record in ``state`` (a uri, uuid and stats where the state needs them)."""
    if state is OffloadState.NONE:
        return OffloadRecord(extra=extra)
    stats = None
    if state in (OffloadState.OFFLOADED, OffloadState.BOOKIE_DELETED):
        stats = ObjectStats(3, 40, "0badf00d", None, None)
    return OffloadRecord(state, uri or "s3://b/k", "abcdef12", stats, 7 if stats else None, extra=extra)


def _doc(*ledgers, version=1):
    return json.dumps({"version": version, "ledgers": list(ledgers), "properties": {}}).encode()


def _ledger(ledger_id, state="CLOSED", entries=1, size_bytes=1, **more):
    return {"ledger_id": ledger_id, "state": state, "entries": entries, "size_bytes": size_bytes, **more}


@pytest.mark.parametrize("data, reason", [
    (b"", "Expecting value"),
    (b"[1, 2]", "JSON object expected"),
    (b"{}", "unknown format version None"),
    (_doc(version=2), "unknown format version 2"),
    (b'{"version": 1, "ledgers": {"1": 2}}', "ledgers is not a list"),
    (_doc({"ledger_id": 1}), "'state'"),
    (_doc(_ledger(1, state="SEALED")), "'SEALED' is not a valid LedgerInfoState"),
    (_doc(_ledger(2), _ledger(1)), "ledger ids not increasing"),
    (_doc(_ledger(1, state="OPEN", entries=0, size_bytes=0), _ledger(2)), "a CLOSED ledger after an OPEN one"),
    (_doc(_ledger(1, entries=-1)), "negative stats"),
    (_doc(_ledger(1, offload={"state": "lost"})), "'lost' is not a valid OffloadState"),
])
def test_a_malformed_document_is_refused_with_its_reason(data, reason):
    with pytest.raises(ValueError, match="^malformed managed ledger metadata: ") as e:
        decode(data)
    assert reason in str(e.value)


def test_the_spark_source_reads_through_the_same_codec():
    """The Spark source's reader returns the codec's type and names the topic when it refuses."""
    assert parse_ledger_list("persistent://t/ns/x", DOC_BYTES) == DOC
    with pytest.raises(ValueError, match=r"^topic persistent://t/ns/x: malformed managed ledger metadata: .*not increasing"):
        parse_ledger_list("persistent://t/ns/x", _doc(_ledger(2), _ledger(1)))


# -- the compacted view (property pulsarlite.compaction) -----------------------------------------
def test_the_compaction_property_is_the_string_the_broker_always_wrote():
    # the broker's CompactedView.to_property before the codec moved here wrote exactly this
    record = CompactionRecord(ledger_id=42, horizon_ledger_id=7, horizon_entry_id=99, entries=3)
    assert encode_compaction(record) == '{"entries": 3, "horizon": [7, 99], "ledger": 42}'
    assert decode_compaction({COMPACTION_PROPERTY: encode_compaction(record), "other": "x"}) == record
    assert decode_compaction({"other": "x"}) is None
    # "entries" absent (the first records): 0; unknown keys are ignored
    assert decode_compaction({COMPACTION_PROPERTY: '{"ledger": 9, "horizon": [2, 1], "later": true}'}) == \
        CompactionRecord(9, 2, 1, 0)


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), st.integers(0, 2**31))
def test_the_compaction_property_round_trips(ledger, horizon_ledger, horizon_entry, entries):
    record = CompactionRecord(ledger, horizon_ledger, horizon_entry, entries)
    assert decode_compaction({COMPACTION_PROPERTY: encode_compaction(record)}) == record


@pytest.mark.parametrize("raw, reason", [
    ("not json", "Expecting value"),
    ("[9, [2, 1]]", "a JSON object expected, got list"),
    ('{"horizon": [2, 1]}', "missing key 'ledger'"),
    ('{"ledger": 9}', "missing key 'horizon'"),
    ('{"ledger": 9, "horizon": [2]}', "horizon must be [ledger, entry], got [2]"),
    ('{"ledger": 9, "horizon": "2:1"}', "horizon must be [ledger, entry]"),
    ('{"ledger": -3, "horizon": [1, 2]}', "ledger_id must be an integer >= 0, got -3"),
    ('{"ledger": 9, "horizon": [1, -1]}', "horizon_entry_id must be an integer >= 0, got -1"),
    ('{"ledger": 9, "horizon": [1, 2], "entries": -1}', "entries must be an integer >= 0, got -1"),
    ('{"ledger": "9", "horizon": [1, 2]}', "ledger_id must be an integer >= 0, got '9'"),
    ('{"ledger": 9.5, "horizon": [1, 2]}', "ledger_id must be an integer >= 0, got 9.5"),
    ('{"ledger": true, "horizon": [1, 2]}', "ledger_id must be an integer >= 0, got True"),
    ('{"ledger": 9, "horizon": [1, null]}', "horizon_entry_id must be an integer >= 0, got None"),
    ("x" * (COMPACTION_PROPERTY_CHARS_MAX + 1), f"longer than {COMPACTION_PROPERTY_CHARS_MAX} characters"),
])
def test_a_malformed_compaction_property_is_refused_with_its_reason(raw, reason):
    with pytest.raises(ValueError) as info:
        decode_compaction({COMPACTION_PROPERTY: raw})
    message = str(info.value)
    assert message.startswith(f"malformed {COMPACTION_PROPERTY} property ") and reason in message, message
    assert len(message) < 400      # the value is echoed cut short, never whole


def test_the_broker_and_the_spark_source_read_the_view_through_the_one_codec():
    from broker.compaction import CompactedView
    from broker.managed_ledger import Position
    from spark_source.metadata import parse_compacted_view
    view = CompactedView(42, Position(7, 99), entries=3)
    assert view.to_property() == encode_compaction(CompactionRecord(42, 7, 99, 3))
    for raw in ('{"ledger": "9", "horizon": [1, 2]}', '{"ledger": 9}', "not json"):
        props = {COMPACTION_PROPERTY: raw}
        with pytest.raises(ValueError) as broker_error:
            CompactedView.from_properties(props)
        with pytest.raises(ValueError) as spark_error:
            parse_compacted_view("persistent://t/ns/x", props)
        assert str(spark_error.value) == f"topic persistent://t/ns/x: {broker_error.value}"

