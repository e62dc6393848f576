"""bench/common.py's work_dir: a bench run's temporary directory is removed at the end, also on
failure or Ctrl-C, after what the block stops; a --dir the user gave is kept. And no bench script
makes a temporary directory any other way (one run of bench_offload_stream.py left ~2.3 GB of
bookie entry logs under /tmp before: a few `make bench` filled the disk)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


@pytest.fixture(scope="module")
def work_dir():
    spec = importlib.util.spec_from_file_location("bench_common", BENCH / "common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.work_dir


def fill(path: pathlib.Path) -> None:
    """What a run leaves: nested directories and files (a cluster's journals, logs)."""
    (path / "cluster" / "bookie-1" / "journal").mkdir(parents=True)
    (path / "cluster" / "bookie-1" / "journal" / "0.txn").write_bytes(b"x" * 4096)
    (path / "client.log").write_text("log\n")


def test_temporary_directory_is_removed_at_the_end(work_dir, tmp_path):
    with work_dir(None, "bench-test-", parent=tmp_path) as path:
        assert path.is_dir() and path.parent == tmp_path and path.name.startswith("bench-test-")
        fill(path)
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("error", [RuntimeError("the bench failed"), KeyboardInterrupt(), SystemExit(143)])
def test_temporary_directory_is_removed_on_failure_after_the_block_stops_its_processes(work_dir, tmp_path, error):
    seen_at_stop = []
    with pytest.raises(type(error)):
        with work_dir(None, "bench-test-", parent=tmp_path) as path:
            fill(path)
            try:
                raise error
            finally:                      # the script's cluster.stop(): its directory still there
                seen_at_stop.append((path / "cluster" / "bookie-1" / "journal" / "0.txn").exists())
    assert seen_at_stop == [True]
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_sigterm_in_the_block_exits_through_the_cleanup_and_the_handler_is_restored(work_dir, tmp_path):
    """bench/suite.py stops a script past its deadline with SIGTERM: its cluster stops and its
    directory goes, as on Ctrl-C."""
    # a script starts with the default handler (a test before this one in the same process may
    # have installed its own: set the default for this test, put the other back after)
    outside = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(SystemExit) as exited:
            with work_dir(None, "bench-test-", parent=tmp_path) as path:
                fill(path)
                assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL   # else the kill below ends pytest
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):         # the handler runs between bytecodes of the main thread
                    pass
                pytest.fail("SIGTERM did not leave the block")
        assert exited.value.code == 143
        assert not path.exists()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL    # restored
    finally:
        signal.signal(signal.SIGTERM, outside)


def test_a_script_terminated_by_sigterm_leaves_no_directory(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from bench.common import work_dir\n"
        f"with work_dir(None, 'bench-test-', parent={str(tmp_path / 'runs')!r}) as d:\n"
        "    (d / 'entry.log').write_bytes(b'x' * 4096)\n"
        "    print(d, flush=True)\n"
        "    time.sleep(600)\n")
    (tmp_path / "runs").mkdir()
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True) as proc:
        path = pathlib.Path(proc.stdout.readline().strip())
        assert (path / "entry.log").exists()
        proc.terminate()
        assert proc.wait(timeout=60) == 143
    assert not path.exists()
    assert list((tmp_path / "runs").iterdir()) == []


def test_a_given_directory_is_used_as_it_is_and_kept(work_dir, tmp_path):
    given = tmp_path / "mine"
    given.mkdir()
    with work_dir(str(given), "bench-test-") as path:
        assert path == given
        fill(path)
    assert (given / "client.log").read_text() == "log\n"
    with pytest.raises(RuntimeError):
        with work_dir(given, "bench-test-") as path:
            raise RuntimeError("the bench failed")
    assert (given / "cluster" / "bookie-1" / "journal" / "0.txn").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_a_given_directory_is_not_created(work_dir, tmp_path):
    """The scripts create what they need in it (LocalCluster makes its own directory), as before."""
    with work_dir(tmp_path / "later", "bench-test-") as path:
        assert path == tmp_path / "later" and not path.exists()


MKDTEMP = re.compile(r"\b(mkdtemp|TemporaryDirectory)\b")
# scripts allowed to make a temporary directory themselves, with the reason; there are none
ALLOWED: dict[str, str] = {}


def test_no_bench_script_makes_a_temporary_directory_but_through_work_dir():
    """(TemporaryDirectory too: one way, and only work_dir turns SIGTERM into a clean exit)"""
    offenders = []
    for path in sorted(BENCH.rglob("*.py")):
        rel = path.relative_to(BENCH).as_posix()
        if rel == "common.py" or rel in ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if MKDTEMP.search(line):
                offenders.append(f"bench/{rel}:{number}: {line.strip()}")
    assert offenders == [], ("use bench.common.work_dir (removed at the end, --dir kept) instead of "
                             "tempfile.mkdtemp / TemporaryDirectory:\n" + "\n".join(offenders))


def test_the_scan_finds_the_helper_itself():
    """The pattern does match a call (else the test above passes vacuously)."""
    assert MKDTEMP.search((BENCH / "common.py").read_text())
