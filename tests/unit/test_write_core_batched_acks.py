"""on_add_acks (coalesced acks) must decide exactly what one on_add_result per ack decides."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from bookie.client.actions import AddOutcome, ConfirmAdds
from bookie.client.metadata import LedgerMetadata
from bookie.client.write_core import LedgerWriteCore
from test_write_core import add

BOOKIES = ("b1", "b2", "b3", "b4")


def make_core(e: int, qw: int, qa: int) -> LedgerWriteCore:
    md = LedgerMetadata(ledger_id=1, ensemble_size=e, write_quorum=qw, ack_quorum=qa,
                        ensembles=((0, BOOKIES[:e]),))
    return LedgerWriteCore(md, add_timeout_ms=10_000, ensemble_change_attempts_max=3)



@settings(max_examples=200, deadline=None)
@given(st.sampled_from([(3, 3, 2), (3, 2, 2), (4, 3, 2), (3, 3, 3)]), st.integers(1, 30), st.randoms(use_true_random=False),
       st.integers(1, 8))
def test_batched_acks_equal_single_acks(quorum, entries, rnd, batch_size):
    e, qw, qa = quorum
    single, batched = make_core(e, qw, qa), make_core(e, qw, qa)
    sends = []
    for i in range(entries):
        _, actions = add(single, b"p%d" % i, 0)
        add(batched, b"p%d" % i, 0)
        sends.extend((a.bookie, a.entry_id) for a in actions)
    rnd.shuffle(sends)
    confirmed_single, confirmed_batched = [], []
    for start in range(0, len(sends), batch_size):
        chunk = sends[start:start + batch_size]
        for bookie, entry_id in chunk:
            for a in single.on_add_result(bookie, entry_id, AddOutcome.OK, 0, [], random.Random(0)):
                if isinstance(a, ConfirmAdds):
                    confirmed_single.append(a.last_entry_id)
        by_bookie: dict[str, list[int]] = {}
        for bookie, entry_id in chunk:
            by_bookie.setdefault(bookie, []).append(entry_id)
        for bookie, ids in by_bookie.items():
            for a in batched.on_add_acks(bookie, ids):
                if isinstance(a, ConfirmAdds):
                    confirmed_batched.append(a.last_entry_id)
        assert single.lac == batched.lac
    assert single.lac == batched.lac == entries - 1
    assert confirmed_batched == sorted(set(confirmed_batched))  # LAC only moves forward
    assert confirmed_single[-1] == confirmed_batched[-1] == entries - 1
