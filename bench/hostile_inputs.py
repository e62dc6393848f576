"""[hardening] Hostile inputs against a real local cluster: event-loop lag and RSS during each.

    .venv/bin/python bench/hostile_inputs.py [--only NAME[,NAME...]] [--list] [--dir D]
                                             [--hold-s 40] [--settle-s 10] [--repeat N]

Starts a fresh local cluster (ZooKeeper, 3 bookies, 1 broker; the product's defaults for every
connection limit and timeout, a ``file://`` offload tier in the run's directory, bookies'
disk thresholds raised as in tests/fuzz because the disk is shared), an official
``pulsar-client`` canary producing and consuming one topic throughout (tests/fuzz/harness.py
``Canary``), then runs each hostile input of the issue's list one after the other, each bounded
in time and count, all on 127.0.0.1. For each input it records:

- the target process's event-loop lag: the product's own monitor (pulsarlite/loop_monitor.py,
  switched on with ``PULSARLITE_LOOP_MONITOR_MS=20`` for every server process: a log line per
  lag >= 20 ms; "<20" when there was none), and an outside probe every 50 ms from this process
  (broker: ``GET /admin/v2/clusters`` on a fresh connection; bookie: a ``ReadLacRequest`` on its
  port): max and p99 of the probe's round trip;
- the target's RSS (VmRSS) before, its peak during (sampled every 50 ms) and 10 s after;
- the target's log growth (bytes) during the input;
- whether the canary kept working: sends acknowledged during the input and the longest gap
  without one (a gap > 5 s or a failed send: "NO").

Prints one markdown table at the end (also while running, a line per input to stderr). Every
process started is stopped by pid at the end, also on failure or Ctrl-C, and the run's
directory is removed (unless --dir was given). Not a test: figures only.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import pathlib
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import zlib
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault("PULSARLITE_LOOP_MONITOR_MS", "20")   # inherited by the cluster's processes

import pulsar  # noqa: E402

from bench.common import work_dir  # noqa: E402
from bookie._proto import bookie_rpc_pb2 as bpb  # noqa: E402
from bookie.transport import HEADER as BOOKIE_HEADER, MESSAGE_TYPES as BOOKIE_MESSAGE_TYPES, encode_message  # noqa: E402
from pulsarlite.checksum import entry_checksum  # noqa: E402
from faces.cluster import LocalCluster  # noqa: E402
from pulsarlite.wire import commands as c  # noqa: E402
from pulsarlite.wire import pb  # noqa: E402
from pulsarlite.wire.frames import FrameDecoder, encode_command  # noqa: E402
from pulsarlite.zk_server import kill_process  # noqa: E402
from tests.fuzz.harness import Canary  # noqa: E402

T = pb.BaseCommand
LOOPBACK = "127.0.0.1"
MiB = 1024 * 1024
PROBE_INTERVAL_S = 0.05
RSS_SAMPLE_S = 0.05
LAG_LINE = "loop lag ms="
CANARY_GAP_BAD_S = 5.0


# -- /proc ------------------------------------------------------------------------------------------
def proc_status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {key} for pid {pid}")


def rss(pid: int) -> int:
    return proc_status(pid, "VmRSS")


def mb(n: float | None) -> str:
    return "?" if n is None else f"{n / 1e6:.0f}"


class RssSampler:
    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss(self.pid))
            except OSError:
                return
            self._stop.wait(RSS_SAMPLE_S)

    def __enter__(self):
        self.peak = rss(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


# -- probes -----------------------------------------------------------------------------------------
class Probe:
    """Round trips to the target every PROBE_INTERVAL_S from a thread: (start time, seconds or
    None for a failure)."""

    def __init__(self, call, name: str) -> None:
        self.call = call
        self.samples: list[tuple[float, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"probe-{name}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.call()
                dt: float | None = time.monotonic() - t0
            except Exception:   # noqa: BLE001 - a failed probe is recorded as such
                dt = None
            self.samples.append((t0, dt))
            self._stop.wait(max(0.0, PROBE_INTERVAL_S - (time.monotonic() - t0)))

    def window(self, start: float, end: float) -> tuple[float | None, float | None, int, int]:
        """(max s, p99 s, samples, failures) of the probes started in [start, end]."""
        got = [dt for t, dt in list(self.samples) if start <= t <= end]
        ok = sorted(dt for dt in got if dt is not None)
        if not ok:
            return None, None, len(got), len(got)
        p99 = ok[min(len(ok) - 1, int(round(0.99 * (len(ok) - 1))))]
        return ok[-1], p99, len(got), len(got) - len(ok)


def http_probe(port: int):
    def call() -> None:
        conn = http.client.HTTPConnection(LOOPBACK, port, timeout=10)
        try:
            conn.request("GET", "/admin/v2/clusters")
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError(f"status {r.status}")
        finally:
            conn.close()
    return call


class BookieProbe:
    """ReadLacRequest (a ledger that does not exist) on one kept connection, reopened if closed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.request_id = 0

    def __call__(self) -> None:
        if self.sock is None:
            self.sock = socket.create_connection((LOOPBACK, self.port), timeout=10)
        self.request_id += 1
        try:
            self.sock.sendall(encode_message(bpb.FRAME_READ_LAC_REQUEST, self.request_id,
                                             bpb.ReadLacRequest(ledger_id=987_654_321)))
            header = recv_exactly(self.sock, BOOKIE_HEADER.size)
            size, _, _ = BOOKIE_HEADER.unpack(header)
            recv_exactly(self.sock, size - 9)
        except Exception:
            self.sock.close()
            self.sock = None
            raise


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


# -- a raw Pulsar connection -------------------------------------------------------------------------
class PulsarConn:
    def __init__(self, port: int, *, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection((LOOPBACK, port), timeout=timeout_s)
        self.decoder = FrameDecoder(frame_bytes_max=64 * MiB)
        self.pending: list = []
        self.closed = False

    def connect(self) -> None:
        self.sock.sendall(c.connect("hostile-inputs"))
        self.wait_for(lambda f: f.type == T.CONNECTED, 10)

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            self.closed = True
            return False

    def wait_for(self, pred, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while True:
            for i, f in enumerate(self.pending):
                if pred(f):
                    return self.pending.pop(i)
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                return None
            ready, _, _ = select.select([self.sock], [], [], min(left, 0.5))
            if not ready:
                continue
            try:
                data = self.sock.recv(1 << 20)
            except OSError:
                data = b""
            if not data:
                self.closed = True
                return None
            for f in self.decoder.feed(data):
                if f.type == T.PING:
                    self.send(c.pong())
                else:
                    self.pending.append(f)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        ready, _, _ = select.select([sock], [], [], 0)
        if not ready:
            return False
        return sock.recv(65536) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


# -- the run's context -----------------------------------------------------------------------------------
@dataclass
class Ctx:
    cluster: LocalCluster
    base: pathlib.Path
    broker_pid: int
    broker_port: int
    http_port: int
    broker_log: str
    bookie_name: str
    bookie_pid: int
    bookie_port: int
    bookie_log: str
    hold_s: float
    settle_s: float
    canary: Canary
    http_probe: Probe
    bookie_probe: Probe

    def admin(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
              timeout_s: float = 60.0) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(LOOPBACK, self.http_port, timeout=timeout_s)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def admin_json(self, method: str, path: str, obj=None) -> tuple[int, bytes]:
        body = None if obj is None else json.dumps(obj).encode()
        return self.admin(method, path, body, {"Content-Type": "application/json"} if body else {})


@dataclass
class Row:
    name: str
    target: str
    before: str
    outcome: str = ""
    lag_max_ms: float | None = None
    lag_lines: int = 0
    probe_max_s: float | None = None
    probe_p99_s: float | None = None
    probe_fail: int = 0
    probe_n: int = 0
    rss_before: int | None = None
    rss_peak: int | None = None
    rss_after: int | None = None
    hwm: int | None = None
    log_bytes: int = 0
    canary_acked: int = 0
    canary_gap_s: float = 0.0
    canary_failed: int = 0
    seconds: float = 0.0
    error: str = ""

    @property
    def canary_ok(self) -> bool:
        return self.canary_acked > 0 and self.canary_failed == 0 and self.canary_gap_s <= CANARY_GAP_BAD_S


@dataclass
class Input:
    name: str
    target: str      # "broker" | "bookie"
    before: str      # the figure
    run: object      # (ctx) -> outcome string
    late_rss_s: float = 0.0   # also read RSS this long after the input (when it is slow to come back)


# -- the inputs -----------------------------------------------------------------------------------
def unsupported_flood(ctx: Ctx) -> str:
    """The issue's input: 200,000 unsupported-command frames (10 bytes each, 2 MB) after CONNECT
    on one connection, as fast as the socket takes them (a new connection if the broker closes
    one before all are sent; at most 30 s)."""
    frame = encode_command(T(type=T.NEW_TXN))
    assert len(frame) <= 12
    total, conns = 0, 0
    deadline = time.monotonic() + 30
    while total < 200_000 and time.monotonic() < deadline:
        conn = PulsarConn(ctx.broker_port)
        conns += 1
        try:
            conn.connect()
            chunk = frame * 1000
            while total < 200_000 and time.monotonic() < deadline:
                if not conn.send(chunk):
                    break
                total += 1000
                if closed_by_peer(conn.sock):
                    break
        finally:
            conn.close()
    return (f"{total:,} frames ({total * len(frame) / 1e6:.1f} MB) taken by the socket on {conns} connection(s) "
            f"(the kernel buffers them; what the broker did with them: the log bytes)")


def unsupported_reconnect(ctx: Ctx) -> str:
    """Connections that each send CONNECT and 1,001 unsupported-command frames (one past
    ``connection_unsupported_commands_max``, 1,000), one after the other until 200,000 frames
    were sent or 30 s passed; each connection is kept until the broker closes it (at most 5 s)."""
    frame = encode_command(T(type=T.NEW_TXN))
    total, conns, not_closed = 0, 0, 0
    deadline = time.monotonic() + 30
    while total < 200_000 and time.monotonic() < deadline:
        conn = PulsarConn(ctx.broker_port)
        conns += 1
        try:
            conn.connect()
            if conn.send(frame * 1001):
                total += 1001
            end = time.monotonic() + 5
            while not conn.closed and time.monotonic() < end:
                conn.wait_for(lambda f: False, 0.2)
            not_closed += not conn.closed
        finally:
            conn.close()
    return f"{total:,} frames on {conns} connections; {not_closed} not closed by the broker within 5 s"


def baseline_idle(ctx: Ctx) -> str:
    """Nothing for 10 s: the noise floor of the lag figures on this shared machine."""
    time.sleep(10)
    return "no input"


def make_batch_entry(count: int, payload: bytes, *, compression: int = 0,
                     uncompressed_size: int | None = None, sequence_id: int = 0) -> bytes:
    meta = pb.MessageMetadata(producer_name="hostile", sequence_id=sequence_id,
                              publish_time=int(time.time() * 1000), num_messages_in_batch=count,
                              uncompressed_size=len(payload) if uncompressed_size is None else uncompressed_size)
    if compression:
        meta.compression = compression
    m = meta.SerializeToString()
    return struct.pack(">I", len(m)) + m + payload


def raw_producer(ctx: Ctx, topic: str, name: str) -> PulsarConn:
    conn = PulsarConn(ctx.broker_port, timeout_s=60)
    conn.connect()
    conn.send(c.producer(topic, 1, 1, producer_name=name))
    got = conn.wait_for(lambda f: f.type in (T.PRODUCER_SUCCESS, T.ERROR), 30)
    if got is None or got.type != T.PRODUCER_SUCCESS:
        raise RuntimeError(f"producer on {topic}: {got.command if got else 'no answer'}")
    return conn


def send_and_wait(conn: PulsarConn, seq: int, entry: bytes, num_messages: int = 1) -> str:
    conn.send(c.send(1, seq, entry, num_messages=num_messages))
    got = conn.wait_for(lambda f: f.type in (T.SEND_RECEIPT, T.SEND_ERROR, T.ERROR), 60)
    if got is None:
        return "closed" if conn.closed else "no answer"
    if got.type == T.SEND_RECEIPT:
        return "stored"
    return "SEND_ERROR" if got.type == T.SEND_ERROR else "ERROR"


def skip_huge_batch(ctx: Ctx) -> str:
    """A batch claiming 2^24 messages in 16 bytes is sent (refused now); then two batches the SEND
    check lets through: 65,536 empty messages (the cursor's batch_size_max), and the largest
    possible, 5 MiB of 6-byte empty messages (873,813 in a ~7.7 KB ZLIB entry); then admin skips:
    2^24 (both whole entries), 65,535 (every index of the first but one, acked one by one), and
    65,536 + 873,812 (the first whole, all of the second but one)."""
    topic = "persistent://public/default/hx-skip"
    path = "/admin/v2/persistent/public/default/hx-skip"
    notes = []
    one = struct.pack(">I", 2) + b"\x18\x00"     # SingleMessageMetadata{payload_size: 0}
    conn = raw_producer(ctx, topic, "hx-skip-producer")
    try:
        for sub in ("s1", "s2", "s3"):
            ctx.admin("PUT", path + f"/subscription/{sub}")
        notes.append("2^24 claimed in 16 B: " + send_and_wait(conn, 0, make_batch_entry(2**24, b"\0" * 16), 2**24))
        counts = (65_536, (5 * MiB) // 6)
        for seq, count in enumerate(counts, 1):
            plain = one * count
            entry = make_batch_entry(count, zlib.compress(plain, 9), compression=pb.ZLIB,
                                     uncompressed_size=len(plain), sequence_id=seq)
            notes.append(f"{count:,} msgs in {len(entry):,} B: " + send_and_wait(conn, seq, entry, count))
    finally:
        conn.close()
    for sub, n in (("s1", 2**24), ("s2", counts[0] - 1), ("s3", counts[0] + counts[1] - 1)):
        t0 = time.monotonic()
        status, body = ctx.admin("POST", f"{path}/subscription/{sub}/skip/{n}", timeout_s=120)
        notes.append(f"skip {n:,}: HTTP {status} in {time.monotonic() - t0:.2f}s")
    return "; ".join(notes)


def batch_counts_send(ctx: Ctx) -> str:
    """SENDs declaring 2^31 (wrapped: -2^31) and 2^31-1 messages in the metadata and in
    CommandSend, 100 of each; then /metrics (it froze on the wrapped count) is fetched."""
    topic = "persistent://public/default/hx-counts"
    answers: dict[str, int] = {}
    conn = raw_producer(ctx, topic, "hx-counts-producer")
    try:
        seq = 0
        for _ in range(100):
            for count in (-2**31, 2**31 - 1):
                r = send_and_wait(conn, seq, make_batch_entry(count, b"\0" * 64, sequence_id=seq), count)
                answers[r] = answers.get(r, 0) + 1
                seq += 1
                if conn.closed:
                    conn.close()
                    conn = raw_producer(ctx, topic, "hx-counts-producer")
    finally:
        conn.close()
    t0 = time.monotonic()
    status, body = ctx.admin("GET", "/metrics", timeout_s=30)
    negative = [line for line in body.decode(errors="replace").splitlines()
                if "hx_counts" in line or "hx-counts" in line]
    neg = [line for line in negative if not line.startswith("#") and line.rsplit(" ", 1)[-1].startswith("-")]
    return (f"answers {answers}; /metrics HTTP {status} in {time.monotonic() - t0:.2f}s, "
            f"{len(neg)} negative hx-counts series")


def offload_compressed(ctx: Ctx) -> str:
    """240 ZLIB entries each declaring 5 MiB of zeros (~5 KB stored; 1.26 GB declared in all,
    about what the issue's ten 120 MB entries declared), one declaring 2^31-1 (refused at SEND
    now), the ledger closed (unload), then an admin offload of it to the file:// tier, waited
    for (at most 120 s)."""
    topic = "persistent://public/default/hx-offload"
    path = "/admin/v2/persistent/public/default/hx-offload"
    plain = b"\0" * (5 * MiB)
    packed = zlib.compress(plain, 9)
    meta = pb.MessageMetadata(producer_name="hx-off", sequence_id=0, publish_time=int(time.time() * 1000),
                              uncompressed_size=len(plain), compression=pb.ZLIB)
    answers: dict[str, int] = {}
    conn = raw_producer(ctx, topic, "hx-off")
    try:
        huge = pb.MessageMetadata(producer_name="hx-off", sequence_id=0, publish_time=int(time.time() * 1000),
                                  uncompressed_size=2**31 - 1, compression=pb.ZLIB).SerializeToString()
        r_huge = send_and_wait(conn, 0, struct.pack(">I", len(huge)) + huge + packed)
        for seq in range(1, 241):
            meta.sequence_id = seq
            m = meta.SerializeToString()
            r = send_and_wait(conn, seq, struct.pack(">I", len(m)) + m + packed)
            answers[r] = answers.get(r, 0) + 1
    finally:
        conn.close()
    status, body = ctx.admin("GET", path + "/internalStats")
    stats = json.loads(body)
    ledgers = [l["ledgerId"] for l in stats.get("ledgers", [])]
    ctx.admin("PUT", path + "/unload")
    time.sleep(1)
    # reload (a lookup by a producer) so the ledger list has a newer, open ledger
    client_conn = raw_producer(ctx, topic, "hx-off-2")
    client_conn.close()
    status, body = ctx.admin("GET", path + "/internalStats")
    stats = json.loads(body)
    ledgers = [l["ledgerId"] for l in stats.get("ledgers", [])]
    last = ledgers[-1]
    t0 = time.monotonic()
    st, b = ctx.admin_json("PUT", path + "/offload", {"ledgerId": last, "entryId": 0})
    outcome = f"trigger HTTP {st}"
    result = None
    while time.monotonic() - t0 < 120:
        st, b = ctx.admin("GET", path + "/offload")
        try:
            result = json.loads(b)
        except ValueError:
            result = {"status": f"HTTP {st}"}
        if result.get("status") in ("SUCCESS", "ERROR"):
            break
        time.sleep(0.5)
    tier_bytes = sum(p.stat().st_size for p in (ctx.base / "tier").rglob("*") if p.is_file())
    return (f"2^31-1 declared: {r_huge}; 240 x 5 MiB declared ({len(packed):,} B each): {answers}; "
            f"ledgers {ledgers}; offload {outcome}, {result.get('status') if result else '?'} after "
            f"{time.monotonic() - t0:.1f}s {(result or {}).get('lastError') or ''}; tier {tier_bytes / 1e6:.1f} MB")


def _hold(socks: list[socket.socket], hold_s: float, trickle: bool) -> tuple[int, float | None]:
    """Keep ``socks`` (trickling one byte each per second when ``trickle``) until all are closed
    by the peer or ``hold_s`` passed: (still open at the end, seconds until the last closed)."""
    t0 = time.monotonic()
    open_ = list(socks)
    last_close = None
    next_trickle = t0
    while open_ and time.monotonic() - t0 < hold_s:
        now = time.monotonic()
        if trickle and now >= next_trickle:
            for s in open_:
                try:
                    s.send(b"\0")
                except OSError:
                    pass
            next_trickle = now + 1.0
        still = []
        for s in open_:
            if closed_by_peer(s):
                last_close = time.monotonic() - t0
            else:
                still.append(s)
        open_ = still
        time.sleep(0.2)
    return len(open_), last_close


def _open_many(port: int, n: int, first: bytes, what: str) -> tuple[list[socket.socket], int]:
    socks, failed = [], 0
    for _ in range(n):
        try:
            s = socket.create_connection((LOOPBACK, port), timeout=5)
        except OSError:
            failed += 1
            continue
        socks.append(s)
        try:
            s.sendall(first)
        except OSError:
            pass
        s.setblocking(False)
    return socks, failed


def _many(ctx: Ctx, port: int, n: int, first: bytes, trickle: bool, what: str) -> str:
    t0 = time.monotonic()
    socks, failed = _open_many(port, n, first, what)
    opened = time.monotonic() - t0
    try:
        left, last = _hold(socks, ctx.hold_s, trickle)
    finally:
        for s in socks:
            s.close()
    return (f"{len(socks)} opened in {opened:.1f}s ({failed} refused); {left} of {len(socks)} still open "
            f"after {ctx.hold_s:.0f}s; last close at {'-' if last is None else f'{last:.1f}s'}")


def _block_send(s: socket.socket, data: bytes, timeout_s: float) -> int:
    s.settimeout(timeout_s)
    try:
        s.sendall(data)
        return len(data)
    except OSError:
        return 0


def preconnect_5mib(ctx: Ctx) -> str:
    """500 connections, each announcing a 5 MiB frame before CONNECT and sending 1 MiB of it."""
    socks, failed = [], 0
    sent = 0
    try:
        for _ in range(500):
            try:
                s = socket.create_connection((LOOPBACK, ctx.broker_port), timeout=5)
            except OSError:
                failed += 1
                continue
            socks.append(s)
            sent += _block_send(s, struct.pack(">I", 5 * MiB) + b"\0" * MiB, 2.0)
            s.setblocking(False)
        left, last = _hold(socks, ctx.hold_s, False)
    finally:
        for s in socks:
            s.close()
    return (f"{len(socks)} opened ({failed} refused), {sent / 1e6:.0f} MB accepted by the socket; "
            f"{left} still open after {ctx.hold_s:.0f}s; last close at {'-' if last is None else f'{last:.1f}s'}")


def preconnect_64k(ctx: Ctx) -> str:
    """500 connections, each holding a frame just under connect_frame_bytes_max (64 KiB) before
    CONNECT, one byte short of complete."""
    n = 64 * 1024 - 8
    return _many(ctx, ctx.broker_port, 500, struct.pack(">I", n) + b"\0" * (n - 1), False, "pre-connect 64k")


def slow_senders(ctx: Ctx) -> str:
    """500 connections, each sends CONNECT, then starts a 1000-byte frame and sends one byte of it
    a second."""
    first = c.connect("hostile-slow") + struct.pack(">I", 1000)
    return _many(ctx, ctx.broker_port, 500, first, True, "slow senders")


def bookie_unfinished(ctx: Ctx) -> str:
    """500 connections to one bookie, each announcing a 16 MiB frame and sending 1 MiB of it."""
    socks, failed, sent = [], 0, 0
    try:
        for _ in range(500):
            try:
                s = socket.create_connection((LOOPBACK, ctx.bookie_port), timeout=5)
            except OSError:
                failed += 1
                continue
            socks.append(s)
            sent += _block_send(s, BOOKIE_HEADER.pack(16 * MiB - 4, bpb.FRAME_ADD_REQUEST, 1) + b"\0" * MiB, 2.0)
            s.setblocking(False)
        left, last = _hold(socks, ctx.hold_s, False)
    finally:
        for s in socks:
            s.close()
    return (f"{len(socks)} opened ({failed} refused), {sent / 1e6:.0f} MB accepted by the sockets; "
            f"{left} still open after {ctx.hold_s:.0f}s; last close at {'-' if last is None else f'{last:.1f}s'}")


def bookie_slow(ctx: Ctx) -> str:
    """500 connections to one bookie, each starting a 1000-byte frame and sending a byte a second."""
    return _many(ctx, ctx.bookie_port, 500, struct.pack(">I", 1000), True, "bookie slow")


def bookie_rewrite(ctx: Ctx) -> str:
    """An entry written, then re-written with other bytes; an add to a ledger that was never
    created (ids >= 10**12: no metadata anywhere)."""
    ledger = 10**12 + int(time.time()) % 100_000

    def entry(eid: int, payload: bytes) -> bpb.Entry:
        return bpb.Entry(ledger_id=ledger, entry_id=eid, lac=-1, length=0, payload=payload,
                         checksum=entry_checksum(ledger, eid, -1, 0, payload))

    s = socket.create_connection((LOOPBACK, ctx.bookie_port), timeout=10)
    rid = 0

    def call(frame_type: int, msg):
        nonlocal rid
        rid += 1
        s.sendall(encode_message(frame_type, rid, msg))
        size, ftype, _ = BOOKIE_HEADER.unpack(recv_exactly(s, BOOKIE_HEADER.size))
        return BOOKIE_MESSAGE_TYPES[ftype].FromString(recv_exactly(s, size - 9))

    name = bpb.StatusCode.Name
    try:
        r1 = call(bpb.FRAME_ADD_REQUEST, bpb.AddRequest(entries=[entry(0, b"original")]))
        r2 = call(bpb.FRAME_ADD_REQUEST, bpb.AddRequest(entries=[entry(0, b"forged!!")]))
        r3 = call(bpb.FRAME_READ_REQUEST, bpb.ReadRequest(ledger_id=ledger, first_entry_id=0, last_entry_id=0))
        payload = r3.entries[0].payload if r3.entries else None
    finally:
        s.close()
    return (f"never-created ledger add: {name(r1.results[0].code)} (kept until the orphan GC: 1 h grace); "
            f"re-write with other bytes: {name(r2.results[0].code)}; read back {payload!r}")


def cumulative_ack_2_63(ctx: Ctx) -> str:
    """A consumer on a topic with 5 messages sends a cumulative ack of (2^63, 2^63)."""
    topic = "persistent://public/default/hx-ack"
    path = "/admin/v2/persistent/public/default/hx-ack"
    client = pulsar.Client(f"pulsar://{LOOPBACK}:{ctx.broker_port}", operation_timeout_seconds=30,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        p = client.create_producer(topic)
        for i in range(5):
            p.send(f"m{i}".encode())
        p.close()
    finally:
        client.close()
    conn = PulsarConn(ctx.broker_port)
    try:
        conn.connect()
        conn.send(c.subscribe(topic, "s", pb.CommandSubscribe.Exclusive, 1, 1,
                              initial_position=pb.CommandSubscribe.Earliest))
        conn.wait_for(lambda f: f.type in (T.SUCCESS, T.ERROR), 30)
        for cumulative in (True, False):
            conn.send(c.ack(1, [c.message_id(2**63, 2**63)], cumulative=cumulative, request_id=7))
            conn.wait_for(lambda f: f.type == T.ACK_RESPONSE, 3)
        time.sleep(1)
        status, body = ctx.admin("GET", path + "/internalStats")
        cursor = json.loads(body).get("cursors", {}).get("s", {})
        status, body = ctx.admin("GET", path + "/stats")
        backlog = json.loads(body).get("subscriptions", {}).get("s", {}).get("msgBacklog")
        alive = conn.send(c.ping()) and conn.wait_for(lambda f: f.type == T.PONG, 5) is not None
    finally:
        conn.close()
    return (f"markDeletePosition {cursor.get('markDeletePosition')}, backlog {backlog} (5 stored); "
            f"connection {'open' if alive else 'closed'}")


def admin_bad_bodies(ctx: Ctx) -> str:
    """For 15 s (at most 3,000 requests): bad JSON, invalid UTF-8, an unknown charset, a body
    claiming gzip that is not, a gzip bomb (256 MiB of zeros, ~250 KB), partitions 2^31 (update and
    create), a namespace's default partitions 2^31, a topic name with a newline."""
    status, _ = ctx.admin_json("PUT", "/admin/v2/tenants/hx", {"allowedClusters": ["standalone"]})
    ctx.admin_json("PUT", "/admin/v2/namespaces/hx/ns", {})
    tenant = "/admin/v2/tenants/hx"
    bomb = gzip.compress(b"\0" * (256 * MiB), 9)
    cases = [
        ("bad json", "POST", tenant, b"{\"allowedClusters\": [", {"Content-Type": "application/json"}),
        ("bad utf-8", "POST", tenant, b"{\"allowedClusters\": [\"\xff\xfe\"]}", {"Content-Type": "application/json"}),
        ("charset", "POST", tenant, b"{}", {"Content-Type": "application/json; charset=x-nonsense"}),
        ("not gzip", "POST", tenant, b"not gzip at all", {"Content-Type": "application/json", "Content-Encoding": "gzip"}),
        ("gzip bomb", "POST", tenant, bomb, {"Content-Type": "application/json", "Content-Encoding": "gzip"}),
        ("partitions 2^31", "PUT", "/admin/v2/persistent/hx/ns/p31/partitions", b"2147483648",
         {"Content-Type": "application/json"}),
        ("auto-create 2^31", "POST", "/admin/v2/namespaces/hx/ns/autoTopicCreation",
         json.dumps({"allowAutoTopicCreation": True, "topicType": "partitioned",
                     "defaultNumPartitions": 2**31}).encode(), {"Content-Type": "application/json"}),
        ("newline name", "PUT", "/admin/v2/persistent/hx/ns/a%0Ainjected%20line", None, {}),
    ]
    statuses: dict[str, dict[int, int]] = {}
    t0 = time.monotonic()
    n = 0
    while time.monotonic() - t0 < 15 and n < 3000:
        for label, method, path, body, headers in cases:
            try:
                st, _ = ctx.admin(method, path, body, headers, timeout_s=30)
            except Exception as e:  # noqa: BLE001
                st = type(e).__name__
            statuses.setdefault(label, {})
            statuses[label][st] = statuses[label].get(st, 0) + 1
            n += 1
    raw_newline = 0
    try:
        with open(ctx.broker_log, errors="replace") as f:
            raw_newline = sum(1 for line in f if line.startswith("injected line"))
    except OSError:
        pass
    five = sum(v for d in statuses.values() for k, v in d.items() if isinstance(k, int) and k >= 500)
    short = ", ".join(f"{k}: {'/'.join(f'{s}x{v}' for s, v in d.items())}" for k, d in statuses.items())
    return f"{n} requests, {five} answered 5xx; {short}; log lines starting with the injected name: {raw_newline}"


def admin_aborted_bodies(ctx: Ctx) -> str:
    """For 10 s (at most 1,500): a request announcing ~1 MiB of JSON, 600 KB sent, connection
    closed (the fuzz suite's aborted-body-memory input), 8 at a time."""
    body_head = (f"PUT /admin/v2/tenants/hx-abort HTTP/1.1\r\nHost: {LOOPBACK}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {1024 * 1024 - 100}\r\n\r\n").encode()
    chunk = body_head + b"[" + b"1," * 300_000
    count = 0
    lock = threading.Lock()
    stop_at = time.monotonic() + 10

    def worker() -> None:
        nonlocal count
        while time.monotonic() < stop_at:
            with lock:
                if count >= 1500:
                    return
                count += 1
            try:
                s = socket.create_connection((LOOPBACK, ctx.http_port), timeout=5)
                try:
                    s.sendall(chunk)
                finally:
                    s.close()
            except OSError:
                pass

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return f"{count} aborted requests of 600 KB each ({count * len(chunk) / 1e6:.0f} MB)"


INPUTS = [
    Input("baseline-idle", "broker", "-", baseline_idle),
    Input("unsupported-flood", "broker", "(1) 200,000 frames: 10.9 MB of log, loop blocked 5.1 s", unsupported_flood),
    Input("unsupported-reconnect", "broker", "(1) (one connection logged 200,000 lines)", unsupported_reconnect),
    Input("skip-huge-batch", "broker", "(1) skip over 1 entry claiming 2^24: loop 3.7 s, 1.15 GB", skip_huge_batch),
    Input("batch-count-send", "broker", "(2) 2^31 wrapped negative, froze /metrics; 2^31-1 crashed C++ consumers",
          batch_counts_send),
    Input("preconnect-5mib", "broker", "(3) 5 MiB unfinished frame per connection, no cap: 108 MB -> 1.48 GB",
          preconnect_5mib),
    Input("preconnect-64k", "broker", "(3) (the most a pre-CONNECT frame may hold now)", preconnect_64k),
    Input("slow-senders", "broker", "(3) 500 of 500 slow senders open after 100 s", slow_senders),
    Input("bookie-unfinished", "bookie", "(3) 16 MiB per unfinished frame: bookie 37 -> 359 MB", bookie_unfinished),
    Input("bookie-slow", "bookie", "(3) slow senders never closed", bookie_slow),
    Input("bookie-rewrite", "bookie", "(5) re-write replaced the entry; never-created ledger accepted", bookie_rewrite),
    Input("cumulative-ack-2^63", "broker", "(4) subscription moved to (2^63, 2^63)", cumulative_ack_2_63),
    Input("admin-bad-bodies", "broker", "(6) bad JSON/UTF-8/charset/gzip: 500 + traceback; 2^31 partitions; raw newlines",
          admin_bad_bodies),
    Input("admin-aborted-bodies", "broker", "(fuzz) 1500 aborted bodies: 57 MB -> 1.4 GiB", admin_aborted_bodies),
    Input("offload-compressed", "broker", "(3) 10 x 1.9 KB compressed: 126 MB -> 1.34 GB; 2^31-1 declared: offload failed forever",
          offload_compressed, late_rss_s=60),
]


# -- measuring one input -----------------------------------------------------------------------------
def lag_lines(path: str, start: int, end: int) -> list[float]:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read(max(0, end - start)).decode(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        i = line.find(LAG_LINE)
        if i >= 0:
            try:
                out.append(float(line[i + len(LAG_LINE):].split()[0]))
            except (ValueError, IndexError):
                pass
    return out


def measure(ctx: Ctx, inp: Input) -> Row:
    row = Row(inp.name, inp.target, inp.before)
    pid = ctx.broker_pid if inp.target == "broker" else ctx.bookie_pid
    log = ctx.broker_log if inp.target == "broker" else ctx.bookie_log
    probe = ctx.http_probe if inp.target == "broker" else ctx.bookie_probe
    row.rss_before = rss(pid)
    log_start = os.path.getsize(log)
    acked0, failed0 = ctx.canary.acked_count(), len(ctx.canary.failed)
    t0 = time.monotonic()
    with RssSampler(pid) as sampler:
        try:
            row.outcome = inp.run(ctx)
        except Exception as e:  # noqa: BLE001 - recorded; the next input still runs
            row.error = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        t1 = time.monotonic()
        time.sleep(1.0)     # lag lines written just after the input
        log_end = os.path.getsize(log)
        row.rss_peak = sampler.peak
    row.seconds = t1 - t0
    lags = lag_lines(log, log_start, log_end)
    row.lag_lines = len(lags)
    row.lag_max_ms = max(lags) if lags else None
    row.log_bytes = log_end - log_start
    row.probe_max_s, row.probe_p99_s, row.probe_n, row.probe_fail = probe.window(t0, t1 + 1.0)
    row.canary_acked = ctx.canary.acked_count() - acked0
    row.canary_failed = len(ctx.canary.failed) - failed0
    row.canary_gap_s = ctx.canary.longest_gap(t0, t1)
    time.sleep(max(0.0, ctx.settle_s - 1.0))
    row.rss_after = rss(pid)
    row.rss_peak = max(row.rss_peak or 0, row.rss_after)
    row.hwm = proc_status(pid, "VmHWM")
    if inp.late_rss_s > ctx.settle_s:
        time.sleep(inp.late_rss_s - ctx.settle_s)
        row.outcome += f"; RSS {inp.late_rss_s:.0f} s after: {mb(rss(pid))} MB"
    return row


def fmt_ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1000:.0f}"


def table(rows: list[Row]) -> str:
    out = ["| input | before (the issue) | what happened now | loop lag max (monitor, ms) | probe max / p99 (ms) "
           "| RSS MB before / peak / +10 s | log bytes | canary ok |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lag = "<20" if r.lag_max_ms is None else f"{r.lag_max_ms:.0f} ({r.lag_lines} lines >= 20)"
        probe = f"{fmt_ms(r.probe_max_s)} / {fmt_ms(r.probe_p99_s)}"
        if r.probe_fail:
            probe += f" ({r.probe_fail}/{r.probe_n} failed)"
        canary = (f"{'yes' if r.canary_ok else 'NO'} ({r.canary_acked} acked, longest gap {r.canary_gap_s:.1f}s"
                  + (f", {r.canary_failed} failed" if r.canary_failed else "") + ")")
        what = r.outcome + (f" ERROR {r.error}" if r.error else "")
        out.append(f"| {r.name} ({r.target}, {r.seconds:.0f}s) | {r.before} | {what} | {lag} | {probe} | "
                   f"{mb(r.rss_before)} / {mb(r.rss_peak)} / {mb(r.rss_after)} | {r.log_bytes:,} | {canary} |")
    return "\n".join(out)


# -- main ---------------------------------------------------------------------------------------------
def stop_everything(cluster: LocalCluster | None, pids: dict[str, int]) -> None:
    if cluster is not None:
        try:
            cluster.stop()
        except Exception as e:  # noqa: BLE001 - then by pid below
            print(f"cluster.stop: {e}", file=sys.stderr)
    for name, pid in pids.items():
        try:
            os.kill(pid, 0)
        except OSError:
            continue
        print(f"{name} (pid {pid}) still running after stop: killing it", file=sys.stderr)
        try:
            kill_process(pid)
        except Exception:   # noqa: BLE001
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated input names (see --list)")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--dir", default="", help="keep the run in this directory (not removed)")
    ap.add_argument("--hold-s", type=float, default=40.0,
                    help="how long held connections are kept (the defaults close them at 10-30 s)")
    ap.add_argument("--repeat", type=int, default=1, help="run each chosen input this many times in a row "
                    "(RSS that does not come back: held, or growing with each run?)")
    ap.add_argument("--settle-s", type=float, default=10.0, help="RSS 'after' is read this long after an input")
    args = ap.parse_args()
    if args.list:
        for i in INPUTS:
            print(f"{i.name:22s} {i.target:7s} {(i.run.__doc__ or '').split(chr(10))[0]}")
        return 0
    wanted = [s for s in args.only.split(",") if s]
    unknown = set(wanted) - {i.name for i in INPUTS}
    if unknown:
        ap.error(f"unknown input(s): {', '.join(sorted(unknown))}")
    chosen = [i for i in INPUTS if not wanted or i.name in wanted for _ in range(max(1, args.repeat))]

    with work_dir(args.dir, "pulsarlite-hostile-") as base:
        base.mkdir(parents=True, exist_ok=True)
        (base / "tier").mkdir(exist_ok=True)
        cluster: LocalCluster | None = None
        pids: dict[str, int] = {}
        canary = None
        probes: list[Probe] = []
        rows: list[Row] = []
        try:
            print(f"uptime: {os.popen('uptime').read().strip()}", file=sys.stderr)
            cluster = LocalCluster(base / "cluster")
            try:
                cluster.start_processes(
                    bookies=3, brokers=1,
                    bookie_overrides={"disk_usage_readonly_threshold": 0.995, "disk_usage_writable_threshold": 0.99},
                    broker_overrides={"offload.tier_uri": f"file://{base / 'tier'}"})
            finally:
                pids = {n: r.pid for n, r in cluster.records.items() if r.pid}
            broker = cluster.records[cluster.broker_names[0]]
            bookie_name = cluster.bookie_names[0]
            bookie = cluster.records[bookie_name]
            canary = Canary(cluster.service_url, "persistent://public/default/hx-canary", base / "canary-client.log",
                            interval_s=0.05)
            canary.start()
            if not canary.wait_acked(5, 60):
                raise RuntimeError("the canary did not start")
            hp = Probe(http_probe(broker.ports["http"]), "http")
            bp = Probe(BookieProbe(bookie.ports["bookie"]), "bookie")
            probes = [hp, bp]
            for p in probes:
                p.start()
            ctx = Ctx(cluster, base, broker.pid, broker.ports["pulsar"], broker.ports["http"], broker.log,
                      bookie_name, bookie.pid, bookie.ports["bookie"], bookie.log, args.hold_s, args.settle_s,
                      canary, hp, bp)
            time.sleep(3)
            for inp in chosen:
                print(f"--- {inp.name} ...", file=sys.stderr)
                row = measure(ctx, inp)
                rows.append(row)
                print(table([row]).splitlines()[-1], file=sys.stderr)
                dead = [n for n, r in cluster.records.items() if not r.alive()]
                if dead:
                    print(f"process(es) not running after {inp.name}: {dead}", file=sys.stderr)
                    break
            for p in probes:
                p.stop()
            probes = []
            canary.stop(consume_timeout_s=30, read_timeout_s=60)
            verdict = canary.verdict()
            print(f"\nuptime: {os.popen('uptime').read().strip()}")
            print(table(rows))
            print(f"\ncanary over the whole run: {canary.acked_count()} acked; "
                  + ("no problem" if not verdict else "; ".join(verdict)))
            return 0
        finally:
            for p in probes:
                p.stop()
            if canary is not None:
                canary.close()
            stop_everything(cluster, pids)


if __name__ == "__main__":
    sys.exit(main())
