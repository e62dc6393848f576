"""The compaction core (broker/compaction/core.py): latest value per key, tombstones delete,
keyless messages dropped, batches per message, the phase machine, the recorded view, the
compacted entry codec, status and threshold."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.compaction.core import (COMPACTION_PROPERTY, CompactedView, CompactionError, CompactionRun,
                                    CompactionRunningError, CompactionStatus, KeyedMessage, Phase,
                                    StatusBoard, StatusReport, ack_set_of, backlog_after_horizon_bytes,
                                    combined_status, decode_compacted_entry, encode_compacted_entry, last_index_of,
                                    new_view_properties, should_compact)
from broker.managed_ledger import LedgerInfo, LedgerInfoState, Position
from pulsarlite.errors import InvariantViolation

P = Position


def test_latest_value_per_key_tombstone_deletes_keyless_dropped():
    run = CompactionRun(P(5, 10))
    run.on_entry(P(5, 0), [KeyedMessage(-1, "a", False)])
    run.on_entry(P(5, 1), [KeyedMessage(0, "b", False), KeyedMessage(1, "a", False), KeyedMessage(2, None, False)])
    run.on_entry(P(5, 2), [KeyedMessage(-1, "b", True)])          # tombstone for b
    run.on_entry(P(5, 3), [KeyedMessage(-1, None, False)])        # no key: dropped
    assert run.end_reading() == [(P(5, 1), [1])]
    assert run.phase is Phase.WRITING


def test_entries_past_the_horizon_are_not_taken():
    run = CompactionRun(P(5, 1))
    assert run.on_entry(P(5, 0), [KeyedMessage(-1, "a", False)])
    assert not run.on_entry(P(5, 2), [KeyedMessage(-1, "a", False)])
    assert run.end_reading() == [(P(5, 0), None)]


def test_entries_out_of_order_break_an_invariant():
    run = CompactionRun(P(9, 9))
    run.on_entry(P(5, 3), [])
    with pytest.raises(InvariantViolation):
        run.on_entry(P(5, 3), [])


def test_keys_are_bounded():
    run = CompactionRun(P(9, 9), keys_max=2)
    run.on_entry(P(1, 0), [KeyedMessage(0, "a", False), KeyedMessage(1, "b", False)])
    run.on_entry(P(1, 1), [KeyedMessage(-1, "a", False)])     # an old key: fine
    with pytest.raises(CompactionError):
        run.on_entry(P(1, 2), [KeyedMessage(-1, "c", False)])


def test_phase_machine_refuses_skips():
    run = CompactionRun(P(1, 1))
    with pytest.raises(InvariantViolation):
        run.written()                      # phase two before phase one ended
    run.end_reading()
    with pytest.raises(InvariantViolation):
        run.recorded()                     # recorded before written
    run.written()
    run.recorded()
    assert run.phase is Phase.DONE
    run.failed("late")                     # after DONE: no change
    assert run.phase is Phase.DONE and run.error == ""


messages = st.lists(st.tuples(st.sampled_from(["k1", "k2", "k3", None]), st.booleans()), min_size=0, max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(messages, min_size=0, max_size=30))
def test_property_latest_value_per_key_and_tombstones_delete(entries):
    """Against a model: replay every message in order into a dict (set on a value, delete on a
    tombstone, skip keyless); the retained ids are exactly the dict's last ids."""
    run = CompactionRun(P(1, len(entries)))
    model: dict[str, tuple[Position, int]] = {}
    for e, msgs in enumerate(entries):
        batched = len(msgs) != 1
        keyed = [KeyedMessage(i if batched else -1, k, t) for i, (k, t) in enumerate(msgs)]
        run.on_entry(P(1, e), keyed)
        for m in keyed:
            if m.key is None:
                continue
            if m.tombstone:
                model.pop(m.key, None)
            else:
                model[m.key] = (P(1, e), m.batch_index)
    want: dict[Position, list[int] | None] = {}
    for p, i in model.values():
        if i < 0:
            want[p] = None
        else:
            want.setdefault(p, []).append(i)
    assert run.end_reading() == [(p, None if v is None else sorted(v)) for p, v in sorted(want.items())]


def test_view_round_trips_through_the_property_and_rejects_garbage():
    view = CompactedView(42, P(7, 99), entries=3)
    props = new_view_properties({"other": "x"}, view)
    assert props["other"] == "x"
    assert CompactedView.from_properties(props) == view
    assert CompactedView.from_properties({}) is None
    with pytest.raises(ValueError):
        CompactedView.from_properties({COMPACTION_PROPERTY: "{\"ledger\": -3, \"horizon\": [1, 2]}"})
    with pytest.raises(ValueError):
        CompactedView.from_properties({COMPACTION_PROPERTY: "not json"})


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1),
       st.one_of(st.none(), st.lists(st.integers(0, 1000), max_size=200)), st.binary(max_size=64))
def test_compacted_entry_codec_round_trips(ledger, entry, indexes, data):
    words = None if indexes is None else ack_set_of(indexes)
    got = decode_compacted_entry(encode_compacted_entry(P(ledger, entry), words, data))
    assert got.position == P(ledger, entry)
    assert got.ack_set == (None if words is None else tuple(words))
    assert got.data == data


def test_compacted_entry_garbage_is_refused():
    with pytest.raises(ValueError):
        decode_compacted_entry(b"\x00\x01")
    with pytest.raises(ValueError):
        decode_compacted_entry(b"\xff" * 40)


def test_ack_set_bits_are_the_retained_indexes():
    assert ack_set_of([0, 2]) == [0b101]
    assert ack_set_of([64]) == [0, 1]
    assert ack_set_of([]) == []
    assert ack_set_of([63]) == [-(1 << 63)]                 # signed int64, as on the wire
    assert ack_set_of(range(64)) == [-1]
    assert last_index_of(ack_set_of([3, 64, 130])) == 130
    assert last_index_of([]) == -1


def test_status_board_refuses_a_second_run_and_reports():
    board = StatusBoard()
    assert board.report("t").status is CompactionStatus.NOT_RUN
    board.start("t")
    with pytest.raises(CompactionRunningError):
        board.start("t")
    board.finish("t", "boom")
    assert board.report("t").to_json() == {"status": "ERROR", "lastError": "boom"}
    board.start("t")
    board.finish("t", None)
    assert board.report("t").to_json() == {"status": "SUCCESS", "lastError": ""}


def test_combined_status_of_partitions():
    ok, run, err, no = (StatusReport(CompactionStatus.SUCCESS), StatusReport(CompactionStatus.RUNNING),
                        StatusReport(CompactionStatus.ERROR, "x"), StatusReport())
    assert combined_status([ok, run, err]).status is CompactionStatus.RUNNING
    assert combined_status([ok, err]) == err
    assert combined_status([ok, ok]).status is CompactionStatus.SUCCESS
    assert combined_status([ok, no]).status is CompactionStatus.NOT_RUN


def test_threshold_counts_the_backlog_after_the_horizon():
    ledgers = [LedgerInfo(1, LedgerInfoState.CLOSED, entries=10, size_bytes=1000),
               LedgerInfo(2, LedgerInfoState.OPEN, entries=4, size_bytes=400)]
    assert backlog_after_horizon_bytes(ledgers, None) == 1400
    assert backlog_after_horizon_bytes(ledgers, P(1, 4)) == 500 + 400
    assert backlog_after_horizon_bytes(ledgers, P(2, 3)) == 0
    assert should_compact(800, 900, running=False)
    assert not should_compact(800, 900, running=True)
    assert not should_compact(None, 900, running=False)
    assert not should_compact(0, 900, running=False)
    assert not should_compact(1000, 900, running=False)


def test_the_shared_codec_reads_what_the_broker_writes():
    """pulsarlite.wire.compacted is the one codec (the Spark source may not import broker/)."""
    from pulsarlite.wire.compacted import decode_compacted, encode_compacted
    raw = encode_compacted_entry(P(7, 9), ack_set_of([0, 2]), b"entry")
    assert decode_compacted(raw) == (7, 9, tuple(ack_set_of([0, 2])), b"entry")
    assert encode_compacted(7, 9, None, b"x") == encode_compacted_entry(P(7, 9), None, b"x")
