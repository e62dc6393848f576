"""The broker's publish path in one process, without the network: CPU per message, and where it goes.

    .venv/bin/python bench/probe_publish_path.py [--messages 60000] [--window 2000] [--chunk 20]
                                                 [--profile] [--top 40]

Real code from the SEND bytes to the receipt bytes: ``ServerConnection.data_received`` ->
``PersistentTopic.publish`` (the SENDs of one producer from one read as a run) -> ``ManagedLedger`` -> ``LedgerWriter`` (write core, E3/Qw3/Qa2) ->
``BookieClient`` (AddRequests encoded as for the socket) -> receipts written to the connection's
transport. Only the sockets are fakes: the client side feeds pre-encoded SEND frames
(``--chunk`` frames per data_received, at most ``--window`` outstanding, like the official
client's pipelined unbatched producer) and three fake bookies answer every AddRequest with an
AddResponse of OKs on the next loop turn, built from the client's in-flight table (their time is
measured and subtracted; client frames are built once and cached in /tmp).

Prints CPU microseconds per message of the broker side (process CPU, fake bookies and feeding
subtracted) and with --profile the top functions by own time (cProfile; its overhead inflates
the absolute figures ~2x). CPU time still swings with the machine's load; for a deterministic
figure count instructions: run it under ``valgrind --tool=cachegrind --cache-sim=no`` with
--messages 1000 and 4000 --repeat 1 and divide the difference of the "I refs" by 3000
(BENCHMARKS.md "[perf] hot path"), with PYTHONHASHSEED=0 (the hash seed moves the count by up to
~2,000 per message; BENCHMARKS.md "[broker-core] session 14").
Not a test: figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pathlib
import pstats
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from bookie._proto import bookie_rpc_pb2 as bpb  # noqa: E402
from bookie.client.bookie_client import _Connection  # noqa: E402
from bookie.client.ledger_client import LedgerClient, LedgerWriter  # noqa: E402
from bookie.client.metadata import LedgerMetadata  # noqa: E402
from bookie.transport import encode_frame  # noqa: E402
from broker.config import BrokerConfig  # noqa: E402
from broker.connection import ServerConnection, _ProducerRef  # noqa: E402
from broker.managed_ledger import ManagedLedger  # noqa: E402
from broker.managed_ledger.config import ManagedLedgerConfig  # noqa: E402
from broker.managed_ledger.core import LedgerInfo, ManagedLedgerMetadata  # noqa: E402
from broker.topic import EntryCache, PersistentTopic, PublishBuffer  # noqa: E402
from pulsarlite.config import LedgerClientConfig  # noqa: E402
from pulsarlite.topic_name import TopicName  # noqa: E402
from pulsarlite.varint import uvarint  # noqa: E402
from pulsarlite.wire import commands as c  # noqa: E402
from pulsarlite.wire.entry import Message, build_entry  # noqa: E402

BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")


class Stopwatch:
    """CPU seconds spent in the fakes (subtracted from the broker's figure)."""

    def __init__(self) -> None:
        self.seconds = 0.0


class FakeBookieTransport:
    """What the BookieClient writes goes here; every AddRequest is answered (all OK) on the next
    loop turn through the client's own receive path. The request is not parsed (the client's
    in-flight table says which entries it carries), so the fake costs little."""

    def __init__(self, client, stopwatch: Stopwatch) -> None:
        self.client = client
        self.conn: _Connection | None = None
        self.stopwatch = stopwatch
        self.requests = 0
        self._answered: set[int] = set()

    def get_extra_info(self, name, default=None):
        return default

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def write(self, data) -> None:
        self.writelines([data])

    def writelines(self, parts) -> None:
        t0 = time.process_time()
        out = []
        for request_id, taken in self.client._inflight.items():
            if request_id in self._answered:
                continue
            self._answered.add(request_id)
            body = b"".join(b"\x0a" + uvarint(len(r)) + r
                            for r in (b"\x08\x01\x10" + uvarint(e) for t in taken for e in _entry_ids(t)))
            body += b"\x10" + uvarint(request_id)
            out.append(encode_frame(bpb.FRAME_ADD_RESPONSE, request_id, body))
            self.requests += 1
        if out:
            asyncio.get_running_loop().call_soon(self._answer, b"".join(out))
        self.stopwatch.seconds += time.process_time() - t0

    def _answer(self, data: bytes) -> None:
        self.conn.data_received(data)

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _entry_ids(taken_item) -> list[int]:
    """The entry ids of one in-flight record: (entry id | pb.Entry, callback) in older trees,
    (entry ids, callback) chunks since runs of adds."""
    first = taken_item[0]
    if isinstance(first, int):
        return [first]
    if hasattr(first, "entry_id"):
        return [first.entry_id]
    return list(first)


class SinkTransport:
    """The producer's connection: counts bytes written (receipts)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.writes = 0

    def write(self, data) -> None:
        self.bytes += len(data)
        self.writes += 1

    def writelines(self, parts) -> None:
        for p in parts:
            self.bytes += len(p)
        self.writes += 1

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 1) if name == "peername" else default

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class FakeOwnership:
    def write_guard(self, name):
        return lambda: True


class FakeService:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.entry_cache = EntryCache(config.dispatch.entry_cache_bytes_max)
        self.publish_buffer = PublishBuffer(config.publish_buffer_bytes_max)
        self.ownership = FakeOwnership()
        self.store = None

    def on_add_error(self, error) -> None:
        print(f"add error: {error!r}", file=sys.stderr)


async def build(stopwatch: Stopwatch):
    client = LedgerClient(None, LedgerClientConfig(), owns_store=False)
    client.writable_bookies = list(BOOKIES)
    fakes = []
    for bookie in BOOKIES:
        bc = client.pool.get(bookie)
        fake = FakeBookieTransport(bc, stopwatch)
        conn = _Connection(bc, 64 << 20)
        conn.connection_made(fake)
        fake.conn = conn
        bc._conn = conn
        fakes.append(fake)
    md = LedgerMetadata(ledger_id=1, ensemble_size=3, write_quorum=3, ack_quorum=2, ensembles=((0, BOOKIES),),
                        ctime_ms=0, custom={})
    writer = LedgerWriter(client, md, 0)
    ml = ManagedLedger("public/default/persistent/probe", client, None,
                       ManagedLedgerConfig(rollover_entries_max=1 << 30).validate(), lambda: 0, None)
    ml._writer = writer
    ml._run(ml._core.on_opened(ManagedLedgerMetadata((LedgerInfo(1, created_ms=0),))))
    service = FakeService(BrokerConfig())
    topic = PersistentTopic(service, TopicName.parse("persistent://public/default/probe"), ml)
    conn = ServerConnection(service)
    sink = SinkTransport()
    conn.connection_made(sink)
    conn.data_received(c.connect("probe", 19))
    ref = _ProducerRef(conn, 0)
    ref.topic = topic
    ref.producer = topic.add_producer(ref, "probe-producer", conn)
    conn._producers[0] = ref
    return conn, ref.producer, sink, fakes, writer


def client_frames(messages: int, chunk: int, payload: bytes) -> list[bytes]:
    """The SEND frames, ``chunk`` per read; cached in /tmp (building them costs ~20 us each,
    which would dominate an instruction count of the broker's work)."""
    cache = pathlib.Path(f"/tmp/probe-publish-frames-{messages}-{chunk}-{len(payload)}.bin")
    if cache.exists():
        data = cache.read_bytes()
        out, pos = [], 0
        while pos < len(data):
            n = int.from_bytes(data[pos:pos + 4], "big")
            out.append(data[pos + 4:pos + 4 + n])
            pos += 4 + n
        return out
    frames = [c.send(0, seq, build_entry(Message(payload), producer_name="probe-producer", sequence_id=seq,
                                         publish_time_ms=1_700_000_000_000 + seq))
              for seq in range(messages)]
    chunks = [b"".join(frames[i:i + chunk]) for i in range(0, messages, chunk)]
    cache.write_bytes(b"".join(len(x).to_bytes(4, "big") + x for x in chunks))
    return chunks


async def run(messages: int, window: int, chunk: int, size: int, stopwatch: Stopwatch) -> dict:
    conn, producer, sink, fakes, writer = await build(stopwatch)
    payload = bytes(range(256))[:size] * (size // 256 + 1)
    payload = payload[:size]
    t0 = time.process_time()
    chunks = client_frames(messages, chunk, payload)
    stopwatch.seconds += time.process_time() - t0     # building the client's frames is not broker work
    sink.bytes = 0
    started_cpu, started = time.process_time(), time.perf_counter()
    fed = 0
    feed_s = 0.0
    for data in chunks:
        while len(producer.pending) + chunk > window:
            await asyncio.sleep(0)
        conn.data_received(data)
        fed += chunk
        await asyncio.sleep(0)          # one read per loop turn, as from a socket
    while producer.pending:
        await asyncio.sleep(0)
    cpu = time.process_time() - started_cpu - stopwatch.seconds - feed_s
    wall = time.perf_counter() - started
    writer._stop_ticker()
    for task in list(conn._tasks):
        task.cancel()
    if conn._keepalive is not None:
        conn._keepalive.cancel()
    return {"messages": messages, "cpu_us_per_msg": cpu / messages * 1e6, "wall_s": wall,
            "msg_s_single_core": messages / max(cpu, 1e-9), "receipt_writes": sink.writes,
            "bookie_requests": sum(f.requests for f in fakes), "fake_bookie_cpu_s": stopwatch.seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument("--window", type=int, default=2_000)
    parser.add_argument("--chunk", type=int, default=20, help="SEND frames per data_received")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3, help="runs (median reported)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    import gc
    import uvloop
    from pulsarlite.process import GC_THRESHOLDS
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)

    results = []
    for _ in range(args.repeat):
        stopwatch = Stopwatch()
        results.append(uvloop.run(run(args.messages, args.window, args.chunk, args.size, stopwatch)))
        r = results[-1]
        print(f"  {r['cpu_us_per_msg']:.1f} us/msg broker CPU ({r['msg_s_single_core']:,.0f} msg/s per core); "
              f"{r['receipt_writes']} receipt writes, {r['bookie_requests']} bookie requests, "
              f"fake bookies {r['fake_bookie_cpu_s']:.2f} s", file=sys.stderr)
    values = sorted(r["cpu_us_per_msg"] for r in results)
    print(f"broker publish path, in process: median {values[len(values) // 2]:.1f} us CPU per message "
          f"(runs: {', '.join(f'{v:.1f}' for v in values)}; {args.messages} x {args.size} B, window {args.window}, "
          f"{args.chunk} SENDs per read)")
    if args.profile:
        stopwatch = Stopwatch()
        profiler = cProfile.Profile()
        profiler.enable()
        uvloop.run(run(args.messages, args.window, args.chunk, args.size, stopwatch))
        profiler.disable()
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
