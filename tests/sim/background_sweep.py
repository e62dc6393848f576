"""The whole-path simulation's 10,000-seed sweep, run beside the rest of the test session.

A seed costs ~20 ms of CPU, so 10,000 seeds are ~3.5 min of one core, while most of the suite
(clusters of processes, fuzzing, chaos) leaves a core idle much of the time. When the session
has collected the sweep test (tests/sim/test_whole_path_sim.py) with other tests, the root
conftest starts ``python -m tests.sim.whole_path_sim --seeds 0-N --results FILE`` at the
lowest CPU priority (``nice -n 19``: it takes only what the tests leave) and moves the sweep
test to the end of the session. The test stops the background process, reads which seeds it
finished (one line per seed), and runs every seed it did not finish itself: the session always
covers every seed, whatever the machine's load; only where they run changes. The process is
ended at the session's end in any case (by its pid).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

SWEEP_TEST = "tests/sim/test_whole_path_sim.py::test_every_seed_keeps_the_whole_path_invariants"
PLUGIN_NAME = "pulsarlite-whole-path-sweep"    # how the test finds the session's sweep
REPO = Path(__file__).resolve().parents[2]


def sweep_seeds() -> int:
    return int(os.environ.get("PULSARLITE_WHOLE_PATH_SEEDS", "10000"))


def wanted() -> bool:
    """PULSARLITE_WHOLE_PATH_BACKGROUND=0: every seed runs in the test itself."""
    return os.environ.get("PULSARLITE_WHOLE_PATH_BACKGROUND", "1") != "0"


@dataclass(frozen=True)
class SweepOutcome:
    seeds: dict[int, str]     # seed -> "ok" or its violations
    elapsed_s: float
    error: str                # the end of its stderr if it exited on its own with an error


class BackgroundSweep:
    def __init__(self, seeds: int) -> None:
        self.seeds = seeds
        self._dir = Path(tempfile.mkdtemp(prefix="pulsarlite-sweep-"))
        self.results = self._dir / "results.txt"
        self._stderr = self._dir / "stderr.txt"
        self._process: subprocess.Popen | None = None
        self._start_s = 0.0

    def start(self) -> None:
        with open(self._stderr, "wb") as err:
            self._process = subprocess.Popen(
                ["nice", "-n", "19", sys.executable, "-m", "tests.sim.whole_path_sim",
                 "--seeds", f"0-{self.seeds - 1}", "--results", str(self.results)],
                cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        self._start_s = time.monotonic()

    def stop(self) -> SweepOutcome:
        """End the process (if still running) and read what it finished."""
        error = ""
        process = self._process
        if process is not None:
            exited = process.poll()
            if exited is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
            elif exited not in (0, 1):          # 1: a seed failed (it is in the results)
                error = self._stderr.read_text(errors="replace")[-2000:]
            self._process = None
        seeds: dict[int, str] = {}
        if self.results.exists():
            for line in self.results.read_text(errors="replace").splitlines(keepends=True):
                if not line.endswith("\n"):
                    break                       # cut while being written
                seed, _, outcome = line.rstrip("\n").partition(" ")
                seeds[int(seed)] = "ok" if outcome == "ok" else outcome.removeprefix("FAILED ")
        return SweepOutcome(seeds, time.monotonic() - self._start_s, error)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


class SweepPlugin:
    """Registered with pytest's plugin manager for the session by the root conftest."""

    def __init__(self, sweep: BackgroundSweep) -> None:
        self.sweep = sweep
        self.outcome: SweepOutcome | None = None
        self.summary = ""        # the sweep test's line for the session's summary

    def pytest_terminal_summary(self, terminalreporter):
        if self.summary:
            terminalreporter.section("whole-path simulation")
            terminalreporter.write_line(self.summary)

    def collect(self) -> SweepOutcome:
        """Stop the background sweep (once) and return what it finished."""
        if self.outcome is None:
            self.outcome = self.sweep.stop()
        return self.outcome

    def pytest_sessionfinish(self, session, exitstatus):
        self.sweep.cleanup()


def start_for_session(config) -> None:
    if wanted() and config.pluginmanager.get_plugin(PLUGIN_NAME) is None:
        sweep = BackgroundSweep(sweep_seeds())
        sweep.start()
        config.pluginmanager.register(SweepPlugin(sweep), PLUGIN_NAME)


def report(config, line: str) -> None:
    """The sweep test's outcome, printed in the session's summary (with a background sweep)."""
    plugin = config.pluginmanager.get_plugin(PLUGIN_NAME)
    if plugin is not None:
        plugin.summary = line


def collect(config) -> SweepOutcome | None:
    """For the sweep test: what the background finished (None: no background sweep)."""
    plugin = config.pluginmanager.get_plugin(PLUGIN_NAME)
    return plugin.collect() if plugin is not None else None
