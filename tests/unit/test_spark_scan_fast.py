"""spark_source/scan.py: the cheaper builders of output columns give what the plain casts gave."""

from __future__ import annotations

import io
import random

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_source import scan as S


def reference_message_ids(ledger_id, entry_id, batch_index, partition):
    """What to_output built before: every part cast to text and joined."""
    return pc.binary_join_element_wise(
        pc.cast(ledger_id, pa.string()), pc.cast(entry_id, pa.string()),
        pa.scalar(str(partition)), pc.cast(batch_index, pa.string()), ":")


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(0, 400), one_ledger=st.booleans(),
       partition=st.sampled_from([-1, 0, 12]), batch_max=st.sampled_from([0, 5, 2000, 70_000]))
def test_message_ids_match_the_casts(seed, rows, one_ledger, partition, batch_max):
    rng = random.Random(seed)
    ledger = [rng.choice([0, 7, 2**40]) for _ in range(rows)]
    if one_ledger and rows:
        ledger = [ledger[0]] * rows
    entries, e = [], rng.randint(0, 2**35)
    for _ in range(rows):
        if rng.random() < 0.3:
            e += rng.choice([1, 2, -3])     # runs, jumps, even out of order
        entries.append(e)
    batches = [rng.randint(-1, batch_max) for _ in range(rows)]
    arrays = (pa.array(ledger, pa.int64()), pa.array(entries, pa.int64()), pa.array(batches, pa.int32()))
    got = S.message_ids(*arrays, partition)
    assert got.equals(reference_message_ids(*arrays, partition))


def test_message_ids_of_chunked_columns():
    ledger = pa.chunked_array([[3, 3], [3]], pa.int64())
    entry = pa.chunked_array([[1, 1], [2]], pa.int64())
    batch = pa.chunked_array([[0, 1], [-1]], pa.int32())
    assert S.message_ids(ledger, entry, batch, -1).to_pylist() == ["3:1:-1:0", "3:1:-1:1", "3:2:-1:-1"]


def test_decoded_dictionary_columns():
    one = pa.array(["p", "p", "p"]).dictionary_encode()
    two = pa.array(["p", None, "q", "p"]).dictionary_encode()
    for column in (one, two, pa.chunked_array([one]), pa.array(["x", None])):
        out = S._decoded(column)
        assert out.type == pa.string()
        expected = column.to_pylist() if not isinstance(column, pa.ChunkedArray) else column.to_pylist()
        assert out.to_pylist() == expected


def test_as_array_keeps_a_single_chunk_and_joins_many():
    a = pa.array([1, 2, 3])
    assert S._as_array(pa.chunked_array([a])) is not None
    assert S._as_array(pa.chunked_array([a])).equals(a)
    assert S._as_array(pa.chunked_array([a, a])).to_pylist() == [1, 2, 3, 1, 2, 3]
    assert S._as_array(pa.chunked_array([], pa.int64())).to_pylist() == []
    assert S._as_array(a) is a


@pytest.mark.parametrize("values,expected", [([5, 5, 5], 5), ([5, 6], None), ([None, 5], None)])
def test_constant_int_from_statistics(values, expected):
    buf = io.BytesIO()
    pq.write_table(pa.table({"x": pa.array(values, pa.int64())}), buf)
    rg = pq.ParquetFile(io.BytesIO(buf.getvalue())).metadata.row_group(0)
    assert S._constant_int(rg, 0) == expected


def test_pack_balances_a_target_shrunk_by_min_partitions():
    from spark_source.plan import LedgerSegment, PartitionLedgers, PlanReport, ScanRequest, pack, plan_partition

    def seg(lid, last, *, size):
        return LedgerSegment(lid, True, last, size, None, None)

    def part(*ledgers):
        return PartitionLedgers("persistent://public/default/t", -1, tuple(ledgers))

    sizes = [200, 200, 200, 200, 200, 5]
    p = part(*[seg(i, 9, size=s) for i, s in enumerate(sizes, start=1)])
    scans = plan_partition(p, ScanRequest(), fail_on_data_loss=True, report=PlanReport())
    groups = pack(scans, target_bytes=10_000, open_size_bytes=5, min_partitions=2, open_cost_bytes=1)
    assert [[s.ledger_id for s in g] for g in groups] == [[1, 2, 3], [4, 5, 6]]
    # every scan once, in order
    assert [s.ledger_id for g in groups for s in g] == [1, 2, 3, 4, 5, 6]
    # a target the user gave is still a bound: nothing joins a group past it
    groups = pack(scans, target_bytes=450, open_size_bytes=5, min_partitions=1, open_cost_bytes=1)
    assert [[s.ledger_id for s in g] for g in groups] == [[1, 2], [3, 4], [5, 6]]
    # ... also when balancing a target shrunk by minPartitions would overshoot it: 10 + 100 stays
    # within the shrunk target's balance rule (60) but not within the 100 given
    bound = part(*[seg(i, 9, size=s) for i, s in enumerate([10, 100, 10], start=1)])
    scans_bound = plan_partition(bound, ScanRequest(), fail_on_data_loss=True, report=PlanReport())
    groups = pack(scans_bound, target_bytes=100, open_size_bytes=5, min_partitions=2, open_cost_bytes=1)
    assert [[s.ledger_id for s in g] for g in groups] == [[1], [2], [3]]
    uneven = part(*[seg(i, 9, size=s) for i, s in enumerate([100, 1, 1, 1, 100], start=1)])
    scans = plan_partition(uneven, ScanRequest(), fail_on_data_loss=True, report=PlanReport())
    groups = pack(scans, target_bytes=10_000, open_size_bytes=5, min_partitions=2, open_cost_bytes=1)
    assert [[s.ledger_id for s in g] for g in groups] == [[1, 2, 3], [4, 5]]
