"""Server processes raise the GC thresholds and freeze start-up objects."""

import subprocess
import sys


def test_tune_gc_for_server_sets_thresholds_and_freezes():
    code = ("import gc; from pulsarlite.process import GC_THRESHOLDS, tune_gc_for_server; "
            "tune_gc_for_server(); assert gc.get_threshold() == GC_THRESHOLDS, gc.get_threshold(); "
            "assert gc.get_freeze_count() > 0; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
