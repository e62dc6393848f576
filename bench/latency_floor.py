"""What publish latency at a fixed rate this machine allows a replicated, fsync'd topology.

    .venv/bin/python bench/latency_floor.py [--rounds 3] [--seconds 10] [--rate 5000]
                                            [--targets null,floor,pulsarlite] [--json]

The same official client (``pulsar.Client``), paced exactly as bench_broker.py's paced phases
(unbatched, and with the client's batching on, a 1 ms window), publishes to three targets in
turn, alternated per round, each already running:

  null        a Pulsar-protocol responder that stores nothing and answers each SEND at once
              (bench_broker's null broker): the client and one socket hop
  floor       the least a replicated publish path can do in Python on this machine: a relay
              speaking the Pulsar protocol forwards each read's SENDs, as bytes, to three
              journal processes over TCP loopback; each journal appends what it read to a
              preallocated file with one pwrite and one fdatasync and answers the highest
              record it synced; the relay answers each SEND once two of three have synced it
              (E3/Qw3/Qa2). No ledgers, no metadata, no checksums, no pacing, no ZooKeeper.
  floor-unix  the same with the relay and the journals on Unix sockets instead of TCP loopback
              (what that transport would buy our broker and bookies on one host)
  relay-bookies  the floor's relay in front of the cluster's three pulsarlite bookies: each
              read's SENDs go to each bookie as one AddRequest (the broker's own encoding),
              answered at two of three: our bookies without our broker
  pulsarlite  a fresh local cluster: 3 bookies, 1 broker, E3/Qw3/Qa2, fsync on;
              ``pulsarlite[key=value;...]`` another cluster whose broker has those config values

For each: client p50/p99/max and the CPU microseconds per message of every process. The
floor's figures bound from below what any implementation with this process layout gets here:
where the floor's p99 is itself above a goal, the machine, not the code, stops the goal.
Not a test: no assertions, figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import json
import os
import pathlib
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench.common import work_dir  # noqa: E402

RECORD_HEAD = struct.Struct("<IQ")     # payload bytes, record id
SYNCED = struct.Struct("<Q")           # the highest record id a journal has synced
JOURNAL_PREALLOCATE_BYTES = 64 << 20


def install_uvloop() -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass


# -- the floor's journal -----------------------------------------------------------------------
def serve_floor_journal(address: str, path: str) -> None:
    """Append whole records to a zero-filled, synced file: one pwrite + one fdatasync per read
    from the relay, then answer the highest record id synced. ``address``: a TCP port on
    loopback, or a Unix socket's path (starting with "/")."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    zeros = bytes(1 << 20)
    for offset in range(0, JOURNAL_PREALLOCATE_BYTES, len(zeros)):
        os.pwrite(fd, zeros, offset)
    os.fsync(fd)
    state = {"offset": 0}

    class Journal(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.transport, self.buffer = transport, bytearray()

        def data_received(self, data) -> None:
            buf = self.buffer
            buf += data
            pos, last_id = 0, None
            while len(buf) - pos >= RECORD_HEAD.size:
                size, record_id = RECORD_HEAD.unpack_from(buf, pos)
                if len(buf) - pos - RECORD_HEAD.size < size:
                    break
                pos += RECORD_HEAD.size + size
                last_id = record_id
            if last_id is None:
                return
            whole = bytes(buf[:pos])
            del buf[:pos]
            offset = state["offset"]
            if offset + len(whole) > JOURNAL_PREALLOCATE_BYTES:
                offset = 0     # wrap: the floor keeps no data, it only pays for the writes
            os.pwrite(fd, whole, offset)
            os.fdatasync(fd)
            state["offset"] = offset + len(whole)
            self.transport.write(SYNCED.pack(last_id))

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        if address.startswith("/"):
            server = await loop.create_unix_server(Journal, address)
        else:
            server = await loop.create_server(Journal, "127.0.0.1", int(address))
        async with server:
            await server.serve_forever()

    install_uvloop()
    asyncio.run(serve())


# -- the floor's relay -------------------------------------------------------------------------
def serve_floor_relay(port: int, journal_addresses: list[str], quorum: int, bookie_protocol: bool) -> None:
    """A Pulsar-protocol front (CONNECT, lookups, PRODUCER as the null broker) whose SEND goes
    to every journal and is answered once ``quorum`` of them synced it. With
    ``bookie_protocol`` the journals are pulsarlite bookies: each read's SENDs go to each as one
    AddRequest (entries of one ledger, checksummed as the broker does), answered per entry."""
    from pulsarlite._proto import pulsar_api_pb2 as pb
    from pulsarlite.wire import commands as cmd
    from pulsarlite.wire.frames import FrameDecoder
    from bench_broker import stand_in_answer
    T = pb.BaseCommand
    url = f"pulsar://127.0.0.1:{port}"
    journals: list[asyncio.Transport] = []
    synced = [0] * len(journal_addresses)
    # unanswered SENDs: (record id, client transport, producer id, sequence id, highest)
    pending: collections.deque = collections.deque()
    next_id = [1]

    def quorum_synced() -> int:
        """The highest record id that ``quorum`` journals have synced."""
        return sorted(synced, reverse=True)[quorum - 1]

    def answer() -> None:
        acked = quorum_synced()
        out: dict = {}
        while pending and pending[0][0] <= acked:
            _rid, transport, producer_id, sequence_id, highest = pending.popleft()
            out.setdefault(transport, []).append(
                cmd.send_receipt(producer_id, sequence_id, 1, sequence_id, highest_sequence_id=highest or None))
        for transport, frames in out.items():
            transport.write(b"".join(frames))

    from bookie import transport as bt
    from bookie._proto import bookie_rpc_pb2 as bpb
    from pulsarlite.checksum import entry_checksum
    ledger = {"id": 1_000_000 + os.getpid(), "length": 0, "request_id": 0}

    def add_request(entries: list) -> bytes:
        """One AddRequest frame for ``entries`` [(entry id, payload)], built as the broker does."""
        parts = []
        lid, lac = ledger["id"], quorum_synced() - 1   # record id - 1 = entry id
        for entry_id, payload in entries:
            ledger["length"] += len(payload)
            length = ledger["length"]
            parts.append(bt.encode_add_entry(lid, entry_id, lac, length, payload,
                                             entry_checksum(lid, entry_id, lac, length, payload)))
        ledger["request_id"] += 1
        rid = ledger["request_id"]
        parts.append(bt.encode_add_request_tail(False, rid))
        body = b"".join(parts)
        return bt.encode_header(bpb.FRAME_ADD_REQUEST, rid, len(body)) + body

    class BookieLink(asyncio.Protocol):
        def __init__(self, index: int) -> None:
            self.index = index
            self.decoder = bt.FrameDecoder(64 << 20, bt.RESPONSE_TYPES)

        def data_received(self, data) -> None:
            highest = None
            for frame_type, _rid, body in self.decoder.feed(data):
                if frame_type != bpb.FRAME_ADD_RESPONSE:
                    raise RuntimeError(f"bookie {self.index} answered frame type {frame_type}")
                for result in bpb.AddResponse.FromString(body).results:
                    if result.code:
                        raise RuntimeError(f"bookie {self.index} refused entry {result.entry_id}: {result.code}")
                    highest = result.entry_id + 1      # record ids start at 1, entry ids at 0
            if highest is not None:
                synced[self.index] = highest
                answer()

    class JournalLink(asyncio.Protocol):
        def __init__(self, index: int) -> None:
            self.index, self.buffer = index, bytearray()

        def data_received(self, data) -> None:
            self.buffer += data
            n = len(self.buffer) // SYNCED.size * SYNCED.size
            if n:
                synced[self.index] = SYNCED.unpack_from(self.buffer, n - SYNCED.size)[0]
                del self.buffer[:n]
                answer()

    class Front(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.transport, self.decoder = transport, FrameDecoder()

        def data_received(self, data) -> None:
            out, records = [], []
            for frame in self.decoder.feed(data):
                c = frame.command
                kind = c.type
                if kind == T.SEND:
                    s = c.send
                    rid = next_id[0]
                    next_id[0] += 1
                    entry = frame.entry
                    if bookie_protocol:
                        records.append((rid - 1, bytes(entry)))
                    else:
                        records.append(RECORD_HEAD.pack(len(entry), rid))
                        records.append(entry)
                    pending.append((rid, self.transport, s.producer_id, s.sequence_id, s.highest_sequence_id))
                else:
                    reply = stand_in_answer(c, url, "floor")
                    if reply is not None:
                        out.append(reply)
            if records:
                blob = add_request(records) if bookie_protocol else b"".join(records)
                for journal in journals:
                    journal.write(blob)
            if out:
                self.transport.write(b"".join(out))

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        link = BookieLink if bookie_protocol else JournalLink
        for index, address in enumerate(journal_addresses):
            if address.startswith("/"):
                transport, _ = await loop.create_unix_connection(lambda i=index: link(i), address)
            else:
                transport, _ = await loop.create_connection(lambda i=index: link(i), "127.0.0.1", int(address))
            journals.append(transport)
        server = await loop.create_server(Front, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    install_uvloop()
    asyncio.run(serve())


# -- running the targets -------------------------------------------------------------------------
def wait_for_port(proc: subprocess.Popen, port: int, what: str) -> None:
    from bench_broker import wait_started
    from pulsarlite.zk_server import port_accepts
    wait_started(proc, lambda: port_accepts("127.0.0.1", port), what)


def start_relay(journal_ports: list, bookie_protocol: bool, procs: list[subprocess.Popen]) -> tuple[str, int]:
    from pulsarlite.zk_server import find_free_port
    port = find_free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-floor-relay", str(port),
                             ",".join(map(str, journal_ports))] + (["--bookie-protocol"] if bookie_protocol else []),
                            stdin=subprocess.DEVNULL)
    procs.append(proc)
    wait_for_port(proc, port, "floor relay")
    return f"pulsar://127.0.0.1:{port}", proc.pid


def start_floor(base: pathlib.Path, procs: list[subprocess.Popen], unix: bool = False,
                name: str = "floor") -> tuple[str, dict[str, int]]:
    """Three journals and the relay; with ``unix`` the relay reaches the journals over Unix
    sockets instead of TCP loopback."""
    from pulsarlite.zk_server import find_free_port
    pids: dict[str, int] = {}
    journal_ports = []
    for i in range(3):
        address = str(base / f"{name}-journal-{i}.sock") if unix else str(find_free_port())
        proc = subprocess.Popen([sys.executable, __file__, "--serve-floor-journal", address,
                                 str(base / f"{name}-journal-{i}")], stdin=subprocess.DEVNULL)
        procs.append(proc)
        if unix:
            from bench_broker import wait_started
            wait_started(proc, lambda a=address: os.path.exists(a), f"floor journal {i}")
        else:
            wait_for_port(proc, int(address), f"floor journal {i}")
        journal_ports.append(address)
        pids[f"floor-journal-{i}"] = proc.pid
    url, pids["floor-relay"] = start_relay(journal_ports, False, procs)
    return url, pids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each paced run")
    parser.add_argument("--rate", type=float, default=5_000.0, help="messages per second")
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--sample-every", type=int, default=10,
                        help="time 1 message in N (bench_broker's paced phases: 10)")
    parser.add_argument("--targets", default="null,floor,pulsarlite")
    parser.add_argument("--modes", default="unbatched,batched-1ms")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve-floor-journal", nargs=2, metavar=("PORT", "PATH"), help=argparse.SUPPRESS)
    parser.add_argument("--serve-floor-relay", nargs=2, metavar=("PORT", "JOURNAL_PORTS"), help=argparse.SUPPRESS)
    parser.add_argument("--bookie-protocol", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_floor_journal:
        serve_floor_journal(args.serve_floor_journal[0], args.serve_floor_journal[1])
        return 0
    if args.serve_floor_relay:
        serve_floor_relay(int(args.serve_floor_relay[0]),
                          args.serve_floor_relay[1].split(","), quorum=2,
                          bookie_protocol=args.bookie_protocol)
        return 0

    import pulsar
    from bench_broker import CpuMeter, parse_overrides, produce_paced, start_null_broker
    from faces.cluster import LocalCluster

    targets = args.targets.split(",")
    modes = args.modes.split(",")
    with work_dir(args.dir, "pulsarlite-bench-floor-") as base:
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        procs: list[subprocess.Popen] = []
        urls: dict[str, str] = {}
        pids: dict[str, dict[str, int]] = {}
        clusters = contextlib.ExitStack()       # every cluster stops at the end, also on failure
        clients: dict = {}
        results: list[dict] = []

        def start_cluster(brokers: int, broker_overrides: dict | None) -> LocalCluster:
            cluster = clusters.enter_context(LocalCluster(base / f"cluster-{len(urls)}"))
            cluster.start_processes(bookies=3, brokers=brokers, broker_overrides=broker_overrides)
            return cluster

        try:
            for name in targets:
                if name == "null":
                    proc, urls[name] = start_null_broker()
                    procs.append(proc)
                    pids[name] = {"null-broker": proc.pid}
                elif name in ("floor", "floor-unix"):
                    urls[name], pids[name] = start_floor(base, procs, unix=name == "floor-unix", name=name)
                elif name == "relay-bookies":
                    cluster = start_cluster(0, None)
                    bookie_ports = [int(cluster.records[b].bookie_id.rsplit(":", 1)[1]) for b in cluster.bookie_names]
                    urls[name], relay_pid = start_relay(bookie_ports, True, procs)
                    pids[name] = {"floor-relay": relay_pid} | {b: cluster.records[b].pid for b in cluster.bookie_names}
                elif name.startswith("pulsarlite"):
                    # "pulsarlite" or "pulsarlite[key=value;key=value]": broker config overrides
                    overrides = parse_overrides([kv for kv in name.removeprefix("pulsarlite").strip("[]").split(";") if kv])
                    cluster = start_cluster(1, overrides or None)
                    urls[name] = cluster.service_url
                    pids[name] = {n: cluster.records[n].pid for n in cluster.broker_names + cluster.bookie_names}
                else:
                    raise SystemExit(f"unknown target {name!r}")
            for name in targets:
                clients[name] = pulsar.Client(urls[name], operation_timeout_seconds=60,
                                              logger=pulsar.FileLogger(pulsar.LoggerLevel.Warn, str(base / f"{name}-client.log")))
            for round_index in range(args.rounds):
                for mode in modes:
                    delay_ms = None if mode == "unbatched" else int(mode.split("-")[1].removesuffix("ms"))
                    for name in targets:
                        meter = CpuMeter(pids[name])
                        before, started = meter.snapshot(), time.perf_counter()
                        r = produce_paced(clients[name], f"persistent://public/default/floor-{mode}-{round_index}",
                                          args.seconds, args.size, args.rate, f"{name} {mode} round {round_index + 1}",
                                          args.sample_every, delay_ms)
                        after = meter.snapshot()
                        cpu_us = {n: (after[n] - before[n]) / max(1, r["acked"]) * 1e6
                                  for n in before if n != "machine"}
                        busy = (after["machine"] - before["machine"]) / (time.perf_counter() - started) * 100
                        r.update(target=name, mode=mode, round=round_index + 1, cpu_us=cpu_us, machine_busy_pct=busy)
                        results.append(r)
                        print(f"   {name:10s} {mode:11s} round {round_index + 1}: p50 {r['p50_ms']:.2f} ms  "
                              f"p99 {r['p99_ms']:.2f} ms  max {r['max_ms']:.1f} ms  machine {busy:.0f}% busy",
                              file=sys.stderr, flush=True)
        finally:
            for client in clients.values():
                client.close()
            clusters.close()
            for proc in procs:
                proc.kill()
                proc.wait()

        if args.json:
            print(json.dumps({"when": when, "results": results}, indent=2, default=str))
        print(f"\n{when}; official client paced at {args.rate:.0f} msg/s, {args.size} B, {args.seconds:g} s per run, "
              f"1 in {args.sample_every} timed; {args.rounds} rounds, targets alternated within each\n")
        print("| mode | target | p50 ms (rounds) | p99 ms (rounds) | median p99 ms | CPU us/msg: server processes | client | machine busy |")
        print("|---|---|---|---|---|---|---|---|")
        for mode in modes:
            for name in targets:
                rs = [r for r in results if r["mode"] == mode and r["target"] == name]
                if not rs:
                    continue
                servers = ", ".join(f"{p} {statistics.median(r['cpu_us'][p] for r in rs):.0f}"
                                    for p in pids[name])
                p50s = " / ".join(f"{r['p50_ms']:.2f}" for r in rs)
                p99s = " / ".join(f"{r['p99_ms']:.2f}" for r in rs)
                print(f"| {mode} | {name} | {p50s} | {p99s} | {statistics.median(r['p99_ms'] for r in rs):.2f} | "
                      f"{servers} | {statistics.median(r['cpu_us']['client'] for r in rs):.0f} | "
                      f"{statistics.median(r['machine_busy_pct'] for r in rs):.0f}% |")
        return 0


if __name__ == "__main__":
    sys.exit(main())
