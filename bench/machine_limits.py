"""The machine's own limits, measured in the same run as the figures they bound.

    .venv/bin/python bench/machine_limits.py [--dir D] [--json]

- fsync'd sequential write: 1 MiB blocks, fdatasync after each, MB/s;
- 4 KiB append + fdatasync, one writer: ops/s (what a journal's group commit works against);
- loopback TCP: one sender, one receiver process, 1 MiB writes, MB/s;
- page-cache writes, MB per CPU-second (100 KiB pwrites, no sync): into a new file (pages the
  page cache must find: on a VM whose memory the host backs lazily, first touches) and over
  a 16 MiB region already cached. What a bookie's journal and entry-log writes cost in CPU;
- cores: os.cpu_count().
Not a test: figures only.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.common import work_dir  # noqa: E402


def disk_fsync_seq_mb_s(directory: str, total_mb: int = 256) -> float:
    path = os.path.join(directory, "seq-probe.bin")
    block = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        started = time.perf_counter()
        for _ in range(total_mb):
            os.write(fd, block)
            os.fdatasync(fd)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        os.unlink(path)
    return total_mb * (1 << 20) / elapsed / 1e6


def disk_append_fdatasync_ops_s(directory: str, seconds: float = 3.0) -> float:
    path = os.path.join(directory, "append-probe.bin")
    block = os.urandom(4096)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    ops = 0
    try:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            os.write(fd, block)
            os.fdatasync(fd)
            ops += 1
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        os.unlink(path)
    return ops / elapsed


def page_cache_write_mb_per_cpu_s(directory: str, total_mb: int = 256) -> dict:
    """{"new": MB per CPU-second writing a new file, "cached": rewriting a cached region}."""
    block = os.urandom(100 * 1024)
    out = {}
    for kind, region in (("new", 1 << 62), ("cached", 16 << 20)):
        path = os.path.join(directory, f"page-cache-probe-{kind}.bin")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if kind == "cached":
                for offset in range(0, region, len(block)):
                    os.pwrite(fd, block, offset)        # the region in the cache first
            started = time.process_time()
            offset = 0
            while offset < total_mb << 20:
                os.pwrite(fd, block, offset % region)
                offset += len(block)
            cpu_s = time.process_time() - started
        finally:
            os.close(fd)
            os.unlink(path)
        out[kind] = offset / max(cpu_s, 1e-6) / 1e6
    return out


def _sink(port_queue, seconds: float) -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port_queue.put(srv.getsockname()[1])
        conn, _ = srv.accept()
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        with conn:
            while conn.recv_into(view):
                pass


def loopback_mb_s(seconds: float = 2.0) -> float:
    ctx = multiprocessing.get_context("spawn")
    ports = ctx.Queue()
    proc = ctx.Process(target=_sink, args=(ports, seconds), daemon=True)
    proc.start()
    try:
        port = ports.get(timeout=20)
        block = os.urandom(1 << 20)
        sent = 0
        with socket.create_connection(("127.0.0.1", port)) as s:
            started = time.perf_counter()
            while time.perf_counter() - started < seconds:
                s.sendall(block)
                sent += len(block)
            elapsed = time.perf_counter() - started
        return sent / elapsed / 1e6
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join()


def measure(directory: str) -> dict:
    return {
        "cores": os.cpu_count(),
        "disk_fsync_seq_mb_s": disk_fsync_seq_mb_s(directory),
        "disk_append_fdatasync_ops_s": disk_append_fdatasync_ops_s(directory),
        "loopback_mb_s": loopback_mb_s(),
        "page_cache_write_mb_per_cpu_s": page_cache_write_mb_per_cpu_s(directory),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="directory on the disk to probe (default: a temp dir under .)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with work_dir(None, "limits-", parent=args.dir or ".") as d:
        result = measure(d)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"cores {result['cores']}; fsync'd sequential write {result['disk_fsync_seq_mb_s']:.0f} MB/s; "
              f"4 KiB append+fdatasync {result['disk_append_fdatasync_ops_s']:,.0f} ops/s; "
              f"loopback {result['loopback_mb_s']:,.0f} MB/s; page-cache writes "
              f"{result['page_cache_write_mb_per_cpu_s']['new']:,.0f} MB per CPU-second into new pages, "
              f"{result['page_cache_write_mb_per_cpu_s']['cached']:,.0f} over cached ones")
    return 0


if __name__ == "__main__":
    sys.exit(main())
