"""[compat] issue 32 item 13, the cursor core: a cumulative ack inside a batch (a wire ack_set,
as the official clients send it with batch-index acks) keeps the rest of the batch, as Pulsar's
mark-delete with an ack set (ManagedCursorImpl.asyncMarkDelete)."""

from __future__ import annotations

import pytest

from broker.cursor.core import CursorState, InvalidAckError, indexes_to_ack_set
from broker.managed_ledger.core import Position as P


def cursor() -> CursorState:
    return CursorState(P(1, -1), ledgers=[(1, 100), (2, 0)])   # ledger 1 closed at 100 entries


def test_cumulative_ack_set_stops_inside_the_batch():
    c = cursor()
    words = indexes_to_ack_set(range(5), 10)          # 0..4 acked, 5..9 still set
    assert c.ack_cumulative(P(1, 3), ack_set=words, batch_size=10)
    assert c.mark_delete == P(1, 2)                   # the entry before the batch
    assert not c.is_acked(P(1, 3))
    assert c.remaining_batch_indexes(P(1, 3), 10) == {5, 6, 7, 8, 9}
    assert c.remaining_ack_set(P(1, 3), 10) == indexes_to_ack_set(range(5), 10)
    # the same ack again changes nothing; one with the rest acks the entry and moves on
    assert not c.ack_cumulative(P(1, 3), ack_set=words, batch_size=10)
    assert c.ack_cumulative(P(1, 3), ack_set=indexes_to_ack_set(range(10), 10), batch_size=10)
    assert c.mark_delete == P(1, 3) and c.batch_acks == {}


def test_cumulative_ack_set_ands_into_an_earlier_partial_state():
    c = cursor()
    c.ack_set(P(1, 0), indexes_to_ack_set({7}, 8), 8)          # index 7 acked individually
    c.ack_cumulative(P(1, 0), ack_set=indexes_to_ack_set(range(3), 8), batch_size=8)
    assert c.mark_delete == P(1, -1)
    assert c.remaining_batch_indexes(P(1, 0), 8) == {3, 4, 5, 6}


def test_cumulative_ack_set_below_mark_delete_and_bad_input_change_nothing():
    c = cursor()
    c.ack_cumulative(P(1, 5))
    assert not c.ack_cumulative(P(1, 4), ack_set=[0b110], batch_size=3)
    assert c.mark_delete == P(1, 5) and c.batch_acks == {}
    with pytest.raises(InvalidAckError):
        c.ack_cumulative(P(1, 7), ack_set=[1], batch_index=0, batch_size=3)
    with pytest.raises(InvalidAckError):
        c.ack_cumulative(P(1, 200), ack_set=[1], batch_size=3)     # ledger 1 has 100 entries
    with pytest.raises(InvalidAckError):
        c.ack_cumulative(P(1, 7), ack_set=[1] * 2000, batch_size=3)  # more words than batch_size_max
    assert c.mark_delete == P(1, 5)
