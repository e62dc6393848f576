"""A local PostgreSQL server for tests: Debian's ``postgresql`` binaries (``initdb``,
``postgres``; scripts/setup.sh installs the package) run as a child process on a free 127.0.0.1
port, its cluster in a fresh temporary directory (never a production database).

API::

    server = LocalPostgresServer()             # nothing started yet
    server.start(timeout_s=60)                 # initdb + postgres, waits until it answers
    server.create_database("lake")
    server.uri("lake")                         # "postgresql+psycopg2://pulsarlite@127.0.0.1:PORT/lake"
    server.execute("lake", "SELECT 1")         # one statement, autocommit
    server.stop()                              # SIGINT (fast shutdown), then kill, by pid;
                                               # the directory is deleted; idempotent

PostgreSQL refuses to run as root: as root the binaries run as the ``postgres`` user (made by
Debian's package) and the directory is given to it. Authentication is ``trust`` on loopback
only; no Unix socket is made.
"""

from __future__ import annotations

import glob
import logging
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from pulsarlite.zk_server import find_free_port, log_tail, port_accepts, terminate_process

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
USER = "pulsarlite"          # the cluster's superuser (initdb -U)


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL binaries or the Python driver are not installed here."""


def postgres_bin_dir() -> Path:
    """The directory of ``initdb`` and ``postgres``: on PATH, else Debian's
    ``/usr/lib/postgresql/<version>/bin`` (newest). PostgresUnavailable when neither."""
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(os.path.realpath(found)).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not dirs:
        raise PostgresUnavailable("no initdb/postgres (Debian package postgresql: scripts/setup.sh installs it)")
    return Path(dirs[-1]).parent


class LocalPostgresServer:
    """``postgres`` in a child process; ``stop()`` always ends it (by pid) and deletes its directory."""

    def __init__(self, *, port: int | None = None) -> None:
        self.port = port
        self.dir: Path | None = None
        self.process: subprocess.Popen | None = None
        self._log_file = None

    def uri(self, database: str = "postgres") -> str:
        """The SQLAlchemy URI of ``database`` (psycopg2 driver)."""
        if self.port is None:
            raise RuntimeError("LocalPostgresServer not started")
        return f"postgresql+psycopg2://{USER}@{LOOPBACK}:{self.port}/{database}"

    def _as_user(self) -> dict:
        """Popen arguments that run the binaries as ``postgres`` when we are root."""
        return {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}

    def start(self, timeout_s: float = 60.0) -> None:
        if self.process is not None:
            raise RuntimeError("LocalPostgresServer already started")
        bin_dir = postgres_bin_dir()
        try:
            import psycopg2  # noqa: F401
        except ImportError:
            raise PostgresUnavailable("no psycopg2 (pip install psycopg2-binary: the test extra)") from None
        owner = None
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise PostgresUnavailable("running as root and there is no postgres user to run PostgreSQL as "
                                          "(Debian's postgresql package makes it)") from None
        # a directory the postgres user can reach (pytest's tmp_path is root's, mode 0700)
        self.dir = Path(tempfile.mkdtemp(prefix="pulsarlite-pg-"))
        data = self.dir / "data"
        if owner is not None:
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
        try:
            subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8",
                            "--no-sync", "--locale=C"], check=True, capture_output=True, timeout=timeout_s,
                           stdin=subprocess.DEVNULL, cwd=self.dir, **self._as_user())
        except subprocess.CalledProcessError as e:
            self.stop()
            raise RuntimeError(f"initdb failed ({e.returncode}): {e.stderr.decode(errors='replace')[-2000:]}") from None
        if self.port is None:
            self.port = find_free_port(LOOPBACK)
        log_path = self.dir / "postgres.log"
        self._log_file = open(log_path, "ab")
        self.process = subprocess.Popen(
            [str(bin_dir / "postgres"), "-D", str(data), "-h", LOOPBACK, "-p", str(self.port),
             "-c", "unix_socket_directories=", "-c", "fsync=off", "-c", "max_connections=100"],
            stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.dir,
            **self._as_user())
        log.info("event=postgres_starting pid=%d port=%d dir=%s", self.process.pid, self.port, self.dir)
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.process.poll() is not None:
                code, tail = self.process.returncode, log_tail(log_path)
                self.stop()
                raise RuntimeError(f"postgres exited with code {code} before answering: {tail}")
            if time.monotonic() >= deadline:
                tail = log_tail(log_path)
                self.stop()
                raise RuntimeError(f"postgres did not answer on port {self.port} within {timeout_s}s: {tail}")
            time.sleep(0.1)

    def _connect(self, database: str = "postgres"):
        import psycopg2
        return psycopg2.connect(host=LOOPBACK, port=self.port, user=USER, dbname=database, connect_timeout=5)

    def _answers(self) -> bool:
        if not port_accepts(LOOPBACK, self.port, timeout_s=0.5):
            return False
        import psycopg2
        try:
            self._connect().close()
        except psycopg2.OperationalError:      # "the database system is starting up"
            return False
        return True

    def execute(self, database: str, sql: str) -> None:
        """Run one statement in ``database`` (autocommit)."""
        conn = self._connect(database)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(sql)
        finally:
            conn.close()

    def create_database(self, name: str) -> None:
        self.execute("postgres", f'CREATE DATABASE "{name}"')

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)           # fast shutdown: disconnect clients, stop
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                terminate_process(process.pid, popen=process)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        directory, self.dir = self.dir, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    def __enter__(self) -> "LocalPostgresServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
