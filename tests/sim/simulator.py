"""Seeded, deterministic discrete-event simulation of the ledger write and recovery cores.

One scenario per seed: N in-memory bookies (fence flag durable at once; adds refused when fenced
unless recovery; an add visible to reads at once but acked only after a group-commit "sync"; a
crash loses unsynced entries and pending acks, the bookie restarts later), a network that drops,
delays and reorders RPCs (a lost request or reply surfaces as ERROR at the RPC timeout), a
simulated clock and a versioned CAS metadata store. A writer (LedgerWriteCore) appends K entries
while, at a random time, a second client marks the ledger IN_RECOVERY and runs
LedgerRecoveryCore (sometimes a third one concurrently); the old writer keeps trying. One fence
message may be lost or delayed past its timeout. After a fault phase the network and bookies
heal, everything runs to quiescence and the invariants are checked (DESIGN.md §4, 1 and 3-5).

Replay one seed: ``python -m tests.sim.simulator --seed N [--config NAME] [--no-fence-reads]
[--trace]``, or ``run_seed(seed, config)`` / ``check_seed(seed, config)``.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import random
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from bookie.client.actions import (AddOutcome, CloseDone, CloseFailed, ConfirmAdds, EntryData,
                                   FailAdds, LacOutcome, ReadOutcome, RecoveryDone, RecoveryFailed,
                                   SendAdd, SendRead, SendReadLac, WriteMetadata)
from bookie.client.metadata import LEDGER_STATE_TRANSITIONS, LedgerMetadata, LedgerState
from bookie.client.recovery_core import LedgerRecoveryCore
from bookie.client.write_core import LedgerWriteCore
from pulsarlite.errors import PulsarliteError

LEDGER_ID = 7


@dataclass(frozen=True)
class SimConfig:
    name: str
    bookies: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    entries: int = 30
    add_interval_ms: tuple[int, int] = (0, 4)
    add_pause_probability: float = 0.2       # the writer goes idle for a while between adds
    add_pause_ms: tuple[int, int] = (30, 200)
    fence_recovery_reads: bool = True
    # network
    delay_ms: tuple[int, int] = (1, 8)
    slow_probability: float = 0.1
    slow_delay_ms: tuple[int, int] = (10, 60)
    drop_probability: float = 0.01
    rpc_timeout_ms: int = 100
    metadata_delay_ms: tuple[int, int] = (1, 10)
    # faults
    fault_phase_ms: int = 400
    # a flaky bookie (one of the first ensemble): the first recovery's fence message to it is
    # lost or delayed past its timeout, and the writer's link to it is often slow
    flaky_bookie_probability: float = 0.5
    flaky_slow_probability: float = 0.8
    flaky_delay_ms: tuple[int, int] = (10, 80)
    crashes_max: int = 2
    crash_down_ms: tuple[int, int] = (10, 150)
    sync_delay_ms: tuple[int, int] = (1, 3)
    # clients
    recovery_start_ms: tuple[int, int] = (5, 400)
    # the new owner often takes over while the old writer is idle: start the first recovery
    # right when the writer begins its n-th pause (n drawn from 1..4)
    recovery_at_pause_probability: float = 0.5
    recovery_after_pause_ms: tuple[int, int] = (0, 10)
    second_recovery_probability: float = 0.25
    recovery_attempts_max: int = 50
    add_timeout_ms: int = 400
    ensemble_change_attempts_max: int = 5
    tick_ms: int = 10
    run_ms_max: int = 20_000


CONFIGS: dict[str, SimConfig] = {c.name: c for c in (
    SimConfig("e3w3a2n3", bookies=3, ensemble_size=3, write_quorum=3, ack_quorum=2),
    SimConfig("e3w3a2n5", bookies=5, ensemble_size=3, write_quorum=3, ack_quorum=2),
    SimConfig("e3w2a2n4", bookies=4, ensemble_size=3, write_quorum=2, ack_quorum=2),
    SimConfig("e4w3a2n5", bookies=5, ensemble_size=4, write_quorum=3, ack_quorum=2),
    # more churn: many lost messages (ensemble changes, failed recoveries) and crashes
    SimConfig("e3w3a2n5-chaos", bookies=5, ensemble_size=3, write_quorum=3, ack_quorum=2,
              drop_probability=0.05, slow_probability=0.25, crashes_max=5),
    SimConfig("e3w2a2n3-chaos", bookies=3, ensemble_size=3, write_quorum=2, ack_quorum=2,
              drop_probability=0.05, slow_probability=0.25, crashes_max=5),
)}


class SimulationViolation(AssertionError):
    """An invariant broke in a simulated run; the message names the seed to replay."""


@dataclass
class SimResult:
    seed: int
    config: SimConfig
    violations: list[str]
    trace: list[str]
    confirmed_last: int = -1
    closed: LedgerMetadata | None = None
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def trace_digest(self) -> str:
        return hashlib.sha256("\n".join(self.trace).encode()).hexdigest()


# -- the simulated world ----------------------------------------------------------------------

class SimBookie:
    """One bookie, one ledger: durable and unsynced entries, a durable fence flag."""

    def __init__(self, sim: "Simulation", bookie_id: str) -> None:
        self.sim = sim
        self.id = bookie_id
        self.up = True
        self.lost = False
        self.epoch = 0
        self.fenced = False
        self.durable: dict[int, EntryData] = {}
        self.unsynced: dict[int, EntryData] = {}
        self.waiting_acks: list[Callable[[Any], None]] = []
        self.sync_scheduled = False
        self.accepted: list[tuple[int, bool, bool]] = []   # (entry id, recovery, fenced then)

    def _has_ledger(self) -> bool:
        return bool(self.durable or self.unsynced)

    def _get(self, entry_id: int) -> EntryData | None:
        entry = self.unsynced.get(entry_id)
        return entry if entry is not None else self.durable.get(entry_id)

    def handle(self, request: tuple, reply: Callable[[Any], None]) -> None:
        if not self.up:
            return                                     # no answer: the caller times out
        kind = request[0]
        if kind == "add":
            _, entry, recovery = request
            self.add(entry, recovery, reply)
        elif kind == "read":
            _, entry_id, fence = request
            if fence:
                self.fenced = True                     # durable before the answer
            entry = self._get(entry_id)
            if entry is not None:
                reply((ReadOutcome.FOUND, entry))
            else:
                reply((ReadOutcome.NO_SUCH_ENTRY if self._has_ledger() else ReadOutcome.NO_SUCH_LEDGER, None))
        elif kind == "read_lac":
            _, fence = request
            if fence:
                self.fenced = True
            if self._has_ledger():
                lac = max(e.lac for e in list(self.durable.values()) + list(self.unsynced.values()))
                reply((LacOutcome.OK, lac))
            else:
                reply((LacOutcome.NO_SUCH_LEDGER, -1))
        else:
            raise ValueError(kind)

    def add(self, entry: EntryData, recovery: bool, reply: Callable[[Any], None]) -> None:
        if self.fenced and not recovery:
            reply(AddOutcome.FENCED)
            return
        existing = self._get(entry.entry_id)
        if existing is not None and (existing.payload, existing.length) != (entry.payload, entry.length):
            self.sim.violation(f"bookie {self.id}: entry {entry.entry_id} rewritten with different "
                               f"content ({existing} -> {entry})")
        self.accepted.append((entry.entry_id, recovery, self.fenced))
        self.unsynced[entry.entry_id] = entry
        self.waiting_acks.append(reply)
        if not self.sync_scheduled:
            self.sync_scheduled = True
            self.sim.at(self.sim.net_rng.randint(*self.sim.config.sync_delay_ms), self._sync, self.epoch)

    def _sync(self, epoch: int) -> None:
        if epoch != self.epoch:
            return                                     # crashed since: that group commit is lost
        self.sync_scheduled = False
        self.durable.update(self.unsynced)
        self.unsynced.clear()
        acks, self.waiting_acks = self.waiting_acks, []
        for reply in acks:
            reply(AddOutcome.OK)

    def crash(self) -> None:
        self.up = False
        self.epoch += 1
        self.unsynced.clear()
        self.waiting_acks.clear()
        self.sync_scheduled = False

    def restart(self) -> None:
        if not self.lost:
            self.up = True


class SimMetadataStore:
    """Versioned compare-and-set of the one ledger's metadata."""

    def __init__(self, sim: "Simulation", metadata: LedgerMetadata) -> None:
        self.sim = sim
        self.value = metadata
        self.version = 0

    def cas(self, expected_version: int, new: LedgerMetadata) -> tuple[bool, LedgerMetadata, int]:
        if expected_version != self.version:
            return False, self.value, self.version
        if new.state not in LEDGER_STATE_TRANSITIONS[self.value.state]:
            self.sim.violation(f"metadata: {self.value.state.value} -> {new.state.value} written")
        if self.value.is_closed:
            self.sim.violation(f"metadata: CLOSED ledger rewritten: {self.value} -> {new}")
        self.value = new
        self.version += 1
        self.sim.log(f"md v{self.version} {new.state.value} last={new.last_entry_id} len={new.length} "
                     f"ens={new.ensembles} under={new.under_replicated_bookies}")
        if new.is_closed:
            self.sim.check_confirms_within_close()
        return True, self.value, self.version


class Simulation:
    def __init__(self, seed: int, config: SimConfig) -> None:
        self.seed = seed
        self.config = config
        self.now = 0
        self._queue: list[tuple[int, int, Callable[..., None], tuple]] = []
        self._seq = 0
        self.trace: list[str] = []
        self.violations: list[str] = []
        self.net_rng = random.Random(f"{seed}/net")
        self.fault_rng = random.Random(f"{seed}/faults")
        self.writer_rng = random.Random(f"{seed}/writer")
        self.bookies = {f"b{i}": SimBookie(self, f"b{i}") for i in range(config.bookies)}
        ensemble = tuple(self.writer_rng.sample(sorted(self.bookies), config.ensemble_size))
        self.store = SimMetadataStore(self, LedgerMetadata(
            ledger_id=LEDGER_ID, ensemble_size=config.ensemble_size, write_quorum=config.write_quorum,
            ack_quorum=config.ack_quorum, ensembles=((0, ensemble),)))
        self.faults_on = True
        self.recovery_at_pause = 0
        self.writer_pauses = 0
        self.flaky_bookie: str | None = None
        self.fence_faulted = False
        self.fence_fault_kind = ""
        self.writer = WriterClient(self)
        self.recoveries: list[RecoveryClient] = []
        self.stats: dict[str, int] = {"rpcs": 0, "dropped": 0, "crashes": 0, "fragments": 1}

    # -- scheduling ----------------------------------------------------------------------
    def at(self, delay_ms: int, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now + delay_ms, self._seq, fn, args))

    def log(self, text: str) -> None:
        self.trace.append(f"{self.now} {text}")

    def violation(self, text: str) -> None:
        if any(v.split(" ", 1)[1] == text for v in self.violations):
            return
        self.log(f"VIOLATION {text}")
        self.violations.append(f"t={self.now} {text}")

    def writable_bookies(self) -> list[str]:
        return [b.id for b in self.bookies.values() if b.up and not b.lost]

    # -- network -------------------------------------------------------------------------
    def _delay(self) -> int:
        c = self.config
        delay = self.net_rng.randint(*c.delay_ms)
        if self.faults_on and self.net_rng.random() < c.slow_probability:
            delay += self.net_rng.randint(*c.slow_delay_ms)
        return delay

    def _dropped(self) -> bool:
        return self.faults_on and self.net_rng.random() < self.config.drop_probability

    def rpc(self, source: str, bookie_id: str, request: tuple, on_reply: Callable[[Any], None],
            error_reply: Any) -> None:
        """Request -> bookie -> reply, each leg delayed or dropped; no reply within the RPC
        timeout gives ``error_reply`` (late replies are then ignored). ``source`` names the
        client ("writer", "r0", ...): the flaky bookie's faults depend on it."""
        self.stats["rpcs"] += 1
        done = [False]
        what = request[1:] if request[0] != "add" else (request[1].entry_id, request[2])
        label = f"{source} {request[0]}->{bookie_id} {what}"

        def finish(reply: Any, how: str) -> None:
            if done[0]:
                return
            done[0] = True
            self.log(f"{how} {label}: {reply}")
            on_reply(reply)

        def send_reply(reply: Any) -> None:
            if self._dropped():
                self.stats["dropped"] += 1
                self.log(f"drop reply {label}")
                return
            self.at(self._delay(), finish, reply, "reply")

        self.at(self.config.rpc_timeout_ms, finish, error_reply, "timeout")
        delay = self._delay()
        flaky = self.faults_on and bookie_id == self.flaky_bookie
        if flaky and source == "writer" and self.net_rng.random() < self.config.flaky_slow_probability:
            delay += self.net_rng.randint(*self.config.flaky_delay_ms)
        if flaky and request[0] == "read_lac" and request[1] and source == "r0" and not self.fence_faulted:
            self.fence_faulted = True                  # the first recovery's fence to it
            if self.fence_fault_kind == "drop":
                self.log(f"lose fence {label}")
                return
            delay = self.config.rpc_timeout_ms + self.fault_rng.randint(1, 200)
            self.log(f"delay fence {label} by {delay}")
        elif self._dropped():
            self.stats["dropped"] += 1
            self.log(f"drop request {label}")
            return
        self.at(delay, self.bookies[bookie_id].handle, request, send_reply)

    def metadata_cas(self, expected_version: int, metadata: LedgerMetadata,
                     on_reply: Callable[[bool, LedgerMetadata, int], None]) -> None:
        def arrive() -> None:
            result = self.store.cas(expected_version, metadata)
            self.at(self.net_rng.randint(*self.config.metadata_delay_ms), on_reply, *result)
        self.at(self.net_rng.randint(*self.config.metadata_delay_ms), arrive)

    def metadata_read(self, on_reply: Callable[[LedgerMetadata, int], None]) -> None:
        def arrive() -> None:
            value, version = self.store.value, self.store.version
            self.at(self.net_rng.randint(*self.config.metadata_delay_ms), on_reply, value, version)
        self.at(self.net_rng.randint(*self.config.metadata_delay_ms), arrive)

    # -- faults --------------------------------------------------------------------------
    def _schedule_faults(self) -> None:
        c = self.config
        rng = self.fault_rng
        if rng.random() < c.flaky_bookie_probability:
            self.flaky_bookie = rng.choice(self.store.value.current_ensemble)
            self.fence_fault_kind = rng.choice(["drop", "delay"])
        for _ in range(rng.randint(0, c.crashes_max)):
            bookie = rng.choice(sorted(self.bookies))
            self.at(rng.randint(0, c.fault_phase_ms), self._crash, bookie, rng.randint(*c.crash_down_ms))
        self.at(c.fault_phase_ms, self._heal)

    def _crash(self, bookie_id: str, down_ms: int) -> None:
        bookie = self.bookies[bookie_id]
        if not bookie.up or not self.faults_on:
            return
        self.stats["crashes"] += 1
        self.log(f"crash {bookie_id} for {down_ms}")
        bookie.crash()
        self.at(down_ms, self._restart, bookie_id)

    def _restart(self, bookie_id: str) -> None:
        self.log(f"restart {bookie_id}")
        self.bookies[bookie_id].restart()

    def _heal(self) -> None:
        self.log("heal")
        self.faults_on = False
        for bookie in self.bookies.values():
            if not bookie.up:
                bookie.restart()

    # -- run -----------------------------------------------------------------------------
    def run(self) -> SimResult:
        c = self.config
        self._schedule_faults()
        self.writer.start()
        if self.fault_rng.random() < c.recovery_at_pause_probability:
            self.recovery_at_pause = self.fault_rng.randint(1, 4)
        else:
            self.at(self.fault_rng.randint(*c.recovery_start_ms), self._start_recovery)
        if self.fault_rng.random() < c.second_recovery_probability:
            self.at(self.fault_rng.randint(*c.recovery_start_ms), self._start_recovery)
        while self._queue:
            time, _, fn, args = heapq.heappop(self._queue)
            if time > c.run_ms_max:
                self.violation(f"still running at {c.run_ms_max} ms (liveness)")
                break
            self.now = time
            fn(*args)
        self.final_checks()
        return SimResult(self.seed, c, self.violations, self.trace, self.writer.confirmed_last,
                         self.store.value if self.store.value.is_closed else None, self.stats)

    def on_writer_pause(self, last: bool = False) -> None:
        """The writer goes idle (``last``: it added its last entry)."""
        self.writer_pauses += 1
        if self.recovery_at_pause and (self.writer_pauses == self.recovery_at_pause or last):
            self.recovery_at_pause = 0
            self.at(self.fault_rng.randint(*self.config.recovery_after_pause_ms), self._start_recovery)

    def _start_recovery(self) -> None:
        client = RecoveryClient(self, len(self.recoveries))
        self.recoveries.append(client)
        client.start()

    # -- invariants ----------------------------------------------------------------------
    def check_confirms_within_close(self) -> None:
        closed = self.store.value
        if closed.is_closed and self.writer.confirmed_last > closed.last_entry_id:
            self.violation(f"acknowledged entry {self.writer.confirmed_last} beyond the closed "
                           f"ledger's last entry {closed.last_entry_id} (acknowledged entry lost)")

    def final_checks(self) -> None:
        md = self.store.value
        if not md.is_closed:
            self.violation(f"ledger not closed at the end: {md.state.value}")
            return
        self.stats["fragments"] = len(md.ensembles)
        last = md.last_entry_id
        qa = md.ack_quorum
        writer = self.writer
        # (4): no normal add accepted by a fenced bookie; no acknowledged entry beyond the close
        for bookie in self.bookies.values():
            for entry_id, recovery, fenced in bookie.accepted:
                if fenced and not recovery:
                    self.violation(f"bookie {bookie.id}: normal add of entry {entry_id} accepted while fenced")
        self.check_confirms_within_close()
        # (1): every entry through last_entry_id (all acknowledged ones among them) is durable
        # on >= Qa bookies of its write set with the same bytes: it survives Qa - 1 losses and
        # the crash of every process (only durable state counts here)
        expected_length = 0
        for entry_id in range(last + 1):
            copies = [self.bookies[b].durable.get(entry_id) for b in md.write_set(entry_id)]
            present = [e for e in copies if e is not None]
            if len(present) < qa:
                self.violation(f"entry {entry_id} <= last {last} durable on {len(present)} < Qa bookies "
                               f"of {md.write_set(entry_id)}")
            if len({(e.payload, e.length) for e in present}) > 1:
                self.violation(f"entry {entry_id}: replicas differ: {present}")
            if entry_id in writer.payloads and present and present[0].payload != writer.payloads[entry_id]:
                self.violation(f"entry {entry_id}: stored bytes differ from the written ones")
            if present:
                expected_length += len(present[0].payload)
                if present[0].length != expected_length:
                    self.violation(f"entry {entry_id}: length {present[0].length} != {expected_length}")
        if md.length != expected_length:
            self.violation(f"closed length {md.length} != sum of entry sizes {expected_length}")
        # (5): readers reading each entry from any replica, with Qa - 1 bookies lost for good
        lost = set(self.fault_rng.sample(sorted(self.bookies), qa - 1))
        self.log(f"lost for good: {sorted(lost)}")
        views = []
        for reader in range(3):
            rng = random.Random(f"{self.seed}/reader{reader}")
            seen = []
            for entry_id in range(last + 1):
                replicas = [b for b in md.write_set(entry_id) if b not in lost]
                rng.shuffle(replicas)
                found = next((self.bookies[b].durable[entry_id].payload for b in replicas
                              if entry_id in self.bookies[b].durable), None)
                if found is None:
                    self.violation(f"reader {reader}: entry {entry_id} unreadable with {sorted(lost)} lost")
                seen.append(found)
            views.append(seen)
        if any(v != views[0] for v in views):
            self.violation("readers of the closed ledger disagree")
        for entry_id, payload in writer.confirmed.items():
            if entry_id <= last and views[0][entry_id] != payload:
                self.violation(f"acknowledged entry {entry_id} reads back different bytes")


class WriterClient:
    """The old owner: drives LedgerWriteCore as the asyncio shell would."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        c = sim.config
        self.core = LedgerWriteCore(sim.store.value, add_timeout_ms=c.add_timeout_ms,
                                    ensemble_change_attempts_max=c.ensemble_change_attempts_max)
        self.version = 0
        self.payloads: dict[int, bytes] = {}
        self.confirmed: dict[int, bytes] = {}
        self.confirmed_last = -1
        self.failed_from: int | None = None
        self.adds_refused = False
        self.finished = False
        self.close_called = False
        self.payload_rng = random.Random(f"{sim.seed}/payloads")

    def start(self) -> None:
        self.sim.at(0, self._add_next)
        self.sim.at(self.sim.config.tick_ms, self._tick)

    def _add_next(self) -> None:
        if len(self.payloads) >= self.sim.config.entries or self.adds_refused:
            self._maybe_close()
            return
        payload = f"e{len(self.payloads)}:".encode() + self.payload_rng.randbytes(self.payload_rng.randint(0, 12))
        try:
            entry_id, actions = self.core.add(payload, self.sim.now)
        except PulsarliteError as e:
            self.sim.log(f"writer add refused: {e!r}")
            self.adds_refused = True
            self.sim.on_writer_pause(last=True)
            self._maybe_close()
            return
        self.payloads[entry_id] = payload
        self.sim.log(f"writer add {entry_id}")
        self.execute(actions)
        c = self.sim.config
        if len(self.payloads) == c.entries:
            self.sim.on_writer_pause(last=True)
            self.sim.at(0, self._add_next)
        elif self.sim.net_rng.random() < c.add_pause_probability:
            self.sim.on_writer_pause()
            self.sim.at(self.sim.net_rng.randint(*c.add_pause_ms), self._add_next)
        else:
            self.sim.at(self.sim.net_rng.randint(*c.add_interval_ms), self._add_next)

    def _maybe_close(self) -> None:
        done_adding = len(self.payloads) >= self.sim.config.entries or self.adds_refused
        if done_adding and self.core.pending_count == 0 and not self.close_called:
            self.close_called = True
            self.sim.log("writer close")
            self.execute(self.core.close())

    def _tick(self) -> None:
        if self.finished:
            return
        self.execute(self.core.on_tick(self.sim.now, self.sim.writable_bookies(), self.sim.writer_rng))
        self._maybe_close()
        self.sim.at(self.sim.config.tick_ms, self._tick)

    def execute(self, actions: list) -> None:
        sim = self.sim
        for action in actions:
            if isinstance(action, SendAdd):
                entry = EntryData(action.entry_id, action.lac, action.length, action.payload)
                sim.rpc("writer", action.bookie, ("add", entry, action.recovery),
                        lambda outcome, b=action.bookie, e=action.entry_id: self.execute(
                            self.core.on_add_result(b, e, outcome, sim.now, sim.writable_bookies(),
                                                    sim.writer_rng)),
                        AddOutcome.ERROR)
            elif isinstance(action, ConfirmAdds):
                last = action.last_entry_id
                if last <= self.confirmed_last:                       # invariant 3
                    sim.violation(f"confirm went backwards: {self.confirmed_last} -> {last}")
                if self.failed_from is not None and last >= self.failed_from:
                    sim.violation(f"confirm {last} after adds from {self.failed_from} failed")
                if last != self.core.lac:
                    sim.violation(f"ConfirmAdds({last}) but core LAC is {self.core.lac}")
                for entry_id in range(self.confirmed_last + 1, last + 1):
                    self.confirmed[entry_id] = self.payloads[entry_id]
                sim.log(f"writer confirm {self.confirmed_last + 1}..{last}")
                self.confirmed_last = last
                sim.check_confirms_within_close()
            elif isinstance(action, FailAdds):
                if action.first_entry_id != self.confirmed_last + 1:
                    sim.violation(f"FailAdds({action.first_entry_id}) but LAC is {self.confirmed_last}")
                if self.failed_from is None:
                    self.failed_from = action.first_entry_id
                sim.log(f"writer fail from {action.first_entry_id}: {action.error!r}")
            elif isinstance(action, WriteMetadata):
                proposed = action.metadata
                sim.log(f"writer cas v{self.version} {proposed.state.value} {proposed.ensembles}")

                def answered(ok: bool, current: LedgerMetadata, version: int, proposed=proposed) -> None:
                    self.version = version
                    args = (sim.now, sim.writable_bookies(), sim.writer_rng)
                    if ok:
                        self.execute(self.core.on_metadata_written(proposed, *args))
                    else:
                        self.execute(self.core.on_metadata_conflict(current, *args))
                    self._maybe_close()
                sim.metadata_cas(self.version, proposed, answered)
            elif isinstance(action, (CloseDone, CloseFailed)):
                sim.log(f"writer {action}")
                self.finished = True
            else:
                raise AssertionError(f"writer: unexpected action {action}")
        self._maybe_close()


class RecoveryClient:
    """A new owner: marks the ledger IN_RECOVERY and drives LedgerRecoveryCore; on a retriable
    failure it re-reads the metadata and starts again."""

    def __init__(self, sim: Simulation, number: int) -> None:
        self.sim = sim
        self.name = f"r{number}"
        self.attempts = 0
        self.version = -1
        self.done = False

    def start(self) -> None:
        self.attempts += 1
        self.sim.log(f"{self.name} start attempt {self.attempts}")
        self.sim.metadata_read(self._on_metadata)

    def _on_metadata(self, md: LedgerMetadata, version: int) -> None:
        self.version = version
        if md.is_closed:
            self._finish(md)
        elif md.state is LedgerState.OPEN:
            self.sim.metadata_cas(version, md.with_state(LedgerState.IN_RECOVERY), self._on_marked)
        else:
            self._run(md)

    def _on_marked(self, ok: bool, current: LedgerMetadata, version: int) -> None:
        if ok:
            self.version = version
            self._run(current)
        else:
            self._on_metadata(current, version)

    def _run(self, md: LedgerMetadata) -> None:
        core = LedgerRecoveryCore(md, fence_recovery_reads=self.sim.config.fence_recovery_reads)
        self.execute(core, core.start())

    def _finish(self, md: LedgerMetadata) -> None:
        self.sim.log(f"{self.name} done: last={md.last_entry_id} length={md.length}")
        self.done = True

    def execute(self, core: LedgerRecoveryCore, actions: list) -> None:
        sim = self.sim
        for action in actions:
            if isinstance(action, SendReadLac):
                sim.rpc(self.name, action.bookie, ("read_lac", action.fence),
                        lambda reply, b=action.bookie: self.execute(core, core.on_read_lac(b, *reply)),
                        (LacOutcome.ERROR, -1))
            elif isinstance(action, SendRead):
                sim.rpc(self.name, action.bookie, ("read", action.entry_id, action.fence),
                        lambda reply, b=action.bookie, e=action.entry_id: self.execute(
                            core, core.on_read(b, e, *reply)),
                        (ReadOutcome.ERROR, None))
            elif isinstance(action, SendAdd):
                entry = EntryData(action.entry_id, action.lac, action.length, action.payload)
                sim.rpc(self.name, action.bookie, ("add", entry, action.recovery),
                        lambda outcome, b=action.bookie, e=action.entry_id: self.execute(
                            core, core.on_add_result(b, e, outcome)),
                        AddOutcome.ERROR)
            elif isinstance(action, WriteMetadata):
                proposed = action.metadata
                sim.log(f"{self.name} cas close last={proposed.last_entry_id} len={proposed.length}")

                def answered(ok: bool, current: LedgerMetadata, version: int, proposed=proposed) -> None:
                    self.version = version
                    if ok:
                        self.execute(core, core.on_metadata_written(proposed))
                    else:
                        self.execute(core, core.on_metadata_conflict(current))
                sim.metadata_cas(self.version, proposed, answered)
            elif isinstance(action, RecoveryDone):
                self._finish(action.metadata)
            elif isinstance(action, RecoveryFailed):
                sim.log(f"{self.name} failed: {action.error!r}")
                if self.attempts >= sim.config.recovery_attempts_max:
                    sim.violation(f"{self.name}: recovery gave up after {self.attempts} attempts")
                else:
                    sim.at(sim.fault_rng.randint(20, 80), self.start)
            else:
                raise AssertionError(f"recovery: unexpected action {action}")


# -- entry points -------------------------------------------------------------------------------

def run_seed(seed: int, config: SimConfig | str = "e3w3a2n3", *,
             fence_recovery_reads: bool | None = None) -> SimResult:
    """Run one seed; deterministic. Returns the result (violations listed, not raised)."""
    if isinstance(config, str):
        config = CONFIGS[config]
    if fence_recovery_reads is not None:
        config = replace(config, fence_recovery_reads=fence_recovery_reads)
    return Simulation(seed, config).run()


def check_seed(seed: int, config: SimConfig | str = "e3w3a2n3", **kwargs: Any) -> SimResult:
    """run_seed, raising SimulationViolation (naming the seed and how to replay it) on a violation."""
    result = run_seed(seed, config, **kwargs)
    if result.violations:
        c = result.config
        flag = "" if c.fence_recovery_reads else " --no-fence-reads"
        raise SimulationViolation(
            f"seed {seed} config {c.name}: {len(result.violations)} violation(s); replay with "
            f"`python -m tests.sim.simulator --seed {seed} --config {c.name}{flag} --trace`:\n  "
            + "\n  ".join(result.violations[:10]))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--seeds", type=int, default=1, help="run seeds seed .. seed+N-1")
    parser.add_argument("--config", default="e3w3a2n3", choices=sorted(CONFIGS))
    parser.add_argument("--no-fence-reads", action="store_true", help="switch off defect fix 1")
    parser.add_argument("--trace", action="store_true", help="print the event trace")
    args = parser.parse_args(argv)
    failures = 0
    for seed in range(args.seed, args.seed + args.seeds):
        result = run_seed(seed, args.config, fence_recovery_reads=not args.no_fence_reads)
        if args.trace:
            print("\n".join(result.trace))
        closed = result.closed
        print(f"seed {seed} {result.config.name}: {'OK' if result.ok else 'VIOLATION'} "
              f"confirmed_last={result.confirmed_last} "
              f"closed_last={closed.last_entry_id if closed else None} stats={result.stats} "
              f"trace={result.trace_digest()[:12]}")
        for v in result.violations:
            print("  " + v)
        failures += not result.ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
