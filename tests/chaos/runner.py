"""The chaos runner: a real local cluster (ZooKeeper, N bookies, M brokers; a file:// tier with
offload of every closed ledger when the broker has a tier), producers writing unique sequenced
messages to several topics (the official client and pulsarlite's own), a seeded fault schedule
(tests/chaos/schedule.py) applied one fault at a time, then every process healed and everything
read back (a reader and a durable subscription per topic) for the checker (tests/chaos/checker.py).

Every process is started here and stopped here (by pid, through LocalCluster), also on failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from faces.cluster import LocalCluster
from pulsarlite.config import BookieConfig, load_toml, to_toml
from tests.chaos.checker import ProducerLog, Verdict, check, payload
from tests.chaos.schedule import (BOOKIE_READONLY, FAULT_KINDS, KILL_ALL_BOOKIES, KILL_BOOKIE, KILL_BROKER, LOSE_BOOKIE,
                                  RESTART_ZOOKEEPER, SIGSTOP_BROKER, Fault, ScheduledFault, make_schedule)

log = logging.getLogger("pulsarlite.chaos")

SUBSCRIPTION = "chaos-check"
AUTORECOVERY_DELAY_MS = 3_000   # lost_bookie_recovery_delay_ms of the run's bookies
LOST_BOOKIE_REPAIR_TIMEOUT_S = 120.0
READ_STALL_S = 30.0         # ... or after this long with nothing new, whatever the broker says is available
READ_IDLE_S = 3.0           # a read path is done after this long with nothing new (and nothing available)


@dataclass(frozen=True)
class ChaosConfig:
    seed: int
    duration_s: float
    directory: Path
    bookies: int = 4
    brokers: int = 2
    topics: int = 3
    rate_per_producer: float = 50.0
    session_timeout_ms: int = 4000
    kinds: tuple[str, ...] = FAULT_KINDS
    ours: bool = True           # also produce with pulsarlite's own client
    offload: bool = True        # file:// tier, offload threshold 0 (when the broker has a tier)
    spark: bool = False         # also read back with a Spark scan (spark_source, local mode)
    dedup: bool = True          # broker deduplication on (when the broker has it): stored duplicates fail
    load_procs: int = 0         # CPU-bound busy processes beside the cluster for the whole run (a loaded machine)
    heal_timeout_s: float = 180.0
    flush_timeout_s: float = 90.0
    read_timeout_s: float = 180.0

    def schedule(self) -> tuple[ScheduledFault, ...]:
        return make_schedule(self.seed, self.duration_s, bookies=self.bookies, brokers=self.brokers,
                             session_timeout_s=self.session_timeout_ms / 1000, kinds=self.kinds)

    def replay_command(self) -> str:
        kinds = "" if self.kinds == FAULT_KINDS else f" --kinds {','.join(self.kinds)}"
        kinds += " --spark" if self.spark else ""
        kinds += "" if self.dedup else " --no-dedup"
        kinds += f" --load {self.load_procs}" if self.load_procs else ""
        kinds += f" --rate {self.rate_per_producer:g}" if self.rate_per_producer != 50.0 else ""
        return (f".venv/bin/python -m tests.chaos.run --seed {self.seed} --duration-s {self.duration_s:g} "
                f"--bookies {self.bookies} --brokers {self.brokers} --topics {self.topics}{kinds}")


@dataclass
class FaultRecord:
    planned_offset_s: float
    fault: Fault
    started_s: float = 0.0
    ended_s: float = 0.0
    checks: list[str] = field(default_factory=list)
    error: str | None = None

    def line(self) -> str:
        checks = f" checks: {'; '.join(self.checks)}" if self.checks else ""
        error = f" ERROR: {self.error}" if self.error else ""
        return (f"t={self.started_s:7.1f}s..{self.ended_s:7.1f}s (planned {self.planned_offset_s:.1f}s) "
                f"{self.fault.describe()}{checks}{error}")


@dataclass
class ChaosReport:
    config: ChaosConfig
    faults: list[FaultRecord]
    verdict: Verdict | None
    producers: list[ProducerLog]
    offload: str
    elapsed_s: float
    dedup: str
    failures: list[str]

    @property
    def ok(self) -> bool:
        return self.verdict is not None and self.verdict.ok and not self.failures

    def text(self) -> str:
        c = self.config
        lines = [f"chaos seed={c.seed} duration_s={c.duration_s:g} bookies={c.bookies} brokers={c.brokers} "
                 f"topics={c.topics} producers={len(self.producers)} elapsed_s={self.elapsed_s:.0f} "
                 f"offload={self.offload} dedup={self.dedup}",
                 "faults:"]
        lines += ["  " + f.line() for f in self.faults] or ["  (none)"]
        for p in self.producers:
            lines.append(f"  producer {p.producer} ({p.client}) on {p.topic}: acknowledged={len(p.acked)} "
                         f"failed={len(p.failed)}")
        if self.verdict is not None:
            lines.append("verdict: " + self.verdict.summary())
            for path in self.verdict.paths:
                if path.lost:
                    lines.append(f"  {path.path} LOST (first 20): {path.lost[:20]}")
                if path.order_violations:
                    lines.append(f"  {path.path} ORDER (first 10): {path.order_violations[:10]}")
        for failure in self.failures:
            lines.append("FAILURE: " + failure)
        lines.append(("OK" if self.ok else "FAILED") + f"; replay: {c.replay_command()}")
        return "\n".join(lines)

    def row(self) -> dict:
        v = self.verdict
        return {"seed": self.config.seed, "bookies": self.config.bookies, "brokers": self.config.brokers,
                "duration_s": self.config.duration_s, "faults": [f.fault.describe() for f in self.faults],
                "acknowledged": v.acknowledged if v else None, "failed_sends": v.failed_sends if v else None,
                "lost": v.lost if v else None, "duplicated": v.duplicated if v else None,
                "redelivered": v.redelivered if v else None,
                "offload": self.offload, "dedup": self.dedup, "ok": self.ok}


# -- producers -------------------------------------------------------------------------------

class SequencedProducer:
    """One producer thread: payloads ``<name>|<seq>`` with seq 0, 1, 2, ... at a bounded rate;
    the send callbacks record which sequence numbers were acknowledged and which failed."""

    def __init__(self, name: str, topic: str, producer, ok_result, rate_per_s: float, client_kind: str) -> None:
        self.name = name
        self.topic = topic
        self.producer = producer
        self.ok_result = ok_result
        self.interval_s = 1.0 / rate_per_s
        self.client_kind = client_kind
        self.acked: set[int] = set()
        self.failed: set[int] = set()
        self.sent = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"producer-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _callback(self, seq: int):
        def done(result, msg_id) -> None:
            with self._lock:
                (self.acked if result == self.ok_result else self.failed).add(seq)
        return done

    def _loop(self) -> None:
        seq = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.producer.send_async(payload(self.name, seq), self._callback(seq))
            except Exception as e:  # a send refused outright is a failed send, not a crash
                with self._lock:
                    self.failed.add(seq)
                    if len(self.errors) < 5:
                        self.errors.append(f"{type(e).__name__}: {e}")
            seq += 1
            self.sent = seq
            next_at += self.interval_s
            delay = next_at - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_at = time.monotonic()

    def request_stop(self) -> None:
        self._stop.set()

    def stop(self, timeout_s: float) -> None:
        """Stop producing; a thread blocked in send_async (queue full) is left to finish on its
        own (daemon): its send still gets a callback, counted by flush()."""
        self._stop.set()
        self._thread.join(timeout_s)

    def flush(self, timeout_s: float) -> bool:
        """Wait (bounded) until every send has its callback."""
        done = threading.Event()

        def run() -> None:
            try:
                self.producer.flush()
            except Exception:
                pass
            done.set()
        threading.Thread(target=run, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.acked) + len(self.failed) >= self.sent:
                    return True
            time.sleep(0.2)
        return False

    def log(self) -> ProducerLog:
        with self._lock:
            return ProducerLog(self.topic, self.name, frozenset(self.acked), frozenset(self.failed),
                               self.client_kind)


# -- load --------------------------------------------------------------------------------------

_BUSY_LOOP = "import time\nend = time.monotonic() + {bound_s}\nwhile time.monotonic() < end:\n    sum(range(10000))\n"


class MachineLoad:
    """``count`` CPU-bound busy processes beside the cluster (a loaded machine, as when other
    work shares it). Each one stops by itself after ``bound_s`` even if nobody ends it; ``stop``
    ends them by pid (started here, so ours to end)."""

    def __init__(self, count: int, bound_s: float = 3600.0) -> None:
        if not isinstance(count, int) or count < 0 or count > 64:
            raise ValueError(f"load processes must be an int in [0, 64], got {count!r}")
        self.count = count
        self.bound_s = bound_s
        self._procs: list[subprocess.Popen] = []

    def start(self) -> None:
        for _ in range(self.count):
            self._procs.append(subprocess.Popen([sys.executable, "-c", _BUSY_LOOP.format(bound_s=self.bound_s)],
                                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def stop(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.kill()
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()


# -- the run -----------------------------------------------------------------------------------

class ChaosRun:
    def __init__(self, config: ChaosConfig, out=print) -> None:
        self.config = config
        self.out = out
        self.cluster: LocalCluster | None = None
        self.t0 = 0.0
        self.faults: list[FaultRecord] = []
        self.failures: list[str] = []
        self.offload = "off"
        self.dedup = "off"
        self.autorecovery = "off"
        self.lost_bookie_ids: list[str] = []
        self.topics = [f"persistent://public/default/chaos-{i}" for i in range(config.topics)]

    def now(self) -> float:
        return time.monotonic() - self.t0

    def say(self, text: str) -> None:
        self.out(f"[chaos t={self.now():6.1f}s] {text}")

    # -- cluster ----------------------------------------------------------------------------
    def start_cluster(self) -> None:
        c = self.config
        broker = {"zk_session_timeout_ms": c.session_timeout_ms, "rollover_entries_max": 400}
        tier_dir = c.directory / "tier"
        if c.offload:
            from faces.standalone import broker_supports_tier
            if broker_supports_tier():
                tier_dir.mkdir(parents=True, exist_ok=True)
                broker["tier_uri"] = tier_dir.resolve().as_uri()
                self.offload = "on"
            else:
                self.offload = "unavailable (no tier in this build)"
        if c.dedup:
            from broker.config import BrokerConfig
            if "broker_deduplication_enabled" in {f.name for f in dataclasses.fields(BrokerConfig)}:
                broker["broker_deduplication_enabled"] = True
                self.dedup = "on"
            else:
                self.dedup = "unavailable (no dedup in this build)"
        bookie = {"zk_session_timeout_ms": c.session_timeout_ms}
        if "lost_bookie_recovery_delay_ms" in {f.name for f in dataclasses.fields(BookieConfig)}:
            # autorecovery within the run: a bookie lost for good is repaired seconds after
            bookie.update(lost_bookie_recovery_delay_ms=AUTORECOVERY_DELAY_MS, replication_poll_interval_ms=500,
                          audit_interval_ms=10_000, replication_retry_delay_ms_max=2_000)
            self.autorecovery = "on"
        self.cluster = LocalCluster(c.directory / "cluster", start_timeout_s=120.0)
        self.cluster.start_processes(bookies=c.bookies, brokers=c.brokers,
                                     bookie_overrides=bookie,
                                     broker_overrides=broker)
        if self.offload == "on":
            try:
                self.admin("POST", "/admin/v2/namespaces/public/default/offloadThreshold", 0)
                self.offload = "on (threshold 0: every closed ledger)"
            except OSError as e:
                self.offload = f"tier set, threshold not set: {e}"

    def admin(self, method: str, path: str, body=None, url: str | None = None, timeout_s: float = 10.0):
        url = (url or self.cluster.admin_url) + path
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            text = response.read().decode()
        return json.loads(text) if text.strip() else None

    def broker_urls(self, name: str) -> tuple[str, str]:
        record = self.cluster.records[name]
        return f"pulsar://127.0.0.1:{record.ports['pulsar']}", f"http://127.0.0.1:{record.ports['http']}"

    def lookup(self, admin_url: str, topic: str) -> str | None:
        path = "/lookup/v2/topic/" + topic.replace("persistent://", "persistent/")
        try:
            return self.admin("GET", path, url=admin_url, timeout_s=3.0).get("brokerUrl")
        except (OSError, ValueError, AttributeError):
            return None

    # -- faults -------------------------------------------------------------------------------
    def run_schedule(self, schedule: tuple[ScheduledFault, ...], end_s: float) -> None:
        for planned in schedule:
            wait_s = planned.offset_s - self.now()
            if wait_s > 0:
                time.sleep(wait_s)
            record = FaultRecord(planned.offset_s, planned.fault, started_s=self.now())
            self.faults.append(record)
            self.say(f"fault {planned.fault.describe()} starts")
            try:
                self.inject(planned.fault, record)
            except Exception as e:
                record.error = f"{type(e).__name__}: {e}"
                self.failures.append(f"fault {planned.fault.describe()} could not be applied or undone: "
                                     f"{record.error}")
                self.heal()
            record.ended_s = self.now()
            self.say(f"fault {planned.fault.describe()} over{(' ' + '; '.join(record.checks)) if record.checks else ''}")
        remaining = end_s - self.now()
        if remaining > 0:
            time.sleep(remaining)

    def inject(self, fault: Fault, record: FaultRecord) -> None:
        cluster = self.cluster
        if fault.kind == KILL_BOOKIE or fault.kind == KILL_BROKER:
            cluster.kill(fault.target)
            time.sleep(fault.down_s)
            cluster.restart(fault.target)
        elif fault.kind == KILL_ALL_BOOKIES:
            for name in cluster.bookie_names:
                cluster.kill(name)
            time.sleep(fault.down_s)
            for name in cluster.bookie_names:
                cluster.restart(name)
        elif fault.kind == RESTART_ZOOKEEPER:
            cluster.kill("zookeeper")
            time.sleep(fault.down_s)
            cluster.restart("zookeeper")
        elif fault.kind == BOOKIE_READONLY:
            self.set_disk_full(fault.target, True)
            mode = self.bookie_mode(fault.target)
            record.checks.append(f"{fault.target} mode with a full disk: {mode}")
            if mode != "readonly":
                self.failures.append(f"{fault.target} did not go read-only with a full disk (mode {mode})")
            time.sleep(fault.down_s)
            self.set_disk_full(fault.target, False)
            mode = self.bookie_mode(fault.target)
            record.checks.append(f"after freeing: {mode}")
            if mode != "writable":
                self.failures.append(f"{fault.target} not writable again after its disk was freed (mode {mode})")
        elif fault.kind == SIGSTOP_BROKER:
            self.sigstop_broker(fault, record)
        elif fault.kind == LOSE_BOOKIE:
            old_id = cluster.records[fault.target].bookie_id
            cluster.kill(fault.target)
            time.sleep(fault.down_s)
            new_id = cluster.replace_bookie(fault.target)
            self.lost_bookie_ids.append(old_id)
            record.checks.append(f"{fault.target}: {old_id} lost for good, replaced by {new_id}")
        else:  # pragma: no cover - the schedule only makes the kinds above
            raise ValueError(fault.kind)

    def bookie_mode(self, name: str) -> str | None:
        return {p["name"]: p for p in self.cluster.status()["processes"]}[name].get("mode")

    def set_disk_full(self, name: str, full: bool) -> None:
        path = self.cluster.bookie_config_path(name)
        config = load_toml(BookieConfig, path)
        config = dataclasses.replace(config, disk_free_bytes_override=1 if full else 0).validate()
        tmp = path.with_suffix(".toml.tmp")
        tmp.write_text(to_toml(config))
        os.replace(tmp, path)
        self.cluster.restart(name)

    def sigstop_broker(self, fault: Fault, record: FaultRecord) -> None:
        cluster = self.cluster
        name = fault.target
        owned = self.owned_topics(name)
        if not owned:  # stopping a broker that serves nothing tests nothing: take the busiest one
            busiest = max(cluster.broker_names, key=lambda n: len(self.owned_topics(n)))
            if busiest != name:
                record.checks.append(f"{name} owned no topic: stopped {busiest} instead")
                name = busiest
                owned = self.owned_topics(name)
        record.checks.append(f"{name} owned {len(owned)} topics")
        pid = cluster.records[name].pid
        others = [n for n in cluster.broker_names if n != name and cluster.records[n].alive()]
        stopped_url, _ = self.broker_urls(name)
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        try:
            # past its session, the topics it owned must be served by another broker
            if others and owned:
                other_url, other_admin = self.broker_urls(others[0])
                deadline = started + self.config.session_timeout_ms / 1000 * 3 + 30
                moved = set()
                while time.monotonic() < deadline and len(moved) < len(owned):
                    for topic in owned:
                        owner = self.lookup(other_admin, topic)
                        if owner is not None and owner != stopped_url:
                            moved.add(topic)
                    if len(moved) < len(owned):
                        time.sleep(0.5)
                took = time.monotonic() - started
                record.checks.append(f"{len(moved)}/{len(owned)} of its topics served elsewhere "
                                     f"{took:.1f}s after SIGSTOP (session {self.config.session_timeout_ms} ms)")
                if len(moved) < len(owned):
                    self.failures.append(f"SIGSTOPped {name}: topics {sorted(set(owned) - moved)} "
                                         f"still owned by it {took:.0f}s later (session expiry did not move them)")
            remaining = fault.down_s - (time.monotonic() - started)
            if remaining > 0:
                time.sleep(remaining)
        finally:
            os.kill(pid, signal.SIGCONT)
        # resumed, it must have stopped serving: its own lookups now name the new owner
        if others:
            _, own_admin = self.broker_urls(name)
            _, other_admin = self.broker_urls(others[0])
            deadline = time.monotonic() + 60
            agree = 0
            while time.monotonic() < deadline:
                answers = [(self.lookup(own_admin, t), self.lookup(other_admin, t)) for t in self.topics]
                agree = sum(1 for a, b in answers if a is not None and a == b)
                if agree == len(self.topics):
                    break
                time.sleep(0.5)
            record.checks.append(f"after SIGCONT both brokers name the same owner for {agree}/{len(self.topics)}")
            if agree < len(self.topics):
                self.failures.append(f"after SIGCONT of {name} the brokers disagree on topic owners")

    def owned_topics(self, name: str) -> list[str]:
        """The topics a lookup (through any live broker) says ``name`` serves."""
        url, _ = self.broker_urls(name)
        admins = [self.broker_urls(n)[1] for n in self.cluster.broker_names if self.cluster.records[n].alive()]
        owned = []
        for topic in self.topics:
            for admin in admins:
                owner = self.lookup(admin, topic)
                if owner is not None:
                    if owner == url:
                        owned.append(topic)
                    break
        return owned

    def heal(self) -> None:
        """Every process running and healthy again (SIGCONT a stopped one, restart a dead one)."""
        cluster = self.cluster
        for record in cluster.records.values():
            if record.alive():   # our own recorded child (argv checked): resume it if stopped
                os.kill(record.pid, signal.SIGCONT)
        for name in ["zookeeper"] + cluster.bookie_names + cluster.broker_names:
            if not cluster.records[name].alive():
                cluster.restart(name)
        for name in cluster.bookie_names:
            if load_toml(BookieConfig, cluster.bookie_config_path(name)).disk_free_bytes_override:
                self.set_disk_full(name, False)
        deadline = time.monotonic() + self.config.heal_timeout_s
        while True:
            status = cluster.status()
            sick = [p["name"] for p in status["processes"] if not p["healthy"]]
            if not sick:
                return
            if time.monotonic() >= deadline:
                raise AssertionError(f"cluster not healthy {self.config.heal_timeout_s}s after the faults: {sick}")
            time.sleep(0.5)

    def check_lost_bookies_repaired(self) -> None:
        """Invariant 10: once the run is over, no closed ledger names a bookie lost for good
        (autorecovery moved its copies), within a bound. Open ledgers may still name it in
        their last fragment (repaired once they close)."""
        lost = set(self.lost_bookie_ids)
        deadline = time.monotonic() + LOST_BOOKIE_REPAIR_TIMEOUT_S
        started = time.monotonic()
        while True:
            naming = asyncio.run(_closed_ledgers_naming(self.cluster.zookeeper, lost))
            if not naming:
                self.say(f"autorecovery: no closed ledger names {sorted(lost)} "
                         f"({time.monotonic() - started:.1f}s after the check began)")
                return
            if time.monotonic() >= deadline:
                self.failures.append(f"autorecovery: {LOST_BOOKIE_REPAIR_TIMEOUT_S:.0f}s after the run, closed "
                                     f"ledgers {sorted(naming)[:20]} still name the lost bookie(s) {sorted(lost)}")
                return
            time.sleep(1.0)

    # -- reading back --------------------------------------------------------------------------
    def last_message_id(self, topic: str) -> tuple[int, int] | None:
        """(ledger, entry) of the topic's last confirmed entry (admin, at the owner)."""
        path = "/admin/v2/" + topic.replace("persistent://", "persistent/") + "/lastMessageId"
        try:
            got = self.admin("GET", path)
            return int(got["ledgerId"]), int(got["entryId"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def read_all_reader(self, client, topic: str, message_id_earliest) -> list[bytes]:
        """The whole topic from the earliest message, at least up to its last confirmed entry
        as the admin API reports it before the read (so a read is not cut short)."""
        last = self.last_message_id(topic)
        reader = client.create_reader(topic, message_id_earliest)
        out: list[bytes] = []
        deadline = time.monotonic() + self.config.read_timeout_s
        idle_since = time.monotonic()
        reached = last is None or last[1] < 0
        try:
            while time.monotonic() < deadline:
                try:
                    msg = reader.read_next(timeout_millis=1000)
                except Exception:
                    idle_s = time.monotonic() - idle_since
                    if reached and idle_s > READ_IDLE_S and not self._has_more(reader):
                        break
                    if idle_s > READ_STALL_S:
                        self.failures.append(f"reader of {topic} stalled: nothing for {idle_s:.0f}s "
                                             f"after {len(out)} messages although more were reported available")
                        break
                    continue
                out.append(msg.data())
                idle_since = time.monotonic()
                if not reached:
                    mid = msg.message_id()
                    reached = (mid.ledger_id(), mid.entry_id()) >= last
        finally:
            reader.close()
        if not reached:
            self.failures.append(f"reader of {topic} did not reach the last message id {last} "
                                 f"reported before the read ({len(out)} messages read)")
        return out

    @staticmethod
    def _has_more(reader) -> bool:
        try:
            return reader.has_message_available()
        except Exception:
            return True

    def backlog(self, topic: str) -> int | None:
        """The subscription's backlog (admin stats at the owner; None if unknown)."""
        path = "/admin/v2/" + topic.replace("persistent://", "persistent/") + "/stats"
        try:
            return int(self.admin("GET", path)["subscriptions"][SUBSCRIPTION]["msgBacklog"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def drain_consumer(self, consumer, topic: str) -> list[bytes]:
        """Receive and acknowledge until the subscription has no backlog (or it stalls)."""
        out: list[bytes] = []
        deadline = time.monotonic() + self.config.read_timeout_s
        idle_since = time.monotonic()
        while time.monotonic() < deadline:
            try:
                msg = consumer.receive(timeout_millis=1000)
            except Exception:
                idle_s = time.monotonic() - idle_since
                if idle_s > READ_IDLE_S:
                    backlog = self.backlog(topic)
                    if backlog == 0:
                        break
                    if idle_s > READ_STALL_S:
                        self.failures.append(f"subscription {SUBSCRIPTION} on {topic} stalled: nothing for "
                                             f"{idle_s:.0f}s after {len(out)} messages, backlog {backlog}")
                        break
                continue
            out.append(msg.data())
            consumer.acknowledge(msg)
            idle_since = time.monotonic()
        return out

    def read_all_spark(self) -> dict[str, list[bytes]]:
        """Every topic scanned by the Spark data source (segments straight from bookies and the
        tier, bypassing the brokers), in message-id order."""
        import sys

        from pyspark.sql import SparkSession

        import spark_source
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)          # workers need this venv
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        spark = (SparkSession.builder.master("local[2]").appName("pulsarlite-chaos")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2").config("spark.driver.host", "127.0.0.1")
                 .getOrCreate())
        try:
            spark_source.register(spark)
            out = {}
            for topic in self.topics:
                # admin_url: the open ledger's last entries are confirmed only in the broker
                # until a next write carries the LAC to the bookies (docs/spark.md "Open
                # ledgers"); without it the scan stops short of each topic's last messages
                df = (spark.read.format("pulsarlite").option("zookeeper", self.cluster.zookeeper)
                      .option("admin_url", self.cluster.admin_url).option("topic", topic).load())
                rows = df.select("ledger_id", "entry_id", "batch_index", "value").collect()
                rows.sort(key=lambda r: (r.ledger_id, r.entry_id, r.batch_index))
                out[topic] = [bytes(r.value) for r in rows]
            return out
        finally:
            spark.stop()

    # -- everything --------------------------------------------------------------------------
    def run(self) -> ChaosReport:
        import pulsar

        c = self.config
        schedule = c.schedule()
        self.t0 = time.monotonic()
        verdict = None
        producers: list[SequencedProducer] = []
        clients = []
        logs: list[ProducerLog] = []
        load = MachineLoad(c.load_procs)
        try:
            load.start()
            if c.load_procs:
                self.say(f"machine loaded by {c.load_procs} busy process(es): pids {load.pids()}")
            self.start_cluster()
            self.say(f"cluster up: {c.bookies} bookies, {c.brokers} brokers at {self.cluster.service_url}; "
                     f"offload {self.offload}; dedup {self.dedup}; autorecovery {self.autorecovery}; "
                     f"{len(schedule)} faults planned: "
                     + ", ".join(f"{s.offset_s:.0f}s {s.fault.describe()}" for s in schedule))
            official = pulsar.Client(self.cluster.service_url, operation_timeout_seconds=30,
                                     logger=pulsar.FileLogger(pulsar.LoggerLevel.Info,
                                                              str(c.directory / "official-client.log")))
            clients.append(official)
            consumers = {t: official.subscribe(t, SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Exclusive,
                                               initial_position=pulsar.InitialPosition.Earliest)
                         for t in self.topics}
            for i, topic in enumerate(self.topics):
                name = f"official-{i}"
                producer = official.create_producer(topic, producer_name=name, batching_enabled=(i % 2 == 0),
                                                    batching_max_publish_delay_ms=5, block_if_queue_full=True,
                                                    max_pending_messages=2000, send_timeout_millis=30_000)
                producers.append(SequencedProducer(name, topic, producer, pulsar.Result.Ok, c.rate_per_producer,
                                                   "official"))
            if c.ours:
                try:
                    import pulsarlite.client as ours
                    mine = ours.Client(self.cluster.service_url, operation_timeout_seconds=30)
                    clients.append(mine)
                    for i, topic in enumerate(self.topics):
                        name = f"ours-{i}"
                        producer = mine.create_producer(topic, producer_name=name, block_if_queue_full=True,
                                                        max_pending_messages=2000, send_timeout_millis=30_000)
                        producers.append(SequencedProducer(name, topic, producer, ours.Result.Ok,
                                                           c.rate_per_producer, "pulsarlite"))
                except Exception as e:
                    self.failures.append(f"pulsarlite's own client could not produce: {type(e).__name__}: {e}")
            for p in producers:
                p.start()

            progress_stop = threading.Event()

            def progress() -> None:
                while not progress_stop.wait(10):
                    acked = sum(len(p.acked) for p in producers)
                    failed = sum(len(p.failed) for p in producers)
                    sent = sum(p.sent for p in producers)
                    self.say(f"progress: sent={sent} acknowledged={acked} failed={failed}")
            threading.Thread(target=progress, daemon=True).start()
            try:
                self.run_schedule(schedule, c.duration_s)
            finally:
                progress_stop.set()
                for p in producers:
                    p.request_stop()
                stop_deadline = time.monotonic() + 10
                for p in producers:
                    p.stop(timeout_s=max(0.1, stop_deadline - time.monotonic()))
            self.say("faults over: healing the cluster")
            self.heal()
            self.say("cluster healthy; flushing producers")
            flush_deadline = time.monotonic() + c.flush_timeout_s   # one bound for all producers
            for p in producers:
                if not p.flush(max(1.0, flush_deadline - time.monotonic())):
                    self.failures.append(f"{p.name}: {p.sent - len(p.acked) - len(p.failed)} sends got no "
                                         f"answer within {c.flush_timeout_s}s after healing")
            logs = [p.log() for p in producers]
            self.say("reading everything back (reader and subscription per topic)")
            read_paths = {"reader": {}, "consumer": {}}
            for topic in self.topics:
                read_paths["reader"][topic] = self.read_all_reader(official, topic, pulsar.MessageId.earliest)
                read_paths["consumer"][topic] = self.drain_consumer(consumers[topic], topic)
            if c.spark:
                self.say("reading everything back with a Spark scan")
                try:
                    read_paths["spark"] = self.read_all_spark()
                except Exception as e:
                    self.failures.append(f"Spark scan failed: {type(e).__name__}: ...{str(e)[-1200:]}")
            verdict = check(logs, read_paths)
            self.say("check: " + verdict.summary())
            if self.dedup == "on" and verdict.duplicated:
                self.failures.append(f"deduplication is on but {verdict.duplicated} messages are stored twice")
            if self.lost_bookie_ids and self.autorecovery == "on":
                self.check_lost_bookies_repaired()
        except Exception as e:
            self.failures.append(f"run aborted: {type(e).__name__}: {e}")
            logs = logs or [p.log() for p in producers]
        finally:
            load.stop()
            for p in producers:
                p.request_stop()
            for client in clients:
                try:
                    client.close()
                except Exception:
                    pass
            if self.cluster is not None:
                try:
                    self.cluster.stop()
                except Exception as e:
                    self.failures.append(f"cluster stop: {e}")
        return ChaosReport(c, self.faults, verdict, logs, self.offload, self.now(), self.dedup, self.failures)


async def _closed_ledgers_naming(zookeeper: str, bookies: set[str]) -> list[int]:
    """Ids of CLOSED ledgers whose metadata names one of ``bookies`` (in an ensemble or as
    under-replicated)."""
    from bookie.client.ledger_manager import LedgerManager
    from bookie.client.metadata import LedgerState
    from pulsarlite.metadata import MetadataStore

    store = await MetadataStore.connect(zookeeper)
    try:
        return [md.ledger_id for md in await LedgerManager(store).ledgers_naming(bookies)
                if md.state is LedgerState.CLOSED]
    finally:
        await store.close()


def run_chaos(config: ChaosConfig, out=print) -> ChaosReport:
    return ChaosRun(config, out=out).run()


__all__ = ["ChaosConfig", "ChaosReport", "ChaosRun", "run_chaos", "SequencedProducer"]
