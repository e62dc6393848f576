"""``pulsarlite standalone``: ZooKeeper + 3 bookies + 1 broker + a file:// tier in one foreground
command, like ``pulsar standalone``.

The processes are the ones of the local cluster launcher (:class:`faces.cluster.LocalCluster`)
in ``--data-dir`` (state, configs, data, ``logs/NAME.log``); this module adds what a foreground
server needs:

- fixed, configurable ports (6650 Pulsar, 8080 HTTP like Pulsar; ZooKeeper 2181; bookies
  3181..3183), kept across restarts (a directory that already has a cluster keeps its ports);
- a ready banner with the service and admin URLs once every process is healthy;
- supervision: a child that exits is reported and restarted after a bounded, doubling backoff;
  a child that dies more than ``restarts_max`` times within ``restart_window_s`` stops the
  whole standalone with a clear message and exit status 1 (a crash loop is not hidden);
- a clean stop on SIGINT / SIGTERM: broker, then bookies, then ZooKeeper, each by its pid
  (SIGTERM, SIGKILL after the grace period); the data stays for the next start;
- one standalone per directory (an flock on ``D/standalone.lock``).

The restart decisions are a pure core (:class:`RestartPolicy`); the loop around it is thin.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from faces.cluster import ClusterError, LocalCluster
from pulsarlite.errors import ConfigError, PulsarliteError
from pulsarlite.process import write_private_file

log = logging.getLogger("pulsarlite.standalone")

BOOKIES = 3
LOCK_FILE = "standalone.lock"


# -- restart policy (pure) -----------------------------------------------------------------------

@dataclass(frozen=True)
class RestartPolicy:
    """When to restart a dead child: after ``backoff_s_min * 2**(n-1)`` (at most ``backoff_s_max``)
    for its n-th death within ``restart_window_s``; give up after ``restarts_max`` deaths in it."""

    backoff_s_min: float = 1.0
    backoff_s_max: float = 30.0
    restarts_max: int = 5
    restart_window_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0 < self.backoff_s_min <= self.backoff_s_max:
            raise ConfigError("need 0 < backoff_s_min <= backoff_s_max")
        if self.restarts_max < 0 or self.restart_window_s <= 0:
            raise ConfigError("restarts_max must be >= 0 and restart_window_s > 0")


@dataclass(frozen=True)
class Restart:
    name: str
    delay_s: float
    attempt: int          # deaths of this child within the window, this one included


@dataclass(frozen=True)
class GiveUp:
    name: str
    deaths: int
    window_s: float


@dataclass(frozen=True)
class RestartBook:
    """Death times of each child (monotonic seconds), trimmed to the window."""

    deaths: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def on_death(self, policy: RestartPolicy, name: str, now_s: float) -> tuple["RestartBook", Restart | GiveUp]:
        recent = tuple(t for t in self.deaths.get(name, ()) if now_s - t < policy.restart_window_s) + (now_s,)
        book = RestartBook({**self.deaths, name: recent})
        if len(recent) > policy.restarts_max:
            return book, GiveUp(name, len(recent), policy.restart_window_s)
        delay_s = min(policy.backoff_s_max, policy.backoff_s_min * 2 ** (len(recent) - 1))
        return book, Restart(name, delay_s, len(recent))


# -- settings ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class StandaloneSettings:
    data_dir: Path
    port: int = 6650
    http_port: int = 8080
    zookeeper_port: int = 2181
    bookie_port: int = 3181                 # bookies listen on bookie_port .. bookie_port+2
    tier_uri: str | None = None             # None: file://<data_dir>/tier; "": no tier
    lake: bool = True                       # [lakehouse] Iceberg tables of offloaded ledgers (file:// tier, pyiceberg)
    start_timeout_s: float = 120.0
    stop_grace_s: float = 10.0
    poll_interval_s: float = 0.5
    policy: RestartPolicy = RestartPolicy()
    # BrokerConfig fields from ``--pulsar-conf`` (TLS, authentication, authorization; not ports,
    # which are ``port`` / ``http_port``, nor ZooKeeper, which the standalone runs)
    broker_settings: dict = field(default_factory=dict)

    def validate(self) -> "StandaloneSettings":
        ports = [self.port, self.http_port, self.zookeeper_port] + [self.bookie_port + i for i in range(BOOKIES)]
        for p in ports:
            if not 0 < p <= 65535:
                raise ConfigError(f"port out of range: {p}")
        if len(set(ports)) != len(ports):
            raise ConfigError(f"ports must all differ: {ports}")
        return self

    @property
    def effective_tier_uri(self) -> str:
        if self.tier_uri is None:
            return (self.data_dir.resolve() / "tier").as_uri()
        return self.tier_uri


BOOKIE_AUTH_ROLES = ("broker", "autorecovery", "admin")


def bookie_auth_settings(directory: Path) -> tuple[dict, dict]:
    """(BookieConfig fields, BrokerConfig fields) for bookie authentication in a standalone: a
    secret key and one token per role (broker, autorecovery, admin: the operator shell) in
    ``directory`` (0700, files 0600), made on first use and kept. The configs name the files,
    never the key or a token."""
    import secrets
    from pulsarlite.tokens import create_token
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    key_path = directory / "secret.key"
    if not key_path.exists():
        write_private_file(key_path, secrets.token_bytes(32))
    key = key_path.read_bytes()
    for role in BOOKIE_AUTH_ROLES:
        path = directory / f"{role}.token"
        if not path.exists():
            write_private_file(path, create_token(subject=role, now_s=time.time(), secret_key=key).encode())
    bookie = {"bookie_auth_enabled": True, "bookie_auth_token_secret_key": key_path.resolve().as_uri(),
              "bookie_auth_roles": ",".join(BOOKIE_AUTH_ROLES),
              "bookie_auth_token_file": str((directory / "autorecovery.token").resolve())}
    broker = {"ledger_client.bookie_auth_token_file": str((directory / "broker.token").resolve())}
    return bookie, broker


def zookeeper_auth_settings(directory: Path) -> dict:
    """BookieConfig and BrokerConfig fields for ZooKeeper digest authentication in a secured
    standalone: a random credential in ``directory/zookeeper.digest`` (0600, made on first use and
    kept). The configs name the file, never the password."""
    import secrets
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    path = directory / "zookeeper.digest"
    if not path.exists():
        write_private_file(path, f"pulsarlite:{secrets.token_urlsafe(24)}\n")
    return {"zookeeper_auth_digest_file": str(path.resolve())}


def update_bookie_configs(cluster: LocalCluster, settings: dict) -> None:
    """Set BookieConfig fields in the existing bookies' config files (next start)."""
    from pulsarlite.config import BookieConfig, load_toml, to_toml
    for record in cluster.records.values():
        if record.role != "bookie" or not record.config:
            continue
        path = Path(record.config)
        current = load_toml(BookieConfig, path)
        updated = dataclasses.replace(current, **settings).validate()
        if updated != current:
            tmp = path.with_suffix(".toml.tmp")
            tmp.write_text(to_toml(updated))
            os.replace(tmp, path)


def lake_available() -> bool:
    """pyiceberg is installed (extra ``lake``): found without importing it (seconds of import)."""
    import importlib.util
    try:
        return importlib.util.find_spec("pyiceberg") is not None
    except ImportError:
        return False


def lake_setting(settings: "StandaloneSettings", tier: str, available: bool) -> tuple[bool, str]:
    """(lake_enabled, why) for the standalone's broker: on with a file:// tier (the embedded
    SQLite catalog in <tier>/_lake) and pyiceberg installed, unless ``--no-lake`` or the
    ``--pulsar-conf`` settings say otherwise."""
    for key in ("offload.lake_enabled", "lake_enabled"):
        if key in settings.broker_settings:
            return bool(settings.broker_settings[key]), "set by the broker settings"
    if not settings.lake:
        return False, "--no-lake"
    if not tier.startswith("file://"):
        return False, "needs a file:// tier for the embedded catalog"
    if not available:
        return False, "pyiceberg is not installed (pip install 'pulsarlite[lake]')"
    return True, ""


def broker_supports_tier() -> bool:
    """The broker has the ``[offload] tier_uri`` setting and the object store module exists."""
    import importlib.util
    from broker.config import BrokerConfig
    if "offload" not in {f.name for f in dataclasses.fields(BrokerConfig)}:
        return False
    try:
        return importlib.util.find_spec("offload.store") is not None
    except ImportError:
        return False


# -- the foreground process ----------------------------------------------------------------------

class _StopRequested(BaseException):
    """Raised from the SIGINT/SIGTERM handler to leave start-up or the supervision loop."""


class Standalone:
    def __init__(self, settings: StandaloneSettings, out=sys.stdout) -> None:
        self.settings = settings.validate()
        self.out = out
        self.cluster: LocalCluster | None = None
        self.book = RestartBook()
        self._stopping = False
        self._lock_fd: int | None = None
        self.bookie_admin_token_file: Path | None = None   # with authentication on: the operator's token
        self.lake_dir = ""                  # [lakehouse] <tier>/_lake when the lake is on
        self.lake_why = ""                  # why it is off

    def _print(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def _lock(self) -> None:
        d = self.settings.data_dir
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ClusterError(f"another pulsarlite standalone is running on {d} "
                               f"(lock {d / LOCK_FILE}); stop it first") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _on_signal(self, signum, frame) -> None:
        if self._stopping:
            return  # already stopping: the stop is bounded (grace, then SIGKILL)
        self._stopping = True
        log.info("event=stop_requested signal=%s", signal.Signals(signum).name)
        raise _StopRequested()

    def run(self) -> int:
        """Start, print the banner, supervise until a signal (0) or a crash loop (1)."""
        s = self.settings
        try:
            self._lock()
        except ClusterError as e:
            self._print(f"pulsarlite standalone: {e}")
            return 1
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        status = 0
        try:
            self.cluster = LocalCluster(s.data_dir, start_timeout_s=s.start_timeout_s,
                                        stop_grace_s=s.stop_grace_s, zookeeper_port=s.zookeeper_port)
            self._start()
            self._banner()
            status = self._supervise()
        except _StopRequested:
            status = 0
        except PulsarliteError as e:
            self._print(f"pulsarlite standalone: {e}")
            status = 2 if isinstance(e, ConfigError) else 1
        finally:
            self._stopping = True
            try:
                if self.cluster is not None and self.cluster.records:
                    self._print("pulsarlite standalone: stopping (broker, bookies, ZooKeeper)")
                    self.cluster.stop()
                    self._print("pulsarlite standalone: stopped; data kept in " + str(s.data_dir))
            finally:
                if self.cluster is not None:
                    self.cluster.close()
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                self._unlock()
        return status

    def _start(self) -> None:
        s = self.settings
        cluster = self.cluster
        assert cluster is not None
        broker = {"port": s.port, "http_port": s.http_port, **s.broker_settings}
        if s.broker_settings:
            cluster.update_broker_configs(s.broker_settings)    # a directory created without them
        tier = s.effective_tier_uri
        if tier:
            if broker_supports_tier():
                broker["offload.tier_uri"] = tier
                cluster.update_broker_configs({"offload.tier_uri": tier})  # a directory created without one
                if tier.startswith("file://"):
                    Path(tier[len("file://"):]).mkdir(parents=True, exist_ok=True)
            else:
                log.warning("event=no_tier reason=\"broker has no tier_uri setting in this build\"")
                tier = ""
        self.tier_uri = tier
        lake, self.lake_why = lake_setting(s, tier, lake_available())
        broker["offload.lake_enabled"] = lake
        cluster.update_broker_configs({"offload.lake_enabled": lake})       # a directory created before
        self.lake_dir = f"{tier}/_lake" if lake else ""
        bookies = {f"bookie-{i + 1}": {"port": s.bookie_port + i} for i in range(BOOKIES)}
        if s.broker_settings.get("authentication_enabled"):
            # a secured standalone: its bookies authenticate their clients too (docs/security.md)
            bookie_auth, broker_auth = bookie_auth_settings(s.data_dir / "bookie-auth")
            zk_auth = zookeeper_auth_settings(s.data_dir / "bookie-auth")   # ZooKeeper's ACLs too
            bookie_auth, broker_auth = {**bookie_auth, **zk_auth}, {**broker_auth, **zk_auth}
            broker.update(broker_auth)
            cluster.update_broker_configs(broker_auth)
            for settings in bookies.values():
                settings.update(bookie_auth)
            update_bookie_configs(cluster, bookie_auth)          # a directory created without them
            self.bookie_admin_token_file = s.data_dir / "bookie-auth" / "admin.token"
        fresh = not cluster.records
        self._print(f"pulsarlite standalone: {'creating' if fresh else 'resuming'} {s.data_dir} "
                    f"(ZooKeeper, {BOOKIES} bookies, 1 broker); logs in {s.data_dir / 'logs'}")
        cluster.start_processes(bookies=BOOKIES, brokers=1, bookie_overrides=bookies,
                                broker_overrides={"broker-1": broker})

    def _banner(self) -> None:
        cluster = self.cluster
        assert cluster is not None
        lines = [
            "",
            "pulsarlite standalone is ready",
            f"  service URL  {cluster.service_url}",
            f"  admin URL    {cluster.admin_url}",
            f"  web console  {cluster.admin_url}/   (open it in a browser)",
            *([f"  TLS service  pulsar+ssl://127.0.0.1:{self.settings.broker_settings['broker_service_port_tls']}"]
              if self.settings.broker_settings.get("broker_service_port_tls") else []),
            *([f"  TLS admin    https://127.0.0.1:{self.settings.broker_settings['web_service_port_tls']}"]
              if self.settings.broker_settings.get("web_service_port_tls") else []),
            f"  ZooKeeper    {cluster.zookeeper}",
            f"  bookies      {', '.join(cluster.bookie_ids)}",
            *([f"  bookie token {self.bookie_admin_token_file} (pulsarlite bookkeeper --bookie-auth-token-file)"]
              if self.bookie_admin_token_file else []),
            *([f"  ZK credential {self.bookie_admin_token_file.parent / 'zookeeper.digest'} "
               f"(pulsarlite bookkeeper --zookeeper-auth-digest-file)"]
              if self.bookie_admin_token_file else []),
            f"  tier         {self.tier_uri or '(none)'}",
            f"  lake         {self.lake_dir + ' (an Iceberg table per topic of its offloaded ledgers)' if self.lake_dir else '(off: ' + self.lake_why + ')'}",
            f"  data         {cluster.dir}",
            "Press Ctrl-C to stop.",
            "",
        ]
        self._print("\n".join(lines))

    def _supervise(self) -> int:
        s = self.settings
        cluster = self.cluster
        assert cluster is not None
        while True:
            time.sleep(s.poll_interval_s)
            for name in list(cluster.records):
                if cluster._running(name):
                    continue
                code = self._exit_code(name)
                self.book, action = self.book.on_death(s.policy, name, time.monotonic())
                if isinstance(action, GiveUp):
                    self._print(f"pulsarlite standalone: {name} died {action.deaths} times within "
                                f"{action.window_s:.0f}s (last exit {code}); giving up. Last lines of "
                                f"{cluster.records[name].log}:\n{_tail(cluster.records[name].log)}")
                    return 1
                self._print(f"pulsarlite standalone: {name} exited ({code}); restarting in "
                            f"{action.delay_s:.0f}s (restart {action.attempt} of at most "
                            f"{s.policy.restarts_max} within {s.policy.restart_window_s:.0f}s)")
                log.warning("event=child_exited name=%s exit=%s delay_s=%.1f attempt=%d",
                            name, code, action.delay_s, action.attempt)
                time.sleep(action.delay_s)
                try:
                    cluster.restart(name)
                except ClusterError as e:
                    self._print(f"pulsarlite standalone: restart of {name} failed: {e}")
                    continue  # seen dead again on the next pass: counts as another death
                self._print(f"pulsarlite standalone: {name} is back (pid {cluster.records[name].pid})")

    def _exit_code(self, name: str) -> str:
        popen = self.cluster._popens.get(name) if self.cluster else None
        if popen is None or popen.poll() is None:
            return "unknown"
        code = popen.returncode
        if code < 0:
            try:
                return f"signal {signal.Signals(-code).name}"
            except ValueError:
                return f"signal {-code}"
        return f"status {code}"


def _tail(path: str) -> str:
    from pulsarlite.zk_server import log_tail
    return log_tail(Path(path))


__all__ = ["Standalone", "StandaloneSettings", "RestartPolicy", "RestartBook", "Restart", "GiveUp"]
