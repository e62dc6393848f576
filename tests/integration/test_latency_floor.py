"""bench/latency_floor.py's floor is only a fair bound if it does what our publish path must:
answer a SEND only once two of three journals have it on disk. Checked with the official client
against the real relay and journal processes, two journals stopped (SIGSTOP) and resumed."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import signal
import struct
import subprocess
import sys
import threading
import time

import pulsar
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "latency_floor.py"


def load_floor():
    spec = importlib.util.spec_from_file_location("latency_floor", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return module


def records_in(path: pathlib.Path, head: struct.Struct) -> list[bytes]:
    """The payloads a floor journal holds, in order (its file is zero-filled past the end)."""
    data = path.read_bytes()
    out, pos = [], 0
    while pos + head.size <= len(data):
        size, record_id = head.unpack_from(data, pos)
        if record_id == 0:
            break
        out.append(data[pos + head.size:pos + head.size + size])
        pos += head.size + size
    return out


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix-sockets"])
def test_the_floor_answers_a_send_only_once_two_journals_synced_it(tmp_path, unix):
    floor = load_floor()
    procs: list[subprocess.Popen] = []
    client = None
    try:
        url, pids = floor.start_floor(tmp_path, procs, unix=unix)
        journals = [pids[f"floor-journal-{i}"] for i in range(3)]
        client = pulsar.Client(url, operation_timeout_seconds=30)
        producer = client.create_producer("persistent://public/default/floor-test", batching_enabled=False,
                                          send_timeout_millis=30_000)
        producer.send(b"warm")                                   # all three journals up
        for pid in journals[1:]:
            os.kill(pid, signal.SIGSTOP)
        done = threading.Event()
        producer.send_async(b"needs two", lambda res, _id: done.set())
        assert not done.wait(1.5), "answered with one journal of three synced"
        os.kill(journals[1], signal.SIGCONT)                      # the second journal syncs it
        assert done.wait(20), "not answered once two journals synced"
        os.kill(journals[2], signal.SIGCONT)
        producer.flush()
        deadline = time.monotonic() + 20
        while True:     # the third journal catches up; every journal holds both SENDs, in order
            held = [records_in(tmp_path / f"floor-journal-{i}", floor.RECORD_HEAD) for i in range(3)]
            if all(len(h) == 2 for h in held) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for h in held:     # a record is the SEND's entry: [metadata size][metadata][payload]
            assert len(h) == 2 and h[0].endswith(b"warm") and h[1].endswith(b"needs two"), held
    finally:
        if client is not None:
            client.close()
        for proc in procs:
            try:
                os.kill(proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            proc.kill()
            proc.wait()
