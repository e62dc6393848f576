"""offload/core.py: the per-ledger offload state machine under seeded crashes and faults, and
the offload policy."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offload.core import (BookiesDeleted, CasConflict, DeleteFromBookies, DeleteObject, Done,
                          LedgerOffload, LedgerView, ListedObject, ObjectDeleted, ObjectStats,
                          ObjectVerified, ObjectWritten, Offload, OffloadPolicy, OffloadRecord,
                          OffloadState, Recorded, RecordOffload, Remove, StepFailed,
                          Tick, VerifyObject, WriteObject, object_uri, orphan_objects,
                          parse_object_name, plan_offload)
from pulsarlite.errors import InvariantViolation

TIER = "s3://bucket/tier"
LEDGER = 42
FULL = b"PARQUET-OBJECT-OF-LEDGER-42" * 10
STATS = ObjectStats(rows=100, size_bytes=len(FULL), checksum="0badf00d",
                    min_publish_time_ms=1, max_publish_time_ms=9)
LAG_MS = 1000


def new_machine(record: OffloadRecord) -> LedgerOffload:
    return LedgerOffload(LEDGER, record, tier_uri=TIER, tenant="t", namespace="ns",
                         topic="topic", deletion_lag_ms=LAG_MS)


class Crash(Exception):
    pass


class World:
    """The durable state a crash keeps: the recorded offload metadata, the object store, and
    whether the bookies still hold the ledger. Executes actions with seeded faults."""

    def __init__(self, rng: random.Random, *, crash_p: float, fault_p: float) -> None:
        self.rng = rng
        self.crash_p = crash_p
        self.fault_p = fault_p
        self.record = OffloadRecord()
        self.objects: dict[str, bytes] = {}
        self.bookies = True
        self.removed = False
        self.removing = False      # the ledger is being deleted (retention / topic deletion)
        self.crashes = 0
        self.now_ms = 0
        self.rotted: set[str] = set()   # objects damaged after they were verified (bit rot)

    def check_invariants(self) -> None:
        # no orphan: every object that exists is the one the record names
        assert set(self.objects) <= ({self.record.uri} if self.record.uri else set()), \
            (self.objects.keys(), self.record)
        # invariant 6: no bookie copy only once a verified, complete object is recorded
        if not self.bookies:
            assert self.record.state in (OffloadState.OFFLOADED, OffloadState.BOOKIE_DELETED)
            assert self.removing or self.objects.get(self.record.uri) == FULL
        if self.record.state in (OffloadState.OFFLOADED, OffloadState.BOOKIE_DELETED) \
                and not self.removing and self.record.uri not in self.rotted:
            assert self.objects.get(self.record.uri) == FULL

    def maybe_crash(self) -> None:
        if self.rng.random() < self.crash_p:
            self.crashes += 1
            raise Crash()

    def execute(self, action):
        """Apply one action (maybe crash before or after its durable effect); return the
        event the shell would feed back."""
        self.maybe_crash()
        fault = self.rng.random() < self.fault_p
        if isinstance(action, RecordOffload):
            if action.expected != self.record:
                return CasConflict(self.record)
            if fault:
                return StepFailed("metadata store unavailable")
            self.record = action.record
            self.check_invariants()
            self.maybe_crash()
            return Recorded(action.record)
        if isinstance(action, WriteObject):
            assert action.uri == self.record.uri and self.record.state is OffloadState.OFFLOADING
            if fault:   # a partial object left behind
                self.objects[action.uri] = FULL[:self.rng.randint(0, len(FULL) - 1)]
                self.check_invariants()
                return StepFailed("connection reset during upload")
            if self.rng.random() < self.fault_p:   # "complete" but silently corrupted
                self.objects[action.uri] = FULL[:-1] + b"X"
            else:
                self.objects[action.uri] = FULL
            self.check_invariants()
            self.maybe_crash()
            return ObjectWritten(STATS)
        if isinstance(action, VerifyObject):
            if fault:
                return StepFailed("timeout")
            if self.objects.get(action.uri) != FULL:
                return StepFailed("checksum mismatch", corrupt=True)
            return ObjectVerified()
        if isinstance(action, DeleteObject):
            if fault:
                return StepFailed("503")
            self.objects.pop(action.uri, None)
            self.check_invariants()
            self.maybe_crash()
            return ObjectDeleted()
        if isinstance(action, DeleteFromBookies):
            assert self.record.state is OffloadState.OFFLOADED
            if fault:
                return StepFailed("bookie unavailable")
            self.bookies = False
            self.check_invariants()
            self.maybe_crash()
            return BookiesDeleted()
        raise AssertionError(f"unexpected action {action}")


def run(seed: int, *, crash_p: float, fault_p: float, remove_at: int | None = None,
        steps_max: int = 20000) -> World:
    rng = random.Random(seed)
    world = World(rng, crash_p=crash_p, fault_p=fault_p)
    machine = new_machine(world.record)
    remove_sent = False
    for step in range(steps_max):
        world.now_ms += rng.randint(0, LAG_MS // 2)
        if remove_at is not None and step >= remove_at and not remove_sent:
            event = Remove()
            world.removing = True
        elif machine.done and remove_at is None:
            break
        elif machine.done:
            event = Tick(world.now_ms)      # nothing to do until the removal comes
        elif machine.record.state in (OffloadState.NONE, OffloadState.OFFLOADING):
            event = Offload(world.now_ms, f"{rng.getrandbits(64):016x}")
        else:
            event = Tick(world.now_ms)
            if world.record.state is OffloadState.OFFLOADED and world.bookies \
                    and rng.random() < fault_p / 4:
                world.objects[world.record.uri] = b"rotten"      # damaged while offloaded
                world.rotted.add(world.record.uri)
        try:
            actions = machine.handle(event)
            if isinstance(event, Remove):
                remove_sent = True
            while actions:
                (action,) = actions
                if isinstance(action, Done):
                    if action.removed:
                        world.removed = True
                        world.record = OffloadRecord()   # the shell drops the ledger
                        world.bookies = False
                        return world
                    break
                actions = machine.handle(world.execute(action))
            if machine.record != world.record:   # an unknown-outcome CAS: re-read
                machine.handle(CasConflict(world.record))
        except Crash:
            if world.removing:
                remove_sent = False   # the shell redoes the removal after failover
            machine = new_machine(world.record)   # a new owner, from the recorded state
        world.check_invariants()
    else:
        raise AssertionError(f"seed {seed}: did not converge in {steps_max} steps: "
                             f"{machine.phase} {world.record}")
    return world


def test_happy_path_actions_in_order():
    m = new_machine(OffloadRecord())
    (a,) = m.handle(Offload(100, "aa" * 8))
    assert isinstance(a, RecordOffload) and a.record.state is OffloadState.OFFLOADING
    uri = a.record.uri
    assert uri == f"{TIER}/t/ns/topic/ledger-42-{'aa' * 8}.parquet"
    assert parse_object_name(uri) == (42, "aa" * 8)
    (a,) = m.handle(Recorded(a.record))
    assert a == WriteObject(LEDGER, uri)
    (a,) = m.handle(ObjectWritten(STATS))
    assert a == VerifyObject(LEDGER, uri, STATS)
    (a,) = m.handle(ObjectVerified())
    assert isinstance(a, RecordOffload) and a.record.state is OffloadState.OFFLOADED
    assert a.record.stats == STATS and a.record.offloaded_ms == 100
    assert m.handle(Recorded(a.record)) == [Done(LEDGER)]
    assert m.handle(Tick(100 + LAG_MS - 1)) == []          # the lag has not passed
    (a,) = m.handle(Tick(100 + LAG_MS))
    assert a == VerifyObject(LEDGER, uri, STATS)            # verified again before deleting
    (a,) = m.handle(ObjectVerified())
    assert a == DeleteFromBookies(LEDGER)
    (a,) = m.handle(BookiesDeleted())
    assert isinstance(a, RecordOffload) and a.record.state is OffloadState.BOOKIE_DELETED
    assert m.handle(Recorded(a.record)) == [Done(LEDGER)]
    assert m.done
    j = m.record.to_json()
    assert j["state"] == "bookie-deleted" and j["uri"] == uri and j["rows"] == 100
    assert j["size_bytes"] == len(FULL) and j["checksum"] == "0badf00d"
    assert j["min_publish_time_ms"] == 1 and j["max_publish_time_ms"] == 9
    assert OffloadRecord.from_json(j) == m.record


def test_retry_deletes_its_previous_attempt_first():
    recorded = OffloadRecord(OffloadState.OFFLOADING, f"{TIER}/t/ns/topic/ledger-42-{'01' * 8}"
                             ".parquet", "01" * 8)
    m = new_machine(recorded)
    assert m.handle(Offload(5, "02" * 8)) == [DeleteObject(LEDGER, recorded.uri)]
    (a,) = m.handle(ObjectDeleted())
    assert a.expected == recorded and a.record.attempt_uuid == "02" * 8
    assert a.record.uri != recorded.uri


def test_out_of_place_events_are_bugs():
    m = new_machine(OffloadRecord())
    with pytest.raises(InvariantViolation):
        m.handle(ObjectVerified())
    with pytest.raises(InvariantViolation):
        m.handle(BookiesDeleted())
    (a,) = m.handle(Offload(0, "ab" * 8))
    with pytest.raises(InvariantViolation):   # a record other than the one asked for
        m.handle(Recorded(OffloadRecord()))


def test_records_reject_bad_shapes():
    with pytest.raises(InvariantViolation):
        OffloadRecord(OffloadState.OFFLOADED, "s3://b/x", "ab" * 8)       # no stats
    with pytest.raises(ValueError):
        OffloadRecord.from_json({"state": "offloaded", "uri": "s3://b/x"})
    with pytest.raises(ValueError):
        OffloadRecord.from_json({"state": "bogus"})
    r = OffloadRecord.from_json({"state": "none", "uri": None, "foo": 1})
    assert r.extra == {"foo": 1} and r.to_json()["foo"] == 1
    with pytest.raises(ValueError):
        object_uri(TIER, "t", "ns", "a/b", 1, "ab" * 8)
    with pytest.raises(ValueError):
        object_uri(TIER, "t", "ns", "x", 1, "NOT-HEX")


@pytest.mark.parametrize("seed", range(200))
def test_seeded_crashes_and_faults_converge_without_orphans(seed):
    world = run(seed, crash_p=0.15, fault_p=0.15)
    assert world.record.state is OffloadState.BOOKIE_DELETED
    assert world.objects == {world.record.uri: FULL}
    assert not world.bookies


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), crash_p=st.floats(0, 0.25), fault_p=st.floats(0, 0.25))
def test_property_crashes_and_faults(seed, crash_p, fault_p):
    world = run(seed, crash_p=crash_p, fault_p=fault_p)
    assert world.record.state is OffloadState.BOOKIE_DELETED
    assert world.objects == {world.record.uri: FULL}


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), remove_at=st.integers(0, 12),
       crash_p=st.floats(0, 0.3), fault_p=st.floats(0, 0.3))
def test_property_removal_leaves_no_object(seed, remove_at, crash_p, fault_p):
    world = run(seed, crash_p=crash_p, fault_p=fault_p, remove_at=remove_at)
    assert world.objects == {}


def test_corrupt_object_before_bookie_delete_goes_back_to_offloading():
    uri = f"{TIER}/t/ns/topic/ledger-42-{'cd' * 8}.parquet"
    record = OffloadRecord(OffloadState.OFFLOADED, uri, "cd" * 8, STATS, offloaded_ms=0)
    m = new_machine(record)
    (a,) = m.handle(Tick(LAG_MS))
    assert isinstance(a, VerifyObject)
    (a,) = m.handle(StepFailed("crc mismatch", corrupt=True))
    assert isinstance(a, RecordOffload) and a.record.state is OffloadState.OFFLOADING
    assert a.record.uri == uri         # still named: the retry deletes it
    assert m.handle(Recorded(a.record)) == [Done(LEDGER)]
    assert m.handle(Offload(LAG_MS, "ef" * 8)) == [DeleteObject(LEDGER, uri)]


# -- policy ---------------------------------------------------------------------------------------
def view(i, size=100, closed=True, state=OffloadState.NONE, closed_ms=0, offloaded_ms=None,
         entries=10):
    return LedgerView(i, closed, entries, size, created_ms=0, closed_ms=closed_ms, state=state,
                      offloaded_ms=offloaded_ms)


def test_policy_size_threshold_keeps_newest_bytes_on_bookies():
    ledgers = [view(1), view(2), view(3), view(4), view(5, closed=False)]
    assert plan_offload(ledgers, OffloadPolicy(threshold_bytes=250), 0).offload == (1, 2, 3)
    assert plan_offload(ledgers, OffloadPolicy(threshold_bytes=0), 0).offload == (1, 2, 3, 4)
    assert plan_offload(ledgers, OffloadPolicy(threshold_bytes=10_000), 0).offload == ()
    assert plan_offload(ledgers, OffloadPolicy(), 0).offload == ()
    # already offloaded ledgers do not count toward the bytes kept
    ledgers[3] = view(4, state=OffloadState.OFFLOADED, offloaded_ms=0)
    assert plan_offload(ledgers, OffloadPolicy(threshold_bytes=250), 0).offload == (1, 2)


def test_policy_time_threshold_demand_and_resume():
    ledgers = [view(1, closed_ms=0), view(2, closed_ms=500),
               view(3, state=OffloadState.OFFLOADING), view(4, entries=0, size=0),
               view(5, closed=False)]
    assert plan_offload(ledgers, OffloadPolicy(threshold_ms=600), 1000).offload == (1, 3)
    assert plan_offload(ledgers, OffloadPolicy(), 1000, demand=[2, 4, 5]).offload == (2, 3)


def test_policy_deletion_lag():
    ledgers = [view(1, state=OffloadState.OFFLOADED, offloaded_ms=0),
               view(2, state=OffloadState.OFFLOADED, offloaded_ms=900),
               view(3, state=OffloadState.BOOKIE_DELETED, offloaded_ms=0)]
    plan = plan_offload(ledgers, OffloadPolicy(deletion_lag_ms=500), 1000)
    assert plan.delete_from_bookies == (1,) and plan.offload == ()
    with pytest.raises(ValueError):
        OffloadPolicy(threshold_bytes=-2)


def test_orphans():
    a = object_uri(TIER, "t", "ns", "x", 1, "aa" * 8)
    b = object_uri(TIER, "t", "ns", "x", 2, "bb" * 8)
    c = object_uri(TIER, "t", "ns", "x", 3, "cc" * 8)
    records = [OffloadRecord(OffloadState.OFFLOADING, a, "aa" * 8)]
    listed = [ListedObject(a, 0), ListedObject(b, 0), ListedObject(c, 950),
              ListedObject(f"{TIER}/t/ns/x/unrelated.txt", 0)]
    assert orphan_objects(listed, records, now_ms=1000, grace_ms=100) == [b]
