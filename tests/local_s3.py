"""A local S3 endpoint for tests and benchmarks: moto's server as a child process on a free
127.0.0.1 port (objects live in its memory: never a production store).

API::

    server = LocalS3Server(log_dir)            # nothing started yet
    server.start(timeout_s=60)                 # spawns `moto_server`, waits for the port
    server.create_bucket("pulsarlite-test")    # path-style, with server.env credentials
    server.endpoint_url                        # "http://127.0.0.1:PORT"
    server.env                                 # AWS_* variables to give a process (credentials,
                                               # region, AWS_ENDPOINT_URL)
    server.stop()                              # terminate, then kill, by pid; idempotent
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pulsarlite.zk_server import find_free_port, port_accepts

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
TEST_ACCESS_KEY_ID = "testing"
TEST_SECRET_ACCESS_KEY = "testing"
TEST_REGION = "us-east-1"


class LocalS3Server:
    """moto_server in a child process; ``stop()`` always ends it (by pid)."""

    def __init__(self, log_dir: Path | str, *, port: int | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.port = port
        self.process: subprocess.Popen | None = None
        self._log_file = None

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise RuntimeError("LocalS3Server not started")
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that point boto3 at this server with its test credentials."""
        return {
            "AWS_ACCESS_KEY_ID": TEST_ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": TEST_SECRET_ACCESS_KEY,
            "AWS_DEFAULT_REGION": TEST_REGION,
            "AWS_ENDPOINT_URL": self.endpoint_url,
        }

    def _executable(self) -> list[str]:
        exe = Path(sys.executable).with_name("moto_server")
        if exe.exists():
            return [str(exe)]
        found = shutil.which("moto_server")
        if found:
            return [found]
        return [sys.executable, "-m", "moto.server"]

    def start(self, timeout_s: float = 60.0) -> None:
        if self.process is not None:
            raise RuntimeError("LocalS3Server already started")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.port is None:
            self.port = find_free_port(LOOPBACK)
        self._log_file = open(self.log_dir / "moto_server.log", "ab")
        self.process = subprocess.Popen(
            [*self._executable(), "-H", LOOPBACK, "-p", str(self.port)],
            stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.info("event=s3_server_starting pid=%d port=%d", self.process.pid, self.port)
        deadline = time.monotonic() + timeout_s
        while not port_accepts(LOOPBACK, self.port, timeout_s=0.5):
            if self.process.poll() is not None:
                code = self.process.returncode
                self.stop()
                raise RuntimeError(f"moto_server exited with code {code} before listening "
                                   f"(see {self.log_dir / 'moto_server.log'})")
            if time.monotonic() >= deadline:
                self.stop()
                raise RuntimeError(f"moto_server did not listen on port {self.port} "
                                   f"within {timeout_s}s")
            time.sleep(0.1)

    def client(self):
        """A boto3 S3 client for this server (path-style, test credentials)."""
        import boto3
        from botocore.config import Config
        return boto3.client(
            "s3", endpoint_url=self.endpoint_url, region_name=TEST_REGION,
            aws_access_key_id=TEST_ACCESS_KEY_ID, aws_secret_access_key=TEST_SECRET_ACCESS_KEY,
            config=Config(s3={"addressing_style": "path"}))

    def create_bucket(self, bucket: str) -> None:
        self.client().create_bucket(Bucket=bucket)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> "LocalS3Server":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def subprocess_env(server: LocalS3Server) -> dict[str, str]:
    """``os.environ`` plus the server's AWS variables (for a child process)."""
    return {**os.environ, **server.env}
