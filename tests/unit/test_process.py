"""Server processes raise the GC thresholds and freeze start-up objects."""

import subprocess
import sys


def test_tune_gc_for_server_sets_thresholds_and_freezes():
    code = ("import gc; from pulsarlite.process import GC_THRESHOLDS, tune_gc_for_server; "
            "tune_gc_for_server(); assert gc.get_threshold() == GC_THRESHOLDS, gc.get_threshold(); "
            "assert gc.get_freeze_count() > 0; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_gil_switch_interval_default_and_override():
    code = ("import sys; from pulsarlite.process import GIL_SWITCH_INTERVAL_S, set_gil_switch_interval; "
            "assert set_gil_switch_interval({}) == GIL_SWITCH_INTERVAL_S == sys.getswitchinterval(); "
            "assert set_gil_switch_interval({'PULSARLITE_GIL_SWITCH_INTERVAL_MS': '0.5'}) == 0.0005; "
            "assert abs(sys.getswitchinterval() - 0.0005) < 1e-9; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_gil_switch_interval_rejects_bad_values_and_changes_nothing():
    import pytest

    from pulsarlite.errors import PulsarliteError
    from pulsarlite.process import set_gil_switch_interval
    before = sys.getswitchinterval()
    for bad in ("fast", "0", "-1", "5000", "nan"):
        with pytest.raises(PulsarliteError, match="PULSARLITE_GIL_SWITCH_INTERVAL_MS"):
            set_gil_switch_interval({"PULSARLITE_GIL_SWITCH_INTERVAL_MS": bad})
        assert sys.getswitchinterval() == before


def test_write_private_file_is_owner_only_also_over_a_wider_existing_file(tmp_path):
    import stat

    from pulsarlite.process import write_private_file

    path = tmp_path / "secret.key"
    path.write_text("old")
    path.chmod(0o644)                          # an existing, world-readable file
    write_private_file(path, b"new key")
    assert path.read_bytes() == b"new key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    fresh = tmp_path / "fresh.toml"
    write_private_file(fresh, "text = 1\n")
    assert fresh.read_text() == "text = 1\n" and stat.S_IMODE(fresh.stat().st_mode) == 0o600
