"""Helpers shared by the bench scripts (import as ``from bench.common import ...`` once the repo
root is on sys.path, as every script here does first)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def work_dir(given: str | os.PathLike | None, prefix: str, parent: str | os.PathLike | None = None) -> Iterator[pathlib.Path]:
    """A bench run's working directory. ``given`` (the script's --dir) is used as it is and kept:
    the user asked for it, e.g. to read the logs afterwards. Without it, a new temporary directory
    (``prefix``, under ``parent`` or the system's temp dir) is removed when the block exits, also
    on an exception, Ctrl-C or SIGTERM (bench/suite.py's timeout): a cluster's journals and entry
    logs are GBs a run. Stop the cluster, S3 server and other processes inside the block, so they
    are gone before it is removed. SIGTERM raises SystemExit(143) in the block (unless the script
    has its own handler), so those stops run. Every bench script makes its temporary directory
    here (tests/unit/test_bench_common.py)."""
    previous = None
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        if given:
            yield pathlib.Path(given)
            return
        path = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def http(method: str, url: str, body=None):
    """One admin REST call with a JSON body (or none); the JSON answer, None when empty."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        raw = resp.read()
        return json.loads(raw) if raw else None


def drain_consumers(consumers, receive_timeout_ms: int = 3000) -> tuple[list[int], float]:
    """Every consumer receives and acks in its own thread until a receive times out; the messages
    each one got and the rate in msg/s between the first and the last receipt (0 if fewer than two)."""
    counts = [0] * len(consumers)
    first: list[float | None] = [None]
    last = [0.0]
    lock = threading.Lock()

    def run(i: int) -> None:
        c = consumers[i]
        while True:
            try:
                m = c.receive(timeout_millis=receive_timeout_ms)
            except Exception:
                return
            now = time.perf_counter()
            with lock:
                if first[0] is None:
                    first[0] = now
                last[0] = now
            c.acknowledge(m)
            counts[i] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(consumers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rate = sum(counts) / (last[0] - first[0]) if first[0] and last[0] > first[0] else 0.0
    return counts, rate


def start_tier(work, kind: str):
    """The tier of a bench cluster under ``work`` (a pathlib.Path): ``kind`` "s3" starts the tests'
    S3 server (moto) with a bucket ``bench`` and puts its credentials in this process's
    environment; "file" makes ``work/tier``. Returns (the S3 server or None, its endpoint URL or
    None, the tier URI); the caller stops the server."""
    import os
    if kind == "s3":
        from tests.local_s3 import LocalS3Server
        s3 = LocalS3Server(work / "moto")
        s3.start()
        s3.create_bucket("bench")
        os.environ.update({k: v for k, v in s3.env.items() if k != "AWS_ENDPOINT_URL"})
        return s3, s3.endpoint_url, "s3://bench/tier"
    (work / "tier").mkdir(parents=True, exist_ok=True)
    return None, None, f"file://{work / 'tier'}"
