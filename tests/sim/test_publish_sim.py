"""The publish path's seeded simulation (tests/sim/publish_sim.py): the real topic and dedup
state, producers modelled on the official C++ client, a simulated managed ledger and broker
crashes. Every seed must keep: nothing acknowledged lost, nothing stored twice (dedup on), per
producer first occurrences in order, receipts only for positions that hold the message.

Budget: PUBLISH_SIM_SEEDS seeds (default 10,000, ~100 s; override with the environment variable
PULSARLITE_PUBLISH_SIM_SEEDS, or run `make sim` for a longer soak). A failing seed is reported
with the command that replays it. Each protection the publish path relies on is switched off in
turn, and the simulation must find a violation within its budget. In a session with other tests
the sweep's seeds run in the background beside them and the sweep test, moved to the end, runs
what the background did not (tests/sim/background_sweep.py).
"""

from __future__ import annotations

import pytest

import broker.publish_core
from broker.dedup import DedupState
from broker.publish_core import PublishCore, WriteState

from . import background_sweep
from .publish_sim import SWEEP_CONFIGS, SimulationViolation, check_seed, run_seed, sweep_units

PUBLISH_SIM_SEEDS = background_sweep.BY_NAME["publish"].seeds()      # PULSARLITE_PUBLISH_SIM_SEEDS, default 10,000
DEFECT_SEED_BUDGET = 400

pytestmark = pytest.mark.sim


@pytest.mark.parametrize("config", SWEEP_CONFIGS)
def test_every_seed_keeps_the_publish_invariants(config, request):
    """Every seed of this chunk of 0..PUBLISH_SIM_SEEDS-1: those the background finished while
    the rest of the session ran (tests/sim/background_sweep.py), the others here."""
    outcome = background_sweep.finish(request.config, "publish", [config])
    print(outcome.line)
    assert [r.seed for r in outcome.results] == list(sweep_units(config, PUBLISH_SIM_SEEDS))
    background_sweep.check(outcome)         # names each failing seed with its replay command


def test_the_chunks_cover_every_seed_once():
    seeds = [s for config in SWEEP_CONFIGS for s in sweep_units(config, PUBLISH_SIM_SEEDS)]
    assert seeds == list(range(PUBLISH_SIM_SEEDS))


def _first_violation(kind: str = "", budget: int = DEFECT_SEED_BUDGET):
    """The first seed whose violations include one that mentions ``kind``."""
    for seed in range(budget):
        result = run_seed(seed)
        if any(kind in v for v in result.violations):
            return seed, result
    return None, None


def test_without_content_ranges_acknowledged_messages_are_lost(monkeypatch):
    """The chaos loss under load: decided by id alone, the C++ client's reused ids are answered
    as duplicates of stored ones."""
    monkeypatch.setattr(DedupState, "on_session_start", lambda self, name, reconnect: self.last_sequence_id(name))
    monkeypatch.setattr(DedupState, "open_after_load", lambda self, known: None)
    seed, result = _first_violation("acknowledged messages lost")
    assert seed is not None, f"no loss in {DEFECT_SEED_BUDGET} seeds without content ranges"
    print(f"found at seed {seed}: {result.violations}")


def test_without_holding_a_resend_behind_its_first_copy_messages_are_stored_twice(monkeypatch):
    """A resend whose first copy is still being written must wait for that copy's outcome."""
    monkeypatch.setattr(broker.publish_core, "_first_copy_of", lambda inflight, op, by_content: False)
    seed, result = _first_violation("stored twice")
    assert seed is not None, f"no duplicate in {DEFECT_SEED_BUDGET} seeds without holding resends"


def test_without_the_write_block_after_a_failed_add_order_breaks(monkeypatch):
    """After a failed add the topic refuses the producer's SENDs until its adds in flight are
    done (producers disconnected): else a later send is stored before the failed one's resend."""
    monkeypatch.setattr(PublishCore, "_block_writes", lambda self, error: None)
    seed, result = _first_violation("out of order")
    assert seed is not None, f"no order violation in {DEFECT_SEED_BUDGET} seeds without the write block"


def test_without_hole_tracking_or_content_ranges_acknowledged_messages_are_lost(monkeypatch):
    """An add that failed while later ones were stored leaves a hole: a resend into it must be
    stored, not answered as a duplicate because higher ids are stored. The content range above
    the last_sequence_id given (which is below the hole) covers a hole too, so both are off."""
    def on_failed_without_holes(self, name, first_sequence_id=None):
        self.pushed[name] = self.persisted.get(name, -1)
    monkeypatch.setattr(DedupState, "on_failed", on_failed_without_holes)
    monkeypatch.setattr(DedupState, "on_session_start", lambda self, name, reconnect: self.last_sequence_id(name))
    seed, result = _first_violation("acknowledged messages lost")
    assert seed is not None, f"no loss in {DEFECT_SEED_BUDGET} seeds without hole tracking"


def test_a_failing_seed_is_reported_with_its_replay_command(monkeypatch):
    monkeypatch.setattr(DedupState, "on_session_start", lambda self, name, reconnect: self.last_sequence_id(name))
    monkeypatch.setattr(DedupState, "open_after_load", lambda self, known: None)
    seed, _ = _first_violation()
    assert seed is not None
    with pytest.raises(SimulationViolation, match=rf"(?s)seed {seed}: .*replay: .*publish_sim --seed {seed} --trace"):
        check_seed(seed)


def test_same_seed_same_trace():
    for seed in (0, 1, 17, 4242):
        assert run_seed(seed).trace == run_seed(seed).trace
    assert run_seed(1).trace != run_seed(2).trace


def test_the_simulation_exercises_every_fault():
    """Not a vacuous run: across a few seeds there are crashes, failed adds, duplicates answered,
    resets of the client's counter and acknowledged messages."""
    traces = [run_seed(seed) for seed in range(40)]
    text = "\n".join(line for r in traces for line in r.trace)
    assert sum(r.crashes for r in traces) > 0
    assert "adds failed" in text and "owned=False" in text and "send timeout" in text
    assert "at (-1, -1)" in text                         # duplicates answered
    assert "connection cut" in text and "closed by the broker" in text
    assert sum(r.acked for r in traces) > 1000


def test_without_learning_the_failed_adds_recovery_kept_resends_are_stored_twice(monkeypatch):
    """An add failed back to the topic may still be in the log (the recovery that closed its
    ledger kept it): unless deduplication learns it, the producer's resend is a second copy."""
    monkeypatch.setattr(PublishCore, "kept", lambda self, entries: 0)
    seed, result = _first_violation("stored twice")
    assert seed is not None, f"no duplicate in {DEFECT_SEED_BUDGET} seeds without learning kept adds"


def test_lifting_the_write_block_before_the_rollover_ends_stores_resends_twice(monkeypatch):
    """The kept adds are known only once the rollover that the failure started has closed the
    ledger: resends decided before that are stored again."""
    def lift_when_no_add_in_flight(self):
        if self.write_state is WriteState.BLOCKED and self.adds_in_flight == 0:
            self.write_state = WriteState.OPEN
    monkeypatch.setattr(PublishCore, "_maybe_unblock", lift_when_no_add_in_flight)
    seed, result = _first_violation("stored twice")
    assert seed is not None, f"no duplicate in {DEFECT_SEED_BUDGET} seeds lifting the block early"
