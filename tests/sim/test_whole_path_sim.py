"""The whole publish path's seeded simulation (tests/sim/whole_path_sim.py): C++-like producers,
the real topic, publish core and deduplication, the real managed ledger and ledger client
(shells and cores) over simulated bookies, network and ZooKeeper, with bookie crashes, broker
crashes and takeovers, session expiries (a zombie old owner), suspensions, lost, delayed,
reordered and duplicated messages, metadata writes with unknown outcomes.

Seeds: every seed of 0..WHOLE_PATH_SEEDS-1 (default 10,000; PULSARLITE_WHOLE_PATH_SEEDS). A
seed takes ~20-25 ms on this 2-core machine (~19 ms of CPU, about half of it the product code
itself: whole_path_sim's docstring), so 10,000 seeds are ~3.5 min of one core: in a session with
other tests they run in a background process at the lowest CPU priority while the rest of the
suite runs, and the sweep test, moved to the end, runs the seeds the background did not finish
(tests/sim/background_sweep.py, the one mechanism of every sweep; PULSARLITE_SIM_BACKGROUND=0 runs
them all in the test).
`make sim-whole SEEDS=A-B` runs other ranges. A failing seed is reported with the command that
replays it.

Planted defects: each test switches one protection off and the simulation must find a
violation within DEFECT_SEED_BUDGET seeds. Product defects the simulation found are pinned as
strict xfails at the end (docs/decisions.md, "The whole publish path's simulation").
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys

import pytest

import broker.publish_core
from bookie.client.actions import SendReadLac
from bookie.client.ledger_client import LedgerClient, LedgerWriter
from bookie.client.metadata import LedgerMetadata
from bookie.client.recovery_core import LedgerRecoveryCore
from broker.dedup import DedupState
from broker.managed_ledger.core import ManagedLedgerMetadata
from broker.publish_core import PublishCore
from pulsarlite.config import LedgerClientConfig
from pulsarlite.errors import MetadataNotFoundError, MetadataVersionConflict, PulsarliteError

from . import background_sweep
from .publish_sim import SimulationViolation
from .whole_path_sim import check_seed, replay_command, run_seed

WHOLE_PATH_SEEDS = background_sweep.BY_NAME["whole-path"].seeds()     # PULSARLITE_WHOLE_PATH_SEEDS, default 10,000
DEFECT_SEED_BUDGET = 300

pytestmark = pytest.mark.sim


# all 10,000 seeds run here when the session has no background (pytest-xdist workers, as
# scripts/test.sh runs them): ~3.5-4.5 min of one core, longer on a loaded machine (over 20 min
# in a clean-clone run beside seven other engineers' work, load average 12-14: 1,200 s was too short)
@pytest.mark.timeout(2700)
def test_every_seed_keeps_the_whole_path_invariants(request):
    """Every seed of 0..WHOLE_PATH_SEEDS-1: those the background finished while the rest of the
    session ran (tests/sim/background_sweep.py), the others here."""
    outcome = background_sweep.finish(request.config, "whole-path")
    print(outcome.line)
    assert len(outcome.results) == WHOLE_PATH_SEEDS
    background_sweep.check(outcome)


def test_the_simulation_exercises_every_fault():
    """Not a vacuous run: across a few seeds, every fault happens and every protection acts."""
    totals: dict[str, int] = {}
    for seed in range(60):
        result = run_seed(seed)
        assert result.ok, result.violations
        for key, value in result.stats.items():
            totals[key] = totals.get(key, 0) + value
    for key in ("takeovers", "broker_crashes", "session_expiries", "suspensions", "bookie_crashes",
                "fenced_ledgers", "fenced_answers", "recovery_adds", "duplicates", "lost",
                "duplicate_receipts", "ledgers"):
        assert totals.get(key, 0) > 0, f"{key} never happened in 60 seeds: {totals}"
    assert totals["ledgers"] > 2 * 60          # rollovers and takeovers: several ledgers per seed
    assert totals["acked"] > 3000


def test_same_seed_same_trace():
    for seed in (0, 1, 17):
        traced = run_seed(seed, trace=True)
        assert traced.trace and traced.trace == run_seed(seed, trace=True).trace
        untraced = run_seed(seed)      # the sweep's mode: no trace, the same run
        assert (untraced.stats, untraced.violations) == (traced.stats, traced.violations)
    assert run_seed(1, trace=True).trace != run_seed(2, trace=True).trace


def test_same_seed_same_trace_in_another_process():
    """The replay command runs in a new interpreter, with another hash seed."""
    code = ("import sys; sys.path.insert(0, '.'); from tests.sim.whole_path_sim import run_seed; "
            "print(run_seed(5, trace=True).trace_digest())")
    env = dict(os.environ, PYTHONHASHSEED="4242")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.stdout.strip() == run_seed(5, trace=True).trace_digest()


# -- planted defects --------------------------------------------------------------------------------
def _first_violation(kind: str = "", budget: int = DEFECT_SEED_BUDGET, **overrides):
    """The first seed with a violation mentioning ``kind``."""
    for seed in range(budget):
        result = run_seed(seed, **overrides)
        if any(kind in v for v in result.violations):
            return seed, result
    return None, None


def test_without_holding_a_resend_behind_its_first_copy_messages_are_stored_twice(monkeypatch):
    """The publish core holds a resend whose first copy is still being written until that copy's
    outcome is known."""
    monkeypatch.setattr(broker.publish_core, "_first_copy_of", lambda inflight, op, by_content: False)
    seed, result = _first_violation("stored twice")
    assert seed is not None, f"no duplicate in {DEFECT_SEED_BUDGET} seeds without holding resends"
    print(f"found at seed {seed}: {result.violations[0]}")


def test_without_the_write_block_after_a_failed_add_order_breaks(monkeypatch):
    """After a failed add the topic refuses SENDs (producers disconnected) until its adds in
    flight are done and its ledger rolled over."""
    monkeypatch.setattr(PublishCore, "_block_writes", lambda self, *args, **kwargs: None)
    seed, result = _first_violation("out of order")
    assert seed is not None, f"no order violation in {DEFECT_SEED_BUDGET} seeds without the write block"
    print(f"found at seed {seed}: {result.violations[0]}")


def test_without_hole_tracking_or_content_ranges_acknowledged_messages_are_lost(monkeypatch):
    """A resend into a hole left by a failed add must be stored, not answered as a duplicate."""
    def on_failed_without_holes(self, name, first_sequence_id=None):
        self.pushed[name] = self.persisted.get(name, -1)
    monkeypatch.setattr(DedupState, "on_failed", on_failed_without_holes)
    monkeypatch.setattr(DedupState, "on_session_start", lambda self, name, reconnect: self.last_sequence_id(name))
    seed, result = _first_violation("acknowledged messages lost")
    assert seed is not None, f"no loss in {DEFECT_SEED_BUDGET} seeds without hole tracking"
    print(f"found at seed {seed}: {result.violations[0]}")


def test_without_content_ranges_the_cpp_clients_reused_ids_are_lost(monkeypatch):
    """Decided by id alone, the C++ client's reset counter reuses stored ids: answered as
    duplicates, the new messages are lost."""
    monkeypatch.setattr(DedupState, "on_session_start", lambda self, name, reconnect: self.last_sequence_id(name))
    monkeypatch.setattr(DedupState, "open_after_load", lambda self, known: None)
    seed, result = _first_violation("acknowledged messages lost")
    assert seed is not None, f"no loss in {DEFECT_SEED_BUDGET} seeds without content ranges"
    print(f"found at seed {seed}: {result.violations[0]}")


def test_without_recovering_the_previous_ledger_a_new_owner_stores_twice_or_loses(monkeypatch):
    """A new owner's managed ledger fences and recovers every ledger left OPEN before it writes;
    without it, the old owner's ledger stays open beside the new one."""
    monkeypatch.setattr(ManagedLedgerMetadata, "open_ledgers", property(lambda self: []))
    seed, result = _first_violation()
    assert seed is not None, f"no violation in {DEFECT_SEED_BUDGET} seeds without recovery on open"
    print(f"found at seed {seed}: {result.violations[0]}")


def test_without_fencing_in_recovery_the_old_owner_keeps_acknowledging(monkeypatch):
    """Recovery fences the ledger on its bookies (ReadLac and reads with the fence flag); without
    it the old owner's adds keep succeeding past the point recovery closed the ledger at."""
    start, init = LedgerRecoveryCore.start, LedgerRecoveryCore.__init__

    def init_without_fenced_reads(self, metadata, *, fence_recovery_reads=True, **kwargs):
        init(self, metadata, fence_recovery_reads=False, **kwargs)

    def start_without_fence(self):
        return [SendReadLac(a.bookie, fence=False) if isinstance(a, SendReadLac) else a for a in start(self)]
    monkeypatch.setattr(LedgerRecoveryCore, "__init__", init_without_fenced_reads)
    monkeypatch.setattr(LedgerRecoveryCore, "start", start_without_fence)
    seed, result = _first_violation()
    assert seed is not None, f"no violation in {DEFECT_SEED_BUDGET} seeds without fencing"
    print(f"found at seed {seed}: {result.violations[0]}")


def test_without_the_ownership_guard_a_broker_that_lost_the_topic_keeps_storing(monkeypatch):
    """The publish core checks, before every add, that the broker still owns the topic (the
    write guard given with each event): without it a zombie's topic hands new adds to its
    managed ledger after it learned it lost the topic."""
    event = PublishCore._event

    def event_always_owned(self, owned, ml_state):
        event(self, True, ml_state)
    monkeypatch.setattr(PublishCore, "_event", event_always_owned)
    seed, result = _first_violation("after it learned it lost the topic")
    assert seed is not None, f"no violation in {DEFECT_SEED_BUDGET} seeds without the ownership guard"
    print(f"found at seed {seed}: {result.violations[0]}")


def test_a_failing_seed_is_reported_with_its_replay_command(monkeypatch):
    monkeypatch.setattr(broker.publish_core, "_first_copy_of", lambda inflight, op, by_content: False)
    seed, _ = _first_violation("stored twice")
    assert seed is not None
    with pytest.raises(SimulationViolation,
                       match=rf"(?s)seed {seed}: .*replay: \.venv/bin/python -m tests\.sim\.whole_path_sim "
                             rf"--seed {seed} --trace"):
        check_seed(seed)


# -- product defects found by the simulation (strict xfails: remove the mark once fixed) ------------
def test_a_list_create_whose_answer_is_lost_leaves_the_topic_loadable():
    """Found by this simulation: ManagedLedger._open_attempt deleted the ledger it created when
    the list's create failed with an unknown outcome, although the create had been applied (the
    list then named a ledger without metadata: every later open failed). Fixed: the create is
    read back (_create_list), the ledger is deleted only if the list does not name it
    (_give_up_created), and an open drops a last ledger without metadata as empty."""
    check_seed(0, list_create_reply_lost=True)


def test_a_broker_that_learned_it_lost_the_topic_writes_no_list():
    """Found by this simulation (seed 33): a broker that learned it lost the topic kept writing
    its managed ledger's list: its unload waited for the managed ledger, which rolled over and
    CASed the list, then wrote the adds it had queued to the new ledgers. Fixed: the managed
    ledger checks the broker's write guard before every write of the list and before an open
    recovers anything (ManagedLedger.open(write_guard=...)): once ownership is gone it goes
    FENCED and its queued adds fail."""
    seed, result = _first_violation("writes the managed ledger's list", strict_stop_check=True)
    assert seed is None, f"seed {seed}: {result.violations[0]}\n  replay: " \
                         f"{replay_command(seed)} --set strict_stop_check=True"


def test_a_new_owner_does_not_store_the_old_owners_unacknowledged_entries_twice():
    """Found by the first 10,000-seed sweep (seed 6911): the old owner's failed adds were kept by
    the recovery of their ledger, the rollover could not read them back (a bookie down), so its
    deduplication never learned them, and its final snapshot, at the ledger's last (kept) entry,
    told the new owner to replay only after them: p0's resends were stored again. Fixed: a kept
    range that cannot be read stops the owner's dedup snapshots (kept_unread_listeners); the next
    owner replays from the last snapshot before it. Replay:
    .venv/bin/python -m tests.sim.whole_path_sim --seed 6911 --trace"""
    check_seed(6911)


@pytest.mark.xfail(strict=True, reason="known limitation, kept by choice: a broker that learned it lost the "
                                       "topic lets the adds its ledger writer took before finish (resends "
                                       "after an ensemble change included), so that producers get receipts "
                                       "rather than errors for messages that are durable (fewer duplicates "
                                       "without deduplication); the new owner's fencing refuses the rest: "
                                       "nothing is lost or stored twice (docs/decisions.md)")
def test_a_broker_that_learned_it_lost_the_topic_sends_no_new_entry():
    seed, result = _first_violation("sends a new entry", strict_stop_check=True)
    assert seed is None, f"seed {seed}: {result.violations[0]}\n  replay: " \
                         f"{replay_command(seed)} --set strict_stop_check=True"


def test_a_writer_whose_ledger_was_deleted_during_its_close_answers_the_close():
    """Found by this simulation (seed 1313): LedgerWriter._write_metadata let a re-read's error
    (the ledger deleted by a new owner that recovered it empty) kill its task; the write core
    never heard back and close() never returned. Fixed: the core's on_metadata_gone."""
    class DeletedMeanwhile:
        """The ledger was recovered (CAS conflict) and then deleted by the new owner."""

        async def write(self, metadata, version):
            raise MetadataVersionConflict(f"ledger {metadata.ledger_id}: version changed")

        async def read(self, ledger_id):
            raise MetadataNotFoundError(f"ledger {ledger_id}: no metadata")

    async def scenario():
        client = LedgerClient(None, LedgerClientConfig(), owns_store=False, rng=random.Random(0))
        client.ledger_manager = DeletedMeanwhile()
        md = LedgerMetadata(ledger_id=4, ensemble_size=2, write_quorum=2, ack_quorum=2,
                            ensembles=((0, ("b0:3181", "b1:3181")),))
        writer = LedgerWriter(client, md, 0)
        try:
            with pytest.raises(PulsarliteError):
                await asyncio.wait_for(writer.close(), 2.0)
        finally:
            writer._stop_ticker()
    asyncio.run(scenario())
