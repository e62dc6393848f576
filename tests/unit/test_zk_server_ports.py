"""find_free_port (pulsarlite/zk_server.py): a port it handed out is not handed out again, by any
process on the machine, while its reservation lasts (two pytest-xdist workers picked the same
port once: a bookie failed 'address already in use')."""

from __future__ import annotations

import os
import socket
import time

import pulsarlite.zk_server as zk_server


def test_a_reserved_port_is_not_handed_out_again(tmp_path, monkeypatch):
    monkeypatch.setattr(zk_server, "PORT_RESERVATIONS_DIR", tmp_path)
    picks = iter([40001, 40001, 40003])

    class FakeSocket:
        def __init__(self, *args):
            self.port = next(picks)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            pass

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(zk_server.socket, "socket", FakeSocket)
    assert zk_server.find_free_port() == 40001
    assert zk_server.find_free_port() == 40003      # the kernel offered 40001 again: skipped
    assert sorted(p.name for p in tmp_path.iterdir()) == ["40001", "40003"]


def test_an_old_reservation_is_released(tmp_path, monkeypatch):
    monkeypatch.setattr(zk_server, "PORT_RESERVATIONS_DIR", tmp_path)
    (tmp_path / "40001").touch()
    old = time.time() - zk_server.PORT_RESERVATION_S - 5
    os.utime(tmp_path / "40001", (old, old))
    assert zk_server._reserve(40001) is False      # released now, taken on the next pick
    assert zk_server._reserve(40001) is True


def test_real_picks_are_distinct_and_bindable(tmp_path, monkeypatch):
    monkeypatch.setattr(zk_server, "PORT_RESERVATIONS_DIR", tmp_path)
    ports = [zk_server.find_free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))
