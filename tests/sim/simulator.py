"""Seeded, deterministic discrete-event simulation of the ledger write and recovery cores.

One scenario per seed: N in-memory bookies (fence flag durable at once; adds refused when fenced
unless recovery; an add visible to reads at once but acked only after a group-commit "sync"; a
crash loses unsynced entries and pending acks, the bookie restarts later), a network that drops,
delays and reorders RPCs (a lost request or reply surfaces as ERROR at the RPC timeout), a
simulated clock and a versioned CAS metadata store. A writer (LedgerWriteCore) appends K entries
while, at a random time, a second client marks the ledger IN_RECOVERY and runs
LedgerRecoveryCore (sometimes a third one concurrently); the old writer keeps trying. One fence
message may be lost or delayed past its timeout. After a fault phase the network and bookies
heal, everything runs to quiescence and the invariants are checked (docs/architecture.md#invariants,
1 and 3-5).

The writer adds single entries and runs of entries through the write core's one add path
(``add``: one request per bookie with its share of the run, a single entry being a run of one;
acks back per bookie as the asyncio shell gets them); OK
answers reach the core as the shell feeds them (``on_add_acks``) or one by one
(``on_add_result``). Tailing readers open the ledger WITHOUT recovery and read it up to its LAC
while it is written: they run the real asyncio shell (``LedgerClient.open_ledger(recovery=False)``,
``LedgerReader.refresh_lac`` / ``read``, ``reader.read_lac``) on a private event loop whose
bookie calls go over the simulated network. Some seeds have no takeover at all (only the writer
and tailers): the writer must then close the ledger itself, never fenced.

More faults: duplicate delivery of requests, a bookie lost for good (never restarts), a bookie
whose disk is wiped while down (the real bookie's cookie check refuses to start it, so it is
lost for good; a fresh bookie with a new id joins instead), metadata writes whose outcome the
client never learns (the request, or the committed CAS's reply, is lost: the client does what
the shell does on a ZooKeeper error), and the writer cut off from the bookies (errors) or
stalled (no answers, its adds time out) while the takeover starts: its adds fail, it closes
the ledger itself and its close CAS meets the recovery's, often at another last entry.

Checks, beyond the final state: what every client reports (the writer's CloseDone, each
recovery's RecoveryDone) equals the metadata in the store; the LAC carried by every entry the
writer sends was confirmed; a tailing reader never returns an entry beyond the writer's LAC
(or the closed ledger's last entry), never sends the fence flag, and everything it returned is
in the closed ledger, byte for byte.

Replay one seed: ``python -m tests.sim.simulator --seed N [--config NAME] [--no-fence-reads]
[--set FIELD=VALUE ...] [--trace]``, or ``run_seed(seed, config, **fields)`` /
``check_seed(seed, config, **fields)``.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import hashlib
import heapq
import random
import shlex
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.client.actions import (AddOutcome, CloseDone, CloseFailed, ConfirmAdds, EntryData,
                                   FailAdds, LacOutcome, ReadOutcome, RecoveryDone, RecoveryFailed,
                                   SendAdd, SendAddRun, SendRead, SendReadLac, WriteMetadata)
from bookie.client.ledger_client import LedgerClient
from bookie.client.metadata import LEDGER_STATE_TRANSITIONS, LedgerMetadata, LedgerState
from bookie.client.reader import LedgerReader
from bookie.client.recovery_core import LedgerRecoveryCore
from bookie.client.write_core import LedgerWriteCore, WriteCoreState
from pulsarlite.checksum import entry_checksum
from pulsarlite.config import LedgerClientConfig
from pulsarlite.errors import BookieUnavailableError, InvariantViolation, PulsarliteError

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
    # test-only switches of the recovery core: ensemble change on a failed re-write, and fix 2
    # (read from the writer's last fragment, not from the LAC)
    recovery_ensemble_change: bool = True
    recover_from_last_fragment: bool = True
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
    # no takeover at all: the writer closes the ledger itself (tailing readers must not fence it)
    no_takeover_probability: float = 0.1
    recovery_attempts_max: int = 50
    # the writer: runs of entries in one add call; OK answers fed as the asyncio shell does
    # (on_add_acks) in some seeds, one by one (on_add_result) in the others
    run_probability: float = 0.3
    run_entries: tuple[int, int] = (2, 6)
    shell_acks_probability: float = 0.5
    # tailing readers (LedgerClient.open_ledger(recovery=False) + LedgerReader, real code)
    tailer_probability: float = 0.3
    tailers_max: int = 2
    tailer_rounds: tuple[int, int] = (3, 10)
    tailer_interval_ms: tuple[int, int] = (5, 120)
    # more faults
    duplicate_probability: float = 0.02          # a request is delivered a second time, later
    duplicate_delay_ms: tuple[int, int] = (1, 200)
    lost_for_good_probability: float = 0.0       # a bookie crashes and never comes back
    wiped_probability: float = 0.0               # a bookie's disk is wiped while it is down
    wiped_rejoins: bool = False                  # UNSAFE: no cookie check, it rejoins empty
    metadata_unknown_probability: float = 0.0    # a CAS's outcome never reaches the client
    # the writer is cut off from the bookies for a while, and the takeover starts then (its
    # adds fail, it closes the ledger itself, and its close CAS meets the recovery's): "cut",
    # requests or replies are lost (errors at the RPC timeout), or "stall", the connections
    # stay up but no answer comes back (the adds time out in the core first; some of them
    # reached bookies unacknowledged)
    writer_partition_probability: float = 0.15
    writer_partition_ms: tuple[int, int] = (100, 400)
    stall_rpc_timeout_ms: int = 2_000
    metadata_timeout_ms: int = 50
    add_timeout_ms: int = 400
    ensemble_change_attempts_max: int = 5
    tick_ms: int = 10
    run_ms_max: int = 20_000


# Bookies lost for good (or wiped) with Qw > Qa and with Qw == Qa. With Qw == Qa an entry whose
# write set holds a lost bookie can be re-written to Qa bookies only after the recovery replaced
# that bookie (recovery's ensemble change), so those configurations keep a spare bookie (or get
# a fresh one when a wiped bookie is replaced); e3w2a2n3-chaos has no spare and loses none.
CONFIGS: dict[str, SimConfig] = {c.name: c for c in (
    SimConfig("e3w3a2n3", bookies=3, ensemble_size=3, write_quorum=3, ack_quorum=2,
              lost_for_good_probability=0.1, metadata_unknown_probability=0.05),
    SimConfig("e3w3a2n5", bookies=5, ensemble_size=3, write_quorum=3, ack_quorum=2,
              lost_for_good_probability=0.1, wiped_probability=0.1, metadata_unknown_probability=0.05),
    SimConfig("e3w2a2n4", bookies=4, ensemble_size=3, write_quorum=2, ack_quorum=2,
              lost_for_good_probability=0.1, wiped_probability=0.1, metadata_unknown_probability=0.05),
    SimConfig("e2w2a2n3", bookies=3, ensemble_size=2, write_quorum=2, ack_quorum=2,
              lost_for_good_probability=0.15, wiped_probability=0.1, metadata_unknown_probability=0.05),
    SimConfig("e4w3a2n5", bookies=5, ensemble_size=4, write_quorum=3, ack_quorum=2,
              lost_for_good_probability=0.1, wiped_probability=0.1, metadata_unknown_probability=0.05),
    # more churn: many lost messages (ensemble changes, failed recoveries) and crashes
    SimConfig("e3w3a2n5-chaos", bookies=5, ensemble_size=3, write_quorum=3, ack_quorum=2,
              drop_probability=0.05, slow_probability=0.25, crashes_max=5, duplicate_probability=0.05,
              lost_for_good_probability=0.15, wiped_probability=0.15, metadata_unknown_probability=0.1),
    SimConfig("e3w2a2n3-chaos", bookies=3, ensemble_size=3, write_quorum=2, ack_quorum=2,
              drop_probability=0.05, slow_probability=0.25, crashes_max=5, duplicate_probability=0.05,
              metadata_unknown_probability=0.1),
    SimConfig("e3w2a2n4-chaos", bookies=4, ensemble_size=3, write_quorum=2, ack_quorum=2,
              drop_probability=0.05, slow_probability=0.25, crashes_max=5, duplicate_probability=0.05,
              lost_for_good_probability=0.15, wiped_probability=0.15, metadata_unknown_probability=0.1),
)}

# the configurations with Qw == Qa that lose bookies for good: recovery must change the ensemble
QW_EQUALS_QA_LOSSES = tuple(sorted(
    name for name, c in CONFIGS.items()
    if c.write_quorum == c.ack_quorum and (c.lost_for_good_probability > 0 or c.wiped_probability > 0)))


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
        self.lost = False                              # lost for good: never restarts
        self.wiped = False
        self.copies_before_wipe: dict[int, EntryData] = {}
        self.epoch = 0
        self.fenced = False
        self.durable: dict[int, EntryData] = {}
        self.unsynced: dict[int, EntryData] = {}
        self.waiting_acks: list[Callable[[], None]] = []
        self.sync_scheduled = False
        self.accepted: list[tuple[int, bool, bool]] = []   # (entry id, recovery, fenced then)

    def _has_ledger(self) -> bool:
        return bool(self.durable or self.unsynced) or self.fenced

    def _get(self, entry_id: int) -> EntryData | None:
        entry = self.unsynced.get(entry_id)
        return entry if entry is not None else self.durable.get(entry_id)

    def _read_answer(self, entry_id: int) -> tuple[ReadOutcome, EntryData | None]:
        entry = self._get(entry_id)
        if entry is not None:
            return ReadOutcome.FOUND, entry
        return (ReadOutcome.NO_SUCH_ENTRY if self._has_ledger() else ReadOutcome.NO_SUCH_LEDGER), None

    def handle(self, request: tuple, reply: Callable[[Any], None]) -> None:
        if not self.up:
            return                                     # no answer: the caller times out
        kind = request[0]
        if kind == "add":
            _, entry, recovery = request
            self.add((entry,), recovery, lambda outcomes: reply(outcomes[0][1]))
        elif kind == "add_run":
            _, entries, recovery = request
            self.add(entries, recovery, reply)
        elif kind == "read":
            _, entry_id, fence = request
            if fence:
                self.fenced = True                     # durable before the answer
            reply(self._read_answer(entry_id))
        elif kind == "read_range":                     # the consecutive prefix, as the real store
            _, first, last, fence = request
            if fence:
                self.fenced = True
            entries = []
            for entry_id in range(first, last + 1):
                entry = self._get(entry_id)
                if entry is None:
                    break
                entries.append(entry)
            reply((ReadOutcome.FOUND, entries) if entries else self._read_answer(first))
        elif kind == "read_lac":
            _, fence = request
            if fence:
                self.fenced = True
            stored = list(self.durable.values()) + list(self.unsynced.values())
            if stored:
                reply((LacOutcome.OK, max(e.lac for e in stored), max(e.entry_id for e in stored)))
            elif self._has_ledger():
                reply((LacOutcome.OK, -1, -1))
            else:
                reply((LacOutcome.NO_SUCH_LEDGER, -1, -1))
        else:
            raise ValueError(kind)

    def add(self, entries: tuple[EntryData, ...], recovery: bool,
            reply: Callable[[list[tuple[int, AddOutcome]]], None]) -> None:
        """One AddRequest: every entry checked at once (the fence flag cannot change within a
        request), answered once the group commit that holds them synced."""
        if self.fenced and not recovery:
            reply([(e.entry_id, AddOutcome.FENCED) for e in entries])
            return
        for entry in entries:
            existing = self._get(entry.entry_id)
            if existing is not None and (existing.payload, existing.length) != (entry.payload, entry.length):
                self.sim.violation(f"bookie {self.id}: entry {entry.entry_id} rewritten with different "
                                   f"content ({existing} -> {entry})")
            self.accepted.append((entry.entry_id, recovery, self.fenced))
            self.unsynced[entry.entry_id] = entry
        self.waiting_acks.append(lambda: reply([(e.entry_id, AddOutcome.OK) for e in entries]))
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
        for ack in acks:
            ack()

    def crash(self) -> None:
        self.up = False
        self.epoch += 1
        self.unsynced.clear()
        self.waiting_acks.clear()
        self.sync_scheduled = False

    def wipe(self) -> None:
        """The disk is replaced or formatted while the bookie is down: nothing is left, not even
        the fence flag."""
        self.wiped = True
        self.copies_before_wipe = dict(self.durable)
        self.durable.clear()
        self.fenced = False
        self.accepted.clear()

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
        # scenario choices added later draw from their own stream (the others stay as they were)
        self.mode_rng = random.Random(f"{seed}/mode")
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
        self.writer_partition_until = -1
        self.writer_partition_kind = ""
        self.takeover = self.mode_rng.random() >= config.no_takeover_probability
        self.writer = WriterClient(self)
        self.recoveries: list[RecoveryClient] = []
        self.tailers: list[TailerClient] = []
        self._bridge: AsyncBridge | None = None
        self.stats: dict[str, int] = {"rpcs": 0, "dropped": 0, "crashes": 0, "fragments": 1}

    def count(self, stat: str) -> None:
        self.stats[stat] = self.stats.get(stat, 0) + 1

    @property
    def bridge(self) -> "AsyncBridge":
        if self._bridge is None:
            self._bridge = AsyncBridge()
        return self._bridge

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
        client ("writer", "r0", "t0", ...): the flaky bookie's faults depend on it. A request
        may also be delivered twice (the second copy later; its reply is ignored)."""
        self.stats["rpcs"] += 1
        done = [False]
        if request[0] == "add":
            what: Any = (request[1].entry_id, request[2])
        elif request[0] == "add_run":
            what = ([e.entry_id for e in request[1]], request[2])
        else:
            what = request[1:]
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

        partitioned = source == "writer" and self.faults_on and self.now < self.writer_partition_until
        stalled = partitioned and self.writer_partition_kind == "stall"
        self.at(self.config.stall_rpc_timeout_ms if stalled else self.config.rpc_timeout_ms,
                finish, error_reply, "timeout")
        if self.faults_on and self.mode_rng.random() < self.config.duplicate_probability:
            self.count("duplicates")
            delay = self.mode_rng.randint(*self.config.duplicate_delay_ms)
            self.log(f"duplicate {label} in {delay}")
            self.at(delay, self.bookies[bookie_id].handle, request, send_reply)
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
        if partitioned:
            if not stalled and self.mode_rng.random() < 0.5:
                self.log(f"partition: drop request {label}")
                return
            self.log(f"partition: drop the reply of {label}")
            self.at(delay, self.bookies[bookie_id].handle, request, lambda reply: None)
            return
        self.at(delay, self.bookies[bookie_id].handle, request, send_reply)

    def metadata_cas(self, expected_version: int, metadata: LedgerMetadata,
                     on_reply: Callable[[bool, LedgerMetadata, int], None],
                     on_unknown: Callable[[], None] | None = None) -> None:
        """CAS in the store. With ``on_unknown`` the outcome may never reach the client (the
        request is lost, or the CAS committed and its reply is lost): ``on_unknown()`` is called
        after the metadata timeout instead of ``on_reply``."""
        c = self.config
        fate = "ok"
        if on_unknown is not None and self.faults_on and self.mode_rng.random() < c.metadata_unknown_probability:
            fate = self.mode_rng.choice(["request lost", "reply lost"])
            self.count("metadata_unknown")
            self.log(f"metadata cas {metadata.state.value}: {fate}")
            self.at(c.metadata_timeout_ms, on_unknown)
            if fate == "request lost":
                return

        def arrive() -> None:
            result = self.store.cas(expected_version, metadata)
            if fate == "ok":
                self.at(self.net_rng.randint(*c.metadata_delay_ms), on_reply, *result)
        self.at(self.net_rng.randint(*c.metadata_delay_ms), arrive)

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
        # losses for good: at most Qa - 1 bookies (more can lose acknowledged entries)
        mode = self.mode_rng
        losses = 0
        for kind, probability in (("lost", c.lost_for_good_probability), ("wiped", c.wiped_probability)):
            if losses < c.ack_quorum - 1 and mode.random() < probability:
                losses += 1
                # mostly a bookie of the first ensemble: the one that matters
                pool = self.store.value.current_ensemble if mode.random() < 0.8 else sorted(self.bookies)
                self.at(mode.randint(0, c.fault_phase_ms), self._lose, mode.choice(pool), kind)
        self.at(c.fault_phase_ms, self._heal)

    def _crash(self, bookie_id: str, down_ms: int) -> None:
        bookie = self.bookies[bookie_id]
        if not bookie.up or not self.faults_on:
            return
        self.stats["crashes"] += 1
        self.log(f"crash {bookie_id} for {down_ms}")
        bookie.crash()
        self.at(down_ms, self._restart, bookie_id)

    def _lose(self, bookie_id: str, kind: str) -> None:
        """``lost``: the bookie dies and never comes back. ``wiped``: it dies, its disk is wiped
        and it is started again: its cookie no longer matches, so it refuses to start (it is
        lost for good) and the operator adds a fresh bookie with a new id instead; with
        ``wiped_rejoins`` (no cookie check, UNSAFE) it rejoins empty under its old id."""
        bookie = self.bookies[bookie_id]
        if bookie.lost:
            return
        self.count(kind)
        self.log(f"{kind} {bookie_id}")
        bookie.crash()
        if kind == "lost" or not self.config.wiped_rejoins:
            bookie.lost = True
        if kind == "wiped":
            bookie.wipe()
            if self.config.wiped_rejoins:
                self.at(self.mode_rng.randint(*self.config.crash_down_ms), self._restart, bookie_id)
            else:
                fresh = f"b{len(self.bookies)}"
                self.log(f"new bookie {fresh}")
                self.bookies[fresh] = SimBookie(self, fresh)

    def _partition_writer(self, duration_ms: int, kind: str) -> None:
        self.count(f"writer_{kind}s")
        self.log(f"{kind} the writer for {duration_ms}")
        self.writer_partition_until = self.now + duration_ms
        self.writer_partition_kind = kind

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
        if self.mode_rng.random() < c.writer_partition_probability:
            start = self.mode_rng.randint(0, c.fault_phase_ms)
            self.at(start, self._partition_writer, self.mode_rng.randint(*c.writer_partition_ms),
                    self.mode_rng.choice(["cut", "stall"]))
            self.at(start + self.mode_rng.randint(0, 50), self._start_recovery)
            self.recovery_at_pause = 0
        if not self.takeover:
            self.recovery_at_pause = 0
            self.count("no_takeover")
            self.log("no takeover")
        if not self.takeover or self.mode_rng.random() < c.tailer_probability:
            for number in range(self.mode_rng.randint(1, c.tailers_max)):
                tailer = TailerClient(self, number)
                self.tailers.append(tailer)
                self.at(self.mode_rng.randint(0, c.fault_phase_ms), tailer.round)
        try:
            while self._queue:
                time, _, fn, args = heapq.heappop(self._queue)
                if time > c.run_ms_max:
                    self.violation(f"still running at {c.run_ms_max} ms (liveness)")
                    break
                self.now = time
                try:
                    fn(*args)
                except InvariantViolation as e:        # a core's own check: name the seed
                    self.violation(f"invariant check failed: {e}")
                    break
        finally:
            if self._bridge is not None:
                self._bridge.close()
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
        if not self.takeover:
            return
        client = RecoveryClient(self, len(self.recoveries))
        self.recoveries.append(client)
        client.start()

    # -- invariants ----------------------------------------------------------------------
    def check_confirms_within_close(self) -> None:
        closed = self.store.value
        if closed.is_closed and self.writer.confirmed_last > closed.last_entry_id:
            self.violation(f"acknowledged entry {self.writer.confirmed_last} beyond the closed "
                           f"ledger's last entry {closed.last_entry_id} (acknowledged entry lost)")

    def check_reported_close(self, who: str, metadata: LedgerMetadata) -> None:
        """What a client reports as the closed ledger (CloseDone, RecoveryDone) must be what
        the store holds: the ledger is closed once, and everybody agrees where it ends."""
        stored = self.store.value
        if not stored.is_closed or metadata != stored:
            self.violation(f"{who} reports the ledger closed at last={metadata.last_entry_id} "
                           f"length={metadata.length} ({metadata.state.value}) but the store holds "
                           f"{stored.state.value} last={stored.last_entry_id} length={stored.length}")

    def final_checks(self) -> None:
        md = self.store.value
        writer = self.writer
        if not self.takeover:
            # nobody recovered: tailing readers must not have disturbed the writer
            if writer.core.is_fenced or any(b.fenced for b in self.bookies.values()):
                self.violation("no takeover, yet the writer's ledger was fenced "
                               f"(writer fenced: {writer.core.is_fenced}, fenced bookies: "
                               f"{sorted(b.id for b in self.bookies.values() if b.fenced)})")
            if writer.close_done is None:
                self.violation("no takeover, yet the writer did not close its ledger")
        if not md.is_closed:
            self.violation(f"ledger not closed at the end: {md.state.value}")
            return
        self.stats["fragments"] = len(md.ensembles)
        last = md.last_entry_id
        qa = md.ack_quorum
        # (4): no normal add accepted by a fenced bookie; no acknowledged entry beyond the close
        for bookie in self.bookies.values():
            for entry_id, recovery, fenced in bookie.accepted:
                if fenced and not recovery:
                    self.violation(f"bookie {bookie.id}: normal add of entry {entry_id} accepted while fenced")
        self.check_confirms_within_close()
        # what the clients reported (checked when reported, again here)
        if writer.close_done is not None:
            self.check_reported_close("writer (CloseDone)", writer.close_done)
        for client in self.recoveries:
            if client.result is not None:
                self.check_reported_close(f"{client.name} (RecoveryDone)", client.result)
        # (1): every entry through last_entry_id (all acknowledged ones among them) is durable
        # on >= Qa bookies of its write set with the same bytes: it survives Qa - 1 losses and
        # the crash of every process (only durable state counts here; a bookie lost for good
        # counts with what it held: its loss is one of the Qa - 1)
        expected_length = 0
        for entry_id in range(last + 1):
            copies = [self.bookies[b].durable.get(entry_id)
                      or (self.bookies[b].copies_before_wipe.get(entry_id) if self.bookies[b].lost else None)
                      for b in md.write_set(entry_id)]
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
        # (those the run lost, then others drawn)
        lost = {b for b, bookie in self.bookies.items() if bookie.lost}
        others = sorted(set(self.bookies) - lost)
        lost |= set(self.fault_rng.sample(others, max(0, qa - 1 - len(lost))))
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
        # tailing readers: everything they returned is in the closed ledger, byte for byte
        for tailer in self.tailers:
            for entry_id, payload in sorted(tailer.seen.items()):
                if entry_id > last:
                    self.violation(f"{tailer.name} read entry {entry_id}, beyond the closed ledger's "
                                   f"last entry {last}")
                elif views[0][entry_id] != payload:
                    self.violation(f"{tailer.name} read entry {entry_id} with bytes the closed ledger "
                                   f"does not have")


class WriterClient:
    """The old owner: drives LedgerWriteCore as the asyncio shell (LedgerWriter) would."""

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
        self.close_done: LedgerMetadata | None = None
        self.payload_rng = random.Random(f"{sim.seed}/payloads")
        self.shell_acks = sim.mode_rng.random() < c.shell_acks_probability

    def start(self) -> None:
        self.sim.at(0, self._add_next)
        self.sim.at(self.sim.config.tick_ms, self._tick)

    def _payload(self, index: int) -> bytes:
        return f"e{index}:".encode() + self.payload_rng.randbytes(self.payload_rng.randint(0, 12))

    def _add_next(self) -> None:
        c = self.sim.config
        if len(self.payloads) >= c.entries or self.adds_refused:
            self._maybe_close()
            return
        count = 1
        if self.sim.mode_rng.random() < c.run_probability:
            count = min(self.sim.mode_rng.randint(*c.run_entries), c.entries - len(self.payloads))
        payloads = [self._payload(len(self.payloads) + i) for i in range(count)]
        try:
            first, actions = self.core.add(payloads, self.sim.now)
        except PulsarliteError as e:
            self.sim.log(f"writer add refused: {e!r}")
            self.adds_refused = True
            self.sim.on_writer_pause(last=True)
            self._maybe_close()
            return
        for offset, payload in enumerate(payloads):
            self.payloads[first + offset] = payload
        if count == 1:
            self.sim.log(f"writer add {first}")
        else:
            self.sim.count("runs")
            self.sim.log(f"writer add_run {first}..{first + count - 1}")
        self.execute(actions)
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

    def _on_add_results(self, bookie: str, results: list[tuple[int, AddOutcome]]) -> None:
        """A bookie's answers to one AddRequest (an RPC timeout: ERROR for each entry). With
        ``shell_acks`` as LedgerWriter._on_add_results feeds them (OKs coalesced through
        on_add_acks, the others one by one), else one on_add_result per answer."""
        sim = self.sim
        core = self.core
        if self.shell_acks:
            if core.state is WriteCoreState.CLOSED:
                return
            ok = [entry_id for entry_id, outcome in results if outcome is AddOutcome.OK]
            if ok and not (len(ok) == len(results) and max(ok) <= core.lac):
                self.execute(core.on_add_acks(bookie, ok))
            for entry_id, outcome in results:
                if outcome is not AddOutcome.OK:
                    self.execute(core.on_add_result(bookie, entry_id, outcome, sim.now,
                                                    sim.writable_bookies(), sim.writer_rng))
        else:
            for entry_id, outcome in results:
                self.execute(core.on_add_result(bookie, entry_id, outcome, sim.now,
                                                sim.writable_bookies(), sim.writer_rng))

    def _check_sent_lac(self, entry_id: int, lac: int) -> None:
        # the LAC an entry carries is what readers may read up to and where recovery starts:
        # it must have been confirmed, and below the entry itself
        if lac > self.confirmed_last or lac >= entry_id:
            self.sim.violation(f"writer sends entry {entry_id} with LAC {lac}, but only "
                               f"{self.confirmed_last} is confirmed")

    def execute(self, actions: list) -> None:
        sim = self.sim
        for action in actions:
            if isinstance(action, SendAdd):
                self._check_sent_lac(action.entry_id, action.lac)
                entry = EntryData(action.entry_id, action.lac, action.length, action.payload)
                sim.rpc("writer", action.bookie, ("add", entry, action.recovery),
                        lambda outcome, b=action.bookie, e=action.entry_id: self._on_add_results(
                            b, [(e, outcome)]),
                        AddOutcome.ERROR)
            elif type(action) is SendAddRun:
                first = action.first_entry_id
                entries = [EntryData(first + i, action.lac, length, payload)
                           for i, (length, payload) in enumerate(zip(action.lengths, action.payloads))]
                for entry in entries:
                    self._check_sent_lac(entry.entry_id, entry.lac)
                for bookie, offsets in action.sends:
                    share = tuple(entries) if offsets is None else tuple(entries[i] for i in offsets)
                    if any(bookie not in self.core.metadata.write_set(e.entry_id) for e in share):
                        sim.violation(f"writer sends a run's entries to {bookie}, outside their write sets")
                    sim.rpc("writer", bookie, ("add_run", share, False),
                            lambda outcomes, b=bookie: self._on_add_results(b, outcomes),
                            [(e.entry_id, AddOutcome.ERROR) for e in share])
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
                self._write_metadata(action.metadata)
            elif isinstance(action, CloseDone):
                sim.log(f"writer {action}")
                self.finished = True
                self.close_done = action.metadata
                sim.check_reported_close("writer (CloseDone)", action.metadata)
                if action.metadata.last_entry_id != self.confirmed_last:
                    sim.violation(f"writer CloseDone at last={action.metadata.last_entry_id}, but its "
                                  f"LAC is {self.confirmed_last}")
            elif isinstance(action, CloseFailed):
                sim.log(f"writer {action}")
                self.finished = True
            else:
                raise AssertionError(f"writer: unexpected action {action}")
        self._maybe_close()

    def _write_metadata(self, proposed: LedgerMetadata) -> None:
        """As LedgerWriter._write_metadata: CAS; on a conflict re-read and tell the core; when
        the outcome is unknown (ZooKeeper trouble) wait, re-read what is there and treat it as
        a conflict (it may be this very proposal)."""
        sim = self.sim
        sim.log(f"writer cas v{self.version} {proposed.state.value} {proposed.ensembles}")

        def answered(ok: bool, current: LedgerMetadata, version: int) -> None:
            self.version = version
            args = (sim.now, sim.writable_bookies(), sim.writer_rng)
            if ok:
                self.execute(self.core.on_metadata_written(proposed, *args))
            else:
                if proposed.is_closed and current.is_closed:
                    sim.count("writer_close_lost")
                    if current.last_entry_id != proposed.last_entry_id:
                        sim.count("writer_close_lost_elsewhere")
                self.execute(self.core.on_metadata_conflict(current, *args))
            self._maybe_close()

        def unknown() -> None:
            def reread(current: LedgerMetadata, version: int) -> None:
                self.version = version
                self.execute(self.core.on_metadata_conflict(current, sim.now, sim.writable_bookies(),
                                                            sim.writer_rng))
                self._maybe_close()
            sim.at(sim.mode_rng.randint(20, 200), sim.metadata_read, reread)
        sim.metadata_cas(self.version, proposed, answered, unknown)


class RecoveryClient:
    """A new owner: marks the ledger IN_RECOVERY and drives LedgerRecoveryCore; on a retriable
    failure (or a metadata write whose outcome it never learns) it re-reads the metadata and
    starts again, as LedgerClient.recover does."""

    def __init__(self, sim: Simulation, number: int) -> None:
        self.sim = sim
        self.name = f"r{number}"
        self.attempts = 0
        self.version = -1
        self.done = False
        self.result: LedgerMetadata | None = None
        self.core: LedgerRecoveryCore | None = None
        self.rng = random.Random(f"{sim.seed}/{self.name}")     # placement of ensemble changes

    def start(self) -> None:
        self.core = None
        self.attempts += 1
        self.sim.log(f"{self.name} start attempt {self.attempts}")
        self.sim.metadata_read(self._on_metadata)

    def _retry(self, why: str) -> None:
        sim = self.sim
        sim.log(f"{self.name} failed: {why}")
        self.core = None                               # its late answers are dropped
        if self.attempts >= sim.config.recovery_attempts_max:
            sim.violation(f"{self.name}: recovery gave up after {self.attempts} attempts")
        else:
            sim.at(sim.fault_rng.randint(20, 80), self.start)

    def _on_metadata(self, md: LedgerMetadata, version: int) -> None:
        self.version = version
        if md.is_closed:
            self._finish(md)
        elif md.state is LedgerState.OPEN:
            self.sim.metadata_cas(version, md.with_state(LedgerState.IN_RECOVERY), self._on_marked,
                                  lambda: self._retry("IN_RECOVERY write: outcome unknown"))
        else:
            self._run(md)

    def _on_marked(self, ok: bool, current: LedgerMetadata, version: int) -> None:
        if ok:
            self.version = version
            self._run(current)
        else:
            self._on_metadata(current, version)

    def _run(self, md: LedgerMetadata) -> None:
        c = self.sim.config
        self.core = core = LedgerRecoveryCore(
            md, fence_recovery_reads=c.fence_recovery_reads,
            ensemble_change_attempts_max=c.ensemble_change_attempts_max,
            change_ensemble=c.recovery_ensemble_change,
            recover_from_last_fragment=c.recover_from_last_fragment)
        self.execute(core, core.start())

    def _finish(self, md: LedgerMetadata) -> None:
        self.sim.log(f"{self.name} done: last={md.last_entry_id} length={md.length}")
        self.done = True
        self.result = md
        self.sim.check_reported_close(f"{self.name} (RecoveryDone)", md)

    def execute(self, core: LedgerRecoveryCore, actions: list) -> None:
        sim = self.sim
        if core is not self.core:
            return                                     # an abandoned attempt
        for action in actions:
            if isinstance(action, SendReadLac):
                sim.rpc(self.name, action.bookie, ("read_lac", action.fence),
                        lambda reply, b=action.bookie: self.execute(core, core.on_read_lac(b, reply[0], reply[1])),
                        (LacOutcome.ERROR, -1, -1))
            elif isinstance(action, SendRead):
                sim.rpc(self.name, action.bookie, ("read", action.entry_id, action.fence),
                        lambda reply, b=action.bookie, e=action.entry_id: self.execute(
                            core, core.on_read(b, e, *reply)),
                        (ReadOutcome.ERROR, None))
            elif isinstance(action, SendAdd):
                entry = EntryData(action.entry_id, action.lac, action.length, action.payload)
                sim.rpc(self.name, action.bookie, ("add", entry, action.recovery),
                        lambda outcome, b=action.bookie, e=action.entry_id: self.execute(
                            core, core.on_add_result(b, e, outcome, sim.writable_bookies(), self.rng)),
                        AddOutcome.ERROR)
            elif isinstance(action, WriteMetadata):
                proposed = action.metadata
                if proposed.is_closed:
                    what = "close"
                    sim.log(f"{self.name} cas close last={proposed.last_entry_id} len={proposed.length}")
                else:
                    what = "ensemble change"
                    sim.count("recovery_ensemble_changes")
                    sim.log(f"{self.name} cas ensemble change {core.ensemble_change} -> {proposed.ensembles}")

                def answered(ok: bool, current: LedgerMetadata, version: int, proposed=proposed) -> None:
                    if core is not self.core:
                        return
                    self.version = version
                    if ok:
                        self.execute(core, core.on_metadata_written(proposed, sim.writable_bookies(), self.rng))
                    else:
                        if current.state is LedgerState.IN_RECOVERY and current.ensembles != core.metadata.ensembles:
                            sim.count("recovery_took_over_ensembles")   # another recovery changed them
                        self.execute(core, core.on_metadata_conflict(current, sim.writable_bookies(), self.rng))
                # the recovery shell lets a ZooKeeper error end the attempt (it times out and
                # LedgerClient.recover starts another)
                sim.metadata_cas(self.version, proposed, answered,
                                 lambda what=what: core is self.core and self._retry(f"{what} write: outcome unknown"))
            elif isinstance(action, RecoveryDone):
                self.core = None
                self._finish(action.metadata)
            elif isinstance(action, RecoveryFailed):
                self._retry(repr(action.error))
            else:
                raise AssertionError(f"recovery: unexpected action {action}")


class AsyncBridge:
    """Runs coroutines of the real asyncio shell inside the simulation: a private event loop
    with no I/O and no timers, run only to drain what is ready (deterministic: FIFO). Bookie and
    metadata calls become futures that simulated replies resolve."""

    def __init__(self) -> None:
        self.loop = asyncio.SelectorEventLoop()
        self.tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Any, on_done: Callable[[asyncio.Task], None]) -> None:
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        task.add_done_callback(on_done)
        self.drain()

    def future(self) -> asyncio.Future:
        return self.loop.create_future()

    def resolve(self, future: asyncio.Future, value: Any) -> None:
        if not future.done():
            future.set_result(value)
        self.drain()

    def drain(self) -> None:
        loop = self.loop
        while loop._ready:                 # private, but the only way to know "nothing to do"
            loop.stop()                    # stop first: run_forever runs one iteration
            loop.run_forever()

    def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        self.drain()
        self.loop.close()


class SimBookieClient:
    """What the read side of the shell calls on a bookie (BookieClient.read / read_lac), over
    the simulated network. A non-recovery client must never send the fence flag."""

    def __init__(self, tailer: "TailerClient", bookie_id: str) -> None:
        self.tailer = tailer
        self.bookie_id = bookie_id

    async def _call(self, request: tuple, error_reply: Any) -> Any:
        sim = self.tailer.sim
        if request[-1]:                                # the fence flag
            sim.violation(f"{self.tailer.name}: a non-recovery open/read sent the fence flag "
                          f"({request[0]} to {self.bookie_id})")
        future = sim.bridge.future()
        sim.rpc(self.tailer.name, self.bookie_id, request,
                lambda reply: sim.bridge.resolve(future, reply), error_reply)
        return await future

    async def read_lac(self, ledger_id: int, *, fence: bool = False) -> pb.ReadLacResponse:
        outcome, lac, last = await self._call(("read_lac", fence), (LacOutcome.ERROR, -1, -1))
        if outcome is LacOutcome.ERROR:
            raise BookieUnavailableError(f"bookie {self.bookie_id}: no answer")
        code = pb.OK if outcome is LacOutcome.OK else pb.NO_SUCH_LEDGER
        return pb.ReadLacResponse(code=code, lac=lac, last_entry_id=last)

    async def read(self, ledger_id: int, first_entry_id: int, last_entry_id: int, *,
                   fence: bool = False, max_bytes: int = 0) -> pb.ReadResponse:
        outcome, entries = await self._call(("read_range", first_entry_id, last_entry_id, fence),
                                            (ReadOutcome.ERROR, None))
        if outcome is ReadOutcome.ERROR:
            raise BookieUnavailableError(f"bookie {self.bookie_id}: no answer")
        if outcome is not ReadOutcome.FOUND:
            code = pb.NO_SUCH_ENTRY if outcome is ReadOutcome.NO_SUCH_ENTRY else pb.NO_SUCH_LEDGER
            return pb.ReadResponse(code=code, lac=-1)
        return pb.ReadResponse(code=pb.OK, lac=-1, entries=[
            pb.Entry(ledger_id=ledger_id, entry_id=e.entry_id, lac=e.lac, length=e.length, payload=e.payload,
                     checksum=entry_checksum(ledger_id, e.entry_id, e.lac, e.length, e.payload))
            for e in entries])


class SimBookiePool:
    def __init__(self, tailer: "TailerClient") -> None:
        self.tailer = tailer

    def get(self, bookie_id: str) -> SimBookieClient:
        return SimBookieClient(self.tailer, bookie_id)


class SimLedgerManager:
    """LedgerManager.read over the simulated metadata store."""

    def __init__(self, tailer: "TailerClient") -> None:
        self.tailer = tailer

    async def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        sim = self.tailer.sim
        future = sim.bridge.future()
        sim.metadata_read(lambda md, version: sim.bridge.resolve(future, (md, version)))
        return await future


class TailerClient:
    """A reader that does not own the ledger (a Spark scan, a tailing subscription, the
    offloader): the real LedgerClient.open_ledger(recovery=False) and LedgerReader, reading the
    ledger while it is written, in rounds: (re)open, or refresh the LAC of the open reader;
    read what became readable. Everything it returns is checked when returned (never beyond the
    writer's LAC, unless its metadata says CLOSED: then never beyond the last entry) and at the
    end (in the closed ledger, byte for byte)."""

    def __init__(self, sim: Simulation, number: int) -> None:
        self.sim = sim
        self.name = f"t{number}"
        config = LedgerClientConfig(read_entries_per_request_max=sim.mode_rng.randint(1, 4))
        self.client = LedgerClient(None, config, owns_store=False)
        self.client.pool = SimBookiePool(self)
        self.client.ledger_manager = SimLedgerManager(self)
        self.reader: LedgerReader | None = None
        self.rounds = sim.mode_rng.randint(*sim.config.tailer_rounds)
        self.next_entry = 0
        self.seen: dict[int, bytes] = {}

    def round(self) -> None:
        self.rounds -= 1
        reopen = self.reader is None or self.sim.mode_rng.random() < 0.5
        self.sim.bridge.spawn(self._read_round(reopen), self._round_done)

    async def _read_round(self, reopen: bool) -> None:
        sim = self.sim
        if reopen:
            self.reader = await self.client.open_ledger(LEDGER_ID, recovery=False)
        else:
            await self.reader.refresh_lac()
        reader = self.reader
        if reader.metadata.is_closed:
            sim.check_reported_close(f"{self.name} (open)", reader.metadata)
        last = reader.last_readable_entry_id
        sim.log(f"{self.name} {'open' if reopen else 'refresh'}: {reader.metadata.state.value} "
                f"readable through {last}")
        if last < self.next_entry:
            return
        async for entry in reader.iter_entries(self.next_entry, last):
            self._check(reader, entry.entry_id, entry.payload)
            self.next_entry = entry.entry_id + 1

    def _check(self, reader: LedgerReader, entry_id: int, payload: bytes) -> None:
        sim = self.sim
        md = reader.metadata
        bound = md.last_entry_id if md.is_closed else sim.writer.confirmed_last
        sim.count("tailer_entries")
        if entry_id > bound:
            sim.violation(f"{self.name} read entry {entry_id} beyond "
                          + (f"the closed ledger's last entry {bound}" if md.is_closed
                             else f"the writer's LAC {bound}"))
        if sim.writer.payloads.get(entry_id) != payload:
            sim.violation(f"{self.name} read entry {entry_id} with bytes the writer did not write")
        self.seen[entry_id] = payload

    def _round_done(self, task: asyncio.Task) -> None:
        sim = self.sim
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            if not isinstance(error, PulsarliteError):     # a bug in the shell, not a fault
                sim.violation(f"{self.name}: {error!r}")
            else:
                sim.log(f"{self.name} round failed: {error!r}")
        if self.rounds > 0:
            sim.at(sim.mode_rng.randint(*sim.config.tailer_interval_ms), self.round)


# -- entry points -------------------------------------------------------------------------------

def run_seed(seed: int, config: SimConfig | str = "e3w3a2n3", *,
             fence_recovery_reads: bool | None = None, **overrides: Any) -> SimResult:
    """Run one seed; deterministic. Returns the result (violations listed, not raised).
    ``overrides``: SimConfig fields to change (e.g. ``tailer_probability=1.0``)."""
    if isinstance(config, str):
        config = CONFIGS[config]
    if fence_recovery_reads is not None:
        overrides["fence_recovery_reads"] = fence_recovery_reads
    if overrides:
        config = replace(config, **overrides)
    return Simulation(seed, config).run()


def replay_command(seed: int, config: SimConfig) -> str:
    base = CONFIGS.get(config.name)
    flags = "" if config.fence_recovery_reads else " --no-fence-reads"
    if base is not None:
        for name in SimConfig.__dataclass_fields__:
            value = getattr(config, name)
            if name != "fence_recovery_reads" and value != getattr(base, name):
                flags += f" --set {shlex.quote(f'{name}={value!r}')}"
    return f"python -m tests.sim.simulator --seed {seed} --config {config.name}{flags} --trace"


def check_seed(seed: int, config: SimConfig | str = "e3w3a2n3", **kwargs: Any) -> SimResult:
    """run_seed, raising SimulationViolation (naming the seed and how to replay it) on a violation."""
    result = run_seed(seed, config, **kwargs)
    if result.violations:
        c = result.config
        raise SimulationViolation(
            f"seed {seed} config {c.name}: {len(result.violations)} violation(s); replay with "
            f"`{replay_command(seed, c)}`:\n  "
            + "\n  ".join(result.violations[:10]))
    return result


SWEEP_CONFIGS = tuple(sorted(CONFIGS))


def sweep_seed(seed: int, config: str) -> tuple[list[str], dict[str, int], str]:
    """One unit of the suite's sweep (tests/sim/background_sweep.py): violations, counters and
    the replay command of one seed of one configuration."""
    result = run_seed(seed, config)
    return result.violations, result.stats, replay_command(seed, result.config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--seeds", type=int, default=1, help="run seeds seed .. seed+N-1")
    parser.add_argument("--config", default="e3w3a2n3", choices=sorted(CONFIGS))
    parser.add_argument("--no-fence-reads", action="store_true", help="switch off defect fix 1")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change a SimConfig field (a Python literal), e.g. tailer_probability=1.0")
    parser.add_argument("--trace", action="store_true", help="print the event trace")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in SimConfig.__dataclass_fields__:
            parser.error(f"no SimConfig field {name!r}")
        overrides[name] = ast.literal_eval(value)
    failures = 0
    for seed in range(args.seed, args.seed + args.seeds):
        result = run_seed(seed, args.config, fence_recovery_reads=not args.no_fence_reads, **overrides)
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
