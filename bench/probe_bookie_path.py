"""A bookie's add path in one process, without the network: CPU per add, and where it goes.

    .venv/bin/python bench/probe_bookie_path.py [--adds 20000] [--entries 2] [--inflight 2]
                                                [--dir /dev/shm] [--profile] [--top 40]

Real code from the AddRequest bytes to the AddResponse bytes: ``bookie.server._Connection``
(``data_received``) -> ``BookieService`` -> ``BookieStore.add_entries`` -> the journal thread
(group commit, pwrite, fdatasync) -> the commit back on the loop -> the response frame written
to the connection's transport. Only the socket is a fake: the client side keeps ``--inflight``
AddRequests of ``--entries`` entries each outstanding (the shape the broker's bookie client
sends at a paced 5,000 msg/s: a few entries per request, two requests in flight) and sends the
next one when an answer comes back. Frames are encoded as the bookie client encodes them.

Prints CPU microseconds per add (process CPU of both threads, the fake client's work
subtracted), journal groups per add and, with --profile, the top functions by own time
(cProfile, loop thread only; its overhead inflates the absolute figures). ``--dir`` holds the
journal and ledger directories: /dev/shm (tmpfs: fdatasync costs nothing) isolates the Python
work; a directory on the real disk adds the kernel's fsync work. For a deterministic figure
count instructions: run it under ``valgrind --tool=cachegrind --cache-sim=no`` with two
``--adds`` values and divide the difference of the "I refs" by the difference of adds.
Not a test: figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pathlib
import pstats
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bench.common import work_dir  # noqa: E402
from bookie._proto import bookie_rpc_pb2 as pb  # noqa: E402
from bookie.server import BookieServer, BookieService, _Connection  # noqa: E402
from bookie.storage import BookieStore  # noqa: E402
from bookie.transport import (FrameDecoder, RESPONSE_TYPES, encode_add_entry,  # noqa: E402
                              encode_add_request_tail, encode_header)
from pulsarlite.checksum import entry_checksum  # noqa: E402
from pulsarlite.config import BookieConfig  # noqa: E402
from pulsarlite.process import tune_gc_for_server  # noqa: E402

LEDGER_ID = 7


def thread_cpu_s(tid: int) -> float:
    """CPU seconds (user + system) of one thread of this process."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class FakeClient:
    """The connection's transport: answers come in here; each answer sends the next request."""

    def __init__(self, requests: list[bytes], inflight: int, entries: int) -> None:
        self.requests = requests
        self.next = 0
        self.inflight = inflight
        self.entries = entries
        self.decoder = FrameDecoder(1 << 24, RESPONSE_TYPES)
        self.answered = 0
        self.bad = 0
        self.conn: _Connection | None = None
        self.done: asyncio.Future | None = None
        self.fake_cpu_s = 0.0

    # -- transport -------------------------------------------------------------------------
    def get_extra_info(self, name, default=None):
        return default

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def write(self, data) -> None:
        self.writelines([data])

    def writelines(self, pieces) -> None:
        t0 = time.process_time()
        answers = 0
        for frame_type, _rid, body in self.decoder.feed(b"".join(pieces)):
            if frame_type != pb.FRAME_ADD_RESPONSE:
                self.bad += 1
                continue
            answers += 1
            results = pb.AddResponse.FromString(body).results
            if len(results) != self.entries or any(r.code for r in results):
                self.bad += 1
        self.answered += answers
        self.fake_cpu_s += time.process_time() - t0
        for _ in range(answers):
            self.send_next()
        if self.answered >= len(self.requests) and self.done is not None and not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        pass

    # -- the client side --------------------------------------------------------------------
    def send_next(self) -> None:
        if self.next < len(self.requests):
            frame = self.requests[self.next]
            self.next += 1
            self.conn.data_received(frame)


def build_requests(count: int, entries: int, payload_bytes: int) -> list[bytes]:
    payload = os.urandom(payload_bytes)
    out = []
    e = 0
    for rid in range(1, count + 1):
        body = []
        for _ in range(entries):
            length = (e + 1) * payload_bytes
            body.append(encode_add_entry(LEDGER_ID, e, e - 1, length, payload,
                                         entry_checksum(LEDGER_ID, e, e - 1, length, payload)))
            e += 1
        body.append(encode_add_request_tail(False, rid))
        joined = b"".join(body)
        out.append(encode_header(pb.FRAME_ADD_REQUEST, rid, len(joined)) + joined)
    return out


async def run(args) -> None:
    with work_dir(None, "probe-bookie-", parent=args.dir) as root:
        config = BookieConfig(journal_dir=os.path.join(root, "journal"), ledger_dir=os.path.join(root, "ledgers"))
        store = BookieStore.open(config)
        await store.start()
        service = BookieService(store, config)
        server = BookieServer(service, config)
        requests = build_requests(args.adds // args.entries, args.entries, args.payload_bytes)
        warm = requests[: max(1, len(requests) // 10)]
        timed = requests[len(warm):]
        for phase, reqs in (("warm-up", warm), ("timed", timed)):
            client = FakeClient(reqs, args.inflight, args.entries)
            conn = _Connection(server)
            client.conn = conn
            conn.connection_made(client)
            client.done = asyncio.get_running_loop().create_future()
            groups0 = store._journal.groups_written
            journal_tid = store._journal._thread.native_id
            j0 = thread_cpu_s(journal_tid)
            profiler = cProfile.Profile() if args.profile and phase == "timed" else None
            t0, c0 = time.perf_counter(), time.process_time()
            if profiler:
                profiler.enable()
            for _ in range(min(args.inflight, len(reqs))):
                client.send_next()
            await client.done
            if profiler:
                profiler.disable()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            groups = store._journal.groups_written - groups0
            journal_cpu = thread_cpu_s(journal_tid) - j0
            adds = len(reqs) * args.entries
            conn.connection_lost(None)
            if phase == "timed":
                print(f"adds={adds} entries/request={args.entries} inflight={args.inflight} "
                      f"dir={args.dir} bad_answers={client.bad}")
                print(f"CPU per add: {(cpu - client.fake_cpu_s) / adds * 1e6:.1f} us "
                      f"(fake client {client.fake_cpu_s / adds * 1e6:.1f} us subtracted); "
                      f"wall per add {wall / adds * 1e6:.1f} us; journal groups per add "
                      f"{groups / adds:.3f}")
                print(f"of which the journal thread: {journal_cpu / adds * 1e6:.1f} us per add, "
                      f"{journal_cpu / max(groups, 1) * 1e6:.1f} us per group")
            if profiler:
                stats = pstats.Stats(profiler)
                stats.sort_stats("tottime").print_stats(args.top)
        await store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adds", type=int, default=20000)
    parser.add_argument("--entries", type=int, default=2, help="entries per AddRequest")
    parser.add_argument("--inflight", type=int, default=2, help="AddRequests outstanding")
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--dir", default="/dev/shm")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--uvloop", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    tune_gc_for_server()
    if args.uvloop:
        import uvloop
        uvloop.install()
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
