"""`pulsarlite standalone` as a user runs it: a foreground subprocess on free loopback ports,
produce and consume with the official client, a child killed -9 and restarted by the supervisor,
SIGTERM (every child stopped), a second start on the same directory with the data still there."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pulsar
import pytest

from faces.standalone import GiveUp, Restart, RestartBook, RestartPolicy
from pulsarlite.zk_server import find_free_port, process_alive
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.integration

READY_TIMEOUT_S = 180
TOPIC = "persistent://public/default/standalone-durable"


def free_port_run(count: int) -> int:
    """A port P with P..P+count-1 all bindable on loopback a moment ago."""
    for _ in range(200):
        base = find_free_port()
        if base + count > 65535:
            continue
        sockets = []
        try:
            for i in range(count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise AssertionError("no run of free ports")


class StandaloneProcess:
    """`python -m pulsarlite standalone` in a subprocess; its output collected by a thread."""

    def __init__(self, data_dir: Path, ports: dict[str, int]) -> None:
        self.data_dir = data_dir
        argv = [sys.executable, "-m", "pulsarlite", "standalone", "--data-dir", str(data_dir),
                "--port", str(ports["port"]), "--http-port", str(ports["http"]),
                "--zookeeper-port", str(ports["zk"]), "--bookie-port", str(ports["bookie"])]
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      cwd=Path(__file__).resolve().parents[2])
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_output(self, text: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        def seen():
            if self.popen.poll() is not None and text not in self.output:
                raise AssertionError(f"standalone exited ({self.popen.returncode}) before {text!r}:\n{self.output}")
            return text in self.output
        wait_for(seen, timeout_s, f"{text!r} in standalone output")

    def child_pids(self) -> dict[str, int]:
        state = json.loads((self.data_dir / "cluster.json").read_text())
        return {p["name"]: p["pid"] for p in state["processes"] if p["pid"]}

    def terminate(self, timeout_s: float = 120) -> int:
        self.popen.send_signal(signal.SIGTERM)
        code = self.popen.wait(timeout=timeout_s)
        self._thread.join(timeout=10)
        return code

    def ensure_stopped(self) -> None:
        """Test clean-up: stop the standalone and, if it could not, its recorded children."""
        if self.popen.poll() is None:
            try:
                self.terminate()
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=30)
        state_path = self.data_dir / "cluster.json"
        if state_path.exists():
            from faces.cluster import LocalCluster
            LocalCluster.open(self.data_dir).stop()


def test_restart_policy_backs_off_and_gives_up():
    policy = RestartPolicy(backoff_s_min=1, backoff_s_max=5, restarts_max=3, restart_window_s=100)
    book = RestartBook()
    actions = []
    for now in (0, 10, 20):
        book, action = book.on_death(policy, "bookie-1", now)
        actions.append(action)
    assert actions == [Restart("bookie-1", 1, 1), Restart("bookie-1", 2, 2), Restart("bookie-1", 4, 3)]
    book2, action = book.on_death(policy, "bookie-2", 30)  # per child
    assert action == Restart("bookie-2", 1, 1)
    _, action = book2.on_death(policy, "bookie-1", 40)
    assert action == GiveUp("bookie-1", 4, 100)
    _, action = book2.on_death(policy, "bookie-1", 115)  # deaths at 0 and 10 left the window
    assert action == Restart("bookie-1", 2, 2)
    book = RestartBook()
    for now in range(0, 600, 200):  # rare deaths never give up; the delay stays at the minimum
        book, action = book.on_death(policy, "zookeeper", now)
        assert action == Restart("zookeeper", 1, 1)


def test_standalone_serves_supervises_stops_and_keeps_data(tmp_path):
    data_dir = tmp_path / "standalone"
    ports = {"port": find_free_port(), "http": find_free_port(), "zk": find_free_port(), "bookie": free_port_run(3)}
    service_url = f"pulsar://127.0.0.1:{ports['port']}"
    first = StandaloneProcess(data_dir, ports)
    second = None
    all_children: set[int] = set()
    try:
        first.wait_output("pulsarlite standalone is ready")
        assert f"service URL  {service_url}" in first.output
        assert f"admin URL    http://127.0.0.1:{ports['http']}" in first.output
        assert f"web console  http://127.0.0.1:{ports['http']}/ " in first.output
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['http']}/", timeout=30) as resp:
            assert b"/console/console.js" in resp.read()       # the banner's URL serves the console
        assert f"tier         file://{data_dir}/tier" in first.output
        assert f"lake         file://{data_dir}/tier/_lake (" in first.output          # on by default
        children = first.child_pids()
        assert sorted(children) == ["bookie-1", "bookie-2", "bookie-3", "broker-1", "zookeeper"]
        all_children |= set(children.values())

        client = pulsar.Client(service_url, operation_timeout_seconds=60)
        try:
            # subscriptions first: without one (and with no retention) nothing has to be kept;
            # "sub" consumes half before the restart, "keep" never acknowledges
            for name in ("sub", "keep"):
                client.subscribe(TOPIC, name, initial_position=pulsar.InitialPosition.Earliest).close()
            producer = client.create_producer(TOPIC, batching_enabled=False)
            for i in range(100):
                producer.send(f"m-{i}".encode())
        finally:
            client.close()
        # the topic has a table in the embedded catalog (empty until a ledger is offloaded)
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['http']}/admin/v2/persistent/"
                                    f"{TOPIC[len('persistent://'):]}/lake", timeout=120) as resp:
            assert json.loads(resp.read())["catalog"] == f"sqlite:///{data_dir}/tier/_lake/catalog.db"

        # a child killed -9 is reported and restarted by the supervisor
        os.kill(children["broker-1"], signal.SIGKILL)
        first.wait_output("broker-1 exited (signal SIGKILL)")
        first.wait_output("broker-1 is back")
        restarted = first.child_pids()
        assert restarted["broker-1"] != children["broker-1"] and process_alive(restarted["broker-1"])
        all_children |= set(restarted.values())

        client = pulsar.Client(service_url, operation_timeout_seconds=60)
        try:
            consumer = client.subscribe(TOPIC, "sub", initial_position=pulsar.InitialPosition.Earliest)
            for i in range(50):
                msg = consumer.receive(timeout_millis=60_000)
                assert msg.data() == f"m-{i}".encode()
                consumer.acknowledge(msg)
            consumer.close()  # sends the grouped acks; the clean stop below persists the cursor
        finally:
            client.close()

        assert first.terminate() == 0
        assert "stopped; data kept" in first.output
        wait_for(lambda: not any(process_alive(pid) for pid in all_children), 30, "every child gone")
        assert not first.child_pids()

        # the same directory again: same ports, the messages and the subscription's position kept
        second = StandaloneProcess(data_dir, ports)
        second.wait_output("pulsarlite standalone is ready")
        assert "resuming" in second.output and f"service URL  {service_url}" in second.output
        all_children |= set(second.child_pids().values())
        client = pulsar.Client(service_url, operation_timeout_seconds=60)
        try:
            consumer = client.subscribe(TOPIC, "sub")
            for i in range(50, 100):
                msg = consumer.receive(timeout_millis=60_000)
                assert msg.data() == f"m-{i}".encode()
                consumer.acknowledge(msg)
            keep = client.subscribe(TOPIC, "keep")
            assert [keep.receive(timeout_millis=60_000).data() for _ in range(100)] == \
                [f"m-{i}".encode() for i in range(100)]
            with pytest.raises(pulsar.Timeout):
                keep.receive(timeout_millis=2000)  # nothing more (no duplicates)
        finally:
            client.close()

        # a second standalone on the same directory is refused while this one runs
        third = subprocess.run([sys.executable, "-m", "pulsarlite", "standalone", "--data-dir", str(data_dir)],
                               capture_output=True, text=True, timeout=60)
        assert third.returncode == 1 and "another pulsarlite standalone is running" in third.stdout

        assert second.terminate() == 0
        wait_for(lambda: not any(process_alive(pid) for pid in all_children), 30, "every child gone")
    finally:
        for proc in (second, first):
            if proc is not None:
                proc.ensure_stopped()
    assert not any(process_alive(pid) for pid in all_children)


def test_standalone_refuses_bad_ports(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pulsarlite", "standalone", "--data-dir", str(tmp_path / "d"),
                             "--port", "8080", "--http-port", "8080"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "ports must all differ" in result.stderr
    assert not (tmp_path / "d").exists()
