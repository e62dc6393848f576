"""[lakehouse] Tables partitioned by day(publish_time), end to end: real ZooKeeper, bookies and a
broker (``lake_enabled``, ``lake_partition`` "day" by default, file:// tier, the embedded SQLite
catalog); pyiceberg reads the table from its metadata file.

Publish time is the producer's clock. The producer here is pulsarlite's own client, whose clock
(``pulsarlite.client.producer.time.time``) the test sets: the messages are published at faked times
on three consecutive UTC days (in the future, so no time-based policy touches them).

1. The broker rolls its ledger over at each UTC midnight of publish time (and not otherwise: the
   entry limit is far away), every offloaded object lies inside one day, the table's spec is
   day(publish_time), each file's partition value is its day, and a pyiceberg scan filtered to one
   day plans only that day's file and returns exactly that day's messages.
2. A producer whose clock runs behind (a publish time of the day before, after the ledger of the
   next day started) makes a ledger that spans two days. Offloaded, it cannot go into a day
   partition (``add_files`` refuses it); the table's spec becomes unpartitioned and every row of
   every offloaded ledger is still in the table (none left out).
"""

from __future__ import annotations

import datetime as dt
import time
import types

import pytest

from tests.integration.test_offload_broker import (broker_overrides, http, internal_stats, keep_everything,
                                                   topic_url, wait_bookie_deleted)
from tests.integration.helpers import wait_for

pytest.importorskip("pyiceberg")

pytestmark = pytest.mark.integration

LOCAL = "days"
TOPIC = f"persistent://public/default/{LOCAL}"
DAY_MS = 86_400_000


class FakeClock:
    """What the producer's client reads as wall-clock time (seconds); monotonic stays real."""

    def __init__(self) -> None:
        self.now_ms = 0

    def module(self):
        return types.SimpleNamespace(time=lambda: self.now_ms / 1000, monotonic=time.monotonic,
                                     perf_counter=time.perf_counter, sleep=time.sleep)


def send_at(producer, clock: FakeClock, at_ms: list[int], tag: str) -> list[str]:
    sent = []
    for i, t in enumerate(at_ms):
        clock.now_ms = t
        body = f"{tag}-{i}"
        producer.send(body.encode())
        sent.append(body)
    return sent


def offload_closed(admin_url: str) -> dict[int, dict]:
    """Offload every ledger before the current one; wait until they left the bookies (and hence
    were committed to the table by that pass or are repaired by the next)."""
    ledgers = internal_stats(admin_url, LOCAL)["ledgers"]
    current = ledgers[-1]["ledgerId"]
    code, body = http("PUT", topic_url(admin_url, LOCAL) + "/offload", {"ledgerId": current, "entryId": 0})
    assert code == 204, body
    ids = [i["ledgerId"] for i in ledgers if i["ledgerId"] < current and i["entries"] > 0]
    return {i["ledgerId"]: i for i in wait_bookie_deleted(admin_url, LOCAL, ids)}


def lake_table(admin_url: str, files: set[str]):
    """The table (StaticTable) once its files are exactly ``files``."""
    from pyiceberg.table import StaticTable

    def committed():
        code, info = http("GET", topic_url(admin_url, LOCAL) + "/lake")
        assert code == 200, info
        if not info["metadata_location"]:
            return None
        table = StaticTable.from_metadata(info["metadata_location"])
        have = {t.file.file_path for t in table.scan().plan_files()}
        return table if have == files else None

    return wait_for(committed, 120, f"table files = {sorted(files)}", interval_s=0.3)


def test_day_partitioned_table_and_a_ledger_that_spans_days(cluster_factory, tmp_path, monkeypatch):
    import pulsarlite
    import pulsarlite.client.producer as producer_module
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

    clock = FakeClock()
    monkeypatch.setattr(producer_module, "time", clock.module())
    tier_dir = tmp_path / "tier"
    tier_dir.mkdir()
    overrides = broker_overrides(f"file://{tier_dir}", lake_enabled=True, rollover_entries_max=10_000)
    cluster = cluster_factory(3, brokers=1, broker_overrides=overrides)
    keep_everything(cluster.admin_url)
    day0 = (int(time.time() * 1000) // DAY_MS + 30) * DAY_MS          # midnight UTC, 30 days ahead
    client = pulsarlite.Client(cluster.service_url)
    try:
        producer = client.create_producer(TOPIC, batching_enabled=False)
        by_day = {
            0: send_at(producer, clock, [day0 + DAY_MS - 3_000 + i for i in range(5)], "d0"),
            1: send_at(producer, clock, [day0 + DAY_MS + i * 60_000 for i in range(7)], "d1"),
            2: send_at(producer, clock, [day0 + 2 * DAY_MS + 10 + i for i in range(4)], "d2"),
        }

        # -- 1. one ledger per day, each object in one day partition ------------------------------
        stats = internal_stats(cluster.admin_url, LOCAL)["ledgers"]
        assert [i["entries"] for i in stats] == [5, 7, 4]           # rolled exactly at the two midnights
        offloaded = offload_closed(cluster.admin_url)                 # days 0 and 1 (day 2 is current)
        assert len(offloaded) == 2
        table = lake_table(cluster.admin_url, {i["offloadUri"] for i in offloaded.values()})
        assert [(f.name, str(f.transform)) for f in table.spec().fields] == [("publish_time_day", "day")]
        day_of_file = {t.file.file_path: t.file.partition[0] for t in table.scan().plan_files()}
        epoch_day0 = day0 // DAY_MS
        assert sorted(day_of_file.values()) == [epoch_day0, epoch_day0 + 1]

        start = dt.datetime.fromtimestamp((day0 + DAY_MS) / 1000, dt.timezone.utc)
        one_day = And(GreaterThanOrEqual("publish_time", start.isoformat()),
                      LessThan("publish_time", (start + dt.timedelta(days=1)).isoformat()))
        planned = list(table.scan(row_filter=one_day).plan_files())
        assert [t.file.partition[0] for t in planned] == [epoch_day0 + 1]   # the other day's file pruned
        rows = table.scan(row_filter=one_day, selected_fields=("value",)).to_arrow()
        assert sorted(v.decode() for v in rows.column("value").to_pylist()) == sorted(by_day[1])

        # -- 2. a late producer clock: a ledger across two days ---------------------------------
        late = send_at(producer, clock, [day0 + 2 * DAY_MS - 1_000], "late")   # day 1, in day 2's ledger
        more = send_at(producer, clock, [day0 + 2 * DAY_MS + 500], "d2b")
        send_at(producer, clock, [day0 + 3 * DAY_MS + 1], "d3")              # rolls day 2's ledger over
        offloaded = offload_closed(cluster.admin_url)
        assert len(offloaded) == 3
        spanning = max(offloaded)
        assert offloaded[spanning]["entries"] == 4 + len(late) + len(more)
        table = lake_table(cluster.admin_url, {i["offloadUri"] for i in offloaded.values()})
        assert tuple(table.spec().fields) == ()                      # unpartitioned from now on
        values = table.scan(selected_fields=("value",)).to_arrow().column("value").to_pylist()
        assert sorted(v.decode() for v in values) == sorted(by_day[0] + by_day[1] + by_day[2] + late + more)
        # the time filter still prunes: the files added under the day spec by their partition,
        # the spanning one by its publish_time statistics (day 0 is in no other file)
        start0 = dt.datetime.fromtimestamp(day0 / 1000, dt.timezone.utc)
        day_zero = And(GreaterThanOrEqual("publish_time", start0.isoformat()),
                       LessThan("publish_time", (start0 + dt.timedelta(days=1)).isoformat()))
        assert len(list(table.scan(row_filter=day_zero).plan_files())) == 1
        producer.close()
    finally:
        client.close()
