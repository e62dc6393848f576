"""The seeded simulation of autorecovery (tests/sim/autorecovery_sim.py): a sweep of seeds per
configuration with every check on, and planted defects it must find.

Budget: AUTORECOVERY_SIM_SEEDS seeds per configuration (default 40, about 15 s for the four on
this machine; PULSARLITE_AUTORECOVERY_SIM_SEEDS for a longer soak). A failing seed is printed
with the command that replays it.

Planted defects (each in the real cores, each found within DEFECT_SEED_BUDGET seeds of some
configuration, and that seed is clean without it): a fragment copy reported done one entry
early; a worker that takes no lock; a worker deleting the mark without the version check; a
copy that does not verify the replicas' checksums; a worker that goes on after its session
expired during a pause. Not planted: ``apply_repair`` without its re-check. With the lock held
by every writer of a closed ledger's metadata and a worker abandoning its repairs when its
session is lost, nothing in this model changes a fragment under a repair, so the re-check never
fires (planting its removal: no seed of 200 per configuration failed). It remains the guard for
the window the model leaves out (a reply handled before the LOST notice).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from bookie.autorecovery import replication_core as rc

from . import background_sweep
from .autorecovery_sim import CONFIGS, SimulationViolation, check_seed, main, run_seed

SEEDS = background_sweep.BY_NAME["autorecovery"].seeds()      # PULSARLITE_AUTORECOVERY_SIM_SEEDS, default 40
DEFECT_SEED_BUDGET = 60

pytestmark = pytest.mark.sim

# what the sweep of each configuration must have exercised, else a check could pass because
# its path never ran
COVERAGE = ("losses", "fragments_repaired", "ledgers_repaired", "worker_crashes", "copies_failed",
            "passes_retried", "replica_check_found", "replicas_rejected", "rots")
COVERAGE_ANY = ("crashes_mid_copy", "decommissions", "transient_downs", "long_downs", "returned_unmarked",
                "auditor_restarts",
                "unmark_refused",
                "short_answers", "entry_exists", "blocked", "worker_pauses", "sessions_expired_in_pause")


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_invariants_hold_over_a_sweep_of_seeds(config, request):
    """Every seed of 0..SEEDS-1 of this configuration: those the background finished while the
    rest of the session ran (tests/sim/background_sweep.py), the others here."""
    outcome = background_sweep.finish(request.config, "autorecovery", [config])
    print(outcome.line)
    assert len(outcome.results) == SEEDS
    background_sweep.check(outcome)         # names each failing seed with its replay command
    totals = outcome.stats()
    print(f"{config}: {totals}")
    missing = [k for k in COVERAGE if not totals.get(k)]
    assert not missing, f"{config}: the sweep never exercised {missing}"
    _ANY.update(k for k in COVERAGE_ANY if totals.get(k))


_ANY: set[str] = set()


def test_every_fault_kind_was_exercised_by_some_configuration():
    if len(_ANY) == 0:
        pytest.skip("the sweep did not run in this session")
    missing = [k for k in COVERAGE_ANY if k not in _ANY]
    assert not missing, f"no configuration exercised {missing}"


def test_same_seed_same_trace():
    a, b = run_seed(5, "e3w2a2n7"), run_seed(5, "e3w2a2n7")
    assert a.trace == b.trace and a.stats == b.stats
    assert run_seed(6, "e3w2a2n7").trace != a.trace


def test_replay_from_the_command_line(capsys):
    assert main(["--seed", "3", "--config", "e3w2a2n7"]) == 0
    out = capsys.readouterr().out
    assert "seed 3 e3w2a2n7: OK" in out


def _first_failing_seed(**overrides) -> tuple[int, str, list[str]]:
    for config in sorted(CONFIGS):
        for seed in range(DEFECT_SEED_BUDGET):
            result = run_seed(seed, config, **overrides)
            if not result.ok:
                return seed, config, result.violations
    raise AssertionError(f"the planted defect was not found in {DEFECT_SEED_BUDGET} seeds of each configuration")


def _found_then_clean(monkeypatch, expect: str) -> None:
    seed, config, violations = _first_failing_seed()
    assert any(expect in v for v in violations), violations[:5]
    with pytest.raises(SimulationViolation, match=f"replay with `python -m tests.sim.autorecovery_sim --seed {seed}"):
        check_seed(seed, config)
    monkeypatch.undo()
    check_seed(seed, config)


def test_planted_copy_done_one_entry_early_is_caught(monkeypatch):
    real = rc.FragmentCopy.on_written

    def early(self, entry, ok, problem=""):
        out = real(self, entry, ok, problem)
        if self.state is rc.CopyState.COPYING and ok and len(self._acked) == len(self.repair.entries) - 1:
            self.state = rc.CopyState.DONE
            return [rc.CopyDone(self.repair, self.bytes_copied)]
        return out
    monkeypatch.setattr(rc.FragmentCopy, "on_written", early)
    _found_then_clean(monkeypatch, "which lacks it (invariant 10)")


def test_planted_worker_without_the_lock_is_caught(monkeypatch):
    real = rc.LedgerRepair.on_lock
    monkeypatch.setattr(rc.LedgerRepair, "on_lock", lambda self, taken: real(self, True))
    _found_then_clean(monkeypatch, "is copying it")


def test_planted_unmark_without_the_version_check_is_caught(monkeypatch):
    real = rc.LedgerRepair.on_mark

    def blind(self, mark, version):
        out = real(self, mark, version)
        self.mark_version = -1           # delete whatever the mark holds now
        return out
    monkeypatch.setattr(rc.LedgerRepair, "on_mark", blind)
    _found_then_clean(monkeypatch, "deleted the mark")


def test_planted_copy_without_the_checksum_check_is_caught(monkeypatch):
    monkeypatch.setattr(rc.FragmentCopy, "_usable", lambda self, entry, entry_id:
                        entry.ledger_id == self.repair.ledger_id and entry.entry_id == entry_id)
    _found_then_clean(monkeypatch, "which lacks it (invariant 10)")


def test_planted_worker_going_on_after_its_session_expired_is_caught():
    """A worker paused past the session timeout loses its locks; the shell abandons its repairs
    when it learns the session is LOST (worker.py ``on_session_state``). Switched off, it goes
    on copying a ledger another worker may hold now."""
    seed, config, violations = _first_failing_seed(abandon_on_session_loss=False)
    assert any("without the ledger's lock" in v or "is copying it" in v for v in violations)
    check_seed(seed, config)            # clean with the shell's reaction


def test_without_a_replica_check_a_rotten_copy_stays_and_the_final_check_says_so():
    """The final check is not vacuous: with the replica check off, some seed ends with a
    rotten copy on a named bookie."""
    for seed in range(DEFECT_SEED_BUDGET):
        result = run_seed(seed, "e3w2a2n7", replica_check_interval_ms=10 ** 9, quiet_ms_max=5_000)
        if any("good copies" in v for v in result.violations):
            return
    raise AssertionError("no seed ended with a rotten copy left")


def test_configs_are_consistent():
    for c in CONFIGS.values():
        assert c.ensemble_size >= c.write_quorum >= c.ack_quorum >= 2, c.name
        assert c.bookies >= c.ensemble_size + 2, c.name
        assert replace(c) == c
