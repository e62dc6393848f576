"""A standalone ZooKeeper server process (Debian's ``zookeeper`` package), for the cluster
launcher and for tests.

The server runs ``java ... QuorumPeerMain zoo.cfg`` in its own session (so it outlives the
process that started it), with its data, ``zoo.cfg`` and ``zookeeper.log`` in one directory.
Health is checked with the four-letter words: ``ruok`` must answer ``imok`` and ``srvr`` must
show a ``Mode:`` line (``ruok`` answers before the server serves requests).

Also holds the small process helpers the launcher shares: free ports, liveness by pid (zombies
count as dead), and "SIGTERM, wait a bounded time, then SIGKILL".
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from pulsarlite.errors import PulsarliteError, TimeoutError_

ZOOKEEPER_CLASSPATH = "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar"
ZOOKEEPER_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
JVM_OPTIONS = ("-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")
LOOPBACK = "127.0.0.1"


class ZooKeeperStartError(PulsarliteError):
    """The ZooKeeper process exited or did not become healthy in time."""


# -- ports and four-letter words -------------------------------------------------------------

# Ports handed out by find_free_port, by any process on this machine: one empty file per port,
# created exclusively. Between the pick and the process binding it the port is free in the
# kernel's eyes, so two processes picking at once (two pytest-xdist workers starting clusters)
# could be handed the same one: a bookie then failed "address already in use" (session 17).
PORT_RESERVATIONS_DIR = Path(tempfile.gettempdir()) / "pulsarlite-port-reservations"
PORT_RESERVATION_S = 600.0


def find_free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free a moment ago (bind to port 0, read it, close) and that this
    function handed to no process on this machine in the last PORT_RESERVATION_S seconds."""
    port = 0
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if _reserve(port):
            return port
    return port      # every pick reserved (not expected): the kernel's free port, unreserved


def _reserve(port: int) -> bool:
    marker = PORT_RESERVATIONS_DIR / str(port)
    try:
        PORT_RESERVATIONS_DIR.mkdir(exist_ok=True)
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return True
    except FileExistsError:
        try:
            if time.time() - marker.stat().st_mtime > PORT_RESERVATION_S:
                marker.unlink()          # an old reservation: taken again on the next pick
        except FileNotFoundError:
            pass
        return False
    except OSError:
        return True      # no writable temp directory: no reservations, the port as before


def port_accepts(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True if a TCP connection to (host, port) succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def four_letter_word(host: str, port: int, word: str, timeout_s: float = 2.0) -> str:
    """Send a ZooKeeper four-letter word and return the whole answer ('' if none).
    Raises OSError when the port does not answer."""
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(word.encode("ascii"))
        chunks = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")


def zookeeper_healthy(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """``ruok`` -> ``imok`` and ``srvr`` shows the server serving (a ``Mode:`` line)."""
    try:
        if four_letter_word(host, port, "ruok", timeout_s).strip() != "imok":
            return False
        return "Mode:" in four_letter_word(host, port, "srvr", timeout_s)
    except OSError:
        return False


def wait_zookeeper(host: str, port: int, timeout_s: float) -> None:
    """Wait until ZooKeeper at (host, port) is healthy; raises TimeoutError_ after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        if zookeeper_healthy(host, port, timeout_s=min(2.0, max(0.1, timeout_s))):
            return
        if time.monotonic() >= deadline:
            raise TimeoutError_(f"ZooKeeper at {host}:{port} not healthy after {timeout_s}s")
        time.sleep(0.05)


# -- processes by pid ------------------------------------------------------------------------

def process_alive(pid: int | None) -> bool:
    """True if ``pid`` names a running process (a zombie counts as dead)."""
    if not pid or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        state = stat.rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True


def process_cmdline(pid: int) -> list[str]:
    """The argv of a running process ([] if gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


def process_matches(pid: int | None, marker: str) -> bool:
    """True if ``pid`` is alive and its argv mentions ``marker`` (e.g. its config path): a guard
    against signalling a recycled pid that belongs to someone else."""
    return bool(pid) and process_alive(pid) and any(marker in arg for arg in process_cmdline(pid))


def _wait_dead(pid: int, popen: subprocess.Popen | None, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if popen is not None:
            if popen.poll() is not None:
                return True
        elif not process_alive(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def signal_process(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def terminate_process(pid: int, *, popen: subprocess.Popen | None = None, grace_s: float = 10.0,
                      kill_wait_s: float = 10.0) -> None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL and wait up to ``kill_wait_s``. ``popen``
    (when this process is the parent) is used to reap the child."""
    if popen is not None and popen.poll() is not None:
        return
    signal_process(pid, signal.SIGTERM)
    if _wait_dead(pid, popen, grace_s):
        return
    kill_process(pid, popen=popen, wait_s=kill_wait_s)


def kill_process(pid: int, *, popen: subprocess.Popen | None = None, wait_s: float = 10.0) -> None:
    """SIGKILL and wait (bounded) until the process is gone."""
    if popen is not None and popen.poll() is not None:
        return
    signal_process(pid, signal.SIGKILL)
    if not _wait_dead(pid, popen, wait_s):
        raise TimeoutError_(f"process {pid} still alive {wait_s}s after SIGKILL")


def log_tail(path: Path, lines_max: int = 20) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-lines_max:])


# -- the server ------------------------------------------------------------------------------

class ZooKeeperServer:
    """One standalone ZooKeeper process with its own data directory.

    ``port=None`` reuses the port of an existing ``zoo.cfg`` in ``data_dir`` (so a restart keeps
    its connect string) or else picks a free loopback port. ``tick_time_ms`` is 500 so that
    sessions as short as 1 s are allowed (``minSessionTimeout`` = 2 ticks); the maximum is 60 s.
    """

    def __init__(self, data_dir: Path | str, port: int | None = None, *, host: str = LOOPBACK,
                 tick_time_ms: int = 500, session_timeout_ms_max: int = 60_000) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port
        self.tick_time_ms = tick_time_ms
        self.session_timeout_ms_max = session_timeout_ms_max
        self._popen: subprocess.Popen | None = None
        self._pid: int | None = None

    # -- paths and state ----------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.data_dir / "zoo.cfg"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "zookeeper.log"

    @property
    def connect_string(self) -> str:
        if self.port is None:
            raise ZooKeeperStartError("ZooKeeper has no port yet: call start() first")
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def popen(self) -> subprocess.Popen | None:
        """The Popen object when this process started the server (None after adopt())."""
        return self._popen

    def command(self) -> list[str]:
        return ["java", *JVM_OPTIONS, "-cp", ZOOKEEPER_CLASSPATH, ZOOKEEPER_MAIN_CLASS,
                str(self.config_path)]

    def is_running(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        return process_matches(self._pid, str(self.config_path))

    def healthy(self) -> bool:
        return self.port is not None and zookeeper_healthy(self.host, self.port)

    def adopt(self, pid: int) -> None:
        """Take charge of an already running server (started by another process) by pid."""
        self._popen = None
        self._pid = pid

    # -- lifecycle ----------------------------------------------------------------------------
    def write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.port is None:
            self.port = self._configured_port() or find_free_port(self.host)
        self.config_path.write_text("\n".join([
            f"tickTime={self.tick_time_ms}",
            "initLimit=10",
            "syncLimit=5",
            f"dataDir={self.data_dir}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            "maxClientCnxns=0",
            f"minSessionTimeout={2 * self.tick_time_ms}",
            f"maxSessionTimeout={self.session_timeout_ms_max}",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
            "",
        ]))

    def _configured_port(self) -> int | None:
        try:
            text = self.config_path.read_text()
        except OSError:
            return None
        match = re.search(r"^clientPort=(\d+)\s*$", text, re.MULTILINE)
        return int(match.group(1)) if match else None

    def start(self, timeout_s: float = 30) -> None:
        """Write zoo.cfg, launch the server detached, wait until healthy. On failure the process
        is killed and ZooKeeperStartError raised with the tail of its log."""
        if self.is_running():
            raise ZooKeeperStartError(f"ZooKeeper in {self.data_dir} is already running (pid {self._pid})")
        self.write_config()
        with open(self.log_path, "ab") as log:
            self._popen = subprocess.Popen(
                self.command(), cwd=self.data_dir, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        self._pid = self._popen.pid
        deadline = time.monotonic() + timeout_s
        while not zookeeper_healthy(self.host, self.port, timeout_s=1.0):
            if self._popen.poll() is not None:
                raise ZooKeeperStartError(
                    f"ZooKeeper exited with code {self._popen.returncode} during start; "
                    f"last lines of {self.log_path}:\n{log_tail(self.log_path)}")
            if time.monotonic() >= deadline:
                self.kill()
                raise ZooKeeperStartError(
                    f"ZooKeeper on port {self.port} not healthy after {timeout_s}s; "
                    f"last lines of {self.log_path}:\n{log_tail(self.log_path)}")
            time.sleep(0.05)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, wait up to grace_s, then SIGKILL. No-op if not running."""
        if self._pid is not None and (self._popen is not None or self.is_running()):
            terminate_process(self._pid, popen=self._popen, grace_s=grace_s)
        self._popen = None

    def kill(self) -> None:
        """SIGKILL (a crash); data on disk is kept."""
        if self._pid is not None and (self._popen is not None or self.is_running()):
            kill_process(self._pid, popen=self._popen)
        self._popen = None

    def restart(self, timeout_s: float = 30) -> None:
        """Stop if running, then start again on the same port with the same data."""
        self.stop()
        self.start(timeout_s=timeout_s)

    def __enter__(self) -> "ZooKeeperServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ZooKeeperServer({self.data_dir}, port={self.port}, pid={self._pid})"


__all__ = ["ZooKeeperServer", "ZooKeeperStartError", "find_free_port", "port_accepts",
           "four_letter_word", "zookeeper_healthy", "wait_zookeeper", "process_alive",
           "process_matches", "process_cmdline", "terminate_process", "kill_process", "log_tail"]
