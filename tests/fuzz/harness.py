"""What the fuzz tests share: the budget (seed, seconds, cases), the canary (the official
``pulsar-client`` producing and consuming one topic throughout), the watch over every process
(alive, RSS, open files, new tracebacks in its log), the fuzz loop, and seeded generators of
hostile values.

A fuzz run is deterministic in its inputs: case ``i`` of target ``t`` draws everything from
``random.Random(f"{t}/{seed}/{i}")``, whatever the answers to earlier cases were. Environment:

- ``PULSARLITE_FUZZ_SEED``: the seed (default: a random one, printed);
- ``PULSARLITE_FUZZ_SECONDS``: fuzzing time per target (default 5 in the README's test command,
  20 with ``PULSARLITE_FUZZ=1``, i.e. ``make fuzz``);
- ``PULSARLITE_FUZZ_CASES``: at most this many cases (a replay runs exactly the cases of a run);
- ``PULSARLITE_FUZZ_ONLY``: e.g. ``58,64``: only these cases of the seed (to isolate one);
- ``PULSARLITE_FUZZ_TRACE=1``: the cases journal also gets every process's RSS and open files
  after each case (to find which inputs hold memory).

Every failure message and the terminal summary say the seed and the replay command; the cases
journal (one line per case: what was sent, what came back) is in the test's temp directory.
Every loop is bounded in count and time; all traffic goes to 127.0.0.1; every socket a case
opens is closed by the case (``Sockets``).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import re
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

SEED_ENV = "PULSARLITE_FUZZ_SEED"
SECONDS_ENV = "PULSARLITE_FUZZ_SECONDS"
CASES_ENV = "PULSARLITE_FUZZ_CASES"
ONLY_ENV = "PULSARLITE_FUZZ_ONLY"       # e.g. "58,64": run only these cases (of the seed)
TRACE_ENV = "PULSARLITE_FUZZ_TRACE"     # "1": the journal also gets every process's RSS and fds after each case
FUZZ_ENV = "PULSARLITE_FUZZ"          # "1" (make fuzz): the longer default budget; "0": not collected
SECONDS_DEFAULT = 20.0                 # per target, with PULSARLITE_FUZZ=1 (make fuzz)
SECONDS_IN_SUITE_DEFAULT = 5.0         # per target, in the README's test command (~70 s for tests/fuzz)
CASES_MAX_DEFAULT = 1_000_000          # the time bound is the one that counts by default
LOOPBACK = "127.0.0.1"

# what "back near the baseline" means once the fuzzing stopped
RSS_SLACK_BYTES = 64 * 1024 * 1024
FDS_SLACK = 20
SETTLE_TIMEOUT_S = 30.0
# the canary: a stall is this long without an acknowledged send while the cluster is up; it is
# measured from the start of the fuzzing until the canary has CANARY_RESUME_SENDS more sends
# acknowledged after it (at most CANARY_RESUME_S), so that a stall that began during a short
# fuzzing is not cut off at its end
CANARY_STALL_S = 20.0
CANARY_RESUME_SENDS = 20
CANARY_RESUME_S = 30.0
CANARY_SEND_TIMEOUT_MS = 30_000


# -- budget ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    seed: int
    seconds: float
    cases_max: int
    seed_given: bool
    only: tuple[int, ...] = ()

    @classmethod
    def from_env(cls) -> "Budget":
        raw = os.environ.get(SEED_ENV, "").strip()
        seed = int(raw) if raw else random.SystemRandom().randrange(1, 2**31)
        seconds = float(os.environ.get(SECONDS_ENV, "") or seconds_default())
        cases = int(os.environ.get(CASES_ENV, "") or CASES_MAX_DEFAULT)
        if seconds <= 0 or cases <= 0:
            raise ValueError(f"{SECONDS_ENV} and {CASES_ENV} must be > 0")
        only = tuple(int(x) for x in os.environ.get(ONLY_ENV, "").replace(",", " ").split())
        return cls(seed, seconds, cases, bool(raw), only)

    def indices(self):
        return iter(self.only) if self.only else iter(range(self.cases_max))

    def case_rng(self, target: str, index: int) -> random.Random:
        return random.Random(f"{target}/{self.seed}/{index}")

    def replay(self, test_file: str, cases_run: int | None = None) -> str:
        """The command that runs the same inputs again (with the cases run, a time bound that
        leaves the count to decide)."""
        if cases_run:
            bound = f"{SECONDS_ENV}={self.seconds * 2 + 30:g} {CASES_ENV}={cases_run}"
        else:
            bound = f"{SECONDS_ENV}={self.seconds:g}"
        only = f" {ONLY_ENV}={','.join(map(str, self.only))}" if self.only else ""
        return f"{SEED_ENV}={self.seed} {bound}{only} .venv/bin/python -m pytest -p no:cacheprovider {test_file}"


def fuzz_timeout_s() -> float:
    """pytest-timeout bound for a fuzz test: its module's run (the fuzzing, plus the cluster,
    the canary and the checks) happens in the setup of its first test."""
    seconds = float(os.environ.get(SECONDS_ENV, "") or seconds_default())
    return seconds + 300.0


def seconds_default() -> float:
    """Fuzzing time per target when PULSARLITE_FUZZ_SECONDS is not set: short inside the
    README's test command, longer for ``make fuzz`` (PULSARLITE_FUZZ=1)."""
    return SECONDS_DEFAULT if os.environ.get(FUZZ_ENV, "") not in ("", "0") else SECONDS_IN_SUITE_DEFAULT


# -- /proc ----------------------------------------------------------------------------------------
def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no VmRSS for pid {pid}")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class ProcessSample:
    rss: int
    fds: int


class ProcessWatch:
    """Baselines, peaks (sampled from a thread) and the settle check of the cluster's processes
    (every bookie and broker; ZooKeeper is only checked alive)."""

    def __init__(self, cluster, names: Iterable[str]) -> None:
        self.cluster = cluster
        self.names = list(names)
        self.pids = {n: cluster.records[n].pid for n in self.names}
        self.baseline: dict[str, ProcessSample] = {}
        self.peak: dict[str, ProcessSample] = {}
        self.final: dict[str, ProcessSample] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, name: str) -> ProcessSample:
        pid = self.pids[name]
        return ProcessSample(rss_bytes(pid), fd_count(pid))

    def take_baseline(self) -> None:
        self.baseline = {n: self.sample(n) for n in self.names}
        self.peak = {n: dataclasses.replace(s) for n, s in self.baseline.items()}

    def start_sampling(self, interval_s: float = 0.1) -> None:
        def run() -> None:
            while not self._stop.is_set():
                for n in self.names:
                    try:
                        s = self.sample(n)
                    except OSError:
                        continue
                    p = self.peak[n]
                    p.rss, p.fds = max(p.rss, s.rss), max(p.fds, s.fds)
                self._stop.wait(interval_s)
        self._thread = threading.Thread(target=run, name="fuzz-process-sampler", daemon=True)
        self._thread.start()

    def stop_sampling(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def dead(self) -> list[str]:
        out = []
        for name, record in self.cluster.records.items():
            if not record.alive():
                out.append(f"{name} (pid {record.pid}) is not running; last lines of {record.log}:\n"
                           + log_tail(record.log))
        return out

    def settle(self, timeout_s: float = SETTLE_TIMEOUT_S) -> list[str]:
        """Wait (bounded) until every process is back near its baseline; the problems left."""
        deadline = time.monotonic() + timeout_s
        while True:
            problems = []
            for n in self.names:
                try:
                    s = self.sample(n)
                except OSError as e:
                    problems.append(f"{n}: cannot sample: {e}")
                    continue
                self.final[n] = s
                b = self.baseline[n]
                if s.rss >= b.rss + RSS_SLACK_BYTES:
                    problems.append(f"{n}: RSS {mib(s.rss)} MiB >= baseline {mib(b.rss)} MiB + "
                                    f"{mib(RSS_SLACK_BYTES)} MiB (peak {mib(self.peak[n].rss)} MiB)")
                if s.fds >= b.fds + FDS_SLACK:
                    problems.append(f"{n}: {s.fds} open files >= baseline {b.fds} + {FDS_SLACK} "
                                    f"(peak {self.peak[n].fds})")
            if not problems or time.monotonic() >= deadline:
                return [p + f" after waiting {timeout_s:.0f}s" for p in problems]
            time.sleep(0.5)

    def table(self) -> str:
        rows = []
        for n in self.names:
            b, p, f = self.baseline.get(n), self.peak.get(n), self.final.get(n)
            if b is None:
                continue
            rows.append(f"  {n:9s} rss MiB base {mib(b.rss):6.1f} peak {mib(p.rss):6.1f} "
                        f"final {mib(f.rss) if f else float('nan'):6.1f} | fds base {b.fds} peak {p.fds} "
                        f"final {f.fds if f else '?'}")
        return "\n".join(rows)


def mib(n: int) -> float:
    return round(n / (1024 * 1024), 1)


def log_tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()[-20_000:]
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


class LogScan:
    """New log records with a traceback (or at CRITICAL) in the processes' logs since ``mark()``.
    A record starts at a line with a timestamp; lines without one (traceback lines, output of
    the process itself) belong to the record before them."""

    PATTERN = re.compile(r"Traceback \(most recent call last\)|\bCRITICAL\b")
    RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")
    RECORD_LINES_MAX = 80

    def __init__(self, cluster, names: Iterable[str]) -> None:
        self.paths = {n: cluster.records[n].log for n in names}
        self.offsets: dict[str, int] = {}

    def mark(self) -> None:
        self.offsets = {n: _size(p) for n, p in self.paths.items()}

    def new_text(self, name: str) -> str:
        try:
            with open(self.paths[name], "rb") as f:
                f.seek(self.offsets.get(name, 0))
                return f.read(50 * 1024 * 1024).decode(errors="replace")
        except OSError:
            return ""

    def tracebacks(self) -> dict[str, list[str]]:
        """name -> the records (at most RECORD_LINES_MAX lines each) holding a traceback."""
        found: dict[str, list[str]] = {}
        for name in self.paths:
            records: list[list[str]] = []
            for line in self.new_text(name).splitlines():
                if self.RECORD_START.match(line) or not records:
                    records.append([line])
                elif len(records[-1]) < self.RECORD_LINES_MAX:
                    records[-1].append(line)
            hits = ["\n".join(r) for r in records if any(self.PATTERN.search(line) for line in r)]
            if hits:
                found[name] = hits
        return found


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


# -- the canary -----------------------------------------------------------------------------------
class Canary:
    """One official-client producer (deduplicated name, no batching) sending ``canary|<seq>``
    payloads one at a time, and one consumer (Earliest, Exclusive) receiving and acknowledging
    them, each on its own thread, until stopped. Afterwards a reader from the earliest message
    reads the topic back for :meth:`verdict`."""

    def __init__(self, service_url: str, topic: str, log_path: Path, *, interval_s: float = 0.01) -> None:
        import pulsar
        self.pulsar = pulsar
        self.topic = topic
        self.interval_s = interval_s
        self.client = pulsar.Client(service_url, operation_timeout_seconds=30,
                                    logger=pulsar.FileLogger(pulsar.LoggerLevel.Info, str(log_path)))
        self.acked: list[bytes] = []
        self.ack_times: list[float] = []
        self.failed: list[str] = []
        self.received: list[bytes] = []
        self.consumer_errors: list[str] = []
        self.read_back: list[bytes] | None = None
        self._lock = threading.Lock()
        self._stop_producing = threading.Event()
        self._stop_consuming = threading.Event()
        self._threads: list[threading.Thread] = []
        self.producer = None
        self.consumer = None

    def start(self) -> None:
        p = self.pulsar
        self.consumer = self.client.subscribe(self.topic, "canary", consumer_type=p.ConsumerType.Exclusive,
                                              initial_position=p.InitialPosition.Earliest)
        self.producer = self.client.create_producer(self.topic, producer_name="canary-producer",
                                                    batching_enabled=False, block_if_queue_full=True,
                                                    send_timeout_millis=CANARY_SEND_TIMEOUT_MS)
        for target, name in ((self._produce, "canary-producer"), (self._consume, "canary-consumer")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _produce(self) -> None:
        seq = 0
        while not self._stop_producing.is_set():
            data = f"canary|{seq}".encode()
            try:
                self.producer.send(data)
            except Exception as e:   # noqa: BLE001 - recorded: a failed send is a finding
                with self._lock:
                    self.failed.append(f"seq {seq} at {time.monotonic():.1f}: {type(e).__name__}: {e}")
            else:
                with self._lock:
                    self.acked.append(data)
                    self.ack_times.append(time.monotonic())
            seq += 1
            self._stop_producing.wait(self.interval_s)

    def _consume(self) -> None:
        while not self._stop_consuming.is_set():
            try:
                msg = self.consumer.receive(timeout_millis=200)
            except Exception as e:   # noqa: BLE001 - a timeout, or a real error (recorded)
                if "timeout" not in str(e).lower() and type(e).__name__ != "Timeout":
                    self.consumer_errors.append(f"{type(e).__name__}: {e}")
                    self._stop_consuming.wait(0.2)
                continue
            with self._lock:
                self.received.append(msg.data())
            try:
                self.consumer.acknowledge(msg)
            except Exception as e:   # noqa: BLE001
                self.consumer_errors.append(f"ack: {type(e).__name__}: {e}")

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def wait_acked(self, n: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.acked_count() < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.acked_count() >= n

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time in [start, end] without an acknowledged send."""
        with self._lock:
            times = [t for t in self.ack_times if start <= t <= end]
        points = [start] + times + [end]
        return max(b - a for a, b in zip(points, points[1:]))

    def stop(self, consume_timeout_s: float = 30.0, read_timeout_s: float = 60.0) -> None:
        """Stop producing; let the consumer catch up (bounded); read the topic back."""
        self._stop_producing.set()
        self._threads[0].join(timeout=CANARY_SEND_TIMEOUT_MS / 1000 + 10)
        with self._lock:
            wanted = set(self.acked)
        deadline = time.monotonic() + consume_timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if wanted <= set(self.received):
                    break
            time.sleep(0.1)
        self._stop_consuming.set()
        self._threads[1].join(timeout=10)
        self.read_back = self._read_all(read_timeout_s)

    def _read_all(self, timeout_s: float) -> list[bytes]:
        with self._lock:
            last = self.acked[-1] if self.acked else None
        reader = self.client.create_reader(self.topic, self.pulsar.MessageId.earliest)
        out: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                try:
                    msg = reader.read_next(timeout_millis=1000)
                except Exception:   # noqa: BLE001 - a timeout: done if nothing more is available
                    if (last is None or last in out) and not _has_more(reader):
                        break
                    continue
                out.append(msg.data())
        finally:
            reader.close()
        return out

    def verdict(self) -> list[str]:
        """Problems: acknowledged payloads missing, stored twice, out of order, foreign
        payloads, failed sends; the live consumer missing acknowledged payloads."""
        problems = []
        acked = list(self.acked)
        read = list(self.read_back or [])
        if self.failed:
            problems.append(f"{len(self.failed)} canary sends failed (first: {self.failed[:3]})")
        counts = collections.Counter(read)
        dups = sorted((p for p, n in counts.items() if n > 1), key=_seq)
        if dups:
            problems.append(f"{len(dups)} payloads stored more than once, e.g. "
                            f"{[(p.decode(errors='replace'), counts[p]) for p in dups[:5]]}")
        stored = set(read)
        lost = [p for p in acked if p not in stored]
        if lost:
            problems.append(f"{len(lost)} of {len(acked)} acknowledged payloads missing from the read-back, "
                            f"e.g. {[p.decode(errors='replace') for p in lost[:5]]}")
        acked_set = set(acked)
        firsts = []
        seen = set()
        for p in read:
            if p in acked_set and p not in seen:
                seen.add(p)
                firsts.append(p)
        expected = [p for p in acked if p in seen]
        if firsts != expected:
            bad = next(i for i, (a, b) in enumerate(zip(firsts, expected)) if a != b)
            problems.append(f"acknowledged payloads out of order in the read-back from index {bad}: "
                            f"read {firsts[bad:bad + 3]}, sent {expected[bad:bad + 3]}")
        foreign = [p for p in read if not p.startswith(b"canary|")]
        if foreign:
            problems.append(f"{len(foreign)} foreign payloads in the canary topic, e.g. {foreign[:3]}")
        missed = [p for p in acked if p not in set(self.received)]
        if missed:
            problems.append(f"the live consumer never received {len(missed)} acknowledged payloads, e.g. "
                            f"{[p.decode() for p in missed[:5]]}")
        if self.consumer_errors:
            problems.append(f"consumer errors: {self.consumer_errors[:3]}")
        return problems

    def close(self) -> None:
        self._stop_producing.set()
        self._stop_consuming.set()
        for t in self._threads:
            t.join(timeout=CANARY_SEND_TIMEOUT_MS / 1000 + 10)
        try:
            self.client.close()
        except Exception:   # noqa: BLE001 - closing after a failure
            pass


def _seq(payload: bytes) -> int:
    try:
        return int(payload.rsplit(b"|", 1)[1])
    except (IndexError, ValueError):
        return -1


def _has_more(reader) -> bool:
    try:
        return reader.has_message_available()
    except Exception:   # noqa: BLE001
        return True


# -- sockets --------------------------------------------------------------------------------------
class Sockets:
    """Every socket a case opens, closed when the case ends (``with Sockets() as s``)."""

    def __init__(self) -> None:
        self.open: list[socket.socket] = []

    def connect(self, port: int, timeout_s: float = 3.0) -> socket.socket:
        sock = socket.create_connection((LOOPBACK, port), timeout=timeout_s)
        self.open.append(sock)
        return sock

    def __enter__(self) -> "Sockets":
        return self

    def __exit__(self, *exc) -> None:
        self.close_all()

    def close_all(self, rng: random.Random | None = None) -> None:
        for sock in self.open:
            try:
                if rng is not None and rng.random() < 0.3:   # a reset instead of a FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
            except OSError:
                pass
        self.open.clear()


def send_quietly(sock: socket.socket, data: bytes) -> bool:
    """sendall; False if the peer closed or reset the connection."""
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False


def recv_available(sock: socket.socket, timeout_s: float, limit: int = 8 * 1024 * 1024, *,
                   return_on_data: bool = False) -> tuple[bytes, bool]:
    """What arrives within ``timeout_s`` (stops early once the peer closed; with
    ``return_on_data``, also once something arrived and nothing more is ready): (data, closed)."""
    chunks = []
    total = 0
    deadline = time.monotonic() + timeout_s
    while total < limit:
        left = max(0.0, deadline - time.monotonic())
        if left <= 0 and not (return_on_data and chunks):
            break
        try:
            ready, _, _ = select.select([sock], [], [], left)
        except (OSError, ValueError):
            return b"".join(chunks), True
        if not ready:
            break
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            continue
        except OSError:
            return b"".join(chunks), True
        if not data:
            return b"".join(chunks), True
        chunks.append(data)
        total += len(data)
        if return_on_data:
            deadline = 0.0
    return b"".join(chunks), False


# -- hostile values -------------------------------------------------------------------------------
U64_SPECIAL = (0, 1, 2, 127, 128, 255, 256, 65535, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1,
               2**62, 2**63 - 1, 2**63, 2**63 + 1, 2**64 - 2, 2**64 - 1)


def u64(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.5:
        return rng.choice(U64_SPECIAL)
    if r < 0.8:
        return rng.randrange(0, 1000)
    return rng.getrandbits(64)


def i64(rng: random.Random) -> int:
    v = u64(rng)
    return v - 2**64 if v >= 2**63 else v


def u32(rng: random.Random) -> int:
    return u64(rng) & 0xFFFF_FFFF


def i32(rng: random.Random) -> int:
    v = u32(rng)
    return v - 2**32 if v >= 2**31 else v


WEIRD_STRINGS = ("", " ", "\n", "\r\n", "a\nb", "\t", "\x00", "a\x00b", "é", "日本語", "\U0001f642", "\u202e",
                 "..", ".", "/", "//", "../../etc/passwd", "%2e%2e%2f", "%00", "%", "?", "#", "a b", "\\",
                 "persistent://", "non-persistent://public/default/x", "persistent:///", "persistent://a",
                 "persistent://public//x", "persistent://public/default/", "-partition-", "x-partition-",
                 "x-partition-99999999999", "x-partition--1", "x-partition-2147483648", "${jndi:ldap://x}",
                 "'; DROP TABLE topics; --", "<script>", "{}", "[]", "null", "true", "-1", "0x10",
                 "NaN", "1e309", "\ufeff", "\ufffd")


def weird_string(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.45:
        return rng.choice(WEIRD_STRINGS)
    if r < 0.6:
        return rng.choice("abcxyz-_.:=") * rng.choice((1, 2, 255, 256, 1024, 2048, 2049, 4096, 70_000))
    if r < 0.8:
        n = rng.randrange(0, 40)
        return "".join(chr(rng.randrange(32, 127)) for _ in range(n))
    n = rng.randrange(0, 20)
    return "".join(_random_char(rng) for _ in range(n))


def _random_char(rng: random.Random) -> str:
    while True:
        c = rng.randrange(0, 0x110000)
        if not 0xD800 <= c <= 0xDFFF:    # protobuf strings must be valid UTF-8
            return chr(c)


def random_bytes(rng: random.Random, n: int) -> bytes:
    return rng.getrandbits(8 * n).to_bytes(n, "little") if n else b""


def mutate_bytes(rng: random.Random, data: bytes, edits: int | None = None) -> bytes:
    """Bit flips, byte replacements, insertions, deletions, duplications, truncation."""
    buf = bytearray(data)
    for _ in range(edits or rng.randrange(1, 6)):
        op = rng.randrange(6)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf and pos < len(buf):
            buf[pos] ^= 1 << rng.randrange(8)
        elif op == 1 and buf and pos < len(buf):
            buf[pos] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
        elif op == 2:
            buf[pos:pos] = random_bytes(rng, rng.randrange(1, 9))
        elif op == 3 and buf:
            del buf[pos:pos + rng.randrange(1, 9)]
        elif op == 4 and buf:
            chunk = buf[pos:pos + rng.randrange(1, 17)]
            buf[pos:pos] = chunk
        elif op == 5 and buf:
            del buf[rng.randrange(len(buf)):]
    return bytes(buf)


def random_message(rng: random.Random, message_class, *, depth: int = 0, strings: Callable | None = None,
                   required_p: float = 0.95, optional_p: float = 0.35, overrides: dict | None = None):
    """A protobuf message with random values in random fields (required ones almost always set).
    ``strings(rng, field)`` chooses string values; ``overrides`` maps a field name to a
    function ``rng -> value`` (or to a fixed value), always set (``skip()``: never set)."""
    message = message_class()
    fd = message_class.DESCRIPTOR
    overrides = overrides or {}
    for f in fd.fields:
        p = required_p if f.is_required else optional_p
        if f.name in overrides:
            value = overrides[f.name]
            if value is not _SKIP:      # an override is always set
                _assign(message, f, value(rng) if callable(value) else value)
            continue
        if rng.random() >= p:
            continue
        if f.type == f.TYPE_MESSAGE:
            if depth >= 3:
                continue
            if f.is_repeated:
                for _ in range(rng.choice((0, 1, 1, 2, 3))):
                    getattr(message, f.name).add().CopyFrom(
                        random_message(rng, _class_of(f), depth=depth + 1, strings=strings))
            else:
                getattr(message, f.name).CopyFrom(random_message(rng, _class_of(f), depth=depth + 1,
                                                                 strings=strings))
            continue
        count = rng.choice((0, 1, 1, 2, 5)) if f.is_repeated else 1
        values = [_scalar(rng, f, strings) for _ in range(count)]
        if f.is_repeated:
            getattr(message, f.name).extend(values)
        else:
            setattr(message, f.name, values[0])
    return message


_SKIP = object()


def skip() -> object:
    """In ``random_message(overrides=...)``: never set this field."""
    return _SKIP


def _assign(message, f, value) -> None:
    if f.type == f.TYPE_MESSAGE:
        getattr(message, f.name).CopyFrom(value)
    elif f.is_repeated:
        getattr(message, f.name).extend(value if isinstance(value, (list, tuple)) else [value])
    else:
        setattr(message, f.name, value)


def _class_of(f):
    from google.protobuf import message_factory
    return message_factory.GetMessageClass(f.message_type)


def _scalar(rng: random.Random, f, strings):
    t = f.type
    if t in (f.TYPE_UINT64, f.TYPE_FIXED64):
        return u64(rng)
    if t in (f.TYPE_INT64, f.TYPE_SINT64, f.TYPE_SFIXED64):
        return i64(rng)
    if t in (f.TYPE_UINT32, f.TYPE_FIXED32):
        return u32(rng)
    if t in (f.TYPE_INT32, f.TYPE_SINT32, f.TYPE_SFIXED32):
        return i32(rng)
    if t == f.TYPE_BOOL:
        return rng.random() < 0.5
    if t in (f.TYPE_DOUBLE, f.TYPE_FLOAT):
        return rng.choice((0.0, -1.0, 1e300, float("inf"), float("nan"), rng.random()))
    if t == f.TYPE_STRING:
        return strings(rng, f) if strings is not None else weird_string(rng)
    if t == f.TYPE_BYTES:
        return random_bytes(rng, rng.choice((0, 1, 8, 16, 100, rng.randrange(0, 2000))))
    if t == f.TYPE_ENUM:
        return rng.choice([v.number for v in f.enum_type.values])
    raise AssertionError(f"unhandled field type {t} of {f.full_name}")


# -- the run --------------------------------------------------------------------------------------
# a finding of a known, reported defect: its kind starts with this (the general check skips it;
# the defect has its own deterministic xfail test)
KNOWN_PREFIX = "known defect "

@dataclass
class Findings:
    """Defects a fuzz target observed itself (no answer, an undecodable answer, a 500...),
    counted by kind with the first examples, and outcome counts for the report."""

    examples_max: int = 8
    by_kind: dict[str, list[str]] = field(default_factory=dict)
    counts: collections.Counter = field(default_factory=collections.Counter)
    outcomes: collections.Counter = field(default_factory=collections.Counter)

    def add(self, kind: str, detail: str) -> None:
        self.counts[kind] += 1
        examples = self.by_kind.setdefault(kind, [])
        if len(examples) < self.examples_max:
            examples.append(detail)

    def note(self, outcome: str) -> None:
        self.outcomes[outcome] += 1

    def report(self, kinds: Iterable[str] | None = None) -> list[str]:
        chosen = sorted(self.by_kind if kinds is None else kinds)
        return [f"{kind} ({self.counts[kind]} times), e.g.:\n    " + "\n    ".join(self.by_kind[kind])
                for kind in chosen]


@dataclass
class FuzzResult:
    target: str
    budget: Budget
    test_file: str
    cases_run: int = 0
    fuzz_seconds: float = 0.0
    canary_problems: list[str] = field(default_factory=list)
    canary_acked: int = 0
    canary_acked_during_fuzz: int = 0
    canary_longest_gap_s: float = 0.0
    dead: list[str] = field(default_factory=list)
    settle_problems: list[str] = field(default_factory=list)
    process_table: str = ""
    tracebacks: dict[str, list[str]] = field(default_factory=dict)
    findings: Findings = field(default_factory=Findings)
    journal: str = ""
    wall_seconds: float = 0.0

    def context(self) -> str:
        return (f"[fuzz {self.target}] seed {self.budget.seed}, {self.cases_run} cases in "
                f"{self.fuzz_seconds:.1f}s; replay: {self.budget.replay(self.test_file, self.cases_run)}; "
                f"cases journal: {self.journal}")

    def summary(self) -> str:
        outcomes = ", ".join(f"{k} {v}" for k, v in self.findings.outcomes.most_common(25))
        logs = ", ".join(f"{n} {len(r)}" for n, r in self.tracebacks.items()) or "none"
        return (f"{self.context()}\n  new log records with a traceback: {logs}\n"
                f"  canary: {self.canary_acked} acknowledged "
                f"({self.canary_acked_during_fuzz} during the fuzzing), longest gap between acks "
                f"(the fuzzing and after it, until the canary went on) {self.canary_longest_gap_s:.2f}s\n"
                f"{self.process_table}\n"
                f"  outcomes: {outcomes}\n  wall {self.wall_seconds:.1f}s")


RUNS: list[str] = []        # one line per fuzz run of this session (the terminal summary shows them)


class Journal:
    """One line per case (index, kind, short description): the file named in failures."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = open(path, "w", buffering=1)

    def case(self, index: int, text: str) -> None:
        self._f.write(f"{index:6d} " + text[:2000].replace("\r", "\\r").replace("\n", "\\n") + "\n")

    def close(self) -> None:
        self._f.close()


def run_fuzz(target: str, *, cluster, budget: Budget, directory: Path, test_file: str,
             fuzz_case: Callable[[random.Random, int, Findings, Journal], None],
             setup: Callable[[], None] | None = None) -> FuzzResult:
    """The whole run for one target: the canary starts and warms up, baselines are taken, the
    cases run until the budget is spent, then the canary stops and reads back, and every
    process is checked (alive, back near its baseline, no new traceback in its log)."""
    started = time.monotonic()
    result = FuzzResult(target, budget, test_file)
    print(f"\n[fuzz {target}] seed {budget.seed} ({'given' if budget.seed_given else 'random'}), "
          f"{budget.seconds:g}s; replay: {budget.replay(test_file)}", flush=True)
    names = cluster.bookie_names + cluster.broker_names
    watch = ProcessWatch(cluster, names)
    scan = LogScan(cluster, names)
    canary_topic = f"persistent://public/default/canary-{target}-{budget.seed}"
    canary = Canary(cluster.service_url, canary_topic, directory / f"canary-{target}-client.log")
    journal = Journal(directory / f"fuzz-{target}-{budget.seed}.cases")
    result.journal = str(journal.path)
    findings = result.findings
    try:
        canary.start()
        if not canary.wait_acked(50, 60):
            raise AssertionError(f"the canary did not get going before the fuzzing: {canary.failed[:3]}")
        if setup is not None:
            setup()
        time.sleep(1.0)
        watch.take_baseline()
        scan.mark()
        watch.start_sampling()
        acked_before = canary.acked_count()
        fuzz_start = time.monotonic()
        deadline = fuzz_start + budget.seconds
        index = 0
        trace = os.environ.get(TRACE_ENV, "") not in ("", "0")
        for case in budget.indices():
            if time.monotonic() >= deadline:
                break
            fuzz_case(budget.case_rng(target, case), case, findings, journal)
            index += 1
            if trace:
                journal.case(case, "  after: " + " ".join(
                    f"{n}={mib(s.rss)}MiB/{s.fds}fd" for n, s in ((n, watch.sample(n)) for n in watch.names)))
            if index % 50 == 0 and watch.dead():
                findings.add("process died during the fuzzing", f"noticed after case {case}")
                break
        fuzz_end = time.monotonic()
        result.cases_run = index
        result.fuzz_seconds = fuzz_end - fuzz_start
        result.canary_acked_during_fuzz = canary.acked_count() - acked_before
        # the canary must go on once the fuzzing stopped; a stall is measured until it did
        resumed = canary.wait_acked(canary.acked_count() + CANARY_RESUME_SENDS, CANARY_RESUME_S)
        result.canary_longest_gap_s = canary.longest_gap(fuzz_start, time.monotonic())
        if result.canary_longest_gap_s > CANARY_STALL_S:
            result.canary_problems.append(
                f"canary stalled: {result.canary_longest_gap_s:.1f}s without an acknowledged send "
                f"from the start of the fuzzing until it went on after it (bound {CANARY_STALL_S:.0f}s)")
        if not resumed:
            result.canary_problems.append(
                f"the canary did not get {CANARY_RESUME_SENDS} more sends acknowledged within "
                f"{CANARY_RESUME_S:.0f}s after the fuzzing")
        canary.stop()   # then read everything back
        result.canary_acked = len(canary.acked)
        result.canary_problems += canary.verdict()
        result.dead = watch.dead()
        if not result.dead:
            result.settle_problems = watch.settle()
        watch.stop_sampling()
        result.process_table = watch.table()
        result.tracebacks = scan.tracebacks()
    finally:
        watch.stop_sampling()
        journal.close()
        canary.close()
        result.wall_seconds = time.monotonic() - started
    RUNS.append(f"{target}: seed {budget.seed}, {result.cases_run} cases in {result.fuzz_seconds:.0f}s; "
                f"replay: {budget.replay(test_file, result.cases_run)}")
    print(result.summary(), flush=True)
    for line in findings.report():
        print("  finding: " + line, flush=True)
    return result


# -- the checks of a run ----------------------------------------------------------------------------
class FuzzChecks:
    """The checks of one fuzz run, as tests (subclass it as ``Test...`` in a module that has a
    module-scoped fixture ``result`` giving the :class:`FuzzResult`). One test per check, so a
    known defect can be marked on its own check only."""

    # known, reported defects: (defect id, (regex, ...)): a log record matching every regex of
    # one is that defect's, checked by its own deterministic xfail test, not by the check here
    known_tracebacks: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def test_canary_lost_nothing_and_stored_nothing_twice(self, result: FuzzResult) -> None:
        assert result.canary_acked > 0, result.context()
        assert not result.canary_problems, result.context() + "\n" + "\n".join(result.canary_problems)

    def test_every_process_is_still_alive(self, result: FuzzResult) -> None:
        assert not result.dead, result.context() + "\n" + "\n".join(result.dead)

    def test_memory_and_open_files_back_near_baseline(self, result: FuzzResult) -> None:
        assert not result.dead, "a process died: nothing to compare"
        assert not result.settle_problems, (result.context() + "\n" + "\n".join(result.settle_problems)
                                            + "\n" + result.process_table)

    def test_no_new_traceback_in_the_process_logs(self, result: FuzzResult) -> None:
        """Log records with a traceback, except those of a known defect (``known_tracebacks``:
        each has its own deterministic xfail test)."""
        unknown = {}
        for name, records in result.tracebacks.items():
            left = [r for r in records if known_defect_of(r, self.known_tracebacks) is None]
            if left:
                unknown[name] = left
        assert not unknown, result.context() + "\n" + "\n\n".join(
            f"--- {name}: {len(ex)} new log record(s) with a traceback, first:\n{ex[0]}"
            for name, ex in unknown.items())

    def test_no_finding_of_the_fuzzer(self, result: FuzzResult) -> None:
        """What the target's own checks saw: a request never answered, an undecodable answer,
        a 500, a refused frame that was stored anyway... (except known defects: kinds that
        start with KNOWN_PREFIX, each with its own deterministic xfail test)."""
        unknown = [k for k in result.findings.by_kind if not k.startswith(KNOWN_PREFIX)]
        assert not unknown, result.context() + "\n" + "\n".join(result.findings.report(unknown))


def known_defect_of(record: str, known: tuple) -> str | None:
    """The id of the known defect whose patterns all occur in this log record, if any."""
    for defect, patterns in known:
        if all(re.search(p, record) for p in patterns):
            return defect
    return None
