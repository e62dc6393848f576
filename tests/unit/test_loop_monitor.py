"""pulsarlite.loop_monitor: event-loop lag and GC pauses are seen; off unless the variable is set."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from pulsarlite import loop_monitor
from pulsarlite.loop_monitor import LoopMonitor


async def test_a_blocked_loop_and_a_collection_are_recorded():
    monitor = LoopMonitor(threshold_ms=5, interval_ms=1, report_s=3600)
    monitor.start()
    try:
        await asyncio.sleep(0.01)
        time.sleep(0.05)                 # the loop is blocked: the next tick is >= ~45 ms late
        gc.collect()
        for _ in range(100):
            await asyncio.sleep(0.002)
            if monitor.lags_over_threshold:
                break
        assert monitor.lags_over_threshold >= 1 and monitor.lag_max_s >= 0.04
        assert monitor.gc_count[2] >= 1 and monitor.gc_total_s > 0
    finally:
        monitor.stop()
    assert monitor._on_gc not in gc.callbacks


@pytest.mark.parametrize("value", ["", "0", "-3", "soon"])
async def test_off_unless_a_positive_threshold_is_set(monkeypatch, value):
    monkeypatch.setenv(loop_monitor.ENV_VAR, value)
    assert loop_monitor.start_from_env() is None


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        LoopMonitor(threshold_ms=0)
