"""Helpers shared by the integration tests."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time

from pulsarlite.zk_server import find_free_port


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.05):
    """Poll ``predicate`` (blocking) until it returns something true, at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


class BlockableProxy:
    """A TCP proxy to ZooKeeper that can cut every connection and refuse new ones (a network
    partition between one client and a server that stays up)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = find_free_port()
        self.blocked = False
        self.stalls_left = 0          # connections to accept and then never answer (stall_next)
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.1)
        self._stopped = False
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            if self.blocked:
                client.close()
                continue
            if self.stalls_left > 0:
                self.stalls_left -= 1
                with self._lock:
                    self._sockets.add(client)      # held open, never read nor forwarded
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=2)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            src.settimeout(None)
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def block(self) -> None:
        self.blocked = True
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def unblock(self) -> None:
        self.blocked = False

    def stall_next(self, count: int = 1) -> None:
        """The next ``count`` connections are accepted and then never answered (a server that
        accepts but does not serve yet, e.g. a JVM still starting); later ones are forwarded."""
        self.stalls_left = count

    def cut(self) -> None:
        """Close every connection now; new ones are accepted again at once."""
        self.block()
        self.unblock()

    def close(self) -> None:
        self._stopped = True
        self.block()
        self._thread.join(timeout=5)
        self._listener.close()


@contextlib.contextmanager
def spark_session(app_name: str, conf: dict[str, str] | None = None):
    """A local[2] Spark session with the pulsarlite source registered, on 127.0.0.1 only, the
    venv's Python for workers and filter pushdown on; stopped on exit."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    import spark_source

    builder = (SparkSession.builder.master("local[2]").appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.python.filterPushdown.enabled", "true")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.host", "127.0.0.1"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    spark_source.register(session)
    try:
        yield session
    finally:
        session.stop()


def rss_bytes(pid: int) -> int:
    """A process's resident set size (VmRSS), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def producer_refusal(client, topic: str) -> str | None:
    """Why the broker refuses a new (unbatched) producer on ``topic`` (the error's text), or None
    when it is accepted (then closed): for waiting on a backlog quota's block and its lifting."""
    try:
        p = client.create_producer(topic, batching_enabled=False)
    except Exception as e:   # noqa: BLE001
        return str(e)
    p.close()
    return None


async def wait_ledger_repaired(client, lid: int, bookie: str, timeout_s: float):
    """Poll (a deadline, no assertion on speed) the metadata of ledger ``lid`` through the
    LedgerClient ``client`` until no ensemble names ``bookie`` and no bookie is marked
    under-replicated; the repaired metadata."""
    import asyncio
    deadline = time.monotonic() + timeout_s
    while True:
        md, _ = await client.ledger_manager.read(lid)
        if bookie not in md.all_bookies() and not md.under_replicated_bookies:
            return md
        assert time.monotonic() < deadline, f"ledger {lid} still names {bookie} after {timeout_s}s"
        await asyncio.sleep(0.5)


def hs256_token(secret: bytes, role: str) -> str:
    """A token for ``role`` signed with ``secret`` (the broker's token_secret_key)."""
    import jwt
    return jwt.encode({"sub": role}, secret, algorithm="HS256")


@contextlib.contextmanager
def token_secured_cluster(base, secret: bytes, **broker_overrides):
    """A LocalCluster (3 bookies, 1 broker) under ``base`` whose broker authenticates tokens
    signed with ``secret`` and authorizes them (superuser role ``admin``); ``broker_overrides``
    add to that. Stopped at the end, even on failure."""
    from faces.cluster import LocalCluster
    key_path = base / "secret.key"
    key_path.write_bytes(secret)
    cluster = LocalCluster(base / "cluster")
    try:
        cluster.start_processes(bookies=3, brokers=1, broker_overrides={
            "authentication_enabled": True, "authentication_providers": "token",
            "authorization_enabled": True, "superuser_roles": "admin",
            "token_secret_key": f"file://{key_path}", **broker_overrides})
        yield cluster
    finally:
        cluster.stop()


def topic_with_an_unconfirmed_last_entry(service_url: str, admin_token: str, prefix: str, count: int) -> str:
    """A new topic whose only ledger is open, holding ``count`` single-message entries sent by
    the official client with ``admin_token``: the bookies' LAC is the entry before the last
    (they learn a confirmation from the next entry), the broker's is the last."""
    import uuid

    import pulsar
    topic = f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:6]}"
    client = pulsar.Client(service_url, authentication=pulsar.AuthenticationToken(admin_token),
                           operation_timeout_seconds=30)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(count):
            producer.send(f"v{i}".encode())
        producer.close()
    finally:
        client.close()
    return topic
