"""Seeded simulations of the write and recovery cores (tests/sim/simulator.py).

Budget: SIM_SEEDS seeds per configuration (default 1000 over 8 configurations, ~25 s: the
suite's time budget; every rare path of COVERAGE is still exercised; override with the
environment variable PULSARLITE_SIM_SEEDS, or `make sim-ledger SEEDS=N` for a longer soak). A failing seed is printed with the command that replays it.
In a session with other tests the seeds run in the background beside them and the sweep tests,
moved to the end, run what the background did not (tests/sim/background_sweep.py).

Planted defects (each test plants one, in the real code or the simulation, and shows the
simulation finds it within DEFECT_SEED_BUDGET seeds, then that the same seed is clean without
it): recovery reads without the fence flag (TLA+ defect 1); the writer reporting its own
close after losing the close CAS to another close; a recovery reporting its own close after
losing; the add path sending a LAC one too high; coalesced acks counted as
cumulative; a non-recovery reader readable up to LAC + 1; a non-recovery open sending the
fence flag; a wiped bookie rejoining under its old id (no cookie check); recovery that cannot
change the ensemble (Qw == Qa with a bookie lost for good: it never finishes); recovery reading
from the LAC instead of the writer's last fragment (TLA+ defect 2).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from bookie.client import ledger_client as ledger_client_module
from bookie.client import reader as reader_module
from bookie.client.actions import CloseDone, CloseFailed, RecoveryDone, SendAddRun
from bookie.client.metadata import LedgerMetadata, LedgerState
from bookie.client.reader import LedgerReader
from bookie.client.recovery_core import LedgerRecoveryCore
from bookie.client.write_core import LedgerWriteCore

from . import background_sweep
from .simulator import CONFIGS, QW_EQUALS_QA_LOSSES, SimulationViolation, check_seed, run_seed

SIM_SEEDS = background_sweep.BY_NAME["ledger"].seeds()      # PULSARLITE_SIM_SEEDS
SIM_SEEDS_DEFAULT = background_sweep.BY_NAME["ledger"].seeds_default      # 1,000
DEFECT_SEED_BUDGET = 1500

pytestmark = pytest.mark.sim

# What the seeds of each configuration must have exercised (summed SimResult.stats): else a
# check could pass because its path never ran.
COVERAGE = ("runs", "tailer_entries", "no_takeover", "duplicates", "metadata_unknown", "writer_cuts",
            "writer_stalls", "writer_close_lost_elsewhere")
COVERAGE_IF = {"lost": "lost_for_good_probability", "wiped": "wiped_probability"}
# with Qw == Qa a bookie lost for good is survived only through recovery's ensemble change
# (and recoveries racing: one takes over the ensembles another one changed)
COVERAGE_QW_EQUALS_QA_LOSSES = ("recovery_ensemble_changes", "recovery_took_over_ensembles")


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_invariants_hold_with_both_fixes(config, request):
    """Every seed of 0..SIM_SEEDS-1 of this configuration: those the background finished while
    the rest of the session ran (tests/sim/background_sweep.py), the others here."""
    outcome = background_sweep.finish(request.config, "ledger", [config])
    print(outcome.line)
    assert len(outcome.results) == SIM_SEEDS
    background_sweep.check(outcome)         # names each failing seed with its replay command
    totals = outcome.stats()
    print(f"{config}: {totals}")
    if SIM_SEEDS >= SIM_SEEDS_DEFAULT:         # fewer seeds (a quick run) may miss rare paths
        expected = list(COVERAGE) + [k for k, knob in COVERAGE_IF.items() if getattr(CONFIGS[config], knob) > 0]
        if config in QW_EQUALS_QA_LOSSES:
            expected += COVERAGE_QW_EQUALS_QA_LOSSES
        missing = [k for k in expected if not totals.get(k)]
        assert not missing, f"{config}: {SIM_SEEDS} seeds never exercised {missing}: {totals}"


def find_defect(config: str, match: str, budget: int = DEFECT_SEED_BUDGET, **overrides):
    """The first seed whose run has a violation containing ``match`` (fails the test if none
    within ``budget`` seeds): (seed, result)."""
    for seed in range(budget):
        result = run_seed(seed, config, **overrides)
        if any(match in v for v in result.violations):
            print(f"{config}: found at seed {seed} ({seed + 1} seeds tried): {result.violations[:3]}")
            return seed, result
    pytest.fail(f"{config}: planted defect not found in {budget} seeds (looking for {match!r})")


# With Qw = 3, Qa = 2 the schedule is rare (~1 seed in 500-1500: besides the lost fence, the
# bookie that acknowledged the entry answers recovery's read late and the third one lacks it),
# hence the larger budget there; with Qw = Qa = 2 one unfenced bookie is enough.
TLA_DEFECT_BUDGET = {"e3w2a2n4": DEFECT_SEED_BUDGET, "e3w3a2n3": 4000}


@pytest.mark.parametrize("config", ["e3w2a2n4", "e3w3a2n3"])
def test_without_fenced_recovery_reads_an_acknowledged_entry_is_lost(config):
    """TLA+ defect 1 (docs/protocol.md#recovery-fence-flag): fencing only through ReadLac is not
    enough. With one fence message lost, recovery reads NO_SUCH_ENTRY on the unfenced bookie, closes
    short, and the old writer then completes that entry on it: an acknowledged entry is lost."""
    budget = TLA_DEFECT_BUDGET[config]
    for seed in range(budget):
        result = run_seed(seed, config, fence_recovery_reads=False)
        if result.violations:
            break
    else:
        pytest.fail(f"{config}: no violation in {budget} seeds without fenced reads")
    assert any("acknowledged entry" in v and "beyond the closed ledger" in v
               for v in result.violations), result.violations
    assert result.closed is not None and result.confirmed_last > result.closed.last_entry_id
    print(f"{config}: defect found at seed {seed} ({seed + 1} seeds tried)")
    # the same schedule with the fix on is safe
    assert run_seed(seed, config, fence_recovery_reads=True).ok


def test_a_failing_seed_is_reported_with_its_replay_command():
    seed = next(s for s in range(DEFECT_SEED_BUDGET)
                if not run_seed(s, "e3w2a2n4", fence_recovery_reads=False).ok)
    with pytest.raises(SimulationViolation, match=rf"seed {seed} config e3w2a2n4.*--no-fence-reads"):
        check_seed(seed, "e3w2a2n4", fence_recovery_reads=False)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_same_seed_same_trace(config):
    for seed in (0, 1, 17, 4242):
        first, second = run_seed(seed, config), run_seed(seed, config)
        assert first.trace == second.trace
        assert first.trace_digest() == second.trace_digest()
    # and a different seed gives a different run
    assert run_seed(1, config).trace != run_seed(2, config).trace


def test_defect_replays_identically():
    seed = next(s for s in range(DEFECT_SEED_BUDGET)
                if not run_seed(s, "e3w2a2n4", fence_recovery_reads=False).ok)
    a = run_seed(seed, "e3w2a2n4", fence_recovery_reads=False)
    b = run_seed(seed, "e3w2a2n4", fence_recovery_reads=False)
    assert a.violations == b.violations and a.trace == b.trace


# -- planted defects ------------------------------------------------------------------------

def _writer_reports_its_own_close(original):
    def mutant(self, current):
        actions = original(self, current)
        if current.is_closed and any(isinstance(a, CloseFailed) for a in actions):
            return [CloseDone(self._closing_md)]        # "closed", at its own last entry
        return actions
    return mutant


@pytest.mark.parametrize("config", ["e3w3a2n3", "e3w3a2n5", "e3w2a2n3-chaos"])
def test_planted_writer_reporting_its_own_close_after_a_lost_cas_is_caught(config, monkeypatch):
    """The write core's close CAS loses to a recovery that closed the ledger at another last
    entry (the writer's adds had failed, recovery kept some of them); the mutant reports
    CloseDone at its own last entry instead of CloseFailed. Caught: what every client reports
    after a close must equal the stored metadata."""
    monkeypatch.setattr(LedgerWriteCore, "_close_conflict",
                        _writer_reports_its_own_close(LedgerWriteCore._close_conflict))
    seed, result = find_defect(config, "writer (CloseDone) reports the ledger closed at")
    assert result.closed is not None
    monkeypatch.undo()
    assert run_seed(seed, config).ok


def test_planted_recovery_reporting_its_own_close_after_a_lost_cas_is_caught(monkeypatch):
    """Two recoveries; the one that loses the close CAS reports its own close point."""
    original = LedgerRecoveryCore.on_metadata_conflict

    def mutant(self, current, writable_bookies, rng):
        return [RecoveryDone(self._closing_md) if isinstance(a, RecoveryDone) else a
                for a in original(self, current, writable_bookies, rng)]
    monkeypatch.setattr(LedgerRecoveryCore, "on_metadata_conflict", mutant)
    seed, _ = find_defect("e3w3a2n3", "(RecoveryDone) reports the ledger closed at")
    monkeypatch.undo()
    assert run_seed(seed, "e3w3a2n3").ok


def _run_lac_one_too_high(original):
    def mutant(self, payloads, now_ms):
        first, actions = original(self, payloads, now_ms)
        return first, [a._replace(lac=a.lac + 1) if type(a) is SendAddRun else a for a in actions]
    return mutant


@pytest.mark.parametrize("config", ["e3w3a2n3", "e3w2a2n4", "e4w3a2n5"])
def test_planted_wrong_lac_on_the_batched_add_path_is_caught(config, monkeypatch):
    """The write core's add (every add path) sends its run carrying LAC + 1: the entry at that
    LAC is not confirmed, yet readers may read it and recovery starts past it. Caught at once
    by the check of the LAC every sent entry carries, and, without that check, by the final
    invariants (an entry of the closed ledger on fewer than Qa bookies, a tailing reader
    reading past the writer's LAC)."""
    monkeypatch.setattr(LedgerWriteCore, "add", _run_lac_one_too_high(LedgerWriteCore.add))
    seed, _ = find_defect(config, "but only")          # "writer sends entry E with LAC L, but only ..."
    # the deeper checks find it too
    deeper = ("durable on", "beyond the writer's LAC", "acknowledged entry", "unreadable")
    for seed in range(DEFECT_SEED_BUDGET):
        result = run_seed(seed, config)
        if any(d in v for v in result.violations for d in deeper):
            print(f"{config}: found by the final invariants at seed {seed}: {result.violations[-2:]}")
            break
    else:
        pytest.fail(f"{config}: the final invariants never saw the batched LAC defect")
    monkeypatch.undo()
    assert run_seed(seed, config).ok


def test_planted_coalesced_acks_taken_as_cumulative_are_caught(monkeypatch):
    """on_add_acks (the shell's path for OK answers, and the only one for runs) counting an
    ack for entry e as an ack for every pending entry below it."""
    original = LedgerWriteCore.on_add_acks

    def mutant(self, bookie, entry_ids):
        if entry_ids:
            entry_ids = [e for e in self._pending if e <= max(entry_ids)]
        return original(self, bookie, entry_ids)
    monkeypatch.setattr(LedgerWriteCore, "on_add_acks", mutant)
    seed, _ = find_defect("e3w3a2n3", "durable on")
    monkeypatch.undo()
    assert run_seed(seed, "e3w3a2n3").ok


def _readable_through_lac_plus_one(self) -> int:
    if self.metadata.state is LedgerState.CLOSED:
        return self.metadata.last_entry_id
    return self.last_add_confirmed + 1


@pytest.mark.parametrize("config", ["e3w3a2n3", "e3w2a2n4"])
def test_planted_reader_beyond_the_lac_of_an_open_ledger_is_caught(config, monkeypatch):
    """LedgerReader lets a non-recovery reader of an open ledger read through LAC + 1 (the
    tailing readers run the real reader code)."""
    monkeypatch.setattr(LedgerReader, "last_readable_entry_id", property(_readable_through_lac_plus_one))
    seed, _ = find_defect(config, "beyond the writer's LAC")
    monkeypatch.undo()
    assert run_seed(seed, config).ok


@pytest.mark.parametrize("where", ["open", "refresh"])
def test_planted_non_recovery_open_sending_the_fence_flag_is_caught(where, monkeypatch):
    """LedgerClient.open_ledger(recovery=False) (or LedgerReader.refresh_lac) reads the LAC with
    the fence flag. Caught by the check of what a non-recovery client sends and, in seeds with
    no takeover, by its effect: the writer is fenced though nobody recovered its ledger."""
    real_read_lac = reader_module.read_lac

    async def fencing_read_lac(metadata, pool, *, fence):
        return await real_read_lac(metadata, pool, fence=True)
    monkeypatch.setattr(ledger_client_module if where == "open" else reader_module, "read_lac", fencing_read_lac)
    seed, _ = find_defect("e3w3a2n3", "sent the fence flag")
    find_defect("e3w3a2n3", "no takeover, yet the writer's ledger was fenced")
    monkeypatch.undo()
    assert run_seed(seed, "e3w3a2n3").ok


def test_a_wiped_bookie_rejoining_without_the_cookie_check_is_caught():
    """The simulation's own fault model, planted: a bookie whose disk was wiped rejoins under
    its old id (the real bookie refuses to start: tests/integration/test_ledgers.py,
    test_bookie_with_wiped_disk_refuses_to_start). Its entries and its fence flag are gone:
    entries of the closed ledger lose copies nobody knows about, and acknowledged entries are
    lost."""
    find_defect("e3w3a2n5", "Qa bookies", wiped_probability=1.0, wiped_rejoins=True)
    seed, _ = find_defect("e3w3a2n5", "acknowledged entry", wiped_probability=1.0, wiped_rejoins=True)
    assert run_seed(seed, "e3w3a2n5", wiped_probability=1.0).ok     # with the cookie check: fine


# -- recovery's ensemble change ---------------------------------------------------------------

@pytest.mark.parametrize("config", QW_EQUALS_QA_LOSSES)
def test_without_recovery_ensemble_change_a_bookie_lost_for_good_blocks_recovery(config):
    """The liveness limit of old: with Qw == Qa, an entry whose write set holds a bookie lost
    for good cannot be re-written to Qa bookies unless recovery replaces that bookie; with the
    ensemble change switched off the ledger stays IN_RECOVERY (every attempt fails) on some
    seeds, and the same seeds finish with it on."""
    blocked = []
    for seed in range(DEFECT_SEED_BUDGET):
        result = run_seed(seed, config, recovery_ensemble_change=False)
        if any("ledger not closed at the end" in v for v in result.violations):
            blocked.append(seed)
            if len(blocked) == 3:
                break
    assert blocked, f"{config}: no seed in {DEFECT_SEED_BUDGET} blocked without recovery's ensemble change"
    print(f"{config}: blocked without the ensemble change at seeds {blocked}")
    for seed in blocked:
        result = run_seed(seed, config)
        assert result.ok, result.violations
        assert result.stats.get("recovery_ensemble_changes", 0) >= 1


def _recovery_ensemble_below_the_writers_fragment_allowed(self, first_entry_id, bookies):
    """LedgerMetadata.with_recovery_ensemble without its check that the new fragment lies in
    the writer's last fragment or above."""
    kept = tuple(f for f in self.ensembles if f[0] < first_entry_id)
    return replace(self, ensembles=kept + ((first_entry_id, tuple(bookies)),),
                   writer_fragment=self.recovery_writer_fragment)


@pytest.mark.parametrize("config", ["e3w2a2n4", "e3w2a2n4-chaos"])
def test_planted_recovery_from_the_lac_is_caught(config, monkeypatch):
    """TLA+ defect 2 (docs/protocol.md#recovery-last-fragment): recovery must only recover the
    writer's last fragment, reading
    from max(LAC, its first entry - 1) + 1. Planted: reading from LAC + 1. Now that recovery
    changes the ensemble, a re-write below the writer's last fragment can fail and ask for a
    fragment there: caught by the metadata transform's check ("an invalid fragment"); with that
    check removed as well, by the final invariants (entries of the closed ledger on fewer than
    Qa bookies of their write sets). The same seeds are clean with fix 2."""
    seed, _ = find_defect(config, "below the writer's last fragment", recover_from_last_fragment=False)
    assert run_seed(seed, config).ok
    monkeypatch.setattr(LedgerMetadata, "with_recovery_ensemble",
                        _recovery_ensemble_below_the_writers_fragment_allowed)
    seed, _ = find_defect(config, "< Qa bookies", recover_from_last_fragment=False)
    monkeypatch.undo()
    assert run_seed(seed, config).ok
