"""The simulation sweeps, run beside the rest of the test session: one mechanism for all of them.

A sweep is a fixed set of units, each one seed of one configuration of a seeded simulation
(SWEEPS below: the ledger write/recovery simulation, autorecovery, the publish path, the whole
publish path). Each is CPU-bound (a seed costs ~2-25 ms; the four sweeps are ~5-6 min of one
core in all), while most of the suite (clusters of processes, fuzzing, chaos) leaves a core idle
much of the time.

How a session of one process runs them (a session of pytest-xdist workers, as scripts/test.sh
runs it, has no background: each sweep runs in its tests, which come first; ``order_and_start``):

1. Collection (the root conftest): every collected test that finishes a sweep (``Sweep.test``;
   a test parametrized by ``config`` finishes that configuration only) moves to the end of the
   session, in its collected order. If the session holds other tests too, ONE background process
   starts, ``python -m tests.sim.background_sweep --results DIR --run NAME:CONFIG,... ...``, at
   the lowest CPU priority (``nice -n 19``: it takes only what the tests leave), and runs the
   units of those (sweep, configuration)s, starting with the one finished LAST (the whole path's
   single test, the longest), each configuration's seeds forward, writing one JSON line per
   finished unit to ``DIR/results.jsonl``.
2. The finishing test (:func:`finish`) reads what the background finished and runs every unit
   it did not, in-process, from the LAST one backwards, re-reading the results after each unit:
   the background (on the other core, at the session's end) and the test meet in the middle.
   A sweep too long for one test (the publish path's 10,000 seeds) is cut into chunks, one test
   each (``sweep_units``), so that a test's share stays within the per-test timeout when the
   background got little CPU.
   Before it runs a unit the test claims it (``DIR/claims.txt``), and the background skips
   claimed units, so neither repeats the other's work. The session always covers every unit,
   whatever the machine's load: only where each unit runs changes.
3. The test fails naming every failing seed and configuration with its replay command; the
   results carry each unit's counters, so coverage checks over the summed counters still hold.
   The background process is ended (by its pid) once every (sweep, configuration) it was given
   is finished, and at the session's end in any case.

Without a background (``PULSARLITE_SIM_BACKGROUND=0``, or a session of sweep tests alone) the
test runs every unit itself, as before. Seed counts: each sweep's environment variable
(``Sweep.seeds_variable``); the background inherits the session's environment, so both sides
compute the same units. Each simulation module provides the two names a sweep needs:
``SWEEP_CONFIGS`` (its configuration names) and ``sweep_seed(seed, config) -> (violations,
counters, replay command)``. Planted-defect tests never go through here: they patch the code in
the test's own process.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

PLUGIN_NAME = "pulsarlite-simulation-sweeps"      # how a finishing test finds the session's background
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Sweep:
    name: str
    test: str               # node id of the test that finishes it (parametrized: by ``config``)
    module: str             # the simulation module (in tests/sim): SWEEP_CONFIGS and sweep_seed
    seeds_variable: str     # environment variable with the seed count per configuration
    seeds_default: int
    after: tuple[str, ...] = ()     # node ids of tests that read its results: moved after it

    def seeds(self) -> int:
        return int(os.environ.get(self.seeds_variable, str(self.seeds_default)))


SWEEPS: tuple[Sweep, ...] = (
    Sweep("autorecovery", "tests/sim/test_autorecovery_sim.py::test_invariants_hold_over_a_sweep_of_seeds",
          "autorecovery_sim", "PULSARLITE_AUTORECOVERY_SIM_SEEDS", 40,
          after=("tests/sim/test_autorecovery_sim.py::test_every_fault_kind_was_exercised_by_some_configuration",)),
    Sweep("publish", "tests/sim/test_publish_sim.py::test_every_seed_keeps_the_publish_invariants",
          "publish_sim", "PULSARLITE_PUBLISH_SIM_SEEDS", 10_000),
    Sweep("ledger", "tests/sim/test_simulation.py::test_invariants_hold_with_both_fixes",
          "simulator", "PULSARLITE_SIM_SEEDS", 1_000),
    Sweep("whole-path", "tests/sim/test_whole_path_sim.py::test_every_seed_keeps_the_whole_path_invariants",
          "whole_path_sim", "PULSARLITE_WHOLE_PATH_SEEDS", 10_000),
)
BY_NAME = {s.name: s for s in SWEEPS}


def sweep_of(nodeid: str) -> Sweep | None:
    """The sweep a collected test finishes (its node id, parameters aside), if any."""
    base = nodeid.split("[", 1)[0]
    return next((s for s in SWEEPS if base == s.test or base.endswith("/" + s.test)), None)


def _follows_a_sweep(nodeid: str) -> bool:
    base = nodeid.split("[", 1)[0]
    return any(base == t or base.endswith("/" + t) for s in SWEEPS for t in s.after)


def wanted() -> bool:
    """PULSARLITE_SIM_BACKGROUND=0 (or the older PULSARLITE_WHOLE_PATH_BACKGROUND=0): every unit
    runs in its test."""
    return all(os.environ.get(v, "1") != "0" for v in ("PULSARLITE_SIM_BACKGROUND",
                                                        "PULSARLITE_WHOLE_PATH_BACKGROUND"))


def _module(sweep: Sweep):
    """The simulation module, under this module's own package (``sim`` in a pytest session,
    ``tests.sim`` in the background process): the same module object the tests patch."""
    return importlib.import_module(f"{__package__}.{sweep.module}")


def units(sweep: Sweep, config: str) -> list[int]:
    """The seeds of one configuration: 0..seeds-1, or the module's ``sweep_units(config,
    seeds)`` (a sweep of one configuration cut into chunks, one test each)."""
    split = getattr(_module(sweep), "sweep_units", None)
    return list(split(config, sweep.seeds())) if split is not None else list(range(sweep.seeds()))


@dataclass(frozen=True)
class UnitResult:
    sweep: str
    config: str
    seed: int
    violations: tuple[str, ...]
    stats: dict[str, int]
    replay: str

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_line(self) -> str:
        return json.dumps({"sweep": self.sweep, "config": self.config, "seed": self.seed,
                           "violations": list(self.violations), "stats": self.stats,
                           "replay": self.replay}) + "\n"

    @classmethod
    def from_line(cls, line: str) -> UnitResult:
        d = json.loads(line)
        return cls(d["sweep"], d["config"], d["seed"], tuple(d["violations"]), d["stats"], d["replay"])


def run_unit(sweep: Sweep, config: str, seed: int) -> UnitResult:
    violations, stats, replay = _module(sweep).sweep_seed(seed, config)
    return UnitResult(sweep.name, config, seed, tuple(violations), dict(stats), replay)


class _Tail:
    """Reads the complete lines appended to a file since the last call (a cut line waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self._offset += end
        return data[:end].decode(errors="replace").splitlines()


# -- the background process -------------------------------------------------------------------

def _background(results: Path, claims: Path, runs: list[tuple[Sweep, str]]) -> int:
    claimed: set[tuple[str, str, int]] = set()
    tail = _Tail(claims)
    with open(results, "a", buffering=1) as out:
        for sweep, config in runs:
            for seed in units(sweep, config):
                for line in tail.lines():
                    name, cfg, s = line.rsplit(" ", 2)
                    claimed.add((name, cfg, int(s)))
                if (sweep.name, config, seed) in claimed:
                    continue
                out.write(run_unit(sweep, config, seed).to_line())
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim.background_sweep",
                                description="run simulation sweeps, one JSON line per seed (see the docstring)")
    p.add_argument("--results", required=True, help="a directory: results.jsonl is written, claims.txt read")
    p.add_argument("--run", action="append", default=[], metavar="SWEEP:CONFIG,CONFIG",
                   help=f"a sweep ({', '.join(BY_NAME)}) and its configurations, in order")
    args = p.parse_args(argv)
    runs = []
    for item in args.run:
        name, _, configs = item.partition(":")
        if name not in BY_NAME:
            p.error(f"no sweep {name!r}")
        known = _module(BY_NAME[name]).SWEEP_CONFIGS
        for config in configs.split(","):
            if config not in known:
                p.error(f"sweep {name}: no configuration {config!r} (known: {', '.join(known)})")
            runs.append((BY_NAME[name], config))
    directory = Path(args.results)
    return _background(directory / "results.jsonl", directory / "claims.txt", runs)


@dataclass
class Background:
    """The session's background process and what it finished so far."""
    runs: list[tuple[str, str]]                 # (sweep, config) in the order it runs them
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="pulsarlite-sweeps-")))
    process: subprocess.Popen | None = None
    start_s: float = 0.0
    done: dict[tuple[str, str, int], UnitResult] = field(default_factory=dict)
    pending: set[tuple[str, str]] = field(default_factory=set)
    error: str = ""
    summary: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._tail = _Tail(self.directory / "results.jsonl")
        self.pending = set(self.runs)

    def start(self) -> None:
        grouped: list[tuple[str, list[str]]] = []
        for name, config in self.runs:
            if grouped and grouped[-1][0] == name:
                grouped[-1][1].append(config)
            else:
                grouped.append((name, [config]))
        args = [f"--run={name}:{','.join(configs)}" for name, configs in grouped]
        with open(self.directory / "stderr.txt", "wb") as err:
            self.process = subprocess.Popen(
                ["nice", "-n", "19", sys.executable, "-m", "tests.sim.background_sweep",
                 "--results", str(self.directory), *args],
                cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        self.start_s = time.monotonic()

    def read(self) -> None:
        """Take in the units finished since the last read; note an exit with an error."""
        for line in self._tail.lines():
            r = UnitResult.from_line(line)
            self.done[(r.sweep, r.config, r.seed)] = r
        if self.process is not None and self.process.poll() not in (None, 0) and not self.error:
            self.error = (self.directory / "stderr.txt").read_text(errors="replace")[-2000:] or "exited"

    def claim(self, sweep: str, config: str, seed: int) -> None:
        with open(self.directory / "claims.txt", "a") as f:
            f.write(f"{sweep} {config} {seed}\n")

    def finished(self, sweep: str, config: str) -> None:
        self.pending.discard((sweep, config))
        if not self.pending:
            self.stop()

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


class SweepPlugin:
    """Registered with pytest's plugin manager for the session by the root conftest."""

    def __init__(self, background: Background) -> None:
        self.background = background

    def pytest_terminal_summary(self, terminalreporter):
        if self.background.summary:
            terminalreporter.section("simulation sweeps")
            for line in self.background.summary:
                terminalreporter.write_line(line)

    def pytest_sessionfinish(self, session, exitstatus):
        self.background.stop()
        shutil.rmtree(self.background.directory, ignore_errors=True)


def order_and_start(session_config, items: list) -> None:
    """The root conftest's collection hook: move every sweep-finishing test to the end (in its
    collected order) and, when the session has other tests too, start the background for the
    (sweep, configuration)s those tests finish."""
    finishing = [item for item in items if sweep_of(item.nodeid) is not None]
    if not finishing:
        return
    following = [item for item in items if _follows_a_sweep(item.nodeid)]
    rest = [item for item in items if sweep_of(item.nodeid) is None and item not in following]
    if hasattr(session_config, "workerinput"):
        # a pytest-xdist worker (scripts/test.sh runs two): the workers share the machine's two
        # cores, so there is no idle core for a background; the sweeps run in their tests, and
        # their modules come FIRST (longest work first: `--dist loadfile --no-loadscope-reorder`
        # hands out whole modules in this order, so the other worker runs the rest meanwhile)
        longest_first = [s.name for s in reversed(SWEEPS)]      # the whole path's ~4 min first
        finishing.sort(key=lambda item: longest_first.index(sweep_of(item.nodeid).name))
        items[:] = finishing + following + rest
        return
    items[:] = rest + finishing + following
    if (session_config.option.collectonly or len(items) <= 1 or not wanted()
            or session_config.pluginmanager.get_plugin(PLUGIN_NAME) is not None):
        return
    runs: list[tuple[str, str]] = []
    for item in finishing:
        sweep = sweep_of(item.nodeid)
        callspec = getattr(item, "callspec", None)
        config = callspec.params.get("config") if callspec is not None else None
        configs = [config] if config is not None else list(_module(sweep).SWEEP_CONFIGS)
        runs += [(sweep.name, c) for c in configs if (sweep.name, c) not in runs]
    # the background works through them from the last (the whole path's single, longest test)
    # while the tests at the end go from the first: they meet in the middle of the list too
    background = Background(runs[::-1])
    background.start()
    session_config.pluginmanager.register(SweepPlugin(background), PLUGIN_NAME)


@dataclass(frozen=True)
class SweepOutcome:
    results: list[UnitResult]       # every unit, in seed order
    here: int                       # units run in this test
    in_background: int
    failures: list[str]             # "seed S config C: violations\n  replay: COMMAND"
    line: str                       # for the session's summary

    def stats(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for r in self.results:
            for k, v in r.stats.items():
                totals[k] = totals.get(k, 0) + v
        return totals


def finish(pytest_config, name: str, configs: list[str] | None = None) -> SweepOutcome:
    """For a sweep's test: every unit of sweep ``name`` (its ``configs``; all by default), the
    background's results taken, the rest run here from the last unit backwards."""
    plugin = pytest_config.pluginmanager.get_plugin(PLUGIN_NAME)
    return finish_with(plugin.background if plugin is not None else None, name, configs)


def finish_with(background: Background | None, name: str, configs: list[str] | None = None) -> SweepOutcome:
    """:func:`finish` with the background given (None: every unit runs here)."""
    sweep = BY_NAME[name]
    configs = list(configs) if configs is not None else list(_module(sweep).SWEEP_CONFIGS)
    start = time.monotonic()
    results: dict[tuple[str, int], UnitResult] = {}
    here = 0
    if background is not None:
        background.read()
    for config in configs:
        for seed in reversed(units(sweep, config)):
            if background is not None:
                background.read()
                if (name, config, seed) in background.done:
                    break           # the background got here: below, it ran (or will: see after)
                background.claim(name, config, seed)
            results[(config, seed)] = run_unit(sweep, config, seed)
            here += 1
    if background is not None:
        # what the background has not finished yet below the meeting point is run here too (a
        # background that died, or one that is behind: it skips what is claimed)
        background.read()
        for config in configs:
            for seed in units(sweep, config):
                if (config, seed) not in results:
                    r = background.done.get((name, config, seed))
                    if r is None:
                        background.claim(name, config, seed)
                        r = run_unit(sweep, config, seed)
                        here += 1
                    results[(config, seed)] = r
            background.finished(name, config)
    ordered = [results[(c, s)] for c in configs for s in units(sweep, c)]
    failures = [f"seed {r.seed} config {r.config}: {'; '.join(r.violations[:5])}\n  replay: {r.replay}"
                for r in ordered if not r.ok]
    what = name if len(configs) > 1 or len(_module(sweep).SWEEP_CONFIGS) == 1 else f"{name} {configs[0]}"
    line = (f"{what}: {len(ordered)} seeds, "
            + (f"{len(ordered) - here} in the background over {time.monotonic() - background.start_s:.0f} s "
               f"of the session, " if background is not None else "")
            + f"{here} here in {time.monotonic() - start:.1f} s; {len(failures)} failed")
    if background is not None:
        if background.error:
            line += f" (the background exited with an error: {background.error.strip().splitlines()[-1]})"
        background.summary.append(line)
    return SweepOutcome(ordered, here, len(ordered) - here, failures, line)


def check(outcome: SweepOutcome) -> None:
    """Fail (AssertionError) naming every failing seed, configuration and replay command."""
    if outcome.failures:
        raise AssertionError(f"{len(outcome.failures)} of {len(outcome.results)} seeds broke an invariant:\n"
                             + "\n".join(outcome.failures[:10]))


if __name__ == "__main__":
    sys.exit(main())
