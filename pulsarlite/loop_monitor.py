"""Diagnostics for latency tails in a server process: event-loop lag and GC pauses.

Off unless ``PULSARLITE_LOOP_MONITOR_MS`` is set (the lag, in ms, worth a log line; e.g. 10).
Then a timer runs every ``interval_ms`` (5) and measures how late the loop ran it (lag: time
the loop was busy elsewhere, or the process was not scheduled), and ``gc.callbacks`` time every
collection. A line per lag above the threshold names the GC pauses that overlapped it; a summary
every ``report_s`` (10) gives counts and maxima:

    loop monitor: lag_max_ms=41.2 lags_over_10ms=3 lags_over_50ms=0 gc0=12/max 3.1ms
    gc1=0/max 0.0ms gc2=0/max 0.0ms gc_total_ms=20.4

The first few young-generation collections of more than CENSUS_YOUNG_MIN objects also log
the most common types among them (what lives long enough to fill the young generation).

A diagnostic for benchmarks (BENCHMARKS.md "[perf] hot path"); it costs a timer wake-up every
few ms, so it is not on by default.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time

log = logging.getLogger("pulsarlite.loop_monitor")

ENV_VAR = "PULSARLITE_LOOP_MONITOR_MS"
CENSUS_YOUNG_MIN = 50_000     # a young collection this big gets a census of its object types
CENSUS_TIMES = 3


class LoopMonitor:
    def __init__(self, *, threshold_ms: float, interval_ms: float = 5.0, report_s: float = 10.0,
                 clock=time.perf_counter) -> None:
        if threshold_ms <= 0 or interval_ms <= 0 or report_s <= 0:
            raise ValueError("threshold_ms, interval_ms and report_s must be > 0")
        self.threshold_s = threshold_ms / 1000
        self.interval_s = interval_ms / 1000
        self.report_s = report_s
        self._clock = clock
        self._handle: asyncio.TimerHandle | None = None
        self._expected = 0.0
        self._thread_cpu = 0.0
        self._process_cpu = 0.0
        self._gc_started: float | None = None
        self._recent_gc: list[tuple[float, float, int]] = []    # (end time, seconds, generation)
        self._census_left = CENSUS_TIMES
        self._reset()

    def _reset(self) -> None:
        self.lag_max_s = 0.0
        self.lags_over_threshold = 0
        self.lags_over_50ms = 0
        self.gc_count = [0, 0, 0]
        self.gc_max_s = [0.0, 0.0, 0.0]
        self.gc_total_s = 0.0
        self._report_at = self._clock() + self.report_s

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        self._schedule()

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._handle is not None:
            self._handle.cancel()

    def _schedule(self) -> None:
        self._thread_cpu = time.thread_time()
        self._process_cpu = time.process_time()
        self._expected = self._clock() + self.interval_s
        self._handle = asyncio.get_running_loop().call_later(self.interval_s, self._tick)

    def _tick(self) -> None:
        now = self._clock()
        lag = now - self._expected
        if lag > self.lag_max_s:
            self.lag_max_s = lag
        if lag >= self.threshold_s:
            self.lags_over_threshold += 1
            if lag >= 0.05:
                self.lags_over_50ms += 1
            window_start = self._expected - self.interval_s
            gcs = [(round(s * 1000, 1), g) for end, s, g in self._recent_gc if end >= window_start]
            # CPU of the loop's thread and of the whole process over the window: near the window
            # = the loop was busy (a long callback); far below = descheduled, blocked in a
            # syscall, or waiting for the GIL held by another thread
            log.warning("loop lag ms=%.1f window_ms=%.1f loop_thread_cpu_ms=%.1f process_cpu_ms=%.1f "
                        "gc_in_window=%s", lag * 1000, (lag + self.interval_s) * 1000,
                        (time.thread_time() - self._thread_cpu) * 1000,
                        (time.process_time() - self._process_cpu) * 1000, gcs or "none")
        self._recent_gc = [x for x in self._recent_gc if x[0] >= now - 1.0]
        if now >= self._report_at:
            log.info("loop monitor: lag_max_ms=%.1f lags_over_%gms=%d lags_over_50ms=%d "
                     "gc0=%d/max %.1fms gc1=%d/max %.1fms gc2=%d/max %.1fms gc_total_ms=%.1f",
                     self.lag_max_s * 1000, self.threshold_s * 1000, self.lags_over_threshold,
                     self.lags_over_50ms, self.gc_count[0], self.gc_max_s[0] * 1000, self.gc_count[1],
                     self.gc_max_s[1] * 1000, self.gc_count[2], self.gc_max_s[2] * 1000,
                     self.gc_total_s * 1000)
            self._reset()
        self._schedule()

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            if self._census_left > 0 and info.get("generation") == 0 and gc.get_count()[0] > CENSUS_YOUNG_MIN:
                self._census_left -= 1       # what fills a big young generation (a few times only)
                import collections
                young = gc.get_objects(0)
                census = collections.Counter(type(o).__qualname__ for o in young).most_common(8)
                log.warning("gc census: %d young objects, most common: %s", len(young), census)
            self._gc_started = self._clock()
            return
        if self._gc_started is None:
            return
        end = self._clock()
        seconds = end - self._gc_started
        self._gc_started = None
        generation = min(max(int(info.get("generation", 0)), 0), 2)
        self.gc_count[generation] += 1
        self.gc_total_s += seconds
        if seconds > self.gc_max_s[generation]:
            self.gc_max_s[generation] = seconds
        self._recent_gc.append((end, seconds, generation))
        if len(self._recent_gc) > 1000:
            del self._recent_gc[:500]


def start_from_env() -> LoopMonitor | None:
    """Start a monitor in the running loop if ``PULSARLITE_LOOP_MONITOR_MS`` is set (> 0)."""
    raw = os.environ.get(ENV_VAR, "").strip()
    if not raw:
        return None
    try:
        threshold_ms = float(raw)
    except ValueError:
        log.warning("ignoring %s=%r: not a number of milliseconds", ENV_VAR, raw)
        return None
    if threshold_ms <= 0:
        return None
    monitor = LoopMonitor(threshold_ms=threshold_ms)
    monitor.start()
    log.info("loop monitor on: threshold_ms=%g interval_ms=%g", threshold_ms, monitor.interval_s * 1000)
    return monitor


__all__ = ["ENV_VAR", "LoopMonitor", "start_from_env"]
