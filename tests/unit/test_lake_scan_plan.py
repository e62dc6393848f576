"""[lakehouse] faces.lake.plan_sources: each ledger of the cut read from exactly one place."""

from __future__ import annotations

from spark_source.plan import LedgerSegment

from faces.lake import Source, plan_sources


def seg(ledger_id: int, last: int, state: str = "none", uri: str | None = None) -> LedgerSegment:
    return LedgerSegment(ledger_id=ledger_id, closed=True, last_entry_id=last, size_bytes=0,
                         min_publish_time_ms=None, max_publish_time_ms=None, offload_state=state, offload_uri=uri)


def test_each_ledger_from_one_place():
    ledgers = [seg(1, 9, "bookie-deleted", "file:///t/1.parquet"),     # in the table
               seg(2, 9, "offloaded", "file:///t/2.parquet"),          # in the table, still on bookies too
               seg(3, 9, "bookie-deleted", "file:///t/3.parquet"),     # committed late: its object
               seg(4, 9, "offloading", "file:///t/4.parquet"),         # an attempt: the bookies
               seg(5, -1),                                              # empty: nothing
               seg(6, 4)]                                               # on the bookies
    files = {"file:///t/1.parquet", "file:///t/2.parquet", "file:///t/9.parquet"}   # 9: trimmed since
    got = [(s.ledger_id, src) for s, src in plan_sources(ledgers, files)]
    assert got == [(1, Source.SNAPSHOT), (2, Source.SNAPSHOT), (3, Source.OBJECT), (4, Source.BOOKIES),
                   (6, Source.BOOKIES)]
