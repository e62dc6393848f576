"""The mechanism that runs the simulation sweeps beside the session (tests/sim/background_sweep.py):
a failure found by the background fails the sweep's test with its seed, configuration and replay
command; the test runs every unit the background did not finish; the background skips units a
test claimed; results round-trip unchanged."""

from __future__ import annotations

import shutil

import pytest

from . import background_sweep as bs
from .autorecovery_sim import replay_command, run_seed

pytestmark = pytest.mark.sim

NAME, CONFIG = "autorecovery", "e3w2a2n7"


@pytest.fixture
def four_seeds(monkeypatch):
    monkeypatch.setenv(bs.BY_NAME[NAME].seeds_variable, "4")


def _background(tmp_path, lines: list[str]) -> bs.Background:
    """A session's background that has written ``lines`` (its process not started)."""
    background = bs.Background([(NAME, CONFIG)], directory=tmp_path)
    (tmp_path / "results.jsonl").write_text("".join(lines))
    return background


def test_a_failure_found_in_the_background_fails_the_test_naming_its_seed_and_replay(tmp_path, four_seeds):
    real = [bs.run_unit(bs.BY_NAME[NAME], CONFIG, seed) for seed in range(4)]
    assert all(r.ok for r in real)
    bad = bs.UnitResult(NAME, CONFIG, 2, ("acknowledged entry lost",), {}, replay_command(2, run_seed(2, CONFIG).config))
    outcome = bs.finish_with(_background(tmp_path, [real[0].to_line(), real[1].to_line(), bad.to_line(),
                                                    real[3].to_line()]), NAME, [CONFIG])
    assert outcome.here == 0 and outcome.in_background == 4
    with pytest.raises(AssertionError, match=r"(?s)1 of 4 seeds.*seed 2 config e3w2a2n7: acknowledged entry lost"
                                             r".*replay: python -m tests\.sim\.autorecovery_sim --seed 2 "
                                             r"--config e3w2a2n7 --trace"):
        bs.check(outcome)


def test_units_the_background_did_not_finish_run_in_the_test(tmp_path, four_seeds):
    """The background finished seed 0 and a line cut while written (seed 1): 1-3 run here, and
    each was claimed first (so a live background would skip them)."""
    first = bs.run_unit(bs.BY_NAME[NAME], CONFIG, 0)
    cut = bs.run_unit(bs.BY_NAME[NAME], CONFIG, 1).to_line()[:-10]
    background = _background(tmp_path, [first.to_line(), cut])
    outcome = bs.finish_with(background, NAME, [CONFIG])
    assert [r.seed for r in outcome.results] == [0, 1, 2, 3]
    assert outcome.here == 3 and outcome.in_background == 1
    assert sorted((tmp_path / "claims.txt").read_text().splitlines()) == [f"{NAME} {CONFIG} {s}" for s in (1, 2, 3)]
    assert outcome.stats() == _summed(range(4))
    assert not outcome.failures and background.pending == set()


def _summed(seeds) -> dict[str, int]:
    totals: dict[str, int] = {}
    for seed in seeds:
        for k, v in run_seed(seed, CONFIG).stats.items():
            totals[k] = totals.get(k, 0) + v
    return totals


def test_without_a_background_every_unit_runs_in_the_test(four_seeds):
    outcome = bs.finish_with(None, NAME, [CONFIG])
    assert outcome.here == 4 and [r.seed for r in outcome.results] == [0, 1, 2, 3]
    assert [r.stats for r in outcome.results] == [run_seed(s, CONFIG).stats for s in range(4)]


def test_the_background_process_skips_claimed_units(tmp_path, four_seeds):
    (tmp_path / "claims.txt").write_text(f"{NAME} {CONFIG} 1\n{NAME} {CONFIG} 3\n")
    assert bs.main(["--results", str(tmp_path), f"--run={NAME}:{CONFIG}"]) == 0
    written = [bs.UnitResult.from_line(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r.seed for r in written] == [0, 2]
    assert written[1] == bs.run_unit(bs.BY_NAME[NAME], CONFIG, 2)


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        bs.main(["--results", str(tmp_path), "--run=nosuch:x"])
    with pytest.raises(SystemExit):
        bs.main(["--results", str(tmp_path), f"--run={NAME}:nosuch"])
    assert not (tmp_path / "results.jsonl").exists()


def test_every_sweep_module_provides_its_configurations_and_units():
    for sweep in bs.SWEEPS:
        module = bs._module(sweep)
        assert module.SWEEP_CONFIGS
        violations, stats, replay = module.sweep_seed(0, module.SWEEP_CONFIGS[0])
        assert violations == [] and isinstance(stats, dict) and "--seed 0" in replay


class _Item:
    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


class _PluginManager:
    def __init__(self) -> None:
        self.registered: list = []

    def get_plugin(self, name):
        return None

    def register(self, plugin, name):
        self.registered.append(name)


class _Config:
    """What order_and_start reads of pytest's config; ``worker``: a pytest-xdist worker's."""

    def __init__(self, worker: bool) -> None:
        self.pluginmanager = _PluginManager()
        self.option = type("Option", (), {"collectonly": False})()
        if worker:
            self.workerinput = {"workerid": "gw0"}


def _session_items() -> list[_Item]:
    return [_Item("tests/unit/test_a.py::test_x"),
            *(_Item(s.test) for s in bs.SWEEPS),
            *(_Item(t) for s in bs.SWEEPS for t in s.after),
            _Item("tests/integration/test_b.py::test_y")]


def test_in_an_xdist_worker_the_sweeps_come_first_longest_first_without_a_background(monkeypatch):
    started = []
    monkeypatch.setattr(bs.Background, "start", lambda self: started.append(self))
    items = _session_items()
    config = _Config(worker=True)
    bs.order_and_start(config, items)
    ids = [item.nodeid for item in items]
    sweeps_first = [s.test for s in reversed(bs.SWEEPS)]
    assert ids[:len(bs.SWEEPS)] == sweeps_first and sweeps_first[0].endswith("test_whole_path_sim.py"
                                                                             "::test_every_seed_keeps_the_whole_path_invariants")
    assert ids[-2:] == ["tests/unit/test_a.py::test_x", "tests/integration/test_b.py::test_y"]
    assert started == [] and config.pluginmanager.registered == []


def test_in_one_process_the_sweeps_come_last_with_a_background(monkeypatch):
    started = []
    monkeypatch.setattr(bs.Background, "start", lambda self: started.append(self))
    monkeypatch.delenv("PULSARLITE_SIM_BACKGROUND", raising=False)
    monkeypatch.delenv("PULSARLITE_WHOLE_PATH_BACKGROUND", raising=False)
    items = _session_items()
    config = _Config(worker=False)
    bs.order_and_start(config, items)
    ids = [item.nodeid for item in items]
    assert ids[:2] == ["tests/unit/test_a.py::test_x", "tests/integration/test_b.py::test_y"]
    assert ids[2:2 + len(bs.SWEEPS)] == [s.test for s in bs.SWEEPS]
    assert len(started) == 1 and config.pluginmanager.registered == [bs.PLUGIN_NAME]
    shutil.rmtree(started[0].directory)
