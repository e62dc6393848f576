"""[lakehouse] Small files merged (offload/lake_merge.py): names, the planner, the table sync with
merged files (a property test over offload / merge / retention / crash sequences), and the
rewrite + commit + sweep against a real pyiceberg table on a file:// tier."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from offload.lake import plan_table_sync
from offload.lake_merge import (DAY_MS, LedgerObject, MergedName, ledger_day, merged_file_ledgers, merged_object_uri,
                                merged_objects_to_delete, parse_merged_name, plan_merge, table_layout)

P = "file:///tier/t/ns/x/"


def own(lid: int) -> str:
    return f"{P}ledger-{lid}-{'ab' * 8}.parquet"


def merged(ids, u="cd" * 8) -> str:
    return merged_object_uri(P, list(ids), u)


# -- names ----------------------------------------------------------------------------------------
@given(st.integers(0, 2 ** 40), st.integers(0, 1000), st.integers(1, 1000))
def test_merged_names_round_trip(first, extra, count):
    name = MergedName(first, first + extra, min(count, extra + 1), "0123abcd")
    assert parse_merged_name(P + name.file_name) == name
    ids = [first, first + extra] if extra else [first]
    assert merged_object_uri(P, ids, "0123abcd") == P + f"merged-{first}-{first + extra}-{len(ids)}-0123abcd.parquet"


def test_ledger_objects_and_other_names_are_not_merged_files():
    assert parse_merged_name(own(3)) is None
    assert parse_merged_name(f"{P}merged-5-3-1-{'ab' * 8}.parquet") is None      # last < first
    assert parse_merged_name(f"{P}merged-3-5-4-{'ab' * 8}.parquet") is None      # more ledgers than ids
    assert parse_merged_name(f"{P}merged-3-5-2-XYZ.parquet") is None


def test_ledger_day():
    assert ledger_day(5 * DAY_MS, 6 * DAY_MS - 1) == 5
    assert ledger_day(5 * DAY_MS, 6 * DAY_MS) is None
    assert ledger_day(None, None) is None


# -- validity and the sync -------------------------------------------------------------------------
def test_a_merged_file_stands_for_its_ledgers_until_one_leaves():
    m = merged([2, 3, 5])          # 4 is not in the list (an empty ledger): 3 ledgers in 2..5
    assert merged_file_ledgers(m, [1, 2, 3, 5, 6]) == (2, 3, 5)
    assert merged_file_ledgers(m, [3, 5, 6]) is None          # ledger 2 trimmed
    assert merged_file_ledgers(m, [2, 5, 6]) is None          # ledger 3 back to offloading
    assert merged_file_ledgers(own(2), [2]) is None


def test_sync_keeps_a_valid_merged_file_and_not_its_ledgers_objects():
    live = {i: own(i) for i in (1, 2, 3, 4)}
    m = merged([2, 3])
    assert plan_table_sync({own(1), m, own(4)}, live).empty
    # the ledgers' own objects left over in the table (never made by us, but repaired)
    sync = plan_table_sync({own(1), m, own(2), own(3), own(4)}, live)
    assert sync.add == () and set(sync.remove) == {own(2), own(3)}
    # sync never adds a merged file that is not in the table
    assert plan_table_sync({own(1), own(4)}, live).add == (own(2), own(3))


def test_a_leaving_ledger_takes_its_merged_file_out_and_the_others_objects_back():
    live = {i: own(i) for i in (1, 2, 3, 4)}
    m = merged([1, 2, 3])
    sync = plan_table_sync({m, own(4)}, live, leaving=[1])
    assert set(sync.remove) == {m} and set(sync.add) == {own(2), own(3)}
    sync = plan_table_sync({m, own(4)}, {i: own(i) for i in (1, 3, 4)})      # ledger 2 no longer offloaded
    assert set(sync.remove) == {m} and set(sync.add) == {own(1), own(3)}
    assert plan_table_sync({m, own(4)}, {}).remove == tuple(sorted({m, own(4)}))   # topic deleted


def test_overlapping_merged_files_keep_one():
    live = {i: own(i) for i in range(1, 6)}
    a, b = merged([1, 2, 3], "aa" * 8), merged([3, 4, 5], "bb" * 8)
    kept, desired = table_layout({a, b}, live)
    assert set(kept) == {a} and desired == {a, own(4), own(5)}


# -- the planner -----------------------------------------------------------------------------------
def objs(sizes, *, day=0, offloaded=None):
    return [LedgerObject(i, own(i) if offloaded is None or i in offloaded else None, s, day)
            for i, s in enumerate(sizes, start=1)]


def test_plan_merges_the_oldest_run_of_small_files_up_to_the_target():
    ledgers = objs([10] * 10)
    files = {own(i) for i in range(1, 11)}
    plan = plan_merge(ledgers, files, target_bytes=45, files_min=4, by_day=False)
    assert plan.ledger_ids == (1, 2, 3, 4) and plan.sources == tuple(own(i) for i in (1, 2, 3, 4))
    assert plan.size_bytes == 40
    assert plan_merge(ledgers, files, target_bytes=0, files_min=4, by_day=False) is None


def test_the_newest_run_needs_files_min_a_closed_one_two():
    files = {own(i) for i in range(1, 4)}
    assert plan_merge(objs([10, 10, 10]), files, target_bytes=100, files_min=4, by_day=False) is None
    # a full group (the next file would pass the target) is closed: merged from 2 files
    assert plan_merge(objs([40, 40, 40]), files, target_bytes=100, files_min=4,
                      by_day=False).ledger_ids == (1, 2)
    # large files are left alone, and break runs
    assert plan_merge(objs([10, 100, 10]), files, target_bytes=100, files_min=2, by_day=False) is None


def test_files_above_the_small_bound_are_never_merged_and_break_runs():
    files = {own(i) for i in range(1, 7)}
    ledgers = objs([10, 10, 30, 10, 10, 10])
    # 30 is above file_bytes_max 20: ledgers 1-2 are a run cut by it (not closed), 4-6 the newest
    assert plan_merge(ledgers, files, target_bytes=100, files_min=3, by_day=False,
                      file_bytes_max=20).ledger_ids == (4, 5, 6)
    assert plan_merge(ledgers, files, target_bytes=100, files_min=4, by_day=False, file_bytes_max=20) is None
    # 0: the target is the bound (30 is small then)
    assert plan_merge(ledgers, files, target_bytes=100, files_min=4, by_day=False,
                      file_bytes_max=0).ledger_ids == (1, 2, 3, 4, 5, 6)


def test_a_merge_stays_inside_a_day_and_skips_unknown_days():
    ledgers = [LedgerObject(1, own(1), 10, 5), LedgerObject(2, own(2), 10, 5), LedgerObject(3, own(3), 10, 6),
               LedgerObject(4, own(4), 10, 6), LedgerObject(5, own(5), 10, None), LedgerObject(6, own(6), 10, 6)]
    files = {own(i) for i in range(1, 7)}
    assert plan_merge(ledgers, files, target_bytes=100, files_min=4, by_day=True).ledger_ids == (1, 2)
    files -= {own(1), own(2)}
    files.add(merged([1, 2]))
    # day 6 (3, 4) is followed by an unknown day: a break, not a closed group
    assert plan_merge(ledgers, files, target_bytes=100, files_min=4, by_day=True) is None
    # unpartitioned: days do not matter
    plan = plan_merge(ledgers, files, target_bytes=100, files_min=4, by_day=False)
    assert plan.ledger_ids == (1, 2, 3, 4, 5, 6) and plan.sources[0] == merged([1, 2])


def test_a_ledger_not_offloaded_or_not_in_the_table_breaks_a_run():
    ledgers = objs([10] * 6, offloaded={1, 2, 4, 5, 6})
    files = {own(i) for i in (1, 2, 4, 5, 6)}
    assert plan_merge(ledgers, files, target_bytes=100, files_min=3, by_day=False).ledger_ids == (4, 5, 6)
    files.discard(own(5))
    assert plan_merge(ledgers, files, target_bytes=100, files_min=3, by_day=False) is None


def test_merged_objects_to_delete():
    m_old, m_ref, m_young = merged([1, 2], "a1" * 8), merged([3, 4], "b1" * 8), merged([5, 6], "c1" * 8)
    listed = [(m_old, 0), (m_ref, 0), (m_young, 990), (own(1), 0)]
    assert merged_objects_to_delete(listed, {m_ref, own(1)}, now_ms=1000, grace_ms=100) == [m_old]


# -- the property: never a message twice or missing -------------------------------------------------
class Model:
    """A topic's list, its objects and its table, driven like the offloader does, with crashes
    between the steps."""

    def __init__(self) -> None:
        self.next_id = 1
        self.entries: dict[int, int] = {}            # the list: ledger id -> entries
        self.uri: dict[int, str] = {}                # offloaded ledgers' objects
        self.objects: dict[str, frozenset] = {}      # object URI -> its rows (ledger id, entry id)
        self.table: set[str] = set()
        self.leaving: set[int] = set()
        self.n = 0

    def rows(self, ids) -> frozenset:
        return frozenset((i, e) for i in ids for e in range(self.entries[i]))

    def table_rows(self) -> list:
        return [r for f in self.table for r in self.objects[f]]

    def offloaded(self) -> dict[int, str]:
        return dict(self.uri)

    def sync(self) -> None:
        plan = plan_table_sync(self.table, self.offloaded(), self.leaving)
        self.table = (self.table - set(plan.remove)) | set(plan.add)

    def check(self, synced: bool) -> None:
        rows = self.table_rows()
        assert len(rows) == len(set(rows)), "a message twice"
        live = [i for i in self.uri if i not in self.leaving]
        assert set(rows) <= self.rows(self.uri), "a message of a ledger not offloaded"
        if synced:
            assert set(rows) == self.rows(live), "a message missing"

    def new_uri(self, stem: str) -> str:
        self.n += 1
        return f"{P}{stem}-{self.n:016x}.parquet"

    def step(self, op: tuple) -> None:
        kind = op[0]
        if kind == "offload":                       # a ledger closes and is offloaded; commit or crash
            _, entries, crash = op
            lid = self.next_id
            self.next_id += 1
            self.entries[lid] = entries
            if entries == 0:
                return
            uri = f"{P}ledger-{lid}-{self.n:016x}.parquet"
            self.n += 1
            self.objects[uri] = self.rows([lid])
            self.uri[lid] = uri
            if not crash:
                self.sync()
        elif kind == "sync":
            self.sync()
        elif kind == "merge":                      # plan, write, commit (or crash before it)
            _, target, crash, by_day = op
            ledgers = [LedgerObject(i, self.uri.get(i) if i not in self.leaving else None,
                                    self.entries[i], i // 3) for i in sorted(self.entries) if self.entries[i] > 0]
            plan = plan_merge(ledgers, self.table, target_bytes=target, files_min=2, by_day=by_day)
            if plan is not None and by_day:
                assert len({i // 3 for i in plan.ledger_ids}) == 1, "a merge across days"
            if plan is None:
                return
            uri = merged_object_uri(P, plan.ledger_ids, f"{self.n:016x}")
            self.n += 1
            self.objects[uri] = frozenset().union(*(self.objects[s] for s in plan.sources))
            assert self.objects[uri] == self.rows(plan.ledger_ids)
            if not crash and set(plan.sources) <= self.table:     # Lake.commit_merge's check
                self.table = (self.table - set(plan.sources)) | {uri}
        elif kind == "retention":                  # the first k ledgers: out of the table, crash?, trimmed
            _, k, crash = op
            ids = sorted(self.entries)[:k]
            self.leaving |= set(ids)
            self.sync()
            self.check(True)
            if crash:                              # the broker restarts: leaving is in memory only
                self.leaving = set()
                return
            for i in ids:
                self.entries.pop(i)
                self.uri.pop(i, None)
            self.leaving -= set(ids)
        elif kind == "reoffload":                  # a ledger back to offloading, then offloaded again
            _, pick, crash = op
            if not self.uri:
                return
            lid = sorted(self.uri)[pick % len(self.uri)]
            self.uri.pop(lid)
            self.sync()
            self.check(True)
            if crash:
                return                             # stays offloading for now
            uri = self.new_uri(f"ledger-{lid}")
            self.objects[uri] = self.rows([lid])
            self.uri[lid] = uri
            self.sync()


OPS = st.one_of(
    st.tuples(st.just("offload"), st.integers(0, 5), st.booleans()),
    st.tuples(st.just("sync")),
    st.tuples(st.just("merge"), st.integers(1, 20), st.booleans(), st.booleans()),
    st.tuples(st.just("retention"), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("reoffload"), st.integers(0, 10), st.booleans()),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(OPS, max_size=40))
def test_never_a_message_twice_or_missing(ops):
    m = Model()
    for op in ops:
        m.step(op)
        m.check(synced=False)
        synced = Model.__new__(Model)
        synced.__dict__ = {**m.__dict__, "table": set(m.table)}
        synced.sync()
        synced.check(synced=True)       # the next pass's repair makes it exact
    m.sync()
    m.check(synced=True)
    # and once synced, the plan is stable (no new snapshot)
    assert plan_table_sync(m.table, m.offloaded(), m.leaving).empty


# -- the rewrite and the commit against a real table ------------------------------------------------
def _object(tier_dir, ledger_id: int, entries: int, *, t0_ms: int = 1_700_000_000_000, typed: bool = False) -> str:
    import json
    from offload.reader import encode_ledger
    from offload.tier import TableTypedColumns
    from pulsarlite.wire.entry import Message, build_entry
    version = (0).to_bytes(8, "big")
    schema = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "int"}]}
    rows = [(i, build_entry(Message(payload=json.dumps({"n": i}).encode() if typed else f"{ledger_id}-{i}".encode()),
                            producer_name="p", sequence_id=i, publish_time_ms=t0_ms + ledger_id * 1000 + i,
                            schema_version=version if typed else None))
            for i in range(entries)]
    columns = TableTypedColumns([(0, "JSON", json.dumps(schema))], topic="t", ledger_id=ledger_id) if typed else None
    path = tier_dir / "t" / "ns" / "x" / f"ledger-{ledger_id}-{'ab' * 8}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_ledger(ledger_id, rows, partition=-1, columns=columns).data)
    return f"file://{path}"


def test_merge_rewrites_commits_in_one_snapshot_and_retention_restores_the_objects(tmp_path):
    pytest.importorskip("pyiceberg")
    import os

    import pyarrow.parquet as pq
    from offload.lake import Lake, TableId
    from offload.lake_merge import MERGED_LEDGERS_KEY, merge_once, sweep_merged
    from offload.tier import Tier
    tier_dir = tmp_path / "tier"
    tier_dir.mkdir()
    tier = Tier(f"file://{tier_dir}", None)
    prefix = f"file://{tier_dir}/t/ns/x/"
    # ledger 3 has typed columns, the others not: the merged schema is their union
    uris = {i: _object(tier_dir, i, 5 + i, typed=(i == 3)) for i in (1, 2, 3, 4, 5)}
    ledgers = [LedgerObject(i, u, os.path.getsize(u[len("file://"):]), 0) for i, u in uris.items()]
    lake = Lake(tier.uri, partition="day")
    tid = TableId.of_topic("t", "ns", "x")
    lake.sync(tid, uris, prefix=prefix)
    ids = lambda table: sorted((r["ledger_id"], r["entry_id"], r["batch_index"])
                               for r in table.scan(selected_fields=("ledger_id", "entry_id", "batch_index"))
                               .to_arrow().to_pylist())
    before = ids(lake.load(tid))
    assert len(before) == sum(5 + i for i in uris)
    snapshots = len(lake.load(tid).metadata.snapshots)

    done = merge_once(lake, tier, tid, ledgers, object_prefix=prefix, topic="t/ns/x", target_bytes=10 ** 9,
                      files_min=4, row_group_bytes=8 << 20)
    assert done is not None
    plan, obj = done
    assert plan.ledger_ids == (1, 2, 3, 4, 5) and obj.rows == len(before)
    table = lake.load(tid)
    assert len(table.metadata.snapshots) == snapshots + 1                 # one snapshot
    assert lake.table_files(tid) == {obj.uri}
    assert ids(table) == before                                           # every message once, same ids
    md = pq.read_metadata(obj.uri[len("file://"):])
    assert md.metadata[MERGED_LEDGERS_KEY.encode()] == b"1,2,3,4,5"
    assert md.row_group(0).column(0).statistics.has_min_max             # ledger_id statistics
    assert "n" in md.schema.to_arrow_schema().names
    assert {r["n"] for r in table.scan(selected_fields=("ledger_id", "n")).to_arrow().to_pylist()
            if r["ledger_id"] != 3} == {None}
    assert lake.sync(tid, uris, prefix=prefix).empty                     # the sync keeps it
    merged_snapshot = table.current_snapshot().snapshot_id

    # retention trims ledger 1: ONE snapshot without the merged file, with the others' objects
    sync = lake.sync(tid, uris, leaving=[1], prefix=prefix)
    assert sync.remove == (obj.uri,) and set(sync.add) == {uris[i] for i in (2, 3, 4, 5)}
    table = lake.load(tid)
    assert len(table.metadata.snapshots) == snapshots + 2
    assert ids(table) == [r for r in before if r[0] != 1]
    # the previous snapshot still reads (the merged object is kept while a snapshot names it)
    assert sweep_merged(lake, tier, tid, "t/ns/x/", now_ms=10 ** 15, grace_ms=0) == []
    assert len(table.scan(snapshot_id=merged_snapshot).to_arrow()) == len(before)
    # a merged object written but never committed (a crash) goes after the grace
    orphan = merged_object_uri(prefix, [2, 3], "ee" * 8)
    tier.put(tier.key_of(orphan), b"x")
    assert sweep_merged(lake, tier, tid, "t/ns/x/", now_ms=10 ** 15, grace_ms=0) == [orphan]
    # once the snapshots naming it expire, the merged object goes too
    expiring = Lake(tier.uri, snapshot_retention_ms=0)
    expiring.sync(tid, {i: uris[i] for i in (2, 3, 4, 5)}, prefix=prefix,
                  now_ms=table.current_snapshot().timestamp_ms + 10_000)
    assert sweep_merged(lake, tier, tid, "t/ns/x/", now_ms=10 ** 15, grace_ms=0) == [obj.uri]
    assert not os.path.exists(obj.uri[len("file://"):])


def test_a_merge_whose_sources_left_the_table_is_not_committed(tmp_path):
    pytest.importorskip("pyiceberg")
    from offload.lake import Lake, LakeError, TableId
    from offload.lake_merge import write_merged
    from offload.tier import Tier
    tier_dir = tmp_path / "tier"
    tier_dir.mkdir()
    tier = Tier(f"file://{tier_dir}", None)
    prefix = f"file://{tier_dir}/t/ns/x/"
    uris = {i: _object(tier_dir, i, 3) for i in (1, 2)}
    lake = Lake(tier.uri)
    tid = TableId.of_topic("t", "ns", "x")
    lake.sync(tid, {2: uris[2]}, prefix=prefix)
    uri = merged_object_uri(prefix, [1, 2])
    write_merged(lambda u: tier.get(tier.key_of(u)), lambda u, d: tier.put(tier.key_of(u), d), list(uris.values()),
                 uri, [1, 2], row_group_bytes=8 << 20)
    location = lake.metadata_location(tid)
    with pytest.raises(LakeError, match="no longer in the table"):
        lake.commit_merge(tid, list(uris.values()), uri)
    assert lake.metadata_location(tid) == location


@pytest.mark.parametrize("overrides, match", [
    ({"lake_merge_target_bytes": -1}, "lake_merge_target_bytes"),
    ({"lake_merge_target_bytes": True}, "lake_merge_target_bytes"),
    ({"lake_merge_files_min": 1}, "lake_merge_files_min"),
    ({"lake_merge_file_bytes_max": -1}, "lake_merge_file_bytes_max"),
])
def test_bad_merge_settings_are_refused(overrides, match):
    from broker.config import OffloadConfig
    from pulsarlite.errors import ConfigError
    with pytest.raises(ConfigError, match=match):
        OffloadConfig(**overrides).validate()
    assert OffloadConfig().lake_merge_target_bytes == 128 * 1024 * 1024
    OffloadConfig(lake_merge_target_bytes=0).validate()       # off
