"""Seeded, deterministic discrete-event simulation of autorecovery: the auditor core
(``AuditorCore``, ``plan_replica_check``) and 1-3 replication workers running the real worker
cores (``LedgerRepair`` -> ``plan_repairs`` / ``apply_repair``, ``FragmentCopy``), over
in-memory bookies, a simulated network and a versioned metadata store with sessions.

One scenario per seed:

- N bookies (each with a rack) hold several CLOSED ledgers of 1..F fragments; some ledgers
  closed after a delayed ensemble change (``under_replicated_bookies``: that bookie lacks the
  last fragment's entries). Every entry is stored on its write set with its CRC32C.
- Faults during the fault phase: bookies lost for good (down forever, their data gone), bookies
  down for less than the lost-bookie delay (back before the auditor may mark them), a bookie
  down for longer than the delay and then back with its data (a session that outlasted the
  delay: marked lost, then taken out of its marks by the auditor), a
  decommission (the bookie stays up and read-only), rot (a stored copy whose bytes no longer
  match its checksum), worker crashes (preferably mid-copy: the crashed worker's callbacks are
  dropped; its ZooKeeper session, and so its ephemeral locks, end ``session_timeout_ms``
  later; it restarts with a new session), slow and dropped bookie reads and writes (a lost
  request or reply surfaces as a failure at the RPC timeout; a write may land although its
  answer was lost), short range answers.
- The fault budget follows invariant 1: a loss or rot is injected only if every entry keeps at
  most ``Qa - 1`` bad copies (lost, lacking, or rotten) among the bookies its metadata names;
  and at least E + 1 bookies stay writable, so a replacement is always available.
- The auditor is a single elected instance (election itself is not simulated): it scans the
  store (ledgers, marks, decommissioning) every ``audit_interval_ms`` and when registrations
  change, ticks at the core's deadlines, merges marks by compare-and-set, and runs the
  replica check every ``replica_check_interval_ms`` (probing every entry: a bookie answering
  "no such entry" or a copy failing its checksum gets the ledger marked for it).
- Workers poll the marks; each runs ``LedgerRepair`` (lock, mark, plan, copy, CAS, unmark) with
  every action executed through the simulated store and network, as the asyncio shell
  (bookie/autorecovery/worker.py) does.

Checks, at every metadata change: a ledger's new metadata names no bookie, for an entry it was
not named for before, that lacks that entry's right bytes (invariant 10); its ensembles hold
distinct bookies; it is written by the holder of the ledger's lock. At every copy start: no
other worker is copying that ledger (two workers never repair one ledger at once). At every
mark deletion by a worker: the metadata names none of the deleted mark's bookies; a bookie the
auditor takes out of a mark (back after it was declared lost) is not one lost for good. At the end (after a
quiet phase with no faults): no mark and no lock remains, no ledger names a lost or
decommissioned bookie or keeps ``under_replicated_bookies``, and every entry is held with the
right bytes by each of the Qw distinct bookies its metadata names (so it survives any Qa - 1
further losses).

Replay: ``python -m tests.sim.autorecovery_sim --seed N [--config NAME] [--trace]``.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import random
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from bookie.autorecovery.auditor_core import AuditorCore, BookieLost, MarkLedger, UnmarkBookies, plan_replica_check
from bookie.autorecovery.layout import UnderReplicatedMark, lock_path, mark_path, merge_mark
from bookie.autorecovery.replication_core import (CopyDone, CopyFailed, CopyFragment, FragmentBlocked,
                                                  FragmentCopy, FragmentRecorded, LedgerRepair,
                                                  ReadEntry, ReadLedger, ReadMark, ReadRange,
                                                  ReleaseLock, RepairFinished, ReplicaRejected,
                                                  StoredEntry, TakeLock, Unmark, WriteEntry,
                                                  WriteLedger, next_retry_delay_ms, still_missing)
from bookie.client.metadata import LedgerMetadata, LedgerState
from pulsarlite.checksum import entry_checksum


@dataclass(frozen=True)
class AutorecoveryConfig:
    name: str
    bookies: int = 7
    racks: int = 3
    ensemble_size: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    ledgers: int = 6
    fragments: tuple[int, int] = (1, 3)
    fragment_entries: tuple[int, int] = (0, 9)
    urb_probability: float = 0.3
    workers: tuple[int, int] = (1, 3)
    # faults
    fault_phase_ms: int = 15_000
    losses: tuple[int, int] = (0, 3)
    transient_downs: tuple[int, int] = (0, 3)
    long_downs: tuple[int, int] = (0, 1)    # down past the delay, then back with its data
    auditor_restarts: tuple[int, int] = (0, 2)    # a new auditor (an election): what it knows is the store
    decommission_probability: float = 0.3
    rots: tuple[int, int] = (0, 3)
    worker_crashes: tuple[int, int] = (0, 3)
    # a worker stalls (GC pause, a partition from ZooKeeper); past the session timeout its
    # session expires and its locks go while it still holds its repairs in memory
    worker_pauses: tuple[int, int] = (0, 2)
    # the worker shell's reaction when it learns its session expired: abandon every repair
    # (False: carry on with a new session, the defect this switch plants)
    abandon_on_session_loss: bool = True
    # network
    delay_ms: tuple[int, int] = (1, 10)
    slow_probability: float = 0.05
    slow_delay_ms: tuple[int, int] = (50, 400)
    drop_probability: float = 0.03
    short_answer_probability: float = 0.2
    rpc_timeout_ms: int = 300
    metadata_delay_ms: tuple[int, int] = (1, 8)
    # autorecovery settings
    lost_bookie_recovery_delay_ms: int = 1_000
    audit_interval_ms: int = 1_000
    replica_check_interval_ms: int = 2_000
    session_timeout_ms: int = 1_500
    poll_interval_ms: int = 200
    retry_delay_ms_max: int = 1_600
    ledgers_concurrent_max: int = 2
    entries_in_flight_max: int = 3
    read_run_entries_max: int = 4
    # the run
    quiet_ms_max: int = 90_000


CONFIGS: dict[str, AutorecoveryConfig] = {c.name: c for c in (
    AutorecoveryConfig("e3w2a2n7"),
    AutorecoveryConfig("e3w3a2n7", write_quorum=3),
    AutorecoveryConfig("e4w3a3n8", bookies=8, ensemble_size=4, write_quorum=3, ack_quorum=3, losses=(1, 4)),
    AutorecoveryConfig("e2w2a2n5", bookies=5, ensemble_size=2, racks=2, losses=(1, 2)),
)}


class SimulationViolation(AssertionError):
    """An invariant broke in a simulated run; the message names the seed to replay."""


@dataclass
class SimResult:
    seed: int
    config: AutorecoveryConfig
    violations: list[str]
    trace: list[str]
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def trace_digest(self) -> str:
        return hashlib.sha256("\n".join(self.trace).encode()).hexdigest()


# -- the world ---------------------------------------------------------------------------------

@dataclass
class Node:
    value: Any
    version: int
    session: int | None = None        # an ephemeral node's owner


class Store:
    """A versioned store (ZooKeeper's semantics for what autorecovery uses): create (fails if
    present), CAS set and delete at a version (-1: any), ephemeral nodes removed when their
    session ends."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}

    def get(self, path: str) -> Node | None:
        return self.nodes.get(path)

    def create(self, path: str, value: Any, session: int | None = None) -> bool:
        if path in self.nodes:
            return False
        self.nodes[path] = Node(value, 0, session)
        return True

    def set(self, path: str, value: Any, version: int) -> bool:
        node = self.nodes.get(path)
        if node is None or (version != -1 and node.version != version):
            return False
        self.nodes[path] = Node(value, node.version + 1, node.session)
        return True

    def delete(self, path: str, version: int) -> str:
        """'deleted' | 'missing' | 'conflict'."""
        node = self.nodes.get(path)
        if node is None:
            return "missing"
        if version != -1 and node.version != version:
            return "conflict"
        del self.nodes[path]
        return "deleted"

    def end_session(self, session: int) -> list[str]:
        gone = sorted(p for p, n in self.nodes.items() if n.session == session)
        for p in gone:
            del self.nodes[p]
        return gone

    def under(self, prefix: str) -> list[str]:
        return sorted(p for p in self.nodes if p.startswith(prefix))


def ledger_node(lid: int) -> str:
    return f"/ledgers/L{lid:04d}"


@dataclass
class SimBookie:
    bookie_id: str
    rack: str
    up: bool = True
    lost: bool = False                       # lost for good: down forever, data gone
    decommissioning: bool = False
    entries: dict[tuple[int, int], StoredEntry] = field(default_factory=dict)
    held_when_lost: dict[tuple[int, int], StoredEntry] = field(default_factory=dict)


class Simulation:
    def __init__(self, seed: int, config: AutorecoveryConfig) -> None:
        self.seed = seed
        self.config = config
        c = config
        self.rng = random.Random(seed)                 # the scenario
        self.net_rng = random.Random(seed * 7919 + 1)  # network delays and drops
        self.core_rng = random.Random(seed * 104729 + 2)   # what the cores are given
        self.now_ms = 0
        self._events: list = []
        self._seq = 0
        self.trace: list[str] = []
        self.violations: list[str] = []
        self.stats: dict[str, int] = {}
        self.store = Store()
        self.bookies = {f"b{i}": SimBookie(f"b{i}", f"rack{i % c.racks}") for i in range(c.bookies)}
        self.long_down_bookies: set[str] = set()
        self.originals: dict[tuple[int, int], StoredEntry] = {}   # the acknowledged entries
        self.copying: dict[int, str] = {}                          # ledger -> worker copying it
        self._sessions = 0
        self.workers: list[SimWorker] = []
        self.auditor = SimAuditor(self)
        self.settled_at_ms: int | None = None

    # -- plumbing --
    def log(self, what: str) -> None:
        self.trace.append(f"{self.now_ms:7d} {what}")

    def count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n

    def violation(self, what: str) -> None:
        self.log(f"VIOLATION {what}")
        self.violations.append(f"t={self.now_ms} {what}")

    def at(self, delay_ms: int, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (self.now_ms + max(0, int(delay_ms)), self._seq, fn))

    def new_session(self) -> int:
        self._sessions += 1
        return self._sessions

    def net_delay(self) -> int:
        c = self.config
        if self.net_rng.random() < c.slow_probability:
            return self.net_rng.randint(*c.slow_delay_ms)
        return self.net_rng.randint(*c.delay_ms)

    def _deliver(self, alive: Callable[[], bool], fn: Callable[[], None]) -> None:
        """Run a reply's handler: dropped if its caller died; held while the caller is paused."""
        if not alive():
            return
        hold = alive.hold_ms() if hasattr(alive, "hold_ms") else 0
        if hold > 0:
            self.at(hold, lambda: self._deliver(alive, fn))
            return
        fn()

    def metadata_op(self, alive: Callable[[], bool], op: Callable[[], Any], reply: Callable[[Any], None]) -> None:
        """A ZooKeeper request: delayed both ways, applied atomically on arrival (also when its
        sender died meanwhile: it was in flight), never lost (the client library retries); the
        reply is dropped if the caller died meanwhile, held while it is paused."""
        c = self.config

        def arrive() -> None:
            result = op()
            self.at(self.net_rng.randint(*c.metadata_delay_ms), lambda: self._deliver(alive, lambda: reply(result)))
        self.at(self.net_rng.randint(*c.metadata_delay_ms), arrive)

    def bookie_rpc(self, alive: Callable[[], bool], bookie_id: str, op: Callable[[SimBookie], Any],
                   reply: Callable[[Any, bool], None]) -> None:
        """A bookie request: delayed, maybe dropped (either way); a down bookie does not answer.
        ``reply(result, answered)``: answered False at the RPC timeout."""
        c = self.config
        state = {"done": False}

        def deliver(result: Any, answered: bool) -> None:
            if state["done"]:
                return
            state["done"] = True
            self._deliver(alive, lambda: reply(result, answered))

        def arrive() -> None:
            b = self.bookies[bookie_id]
            if not b.up or self.net_rng.random() < c.drop_probability:
                return
            result = op(b)
            if self.net_rng.random() < c.drop_probability:
                return
            self.at(self.net_delay(), lambda: deliver(result, True))
        self.at(self.net_delay(), arrive)
        self.at(c.rpc_timeout_ms, lambda: deliver(None, False))

    # -- views --
    def ledgers(self) -> list[LedgerMetadata]:
        return [self.store.get(p).value for p in self.store.under("/ledgers/L")]

    def writable(self) -> list[str]:
        return sorted(b for b, s in self.bookies.items() if s.up and not s.decommissioning)

    def readonly(self) -> list[str]:
        return sorted(b for b, s in self.bookies.items() if s.up and s.decommissioning)

    def racks(self) -> dict[str, str]:
        return {b: s.rack for b, s in sorted(self.bookies.items())}

    def holds(self, bookie_id: str, lid: int, e: int) -> bool:
        b = self.bookies[bookie_id]
        got = b.entries.get((lid, e))
        return not b.lost and got is not None and got == self.originals[(lid, e)]

    def bad_copies(self, md: LedgerMetadata, e: int) -> int:
        return sum(1 for b in md.write_set(e) if not self.holds(b, md.ledger_id, e))

    def entries_of(self, md: LedgerMetadata) -> range:
        return range(0, md.last_entry_id + 1)

    # -- setup --
    def setup(self) -> None:
        c, rng = self.config, self.rng
        names = sorted(self.bookies)
        for lid in range(1, c.ledgers + 1):
            fragments = []
            first = 0
            nfrag = rng.randint(*c.fragments)
            for k in range(nfrag):
                fragments.append((first, tuple(rng.sample(names, c.ensemble_size))))
                n = rng.randint(*c.fragment_entries)
                if k < nfrag - 1 or k == 0:
                    n = max(n, 1)          # only the last fragment may be empty
                first += n
            last = first - 1
            urb: tuple[str, ...] = ()
            if rng.random() < c.urb_probability:
                urb = (rng.choice(fragments[-1][1]),)
            length = 0
            md = LedgerMetadata(lid, c.ensemble_size, c.write_quorum, c.ack_quorum, tuple(fragments),
                                LedgerState.CLOSED, last, 0, under_replicated_bookies=urb)
            for e in range(last + 1):
                payload = rng.randbytes(rng.randint(1, 40))
                length += len(payload)
                entry = StoredEntry(lid, e, e - 1, length, payload,
                                    entry_checksum(lid, e, e - 1, length, payload))
                self.originals[(lid, e)] = entry
                last_fragment = e >= fragments[-1][0]
                for b in md.write_set(e):
                    if not (last_fragment and b in urb):
                        self.bookies[b].entries[(lid, e)] = entry
            md = replace(md, length=length)
            self.store.create(ledger_node(lid), md)
            self.log(f"ledger {lid} fragments={[(f, list(bs)) for f, bs in fragments]} last={last} urb={list(urb)}")
        for i in range(rng.randint(*c.workers)):
            self.workers.append(SimWorker(self, f"w{i}"))

    def schedule_faults(self) -> None:
        c, rng = self.config, self.rng
        span = c.fault_phase_ms
        for _ in range(rng.randint(*c.losses)):
            self.at(rng.randint(0, span), self.lose_bookie)
        for _ in range(rng.randint(*c.transient_downs)):
            self.at(rng.randint(0, span), self.transient_down)
        for _ in range(rng.randint(*c.long_downs)):
            self.at(rng.randint(0, span), self.long_down)
        for _ in range(rng.randint(*c.auditor_restarts)):
            self.at(rng.randint(0, span), self.restart_auditor)
        if rng.random() < c.decommission_probability:
            self.at(rng.randint(0, span), self.decommission)
        for _ in range(rng.randint(*c.rots)):
            self.at(rng.randint(0, span), self.rot)
        for _ in range(rng.randint(*c.worker_crashes)):
            self.at(rng.randint(0, span), self.crash_worker)
        for _ in range(rng.randint(*c.worker_pauses)):
            self.at(rng.randint(0, span), self.pause_worker)

    # -- faults --
    def clean_writable(self) -> list[str]:
        """Writable bookies holding no rotten copy: a rotten copy refuses the good one (the
        first write wins), so such a bookie cannot take that entry as a replacement."""
        return [b for b in self.writable()
                if all(v == self.originals[k] for k, v in self.bookies[b].entries.items())]

    def _replacements_stay(self, without: str) -> bool:
        """A replacement stays available: E + 1 clean writable bookies without ``without``."""
        return len([b for b in self.clean_writable() if b != without]) >= self.config.ensemble_size + 1

    def _loss_allowed(self, bookie_id: str) -> bool:
        if not self._replacements_stay(bookie_id):
            return False
        for md in self.ledgers():
            for e in self.entries_of(md):
                ws = md.write_set(e)
                if bookie_id in ws and self.holds(bookie_id, md.ledger_id, e) \
                        and self.bad_copies(md, e) + 1 > self.config.ack_quorum - 1:
                    return False
        return True

    def lose_bookie(self) -> None:
        if self.long_down_bookies:
            self.log("loss skipped: a bookie is down past the delay")   # the budget counts it as lost
            return
        candidates = [b for b in sorted(self.bookies) if not self.bookies[b].lost and self._loss_allowed(b)]
        if not candidates:
            self.log("loss skipped: over the fault budget")
            return
        b = self.rng.choice(candidates)
        s = self.bookies[b]
        s.up, s.lost = False, True
        s.held_when_lost, s.entries = s.entries, {}
        self.count("losses")
        self.log(f"bookie {b} lost for good")
        self.auditor.registrations_changed()

    def transient_down(self) -> None:
        candidates = [b for b in sorted(self.bookies) if self.bookies[b].up]
        b = self.rng.choice(candidates)
        down_ms = self.rng.randint(100, int(self.config.lost_bookie_recovery_delay_ms * 0.6))
        self.bookies[b].up = False
        self.count("transient_downs")
        self.log(f"bookie {b} down for {down_ms} ms")
        self.auditor.registrations_changed()

        def back() -> None:
            if not self.bookies[b].lost:
                self.bookies[b].up = True
                self.log(f"bookie {b} back")
                self.auditor.registrations_changed()
        self.at(down_ms, back)

    def long_down(self) -> None:
        """Down for longer than the lost-bookie delay, then back with its data (a ZooKeeper
        session that outlasted the delay): the auditor marks it lost; once it is back it is
        taken out of those marks. Counted as a loss for the fault budget while it is down."""
        candidates = [b for b in sorted(self.bookies) if self.bookies[b].up and not self.bookies[b].decommissioning
                      and self._loss_allowed(b)]
        if self.long_down_bookies or not candidates:
            self.log("long down skipped: over the fault budget")
            return
        b = self.rng.choice(candidates)
        delay = self.config.lost_bookie_recovery_delay_ms
        down_ms = self.rng.randint(int(delay * 1.3), delay * 4)
        self.bookies[b].up = False
        self.long_down_bookies.add(b)
        self.count("long_downs")
        self.log(f"bookie {b} down for {down_ms} ms (past the delay)")
        self.auditor.registrations_changed()

        def back() -> None:
            self.long_down_bookies.discard(b)
            self.bookies[b].up = True
            self.log(f"bookie {b} back with its data")
            self.auditor.registrations_changed()
        self.at(down_ms, back)

    def restart_auditor(self) -> None:
        """Another auditor is elected: a fresh core, which knows only what a scan reads."""
        self.auditor.core = AuditorCore(self.config.lost_bookie_recovery_delay_ms)
        self.count("auditor_restarts")
        self.log("auditor restarted (an election)")
        self.auditor.registrations_changed()
        self.auditor.scan(reschedule=False)

    def decommission(self) -> None:
        candidates = [b for b in self.writable() if self._replacements_stay(b)]
        if not candidates:
            return
        b = self.rng.choice(candidates)
        self.bookies[b].decommissioning = True
        self.count("decommissions")
        self.log(f"bookie {b} decommissioning (read-only)")
        self.auditor.registrations_changed()

    def rot(self) -> None:
        choices = []
        for md in self.ledgers():
            for e in self.entries_of(md):
                if self.bad_copies(md, e) + 1 > self.config.ack_quorum - 1:
                    continue
                choices += [(md.ledger_id, e, b) for b in md.write_set(e)
                            if self.holds(b, md.ledger_id, e) and self._replacements_stay(b)]
        if not choices:
            self.log("rot skipped: over the fault budget")
            return
        lid, e, b = self.rng.choice(choices)
        good = self.bookies[b].entries[(lid, e)]
        self.bookies[b].entries[(lid, e)] = replace(good, payload=bytes([good.payload[0] ^ 0xFF]) + good.payload[1:])
        self.count("rots")
        self.log(f"copy rotted ledger={lid} entry={e} bookie={b}")

    def crash_worker(self) -> None:
        alive = [w for w in self.workers if w.alive]
        if not alive:
            return
        copying = [w for w in alive if w.name in self.copying.values()]
        w = self.rng.choice(copying or alive)
        if copying:
            self.count("crashes_mid_copy")
        w.crash()

    def pause_worker(self) -> None:
        ready = [w for w in self.workers if w.alive and w.paused_until <= self.now_ms]
        if not ready:
            return
        copying = [w for w in ready if w.name in self.copying.values()]
        w = self.rng.choice(copying or ready)
        st = self.config.session_timeout_ms
        w.pause(self.rng.randint(st // 3, 3 * st))

    # -- checks --
    def check_metadata_change(self, old: LedgerMetadata, new: LedgerMetadata, writer: str) -> None:
        for _, bookies in new.ensembles:
            if len(set(bookies)) != len(bookies):
                self.violation(f"ledger {new.ledger_id}: ensemble {bookies} repeats a bookie")
        for e in self.entries_of(new):
            before = set(old.write_set(e)) if e <= old.last_entry_id else set()
            for b in new.write_set(e):
                # a replacement lost for good after it acknowledged the copy is a later loss
                # (the auditor handles it), not a repair naming a bookie that lacked the entry
                had = self.bookies[b].held_when_lost.get((new.ledger_id, e)) == self.originals[(new.ledger_id, e)]
                if b not in before and not self.holds(b, new.ledger_id, e) and not had:
                    self.violation(f"ledger {new.ledger_id} entry {e}: metadata written by {writer} "
                                   f"names {b}, which lacks it (invariant 10)")

    def check_lock(self, lid: int, worker: "SimWorker", session: int, what: str) -> None:
        node = self.store.get(lock_path(lid))
        if node is None or node.session != session:
            self.violation(f"ledger {lid}: {worker.name} {what} without holding the ledger's lock")

    def settled(self) -> bool:
        if self.store.under("/ledgers/underreplication/"):
            return False
        if any(w.busy for w in self.workers):
            return False
        gone = {b for b, s in self.bookies.items() if s.lost or s.decommissioning}
        if any(md.all_bookies() & gone or md.under_replicated_bookies for md in self.ledgers()):
            return False
        # (omniscient, to end the run only: a rotten copy the replica check has not met yet)
        return all(self.bad_copies(md, e) == 0 for md in self.ledgers() for e in self.entries_of(md))

    def final_checks(self) -> None:
        left = self.store.under("/ledgers/underreplication/")
        if left:
            self.violation(f"after quiescence the under-replication state is not empty: {left}")
        gone = {b for b, s in self.bookies.items() if s.lost or s.decommissioning}
        for md in self.ledgers():
            named = sorted(md.all_bookies() & gone)
            if named:
                self.violation(f"ledger {md.ledger_id} still names lost/decommissioned {named}")
            if md.under_replicated_bookies:
                self.violation(f"ledger {md.ledger_id} keeps under_replicated_bookies {md.under_replicated_bookies}")
            for e in self.entries_of(md):
                ws = md.write_set(e)
                good = {b for b in ws if self.holds(b, md.ledger_id, e)}
                if len(good) < md.write_quorum:
                    self.violation(f"ledger {md.ledger_id} entry {e}: {len(good)} good copies on "
                                   f"{list(ws)} (want Qw={md.write_quorum}: Qa - 1 further losses)")
                if not good:
                    self.violation(f"ledger {md.ledger_id} entry {e}: acknowledged entry lost")

    # -- run --
    def run(self) -> SimResult:
        c = self.config
        self.setup()
        self.schedule_faults()
        self.auditor.start()
        for w in self.workers:
            w.start()
        end_ms = c.fault_phase_ms + c.quiet_ms_max

        def watch() -> None:
            if self.now_ms > c.fault_phase_ms and self.settled():
                if self.settled_at_ms is None:
                    self.settled_at_ms = self.now_ms
            else:
                self.settled_at_ms = None
            self.at(500, watch)
        self.at(500, watch)
        while self._events:
            t, _, fn = heapq.heappop(self._events)
            if t > end_ms:
                break
            self.now_ms = t
            fn()
            # settled for longer than a session timeout and an audit: done
            if self.settled_at_ms is not None and self.now_ms - self.settled_at_ms > 3 * c.audit_interval_ms:
                break
        self.stats["end_ms"] = self.now_ms
        self.final_checks()
        return SimResult(self.seed, c, self.violations, self.trace, dict(sorted(self.stats.items())))


# -- the auditor (shell over AuditorCore) ------------------------------------------------------

class SimAuditor:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        c = sim.config
        self.core = AuditorCore(c.lost_bookie_recovery_delay_ms)
        self._tick_at: int | None = None

    def alive(self) -> bool:
        return True

    def start(self) -> None:
        self.registrations_changed()
        self.scan()
        self.sim.at(self.sim.config.replica_check_interval_ms, self.replica_check)

    def registrations_changed(self) -> None:
        sim = self.sim

        def seen() -> None:     # the watch fires a little later
            self.execute(self.core.on_bookies(sim.writable(), sim.readonly(), sim.now_ms))
            self.scan(reschedule=False)
        sim.at(sim.net_rng.randint(*sim.config.metadata_delay_ms), seen)

    def scan(self, reschedule: bool = True) -> None:
        sim = self.sim
        marks, lost_marks = {}, {}
        for p in sim.store.under("/ledgers/underreplication/ledgers/"):
            m = UnderReplicatedMark.from_json(sim.store.get(p).value)
            marks[m.ledger_id] = m.missing_bookies
            if m.lost_bookies:
                lost_marks[m.ledger_id] = m.lost_bookies
        decommissioning = [b for b, s in sorted(sim.bookies.items()) if s.decommissioning]
        self.execute(self.core.on_scan(sim.ledgers(), marks, decommissioning, sim.now_ms, lost_marks))
        if reschedule:
            sim.at(sim.config.audit_interval_ms, self.scan)

    def tick(self) -> None:
        self._tick_at = None
        self.execute(self.core.on_tick(self.sim.now_ms))

    def execute(self, actions: list) -> None:
        sim = self.sim
        for a in actions:
            if isinstance(a, BookieLost):
                sim.log(f"auditor: bookie {a.bookie_id} {a.reason} ledgers={a.ledgers}")
            elif isinstance(a, MarkLedger):
                self.mark(a.ledger_id, a.missing_bookies, a.lost_bookies)
            elif isinstance(a, UnmarkBookies):
                self.unmark_bookies(a.ledger_id, a.bookies)
        deadline = self.core.next_deadline_ms()
        if deadline is not None and (self._tick_at is None or deadline < self._tick_at):
            self._tick_at = deadline
            sim.at(deadline - sim.now_ms + 1, self.tick)

    def mark(self, lid: int, missing: tuple[str, ...], lost: tuple[str, ...] = ()) -> None:
        sim = self.sim

        def op() -> UnderReplicatedMark:
            path = mark_path(lid)
            node = sim.store.get(path)
            data = merge_mark(node.value if node else None, lid, missing, sim.now_ms, lost)
            if node is None:
                sim.store.create(path, data)
            else:
                sim.store.set(path, data, node.version)
            return UnderReplicatedMark.from_json(data)

        def reply(mark: UnderReplicatedMark) -> None:
            self.core.on_marked(lid, mark.missing_bookies)
            sim.count("marks")
            sim.log(f"auditor: marked ledger={lid} missing={list(mark.missing_bookies)}")
        sim.metadata_op(self.alive, op, reply)

    def unmark_bookies(self, lid: int, bookies: tuple[str, ...]) -> None:
        """``UrManager.remove_from_mark``: CAS the mark without ``bookies`` (deleted if empty)."""
        sim = self.sim

        for b in bookies:
            if sim.bookies[b].lost:
                sim.violation(f"auditor: takes {b}, lost for good, out of ledger {lid}'s mark")

        def op() -> bool:
            node = sim.store.get(mark_path(lid))
            if node is None:
                return True
            mark = UnderReplicatedMark.from_json(node.value)
            left = set(mark.missing_bookies) - set(bookies)
            if len(left) == len(mark.missing_bookies):
                return True
            if left:
                kept = UnderReplicatedMark.of(lid, left, mark.ctime_ms, set(mark.lost_bookies) - set(bookies))
                return sim.store.set(mark_path(lid), kept.to_json(), node.version)
            return sim.store.delete(mark_path(lid), node.version) != "conflict"

        def reply(done: bool) -> None:
            self.core.on_unmarked_bookies(lid, bookies, done)
            if done:
                sim.count("returned_unmarked")
                sim.log(f"auditor: ledger={lid} mark without returned {list(bookies)}")
        sim.metadata_op(self.alive, op, reply)

    def replica_check(self) -> None:
        sim = self.sim
        c = sim.config
        probes = plan_replica_check(self.core.ledgers(), c.fragment_entries[1] + 2, 100_000, sim.core_rng)
        for p in probes:
            def read(b: SimBookie, p=p) -> StoredEntry | None:
                return b.entries.get((p.ledger_id, p.entry_id))

            def reply(entry: StoredEntry | None, answered: bool, p=p) -> None:
                if not answered:
                    return          # not judged: the lost-bookie delay decides
                if entry is None or not entry.verified():
                    sim.count("replica_check_found")
                    sim.log(f"auditor: replica check ledger={p.ledger_id} entry={p.entry_id} bookie={p.bookie} "
                            f"{'missing' if entry is None else 'checksum mismatch'}")
                    self.mark(p.ledger_id, (p.bookie,))
            sim.bookie_rpc(self.alive, p.bookie, read, reply)
        sim.at(c.replica_check_interval_ms, self.replica_check)


# -- a replication worker (shell over LedgerRepair and FragmentCopy) ---------------------------

class SimWorker:
    def __init__(self, sim: Simulation, name: str) -> None:
        self.sim = sim
        self.name = name
        self.session = sim.new_session()
        self.generation = 0
        self.alive = True
        self.busy: dict[int, LedgerRepair] = {}
        self.retry_at: dict[int, tuple[int, int]] = {}
        self.paused_until = 0

    def guard(self) -> "Guard":
        return Guard(self)

    def pause(self, pause_ms: int) -> None:
        """Stall for ``pause_ms``: replies wait; past the session timeout the session expires
        (its locks go) and, on waking, the worker learns it (kazoo's LOST)."""
        sim = self.sim
        self.paused_until = sim.now_ms + pause_ms
        session, gen = self.session, self.generation
        sim.count("worker_pauses")
        sim.log(f"worker {self.name} paused for {pause_ms} ms")
        if pause_ms <= sim.config.session_timeout_ms:
            return

        def expire() -> None:
            if self.session != session:
                return
            gone = sim.store.end_session(session)
            self._stop_copying()                # it holds no lock any more
            sim.count("sessions_expired_in_pause")
            sim.log(f"session {session} of paused {self.name} expired: removed {gone}")

        def wake() -> None:
            if self.generation != gen or not self.alive:
                return
            self.session_lost()
        sim.at(sim.config.session_timeout_ms, expire)
        sim.at(pause_ms, wake)

    def session_lost(self) -> None:
        """The shell's reaction to LOST (bookie/autorecovery/worker.py): every repair is
        abandoned (its lock is gone; another worker may have the ledger now); a new session."""
        sim = self.sim
        sim.log(f"worker {self.name} learns its session expired; abandons={sim.config.abandon_on_session_loss}")
        if sim.config.abandon_on_session_loss:
            self._abandon()
        self.session = sim.new_session()
        if sim.config.abandon_on_session_loss:
            self.poll()

    def start(self) -> None:
        self.sim.at(self.sim.rng.randint(0, self.sim.config.poll_interval_ms), self.poll)

    def _stop_copying(self) -> None:
        for lid in sorted(self.busy):
            if self.sim.copying.get(lid) == self.name:
                del self.sim.copying[lid]

    def _abandon(self) -> None:
        """Drop every repair: replies to what was sent before are dropped (new generation)."""
        self.generation += 1
        self._stop_copying()
        self.busy.clear()
        self.retry_at.clear()

    def crash(self) -> None:
        sim = self.sim
        self.alive = False
        self._abandon()
        session = self.session
        sim.log(f"worker {self.name} crashed (session {session} ends in {sim.config.session_timeout_ms} ms)")
        sim.count("worker_crashes")

        def expire() -> None:
            gone = sim.store.end_session(session)
            sim.log(f"session {session} of {self.name} expired: removed {gone}")
        sim.at(sim.config.session_timeout_ms, expire)

        def restart() -> None:
            self.session = sim.new_session()
            self.alive = True
            sim.log(f"worker {self.name} restarted session={self.session}")
            self.poll()
        sim.at(sim.rng.randint(sim.config.session_timeout_ms // 2, 3 * sim.config.session_timeout_ms), restart)

    def poll(self) -> None:
        sim = self.sim
        if not self.alive:
            return
        if self.paused_until > sim.now_ms:
            gen = self.generation
            sim.at(self.paused_until - sim.now_ms, lambda: self.poll() if self.generation == gen else None)
            return
        alive = self.guard()
        gen = self.generation

        def op() -> list[int]:
            return sorted(UnderReplicatedMark.from_json(sim.store.get(p).value).ledger_id
                          for p in sim.store.under("/ledgers/underreplication/ledgers/"))

        def reply(marked: list[int]) -> None:
            for lid in list(self.retry_at):
                if lid not in marked:
                    del self.retry_at[lid]
            for lid in marked:
                if len(self.busy) >= sim.config.ledgers_concurrent_max:
                    break
                if lid in self.busy or self.retry_at.get(lid, (0, 0))[0] > sim.now_ms:
                    continue
                core = LedgerRepair(lid, sim.core_rng)
                self.busy[lid] = core
                self.execute(core, core.start())
            sim.at(sim.config.poll_interval_ms, lambda: self.poll() if self.generation == gen else None)
        sim.metadata_op(alive, op, reply)

    def execute(self, core: LedgerRepair, actions: list) -> None:
        sim = self.sim
        alive = self.guard()
        lid = core.ledger_id
        session = self.session          # requests carry the session they were sent on
        for a in actions:
            if isinstance(a, TakeLock):
                sim.metadata_op(alive, lambda: sim.store.create(lock_path(lid), self.name, session),
                                lambda ok: self.execute(core, core.on_lock(ok)))
            elif isinstance(a, ReadMark):
                def read_mark() -> tuple:
                    node = sim.store.get(mark_path(lid))
                    return (None, -1) if node is None else (UnderReplicatedMark.from_json(node.value), node.version)
                sim.metadata_op(alive, read_mark, lambda got: self.execute(core, core.on_mark(*got)))
            elif isinstance(a, ReadLedger):
                def read_ledger() -> tuple:
                    node = sim.store.get(ledger_node(lid))
                    return (None, -1) if node is None else (node.value, node.version)
                sim.metadata_op(alive, read_ledger, lambda got: self.execute(
                    core, core.on_ledger(got[0], got[1], sim.writable(), sim.racks(),
                                         sim.writable() + sim.readonly())))
            elif isinstance(a, CopyFragment):
                other = sim.copying.get(lid)
                if other is not None and other != self.name:
                    sim.violation(f"ledger {lid}: {self.name} starts a copy while {other} is copying it")
                sim.copying[lid] = self.name
                sim.count("copies")
                copy = FragmentCopy(a.repair, sim.config.entries_in_flight_max, sim.config.read_run_entries_max)
                self.copy_execute(core, copy, copy.start())
            elif isinstance(a, WriteLedger):
                def cas(a=a) -> bool:
                    node = sim.store.get(ledger_node(lid))
                    if node is None or node.version != a.version:
                        return False
                    sim.check_lock(lid, self, session, "writes ledger metadata")
                    sim.check_metadata_change(node.value, a.metadata, self.name)
                    sim.log(f"{self.name}: ledger {lid} metadata v{node.version + 1} "
                            f"{[(f, list(bs)) for f, bs in a.metadata.ensembles]} "
                            f"urb={list(a.metadata.under_replicated_bookies)}")
                    return sim.store.set(ledger_node(lid), a.metadata, a.version)
                sim.metadata_op(alive, cas, lambda ok: self.execute(core, core.on_written(ok)))
            elif isinstance(a, Unmark):
                def unmark(a=a) -> bool:
                    node = sim.store.get(mark_path(lid))
                    if node is not None and (a.version == -1 or node.version == a.version):
                        sim.check_lock(lid, self, session, "deletes the mark")
                        mark = UnderReplicatedMark.from_json(node.value)
                        md_node = sim.store.get(ledger_node(lid))
                        if md_node is not None:
                            left = still_missing(md_node.value, frozenset(mark.missing_bookies))
                            if left:
                                sim.violation(f"ledger {lid}: {self.name} deleted the mark "
                                              f"{list(mark.missing_bookies)} while the metadata still "
                                              f"needs {sorted(left)} repaired")
                    result = sim.store.delete(mark_path(lid), a.version)
                    if result == "conflict":
                        sim.count("unmark_refused")
                    return result != "conflict"
                sim.metadata_op(alive, unmark, lambda ok: self.execute(core, core.on_unmarked(ok)))
            elif isinstance(a, ReleaseLock):
                def release() -> None:
                    node = sim.store.get(lock_path(lid))
                    if node is not None and node.session == session:
                        sim.store.delete(lock_path(lid), -1)
                sim.metadata_op(alive, release, lambda _: None)
            elif isinstance(a, FragmentBlocked):
                sim.count("blocked")
                sim.log(f"{self.name}: blocked ledger={lid} fragment={a.blocked.fragment_first} "
                        f"bookie={a.blocked.lost_bookie}: {a.blocked.reason}")
            elif isinstance(a, FragmentRecorded):
                sim.count("fragments_repaired")
                sim.log(f"{self.name}: recorded {a.repair.describe()}")
            elif isinstance(a, RepairFinished):
                self.busy.pop(lid, None)
                sim.log(f"{self.name}: ledger {lid} pass finished done={a.done} {a.reason}")
                if a.repaired:
                    sim.count("ledgers_repaired")
                if a.done:
                    self.retry_at.pop(lid, None)
                else:
                    sim.count("passes_retried")
                    _, last = self.retry_at.get(lid, (0, 0))
                    delay = int(next_retry_delay_ms(last, sim.config.poll_interval_ms,
                                                    sim.config.retry_delay_ms_max))
                    self.retry_at[lid] = (sim.now_ms + delay, delay)
            else:
                raise TypeError(f"unknown action {a!r}")

    def copy_execute(self, core: LedgerRepair, copy: FragmentCopy, actions: list) -> None:
        sim = self.sim
        alive = self.guard()
        lid = core.ledger_id
        if actions and sim.copying.get(lid) != self.name:    # (late replies to an ended copy: [])
            sim.violation(f"ledger {lid}: {self.name} goes on copying without the ledger's lock "
                          f"(now {sim.copying.get(lid) or 'nobody'}'s)")
            sim.copying[lid] = self.name        # one report per takeover
        for a in actions:
            if isinstance(a, ReadEntry):
                sim.bookie_rpc(alive, a.bookie, lambda b, a=a: b.entries.get((lid, a.entry_id)),
                               lambda entry, answered, a=a: self.copy_execute(
                                   core, copy, copy.on_read(a.entry_id, a.bookie, entry,
                                                            "" if answered else "timeout")))
            elif isinstance(a, ReadRange):
                def read_range(b: SimBookie, a=a) -> list[StoredEntry] | None:
                    if not any(k[0] == lid for k in b.entries):
                        return None                 # no copy of the ledger at all
                    out = []
                    for e in range(a.first, a.last + 1):
                        got = b.entries.get((lid, e))
                        if got is None:
                            break
                        out.append(got)
                    if len(out) > 1 and sim.net_rng.random() < sim.config.short_answer_probability:
                        out = out[:sim.net_rng.randint(1, len(out) - 1)]
                        sim.count("short_answers")
                    return out
                sim.bookie_rpc(alive, a.bookie, read_range,
                               lambda entries, answered, a=a: self.copy_execute(
                                   core, copy, copy.on_read_range(a.first, a.last, a.bookie, entries,
                                                                  "" if answered else "timeout")))
            elif isinstance(a, WriteEntry):
                def write(b: SimBookie, a=a) -> bool:
                    # the first write of an entry wins (bookie/storage/store.py): a different
                    # copy stored already (a rotten one) refuses it (ENTRY_EXISTS)
                    got = b.entries.get((lid, a.entry.entry_id))
                    if got is not None and (got.payload, got.length) != (a.entry.payload, a.entry.length):
                        sim.count("entry_exists")
                        return False
                    b.entries[(lid, a.entry.entry_id)] = a.entry
                    return True
                sim.bookie_rpc(alive, a.bookie, write,
                               lambda ok, answered, a=a: self.copy_execute(
                                   core, copy, copy.on_written(a.entry, bool(answered and ok),
                                                               "" if answered else "timeout")))
            elif isinstance(a, ReplicaRejected):
                sim.count("replicas_rejected")
                sim.log(f"{self.name}: replica not used ledger={lid} entry={a.entry_id} bookie={a.bookie} {a.reason}")
            elif isinstance(a, (CopyDone, CopyFailed)):
                if sim.copying.get(lid) == self.name:
                    del sim.copying[lid]
                done = isinstance(a, CopyDone)
                sim.count("copies_done" if done else "copies_failed")
                sim.log(f"{self.name}: copy {'done' if done else 'failed: ' + a.reason} {a.repair.describe()}")
                self.execute(core, core.on_copied(done, a.bytes_copied if done else 0,
                                                  not done and a.replacement_failed))
            else:
                raise TypeError(f"unknown copy action {a!r}")


class Guard:
    """What a worker's reply handlers check: its process is the one that sent the request
    (dropped after a crash) and is running (held while it is paused)."""

    def __init__(self, worker: SimWorker) -> None:
        self.worker = worker
        self.generation = worker.generation

    def __call__(self) -> bool:
        return self.worker.alive and self.worker.generation == self.generation

    def hold_ms(self) -> int:
        return max(0, self.worker.paused_until - self.worker.sim.now_ms)


# -- entry points -------------------------------------------------------------------------------

def run_seed(seed: int, config: AutorecoveryConfig | str = "e3w2a2n7", **overrides: Any) -> SimResult:
    """Run one seed; deterministic. Violations are listed, not raised."""
    if isinstance(config, str):
        config = CONFIGS[config]
    if overrides:
        config = replace(config, **overrides)
    return Simulation(seed, config).run()


def replay_command(seed: int, config: AutorecoveryConfig) -> str:
    return f"python -m tests.sim.autorecovery_sim --seed {seed} --config {config.name} --trace"


def check_seed(seed: int, config: AutorecoveryConfig | str = "e3w2a2n7", **overrides: Any) -> SimResult:
    """run_seed, raising SimulationViolation (naming the seed and its replay command)."""
    result = run_seed(seed, config, **overrides)
    if result.violations:
        raise SimulationViolation(
            f"seed {seed} config {result.config.name}: {len(result.violations)} violation(s); replay with "
            f"`{replay_command(seed, result.config)}`:\n  " + "\n  ".join(result.violations[:10]))
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
    parser.add_argument("--config", default="e3w2a2n7", choices=sorted(CONFIGS))
    parser.add_argument("--trace", action="store_true", help="print the event trace")
    args = parser.parse_args(argv)
    failures = 0
    for seed in range(args.seed, args.seed + args.seeds):
        result = run_seed(seed, args.config)
        if args.trace:
            print("\n".join(result.trace))
        print(f"seed {seed} {result.config.name}: {'OK' if result.ok else 'VIOLATION'} "
              f"stats={result.stats} trace={result.trace_digest()[:12]}")
        for v in result.violations:
            print("  " + v)
        failures += not result.ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
