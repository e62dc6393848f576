"""The local cluster launcher: ZooKeeper, N bookies and M brokers as background processes on loopback,
for development and tests (``pulsarlite cluster ...`` and :class:`LocalCluster`).

Layout of a cluster directory D::

    D/cluster.json            state: processes (name, role, pid, ports, argv, config, log)
    D/zookeeper/              ZooKeeper's data, zoo.cfg and zookeeper.log
    D/conf/bookie-i.toml      bookie configs (written once; kept on later starts)
    D/bookie-i/journal/       bookie journal directory
    D/bookie-i/ledgers/       bookie ledger storage directory
    D/conf/broker-i.toml      broker configs (ports {"pulsar": P, "http": H})
    D/logs/NAME.log           each process's stdout and stderr

Processes run in their own sessions so they outlive the command that started them; the state
file lets ``status``, ``kill``, ``restart`` and ``stop`` work from another process. Signals go
only to recorded pids whose command line still names their own config (a recycled pid is left
alone). Starting again on a directory that has state reuses its ports and configs (data kept).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pulsarlite.config import BookieConfig, apply_settings, load_toml, to_toml
from pulsarlite.errors import ConfigError, PulsarliteError
from pulsarlite.metadata_layout import bookie_registration_path, broker_path
from pulsarlite.process import write_private_file
from pulsarlite.zk_server import (LOOPBACK, ZooKeeperServer, find_free_port, kill_process,
                                  log_tail, port_accepts, process_matches, signal_process,
                                  zookeeper_healthy)

STATE_FILE = "cluster.json"
STATE_FORMAT_VERSION = 1
ZOOKEEPER = "zookeeper"
BOOKIE = "bookie"
BROKER = "broker"
# A local cluster's bookies share the machine's disk with everything else on it: BookKeeper's
# ratio (read-only at 95% used, BookieConfig's default) is meant for a disk of the bookie's own and
# turned a 252 GB disk with 10 GB free into a cluster that refused every write. Read-only here at
# 99.9% used (bookie_overrides still win); docs/decisions.md D-local-disk.
LOCAL_DISK_READONLY_THRESHOLD = 0.999
LOCAL_DISK_WRITABLE_THRESHOLD = 0.998


class ClusterError(PulsarliteError):
    """A cluster process failed to start, stop or become healthy."""


@dataclass
class ProcessRecord:
    name: str
    role: str                      # "zookeeper" | "bookie" | "broker"
    argv: list[str]
    ports: dict[str, int]
    config: str                    # config file path; its presence in argv identifies the pid
    log: str
    pid: int | None = None
    bookie_id: str | None = None
    broker_id: str | None = None

    def alive(self) -> bool:
        return process_matches(self.pid, self.config)


def default_bookie_command(config_path: Path) -> list[str]:
    return [sys.executable, "-m", "pulsarlite", "bookie", "--config", str(config_path)]


def default_broker_command(config_path: Path) -> list[str]:
    return [sys.executable, "-m", "pulsarlite", "broker", "--config", str(config_path)]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class LocalCluster:
    """ZooKeeper and bookies on loopback, under one directory.

    ``LocalCluster.start(dir, bookies)`` starts (or resumes) a cluster and returns once every
    process is healthy; ``LocalCluster.open(dir)`` attaches to one started elsewhere. As a
    context manager it stops every process at exit, also on failure.
    """

    def __init__(self, directory: Path | str, *, start_timeout_s: float = 60.0,
                 stop_grace_s: float = 10.0,
                 bookie_command: Callable[[Path], list[str]] = default_bookie_command,
                 broker_command: Callable[[Path], list[str]] = default_broker_command,
                 zookeeper_port: int | None = None) -> None:
        self.dir = Path(directory).resolve()
        self.zookeeper_port = zookeeper_port  # for a new cluster; None: a free port
        self.start_timeout_s = start_timeout_s
        self.stop_grace_s = stop_grace_s
        self.bookie_command = bookie_command
        self.broker_command = broker_command
        self.records: dict[str, ProcessRecord] = {}
        self._popens: dict[str, subprocess.Popen] = {}
        self._kazoo = None
        if self.state_path.exists():
            self._load_state()

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def start(cls, directory: Path | str, bookies: int = 3, brokers: int = 0,
              bookie_overrides: dict | None = None, **kwargs) -> "LocalCluster":
        """Start (or resume) a cluster in ``directory``; returns once all are healthy. On failure
        every process started by this call is stopped and the error raised."""
        cluster = cls(directory, **kwargs)
        cluster.start_processes(bookies=bookies, brokers=brokers, bookie_overrides=bookie_overrides)
        return cluster

    @classmethod
    def open(cls, directory: Path | str, **kwargs) -> "LocalCluster":
        """Attach to the cluster recorded in ``directory/cluster.json`` (ClusterError if none)."""
        cluster = cls(directory, **kwargs)
        if not cluster.records:
            raise ClusterError(f"no cluster state in {cluster.state_path}")
        return cluster

    # -- paths and state ---------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.dir / STATE_FILE

    @property
    def zookeeper(self) -> str:
        """ZooKeeper connect string, e.g. ``127.0.0.1:2181``."""
        record = self.records.get(ZOOKEEPER)
        if record is None:
            raise ClusterError(f"cluster in {self.dir} has no ZooKeeper")
        return f"{LOOPBACK}:{record.ports['client']}"

    @property
    def bookie_names(self) -> list[str]:
        return sorted((r.name for r in self.records.values() if r.role == BOOKIE), key=_name_order)

    @property
    def bookie_ids(self) -> list[str]:
        return [self.records[name].bookie_id for name in self.bookie_names]

    @property
    def broker_names(self) -> list[str]:
        return sorted((r.name for r in self.records.values() if r.role == BROKER), key=_name_order)

    @property
    def service_url(self) -> str | None:
        """``pulsar://127.0.0.1:P1,127.0.0.1:P2`` over every broker (None without brokers)."""
        ports = [self.records[n].ports["pulsar"] for n in self.broker_names]
        if not ports:
            return None
        return "pulsar://" + ",".join(f"{LOOPBACK}:{p}" for p in ports)

    @property
    def service_url_tls(self) -> str | None:
        """``pulsar+ssl://127.0.0.1:P1,...`` over the brokers with a TLS listener (None without)."""
        ports = [config.broker_service_port_tls for _, config in self._configs_of(BROKER)
                 if config.broker_service_port_tls]
        return "pulsar+ssl://" + ",".join(f"{LOOPBACK}:{p}" for p in ports) if ports else None

    @property
    def admin_url(self) -> str | None:
        """The admin HTTP URL of the first broker (None without brokers)."""
        names = self.broker_names
        if not names:
            return None
        return f"http://{LOOPBACK}:{self.records[names[0]].ports['http']}"

    def bookie_config_path(self, name: str) -> Path:
        return Path(self._record(name).config)

    def _record(self, name: str) -> ProcessRecord:
        try:
            return self.records[name]
        except KeyError:
            raise ClusterError(f"no process named {name!r} in the cluster in {self.dir} "
                               f"(known: {', '.join(sorted(self.records, key=_name_order))})") from None

    def _load_state(self) -> None:
        try:
            raw = json.loads(self.state_path.read_text())
            self.records = {p["name"]: ProcessRecord(**p) for p in raw["processes"]}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ClusterError(f"{self.state_path}: unreadable cluster state: {e}") from None

    def _save_state(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        zookeeper = self.zookeeper if ZOOKEEPER in self.records else None
        state = {
            "version": STATE_FORMAT_VERSION,
            "zookeeper": zookeeper,
            "processes": [dataclasses.asdict(r) for r in
                          sorted(self.records.values(), key=lambda r: _name_order(r.name))],
        }
        tmp = self.state_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.state_path)

    # -- start ----------------------------------------------------------------------------
    def start_processes(self, bookies: int = 3, brokers: int = 0,
                        bookie_overrides: dict | None = None,
                        broker_overrides: dict | None = None) -> None:
        """Start whatever of ZooKeeper, bookie-1..bookie-N and broker-1..broker-M is not running;
        wait healthy (brokers start once the bookies are healthy).

        ``bookie_overrides``: BookieConfig fields for every new bookie's config, and/or
        ``{"bookie-2": {...}}`` for one bookie. ``broker_overrides``: the same for BrokerConfig
        (``{"broker-1": {...}}`` for one). Existing configs are kept as they are."""
        if brokers < 0:
            raise ConfigError(f"brokers must be >= 0, got {brokers}")
        if bookies < 0:
            raise ConfigError(f"bookies must be >= 0, got {bookies}")
        existing = len(self.bookie_names)
        if bookies < existing:
            raise ConfigError(f"{self.dir} already has {existing} bookies; start with bookies >= {existing} "
                              f"(bookies hold data and are never dropped silently)")
        overrides = dict(bookie_overrides or {})
        started: list[str] = []
        try:
            self._start_zookeeper(started)
            for i in range(1, bookies + 1):
                name = f"bookie-{i}"
                if name not in self.records:
                    self._define_bookie(name, overrides)
            self._save_state()
            launched = [name for name in self.bookie_names if not self.records[name].alive()]
            stale = {name: self._registration_owners(self.records[name].bookie_id) for name in launched}
            for name in launched:
                self._launch(name)
                started.append(name)
            self._save_state()
            self._wait_bookies_healthy(launched, stale)
            broker_overrides = dict(broker_overrides or {})
            for i in range(1, brokers + 1):
                name = f"broker-{i}"
                if name not in self.records:
                    self._define_broker(name, broker_overrides)
            self._save_state()
            launched = [name for name in self.broker_names if not self.records[name].alive()]
            stale = {name: self._broker_registration_owners(self.records[name].broker_id) for name in launched}
            for name in launched:
                self._launch(name)
                started.append(name)
            self._save_state()
            self._wait_bookies_healthy(launched, stale)
        except BaseException:
            self._stop_names([n for n in started if n != ZOOKEEPER])
            if ZOOKEEPER in started:
                self._stop_names([ZOOKEEPER])
            self._save_state()
            self._close_kazoo()
            raise

    def _start_zookeeper(self, started: list[str]) -> None:
        record = self.records.get(ZOOKEEPER)
        if record is not None and record.alive():
            return
        port = record.ports["client"] if record is not None else self.zookeeper_port
        server = ZooKeeperServer(self.dir / "zookeeper", port)
        server.write_config()
        log_path = self.dir / "logs" / "zookeeper.log"
        self.records[ZOOKEEPER] = ProcessRecord(
            name=ZOOKEEPER, role=ZOOKEEPER, argv=server.command(), ports={"client": server.port},
            config=str(server.config_path), log=str(server.log_path))
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        if not log_path.exists():  # one place for every log; ZooKeeper writes beside its data
            log_path.symlink_to(os.path.relpath(server.log_path, log_path.parent))
        self._close_kazoo()
        server.start(timeout_s=self.start_timeout_s)
        self.records[ZOOKEEPER].pid = server.pid
        self._popens[ZOOKEEPER] = server.popen
        started.append(ZOOKEEPER)
        self._save_state()

    def _define_bookie(self, name: str, overrides: dict) -> None:
        common = {k: v for k, v in overrides.items() if not k.startswith("bookie-")}
        own = overrides.get(name, {})
        port = own.get("port") or self._free_port()
        # every bookie serves /metrics on a port of its own (an override of metrics_port, 0
        # included, wins); the placeholder keeps _free_port from handing out the bookie's port
        self.records[name] = ProcessRecord(name=name, role=BOOKIE, argv=[], ports={"bookie": port},
                                           config="", log="")
        metrics_port = self._free_port()
        config = BookieConfig(
            bookie_id=f"{LOOPBACK}:{port}", host=LOOPBACK, port=port, zookeeper=self.zookeeper,
            journal_dir=str(self.dir / name / "journal"), ledger_dir=str(self.dir / name / "ledgers"),
            metrics_port=metrics_port, disk_usage_readonly_threshold=LOCAL_DISK_READONLY_THRESHOLD,
            disk_usage_writable_threshold=LOCAL_DISK_WRITABLE_THRESHOLD)
        try:
            config = dataclasses.replace(config, **common, **own).validate()
        except TypeError as e:
            del self.records[name]
            raise ConfigError(f"bookie_overrides: {e}") from None
        except ConfigError:
            del self.records[name]
            raise
        try:
            self._check_sizes_agree([(name, config)], self._configs_of(BROKER))
        except ConfigError:
            del self.records[name]
            raise
        config_path = self.dir / "conf" / f"{name}.toml"
        config_path.parent.mkdir(parents=True, exist_ok=True)
        Path(config.journal_dir).mkdir(parents=True, exist_ok=True)
        Path(config.ledger_dir).mkdir(parents=True, exist_ok=True)
        write_private_file(config_path, to_toml(config))      # may name credentials
        self.records[name] = ProcessRecord(
            name=name, role=BOOKIE, argv=self.bookie_command(config_path),
            ports={"bookie": config.port, **({"metrics": config.metrics_port} if config.metrics_port else {})},
            config=str(config_path), log=str(self.dir / "logs" / f"{name}.log"),
            bookie_id=config.effective_bookie_id)

    def _define_broker(self, name: str, overrides: dict) -> None:
        from broker.config import BrokerConfig
        common = {k: v for k, v in overrides.items() if not k.startswith("broker-")}
        own = overrides.get(name, {})
        port = own.get("port") or self._free_port()
        self.records[name] = ProcessRecord(name=name, role=BROKER, argv=[], ports={"pulsar": port},
                                           config="", log="")
        http_port = own.get("http_port") or self._free_port()
        config = BrokerConfig(host=LOOPBACK, port=port, http_port=http_port, zookeeper=self.zookeeper)
        try:
            config = apply_settings(apply_settings(config, common, source="broker_overrides"), own,
                                    source=f"broker_overrides[{name}]").validate()
        except ConfigError:
            del self.records[name]
            raise
        try:
            self._check_sizes_agree(self._configs_of(BOOKIE), [(name, config)])
        except ConfigError:
            del self.records[name]
            raise
        config_path = self.dir / "conf" / f"{name}.toml"
        config_path.parent.mkdir(parents=True, exist_ok=True)
        write_private_file(config_path, to_toml(config))
        self.records[name] = ProcessRecord(
            name=name, role=BROKER, argv=self.broker_command(config_path),
            ports={"pulsar": config.port, "http": config.http_port}, config=str(config_path),
            log=str(self.dir / "logs" / f"{name}.log"), broker_id=config.effective_broker_id)

    def _configs_of(self, role: str) -> list[tuple[str, object]]:
        """(name, loaded config) of every defined process of ``role`` (BOOKIE or BROKER)."""
        if role == BOOKIE:
            kind = BookieConfig
        else:
            from broker.config import BrokerConfig as kind
        return [(name, load_toml(kind, record.config)) for name, record in sorted(self.records.items())
                if record.role == role and record.config]

    @staticmethod
    def _check_sizes_agree(bookies: list, brokers: list) -> None:
        """ConfigError unless every bookie stores every entry every broker takes (the broker's
        message_bytes_max plus frame padding within the bookie's entry_bytes_max)."""
        for _, broker in brokers:
            for name, bookie in bookies:
                broker.check_bookie_entry_bytes(bookie.entry_bytes_max, name)

    def update_broker_configs(self, settings: dict) -> list[str]:
        """Set BrokerConfig settings (names as in its TOML: ``{"offload.tier_uri": ...}`` or
        ``{"offload": {...}}``, pulsarlite.config.apply_settings) in every existing broker's config
        file (validated; takes effect at the broker's next start). Returns the names of the brokers whose file changed."""
        from broker.config import BrokerConfig
        changed = []
        for name in self.broker_names:
            path = Path(self.records[name].config)
            current = load_toml(BrokerConfig, path)
            updated = apply_settings(current, settings, source="broker settings").validate()
            if updated != current:
                tmp = path.with_suffix(".toml.tmp")
                write_private_file(tmp, to_toml(updated))
                os.replace(tmp, path)
                changed.append(name)
        return changed

    def _free_port(self) -> int:
        used = {p for r in self.records.values() for p in r.ports.values()}
        while True:
            port = find_free_port()
            if port not in used:
                return port

    def _launch(self, name: str) -> None:
        record = self.records[name]
        log_path = Path(record.log)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(record.argv, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                     env=_child_env())
        self._popens[name] = popen
        record.pid = popen.pid

    # -- health -----------------------------------------------------------------------------
    def _zk_client(self):
        if self._kazoo is None:
            from kazoo.client import KazooClient
            auth = self._zk_auth()
            client = KazooClient(hosts=self.zookeeper, timeout=10.0,
                                 connection_retry=dict(max_tries=-1, delay=0.05, max_delay=0.5),
                                 **(auth.kazoo_kwargs() if auth is not None else {}))
            client.start(timeout=5)
            self._kazoo = client
        return self._kazoo

    def _zk_auth(self):
        """The bookies' ZooKeeper credential (their first config), for the health checks."""
        from pulsarlite.config import zookeeper_auth
        for name in self.bookie_names:
            if self.records[name].config:
                return zookeeper_auth(load_toml(BookieConfig, Path(self.records[name].config)))
        return None

    def _close_kazoo(self) -> None:
        if self._kazoo is not None:
            try:
                self._kazoo.stop()
                self._kazoo.close()
            finally:
                self._kazoo = None

    def _registration_owners(self, bookie_id: str) -> set[int]:
        """Session ids owning this bookie's registration nodes now (stale ones, before launch)."""
        client = self._zk_client()
        owners = set()
        for read_only in (False, True):
            stat = client.exists(bookie_registration_path(bookie_id, read_only=read_only))
            if stat is not None:
                owners.add(stat.ephemeralOwner)
        return owners

    def _broker_registration_owners(self, broker_id: str) -> set[int]:
        stat = self._zk_client().exists(broker_path(broker_id))
        return {stat.ephemeralOwner} if stat is not None else set()

    def _broker_registered(self, broker_id: str, exclude_owners: set[int] = frozenset()) -> bool:
        stat = self._zk_client().exists(broker_path(broker_id))
        return stat is not None and stat.ephemeralOwner not in exclude_owners

    def _bookie_mode(self, bookie_id: str, exclude_owners: set[int] = frozenset()) -> str | None:
        """'writable', 'readonly' or None (not registered by a session outside exclude_owners)."""
        client = self._zk_client()
        for read_only, mode in ((False, "writable"), (True, "readonly")):
            stat = client.exists(bookie_registration_path(bookie_id, read_only=read_only))
            if stat is not None and stat.ephemeralOwner not in exclude_owners:
                return mode
        return None

    def _bookie_healthy(self, record: ProcessRecord, exclude_owners: set[int] = frozenset()) -> bool:
        if record.role == BROKER:
            return (self._running(record.name) and self._broker_registered(record.broker_id, exclude_owners)
                    and port_accepts(LOOPBACK, record.ports["pulsar"])
                    and ("http" not in record.ports or port_accepts(LOOPBACK, record.ports["http"])))
        return (self._running(record.name) and self._bookie_mode(record.bookie_id, exclude_owners) is not None
                and port_accepts(LOOPBACK, record.ports["bookie"]))

    def _wait_bookies_healthy(self, names: list[str], stale: dict[str, set[int]]) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        waiting = list(names)
        while waiting:
            for name in list(waiting):
                record = self.records[name]
                if not self._running(name):
                    popen = self._popens.get(name)
                    code = f" (exit status {popen.returncode})" if popen is not None else ""
                    raise ClusterError(f"{name} exited during start{code}; last lines of {record.log}:\n"
                                       f"{log_tail(Path(record.log))}")
                if self._bookie_healthy(record, stale.get(name, set())):
                    waiting.remove(name)
            if waiting and time.monotonic() >= deadline:
                details = "\n".join(f"--- {n} ({self.records[n].log}):\n{log_tail(Path(self.records[n].log))}"
                                    for n in waiting)
                raise ClusterError(f"not healthy after {self.start_timeout_s}s: {', '.join(waiting)}\n{details}")
            if waiting:
                time.sleep(0.05)

    def healthy(self, name: str) -> bool:
        record = self._record(name)
        if record.role == ZOOKEEPER:
            return record.alive() and zookeeper_healthy(LOOPBACK, record.ports["client"])
        if not self._zookeeper_up():
            return False
        return self._bookie_healthy(record)

    def _zookeeper_up(self) -> bool:
        record = self.records.get(ZOOKEEPER)
        if record is None or not zookeeper_healthy(LOOPBACK, record.ports["client"]):
            self._close_kazoo()
            return False
        return True

    def status(self) -> dict:
        """{"dir", "zookeeper": connect string, "processes": [{name, role, pid, alive, healthy,
        ports, config, log, (bookie_id, mode)}]}; pid is None when the process is not running."""
        zk_up = self._zookeeper_up()
        processes = []
        for name in sorted(self.records, key=_name_order):
            record = self.records[name]
            alive = record.alive()
            entry = {"name": name, "role": record.role, "pid": record.pid if alive else None,
                     "alive": alive, "healthy": False, "ports": dict(record.ports),
                     "config": record.config, "log": record.log}
            if record.role == ZOOKEEPER:
                entry["healthy"] = alive and zk_up
            elif record.role == BROKER:
                registered = bool(zk_up and alive and self._broker_registered(record.broker_id))
                entry["broker_id"] = record.broker_id
                entry["registered"] = registered
                entry["healthy"] = bool(registered and port_accepts(LOOPBACK, record.ports["pulsar"])
                                        and ("http" not in record.ports
                                             or port_accepts(LOOPBACK, record.ports["http"])))
            else:
                mode = self._bookie_mode(record.bookie_id) if zk_up and alive else None
                entry["bookie_id"] = record.bookie_id
                entry["mode"] = mode
                entry["healthy"] = bool(alive and mode and port_accepts(LOOPBACK, record.ports["bookie"]))
            processes.append(entry)
        return {"dir": str(self.dir), "zookeeper": self.zookeeper if ZOOKEEPER in self.records else None,
                "service_url": self.service_url, "admin_url": self.admin_url,
                **({"service_url_tls": tls} if (tls := self.service_url_tls) else {}), "processes": processes}

    # -- kill, restart, stop ----------------------------------------------------------------
    def kill(self, name: str) -> None:
        """SIGKILL one process (a crash: its data is kept). No-op if it is not running."""
        record = self._record(name)
        popen = self._popens.pop(name, None)
        if record.pid is not None and (record.alive() or popen is not None):
            kill_process(record.pid, popen=popen)
        record.pid = None
        if name == ZOOKEEPER:
            self._close_kazoo()
        self._save_state()

    def restart(self, name: str) -> None:
        """Stop the process if running (SIGTERM, then SIGKILL), start it again with the same
        config and ports, and wait until it is healthy."""
        record = self._record(name)
        self._stop_names([name])
        if record.role == ZOOKEEPER:
            self._start_zookeeper([])
            return
        if record.role == BROKER:
            stale = {name: self._broker_registration_owners(record.broker_id)}
        else:
            stale = {name: self._registration_owners(record.bookie_id)}
        self._launch(name)
        self._save_state()
        try:
            self._wait_bookies_healthy([name], stale)
        except BaseException:
            self._stop_names([name])
            self._save_state()
            raise

    def replace_bookie(self, name: str) -> str:
        """A bookie lost for good and replaced: SIGKILL it, delete its journal and ledger
        directories (the disks died), then start a fresh bookie under the same name with a new
        port, so a new bookie id and an empty disk (its old config's other settings kept).
        Waits until the new one is healthy; returns its bookie id. The old identity stays
        behind in the metadata (its cookie, the ledgers that name it) for recovery to repair."""
        import shutil

        record = self._record(name)
        if record.role != BOOKIE:
            raise ConfigError(f"{name} is not a bookie")
        self.kill(name)
        old = load_toml(BookieConfig, record.config)
        for directory in (old.journal_dir, old.ledger_dir):
            shutil.rmtree(directory, ignore_errors=True)
            Path(directory).mkdir(parents=True, exist_ok=True)
        port = self._free_port()
        config = dataclasses.replace(old, port=port, bookie_id=f"{LOOPBACK}:{port}").validate()
        Path(record.config).write_text(to_toml(config))
        record.ports = {**record.ports, "bookie": port}   # the metrics port stays
        record.bookie_id = config.effective_bookie_id
        self._launch(name)
        self._save_state()
        try:
            self._wait_bookies_healthy([name], {})
        except BaseException:
            self._stop_names([name])
            self._save_state()
            raise
        return record.bookie_id

    def stop(self) -> None:
        """Stop every recorded process: brokers first, then bookies (each group in parallel),
        ZooKeeper last; SIGTERM, then SIGKILL after ``stop_grace_s``."""
        try:
            self._close_kazoo()
            self._stop_names([n for n in self.records if self.records[n].role == BROKER])
            self._stop_names([n for n in self.records if n != ZOOKEEPER])
            self._stop_names([n for n in self.records if n == ZOOKEEPER])
        finally:
            if self.records:
                self._save_state()

    def _stop_names(self, names: list[str]) -> None:
        running = []
        for name in names:
            record = self.records[name]
            popen = self._popens.get(name)
            if (popen is not None and popen.poll() is None) or (popen is None and record.alive()):
                signal_process(record.pid, signal.SIGTERM)
                running.append(name)
            else:
                self._popens.pop(name, None)
                record.pid = None
        deadline = time.monotonic() + self.stop_grace_s
        while running and time.monotonic() < deadline:
            running = [n for n in running if self._running(n)]
            if running:
                time.sleep(0.02)
        for name in running:
            kill_process(self.records[name].pid, popen=self._popens.get(name))
        for name in names:
            self._popens.pop(name, None)
            self.records[name].pid = None

    def _running(self, name: str) -> bool:
        """Our child by its Popen (no race with exec: right after fork the child's argv is still
        ours); a process started elsewhere by its recorded pid and argv."""
        popen = self._popens.get(name)
        if popen is not None:
            return popen.poll() is None
        return self.records[name].alive()

    def close(self) -> None:
        """Release this object's ZooKeeper client; the processes keep running."""
        self._close_kazoo()

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalCluster({self.dir}, processes={sorted(self.records, key=_name_order)})"


def tier_settings(tier_uri: str | None, s3_endpoint_url: str | None) -> dict:
    """BrokerConfig overrides for the launcher's ``--tier URI`` / ``--s3-endpoint URL`` flags
    (``[offload] tier_uri``, ``tier_s3_endpoint_url``, as dotted keys: they win over a file's
    ``[offload]`` table given before them). Only the flags given are set; a URI that
    is neither ``s3://bucket[/prefix]`` nor ``file:///dir`` is refused. The S3 credentials are
    not config: the standard AWS environment variables reach every child process unchanged."""
    settings: dict = {}
    if tier_uri is not None:
        if tier_uri and not (tier_uri.startswith("s3://") and len(tier_uri) > len("s3://")
                             or tier_uri.startswith("file:///")):
            raise ConfigError(f"--tier must be s3://bucket[/prefix] or file:///absolute/dir, got {tier_uri!r}")
        settings["offload.tier_uri"] = tier_uri
    if s3_endpoint_url is not None:
        if s3_endpoint_url and not s3_endpoint_url.startswith(("http://", "https://")):
            raise ConfigError(f"--s3-endpoint must be an http(s):// URL, got {s3_endpoint_url!r}")
        settings["offload.tier_s3_endpoint_url"] = s3_endpoint_url
    return settings


# settings the launcher chooses itself for each process (addresses, identities, directories)
BOOKIE_LAUNCHER_KEYS = frozenset({"bookie_id", "host", "port", "metrics_port", "zookeeper", "journal_dir",
                                  "ledger_dir"})
BROKER_LAUNCHER_KEYS = frozenset({"broker_id", "host", "port", "http_port", "advertised_host", "zookeeper"})


def settings_from_file(role: str, path: str | Path) -> dict:
    """The settings of a bookie or broker TOML config (e.g. deploy/conf/broker-1.toml, the file
    docker compose mounts) as overrides for the launcher: the file is loaded and validated with
    the process's own loader, and the keys the launcher chooses per process (addresses, ids,
    directories, ZooKeeper) are dropped."""
    import tomllib
    if role == BOOKIE:
        load_toml(BookieConfig, path)
        skip = BOOKIE_LAUNCHER_KEYS
    elif role == BROKER:
        from broker.config import BrokerConfig
        load_toml(BrokerConfig, path)
        skip = BROKER_LAUNCHER_KEYS
    else:
        raise ConfigError(f"no config file for role {role!r}")
    data = tomllib.loads(Path(path).read_text())
    return {k: v for k, v in data.items() if k not in skip}


def _name_order(name: str) -> tuple:
    if name == ZOOKEEPER:
        return (0, 0, name)
    role, _, index = name.rpartition("-")
    return (1, role, int(index) if index.isdigit() else 0, name)


def format_status(status: dict) -> str:
    """A readable table of :meth:`LocalCluster.status`."""
    rows = [("NAME", "ROLE", "PID", "HEALTHY", "PORTS", "DETAIL")]
    for p in status["processes"]:
        ports = " ".join(f"{k}={v}" for k, v in p["ports"].items())
        detail = ""
        if p["role"] == BOOKIE:
            detail = f"{p.get('bookie_id')} {p.get('mode') or 'unregistered'}"
        elif p["role"] == BROKER:
            detail = f"{p.get('broker_id')} {'registered' if p.get('registered') else 'unregistered'}"
        rows.append((p["name"], p["role"], str(p["pid"] or "-"), "yes" if p["healthy"] else "no", ports, detail))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"cluster {status['dir']}  zookeeper {status['zookeeper']}"]
    if status.get("service_url"):
        lines[0] += f"  service_url {status['service_url']}  admin_url {status['admin_url']}"
    if status.get("service_url_tls"):
        lines[0] += f"  service_url_tls {status['service_url_tls']}"
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


__all__ = ["LocalCluster", "ClusterError", "ProcessRecord", "default_bookie_command", "default_broker_command",
           "format_status", "tier_settings", "settings_from_file"]
